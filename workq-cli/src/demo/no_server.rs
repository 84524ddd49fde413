//! `wq demo --redis URL` / `--postgres URL` when no server answers at the URL: a clear
//! message at once (rather than the client's retries and a pool timeout), and for a server on
//! this machine the one command that starts one (installing the Debian package first if it
//! is missing).

use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};

use super::install::{
    POSTGRES_PACKAGE, POSTGRES_ROOT, REDIS_PACKAGE, effective_uid, find_in, install_command,
    newest_postgres, path_dirs,
};
use std::str::FromStr;
use std::time::Duration;

/// How long the probe waits for a connection.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A server's address, from its URL: `None` for a Unix socket or a URL the client will refuse
/// itself (with its own message).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Address {
    pub(super) host: String,
    pub(super) port: u16,
    /// `rediss://`: a plain `redis-server` would not do.
    pub(super) tls: bool,
    /// The user and database of a PostgreSQL URL.
    pub(super) user: String,
    pub(super) database: String,
}

impl Address {
    pub(super) fn of_redis(url: &str) -> Option<Address> {
        use redis::{ConnectionAddr, IntoConnectionInfo};
        let info = url.into_connection_info().ok()?;
        let (host, port, tls) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => (host.clone(), *port, false),
            ConnectionAddr::TcpTls { host, port, .. } => (host.clone(), *port, true),
            _ => return None,
        };
        Some(Address {
            host,
            port,
            tls,
            ..Address::default()
        })
    }

    pub(super) fn of_postgres(url: &str) -> Option<Address> {
        let options = sqlx::postgres::PgConnectOptions::from_str(url).ok()?;
        if options.get_socket().is_some() {
            return None;
        }
        Some(Address {
            host: options.get_host().to_owned(),
            port: options.get_port(),
            tls: false,
            user: options.get_username().to_owned(),
            database: options.get_database().unwrap_or("").to_owned(),
        })
    }

    /// Whether the host is this machine.
    fn is_local(&self) -> bool {
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
    }

    /// Why nothing answers at the address, or `None` when something does.
    fn refused(&self) -> Option<String> {
        let addrs = match (self.host.as_str(), self.port).to_socket_addrs() {
            Ok(addrs) => addrs.collect::<Vec<_>>(),
            Err(e) => return Some(format!("cannot resolve {}: {e}", self.host)),
        };
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, PROBE_TIMEOUT) {
                Ok(_) => return None,
                Err(e) => last = Some(e),
            }
        }
        Some(last.map_or_else(|| "no address".to_owned(), |e| e.to_string()))
    }
}

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Redis,
    Postgres,
}

impl Kind {
    /// The address of a URL of this server.
    fn address(self, url: &str) -> Option<Address> {
        match self {
            Kind::Redis => Address::of_redis(url),
            Kind::Postgres => Address::of_postgres(url),
        }
    }
}

/// The message when nothing answers at `url`, or `None` when a server does (or the URL is
/// not a TCP one: the client then speaks for itself).
pub(super) fn check(kind: Kind, url: &str) -> Option<String> {
    let address = kind.address(url)?;
    let why = address.refused()?;
    Some(message(kind, &address, &why, &Machine::current()))
}

/// The message after `--redis` / `--postgres` without a URL (and none in the environment):
/// how to start a server on this machine, on the default port, and the URL to give.
pub(super) fn without_url(kind: Kind) -> String {
    let (url, flag) = match kind {
        Kind::Redis => ("redis://127.0.0.1:6379/", "--redis"),
        Kind::Postgres => ("postgres://postgres@127.0.0.1:5432/postgres", "--postgres"),
    };
    let (address, machine) = (kind.address(url).expect("a valid URL"), Machine::current());
    let command = match kind {
        Kind::Redis => redis_command(address.port, &machine),
        Kind::Postgres => postgres_command(&address, &machine).expect("plain names"),
    };
    format!(
        "wq demo: to try it on a server of this machine, start one:\n\n    {command}\n\nthen run: \
         wq demo {flag} {url}"
    )
}

/// What the start command depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Machine {
    pub(super) root: bool,
    /// `redis-server` on the `PATH`.
    pub(super) redis_server: bool,
    /// The directory of PostgreSQL's `initdb` and `pg_ctl`, if installed.
    pub(super) postgres_bin: Option<PathBuf>,
}

impl Machine {
    /// PostgreSQL's `bin` directory in a command: where it is, or `$B` where the command
    /// looks for it.
    fn bin(&self) -> String {
        self.postgres_bin
            .as_ref()
            .map_or_else(|| "$B".to_owned(), |b| b.display().to_string())
    }

    fn current() -> Machine {
        let path = path_dirs();
        Machine {
            // `initdb` and `postgres` refuse to run as root.
            root: effective_uid() == Some(0),
            redis_server: find_in(&path, "redis-server").is_some(),
            postgres_bin: find_in(&path, "initdb")
                .and_then(|f| f.parent().map(Path::to_path_buf))
                .or_else(|| newest_postgres(Path::new(POSTGRES_ROOT))),
        }
    }
}

/// The message: what is wrong and, for this machine, the command that starts a server.
pub(super) fn message(kind: Kind, address: &Address, why: &str, machine: &Machine) -> String {
    let name = match kind {
        Kind::Redis => "Redis",
        Kind::Postgres => "PostgreSQL",
    };
    let at = format!("{}:{}", address.host, address.port);
    let mut text = format!("no {name} server answers at {at} ({why}).");
    let start = match kind {
        _ if !address.is_local() => None,
        Kind::Redis if address.tls => None,
        Kind::Redis => Some(redis_command(address.port, machine)),
        Kind::Postgres => postgres_command(address, machine),
    };
    match start {
        Some(command) => {
            text += &format!(
                " Start one on this machine, then run this again:\n\n    {command}\n\n{}",
                stop_note(kind, address, machine)
            );
        }
        None => text += " Is the server up, and is the URL right?",
    }
    text
}

/// What the started server is and how to stop it.
fn stop_note(kind: Kind, address: &Address, machine: &Machine) -> String {
    let port = address.port;
    match kind {
        Kind::Redis => {
            format!("(no persistence; stop it with: redis-cli -p {port} shutdown nosave)")
        }
        Kind::Postgres => {
            let stop = format!("{}/pg_ctl -D {} stop", machine.bin(), postgres_dir(port));
            let stop = if machine.root {
                format!("runuser -u postgres -- {stop}")
            } else {
                stop
            };
            format!(
                "(a throwaway cluster in {} that trusts local connections; stop it with: {stop})",
                postgres_dir(port)
            )
        }
    }
}

/// The throwaway cluster's data directory.
fn postgres_dir(port: u16) -> String {
    format!("/tmp/wq-demo-postgres-{port}")
}

/// Starts `redis-server` in the background on `port`, without persistence.
fn redis_command(port: u16, machine: &Machine) -> String {
    let start = format!("redis-server --port {port} --save '' --appendonly no --daemonize yes");
    if machine.redis_server {
        start
    } else {
        format!(
            "{} && {start}",
            install_command(&[REDIS_PACKAGE], machine.root)
        )
    }
}

/// `word` as one shell word, both on its own and inside the single quotes of `sh -c '...'`:
/// as it is, or in double quotes; `None` if it holds a quote, a dollar, a backslash or a
/// backquote.
fn shell_word(word: &str) -> Option<String> {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
    {
        Some(word.to_owned())
    } else if word
        .chars()
        .any(|c| "'\"$\\`".contains(c) || c.is_control())
    {
        None
    } else {
        Some(format!("\"{word}\""))
    }
}

/// Makes a throwaway PostgreSQL cluster (trust authentication, the URL's user as superuser)
/// and starts it on the URL's port; creates the URL's database if it is not `postgres`. As
/// root it runs as the user `postgres`, as PostgreSQL refuses root. `None` for a user or
/// database name no shell word can carry.
fn postgres_command(address: &Address, machine: &Machine) -> Option<String> {
    let port = address.port;
    let user = shell_word(if address.user.is_empty() {
        "postgres"
    } else {
        &address.user
    })?;
    let dir = postgres_dir(port);
    let bin = machine.bin();
    let mut steps = format!(
        "{bin}/initdb -D {dir} -U {user} --auth=trust && {bin}/pg_ctl -D {dir} -o \"-p {port} \
         -k /tmp\" -l {dir}.log start"
    );
    if !address.database.is_empty() && address.database != "postgres" {
        steps += &format!(
            " && {bin}/createdb -h 127.0.0.1 -p {port} -U {user} {}",
            shell_word(&address.database)?
        );
    }
    if machine.postgres_bin.is_none() {
        steps = format!("B=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1) && {steps}");
    }
    if machine.root {
        steps = format!("runuser -u postgres -- sh -c '{steps}'");
    }
    if machine.postgres_bin.is_none() {
        steps = format!(
            "{} && {steps}",
            install_command(&[POSTGRES_PACKAGE], machine.root)
        );
    }
    Some(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(root: bool, installed: bool) -> Machine {
        Machine {
            root,
            redis_server: installed,
            postgres_bin: installed.then(|| PathBuf::from("/usr/lib/postgresql/15/bin")),
        }
    }

    #[test]
    fn urls_give_their_address() {
        let redis = Address::of_redis("redis://:secret@127.0.0.1:6390/2").unwrap();
        assert_eq!(
            (redis.host.as_str(), redis.port, redis.tls),
            ("127.0.0.1", 6390, false)
        );
        assert!(Address::of_redis("rediss://localhost:6390/").unwrap().tls);
        assert_eq!(Address::of_redis("redis+unix:///tmp/redis.sock"), None);
        let pg = Address::of_postgres("postgres://alice:pw@localhost:5433/jobs").unwrap();
        assert_eq!(
            (
                pg.host.as_str(),
                pg.port,
                pg.user.as_str(),
                pg.database.as_str()
            ),
            ("localhost", 5433, "alice", "jobs")
        );
        assert_eq!(
            Address::of_postgres("postgres:///jobs?host=/var/run/postgresql"),
            None
        );
    }

    #[test]
    fn a_local_redis_gets_the_command_that_starts_one() {
        let address = Address::of_redis("redis://127.0.0.1:6390/").unwrap();
        let text = message(
            Kind::Redis,
            &address,
            "Connection refused",
            &machine(false, true),
        );
        assert!(text.contains("no Redis server answers at 127.0.0.1:6390 (Connection refused)"));
        assert!(text.contains(
            "\n    redis-server --port 6390 --save '' --appendonly no --daemonize yes\n"
        ));
        let missing = message(Kind::Redis, &address, "refused", &machine(false, false));
        assert!(missing.contains(
            "sudo apt-get update && sudo apt-get install -y --no-install-recommends \
                 redis-server && redis-server --port 6390"
        ));
        let as_root = message(Kind::Redis, &address, "refused", &machine(true, false));
        assert!(as_root.contains(
            "\n    apt-get update && apt-get install -y --no-install-recommends redis-server && "
        ));
    }

    #[test]
    fn a_local_postgres_gets_the_command_that_starts_one() {
        let address = Address::of_postgres("postgres://postgres@localhost:5440/postgres").unwrap();
        let text = message(Kind::Postgres, &address, "refused", &machine(false, true));
        assert!(text.contains(
            "\n    /usr/lib/postgresql/15/bin/initdb -D /tmp/wq-demo-postgres-5440 -U postgres \
             --auth=trust && /usr/lib/postgresql/15/bin/pg_ctl -D /tmp/wq-demo-postgres-5440 -o \
             \"-p 5440 -k /tmp\" -l /tmp/wq-demo-postgres-5440.log start\n"
        ));
        let as_root = message(Kind::Postgres, &address, "refused", &machine(true, true));
        assert!(
            as_root
                .contains("\n    runuser -u postgres -- sh -c '/usr/lib/postgresql/15/bin/initdb")
        );
        let missing = message(Kind::Postgres, &address, "refused", &machine(false, false));
        assert!(missing.contains(
            "\n    sudo apt-get update && sudo apt-get install -y --no-install-recommends \
             postgresql && B=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1) && \
             $B/initdb"
        ));
        // Another user and database: initdb makes the user, createdb the database.
        let other = Address::of_postgres("postgres://alice@127.0.0.1:5440/jobs").unwrap();
        let text = message(Kind::Postgres, &other, "refused", &machine(false, true));
        assert!(text.contains("-U alice --auth=trust"));
        assert!(text.contains("createdb -h 127.0.0.1 -p 5440 -U alice jobs"));
        // Names with spaces are quoted (in double quotes, which also hold inside sh -c '...');
        // names a shell word cannot carry get no command.
        let spaced = Address::of_postgres("postgres://a%20b@127.0.0.1:5440/my%20db").unwrap();
        let text = message(Kind::Postgres, &spaced, "refused", &machine(true, true));
        assert!(text.contains("-U \"a b\" --auth=trust"), "{text}");
        assert!(text.contains("-U \"a b\" \"my db\"'"), "{text}");
        let quoted = Address::of_postgres("postgres://u@127.0.0.1:5440/it%27s").unwrap();
        let text = message(Kind::Postgres, &quoted, "refused", &machine(false, true));
        assert!(!text.contains("initdb"), "{text}");
        assert!(text.contains("Is the server up"), "{text}");
    }

    #[test]
    fn a_remote_or_tls_server_gets_no_start_command() {
        let remote = Address::of_redis("redis://10.1.2.3:6379/").unwrap();
        let text = message(Kind::Redis, &remote, "timed out", &machine(false, true));
        assert!(text.contains("no Redis server answers at 10.1.2.3:6379 (timed out)"));
        assert!(text.contains("Is the server up"));
        assert!(!text.contains("redis-server"));
        let tls = Address::of_redis("rediss://127.0.0.1:6379/").unwrap();
        assert!(
            !message(Kind::Redis, &tls, "refused", &machine(false, true)).contains("redis-server")
        );
    }

    #[test]
    fn the_probe_tells_a_listening_port_from_a_closed_one() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = format!("redis://127.0.0.1:{port}/");
        assert_eq!(check(Kind::Redis, &url), None);
        drop(listener);
        let text = check(Kind::Redis, &url).expect("nothing listens now");
        assert!(text.contains(&format!("--port {port}")), "{text}");
    }
}
