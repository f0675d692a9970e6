//! The deterministic simulator (`reconciled_tests::sim`) inside `cargo
//! test`: a bounded number of seeds, and every seed that once broke an
//! invariant, as regression cases. Long runs: `reconciled-sim` (see
//! docs/testing.md).

use reconciled_tests::sim;

/// Steps per seed (then the final phase that must converge).
const STEPS: usize = 300;

fn run(seed: u64) {
    if let Err(failure) = sim::run_seed_watched(seed, STEPS) {
        panic!("{}", failure.report(STEPS, 200));
    }
}

#[test]
fn a_band_of_seeds_keeps_every_invariant_and_converges() {
    for seed in 1000..1020 {
        run(seed);
    }
}

#[test]
fn seed_1009_an_unknown_item_blocks_the_modify_and_the_delete_of_its_dependents() {
    run(1009);
}
