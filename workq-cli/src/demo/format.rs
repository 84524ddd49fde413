//! How the demo writes its figures: counts with thousands separators, durations in the unit
//! that reads best, lists of objects cut short.

use std::time::Duration;

use indicatif::HumanCount;

/// `1234567` as `1,234,567`.
pub(super) fn count(n: u64) -> String {
    HumanCount(n).to_string()
}

/// A duration in the unit that reads best: `850 µs`, `12.3 ms`, `4.56 s`.
pub(super) fn duration(d: Duration) -> String {
    let micros = d.as_secs_f64() * 1e6;
    if micros < 1000.0 {
        format!("{micros:.0} µs")
    } else if micros < 1e6 {
        format!("{:.1} ms", micros / 1e3)
    } else {
        format!("{:.2} s", micros / 1e6)
    }
}

/// Up to five object numbers, then how many more.
pub(super) fn list(objects: &[usize]) -> String {
    let mut shown: Vec<String> = objects.iter().take(5).map(ToString::to_string).collect();
    if objects.len() > 5 {
        shown.push(format!("and {} more", objects.len() - 5));
    }
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_get_thousands_separators() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
    }

    #[test]
    fn durations_pick_a_readable_unit() {
        assert_eq!(duration(Duration::from_micros(850)), "850 µs");
        assert_eq!(duration(Duration::from_micros(12_340)), "12.3 ms");
        assert_eq!(duration(Duration::from_millis(4560)), "4.56 s");
    }
}
