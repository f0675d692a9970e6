//! Deterministic simulation of one tenant's engine: the real owner
//! (planner, executor, persistence) under paused time, simulated agents,
//! crashes and clock steps, with invariants from DESIGN checked after every
//! step and a final phase that must converge. See `reconciled_tests::sim`
//! and docs/testing.md ("Deterministic simulation").
//!
//! A failure prints its seed, the broken invariant, the command that
//! replays it exactly and the trace of its steps. Longer explorations:
//! `cargo run --release -p reconciled-tests --bin reconciled-sim -- --seeds 1000`.

use std::time::Duration;

use reconciled_tests::sim;

/// Steps per seed before the final phase.
const STEPS: usize = 300;
/// Trace lines printed for a failure.
const TRACE_LINES: usize = 400;
/// Real time one seed may take (a debug build runs one in 1-3 s); a run
/// that takes longer hung (the owner never went idle).
const WATCHDOG: Duration = Duration::from_secs(30);

/// Seeds that still break an invariant (open defects, listed with their
/// diagnosis in docs/testing.md, "Open"); the sweeps skip them. Replay one
/// with `reconciled-sim --seed N`; once fixed, give it a test below.
const KNOWN_BAD: &[u64] = &[];

fn passes(seed: u64) {
    passes_in(seed, STEPS);
}

/// Like [`passes`], for a seed found with a longer run.
fn passes_in(seed: u64, steps: usize) {
    passes_with(seed, steps, sim::AgentFaults::SessionsEnd, sim::Drift::Off);
}

/// Like [`passes`], in a run whose agents' processes may restart.
fn passes_with_agent_restarts(seed: u64) {
    passes_with_agent_restarts_in(seed, STEPS);
}

/// Like [`passes_with_agent_restarts`], for a seed found with a longer run.
fn passes_with_agent_restarts_in(seed: u64, steps: usize) {
    passes_with(
        seed,
        steps,
        sim::AgentFaults::ProcessesRestart,
        sim::Drift::Off,
    );
}

/// Like [`passes`], in a run where items drift and agents may suffer
/// `agent_faults`.
fn passes_with_drift(seed: u64, agent_faults: sim::AgentFaults) {
    passes_with_drift_in(seed, STEPS, agent_faults);
}

/// Like [`passes_with_drift`], for a seed found with a longer run.
fn passes_with_drift_in(seed: u64, steps: usize, agent_faults: sim::AgentFaults) {
    passes_with(seed, steps, agent_faults, sim::Drift::On);
}

/// Seed `seed` passes `steps` steps with these agent faults and drift,
/// or the test fails with its report.
fn passes_with(seed: u64, steps: usize, agent_faults: sim::AgentFaults, drift: sim::Drift) {
    if let Err(failure) =
        sim::run_seed_watched_with_drift(seed, steps, WATCHDOG, agent_faults, drift)
    {
        panic!("{}", failure.report(steps, TRACE_LINES));
    }
}

/// Runs every seed of `seeds` not known bad; reports all that fail.
fn sweep(seeds: std::ops::Range<u64>) {
    sweep_with(seeds, sim::AgentFaults::SessionsEnd);
}

/// [`sweep`] with agents that may suffer `agent_faults`.
fn sweep_with(seeds: std::ops::Range<u64>, agent_faults: sim::AgentFaults) {
    let failures: Vec<String> = seeds
        .filter(|seed| !KNOWN_BAD.contains(seed))
        .filter_map(|seed| sim::run_seed_watched_with(seed, STEPS, WATCHDOG, agent_faults).err())
        .map(|failure| failure.report(STEPS, TRACE_LINES))
        .collect();
    assert!(
        failures.is_empty(),
        "{} seed(s) broke an invariant:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

// The sweeps: 60 seeds in four tests, so that the test harness runs them
// on every core. About a minute on two cores in a debug build.

#[test]
fn random_runs_keep_every_invariant_seeds_0_to_14() {
    sweep(0..15);
}

#[test]
fn random_runs_keep_every_invariant_seeds_15_to_29() {
    sweep(15..30);
}

#[test]
fn random_runs_keep_every_invariant_seeds_30_to_44() {
    sweep(30..45);
}

#[test]
fn random_runs_keep_every_invariant_seeds_45_to_59() {
    sweep(45..60);
}

#[test]
fn a_band_of_seeds_keeps_every_invariant_and_converges() {
    sweep(1000..1020);
}

// Agents whose processes restart, losing the results they had not
// reported: 30 seeds in two tests.

#[test]
fn random_runs_with_agent_restarts_keep_every_invariant_seeds_0_to_14() {
    sweep_with(0..15, sim::AgentFaults::ProcessesRestart);
}

#[test]
fn random_runs_with_agent_restarts_keep_every_invariant_seeds_15_to_29() {
    sweep_with(15..30, sim::AgentFaults::ProcessesRestart);
}

// Items that drift behind the server's back (a property an agent applied
// takes another value, or the item is gone): 15 seeds, in which the server
// must find drift by its periodic READ and correct it, and no check may
// count on what it could not see.

#[test]
fn random_runs_with_drift_keep_every_invariant_and_find_the_drift() {
    let mut failures = Vec::new();
    let (mut drifts, mut found) = (0, 0);
    for seed in 0..15 {
        match sim::run_seed_watched_with_drift(
            seed,
            STEPS,
            WATCHDOG,
            sim::AgentFaults::SessionsEnd,
            sim::Drift::On,
        ) {
            Ok(passed) => {
                drifts += passed.stats.drifts;
                found += passed.stats.drifts_found;
            }
            Err(failure) => failures.push(failure.report(STEPS, TRACE_LINES)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} seed(s) broke an invariant:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    // An operation overwrites most drift before a resync reads it; some
    // must be found, or the READ path went untested.
    assert!(
        found > 0 && drifts > found,
        "{drifts} drift(s) injected, {found} found by the server"
    );
}

#[test]
fn a_seed_replays_exactly() {
    let first = sim::run_seed(21, 120).map(|passed| passed.trace.render(usize::MAX));
    let second = sim::run_seed(21, 120).map(|passed| passed.trace.render(usize::MAX));
    match (first, second) {
        (Ok(first), Ok(second)) => assert_eq!(first, second, "one seed, one run"),
        (Err(first), Err(second)) => {
            assert_eq!(
                first.trace.render(usize::MAX),
                second.trace.render(usize::MAX)
            )
        }
        _ => panic!("the same seed passed once and failed once"),
    }
}

// ----- Regressions: seeds that found defects -------------------------------
//
// Each seed is kept with what it found. Seeds replay the code they run
// against: after changes elsewhere a seed may take another path, so these
// guard against regressions, and the unit tests next to each fix pin the
// behaviour itself.

/// Fixed in the planner: an UNKNOWN item blocks the Modify and the Delete
/// of its dependents.
#[test]
fn seed_1009_an_unknown_item_blocks_the_modify_and_the_delete_of_its_dependents() {
    passes(1009);
}

/// Fixed in the owner: a retry keeps its op id, and the failed attempt's
/// result no longer forgets that id after the pass dispatched the retry
/// (the retry never timed out and its result was ignored).
#[test]
fn seed_9_a_retry_under_the_same_op_id_stays_tracked() {
    passes(9);
}

/// Fixed in the owner: a failed timer pass (the store died) no longer
/// spins at once, forever, so paused time moves again.
#[test]
fn seed_4_a_failed_timer_pass_waits_before_retrying() {
    passes(4);
}

/// Fixed in the owner: a drift READ that times out changes nothing (it
/// made a converged item FAILED).
#[test]
fn seed_6_a_timed_out_read_changes_nothing() {
    passes(6);
}

/// Fixed in the owner: a queued READ and a due retry of the same item are
/// no longer dispatched in one pass.
#[test]
fn seed_19_one_operation_per_item_at_a_time() {
    passes(19);
}

/// Fixed in the owner: a lost Create/Modify whose dependency vanished is
/// not sent again on reconnection (rule 1).
#[test]
fn seed_37_a_lost_operation_is_not_sent_against_a_vanished_dependency() {
    passes(37);
}

/// Fixed in the owner: drift READs are not work (Ready stays true).
#[test]
fn seed_300_a_drift_read_leaves_a_converged_tenant_ready() {
    passes(300);
}

/// Fixed in the owner: a lost Modify given up on reconnection counts no
/// attempt (a later re-ask keeps its op id and attempt).
#[test]
fn seed_117_a_modify_given_up_on_reconnection_counts_no_attempt() {
    passes(117);
}

/// Fixed in the owner: an external item that vanishes and returns within
/// one report takes its auto-deleted dependents with it.
#[test]
fn seed_1289_dependents_of_a_reported_item_are_planned_again() {
    passes(1289);
}

/// Found open, fixed meanwhile (planner, type barriers): a Create waited
/// for a same-type Delete that was no longer planned ("its delete runs
/// first"), so the tenant went quiet without converging.
#[test]
fn seed_240_a_create_does_not_wait_for_a_delete_that_is_not_planned() {
    passes(240);
}

/// Fixed in the owner: a pass whose commit failed queued its follow-up
/// again at once, forever, and forgot the op ids of the results it could
/// not record.
#[test]
fn seed_196_a_failed_follow_up_pass_waits_and_keeps_its_op_ids() {
    passes(196);
}

/// Fixed in the planner's bookkeeping: a settled failed operation needed
/// again is a retry under its op id.
#[test]
fn seeds_189_2053_2058_2285_a_settled_operation_needed_again_keeps_its_op_id() {
    for seed in [189, 2053, 2058, 2285] {
        passes(seed);
    }
}

/// Fixed in the planner: an item whose operation's outcome is unknown and
/// which left the intent waits for its Delete (the tenant is not Ready).
#[test]
fn seed_2202_an_unknown_create_that_left_the_intent_is_not_ready() {
    passes(2202);
}

/// Fixed in the owner and the planner (rule 9 with operations in flight):
/// a lost operation of an item gone with its external item is not sent
/// again; a running one holds what it needs until it reports; NOT_FOUND to
/// a Modify means the item is gone.
#[test]
fn seeds_185_205_2013_2033_2232_rule_9_with_operations_in_flight() {
    for seed in [185, 205, 2013, 2033, 2232] {
        passes(seed);
    }
}

/// Fixed in the owner: a lost Create whose dependency no longer holds is
/// left to the planner (its Delete waits for an UNKNOWN dependency), and
/// a report that an external item went and came back drops its dependents.
#[test]
fn seeds_366_2291_a_lost_create_on_a_broken_dependency_is_planned() {
    for seed in [366, 2291] {
        passes(seed);
    }
}

/// Fixed in the model: a lost Create whose dependency did not hold is of
/// uncertain existence; it is deleted if it must go, and created again
/// (`previous_uncertain`) before anything is built on it.
#[test]
fn seed_48_an_item_of_uncertain_existence_is_created_again_before_use() {
    passes(48);
}

/// Fixed in the model: an item records its `recreate_when_modified`
/// dependencies' counters as they were when its Create was sent, so a
/// modification reported while the Create ran recreates it.
#[test]
fn seeds_4156_5440_5579_a_dependency_modified_during_a_create_recreates_it() {
    for seed in [4156, 5440, 5579] {
        passes(seed);
    }
}

/// Fixed in the model: a lost Modify that is not sent again leaves the
/// value it may have applied as edges of the current graph, and the item is
/// dropped with an external item only if that value goes with it too.
#[test]
fn seeds_3358_5098_a_value_a_lost_modify_may_have_applied_counts() {
    for seed in [3358, 5098] {
        passes(seed);
    }
}

/// Fixed in the planner and the owner: an UNKNOWN item always waits (the
/// tenant is not Ready), and the pass after an external report looks at
/// every unconverged item (a wait it settles does not outlive it).
#[test]
fn seeds_5237_5682_ready_follows_what_is_known() {
    for seed in [5237, 5682] {
        passes(seed);
    }
}

/// Fixed in the owner: when an agent registers, a lost operation of an item
/// that relies on an UNKNOWN item waits to be sent again until that item's
/// outcome is known (DESIGN 4).
#[test]
fn seed_4616_a_lost_operation_waits_for_its_unknown_dependency() {
    passes(4616);
}

/// Fixed in the model: an item that went with its external item while a
/// needs-recreate question about it ran is gone, whatever the answer.
#[test]
fn seed_1129_a_question_does_not_bring_back_an_item_gone_with_its_external() {
    passes_in(1129, 500);
}

/// Fixed in the owner: a Modify that ties its item to an external item that
/// went and came back while it ran leaves the item's existence uncertain
/// (created again before anything is built on it), and a question about a
/// tied item is not a tie of its own.
#[test]
fn seed_10247_a_modify_tying_an_item_to_a_returning_external_is_not_trusted() {
    passes_in(10247, 500);
}

/// Fixed in the owner: a new operation of an item starts with no failure
/// of its own, so a Delete given up on before the item came back into the
/// intent is tried again when it leaves it once more.
#[test]
fn seed_10545_an_earlier_give_up_does_not_hold_a_new_operation() {
    passes_in(10545, 500);
}

/// Fixed in the owner: an operation that waited for its type's room and
/// was then dispatched by another pass left the room queue, so it no
/// longer takes the room of the next waiting item when an operation ends.
#[test]
fn seed_1239_a_dispatched_operation_leaves_the_room_queue() {
    passes_in(1239, 500);
}

/// Fixed in the owner: items planned again leave their type's room queue
/// unless they still wait for room, so an item that needs nothing any more
/// cannot take the room of one whose Delete waits for it.
#[test]
fn seed_10458_the_room_queue_holds_only_items_that_wait_for_room() {
    passes_in(10458, 500);
}

/// Fixed in the owner: a Create lost while its item went with an external
/// item may still run at its agent and apply after the external item came
/// back, so the item may exist with its target (existence uncertain) rather
/// than being forgotten; its dependencies are not deleted under it.
#[test]
fn seed_11803_a_lost_create_gone_with_a_returning_external_may_exist() {
    passes_in(11803, 500);
}

/// Fixed in the protocol: an agent lists, when it registers, the operations
/// it still runs from earlier sessions, and the server waits for those
/// instead of giving them up when their target left the intent or a
/// dependency broke; before, it deleted a dependency under a Create that
/// was still running at the agent (its cancel had timed out, and the agent
/// reconnected).
#[test]
fn seeds_1063_11487_an_operation_the_agent_still_runs_is_waited_for() {
    passes_in(1063, 500);
    passes_in(11487, 500);
}

/// Fixed in the owner: an item whose Create waited to be asked again (after
/// WAIT or a retryable failure) and that went with its external item keeps
/// the Create's op id and attempts, instead of getting a new op id for the
/// same operation.
#[test]
fn seeds_10550_11073_a_create_waiting_for_a_retry_keeps_its_op_id_when_its_item_goes() {
    passes_in(10550, 500);
    passes_in(11073, 500);
}

/// Fixed in the simulator's ledger: a restart no longer forgets that a lost
/// operation's item went with its external item meanwhile (the journaled
/// entry replaced what the ledger knew), so the Delete the server then
/// plans under a new op id is not taken for a lost operation not resumed.
#[test]
fn seed_1119_a_restart_keeps_what_is_known_of_a_lost_operation() {
    passes_in(1119, 500);
}

/// Fixed in the owner: a retry time already due was dropped by a pass that
/// did not plan its item (after a wall-clock step forward), and nothing
/// planned that item again: the tenant never went quiet. A due retry time
/// now wakes the timer at once, and the timer plans every item whose
/// backoff is over.
#[test]
fn seed_20191_a_due_retry_is_planned_whatever_the_last_pass_looked_at() {
    passes(20191);
}

/// Fixed in the engine: a Delete that timed out after its item had gone
/// with its external item put the item back as created, and a dependent
/// was created on nothing (found by the fault-free replay).
#[test]
fn seed_20307_an_item_gone_with_its_external_item_stays_gone_when_its_delete_fails() {
    passes(20307);
}

/// Fixed in the engine: a READ that could not tell (it failed, waited or
/// timed out) sent the lost Create again while a Modify of its dependency
/// ran (seeds 189, 1063, 11073 took that path after READ resolution came).
/// Such a re-delivery now waits for the dependency like the planner's
/// Creates do.
#[test]
fn seeds_1063_11073_a_lost_create_resent_after_its_read_waits_for_a_running_modify() {
    passes_in(1063, 500);
    passes_in(11073, 500);
}

/// Fixed in the engine: a lost Modify that changed only an item's
/// dependencies was taken as applied by the READ that resolved it (the
/// properties it showed were the target's, and the item's before). The
/// item had in fact kept a tie to an external item, went with it, and a
/// dependent was created on nothing. Such a READ now cannot tell, and the
/// Modify is asked again under its op id.
#[test]
fn seed_2979_a_read_that_cannot_tell_a_lost_modify_applied_asks_it_again() {
    passes(2979);
}

/// Fixed in the engine: the dependents of a `recreate_when_modified`
/// dependency that vanished and came back compared their marks with the
/// new item's counter, which starts again; a pending recreate was lost
/// (seed 11879), or none was asked for although the dependent was applied
/// while the dependency was gone (seed 10629). Marks on a vanished item now
/// equal no counter.
#[test]
fn seeds_10629_11879_a_vanished_rwm_dependency_forgets_the_marks_on_it() {
    passes_in(10629, 500);
    passes_in(11879, 500);
}

/// Fixed in the engine: an answered READ and the lost operation sent again
/// after it counted one loss twice toward the poison limit, so an operation
/// was given up on after three losses (seed 11925).
#[test]
fn seed_11925_one_loss_counts_once_toward_the_poison_limit() {
    passes_in(11925, 500);
}

/// Fixed in the simulator: a journaled operation that no agent ever
/// received (the store died before the order went out) was held to
/// resume with its op id although nothing of it could be lost (seed 2341);
/// READs count as deliveries of the lost operation they resolve, and a
/// poison give-up lets the intent's operation replace it (seed 37); a READ
/// is not blocked by an UNKNOWN dependency (it changes nothing, seed 2349);
/// a timed-out operation counts as a fault in the operation counts (seeds
/// 1916, 2669, 20191 with 300 steps: a dependency's timeouts delayed an
/// item's Create past intent changes).
#[test]
fn seeds_37_1916_2341_2349_2669_the_simulators_checks_follow_design() {
    for seed in [37, 1916, 2341, 2349, 2669] {
        passes(seed);
    }
}

/// Fixed in the simulator: an item whose existence is uncertain (its last
/// Create raced its external item) is not converged until a Create
/// confirms it, so Reconciling is right while that Create waits (seed 768);
/// an operation the server journaled but never sent supersedes the
/// earlier one the agents saw, which is then not retried (seed 10082).
#[test]
fn seeds_768_10082_the_simulators_checks_follow_design() {
    passes(768);
    passes_in(10082, 500);
}

/// Fixed in the engine: a lost Modify was sent again on reconnection while
/// a Delete of one of its dependents ran (a Modify waits for the operations
/// of its dependents, DESIGN 3 rule 8; seed 12078). Its re-delivery now
/// waits for them like its first dispatch did.
#[test]
fn seed_12078_a_lost_modify_resent_waits_for_its_dependents_operations() {
    passes_in(12078, 500);
}

/// Fixed in the engine (found by a sweep of seeds 20000-23999): a pass
/// that reached an item it was not seeded with kept what an earlier pass
/// said of it, so a dependent whose Delete waited for a retry stayed
/// "waiting to be retried" after the item it relies on came back (seed
/// 21027); an operation waiting for room counted only in the pass that
/// found it ready, so a later pass about other items reported Ready
/// (seed 23389).
///
/// Counting the room's queue showed operations kept there for an agent
/// that had left, which kept a quiet tenant Reconciling (seeds 679,
/// 20106): they now wait for a configurator.
#[test]
fn seeds_679_20106_21027_23389_the_conditions_follow_every_pass() {
    for seed in [679, 20106, 21027, 23389] {
        passes(seed);
    }
}

/// Fixed in the engine: a READ resolving a lost Modify that only takes a
/// property away took it as applied while the item still had the property
/// (seeds 22752, 23107, 23802); a READ started on an item whose operation
/// waited to be asked again after WAIT dropped its op id, and the
/// operation was later sent under a new one (seeds 21212, 23232).
#[test]
fn seeds_21212_22752_23107_23232_23802_reads_never_decide_what_they_cannot_see() {
    for seed in [21212, 22752, 23107, 23232, 23802] {
        passes(seed);
    }
}

/// Fixed in the simulator: a timer pass at the very instant of an external
/// report (an operation's timeout freed its type's slot and a Create went
/// out) ran before the server read the report, but the simulator had
/// already applied the report to its world and judged the Create against
/// it ("sent while its dependency does not exist"). What falls due at the
/// instant of a report now runs first, and its orders are judged against
/// the world before the report.
#[test]
fn seed_26781_a_report_is_judged_after_what_fell_due_before_it() {
    passes(26781);
}

/// Fixed in the engine (found by a sweep of seeds 28000-31999): a Create
/// planned behind a Delete of its type waited for that Delete's result,
/// and when a later pass found the Delete could not run (a dependent's
/// Delete had failed for good) nothing woke the Create: the tenant sat
/// with a creatable item PENDING, where a plan made afresh creates it.
#[test]
fn seed_29711_a_create_is_not_left_behind_a_delete_that_cannot_run() {
    passes(29711);
}

/// Fixed in the simulator: a lost operation journaled but never delivered
/// (the store died first) was resolved by READs before it first reached an
/// agent; the server counts those READs towards giving it up as poison,
/// the simulator's ledger did not, and took the give-up for a lost
/// operation that did not resume with its op id.
#[test]
fn seed_31146_reads_before_a_lost_operations_first_delivery_count() {
    passes(31146);
}

/// Fixed in the engine (found by a sweep of seeds 36000-39999): a lost
/// Create whose dependency had gone with its external item while it ran,
/// and whose dependency's Create was running again, was given up as if the
/// dependency were broken and planned afresh under a new op id. It now
/// waits for that Create and goes again under its op id (DESIGN 4).
#[test]
fn seed_39389_a_lost_create_waits_for_its_dependency_to_come_back() {
    passes(39389);
}

/// Fixed in the simulator: an item whose lost operation waits for an
/// UNKNOWN item of the type whose agent stays down stays UNKNOWN too; the
/// final phase took it for work that never ended. (The engine now also
/// lets a READ resolve such an item; here the READ could not tell.)
#[test]
fn seed_36729_what_waits_for_an_agent_down_for_good_stays_lost() {
    passes(36729);
}

/// Fixed in the simulator (found by a 1,000-step sweep): an operation's
/// timeout fell due at the instant its agent disconnected; the server
/// counted the attempt failed first, and then planned a new operation for
/// a new generation, while the simulator took the operation for one lost
/// with its session that had to resume under its op id. What falls due at
/// the instant of a disconnect now runs first.
#[test]
fn seed_40880_a_timeout_due_at_a_disconnect_comes_first() {
    passes_in(40880, 1_000);
}

/// Fixed in the engine (found by the invariant that an item kept behind an
/// operation is kept behind one still planned): the executor remembered
/// what waited behind an operation per item, so when a pass dropped the
/// Create of a recreate while keeping its Delete, the items planned after
/// that Create were not planned again. It now remembers it per item and
/// kind.
#[test]
fn seed_2140_what_waits_behind_a_recreates_create_follows_it() {
    passes(2140);
}

/// Fixed in the engine: the recreate of an item below it deleted an item
/// whose own Modify had failed for good; its Delete waited for an agent
/// that stays down, and the item no longer showed its failure, so the
/// quiet tenant was not Stalled. A waiting item that failed terminally
/// toward its intent now shows that failure whatever else it waits for.
#[test]
fn seed_46010_an_item_failed_for_good_keeps_the_tenant_stalled() {
    passes(46010);
}

/// Fixed in the simulator: the fault-free run of operation counts left
/// operations unanswered while time moved, so they timed out, retries gave
/// up and their dependents were never created; the run with faults, whose
/// agents answered more, took intent-driven operations the baseline never
/// reached. The fault-free run's agents now answer every operation before
/// time moves.
#[test]
fn seed_46322_the_fault_free_run_answers_before_time_moves() {
    passes(46322);
}

/// Fixed in the simulator: a READ sent to resolve a lost operation was
/// answered on a session that no longer held the type (the agent had
/// reconnected, and the server sent the READ again on the new session).
/// The server ignores such a result (DESIGN 4: a result carrying an older
/// epoch changes no state), but the ledger counted the lost operation
/// resolved; when its item then vanished with an external item and the
/// server created it again under a new op id, as rule 9 allows, the ledger
/// no longer knew the lost operation could be replaced. Results of a
/// session whose epoch is over now change nothing in the ledger either.
#[test]
fn seed_46695_a_result_from_a_superseded_session_resolves_nothing() {
    passes_in(46695, 1_000);
}

/// Fixed in the engine: one external report in which an item vanished
/// and came back, then another item vanished, is planned in two segments.
/// The pass on the first found a Create ready whose dependency the second
/// removed, and the Create was sent, after the commit, with that item
/// already gone. Only the pass on a report's last segment dispatches now.
#[test]
fn seed_86703_a_report_sends_no_operation_on_an_item_it_removes() {
    passes(86703);
}

/// The checker's count of a lost operation's deliveries (sweep of
/// 91500–94499). A Delete timed out, its next attempt was journaled but its
/// session ended before it went out, and READs asked the agent what it had
/// done: the server counts those READs as losses of the new attempt, the
/// checker counted them for the old one and started the new attempt's
/// count again at its first delivery. After the sixth loss the server gave
/// the Delete up as poison (DESIGN 4) and later sent a new one; the checker,
/// counting two deliveries, called that a lost operation not resumed.
#[test]
fn seed_92706_reads_before_a_lost_attempts_delivery_count_for_it() {
    passes(92706);
}

/// An UNKNOWN item blocks its dependents (DESIGN 4), also one created
/// again while it may still exist (sweep of 94500–97499). `t1/n3`'s
/// existence was uncertain, so the server sent a Create under its new
/// intent, which no longer relies on `t0/n1`; but `t1/n3` could still hold
/// its applied value, which does, and `t0/n1` was UNKNOWN.
#[test]
fn seed_95441_an_unknown_item_blocks_the_create_of_a_dependent_that_may_exist() {
    passes(95441);
}

/// The checker's view of a lost Delete that was half of a recreate (sweep
/// of 113000–115999). `t2/n1`'s Delete toward generation 12 (to be created
/// again) was lost, and the item then left the intent: the Delete the
/// intent needs is another operation, toward no generation, and the server
/// rightly gave it a new op id (DESIGN 4: it sends what the intent now
/// needs). The checker took any lost Delete to be owed as it was while its
/// item existed, and called the new one a lost operation not resumed.
#[test]
fn seed_115955_a_lost_recreate_delete_is_replaced_once_its_item_leaves_the_intent() {
    passes(115955);
}

/// Lost operations sent again take room (found when the checker learned
/// DESIGN 4's in-flight limits, on seeds 0–299). After a restart the server
/// sent a READ for every UNKNOWN item of a type at once, four where the
/// agent declared `max_in_flight` 3: an operation whose cancel went
/// unanswered no longer counted as running, and a new one had taken its
/// place. Those beyond the room now wait for it, UNKNOWN.
#[test]
fn seeds_6_152_lost_operations_sent_again_wait_for_room() {
    passes(6);
    passes(152);
}

/// An UNKNOWN item is sent one READ, not two (sweep of 122000–124999, with
/// the room check). An item whose re-delivery had been put off was also
/// handled by the registration of its type's agent: the registration sent
/// a READ, and the put-off re-delivery, run right after, took that READ
/// for lost and sent another. The agent ran two READs of one item (past
/// its `max_in_flight`), and the lost operation's re-deliveries counted
/// twice toward giving it up as poison. A decision now settles a deferral.
///
/// Seed 125866 (sweep of 125000–127999) found the same through another
/// path: a READ answered on a session the agent had replaced was sent
/// again to its new session, and the re-delivery the registration had put
/// off, until that answer came, then sent one more.
#[test]
fn seeds_122310_124429_125866_an_unknown_item_is_sent_one_read() {
    passes(122310);
    passes(124429);
    passes(125866);
}

/// The checker's view of a READ answered before a crash (sweep of
/// 125000–127999). A READ found a lost Create's item absent; the server
/// journaled a new Create, and the store died before it went out. After
/// the restart the agent sent the READ's answer again, which the new
/// server rightly ignored (that READ is no longer in flight), but the
/// checker took it as resolving the new lost Create, and then called the
/// Create resumed under its own op id a fresh decision. A READ's answer
/// now resolves only the lost operation it was sent for.
#[test]
fn seeds_126733_127901_a_read_resolves_only_the_operation_it_was_sent_for() {
    passes(126733);
    passes(127901);
}

/// The checker's view of a cancel (first sweep with the cancel check,
/// 131000–133999). `t0/n5`'s existence was uncertain, with an applied
/// value auto-deleted by `t1/n4`, while a Create of a new value that does
/// not rely on `t1/n4` ran. When `t1/n4` vanished the server dropped the
/// item as it may exist (rule 9) and cancelled the Create; the world held
/// no such value, and the checker called the cancel unjustified.
#[test]
fn seed_133369_a_cancel_follows_an_item_that_may_have_gone_with_its_external() {
    passes(133369);
}

/// The checker's view of a late READ answer (1,000-step sweep of
/// 58500–59999). A READ sent to resolve a lost Create timed out, the
/// server sent another READ, and the first one's late answer (not found)
/// arrived: the server rightly ignored it, the checker took it as resolving
/// the lost Create. Only the last READ sent for a lost operation resolves
/// it now.
#[test]
fn seed_59036_only_the_last_read_resolves_a_lost_operation() {
    passes_in(59036, 1_000);
}

/// The checker's in-flight count (1,000-step sweep of 58500–59999). An
/// operation the server had cancelled was sent again to the agent's new
/// session, which made it look running again to the checker, while the
/// server (its cancel unanswered, the item UNKNOWN) no longer counted it.
/// An operation a cancel was sent for stays out of the count.
#[test]
fn seeds_59277_59729_an_operation_once_cancelled_stays_out_of_the_room_count() {
    passes_in(59277, 1_000);
    passes_in(59729, 1_000);
}

/// A lost operation the agent still runs is sent again at once, room or
/// not (1,000-step sweep of 60000–61499, after lost operations began to
/// take room). The agent listed a Modify it still ran; its re-delivery
/// waited for room, the agent's answer then came on its old session, and
/// the server sent the Modify again from there, after its dependency had
/// vanished, where attaching to it at registration was what DESIGN 4 asks.
#[test]
fn seed_60661_a_lost_operation_the_agent_still_runs_is_sent_again_at_once() {
    passes_in(60661, 1_000);
}

/// No READ while a lost operation runs again on a live session (sweep of
/// 144500–147499). A registration put off a READ for room; the READ of
/// the session before could not tell, so the lost Create was sent again
/// and then cancelled by an intent change. The put-off READ stayed
/// behind, and once the cancel went unanswered it was sent on the same
/// session while the Create still ran there: it found nothing, and the
/// Create's dependency was deleted under it (DESIGN 4: no new operation
/// until the old one reports or its session ends).
#[test]
fn seed_145486_no_read_while_the_lost_operation_runs_again_on_a_live_session() {
    passes(145486);
}

/// A Delete taken from the room's queue found its retry time ahead again
/// (the wall clock had stepped back 26 s), and the Delete of the item it
/// relies on, which also waited for another dependent, went on showing
/// "its delete runs first" for a Delete that no result would end.
#[test]
fn seed_150801_a_waiter_behind_a_queued_delete_that_waits_again_is_planned_again() {
    passes(150801);
}

/// An item settled without a result of its own must wake what waits for
/// it (sweep of 162500–171499). An external item vanished and took along
/// an item that another relies on with `recreate_when_modified`; that
/// dependent's Delete + Create waited behind its own dependents' Deletes.
/// The external item came back and the vanished item was created again as
/// it was, which made the recreate needless: the dependent was settled by
/// a pass about another item. A new item's Create, waiting for it to be
/// "not created", was never planned again and stayed PENDING for good.
#[test]
fn seed_162641_a_waiter_behind_an_item_settled_without_a_result_is_planned_again() {
    passes(162641);
}

/// A Create cancelled because a value journaled for its item at a crash,
/// never delivered, tied it to an external item that then vanished (sweep
/// of 162500–171499). The restarted server holds that value as maybe
/// applied, so the item may have gone with the external item and what
/// runs is superseded; the checker now counts journaled values as well as
/// delivered ones.
#[test]
fn seed_163039_a_value_journaled_before_a_crash_may_tie_its_item_to_an_external() {
    passes(163039);
}

/// A lost Create is not sent again on a dependency that went with its
/// external item (sweep of 186500–192499). An agent's session ended with
/// the Create of `t1/n14` (on `t0/n3`) in flight; the READ that was to
/// resolve it was still running when the external item that `t0/n3`
/// relies on vanished, with a question about `t0/n3` in flight. `t0/n3`
/// stayed in the graph, marked gone with its external item, until that
/// question reports. When the READ timed out, the lost Create was sent
/// again as if `t0/n3` still existed; a dependency marked gone now counts
/// as broken, so the Create is given up and the planner decides.
#[test]
fn seed_187463_a_lost_create_is_not_sent_again_on_a_dependency_gone_with_its_external() {
    passes(187463);
}

/// A lost Create whose value unties its item is resumed under its op id
/// when the item's old external item vanishes (sweep of 70750–73749 at
/// 1,000 steps). The server restarted with the Create of `t1/n1` in
/// flight; its old value was `auto_deleted_by_external` on `t0/n0`, the
/// Create's value was not. While the READ resolving the lost Create ran,
/// `t0/n0` vanished, and `t1/n1` was marked gone with it whatever the
/// READ found (a READ changes nothing), so when the READ timed out the
/// lost Create was given up and a new one sent. The lost Create, had it
/// run, made the item independent of `t0/n0`: the mark now follows the
/// operation the READ resolves.
#[test]
fn seed_70955_a_lost_create_that_unties_its_item_is_resumed_with_its_op_id() {
    passes_in(70955, 1_000);
}

/// A READ's answer settles a mark of going with an external item (found
/// by the 1,000-step sweep of 66650–71149 after the fix for 70955). With a
/// lost Modify whose value ties `t3/n1` to the external item `t3/n0`, and
/// a READ resolving it, `t3/n0` vanished: `t3/n1` was marked gone whatever
/// the Modify did. The READ found the item with its old value, untied; the
/// mark outlived that answer and the Delete planned next, and when that
/// Delete was lost at a restart it was forgotten as if the item had gone.
#[test]
fn seed_68388_a_reads_answer_settles_the_mark_of_going_with_an_external() {
    passes_in(68388, 1_000);
}

/// An item whose untying Modify reports WAIT after its external item went
/// and came back is gone (sweep of 222500–228499). `t2/n1`'s applied value
/// was `auto_deleted_by_external` on `t2/n0`; a Modify to a value without
/// that tie ran when `t2/n0` vanished and took `t2/n1` along. `t2/n0` came
/// back before the Modify answered WAIT, so nothing told the server the
/// item had gone: it kept `t2/n1` with its old value and created `t0/n3`
/// on it. The item is now marked gone unless its Modify applies.
#[test]
fn seed_222510_an_untying_modify_that_did_not_apply_leaves_its_item_gone() {
    passes(222510);
}

/// A lost Create sent again to an agent that forgot it may have applied
/// already (found by the first sweep with agents that restart). The agent
/// applied `t0/n7`'s Create, restarted before reporting it, and got the
/// Create again under its op id; that attempt timed out, and the server,
/// taking the Create as never applied, deleted `t3/n4` while `t0/n7`
/// existed on it. Until an attempt of a Create sent again reports DONE,
/// the item's existence is now uncertain.
#[test]
fn seed_62_with_agent_restarts_a_create_sent_again_may_have_applied_before() {
    passes_with_agent_restarts(62);
}

/// A lost Modify that a READ cannot tell from the applied value may have
/// applied (sweep of seeds 1–4000 with agents that restart). The Modify
/// of `t2/n7` only added a dependency on `t1/n6`; its agent applied it and
/// restarted. The READ showed the same properties, so the Modify was to be
/// asked again, but its value was dropped from view and `t1/n6` deleted
/// under `t2/n7`. The value now stays `maybe_applied` until it answers.
#[test]
fn seed_2049_with_agent_restarts_a_modify_a_read_cannot_tell_keeps_its_edges() {
    passes_with_agent_restarts(2049);
}

/// An untying Modify sent again may have applied in its first delivery
/// (same sweep). Its agent applied it before the external item vanished,
/// then restarted; the attempt sent again timed out, and the item was
/// forgotten as gone with its external item while it existed untied.
#[test]
fn seed_2242_with_agent_restarts_an_untying_modify_sent_again_may_have_applied() {
    passes_with_agent_restarts(2242);
}

/// An item is gone with an external item only if the value it may hold
/// instead is tied too (same sweep): otherwise its lost Delete resumes
/// under its op id.
#[test]
fn seed_2911_with_agent_restarts_a_lost_delete_of_an_item_that_may_be_untied_resumes() {
    passes_with_agent_restarts(2911);
}

/// A lost Create of a value tied to an external item that vanished leaves
/// the value its item of uncertain existence had before (sweep of
/// 222500–228499 after the first fix for agents that restart): the item
/// was dropped with the external item and never deleted.
#[test]
fn seed_227835_a_lost_create_that_went_leaves_the_value_its_item_may_have_had() {
    passes(227835);
}

/// A convergence check that excuses what an item failed for good may rely
/// on, through every value the server may hold for it (sweep of seeds
/// 1–6000 with agents that restart): a Delete failed terminally, and its
/// item may hold a value (`maybe_applied`) relying on another item, whose
/// Delete the server rightly holds back.
#[test]
fn seed_5401_with_agent_restarts_an_item_failed_for_good_holds_what_it_may_rely_on() {
    passes_with_agent_restarts(5401);
}

/// The same check, for an intended item held back by a dependent failed
/// for good through the value that dependent may hold (sweep of seeds
/// 6001–12000 with agents that restart).
#[test]
fn seed_7084_with_agent_restarts_a_value_an_item_may_hold_connects_it_to_a_failure() {
    passes_with_agent_restarts(7084);
}

/// Rule 6 for a value an item may hold (sweep of seeds 12001–18000 with
/// agents that restart; also 13391 and 14546): `t1/n2`'s lost Modify
/// toward a value whose predicate on `t0/n0` needs a vlan may have
/// applied, and a Modify of `t0/n0` that broke it ran while `t1/n2`
/// stayed. The planner now checks the predicates of `maybe_applied` too.
#[test]
fn seed_10673_with_agent_restarts_a_modify_keeps_the_predicates_of_a_value_a_dependent_may_hold() {
    passes_with_agent_restarts(10673);
}

/// The checker counts the re-deliveries a restarted server journaled as
/// deliveries that may have gone out (same sweep): a poison operation's
/// attempt grew after 4 deliveries seen by the agents and 5 counted by the
/// server, the last committed before the store died.
#[test]
fn seed_11122_with_agent_restarts_journaled_redeliveries_count_toward_poison() {
    passes_with_agent_restarts(11122);
}

/// A READ's answer resent after a restart resolves nothing (sweep of
/// 66650–68649 at 1,000 steps): the restarted server journaled the lost
/// Create again and resumed it under its op id, while the checker had
/// taken the old READ's NOT_FOUND as its resolution.
#[test]
fn seed_67959_a_reads_answer_resent_after_a_restart_resolves_nothing() {
    passes_in(67959, 1_000);
}

/// A waiter that says a Delete runs first is planned again when a plan
/// reaches that Delete without it and finds it waiting for a configurator
/// (sweep of 24001–27000 with restarts): `t0/n1` went on saying that
/// `t1/n4`'s Delete runs first after `t1`'s agent had left.
#[test]
fn seed_24248_with_agent_restarts_a_waiter_follows_a_delete_that_lost_its_configurator() {
    passes_with_agent_restarts(24248);
}

/// Every value an item may hold besides its applied one is kept (sweep of
/// 18001–24000 with restarts): a second lost Modify of `t1/n4`, sent again
/// after a restart, replaced the first one's value, and `t0/n3`, on which
/// only the first relied, was deleted under the agent's `t1/n4`.
#[test]
fn seed_18627_with_agent_restarts_a_second_lost_modify_keeps_the_first_ones_value() {
    passes_with_agent_restarts(18627);
}

/// An item found settled that an earlier pass left unconverged lets the
/// planner walk on to its dependents (sweep of 228500–234499): `t0/n3`
/// no longer had to go, but `t0/n9`, whose Delete it had caused and which
/// had failed for good, was not reached and went on showing the failure.
#[test]
fn seed_233954_a_delete_failed_for_good_follows_its_cause_going() {
    passes(233954);
}

/// An UNKNOWN item blocks a dependent through every value the dependent
/// may hold (sweep of 3001–5000 at 1,000 steps with restarts): `t2/n2`,
/// of uncertain existence, may have held a lost Create's value relying on
/// `t3/n0`, and was created again while `t3/n0` was UNKNOWN.
#[test]
fn seed_3400_with_agent_restarts_an_unknown_item_blocks_a_value_its_dependent_may_hold() {
    passes_with_agent_restarts_in(3400, 1_000);
}

/// Rule 8 for a lost Create sent again (sweep of 228500–258499): `t0/n5`'s
/// Create was lost and the READ that was to settle it timed out; the
/// Create went again, to an agent that had never run it, while `t0/n10`'s
/// Delete (same type) ran.
#[test]
fn seed_253619_a_lost_create_sent_again_waits_for_a_delete_of_its_type() {
    passes(253619);
}

/// Every value an item may hold must be the intended one (sweep of
/// 5001–7000 at 1,000 steps with restarts): `t1/n13`'s Modify applied, its
/// agent restarted and forgot the result, the attempt sent again failed
/// for good, and the intent went back to the applied value. The server
/// took the item as converged while the agent's held the lost Modify's.
#[test]
fn seed_5668_with_agent_restarts_a_value_a_lost_modify_may_have_applied_is_modified_away() {
    passes_with_agent_restarts_in(5668, 1_000);
}

/// The same defect as seed 5668, found by the same sweep (`t3/n14`).
#[test]
fn seed_5068_with_agent_restarts_a_value_a_lost_operation_may_have_applied_is_modified_away() {
    passes_with_agent_restarts_in(5068, 1_000);
}

/// A lost Create that is not sent again keeps the values its item may have
/// had (sweep of 270500–273499): `t3/n9`'s Deletes timed out, so it may
/// still have held its old value, relying on `t0/n4`; its Create was lost,
/// and the external item its new value relied on stopped satisfying it.
/// The record kept only the Create's value, and `t0/n4` was deleted.
#[test]
fn seed_272739_a_lost_create_not_sent_again_keeps_the_old_value_possible() {
    passes(272739);
}

/// A value a lost Modify may have applied keeps the marks it was sent with
/// (sweep of 51001–54000 with restarts): `t1/n3`'s Modify added a
/// recreate-when-modified dependency on `t1/n2` and applied, its agent
/// restarted and forgot the result, `t1/n2` was modified, and the READ
/// could not tell. `t1/n3` was then modified, not recreated.
#[test]
fn seed_52881_with_agent_restarts_a_value_a_lost_modify_may_have_applied_is_recreated() {
    passes_with_agent_restarts(52881);
}

/// Seed 56203 (found by the check that a retry waits for its type's retry
/// policy): `t1/n10`'s Delete failed, a pass found it no longer needed and
/// settled the failure, and the next pass needed it again and sent its
/// retry 2 ms after the failure, where the type waits 1.6 s.
#[test]
fn seed_56203_with_agent_restarts_a_settled_failure_needed_again_waits_for_its_backoff() {
    passes_with_agent_restarts(56203);
}

/// Seed 56317 (found by the check that a Create waits for a planned Modify
/// of its dependency): `t0/n11`'s Create was lost with its agent's
/// session, the item then left the intent, and the agent's next
/// registration sent the Create again, on a dependency whose Modify was
/// planned. A lost Create or Modify whose target is no longer the intent
/// is not started afresh.
#[test]
fn seed_56317_with_agent_restarts_a_lost_create_whose_item_left_the_intent_is_not_sent_again() {
    passes_with_agent_restarts(56317);
}

/// Seed 57266 (the checker): `t0/n6`'s retry fell due as a submit arrived
/// that changed its dependency `t0/n1`; the owner ran the due pass first,
/// and the retry went out on the intent before the submit, which the
/// dependency check now counts.
#[test]
fn seed_57266_with_agent_restarts_a_retry_sent_just_before_a_submit_is_judged_by_the_intent_it_saw()
{
    passes_with_agent_restarts(57266);
}

/// The store died after applying a commit; the restarted server found a
/// Create journaled and made its item UNKNOWN, but told no watcher: a
/// Watch kept showing the item CREATING while GetStatus showed UNKNOWN.
/// The first commit after a restart now carries those status changes.
#[test]
fn seed_17_a_restart_tells_watchers_which_operations_it_lost() {
    passes(17);
}

/// A READ resolving a lost operation ran while the tenant showed
/// Reconciling false: it counted as a drift READ, which is observation;
/// it is work (DESIGN 5).
#[test]
fn seed_0_a_tenant_is_reconciling_while_a_read_resolves_a_lost_operation() {
    passes(0);
}

/// A Delete failed past its type's `max_attempts`; a pass found it
/// unneeded and settled it, and when it was needed again it went out at
/// once, past `max_attempts`, over and over. A failure given up on now
/// stays given up on until the intent changes.
#[test]
fn seed_65764_with_agent_restarts_a_delete_given_up_on_stays_given_up_after_a_settle() {
    passes_with_agent_restarts(65764);
}

/// A lost Create whose READ could not settle it was sent again after the
/// item it relies on left the intent (planned for deletion, so not a
/// satisfied dependency).
#[test]
fn seed_291807_a_lost_create_is_not_sent_again_once_its_dependency_left_the_intent() {
    passes(291807);
}

/// A Delete given up on, settled, then needed again waits for an intent
/// change: the final phase counts it as failed for good, not as an item
/// left over.
#[test]
fn seed_78336_a_delete_given_up_on_and_needed_again_counts_as_failed_for_good() {
    passes_in(78336, 1000);
}

/// The store died; the restarted server brought a retry time nearer (an
/// agent's WAIT asked for longer than the type's policy allows) in memory
/// only, so the status showed a retry time the store did not keep, and a
/// second crash found the old one. The first commit after a restart now
/// stores it.
#[test]
fn seed_12_with_agent_restarts_a_crash_keeps_what_the_status_showed() {
    passes_with_agent_restarts(12);
}

/// A step of 14 simulated minutes with every operation timing out and
/// retried brought thousands of revisions; the watcher, cut as a slow
/// consumer every 64 events, gave up catching up after 64 rounds although
/// each round brought new revisions. (A checker fix: the engine was right.)
#[test]
fn seed_72795_with_agent_restarts_a_watcher_keeps_up_through_a_long_step_of_retries() {
    passes_with_agent_restarts(72795);
}

/// An item gone behind the server's back while its Delete was lost: the
/// READ that settles it answers `NOT_FOUND`, the server creates it again
/// (it is intended once more) and deletes what it depended on. (A checker
/// fix: an item the server creates again is one it learned was gone.)
#[test]
fn seed_157_with_drift_an_item_gone_and_created_again() {
    passes_with_drift(157, sim::AgentFaults::SessionsEnd);
}

/// An item gone behind the server's back whose Create result its agent
/// forgot in a restart: the server never held its value, and learns it is
/// gone from the READ that settles the lost Create. (A checker fix.)
#[test]
fn seed_37_with_drift_and_agent_restarts_an_item_gone_before_the_server_knew_it() {
    passes_with_drift(37, sim::AgentFaults::ProcessesRestart);
}

/// An item gone behind the server's back after its agent applied its
/// Create, before the result reached the server: the result sent again
/// on reconnecting tells the server it exists, and a dependent's Create
/// follows; only a READ can tell it the item went. (A checker fix: the
/// server held no value when the item went, and learns of the item first.)
#[test]
fn seed_644_with_drift_an_item_gone_before_its_create_reported() {
    passes_with_drift(644, sim::AgentFaults::SessionsEnd);
}

/// A lost Create (of a recreate) applied, then a property of the item
/// drifted; the READ settling it showed neither the old value nor the
/// target. The server took the item as holding the old value, with none
/// of the target's dependencies, and deleted one of them in parallel with
/// the item while the item still relied on it. It now keeps the target
/// as a value the item may hold (`engine::transition`, unit test
/// `a_read_showing_neither_value_keeps_the_lost_operations_dependencies`).
#[test]
fn seed_20481_with_drift_and_agent_restarts_a_read_showing_neither_value_keeps_the_edges() {
    passes_with_drift_in(20481, 1_000, sim::AgentFaults::ProcessesRestart);
}

/// A lost Modify that would have removed a property did not apply, then
/// a drift gave the item the Modify's values on every property it sets.
/// The READ that settles the Modify showed those and the property it
/// removes; the server took it as applied, left the property on the item
/// for good, and a dependent's Create followed. First taken for the
/// checker's mistake (the property was hidden from its checks); seed 15609
/// showed the same case as the engine defect it is. Such a Modify is now
/// asked again, and the checks see every property again.
#[test]
fn seed_4492_with_drift_a_read_still_showing_a_property_the_modify_removes() {
    passes_with_drift(4492, sim::AgentFaults::SessionsEnd);
}

/// An item gone behind the server's back, then its external dependency,
/// which it is auto-deleted by, reported gone and back in one report:
/// the server, which still held the item, dropped it with the external
/// item and, after a crash, created it afresh instead of resuming its
/// lost Modify. (A checker fix: the item went with the external item for
/// the server, although the world had lost it before.)
#[test]
fn seed_21498_with_drift_and_agent_restarts_an_unseen_loss_goes_with_its_external() {
    passes_with_drift_in(21498, 1_000, sim::AgentFaults::ProcessesRestart);
}

/// An operation's attempt timed out just before the wall clock stepped
/// back 55 s: its retry time counts from the time before the step, 56 s
/// after the clock's new reading, within the policy's wait of the latest
/// time so far. (A checker fix to the upper bound on retry times.)
#[test]
fn seed_22170_with_drift_and_agent_restarts_a_retry_set_before_the_clock_stepped_back() {
    passes_with_drift_in(22170, 1_000, sim::AgentFaults::ProcessesRestart);
}

/// An external item modified, with an agent down for good: its dependent
/// (relying on it with `recreate_when_modified`) owes a recreate that
/// waits for the Delete of its own dependent on the agent that is down, so
/// the quiet tenant is rightly not Ready although every item shows its
/// intended value. (A checker fix: with an agent down for good, Ready
/// also asks that no recreate is owed.)
#[test]
fn seed_11609_with_drift_a_recreate_owed_behind_an_agent_down_is_not_ready() {
    passes_with_drift(11609, sim::AgentFaults::SessionsEnd);
}

/// A lost Modify that dropped the item's dependency on another item did
/// not apply, but a drift gave the item the Modify's values: the READ
/// showed every property the target sets, the item was taken as modified
/// (with no dependency), and the other item was deleted while the item
/// still relied on it. A READ cannot see dependencies: such a Modify is
/// now asked again (`engine::transition`, unit test
/// `a_read_showing_a_target_that_drops_a_dependency_asks_the_modify_again`).
#[test]
fn seed_6798_with_drift_and_agent_restarts_a_read_cannot_show_a_dropped_dependency() {
    passes_with_drift(6798, sim::AgentFaults::ProcessesRestart);
}

/// The other direction of seed 6798: a lost Modify that set `mtu` and
/// gave the item a dependency did not apply, but a drift gave the item the
/// Modify's `mtu`. The READ showed every property the target sets, the item
/// was taken as modified (relying on the new dependency, which its agent
/// was never told of), and a dependent was created against a value the
/// item did not hold. Such a Modify is now asked again
/// (`engine::transition`, unit test
/// `a_read_showing_a_target_that_adds_a_dependency_asks_the_modify_again`).
#[test]
fn seed_41499_with_drift_and_agent_restarts_a_read_cannot_show_an_added_dependency() {
    passes_with_drift(41499, sim::AgentFaults::ProcessesRestart);
}

/// An item owed a recreate (a `recreate_when_modified` dependency was
/// modified) lost the Delete of that recreate in a crash; sent again, it
/// timed out, leaving the item's existence uncertain, and the Create sent
/// then found the item still there and took fresh marks: the recreate it
/// owed was forgotten, and the item kept a value created before its
/// dependency's modification. Such a Create now keeps the older marks
/// (`engine::transition`, unit test
/// `a_create_of_an_item_that_may_exist_keeps_the_recreate_it_owed`).
#[test]
fn seed_57172_with_drift_and_agent_restarts_a_create_that_finds_its_item_keeps_the_owed_recreate() {
    passes_with_drift(57172, sim::AgentFaults::ProcessesRestart);
}

/// A lost Modify that removed a property (`vlan`) and set another did not
/// apply, but drift gave the item the Modify's value for the other: the
/// READ showed every property the target sets and the `vlan` it removes.
/// Taken as applied, `vlan` would have stayed on the item for good (drift
/// is only looked for in the properties the applied value sets), and the
/// item's dependents went ahead on a value it did not hold. Such a Modify
/// is now asked again (`engine::transition`, unit test
/// `a_read_still_showing_a_property_the_target_removes_asks_the_modify_again`).
#[test]
fn seed_15609_with_drift_a_read_still_showing_a_removed_property() {
    passes_with_drift(15609, sim::AgentFaults::SessionsEnd);
}

/// An item moved off a dependency leaving the intent onto another, whose
/// Modify then failed for good, while a periodic READ of its new
/// dependency ran: the incremental passes spared it (its Modify must move
/// it off first), but a full pass deleted it for the READ's sake, so the
/// plan depended on whether a READ was under way. A READ running on a
/// dependency no longer counts against moving onto it
/// (`engine::plan::scenarios::a_periodic_read_of_the_new_dependency_does_not_make_a_retargeting_plan_delete_the_dependent`).
#[test]
fn seed_25651_with_drift_and_agent_restarts_a_read_does_not_doom_a_retargeted_dependent() {
    passes_with_drift_in(25651, 1_000, sim::AgentFaults::ProcessesRestart);
}

/// An item's Create toward a value relying on `t1/n1` applied while its
/// agent restarted and forgot the result; its retry failed, so the value
/// stayed one the item may hold. After the intent dropped the item, its
/// Delete was lost with its session, and sent again on the next one while
/// `t1/n1` was UNKNOWN: an operation on a dependent of an UNKNOWN item
/// (DESIGN 4). A lost operation's re-delivery looked at the applied value
/// and the target only; it now waits while any value the item may hold
/// relies on an UNKNOWN item, as planning does (`engine::exec::lost`, unit
/// test `a_lost_delete_waits_while_a_value_the_item_may_hold_relies_on_an_unknown_item`).
#[test]
fn seed_10544_with_drift_and_agent_restarts_a_lost_delete_waits_for_an_unknown_dependency() {
    passes_with_drift(10544, sim::AgentFaults::ProcessesRestart);
}

/// The checker's mistake, not the server's: a Modify answered WAIT just as
/// the store died; the WAIT's commit died with it, so the restarted server
/// held the Modify as running (journaled). Its item then went with its
/// vanished external item, and the server cancelled the Modify, as it
/// cancels what runs on an item so dropped. The checker had kept the
/// WAIT's ending and saw a cancel of an operation nothing superseded.
#[test]
fn seed_10970_with_drift_and_agent_restarts_a_wait_lost_with_the_store_leaves_the_operation_running()
 {
    passes_with_drift(10970, sim::AgentFaults::ProcessesRestart);
}

/// The checker's mistake: an item vanished by drift while a READ resolving
/// its lost Create was in flight; the READ found nothing, and in the same
/// pass the server created the item afresh (for an intent that no longer
/// relied on `t0/n12`) and deleted `t0/n12`. The checker still believed the
/// old item, relying on `t0/n12`, was there: it counted the new Create as
/// a result that could bring the old value back.
#[test]
fn seed_58966_with_drift_and_agent_restarts_an_item_found_gone_and_created_afresh() {
    passes_with_drift(58966, sim::AgentFaults::ProcessesRestart);
}

/// The checker's mistake: a Delete journaled at a crash before any agent
/// received it was resolved by READs that were lost one after another,
/// each counting as a delivery, until the poison rule counted a failure;
/// its first delivery then came at attempt 2, as DESIGN 4 says. The
/// checker forgot that the operation was journaled before it asked.
#[test]
fn seed_90564_with_agent_restarts_a_journaled_operation_first_delivered_after_a_poison_failure() {
    passes_with_agent_restarts(90564);
}

/// The checker's mistake, not the server's: an external item vanished
/// while the agent of its dependents' type was down for good. The
/// dependents, still CREATED at their intended values, must be deleted
/// (rule 9), and wait for that agent; the server rightly said Ready=false.
/// The checker's convergence (with an agent down) did not ask that an
/// intended item's dependencies hold.
#[test]
fn seed_84709_with_agent_restarts_dependents_of_a_vanished_external_item_are_not_converged() {
    passes_with_agent_restarts(84709);
}

/// The checker's mistake: an external report deleting `t1/n2` and putting
/// it back was applied just before the store died, unacknowledged. The
/// Create of `t1/n3` (auto-deleted by `t1/n2`) it let go out was journaled
/// in that commit and lost. The reporter sent the report again to the
/// restarted server, which then saw `t1/n2` vanish while that Create's
/// outcome was lost, and rightly gave it up (rule 9: it may have applied
/// and gone with `t1/n2`) for a new Create. The checker did not count a
/// report sent again as a vanish.
#[test]
fn seed_66211_with_drift_and_agent_restarts_a_report_sent_again_after_a_crash_vanishes_an_item_again()
 {
    passes_with_drift(66211, sim::AgentFaults::ProcessesRestart);
}

/// The checker's half of an engine fix: `t0/n1` went with the external
/// item `t2/n0` while a drift READ of it ran, and the restart that
/// followed took that READ as lost, so `t0/n1` left current state then.
/// Its dependent `t0/n4` now forgets its `recreate_when_modified` mark on
/// it, as after any removal (DESIGN 3, rule 4); the checker took that for
/// a change the crash made to committed state.
#[test]
fn seed_62044_with_drift_and_agent_restarts_a_restart_forgets_marks_on_an_item_it_takes_for_gone() {
    passes_with_drift(62044, sim::AgentFaults::ProcessesRestart);
}

/// A cancel sent again where it should not be (found in this engine's own
/// change, before it was merged): `t0/n1`'s lost Create was asked to stop
/// while no agent held its type, because the external item `t1/n0` its
/// old value went with vanished. When the agent came back still running
/// it, the cancel followed the Create sent again, although `t1/n0` was
/// back and the intent had not changed. Only a cancel asked because the
/// intent superseded the operation follows it again.
#[test]
fn seed_97155_with_agent_restarts_a_cancel_for_a_vanished_external_item_is_not_sent_again() {
    passes_with_agent_restarts(97155);
}

/// The checker's half of the timed-out-operation fix: `t1/n1` took a
/// lost Modify's value on the agent's side, drifted back to the value
/// the server had applied before, and the server took the lost Modify
/// as applied (its result sent again), then the drift READ's value: the
/// one it held when the item drifted. The checker saw no change of the
/// applied value since the drift and kept believing the Modify's value,
/// so a dependent's Create looked like it went past a planned Modify.
/// A drift is learned once the applied value has changed since, at any
/// look, and holds what the world holds.
#[test]
fn seed_49262_with_drift_a_drift_learned_after_the_applied_value_came_back() {
    passes_with_drift(49262, sim::AgentFaults::SessionsEnd);
}

/// The agent's half of a rule the server relies on: `t1/n5`'s Create
/// (attempt 5) was dropped when its session ended, while the agent still
/// held an unacknowledged result of attempt 3 of the same operation. Its
/// registration listed the op id as still held, so the server sent the
/// Create again at once, as to an agent that runs it, although the
/// external item `t2/n4` it depends on had been reported gone meanwhile
/// (DESIGN 3, rule 1). An agent no longer lists an operation for the
/// result of an attempt older than one it was sent since (the SDK and the
/// simulated agents alike).
#[test]
fn seed_320212_an_older_attempts_result_does_not_keep_an_operation_listed() {
    passes(320212);
}

/// The checker's: a resync's READ of `t0/n4` went out at the very end of
/// a quiet round of the final phase, and the convergence check found it
/// in flight. A READ is an observation, not work: the next round answers
/// it before the tenant is judged.
#[test]
fn seed_54952_with_drift_a_read_sent_as_a_quiet_round_ends_is_answered_first() {
    passes_with_drift(54952, sim::AgentFaults::SessionsEnd);
}

/// The simulator's: the store died at the commit that closed the last
/// step, so the server restarted in the final phase, and after a restart
/// each agent reconnects only most of the time. In the final phase every
/// agent but one that stays down for good is connected, so it reconnects
/// after such a restart too (before, the tenant could not go quiet: the
/// Create of `t2/n3` waited for an agent that never came back).
#[test]
fn seed_61031_with_drift_agents_reconnect_after_a_restart_in_the_final_phase() {
    passes_with_drift(61031, sim::AgentFaults::SessionsEnd);
}

/// The planner's: a Create and its dependent's Modify were lost with a
/// restarting agent, and the Create failed when sent again, leaving its
/// item's existence uncertain. The Create waiting for its retry counted as
/// hopeless, so the dependent was deleted (rule 5) instead of its lost
/// Modify being sent again; an item that may exist never causes a
/// dependent's deletion.
#[test]
fn seed_125101_with_agent_restarts_a_dependency_that_may_exist_does_not_delete_its_dependent() {
    passes_with_agent_restarts(125101);
}

/// The store died right after a commit that journaled a Delete's second
/// attempt, before it was sent. The agent, reconnecting, listed the op id
/// for the result of the first attempt it still held (the list names op
/// ids, not attempts), and the server sent the second attempt at once,
/// while an item the Delete relies on was UNKNOWN. A listed operation now
/// waits for such an item like any re-delivery.
#[test]
fn seed_40453_with_agent_restarts_a_listed_operation_waits_for_an_unknown_dependency() {
    passes_with_agent_restarts_in(40453, 1_000);
}
