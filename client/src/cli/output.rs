//! Writing to standard output: text, JSON and YAML documents, JSON lines.
//! A closed pipe (`reconctl watch | head -1`) ends the command quietly
//! instead of panicking.

use std::io::Write as _;

use serde_json::Value;

use super::args::OutputFormat;
use super::failure::{Exit, Failure};

/// Writes `text` to standard output as is, and flushes.
pub(crate) fn emit(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|error| {
            if error.kind() == std::io::ErrorKind::BrokenPipe {
                // The reader has gone: nothing left to say, and no error.
                Failure {
                    message: String::new(),
                    exit: Exit::Success,
                }
            } else {
                Failure::error(format!("cannot write to standard output: {error}"))
            }
        })
}

/// Writes `value` as pretty JSON.
pub(crate) fn emit_json(value: &Value) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|error| Failure::error(format!("cannot encode JSON: {error}")))?;
    emit(&(text + "\n"))
}

/// Writes `value` as one line of JSON.
pub(crate) fn emit_json_line(value: &Value) -> Result<(), Failure> {
    emit(&(value.to_string() + "\n"))
}

/// Writes `value` as YAML.
pub(crate) fn emit_yaml(value: &Value) -> Result<(), Failure> {
    let text = serde_yaml::to_string(value)
        .map_err(|error| Failure::error(format!("cannot encode YAML: {error}")))?;
    emit(&text)
}

/// Writes `value` as JSON or YAML, or `table()` for the table format.
pub(crate) fn emit_as(
    format: OutputFormat,
    value: impl FnOnce() -> Value,
    table: impl FnOnce() -> String,
) -> Result<(), Failure> {
    match format {
        OutputFormat::Table => emit(&table()),
        OutputFormat::Json => emit_json(&value()),
        OutputFormat::Yaml => emit_yaml(&value()),
    }
}
