//! `kalosd import / export / repair` end to end, plus what `kalosd serve` prints about a data
//! directory (torn tail, corruption, lock).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use kalos::npy::{self, NpyData};
use kalos::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Kills a child server if the test panics (so a failing test never leaves a server running).
struct KillOnPanic(i32);
impl Drop for KillOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // SAFETY: kill(2) of our own child.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

fn kalosd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kalosd")).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kalos-tools-{tag}-{}-{}", std::process::id(), rand::random::<u32>()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn import_serve_export_round_trip_with_payloads() {
    let seed: u64 = rand::random();
    eprintln!("seed = {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let w = tmp("rt");
    let (n, dim) = (3000usize, 12usize);
    let ids: Vec<u64> = (0..n).map(|_| rng.random::<u64>() >> 1).collect();
    let ns: Vec<u64> = (0..n).map(|_| rng.random_range(0..20)).collect();
    let vals: Vec<f32> = (0..n * dim).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    npy::write_f32(&w.join("v.npy"), &[n, dim], &vals).unwrap();
    npy::write_u64(&w.join("ids.npy"), &ids).unwrap();
    npy::write_u64(&w.join("ns.npy"), &ns).unwrap();
    let mut jl = String::new();
    let mut want_payload: HashMap<u64, Option<Vec<u8>>> = HashMap::new();
    let far = kalos::types::now_unix_ms() + 3_600_000;
    for (i, &id) in ids.iter().enumerate() {
        match i % 5 {
            0 => {
                jl += &format!("{{\"id\": {id}, \"payload\": \"memory \\\"{i}\\\"\\n\\u00e9\"}}\n");
                want_payload.insert(id, Some(format!("memory \"{i}\"\n\u{e9}").into_bytes()));
            }
            1 => {
                let b: Vec<u8> = (0..rng.random_range(0..50)).map(|_| rng.random()).collect();
                let b64 = {
                    // Encode with the exporter's alphabet (standard, padded) by hand here.
                    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
                    let mut s = String::new();
                    for c in b.chunks(3) {
                        let v = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
                        for k in 0..4 {
                            s.push(if k <= c.len() { A[(v >> (18 - 6 * k)) as usize & 63] as char } else { '=' });
                        }
                    }
                    s
                };
                jl += &format!("{{\"payload_b64\": \"{b64}\", \"id\": {id}, \"extra\": [1,2]}}\n");
                want_payload.insert(id, Some(b));
            }
            2 => {
                jl += &format!("{{\"id\": {id}, \"payload\": {{\"text\": \"json {i}\"}}, \"expires_ms\": {far}}}\n");
                want_payload.insert(id, Some(format!("{{\"text\": \"json {i}\"}}").into_bytes()));
            }
            _ => {
                want_payload.insert(id, None);
            }
        }
    }
    // One row already expired: skipped and counted.
    let expired_id = ids[3];
    jl += &format!("{{\"id\": {expired_id}, \"expires_ms\": 1000}}\n");
    std::fs::write(w.join("p.jsonl"), jl).unwrap();
    let d = w.join("data");
    let o = kalosd(&[
        "import",
        "--data-dir",
        s(&d),
        "--dim",
        "12",
        "--metric",
        "ip",
        "--vectors",
        s(&w.join("v.npy")),
        "--ids",
        s(&w.join("ids.npy")),
        "--namespaces",
        s(&w.join("ns.npy")),
        "--payloads",
        s(&w.join("p.jsonl")),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(&format!("imported {} rows", n - 1)) && text(&o).contains("1 skipped"), "{}", text(&o));
    // Serve the imported directory and check through a client.
    let name = format!("tools-{}", std::process::id());
    let mut srv = Command::new(env!("CARGO_BIN_EXE_kalosd"))
        .args(["serve", "--name", &name, "--dim", "12", "--metric", "ip", "--backend", "cpu", "--data-dir", s(&d)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let _guard = KillOnPanic(srv.id() as i32);
    BufReader::new(srv.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert!(line.contains(&format!("count={}", n - 1)), "{line}");
    // A second server on the same directory is refused, and an offline tool too.
    let o2 = kalosd(&["serve", "--name", &format!("{name}-2"), "--dim", "12", "--metric", "ip", "--data-dir", s(&d)]);
    assert_eq!(o2.status.code(), Some(1));
    assert!(text(&o2).contains("LOCKED"), "{}", text(&o2));
    let o3 = kalosd(&["export", "--data-dir", s(&d), "--vectors", s(&w.join("x.npy")), "--ids", s(&w.join("xi.npy"))]);
    assert!(text(&o3).contains("LOCKED"), "{}", text(&o3));
    {
        let k = Kalos::open(&name, &Options { role: Role::Client, ..Options::default() }).unwrap();
        for i in (0..n).step_by(7).filter(|&i| i != 3) {
            let r = &k.get(&[ids[i]]).unwrap()[0];
            assert_eq!(r.vector, vals[i * dim..(i + 1) * dim].to_vec());
            assert_eq!(r.namespace, ns[i]);
            assert_eq!(r.payload, want_payload[&ids[i]], "payload of row {i}");
            assert_eq!(r.expires_ms, if i % 5 == 2 { far } else { NEVER });
        }
        assert_eq!(k.get(&[expired_id]).unwrap_err().status, Status::NotFound);
        // Online import into the running server.
        let extra_ids: Vec<u64> = vec![1 << 62, (1 << 62) + 1];
        npy::write_u64(&w.join("eids.npy"), &extra_ids).unwrap();
        npy::write_f32(&w.join("ev.npy"), &[2, dim], &vals[..2 * dim]).unwrap();
        std::fs::write(w.join("ep.jsonl"), format!("{{\"id\": {}, \"payload\": \"online\", \"namespace\": 99}}\n", 1u64 << 62)).unwrap();
        let o = kalosd(&[
            "import",
            "--name",
            &name,
            "--dim",
            "12",
            "--vectors",
            s(&w.join("ev.npy")),
            "--ids",
            s(&w.join("eids.npy")),
            "--payloads",
            s(&w.join("ep.jsonl")),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let r = &k.get(&[1 << 62]).unwrap()[0];
        assert_eq!((r.payload.as_deref(), r.namespace), (Some(&b"online"[..]), 99));
    }
    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(srv.id() as i32, libc::SIGTERM) };
    assert!(srv.wait().unwrap().success());
    // Export (f32 and f16) and compare with what went in.
    let o = kalosd(&[
        "export",
        "--data-dir",
        s(&d),
        "--vectors",
        s(&w.join("x.npy")),
        "--ids",
        s(&w.join("xi.npy")),
        "--namespaces",
        s(&w.join("xn.npy")),
        "--payloads",
        s(&w.join("xp.jsonl")),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let xv = match npy::read(&w.join("x.npy")).unwrap().data {
        NpyData::F32(v) => v,
        _ => panic!(),
    };
    let xi = match npy::read(&w.join("xi.npy")).unwrap().data {
        NpyData::U64(v) => v,
        _ => panic!(),
    };
    let xn = match npy::read(&w.join("xn.npy")).unwrap().data {
        NpyData::U64(v) => v,
        _ => panic!(),
    };
    assert_eq!(xi.len(), n - 1 + 2);
    let pos: HashMap<u64, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    for (r, id) in xi.iter().enumerate() {
        if let Some(&i) = pos.get(id) {
            assert_eq!(&xv[r * dim..(r + 1) * dim], &vals[i * dim..(i + 1) * dim]);
            assert_eq!(xn[r], ns[i]);
        }
    }
    // The exported set re-imports into a fresh directory to the same table (full fidelity).
    let d2 = w.join("data2");
    let o = kalosd(&[
        "import",
        "--data-dir",
        s(&d2),
        "--dim",
        "12",
        "--metric",
        "ip",
        "--vectors",
        s(&w.join("x.npy")),
        "--ids",
        s(&w.join("xi.npy")),
        "--payloads",
        s(&w.join("xp.jsonl")),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let o = kalosd(&[
        "export",
        "--data-dir",
        s(&d2),
        "--vectors",
        s(&w.join("y.npy")),
        "--ids",
        s(&w.join("yi.npy")),
        "--payloads",
        s(&w.join("yp.jsonl")),
        "--dtype",
        "f16",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(w.join("xp.jsonl")).unwrap(),
        std::fs::read_to_string(w.join("yp.jsonl")).unwrap(),
        "payloads, namespaces, times"
    );
    let yv = match npy::read(&w.join("y.npy")).unwrap().data {
        NpyData::F32(v) => v,
        _ => panic!(),
    };
    for (a, b) in xv.iter().zip(&yv) {
        assert!((a - b).abs() <= 2e-3 * a.abs().max(1e-2), "f16 export {a} vs {b}");
    }
    std::fs::remove_dir_all(&w).unwrap();
}

#[test]
fn serve_reports_torn_tail_and_corruption_and_repair_recovers() {
    let w = tmp("rep");
    let d = w.join("data");
    let o = Options { role: Role::Server, dim: 4, metric: Metric::InnerProduct, data_dir: Some(d.clone()), ..Options::default() };
    let name = format!("toolsrep-{}", std::process::id());
    let k = Kalos::open(&name, &o).unwrap();
    for i in 0..50u64 {
        k.upsert(
            &[i],
            &[i as f32, 1.0, 2.0, 3.0],
            &UpsertOptions { payloads: Some(vec![Some(format!("p{i}").as_bytes())]), ..Default::default() },
        )
        .unwrap();
    }
    k.close();
    let wal = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|x| x == "wal")).unwrap();
    let len = std::fs::metadata(&wal).unwrap().len();
    // Torn tail: kalosd prints it and serves the intact prefix.
    std::fs::OpenOptions::new().write(true).open(&wal).unwrap().set_len(len - 5).unwrap();
    let mut srv = Command::new(env!("CARGO_BIN_EXE_kalosd"))
        .args(["serve", "--name", &name, "--dim", "4", "--metric", "ip", "--backend", "cpu", "--data-dir", s(&d)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let _guard = KillOnPanic(srv.id() as i32);
    BufReader::new(srv.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert!(line.contains("count=49"), "{line}");
    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(srv.id() as i32, libc::SIGTERM) };
    let out = srv.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("torn tail"), "{}", String::from_utf8_lossy(&out.stderr));
    // Mid-log corruption: serve fails with CORRUPT naming file and offset; repair recovers.
    let mut b = std::fs::read(&wal).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x40;
    std::fs::write(&wal, &b).unwrap();
    let o = kalosd(&["serve", "--name", &name, "--dim", "4", "--metric", "ip", "--data-dir", s(&d)]);
    assert_eq!(o.status.code(), Some(1));
    let t = text(&o);
    assert!(t.contains("CORRUPT") && t.contains(s(&wal)) && t.contains("at offset") && t.contains("kalosd repair"), "{t}");
    let o = kalosd(&["repair", "--data-dir", s(&d)]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("rows recovered") && t.contains("original files are in"), "{t}");
    let k = Kalos::open(&name, &o_with(&d)).unwrap();
    let n = k.stats().unwrap().count;
    assert!(n > 0 && n < 49, "{n}");
    // The intact prefix: ids 0..n in order, with their payloads.
    for i in 0..n {
        let r = &k.get(&[i]).unwrap()[0];
        assert_eq!(r.payload.as_deref(), Some(format!("p{i}").as_bytes()));
    }
    k.close();
    // Repair of a healthy directory changes nothing.
    let o = kalosd(&["repair", "--data-dir", s(&d)]);
    assert!(text(&o).contains("nothing to repair"), "{}", text(&o));
    std::fs::remove_dir_all(&w).unwrap();
}

fn o_with(d: &Path) -> Options {
    Options { role: Role::Server, dim: 4, metric: Metric::InnerProduct, data_dir: Some(d.to_path_buf()), ..Options::default() }
}
