//! `kalosd query`: a JSON-lines client of a running store (docs/FORMATS.md, "kalosd query").
//!
//! One request object per stdin line, one response object per stdout line, in order. A bad
//! line gets `{"ok": false, "status", "error"}` and the next line is read; the exit status is 1
//! when any request failed. Filters use the JSON form of [`super::json::filter`].

use std::io::{BufRead, Write};

use kalos::*;
use serde_json::{json, Map, Value as J};

use super::json;

#[derive(clap::Args, Debug)]
pub struct QueryArgs {
    /// The running store
    #[arg(long)]
    name: String,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::new(Status::InvalidArgument, msg.into())
}

fn u64s(m: &Map<String, J>, key: &str) -> Result<Option<Vec<u64>>> {
    match m.get(key) {
        None | Some(J::Null) => Ok(None),
        Some(J::Array(a)) => a
            .iter()
            .map(|x| x.as_u64().ok_or_else(|| bad(format!("{key} holds unsigned integers, got {x}"))))
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(v) => Err(bad(format!("{key} must be a list of unsigned integers, got {v}"))),
    }
}

fn floats(v: &J, what: &str) -> Result<Vec<f32>> {
    let J::Array(a) = v else { return Err(bad(format!("{what} must be a list of numbers, got {v}"))) };
    a.iter().map(|x| x.as_f64().map(|f| f as f32).ok_or_else(|| bad(format!("{what} holds numbers, got {x}")))).collect()
}

fn filter_bytes(m: &Map<String, J>) -> Result<Option<Vec<u8>>> {
    match m.get("filter") {
        None | Some(J::Null) => Ok(None),
        Some(f) => Ok(Some(json::filter(f).map_err(|e| bad(format!("filter: {e}")))?.encode())),
    }
}

/// Runs one request line.
fn handle(k: &Kalos, line: &str) -> Result<J> {
    let req: J = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
    let J::Object(m) = &req else { return Err(bad("a request must be a JSON object")) };
    let op = m.get("op").and_then(J::as_str).ok_or_else(|| bad("missing \"op\" (recall, upsert, delete, get, list)"))?;
    match op {
        "recall" => {
            let q = floats(m.get("query").ok_or_else(|| bad("recall needs \"query\""))?, "query")?;
            let kk = m.get("k").map_or(Some(10), J::as_u64).ok_or_else(|| bad("k must be an unsigned integer"))?;
            let opts = RecallOptions { namespaces: u64s(m, "namespaces")?, filter: filter_bytes(m)?, ..RecallOptions::default() };
            let hits = k.recall(&q, kk as usize, &opts)?;
            Ok(json!({"ok": true, "hits": hits.iter().map(|h| json!({"id": h.id, "score": h.score})).collect::<Vec<_>>()}))
        }
        "delete" => {
            let ids = u64s(m, "ids")?;
            let deleted = match (ids, filter_bytes(m)?) {
                (Some(ids), None) => k.delete(&ids)?,
                (None, Some(f)) => k.delete_where(u64s(m, "namespaces")?.as_deref(), &f)?,
                _ => return Err(bad("delete takes either \"ids\" or \"filter\"")),
            };
            Ok(json!({"ok": true, "deleted": deleted}))
        }
        "upsert" => {
            let ids = u64s(m, "ids")?.ok_or_else(|| bad("upsert needs \"ids\""))?;
            let J::Array(vs) = m.get("vectors").unwrap_or(&J::Null) else { return Err(bad("upsert needs \"vectors\": a list of lists")) };
            let mut flat = Vec::new();
            for (i, v) in vs.iter().enumerate() {
                flat.extend(floats(v, &format!("vectors[{i}]"))?);
            }
            let fields = match m.get("fields") {
                None | Some(J::Null) => None,
                Some(J::Array(a)) if a.len() == ids.len() => Some(
                    a.iter()
                        .enumerate()
                        .map(
                            |(i, f)| {
                                if f.is_null() {
                                    Ok(Vec::new())
                                } else {
                                    json::fields(f).map_err(|e| bad(format!("fields[{i}]: {e}")))
                                }
                            },
                        )
                        .collect::<Result<Vec<_>>>()?,
                ),
                Some(v) => return Err(bad(format!("fields must be a list of {} objects, got {v}", ids.len()))),
            };
            let payloads: Option<Vec<Option<Vec<u8>>>> = match m.get("payloads") {
                None | Some(J::Null) => None,
                Some(J::Array(a)) => Some(
                    a.iter()
                        .map(|p| match p {
                            J::Null => Ok(None),
                            J::String(s) => Ok(Some(s.as_bytes().to_vec())),
                            _ => Err(bad(format!("a payload is a string or null, got {p}"))),
                        })
                        .collect::<Result<_>>()?,
                ),
                Some(v) => return Err(bad(format!("payloads must be a list, got {v}"))),
            };
            let ns = m.get("namespace").map_or(Some(0), J::as_u64).ok_or_else(|| bad("namespace must be an unsigned integer"))?;
            let opts = UpsertOptions {
                namespaces: Namespaces::One(ns),
                payloads: payloads.as_ref().map(|p| p.iter().map(|x| x.as_deref()).collect()),
                fields: fields.as_deref(),
                ..UpsertOptions::default()
            };
            k.upsert(&ids, &flat, &opts)?;
            Ok(json!({"ok": true, "upserted": ids.len()}))
        }
        "get" => {
            let ids = u64s(m, "ids")?.ok_or_else(|| bad("get needs \"ids\""))?;
            let recs = k.get(&ids)?;
            let out: Vec<J> = recs
                .iter()
                .map(|r| {
                    json!({"id": r.id, "namespace": r.namespace, "fields": json::fields_to_json(&r.fields),
                           "payload": r.payload.as_ref().map(|p| String::from_utf8_lossy(p).into_owned())})
                })
                .collect();
            Ok(json!({"ok": true, "memories": out}))
        }
        "list" => {
            let num = |key: &str| match m.get(key) {
                None | Some(J::Null) => Ok(None),
                Some(v) => v.as_u64().map(Some).ok_or_else(|| bad(format!("{key} must be an unsigned integer, got {v}"))),
            };
            let opts = ListOptions { namespaces: u64s(m, "namespaces")?, filter: filter_bytes(m)?, after: num("after")?, timeout_ms: None };
            let limit = num("limit")?.map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX));
            let (ids, remaining) = k.list(&opts, limit)?;
            Ok(json!({"ok": true, "ids": ids, "remaining": remaining}))
        }
        _ => Err(bad(format!("unknown op {op:?} (recall, upsert, delete, get, list)"))),
    }
}

pub(super) fn run(a: &QueryArgs) -> i32 {
    let o = Options { role: Role::Client, ..Options::default() };
    let k = match Kalos::open(&a.name, &o) {
        Ok(k) => k,
        Err(e) => super::fail(e),
    };
    let (stdin, stdout) = (std::io::stdin(), std::io::stdout());
    let mut out = stdout.lock();
    let mut failed = false;
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let resp = handle(&k, &line).unwrap_or_else(|e| {
            failed = true;
            json!({"ok": false, "status": e.status.name(), "error": e.message})
        });
        if writeln!(out, "{resp}").and_then(|_| out.flush()).is_err() {
            break;
        }
    }
    i32::from(failed)
}
