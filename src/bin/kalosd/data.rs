//! `kalosd import`, `export` and `repair`: bulk data in and out of a store (docs/FORMATS.md).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use kalos::npy::{self, NpyData};
use kalos::*;
use serde_json::value::RawValue;
use serde_json::Value;

use super::{fail, parse_metric};

#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// Offline: the data directory to add the rows to (no server may hold it)
    #[arg(long, value_name = "DIR", required_unless_present = "name", conflicts_with = "name")]
    data_dir: Option<PathBuf>,
    /// Online: the running store to send the rows to
    #[arg(long)]
    name: Option<String>,
    /// Vector dimension
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    dim: u32,
    /// float32/float16 .npy of shape (n, D)
    #[arg(long, value_name = "V.npy")]
    vectors: PathBuf,
    /// uint64/int64 .npy of shape (n,) (default 0..n-1)
    #[arg(long, value_name = "I.npy")]
    ids: Option<PathBuf>,
    /// uint64 .npy of shape (n,) (default: the payloads file's, else 0)
    #[arg(long, value_name = "N.npy")]
    namespaces: Option<PathBuf>,
    /// JSON lines: {"id", "namespace", "payload" or "payload_b64", "created_ms", "expires_ms", "fields"}
    #[arg(long, value_name = "P.jsonl")]
    payloads: Option<PathBuf>,
    /// Offline: the metric of a new directory: ip, cosine or l2 (default: the directory's, else cosine)
    #[arg(long, value_parser = parse_metric)]
    metric: Option<Metric>,
    /// Offline: the most rows the directory may hold
    #[arg(long, default_value_t = u32::MAX as usize)]
    capacity: usize,
    /// Offline: the largest payload in bytes
    #[arg(long, default_value_t = 65536)]
    max_payload: usize,
}

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The data directory of a stopped store
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Output: vectors .npy of shape (n, D)
    #[arg(long, value_name = "V.npy")]
    vectors: PathBuf,
    /// Output: ids .npy of shape (n,)
    #[arg(long, value_name = "I.npy")]
    ids: PathBuf,
    /// Output: namespaces .npy of shape (n,)
    #[arg(long, value_name = "N.npy")]
    namespaces: Option<PathBuf>,
    /// Output: one JSON line per memory (payloads, times, metadata fields)
    #[arg(long, value_name = "P.jsonl")]
    payloads: Option<PathBuf>,
    /// Vector type of the output: f32 or f16
    #[arg(long, default_value = "f32", value_parser = ["f32", "float32", "f16", "float16"])]
    dtype: String,
}

#[derive(clap::Args, Debug)]
pub struct RepairArgs {
    /// The damaged data directory
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
}

/// One payloads.jsonl line (docs/FORMATS.md).
#[derive(Debug, Default, Clone)]
struct JsonRow {
    namespace: Option<u64>,
    payload: Option<Vec<u8>>,
    created_ms: Option<u64>,
    expires_ms: Option<u64>,
    fields: Vec<kalos::meta::Field>,
}

fn read_payloads(path: &Path, ids: &[u64]) -> Result<std::collections::HashMap<u64, JsonRow>> {
    use std::io::BufRead;
    let known: std::collections::HashSet<u64> = ids.iter().copied().collect();
    let shown = path.display();
    let f = std::fs::File::open(path).map_err(|e| Error::io(&format!("open {shown}"), e))?;
    let mut out = std::collections::HashMap::new();
    for (ln, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| Error::io(&format!("read {shown}"), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |m: String| Error::new(Status::InvalidArgument, format!("{shown} line {}: {m}", ln + 1));
        // Each value is kept as written: a non-string payload is stored as its own JSON text.
        let obj: std::collections::BTreeMap<String, Box<RawValue>> = match serde_json::from_str(&line) {
            Ok(o) => o,
            Err(e) if e.is_data() => return Err(bad(format!("expected a JSON object: {e}"))),
            Err(e) => return Err(bad(e.to_string())),
        };
        let value = |v: &RawValue| serde_json::from_str::<Value>(v.get()).map_err(|e| bad(e.to_string()));
        let uint =
            |k: &str, v: &RawValue| value(v)?.as_u64().ok_or_else(|| bad(format!("{k} must be an unsigned integer, got {}", v.get())));
        let mut row = JsonRow::default();
        let mut id = None;
        for (k, v) in &obj {
            let null = v.get() == "null";
            match k.as_str() {
                "id" => id = Some(uint("id", v)?),
                "expires_ms" | "payload" | "payload_b64" | "fields" if null => {}
                "fields" => row.fields = super::json::fields(&value(v)?).map_err(|e| bad(format!("fields: {e}")))?,
                "namespace" => row.namespace = Some(uint(k, v)?),
                "created_ms" => row.created_ms = Some(uint(k, v)?),
                "expires_ms" => row.expires_ms = Some(uint(k, v)?),
                // A string payload is its UTF-8 bytes; any other JSON value, its JSON text.
                "payload" => {
                    row.payload = Some(match value(v)? {
                        Value::String(s) => s.into_bytes(),
                        _ => v.get().as_bytes().to_vec(),
                    })
                }
                "payload_b64" => match value(v)? {
                    Value::String(s) => {
                        row.payload =
                            Some(base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| bad(format!("payload_b64: {e}")))?)
                    }
                    _ => return Err(bad(format!("payload_b64 must be a base64 string, got {}", v.get()))),
                },
                _ => {} // unknown keys are ignored (forward compatibility)
            }
        }
        let id = id.ok_or_else(|| bad("missing \"id\"".into()))?;
        if !known.contains(&id) {
            return Err(bad(format!("id {id} is not among the imported ids")));
        }
        if out.insert(id, row).is_some() {
            return Err(bad(format!("id {id} appears twice")));
        }
    }
    Ok(out)
}

fn read_u64s(path: &Path, n: usize, what: &str) -> Result<Vec<u64>> {
    match npy::read(path)? {
        npy::Npy { data: NpyData::U64(x), shape } if x.len() == n && shape.len() == 1 => Ok(x),
        v => Err(Error::new(
            Status::InvalidArgument,
            format!("{}: {what} must be {n} uint64/int64 values of shape ({n},), got shape {:?}", path.display(), v.shape),
        )),
    }
}

/// The (n, dim) float vectors of an .npy file (f32, or f16 widened), and n.
pub(super) fn read_vectors(path: &Path, dim: usize) -> Result<(Vec<f32>, usize)> {
    let vp = path.display();
    let v = npy::read(path)?;
    let NpyData::F32(vals) = v.data else {
        return Err(Error::new(Status::InvalidArgument, format!("{vp}: vectors must be float32 or float16")));
    };
    if v.shape.len() != 2 || v.shape[1] != dim {
        return Err(Error::new(Status::DimensionMismatch, format!("{vp}: shape {:?} is not (n, {dim})", v.shape)));
    }
    Ok((vals, v.shape[0]))
}

pub(super) fn import(a: &ImportArgs) {
    let dim = a.dim as usize;
    let t0 = std::time::Instant::now();
    let run = || -> Result<String> {
        let (vals, n) = read_vectors(&a.vectors, dim)?;
        types::check_finite(&vals, &a.vectors.display().to_string())?;
        let ids: Vec<u64> = match &a.ids {
            None => (0..n as u64).collect(),
            Some(p) => read_u64s(p, n, "ids")?,
        };
        let ns_file = match &a.namespaces {
            None => None,
            Some(p) => Some(read_u64s(p, n, "namespaces")?),
        };
        let rows = match &a.payloads {
            None => Default::default(),
            Some(p) => read_payloads(p, &ids)?,
        };
        let now = types::now_unix_ms();
        let none = JsonRow::default();
        let row = |i: usize| rows.get(&ids[i]).unwrap_or(&none);
        let ns_of = |i: usize| ns_file.as_ref().map(|x| x[i]).or(row(i).namespace).unwrap_or(0);
        let expires_of = |i: usize| row(i).expires_ms.unwrap_or(NEVER);
        let keep: Vec<usize> = (0..n).filter(|&i| expires_of(i) > now).collect();
        let skipped = n - keep.len();
        if let Some(name) = &a.name {
            let k = Kalos::open(name, &Options { role: Role::Client, dim: dim as u32, ..Options::default() })?;
            let maxp = k.max_payload_bytes();
            let chunk = (k.slot_bytes() / (dim * 4 + 32 + maxp.min(4096))).clamp(1, 4096);
            // Rows without an expiry go in chunks; rows with one go one by one (the client API
            // takes one expiry per call).
            let (plain, timed): (Vec<usize>, Vec<usize>) = keep.iter().partition(|&&i| expires_of(i) == NEVER);
            let send = |sel: &[usize], expires_ms: u64| -> Result<()> {
                let sids: Vec<u64> = sel.iter().map(|&i| ids[i]).collect();
                let svec: Vec<f32> = sel.iter().flat_map(|&i| vals[i * dim..(i + 1) * dim].iter().copied()).collect();
                let sns: Vec<u64> = sel.iter().map(|&i| ns_of(i)).collect();
                let pl: Vec<Option<&[u8]>> = sel.iter().map(|&i| row(i).payload.as_deref()).collect();
                let fl: Vec<Vec<kalos::meta::Field>> = sel.iter().map(|&i| row(i).fields.clone()).collect();
                let o = UpsertOptions {
                    namespaces: Namespaces::PerItem(&sns),
                    payloads: Some(pl),
                    fields: Some(&fl),
                    expires_ms,
                    ..UpsertOptions::default()
                };
                k.upsert(&sids, &svec, &o)
            };
            for c in plain.chunks(chunk) {
                send(c, NEVER)?;
            }
            for &i in &timed {
                send(&[i], expires_of(i))?;
            }
            let count = k.stats()?.count;
            return Ok(format!(
                "imported {} rows into running store {name:?} ({skipped} skipped: already expired); it holds {count} rows",
                keep.len()
            ));
        }
        let dir = a.data_dir.clone().ok_or_else(|| Error::new(Status::InvalidArgument, "import needs --data-dir DIR or --name NAME"))?;
        let metric = match a.metric {
            Some(m) => m,
            None => persist::dir_shape(&dir)?.map(|s| s.1).unwrap_or(Metric::Cosine),
        };
        let mut store = store::Store::new(dim, metric, a.capacity, a.max_payload);
        let popts = persist::PersistOptions { sync: SyncPolicy::Always, sync_interval_ms: 100 };
        let (mut p, rec) = persist::Persist::open(&dir, dim, metric, &popts, &mut store)?;
        if let Some(t) = &rec.torn_tail {
            log::warn!("{t}");
        }
        let before = store.len();
        for c in keep.chunks(65536) {
            let items: Vec<store::UpsertItem> = c
                .iter()
                .map(|&i| store::UpsertItem {
                    fields: &row(i).fields,
                    id: ids[i],
                    namespace: ns_of(i),
                    vector: &vals[i * dim..(i + 1) * dim],
                    payload: row(i).payload.as_deref(),
                    created_ms: row(i).created_ms.unwrap_or(now),
                    expires_ms: expires_of(i),
                })
                .collect();
            store.validate_upsert(&items)?;
            store.apply_upsert(&items);
        }
        // One snapshot commits the whole import (nothing is visible on disk before the rename).
        p.snapshot(&store)?;
        Ok(format!(
            "imported {} rows into {} ({skipped} skipped: already expired); the store held {before} rows and holds {} (generation {})",
            keep.len(),
            dir.display(),
            store.len(),
            p.generation()
        ))
    };
    match run() {
        Ok(m) => println!("kalosd: {m} in {:.2}s", t0.elapsed().as_secs_f64()),
        Err(e) => fail(e),
    }
}

pub(super) fn export(a: &ExportArgs) {
    let dir = &a.data_dir;
    let (vp, ip) = (&a.vectors, &a.ids);
    let f16 = matches!(a.dtype.as_str(), "f16" | "float16");
    let t0 = std::time::Instant::now();
    let run = || -> Result<String> {
        let (dim, metric) =
            persist::dir_shape(dir)?.ok_or_else(|| Error::new(Status::NotFound, format!("{} holds no Kalos data", dir.display())))?;
        let mut store = store::Store::new(dim, metric, u32::MAX as usize, u32::MAX as usize);
        let popts = persist::PersistOptions { sync: SyncPolicy::Always, sync_interval_ms: 100 };
        let (p, rec) = persist::Persist::open(dir, dim, metric, &popts, &mut store)?;
        if let Some(t) = &rec.torn_tail {
            log::warn!("{t}");
        }
        let n = store.len();
        let mut vals = Vec::with_capacity(n * dim);
        for r in 0..n {
            vals.extend_from_slice(&store.vector_of_row(r));
        }
        if f16 {
            npy::write_f16(vp, &[n, dim], &vals)?;
        } else {
            npy::write_f32(vp, &[n, dim], &vals)?;
        }
        npy::write_u64(ip, store.ids())?;
        if let Some(np) = &a.namespaces {
            npy::write_u64(np, store.namespaces())?;
        }
        if let Some(path) = &a.payloads {
            use std::io::Write;
            let pp = path.display();
            let f = std::fs::File::create(path).map_err(|e| Error::io(&format!("create {pp}"), e))?;
            let mut w = std::io::BufWriter::new(f);
            for r in 0..n {
                let e = store.expires_ms()[r];
                let mut line = serde_json::Map::new();
                line.insert("id".into(), store.ids()[r].into());
                line.insert("namespace".into(), store.namespaces()[r].into());
                line.insert("created_ms".into(), store.created_ms()[r].into());
                line.insert("expires_ms".into(), if e == NEVER { Value::Null } else { e.into() });
                match store.payload_at(r) {
                    None => line.insert("payload".into(), Value::Null),
                    Some(b) => match std::str::from_utf8(b) {
                        Ok(s) => line.insert("payload".into(), s.into()),
                        Err(_) => line.insert("payload_b64".into(), base64::engine::general_purpose::STANDARD.encode(b).into()),
                    },
                };
                let fields = store.fields().row(r);
                if !fields.is_empty() {
                    line.insert("fields".into(), super::json::fields_to_json(&fields));
                }
                writeln!(w, "{}", Value::Object(line)).map_err(|e| Error::io(&format!("write {pp}"), e))?;
            }
            w.flush().map_err(|e| Error::io(&format!("write {pp}"), e))?;
        }
        drop(p);
        Ok(format!("exported {n} rows of dimension {dim} (metric {}) from {}", metric.name(), dir.display()))
    };
    match run() {
        Ok(m) => println!("kalosd: {m} in {:.2}s", t0.elapsed().as_secs_f64()),
        Err(e) => fail(e),
    }
}

pub(super) fn repair(a: &RepairArgs) {
    match persist::repair(&a.data_dir) {
        Err(e) => fail(e),
        Ok(r) => {
            for n in &r.notes {
                println!("kalosd: repair: {n}");
            }
            println!(
                "kalosd: repair: {} rows recovered ({} from the snapshot, {} log records replayed, {} intact records after the damage not applied)",
                r.rows, r.snapshot_rows, r.records_replayed, r.records_after_damage
            );
            match &r.backup {
                Some(b) => println!("kalosd: repair: the original files are in {}; the repaired store is a new generation", b.display()),
                None => println!("kalosd: repair: nothing to repair"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_lines_parse_with_serde_json_and_base64() {
        let d = std::env::temp_dir().join(format!("kalosd-jsonl-{}", std::process::id()));
        std::fs::write(
            &d,
            concat!(
                r#"{"id": 5, "payload": "a\"b\\n\u00e9\ud83c\udf75", "expires_ms": null, "x": [1, {"y": "}"}]}"#,
                "\n",
                r#"{"id": 6, "payload_b64": "Zm9vYg==", "namespace": 3}"#,
                "\n\n",
                r#"{"id": 7, "payload": {"k": [1, 2]}}"#,
                "\n"
            ),
        )
        .unwrap();
        let rows = read_payloads(&d, &[5, 6, 7]).unwrap();
        assert_eq!(rows[&5].payload.as_deref(), Some("a\"b\\n\u{e9}\u{1F375}".as_bytes()));
        assert_eq!(rows[&6].payload.as_deref(), Some(&b"foob"[..]));
        assert_eq!(rows[&6].namespace, Some(3));
        assert_eq!(rows[&7].payload.as_deref(), Some(&br#"{"k": [1, 2]}"#[..]));
        for (bad, want) in [
            ("{\"id\": 1,}", "line 1"),
            ("{\"id\": -1}", "unsigned integer"),
            ("[1]", "JSON object"),
            ("{\"id\": 5, \"payload_b64\": \"!!\"}", "payload_b64"),
            ("{\"payload\": \"x\"}", "missing"),
            ("{\"id\": 9}", "not among"),
        ] {
            std::fs::write(&d, bad).unwrap();
            let e = read_payloads(&d, &[5]).unwrap_err();
            assert!(e.message.contains(want), "{bad}: {}", e.message);
        }
        let _ = std::fs::remove_file(&d);
    }
}
