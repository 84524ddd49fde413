//! Trace links across the queue (feature `otel`): the span that added an item and the span
//! that processed it show up linked.
//!
//! An add records the OpenTelemetry context of the current `tracing` span (through
//! `tracing-opentelemetry`, or the current OpenTelemetry context when the span carries
//! none) with the item. When [`Workers`](crate::Workers) hand the item out, its
//! `workqueue.item` span is created with a *link* to each recorded context, and the handler
//! runs inside that span.
//!
//! Links rather than a parent: an item added by many events (the queue deduplicates them) is
//! processed once, so its processing has many causes and no single parent, and the
//! processing starts a trace of its own, as OpenTelemetry's messaging conventions do for
//! batch consumers.
//!
//! # Bounded
//!
//! An item keeps at most [`MAX_LINKS`] links: the first adds since it was last handed out.
//! The adds deduplicated after those record nothing and are counted
//! ([`Lease::links_dropped`](crate::Lease::links_dropped)); the worker's span then has the
//! attribute `workqueue.links_dropped`. A hot item added ten thousand times while it waits
//! costs four links, not ten thousand. Adds while the item is being processed are recorded
//! for its next hand-out; a retry is an add too, so the next attempt links to the span of
//! the attempt that failed. A lease released without processing
//! ([`QueueLease::release`](crate::QueueLease::release)) gives its links back to the item,
//! in front of those of adds made meanwhile.
//!
//! An add with no recording span (no `tracing-opentelemetry` layer, or a span that is not
//! recorded) records nothing and costs the lookup of the current span.
//!
//! # The stored form
//!
//! A link is stored and sent as a W3C Trace Context `traceparent` string
//! ([`TraceLink::traceparent`], [`TraceLink::from_traceparent`]):
//! `00-<trace id, 32 hex>-<span id, 16 hex>-<flags, 2 hex>`, 55 bytes. That is what a
//! backend shared by many processes keeps beside the item, so an add in one process and the
//! processing in another are linked. The `tracestate` of the adding span is not kept (it is
//! vendor data of unbounded size, and a link needs only the ids).
//!
//! # Backends
//!
//! [`WorkQueue`](crate::WorkQueue) keeps the links in memory. A backend shared by many
//! processes keeps them beside the item on its server and hands them out through
//! [`QueueLease::links`](crate::QueueLease::links), so that an add in one process and the
//! processing in another are linked: `workq-redis` does (its feature `otel`). The trait's
//! default is none: a backend that does not store them yet (`workq-postgres`, for now) hands
//! out no links, and its workers' spans are unlinked as before. The design of their storage
//! is in the repository's `docs/tracing.md`.
//!
//! # Example
//!
//! ```
//! use workq::WorkQueue;
//! use workq::otel::TraceLink;
//!
//! let queue = WorkQueue::new();
//! queue.add("default/web-0"); // no OpenTelemetry layer here: nothing recorded
//! let lease = queue.try_get().unwrap();
//! assert!(lease.links().is_empty());
//!
//! let link: TraceLink = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap();
//! assert_eq!(link.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
//! assert!(link.is_sampled());
//! assert_eq!(
//!     link.traceparent(),
//!     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
//! );
//! ```

use std::fmt;
use std::str::FromStr;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The most links an item keeps between two hand-outs: the first adds are kept, later
/// deduplicated adds are counted and dropped.
pub const MAX_LINKS: usize = 4;

/// The trace context of one add: the ids of the span that added the item, and its flags.
///
/// Its text form (`Display`, [`FromStr`]) is the W3C `traceparent` header.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceLink {
    trace_id: TraceId,
    span_id: SpanId,
    flags: TraceFlags,
}

impl TraceLink {
    /// The context of the current span: the current `tracing` span's OpenTelemetry context
    /// (`tracing-opentelemetry`), or else OpenTelemetry's current context. `None` when
    /// neither has a valid span context (no layer, no span, or a span that is not recorded).
    #[must_use]
    pub fn current() -> Option<Self> {
        let from_tracing = tracing::Span::current().context();
        Self::from_span_context(from_tracing.span().span_context()).or_else(|| {
            opentelemetry::Context::map_current(|cx| {
                Self::from_span_context(cx.span().span_context())
            })
        })
    }

    /// The link to the span `context` names; `None` if the context is invalid (all-zero
    /// ids).
    #[must_use]
    pub fn from_span_context(context: &SpanContext) -> Option<Self> {
        context.is_valid().then(|| Self {
            trace_id: context.trace_id(),
            span_id: context.span_id(),
            flags: context.trace_flags(),
        })
    }

    /// The span context to link to: remote (it was recorded elsewhere, possibly in another
    /// process), with an empty trace state.
    #[must_use]
    pub fn span_context(&self) -> SpanContext {
        SpanContext::new(
            self.trace_id,
            self.span_id,
            self.flags,
            true,
            TraceState::default(),
        )
    }

    /// The trace the adding span belongs to.
    #[must_use]
    pub fn trace_id(&self) -> TraceId {
        self.trace_id
    }

    /// The adding span.
    #[must_use]
    pub fn span_id(&self) -> SpanId {
        self.span_id
    }

    /// The trace flags of the adding span.
    #[must_use]
    pub fn flags(&self) -> TraceFlags {
        self.flags
    }

    /// Whether the adding span was sampled (its trace is exported).
    #[must_use]
    pub fn is_sampled(&self) -> bool {
        self.flags.is_sampled()
    }

    /// The W3C `traceparent` form: `00-<trace id>-<span id>-<flags>`, lowercase hex, 55
    /// bytes.
    #[must_use]
    pub fn traceparent(&self) -> String {
        self.to_string()
    }

    /// Parses a W3C `traceparent` (Trace Context level 1, and the first four fields of a
    /// later version, as the recommendation asks of a parser that knows version `00`).
    ///
    /// # Errors
    ///
    /// [`ParseTraceparentError`] if the text is not a valid `traceparent`: wrong length or
    /// separators, uppercase or non-hex digits, version `ff`, or an all-zero trace or span
    /// id.
    pub fn from_traceparent(text: &str) -> Result<Self, ParseTraceparentError> {
        // Hand-written rather than through `opentelemetry_sdk`'s `TraceContextPropagator`:
        // that lives in the SDK, which the application chooses and a library should not pull
        // in, and it works on header maps; the format is four fixed-width fields.
        let invalid = |reason| ParseTraceparentError { reason };
        // ASCII first: the fields below are sliced at byte offsets.
        if !text.is_ascii() {
            return Err(invalid("not ASCII"));
        }
        let bytes = text.as_bytes();
        if bytes.len() < TRACEPARENT_LEN {
            return Err(invalid("shorter than 55 bytes"));
        }
        let version = &text[..2];
        if !is_lower_hex(version) {
            return Err(invalid("the version is not two lowercase hex digits"));
        }
        if version == "ff" {
            return Err(invalid("version ff is invalid"));
        }
        // Version 00 is exactly 55 bytes; a later version may append fields after a dash.
        if bytes.len() > TRACEPARENT_LEN && (version == "00" || bytes[TRACEPARENT_LEN] != b'-') {
            return Err(invalid("unexpected text after the flags"));
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return Err(invalid("the fields are not separated by dashes"));
        }
        let (trace, span, flags) = (&text[3..35], &text[36..52], &text[53..55]);
        if !(is_lower_hex(trace) && is_lower_hex(span) && is_lower_hex(flags)) {
            return Err(invalid("an id or the flags are not lowercase hex"));
        }
        let trace_id = TraceId::from_hex(trace).map_err(|_| invalid("bad trace id"))?;
        let span_id = SpanId::from_hex(span).map_err(|_| invalid("bad span id"))?;
        let flags = u8::from_str_radix(flags, 16).map_err(|_| invalid("bad flags"))?;
        if trace_id == TraceId::INVALID {
            return Err(invalid("the trace id is all zeros"));
        }
        if span_id == SpanId::INVALID {
            return Err(invalid("the span id is all zeros"));
        }
        Ok(Self {
            trace_id,
            span_id,
            flags: TraceFlags::new(flags),
        })
    }
}

/// The length of a version `00` `traceparent`.
const TRACEPARENT_LEN: usize = 55;

/// Whether `text` is lowercase hex digits only (`from_hex` also takes uppercase, which the
/// W3C format forbids).
fn is_lower_hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl fmt::Display for TraceLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id,
            self.span_id,
            self.flags.to_u8()
        )
    }
}

impl fmt::Debug for TraceLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TraceLink").field(&self.to_string()).finish()
    }
}

impl FromStr for TraceLink {
    type Err = ParseTraceparentError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::from_traceparent(text)
    }
}

/// A text that is not a valid W3C `traceparent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseTraceparentError {
    reason: &'static str,
}

impl fmt::Display for ParseTraceparentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid traceparent: {}", self.reason)
    }
}

impl std::error::Error for ParseTraceparentError {}

/// The links an item keeps until it is handed out: the first [`MAX_LINKS`] adds, and how
/// many were dropped after those.
#[derive(Debug, Default, Clone)]
pub(crate) struct Links {
    pub(crate) list: Vec<TraceLink>,
    pub(crate) dropped: u32,
}

impl Links {
    /// Records `link` in `links` (allocated on the first link, so an item added with no
    /// trace context costs a null pointer).
    pub(crate) fn record(links: &mut Option<Box<Links>>, link: TraceLink) {
        let links = links.get_or_insert_with(|| {
            Box::new(Links {
                list: Vec::with_capacity(MAX_LINKS),
                dropped: 0,
            })
        });
        if links.list.len() < MAX_LINKS {
            links.list.push(link);
        } else {
            links.dropped = links.dropped.saturating_add(1);
        }
    }
}

impl Links {
    /// Appends `since` (the links of adds made while a lease was out) to these links, the
    /// ones the lease took: the first [`MAX_LINKS`] are kept, the rest counted.
    pub(crate) fn restore(&mut self, since: Option<Box<Links>>) {
        if let Some(since) = since {
            let room = MAX_LINKS.saturating_sub(self.list.len());
            let over = since.list.len().saturating_sub(room);
            self.list.extend(since.list.iter().take(room));
            let over = u32::try_from(over).unwrap_or(u32::MAX);
            self.dropped = self
                .dropped
                .saturating_add(since.dropped)
                .saturating_add(over);
        }
    }
}

/// Links the span an item is processed in to the adds the item's lease carries, and notes
/// how many were dropped.
pub(crate) fn link_span(span: &tracing::Span, links: &[TraceLink], dropped: u32) {
    for link in links {
        span.add_link(link.span_context());
    }
    if dropped > 0 {
        span.set_attribute("workqueue.links_dropped", i64::from(dropped));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_round_trips() {
        let link: TraceLink = EXAMPLE.parse().unwrap();
        assert_eq!(link.traceparent(), EXAMPLE);
        assert_eq!(link.span_id().to_string(), "00f067aa0ba902b7");
        assert!(link.is_sampled());
        let unsampled: TraceLink = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
            .parse()
            .unwrap();
        assert!(!unsampled.is_sampled());
        let context = link.span_context();
        assert!(context.is_remote() && context.is_valid());
        assert_eq!(TraceLink::from_span_context(&context), Some(link));
        assert_eq!(TraceLink::from_span_context(&SpanContext::NONE), None);
    }

    #[test]
    fn a_later_version_parses_its_first_fields() {
        let link: TraceLink = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"
            .parse()
            .unwrap();
        assert_eq!(link.traceparent(), EXAMPLE);
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        for bad in [
            "",
            "00",
            &EXAMPLE[..54],
            &format!("{EXAMPLE}-"),
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\u{e9}",
            "0\u{e9}4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473\u{e9}00f067aa0ba902b7-01",
        ] {
            let error = bad.parse::<TraceLink>().expect_err(bad);
            assert!(error.to_string().starts_with("invalid traceparent: "));
        }
    }

    #[test]
    fn an_item_keeps_the_first_links_and_counts_the_rest() {
        let mut links = None;
        let link: TraceLink = EXAMPLE.parse().unwrap();
        for _ in 0..MAX_LINKS + 3 {
            Links::record(&mut links, link);
        }
        let links = links.unwrap();
        assert_eq!((links.list.len(), links.dropped), (MAX_LINKS, 3));
    }

    #[test]
    fn restored_links_go_in_front_and_stay_bounded() {
        let link = |n: u64| TraceLink {
            trace_id: TraceId::from(1),
            span_id: SpanId::from(n),
            flags: TraceFlags::SAMPLED,
        };
        let mut taken = None;
        for n in 1..=3 {
            Links::record(&mut taken, link(n));
        }
        let mut since = None;
        for n in 10..=12 {
            Links::record(&mut since, link(n));
        }
        let mut restored = taken.unwrap();
        restored.restore(since);
        let spans: Vec<_> = restored.list.iter().map(|l| l.span_id()).collect();
        assert_eq!(spans, [1, 2, 3, 10].map(SpanId::from));
        assert_eq!(restored.dropped, 2);
    }
}
