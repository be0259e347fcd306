//! Fixed-shape texts the fakes keep by the hundred thousand, packed into a few bytes: E.164
//! numbers, LINE user ids and Twilio message SIDs.
//!
//! Each packing is exact: `parse` accepts only the one spelling its `Display` writes back, so two
//! texts pack alike only when they are the same text, and a map keyed by the packed form is keyed
//! by the text itself.

use std::fmt;

/// An E.164 number (`+`, then 2 to 15 digits, the first not 0) as the value of its digits: with
/// no leading zero and at most 15 digits, the value gives the digits back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Phone(u64);

impl Phone {
    /// `to` packed, when it is an E.164 number ([`crate::sms::is_e164`]).
    pub fn parse(to: &str) -> Option<Phone> {
        let d = to.strip_prefix('+')?;
        let shaped = (2..=15).contains(&d.len())
            && d.bytes().all(|b| b.is_ascii_digit())
            && !d.starts_with('0');
        // At most 15 digits: far below `u64::MAX`.
        shaped.then(|| Phone(d.bytes().fold(0, |n, b| n * 10 + u64::from(b - b'0'))))
    }

    /// The value of the digits.
    pub fn value(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Phone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "+{}", self.0)
    }
}

/// `prefix` and 32 lowercase hex digits, as the 16 bytes the digits spell.
fn parse_hex128(text: &str, prefix: &str) -> Option<[u8; 16]> {
    let digits = text.strip_prefix(prefix)?.as_bytes();
    let lower_hex = |c: &u8| matches!(c, b'0'..=b'9' | b'a'..=b'f');
    if digits.len() != 32 || !digits.iter().all(lower_hex) {
        return None;
    }
    let mut bytes = [0u8; 16];
    hex::decode_to_slice(digits, &mut bytes).ok()?;
    Some(bytes)
}

fn write_hex128(f: &mut fmt::Formatter<'_>, prefix: &str, bytes: &[u8; 16]) -> fmt::Result {
    f.write_str(prefix)?;
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
}

/// A LINE user id: `U` and 32 lowercase hex digits ([`crate::line::is_user_id`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LineUserId(pub [u8; 16]);

impl LineUserId {
    pub fn parse(to: &str) -> Option<LineUserId> {
        parse_hex128(to, "U").map(LineUserId)
    }
}

/// A Twilio message SID as this fake issues them: `SM` and 32 lowercase hex digits. Ordered as
/// the texts are (fixed width, and `0-9` sorts before `a-f`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sid([u8; 16]);

impl Sid {
    /// A new random SID.
    pub fn random() -> Sid {
        Sid(rand::random())
    }

    pub fn parse(sid: &str) -> Option<Sid> {
        parse_hex128(sid, "SM").map(Sid)
    }
}

impl fmt::Display for Sid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex128(f, "SM", &self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn phones_pack_exactly_the_e164_numbers() {
        for n in [
            "+15550000001",
            "+819012345678",
            "+10",
            "+999999999999999",
            "+100000000000000",
        ] {
            assert!(crate::sms::is_e164(n));
            assert_eq!(Phone::parse(n).unwrap().to_string(), n);
        }
        for n in [
            "15550000001",
            "+0555",
            "+1",
            "+1555000000000000",
            "+1555-000",
            "",
            "+",
            "++15550000001",
            "+١٢٣",
        ] {
            assert!(!crate::sms::is_e164(n));
            assert_eq!(Phone::parse(n), None, "{n:?}");
        }
    }

    #[test]
    fn sids_pack_only_the_spelling_they_write() {
        let sid = "SM0123456789abcdef0123456789abcdef";
        assert_eq!(Sid::parse(sid).unwrap().to_string(), sid);
        for other in [
            "SM0123456789ABCDEF0123456789abcdef",
            "sm0123456789abcdef0123456789abcdef",
            "SM0123456789abcdef0123456789abcde",
            "SM0123456789abcdef0123456789abcdef0",
            "SM0123456789abcdef0123456789abcdeg",
            "MM0123456789abcdef0123456789abcdef",
            "SM",
            "",
        ] {
            assert_eq!(Sid::parse(other), None, "{other:?}");
        }
        let r = Sid::random();
        assert_eq!(Sid::parse(&r.to_string()), Some(r));
    }

    #[test]
    fn line_user_ids_pack_exactly_the_user_ids() {
        let id = "U0123456789abcdef0123456789abcdef";
        assert!(crate::line::is_user_id(id));
        assert_eq!(LineUserId::parse(id).unwrap().0[..2], [0x01, 0x23]);
        for other in [
            "U0123456789ABCDEF0123456789abcdef",
            "u0123456789abcdef0123456789abcdef",
            "U0123456789abcdef0123456789abcde",
            "",
        ] {
            assert!(!crate::line::is_user_id(other));
            assert_eq!(LineUserId::parse(other), None, "{other:?}");
        }
    }

    proptest! {
        #[test]
        fn a_packed_text_is_the_text(s in "\\+?[0-9a-fA-FSMU]{0,36}") {
            // Packs iff it has the shape, and what packs writes the same text back.
            prop_assert_eq!(Phone::parse(&s).is_some(), crate::sms::is_e164(&s));
            if let Some(p) = Phone::parse(&s) {
                prop_assert_eq!(p.to_string(), s.clone());
            }
            prop_assert_eq!(LineUserId::parse(&s).is_some(), crate::line::is_user_id(&s));
            if let Some(sid) = Sid::parse(&s) {
                prop_assert_eq!(sid.to_string(), s);
            }
        }

        #[test]
        fn sids_sort_as_their_texts(a in any::<[u8; 16]>(), b in any::<[u8; 16]>()) {
            let (a, b) = (Sid(a), Sid(b));
            prop_assert_eq!(a.cmp(&b), a.to_string().cmp(&b.to_string()));
        }

        #[test]
        fn every_e164_number_round_trips(d in "[1-9][0-9]{1,14}") {
            let n = format!("+{d}");
            prop_assert_eq!(Phone::parse(&n).map(|p| p.to_string()), Some(n));
        }
    }
}
