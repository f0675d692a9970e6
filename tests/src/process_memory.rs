//! A process's memory as Linux reports it in `/proc/<pid>/status`.

/// Memory field `name` (e.g. `VmRSS`, `VmHWM`) of the process whose
/// status file is at `status_path` (`/proc/self/status` for this one), in
/// bytes.
///
/// # Errors
/// If the file cannot be read (not Linux, or the process is gone) or has
/// no such field: a test that measures memory must not pass without
/// measuring.
pub fn status_bytes(status_path: &str, name: &str) -> Result<u64, String> {
    let status = std::fs::read_to_string(status_path)
        .map_err(|error| format!("cannot read {status_path}: {error}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
        .ok_or_else(|| format!("{status_path} has no {name}"))
}
