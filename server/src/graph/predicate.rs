//! TEMPORARY stub (replaced by the real CEL implementation).
use super::item::Properties;
/// A compiled `must_satisfy` expression.
#[derive(Clone, Debug)]
pub struct Predicate {
    source: String,
}
/// Errors of predicates.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PredicateError {
    /// Parse error.
    #[error("parse: {0}")]
    Parse(String),
}
impl Predicate {
    /// Compile.
    pub fn compile(source: &str) -> Result<Predicate, PredicateError> {
        Ok(Self {
            source: source.into(),
        })
    }
    /// Evaluate.
    pub fn evaluate(&self, subject: &Properties) -> Result<bool, PredicateError> {
        Ok(subject
            .get(self.source.trim_start_matches("self."))
            .and_then(|v| v.as_bool())
            .unwrap_or(false))
    }
    /// Source.
    pub fn source(&self) -> &str {
        &self.source
    }
}
