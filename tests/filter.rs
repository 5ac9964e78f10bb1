//! Metadata filters end to end on the CPU engine: thousands of random filter expressions over
//! random typed fields, every recall checked exactly against a brute-force reference that
//! evaluates each expression row by row on the test's own copy of the data (not the store's
//! columns); malformed expressions refused by the client and by the server; type conflicts;
//! delete by filter. The seed is printed; KALOS_TEST_SEED replays one.
//!
//! Vectors and queries hold small integers, so every score (ip: a dot product; l2: a squared
//! distance) is exact in f32 and the comparison is exact, ties included (lower id first).

use std::collections::HashMap;

use kalos::filter::{Cmp, Expr};
use kalos::meta::{encode_fields_block, Field, Value};
use kalos::{Backend, Kalos, Metric, Options, RecallOptions, Role, Status, UpsertOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod raw_slot;
use raw_slot::raw_call;

const DIM: usize = 8;

fn rng(test: &str) -> StdRng {
    let seed: u64 = std::env::var("KALOS_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("{test}: seed {seed} (KALOS_TEST_SEED={seed} to replay)");
    StdRng::seed_from_u64(seed)
}

fn open(tag: &str, metric: Metric, threads: u32) -> Kalos {
    // Split scans even for small tables, so the bitmap is read by several workers.
    std::env::set_var("KALOS_CPU_PARALLEL_MIN_BYTES", "1");
    let name = format!("filt-{tag}-{}-{}", std::process::id(), rand::random::<u32>());
    let o =
        Options { role: Role::Server, dim: DIM as u32, metric, backend: Backend::Cpu, threads, capacity: 100_000, ..Options::default() };
    Kalos::open(&name, &o).unwrap()
}

const USERS: [&str; 6] = ["ann", "bob", "cyd", "dee", "eve", "fay"];
const TAGS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

/// Random fields of one memory; `all` sets every field (the first write, which types them).
fn fields(r: &mut StdRng, id: u64, all: bool) -> Vec<Field> {
    let mut f = Vec::new();
    let maybe = |r: &mut StdRng, p: f64| all || r.random_bool(p);
    if maybe(r, 0.9) {
        f.push(Field::new("user", Value::Keyword(USERS[r.random_range(0..USERS.len())].into())));
    }
    if maybe(r, 0.7) {
        let n = r.random_range(0..4);
        f.push(Field::new("tags", Value::Tags((0..n).map(|_| TAGS[r.random_range(0..TAGS.len())].to_string()).collect())));
    }
    if maybe(r, 0.8) {
        f.push(Field::new("n", Value::Int(r.random_range(-10..10))));
    }
    if maybe(r, 0.7) {
        f.push(Field::new("score", Value::Float(r.random_range(-6..6) as f64 * 0.5)));
    }
    if maybe(r, 0.6) {
        f.push(Field::new("flag", Value::Bool(r.random())));
    }
    if maybe(r, 0.5) {
        f.push(Field::new("ts", Value::Timestamp(r.random_range(0..20) * 1000)));
    }
    f.push(Field::new("doc", Value::Keyword(format!("d{id}"))));
    f
}

fn random_value(r: &mut StdRng) -> Value {
    match r.random_range(0..12) {
        0..=2 => Value::Keyword(USERS[r.random_range(0..USERS.len())].into()),
        3..=4 => Value::Keyword(TAGS[r.random_range(0..TAGS.len())].into()),
        5 => Value::Keyword("zz".into()),
        6..=7 => Value::Int(r.random_range(-11..11)),
        8..=9 => Value::Float(r.random_range(-14..14) as f64 * 0.25),
        10 => Value::Bool(r.random()),
        _ => Value::Timestamp(r.random_range(-1..21) * 1000),
    }
}

fn random_leaf(r: &mut StdRng, ids: &[u64]) -> Expr {
    const NAMES: [&str; 8] = ["user", "tags", "n", "score", "flag", "ts", "doc", "nope"];
    let f = NAMES[r.random_range(0..NAMES.len())].to_string();
    if f == "doc" || r.random_range(0..12) == 0 {
        // A very selective filter: one memory (or a handful) by its doc id.
        let pick = |r: &mut StdRng| Value::Keyword(format!("d{}", ids[r.random_range(0..ids.len())]));
        return if r.random() {
            Expr::Cmp(Cmp::Eq, "doc".into(), pick(r))
        } else {
            let n = r.random_range(1..8);
            Expr::In(false, "doc".into(), (0..n).map(|_| pick(r)).collect())
        };
    }
    match r.random_range(0..10) {
        0..=5 => {
            let op = [Cmp::Eq, Cmp::Ne, Cmp::Gt, Cmp::Gte, Cmp::Lt, Cmp::Lte][r.random_range(0..6)];
            Expr::Cmp(op, f, random_value(r))
        }
        6..=7 => {
            let n = r.random_range(1..7);
            Expr::In(r.random(), f, (0..n).map(|_| random_value(r)).collect())
        }
        8 => Expr::Exists(f),
        _ => Expr::Contains(f, random_value(r)),
    }
}

fn random_expr(r: &mut StdRng, depth: usize, ids: &[u64]) -> Expr {
    if depth == 0 || r.random_range(0..3) == 0 {
        return random_leaf(r, ids);
    }
    match r.random_range(0..3) {
        0 => Expr::And((0..r.random_range(1..4)).map(|_| random_expr(r, depth - 1, ids)).collect()),
        1 => Expr::Or((0..r.random_range(1..4)).map(|_| random_expr(r, depth - 1, ids)).collect()),
        _ => Expr::Not(Box::new(random_expr(r, depth - 1, ids))),
    }
}

// ---- The reference: the documented semantics, row by row, on the test's own data. ----

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) | Value::Timestamp(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    }
}

/// The order of a stored value and a filter value of the same kind; None across kinds.
fn order(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Value::Keyword(x), Value::Keyword(y)) => Some(x.as_bytes().cmp(y.as_bytes())),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        _ => num(a)?.partial_cmp(&num(b)?),
    }
}

fn ref_eq(row: &[Field], f: &str, v: &Value) -> bool {
    match row.iter().find(|x| x.name == f).map(|x| &x.value) {
        None => false,
        Some(Value::Tags(t)) => matches!(v, Value::Keyword(k) if t.contains(k)),
        Some(a) => order(a, v) == Some(std::cmp::Ordering::Equal),
    }
}

fn ref_match(e: &Expr, row: &[Field]) -> bool {
    use std::cmp::Ordering::*;
    match e {
        Expr::And(v) => v.iter().all(|x| ref_match(x, row)),
        Expr::Or(v) => v.iter().any(|x| ref_match(x, row)),
        Expr::Not(x) => !ref_match(x, row),
        Expr::Cmp(Cmp::Eq, f, v) | Expr::Contains(f, v) => ref_eq(row, f, v),
        Expr::Cmp(Cmp::Ne, f, v) => !ref_eq(row, f, v),
        Expr::Cmp(op, f, v) => match row.iter().find(|x| &x.name == f).map(|x| &x.value) {
            None | Some(Value::Tags(_)) => false,
            Some(a) => match order(a, v) {
                None => false,
                Some(o) => match op {
                    Cmp::Gt => o == Greater,
                    Cmp::Gte => o != Less,
                    Cmp::Lt => o == Less,
                    Cmp::Lte => o != Greater,
                    _ => unreachable!(),
                },
            },
        },
        Expr::In(neg, f, vs) => vs.iter().any(|v| ref_eq(row, f, v)) != *neg,
        Expr::Exists(f) => match row.iter().find(|x| &x.name == f).map(|x| &x.value) {
            None => false,
            Some(Value::Tags(t)) => !t.is_empty(),
            Some(_) => true,
        },
    }
}

struct Mem {
    vec: Vec<f32>,
    ns: u64,
    fields: Vec<Field>,
}

fn score(metric: Metric, q: &[f32], x: &[f32]) -> f32 {
    match metric {
        Metric::L2 => q.iter().zip(x).map(|(a, b)| (a - b) * (a - b)).sum(),
        _ => q.iter().zip(x).map(|(a, b)| a * b).sum(),
    }
}

fn reference(model: &HashMap<u64, Mem>, metric: Metric, q: &[f32], k: usize, e: &Expr, ns: Option<&[u64]>) -> Vec<(u64, f32)> {
    let mut all: Vec<(u64, f32)> = model
        .iter()
        .filter(|(_, m)| ns.is_none_or(|ns| ns.contains(&m.ns)) && ref_match(e, &m.fields))
        .map(|(&id, m)| (id, score(metric, q, &m.vec)))
        .collect();
    let better = |a: f32, b: f32| if metric == Metric::L2 { a.partial_cmp(&b).unwrap() } else { b.partial_cmp(&a).unwrap() };
    all.sort_by(|a, b| better(a.1, b.1).then(a.0.cmp(&b.0)));
    all.truncate(k);
    all
}

fn int_vec(r: &mut StdRng) -> Vec<f32> {
    (0..DIM).map(|_| r.random_range(-3..=3) as f32).collect()
}

/// Writes `n` memories (ids from `next`) with random fields to both the store and the model.
fn write(k: &Kalos, r: &mut StdRng, model: &mut HashMap<u64, Mem>, ids: &[u64], first_types: bool) {
    let vecs: Vec<Vec<f32>> = ids.iter().map(|_| int_vec(r)).collect();
    let ns: Vec<u64> = ids.iter().map(|_| r.random_range(0..4)).collect();
    let fl: Vec<Vec<Field>> = ids.iter().enumerate().map(|(i, &id)| fields(r, id, first_types && i == 0)).collect();
    let flat: Vec<f32> = vecs.concat();
    let o = UpsertOptions { namespaces: kalos::Namespaces::PerItem(&ns), fields: Some(&fl), ..Default::default() };
    k.upsert(ids, &flat, &o).unwrap();
    for (i, &id) in ids.iter().enumerate() {
        model.insert(id, Mem { vec: vecs[i].clone(), ns: ns[i], fields: fl[i].clone() });
    }
}

fn run_random(metric: Metric, tag: &str) {
    let mut r = rng(tag);
    let k = open(tag, metric, 2);
    let mut model: HashMap<u64, Mem> = HashMap::new();
    let ids: Vec<u64> = (0..2500u64).map(|i| i * 7 + 3).collect();
    for (ci, chunk) in ids.chunks(500).enumerate() {
        write(&k, &mut r, &mut model, chunk, ci == 0);
    }
    // Deletes move the last row into the hole (every field column follows); upserts replace
    // every field a memory had.
    let mut gone: Vec<u64> = ids.iter().copied().filter(|_| r.random_range(0..10) == 0).collect();
    gone.sort_unstable();
    gone.dedup();
    k.delete(&gone).unwrap();
    for id in &gone {
        model.remove(id);
    }
    let again: Vec<u64> = gone.iter().copied().step_by(2).chain(ids.iter().copied().step_by(11)).collect();
    let mut again = again;
    again.sort_unstable();
    again.dedup();
    write(&k, &mut r, &mut model, &again, false);
    let live: Vec<u64> = model.keys().copied().collect();

    let (mut nonempty, mut short, mut sparse) = (0, 0, 0);
    let cases = 3000;
    for case in 0..cases {
        let e = random_expr(&mut r, 4, &live);
        let q = int_vec(&mut r);
        let kk = [1, 5, 10, 50, 300][r.random_range(0..5)];
        let ns: Option<Vec<u64>> = (r.random_range(0..4) == 0).then(|| vec![r.random_range(0..4), r.random_range(0..4)]);
        let want = reference(&model, metric, &q, kk, &e, ns.as_deref());
        let all = reference(&model, metric, &q, usize::MAX, &e, ns.as_deref()).len();
        let opts = RecallOptions { filter: Some(e.encode()), namespaces: ns.clone(), ..Default::default() };
        let got: Vec<(u64, f32)> = k.recall(&q, kk, &opts).unwrap().into_iter().map(|h| (h.id, h.score)).collect();
        assert_eq!(got, want, "case {case}: {e:?} ns {ns:?} k {kk} ({all} rows match)");
        // Every matching row counts: k results whenever at least k rows match.
        assert_eq!(got.len(), kk.min(all));
        nonempty += (all > 0) as usize;
        short += (all > 0 && all < kk) as usize;
        sparse += (all > 0 && all * 1000 <= model.len()) as usize;
        if case % 10 == 0 {
            // The same filter in a batch of queries (the tile kernel) and with payloads.
            let qs: Vec<Vec<f32>> = (0..3).map(|_| int_vec(&mut r)).collect();
            let got = k.recall_batch(&qs.concat(), 3, kk, &opts).unwrap();
            for (qi, q) in qs.iter().enumerate() {
                let want = reference(&model, metric, q, kk, &e, ns.as_deref());
                let g: Vec<(u64, f32)> = got[qi].iter().map(|h| (h.id, h.score)).collect();
                assert_eq!(g, want, "case {case} batch query {qi}: {e:?}");
            }
            let p = k.recall_with_payloads(&q, kk, &opts).unwrap();
            assert_eq!(p.iter().map(|h| h.id).collect::<Vec<_>>(), want.iter().map(|w| w.0).collect::<Vec<_>>());
        }
    }
    println!("{tag}: {cases} expressions, {nonempty} matching some row, {short} fewer than k, {sparse} under 0.1% of rows");
    assert!(nonempty > cases / 4 && short > 50 && sparse > 50, "the generator covers the cases");

    // Fields come back with get, as written (a float field keeps floats, tags come back sorted
    // and deduplicated by the store).
    let some: Vec<u64> = live.iter().copied().take(50).collect();
    for rec in k.get(&some).unwrap() {
        let mut want = model[&rec.id].fields.clone();
        for f in &mut want {
            if let Value::Tags(t) = &mut f.value {
                t.sort();
                t.dedup();
            }
        }
        want.retain(|f| !matches!(&f.value, Value::Tags(t) if t.is_empty()));
        let mut got = rec.fields.clone();
        got.sort_by(|a, b| a.name.cmp(&b.name));
        want.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(got, want, "fields of id {}", rec.id);
    }
}

#[test]
fn random_filters_are_exact_ip() {
    run_random(Metric::InnerProduct, "ip");
}

#[test]
fn random_filters_are_exact_l2() {
    run_random(Metric::L2, "l2");
}

#[test]
fn malformed_expressions_are_refused_by_the_client() {
    let k = open("bad", Metric::InnerProduct, 1);
    k.upsert(&[1], &[1.0; DIM], &UpsertOptions::default()).unwrap();
    let good = Expr::And(vec![Expr::eq("a", Value::Int(1)), Expr::Exists("b".into())]).encode();
    let mut deep = Expr::Exists("a".into());
    for _ in 0..kalos::filter::MAX_FILTER_DEPTH {
        deep = Expr::Not(Box::new(deep));
    }
    let mut bad: Vec<(Vec<u8>, &str)> = vec![
        (vec![], "truncated"),
        (vec![9, 12, 1, b'a'], "version 9"),
        (vec![1, 99], "unknown operator 99"),
        (vec![1, 4, 0], "field name"),
        (vec![1, 4, 1, b'a', 77], "unknown value type 77"),
        (vec![1, 4, 1, b'a', 5, 2], "bool"),
        (vec![1, 1, 0, 0], "no operands"),
        (vec![1, 10, 1, b'a', 0, 0], "no values"),
        (deep.encode(), "deeper"),
        (Expr::eq("a", Value::Float(f64::NAN)).encode(), "not finite"),
        (Expr::eq("a", Value::Tags(vec![])).encode(), "value type 2"),
        (vec![1u8; 70_000], "at most 65536"),
        (vec![1, 4, 2, 0xff, 0xfe, 3, 0, 0, 0, 0, 0, 0, 0, 0], "not UTF-8"),
    ];
    for cut in 1..good.len() {
        bad.push((good[..cut].to_vec(), "truncated"));
    }
    let mut trailing = good.clone();
    trailing.push(0);
    bad.push((trailing, "trailing"));
    for (b, why) in bad {
        let e = k.recall(&[1.0; DIM], 1, &RecallOptions { filter: Some(b.clone()), ..Default::default() }).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{b:?}");
        assert!(e.message.contains(why), "{b:?}: {:?} lacks {why:?}", e.message);
        let e = k.delete_where(None, &b).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument);
    }
    assert_eq!(k.stats().unwrap().count as usize, 1, "nothing was deleted");
    assert_eq!(k.recall(&[1.0; DIM], 1, &RecallOptions { filter: Some(good), ..Default::default() }).unwrap().len(), 0);
}

/// A hostile client that skips the client library's checks: the server decodes the expression
/// on its private copy and answers INVALID_ARGUMENT; the engine never sees it, and the server
/// keeps serving.
#[test]
fn malformed_expressions_are_refused_by_the_server() {
    use kalos::wire::request::recall_head;
    let name = format!("filt-raw-{}", std::process::id());
    let o = Options { role: Role::Server, dim: DIM as u32, metric: Metric::InnerProduct, backend: Backend::Cpu, ..Options::default() };
    let k = Kalos::open(&name, &o).unwrap();
    k.upsert(&[1], &[1.0; DIM], &UpsertOptions::default()).unwrap();
    let seg = kalos::shm::Segment::attach(&name).unwrap();
    for bad in [
        vec![1u8, 99],
        vec![2, 4, 1, b'a', 3],
        vec![],
        vec![1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 12, 1, b'a'],
    ] {
        let mut w = kalos::wire::Writer::new();
        recall_head(&mut w, 1, 1, 0, None, None, Some(&bad), None);
        w.f32s(&[1.0; DIM]);
        let (st, body) = raw_call(&seg, 0, &w.buf, w.buf.len() as u32);
        assert_eq!(st, Status::InvalidArgument as u32, "{bad:?}: {}", String::from_utf8_lossy(&body));
    }
    // Non-zero padding after the expression.
    let mut w = kalos::wire::Writer::new();
    recall_head(&mut w, 1, 1, 0, None, None, Some(&Expr::Exists("ab".into()).encode()), None);
    let n = w.buf.len();
    w.buf[n - 1] = 7;
    w.f32s(&[1.0; DIM]);
    assert_eq!(raw_call(&seg, 0, &w.buf, w.buf.len() as u32).0, Status::InvalidArgument as u32);
    assert_eq!(k.recall(&[1.0; DIM], 1, &RecallOptions::default()).unwrap().len(), 1, "the server still serves");
}

#[test]
fn a_field_keeps_its_first_type_and_a_bad_write_changes_nothing() {
    let k = open("types", Metric::InnerProduct, 1);
    let v = [1.0f32; DIM];
    let f1 = vec![vec![Field::new("n", Value::Int(1)), Field::new("x", Value::Float(0.5))]];
    k.upsert(&[1], &v, &UpsertOptions { fields: Some(&f1), ..Default::default() }).unwrap();
    // Two items, the second with a keyword for the int64 field: neither is written.
    let f2 = vec![vec![Field::new("n", Value::Int(2))], vec![Field::new("n", Value::Keyword("two".into()))]];
    let e = k.upsert(&[2, 3], &[v, v].concat(), &UpsertOptions { fields: Some(&f2), ..Default::default() }).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("\"n\"") && e.message.contains("id 3") && e.message.contains("int64"), "{}", e.message);
    assert_eq!(k.stats().unwrap().count as usize, 1);
    // An int is accepted for a float64 field.
    let f3 = vec![vec![Field::new("x", Value::Int(2))]];
    k.upsert(&[4], &v, &UpsertOptions { fields: Some(&f3), ..Default::default() }).unwrap();
    assert_eq!(k.get(&[4]).unwrap()[0].fields, vec![Field::new("x", Value::Float(2.0))]);
    // Limits are checked before sending: a name too long, a field twice.
    let long = vec![vec![Field::new(&"x".repeat(65), Value::Int(1))]];
    assert_eq!(
        k.upsert(&[5], &v, &UpsertOptions { fields: Some(&long), ..Default::default() }).unwrap_err().status,
        Status::InvalidArgument
    );
    let twice = vec![vec![Field::new("a", Value::Int(1)), Field::new("a", Value::Int(1))]];
    assert_eq!(
        k.upsert(&[5], &v, &UpsertOptions { fields: Some(&twice), ..Default::default() }).unwrap_err().status,
        Status::InvalidArgument
    );
    // The block form of the C ABI describes exactly one list per item.
    assert_eq!(kalos::meta::decode_fields_block(&encode_fields_block(&[&f1[0]]), 2).unwrap_err().status, Status::InvalidArgument);
    // clear forgets the types.
    k.clear().unwrap();
    let f4 = vec![vec![Field::new("n", Value::Keyword("now a keyword".into()))]];
    k.upsert(&[1], &v, &UpsertOptions { fields: Some(&f4), ..Default::default() }).unwrap();
}

#[test]
fn delete_where_deletes_what_matches() {
    let mut r = rng("delete_where");
    let k = open("delwhere", Metric::InnerProduct, 1);
    let mut model = HashMap::new();
    let ids: Vec<u64> = (0..400).collect();
    write(&k, &mut r, &mut model, &ids, true);
    for _ in 0..20 {
        let live: Vec<u64> = model.keys().copied().collect();
        if live.is_empty() {
            break;
        }
        let e = random_expr(&mut r, 2, &live);
        let ns: Option<Vec<u64>> = r.random::<bool>().then(|| vec![r.random_range(0..4)]);
        let victims: Vec<u64> = model
            .iter()
            .filter(|(_, m)| ns.as_ref().is_none_or(|n| n.contains(&m.ns)) && ref_match(&e, &m.fields))
            .map(|(&id, _)| id)
            .collect();
        let n = k.delete_where(ns.as_deref(), &e.encode()).unwrap();
        assert_eq!(n as usize, victims.len(), "{e:?}");
        for id in victims {
            model.remove(&id);
        }
        assert_eq!(k.stats().unwrap().count as usize, model.len());
    }
}

/// The C ABI: a caller built against the parameter structs before `filter` / `fields` existed
/// passes a shorter `struct_size` and gets no filter (the bytes past it are never read); the
/// full struct carries the filter; a malformed one is INVALID_ARGUMENT with a message.
#[test]
fn the_c_abi_reads_filters_only_within_struct_size() {
    use kalos::ffi::*;
    let name = std::ffi::CString::new(format!("filt-abi-{}", std::process::id())).unwrap();
    let mut o = std::mem::MaybeUninit::<kalos_options>::uninit();
    let mut h: *mut kalos_handle = std::ptr::null_mut();
    // SAFETY: init writes the whole struct; the pointers passed live for each call.
    unsafe {
        kalos_options_init(o.as_mut_ptr(), std::mem::size_of_val(&o));
        let mut o = o.assume_init();
        o.dim = DIM as u32;
        o.metric = 0;
        o.backend = 1;
        o.role = 1;
        assert_eq!(kalos_open(name.as_ptr(), &o, &mut h), 0);
    }
    let v = [1.0f32; DIM];
    let meta = encode_fields_block(&[&[Field::new("n", Value::Int(1))], &[Field::new("n", Value::Int(2))]]);
    let mut up = std::mem::MaybeUninit::<kalos_upsert_params>::uninit();
    // SAFETY: as above.
    let mut up = unsafe {
        kalos_upsert_params_init(up.as_mut_ptr(), std::mem::size_of_val(&up));
        up.assume_init()
    };
    up.fields = meta.as_ptr();
    up.fields_len = meta.len();
    // SAFETY: ids, vectors and the fields block outlive the call.
    assert_eq!(unsafe { kalos_upsert(h, [1u64, 2].as_ptr(), 2, [v, v].concat().as_ptr(), 2 * DIM, &up) }, 0);
    let f = Expr::eq("n", Value::Int(2)).encode();
    let mut p = std::mem::MaybeUninit::<kalos_recall_params>::uninit();
    // SAFETY: as above.
    let mut p = unsafe {
        kalos_recall_params_init(p.as_mut_ptr(), std::mem::size_of_val(&p));
        p.assume_init()
    };
    p.filter = f.as_ptr();
    p.filter_len = f.len();
    let recall = |p: &kalos_recall_params| {
        let (mut ids, mut sc, mut n) = ([0u64; 4], [0f32; 4], 0usize);
        // SAFETY: every buffer holds 4 entries and outlives the call.
        let st = unsafe { kalos_recall(h, v.as_ptr(), DIM, 4, p, ids.as_mut_ptr(), 4, sc.as_mut_ptr(), 4, &mut n) };
        (st, ids[..n].to_vec())
    };
    assert_eq!(recall(&p), (0, vec![2]));
    p.struct_size = std::mem::offset_of!(kalos_recall_params, filter) as u32;
    assert_eq!(recall(&p), (0, vec![1, 2]), "a shorter struct has no filter");
    p.struct_size = std::mem::offset_of!(kalos_recall_params, timeout_ms) as u32;
    assert_eq!(recall(&p).0, kalos_status_code::KALOS_INVALID_ARGUMENT as i32);
    let bad = [1u8, 4, 1, b'n', 9];
    p.struct_size = std::mem::size_of::<kalos_recall_params>() as u32;
    p.filter = bad.as_ptr();
    p.filter_len = bad.len();
    assert_eq!(recall(&p).0, kalos_status_code::KALOS_INVALID_ARGUMENT as i32);
    // SAFETY: kalos_last_error returns a NUL-terminated thread-local string.
    let msg = unsafe { std::ffi::CStr::from_ptr(kalos_last_error()) }.to_string_lossy().into_owned();
    assert!(msg.contains("unknown value type 9"), "{msg}");
    // SAFETY: h came from kalos_open and is closed once.
    unsafe { kalos_close(h) };
}

/// The ids the reference selects, ascending.
fn ref_ids(model: &HashMap<u64, Mem>, e: Option<&Expr>, ns: Option<&[u64]>) -> Vec<u64> {
    let mut v: Vec<u64> = model
        .iter()
        .filter(|(_, m)| ns.is_none_or(|ns| ns.contains(&m.ns)) && e.is_none_or(|e| ref_match(e, &m.fields)))
        .map(|(&id, _)| id)
        .collect();
    v.sort_unstable();
    v
}

/// Listing against the reference: random expressions and namespace lists over random data,
/// whole and in pages of random sizes walked with the cursor; every page's count of what
/// remains; counting with a limit of 0.
#[test]
fn list_matches_the_reference_page_by_page() {
    let mut r = rng("list");
    let k = open("list", Metric::InnerProduct, 2);
    let mut model = HashMap::new();
    // Ids spread over the whole u64 range (the cursor compares them unsigned), 0 and MAX too.
    let mut ids: Vec<u64> = (0..1500).map(|_| r.random()).collect();
    ids.extend([0, 1, u64::MAX, u64::MAX - 1, 1 << 63]);
    ids.sort_unstable();
    ids.dedup();
    write(&k, &mut r, &mut model, &ids[..500], true);
    write(&k, &mut r, &mut model, &ids[500..], false);
    let gone: Vec<u64> = ids.iter().copied().step_by(7).collect();
    k.delete(&gone).unwrap();
    for id in &gone {
        model.remove(id);
    }
    let live: Vec<u64> = model.keys().copied().collect();
    let everything = k.list_all(&kalos::ListOptions::default()).unwrap();
    assert_eq!(everything, ref_ids(&model, None, None));
    for case in 0..300 {
        let e = (case % 5 != 0).then(|| random_expr(&mut r, 3, &live));
        let ns: Option<Vec<u64>> = (r.random_range(0..3) == 0).then(|| vec![r.random_range(0..4), r.random_range(0..4)]);
        let want = ref_ids(&model, e.as_ref(), ns.as_deref());
        let o = kalos::ListOptions { namespaces: ns.clone(), filter: e.as_ref().map(|e| e.encode()), ..Default::default() };
        assert_eq!(k.list_all(&o).unwrap(), want, "case {case}: {e:?} ns {ns:?}");
        assert_eq!(k.list(&o, 0).unwrap(), (vec![], want.len() as u64), "counting only");
        // Pages of a random size, each from the last id of the one before.
        let page = [1, 2, 3, 17, 100, 5000][r.random_range(0..6)];
        let mut o = o;
        let mut got = Vec::new();
        loop {
            let (p, remaining) = k.list(&o, page).unwrap();
            assert!(p.len() <= page);
            got.extend_from_slice(&p);
            assert_eq!(remaining as usize, want.len() - got.len(), "case {case}: remaining after {} ids", got.len());
            if p.len() < page || remaining == 0 {
                break;
            }
            o.after = p.last().copied();
        }
        assert_eq!(got, want, "case {case} in pages of {page}: {e:?} ns {ns:?}");
    }
    // A cursor between ids, and past the largest.
    let o = |after| kalos::ListOptions { after: Some(after), ..Default::default() };
    let mid = everything[everything.len() / 2];
    assert_eq!(k.list_all(&o(mid)).unwrap(), everything.iter().copied().filter(|&i| i > mid).collect::<Vec<_>>());
    assert_eq!(k.list_all(&o(u64::MAX)).unwrap(), Vec::<u64>::new());
}

/// Writes between pages: a memory that lives and matches throughout is listed exactly once, a
/// memory deleted before its page is not, new ids after the cursor are; ids only go up. A
/// store with small slots, so that one call spans several requests.
#[test]
fn list_pages_see_writes_between_them() {
    let mut r = rng("list_writes");
    let name = format!("filt-listw-{}-{}", std::process::id(), rand::random::<u32>());
    let opts = Options {
        role: Role::Server,
        dim: DIM as u32,
        metric: Metric::InnerProduct,
        backend: Backend::Cpu,
        slot_bytes: 4096,
        max_payload_bytes: 1024,
        capacity: 100_000,
        ..Options::default()
    };
    let k = Kalos::open(&name, &opts).unwrap();
    let fit = kalos::wire::response::list_fit(4096);
    let mut model = HashMap::new();
    let ids: Vec<u64> = (0..6000u64).map(|i| i * 3).collect();
    for (ci, chunk) in ids.chunks(100).enumerate() {
        write(&k, &mut r, &mut model, chunk, ci == 0);
    }
    // One call of more than a slot's reply: several requests, the same answer.
    let all = k.list_all(&kalos::ListOptions::default()).unwrap();
    assert!(all.len() > 5 * fit);
    assert_eq!(all, ref_ids(&model, None, None));
    let (big, rest) = k.list(&kalos::ListOptions::default(), 3 * fit + 7).unwrap();
    assert_eq!((&big[..], rest as usize), (&all[..3 * fit + 7], all.len() - 3 * fit - 7));

    let e = Expr::In(false, "user".into(), vec![Value::Keyword("ann".into()), Value::Keyword("bob".into())]);
    let o = kalos::ListOptions { filter: Some(e.encode()), ..Default::default() };
    let start: Vec<u64> = ref_ids(&model, Some(&e), None);
    let mut o = o;
    let mut listed: Vec<u64> = Vec::new();
    let mut touched = std::collections::HashSet::new();
    loop {
        let (p, _) = k.list(&o, 250).unwrap();
        for &id in &p {
            assert!(listed.last().is_none_or(|&l| id > l), "ids go up");
            let m = model.get(&id).unwrap_or_else(|| panic!("id {id} was deleted before its page"));
            assert!(ref_match(&e, &m.fields), "id {id} does not match at its page");
        }
        listed.extend_from_slice(&p);
        if p.len() < 250 {
            break;
        }
        o.after = p.last().copied();
        // Between pages: delete some ids (behind and ahead of the cursor), add new ones (odd
        // ids, which no other step uses), rewrite the fields of others.
        let live: Vec<u64> = model.keys().copied().collect();
        let del: Vec<u64> =
            (0..20).map(|_| live[r.random_range(0..live.len())]).collect::<std::collections::HashSet<_>>().into_iter().collect();
        k.delete(&del).unwrap();
        for id in &del {
            model.remove(id);
            touched.insert(*id);
        }
        let add: Vec<u64> = (0..10)
            .map(|_| r.random_range(0..20_000u64) * 2 + 1)
            .filter(|i| !model.contains_key(i))
            .collect::<std::collections::HashSet<_>>()
            .into_iter()
            .collect();
        write(&k, &mut r, &mut model, &add, false);
        let again: Vec<u64> = (0..10)
            .map(|_| ids[r.random_range(0..ids.len())])
            .filter(|i| model.contains_key(i))
            .collect::<std::collections::HashSet<_>>()
            .into_iter()
            .collect();
        write(&k, &mut r, &mut model, &again, false);
        touched.extend(add.iter().chain(&again).copied());
    }
    // Every id that matched at the start and was never touched is listed, once.
    let set: std::collections::HashSet<u64> = listed.iter().copied().collect();
    assert_eq!(set.len(), listed.len(), "no id twice");
    for id in start.iter().filter(|i| !touched.contains(i)) {
        assert!(set.contains(id), "id {id} lived and matched throughout but was not listed");
    }
    assert!(listed.len() > 1000);
}

/// Bad listings: refused by the client before anything is sent, and by the server for a
/// hostile client that skips those checks; expired memories are not listed.
#[test]
fn bad_listings_are_refused_and_expired_memories_are_not_listed() {
    use kalos::wire::request::{list, OP_LIST};
    let name = format!("filt-listbad-{}", std::process::id());
    let o = Options { role: Role::Server, dim: DIM as u32, metric: Metric::InnerProduct, backend: Backend::Cpu, ..Options::default() };
    let k = Kalos::open(&name, &o).unwrap();
    k.upsert(&[1, 2], &[1.0; 2 * DIM], &UpsertOptions::default()).unwrap();
    k.upsert(&[3], &[1.0; DIM], &UpsertOptions { ttl_ms: 1, ..Default::default() }).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(k.list_all(&kalos::ListOptions::default()).unwrap(), vec![1, 2], "the expired memory is not listed");
    let bad = kalos::ListOptions { filter: Some(vec![1, 99]), ..Default::default() };
    let e = k.list(&bad, 10).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(e.message.contains("unknown operator 99"), "{}", e.message);
    let many = kalos::ListOptions { namespaces: Some((0..65).collect()), ..Default::default() };
    assert_eq!(k.list(&many, 10).unwrap_err().status, Status::InvalidArgument);

    let seg = kalos::shm::Segment::attach(&name).unwrap();
    let fit = kalos::wire::response::list_fit(seg.data_bytes());
    let call = |req: &[u8]| raw_call(&seg, 0, req, req.len() as u32);
    let mut w = kalos::wire::Writer::new();
    list(&mut w, None, Some(&[1, 99]), None, 10);
    assert_eq!(call(&w.buf).0, Status::InvalidArgument as u32, "a malformed filter");
    let mut w = kalos::wire::Writer::new();
    list(&mut w, None, None, None, fit as u32 + 1);
    let (st, body) = call(&w.buf);
    assert_eq!(st, Status::InvalidArgument as u32);
    assert!(String::from_utf8_lossy(&body).contains("exceeds"), "{}", String::from_utf8_lossy(&body));
    let mut w = kalos::wire::Writer::new();
    w.u32(OP_LIST).u32(4).u32(1).u64(0).u32(u32::MAX);
    assert_eq!(call(&w.buf).0, Status::InvalidArgument as u32, "an unknown flag");
    let mut w = kalos::wire::Writer::new();
    list(&mut w, None, None, None, 10);
    w.u32(0);
    assert_eq!(call(&w.buf).0, Status::InvalidArgument as u32, "trailing bytes");
    let mut w = kalos::wire::Writer::new();
    list(&mut w, Some(&[0]), None, Some(1), fit as u32);
    let (st, body) = call(&w.buf);
    assert_eq!(st, 0);
    let mut out = [0u64; 4];
    assert_eq!(kalos::wire::response::read_list(&body, &mut out).unwrap(), (1, 0));
    assert_eq!(out[0], 2);
    assert_eq!(kalos::wire::response::read_list(&body, &mut out[..0]).unwrap_err().status, Status::Internal);
    // The server's request counters name the op.
    let s = k.stats().unwrap();
    assert!(s.requests_by.iter().any(|c| kalos::op_name(c.op) == "list" && c.status == 0 && c.count > 0));
}
