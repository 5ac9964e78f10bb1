//! GET: memories by id, all or nothing. LIST: the ids that match a filter, a page at a time.

use super::Server;
use crate::error::{Error, Result, Status};
use crate::types::now_unix_ms;
use crate::wire::request::{decode_ids, ListRequest};
use crate::wire::response::{list_fit, list_reply, write_record};
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

    /// One page of ids in ascending order (see [`crate::store::Store::list_ids`]). A limit
    /// whose reply would not fit the slot is refused.
    pub(super) fn do_list(&self, body: &[u8]) -> Result<Vec<u8>> {
        let req = ListRequest::decode(body)?;
        let fit = list_fit(self.seg.data_bytes());
        if req.limit > fit {
            return Err(Error::new(
                Status::InvalidArgument,
                format!("list limit {} exceeds the {fit} ids a reply holds in this store's slots", req.limit),
            ));
        }
        let (ids, remaining) = self.store.list_ids(&req.filter, now_unix_ms(), req.after, req.limit);
        Ok(list_reply(&ids, remaining))
    }
}
