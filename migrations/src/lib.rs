//! Numbered store migrations for reconciled.
#![forbid(unsafe_code)]
