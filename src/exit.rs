//! Exit codes of the `ting-chaos` binary, in one place.

/// Every checked invariant held.
pub const OK: i32 = 0;
/// At least one invariant was violated (or a performance gate regressed).
pub const VIOLATION: i32 = 1;
/// Bad scenario or bad usage.
pub const USAGE: i32 = 2;
/// The infrastructure failed: database would not start, stack never became healthy, the report
/// could not be rendered.
pub const INFRA: i32 = 3;
