//! Value parsers for `wq demo`'s flags: each refuses an out-of-range value with a sentence
//! clap prints after "invalid value", and clap exits with code 2.

use std::time::Duration;

/// The longest `--duration` accepted.
const MAX_DURATION: Duration = Duration::from_secs(3600);

/// An integer within `min..=max`.
fn integer<T>(value: &str, min: T, max: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    let parsed: T = value
        .trim()
        .replace('_', "")
        .parse()
        .map_err(|_| format!("expected a whole number from {min} to {max}"))?;
    if parsed < min || parsed > max {
        return Err(format!("must be from {min} to {max}"));
    }
    Ok(parsed)
}

/// `--objects`: 1 to 1,000,000.
pub(super) fn objects(value: &str) -> Result<usize, String> {
    integer(value, 1, 1_000_000)
}

/// `--events`: 1 to 100,000,000.
pub(super) fn events(value: &str) -> Result<u64, String> {
    integer(value, 1, 100_000_000)
}

/// `--workers`: 1 to 1024.
pub(super) fn workers(value: &str) -> Result<usize, String> {
    integer(value, 1, 1024)
}

/// `--max-retries`: 0 to 100.
pub(super) fn max_retries(value: &str) -> Result<usize, String> {
    integer(value, 0, 100)
}

/// `--latency-ms`: 0 to 10,000.
pub(super) fn latency_ms(value: &str) -> Result<u64, String> {
    integer(value, 0, 10_000)
}

/// `--failure-rate`: a fraction from 0 to 1.
pub(super) fn failure_rate(value: &str) -> Result<f64, String> {
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
pub(super) fn duration(value: &str) -> Result<Duration, String> {
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
        assert!(workers("0").is_err());
        assert_eq!(workers("8"), Ok(8));
        assert!(failure_rate("7").is_err());
        assert!(failure_rate("NaN").is_err());
        assert_eq!(failure_rate("0.25"), Ok(0.25));
        assert_eq!(events("10_000"), Ok(10_000));
        assert!(objects("-3").is_err());
    }
}
