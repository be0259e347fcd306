//! A configuration cell that request handlers read once per request and the control API
//! replaces mid-run (`PUT /_mock/faults`).
//!
//! Readers get an `Arc` snapshot, so a request sees one consistent profile from start to end even
//! if the profile is replaced while it sleeps. It must never hand out a lock guard across an await.

use std::sync::{Arc, RwLock};

/// A replaceable, shared `T`. Cheap to clone.
pub struct Live<T>(Arc<RwLock<Arc<T>>>);

impl<T> Clone for Live<T> {
    fn clone(&self) -> Self {
        Live(self.0.clone())
    }
}

impl<T> Live<T> {
    pub fn new(value: T) -> Live<T> {
        Live(Arc::new(RwLock::new(Arc::new(value))))
    }

    /// The current value.
    pub fn get(&self) -> Arc<T> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the value for every later reader.
    pub fn set(&self, value: T) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(value);
    }
}
