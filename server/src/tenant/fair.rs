//! The bounded worker pool that tenants share fairly (DESIGN section 5:
//! "a tenant with 100k items cannot starve one with 3").
//!
//! Heavy work (a large tenant's pass, the validation of a large request)
//! runs only while it holds one of a few *seats*, at most one per spare
//! core, so that however many tenants are busy, the async workers that
//! answer everyone's small calls keep their cores. When every seat is
//! taken, the next one goes to the waiting tenant that used the least seat
//! time recently (its use decays by half every [`HALF_LIFE`]), and within a
//! tenant in arrival order: a tenant that floods the server with large work
//! waits behind one that asks for little, instead of the other way round.
//!
//! Small work runs at once on the async worker that asked for it. What
//! hurts everyone else's small calls there is not how much a tenant runs
//! but how long each piece holds a worker: a call queued behind ten pieces
//! of a millisecond waits ten milliseconds. So each piece's CPU time beyond
//! [`INLINE_ALLOWANCE`] (at most [`INLINE_CHARGE_CAP`]) is charged to its
//! tenant (decayed like seat time), and a tenant whose charge passes
//! [`INLINE_EXCESS_LIMIT`] takes seats for
//! its small work as well, until the charge decays. One tenant's many small
//! but costly calls (twenty predicates to compile in a 21-item intent,
//! hundreds of times a second) then queue behind everyone's large work
//! instead of ahead of everyone's small calls, while a tenant sending
//! cheap calls, however many, is served at once.
//!
//! Seated work runs on a thread of lower scheduling priority
//! ([`run_below_async_workers`], about nice 10: [`HEAVY_PRIORITY`]): when
//! the cores are short, the operating system gives most of them to the
//! threads that answer calls, so a flood of large work slows down large
//! work more than every tenant's small calls. It is deliberately *not*
//! `SCHED_IDLE`, which answers calls a little sooner but gets next to no
//! CPU while any normal thread on the machine is runnable: another busy
//! process on the host (or the server's own small calls keeping every core
//! busy) then stalls large tenants' passes for minutes, with no way back
//! (an unprivileged thread cannot leave `SCHED_IDLE`). A niced thread
//! keeps about a tenth of a contended core. See docs/performance.md,
//! "Hostile tenants", item 11.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::thread_cpu::ThreadCpuTime;

/// Priority of the threads of seated work on the portable 0..=99 scale
/// (about nice 10 on Linux: a tenth of a normal thread's share of a busy
/// core, and all of an idle one).
const HEAVY_PRIORITY: u8 = 23;

/// Runs `work` on a thread of lower scheduling priority and waits for it
/// (blocking the caller: call it from `block_in_place` or a blocking
/// thread). A panic in `work` is resumed here.
///
/// The threads are a pool kept for the server's life ([`heavy_pool`]):
/// one per seat and one more, so work that takes no seat (the decoding
/// layer's walks) always finds a thread that seated work cannot hold. A
/// thread started for every piece cost a third of its time in the
/// allocator and the kernel setting up the new thread's memory.
pub fn run_below_async_workers<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    match heavy_pool() {
        // In the caller's span (a tenant's owner, a request): what the
        // work logs names them as if it ran in place.
        Some(pool) => {
            let span = tracing::Span::current();
            pool.install(move || span.in_scope(work))
        }
        // No thread could be started: the work is done on this thread.
        None => work(),
    }
}

/// The pool of [`run_below_async_workers`], started on first use;
/// `None` if its threads cannot be started.
fn heavy_pool() -> Option<&'static rayon_core::ThreadPool> {
    static POOL: OnceLock<Option<rayon_core::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon_core::ThreadPoolBuilder::new()
            .num_threads(FairWorkers::default_seats() + 1)
            .thread_name(|index| format!("tenant-heavy-{index}"))
            .start_handler(|_| lower_priority())
            .build()
            .inspect_err(|error| {
                tracing::warn!(%error, "Cannot start the threads for heavy work; it runs on the async workers' threads.");
            })
            .ok()
    })
    .as_ref()
}

/// Runs `work` on a thread below the async workers
/// ([`run_below_async_workers`]) while this task's worker is handed over to
/// the runtime (`block_in_place`); in a single-threaded runtime (tests),
/// simply here.
pub fn off_async_workers<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|handle| handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_thread {
        tokio::task::block_in_place(|| run_below_async_workers(work))
    } else {
        work()
    }
}

/// Runs `tenant`'s `work` fairly: when it is `large`, or the tenant's
/// recent small work ran long ([`INLINE_EXCESS_LIMIT`]), on a seat of
/// `workers` and off the async workers ([`off_async_workers`]); otherwise
/// here at once, what it takes beyond [`INLINE_ALLOWANCE`] charged to the
/// tenant.
pub async fn fairly<T: Send>(
    workers: &Arc<FairWorkers>,
    tenant: u64,
    large: bool,
    work: impl FnOnce() -> T + Send,
) -> T {
    if large || workers.ran_long_inline(tenant) {
        let _seat = workers.seat(tenant).await;
        off_async_workers(work)
    } else {
        let started = ThreadCpuTime::now();
        let value = work();
        workers.charge_inline(tenant, started.elapsed());
        value
    }
}

/// Lowers the calling thread's scheduling priority to [`HEAVY_PRIORITY`]
/// (a nice value on Linux, never `SCHED_IDLE`: see the module docs); a
/// failure (a platform without niceness) leaves it as it was, which is
/// only less fair.
fn lower_priority() {
    if let Ok(priority) = HEAVY_PRIORITY.try_into() {
        let _ = thread_priority::set_current_thread_priority(
            thread_priority::ThreadPriority::Crossplatform(priority),
        );
    }
}

/// How fast a tenant's recent use of seats (and of the async workers) is
/// forgotten.
pub const HALF_LIFE: Duration = Duration::from_secs(1);

/// How long one piece of small work may hold an async worker without a
/// charge: validating a 10-item intent or planning a small tenant's pass
/// takes tens of microseconds, a pass on one result of a 2,000-item tenant
/// a few hundred.
pub const INLINE_ALLOWANCE: Duration = Duration::from_micros(500);

/// The most one piece is charged: a single long piece (the first pass over
/// a 2,000-item intent, some 20 ms) does not by itself move its tenant to
/// seats; three in a second do.
pub const INLINE_CHARGE_CAP: Duration = Duration::from_millis(2);

/// How much time beyond [`INLINE_ALLOWANCE`] a tenant's small work may
/// have taken recently (decayed every [`HALF_LIFE`]) before its small work
/// takes seats too: a steady stream of millisecond pieces passes it within
/// about ten calls.
pub const INLINE_EXCESS_LIMIT: Duration = Duration::from_millis(5);

/// The seats of heavy work and who waits for them.
#[derive(Debug)]
pub struct FairWorkers {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: usize,
    /// Each tenant's decayed seat time (seconds), and when it was decayed.
    used: HashMap<u64, (f64, Instant)>,
    /// Each tenant's decayed time of small work on the async workers
    /// beyond [`INLINE_ALLOWANCE`] per piece.
    inline: HashMap<u64, (f64, Instant)>,
    waiting: Vec<Waiter>,
    arrivals: u64,
}

#[derive(Debug)]
struct Waiter {
    tenant: u64,
    arrival: u64,
    grant: oneshot::Sender<Seat>,
}

/// One seat of heavy work, charged to its tenant when dropped.
#[derive(Debug)]
pub struct Seat {
    workers: Arc<FairWorkers>,
    tenant: u64,
    since: Instant,
    /// False for a seat that was never handed out (a grant whose waiter had
    /// gone): dropping it frees nothing.
    held: bool,
}

impl FairWorkers {
    /// A pool of `seats` seats (at least one).
    pub fn new(seats: usize) -> Arc<Self> {
        let seats = seats.max(1);
        Arc::new(Self {
            state: Mutex::new(State {
                free: seats,
                used: HashMap::new(),
                inline: HashMap::new(),
                waiting: Vec::new(),
                arrivals: 0,
            }),
        })
    }

    /// The default size: every core but one for the async workers, at
    /// least one.
    pub fn default_seats() -> usize {
        std::thread::available_parallelism()
            .map_or(1, |cores| cores.get().saturating_sub(1))
            .max(1)
    }

    /// Waits for a seat for `tenant`'s heavy work.
    pub async fn seat(self: &Arc<Self>, tenant: u64) -> Seat {
        loop {
            let receiver = {
                let mut state = self.lock();
                if state.free > 0 && state.waiting.is_empty() {
                    state.free -= 1;
                    return self.handed_to(tenant);
                }
                let (grant, receiver) = oneshot::channel();
                state.arrivals += 1;
                let arrival = state.arrivals;
                state.waiting.push(Waiter {
                    tenant,
                    arrival,
                    grant,
                });
                receiver
            };
            // The pool never drops a waiter without granting it a seat;
            // should that change, queueing again is still correct.
            if let Ok(seat) = receiver.await {
                return seat;
            }
        }
    }

    fn handed_to(self: &Arc<Self>, tenant: u64) -> Seat {
        Seat {
            workers: self.clone(),
            tenant,
            since: Instant::now(),
            held: true,
        }
    }

    /// Whether `tenant`'s recent small work ran long: its charge passed
    /// [`INLINE_EXCESS_LIMIT`].
    fn ran_long_inline(&self, tenant: u64) -> bool {
        let mut state = self.lock();
        decay(&mut state.inline, tenant, Instant::now()) > INLINE_EXCESS_LIMIT.as_secs_f64()
    }

    /// Charges `tenant` for a piece of small work that held an async worker
    /// for `took`: what it took beyond [`INLINE_ALLOWANCE`], at most
    /// [`INLINE_CHARGE_CAP`].
    fn charge_inline(&self, tenant: u64, took: Duration) {
        let Some(excess) = took.checked_sub(INLINE_ALLOWANCE).filter(|e| !e.is_zero()) else {
            return;
        };
        let excess = excess.min(INLINE_CHARGE_CAP);
        let mut state = self.lock();
        let now = Instant::now();
        let used = decay(&mut state.inline, tenant, now) + excess.as_secs_f64();
        state.inline.insert(tenant, (used, now));
        forget_idle(&mut state.inline, now);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No update panics halfway, so a poisoned lock is still consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Charges a returned seat and hands it to the next waiter, or frees it.
    fn release(self: &Arc<Self>, tenant: u64, held_for: Duration) {
        let mut state = self.lock();
        let now = Instant::now();
        let used = state.decayed(tenant, now) + held_for.as_secs_f64();
        state.used.insert(tenant, (used, now));
        loop {
            let Some(next) = state.next_waiter(now) else {
                state.free += 1;
                forget_idle(&mut state.used, now);
                return;
            };
            let seat = self.handed_to(next.tenant);
            match next.grant.send(seat) {
                Ok(()) => return,
                // The waiter gave up: the seat goes to the next one.
                Err(mut unclaimed) => unclaimed.held = false,
            }
        }
    }
}

/// `tenant`'s use in `uses` decayed to `now`.
fn decay(uses: &mut HashMap<u64, (f64, Instant)>, tenant: u64, now: Instant) -> f64 {
    let Some((used, at)) = uses.get_mut(&tenant) else {
        return 0.0;
    };
    *used *= decay_factor(*at, now);
    *at = now;
    *used
}

/// What is left at `now` of a use recorded at `at`.
fn decay_factor(at: Instant, now: Instant) -> f64 {
    let halvings = now.duration_since(at).as_secs_f64() / HALF_LIFE.as_secs_f64();
    0.5_f64.powf(halvings)
}

/// Drops the use of tenants that have all but forgotten it, so the map
/// holds only recently busy tenants.
fn forget_idle(uses: &mut HashMap<u64, (f64, Instant)>, now: Instant) {
    if uses.len() < 1024 {
        return;
    }
    uses.retain(|_, (used, at)| *used * decay_factor(*at, now) >= 1e-6);
}

impl State {
    /// `tenant`'s seat use decayed to `now`.
    fn decayed(&mut self, tenant: u64, now: Instant) -> f64 {
        decay(&mut self.used, tenant, now)
    }

    /// Removes the waiter whose tenant used least (earliest arrival first
    /// among equals).
    fn next_waiter(&mut self, now: Instant) -> Option<Waiter> {
        let mut best: Option<(usize, f64, u64)> = None;
        for index in 0..self.waiting.len() {
            let (tenant, arrival) = (self.waiting[index].tenant, self.waiting[index].arrival);
            let used = self.decayed(tenant, now);
            let better = best.is_none_or(|(_, best_used, best_arrival)| {
                used < best_used || (used == best_used && arrival < best_arrival)
            });
            if better {
                best = Some((index, used, arrival));
            }
        }
        best.map(|(index, _, _)| self.waiting.swap_remove(index))
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        if self.held {
            self.held = false;
            self.workers.release(self.tenant, self.since.elapsed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seated work must keep a share of a busy machine's CPU: a
    /// `SCHED_IDLE` thread starves while any other process keeps a core
    /// busy (a 30,000-item chain made no progress for minutes next to two
    /// busy loops), and cannot be raised again without privileges.
    #[cfg(target_os = "linux")]
    #[test]
    fn seated_work_runs_niced_not_at_idle_policy() {
        let (policy, nice) = run_below_async_workers(|| {
            let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("own stat");
            // Fields after the command name (which ends at the last ')'):
            // state is field 3; nice is 19 and policy 41 of proc(5).
            let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..]
                .split(' ')
                .collect();
            let field = |n: usize| fields[n - 3].parse::<i64>().expect("a number");
            (field(41), field(19))
        });
        assert_eq!(policy, 0, "seated work must stay SCHED_OTHER");
        assert!(
            (5..=15).contains(&nice),
            "seated work runs niced, got nice {nice}"
        );
    }

    #[tokio::test]
    async fn a_free_seat_is_taken_at_once_and_comes_back() {
        let workers = FairWorkers::new(1);
        let seat = workers.seat(1).await;
        drop(seat);
        let _again = workers.seat(2).await;
    }

    #[tokio::test]
    async fn the_tenant_that_used_less_gets_the_next_seat() {
        let workers = FairWorkers::new(1);
        // Tenant 1 has used the seat for a while.
        {
            let mut seat = workers.seat(1).await;
            seat.since -= Duration::from_millis(500);
        }
        let holder = workers.seat(1).await;
        let flooder = tokio::spawn({
            let workers = workers.clone();
            async move { workers.seat(1).await }
        });
        tokio::task::yield_now().await;
        while workers.lock().waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        let bystander = tokio::spawn({
            let workers = workers.clone();
            async move { workers.seat(2).await }
        });
        while workers.lock().waiting.len() < 2 {
            tokio::task::yield_now().await;
        }
        drop(holder);
        let seat = bystander.await.expect("bystander task");
        assert_eq!(seat.tenant, 2, "the tenant that used less goes first");
        assert!(!flooder.is_finished(), "the flooder waits for its turn");
        drop(seat);
        assert_eq!(flooder.await.expect("flooder task").tenant, 1);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_does_not_keep_the_seat() {
        let workers = FairWorkers::new(1);
        let holder = workers.seat(1).await;
        let gone = tokio::spawn({
            let workers = workers.clone();
            async move { workers.seat(2).await }
        });
        while workers.lock().waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        drop(holder);
        let _seat = workers.seat(3).await;
        assert_eq!(workers.lock().free, 0);
    }

    #[tokio::test]
    async fn a_tenant_whose_small_work_runs_long_takes_seats_for_it_too() {
        let workers = FairWorkers::new(1);
        assert_eq!(fairly(&workers, 1, false, || 7).await, 7);
        for _ in 0..10_000 {
            workers.charge_inline(1, INLINE_ALLOWANCE);
        }
        assert!(!workers.ran_long_inline(1), "short pieces cost nothing");
        workers.charge_inline(1, INLINE_ALLOWANCE + Duration::from_secs(1));
        assert!(!workers.ran_long_inline(1), "one long piece is not enough");
        for _ in 0..4 {
            workers.charge_inline(1, INLINE_ALLOWANCE + Duration::from_millis(1));
        }
        assert!(workers.ran_long_inline(1), "a stream of them is");
        assert!(!workers.ran_long_inline(2), "other tenants are not charged");

        // Its small work now waits for a seat like large work: while
        // another tenant holds the only seat, it does not run.
        let holder = workers.seat(2).await;
        let small = tokio::spawn({
            let workers = workers.clone();
            async move { fairly(&workers, 1, false, || 8).await }
        });
        while workers.lock().waiting.is_empty() {
            tokio::task::yield_now().await;
        }
        assert!(!small.is_finished());
        drop(holder);
        assert_eq!(small.await.expect("small work"), 8);
    }

    #[test]
    fn a_piece_of_work_is_timed_by_the_cpu_it_used_not_the_wall_clock() {
        let started = ThreadCpuTime::now();
        // Waiting (as a thread the kernel preempted would) uses no CPU.
        std::thread::sleep(Duration::from_millis(50));
        if started.is_cpu_time() {
            assert!(started.elapsed() < Duration::from_millis(25));
        }
    }

    #[test]
    fn inline_use_decays_like_seat_use() {
        let workers = FairWorkers::new(1);
        let now = Instant::now();
        workers.lock().inline.insert(
            3,
            (INLINE_EXCESS_LIMIT.as_secs_f64() * 1.5, now - HALF_LIFE),
        );
        assert!(
            !workers.ran_long_inline(3),
            "half of 1.5 limits is under one"
        );
    }

    #[test]
    fn use_decays_by_half_every_half_life() {
        let workers = FairWorkers::new(1);
        let now = Instant::now();
        let mut state = workers.lock();
        state.used.insert(7, (1.0, now - HALF_LIFE));
        let used = state.decayed(7, now);
        assert!((used - 0.5).abs() < 1e-9, "{used}");
    }
}
