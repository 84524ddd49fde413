//! The demo's [`Backend`] on Redis (`wq demo --redis URL`): the queue is a
//! [`RedisQueue`], and the checks' bookkeeping lives in keys beside it,
//! `wq-demo:{QUEUE}:claims` (item -> token of the lease that holds it), `...:done` (item ->
//! token of its last accepted `done`), `...:given-up` (a set) and `...:helpers` (the
//! `--workers-only` processes on the queue).

use std::collections::{HashMap, HashSet};

use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use workq_redis::{Error, Lease, RateLimit, RedisQueue};

use super::distributed::{BACKOFF, Backend, LEASE, Ledger};

/// The queue on Redis and a connection for the bookkeeping.
#[derive(Clone)]
pub(crate) struct OnRedis {
    queue: RedisQueue<String>,
    con: ConnectionManager,
}

impl OnRedis {
    /// The key of the bookkeeping's `part`: `claims`, `done`, `given-up` or `helpers`.
    fn key(&self, part: &str) -> String {
        format!("wq-demo:{{{}}}:{part}", self.queue.name())
    }
}

impl Backend for OnRedis {
    type Queue = RedisQueue<String>;

    async fn open(url: &str, queue: &str, _workers: usize) -> Result<Self, Error> {
        let queue: RedisQueue<String> = RedisQueue::builder(queue)
            .url(url)
            .lease_duration(LEASE)
            .rate_limit(RateLimit::exponential(BACKOFF.0, BACKOFF.1))
            .build()
            .await?;
        let client = redis::Client::open(url)?;
        let con = client.get_connection_manager().await?;
        Ok(OnRedis { queue, con })
    }

    fn queue(&self) -> &RedisQueue<String> {
        &self.queue
    }

    fn token(lease: &Lease<String>) -> u64 {
        lease.token()
    }

    async fn add_batch(&self, items: &[String]) -> Result<Vec<u64>, Error> {
        Ok(self
            .queue
            .add_all(items)
            .await?
            .into_iter()
            .map(|added| added.seq)
            .collect())
    }

    /// One script reads the queue's depth, delayed and in-flight counts together.
    async fn is_drained(&self) -> Result<bool, Error> {
        let stats = self.queue.stats(1).await?;
        let figures = &stats.summary;
        Ok(figures.depth == 0 && figures.delayed == 0 && figures.in_flight == 0)
    }

    async fn shut_down_fleet(&self) -> Result<(), Error> {
        self.queue.shut_down_fleet().await.map(|_| ())
    }

    async fn reset(&self) -> Result<(), Error> {
        self.queue.delete().await?;
        let _: () = self
            .con
            .clone()
            .del(&[self.key("claims"), self.key("done"), self.key("given-up")])
            .await?;
        Ok(())
    }

    async fn claim(&self, item: &str, token: u64) -> Result<bool, Error> {
        Ok(self
            .con
            .clone()
            .hset_nx(self.key("claims"), item, token)
            .await?)
    }

    async fn end_claim(&self, item: &str, _token: u64, claimed: bool) -> Result<(), Error> {
        if claimed {
            let _: () = self.con.clone().hdel(self.key("claims"), item).await?;
        }
        Ok(())
    }

    async fn ended(&self, item: &str, token: u64, accepted: bool) -> Result<(), Error> {
        if accepted {
            let _: () = self.con.clone().hset(self.key("done"), item, token).await?;
        }
        Ok(())
    }

    async fn give_up(&self, item: &str) -> Result<(), Error> {
        let _: () = self.con.clone().sadd(self.key("given-up"), item).await?;
        Ok(())
    }

    async fn ledger(&self) -> Result<Ledger, Error> {
        let mut con = self.con.clone();
        let done: HashMap<String, u64> = con.hgetall(self.key("done")).await?;
        let given_up: HashSet<String> = con.smembers(self.key("given-up")).await?;
        Ok(Ledger { done, given_up })
    }

    async fn helper(&self, id: &str, present: bool) -> Result<(), Error> {
        let mut con = self.con.clone();
        if present {
            let _: () = con.sadd(self.key("helpers"), id).await?;
        } else {
            let _: () = con.srem(self.key("helpers"), id).await?;
        }
        Ok(())
    }

    async fn helpers(&self) -> Result<u64, Error> {
        Ok(self.con.clone().scard(self.key("helpers")).await?)
    }
}
