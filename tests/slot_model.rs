//! An exhaustive model of the slot protocol: every interleaving of the atomic steps of two
//! clients and the server thread on one slot, explored state by state.
//!
//! Each client and the server is a small program whose steps are the atomic accesses of
//! `src/client/slot.rs` (claim, write, submit, ring, wait, abandon, read, free),
//! `src/server/serve.rs` (collect, housekeeping's reclaim, park) and `src/server/publish.rs`
//! (publish, finish, release of an abandoned slot), one shared access per step, with
//! `SlotHeader::free_if` as its three steps. The state word is built and taken apart with the
//! crate's own `shm::pack`, `with_state`, `gen_of`, `pid_of` and `state_of`. Between any two
//! steps any party may run next, a client may crash (its process is gone from then on), a
//! deadline may pass, and a later process may reuse a crashed client's pid. The model is
//! sequentially consistent: the orderings each access needs on real hardware are the subject of
//! `tests/memory_model.rs`, `tests/protocol.rs` and the ThreadSanitizer run
//! (docs/RELIABILITY.md).
//!
//! Checked in every reachable state:
//! - a live client that holds the slot (from its claim until it frees or abandons it) finds its
//!   own claim in the state word: no other client, and not the reaper, took it over; so the slot
//!   is never held by two clients at once;
//! - while a client holds the slot and has recorded its start ticks, the slot carries those ticks
//!   (the reaper's protection against a reused pid);
//! - the server writes an answer only into the slot of the claim it answers (never into a slot
//!   that was withdrawn and claimed again), and runs only the request that claim submitted, never
//!   a withdrawn one;
//! - a client reads only its own request's answer; a client told "it did not run" was not run.
//!
//! Checked of the whole graph:
//! - no state is stuck: a state where nobody can move has every client finished or crashed,
//!   the slot FREE and the server asleep (no lost doorbell, no lost wake-up, no slot of a crashed
//!   client left behind);
//! - from every reachable state such a final state can still be reached.
//!
//! Futex waits are modelled without their timeouts (a client sleeps until woken or until its
//! deadline, the server until the doorbell rings or a dead client's slot waits to be reclaimed),
//! so a lost wake-up shows up as a stuck state rather than as a 20 ms or 250 ms delay.
//!
//! `mutants_are_caught` breaks one transition at a time, the way a plausible bug would, and
//! requires the checker to report each one.

use std::collections::{HashMap, VecDeque};

use kalos::shm::{gen_of, pack, pid_of, state_of, waiting_tag, with_state};
use kalos::shm::{SLOT_ABANDONED, SLOT_CLAIMED, SLOT_DONE, SLOT_FREE, SLOT_PROCESSING, SLOT_SUBMITTED};

/// A deliberately broken transition (`None`: the protocol as the code has it).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mutant {
    None,
    /// The reaper frees CLAIMED/SUBMITTED/DONE slots without asking whether the owner lives.
    ReaperIgnoresLiveness,
    /// A withdrawing client frees a PROCESSING slot instead of marking it ABANDONED.
    AbandonFreesProcessing,
    /// `free_if` leaves the previous owner's start ticks in the slot.
    FreeKeepsTicks,
    /// The server parks without re-scanning the slots after announcing that it parks.
    ParkWithoutRescan,
    /// The client reads `server_parked` before it marks its request SUBMITTED.
    RingCheckBeforeSubmit,
    /// The server publishes DONE with a plain store instead of a CAS from PROCESSING.
    FinishWithoutCas,
    /// `free_if` clears the start ticks before it looks at the word.
    FreeClearsUnchecked,
    /// The waiting flag is a plain 1 that the server swaps to 0: finishing a request can then
    /// consume the flag of the slot's next request.
    WaitingWithoutTag,
}

/// Who made a request: (client index, request number, generation of its claim).
type ReqId = (u8, u8, u64);

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum C {
    /// Before request `reqno` (or finished when all are done).
    Start,
    ClaimLoad,
    ClaimCas(u64),
    StoreTicks,
    WriteReq,
    /// A non-finite value found while copying: give the slot back (free_if on the claim).
    BadFreeCheck,
    BadFreeTicks,
    BadFreeCas,
    /// The CAS to SUBMITTED; `Some(parked)` under `RingCheckBeforeSubmit`, which read the flag
    /// before.
    Submit(Option<bool>),
    ReadParked,
    RingBell,
    WakeServer,
    /// The spin: one poll of the state word.
    Spin,
    SetWaiting,
    CheckState,
    ClearWaitingDone,
    ClearWaitingAbandon,
    FutexWait(u32),
    Sleeping(u32),
    /// `abandon`: free_if(submitted), then PROCESSING -> ABANDONED, then a last look for DONE.
    AbFreeCheck,
    AbFreeTicks,
    AbFreeCas,
    AbMark,
    AbCheckDone,
    ReadReply,
    RelFreeCheck,
    RelFreeTicks,
    RelFreeCas,
    Finished,
    Crashed,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Client {
    pc: C,
    /// The claim this client holds (the word its claim CAS stored).
    word: u64,
    reqno: u8,
    /// The deadline of the current request has passed.
    late: bool,
    ticks_stored: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum S {
    Scan,
    Take(u64),
    Copy,
    /// The engine writes a lone recall's answer straight into the slot.
    EngineWrite,
    PubCheck,
    PubWrite,
    PubLenStatus,
    PubCas,
    PubSwapWaiting,
    PubWake,
    RelFreeCheck,
    RelFreeTicks,
    RelFreeCas,
    HouseLoad,
    HouseTicks(u64),
    HouseAlive(u64, u64),
    HouseFreeCheck(u64),
    HouseFreeTicks(u64),
    HouseFreeCas(u64),
    Park,
    ParkBell,
    ParkRescan(u32),
    ParkWait(u32),
    Sleeping(u32),
    Unpark,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct State {
    word: u64,
    waiting: u32,
    ticks: u64,
    /// Whose request the data area holds, and whose answer.
    req: Option<ReqId>,
    resp: Option<ReqId>,
    parked: bool,
    bell: u32,
    c: [Client; 2],
    s: S,
    /// The claim the server is answering and the request it copied.
    pending: u64,
    pending_req: Option<ReqId>,
    /// Requests the server took (bit per client x request) and requests withdrawn unrun.
    taken: u32,
    withdrawn: u32,
}

#[derive(Clone, Copy, Debug)]
struct Config {
    /// Requests each client makes.
    requests: [u8; 2],
    /// Per client: may it crash, may its deadlines pass.
    may_crash: [bool; 2],
    may_time_out: [bool; 2],
    /// Client 1 has client 0's pid (another start time) and starts once client 0 is gone.
    pid_reuse: bool,
    /// Client 0 may find a non-finite value after claiming.
    bad_values: bool,
}

const PIDS: [u32; 2] = [101, 102];
const TICKS: [u64; 2] = [7001, 7002];

struct Model {
    cfg: Config,
    m: Mutant,
}

fn bit(c: usize, reqno: u8) -> u32 {
    1 << (c * 8 + reqno as usize)
}

fn low32(w: u64) -> u32 {
    w as u32
}

/// The claim (pid and generation) a word belongs to.
fn claim(w: u64) -> (u32, u64) {
    (pid_of(w), gen_of(w))
}

impl Model {
    fn pid(&self, c: usize) -> u32 {
        if self.cfg.pid_reuse {
            PIDS[0]
        } else {
            PIDS[c]
        }
    }

    fn alive(&self, st: &State, c: usize) -> bool {
        !matches!(st.c[c].pc, C::Crashed | C::Finished) && (c == 0 || !self.cfg.pid_reuse || self.started(st, 1))
    }

    /// With pid reuse, client 1's process exists only once client 0's is gone.
    fn started(&self, st: &State, c: usize) -> bool {
        c == 0 || !self.cfg.pid_reuse || matches!(st.c[0].pc, C::Crashed | C::Finished)
    }

    /// `shm::process_alive(pid, ticks)` against the model's processes.
    fn process_alive(&self, st: &State, pid: u32, ticks: u64) -> bool {
        pid != 0 && (0..2).any(|c| self.alive(st, c) && self.pid(c) == pid && (ticks == 0 || TICKS[c] == ticks))
    }

    /// Whether the reaper has a dead client's slot to free (what wakes a parked server when its
    /// housekeeping timer fires).
    fn reapable(&self, st: &State) -> bool {
        let s = state_of(st.word);
        (s == SLOT_CLAIMED || s == SLOT_SUBMITTED || s == SLOT_DONE) && !self.process_alive(st, pid_of(st.word), st.ticks)
    }

    /// Every state one step of `who` leads to (several where the step is a choice).
    fn client_steps(&self, st: &State, i: usize, out: &mut Vec<(String, State)>) -> Result<(), String> {
        let cl = st.c[i];
        if matches!(cl.pc, C::Finished | C::Crashed) || !self.started(st, i) {
            return Ok(());
        }
        let mut push = |label: &str, n: State| out.push((format!("c{i} {label}"), n));
        if self.cfg.may_crash[i] {
            let mut n = st.clone();
            n.c[i].pc = C::Crashed;
            push(&format!("{:?}: crash", cl.pc), n);
        }
        let mut n = st.clone();
        let me = &mut n.c[i];
        let my_id = |gen| (i as u8, cl.reqno, gen);
        match cl.pc {
            C::Start => {
                if cl.reqno == self.cfg.requests[i] {
                    me.pc = C::Finished;
                } else {
                    me.pc = C::ClaimLoad;
                    me.late = false;
                    me.ticks_stored = false;
                }
                push("start", n);
            }
            C::ClaimLoad => {
                if state_of(st.word) == SLOT_FREE {
                    me.pc = C::ClaimCas(st.word);
                    push("claim: load FREE", n);
                } else if self.cfg.may_time_out[i] {
                    // Every slot stayed busy until the deadline: TIMEOUT, nothing claimed.
                    me.pc = C::Start;
                    me.reqno += 1;
                    push("claim: deadline", n);
                }
                // Otherwise it polls until the slot is FREE (no step: nothing changes).
            }
            C::ClaimCas(w) => {
                let gen = gen_of(w) + 1;
                let claimed = pack(self.pid(i), gen, SLOT_CLAIMED);
                if st.word == w {
                    n.word = claimed;
                    n.c[i].word = claimed;
                    n.c[i].pc = C::StoreTicks;
                    push("claim: CAS ok", n);
                } else {
                    me.pc = C::ClaimLoad;
                    push("claim: CAS failed", n);
                }
            }
            C::StoreTicks => {
                n.ticks = TICKS[i];
                n.c[i].ticks_stored = true;
                n.c[i].pc = C::WriteReq;
                push("store start ticks", n);
            }
            C::WriteReq => {
                n.req = Some(my_id(gen_of(cl.word)));
                n.c[i].pc = if self.m == Mutant::RingCheckBeforeSubmit { C::ReadParked } else { C::Submit(None) };
                push("write request", n.clone());
                if self.cfg.bad_values && i == 0 {
                    n.c[i].pc = C::BadFreeCheck;
                    push("write request: non-finite value", n);
                }
            }
            C::BadFreeCheck | C::AbFreeCheck | C::RelFreeCheck => {
                let (expect, next, fail) = match cl.pc {
                    C::BadFreeCheck => (cl.word, C::BadFreeTicks, None),
                    C::AbFreeCheck => (with_state(cl.word, SLOT_SUBMITTED), C::AbFreeTicks, Some(C::AbMark)),
                    _ => (with_state(cl.word, SLOT_DONE), C::RelFreeTicks, None),
                };
                if st.word == expect || self.m == Mutant::FreeClearsUnchecked {
                    me.pc = next;
                    push("free_if: load word", n);
                } else if let Some(f) = fail {
                    me.pc = f;
                    push("free_if: word changed", n);
                } else {
                    return Err(format!("c{i}: its slot was taken over before it freed it ({:#x})", st.word));
                }
            }
            C::BadFreeTicks | C::AbFreeTicks | C::RelFreeTicks => {
                if self.m != Mutant::FreeKeepsTicks {
                    n.ticks = 0;
                }
                n.c[i].pc = match cl.pc {
                    C::BadFreeTicks => C::BadFreeCas,
                    C::AbFreeTicks => C::AbFreeCas,
                    _ => C::RelFreeCas,
                };
                n.c[i].ticks_stored = false;
                push("free_if: clear ticks", n);
            }
            C::BadFreeCas | C::AbFreeCas | C::RelFreeCas => {
                let expect = match cl.pc {
                    C::BadFreeCas => cl.word,
                    C::AbFreeCas => with_state(cl.word, SLOT_SUBMITTED),
                    _ => with_state(cl.word, SLOT_DONE),
                };
                if st.word == expect {
                    n.word = pack(0, gen_of(expect), SLOT_FREE);
                    if cl.pc == C::AbFreeCas {
                        // "deadline passed before the server took the request (it did not run)"
                        if st.taken & bit(i, cl.reqno) != 0 {
                            return Err(format!("c{i}: told its request {} did not run, but the server took it", cl.reqno));
                        }
                        n.withdrawn |= bit(i, cl.reqno);
                    }
                    let me = &mut n.c[i];
                    me.pc = C::Start;
                    me.reqno += 1;
                    push("free_if: CAS -> FREE", n);
                } else if cl.pc == C::AbFreeCas {
                    me.pc = C::AbMark;
                    push("free_if: CAS failed", n);
                } else {
                    return Err(format!("c{i}: its slot was taken over before it freed it ({:#x})", st.word));
                }
            }
            C::Submit(early) => {
                let submitted = with_state(cl.word, SLOT_SUBMITTED);
                if st.word != cl.word {
                    return Err(format!("c{i}: its claimed slot was reclaimed while it wrote the request"));
                }
                n.word = submitted;
                n.c[i].pc = match early {
                    None => C::ReadParked,
                    Some(true) => C::RingBell,
                    Some(false) => C::Spin,
                };
                push("submit: CAS CLAIMED -> SUBMITTED", n);
            }
            C::ReadParked => {
                me.pc = match (self.m == Mutant::RingCheckBeforeSubmit, st.parked) {
                    (true, p) => C::Submit(Some(p)),
                    (false, true) => C::RingBell,
                    (false, false) => C::Spin,
                };
                push(if st.parked { "read parked = 1" } else { "read parked = 0" }, n);
            }
            C::RingBell => {
                n.bell = st.bell.wrapping_add(1);
                n.c[i].pc = C::WakeServer;
                push("doorbell += 1", n);
            }
            C::WakeServer => {
                if let S::Sleeping(_) = st.s {
                    n.s = S::Unpark;
                }
                n.c[i].pc = C::Spin;
                push("futex_wake(doorbell)", n);
            }
            C::Spin => {
                me.pc = if st.word == with_state(cl.word, SLOT_DONE) { C::ReadReply } else { C::SetWaiting };
                push("spin: poll", n);
            }
            C::SetWaiting => {
                n.waiting = if self.m == Mutant::WaitingWithoutTag { 1 } else { waiting_tag(cl.word) };
                n.c[i].pc = C::CheckState;
                push("waiting = 1", n);
            }
            C::CheckState => {
                if st.word == with_state(cl.word, SLOT_DONE) {
                    me.pc = C::ClearWaitingDone;
                    push("check: DONE", n);
                } else {
                    me.pc = C::FutexWait(low32(st.word));
                    push("check: not done", n.clone());
                    if cl.late {
                        n.c[i].pc = C::ClearWaitingAbandon;
                        push("check: deadline passed", n);
                    }
                }
            }
            C::ClearWaitingDone | C::ClearWaitingAbandon => {
                n.waiting = 0;
                n.c[i].pc = if cl.pc == C::ClearWaitingDone { C::ReadReply } else { C::AbFreeCheck };
                push("waiting = 0", n);
            }
            C::FutexWait(expected) => {
                me.pc = if low32(st.word) != expected { C::SetWaiting } else { C::Sleeping(expected) };
                push("futex_wait(slot)", n);
            }
            C::Sleeping(_) => {
                // Woken only by the server's futex_wake, or by its deadline.
                if self.cfg.may_time_out[i] && !cl.late {
                    me.pc = C::SetWaiting;
                    me.late = true;
                    push("futex_wait: deadline", n);
                }
            }
            C::AbMark => {
                let processing = with_state(cl.word, SLOT_PROCESSING);
                if st.word == processing {
                    n.word = if self.m == Mutant::AbandonFreesProcessing {
                        pack(0, gen_of(processing), SLOT_FREE)
                    } else {
                        with_state(cl.word, SLOT_ABANDONED)
                    };
                    let me = &mut n.c[i];
                    me.pc = C::Start;
                    me.reqno += 1;
                    me.ticks_stored = false;
                    push("abandon: PROCESSING -> ABANDONED", n);
                } else {
                    me.pc = C::AbCheckDone;
                    push("abandon: not PROCESSING", n);
                }
            }
            C::AbCheckDone => {
                if st.word == with_state(cl.word, SLOT_DONE) {
                    me.pc = C::ReadReply;
                    push("abandon: the answer landed", n);
                } else {
                    return Err(format!("c{i}: withdrawing, found its slot reclaimed ({:#x})", st.word));
                }
            }
            C::ReadReply => {
                let mine = Some(my_id(gen_of(cl.word)));
                if st.resp != mine {
                    return Err(format!("c{i}: read the answer of {:?} for its request {:?}", st.resp, mine));
                }
                me.pc = C::RelFreeCheck;
                push("read reply", n);
            }
            C::Finished | C::Crashed => {}
        }
        // A deadline may pass at any moment of the wait; the client notices at its next check.
        let waits = matches!(cl.pc, C::Spin | C::SetWaiting | C::CheckState | C::FutexWait(_));
        if waits && self.cfg.may_time_out[i] && !cl.late {
            let mut n = st.clone();
            n.c[i].late = true;
            out.push((format!("c{i} deadline passes"), n));
        }
        Ok(())
    }

    fn server_steps(&self, st: &State, out: &mut Vec<(String, State)>) -> Result<(), String> {
        let mut n = st.clone();
        let mut push = |label: &str, n: State| out.push((format!("s {label}"), n));
        match st.s {
            S::Scan => {
                if state_of(st.word) == SLOT_SUBMITTED {
                    n.s = S::Take(st.word);
                    push("scan: SUBMITTED", n);
                } else {
                    n.s = S::Park;
                    push("scan: nothing", n.clone());
                    n.s = S::HouseLoad;
                    push("scan: housekeeping", n);
                }
            }
            S::Take(w) => {
                if st.word == w {
                    n.word = with_state(w, SLOT_PROCESSING);
                    n.pending = n.word;
                    n.s = S::Copy;
                    push("collect: CAS -> PROCESSING", n);
                } else {
                    n.s = S::Scan;
                    push("collect: CAS failed", n);
                }
            }
            S::Copy => {
                // The request in the data area must be the one this claim submitted.
                let Some(r) = st.req else { return Err("server took a slot with no request in it".into()) };
                let owner = r.0 as usize;
                if (self.pid(owner), r.2) != claim(st.pending) {
                    return Err(format!("server took {:?} under the claim {:?}", r, claim(st.pending)));
                }
                if st.withdrawn & bit(owner, r.1) != 0 {
                    return Err(format!("server took the withdrawn request {r:?}"));
                }
                n.taken |= bit(owner, r.1);
                n.pending_req = Some(r);
                n.s = S::EngineWrite;
                push("copy request", n);
            }
            S::EngineWrite | S::PubWrite => {
                if claim(st.word) != claim(st.pending) {
                    return Err(format!(
                        "server wrote the answer of {:?} into a slot now claimed by {:?} ({:#x})",
                        st.pending_req,
                        claim(st.word),
                        st.word
                    ));
                }
                n.resp = st.pending_req;
                n.s = if st.s == S::EngineWrite { S::PubCheck } else { S::PubLenStatus };
                push("write answer into the slot", n);
            }
            S::PubCheck => {
                n.s = if st.word == st.pending { S::PubWrite } else { S::RelFreeCheck };
                push("publish: check the word", n);
            }
            S::PubLenStatus => {
                n.s = S::PubCas;
                push("publish: length, status", n);
            }
            S::PubCas => {
                let done = with_state(st.pending, SLOT_DONE);
                if self.m == Mutant::FinishWithoutCas {
                    n.word = done;
                    n.s = S::PubSwapWaiting;
                    push("finish: store DONE", n);
                } else if st.word == st.pending {
                    n.word = done;
                    n.s = S::PubSwapWaiting;
                    push("finish: CAS -> DONE", n);
                } else {
                    n.s = S::RelFreeCheck;
                    push("finish: CAS failed", n);
                }
            }
            S::PubSwapWaiting => {
                let wake = if self.m == Mutant::WaitingWithoutTag {
                    n.waiting = 0;
                    st.waiting != 0
                } else if st.waiting == waiting_tag(st.pending) {
                    n.waiting = 0;
                    true
                } else {
                    false
                };
                n.s = if wake { S::PubWake } else { S::Scan };
                push(if wake { "waiting: own tag -> 0" } else { "waiting: not its tag" }, n);
            }
            S::PubWake => {
                for c in n.c.iter_mut() {
                    if let C::Sleeping(_) = c.pc {
                        c.pc = C::SetWaiting;
                    }
                }
                n.s = S::Scan;
                push("futex_wake(slot)", n);
            }
            S::RelFreeCheck => {
                let ab = with_state(st.pending, SLOT_ABANDONED);
                n.s = if st.word == ab || self.m == Mutant::FreeClearsUnchecked { S::RelFreeTicks } else { S::Scan };
                push("release abandoned: free_if: load word", n);
            }
            S::RelFreeTicks => {
                if self.m != Mutant::FreeKeepsTicks {
                    n.ticks = 0;
                }
                n.s = S::RelFreeCas;
                push("release abandoned: clear ticks", n);
            }
            S::RelFreeCas => {
                let ab = with_state(st.pending, SLOT_ABANDONED);
                if st.word == ab {
                    n.word = pack(0, gen_of(ab), SLOT_FREE);
                }
                n.s = S::Scan;
                push("release abandoned: CAS -> FREE", n);
            }
            S::HouseLoad => {
                let s = state_of(st.word);
                n.s = if s == SLOT_CLAIMED || s == SLOT_SUBMITTED || s == SLOT_DONE { S::HouseTicks(st.word) } else { S::Scan };
                push("reap: load word", n);
            }
            S::HouseTicks(w) => {
                n.s = S::HouseAlive(w, st.ticks);
                push("reap: load ticks", n);
            }
            S::HouseAlive(w, t) => {
                let dead = self.m == Mutant::ReaperIgnoresLiveness || !self.process_alive(st, pid_of(w), t);
                n.s = if dead { S::HouseFreeCheck(w) } else { S::Scan };
                push(if dead { "reap: owner dead" } else { "reap: owner alive" }, n);
            }
            S::HouseFreeCheck(w) => {
                n.s = if st.word == w || self.m == Mutant::FreeClearsUnchecked { S::HouseFreeTicks(w) } else { S::Scan };
                push("reap: free_if: load word", n);
            }
            S::HouseFreeTicks(w) => {
                if self.m != Mutant::FreeKeepsTicks {
                    n.ticks = 0;
                }
                n.s = S::HouseFreeCas(w);
                push("reap: free_if clear ticks", n);
            }
            S::HouseFreeCas(w) => {
                if st.word == w {
                    n.word = pack(0, gen_of(w), SLOT_FREE);
                }
                n.s = S::Scan;
                push("reap: free_if CAS", n);
            }
            S::Park => {
                n.parked = true;
                n.s = S::ParkBell;
                push("parked = 1", n);
            }
            S::ParkBell => {
                n.s = if self.m == Mutant::ParkWithoutRescan { S::ParkWait(st.bell) } else { S::ParkRescan(st.bell) };
                push("read doorbell", n);
            }
            S::ParkRescan(b) => {
                n.s = if state_of(st.word) == SLOT_SUBMITTED { S::Unpark } else { S::ParkWait(b) };
                push("park: re-scan", n);
            }
            S::ParkWait(b) => {
                n.s = if st.bell != b { S::Unpark } else { S::Sleeping(b) };
                push("futex_wait(doorbell)", n);
            }
            S::Sleeping(_) => {
                // Woken by a client's futex_wake, or by the housekeeping timer, which matters
                // only when a dead client's slot waits to be reclaimed.
                if self.reapable(st) {
                    n.s = S::Unpark;
                    push("housekeeping timer", n);
                }
            }
            S::Unpark => {
                n.parked = false;
                n.s = S::HouseLoad;
                push("parked = 0", n);
            }
        }
        Ok(())
    }

    /// Invariants of a single state.
    fn check(&self, st: &State) -> Result<(), String> {
        for (i, cl) in st.c.iter().enumerate() {
            if !self.alive(st, i) {
                continue;
            }
            let holds = matches!(
                cl.pc,
                C::StoreTicks
                    | C::WriteReq
                    | C::BadFreeCheck
                    | C::BadFreeTicks
                    | C::BadFreeCas
                    | C::Submit(_)
                    | C::ReadParked
                    | C::RingBell
                    | C::WakeServer
                    | C::Spin
                    | C::SetWaiting
                    | C::CheckState
                    | C::ClearWaitingDone
                    | C::ClearWaitingAbandon
                    | C::FutexWait(_)
                    | C::Sleeping(_)
                    | C::AbFreeCheck
                    | C::AbFreeTicks
                    | C::AbFreeCas
                    | C::AbMark
                    | C::AbCheckDone
                    | C::ReadReply
                    | C::RelFreeCheck
                    | C::RelFreeTicks
                    | C::RelFreeCas
            );
            if holds && claim(st.word) != claim(cl.word) {
                return Err(format!("c{i} holds the claim {:?} but the slot is {:#x}: taken over", claim(cl.word), st.word));
            }
            if holds && cl.ticks_stored && st.ticks != TICKS[i] {
                return Err(format!("c{i} holds the slot with its start ticks recorded, but the slot says {}", st.ticks));
            }
            // A slot a live client claimed and no longer holds is left to nobody: nothing frees
            // it while that process lives.
            let s = state_of(st.word);
            let client_owned = s == SLOT_CLAIMED || s == SLOT_SUBMITTED || s == SLOT_DONE;
            if !holds && client_owned && claim(st.word) == claim(cl.word) {
                return Err(format!("c{i} left its slot {:#x} behind while it lives", st.word));
            }
        }
        Ok(())
    }

    fn good_end(&self, st: &State) -> bool {
        st.c.iter().all(|c| matches!(c.pc, C::Finished | C::Crashed)) && state_of(st.word) == SLOT_FREE && matches!(st.s, S::Sleeping(_))
    }

    /// Explores every reachable state. Returns the number of states, or the first violation
    /// with the shortest sequence of steps that leads to it.
    fn explore(&self) -> Result<usize, String> {
        let c0 = Client { pc: C::Start, word: 0, reqno: 0, late: false, ticks_stored: false };
        let init = State {
            word: pack(0, 0, SLOT_FREE),
            waiting: 0,
            ticks: 0,
            req: None,
            resp: None,
            parked: false,
            bell: 0,
            c: [c0, c0],
            s: S::Scan,
            pending: 0,
            pending_req: None,
            taken: 0,
            withdrawn: 0,
        };
        let mut index: HashMap<State, usize> = HashMap::new();
        let mut states: Vec<State> = Vec::new();
        let mut parent: Vec<(usize, String)> = Vec::new();
        let mut preds: Vec<Vec<usize>> = Vec::new();
        let mut queue = VecDeque::new();
        index.insert(init.clone(), 0);
        states.push(init);
        parent.push((usize::MAX, String::new()));
        preds.push(Vec::new());
        queue.push_back(0usize);
        let trace = |parent: &Vec<(usize, String)>, mut at: usize, last: &str| {
            let mut steps = vec![last.to_string()];
            while parent[at].0 != usize::MAX {
                steps.push(parent[at].1.clone());
                at = parent[at].0;
            }
            steps.reverse();
            steps.join("\n  ")
        };
        let mut ends = Vec::new();
        while let Some(at) = queue.pop_front() {
            let st = states[at].clone();
            let mut next = Vec::new();
            let r = (0..2).try_for_each(|i| self.client_steps(&st, i, &mut next)).and_then(|_| self.server_steps(&st, &mut next));
            if let Err(e) = r {
                return Err(format!("{e}\nafter:\n  {}", trace(&parent, at, "(the failing step)")));
            }
            if next.is_empty() {
                if !self.good_end(&st) {
                    return Err(format!("stuck: nobody can move in {st:?}\nafter:\n  {}", trace(&parent, at, "(stuck)")));
                }
                ends.push(at);
            }
            for (label, n) in next {
                if let Err(e) = self.check(&n) {
                    return Err(format!("{e}\nafter:\n  {}", trace(&parent, at, &label)));
                }
                let id = match index.get(&n) {
                    Some(&id) => id,
                    None => {
                        let id = states.len();
                        index.insert(n.clone(), id);
                        states.push(n);
                        parent.push((at, label));
                        preds.push(Vec::new());
                        queue.push_back(id);
                        id
                    }
                };
                preds[id].push(at);
            }
        }
        // Every state must still be able to reach a good end.
        let mut can_end = vec![false; states.len()];
        let mut work = ends.clone();
        for &e in &ends {
            can_end[e] = true;
        }
        while let Some(x) = work.pop() {
            for &p in &preds[x] {
                if !can_end[p] {
                    can_end[p] = true;
                    work.push(p);
                }
            }
        }
        if let Some(bad) = can_end.iter().position(|&ok| !ok) {
            return Err(format!("no way to finish from {:?}\nafter:\n  {}", states[bad], trace(&parent, bad, "(trapped)")));
        }
        Ok(states.len())
    }
}

fn configs() -> Vec<(&'static str, Config)> {
    let base = Config { requests: [2, 2], may_crash: [false; 2], may_time_out: [false; 2], pid_reuse: false, bad_values: false };
    vec![
        ("two clients, two requests each, no deadlines", base),
        ("deadlines", Config { requests: [2, 1], may_time_out: [true, true], ..base }),
        ("client 0 may crash, deadlines", Config { requests: [2, 1], may_crash: [true, false], may_time_out: [true, true], ..base }),
        ("both may crash", Config { requests: [1, 1], may_crash: [true, true], may_time_out: [false, true], ..base }),
        ("non-finite values, deadlines", Config { requests: [2, 1], bad_values: true, may_time_out: [true, false], ..base }),
        (
            "pid reuse after a crash",
            Config { requests: [1, 2], may_crash: [true, false], may_time_out: [true, true], pid_reuse: true, bad_values: false },
        ),
    ]
}

#[test]
fn the_slot_protocol_holds_in_every_interleaving() {
    for (name, cfg) in configs() {
        let t0 = std::time::Instant::now();
        match (Model { cfg, m: Mutant::None }).explore() {
            Ok(n) => eprintln!("{name}: {n} states, {:?}", t0.elapsed()),
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

/// Each broken transition is found in at least one configuration.
#[test]
fn mutants_are_caught() {
    let mutants = [
        Mutant::ReaperIgnoresLiveness,
        Mutant::AbandonFreesProcessing,
        Mutant::FreeKeepsTicks,
        Mutant::ParkWithoutRescan,
        Mutant::RingCheckBeforeSubmit,
        Mutant::FinishWithoutCas,
        Mutant::FreeClearsUnchecked,
        Mutant::WaitingWithoutTag,
    ];
    for m in mutants {
        let found = configs().into_iter().find_map(|(name, cfg)| (Model { cfg, m }).explore().err().map(|e| (name, e)));
        match found {
            Some((name, e)) => eprintln!("{m:?} caught in \"{name}\": {}", e.lines().next().unwrap_or("")),
            None => panic!("{m:?} was not caught by any configuration"),
        }
    }
}
