//! The other calls: upsert (split into as many requests as the slot size needs), delete, delete a
//! namespace, clear, get, list and stats.

use super::{Kalos, ListOptions, Namespaces, UpsertOptions};
use crate::error::{Error, Result, Status};
use crate::store::{Record, NEVER};
use crate::types::{check_finite, now_unix_ms};
use crate::wire::request::{self, upsert_item_bytes, HEAD_RESERVE};
use crate::wire::response::{list_fit, read_deleted, read_list, read_record, record_bytes};
use crate::wire::{Reader, Stats, Writer};

impl Kalos {
    /// A DELETE, DELETE_NS, DELETE_WHERE or CLEAR response: the count, and in cluster mode the
    /// write token after it.
    fn read_write_reply(&self, r: &[u8]) -> Result<u64> {
        let n = read_deleted(r)?;
        self.note_token(r, 8)?;
        Ok(n)
    }

    /// Inserts or replaces memories. `vectors` is `ids.len() * dim` values. Within one call a
    /// repeated id is applied in order, so the last occurrence wins. A call too large for one
    /// slot is split into several requests, each applied atomically in order.
    pub fn upsert(&self, ids: &[u64], vectors: &[f32], opts: &UpsertOptions<'_>) -> Result<()> {
        let n = ids.len();
        if n == 0 {
            return Ok(());
        }
        if vectors.len() != n * self.dim {
            return Err(Error::new(
                Status::DimensionMismatch,
                format!("{n} ids need {} vector values of dimension {}, got {}", n * self.dim, self.dim, vectors.len()),
            ));
        }
        check_finite(vectors, "vectors")?;
        if let Namespaces::PerItem(ns) = opts.namespaces {
            if ns.len() != n {
                return Err(Error::new(Status::InvalidArgument, format!("{} namespaces for {n} ids", ns.len())));
            }
        }
        let maxp = self.max_payload_bytes();
        if let Some(p) = &opts.payloads {
            if p.len() != n {
                return Err(Error::new(Status::InvalidArgument, format!("{} payloads for {n} ids", p.len())));
            }
            for (i, pl) in p.iter().enumerate() {
                if let Some(b) = pl {
                    if b.len() > maxp {
                        return Err(Error::new(
                            Status::PayloadTooLarge,
                            format!("payload of id {} is {} bytes; the limit is {maxp}", ids[i], b.len()),
                        ));
                    }
                }
            }
        }
        if let Some(f) = opts.fields {
            if f.len() != n {
                return Err(Error::new(Status::InvalidArgument, format!("{} field lists for {n} ids", f.len())));
            }
            for (i, fl) in f.iter().enumerate() {
                crate::meta::check_item_fields(fl, ids[i])?;
            }
        }
        if opts.expires_ms != NEVER && opts.expires_ms <= now_unix_ms() {
            return Err(Error::new(Status::InvalidArgument, format!("expiry {} (unix ms) is in the past", opts.expires_ms)));
        }
        let cap = self.seg.data_bytes().saturating_sub(HEAD_RESERVE);
        let item_fixed = upsert_item_bytes(self.dim);
        let mut i0 = 0;
        while i0 < n {
            // Grow the chunk while it fits.
            let mut size = 0usize;
            let mut i1 = i0;
            while i1 < n {
                let p = opts.payloads.as_ref().and_then(|p| p[i1]).map_or(0, |b| b.len())
                    + opts.fields.map_or(0, |f| request::fields_section_bytes(Some(&f[i1..i1 + 1])));
                if i1 > i0 && size + item_fixed + p > cap {
                    break;
                }
                size += item_fixed + p;
                i1 += 1;
            }
            if size > cap {
                return Err(Error::new(
                    Status::TooLarge,
                    format!("one memory of {size} bytes does not fit in the slot size of {} bytes", self.seg.data_bytes()),
                ));
            }
            let namespaces = match opts.namespaces {
                Namespaces::One(ns) => Namespaces::One(ns),
                Namespaces::PerItem(ns) => Namespaces::PerItem(&ns[i0..i1]),
            };
            let payloads = opts.payloads.as_ref().map(|p| &p[i0..i1]);
            let mut w = Writer::new();
            request::upsert(
                &mut w,
                namespaces,
                opts.ttl_ms,
                opts.expires_ms,
                &ids[i0..i1],
                &vectors[i0 * self.dim..i1 * self.dim],
                payloads,
                opts.fields.map(|f| &f[i0..i1]),
            );
            self.call(&w.buf, opts.timeout_ms, |r| self.note_token(r, 0))?;
            i0 = i1;
        }
        Ok(())
    }

    /// Deletes ids, all or nothing: if any id is unknown nothing is deleted and the error
    /// (`NotFound`) names it. Returns the number deleted.
    pub fn delete(&self, ids: &[u64]) -> Result<u64> {
        self.delete_timeout(ids, None)
    }

    pub fn delete_timeout(&self, ids: &[u64], timeout_ms: Option<u64>) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut w = Writer::new();
        request::delete(&mut w, ids);
        self.call(&w.buf, timeout_ms, |r| self.read_write_reply(r))
    }

    /// Deletes every memory of namespace `ns`; returns how many.
    pub fn delete_namespace(&self, ns: u64) -> Result<u64> {
        let mut w = Writer::new();
        request::delete_namespace(&mut w, ns);
        self.call(&w.buf, None, |r| self.read_write_reply(r))
    }

    /// Deletes every memory that matches the metadata filter expression `filter` (binary form)
    /// and, when given, one of `namespaces`; returns how many. The server evaluates the filter,
    /// so every process sees the same result.
    pub fn delete_where(&self, namespaces: Option<&[u64]>, filter: &[u8]) -> Result<u64> {
        crate::filter::Expr::decode(filter)?;
        if let Some(ns) = namespaces {
            crate::types::Filter::new(ns)?;
        }
        let mut w = Writer::new();
        request::delete_where(&mut w, namespaces, filter);
        if w.len() + HEAD_RESERVE > self.seg.data_bytes() {
            return Err(Error::new(Status::TooLarge, format!("a filter of {} bytes does not fit the slot size", filter.len())));
        }
        self.call(&w.buf, None, |r| self.read_write_reply(r))
    }

    /// Deletes every memory; returns how many.
    pub fn clear(&self) -> Result<u64> {
        let mut w = Writer::new();
        request::clear(&mut w);
        self.call(&w.buf, None, |r| self.read_write_reply(r))
    }

    /// Fetches memories by id. An unknown id fails the call with `NotFound` naming it.
    pub fn get(&self, ids: &[u64]) -> Result<Vec<Record>> {
        let mut out = Vec::with_capacity(ids.len());
        let per = record_bytes(self.dim, self.max_payload_bytes()) + crate::meta::MAX_ITEM_FIELD_BYTES;
        let chunk = (self.seg.data_bytes() / per).max(1);
        for part in ids.chunks(chunk) {
            let mut w = Writer::new();
            request::get(&mut w, part);
            let dim = self.dim;
            self.call(&w.buf, None, |resp| {
                let mut r = Reader::new(resp);
                for &id in part {
                    out.push(read_record(&mut r, id, dim)?);
                }
                Ok(())
            })?;
        }
        Ok(out)
    }

    /// Lists the ids of the live memories that `opts` selects, in ascending order: at most
    /// `limit` of them, and how many more match after the last one returned. The listing is
    /// complete when fewer than `limit` come back, or when none remain; the next page starts
    /// after the last id returned. `limit` 0 counts the matches only; `usize::MAX` lists them
    /// all.
    ///
    /// A page larger than one slot's reply is fetched with several requests. Writes between
    /// requests are seen as they happen: a memory that lives and matches throughout is listed
    /// exactly once, and no id is listed twice.
    pub fn list(&self, opts: &ListOptions, limit: usize) -> Result<(Vec<u64>, u64)> {
        let filter = opts.filter.as_deref();
        if let Some(f) = filter {
            crate::filter::Expr::decode(f)?;
        }
        if let Some(ns) = &opts.namespaces {
            crate::types::Filter::new(ns)?;
        }
        let fit = list_fit(self.seg.data_bytes());
        let mut after = opts.after;
        let mut ids = Vec::new();
        loop {
            let want = (limit - ids.len()).min(fit);
            let mut w = Writer::new();
            request::list(&mut w, opts.namespaces.as_deref(), filter, after, want as u32);
            if w.len() > self.seg.data_bytes() {
                return Err(Error::new(Status::TooLarge, format!("a list request of {} bytes does not fit the slot size", w.len())));
            }
            let start = ids.len();
            ids.resize(start + want, 0);
            let (got, remaining) = self.call(&w.buf, opts.timeout_ms, |resp| read_list(resp, &mut ids[start..]))?;
            ids.truncate(start + got);
            if got < want || remaining == 0 || ids.len() == limit {
                return Ok((ids, remaining));
            }
            after = ids.last().copied();
        }
    }

    /// Every id that `opts` selects, ascending ([`Kalos::list`] without a limit).
    pub fn list_all(&self, opts: &ListOptions) -> Result<Vec<u64>> {
        Ok(self.list(opts, usize::MAX)?.0)
    }

    pub fn stats(&self) -> Result<Stats> {
        let mut w = Writer::new();
        request::stats(&mut w);
        self.call(&w.buf, None, |resp| Stats::decode(&mut Reader::new(resp)))
    }
}
