//! Each tenant's budget of request bytes in unary calls
//! (`max_tenant_bytes_per_second`): what one tenant sends is received,
//! checked and decoded on the cores every tenant shares, so a tenant that
//! sends more than its budget waits (`RESOURCE_EXHAUSTED` with a
//! `RetryInfo`) instead of slowing the others down.
//!
//! The budget refills at the configured rate up to four seconds' worth. A
//! call is admitted while its tenant's budget is not in debt and is then
//! charged its message's length (from the gRPC frame header, before the
//! body is buffered), so a message larger than the burst is still accepted
//! once, and the tenant's next calls wait until the debt is repaid.
//! Messages of at most [`ALWAYS_ADMITTED_BYTES`] (reads, status checks,
//! small intents) are charged but never refused: a tenant in debt can
//! still look at what it did.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::lock;

/// Messages up to this length are admitted even in debt (and charged).
pub const ALWAYS_ADMITTED_BYTES: usize = 4 * 1024;

/// Seconds of budget a tenant may save up.
const BURST_SECONDS: f64 = 4.0;

/// Tenants whose budget is full are forgotten past this many entries.
const MAX_REMEMBERED: usize = 4096;

/// The request-byte budgets of all tenants.
#[derive(Debug)]
pub struct TenantBytes {
    rate: f64,
    /// Each tenant's balance (bytes; negative: debt) and when it was
    /// refilled.
    balances: Mutex<HashMap<u64, (f64, Instant)>>,
}

impl TenantBytes {
    /// Budgets of `rate` bytes per second per tenant.
    pub fn new(rate: u64) -> Self {
        Self {
            rate: rate.max(1) as f64,
            balances: Mutex::new(HashMap::new()),
        }
    }

    /// The configured rate, in bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate as u64
    }

    /// Charges `bytes` to `tenant`, or says how long until its budget is
    /// out of debt.
    pub fn charge(&self, tenant: u64, bytes: usize) -> Result<(), Duration> {
        self.charge_at(tenant, bytes, Instant::now())
    }

    fn charge_at(&self, tenant: u64, bytes: usize, now: Instant) -> Result<(), Duration> {
        let burst = self.rate * BURST_SECONDS;
        let mut balances = lock(&self.balances);
        if balances.len() >= MAX_REMEMBERED {
            let rate = self.rate;
            balances.retain(|_, (balance, at)| {
                *balance + now.duration_since(*at).as_secs_f64() * rate < burst
            });
        }
        let (balance, at) = balances.entry(tenant).or_insert((burst, now));
        let refilled = (*balance + now.duration_since(*at).as_secs_f64() * self.rate).min(burst);
        *at = now;
        if refilled < 0.0 && bytes > ALWAYS_ADMITTED_BYTES {
            *balance = refilled;
            return Err(Duration::from_secs_f64(-refilled / self.rate));
        }
        *balance = refilled - bytes as f64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_in_debt_waits_for_as_long_as_its_debt_takes_to_repay() {
        let budget = TenantBytes::new(1_000);
        let start = Instant::now();
        // Four seconds' worth is saved up; a larger message is still
        // accepted once.
        assert!(budget.charge_at(1, 6_000, start).is_ok());
        let wait = budget.charge_at(1, 5_000, start).expect_err("in debt");
        assert_eq!(wait, Duration::from_secs(2));
        assert!(
            budget.charge_at(1, ALWAYS_ADMITTED_BYTES, start).is_ok(),
            "a small message is admitted (and charged) in debt"
        );
        let wait = budget.charge_at(1, 5_000, start).expect_err("in debt");
        assert!(wait > Duration::from_secs(2));
        assert!(
            budget.charge_at(2, 10, start).is_ok(),
            "another tenant has its own budget"
        );
        let later = start + Duration::from_secs(7);
        assert!(
            budget.charge_at(1, 5_000, later).is_ok(),
            "the debt is repaid"
        );
    }

    #[test]
    fn saving_up_stops_at_four_seconds_worth() {
        let budget = TenantBytes::new(1_000);
        let start = Instant::now();
        assert!(budget.charge_at(1, 1, start).is_ok());
        let much_later = start + Duration::from_secs(3_600);
        assert!(budget.charge_at(1, 4_001, much_later).is_ok());
        assert!(budget.charge_at(1, 5_000, much_later).is_err());
    }
}
