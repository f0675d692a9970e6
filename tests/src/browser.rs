//! Headless Chromium for the dashboard tests, driven over WebDriver
//! (Debian's `chromium` and `chromium-driver`, installed with apt-get on
//! first use when missing; a test that needs them fails, never skips, when
//! they cannot be had).
//!
//! ```text
//! let browser = Browser::start().await?;
//! browser.goto(&server.dashboard_url()).await?;
//! browser.wait_for_text("#fleet", "acme").await?;
//! browser.screenshot("fleet").await?;
//! ```
//!
//! Every wait polls a condition in the page until it holds or
//! [`BROWSER_DEADLINE`] passes, then fails with what the page showed.

use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::binary::target_dir;

/// How long a wait for the page may take.
pub const BROWSER_DEADLINE: Duration = Duration::from_secs(20);

/// How often a waited-for condition is checked in the page.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The Chromium binary Debian's package installs.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// The ChromeDriver binary Debian's `chromium-driver` installs.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Flags for headless Chromium on a machine with a closed network (see the
/// machine notes): no background traffic, no sandbox (runs as root).
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-crash-reporter",
    "--disable-breakpad",
    "--no-first-run",
    "--window-size=1440,900",
];

/// Chromium and ChromeDriver, installed with apt-get if missing (once per
/// process).
///
/// # Panics
/// If they are missing and cannot be installed: the message says how to
/// install them by hand.
pub fn chromium() -> (PathBuf, PathBuf) {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    let result = INSTALLED.get_or_init(|| install().map_err(|error| format!("{error:#}")));
    if let Err(message) = result {
        panic!(
            "the dashboard tests need headless Chromium, which is missing and could not be \
             installed: {message}\nInstall it as root with `apt-get install -y chromium chromium-driver`."
        );
    }
    (PathBuf::from(CHROMIUM), PathBuf::from(CHROMEDRIVER))
}

fn install() -> anyhow::Result<()> {
    if Path::new(CHROMIUM).is_file() && Path::new(CHROMEDRIVER).is_file() {
        return Ok(());
    }
    let apt = |args: &[&str]| -> anyhow::Result<()> {
        let output = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output()
            .context("cannot run apt-get")?;
        if !output.status.success() {
            bail!(
                "apt-get {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    };
    if apt(&["install", "-y", "chromium", "chromium-driver"]).is_err() {
        apt(&["update"])?;
        apt(&["install", "-y", "chromium", "chromium-driver"])?;
    }
    if !Path::new(CHROMEDRIVER).is_file() {
        bail!("apt-get succeeded but {CHROMEDRIVER} is missing");
    }
    Ok(())
}

/// A headless Chromium session with its own ChromeDriver and a fresh
/// profile directory. Dropping it kills the driver (and the browser).
pub struct Browser {
    client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("driver", &self.driver.id())
            .finish()
    }
}

impl Browser {
    /// Starts ChromeDriver on a free loopback port and opens a headless
    /// Chromium session with a new, empty profile.
    pub async fn start() -> anyhow::Result<Browser> {
        Self::start_with(false).await
    }

    /// [`Browser::start`], accepting any TLS certificate when
    /// `accept_insecure_certs` (for servers with a test certificate).
    pub async fn start_with(accept_insecure_certs: bool) -> anyhow::Result<Browser> {
        let (chromium, chromedriver) = chromium();
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|probe| probe.local_addr())
            .context("cannot find a free port for chromedriver")?
            .port();
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            // Its own process group, which the browser inherits: see
            // `end_driver`.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", chromedriver.display()))?;
        let profile = tempfile::Builder::new()
            .prefix("reconciled-chromium-")
            .tempdir()
            .context("cannot create a profile directory")?;
        let mut args: Vec<String> = CHROMIUM_FLAGS
            .iter()
            .map(|flag| (*flag).to_owned())
            .collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        let capabilities: Capabilities = serde_json::from_value(json!({
            "browserName": "chrome",
            "acceptInsecureCerts": accept_insecure_certs,
            "goog:chromeOptions": { "binary": chromium, "args": args },
        }))
        .context("capabilities")?;
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        let client = loop {
            // The driver has no readiness signal but its port.
            let attempt = ClientBuilder::new(HttpConnector::new())
                .capabilities(capabilities.clone())
                .connect(&url)
                .await;
            match attempt {
                Ok(client) => break client,
                Err(error) if started.elapsed() > BROWSER_DEADLINE => {
                    bail!("cannot open a Chromium session through {url}: {error}")
                }
                Err(_) => tokio::time::sleep(POLL_INTERVAL).await,
            }
        };
        Ok(Browser {
            client,
            driver,
            _profile: profile,
        })
    }

    /// The WebDriver client, for what the helpers here do not cover.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Opens `url`.
    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.client
            .goto(url)
            .await
            .with_context(|| format!("cannot open {url}"))
    }

    /// Runs `script` (a function body; `arguments[i]` are `args`) in the page
    /// and returns its result.
    pub async fn eval(&self, script: &str, args: Vec<Value>) -> anyhow::Result<Value> {
        self.client
            .execute(script, args)
            .await
            .with_context(|| format!("script failed: {script}"))
    }

    /// The visible text of the first element matching `css` (`None` if
    /// there is none).
    pub async fn text(&self, css: &str) -> anyhow::Result<Option<String>> {
        let value = self
            .eval(
                "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
                vec![json!(css)],
            )
            .await?;
        Ok(value.as_str().map(str::to_owned))
    }

    /// Waits until `script` returns a truthy value and returns it; fails
    /// after [`BROWSER_DEADLINE`] naming `what`.
    pub async fn wait_until(
        &self,
        what: &str,
        script: &str,
        args: Vec<Value>,
    ) -> anyhow::Result<Value> {
        let started = Instant::now();
        loop {
            let value = self.eval(script, args.clone()).await?;
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                _ => true,
            };
            if truthy {
                return Ok(value);
            }
            if started.elapsed() > BROWSER_DEADLINE {
                let page = self.text("body").await?.unwrap_or_default();
                bail!("timed out waiting for {what}; the page shows:\n{page}");
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Waits until an element matching `css` shows text containing
    /// `needle`, and returns that element's text.
    pub async fn wait_for_text(&self, css: &str, needle: &str) -> anyhow::Result<String> {
        let value = self
            .wait_until(
                &format!("{css:?} to show {needle:?}"),
                "for (const e of document.querySelectorAll(arguments[0])) { \
                   if (e.innerText.includes(arguments[1])) return e.innerText; } return null;",
                vec![json!(css), json!(needle)],
            )
            .await?;
        Ok(value.as_str().unwrap_or_default().to_owned())
    }

    /// Types `text` into the input matching `css` (replacing its value).
    pub async fn fill(&self, css: &str, text: &str) -> anyhow::Result<()> {
        let element = self
            .client
            .find(fantoccini::Locator::Css(css))
            .await
            .with_context(|| format!("no element {css}"))?;
        element.clear().await.context("cannot clear the input")?;
        element
            .send_keys(text)
            .await
            .with_context(|| format!("cannot type into {css}"))
    }

    /// Clicks the first element matching `css`. A live page may replace
    /// the element between finding and clicking it; then it is found again
    /// (until [`BROWSER_DEADLINE`]).
    pub async fn click(&self, css: &str) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let clicked = match self.client.find(fantoccini::Locator::Css(css)).await {
                Ok(element) => element.click().await,
                Err(error) => Err(error),
            };
            match clicked {
                Ok(()) => return Ok(()),
                Err(error) if started.elapsed() > BROWSER_DEADLINE => {
                    return Err(error).with_context(|| format!("cannot click {css}"));
                }
                Err(_) => tokio::time::sleep(POLL_INTERVAL).await,
            }
        }
    }

    /// Saves a PNG of the window as
    /// `<target>/dashboard-screenshots/<name>.png` and returns its path.
    pub async fn screenshot(&self, name: &str) -> anyhow::Result<PathBuf> {
        let png = self.client.screenshot().await.context("screenshot")?;
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    }

    /// Ends the session and the driver.
    pub async fn close(mut self) -> anyhow::Result<()> {
        let closed = self.client.clone().close().await;
        self.end_driver();
        closed.context("cannot close the browser session")
    }

    /// Kills the driver's process group: the driver and the browser it
    /// started, even when a failing test never closed the session.
    fn end_driver(&mut self) {
        if let Ok(pid) = i32::try_from(self.driver.id()) {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.end_driver();
    }
}

/// Where [`Browser::screenshot`] writes: `<target>/dashboard-screenshots`.
pub fn screenshot_dir() -> PathBuf {
    target_dir().join("dashboard-screenshots")
}
