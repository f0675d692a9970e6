//! What the decode guard costs at SubmitIntent: the walk that estimates
//! what a request decodes into before prost runs (`limits::decode`), next
//! to prost's own decode of the same bytes, for requests of 10 and 1,000
//! items shaped like `reconciled-bench submit`'s. Run with
//! `cargo bench -p reconciled --bench decode`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use prost::Message as _;
use reconciled::graph::{Item, Properties};
use reconciled::limits::estimate_decoded_bytes;
use reconciled::wire::item_to_proto;
use reconciled_proto::v1;

/// A SubmitIntent of `count` items with five properties each, 64 bytes of
/// filler among them, encoded.
fn request(count: usize) -> Vec<u8> {
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
            item_to_proto(&Item::new(
                "interface",
                format!("c0-if-{index:05}"),
                properties,
            ))
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
    }
}

criterion_group!(benches, decode);
criterion_main!(benches);
