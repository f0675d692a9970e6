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
