//! The device table: the store's columns mirrored in GPU memory (vectors as f32, f16 or bf16),
//! grown by doubling within the memory limit, and updated row by row through pinned staging
//! and the scatter_rows kernel (kernels/table.cu).

use std::ffi::c_void;

use cudarc::driver::sys;

use super::compile::NT;
use super::{align_up, ck, CudaEngine, DevBuf, HostBuf};
use crate::error::{Error, Result, Status};
use crate::store::Store;

/// Device table columns (`struct Table` in the kernel), passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct TableArg {
    pub(super) vecs: u64,
    pub(super) norms: u64,
    pub(super) ids: u64,
    pub(super) ns: u64,
    pub(super) created: u64,
    pub(super) expires: u64,
    /// Bitmap of the rows a metadata filter lets through (0: no filter).
    pub(super) mask: u64,
    /// The int8 scan's per-row scales (its kernel only; `vecs` then holds the codes).
    pub(super) rscale: u64,
    /// The int8 scan's 8-bit codes when `vecs` holds its 4-bit first pass's codes.
    pub(super) codes8: u64,
}

/// The table mirror: `len` rows of room for `cap_rows`, one buffer per column.
pub(super) struct DevTable {
    /// The store's capacity in rows (growth stops there).
    pub(super) store_cap: usize,
    /// GPU memory the table may take (option gpu_memory_bytes, else 90 % of the free memory at
    /// start).
    pub(super) limit_bytes: usize,
    pub(super) cap_rows: usize,
    pub(super) len: usize,
    pub(super) d_vecs: DevBuf,
    pub(super) d_norms: DevBuf,
    pub(super) d_ids: DevBuf,
    pub(super) d_ns: DevBuf,
    pub(super) d_created: DevBuf,
    pub(super) d_expires: DevBuf,
    /// Bumped whenever the columns move (growth): graphs built for an older one are rebuilt.
    pub(super) gen: u64,
    /// Pinned staging of `sync` (`stage_rows` rows a chunk); batches also stage host queries
    /// through it.
    pub(super) h_stage: HostBuf,
    pub(super) d_stage: DevBuf,
    pub(super) stage_rows: usize,
}

impl CudaEngine {
    pub(super) fn row_bytes(&self) -> usize {
        self.dp * self.esize + 4 + 8 * 4 + self.int8.as_ref().map_or(0, |c| c.row_bytes())
    }

    /// Makes room for `rows` rows (doubling), copying the rows present. On failure the table is
    /// unchanged and the error is `STORE_FULL` with the reason.
    pub(super) fn ensure_capacity(&mut self, rows: usize) -> Result<()> {
        if rows <= self.table.cap_rows {
            return Ok(());
        }
        let mut new_cap = rows.max(self.table.cap_rows.saturating_mul(2)).min(self.table.store_cap.max(rows));
        let max_rows = self.table.limit_bytes / self.row_bytes();
        if rows > max_rows {
            return Err(Error::new(
                Status::StoreFull,
                format!(
                    "the GPU table cannot grow to {rows} rows: {} bytes of GPU memory allowed (option gpu_memory_bytes) hold {max_rows} rows",
                    self.table.limit_bytes
                ),
            ));
        }
        new_cap = new_cap.min(max_rows);
        let alloc = |bytes: usize, w: &str| DevBuf::new(bytes, w);
        let vecs = alloc(new_cap * self.dp * self.esize, "table vectors")?;
        let norms = alloc(new_cap * 4, "norms")?;
        let ids = alloc(new_cap * 8, "ids")?;
        let ns = alloc(new_cap * 8, "namespaces")?;
        let created = alloc(new_cap * 8, "created")?;
        let expires = alloc(new_cap * 8, "expires")?;
        // The int8 scan's codes and scales, rows of dp8 bytes and 4, and its first pass's 4-bit
        // codes.
        let codes = match &self.int8 {
            Some(c) => Some((alloc(new_cap * c.dp8, "int8 codes")?, alloc(new_cap * 4, "int8 scales")?)),
            None => None,
        };
        let nib = match self.int8.as_ref().and_then(|c| c.nib.as_ref()) {
            Some(nb) => Some(alloc(new_cap * nb.row_bytes, "4-bit codes")?),
            None => None,
        };
        let n = self.table.len;
        if n > 0 {
            let copy = |dst: &DevBuf, src: &DevBuf, bytes: usize| {
                // SAFETY: both buffers hold at least `bytes` (the n rows present, n <= both
                // capacities); the engine's own stream, synchronised before the old buffers go.
                ck("grow copy", unsafe { sys::cuMemcpyDtoDAsync_v2(dst.ptr, src.ptr, bytes, self.stream) })
            };
            copy(&vecs, &self.table.d_vecs, n * self.dp * self.esize)?;
            copy(&norms, &self.table.d_norms, n * 4)?;
            copy(&ids, &self.table.d_ids, n * 8)?;
            copy(&ns, &self.table.d_ns, n * 8)?;
            copy(&created, &self.table.d_created, n * 8)?;
            copy(&expires, &self.table.d_expires, n * 8)?;
            if let (Some((d_codes, d_scales)), Some(c)) = (&codes, &self.int8) {
                copy(d_codes, &c.d_codes, n * c.dp8)?;
                copy(d_scales, &c.d_scales, n * 4)?;
            }
            if let (Some(d_nib), Some(nb)) = (&nib, self.int8.as_ref().and_then(|c| c.nib.as_ref())) {
                copy(d_nib, &nb.d_codes, n * nb.row_bytes)?;
            }
            self.sync_stream()?;
        }
        if let (Some((d_codes, d_scales)), Some(c)) = (codes, self.int8.as_mut()) {
            c.d_codes = d_codes;
            c.d_scales = d_scales;
        }
        if let (Some(d_nib), Some(nb)) = (nib, self.int8.as_mut().and_then(|c| c.nib.as_mut())) {
            nb.d_codes = d_nib;
        }
        let t = &mut self.table;
        t.d_vecs = vecs;
        t.d_norms = norms;
        t.d_ids = ids;
        t.d_ns = ns;
        t.d_created = created;
        t.d_expires = expires;
        t.cap_rows = new_cap;
        t.gen += 1;
        self.sq.graphs.clear();
        Ok(())
    }

    pub(super) fn table_arg(&self) -> TableArg {
        TableArg {
            vecs: self.table.d_vecs.ptr,
            norms: self.table.d_norms.ptr,
            ids: self.table.d_ids.ptr,
            ns: self.table.d_ns.ptr,
            created: self.table.d_created.ptr,
            expires: self.table.d_expires.ptr,
            mask: self.fcols.active_mask,
            rscale: 0,
            codes8: 0,
        }
    }

    pub(super) fn do_sync(&mut self, store: &Store, dirty: &[u32]) -> Result<()> {
        let n = store.len();
        self.ensure_capacity(n)?;
        let mut rows: Vec<u32> = dirty.iter().copied().filter(|&r| (r as usize) < n).collect();
        rows.sort_unstable();
        rows.dedup();
        let dim = self.dim;
        let sr = self.table.stage_rows;
        // Staging layout (offsets for `sr` rows): rows u32 | norms f32 | ids | ns | created | expires | vecs f32.
        let o_rows = 0usize;
        let o_norms = align_up(o_rows + sr * 4, 16);
        let o_ids = align_up(o_norms + sr * 4, 16);
        let o_ns = o_ids + sr * 8;
        let o_cr = o_ns + sr * 8;
        let o_ex = o_cr + sr * 8;
        let o_v = align_up(o_ex + sr * 8, 16);
        for chunk in rows.chunks(sr) {
            let m = chunk.len();
            {
                let buf = self.table.h_stage.slice();
                let put = |buf: &mut [u8], off: usize, b: &[u8]| buf[off..off + b.len()].copy_from_slice(b);
                for (i, &r) in chunk.iter().enumerate() {
                    let r = r as usize;
                    put(buf, o_rows + i * 4, &(r as u32).to_le_bytes());
                    put(buf, o_norms + i * 4, &store.norms()[r].to_le_bytes());
                    put(buf, o_ids + i * 8, &store.ids()[r].to_le_bytes());
                    put(buf, o_ns + i * 8, &store.namespaces()[r].to_le_bytes());
                    put(buf, o_cr + i * 8, &store.created_ms()[r].to_le_bytes());
                    put(buf, o_ex + i * 8, &store.expires_ms()[r].to_le_bytes());
                    let v = &store.vectors()[r * dim..(r + 1) * dim];
                    let dst = &mut buf[o_v + i * dim * 4..o_v + (i + 1) * dim * 4];
                    // SAFETY: f32 -> bytes of the same length.
                    dst.copy_from_slice(unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, dim * 4) });
                }
            }
            let used = o_v + m * dim * 4;
            // SAFETY: h_stage and d_stage hold stage_rows rows of this layout (`used` bytes at
            // most); the host buffer is not touched again before the sync below.
            ck("stage copy", unsafe {
                sys::cuMemcpyHtoDAsync_v2(self.table.d_stage.ptr, self.table.h_stage.ptr as *const c_void, used, self.stream)
            })?;
            let base = self.table.d_stage.ptr;
            let mut a_rows = base + o_rows as u64;
            let mut a_norms = base + o_norms as u64;
            let mut a_ids = base + o_ids as u64;
            let mut a_ns = base + o_ns as u64;
            let mut a_cr = base + o_cr as u64;
            let mut a_ex = base + o_ex as u64;
            let mut a_v = base + o_v as u64;
            let mut mm = m as u32;
            let mut dv = self.table.d_vecs.ptr;
            let mut dn = self.table.d_norms.ptr;
            let mut di = self.table.d_ids.ptr;
            let mut dns = self.table.d_ns.ptr;
            let mut dc = self.table.d_created.ptr;
            let mut de = self.table.d_expires.ptr;
            let mut args = kargs![a_rows, a_norms, a_ids, a_ns, a_cr, a_ex, a_v, mm, dv, dn, di, dns, dc, de];
            let blocks = ((m * self.dp).div_ceil(NT as usize)).clamp(1, 4096) as u32;
            // SAFETY: `args` points at the 14 locals above, scatter_rows' parameters in order; the
            // staged rows index the table's columns, which hold n >= every staged row.
            ck("launch scatter_rows", unsafe {
                sys::cuLaunchKernel(self.kern.scatter_rows, blocks, 1, 1, NT, 1, 1, 0, self.stream, args.as_mut_ptr(), std::ptr::null_mut())
            })?;
            self.quantize_staged(base + o_rows as u64, base + o_v as u64, m)?;
            // The staging buffer is reused by the next chunk.
            self.sync_stream()?;
        }
        self.table.len = n;
        self.sync_fields(store, &rows)
    }
}
