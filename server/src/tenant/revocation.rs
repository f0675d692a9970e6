//! The signal that a tenant's token stopped being valid, with why: a
//! stream opened with the token ends with `UNAUTHENTICATED` and says
//! whether the token was rotated (reconnect with the new one) or the
//! tenant deleted (there is no new one).

use std::sync::{Arc, OnceLock};

use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
};

/// Why a tenant's token stopped being valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revoked {
    /// `RotateToken` replaced it.
    Rotated,
    /// The tenant was deleted.
    Deleted,
}

/// Cancelled when a tenant's current token stops being valid; then
/// [`why`](Self::why) says why. Clones share the signal. One that is never
/// revoked (the admin token's) is the default.
#[derive(Clone, Debug, Default)]
pub struct Revocation {
    cancelled: CancellationToken,
    why: Arc<OnceLock<Revoked>>,
}

impl Revocation {
    /// Ends every stream holding this signal, saying `why`.
    pub(super) fn revoke(&self, why: Revoked) {
        // Set before the cancel, so that a woken stream reads it.
        let _ = self.why.set(why);
        self.cancelled.cancel();
    }

    /// Why the token stopped being valid, once it has.
    pub fn why(&self) -> Option<Revoked> {
        self.why.get().copied()
    }

    /// Whether the token has stopped being valid.
    pub fn is_revoked(&self) -> bool {
        self.cancelled.is_cancelled()
    }

    /// Completes once the token stops being valid.
    pub fn revoked(&self) -> WaitForCancellationFuture<'_> {
        self.cancelled.cancelled()
    }

    /// [`revoked`](Self::revoked), owning the signal.
    pub fn revoked_owned(self) -> WaitForCancellationFutureOwned {
        self.cancelled.cancelled_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revocation_says_why_to_every_clone() {
        let revocation = Revocation::default();
        let held = revocation.clone();
        assert!(!held.is_revoked());
        assert_eq!(held.why(), None);
        revocation.revoke(Revoked::Deleted);
        assert!(held.is_revoked());
        assert_eq!(held.why(), Some(Revoked::Deleted));
        revocation.revoke(Revoked::Rotated);
        assert_eq!(held.why(), Some(Revoked::Deleted), "the first reason stays");
    }
}
