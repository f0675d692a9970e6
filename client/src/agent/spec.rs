//! [`TypeSpec`]: how the server treats the items of one type, sent in
//! `Register` as an `ItemTypeSpec`.

use std::time::Duration;

use reconciled_proto::json::properties_to_struct;
use reconciled_proto::pointer::check_recreate_path;
use reconciled_proto::v1;
use schemars::JsonSchema;
use serde_json::Value;

use super::error::AgentError;
use crate::convert::duration_to_proto;

/// How the server treats the items of one type: which property changes need
/// a recreate, how failures are retried, how long operations may take, and
/// how many may run at once. Built with chained setters:
///
/// ```
/// use std::time::Duration;
/// use reconciled_client::agent::TypeSpec;
///
/// let spec = TypeSpec::new("file")
///     .recreate_on_change(["/path"])
///     .retry_exponential(Duration::from_millis(200), 2.0, Duration::from_secs(30))
///     .max_attempts(10)
///     .operation_timeout(Duration::from_secs(20))
///     .supports_read(true)
///     .max_in_flight(8);
/// assert_eq!(spec.item_type(), "file");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TypeSpec {
    spec: v1::ItemTypeSpec,
    /// Set when [`TypeSpec::schema`] was given something that is not a
    /// schema; [`TypeSpec::validate`] reports it.
    schema_problem: Option<String>,
}

impl TypeSpec {
    /// A spec for `item_type` with the server's defaults: modified in place,
    /// default exponential retry, default timeout, no READ, no in-flight limit
    /// of its own.
    pub fn new(item_type: impl Into<String>) -> Self {
        Self {
            spec: v1::ItemTypeSpec {
                item_type: item_type.into(),
                ..v1::ItemTypeSpec::default()
            },
            schema_problem: None,
        }
    }

    /// The item type.
    pub fn item_type(&self) -> &str {
        &self.spec.item_type
    }

    /// Property paths (JSON Pointers such as `/vlan`, which covers
    /// `/vlan/id`) whose change needs a delete + create instead of a Modify;
    /// `"*"` means items of this type are never modified in place. Adds to
    /// the paths already set.
    ///
    /// Each path must be a JSON Pointer (RFC 6901: empty or starting with
    /// `/`, `~` only as `~0` or `~1`) or `*`;
    /// [`AgentBuilder::build`](super::AgentBuilder::build) refuses others
    /// with [`AgentError::InvalidRecreatePath`](super::AgentError::InvalidRecreatePath),
    /// and so does the server at `Register`. Check early with
    /// [`TypeSpec::validate`].
    pub fn recreate_on_change<I, S>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.spec
            .recreate_on_change
            .extend(paths.into_iter().map(Into::into));
        self
    }

    /// Before each Modify, ask the configurator
    /// ([`Configurator::needs_recreate`](super::Configurator::needs_recreate))
    /// whether the change needs a delete + create.
    pub fn ask_needs_recreate(mut self, ask: bool) -> Self {
        self.spec.ask_needs_recreate = ask;
        self
    }

    /// Retry failed operations with growing waits: after the n-th
    /// consecutive failure, `initial * multiplier^(n-1)`, capped at `max`
    /// (the first retry waits `initial`).
    pub fn retry_exponential(mut self, initial: Duration, multiplier: f64, max: Duration) -> Self {
        self.retry_policy().policy = Some(v1::retry_policy::Policy::Exponential(
            v1::ExponentialRetry {
                initial: Some(duration_to_proto(initial)),
                multiplier,
                max: Some(duration_to_proto(max)),
            },
        ));
        self
    }

    /// Retry failed operations after a fixed `wait`.
    pub fn retry_static(mut self, wait: Duration) -> Self {
        self.retry_policy().policy = Some(v1::retry_policy::Policy::StaticRetry(v1::StaticRetry {
            wait: Some(duration_to_proto(wait)),
        }));
        self
    }

    /// Retry failed operations after a uniformly random wait in
    /// `min..=max`.
    pub fn retry_random(mut self, min: Duration, max: Duration) -> Self {
        self.retry_policy().policy = Some(v1::retry_policy::Policy::Random(v1::RandomRetry {
            min: Some(duration_to_proto(min)),
            max: Some(duration_to_proto(max)),
        }));
        self
    }

    /// After `attempts` failed attempts the item fails terminally; 0:
    /// unlimited (the default).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.retry_policy().max_attempts = attempts;
        self
    }

    /// How long an operation may take (between progress reports, for a
    /// long-running one) before the server gives up on the attempt.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.spec.operation_timeout = Some(duration_to_proto(timeout));
        self
    }

    /// The configurator answers READ operations
    /// ([`Configurator::read`](super::Configurator::read)).
    pub fn supports_read(mut self, supported: bool) -> Self {
        self.spec.supports_read = supported;
        self
    }

    /// The most operations of this type running at once, on the server and
    /// in this agent; 0: no limit of its own (the default).
    pub fn max_in_flight(mut self, limit: u32) -> Self {
        self.spec.max_in_flight = limit;
        self
    }

    /// The JSON Schema the `properties` of every item of this type must
    /// satisfy, as a JSON value (a `serde_json::Value` or a
    /// `schemars::Schema`). The server refuses a SubmitIntent whose items do
    /// not satisfy it, with a field violation per problem
    /// (`items[3].properties.port`), before anything is stored or planned,
    /// so the configurator only ever sees valid properties. Replaces a
    /// schema set before.
    ///
    /// Draft 2020-12 unless `$schema` names 2019-09 or draft-07; `$ref`s
    /// only within the schema; `format` is not checked. The server's limits
    /// (32 KiB, 64 levels, a bounded cost per value, linear-time patterns)
    /// are in `docs/security.md`; a schema over them, or one that does not
    /// compile, is refused at `Register` (a permanent
    /// [`AgentError::RegistrationRejected`](super::AgentError::RegistrationRejected)).
    ///
    /// ```
    /// use reconciled_client::agent::TypeSpec;
    /// use reconciled_client::serde_json::json;
    ///
    /// let spec = TypeSpec::new("kv").schema(json!({
    ///     "type": "object",
    ///     "properties": {"key": {"type": "string", "minLength": 1}},
    ///     "required": ["key"],
    /// }));
    /// assert!(spec.to_proto().schema.is_some());
    /// ```
    pub fn schema(mut self, schema: impl Into<Value>) -> Self {
        self.schema_problem = None;
        self.spec.schema = match schema.into() {
            Value::Object(object) => Some(properties_to_struct(&object)),
            // `true` accepts any properties: no schema to send.
            Value::Bool(true) => None,
            Value::Bool(false) => Some(properties_to_struct(&serde_json::Map::from_iter([(
                "not".to_owned(),
                Value::Object(Default::default()),
            )]))),
            other => {
                self.schema_problem = Some(format!(
                    "must be a JSON object (or true / false), not {other}"
                ));
                None
            }
        };
        self
    }

    /// The JSON Schema of `T` (draft 2020-12, as `schemars` derives it) as
    /// the type's schema: [`TypeSpec::schema`] with
    /// `schemars::schema_for!(T)`. Derive `JsonSchema` next to
    /// `Deserialize` on the struct the configurator reads the properties
    /// into ([`Item::properties_as`](super::Item::properties_as)), and the
    /// server enforces what the struct expects:
    ///
    /// ```
    /// use reconciled_client::prelude::*;
    /// use reconciled_client::{schemars, serde};
    ///
    /// #[derive(serde::Deserialize, JsonSchema)]
    /// #[serde(crate = "reconciled_client::serde", deny_unknown_fields)]
    /// #[schemars(crate = "reconciled_client::schemars")]
    /// struct Listener {
    ///     /// The TCP port.
    ///     port: u16,
    ///     #[serde(default)]
    ///     host: Option<String>,
    /// }
    ///
    /// let spec = TypeSpec::new("listener").schema_of::<Listener>();
    /// let schema = spec.to_proto().schema.expect("a schema");
    /// assert!(schema.fields.contains_key("required"));
    /// ```
    pub fn schema_of<T: JsonSchema>(self) -> Self {
        self.schema(schemars::SchemaGenerator::default().into_root_schema_for::<T>())
    }

    /// Checks what the spec declares: every `recreate_on_change` path must
    /// be a JSON Pointer or `*`, and a schema must be a JSON object. The
    /// error names the type and the path.
    ///
    /// ```
    /// use reconciled_client::agent::TypeSpec;
    ///
    /// assert!(TypeSpec::new("kv").recreate_on_change(["/key"]).validate().is_ok());
    /// let error = TypeSpec::new("kv").recreate_on_change(["key"]).validate().unwrap_err();
    /// assert!(error.to_string().contains("\"kv\""));
    /// assert!(error.to_string().contains("\"key\""));
    /// ```
    pub fn validate(&self) -> Result<(), AgentError> {
        if let Some(problem) = &self.schema_problem {
            return Err(AgentError::InvalidSchema {
                item_type: self.spec.item_type.clone(),
                problem: problem.clone(),
            });
        }
        for path in &self.spec.recreate_on_change {
            check_recreate_path(path).map_err(|problem| AgentError::InvalidRecreatePath {
                item_type: self.spec.item_type.clone(),
                path: path.clone(),
                problem,
            })?;
        }
        Ok(())
    }

    /// The most operations of this type running at once; 0: no limit.
    pub fn in_flight_limit(&self) -> u32 {
        self.spec.max_in_flight
    }

    /// The spec as sent in `Register`.
    pub fn to_proto(&self) -> v1::ItemTypeSpec {
        self.spec.clone()
    }

    fn retry_policy(&mut self) -> &mut v1::RetryPolicy {
        self.spec
            .retry_policy
            .get_or_insert_with(v1::RetryPolicy::default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_carries_every_setting_to_the_wire() {
        let spec = TypeSpec::new("file")
            .recreate_on_change(["/path"])
            .recreate_on_change(vec![String::from("/owner")])
            .ask_needs_recreate(true)
            .retry_exponential(Duration::from_millis(100), 2.0, Duration::from_secs(10))
            .max_attempts(5)
            .operation_timeout(Duration::from_secs(30))
            .supports_read(true)
            .max_in_flight(4)
            .to_proto();
        assert_eq!(spec.item_type, "file");
        assert_eq!(spec.recreate_on_change, ["/path", "/owner"]);
        assert!(spec.ask_needs_recreate);
        assert!(spec.supports_read);
        assert_eq!(spec.max_in_flight, 4);
        assert_eq!(spec.operation_timeout.map(|d| d.seconds), Some(30));
        let policy = spec.retry_policy.expect("a retry policy");
        assert_eq!(policy.max_attempts, 5);
        match policy.policy {
            Some(v1::retry_policy::Policy::Exponential(exponential)) => {
                assert_eq!(exponential.multiplier, 2.0);
                assert_eq!(exponential.max.map(|d| d.seconds), Some(10));
            }
            other => panic!("unexpected policy {other:?}"),
        }
    }

    #[test]
    fn recreate_paths_must_be_json_pointers() {
        for good in [&["/key"][..], &["*"], &["/a~1b", "/c"], &[""]] {
            let spec = TypeSpec::new("kv").recreate_on_change(good.iter().copied());
            assert!(spec.validate().is_ok(), "{good:?}");
        }
        for bad in ["key", "/a~2"] {
            let error = TypeSpec::new("kv")
                .recreate_on_change(["/fine", bad])
                .validate()
                .expect_err("refused");
            match &error {
                AgentError::InvalidRecreatePath {
                    item_type, path, ..
                } => assert_eq!((item_type.as_str(), path.as_str()), ("kv", bad)),
                other => panic!("unexpected error {other:?}"),
            }
        }
    }

    #[test]
    fn a_schema_goes_to_the_wire_and_a_non_schema_is_refused() {
        use serde_json::json;

        let spec = TypeSpec::new("kv").schema(json!({"type": "object", "required": ["key"]}));
        assert!(spec.validate().is_ok());
        let schema = spec.to_proto().schema.expect("a schema");
        assert!(schema.fields.contains_key("required"));
        assert_eq!(TypeSpec::new("kv").schema(true).to_proto().schema, None);
        let nothing = TypeSpec::new("kv").schema(false).to_proto().schema;
        assert!(nothing.is_some_and(|s| s.fields.contains_key("not")));
        let refused = TypeSpec::new("kv").schema(json!(["no"])).validate();
        assert!(
            matches!(&refused, Err(AgentError::InvalidSchema { item_type, .. }) if item_type == "kv"),
            "{refused:?}"
        );
    }

    #[test]
    fn a_derived_schema_lists_the_struct_fields() {
        #[derive(schemars::JsonSchema)]
        #[allow(dead_code)]
        struct Listener {
            port: u16,
            host: Option<String>,
        }
        let schema = TypeSpec::new("listener")
            .schema_of::<Listener>()
            .to_proto()
            .schema
            .expect("a schema");
        let properties = schema.fields.get("properties").expect("properties");
        let Some(prost_types::value::Kind::StructValue(properties)) = &properties.kind else {
            panic!("properties is an object: {properties:?}");
        };
        assert!(properties.fields.contains_key("port"));
        assert!(properties.fields.contains_key("host"));
    }

    #[test]
    fn max_attempts_alone_keeps_the_default_policy() {
        let spec = TypeSpec::new("dir").max_attempts(3).to_proto();
        let policy = spec.retry_policy.expect("a retry policy");
        assert_eq!(policy.policy, None);
        assert_eq!(policy.max_attempts, 3);
        assert_eq!(TypeSpec::new("dir").to_proto().retry_policy, None);
    }
}
