//! Properties of the parsers every input passes through, over generated inputs (proptest, with
//! shrinking to the smallest failing case): the duration and share parsers of scenario files,
//! fault profiles and `PUT /_mock/faults`, and the SMTP command parser. Each is total — any input
//! gives a value or an error, never a panic — and reads back what a well-formed input says.

use std::time::Duration;

use mock_providers::smtp::command::Command;
use mock_providers::units::{parse_duration, parse_ratio, MAX_DURATION};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// Any text: a duration within the bound, or an error.
    #[test]
    fn any_text_is_a_bounded_duration_or_an_error(s in "\\PC{0,40}") {
        if let Ok(d) = parse_duration(&s) {
            prop_assert!(d <= MAX_DURATION, "{s:?} gave {d:?}");
        }
    }

    /// Number-and-unit shaped text, where the overflows live (huge integers, long fractions).
    #[test]
    fn number_and_unit_never_panics(
        int in "[0-9]{1,30}",
        frac in proptest::option::of("[0-9]{1,30}"),
        unit in "(ns|us|ms|s|m|min|h|d|w|y|M|fortnight)",
    ) {
        let s = match frac {
            Some(f) => format!("{int}.{f}{unit}"),
            None => format!("{int}{unit}"),
        };
        if let Ok(d) = parse_duration(&s) {
            prop_assert!(d <= MAX_DURATION, "{s:?} gave {d:?}");
        }
    }

    /// Milliseconds read back exactly, up to the bound; past it, an error.
    #[test]
    fn milliseconds_read_back(ms in 0u64..=2 * MAX_DURATION.as_millis() as u64) {
        let got = parse_duration(&format!("{ms}ms"));
        if Duration::from_millis(ms) <= MAX_DURATION {
            prop_assert_eq!(got, Ok(Duration::from_millis(ms)));
        } else {
            prop_assert!(got.is_err());
        }
    }

    /// Any text: a share in 0..=1, or an error.
    #[test]
    fn any_text_is_a_share_in_range_or_an_error(s in "\\PC{0,20}") {
        if let Ok(r) = parse_ratio(&s) {
            prop_assert!((0.0..=1.0).contains(&r.get()), "{s:?} gave {}", r.get());
        }
    }

    /// Whole percentages read back; above 100% is refused.
    #[test]
    fn percentages_read_back(p in 0u32..=1_000) {
        let got = parse_ratio(&format!("{p}%")).map(|r| (r.get() * 1e6).round() / 1e6);
        if p <= 100 {
            prop_assert_eq!(got, Ok(f64::from(p) / 100.0));
        } else {
            prop_assert!(got.is_err());
        }
    }

    /// The SMTP command parser is total over arbitrary bytes.
    #[test]
    fn any_bytes_are_a_command_or_a_reply(line in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = Command::parse(&line);
    }

    /// Well-formed MAIL and RCPT read back the address and SIZE they carry.
    #[test]
    fn mail_and_rcpt_read_back(
        local in "[a-z0-9][a-z0-9.+_-]{0,30}",
        domain in "[a-z][a-z0-9-]{0,20}\\.[a-z]{2,6}",
        size in proptest::option::of(any::<u64>()),
    ) {
        let addr = format!("{local}@{domain}");
        let mail = match size {
            Some(n) => format!("MAIL FROM:<{addr}> SIZE={n}\r\n"),
            None => format!("MAIL FROM:<{addr}>\r\n"),
        };
        prop_assert_eq!(
            Command::parse(mail.as_bytes()),
            Ok(Command::Mail { from: addr.clone(), size })
        );
        prop_assert_eq!(
            Command::parse(format!("RCPT TO:<{addr}>\r\n").as_bytes()),
            Ok(Command::Rcpt { to: addr })
        );
    }
}
