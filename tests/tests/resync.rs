//! Periodic resync with READ: a change made behind the service's back
//! (drift) is seen and corrected; an item that vanished is created again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reconciled_client::agent::{
    Configurator, Item, OperationContext, Outcome, ReadOutcome, TypeSpec,
};
use reconciled_tests::ServerOptions;
use reconciled_tests::agents::{RunningAgent, TestTenant, item_needing};
use serde_json::{Map, Value, json};
use tokio::sync::Notify;

/// A device whose value someone changes by hand after the first read-back
/// shows it (the first READ reports `v = 99`), and that loses the item
/// entirely on the second READ.
#[derive(Default)]
struct Device {
    log: Mutex<Vec<String>>,
    reads: AtomicUsize,
    changed: Notify,
}

impl Device {
    fn note(&self, entry: String) {
        if let Ok(mut log) = self.log.lock() {
            log.push(entry);
        }
        self.changed.notify_waiters();
    }

    fn entries(&self) -> Vec<String> {
        self.log.lock().map(|log| log.clone()).unwrap_or_default()
    }

    async fn wait_for(&self, entry: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let notified = self.changed.notified();
            if self.entries().iter().any(|e| e == entry) {
                return;
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(deadline) => panic!("never saw {entry:?}; saw {:?}", self.entries()),
            }
        }
    }
}

fn value_of(item: &Item) -> Value {
    item.properties.get("v").cloned().unwrap_or(Value::Null)
}

impl Configurator for Device {
    async fn create(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
        self.note(format!("create v={}", value_of(item)));
        Outcome::done()
    }

    async fn modify(&self, _ctx: &OperationContext, previous: &Item, item: &Item) -> Outcome {
        self.note(format!(
            "modify v={} -> v={}",
            value_of(previous),
            value_of(item)
        ));
        Outcome::done()
    }

    async fn delete(&self, _ctx: &OperationContext, item: &Item) -> Outcome {
        self.note(format!("delete v={}", value_of(item)));
        Outcome::done()
    }

    async fn read(&self, _ctx: &OperationContext, _item: &Item) -> ReadOutcome {
        let read = self.reads.fetch_add(1, Ordering::SeqCst);
        self.note(format!("read {read}"));
        match read {
            0 => {
                let mut observed = Map::new();
                observed.insert("v".into(), json!(99));
                ReadOutcome::Found { observed }
            }
            1 => ReadOutcome::NotFound,
            _ => {
                let mut observed = Map::new();
                observed.insert("v".into(), json!(1));
                ReadOutcome::Found { observed }
            }
        }
    }
}

/// A tenant with `--resync-interval-secs resync_secs`, a [`Device`] agent
/// whose type supports READ, and item `t/a` (v = 1) created on it.
async fn device_with_one_item(resync_secs: u64) -> (TestTenant, Arc<Device>, RunningAgent) {
    let options = ServerOptions::default()
        .arg("--resync-interval-secs")
        .arg(resync_secs.to_string());
    let tenant = TestTenant::start_with(options, "acme").await;
    let device = Arc::new(Device::default());
    let spec = TypeSpec::new("t").supports_read(true);
    let mut agent = RunningAgent::start(tenant.agent("agent-1").item_type(spec, device.clone()));
    agent.connected().await;
    tenant
        .submit(vec![item_needing("t", "a", json!({"v": 1}), &[])])
        .await;
    device.wait_for("create v=1").await;
    (tenant, device, agent)
}

#[tokio::test]
async fn drift_is_read_back_and_corrected_and_a_vanished_item_is_created_again() {
    let (tenant, device, _agent) = device_with_one_item(1).await;
    // The first resync reads v = 99: drift, corrected by a Modify from 99.
    device.wait_for("read 0").await;
    device.wait_for("modify v=99 -> v=1").await;
    // The next read finds nothing: the item is created again.
    device.wait_for("read 1").await;
    let log = device.entries();
    let after_vanish = log.iter().position(|e| e == "read 1").expect("second read");
    device.wait_for("read 2").await;
    let log_now = device.entries();
    assert!(
        log_now[after_vanish..].iter().any(|e| e == "create v=1"),
        "a vanished item is created again: {log_now:?}"
    );
    tenant.wait_until_ready().await;
}

#[tokio::test]
async fn reconcile_with_refresh_reads_now_and_corrects_drift_before_it_answers() {
    // The periodic resync is an hour away: only the refresh can find the
    // drift (the device's first READ reports v = 99).
    let (tenant, device, _agent) = device_with_one_item(3600).await;
    tenant.wait_until_ready().await;
    assert!(
        !device.entries().iter().any(|e| e.starts_with("read")),
        "no READ before the refresh: {:?}",
        device.entries()
    );

    let answer = tenant
        .reconciler()
        .reconcile(reconciled_proto::v1::ReconcileRequest {
            tenant: "acme".into(),
            wait: true,
            refresh: true,
            ..Default::default()
        })
        .await
        .expect("reconcile")
        .into_inner();
    assert!(answer.converged, "{answer:?}");
    let log = device.entries();
    let read = log.iter().position(|e| e == "read 0");
    let fixed = log.iter().position(|e| e == "modify v=99 -> v=1");
    assert!(
        matches!((read, fixed), (Some(read), Some(fixed)) if read < fixed),
        "the refresh read the drift and the call waited for its correction: {log:?}"
    );
}
