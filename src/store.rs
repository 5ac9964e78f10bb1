//! The memory table, owned by the server thread.
//!
//! Column layout (structure of arrays) so that scans read only what they need:
//! `vectors` is one dense row-major `f32` block of `len * dim` values; `ids`, `namespaces`,
//! `created_ms`, `expires_ms` and `payloads` are parallel columns. Deleting swaps the last row
//! into the hole, so the table stays dense and an engine mirror (the GPU copy) only has to
//! re-upload the rows listed in [`Store::take_dirty`].
//!
//! For the cosine metric vectors are stored normalised (the scan is then an inner product) and
//! the original norm is kept in `norms`, so `get` returns the vector the caller wrote (up to
//! rounding). For L2 `norms` holds `|x|²` so the scan is `|q|² − 2q·x + |x|²`.
//!
//! [`Store::take_dirty`]: crate::store::Store::take_dirty

use std::collections::HashMap;

use crate::error::{Error, Result, Status};
use crate::filter::Bitmap;
use crate::meta::{Columns, Field};
use crate::types::{check_finite, scale_to_unit, squared_norm, Filter, Metric};

/// Expiry value meaning "never expires".
pub const NEVER: u64 = u64::MAX;

/// One memory to write.
#[derive(Debug, Clone)]
pub struct UpsertItem<'a> {
    pub id: u64,
    pub namespace: u64,
    /// Raw vector as the caller wrote it (`dim` values).
    pub vector: &'a [f32],
    pub payload: Option<&'a [u8]>,
    pub created_ms: u64,
    /// Unix ms at which the memory expires, or [`NEVER`].
    pub expires_ms: u64,
    /// Typed metadata fields (replace every field the memory had).
    pub fields: &'a [Field],
}

/// What `get` returns for one id.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub id: u64,
    pub namespace: u64,
    pub vector: Vec<f32>,
    pub payload: Option<Vec<u8>>,
    pub created_ms: u64,
    pub expires_ms: u64,
    pub fields: Vec<Field>,
}

/// A growable `f32` buffer in an anonymous memory mapping: its first value starts a page, so
/// with `dim` a multiple of 16 every row of the table starts its own cache line and no 64-byte
/// load of a scan spans two (with `Vec<f32>` a large table starts 16 bytes into a line: malloc's
/// alignment). It grows by `mremap`, which moves page-table entries instead of copying the rows
/// (a `Vec` of over-aligned elements reallocates by allocate-copy-free: about 4 s of the server
/// thread for a 4 GB table, longer than a client waits for a heartbeat once tables reach ~10M
/// rows).
struct LineVec {
    /// Start of the mapping (page-aligned), or dangling when `cap` is 0.
    ptr: std::ptr::NonNull<f32>,
    /// Bytes mapped.
    cap: usize,
    /// Values in use (`len * 4 <= cap`).
    len: usize,
}

// SAFETY: LineVec owns its mapping exclusively (like a Vec owns its buffer); shared references
// only read it.
unsafe impl Send for LineVec {}
// SAFETY: as above: `&LineVec` gives only `&[f32]`.
unsafe impl Sync for LineVec {}

impl Default for LineVec {
    fn default() -> Self {
        LineVec { ptr: std::ptr::NonNull::dangling(), cap: 0, len: 0 }
    }
}

impl Drop for LineVec {
    fn drop(&mut self) {
        if self.cap > 0 {
            // SAFETY: ptr/cap describe the mapping this LineVec created and still owns.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.cap) };
        }
    }
}

impl LineVec {
    fn as_slice(&self) -> &[f32] {
        // SAFETY: the first `len` values lie inside the mapping (or `len` is 0 and the pointer
        // is dangling but aligned); every value was written (the mapping is zero-filled, and
        // `resize` zeroes what it exposes).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`; the borrow of `self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
    /// Grows (new values are 0.0) or shrinks to `n` values.
    fn resize(&mut self, n: usize) {
        if n <= self.len {
            self.len = n;
            return;
        }
        let old = self.len;
        self.reserve(n - old);
        self.len = n;
        self.as_mut_slice()[old..].fill(0.0);
    }
    /// Makes room for `extra` more values: at least doubles the mapping, page-rounded. A failed
    /// mapping is an allocation failure, as for a `Vec`.
    fn reserve(&mut self, extra: usize) {
        let want = (self.len + extra).checked_mul(4).expect("table size overflows usize");
        if want <= self.cap {
            return;
        }
        // Mapped in 64 KiB steps (whole 4 KiB pages).
        let grain = 1usize << 16;
        let new_cap = want.max(self.cap.saturating_mul(2)).max(grain).div_ceil(grain) * grain;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let fresh = || unsafe {
            libc::mmap(std::ptr::null_mut(), new_cap, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        let p = if self.cap == 0 {
            fresh()
        } else if cfg!(kalos_no_mremap) {
            // The ThreadSanitizer build (scripts/sanitize.sh): TSan does not intercept mremap, so
            // a mapping moved onto addresses another thread's table once held would be reported
            // as racing with that thread's old writes. A new mapping, a copy, an unmapping.
            let p = fresh();
            if p != libc::MAP_FAILED {
                // SAFETY: the first `len` values of the old mapping into the new one (at least
                // as large); distinct mappings; then the old mapping, which nothing refers to
                // during this `&mut self` call, is unmapped.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), p.cast::<f32>(), self.len);
                    libc::munmap(self.ptr.as_ptr().cast(), self.cap);
                }
            }
            p
        } else {
            // SAFETY: ptr/cap describe this LineVec's own mapping; MREMAP_MAYMOVE may move it,
            // and no reference into it outlives this `&mut self` call.
            unsafe { libc::mremap(self.ptr.as_ptr().cast(), self.cap, new_cap, libc::MREMAP_MAYMOVE) }
        };
        if p == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(std::alloc::Layout::from_size_align(new_cap, 4096).expect("page layout"));
        }
        self.ptr = std::ptr::NonNull::new(p.cast()).expect("mmap returned null");
        self.cap = new_cap;
        advise_huge_pages(p, new_cap);
    }
}

/// Asks Linux to back a mapping of at least [`HUGE_PAGE_MIN`] bytes with transparent huge pages
/// (`KALOS_HUGE_PAGES`, default on; where the kernel's THP mode is `madvise`, the default of
/// many distributions, only such mappings get them). With 4 KiB pages a scan takes a TLB miss
/// every 4 KiB and a row read at random (re-ranking, gathered filters, `get`) one each, a page
/// walk through tables the caches do not hold (docs/benchmarks/cpu.md, "Huge pages for the
/// table"). Advice only: an error (THP off, an old kernel) is ignored.
fn advise_huge_pages(p: *mut libc::c_void, len: usize) {
    #[cfg(target_os = "linux")]
    if len >= HUGE_PAGE_MIN && crate::config::tuning_or_default().huge_pages {
        // SAFETY: `p..p + len` is this LineVec's own mapping; MADV_HUGEPAGE changes how its
        // pages are backed, never its contents.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, len);
}

/// Smallest table mapping [`advise_huge_pages`] advises (one huge page of x86_64 and arm64).
const HUGE_PAGE_MIN: usize = 2 << 20;

impl std::ops::Deref for LineVec {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for LineVec {
    fn deref_mut(&mut self) -> &mut [f32] {
        self.as_mut_slice()
    }
}

pub struct Store {
    dim: usize,
    metric: Metric,
    capacity: usize,
    max_payload: usize,
    vectors: LineVec,
    /// Cosine: original |x|; L2: |x|² of the stored row; IP: unused (1.0).
    norms: Vec<f32>,
    ids: Vec<u64>,
    namespaces: Vec<u64>,
    created_ms: Vec<u64>,
    expires_ms: Vec<u64>,
    payloads: Vec<Option<Box<[u8]>>>,
    /// Metadata field columns (row r of each is row r of the table).
    fields: Columns,
    index: HashMap<u64, u32>,
    /// Rows whose contents changed since the last `take_dirty`.
    dirty: Vec<u32>,
    /// Number of rows with an expiry (lets the purge skip the common case).
    expiring: usize,
    payload_bytes: usize,
}

impl Store {
    pub fn new(dim: usize, metric: Metric, capacity: usize, max_payload: usize) -> Store {
        Store {
            dim,
            metric,
            capacity,
            max_payload,
            vectors: LineVec::default(),
            norms: Vec::new(),
            ids: Vec::new(),
            namespaces: Vec::new(),
            created_ms: Vec::new(),
            expires_ms: Vec::new(),
            payloads: Vec::new(),
            fields: Columns::default(),
            index: HashMap::new(),
            dirty: Vec::new(),
            expiring: 0,
            payload_bytes: 0,
        }
    }

    pub fn dim(&self) -> usize {
        self.dim
    }
    pub fn metric(&self) -> Metric {
        self.metric
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    /// Row-major `len * dim` stored values (normalised for cosine).
    pub fn vectors(&self) -> &[f32] {
        &self.vectors
    }
    /// Per-row auxiliary norm: `|x|²` for L2, the original `|x|` for cosine, 1 for IP.
    pub fn norms(&self) -> &[f32] {
        &self.norms
    }
    pub fn ids(&self) -> &[u64] {
        &self.ids
    }
    pub fn namespaces(&self) -> &[u64] {
        &self.namespaces
    }
    pub fn created_ms(&self) -> &[u64] {
        &self.created_ms
    }
    pub fn expires_ms(&self) -> &[u64] {
        &self.expires_ms
    }
    /// The metadata field columns.
    pub fn fields(&self) -> &Columns {
        &self.fields
    }
    pub fn payload_bytes(&self) -> usize {
        self.payload_bytes
    }
    /// True when some row has an expiry (engines may skip the expiry check otherwise).
    pub fn has_expiring(&self) -> bool {
        self.expiring > 0
    }
    pub fn row_of(&self, id: u64) -> Option<usize> {
        self.index.get(&id).map(|&r| r as usize)
    }
    pub fn payload_at(&self, row: usize) -> Option<&[u8]> {
        self.payloads[row].as_deref()
    }
    /// Rows changed since the last call (may hold rows ≥ `len()` after deletes; skip those).
    pub fn take_dirty(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.dirty)
    }

    /// Checks a whole batch without changing anything: dimension, finiteness, payload size and
    /// capacity (counting ids already present as replacements; duplicates in the batch count once).
    pub fn validate_upsert(&self, items: &[UpsertItem<'_>]) -> Result<()> {
        let mut new_ids = std::collections::HashSet::new();
        for (i, it) in items.iter().enumerate() {
            if it.vector.len() != self.dim {
                return Err(Error::new(
                    Status::DimensionMismatch,
                    format!("item {i} (id {}) has {} values; the store's dimension is {}", it.id, it.vector.len(), self.dim),
                ));
            }
            check_finite(it.vector, &format!("vector of id {}", it.id))?;
            if let Some(p) = it.payload {
                if p.len() > self.max_payload {
                    return Err(Error::new(
                        Status::PayloadTooLarge,
                        format!("payload of id {} is {} bytes; the limit is {}", it.id, p.len(), self.max_payload),
                    ));
                }
            }
            if self.metric == Metric::Cosine && it.vector.iter().all(|&x| x == 0.0) {
                return Err(Error::new(
                    Status::InvalidArgument,
                    format!("vector of id {} is all zeros; cosine needs a non-zero vector", it.id),
                ));
            }
            // Cosine keeps the original norm, l2 the squared norm: both as f32.
            let sq = squared_norm(it.vector);
            let kept = match self.metric {
                Metric::Cosine => sq.sqrt(),
                Metric::L2 => sq,
                Metric::InnerProduct => 0.0,
            };
            if kept > f32::MAX as f64 {
                return Err(Error::new(
                    Status::InvalidArgument,
                    format!(
                        "vector of id {} has norm {:e}: its {} exceeds the f32 range of the {} metric",
                        it.id,
                        sq.sqrt(),
                        if self.metric == Metric::L2 { "squared norm" } else { "norm" },
                        self.metric.name()
                    ),
                ));
            }
            if !self.index.contains_key(&it.id) {
                new_ids.insert(it.id);
            }
        }
        self.fields.check(items.iter().map(|it| (it.id, it.fields)))?;
        if self.len() + new_ids.len() > self.capacity {
            return Err(Error::new(
                Status::StoreFull,
                format!("store holds {} of {} rows; this upsert adds {} new ids", self.len(), self.capacity, new_ids.len()),
            ));
        }
        Ok(())
    }

    /// Applies a validated batch. Within one batch a duplicate id is applied in order, so the
    /// last occurrence wins.
    pub fn apply_upsert(&mut self, items: &[UpsertItem<'_>]) {
        let add = items.len().min(self.capacity.saturating_sub(self.len()));
        self.reserve(add);
        for it in items {
            self.put(it);
        }
    }

    fn put(&mut self, it: &UpsertItem<'_>) {
        let dim = self.dim;
        // Validated: the norm kept fits f32 (validate_upsert).
        let (norm, unit) = match self.metric {
            Metric::InnerProduct => (1.0f32, None),
            Metric::Cosine => {
                let n = squared_norm(it.vector).sqrt();
                (n as f32, Some(n))
            }
            Metric::L2 => (squared_norm(it.vector) as f32, None),
        };
        let payload: Option<Box<[u8]>> = it.payload.map(|p| p.to_vec().into_boxed_slice());
        let plen = payload.as_ref().map_or(0, |p| p.len());
        let row = self.row_for(it.id);
        let dst = &mut self.vectors[row * dim..(row + 1) * dim];
        match unit {
            None => dst.copy_from_slice(it.vector),
            Some(n) => scale_to_unit(it.vector, dst, n),
        }
        self.norms[row] = norm;
        self.namespaces[row] = it.namespace;
        self.created_ms[row] = it.created_ms;
        if self.expires_ms[row] != NEVER {
            self.expiring -= 1;
        }
        if it.expires_ms != NEVER {
            self.expiring += 1;
        }
        self.expires_ms[row] = it.expires_ms;
        self.payload_bytes -= self.payloads[row].as_ref().map_or(0, |p| p.len());
        self.payload_bytes += plen;
        self.payloads[row] = payload;
        self.fields.set_row(row, it.fields);
        self.dirty.push(row as u32);
    }

    /// The row of `id`: its own, or a new empty one at the end.
    fn row_for(&mut self, id: u64) -> usize {
        if let Some(&r) = self.index.get(&id) {
            return r as usize;
        }
        let r = self.ids.len();
        self.ids.push(id);
        self.vectors.resize((r + 1) * self.dim);
        self.norms.push(0.0);
        self.namespaces.push(0);
        self.created_ms.push(0);
        self.expires_ms.push(NEVER);
        self.payloads.push(None);
        self.fields.push_row();
        self.index.insert(id, r as u32);
        r
    }

    /// Upserts row `row` of `src` as `src` stores it (the vector already scaled for the metric,
    /// its norm, namespace, times and fields), without its payload: how a device shard's table
    /// (`engine::shard`) copies the server's rows bit for bit. `src` has this store's dimension
    /// and metric.
    pub(crate) fn copy_row_from(&mut self, src: &Store, row: usize) {
        let dim = self.dim;
        debug_assert!(src.dim == dim && src.metric == self.metric);
        let id = src.ids[row];
        let r = self.row_for(id);
        self.vectors[r * dim..(r + 1) * dim].copy_from_slice(&src.vectors[row * dim..(row + 1) * dim]);
        self.norms[r] = src.norms[row];
        self.namespaces[r] = src.namespaces[row];
        self.created_ms[r] = src.created_ms[row];
        if self.expires_ms[r] != NEVER {
            self.expiring -= 1;
        }
        if src.expires_ms[row] != NEVER {
            self.expiring += 1;
        }
        self.expires_ms[r] = src.expires_ms[row];
        self.fields.set_row(r, &src.fields.row(row));
        self.dirty.push(r as u32);
    }

    /// Reserves room for `n` more rows in every column (amortised growth, no per-row reallocation).
    pub fn reserve(&mut self, n: usize) {
        self.vectors.reserve(n * self.dim);
        self.norms.reserve(n);
        self.ids.reserve(n);
        self.namespaces.reserve(n);
        self.created_ms.reserve(n);
        self.expires_ms.reserve(n);
        self.payloads.reserve(n);
        self.fields.reserve(n);
        self.index.reserve(n);
    }

    /// Checks that every id exists (reports the first that does not); changes nothing.
    pub fn check_ids_exist(&self, ids: &[u64]) -> Result<()> {
        for &id in ids {
            if !self.index.contains_key(&id) {
                return Err(Error::new(Status::NotFound, format!("id {id} is not in the store")));
            }
        }
        Ok(())
    }

    /// Deletes every id, all or nothing: if any id is missing, nothing is deleted and the error
    /// names it. Duplicate ids in the list are deleted once. Returns the number deleted.
    pub fn delete(&mut self, ids: &[u64]) -> Result<usize> {
        self.check_ids_exist(ids)?;
        Ok(self.delete_present(ids))
    }

    /// Deletes ids that exist and ignores the rest (used by WAL replay and expiry).
    pub fn delete_present(&mut self, ids: &[u64]) -> usize {
        let mut n = 0;
        for &id in ids {
            if let Some(&r) = self.index.get(&id) {
                self.remove_row(r as usize);
                n += 1;
            }
        }
        n
    }

    /// Deletes every memory of a namespace; returns how many.
    pub fn delete_namespace(&mut self, ns: u64) -> usize {
        let victims: Vec<u64> = self.namespaces.iter().zip(&self.ids).filter(|(&n, _)| n == ns).map(|(_, &id)| id).collect();
        self.delete_present(&victims)
    }

    /// Rows that a recall with `filter` may return at `now_ms`: in the namespace list, matching
    /// the metadata expression, not expired. A bitmap over the table's rows.
    pub fn filter_rows(&self, filter: &Filter, now_ms: u64) -> Bitmap {
        let mut b = match &filter.expr {
            Some(e) => crate::filter::eval(&e.expr, &self.fields, self.len()),
            None => Bitmap::from_fn(self.len(), |_| true),
        };
        if filter.namespaces.is_some() || self.expiring > 0 {
            for r in b.rows() {
                let r = r as usize;
                if !filter.matches(self.namespaces[r]) || self.expires_ms[r] <= now_ms {
                    b.clear(r);
                }
            }
        }
        b
    }

    /// Ids of the memories [`Store::filter_rows`] selects.
    pub fn matching_ids(&self, filter: &Filter, now_ms: u64) -> Vec<u64> {
        self.filter_rows(filter, now_ms).rows().into_iter().map(|r| self.ids[r as usize]).collect()
    }

    /// One page of the ids [`Store::filter_rows`] selects: those greater than `after` (all when
    /// None), ascending, at most `limit`; and how many more ids match after the page's last.
    /// Costs one pass over the table whatever the page size.
    pub fn list_ids(&self, filter: &Filter, now_ms: u64, after: Option<u64>, limit: usize) -> (Vec<u64>, u64) {
        let rows = self.filter_rows(filter, now_ms).rows();
        let mut ids: Vec<u64> = rows.into_iter().map(|r| self.ids[r as usize]).filter(|&id| after.is_none_or(|a| id > a)).collect();
        let matched = ids.len();
        if matched > limit {
            if limit > 0 {
                ids.select_nth_unstable(limit - 1);
            }
            ids.truncate(limit);
        }
        ids.sort_unstable();
        let remaining = (matched - ids.len()) as u64;
        (ids, remaining)
    }

    /// Removes expired memories (expires_ms ≤ now); returns their ids.
    pub fn purge_expired(&mut self, now_ms: u64) -> Vec<u64> {
        if self.expiring == 0 {
            return Vec::new();
        }
        let victims: Vec<u64> = self.expires_ms.iter().zip(&self.ids).filter(|(&e, _)| e <= now_ms).map(|(_, &id)| id).collect();
        self.delete_present(&victims);
        victims
    }

    /// Removes everything.
    pub fn clear(&mut self) {
        let ids = self.ids.clone();
        self.delete_present(&ids);
        // A cleared store forgets its field types and keyword dictionary.
        self.fields.reset();
    }

    fn remove_row(&mut self, row: usize) {
        let dim = self.dim;
        let last = self.ids.len() - 1;
        let id = self.ids[row];
        self.index.remove(&id);
        if self.expires_ms[row] != NEVER {
            self.expiring -= 1;
        }
        self.payload_bytes -= self.payloads[row].as_ref().map_or(0, |p| p.len());
        if row != last {
            self.vectors.copy_within(last * dim..(last + 1) * dim, row * dim);
            self.norms[row] = self.norms[last];
            self.ids[row] = self.ids[last];
            self.namespaces[row] = self.namespaces[last];
            self.created_ms[row] = self.created_ms[last];
            self.expires_ms[row] = self.expires_ms[last];
            self.payloads.swap(row, last);
            self.index.insert(self.ids[row], row as u32);
            self.dirty.push(row as u32);
        }
        self.vectors.resize(last * dim);
        self.norms.truncate(last);
        self.ids.truncate(last);
        self.namespaces.truncate(last);
        self.created_ms.truncate(last);
        self.expires_ms.truncate(last);
        self.payloads.truncate(last);
        self.fields.swap_remove(row, last);
    }

    /// The vector as the caller wrote it (denormalised for cosine).
    pub fn vector_of_row(&self, row: usize) -> Vec<f32> {
        let v = &self.vectors[row * self.dim..(row + 1) * self.dim];
        match self.metric {
            Metric::Cosine => v.iter().map(|&x| x * self.norms[row]).collect(),
            _ => v.to_vec(),
        }
    }

    pub fn get(&self, id: u64) -> Option<Record> {
        let row = self.row_of(id)?;
        Some(Record {
            id,
            namespace: self.namespaces[row],
            vector: self.vector_of_row(row),
            payload: self.payloads[row].as_ref().map(|p| p.to_vec()),
            created_ms: self.created_ms[row],
            expires_ms: self.expires_ms[row],
            fields: self.fields.row(row),
        })
    }

    /// Iterates every row as a `Record` (for snapshots and export).
    pub fn records(&self) -> impl Iterator<Item = Record> + '_ {
        (0..self.len()).map(move |r| Record {
            id: self.ids[r],
            namespace: self.namespaces[r],
            vector: self.vector_of_row(r),
            payload: self.payloads[r].as_ref().map(|p| p.to_vec()),
            created_ms: self.created_ms[r],
            expires_ms: self.expires_ms[r],
            fields: self.fields.row(r),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Growth by mremap keeps every value, starts on a cache line, and values exposed again
    /// after a shrink read 0.0.
    #[test]
    fn line_vec_grows_in_place_of_copies() {
        let mut v = LineVec::default();
        assert!(v.is_empty());
        let mut n = 0usize;
        for step in [1usize, 15, 16, 1000, 40_000, 300_000, 2_000_000] {
            v.resize(n + step);
            assert_eq!(v.as_ptr() as usize % 64, 0);
            for (i, x) in v[n..].iter_mut().enumerate() {
                *x = (n + i) as f32;
            }
            n += step;
            assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32), "values kept through growth to {n}");
        }
        v.resize(10);
        v.resize(20);
        assert_eq!(&v[..10], &(0..10).map(|i| i as f32).collect::<Vec<_>>()[..]);
        assert!(v[10..].iter().all(|&x| x == 0.0));
        v.reserve(1 << 20);
        assert_eq!(v.len(), 20);
    }

    /// A table mapping of a huge page or more carries the huge-page advice (smaps' `hg` flag),
    /// also after a growth by mremap; a smaller one does not. Skipped where the kernel has no THP.
    #[cfg(target_os = "linux")]
    #[test]
    fn large_tables_ask_for_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() || !crate::config::tuning_or_default().huge_pages {
            return;
        }
        let flags = |p: *const f32| -> String {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let a = p as usize;
            let mut inside = false;
            for line in smaps.lines() {
                if let Some((range, _)) = line.split_once(' ').filter(|(r, _)| r.contains('-') && !r.ends_with(':')) {
                    let (lo, hi) = range.split_once('-').unwrap();
                    let (lo, hi) = (usize::from_str_radix(lo, 16).unwrap(), usize::from_str_radix(hi, 16).unwrap());
                    inside = (lo..hi).contains(&a);
                } else if inside && line.starts_with("VmFlags:") {
                    return line.to_string();
                }
            }
            panic!("no mapping holds {a:#x}");
        };
        let mut v = LineVec::default();
        v.resize(1000);
        assert!(!flags(v.as_ptr()).split_whitespace().any(|f| f == "hg"), "a 64 KiB mapping is left alone");
        for bytes in [HUGE_PAGE_MIN, 16 * HUGE_PAGE_MIN] {
            v.resize(bytes / 4);
            assert!(flags(v.as_ptr()).split_whitespace().any(|f| f == "hg"), "a mapping of {} bytes is advised", v.cap);
        }
    }

    fn item(id: u64, v: &[f32]) -> UpsertItem<'_> {
        UpsertItem { fields: &[], id, namespace: 0, vector: v, payload: None, created_ms: 0, expires_ms: NEVER }
    }

    #[test]
    fn upsert_replace_delete_keeps_table_dense() {
        let mut s = Store::new(2, Metric::InnerProduct, 10, 16);
        let a = [1.0, 2.0];
        let b = [3.0, 4.0];
        let c = [5.0, 6.0];
        s.apply_upsert(&[item(1, &a), item(2, &b), item(3, &c)]);
        assert_eq!(s.len(), 3);
        s.apply_upsert(&[item(2, &a)]);
        assert_eq!(s.len(), 3);
        assert_eq!(s.get(2).unwrap().vector, vec![1.0, 2.0]);
        assert_eq!(s.delete(&[1]).unwrap(), 1);
        assert_eq!(s.len(), 2);
        assert_eq!(s.get(3).unwrap().vector, vec![5.0, 6.0]);
        assert_eq!(s.row_of(3), Some(0));
        assert_eq!(s.delete(&[3, 99]).unwrap_err().status, Status::NotFound);
        assert_eq!(s.len(), 2, "failed delete changes nothing");
    }

    #[test]
    fn duplicate_in_batch_last_wins_and_capacity_counts_once() {
        let mut s = Store::new(1, Metric::InnerProduct, 1, 16);
        let a = [1.0];
        let b = [2.0];
        let batch = [item(7, &a), item(7, &b)];
        s.validate_upsert(&batch).unwrap();
        s.apply_upsert(&batch);
        assert_eq!(s.get(7).unwrap().vector, vec![2.0]);
        assert_eq!(s.validate_upsert(&[item(8, &a)]).unwrap_err().status, Status::StoreFull);
    }

    #[test]
    fn cosine_roundtrips_original_vector() {
        let mut s = Store::new(2, Metric::Cosine, 4, 16);
        s.apply_upsert(&[item(1, &[3.0, 4.0])]);
        assert!((s.vectors()[0] - 0.6).abs() < 1e-6);
        let v = s.get(1).unwrap().vector;
        assert!((v[0] - 3.0).abs() < 1e-5 && (v[1] - 4.0).abs() < 1e-5);
    }

    #[test]
    fn expiry_purge() {
        let mut s = Store::new(1, Metric::InnerProduct, 4, 16);
        let v = [1.0];
        let mut it = item(1, &v);
        it.expires_ms = 100;
        s.apply_upsert(&[it, item(2, &v)]);
        assert!(s.has_expiring());
        assert_eq!(s.purge_expired(99), Vec::<u64>::new());
        assert_eq!(s.purge_expired(100), vec![1]);
        assert!(!s.has_expiring());
        assert_eq!(s.len(), 1);
    }
}
