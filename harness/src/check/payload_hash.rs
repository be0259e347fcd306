//! A send's payload hash as the checkers keep it: 64 bits in the entry, not a 64-character
//! string.
//!
//! The fakes record each send's payload hash as SHA-256 hex (`ledger.jsonl` keeps it whole), and
//! the one rule that reads it (`immutable_payload`) only asks whether the attempts of one delivery
//! carry the same one. Every send has a different hash, so as interned text a campaign of
//! 100,000 recipients held 300,000 unique 64-character strings (~30 MB with their table slots).
//! Its first 64 bits answer the same question: two different payloads among one delivery's few
//! attempts share them with a chance of about one in 10^18. Counterexamples show those 16 hex
//! digits, a prefix of the `payload_hash` the same `seq` has in `ledger.jsonl`.

use std::fmt;
use std::num::NonZeroU64;

use sha2::{Digest as _, Sha256};

/// The first 64 bits of a payload hash (see the module doc); `Option<PayloadHash>` is one word.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PayloadHash(NonZeroU64);

impl PayloadHash {
    /// Of the hash text a provider recorded: SHA-256 hex (any case) gives its first 16 digits;
    /// any other text (a fake of someone else's, a test's "h1") the first 64 bits of the text's
    /// own SHA-256, so that equal texts stay equal and different ones stay apart.
    pub fn of(text: &str) -> PayloadHash {
        let bits = match hex_sha256_prefix(text) {
            Some(bits) => bits,
            None => {
                let sum = Sha256::digest(text.as_bytes());
                let mut first = [0u8; 8];
                first.copy_from_slice(&sum[..8]);
                u64::from_be_bytes(first)
            }
        };
        // Zero stands for "none" in the one-word option: a hash starting with 16 zero digits is
        // kept one unit off, like `Packed` keeps its sentinel.
        PayloadHash(NonZeroU64::new(bits).unwrap_or(NonZeroU64::MIN))
    }

    pub fn bits(self) -> u64 {
        self.0.get()
    }

    /// The hash whose [`PayloadHash::bits`] are `bits`; none for 0.
    pub fn from_bits(bits: u64) -> Option<PayloadHash> {
        NonZeroU64::new(bits).map(PayloadHash)
    }
}

/// The first 16 digits of `text` as a number when it is 64 hex digits.
fn hex_sha256_prefix(text: &str) -> Option<u64> {
    let hex = text.len() == 64 && text.bytes().all(|c| c.is_ascii_hexdigit());
    hex.then(|| u64::from_str_radix(&text[..16], 16).ok())
        .flatten()
}

impl fmt::Display for PayloadHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for PayloadHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl serde::Serialize for PayloadHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sha256_hex_keeps_its_first_sixteen_digits() {
        let text = "1a97d54509540388fc98bd99c67c82bb92b128f4448e446d0e39e35f321c5bcf";
        let h = PayloadHash::of(text);
        assert_eq!(h.to_string(), "1a97d54509540388");
        assert_eq!(h, PayloadHash::of(&text.to_uppercase()), "hex of any case");
        assert_eq!(
            serde_json::to_value(h).unwrap(),
            serde_json::json!("1a97d54509540388")
        );
    }

    #[test]
    fn hashes_that_differ_in_the_first_64_bits_stay_apart() {
        let a = PayloadHash::of(&format!("{}{}", "0123456789abcdef", "0".repeat(48)));
        let b = PayloadHash::of(&format!("{}{}", "0123456789abcdee", "0".repeat(48)));
        assert_ne!(a, b);
    }

    #[test]
    fn other_texts_are_hashed_equal_to_equal_and_apart_from_different() {
        assert_eq!(PayloadHash::of("h1"), PayloadHash::of("h1"));
        assert_ne!(PayloadHash::of("h1"), PayloadHash::of("h2"));
        assert_ne!(PayloadHash::of(""), PayloadHash::of(" "));
        // Not 64 digits, or not all hex: hashed as text, never parsed.
        assert_eq!(
            PayloadHash::of("1a97d545").bits(),
            u64::from_be_bytes(Sha256::digest(b"1a97d545")[..8].try_into().unwrap())
        );
        assert_ne!(
            PayloadHash::of(&"g".repeat(64)),
            PayloadHash::of(&"0".repeat(64))
        );
    }

    #[test]
    fn sixteen_zero_digits_are_kept_one_unit_off_and_the_option_is_one_word() {
        assert_eq!(PayloadHash::of(&"0".repeat(64)).bits(), 1);
        assert_eq!(std::mem::size_of::<Option<PayloadHash>>(), 8);
    }
}
