//! One step of a delivery's history in the stack's status view ([`StatusTransition`]): read as
//! the contract's object (`from`, `to`, `source`, `at`, `detail`; [`TransitionWire`]) and held in
//! two words, without the detail no checker reads.
//!
//! A big run's status view holds millions of transitions for the whole run, nearly all of them
//! between states the contract names, by a source it names, at a time in the form the reference
//! stack writes. Those are kept as one-byte codes and the time in milliseconds; a transition with
//! any name or time outside that (a stack's own state, a time that would not read back byte for
//! byte) is kept whole behind one pointer. Either way the accessors give back exactly what the
//! stack wrote, so a checker cannot tell the two apart.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{At, Name, Source, State};

/// A transition of a status row's history (see the module doc).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "TransitionWire", into = "TransitionWire")]
pub struct StatusTransition {
    moves: Moves,
}

/// The contract's object, as read and written (`status.json` keeps its detail).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(rename = "StatusTransition")]
pub struct TransitionWire {
    pub from: Option<State>,
    pub to: State,
    pub source: Source,
    #[serde(default)]
    pub at: Option<At>,
    #[serde(default)]
    pub detail: Option<Name>,
}

#[derive(Clone, PartialEq)]
enum Moves {
    /// Named by the contract: [`State::KNOWN`] and [`Source::KNOWN`] positions (`from` one past, 0 for
    /// none), the time in milliseconds ([`NO_TIME`] for none).
    Known {
        at_ms: i64,
        from: u8,
        to: u8,
        source: u8,
    },
    /// Anything else, as written.
    Rare(Box<(Option<State>, State, Source, Option<At>)>),
}

/// `at_ms` of a transition without a time (no text reads back as it: [`At`] keeps such a
/// time as text, and a transition with one is [`Moves::Rare`]).
const NO_TIME: i64 = i64::MIN;

fn code<T: PartialEq>(known: &[T], x: &T) -> Option<u8> {
    known.iter().position(|k| k == x).map(|i| i as u8)
}

impl StatusTransition {
    pub fn new(from: Option<State>, to: State, source: Source, at: Option<At>) -> StatusTransition {
        let from_code = match &from {
            None => Some(0),
            Some(s) => code(&State::KNOWN, s).map(|c| c + 1),
        };
        let at_ms = match &at {
            None => Some(NO_TIME),
            Some(At::Millis(ms)) if *ms != NO_TIME => Some(*ms),
            Some(_) => None,
        };
        let known = (
            from_code,
            code(&State::KNOWN, &to),
            code(&Source::KNOWN, &source),
            at_ms,
        );
        let moves = match known {
            (Some(from), Some(to), Some(source), Some(at_ms)) => Moves::Known {
                at_ms,
                from,
                to,
                source,
            },
            _ => Moves::Rare(Box::new((from, to, source, at))),
        };
        StatusTransition { moves }
    }

    /// The state it left; `None` when the stack did not say.
    pub fn from(&self) -> Option<State> {
        match &self.moves {
            Moves::Known { from: 0, .. } => None,
            Moves::Known { from, .. } => Some(State::KNOWN[usize::from(*from - 1)].clone()),
            Moves::Rare(r) => r.0.clone(),
        }
    }

    /// The state it entered.
    pub fn to(&self) -> State {
        match &self.moves {
            Moves::Known { to, .. } => State::KNOWN[usize::from(*to)].clone(),
            Moves::Rare(r) => r.1.clone(),
        }
    }

    /// Who made it.
    pub fn source(&self) -> Source {
        match &self.moves {
            Moves::Known { source, .. } => Source::KNOWN[usize::from(*source)].clone(),
            Moves::Rare(r) => r.2.clone(),
        }
    }

    /// When, as the stack wrote it.
    pub fn at(&self) -> Option<At> {
        match &self.moves {
            Moves::Known { at_ms: NO_TIME, .. } => None,
            Moves::Known { at_ms, .. } => Some(At::Millis(*at_ms)),
            Moves::Rare(r) => r.3.clone(),
        }
    }
}

impl From<TransitionWire> for StatusTransition {
    /// Drops the detail.
    fn from(w: TransitionWire) -> StatusTransition {
        StatusTransition::new(w.from, w.to, w.source, w.at)
    }
}

impl From<StatusTransition> for TransitionWire {
    fn from(t: StatusTransition) -> TransitionWire {
        TransitionWire {
            from: t.from(),
            to: t.to(),
            source: t.source(),
            at: t.at(),
            detail: None,
        }
    }
}

impl fmt::Debug for StatusTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusTransition")
            .field("from", &self.from())
            .field("to", &self.to())
            .field("source", &self.source())
            .field("at", &self.at())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the stack wrote reads back but for the detail, which the wire form keeps.
    fn round_trip(json: serde_json::Value) -> StatusTransition {
        let wire: TransitionWire = serde_json::from_value(json.clone()).unwrap();
        let t: StatusTransition = wire.clone().into();
        let parsed: StatusTransition = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(parsed, t);
        // `at` and `detail` are written as null when absent.
        let written = |v: serde_json::Value| {
            let mut v = v;
            v.as_object_mut().unwrap().retain(|_, v| !v.is_null());
            v
        };
        assert_eq!(
            written(serde_json::to_value(&wire).unwrap()),
            written(json.clone())
        );
        let mut want = written(json);
        want.as_object_mut().unwrap().remove("detail");
        assert_eq!(written(serde_json::to_value(&t).unwrap()), want);
        t
    }

    /// Two words, whatever the stack wrote; what the contract names is held without a pointer.
    #[test]
    fn a_transition_is_two_words() {
        assert!(
            std::mem::size_of::<StatusTransition>() <= 16,
            "{}",
            std::mem::size_of::<StatusTransition>()
        );
        let t = round_trip(serde_json::json!({
            "from": "sending", "to": "submitted", "source": "worker",
            "at": "2026-12-03T11:20:01.123Z", "detail": "w1"
        }));
        assert!(matches!(t.moves, Moves::Known { .. }));
        assert_eq!(t.from(), Some(State::Sending));
        assert_eq!(t.to(), State::Submitted);
        assert_eq!(t.source(), Source::Worker);
        assert_eq!(t.at().and_then(|a| a.millis()), Some(1_796_296_801_123));
    }

    /// Every name and time outside the compact form is given back exactly as written.
    #[test]
    fn anything_else_reads_back_as_written() {
        let cases = [
            serde_json::json!({"from": null, "to": "pending", "source": "api"}),
            serde_json::json!({"from": "pending", "to": "exploded", "source": "worker"}),
            serde_json::json!({"from": "limbo", "to": "sending", "source": "worker"}),
            serde_json::json!({"from": "sending", "to": "failed", "source": "cron"}),
            serde_json::json!({"from": "sending", "to": "failed", "source": "poll", "at": "yesterday"}),
            serde_json::json!({"from": "sending", "to": "failed", "source": "poll", "at": "2026-12-03T11:20:01+00:00"}),
        ];
        let rare = cases
            .clone()
            .map(|c| matches!(round_trip(c).moves, Moves::Rare(_)));
        assert_eq!(rare, [false, true, true, true, true, true]);
        let t = round_trip(cases[1].clone());
        assert_eq!(t.to().as_str(), "exploded");
        assert_eq!(t.from(), Some(State::Pending));
        // Equal transitions are equal whichever way they were made.
        assert_eq!(
            t,
            StatusTransition::new(
                Some(State::Pending),
                State::from("exploded"),
                Source::Worker,
                None
            )
        );
    }
}
