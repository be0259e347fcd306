//! One copy of each value that many records repeat (an account id, a sender, a callback URL, a
//! signing key), shared as an `Arc` instead of copied into each: the SMS store keeps a hundred
//! thousand messages, the callback dispatcher a report for each. Bounded, so that a value that
//! differs per record (a callback URL with the delivery in its query) never grows a set as big
//! as the records.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

/// Up to [`Shared::MAX`] distinct values; past that, a new value gets an `Arc` of its own.
pub struct Shared<T: ?Sized>(HashSet<Arc<T>>);

impl<T: ?Sized> Default for Shared<T> {
    fn default() -> Self {
        Shared(HashSet::new())
    }
}

impl<T: ?Sized> Shared<T> {
    /// Distinct values kept at most: a run repeats a handful.
    pub const MAX: usize = 256;
}

impl<T: ?Sized + Eq + Hash> Shared<T> {
    /// The kept copy equal to `value`.
    fn find<Q>(&self, value: &Q) -> Option<Arc<T>>
    where
        Arc<T>: std::borrow::Borrow<Q>,
        Q: ?Sized + Eq + Hash,
    {
        self.0.get(value).cloned()
    }

    /// `t`, kept for the records after it while there is room.
    fn keep(&mut self, t: Arc<T>) -> Arc<T> {
        if self.0.len() < Self::MAX {
            self.0.insert(t.clone());
        }
        t
    }
}

impl<T: Eq + Hash> Shared<T> {
    /// The kept copy equal to `value`, or `value` itself (kept while there is room).
    pub fn value(&mut self, value: T) -> Arc<T> {
        match self.find(&value) {
            Some(t) => t,
            None => self.keep(Arc::new(value)),
        }
    }
}

impl Shared<str> {
    /// The kept copy of `text`, or a new one (kept while there is room).
    pub fn text(&mut self, text: &str) -> Arc<str> {
        match self.find(text) {
            Some(t) => t,
            None => self.keep(Arc::from(text)),
        }
    }
}
