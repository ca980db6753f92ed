//! A running `frugal web` for the tests that talk to it, and headless Chromium to drive its page.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

/// A running `frugal web` on a free port, stopped when dropped.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    pub fn start() -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_frugal"))
            .args(["web", "--port", "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start frugal web");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "frugal web: listening on http://127.0.0.1:PORT/ (Ctrl-C to stop)"
        let port = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .and_then(|host| host.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Server { child, port }
    }

    /// (status, body) of one request.
    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        // A body over the limit is refused on its declared length, before it is read: the
        // server may answer and close while it is still being sent.
        if body.len() > (1 << 20) {
            let mut head = [0u8; 12];
            s.read_exact(&mut head).expect("an answer before the body");
            let status = std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap();
            return (status, String::new());
        }
        s.write_all(body.as_bytes()).unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let status = raw[9..12].parse().expect("a status code");
        let body = raw.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
        (status, body)
    }

    pub fn json(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let (status, text) = self.request(method, path, body);
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// Headless Chromium: Debian's `chromium`, which `.ci/run` installs; on a fresh machine where
/// this runs as root with apt, the test installs it itself (the README's test command does all
/// the set-up).
pub fn chromium() -> &'static str {
    if let Some(c) = find_chromium() {
        return c;
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"));
    if root {
        let apt = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success())
        };
        let _ = apt(&["update"]) && apt(&["install", "-y", "chromium"]);
    }
    find_chromium().unwrap_or_else(|| {
        panic!(
            "the browser test needs headless Chromium: apt-get install chromium (.ci/run installs it)"
        )
    })
}

/// Headless Chromium's flags: no sandbox (CI runs as root), 15 s of virtual time for the page's
/// fetches.
pub const HEADLESS: [&str; 5] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--virtual-time-budget=15000",
];

/// The DOM of `url` after its scripts ran.
pub fn dump_dom(url: &str) -> String {
    let out = Command::new(chromium())
        .args(HEADLESS)
        .args(["--dump-dom", url])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A screenshot of `url` at `size` ("1400,1500") into `target/web/NAME`, for a person to look at.
pub fn screenshot(url: &str, size: &str, name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/web");
    std::fs::create_dir_all(&dir).unwrap();
    let shot = dir.join(name);
    let out = Command::new(chromium())
        .args(HEADLESS)
        .args([
            &format!("--window-size={size}"),
            &format!("--screenshot={}", shot.display()),
            url,
        ])
        .output()
        .unwrap();
    super::assert_ok(&out);
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "a screenshot of the page"
    );
    shot
}
