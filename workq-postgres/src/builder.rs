//! [`Builder`]: the options of a [`PgQueue`], and the pool it opens; [`PgQueue::builder`] and
//! [`PgQueue::connect`] start here.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use workq::flow::FlowControl;

use crate::error::Error;
use crate::faults::Faults;
use crate::inner::Inner;
use crate::queue::PgQueue;
use crate::units::FOREVER;
use crate::wait::Wakeups;

/// The longest queue name, in bytes (UTF-8).
pub const MAX_NAME_BYTES: usize = 255;

/// The options of a [`PgQueue`]; start with [`PgQueue::builder`].
///
/// # Defaults
///
/// Leases of 30 s renewed every 10 s while held for at most an hour, an item moved to the
/// dead letters after 5 expired leases in a row, at most 10,000 dead letters, client-go's
/// controller rate limiter (5 ms doubling to 1000 s per item, and a bucket of 10 retries a
/// second with a burst of 100), `LISTEN` for wake-ups with blocked getters looking again at
/// least every 2 s, transient failures retried for up to 30 s, the schema installed at build,
/// no flow control.
///
/// # Flow control
///
/// The flow methods ([`group_by`](Self::group_by) and those after it) are the in-memory
/// [`workq::Builder`]'s, with its meanings and checks (they panic where it does), held across
/// every process of the queue: the limits count the leases of every process, and the limits
/// themselves are kept in the database, where the last handle built with settings writes its
/// own; a handle built without any follows the stored ones (see the
/// [crate documentation](crate#flow-control)).
#[must_use]
pub struct Builder<T> {
    name: String,
    url: Option<String>,
    pool: Option<PgPool>,
    max_connections: u32,
    lease: Duration,
    renew_every: Option<Duration>,
    auto_renew: bool,
    base_delay: Duration,
    max_delay: Duration,
    bucket: Option<(f64, u32)>,
    poll: Duration,
    listen: bool,
    migrate: bool,
    create: bool,
    max_stalls: u32,
    max_hold: Duration,
    dead_letter_cap: usize,
    retry_deadline: Duration,
    flow: FlowControl<T>,
    /// Leaves the stored flow settings as they are, neither writing nor comparing them (the
    /// handles of `PgAdmin`).
    leave_flow: bool,
    faults: Faults,
    _item: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Builder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("name", &self.name)
            .field("lease", &self.lease)
            .field("auto_renew", &self.auto_renew)
            .field("listen", &self.listen)
            .field("max_stalls", &self.max_stalls)
            .field("dead_letter_cap", &self.dead_letter_cap)
            .field("flow", &self.flow)
            .finish_non_exhaustive()
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> PgQueue<T> {
    /// Connects to `url` and builds the queue `name` with the defaults.
    ///
    /// # Errors
    ///
    /// As for [`Builder::build`].
    pub async fn connect(url: &str, name: &str) -> Result<Self, Error> {
        Self::builder(name).url(url).build().await
    }

    /// A builder for the queue `name`.
    pub fn builder(name: impl Into<String>) -> Builder<T> {
        Builder::new(name.into())
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Builder<T> {
    /// The defaults (see above), for a queue named `name`.
    pub(crate) fn new(name: String) -> Self {
        Builder {
            name,
            url: None,
            pool: None,
            max_connections: 10,
            lease: Duration::from_secs(30),
            renew_every: None,
            auto_renew: true,
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_secs(1000),
            bucket: Some((10.0, 100)),
            poll: Duration::from_secs(2),
            listen: true,
            migrate: true,
            create: true,
            max_stalls: 5,
            max_hold: Duration::from_secs(3600),
            dead_letter_cap: 10_000,
            retry_deadline: Duration::from_secs(30),
            flow: FlowControl::new(),
            leave_flow: false,
            faults: Faults::default(),
            _item: PhantomData,
        }
    }

    /// The database: `postgres://user:password@host:port/database` (TLS with feature `tls`
    /// and `sslmode=require` or stricter). The queue opens a pool of its own.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The database, as a pool you share with the rest of the application. The queue takes
    /// a connection from it only for the length of a statement (any number of queues share a
    /// pool of any size); its `LISTEN` connection is its own, opened with the pool's connect
    /// options, one per process and database.
    pub fn pool(mut self, pool: PgPool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The size of the pool the queue opens for a [`url`](Self::url). Default 10.
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// How long a lease lasts without renewal (database clock). A worker that dies holding an
    /// item frees it after at most this long. Default 30 s; at least 10 ms. A century or more
    /// (`Duration::MAX`) means leases that never expire: an item a crashed worker held stays
    /// with it until an operator removes it.
    pub fn lease_duration(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often a held lease is renewed. Default a third of the lease duration; it must be
    /// shorter than the lease duration (else [`build`](Self::build) refuses it).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// Whether leases renew themselves while held (default `true`). Without it, call
    /// [`Lease::renew`](crate::Lease::renew) yourself.
    pub fn auto_renew(mut self, auto_renew: bool) -> Self {
        self.auto_renew = auto_renew;
        self
    }

    /// The per-item exponential backoff of rate-limited adds: `base * 2^(failures - 1)`,
    /// capped at `max`. Default 5 ms and 1000 s. A century or more (`Duration::MAX`) means no
    /// cap.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base_delay = base;
        self.max_delay = max;
        self
    }

    /// The queue-wide token bucket of rate-limited adds (`qps` retries a second, `burst` at
    /// once), or `None` for none. Default 10 a second with a burst of 100. A rate so low
    /// that one retry takes a century or more means one retry per century.
    ///
    /// # Panics
    ///
    /// If `qps` is not positive or `burst` is zero.
    pub fn token_bucket(mut self, bucket: Option<(f64, u32)>) -> Self {
        if let Some((qps, burst)) = bucket {
            assert!(
                qps.is_finite() && qps > 0.0,
                "the bucket's rate must be positive"
            );
            assert!(burst > 0, "the bucket's burst must be positive");
        }
        self.bucket = bucket;
        self
    }

    /// The longest a blocked getter waits before it looks at the queue again even without a
    /// wake-up (it costs one query each time), and how often the idle `LISTEN` connection is
    /// checked (at least every 30 s). Expired leases are taken back at least this often (or a
    /// quarter of the lease duration, if shorter). Default 2 s. A century or more
    /// (`Duration::MAX`) means no polling: getters look when woken, or when a delayed item or
    /// a sweep is due.
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Whether getters wake on `LISTEN`/`NOTIFY` (default `true`). Turn it off behind a
    /// connection pooler in transaction mode (PgBouncer), where `LISTEN` does not work: the
    /// getters then find new items by polling every [`poll_interval`](Self::poll_interval).
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// Whether [`build`](Self::build) installs or upgrades the schema (default `true`). Turn it
    /// off where the application's role may not create tables, and run [`PgQueue::migrate`]
    /// once with one that may.
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Whether [`build`](Self::build) creates the queue when the database has none of this
    /// name (default `true`). Operators' tools turn it off, so that a mistyped name is an
    /// error rather than a new, empty queue.
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Moves an item to the dead letters once its lease expired this many times in a row
    /// (its workers died or stalled each time: a poison item). A `done` resets the count; a
    /// released lease does not count. Default 5; 0 means no limit.
    pub fn max_stalls(mut self, max_stalls: u32) -> Self {
        self.max_stalls = max_stalls;
        self
    }

    /// The longest a lease is renewed automatically; after it the lease expires a lease
    /// duration later (and counts as a stall). Default 1 hour. A century or more
    /// (`Duration::MAX`) means no limit: renewed as long as it is held.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// The most dead letters kept per queue; beyond it the oldest are dropped and counted.
    /// Default 10,000; 0 means no cap.
    pub fn dead_letter_cap(mut self, cap: usize) -> Self {
        self.dead_letter_cap = cap;
        self
    }

    /// How long an operation keeps retrying, with backoff, through a lost connection or a
    /// restarting server (or a call the server rolled back: a lock or statement timeout, a
    /// serialization failure, a deadlock) before it returns the error. Default 30 s. A century
    /// or more (`Duration::MAX`) means no limit: retried until it succeeds.
    pub fn retry_deadline(mut self, deadline: Duration) -> Self {
        self.retry_deadline = deadline;
        self
    }

    /// Groups the items by `group` (for example the namespace of a `"namespace/name"` key),
    /// and makes getters take turns between groups: [`workq::Builder::group_by`], across
    /// every process.
    ///
    /// Within the highest priority that has ready work, each hand-out goes to the next group
    /// in turn (round robin; deficit round robin with [`group_weight`](Self::group_weight)),
    /// inside a group in the order its items became ready; priorities stay strict. The
    /// function runs in the adding process at every add (one by one, in batches, in the
    /// caller's transaction, rate-limited, periodic ticks), and the group's name goes with the
    /// add: every process that adds must be built with the same function. An item keeps the
    /// group it was first added with while the queue holds it. Names hold at most
    /// [`MAX_GROUP_BYTES`](crate::MAX_GROUP_BYTES) bytes and no NUL (an add with another is
    /// refused with [`Error::Config`]).
    pub fn group_by<G: Into<String>>(
        mut self,
        group: impl Fn(&T) -> G + Send + Sync + 'static,
    ) -> Self {
        self.flow = self.flow.group_by(group);
        self
    }

    /// Gives the group `group` `weight` turns in a row where the others get one:
    /// [`workq::Builder::group_weight`].
    pub fn group_weight(mut self, group: impl Into<String>, weight: u32) -> Self {
        self.flow = self.flow.group_weight(group, weight);
        self
    }

    /// Hands out at most `limit` items at a time over the whole queue, counting the leases of
    /// every process: [`workq::Builder::max_in_flight`]. A getter held back waits, and wakes
    /// when a lease ends (a `NOTIFY`, no polling); an expired lease frees its slot when it is
    /// taken back.
    ///
    /// # Panics
    ///
    /// If `limit` is 0.
    pub fn max_in_flight(mut self, limit: usize) -> Self {
        self.flow = self.flow.max_in_flight(limit);
        self
    }

    /// Hands out at most `limit` items of one group at a time, counting the leases of every
    /// process: [`workq::Builder::max_in_flight_per_group`]. A ready item of a group at its
    /// limit never holds back another group.
    ///
    /// # Panics
    ///
    /// If `limit` is 0.
    pub fn max_in_flight_per_group(mut self, limit: usize) -> Self {
        self.flow = self.flow.max_in_flight_per_group(limit);
        self
    }

    /// Overrides [`max_in_flight_per_group`](Self::max_in_flight_per_group) for one group.
    ///
    /// # Panics
    ///
    /// If `limit` is 0.
    pub fn group_max_in_flight(mut self, group: impl Into<String>, limit: usize) -> Self {
        self.flow = self.flow.group_max_in_flight(group, limit);
        self
    }

    /// Hands out at most `per_second` items a second over the whole queue, with bursts of up
    /// to `burst`: [`workq::Builder::hand_out_rate`], with one bucket for every process, on
    /// the database's clock. A getter waiting for a token sleeps until it is due.
    ///
    /// # Panics
    ///
    /// If `per_second` is not a positive finite number, or `burst` is 0.
    pub fn hand_out_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.flow = self.flow.hand_out_rate(per_second, burst);
        self
    }

    /// Paces every group as [`hand_out_rate`](Self::hand_out_rate) paces the queue, each with
    /// a bucket of its own: [`workq::Builder::hand_out_rate_per_group`]. A group waiting for
    /// its token leaves the turns to the others.
    ///
    /// # Panics
    ///
    /// As [`hand_out_rate`](Self::hand_out_rate).
    pub fn hand_out_rate_per_group(mut self, per_second: f64, burst: u32) -> Self {
        self.flow = self.flow.hand_out_rate_per_group(per_second, burst);
        self
    }

    /// Overrides [`hand_out_rate_per_group`](Self::hand_out_rate_per_group) for one group.
    ///
    /// # Panics
    ///
    /// As [`hand_out_rate`](Self::hand_out_rate).
    pub fn group_hand_out_rate(
        mut self,
        group: impl Into<String>,
        per_second: f64,
        burst: u32,
    ) -> Self {
        self.flow = self.flow.group_hand_out_rate(group, per_second, burst);
        self
    }

    /// Leaves the stored flow settings alone, not even reading them at build: the handles of
    /// `PgAdmin`, made per operator call.
    pub(crate) fn leave_flow(mut self) -> Self {
        self.leave_flow = true;
        self
    }

    /// Switches on a deliberate bug (see [`Mutation`](crate::Mutation)). It exists only to
    /// prove that the fault tests can fail.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn mutation(mut self, mutation: crate::Mutation) -> Self {
        self.faults.add(mutation);
        self
    }

    /// Connects, installs the schema (unless told not to; then checks it), registers the
    /// queue and starts listening for wake-ups.
    ///
    /// With flow control settings ([`group_by`](Self::group_by), the limits, the rates), it
    /// writes them beside the queue for every process if the stored ones differ (other
    /// settings there are replaced, with a warning); without, it reads the queue's settings
    /// once, and warns when the queue groups its items while this handle cannot (see the
    /// crate docs, "Flow control").
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a name that is empty, longer than [`MAX_NAME_BYTES`] or holds a
    /// control character, no database, a lease under 10 ms, leases renewed no more often than
    /// they last, or (with
    /// [`create(false)`](Self::create)) no queue of this name; [`Error::Migrate`] if the
    /// schema cannot be installed (or, with `migrate(false)`, is missing or of another
    /// version); [`Error::Database`] if the database cannot be reached; [`Error::Listen`] if
    /// the `LISTEN` connection cannot be opened.
    pub async fn build(mut self) -> Result<PgQueue<T>, Error> {
        check_name(&self.name)?;
        self.check_durations()?;
        let pool = match (self.pool, &self.url) {
            (Some(pool), _) => pool,
            (None, Some(url)) => {
                PgPoolOptions::new()
                    .max_connections(self.max_connections)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect(url)
                    .await?
            }
            (None, None) => return Err(Error::Config("no database: give a url or a pool".into())),
        };
        if self.migrate {
            crate::migrate::migrate(&pool).await?;
        } else {
            crate::migrate::check(&pool).await?;
        }
        // The queue's id, and whether it has flow control (the version of its settings).
        let row: Option<(i32, bool, i64)> = if self.create {
            sqlx::query_as(
                "WITH new AS (INSERT INTO workqueue_queues (name) VALUES ($1)
                              ON CONFLICT (name) DO NOTHING RETURNING id, flow, flow_version)
                 SELECT id, flow, flow_version FROM new
                 UNION ALL SELECT id, flow, flow_version FROM workqueue_queues WHERE name = $1
                 LIMIT 1",
            )
            .bind(&self.name)
            .fetch_optional(&pool)
            .await?
        } else {
            sqlx::query_as("SELECT id, flow, flow_version FROM workqueue_queues WHERE name = $1")
                .bind(&self.name)
                .fetch_optional(&pool)
                .await?
        };
        let Some((id, stored_flow, flow_version)) = row else {
            return Err(Error::Config(format!(
                "the database has no queue named {:?}",
                self.name
            )));
        };
        let renew_every = self
            .renew_every
            .unwrap_or(self.lease / 3)
            .max(Duration::from_millis(1));
        let poll = self.poll.max(Duration::from_millis(1));
        let sweep_every = poll.min(self.lease / 4).max(Duration::from_millis(10));
        let wake = Arc::new(Wakeups::default());
        let registration = if self.listen {
            Some(crate::wait::register(&pool, id, &wake, poll).await?)
        } else {
            None
        };
        let inner = Arc::new_cyclic(|me| Inner {
            name: self.name,
            id,
            pool,
            lease: self.lease,
            renew_every,
            auto_renew: self.auto_renew,
            base_delay: self.base_delay,
            max_delay: self.max_delay,
            bucket: self.bucket,
            poll,
            sweep_every,
            // The first get sweeps.
            swept_at: AtomicU64::new(0),
            epoch: Instant::now()
                .checked_sub(sweep_every)
                .unwrap_or_else(Instant::now),
            max_stalls: self.max_stalls,
            max_hold: self.max_hold,
            dead_letter_cap: self.dead_letter_cap,
            retry_deadline: self.retry_deadline,
            faults: self.faults,
            shut: AtomicBool::new(false),
            leases_out: AtomicUsize::new(0),
            wake,
            _registration: registration,
            flow: (!self.leave_flow && self.flow.is_active()).then(|| self.flow.limits().clone()),
            flow_seen: AtomicI64::new(flow_version),
            renewing: Mutex::new(HashMap::new()),
            me: me.clone(),
        });
        inner
            .sync_flow(stored_flow, flow_version, !self.leave_flow)
            .await?;
        Ok(PgQueue {
            inner,
            group: self.flow.group_fn().cloned(),
            _item: PhantomData,
        })
    }
}

impl<T> Builder<T> {
    /// Takes every duration past [`FOREVER`] (a century) as "no limit", which is what it is
    /// capped at, and refuses the combinations that cannot work, naming the setting: a lease
    /// under 10 ms, a renewal interval as long as the lease (leases would expire while held).
    fn check_durations(&mut self) -> Result<(), Error> {
        for setting in [
            &mut self.lease,
            &mut self.base_delay,
            &mut self.max_delay,
            &mut self.poll,
            &mut self.max_hold,
            &mut self.retry_deadline,
        ] {
            *setting = (*setting).min(FOREVER);
        }
        if let Some(every) = self.renew_every.as_mut() {
            *every = (*every).min(FOREVER);
        }
        if self.lease < Duration::from_millis(10) {
            return Err(Error::Config(format!(
                "lease_duration: the lease must last at least 10 ms, not {:?}",
                self.lease
            )));
        }
        if let Some(every) = self.renew_every
            && self.auto_renew
            && every >= self.lease
        {
            return Err(Error::Config(format!(
                "renew_every: leases renewed every {every:?} would expire while held (the \
                 lease_duration is {:?}); renew more often than the lease lasts",
                self.lease
            )));
        }
        Ok(())
    }
}

/// Refuses a queue name that is empty, longer than [`MAX_NAME_BYTES`], or holds a control
/// character (PostgreSQL's text cannot hold NUL; the others would garble logs and listings).
fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::Config("the queue name is empty".into()));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(Error::Config(format!(
            "the queue name is {} bytes long; the limit is {MAX_NAME_BYTES}",
            name.len()
        )));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(Error::Config(format!(
            "the queue name holds the control character {c:?}"
        )));
    }
    Ok(())
}
