//! The dashboard as its users reach it: `taquba-workflow ui` started as a
//! child process on a free loopback port, and a plain HTTP/1.1 client
//! over a TCP socket (requests as a browser sends them, responses read
//! whole: status, headers, body).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout, Command};

/// A running `taquba-workflow ui`, stopped when dropped.
pub struct Dashboard {
    child: Child,
    _stdout: BufReader<ChildStdout>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub base: String,
    /// What it printed before serving.
    pub banner: String,
    /// Headers sent with every request that does not give its own (the
    /// credentials of a dashboard with a token).
    pub sending: Vec<(String, String)>,
}

/// The environment variable of the dashboard's login token.
pub const TOKEN_ENV: &str = "TAQUBA_WORKFLOW_UI_TOKEN";

impl Dashboard {
    /// Start `taquba-workflow --store STORE ui --listen 127.0.0.1:0 ARGS…`
    /// (with no token from the environment) and wait (at most 60 s) for the
    /// URL it prints.
    pub async fn start(store: &Path, args: &[&str]) -> Self {
        Self::start_with(store, "127.0.0.1:0", args, &[]).await
    }

    /// Start `taquba-workflow --store STORE ui --listen LISTEN ARGS…` with
    /// `env` added to an environment with no store and no token, and wait
    /// (at most 60 s) for the URL it prints. A dashboard on an unspecified
    /// address (`0.0.0.0`) is reached at 127.0.0.1.
    pub async fn start_with(
        store: &Path,
        listen: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_taquba-workflow"))
            .env_remove("TAQUBA_WORKFLOW_STORE")
            .env_remove(TOKEN_ENV)
            .envs(env.iter().copied())
            .arg("--store")
            .arg(store)
            .args(["ui", "--listen", listen])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start taquba-workflow ui");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut banner = String::new();
        let read = async {
            for _ in 0..3 {
                if stdout.read_line(&mut banner).await.expect("read stdout") == 0 {
                    break;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .expect("the dashboard printed its URL within 60 s");
        let url = banner
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("taquba-workflow ui: http://"))
            .unwrap_or_else(|| panic!("no URL in the banner: {banner:?}"));
        let mut addr: SocketAddr = url.trim_end_matches('/').parse().expect("an address");
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        Self {
            child,
            _stdout: stdout,
            base: format!("http://{addr}"),
            addr,
            banner,
            sending: Vec::new(),
        }
    }

    /// Send `headers` with every later request that does not give its own.
    pub fn always_send(&mut self, headers: &[(&str, &str)]) {
        self.sending = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Reply {
        self.request("GET", path, &[], b"").await
    }

    /// `POST path` of a form with `fields`, from the dashboard's own pages
    /// (its `Origin`).
    pub async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Reply {
        let origin = self.base.clone();
        self.post_from(path, fields, &[("Origin", origin.as_str())])
            .await
    }

    /// `POST path` of a form with `fields` and the given extra headers.
    pub async fn post_from(
        &self,
        path: &str,
        fields: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> Reply {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        let mut all = vec![("Content-Type", "application/x-www-form-urlencoded")];
        all.extend_from_slice(headers);
        self.request("POST", path, &all, body.as_bytes()).await
    }

    /// A request with `headers` (and `Host` naming the dashboard's address
    /// unless given, and [`sending`](Self::sending) unless given).
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let given = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        if !given("host") {
            head.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (name, value) in &self.sending {
            if !given(name) {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        ));
        let exchange = async {
            let mut stream = TcpStream::connect(self.addr).await.expect("connect");
            stream.write_all(head.as_bytes()).await.expect("send");
            stream.write_all(body).await.expect("send the body");
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await.expect("read the reply");
            raw
        };
        let raw = tokio::time::timeout(Duration::from_secs(60), exchange)
            .await
            .unwrap_or_else(|_| panic!("{method} {path}: no reply within 60 s"));
        Reply::parse(&raw)
    }

    /// Stop the dashboard.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The headers, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Reply {
    fn parse(raw: &[u8]) -> Self {
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a complete response head");
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|line| line.split(' ').nth(1))
            .and_then(|code| code.parse().ok())
            .expect("a status line");
        let headers: Vec<(String, String)> = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        let mut body = raw[split + 4..].to_vec();
        let chunked = headers
            .iter()
            .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
        if chunked {
            body = dechunk(&body);
        }
        Self {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    /// The value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The form token in the page.
    pub fn token(&self) -> String {
        let marker = r#"name="csrf" value=""#;
        let at = self
            .body
            .find(marker)
            .unwrap_or_else(|| panic!("no form token in the page:\n{}", self.body))
            + marker.len();
        self.body[at..]
            .split('"')
            .next()
            .expect("a token")
            .to_string()
    }

    /// Panic with the body unless the status is `status`.
    #[track_caller]
    pub fn expect(self, status: u16) -> Self {
        assert_eq!(
            self.status, status,
            "unexpected status; body:\n{}",
            self.body
        );
        self
    }

    /// Panic with the body unless it contains every one of `parts`.
    #[track_caller]
    pub fn has(&self, parts: &[&str]) -> &Self {
        for part in parts {
            assert!(
                self.body.contains(part),
                "the page lacks {part:?}:\n{}",
                self.body
            );
        }
        self
    }

    /// Panic with the body if it contains any of `parts`.
    #[track_caller]
    pub fn lacks(&self, parts: &[&str]) -> &Self {
        for part in parts {
            assert!(
                !self.body.contains(part),
                "the page has {part:?}:\n{}",
                self.body
            );
        }
        self
    }
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = end + 2;
        out.extend_from_slice(&rest[start..start + size]);
        rest = &rest[start + size + 2..];
    }
}
