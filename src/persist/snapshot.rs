//! Snapshots: the whole table as of a sequence number, in checksummed blocks (written from the
//! live store or from a copy of its columns, loaded at recovery and by repair).

use std::io::{BufWriter, Write};
use std::path::Path;

use super::crc::{crc32c, crc32c_update};
use super::dir::{io_err, snap_name, DataDir, OpenMode};
use super::record::{
    check_shape, corrupt, decode_rows, encode_rows, get_u32, get_u64, put_u64, FileHeader, Kind, FORMAT_VERSION, HEADER_BYTES, REC_HEADER,
};
use super::wal::apply_valid_rows;
use crate::error::{Error, Result};
use crate::meta::{Columns, Field};
use crate::store::{Store, UpsertItem};
use crate::types::Metric;

/// Most bytes of rows in one snapshot block (a larger row gets a block of its own). Blocks are
/// checksummed one by one so a damaged block is located.
const SNAP_BLOCK_BYTES: usize = 4 << 20;

/// What a snapshot is written from: the live store (synchronous snapshots) or a copy of its
/// columns (background snapshots).
pub(super) trait SnapSource {
    fn n(&self) -> usize;
    fn dim(&self) -> usize;
    fn metric(&self) -> Metric;
    fn id(&self, r: usize) -> u64;
    fn ns(&self, r: usize) -> u64;
    fn created(&self, r: usize) -> u64;
    fn expires(&self, r: usize) -> u64;
    fn payload(&self, r: usize) -> Option<&[u8]>;
    /// The vector as the caller wrote it.
    fn vector(&self, r: usize) -> Vec<f32>;
    /// The metadata fields of row r.
    fn fields(&self, r: usize) -> Vec<Field>;
}

impl SnapSource for Store {
    fn n(&self) -> usize {
        self.len()
    }
    fn dim(&self) -> usize {
        Store::dim(self)
    }
    fn metric(&self) -> Metric {
        Store::metric(self)
    }
    fn id(&self, r: usize) -> u64 {
        self.ids()[r]
    }
    fn ns(&self, r: usize) -> u64 {
        self.namespaces()[r]
    }
    fn created(&self, r: usize) -> u64 {
        self.created_ms()[r]
    }
    fn expires(&self, r: usize) -> u64 {
        self.expires_ms()[r]
    }
    fn payload(&self, r: usize) -> Option<&[u8]> {
        self.payload_at(r)
    }
    fn vector(&self, r: usize) -> Vec<f32> {
        self.vector_of_row(r)
    }
    fn fields(&self, r: usize) -> Vec<Field> {
        Store::fields(self).row(r)
    }
}

/// A copy of the store's columns, taken by the server thread (a memcpy of the table) so that a
/// background thread can write the snapshot while the server keeps serving.
pub(super) struct TableCopy {
    dim: usize,
    metric: Metric,
    vectors: Vec<f32>,
    norms: Vec<f32>,
    ids: Vec<u64>,
    ns: Vec<u64>,
    created: Vec<u64>,
    expires: Vec<u64>,
    payloads: Vec<Option<Box<[u8]>>>,
    fields: Columns,
}

impl TableCopy {
    pub(super) fn of(s: &Store) -> TableCopy {
        TableCopy {
            dim: s.dim(),
            metric: s.metric(),
            vectors: s.vectors().to_vec(),
            norms: s.norms().to_vec(),
            ids: s.ids().to_vec(),
            ns: s.namespaces().to_vec(),
            created: s.created_ms().to_vec(),
            expires: s.expires_ms().to_vec(),
            payloads: (0..s.len()).map(|r| s.payload_at(r).map(Box::from)).collect(),
            fields: s.fields().clone(),
        }
    }
}

impl SnapSource for TableCopy {
    fn n(&self) -> usize {
        self.ids.len()
    }
    fn dim(&self) -> usize {
        self.dim
    }
    fn metric(&self) -> Metric {
        self.metric
    }
    fn id(&self, r: usize) -> u64 {
        self.ids[r]
    }
    fn ns(&self, r: usize) -> u64 {
        self.ns[r]
    }
    fn created(&self, r: usize) -> u64 {
        self.created[r]
    }
    fn expires(&self, r: usize) -> u64 {
        self.expires[r]
    }
    fn payload(&self, r: usize) -> Option<&[u8]> {
        self.payloads[r].as_deref()
    }
    fn vector(&self, r: usize) -> Vec<f32> {
        // Exactly what Store::vector_of_row computes.
        let v = &self.vectors[r * self.dim..(r + 1) * self.dim];
        match self.metric {
            Metric::Cosine => v.iter().map(|&x| x * self.norms[r]).collect(),
            _ => v.to_vec(),
        }
    }
    fn fields(&self, r: usize) -> Vec<Field> {
        self.fields.row(r)
    }
}

/// Writes the whole store as snapshot generation `gen` covering sequence numbers `< seq`:
/// temp file (created with `O_EXCL`), fsync, rename, fsync directory. Returns the snapshot size
/// in bytes. On failure the temp file, if this call created it, is removed.
pub(super) fn write_snapshot<S: SnapSource>(dir: &DataDir, gen: u64, seq: u64, store: &S) -> Result<u64> {
    let tmp_name = format!("{}.tmp", snap_name(gen));
    let f = dir.open_file(&tmp_name, OpenMode::CreateNew)?;
    let r = write_snapshot_to(dir, f, &tmp_name, gen, seq, store);
    if r.is_err() {
        let _ = dir.remove(&tmp_name);
    }
    r
}

fn write_snapshot_to<S: SnapSource>(dir: &DataDir, f: std::fs::File, tmp_name: &str, gen: u64, seq: u64, store: &S) -> Result<u64> {
    let tmp = dir.join(tmp_name);
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let total = encode_snapshot(&mut w, gen, seq, store).map_err(|e| io_err("write", &tmp, e))?;
    let f = w.into_inner().map_err(|e| io_err("write", &tmp, e.into_error()))?;
    f.sync_all().map_err(|e| io_err("fsync", &tmp, e))?;
    drop(f);
    dir.rename(tmp_name, dir, &snap_name(gen))?;
    dir.fsync()?;
    Ok(total)
}

/// Writes the snapshot bytes of `store` (generation `gen`, sequence numbers `< seq`) to `w`:
/// the header, blocks of about `SNAP_BLOCK_BYTES`, the end block. Returns the bytes written.
pub(super) fn encode_snapshot<S: SnapSource, W: Write>(w: &mut W, gen: u64, seq: u64, store: &S) -> std::io::Result<u64> {
    let hdr = FileHeader {
        kind: Kind::Snap,
        version: FORMAT_VERSION,
        dim: store.dim() as u32,
        metric: store.metric() as u32,
        generation: gen,
        seq,
    };
    let mut total = 0u64;
    w.write_all(&hdr.encode())?;
    total += HEADER_BYTES as u64;
    let dim = store.dim();
    let per_row = 8 * 4 + 4 + dim * 4;
    let mut block = Vec::with_capacity(SNAP_BLOCK_BYTES + per_row + 64);
    let mut row = 0usize;
    let n = store.n();
    let mut vecs: Vec<Vec<f32>> = Vec::new();
    let mut flds: Vec<Vec<Field>> = Vec::new();
    loop {
        // One block: as many rows as fit in ~SNAP_BLOCK_BYTES (at least one), then an end block.
        let start = row;
        let mut bytes = 0usize;
        vecs.clear();
        flds.clear();
        while row < n && (row == start || bytes + per_row + store.payload(row).map_or(0, |p| p.len()) <= SNAP_BLOCK_BYTES) {
            bytes += per_row + store.payload(row).map_or(0, |p| p.len());
            vecs.push(store.vector(row));
            let f = store.fields(row);
            // Encoded size: 2 bytes of count, name and value bytes (close enough to bound a block).
            bytes += 2 + f.iter().map(|x| 2 + x.name.len() + 16).sum::<usize>();
            flds.push(f);
            row += 1;
        }
        let items: Vec<UpsertItem<'_>> = (start..row)
            .map(|r| UpsertItem {
                fields: &flds[r - start],
                id: store.id(r),
                namespace: store.ns(r),
                vector: &vecs[r - start],
                payload: store.payload(r),
                created_ms: store.created(r),
                expires_ms: store.expires(r),
            })
            .collect();
        block.clear();
        block.extend_from_slice(&[0u8; REC_HEADER]);
        encode_rows(&mut block, &items);
        if items.is_empty() {
            // End block: count 0, then the total row count.
            put_u64(&mut block, n as u64);
        }
        let len = (block.len() - REC_HEADER) as u32;
        block[..4].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c_update(crc32c(&len.to_le_bytes()), &block[REC_HEADER..]);
        block[4..8].copy_from_slice(&crc.to_le_bytes());
        w.write_all(&block)?;
        total += block.len() as u64;
        if items.is_empty() {
            break;
        }
    }
    Ok(total)
}

/// Loads a snapshot into `store`. `salvage` (repair): skip damaged blocks instead of failing.
/// Returns the header, the rows loaded, the size up to the end block, and one note per problem
/// skipped (only when salvaging).
pub(super) fn load_snapshot(
    dir: &DataDir,
    name: &str,
    hdr_expect: Option<(u32, u32)>,
    store: &mut Store,
    salvage: bool,
) -> Result<(FileHeader, u64, u64, Vec<String>)> {
    let (_f, m) = dir.map(name)?;
    load_snapshot_bytes(&dir.join(name), m.as_deref().unwrap_or(&[]), hdr_expect, store, salvage)
}

/// [`load_snapshot`] on the bytes `b` of the snapshot file `path` (named in errors and notes).
pub(super) fn load_snapshot_bytes(
    path: &Path,
    b: &[u8],
    hdr_expect: Option<(u32, u32)>,
    store: &mut Store,
    salvage: bool,
) -> Result<(FileHeader, u64, u64, Vec<String>)> {
    let mut notes = Vec::new();
    let hdr = match (FileHeader::decode(path, b, Kind::Snap), hdr_expect) {
        (Ok(h), _) => {
            if let Some((dim, metric)) = hdr_expect {
                check_shape(path, &h, dim, metric)?;
            }
            h
        }
        // Repair: a damaged header does not make the blocks unreadable (the dimension comes from
        // the log); the snapshot's sequence number is then unknown (u64::MAX).
        (Err(e), Some((dim, metric))) if salvage && b.len() >= HEADER_BYTES => {
            notes.push(format!("{}: header unreadable ({e}); its blocks were read with dimension {dim}", path.display()));
            FileHeader { kind: Kind::Snap, version: FORMAT_VERSION, dim, metric, generation: u64::MAX, seq: u64::MAX }
        }
        (Err(e), _) => return Err(e),
    };
    let dim = hdr.dim as usize;
    let mut o = HEADER_BYTES;
    let mut rows = 0u64;
    let mut ended = false;
    let mut size = b.len() as u64;
    while o < b.len() {
        let ok = (|| -> std::result::Result<(usize, usize), String> {
            if o + REC_HEADER > b.len() {
                return Err("truncated block header".into());
            }
            let len = get_u32(b, o) as usize;
            if len < 4 || len > b.len() - o - REC_HEADER {
                return Err(format!("block length {len} runs past the end of the file"));
            }
            let body = &b[o + REC_HEADER..o + REC_HEADER + len];
            if crc32c_update(crc32c(&b[o..o + 4]), body) != get_u32(b, o + 4) {
                return Err("block checksum mismatch".into());
            }
            Ok((o + REC_HEADER, o + REC_HEADER + len))
        })();
        match ok {
            Ok((s, e)) => {
                let body = &b[s..e];
                if get_u32(body, 0) == 0 && body.len() == 12 {
                    let total = get_u64(body, 4);
                    if total != rows && !salvage {
                        return Err(corrupt(path, o, format!("end block says {total} rows; the blocks hold {rows}")));
                    }
                    if total > rows {
                        notes.push(format!("{}: {} of {total} rows were in damaged blocks and are lost", path.display(), total - rows));
                    } else if total < rows {
                        notes.push(format!("{}: the end block says {total} rows; the blocks hold {rows}", path.display()));
                    }
                    if e != b.len() {
                        if !salvage {
                            return Err(corrupt(path, e, format!("{} bytes after the end block", b.len() - e)));
                        }
                        notes.push(format!("{}: ignored {} bytes after the end block", path.display(), b.len() - e));
                    }
                    ended = true;
                    size = e as u64;
                    break;
                }
                let r = decode_rows(body, dim).map_err(|m| corrupt(path, o, m))?;
                let items = r.items(dim);
                match store.validate_upsert(&items) {
                    Ok(()) => store.apply_upsert(&items),
                    Err(_) if salvage => notes.extend(apply_valid_rows(store, &items, &format!("{}: block at offset {o}", path.display()))),
                    Err(e) => {
                        return Err(Error::new(e.status, format!("{}: loading block at offset {o}: {}", path.display(), e.message)));
                    }
                }
                rows += items.len() as u64;
                o = e;
            }
            Err(m) => {
                if !salvage {
                    return Err(corrupt(path, o, m));
                }
                // Find the next intact block.
                let next = (o + 1..b.len()).find(|&p| {
                    p + REC_HEADER <= b.len() && {
                        let len = get_u32(b, p) as usize;
                        len >= 4
                            && len <= b.len() - p - REC_HEADER
                            && crc32c_update(crc32c(&b[p..p + 4]), &b[p + REC_HEADER..p + REC_HEADER + len]) == get_u32(b, p + 4)
                    }
                });
                notes.push(format!("{}: damaged block at offset {o} ({m}); skipped {} bytes", path.display(), next.unwrap_or(b.len()) - o));
                match next {
                    Some(p) => o = p,
                    None => break,
                }
            }
        }
    }
    if !ended {
        if !salvage {
            return Err(corrupt(path, b.len(), "snapshot ends without its end block (truncated)"));
        }
        notes.push(format!("{}: no end block; the snapshot was truncated", path.display()));
    }
    Ok((hdr, rows, size, notes))
}
