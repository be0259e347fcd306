//! The delivery states and transition sources a stack reports through its status API
//! (docs/stack-contract.md), parsed once where the answer is read so that every checker matches
//! on variants the compiler knows: a misspelt state is a compile error, not a rule that silently
//! never fires. A name outside the contract is kept as written (`Other`), never guessed: it is
//! no known state, so nothing treats it as settled, terminal or a source it is not.

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
    /// A state the contract does not name, as the stack wrote it.
    Other(String),
}

impl State {
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
            other => State::Other(other.to_string()),
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
    /// A source the contract does not name, as the stack wrote it.
    Other(String),
}

impl Source {
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
            other => Source::Other(other.to_string()),
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

/// Both are written as plain strings in `status.json` and `report.json`.
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
        assert_eq!(odd, State::Other("Delivered".into()));
        assert!(!odd.is_settled() && !odd.is_terminal());
        assert_eq!(serde_json::to_string(&odd).unwrap(), "\"Delivered\"");
        assert!(State::Unknown.is_settled() && !State::Unknown.is_terminal());
    }
}
