//! One request/response round trip through a slot: claim a free slot, write the request, submit
//! it (ringing the doorbell when the server is parked), wait for the answer within the deadline
//! (spin, then sleep on the slot's futex), read the response and free the slot. A deadline that
//! passes withdraws the request (`abandon`).

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{deadline_after, Kalos};
use crate::config::ADAPTIVE_SPIN_CAP;
use crate::error::{Error, Result, Status};
use crate::shm::{self, futex};
use crate::types::non_finite;
use crate::wire::response::error_message;

/// f32 values sent after a request's parts, checked to be finite as they are copied into the
/// slot; an error names `what` and the value's index in the caller's array (`base` + offset).
pub(super) struct Finite<'a> {
    pub(super) v: &'a [f32],
    pub(super) what: &'static str,
    pub(super) base: usize,
}

/// How often a waiting client checks that the server is alive (and not stopped).
const LIVENESS_STEP: Duration = Duration::from_millis(20);
/// The shortest sleep before polling that [`spin_plan`] plans.
const MIN_PRESLEEP: Duration = Duration::from_micros(100);
/// Linux's default timer slack: how late a timed futex wait may end, before any sleep measured.
pub(super) const DEFAULT_TIMER_SLACK: Duration = Duration::from_micros(50);
/// Polling margin on each side of an expected answer beyond its measured spread.
const POLL_MARGIN: Duration = Duration::from_micros(20);

/// The spin window for a handle with `spin_ns` configured and recent answers of `recent_ns`.
fn spin_window(spin_ns: u64, recent_ns: u64) -> Duration {
    if spin_ns == 0 {
        return Duration::ZERO;
    }
    let adaptive = recent_ns.saturating_mul(2).min(ADAPTIVE_SPIN_CAP.as_nanos() as u64);
    Duration::from_nanos(spin_ns.max(adaptive))
}

/// When a waiting client polls, measured from the submit: asleep on the slot's futex until
/// `.0` (the server wakes it if the answer comes sooner), polling until `.1`, then asleep until
/// the answer. Recent answers took `recent_ns` give or take `jitter_ns`, and timed sleeps ended
/// `oversleep_ns` late. A client asleep when its answer comes costs the server a wake-up syscall
/// on its own thread and itself the wake-up's latency; one polling far from its answer holds a
/// CPU that the server and the other clients need (with many clients, more CPUs than the host
/// has). So when the expected answer is far enough off, the client sleeps until shortly before
/// it and polls only across its spread (`2 * jitter_ns + oversleep_ns` + [`POLL_MARGIN`] on each
/// side, at most half of [`ADAPTIVE_SPIN_CAP`]); otherwise it polls from the submit for
/// [`spin_window`]. A client that is `alone` (the server counted no other request in flight;
/// asked only when it matters, a read of the segment header's shared line) also polls from the submit when that window covers the spread: it takes no CPU anyone else
/// waits for, and the timed wake-up of a sleep would interrupt the server's engine threads.
/// `spin_ns` 0 keeps meaning sleep at once, and a configured spin of the cap or more polls from
/// the submit.
fn spin_plan(spin_ns: u64, recent_ns: u64, jitter_ns: u64, oversleep_ns: u64, alone: impl FnOnce() -> bool) -> (Duration, Duration) {
    let window = spin_window(spin_ns, recent_ns);
    let cap = ADAPTIVE_SPIN_CAP.as_nanos() as u64;
    let half = jitter_ns.saturating_mul(2).saturating_add(oversleep_ns).saturating_add(POLL_MARGIN.as_nanos() as u64).min(cap / 2);
    if spin_ns == 0
        || spin_ns >= cap
        || recent_ns < half + MIN_PRESLEEP.as_nanos() as u64
        || (recent_ns + half <= window.as_nanos() as u64 && alone())
    {
        return (Duration::ZERO, window);
    }
    (Duration::from_nanos(recent_ns - half), Duration::from_nanos(recent_ns + half))
}

/// A smoothed value: `old` moved a quarter of the way to `sample` (the sample itself at first).
fn smooth(old: u64, sample: u64) -> u64 {
    if old == 0 {
        sample
    } else {
        old - old / 4 + sample / 4
    }
}

/// How a sleeping phase of a wait ended.
enum Woke {
    /// The answer is in the slot.
    Answered,
    /// The phase's end came first; the sleep ended this late.
    Until(Duration),
    /// The deadline passed or the server is gone: the wait's outcome.
    Finished(Result<()>),
}

thread_local! {
    static RESP: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// `KALOS_CLIENT_TRACE=1`: every batch call prints where its time went to stderr (a tuning aid
/// for the GPU benchmarks, where a batch's client side was once mis-estimated). Read once.
fn trace_batches() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::config::tuning_or_default().client_trace)
}

impl Kalos {
    fn server_gone_reason(&self) -> Option<String> {
        let h = self.seg.header();
        let st = h.server_state.load(Ordering::Acquire);
        if st == shm::SERVER_STOPPED {
            return Some(format!("the server of {:?} shut down", self.name));
        }
        if st == shm::SERVER_DEAD {
            return Some(format!("the server thread of {:?} failed and stopped", self.name));
        }
        let pid = h.server_pid.load(Ordering::Relaxed);
        if !shm::process_alive(pid, h.server_start_ticks.load(Ordering::Relaxed)) {
            return Some(format!("the server process {pid} of {:?} is gone", self.name));
        }
        let hb = h.heartbeat_ms.load(Ordering::Relaxed);
        let now = shm::monotonic_ms();
        if now > hb + self.heartbeat_timeout_ms {
            return Some(format!("the server of {:?} has not sent a heartbeat for {} ms", self.name, now - hb));
        }
        None
    }

    /// One request/response round trip through a slot. `parse` runs on a private copy of the
    /// response body.
    pub(super) fn call<R>(&self, req: &[u8], timeout_ms: Option<u64>, parse: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        self.call_parts(&[req], None, timeout_ms, parse)
    }

    /// `call` with the request given as consecutive parts, written straight into the slot (a
    /// batch's queries are not copied into a request buffer first).
    /// `floats`, when given, follows the parts: values checked to be finite as they are copied
    /// (`Finite`); a non-finite one fails the call with `NON_FINITE` before anything is sent.
    ///
    /// A handle that takes over (role auto, durable store) sends the call to the new server when
    /// the old one went away before taking the request (client/mod.rs, "Store lifetime").
    pub(super) fn call_parts<R>(
        &self,
        parts: &[&[u8]],
        floats: Option<Finite<'_>>,
        timeout_ms: Option<u64>,
        parse: impl FnOnce(&[u8]) -> Result<R>,
    ) -> Result<R> {
        if let Some(next) = self.successor() {
            self.check_open()?;
            return next.call_parts(parts, floats, timeout_ms, parse);
        }
        let mut parse = Some(parse);
        let mut not_run = false;
        let r = self.round_trip(parts, floats.as_ref(), timeout_ms, &mut parse, &mut not_run);
        match r {
            Err(e) if e.status == Status::ServerGone && self.takeover.is_some() => {
                let next = self.take_over().map_err(|t| {
                    Error::new(t.status, format!("{}; taking the store over from its files failed: {}", e.message, t.message))
                })?;
                match parse.take() {
                    Some(parse) if not_run => next.call_parts(parts, floats, timeout_ms, parse),
                    _ => Err(Error::new(
                        Status::ServerGone,
                        format!(
                            "{} while it held the request (it may have taken effect); later calls go to the store's new server",
                            e.message
                        ),
                    )),
                }
            }
            r => r,
        }
    }

    /// One round trip on this handle's segment. `not_run` is set when the call fails because
    /// the server went away before it took the request; `parse` is taken only when it runs.
    fn round_trip<R, P: FnOnce(&[u8]) -> Result<R>>(
        &self,
        parts: &[&[u8]],
        floats: Option<&Finite<'_>>,
        timeout_ms: Option<u64>,
        parse: &mut Option<P>,
        not_run: &mut bool,
    ) -> Result<R> {
        self.check_open()?;
        let req_len: usize = parts.iter().map(|p| p.len()).sum::<usize>() + floats.as_ref().map_or(0, |f| f.v.len() * 4);
        if req_len > self.seg.data_bytes() {
            return Err(Error::new(
                Status::TooLarge,
                format!("request of {req_len} bytes exceeds the slot size of {} bytes (option slot_bytes)", self.seg.data_bytes()),
            ));
        }
        let t_start = (floats.is_some() && trace_batches()).then(Instant::now);
        let deadline = deadline_after(timeout_ms.unwrap_or(self.timeout_ms));
        let (slot_i, word) = self.claim(deadline).inspect_err(|e| *not_run = e.status == Status::ServerGone)?;
        let slot = self.seg.slot(slot_i);
        slot.client_start_ticks.store(self.start_ticks, Ordering::Relaxed);
        slot.req_len.store(req_len as u32, Ordering::Relaxed);
        let mut off = 0;
        for p in parts {
            self.seg.write_data(slot_i, off, p);
            off += p.len();
        }
        if let Some(f) = floats {
            if let Err(i) = self.seg.write_finite_f32(slot_i, off, f.v) {
                // Give the slot back unsubmitted (the same claim, state FREE).
                slot.free_if(word);
                return Err(non_finite(f.what, f.v[i], f.base + i));
            }
        }
        let submitted = shm::with_state(word, shm::SLOT_SUBMITTED);
        if slot.state.compare_exchange(word, submitted, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            return Err(Error::new(Status::Internal, "request slot was reclaimed while being written"));
        }
        let t_submitted = t_start.map(|_| Instant::now());
        let h = self.seg.header();
        if h.server_parked.load(Ordering::SeqCst) != 0 {
            h.doorbell.fetch_add(1, Ordering::SeqCst);
            futex::wake(&h.doorbell, 1);
        }
        self.wait_done(slot_i, submitted, deadline, not_run)?;
        let t_answered = t_start.map(|_| Instant::now());
        let status = Status::from_u32(slot.status.load(Ordering::Acquire));
        let len = (slot.resp_len.load(Ordering::Acquire) as usize).min(self.seg.data_bytes());
        RESP.with(|r| {
            let mut buf = r.borrow_mut();
            self.seg.read_data(slot_i, &mut buf, len);
            // Release the slot (same claim, state FREE, pid cleared).
            slot.free_if(shm::with_state(submitted, shm::SLOT_DONE));
            if status != Status::Ok {
                // A stopping server answers the requests it had not run with SERVER_GONE.
                *not_run = status == Status::ServerGone;
                return Err(Error::new(status, error_message(&buf)));
            }
            let t_read = t_start.map(|_| Instant::now());
            let parse = parse.take().ok_or_else(|| Error::new(Status::Internal, "response parsed twice"))?;
            let r = parse(&buf);
            if let (Some(t0), Some(t1), Some(t2), Some(t3)) = (t_start, t_submitted, t_answered, t_read) {
                let us = |d: Duration| d.as_secs_f64() * 1e6;
                eprintln!(
                    "kalos client trace: {req_len} B batch request: claim + checked copy {:.1} us, submit -> answer {:.1} us, response read {:.1} us, parsed {:.1} us",
                    us(t1 - t0),
                    us(t2 - t1),
                    us(t3 - t2),
                    us(t3.elapsed())
                );
            }
            r
        })
    }

    fn claim(&self, deadline: Instant) -> Result<(usize, u64)> {
        let n = self.seg.slot_count();
        let mut spins = 0u32;
        loop {
            let start = self.next_slot.fetch_add(1, Ordering::Relaxed);
            for j in 0..n {
                let i = (start + j) % n;
                let slot = self.seg.slot(i);
                let w = slot.state.load(Ordering::Relaxed);
                if shm::state_of(w) == shm::SLOT_FREE {
                    let claimed = shm::pack(self.pid, shm::gen_of(w) + 1, shm::SLOT_CLAIMED);
                    if slot.state.compare_exchange(w, claimed, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                        return Ok((i, claimed));
                    }
                }
            }
            if let Some(reason) = self.server_gone_reason() {
                return Err(Error::new(Status::ServerGone, reason));
            }
            if Instant::now() >= deadline {
                return Err(Error::new(Status::Timeout, format!("all {n} request slots stayed busy until the deadline")));
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 128 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    fn wait_done(&self, slot_i: usize, submitted: u64, deadline: Instant, not_run: &mut bool) -> Result<()> {
        let slot = self.seg.slot(slot_i);
        let done = shm::with_state(submitted, shm::SLOT_DONE);
        let t0 = Instant::now();
        let (sleep, spin) = spin_plan(
            self.spin_ns,
            self.recent_ns.load(Ordering::Relaxed),
            self.jitter_ns.load(Ordering::Relaxed),
            self.oversleep_ns.load(Ordering::Relaxed),
            || self.seg.header().active_clients.load(Ordering::Relaxed) <= 1,
        );
        // Smoothed answer time and its deviation (1/4 of the new sample): only completed waits
        // update them.
        let note = |t0: Instant| {
            let e = crate::types::nanos(t0.elapsed());
            let r = self.recent_ns.load(Ordering::Relaxed);
            self.recent_ns.store(smooth(r, e), Ordering::Relaxed);
            if r != 0 {
                self.jitter_ns.store(smooth(self.jitter_ns.load(Ordering::Relaxed), e.abs_diff(r)), Ordering::Relaxed);
            }
        };
        if !sleep.is_zero() {
            match self.sleep_phase(slot_i, submitted, Some(t0 + sleep), deadline, not_run) {
                Woke::Answered => {
                    note(t0);
                    return Ok(());
                }
                Woke::Finished(r) => return r,
                Woke::Until(late) => {
                    let late = crate::types::nanos(late);
                    self.oversleep_ns.store(smooth(self.oversleep_ns.load(Ordering::Relaxed), late), Ordering::Relaxed);
                }
            }
        }
        // The spin is part of the wait: it never outlasts the deadline.
        let spin = spin.min(deadline.saturating_duration_since(t0));
        if spin > sleep {
            // Busy-wait for the first few microseconds (a warm server answers a small request in
            // about a microsecond), then keep polling but yield the CPU between polls: when the
            // machine has fewer free cores than spinners, a pure spin would hold the core the
            // server needs for the rest of its time slice.
            let hot = Duration::from_nanos(self.spin_ns.min(5_000));
            // A long spin checks the server's liveness as the sleeping wait does, every 20 ms.
            let mut check = LIVENESS_STEP;
            let mut i = 0u32;
            loop {
                if slot.state.load(Ordering::Acquire) == done {
                    note(t0);
                    return Ok(());
                }
                i = i.wrapping_add(1);
                if i.is_multiple_of(32) {
                    let e = t0.elapsed();
                    if e >= spin {
                        break;
                    }
                    if e >= check {
                        check = e + LIVENESS_STEP;
                        if let Some(reason) = self.server_gone_reason() {
                            return self.withdraw_gone(slot_i, submitted, reason, not_run);
                        }
                    }
                    if e >= hot {
                        std::thread::yield_now();
                        continue;
                    }
                }
                std::hint::spin_loop();
            }
        }
        loop {
            match self.sleep_phase(slot_i, submitted, None, deadline, not_run) {
                Woke::Answered => {
                    note(t0);
                    return Ok(());
                }
                Woke::Finished(r) => return r,
                Woke::Until(_) => {}
            }
        }
    }

    /// Sleeps on the slot's futex until the answer, the deadline, the server's end, or `until`
    /// (None: no such end). The `waiting` flag asks the server for a wake-up while it sleeps.
    fn sleep_phase(&self, slot_i: usize, submitted: u64, until: Option<Instant>, deadline: Instant, not_run: &mut bool) -> Woke {
        let slot = self.seg.slot(slot_i);
        let done = shm::with_state(submitted, shm::SLOT_DONE);
        loop {
            slot.waiting.store(shm::waiting_tag(submitted), Ordering::SeqCst);
            let w = slot.state.load(Ordering::SeqCst);
            if w == done {
                slot.waiting.store(0, Ordering::Relaxed);
                return Woke::Answered;
            }
            let now = Instant::now();
            if now >= deadline {
                slot.waiting.store(0, Ordering::Relaxed);
                return Woke::Finished(self.abandon(slot_i, submitted));
            }
            if let Some(u) = until.filter(|&u| now >= u) {
                slot.waiting.store(0, Ordering::Relaxed);
                return Woke::Until(now - u);
            }
            let step = until.map_or(deadline, |u| u.min(deadline)) - now;
            futex::wait(shm::low_word(&slot.state), w as u32, step.min(LIVENESS_STEP));
            // A wait that ran to its planned end goes on without a liveness check (the polling
            // and the next sleep make them); any other wake-up without the answer checks.
            if slot.state.load(Ordering::Acquire) != done && until.is_none_or(|u| Instant::now() < u) {
                if let Some(reason) = self.server_gone_reason() {
                    slot.waiting.store(0, Ordering::Relaxed);
                    return Woke::Finished(self.withdraw_gone(slot_i, submitted, reason, not_run));
                }
            }
        }
    }

    /// The server is gone or stopped: withdraw the request as at a deadline (a stopped server
    /// that is continued later must not answer into a slot nobody reads), then report
    /// SERVER_GONE, unless the answer landed meanwhile.
    /// `not_run` is set when the request was withdrawn before the server took it.
    fn withdraw_gone(&self, slot_i: usize, submitted: u64, reason: String, not_run: &mut bool) -> Result<()> {
        if self.seg.slot(slot_i).free_if(submitted) {
            *not_run = true;
            return Err(Error::new(Status::ServerGone, reason));
        }
        match self.abandon(slot_i, submitted) {
            Ok(()) => Ok(()),
            Err(_) => Err(Error::new(Status::ServerGone, reason)),
        }
    }

    /// Deadline passed: withdraw the request so its slot is recycled and no later result can
    /// reach this caller. If the result landed in the meantime, take it.
    fn abandon(&self, slot_i: usize, submitted: u64) -> Result<()> {
        let slot = self.seg.slot(slot_i);
        if slot.free_if(submitted) {
            return Err(Error::new(Status::Timeout, "deadline passed before the server took the request (it did not run)"));
        }
        let processing = shm::with_state(submitted, shm::SLOT_PROCESSING);
        let abandoned = shm::with_state(submitted, shm::SLOT_ABANDONED);
        if slot.state.compare_exchange(processing, abandoned, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            return Err(Error::new(Status::Timeout, "deadline passed while the server was running the request (it may have taken effect)"));
        }
        if slot.state.load(Ordering::Acquire) == shm::with_state(submitted, shm::SLOT_DONE) {
            return Ok(());
        }
        Err(Error::new(Status::Timeout, "deadline passed and the request slot was reclaimed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spin_window_stretches_to_recent_answers_within_the_cap() {
        assert_eq!(spin_window(0, 80_000), Duration::ZERO, "0 keeps meaning sleep at once");
        assert_eq!(spin_window(50_000, 0), Duration::from_micros(50));
        assert_eq!(spin_window(50_000, 10_000), Duration::from_micros(50));
        assert_eq!(spin_window(50_000, 60_000), Duration::from_micros(120));
        assert_eq!(spin_window(50_000, 10_000_000), ADAPTIVE_SPIN_CAP);
        assert_eq!(spin_window(2_000_000, 10_000_000), Duration::from_millis(2), "a longer configured spin wins");
    }

    #[test]
    fn spin_plan_polls_across_the_expected_answers_spread() {
        let us = Duration::from_micros;
        let slack = DEFAULT_TIMER_SLACK.as_nanos() as u64;
        // Short answers: poll from the submit, as spin_window says.
        assert_eq!(spin_plan(50_000, 0, 0, slack, || false), (Duration::ZERO, us(50)));
        assert_eq!(spin_plan(50_000, 160_000, 0, slack, || false), (Duration::ZERO, us(320)), "a sleep under MIN_PRESLEEP is not planned");
        // Longer answers: asleep until the spread (2 jitter + oversleep + margin) before the
        // expected answer, polling until as far after it.
        assert_eq!(spin_plan(50_000, 400_000, 0, slack, || false), (us(330), us(470)));
        assert_eq!(spin_plan(50_000, 1_250_000, 10_000, 30_000, || false), (us(1180), us(1320)));
        assert_eq!(spin_plan(50_000, 30_000_000, 0, slack, || false), (us(29_930), us(30_070)));
        // A wide spread is capped at half of ADAPTIVE_SPIN_CAP a side; near the submit, polling
        // starts at the submit.
        assert_eq!(spin_plan(50_000, 1_250_000, 400_000, slack, || false), (us(1000), us(1500)));
        assert_eq!(spin_plan(50_000, 300_000, 100_000, slack, || false), (Duration::ZERO, ADAPTIVE_SPIN_CAP));
        // 0 keeps meaning sleep at once; a configured spin of the cap or more polls from the submit.
        assert_eq!(spin_plan(0, 1_250_000, 0, slack, || false), (Duration::ZERO, Duration::ZERO));
        assert_eq!(spin_plan(2_000_000, 10_000_000, 0, slack, || false), (Duration::ZERO, us(2000)));
        assert_eq!(spin_plan(500_000, 10_000_000, 0, slack, || false), (Duration::ZERO, us(500)));
        // Alone, a client polls from the submit where the window covers the spread after the
        // expected answer, and sleeps before it where the window ends sooner. The header is read
        // only then: not for short answers, nor where the window cannot cover the answer.
        let unasked = || -> bool { unreachable!("the server's count read where it cannot matter") };
        assert_eq!(spin_plan(50_000, 20_000, 0, slack, unasked), (Duration::ZERO, us(50)));
        assert_eq!(spin_plan(50_000, 1_250_000, 0, slack, unasked), (us(1180), us(1320)));
        assert_eq!(spin_plan(50_000, 245_000, 5_000, slack, || true), (Duration::ZERO, us(490)));
        assert_eq!(spin_plan(50_000, 400_000, 0, slack, || true), (Duration::ZERO, us(500)));
        assert_eq!(spin_plan(50_000, 450_000, 0, slack, || true), (us(380), us(520)));
        assert_eq!(spin_plan(50_000, 1_250_000, 10_000, 30_000, || true), (us(1180), us(1320)));
    }

    #[test]
    fn smoothing_starts_at_the_first_sample_and_moves_a_quarter() {
        assert_eq!(smooth(0, 800), 800);
        assert_eq!(smooth(800, 400), 700);
        assert_eq!(smooth(800, 800), 800);
    }
}
