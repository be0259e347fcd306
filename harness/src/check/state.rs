//! The delivery states and transition sources a stack reports through its status API
//! (docs/stack-contract.md), parsed once where the answer is read so that every checker matches
//! on variants the compiler knows: a misspelt state is a compile error, not a rule that silently
//! never fires. A name outside the contract is kept as written (`Other`), never guessed: it is
//! no known state, so nothing treats it as settled, terminal or a source it is not. A
//! transition's time ([`At`]) is kept as a number when its text reads back from it byte for
//! byte, as written otherwise: the status view of a big run holds millions of them.

use std::borrow::Cow;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A delivery's state in the stack's own view.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum State {
    Pending,
    Sending,
    Retryable,
    Submitted,
    Delivered,
    PermanentFailure,
    /// Attempts exhausted.
    Failed,
    /// The outcome could not be known; held for reconciliation or a human.
    Unknown,
    /// A state the contract does not name, as the stack wrote it (behind a thin pointer: a
    /// state is two words, and a transition holds two).
    Other(Box<String>),
}

impl State {
    /// The states the contract names, in a fixed order (compact encodings index into it).
    pub const KNOWN: [State; 8] = [
        State::Pending,
        State::Sending,
        State::Retryable,
        State::Submitted,
        State::Delivered,
        State::PermanentFailure,
        State::Failed,
        State::Unknown,
    ];

    pub fn as_str(&self) -> &str {
        match self {
            State::Pending => "pending",
            State::Sending => "sending",
            State::Retryable => "retryable",
            State::Submitted => "submitted",
            State::Delivered => "delivered",
            State::PermanentFailure => "permanent_failure",
            State::Failed => "failed",
            State::Unknown => "unknown",
            State::Other(s) => s,
        }
    }

    /// `delivered`, `permanent_failure` or `failed`: the stack is done with the delivery and it
    /// must never move again (`unknown` may still be reconciled).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            State::Delivered | State::PermanentFailure | State::Failed
        )
    }

    /// Terminal, or `unknown`: the stack has stopped working on the delivery by itself.
    pub fn is_settled(&self) -> bool {
        self.is_terminal() || *self == State::Unknown
    }
}

impl From<&str> for State {
    fn from(s: &str) -> State {
        match s {
            "pending" => State::Pending,
            "sending" => State::Sending,
            "retryable" => State::Retryable,
            "submitted" => State::Submitted,
            "delivered" => State::Delivered,
            "permanent_failure" => State::PermanentFailure,
            "failed" => State::Failed,
            "unknown" => State::Unknown,
            other => State::Other(Box::new(other.to_string())),
        }
    }
}

impl From<String> for State {
    fn from(s: String) -> State {
        State::from(s.as_str())
    }
}

impl From<State> for String {
    fn from(s: State) -> String {
        s.as_str().to_string()
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who moved a delivery: the contract's `source` of a transition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum Source {
    Worker,
    Callback,
    Poll,
    Rescuer,
    Api,
    /// A source the contract does not name, as the stack wrote it (behind a thin pointer).
    Other(Box<String>),
}

impl Source {
    /// The sources the contract names, in a fixed order (compact encodings index into it).
    pub const KNOWN: [Source; 5] = [
        Source::Worker,
        Source::Callback,
        Source::Poll,
        Source::Rescuer,
        Source::Api,
    ];

    pub fn as_str(&self) -> &str {
        match self {
            Source::Worker => "worker",
            Source::Callback => "callback",
            Source::Poll => "poll",
            Source::Rescuer => "rescuer",
            Source::Api => "api",
            Source::Other(s) => s,
        }
    }
}

impl From<&str> for Source {
    fn from(s: &str) -> Source {
        match s {
            "worker" => Source::Worker,
            "callback" => Source::Callback,
            "poll" => Source::Poll,
            "rescuer" => Source::Rescuer,
            "api" => Source::Api,
            other => Source::Other(Box::new(other.to_string())),
        }
    }
}

impl From<String> for Source {
    fn from(s: String) -> Source {
        Source::from(s.as_str())
    }
}

impl From<Source> for String {
    fn from(s: Source) -> String {
        s.as_str().to_string()
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a transition happened, as the stack wrote it (RFC 3339 by the contract).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum At {
    /// Milliseconds since the Unix epoch, for a text in the form the reference stack writes
    /// (`2026-12-03T11:20:01.123Z`), which [`At::text`] gives back byte for byte.
    Millis(i64),
    /// Any other text, as written (behind a thin pointer: an `At` is two words).
    Text(Box<String>),
}

impl At {
    /// The text the stack wrote.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            At::Millis(ms) => Cow::Owned(millis_text(*ms).unwrap_or_default()),
            At::Text(s) => Cow::Borrowed(s),
        }
    }

    /// Milliseconds since the epoch, when the text is RFC 3339.
    pub fn millis(&self) -> Option<i64> {
        match self {
            At::Millis(ms) => Some(*ms),
            At::Text(s) => Some(
                chrono::DateTime::parse_from_rfc3339(s)
                    .ok()?
                    .timestamp_millis(),
            ),
        }
    }
}

/// `ms` since the epoch in the reference stack's form; `None` outside chrono's range.
fn millis_text(ms: i64) -> Option<String> {
    let t = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)?;
    Some(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

impl From<&str> for At {
    fn from(s: &str) -> At {
        let canonical = chrono::DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|t| t.timestamp_millis())
            .filter(|ms| millis_text(*ms).as_deref() == Some(s));
        match canonical {
            Some(ms) => At::Millis(ms),
            None => At::Text(Box::new(s.to_string())),
        }
    }
}

impl From<String> for At {
    fn from(s: String) -> At {
        At::from(s.as_str())
    }
}

impl From<At> for String {
    fn from(a: At) -> String {
        a.text().into_owned()
    }
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

/// All three are written as plain strings in `status.json` and `report.json`.
macro_rules! string_schema {
    ($t:ty, $name:literal) => {
        impl JsonSchema for $t {
            fn schema_name() -> String {
                $name.into()
            }
            fn is_referenceable() -> bool {
                false
            }
            fn json_schema(g: &mut schemars::gen::SchemaGenerator) -> schemars::schema::Schema {
                String::json_schema(g)
            }
        }
    };
}
string_schema!(State, "State");
string_schema!(Source, "Source");
string_schema!(At, "At");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contract_name_reads_back_and_others_are_kept() {
        for name in [
            "pending",
            "sending",
            "retryable",
            "submitted",
            "delivered",
            "permanent_failure",
            "failed",
            "unknown",
        ] {
            let s = State::from(name);
            assert!(!matches!(s, State::Other(_)), "{name}");
            assert_eq!(s.as_str(), name);
            assert_eq!(serde_json::to_value(&s).unwrap(), name);
        }
        for name in ["worker", "callback", "poll", "rescuer", "api"] {
            let s = Source::from(name);
            assert!(!matches!(s, Source::Other(_)), "{name}");
            assert_eq!(s.as_str(), name);
        }
        // A stack's own word is kept, and is neither settled nor terminal.
        let odd: State = serde_json::from_str("\"Delivered\"").unwrap();
        assert_eq!(odd, State::Other(Box::new("Delivered".into())));
        assert!(
            std::mem::size_of::<Option<State>>() <= 16,
            "a transition holds two"
        );
        assert!(!odd.is_settled() && !odd.is_terminal());
        assert_eq!(serde_json::to_string(&odd).unwrap(), "\"Delivered\"");
        assert!(State::Unknown.is_settled() && !State::Unknown.is_terminal());
    }

    /// A time in the reference stack's form is a number that reads back byte for byte; any
    /// other text (another offset, precision or no time at all) is kept as written.
    #[test]
    fn a_transition_time_reads_back_as_written() {
        for (text, number) in [
            ("2026-12-03T11:20:01.123Z", true),
            ("1970-01-01T00:00:00.000Z", true),
            ("2026-12-03T11:20:01.123456Z", false),
            ("2026-12-03T11:20:01Z", false),
            ("2026-12-03T12:20:01.123+01:00", false),
            ("2026-12-03T11:20:01.123z", false),
            ("yesterday", false),
            ("", false),
        ] {
            let at = At::from(text);
            assert_eq!(matches!(at, At::Millis(_)), number, "{text}");
            assert_eq!(at.text(), text);
            let json = serde_json::to_string(&at).unwrap();
            assert_eq!(serde_json::from_str::<At>(&json).unwrap(), at);
            assert_eq!(json, serde_json::to_string(text).unwrap());
        }
        assert!(std::mem::size_of::<Option<At>>() <= 16);
    }
}
