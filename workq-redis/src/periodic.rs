//! Periodic schedules on the server ([`workq::periodic`]): each queue keeps its schedules'
//! records in one hash in its hash tag (`prefix:{name}:periodic`, schedule name -> JSON
//! record), and a tick is taken and its item added by one run of the `periodic_tick`
//! script, so that runners of one schedule in any number of processes add one item per
//! tick between them.
//!
//! Instants in the records are the runners' wall clock (milliseconds since the Unix epoch,
//! as decimal strings): the scripts store and compare what they are sent and never read the
//! server's clock for them, so a tick names the same time in every process.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use redis::{Script, Value};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use workq::AddOptions;
use workq::periodic::{ScheduleInfo, ScheduleUpdate, TickClaim, TickOutcome};

use crate::error::Error;
use crate::queue::RedisQueue;
use crate::reply::{number, parts};
use crate::scripts::{Oom, script};
use crate::units::micros;

/// The suffix of the schedules' hash, beside the queue's other keys.
const SUFFIX: &str = "periodic";

/// The two scripts, built once per process.
struct Scripts {
    tick: Script,
    upsert: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    // Refused by a full server, as every add is.
    tick: script(&[include_str!("lua/periodic_tick.lua")], Oom::Refuse),
    // A pause must work on a full server; a record is a few dozen bytes.
    upsert: script(&[include_str!("lua/periodic_upsert.lua")], Oom::Allow),
});

/// A record as the scripts keep it.
#[derive(Deserialize)]
struct Record {
    spec: String,
    since: String,
    last: String,
    next: String,
    paused: bool,
}

impl Record {
    fn into_info(self, name: &str) -> Result<ScheduleInfo, Error> {
        let instant = |ms: &str| -> Result<Option<SystemTime>, Error> {
            if ms.is_empty() {
                return Ok(None);
            }
            let ms: u64 = ms
                .parse()
                .map_err(|_| Error::Protocol(format!("periodic: bad instant {ms:?}")))?;
            Ok(SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms)))
        };
        let mut info = ScheduleInfo::new(
            name,
            instant(&self.since)?.unwrap_or(SystemTime::UNIX_EPOCH),
        );
        info.spec = self.spec;
        info.last_tick = instant(&self.last)?;
        info.next_tick = instant(&self.next)?;
        info.paused = self.paused;
        Ok(info)
    }

    fn parse(name: &str, json: &str) -> Result<ScheduleInfo, Error> {
        let record: Record = serde_json::from_str(json)
            .map_err(|e| Error::Protocol(format!("periodic: bad record of {name:?}: {e}")))?;
        record.into_info(name)
    }
}

/// Milliseconds since the Unix epoch as the scripts take them (0 before it).
fn ms(at: SystemTime) -> String {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
        .to_string()
}

/// An optional instant as the scripts take it (`''`: none).
fn opt_ms(at: Option<SystemTime>) -> String {
    at.map(ms).unwrap_or_default()
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
    /// The schedules' hash of this queue.
    fn periodic_key(&self) -> String {
        self.inner.keys.derived(SUFFIX)
    }

    /// [`Queue::upsert_schedule`](workq::Queue::upsert_schedule): one run of the
    /// `periodic_upsert` script.
    pub(crate) async fn upsert_periodic(
        &self,
        update: ScheduleUpdate,
    ) -> Result<ScheduleInfo, Error> {
        let key = self.periodic_key();
        let (key, update) = (&key, &update);
        let json: String = self
            .inner
            .call("periodic_upsert", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.upsert)
                    .key(key)
                    .arg(&update.name)
                    .arg(ms(update.now))
                    .arg(if update.spec.is_some() { "1" } else { "" })
                    .arg(update.spec.as_deref().unwrap_or(""))
                    .arg(opt_ms(update.next_tick))
                    .arg(match update.paused {
                        Some(true) => "1",
                        Some(false) => "0",
                        None => "",
                    })
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Record::parse(&update.name, &json)
    }

    /// [`Queue::add_on_tick`](workq::Queue::add_on_tick): the claim and the add in one run
    /// of the `periodic_tick` script. A shut-down handle takes nothing (no round trip).
    /// Rate limiting is not supported on a tick's add (the schedule is its own pace).
    pub(crate) async fn add_on_periodic_tick(
        &self,
        claim: TickClaim,
        item: &T,
        options: AddOptions,
    ) -> Result<TickOutcome, Error> {
        if options.is_rate_limited() {
            return Err(Error::Unsupported(
                "a rate-limited add on a periodic tick (the schedule is its own pace)",
            ));
        }
        let tp = crate::trace::traceparent();
        if self.is_closed() {
            return Ok(TickOutcome::ShutDown);
        }
        let raw = serde_json::to_string(item).map_err(Error::Serialize)?;
        let key = self.periodic_key();
        let (key, claim, raw) = (&key, &claim, &raw);
        let priority = options
            .requested_priority()
            .map_or_else(String::new, |p| p.to_string());
        let (priority, group, tp) = (&priority, &self.group_arg(item), &tp);
        let value: Value = self
            .inner
            .call("periodic_tick", |mut con| async move {
                let mut invocation = self.inner.invocation(&SCRIPTS.tick);
                invocation
                    .key(key)
                    .arg(&claim.schedule)
                    .arg(&claim.spec)
                    .arg(ms(claim.tick))
                    .arg(opt_ms(claim.next_tick))
                    .arg(ms(claim.now))
                    .arg(raw)
                    .arg(micros(options.delay()))
                    .arg(priority)
                    .arg(group);
                if let Some(tp) = tp {
                    invocation.arg(tp);
                }
                invocation.invoke_async(&mut con).await
            })
            .await?;
        let parts = parts(value).map_err(|e| Error::Protocol(format!("periodic_tick: {e}")))?;
        let outcome = parts
            .first()
            .map(number)
            .transpose()
            .map_err(|e| Error::Protocol(format!("periodic_tick: {e}")))?;
        match outcome {
            Some(1) => Ok(TickOutcome::Added),
            Some(2) => Ok(TickOutcome::AlreadyTaken),
            Some(3) => Ok(TickOutcome::Paused),
            Some(0) => Ok(TickOutcome::ShutDown),
            other => Err(Error::Protocol(format!(
                "periodic_tick: unknown outcome {other:?}"
            ))),
        }
    }

    /// The queue's periodic schedules, by name: what an operator's listing shows (`wq
    /// queue ... stats`, the dashboard). One `HGETALL` of a hash with one field per
    /// schedule.
    ///
    /// # Errors
    ///
    /// A connection error, or a record this crate does not understand.
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>, Error> {
        let key = self.periodic_key();
        let key = &key;
        let fields: BTreeMap<String, String> = self
            .inner
            .call("periodic_list", |mut con| async move {
                redis::cmd("HGETALL").arg(key).query_async(&mut con).await
            })
            .await?;
        fields
            .iter()
            .map(|(name, json)| Record::parse(name, json))
            .collect()
    }
}
