//! `reconctl type list` and `reconctl type get NAME`: the item types agents
//! registered for a tenant, with their specs and JSON Schemas
//! (`Reconciler.GetItemTypes`).

use serde_json::{Value, json};

use super::args::{FormatArgs, TypeGetArgs};
use super::failure::{Exit, Failure};
use super::output::{emit_as, emit_json};
use super::table::Table;
use super::{Session, json};
use crate::convert::properties_from_struct;
use crate::proto as v1;

/// Lists the registered item types.
pub(crate) async fn list(session: &Session, args: FormatArgs) -> Result<Exit, Failure> {
    let types = fetch(session, Vec::new()).await?;
    emit_as(
        args.output,
        || Value::Array(types.iter().map(registered_type).collect()),
        || render_list(&types),
    )?;
    Ok(Exit::Success)
}

/// Shows one item type, or only its schema with `--schema`.
pub(crate) async fn get(session: &Session, args: TypeGetArgs) -> Result<Exit, Failure> {
    let types = fetch(session, vec![args.name.clone()]).await?;
    let Some(found) = types.iter().find(|found| type_name(found) == args.name) else {
        return Err(Failure::error(format!(
            "no agent has registered item type {:?} for tenant {:?}; `reconctl type list` \
             shows the registered types",
            args.name,
            session.tenant()?
        )));
    };
    if args.schema {
        emit_json(&schema(found).unwrap_or(Value::Bool(true)))?;
    } else {
        emit_as(args.output, || registered_type(found), || render_one(found))?;
    }
    Ok(Exit::Success)
}

async fn fetch(
    session: &Session,
    item_types: Vec<String>,
) -> Result<Vec<v1::RegisteredItemType>, Failure> {
    let tenant = session.tenant()?;
    let mut listed = Vec::new();
    let mut page_token = String::new();
    loop {
        let reply = session
            .client
            .get_item_types(v1::GetItemTypesRequest {
                tenant: tenant.clone(),
                item_types: item_types.clone(),
                page_token,
            })
            .await
            .map_err(|status| {
                session.failed(&format!("item types of tenant {tenant:?}"), &status)
            })?;
        listed.extend(reply.item_types);
        if reply.next_page_token.is_empty() {
            return Ok(listed);
        }
        page_token = reply.next_page_token;
    }
}

fn type_name(registered: &v1::RegisteredItemType) -> &str {
    registered
        .spec
        .as_ref()
        .map_or("", |spec| spec.item_type.as_str())
}

/// The type's schema as JSON, if it has one.
fn schema(registered: &v1::RegisteredItemType) -> Option<Value> {
    registered
        .spec
        .as_ref()
        .and_then(|spec| spec.schema.clone())
        .map(|schema| Value::Object(properties_from_struct(schema)))
}

/// A retry policy as JSON.
fn retry_policy(policy: &v1::RetryPolicy) -> Value {
    let duration =
        |value: &Option<prost_types::Duration>| value.as_ref().map_or(Value::Null, json::duration);
    let mut out = match &policy.policy {
        Some(v1::retry_policy::Policy::StaticRetry(fixed)) => {
            json!({"static": {"wait": duration(&fixed.wait)}})
        }
        Some(v1::retry_policy::Policy::Random(random)) => {
            json!({"random": {"min": duration(&random.min), "max": duration(&random.max)}})
        }
        Some(v1::retry_policy::Policy::Exponential(exponential)) => json!({"exponential": {
            "initial": duration(&exponential.initial),
            "multiplier": exponential.multiplier,
            "max": duration(&exponential.max),
        }}),
        None => json!({}),
    };
    if policy.max_attempts > 0
        && let Value::Object(map) = &mut out
    {
        map.insert("max_attempts".into(), json!(policy.max_attempts));
    }
    out
}

/// A registered type as JSON: the spec's fields, `connected`, `epoch` and
/// `schema`.
fn registered_type(registered: &v1::RegisteredItemType) -> Value {
    let spec = registered.spec.clone().unwrap_or_default();
    let mut out = json!({
        "type": spec.item_type,
        "connected": registered.connected,
        "epoch": registered.epoch,
        "recreate_on_change": spec.recreate_on_change,
        "ask_needs_recreate": spec.ask_needs_recreate,
        "supports_read": spec.supports_read,
        "max_in_flight": spec.max_in_flight,
    });
    if let Value::Object(map) = &mut out {
        if let Some(timeout) = &spec.operation_timeout {
            map.insert("operation_timeout".into(), json::duration(timeout));
        }
        if let Some(policy) = &spec.retry_policy {
            map.insert("retry_policy".into(), retry_policy(policy));
        }
        if let Some(schema) = schema(registered) {
            map.insert("schema".into(), schema);
        }
    }
    out
}

fn yes_no(flag: bool) -> &'static str {
    if flag { "yes" } else { "no" }
}

fn render_list(types: &[v1::RegisteredItemType]) -> String {
    if types.is_empty() {
        return "no item types registered; an agent registers its types when it connects\n"
            .to_owned();
    }
    let mut table = Table::new(&["TYPE", "CONNECTED", "EPOCH", "READ", "RECREATE", "SCHEMA"]);
    for registered in types {
        let spec = registered.spec.clone().unwrap_or_default();
        table.row(vec![
            spec.item_type,
            yes_no(registered.connected).to_owned(),
            registered.epoch.to_string(),
            yes_no(spec.supports_read).to_owned(),
            spec.recreate_on_change.join(","),
            yes_no(spec.schema.is_some()).to_owned(),
        ]);
    }
    table.render()
}

fn render_one(registered: &v1::RegisteredItemType) -> String {
    let spec = registered.spec.clone().unwrap_or_default();
    let value = registered_type(registered);
    let field = |key: &str| value.get(key).map_or_else(String::new, ToString::to_string);
    let schema = match schema(registered) {
        Some(schema) => serde_json::to_string_pretty(&schema).unwrap_or_default(),
        None => "none (any properties are accepted)".to_owned(),
    };
    let recreate = if spec.recreate_on_change.is_empty() {
        "-".to_owned()
    } else {
        spec.recreate_on_change.join(", ")
    };
    format!(
        "type:                {}\nconnected:           {} (epoch {})\nrecreate on change:  \
         {recreate}\nask needs_recreate:  {}\nsupports READ:       {}\nmax in flight:       \
         {}\noperation timeout:   {}\nretry policy:        {}\nschema:              {schema}\n",
        spec.item_type,
        yes_no(registered.connected),
        registered.epoch,
        yes_no(spec.ask_needs_recreate),
        yes_no(spec.supports_read),
        spec.max_in_flight,
        field("operation_timeout").trim_matches('"'),
        field("retry_policy"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> v1::RegisteredItemType {
        let schema = serde_json::json!({"type": "object", "required": ["key"]});
        let Value::Object(schema) = schema else {
            unreachable!("an object literal")
        };
        v1::RegisteredItemType {
            spec: Some(v1::ItemTypeSpec {
                item_type: "kv".into(),
                recreate_on_change: vec!["/key".into()],
                supports_read: true,
                max_in_flight: 64,
                schema: Some(crate::convert::properties_to_struct(&schema)),
                ..v1::ItemTypeSpec::default()
            }),
            epoch: 2,
            connected: true,
        }
    }

    #[test]
    fn a_type_shows_its_spec_and_schema() {
        let text = render_one(&sample());
        assert!(text.contains("type:                kv"), "{text}");
        assert!(
            text.contains("connected:           yes (epoch 2)"),
            "{text}"
        );
        assert!(text.contains("\"required\": ["), "{text}");
        let value = registered_type(&sample());
        assert_eq!(value["schema"]["required"], json!(["key"]));
        let list = render_list(&[sample()]);
        assert!(list.starts_with("TYPE"), "{list}");
        assert!(list.contains("kv    yes"), "{list}");
    }
}
