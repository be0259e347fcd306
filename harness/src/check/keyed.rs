//! Items found by a (provider, text) key — a delivery's address or a message id on one channel —
//! among the hundreds of thousands a big run judges: the checkers' one lookup structure.
//!
//! A list sorted by the key's 64-bit hash, then by the key itself, and searched on the hashes
//! alone (one contiguous array of numbers); the texts are compared only among equal hashes.
//! 16 bytes an item, where a map of a list per key took ~100; and a lookup reads a few cache
//! lines, where a binary search comparing texts followed two pointers at every step (judging
//! 300,000 deliveries took twice as long that way). The sort is stable: the items of one key
//! keep the order they were given in.

use std::hash::{DefaultHasher, Hash, Hasher};

use mock_providers::ledger::Provider;

/// What an item is found by.
pub type Key<'t> = (Provider, &'t str);

/// Items of type `T`, grouped and found by their [`Key`].
pub struct Keyed<'a, T> {
    /// The key's hash of each item, ascending.
    hashes: Vec<u64>,
    /// The items, in the order of `hashes`; among equal hashes by key, then as given.
    items: Vec<&'a T>,
    key: fn(&T) -> Key<'_>,
}

/// The key's hash: the same for the same key in every run (no random seed).
fn hash(key: Key<'_>) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

impl<'a, T> Keyed<'a, T> {
    /// Indexes `items` by `key`; the items of one key keep the order they come in.
    pub fn new(items: impl IntoIterator<Item = &'a T>, key: fn(&T) -> Key<'_>) -> Keyed<'a, T> {
        let mut hashed: Vec<(u64, &'a T)> = items
            .into_iter()
            .map(|item| (hash(key(item)), item))
            .collect();
        hashed.sort_by(|(ha, a), (hb, b)| ha.cmp(hb).then_with(|| key(a).cmp(&key(b))));
        let (hashes, items) = hashed.into_iter().unzip();
        Keyed { hashes, items, key }
    }

    /// The items of `key`, in the order they were given.
    pub fn group(&self, key: Key<'_>) -> &[&'a T] {
        let h = hash(key);
        let start = self.hashes.partition_point(|x| *x < h);
        let len = self.hashes[start..].partition_point(|x| *x == h);
        // Equal hashes: almost always one key; the items are sorted by key among them.
        let same = &self.items[start..start + len];
        let from = same.partition_point(|item| (self.key)(item) < key);
        let rest = &same[from..];
        &rest[..rest.partition_point(|item| (self.key)(item) == key)]
    }

    /// The first item given of `key`.
    pub fn first(&self, key: Key<'_>) -> Option<&'a T> {
        self.group(key).first().copied()
    }

    /// The last item given of `key`.
    pub fn last(&self, key: Key<'_>) -> Option<&'a T> {
        self.group(key).last().copied()
    }

    /// Every key with its items, in no meaningful order (by hash).
    pub fn groups(&self) -> impl Iterator<Item = (Key<'a>, &[&'a T])> + '_ {
        self.items
            .chunk_by(|a, b| (self.key)(a) == (self.key)(b))
            .map(|group| ((self.key)(group[0]), group))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Item {
        provider: Provider,
        text: String,
        n: u32,
    }

    fn item(provider: Provider, text: &str, n: u32) -> Item {
        Item {
            provider,
            text: text.into(),
            n,
        }
    }

    fn key(i: &Item) -> Key<'_> {
        (i.provider, &i.text)
    }

    /// A key's items in the order given, only its own provider's and text's; every key once;
    /// a key no item has finds nothing.
    #[test]
    fn items_are_found_by_their_key_in_the_order_given() {
        let items = [
            item(Provider::Sms, "+1", 0),
            item(Provider::Line, "+1", 1),
            item(Provider::Sms, "+2", 2),
            item(Provider::Sms, "+1", 3),
            item(Provider::Sms, "+1", 4),
        ];
        let keyed = Keyed::new(&items, key);
        let ns = |p, t: &str| -> Vec<u32> { keyed.group((p, t)).iter().map(|i| i.n).collect() };
        assert_eq!(ns(Provider::Sms, "+1"), [0, 3, 4]);
        assert_eq!(ns(Provider::Line, "+1"), [1]);
        assert_eq!(ns(Provider::Sms, "+2"), [2]);
        assert!(ns(Provider::Smtp, "+1").is_empty());
        assert!(ns(Provider::Sms, "+3").is_empty());
        assert_eq!(keyed.last((Provider::Sms, "+1")).map(|i| i.n), Some(4));
        assert!(keyed.last((Provider::Sms, "")).is_none());
        let mut groups: Vec<(Key, usize)> = keyed.groups().map(|(k, g)| (k, g.len())).collect();
        groups.sort();
        assert_eq!(
            groups,
            [
                ((Provider::Line, "+1"), 1),
                ((Provider::Sms, "+1"), 3),
                ((Provider::Sms, "+2"), 1)
            ]
        );
        let none: [Item; 0] = [];
        assert!(Keyed::new(&none, key)
            .group((Provider::Sms, "+1"))
            .is_empty());
    }

    /// Thousands of keys, each found whole: the search on hashes then texts misses none.
    #[test]
    fn every_key_of_many_is_found_whole() {
        let items: Vec<Item> = (0..20_000)
            .map(|n| item(Provider::Smtp, &format!("r{}@x", n % 7_000), n))
            .collect();
        let keyed = Keyed::new(&items, key);
        for r in 0..7_000u32 {
            let text = format!("r{r}@x");
            let got: Vec<u32> = keyed
                .group((Provider::Smtp, &text))
                .iter()
                .map(|i| i.n)
                .collect();
            let want: Vec<u32> = (0..20_000).filter(|n| n % 7_000 == r).collect();
            assert_eq!(got, want, "{text}");
        }
        assert_eq!(keyed.groups().count(), 7_000);
    }
}
