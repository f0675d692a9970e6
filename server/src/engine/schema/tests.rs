use serde_json::json;

use super::*;
use crate::engine::exec::TypeSpec;
use crate::graph::Properties;

/// The schema schemars derives for
/// `struct Server { host: String, port: u16, tls: Option<Tls>, tags: Vec<String> }`.
fn server_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Server",
        "type": "object",
        "properties": {
            "host": {"type": "string", "pattern": "^[a-z0-9.-]+$"},
            "port": {"type": "integer", "format": "uint16", "minimum": 0, "maximum": 65535},
            "tls": {"anyOf": [{"$ref": "#/$defs/Tls"}, {"type": "null"}]},
            "tags": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["host", "port"],
        "additionalProperties": false,
        "$defs": {"Tls": {"type": "object", "properties": {"ca": {"type": "string"}},
                          "required": ["ca"]}}
    })
}

fn registry(schema: Value) -> TypeRegistry {
    let mut spec = TypeSpec::new("server");
    spec.schema = Some(TypeSchema::compile(schema).expect("the schema compiles"));
    let mut registry = TypeRegistry::default();
    registry.insert(spec, 1);
    registry.insert(TypeSpec::new("free"), 1);
    registry
}

fn item(item_type: &str, name: &str, properties: Value) -> Item {
    let properties: Properties = match properties {
        Value::Object(map) => map.into(),
        _ => Properties::new(),
    };
    Item::new(item_type, name, properties)
}

fn violations(registry: &TypeRegistry, items: &[Item]) -> Vec<(String, String)> {
    match check_items(registry, items) {
        Ok(()) => Vec::new(),
        Err(IntentError::Invalid { violations }) => violations
            .into_iter()
            .map(|v| (v.field, v.description))
            .collect(),
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn valid_items_pass_and_types_without_a_schema_are_not_checked() {
    let registry = registry(server_schema());
    let items = [
        item("server", "a", json!({"host": "db.local", "port": 5432})),
        item(
            "server",
            "b",
            json!({"host": "x", "port": 1, "tls": {"ca": "pem"}, "tags": ["a"]}),
        ),
        item("free", "c", json!({"anything": [1, {"goes": true}]})),
        item("unregistered", "d", json!({"port": "not a number"})),
    ];
    assert_eq!(violations(&registry, &items), Vec::new());
}

#[test]
fn each_problem_is_a_field_violation_inside_its_item() {
    let registry = registry(server_schema());
    let items = [
        item("server", "ok", json!({"host": "a", "port": 1})),
        item(
            "server",
            "bad",
            json!({"host": "Not Valid", "port": 70000, "tls": {"ca": 3}, "tags": ["a", 2], "extra": 1}),
        ),
        item("server", "missing", json!({"host": "a"})),
    ];
    let found = violations(&registry, &items);
    let fields: Vec<&str> = found.iter().map(|(field, _)| field.as_str()).collect();
    for expected in [
        "items[1].properties.host",
        "items[1].properties.port",
        "items[1].properties.tls",
        "items[1].properties.tags[1]",
        "items[1].properties.extra",
        "items[2].properties.port",
    ] {
        assert!(fields.contains(&expected), "{expected} in {found:#?}");
    }
    assert!(!fields.iter().any(|field| field.starts_with("items[0]")));
    let port = found
        .iter()
        .find(|(field, _)| field == "items[1].properties.port")
        .map(|(_, description)| description.as_str())
        .unwrap_or_default();
    assert!(
        port.contains("65535") && port.contains("#/properties/port/maximum"),
        "{port}"
    );
    assert!(port.contains("type \"server\""), "{port}");
    // An anyOf says what each branch wanted.
    let tls = found
        .iter()
        .find(|(field, _)| field == "items[1].properties.tls")
        .map(|(_, description)| description.as_str())
        .unwrap_or_default();
    assert!(
        tls.contains("#0: 3 is not of type \"string\"") && tls.contains("#1: "),
        "{tls}"
    );
    let missing = found
        .iter()
        .find(|(field, _)| field == "items[2].properties.port")
        .map(|(_, description)| description.as_str())
        .unwrap_or_default();
    assert!(missing.starts_with("is required"), "{missing}");
}

#[test]
fn keys_that_are_not_identifiers_are_quoted_in_paths() {
    let registry = registry(json!({"additionalProperties": {"type": "integer"}}));
    let found = violations(
        &registry,
        &[item("server", "a", json!({"a-b": "x", "ok": 1}))],
    );
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "items[0].properties[\"a-b\"]");
}

#[test]
fn external_items_are_not_checked() {
    let registry = registry(server_schema());
    let mut external = item("server", "seen", json!({"port": "?"}));
    external.external = true;
    assert_eq!(violations(&registry, &[external]), Vec::new());
}

#[test]
fn violations_are_capped_with_a_closing_note() {
    let registry = registry(json!({"type": "object", "required": ["x"]}));
    let items: Vec<Item> = (0..150)
        .map(|n| item("server", &format!("i{n}"), json!({})))
        .collect();
    let found = violations(&registry, &items);
    assert_eq!(found.len(), MAX_VIOLATIONS);
    let (field, note) = found.last().expect("a note");
    assert_eq!(field, "items");
    assert!(note.starts_with("more violations are not shown"), "{note}");
}

#[test]
fn long_messages_are_cut() {
    let registry = registry(json!({"properties": {"s": {"maxLength": 1}}}));
    let found = violations(
        &registry,
        &[item("server", "a", json!({"s": "y".repeat(10_000)}))],
    );
    assert_eq!(found.len(), 1);
    assert!(found[0].1.chars().count() < 400, "{}", found[0].1);
}

#[test]
fn schemas_that_do_not_compile_are_refused_with_the_place() {
    let refused = TypeSchema::compile(json!({"properties": {"port": {"type": "port"}}}))
        .expect_err("not a type");
    let message = refused.to_string();
    assert!(
        message.starts_with("the schema does not compile") && message.contains("/properties/port"),
        "{message}"
    );
    // Look-around needs a backtracking engine: refused, not run.
    assert!(matches!(
        TypeSchema::compile(json!({"pattern": "^(?=a)a$"})),
        Err(SchemaError::Invalid { .. })
    ));
    // A pattern whose compiled form would be huge is refused quickly.
    assert!(matches!(
        TypeSchema::compile(json!({"pattern": "((a{100}){100}){100}"})),
        Err(SchemaError::Invalid { .. })
    ));
    assert!(matches!(
        TypeSchema::compile(json!({"$ref": "file:///etc/passwd"})),
        Err(SchemaError::Bounds(BoundsError::ExternalRef { .. }))
    ));
}

#[test]
fn a_nested_schema_at_the_depth_limit_compiles_on_a_small_stack() {
    // Test threads have 2 MiB stacks, as tokio's workers do.
    let mut deep = json!({"type": "string"});
    for _ in 0..(bounds::MAX_SCHEMA_DEPTH - 2) / 2 {
        deep = json!({"properties": {"a": deep}});
    }
    let schema = TypeSchema::compile(deep).expect("within the depth limit");
    let mut value = json!(1);
    for _ in 0..(bounds::MAX_SCHEMA_DEPTH - 2) / 2 {
        value = json!({"a": value});
    }
    let mut violations = Violations::default();
    let mut listing = LISTING_EVALUATIONS_PER_REQUEST;
    schema.check(
        "t",
        &value,
        "items[0].properties",
        100,
        &mut listing,
        &mut violations,
    );
    assert_eq!(violations.kept.len(), 1);
}

#[test]
fn the_pattern_engine_does_not_backtrack() {
    // (a+)+$ takes exponential time on a backtracking engine.
    let registry = registry(json!({"properties": {"s": {"pattern": "^(a+)+$"}}}));
    let input = format!("{}b", "a".repeat(10_000));
    let found = violations(&registry, &[item("server", "a", json!({ "s": input }))]);
    assert_eq!(found.len(), 1);
}

#[test]
fn a_stored_schema_round_trips_and_compiles_when_first_used() {
    let mut spec = TypeSpec::new("server");
    spec.schema = Some(TypeSchema::compile(server_schema()).expect("compiles"));
    let stored = serde_json::to_string(&spec).expect("encodes");
    let back: TypeSpec = serde_json::from_str(&stored).expect("decodes");
    assert_eq!(back, spec);
    let mut registry = TypeRegistry::default();
    registry.insert(back, 1);
    let found = violations(&registry, &[item("server", "a", json!({"host": "a"}))]);
    assert_eq!(found.len(), 1);

    // A spec stored before schemas existed has none.
    let old = serde_json::to_value(TypeSpec::new("old")).expect("encodes");
    assert!(old.get("schema").is_none());
    let decoded: TypeSpec = serde_json::from_value(old).expect("decodes");
    assert_eq!(decoded.schema, None);
}

#[test]
fn a_stored_schema_that_no_longer_compiles_refuses_its_items() {
    let mut spec = TypeSpec::new("server");
    spec.schema = Some(TypeSchema::stored(json!({"$ref": "http://elsewhere/x"})));
    let mut registry = TypeRegistry::default();
    registry.insert(spec, 1);
    let found = violations(&registry, &[item("server", "a", json!({}))]);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, "items[0].properties");
    assert!(
        found[0].1.contains("register a valid one"),
        "{}",
        found[0].1
    );
}

#[test]
fn a_request_that_could_cost_too_much_to_validate_is_refused_before_it_runs() {
    // 999 evaluations for every member, 1,000 members per item: about a
    // million per item, so 51 items are over the request's budget.
    let each: Vec<Value> = (0..997).map(|_| json!({"type": "string"})).collect();
    let registry = registry(json!({"additionalProperties": {"allOf": each}}));
    let member: Properties = (0..1_000).map(|n| (format!("k{n}"), json!("v"))).collect();
    let item = Item::new("server", "i", member);
    let fifty: Vec<Item> = (0..50).map(|_| item.clone()).collect();
    assert_eq!(violations(&registry, &fifty), Vec::new());
    let more: Vec<Item> = (0..51).map(|_| item.clone()).collect();
    match check_items(&registry, &more) {
        Err(IntentError::Quota {
            subject,
            description,
        }) => {
            assert_eq!(subject, "schema_evaluations_per_request");
            assert!(description.contains("split the intent"), "{description}");
        }
        other => panic!("expected a quota error, got {other:?}"),
    }
}

#[test]
fn items_too_costly_to_list_report_their_first_problem() {
    let each: Vec<Value> = (0..997).map(|_| json!({"minLength": 1})).collect();
    let registry = registry(json!({"additionalProperties": {"allOf": each}}));
    // 999 evaluations per value, 301 values: over the listing budget.
    let empty: Properties = (0..300).map(|n| (format!("k{n}"), json!(""))).collect();
    let found = violations(&registry, &[Item::new("server", "i", empty)]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].0.starts_with("items[0].properties.k"), "{found:?}");
    assert!(found[0].1.contains("first problem"), "{found:?}");
}

#[test]
fn a_derived_schema_costs_a_few_evaluations_per_value() {
    let compiled = TypeSchema::compile(server_schema()).expect("compiles");
    let per_value = compiled
        .compiled()
        .as_ref()
        .map(|compiled| compiled.evaluations_per_value)
        .unwrap_or_default();
    assert!((1..=10).contains(&per_value), "{per_value}");
}
