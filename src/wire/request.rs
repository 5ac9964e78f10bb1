//! Requests: op codes, the client's encoders (each appends one request to a [`Writer`]) and the
//! server's decoders (each reads a private copy of a request body, bounds-checked).

use std::borrow::Cow;

use super::codec::{Reader, Writer, NONE_U32};
use crate::error::{Error, Result, Status};
use crate::types::{check_k, Recency, MAX_FILTER_NAMESPACES};

pub const OP_RECALL: u32 = 1;
pub const OP_UPSERT: u32 = 2;
pub const OP_DELETE: u32 = 3;
pub const OP_DELETE_NS: u32 = 4;
pub const OP_GET: u32 = 5;
pub const OP_STATS: u32 = 6;
pub const OP_CLEAR: u32 = 7;

/// RECALL flag: the response carries each hit's payload.
pub const FLAG_PAYLOADS: u32 = 1;

/// Bytes of the op code that starts every request.
pub const OP_BYTES: usize = 4;
/// Bytes of a RECALL header before its namespaces: op, k, nq, flags, namespace count, recency
/// weight and half-life.
pub const RECALL_HEAD_BYTES: usize = 32;
/// The longest RECALL header: [`RECALL_HEAD_BYTES`] and at most MAX_FILTER_NAMESPACES namespaces.
pub const RECALL_HEAD_MAX: usize = RECALL_HEAD_BYTES + 8 * MAX_FILTER_NAMESPACES;
/// Bytes set aside for a request's fixed fields when a call is sized to fit a slot: more than
/// any request takes before its arrays (a RECALL 32, an UPSERT 40).
pub const HEAD_RESERVE: usize = 64;

/// Bytes of `dim` query or vector values.
pub const fn vector_bytes(dim: usize) -> usize {
    4 * dim
}

/// Bytes one UPSERT item takes besides its payload: namespace, id, vector and payload length.
pub const fn upsert_item_bytes(dim: usize) -> usize {
    8 + 8 + vector_bytes(dim) + 4
}

/// The op code of a request (0, an unknown op, when the request is shorter than one).
pub fn op_of(req: &[u8]) -> u32 {
    req.get(..OP_BYTES).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()))
}

/// The request body after its op code.
pub fn body_of(req: &[u8]) -> &[u8] {
    req.get(OP_BYTES..).unwrap_or(&[])
}

/// Namespaces of an upsert.
#[derive(Debug, Clone)]
pub enum Namespaces<'a> {
    One(u64),
    PerItem(&'a [u64]),
}

/// Appends a RECALL request up to its queries (`nq` × dim f32 values, which follow it in the
/// slot: [`super::f32_bytes`]).
pub fn recall_head(w: &mut Writer, k: usize, nq: usize, flags: u32, namespaces: Option<&[u64]>, recency: Option<Recency>) {
    w.u32(OP_RECALL).u32(k as u32).u32(nq as u32).u32(flags);
    match namespaces {
        None => w.u32(NONE_U32),
        Some(ns) => w.u32(ns.len() as u32),
    };
    match recency {
        Some(r) => w.f32(r.weight).f64(r.half_life_ms),
        None => w.f32(0.0).f64(1.0),
    };
    if let Some(ns) = namespaces {
        w.u64s(ns);
    }
}

/// Appends an UPSERT request of `ids.len()` items: `vectors` holds their values back to back,
/// `payloads` (when given) one entry per item.
pub fn upsert(
    w: &mut Writer,
    namespaces: Namespaces<'_>,
    ttl_ms: u64,
    expires_ms: u64,
    ids: &[u64],
    vectors: &[f32],
    payloads: Option<&[Option<&[u8]>]>,
) {
    w.u32(OP_UPSERT).u32(ids.len() as u32);
    w.u32(match namespaces {
        Namespaces::One(_) => 0,
        Namespaces::PerItem(_) => 1,
    });
    w.u64(ttl_ms).u64(expires_ms);
    match namespaces {
        Namespaces::One(ns) => w.u64(ns),
        Namespaces::PerItem(ns) => w.u64s(ns),
    };
    w.u64s(ids).f32s(vectors);
    match payloads {
        None => {
            w.u32(0);
        }
        Some(p) => {
            w.u32(1);
            for pl in p {
                w.u32(pl.map_or(NONE_U32, |b| b.len() as u32));
            }
            for b in p.iter().flatten() {
                w.bytes(b);
            }
        }
    }
}

/// Appends a DELETE request.
pub fn delete(w: &mut Writer, ids: &[u64]) {
    w.u32(OP_DELETE).u32(ids.len() as u32).u64s(ids);
}

/// Appends a DELETE_NS request.
pub fn delete_namespace(w: &mut Writer, ns: u64) {
    w.u32(OP_DELETE_NS).u64(ns);
}

/// Appends a CLEAR request.
pub fn clear(w: &mut Writer) {
    w.u32(OP_CLEAR);
}

/// Appends a GET request.
pub fn get(w: &mut Writer, ids: &[u64]) {
    w.u32(OP_GET).u32(ids.len() as u32).u64s(ids);
}

/// Appends a STATS request.
pub fn stats(w: &mut Writer) {
    w.u32(OP_STATS);
}

/// A RECALL request's header, as read from the wire.
#[derive(Debug, Clone)]
pub struct RecallHead {
    pub k: usize,
    pub nq: usize,
    pub flags: u32,
    /// `None` = every namespace.
    pub namespaces: Option<Vec<u64>>,
    /// 0 = no recency weighting.
    pub recency_weight: f32,
    pub half_life_ms: f64,
}

impl RecallHead {
    /// Reads the header at the start of a RECALL body, leaving `r` at the queries. k, nq and the
    /// flags are checked as they are read (1 <= k <= MAX_K, nq > 0, known flags only), so a
    /// request is refused for its first bad field.
    pub fn decode(r: &mut Reader<'_>) -> Result<RecallHead> {
        let k = r.u32("k")? as usize;
        check_k(k)?;
        let nq = r.u32("nq")? as usize;
        if nq == 0 {
            return Err(Error::new(Status::InvalidArgument, "recall of zero queries"));
        }
        let flags = r.u32("flags")?;
        if flags & !FLAG_PAYLOADS != 0 {
            return Err(Error::new(Status::InvalidArgument, format!("unknown recall flags {flags:#x}")));
        }
        let nns = r.u32("namespace count")?;
        let recency_weight = r.f32("recency weight")?;
        let half_life_ms = r.f64("half life")?;
        let namespaces = if nns == NONE_U32 { None } else { Some(r.u64s(nns as usize, "namespaces")?) };
        Ok(RecallHead { k, nq, flags, namespaces, recency_weight, half_life_ms })
    }
}

/// A RECALL request's `n` query values, read in place when they are aligned (see
/// [`Reader::f32s_cow`]).
pub fn recall_queries<'a>(r: &mut Reader<'a>, n: usize) -> Result<Cow<'a, [f32]>> {
    r.f32s_cow(n, "queries")
}

/// An UPSERT request, as read from the wire.
#[derive(Debug, Clone)]
pub struct UpsertRequest<'a> {
    /// One per item.
    pub namespaces: Vec<u64>,
    pub ids: Vec<u64>,
    /// `ids.len()` × dim values.
    pub vectors: Vec<f32>,
    /// One per item; borrowed from the request.
    pub payloads: Vec<Option<&'a [u8]>>,
    pub ttl_ms: u64,
    pub expires_ms: u64,
}

impl<'a> UpsertRequest<'a> {
    /// Reads an UPSERT body of vectors of dimension `dim`; the whole body must be used.
    pub fn decode(body: &'a [u8], dim: usize) -> Result<UpsertRequest<'a>> {
        let mut r = Reader::new(body);
        let n = r.u32("count")? as usize;
        if n == 0 || n > body.len() {
            return Err(Error::new(Status::InvalidArgument, format!("upsert of {n} items is malformed")));
        }
        let ns_mode = r.u32("namespace mode")?;
        let ttl_ms = r.u64("ttl")?;
        let expires_ms = r.u64("expiry")?;
        let namespaces = match ns_mode {
            0 => vec![r.u64("namespace")?; n],
            1 => r.u64s(n, "namespaces")?,
            m => return Err(Error::new(Status::InvalidArgument, format!("unknown namespace mode {m}"))),
        };
        let ids = r.u64s(n, "ids")?;
        let vectors = r.f32s(n.checked_mul(dim).ok_or_else(|| Error::new(Status::InvalidArgument, "size overflow"))?, "vectors")?;
        let has_p = r.u32("payload flag")?;
        let mut payloads: Vec<Option<&[u8]>> = vec![None; n];
        if has_p == 1 {
            let lens = r.u32s(n, "payload lengths")?;
            for (i, &l) in lens.iter().enumerate() {
                if l != NONE_U32 {
                    payloads[i] = Some(r.take(l as usize, "payload")?);
                }
            }
        } else if has_p != 0 {
            return Err(Error::new(Status::InvalidArgument, "bad payload flag"));
        }
        if r.remaining() != 0 {
            return Err(Error::new(Status::InvalidArgument, format!("upsert carries {} trailing bytes", r.remaining())));
        }
        Ok(UpsertRequest { namespaces, ids, vectors, payloads, ttl_ms, expires_ms })
    }
}

/// Reads the ids of a DELETE or GET body.
pub fn decode_ids(body: &[u8]) -> Result<Vec<u64>> {
    let mut r = Reader::new(body);
    let n = r.u32("count")? as usize;
    r.u64s(n, "ids")
}

/// Reads the namespace of a DELETE_NS body.
pub fn decode_namespace(body: &[u8]) -> Result<u64> {
    Reader::new(body).u64("namespace")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let mut w = Writer::new();
        let rec = Recency { weight: 0.25, half_life_ms: 1000.0 };
        recall_head(&mut w, 7, 3, FLAG_PAYLOADS, Some(&[4, 2]), Some(rec));
        assert_eq!(w.len(), RECALL_HEAD_BYTES + 16);
        assert_eq!(op_of(&w.buf), OP_RECALL);
        let body = body_of(&w.buf);
        let mut r = Reader::new(body);
        let h = RecallHead::decode(&mut r).unwrap();
        assert_eq!((h.k, h.nq, h.flags, h.namespaces, h.recency_weight, h.half_life_ms), (7, 3, 1, Some(vec![4, 2]), 0.25, 1000.0));
        assert_eq!(r.remaining(), 0);

        let mut w = Writer::new();
        let (ids, vectors) = ([5u64, 6], [1f32, 2., 3., 4.]);
        upsert(&mut w, Namespaces::PerItem(&[8, 9]), 10, 20, &ids, &vectors, Some(&[Some(b"ab"), None]));
        assert_eq!(op_of(&w.buf), OP_UPSERT);
        let u = UpsertRequest::decode(body_of(&w.buf), 2).unwrap();
        assert_eq!((u.namespaces, u.ids, u.vectors), (vec![8, 9], ids.to_vec(), vectors.to_vec()));
        assert_eq!((u.payloads, u.ttl_ms, u.expires_ms), (vec![Some(&b"ab"[..]), None], 10, 20));

        let mut w = Writer::new();
        delete(&mut w, &[1, 2, 3]);
        assert_eq!((op_of(&w.buf), decode_ids(body_of(&w.buf)).unwrap()), (OP_DELETE, vec![1, 2, 3]));
        let mut w = Writer::new();
        delete_namespace(&mut w, 77);
        assert_eq!((op_of(&w.buf), decode_namespace(body_of(&w.buf)).unwrap()), (OP_DELETE_NS, 77));
    }

    #[test]
    fn a_recall_is_refused_for_its_first_bad_field() {
        let mut w = Writer::new();
        w.u32(0); // k = 0, and nothing after it
        assert_eq!(RecallHead::decode(&mut Reader::new(&w.buf)).unwrap_err().status, Status::KOutOfRange);
        let mut w = Writer::new();
        w.u32(1).u32(0);
        assert_eq!(RecallHead::decode(&mut Reader::new(&w.buf)).unwrap_err().status, Status::InvalidArgument);
        assert_eq!(op_of(&[1, 0]), 0);
    }
}
