use kalos::*;

#[test]
fn smoke_server_and_client_in_one_process() {
    let name = format!("smoke-{}", std::process::id());
    let mut o = Options::default();
    o.role = Role::Server;
    o.dim = 4;
    o.metric = Metric::InnerProduct;
    let s = Kalos::open(&name, &o).unwrap();
    s.upsert(&[1, 2, 3], &[1., 0., 0., 0., 0., 1., 0., 0., 0.5, 0.5, 0., 0.], &UpsertOptions::default()).unwrap();
    let mut co = Options::default();
    co.role = Role::Client;
    let c = Kalos::open(&name, &co).unwrap();
    let hits = c.recall(&[1., 0., 0., 0.], 2, &RecallOptions::default()).unwrap();
    assert_eq!(hits.iter().map(|h| h.id).collect::<Vec<_>>(), vec![1, 3]);
    let st = c.stats().unwrap();
    assert_eq!(st.count, 3);
    drop(c);
    s.close();
}
