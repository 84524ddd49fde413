//! [`ErrorAction`]: what an error policy decides for a failed reconcile.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use workq::HandlerError;

/// What to do with an object whose reconcile returned an error: the answer of the policy
/// given to [`Controller::error_policy`](crate::Controller::error_policy).
///
/// Without a policy every error is [`ErrorAction::Backoff`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use kube::runtime::controller::Action;
/// use workq_kube::ErrorAction;
///
/// // kube's error_policy answers convert: a requeue is a fixed delay, await_change a give-up.
/// assert_eq!(ErrorAction::from(Action::requeue(Duration::from_secs(5))), ErrorAction::RetryAfter(Duration::from_secs(5)));
/// assert_eq!(ErrorAction::from(Action::await_change()), ErrorAction::GiveUp);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorAction {
    /// Retry after the queue's per-object backoff (client-go's `AddRateLimited`): the delay
    /// grows with each failure in a row (5 ms doubling to 1000 s with the default queue)
    /// and starts over after a success.
    Backoff,
    /// Retry after this delay instead. The object's failures are forgotten, as kube's
    /// `Action::requeue` and controller-runtime's `RequeueAfter` do; a later
    /// [`Backoff`](Self::Backoff) starts from the shortest delay again.
    RetryAfter(Duration),
    /// Stop retrying: the object is forgotten and the give-up reported (the workers'
    /// `on_give_up` callback, the summary's `given_up`). Its next change reconciles it
    /// again.
    GiveUp,
}

impl From<Action> for ErrorAction {
    /// kube's `error_policy` answer: `Action::requeue(d)` is [`ErrorAction::RetryAfter`],
    /// `Action::await_change()` is [`ErrorAction::GiveUp`] (kube would not retry either).
    fn from(action: Action) -> Self {
        match crate::action_outcome(&action) {
            workq::Outcome::RetryAfter(delay) => ErrorAction::RetryAfter(delay),
            _ => ErrorAction::GiveUp,
        }
    }
}

/// A policy with its error type erased: the object, the error, and the failures in a row
/// (this one included).
pub(crate) type Policy<K> = Arc<dyn Fn(Arc<K>, &HandlerError, usize) -> ErrorAction + Send + Sync>;

/// Erases a policy's error type: the error is read back as an `E` (or is the
/// [`HandlerError`] itself when `E` is that type); an error of another type gets
/// [`ErrorAction::Backoff`], with a warning.
pub(crate) fn erase<K, E, A>(
    policy: impl Fn(Arc<K>, &E, usize) -> A + Send + Sync + 'static,
) -> Policy<K>
where
    K: 'static,
    E: 'static,
    A: Into<ErrorAction>,
{
    Arc::new(move |object, error: &HandlerError, failures| {
        let typed = error
            .downcast_ref::<E>()
            .or_else(|| (error as &dyn Any).downcast_ref::<E>());
        match typed {
            Some(typed) => policy(object, typed, failures).into(),
            None => {
                tracing::warn!(%error, expected = std::any::type_name::<E>(), "the error policy does not take this error's type; backing off");
                ErrorAction::Backoff
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_reads_the_error_with_its_type() {
        let policy = erase(|object: Arc<u32>, error: &std::io::Error, failures| {
            assert_eq!((*object, failures), (7, 3));
            match error.kind() {
                std::io::ErrorKind::NotFound => ErrorAction::GiveUp,
                _ => ErrorAction::RetryAfter(Duration::from_secs(1)),
            }
        });
        let not_found = HandlerError::new(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert_eq!(policy(Arc::new(7), &not_found, 3), ErrorAction::GiveUp);
        let other = HandlerError::new(std::io::Error::other("conflict"));
        assert_eq!(
            policy(Arc::new(7), &other, 3),
            ErrorAction::RetryAfter(Duration::from_secs(1))
        );
    }

    #[test]
    fn an_error_of_another_type_backs_off() {
        let policy = erase(|_: Arc<u32>, _: &std::io::Error, _| ErrorAction::GiveUp);
        assert_eq!(
            policy(Arc::new(7), &HandlerError::new("a String"), 1),
            ErrorAction::Backoff
        );
    }

    #[test]
    fn a_policy_may_take_the_handler_error_itself() {
        let policy = erase(|_: Arc<u32>, error: &HandlerError, _| {
            assert_eq!(error.message(), "timeout");
            Action::requeue(Duration::from_secs(2))
        });
        assert_eq!(
            policy(Arc::new(7), &HandlerError::new("timeout"), 1),
            ErrorAction::RetryAfter(Duration::from_secs(2))
        );
    }
}
