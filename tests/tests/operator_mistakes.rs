//! Mistakes a new operator makes, through the real binaries: a metrics port
//! that is taken, a TLS key that is not the certificate's, and a
//! certificate that `reconctl` refuses. Each must stop with a non-zero exit
//! and a message that says what to change.

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use reconciled_tests::{reconciled_binary, workspace_binary};

/// Longest a run that must end by itself may take; past it `timeout`
/// stops the process (exit 124), so a server that keeps running where it
/// should have refused to start fails the test instead of hanging it.
const RUN_DEADLINE_SECS: &str = "60";

/// Runs `reconciled ARGS` until it exits or the deadline passes.
fn reconciled_until_exit(args: &[&str]) -> Output {
    Command::new("timeout")
        .arg(RUN_DEADLINE_SECS)
        .arg(reconciled_binary())
        .args(args)
        .env_remove("RECONCILED_DATA_DIR")
        .env_remove("RECONCILED_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("reconciled runs under timeout")
}

/// The arguments that serve on a free port, without the dashboard, from
/// the data directory `data`.
fn serve_args(data: &str) -> [&str; 6] {
    [
        "--listen",
        "127.0.0.1:0",
        "--ui-listen",
        "off",
        "--data-dir",
        data,
    ]
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A self-signed certificate for 127.0.0.1 and its key, as PEM; a CA
/// certificate (`CA:TRUE`) when `ca`, as `openssl req -x509` makes by
/// default.
fn self_signed(ca: bool) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).expect("params");
    if ca {
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    }
    let cert = params.self_signed(&key).expect("certificate");
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a file");
    path.to_string_lossy().into_owned()
}

/// A server started by hand (not through the harness, whose health check
/// would refuse the certificates these tests use), killed when dropped.
struct HandStarted {
    child: Child,
    addr: String,
}

impl HandStarted {
    /// Starts `reconciled ARGS` on a free port and returns once it prints
    /// its `listening on` line.
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(reconciled_binary())
            .args(["--listen", "127.0.0.1:0", "--ui-listen", "off"])
            .args(args)
            .env_remove("RECONCILED_DATA_DIR")
            .env_remove("RECONCILED_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("reconciled starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        // The first line is the announcement; reading it waits for it (the
        // pipe closes, and the loop ends, if the server exits instead).
        let addr = std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find_map(|line| {
                line.strip_prefix("reconciled listening on ")
                    .map(str::to_owned)
            })
            .expect("the server announces its address");
        Self { child, addr }
    }
}

impl Drop for HandStarted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_metrics_port_in_use_stops_the_start_and_names_the_setting() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let port = taken.local_addr().expect("its address").to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let output = reconciled_until_exit(&[
        "--listen",
        "127.0.0.1:0",
        "--ui-listen",
        "off",
        "--metrics-listen",
        &port,
        "--data-dir",
        &data.to_string_lossy(),
    ]);
    let stderr = stderr_of(&output);
    assert_eq!(
        output.status.code(),
        Some(1),
        "the server must refuse to start without its metrics endpoint: {stderr}"
    );
    assert!(
        stderr.contains(&format!("cannot serve the metrics on {port}"))
            && stderr.contains("--metrics-listen"),
        "{stderr}"
    );
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("listening on"),
        "it must not announce itself first"
    );
    assert_eq!(
        stderr.matches("Address already in use").count(),
        1,
        "the cause is said once: {stderr}"
    );
}

#[test]
fn a_tls_key_of_another_certificate_is_refused_before_the_data_directory_is_made() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, _) = self_signed(false);
    let (_, other_key) = self_signed(false);
    let cert = write(dir.path(), "server.pem", &cert);
    let key = write(dir.path(), "other.key", &other_key);
    let data = dir.path().join("data");
    let data_arg = data.to_string_lossy().into_owned();
    let tls = [
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--data-dir",
        &data_arg,
    ];

    let checked = reconciled_until_exit(&[&tls[..], &["check-config"]].concat());
    let stderr = stderr_of(&checked);
    assert_eq!(checked.status.code(), Some(2), "check-config: {stderr}");
    assert!(
        stderr.contains(&cert) && stderr.contains(&key) && stderr.contains("openssl"),
        "check-config names both files and how to compare them: {stderr}"
    );

    let served = reconciled_until_exit(
        &[&tls[..], &["--listen", "127.0.0.1:0", "--ui-listen", "off"]].concat(),
    );
    let stderr = stderr_of(&served);
    assert_eq!(served.status.code(), Some(1), "serve: {stderr}");
    assert!(
        stderr.contains(&cert) && stderr.contains(&key) && stderr.contains("--tls-key"),
        "serve names both files: {stderr}"
    );
    assert!(
        !data.exists(),
        "nothing is created, no token generated, before the TLS files are known to work"
    );
}

#[test]
fn reconctl_says_what_to_change_when_it_refuses_the_servers_certificate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca_cert, ca_key) = self_signed(true);
    let cert = write(dir.path(), "server.pem", &ca_cert);
    let key = write(dir.path(), "server.key", &ca_key);
    let data = dir.path().join("data").to_string_lossy().into_owned();
    let server = HandStarted::start(&["--tls-cert", &cert, "--tls-key", &key, "--data-dir", &data]);
    let token_file = format!("{data}/admin.token");

    let reconctl = |addr: &str, args: &[&str]| {
        Command::new("timeout")
            .arg(RUN_DEADLINE_SECS)
            .arg(workspace_binary("reconctl"))
            .args(["--addr", addr, "--token-file", &token_file])
            .args(args)
            .env_remove("RECONCILED_CA_CERT")
            .env_remove("RECONCTL_CONFIG")
            .env("HOME", dir.path())
            .env_remove("XDG_CONFIG_HOME")
            .output()
            .expect("reconctl runs")
    };

    // A CA certificate (openssl req -x509's default) serving as the
    // server's own.
    let refused = reconctl(&server.addr, &["--ca-cert", &cert, "fleet"]);
    let stderr = stderr_of(&refused);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("CA:FALSE") && stderr.contains(&format!("https://{}", server.addr)),
        "the message says how to make a usable certificate, with the address dialled: {stderr}"
    );

    // An https address without the CA certificate.
    let without_ca = reconctl(&format!("https://{}", server.addr), &["fleet"]);
    let stderr = stderr_of(&without_ca);
    assert_eq!(without_ca.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--ca-cert"), "{stderr}");

    // Plaintext against the TLS port.
    let plaintext = reconctl(&server.addr, &["fleet"]);
    let stderr = stderr_of(&plaintext);
    assert_eq!(plaintext.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--ca-cert"),
        "a plaintext client is told the server may serve TLS: {stderr}"
    );
}

#[test]
fn a_host_name_as_a_listen_flag_is_refused_with_the_form_expected() {
    for flag in ["--listen", "--metrics-listen"] {
        let output = reconciled_until_exit(&[flag, "localhost:9090", "check-config"]);
        let stderr = stderr_of(&output);
        assert_eq!(output.status.code(), Some(2), "{flag}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("such as 127.0.0.1:50051"),
            "{flag} says which form it takes, as its environment variable does: {stderr}"
        );
    }
    // The other flags keep clap's parsing: enum values, numbers, booleans.
    let output = reconciled_until_exit(&[
        "--reflection",
        "public",
        "--fsync",
        "false",
        "--max-connections",
        "5",
        "--ui-listen",
        "off",
        "check-config",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", stderr_of(&output));
    assert!(
        stdout.contains("reflection = \"public\"")
            && stdout.contains("fsync = false")
            && stdout.contains("max_connections = 5"),
        "{stdout}"
    );
}

/// A data directory under a file (a typo, or a path reused): the start
/// used to fail reading "the admin token file .../admin.token: Not a
/// directory", which sent the operator looking for a token problem.
#[test]
fn a_data_directory_under_a_file_names_the_file_in_the_way() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(dir.path(), "afile", "not a directory\n");
    let data = format!("{file}/data");
    for args in [
        &serve_args(&data)[..],
        &["migrate", "--data-dir", &data][..],
    ] {
        let output = reconciled_until_exit(args);
        let stderr = stderr_of(&output);
        assert_ne!(output.status.code(), Some(0), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "cannot create the data directory {data}: {file} is a file, not a directory"
            )) && !stderr.contains("admin token"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn a_data_directory_in_use_names_the_process_that_holds_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data").to_string_lossy().into_owned();
    let running = HandStarted::start(&["--data-dir", &data]);
    let output = reconciled_until_exit(&serve_args(&data));
    let stderr = stderr_of(&output);
    assert_ne!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "directory is in use by process {}",
            running.child.id()
        )) && stderr.contains("stop that process first"),
        "the operator is told who holds the directory and what to do: {stderr}"
    );
    assert!(!stderr.contains("WouldBlock"), "{stderr}");
    let status = reconciled_until_exit(&["migrate", "--status", "--data-dir", &data]);
    assert!(
        stderr_of(&status).contains("directory is in use by process"),
        "{}",
        stderr_of(&status)
    );
}
