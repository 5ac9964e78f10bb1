//! Responses: the server's encoders (the recall body also straight into a slot's data area,
//! without a buffer) and the client's parsers.
//!
//! The recall body without payloads, for `nq` queries and `total` hits in all, little-endian:
//!
//! | offset                                   | field                          |
//! |------------------------------------------|--------------------------------|
//! | 0                                        | `counts u32[nq]`               |
//! | [`recall_ids_at`]`(nq)`                  | `ids u64[total]`, query order  |
//! | [`recall_scores_at`]`(nq, total)`        | `scores f32[total]`, same order|
//!
//! `kernels/common.cuh` (`body_hit`, and the count its callers write at offset 0) writes this
//! body for one query from the GPU straight into the client's slot. It mirrors the constants
//! below and must change with them.

use super::codec::{Reader, Writer, NONE_U32};
use super::request::vector_bytes;
use crate::error::{Error, Result, Status};
use crate::store::Record;
use crate::types::Hit;

/// Bytes of one query's hit count in a recall body.
pub const RECALL_COUNT_BYTES: usize = 4;
/// Bytes of one hit's id.
pub const RECALL_ID_BYTES: usize = 8;
/// Bytes of one hit's score.
pub const RECALL_SCORE_BYTES: usize = 4;

/// Offset of the first id in a recall body of `nq` queries.
pub const fn recall_ids_at(nq: usize) -> usize {
    RECALL_COUNT_BYTES * nq
}

/// Offset of the first score in a recall body of `nq` queries and `total` hits.
pub const fn recall_scores_at(nq: usize, total: usize) -> usize {
    recall_ids_at(nq) + RECALL_ID_BYTES * total
}

/// Length of a recall body (without payloads) of `nq` queries and `total` hits.
pub const fn recall_body_len(nq: usize, total: usize) -> usize {
    recall_scores_at(nq, total) + RECALL_SCORE_BYTES * total
}

/// Bytes of one GET record with a vector of dimension `dim`, `payload` payload bytes and no
/// fields (fields add their encoded size, at most `meta::MAX_ITEM_FIELD_BYTES`).
pub const fn record_bytes(dim: usize, payload: usize) -> usize {
    8 * 3 + vector_bytes(dim) + 4 + payload + 2
}

/// Writes a recall response body for `lists` (one hit list per query) at `host`. Returns its
/// length; Err(length) when that exceeds `cap` (nothing written).
///
/// # Safety
/// `host` must be valid for writes of `cap` bytes that no other thread writes meanwhile (the
/// data area of a slot the server thread owns until it publishes or releases it).
pub unsafe fn write_recall_body<'a, I>(host: *mut u8, cap: usize, lists: I) -> std::result::Result<usize, usize>
where
    I: Iterator<Item = &'a [Hit]> + Clone,
{
    let (nq, total) = lists.clone().fold((0, 0), |(q, t), h| (q + 1, t + h.len()));
    let len = recall_body_len(nq, total);
    if len > cap {
        return Err(len);
    }
    // SAFETY: every write lands in [host, host + len), len <= cap (the caller's contract): the
    // counts in [0, ids_at), the ids in [ids_at, scores_at), the scores in [scores_at, len),
    // `total` each. Unaligned stores of plain integers through raw pointers (the bytes are shared
    // memory, so no reference to them is formed; the offsets are only 4-byte aligned).
    unsafe {
        let (mut c, mut i, mut s) = (host, host.add(recall_ids_at(nq)), host.add(recall_scores_at(nq, total)));
        for h in lists {
            c.cast::<[u8; RECALL_COUNT_BYTES]>().write_unaligned((h.len() as u32).to_le_bytes());
            c = c.add(RECALL_COUNT_BYTES);
            for x in h {
                i.cast::<[u8; RECALL_ID_BYTES]>().write_unaligned(x.id.to_le_bytes());
                s.cast::<[u8; RECALL_SCORE_BYTES]>().write_unaligned(x.score.to_le_bytes());
                i = i.add(RECALL_ID_BYTES);
                s = s.add(RECALL_SCORE_BYTES);
            }
        }
    }
    Ok(len)
}

/// Where an engine may write a single query's recall response body itself
/// ([`write_recall_body`]): the data area of the client's slot. The server publishes it without
/// copying when `written` is non-zero afterwards.
#[derive(Debug)]
pub struct DirectOut {
    host: *mut u8,
    cap: usize,
    written: std::cell::Cell<usize>,
}

impl DirectOut {
    /// A writer for `cap` bytes at `host`.
    ///
    /// # Safety
    /// `host..host + cap` is the data area of the request's own slot, mapped and written by no
    /// other thread until the server publishes the response.
    pub unsafe fn new(host: *mut u8, cap: usize) -> Self {
        DirectOut { host, cap, written: std::cell::Cell::new(0) }
    }

    /// Host address and size of the area, for an engine that maps the slots into device memory
    /// and lets a kernel write the body; it then calls [`DirectOut::mark_written`].
    pub fn dma_target(&self) -> (usize, usize) {
        (self.host as usize, self.cap)
    }

    /// Records that a body of `len` bytes (at most `cap`) is in place.
    pub fn mark_written(&self, len: usize) {
        debug_assert!(len <= self.cap);
        self.written.set(len.min(self.cap));
    }

    /// Length of the body in place; 0 = not written.
    pub fn written(&self) -> usize {
        self.written.get()
    }

    /// Length of a single query's response body with `n` hits (count, ids, scores).
    pub const fn body_len(n: usize) -> usize {
        recall_body_len(1, n)
    }

    /// Writes one query's recall response body ([`write_recall_body`]) at `host` and records its
    /// length. Returns false, writing nothing, when it does not fit in `cap` bytes (the server
    /// then answers the request itself).
    pub fn write_hits(&self, hits: &[Hit]) -> bool {
        if self.host.is_null() {
            return false;
        }
        // SAFETY: the server hands out a DirectOut only for the data area of the request's own
        // slot, `cap` bytes at `host`, which no other thread writes until the server publishes
        // the response.
        match unsafe { write_recall_body(self.host, self.cap, std::iter::once(hits)) } {
            Ok(len) => {
                self.written.set(len);
                true
            }
            Err(_) => false,
        }
    }
}

/// Appends a recall response body with payloads to `w`: the hit lists laid out as
/// [`write_recall_body`] lays them out, then a u32 payload length per hit (NONE_U32 = none) and
/// the payload bytes back to back. `payload` gives a hit's payload.
pub fn encode_recall_payloads<'a, 'p, I>(w: &mut Writer, lists: I, payload: impl Fn(&Hit) -> Option<&'p [u8]>)
where
    I: Iterator<Item = &'a [Hit]> + Clone,
{
    for h in lists.clone() {
        w.u32(h.len() as u32);
    }
    for x in lists.clone().flatten() {
        w.u64(x.id);
    }
    for x in lists.clone().flatten() {
        w.f32(x.score);
    }
    let payloads: Vec<Option<&[u8]>> = lists.flatten().map(payload).collect();
    for p in &payloads {
        w.u32(p.map_or(NONE_U32, |b| b.len() as u32));
    }
    for b in payloads.iter().flatten() {
        w.bytes(b);
    }
}

/// Reads a one-query recall body into `ids`/`scores`; returns the hit count. BUFFER_TOO_SMALL
/// when the count exceeds `k` or either buffer (checked before the hits are read).
pub fn read_recall_one(resp: &[u8], k: usize, ids: &mut [u64], scores: &mut [f32]) -> Result<usize> {
    let mut r = Reader::new(resp);
    let c = r.u32("count")? as usize;
    if c > k || c > ids.len() || c > scores.len() {
        return Err(Error::new(
            Status::BufferTooSmall,
            format!("{c} results do not fit in output buffers of {} ids / {} scores", ids.len(), scores.len()),
        ));
    }
    let b = r.take(c * RECALL_ID_BYTES, "ids")?;
    for (o, ch) in ids.iter_mut().zip(b.chunks_exact(RECALL_ID_BYTES)) {
        *o = u64::from_le_bytes(ch.try_into().unwrap());
    }
    let b = r.take(c * RECALL_SCORE_BYTES, "scores")?;
    for (o, ch) in scores.iter_mut().zip(b.chunks_exact(RECALL_SCORE_BYTES)) {
        *o = f32::from_le_bytes(ch.try_into().unwrap());
    }
    Ok(c)
}

/// Reads a recall body of `nq` queries: query i's hits go to `ids`/`scores` from `i * k` on and
/// its hit count to `counts[i]`. INTERNAL when a query has more than `k` hits (checked before the
/// hits are read). The buffers hold at least `nq * k` (`counts`: `nq`) entries.
pub fn read_recall_batch(resp: &[u8], nq: usize, k: usize, ids: &mut [u64], scores: &mut [f32], counts: &mut [usize]) -> Result<()> {
    let mut r = Reader::new(resp);
    let cs = r.u32s(nq, "counts")?;
    let total: usize = cs.iter().map(|&c| c as usize).sum();
    if cs.iter().any(|&c| c as usize > k) {
        return Err(Error::new(Status::Internal, "server returned more than k hits"));
    }
    let idb = r.take(total * RECALL_ID_BYTES, "ids")?;
    let scb = r.take(total * RECALL_SCORE_BYTES, "scores")?;
    // Each query's hits, in order (the counts were checked <= k above).
    let (mut idc, mut scc) = (idb.chunks_exact(RECALL_ID_BYTES), scb.chunks_exact(RECALL_SCORE_BYTES));
    for (i, &c) in cs.iter().enumerate() {
        let c = c as usize;
        let base = i * k;
        for (d, b) in ids[base..base + c].iter_mut().zip(idc.by_ref().take(c)) {
            *d = u64::from_le_bytes(b.try_into().unwrap());
        }
        for (d, b) in scores[base..base + c].iter_mut().zip(scc.by_ref().take(c)) {
            *d = f32::from_le_bytes(b.try_into().unwrap());
        }
        counts[i] = c;
    }
    Ok(())
}

/// A hit and its payload (None when the memory has none), borrowed from a reply.
pub type HitPayload<'a> = (Hit, Option<&'a [u8]>);

/// Reads a one-query recall body with payloads ([`encode_recall_payloads`]): each hit and its
/// payload, borrowed from `resp`.
pub fn read_recall_payloads(resp: &[u8]) -> Result<Vec<HitPayload<'_>>> {
    let mut r = Reader::new(resp);
    let c = r.u32("count")? as usize;
    let ids = r.u64s(c, "ids")?;
    let scores = r.f32s(c, "scores")?;
    let lens = r.u32s(c, "payload lengths")?;
    let mut out = Vec::with_capacity(c);
    for i in 0..c {
        let payload = if lens[i] == NONE_U32 { None } else { Some(r.take(lens[i] as usize, "payload")?) };
        out.push((Hit { id: ids[i], score: scores[i] }, payload));
    }
    Ok(out)
}

/// Appends one record of a GET response.
pub fn write_record(w: &mut Writer, rec: &Record) {
    w.u64(rec.namespace).u64(rec.created_ms).u64(rec.expires_ms).f32s(&rec.vector);
    match &rec.payload {
        Some(p) => w.u32(p.len() as u32).bytes(p),
        None => w.u32(NONE_U32),
    };
    let mut f = Vec::new();
    crate::meta::encode_item(&mut f, &rec.fields);
    w.bytes(&f);
}

/// Reads the next record of a GET response: memory `id`, a vector of dimension `dim`.
pub fn read_record(r: &mut Reader<'_>, id: u64, dim: usize) -> Result<Record> {
    let namespace = r.u64("namespace")?;
    let created_ms = r.u64("created")?;
    let expires_ms = r.u64("expires")?;
    let vector = r.f32s(dim, "vector")?;
    let l = r.u32("payload length")?;
    let payload = if l == NONE_U32 { None } else { Some(r.take(l as usize, "payload")?.to_vec()) };
    // The record's fields (`count u16 | (name, value)*`), decoded from the rest of the response.
    let mut c = crate::meta::Cursor::new(r.rest(), "get fields");
    let fields = crate::meta::decode_item(&mut c)?;
    r.take(c.o, "fields")?;
    Ok(Record { id, namespace, vector, payload, created_ms, expires_ms, fields })
}

/// The response of DELETE, DELETE_NS and CLEAR: the number of memories deleted.
pub fn deleted(n: u64) -> Vec<u8> {
    let mut w = Writer::new();
    w.u64(n);
    w.buf
}

/// Reads a DELETE, DELETE_NS or CLEAR response.
pub fn read_deleted(resp: &[u8]) -> Result<u64> {
    Reader::new(resp).u64("deleted")
}

/// Bytes of a LIST response before its ids: `remaining u64 | count u32`.
pub const LIST_HEAD_BYTES: usize = 12;

/// Most ids one LIST response carries in a slot data area of `data_bytes`.
pub const fn list_fit(data_bytes: usize) -> usize {
    data_bytes.saturating_sub(LIST_HEAD_BYTES) / 8
}

/// The response of LIST: the matching memories after the last id listed (`remaining`), then
/// the ids.
pub fn list_reply(ids: &[u64], remaining: u64) -> Vec<u8> {
    let mut w = Writer::new();
    w.u64(remaining).u32(ids.len() as u32).u64s(ids);
    w.buf
}

/// Reads a LIST response into `out`: (ids written, memories remaining after them). INTERNAL
/// when it carries more ids than `out` holds (checked before any is read).
pub fn read_list(resp: &[u8], out: &mut [u64]) -> Result<(usize, u64)> {
    let mut r = Reader::new(resp);
    let remaining = r.u64("remaining")?;
    let n = r.u32("count")? as usize;
    if n > out.len() {
        return Err(Error::new(Status::Internal, format!("server listed {n} ids; {} were asked for", out.len())));
    }
    let b = r.take(n * 8, "ids")?;
    for (o, c) in out.iter_mut().zip(b.chunks_exact(8)) {
        *o = u64::from_le_bytes(c.try_into().unwrap());
    }
    Ok((n, remaining))
}

/// The body of an error response: the message.
pub fn error_body(message: impl Into<String>) -> Vec<u8> {
    message.into().into_bytes()
}

/// The message of an error response.
pub fn error_message(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

/// Server statistics as carried by an OP_STATS response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub count: u64,
    pub capacity: u64,
    pub dim: u64,
    pub metric: u64,
    pub dtype: u64,
    /// 1 = cpu, 2 = cuda.
    pub engine: u64,
    pub requests: u64,
    pub queries: u64,
    pub batches: u64,
    pub errors: u64,
    /// Server-side service time percentiles of the last 4096 recall requests, in nanoseconds.
    pub p50_ns: u64,
    pub p99_ns: u64,
    /// Submitted requests waiting when the last batch was taken.
    pub queue_depth: u64,
    pub server_pid: u64,
    pub epoch: u64,
    pub payload_bytes: u64,
    pub uptime_ms: u64,
    /// Number of times the GPU engine failed and the server fell back to the CPU.
    pub engine_fallbacks: u64,
    pub engine_name: String,
    /// Why the CUDA engine is not serving: it could not start under backend auto, or it failed
    /// while serving. Empty when nothing fell back.
    pub fallback_reason: String,
    /// Write-ahead log bytes since the newest snapshot (what recovery would replay); 0 without
    /// a data directory.
    pub wal_bytes: u64,
    /// Unix time of the newest complete snapshot in ms; 0 when there is none.
    pub last_snapshot_unix_ms: u64,
    /// Requests answered, by op code (`OP_*`) and status, since the server started.
    pub requests_by: Vec<OpStatusCount>,
    /// Service time of the requests of each op code: bucket counts over [`LATENCY_BUCKETS_NS`].
    pub latency: Vec<OpLatency>,
    /// Queries answered by the int8 scan with exact re-ranking.
    pub rerank_queries: u64,
    /// Of those, queries whose k-th exact score fell inside the 8-bit error bound of the best
    /// row left out of the candidates (a true neighbour may have been missed).
    pub rerank_uncertain: u64,
}

/// The upper bounds (ns) of the service-time histogram buckets; a last bucket counts the rest.
pub const LATENCY_BUCKETS_NS: [u64; 14] = [
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    100_000_000,
    1_000_000_000,
];

/// One (op, status) request counter of [`Stats::requests_by`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpStatusCount {
    pub op: u32,
    pub status: u32,
    pub count: u64,
}

/// The service-time histogram of one op code: `buckets[i]` counts requests that took at most
/// `LATENCY_BUCKETS_NS[i]` (and more than the bound before); the last entry counts the rest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpLatency {
    pub op: u32,
    pub buckets: Vec<u64>,
    pub sum_ns: u64,
}

impl Stats {
    pub fn encode(&self, w: &mut Writer) {
        w.u64s(&[
            self.count,
            self.capacity,
            self.dim,
            self.metric,
            self.dtype,
            self.engine,
            self.requests,
            self.queries,
            self.batches,
            self.errors,
            self.p50_ns,
            self.p99_ns,
            self.queue_depth,
            self.server_pid,
            self.epoch,
            self.payload_bytes,
            self.uptime_ms,
            self.engine_fallbacks,
        ]);
        w.u32(self.engine_name.len() as u32).bytes(self.engine_name.as_bytes());
        w.u32(self.fallback_reason.len() as u32).bytes(self.fallback_reason.as_bytes());
        w.u64s(&[self.wal_bytes, self.last_snapshot_unix_ms]);
        w.u32(self.requests_by.len() as u32);
        for c in &self.requests_by {
            w.u32(c.op).u32(c.status).u64(c.count);
        }
        w.u32(self.latency.len() as u32);
        for l in &self.latency {
            w.u32(l.op).u32(l.buckets.len() as u32).u64s(&l.buckets).u64(l.sum_ns);
        }
        w.u64s(&[self.rerank_queries, self.rerank_uncertain]);
    }
    pub fn decode(r: &mut Reader<'_>) -> Result<Stats> {
        let v = r.u64s(18, "stats")?;
        let n = r.u32("engine name length")? as usize;
        let name = String::from_utf8_lossy(r.take(n, "engine name")?).into_owned();
        let n = r.u32("fallback reason length")? as usize;
        let fallback_reason = String::from_utf8_lossy(r.take(n, "fallback reason")?).into_owned();
        let more = r.u64s(2, "stats")?;
        let n = r.u32("request counters")? as usize;
        if n > r.remaining() / 16 {
            return Err(Error::new(Status::Corrupt, "stats: request counters past the end"));
        }
        let mut requests_by = Vec::with_capacity(n);
        for _ in 0..n {
            requests_by.push(OpStatusCount { op: r.u32("op")?, status: r.u32("status")?, count: r.u64("count")? });
        }
        let n = r.u32("latency histograms")? as usize;
        let mut latency = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let op = r.u32("op")?;
            let nb = r.u32("buckets")? as usize;
            if nb > r.remaining() / 8 {
                return Err(Error::new(Status::Corrupt, "stats: latency buckets past the end"));
            }
            latency.push(OpLatency { op, buckets: r.u64s(nb, "buckets")?, sum_ns: r.u64("latency sum")? });
        }
        // Absent from a server that predates the int8 scan.
        let rerank = if r.remaining() >= 16 { r.u64s(2, "stats")? } else { vec![0, 0] };
        Ok(Stats {
            rerank_queries: rerank[0],
            rerank_uncertain: rerank[1],
            wal_bytes: more[0],
            last_snapshot_unix_ms: more[1],
            requests_by,
            latency,
            count: v[0],
            capacity: v[1],
            dim: v[2],
            metric: v[3],
            dtype: v[4],
            engine: v[5],
            requests: v[6],
            queries: v[7],
            batches: v[8],
            errors: v[9],
            p50_ns: v[10],
            p99_ns: v[11],
            queue_depth: v[12],
            server_pid: v[13],
            epoch: v[14],
            payload_bytes: v[15],
            uptime_ms: v[16],
            engine_fallbacks: v[17],
            engine_name: name,
            fallback_reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recall_body_written_in_place_reads_back() {
        let lists: [&[Hit]; 3] = [&[Hit { id: 9, score: 0.5 }, Hit { id: u64::MAX, score: -1.0 }], &[], &[Hit { id: 3, score: 2.0 }]];
        let mut buf = vec![0u8; 64];
        // SAFETY: buf is 64 writable bytes that nothing else touches.
        let len = unsafe { write_recall_body(buf.as_mut_ptr(), buf.len(), lists.iter().copied()) }.unwrap();
        assert_eq!(len, recall_body_len(3, 3));
        assert_eq!(&buf[..4], &2u32.to_le_bytes());
        assert_eq!(&buf[recall_ids_at(3)..recall_ids_at(3) + 8], &9u64.to_le_bytes());
        assert_eq!(&buf[recall_scores_at(3, 3)..recall_scores_at(3, 3) + 4], &0.5f32.to_le_bytes());
        let (mut ids, mut scores, mut counts) = ([0u64; 6], [0f32; 6], [7usize; 3]);
        read_recall_batch(&buf[..len], 3, 2, &mut ids, &mut scores, &mut counts).unwrap();
        assert_eq!(counts, [2, 0, 1]);
        assert_eq!((ids[0], ids[1], ids[4]), (9, u64::MAX, 3));
        assert_eq!((scores[0], scores[1], scores[4]), (0.5, -1.0, 2.0));
        // SAFETY: as above.
        assert_eq!(unsafe { write_recall_body(buf.as_mut_ptr(), len - 1, lists.iter().copied()) }, Err(len));

        // SAFETY: buf is a live, exclusively borrowed buffer of buf.len() bytes.
        let one = unsafe { DirectOut::new(buf.as_mut_ptr(), buf.len()) };
        assert!(one.write_hits(lists[0]));
        assert_eq!(one.written(), DirectOut::body_len(2));
        let (mut ids, mut scores) = ([0u64; 2], [0f32; 2]);
        assert_eq!(read_recall_one(&buf[..one.written()], 2, &mut ids, &mut scores).unwrap(), 2);
        assert_eq!((ids, scores), ([9, u64::MAX], [0.5, -1.0]));
        let e = read_recall_one(&buf[..one.written()], 1, &mut ids, &mut scores).unwrap_err();
        assert_eq!(e.status, Status::BufferTooSmall);
    }

    #[test]
    fn payloads_records_and_stats_round_trip() {
        let hits = [Hit { id: 1, score: 1.0 }, Hit { id: 2, score: 0.5 }];
        let mut w = Writer::new();
        encode_recall_payloads(&mut w, std::iter::once(&hits[..]), |h| (h.id == 2).then_some(&b"two"[..]));
        assert_eq!(read_recall_payloads(&w.buf).unwrap(), vec![(hits[0], None), (hits[1], Some(&b"two"[..]))]);

        let rec = Record {
            id: 5,
            namespace: 6,
            vector: vec![1.0, 2.0],
            payload: Some(b"p".to_vec()),
            created_ms: 7,
            expires_ms: 8,
            fields: vec![],
        };
        let mut w = Writer::new();
        write_record(&mut w, &rec);
        assert_eq!(w.len(), record_bytes(2, 1));
        assert_eq!(read_record(&mut Reader::new(&w.buf), 5, 2).unwrap(), rec);
        assert_eq!(read_deleted(&deleted(42)).unwrap(), 42);

        let s = Stats {
            count: 3,
            engine_name: "cpu".into(),
            fallback_reason: "none here".into(),
            wal_bytes: 9,
            last_snapshot_unix_ms: 10,
            requests_by: vec![OpStatusCount { op: 1, status: 0, count: 5 }, OpStatusCount { op: 2, status: 7, count: 1 }],
            latency: vec![OpLatency { op: 1, buckets: vec![1, 2, 3], sum_ns: 77 }],
            ..Stats::default()
        };
        let mut w = Writer::new();
        s.encode(&mut w);
        assert_eq!(Stats::decode(&mut Reader::new(&w.buf)).unwrap(), s);
    }
}
