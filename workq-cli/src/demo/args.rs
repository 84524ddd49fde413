//! The flags of `wq demo` ([`DemoArgs`]) and their value parsers: each parser refuses an
//! out-of-range value with a sentence clap prints after "invalid value", and clap exits with
//! code 2.

use std::time::Duration;

use workq::rate_limiter::{
    self, ExponentialFailure, FastSlow, Jitter, MaxOf, RateLimiter, TokenBucket,
};

/// Options of `wq demo`.
#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
The simulation: producers emit bursts of change events for the objects (many duplicates, \
which the queue merges); workers reconcile each object with a random latency and fail at \
--failure-rate; failures back off with --limiter and are given up after --max-retries.

At the end a table shows events added and absorbed by dedup, reconciles, retries, give-ups, \
the add-to-reconcile latency and the throughput, and two checks made while running: no \
object was reconciled by two workers at once, and every object's last event was reconciled \
after it arrived.

On a server (--redis URL or --postgres URL) the queue is shared: run one process with \
producers and workers, and any number with --workers-only on the same --queue. The checks' \
bookkeeping is kept on the same server (keys wq-demo:{QUEUE}:* on Redis; tables wq_demo_* \
on PostgreSQL, created if missing), so they hold across every process. The producing \
process waits for the queue to drain, shuts it down for every process, and once the \
--workers-only processes have left, deletes the queue and its bookkeeping: the server is \
left as the demo found it (bar the empty wq_demo_* tables).

Exit codes: 0 if both checks hold, 1 if one fails, 2 for a bad flag, 130 on Ctrl-C (intake \
stops, reconciles in flight finish, the table is printed).")]
#[command(group(clap::ArgGroup::new("server").args(["redis", "postgres"])))]
pub(crate) struct DemoArgs {
    /// How many objects the simulated cluster holds (1 to 1,000,000); every event names one.
    #[arg(long, default_value = "200", value_name = "N", value_parser = integer::<usize, 1, 1_000_000>)]
    pub(super) objects: usize,

    /// How many change events the producers emit in all, spread over --duration
    /// (1 to 100,000,000).
    #[arg(long, default_value = "10000", value_name = "N", value_parser = integer::<u64, 1, 100_000_000>)]
    pub(super) events: u64,

    /// How many workers reconcile at once (1 to 1024).
    #[arg(long, default_value = "8", value_name = "N", value_parser = integer::<usize, 1, 1024>)]
    pub(super) workers: usize,

    /// The fraction of reconciles that fail and are retried with backoff, from 0 to 1
    /// (0.05 is 5%).
    #[arg(long, default_value = "0.05", value_name = "RATE", value_parser = failure_rate)]
    pub(super) failure_rate: f64,

    /// How long the producers emit events: 10s, 1500ms, 2m, or plain seconds (at most 1h).
    /// The run ends shortly after, once the queue has drained.
    #[arg(long, default_value = "10s", value_name = "TIME", value_parser = duration)]
    pub(super) duration: Duration,

    /// Seeds the simulation: the same seed emits the same events and fails the same
    /// reconciles.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub(super) seed: u64,

    /// How failed reconciles back off.
    #[arg(long, value_enum, default_value_t = Limiter::Default)]
    pub(super) limiter: Limiter,

    /// Retries before a failing object is given up (0 to 100).
    #[arg(long, default_value = "5", value_name = "N", value_parser = integer::<usize, 0, 100>)]
    pub(super) max_retries: usize,

    /// The longest simulated reconcile, in milliseconds (0 to 10,000); each one takes a
    /// random time up to this.
    #[arg(long, default_value = "20", value_name = "MS", value_parser = integer::<u64, 0, 10_000>)]
    pub(super) latency_ms: u64,

    /// Prints no live progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long)]
    pub(super) no_progress: bool,

    /// Serves the queue's metrics (Kubernetes' workqueue series) at
    /// http://ADDR/metrics while the demo runs, e.g. 127.0.0.1:9898 (port 0 picks a free one).
    #[arg(long, value_name = "ADDR")]
    pub(super) metrics_addr: Option<std::net::SocketAddr>,

    /// With --metrics-addr: keeps serving the metrics after the summary, until Ctrl-C.
    #[arg(long, requires = "metrics_addr")]
    pub(super) linger: bool,

    /// Runs the producers and workers against the Redis-backed queue at URL
    /// (redis://host:port/db (user:password@ before the host if needed), or rediss:// for TLS) instead of the
    /// in-memory one. Several processes may share it (see --workers-only).
    /// `--redis` alone takes the URL from $WQ_REDIS_URL (keep a password off the command line).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub(super) redis: Option<String>,

    /// Runs the producers and workers against the queue on PostgreSQL at URL
    /// (postgres://user:password@host:port/database; add ?sslmode=require for TLS) instead
    /// of the in-memory one. Several processes may share it (see --workers-only).
    /// `--postgres` alone takes the URL from $WQ_POSTGRES_URL (keep a password off the
    /// command line).
    #[arg(
        long,
        value_name = "URL",
        num_args = 0..=1,
        default_missing_value = "",
        conflicts_with = "redis"
    )]
    pub(super) postgres: Option<String>,

    /// With --redis or --postgres: the queue's name; every process of one demo uses the same.
    #[arg(long, value_name = "NAME", default_value = "demo", requires = "server")]
    pub(super) queue: String,

    /// With --redis or --postgres: runs only workers, on a queue another `wq demo` process
    /// on the same server produces into; ends when that process shuts the queue down.
    #[arg(long, requires = "server")]
    pub(super) workers_only: bool,
}

/// The rate limiters `--limiter` offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Limiter {
    /// client-go's default: per-object exponential 5 ms to 1000 s, and 10 retries/s overall
    /// with a burst of 100 (`rate_limiter::default_controller`).
    Default,
    /// The default with full jitter on the exponential part, so objects failing together
    /// retry apart.
    Jittered,
    /// Per-object exponential 5 ms to 1000 s alone (controller-runtime's default).
    Exponential,
    /// 5 ms for the first 3 retries of an object, then 500 ms.
    FastSlow,
}

impl Limiter {
    pub(super) fn build(self, seed: u64) -> Box<dyn RateLimiter<usize>> {
        let exponential =
            || ExponentialFailure::new(Duration::from_millis(5), Duration::from_secs(1000));
        match self {
            Limiter::Default => Box::new(rate_limiter::default_controller()),
            Limiter::Jittered => Box::new(MaxOf::new(vec![
                Box::new(Jitter::full(exponential()).with_seed(seed)),
                Box::new(TokenBucket::new(10.0, 100)),
            ])),
            Limiter::Exponential => Box::new(exponential()),
            Limiter::FastSlow => Box::new(FastSlow::new(
                Duration::from_millis(5),
                Duration::from_millis(500),
                3,
            )),
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Limiter::Default => "default (client-go's controller limiter)",
            Limiter::Jittered => "jittered",
            Limiter::Exponential => "exponential",
            Limiter::FastSlow => "fast-slow",
        }
    }
}

/// The longest `--duration` accepted.
const MAX_DURATION: Duration = Duration::from_secs(3600);

/// An integer from `MIN` to `MAX` (`_` may group its digits: `10_000`).
fn integer<T, const MIN: u64, const MAX: u64>(value: &str) -> Result<T, String>
where
    T: TryFrom<u64>,
{
    let refused = || format!("expected a whole number from {MIN} to {MAX}");
    let parsed: u64 = value
        .trim()
        .replace('_', "")
        .parse()
        .map_err(|_| refused())?;
    if !(MIN..=MAX).contains(&parsed) {
        return Err(format!("must be from {MIN} to {MAX}"));
    }
    T::try_from(parsed).map_err(|_| refused())
}

/// `--failure-rate`: a fraction from 0 to 1.
fn failure_rate(value: &str) -> Result<f64, String> {
    let rate: f64 = value
        .trim()
        .parse()
        .map_err(|_| "expected a number from 0 to 1 (0.1 is 10%)".to_owned())?;
    if !(0.0..=1.0).contains(&rate) {
        return Err("must be from 0 to 1 (0.1 is 10%)".to_owned());
    }
    Ok(rate)
}

/// `--duration`: `10s`, `1500ms`, `2m`, or plain seconds (`2.5`); above zero, at most an
/// hour.
fn duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let (number, unit) = match value.find(|c: char| c.is_ascii_alphabetic()) {
        Some(at) => value.split_at(at),
        None => (value, "s"),
    };
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        _ => return Err("expected a duration such as 10s, 1500ms or 2m".to_owned()),
    };
    let number: f64 = number
        .trim()
        .parse()
        .map_err(|_| "expected a duration such as 10s, 1500ms or 2m".to_owned())?;
    let seconds = number * scale;
    match Duration::try_from_secs_f64(seconds) {
        Ok(duration) if !duration.is_zero() && duration <= MAX_DURATION => Ok(duration),
        _ => Err("must be above zero and at most 1h".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_or_plain_seconds() {
        assert_eq!(duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration("2.5"), Ok(Duration::from_millis(2500)));
        assert!(duration("0s").is_err());
        assert!(duration("-1s").is_err());
        assert!(duration("2h").is_err());
        assert!(duration("soon").is_err());
    }

    #[test]
    fn out_of_range_numbers_are_refused() {
        let workers = integer::<usize, 1, 1024>;
        assert_eq!(workers("0"), Err("must be from 1 to 1024".to_owned()));
        assert_eq!(workers("8"), Ok(8));
        assert!(failure_rate("7").is_err());
        assert!(failure_rate("NaN").is_err());
        assert_eq!(failure_rate("0.25"), Ok(0.25));
        assert_eq!(integer::<u64, 1, 100_000_000>("10_000"), Ok(10_000));
        assert_eq!(
            integer::<usize, 1, 1_000_000>("-3"),
            Err("expected a whole number from 1 to 1000000".to_owned())
        );
    }
}
