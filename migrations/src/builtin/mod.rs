//! The migrations shipped with this version of reconciled, in order.

mod m0001_create_layout;

use crate::Migration;

/// Every built-in migration, numbered 1..=N.
pub fn builtin() -> Vec<Migration> {
    vec![Migration {
        version: 1,
        name: "create layout",
        apply: m0001_create_layout::apply,
    }]
}
