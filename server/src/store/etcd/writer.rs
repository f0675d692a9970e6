//! The commit writer: one task that applies commits in the order they were
//! queued.
//!
//! Callers rely on that order (a later commit of a key wins, an empty
//! commit waits for every earlier one), so commits are applied in groups,
//! in order. A group is every queued commit that fits, together, in one
//! etcd transaction (at most `max_txn_ops` keys and `max_request_bytes`),
//! merged so that the later write to a key wins: commits of many tenants
//! share one transaction and one raft proposal, as they share one fsync on
//! sled. A commit too large for one transaction is applied on its own as a
//! staged commit (see [`staged`](super::staged)).
//!
//! Groups that write no key in common are applied concurrently (up to
//! eight at a time): commits of different tenants do not wait for each
//! other's round trips, while a later write to a key still waits for the
//! earlier one.
//!
//! Every distinct [`Fence`] of a group is a compare of its transaction.
//! If one no longer holds, the commits under it fail with
//! [`StoreError::Fenced`] and the others are applied without them.
//!
//! Every key a group writes is a compare too: "last written at or below
//! the highest revision this store has seen" (`R`). A transaction whose
//! answer is late is sent again, so two attempts of one group may be in
//! flight. Whichever lands first makes the other's compares fail, and so
//! does any later commit that puts one of its keys. A later commit that
//! *deletes* one of its keys would not: etcd keeps no revision for a
//! deleted key. So every transaction also compares its attempt key
//! (`store/attempts/<id>`, one id per transaction) as absent, and every
//! attempt after the first creates it, whether it lands or is refused:
//! once a retry has been answered, the first attempt, which etcd may
//! still hold back, can no longer land at all (a later retry held back
//! likewise fails, as the key exists). A transaction answered at its
//! first attempt, the usual case, creates nothing. When an attempt is
//! refused while every fence holds, the group reads its keys back in the
//! same transaction: if they hold what it writes, an earlier attempt
//! landed and the group is done; otherwise a key was written meanwhile by
//! someone else (a reader rolling a staged commit in, a writer outside
//! this store), `R` moves past what was read, and the group is sent again
//! as a new transaction (the later write wins, as it always did).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::store::etcd::codec::{KeyWrite, WRITE_OVERHEAD, coalesce, write_bytes};
use crate::store::etcd::connect::{Failure, Shared, fenced, invalid_fence, retry, stop_process};
use crate::store::etcd::staged::{self, Staged};
use crate::store::{Fence, StoreError, WriteBatch};

/// Where the answer to one commit goes.
pub(crate) enum Reply {
    /// An awaited [`CommitHandle`](crate::store::CommitHandle).
    Async(oneshot::Sender<Result<(), StoreError>>),
    /// A thread blocked in `commit_blocking`.
    Blocking(SyncSender<Result<(), StoreError>>),
}

impl Reply {
    fn send(self, result: Result<(), StoreError>) {
        // A caller that has gone away no longer needs the answer.
        match self {
            Reply::Async(sender) => {
                let _ = sender.send(result);
            }
            Reply::Blocking(sender) => {
                let _ = sender.send(result);
            }
        }
    }
}

/// A validated batch waiting for the writer.
pub(crate) struct CommitRequest {
    /// The batch.
    pub(crate) batch: WriteBatch,
    /// Where its outcome goes.
    pub(crate) reply: Reply,
}

/// One commit of a group, its writes coalesced.
struct Member {
    writes: Vec<KeyWrite>,
    fence: Option<Fence>,
    reply: Reply,
}

impl Member {
    /// An empty commit without a fence: it only waits for every earlier
    /// commit.
    fn is_barrier(&self) -> bool {
        self.writes.is_empty() && self.fence.is_none()
    }

    fn new(request: CommitRequest) -> Self {
        let fence = request.batch.fence().cloned();
        Self {
            writes: coalesce(request.batch.into_writes()),
            fence,
            reply: request.reply,
        }
    }
}

/// Commits merged into one transaction.
#[derive(Default)]
struct Group {
    members: Vec<Member>,
    index: HashMap<Vec<u8>, usize>,
    merged: Vec<KeyWrite>,
    bytes: usize,
    fences: Vec<Fence>,
}

impl Group {
    /// Adds `member` if the group still fits one transaction with it.
    fn try_add(&mut self, member: Member, max_ops: usize, max_bytes: usize) -> Result<(), Member> {
        let mut new_keys = 0;
        let mut bytes = self.bytes;
        for write in &member.writes {
            match self.index.get(&write.0) {
                Some(&at) => {
                    bytes = bytes - write_bytes(&self.merged[at]) + write_bytes(write);
                }
                None => {
                    new_keys += 1;
                    bytes += write_bytes(write) + guard_bytes(&write.0);
                }
            }
        }
        let mut fences = self.fences.len();
        if let Some(fence) = &member.fence {
            if self
                .fences
                .iter()
                .any(|f| f.key == fence.key && f.mod_revision != fence.mod_revision)
            {
                // Two revisions of one key can never both hold.
                return Err(member);
            }
            if !self.fences.contains(fence) {
                fences += 1;
                bytes += fence.key.len() + WRITE_OVERHEAD;
            }
        }
        // Compares (and reads when refused): one per fence, per key, and
        // the attempt key's.
        let compares = self.merged.len() + new_keys + fences + 1;
        if !self.members.is_empty() && (compares > max_ops || bytes + ATTEMPT_BYTES > max_bytes) {
            return Err(member);
        }
        for write in &member.writes {
            match self.index.get(&write.0) {
                Some(&at) => self.merged[at].1 = write.1.clone(),
                None => {
                    self.index.insert(write.0.clone(), self.merged.len());
                    self.merged.push(write.clone());
                }
            }
        }
        if let Some(fence) = &member.fence
            && !self.fences.contains(fence)
        {
            self.fences.push(fence.clone());
        }
        self.bytes = bytes;
        self.members.push(member);
        Ok(())
    }

    /// True if the group (holding one member) is too large for one
    /// transaction.
    fn too_large(&self, max_ops: usize, max_bytes: usize) -> bool {
        self.merged.len() + self.fences.len() + 1 > max_ops
            || self.bytes + ATTEMPT_BYTES > max_bytes
    }
}

/// The size a key's compare and its read-back add to a request.
fn guard_bytes(key: &[u8]) -> usize {
    2 * (key.len() + WRITE_OVERHEAD)
}

/// What the attempt key adds to a transaction: its compare and its put in
/// either branch, `store/attempts/` and a 32-digit id. (The store's prefix
/// is left out here as it is for every key: it falls in the headroom
/// `max_request_bytes` leaves below etcd's own limit.)
const ATTEMPT_BYTES: usize = 3 * (48 + WRITE_OVERHEAD);

/// Groups applied at once, at most. Groups in flight never share a key.
const PARALLEL_GROUPS: usize = 8;

/// The groups being applied, and the keys each writes.
struct InFlight {
    tasks: JoinSet<bool>,
    keys: HashMap<tokio::task::Id, HashSet<Vec<u8>>>,
    limit: usize,
}

impl InFlight {
    fn new(limit: usize) -> Self {
        Self {
            tasks: JoinSet::new(),
            keys: HashMap::new(),
            limit: limit.max(1),
        }
    }

    /// Takes note of an ended group; false if it stopped at a test's crash
    /// point (the writer must stop too).
    fn ended(&mut self, joined: Result<(tokio::task::Id, bool), tokio::task::JoinError>) -> bool {
        match joined {
            Ok((id, went_on)) => {
                self.keys.remove(&id);
                went_on
            }
            Err(error) => {
                self.keys.remove(&error.id());
                error!("A commit task of the etcd store panicked.");
                true
            }
        }
    }

    /// Waits until a group writing `keys` may start: no group in flight
    /// writes any of them, and there is room. False at a crash point.
    async fn wait_for_room(&mut self, keys: &HashSet<Vec<u8>>) -> bool {
        loop {
            while let Some(joined) = self.tasks.try_join_next_with_id() {
                if !self.ended(joined) {
                    return false;
                }
            }
            let conflict = self.keys.values().any(|busy| !busy.is_disjoint(keys));
            if !conflict && self.tasks.len() < self.limit {
                return true;
            }
            match self.tasks.join_next_with_id().await {
                Some(joined) => {
                    if !self.ended(joined) {
                        return false;
                    }
                }
                None => return true,
            }
        }
    }

    /// Waits until every group in flight has ended. False at a crash point.
    async fn drain(&mut self) -> bool {
        let mut went_on = true;
        while let Some(joined) = self.tasks.join_next_with_id().await {
            went_on &= self.ended(joined);
        }
        went_on
    }

    fn spawn(&mut self, keys: HashSet<Vec<u8>>, work: impl Future<Output = bool> + Send + 'static) {
        let handle = self.tasks.spawn(work);
        self.keys.insert(handle.id(), keys);
    }
}

/// Applies queued commits until the queue closes (the store was dropped)
/// or a test's crash point is reached.
///
/// Groups go out in queue order; a group may start while earlier ones are
/// still being applied only if it writes none of their keys (commits of
/// different tenants, say), so that a later write to a key always wins. An
/// empty commit waits for every earlier one.
pub(crate) async fn run(shared: Arc<Shared>, mut queue: mpsc::UnboundedReceiver<CommitRequest>) {
    let (max_ops, max_bytes) = (shared.options.max_txn_ops, shared.options.max_request_bytes);
    // A test's crash point must stop the writer before anything later goes;
    // a test's late attempts need one group after the other.
    let parallel = if shared.options.crash_point.is_some() || shared.options.resend_commits {
        1
    } else {
        PARALLEL_GROUPS
    };
    let resends = shared
        .options
        .resend_commits
        .then(|| Arc::new(LateAttempt::default()));
    let mut in_flight = InFlight::new(parallel);
    let mut carried: Option<Member> = None;
    loop {
        let first = match carried.take() {
            Some(member) => member,
            None => match queue.recv().await {
                Some(request) => Member::new(request),
                None => {
                    in_flight.drain().await;
                    return;
                }
            },
        };
        if first.is_barrier() {
            if !in_flight.drain().await {
                return;
            }
            first.reply.send(Ok(()));
            continue;
        }
        let mut group = Group::default();
        if let Err(member) = group.try_add(first, max_ops, max_bytes) {
            // Unreachable: an empty group takes any member.
            carried = Some(member);
            continue;
        }
        if group.too_large(max_ops, max_bytes) {
            let Some(member) = group.members.pop() else {
                continue;
            };
            let keys: HashSet<Vec<u8>> = member.writes.iter().map(|(key, _)| key.clone()).collect();
            if !in_flight.wait_for_room(&keys).await {
                return;
            }
            let (shared, resends) = (shared.clone(), resends.clone());
            in_flight.spawn(keys, async move {
                match staged::commit(&shared, member.writes, member.fence, resends.as_deref()).await
                {
                    Staged::Done(result) => {
                        member.reply.send(result);
                        true
                    }
                    Staged::Crashed => false,
                }
            });
            continue;
        }
        while let Ok(request) = queue.try_recv() {
            let member = Member::new(request);
            if member.is_barrier() {
                carried = Some(member);
                break;
            }
            if let Err(member) = group.try_add(member, max_ops, max_bytes) {
                carried = Some(member);
                break;
            }
        }
        let keys: HashSet<Vec<u8>> = group.index.keys().cloned().collect();
        if !in_flight.wait_for_room(&keys).await {
            return;
        }
        let (shared, resends) = (shared.clone(), resends.clone());
        in_flight.spawn(keys, async move {
            commit_group(&shared, group, resends.as_deref()).await;
            true
        });
    }
}

/// For tests ([`EtcdOptions::resend_commits`](super::EtcdOptions)): a
/// transaction that already went out, sent again once the next group has
/// landed, as a first attempt that etcd held back would land.
#[derive(Default)]
pub(crate) struct LateAttempt(Mutex<Option<Txn>>);

impl LateAttempt {
    /// Keeps `txn` to send once the next group has landed, and sends the
    /// one kept before (the previous group has just landed).
    pub(crate) async fn hold(&self, shared: &Shared, txn: Txn) {
        let earlier = self.0.lock().await.replace(txn);
        if let Some(earlier) = earlier {
            let _ = shared.kv.clone().txn(earlier).await;
        }
    }
}

/// The transaction of `group`: its fences, "each key last written below
/// `written_below`" and "`attempt` absent" as compares; its writes; and
/// when refused, the fences and the keys read back. A `retry` also
/// creates `attempt`, in either branch.
fn group_txn(
    shared: &Shared,
    group: &Group,
    written_below: i64,
    attempt: &[u8],
    retry: bool,
) -> Txn {
    let layout = &shared.layout;
    let mut compares = Vec::with_capacity(group.fences.len() + group.merged.len() + 1);
    let mut reads = Vec::with_capacity(compares.capacity());
    for fence in &group.fences {
        let Some(key) = layout.cluster(&fence.key) else {
            continue;
        };
        compares.push(Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            fence.mod_revision,
        ));
        reads.push(TxnOp::get(key, None));
    }
    let mut operations = Vec::with_capacity(group.merged.len() + 1);
    for (key, value) in &group.merged {
        let key = layout.data(key);
        compares.push(Compare::mod_revision(
            key.clone(),
            CompareOp::Less,
            written_below,
        ));
        reads.push(TxnOp::get(key.clone(), None));
        operations.push(match value {
            Some(value) => TxnOp::put(key, value.clone(), None),
            None => TxnOp::delete(key, None),
        });
    }
    compares.push(Compare::version(attempt.to_vec(), CompareOp::Equal, 0));
    if retry {
        operations.push(TxnOp::put(attempt.to_vec(), Vec::new(), None));
        reads.push(TxnOp::put(attempt.to_vec(), Vec::new(), None));
    }
    Txn::new()
        .when(compares)
        .and_then(operations)
        .or_else(reads)
}

/// Applies a group as one transaction, failing the commits whose fence
/// does not hold and applying the others.
async fn commit_group(shared: &Shared, mut group: Group, late: Option<&LateAttempt>) {
    loop {
        if group.merged.is_empty() && group.fences.is_empty() {
            succeed_all(group);
            return;
        }
        if let Some(fence) = group
            .fences
            .iter()
            .find(|fence| shared.layout.cluster(&fence.key).is_none())
        {
            let error = invalid_fence(fence);
            fail_all(group, error);
            return;
        }
        let written_below = shared.seen_revision.load(Ordering::Acquire) + 1;
        let attempt = shared.layout.attempt(&staged::new_id());
        let first = group_txn(shared, &group, written_below, &attempt, false);
        let mut sent = 0;
        if late.is_some() {
            // A first attempt whose answer is lost.
            let _ = shared.kv.clone().txn(first.clone()).await;
            sent += 1;
        }
        let started = std::time::Instant::now();
        let outcome = retry("commit a batch", shared.options.commit_timeout, || {
            // A retry's transaction is built only when one is needed.
            let txn = match sent {
                0 => first.clone(),
                _ => group_txn(shared, &group, written_below, &attempt, true),
            };
            sent += 1;
            let mut kv = shared.kv.clone();
            async move { kv.txn(txn).await }
        })
        .await;
        shared.latency.commits.observe(started.elapsed());
        let response = match outcome {
            Ok(response) => response,
            Err(Failure::Refused(error)) => {
                fail_all(
                    group,
                    Failure::Refused(error).into_store_error("commit a batch"),
                );
                return;
            }
            Err(Failure::Unknown(error)) => stop_process(&error.to_string()),
        };
        shared.saw(response.header());
        let landed = response.succeeded()
            || match why_refused(&group, &response) {
                Refused::Landed => {
                    info!("A commit sent again had already landed: it is not applied twice.");
                    true
                }
                Refused::Overtaken { latest } => {
                    // The next attempt overwrites what it read, and only that.
                    shared.saw_revision(latest);
                    warn!(
                        written_below,
                        "A key of a commit was written after this store last read it (a staged \
                         commit a reader rolled in, or a writer outside this store); committing \
                         over it."
                    );
                    false
                }
                Refused::Fences(broken) => {
                    group = without_fenced(group, &broken);
                    false
                }
            };
        if landed {
            if let Some(late) = late {
                late.hold(shared, first).await;
            }
            succeed_all(group);
            return;
        }
    }
}

/// Why a group's transaction was refused, from what it read back.
enum Refused {
    /// These fences no longer hold (with each key's revision now).
    Fences(Vec<(Fence, i64)>),
    /// Every key holds what the group writes: an earlier attempt landed.
    Landed,
    /// A key was written since the store last read it; `latest` is the
    /// highest revision read back.
    Overtaken { latest: i64 },
}

/// Reads the refused branch of `group`'s transaction: its fences, then
/// its keys, in [`group_txn`]'s order.
fn why_refused(group: &Group, response: &etcd_client::TxnResponse) -> Refused {
    let mut reads = response.op_responses().into_iter().map(|op| match op {
        TxnOpResponse::Get(get) => get
            .kvs()
            .first()
            .map(|kv| (kv.mod_revision(), kv.value().to_vec())),
        _ => None,
    });
    let broken: Vec<(Fence, i64)> = group
        .fences
        .iter()
        .zip(reads.by_ref())
        .map(|(fence, now)| (fence, now.map_or(0, |(revision, _)| revision)))
        .filter(|(fence, now)| fence.mod_revision != *now)
        .map(|(fence, now)| (fence.clone(), now))
        .collect();
    if !broken.is_empty() {
        return Refused::Fences(broken);
    }
    // The reads of the keys (a retry's put of its attempt key follows).
    let keys: Vec<Option<(i64, Vec<u8>)>> = reads.take(group.merged.len()).collect();
    let landed = group
        .merged
        .iter()
        .zip(&keys)
        .all(|((_, value), now)| now.as_ref().map(|(_, value)| value) == value.as_ref());
    if landed {
        return Refused::Landed;
    }
    let latest = keys.iter().flatten().map(|(revision, _)| *revision).max();
    Refused::Overtaken {
        latest: latest.unwrap_or(0),
    }
}

/// `group` without the commits whose fence is `broken` (each fails with
/// [`StoreError::Fenced`]).
fn without_fenced(group: Group, broken: &[(Fence, i64)]) -> Group {
    let mut rest = Group::default();
    for member in group.members {
        let refused = member
            .fence
            .as_ref()
            .and_then(|fence| broken.iter().find(|(f, _)| f == fence));
        match refused {
            Some((fence, now)) => member.reply.send(Err(fenced(fence, *now))),
            None => {
                // The members fitted together before, so fewer fit too.
                if let Err(member) = rest.try_add(member, usize::MAX, usize::MAX) {
                    member.reply.send(Err(StoreError::Closed));
                }
            }
        }
    }
    rest
}

fn succeed_all(group: Group) {
    for member in group.members {
        member.reply.send(Ok(()));
    }
}

fn fail_all(group: Group, error: StoreError) {
    for member in group.members {
        member.reply.send(Err(error.clone()));
    }
}
