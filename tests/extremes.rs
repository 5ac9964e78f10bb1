//! Extreme but finite vectors: tiny and huge norms under every metric. What can be represented
//! is stored finite, survives a restart and scores finite; what cannot is refused with
//! INVALID_ARGUMENT; no recall returns a non-finite score.

use kalos::*;

fn server(tag: &str, metric: Metric, dir: Option<&std::path::Path>) -> (String, Kalos) {
    let name = format!("extremes-{tag}-{}", std::process::id());
    let o =
        Options { role: Role::Server, dim: 4, metric, backend: Backend::Cpu, data_dir: dir.map(|d| d.to_path_buf()), ..Options::default() };
    let k = Kalos::open(&name, &o).unwrap();
    (name, k)
}

fn all_finite(hits: &[Hit]) -> bool {
    hits.iter().all(|h| h.score.is_finite())
}

#[test]
fn cosine_stores_tiny_and_huge_norms_finite_and_reopens() {
    let dir = std::env::temp_dir().join(format!("kalos-extremes-{}-{}", std::process::id(), rand::random::<u32>()));
    let tiny = [1e-40f32, 2e-40, 0.0, -1e-40];
    let huge = [1e38f32, -1e38, 1e38, 0.0];
    {
        let (_, k) = server("cos", Metric::Cosine, Some(&dir));
        k.upsert(&[1, 2, 3], &[tiny, huge, [1.0, 2.0, 0.0, -1.0]].concat(), &UpsertOptions::default()).unwrap();
        // The tiny query points where row 1 and row 3 point: both score 1.
        let hits = k.recall(&tiny, 3, &RecallOptions::default()).unwrap();
        assert_eq!(hits.len(), 3, "{hits:?}");
        assert!(all_finite(&hits), "{hits:?}");
        assert!((hits[0].score - 1.0).abs() < 1e-5 && (hits[1].score - 1.0).abs() < 1e-5, "{hits:?}");
        let back = k.get(&[1]).unwrap().pop().expect("row 1");
        assert!(back.vector.iter().all(|x| x.is_finite()), "{:?}", back.vector);
        k.close();
    }
    // The log replays and a snapshot loads: nothing stored can stop the store from opening.
    let (_, k) = server("cos2", Metric::Cosine, Some(&dir));
    assert_eq!(k.stats().unwrap().count, 3);
    let hits = k.recall(&huge, 3, &RecallOptions::default()).unwrap();
    assert_eq!(hits[0].id, 2, "{hits:?}");
    assert!(all_finite(&hits), "{hits:?}");
    k.close();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn norms_beyond_f32_are_refused_with_invalid_argument() {
    let over = [3e38f32, 3e38, 3e38, 3e38]; // norm 6e38 > f32::MAX
    for metric in [Metric::Cosine, Metric::L2] {
        let (_, k) = server(&format!("over-{}", metric.name()), metric, None);
        let e = k.upsert(&[1], &over, &UpsertOptions::default()).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{metric:?}: {e}");
        assert!(e.message.contains("norm"), "{}", e.message);
        assert_eq!(k.stats().unwrap().count, 0, "nothing was stored");
        k.close();
    }
    // l2 keeps the squared norm: 2e19 squared is past f32 even though 2e19 is not.
    let (_, k) = server("l2sq", Metric::L2, None);
    let e = k.upsert(&[1], &[2e19f32, 0.0, 0.0, 0.0], &UpsertOptions::default()).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    k.close();
}

#[test]
fn a_score_past_f32_is_an_error_not_a_non_finite_score() {
    let (_, k) = server("ipmax", Metric::InnerProduct, None);
    k.upsert(&[1, 2], &[1e30f32, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], &UpsertOptions::default()).unwrap();
    let e = k.recall(&[f32::MAX, 0.0, 0.0, 0.0], 2, &RecallOptions::default()).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument, "{e}");
    assert!(e.message.contains("f32"), "{}", e.message);
    // An ordinary query still works on the same store.
    let hits = k.recall(&[1.0, 0.0, 0.0, 0.0], 2, &RecallOptions::default()).unwrap();
    assert_eq!(hits[0].id, 1);
    assert!(all_finite(&hits));
    k.close();
}
