//! A first-in-first-out line kept in chunks of a fixed number of items: the queue's line of
//! reports due and waiting for a slot, which a flood fills with a hundred thousand or more.
//!
//! One [`VecDeque`] that long doubles its buffer as it grows (copying every item each time),
//! touches the whole buffer as its head goes round, and keeps it at its largest until shrunk
//! (another copy). In chunks, pushes go to the back chunk and pops come from the front one; a
//! full back chunk is followed by a new one and a drained front chunk is freed at once. All
//! chunks but those two are full, so the line holds its live items and at most two chunks'
//! room besides, never copies an item, and gives its memory back as it drains. A line drained
//! empty keeps its last chunk (one, not the flood's), so a trickle does not allocate a chunk
//! per item.

use std::collections::VecDeque;

/// Items in a chunk unless told otherwise: 40 KiB of the queue's 80-byte jobs.
pub(super) const CHUNK: usize = 512;

/// A FIFO line in chunks of `chunk` items.
pub(super) struct Fifo<T> {
    /// Front to back, none empty but a last one left when the line drained; each holds at most
    /// `chunk` items, its capacity, and all but the front and the back exactly that.
    chunks: VecDeque<VecDeque<T>>,
    chunk: usize,
}

impl<T> Default for Fifo<T> {
    fn default() -> Self {
        Fifo::with_chunk(CHUNK)
    }
}

impl<T> Fifo<T> {
    /// An empty line of chunks of `chunk` items (at least one).
    pub fn with_chunk(chunk: usize) -> Fifo<T> {
        Fifo {
            chunks: VecDeque::new(),
            chunk: chunk.max(1),
        }
    }

    /// Adds `item` at the back, in a new chunk when the back one is full.
    pub fn push_back(&mut self, item: T) {
        match self.chunks.back_mut() {
            Some(back) if back.len() < self.chunk => back.push_back(item),
            _ => {
                let mut back = VecDeque::with_capacity(self.chunk);
                back.push_back(item);
                self.chunks.push_back(back);
            }
        }
    }

    /// Takes the item at the front, freeing the front chunk when that drains it (unless it is
    /// the only one).
    pub fn pop_front(&mut self) -> Option<T> {
        let front = self.chunks.front_mut()?;
        let item = front.pop_front();
        if front.is_empty() && self.chunks.len() > 1 {
            self.chunks.pop_front();
        }
        item
    }

    /// Items in the line.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.chunks.iter().map(VecDeque::len).sum()
    }

    /// Chunks held.
    #[cfg(test)]
    pub fn chunks(&self) -> usize {
        self.chunks.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::queue::{Pending, Ticket};
    use super::*;

    /// The chunks held are the live items' and at most two more.
    fn assert_bounded<T>(line: &Fifo<T>) {
        let (len, chunks) = (line.len(), line.chunks());
        assert!(
            chunks <= len / line.chunk + 2,
            "{chunks} chunks of {} for {len} items",
            line.chunk
        );
    }

    /// Bursts of pushes and pops of uneven sizes, across many chunk boundaries: every item
    /// leaves in the order it came, and the chunks held follow the live items up and down.
    #[test]
    fn items_leave_in_order_across_chunks_pushed_and_popped_in_turn() {
        let mut line = Fifo::with_chunk(7);
        let (mut pushed, mut popped) = (0u32, 0u32);
        for round in 0..400u32 {
            // Growing for the first half of the rounds, shrinking for the second.
            let (push, pop) = if round < 200 {
                (round % 23, round % 13)
            } else {
                (round % 11, round % 29)
            };
            for _ in 0..push {
                line.push_back(pushed);
                pushed += 1;
            }
            for _ in 0..pop {
                match line.pop_front() {
                    Some(item) => {
                        assert_eq!(item, popped, "first in, first out");
                        popped += 1;
                    }
                    None => assert_eq!(popped, pushed, "empty only when all are out"),
                }
            }
            assert_eq!(line.len() as u32, pushed - popped);
            assert_bounded(&line);
        }
        while let Some(item) = line.pop_front() {
            assert_eq!(item, popped);
            popped += 1;
        }
        assert_eq!((popped, line.chunks()), (pushed, 1));
        assert!(
            pushed > 20 * 7,
            "many chunk boundaries crossed: {pushed} items"
        );
    }

    /// A flood drained gives its chunks back as it goes; dropping a line (as the queue's clear
    /// does) drops every item in it, so none is pending any more.
    #[test]
    fn a_drained_or_dropped_line_holds_nothing() {
        let pending = Arc::new(Pending::default());
        let mut line: Fifo<Ticket> = Fifo::default();
        for _ in 0..10 * CHUNK + 3 {
            line.push_back(pending.ticket());
        }
        assert_eq!((pending.get(), line.chunks()), (10 * CHUNK + 3, 11));
        for _ in 0..9 * CHUNK {
            drop(line.pop_front());
            assert_bounded(&line);
        }
        assert_eq!((pending.get(), line.chunks()), (CHUNK + 3, 2));
        line.push_back(pending.ticket());
        drop(std::mem::take(&mut line));
        assert_eq!(pending.get(), 0, "every item dropped with the line");
        assert_eq!(line.chunks(), 0);
    }
}
