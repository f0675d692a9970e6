//! A key/value agent: each `kv` item `{"key": "motd", "value": "hi"}` is the
//! file `<root>/motd` holding `hi`. Written only against
//! `reconciled_client::prelude` (see `docs/agents.md`).
#![forbid(unsafe_code)]

use std::path::PathBuf;

use reconciled_client::prelude::*;

/// Manages `kv` items as files under a root folder.
pub struct KvFiles {
    /// The folder every key is a file in.
    pub root: PathBuf,
}

impl KvFiles {
    /// The file of `item`'s key, or `INVALID_ARGUMENT` (terminal).
    fn path(&self, item: &Item) -> Result<PathBuf, Outcome> {
        match item.property("key").and_then(Value::as_str) {
            Some(key) if !key.is_empty() && !key.contains('/') && !key.starts_with('.') => {
                Ok(self.root.join(key))
            }
            _ => Err(Outcome::invalid_argument(format!(
                "{}: set \"key\" to a file name without '/'",
                item.item_ref()
            ))),
        }
    }

    async fn write(&self, ctx: &OperationContext, item: &Item) -> Outcome {
        let path = match self.path(item) {
            Ok(path) => path,
            Err(outcome) => return outcome,
        };
        if ctx.is_cancelled() {
            return Outcome::cancelled(); // nothing written: not an attempt
        }
        let value = item.property("value").and_then(Value::as_str).unwrap_or("");
        match tokio::fs::write(&path, value).await {
            Ok(()) => Outcome::done_observed(item.properties.clone()),
            Err(error) => Outcome::unavailable(format!("cannot write {}: {error}", path.display())),
        }
    }
}

impl Configurator for KvFiles {
    async fn create(&self, ctx: &OperationContext, item: &Item) -> Outcome {
        self.write(ctx, item).await
    }

    async fn modify(&self, ctx: &OperationContext, _previous: &Item, item: &Item) -> Outcome {
        // "/key" is recreate_on_change: a Modify only ever changes the value.
        self.write(ctx, item).await
    }

    async fn delete(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
        let path = match self.path(item) {
            Ok(path) => path,
            Err(outcome) => return outcome,
        };
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Outcome::done(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Outcome::done(),
            Err(error) => {
                Outcome::unavailable(format!("cannot remove {}: {error}", path.display()))
            }
        }
    }

    async fn read(&self, _ctx: &OperationContext, item: &Item) -> ReadOutcome {
        let Ok(path) = self.path(item) else {
            return ReadOutcome::NotFound;
        };
        match tokio::fs::read_to_string(&path).await {
            Ok(value) => {
                let mut observed = item.properties.clone();
                observed.insert("value".into(), json!(value));
                ReadOutcome::Found { observed }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => ReadOutcome::NotFound,
            Err(error) => ReadOutcome::Failed {
                code: Code::Unavailable,
                message: format!("cannot read {}: {error}", path.display()),
            },
        }
    }
}

/// The `kv` type: a new key is a new file (recreate), READ detects drift,
/// five failed attempts make an item fail terminally.
pub fn kv_type() -> TypeSpec {
    TypeSpec::new("kv")
        .recreate_on_change(["/key"])
        .supports_read(true)
        .max_attempts(5)
}
