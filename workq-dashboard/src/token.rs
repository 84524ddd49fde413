//! Tokens: [`generate_token`] makes one, [`check_token`] refuses one that is too weak to
//! guard the dashboard, and [`Failures`] slows down who guesses.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::client::{UNKNOWN_CLIENT, client_key};

/// The entropy a token must have, in bits.
pub const MIN_TOKEN_BITS: u32 = 128;

/// The characters a token may hold: URL-safe ("unreserved" in RFC 3986), so that it goes
/// into `?token=`, a cookie and a header as it is.
fn url_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~')
}

/// A random token: 43 letters and digits from the operating system's generator (256 bits),
/// as [`Config::token`](crate::Config::token) wants.
///
/// ```
/// let token = workq_dashboard::generate_token();
/// assert!(workq_dashboard::check_token(&token).is_ok());
/// ```
pub fn generate_token() -> String {
    use rand::RngExt;
    rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(43)
        .map(char::from)
        .collect()
}

/// Whether `token` can guard the dashboard: only URL-safe characters (`A-Z a-z 0-9 - . _ ~`),
/// and at least [`MIN_TOKEN_BITS`] bits of entropy if it was drawn at random from the smallest
/// usual alphabet that holds its characters (digits, hexadecimal, one case of letters and
/// digits, letters and digits, base64url, every URL-safe character), with no more repetition
/// than a random draw shows.
///
/// A check cannot know how a token was made: it refuses what is plainly too short or
/// patterned (`aaaa...`, `abcabc...`), and a long passphrase of words still passes. Make
/// tokens with [`generate_token`] or `openssl rand -hex 32`.
///
/// # Errors
///
/// Why the token is refused, and how to make one that is not (the message never holds the
/// token).
pub fn check_token(token: &str) -> Result<(), String> {
    const HOW: &str = "make one with `openssl rand -hex 32`, or leave it out and `wq dashboard` \
                       makes one";
    if let Some(c) = token.chars().find(|&c| !url_safe(c)) {
        return Err(format!(
            "the token holds {c:?}, which is not URL-safe (A-Z a-z 0-9 - . _ ~ only: it goes \
             into ?token=, a cookie and a header): {HOW}"
        ));
    }
    let has = |f: fn(char) -> bool| token.chars().any(f);
    let lower = has(|c| c.is_ascii_lowercase());
    let upper = has(|c| c.is_ascii_uppercase());
    let digit = has(|c| c.is_ascii_digit());
    let dash_underscore = has(|c| matches!(c, '-' | '_'));
    let dot_tilde = has(|c| matches!(c, '.' | '~'));
    let hex = token
        .chars()
        .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        || token
            .chars()
            .all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c));
    let alphabet: u32 = if dot_tilde {
        66
    } else if dash_underscore {
        64
    } else if lower && upper {
        62
    } else if lower || upper {
        if hex && digit {
            16
        } else if digit {
            36
        } else {
            26
        }
    } else {
        10
    };
    let length = token.chars().count();
    let bits = (length as f64 * f64::from(alphabet).log2()).floor() as u32;
    if bits < MIN_TOKEN_BITS {
        return Err(format!(
            "the token is too weak: {length} characters of an alphabet of {alphabet} make at \
             most {bits} bits, and it needs {MIN_TOKEN_BITS}: {HOW}"
        ));
    }
    // A random draw of `length` from `alphabet` shows about this many distinct characters;
    // fewer than half of that is a pattern, not chance.
    let expected =
        f64::from(alphabet) * (1.0 - (1.0 - 1.0 / f64::from(alphabet)).powi(length as i32));
    let mut seen: Vec<char> = token.chars().collect();
    seen.sort_unstable();
    seen.dedup();
    if (seen.len() as f64) < expected / 2.0 {
        return Err(format!(
            "the token is too weak: it repeats a few characters ({} distinct in {length}), \
             as no random token does: {HOW}",
            seen.len()
        ));
    }
    Ok(())
}

/// Failed attempts a client may make before its answers are slowed down (typos).
const FREE_FAILURES: u32 = 5;

/// The longest an answer to a failed attempt is held.
const MAX_DELAY: Duration = Duration::from_secs(5);

/// A client's failures are forgotten this long after its last one.
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// The most clients whose failures are kept; past that, the failures of clients not kept
/// are counted together (under [`UNKNOWN_CLIENT`]), so memory stays bounded whatever
/// the number of addresses an attacker sends from.
const MAX_CLIENTS: usize = 10_000;

/// Failed attempts by client ([`client_key`]: an IPv6 /64 is one client), to slow down
/// whoever guesses tokens: each failure after the first [`FREE_FAILURES`] is answered later,
/// twice as late each time, up to [`MAX_DELAY`].
///
/// Hand-written rather than a rate-limiting crate's keyed limiter: those refuse requests
/// over a rate, which here would refuse an operator who shares an address (a proxy, a NAT)
/// with a guesser; this holds only the failed answers back, bounds its memory by itself,
/// and needs no sweeping task.
#[derive(Default)]
pub(crate) struct Failures {
    clients: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

impl Failures {
    /// Records a failed attempt from `addr`; returns how long to hold its answer.
    pub(crate) fn fail(&self, addr: Option<IpAddr>) -> Duration {
        let now = Instant::now();
        let mut key = addr.map_or(UNKNOWN_CLIENT, client_key);
        let mut clients = self.clients.lock();
        if !clients.contains_key(&key) && clients.len() >= MAX_CLIENTS {
            clients.retain(|_, (_, last)| now.duration_since(*last) < FORGET_AFTER);
            if clients.len() >= MAX_CLIENTS {
                key = UNKNOWN_CLIENT;
            }
        }
        let entry = clients.entry(key).or_insert((0, now));
        if now.duration_since(entry.1) >= FORGET_AFTER {
            entry.0 = 0;
        }
        entry.0 = entry.0.saturating_add(1);
        entry.1 = now;
        let over = entry.0.saturating_sub(FREE_FAILURES);
        if over == 0 {
            return Duration::ZERO;
        }
        let delay = Duration::from_millis(100).saturating_mul(1u32 << over.min(10));
        delay.min(MAX_DELAY)
    }

    /// How many clients are kept.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.clients.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_or_unsafe_tokens_are_refused() {
        assert!(check_token("t").unwrap_err().contains("too weak"));
        assert!(
            check_token("s3cret-token")
                .unwrap_err()
                .contains("too weak")
        );
        assert!(
            check_token(&"a".repeat(64))
                .unwrap_err()
                .contains("repeats")
        );
        assert!(
            check_token(&"ab".repeat(40))
                .unwrap_err()
                .contains("repeats")
        );
        assert!(check_token("abc;def").unwrap_err().contains("URL-safe"));
        assert!(
            check_token("abc\r\nSet-Cookie: x=1")
                .unwrap_err()
                .contains("URL-safe")
        );
        assert!(check_token("tok%20en").unwrap_err().contains("URL-safe"));
        // 31 hex digits: 124 bits.
        assert!(check_token("3f9a0c1e7b2d48a6905c3e1f7a2b4d6").is_err());
        // `openssl rand -hex 16`: 128 bits.
        assert!(check_token("3f9a0c1e7b2d48a6905c3e1f7a2b4d6c").is_ok());
        assert!(check_token("Zq3Xv9KpL2mN8rT4wY6bC1dF5gH7jQ0sU").is_ok());
        for _ in 0..1_000 {
            let t = generate_token();
            assert_eq!(t.len(), 43);
            assert!(check_token(&t).is_ok(), "{t}");
        }
        assert!(
            !check_token("abc;def-secret")
                .unwrap_err()
                .contains("secret")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_slowed_down_per_client_in_bounded_memory() {
        let f = Failures::default();
        let a = Some("203.0.113.1".parse().unwrap());
        let delays: Vec<_> = (0..9).map(|_| f.fail(a)).collect();
        assert_eq!(&delays[..5], &[Duration::ZERO; 5]);
        assert_eq!(delays[5], Duration::from_millis(200));
        assert_eq!(delays[8], Duration::from_millis(1600));
        assert_eq!(f.fail(Some("203.0.113.2".parse().unwrap())), Duration::ZERO);
        for _ in 0..20 {
            f.fail(a);
        }
        assert_eq!(f.fail(a), MAX_DELAY);
        tokio::time::advance(FORGET_AFTER).await;
        assert_eq!(f.fail(a), Duration::ZERO, "forgotten");
        // One /64 is one client.
        let v6 = |i: u16| {
            Some(IpAddr::V6(std::net::Ipv6Addr::new(
                0x2001, 0xdb8, 0, 1, 0, 0, 0, i,
            )))
        };
        for i in 0..6 {
            f.fail(v6(i));
        }
        assert!(f.fail(v6(99)) > Duration::ZERO);
        // Many addresses: the memory stays bounded, and the rest are counted together.
        for i in 0..(MAX_CLIENTS as u32 + 500) {
            f.fail(Some(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i))));
        }
        assert!(f.kept() <= MAX_CLIENTS + 1, "{}", f.kept());
        assert!(
            f.fail(Some("198.51.100.1".parse().unwrap())) > Duration::ZERO,
            "counted together"
        );
    }
}
