//! Seeded recipient data: addresses per channel, names (a share of them hostile to templates),
//! template variables, and which deliveries the providers will reject for good.

use mock_providers::config::ProvidersConfig;
use mock_providers::faults;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::check::{Expected, Name};
use crate::scenario::{Channel, Scenario};

/// One recipient as enqueued (the contract's `recipients[]` item).
#[derive(Debug, Clone, Serialize)]
pub struct Recipient {
    pub id: String,
    pub name: String,
    pub line_user_id: String,
    pub email: String,
    pub phone: String,
    pub vars: serde_json::Map<String, serde_json::Value>,
    #[serde(skip)]
    pub tricky: bool,
}

impl Recipient {
    pub fn address(&self, channel: Channel) -> &str {
        match channel {
            Channel::Line => &self.line_user_id,
            Channel::Email => &self.email,
            Channel::Sms => &self.phone,
        }
    }
}

const NAMES: &[&str] = &[
    "Ana", "Ben", "Chloé", "Dmitri", "Emi", "Farah", "Gus", "Hana", "Ivo", "Jun", "Kofi", "Lena",
    "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tomoko",
];

/// Names that break a template that does not escape: markup, entities, quotes, scripts, and text
/// outside ASCII.
const TRICKY: &[&str] = &[
    "<b>Ana</b> & Co",
    "Ben <script>alert('x')</script>",
    "山田 \"Taro\" <i>太郎</i>",
    "O'Brien & Sons <3",
    "Zoë &amp; Émile",
    "<img src=x onerror=alert(1)>",
    "Ngọc Ánh 🚀 <u>VIP</u>",
];

/// The address no recipient has: hostile data asks for a copy to it, so any message to it (in the
/// envelope or a `To`/`Cc`/`Bcc` header) is an injected recipient.
pub const INJECTED_ADDRESS: &str = "attacker@injected.invalid";
/// The header name only hostile data spells: a message carrying it had a header injected.
pub const INJECTED_HEADER: &str = "X-Ting-Injected";

/// Names that break a stack that copies data into headers or trusts it to be short and printable:
/// CR/LF followed by a header (into a Subject or a display name), a NUL, right-to-left and other
/// invisible formatting marks, and a name far longer than any header line should be.
fn hostile_names() -> Vec<String> {
    vec![
        format!("Ana\r\nBcc: {INJECTED_ADDRESS}"),
        format!("Ben\r\n{INJECTED_HEADER}: name"),
        format!("Chloé\nBcc: {INJECTED_ADDRESS}\n{INJECTED_HEADER}: lf"),
        "Dmitri\0Null".to_string(),
        "Emi \u{202E}gnp.exe\u{202C} \u{200F}مرحبا\u{200E}".to_string(),
        format!(
            "Farah {}",
            "Wolfeschlegelsteinhausenberger ".repeat(8).trim_end()
        ),
    ]
}

/// Template variables of a hostile recipient: the same tricks in `item`.
fn hostile_items() -> Vec<String> {
    vec![
        format!("Tea set\r\n{INJECTED_HEADER}: item"),
        "Rice\0cooker".to_string(),
        "Umbrella \u{202E}321\u{202C}".to_string(),
        format!("Coffee {}", "beans, ".repeat(40).trim_end()),
    ]
}

const ITEMS: &[&str] = &[
    "Coffee beans 1kg",
    "Tea set",
    "Rice cooker",
    "Umbrella",
    "Notebook ×3",
];

/// Everyone a run of `scenario` may enqueue: the batches' recipients, then the trickle's orders'
/// (as many as it can send before the quiescence deadline), from one seeded sequence. The run and
/// the checkers that need a recipient's data (the subject a template renders) read the same list.
pub fn of_run(scenario: &crate::scenario::Scenario) -> Vec<Recipient> {
    of_run_each(scenario).collect()
}

/// [`of_run`] one recipient at a time, for a reader that keeps a little of each.
pub fn of_run_each(scenario: &crate::scenario::Scenario) -> impl Iterator<Item = Recipient> {
    let trickle = scenario.load.trickle.as_ref().map_or(0, |t| {
        t.max_orders(scenario.expect.quiescence) * t.recipients
    });
    each(
        scenario.seed,
        scenario.load.recipients + trickle,
        scenario.load.tricky_names,
    )
}

/// Builds `n` recipients from `seed`: the same seed gives the same people.
pub fn generate(seed: u64, n: u32, tricky_share: f64) -> Vec<Recipient> {
    each(seed, n, tricky_share).collect()
}

/// [`generate`] one recipient at a time.
fn each(seed: u64, n: u32, tricky_share: f64) -> impl Iterator<Item = Recipient> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x7469_6e67_6c6f_6164);
    let (names, items) = (hostile_names(), hostile_items());
    (0..n).map(move |i| {
        let id = format!("r{:06}", i + 1);
        let tricky = rng.gen_bool(tricky_share.clamp(0.0, 1.0));
        // Half the tricky recipients carry markup, half header and control-character tricks.
        let hostile = tricky && rng.gen_bool(0.5);
        let name = if hostile {
            names.choose(&mut rng).unwrap().clone()
        } else if tricky {
            TRICKY.choose(&mut rng).unwrap().to_string()
        } else {
            NAMES.choose(&mut rng).unwrap().to_string()
        };
        let digest = Sha256::digest(format!("{seed}:{id}"));
        let mut vars = serde_json::Map::new();
        vars.insert("order_id".into(), format!("A-{}", 100_000 + i).into());
        let item = if hostile {
            items.choose(&mut rng).unwrap().clone()
        } else {
            ITEMS.choose(&mut rng).unwrap().to_string()
        };
        vars.insert("item".into(), item.into());
        vars.insert(
            "total".into(),
            format!("¥{}", rng.gen_range(500..50_000)).into(),
        );
        Recipient {
            line_user_id: format!("U{}", &hex::encode(digest)[..32]),
            email: email_address(&id, digest[0]),
            phone: format!("+1555{:07}", i + 1),
            id,
            name,
            vars,
            tricky,
        }
    })
}

/// The e-mail address of recipient `id`: most plain, some with a plus-tag (`r000007+orders@…`),
/// some on an internationalised domain in its ASCII form (`xn--bcher-kva.example.test`, as an
/// application stores it after IDNA), picked by a byte of the recipient's digest.
fn email_address(id: &str, pick: u8) -> String {
    match pick % 8 {
        0 => format!("{id}+orders@example.test"),
        1 => format!("{id}@xn--bcher-kva.example.test"),
        2 => format!("{id}+tag.{pick}@xn--fiqs8s.example.test"),
        _ => format!("{id}@example.test"),
    }
}

/// The deliveries the load asks for, with the providers' seeded verdict on each address.
/// `batch_of(i)`: the batch recipient `i` is enqueued in, and whether it is POSTed with the
/// edited template (`[load] template_edit`).
pub fn expected(
    scenario: &Scenario,
    recipients: &[Recipient],
    batch_of: impl Fn(usize) -> (String, bool),
) -> Vec<Expected> {
    let p: &ProvidersConfig = &scenario.providers;
    let mut out = Vec::with_capacity(recipients.len() * scenario.load.channels.len());
    // One copy of a batch id for the batch's deliveries (recipients come in batch order).
    let mut batch: Option<Name> = None;
    for (i, r) in recipients.iter().enumerate() {
        let (batch_id, template_edited) = batch_of(i);
        let batch_id = match batch.take() {
            Some(b) if *b == *batch_id => b,
            _ => Name::from(batch_id),
        };
        batch = Some(batch_id.clone());
        let recipient = Name::from(r.id.as_str());
        let tricky_name = r.tricky.then(|| Name::from(r.name.as_str()));
        for &channel in &scenario.load.channels {
            let rate = match channel {
                Channel::Line => p.line.bad_addresses,
                Channel::Email => p.smtp.bad_addresses,
                Channel::Sms => p.sms.bad_addresses,
            };
            let address = r.address(channel);
            out.push(Expected {
                recipient: recipient.clone(),
                channel,
                bad: faults::is_bad_address(scenario.seed, channel.provider(), address, rate),
                address: Name::from(address),
                tricky_name: tricky_name.clone(),
                batch_id: batch_id.clone(),
                template_edited,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_people_and_unique_addresses() {
        let a = generate(1, 500, 0.2);
        let b = generate(1, 500, 0.2);
        assert_eq!(
            a.iter()
                .map(|r| (&r.name, &r.line_user_id))
                .collect::<Vec<_>>(),
            b.iter()
                .map(|r| (&r.name, &r.line_user_id))
                .collect::<Vec<_>>()
        );
        let ids: std::collections::HashSet<_> = a.iter().map(|r| &r.line_user_id).collect();
        assert_eq!(ids.len(), 500);
        let tricky = a.iter().filter(|r| r.tricky).count();
        assert!((50..150).contains(&tricky), "tricky {tricky}");
        assert!(a
            .iter()
            .all(|r| r.line_user_id.len() == 33 && r.line_user_id.starts_with('U')));
        let emails: std::collections::HashSet<_> = a.iter().map(|r| &r.email).collect();
        assert_eq!(emails.len(), 500);
    }

    /// Every kind of hostile data and address appears in an ordinary load, seeded.
    #[test]
    fn hostile_data_and_addresses_appear() {
        let a = generate(3, 2000, 0.3);
        let has = |f: &dyn Fn(&Recipient) -> bool| a.iter().any(f);
        assert!(has(&|r| r.name.contains("\r\nBcc: ")));
        assert!(has(&|r| r.name.contains(INJECTED_HEADER)));
        assert!(has(&|r| r.name.contains('\0')));
        assert!(has(&|r| r.name.contains('\u{202E}')));
        assert!(has(&|r| r.name.chars().count() > 200));
        assert!(has(&|r| r.vars["item"].as_str().unwrap().contains("\r\n")));
        assert!(has(&|r| r.email.contains('+')));
        assert!(has(&|r| r.email.contains("@xn--")));
        assert!(a
            .iter()
            .all(|r| r.email.is_ascii() && r.email.matches('@').count() == 1));
    }
}
