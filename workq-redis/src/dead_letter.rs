//! Dead letters (the core's [`DeadLetter`]): items moved aside instead of being handed out
//! again, how their stored entries read, and the operations that list, requeue (one, by id,
//! or all), delete (by id) and purge them.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use workq::admin::{DeadLetter, End};

use crate::error::Error;
use crate::inner::Inner;
use crate::queue::RedisQueue;
use crate::scripts::SCRIPTS;
use crate::units::saturated;

/// Reads a stored entry (the scripts' JSON) as a [`DeadLetter`] whose [`id`](DeadLetter::id)
/// is the entry itself ([`id_of`]). An item that was not valid UTF-8 makes an entry that is
/// not either: it is read leniently.
pub(crate) fn letter_of(entry: &[u8]) -> DeadLetter {
    let text = String::from_utf8_lossy(entry);
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    let mut letter = DeadLetter::new(
        id_of(entry),
        value["item"].as_str().unwrap_or(&text).to_owned(),
    );
    letter.error = value["error"].as_str().unwrap_or_default().to_owned();
    letter.at = SystemTime::UNIX_EPOCH + Duration::from_millis(number(&value["at_ms"]));
    letter.stalls = saturated(number(&value["stalls"]));
    letter.failures = saturated(number(&value["failures"]));
    letter.token = Some(number(&value["token"]));
    letter
}

/// A dead letter's id: the stored entry itself (two dead letters of one item differ by
/// their time and token), as its text, or `hex:` and its bytes in hexadecimal when it is not
/// valid UTF-8.
fn id_of(entry: &[u8]) -> String {
    match std::str::from_utf8(entry) {
        Ok(text) => text.to_owned(),
        Err(_) => {
            let mut id = String::from("hex:");
            for b in entry {
                let _ = write!(id, "{b:02x}");
            }
            id
        }
    }
}

/// The stored entry of a dead letter's [`id`](DeadLetter::id); `None` if it is malformed.
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

/// The stored entry of `id`, or [`Error::Protocol`] for a malformed one.
fn entry_or_error(id: &str) -> Result<Vec<u8>, Error> {
    entry_of(id).ok_or_else(|| Error::Protocol(format!("not a dead-letter id: {id:?}")))
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
const DEAD_BATCH: u64 = 500;

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
    /// At most `limit` dead letters from `from`'s end ([`End::First`]: oldest first;
    /// [`End::Last`]: newest first): items that could not be deserialized (or were not valid
    /// UTF-8), and items whose workers kept dying ([`max_stalls`](crate::Builder::max_stalls)).
    ///
    /// # Errors
    ///
    /// A connection error.
    pub async fn dead_letters(&self, from: End, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let n = i64::try_from(limit).unwrap_or(i64::MAX);
        let (start, stop) = match from {
            End::First => (0, n - 1),
            End::Last => (-n, -1),
        };
        let mut entries: Vec<Vec<u8>> = self
            .inner
            .call("dead_letters", |mut con| async move {
                redis::cmd("LRANGE")
                    .arg(self.inner.keys.dead())
                    .arg(start)
                    .arg(stop)
                    .query_async(&mut con)
                    .await
            })
            .await?;
        if from == End::Last {
            entries.reverse();
        }
        Ok(entries.iter().map(|e| letter_of(e)).collect())
    }

    /// Moves one dead letter back to the queue as a fresh item (no failures, no stalls), as an
    /// add would. Returns `false` if it is no longer among the dead letters.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] while this handle or the queue is shut down (adds are ignored: the
    /// letter stays); [`Error::Protocol`] for a letter whose id is malformed; a connection
    /// error.
    pub async fn requeue_dead_letter(&self, letter: &DeadLetter) -> Result<bool, Error> {
        self.requeue_dead_letter_by_id(&letter.id).await
    }

    /// Requeues the dead letter with this [`id`](DeadLetter::id), as
    /// [`requeue_dead_letter`](Self::requeue_dead_letter) does. Returns `false` if no dead
    /// letter has it (any more): idempotent.
    ///
    /// # Errors
    ///
    /// As for [`requeue_dead_letter`](Self::requeue_dead_letter).
    pub async fn requeue_dead_letter_by_id(&self, id: &str) -> Result<bool, Error> {
        let entry = entry_or_error(id)?;
        Ok(self.requeue(&entry, 1).await? == 1)
    }

    /// Moves every dead letter back to the queue, oldest first, as
    /// [`requeue_dead_letter`](Self::requeue_dead_letter) does, 500 per script run. Returns
    /// how many.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] while this handle or the queue is shut down (nothing is requeued,
    /// or, shut down meanwhile, nothing more); a connection error. The dead letters moved
    /// until then stay moved.
    pub async fn requeue_dead_letters(&self) -> Result<u64, Error> {
        let mut total = 0;
        loop {
            let n = self.requeue(b"", DEAD_BATCH).await?;
            total += n;
            if n < DEAD_BATCH {
                return Ok(total);
            }
        }
    }

    /// One run of `dead_requeue`: the letter `entry`, or (empty) the `max` oldest.
    async fn requeue(&self, entry: &[u8], max: u64) -> Result<u64, Error> {
        if self.inner.shut.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        let n: i64 = self
            .inner
            .call("requeue_dead_letters", |mut con| async move {
                self.inner
                    .invocation(&SCRIPTS.dead_requeue)
                    .arg(entry)
                    .arg(max)
                    .invoke_async(&mut con)
                    .await
            })
            .await?;
        u64::try_from(n).map_err(|_| Error::ShutDown)
    }

    /// Deletes the dead letter with this [`id`](DeadLetter::id). Returns `false` if no dead
    /// letter has it (any more): idempotent.
    ///
    /// # Errors
    ///
    /// A connection error; [`Error::Protocol`] for a malformed id.
    pub async fn delete_dead_letter_by_id(&self, id: &str) -> Result<bool, Error> {
        let entry = entry_or_error(id)?;
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
    pub async fn purge_dead_letters(&self) -> Result<u64, Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_the_stored_entry_and_reads_back() {
        let entry =
            br#"{"item":"\"a\"","error":"boom","at_ms":1500,"stalls":2,"failures":3,"token":"9"}"#;
        let letter = letter_of(entry);
        assert_eq!(letter.id.as_bytes(), entry);
        assert_eq!(entry_of(&letter.id).as_deref(), Some(&entry[..]));
        assert_eq!(
            (
                letter.item.as_str(),
                letter.error.as_str(),
                letter.stalls,
                letter.failures
            ),
            ("\"a\"", "boom", 2, 3)
        );
        assert_eq!(
            letter.at,
            SystemTime::UNIX_EPOCH + Duration::from_millis(1500)
        );
        assert_eq!(letter.token, Some(9));

        let bytes = vec![0xff, b'{', 0x00];
        let odd = letter_of(&bytes);
        assert_eq!(odd.id, "hex:ff7b00");
        assert_eq!(entry_of(&odd.id), Some(bytes));
        assert_eq!(entry_of("hex:zz"), None);
        assert_eq!(entry_of("hex:abc"), None);
    }
}
