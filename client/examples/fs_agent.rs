//! An example configurator agent that manages real directories and files
//! under a root folder.
//!
//! ```sh
//! cargo run -p reconciled-client --example fs_agent -- \
//!     --addr http://127.0.0.1:50051 --token "$TOKEN" --tenant acme --root /tmp/fs-root
//! ```
//!
//! `--addr` and `--token` may also come from `RECONCILED_ADDR` and
//! `RECONCILED_TOKEN` (and `--tenant` from `RECONCILED_TENANT`).
//!
//! Item types:
//!
//! - `directory`, properties `{"path": "etc"}`: a directory, relative to the
//!   root. Changing `path` recreates it (and, through the planner's cascade,
//!   every file that depends on it). Deleting a directory that still holds
//!   files nobody manages fails with `FAILED_PRECONDITION`.
//! - `file`, properties `{"path": "etc/motd", "content": "hello\n", "mode": 420}`:
//!   a file with that content and mode (420 = 0o644; default 420, content
//!   default empty). It should depend on its directory's item; until the
//!   directory exists, a create fails with `UNAVAILABLE` and is retried.
//!   Changing `path` recreates it; changing `content` or `mode` modifies it
//!   in place (written to a temporary file, then renamed).
//!
//! Both types answer READ, so the server can detect drift (someone edited a
//! file) and resolve items whose outcome is unknown. Every operation is
//! idempotent: creating what exists rewrites it, deleting what is gone is
//! success. Paths that are empty, absolute or contain `..` are refused with
//! `INVALID_ARGUMENT` (terminal). Symbolic links inside the root are trusted.
//!
//! An intent for it (with grpcurl; `reconctl` works too):
//!
//! ```sh
//! grpcurl -plaintext -H "authorization: Bearer $TOKEN" -d '{
//!   "tenant": "acme",
//!   "items": [
//!     {"type": "directory", "name": "etc", "properties": {"path": "etc"}},
//!     {"type": "file", "name": "motd",
//!      "properties": {"path": "etc/motd", "content": "hello\n", "mode": 420},
//!      "dependencies": [{"requires": {"type": "directory", "name": "etc"}}]}
//!   ]}' 127.0.0.1:50051 reconciled.v1.Reconciler/SubmitIntent
//! ```

use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use reconciled_client::prelude::*;
use serde::Deserialize;

/// The fs_agent example: manages directories and files under a root folder.
#[derive(Debug, Parser)]
#[command(
    name = "fs_agent",
    about = "A reconciled agent that manages directories and files under a root folder"
)]
struct Args {
    /// The reconciled server.
    #[arg(
        long,
        env = "RECONCILED_ADDR",
        default_value = "http://127.0.0.1:50051"
    )]
    addr: String,
    /// The tenant's token.
    #[arg(long, env = "RECONCILED_TOKEN", hide_env_values = true)]
    token: String,
    /// The tenant whose items this agent applies.
    #[arg(long, env = "RECONCILED_TENANT")]
    tenant: String,
    /// The folder every managed path is relative to (created if missing).
    #[arg(long)]
    root: PathBuf,
    /// A stable, unique agent id (default: the host name).
    #[arg(long)]
    agent_id: Option<String>,
}

/// The mode of a file whose intent does not set one: 0o644.
const DEFAULT_MODE: u32 = 0o644;

fn default_mode() -> u32 {
    DEFAULT_MODE
}

#[derive(Debug, Deserialize)]
struct DirectoryProperties {
    path: String,
}

#[derive(Debug, Deserialize)]
struct FileProperties {
    path: String,
    #[serde(default)]
    content: String,
    #[serde(default = "default_mode")]
    mode: u32,
}

/// The root folder every path is resolved against.
#[derive(Debug)]
struct Root {
    path: PathBuf,
}

impl Root {
    /// `relative` under the root, or `INVALID_ARGUMENT` if it would leave it.
    fn resolve(&self, relative: &str) -> Result<PathBuf, Outcome> {
        let path = Path::new(relative);
        let mut names = 0;
        for component in path.components() {
            match component {
                Component::Normal(_) => names += 1,
                Component::CurDir => {}
                Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                    return Err(Outcome::invalid_argument(format!(
                        "path {relative:?} leaves the root folder; use a relative path without '..'"
                    )));
                }
            }
        }
        if names == 0 {
            return Err(Outcome::invalid_argument(format!(
                "path {relative:?} names no file or directory under the root; set a relative path such as \"etc\""
            )));
        }
        Ok(self.path.join(path))
    }
}

/// An I/O error as an outcome: permission problems are terminal, everything
/// else is retried.
fn io_failure(what: &str, path: &Path, error: &io::Error) -> Outcome {
    let code = match error.kind() {
        io::ErrorKind::PermissionDenied => Code::PermissionDenied,
        _ => Code::Unavailable,
    };
    Outcome::failed(code, format!("{what} {}: {error}", path.display()))
}

/// Manages items of type `directory`.
struct Directories {
    root: Arc<Root>,
}

impl Directories {
    async fn ensure(&self, item: &Item) -> Result<Outcome, Outcome> {
        let properties: DirectoryProperties = item.properties_as()?;
        let path = self.root.resolve(&properties.path)?;
        match tokio::fs::metadata(&path).await {
            Ok(metadata) if !metadata.is_dir() => {
                return Err(Outcome::failed(
                    Code::FailedPrecondition,
                    format!(
                        "{} exists and is not a directory; remove it or choose another path",
                        path.display()
                    ),
                ));
            }
            _ => {}
        }
        tokio::fs::create_dir_all(&path)
            .await
            .map_err(|error| io_failure("cannot create directory", &path, &error))?;
        Ok(Outcome::done_observed(directory_observed(&properties.path)))
    }
}

fn directory_observed(path: &str) -> Properties {
    let mut observed = Properties::new();
    observed.insert("path".into(), json!(path));
    observed
}

impl Configurator for Directories {
    async fn create(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
        self.ensure(item).await.into()
    }

    async fn modify(&self, _ctx: &OperationContext, _previous: &Item, item: &Item) -> Outcome {
        // `path` is recreate_on_change, so a Modify never moves the directory.
        self.ensure(item).await.into()
    }

    async fn delete(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
        let removed: Result<Outcome, Outcome> = async {
            let properties: DirectoryProperties = item.properties_as()?;
            let path = self.root.resolve(&properties.path)?;
            match tokio::fs::remove_dir(&path).await {
                Ok(()) => Ok(Outcome::done()),
                Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Outcome::done()),
                Err(error) if error.kind() == io::ErrorKind::DirectoryNotEmpty => Err(Outcome::failed(
                    Code::FailedPrecondition,
                    format!(
                        "{} still holds files no item manages; remove them, then change the intent to retry",
                        path.display()
                    ),
                )),
                Err(error) => Err(io_failure("cannot remove directory", &path, &error)),
            }
        }
        .await;
        removed.into()
    }

    async fn read(&self, _ctx: &OperationContext, item: &Item) -> ReadOutcome {
        let properties: DirectoryProperties = match item.properties_as() {
            Ok(properties) => properties,
            Err(error) => return error.into(),
        };
        let path = match self.root.resolve(&properties.path) {
            Ok(path) => path,
            Err(_) => return ReadOutcome::NotFound,
        };
        match tokio::fs::metadata(&path).await {
            Ok(metadata) if metadata.is_dir() => ReadOutcome::Found {
                observed: directory_observed(&properties.path),
            },
            Ok(_) => ReadOutcome::NotFound,
            Err(error) if error.kind() == io::ErrorKind::NotFound => ReadOutcome::NotFound,
            Err(error) => ReadOutcome::Failed {
                code: Code::Unavailable,
                message: format!("cannot inspect {}: {error}", path.display()),
            },
        }
    }
}

/// Manages items of type `file`.
struct Files {
    root: Arc<Root>,
}

impl Files {
    async fn write(&self, ctx: &OperationContext, item: &Item) -> Result<Outcome, Outcome> {
        let properties: FileProperties = item.properties_as()?;
        if properties.mode > 0o7777 {
            return Err(Outcome::invalid_argument(format!(
                "mode {} is not a permission mode; use a number up to 4095 (0o7777), e.g. 420 for 0o644",
                properties.mode
            )));
        }
        let path = self.root.resolve(&properties.path)?;
        let Some(parent) = path.parent() else {
            return Err(Outcome::invalid_argument("the path names no file"));
        };
        if !tokio::fs::metadata(parent)
            .await
            .is_ok_and(|metadata| metadata.is_dir())
        {
            return Err(Outcome::unavailable(format!(
                "directory {} does not exist yet; declare a dependency on the directory item that creates it",
                parent.display()
            )));
        }
        if ctx.is_cancelled() {
            // Nothing written yet: the item is as it was, so this is not a
            // failed attempt.
            return Err(Outcome::cancelled());
        }
        // Write beside the target and rename over it, so a reader never sees
        // half a file.
        let file_name = path
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temporary = parent.join(format!(".{file_name}.fs-agent-{}", ctx.op_id()));
        let written = async {
            tokio::fs::write(&temporary, properties.content.as_bytes()).await?;
            set_mode(&temporary, properties.mode).await?;
            tokio::fs::rename(&temporary, &path).await
        }
        .await;
        if let Err(error) = written {
            let _ = tokio::fs::remove_file(&temporary).await;
            return Err(io_failure("cannot write file", &path, &error));
        }
        Ok(Outcome::done_observed(file_observed(
            &properties.path,
            &properties.content,
            properties.mode,
        )))
    }

    async fn remove(&self, item: &Item) -> Result<Outcome, Outcome> {
        let properties: FileProperties = item.properties_as()?;
        let path = self.root.resolve(&properties.path)?;
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(Outcome::done()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Outcome::done()),
            Err(error) => Err(io_failure("cannot remove file", &path, &error)),
        }
    }
}

fn file_observed(path: &str, content: &str, mode: u32) -> Properties {
    let mut observed = Properties::new();
    observed.insert("path".into(), json!(path));
    observed.insert("content".into(), json!(content));
    observed.insert("mode".into(), json!(mode));
    observed
}

#[cfg(unix)]
async fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    tokio::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).await
}

#[cfg(not(unix))]
async fn set_mode(_path: &Path, _mode: u32) -> io::Result<()> {
    Ok(())
}

#[cfg(unix)]
fn mode_of(metadata: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    metadata.permissions().mode() & 0o7777
}

#[cfg(not(unix))]
fn mode_of(_metadata: &std::fs::Metadata) -> u32 {
    DEFAULT_MODE
}

impl Configurator for Files {
    async fn create(&self, ctx: &OperationContext, item: &Item) -> Outcome {
        self.write(ctx, item).await.into()
    }

    async fn modify(&self, ctx: &OperationContext, previous: &Item, item: &Item) -> Outcome {
        let modified: Result<Outcome, Outcome> = async {
            // `path` is recreate_on_change, but stay correct if a server ever
            // moves a file in place: remove the old one after writing.
            let outcome = self.write(ctx, item).await?;
            let old_path = previous.properties_as::<FileProperties>().map(|p| p.path);
            let new_path = item.properties_as::<FileProperties>().map(|p| p.path);
            if let (Ok(old_path), Ok(new_path)) = (old_path, new_path)
                && old_path != new_path
            {
                self.remove(previous).await?;
            }
            Ok(outcome)
        }
        .await;
        modified.into()
    }

    async fn delete(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
        self.remove(item).await.into()
    }

    async fn read(&self, _ctx: &OperationContext, item: &Item) -> ReadOutcome {
        let properties: FileProperties = match item.properties_as() {
            Ok(properties) => properties,
            Err(error) => return error.into(),
        };
        let path = match self.root.resolve(&properties.path) {
            Ok(path) => path,
            Err(_) => return ReadOutcome::NotFound,
        };
        let metadata = match tokio::fs::metadata(&path).await {
            Ok(metadata) if metadata.is_file() => metadata,
            Ok(_) => return ReadOutcome::NotFound,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return ReadOutcome::NotFound,
            Err(error) => {
                return ReadOutcome::Failed {
                    code: Code::Unavailable,
                    message: format!("cannot inspect {}: {error}", path.display()),
                };
            }
        };
        match tokio::fs::read(&path).await {
            Ok(bytes) => ReadOutcome::Found {
                observed: file_observed(
                    &properties.path,
                    &String::from_utf8_lossy(&bytes),
                    mode_of(&metadata),
                ),
            },
            Err(error) if error.kind() == io::ErrorKind::NotFound => ReadOutcome::NotFound,
            Err(error) => ReadOutcome::Failed {
                code: Code::Unavailable,
                message: format!("cannot read {}: {error}", path.display()),
            },
        }
    }
}

/// Adds the `directory` and `file` types, managed under `root`.
fn with_item_types(builder: AgentBuilder, root: Arc<Root>) -> AgentBuilder {
    builder
        .item_type(
            TypeSpec::new("directory")
                .recreate_on_change(["/path"])
                .supports_read(true),
            Directories {
                root: Arc::clone(&root),
            },
        )
        .item_type(
            TypeSpec::new("file")
                .recreate_on_change(["/path"])
                .supports_read(true)
                .max_in_flight(16),
            Files { root },
        )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();

    std::fs::create_dir_all(&args.root)
        .with_context(|| format!("cannot create the root folder {}", args.root.display()))?;
    let root = Arc::new(Root {
        path: args
            .root
            .canonicalize()
            .with_context(|| format!("cannot resolve the root folder {}", args.root.display()))?,
    });
    tracing::info!(root = %root.path.display(), tenant = %args.tenant, addr = %args.addr, "Starting fs_agent.");

    let mut builder = with_item_types(Agent::builder(args.addr, args.tenant, args.token), root);
    if let Some(agent_id) = args.agent_id {
        builder = builder.agent_id(agent_id);
    }
    let agent = builder.build()?;
    agent.run(shutdown_signal()).await?;
    tracing::info!("fs_agent stopped.");
    Ok(())
}

#[cfg(test)]
mod tests {
    use reconciled_client::testkit::TestServer;

    use super::*;

    /// The agent against the real server: the testkit starts `reconciled`,
    /// the intent converges, the files are there; an empty intent removes
    /// them again.
    #[tokio::test]
    async fn directories_and_files_converge_and_go_away() {
        let root = tempfile::tempdir().expect("a temporary root");
        let root = Arc::new(Root {
            path: root.path().canonicalize().expect("root"),
        });
        let server = TestServer::start().await.expect("the server starts");
        let tenant = server.tenant("acme").await.expect("a tenant");
        let agent = tenant
            .start_agent(with_item_types(tenant.agent("fs-1"), Arc::clone(&root)))
            .await
            .expect("the agent registers");

        let motd = Item::new("file", "motd")
            .with_properties(&json!({"path": "etc/motd", "content": "hi\n", "mode": 0o600}))
            .expect("properties")
            .depends_on(ItemRef::new("directory", "etc"));
        let etc = Item::new("directory", "etc").with_property("path", "etc");
        tenant.converge([etc, motd]).await.expect("converges");
        let written = std::fs::read_to_string(root.path.join("etc/motd")).expect("motd exists");
        assert_eq!(written, "hi\n");

        tenant.converge([]).await.expect("converges to nothing");
        assert!(!root.path.join("etc").exists(), "the directory is gone");
        agent.stop().await.expect("the agent stops cleanly");
    }

    #[test]
    fn paths_that_leave_the_root_are_refused() {
        let root = Root {
            path: PathBuf::from("/srv/root"),
        };
        assert_eq!(
            root.resolve("etc/motd").ok(),
            Some(PathBuf::from("/srv/root/etc/motd"))
        );
        for bad in ["../etc", "/etc/passwd", "a/../../b", "", ".", "./"] {
            match root.resolve(bad) {
                Err(Outcome::Failed { code, .. }) => {
                    assert_eq!(code, Code::InvalidArgument, "{bad:?}")
                }
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }
}
