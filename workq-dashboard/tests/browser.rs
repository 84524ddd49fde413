//! The dashboard in a real browser: headless Chromium, driven through `chromedriver`
//! (WebDriver), against a live dashboard over a live `redis-server` and a live PostgreSQL:
//! figures and charts, pagination and search through a long dead-letter list, one item's
//! detail and its actions, a restart of Redis while the page is open, the pause toggle, a
//! PostgreSQL queue beside a Redis one (its figures, its actions, a restart of PostgreSQL),
//! and the page of both at a phone's and a desktop's width in the light and the dark theme
//! (screenshots in `target/dashboard-screenshots/`).
//!
//! The sources are put together with [`Dashboard`], as `wq dashboard` does.
//!
//! Needs the Debian packages `chromium` and `chromium-driver` (paths: `$WQ_CHROMIUM`,
//! `$WQ_CHROMEDRIVER`, else `/usr/bin/chromium`, `/usr/bin/chromedriver`). Without them the
//! test fails, naming the packages; outside CI, `WQ_SKIP_BROWSER_TESTS=1` skips it knowingly.

mod support;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use workq::TryGet;
use workq_conformance::servers::free_port;
use workq_dashboard::{Config, Dashboard};
use workq_postgres::{PgAdmin, PgQueue};
use workq_redis::RedisAdmin;
use workq_redis::RedisQueue;

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

/// One browser at a time: each test starts its own, and two at once would crowd two cores.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The dashboard of `dashboard` on a free loopback port, served as `wq dashboard` serves
/// it; returns the address `wq dashboard` prints, with the token: a visit sets the cookie
/// and goes on to the page (a `#fragment` after it survives the redirect).
async fn serve(dashboard: Dashboard) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!(
        "http://{}/?token={}",
        listener.local_addr().unwrap(),
        support::TOKEN
    );
    let app = dashboard.router().unwrap();
    tokio::spawn(workq_dashboard::Server::new(listener).serve(app));
    base
}

/// The sources of a test: the queues under `wq` on `server`.
fn redis_dashboard(server: &support::RedisServer, config: Config) -> Dashboard {
    Dashboard::new(config).source(RedisAdmin::new(&server.url(), "wq").unwrap())
}

/// The queues of `server` and of `pg` side by side, served as [`serve`] does.
async fn serve_both(server: &support::RedisServer, pg: &support::PgServer) -> String {
    let postgres = PgAdmin::new(&pg.url())
        .unwrap()
        .application_name("wq-dashboard");
    serve(redis_dashboard(server, fast()).source(postgres)).await
}

fn fast() -> Config {
    Config {
        sample_every: Duration::from_millis(250),
        token: Some(support::TOKEN.into()),
        ..Config::default()
    }
}

/// A headless Chromium of its own (stopped when dropped), `dark` or light, at a window size.
struct Browser {
    client: Client,
    _driver: Driver,
}

async fn chromium(chromium: &std::path::Path, driver_bin: &std::path::Path, dark: bool) -> Browser {
    let port = free_port();
    let profile = std::env::temp_dir().join(format!(
        "wq-dashboard-chromium-{}-{port}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&profile);
    std::fs::create_dir_all(&profile).unwrap();
    let child = Command::new(driver_bin)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run chromedriver");
    let driver = Driver {
        child,
        profile: profile.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut args = vec![
        "--headless".to_owned(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-quic".into(),
        "--no-first-run".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        "--hide-scrollbars".into(),
        "--window-size=1280,1100".into(),
        format!("--user-data-dir={}", profile.display()),
    ];
    // The system setting the page's theme follows: `prefers-color-scheme: dark`.
    args.push(format!(
        "--blink-settings=preferredColorScheme={}",
        if dark { 0 } else { 1 }
    ));
    if dark {
        args.push("--force-dark-mode".into());
    }
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({ "binary": chromium.display().to_string(), "args": args }),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium to drive");
    Browser {
        client,
        _driver: driver,
    }
}

/// The text of the first element matching `css`, or "" if there is none.
async fn text(browser: &Client, css: &str) -> String {
    match browser.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// A figure of queue `queue`'s row.
async fn cell(browser: &Client, queue: &str, field: &str) -> String {
    drawn(
        browser,
        &format!("tr[data-queue=\"{queue}\"] td[data-field=\"{field}\"]"),
    )
    .await
}

/// The text of a table cell once it is drawn: while the page redraws its table (every
/// poll), a cell reads empty for a moment. Empty after 2 s is an answer too.
async fn drawn(browser: &Client, css: &str) -> String {
    for _ in 0..20 {
        let cell = text(browser, css).await;
        if !cell.is_empty() {
            return cell;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    text(browser, css).await
}

/// A figure of the row of queue `queue` of source `source`.
async fn cell_of(browser: &Client, source: &str, queue: &str, field: &str) -> String {
    drawn(
        browser,
        &format!("tr[data-source=\"{source}\"][data-queue=\"{queue}\"] td[data-field=\"{field}\"]"),
    )
    .await
}

/// Clicks the first element matching `css`; the page redraws every poll, so a stale element
/// is looked up again.
async fn click(browser: &Client, css: &str) {
    for _ in 0..50 {
        if let Ok(button) = browser.find(Locator::Css(css)).await
            && button.click().await.is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("could not click {css}");
}

/// The texts of every element matching `css`.
async fn texts(browser: &Client, css: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(all) = browser.find_all(Locator::Css(css)).await {
        for e in all {
            out.push(e.text().await.unwrap_or_default());
        }
    }
    out
}

/// A value the page's script computes.
async fn eval(browser: &Client, script: &str) -> serde_json::Value {
    browser.execute(script, vec![]).await.unwrap()
}

/// Waits until the page has drawn its charts (at least four).
async fn charts_drawn(browser: &Client) {
    until("the charts have samples", || async {
        browser
            .find_all(Locator::Css("svg[data-chart] polyline"))
            .await
            .is_ok_and(|p| p.len() >= 4)
    })
    .await;
}

/// Writes a screenshot of the page to `target/dashboard-screenshots/NAME.png`.
async fn screenshot(browser: &Client, name: &str) {
    let png = browser.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    std::fs::write(screenshots_dir().join(format!("{name}.png")), &png).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_figures_requeues_dead_letters_and_pauses() {
    let Some((chromium_bin, driver_bin)) = require_browser() else {
        return;
    };
    let _one = ONE_BROWSER.lock().await;
    let Some(server) = support::redis_server(&[]) else {
        return;
    };

    // A queue with two dead letters, one failing item, one lease out and three ready items.
    let text_q: RedisQueue<String> = RedisQueue::builder("orders")
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
    text_q.add("bad-1".to_owned()).await.unwrap();
    text_q.add("bad-2".to_owned()).await.unwrap();
    assert!(q.try_get().await.unwrap().is_empty());
    assert!(q.try_get().await.unwrap().is_empty());
    for i in 1..=4 {
        q.add(i).await.unwrap();
    }
    q.add_rate_limited(42).await.unwrap();
    let lease = q.get().await.unwrap().unwrap();

    let base = serve(redis_dashboard(&server, fast())).await;
    let window = chromium(&chromium_bin, &driver_bin, false).await;
    let browser = &window.client;
    browser.goto(&format!("{base}#orders")).await.unwrap();
    until("the page shows the queue's figures", || async {
        cell(browser, "orders", "depth").await == "3"
            && cell(browser, "orders", "dead").await == "2"
    })
    .await;
    // The token's visit left no token in the address, and the page's script cannot read it.
    let here = eval(browser, "return location.href + ' ' + document.cookie").await;
    assert!(!here.as_str().unwrap().contains(support::TOKEN), "{here}");
    assert!(here.as_str().unwrap().contains("#orders"), "{here}");
    assert_eq!(cell(browser, "orders", "in_flight").await, "1");
    assert_eq!(cell(browser, "orders", "failing").await, "1");
    assert_eq!(cell(browser, "orders", "state").await, "running");
    click(browser, "button[data-state=\"dead\"]").await;
    until("the dead letters are listed", || async {
        texts(browser, "#items tr.item-row").await.len() == 2
    })
    .await;
    assert!(texts(browser, "#items tr.item-row").await[0].contains("bad-1"));
    charts_drawn(browser).await;
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
    screenshot(browser, "dashboard").await;

    // "Requeue all" empties the dead letters.
    click(browser, "button[data-action=\"requeue-all\"]").await;
    until("the dead letters are requeued", || async {
        q.stats(10).await.unwrap().summary.dead == 0
    })
    .await;
    until("the page shows no dead letter", || async {
        cell(browser, "orders", "dead").await == "0"
    })
    .await;
    assert!(
        text(browser, "#notice")
            .await
            .contains("requeued 2 dead letters")
    );
    assert!(
        q.stats(10).await.unwrap().summary.depth >= 5,
        "three items and the two requeued"
    );

    // "Pause" stops delivery; "Resume" restarts it.
    click(browser, "button[data-action=\"pause\"]").await;
    until("the queue is paused", || async {
        q.is_paused().await.unwrap()
    })
    .await;
    until("the page shows the pause", || async {
        cell(browser, "orders", "state").await == "paused"
    })
    .await;
    assert!(q.try_get().await.unwrap().is_empty());
    screenshot(browser, "dashboard-paused").await;
    click(browser, "button[data-action=\"resume\"]").await;
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
    browser.clone().close().await.unwrap();
}

/// Writes `n` dead letters of queue `name` as the scripts write them: `letter-I`, except
/// `needle` at index 77.
async fn dead_letters(server: &support::RedisServer, name: &str, n: usize) {
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let mut pipe = redis::pipe();
    for i in 0..n {
        let item = if i == 77 {
            "\"needle\"".to_owned()
        } else {
            format!("\"letter-{i}\"")
        };
        let entry = serde_json::json!({
            "item": item, "error": format!("boom {i}"), "at_ms": 1_700_000_000_000u64 + i as u64,
            "stalls": 0, "failures": 3, "token": "1",
        });
        pipe.cmd("RPUSH")
            .arg(format!("wq:{{{name}}}:dead"))
            .arg(entry.to_string())
            .ignore();
    }
    let _: () = pipe.query_async(&mut con).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_are_paged_searched_shown_and_acted_on_one_by_one() {
    let Some((chromium_bin, driver_bin)) = require_browser() else {
        return;
    };
    let _one = ONE_BROWSER.lock().await;
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let q: RedisQueue<String> = RedisQueue::builder("many")
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap();
    dead_letters(&server, "many", 120).await;
    q.add("ready-1".to_owned()).await.unwrap();
    q.add_after("later".to_owned(), Duration::from_secs(3600))
        .await
        .unwrap();

    let base = serve(redis_dashboard(&server, fast())).await;
    let window = chromium(&chromium_bin, &driver_bin, false).await;
    let browser = &window.client;
    browser.goto(&format!("{base}#redis/many")).await.unwrap();
    until("the queue is shown", || async {
        cell(browser, "many", "dead").await == "120"
    })
    .await;

    // Pages of 50 through 120 dead letters, from the oldest and from the newest.
    click(browser, "button[data-state=\"dead\"]").await;
    let first_item = || async { text(browser, "#items tr.item-row td.item").await };
    until("the first page of dead letters", || async {
        first_item().await == "\"letter-0\""
            && texts(browser, "#items tr.item-row").await.len() == 50
    })
    .await;
    assert!(text(browser, "#page-info").await.contains("1–50 of 120"));
    click(browser, "button[data-action=\"next\"]").await;
    until("the second page", || async {
        first_item().await == "\"letter-50\""
    })
    .await;
    click(browser, "button[data-action=\"prev\"]").await;
    until("back to the first page", || async {
        first_item().await == "\"letter-0\""
    })
    .await;
    click(browser, "button[data-action=\"last\"]").await;
    until("the newest first", || async {
        first_item().await == "\"letter-119\""
    })
    .await;

    // Search by item text.
    let search = browser.find(Locator::Css("#search")).await.unwrap();
    search.send_keys("NEEDLE").await.unwrap();
    click(browser, "button[data-action=\"search\"]").await;
    until("one match", || async {
        texts(browser, "#items tr.item-row").await.len() == 1 && first_item().await == "\"needle\""
    })
    .await;

    // Its detail, then requeue it from its row.
    click(browser, "#items tr.item-row td.item").await;
    until("the item's detail", || async {
        text(browser, "#item-facts dd[data-fact=\"states\"]").await == "dead"
    })
    .await;
    assert!(text(browser, "#item-dead").await.contains("boom 77"));
    click(
        browser,
        "#items tr.item-row button[data-action=\"requeue\"]",
    )
    .await;
    until("the dead letter is requeued", || async {
        q.stats(1).await.unwrap().summary.dead == 119
    })
    .await;
    until("the answer is shown", || async {
        text(browser, "#notice")
            .await
            .contains("requeued the dead letter")
    })
    .await;
    until("the detail says it is ready", || async {
        text(browser, "#item-facts dd[data-fact=\"states\"]").await == "ready"
    })
    .await;
    assert_eq!(q.len().await.unwrap(), 2, "ready-1 and the requeued needle");

    // Delete one dead letter (the page asks first).
    search.clear().await.unwrap();
    click(browser, "button[data-action=\"search\"]").await;
    until("the whole list again", || async {
        texts(browser, "#items tr.item-row").await.len() == 50
    })
    .await;
    click(browser, "#items tr.item-row button[data-action=\"delete\"]").await;
    browser.accept_alert().await.unwrap();
    until("the dead letter is deleted", || async {
        q.stats(1).await.unwrap().summary.dead == 118
    })
    .await;

    // Retry a delayed item now.
    click(browser, "button[data-state=\"delayed\"]").await;
    until("the delayed item", || async {
        first_item().await == "\"later\""
    })
    .await;
    click(browser, "#items tr.item-row button[data-action=\"retry\"]").await;
    until("it is ready", || async { q.len().await.unwrap() == 3 }).await;
    until("the answer is shown", || async {
        text(browser, "#notice").await.contains("queued now")
    })
    .await;
    assert_eq!(q.delayed_len().await.unwrap(), 0);
    screenshot(browser, "dashboard-items").await;
    browser.clone().close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_survives_a_redis_restart_and_pauses_its_updates_and_when_hidden() {
    let Some((chromium_bin, driver_bin)) = require_browser() else {
        return;
    };
    let _one = ONE_BROWSER.lock().await;
    let Some(mut server) = support::durable_redis_server() else {
        return;
    };
    let q: RedisQueue<String> = RedisQueue::builder("orders")
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap();
    for i in 0..3 {
        q.add(format!("o-{i}")).await.unwrap();
    }
    drop(q);
    let base = serve(redis_dashboard(&server, fast())).await;
    let window = chromium(&chromium_bin, &driver_bin, false).await;
    let browser = &window.client;
    browser.goto(&format!("{base}#redis/orders")).await.unwrap();
    until("the figures", || async {
        cell(browser, "orders", "depth").await == "3"
    })
    .await;
    until("the charts have samples", || async {
        eval(
            browser,
            "return document.querySelectorAll('svg[data-chart] polyline[points*=\" \"]').length",
        )
        .await
        .as_u64()
        .unwrap_or(0)
            >= 4
    })
    .await;

    server.kill();
    until("the page says the server is down", || async {
        text(browser, "#sources .down").await.contains("is down")
    })
    .await;
    assert!(text(browser, "#status").await.contains("down"));
    assert_eq!(
        cell(browser, "orders", "depth").await,
        "3",
        "the last figures stay"
    );
    let drawn = eval(
        browser,
        "return document.querySelectorAll('svg[data-chart] polyline[points*=\" \"]').length",
    )
    .await;
    assert!(drawn.as_u64().unwrap_or(0) >= 4, "the charts stay: {drawn}");

    let restarted = Instant::now();
    server.restart();
    until("the page is live again", || async {
        text(browser, "#sources").await.is_empty()
            && text(browser, "#status").await.starts_with("live")
    })
    .await;
    eprintln!(
        "the page was live again {:?} after redis-server restarted",
        restarted.elapsed()
    );
    assert_eq!(cell(browser, "orders", "depth").await, "3");

    // The pause toggle stops the updates; resuming brings them back.
    click(browser, "#toggle-refresh").await;
    let stamp = || async {
        eval(
            browser,
            "return document.getElementById('status').getAttribute('data-updated')",
        )
        .await
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = stamp().await;
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(stamp().await, before, "no refresh while paused");
    click(browser, "#toggle-refresh").await;
    until("updates resume", || async { stamp().await != before }).await;

    // A hidden tab stops refreshing, and starts again when shown. Headless Chromium's tab is
    // never hidden, so the page is told so as a browser would tell it.
    let visibility = |hidden: bool| {
        format!(
            "Object.defineProperty(document, 'hidden', {{ value: {hidden}, configurable: true }}); \
             document.dispatchEvent(new Event('visibilitychange'));"
        )
    };
    eval(browser, &visibility(true)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let hidden_at = stamp().await;
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert_eq!(
        stamp().await,
        hidden_at,
        "no refresh while the tab is hidden"
    );
    eval(browser, &visibility(false)).await;
    until("a shown tab refreshes again", || async {
        stamp().await != hidden_at
    })
    .await;
    browser.clone().close().await.unwrap();
}

/// The page at a phone's and a desktop's width, in the light and the dark theme, with Redis
/// and PostgreSQL queues side by side: nothing wider than the screen on a phone, and the theme
/// follows the system's setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_fits_a_phone_and_follows_the_dark_setting() {
    let Some((chromium_bin, driver_bin)) = require_browser() else {
        return;
    };
    let _one = ONE_BROWSER.lock().await;
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let Some(pg) = support::PgServer::start() else {
        return;
    };
    for (name, n) in [("emails", 12), ("thumbnails", 40)] {
        let q: RedisQueue<String> = RedisQueue::builder(name)
            .url(server.url())
            .check_persistence(false)
            .build()
            .await
            .unwrap();
        for i in 0..n {
            q.add(format!("{name}-{i}")).await.unwrap();
        }
        q.add_rate_limited(format!("{name}-flaky")).await.unwrap();
    }
    let pool = pg_pool(&pg).await;
    for (name, n) in [("billing", 3), ("invoices", 25)] {
        let q = pg_queue(&pool, name).await;
        for i in 0..n {
            q.add(format!("{name}-{i}")).await.unwrap();
        }
        q.add_rate_limited(format!("{name}-flaky")).await.unwrap();
    }
    pg_dead_letters(&pool, "billing", 7).await;
    let base = serve_both(&server, &pg).await;
    for dark in [false, true] {
        let window = chromium(&chromium_bin, &driver_bin, dark).await;
        let browser = &window.client;
        browser
            .goto(&format!("{base}#postgres/billing"))
            .await
            .unwrap();
        until("the figures of both sources", || async {
            cell_of(browser, "postgres", "billing", "dead").await == "7"
                && cell_of(browser, "redis", "emails", "depth").await == "12"
        })
        .await;
        let background = eval(
            browser,
            "return getComputedStyle(document.body).backgroundColor",
        )
        .await;
        let expected = if dark {
            "rgb(20, 23, 28)"
        } else {
            "rgb(246, 247, 249)"
        };
        assert_eq!(background, expected, "dark = {dark}");
        click(browser, "button[data-state=\"dead\"]").await;
        until("the dead letters", || async {
            texts(browser, "#items tr.item-row").await.len() == 7
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let theme = if dark { "dark" } else { "light" };
        browser.set_window_size(1280, 1100).await.unwrap();
        screenshot(browser, &format!("dashboard-desktop-{theme}")).await;
        let source_under_name =
            "tr[data-source=\"postgres\"][data-queue=\"billing\"] td[data-field=\"name\"] .src";
        assert_eq!(
            text(browser, source_under_name).await,
            "",
            "a column of its own"
        );
        browser.set_window_size(390, 844).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            text(browser, source_under_name).await,
            "postgres",
            "no source column on a phone: the source is under the queue's name"
        );
        let overflow = eval(
            browser,
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth",
        )
        .await;
        assert!(
            overflow.as_i64().unwrap_or(1) <= 0,
            "nothing wider than a phone's screen: {overflow}"
        );
        screenshot(browser, &format!("dashboard-phone-{theme}")).await;
        browser.clone().close().await.unwrap();
    }
}

/// A backend that stops counting at a cap (PostgreSQL's, `PgAdmin::count_cap`) says so, and
/// the page writes a count past it as "N+", in the list and on the state's tab.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_past_a_backends_cap_read_as_more_than_the_cap() {
    let Some((chromium_bin, driver_bin)) = require_browser() else {
        return;
    };
    let _one = ONE_BROWSER.lock().await;
    let Some(pg) = support::PgServer::start() else {
        return;
    };
    let pool = pg_pool(&pg).await;
    let q = pg_queue(&pool, "orders").await;
    for i in 0..5 {
        q.add(format!("o-{i}")).await.unwrap();
    }
    let admin = PgAdmin::new(&pg.url())
        .unwrap()
        .application_name("wq-dashboard")
        .count_cap(Some(3));
    let base = serve(Dashboard::new(fast()).source(admin)).await;
    let window = chromium(&chromium_bin, &driver_bin, false).await;
    let browser = &window.client;
    browser
        .goto(&format!("{base}#postgres/orders"))
        .await
        .unwrap();
    until("the capped depth", || async {
        cell_of(browser, "postgres", "orders", "depth").await == "3+"
    })
    .await;
    until("the capped count on the ready tab", || async {
        text(browser, "button[data-state=\"ready\"]")
            .await
            .contains("(3+)")
    })
    .await;
    browser.clone().close().await.unwrap();
}

/// A pool of the test's own on `pg`, with the schema installed.
async fn pg_pool(pg: &support::PgServer) -> sqlx::PgPool {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg.url())
        .await
        .unwrap();
    PgQueue::<String>::migrate(&pool).await.unwrap();
    pool
}

/// Queue `name` on PostgreSQL, as a worker's process would build it (long leases, retries a
/// minute apart).
async fn pg_queue(pool: &sqlx::PgPool, name: &str) -> PgQueue<String> {
    PgQueue::builder(name)
        .pool(pool.clone())
        .listen(false)
        .lease_duration(Duration::from_secs(600))
        .backoff(Duration::from_secs(60), Duration::from_secs(600))
        .token_bucket(None)
        .build()
        .await
        .unwrap()
}

/// Writes `n` dead letters of PostgreSQL queue `name`: `letter-I`, error `boom I`.
async fn pg_dead_letters(pool: &sqlx::PgPool, name: &str, n: i32) {
    sqlx::query(
        "INSERT INTO workqueue_dead (queue, item, reason, stalls, failures)
         SELECT s.id, to_jsonb('letter-' || i)::text, 'boom ' || i, 5, 3
         FROM workqueue_queues s, generate_series(0, $2 - 1) i WHERE s.name = $1 ORDER BY i",
    )
    .bind(name)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// A PostgreSQL queue beside a Redis one: the same figures and charts, its dead letters, a
/// delayed item and the pause acted on from the page, and a restart of PostgreSQL while the
/// page is open (it says that source is down, keeps its figures, the Redis queues stay live,
/// and it is live again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_queue_beside_a_redis_one_shows_its_figures_and_is_acted_on() {
    let Some((chromium_bin, driver_bin)) = require_browser() else {
        return;
    };
    let _one = ONE_BROWSER.lock().await;
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let Some(mut pg) = support::PgServer::start() else {
        return;
    };
    let emails: RedisQueue<String> = RedisQueue::builder("emails")
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap();
    for i in 0..5 {
        emails.add(format!("e-{i}")).await.unwrap();
    }
    let pool = pg_pool(&pg).await;
    let q = pg_queue(&pool, "orders").await;
    for i in 1..=4 {
        q.add(format!("o-{i}")).await.unwrap();
    }
    q.add_after("later".to_owned(), Duration::from_secs(3600))
        .await
        .unwrap();
    q.add_rate_limited("flaky".to_owned()).await.unwrap();
    let lease = q.try_get().await.unwrap().into_lease().unwrap();
    pg_dead_letters(&pool, "orders", 2).await;
    pg_queue(&pool, "invoices")
        .await
        .add("i-1".to_owned())
        .await
        .unwrap();

    let base = serve_both(&server, &pg).await;
    let window = chromium(&chromium_bin, &driver_bin, false).await;
    let browser = &window.client;
    browser
        .goto(&format!("{base}#postgres/orders"))
        .await
        .unwrap();
    until("the PostgreSQL queue's figures", || async {
        cell_of(browser, "postgres", "orders", "depth").await == "3"
            && cell_of(browser, "postgres", "orders", "dead").await == "2"
    })
    .await;
    for (field, want) in [("delayed", "2"), ("in_flight", "1"), ("failing", "1")] {
        assert_eq!(
            cell_of(browser, "postgres", "orders", field).await,
            want,
            "{field}"
        );
    }
    assert_eq!(
        cell_of(browser, "postgres", "orders", "state").await,
        "running"
    );
    assert_eq!(cell_of(browser, "redis", "emails", "depth").await, "5");
    charts_drawn(browser).await;
    // Some traffic for the charts over three seconds.
    for i in 0..30u32 {
        q.add(format!("n-{i}")).await.unwrap();
        if i % 3 == 0 {
            q.add_rate_limited(format!("r-{i}")).await.unwrap();
        }
        if i % 2 == 0
            && let Some(done) = q.try_get().await.unwrap().into_lease()
        {
            done.done().await.unwrap();
        }
        emails.add(format!("e-more-{i}")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    screenshot(browser, "dashboard-postgres").await;

    // A dead letter requeued from its row.
    click(browser, "button[data-state=\"dead\"]").await;
    until("the dead letters are listed", || async {
        texts(browser, "#items tr.item-row").await.len() == 2
    })
    .await;
    click(
        browser,
        "#items tr.item-row button[data-action=\"requeue\"]",
    )
    .await;
    until("the answer is shown", || async {
        text(browser, "#notice")
            .await
            .contains("requeued the dead letter")
    })
    .await;
    assert_eq!(q.stats(1).await.unwrap().summary.dead, 1);

    // A delayed item run now.
    click(browser, "button[data-state=\"delayed\"]").await;
    let later = "#items tr.item-row[data-item='\"later\"'] button[data-action=\"retry\"]";
    click(browser, later).await;
    until("the answer is shown", || async {
        text(browser, "#notice").await.contains("queued now")
    })
    .await;
    assert!(
        q.item_detail("\"later\"")
            .await
            .unwrap()
            .is_some_and(|d| d.states.contains(&workq::admin::ItemState::Ready))
    );

    // Pause and resume.
    click(browser, "button[data-action=\"pause\"]").await;
    until("the queue is paused", || async {
        q.is_paused().await.unwrap()
    })
    .await;
    until("the page shows the pause", || async {
        cell_of(browser, "postgres", "orders", "state").await == "paused"
    })
    .await;
    click(browser, "button[data-action=\"resume\"]").await;
    until("the queue runs again", || async {
        !q.is_paused().await.unwrap()
    })
    .await;
    lease.done().await.unwrap();
    until("the page shows the running queue", || async {
        cell_of(browser, "postgres", "orders", "state").await == "running"
    })
    .await;
    let depth = cell_of(browser, "postgres", "orders", "depth").await;
    drop(q);
    pool.close().await;

    // PostgreSQL restarts under the open page.
    pg.kill();
    until("the page says PostgreSQL is down", || async {
        text(browser, "#sources .down[data-source=\"postgres\"]")
            .await
            .contains("is down")
    })
    .await;
    assert!(
        text(browser, "#sources .down[data-source=\"redis\"]")
            .await
            .is_empty(),
        "Redis is not down"
    );
    assert_eq!(
        cell_of(browser, "postgres", "orders", "depth").await,
        depth,
        "the last figures stay"
    );
    let restarted = Instant::now();
    pg.restart();
    until("the page is live again", || async {
        text(browser, "#sources .down").await.is_empty()
            && text(browser, "#status").await.starts_with("live")
    })
    .await;
    eprintln!(
        "the page was live again {:?} after PostgreSQL restarted",
        restarted.elapsed()
    );
    assert_eq!(cell_of(browser, "postgres", "orders", "depth").await, depth);
    browser.clone().close().await.unwrap();
}

/// Hostile queue names and items are text on the page, never markup; a long item is cut in
/// its listing and shown whole in its detail, with its actions there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_and_long_items_are_shown_as_text() {
    let Some((chromium_bin, driver_bin)) = require_browser() else {
        return;
    };
    let _one = ONE_BROWSER.lock().await;
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let name = "<img/src=x/onerror=window.pwned=1>";
    let q: RedisQueue<String> = RedisQueue::builder(name)
        .url(server.url())
        .check_persistence(false)
        .build()
        .await
        .unwrap();
    let long = format!("<script>window.pwned=2</script>{}", "z".repeat(5_000));
    q.add(long.clone()).await.unwrap();
    q.add_after(
        "\"><svg onload=window.pwned=3>".to_owned(),
        Duration::from_secs(3600),
    )
    .await
    .unwrap();
    let base = serve(redis_dashboard(&server, fast())).await;
    let window = chromium(&chromium_bin, &driver_bin, false).await;
    let browser = &window.client;
    browser
        .goto(&format!("{base}#redis/{}", urlencode(name)))
        .await
        .unwrap();
    until("the hostile queue is listed", || async {
        eval(
            browser,
            "return [...document.querySelectorAll('tr[data-queue]')].some((r) => r.dataset.queue.startsWith('<img'))",
        )
        .await
            == serde_json::json!(true)
    })
    .await;
    until("its items are listed", || async {
        texts(browser, "#items tr.item-row").await.len() == 1
    })
    .await;
    let row = texts(browser, "#items tr.item-row").await[0].clone();
    assert!(
        row.contains("<script>window.pwned=2</script>"),
        "as text: {row}"
    );
    assert!(row.len() < 1_000, "cut: {} bytes", row.len());
    click(browser, "#items tr.item-row button[data-action=\"open\"]").await;
    until("the detail shows the item whole", || async {
        text(browser, "#item-name").await.len() > 5_000
    })
    .await;
    assert!(
        browser
            .find(Locator::Css("#item-actions button[data-action=\"remove\"]"))
            .await
            .is_ok(),
        "its actions are in the detail"
    );
    click(browser, "button[data-state=\"delayed\"]").await;
    until("the delayed item is listed", || async {
        texts(browser, "#items tr.item-row")
            .await
            .first()
            .is_some_and(|r| r.contains("<svg onload"))
    })
    .await;
    assert_eq!(
        eval(browser, "return window.pwned === undefined && document.querySelectorAll('img[src=x], #items script, svg[onload]').length === 0").await,
        serde_json::json!(true),
        "no markup of theirs ran or was made"
    );
    browser.clone().close().await.unwrap();
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The text of the cell `field` of the row of `table` whose `data-KEY` is `value`.
async fn row_cell(browser: &Client, table: &str, key: &str, value: &str, field: &str) -> String {
    drawn(
        browser,
        &format!("#{table} tr[data-{key}=\"{value}\"] td[data-field=\"{field}\"]"),
    )
    .await
}

/// A Redis queue and a PostgreSQL queue with flow control and periodic schedules: the page
/// shows their groups (ready, in flight, limit, oldest waiting), their limits in words and
/// their schedules (spec, time zone, ticks, state), pauses and resumes a schedule from its
/// row, and shows a hostile group name as text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_limits_and_schedules_show_for_a_redis_and_a_postgres_queue() {
    let Some((chromium_bin, driver_bin)) = require_browser() else {
        return;
    };
    let _one = ONE_BROWSER.lock().await;
    let Some(server) = support::redis_server(&[]) else {
        return;
    };
    let Some(pg) = support::PgServer::start() else {
        return;
    };
    let tenants = support::grouped_queue(&server, "tenants").await;
    let hostile = "<img src=x onerror=window.pwned=4>";
    for key in [
        "noisy/a", "noisy/b", "noisy/c", "noisy/d", "quiet/a", "big/a",
    ] {
        tenants.add(key.to_owned()).await.unwrap();
    }
    tenants.add(format!("{hostile}/a")).await.unwrap();
    let lease = tenants.get().await.unwrap().unwrap();
    let now = std::time::SystemTime::now();
    support::schedules(&tenants, "cron/tick".to_owned(), now).await;
    let pool = pg_pool(&pg).await;
    let billing: PgQueue<String> = PgQueue::builder("billing")
        .pool(pool.clone())
        .listen(false)
        .lease_duration(Duration::from_secs(600))
        .group_by(support::group_of)
        .max_in_flight_per_group(2)
        .group_weight("acme", 3)
        .hand_out_rate_per_group(20.0, 5)
        .build()
        .await
        .unwrap();
    for key in [
        "acme/1",
        "acme/2",
        "acme/3",
        "acme/4",
        "globex/1",
        "initech/1",
    ] {
        billing.add(key.to_owned()).await.unwrap();
    }
    // Four gets: two of acme (its limit), and the one item of each other group.
    let mut pg_leases = Vec::new();
    for _ in 0..4 {
        pg_leases.push(billing.try_get().await.unwrap().into_lease().unwrap());
    }
    support::schedules(&billing, "cron/tick".to_owned(), now).await;
    let base = serve_both(&server, &pg).await;
    let window = chromium(&chromium_bin, &driver_bin, false).await;
    let browser = &window.client;

    browser
        .goto(&format!("{base}#redis/tenants"))
        .await
        .unwrap();
    until("the Redis queue's groups", || async {
        row_cell(browser, "groups", "group", "noisy", "ready").await == "3"
    })
    .await;
    for (field, want) in [("in_flight", "1"), ("limit", "1")] {
        assert_eq!(
            row_cell(browser, "groups", "group", "noisy", field).await,
            want,
            "{field}"
        );
    }
    assert_eq!(
        row_cell(browser, "groups", "group", "big", "limit").await,
        "3"
    );
    assert!(
        !row_cell(browser, "groups", "group", "noisy", "oldest_ready")
            .await
            .is_empty(),
        "the oldest item's wait"
    );
    assert!(
        text(browser, "#flow-summary")
            .await
            .contains("1 at their limit"),
        "{}",
        text(browser, "#flow-summary").await
    );
    assert_eq!(
        text(browser, "#limits dd[data-limit=\"in flight per group\"]").await,
        "at most 1 (big: 3)"
    );
    assert_eq!(
        text(browser, "#limits dd[data-limit=\"hand-out rate\"]").await,
        "1000/s, burst 100"
    );
    let nightly = |field| row_cell(browser, "schedules", "schedule", "nightly", field);
    assert_eq!(nightly("time_zone").await, "Europe/Paris");
    assert_eq!(nightly("spec").await, "cron 0 3 * * * (Europe/Paris)");
    assert_eq!(nightly("state").await, "running");
    assert!(
        nightly("next_tick").await.ends_with('Z'),
        "{}",
        nightly("next_tick").await
    );
    let minutely = |field| row_cell(browser, "schedules", "schedule", "minutely", field);
    assert!(!minutely("last_tick").await.is_empty(), "the tick taken");
    assert_eq!(
        eval(
            browser,
            "return [...document.querySelectorAll('#groups tr[data-group]')].some((r) => r.dataset.group.startsWith('<img') && r.cells[0].textContent === r.dataset.group) && window.pwned === undefined && document.querySelectorAll('#groups img').length === 0",
        )
        .await,
        serde_json::json!(true),
        "the hostile group name is text"
    );
    click(
        browser,
        "#schedules tr[data-schedule=\"nightly\"] button[data-action=\"schedule-pause\"]",
    )
    .await;
    until("the schedule is paused", || async {
        nightly("state").await == "paused"
    })
    .await;
    let listed = tenants.schedules().await.unwrap();
    assert!(
        listed.iter().any(|s| s.name == "nightly" && s.paused),
        "{listed:?}"
    );
    screenshot(browser, "dashboard-flow-redis").await;
    click(
        browser,
        "#schedules tr[data-schedule=\"nightly\"] button[data-action=\"schedule-resume\"]",
    )
    .await;
    until("the schedule runs again", || async {
        nightly("state").await == "running"
    })
    .await;

    browser
        .goto(&format!("{base}#postgres/billing"))
        .await
        .unwrap();
    until("the PostgreSQL queue's groups", || async {
        row_cell(browser, "groups", "group", "acme", "in_flight").await == "2"
    })
    .await;
    assert_eq!(
        row_cell(browser, "groups", "group", "acme", "ready").await,
        "2"
    );
    assert_eq!(
        row_cell(browser, "groups", "group", "acme", "limit").await,
        "2"
    );
    assert_eq!(
        row_cell(browser, "groups", "group", "globex", "in_flight").await,
        "1"
    );
    assert_eq!(
        text(browser, "#limits dd[data-limit=\"weights\"]").await,
        "acme: 3 (the others: 1)"
    );
    assert_eq!(
        row_cell(browser, "schedules", "schedule", "nightly", "time_zone").await,
        "Europe/Paris"
    );
    charts_drawn(browser).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    eval(
        browser,
        "document.getElementById('detail').scrollIntoView(); return true",
    )
    .await;
    screenshot(browser, "dashboard-flow").await;
    lease.done().await.unwrap();
    for lease in pg_leases {
        lease.done().await.unwrap();
    }
    browser.clone().close().await.unwrap();
}
