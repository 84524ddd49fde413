//! `bullmq-official` (crate name `bullmq`): BullMQ's own Rust port, on Redis.
//!
//! Used as its documentation shows it for throughput: jobs added with `Queue::add_bulk` (its
//! bulk insert: the adds of a batch go out together over one multiplexed connection), a
//! `Worker` with `concurrency` set to the workload's workers (BullMQ has no completion
//! batching in its open-source worker: finishing a job fetches the next in the same script),
//! `removeOnComplete` so that finished jobs do not pile up (as the node script does). The
//! dedup workload uses its deduplication option (simple mode: an add is dropped while a job
//! with the same deduplication id is waiting, delayed or active, so an add during processing
//! is lost rather than delivered again).

use std::sync::Arc;

use bullmq::options::{
    DeduplicationOptions, JobOptions, QueueOptions, RedisConnectionOptions, WorkerOptions,
};
use bullmq::types::RemoveOnFinish;
use bullmq::{BulkJob, Job as BullJob, Queue, Worker};

use crate::peer::{Handler, Job, Peer, Result, Running};

/// A handle on one BullMQ queue.
#[derive(Clone)]
pub(crate) struct Bullmq {
    url: String,
    name: String,
    queue: Arc<Queue>,
}

fn connection(url: &str) -> RedisConnectionOptions {
    RedisConnectionOptions::new().url(url)
}

impl Peer for Bullmq {
    const NAME: &'static str = "bullmq-official";
    const URL_VAR: &'static str = "WQ_REDIS_URL";

    async fn open(url: &str, name: &str) -> Result<Self> {
        let queue =
            Queue::with_options(name, QueueOptions::new().connection(connection(url))).await?;
        Ok(Self {
            url: url.to_owned(),
            name: name.to_owned(),
            queue: Arc::new(queue),
        })
    }

    async fn add(&self, jobs: &[Job]) -> Result<()> {
        let bulk = jobs
            .iter()
            .map(|job| {
                let mut opts = JobOptions {
                    remove_on_complete: Some(RemoveOnFinish::Bool(true)),
                    ..JobOptions::default()
                };
                if !job.delay.is_zero() {
                    opts.delay = Some(job.delay.as_millis() as u64);
                }
                if job.unique {
                    opts.deduplication = Some(DeduplicationOptions {
                        id: format!("key-{}", job.id),
                        ..DeduplicationOptions::default()
                    });
                }
                BulkJob::with_options("item", serde_json::json!({ "k": job.id }), opts)
            })
            .collect();
        self.queue.add_bulk(bulk).await?;
        Ok(())
    }

    async fn work(&self, concurrency: usize, handler: Handler) -> Result<Running> {
        let opts = WorkerOptions {
            connection: connection(&self.url),
            concurrency,
            remove_on_complete: Some(RemoveOnFinish::Bool(true)),
            ..WorkerOptions::default()
        };
        let worker = Worker::with_options(
            &self.name,
            move |job: BullJob, _token| {
                let handler = handler.clone();
                async move {
                    if let Some(id) = job.data()["k"].as_u64() {
                        handler(id).await;
                    }
                    Ok(serde_json::Value::Null)
                }
            },
            opts,
        )
        .await?;
        let worker = Arc::new(worker);
        Ok(Running::new(move || {
            Box::pin(async move {
                worker.close(30_000).await?;
                Ok(())
            })
        }))
    }

    async fn pending(&self) -> Result<u64> {
        let counts = self.queue.get_job_counts().await?;
        Ok(counts.waiting + counts.active + counts.delayed + counts.prioritized + counts.paused)
    }

    async fn delete(&self) -> Result<()> {
        self.queue.obliterate(true, 1_000).await?;
        Ok(())
    }

    fn settings() -> String {
        "Queue::add_bulk of each batch; Worker with concurrency = the workload's workers, \
         removeOnComplete; deduplication ids for the dedup workload (simple mode); defaults \
         otherwise (lock 30 s, drain delay 5 s)"
            .to_owned()
    }
}
