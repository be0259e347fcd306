//! Seeded recipient data: addresses per channel, names (a share of them hostile to templates),
//! template variables, and which deliveries the providers will reject for good.

use mock_providers::config::ProvidersConfig;
use mock_providers::faults;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::check::Expected;
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

const ITEMS: &[&str] = &[
    "Coffee beans 1kg",
    "Tea set",
    "Rice cooker",
    "Umbrella",
    "Notebook ×3",
];

/// Builds `n` recipients from `seed`: the same seed gives the same people.
pub fn generate(seed: u64, n: u32, tricky_share: f64) -> Vec<Recipient> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x7469_6e67_6c6f_6164);
    (0..n)
        .map(|i| {
            let id = format!("r{:06}", i + 1);
            let tricky = rng.gen_bool(tricky_share.clamp(0.0, 1.0));
            let name = if tricky {
                TRICKY.choose(&mut rng).unwrap().to_string()
            } else {
                NAMES.choose(&mut rng).unwrap().to_string()
            };
            let digest = Sha256::digest(format!("{seed}:{id}"));
            let mut vars = serde_json::Map::new();
            vars.insert("order_id".into(), format!("A-{}", 100_000 + i).into());
            vars.insert(
                "item".into(),
                ITEMS.choose(&mut rng).unwrap().to_string().into(),
            );
            vars.insert(
                "total".into(),
                format!("¥{}", rng.gen_range(500..50_000)).into(),
            );
            Recipient {
                line_user_id: format!("U{}", &hex::encode(digest)[..32]),
                email: format!("{id}@example.test"),
                phone: format!("+1555{:07}", i + 1),
                id,
                name,
                vars,
                tricky,
            }
        })
        .collect()
}

/// The deliveries the load asks for, with the providers' seeded verdict on each address.
pub fn expected(
    scenario: &Scenario,
    recipients: &[Recipient],
    batch_of: impl Fn(usize) -> String,
) -> Vec<Expected> {
    let p: &ProvidersConfig = &scenario.providers;
    let mut out = Vec::with_capacity(recipients.len() * scenario.load.channels.len());
    for (i, r) in recipients.iter().enumerate() {
        for &channel in &scenario.load.channels {
            let rate = match channel {
                Channel::Line => p.line.bad_addresses,
                Channel::Email => p.smtp.bad_addresses,
                Channel::Sms => p.sms.bad_addresses,
            };
            let address = r.address(channel).to_string();
            out.push(Expected {
                recipient: r.id.clone(),
                channel,
                bad: faults::is_bad_address(scenario.seed, channel.provider(), &address, rate),
                address,
                tricky_name: r.tricky.then(|| r.name.clone()),
                batch_id: batch_of(i),
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
    }
}
