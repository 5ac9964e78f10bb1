//! The cluster's messages (docs/CLUSTER.md): the recall's cluster section, the log entry that a
//! shard's stream carries, the APPLY request through which a replica applies log entries, the
//! sequence token of an acknowledged write and the lag trailer of a stale-read reply.
//!
//! - Recall cluster section (after the filter, when [`FLAG_CLUSTER`] is set): wait_ms u32,
//!   opts u32 ([`CLUSTER_ALLOW_STALE`]), n u32, `min_seqs u64[n]` (index = shard; 0 = no wait).
//! - Log entry (one stream message): magic "KLG1", created_ms u64, op u32, the write's request
//!   body (as UPSERT, DELETE, DELETE_NS, DELETE_WHERE or CLEAR carry it after their op code).
//! - APPLY request body: n u32, then per entry shard u32, seq u64, len u32 and a log entry.
//!   Response: empty. Accepted only from the server's own process.
//! - Write token (appended to a write's response in cluster mode): magic "KSEQ", n u32, then
//!   (shard u32, seq u64) per shard the write went to.
//! - Lag trailer (appended to a recall's response when it opted in to stale reads): magic
//!   "KLAG", lag_entries u64, lag_ms u64.

use super::codec::{Reader, Writer};
use crate::error::{Error, Result, Status};

/// RECALL flag: answer from this host's table only (the cluster layer's own requests).
pub const FLAG_LOCAL: u32 = 4;
/// RECALL flag: a cluster section follows the filter.
pub const FLAG_CLUSTER: u32 = 8;
/// Cluster section option: a replica that may be stale may answer; the reply carries a lag
/// trailer.
pub const CLUSTER_ALLOW_STALE: u32 = 1;
/// The largest shard count.
pub const MAX_SHARDS: usize = 4096;

const LOG_MAGIC: &[u8; 4] = b"KLG1";
const TOKEN_MAGIC: &[u8; 4] = b"KSEQ";
const LAG_MAGIC: &[u8; 4] = b"KLAG";
/// Bytes of the lag trailer.
pub const LAG_BYTES: usize = 20;

/// What a recall asks of the cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterRecall {
    /// How long the recall may wait for a replica to apply `min_seqs` (ms).
    pub wait_ms: u32,
    pub allow_stale: bool,
    /// Per shard, the log sequence the replica must have applied first (0 = none).
    pub min_seqs: Vec<u64>,
}

impl ClusterRecall {
    pub fn encode(&self, w: &mut Writer) {
        w.u32(self.wait_ms).u32(if self.allow_stale { CLUSTER_ALLOW_STALE } else { 0 }).u32(self.min_seqs.len() as u32);
        w.u64s(&self.min_seqs);
    }
    pub fn decode(r: &mut Reader<'_>) -> Result<ClusterRecall> {
        let wait_ms = r.u32("cluster wait")?;
        let opts = r.u32("cluster options")?;
        if opts & !CLUSTER_ALLOW_STALE != 0 {
            return Err(Error::new(Status::InvalidArgument, format!("unknown cluster options {opts:#x}")));
        }
        let n = r.u32("shard count")? as usize;
        if n > MAX_SHARDS {
            return Err(Error::new(Status::InvalidArgument, format!("{n} sequence entries; at most {MAX_SHARDS}")));
        }
        Ok(ClusterRecall { wait_ms, allow_stale: opts & CLUSTER_ALLOW_STALE != 0, min_seqs: r.u64s(n, "min seqs")? })
    }
    /// The sequence shard `s` must have applied (0 = none).
    pub fn min_seq(&self, s: u32) -> u64 {
        self.min_seqs.get(s as usize).copied().unwrap_or(0)
    }
}

/// One log entry: a client write stamped with its creation time.
#[derive(Debug, Clone, PartialEq)]
pub struct LogEntry<'a> {
    pub created_ms: u64,
    pub op: u32,
    pub body: &'a [u8],
}

impl<'a> LogEntry<'a> {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16 + self.body.len());
        b.extend_from_slice(LOG_MAGIC);
        b.extend_from_slice(&self.created_ms.to_le_bytes());
        b.extend_from_slice(&self.op.to_le_bytes());
        b.extend_from_slice(self.body);
        b
    }
    pub fn decode(b: &'a [u8]) -> Result<LogEntry<'a>> {
        let mut r = Reader::new(b);
        if r.take(4, "log magic")? != LOG_MAGIC {
            return Err(Error::new(Status::Corrupt, "a cluster log entry without its magic"));
        }
        let created_ms = r.u64("created")?;
        let op = r.u32("op")?;
        Ok(LogEntry { created_ms, op, body: r.rest() })
    }
}

/// Appends an APPLY request of `(shard, seq, log entry)` items.
pub fn apply(w: &mut Writer, entries: &[(u32, u64, &[u8])]) {
    w.u32(super::request::OP_APPLY).u32(entries.len() as u32);
    for (s, q, e) in entries {
        w.u32(*s).u64(*q).u32(e.len() as u32).bytes(e);
    }
}

/// Bytes one entry takes in an APPLY request.
pub const fn apply_entry_bytes(entry: usize) -> usize {
    16 + entry
}

/// Reads an APPLY body.
pub fn decode_apply(body: &[u8]) -> Result<Vec<(u32, u64, LogEntry<'_>)>> {
    let mut r = Reader::new(body);
    let n = r.u32("entry count")? as usize;
    let mut out = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let s = r.u32("shard")?;
        let q = r.u64("seq")?;
        let len = r.u32("entry length")? as usize;
        out.push((s, q, LogEntry::decode(r.take(len, "entry")?)?));
    }
    if r.remaining() != 0 {
        return Err(Error::new(Status::InvalidArgument, "apply request carries trailing bytes"));
    }
    Ok(out)
}

/// Appends a write token to a response body.
pub fn append_token(body: &mut Vec<u8>, seqs: &[(u32, u64)]) {
    body.extend_from_slice(TOKEN_MAGIC);
    body.extend_from_slice(&(seqs.len() as u32).to_le_bytes());
    for (s, q) in seqs {
        body.extend_from_slice(&s.to_le_bytes());
        body.extend_from_slice(&q.to_le_bytes());
    }
}

/// The write token after the first `at` bytes of a write response, if there is one.
pub fn read_token(resp: &[u8], at: usize) -> Result<Option<Vec<(u32, u64)>>> {
    let Some(rest) = resp.get(at..).filter(|r| !r.is_empty()) else { return Ok(None) };
    let mut r = Reader::new(rest);
    if r.take(4, "token magic")? != TOKEN_MAGIC {
        return Err(Error::new(Status::Internal, "a write response with unknown trailing bytes"));
    }
    let n = r.u32("token length")? as usize;
    if n > MAX_SHARDS || r.remaining() != 12 * n {
        return Err(Error::new(Status::Internal, "a malformed write token"));
    }
    Ok(Some((0..n).map(|_| (r.u32("shard").unwrap(), r.u64("seq").unwrap())).collect()))
}

/// Appends the lag trailer.
pub fn append_lag(body: &mut Vec<u8>, entries: u64, ms: u64) {
    body.extend_from_slice(LAG_MAGIC);
    body.extend_from_slice(&entries.to_le_bytes());
    body.extend_from_slice(&ms.to_le_bytes());
}

/// A replica's lag: (log entries pending, ms since it lost NATS).
pub type LagPair = (u64, u64);

/// Splits the reply of a recall of `nq` queries (with payloads or not) that opted in to stale
/// reads into its recall body and the lag (entries, ms): a cluster's reply carries the lag
/// trailer after the body, a single host's reply is the body alone (lag `None`). The body's
/// length is found from its own counts, so the trailer is never guessed from its bytes.
pub fn split_lag(resp: &[u8], nq: usize, payloads: bool) -> Result<(&[u8], Option<LagPair>)> {
    let bad = || Error::new(Status::Internal, "a malformed recall reply");
    let mut r = Reader::new(resp);
    let total: usize = (0..nq).map(|_| r.u32("count").map(|c| c as usize)).sum::<Result<usize>>()?;
    let mut len = super::response::recall_body_len(nq, total);
    if payloads {
        let lens = resp.get(len..len + 4 * total).ok_or_else(bad)?;
        let bytes: usize = lens
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .filter(|&l| l != super::NONE_U32)
            .map(|l| l as usize)
            .sum();
        len += 4 * total + bytes;
    }
    match resp.len().checked_sub(len) {
        Some(0) => Ok((resp, None)),
        Some(LAG_BYTES) if &resp[len..len + 4] == LAG_MAGIC => {
            let t = &resp[len + 4..];
            Ok((&resp[..len], Some((u64::from_le_bytes(t[..8].try_into().unwrap()), u64::from_le_bytes(t[8..].try_into().unwrap())))))
        }
        _ => Err(bad()),
    }
}

/// The shard of namespace `ns` among `shards`: a fixed 64-bit mix of the namespace (the
/// finaliser of SplitMix64), reduced modulo the shard count. Part of the cluster's format: every
/// host must place a namespace in the same shard.
pub fn shard_of(ns: u64, shards: u32) -> u32 {
    let mut z = ns.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % shards.max(1) as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let c = ClusterRecall { wait_ms: 7, allow_stale: true, min_seqs: vec![0, 5, 9] };
        let mut w = Writer::new();
        c.encode(&mut w);
        assert_eq!(ClusterRecall::decode(&mut Reader::new(&w.buf)).unwrap(), c);
        let e = LogEntry { created_ms: 3, op: 2, body: b"abc" }.encode();
        let mut w = Writer::new();
        apply(&mut w, &[(1, 10, &e), (2, 11, &e)]);
        let got = decode_apply(&w.buf[4..]).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[1].0, got[1].1, got[1].2.body), (2, 11, &b"abc"[..]));
        let mut b = 5u64.to_le_bytes().to_vec();
        append_token(&mut b, &[(3, 4)]);
        assert_eq!(read_token(&b, 8).unwrap(), Some(vec![(3, 4)]));
        assert_eq!(read_token(&b[..8], 8).unwrap(), None);
        // A recall body of one query and one hit, with and without the trailer.
        let mut body = 1u32.to_le_bytes().to_vec();
        body.extend_from_slice(&9u64.to_le_bytes());
        body.extend_from_slice(&0.5f32.to_le_bytes());
        assert_eq!(split_lag(&body, 1, false).unwrap(), (&body[..], None));
        let mut b = body.clone();
        append_lag(&mut b, 6, 7);
        assert_eq!(split_lag(&b, 1, false).unwrap(), (&body[..], Some((6, 7))));
        assert!(split_lag(&b[..b.len() - 1], 1, false).is_err());
        let spread: std::collections::HashSet<u32> = (0..64).map(|ns| shard_of(ns, 3)).collect();
        assert_eq!(spread.len(), 3);
    }
}
