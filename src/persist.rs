//! Durability: write-ahead log + snapshots in a data directory (placeholder interface).

use std::path::Path;

use crate::error::{Error, Result, Status};
use crate::store::{Store, UpsertItem};
use crate::types::{Metric, SyncPolicy};

#[derive(Debug, Clone)]
pub struct PersistOptions {
    pub sync: SyncPolicy,
    pub sync_interval_ms: u64,
}

/// One logged mutation.
pub enum WalOp<'a> {
    Upsert(&'a [UpsertItem<'a>]),
    Delete(&'a [u64]),
    DeleteNamespace(u64),
    Clear,
}

/// What recovery found.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    pub snapshot_rows: u64,
    pub records_replayed: u64,
    /// Set when a torn tail was truncated: names the file, offset and bytes dropped.
    pub torn_tail: Option<String>,
}

pub struct Persist {
    _private: (),
}

impl Persist {
    /// Locks `dir`, loads the latest snapshot and replays the log into `store`.
    pub fn open(_dir: &Path, _dim: usize, _metric: Metric, _opts: &PersistOptions, _store: &mut Store) -> Result<(Persist, Recovery)> {
        Err(Error::new(Status::InvalidArgument, "persistence is not implemented yet"))
    }
    /// Appends one record (buffered until `commit`).
    pub fn append(&mut self, _op: &WalOp<'_>) -> Result<()> {
        Ok(())
    }
    /// Makes every appended record durable according to the sync policy (group commit).
    pub fn commit(&mut self) -> Result<()> {
        Ok(())
    }
    /// Periodic work when idle: interval fsync, snapshot + log compaction when the log is large.
    pub fn tick(&mut self, _store: &Store) -> Result<()> {
        Ok(())
    }
}
