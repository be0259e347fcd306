//! Exit codes of the `ting-chaos` binary, in one place.

/// Every switched-on checker held with enough judged, every gate passed.
pub const OK: i32 = 0;
/// At least one invariant was violated (or a performance gate regressed).
pub const VIOLATION: i32 = 1;
/// Bad scenario or bad usage.
pub const USAGE: i32 = 2;
/// The infrastructure failed: database would not start, stack never became healthy, the report
/// could not be rendered.
pub const INFRA: i32 = 3;
/// Nothing was violated, but the harness could not look enough to call it a pass: a checker
/// judged fewer items than it needs, a gate had no data, or a chaos step did not take effect.
pub const INCONCLUSIVE: i32 = 4;

/// The code that says more of two runs' outcomes (a sweep's overall code): an infrastructure
/// failure, then a violation, then a bad scenario, then an inconclusive run, then a pass.
pub fn worst(a: i32, b: i32) -> i32 {
    let rank = |c: i32| match c {
        OK => 0,
        INCONCLUSIVE => 1,
        USAGE => 2,
        VIOLATION => 3,
        _ => 4,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}
