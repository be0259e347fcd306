//! One answer of the stack's status API (`GET /v1/batches/{id}/deliveries`), read at the
//! boundary: each row is handed to the caller as soon as it is parsed, so an answer of 30,000
//! rows with their histories is never a list of wire rows in memory, only what the caller makes
//! of each (`run/status.rs` keeps the view's row, and for the run's last poll the row's JSON).
//! Must accept and refuse exactly what parsing the whole answer into a list would, with the same
//! errors.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use anyhow::Context;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::stream_json;
use crate::check::StatusRowWire;

/// One answer of the status API for a batch: its rows as the reader made them.
#[derive(Debug)]
pub struct StatusPage<R = StatusRowWire> {
    pub deliveries: Vec<R>,
    /// The incremental form's cursor: the next request may pass it as `?since=` and get only
    /// the deliveries that changed after it. Absent: the stack has no incremental form.
    pub cursor: Option<String>,
}

/// One answer of the status API for a batch, read at the boundary.
#[derive(Debug)]
pub enum StatusAnswer<R = StatusRowWire> {
    /// 404, 405 or 501: no status API, or (after it answered once) a batch it does not know.
    NotFound,
    /// The contract's answer.
    Page(StatusPage<R>),
    /// A 2xx answer that is not the contract's: not JSON, not its shape, or longer than any
    /// whole list of the batch could be. The stack's failure, kept as a counterexample.
    Unreadable {
        http_status: u16,
        error: String,
        body_head: String,
    },
}

impl StatusAnswer {
    /// The answer with each wire row made what `row` makes of it (as a fetch would have).
    #[cfg(test)]
    pub fn map_rows<R>(self, row: impl FnMut(StatusRowWire) -> R) -> StatusAnswer<R> {
        match self {
            StatusAnswer::NotFound => StatusAnswer::NotFound,
            StatusAnswer::Page(p) => StatusAnswer::Page(StatusPage {
                deliveries: p.deliveries.into_iter().map(row).collect(),
                cursor: p.cursor,
            }),
            StatusAnswer::Unreadable {
                http_status,
                error,
                body_head,
            } => StatusAnswer::Unreadable {
                http_status,
                error,
                body_head,
            },
        }
    }
}

/// Bytes of an unreadable answer kept to show what the stack sent.
const BODY_HEAD: usize = 200;

/// One batch's answer from the status API (with `?since=` when a cursor is given), read up to
/// `cap` bytes, each row made what `row` makes of it as it is parsed: what it means is
/// `run/status.rs`'s business. `Err` when there was no answer to use (no connection, a
/// timeout, a body cut off, an error status other than 404 / 405 / 501): the next poll asks
/// again.
pub async fn fetch_batch_status<R: Send + 'static>(
    client: &reqwest::Client,
    api_base: &str,
    batch_id: &str,
    since: Option<&str>,
    cap: usize,
    row: impl FnMut(StatusRowWire) -> R + Send + 'static,
) -> anyhow::Result<StatusAnswer<R>> {
    let mut req = client.get(format!("{api_base}/v1/batches/{batch_id}/deliveries"));
    if let Some(cursor) = since {
        req = req.query(&[("since", cursor)]);
    }
    let resp = req.send().await.context("status API request")?;
    let status = resp.status();
    if matches!(status.as_u16(), 404 | 405 | 501) {
        return Ok(StatusAnswer::NotFound);
    }
    if !status.is_success() {
        anyhow::bail!("status API answered HTTP {status}");
    }
    let head = |body: &[u8]| String::from_utf8_lossy(body).into_owned();
    // Rows read so far, so that a refusal says where in a long answer it fell.
    let read = Arc::new(AtomicUsize::new(0));
    let row = {
        let read = Arc::clone(&read);
        let mut row = row;
        move |wire| {
            read.fetch_add(1, Relaxed);
            row(wire)
        }
    };
    match stream_json::parse(resp, cap, BODY_HEAD, PageSeed(row)).await {
        Ok(page) => Ok(StatusAnswer::Page(page)),
        Err(stream_json::Failed::TooLong { head: first }) => Ok(StatusAnswer::Unreadable {
            http_status: status.as_u16(),
            error: format!(
                "the answer is longer than {cap} bytes, more than the whole list of this run's \
                 deliveries can take"
            ),
            body_head: head(&first),
        }),
        Err(stream_json::Failed::Parse { error, head: first }) => Ok(StatusAnswer::Unreadable {
            http_status: status.as_u16(),
            error: format!(
                "not the contract's answer: {error} ({} read before it)",
                match read.load(Relaxed) {
                    1 => "1 delivery".to_string(),
                    n => format!("{n} deliveries"),
                }
            ),
            body_head: head(&first),
        }),
        Err(stream_json::Failed::Transport(e)) => Err(anyhow::anyhow!("status API body: {e}")),
    }
}

/// Reads a [`StatusPage`] as `#[derive(Deserialize)]` would (a map, or a sequence of its two
/// fields; unknown keys ignored; `cursor` optional), its rows through the reader.
struct PageSeed<F>(F);

const FIELDS: &[&str] = &["deliveries", "cursor"];

impl<'de, R, F: FnMut(StatusRowWire) -> R> DeserializeSeed<'de> for PageSeed<F> {
    type Value = StatusPage<R>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<StatusPage<R>, D::Error> {
        d.deserialize_struct("StatusPage", FIELDS, self)
    }
}

impl<'de, R, F: FnMut(StatusRowWire) -> R> Visitor<'de> for PageSeed<F> {
    type Value = StatusPage<R>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("struct StatusPage")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<StatusPage<R>, A::Error> {
        let mut deliveries = None;
        let mut cursor = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "deliveries" if deliveries.is_some() => {
                    return Err(de::Error::duplicate_field("deliveries"))
                }
                "deliveries" => deliveries = Some(map.next_value_seed(RowsSeed(&mut self.0))?),
                "cursor" if cursor.is_some() => return Err(de::Error::duplicate_field("cursor")),
                "cursor" => cursor = Some(map.next_value::<Option<String>>()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(StatusPage {
            deliveries: deliveries.ok_or_else(|| de::Error::missing_field("deliveries"))?,
            cursor: cursor.flatten(),
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<StatusPage<R>, A::Error> {
        let expected = "struct StatusPage with 2 elements";
        let deliveries = seq
            .next_element_seed(RowsSeed(&mut self.0))?
            .ok_or_else(|| de::Error::invalid_length(0, &expected))?;
        let cursor = seq.next_element::<Option<String>>()?.flatten();
        Ok(StatusPage { deliveries, cursor })
    }
}

/// The `deliveries` list, each row made an `R` as soon as it is parsed.
struct RowsSeed<'a, F>(&'a mut F);

impl<'de, R, F: FnMut(StatusRowWire) -> R> DeserializeSeed<'de> for RowsSeed<'_, F> {
    type Value = Vec<R>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<R>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, R, F: FnMut(StatusRowWire) -> R> Visitor<'de> for RowsSeed<'_, F> {
    type Value = Vec<R>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<R>, A::Error> {
        let mut rows = Vec::new();
        while let Some(wire) = seq.next_element::<StatusRowWire>()? {
            rows.push((self.0)(wire));
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    mod derived {
        /// What `#[derive(Deserialize)]` made of a page: the reader must give the same value
        /// or the same error.
        #[derive(Debug, serde::Deserialize)]
        pub struct StatusPage {
            pub deliveries: Vec<crate::check::StatusRowWire>,
            #[serde(default)]
            pub cursor: Option<String>,
        }
    }

    fn read(text: &str) -> Result<(Vec<StatusRowWire>, Option<String>), String> {
        let mut de = serde_json::Deserializer::from_str(text);
        let page = PageSeed(|w| w)
            .deserialize(&mut de)
            .and_then(|p| de.end().map(|()| p));
        page.map(|p| (p.deliveries, p.cursor))
            .map_err(|e| e.to_string())
    }

    fn derived(text: &str) -> Result<(Vec<StatusRowWire>, Option<String>), String> {
        serde_json::from_str::<derived::StatusPage>(text)
            .map(|p| (p.deliveries, p.cursor))
            .map_err(|e| e.to_string())
    }

    /// Every shape an answer can take, contract's or not, reads as the derived reader read it.
    #[test]
    fn reads_as_the_derived_reader_did() {
        let row = r#"{"key": "b:r1:line", "recipient": "r1", "channel": "line", "state": "sent"}"#;
        let cases = [
            format!(r#"{{"deliveries": [{row}, {row}], "cursor": "c9"}}"#),
            format!(r#"{{"cursor": null, "deliveries": [{row}], "extra": {{"x": [1]}}}}"#),
            r#"{"deliveries": []}"#.to_string(),
            format!(r#"[[{row}], "c1"]"#),
            format!(r#"[[{row}]]"#),
            "[]".to_string(),
            format!(r#"[[{row}], "c1", 5]"#),
            "7".to_string(),
            r#"{"cursor": "c"}"#.to_string(),
            r#"{"deliveries": [], "deliveries": []}"#.to_string(),
            r#"{"deliveries": [], "cursor": "a", "cursor": "b"}"#.to_string(),
            r#"{"deliveries": "all of them"}"#.to_string(),
            r#"{"deliveries": [{"key": "k"}]}"#.to_string(),
            r#"{"deliveries": [], "cursor": 7}"#.to_string(),
            r#"{"deliveries": [{"key": "k", "recipient": "r1", "channel": "line", "state": "sent", "attempts": 1e30}]}"#.to_string(),
            r#""deliveries""#.to_string(),
            r#"{"deliveries": []} trailing"#.to_string(),
            r#"{"deliveries": [{"#.to_string(),
        ];
        for text in cases {
            assert_eq!(read(&text), derived(&text), "{text}");
        }
    }

    /// Each row reaches the reader in order, as it is parsed, and the page holds what it made.
    #[test]
    fn each_row_is_made_as_it_is_parsed() {
        let rows: Vec<String> = (0..5)
            .map(|i| {
                format!(
                    r#"{{"key": "k{i}", "recipient": "r{i}", "channel": "sms", "state": "sent"}}"#
                )
            })
            .collect();
        let text = format!(r#"{{"deliveries": [{}]}}"#, rows.join(","));
        let mut seen = Vec::new();
        let mut de = serde_json::Deserializer::from_str(&text);
        let page = PageSeed(|w: StatusRowWire| {
            seen.push(w.key.to_string());
            w.recipient.len()
        })
        .deserialize(&mut de)
        .unwrap();
        assert_eq!(page.deliveries, [2; 5]);
        assert_eq!(seen, ["k0", "k1", "k2", "k3", "k4"]);
    }
}
