//! `kalosd serve --metrics ADDR`: the store's statistics in the Prometheus text exposition format
//! (version 0.0.4) at `GET /metrics`, over a minimal HTTP/1.0 responder on one thread. Each
//! scrape asks the server for its stats through an ordinary client round trip, so the numbers
//! are the server's own. Only loopback or a trusted network should reach it: it has no
//! authentication (the same trust as `/dev/shm/kalos.<name>` itself).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use kalos::{op_name, types::now_unix_ms, Kalos, Stats, Status, LATENCY_BUCKETS_NS};

/// How long one scrape may take to send its request line before it is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Endpoint {
    addr: SocketAddr,
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Binds `addr` and serves scrapes until [`Endpoint::stop`] or `stop` becomes true.
    pub fn start(addr: SocketAddr, k: Arc<Kalos>, stop: &'static AtomicBool) -> std::io::Result<Endpoint> {
        let l = TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        let addr = l.local_addr()?;
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let thread = std::thread::Builder::new().name("kalosd-metrics".into()).spawn(move || {
            while !d.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, peer)) => {
                        if let Err(e) = answer(s, &k) {
                            log::debug!("metrics: scrape from {peer} failed: {e}");
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
                    Err(e) => {
                        log::warn!("metrics: accept failed: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })?;
        Ok(Endpoint { addr, done, thread: Some(thread) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stop(mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request (its head, within [`READ_TIMEOUT`]) and answers it.
fn answer(mut s: TcpStream, k: &Kalos) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(READ_TIMEOUT))?;
    s.set_write_timeout(Some(READ_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > 8192 {
            return respond(&mut s, "431 Request Header Fields Too Large", "text/plain", "request head too large\n");
        }
    }
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return respond(&mut s, "405 Method Not Allowed", "text/plain", "only GET\n");
    }
    if path != "/metrics" && !path.starts_with("/metrics?") {
        return respond(&mut s, "404 Not Found", "text/plain", "metrics are at /metrics\n");
    }
    match k.stats() {
        Ok(st) => respond(&mut s, "200 OK", "text/plain; version=0.0.4; charset=utf-8", &render(&st, now_unix_ms())),
        Err(e) => respond(&mut s, "503 Service Unavailable", "text/plain", &format!("{e}\n")),
    }
}

fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &str) -> std::io::Result<()> {
    write!(s, "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())?;
    s.flush()
}

/// A label value with `\`, `"` and newlines escaped (the exposition format's rules).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn family(o: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The exposition text of `s`, with ages relative to `now_ms`.
pub fn render(s: &Stats, now_ms: u64) -> String {
    let mut o = String::with_capacity(4096);
    family(&mut o, "kalos_requests_total", "counter", "Requests answered by the server, by op and status.");
    for c in &s.requests_by {
        let _ =
            writeln!(o, "kalos_requests_total{{op=\"{}\",status=\"{}\"}} {}", op_name(c.op), Status::from_u32(c.status).name(), c.count);
    }
    family(&mut o, "kalos_errors_total", "counter", "Requests answered with a status other than OK, by op and status.");
    for c in s.requests_by.iter().filter(|c| c.status != Status::Ok as u32) {
        let _ = writeln!(o, "kalos_errors_total{{op=\"{}\",status=\"{}\"}} {}", op_name(c.op), Status::from_u32(c.status).name(), c.count);
    }
    family(
        &mut o,
        "kalos_request_duration_seconds",
        "histogram",
        "Server-side service time of the batch each request was answered in, by op.",
    );
    for l in &s.latency {
        let op = op_name(l.op);
        let mut cum = 0u64;
        for (i, &c) in l.buckets.iter().enumerate() {
            cum += c;
            match LATENCY_BUCKETS_NS.get(i) {
                Some(&ub) => {
                    let _ = writeln!(o, "kalos_request_duration_seconds_bucket{{op=\"{op}\",le=\"{}\"}} {cum}", ub as f64 / 1e9);
                }
                None => {
                    let _ = writeln!(o, "kalos_request_duration_seconds_bucket{{op=\"{op}\",le=\"+Inf\"}} {cum}");
                }
            }
        }
        let _ = writeln!(o, "kalos_request_duration_seconds_sum{{op=\"{op}\"}} {}", l.sum_ns as f64 / 1e9);
        let _ = writeln!(o, "kalos_request_duration_seconds_count{{op=\"{op}\"}} {cum}");
    }
    let gauges: [(&str, &str, &str, f64); 9] = [
        ("kalos_rows", "gauge", "Memories stored.", s.count as f64),
        ("kalos_capacity_rows", "gauge", "Most memories the store accepts.", s.capacity as f64),
        ("kalos_payload_bytes", "gauge", "Payload bytes stored.", s.payload_bytes as f64),
        ("kalos_queue_depth", "gauge", "Requests taken in the server's last batch.", s.queue_depth as f64),
        ("kalos_uptime_seconds", "gauge", "Time since the server started.", s.uptime_ms as f64 / 1e3),
        ("kalos_wal_bytes", "gauge", "Write-ahead log bytes since the newest snapshot (0 without a data directory).", s.wal_bytes as f64),
        (
            "kalos_engine_fallbacks_total",
            "counter",
            "Times the GPU engine failed and the server fell back to the CPU.",
            s.engine_fallbacks as f64,
        ),
        ("kalos_rerank_queries_total", "counter", "Queries answered by the int8 scan with exact re-ranking.", s.rerank_queries as f64),
        (
            "kalos_rerank_uncertain_total",
            "counter",
            "Int8-scan queries whose k-th exact score fell inside the 8-bit error bound (a true neighbour may have been missed).",
            s.rerank_uncertain as f64,
        ),
    ];
    for (name, kind, help, v) in gauges {
        family(&mut o, name, kind, help);
        let _ = writeln!(o, "{name} {v}");
    }
    family(
        &mut o,
        "kalos_engine_info",
        "gauge",
        "The engine serving, and why the CUDA engine is not (empty when it is or was not asked for).",
    );
    let _ = writeln!(o, "kalos_engine_info{{engine=\"{}\",fallback_reason=\"{}\"}} 1", label(&s.engine_name), label(&s.fallback_reason));
    if s.last_snapshot_unix_ms != 0 {
        family(&mut o, "kalos_last_snapshot_age_seconds", "gauge", "Time since the newest complete snapshot was written.");
        let _ = writeln!(o, "kalos_last_snapshot_age_seconds {}", now_ms.saturating_sub(s.last_snapshot_unix_ms) as f64 / 1e3);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use kalos::{OpLatency, OpStatusCount};

    #[test]
    fn histogram_is_cumulative_and_labels_are_escaped() {
        let s = Stats {
            engine_name: "cpu \"avx2\"\nx".into(),
            requests_by: vec![OpStatusCount { op: 1, status: 0, count: 3 }, OpStatusCount { op: 2, status: 7, count: 1 }],
            latency: vec![OpLatency { op: 1, buckets: vec![1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], sum_ns: 2_000_000_000 }],
            last_snapshot_unix_ms: 1_000,
            ..Stats::default()
        };
        let t = render(&s, 3_500);
        assert!(t.contains("kalos_requests_total{op=\"recall\",status=\"OK\"} 3"), "{t}");
        assert!(t.contains("kalos_errors_total{op=\"upsert\",status=\"STORE_FULL\"} 1"), "{t}");
        assert!(!t.contains("kalos_errors_total{op=\"recall\""), "{t}");
        assert!(t.contains("kalos_request_duration_seconds_bucket{op=\"recall\",le=\"0.000025\"} 3"), "{t}");
        assert!(t.contains("kalos_request_duration_seconds_bucket{op=\"recall\",le=\"+Inf\"} 4"), "{t}");
        assert!(t.contains("kalos_request_duration_seconds_count{op=\"recall\"} 4"), "{t}");
        assert!(t.contains("kalos_request_duration_seconds_sum{op=\"recall\"} 2"), "{t}");
        assert!(t.contains("engine=\"cpu \\\"avx2\\\"\\nx\""), "{t}");
        assert!(t.contains("kalos_last_snapshot_age_seconds 2.5"), "{t}");
    }
}
