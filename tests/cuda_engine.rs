//! The CUDA engine on a machine without a usable GPU (CI): the library loads, `auto` serves from
//! the CPU engine, an explicit `cuda` request fails with BACKEND_UNAVAILABLE and a clear message,
//! nothing panics. On a machine with a GPU these tests check the GPU path instead
//! (tests/gpu/run.sh is the full GPU suite).

use kalos::*;

fn gpu_present() -> bool {
    kalos::engine::cuda::probe().is_ok()
}

fn opts(backend: Backend) -> Options {
    Options { role: Role::Server, dim: 8, metric: Metric::InnerProduct, backend, ..Options::default() }
}

#[test]
fn explicit_cuda_without_gpu_is_a_clear_status() {
    let name = format!("cudatest-x-{}", std::process::id());
    let r = Kalos::open(&name, &opts(Backend::Cuda));
    if gpu_present() {
        let k = r.expect("a GPU is present: the CUDA engine must start");
        assert_eq!(k.stats().unwrap().engine, 2);
        k.close();
    } else {
        let e = r.err().expect("no GPU: opening with backend cuda must fail");
        assert_eq!(e.status, Status::BackendUnavailable, "{e}");
        assert!(e.message.contains("CUDA") || e.message.contains("GPU"), "{e}");
    }
}

#[test]
fn auto_serves_everywhere_and_says_which_engine() {
    let name = format!("cudatest-a-{}", std::process::id());
    let k = Kalos::open(&name, &opts(Backend::Auto)).unwrap();
    let v: Vec<f32> = (0..80).map(|i| ((i * 7919) % 13) as f32 - 6.0).collect();
    let ids: Vec<u64> = (1..=10).collect();
    k.upsert(&ids, &v, &UpsertOptions::default()).unwrap();
    let hits = k.recall(&v[8..16], 3, &RecallOptions::default()).unwrap();
    assert_eq!(hits.len(), 3);
    let st = k.stats().unwrap();
    if gpu_present() {
        assert_eq!(st.engine, 2);
        assert!(st.engine_name.starts_with("cuda"), "{}", st.engine_name);
    } else {
        assert_eq!(st.engine, 1);
        assert!(st.engine_name.starts_with("cpu"), "{}", st.engine_name);
    }
    k.close();
}

#[test]
fn probing_never_panics() {
    let _ = kalos::engine::cuda::libraries_present();
    let _ = kalos::engine::cuda::probe();
}
