//! The ting-chaos harness: scenarios, the stack supervisor, load, chaos, checkers and reports.
//!
//! Invariant: this library never depends on the `stack` crate, and its Cargo.toml does not name
//! it, so the compiler keeps the promise. The harness knows a stack only through the
//! process/env/HTTP contract of `docs/stack-contract.md`, the same one a user's own stack
//! implements; only the thin binary package (`src/main.rs`) links the reference stack, to serve
//! `ting-chaos stack …`.

pub mod attribution;
pub mod bench;
pub mod check;
pub mod cli;
pub mod cpu;
pub mod exit;
pub mod files;
pub mod jumps;
pub mod load;
pub mod malloc;
pub mod netchaos;
pub mod others;
pub mod report;
pub mod run;
pub mod scenario;
pub mod stalls;
pub mod supervise;
pub mod verdict;
