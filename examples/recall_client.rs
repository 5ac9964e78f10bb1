//! A client process for the main job: attaches to a running store (e.g. `kalosd serve`),
//! prints the recalled memories for a few queries, then measures recall latency percentiles.
//!
//!   cargo run --release --example recall_client -- --name demo [--queries 20000] [--k 10]

use std::time::Instant;

use kalos::*;

fn arg(v: &[String], key: &str) -> Option<String> {
    v.iter().position(|a| a == key).and_then(|i| v.get(i + 1)).cloned()
}

fn main() {
    let v: Vec<String> = std::env::args().collect();
    let name = arg(&v, "--name").unwrap_or_else(|| "demo".into());
    let nq: usize = arg(&v, "--queries").and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let k: usize = arg(&v, "--k").and_then(|s| s.parse().ok()).unwrap_or(10);
    let spin: u64 = arg(&v, "--spin-us").and_then(|s| s.parse().ok()).unwrap_or(50);
    // Pause between timed requests (ms): 0 measures back-to-back requests; a pause longer than
    // the server's spin window measures a request that has to wake a parked server.
    let gap_ms: u64 = arg(&v, "--gap-ms").and_then(|s| s.parse().ok()).unwrap_or(0);
    let opts = Options { role: Role::Client, client_spin_ns: spin * 1000, ..Options::default() };
    let c = Kalos::open(&name, &opts).unwrap_or_else(|e| {
        eprintln!("recall_client: cannot attach to {name:?}: {e}");
        std::process::exit(2)
    });
    let dim = c.dim();
    let st = c.stats().expect("stats");
    println!("attached to {name:?}: {} memories, dim {dim}, metric {}, engine {}", st.count, c.metric().name(), st.engine_name);

    // Queries: stored memories' own vectors, slightly perturbed, so answers are meaningful.
    let mut s = 0x9e3779b97f4a7c15u64 ^ std::process::id() as u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let count = st.count.max(1);
    let mut make_query = || -> Vec<f32> {
        let id = rnd() % count;
        match c.get(&[id]) {
            Ok(r) => r[0].vector.iter().map(|x| x + ((rnd() % 1000) as f32 / 1000.0 - 0.5) * 0.1).collect(),
            Err(_) => (0..dim).map(|_| (rnd() % 1000) as f32 / 500.0 - 1.0).collect(),
        }
    };
    for (i, user) in [(0, None), (1, Some(7u64))] {
        let q = make_query();
        let ro = RecallOptions { namespaces: user.map(|u| vec![u]), ..Default::default() };
        let t = Instant::now();
        let hits = c.recall_with_payloads(&q, 5, &ro).expect("recall");
        let dt = t.elapsed();
        println!(
            "\nquery {i} ({}), top 5 in {:.1} us:",
            user.map_or("all users".to_string(), |u| format!("user {u} only")),
            dt.as_secs_f64() * 1e6
        );
        for h in hits {
            let text = h.payload.map(|p| String::from_utf8_lossy(&p).into_owned()).unwrap_or_default();
            println!("  id {:>8}  score {:>8.4}  {text}", h.id, h.score);
        }
    }
    let queries: Vec<Vec<f32>> = (0..256).map(|_| make_query()).collect();
    let mut ids = vec![0u64; k];
    let mut scores = vec![0f32; k];
    let ro = RecallOptions::default();
    for q in queries.iter().take(100) {
        c.recall_into(q, k, &ro, &mut ids, &mut scores).expect("warm-up");
    }
    let mut lat = Vec::with_capacity(nq);
    for i in 0..nq {
        if gap_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(gap_ms));
        }
        let t = Instant::now();
        c.recall_into(&queries[i % queries.len()], k, &ro, &mut ids, &mut scores).expect("recall");
        lat.push(t.elapsed().as_nanos() as u64);
    }
    lat.sort_unstable();
    let p = |x: f64| lat[((lat.len() - 1) as f64 * x) as usize] as f64 / 1e3;
    println!(
        "\n{nq} recalls, k={k}, gap {gap_ms} ms, from a separate process: p50 {:.1} us  p99 {:.1} us  p99.9 {:.1} us  max {:.1} us",
        p(0.5),
        p(0.99),
        p(0.999),
        p(1.0)
    );
    let st = c.stats().expect("stats");
    println!(
        "server side: p50 {:.1} us  p99 {:.1} us over the last requests; {} requests served",
        st.p50_ns as f64 / 1e3,
        st.p99_ns as f64 / 1e3,
        st.requests
    );
}
