//! Agent SDK and typed client for reconciled.
#![forbid(unsafe_code)]
