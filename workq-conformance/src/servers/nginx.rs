//! An nginx of the test's own in front of a dashboard, with nginx's defaults (`proxy_pass`
//! alone: `Host` rewritten to the upstream's address, no `X-Forwarded-*` header).
//!
//! Needs the Debian package `nginx` (`$WQ_NGINX`, else `/usr/sbin/nginx`). Without it the
//! test fails, naming the package; outside CI, `WQ_SKIP_NGINX_TESTS=1` skips it knowingly.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Set to `1` (outside CI) to skip the nginx tests knowingly when nginx is missing.
pub const SKIP_VAR: &str = "WQ_SKIP_NGINX_TESTS";

/// The nginx binary, or `None` when it is missing and the test is skipped knowingly.
pub fn nginx_binary() -> Option<PathBuf> {
    let path =
        std::env::var("WQ_NGINX").map_or_else(|_| PathBuf::from("/usr/sbin/nginx"), PathBuf::from);
    if path.exists() {
        return Some(path);
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !ci && std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        eprintln!("note: no nginx; {SKIP_VAR}=1, so the proxy test does not run");
        return None;
    }
    panic!(
        "{} not found: the proxy test needs the Debian package nginx (apt-get install nginx); \
         outside CI, set {SKIP_VAR}=1 to skip it knowingly",
        path.display()
    );
}

/// An nginx of the test's own, in a directory of its own, stopped by PID when dropped.
#[derive(Debug)]
pub struct Nginx {
    child: Child,
    dir: PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// nginx on `port`, proxying each location to its upstream with nothing but `proxy_pass`.
pub fn start(binary: &PathBuf, port: u16, locations: &[(&str, SocketAddr)]) -> Nginx {
    let dir = std::env::temp_dir().join(format!("wq-nginx-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    let proxied: String = locations
        .iter()
        .map(|(path, upstream)| format!("location {path} {{ proxy_pass http://{upstream}/; }}\n"))
        .collect();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\n\
         error_log {d}/error.log;\nevents {{ worker_connections 64; }}\nhttp {{\n\
         access_log off;\nclient_body_temp_path {d}/body;\nproxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\nuwsgi_temp_path {d}/uwsgi;\nscgi_temp_path {d}/scgi;\n\
         server {{\nlisten 127.0.0.1:{port};\n{proxied}}}\n}}\n"
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let child = Command::new(binary)
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&conf_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run nginx");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nginx did not listen; see {d}/error.log"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Nginx { child, dir }
}
