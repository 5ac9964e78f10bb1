//! Writes: upsert, delete, delete a namespace, clear. Each is validated, logged and applied in
//! slot order; the log is committed once for the whole batch (group commit) and the engine's copy
//! of the table is brought up to date once.

use super::publish::{encode_result, Reply};
use super::serve::Pending;
use super::Server;
use crate::error::{Error, Result, Status};
use crate::persist::WalOp;
use crate::store::{UpsertItem, NEVER};
use crate::types::now_unix_ms;
use crate::wire::request::{decode_delete_where, decode_ids, decode_namespace, UpsertRequest};
use crate::wire::response::deleted;
use crate::wire::{OP_APPLY, OP_CLEAR, OP_DELETE, OP_DELETE_NS, OP_DELETE_WHERE, OP_UPSERT};

/// The items of an upsert created at `now` (its ttl counted from then); INVALID_ARGUMENT when
/// its expiry has passed.
pub(super) fn upsert_items<'a>(u: &'a UpsertRequest<'_>, dim: usize, now: u64) -> Result<Vec<UpsertItem<'a>>> {
    let mut expires = u.expires_ms;
    if expires != NEVER && expires <= now {
        return Err(Error::new(Status::InvalidArgument, format!("expiry {expires} (unix ms) is in the past")));
    }
    if u.ttl_ms > 0 {
        expires = expires.min(now.saturating_add(u.ttl_ms));
    }
    Ok((0..u.ids.len())
        .map(|i| UpsertItem {
            fields: u.fields.get(i).map_or(&[][..], |f| f.as_slice()),
            id: u.ids[i],
            namespace: u.namespaces[i],
            vector: &u.vectors[i * dim..(i + 1) * dim],
            payload: u.payloads[i],
            created_ms: now,
            expires_ms: expires,
        })
        .collect())
}

impl Server {
    /// Runs the batch's writes in slot order, answering each in `results`; then commits the log
    /// once and syncs the engine.
    pub(super) fn run_writes(&mut self, batch: &[Pending], results: &mut [Option<Reply>]) {
        let mut wrote = Vec::new();
        for (i, p) in batch.iter().enumerate() {
            if results[i].is_some() {
                continue; // answered by the cluster routing
            }
            if let op @ (OP_UPSERT | OP_DELETE | OP_DELETE_NS | OP_CLEAR | OP_DELETE_WHERE | OP_APPLY) = p.op() {
                let r = if op == OP_APPLY { self.apply_entries(p.body()) } else { self.do_write(op, p.body()) };
                if r.is_ok() {
                    wrote.push(i);
                }
                results[i] = Some(encode_result(r));
            }
        }
        if !wrote.is_empty() {
            if let Some(pst) = self.persist.as_mut() {
                if let Err(e) = pst.commit() {
                    for &i in &wrote {
                        results[i] = Some(Reply::error(e.status, format!("write applied but not made durable: {}", e.message)));
                    }
                }
            }
            let dirty = self.store.take_dirty();
            if let Err(e) = self.engine.sync(&self.store, &dirty) {
                self.engine_failed(e);
            }
        }
    }

    /// One write: validated, logged (not yet committed) and applied; returns the response body.
    fn do_write(&mut self, op: u32, body: &[u8]) -> Result<Vec<u8>> {
        if self.cluster.is_some() {
            return Err(Error::new(Status::Internal, "a cluster store applies writes from its log only"));
        }
        self.do_write_at(op, body, now_unix_ms(), false)
    }

    /// [`Self::do_write`] at time `now` (creation times, expiry, delete-where): a client's
    /// write now, or a cluster log entry at the time it was stamped. `from_log`: deleting an
    /// id that is not here is not an error (the log's deletes go to every shard).
    pub(super) fn do_write_at(&mut self, op: u32, body: &[u8], now: u64, from_log: bool) -> Result<Vec<u8>> {
        match op {
            OP_UPSERT => {
                self.upsert(body, now)?;
                Ok(Vec::new())
            }
            OP_DELETE => {
                let ids = decode_ids(body)?;
                if from_log {
                    let present: Vec<u64> = ids.iter().copied().filter(|&id| self.store.row_of(id).is_some()).collect();
                    if present.is_empty() {
                        return Ok(deleted(0));
                    }
                    if let Some(p) = self.persist.as_mut() {
                        p.append(&WalOp::Delete(&present))?;
                    }
                    return Ok(deleted(self.store.delete_present(&present) as u64));
                }
                self.store.check_ids_exist(&ids)?;
                if let Some(p) = self.persist.as_mut() {
                    p.append(&WalOp::Delete(&ids))?;
                }
                let d = self.store.delete(&ids)?;
                Ok(deleted(d as u64))
            }
            OP_DELETE_NS => {
                let ns = decode_namespace(body)?;
                if let Some(p) = self.persist.as_mut() {
                    p.append(&WalOp::DeleteNamespace(ns))?;
                }
                Ok(deleted(self.store.delete_namespace(ns) as u64))
            }
            OP_DELETE_WHERE => {
                // Resolved to ids here and logged as a plain delete: replay removes exactly the
                // memories this request removed.
                let f = decode_delete_where(body)?;
                let ids = self.store.matching_ids(&f, now);
                if ids.is_empty() {
                    return Ok(deleted(0));
                }
                if let Some(p) = self.persist.as_mut() {
                    p.append(&WalOp::Delete(&ids))?;
                }
                Ok(deleted(self.store.delete_present(&ids) as u64))
            }
            OP_CLEAR => {
                if let Some(p) = self.persist.as_mut() {
                    p.append(&WalOp::Clear)?;
                }
                let n = self.store.len();
                self.store.clear();
                Ok(deleted(n as u64))
            }
            _ => unreachable!(),
        }
    }

    fn upsert(&mut self, body: &[u8], now: u64) -> Result<()> {
        let u = UpsertRequest::decode(body, self.dim)?;
        let items = upsert_items(&u, self.dim, now)?;
        self.store.validate_upsert(&items)?;
        if let Err(e) = self.engine.reserve_for(&self.store, &items) {
            if e.status == Status::StoreFull {
                return Err(e); // out of GPU memory: the write is refused, nothing changed
            }
            self.engine_failed(e);
        }
        if let Some(p) = self.persist.as_mut() {
            p.append(&WalOp::Upsert(&items))?;
        }
        self.store.apply_upsert(&items);
        Ok(())
    }
}
