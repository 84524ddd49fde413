//! [`DeadLetter`]s: items moved aside instead of being handed out again, and the operations
//! that list, requeue (one, by id, or all), delete (by id) and purge them.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::inner::Inner;
use crate::queue::RedisQueue;
use crate::scripts::SCRIPTS;

/// An item moved aside instead of being handed out again: it could not be deserialized (or
/// was not valid UTF-8), or its workers kept dying ([`max_stalls`](crate::Builder::max_stalls)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The item as stored (its JSON text; invalid UTF-8 shown with replacement characters).
    pub item: String,
    /// Why it was moved: the deserialization error, or the expired leases.
    pub error: String,
    /// When it was moved, in milliseconds since the Unix epoch (server clock).
    pub at_ms: u64,
    /// Its leases that had expired in a row when it was moved.
    pub stalls: u64,
    /// Its failure count (`add_rate_limited` since the last `forget`) when it was moved; the
    /// queue's count was cleared.
    pub failures: u64,
    /// The fencing token of its last lease.
    pub token: u64,
    /// The stored entry, byte for byte: what `requeue_dead_letter` finds it by.
    pub(crate) entry: Vec<u8>,
}

impl DeadLetter {
    /// Reads a stored entry. Entries are JSON written by the scripts, but an item that was not
    /// valid UTF-8 makes one invalid too: it is read leniently.
    pub(crate) fn from_entry(entry: Vec<u8>) -> Self {
        let text = String::from_utf8_lossy(&entry);
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        DeadLetter {
            item: value["item"].as_str().unwrap_or(&text).to_owned(),
            error: value["error"].as_str().unwrap_or_default().to_owned(),
            at_ms: number(&value["at_ms"]),
            stalls: number(&value["stalls"]),
            failures: number(&value["failures"]),
            token: number(&value["token"]),
            entry,
        }
    }

    /// The dead letter's identity among the queue's dead letters, for
    /// [`RedisQueue::requeue_dead_letter_by_id`] and
    /// [`RedisQueue::delete_dead_letter_by_id`]: the stored entry
    /// itself (two dead letters of one item differ by their time and token), as its text, or
    /// `hex:` and its bytes in hexadecimal when it is not valid UTF-8.
    pub fn id(&self) -> String {
        match std::str::from_utf8(&self.entry) {
            Ok(text) => text.to_owned(),
            Err(_) => {
                let mut id = String::from("hex:");
                for b in &self.entry {
                    id.push_str(&format!("{b:02x}"));
                }
                id
            }
        }
    }

    /// The stored entry of an [`id`](Self::id); `None` if it is malformed.
    pub(crate) fn entry_of(id: &str) -> Option<Vec<u8>> {
        let Some(hex) = id.strip_prefix("hex:") else {
            return Some(id.as_bytes().to_vec());
        };
        if hex.len() % 2 != 0 {
            return None;
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect()
    }
}

/// A number field of a dead letter (numbers or decimal strings).
fn number(value: &serde_json::Value) -> u64 {
    match value {
        serde_json::Value::Number(n) => n.as_u64().or_else(|| n.as_f64().map(|f| f as u64)),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .unwrap_or(0)
}

/// How many dead letters one call of `requeue_dead_letters` moves (keeps each script short).
const DEAD_BATCH: usize = 500;

impl Inner {
    /// Moves an item that cannot be deserialized to the dead-letter list.
    pub(crate) async fn dead_letter(
        &self,
        raw: &[u8],
        token: u64,
        error: &str,
    ) -> Result<(), Error> {
        let _: i64 = self
            .call("dead letter", |mut con| async move {
                self.invocation(&SCRIPTS.dead_letter)
                    .arg(raw)
                    .arg(token)
                    .arg(error)
                    .arg(self.dead_letter_cap)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(())
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> RedisQueue<T> {
    /// The dead letters, oldest first, at most `limit`: items that could not be deserialized
    /// (or were not valid UTF-8), and items whose workers kept dying
    /// ([`max_stalls`](crate::Builder::max_stalls)).
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let entries: Vec<Vec<u8>> = self
            .inner
            .call("dead_letters", |mut con| async move {
                redis::cmd("LRANGE")
                    .arg(self.inner.keys.dead())
                    .arg(0)
                    .arg(limit as i64 - 1)
                    .query_async(&mut con)
                    .await
            })
            .await?;
        Ok(entries.into_iter().map(DeadLetter::from_entry).collect())
    }

    /// Moves one dead letter back to the queue as a fresh item (no failures, no stalls), as an
    /// add would. Returns `false` if it is no longer among the dead letters.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn requeue_dead_letter(&self, letter: &DeadLetter) -> Result<bool, Error> {
        let entry = letter.entry.as_slice();
        let n: i64 = self
            .inner
            .call("requeue_dead_letter", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.dead_requeue)
                    .arg(entry)
                    .arg(1)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(n == 1)
    }

    /// Requeues the dead letter with this [`id`](DeadLetter::id), as
    /// [`requeue_dead_letter`](Self::requeue_dead_letter) does. Returns `false` if no dead
    /// letter has it (any more): idempotent.
    ///
    /// # Errors
    ///
    /// A connection error; [`Error::Protocol`] for a malformed id.
    pub async fn requeue_dead_letter_by_id(&self, id: &str) -> Result<bool, Error> {
        let entry = DeadLetter::entry_of(id)
            .ok_or_else(|| Error::Protocol(format!("not a dead-letter id: {id:?}")))?;
        let entry = entry.as_slice();
        let n: i64 = self
            .inner
            .call("requeue_dead_letter", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.dead_requeue)
                    .arg(entry)
                    .arg(1)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        Ok(n == 1)
    }

    /// Moves every dead letter back to the queue, oldest first, as
    /// [`requeue_dead_letter`](Self::requeue_dead_letter) does. Returns how many.
    ///
    /// # Errors
    ///
    /// A connection error; the dead letters moved until then stay moved.
    pub async fn requeue_dead_letters(&self) -> Result<usize, Error> {
        let mut total = 0;
        loop {
            let n: usize = self
                .inner
                .call("requeue_dead_letters", |mut con| async move {
                    self.inner
                        .invocation(&SCRIPTS.dead_requeue)
                        .arg("")
                        .arg(DEAD_BATCH)
                        .invoke_async(&mut con)
                        .await
                })
                .await?;
            total += n;
            if n < DEAD_BATCH {
                return Ok(total);
            }
        }
    }

    /// Deletes the dead letter with this [`id`](DeadLetter::id). Returns `false` if no dead
    /// letter has it (any more): idempotent.
    ///
    /// # Errors
    ///
    /// A connection error; [`Error::Protocol`] for a malformed id.
    pub async fn delete_dead_letter_by_id(&self, id: &str) -> Result<bool, Error> {
        let entry = DeadLetter::entry_of(id)
            .ok_or_else(|| Error::Protocol(format!("not a dead-letter id: {id:?}")))?;
        let entry = entry.as_slice();
        let n: i64 = self
            .inner
            .call("delete_dead_letter", |mut con| async move {
                redis::cmd("LREM")
                    .arg(self.inner.keys.dead())
                    .arg(1)
                    .arg(entry)
                    .query_async(&mut con)
                    .await
            })
            .await?;
        Ok(n == 1)
    }

    /// Deletes every dead letter. Returns how many there were. The list is dropped with
    /// `UNLINK`, so even a million dead letters are freed off the server's main thread.
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn purge_dead_letters(&self) -> Result<usize, Error> {
        self.inner
            .call("purge_dead_letters", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.dead_purge)
                    .invoke_async(&mut con)
                    .await
            })
            .await
    }
}
