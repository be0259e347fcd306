//! The ting-chaos harness: scenarios, the stack supervisor, load, chaos, checkers and reports.
//!
//! Invariant: nothing in this library imports the `stack` crate. The harness knows a stack only
//! through the process/env/HTTP contract of `docs/stack-contract.md`, the same one a user's own
//! stack implements; only `src/main.rs` links the reference stack, to serve `ting-chaos stack …`.

pub mod attribution;
pub mod bench;
pub mod check;
pub mod cli;
pub mod exit;
pub mod load;
pub mod report;
pub mod run;
pub mod scenario;
pub mod stalls;
pub mod supervise;
pub mod verdict;
