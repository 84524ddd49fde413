//! Wake-ups: the getters of a handle wait on its [`Wakeups`]; one `LISTEN` connection per
//! process and database (a [`Hub`]) turns the queues' `NOTIFY`s into wake-ups.
//!
//! The hub's connection is its own, opened with the connect options of the queue's pool but
//! outside it: a pool passed with [`Builder::pool`](crate::Builder::pool) lends the queue
//! connections for its statements only, so any number of queues share a pool of any size.
//! Each queue has its own channel, `workqueue_<id>`, whose payload is how many items became
//! ready (at least one), so a notification wakes that many getters, not all of them.
//!
//! The connection is pinged while idle; a ping that fails or does not answer in time, or a
//! lost connection, replaces it. Whatever was notified meanwhile is lost, so after every
//! (re)connection every registered queue's getters are woken once: they look at the queue
//! themselves.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{Executor, PgPool};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::error::Error;

/// The wake-ups of one handle's getters and drains.
#[derive(Debug, Default)]
pub(crate) struct Wakeups {
    /// Getters wait here for items.
    items: Notify,
    /// Drains wait here for the last lease to end.
    drained: Notify,
}

/// The most getters one notification wakes.
const MAX_WAKE: u64 = 256;

impl Wakeups {
    /// Wakes up to `n` waiting getters (at least one; a getter about to wait keeps one
    /// wake-up for later).
    pub(crate) fn wake(&self, n: u64) {
        for _ in 0..n.clamp(1, MAX_WAKE) {
            self.items.notify_one();
        }
    }

    /// Wakes every waiting getter (a shut down, a lost `LISTEN` connection).
    pub(crate) fn wake_all(&self) {
        self.items.notify_waiters();
        self.items.notify_one();
    }

    /// What a getter waits on; [`enable`](tokio::sync::futures::Notified::enable) it before
    /// looking at the queue, so that a wake-up in between is not missed.
    pub(crate) fn items(&self) -> tokio::sync::futures::Notified<'_> {
        self.items.notified()
    }

    /// Wakes the drains (a lease ended, or the handle shut down).
    pub(crate) fn wake_drains(&self) {
        self.drained.notify_waiters();
    }

    /// What a drain waits on.
    pub(crate) fn drained(&self) -> tokio::sync::futures::Notified<'_> {
        self.drained.notified()
    }
}

/// The `application_name` of the `LISTEN` connection, so operators can tell it apart in
/// `pg_stat_activity`.
pub const APPLICATION_NAME: &str = "workqueue-listen";

/// The channel of queue `id`.
pub(crate) fn channel(id: i32) -> String {
    format!("workqueue_{id}")
}

/// What the hub's task is asked to do.
enum Command {
    /// Listen on a queue's channel; answer once listening (or why not).
    Listen(i32, oneshot::Sender<Result<(), String>>),
    /// Stop listening on a queue's channel (its last handle is gone).
    Unlisten(i32),
}

/// One process's `LISTEN` connection to one database, shared by every queue on it.
struct Hub {
    key: String,
    commands: mpsc::UnboundedSender<Command>,
    queues: Arc<Mutex<HashMap<i32, Vec<Weak<Wakeups>>>>>,
}

impl Drop for Hub {
    fn drop(&mut self) {
        // The task ends when the last sender is gone; forget this hub.
        let mut hubs = HUBS.lock().unwrap_or_else(|e| e.into_inner());
        if hubs.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            hubs.remove(&self.key);
        }
    }
}

/// The hubs of this process, by database.
static HUBS: LazyLock<Mutex<HashMap<String, Weak<Hub>>>> = LazyLock::new(Mutex::default);

/// A queue handle's place on a hub; dropping it stops its wake-ups.
pub(crate) struct Registration {
    hub: Arc<Hub>,
    id: i32,
    wake: Weak<Wakeups>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut queues = self.hub.queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = queues.get_mut(&self.id) {
            list.retain(|w| w.strong_count() > 0 && !w.ptr_eq(&self.wake));
            if list.is_empty() {
                queues.remove(&self.id);
                let _ = self.hub.commands.send(Command::Unlisten(self.id));
            }
        }
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("queue", &self.id)
            .finish_non_exhaustive()
    }
}

/// The identity of the database behind `pool`: one hub per process and database.
fn database_key(pool: &PgPool) -> String {
    let options = pool.connect_options();
    format!(
        "{}@{}:{}/{}?{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or_default(),
        options
            .get_socket()
            .map(|s| s.display().to_string())
            .unwrap_or_default()
    )
}

/// Registers `wake` for the notifications of queue `id`, starting this process's hub for the
/// database if there is none, and returns once the hub listens on the queue's channel.
/// `check` is how often the hub's idle connection is pinged (the shortest any queue asks).
///
/// # Errors
///
/// [`Error::Database`] if the hub cannot connect or listen.
pub(crate) async fn register(
    pool: &PgPool,
    id: i32,
    wake: &Arc<Wakeups>,
    check: Duration,
) -> Result<Registration, Error> {
    let key = database_key(pool);
    let hub = {
        let mut hubs = HUBS.lock().unwrap_or_else(|e| e.into_inner());
        match hubs.get(&key).and_then(Weak::upgrade) {
            Some(hub) => hub,
            None => {
                let (tx, rx) = mpsc::unbounded_channel();
                let queues: Arc<Mutex<HashMap<i32, Vec<Weak<Wakeups>>>>> = Arc::default();
                let options = (*pool.connect_options())
                    .clone()
                    .application_name(APPLICATION_NAME);
                tokio::spawn(run(Arc::downgrade(&queues), options, rx, check));
                let hub = Arc::new(Hub {
                    key: key.clone(),
                    commands: tx,
                    queues,
                });
                hubs.insert(key, Arc::downgrade(&hub));
                hub
            }
        }
    };
    hub.queues
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(id)
        .or_default()
        .push(Arc::downgrade(wake));
    let registration = Registration {
        hub: hub.clone(),
        id,
        wake: Arc::downgrade(wake),
    };
    let (tx, rx) = oneshot::channel();
    hub.commands
        .send(Command::Listen(id, tx))
        .map_err(|_| Error::Config("the LISTEN task has stopped".into()))?;
    match rx.await {
        Ok(Ok(())) => Ok(registration),
        Ok(Err(e)) => Err(Error::Listen(e)),
        Err(_) => Err(Error::Listen("the LISTEN task has stopped".into())),
    }
}

/// Wakes every getter of every queue registered on a hub.
fn wake_everyone(queues: &Mutex<HashMap<i32, Vec<Weak<Wakeups>>>>) {
    let queues = queues.lock().unwrap_or_else(|e| e.into_inner());
    for wake in queues.values().flatten().filter_map(Weak::upgrade) {
        wake.wake_all();
    }
}

/// Wakes `n` getters of queue `id`.
fn wake_queue(queues: &Mutex<HashMap<i32, Vec<Weak<Wakeups>>>>, id: i32, n: u64) {
    let wakes: Vec<Arc<Wakeups>> = queues
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&id)
        .map(|list| list.iter().filter_map(Weak::upgrade).collect())
        .unwrap_or_default();
    for wake in wakes {
        wake.wake(n);
    }
}

/// Opens the hub's connection and listens on every channel in `channels`.
///
/// Each connection comes from a pool of its own: a replaced connection that hangs (its server
/// stopped answering) is let go in the background, and must not hold up its successor.
async fn connect(
    options: &PgConnectOptions,
    channels: &BTreeSet<i32>,
) -> Result<PgListener, sqlx::Error> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options.clone());
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    // A lost connection is replaced here, not inside `try_recv`, so that every loss is seen.
    listener.eager_reconnect(false);
    let names: Vec<String> = channels.iter().map(|&id| channel(id)).collect();
    listener
        .listen_all(names.iter().map(String::as_str))
        .await?;
    Ok(listener)
}

/// The hub's task: keeps one `LISTEN` connection, turns notifications into wake-ups, pings
/// the connection while idle and replaces it when it fails. Ends when the hub is dropped.
async fn run(
    queues: Weak<Mutex<HashMap<i32, Vec<Weak<Wakeups>>>>>,
    options: PgConnectOptions,
    mut commands: mpsc::UnboundedReceiver<Command>,
    check: Duration,
) {
    // However long the queues poll (`Duration::MAX`: never), the idle connection is checked
    // at least every 30 s: a connection that died unnoticed would lose every wake-up.
    let check = check.clamp(Duration::from_millis(100), Duration::from_secs(30));
    let mut channels: BTreeSet<i32> = BTreeSet::new();
    let mut waiting: Vec<oneshot::Sender<Result<(), String>>> = Vec::new();
    let mut listener: Option<PgListener> = None;
    let mut backoff = Duration::from_millis(50);
    loop {
        if listener.is_none() {
            match connect(&options, &channels).await {
                Ok(l) => {
                    listener = Some(l);
                    backoff = Duration::from_millis(50);
                    for ack in waiting.drain(..) {
                        let _ = ack.send(Ok(()));
                    }
                    // Whatever was notified while there was no connection is lost: every
                    // getter looks at its queue once.
                    let Some(queues) = queues.upgrade() else {
                        return;
                    };
                    wake_everyone(&queues);
                }
                Err(error) => {
                    tracing::debug!(%error, "workq-postgres: LISTEN connection failed; retrying");
                    for ack in waiting.drain(..) {
                        let _ = ack.send(Err(error.to_string()));
                    }
                    // Keep taking commands while waiting to retry.
                    tokio::select! {
                        command = commands.recv() => match command {
                            None => return,
                            Some(Command::Listen(id, ack)) => {
                                channels.insert(id);
                                waiting.push(ack);
                            }
                            Some(Command::Unlisten(id)) => {
                                channels.remove(&id);
                            }
                        },
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    continue;
                }
            }
        }
        let Some(l) = listener.as_mut() else {
            continue;
        };
        let lost = tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(Command::Listen(id, ack)) => {
                    channels.insert(id);
                    match l.listen(&channel(id)).await {
                        Ok(()) => {
                            let _ = ack.send(Ok(()));
                            false
                        }
                        Err(error) => {
                            // Listened on at the next connection, which answers then.
                            tracing::debug!(%error, "workq-postgres: LISTEN failed");
                            waiting.push(ack);
                            true
                        }
                    }
                }
                Some(Command::Unlisten(id)) => {
                    channels.remove(&id);
                    l.unlisten(&channel(id)).await.is_err()
                }
            },
            received = l.try_recv() => match received {
                Ok(Some(note)) => {
                    let id = note.channel().strip_prefix("workqueue_").and_then(|s| s.parse().ok());
                    if let (Some(id), Some(queues)) = (id, queues.upgrade()) {
                        let n = note.payload().parse::<u64>().unwrap_or(1);
                        wake_queue(&queues, id, n);
                    }
                    false
                }
                Ok(None) => true,
                Err(error) => {
                    tracing::debug!(%error, "workq-postgres: LISTEN connection failed");
                    true
                }
            },
            () = tokio::time::sleep(check) => {
                // Idle for a while: make sure the connection still answers.
                let ping = tokio::time::timeout(check.max(Duration::from_secs(5)), l.execute("SELECT 1"));
                !matches!(ping.await, Ok(Ok(_)))
            }
        };
        if lost {
            tracing::debug!("workq-postgres: replacing the LISTEN connection");
            if let Some(l) = listener.take() {
                drop(l);
            }
            if queues.strong_count() == 0 {
                return;
            }
        }
    }
}
