//! 0001: an empty database gets the global records every later version expects.

use crate::layout::{FIRST_TENANT_ID, NEXT_TENANT_ID_KEY};
use crate::{MigrationError, MigrationStore};

/// Writes the next-tenant-id counter unless it exists (the runner records the
/// schema version in the same write).
pub(super) fn apply(store: &dyn MigrationStore) -> Result<(), MigrationError> {
    if store.get(NEXT_TENANT_ID_KEY)?.is_some() {
        return Ok(());
    }
    store.apply(
        vec![(
            NEXT_TENANT_ID_KEY.to_vec(),
            FIRST_TENANT_ID.to_be_bytes().to_vec(),
        )],
        Vec::new(),
    )
}
