//! What a type's JSON Schema costs at SubmitIntent: validating items of
//! ordinary size against a schema such as schemars derives, and the worst
//! an agent can register within the limits (the most subschema evaluations
//! per value, applied to every member of a 64 KiB item). Also the cost of
//! compiling a schema at Register. Run with
//! `cargo bench -p reconciled --bench schema`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use reconciled::engine::exec::{TypeRegistry, TypeSpec};
use reconciled::engine::schema::bounds::{MAX_EVALUATIONS_PER_VALUE, MAX_SCHEMA_BYTES};
use reconciled::engine::schema::{TypeSchema, check_items};
use reconciled::graph::{Item, Properties};
use serde_json::{Value, json};

/// The schema schemars derives for a listener struct.
fn derived() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Listener",
        "type": "object",
        "properties": {
            "host": {"type": "string", "pattern": "^[a-z0-9.-]+$"},
            "port": {"type": "integer", "format": "uint16", "minimum": 0, "maximum": 65535},
            "tls": {"anyOf": [{"$ref": "#/$defs/Tls"}, {"type": "null"}]},
            "tags": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["host", "port"],
        "additionalProperties": false,
        "$defs": {"Tls": {"type": "object", "properties": {"certificate": {"type": "string"}},
                          "required": ["certificate"]}}
    })
}

/// The costliest schema the bounds accept for flat objects: every member
/// goes through (almost) the most subschemas allowed.
fn worst() -> Value {
    let each: Vec<Value> = (0..MAX_EVALUATIONS_PER_VALUE - 2)
        .map(|n| json!({"minLength": n % 2}))
        .collect();
    let schema = json!({"additionalProperties": {"allOf": each}});
    assert!(serde_json::to_vec(&schema).map_or(0, |s| s.len()) <= MAX_SCHEMA_BYTES);
    schema
}

fn registry(schema: Value) -> TypeRegistry {
    let mut spec = TypeSpec::new("t");
    spec.schema = Some(TypeSchema::compile(schema).expect("within the bounds"));
    let mut registry = TypeRegistry::default();
    registry.insert(spec, 1);
    registry
}

fn items(count: usize, properties: &Properties) -> Vec<Item> {
    (0..count)
        .map(|n| Item::new("t", format!("i{n}"), properties.clone()))
        .collect()
}

fn bench_schema(c: &mut Criterion) {
    let listener = Properties::try_from(
        json!({"host": "web.local", "port": 443, "tls": {"certificate": "pem"}, "tags": ["a", "b"]}),
    )
    .unwrap_or_default();
    let derived_types = registry(derived());
    let thousand = items(1_000, &listener);
    c.bench_function("derived_schema_1000_items", |b| {
        b.iter(|| check_items(black_box(&derived_types), &thousand))
    });

    // A 64 KiB item of short string members: about 4,900 values.
    let big: Properties = (0..4_900)
        .map(|n| (format!("k{n:05}"), json!("v")))
        .collect();
    let size = serde_json::to_vec(&big).map_or(0, |json| json.len());
    assert!(size <= 64 * 1024, "{size}");
    let worst_types = registry(worst());
    let one = items(1, &big);
    c.bench_function("worst_schema_one_64k_item", |b| {
        b.iter(|| check_items(black_box(&worst_types), &one))
    });
    // The same item with every member invalid (empty strings): validation
    // stops at the most violations one rejection reports.
    let empty: Properties = big.iter().map(|(key, _)| (key, json!(""))).collect();
    let invalid = items(1, &empty);
    c.bench_function("worst_schema_one_64k_item_all_invalid", |b| {
        b.iter(|| check_items(black_box(&worst_types), &invalid))
    });

    c.bench_function("compile_derived_schema", |b| {
        b.iter(|| TypeSchema::compile(black_box(derived())))
    });
    c.bench_function("compile_worst_schema", |b| {
        b.iter(|| TypeSchema::compile(black_box(worst())))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench_schema
}
criterion_main!(benches);
