//! Requests: op codes, the client's encoders (each appends one request to a [`Writer`]) and the
//! server's decoders (each reads a private copy of a request body, bounds-checked).

use std::borrow::Cow;

use super::codec::{Reader, Writer, NONE_U32};
use super::response::DirectOut;
use crate::error::{Error, Result, Status};
use crate::meta::{decode_fields_block, encode_fields_block, Field};
use crate::types::{check_finite, check_k, normalize_queries, Filter, Recency, MAX_FILTER_NAMESPACES};

pub const OP_RECALL: u32 = 1;
pub const OP_UPSERT: u32 = 2;
pub const OP_DELETE: u32 = 3;
pub const OP_DELETE_NS: u32 = 4;
pub const OP_GET: u32 = 5;
pub const OP_STATS: u32 = 6;
pub const OP_CLEAR: u32 = 7;
pub const OP_DELETE_WHERE: u32 = 8;
pub const OP_LIST: u32 = 9;
/// Cluster mode: log entries for the server to apply (`wire::cluster`); internal (counted
/// as an unknown op in the stats).
pub const OP_APPLY: u32 = 10;

/// The name of op code `op` (metrics labels); "unknown" for any other value.
pub fn op_name(op: u32) -> &'static str {
    match op {
        OP_RECALL => "recall",
        OP_UPSERT => "upsert",
        OP_DELETE => "delete",
        OP_DELETE_NS => "delete_namespace",
        OP_GET => "get",
        OP_STATS => "stats",
        OP_CLEAR => "clear",
        OP_DELETE_WHERE => "delete_where",
        OP_LIST => "list",
        OP_APPLY => "apply",
        _ => "unknown",
    }
}

/// RECALL flag: the response carries each hit's payload.
pub const FLAG_PAYLOADS: u32 = 1;
/// RECALL flag: a metadata filter expression follows the namespaces (`len u32 | bytes`, padded
/// with zeros to a multiple of 4 bytes so the queries stay aligned).
pub const FLAG_FILTER: u32 = 2;

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

#[allow(clippy::too_many_arguments)] // one argument per section of the header, in wire order
/// Appends a RECALL request up to its queries (`nq` × dim f32 values, which follow it in the
/// slot: [`super::f32_bytes`]).
/// `filter` (a metadata expression's binary form) sets [`FLAG_FILTER`].
pub fn recall_head(
    w: &mut Writer,
    k: usize,
    nq: usize,
    flags: u32,
    namespaces: Option<&[u64]>,
    recency: Option<Recency>,
    filter: Option<&[u8]>,
    cluster: Option<&super::cluster::ClusterRecall>,
) {
    let flags = if filter.is_some() { flags | FLAG_FILTER } else { flags };
    let flags = if cluster.is_some() { flags | super::cluster::FLAG_CLUSTER } else { flags };
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
    if let Some(f) = filter {
        w.u32(f.len() as u32).bytes(f);
        w.bytes(&[0u8; 3][..filter_pad(f.len())]);
    }
    if let Some(c) = cluster {
        c.encode(w);
    }
}

/// Zero bytes after a RECALL's filter expression of `len` bytes.
pub const fn filter_pad(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Bytes a RECALL header takes for a filter expression of `len` bytes.
pub const fn filter_bytes(len: usize) -> usize {
    4 + len + filter_pad(len)
}

/// Bytes of one UPSERT's fields section for `fields` (0 when there are none).
pub fn fields_section_bytes(fields: Option<&[Vec<Field>]>) -> usize {
    fields.map_or(0, |f| 4 + encode_fields_block(&f.iter().map(|v| v.as_slice()).collect::<Vec<_>>()).len())
}

/// Appends a DELETE_WHERE request: delete every memory that matches a filter expression (and
/// the namespace list, when given).
pub fn delete_where(w: &mut Writer, namespaces: Option<&[u64]>, filter: &[u8]) {
    w.u32(OP_DELETE_WHERE);
    match namespaces {
        None => w.u32(NONE_U32),
        Some(ns) => w.u32(ns.len() as u32).u64s(ns),
    };
    w.u32(filter.len() as u32).bytes(filter);
}

/// Reads a DELETE_WHERE body as a checked [`Filter`].
pub fn decode_delete_where(body: &[u8]) -> Result<Filter> {
    let mut r = Reader::new(body);
    let nns = r.u32("namespace count")?;
    let f = if nns == NONE_U32 { Filter::all() } else { Filter::new(&r.u64s(nns as usize, "namespaces")?)? };
    let n = r.u32("filter length")? as usize;
    let f = f.with_expr(r.take(n, "filter")?)?;
    if r.remaining() != 0 {
        return Err(Error::new(Status::InvalidArgument, format!("delete-where carries {} trailing bytes", r.remaining())));
    }
    Ok(f)
}

/// LIST flag: the listing starts after the request's cursor id (else at the smallest id).
pub const LIST_AFTER: u32 = 1;
/// LIST flag: a metadata filter expression (`len u32 | bytes`) follows the namespaces.
pub const LIST_FILTER: u32 = 2;

/// Appends a LIST request: the ids of the live memories that match the namespace list (when
/// given) and the filter expression (when given), greater than `after` (when given), ascending,
/// at most `limit` of them.
pub fn list(w: &mut Writer, namespaces: Option<&[u64]>, filter: Option<&[u8]>, after: Option<u64>, limit: u32) {
    let flags = if after.is_some() { LIST_AFTER } else { 0 } | if filter.is_some() { LIST_FILTER } else { 0 };
    w.u32(OP_LIST).u32(flags).u32(limit).u64(after.unwrap_or(0));
    match namespaces {
        None => w.u32(NONE_U32),
        Some(ns) => w.u32(ns.len() as u32).u64s(ns),
    };
    if let Some(f) = filter {
        w.u32(f.len() as u32).bytes(f);
    }
}

/// A LIST request, as read from the wire.
#[derive(Debug, Clone)]
pub struct ListRequest {
    /// Namespaces and the checked expression.
    pub filter: Filter,
    /// List ids strictly greater than this; None = from the smallest id.
    pub after: Option<u64>,
    /// Most ids in the reply.
    pub limit: usize,
}

impl ListRequest {
    /// Reads a LIST body; the whole body must be used.
    pub fn decode(body: &[u8]) -> Result<ListRequest> {
        let mut r = Reader::new(body);
        let flags = r.u32("flags")?;
        if flags & !(LIST_AFTER | LIST_FILTER) != 0 {
            return Err(Error::new(Status::InvalidArgument, format!("unknown list flags {flags:#x}")));
        }
        let limit = r.u32("limit")? as usize;
        let after = r.u64("after")?;
        let nns = r.u32("namespace count")?;
        let mut f = if nns == NONE_U32 { Filter::all() } else { Filter::new(&r.u64s(nns as usize, "namespaces")?)? };
        if flags & LIST_FILTER != 0 {
            let n = r.u32("filter length")? as usize;
            f = f.with_expr(r.take(n, "filter")?)?;
        }
        if r.remaining() != 0 {
            return Err(Error::new(Status::InvalidArgument, format!("list carries {} trailing bytes", r.remaining())));
        }
        Ok(ListRequest { filter: f, after: (flags & LIST_AFTER != 0).then_some(after), limit })
    }
}

/// Appends an UPSERT request of `ids.len()` items: `vectors` holds their values back to back,
/// `payloads` (when given) one entry per item.
#[allow(clippy::too_many_arguments)] // one argument per section of the request, in wire order
pub fn upsert(
    w: &mut Writer,
    namespaces: Namespaces<'_>,
    ttl_ms: u64,
    expires_ms: u64,
    ids: &[u64],
    vectors: &[f32],
    payloads: Option<&[Option<&[u8]>]>,
    fields: Option<&[Vec<Field>]>,
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
    // Fields (optional, last): `len u32 | fields block` (docs/FORMATS.md).
    if let Some(f) = fields {
        let blk = encode_fields_block(&f.iter().map(|v| v.as_slice()).collect::<Vec<_>>());
        w.u32(blk.len() as u32).bytes(&blk);
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
    /// The metadata filter expression (unchecked bytes; [`Filter::with_expr`] checks them).
    pub filter: Option<Vec<u8>>,
    /// The cluster section ([`super::cluster::FLAG_CLUSTER`]).
    pub cluster: Option<super::cluster::ClusterRecall>,
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
        use super::cluster::{ClusterRecall, FLAG_CLUSTER, FLAG_LOCAL};
        if flags & !(FLAG_PAYLOADS | FLAG_FILTER | FLAG_LOCAL | FLAG_CLUSTER) != 0 {
            return Err(Error::new(Status::InvalidArgument, format!("unknown recall flags {flags:#x}")));
        }
        let nns = r.u32("namespace count")?;
        let recency_weight = r.f32("recency weight")?;
        let half_life_ms = r.f64("half life")?;
        let namespaces = if nns == NONE_U32 { None } else { Some(r.u64s(nns as usize, "namespaces")?) };
        let filter = if flags & FLAG_FILTER != 0 {
            let n = r.u32("filter length")? as usize;
            let f = r.take(n, "filter")?.to_vec();
            if r.take(filter_pad(n), "filter padding")?.iter().any(|&b| b != 0) {
                return Err(Error::new(Status::InvalidArgument, "recall filter padding is not zero"));
            }
            Some(f)
        } else {
            None
        };
        let cluster = if flags & FLAG_CLUSTER != 0 { Some(ClusterRecall::decode(r)?) } else { None };
        Ok(RecallHead { k, nq, flags: flags & !(FLAG_FILTER | FLAG_CLUSTER), namespaces, recency_weight, half_life_ms, filter, cluster })
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
    /// One per item (empty: no fields), or empty when the request carries none.
    pub fields: Vec<Vec<Field>>,
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
        let fields = if r.remaining() == 0 {
            Vec::new()
        } else {
            let len = r.u32("fields length")? as usize;
            decode_fields_block(r.take(len, "fields")?, n)?
        };
        if r.remaining() != 0 {
            return Err(Error::new(Status::InvalidArgument, format!("upsert carries {} trailing bytes", r.remaining())));
        }
        Ok(UpsertRequest { namespaces, ids, vectors, payloads, fields, ttl_ms, expires_ms })
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

/// A validated search request handed to an engine: the queries (a private, checked copy or a
/// [`SlotQueries`] view), the filter, and where the engine may write the reply itself.
#[derive(Debug, Clone)]
pub struct SearchRequest<'a> {
    /// `nq * dim` query values, row-major. Already normalised for cosine.
    pub queries: &'a [f32],
    pub nq: usize,
    pub k: usize,
    pub filter: &'a Filter,
    pub recency: Option<Recency>,
    /// Wall-clock now in unix milliseconds (expiry and recency are judged against it).
    pub now_ms: u64,
    /// A single query's response body may be written straight into the client's slot here
    /// (engines that can do so say how many bytes they wrote; see [`DirectOut`]).
    pub direct: Option<&'a DirectOut>,
    /// When set, `queries` is empty and the `nq * dim` query values are still in the client's
    /// slot (see [`SlotQueries`]): only for engines that said they take them
    /// (`Engine::takes_slot_queries`), and only for large batches of ip or l2 queries.
    pub slot: Option<SlotQueries>,
}

/// A batch's query values left in the client's slot instead of being copied into the server's
/// memory: the CUDA engine copies them to the device by DMA and checks them there. The memory is
/// shared with a client that may change it at any time, so it is never read through a Rust
/// reference: only by DMA (from [`SlotQueries::dma_addr`]) or by [`SlotQueries::copy_checked`],
/// and every check applies to the copy that is then used (a client changing its slot during the
/// request changes its own answer, nothing else).
#[derive(Debug, Clone, Copy)]
pub struct SlotQueries {
    ptr: *const u8,
    len: usize,
    cosine_dim: usize,
}

impl SlotQueries {
    /// A view of `len` f32 values at `ptr`. `cosine_dim` is the query dimension for cosine
    /// stores (whoever reads the queries scales each to unit length), 0 for ip and l2.
    ///
    /// # Safety
    /// `ptr..ptr + 4 * len` lies inside a mapped slot data area that stays mapped while the
    /// request is served, and `ptr` is 4-byte aligned.
    pub unsafe fn new(ptr: *const u8, len: usize, cosine_dim: usize) -> Self {
        SlotQueries { ptr, len, cosine_dim }
    }

    /// Number of f32 values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the view holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Cosine stores: the query dimension (each query is scaled to unit length by its reader);
    /// 0 for ip and l2.
    pub fn cosine_dim(&self) -> usize {
        self.cosine_dim
    }

    /// Host address of value `first` and the number of values from there to the end, for a DMA
    /// copy to the device; None when `first` is past the end. The address must not be
    /// dereferenced on the host: the client may be writing it.
    pub fn dma_addr(&self, first: usize) -> Option<(usize, usize)> {
        (first <= self.len).then(|| (self.ptr as usize + first * 4, self.len - first))
    }

    /// A private copy of the values, checked finite and, for cosine stores, scaled to unit
    /// length (engines that cannot read the slot themselves, or that answer this batch on the
    /// CPU).
    pub fn copy_checked(&self) -> Result<Vec<f32>> {
        let mut v = vec![0f32; self.len];
        // SAFETY: `new`'s contract: the range is inside a mapped slot data area for the life of
        // the request. The client may write these bytes concurrently: a byte-wise copy of plain
        // f32 data cannot fault, and only the private copy is checked and used.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, v.as_mut_ptr() as *mut u8, self.len * 4) };
        check_finite(&v, "query")?;
        if self.cosine_dim > 0 {
            normalize_queries(&mut v, self.cosine_dim)?;
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Status;

    #[test]
    fn cosine_slot_queries_are_normalised_like_the_servers() {
        let dim = 5;
        let q: Vec<f32> = vec![3.0, -4.0, 0.0, 1e-3, 12.0, 1e20, 2e20, 0.0, 0.0, -1e20];
        let mut want = q.clone();
        normalize_queries(&mut want, dim).unwrap();
        for row in want.chunks(dim) {
            let n: f64 = row.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
            assert!((n - 1.0).abs() < 1e-6, "norm {n}");
        }
        // The slot path's private copy gives the same values, bit for bit.
        let view = |v: &[f32], cosine_dim| {
            // SAFETY: each vector below outlives its view and holds v.len() f32 values.
            unsafe { SlotQueries::new(v.as_ptr() as *const u8, v.len(), cosine_dim) }
        };
        let sq = view(&q, dim);
        assert_eq!(sq.len(), q.len());
        assert_eq!(sq.dma_addr(dim), Some((q.as_ptr() as usize + dim * 4, q.len() - dim)));
        assert_eq!(sq.dma_addr(q.len() + 1), None);
        assert_eq!(sq.copy_checked().unwrap(), want);
        // ip / l2 slot queries are copied as they are.
        let plain = view(&q, 0);
        assert_eq!(plain.copy_checked().unwrap(), q);
        // An all-zero query is the request's INVALID_ARGUMENT; a non-finite one stays NON_FINITE.
        let mut z = q.clone();
        z[dim..].iter_mut().for_each(|x| *x = 0.0);
        let zs = view(&z, dim);
        assert_eq!(zs.copy_checked().unwrap_err().status, Status::InvalidArgument);
        let mut nan = q.clone();
        nan[7] = f32::NAN;
        let ns = view(&nan, dim);
        assert_eq!(ns.copy_checked().unwrap_err().status, Status::NonFinite);
    }

    #[test]
    fn requests_round_trip() {
        let mut w = Writer::new();
        let rec = Recency { weight: 0.25, half_life_ms: 1000.0 };
        recall_head(&mut w, 7, 3, FLAG_PAYLOADS, Some(&[4, 2]), Some(rec), None, None);
        assert_eq!(w.len(), RECALL_HEAD_BYTES + 16);
        assert_eq!(op_of(&w.buf), OP_RECALL);
        let body = body_of(&w.buf);
        let mut r = Reader::new(body);
        let h = RecallHead::decode(&mut r).unwrap();
        assert_eq!((h.k, h.nq, h.flags, h.namespaces, h.recency_weight, h.half_life_ms), (7, 3, 1, Some(vec![4, 2]), 0.25, 1000.0));
        assert_eq!(r.remaining(), 0);

        let mut w = Writer::new();
        let (ids, vectors) = ([5u64, 6], [1f32, 2., 3., 4.]);
        upsert(&mut w, Namespaces::PerItem(&[8, 9]), 10, 20, &ids, &vectors, Some(&[Some(b"ab"), None]), None);
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
