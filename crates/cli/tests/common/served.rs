//! A `frugal serve` child process for the server tests, spoken to over plain HTTP/1.1.

/// A running `frugal serve` on a free port, stopped when dropped.
pub struct Served {
    pub child: std::process::Child,
    pub port: u16,
}

impl Served {
    pub fn start(model: &std::path::Path) -> Served {
        Served::start_with(model, &[])
    }

    pub fn start_with(model: &std::path::Path, extra: &[&str]) -> Served {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_frugal"))
            .args(["serve", "--port", "0", "--model", model.to_str().unwrap()])
            // A context of 512 unless the test gives its own.
            .args(match extra.contains(&"--ctx") {
                true => &[][..],
                false => &["--ctx", "512"][..],
            })
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start frugal serve");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .rsplit("http://127.0.0.1:")
            .next()
            .and_then(|rest| rest.split('/').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Served { child, port }
    }

    /// (status, body) of one request, the chunked transfer encoding undone.
    pub fn post(&self, path: &str, body: &str) -> (u16, String) {
        self.request("POST", path, body)
    }

    /// One Prometheus value of `GET /metrics` (the first line that starts with `name`).
    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.request("GET", "/metrics", "");
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }

    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let status = raw[9..12].parse().unwrap();
        let (head, mut rest) = raw.split_once("\r\n\r\n").unwrap();
        if !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            return (status, rest.to_string());
        }
        let mut body = String::new();
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            body.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        (status, body)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    /// One greedy completion of `max_tokens` per prompt, all sent at once, in prompt order.
    pub fn complete_all(&self, prompts: &[&str], max_tokens: usize) -> Vec<serde_json::Value> {
        std::thread::scope(|s| {
            let handles: Vec<_> = prompts
                .iter()
                .map(|p| {
                    s.spawn(move || {
                        let body = format!(
                            r#"{{"prompt": "{p}", "max_tokens": {max_tokens}, "temperature": 0}}"#
                        );
                        let (status, answer) = self.post("/v1/completions", &body);
                        assert_eq!(status, 200, "{answer}");
                        serde_json::from_str::<serde_json::Value>(&answer).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }
}
