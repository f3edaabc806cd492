//! Headless Chromium for the dashboard tests: load a page, read the DOM it drew, keep a
//! screenshot. The dashboard marks a drawn page in `body[data-ready]` and writes script and
//! API errors into `#errors`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The browser, or why there is none (`scripts/setup-test.sh` installs Debian's `chromium`).
pub fn chromium() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("WARREN_CHROMIUM") {
        return Ok(PathBuf::from(p));
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .flat_map(|d| [d.join("chromium"), d.join("chromium-browser")])
                .find(|p| p.is_file())
        })
        .ok_or_else(|| "chromium is not installed (scripts/setup-test.sh installs it)".to_string())
}

/// A TCP port on 127.0.0.1 free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("finding a free port")
}

/// What the browser made of one page.
pub struct Loaded {
    pub dom: String,
    pub console: String,
}

/// Loads `url` in a fresh headless browser, lets the page run for a few seconds of virtual
/// time, and returns the DOM; the screenshot of the same load goes to `shot`.
pub fn load(browser: &Path, profile: &Path, url: &str, shot: &Path) -> Loaded {
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1280,1000",
            "--virtual-time-budget=5000",
            "--run-all-compositor-stages-before-draw",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("running chromium");
    let console = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "chromium failed on {url}: {}\n{console}",
        out.status
    );
    Loaded {
        dom: String::from_utf8_lossy(&out.stdout).into_owned(),
        console,
    }
}

/// The inner text of the element whose start tag contains `attr` (no nesting inside).
pub fn text_of<'a>(dom: &'a str, attr: &str) -> Option<&'a str> {
    let at = dom.find(attr)?;
    let start = at + dom[at..].find('>')? + 1;
    let end = start + dom[start..].find('<')?;
    Some(&dom[start..end])
}

/// Asserts the page drew itself (`data-ready`) without a script or API error.
pub fn assert_clean(page: &str, l: &Loaded) {
    assert!(
        l.dom.contains(&format!("data-ready=\"{page}\"")),
        "page {page} did not finish drawing; DOM:\n{}\nconsole:\n{}",
        l.dom,
        l.console
    );
    let errors = text_of(&l.dom, "id=\"errors\"").unwrap_or("?");
    assert!(
        l.dom
            .contains("<div id=\"errors\" aria-live=\"polite\"></div>"),
        "page {page} shows errors: {errors}\nDOM:\n{}",
        l.dom
    );
    assert!(
        !l.dom.contains("[object "),
        "page {page} shows an object where text belongs:\n{}",
        l.dom
    );
    for line in l.console.lines() {
        assert!(
            !(line.contains("Uncaught") || line.contains("warren-ui ")),
            "console error on page {page}: {line}"
        );
    }
}

/// How many times `needle` occurs in `dom`.
pub fn count(dom: &str, needle: &str) -> usize {
    dom.matches(needle).count()
}
