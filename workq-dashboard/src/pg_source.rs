//! Queues on PostgreSQL: [`PgSource`], the dashboard's view of `workq-postgres`'s
//! [`PgAdmin`], which holds the backend's policy (its small lazy pool, the statement timeout,
//! error mapping, settings warnings, capped counts). This file only turns the operator
//! contract's types into the dashboard's views; it goes once the dashboard serves
//! [`workq::admin::Admin`] directly.

use std::time::Duration;

use workq::admin::{self, Admin, AdminError};
use workq_postgres::PgAdmin;

use crate::source::{
    Action, DeadLetterView, End, ItemDetail, ItemPage, ItemState, ItemView, LeaseView, Outcome,
    PageRequest, QueueView, Source, SourceError, SourceStatus,
};

/// How the source's connections are named in `pg_stat_activity`.
const APPLICATION_NAME: &str = "wq-dashboard";

/// Every queue in one PostgreSQL database (the tables of `workq-postgres`, schema version
/// [`workq_postgres::SCHEMA_VERSION`]), with actions: a [`PgAdmin`] whose connections are
/// named `wq-dashboard`.
///
/// ```no_run
/// use workq_dashboard::{Config, Dashboard, PgSource, RedisSource};
///
/// # async fn run() -> Result<(), workq_dashboard::SourceError> {
/// let app = Dashboard::new(Config::default())
///     .source(RedisSource::new("redis://127.0.0.1/", "wq")?)
///     .source(PgSource::new("postgres://ops@127.0.0.1/app")?)
///     .router()
///     .expect("a valid configuration");
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PgSource {
    admin: PgAdmin,
}

impl PgSource {
    /// The most server connections the source holds, whatever the number of queues.
    pub const MAX_CONNECTIONS: u32 = PgAdmin::MAX_CONNECTIONS;

    /// The queues in the database at `url` (`postgres://user:password@host:port/database`,
    /// `?sslmode=require` for TLS when `workq-postgres` has its feature `tls`). Does not
    /// connect yet: a server that is down shows as down on the page until it is up. The
    /// source's role needs the privileges of `workq-postgres`'s operator role; it never
    /// changes the schema or creates a queue.
    ///
    /// # Errors
    ///
    /// A URL that does not parse (the message holds no password).
    pub fn new(url: &str) -> Result<Self, SourceError> {
        let admin = PgAdmin::new(url)
            .map_err(|e| SourceError::BadRequest(e.to_string()))?
            .application_name(APPLICATION_NAME)
            // The views have no field that says a count stopped at a cap, so they keep
            // exact counts until the dashboard serves the contract's types (`capped_at`).
            .count_cap(None);
        Ok(PgSource { admin })
    }

    /// How long the server may run one statement of the source before it cancels it
    /// (`statement_timeout`, set on each of the source's connections; 10 s unless set; at
    /// least a millisecond). Giving up on an answer does not stop a query on the server:
    /// this does, so a slow listing or a search stuck behind a lock holds no connection and
    /// no lock after the page has moved on.
    #[must_use]
    pub fn statement_timeout(self, timeout: Duration) -> Self {
        PgSource {
            admin: self.admin.statement_timeout(timeout),
        }
    }
}

fn error(e: AdminError) -> SourceError {
    match e {
        AdminError::NotFound => SourceError::NotFound,
        AdminError::Unsupported => SourceError::Unsupported,
        AdminError::BadRequest(m) => SourceError::BadRequest(m),
        AdminError::Unavailable(m) => SourceError::Unavailable(m),
        AdminError::ShutDown => SourceError::Backend("the queue is shut down".to_owned()),
        other => SourceError::Backend(other.to_string()),
    }
}

/// A count as the views hold it.
fn n(count: u64) -> usize {
    usize::try_from(count).unwrap_or(usize::MAX)
}

fn view(s: admin::QueueSummary) -> QueueView {
    QueueView {
        broken: s.broken,
        depth: n(s.depth),
        delayed: n(s.delayed),
        in_flight: n(s.in_flight),
        failing: n(s.failing),
        failures: s.failures,
        stalled: n(s.stalled),
        dead: n(s.dead),
        dead_dropped: s.dead_dropped,
        paused: s.paused,
        shut_down: s.shut_down,
        longest_running_s: s.longest_lease.as_secs_f64(),
        unfinished_work_s: s.lease_age_sum.as_secs_f64(),
        // PostgreSQL keeps no running counts of adds, completions or retries.
        adds_total: None,
        completions_total: None,
        retries_total: None,
        ..QueueView::named(s.name)
    }
}

fn letter(d: &admin::DeadLetter) -> DeadLetterView {
    let at_ms =
        d.at.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |at| u64::try_from(at.as_millis()).unwrap_or(u64::MAX));
    DeadLetterView {
        id: d.id.clone(),
        item: d.item.clone(),
        error: d.error.clone(),
        at_ms,
        stalls: u64::from(d.stalls),
        failures: u64::from(d.failures),
    }
}

fn lease(l: &admin::LeaseInfo) -> LeaseView {
    LeaseView {
        age_s: l.age.as_secs_f64(),
        expires_in_s: l.expires_in.as_secs_f64(),
        token: l.token,
        holder: l.holder.clone(),
    }
}

fn state_arg(state: ItemState) -> admin::ItemState {
    match state {
        ItemState::Ready => admin::ItemState::Ready,
        ItemState::Delayed => admin::ItemState::Delayed,
        ItemState::InFlight => admin::ItemState::InFlight,
        ItemState::Failing => admin::ItemState::Failing,
        ItemState::Dead => admin::ItemState::Dead,
    }
}

fn state_of(state: admin::ItemState) -> Option<ItemState> {
    match state {
        admin::ItemState::Ready => Some(ItemState::Ready),
        admin::ItemState::Delayed => Some(ItemState::Delayed),
        admin::ItemState::InFlight => Some(ItemState::InFlight),
        admin::ItemState::Failing => Some(ItemState::Failing),
        admin::ItemState::Dead => Some(ItemState::Dead),
        _ => None,
    }
}

fn action(action: &Action) -> admin::Action {
    match action.clone() {
        Action::Pause => admin::Action::Pause,
        Action::Resume => admin::Action::Resume,
        Action::RequeueDeadLetters => admin::Action::RequeueDeadLetters,
        Action::PurgeDeadLetters => admin::Action::PurgeDeadLetters,
        Action::RequeueDeadLetter { id } => admin::Action::RequeueDeadLetter { id },
        Action::DeleteDeadLetter { id } => admin::Action::DeleteDeadLetter { id },
        Action::RetryNow { item } => admin::Action::RetryNow { item },
        Action::Remove { item } => admin::Action::Remove { item },
        Action::Forget { item } => admin::Action::Forget { item },
    }
}

impl Source for PgSource {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn has_actions(&self) -> bool {
        true
    }

    fn has_items(&self) -> bool {
        true
    }

    async fn status(&self) -> SourceStatus {
        let status = self.admin.status();
        SourceStatus {
            up: status.up,
            error: None,
            server: status.server,
            warnings: status.warnings,
        }
    }

    async fn queues(&self) -> Result<Vec<QueueView>, SourceError> {
        let all = Admin::queues(&self.admin).await.map_err(error)?;
        Ok(all.into_iter().map(view).collect())
    }

    async fn queue(&self, name: &str) -> Result<QueueView, SourceError> {
        Admin::summary(&self.admin, name)
            .await
            .map(view)
            .map_err(error)
    }

    async fn items(&self, name: &str, request: &PageRequest) -> Result<ItemPage, SourceError> {
        let from = match request.from {
            End::First => admin::End::First,
            End::Last => admin::End::Last,
        };
        let query = admin::PageQuery::new(state_arg(request.state), request.limit)
            .from(from)
            .cursor(request.cursor.clone())
            .search(request.search.clone());
        let page = self.admin.page(name, &query).await.map_err(error)?;
        let items = page
            .items
            .into_iter()
            .map(|i| ItemView {
                priority: i.priority,
                due_in_s: i.due_in.map(|d| d.as_secs_f64()),
                lease: i.lease.as_ref().map(lease),
                failures: i.failures.map(u64::from),
                dead: i.dead.as_ref().map(letter),
                ..ItemView::new(i.item, request.state)
            })
            .collect();
        // Keyset cursors go forward only; the page keeps the cursors it came through.
        Ok(ItemPage {
            items,
            total: page.total,
            next: page.next,
            prev: None,
        })
    }

    async fn item(&self, name: &str, item: &str) -> Result<ItemDetail, SourceError> {
        let Some(d) = self.admin.item_detail(name, item).await.map_err(error)? else {
            return Err(SourceError::NotFound);
        };
        Ok(ItemDetail {
            item: d.item.clone(),
            states: d.states.iter().copied().filter_map(state_of).collect(),
            priority: d.priority,
            position: d.position,
            due_in_s: d.due_in.map(|d| d.as_secs_f64()),
            lease: d.lease.as_ref().map(lease),
            readded: d.readded,
            failures: u64::from(d.failures),
            stalls: u64::from(d.stalls),
            dead_letters: d.dead_letters.iter().map(letter).collect(),
        })
    }

    async fn act(&self, name: &str, act: &Action) -> Result<Outcome, SourceError> {
        let done = admin::act(&self.admin, name, &action(act))
            .await
            .map_err(error)?;
        Ok(Outcome::new(done.changed, done.message))
    }
}
