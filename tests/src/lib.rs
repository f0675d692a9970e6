//! Support code for black-box tests of the reconciled binary.
#![forbid(unsafe_code)]
