//! `reconctl`, the operator CLI, against the real server: tenants, intent
//! files, graphs in every format, `reconcile --wait` and its exit codes,
//! watch, status, fleet, where settings come from, and the README
//! quickstart with the `fs_agent` example.
//!
//! Every run clears the `RECONCILED_*` environment and points `HOME` at an
//! empty directory, so that nothing of the machine's own configuration
//! leaks in.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reconciled_client::agent::{ItemRef, OperationKind, TypeSpec};
use reconciled_tests::agents::{Recorder, RunningAgent, Step, TestTenant};
use reconciled_tests::proto::v1;
use reconciled_tests::{
    ServerOptions, ServerProcess, example_binary, workspace_binary, workspace_root,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tonic::Code;

/// How long one reconctl run may take.
const RUN_DEADLINE: Duration = Duration::from_secs(30);

/// The example intent of the README quickstart.
fn site_json() -> PathBuf {
    workspace_root().join("deploy/examples/site.json")
}

/// What a reconctl run printed and how it exited.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts exit code `code`; returns the run.
    #[track_caller]
    fn expect(self, code: i32) -> Run {
        assert_eq!(
            self.code, code,
            "expected exit code {code}; stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// Asserts success; returns the run.
    #[track_caller]
    fn ok(self) -> Run {
        self.expect(0)
    }

    /// Standard output parsed as JSON.
    #[track_caller]
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("not JSON ({error}):\n{}", self.stdout))
    }
}

/// reconctl with a clean environment, pointed at one server.
struct Reconctl {
    binary: PathBuf,
    env: Vec<(String, String)>,
    home: tempfile::TempDir,
}

impl Reconctl {
    /// reconctl for `server`: `RECONCILED_ADDR` is its endpoint.
    fn new(server: &ServerProcess) -> Self {
        Self::at(&server.endpoint())
    }

    /// reconctl with `RECONCILED_ADDR=addr`.
    fn at(addr: &str) -> Self {
        Self {
            binary: workspace_binary("reconctl"),
            env: vec![("RECONCILED_ADDR".into(), addr.into())],
            home: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// Sets an environment variable for every run.
    fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// The empty home directory runs get.
    fn home(&self) -> &Path {
        self.home.path()
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.binary);
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy().into_owned();
            if name.starts_with("RECONCILED_") || name.starts_with("RECONCTL_") {
                command.env_remove(&name);
            }
        }
        command
            .env("HOME", self.home.path())
            .env("XDG_CONFIG_HOME", self.home.path().join(".config"))
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .args(args)
            .current_dir(workspace_root())
            .kill_on_drop(true);
        command
    }

    /// Runs `reconctl args...` to completion.
    async fn run(&self, args: &[&str]) -> Run {
        self.run_with_input(args, None).await
    }

    /// Runs `reconctl args...` with `input` on standard input.
    async fn run_with_input(&self, args: &[&str], input: Option<&str>) -> Run {
        let mut child = self
            .command(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("reconctl starts");
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(text.as_bytes()).await.expect("write stdin");
        }
        let output = tokio::time::timeout(RUN_DEADLINE, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("reconctl {args:?} did not finish within {RUN_DEADLINE:?}"))
            .expect("reconctl runs");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Starts `reconctl args...` with its standard output readable line by
    /// line.
    fn spawn(&self, args: &[&str]) -> Lines {
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("reconctl starts");
        let stdout = child.stdout.take().expect("piped stdout");
        Lines {
            lines: BufReader::new(stdout).lines(),
            seen: Vec::new(),
            child,
        }
    }
}

/// The output of a running reconctl, line by line.
struct Lines {
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    seen: Vec<String>,
    child: tokio::process::Child,
}

impl Lines {
    /// Reads lines until `accept` takes one, for at most [`RUN_DEADLINE`].
    async fn wait_for(&mut self, what: &str, accept: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + RUN_DEADLINE;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    self.seen.push(line.clone());
                    if accept(&line) {
                        return line;
                    }
                }
                Ok(Ok(None)) => {
                    let mut stderr = String::new();
                    if let Some(mut pipe) = self.child.stderr.take() {
                        let _ =
                            tokio::io::AsyncReadExt::read_to_string(&mut pipe, &mut stderr).await;
                    }
                    panic!(
                        "reconctl ended before printing {what}; it printed {:#?} and on stderr: \
                         {stderr}",
                        self.seen
                    )
                }
                Ok(Err(error)) => panic!("cannot read reconctl's output: {error}"),
                Err(_) => panic!(
                    "reconctl did not print {what} within {RUN_DEADLINE:?}; it printed {:#?}",
                    self.seen
                ),
            }
        }
    }
}

/// reconctl with the admin token of `server`.
fn admin(server: &ServerProcess) -> Reconctl {
    Reconctl::new(server).env("RECONCILED_TOKEN", &server.admin_token())
}

/// reconctl with the token of `tenant`, scoped to it.
fn tenant_cli(tenant: &TestTenant) -> Reconctl {
    Reconctl::new(&tenant.server)
        .env("RECONCILED_TOKEN", &tenant.token)
        .env("RECONCILED_TENANT", &tenant.name)
}

/// A tenant `acme` with one agent handling `directory` and `file` items
/// with `recorder`.
async fn tenant_with_agent(recorder: &Recorder) -> (TestTenant, RunningAgent) {
    let tenant = TestTenant::start("acme").await;
    let mut agent = RunningAgent::start(
        tenant
            .agent("agent-1")
            .item_type(TypeSpec::new("directory"), recorder.clone())
            .item_type(TypeSpec::new("file"), recorder.clone()),
    );
    agent.connected().await;
    (tenant, agent)
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write file");
    path.to_str().expect("utf-8 path").to_owned()
}

#[tokio::test]
async fn tenant_commands_create_list_get_rotate_and_delete() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("server starts");
    let admin = admin(&server);

    let token = admin
        .run(&["tenant", "create", "acme", "--quiet"])
        .await
        .ok();
    let token = token.stdout.trim().to_owned();
    assert!(
        !token.is_empty() && !token.contains(char::is_whitespace),
        "{token:?}"
    );
    let human = admin.run(&["tenant", "create", "beta"]).await.ok();
    assert!(
        human.stdout.contains("tenant beta created\ntoken: "),
        "{human:?}"
    );

    let acme = Reconctl::new(&server).env("RECONCILED_TOKEN", &token);
    let status = acme.run(&["status", "--tenant", "acme"]).await.ok();
    assert!(
        status.stdout.starts_with("tenant:      acme\n"),
        "{status:?}"
    );

    let list = admin
        .run(&["tenant", "list", "-o", "json"])
        .await
        .ok()
        .json();
    let names: Vec<&str> = list["tenants"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|tenant| tenant["name"].as_str())
        .collect();
    assert_eq!(names, ["acme", "beta"]);

    let got = admin
        .run(&["tenant", "get", "acme", "-o", "yaml"])
        .await
        .ok();
    let got: Value = serde_yaml::from_str(&got.stdout).expect("YAML");
    assert_eq!(got["name"], "acme");
    assert_eq!(got["status"]["tenant"], "acme");

    let taken = admin.run(&["tenant", "create", "acme"]).await.expect(1);
    assert!(taken.stderr.contains("create tenant \"acme\""), "{taken:?}");

    let rotated = admin
        .run(&["tenant", "rotate-token", "acme", "-q"])
        .await
        .ok();
    let new_token = rotated.stdout.trim();
    assert_ne!(new_token, token);
    let refused = acme.run(&["status", "--tenant", "acme"]).await.expect(1);
    assert!(
        refused
            .stderr
            .contains("refused the token from RECONCILED_TOKEN"),
        "the old token stops working and the error names its source: {refused:?}"
    );
    Reconctl::new(&server)
        .run(&["status", "--tenant", "acme", "--token", new_token])
        .await
        .ok();

    let not_admin = acme.run(&["fleet", "--token", new_token]).await.expect(1);
    assert!(
        not_admin
            .stderr
            .contains("token from --token may not do this"),
        "{not_admin:?}"
    );

    admin.run(&["tenant", "delete", "acme"]).await.ok();
    let gone = admin.run(&["tenant", "get", "acme"]).await.expect(1);
    assert!(gone.stderr.contains("not found"), "{gone:?}");
}

#[tokio::test]
async fn intent_submit_plans_applies_and_guards_the_generation() {
    let recorder = Recorder::new();
    let (tenant, _agent) = tenant_with_agent(&recorder).await;
    let cli = tenant_cli(&tenant);
    let site = site_json();
    let site = site.to_str().expect("utf-8 path");

    let plan = cli
        .run(&["intent", "submit", "-f", site, "--dry-run"])
        .await
        .ok();
    assert!(
        plan.stdout.starts_with("dry run: nothing stored"),
        "{plan:?}"
    );
    assert!(
        plan.stdout
            .contains("plan: 2 create, 0 modify, 0 delete; 0 waiting"),
        "{plan:?}"
    );
    assert!(
        plan.stdout.contains("0  CREATE     directory/etc")
            && plan.stdout.contains("1  CREATE     file/config    0"),
        "the file waits for its directory: {plan:?}"
    );
    let status = tenant.status().await;
    assert_eq!(
        (status.generation, status.intended_items),
        (0, 0),
        "a dry run stores nothing"
    );

    // The same intent in YAML, tenant from the environment.
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = write(
        dir.path(),
        "site.yaml",
        "items:\n  - type: directory\n    name: etc\n    properties: {path: etc/app}\n  \
         - type: file\n    name: config\n    properties: {path: etc/app/app.conf, content: \"listen = 8080\\n\", mode: 420}\n    \
         dependencies:\n      - requires: directory/etc\n",
    );
    let accepted = cli.run(&["intent", "submit", "-f", &yaml]).await.ok();
    assert!(
        accepted
            .stdout
            .starts_with("intent accepted: generation 1,"),
        "{accepted:?}"
    );
    let again = cli
        .run(&["intent", "submit", "-f", site, "-o", "json"])
        .await
        .ok()
        .json();
    assert_eq!(
        again["changed"], false,
        "the JSON file says the same: {again}"
    );
    assert_eq!(again["generation"], 1);

    let converged = cli.run(&["reconcile", "--wait"]).await.ok();
    assert!(
        converged.stdout.contains("converged: tenant acme"),
        "{converged:?}"
    );
    assert_eq!(
        recorder.labels(),
        ["create directory/etc", "create file/config"]
    );

    let mismatch = cli
        .run(&["intent", "submit", "-f", site, "--expected-generation", "7"])
        .await
        .expect(1);
    assert!(
        mismatch.stderr.contains("GENERATION_MISMATCH")
            && mismatch.stderr.contains("reconctl status"),
        "{mismatch:?}"
    );
    cli.run(&["intent", "submit", "-f", site, "--expected-generation", "1"])
        .await
        .ok();

    let typo = write(
        dir.path(),
        "typo.yaml",
        "items:\n  - type: file\n    name: a\n    dependencies:\n      - require: directory/etc\n",
    );
    let refused = cli.run(&["intent", "submit", "-f", &typo]).await.expect(1);
    assert!(
        refused
            .stderr
            .contains("items[0].dependencies[0].require: unknown field"),
        "{refused:?}"
    );

    // The server's validation comes back with its field paths.
    let duplicate = r#"{"items": [{"type": "file", "name": "a"}, {"type": "file", "name": "a"}]}"#;
    let invalid = cli
        .run_with_input(&["intent", "submit", "-f", "-"], Some(duplicate))
        .await
        .expect(1);
    assert!(invalid.stderr.contains("\n  items[1]"), "{invalid:?}");

    let other = cli
        .run(&["intent", "submit", "-f", site, "--tenant", "beta"])
        .await
        .expect(2);
    assert!(
        other
            .stderr
            .contains("is for tenant \"acme\" but --tenant names tenant \"beta\""),
        "{other:?}"
    );
    assert_eq!(tenant.status().await.generation, 1, "nothing was stored");
}

#[tokio::test]
async fn graph_get_shows_states_in_tables_json_yaml_and_dot_and_a_stall_exits_3() {
    let recorder = Recorder::new();
    recorder.script(
        OperationKind::Create,
        ItemRef::new("file", "broken"),
        [Step::Fail(Code::InvalidArgument)],
    );
    let (tenant, _agent) = tenant_with_agent(&recorder).await;
    let cli = tenant_cli(&tenant);
    let dir = tempfile::tempdir().expect("temp dir");
    let intent = write(
        dir.path(),
        "intent.yaml",
        r#"
items:
  - {type: directory, name: etc, properties: {path: etc}}
  - type: file
    name: config
    subgraph: app
    properties: {path: etc/app.conf}
    dependencies: [{requires: directory/etc}]
  - type: file
    name: broken
    subgraph: app/extra
    properties: {path: etc/broken}
    dependencies: [{requires: directory/etc}]
  - {type: uplink, name: wan, external: true}
"#,
    );
    cli.run(&["intent", "submit", "-f", &intent]).await.ok();

    let stalled = cli.run(&["reconcile", "--wait"]).await.expect(3);
    assert!(
        stalled.stdout.contains("stalled: tenant acme"),
        "{stalled:?}"
    );
    assert!(
        stalled
            .stdout
            .lines()
            .any(|line| line.starts_with("file/broken") && line.contains("FAILED")),
        "the result lists the failed item: {stalled:?}"
    );

    let table = cli.run(&["graph", "get"]).await.ok();
    let row = |id: &str| {
        table
            .stdout
            .lines()
            .find(|line| line.starts_with(id))
            .unwrap_or_else(|| panic!("no row for {id}: {table:?}"))
            .to_owned()
    };
    assert!(row("directory/etc").contains("CREATED"), "{table:?}");
    assert!(row("file/config  ").contains("app "), "{table:?}");
    assert!(
        row("file/broken").contains("FAILED") && row("file/broken").contains("INVALID_ARGUMENT"),
        "{table:?}"
    );

    let current = cli
        .run(&["graph", "get", "--current", "-o", "json"])
        .await
        .ok()
        .json();
    assert!(current.get("intended").is_none(), "{current}");
    let states: Vec<(String, String)> = current["current"]
        .as_array()
        .expect("current items")
        .iter()
        .map(|item| {
            (
                format!(
                    "{}/{}",
                    item["ref"]["type"].as_str().unwrap_or(""),
                    item["ref"]["name"].as_str().unwrap_or("")
                ),
                item["state"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert!(
        states.contains(&("file/broken".into(), "FAILED".into()))
            && states.contains(&("file/config".into(), "CREATED".into())),
        "{states:?}"
    );

    let intended = cli
        .run(&["graph", "get", "--intended", "-o", "yaml"])
        .await
        .ok();
    let intended: Value = serde_yaml::from_str(&intended.stdout).expect("YAML");
    let items = intended["intended"].as_array().expect("intended items");
    assert_eq!(items.len(), 4, "{intended}");
    assert!(intended.get("current").is_none(), "{intended}");

    let dot = cli.run(&["graph", "get", "-o", "dot"]).await.ok().stdout;
    assert!(dot.starts_with("digraph \"acme\" {"), "{dot}");
    let node = |id: &str| {
        dot.lines()
            .find(|line| line.trim_start().starts_with(&format!("\"{id}\" [")))
            .unwrap_or_else(|| panic!("no node {id}: {dot}"))
            .to_owned()
    };
    assert!(
        node("directory/etc").contains("fillcolor=palegreen"),
        "{dot}"
    );
    assert!(node("file/broken").contains("fillcolor=salmon"), "{dot}");
    assert!(
        node("uplink/wan").contains("fillcolor=lightblue")
            && node("uplink/wan").contains("shape=ellipse"),
        "{dot}"
    );
    assert!(dot.contains("label=\"app\""), "{dot}");
    assert!(dot.contains("label=\"app/extra\""), "{dot}");
    assert!(
        dot.contains("\"file/config\" -> \"directory/etc\";"),
        "{dot}"
    );
}

#[tokio::test]
async fn reconcile_wait_shows_progress_and_a_timeout_exits_4() {
    let recorder = Recorder::answering(Step::Hang);
    let (tenant, _agent) = tenant_with_agent(&recorder).await;
    let cli = tenant_cli(&tenant);
    cli.run(&[
        "intent",
        "submit",
        "-f",
        site_json().to_str().expect("utf-8"),
    ])
    .await
    .ok();
    recorder.wait_for_operations(1).await;

    let triggered = cli.run(&["reconcile"]).await.ok();
    assert!(
        triggered.stdout.starts_with("pass triggered"),
        "{triggered:?}"
    );

    let timed_out = cli
        .run(&["reconcile", "--wait", "--timeout", "1s"])
        .await
        .expect(4);
    assert!(
        timed_out.stdout.lines().any(|line| line.starts_with('[')
            && line.contains("CREATING 1")
            && line.contains("in flight: 1")),
        "progress shows items by state and operations in flight: {timed_out:?}"
    );
    assert!(
        timed_out
            .stdout
            .contains("timed out after 1s with work remaining"),
        "{timed_out:?}"
    );
    assert!(
        timed_out
            .stdout
            .lines()
            .any(|line| line.starts_with("directory/etc") && line.contains("CREATE in flight")),
        "the result shows the operation in flight: {timed_out:?}"
    );

    let json = cli
        .run(&["reconcile", "--wait", "--timeout", "1s", "-o", "json"])
        .await
        .expect(4)
        .json();
    assert_eq!(json["result"], "timed_out", "{json}");

    let bad = cli
        .run(&["reconcile", "--wait", "--timeout", "11m"])
        .await
        .expect(2);
    assert!(bad.stderr.contains("at most 10m"), "{bad:?}");
}

#[tokio::test]
async fn connection_and_token_failures_name_their_source_and_settings_follow_precedence() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("server starts");
    let closed = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        probe.local_addr().expect("addr")
    };
    let dead = format!("http://{closed}");

    let refused = Reconctl::at(&dead)
        .env("RECONCILED_TOKEN", "x")
        .run(&["fleet"])
        .await
        .expect(1);
    assert!(
        refused
            .stderr
            .contains(&format!("cannot connect to reconciled at {dead}"))
            && refused.stderr.contains("address from RECONCILED_ADDR"),
        "{refused:?}"
    );

    let missing = Reconctl::new(&server).run(&["fleet"]).await.expect(2);
    assert!(
        missing.stderr.contains("no token given")
            && missing.stderr.contains("RECONCILED_TOKEN")
            && missing.stderr.contains("--token-file"),
        "{missing:?}"
    );

    // The config file gives a dead address and a wrong token; the
    // environment fixes the address; the error names the file for the token.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(
        dir.path(),
        "reconctl.toml",
        &format!("addr = \"{dead}\"\ntoken = \"wrong\"\n"),
    );
    let cli = Reconctl::new(&server).env("RECONCTL_CONFIG", &config);
    let wrong = cli.run(&["fleet"]).await.expect(1);
    assert!(
        wrong.stderr.contains(&format!(
            "refused the token from `token` in config file {config}"
        )),
        "{wrong:?}"
    );
    // A token file given by flag wins over the config file's token.
    let token_file = write(
        dir.path(),
        "admin.token",
        &format!("{}\n", server.admin_token()),
    );
    cli.run(&["fleet", "--token-file", &token_file]).await.ok();
    // The flag's address wins over the environment's.
    let flagged = cli
        .run(&["fleet", "--token-file", &token_file, "--addr", &dead])
        .await
        .expect(1);
    assert!(
        flagged.stderr.contains("address from --addr"),
        "{flagged:?}"
    );

    // A mistyped port is a usage error naming the port and where the
    // address came from, not a failed name lookup ("foo:bar") or a
    // refused connection to port 80 (the port the connector took instead).
    for (addr, port) in [
        ("foo:bar", "\"bar\""),
        ("http://127.0.0.1:50051x", "\"50051x\""),
    ] {
        let mistyped = cli
            .run(&["fleet", "--token-file", &token_file, "--addr", addr])
            .await
            .expect(2);
        assert!(
            mistyped
                .stderr
                .contains(&format!("its port {port} is not a number"))
                && mistyped.stderr.contains("address from --addr")
                && !mistyped.stderr.contains("cannot connect"),
            "{mistyped:?}"
        );
    }

    // The default config file is read when nothing names one.
    let home_config = Reconctl::new(&server);
    let default_dir = home_config.home().join(".config/reconciled");
    std::fs::create_dir_all(&default_dir).expect("config dir");
    write(
        &default_dir,
        "reconctl.toml",
        &format!("token_file = \"{token_file}\"\n"),
    );
    home_config.run(&["fleet"]).await.ok();

    let typo = write(dir.path(), "typo.toml", "adress = \"x\"\n");
    let invalid = Reconctl::new(&server)
        .run(&["fleet", "--config", &typo])
        .await
        .expect(2);
    assert!(invalid.stderr.contains("adress"), "{invalid:?}");
}

#[tokio::test]
async fn fleet_lists_every_tenant_with_conditions_and_counts() {
    let tenant = TestTenant::start("acme").await;
    let admin = admin(&tenant.server);
    admin.run(&["tenant", "create", "beta", "-q"]).await.ok();
    // No agent handles these types: both items wait for a configurator.
    tenant_cli(&tenant)
        .run(&[
            "intent",
            "submit",
            "-f",
            site_json().to_str().expect("utf-8"),
        ])
        .await
        .ok();
    tenant.wait_until_quiescent().await;

    let fleet = admin.run(&["fleet"]).await.ok();
    let lines: Vec<&str> = fleet.stdout.lines().collect();
    assert!(
        lines[0].starts_with("TENANT  READY  RECONCILING  STALLED"),
        "{fleet:?}"
    );
    let acme = lines
        .iter()
        .find(|line| line.starts_with("acme "))
        .unwrap_or_else(|| panic!("no row for acme: {fleet:?}"));
    assert!(
        acme.contains("PENDING 2") && acme.contains("WaitingForConfigurator"),
        "{acme}"
    );
    assert!(
        lines.iter().any(|line| line.starts_with("beta ")),
        "{fleet:?}"
    );

    let json = admin.run(&["fleet", "-o", "json"]).await.ok().json();
    let acme = &json["tenants"][0];
    assert_eq!(acme["name"], "acme");
    assert_eq!(acme["status"]["items_by_state"]["PENDING"], 2, "{json}");
    assert_eq!(acme["status"]["generation"], 1, "{json}");
}

#[tokio::test]
async fn watch_streams_events_after_a_submit() {
    let recorder = Recorder::new();
    let (tenant, _agent) = tenant_with_agent(&recorder).await;
    let cli = tenant_cli(&tenant);

    let mut watch = cli.spawn(&["watch", "-o", "json"]);
    let synced = watch
        .wait_for("the end of the snapshot", |line| {
            serde_json::from_str::<Value>(line).is_ok_and(|v| v["kind"] == "SYNCED")
        })
        .await;
    let synced: Value = serde_json::from_str(&synced).expect("JSON");
    let start = synced["revision"].as_u64().expect("a revision");

    cli.run(&[
        "intent",
        "submit",
        "-f",
        site_json().to_str().expect("utf-8"),
    ])
    .await
    .ok();
    let changed = watch
        .wait_for("the intent change", |line| {
            serde_json::from_str::<Value>(line).is_ok_and(|v| v["kind"] == "INTENT_CHANGED")
        })
        .await;
    let changed: Value = serde_json::from_str(&changed).expect("JSON");
    assert_eq!(changed["generation"], 1, "{changed}");
    assert!(changed["revision"].as_u64() > Some(start), "{changed}");
    watch
        .wait_for("file/config created", |line| {
            serde_json::from_str::<Value>(line).is_ok_and(|v| {
                v["kind"] == "ITEM_STATUS_CHANGED"
                    && v["item"]["name"] == "config"
                    && v["new_state"] == "CREATED"
            })
        })
        .await;

    // Resuming after the snapshot's revision replays the same change as a
    // human line.
    let since = start.to_string();
    let replay = cli
        .run(&[
            "watch",
            "--since",
            &since,
            "--kind",
            "intent-changed",
            "--count",
            "1",
        ])
        .await
        .ok();
    assert!(
        replay.stdout.contains("INTENT_CHANGED") && replay.stdout.contains("generation 1"),
        "{replay:?}"
    );
}

#[tokio::test]
async fn the_readme_quickstart_works_with_reconctl_and_the_example_agent() {
    let server = ServerProcess::start(ServerOptions::default().without_admin_token())
        .await
        .expect("server starts");
    let admin_token_file = server.data_dir().join("admin.token");
    let admin_token_file = admin_token_file.to_str().expect("utf-8 path");

    // TOKEN=$(reconctl --token-file reconciled-data/admin.token tenant create acme --quiet)
    let token = Reconctl::new(&server)
        .run(&[
            "--token-file",
            admin_token_file,
            "tenant",
            "create",
            "acme",
            "--quiet",
        ])
        .await
        .ok()
        .stdout
        .trim()
        .to_owned();

    // export RECONCILED_TOKEN=$TOKEN RECONCILED_TENANT=acme
    // target/release/examples/fs_agent --root /tmp/fs-root &
    let root = tempfile::tempdir().expect("temp dir");
    let agent = tokio::process::Command::new(example_binary("fs_agent"))
        .arg("--root")
        .arg(root.path())
        .env("RECONCILED_ADDR", server.endpoint())
        .env("RECONCILED_TOKEN", &token)
        .env("RECONCILED_TENANT", "acme")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("fs_agent starts");
    let cli = Reconctl::new(&server)
        .env("RECONCILED_TOKEN", &token)
        .env("RECONCILED_TENANT", "acme");

    // reconctl intent submit -f deploy/examples/site.json
    // reconctl reconcile --wait
    cli.run(&["intent", "submit", "-f", "deploy/examples/site.json"])
        .await
        .ok();
    // The agent may still be registering: the first waits can end without
    // progress (exit 3) while no configurator is connected.
    let deadline = tokio::time::Instant::now() + RUN_DEADLINE;
    loop {
        let run = cli.run(&["reconcile", "--wait"]).await;
        if run.code == 0 {
            assert!(run.stdout.contains("converged"), "{run:?}");
            break;
        }
        assert!(
            run.code == 3 && tokio::time::Instant::now() < deadline,
            "reconcile --wait did not converge: {run:?}"
        );
    }
    let config = root.path().join("etc/app/app.conf");
    assert_eq!(
        std::fs::read_to_string(&config).ok().as_deref(),
        Some("listen = 8080\n")
    );

    // reconctl graph get / status / graph get -o dot
    let graph = cli.run(&["graph", "get"]).await.ok();
    assert!(
        graph
            .stdout
            .lines()
            .any(|line| line.starts_with("file/config") && line.contains("CREATED")),
        "{graph:?}"
    );
    let status = cli.run(&["status"]).await.ok();
    assert!(status.stdout.contains("current: CREATED 2"), "{status:?}");
    let dot = cli.run(&["graph", "get", "-o", "dot"]).await.ok();
    assert!(dot.stdout.contains("fillcolor=palegreen"), "{dot:?}");

    // Edit `content` in the example and submit again: the file changes.
    let edited = std::fs::read_to_string(site_json())
        .expect("example intent")
        .replace("listen = 8080", "listen = 9090");
    let dir = tempfile::tempdir().expect("temp dir");
    let edited = write(dir.path(), "site.json", &edited);
    cli.run(&["intent", "submit", "-f", &edited]).await.ok();
    cli.run(&["reconcile", "--wait"]).await.ok();
    assert_eq!(
        std::fs::read_to_string(&config).ok().as_deref(),
        Some("listen = 9090\n")
    );

    // echo '{"items": []}' | reconctl intent submit -f -
    cli.run_with_input(&["intent", "submit", "-f", "-"], Some(r#"{"items": []}"#))
        .await
        .ok();
    cli.run(&["reconcile", "--wait"]).await.ok();
    assert!(
        !root.path().join("etc/app").exists(),
        "the directory is gone"
    );
    drop(agent);

    let status = tenant_status(&server, &token).await;
    assert_eq!(status.intended_items, 0);
}

/// The tenant's status through the API, to check reconctl's claims.
async fn tenant_status(server: &ServerProcess, token: &str) -> v1::TenantStatus {
    let channel = server.channel().await.expect("connects");
    reconciled_tests::api::reconciler(&channel, token)
        .get_status(v1::GetStatusRequest {
            tenant: "acme".into(),
        })
        .await
        .expect("GetStatus")
        .into_inner()
        .status
        .expect("a status")
}

#[tokio::test]
async fn fleet_watch_streams_tenant_changes_as_json_lines() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("the server starts");
    let cli = admin(&server);
    let mut watch = cli.spawn(&["fleet", "--watch", "-o", "json"]);
    watch
        .wait_for("the end of the fleet listing", |line| {
            serde_json::from_str::<Value>(line).is_ok_and(|v| v["kind"] == "SYNCED")
        })
        .await;

    cli.run(&["tenant", "create", "late"]).await.ok();
    let created = watch
        .wait_for("the new tenant", |line| {
            serde_json::from_str::<Value>(line).is_ok_and(|v| v["tenant"] == "late")
        })
        .await;
    let created: Value = serde_json::from_str(&created).expect("JSON");
    assert_ne!(created["deleted"], true, "{created}");

    cli.run(&["tenant", "delete", "late"]).await.ok();
    watch
        .wait_for("the deletion", |line| {
            serde_json::from_str::<Value>(line)
                .is_ok_and(|v| v["tenant"] == "late" && v["deleted"] == true)
        })
        .await;
}

/// An agent's error message is the tenant's text. Human output shows it
/// with its control characters escaped, so it cannot drive the operator's
/// terminal (write the clipboard with OSC 52, clear the screen, move the
/// cursor over earlier output).
#[tokio::test]
async fn an_agents_error_message_cannot_drive_the_operators_terminal() {
    let hostile = "disk full\u{1b}]52;c;ZXZpbA==\u{7}\u{1b}[2J\u{1b}[1;1Hall good\u{9b}0m\rdone";
    let recorder = Recorder::new();
    recorder.script(
        OperationKind::Create,
        ItemRef::new("file", "broken"),
        [Step::FailWith(Code::InvalidArgument, hostile.into())],
    );
    let (tenant, _agent) = tenant_with_agent(&recorder).await;
    let cli = tenant_cli(&tenant);
    let dir = tempfile::tempdir().expect("temp dir");
    let intent = write(
        dir.path(),
        "intent.yaml",
        "items:\n  - {type: file, name: broken, properties: {path: etc/broken}}\n",
    );
    cli.run(&["intent", "submit", "-f", &intent]).await.ok();
    tenant
        .wait_for_state("file", "broken", v1::ItemState::Failed)
        .await;
    // What `command` printed holds no control character but line feeds.
    let printable = |command: &str, stdout: &str| {
        let control: Vec<char> = stdout
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect();
        assert!(
            control.is_empty(),
            "{command} printed control characters: {stdout:?}"
        );
    };

    let graph = cli.run(&["graph", "get"]).await.ok();
    assert!(graph.stdout.contains("disk full"), "{graph:?}");
    printable("graph get", &graph.stdout);

    let watch = cli
        .run(&[
            "watch",
            "--history",
            "--kind",
            "operation-finished",
            "--count",
            "1",
        ])
        .await
        .ok();
    assert!(watch.stdout.contains("disk full"), "{watch:?}");
    printable("watch", &watch.stdout);

    let reconcile = cli
        .run(&["reconcile", "--wait", "--timeout", "10s"])
        .await
        .expect(3);
    assert!(reconcile.stdout.contains("stalled"), "{reconcile:?}");
    printable("reconcile", &reconcile.stdout);
}

/// `watch --reconnect` goes on across a server restart: the change made
/// after it shows once, nothing before it shows again, and standard
/// error says the stream was resumed.
#[tokio::test]
async fn watch_with_reconnect_resumes_across_a_restart_without_repeating_events() {
    let mut tenant = TestTenant::start("acme").await;
    let cli = tenant_cli(&tenant);
    let mut watch = cli.spawn(&["watch", "-o", "json", "--reconnect"]);
    let is = |line: &str, kind: &str, generation: Option<u64>| {
        serde_json::from_str::<Value>(line).is_ok_and(|v| {
            v["kind"] == kind && generation.is_none_or(|wanted| v["generation"] == wanted)
        })
    };
    watch
        .wait_for("the end of the snapshot", |line| is(line, "SYNCED", None))
        .await;
    tenant
        .submit(vec![reconciled_tests::api::item(
            "t",
            "a",
            serde_json::json!({"round": 1}),
        )])
        .await;
    watch
        .wait_for("generation 1", |line| is(line, "INTENT_CHANGED", Some(1)))
        .await;

    tenant.server.restart().await.expect("restarts");
    tenant.channel = tenant.server.channel().await.expect("connects");
    tenant
        .submit(vec![reconciled_tests::api::item(
            "t",
            "a",
            serde_json::json!({"round": 2}),
        )])
        .await;
    watch
        .wait_for("generation 2 after the restart", |line| {
            is(line, "INTENT_CHANGED", Some(2))
        })
        .await;
    let count = |kind: &str, generation: Option<u64>| {
        watch
            .seen
            .iter()
            .filter(|line| is(line, kind, generation))
            .count()
    };
    assert_eq!(count("SYNCED", None), 1, "{:#?}", watch.seen);
    assert_eq!(count("INTENT_CHANGED", Some(1)), 1, "{:#?}", watch.seen);

    watch.child.start_kill().expect("reconctl is stopped");
    let mut stderr = String::new();
    let mut pipe = watch.child.stderr.take().expect("stderr is piped");
    tokio::io::AsyncReadExt::read_to_string(&mut pipe, &mut stderr)
        .await
        .expect("stderr is read");
    assert!(
        stderr.contains("the stream broke and was resumed after revision"),
        "{stderr}"
    );
}

/// `fleet --watch --reconnect` goes on across a server restart: a tenant
/// created after it shows, and the listing does not come again.
#[tokio::test]
async fn fleet_watch_with_reconnect_resumes_across_a_restart() {
    let mut tenant = TestTenant::start("acme").await;
    let mut watch = admin(&tenant.server).spawn(&["fleet", "--watch", "-o", "json", "--reconnect"]);
    let kind_is = |line: &str, kind: &str| {
        serde_json::from_str::<Value>(line).is_ok_and(|v| v["kind"] == kind)
    };
    watch
        .wait_for("the end of the listing", |line| kind_is(line, "SYNCED"))
        .await;

    tenant.server.restart().await.expect("restarts");
    tenant.channel = tenant.server.channel().await.expect("connects");
    admin(&tenant.server)
        .run(&["tenant", "create", "beta", "--quiet"])
        .await
        .ok();
    watch
        .wait_for("tenant beta", |line| {
            serde_json::from_str::<Value>(line).is_ok_and(|v| v["tenant"] == "beta")
        })
        .await;
    let listings = watch
        .seen
        .iter()
        .filter(|line| kind_is(line, "SYNCED"))
        .count();
    assert_eq!(listings, 1, "{:#?}", watch.seen);
}
