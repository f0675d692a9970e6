//! Fuzzing of the decode → validate → convert path of what a tenant or an
//! agent sends, on stable Rust: proptest mutates the seeds of a corpus kept
//! in the repository (`server/fuzz/corpus/<target>/*.bin`, encoded
//! requests) by flipping bits, cutting, inserting, overwriting and
//! duplicating bytes, and splicing two seeds; each input goes through what
//! the server does with a request body:
//!
//! 1. the decoding layer (`limits::decode`): its wire-format walk must
//!    refuse, with a field path, everything prost would refuse (which
//!    tonic would answer `INTERNAL`), and estimate the rest;
//! 2. prost decoding;
//! 3. validation and conversion to the engine's types (SubmitIntent:
//!    `api::reconciler::validate_submit`; ReportExternal and an agent's
//!    ExternalUpdate: `api::externals::validate_external_reports`).
//!
//! What must hold: nothing panics; a refusal is `INVALID_ARGUMENT` (or a
//! quota); what is accepted converts back to the wire and is accepted again
//! unchanged, and every accepted item encodes as the record that stores it
//! within the store's size limit (an accepted item that cannot be stored
//! would fail later with INTERNAL).
//!
//! `cargo test -p reconciled --lib api::fuzz` runs 256 cases per target;
//! `FUZZ_CASES=20000` runs more. `FUZZ_WRITE_CORPUS=1` rewrites the seeds
//! from [`seeds`]. A failure prints the shrunk input; add it to the
//! corpus as a `.bin` file so that every later run starts from it.

use std::path::PathBuf;
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use prost::Message as _;
use reconciled_proto::v1;
use tonic::Code;

use super::externals::validate_external_reports;
use super::reconciler::validate_submit;
use crate::graph::validate::ValidationLimits;
use crate::limits::{decoded_allowance, estimate_decoded_bytes};
use crate::tenant::record::{StoredIntended, encode};
use crate::tenant::{OwnerSettings, TenantDirectory, TenantHandle, TenantLimits};
use crate::wire::item_to_proto;

/// The corpus directory of `target`.
fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join("corpus")
        .join(target)
}

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(256)
}

/// The seeds of `target`, read from the corpus (rewritten first with
/// `FUZZ_WRITE_CORPUS=1`).
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = corpus_dir(target);
    if std::env::var_os("FUZZ_WRITE_CORPUS").is_some() {
        std::fs::create_dir_all(&dir).expect("the corpus directory can be made");
        for (index, seed) in seeds(target).into_iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{index:02}.bin")), seed)
                .expect("a seed can be written");
        }
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("the corpus {} cannot be read: {error}", dir.display()))
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "bin"))
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files
        .iter()
        .map(|path| std::fs::read(path).expect("a seed can be read"))
        .collect();
    assert!(!seeds.is_empty(), "the corpus {} is empty", dir.display());
    seeds
}

fn string(value: &str) -> prost_types::Value {
    prost_types::Value {
        kind: Some(prost_types::value::Kind::StringValue(value.into())),
    }
}

fn properties(fields: &[(&str, prost_types::Value)]) -> Option<prost_types::Struct> {
    Some(prost_types::Struct {
        fields: fields
            .iter()
            .map(|(key, value)| ((*key).to_owned(), value.clone()))
            .collect(),
    })
}

/// The seeds written by `FUZZ_WRITE_CORPUS=1`: requests a real client
/// sends, covering every field the path reads.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let nested = prost_types::Value {
        kind: Some(prost_types::value::Kind::ListValue(
            prost_types::ListValue {
                values: vec![
                    string("a"),
                    prost_types::Value {
                        kind: Some(prost_types::value::Kind::NumberValue(1500.0)),
                    },
                    prost_types::Value {
                        kind: Some(prost_types::value::Kind::StructValue(prost_types::Struct {
                            fields: [("deep".to_owned(), string("x"))].into_iter().collect(),
                        })),
                    },
                ],
            },
        )),
    };
    let base = v1::Item {
        r#type: "interface".into(),
        name: "eth0".into(),
        properties: properties(&[("mtu", string("1500")), ("list", nested)]),
        label: "uplink".into(),
        description: "the uplink".into(),
        subgraph: "net/core".into(),
        ..Default::default()
    };
    let dependent = v1::Item {
        r#type: "route".into(),
        name: "default".into(),
        dependencies: vec![v1::Dependency {
            requires: Some(v1::ItemRef {
                r#type: "interface".into(),
                name: "eth0".into(),
            }),
            must_satisfy: "self.mtu == \"1500\" && self.list.all(x, x != \"b\")".into(),
            recreate_when_modified: true,
            ..Default::default()
        }],
        subgraph: "net".into(),
        ..Default::default()
    };
    let external = v1::Item {
        r#type: "link".into(),
        name: "carrier".into(),
        external: true,
        ..Default::default()
    };
    match target {
        "submit_intent" => vec![
            v1::SubmitIntentRequest {
                tenant: "acme".into(),
                items: vec![base.clone(), dependent, external.clone()],
                expected_generation: Some(3),
                ..Default::default()
            }
            .encode_to_vec(),
            v1::SubmitIntentRequest {
                tenant: "acme".into(),
                subgraph: "net".into(),
                dry_run: true,
                ..Default::default()
            }
            .encode_to_vec(),
            // Numbers JSON cannot hold.
            v1::SubmitIntentRequest {
                tenant: "acme".into(),
                items: vec![v1::Item {
                    properties: properties(&[
                        (
                            "nan",
                            prost_types::Value {
                                kind: Some(prost_types::value::Kind::NumberValue(f64::NAN)),
                            },
                        ),
                        (
                            "inf",
                            prost_types::Value {
                                kind: Some(prost_types::value::Kind::NumberValue(f64::INFINITY)),
                            },
                        ),
                    ]),
                    ..base.clone()
                }],
                ..Default::default()
            }
            .encode_to_vec(),
            v1::SubmitIntentRequest {
                tenant: "acme".into(),
                items: vec![v1::Item {
                    properties: properties(&[("blob", string(&"x".repeat(60_000)))]),
                    ..base.clone()
                }],
                ..Default::default()
            }
            .encode_to_vec(),
        ],
        "report_external" => vec![
            v1::ReportExternalRequest {
                tenant: "acme".into(),
                reports: vec![
                    v1::ExternalReport {
                        change: Some(v1::external_report::Change::Put(external)),
                        modified: true,
                    },
                    v1::ExternalReport {
                        change: Some(v1::external_report::Change::Delete(v1::ItemRef {
                            r#type: "link".into(),
                            name: "old".into(),
                        })),
                        modified: false,
                    },
                ],
            }
            .encode_to_vec(),
        ],
        _ => Vec::new(),
    }
}

/// One change to an input.
#[derive(Clone, Debug)]
enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    Cut {
        at: usize,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Overwrite {
        at: usize,
        byte: u8,
    },
    Duplicate {
        from: usize,
        length: usize,
        at: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        any::<usize>().prop_map(|at| Mutation::Cut { at }),
        (
            any::<usize>(),
            prop::collection::vec(
                prop_oneof![
                    any::<u8>(),
                    // Bytes that matter to the wire format: lengths that run
                    // on, empty fields, NUL, a lone UTF-8 continuation byte.
                    Just(0xff_u8),
                    Just(0x00),
                    Just(0x80),
                    Just(0x1a),
                ],
                1..12
            )
        )
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Overwrite { at, byte }),
        (any::<usize>(), 1usize..64, any::<usize>())
            .prop_map(|(from, length, at)| { Mutation::Duplicate { from, length, at } }),
    ]
}

fn mutate(mut input: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for change in mutations {
        let len = input.len().max(1);
        match change {
            Mutation::Flip { at, bit } => {
                if let Some(byte) = input.get_mut(at % len) {
                    *byte ^= 1 << bit;
                }
            }
            Mutation::Cut { at } => input.truncate(at % len),
            Mutation::Insert { at, bytes } => {
                let at = at % (input.len() + 1);
                input.splice(at..at, bytes.iter().copied());
            }
            Mutation::Overwrite { at, byte } => {
                if let Some(slot) = input.get_mut(at % len) {
                    *slot = *byte;
                }
            }
            Mutation::Duplicate { from, length, at } => {
                let from = from % len;
                let end = (from + length).min(input.len());
                let copy: Vec<u8> = input.get(from..end).unwrap_or_default().to_vec();
                let at = at % (input.len() + 1);
                input.splice(at..at, copy);
            }
        }
    }
    input
}

/// An input: a seed (or two spliced) with some mutations.
fn input(seeds: Arc<Vec<Vec<u8>>>) -> impl Strategy<Value = Vec<u8>> {
    let count = seeds.len();
    (
        0..count,
        0..count,
        any::<usize>(),
        any::<bool>(),
        prop::collection::vec(mutation(), 0..6),
    )
        .prop_map(move |(first, second, cut, splice, mutations)| {
            let mut bytes = seeds[first].clone();
            if splice {
                let other = &seeds[second];
                let at = cut % (bytes.len() + 1);
                bytes.truncate(at);
                bytes.extend_from_slice(&other[cut % (other.len() + 1)..]);
            }
            mutate(bytes, &mutations)
        })
}

/// The budget a non-admin call would be held to: the walk must not panic
/// and must charge what it is given.
fn budget<M: prost::Message + Default>(message_type: &str, bytes: &[u8]) {
    match estimate_decoded_bytes(message_type, bytes) {
        Ok(estimate) => {
            let _ = estimate <= decoded_allowance(bytes.len());
            // What the walk lets through, prost decodes: a refusal there
            // would reach the client as INTERNAL.
            if let Err(error) = M::decode(bytes) {
                panic!("the walk accepted what prost refuses ({error}): {bytes:?}");
            }
        }
        Err(malformed) => assert!(!malformed.reason.is_empty()),
    }
}

fn refused_as_a_client_error(status: &tonic::Status) {
    assert!(
        matches!(
            status.code(),
            Code::InvalidArgument | Code::ResourceExhausted
        ),
        "a refusal must be the client's error, not {status:?}"
    );
}

fn check_submit(bytes: &[u8]) {
    budget::<v1::SubmitIntentRequest>("reconciled.v1.SubmitIntentRequest", bytes);
    let Ok(request) = v1::SubmitIntentRequest::decode(bytes) else {
        return;
    };
    let limits = ValidationLimits::default();
    let tenant = request.tenant.clone();
    let validated = match validate_submit(request, &limits) {
        Ok(validated) => validated,
        Err(error) => return refused_as_a_client_error(&error.into()),
    };
    for (item, _) in &validated.items {
        let record = encode(&StoredIntended {
            item: item.clone(),
            generation: 1,
        })
        .unwrap_or_else(|error| panic!("accepted item {item:?} cannot be stored: {error}"));
        assert!(
            record.len() <= crate::store::MAX_CHUNKED_VALUE_BYTES,
            "accepted item {} stores in {} bytes",
            item.item_ref(),
            record.len()
        );
    }
    let again = v1::SubmitIntentRequest {
        tenant,
        subgraph: validated.subgraph.clone(),
        items: validated
            .items
            .iter()
            .map(|(item, _)| item_to_proto(item))
            .collect(),
        expected_generation: validated.expected_generation,
        dry_run: validated.dry_run,
    };
    let round = v1::SubmitIntentRequest::decode(again.encode_to_vec().as_slice())
        .expect("what the server encodes decodes");
    let revalidated = validate_submit(round, &limits).unwrap_or_else(|error| {
        panic!("an accepted intent is refused after a round trip: {error}")
    });
    let items = |submit: &crate::tenant::ValidatedSubmit| {
        submit
            .items
            .iter()
            .map(|(item, _)| item.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(items(&validated), items(&revalidated));
    assert_eq!(validated.subgraph, revalidated.subgraph);
}

fn check_report(bytes: &[u8], handle: &TenantHandle) {
    budget::<v1::ReportExternalRequest>("reconciled.v1.ReportExternalRequest", bytes);
    let Ok(request) = v1::ReportExternalRequest::decode(bytes) else {
        return;
    };
    let limits = ValidationLimits::default();
    match validate_external_reports(request.reports, "reports", handle, &limits, 1_000_000) {
        Ok(changes) => {
            for change in changes {
                if let crate::tenant::ExternalChange::Put { item, .. } = change {
                    assert!(item.external && item.dependencies.is_empty(), "{item:?}");
                    let stored =
                        crate::graph::CurrentItem::created(std::sync::Arc::new(item.clone()), 0);
                    let record = encode(&stored).unwrap_or_else(|error| {
                        panic!("accepted report {item:?} cannot be stored: {error}")
                    });
                    assert!(record.len() <= crate::store::MAX_CHUNKED_VALUE_BYTES);
                }
            }
        }
        Err(error) => refused_as_a_client_error(&error.into()),
    }
}

#[test]
fn submit_intent_bodies_decode_validate_and_convert_without_surprises() {
    let seeds = Arc::new(corpus("submit_intent"));
    for seed in seeds.iter() {
        check_submit(seed);
    }
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&input(seeds), |bytes| {
            check_submit(&bytes);
            Ok(())
        })
        .unwrap_or_else(|failure| panic!("{failure}"));
}

#[test]
fn report_external_bodies_decode_validate_and_convert_without_surprises() {
    let seeds = Arc::new(corpus("report_external"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let store: Arc<dyn crate::store::Store> = Arc::new(crate::store::InMemoryStore::new());
    let (directory, handle) = runtime.block_on(async {
        let directory = TenantDirectory::load(store, OwnerSettings::default()).expect("loads");
        let (handle, _) = directory
            .create("acme", TenantLimits::default())
            .await
            .expect("created");
        (directory, handle)
    });
    for seed in seeds.iter() {
        check_report(seed, &handle);
    }
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&input(seeds), |bytes| {
            check_report(&bytes, &handle);
            Ok(())
        })
        .unwrap_or_else(|failure| panic!("{failure}"));
    runtime.block_on(directory.shutdown());
}
