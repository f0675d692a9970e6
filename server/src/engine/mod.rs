//! The engine: the pure planner and the machinery that drives its plans.

pub mod conditions;
pub mod exec;
pub mod intent;
pub mod plan;
pub mod schema;
pub mod transition;
pub mod waiting;

#[cfg(test)]
mod testkit;
