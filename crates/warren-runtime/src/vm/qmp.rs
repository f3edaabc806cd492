//! A small typed client of QEMU's machine protocol (QMP) over its unix socket.
//!
//! One command at a time (a mutex around the connection); asynchronous events that arrive
//! between replies are skipped. Only the commands Warren uses have wrappers.

use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::Mutex;

use crate::{QmpError, RuntimeError};

/// Longest a single QMP command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

struct Conn {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
}

/// A connected QMP session in command mode.
pub struct Qmp {
    conn: Mutex<Conn>,
}

fn err(e: QmpError) -> RuntimeError {
    RuntimeError::Vmm(e.into())
}

/// State of a migration (`query-migrate`).
#[derive(Debug, Clone, PartialEq)]
pub struct MigrationStatus {
    pub status: String,
    pub error: Option<String>,
}

impl Qmp {
    /// Connects (retrying while QEMU creates the socket) and negotiates capabilities.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Qmp, RuntimeError> {
        let start = std::time::Instant::now();
        let stream = loop {
            match UnixStream::connect(path).await {
                Ok(s) => break s,
                Err(e) if start.elapsed() > timeout => {
                    return Err(err(QmpError::Socket {
                        path: path.to_path_buf(),
                        source: e,
                    }))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        };
        let (rd, wr) = stream.into_split();
        let mut conn = Conn {
            rd: BufReader::new(rd),
            wr,
        };
        let greeting = read_msg(&mut conn).await?;
        if greeting.get("QMP").is_none() {
            return Err(err(QmpError::Greeting(greeting.to_string())));
        }
        let qmp = Qmp {
            conn: Mutex::new(conn),
        };
        qmp.execute("qmp_capabilities", json!({})).await?;
        Ok(qmp)
    }

    /// Runs one command and returns its `return` value.
    pub async fn execute(&self, cmd: &str, args: Value) -> Result<Value, RuntimeError> {
        let mut conn = self.conn.lock().await;
        let mut line = serde_json::to_vec(&json!({"execute": cmd, "arguments": args}))
            .expect("QMP commands serialize");
        line.push(b'\n');
        conn.wr.write_all(&line).await.map_err(|source| {
            err(QmpError::Send {
                cmd: cmd.to_string(),
                source,
            })
        })?;
        let reply = tokio::time::timeout(COMMAND_TIMEOUT, async {
            loop {
                let m = read_msg(&mut conn).await?;
                if m.get("event").is_some() {
                    continue;
                }
                return Ok::<Value, RuntimeError>(m);
            }
        })
        .await
        .map_err(|_| {
            err(QmpError::NoAnswer {
                cmd: cmd.to_string(),
            })
        })??;
        if let Some(e) = reply.get("error") {
            return Err(err(QmpError::Refused {
                cmd: cmd.to_string(),
                desc: e
                    .get("desc")
                    .and_then(Value::as_str)
                    .unwrap_or("error")
                    .to_string(),
            }));
        }
        Ok(reply.get("return").cloned().unwrap_or(Value::Null))
    }

    pub async fn stop(&self) -> Result<(), RuntimeError> {
        self.execute("stop", json!({})).await.map(drop)
    }

    pub async fn cont(&self) -> Result<(), RuntimeError> {
        self.execute("cont", json!({})).await.map(drop)
    }

    /// `running`, `paused`, `postmigrate`, `inmigrate`, ...
    pub async fn status(&self) -> Result<String, RuntimeError> {
        let v = self.execute("query-status", json!({})).await?;
        Ok(v.get("status")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string())
    }

    /// Turns migration capabilities on or off (both ends must agree, e.g. `mapped-ram`).
    pub async fn set_capabilities(&self, caps: &[(&str, bool)]) -> Result<(), RuntimeError> {
        let caps: Vec<Value> = caps
            .iter()
            .map(|(c, on)| json!({"capability": c, "state": on}))
            .collect();
        self.execute("migrate-set-capabilities", json!({ "capabilities": caps }))
            .await
            .map(drop)
    }

    /// Lifts the migration bandwidth limit (QEMU's default is 128 MiB/s, made for networks).
    pub async fn unlimit_bandwidth(&self) -> Result<(), RuntimeError> {
        self.execute(
            "migrate-set-parameters",
            json!({"max-bandwidth": 1u64 << 40}),
        )
        .await
        .map(drop)
    }

    pub async fn migrate(&self, uri: &str) -> Result<(), RuntimeError> {
        self.execute("migrate", json!({ "uri": uri }))
            .await
            .map(drop)
    }

    pub async fn migrate_incoming(&self, uri: &str) -> Result<(), RuntimeError> {
        self.execute("migrate-incoming", json!({ "uri": uri }))
            .await
            .map(drop)
    }

    pub async fn migration(&self) -> Result<MigrationStatus, RuntimeError> {
        let v = self.execute("query-migrate", json!({})).await?;
        Ok(MigrationStatus {
            status: v
                .get("status")
                .and_then(Value::as_str)
                .unwrap_or("none")
                .to_string(),
            error: v
                .get("error-desc")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    /// Polls `query-migrate` until the migration completes or fails.
    pub async fn wait_migration(&self, timeout: Duration) -> Result<(), RuntimeError> {
        let start = std::time::Instant::now();
        let mut delay = Duration::from_millis(2);
        loop {
            let s = self.migration().await?;
            match s.status.as_str() {
                "completed" => return Ok(()),
                "failed" | "cancelled" => {
                    return Err(err(QmpError::MigrationFailed {
                        status: s.status,
                        error: s.error.unwrap_or_default(),
                    }))
                }
                _ => {}
            }
            if start.elapsed() > timeout {
                return Err(err(QmpError::MigrationSlow {
                    status: s.status,
                    after: timeout,
                }));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(20));
        }
    }

    pub async fn quit(&self) -> Result<(), RuntimeError> {
        self.execute("quit", json!({})).await.map(drop)
    }
}

async fn read_msg(conn: &mut Conn) -> Result<Value, RuntimeError> {
    let mut line = String::new();
    let n = conn
        .rd
        .read_line(&mut line)
        .await
        .map_err(|e| err(QmpError::Read(e)))?;
    if n == 0 {
        return Err(err(QmpError::Closed));
    }
    serde_json::from_str(&line).map_err(|source| {
        err(QmpError::BadJson {
            line: line.clone(),
            source,
        })
    })
}
