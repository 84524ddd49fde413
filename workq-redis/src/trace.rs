//! Trace links across processes (feature `otel`): what an add sends (the `traceparent` of
//! the span it is made in) and what a hand-out reads back (the links of the adds that
//! queued the item). The server keeps them beside the item (see `lua/common.lua` and the
//! repository's `docs/tracing.md`); without the feature the client sends none and reads
//! none.

use redis::{ParsingError, Value};

/// The `traceparent` of the span an add is made in, sent as the add's last argument: `None`
/// (and no argument at all) outside a recorded span, and always without the feature `otel`.
#[cfg(feature = "otel")]
pub(crate) fn traceparent() -> Option<String> {
    workq::otel::TraceLink::current().map(|link| link.traceparent())
}

/// The `traceparent` of the span an add is made in: none without the feature `otel`.
#[cfg(not(feature = "otel"))]
#[inline]
pub(crate) fn traceparent() -> Option<String> {
    None
}

/// The trace links a lease took at its hand-out (feature `otel`; nothing, and no room,
/// without it).
#[derive(Debug, Default, Clone)]
pub(crate) struct LeaseLinks {
    /// The links, first add first: at most [`MAX_LINKS`](workq::otel::MAX_LINKS).
    #[cfg(feature = "otel")]
    pub(crate) list: Box<[workq::otel::TraceLink]>,
    /// The adds whose links were dropped beyond those.
    #[cfg(feature = "otel")]
    pub(crate) dropped: u32,
}

/// The length of a `traceparent` and its separator in the server's field.
#[cfg(feature = "otel")]
const STRIDE: usize = 56;

impl LeaseLinks {
    /// Reads the links part of a hand-out's reply: the field (`traceparent`s of 55 bytes
    /// joined by `,`) and the drops. A value that does not parse as a `traceparent` is
    /// dropped (the server stores only well-formed ones; a hand-written field may hold
    /// anything), and more than [`MAX_LINKS`](workq::otel::MAX_LINKS) are not kept.
    #[cfg(feature = "otel")]
    pub(crate) fn read(field: Option<Value>, dropped: Option<Value>) -> Result<Self, ParsingError> {
        use workq::otel::{MAX_LINKS, TraceLink};

        let field = match field {
            None | Some(Value::Nil) => Vec::new(),
            Some(Value::BulkString(bytes)) => bytes,
            Some(Value::SimpleString(text)) => text.into_bytes(),
            Some(other) => return Err(format!("expected trace links, got {other:?}").into()),
        };
        let list = field
            .chunks(STRIDE)
            .filter_map(|chunk| {
                let text = std::str::from_utf8(chunk.strip_suffix(b",").unwrap_or(chunk)).ok()?;
                TraceLink::from_traceparent(text).ok()
            })
            .take(MAX_LINKS)
            .collect();
        let dropped = dropped
            .map(|value| crate::reply::count(&value))
            .transpose()?
            .unwrap_or(0);
        Ok(LeaseLinks {
            list,
            dropped: u32::try_from(dropped).unwrap_or(u32::MAX),
        })
    }

    /// Without the feature `otel`: the links of a reply are not read.
    #[cfg(not(feature = "otel"))]
    #[allow(
        clippy::unnecessary_wraps,
        clippy::needless_pass_by_value,
        reason = "the same signature as with the feature"
    )]
    pub(crate) fn read(
        _field: Option<Value>,
        _dropped: Option<Value>,
    ) -> Result<Self, ParsingError> {
        Ok(LeaseLinks {})
    }
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use super::*;

    const A: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const B: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b8-00";

    fn bulk(text: &str) -> Option<Value> {
        Some(Value::BulkString(text.as_bytes().to_vec()))
    }

    #[test]
    fn a_field_reads_as_its_links_in_order() {
        let links = LeaseLinks::read(bulk(&format!("{A},{B}")), Some(Value::Int(3))).unwrap();
        let texts: Vec<String> = links.list.iter().map(|l| l.traceparent()).collect();
        assert_eq!(texts, [A, B]);
        assert_eq!(links.dropped, 3);
        let none = LeaseLinks::read(None, None).unwrap();
        assert!(none.list.is_empty() && none.dropped == 0);
    }

    #[test]
    fn what_does_not_parse_is_dropped_and_at_most_four_are_kept() {
        let upper = A.to_uppercase();
        let field = format!("{A},{upper},not a traceparent at all, not even fifty-five bytes,{B}");
        let links = LeaseLinks::read(bulk(&field), None).unwrap();
        let texts: Vec<String> = links.list.iter().map(|l| l.traceparent()).collect();
        assert_eq!(texts, [A]);
        let six = [A; 6].join(",");
        assert_eq!(LeaseLinks::read(bulk(&six), None).unwrap().list.len(), 4);
        assert!(LeaseLinks::read(Some(Value::Int(1)), None).is_err());
    }
}
