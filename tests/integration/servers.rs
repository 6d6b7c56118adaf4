//! The real OpenAI-compatible servers the remote-engine tests start on the
//! loopback: llama.cpp's `llama-server` on the same SmolLM2 GGUF, and a
//! faster-whisper server on the CTranslate2 tiny.en (`.ci/setup.sh` builds
//! and installs both under `target/`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util;

/// What runs on the port.
#[derive(Debug, Clone)]
enum Kind {
    Llama(Vec<String>),
    Whisper,
}

/// A server process on a loopback port, killed when dropped.
pub struct Server {
    child: Option<Child>,
    kind: Kind,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn installed(rel: &str, script: &str) -> PathBuf {
    let p = util::root().join(rel);
    assert!(
        p.is_file(),
        "{} is missing: run `bash .ci/{script}` (`.ci/setup.sh` does)",
        p.display()
    );
    p
}

impl Server {
    /// llama-server on the default language model, one thread, four slots
    /// of 1024 tokens, the model served as `smollm2`; `extra` flags added.
    pub fn llama(extra: &[&str]) -> Self {
        Self::start(
            Kind::Llama(extra.iter().map(|s| (*s).to_owned()).collect()),
            free_port(),
        )
    }

    /// The faster-whisper server on tiny.en, one thread.
    pub fn whisper() -> Self {
        Self::start(Kind::Whisper, free_port())
    }

    fn start(kind: Kind, port: u16) -> Self {
        let mut cmd = match &kind {
            Kind::Llama(extra) => {
                let mut c = Command::new(installed(
                    "target/llama-server/bin/llama-server",
                    "llama-server.sh",
                ));
                c.arg("-m")
                    .arg(util::llm_model())
                    .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                    .args(["-t", "1", "-tb", "1", "-c", "4096", "-np", "4"])
                    .args(["--no-webui", "--alias", "smollm2", "--no-warmup"])
                    .args(extra);
                c
            }
            Kind::Whisper => {
                let mut c =
                    Command::new(installed("target/whisper-server/run", "whisper-server.sh"));
                c.args(["--host", "127.0.0.1", "--port", &port.to_string()]);
                c
            }
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the server");
        let s = Self {
            child: Some(child),
            kind,
            port,
        };
        s.wait_healthy();
        s
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `127.0.0.1:PORT`, as voxline names it.
    pub fn name(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if health(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the server on port {} did not become healthy in 60 s",
            self.port
        );
    }

    /// Kills it (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, once it was killed.
    pub fn restart(&mut self) {
        self.kill();
        let again = Self::start(self.kind.clone(), self.port);
        *self = again;
    }

    /// Sends it `signal` (`STOP`, `CONT`).
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal} {pid}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = &self.child {
            // a stopped server cannot die of SIGKILL until it runs again
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
        }
        self.kill();
    }
}

/// `GET path` on the port: the whole reply, headers and body (`None`
/// when nothing answers).
pub fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).ok()?;
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    Some(reply)
}

/// Whether `GET /health` on the port answers 200.
fn health(port: u16) -> bool {
    get(port, "/health")
        .is_some_and(|r| r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200"))
}

impl Server {
    /// A sample of the server's `/metrics` (llama-server started with `--metrics`).
    pub fn metric(&self, name: &str) -> f64 {
        let text = get(self.port, "/metrics").unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }
}
