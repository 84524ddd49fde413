//! The replies of the queue's scripts, read in one place: each reply is a type implementing
//! [`redis::FromRedisValue`], and a reply of any other shape is one [`Error::Protocol`] naming
//! the operation.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use crate::add::AddKind;
use crate::error::Error;
use crate::stats::{InFlight, Stats};

/// Reads `value` as the reply of operation `op`.
pub(crate) fn parse<R: FromRedisValue>(op: &str, value: Value) -> Result<R, Error> {
    R::from_redis_value(value).map_err(|e| Error::Protocol(format!("{op}: {e}")))
}

/// A number: an integer reply, or a bulk string holding a decimal number (Lua numbers that
/// went through a string).
pub(crate) fn number(value: &Value) -> Result<i64, ParsingError> {
    match value {
        Value::Int(n) => Ok(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|f| f.is_finite())
            .map(|f| f as i64)
            .ok_or_else(|| format!("expected a number, got {value:?}").into()),
        other => Err(format!("expected a number, got {other:?}").into()),
    }
}

/// The parts of an array reply.
pub(crate) fn parts(value: Value) -> Result<Vec<Value>, ParsingError> {
    match value {
        Value::Array(values) => Ok(values),
        other => Err(format!("expected an array, got {other:?}").into()),
    }
}

/// The reply of the add scripts: `{outcome, seq}`, and `{outcome, seq, delay}` from
/// `add_rate_limited`.
pub(crate) struct AddReply {
    pub(crate) kind: AddKind,
    pub(crate) seq: u64,
    /// The delay the server computed, if it sent one.
    pub(crate) delay: Option<Duration>,
}

impl FromRedisValue for AddReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let parts = parts(value)?;
        let kind = match parts.first().map(number).transpose()? {
            Some(0) => AddKind::Ignored,
            Some(1) => AddKind::Queued,
            Some(2) => AddKind::Duplicate,
            Some(3) => AddKind::Deferred,
            Some(4) => AddKind::Delayed,
            other => return Err(format!("unknown add outcome {other:?}").into()),
        };
        let seq = parts.get(1).map(number).transpose()?.unwrap_or(0).max(0) as u64;
        let delay = parts
            .get(2)
            .map(number)
            .transpose()?
            .map(|us| Duration::from_micros(us.max(0) as u64));
        Ok(AddReply { kind, seq, delay })
    }
}

/// The reply of the `get` script.
pub(crate) enum GetReply {
    /// `{1, item, token, priority}`: an item under a new lease.
    Leased {
        raw: Vec<u8>,
        token: u64,
        priority: i32,
    },
    /// `{2}`: shut down, nothing ready.
    ShutDown,
    /// `{0, wait}`: nothing ready; something may be due after `wait`.
    Empty(Option<Duration>),
}

impl FromRedisValue for GetReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let mut parts = parts(value)?.into_iter();
        match parts.next().as_ref().map(number).transpose()? {
            Some(1) => {
                let raw = match parts.next() {
                    Some(Value::BulkString(bytes)) => bytes,
                    Some(Value::SimpleString(s)) => s.into_bytes(),
                    other => return Err(format!("expected an item, got {other:?}").into()),
                };
                let token = number(&parts.next().unwrap_or(Value::Nil))?.max(0) as u64;
                let priority = parts.next().as_ref().map(number).transpose()?.unwrap_or(0);
                let priority = i32::try_from(priority)
                    .map_err(|_| ParsingError::from(format!("priority {priority} out of range")))?;
                Ok(GetReply::Leased {
                    raw,
                    token,
                    priority,
                })
            }
            Some(2) => Ok(GetReply::ShutDown),
            Some(0) => {
                let wait = parts.next().as_ref().map(number).transpose()?.unwrap_or(-1);
                Ok(GetReply::Empty(
                    (wait >= 0).then(|| Duration::from_micros(wait as u64)),
                ))
            }
            other => Err(format!("unknown get reply {other:?}").into()),
        }
    }
}

/// The reply of the `done` script: whether the caller held the lease (1: done, 2: done and
/// queued again), or not (0: another holder has it, -1: nobody does).
pub(crate) struct DoneReply(pub(crate) bool);

impl FromRedisValue for DoneReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        Ok(DoneReply(number(&value)? >= 1))
    }
}

/// The reply of the `stats` script (see `stats.lua` for its fields).
pub(crate) struct StatsReply(pub(crate) Stats);

/// The text of an item or key in a reply.
pub(crate) fn text(value: &Value) -> Result<String, ParsingError> {
    match value {
        Value::BulkString(bytes) => Ok(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(format!("expected a string, got {other:?}").into()),
    }
}

/// A count: a number that is never negative.
pub(crate) fn count(value: &Value) -> Result<u64, ParsingError> {
    Ok(number(value)?.max(0) as u64)
}

/// A duration between two server times in microseconds, zero if negative.
pub(crate) fn span(from: i64, to: i64) -> Duration {
    Duration::from_micros(to.saturating_sub(from).max(0) as u64)
}

impl FromRedisValue for StatsReply {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        let parts = parts(value)?;
        if parts.len() < 12 {
            return Err(format!("short stats reply: {} fields", parts.len()).into());
        }
        let now = number(&parts[0])?;
        let leases = parts_ref(&parts[9])?
            .chunks(4)
            .map(|c| match c {
                [item, since, deadline, token] => Ok(InFlight {
                    item: text(item)?,
                    age: span(number(since)?, now),
                    expires_in: span(now, number(deadline)?),
                    token: count(token)?,
                }),
                _ => Err(ParsingError::from("a partial in-flight entry".to_owned())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut failures = parts_ref(&parts[10])?
            .chunks(2)
            .map(|c| match c {
                [item, n] => Ok((text(item)?, count(n)?)),
                _ => Err(ParsingError::from("a partial failure entry".to_owned())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        failures.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let next = number(&parts[11])?;
        let depth = count(&parts[1])? as usize;
        let dirty = count(&parts[4])? as usize;
        Ok(StatsReply(Stats {
            depth,
            delayed: count(&parts[2])? as usize,
            in_flight: count(&parts[3])? as usize,
            in_flight_dirty: dirty.saturating_sub(depth),
            failing: count(&parts[5])? as usize,
            stalled: count(&parts[6])? as usize,
            dead: count(&parts[7])? as usize,
            dead_dropped: parts.get(12).map(count).transpose()?.unwrap_or(0),
            shut_down: number(&parts[8])? == 1,
            next_delayed_in: (next >= 0).then(|| span(now, next)),
            leases,
            failures,
        }))
    }
}

/// The parts of a nested array reply.
pub(crate) fn parts_ref(value: &Value) -> Result<&[Value], ParsingError> {
    match value {
        Value::Array(values) => Ok(values),
        other => Err(format!("expected an array, got {other:?}").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_replies_are_protocol_errors() {
        let bad = [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(9)]),
            Value::Array(vec![Value::BulkString(b"x".to_vec())]),
        ];
        for value in bad {
            assert!(matches!(
                parse::<AddReply>("add", value.clone()),
                Err(Error::Protocol(_))
            ));
            assert!(matches!(
                parse::<GetReply>("get", value),
                Err(Error::Protocol(_))
            ));
        }
        let huge = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"\"x\"".to_vec()),
            Value::Int(7),
            Value::Int(i64::from(i32::MAX) + 1),
        ]);
        assert!(matches!(
            parse::<GetReply>("get", huge),
            Err(Error::Protocol(_))
        ));
        assert!(matches!(
            parse::<DoneReply>("done", Value::Nil),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn well_formed_replies_are_read() {
        let added: AddReply = parse(
            "add",
            Value::Array(vec![Value::Int(4), Value::Int(12), Value::Int(1500)]),
        )
        .unwrap();
        assert_eq!(
            (added.kind, added.seq, added.delay),
            (AddKind::Delayed, 12, Some(Duration::from_micros(1500)))
        );
        let leased: GetReply = parse(
            "get",
            Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"\"x\"".to_vec()),
                Value::BulkString(b"42".to_vec()),
                Value::Int(-3),
            ]),
        )
        .unwrap();
        assert!(matches!(
            leased,
            GetReply::Leased { ref raw, token: 42, priority: -3 } if raw == b"\"x\""
        ));
        let empty: GetReply =
            parse("get", Value::Array(vec![Value::Int(0), Value::Int(-1)])).unwrap();
        assert!(matches!(empty, GetReply::Empty(None)));
        assert!(parse::<DoneReply>("done", Value::Int(2)).unwrap().0);
        assert!(!parse::<DoneReply>("done", Value::Int(-1)).unwrap().0);
    }
}
