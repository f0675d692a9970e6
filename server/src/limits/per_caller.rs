//! Calls one caller runs at once, for calls that take no global unary slot:
//! `Reconcile`, whose waits may last minutes. Counted per tenant (and once
//! for the admin), so one tenant's waits can neither take the slots other
//! tenants' calls need nor pile up without bound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::lock;
use crate::auth::Caller;

/// Whose budget a call is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Budget {
    Admin,
    Tenant(u64),
}

impl From<&Caller> for Budget {
    fn from(caller: &Caller) -> Self {
        match caller {
            Caller::Admin => Self::Admin,
            Caller::Tenant { tenant_id } => Self::Tenant(*tenant_id),
        }
    }
}

/// The calls each caller runs now, up to `max` each.
#[derive(Debug)]
pub struct PerCaller {
    max: usize,
    running: Mutex<HashMap<Budget, usize>>,
}

/// One running call; its caller's count drops when it is dropped.
#[derive(Debug)]
pub struct PerCallerPermit {
    calls: Arc<PerCaller>,
    budget: Budget,
}

impl PerCaller {
    /// At most `max` calls per caller at once.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            running: Mutex::new(HashMap::new()),
        })
    }

    /// A permit for one more call of `caller`, or `None` when it runs
    /// `max` already.
    pub fn admit(self: &Arc<Self>, caller: &Caller) -> Option<PerCallerPermit> {
        let budget = Budget::from(caller);
        let mut running = lock(&self.running);
        let count = running.entry(budget).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(PerCallerPermit {
            calls: self.clone(),
            budget,
        })
    }

    /// The most calls one caller may run at once.
    pub fn max(&self) -> usize {
        self.max
    }
}

impl Drop for PerCallerPermit {
    fn drop(&mut self) {
        let mut running = lock(&self.calls.running);
        if let Some(count) = running.get_mut(&self.budget) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                running.remove(&self.budget);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_has_its_own_budget_and_permits_give_it_back() {
        let calls = PerCaller::new(2);
        let acme = Caller::Tenant { tenant_id: 1 };
        let first = calls.admit(&acme).expect("first");
        let _second = calls.admit(&acme).expect("second");
        assert!(calls.admit(&acme).is_none(), "a third waits for a permit");
        assert!(
            calls.admit(&Caller::Tenant { tenant_id: 2 }).is_some(),
            "another tenant is not held up"
        );
        assert!(calls.admit(&Caller::Admin).is_some());
        drop(first);
        assert!(
            calls.admit(&acme).is_some(),
            "a finished call frees its place"
        );
    }
}
