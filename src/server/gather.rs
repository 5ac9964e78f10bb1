//! The gathering window: when fewer requests are in hand than clients were recently active, the
//! server waits a little for the others, so that concurrent single requests share one pass over
//! the table (the CUDA engine's multi-query pass reads the table once for up to
//! `KALOS_MULTI_MAXQ` queries, the batch path once per tile for more).
//!
//! A client is a process id seen in a slot's state word, with a width: the most requests it had
//! in one batch (threads of one process share a pid). A lone client never waits for company: it
//! is the only one active, so the batch in hand is already complete. The window is at most
//! `KALOS_GATHER_US` and at most an eighth of a recent pass, so a pass that would have cost
//! little is not delayed by much.

use std::time::{Duration, Instant};

/// Default of `KALOS_GATHER_US`. Long enough for a client woken from its futex to send its next
/// request (about 130 µs on a 2-vCPU VM); for passes under 2 ms the eighth of a pass binds first.
pub(super) const DEFAULT_GATHER_US: u64 = 250;
/// A client counts as active this long after its last request, or 8 passes when longer.
const ACTIVE: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy)]
struct Client {
    pid: u32,
    width: u32,
    seen: Instant,
}

#[derive(Debug)]
pub(super) struct Gather {
    max: Duration,
    /// Smoothed duration of a batch (1/8 of each new sample), ns.
    pass_ns: u64,
    clients: Vec<Client>,
}

impl Gather {
    pub(super) fn new(max_us: u64) -> Gather {
        Gather { max: Duration::from_micros(max_us), pass_ns: 0, clients: Vec::new() }
    }

    fn active_for(&self) -> Duration {
        ACTIVE.max(Duration::from_nanos(self.pass_ns.saturating_mul(8)))
    }

    /// Records the pids of one batch's requests.
    pub(super) fn note_batch(&mut self, pids: impl Iterator<Item = u32>, now: Instant) {
        let active = self.active_for();
        self.clients.retain(|c| now.duration_since(c.seen) < active);
        let mut counts: Vec<(u32, u32)> = Vec::new();
        for pid in pids {
            match counts.iter_mut().find(|e| e.0 == pid) {
                Some(e) => e.1 += 1,
                None => counts.push((pid, 1)),
            }
        }
        for (pid, n) in counts {
            match self.clients.iter_mut().find(|c| c.pid == pid) {
                Some(c) => {
                    c.width = c.width.max(n);
                    c.seen = now;
                }
                None => self.clients.push(Client { pid, width: n, seen: now }),
            }
        }
    }

    /// Records how long a batch took.
    pub(super) fn note_pass(&mut self, d: Duration) {
        let ns = crate::types::nanos(d);
        self.pass_ns = if self.pass_ns == 0 { ns } else { self.pass_ns - self.pass_ns / 8 + ns / 8 };
    }

    /// How many requests the active clients may have in flight at once.
    pub(super) fn expected(&self, now: Instant) -> usize {
        let active = self.active_for();
        self.clients.iter().filter(|c| now.duration_since(c.seen) < active).map(|c| c.width as usize).sum()
    }

    /// How long to wait for more requests while `have` are in hand (zero: do not wait).
    pub(super) fn window(&self, have: usize, now: Instant) -> Duration {
        if self.max.is_zero() || have >= self.expected(now) {
            return Duration::ZERO;
        }
        self.max.min(Duration::from_nanos(self.pass_ns / 8))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_client_never_waits() {
        let mut g = Gather::new(50);
        let t = Instant::now();
        g.note_pass(Duration::from_micros(400));
        for i in 0..10 {
            g.note_batch([7u32].into_iter(), t + Duration::from_micros(400 * i));
        }
        assert_eq!(g.expected(t + Duration::from_millis(4)), 1);
        assert_eq!(g.window(1, t + Duration::from_millis(4)), Duration::ZERO);
    }

    #[test]
    fn concurrent_clients_wait_at_most_an_eighth_of_a_pass_and_the_setting() {
        let mut g = Gather::new(50);
        let t = Instant::now();
        g.note_pass(Duration::from_micros(320));
        g.note_batch([1u32, 2, 3].into_iter(), t);
        g.note_batch([4u32, 4].into_iter(), t);
        assert_eq!(g.expected(t), 5, "three clients and one of width 2");
        assert_eq!(g.window(2, t), Duration::from_micros(40));
        assert_eq!(g.window(5, t), Duration::ZERO, "everyone is in hand");
        g.note_pass(Duration::from_millis(100));
        assert_eq!(g.window(2, t), Duration::from_micros(50), "capped by KALOS_GATHER_US");
        // Clients that went quiet stop counting.
        assert_eq!(g.expected(t + Duration::from_secs(10)), 0);
        // Zero turns gathering off.
        let mut off = Gather::new(0);
        off.note_pass(Duration::from_millis(1));
        off.note_batch([1u32, 2].into_iter(), t);
        assert_eq!(off.window(1, t), Duration::ZERO);
    }

    #[test]
    fn short_passes_barely_wait() {
        let mut g = Gather::new(50);
        let t = Instant::now();
        g.note_pass(Duration::from_micros(16));
        g.note_batch([1u32, 2].into_iter(), t);
        assert_eq!(g.window(1, t), Duration::from_micros(2));
    }
}
