//! Every item a worker processes runs inside a `workqueue.item` span carrying the queue's
//! name, the item, its priority and its retries; events the handler emits nest under it.

use std::sync::Arc;

use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use workq::{AddOptions, Outcome, WorkQueue, Workers};

/// What the subscriber saw: each span's name and fields, and for each event the name of
/// the span it happened in.
#[derive(Default)]
struct Seen {
    spans: Vec<(String, Vec<(String, String)>)>,
    events_in: Vec<Option<String>>,
}

/// A minimal subscriber: records spans and which span is entered on each thread.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Seen>>,
}

thread_local! {
    static CURRENT: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct Fields(Vec<(String, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Fields(Vec::new());
        span.record(&mut fields);
        let mut seen = self.seen.lock();
        seen.spans
            .push((span.metadata().name().to_owned(), fields.0));
        Id::from_u64(seen.spans.len() as u64)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {
        let current = CURRENT.with(|c| c.borrow().last().copied());
        let mut seen = self.seen.lock();
        let name = current.map(|id| seen.spans[id as usize - 1].0.clone());
        seen.events_in.push(name);
    }
    fn enter(&self, span: &Id) {
        CURRENT.with(|c| c.borrow_mut().push(span.into_u64()));
    }
    fn exit(&self, _: &Id) {
        CURRENT.with(|c| {
            c.borrow_mut().pop();
        });
    }
}

#[test]
fn each_processed_item_runs_in_a_span_with_its_fields() {
    // Worker threads use the global default subscriber; this test binary holds only this
    // test, so setting it here affects nothing else.
    let recorder = Recorder::default();
    tracing::dispatcher::set_global_default(tracing::Dispatch::new(recorder.clone()))
        .expect("no other subscriber in this test binary");

    let queue: WorkQueue<String> = WorkQueue::builder().name("pods").build();
    queue.add_with(
        "default/web-0".to_owned(),
        AddOptions::default().priority(3),
    );
    queue.add("default/web-1".to_owned());
    let workers = Workers::new(queue.clone()).spawn_threads(|key: &String| {
        tracing::info!(key = %key, "reconciling");
        Outcome::Done
    });
    while queue.processing_len() > 0 || !queue.is_empty() {
        std::thread::yield_now();
    }
    let summary = workers.shut_down();
    assert_eq!((summary.processed, summary.succeeded), (2, 2));

    let seen = recorder.seen.lock();
    let field = |fields: &[(String, String)], key: &str| {
        fields.iter().find(|(k, _)| k == key).map_or_else(
            || panic!("no field {key} in {fields:?}"),
            |(_, v)| v.clone(),
        )
    };
    let mut items: Vec<(String, String, String, String)> = seen
        .spans
        .iter()
        .filter(|(name, _)| name == "workqueue.item")
        .map(|(_, f)| {
            (
                field(f, "item"),
                field(f, "queue"),
                field(f, "priority"),
                field(f, "retries"),
            )
        })
        .collect();
    items.sort();
    let expected = [
        ("\"default/web-0\"", "\"pods\"", "3", "0"),
        ("\"default/web-1\"", "\"pods\"", "0", "0"),
    ]
    .map(|(a, b, c, d)| (a.to_owned(), b.to_owned(), c.to_owned(), d.to_owned()));
    assert_eq!(items, expected);
    // Both handler events happened inside an item's span.
    let inside = seen
        .events_in
        .iter()
        .filter(|span| span.as_deref() == Some("workqueue.item"))
        .count();
    assert_eq!(inside, 2, "events: {:?}", seen.events_in);
}
