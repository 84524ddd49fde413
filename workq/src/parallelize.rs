//! [`parallelize_until`] and [`Parallelizer`]: client-go's `ParallelizeUntil`, for fan-out
//! work that is not a queue (client-go: `util/workqueue/parallelizer.go`).

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::workers::StopToken;

/// Runs `work(piece)` for every piece in `0..pieces` on up to `workers` threads, until `stop`
/// is stopped. Returns how many pieces ran.
///
/// This is client-go's `ParallelizeUntil(ctx, workers, pieces, doWorkPiece)` with a chunk
/// size of 1; use a [`Parallelizer`] for other chunk sizes or no stop signal. See
/// [`Parallelizer::run`] for the rules.
///
/// # Examples
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use workq::{StopToken, parallelize_until};
///
/// let sizes = [3_u64, 1, 4, 1, 5, 9, 2, 6];
/// let total = AtomicU64::new(0);
/// let ran = parallelize_until(&StopToken::new(), 4, sizes.len(), |piece| {
///     total.fetch_add(sizes[piece], Ordering::Relaxed);
/// });
/// assert_eq!(ran, 8);
/// assert_eq!(total.into_inner(), 31);
/// ```
pub fn parallelize_until<F>(stop: &StopToken, workers: usize, pieces: usize, work: F) -> usize
where
    F: Fn(usize) + Sync,
{
    Parallelizer::new(workers).stop_on(stop).run(pieces, work)
}

/// Runs independent pieces of work on a few threads: client-go's `ParallelizeUntil` with its
/// options.
///
/// # Default
///
/// Chunk size 1 (each worker takes one piece at a time), no stop signal.
///
/// # Examples
///
/// ```
/// use std::sync::Mutex;
/// use workq::{Parallelizer, StopToken};
///
/// let stop = StopToken::new();
/// let seen = Mutex::new(Vec::new());
/// let ran = Parallelizer::new(3)
///     .chunk_size(10) // take pieces ten at a time: less contention for tiny pieces
///     .stop_on(&stop)
///     .run(95, |piece| seen.lock().unwrap().push(piece));
/// assert_eq!(ran, 95);
/// let mut seen = seen.into_inner().unwrap();
/// seen.sort();
/// assert_eq!(seen, (0..95).collect::<Vec<_>>());
/// ```
#[derive(Debug, Clone)]
#[must_use = "a Parallelizer does nothing until run"]
pub struct Parallelizer {
    workers: usize,
    chunk_size: usize,
    stop: Option<StopToken>,
}

impl Parallelizer {
    /// Runs pieces on up to `workers` threads (the calling thread is one of them).
    pub fn new(workers: usize) -> Self {
        Self {
            workers,
            chunk_size: 1,
            stop: None,
        }
    }

    /// Hands pieces out `chunk_size` at a time (client-go's `WithChunkSize`); values below 1
    /// mean 1.
    pub fn chunk_size(mut self, chunk_size: usize) -> Self {
        self.chunk_size = chunk_size.max(1);
        self
    }

    /// Checks `stop` before each piece and starts no more pieces once it is stopped.
    pub fn stop_on(mut self, stop: &StopToken) -> Self {
        self.stop = Some(stop.clone());
        self
    }

    /// Runs `work(piece)` for every piece in `0..pieces` and returns how many ran.
    ///
    /// The pieces are cut into chunks of [`chunk_size`](Self::chunk_size); each worker takes
    /// the next chunk until none is left, and runs its pieces in order. The rules are
    /// client-go's:
    ///
    /// - `min(workers, chunks)` workers run: the calling thread and scoped threads, so `work`
    ///   may borrow from the caller. With 0 workers or 0 pieces nothing runs.
    /// - The stop signal is checked before each piece; once stopped, workers abandon the rest
    ///   and the call returns after the pieces already running finish.
    /// - Every piece runs at most once, and exactly once if the signal never stops.
    ///
    /// # Panics
    ///
    /// If `work` panics, no new piece starts; once the running pieces finish the first panic
    /// is resumed on the calling thread (client-go re-panics too). Also panics if the system
    /// cannot start a thread.
    pub fn run<F>(&self, pieces: usize, work: F) -> usize
    where
        F: Fn(usize) + Sync,
    {
        if pieces == 0 || self.workers == 0 {
            return 0;
        }
        let chunk_size = self.chunk_size;
        let chunks = pieces.div_ceil(chunk_size);
        let workers = self.workers.min(chunks);
        let run = Run {
            pieces,
            chunk_size,
            chunks,
            next_chunk: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            panic: Mutex::new(None),
            stop: self.stop.as_ref(),
            work: &work,
        };
        std::thread::scope(|scope| {
            for _ in 1..workers {
                std::thread::Builder::new()
                    .name("workq-parallelize".to_owned())
                    .spawn_scoped(scope, || run.worker())
                    .unwrap_or_else(|err| panic!("parallelize: cannot start a thread: {err}"));
            }
            run.worker();
        });
        if let Some(payload) = run.panic.into_inner() {
            panic::resume_unwind(payload);
        }
        run.done.into_inner()
    }
}

/// One call of [`Parallelizer::run`], shared by its workers.
struct Run<'a, F> {
    pieces: usize,
    chunk_size: usize,
    chunks: usize,
    /// The next chunk to hand out (client-go fills a channel with the chunk indices).
    next_chunk: AtomicUsize,
    /// Pieces that ran to the end.
    done: AtomicUsize,
    /// Set by the first panic: stops the other workers.
    failed: AtomicBool,
    /// The first panic's payload, resumed on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    stop: Option<&'a StopToken>,
    work: &'a F,
}

impl<F: Fn(usize) + Sync> Run<'_, F> {
    fn worker(&self) {
        loop {
            let chunk = self.next_chunk.fetch_add(1, Ordering::Relaxed);
            if chunk >= self.chunks {
                return;
            }
            let start = chunk * self.chunk_size;
            let end = (start + self.chunk_size).min(self.pieces);
            for piece in start..end {
                if self.failed.load(Ordering::Relaxed)
                    || self.stop.is_some_and(StopToken::is_stopped)
                {
                    return;
                }
                match panic::catch_unwind(AssertUnwindSafe(|| (self.work)(piece))) {
                    Ok(()) => {
                        self.done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(payload) => {
                        self.failed.store(true, Ordering::Relaxed);
                        self.panic.lock().get_or_insert(payload);
                        return;
                    }
                }
            }
        }
    }
}
