//! Servers of a test's own: each on a free loopback port, with its data in a fresh temporary
//! directory, stopped by PID when dropped. A missing server program fails the test, naming
//! the Debian package to install, unless skipped knowingly outside CI (`WQ_SKIP_REDIS_TESTS`,
//! `WQ_SKIP_PG_TESTS`, `WQ_SKIP_NGINX_TESTS` set to `1`; never under `CI=true`).

pub mod nginx;
pub mod postgres;
pub mod redis;

use std::net::TcpListener;

/// A free loopback port: the kernel's choice, released before the server binds it.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
