//! `GET …/Messages/{Sid}.json` and `GET …/Messages.json?To=…&DateSent>=…`: what a stack uses to
//! reconcile an uncertain send instead of blindly resending. Every read is a ledger entry
//! (`EntryKind::Poll`), so a report can show who reconciled and when, with the message status
//! it told; a list read without `To` adds one entry per failed message it listed (its number
//! and sid), the one way the harness can know whose failure such a read told.
//!
//! Reads never change a message.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, NaiveDate, Utc};
use serde_json::json;
use tokio::time::Instant;

use super::store::API_VERSION;
use super::{authorized, twilio_error, SmsState};
use crate::callbacks::plan::is_sms_failure;
use crate::http::Reply;
use crate::ledger::{EntryKind, LedgerEntry, Outcome, Provider};

/// Records one read: its HTTP status, and in `reported` the message status it told the stack
/// (a stack that learns a failure from a poll rather than a report is right to record it).
fn record_poll(
    st: &SmsState,
    peer: SocketAddr,
    (recipient, sid): (&str, Option<String>),
    status: u16,
    reported: Option<&str>,
) {
    let mut d = LedgerEntry::draft(Provider::Sms, EntryKind::Poll, recipient);
    d.outcome = Outcome::Info;
    d.status = status.to_string();
    d.message_id = sid;
    d.peer = Some(peer);
    d.callback_status = reported.map(str::to_string);
    st.inner.hub.ledger.record(d);
}

/// Of a list read's messages, the failure one of them showed (`undelivered` before `failed`),
/// else the newest one's status: what the read can have told the stack about that number.
fn listed_status<'a>(statuses: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut first = None;
    let mut failure = None;
    for s in statuses {
        first.get_or_insert(s);
        if is_sms_failure(s) && failure != Some("undelivered") {
            failure = Some(s);
        }
    }
    failure.or(first)
}

pub(super) async fn fetch(
    State(st): State<SmsState>,
    Path((account, file)): Path<(String, String)>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let cfg = st.inner.hub.sms.get();
    if !authorized(&cfg, &account, &headers) {
        record_poll(&st, peer, ("", None), 401, None);
        return twilio_error(401, 20003, "").into_response();
    }
    let sid = file.strip_suffix(".json").unwrap_or(&file);
    match st.inner.store.get(sid) {
        Some(msg) => {
            let resource = msg.resource(Instant::now());
            let reported = Some(resource.status);
            let sid = Some(resource.sid.clone());
            record_poll(&st, peer, (&resource.to, sid), 200, reported);
            Reply::serialized(200, &resource).into_response()
        }
        None => {
            record_poll(&st, peer, ("", Some(sid.to_string())), 404, None);
            twilio_error(404, 20404, "").into_response()
        }
    }
}

/// A `DateSent` bound: a day (`2024-05-01`) or an instant (RFC 3339 or RFC 2822).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Bound {
    Day(NaiveDate),
    At(DateTime<Utc>),
}

fn parse_bound(s: &str) -> Option<Bound> {
    let s = s.trim();
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Some(Bound::Day(d));
    }
    DateTime::parse_from_rfc3339(s)
        .or_else(|_| DateTime::parse_from_rfc2822(s))
        .ok()
        .map(|d| Bound::At(d.with_timezone(&Utc)))
}

/// Which way a `DateSent` filter compares.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cmp {
    Eq,
    OnOrAfter,
    OnOrBefore,
}

fn matches(date: DateTime<Utc>, cmp: Cmp, bound: Bound) -> bool {
    let ord = match (cmp, bound) {
        (_, Bound::Day(d)) => date.date_naive().cmp(&d),
        // Twilio's `DateSent=` filters by day: an instant names its (UTC) day, not one second.
        (Cmp::Eq, Bound::At(t)) => date.date_naive().cmp(&t.date_naive()),
        (_, Bound::At(t)) => date.cmp(&t),
    };
    match cmp {
        Cmp::Eq => ord.is_eq(),
        Cmp::OnOrAfter => ord.is_ge(),
        Cmp::OnOrBefore => ord.is_le(),
    }
}

pub(super) async fn list(
    State(st): State<SmsState>,
    Path(account): Path<String>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let cfg = st.inner.hub.sms.get();
    if !authorized(&cfg, &account, &headers) {
        record_poll(&st, peer, ("", None), 401, None);
        return twilio_error(401, 20003, "").into_response();
    }
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(query.as_deref().unwrap_or("")).unwrap_or_default();
    let mut to = None;
    let mut from = None;
    let mut dates = Vec::new();
    let mut page_size = 50usize;
    let mut page = 0usize;
    for (k, v) in &pairs {
        // `DateSent>=2024-05-01` decodes as the name `DateSent>` with the value `2024-05-01`.
        let cmp = match k.trim_end_matches('=') {
            "DateSent" => Some(Cmp::Eq),
            "DateSent>" => Some(Cmp::OnOrAfter),
            "DateSent<" => Some(Cmp::OnOrBefore),
            _ => None,
        };
        match (k.as_str(), cmp) {
            (_, Some(c)) => match parse_bound(v) {
                Some(b) => dates.push((c, b)),
                None => {
                    record_poll(&st, peer, (to.unwrap_or(""), None), 400, None);
                    return twilio_error(400, 20001, "").into_response();
                }
            },
            ("To", _) => to = Some(v.as_str()),
            ("From", _) => from = Some(v.as_str()),
            ("PageSize", _) => page_size = v.parse().unwrap_or(50).clamp(1, 1000),
            ("Page", _) => page = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    let now = Instant::now();
    let all: Vec<_> = st
        .inner
        .store
        .list(to)
        .into_iter()
        .filter(|m| from.is_none_or(|f| m.origin.sender().as_deref() == Some(f)))
        .filter(|m| {
            dates
                .iter()
                .all(|(c, b)| matches(m.filter_date(now), *c, *b))
        })
        .collect();
    // Any `Page` parses (Twilio answers a page past the end with an empty list): the arithmetic
    // saturates rather than wrapping back to the first page.
    let start = page.saturating_mul(page_size);
    let messages: Vec<_> = all
        .iter()
        .skip(start)
        .take(page_size)
        .map(|m| m.resource(now))
        .collect();
    // Page links keep the request's filters, as Twilio's do: page 2 is page 2 of this list.
    let base = format!("/{API_VERSION}/Accounts/{account}/Messages.json");
    let filters: Vec<(&str, &str)> = pairs
        .iter()
        .filter(|(k, _)| k != "Page" && k != "PageSize")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let page_uri = |p: usize| {
        let (size, p) = (page_size.to_string(), p.to_string());
        let mut q = filters.clone();
        q.extend([("PageSize", size.as_str()), ("Page", p.as_str())]);
        format!(
            "{base}?{}",
            serde_urlencoded::to_string(q).unwrap_or_default()
        )
    };
    let next = (start.saturating_add(page_size) < all.len()).then(|| page_uri(page + 1));
    let prev = (page > 0).then(|| page_uri(page - 1));
    let reported = listed_status(messages.iter().map(|m| m.status));
    record_poll(&st, peer, (to.unwrap_or(""), None), 200, reported);
    if to.is_none() {
        // A read about no one number told each listed number's failure: recorded per message
        // (by its sid), so the harness knows whose failure the stack may have learned from it.
        for m in messages.iter().filter(|m| is_sms_failure(m.status)) {
            record_poll(&st, peer, (&m.to, Some(m.sid.clone())), 200, Some(m.status));
        }
    }
    Reply::json(
        200,
        json!({
            "end": start.saturating_add(messages.len()).saturating_sub(1),
            "first_page_uri": page_uri(0),
            "messages": messages,
            "next_page_uri": next,
            "page": page,
            "page_size": page_size,
            "previous_page_uri": prev,
            "start": start,
            "uri": page_uri(page),
        }),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_read_tells_a_failure_any_of_its_messages_showed_else_the_newest_status() {
        let told = |s: &[&'static str]| listed_status(s.iter().copied());
        assert_eq!(told(&[]), None);
        assert_eq!(told(&["delivered", "sent"]), Some("delivered"));
        assert_eq!(told(&["sent", "failed"]), Some("failed"));
        assert_eq!(
            told(&["failed", "undelivered", "sent"]),
            Some("undelivered")
        );
        assert_eq!(told(&["undelivered", "failed"]), Some("undelivered"));
    }

    #[test]
    fn date_filters() {
        let t: DateTime<Utc> = "2024-05-01T10:00:00Z".parse().unwrap();
        let cases = [
            (Cmp::OnOrAfter, "2024-05-01", true),
            (Cmp::OnOrAfter, "2024-05-02", false),
            (Cmp::OnOrBefore, "2024-04-30", false),
            (Cmp::Eq, "2024-05-01", true),
            (Cmp::Eq, "2024-05-01T00:00:00Z", true),
            (Cmp::Eq, "2024-05-02T10:00:00Z", false),
            (Cmp::OnOrAfter, "2024-05-01T09:59:59Z", true),
            (Cmp::OnOrAfter, "2024-05-01T10:00:01Z", false),
            (Cmp::OnOrBefore, "Wed, 01 May 2024 11:00:00 +0000", true),
        ];
        for (cmp, b, want) in cases {
            assert_eq!(
                matches(t, cmp, parse_bound(b).unwrap()),
                want,
                "{cmp:?} {b}"
            );
        }
        assert_eq!(parse_bound("yesterday"), None);
    }
}
