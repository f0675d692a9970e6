//! `Agent::builder_from_env` against the real process environment. A test
//! cannot safely set variables of its own process (other tests run beside
//! it), so each test runs itself again as a child process with the
//! variables set, and the child checks what the builder made of them.

use std::process::Command;

use reconciled_client::prelude::*;

mod support;
use support::Instant;

/// Set in the child process: run the checks instead of spawning.
const CHILD: &str = "RECONCILED_CLIENT_TEST_ENV_CHILD";

/// Every variable the builder reads; the child starts without them.
const VARIABLES: [&str; 7] = [
    "RECONCILED_ADDR",
    "RECONCILED_TENANT",
    "RECONCILED_TOKEN",
    "RECONCILED_TOKEN_FILE",
    "RECONCILED_CA_CERT",
    "RECONCILED_CLIENT_CERT",
    "RECONCILED_CLIENT_KEY",
];

/// Runs `check` in a child process of this test binary that has exactly
/// `variables` of [`VARIABLES`] set; `test` is the calling test's name.
fn in_child_process(test: &str, variables: &[(&str, &str)], check: impl FnOnce()) {
    if std::env::var_os(CHILD).is_some() {
        check();
        return;
    }
    let mut command = Command::new(std::env::current_exe().expect("the test binary's path"));
    command
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    for name in VARIABLES {
        command.env_remove(name);
    }
    command.envs(variables.iter().copied());
    let output = command.output().expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the check in the child process failed:\n{stdout}\n{stderr}"
    );
}

#[test]
fn the_builder_reads_the_variables_reconctl_reads() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "rcd_from_file\n").expect("write the token");
    in_child_process(
        "the_builder_reads_the_variables_reconctl_reads",
        &[
            ("RECONCILED_ADDR", "127.0.0.1:50999"),
            ("RECONCILED_TENANT", "acme"),
            // Empty counts as unset, so this is no second token.
            ("RECONCILED_TOKEN", ""),
            (
                "RECONCILED_TOKEN_FILE",
                token_file.to_str().expect("a UTF-8 path"),
            ),
        ],
        || {
            let builder = Agent::builder_from_env().expect("the variables are complete");
            let shown = format!("{builder:?}");
            assert!(
                shown.contains("\"http://127.0.0.1:50999\"") && shown.contains("\"acme\""),
                "{shown}"
            );
            builder
                .item_type(TypeSpec::new("kv"), Instant)
                .build()
                .expect("the token file is read at build");
        },
    );
}

#[test]
fn a_missing_tenant_is_named_in_the_error_main_prints() {
    in_child_process(
        "a_missing_tenant_is_named_in_the_error_main_prints",
        &[("RECONCILED_TOKEN", "rcd_x")],
        || {
            let error = Agent::builder_from_env().expect_err("no tenant");
            assert_eq!(error, EnvError::MissingTenant);
            // A `main` returning `Result<(), AgentError>` prints it with
            // Debug: it says which variable to set.
            let printed = format!("{:?}", AgentError::from(error));
            assert!(printed.contains("set RECONCILED_TENANT"), "{printed}");
        },
    );
}
