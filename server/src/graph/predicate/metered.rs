//! The cost budget of predicate evaluation.
//!
//! Every loop a CEL expression can run comes from a macro (`all`, `exists`,
//! `exists_one`/`existsOne`, `map`, `filter`): the `cel` crate expands them
//! at parse time into comprehensions. This environment expands them itself,
//! exactly as the standard macros do, except that each comprehension's range
//! goes through `@metered(range)`, a function a predicate cannot name (CEL
//! identifiers cannot start with `@`). It charges one step for the loop plus
//! one per element before the loop starts, against a per-evaluation budget
//! kept in a thread local (evaluation never leaves its thread), and fails
//! once the budget is spent. So the elements all loops of one evaluation
//! visit, nested ones included, are at most the budget, and an exhausted
//! budget ends every later loop at its start.
//!
//! `has` is re-declared as well, since an environment without the standard
//! macros has none.

use std::cell::Cell;

use cel::common::ast::{
    CallExpr, ComprehensionExpr, Expr, IdedExpr, ListExpr, LiteralValue, operators,
};
use cel::common::types::DYN_TYPE;
use cel::common::value::CowVal;
use cel::parser::{Macro, MacroExprHelper};
use cel::{Env, ExecutionError, ParseError};

/// The metering function wrapped around every comprehension range.
const METER: &str = "@metered";

/// The accumulator of every comprehension, as in the standard macros.
const RESULT: &str = "@result";

thread_local! {
    /// Steps left to the evaluation running on this thread (`None`: none is).
    static REMAINING: Cell<Option<u64>> = const { Cell::new(None) };
    /// Whether the running evaluation ran out of steps.
    static EXCEEDED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `evaluate` with a budget of `steps`; also answers whether the
/// budget was exceeded (whatever `evaluate` returned then is not to be
/// trusted: an `||` may have absorbed the failure).
pub(super) fn with_budget<T>(steps: u64, evaluate: impl FnOnce() -> T) -> (T, bool) {
    REMAINING.with(|remaining| remaining.set(Some(steps)));
    EXCEEDED.with(|exceeded| exceeded.set(false));
    let outcome = evaluate();
    REMAINING.with(|remaining| remaining.set(None));
    let exceeded = EXCEEDED.with(|exceeded| exceeded.replace(false));
    (outcome, exceeded)
}

/// Takes `steps` from the running evaluation's budget; false once it is
/// spent (and for every later charge of that evaluation).
fn charge(steps: u64) -> bool {
    REMAINING.with(|remaining| match remaining.get() {
        None => true,
        Some(left) if left >= steps && !EXCEEDED.with(Cell::get) => {
            remaining.set(Some(left - steps));
            true
        }
        Some(_) => {
            EXCEEDED.with(|exceeded| exceeded.set(true));
            false
        }
    })
}

/// `@metered(range)`: charges for a loop over `range`, then returns it
/// untouched (borrowed values stay borrowed).
fn metered<'b, 'v>(mut args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let range = args
        .pop()
        .ok_or_else(|| ExecutionError::invalid_argument_count(1, 0))?;
    let elements = range
        .as_sizer()
        .map_or(0, |sizer| u64::try_from(*sizer.size().inner()).unwrap_or(0));
    if charge(elements.saturating_add(1)) {
        Ok(range)
    } else {
        Err(ExecutionError::function_error(
            METER,
            "the evaluation budget is spent",
        ))
    }
}

/// The standard CEL environment with metered loop macros.
pub(super) fn environment() -> Env {
    let mut env = Env::default().with_stdlib();
    let declared = env
        .add_overload(METER, "metered_dyn", vec![DYN_TYPE], metered)
        .and_then(|()| env.add_macro(Macro::global(operators::HAS, 1, has)))
        .and_then(|()| env.add_macro(Macro::receiver(operators::ALL, 2, all)))
        .and_then(|()| env.add_macro(Macro::receiver(operators::EXISTS, 2, exists)))
        .and_then(|()| env.add_macro(Macro::receiver(operators::EXISTS_ONE, 2, exists_one)))
        .and_then(|()| env.add_macro(Macro::receiver("existsOne", 2, exists_one)))
        .and_then(|()| env.add_macro(Macro::receiver(operators::MAP, 2, map)))
        .and_then(|()| env.add_macro(Macro::receiver(operators::MAP, 3, map)))
        .and_then(|()| env.add_macro(Macro::receiver(operators::FILTER, 2, filter)));
    if let Err(error) = declared {
        // Only a cel upgrade that adds these names can get here; predicates
        // then fail to parse with a clear message rather than run unmetered.
        tracing::error!(%error, "The metered CEL environment could not be declared.");
    }
    env
}

type Expansion = Result<Option<IdedExpr>, ParseError>;

fn call(helper: &mut MacroExprHelper<'_>, function: &str, args: Vec<IdedExpr>) -> IdedExpr {
    helper.next_expr(Expr::Call(CallExpr {
        func_name: function.to_owned(),
        target: None,
        args,
    }))
}

fn ident(helper: &mut MacroExprHelper<'_>, name: &str) -> IdedExpr {
    helper.next_expr(Expr::Ident(name.to_owned()))
}

fn literal(helper: &mut MacroExprHelper<'_>, value: LiteralValue) -> IdedExpr {
    helper.next_expr(Expr::Literal(value))
}

/// The loop variable of a macro call: its first argument, a simple name.
fn loop_variable(
    helper: &mut MacroExprHelper<'_>,
    args: &[IdedExpr],
) -> Result<String, ParseError> {
    match args.first() {
        Some(IdedExpr {
            expr: Expr::Ident(name),
            ..
        }) => Ok(name.clone()),
        Some(other) => Err(helper.new_error(other.id, "argument must be a simple name")),
        None => Err(helper.new_error(0, "a loop macro needs a variable name")),
    }
}

/// Takes the call's target (the range) and wraps it in `@metered`.
fn metered_range(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
) -> Result<IdedExpr, ParseError> {
    let range = target
        .take()
        .ok_or_else(|| helper.new_error(0, "a loop macro needs a target"))?;
    Ok(call(helper, METER, vec![range]))
}

struct Loop {
    variable: String,
    init: IdedExpr,
    condition: IdedExpr,
    step: IdedExpr,
    result: IdedExpr,
}

fn comprehension(helper: &mut MacroExprHelper<'_>, range: IdedExpr, parts: Loop) -> IdedExpr {
    helper.next_expr(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range: range,
        iter_var: parts.variable,
        iter_var2: None,
        accu_var: RESULT.to_owned(),
        accu_init: parts.init,
        loop_cond: parts.condition,
        loop_step: parts.step,
        result: parts.result,
    })))
}

/// `has(a.b)`: a presence test of the selected field.
fn has(
    helper: &mut MacroExprHelper<'_>,
    _target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Expansion {
    match args.pop() {
        Some(IdedExpr {
            expr: Expr::Select(mut select),
            ..
        }) => {
            select.test = true;
            Ok(Some(helper.next_expr(Expr::Select(select))))
        }
        Some(other) => Err(helper.new_error(other.id, "invalid argument to has() macro")),
        None => Err(helper.new_error(0, "has() takes one argument")),
    }
}

/// `range.all(x, p)` and `range.exists(x, p)`: a short-circuiting `&&` or
/// `||` fold.
fn fold(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
    every: bool,
) -> Expansion {
    let variable = loop_variable(helper, args)?;
    let predicate = args
        .pop()
        .ok_or_else(|| helper.new_error(0, "the macro takes a predicate"))?;
    args.clear();
    let range = metered_range(helper, target)?;
    let init = literal(helper, LiteralValue::Boolean(every.into()));
    let accumulator = ident(helper, RESULT);
    let going_on = if every {
        accumulator
    } else {
        call(helper, operators::LOGICAL_NOT, vec![accumulator])
    };
    let condition = call(helper, operators::NOT_STRICTLY_FALSE, vec![going_on]);
    let accumulator = ident(helper, RESULT);
    let connective = if every {
        operators::LOGICAL_AND
    } else {
        operators::LOGICAL_OR
    };
    let step = call(helper, connective, vec![accumulator, predicate]);
    let result = ident(helper, RESULT);
    let parts = Loop {
        variable,
        init,
        condition,
        step,
        result,
    };
    Ok(Some(comprehension(helper, range, parts)))
}

fn all(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Expansion {
    fold(helper, target, args, true)
}

fn exists(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Expansion {
    fold(helper, target, args, false)
}

/// `range.exists_one(x, p)`: counts the elements that hold, compares to 1.
fn exists_one(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Expansion {
    let variable = loop_variable(helper, args)?;
    let predicate = args
        .pop()
        .ok_or_else(|| helper.new_error(0, "the macro takes a predicate"))?;
    args.clear();
    let range = metered_range(helper, target)?;
    let init = literal(helper, LiteralValue::Int(0.into()));
    let condition = literal(helper, LiteralValue::Boolean(true.into()));
    let accumulator = ident(helper, RESULT);
    let one = literal(helper, LiteralValue::Int(1.into()));
    let plus_one = call(helper, operators::ADD, vec![accumulator, one]);
    let unchanged = ident(helper, RESULT);
    let step = call(
        helper,
        operators::CONDITIONAL,
        vec![predicate, plus_one, unchanged],
    );
    let accumulator = ident(helper, RESULT);
    let one = literal(helper, LiteralValue::Int(1.into()));
    let result = call(helper, operators::EQUALS, vec![accumulator, one]);
    let parts = Loop {
        variable,
        init,
        condition,
        step,
        result,
    };
    Ok(Some(comprehension(helper, range, parts)))
}

/// The step of `map` and `filter`: `@result + [element]`, guarded as
/// `guard ? @result + [element] : @result` when there is a guard. The shape
/// is the one the interpreter appends in place.
fn append_step(
    helper: &mut MacroExprHelper<'_>,
    element: IdedExpr,
    guard: Option<IdedExpr>,
) -> IdedExpr {
    let accumulator = ident(helper, RESULT);
    let element = helper.next_expr(Expr::List(ListExpr::new(vec![element])));
    let append = call(helper, operators::ADD, vec![accumulator, element]);
    match guard {
        Some(guard) => {
            let unchanged = ident(helper, RESULT);
            call(
                helper,
                operators::CONDITIONAL,
                vec![guard, append, unchanged],
            )
        }
        None => append,
    }
}

fn list_loop(
    helper: &mut MacroExprHelper<'_>,
    range: IdedExpr,
    variable: String,
    step: IdedExpr,
) -> IdedExpr {
    let init = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
    let condition = literal(helper, LiteralValue::Boolean(true.into()));
    let result = ident(helper, RESULT);
    let parts = Loop {
        variable,
        init,
        condition,
        step,
        result,
    };
    comprehension(helper, range, parts)
}

/// `range.map(x, f)` and `range.map(x, p, f)`.
fn map(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Expansion {
    let variable = loop_variable(helper, args)?;
    let transform = args
        .pop()
        .ok_or_else(|| helper.new_error(0, "map() takes a transform"))?;
    let guard = if args.len() == 2 { args.pop() } else { None };
    args.clear();
    let range = metered_range(helper, target)?;
    let step = append_step(helper, transform, guard);
    Ok(Some(list_loop(helper, range, variable, step)))
}

/// `range.filter(x, p)`.
fn filter(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Expansion {
    let variable = loop_variable(helper, args)?;
    let guard = args
        .pop()
        .ok_or_else(|| helper.new_error(0, "filter() takes a predicate"))?;
    let element = args
        .pop()
        .ok_or_else(|| helper.new_error(0, "filter() takes a variable"))?;
    let range = metered_range(helper, target)?;
    let step = append_step(helper, element, Some(guard));
    Ok(Some(list_loop(helper, range, variable, step)))
}
