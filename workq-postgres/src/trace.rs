//! Trace links across processes (feature `otel`): what an add sends (the `traceparent` of
//! the span it is made in) and what a hand-out reads back (the links of the adds that
//! queued the item). The database keeps them in the item's row (migration
//! `0009_trace_links.sql`, and the repository's `docs/tracing.md`); without the feature the
//! client sends none and reads none.

/// The `traceparent` of the span an add is made in: `None` outside a recorded span, and
/// always without the feature `otel`. An add sends it (through the `_traced` functions) only
/// when there is one, so a call without it is the call of before.
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

/// The two columns a hand-out answers beside its items: per item, the links its lease took
/// (`traceparent`s joined by `,`) and the adds whose links were dropped; NULL for none.
pub(crate) type LinkColumns = (Option<Vec<Option<String>>>, Option<Vec<Option<i32>>>);

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

impl LeaseLinks {
    /// The links of the `i`-th item a hand-out answered in `columns`. A value that does not
    /// parse as a `traceparent` is dropped (the functions store only well-formed ones; a row
    /// written by hand may hold anything), and more than
    /// [`MAX_LINKS`](workq::otel::MAX_LINKS) are not kept.
    #[cfg(feature = "otel")]
    pub(crate) fn read(columns: &LinkColumns, i: usize) -> Self {
        use workq::otel::{MAX_LINKS, TraceLink};

        let field = columns
            .0
            .as_ref()
            .and_then(|links| links.get(i))
            .and_then(Option::as_deref)
            .unwrap_or_default();
        let list = field
            .split(',')
            .filter_map(|text| TraceLink::from_traceparent(text).ok())
            .take(MAX_LINKS)
            .collect();
        let dropped = columns
            .1
            .as_ref()
            .and_then(|drops| drops.get(i).copied().flatten())
            .unwrap_or(0);
        LeaseLinks {
            list,
            dropped: u32::try_from(dropped).unwrap_or(0),
        }
    }

    /// Without the feature `otel`: the links of a hand-out are not read.
    #[cfg(not(feature = "otel"))]
    pub(crate) fn read(_columns: &LinkColumns, _i: usize) -> Self {
        LeaseLinks {}
    }
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    use super::*;

    const A: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const B: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b8-00";

    fn texts(links: &LeaseLinks) -> Vec<String> {
        links.list.iter().map(|l| l.traceparent()).collect()
    }

    #[test]
    fn a_column_reads_as_each_items_links_in_order() {
        let columns: LinkColumns = (
            Some(vec![None, Some(format!("{A},{B}"))]),
            Some(vec![None, Some(3)]),
        );
        let first = LeaseLinks::read(&columns, 0);
        assert!(first.list.is_empty() && first.dropped == 0);
        let second = LeaseLinks::read(&columns, 1);
        assert_eq!(texts(&second), [A, B]);
        assert_eq!(second.dropped, 3);
        let none = LeaseLinks::read(&(None, None), 0);
        assert!(none.list.is_empty() && none.dropped == 0);
    }

    #[test]
    fn what_does_not_parse_is_dropped_and_at_most_four_are_kept() {
        let upper = A.to_uppercase();
        let field = format!("{A},{upper},not a traceparent,,{B}");
        let links = LeaseLinks::read(&(Some(vec![Some(field)]), Some(vec![Some(-1)])), 0);
        assert_eq!(texts(&links), [A, B]);
        assert_eq!(links.dropped, 0);
        let six = [A; 6].join(",");
        assert_eq!(
            LeaseLinks::read(&(Some(vec![Some(six)]), None), 0)
                .list
                .len(),
            4
        );
    }
}
