//! How the database knows an item and a lease: [`Key`] and [`Claim`].

use crate::error::Error;

/// An item's identity in the database: the SHA-256 of its JSON text (`workqueue_key`).
pub(crate) type Key = [u8; 32];

/// What a lease is known by in the database: its item's key and its fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Claim {
    pub(crate) key: Key,
    pub(crate) token: i64,
}

/// The key the database sent, as a [`Key`].
pub(crate) fn key_of(bytes: &[u8]) -> Result<Key, Error> {
    bytes
        .try_into()
        .map_err(|_| Error::Protocol(format!("a key of {} bytes", bytes.len())))
}
