//! Cluster mode (docs/CLUSTER.md): the server thread's side. A store served with a [`Cluster`]
//! holds some shards of a store split by namespace hash; each shard's replicated log lives
//! outside this crate (kalosd's NATS JetStream layer implements the trait).
//!
//! - A client write is checked here, split by shard into log entries and handed to
//!   [`Cluster::write`], which answers the client (through a [`SlotReply`]) once the log has
//!   acknowledged every part. Nothing is applied at that point.
//! - Log entries come back in order, per shard, as APPLY requests from the server's own process:
//!   applied like writes (logged to the local WAL, one group commit) and recorded as the shard's
//!   applied sequence; housekeeping writes that record to the data directory's checkpoint after
//!   the commit that covers it.
//! - A recall is answered here only when every shard it touches is held, fresh, and has applied
//!   the sequences the caller asked for; otherwise it goes to [`Cluster::recall`] (forwarding,
//!   scatter-gather, read-your-writes waits, stale reads). Recalls with `FLAG_LOCAL` (the
//!   cluster layer's own) are always answered here, from the local table.
//!
//! The server thread never waits on the network: requests handed off stay PROCESSING in their
//! slot until the cluster layer answers them.

use std::sync::Arc;

use super::publish::{publish_to, Reply};
use super::serve::Pending;
use super::write::upsert_items;
use super::Server;
use crate::error::{Error, Result, Status};
use crate::shm::{self, Segment};
use crate::types::now_unix_ms;
use crate::wire::cluster::{decode_apply, shard_of, LogEntry, FLAG_LOCAL};
use crate::wire::request::{self, decode_delete_where, decode_ids, decode_namespace, RecallHead, UpsertRequest};
use crate::wire::response::deleted;
use crate::wire::{Reader, Writer, OP_APPLY, OP_CLEAR, OP_DELETE, OP_DELETE_NS, OP_DELETE_WHERE, OP_RECALL, OP_UPSERT};

/// One part of a client write: the shard and its log entry.
pub type LogPart = (u32, Vec<u8>);

/// The replicated log and the other hosts, as the server thread sees them. Implemented by
/// kalosd's NATS layer; every method must return at once (no network wait on the caller).
pub trait Cluster: Send + Sync + std::fmt::Debug {
    /// The store's shard count.
    fn shards(&self) -> u32;
    /// Whether this host holds a replica of `shard`.
    fn holds(&self, shard: u32) -> bool;
    /// Whether the local replica of `shard` may be behind its log (cut off from the log, or
    /// catching up).
    fn stale(&self, shard: u32) -> bool;
    /// The server thread is about to serve; `applied` is the last log sequence applied per
    /// shard (from the data directory's checkpoint; zeros without one).
    fn attach(&self, applied: Vec<u64>);
    /// Appends a client write's log entries, `(shard, entry)`, and answers `reply` with
    /// `prefix` (the write's usual response body) and the write token once every part is
    /// acknowledged, or with an error.
    fn write(&self, parts: Vec<(u32, Vec<u8>)>, prefix: Vec<u8>, reply: SlotReply);
    /// Answers a RECALL request (`request`: op code included) that this host cannot answer
    /// alone.
    fn recall(&self, request: Vec<u8>, reply: SlotReply);
}

/// The answer to one request, owned by whoever will answer it: writes the response into the
/// request's slot, marks it DONE and wakes the client, from any thread. Dropped unanswered, it
/// answers SERVER_GONE.
pub struct SlotReply {
    seg: Arc<Segment>,
    slot: usize,
    word: u64,
    sent: bool,
}

impl SlotReply {
    /// Answers with `status` and `body`.
    pub fn send(mut self, status: Status, body: &[u8]) {
        self.sent = true;
        publish_to(&self.seg, self.slot, self.word, status, body);
    }
    /// Answers with an error.
    pub fn fail(self, e: &Error) {
        self.send(e.status, e.message.as_bytes());
    }
    /// The largest response body the slot holds.
    pub fn capacity(&self) -> usize {
        self.seg.data_bytes()
    }
}

impl Drop for SlotReply {
    fn drop(&mut self) {
        if !self.sent {
            publish_to(&self.seg, self.slot, self.word, Status::ServerGone, b"the cluster layer dropped the request");
        }
    }
}

/// A recall's `min_seqs` may name only the store's shards (trailing zeros aside): a sequence
/// for a shard beyond them is a token of another store or shard count, which no replica here
/// could ever satisfy or refute.
fn check_token(h: &RecallHead, shards: u32) -> Result<()> {
    let Some(c) = &h.cluster else { return Ok(()) };
    match c.min_seqs.iter().enumerate().skip(shards as usize).find(|(_, &q)| q != 0) {
        Some((s, q)) => Err(Error::new(
            Status::InvalidArgument,
            format!("min_seqs names shard {s} (log sequence {q}) but the store has {shards} shards: a write token of another store?"),
        )),
        None => Ok(()),
    }
}

impl Server {
    fn slot_reply(&self, p: &Pending) -> SlotReply {
        SlotReply { seg: self.seg.clone(), slot: p.slot, word: p.word, sent: false }
    }

    /// Cluster mode: hands off every client write of the batch and every recall this host
    /// cannot answer alone, marking them [`Reply::Handed`].
    pub(super) fn route_cluster(&mut self, batch: &[Pending], results: &mut [Option<Reply>]) {
        let Some(c) = self.cluster.clone() else { return };
        for (i, p) in batch.iter().enumerate() {
            match p.op() {
                op @ (OP_UPSERT | OP_DELETE | OP_DELETE_NS | OP_CLEAR | OP_DELETE_WHERE) => match self.split_write(&*c, op, p.body()) {
                    Ok((parts, prefix)) => {
                        c.write(parts, prefix, self.slot_reply(p));
                        results[i] = Some(Reply::Handed);
                    }
                    Err(e) => results[i] = Some(Reply::error(e.status, e.message)),
                },
                OP_APPLY if shm::pid_of(p.word) != std::process::id() => {
                    results[i] = Some(Reply::error(Status::InvalidArgument, "APPLY is accepted only from the server's own process"));
                }
                OP_RECALL => {
                    let Ok(h) = RecallHead::decode(&mut Reader::new(p.body())) else { continue }; // the recall path reports it
                    if h.flags & FLAG_LOCAL != 0 {
                        continue;
                    }
                    if let Err(e) = check_token(&h, c.shards()) {
                        results[i] = Some(Reply::error(e.status, e.message));
                        continue;
                    }
                    if self.answers_locally(&*c, &h) {
                        continue;
                    }
                    let req = match p.slot_len {
                        Some(len) => {
                            let mut b = Vec::new();
                            self.seg.read_data(p.slot, &mut b, len);
                            b
                        }
                        None => p.bytes().to_vec(),
                    };
                    c.recall(req, self.slot_reply(p));
                    results[i] = Some(Reply::Handed);
                }
                _ => {}
            }
        }
    }

    fn answers_locally(&self, c: &dyn Cluster, h: &RecallHead) -> bool {
        if h.cluster.as_ref().is_some_and(|x| x.allow_stale) {
            return false; // the reply carries the lag, which the cluster layer knows
        }
        let ok = |s: u32| {
            c.holds(s)
                && !c.stale(s)
                && self.applied.get(s as usize).copied().unwrap_or(0) >= h.cluster.as_ref().map_or(0, |x| x.min_seq(s))
        };
        match &h.namespaces {
            Some(ns) => ns.iter().all(|&n| ok(shard_of(n, c.shards()))),
            None => (0..c.shards()).all(ok),
        }
    }

    /// Checks a client write and splits it into log entries by shard; returns them and the
    /// response body the client gets before the write token.
    fn split_write(&self, c: &dyn Cluster, op: u32, body: &[u8]) -> Result<(Vec<LogPart>, Vec<u8>)> {
        let now = now_unix_ms();
        let all = |b: &[u8]| (0..c.shards()).map(|s| (s, LogEntry { created_ms: now, op, body: b }.encode())).collect::<Vec<_>>();
        match op {
            OP_UPSERT => {
                let u = UpsertRequest::decode(body, self.dim)?;
                let items = upsert_items(&u, self.dim, now)?;
                match self.store.validate_upsert(&items) {
                    // Capacity is each replica's own; its apply decides.
                    Err(e) if e.status != Status::StoreFull => return Err(e),
                    _ => {}
                }
                let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); c.shards() as usize];
                for (i, &ns) in u.namespaces.iter().enumerate() {
                    by_shard[shard_of(ns, c.shards()) as usize].push(i);
                }
                let mut parts = Vec::new();
                for (s, idx) in by_shard.iter().enumerate().filter(|(_, v)| !v.is_empty()) {
                    let mut w = Writer::new();
                    let ids: Vec<u64> = idx.iter().map(|&i| u.ids[i]).collect();
                    let ns: Vec<u64> = idx.iter().map(|&i| u.namespaces[i]).collect();
                    let vecs: Vec<f32> = idx.iter().flat_map(|&i| u.vectors[i * self.dim..(i + 1) * self.dim].iter().copied()).collect();
                    let pl: Vec<Option<&[u8]>> = idx.iter().map(|&i| u.payloads[i]).collect();
                    let fields: Option<Vec<_>> = (!u.fields.is_empty()).then(|| idx.iter().map(|&i| u.fields[i].clone()).collect());
                    let any_payload = pl.iter().any(Option::is_some);
                    request::upsert(
                        &mut w,
                        request::Namespaces::PerItem(&ns),
                        u.ttl_ms,
                        u.expires_ms,
                        &ids,
                        &vecs,
                        any_payload.then_some(&pl[..]),
                        fields.as_deref(),
                    );
                    parts.push((s as u32, LogEntry { created_ms: now, op, body: &w.buf[4..] }.encode()));
                }
                Ok((parts, Vec::new()))
            }
            OP_DELETE => {
                decode_ids(body)?;
                Ok((all(body), deleted(0)))
            }
            OP_DELETE_NS => {
                let ns = decode_namespace(body)?;
                Ok((vec![(shard_of(ns, c.shards()), LogEntry { created_ms: now, op, body }.encode())], deleted(0)))
            }
            OP_DELETE_WHERE => {
                let f = decode_delete_where(body)?;
                let parts = match &f.namespaces {
                    None => all(body),
                    Some(ns) => {
                        let mut s: Vec<u32> = ns.iter().map(|&n| shard_of(n, c.shards())).collect();
                        s.sort_unstable();
                        s.dedup();
                        s.into_iter().map(|s| (s, LogEntry { created_ms: now, op, body }.encode())).collect()
                    }
                };
                Ok((parts, deleted(0)))
            }
            _ => Ok((all(body), deleted(0))), // OP_CLEAR
        }
    }

    /// Applies an APPLY request's log entries in order (each logged to the local WAL; the
    /// caller commits). Entries at or below a shard's applied sequence were applied before and
    /// are skipped. An entry that fails for a reason every replica shares (a bad id, a full
    /// store) is counted and passed; a local persistence failure stops the request.
    pub(super) fn apply_entries(&mut self, body: &[u8]) -> Result<Vec<u8>> {
        let Some(c) = self.cluster.as_ref() else {
            return Err(Error::new(Status::InvalidArgument, "APPLY is accepted only by a store served in cluster mode"));
        };
        let shards = c.shards() as usize;
        let entries = decode_apply(body)?;
        for (s, seq, e) in entries {
            if s as usize >= shards {
                return Err(Error::new(Status::InvalidArgument, format!("shard {s} of {shards}")));
            }
            if seq <= self.applied[s as usize] {
                continue;
            }
            match self.do_write_at(e.op, e.body, e.created_ms, true) {
                Ok(_) => {}
                Err(err) if matches!(err.status, Status::Io | Status::Corrupt | Status::PermissionDenied) => return Err(err),
                Err(err) => {
                    eprintln!("kalos: shard {s} log entry {seq} ({}) not applied: {err}", crate::wire::op_name(e.op));
                }
            }
            self.applied[s as usize] = seq;
        }
        Ok(Vec::new())
    }

    /// Housekeeping: records the applied sequences in the data directory once the log commit
    /// that covers them is done.
    pub(super) fn checkpoint(&mut self) {
        if self.cluster.is_none() || self.applied == self.checkpointed {
            return;
        }
        if let Some(p) = self.persist.as_mut() {
            if p.commit().is_ok() {
                match p.write_checkpoint(&self.applied) {
                    Ok(()) => self.checkpointed = self.applied.clone(),
                    Err(e) => eprintln!("kalos: cluster checkpoint not written: {e}"),
                }
            }
        } else {
            self.checkpointed = self.applied.clone();
        }
    }

    /// Cluster mode at start: the applied sequences from the checkpoint, handed to the cluster
    /// layer.
    pub(super) fn attach_cluster(&mut self) -> Result<()> {
        let Some(c) = self.cluster.clone() else { return Ok(()) };
        let mut applied = match self.persist.as_ref() {
            Some(p) => p.read_checkpoint()?,
            None => Vec::new(),
        };
        applied.resize(c.shards() as usize, 0);
        self.applied = applied.clone();
        self.checkpointed = applied.clone();
        c.attach(applied);
        Ok(())
    }
}
