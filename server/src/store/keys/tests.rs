use super::*;
use crate::store::{InMemoryStore, Store, WriteBatch};

const IDS: [u64; 8] = [0, 1, 2, 255, 256, 257, 65536, u64::MAX];

fn every_key_of(tenant_id: u64) -> Vec<Vec<u8>> {
    vec![
        tenant_record_key(tenant_id),
        intended_item_key(tenant_id, "interface", "eth0"),
        current_item_key(tenant_id, "interface", "eth0"),
        type_spec_key(tenant_id, "interface"),
        event_key(tenant_id, 0, 0),
        event_key(tenant_id, u64::MAX, u32::MAX),
        journal_key(tenant_id, "route", "default"),
        backoff_key(tenant_id, "route", "default"),
    ]
}

#[test]
fn the_schema_version_key_is_the_one_migrations_write() {
    assert_eq!(schema_version_key(), b"\x00schema_version");
    assert_eq!(next_tenant_id_key(), b"\x00next_tenant_id");
}

#[test]
fn item_keys_round_trip_for_every_item_kind() {
    type ItemKeyBuilder = fn(u64, &str, &str) -> Vec<u8>;
    let builders: [ItemKeyBuilder; 4] = [
        intended_item_key,
        current_item_key,
        journal_key,
        backoff_key,
    ];
    for build in builders {
        for (item_type, name) in [
            ("interface", "eth0"),
            ("t", "n"),
            ("vlan", "a b/c\u{e9}"),
            ("x", "with\0nul"),
        ] {
            let key = build(256, item_type, name);
            assert_eq!(
                parse_item_key(&key),
                Some((item_type.to_owned(), name.to_owned()))
            );
        }
    }
}

#[test]
fn other_keys_round_trip() {
    assert_eq!(
        parse_event_key(&event_key(65536, 42, 3)),
        Some((65536, 42, 3))
    );
    assert_eq!(
        parse_type_spec_key(&type_spec_key(7, "route")),
        Some((7, "route".to_owned()))
    );
    assert_eq!(parse_purge_key(&purge_key(65536)), Some(65536));
    assert_eq!(parse_fleet_event_key(&fleet_event_key(9)), Some(9));
    assert_eq!(
        parse_tenant_name_key(&tenant_name_key("acme")),
        Some("acme".to_owned())
    );
    assert_eq!(
        parse_tenant_entry_key(&tenant_entry_key("acme")),
        Some("acme".to_owned())
    );
    let record = tenant_record_key(u64::MAX);
    assert_eq!(
        split_tenant_key(&record),
        Some((u64::MAX, RecordKind::Tenant, &[][..]))
    );
}

#[test]
fn parsers_reject_keys_of_other_kinds() {
    assert_eq!(parse_item_key(&event_key(1, 1, 0)), None);
    assert_eq!(parse_item_key(&type_spec_key(1, "t")), None);
    assert_eq!(parse_item_key(&tenant_record_key(1)), None);
    assert_eq!(parse_item_key(schema_version_key()), None);
    assert_eq!(parse_item_key(&intended_items_prefix(1)), None);
    assert_eq!(parse_event_key(&intended_item_key(1, "t", "n")), None);
    assert_eq!(parse_type_spec_key(&event_key(1, 1, 0)), None);
    assert_eq!(parse_purge_key(&fleet_event_key(1)), None);
    assert_eq!(split_tenant_key(b"\x01short"), None);
}

#[test]
fn event_scans_come_out_in_revision_order() {
    let store = InMemoryStore::new();
    let revisions = [65536, 0, u64::MAX, 256, 1, 255, 257];
    let mut batch = WriteBatch::new();
    for revision in revisions {
        batch.put(event_key(3, revision, 0), revision.to_be_bytes());
    }
    batch.put(event_key(4, 2, 0), b"other tenant".to_vec());
    batch.put(current_item_key(3, "a", "b"), b"other kind".to_vec());
    store.commit_blocking(batch).expect("commit");

    let scanned: Vec<u64> = store
        .scan(&events_prefix(3), None, usize::MAX)
        .expect("scan")
        .iter()
        .map(|(key, _)| parse_event_key(key).expect("event key").1)
        .collect();
    let mut sorted = revisions.to_vec();
    sorted.sort_unstable();
    assert_eq!(scanned, sorted);
}

#[test]
fn item_keys_sort_in_type_then_name_order() {
    let mut identities = [
        ("a", "b"),
        ("a", "ba"),
        ("ab", "a"),
        ("a ", "z"),
        ("b", "a"),
        ("a", "a\u{e9}"),
        ("a", "a"),
        ("A", "zz"),
    ];
    let mut by_key: Vec<_> = identities
        .iter()
        .map(|(t, n)| intended_item_key(1, t, n))
        .collect();
    by_key.sort();
    identities.sort();
    let parsed: Vec<_> = by_key
        .iter()
        .map(|key| parse_item_key(key).expect("item key"))
        .collect();
    let expected: Vec<_> = identities
        .iter()
        .map(|(t, n)| (t.to_string(), n.to_string()))
        .collect();
    assert_eq!(parsed, expected);
}

#[test]
fn no_tenant_key_starts_with_another_tenants_prefix() {
    for owner in IDS {
        for other in IDS.iter().copied().filter(|&other| other != owner) {
            let prefix = tenant_prefix(other);
            for key in every_key_of(owner) {
                assert!(
                    !key.starts_with(&prefix),
                    "key {key:?} of {owner} extends the prefix of {other}"
                );
            }
        }
        for key in every_key_of(owner) {
            assert!(key.starts_with(&tenant_prefix(owner)));
            assert_eq!(split_tenant_key(&key).map(|(id, _, _)| id), Some(owner));
        }
    }
}

#[test]
fn global_and_tenant_keys_never_overlap() {
    let global = [
        schema_version_key().to_vec(),
        next_tenant_id_key().to_vec(),
        tenant_name_key("acme"),
        purge_key(1),
        fleet_event_key(1),
        tenant_entry_key("acme"),
        revision_floor_key("acme"),
    ];
    for key in &global {
        assert_eq!(key[0], GLOBAL_SPACE);
        for id in IDS {
            assert!(!key.starts_with(&tenant_prefix(id)));
        }
    }
    for prefix in [
        tenant_names_prefix(),
        purges_prefix(),
        fleet_events_prefix(),
        tenant_entries_prefix(),
        revision_floors_prefix(),
    ] {
        let matching = global.iter().filter(|key| key.starts_with(prefix)).count();
        assert_eq!(matching, 1, "prefix {prefix:?}");
    }
}

#[test]
fn kind_prefixes_select_only_their_kind() {
    let prefixes = [
        intended_items_prefix(1),
        current_items_prefix(1),
        type_specs_prefix(1),
        events_prefix(1),
        journal_prefix(1),
        backoffs_prefix(1),
    ];
    for key in every_key_of(1)
        .iter()
        .filter(|key| **key != tenant_record_key(1))
    {
        let matching = prefixes
            .iter()
            .filter(|prefix| key.starts_with(prefix))
            .count();
        assert_eq!(matching, 1, "key {key:?}");
    }
}
