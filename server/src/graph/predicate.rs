//! `must_satisfy` predicates: CEL expressions over the required item's
//! properties, bound as `self` (e.g. `self.mtu >= 1500 && self.state == "up"`).
//!
//! Built on the `cel` crate (0.15), with its standard environment (macros
//! such as `has`, `all`, `exists`, functions such as `size`, `matches`).
//!
//! Notes on the `cel` crate that shaped this module:
//! - `self` is an ordinary identifier for its parser (CEL reserves other
//!   words), so expressions are parsed exactly as written: no rewriting.
//! - Both its ANTLR parser and its interpreter recurse, and a stack overflow
//!   aborts the whole process. Debug builds need about 180 KiB of stack per
//!   bracket level to parse, and about 40 KiB per expression level to
//!   evaluate. So [`Predicate::compile`] refuses sources over
//!   [`MAX_PREDICATE_BYTES`] and expression trees deeper than
//!   [`MAX_PREDICATE_DEPTH`]. It parses a short, flat source on the caller's
//!   stack and anything else on a short-lived thread with a large stack.
//!   Within these limits, [`Predicate::evaluate`] fits easily in a 2 MiB
//!   thread stack (the tokio default).
//! - `cel::Program` is `Send + Sync`, so a compiled predicate is shared by
//!   reference counting and evaluated from any thread.
//! - Its loop macros (`all`, `exists`, `map`, ...) can make a short source
//!   run for minutes (a nested `all` over a list of 1,000 elements visits a
//!   million). So the environment expands them itself with a meter
//!   ([`metered`]): one evaluation visits at most [`MAX_PREDICATE_STEPS`]
//!   elements, then fails with [`PredicateError::TooExpensive`]. Compiling
//!   also bounds the expression's size ([`MAX_PREDICATE_NODES`]), its loop
//!   nesting ([`MAX_LOOP_NESTING`]) and its literal lists and maps
//!   ([`MAX_LITERAL_ELEMENTS`]).

use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, LazyLock};

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt,
};
use cel::common::value::Val;
use cel::{Context, Env, ParseErrors, Program, Value};

use super::item::Properties;

/// The longest accepted `must_satisfy` source, in bytes.
pub const MAX_PREDICATE_BYTES: usize = 4096;

/// The deepest accepted expression tree (an identifier alone is depth 1;
/// `&&` and `||` chains are balanced, so they add little).
pub const MAX_PREDICATE_DEPTH: usize = 24;

/// The most expression nodes a compiled predicate may have (after macro
/// expansion: a loop macro adds about eight).
pub const MAX_PREDICATE_NODES: usize = 1_000;

/// The most loop macros (`all`, `exists`, `exists_one`, `map`, `filter`)
/// nested in one another.
pub const MAX_LOOP_NESTING: usize = 3;

/// The most elements of one literal list or map.
pub const MAX_LITERAL_ELEMENTS: usize = 256;

/// The most steps one evaluation may take: each loop costs one step plus
/// one per element of what it loops over, charged before it starts.
pub const MAX_PREDICATE_STEPS: u64 = 50_000;

/// The reason text of [`PredicateError::TooExpensive`]; the planner shows it
/// in `blocked_by`, so clients can match it.
pub const PREDICATE_TOO_EXPENSIVE: &str = "PREDICATE_TOO_EXPENSIVE";

/// The name the required item's properties are bound to.
const SUBJECT: &str = "self";

/// Sources at most this long, with at most [`INLINE_MAX_NESTING`] nesting
/// characters, are parsed on the caller's stack (under 1 MiB even in debug).
const INLINE_MAX_BYTES: usize = 256;

/// See [`INLINE_MAX_BYTES`].
const INLINE_MAX_NESTING: usize = 4;

/// Stack of the thread that parses larger sources. Only touched pages are
/// committed, so this costs address space, not memory.
const PARSER_STACK_BYTES: usize = 64 << 20;

/// How many parser messages an error quotes.
const MAX_QUOTED_PARSE_ERRORS: usize = 3;

/// The standard CEL environment with metered loops, built once (it costs
/// about 0.4 ms).
static ENVIRONMENT: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(metered::environment()));

mod metered;

/// A compiled `must_satisfy` expression. Cheap to clone; `Send + Sync`.
///
/// Two predicates are equal when their sources are.
#[derive(Clone)]
pub struct Predicate {
    source: Arc<str>,
    program: Arc<Program>,
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Predicate>();
};

/// Why a predicate could not be compiled or evaluated.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum PredicateError {
    /// The source is not a valid CEL expression, or is over a size limit.
    /// `message` says where and what to change.
    #[error("must_satisfy is not a valid predicate: {message}")]
    Parse {
        /// What is wrong and what to do.
        message: String,
    },
    /// Evaluating the expression failed, e.g. it reads a field the required
    /// item does not have. Upstream, this counts as "not satisfied".
    #[error(
        "must_satisfy could not be evaluated: {message}; check that the required item \
         has the fields the expression reads, or guard optional ones with has(self.field)"
    )]
    Evaluation {
        /// The interpreter's error.
        message: String,
    },
    /// The evaluation took more than [`MAX_PREDICATE_STEPS`] steps and was
    /// stopped. Upstream, this counts as "not satisfied"; the message starts
    /// with [`PREDICATE_TOO_EXPENSIVE`].
    #[error(
        "PREDICATE_TOO_EXPENSIVE: must_satisfy needs more than {budget} evaluation steps \
         (elements visited by all, exists, exists_one, map and filter, nested loops \
         multiplied); make it visit fewer elements, e.g. avoid nesting loops over long lists"
    )]
    TooExpensive {
        /// The budget that was exceeded.
        budget: u64,
    },
    /// The expression evaluated to something other than a bool.
    #[error(
        "must_satisfy evaluated to a {found}, not a bool; make it a condition, \
         e.g. `self.state == \"up\"` rather than `self.state`"
    )]
    NotBoolean {
        /// The CEL type of the result, e.g. `int`.
        found: String,
    },
}

impl Predicate {
    /// Parses `source` once, for evaluation any number of times.
    ///
    /// Refuses sources longer than [`MAX_PREDICATE_BYTES`] and expressions
    /// nested deeper than [`MAX_PREDICATE_DEPTH`].
    pub fn compile(source: &str) -> Result<Predicate, PredicateError> {
        if source.len() > MAX_PREDICATE_BYTES {
            return Err(parse_error(format!(
                "it is {} bytes long, over the limit of {MAX_PREDICATE_BYTES} bytes; shorten it",
                source.len()
            )));
        }
        let program = if parses_inline(source) {
            parse_inline(source)?
        } else {
            parse_on_large_stack(source)?
        };
        Ok(Predicate {
            source: Arc::from(source),
            program: Arc::new(program),
        })
    }

    /// Evaluates the expression with `self` bound to `subject`.
    ///
    /// A missing field, a type mismatch and the like are
    /// [`PredicateError::Evaluation`]; a result that is not a bool is
    /// [`PredicateError::NotBoolean`]; an evaluation over
    /// [`MAX_PREDICATE_STEPS`] is stopped with
    /// [`PredicateError::TooExpensive`].
    pub fn evaluate(&self, subject: &Properties) -> Result<bool, PredicateError> {
        self.evaluate_within(subject, MAX_PREDICATE_STEPS)
    }

    /// [`evaluate`](Self::evaluate) with a budget of `steps`.
    pub fn evaluate_within(
        &self,
        subject: &Properties,
        steps: u64,
    ) -> Result<bool, PredicateError> {
        let mut context = Context::with_env(Arc::clone(&ENVIRONMENT));
        context.add_variable_as_val(SUBJECT, Box::new(object_to_val(subject)));
        let (outcome, exceeded) = metered::with_budget(steps, || {
            catch_unwind(AssertUnwindSafe(|| self.program.execute(&context)))
        });
        if exceeded {
            return Err(PredicateError::TooExpensive { budget: steps });
        }
        match outcome {
            Ok(Ok(Value::Bool(holds))) => Ok(holds),
            Ok(Ok(other)) => Err(PredicateError::NotBoolean {
                found: other.type_of().to_string(),
            }),
            Ok(Err(error)) => Err(PredicateError::Evaluation {
                message: error.to_string(),
            }),
            Err(_) => Err(PredicateError::Evaluation {
                message: "the CEL interpreter failed (internal error)".to_owned(),
            }),
        }
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }
}

impl fmt::Debug for Predicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Predicate").field(&self.source()).finish()
    }
}

impl PartialEq for Predicate {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Predicate {}

fn parse_error(message: String) -> PredicateError {
    PredicateError::Parse { message }
}

/// Whether `source` is small and flat enough to parse on any thread's stack.
/// Counts every bracket and `?` (string contents included, so it can only
/// overestimate): each one may cost the parser a full descent of the grammar.
fn parses_inline(source: &str) -> bool {
    let nesting = source
        .bytes()
        .filter(|byte| matches!(byte, b'(' | b'[' | b'{' | b'?'))
        .count();
    source.len() <= INLINE_MAX_BYTES && nesting <= INLINE_MAX_NESTING
}

/// Parses on the current stack, turning a parser panic into an error.
fn parse_inline(source: &str) -> Result<Program, PredicateError> {
    catch_unwind(|| parse_checked(source)).unwrap_or_else(|_| Err(parser_failure()))
}

/// Parses on a fresh thread with a large stack. A rejected expression tree
/// is dropped there too, since dropping it recurses as well.
fn parse_on_large_stack(source: &str) -> Result<Program, PredicateError> {
    std::thread::scope(|scope| {
        let parser = std::thread::Builder::new()
            .name("cel-parser".to_owned())
            .stack_size(PARSER_STACK_BYTES)
            .spawn_scoped(scope, || parse_checked(source))
            .map_err(|error| {
                parse_error(format!(
                    "the server could not start a parser thread ({error}); retry later"
                ))
            })?;
        parser.join().unwrap_or_else(|_| Err(parser_failure()))
    })
}

fn parser_failure() -> PredicateError {
    parse_error("the CEL parser failed on it (internal error); simplify the expression".to_owned())
}

/// Parses `source` and checks the depth of the resulting tree.
fn parse_checked(source: &str) -> Result<Program, PredicateError> {
    let program = ENVIRONMENT
        .compile(source)
        .map_err(|errors| describe_parse_errors(&errors))?;
    check_shape(program.expression())?;
    Ok(program)
}

fn too_deep() -> PredicateError {
    parse_error(format!(
        "it nests deeper than {MAX_PREDICATE_DEPTH} levels; simplify it \
         (fewer nested calls, brackets or chained operators)"
    ))
}

/// One line per parser message (the first few), without the source snippet
/// the parser draws under each.
fn describe_parse_errors(errors: &ParseErrors) -> PredicateError {
    if errors
        .errors
        .iter()
        .any(|e| e.msg.contains("Recursion limit"))
    {
        return too_deep();
    }
    let mut quoted: Vec<String> = errors
        .errors
        .iter()
        .take(MAX_QUOTED_PARSE_ERRORS)
        .map(|error| match error.pos {
            (line, column) if line >= 1 && column >= 0 => {
                format!("at line {line}, column {column}: {}", error.msg)
            }
            _ => error.msg.clone(),
        })
        .collect();
    let left_out = errors.errors.len().saturating_sub(MAX_QUOTED_PARSE_ERRORS);
    if left_out > 0 {
        quoted.push(format!("and {left_out} more"));
    }
    if quoted.is_empty() {
        quoted.push("the CEL parser rejected it".to_owned());
    }
    parse_error(format!(
        "{}; write a CEL condition over the required item's properties, \
         e.g. `self.mtu >= 1500 && self.state == \"up\"`",
        quoted.join("; ")
    ))
}

/// Checks the tree under `root`, without recursion: at most
/// [`MAX_PREDICATE_DEPTH`] deep, [`MAX_PREDICATE_NODES`] nodes,
/// [`MAX_LOOP_NESTING`] nested loops and [`MAX_LITERAL_ELEMENTS`] elements
/// per literal list or map.
fn check_shape(root: &IdedExpr) -> Result<(), PredicateError> {
    let mut pending = vec![(root, 1_usize, 0_usize)];
    let mut nodes = 0_usize;
    let mut children = Vec::new();
    while let Some((node, depth, loops)) = pending.pop() {
        nodes += 1;
        if depth > MAX_PREDICATE_DEPTH {
            return Err(too_deep());
        }
        if nodes > MAX_PREDICATE_NODES {
            return Err(parse_error(format!(
                "it expands to more than {MAX_PREDICATE_NODES} expression nodes; simplify it \
                 (each loop macro such as all() counts about eight)"
            )));
        }
        let loops = match &node.expr {
            Expr::Comprehension(_) => loops + 1,
            _ => loops,
        };
        if loops > MAX_LOOP_NESTING {
            return Err(parse_error(format!(
                "it nests more than {MAX_LOOP_NESTING} loops (all, exists, exists_one, map, \
                 filter) in one another; flatten it"
            )));
        }
        let elements = match &node.expr {
            Expr::List(list) => list.elements.len(),
            Expr::Map(map) => map.entries.len(),
            _ => 0,
        };
        if elements > MAX_LITERAL_ELEMENTS {
            return Err(parse_error(format!(
                "a literal list or map has {elements} elements, over the limit of \
                 {MAX_LITERAL_ELEMENTS}; keep long lists in the required item's properties"
            )));
        }
        push_children(&node.expr, depth + 1, &mut children);
        pending.extend(
            children
                .drain(..)
                .map(|(child, depth)| (child, depth, loops)),
        );
    }
    Ok(())
}

fn push_children<'a>(expr: &'a Expr, depth: usize, pending: &mut Vec<(&'a IdedExpr, usize)>) {
    match expr {
        Expr::Call(call) => {
            pending.extend(call.target.as_deref().map(|target| (target, depth)));
            pending.extend(call.args.iter().map(|arg| (arg, depth)));
        }
        Expr::Comprehension(comprehension) => pending.extend(
            [
                &comprehension.iter_range,
                &comprehension.accu_init,
                &comprehension.loop_cond,
                &comprehension.loop_step,
                &comprehension.result,
            ]
            .map(|child| (child, depth)),
        ),
        Expr::List(list) => pending.extend(list.elements.iter().map(|e| (e, depth))),
        Expr::Map(map) => push_entries(&map.entries, depth, pending),
        Expr::Struct(object) => push_entries(&object.entries, depth, pending),
        Expr::Select(select) => pending.push((&select.operand, depth)),
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}

fn push_entries<'a>(
    entries: &'a [cel::common::ast::IdedEntryExpr],
    depth: usize,
    pending: &mut Vec<(&'a IdedExpr, usize)>,
) {
    for entry in entries {
        match &entry.expr {
            EntryExpr::StructField(field) => pending.push((&field.value, depth)),
            EntryExpr::MapEntry(pair) => {
                pending.push((&pair.key, depth));
                pending.push((&pair.value, depth));
            }
        }
    }
}

/// A JSON object (properties, or a map nested in them) as a CEL map whose
/// strings borrow from `object`.
fn object_to_val<'a>(
    object: impl IntoIterator<Item = (&'a str, &'a serde_json::Value)>,
) -> CelMap<'a> {
    let entries: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = object
        .into_iter()
        .map(|(key, value)| (CelMapKey::from(key), json_to_val(value)))
        .collect();
    CelMap::from(entries)
}

/// A JSON value as a CEL value: null, bool, int (i64), uint (beyond i64),
/// double, string, list, map.
fn json_to_val(value: &serde_json::Value) -> Box<dyn Val + '_> {
    match value {
        serde_json::Value::Null => Box::new(CelNull),
        serde_json::Value::Bool(flag) => Box::new(CelBool::from(*flag)),
        serde_json::Value::Number(number) => number_to_val(number),
        serde_json::Value::String(text) => Box::new(CelString::from(text.as_str())),
        serde_json::Value::Array(elements) => {
            let elements: Vec<Box<dyn Val + '_>> = elements.iter().map(json_to_val).collect();
            Box::new(CelList::from(elements))
        }
        serde_json::Value::Object(object) => Box::new(object_to_val(
            object.iter().map(|(key, value)| (key.as_str(), value)),
        )),
    }
}

fn number_to_val(number: &serde_json::Number) -> Box<dyn Val + 'static> {
    if let Some(int) = number.as_i64() {
        Box::new(CelInt::from(int))
    } else if let Some(uint) = number.as_u64() {
        Box::new(CelUInt::from(uint))
    } else {
        Box::new(CelDouble::from(number.as_f64().unwrap_or(f64::NAN)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn props(value: serde_json::Value) -> Properties {
        Properties::try_from(value).unwrap_or_default()
    }

    fn eval(source: &str, subject: serde_json::Value) -> Result<bool, PredicateError> {
        Predicate::compile(source)
            .unwrap_or_else(|error| panic!("{source:?} should compile: {error}"))
            .evaluate(&props(subject))
    }

    fn parse_message(source: &str) -> String {
        match Predicate::compile(source) {
            Err(PredicateError::Parse { message }) => message,
            other => panic!("{source:?} should not parse, got {other:?}"),
        }
    }

    #[test]
    fn design_example_holds_and_fails() {
        let source = r#"self.mtu >= 1500 && self.state == "up""#;
        assert_eq!(eval(source, json!({"mtu": 1500, "state": "up"})), Ok(true));
        assert_eq!(eval(source, json!({"mtu": 1400, "state": "up"})), Ok(false));
        assert_eq!(
            eval(source, json!({"mtu": 9000, "state": "down"})),
            Ok(false)
        );
    }

    #[test]
    fn self_inside_string_literals_and_as_a_field_name_is_left_alone() {
        let subject = json!({"name": "self", "self": "self"});
        assert_eq!(eval(r#"self.name == "self""#, subject.clone()), Ok(true));
        assert_eq!(eval("self.name == 'self.name'", subject.clone()), Ok(false));
        assert_eq!(eval("self.self == self.name", subject), Ok(true));
    }

    #[test]
    fn nested_fields_lists_and_macros() {
        let subject = json!({
            "status": {"link": {"up": true, "speed": 1000}},
            "addresses": [{"family": "inet", "prefix": 24}, {"family": "inet6", "prefix": 64}],
            "tags": ["a", "b"],
            "gateway": null,
            "ratio": 0.5,
        });
        let holds = [
            "self.status.link.up && self.status.link.speed >= 1000",
            r#"self.addresses.exists(a, a.family == "inet6" && a.prefix == 64)"#,
            "size(self.tags) == 2 && 'b' in self.tags",
            "self.gateway == null",
            "self.ratio > 0.25 && self.ratio < 1",
            "has(self.status.link) && !has(self.status.duplex)",
            r#"self.tags[0].matches("^a$")"#,
        ];
        for source in holds {
            assert_eq!(eval(source, subject.clone()), Ok(true), "{source}");
        }
    }

    #[test]
    fn missing_field_is_an_evaluation_error() {
        let error = eval("self.mtu >= 1500", json!({"state": "up"})).expect_err("should fail");
        assert!(
            matches!(error, PredicateError::Evaluation { .. }),
            "{error:?}"
        );
        let shown = error.to_string();
        assert!(shown.contains("mtu"), "{shown}");
        assert!(shown.contains("has(self.field)"), "{shown}");
    }

    #[test]
    fn type_mismatch_and_unknown_identifier_are_evaluation_errors() {
        let mismatch = eval("self.mtu > 'big'", json!({"mtu": 1})).expect_err("should fail");
        assert!(
            matches!(mismatch, PredicateError::Evaluation { .. }),
            "{mismatch:?}"
        );
        let unknown = eval("other.mtu > 1", json!({"mtu": 1})).expect_err("should fail");
        assert!(
            matches!(unknown, PredicateError::Evaluation { .. }),
            "{unknown:?}"
        );
    }

    #[test]
    fn non_bool_result_is_an_error_naming_the_type() {
        assert_eq!(
            eval("self.mtu + 1", json!({"mtu": 1})),
            Err(PredicateError::NotBoolean {
                found: "int".into()
            })
        );
        let error = eval("self.state", json!({"state": "up"})).expect_err("should fail");
        assert!(error.to_string().contains("not a bool"), "{error}");
    }

    #[test]
    fn parse_error_says_where_and_what_to_do() {
        let message = parse_message("self.mtu >= ");
        assert!(message.contains("line 1, column"), "{message}");
        assert!(message.contains("self.mtu >= 1500"), "{message}");
        assert!(!message.contains('\n'), "{message}");
        let shown = PredicateError::Parse { message }.to_string();
        assert!(
            shown.starts_with("must_satisfy is not a valid predicate"),
            "{shown}"
        );
        parse_message("");
        parse_message("self.state == 'up");
    }

    #[test]
    fn large_integers_keep_their_value() {
        let subject = json!({"small": -5, "max": i64::MAX, "huge": u64::MAX, "float": 1.5e300});
        assert_eq!(
            eval("self.max == 9223372036854775807", subject.clone()),
            Ok(true)
        );
        assert_eq!(
            eval("self.huge == 18446744073709551615u", subject.clone()),
            Ok(true)
        );
        assert_eq!(eval("self.huge > self.max", subject.clone()), Ok(true));
        assert_eq!(
            eval("self.small < 0 && self.float > 1e299", subject.clone()),
            Ok(true)
        );
        let overflow = eval("self.max + 1 > 0", subject).expect_err("should fail");
        assert!(
            matches!(overflow, PredicateError::Evaluation { .. }),
            "{overflow:?}"
        );
    }

    #[test]
    fn too_long_sources_are_refused() {
        let long = format!("self.a == '{}'", "x".repeat(MAX_PREDICATE_BYTES));
        let message = parse_message(&long);
        assert!(
            message.contains("over the limit of 4096 bytes"),
            "{message}"
        );
    }

    #[test]
    fn deep_nesting_is_refused_without_overflowing_the_stack() {
        let deep_sources = [
            format!("{}true{}", "(".repeat(200), ")".repeat(200)),
            format!("{}1 == 1", "1 + ".repeat(1000)),
            format!("self{} == 1", ".a".repeat(1000)),
            format!("{}1{} == 1", "int(".repeat(40), ")".repeat(40)),
        ];
        for source in &deep_sources {
            let message = parse_message(source);
            assert!(message.contains("nests deeper than 24"), "{message}");
        }
    }

    #[test]
    fn loops_nested_too_deep_large_literals_and_huge_expressions_are_refused() {
        let nested = format!("{}true{}", "[1].all(x, ".repeat(4), ")".repeat(4));
        assert!(parse_message(&nested).contains("nests more than 3 loops"));
        let three = format!("{}true{}", "[1].all(x, ".repeat(3), ")".repeat(3));
        assert_eq!(eval(&three, json!({})), Ok(true));
        let literal = format!(
            "self.a in [{}]",
            (0..300)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        assert!(parse_message(&literal).contains("over the limit of 256"));
        let terms: Vec<String> = (0..300).map(|i| format!("self.a=={i}")).collect();
        let message = parse_message(&terms.join("&&"));
        assert!(
            message.contains("more than 1000 expression nodes"),
            "{message}"
        );
    }

    #[test]
    fn a_nested_loop_over_a_long_list_stops_at_the_budget_quickly() {
        let list: Vec<u32> = (0..1_000).collect();
        let subject = json!({ "xs": list });
        for source in [
            "self.xs.all(x, self.xs.all(y, x + y >= 0))",
            "self.xs.exists(x, self.xs.exists(y, x + y < 0))",
            "self.xs.all(x, self.xs.all(y, x + y >= 0)) || true",
            "size(self.xs.map(x, self.xs.filter(y, y > x))) > 0",
            "self.xs.exists_one(x, self.xs.all(y, y >= 0))",
        ] {
            let started = std::time::Instant::now();
            let error = eval(source, subject.clone()).expect_err(source);
            assert_eq!(
                error,
                PredicateError::TooExpensive {
                    budget: MAX_PREDICATE_STEPS
                },
                "{source}"
            );
            assert!(error.to_string().starts_with(PREDICATE_TOO_EXPENSIVE));
            let took = started.elapsed();
            assert!(
                took < std::time::Duration::from_secs(5),
                "{source}: {took:?}"
            );
        }
    }

    #[test]
    fn loops_within_the_budget_give_the_standard_answers() {
        let subject = json!({"xs": [1, 2, 3], "m": {"a": 1, "b": 2}});
        let cases = [
            ("self.xs.all(x, x > 0)", true),
            ("self.xs.all(x, x > 1)", false),
            ("self.xs.exists(x, x == 2)", true),
            ("self.xs.exists_one(x, x > 2)", true),
            ("self.xs.existsOne(x, x > 1)", false),
            ("self.xs.map(x, x * 2) == [2, 4, 6]", true),
            ("self.xs.map(x, x > 1, x * 10) == [20, 30]", true),
            ("self.xs.filter(x, x != 2) == [1, 3]", true),
            ("self.m.all(k, k in ['a', 'b'])", true),
            ("[1, 'a'].exists(x, x == 1)", true),
            ("has(self.m.a) && !has(self.m.c)", true),
        ];
        for (source, expected) in cases {
            assert_eq!(eval(source, subject.clone()), Ok(expected), "{source}");
        }
        let list: Vec<u32> = (0..100).collect();
        let predicate =
            Predicate::compile("self.xs.all(x, self.xs.all(y, y >= 0))").expect("compiles");
        let subject = props(json!({ "xs": list }));
        assert_eq!(predicate.evaluate_within(&subject, 10_201), Ok(true));
        assert!(matches!(
            predicate.evaluate_within(&subject, 10_200),
            Err(PredicateError::TooExpensive { .. })
        ));
    }

    #[test]
    fn long_balanced_conditions_are_accepted() {
        let terms: Vec<String> = (0..100).map(|i| format!("self.a{i} == {i}")).collect();
        let source = terms.join(" && ");
        let subject: Properties = (0..100).map(|i| (format!("a{i}"), json!(i))).collect();
        let predicate = Predicate::compile(&source).expect("a flat conjunction compiles");
        assert_eq!(predicate.evaluate(&subject), Ok(true));
    }

    #[test]
    fn inline_and_large_stack_paths_agree() {
        let short = "has(self.a) && self.a == 1";
        let bracketed = "((((((self.a)))))) == 1";
        assert!(parses_inline(short));
        assert!(!parses_inline(bracketed));
        for source in [short, bracketed] {
            assert_eq!(eval(source, json!({"a": 1})), Ok(true), "{source}");
        }
    }

    #[test]
    fn predicates_are_shared_across_threads() {
        let predicate = Predicate::compile("self.n > 1").expect("compiles");
        let results: Vec<bool> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|n| {
                    let predicate = predicate.clone();
                    scope.spawn(move || predicate.evaluate(&props(json!({"n": n}))))
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().expect("no panic").expect("evaluates"))
                .collect()
        });
        assert_eq!(results, [false, false, true, true]);
    }

    #[test]
    fn debug_and_source_show_the_expression() {
        let predicate = Predicate::compile("self.up").expect("compiles");
        assert_eq!(predicate.source(), "self.up");
        assert_eq!(format!("{predicate:?}"), r#"Predicate("self.up")"#);
        assert_eq!(predicate, Predicate::compile("self.up").expect("compiles"));
    }
}
