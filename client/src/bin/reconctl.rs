//! `reconctl`: the operator's command-line tool for reconciled. See
//! `reconctl --help` and docs/reconctl.md.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    reconciled_client::cli::main()
}
