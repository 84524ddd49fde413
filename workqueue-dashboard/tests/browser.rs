//! The dashboard in a real browser: headless Chromium, driven through `chromedriver`
//! (WebDriver), against a live dashboard over a live `redis-server`.
//!
//! Needs the Debian packages `chromium` and `chromium-driver` (paths: `$WQ_CHROMIUM`,
//! `$WQ_CHROMEDRIVER`, else `/usr/bin/chromium`, `/usr/bin/chromedriver`). Without them the
//! test fails, naming the packages; outside CI, `WQ_SKIP_BROWSER_TESTS=1` skips it knowingly.

mod support;

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{ClientBuilder, Locator};
use workqueue::TryGet;
use workqueue_dashboard::{Config, RedisSource, router};
use workqueue_redis::RedisQueue;

const SKIP_VAR: &str = "WQ_SKIP_BROWSER_TESTS";

fn path_of(var: &str, default: &str) -> PathBuf {
    std::env::var(var).map_or_else(|_| PathBuf::from(default), PathBuf::from)
}

/// The browser and its driver, or `None` when they are missing and the test is skipped
/// knowingly; a missing browser fails the test otherwise (always under `CI=true`).
fn require_browser() -> Option<(PathBuf, PathBuf)> {
    let chromium = path_of("WQ_CHROMIUM", "/usr/bin/chromium");
    let driver = path_of("WQ_CHROMEDRIVER", "/usr/bin/chromedriver");
    if chromium.exists() && driver.exists() {
        return Some((chromium, driver));
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if !ci && std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        eprintln!("note: no chromium/chromedriver; {SKIP_VAR}=1, so the browser test does not run");
        return None;
    }
    panic!(
        "{} or {} not found: the browser test needs the Debian packages chromium and \
         chromium-driver (apt-get install chromium chromium-driver); outside CI, set \
         {SKIP_VAR}=1 to skip it knowingly",
        chromium.display(),
        driver.display()
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `chromedriver` and the browsers it starts, stopped by PID when dropped.
struct Driver {
    child: Child,
    profile: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The browser processes of this test are the ones naming its own profile directory.
        let marker = self.profile.display().to_string();
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                if String::from_utf8_lossy(&cmdline).contains(&marker) {
                    let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
                }
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn screenshots_dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
        PathBuf::from,
    );
    let dir = target.join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).expect("create the screenshot directory");
    dir
}

async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_figures_requeues_dead_letters_and_pauses() {
    let Some((chromium, driver_bin)) = require_browser() else {
        return;
    };
    let Some(server) = support::redis_server(&[]) else {
        return;
    };

    // A queue with two dead letters, one failing item, one lease out and three ready items.
    let text: RedisQueue<String> = RedisQueue::builder("orders")
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap();
    let q: RedisQueue<u32> = RedisQueue::builder("orders")
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap();
    text.add("bad-1".to_owned()).await.unwrap();
    text.add("bad-2".to_owned()).await.unwrap();
    assert!(q.try_get().await.unwrap().is_empty());
    assert!(q.try_get().await.unwrap().is_empty());
    for i in 1..=4 {
        q.add(i).await.unwrap();
    }
    q.add_rate_limited(42).await.unwrap();
    let lease = q.get().await.unwrap().unwrap();

    // The dashboard on a free loopback port.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/", listener.local_addr().unwrap());
    let config = Config {
        sample_every: Duration::from_millis(250),
        ..Config::default()
    };
    let app = router(RedisSource::new(&server.url(), "wq").unwrap(), config);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // chromedriver, and Chromium through it.
    let port = free_port();
    let profile = std::env::temp_dir().join(format!(
        "wq-dashboard-chromium-{}-{port}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&profile);
    std::fs::create_dir_all(&profile).unwrap();
    let child = Command::new(&driver_bin)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run chromedriver");
    let _driver = Driver {
        child,
        profile: profile.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium.display().to_string(),
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--window-size=1280,1100",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    let browser = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium session");

    browser.goto(&format!("{base}#orders")).await.unwrap();
    let cell = |field: &'static str| {
        let browser = browser.clone();
        async move {
            let css = format!("tr[data-queue=\"orders\"] td[data-field=\"{field}\"]");
            match browser.find(Locator::Css(&css)).await {
                Ok(e) => e.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            }
        }
    };
    until("the page shows the queue's figures", || async {
        cell("depth").await == "3" && cell("dead").await == "2"
    })
    .await;
    assert_eq!(cell("in_flight").await, "1");
    assert_eq!(cell("failing").await, "1");
    assert_eq!(cell("state").await, "running");
    let rows = browser
        .find_all(Locator::Css("#dead tr.dead-letter"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows[0].text().await.unwrap().contains("bad-1"));
    // Let the charts gather a few samples, then keep a picture of the page.
    until("the charts have samples", || async {
        browser
            .find_all(Locator::Css("svg[data-chart] polyline"))
            .await
            .is_ok_and(|p| p.len() >= 4)
    })
    .await;
    // Some traffic for the charts: adds, completions and failures over three seconds.
    for i in 0..30u32 {
        q.add(100 + i).await.unwrap();
        if i % 3 == 0 {
            q.add_rate_limited(200 + i).await.unwrap();
        }
        if i % 2 == 0
            && let TryGet::Leased(done) = q.try_get().await.unwrap()
        {
            done.done().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let png = browser.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    std::fs::write(screenshots_dir().join("dashboard.png"), &png).unwrap();

    // "Requeue all" empties the dead letters.
    let click = |css: &'static str| {
        let browser = browser.clone();
        async move {
            // The page redraws every poll: find the button again if it went stale.
            for _ in 0..20 {
                if let Ok(button) = browser.find(Locator::Css(css)).await
                    && button.click().await.is_ok()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("could not click {css}");
        }
    };
    click("button[data-action=\"requeue-all\"]").await;
    until("the dead letters are requeued", || async {
        q.stats(10).await.unwrap().dead == 0
    })
    .await;
    until("the page shows no dead letter", || async {
        cell("dead").await == "0"
    })
    .await;
    assert!(
        q.stats(10).await.unwrap().depth >= 5,
        "three items and the two requeued"
    );

    // "Pause" stops delivery; "Resume" restarts it.
    click("button[data-action=\"pause\"]").await;
    until("the queue is paused", || async {
        q.is_paused().await.unwrap()
    })
    .await;
    until("the page shows the pause", || async {
        cell("state").await == "paused"
    })
    .await;
    assert!(q.try_get().await.unwrap().is_empty());
    let before = q.len().await.unwrap();
    q.add(5).await.unwrap();
    assert_eq!(
        q.len().await.unwrap(),
        before + 1,
        "adds are still taken while paused"
    );
    assert!(q.try_get().await.unwrap().is_empty());
    let png = browser.screenshot().await.unwrap();
    std::fs::write(screenshots_dir().join("dashboard-paused.png"), &png).unwrap();
    click("button[data-action=\"resume\"]").await;
    until("the queue runs again", || async {
        !q.is_paused().await.unwrap()
    })
    .await;
    let next = q
        .try_get()
        .await
        .unwrap()
        .into_lease()
        .expect("delivery resumed");
    next.done().await.unwrap();
    lease.done().await.unwrap();

    browser.close().await.unwrap();
}
