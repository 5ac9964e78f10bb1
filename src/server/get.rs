//! GET: memories by id, all or nothing.

use super::Server;
use crate::error::{Error, Result, Status};
use crate::types::now_unix_ms;
use crate::wire::request::decode_ids;
use crate::wire::response::write_record;
use crate::wire::Writer;

impl Server {
    pub(super) fn do_get(&self, body: &[u8]) -> Result<Vec<u8>> {
        let ids = decode_ids(body)?;
        self.store.check_ids_exist(&ids)?;
        // An expired memory is gone for readers even before housekeeping reclaims its row.
        let now = now_unix_ms();
        for &id in &ids {
            let row = self.store.row_of(id).expect("checked");
            if self.store.expires_ms()[row] <= now {
                return Err(Error::new(Status::NotFound, format!("id {id} has expired")));
            }
        }
        let mut w = Writer::new();
        for id in ids {
            write_record(&mut w, &self.store.get(id).expect("checked"));
        }
        Ok(w.buf)
    }
}
