//! The migrations shipped with this version of reconciled, in order.

mod m0001_create_layout;
mod m0002_binary_records;

use crate::Migration;

/// Every built-in migration, numbered 1..=N.
pub fn builtin() -> Vec<Migration> {
    vec![
        Migration {
            version: 1,
            name: "create layout",
            apply: m0001_create_layout::apply,
        },
        Migration {
            version: 2,
            name: "binary records",
            apply: m0002_binary_records::apply,
        },
    ]
}
