//! Free loopback ports for servers that another process binds a moment later (the postmaster,
//! a stack's API process).
//!
//! Binding port 0 and handing the number on leaves a window in which the kernel may give the
//! same number to any *outgoing* connection as its local port — on a busy host with thousands of
//! short connections that happens (CI saw "Address already in use" for a stack's API). Ports
//! outside the kernel's ephemeral range are never handed out that way, so the only possible
//! thief is another process picking a listening port at random at the same moment.

use std::net::{Ipv4Addr, TcpListener};

/// The kernel's default when `/proc/sys/net/ipv4/ip_local_port_range` cannot be read.
const DEFAULT_EPHEMERAL: (u16, u16) = (32_768, 60_999);
/// Random candidates tried before falling back to a kernel-chosen (ephemeral) port.
const TRIES: usize = 64;

/// A loopback TCP port that is free now and lies outside the ephemeral range.
pub fn free_port() -> std::io::Result<u16> {
    let window = window(ephemeral_range());
    for _ in 0..TRIES {
        let Some((lo, hi)) = window else { break };
        let span = u32::from(hi - lo) + 1;
        let port = lo + (uuid::Uuid::new_v4().as_u128() % u128::from(span)) as u16;
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| parse_range(&s))
        .unwrap_or(DEFAULT_EPHEMERAL)
}

fn parse_range(s: &str) -> Option<(u16, u16)> {
    let mut it = s.split_whitespace().map(|v| v.parse::<u16>().ok());
    let (lo, hi) = (it.next()??, it.next()??);
    (lo <= hi).then_some((lo, hi))
}

/// The widest stretch of unprivileged ports (from 10 000 up, clear of well-known services)
/// outside `ephemeral`, if one of at least 1 000 ports exists.
fn window((lo, hi): (u16, u16)) -> Option<(u16, u16)> {
    const FLOOR: u16 = 10_000;
    let below = (lo > FLOOR).then(|| (FLOOR, lo - 1));
    let above = (hi < u16::MAX).then(|| (hi.max(FLOOR - 1) + 1, u16::MAX));
    [below, above]
        .into_iter()
        .flatten()
        .filter(|(a, b)| b - a >= 1_000)
        .max_by_key(|(a, b)| b - a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_avoid_the_ephemeral_range() {
        assert_eq!(window((32_768, 60_999)), Some((10_000, 32_767)));
        assert_eq!(window((10_000, 60_000)), Some((60_001, 65_535)));
        assert_eq!(window((1_024, 65_000)), None, "only 535 ports above");
        assert_eq!(parse_range("32768\t60999\n"), Some((32_768, 60_999)));
        assert_eq!(parse_range("9 3"), None);
        assert_eq!(parse_range(""), None);
    }

    #[test]
    fn free_port_is_bindable_and_not_ephemeral() {
        let (lo, hi) = ephemeral_range();
        for _ in 0..20 {
            let p = free_port().unwrap();
            if window((lo, hi)).is_some() {
                assert!(!(lo..=hi).contains(&p), "{p} in {lo}-{hi}");
            }
            TcpListener::bind((Ipv4Addr::LOCALHOST, p)).unwrap();
        }
    }
}
