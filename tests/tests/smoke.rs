//! Smoke test: the binary starts, is healthy, speaks reflection to grpcurl,
//! survives a restart, and keeps a generated admin token private.

use std::os::unix::fs::PermissionsExt as _;

use reconciled_tests::{ServerOptions, ServerProcess, successful_stdout};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

async fn health_status(server: &ServerProcess) -> ServingStatus {
    let channel = server.channel().await.expect("connects");
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health check answers");
    reply.get_ref().status()
}

#[tokio::test]
async fn server_is_healthy_lists_its_services_to_grpcurl_and_survives_a_restart() {
    let mut server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("server starts");
    assert_eq!(health_status(&server).await, ServingStatus::Serving);

    // Reflection needs a token (--reflection=authenticated, the default).
    let admin = format!("authorization: Bearer {}", server.admin_token());
    let services = successful_stdout(&server.grpcurl(&["-H", &admin], &["list"]));
    for service in ["grpc.health.v1.Health", "reconciled.v1.Reconciler"] {
        assert!(
            services.lines().any(|line| line == service),
            "`grpcurl list` lacks {service}:\n{services}"
        );
    }
    let health =
        successful_stdout(&server.grpcurl(&["-H", &admin], &["grpc.health.v1.Health/Check"]));
    assert!(health.contains("\"SERVING\""), "{health}");

    let port = server.addr();
    server.restart().await.expect("server restarts");
    assert_eq!(server.addr(), port, "restart keeps the port");
    assert_eq!(health_status(&server).await, ServingStatus::Serving);

    let status = server.terminate().await.expect("server stops on SIGTERM");
    assert!(status.success(), "SIGTERM is a clean shutdown: {status}");
}

#[tokio::test]
async fn generated_admin_token_is_private_and_kept_across_restarts() {
    let mut server = ServerProcess::start(ServerOptions::default().without_admin_token())
        .await
        .expect("server starts");
    let path = server.data_dir().join("admin.token");
    let mode = std::fs::metadata(&path)
        .expect("admin.token exists")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "admin.token must be readable by its owner only"
    );
    let token = server.admin_token();
    assert!(
        token.starts_with("rcda_"),
        "generated admin tokens are prefixed rcda_"
    );
    assert!(
        !server.log_tail().contains(&token),
        "the token must never be logged"
    );

    server.kill9().expect("killed");
    server.start_again().await.expect("server starts again");
    assert_eq!(
        server.admin_token(),
        token,
        "the generated token is reused, not regenerated"
    );
}

#[tokio::test]
async fn a_server_that_cannot_start_is_reported_with_its_log() {
    let error = ServerProcess::start(ServerOptions::default().arg("--lease-secs").arg("1"))
        .await
        .expect_err("lease shorter than the heartbeat is refused");
    let message = format!("{error:#}");
    assert!(message.contains("exited before it was ready"), "{message}");
    assert!(
        message.contains("lease_secs"),
        "the log tail names the bad setting: {message}"
    );
}

/// A supervisor may stop the server the moment it says it listens: the
/// signal handlers are in place before that line, so even then SIGTERM is
/// a clean shutdown (drain, flush, exit 0), never the default action.
#[test]
fn sigterm_the_moment_the_server_says_it_listens_is_a_clean_shutdown() {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};

    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    for round in 0..8 {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut child = Command::new(reconciled_tests::reconciled_binary())
            .args(["--listen", "127.0.0.1:0", "--ui-listen", "off"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--admin-token", "rcda_test_sigterm_at_once"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the server starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        let announced = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|line| line.starts_with("reconciled listening on "));
        assert!(announced, "round {round}: the server never said it listens");
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits"));
        kill(pid, Signal::SIGTERM).expect("SIGTERM is sent");

        let (exited, exit) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = exited.send(child.wait());
        });
        let status = exit
            .recv_timeout(reconciled_tests::EXIT_DEADLINE)
            .expect("the server exits within the deadline of SIGTERM")
            .expect("the server is reaped");
        assert!(
            status.success(),
            "round {round}: SIGTERM right after the listening line must be a clean shutdown, got {status}"
        );
        // Kept open until the server exited: a closed stdout would make its
        // last lines fail.
        drop(lines);
    }
}

/// The server turns transparent huge pages off for itself: with them its
/// large requests made the kernel zero and split 2 MiB pages, which cost a
/// client's 1,000-item SubmitIntents more than half their throughput
/// (docs/performance.md, "Transparent huge pages").
#[tokio::test]
async fn the_server_runs_without_transparent_huge_pages() {
    let server = ServerProcess::start(ServerOptions::default())
        .await
        .expect("server starts");
    let pid = server.pid().expect("the server runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let line = status
        .lines()
        .find(|line| line.starts_with("THP_enabled:"))
        .expect("the kernel reports THP_enabled (Linux 5.0 and later)");
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
}
