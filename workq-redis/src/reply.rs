//! The readers script replies are made of: each reply type is read beside the call that gets
//! it (`AddReply` in `add.rs`, `GetReply` and `DoneReply` in `get.rs`, `StatsReply` in
//! `stats.rs`, ...) as a [`redis::FromRedisValue`], out of these parts, and [`parse`] makes a
//! reply of any other shape one [`Error::Protocol`] naming the operation.

use std::time::Duration;

use redis::{FromRedisValue, ParsingError, Value};

use crate::error::Error;

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

/// The parts of a nested array reply.
pub(crate) fn parts_ref(value: &Value) -> Result<&[Value], ParsingError> {
    match value {
        Value::Array(values) => Ok(values),
        other => Err(format!("expected an array, got {other:?}").into()),
    }
}
