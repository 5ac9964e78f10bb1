//! Answering requests: a response body is written into the request's slot (unless an engine or
//! the recall path already put it there), the slot is marked DONE and a sleeping client is woken.
//! A slot whose client gave up meanwhile is released instead.

use std::sync::atomic::Ordering;

use super::serve::Pending;
use super::Server;
use crate::error::{Result, Status};
use crate::shm::{self, futex, Segment};
use crate::wire::response::error_body;
use crate::wire::OP_RECALL;

/// A request's answer: a body to copy into the slot, or the length of one already written
/// there (by an engine for a lone recall, `SearchRequest::direct`, or by `do_recalls`).
#[derive(Clone)]
pub(super) enum Reply {
    Body(Status, Vec<u8>),
    InSlot(usize),
    /// Handed to the cluster layer, which answers it (`cluster::SlotReply`).
    Handed,
}

impl Reply {
    /// The error response for `status` and `message`.
    pub(super) fn error(status: Status, message: impl Into<String>) -> Reply {
        Reply::Body(status, error_body(message))
    }
}

pub(super) fn encode_result(r: Result<Vec<u8>>) -> Reply {
    match r {
        Ok(b) => Reply::Body(Status::Ok, b),
        Err(e) => Reply::error(e.status, e.message),
    }
}

/// The TOO_LARGE message for a response of `len` bytes.
pub(super) fn too_large(len: usize, cap: usize) -> Vec<u8> {
    error_body(format!("response of {len} bytes exceeds the slot size of {cap} bytes (option slot_bytes)"))
}

/// Writes `body` into slot `slot_i` as the answer to the request `word` and publishes it
/// ([`finish_in`]); from any thread that owns the request. Returns whether a client was woken.
pub(super) fn publish_to(seg: &Segment, slot_i: usize, word: u64, status: Status, body: &[u8]) -> bool {
    let slot = seg.slot(slot_i);
    let (status, body): (Status, std::borrow::Cow<[u8]>) = if body.len() > seg.data_bytes() {
        (Status::TooLarge, too_large(body.len(), seg.data_bytes()).into())
    } else {
        (status, body.into())
    };
    // Only write into the slot while it is still this request's (the client may have
    // abandoned it; a reclaimed slot may belong to someone else now).
    if slot.state.load(Ordering::Acquire) != word {
        release_abandoned(seg, slot_i, word);
        return false;
    }
    seg.write_data(slot_i, 0, &body);
    finish_in(seg, slot_i, word, status, body.len())
}

/// Publishes the response whose `len`-byte body is already in the slot's data area (written
/// by `publish_to`, or by the engine itself) and wakes the client if it sleeps (returns whether
/// it did). A slot the client abandoned meanwhile is released instead.
fn finish_in(seg: &Segment, slot_i: usize, word: u64, status: Status, len: usize) -> bool {
    let slot = seg.slot(slot_i);
    slot.resp_len.store(len as u32, Ordering::Relaxed);
    slot.status.store(status as u32, Ordering::Relaxed);
    let done = shm::with_state(word, shm::SLOT_DONE);
    if slot.state.compare_exchange(word, done, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        release_abandoned(seg, slot_i, word);
        return false;
    }
    // Only this request's waiter: the flag may already belong to the slot's next request.
    if slot.waiting.compare_exchange(shm::waiting_tag(word), 0, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
        futex::wake(shm::low_word(&slot.state), i32::MAX);
        return true;
    }
    false
}

fn release_abandoned(seg: &Segment, slot_i: usize, word: u64) {
    let slot = seg.slot(slot_i);
    let ab = shm::with_state(word, shm::SLOT_ABANDONED);
    slot.free_if(ab);
}

impl Server {
    /// Publishes every answer of `batch` (`results`, in the same order; the batch took
    /// `elapsed_ns`), counts it for stats, and keeps the request buffers for the next batches.
    /// Returns how many sleeping clients it woke.
    pub(super) fn publish_batch(&mut self, batch: Vec<Pending>, results: Vec<Option<Reply>>, elapsed_ns: u64) -> u32 {
        let mut woken = 0u32;
        for (p, r) in batch.into_iter().zip(results) {
            let r = r.unwrap_or_else(|| Reply::error(Status::Internal, "no result"));
            let st = match &r {
                Reply::Body(st, _) => *st,
                Reply::InSlot(_) | Reply::Handed => Status::Ok,
            };
            self.metrics.requests += 1;
            self.metrics.count(p.op(), st, elapsed_ns);
            if st != Status::Ok {
                self.metrics.errors += 1;
            }
            // The p50/p99 in stats describe recalls (what clients wait on); writes and stats
            // requests would otherwise dominate after a bulk load.
            if p.op() == OP_RECALL {
                self.metrics.record_latency(elapsed_ns);
            }
            let woke = match r {
                Reply::Body(st, body) => self.publish(p.slot, p.word, st, &body),
                Reply::InSlot(len) => self.finish(p.slot, p.word, Status::Ok, len),
                Reply::Handed => false,
            };
            woken += u32::from(woke);
            let mut buf = p.req;
            buf.clear();
            // (A request copied into the mirror leaves an empty vector: nothing to pool.)
            if buf.capacity() > 0 && self.free_bufs.len() < 256 {
                self.free_bufs.push(buf);
            }
        }
        woken
    }

    /// Publishes one answer; returns whether it woke a sleeping client.
    fn publish(&self, slot_i: usize, word: u64, status: Status, body: &[u8]) -> bool {
        let woke = publish_to(&self.seg, slot_i, word, status, body);
        if woke {
            self.woke_client.set(true);
        }
        woke
    }

    /// Publishes an answer already in its slot; returns whether it woke a sleeping client.
    fn finish(&self, slot_i: usize, word: u64, status: Status, len: usize) -> bool {
        let woke = finish_in(&self.seg, slot_i, word, status, len);
        if woke {
            self.woke_client.set(true);
        }
        woke
    }

    /// The server stops (`status` SERVER_GONE) or its thread panicked (PANIC): answers every
    /// request it holds or that waits in a slot, and wakes every sleeper.
    pub(super) fn fail_all_pending(&mut self, status: Status) {
        let msg = error_body(if status == Status::Panic { "the server thread panicked and stopped" } else { "the server shut down" });
        let batch = std::mem::take(&mut self.batch);
        for p in batch {
            self.publish(p.slot, p.word, status, &msg);
        }
        // Requests submitted but never taken: answer them too, and wake every sleeper.
        let seg = self.seg.clone();
        for i in 0..seg.slot_count() {
            let slot = seg.slot(i);
            let w = slot.state.load(Ordering::Acquire);
            if shm::state_of(w) == shm::SLOT_SUBMITTED {
                let p = shm::with_state(w, shm::SLOT_PROCESSING);
                if slot.state.compare_exchange(w, p, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    self.publish(i, p, status, &msg);
                }
            }
            futex::wake(shm::low_word(&slot.state), i32::MAX);
        }
    }
}
