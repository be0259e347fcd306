//! The scenario language at its boundary: good files load, and every bad file is rejected with
//! the exact key, line and column (and the nearest valid key for typos).

use std::path::Path;

use ting_chaos_harness::scenario::{self, Target, Trigger, UnknownPolicy};

const BASE: &str = r#"name = "t"
seed = 7

[stack]
workers = 4
lease = "2s"
heartbeat = "500ms"

[load]
recipients = 100
channels = ["line", "sms"]

[[chaos]]
progress = "40%"
action = "sigkill"
target = 2
"#;

/// Replaces the first occurrence of `from` in BASE with `to`.
fn with(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "fixture does not contain {from:?}");
    BASE.replacen(from, to, 1)
}

fn parse(text: &str) -> Result<scenario::Scenario, scenario::ScenarioError> {
    scenario::parse(Path::new("case.toml"), text)
}

#[test]
fn base_fixture_is_valid() {
    let s = parse(BASE).expect("valid");
    assert_eq!(s.stack.workers, 4);
    assert!(matches!(s.chaos[0].trigger, Trigger::Progress(p) if (p - 0.4).abs() < 1e-9));
    assert_eq!(s.chaos[0].target, Target::Worker(2));
}

/// (what is changed, into what, expected key, line, col, message fragment, suggestion).
/// An empty "what is changed" appends "into what" after a blank line, so it starts on line 18.
type Case = (
    &'static str,
    &'static str,
    &'static str,
    usize,
    usize,
    &'static str,
    Option<&'static str>,
);

/// The BASE of each case: `from` replaced by `to`, or `to` appended when `from` is empty.
fn case_text(from: &str, to: &str) -> String {
    if from.is_empty() {
        format!("{BASE}\n{to}")
    } else {
        with(from, to)
    }
}

fn check_cases(cases: &[Case]) {
    for (from, to, key, line, col, fragment, suggestion) in cases {
        let text = case_text(from, to);
        let err = match parse(&text) {
            Ok(_) => panic!("case {to:?} was accepted"),
            Err(e) => e,
        };
        let shown = err.to_string();
        assert_eq!(err.key.as_deref(), Some(*key), "case {to:?}: {shown}");
        assert_eq!((err.line, err.col), (*line, *col), "case {to:?}: {shown}");
        assert!(
            shown.contains(fragment),
            "case {to:?}: {shown:?} lacks {fragment:?}"
        );
        assert!(
            shown.contains(&format!("case.toml:{line}:{col}")),
            "{shown}"
        );
        assert_eq!(
            err.suggestion.as_deref(),
            *suggestion,
            "case {to:?}: {shown}"
        );
    }
}

#[test]
fn bad_scenarios_name_key_line_and_column() {
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("workers = 4", "worker = 4", "worker", 5, 1, "unknown key `worker` in [stack]", Some("workers")),
        ("seed = 7", "sed = 7", "sed", 2, 1, "unknown key `sed` at the top level", Some("seed")),
        ("recipients = 100", "recipient = 100", "recipient", 10, 1, "in [load]", Some("recipients")),
        ("workers = 4", "workers = 0", "workers", 5, 1, "between 1 and 64", None),
        ("lease = \"2s\"", "lease = \"-2s\"", "lease", 6, 9, "negative", None),
        ("lease = \"2s\"", "lease = \"2 parsecs\"", "lease", 6, 9, "invalid duration", None),
        ("heartbeat = \"500ms\"", "heartbeat = \"5s\"", "heartbeat", 7, 1, "shorter than `lease`", None),
        ("progress = \"40%\"", "progress = \"140%\"", "progress", 14, 12, "out of range", None),
        ("progress = \"40%\"", "progress = 1.5", "progress", 14, 12, "out of range", None),
        ("channels = [\"line\", \"sms\"]", "channels = [\"line\", \"fax\"]", "channels", 11, 21, "unknown value `fax` for `channels` in [load]", None),
        ("channels = [\"line\", \"sms\"]", "channels = []", "channels", 11, 1, "at least one", None),
        ("channels = [\"line\", \"sms\"]", "channels = [\"line\", \"line\"]", "channels", 11, 21, "listed twice", None),
        ("action = \"sigkill\"", "action = \"sigkil\"", "action", 15, 10, "unknown value `sigkil`", Some("sigkill")),
        ("[load]\n", "[load]\nbatches = 0\n", "batches", 10, 1, "`batches` must be between", None),
        ("[load]\n", "[load]\nrate = 2.0\n", "rate", 10, 1, "needs a `duration`", None),
        ("[stack]\n", "[stack]\nflaws = [\"racy-clam\"]\n", "flaws", 5, 10, "unknown flaw", Some("racy-claim")),
        ("[stack]\n", "[stack.external]\napi = [\"a\"]\nworkr = [\"w\"]\n[stack]\n", "workr", 6, 1, "unknown key `workr` in [stack.external]", Some("worker")),
        ("recipients = 100", "recipients = \"lots\"", "recipients", 10, 14, "bad value for `recipients` in [load]", None),
        ("action = \"sigkill\"\n", "", "action", 13, 1, "missing key `action` in `chaos[0]`", None),
        // A misspelt table header is an unknown key of its parent table.
        ("", "[load.bad_adresses]\nline = \"1%\"", "bad_adresses", 18, 7, "unknown key `bad_adresses` in [load]", Some("bad_addresses")),
        // A transposition in a short key still finds the key.
        ("progress = \"40%\"", "on_accept = { channel = \"line\", nht = 3 }", "nht", 14, 33, "unknown key `nht` in `chaos[0].on_accept`", Some("nth")),

        // `min_judged` is keyed by checker name.
        ("", "[expect]\nmin_judged = { callbaks = 100 }", "callbaks", 19, 16, "unknown checker `callbaks` in `min_judged`", Some("callbacks")),
    ];
    check_cases(cases);
}

/// Cross-field errors point at the offending key itself, never at the `[[chaos]]` header.
#[test]
fn cross_field_errors_point_at_the_key() {
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("target = 2", "target = 9", "target", 16, 1, "[[chaos]] #1: `target` worker 9 does not exist", None),
        ("target = 2", "target = \"busyest\"", "target", 16, 1, "unknown `target`", Some("busiest")),
        ("target = 2", "target = \"sender\"", "target", 16, 1, "needs an `on_accept` trigger", None),
        ("progress = \"40%\"", "at = \"1s\"\nprogress = \"40%\"", "progress", 15, 1, "`at` and `progress` are both given; give exactly one trigger", None),
        ("progress = \"40%\"", "progress = \"40%\"\non_accept = { channel = \"sms\", nth = 3 }", "on_accept", 15, 1, "`progress` and `on_accept` are both given", None),
        ("action = \"sigkill\"", "action = \"sigstop\"", "action", 15, 1, "`sigstop` needs `for`", None),
        ("target = 2", "target = 2\nfor = \"1s\"", "for", 17, 1, "`for` only applies to `sigstop`, `db_idle_tx`, `db_partition`, `db_latency`, `db_bandwidth`, `provider_outage` and the provider-link actions, not `sigkill`", None),
        ("progress = \"40%\"", "on_accept = { channel = \"sms\", nth = 0 }", "nth", 14, 32, "counts from 1", None),
        // 100 recipients: the 101st accept on a channel never comes.
        ("progress = \"40%\"", "on_accept = { channel = \"sms\", nth = 101 }", "nth", 14, 32, "[load] sends 100 deliveries on `sms`: the step could never fire", None),
        ("progress = \"40%\"", "on_accept = { channel = \"email\", nth = 2 }", "channel", 14, 15, "does not send on", None),
        ("action = \"sigkill\"", "action = \"db_restart\"\nrestart_after = \"1s\"", "restart_after", 16, 1, "worker actions only", None),
        // The database-link actions: each takes its own keys, in range.
        ("action = \"sigkill\"", "action = \"db_partition\"", "action", 15, 1, "`db_partition` needs `for`", None),
        ("action = \"sigkill\"", "action = \"db_latency\"\nfor = \"1s\"", "action", 15, 1, "`db_latency` needs `delay`", None),
        ("action = \"sigkill\"", "action = \"db_latency\"\nfor = \"1s\"\ndelay = \"2m\"", "delay", 17, 1, "`delay` is at most 1m", None),
        ("action = \"sigkill\"", "action = \"db_bandwidth\"\nfor = \"1s\"\nbytes_per_s = 0", "bytes_per_s", 17, 1, "at least 1", None),
        ("action = \"sigkill\"", "action = \"db_reset\"\ndelay = \"5ms\"", "delay", 16, 1, "`delay` only applies to `db_latency`", None),
        ("action = \"sigkill\"", "action = \"db_reset\"\nfor = \"1s\"", "for", 16, 1, "not `db_reset`", None),
        ("action = \"sigkill\"", "action = \"db_partition\"\nfor = \"1s\"\nrestart_after = \"1s\"", "restart_after", 17, 1, "worker actions only", None),
        // A server database leaves nothing the harness may restart: refused, never skipped.
        ("action = \"sigkill\"\ntarget = 2\n", "action = \"db_restart\"\n\n[database]\nurl = \"postgres://u@db.example/x\"\n", "action", 15, 1, "[[chaos]] #1: `db_restart` restarts the run's throwaway PostgreSQL cluster, but [database].url puts", None),
        // The second of several [[chaos]] entries.
        ("", "[[chaos]]\nat = \"1s\"\naction = \"sigkill\"\ntarget = 7", "target", 21, 1, "[[chaos]] #2: `target` worker 7 does not exist", None),
        // Dotted keys and inline tables: at the key inside them, not at 1:1.
        ("[stack]\nworkers = 4\nlease = \"2s\"\nheartbeat = \"500ms\"\n", "stack.workers = 0\nstack.lease = \"2s\"\nstack.heartbeat = \"500ms\"\n", "workers", 4, 7, "`workers` must be between 1 and 64 (got 0)", None),
        ("heartbeat = \"500ms\"\n", "heartbeat = \"500ms\"\nbackoff = { base = \"0ms\", max = \"1s\" }\n", "base", 8, 13, "`base` (0s) must be greater than 0", None),
        ("", "[providers.line]\nlatency = { kind = \"uniform\", min = \"2s\", max = \"1s\" }", "min", 19, 31, "uniform latency has min 2s > max 1s", None),
        ("", "[providers.sms]\nlatency = { kind = \"lognormal\", p50 = \"2s\", p99 = \"1s\" }", "p50", 19, 33, "lognormal latency has p50 2s > p99 1s", None),
        ("", "[providers.smtp]\nstage_latency = { rcpt = { kind = \"uniform\", min = \"2s\", max = \"1s\" } }", "min", 19, 46, "uniform latency has min 2s > max 1s", None),
        // Inside an inline array: the whole key path is named.
        ("", "[providers.line]\ntransient = [{ status = 500, rate = 1.5 }]", "rate", 19, 37, "bad value for `providers.line.transient[0].rate`: 1.5 (150%) is out of range", None),
        ("", "[providers.line]\ntransient = [{ status = 500, rat = 0.5 }]", "rat", 19, 30, "unknown key `rat` in `providers.line.transient[0]`", Some("rate")),
        // An outage in a profile would last the whole run, SMTP's as LINE's and SMS's.
        ("", "[providers.smtp]\noutage = { mode = \"hang\" }", "outage", 19, 1, "[providers.smtp] `outage` would fail the provider for the whole run", None),
    ];
    check_cases(cases);
    // A missing trigger has no key to point at: the entry's own header.
    let err = parse(&with("progress = \"40%\"\n", "")).unwrap_err();
    assert_eq!((err.line, err.col), (13, 1), "{err}");
    assert!(
        err.to_string()
            .contains("[[chaos]] #1: needs a trigger: one of `at`, `progress`, `on_accept`"),
        "{err}"
    );
}

/// Durations past their bound are errors at the key, never a panic (a fractional value too large
/// for `Duration` used to abort `validate`) nor a fake that overflows its clock mid-run.
#[test]
fn durations_past_their_bounds_are_errors_at_the_key() {
    let cases: &[(&str, &str, usize, &str)] = &[
        (
            "lease = \"2s\"",
            "lease = \"100000000000000000000.5s\"",
            6,
            "is too long: at most 7 days",
        ),
        (
            "lease = \"2s\"",
            "lease = \"8d\"",
            6,
            "is too long: at most 7 days",
        ),
        (
            "",
            "[providers.sms.callbacks]\nenabled = true\ndelay_max = \"300000000000y\"",
            20,
            "is too long: at most 7 days",
        ),
        (
            "",
            "[providers.sms.callbacks]\nenabled = true\ndelay_max = \"30h\"",
            20,
            "longer than a fake may wait (at most 24 hours)",
        ),
        (
            "",
            "[providers.line]\nlatency = { kind = \"fixed\", value = \"2d\" }",
            19,
            "longer than a fake may wait",
        ),
        (
            "",
            "[providers.line]\nchannel_token = \"\"",
            19,
            "`channel_token` must not be empty",
        ),
        (
            "recipients = 100",
            "recipients = 100\nrate = 0.0000001\nduration = \"1s\"",
            11,
            "`rate` must be between 0.001 and 1000",
        ),
    ];
    for (from, to, line, fragment) in cases {
        let text = case_text(from, to);
        let err = match parse(&text) {
            Ok(_) => panic!("case {to:?} was accepted"),
            Err(e) => e,
        };
        let shown = err.to_string();
        assert_eq!(err.line, *line, "case {to:?}: {shown}");
        assert!(
            shown.contains(fragment),
            "case {to:?}: {shown:?} lacks {fragment:?}"
        );
    }
}

/// The trickle, repeats, template edits and the orders' SLO: bad values at their key, and the
/// cross-field rules.
#[test]
fn trickle_and_repeat_keys_are_validated() {
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("[load]\n", "[load]\ntrickle = { rate = \"20/h\" }\n", "rate", 10, 20, "invalid rate `20/h`: write a count per unit such as \"20/s\"", None),
        ("[load]\n", "[load]\ntrickle = { rate = \"0/s\" }\n", "rate", 10, 20, "must be greater than 0", None),
        ("[load]\n", "[load]\ntrickle = { rate = \"2000/s\" }\n", "rate", 10, 13, "trickle `rate` must be at most 1000/s", None),
        ("[load]\n", "[load]\ntrickle = { rate = \"20/s\", recipients = 0 }\n", "recipients", 10, 28, "trickle `recipients` must be between 1 and 100", None),
        ("[load]\n", "[load]\ntrickle = { rate = \"20/s\", recipient = 1 }\n", "recipient", 10, 28, "unknown key `recipient`", Some("recipients")),
        ("[load]\n", "[load]\nrepeat = { share = \"5%\", after = \"2s..0ms\" }\n", "after", 10, 34, "range `2s..0ms` starts after it ends", None),
        ("[load]\n", "[load]\nrepeat = { share = 0, after = \"1s\" }\n", "share", 10, 12, "repeat `share` must be greater than 0%", None),
        ("[load]\n", "[load]\nrepeat = { share = \"5%\", after = \"0ms..2m\" }\n", "after", 10, 26, "within 60s", None),
        ("", "[expect]\norder_e2e_p99 = \"2s\"", "order_e2e_p99", 19, 1, "`order_e2e_p99` judges the small orders of `[load] trickle`", None),
        ("[load]\n", "[load]\nbatches = 4\ntemplate_edit = { from_batch = 5 }\n", "from_batch", 11, 19, "`from_batch` must be between 2 and the number of batches (4) (got 5)", None),
        ("[load]\n", "[load]\nbatches = 4\ntemplate_edit = { from_batch = 1 }\n", "from_batch", 11, 19, "an edit needs a batch before it and one after", None),
        ("[load]\n", "[load]\nbatches = 4\ntemplate_edit = { from = 2 }\n", "from", 11, 19, "valid keys here: `from_batch`", None),
    ];
    check_cases(cases);
    let s = parse(&case_text(
        "[load]\n",
        "[load]\nbatches = 4\ntemplate_edit = { from_batch = 3 }\n",
    ))
    .expect("valid");
    let edited: Vec<bool> = (0..4).map(|k| s.load.template_edited(k)).collect();
    assert_eq!(edited, [false, false, true, true]);
    let t = s.load.template_of(true);
    assert_eq!(
        (t.id.as_str(), t.version),
        (s.load.template.id.as_str(), s.load.template.version + 1)
    );
    assert!(
        t.subject.ends_with(" (edited)") && t.sms.ends_with(" (edited)"),
        "{t:?}"
    );
    let s = parse(&case_text(
        "[load]\n",
        "[load]\ntrickle = { rate = \"300/min\" }\nrepeat = { share = \"5%\", after = \"0ms..2s\" }\n",
    ))
    .expect("valid");
    let t = s.load.trickle.expect("trickle");
    assert_eq!((t.per_second, t.recipients), (5.0, 1));
    let r = s.load.repeat.expect("repeat");
    assert_eq!(r.after_max, std::time::Duration::from_secs(2));
}

/// Values that parse but cannot mean what was written are rejected here, not mid-run.
#[test]
fn wrong_values_are_rejected_at_the_boundary() {
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("", "[providers.line]\ntransient = [{ status = 200, rate = 0.1 }]", "status", 19, 16, "a fault's `status` must be an HTTP error between 400 and 599 (got 200)", None),
        ("", "[providers.sms]\npermanent = [\n  { status = 400, rate = 0.1 },\n  { status = 999, rate = 0.1 },\n]", "status", 21, 5, "(got 999)", None),
        ("", "[providers.smtp]\nfaults = [{ stage = \"rcpt\", code = 250, rate = 0.1 }]", "code", 19, 29, "SMTP fault at stage `rcpt` has `code` 250, which is not a negative reply", None),
        ("", "[providers.smtp]\nfaults = [{ stage = \"data\", code = 470, rate = 0.1 }]", "code", 19, 29, "has `code` 470", None),
        ("", "[providers.smtp]\nfaults = [{ stage = \"data_end\", code = 452, enhanced = \"5.3.4\", rate = 0.1 }]", "enhanced", 19, 45, "`enhanced` \"5.3.4\" does not fit `code` 452", None),
        ("", "[providers.line]\nsticky = [{ share = 0.1, attempts = 3, status = 400 }]", "status", 19, 40, "a sticky fault's `status` must be a transient error: 429 or 500-599 (got 400)", None),
        ("", "[providers.sms]\nsticky = [{ share = 0.1, attempts = 0, status = 503 }]", "attempts", 19, 26, "a sticky fault's `attempts` must be at least 1", None),
        ("", "[providers.sms]\nsticky = [\n  { share = \"60%\", attempts = 2, status = 503 },\n  { share = \"50%\", attempts = 9, status = 500 },\n]", "share", 21, 5, "the `share`s of the sticky faults add up to 1.1 (110%)", None),
        ("", "[providers.line]\nrate_limit = 0.0", "rate_limit", 19, 1, "`rate_limit` must be requests per second greater than 0 (got 0)", None),
        ("", "[providers.sms]\nrate_limit = -5", "rate_limit", 19, 1, "(got -5)", None),
        ("", "[providers.sms.callbacks]\nenabled = true\ndelay_min = \"2s\"\ndelay_max = \"1s\"", "delay_min", 20, 1, "`delay_min` (2s) must be at most `delay_max` (1s)", None),
        ("", "[providers.smtp.events]\ndelay_max = \"10ms\"", "delay_max", 19, 1, "`delay_min` (50ms) must be at most `delay_max` (10ms); the defaults are 50ms and 500ms", None),
        ("", "[providers.sms.callbacks]\nenabled = true\ndeferred_rate = \"10%\"", "deferred_rate", 20, 1, "`deferred_rate` is about e-mail delivery events: write it under [providers.smtp.events]", None),
        ("", "[providers.sms.callbacks]\nprocessed = true", "processed", 19, 1, "`processed` is about e-mail delivery events", None),
        ("", "[providers.line]\ntransient = [\n  { status = 500, rate = \"80%\" },\n  { status = 503, rate = \"80%\" },\n]", "rate", 21, 19, "the `rate`s of the faults in `transient` add up to 1.6 (160%)", None),
        ("", "[providers.smtp]\nfaults = [\n  { stage = \"rcpt\", code = 451, rate = 0.6 },\n  { stage = \"data\", code = 554, rate = 0.6 },\n  { stage = \"rcpt\", code = 550, rate = 0.5 },\n]", "rate", 22, 33, "SMTP faults at stage `rcpt` add up to 1.1 (110%)", None),
        ("lease = \"2s\"", "shutdown_grace = \"0s\"\nlease = \"2s\"", "shutdown_grace", 6, 1, "`shutdown_grace` must be greater than 0", None),
        ("", "[load.template]\nsubject = \"Order {{ordr_id}} {{#broken\"", "subject", 19, 1, "template `subject` at 1:7: `{{ordr_id}}` uses unknown variable `ordr_id`; every recipient has `id`, `name`, `order_id`, `item`, `total`", Some("order_id")),
        ("", "[load.template]\ntext = \"Hi {{name}} {{#item}}\"", "text", 19, 1, "template `text` at 1:13: `{{#item}}`: sections are not supported; a template holds escaped variables such as `{{order_id}}` and comments only", None),
        ("", "[stack.external]\napi = [\"a\"]\nworker = [\"w\"]\nmigrate = [\"m\"]\n[load.template]\ntext = \"Hi {{name}} {{#item}}\"", "text", 23, 1, "template `text` at 1:13: `{{#item}}` is never closed: add `{{/item}}`", None),
        ("", "[load.template]\nsms = \"Order {{order_id}\"", "sms", 19, 1, "template `sms` at 1:7: tag `{{order_id}` is never closed", None),
        ("", "[load.template]\nline = \"Hi {{{name}}}\"", "line", 19, 1, "inserts recipient data unescaped", None),
        // The built-in stack renders bare variable names only (ting-template's subset).
        ("", "[load.template]\nsms = \"Hi {{name.first}}\"", "sms", 19, 1, "template `sms` at 1:4: `{{name.first}}`: `name` is text, so `name.first` finds nothing; a template holds bare variable names only", None),
        ("", "[load.template]\ntext = \"Hi {{this}}\"", "text", 19, 1, "template `text` at 1:4: `{{this}}`: `this` is a context path", None),
        ("", "[load.template]\nhtml = \"{{@index}}\"", "html", 19, 1, "template `html` at 1:1: `{{@index}}`: `@index` is a data variable", None),
        ("", "[load.template]\nsubject = \"{{42}}\"", "subject", 19, 1, "template `subject` at 1:1: `{{42}}`: `42` is a literal", None),
        ("", "[load.template]\nline = \"Hi \\\\{{name}}\"", "line", 19, 1, "template `line` at 1:4: `\\{{name}}`: escaped mustaches `\\{{` are not supported", None),
        ("", "[load.template]\nsms = \"\"", "sms", 19, 1, "template `sms` must not be empty: channel `sms` sends it", None),
        // An external stack's `env` may not replace what the harness sets from the run.
        ("", "[stack.external]\napi = [\"a\"]\nworker = [\"w\"]\nmigrate = [\"m\"]\nenv = { TING_MAX_ATTEMPTS = \"99\" }", "TING_MAX_ATTEMPTS", 22, 9, "`env` may not set `TING_MAX_ATTEMPTS`: the harness sets it from the run", None),
        ("", "[database]\nurl = \"mysql://u:secret@h/db\"", "url", 19, 1, "`url` must be a PostgreSQL URL (`postgres://…` or `postgresql://…`), not `mysql://…`", None),
        ("", "[database]\nurl = \"localhost:5432\"", "url", 19, 1, "`url` must be a PostgreSQL URL such as", None),
        ("", "[database]\nurl = \"postgres://u:secret@h:99999/db\"", "url", 19, 1, "`url` is not a URL PostgreSQL can be reached at: invalid port number", None),
        ("[stack]\n", "[stack.external]\napi = [\"a\"]\nworker = [\"w\"]\nmigrate = [\"m\"]\ncwd = \"no-such-dir-ting\"\n[stack]\n", "cwd", 8, 1, "`cwd` ./no-such-dir-ting is not a directory (relative paths start at the scenario's folder)", None),
    ];
    check_cases(cases);
    // The URL may hold a password: it is not echoed.
    let err = parse(&case_text(
        "",
        "[database]\nurl = \"mysql://u:secret@h/db\"",
    ))
    .unwrap_err();
    assert!(!err.to_string().contains("secret"), "{err}");
}

#[test]
fn good_variants_pass() {
    for (from, to) in [
        // Unescaped slots are the flaw's business on the built-in stack.
        ("heartbeat = \"500ms\"\n", "heartbeat = \"500ms\"\nflaws = [\"unescaped-template\"]\n[load.template]\nline = \"Hi {{{name}}}\"\n"),
        ("", "[providers.line]\ntransient = [{ status = 500, rate = \"60%\" }, { status = 429, rate = \"40%\" }]\npermanent = [{ status = 400, rate = \"50%\" }]\nrate_limit = 50"),
        ("", "[providers.smtp]\nfaults = [{ stage = \"rcpt\", code = 451, enhanced = \"4.3.0\", rate = 0.5 }, { stage = \"data_end\", code = 554, rate = 0.5 }, { stage = \"greeting\", code = 421, rate = 0.5 }]"),
        ("", "[database]\nurl = \"postgresql://u@127.0.0.1:5432/postgres\""),
        ("", "[load.template]\nsubject = \"{{item}} {{ order_id }} {{! note }}\""),
        ("", "[load.template]\nhtml = \"{{!-- {{#each}} --}}<p>{{ name }} 🚀</p>\""),
        // An external stack may take full Mustache.
        ("", "[stack.external]\napi = [\"a\"]\nworker = [\"w\"]\nmigrate = [\"m\"]\n[load.template]\nsubject = \"{{#if item}}{{item}}{{else}}order{{/if}} {{! note }}\""),
        ("[stack]\n", "[stack.external]\napi = [\"a\"]\nworker = [\"w\"]\nmigrate = [\"m\"]\ncwd = \"tests\"\n[stack]\n"),
    ] {
        let text = case_text(from, to);
        // `cwd` resolves against the scenario's folder: the crate root here.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("case.toml");
        if let Err(e) = scenario::parse(&path, &text) {
            panic!("{to:?} was rejected: {e}");
        }
    }
}

/// `run --workers N` goes through the same cross-field rules as the file's own value.
#[test]
fn workers_override_is_validated_like_the_file() {
    let one = scenario::Overrides {
        workers: Some(1),
        ..Default::default()
    };
    let err = scenario::parse_with(Path::new("case.toml"), BASE, &one).unwrap_err();
    assert_eq!(
        err.to_string(),
        "[[chaos]] #1: `target` worker 2 does not exist: workers are numbered 1..=1 \
         (`--workers 1` replaces [stack].workers) at case.toml:16:1"
    );
    let two = scenario::Overrides {
        workers: Some(2),
        ..Default::default()
    };
    let s = scenario::parse_with(Path::new("case.toml"), BASE, &two).expect("valid");
    assert_eq!(s.stack.workers, 2);
    let zero = scenario::Overrides {
        workers: Some(0),
        ..Default::default()
    };
    let err = scenario::parse_with(Path::new("case.toml"), BASE, &zero).unwrap_err();
    assert!(
        err.to_string()
            .contains("--workers must be between 1 and 64"),
        "{err}"
    );
}

/// `--database-url` / `DATABASE_URL` put the run's database on a server, like `[database].url`:
/// a `db_restart` step is refused at the step, naming what put it there.
#[test]
fn db_restart_is_refused_when_the_command_line_names_a_server() {
    let text = with(
        "action = \"sigkill\"\ntarget = 2\n",
        "action = \"db_restart\"\n",
    );
    for given in ["--database-url", "DATABASE_URL"] {
        let o = scenario::Overrides {
            database_server: Some(given),
            ..Default::default()
        };
        let err = scenario::parse_with(Path::new("case.toml"), &text, &o).unwrap_err();
        assert_eq!((err.line, err.col), (15, 1), "{err}");
        assert!(
            err.to_string().contains(&format!(
                "`db_restart` restarts the run's throwaway PostgreSQL cluster, but {given} puts"
            )),
            "{err}"
        );
    }
    // Other database actions work on a server.
    let text = with(
        "action = \"sigkill\"\ntarget = 2\n",
        "action = \"db_terminate\"\n",
    );
    let o = scenario::Overrides {
        database_server: Some("DATABASE_URL"),
        ..Default::default()
    };
    scenario::parse_with(Path::new("case.toml"), &text, &o).expect("db_terminate is fine");
}

/// The same through the binary: `run --workers 1` stops before starting anything.
#[test]
fn run_with_too_few_workers_for_a_chaos_target_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("w.toml");
    std::fs::write(&file, BASE).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ting-chaos"))
        .arg("run")
        .arg(&file)
        .args(["--workers", "1", "--report-dir"])
        .arg(dir.path().join("reports"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "`target` worker 2 does not exist: workers are numbered 1..=1 (`--workers 1` replaces \
             [stack].workers) at {}:16:1",
            file.display()
        )),
        "{stderr}"
    );
    assert!(!dir.path().join("reports").exists(), "nothing was run");
}

/// The template variables validation allows are exactly the ones the load generator writes.
#[test]
fn template_variables_match_the_load_generator() {
    let people = ting_chaos_harness::load::recipients::generate(7, 5, 0.5);
    for r in &people {
        let mut have: Vec<&str> = r.vars.keys().map(String::as_str).collect();
        have.extend(["id", "name"]);
        have.sort_unstable();
        let mut want = scenario::TEMPLATE_VARS.to_vec();
        want.sort_unstable();
        assert_eq!(have, want);
    }
}

/// Errors name the file as it was given, so two `x.toml` in different folders differ.
#[test]
fn errors_name_the_path_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let mut shown = Vec::new();
    for sub in ["a", "b"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
        let path = dir.path().join(sub).join("x.toml");
        std::fs::write(&path, with("workers = 4", "workers = 0")).unwrap();
        let err = scenario::load(&path).unwrap_err();
        assert_eq!(err.file, path.display().to_string());
        assert!(
            err.to_string().contains(&format!("{}:5:1", path.display())),
            "{err}"
        );
        shown.push(err.to_string());
    }
    assert_ne!(shown[0], shown[1]);
}

/// `ting-chaos validate`: 0 when every file is valid, 2 with each bad file's error otherwise.
#[test]
fn validate_subcommand_exit_codes_and_messages() {
    let bin = env!("CARGO_BIN_EXE_ting-chaos");
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&good, BASE).unwrap();
    std::fs::write(&bad, with("workers = 4", "worker = 4")).unwrap();

    let out = std::process::Command::new(bin)
        .arg("validate")
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("ok: {} (t)\n", good.display())
    );

    let out = std::process::Command::new(bin)
        .arg("validate")
        .arg(&good)
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("ok: {} (t)\n", good.display())
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "error: unknown key `worker` in [stack] at {}:5:1 — did you mean `workers`?\n",
            bad.display()
        )),
        "{stderr}"
    );

    let missing = dir.path().join("missing.toml");
    let out = std::process::Command::new(bin)
        .arg("validate")
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read scenario"));
}

/// The sample error in the README is what `validate` really prints for that typo.
#[test]
fn readme_sample_error_is_real() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = std::fs::read_to_string(root.join("scenarios/restart-midway.toml")).unwrap();
    assert!(shipped.contains("\nworkers = "));
    let typo = shipped.replacen("\nworkers = ", "\nworker = ", 1);
    let err = scenario::parse(Path::new("scenarios/restart-midway.toml"), &typo).unwrap_err();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let line = format!("error: {err}");
    assert!(
        readme.contains(&line),
        "README.md should show the real message:\n{line}"
    );
}

#[test]
fn issue_example_message_is_exact() {
    let err = parse(&with("workers = 4", "worker = 4")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown key `worker` in [stack] at case.toml:5:1 — did you mean `workers`?"
    );
}

#[test]
fn shipped_scenarios_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 1, "no scenarios found in {}", dir.display());
}

#[test]
fn committed_schema_is_in_sync_with_the_types() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/scenario.schema.json");
    let want = serde_json::to_string_pretty(&scenario::json_schema()).unwrap() + "\n";
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if std::env::var_os("UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    assert!(
        have == want,
        "{} is out of date: run `UPDATE_SCHEMAS=1 cargo test --test scenario_validation` and commit it",
        path.display()
    );
}

fn set(flags: &[&str]) -> scenario::Overrides {
    scenario::Overrides {
        set: flags.iter().map(|f| f.to_string()).collect(),
        ..Default::default()
    }
}

/// `--set key=value` writes into the scenario before validation: values are TOML or, when they
/// do not parse as TOML, strings; new tables and array elements are reached by path.
#[test]
fn set_overrides_any_key_before_validation() {
    let o = set(&[
        "load.recipients=200",
        "stack.workers=2",
        "stack.lease=3s",
        "stack.email_unknown_policy=resend",
        "load.channels=[\"email\"]",
        "chaos[0].target=\"busiest\"",
        "expect.max_unknown=3",
        "providers.line.latency={ kind = \"fixed\", value = \"5ms\" }",
    ]);
    let s = scenario::parse_with(Path::new("case.toml"), BASE, &o).expect("valid");
    assert_eq!(s.load.recipients, 200);
    assert_eq!(s.stack.workers, 2);
    assert_eq!(s.stack.lease, std::time::Duration::from_secs(3));
    assert_eq!(s.stack.email_unknown_policy, UnknownPolicy::Resend);
    assert_eq!(s.load.channels, [scenario::Channel::Email]);
    assert_eq!(s.chaos[0].target, Target::Busiest);
    assert_eq!(s.expect.max_unknown, 3);
    // A later flag wins.
    let o = set(&["load.recipients=5", "load.recipients=6"]);
    let s = scenario::parse_with(Path::new("case.toml"), BASE, &o).expect("valid");
    assert_eq!(s.load.recipients, 6);
}

/// An error about an overridden key names the flag; an error elsewhere keeps the file's own
/// line and column even though the overrides rewrote the text.
#[test]
fn set_errors_name_the_flag_and_the_key() {
    let err = |flags: &[&str]| {
        scenario::parse_with(Path::new("case.toml"), BASE, &set(flags))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(&["stack.workers=0"]),
        "--set stack.workers=0: `workers` must be between 1 and 64 (got 0)"
    );
    assert_eq!(
        err(&["stack.wrkers=2"]),
        "--set stack.wrkers=2: unknown key `wrkers` in [stack] — did you mean `workers`?"
    );
    assert!(
        err(&["load.recipients=lots"])
            .starts_with("--set load.recipients=lots: bad value for `recipients` in [load]"),
        "{}",
        err(&["load.recipients=lots"])
    );
    // A value followed by more TOML is not the value with the rest dropped: it is refused whole.
    assert!(
        err(&["load.recipients=200\nseed = 5"]).starts_with(
            "--set load.recipients=200\nseed = 5: bad value for `recipients` in [load]"
        ),
        "{}",
        err(&["load.recipients=200\nseed = 5"])
    );
    // A number TOML cannot hold is out of range, not a string to write "without quotes".
    assert_eq!(
        err(&["seed=18446744073709551615"]),
        "--set seed=18446744073709551615: `18446744073709551615` is out of range: whole numbers go \
         up to 9223372036854775807 (TOML's integers)"
    );
    assert_eq!(
        err(&["load.recipients.x=1"]),
        "--set load.recipients.x=1: `load.recipients` is not a table"
    );
    assert_eq!(
        err(&["chaos[3].target=1"]),
        "--set chaos[3].target=1: `chaos` has 1 elements; there is no `chaos[3]`"
    );
    assert_eq!(
        err(&["load.recipients"]),
        "--set load.recipients: --set takes KEY=VALUE, e.g. --set load.recipients=200"
    );
    assert!(err(&["a..b=1"]).starts_with("--set a..b=1: `a..b` is not a key path"));
    // A cross-field rule that the flag breaks elsewhere in the file: placed in the file, and the
    // flag named as the cause.
    assert_eq!(
        err(&["stack.workers=1"]),
        "[[chaos]] #1: `target` worker 2 does not exist: workers are numbered 1..=1 \
         (`--set stack.workers=1` replaces [stack].workers) at case.toml:16:1"
    );
    // An error of the file's own, unrelated to the flag: the file's position, not the rewritten
    // text's.
    let text = with("lease = \"2s\"", "lease = \"2 parsecs\"");
    let e = scenario::parse_with(Path::new("case.toml"), &text, &set(&["load.recipients=7"]))
        .unwrap_err();
    let plain = scenario::parse(Path::new("case.toml"), &text).unwrap_err();
    assert_eq!((e.line, e.col), (plain.line, plain.col), "{e}");
    assert_eq!(e.to_string(), plain.to_string());
}

const STACK: &str = r#"[stack.external]
migrate = ["./bin/migrate"]
api = ["./bin/api"]
worker = ["./bin/worker"]
env = { RUST_LOG = "info" }
"#;

/// `--stack FILE` replaces the scenario's stack with FILE's `[stack.external]`; `cwd` is relative
/// to FILE (its folder when absent); the scenario's own tunables stay.
#[test]
fn stack_file_replaces_the_stack_with_paths_relative_to_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("mine/code")).unwrap();
    let file = dir.path().join("mine/stack.toml");
    std::fs::write(&file, STACK).unwrap();
    let o = scenario::Overrides {
        stack: Some(file.clone()),
        ..Default::default()
    };
    let s = scenario::parse_with(Path::new("scenarios/x.toml"), BASE, &o).expect("valid");
    assert_eq!(s.stack.kind, scenario::StackKind::External);
    let x = s.stack.external.as_ref().unwrap();
    assert_eq!(x.api, ["./bin/api"]);
    assert_eq!(x.env["RUST_LOG"], "info");
    assert_eq!(
        x.cwd.canonicalize().unwrap(),
        dir.path().join("mine").canonicalize().unwrap()
    );
    assert_eq!(s.stack.workers, 4);
    assert_eq!(s.stack.lease, std::time::Duration::from_secs(2));

    std::fs::write(&file, format!("{STACK}cwd = \"code\"\n")).unwrap();
    let s = scenario::parse_with(Path::new("scenarios/x.toml"), BASE, &o).expect("valid");
    let cwd = &s.stack.external.as_ref().unwrap().cwd;
    assert_eq!(
        cwd.canonicalize().unwrap(),
        dir.path().join("mine/code").canonicalize().unwrap()
    );
}

/// Errors in a `--stack` file are placed in that file; anything but `[stack.external]` in it is
/// refused.
#[test]
fn stack_file_errors_point_into_that_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("stack.toml");
    let o = scenario::Overrides {
        stack: Some(file.clone()),
        ..Default::default()
    };
    let name = file.display().to_string();
    let err = |text: &str| {
        std::fs::write(&file, text).unwrap();
        scenario::parse_with(Path::new("case.toml"), BASE, &o)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(&STACK.replace("api = ", "apii = ")),
        format!("unknown key `apii` in [stack.external] at {name}:3:1 — did you mean `api`?")
    );
    assert_eq!(
        err(&STACK.replace("api = [\"./bin/api\"]", "api = []")),
        format!(
            "`api` must be a command as an argv array, e.g. api = [\"./bin/api\"] at {name}:3:1"
        )
    );
    assert!(
        err(&format!("{STACK}cwd = \"nowhere\"\n")).contains(&format!("at {name}:6:1")),
        "{}",
        err(&format!("{STACK}cwd = \"nowhere\"\n"))
    );
    assert_eq!(
        err(&format!("[stack]\nworkers = 2\n{STACK}")),
        format!(
            "a --stack file holds only a [stack.external] table; `stack.workers` belongs in the \
             scenario (or use --set) at {name}:2:1"
        )
    );
    assert_eq!(
        err("seed = 1\n"),
        format!(
            "a --stack file holds only a [stack.external] table; `seed` belongs in the scenario \
             (or use --set) at {name}:1:1"
        )
    );
    assert!(
        err("[stack\n").contains("invalid TOML"),
        "{}",
        err("[stack\n")
    );
    std::fs::remove_file(&file).unwrap();
    let e = scenario::parse_with(Path::new("case.toml"), BASE, &o).unwrap_err();
    assert!(e.to_string().contains("cannot read --stack file"), "{e}");
    // The built-in stack's flaws do not apply to an external one.
    std::fs::write(&file, STACK).unwrap();
    let flawed = with("workers = 4", "workers = 4\nflaws = [\"racy-claim\"]");
    let e = scenario::parse_with(Path::new("case.toml"), &flawed, &o).unwrap_err();
    assert!(
        e.to_string()
            .contains("`flaws` only applies to the built-in stack"),
        "{e}"
    );
}

/// `validate`, `run` and `sweep` take `--stack` and `--set`; a bad one is a usage error (exit 2)
/// naming the flag.
#[test]
fn override_flags_on_every_subcommand() {
    let bin = env!("CARGO_BIN_EXE_ting-chaos");
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, BASE).unwrap();
    let stack = dir.path().join("stack.toml");
    std::fs::write(&stack, STACK).unwrap();
    let out = std::process::Command::new(bin)
        .args(["validate", "--set", "load.recipients=5", "--stack"])
        .arg(&stack)
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    for sub in [&["run"][..], &["sweep", "--seeds", "1"]] {
        let out = std::process::Command::new(bin)
            .args(sub)
            .arg(&good)
            .args(["--set", "stack.workers=0", "--report-dir"])
            .arg(dir.path().join("reports"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{sub:?}: {stderr}");
        assert!(
            stderr.contains("error: --set stack.workers=0: `workers` must be between 1 and 64"),
            "{sub:?}: {stderr}"
        );
    }
    let out = std::process::Command::new(bin)
        .args(["validate", "--set", "stack.workers=0"])
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--set stack.workers=0:"));
}

/// The corpus of broken scenarios in `tests/fixtures/bad/` — one mistake each, the fragment its
/// error must contain on the file's first line (`# expect: …`): every one is refused, placed at
/// `file:line:col`, in words a user can act on; and `validate` over all of them exits 2 naming
/// each file. Add a file here for every mistake a user reports getting a poor message for.
#[test]
fn every_file_in_the_broken_corpus_is_refused_at_its_place() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 50, "only {} broken files", files.len());
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let first = String::from_utf8_lossy(&bytes);
        let expect = first
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} lacks its `# expect: …` line", f.display()));
        let err = match scenario::load(f) {
            Ok(_) => panic!("{} was accepted", f.display()),
            Err(e) => e,
        };
        let shown = err.to_string();
        assert!(
            err.line > 0 && err.col > 0,
            "{}: no position: {shown}",
            f.display()
        );
        let place = format!("{}:{}:{}", f.display(), err.line, err.col);
        assert!(shown.contains(&place), "{shown} does not say {place}");
        assert!(
            shown.contains(expect),
            "{}: {shown:?} lacks {expect:?}",
            f.display()
        );
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ting-chaos"))
        .arg("validate")
        .args(&files)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for f in &files {
        assert!(
            stderr.contains(&format!("{}:", f.display())),
            "{} not named: {stderr}",
            f.display()
        );
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The database-link actions at their edges: the smallest cap, the longest delay, a partition
/// of every link.
#[test]
fn database_link_actions_parse_into_their_faults() {
    use std::time::Duration;
    use ting_chaos_harness::scenario::{ChaosAction, DbLinkFault};
    #[rustfmt::skip]
    let cases: &[(&str, ChaosAction, DbLinkFault, Target)] = &[
        ("action = \"db_partition\"\nfor = \"8s\"\ntarget = \"all\"", ChaosAction::DbPartition, DbLinkFault::Partition, Target::All),
        ("action = \"db_reset\"\ntarget = \"busiest\"", ChaosAction::DbReset, DbLinkFault::Reset, Target::Busiest),
        ("action = \"db_latency\"\nfor = \"1s\"\ndelay = \"1m\"\ntarget = 3", ChaosAction::DbLatency, DbLinkFault::Latency { delay: Duration::from_secs(60), jitter: Duration::ZERO }, Target::Worker(3)),
        ("action = \"db_latency\"\nfor = \"1s\"\ndelay = \"5ms\"\njitter = \"2ms\"\ntarget = 1", ChaosAction::DbLatency, DbLinkFault::Latency { delay: Duration::from_millis(5), jitter: Duration::from_millis(2) }, Target::Worker(1)),
        ("action = \"db_bandwidth\"\nfor = \"1s\"\nbytes_per_s = 1\ntarget = 1", ChaosAction::DbBandwidth, DbLinkFault::Bandwidth { bytes_per_s: 1 }, Target::Worker(1)),
    ];
    for (to, action, fault, target) in cases {
        let text = with("action = \"sigkill\"\ntarget = 2", to);
        let s = parse(&text).unwrap_or_else(|e| panic!("{to:?}: {e}"));
        let step = &s.chaos[0];
        assert_eq!(step.action, *action, "{to:?}");
        assert_eq!(step.db_link, Some(*fault), "{to:?}");
        assert_eq!(&step.target, target, "{to:?}");
    }
    let plain = parse(BASE).unwrap();
    assert_eq!(plain.chaos[0].db_link, None);
}
