//! [`ReconcileResult`]: what a reconcile may return, kube's [`Action`] among it; and how a
//! reconcile ended, for the metrics (`ReconcileEnd`).

use std::fmt;
use std::time::Duration;

use kube::runtime::controller::Action;
use workq::{HandlerError, Outcome};

/// What a reconcile function may return: an [`Outcome`], `()` (done), kube's [`Action`], or a
/// `Result` of one of these whose `Err` is a failure to retry with the queue's per-object
/// backoff.
///
/// | the reconcile returns | the runner does |
/// | --- | --- |
/// | [`Outcome::Done`], `()`, [`Action::await_change()`] | forgets the object's failures |
/// | [`Action::requeue`]`(d)`, [`Outcome::RetryAfter`]`(d)` | forgets, then adds the object back after `d` |
/// | `Err(error)`, [`Outcome::Retry`] | adds it back after its backoff (rate limited), and gives up after `max_retries` |
/// | [`Outcome::GiveUp`] | forgets it and reports the give-up |
///
/// kube's `Action` keeps its delay private; the runner reads it from the `Debug` form
/// (`Action { requeue_after: Some(5s) }`), and this crate's tests check that reading against
/// kube's own constructors, so a change of that form upstream fails them. An `Action` whose
/// delay cannot be read is handled as done, with a warning.
pub trait ReconcileResult {
    /// The outcome, or the error of a failure.
    ///
    /// # Errors
    ///
    /// The failure, for a value that stands for one (`Err(error)`).
    fn into_reconcile_outcome(self) -> Result<Outcome, HandlerError>;
}

impl ReconcileResult for Outcome {
    fn into_reconcile_outcome(self) -> Result<Outcome, HandlerError> {
        Ok(self)
    }
}

impl ReconcileResult for () {
    fn into_reconcile_outcome(self) -> Result<Outcome, HandlerError> {
        Ok(Outcome::Done)
    }
}

impl ReconcileResult for Action {
    fn into_reconcile_outcome(self) -> Result<Outcome, HandlerError> {
        Ok(action_outcome(&self))
    }
}

impl<O, E> ReconcileResult for Result<O, E>
where
    O: ReconcileResult,
    E: fmt::Display + Send + Sync + 'static,
{
    fn into_reconcile_outcome(self) -> Result<Outcome, HandlerError> {
        match self {
            Ok(outcome) => outcome.into_reconcile_outcome(),
            Err(error) => Err(HandlerError::new(error)),
        }
    }
}

/// The [`Outcome`] an [`Action`] stands for: [`Outcome::Done`] for
/// [`Action::await_change`], [`Outcome::RetryAfter`] for [`Action::requeue`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use kube::runtime::controller::Action;
/// use workq::Outcome;
/// use workq_kube::action_outcome;
///
/// assert_eq!(action_outcome(&Action::await_change()), Outcome::Done);
/// assert_eq!(
///     action_outcome(&Action::requeue(Duration::from_millis(1500))),
///     Outcome::RetryAfter(Duration::from_millis(1500)),
/// );
/// ```
pub fn action_outcome(action: &Action) -> Outcome {
    if *action == Action::await_change() {
        return Outcome::Done;
    }
    // kube has no getter for the delay (see the trait's docs): read it from the Debug form.
    let text = format!("{action:?}");
    match requeue_after(&text) {
        Some(delay) => Outcome::RetryAfter(delay),
        None => {
            tracing::warn!(action = %text, "cannot read the requeue delay of kube's Action: handled as done");
            Outcome::Done
        }
    }
}

/// The delay in `Action { requeue_after: Some(<Duration's Debug>) }`, checked by rebuilding
/// the action from it.
fn requeue_after(text: &str) -> Option<Duration> {
    let inner = text
        .strip_prefix("Action { requeue_after: Some(")?
        .strip_suffix(") }")?;
    let delay = parse_duration_debug(inner)?;
    // Sub-nanosecond digits cannot occur, but a rounding slip must not pass unnoticed.
    (format!("{:?}", Action::requeue(delay)) == text).then_some(delay)
}

/// Parses `Duration`'s `Debug` form: a decimal number and one of `s`, `ms`, `µs`, `ns`.
fn parse_duration_debug(text: &str) -> Option<Duration> {
    let (number, nanos_per_unit) = [
        ("ns", 1_u128),
        ("µs", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
    ]
    .into_iter()
    .find_map(|(unit, scale)| text.strip_suffix(unit).map(|number| (number, scale)))?;
    let (whole, fraction) = match number.split_once('.') {
        Some((_, "")) => return None,
        Some(parts) => parts,
        None => (number, ""),
    };
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let mut nanos = whole.parse::<u128>().ok()?.checked_mul(nanos_per_unit)?;
    let mut scale = nanos_per_unit;
    for digit in fraction.bytes() {
        scale /= 10;
        if scale == 0 {
            return None;
        }
        nanos += u128::from(digit - b'0') * scale;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// How a reconcile ended, as controller-runtime's `result` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReconcileEnd {
    /// Done (`Action::await_change()`, `Outcome::Done`, or an object gone from the store).
    Success,
    /// Failed: an error, a panic, a timeout, `Outcome::GiveUp`.
    Error,
    /// Requeued with the rate limiter's delay without an error (`Outcome::Retry`), or at
    /// once (`Outcome::RetryAfter(0)`).
    Requeue,
    /// Requeued after a delay it asked for (`Action::requeue(d)`).
    RequeueAfter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requeue_delays_are_read_back_exactly() {
        for delay in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(1_500),
            Duration::from_micros(999),
            Duration::from_millis(1),
            Duration::from_millis(1500),
            Duration::from_secs(300),
            Duration::new(3_600, 123_456_789),
            Duration::from_secs(u64::from(u32::MAX) * 7),
            Duration::MAX,
        ] {
            assert_eq!(
                action_outcome(&Action::requeue(delay)),
                Outcome::RetryAfter(delay),
                "{delay:?}"
            );
        }
    }

    #[test]
    fn await_change_is_done() {
        assert_eq!(action_outcome(&Action::await_change()), Outcome::Done);
    }

    #[test]
    fn errors_keep_their_type_for_the_give_up_report() {
        let failure = Err::<Action, _>(std::io::Error::other("conflict"))
            .into_reconcile_outcome()
            .unwrap_err();
        assert_eq!(failure.message(), "conflict");
        assert!(failure.downcast_ref::<std::io::Error>().is_some());
    }

    #[test]
    fn malformed_durations_are_refused() {
        for text in ["", "s", "1.s", "1x", "-1s", "1.0000000001s", "1..5s"] {
            assert_eq!(parse_duration_debug(text), None, "{text:?}");
        }
    }
}
