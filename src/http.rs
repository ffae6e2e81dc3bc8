//! The worker's HTTP endpoint: `/metrics` (Prometheus text format),
//! `/healthz` (the consumer loop is alive) and `/readyz` (joined the group,
//! and no partition is retrying a transient failure).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::now_secs;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Liveness and readiness, written by the worker, read by the endpoint.
#[derive(Debug, Default)]
pub struct Health {
    /// Set once the worker has joined its group and received an assignment.
    pub ready: AtomicBool,
    /// Unix seconds of the consumer loop's last iteration.
    pub last_poll: AtomicU64,
    /// Partitions retrying a transient failure right now.
    pub degraded: std::sync::atomic::AtomicUsize,
}

/// Held while a partition retries a transient failure: readiness reports
/// degraded until every guard is dropped.
pub struct Degraded<'a>(&'a Health);

impl Drop for Degraded<'_> {
    fn drop(&mut self) {
        self.0.recovered();
    }
}

/// The consumer loop is considered stuck after this long without an iteration.
pub const STALL_AFTER: Duration = Duration::from_secs(60);
/// Connections served at once; more wait in the listen backlog until one
/// ends (each ends within [`REQUEST_TIMEOUT`]), so that idle connections
/// cannot make the endpoint hold a task and a buffer each without bound.
pub const MAX_CONNECTIONS: usize = 64;
/// Longest a connection may take to send its request head.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

impl Health {
    pub fn beat(&self) {
        self.last_poll.store(now_secs(), Ordering::Relaxed);
    }
    /// Marks one partition degraded until the guard is dropped.
    pub fn degrade(&self) -> Degraded<'_> {
        self.degraded_one();
        Degraded(self)
    }
    /// Marks one partition degraded until [`Health::recovered`] (a stopped
    /// partition, which outlives any one thread's scope).
    pub fn degraded_one(&self) {
        self.degraded.fetch_add(1, Ordering::SeqCst);
        metrics::gauge!(crate::metrics::DEGRADED_PARTITIONS).increment(1.0);
    }
    pub fn recovered(&self) {
        self.degraded.fetch_sub(1, Ordering::SeqCst);
        metrics::gauge!(crate::metrics::DEGRADED_PARTITIONS).decrement(1.0);
    }
    pub fn alive(&self) -> bool {
        now_secs().saturating_sub(self.last_poll.load(Ordering::Relaxed)) < STALL_AFTER.as_secs()
    }
}

/// Binds `addr` and serves until the process exits. Returns the bound address.
pub async fn serve(addr: SocketAddr, metrics: PrometheusHandle, health: Arc<Health>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let mut stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, typically: accepting again at
                    // once would spin a core until one is free.
                    tracing::debug!(error = %e, "accepting a connection to the metrics endpoint failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let metrics = metrics.clone();
            let health = health.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let mut buf = vec![0u8; 4096];
                let mut n = 0;
                // Read the request head (bounded in size and time).
                let read = tokio::time::timeout(REQUEST_TIMEOUT, async {
                    while n < buf.len() {
                        match stream.read(&mut buf[n..]).await {
                            Ok(0) | Err(_) => break,
                            Ok(k) => n += k,
                        }
                        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                })
                .await;
                if read.is_err() {
                    return;
                }
                let head = String::from_utf8_lossy(&buf[..n]);
                let path = head.split_whitespace().nth(1).unwrap_or("/");
                let (status, ctype, body) = route(path, &metrics, &health);
                let resp = format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                let _ = stream.write_all(resp.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(bound)
}

fn route(path: &str, metrics: &PrometheusHandle, health: &Health) -> (&'static str, &'static str, String) {
    const TEXT: &str = "text/plain; charset=utf-8";
    match path {
        "/metrics" => {
            metrics.run_upkeep();
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", metrics.render())
        }
        "/healthz" if health.alive() => ("200 OK", TEXT, "ok\n".into()),
        "/healthz" => ("503 Service Unavailable", TEXT, "consumer loop stalled\n".into()),
        "/readyz" if health.degraded.load(Ordering::Relaxed) > 0 => {
            ("503 Service Unavailable", TEXT, format!("degraded: {} partition(s) retrying a transient failure or stopped (see the log)\n", health.degraded.load(Ordering::Relaxed)))
        }
        "/readyz" if health.ready.load(Ordering::Relaxed) && health.alive() => ("200 OK", TEXT, "ready\n".into()),
        "/readyz" => ("503 Service Unavailable", TEXT, "not ready\n".into()),
        _ => ("404 Not Found", TEXT, "not found\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// [`MAX_CONNECTIONS`] idle connections hold the endpoint's every slot:
    /// the next request is not served (its connection waits in the
    /// backlog) until one of them closes, then it is.
    #[test]
    fn idle_connections_take_at_most_the_bound_and_a_request_waits_for_a_slot() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder().handle();
        let addr = rt.block_on(serve("127.0.0.1:0".parse().unwrap(), handle, Arc::default())).unwrap();
        let get = |s: &mut std::net::TcpStream| s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        // Each idle connection is served (holds a slot) once a request on
        // another is answered after it: accepted in order.
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(std::net::TcpStream::connect(addr).unwrap());
        }
        let mut waiting = std::net::TcpStream::connect(addr).unwrap();
        get(&mut waiting);
        waiting.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let mut byte = [0u8; 1];
        let e = waiting.read(&mut byte).expect_err("answered while every slot is held");
        assert!(matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{e}");
        drop(idle.pop());
        waiting.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut answer = String::new();
        waiting.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    }
}
