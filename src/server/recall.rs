//! Recalls: every recall of a batch is parsed and checked, the recalls that share a filter and a
//! recency weighting are grouped into one engine call (with the group's largest k), and each
//! request's hits are written as its response: straight into its slot when it carries no
//! payloads, else encoded with the payloads and copied there on publish.

use std::borrow::Cow;
use std::collections::HashMap;

use super::publish::{too_large, Reply};
use super::serve::Pending;
use super::Server;
use crate::engine::EngineKind;
use crate::error::{Error, Result, Status};
use crate::types::{check_finite, normalize_queries, now_unix_ms, Filter, Hit, Metric, Recency};
use crate::wire::request::{recall_queries, vector_bytes, RecallHead, OP_BYTES};
use crate::wire::response::{encode_recall_payloads, write_recall_body};
use crate::wire::{DirectOut, SearchRequest, SlotQueries};
use crate::wire::{Reader, FLAG_PAYLOADS, OP_RECALL};

/// One request's place in its group.
struct RecallJob {
    idx: usize, // index into batch
    k: usize,
    nq: usize,
    flags: u32,
    q_off: usize, // offset (in queries) into the group's query buffer
}

/// A checked recall: its header fields, filter and recency, and its queries (in the private
/// copy, or left in the client's slot).
struct Parsed<'a> {
    k: usize,
    nq: usize,
    flags: u32,
    filter: Filter,
    recency: Option<Recency>,
    queries: Cow<'a, [f32]>,
    slot: Option<SlotQueries>,
}

/// Hits the server keeps allocated between batches for result vectors (16 bytes each).
const RETAIN_HITS: usize = 1 << 16;

impl Server {
    /// Reads and checks one recall request.
    fn parse_recall<'a>(&self, p: &'a Pending) -> Result<Parsed<'a>> {
        let mut r = Reader::new(p.body());
        let RecallHead { k, nq, flags, namespaces, recency_weight: w, half_life_ms: hl, filter: expr, .. } = RecallHead::decode(&mut r)?;
        // The answer must fit the slot it goes back through: refused before any work (nq * k
        // hits take 12 bytes each, plus 4 per query).
        let reply = nq.checked_mul(k).map(|t| crate::wire::response::recall_body_len(nq, t));
        if reply.is_none_or(|b| b > self.seg.data_bytes()) {
            return Err(Error::new(
                Status::TooLarge,
                format!(
                    "a recall of {nq} queries with k = {k} needs {} reply; the store's slots hold {} bytes (split the batch, lower k, or open the store with larger slot_bytes)",
                    reply.map_or("an unrepresentably large".to_string(), |b| format!("{b}-byte")),
                    self.seg.data_bytes()
                ),
            ));
        }
        let mut filter = match &namespaces {
            None => Filter::all(),
            Some(ns) => Filter::new(ns)?,
        };
        if let Some(e) = &expr {
            // Decoded and checked here, on the server's private copy: a malformed expression is
            // this request's INVALID_ARGUMENT and never reaches the engine.
            filter = filter.with_expr(e)?;
        }
        let recency = if w == 0.0 {
            None
        } else {
            if !(w.is_finite() && w > 0.0 && w <= 1.0 && hl.is_finite() && hl > 0.0) {
                return Err(Error::new(Status::InvalidArgument, format!("recency weight {w} / half-life {hl} out of range")));
            }
            if self.metric == Metric::L2 {
                return Err(Error::new(Status::InvalidArgument, "recency weighting applies to ip and cosine stores, not l2"));
            }
            Some(Recency { weight: w, half_life_ms: hl })
        };
        let nvals = nq.checked_mul(self.dim).ok_or_else(|| Error::new(Status::InvalidArgument, "size overflow"))?;
        // Query bytes: the rest of the private copy, or of the slot for queries left there.
        let head = p.body().len() - r.remaining();
        let qbytes = p.slot_len.map_or(r.remaining(), |len| len - OP_BYTES - head);
        if qbytes != vector_bytes(nvals) {
            return Err(Error::new(
                Status::DimensionMismatch,
                format!("recall carries {qbytes} query bytes; {nq} queries of dimension {} need {}", self.dim, vector_bytes(nvals)),
            ));
        }
        if p.slot_len.is_some() {
            // SAFETY: OP_BYTES + head + qbytes == slot_len <= the slot's data size (collect
            // clamps it), so the range lies in slot p.slot's data area; only its address is taken
            // here (SlotQueries reads it by DMA or by a private copy). The data area is 8-byte
            // aligned and the query values start at a multiple of 4 (checked by vector_bytes).
            let ptr = unsafe { self.seg.slot_data(p.slot).add(OP_BYTES + head) } as *const u8;
            let cosine_dim = if self.metric == Metric::Cosine { self.dim } else { 0 };
            // SAFETY: as above: nvals values at ptr lie in the slot's data area, mapped for the
            // life of the request.
            let slot = Some(unsafe { SlotQueries::new(ptr, nvals, cosine_dim) });
            return Ok(Parsed { k, nq, flags, filter, recency, queries: Cow::Borrowed(&[][..]), slot });
        }
        let mut q = recall_queries(&mut r, nvals)?;
        check_finite(&q, "query")?;
        if self.metric == Metric::Cosine {
            normalize_queries(q.to_mut(), self.dim)?;
        }
        Ok(Parsed { k, nq, flags, filter, recency, queries: q, slot: None })
    }

    /// Parses every recall in the batch, groups them by (filter, recency) and runs each group as
    /// one engine call with the group's largest k.
    pub(super) fn do_recalls(&mut self, batch: &[Pending], results: &mut [Option<Reply>]) {
        struct Group<'a> {
            filter: Filter,
            recency: Option<Recency>,
            // A lone request's queries are read in place from its (private) request copy.
            queries: Cow<'a, [f32]>,
            /// Or, for a large ip/l2 batch, left in the client's slot (`queries` is then empty).
            slot: Option<SlotQueries>,
            jobs: Vec<RecallJob>,
            k: usize,
        }
        type Key = (Option<Vec<u64>>, Option<Vec<u8>>, u32, u64);
        let mut groups: Vec<Group<'_>> = Vec::new();
        // The first group's key is kept aside: a lone recall (the latency path) never hashes.
        let mut first_key: Option<Key> = None;
        let mut keymap: HashMap<Key, usize> = HashMap::new();
        for (i, p) in batch.iter().enumerate() {
            if p.op() != OP_RECALL || results[i].is_some() {
                continue;
            }
            match self.parse_recall(p) {
                Err(e) => results[i] = Some(Reply::error(e.status, e.message)),
                Ok(Parsed { k, nq, flags, filter, recency, slot: Some(sq), .. }) => {
                    // Queries left in the slot: a group of their own (nothing can be appended).
                    groups.push(Group { filter, recency, queries: Cow::Borrowed(&[]), slot: Some(sq), jobs: Vec::new(), k });
                    groups.last_mut().unwrap().jobs.push(RecallJob { idx: i, k, nq, flags, q_off: 0 });
                }
                Ok(Parsed { k, nq, flags, filter, recency, queries: q, slot: None }) => {
                    let key = (
                        filter.namespaces.clone(),
                        filter.expr.as_ref().map(|e| e.bytes.clone()),
                        recency.map_or(0, |r| r.weight.to_bits()),
                        recency.map_or(0, |r| r.half_life_ms.to_bits()),
                    );
                    let gi = if groups.is_empty() {
                        first_key = Some(key);
                        groups.push(Group { filter, recency, queries: Cow::Borrowed(&[]), slot: None, jobs: Vec::new(), k: 0 });
                        0
                    } else {
                        if let Some(fk) = first_key.take() {
                            keymap.insert(fk, 0);
                        }
                        *keymap.entry(key).or_insert_with(|| {
                            groups.push(Group { filter, recency, queries: Cow::Borrowed(&[]), slot: None, jobs: Vec::new(), k: 0 });
                            groups.len() - 1
                        })
                    };
                    let g = &mut groups[gi];
                    let q_off = g.queries.len() / self.dim;
                    if g.queries.is_empty() {
                        g.queries = q; // a lone (or first) request's queries: no copy
                    } else {
                        g.queries.to_mut().extend_from_slice(&q);
                    }
                    g.k = g.k.max(k);
                    g.jobs.push(RecallJob { idx: i, k, nq, flags, q_off });
                }
            }
        }
        let now = now_unix_ms();
        // Result vectors are kept in the server between batches so the engine reuses them.
        let mut out: Vec<Vec<Hit>> = std::mem::take(&mut self.search_out);
        for g in groups {
            let nq = g.slot.map_or(g.queries.len(), |sq| sq.len()) / self.dim;
            // A lone single query without payloads: the engine may write the response body into
            // the client's slot itself (the slot stays this request's until it is published or,
            // if abandoned, released by this thread).
            let dout = match g.jobs.as_slice() {
                [j] if j.nq == 1 && j.flags & FLAG_PAYLOADS == 0 => {
                    // SAFETY: the request's own slot data area, data_bytes() long; this thread
                    // owns the slot until it publishes or releases it.
                    Some(unsafe { DirectOut::new(self.seg.slot_data(batch[j.idx].slot), self.seg.data_bytes()) })
                }
                _ => None,
            };
            let req = SearchRequest {
                queries: &g.queries,
                nq,
                k: g.k,
                filter: &g.filter,
                recency: g.recency,
                now_ms: now,
                direct: dout.as_ref(),
                slot: g.slot,
            };
            let mut r = self.engine.search(&self.store, &req, &mut out);
            if let Err(e) = &r {
                // A request error (slot queries the engine found bad on the device: NaN, an
                // all-zero cosine query) is the request's; the engine is fine.
                if self.engine.kind() != EngineKind::Cpu && !e.status.is_request_error() {
                    self.engine_failed(e.clone());
                    r = self.engine.search(&self.store, &req, &mut out);
                }
            }
            if let Ok(()) = &r {
                // A query and a row whose product passes the f32 range score infinity (or NaN):
                // the request's error, never a non-finite score.
                if out[..nq.min(out.len())].iter().flatten().any(|h| !h.score.is_finite()) {
                    r = Err(Error::new(
                        Status::InvalidArgument,
                        "a score exceeds the f32 range: the query's magnitude times a stored vector's passes f32; scale the query down",
                    ));
                }
            }
            self.metrics.queries += nq as u64;
            if let (Ok(()), Some(d), [j]) = (&r, &dout, g.jobs.as_slice()) {
                if d.written() > 0 {
                    results[j.idx] = Some(Reply::InSlot(d.written()));
                    continue;
                }
            }
            for job in g.jobs {
                // Each query's first k hits (the group ran with its largest k), in order.
                let lists = || out[job.q_off..job.q_off + job.nq].iter().map(|h| &h[..h.len().min(job.k)]);
                results[job.idx] = Some(match &r {
                    Err(e) => Reply::error(e.status, e.message.clone()),
                    // Without payloads the body goes straight into the request's slot (the
                    // server thread owns it until it publishes or releases it, as for
                    // `DirectOut`): no encoding buffer, no copy of it into the slot.
                    Ok(()) if job.flags & FLAG_PAYLOADS == 0 => {
                        // SAFETY: the data area of the request's own slot, data_bytes long, which
                        // the server thread owns until it publishes or releases it (a client that
                        // gave up only marks it abandoned).
                        match unsafe { write_recall_body(self.seg.slot_data(batch[job.idx].slot), self.seg.data_bytes(), lists()) } {
                            Ok(len) => Reply::InSlot(len),
                            Err(len) => Reply::Body(Status::TooLarge, too_large(len, self.seg.data_bytes())),
                        }
                    }
                    Ok(()) => {
                        let w = &mut self.resp;
                        w.clear();
                        let store = &self.store;
                        encode_recall_payloads(w, lists(), |x| store.row_of(x.id).and_then(|row| store.payload_at(row)));
                        Reply::Body(Status::Ok, w.buf.clone())
                    }
                });
            }
        }
        // Result vectors are kept for the next batch, unless a large batch grew them past
        // RETAIN_HITS: work memory returns to its baseline after a large request.
        if out.iter().map(|v| v.capacity()).sum::<usize>() <= RETAIN_HITS {
            self.search_out = out;
        }
    }
}
