//! `kalosd serve --cluster`: the store's shards replicated through NATS JetStream
//! (docs/CLUSTER.md).
//!
//! - Every shard `s` has a stream `KALOS_<name>_<s>` on subject `kalos.<name>.log.<s>`
//!   (replicas `--replicas`, file storage): the shard's write-ahead log. A client write is
//!   published there (each part with a `Nats-Msg-Id`, so a retry within the stream's duplicate
//!   window is stored once) and acknowledged to the client with the stream sequences once
//!   JetStream has acknowledged every part.
//! - For each shard this host holds, a durable pull consumer `<node>-<s>` starts after the
//!   sequence recorded in the local checkpoint and feeds the entries, in order, to the server
//!   thread as APPLY requests through an internal client handle.
//! - Recalls the server thread cannot answer alone come here: read-your-writes waits, forwarding
//!   to a holder of a shard (request/reply on `kalos.<name>.recall.<s>`, queue group `kalos`),
//!   scatter-gather over every shard with an exact top-k merge, stale reads on opt-in.
//!
//! All network work runs on a small tokio runtime; the server thread only hands requests over.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::{FutureExt, StreamExt};
use kalos::server::{Cluster, SlotReply};
use kalos::wire::cluster::{append_lag, append_token, apply, apply_entry_bytes, shard_of, ClusterRecall, FLAG_LOCAL};
use kalos::wire::request::RecallHead;
use kalos::wire::response::{encode_recall_payloads, read_recall_payloads, recall_ids_at, recall_scores_at};
use kalos::wire::{Reader, Writer, FLAG_PAYLOADS};
use kalos::{Error, Hit, Kalos, Metric, Status};
use tokio::sync::watch;

/// How the host joins the cluster (`kalosd serve --cluster ...`).
#[derive(Debug, Clone)]
pub struct Config {
    /// The store's name in the cluster (streams and subjects); every host of the store uses
    /// the same one, whatever its local segment name.
    pub store: String,
    /// NATS server URLs, comma-separated.
    pub url: String,
    pub shards: u32,
    pub hold: Vec<u32>,
    pub node: String,
    pub replicas: usize,
    pub write_timeout: Duration,
    pub metric: Metric,
}

/// Subjects, stream and consumer names of store `name`.
fn stream_name(name: &str, s: u32) -> String {
    format!("KALOS_{}_{s}", name.replace('.', "_"))
}
fn log_subject(name: &str, s: u32) -> String {
    format!("kalos.{name}.log.{s}")
}
fn recall_subject(name: &str, s: u32) -> String {
    format!("kalos.{name}.recall.{s}")
}

/// Per shard: the last applied sequence (watched by read-your-writes waits), the entries known
/// to be pending, and whether the replica has caught up since its consumer started.
struct Shard {
    applied: watch::Sender<u64>,
    pending: AtomicU64,
    caught_up: AtomicBool,
}

pub struct Layer {
    name: String,
    cfg: Config,
    held: Vec<bool>,
    shards: Vec<Shard>,
    rt: tokio::runtime::Runtime,
    client: async_nats::Client,
    js: jetstream::Context,
    /// Unix ms when the connection to NATS was lost; 0 while connected.
    down_since: Arc<AtomicU64>,
    /// The internal client handle on this host's own store (set once the store serves).
    local: OnceLock<Arc<Kalos>>,
    local_ready: watch::Sender<bool>,
    msg_ids: AtomicU64,
    /// Time this process started (message ids of different incarnations never collide).
    incarnation: u64,
    me: Weak<Layer>,
}

impl std::fmt::Debug for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layer").field("name", &self.name).field("cfg", &self.cfg).finish()
    }
}

fn now_ms() -> u64 {
    kalos::types::now_unix_ms()
}

fn err(status: Status, m: impl Into<String>) -> Error {
    Error::new(status, m)
}

impl Layer {
    /// Connects to NATS (in the background when it is not reachable yet) and creates the
    /// shards' streams when they are missing.
    pub fn start(cfg: Config) -> Result<Arc<Layer>, String> {
        let name = cfg.store.clone();
        let name = name.as_str();
        if cfg.shards == 0 || cfg.shards as usize > kalos::wire::cluster::MAX_SHARDS {
            return Err(format!("--shard-count {} must be between 1 and {}", cfg.shards, kalos::wire::cluster::MAX_SHARDS));
        }
        let mut held = vec![false; cfg.shards as usize];
        for &s in &cfg.hold {
            if s >= cfg.shards {
                return Err(format!("--shards names shard {s}; the store has {} (0..{})", cfg.shards, cfg.shards - 1));
            }
            held[s as usize] = true;
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kalos-cluster")
            .enable_all()
            .build()
            .map_err(|e| format!("cluster runtime: {e}"))?;
        let down_since = Arc::new(AtomicU64::new(now_ms()));
        let urls: Vec<async_nats::ServerAddr> =
            cfg.url.split(',').map(|u| u.trim().parse()).collect::<Result<_, _>>().map_err(|e| format!("--cluster {}: {e}", cfg.url))?;
        let ds = down_since.clone();
        let client = rt
            .block_on(
                async_nats::ConnectOptions::new()
                    .name(format!("kalosd-{name}-{}", cfg.node))
                    .retry_on_initial_connect()
                    // Only the URLs given: a host's reachability is what its operator set up.
                    .ignore_discovered_servers()
                    .max_reconnects(None)
                    .connection_timeout(Duration::from_secs(1))
                    .ping_interval(Duration::from_secs(1))
                    .reconnect_delay_callback(|n| Duration::from_millis((50 * n as u64).min(500)))
                    .event_callback(move |ev| {
                        let ds = ds.clone();
                        async move {
                            match ev {
                                async_nats::Event::Connected => {
                                    ds.store(0, Ordering::SeqCst);
                                    log::info!("cluster: connected to NATS");
                                }
                                async_nats::Event::Disconnected => {
                                    let _ = ds.compare_exchange(0, now_ms(), Ordering::SeqCst, Ordering::SeqCst);
                                    log::warn!("cluster: disconnected from NATS");
                                }
                                other => log::info!("cluster: NATS event: {other}"),
                            }
                        }
                    })
                    .connect(urls),
            )
            .map_err(|e| format!("--cluster {}: {e}", cfg.url))?;
        let js = {
            let _in_runtime = rt.enter();
            let mut js = jetstream::new(client.clone());
            // API requests fail fast and are retried (the loops below) rather than wait 10 s.
            js.set_timeout(Duration::from_secs(2));
            js
        };
        let shards = (0..cfg.shards)
            .map(|_| Shard { applied: watch::channel(0).0, pending: AtomicU64::new(0), caught_up: AtomicBool::new(false) })
            .collect();
        let layer = Arc::new_cyclic(|me| Layer {
            me: me.clone(),
            name: name.to_string(),
            held,
            shards,
            rt,
            client,
            js,
            down_since,
            local: OnceLock::new(),
            local_ready: watch::channel(false).0,
            msg_ids: AtomicU64::new(0),
            incarnation: now_ms(),
            cfg,
        });
        let l = layer.clone();
        layer.rt.spawn(async move { l.ensure_streams().await });
        for s in 0..layer.cfg.shards {
            if layer.held[s as usize] {
                let l = layer.clone();
                layer.rt.spawn(async move { l.serve_remote(s).await });
            }
        }
        Ok(layer)
    }

    /// The store serves: the internal handle through which log entries are applied and local
    /// parts of recalls are answered.
    pub fn set_local(&self, k: Arc<Kalos>) {
        let _ = self.local.set(k);
        self.local_ready.send_replace(true);
    }

    fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// (entries behind, ms since the connection was lost) of shard `s`'s replica.
    fn lag(&self, s: u32) -> (u64, u64) {
        let d = self.down_since.load(Ordering::SeqCst);
        (self.shards[s as usize].pending.load(Ordering::SeqCst), if d == 0 { 0 } else { now_ms().saturating_sub(d) })
    }

    async fn ensure_streams(self: Arc<Self>) {
        for s in 0..self.cfg.shards {
            loop {
                let cfg = stream::Config {
                    name: stream_name(&self.name, s),
                    subjects: vec![log_subject(&self.name, s)],
                    num_replicas: self.cfg.replicas,
                    storage: stream::StorageType::File,
                    duplicate_window: Duration::from_secs(120),
                    ..Default::default()
                };
                match self.js.get_or_create_stream(cfg).await {
                    Ok(_) => break,
                    Err(e) => {
                        log::warn!("cluster: stream {} not ready: {e}; retrying", stream_name(&self.name, s));
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        }
        log::info!("cluster: {} shard streams ready", self.cfg.shards);
    }

    async fn local(&self) -> Arc<Kalos> {
        let mut rx = self.local_ready.subscribe();
        let _ = rx.wait_for(|&r| r).await;
        self.local.get().expect("set before ready").clone()
    }

    /// Applies shard `s`'s log from `from + 1` on, forever: (re)creates the durable consumer
    /// after every failure, starting after the last applied sequence.
    async fn apply_loop(self: Arc<Self>, s: u32, from: u64) {
        let local = self.local().await;
        let sh = &self.shards[s as usize];
        log::info!("cluster: shard {s}: catching up from log sequence {}", from + 1);
        loop {
            if let Err(e) = self.apply_once(s, &local).await {
                log::warn!("cluster: shard {s}: applying the log stopped: {e}; resuming after {}", *sh.applied.borrow());
            }
            sh.caught_up.store(false, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn apply_once(&self, s: u32, local: &Arc<Kalos>) -> Result<(), String> {
        let sh = &self.shards[s as usize];
        let stream = self.js.get_stream(stream_name(&self.name, s)).await.map_err(|e| e.to_string())?;
        let durable = format!("{}-{s}", self.cfg.node);
        let start = *sh.applied.borrow() + 1;
        let _ = stream.delete_consumer(&durable).await;
        let mut consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(durable.clone()),
                deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence { start_sequence: start },
                ack_policy: jetstream::consumer::AckPolicy::All,
                max_ack_pending: 100_000,
                inactive_threshold: Duration::from_secs(3600),
                // The local checkpoint, not the consumer, says where to resume (it is recreated
                // at every start): one in-memory replica is created at once, without a Raft
                // group of its own.
                num_replicas: 1,
                memory_storage: true,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let info = consumer.info().await.map_err(|e| e.to_string())?;
        log::info!("cluster: shard {s}: consumer {durable} reads from log sequence {start}; {} entries pending", info.num_pending);
        sh.pending.store(info.num_pending, Ordering::SeqCst);
        if info.num_pending == 0 {
            sh.caught_up.store(true, Ordering::SeqCst);
        }
        let mut msgs =
            consumer.stream().max_messages_per_batch(1000).heartbeat(Duration::from_secs(1)).messages().await.map_err(|e| e.to_string())?;
        let room = local.slot_bytes().saturating_sub(64);
        let mut next = None;
        loop {
            let first = match msgs.next().await {
                None => return Err("the consumer's message stream ended".into()),
                Some(m) => m.map_err(|e| e.to_string())?,
            };
            let mut batch = vec![first];
            let mut size = apply_entry_bytes(batch[0].payload.len());
            // Everything already delivered goes into the same APPLY request (one group commit).
            while batch.len() < 4096 {
                match msgs.next().now_or_never() {
                    Some(Some(Ok(m))) => {
                        let b = apply_entry_bytes(m.payload.len());
                        if size + b > room {
                            self.apply_batch(s, local, std::mem::take(&mut batch), &mut next).await?;
                            size = 0;
                        }
                        size += b;
                        batch.push(m);
                    }
                    Some(Some(Err(e))) => return Err(e.to_string()),
                    _ => break,
                }
            }
            self.apply_batch(s, local, batch, &mut next).await?;
        }
    }

    /// Applies `batch` in one APPLY request. `next` is the sequence the consumer must deliver
    /// next (`None` at the start of a consumer, whose first entry is the stream's first at or
    /// after the start sequence). A delivery that skips sequences (lost in a reconnection, while
    /// the consumer counts it delivered) ends the consumer with an error after the entries
    /// before the gap are applied: the caller reads again from the first missing one.
    async fn apply_batch(&self, s: u32, local: &Arc<Kalos>, batch: Vec<jetstream::Message>, next: &mut Option<u64>) -> Result<(), String> {
        let sh = &self.shards[s as usize];
        let mut entries = Vec::with_capacity(batch.len());
        let (mut last, mut pending, mut gap) = (None, 0, None);
        for m in &batch {
            let info = m.info().map_err(|e| e.to_string())?;
            let seq = info.stream_sequence;
            match *next {
                Some(n) if seq < n => continue, // delivered again
                Some(n) if seq > n => {
                    gap = Some((n, seq));
                    break;
                }
                _ => {}
            }
            *next = Some(seq + 1);
            pending = info.pending;
            last = Some(m);
            entries.push((s, seq, m.payload.to_vec()));
        }
        if let Some(m) = last {
            let last_seq = entries.last().map_or(0, |e| e.1);
            let mut w = Writer::new();
            let refs: Vec<(u32, u64, &[u8])> = entries.iter().map(|(a, b, c)| (*a, *b, &c[..])).collect();
            apply(&mut w, &refs);
            let local = local.clone();
            let req = w.buf;
            tokio::task::spawn_blocking(move || local.call_raw(&req, Some(30_000)))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("APPLY: {e}"))?;
            log::debug!("cluster: shard {s}: applied log entries up to {last_seq} ({pending} pending)");
            sh.applied.send_replace(last_seq);
            sh.pending.store(pending, Ordering::SeqCst);
            if pending == 0 && gap.is_none() {
                sh.caught_up.store(true, Ordering::SeqCst);
            }
            m.ack().await.map_err(|e| e.to_string())?;
        }
        match gap {
            Some((n, seq)) => Err(format!("log entry {n} was not delivered (the consumer went on at {seq})")),
            None => Ok(()),
        }
    }

    /// Appends a write's parts to their shards' streams; answers once every part is
    /// acknowledged, or with UNAVAILABLE at the write deadline.
    async fn write_parts(&self, parts: Vec<(u32, Vec<u8>)>, prefix: Vec<u8>) -> Result<Vec<u8>, Error> {
        if !self.connected() {
            let d = self.down_since.load(Ordering::SeqCst);
            return Err(err(
                Status::Unavailable,
                format!(
                    "this host is cut off from NATS ({} ms); the write was not logged and nothing changed",
                    if d == 0 { 0 } else { now_ms().saturating_sub(d) }
                ),
            ));
        }
        let deadline = Instant::now() + self.cfg.write_timeout;
        let id = self.msg_ids.fetch_add(1, Ordering::Relaxed);
        let mut token = Vec::with_capacity(parts.len());
        let acks = parts.into_iter().map(|(s, entry)| {
            let msg_id = format!("{}-{}-{id}-{s}", self.cfg.node, self.incarnation);
            async move { self.publish_until(s, entry, msg_id, deadline).await.map(|q| (s, q)) }
        });
        for r in futures_util::future::join_all(acks).await {
            token.push(r?);
        }
        let mut body = prefix;
        append_token(&mut body, &token);
        Ok(body)
    }

    async fn publish_until(&self, s: u32, entry: Vec<u8>, msg_id: String, deadline: Instant) -> Result<u64, Error> {
        let payload = bytes::Bytes::from(entry);
        let mut last = String::from("no attempt");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(err(
                    Status::Unavailable,
                    format!(
                        "the log of shard {s} did not acknowledge the write within {} ms ({last}); it may or may not have been logged",
                        self.cfg.write_timeout.as_millis()
                    ),
                ));
            }
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", msg_id.as_str());
            let attempt = async {
                let ack = self.js.publish_with_headers(log_subject(&self.name, s), h, payload.clone()).await.map_err(|e| e.to_string())?;
                ack.await.map_err(|e| e.to_string())
            };
            match tokio::time::timeout(left, attempt).await {
                Ok(Ok(a)) => return Ok(a.sequence),
                Ok(Err(e)) => last = e,
                Err(_) => last = "timed out".into(),
            }
            tokio::time::sleep(Duration::from_millis(50).min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }

    /// Waits until shard `s` has applied `seq`, or the deadline.
    async fn wait_applied(&self, s: u32, seq: u64, deadline: Instant) -> Result<(), Error> {
        let mut rx = self.shards[s as usize].applied.subscribe();
        let left = deadline.saturating_duration_since(Instant::now());
        let ok = matches!(tokio::time::timeout(left, rx.wait_for(|&a| a >= seq)).await, Ok(Ok(_)));
        if ok {
            return Ok(());
        }
        let have = *self.shards[s as usize].applied.borrow();
        Err(err(
            Status::Timeout,
            format!("the replica of shard {s} had applied log sequence {have} of the {seq} asked for when the deadline passed"),
        ))
    }

    /// Answers a recall for the shards in `want` from this host's table: waits for the
    /// requested sequences, refuses a possibly stale replica unless the caller opted in. Returns
    /// the recall body and the lag.
    async fn recall_here(&self, req: &[u8], want: &[u32], c: &ClusterRecall, deadline: Instant) -> Result<(Vec<u8>, (u64, u64)), Error> {
        let mut lag = (0, 0);
        for &s in want {
            let sh = &self.shards[s as usize];
            let connected = self.connected();
            let stale = !connected || !sh.caught_up.load(Ordering::SeqCst);
            if stale && connected && !c.allow_stale && c.min_seq(s) > 0 {
                // Catching up: the sequence the caller asked for bounds what it needs to see.
                self.wait_applied(s, c.min_seq(s), deadline).await?;
                continue;
            }
            if stale && !c.allow_stale {
                let (e, ms) = self.lag(s);
                return Err(err(
                    Status::Stale,
                    format!("the replica of shard {s} may be behind its log ({e} entries pending, {ms} ms cut off from NATS); opt in to stale reads to read it"),
                ));
            }
            if stale {
                let l = self.lag(s);
                lag = (lag.0.max(l.0), lag.1.max(l.1));
            } else {
                self.wait_applied(s, c.min_seq(s), deadline).await?;
            }
        }
        let mut local_req = req.to_vec();
        let flags = u32::from_le_bytes(local_req[12..16].try_into().unwrap()) | FLAG_LOCAL;
        local_req[12..16].copy_from_slice(&flags.to_le_bytes());
        let local = self.local().await;
        let ms = deadline.saturating_duration_since(Instant::now()).as_millis().max(1) as u64;
        let body = tokio::task::spawn_blocking(move || local.call_raw(&local_req, Some(ms)))
            .await
            .map_err(|e| err(Status::Internal, e.to_string()))??;
        Ok((body, lag))
    }

    /// A RECALL the server thread handed over: local part, remote parts, exact merge.
    async fn recall(&self, req: Vec<u8>) -> Result<Vec<u8>, Error> {
        let h = RecallHead::decode(&mut Reader::new(&req[4..]))?;
        let c = h.cluster.clone().unwrap_or_default();
        let wait = if h.cluster.is_some() { c.wait_ms as u64 } else { 5_000 };
        let deadline = Instant::now() + Duration::from_millis(wait);
        let n = self.cfg.shards;
        let mut want: Vec<u32> = match &h.namespaces {
            Some(ns) => ns.iter().map(|&x| shard_of(x, n)).collect(),
            None => (0..n).collect(),
        };
        want.sort_unstable();
        want.dedup();
        // Held shards are read here when fresh (or on opt-in); the others are forwarded.
        let fresh = self.connected();
        let (here, away): (Vec<u32>, Vec<u32>) = want.iter().partition(|&&s| {
            self.held[s as usize] && (c.allow_stale || (fresh && self.shards[s as usize].caught_up.load(Ordering::SeqCst)))
        });
        let remote = away.iter().map(|&s| self.forward(s, &req, deadline));
        let (mine, theirs) = tokio::join!(
            async {
                if here.is_empty() {
                    Ok(None)
                } else {
                    self.recall_here(&req, &here, &c, deadline).await.map(Some)
                }
            },
            futures_util::future::join_all(remote)
        );
        let mut parts = Vec::new();
        let mut lag = (0, 0);
        for r in std::iter::once(mine).chain(theirs.into_iter().map(|r| r.map(Some))) {
            if let Some((body, l)) = r? {
                lag = (lag.0.max(l.0), lag.1.max(l.1));
                parts.push(body);
            }
        }
        let mut out = merge(&parts, h.nq, h.k, h.flags & FLAG_PAYLOADS != 0, self.cfg.metric)?;
        if c.allow_stale {
            append_lag(&mut out, lag.0, lag.1);
        }
        Ok(out)
    }

    /// Sends a recall to a host holding shard `s`; its reply is `status u32 | lag_entries u64 |
    /// lag_ms u64 | body`.
    async fn forward(&self, s: u32, req: &[u8], deadline: Instant) -> Result<(Vec<u8>, (u64, u64)), Error> {
        if !self.connected() {
            return Err(err(
                Status::Stale,
                format!("shard {s} is not held here and this host is cut off from NATS; opt in to stale reads only reads shards held here"),
            ));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let mut payload = s.to_le_bytes().to_vec();
        payload.extend_from_slice(req);
        let r = tokio::time::timeout(left, self.client.request(recall_subject(&self.name, s), payload.into())).await;
        let m = match r {
            Err(_) => return Err(err(Status::Timeout, format!("no host holding shard {s} answered within the deadline"))),
            Ok(Err(e)) => return Err(err(Status::Unavailable, format!("no host holding shard {s} answered: {e}"))),
            Ok(Ok(m)) => m,
        };
        let b = &m.payload[..];
        if b.len() < 20 {
            return Err(err(Status::Internal, format!("a malformed forwarded reply for shard {s}")));
        }
        let st = Status::from_u32(u32::from_le_bytes(b[..4].try_into().unwrap()));
        let lag = (u64::from_le_bytes(b[4..12].try_into().unwrap()), u64::from_le_bytes(b[12..20].try_into().unwrap()));
        if st != Status::Ok {
            return Err(err(st, format!("shard {s}: {}", String::from_utf8_lossy(&b[20..]))));
        }
        Ok((b[20..].to_vec(), lag))
    }

    /// Answers forwarded recalls for shard `s` (queue group: one holder answers each).
    async fn serve_remote(self: Arc<Self>, s: u32) {
        loop {
            let sub = match self.client.queue_subscribe(recall_subject(&self.name, s), "kalos".into()).await {
                Ok(sub) => sub,
                Err(e) => {
                    log::warn!("cluster: subscribing to shard {s}'s recalls: {e}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            let mut sub = sub;
            while let Some(m) = sub.next().await {
                let l = self.clone();
                tokio::spawn(async move {
                    let Some(reply) = m.reply.clone() else { return };
                    let out = l.answer_forwarded(s, &m.payload).await;
                    let mut b = Vec::new();
                    match out {
                        Ok((body, lag)) => {
                            b.extend_from_slice(&(Status::Ok as u32).to_le_bytes());
                            b.extend_from_slice(&lag.0.to_le_bytes());
                            b.extend_from_slice(&lag.1.to_le_bytes());
                            b.extend_from_slice(&body);
                        }
                        Err(e) => {
                            b.extend_from_slice(&(e.status as u32).to_le_bytes());
                            b.extend_from_slice(&[0u8; 16]);
                            b.extend_from_slice(e.message.as_bytes());
                        }
                    }
                    let _ = l.client.publish(reply, b.into()).await;
                });
            }
        }
    }

    async fn answer_forwarded(&self, s: u32, payload: &[u8]) -> Result<(Vec<u8>, (u64, u64)), Error> {
        let req = payload.get(4..).filter(|r| r.len() >= 16).ok_or_else(|| err(Status::InvalidArgument, "a malformed forwarded recall"))?;
        let h = RecallHead::decode(&mut Reader::new(&req[4..]))?;
        let c = h.cluster.clone().unwrap_or_default();
        let wait = if h.cluster.is_some() { c.wait_ms as u64 } else { 5_000 };
        self.recall_here(req, &[s], &c, Instant::now() + Duration::from_millis(wait)).await
    }
}

/// Merges recall bodies that each hold the exact top-k of a set of rows (sets that together
/// cover every shard, possibly overlapping: a host answers from its whole table) into the
/// exact top-k of their union: per query, hits by score (ties by lower id), each id once.
fn merge(parts: &[Vec<u8>], nq: usize, k: usize, payloads: bool, metric: Metric) -> Result<Vec<u8>, Error> {
    let mut lists: Vec<Vec<Hit>> = vec![Vec::new(); nq];
    let mut pay: HashMap<u64, Option<Vec<u8>>> = HashMap::new();
    for p in parts {
        if payloads {
            if nq != 1 {
                return Err(err(Status::InvalidArgument, "a recall with payloads has one query"));
            }
            for (hit, pl) in read_recall_payloads(p)? {
                pay.entry(hit.id).or_insert_with(|| pl.map(<[u8]>::to_vec));
                lists[0].push(hit);
            }
            continue;
        }
        let counts: Vec<usize> = (0..nq)
            .map(|i| p.get(4 * i..4 * i + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| err(Status::Internal, "a short recall body"))?;
        let total: usize = counts.iter().sum();
        let (ids_at, sc_at) = (recall_ids_at(nq), recall_scores_at(nq, total));
        if p.len() < sc_at + 4 * total {
            return Err(err(Status::Internal, "a short recall body"));
        }
        let mut j = 0;
        for (i, &c) in counts.iter().enumerate() {
            for _ in 0..c {
                let id = u64::from_le_bytes(p[ids_at + 8 * j..ids_at + 8 * j + 8].try_into().unwrap());
                let score = f32::from_le_bytes(p[sc_at + 4 * j..sc_at + 4 * j + 4].try_into().unwrap());
                lists[i].push(Hit { id, score });
                j += 1;
            }
        }
    }
    let lower_better = metric == Metric::L2;
    for l in &mut lists {
        l.sort_by(|a, b| {
            let o = if lower_better { a.score.total_cmp(&b.score) } else { b.score.total_cmp(&a.score) };
            o.then(a.id.cmp(&b.id))
        });
        l.dedup_by_key(|h| h.id);
        l.truncate(k);
    }
    if payloads {
        let mut w = Writer::new();
        encode_recall_payloads(&mut w, lists.iter().map(|l| &l[..]), |h| pay.get(&h.id).and_then(|p| p.as_deref()));
        return Ok(w.buf);
    }
    let mut b = Vec::new();
    for l in &lists {
        b.extend_from_slice(&(l.len() as u32).to_le_bytes());
    }
    for l in &lists {
        for h in l {
            b.extend_from_slice(&h.id.to_le_bytes());
        }
    }
    for l in &lists {
        for h in l {
            b.extend_from_slice(&h.score.to_le_bytes());
        }
    }
    Ok(b)
}

impl Cluster for Layer {
    fn shards(&self) -> u32 {
        self.cfg.shards
    }
    fn holds(&self, shard: u32) -> bool {
        self.held.get(shard as usize).copied().unwrap_or(false)
    }
    fn stale(&self, shard: u32) -> bool {
        !self.connected() || !self.shards[shard as usize].caught_up.load(Ordering::SeqCst)
    }
    fn attach(&self, applied: Vec<u64>) {
        for s in 0..self.cfg.shards {
            let a = applied.get(s as usize).copied().unwrap_or(0);
            self.shards[s as usize].applied.send_replace(a);
            if self.held[s as usize] {
                let l = self.self_arc();
                self.rt.spawn(async move { l.apply_loop(s, a).await });
            }
        }
    }
    fn write(&self, parts: Vec<(u32, Vec<u8>)>, prefix: Vec<u8>, reply: SlotReply) {
        let l = self.self_arc();
        self.rt.spawn(async move {
            match l.write_parts(parts, prefix).await {
                Ok(body) => reply.send(Status::Ok, &body),
                Err(e) => reply.fail(&e),
            }
        });
    }
    fn recall(&self, request: Vec<u8>, reply: SlotReply) {
        let l = self.self_arc();
        self.rt.spawn(async move {
            match l.recall(request).await {
                Ok(body) => reply.send(Status::Ok, &body),
                Err(e) => reply.fail(&e),
            }
        });
    }
}

impl Layer {
    /// This layer as an `Arc` (the trait's methods take `&self`; tasks need to own it).
    fn self_arc(&self) -> Arc<Layer> {
        self.me.upgrade().expect("the layer lives while its store serves")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(lists: &[&[(u64, f32)]]) -> Vec<u8> {
        let hits: Vec<Vec<Hit>> = lists.iter().map(|l| l.iter().map(|&(id, score)| Hit { id, score }).collect()).collect();
        let mut b = Vec::new();
        for l in &hits {
            b.extend_from_slice(&(l.len() as u32).to_le_bytes());
        }
        for h in hits.iter().flatten() {
            b.extend_from_slice(&h.id.to_le_bytes());
        }
        for h in hits.iter().flatten() {
            b.extend_from_slice(&h.score.to_le_bytes());
        }
        b
    }

    #[test]
    fn merge_is_exact_and_dedups() {
        let a = body(&[&[(1, 0.9), (2, 0.5)], &[(7, 0.1)]]);
        let b = body(&[&[(3, 0.8), (1, 0.9)], &[(8, 0.3), (9, 0.2)]]);
        let m = merge(&[a, b], 2, 2, false, Metric::Cosine).unwrap();
        assert_eq!(m, body(&[&[(1, 0.9), (3, 0.8)], &[(8, 0.3), (9, 0.2)]]));
        let a = body(&[&[(1, 0.1), (2, 0.5)]]);
        let b = body(&[&[(3, 0.05)]]);
        assert_eq!(merge(&[a, b], 1, 2, false, Metric::L2).unwrap(), body(&[&[(3, 0.05), (1, 0.1)]]));
    }
}
