//! The server's liveness as clients see it. Every wait returns within its deadline plus
//! scheduling noise, whatever the client's spin setting: a killed server gives SERVER_GONE
//! within the deadline; a stopped (SIGSTOP) one gives TIMEOUT at the deadline and, once
//! continued, serves again (the withdrawn request left no slot behind). A second server for a
//! taken name, or a server whose name another user squats, is refused with an error that names
//! who holds it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kalos::*;

struct Server(Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: plain signals to our own child; SIGCONT first so a stopped child can die.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGCONT);
            libc::kill(self.0.id() as i32, libc::SIGKILL);
        }
        let _ = self.0.wait();
        // A killed server leaves its segment and lock for the next server of the name.
        for f in [format!("/dev/shm/kalos.{}", self.1), format!("/dev/shm/kalos.{}.lock", self.1)] {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn serve(name: &str) -> Server {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kalosd"))
        .args(["serve", "--name", name, "--dim", "8", "--metric", "ip", "--backend", "cpu", "--synthetic", "1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.contains("serving") || line.contains("count="), "{line}");
    Server(c, name.to_string())
}

/// SIGSTOPs the child and waits until the kernel shows it stopped (signals are asynchronous).
fn stop(srv: &Server) {
    let pid = srv.0.id();
    // SAFETY: a plain signal to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let t = Instant::now();
    while !kalos::shm::process_stopped(pid) {
        assert!(t.elapsed() < Duration::from_secs(5), "the server did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn client(name: &str) -> Kalos {
    // A 10 s spin: far longer than the 300 ms deadline.
    let o = Options { role: Role::Client, client_spin_ns: 10_000_000_000, timeout_ms: 300, ..Options::default() };
    Kalos::open(name, &o).unwrap()
}

const Q: [f32; 8] = [1.0, 0.5, 0.0, -0.5, 0.25, 0.0, 1.0, 0.0];

#[test]
fn a_stopped_server_times_out_at_the_deadline_and_serves_again_when_continued() {
    let name = format!("deadline-stop-{}", std::process::id());
    let srv = serve(&name);
    let k = client(&name);
    assert_eq!(k.recall(&Q, 3, &RecallOptions::default()).unwrap().len(), 3);
    stop(&srv);
    let t = Instant::now();
    let e = k.recall(&Q, 3, &RecallOptions::default()).unwrap_err();
    let took = t.elapsed();
    assert_eq!(e.status, Status::Timeout, "{e}");
    assert!(took < Duration::from_millis(1500), "waited {took:?} past a 300 ms deadline");
    // The withdrawn request's slot is free and carries no owner ticks: a stale value would make
    // the slot's next (live) owner look dead to the server's reaper.
    let seg = kalos::shm::Segment::attach(&name).unwrap();
    for i in 0..seg.slot_count() {
        let slot = seg.slot(i);
        let w = slot.state.load(std::sync::atomic::Ordering::Acquire);
        if kalos::shm::state_of(w) == kalos::shm::SLOT_FREE {
            assert_eq!(slot.client_start_ticks.load(std::sync::atomic::Ordering::Acquire), 0, "free slot {i} kept its owner's ticks");
        }
    }
    drop(seg);
    // SAFETY: as above.
    unsafe { libc::kill(srv.0.id() as i32, libc::SIGCONT) };
    std::thread::sleep(Duration::from_millis(50));
    for _ in 0..20 {
        assert_eq!(k.recall(&Q, 3, &RecallOptions::default()).unwrap().len(), 3);
    }
    drop(k);
    drop(srv);
}

#[test]
fn a_killed_server_is_server_gone_within_the_deadline() {
    let name = format!("deadline-kill-{}", std::process::id());
    let mut srv = serve(&name);
    let k = client(&name);
    assert_eq!(k.recall(&Q, 3, &RecallOptions::default()).unwrap().len(), 3);
    // SAFETY: a plain signal to our own child, reaped right after.
    unsafe { libc::kill(srv.0.id() as i32, libc::SIGKILL) };
    let _ = srv.0.wait();
    let t = Instant::now();
    let e = k.recall(&Q, 3, &RecallOptions::default()).unwrap_err();
    let took = t.elapsed();
    assert_eq!(e.status, Status::ServerGone, "{e}");
    assert!(e.message.contains("gone"), "{}", e.message);
    assert!(took < Duration::from_millis(1500), "waited {took:?} past a 300 ms deadline");
    drop(srv);
}

/// A client whose recent answers took long (here one held back 200 ms by a stopped server) sleeps
/// on the futex until shortly before the next expected answer and polls only around it. Through
/// that sleep an early answer still wakes it at once (the server sees it waiting), a stopped
/// server still times out at the deadline and a killed one is still SERVER_GONE.
#[test]
fn a_client_sleeping_until_its_expected_answer_is_woken_and_keeps_its_deadlines() {
    let name = format!("deadline-presleep-{}", std::process::id());
    let mut srv = serve(&name);
    // The default spin: its window is capped, so long answers plan a sleep before polling.
    let o = Options { role: Role::Client, timeout_ms: 300, ..Options::default() };
    let k = Kalos::open(&name, &o).unwrap();
    assert_eq!(k.recall(&Q, 3, &RecallOptions::default()).unwrap().len(), 3);
    stop(&srv);
    let pid = srv.0.id() as i32;
    let cont = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: a plain signal to the test's own child.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    });
    let slow = RecallOptions { timeout_ms: Some(5000), ..RecallOptions::default() };
    let t = Instant::now();
    assert_eq!(k.recall(&Q, 3, &slow).unwrap().len(), 3);
    assert!(t.elapsed() >= Duration::from_millis(150), "the stopped server answered after {:?}", t.elapsed());
    cont.join().unwrap();
    // The next answers come long before the expected 200 ms: each must wake the sleeping client
    // (without the server's wake-up it would sleep on until its 20 ms liveness step at least).
    let mut took: Vec<Duration> = (0..5)
        .map(|_| {
            let t = Instant::now();
            assert_eq!(k.recall(&Q, 3, &RecallOptions::default()).unwrap().len(), 3);
            t.elapsed()
        })
        .collect();
    took.sort();
    assert!(took[2] < Duration::from_millis(15), "answers took {took:?} (median past 15 ms): the sleeping client was not woken");
    // Still expecting long answers (the smoothed time decays by a quarter per answer), it keeps
    // its deadline against a stopped server...
    stop(&srv);
    let t = Instant::now();
    let e = k.recall(&Q, 3, &RecallOptions::default()).unwrap_err();
    assert_eq!(e.status, Status::Timeout, "{e}");
    assert!(t.elapsed() < Duration::from_millis(1500), "waited {:?} past a 300 ms deadline", t.elapsed());
    // ...and learns of a killed one within it.
    // SAFETY: plain signals to our own child, reaped right after.
    unsafe {
        libc::kill(pid, libc::SIGCONT);
        libc::kill(pid, libc::SIGKILL);
    }
    let _ = srv.0.wait();
    let t = Instant::now();
    let e = k.recall(&Q, 3, &RecallOptions::default()).unwrap_err();
    assert_eq!(e.status, Status::ServerGone, "{e}");
    assert!(t.elapsed() < Duration::from_millis(1500), "waited {:?} past a 300 ms deadline", t.elapsed());
    drop(k);
    drop(srv);
}

#[test]
fn a_second_server_for_a_taken_name_is_told_who_holds_it() {
    let name = format!("liveness-taken-{}", std::process::id());
    let srv = serve(&name);
    let o = Options { role: Role::Server, dim: 8, backend: Backend::Cpu, ..Options::default() };
    let Err(e) = Kalos::open(&name, &o) else { panic!("a second server opened a taken name") };
    assert_eq!(e.status, Status::AlreadyExists, "{e}");
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert!(e.message.contains(&format!("uid {uid}")), "{}", e.message);
    assert!(e.message.contains(&format!("locked by pid {}", srv.0.id())), "{}", e.message);
    drop(srv);
}

/// Name squatting: another local user pre-creates a store's lock or segment name. The rightful
/// server cannot start, and its error names the squatter (uid, and the pid holding the lock) and,
/// for the lock, the way out (another name; SECURITY.md). Needs root: the test squats as root and
/// starts `kalosd` as uid 65534, which cannot remove or open root's 0600 files in /dev/shm.
#[test]
fn a_name_squatted_by_another_user_is_refused_naming_the_squatter() {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP a_name_squatted_by_another_user_is_refused_naming_the_squatter: needs root to act as two users");
        return;
    }
    for squatted in ["lock", "segment"] {
        let name = format!("liveness-squat-{squatted}-{}", std::process::id());
        let file = match squatted {
            "lock" => format!("/dev/shm/kalos.{name}.lock"),
            _ => format!("/dev/shm/kalos.{name}"),
        };
        let f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&file).unwrap();
        if squatted == "lock" {
            // SAFETY: flock(2) on a file this test just opened.
            assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
        }
        let out = Command::new(env!("CARGO_BIN_EXE_kalosd"))
            .args(["serve", "--name", &name, "--dim", "8", "--metric", "ip", "--backend", "cpu"])
            .uid(65534)
            .gid(65534)
            .stdin(Stdio::null())
            .output();
        drop(f);
        let _ = std::fs::remove_file(&file);
        let out = match out {
            Ok(o) => o,
            Err(e) => {
                println!("SKIP a_name_squatted_by_another_user_is_refused_naming_the_squatter: cannot start kalosd as uid 65534: {e}");
                return;
            }
        };
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{squatted}: kalosd started on a squatted name: {err}");
        assert!(err.contains(&format!("/dev/shm/kalos.{name}")) && err.contains("owned by uid 0"), "{squatted}: {err}");
        if squatted == "lock" {
            assert!(err.contains("PERMISSION_DENIED"), "{err}");
            assert!(err.contains(&format!("locked by pid {}", std::process::id())), "{err}");
            assert!(err.contains("choose another name"), "{err}");
        } else {
            assert!(err.contains("ALREADY_EXISTS"), "{err}");
        }
    }
}
