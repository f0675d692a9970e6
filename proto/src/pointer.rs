//! The one check of a `recreate_on_change` path, shared by the agent SDK
//! (when an agent declares its types) and the server (at `Register`), so
//! the two cannot disagree about what a path is.
//!
//! A path is a JSON Pointer (RFC 6901): empty (the whole properties object)
//! or a sequence of `/`-prefixed reference tokens in which `~` appears only
//! as `~0` (a literal `~`) or `~1` (a literal `/`). The one other accepted
//! value is `*`: items of the type are never modified in place.

use std::fmt;

/// The `recreate_on_change` value that means "never modify in place".
pub const RECREATE_ALWAYS: &str = "*";

/// Why a `recreate_on_change` path is not a JSON Pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PointerError {
    /// The path does not start with `/` (e.g. `key` instead of `/key`).
    MissingLeadingSlash,
    /// A `~` at this byte offset is not followed by `0` or `1`.
    BadEscape {
        /// The byte offset of the `~`.
        offset: usize,
    },
}

impl fmt::Display for PointerError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingLeadingSlash => formatter.write_str(
                "is not a JSON Pointer: it must be empty or start with '/' (write \"/key\", not \
                 \"key\"), or be \"*\" to recreate on any change",
            ),
            Self::BadEscape { offset } => write!(
                formatter,
                "is not a JSON Pointer: the '~' at byte {offset} must be followed by '0' (for '~') \
                 or '1' (for '/')"
            ),
        }
    }
}

impl std::error::Error for PointerError {}

/// Checks one `recreate_on_change` entry: a JSON Pointer (RFC 6901) or `*`.
///
/// ```text
/// check_recreate_path("/vlan")     -> Ok
/// check_recreate_path("/a~1b")     -> Ok   (the property "a/b")
/// check_recreate_path("*")         -> Ok
/// check_recreate_path("vlan")      -> Err(MissingLeadingSlash)
/// check_recreate_path("/a~2")      -> Err(BadEscape { offset: 2 })
/// ```
pub fn check_recreate_path(path: &str) -> Result<(), PointerError> {
    if path == RECREATE_ALWAYS || path.is_empty() {
        return Ok(());
    }
    if !path.starts_with('/') {
        return Err(PointerError::MissingLeadingSlash);
    }
    let bytes = path.as_bytes();
    for (offset, byte) in bytes.iter().enumerate() {
        if *byte == b'~' && !matches!(bytes.get(offset + 1), Some(b'0' | b'1')) {
            return Err(PointerError::BadEscape { offset });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_and_the_star_are_accepted() {
        for path in [
            "", "*", "/", "/vlan", "/vlan/id", "/a~0b", "/a~1b", "/0", "/~01",
        ] {
            assert_eq!(check_recreate_path(path), Ok(()), "{path:?}");
        }
    }

    #[test]
    fn a_path_without_its_leading_slash_is_refused() {
        for path in ["key", "vlan/id", "**", " /key"] {
            assert_eq!(
                check_recreate_path(path),
                Err(PointerError::MissingLeadingSlash),
                "{path:?}"
            );
        }
    }

    #[test]
    fn a_tilde_is_only_an_escape() {
        assert_eq!(
            check_recreate_path("/a~2"),
            Err(PointerError::BadEscape { offset: 2 })
        );
        assert_eq!(
            check_recreate_path("/a~"),
            Err(PointerError::BadEscape { offset: 2 })
        );
        assert_eq!(
            check_recreate_path("/~"),
            Err(PointerError::BadEscape { offset: 1 })
        );
        let message = PointerError::MissingLeadingSlash.to_string();
        assert!(message.contains("\"/key\""), "{message}");
    }
}
