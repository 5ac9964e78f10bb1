//! Idle behaviour, in its own test binary so exactly one server thread exists.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kalos::shm::Segment;
use kalos::*;

fn server(name: &str, dim: u32, f: impl FnOnce(&mut Options)) -> Kalos {
    let mut o = Options { role: Role::Server, dim, metric: Metric::InnerProduct, ..Options::default() };
    f(&mut o);
    Kalos::open(name, &o).unwrap()
}

fn uniq(tag: &str) -> String {
    format!("rt-{tag}-{}", std::process::id())
}

/// After its spin window the server parks on the futex and burns no CPU.
#[test]
fn idle_server_parks_and_uses_no_cpu() {
    let name = uniq("idle");
    let s = server(&name, 4, |o| o.server_spin_ns = 1_000_000);
    s.upsert(&[1], &[1., 2., 3., 4.], &UpsertOptions::default()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let seg = Segment::attach(&name).unwrap();
    assert_eq!(seg.header().server_parked.load(Ordering::SeqCst), 1, "server parked");
    let tid = server_tid();
    let t0 = thread_cpu_ticks(tid);
    std::thread::sleep(Duration::from_millis(1500));
    let used = thread_cpu_ticks(tid) - t0;
    eprintln!("server thread used {used} clock ticks (1/100 s) while idle for 1.5 s");
    assert!(used <= 2, "idle server used {used} ticks of CPU in 1.5 s");
    // And it wakes up for the next request.
    assert_eq!(s.recall(&[1., 2., 3., 4.], 1, &RecallOptions::default()).unwrap()[0].id, 1);
}

fn server_tid() -> u32 {
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let p = e.unwrap().path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if comm.starts_with("kalos-server") {
            return p.file_name().unwrap().to_str().unwrap().parse().unwrap();
        }
    }
    panic!("no server thread found")
}

fn thread_cpu_ticks(tid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}
