//! What decoding a SubmitIntent costs before the tenant sees it: the walk
//! that estimates what a request decodes into before prost runs
//! (`limits::decode`), prost's own decode of the same bytes, and the
//! conversion and validation of the decoded request (`validate_submit`),
//! for requests of 10 and 1,000 items shaped like `reconciled-bench
//! submit`'s. Run with `cargo bench -p reconciled --bench decode`.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use prost::Message as _;
use reconciled::api::reconciler::validate_submit;
use reconciled::graph::validate::ValidationLimits;
use reconciled::graph::{Dependency, Item, ItemRef, Properties};
use reconciled::limits::estimate_decoded_bytes;
use reconciled::wire::item_to_proto;
use reconciled_proto::v1;

/// The server's allocator (mimalloc, as in `main.rs`): conversion and
/// validation allocate per item and per field.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A SubmitIntent of `count` items with five properties each, 64 bytes of
/// filler among them, encoded.
fn request(count: usize) -> Vec<u8> {
    request_with(count, 0)
}

/// [`request`] with each item depending on the `dependencies` items
/// before it (as many as there are).
fn request_with(count: usize, dependencies: usize) -> Vec<u8> {
    let filler = "x".repeat(64);
    let items = (0..count)
        .map(|index| {
            let properties = Properties::try_from(serde_json::json!({
                "index": index,
                "mtu": 1500,
                "enabled": true,
                "round": 1,
                "note": filler,
            }))
            .expect("an object");
            let mut item = Item::new("interface", format!("c0-if-{index:05}"), properties);
            for before in index.saturating_sub(dependencies)..index {
                let required = ItemRef::new("interface", format!("c0-if-{before:05}"));
                item = item.depends_on(Dependency::on(required));
            }
            item_to_proto(&item)
        })
        .collect();
    v1::SubmitIntentRequest {
        subgraph: "c0".into(),
        items,
        ..v1::SubmitIntentRequest::default()
    }
    .encode_to_vec()
}

fn decode(c: &mut Criterion) {
    for count in [10, 1_000] {
        let bytes = request(count);
        c.bench_function(&format!("decode/guard walk/{count} items"), |b| {
            b.iter(|| {
                estimate_decoded_bytes("reconciled.v1.SubmitIntentRequest", black_box(&bytes))
                    .expect("well formed")
            });
        });
        c.bench_function(&format!("decode/prost decode/{count} items"), |b| {
            b.iter(|| {
                v1::SubmitIntentRequest::decode(black_box(bytes.as_slice())).expect("well formed")
            });
        });
        for dependencies in [0, 2] {
            let bytes = request_with(count, dependencies);
            let decoded = v1::SubmitIntentRequest::decode(bytes.as_slice()).expect("well formed");
            let limits = ValidationLimits::default();
            let name = format!("decode/validate/{count} items, {dependencies} dependencies each");
            c.bench_function(&name, |b| {
                b.iter_batched(
                    || decoded.clone(),
                    |request| validate_submit(black_box(request), &limits).expect("valid"),
                    BatchSize::LargeInput,
                );
            });
        }
    }
}

criterion_group!(benches, decode);
criterion_main!(benches);
