//! The recall calls: one query (into caller buffers or as a vector of hits), one query with
//! payloads, and batches split into as few requests as the slot size allows.

use std::cell::RefCell;

use super::slot::Finite;
use super::{Kalos, Lag, PayloadHit, RecallOptions};
use crate::error::{Error, Result, Status};
use crate::types::{check_finite, check_k, Hit, MAX_FILTER_NAMESPACES, MAX_K};
use crate::wire::cluster::{split_lag, ClusterRecall, MAX_SHARDS};
use crate::wire::request::{filter_bytes, recall_head, vector_bytes, HEAD_RESERVE};
use crate::wire::response::{read_recall_batch, read_recall_one, read_recall_payloads, recall_body_len};
use crate::wire::{f32_bytes, Writer, FLAG_PAYLOADS};

thread_local! {
    static REQ: RefCell<Writer> = RefCell::new(Writer::new());
}

impl Kalos {
    fn check_query(&self, q: &[f32], what: &str) -> Result<()> {
        if q.len() != self.dim {
            return Err(Error::new(
                Status::DimensionMismatch,
                format!("{what} has {} values; the store's dimension is {}", q.len(), self.dim),
            ));
        }
        check_finite(q, what)
    }

    fn check_recall_opts(&self, opts: &RecallOptions) -> Result<()> {
        if let Some(ns) = &opts.namespaces {
            if ns.len() > MAX_FILTER_NAMESPACES {
                return Err(Error::new(
                    Status::InvalidArgument,
                    format!("namespace filter has {} entries; at most {MAX_FILTER_NAMESPACES}", ns.len()),
                ));
            }
        }
        if let Some(f) = &opts.filter {
            crate::filter::Expr::decode(f)?;
        }
        if let Some(s) = &opts.min_seqs {
            if s.len() > MAX_SHARDS {
                return Err(Error::new(Status::InvalidArgument, format!("min_seqs has {} entries; at most {MAX_SHARDS}", s.len())));
            }
        }
        if let Some(r) = opts.recency {
            if !(r.weight.is_finite() && (0.0..=1.0).contains(&r.weight)) {
                return Err(Error::new(Status::InvalidArgument, format!("recency weight {} must be in [0, 1]", r.weight)));
            }
            if !(r.half_life_ms.is_finite() && r.half_life_ms > 0.0) {
                return Err(Error::new(Status::InvalidArgument, format!("recency half-life {} ms must be > 0", r.half_life_ms)));
            }
        }
        Ok(())
    }

    /// The recall request up to its queries, which follow it in the slot (`call_parts`).
    fn write_recall(&self, w: &mut Writer, nq: usize, k: usize, flags: u32, opts: &RecallOptions) {
        w.clear();
        let c = self.cluster_section(opts);
        recall_head(w, k, nq, flags, opts.namespaces.as_deref(), opts.recency, opts.filter.as_deref(), c.as_ref());
    }

    /// The cluster section of a recall with these options (`None` when it asks nothing of the
    /// cluster).
    fn cluster_section(&self, opts: &RecallOptions) -> Option<ClusterRecall> {
        if !opts.read_your_writes && opts.min_seqs.is_none() && !opts.allow_stale {
            return None;
        }
        let mut min_seqs = if opts.read_your_writes { self.write_seqs() } else { Vec::new() };
        for (s, &q) in opts.min_seqs.iter().flatten().enumerate() {
            if min_seqs.len() <= s {
                min_seqs.resize(s + 1, 0);
            }
            min_seqs[s] = min_seqs[s].max(q);
        }
        let wait_ms = opts.timeout_ms.unwrap_or(self.timeout_ms).min(u32::MAX as u64) as u32;
        Some(ClusterRecall { wait_ms, allow_stale: opts.allow_stale, min_seqs })
    }

    /// A recall response of `nq` queries: the body, and the lag trailer of a stale-read recall
    /// (cluster mode; a single host's reply has none).
    fn split_reply<'r>(resp: &'r [u8], opts: &RecallOptions, nq: usize, payloads: bool) -> Result<(&'r [u8], Option<Lag>)> {
        if !opts.allow_stale {
            return Ok((resp, None));
        }
        let (body, lag) = split_lag(resp, nq, payloads)?;
        Ok((body, lag.map(|(entries, ms)| Lag { entries, ms })))
    }

    /// Top-k for one query, written into `ids`/`scores` (each at least `min(k, len)` long);
    /// returns the number of hits.
    pub fn recall_into(&self, query: &[f32], k: usize, opts: &RecallOptions, ids: &mut [u64], scores: &mut [f32]) -> Result<usize> {
        self.recall_lag(query, k, opts, ids, scores).map(|(n, _)| n)
    }

    /// [`Self::recall_into`], also returning how far behind its log the answering replica was
    /// when the recall opted in to stale reads ([`RecallOptions::allow_stale`]).
    pub fn recall_lag(
        &self,
        query: &[f32],
        k: usize,
        opts: &RecallOptions,
        ids: &mut [u64],
        scores: &mut [f32],
    ) -> Result<(usize, Option<Lag>)> {
        check_k(k)?;
        self.check_query(query, "query")?;
        self.check_recall_opts(opts)?;
        REQ.with(|w| {
            let mut w = w.borrow_mut();
            self.write_recall(&mut w, 1, k, 0, opts);
            self.call_parts(&[&w.buf, f32_bytes(query)], None, opts.timeout_ms, |resp| {
                let (body, lag) = Self::split_reply(resp, opts, 1, false)?;
                Ok((read_recall_one(body, k, ids, scores)?, lag))
            })
        })
    }

    /// Top-k for one query.
    pub fn recall(&self, query: &[f32], k: usize, opts: &RecallOptions) -> Result<Vec<Hit>> {
        let mut ids = vec![0u64; k.min(MAX_K)];
        let mut scores = vec![0f32; k.min(MAX_K)];
        let n = self.recall_into(query, k, opts, &mut ids, &mut scores)?;
        Ok(ids[..n].iter().zip(&scores[..n]).map(|(&id, &score)| Hit { id, score }).collect())
    }

    /// Top-k for one query, with each hit's payload.
    pub fn recall_with_payloads(&self, query: &[f32], k: usize, opts: &RecallOptions) -> Result<Vec<PayloadHit>> {
        check_k(k)?;
        self.check_query(query, "query")?;
        self.check_recall_opts(opts)?;
        REQ.with(|w| {
            let mut w = w.borrow_mut();
            self.write_recall(&mut w, 1, k, FLAG_PAYLOADS, opts);
            self.call_parts(&[&w.buf, f32_bytes(query)], None, opts.timeout_ms, |resp| {
                let hits = read_recall_payloads(Self::split_reply(resp, opts, 1, true)?.0)?;
                Ok(hits.into_iter().map(|(h, p)| PayloadHit { id: h.id, score: h.score, payload: p.map(<[u8]>::to_vec) }).collect())
            })
        })
    }

    /// Top-k for `nq` queries (`queries` is `nq * dim`, row-major) in as few requests as the
    /// slot size allows. Writes `k` entries per query into `ids`/`scores` (each ≥ `nq * k`) and
    /// the per-query hit count into `counts` (≥ `nq`).
    #[allow(clippy::too_many_arguments)] // the C ABI's flat argument list, mirrored
    pub fn recall_batch_into(
        &self,
        queries: &[f32],
        nq: usize,
        k: usize,
        opts: &RecallOptions,
        ids: &mut [u64],
        scores: &mut [f32],
        counts: &mut [usize],
    ) -> Result<()> {
        check_k(k)?;
        if nq == 0 {
            return Err(Error::new(Status::InvalidArgument, "a batch needs at least one query"));
        }
        let need = nq.checked_mul(self.dim).ok_or_else(|| Error::new(Status::InvalidArgument, "batch too large"))?;
        if queries.len() != need {
            return Err(Error::new(
                Status::DimensionMismatch,
                format!("batch holds {} values; {nq} queries of dimension {} need {need}", queries.len(), self.dim),
            ));
        }
        if ids.len() < nq * k || scores.len() < nq * k || counts.len() < nq {
            return Err(Error::new(Status::BufferTooSmall, format!("outputs need {} ids/scores and {nq} counts", nq * k)));
        }
        // Finiteness is checked while the queries are copied into the slot (one pass).
        self.check_recall_opts(opts)?;
        // Queries per request: bounded by the request (queries) and the response (k hits each).
        let fixed = HEAD_RESERVE
            + 8 * opts.namespaces.as_ref().map_or(0, |n| n.len())
            + opts.filter.as_ref().map_or(0, |f| filter_bytes(f.len()))
            + self.cluster_section(opts).map_or(0, |c| 12 + 8 * c.min_seqs.len());
        let per_q = vector_bytes(self.dim).max(recall_body_len(1, k));
        let chunk = ((self.seg.data_bytes().saturating_sub(fixed)) / per_q).max(1);
        let mut q0 = 0;
        while q0 < nq {
            let qn = chunk.min(nq - q0);
            REQ.with(|w| {
                let mut w = w.borrow_mut();
                self.write_recall(&mut w, qn, k, 0, opts);
                let qv = &queries[q0 * self.dim..(q0 + qn) * self.dim];
                let floats = Finite { v: qv, what: "batch", base: q0 * self.dim };
                self.call_parts(&[&w.buf], Some(floats), opts.timeout_ms, |resp| {
                    read_recall_batch(
                        Self::split_reply(resp, opts, qn, false)?.0,
                        qn,
                        k,
                        &mut ids[q0 * k..],
                        &mut scores[q0 * k..],
                        &mut counts[q0..],
                    )
                })
            })?;
            q0 += qn;
        }
        Ok(())
    }

    /// Top-k for each of `nq` queries.
    pub fn recall_batch(&self, queries: &[f32], nq: usize, k: usize, opts: &RecallOptions) -> Result<Vec<Vec<Hit>>> {
        let mut ids = vec![0u64; nq * k];
        let mut scores = vec![0f32; nq * k];
        let mut counts = vec![0usize; nq];
        self.recall_batch_into(queries, nq, k, opts, &mut ids, &mut scores, &mut counts)?;
        Ok((0..nq).map(|i| (0..counts[i]).map(|j| Hit { id: ids[i * k + j], score: scores[i * k + j] }).collect()).collect())
    }
}
