//! A raw slot round trip shared by the tests that play a hostile client (tests/protocol.rs,
//! tests/filter.rs, and the `server` target of tests/fuzz/targets.rs): a request written into a
//! free slot with no client-side check.

/// Sends `req` through the first free slot of `seg` from slot `first` on, claiming `claimed`
/// bytes, as a hostile client could (nothing is checked), and waits for the answer:
/// (status, body).
pub fn raw_call(seg: &kalos::shm::Segment, first: usize, req: &[u8], claimed: u32) -> (u32, Vec<u8>) {
    use kalos::shm;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    let t0 = Instant::now();
    loop {
        for j in 0..seg.slot_count() {
            let i = (first + j) % seg.slot_count();
            let slot = seg.slot(i);
            let w = slot.state.load(Ordering::Acquire);
            if shm::state_of(w) != shm::SLOT_FREE {
                continue;
            }
            let claimed_word = shm::pack(std::process::id(), shm::gen_of(w) + 1, shm::SLOT_CLAIMED);
            if slot.state.compare_exchange(w, claimed_word, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                continue;
            }
            seg.write_data(i, 0, req);
            slot.req_len.store(claimed, Ordering::Relaxed);
            let sub = shm::with_state(claimed_word, shm::SLOT_SUBMITTED);
            slot.state.store(sub, Ordering::SeqCst);
            let h = seg.header();
            if h.server_parked.load(Ordering::SeqCst) != 0 {
                h.doorbell.fetch_add(1, Ordering::SeqCst);
                shm::futex::wake(&h.doorbell, 1);
            }
            let done = shm::with_state(sub, shm::SLOT_DONE);
            let t1 = Instant::now();
            while slot.state.load(Ordering::Acquire) != done {
                assert!(t1.elapsed() < Duration::from_secs(10), "the server stopped answering");
                std::thread::yield_now();
            }
            let st = slot.status.load(Ordering::Acquire);
            let mut body = Vec::new();
            seg.read_data(i, &mut body, slot.resp_len.load(Ordering::Acquire) as usize);
            slot.state.store(shm::pack(0, shm::gen_of(sub), shm::SLOT_FREE), Ordering::SeqCst);
            return (st, body);
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no free slot");
        std::thread::yield_now();
    }
}
