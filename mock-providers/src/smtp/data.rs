//! Assembling the DATA section: end-of-data detection, dot-unstuffing, size and line limits.
//!
//! Pure: it is fed one line at a time by the connection driver. Bare LF line endings are accepted
//! leniently and stored as CRLF, so a sloppy sender is still answered. It must never stop reading
//! at a limit: an oversized message or an over-long line is read to its terminating dot and then
//! rejected, otherwise the rest of the message would be parsed as commands.

/// Longest text line RFC 5321 §4.5.3.1.6 allows, CRLF included.
pub const MAX_LINE: usize = 1000;

/// The message being received after a 354.
#[derive(Debug, Default)]
pub struct DataAssembler {
    message: Vec<u8>,
    max_size: usize,
    /// Bytes of the message, counted even past `max_size`.
    size: usize,
    long_line: bool,
    done: bool,
}

/// Why a fully received message must be rejected instead of processed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataProblem {
    /// Bigger than the advertised SIZE: 552 5.3.4.
    TooBig,
    /// A line over [`MAX_LINE`] octets: 500 5.5.2.
    LineTooLong,
}

impl DataAssembler {
    pub fn new(max_size: usize) -> DataAssembler {
        DataAssembler {
            max_size,
            ..DataAssembler::default()
        }
    }

    /// Takes one line including its LF (or CRLF). Returns `true` when it was the lone `.` that
    /// ends the data; lines after that are not expected.
    pub fn push_line(&mut self, line: &[u8]) -> bool {
        debug_assert!(!self.done, "line after end of data");
        let content = line.strip_suffix(b"\n").unwrap_or(line);
        let content = content.strip_suffix(b"\r").unwrap_or(content);
        if content == b"." {
            self.done = true;
            return true;
        }
        // Dot-unstuffing (RFC 5321 §4.5.2): a leading dot was doubled by the sender.
        let content = content.strip_prefix(b".").unwrap_or(content);
        if content.len() + 2 > MAX_LINE {
            self.long_line = true;
        }
        self.size += content.len() + 2;
        if self.size <= self.max_size {
            self.message.extend_from_slice(content);
            self.message.extend_from_slice(b"\r\n");
        }
        false
    }

    /// Notes a line the reader had to discard because it was longer than [`MAX_LINE`].
    pub fn push_discarded_long_line(&mut self) {
        self.long_line = true;
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Message bytes so far (CRLF line endings, unstuffed).
    pub fn size(&self) -> usize {
        self.size
    }

    /// The complete message, or the reason it must be rejected.
    pub fn finish(self) -> Result<Vec<u8>, DataProblem> {
        if self.size > self.max_size {
            Err(DataProblem::TooBig)
        } else if self.long_line {
            Err(DataProblem::LineTooLong)
        } else {
            Ok(self.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(max: usize, input: &[u8]) -> (bool, Result<Vec<u8>, DataProblem>) {
        let mut a = DataAssembler::new(max);
        let mut ended = false;
        for line in input.split_inclusive(|b| *b == b'\n') {
            if a.push_line(line) {
                ended = true;
                break;
            }
        }
        (ended, a.finish())
    }

    #[test]
    fn table() {
        let long = format!("{}\r\n.\r\n", "x".repeat(999));
        let ok_long = format!("{}\r\n.\r\n", "x".repeat(998));
        type Want = (bool, Result<&'static [u8], DataProblem>);
        let cases: Vec<(&[u8], usize, Want)> = vec![
            (b"a\r\nb\r\n.\r\n", 100, (true, Ok(b"a\r\nb\r\n"))),
            (b".\r\n", 100, (true, Ok(b""))),
            // Dot-unstuffing: "..x" was "x" with a leading dot; "..." was "..".
            (b"..x\r\n...\r\n.\r\n", 100, (true, Ok(b".x\r\n..\r\n"))),
            // A dot inside or at the end of a line is data.
            (
                b"a.\r\n.a\r\n .\r\n.\r\n",
                100,
                (true, Ok(b"a.\r\na\r\n .\r\n")),
            ),
            // Bare LF accepted and normalised to CRLF, also for the terminator.
            (b"a\nb\n.\n", 100, (true, Ok(b"a\r\nb\r\n"))),
            (b"a\r\n", 100, (false, Ok(b"a\r\n"))),
            (b"0123456789\r\n.\r\n", 11, (true, Err(DataProblem::TooBig))),
            (b"0123456789\r\n.\r\n", 12, (true, Ok(b"0123456789\r\n"))),
            (
                long.as_bytes(),
                10_000,
                (true, Err(DataProblem::LineTooLong)),
            ),
        ];
        for (input, max, (ended, want)) in cases {
            let got = feed(max, input);
            assert_eq!(
                got.0,
                ended,
                "ended for {:?}",
                String::from_utf8_lossy(input)
            );
            assert_eq!(
                got.1,
                want.map(<[u8]>::to_vec),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        let (ended, got) = feed(10_000, ok_long.as_bytes());
        assert!(ended && got.is_ok());
    }

    #[test]
    fn size_keeps_counting_past_the_limit() {
        let mut a = DataAssembler::new(4);
        assert!(!a.push_line(b"abcdef\r\n"));
        assert!(!a.push_line(b"gh\r\n"));
        assert_eq!(a.size(), 12);
        assert!(a.push_line(b".\r\n"));
        assert_eq!(a.finish(), Err(DataProblem::TooBig));
    }
}
