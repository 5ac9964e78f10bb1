//! `KALOS_SERVER_REPORT=1`: where the server thread's time goes between and within passes,
//! printed to stderr when the server stops, by the number of requests a pass took (a tuning aid
//! for the many-clients benchmark, `tests/gpu/concurrency.py`).

use crate::types::nanos;
use std::time::Instant;

/// Passes kept (the first ones; a benchmark's server runs far fewer).
const KEEP: usize = 1 << 20;

/// One pass: how many requests it took and its phases, ns.
#[derive(Clone, Copy)]
struct Pass {
    n: u32,
    /// From the end of the previous pass's publish to the collect that found this pass's first
    /// request (the server spinning or parked; clients waking and sending).
    idle: u64,
    /// The gathering window spent waiting for more requests.
    gather: u64,
    /// Writes, recalls and other reads (the engine's time is in here).
    run: u64,
    /// Writing responses into slots, marking them done and waking sleeping clients.
    publish: u64,
    woken: u32,
}

/// The passes of one server, when the report is asked for.
pub(super) struct PassReport {
    passes: Vec<Pass>,
    last_end: Option<Instant>,
}

impl PassReport {
    /// A report when `KALOS_SERVER_REPORT` is on.
    pub(super) fn from_tuning() -> Option<PassReport> {
        crate::config::tuning_or_default().server_report.then(|| PassReport { passes: Vec::new(), last_end: None })
    }

    /// Records a pass: its first request was found at `found`, its gathering ended at
    /// `gathered`, its run at `ran` and its publish at `end`.
    pub(super) fn note(&mut self, n: usize, found: Instant, gathered: Instant, ran: Instant, end: Instant, woken: u32) {
        let idle = self.last_end.map_or(0, |e| nanos(found.saturating_duration_since(e)));
        self.last_end = Some(end);
        if self.passes.len() < KEEP {
            self.passes.push(Pass {
                n: n.min(u32::MAX as usize) as u32,
                idle,
                gather: nanos(gathered - found),
                run: nanos(ran - gathered),
                publish: nanos(end - ran),
                woken,
            });
        }
    }

    /// The report's lines: per pass size seen in at least 20 passes, the p50 of each phase.
    pub(super) fn lines(&self) -> Vec<String> {
        let mut sizes: Vec<u32> = self.passes.iter().map(|p| p.n).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut out = Vec::new();
        for n in sizes {
            let of: Vec<&Pass> = self.passes.iter().filter(|p| p.n == n).collect();
            if of.len() < 20 {
                continue;
            }
            let p50 = |f: &dyn Fn(&Pass) -> u64| {
                let mut v: Vec<u64> = of.iter().map(|p| f(p)).collect();
                v.sort_unstable();
                v[v.len() / 2] as f64 / 1000.0
            };
            let woken = of.iter().map(|p| p.woken as u64).sum::<u64>() as f64 / of.len() as f64;
            out.push(format!(
                "kalos server: {} passes of {} requests, p50 us: idle before {:.1}, gather {:.1}, run {:.1}, publish {:.1} (woke {:.1} sleeping clients a pass)",
                of.len(),
                n,
                p50(&|p| p.idle),
                p50(&|p| p.gather),
                p50(&|p| p.run),
                p50(&|p| p.publish),
                woken
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_reported_by_pass_size() {
        let mut r = PassReport { passes: Vec::new(), last_end: None };
        let t = Instant::now();
        let us = std::time::Duration::from_micros;
        for i in 0..30u64 {
            let found = t + us(1000 * i);
            r.note(4, found, found + us(10), found + us(500), found + us(520), 3);
        }
        for i in 0..5u64 {
            let found = t + us(100_000 + 1000 * i);
            r.note(1, found, found, found + us(400), found + us(401), 0);
        }
        let lines = r.lines();
        assert_eq!(lines.len(), 1, "sizes seen in fewer than 20 passes are left out: {lines:?}");
        assert!(
            lines[0].contains("30 passes of 4 requests")
                && lines[0].contains("idle before 480.0")
                && lines[0].contains("gather 10.0")
                && lines[0].contains("run 490.0")
                && lines[0].contains("publish 20.0")
                && lines[0].contains("woke 3.0"),
            "{}",
            lines[0]
        );
    }
}
