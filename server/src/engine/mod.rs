//! The engine: the pure planner and the machinery that drives its plans.

pub mod exec;
pub mod plan;
pub mod transition;

#[cfg(test)]
mod testkit;
