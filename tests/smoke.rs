use kalos::*;

#[test]
fn smoke_server_and_client_in_one_process() {
    let name = format!("smoke-{}", std::process::id());
    let o = Options { role: Role::Server, dim: 4, metric: Metric::InnerProduct, ..Options::default() };
    let s = Kalos::open(&name, &o).unwrap();
    s.upsert(&[1, 2, 3], &[1., 0., 0., 0., 0., 1., 0., 0., 0.5, 0.5, 0., 0.], &UpsertOptions::default()).unwrap();
    let co = Options { role: Role::Client, ..Options::default() };
    let c = Kalos::open(&name, &co).unwrap();
    let hits = c.recall(&[1., 0., 0., 0.], 2, &RecallOptions::default()).unwrap();
    assert_eq!(hits.iter().map(|h| h.id).collect::<Vec<_>>(), vec![1, 3]);
    let st = c.stats().unwrap();
    assert_eq!(st.count, 3);
    drop(c);
    s.close();
}

/// Backend auto on a machine where the CUDA engine cannot start serves from the CPU engine and
/// says why in stats, so a fallback is seen; an explicit CPU backend has nothing to report.
#[test]
fn auto_fallback_reason_is_reported() {
    let name = format!("smoke-auto-{}", std::process::id());
    let o = Options { role: Role::Server, dim: 4, backend: Backend::Auto, ..Options::default() };
    let s = Kalos::open(&name, &o).unwrap();
    let st = s.stats().unwrap();
    if kalos::engine::cuda::libraries_present() {
        eprintln!("SKIP: CUDA libraries are present here; engine {} reason {:?}", st.engine_name, st.fallback_reason);
    } else {
        assert_eq!(st.engine, 1, "{st:?}");
        assert!(st.fallback_reason.contains("CUDA is not available"), "{:?}", st.fallback_reason);
    }
    s.close();
    let name = format!("smoke-cpu-{}", std::process::id());
    let o = Options { role: Role::Server, dim: 4, backend: Backend::Cpu, ..Options::default() };
    let s = Kalos::open(&name, &o).unwrap();
    assert_eq!(s.stats().unwrap().fallback_reason, "");
    s.close();
}
