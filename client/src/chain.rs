//! An error printed with its causes, each once.

/// `error` followed by its sources, e.g. `transport error: tcp connect
/// error: Connection refused (os error 111)`. Transport errors wrap one
/// another with the same text ("tcp connect error: tcp connect error:
/// ..."): a cause that repeats the one before it is said once.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut last = text.clone();
    let mut source = error.source();
    while let Some(cause) = source {
        let piece = cause.to_string();
        if piece != last {
            text.push_str(": ");
            text.push_str(&piece);
            last = piece;
        }
        source = cause.source();
    }
    text
}
