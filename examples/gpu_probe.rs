//! In-process probe of the CUDA engine's batched search (no IPC, no Python): engine time per
//! batch of `nq` queries on an `n x dim` table for several batch settings, each compared with
//! the first setting's answers. A tuning aid for the GPU machine (docs/history/gpu-sessions.md).
//!
//!   cargo run --release --example gpu_probe -- [n] [dim] [f32|f16|bf16] [nq] [setting ...]
//!
//! A setting is `pipe:gemm_sms:score16[:staged[:tile_mb[:fseg]]]`, e.g. `0:0:0` (one stream, every SM, f32 score
//! tiles), `1:116:0` (GEMM and filter pipelined, GEMMs on 116 SMs), `1:0:1:1` (pipelined, f16
//! tiles, the queries in a region registered with `attach_staging`, as the server's private copy
//! of a large request is: no staging copy). tile_mb 0 (or absent) is the default tile size;
//! fseg is the filter's cruise segment in steps (absent: the engine's default, 16; 0: off).
//! Data: uniform in [-1, 1), fresh each run; inner product; k = 10.
use std::time::Instant;

use kalos::client::Options;
use kalos::engine::cuda;
use kalos::engine::Engine;
use kalos::store::{Store, UpsertItem, NEVER};
use kalos::types::{Dtype, Filter, Hit, Metric};
use kalos::wire::SearchRequest;
use rand::{Rng, SeedableRng};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let n: usize = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let dim: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(768);
    let dtype = match a.get(3).map(String::as_str) {
        Some("f32") => Dtype::F32,
        Some("bf16") => Dtype::Bf16,
        _ => Dtype::F16,
    };
    let nq: usize = a.get(4).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let settings: Vec<(bool, usize, bool, bool, usize, u32)> = if a.len() > 5 {
        a[5..]
            .iter()
            .map(|s| {
                let p: Vec<usize> = s.split(':').map(|x| x.parse().expect("setting pipe:gemm_sms:score16")).collect();
                (
                    p[0] != 0,
                    p.get(1).copied().unwrap_or(0),
                    p.get(2).copied().unwrap_or(0) != 0,
                    p.get(3).copied().unwrap_or(0) != 0,
                    p.get(4).copied().unwrap_or(0),
                    p.get(5).map_or(cuda::FILTER_SEG, |&x| x as u32),
                )
            })
            .collect()
    } else {
        vec![(false, 0, false, false, 0, cuda::FILTER_SEG), (true, 0, false, false, 0, cuda::FILTER_SEG)]
    };
    let k = 10;
    let t0 = Instant::now();
    let mut r = rand::rngs::StdRng::seed_from_u64(rand::random());
    let mut st = Store::new(dim, Metric::InnerProduct, n.max(1), 0);
    let chunk = 65536;
    let mut vecs = vec![0f32; chunk * dim];
    for c0 in (0..n).step_by(chunk) {
        let m = chunk.min(n - c0);
        vecs[..m * dim].iter_mut().for_each(|x| *x = r.random_range(-1.0f32..1.0));
        let items: Vec<UpsertItem<'_>> = (0..m)
            .map(|i| UpsertItem {
                fields: &[],
                id: (c0 + i) as u64,
                namespace: 0,
                vector: &vecs[i * dim..(i + 1) * dim],
                payload: None,
                created_ms: 0,
                expires_ms: NEVER,
            })
            .collect();
        st.validate_upsert(&items).unwrap();
        st.apply_upsert(&items);
    }
    let opts = Options { dim: dim as u32, dtype, ..Options::default() };
    let mut e = cuda::create_engine(&opts, &st).expect("CUDA engine");
    let dirty: Vec<u32> = (0..st.len() as u32).collect();
    st.take_dirty();
    e.sync(&st, &dirty).expect("sync");
    println!(
        "gpu_probe: {n} x {dim} {dtype:?}, {nq} queries, k = {k}, {} SMs; table ready in {:.1} s ({})",
        e.sm_count(),
        t0.elapsed().as_secs_f64(),
        e.describe()
    );
    let qs: Vec<f32> = (0..nq * dim).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let all = Filter::all();
    // The same queries in a registered staging region (what the server's mirror is).
    let mut reg = memmap2::MmapMut::map_anon(qs.len() * 4).expect("staging region");
    // SAFETY: qs is a live Vec<f32> of qs.len() values, readable as 4 * qs.len() bytes.
    reg.copy_from_slice(unsafe { std::slice::from_raw_parts(qs.as_ptr() as *const u8, qs.len() * 4) });
    let registered = e.attach_staging(reg.as_mut_ptr(), reg.len());
    // SAFETY: the region holds qs.len() f32 values (page-aligned, copied from qs above).
    let qs_reg: &[f32] = unsafe { std::slice::from_raw_parts(reg.as_ptr() as *const f32, qs.len()) };
    let mut base: Option<Vec<Vec<Hit>>> = None;
    for &(pipe, sms, h16, staged, tile_mb, fseg) in &settings {
        e.set_batch_tuning(pipe, sms, h16, tile_mb, fseg);
        let q = if staged && registered { qs_reg } else { &qs[..] };
        let req = SearchRequest { queries: q, nq, k, filter: &all, recency: None, now_ms: 0, direct: None, slot: None };
        let mut out = Vec::new();
        let mut times = Vec::new();
        for i in 0..14 {
            let t = Instant::now();
            e.search(&st, &req, &mut out).expect("batch search");
            if i >= 4 {
                times.push((t.elapsed().as_secs_f64() * 1e3, e.last_batch_ns() as f64 / 1e6));
            }
        }
        times.sort_by(|x, y| x.0.partial_cmp(&y.0).unwrap());
        let (wall, eng) = times[times.len() / 2];
        // Against the first setting: queries whose ids differ, and the recall of its ids.
        let (diff, recall) = match &base {
            None => {
                base = Some(out.clone());
                (0, 1.0)
            }
            Some(b) => {
                let mut d = 0;
                let mut hit = 0usize;
                let mut tot = 0usize;
                for (x, y) in out.iter().zip(b) {
                    if x.iter().map(|h| h.id).ne(y.iter().map(|h| h.id)) {
                        d += 1;
                    }
                    tot += y.len();
                    hit += y.iter().filter(|h| x.iter().any(|g| g.id == h.id)).count();
                }
                (d, hit as f64 / tot.max(1) as f64)
            }
        };
        println!(
            "gpu_probe pipe={} gemm_sms={} score16={} staged={} tile_mb={} fseg={}: batch p50 {wall:.3} ms (engine {eng:.3} ms, min {:.3}), {:.1}k queries/s; vs first setting: {diff} of {nq} queries differ, recall {recall:.4}",
            pipe as u8,
            if sms == 0 { e.sm_count() } else { sms },
            h16 as u8,
            (staged && registered) as u8,
            tile_mb,
            fseg,
            times[0].0,
            nq as f64 / wall * 1e3 / 1e3,
        );
    }
}
