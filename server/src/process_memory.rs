//! A process's memory as Linux reports it in `/proc/<pid>/status`: one
//! reader for every test and benchmark that measures memory (the server
//! crate's own tests, the black-box tests and `reconciled-bench`).

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_resident_memory_and_no_made_up_field() {
        let resident = status_bytes("/proc/self/status", "VmRSS").expect("Linux reports VmRSS");
        assert!(
            resident > 0 && resident.is_multiple_of(1024),
            "{resident} bytes"
        );
        let missing = status_bytes("/proc/self/status", "NoSuchField");
        assert!(missing.is_err_and(|error| error.contains("NoSuchField")));
    }
}
