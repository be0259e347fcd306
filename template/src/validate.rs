//! Validation against the variables a caller knows: every slot names exactly one of them, bare.
//! The harness uses it to check a scenario's templates against what the load gives every
//! recipient; what it accepts, the reference stack renders for those recipients.

use crate::error::{Error, ErrorKind};
use crate::parse::{not_a_variable, parse_checked, Template};
use crate::Options;

/// Parses `src` and checks each slot against `known` (plain-text values: a path below one finds
/// nothing), reporting the first error in the source.
pub fn validate(src: &str, known: &[&str], opts: Options) -> Result<Template, Error> {
    let check = |name: &str| -> Option<ErrorKind> {
        if known.contains(&name) {
            return None;
        }
        match not_a_variable(name) {
            Some(ErrorKind::NotAName(_)) | None => {}
            other => return other,
        }
        let root = name.split(['.', '/']).next().unwrap_or(name);
        Some(if root != name && known.contains(&root) {
            ErrorKind::PathIntoText {
                root: root.into(),
                path: name.into(),
            }
        } else {
            ErrorKind::UnknownVariable(root.into())
        })
    };
    parse_checked(src, opts, &check)
}
