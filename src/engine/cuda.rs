//! CUDA engine (not built yet): reports that it is unavailable.

use super::Engine;
use crate::client::Options;
use crate::error::{Error, Result, Status};
use crate::store::Store;

/// Creates the CUDA engine on the calling (server) thread, or says why it cannot.
pub fn create(_opts: &Options, _store: &Store) -> Result<Box<dyn Engine>> {
    Err(Error::new(Status::BackendUnavailable, "the CUDA engine is not built into this version"))
}
