//! The fuzz targets: for each parser that reads bytes Kalos does not trust, a generator of inputs
//! (valid inputs built by the real encoders, then mutated; or plain random bytes) and a check
//! that feeds one input to the real parsing code and asserts what must hold for every input:
//! no panic, and what is accepted is consistent and encodes back to the same bytes.
//!
//! An input is one byte string, so that a failing case can be saved and replayed; targets that
//! need parameters (a dimension, a metric) read them from the first bytes.

use std::cell::Cell;
use std::path::{Path, PathBuf};

use kalos::persist::fuzz as pf;
use kalos::persist::{Persist, PersistOptions, WalOp};
use kalos::store::{Store, UpsertItem};
use kalos::wire::request::{self, Namespaces, RecallHead, UpsertRequest};
use kalos::wire::response;
use kalos::wire::{Reader, Writer};
use kalos::{Metric, Recency, Status, SyncPolicy};
use rand::rngs::StdRng;
use rand::{Rng, RngCore};

use super::mutate::{self, Field};

/// The raw slot round trip of the hostile-client tests, for `check_server` (declared here, so that
/// every crate that includes this file, tests/fuzz.rs and the cargo-fuzz targets of fuzz/, has it).
#[path = "../raw_slot/mod.rs"]
mod raw_slot;

thread_local! {
    /// The largest single allocation on this thread since the harness reset it (kept by the
    /// harness's allocator).
    pub static PEAK: Cell<usize> = const { Cell::new(0) };
    /// [`PEAK`] when the check said the parsing was over ([`parsed`]).
    pub static PARSED_PEAK: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Marks the end of a check's parsing: what it allocates after this (to re-encode or reload
/// what was accepted) is not held to the target's allocation bound.
pub fn parsed() {
    PARSED_PEAK.set(Some(PEAK.get()));
}

fn u16_at(b: &[u8], o: usize) -> usize {
    u16::from_le_bytes([b[o], b[o + 1]]) as usize
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

/// Mutated (9 in 10) or plain random (1 in 10) bytes after the `keep` parameter bytes of `base`.
fn mutated_or_random(rng: &mut StdRng, base: Vec<u8>, fields: &[Field], keep: usize, max_len: usize) -> Vec<u8> {
    if rng.random_range(0..10) == 0 {
        let mut b = base[..keep].to_vec();
        let n = rng.random_range(0..max_len.min(4096).saturating_sub(keep).max(1));
        b.extend(mutate::bytes(rng, n));
        return b;
    }
    mutate::mutate(rng, &base, fields, keep, max_len)
}

// ---------------------------------------------------------------------------------------------
// Requests (wire::request): the server's decoders of a slot's bytes.

/// A valid request of a random kind for vectors of dimension `dim`, and its length, count and
/// flag fields.
pub fn valid_request(rng: &mut StdRng, dim: usize) -> (Vec<u8>, Vec<Field>) {
    let mut w = Writer::new();
    let mut f = Vec::new();
    match rng.random_range(0..10) {
        0..=2 => {
            let k = if rng.random_range(0..4) == 0 { rng.random_range(1..=1024) } else { rng.random_range(1..=10) };
            let nq = rng.random_range(1..=3);
            let flags = rng.random_range(0..2);
            let ns: Option<Vec<u64>> =
                (rng.random_range(0..3) == 0).then(|| (0..rng.random_range(0..6)).map(|_| rng.random_range(0..4)).collect());
            let recency = (rng.random_range(0..3) == 0)
                .then(|| Recency { weight: rng.random_range(0.0..1.0), half_life_ms: rng.random_range(1.0..1e6) });
            // Sometimes a metadata filter expression (a valid one; mutations damage it).
            let filter = (rng.random_range(0..3) == 0).then(|| {
                use kalos::filter::Expr;
                use kalos::meta::Value;
                let leaf = Expr::eq("a", Value::Int(rng.random_range(0..4)));
                if rng.random() { leaf } else { Expr::Or(vec![leaf, Expr::Not(Box::new(Expr::Exists("b".into())))]) }.encode()
            });
            request::recall_head(&mut w, k, nq, flags, ns.as_deref(), recency, filter.as_deref(), None);
            w.f32s(&mutate::vector(rng, nq * dim));
            f.extend([Field::u32(4), Field::u32(8), Field::u32(12), Field::u32(16), Field::u32(20), Field::u64(24)]);
        }
        3..=4 => {
            let n = rng.random_range(1..=4);
            let ids: Vec<u64> = (0..n).map(|_| rng.random_range(0..16)).collect();
            let per_item: Vec<u64> = (0..n).map(|_| rng.random_range(0..4)).collect();
            let ns = if rng.random() { Namespaces::PerItem(&per_item) } else { Namespaces::One(rng.random_range(0..4)) };
            let store: Vec<Vec<u8>> = (0..n).map(|_| mutate::bytes_in(rng, 0..24)).collect();
            let payloads: Vec<Option<&[u8]>> = store.iter().map(|p| (rng.random_range(0..3) > 0).then_some(&p[..])).collect();
            let with_payloads = rng.random_range(0..3) > 0;
            let ttl = if rng.random() { 0 } else { rng.random_range(1..1_000_000) };
            let expires = if rng.random_range(0..4) > 0 { u64::MAX } else { rng.random() };
            request::upsert(
                &mut w,
                ns.clone(),
                ttl,
                expires,
                &ids,
                &mutate::vector(rng, n * dim),
                with_payloads.then_some(&payloads[..]),
                None,
            );
            f.extend([Field::u32(4), Field::u32(8), Field::u64(12), Field::u64(20)]);
            let flag = 28 + if matches!(ns, Namespaces::One(_)) { 8 } else { 8 * n } + 8 * n + 4 * n * dim;
            f.push(Field::u32(flag));
            if with_payloads {
                f.extend((0..n).map(|i| Field::u32(flag + 4 + 4 * i)));
            }
        }
        5 => {
            let ids: Vec<u64> = (0..rng.random_range(0..5)).map(|_| rng.random_range(0..16)).collect();
            if rng.random() {
                request::delete(&mut w, &ids);
            } else {
                request::get(&mut w, &ids);
            }
            f.push(Field::u32(4));
        }
        6 => request::delete_namespace(&mut w, rng.random_range(0..4)),
        7 => request::stats(&mut w),
        8 => {
            let ns: Option<Vec<u64>> =
                (rng.random_range(0..3) == 0).then(|| (0..rng.random_range(0..6)).map(|_| rng.random_range(0..4)).collect());
            let filter =
                rng.random::<bool>().then(|| kalos::filter::Expr::eq("a", kalos::meta::Value::Int(rng.random_range(0..4))).encode());
            let after = rng.random::<bool>().then(|| rng.random_range(0..16));
            request::list(&mut w, ns.as_deref(), filter.as_deref(), after, rng.random_range(0..20));
            f.extend([Field::u32(4), Field::u32(8), Field::u64(12), Field::u32(20)]);
        }
        _ => {
            if rng.random_range(0..4) == 0 {
                request::clear(&mut w);
            } else {
                w.u32(rng.random_range(8..12)).bytes(&mutate::bytes_in(rng, 0..16));
            }
        }
    }
    f.push(Field::u32(0));
    (w.buf, f)
}

/// Input: dim u16, then a request (op u32, body).
pub fn gen_request(rng: &mut StdRng) -> Vec<u8> {
    let dim = if rng.random_range(0..8) == 0 { rng.random_range(0..2000) } else { rng.random_range(1..=8) };
    let (req, fields) = valid_request(rng, dim);
    let mut b = (dim as u16).to_le_bytes().to_vec();
    b.extend_from_slice(&req);
    let fields: Vec<Field> = fields.iter().map(|f| Field { off: f.off + 2, width: f.width }).collect();
    mutated_or_random(rng, b, &fields, 2, 1 << 16)
}

/// Every decoder of `wire::request` on the request: accepted requests re-encode to the bytes
/// they were read from; the server's checks of a recall's filter and queries never panic.
pub fn check_request(input: &[u8]) {
    if input.len() < 2 {
        return;
    }
    let dim = u16_at(input, 0);
    let req = &input[2..];
    let op = request::op_of(req);
    let body = request::body_of(req);
    assert!(req.len() < 4 || op == u32_at(req, 0));

    let mut r = Reader::new(body);
    if let Ok(h) = RecallHead::decode(&mut r) {
        assert!(
            (1..=kalos::MAX_K).contains(&h.k) && h.nq > 0 && h.flags & !(request::FLAG_PAYLOADS | kalos::wire::cluster::FLAG_LOCAL) == 0
        );
        let used = body.len() - r.remaining();
        let mut w = Writer::new();
        let rec = Recency { weight: h.recency_weight, half_life_ms: h.half_life_ms };
        request::recall_head(&mut w, h.k, h.nq, h.flags, h.namespaces.as_deref(), Some(rec), h.filter.as_deref(), h.cluster.as_ref());
        assert_eq!(&w.buf[4..], &body[..used], "a recall header re-encodes to its bytes");
        if let Some(ns) = &h.namespaces {
            let _ = kalos::Filter::new(ns);
        }
        if let Some(n) = h.nq.checked_mul(dim) {
            let mut r2 = Reader::new(&body[used..]);
            if let Ok(q) = request::recall_queries(&mut r2, n) {
                assert_eq!(kalos::wire::f32_bytes(&q), &body[used..used + 4 * n]);
                let mut q = q.into_owned();
                if kalos::types::check_finite(&q, "query").is_ok() && dim > 0 {
                    let _ = kalos::types::normalize_queries(&mut q, dim);
                    assert!(q.iter().all(|x| x.is_finite()), "normalised queries stay finite");
                }
            }
        }
    }

    if let Ok(u) = UpsertRequest::decode(body, dim) {
        let n = u.ids.len();
        assert!(n > 0 && u.namespaces.len() == n && u.payloads.len() == n && u.vectors.len() == n * dim);
        let per_item = u32_at(body, 4) == 1;
        let flag_at = 24 + if per_item { 8 * n } else { 8 } + 8 * n + 4 * n * dim;
        let with_payloads = u32_at(body, flag_at) == 1;
        let ns = if per_item { Namespaces::PerItem(&u.namespaces) } else { Namespaces::One(u.namespaces[0]) };
        let mut w = Writer::new();
        request::upsert(
            &mut w,
            ns,
            u.ttl_ms,
            u.expires_ms,
            &u.ids,
            &u.vectors,
            with_payloads.then_some(&u.payloads[..]),
            (!u.fields.is_empty()).then_some(&u.fields[..]),
        );
        assert_eq!(&w.buf[4..], body, "an upsert re-encodes to its bytes");
    }

    if let Ok(ids) = request::decode_ids(body) {
        let mut w = Writer::new();
        request::delete(&mut w, &ids);
        assert_eq!(&w.buf[4..], &body[..4 + 8 * ids.len()], "ids re-encode to their bytes");
    }
    if let Ok(ns) = request::decode_namespace(body) {
        assert_eq!(&ns.to_le_bytes()[..], &body[..8]);
    }
    if let Ok(l) = request::ListRequest::decode(body) {
        assert_eq!((l.limit, l.after.is_some()), (u32_at(body, 4) as usize, u32_at(body, 0) & request::LIST_AFTER != 0));
        assert!(l.filter.namespaces.as_ref().is_none_or(|ns| ns.len() <= kalos::types::MAX_FILTER_NAMESPACES));
    }
}

// ---------------------------------------------------------------------------------------------
// Responses (wire::response): the client's parsers of what a server wrote into its slot.

/// Input: nq u8, k u8, dim u16, then a response body.
pub fn gen_response(rng: &mut StdRng) -> Vec<u8> {
    let nq = rng.random_range(1..=3usize);
    let k = rng.random_range(1..=4usize);
    let dim = rng.random_range(0..=4usize);
    let mut b = vec![nq as u8, k as u8];
    b.extend_from_slice(&(dim as u16).to_le_bytes());
    let mut w = Writer::new();
    let mut f = Vec::new();
    let hits = |rng: &mut StdRng, n: usize| -> Vec<kalos::Hit> {
        (0..n).map(|_| kalos::Hit { id: rng.random(), score: mutate::float(rng) }).collect()
    };
    match rng.random_range(0..6) {
        0 => {
            let lists: Vec<Vec<kalos::Hit>> = (0..nq)
                .map(|_| {
                    let c = rng.random_range(0..=k);
                    hits(rng, c)
                })
                .collect();
            let mut buf = vec![0u8; response::recall_body_len(nq, lists.iter().map(Vec::len).sum())];
            // SAFETY: `buf` is exactly the body's length, writable and not shared.
            let len = unsafe { response::write_recall_body(buf.as_mut_ptr(), buf.len(), lists.iter().map(|l| &l[..])) }.unwrap();
            w.bytes(&buf[..len]);
            f.extend((0..nq).map(|i| Field::u32(4 + 4 * i)));
        }
        1 => {
            let c = rng.random_range(0..=k);
            let h = hits(rng, c);
            let p: Vec<Vec<u8>> = h.iter().map(|_| mutate::bytes_in(rng, 0..8)).collect();
            response::encode_recall_payloads(&mut w, std::iter::once(&h[..]), |x| {
                let i = h.iter().position(|y| y.id == x.id).unwrap();
                (i % 2 == 0).then_some(&p[i][..])
            });
            f.push(Field::u32(4));
            f.extend((0..h.len()).map(|i| Field::u32(4 + 4 + 12 * h.len() + 4 * i)));
        }
        2 => {
            for _ in 0..rng.random_range(0..3) {
                let payload = rng.random::<bool>().then(|| mutate::bytes_in(rng, 0..8));
                let rec = kalos::Record {
                    id: 0,
                    namespace: rng.random(),
                    vector: mutate::vector(rng, dim),
                    payload,
                    created_ms: 1,
                    expires_ms: 2,
                    fields: if rng.random() {
                        vec![kalos::meta::Field::new("k", kalos::meta::Value::Keyword("v".into()))]
                    } else {
                        Vec::new()
                    },
                };
                f.push(Field::u32(4 + w.len() + 24 + 4 * dim));
                response::write_record(&mut w, &rec);
            }
        }
        3 => {
            let s = kalos::Stats {
                count: rng.random(),
                engine_name: "cpu".into(),
                fallback_reason: "no GPU".into(),
                ..kalos::Stats::default()
            };
            s.encode(&mut w);
            f.extend([Field::u32(4 + 144), Field::u32(4 + 151)]);
        }
        4 => {
            let ids: Vec<u64> = (0..rng.random_range(0..=k)).map(|_| rng.random()).collect();
            w.bytes(&response::list_reply(&ids, rng.random()));
            f.push(Field::u32(4 + 8));
        }
        _ => {
            w.bytes(&response::deleted(rng.random()));
        }
    }
    b.extend_from_slice(&w.buf);
    mutated_or_random(rng, b, &f, 4, 1 << 16)
}

/// Every response parser of the client on the body: no panic, counts within k, and accepted
/// bodies re-encode to the bytes they were read from.
pub fn check_response(input: &[u8]) {
    if input.len() < 4 {
        return;
    }
    let (nq, k, dim) = (input[0] as usize, input[1] as usize, u16_at(input, 2));
    let resp = &input[4..];
    let (mut ids, mut scores, mut counts) = (vec![0u64; nq * k], vec![0f32; nq * k], vec![0usize; nq]);
    if let Ok(c) = response::read_recall_one(resp, k, &mut ids[..k.min(nq * k)], &mut scores[..k.min(nq * k)]) {
        assert!(c <= k);
    }
    if response::read_recall_batch(resp, nq, k, &mut ids, &mut scores, &mut counts).is_ok() {
        assert!(counts.iter().all(|&c| c <= k));
    }
    if let Ok(hits) = response::read_recall_payloads(resp) {
        let mut w = Writer::new();
        let list: Vec<kalos::Hit> = hits.iter().map(|h| h.0).collect();
        let i = std::cell::Cell::new(0);
        response::encode_recall_payloads(&mut w, std::iter::once(&list[..]), |_| {
            i.set(i.get() + 1);
            hits[i.get() - 1].1
        });
        assert_eq!(&w.buf[..], &resp[..w.len()], "a payload recall body re-encodes to its bytes");
    }
    let mut r = Reader::new(resp);
    let mut at = 0;
    while let Ok(rec) = response::read_record(&mut r, 7, dim) {
        let mut w = Writer::new();
        response::write_record(&mut w, &rec);
        assert_eq!(&w.buf[..], &resp[at..at + w.len()], "a record re-encodes to its bytes");
        at += w.len();
    }
    if let Ok(s) = kalos::Stats::decode(&mut Reader::new(resp)) {
        // A name that is not UTF-8 is decoded with replacement characters; any other re-encodes.
        if !s.engine_name.contains('\u{FFFD}') && !s.fallback_reason.contains('\u{FFFD}') {
            let mut w = Writer::new();
            s.encode(&mut w);
            // Stats from a server before the two rerank counters end 16 bytes early: they decode
            // with both at 0 and re-encode with that tail added.
            let n = if w.len() <= resp.len() {
                w.len()
            } else {
                assert!(s.rerank_queries == 0 && s.rerank_uncertain == 0, "a short stats body has no rerank counters");
                w.len() - 16
            };
            assert_eq!(&w.buf[..n], &resp[..n], "stats re-encode to their bytes");
        }
    }
    let mut listed = vec![0u64; k];
    if let Ok((n, remaining)) = response::read_list(resp, &mut listed) {
        assert!(n <= k);
        assert_eq!(&response::list_reply(&listed[..n], remaining)[..], &resp[..12 + 8 * n], "a list body re-encodes to its bytes");
    }
    let _ = response::read_deleted(resp);
    let _ = response::error_message(resp);
}

// ---------------------------------------------------------------------------------------------
// Log records (persist: scan_log, apply_record, decode_rows; repair's count_records).

fn metric_of(b: u8) -> Metric {
    Metric::from_u32(b as u32 % 3).unwrap()
}

fn random_items(rng: &mut StdRng, dim: usize, n: usize, store: &mut Vec<(Vec<f32>, Option<Vec<u8>>)>) -> Vec<(u64, u64, u64, u64)> {
    store.clear();
    (0..n)
        .map(|_| {
            let payload = match rng.random_range(0..3) {
                0 => None,
                1 => Some(Vec::new()),
                _ => Some(mutate::bytes_in(rng, 1..24)),
            };
            store.push((mutate::vector(rng, dim), payload));
            let expires = if rng.random_range(0..4) > 0 { u64::MAX } else { rng.random() };
            (rng.random_range(0..24), rng.random_range(0..4), rng.random_range(0..2_000_000_000_000), expires)
        })
        .collect()
}

fn items<'a>(meta: &[(u64, u64, u64, u64)], data: &'a [(Vec<f32>, Option<Vec<u8>>)]) -> Vec<UpsertItem<'a>> {
    meta.iter()
        .zip(data)
        .map(|(&(id, namespace, created_ms, expires_ms), (v, p))| UpsertItem {
            fields: &[],
            id,
            namespace,
            vector: v,
            payload: p.as_deref(),
            created_ms,
            expires_ms,
        })
        .collect()
}

/// A valid log of dimension `dim`: the header, then `records` records from sequence number
/// `seq` on; and its fields.
pub fn valid_log(rng: &mut StdRng, dim: usize, metric: Metric, gen: u64, seq: u64, records: usize) -> (Vec<u8>, Vec<Field>) {
    let h = pf::Header { dim: dim as u32, metric: metric as u32, generation: gen, seq };
    let mut b = pf::encode_header(false, h);
    let mut f = vec![Field::u32(12), Field::u32(16), Field::u64(24), Field::u64(32)];
    let mut data = Vec::new();
    for i in 0..records as u64 {
        let o = b.len();
        f.extend([Field::u32(o), Field::u64(o + 8)]);
        let s = seq.wrapping_add(i);
        match rng.random_range(0..6) {
            0..=2 => {
                let n = rng.random_range(1..=4);
                let meta = random_items(rng, dim, n, &mut data);
                pf::encode_record(&mut b, s, &WalOp::Upsert(&items(&meta, &data)));
                f.push(Field::u32(o + 17));
                let plen = o + 21 + 32 * n;
                f.extend((0..n).map(|j| Field::u32(plen + 4 * j)));
            }
            3 => {
                let ids: Vec<u64> = (0..rng.random_range(0..4)).map(|_| rng.random_range(0..24)).collect();
                pf::encode_record(&mut b, s, &WalOp::Delete(&ids));
                f.push(Field::u32(o + 17));
            }
            4 => pf::encode_record(&mut b, s, &WalOp::DeleteNamespace(rng.random_range(0..4))),
            _ => pf::encode_record(&mut b, s, &WalOp::Clear),
        }
    }
    (b, f)
}

fn random_seq(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..6) {
        0 => u64::MAX - rng.random_range(0..4),
        1 => rng.random(),
        _ => rng.random_range(0..1000),
    }
}

/// Input: metric u8, dim u16 (the store's), then a log file (mutated and, 4 times in 5, with
/// its checksums recomputed so the mutation reaches the record parser).
pub fn gen_wal(rng: &mut StdRng) -> Vec<u8> {
    let dim = rng.random_range(1..=6);
    let metric = metric_of(rng.random());
    let (gen, seq, n) = (rng.random_range(0..4), random_seq(rng), rng.random_range(0..6));
    let (log, fields) = valid_log(rng, dim, metric, gen, seq, n);
    let mut b = vec![metric as u8];
    b.extend_from_slice(&(dim as u16).to_le_bytes());
    b.extend_from_slice(&log);
    let fields: Vec<Field> = fields.iter().map(|f| Field { off: f.off + 3, width: f.width }).collect();
    let mut b = mutated_or_random(rng, b, &fields, 3, 1 << 16);
    if rng.random_range(0..5) > 0 {
        mutate::reseal(&mut b[3..], kalos::persist::HEADER_BYTES);
    }
    b
}

/// Recovery's replay of a log into a store (header, scan, apply), and repair's record count:
/// no panic; the intact records are contiguous from the header on; damage is reported exactly
/// where they end; every intact upsert record re-encodes to its bytes.
pub fn check_wal(input: &[u8]) {
    if input.len() < 3 {
        return;
    }
    let (metric, dim) = (metric_of(input[0]), u16_at(input, 1));
    let b = &input[3..];
    let _ = pf::decode_header(b, true);
    let mut store = Store::new(dim, metric, 1 << 20, 1 << 20);
    let count = pf::count_records(b, kalos::persist::HEADER_BYTES);
    let Ok(rep) = pf::replay_log(b, &mut store) else { return };
    let mut at = kalos::persist::HEADER_BYTES;
    for &(s, e) in &rep.records {
        assert_eq!(s, at + 8, "records are contiguous");
        assert!(e > s && e <= b.len());
        if b[s + 8] == 1 {
            if let Some(re) = pf::rows_reencoded(&b[s + 9..e], dim) {
                // The encoder leaves out a fields section in which no row has a field; a block
                // that carries one (all items empty) decodes to the same rows.
                let orig = &b[s + 9..e];
                assert!(re == orig || orig.starts_with(&re), "an upsert record's rows re-encode to their bytes");
                assert_eq!(pf::rows_reencoded(&re, dim).as_deref(), Some(&re[..]), "re-encoding is a fixed point");
            }
        }
        at = e;
    }
    assert_eq!(rep.end, at);
    match rep.damage {
        None => assert_eq!(rep.end, b.len()),
        Some((off, _)) => assert!(off == rep.end && off < b.len()),
    }
    assert!(count >= rep.records.len() as u64, "repair counts every intact record");
}

// ---------------------------------------------------------------------------------------------
// Snapshots (persist: load_snapshot, recovery's and repair's).

/// A valid snapshot of a random table: the header, one or more blocks, the end block; and its
/// fields.
pub fn valid_snapshot(rng: &mut StdRng, dim: usize, metric: Metric, gen: u64, seq: u64) -> (Vec<u8>, Vec<Field>) {
    let mut b = pf::encode_header(true, pf::Header { dim: dim as u32, metric: metric as u32, generation: gen, seq });
    let mut f = vec![Field::u32(12), Field::u32(16), Field::u64(24), Field::u64(32)];
    let mut total = 0u64;
    let mut data = Vec::new();
    for _ in 0..rng.random_range(0..4) {
        // Each block is the one block of the snapshot of a small store.
        let mut s = Store::new(dim, metric, 1 << 20, 1 << 20);
        let n = rng.random_range(1..=4);
        let meta = random_items(rng, dim, n, &mut data);
        let it = items(&meta, &data);
        if s.validate_upsert(&it).is_err() {
            continue;
        }
        s.apply_upsert(&it);
        let one = pf::encode_snapshot(&s, gen, seq);
        let end = one.len() - 20;
        let o = b.len();
        f.extend([Field::u32(o), Field::u32(o + 8)]);
        let rows = s.len();
        f.extend((0..rows).map(|j| Field::u32(o + 12 + 32 * rows + 4 * j)));
        b.extend_from_slice(&one[kalos::persist::HEADER_BYTES..end]);
        total += rows as u64;
    }
    let o = b.len();
    let mut body = 0u32.to_le_bytes().to_vec();
    body.extend_from_slice(&total.to_le_bytes());
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    let c = kalos::persist::crc32c_update(kalos::persist::crc32c(&(body.len() as u32).to_le_bytes()), &body);
    b.extend_from_slice(&c.to_le_bytes());
    b.extend_from_slice(&body);
    f.extend([Field::u32(o), Field::u32(o + 8), Field::u64(o + 12)]);
    (b, f)
}

/// Input: metric u8, dim u16, salvage u8, then a snapshot file (mutated, its checksums mostly
/// recomputed).
pub fn gen_snapshot(rng: &mut StdRng) -> Vec<u8> {
    let dim = rng.random_range(1..=6);
    let metric = metric_of(rng.random());
    let (gen, seq) = (rng.random_range(0..4), random_seq(rng));
    let (snap, fields) = valid_snapshot(rng, dim, metric, gen, seq);
    let mut b = vec![metric as u8];
    b.extend_from_slice(&(dim as u16).to_le_bytes());
    b.push(rng.random_range(0..2));
    b.extend_from_slice(&snap);
    let fields: Vec<Field> = fields.iter().map(|f| Field { off: f.off + 4, width: f.width }).collect();
    let mut b = mutated_or_random(rng, b, &fields, 4, 1 << 16);
    if rng.random_range(0..5) > 0 {
        mutate::reseal(&mut b[4..], kalos::persist::HEADER_BYTES);
    }
    b
}

/// A row's columns besides its vector: id, namespace, created, expires, payload.
type Row = (u64, u64, u64, u64, Option<Vec<u8>>);

fn table(s: &Store) -> Vec<Row> {
    (0..s.len())
        .map(|r| (s.ids()[r], s.namespaces()[r], s.created_ms()[r], s.expires_ms()[r], s.payload_at(r).map(<[u8]>::to_vec)))
        .collect()
}

/// A snapshot loaded as recovery (or repair) loads it: no panic; an accepted snapshot is the
/// whole file, and the table it gives is written and loaded back unchanged.
pub fn check_snapshot(input: &[u8]) {
    if input.len() < 4 {
        return;
    }
    let (metric, dim, salvage) = (metric_of(input[0]), u16_at(input, 1), input[3] & 1 == 1);
    let b = &input[4..];
    let _ = pf::decode_header(b, false);
    let mut store = Store::new(dim, metric, 1 << 20, 1 << 20);
    let loaded = pf::load_snapshot(b, &mut store, salvage);
    parsed();
    let Ok(l) = loaded else { return };
    assert!(store.len() as u64 <= l.rows);
    if !salvage {
        assert_eq!(l.size, b.len() as u64, "an accepted snapshot ends with its end block");
        assert!(l.notes.is_empty());
    }
    // The table loaded is written as a snapshot again and loads back unchanged (for ip and l2
    // bit for bit; cosine stores keep vectors normalised, so only the other columns compare).
    let (gen, seq) = (l.header.generation, l.header.seq);
    let again = pf::encode_snapshot(&store, gen, seq);
    let mut s2 = Store::new(dim, metric, 1 << 20, 1 << 20);
    let l2 = pf::load_snapshot(&again, &mut s2, false).unwrap_or_else(|e| panic!("a re-written snapshot loads: {e}"));
    assert_eq!(l2.rows, store.len() as u64);
    assert_eq!(table(&s2), table(&store));
    if metric != Metric::Cosine {
        assert_eq!(s2.vectors(), store.vectors());
        assert_eq!(pf::encode_snapshot(&s2, gen, seq), again);
    }
}

// ---------------------------------------------------------------------------------------------
// Data directories (Persist::open, repair, dir_shape on files).

/// Input: metric u8, dim u16, then files: name length u8, name, length u32, bytes.
pub fn gen_dir(rng: &mut StdRng) -> Vec<u8> {
    let dim = rng.random_range(1..=4);
    let metric = metric_of(rng.random());
    let g = rng.random_range(0..3u64);
    let seq = if rng.random_range(0..8) == 0 { random_seq(rng) } else { rng.random_range(0..100) };
    let mut files: Vec<(String, Vec<u8>, Vec<Field>)> = Vec::new();
    let snap_name = |g: u64| format!("snap-{g:016x}.snap");
    let wal_name = |g: u64| format!("wal-{g:016x}.wal");
    // A consistent directory: a log alone, a snapshot and its log, a snapshot and a log chain
    // (a background snapshot not finished), or a chain without a snapshot (the first one).
    let scenario = rng.random_range(0..4);
    let n1 = rng.random_range(0..4);
    let (log1, f1) = valid_log(rng, dim, metric, g, seq, n1);
    match scenario {
        0 => {
            let (log, f) = valid_log(rng, dim, metric, 0, 0, n1);
            files.push((wal_name(0), log, f));
        }
        1 | 2 if g > 0 => {
            let (snap, f) = valid_snapshot(rng, dim, metric, g, seq);
            files.push((snap_name(g), snap, f));
            files.push((wal_name(g), log1, f1));
            if scenario == 2 {
                let n2 = rng.random_range(0..3);
                let (log2, f2) = valid_log(rng, dim, metric, g + 1, seq.wrapping_add(n1 as u64), n2);
                files.push((wal_name(g + 1), log2, f2));
            }
        }
        _ => {
            let (log0, f0) = valid_log(rng, dim, metric, 0, 0, n1);
            let n2 = rng.random_range(0..3);
            let (log2, f2) = valid_log(rng, dim, metric, 1, n1 as u64, n2);
            files.push((wal_name(0), log0, f0));
            files.push((wal_name(1), log2, f2));
        }
    }
    // Damage: one or two files mutated (checksums mostly recomputed), a file dropped, an odd
    // name, a leftover temporary file.
    for _ in 0..rng.random_range(1..=2) {
        let i = rng.random_range(0..files.len());
        let m = mutate::mutate(rng, &files[i].1, &files[i].2, 0, 1 << 16);
        files[i].1 = m;
        if rng.random_range(0..5) > 0 {
            mutate::reseal(&mut files[i].1, kalos::persist::HEADER_BYTES);
        }
    }
    match rng.random_range(0..12) {
        0 if files.len() > 1 => {
            files.remove(rng.random_range(0..files.len()));
        }
        1 => files.push((format!("{}.tmp", snap_name(g + 1)), mutate::bytes(rng, 100), Vec::new())),
        2 => files.push((wal_name(g + 3), Vec::new(), Vec::new())),
        3 => {
            let i = rng.random_range(0..files.len());
            let name = if files[i].0.starts_with("wal") { wal_name(rng.random_range(0..5)) } else { snap_name(rng.random_range(0..5)) };
            files[i].0 = name;
        }
        _ => {}
    }
    let mut b = vec![metric as u8];
    b.extend_from_slice(&(dim as u16).to_le_bytes());
    for (name, bytes, _) in files {
        b.push(name.len() as u8);
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        b.extend_from_slice(&bytes);
    }
    b
}

/// Counts of what happened to data directories, for the run's summary.
#[derive(Debug, Default)]
pub struct DirStats {
    pub opened: u64,
    pub refused: u64,
    pub corrupt: u64,
    pub repaired: u64,
    pub repair_refused: u64,
}

/// The directory `dir` holding the files of `input` (emptied first). It is made 0700, as a data
/// directory must be (any wider mode is refused as PERMISSION_DENIED before a file is read).
fn lay_out(dir: &Path, input: &[u8]) -> Option<(usize, Metric)> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if input.len() < 3 {
        return None;
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (metric, dim) = (metric_of(input[0]), u16_at(input, 1));
    let mut o = 3;
    while o < input.len() {
        let nl = input[o] as usize;
        if o + 1 + nl + 4 > input.len() {
            break;
        }
        let name = String::from_utf8_lossy(&input[o + 1..o + 1 + nl]).replace(['/', '\0'], "_");
        let len = (u32_at(input, o + 1 + nl) as usize).min(input.len() - (o + 5 + nl));
        let bytes = &input[o + 5 + nl..o + 5 + nl + len];
        // A name the file system refuses (too long, say) is left out.
        if !name.is_empty() && name != "." && name != ".." {
            let _ = std::fs::write(dir.join(name), bytes);
        }
        o += 5 + nl + len;
    }
    Some((dim, metric))
}

fn open(dir: &Path, dim: usize, metric: Metric) -> kalos::Result<(Persist, kalos::persist::Recovery, Store)> {
    let mut store = Store::new(dim, metric, u32::MAX as usize, u32::MAX as usize);
    let opts = PersistOptions { sync: SyncPolicy::Never, sync_interval_ms: 1000 };
    Persist::open(dir, dim, metric, &opts, &mut store).map(|(p, r)| (p, r, store))
}

/// A data directory opened as a server opens it, and repaired as `kalosd repair` repairs it: no
/// panic; a directory that opens opens again to the same table with no torn tail left; a
/// directory refused as corrupt is either refused by repair or repaired, and a repaired
/// directory opens. The directory is ours, 0700, and holds regular files only: it is never
/// refused as PERMISSION_DENIED (which would leave every case untested).
pub fn check_dir(dir: &Path, input: &[u8], stats: &mut DirStats) {
    let Some((dim, metric)) = lay_out(dir, input) else { return };
    if let Err(e) = kalos::persist::dir_shape(dir) {
        assert_ne!(e.status, Status::PermissionDenied, "dir_shape refused the laid-out directory: {e}");
    }
    match open(dir, dim, metric) {
        Ok((p, _, store)) => {
            stats.opened += 1;
            let rows = table(&store);
            drop(p);
            let (_, rec, again) = open(dir, dim, metric).unwrap_or_else(|e| panic!("a directory that opened opens again: {e}"));
            assert!(rec.torn_tail.is_none(), "the first open truncated the torn tail: {:?}", rec.torn_tail);
            assert_eq!(table(&again), rows, "a directory reopens to the same table");
        }
        Err(e) if e.status == Status::Corrupt => {
            stats.corrupt += 1;
            match kalos::persist::repair(dir) {
                Ok(rep) => {
                    stats.repaired += 1;
                    assert!(
                        rep.backup.is_some(),
                        "open refused the directory as corrupt ({e}), repair found nothing to repair: {:?}",
                        rep.notes
                    );
                    let (shape_dim, shape_metric) = kalos::persist::dir_shape(dir).unwrap().expect("a repaired directory has a shape");
                    if let Err(e2) = open(dir, shape_dim, shape_metric) {
                        panic!("a repaired directory opens; after {e} and repair notes {:?}: {e2}", rep.notes);
                    }
                }
                Err(_) => stats.repair_refused += 1,
            }
        }
        Err(e) => {
            assert_ne!(e.status, Status::PermissionDenied, "open refused the laid-out directory: {e}");
            stats.refused += 1;
        }
    }
}

/// The directory a data-directory case is laid out in: under /dev/shm when it exists (tmpfs:
/// the fsyncs of open and repair cost nothing there), else the temporary directory.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    base.join(format!("kalos-fuzz-{tag}-{}", std::process::id()))
}

// ---------------------------------------------------------------------------------------------
// .npy files (kalosd import, serve --load).

/// Input: a .npy file.
pub fn gen_npy(rng: &mut StdRng) -> Vec<u8> {
    let dir = scratch_dir("npy-gen");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{}.npy", rng.next_u64()));
    let n = rng.random_range(0..4usize);
    match rng.random_range(0..3) {
        0 => kalos::npy::write_f32(&p, &[n, 3], &mutate::vector(rng, 3 * n)).unwrap(),
        1 => kalos::npy::write_f16(&p, &[n, 2], &mutate::vector(rng, 2 * n)).unwrap(),
        _ => kalos::npy::write_u64(&p, &(0..n as u64).collect::<Vec<_>>()).unwrap(),
    }
    let base = std::fs::read(&p).unwrap();
    let _ = std::fs::remove_file(&p);
    // The shape's digits are what a parser of the header trusts: give them the most mutations.
    let mut b = mutated_or_random(rng, base, &[Field::u32(8)], 0, 1 << 16);
    if rng.random_range(0..3) == 0 {
        if let Some(i) = b.windows(9).position(|w| w == b"'shape': ") {
            let dims: Vec<String> = (0..rng.random_range(1..=3))
                .map(|_| match rng.random_range(0..4) {
                    0 => u64::MAX.to_string(),
                    1 => (1u64 << rng.random_range(30..64)).to_string(),
                    2 => "99999999999999999999999".into(),
                    _ => rng.random_range(0..5).to_string(),
                })
                .collect();
            let end = b[i..].iter().position(|&c| c == b')').map_or(b.len(), |e| i + e + 1);
            let shape = format!("'shape': ({},)", dims.join(", "));
            b.splice(i..end, shape.into_bytes());
        }
    }
    b
}

/// The .npy parser: no panic, and an accepted array holds exactly the values its shape says.
pub fn check_npy(input: &[u8]) {
    if let Ok(a) = kalos::npy::parse(input) {
        let n = a.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).expect("an accepted shape's element count fits usize");
        let len = match &a.data {
            kalos::npy::NpyData::F32(v) => v.len(),
            kalos::npy::NpyData::U64(v) => v.len(),
        };
        assert_eq!(len, n, "an accepted array holds shape {:?}'s values", a.shape);
    }
}

// ---------------------------------------------------------------------------------------------
// Requests through a server: what only the server parses (a recall's filter, recency, query
// bytes against the store's dimension, an upsert against the store), by a hostile client
// writing into a slot.

/// In-process servers of three metrics and dimensions, small slots, a small capacity (so that
/// STORE_FULL is reached), and a segment attached to each for raw slot access.
pub struct Servers {
    list: Vec<(kalos::Kalos, kalos::shm::Segment, usize)>,
}

impl Servers {
    pub fn start(tag: &str) -> Servers {
        let list = [(5u32, Metric::Cosine), (3, Metric::L2), (4, Metric::InnerProduct)]
            .into_iter()
            .enumerate()
            .map(|(i, (dim, metric))| {
                let name = format!("fuzz-{tag}-{}-{i}", std::process::id());
                let o = kalos::Options {
                    role: kalos::Role::Server,
                    dim,
                    metric,
                    backend: kalos::Backend::Cpu,
                    slots: 4,
                    slot_bytes: 8192,
                    max_payload_bytes: 512,
                    capacity: 64,
                    ..kalos::Options::default()
                };
                let k = kalos::Kalos::open(&name, &o).unwrap();
                (k, kalos::shm::Segment::attach(&name).unwrap(), dim as usize)
            })
            .collect();
        Servers { list }
    }

    /// Every server still answers every kind of call correctly.
    pub fn check_healthy(&self) {
        for (k, _, dim) in &self.list {
            let v = vec![0.5f32; *dim];
            k.upsert(&[1_000_001], &v, &kalos::UpsertOptions::default()).unwrap_or_else(|e| {
                assert_eq!(e.status, Status::StoreFull);
                k.clear().unwrap();
                k.upsert(&[1_000_001], &v, &kalos::UpsertOptions::default()).unwrap();
            });
            let hits = k.recall(&v, 64, &kalos::RecallOptions::default()).unwrap();
            assert!(hits.iter().any(|h| h.id == 1_000_001));
            assert_eq!(k.get(&[1_000_001]).unwrap()[0].vector, v);
            let st = k.stats().unwrap();
            assert!(st.count >= 1 && st.engine_fallbacks == 0);
        }
    }
}

/// Input: server u8, claimed request length u32, then the request written into the slot.
pub fn gen_server(rng: &mut StdRng) -> Vec<u8> {
    let which = rng.random_range(0..3u8);
    let dim = [5, 3, 4][which as usize];
    let (req, fields) = valid_request(rng, dim);
    let mut b = vec![which];
    b.extend_from_slice(&(req.len() as u32).to_le_bytes());
    b.extend_from_slice(&req);
    let fields: Vec<Field> = fields.iter().map(|f| Field { off: f.off + 5, width: f.width }).collect();
    let mut b = mutated_or_random(rng, b, &fields, 5, 5 + 8192);
    // The length the slot header claims: mostly the truth, sometimes a lie.
    let len = b.len() as u64 - 5;
    let claimed = if rng.random_range(0..5) > 0 { len } else { mutate::interesting(rng, 4, len, b.len()) };
    b[1..5].copy_from_slice(&(claimed as u32).to_le_bytes());
    b
}

/// One raw request to a server: it answers (within 10 s) with a known status, never PANIC or
/// INTERNAL, and an OK answer is one the client's parsers accept.
pub fn check_server(servers: &Servers, input: &[u8]) {
    if input.len() < 5 {
        return;
    }
    let (_, seg, _) = &servers.list[input[0] as usize % servers.list.len()];
    let claimed = u32_at(input, 1);
    let req = &input[5..input.len().min(5 + seg.data_bytes())];
    let (st, body) = raw_slot::raw_call(seg, 0, req, claimed);
    let status = Status::ALL.get(st as usize).copied().unwrap_or_else(|| panic!("unknown status {st}"));
    assert!(!matches!(status, Status::Panic | Status::Internal), "{status:?}: {}", String::from_utf8_lossy(&body));
    if status != Status::Ok || claimed as usize != req.len() {
        return;
    }
    let body_req = request::body_of(req);
    match request::op_of(req) {
        kalos::wire::OP_RECALL => {
            let h = RecallHead::decode(&mut Reader::new(body_req)).expect("an answered recall has a valid header");
            if h.flags & request::FLAG_PAYLOADS != 0 {
                if h.nq == 1 {
                    assert!(response::read_recall_payloads(&body).unwrap().len() <= h.k);
                }
            } else {
                let (mut ids, mut scores, mut counts) = (vec![0u64; h.nq * h.k], vec![0f32; h.nq * h.k], vec![0usize; h.nq]);
                response::read_recall_batch(&body, h.nq, h.k, &mut ids, &mut scores, &mut counts).expect("a recall answer parses");
                assert!(scores.iter().all(|s| s.is_finite()), "scores are finite");
            }
        }
        kalos::wire::OP_GET => {
            let ids = request::decode_ids(body_req).unwrap();
            let dim = servers.list[input[0] as usize % servers.list.len()].2;
            let mut r = Reader::new(&body);
            for &id in &ids {
                response::read_record(&mut r, id, dim).expect("a GET answer parses");
            }
        }
        kalos::wire::OP_STATS => {
            kalos::Stats::decode(&mut Reader::new(&body)).expect("a STATS answer parses");
        }
        kalos::wire::OP_DELETE | kalos::wire::OP_DELETE_NS | kalos::wire::OP_CLEAR => {
            response::read_deleted(&body).expect("a delete answer parses");
        }
        kalos::wire::OP_LIST => {
            let req = request::ListRequest::decode(body_req).expect("an answered list is a valid request");
            let mut ids = vec![0u64; req.limit];
            let (n, _) = response::read_list(&body, &mut ids).expect("a LIST answer parses");
            assert!(ids[..n].windows(2).all(|w| w[0] < w[1]), "listed ids ascend");
            assert!(req.after.is_none_or(|a| ids[..n].iter().all(|&i| i > a)), "listed ids follow the cursor");
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Segment headers (shm: the validation of a mapped segment on attach).

/// Bytes of the segment header that a case sets (the rest of the header page is zero).
const SEG_HEADER: usize = 256;

fn header_fields() -> Vec<Field> {
    use kalos::shm::Header;
    use std::mem::offset_of;
    let w4 = [
        offset_of!(Header, layout_version),
        offset_of!(Header, header_bytes),
        offset_of!(Header, slot_count),
        offset_of!(Header, slot_stride),
        offset_of!(Header, slot_data_bytes),
        offset_of!(Header, dim),
        offset_of!(Header, metric),
        offset_of!(Header, dtype),
        offset_of!(Header, max_k),
        offset_of!(Header, max_payload),
        offset_of!(Header, owner_uid),
        offset_of!(Header, server_pid),
        offset_of!(Header, server_state),
    ];
    let w8 =
        [offset_of!(Header, magic), offset_of!(Header, total_bytes), offset_of!(Header, capacity), offset_of!(Header, server_start_ticks)];
    w4.iter().map(|&o| Field::u32(o)).chain(w8.iter().map(|&o| Field::u64(o))).collect()
}

/// Input: the segment's size u32, then the first SEG_HEADER bytes of its header page.
pub fn gen_segment(rng: &mut StdRng) -> Vec<u8> {
    use kalos::shm::{Geometry, Header, Segment};
    use std::mem::offset_of;
    let g = Geometry {
        slot_count: rng.random_range(1..=4),
        slot_data_bytes: if rng.random() { 4096 } else { rng.random_range(4096..12288) },
        dim: rng.random_range(1..=1024),
        metric: rng.random_range(0..3),
        dtype: rng.random_range(0..3),
        max_k: kalos::MAX_K as u32,
        max_payload: rng.random_range(0..4096),
        capacity: rng.random_range(1..1 << 20),
    };
    // The header as the server writes it.
    let name = format!("fuzz-seed-{}", std::process::id());
    let seg = Segment::create(&name, &g, 0o600, rng.random()).unwrap();
    let (base, _) = seg.region();
    // SAFETY: the mapping is at least one header page long and lives until `seg` is dropped.
    let page = unsafe { std::slice::from_raw_parts(base, SEG_HEADER) }.to_vec();
    seg.unlink();
    drop(seg);
    let mut b = (g.total_bytes() as u32).to_le_bytes().to_vec();
    b.extend_from_slice(&page);
    let mut fields: Vec<Field> = header_fields().iter().map(|f| Field { off: f.off + 4, width: f.width }).collect();
    fields.push(Field::u32(0));
    let mut b = mutate::mutate(rng, &b, &fields, 0, 4 + SEG_HEADER);
    b.resize(4 + SEG_HEADER, 0);
    // Often make the sizes agree with the (mutated) geometry, so that the checks after them run.
    if rng.random_range(0..3) == 0 {
        let at = |f: usize| 4 + f;
        let count = u32_at(&b, at(offset_of!(Header, slot_count))) as u64;
        let data = u32_at(&b, at(offset_of!(Header, slot_data_bytes))) as u64;
        let stride = 64 + data.div_ceil(64) * 64;
        // Checked: a mutated count times a mutated stride can pass 2^64.
        if let Some(total) = count.checked_mul(stride).and_then(|t| t.checked_add(4096)).filter(|&t| t <= 1 << 22) {
            b[at(offset_of!(Header, slot_stride))..][..4].copy_from_slice(&(stride as u32).to_le_bytes());
            b[at(offset_of!(Header, total_bytes))..][..8].copy_from_slice(&total.to_le_bytes());
            b[..4].copy_from_slice(&(total as u32).to_le_bytes());
        }
    }
    b
}

/// A segment file under /dev/shm with a name of its own, removed on drop.
pub struct FakeSegment {
    pub name: String,
    path: PathBuf,
}

impl FakeSegment {
    pub fn new(tag: &str) -> FakeSegment {
        let name = format!("fuzz-{tag}-{}", std::process::id());
        let path = PathBuf::from(format!("/dev/shm/kalos.{name}"));
        FakeSegment { name, path }
    }
}

impl FakeSegment {
    /// Removes the segment file.
    pub fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for FakeSegment {
    fn drop(&mut self) {
        self.remove();
    }
}

/// A segment of the input's size holding the input's header, attached as a client attaches: no
/// panic, no fault; an accepted segment passed every documented check, and every slot lies
/// inside the mapping.
pub fn check_segment(fake: &FakeSegment, input: &[u8]) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if input.len() < 4 {
        return;
    }
    let size = (u32_at(input, 0) as usize).min(1 << 22);
    let head = &input[4..];
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&fake.path).unwrap();
    f.write_all(&head[..head.len().min(size)]).unwrap();
    f.set_len(size as u64).unwrap();
    drop(f);
    let Ok(seg) = kalos::shm::Segment::attach(&fake.name) else { return };
    let h = seg.header();
    let (base, len) = seg.region();
    assert_eq!(len, size);
    assert_eq!(h.header_bytes, 4096);
    assert_eq!(h.total_bytes as usize, size);
    assert!((1..=4096).contains(&h.slot_count));
    assert!(h.slot_data_bytes >= 4096 && (1..=65536).contains(&h.dim) && h.metric <= 2 && h.dtype <= 2);
    assert_eq!(h.max_k as usize, kalos::MAX_K);
    // SAFETY: geteuid has no preconditions.
    assert_eq!(h.owner_uid, unsafe { libc::geteuid() });
    let end = base as usize + len;
    for i in [0, seg.slot_count() - 1] {
        let s = seg.slot(i) as *const kalos::shm::SlotHeader as usize;
        assert!(s >= base as usize + 4096 && s + 64 <= end);
        assert!(seg.slot_data(i) as usize + seg.data_bytes() <= end, "slot {i}'s data area lies inside the mapping");
        let mut buf = Vec::new();
        seg.read_data(i, &mut buf, usize::MAX);
        assert_eq!(buf.len(), seg.data_bytes());
    }
    let _ = seg.server_alive();
}
