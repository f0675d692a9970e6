//! deploy/ stays true to the binary: manifests parse (the single-node
//! StatefulSet and the three replicas on etcd), every flag they use is a
//! real flag of `reconciled`, and the configuration files they ship pass
//! `reconciled check-config`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use reconciled_tests::{reconciled_binary, workspace_root};
use serde::Deserialize as _;

fn deploy_file(path: &str) -> String {
    std::fs::read_to_string(workspace_root().join("deploy").join(path))
        .unwrap_or_else(|e| panic!("deploy/{path}: {e}"))
}

/// `--flag` words used in a text.
fn flags_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, '"' | '[' | ']' | ','))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(|word| {
            word.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_string()
        })
        .collect()
}

fn help_text() -> String {
    let output = Command::new(reconciled_binary())
        .arg("--help")
        .output()
        .expect("the binary runs");
    assert!(output.status.success());
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn check_config(file: &Path) -> (bool, String) {
    check_config_with(file, &[])
}

/// `reconciled check-config --config FILE` with environment `env`.
fn check_config_with(file: &Path, env: &[(&str, &str)]) -> (bool, String) {
    let output = Command::new(reconciled_binary())
        .args(["check-config", "--config"])
        .arg(file)
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[test]
fn every_flag_in_the_dockerfile_the_unit_and_the_manifests_is_a_real_flag() {
    let help = help_text();
    let known: BTreeSet<String> = flags_in(&help);
    // The lines that start the server, per file.
    let launches = [
        ("Dockerfile", "CMD"),
        ("systemd/reconciled.service", "ExecStart="),
        ("kubernetes/reconciled.yaml", "args:"),
        ("kubernetes/reconciled-replicas.yaml", "args:"),
    ];
    for (file, marker) in launches {
        let server_lines: String = deploy_file(file)
            .lines()
            .filter(|line| line.trim_start().starts_with(marker))
            .collect::<Vec<_>>()
            .join("\n");
        let used = flags_in(&server_lines);
        assert!(!used.is_empty(), "deploy/{file} passes flags to reconciled");
        for flag in used {
            assert!(
                known.contains(&flag),
                "deploy/{file} uses {flag}, which `reconciled --help` does not list"
            );
        }
    }
}

#[test]
fn the_kubernetes_manifests_parse_and_probe_the_grpc_port() {
    let text = deploy_file("kubernetes/reconciled.yaml");
    let mut kinds = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(document).expect("valid YAML");
        assert!(
            value.get("apiVersion").is_some(),
            "every document has an apiVersion"
        );
        kinds.push(
            value["kind"]
                .as_str()
                .expect("every document has a kind")
                .to_string(),
        );
        if value["kind"] == "StatefulSet" {
            let container = &value["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(
                container["readinessProbe"]["grpc"]["port"].as_u64(),
                Some(50051)
            );
            assert_eq!(
                container["livenessProbe"]["grpc"]["port"].as_u64(),
                Some(50051)
            );
        }
        if value["kind"] == "ConfigMap" {
            let embedded = value["data"]["reconciled.toml"]
                .as_str()
                .expect("the ConfigMap holds reconciled.toml");
            let dir = tempfile::tempdir().expect("temp dir");
            let file = dir.path().join("reconciled.toml");
            std::fs::write(&file, embedded).expect("write");
            let (ok, text) = check_config(&file);
            assert!(ok, "the ConfigMap's configuration is valid: {text}");
        }
    }
    assert_eq!(kinds, ["ConfigMap", "Service", "StatefulSet"]);
}

#[test]
fn the_replicas_manifest_parses_runs_on_etcd_and_probes_readiness_and_liveness_apart() {
    let text = deploy_file("kubernetes/reconciled-replicas.yaml");
    let mut kinds = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(document).expect("valid YAML");
        let kind = value["kind"].as_str().expect("every document has a kind");
        kinds.push(kind.to_string());
        if kind == "StatefulSet" {
            assert_eq!(value["spec"]["replicas"].as_u64(), Some(3));
            let container = &value["spec"]["template"]["spec"]["containers"][0];
            let readiness = &container["readinessProbe"]["grpc"];
            assert_eq!(readiness["port"].as_u64(), Some(50051));
            assert!(
                readiness.get("service").is_none(),
                "readiness is service \"\""
            );
            let liveness = &container["livenessProbe"]["grpc"];
            assert_eq!(liveness["service"].as_str(), Some("liveness"));
        }
        if kind == "ConfigMap" {
            let embedded = value["data"]["reconciled.toml"]
                .as_str()
                .expect("the ConfigMap holds reconciled.toml");
            assert!(embedded.contains("store = \"etcd\""), "{embedded}");
            let dir = tempfile::tempdir().expect("temp dir");
            let file = dir.path().join("reconciled.toml");
            std::fs::write(&file, embedded).expect("write");
            // The admin token comes from the Secret, through the environment.
            let (ok, text) = check_config_with(
                &file,
                &[("RECONCILED_ADMIN_TOKEN", "0123456789abcdef0123456789abcdef")],
            );
            assert!(ok, "the ConfigMap's configuration is valid: {text}");
        }
    }
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "Service",
            "Service",
            "PodDisruptionBudget",
            "StatefulSet"
        ]
    );
}

#[test]
fn the_example_configuration_passes_check_config() {
    let (ok, text) = check_config(&workspace_root().join("deploy/reconciled.example.toml"));
    assert!(ok, "{text}");
    assert!(text.contains("0.0.0.0:50051"), "{text}");
}

#[test]
fn the_systemd_unit_is_well_formed_and_hardened() {
    let unit = deploy_file("systemd/reconciled.service");
    let mut section = String::new();
    let mut keys = BTreeSet::new();
    for line in unit
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        if line.starts_with('[') {
            assert!(line.ends_with(']'), "section header {line}");
            section = line.to_string();
            continue;
        }
        let (key, _) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not a key=value line: {line}"));
        keys.insert(format!("{section}{key}"));
    }
    for required in [
        "[Service]ExecStart",
        "[Service]StateDirectory",
        "[Service]DynamicUser",
        "[Service]NoNewPrivileges",
        "[Service]ProtectSystem",
        "[Install]WantedBy",
    ] {
        assert!(keys.contains(required), "the unit sets {required}");
    }
}

/// The container, the pod's security context and the data directory of
/// the StatefulSet in the Kubernetes manifest `file`: `(args, runAsUser,
/// fsGroup, the data volume's mountPath, the data directory the server is
/// given)`.
fn statefulset_data_layout(file: &str) -> (Vec<String>, u32, u32, String, String) {
    let text = deploy_file(file);
    let mut config_data_dir = None;
    let mut statefulset = None;
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(document).expect("valid YAML");
        if value["kind"] == "ConfigMap" {
            let embedded = value["data"]["reconciled.toml"]
                .as_str()
                .expect("the ConfigMap holds reconciled.toml");
            config_data_dir = embedded.lines().find_map(|line| {
                let (key, value) = line.split_once('=')?;
                (key.trim() == "data_dir").then(|| value.trim().trim_matches('"').to_owned())
            });
        }
        if value["kind"] == "StatefulSet" {
            statefulset = Some(value);
        }
    }
    let statefulset = statefulset.expect("the manifest has a StatefulSet");
    let pod = &statefulset["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<String> = container["args"]
        .as_sequence()
        .expect("the container has args")
        .iter()
        .map(|arg| arg.as_str().expect("string args").to_owned())
        .collect();
    let user = pod["securityContext"]["runAsUser"]
        .as_u64()
        .expect("runAsUser") as u32;
    let group = pod["securityContext"]["fsGroup"].as_u64().expect("fsGroup") as u32;
    let mount = container["volumeMounts"]
        .as_sequence()
        .expect("volume mounts")
        .iter()
        .find(|mount| mount["name"] == "data")
        .and_then(|mount| mount["mountPath"].as_str())
        .expect("the data volume is mounted")
        .to_owned();
    let data_dir = args
        .iter()
        .position(|arg| arg == "--data-dir")
        .map(|at| args[at + 1].clone())
        .or(config_data_dir)
        .expect("the data directory is set by a flag or the ConfigMap");
    (args, user, group, mount, data_dir)
}

#[test]
fn the_statefulsets_data_dir_is_one_the_server_can_make_private_on_a_fresh_volume() {
    // A volume mounted with fsGroup has a root owned by root, group
    // fsGroup, mode 2775: the pod's user may create in it but not chmod
    // it, and the server makes its data directory 0700 when the store
    // opens. The data directory must be one the server creates.
    for file in [
        "kubernetes/reconciled.yaml",
        "kubernetes/reconciled-replicas.yaml",
    ] {
        let (_, _, _, mount, data_dir) = statefulset_data_layout(file);
        let below = Path::new(&data_dir)
            .strip_prefix(&mount)
            .unwrap_or_else(|_| panic!("deploy/{file}: {data_dir} is not on the volume {mount}"));
        assert!(
            !below.as_os_str().is_empty(),
            "deploy/{file}: the data directory is the volume's root {mount}, which the pod's \
             user does not own: the server cannot make it private and does not start"
        );
    }

    // The same, for real, where this test may act as another user: the
    // single-node StatefulSet's arguments against a directory laid out as
    // kubelet lays out a fresh volume.
    // /proc/self belongs to the process's effective user.
    let euid =
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("/proc/self"));
    if euid != 0 {
        eprintln!("not root: the volume's ownership is not simulated");
        return;
    }
    use std::os::unix::fs::{PermissionsExt as _, chown};
    use std::os::unix::process::CommandExt as _;
    let (args, user, group, mount, data_dir) =
        statefulset_data_layout("kubernetes/reconciled.yaml");
    let root = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // The pod's user must reach the binary: a copy beside the volume.
    let binary = root.path().join("reconciled");
    std::fs::hard_link(reconciled_binary(), &binary)
        .or_else(|_| std::fs::copy(reconciled_binary(), &binary).map(drop))
        .expect("the binary is copied");
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let volume = root.path().join("volume");
    std::fs::create_dir(&volume).expect("mkdir");
    chown(&volume, Some(0), Some(group)).expect("chown");
    std::fs::set_permissions(&volume, std::fs::Permissions::from_mode(0o2775)).expect("chmod");
    let local = |path: &str| {
        let below = Path::new(path).strip_prefix(&mount).expect("on the volume");
        volume.join(below).to_str().expect("utf-8").to_owned()
    };
    // `migrate` opens the store as `serve` does at start, then exits.
    let mut args: Vec<String> = args.into_iter().filter(|arg| arg != "serve").collect();
    if let Some(at) = args.iter().position(|arg| arg == "--config") {
        args.drain(at..at + 2);
    }
    if let Some(at) = args.iter().position(|arg| arg == "--data-dir") {
        args.drain(at..at + 2);
    }
    let output = Command::new(&binary)
        .arg("migrate")
        .args(&args)
        .arg("--data-dir")
        .arg(local(&data_dir))
        .env("RECONCILED_ADMIN_TOKEN", "0123456789abcdef0123456789abcdef")
        .env_remove("RECONCILED_DATA_DIR")
        .env_remove("RECONCILED_CONFIG")
        .uid(user)
        .gid(group)
        .output()
        .expect("the binary runs");
    assert!(
        output.status.success(),
        "the StatefulSet's server does not start on a fresh volume: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Names of the Secrets a manifest's containers read (`secretKeyRef`).
fn secrets_referenced(value: &serde_yaml::Value, found: &mut BTreeSet<String>) {
    match value {
        serde_yaml::Value::Mapping(map) => {
            for (key, value) in map {
                if key == "secretKeyRef"
                    && let Some(name) = value["name"].as_str()
                {
                    found.insert(name.to_owned());
                }
                secrets_referenced(value, found);
            }
        }
        serde_yaml::Value::Sequence(values) => {
            for value in values {
                secrets_referenced(value, found);
            }
        }
        _ => {}
    }
}

#[test]
fn every_secret_a_manifest_reads_is_created_by_a_command_in_its_comments() {
    // A pod whose Secret does not exist never starts
    // (CreateContainerConfigError): the manifest applied as its header
    // says must say how to create it first.
    for file in [
        "kubernetes/reconciled.yaml",
        "kubernetes/reconciled-replicas.yaml",
    ] {
        let text = deploy_file(file);
        let mut secrets = BTreeSet::new();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(document).expect("valid YAML");
            secrets_referenced(&value, &mut secrets);
        }
        let comments: Vec<&str> = text
            .lines()
            .filter_map(|line| line.trim_start().strip_prefix('#'))
            .collect();
        for secret in secrets {
            let create = format!("kubectl create secret generic {secret} ");
            assert!(
                comments.iter().any(|line| line.contains(&create)),
                "deploy/{file} reads the Secret {secret} but its comments do not say how to \
                 create it (`{create}...`)"
            );
        }
    }
}

#[test]
fn every_port_the_dockerfile_exposes_is_one_its_server_listens_on() {
    // EXPOSE documents what the container serves: a port nothing listens
    // on (metrics are off by default) sends an operator to a dead port.
    let dockerfile = deploy_file("Dockerfile");
    let cmd = dockerfile
        .lines()
        .find(|line| line.starts_with("CMD"))
        .expect("the Dockerfile has a CMD");
    for line in dockerfile.lines().filter(|line| line.starts_with("EXPOSE")) {
        for port in line.split_whitespace().skip(1) {
            assert!(
                cmd.contains(&format!(":{port}\"")),
                "the Dockerfile exposes {port}, but its CMD listens on no such port: {cmd}"
            );
        }
    }
}

#[test]
fn the_systemd_units_exec_start_serves_with_the_config_its_comments_install() {
    use std::io::BufRead as _;
    let unit = deploy_file("systemd/reconciled.service");
    let exec_start = unit
        .lines()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .expect("the unit has an ExecStart line");
    let words: Vec<&str> = exec_start.split_whitespace().collect();
    let config = words[words
        .iter()
        .position(|w| *w == "--config")
        .expect("--config")
        + 1];
    // The unit does not start without its configuration file: its comments
    // must say how to put one there.
    let install = unit
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix('#'))
        .find(|line| line.contains("install") && line.trim_end().ends_with(config))
        .unwrap_or_else(|| panic!("the unit's comments do not say how to install {config}"));
    let source = install
        .split_whitespace()
        .find(|word| word.starts_with("deploy/"))
        .expect("the installed file comes from deploy/");

    // ExecStart, against a temporary root: /etc and /var/lib below it.
    let root = tempfile::tempdir().expect("temp dir");
    let local = |path: &str| root.path().join(path.trim_start_matches('/'));
    std::fs::create_dir_all(local(config).parent().expect("a directory")).expect("mkdir");
    std::fs::copy(workspace_root().join(source), local(config)).expect("install the config");
    let args: Vec<std::path::PathBuf> = words[1..]
        .iter()
        .map(|word| {
            if word.starts_with('/') {
                local(word)
            } else {
                std::path::PathBuf::from(word)
            }
        })
        .collect();
    let mut server = Command::new(reconciled_binary())
        .args(&args)
        // The example listens on 0.0.0.0:50051: the environment beats the
        // file, so the test takes a free loopback port instead.
        .env("RECONCILED_LISTEN", "127.0.0.1:0")
        .env("RECONCILED_UI_LISTEN", "off")
        .env_remove("RECONCILED_DATA_DIR")
        .env_remove("RECONCILED_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the binary runs");
    let stdout = server.stdout.take().expect("stdout");
    let (lines, listening) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let started = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match listening.recv_timeout(left) {
            Ok(line) if line.starts_with("reconciled listening on") => break true,
            Ok(_) => continue,
            Err(_) => break false,
        }
    };
    if !started {
        let _ = server.kill();
        let status = server.wait().expect("wait");
        panic!("ExecStart did not start serving ({status})");
    }
    assert!(
        local("/var/lib/reconciled/admin.token").is_file(),
        "the admin token is where the unit's comments say"
    );
    // systemd stops the service with SIGTERM (KillSignal=) and counts a
    // non-zero exit as a failure (Restart=on-failure).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(server.id()).expect("a process id")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = server.wait().expect("wait");
    assert!(status.success(), "stopped with {status}");
}

#[test]
fn liveness_waits_for_a_start_that_migrates_a_large_store() {
    // `serve` opens the gRPC port only after migrating the store (a full
    // backup first) and loading every tenant. A liveness probe of 6 × 10 s
    // alone kills an upgrade of a large store midway, and every restart
    // starts it over: a startup probe must hold liveness off meanwhile.
    for file in [
        "kubernetes/reconciled.yaml",
        "kubernetes/reconciled-replicas.yaml",
    ] {
        let text = deploy_file(file);
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(document).expect("valid YAML");
            if value["kind"] != "StatefulSet" {
                continue;
            }
            let container = &value["spec"]["template"]["spec"]["containers"][0];
            let startup = &container["startupProbe"];
            assert_eq!(
                startup["grpc"]["port"].as_u64(),
                Some(50051),
                "deploy/{file}: a startup probe on the gRPC port"
            );
            assert_eq!(
                startup["grpc"]["service"], container["livenessProbe"]["grpc"]["service"],
                "deploy/{file}: the startup probe asks what liveness asks"
            );
            let budget = startup["periodSeconds"].as_u64().unwrap_or(10)
                * startup["failureThreshold"].as_u64().unwrap_or(3);
            assert!(
                budget >= 1800,
                "deploy/{file}: a start may take {budget} s at most before liveness applies"
            );
        }
    }
}

#[test]
fn the_data_directory_and_its_backups_outlive_the_pod() {
    // The data directory holds the store (single node) or the backups taken
    // before a migration (on etcd): an upgrade's rollout replaces every
    // pod, and an emptyDir with it, just when a rollback needs the backup.
    for file in [
        "kubernetes/reconciled.yaml",
        "kubernetes/reconciled-replicas.yaml",
    ] {
        let text = deploy_file(file);
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(document).expect("valid YAML");
            if value["kind"] != "StatefulSet" {
                continue;
            }
            let claims: Vec<&str> = value["spec"]["volumeClaimTemplates"]
                .as_sequence()
                .map(|claims| {
                    claims
                        .iter()
                        .filter_map(|claim| claim["metadata"]["name"].as_str())
                        .collect()
                })
                .unwrap_or_default();
            assert!(
                claims.contains(&"data"),
                "deploy/{file}: the data volume is not a volumeClaimTemplate (claims: {claims:?})"
            );
            let pod_volumes = value["spec"]["template"]["spec"]["volumes"]
                .as_sequence()
                .cloned()
                .unwrap_or_default();
            assert!(
                !pod_volumes.iter().any(|volume| volume["name"] == "data"),
                "deploy/{file}: a pod volume named data shadows the claim"
            );
        }
    }
}

#[test]
fn the_example_configurations_rule_for_environment_names_holds_for_its_keys() {
    // The example says every key is also RECONCILED_<KEY>: a key whose
    // variable is named otherwise must be named in it, or an operator
    // setting RECONCILED_<KEY> is silently ignored.
    let help = help_text();
    let example = deploy_file("reconciled.example.toml");
    for line in example.lines().map(|line| line.trim_start_matches("# ")) {
        let Some((key, _)) = line.split_once(" = ") else {
            continue;
        };
        let key = key.trim();
        if key.contains(' ') {
            continue;
        }
        let flag = format!("--{} <", key.replace('_', "-"));
        let at = help
            .find(&flag)
            .unwrap_or_else(|| panic!("{key}: `reconciled --help` has no {flag}"));
        let env = help[at..]
            .split("[env: ")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .expect("every setting has a variable");
        let expected = format!("RECONCILED_{}", key.to_uppercase());
        assert!(
            env == expected || example.contains(&format!("{key} is {env}")),
            "{key}: its variable is {env}, not {expected} as the example's header says"
        );
    }
}
