//! What `PgAdmin` adds to the admin suite's rules (`admin_contract.rs`): counts capped and
//! said to be, a requeue refused while the queue is shut down, a server that goes down and
//! comes back, and no password in what it answers.

mod support;

use std::time::{Duration, Instant};

use support::{PgServer, unique};
use workq::admin::{Admin, AdminError, End, ItemState, PageQuery};
use workq_postgres::{PgAdmin, PgQueue};

async fn queue(server: &PgServer, name: &str) -> PgQueue<String> {
    PgQueue::builder(name)
        .url(server.url())
        .lease_duration(Duration::from_secs(30))
        .build()
        .await
        .expect("connect to the test server")
}

/// Over the cap, a count stops at the cap and one more and says so: `summary`, `queues`,
/// `stats` and a page's total; at or under the cap, a count is exact. Without a cap every
/// count is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_over_the_cap_are_answered_as_capped() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("capped");
    let q = queue(&server, &name).await;
    q.add_all((0..12).map(|i| format!("ready-{i}")))
        .await
        .unwrap();
    q.add_all_after((0..5).map(|i| (format!("later-{i}"), Duration::from_secs(3600))))
        .await
        .unwrap();
    let admin = PgAdmin::new(&server.url()).unwrap().count_cap(Some(5));

    let summary = Admin::summary(&admin, &name).await.unwrap();
    assert_eq!(summary.capped_at, Some(5));
    assert_eq!(
        summary.depth, 6,
        "12 ready: counted to the cap and one more"
    );
    assert!(summary.is_capped(summary.depth), "shown as 5+");
    assert_eq!(summary.delayed, 5, "exactly the cap: exact");
    assert!(!summary.is_capped(summary.delayed));
    let listed = Admin::queues(&admin).await.unwrap();
    let listed = listed.iter().find(|s| s.name == name).unwrap();
    assert_eq!(
        (listed.depth, listed.delayed, listed.capped_at),
        (6, 5, Some(5))
    );
    let stats = admin.stats(&name, 10).await.unwrap();
    assert_eq!((stats.summary.depth, stats.summary.capped_at), (6, Some(5)));

    let page = admin
        .page(&name, &PageQuery::new(ItemState::Ready, 100))
        .await
        .unwrap();
    assert_eq!(page.items.len(), 12, "the page lists every item asked for");
    assert_eq!((page.total, page.capped_at), (6, Some(5)));
    assert!(page.total_is_capped());

    // The default cap is far above these figures; without a cap, every count is exact.
    let exact = PgAdmin::new(&server.url()).unwrap().count_cap(None);
    let summary = Admin::summary(&exact, &name).await.unwrap();
    assert_eq!(
        (summary.depth, summary.delayed, summary.capped_at),
        (12, 5, None)
    );
    let page = exact
        .page(&name, &PageQuery::new(ItemState::Ready, 1))
        .await
        .unwrap();
    assert_eq!((page.total, page.capped_at), (12, None));
    let default = PgAdmin::new(&server.url()).unwrap();
    let summary = Admin::summary(&default, &name).await.unwrap();
    assert_eq!(
        (summary.depth, summary.capped_at),
        (12, Some(PgAdmin::DEFAULT_COUNT_CAP))
    );
    assert!(!summary.is_capped(summary.depth));
}

/// A requeue of dead letters while the queue is shut down for every process is refused
/// with `ShutDown`, and the letters stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeue_refused_while_shut_down_answers_shut_down() {
    let Some(server) = PgServer::start() else {
        return;
    };
    let name = unique("shut");
    let strings = queue(&server, &name).await;
    let any: PgQueue<serde_json::Value> = PgQueue::builder(name.as_str())
        .url(server.url())
        .build()
        .await
        .unwrap();
    any.add(serde_json::json!({"poison": 1})).await.unwrap();
    assert!(strings.try_get().await.unwrap().into_lease().is_none());
    let admin = PgAdmin::new(&server.url()).unwrap();
    let letters = admin.dead_letters(&name, End::First, 10).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(admin.shut_down_fleet(&name).await, Ok(true));
    assert_eq!(
        admin.requeue_dead_letters(&name).await,
        Err(AdminError::ShutDown)
    );
    assert_eq!(
        admin.requeue_dead_letter_by_id(&name, &letters[0].id).await,
        Err(AdminError::ShutDown)
    );
    assert_eq!(Admin::summary(&admin, &name).await.unwrap().dead, 1);
    let outcome = workq::admin::act(&admin, &name, &workq::admin::Action::RequeueDeadLetters)
        .await
        .unwrap();
    assert_eq!(outcome.changed, 0);
    assert!(outcome.message.contains("shut down"), "{}", outcome.message);
    assert_eq!(admin.resume_fleet(&name).await, Ok(true));
    assert_eq!(admin.requeue_dead_letters(&name).await, Ok(1));
    // A dead-letter id that is not one is a bad request.
    assert!(matches!(
        admin.delete_dead_letter_by_id(&name, "twelve").await,
        Err(AdminError::BadRequest(_))
    ));
}

/// A server that goes down reads as unavailable within seconds (no password in the
/// message), and the admin answers again by itself once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_is_unavailable_and_the_admin_comes_back_with_it() {
    let Some(mut server) = PgServer::start() else {
        return;
    };
    let name = unique("down");
    queue(&server, &name)
        .await
        .add("a".to_owned())
        .await
        .unwrap();
    // The test server trusts local connections, so the password is never checked: it is
    // there to be kept out of every message.
    let url = server
        .url()
        .replace("postgres@", "postgres:hunter2-secret@");
    let admin = PgAdmin::new(&url).unwrap();
    assert!(!admin.status().up, "nothing was asked yet");
    assert!(!admin.status().server.contains("hunter2"));
    assert_eq!(Admin::summary(&admin, &name).await.unwrap().depth, 1);
    assert!(admin.status().up);
    assert_eq!(
        admin.status().details.as_deref(),
        None,
        "read with a listing"
    );
    Admin::queues(&admin).await.unwrap();
    let status = admin.status();
    assert!(
        status
            .details
            .as_deref()
            .is_some_and(|d| d.contains("fsync off")),
        "{status:?}"
    );
    assert!(
        status
            .warnings
            .iter()
            .any(|w| w.starts_with("fsync is off")),
        "the test server runs with fsync off: {status:?}"
    );

    server.kill_with_backends();
    let started = Instant::now();
    let down = Admin::queues(&admin).await;
    assert!(matches!(&down, Err(AdminError::Unavailable(_))), "{down:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert!(!format!("{down:?}").contains("hunter2"), "{down:?}");
    let status = admin.status();
    assert!(!status.up && status.error.is_some(), "{status:?}");
    assert!(!format!("{status:?}").contains("hunter2"), "{status:?}");
    let pause = admin.pause(&name).await;
    assert!(
        matches!(&pause, Err(AdminError::Unavailable(_))),
        "{pause:?}"
    );

    server.restart();
    assert_eq!(Admin::summary(&admin, &name).await.unwrap().depth, 1);
    assert_eq!(admin.pause(&name).await, Ok(true));
    let status = admin.status();
    assert!(status.up && status.error.is_none(), "{status:?}");
}

/// A URL that is not a PostgreSQL URL, or does not parse, is refused at once, without its
/// password in the message.
#[test]
fn a_bad_url_is_refused_without_its_password() {
    let err = PgAdmin::new("redis://user:hunter2@127.0.0.1/").unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(err.to_string().contains("postgres://"), "{err}");
    let err = PgAdmin::new("postgres://user:hunter2@127.0.0.1:notaport/db").unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}
