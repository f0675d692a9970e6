//! Writing to standard output: text, JSON and YAML documents, JSON lines.
//! A closed pipe (`reconctl watch | head -1`) ends the command quietly
//! instead of panicking.

use std::borrow::Cow;
use std::io::Write as _;

use serde_json::Value;

use super::args::OutputFormat;
use super::failure::{Exit, Failure};

/// Writes `text` to standard output, and flushes. Control characters
/// other than line feeds and tabs are written escaped (`\u{1b}`): names,
/// messages and values come from tenants and their agents, and must not
/// drive the operator's terminal (clear it, move the cursor over earlier
/// output, set its clipboard). JSON and YAML escape them already.
pub(crate) fn emit(text: &str) -> Result<(), Failure> {
    emit_control(&printable(text))
}

/// A line on standard error, between the lines on standard output (a
/// stream resumed, say), escaped like [`emit`]'s.
pub(crate) fn note(text: &str) {
    eprintln!("reconctl: {}", printable(text));
}

/// `text` with its control characters but line feeds and tabs escaped
/// (`\u{1b}`), for a terminal (see [`emit`]).
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_terminal_control) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for character in text.chars() {
        if is_terminal_control(character) {
            escaped.extend(character.escape_debug());
        } else {
            escaped.push(character);
        }
    }
    Cow::Owned(escaped)
}

/// A character a terminal may act on rather than show.
fn is_terminal_control(character: char) -> bool {
    character.is_control() && character != '\n' && character != '\t'
}

/// Writes `text` to standard output as is (control sequences included:
/// only for reconctl's own, such as the progress line's redraw), and
/// flushes.
pub(crate) fn emit_control(text: &str) -> Result<(), Failure> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_controls_are_the_control_characters_but_line_feed_and_tab() {
        for character in ['\u{1b}', '\u{7}', '\r', '\u{9b}', '\u{0}'] {
            assert!(is_terminal_control(character), "{character:?}");
        }
        for character in ['\n', '\t', 'a', ' ', '→'] {
            assert!(!is_terminal_control(character), "{character:?}");
        }
        assert_eq!(printable("a\u{1b}[2Jb\n"), "a\\u{1b}[2Jb\n");
    }
}
