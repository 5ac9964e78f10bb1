//! `kalosd import`, `export` and `repair`: bulk data in and out of a store (docs/FORMATS.md).

use std::path::PathBuf;

use kalos::npy::{self, NpyData};
use kalos::*;

use super::{fail, usage, Args};

/// One payloads.jsonl line (docs/FORMATS.md).
#[derive(Debug, Default, Clone)]
struct JsonRow {
    namespace: Option<u64>,
    payload: Option<Vec<u8>>,
    created_ms: Option<u64>,
    expires_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
enum J {
    Str(String),
    Num(u64),
    Null,
    /// Any other value, as its raw JSON text (objects, arrays, floats, booleans).
    Raw(String),
}

struct JP<'a> {
    b: &'a [u8],
    i: usize,
}

impl JP<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && (self.b[self.i] as char).is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> std::result::Result<(), String> {
        self.ws();
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at column {}", c as char, self.i + 1))
        }
    }
    fn string(&mut self) -> std::result::Result<String, String> {
        self.eat(b'"')?;
        let mut out = String::new();
        loop {
            let c = *self.b.get(self.i).ok_or("unterminated string")?;
            self.i += 1;
            match c {
                b'"' => return Ok(out),
                b'\\' => {
                    let e = *self.b.get(self.i).ok_or("unterminated escape")?;
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let mut cp = self.hex4()?;
                            if (0xD800..0xDC00).contains(&cp) && self.b.get(self.i..self.i + 2) == Some(b"\\u") {
                                self.i += 2;
                                let lo = self.hex4()?;
                                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo.wrapping_sub(0xDC00) & 0x3ff);
                            }
                            out.push(char::from_u32(cp).ok_or(format!("bad \\u escape {cp:#x}"))?);
                        }
                        _ => return Err(format!("bad escape \\{}", e as char)),
                    }
                }
                _ => {
                    // Copy one UTF-8 sequence.
                    let start = self.i - 1;
                    let mut end = self.i;
                    while end < self.b.len() && (self.b[end] & 0xC0) == 0x80 {
                        end += 1;
                    }
                    out.push_str(std::str::from_utf8(&self.b[start..end]).map_err(|_| "invalid UTF-8")?);
                    self.i = end;
                }
            }
        }
    }
    fn hex4(&mut self) -> std::result::Result<u32, String> {
        let h = self.b.get(self.i..self.i + 4).ok_or("short \\u escape")?;
        self.i += 4;
        u32::from_str_radix(std::str::from_utf8(h).map_err(|_| "bad \\u")?, 16).map_err(|_| "bad \\u escape".to_string())
    }
    fn skip_value(&mut self) -> std::result::Result<(), String> {
        self.ws();
        match self.b.get(self.i) {
            Some(b'"') => self.string().map(|_| ()),
            Some(b'{') | Some(b'[') => {
                let mut depth = 0i32;
                while self.i < self.b.len() {
                    match self.b[self.i] {
                        b'"' => {
                            self.string()?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                return Ok(());
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
                Err("unbalanced brackets".into())
            }
            _ => {
                while self.i < self.b.len()
                    && !matches!(self.b[self.i], b',' | b'}' | b']')
                    && !(self.b[self.i] as char).is_ascii_whitespace()
                {
                    self.i += 1;
                }
                Ok(())
            }
        }
    }
    fn value(&mut self) -> std::result::Result<J, String> {
        self.ws();
        if self.b.get(self.i) == Some(&b'"') {
            return self.string().map(J::Str);
        }
        let start = self.i;
        self.skip_value()?;
        let raw = std::str::from_utf8(&self.b[start..self.i]).map_err(|_| "invalid UTF-8")?.trim().to_string();
        if raw == "null" {
            return Ok(J::Null);
        }
        if let Ok(n) = raw.parse::<u64>() {
            return Ok(J::Num(n));
        }
        if raw.is_empty() {
            return Err(format!("missing value at column {}", start + 1));
        }
        Ok(J::Raw(raw))
    }
}

fn parse_json_object(line: &str) -> std::result::Result<Vec<(String, J)>, String> {
    let mut p = JP { b: line.as_bytes(), i: 0 };
    p.eat(b'{')?;
    let mut out = Vec::new();
    p.ws();
    if p.b.get(p.i) == Some(&b'}') {
        return Ok(out);
    }
    loop {
        p.ws();
        let k = p.string()?;
        p.eat(b':')?;
        let v = p.value()?;
        out.push((k, v));
        p.ws();
        match p.b.get(p.i) {
            Some(b',') => p.i += 1,
            Some(b'}') => {
                p.i += 1;
                p.ws();
                if p.i != p.b.len() {
                    return Err("text after the object".into());
                }
                return Ok(out);
            }
            _ => return Err(format!("expected ',' or '}}' at column {}", p.i + 1)),
        }
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_encode(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            if k <= c.len() {
                s.push(B64[(n >> (18 - 6 * k)) as usize & 63] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

fn b64_decode(s: &str) -> std::result::Result<Vec<u8>, String> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for ch in s.bytes() {
        let v = B64.iter().position(|&c| c == ch).ok_or(format!("invalid base64 character {:?}", ch as char))? as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

fn json_string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn read_payloads(path: &str, ids: &[u64]) -> Result<std::collections::HashMap<u64, JsonRow>> {
    use std::io::BufRead;
    let known: std::collections::HashSet<u64> = ids.iter().copied().collect();
    let f = std::fs::File::open(path).map_err(|e| Error::io(&format!("open {path}"), e))?;
    let mut out = std::collections::HashMap::new();
    for (ln, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| Error::io(&format!("read {path}"), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |m: String| Error::new(Status::InvalidArgument, format!("{path} line {}: {m}", ln + 1));
        let obj = parse_json_object(&line).map_err(bad)?;
        let mut row = JsonRow::default();
        let mut id = None;
        for (k, v) in obj {
            match (k.as_str(), v) {
                ("id", J::Num(n)) => id = Some(n),
                ("id", v) => return Err(bad(format!("id must be an unsigned integer, got {v:?}"))),
                ("namespace", J::Num(n)) => row.namespace = Some(n),
                ("created_ms", J::Num(n)) => row.created_ms = Some(n),
                ("expires_ms", J::Num(n)) => row.expires_ms = Some(n),
                ("expires_ms", J::Null) | ("payload", J::Null) | ("payload_b64", J::Null) => {}
                ("payload", J::Str(s)) => row.payload = Some(s.into_bytes()),
                ("payload", J::Raw(r)) => row.payload = Some(r.into_bytes()),
                ("payload", J::Num(n)) => row.payload = Some(n.to_string().into_bytes()),
                ("payload_b64", J::Str(s)) => row.payload = Some(b64_decode(&s).map_err(bad)?),
                (k @ ("namespace" | "created_ms" | "expires_ms" | "payload_b64"), v) => {
                    return Err(bad(format!("bad value for {k}: {v:?}")))
                }
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

fn read_u64s(path: &str, n: usize, what: &str) -> Result<Vec<u64>> {
    match npy::read(&PathBuf::from(path))? {
        npy::Npy { data: NpyData::U64(x), shape } if x.len() == n && shape.len() == 1 => Ok(x),
        v => Err(Error::new(
            Status::InvalidArgument,
            format!("{path}: {what} must be {n} uint64/int64 values of shape ({n},), got shape {:?}", v.shape),
        )),
    }
}

/// The (n, dim) float vectors of an .npy file (f32, or f16 widened), and n.
pub(super) fn read_vectors(vp: &str, dim: usize) -> Result<(Vec<f32>, usize)> {
    let v = npy::read(&PathBuf::from(vp))?;
    let NpyData::F32(vals) = v.data else {
        return Err(Error::new(Status::InvalidArgument, format!("{vp}: vectors must be float32 or float16")));
    };
    if v.shape.len() != 2 || v.shape[1] != dim {
        return Err(Error::new(Status::DimensionMismatch, format!("{vp}: shape {:?} is not (n, {dim})", v.shape)));
    }
    Ok((vals, v.shape[0]))
}

pub(super) fn import(a: &Args) {
    let dim: usize = a.num("--dim", 0);
    if dim == 0 {
        usage("import needs --dim");
    }
    let vp = a.get("--vectors").unwrap_or_else(|| usage("import needs --vectors FILE.npy"));
    let t0 = std::time::Instant::now();
    let run = || -> Result<String> {
        let (vals, n) = read_vectors(vp, dim)?;
        types::check_finite(&vals, vp)?;
        let ids: Vec<u64> = match a.get("--ids") {
            None => (0..n as u64).collect(),
            Some(p) => read_u64s(p, n, "ids")?,
        };
        let ns_file = match a.get("--namespaces") {
            None => None,
            Some(p) => Some(read_u64s(p, n, "namespaces")?),
        };
        let rows = match a.get("--payloads") {
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
        if let Some(name) = a.get("--name") {
            if a.get("--data-dir").is_some() {
                usage("import takes --name (online) or --data-dir (offline), not both");
            }
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
                let o = UpsertOptions { namespaces: Namespaces::PerItem(&sns), payloads: Some(pl), expires_ms, ..UpsertOptions::default() };
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
        let dir =
            PathBuf::from(a.get("--data-dir").unwrap_or_else(|| usage("import needs --data-dir DIR (offline) or --name NAME (online)")));
        let metric = match a.get("--metric") {
            Some(m) => Metric::parse(m)?,
            None => persist::dir_shape(&dir)?.map(|s| s.1).unwrap_or(Metric::Cosine),
        };
        let cap: usize = a.num("--capacity", u32::MAX as usize);
        let maxp: usize = a.num("--max-payload", 65536);
        let mut store = store::Store::new(dim, metric, cap, maxp);
        let popts = persist::PersistOptions { sync: SyncPolicy::Always, sync_interval_ms: 100 };
        let (mut p, rec) = persist::Persist::open(&dir, dim, metric, &popts, &mut store)?;
        if let Some(t) = &rec.torn_tail {
            eprintln!("kalosd: {t}");
        }
        let before = store.len();
        for c in keep.chunks(65536) {
            let items: Vec<store::UpsertItem> = c
                .iter()
                .map(|&i| store::UpsertItem {
                    fields: &[],
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

pub(super) fn export(a: &Args) {
    let dir = PathBuf::from(a.get("--data-dir").unwrap_or_else(|| usage("export needs --data-dir DIR")));
    let vp = a.get("--vectors").unwrap_or_else(|| usage("export needs --vectors OUT.npy"));
    let ip = a.get("--ids").unwrap_or_else(|| usage("export needs --ids OUT.npy"));
    let f16 = match a.get("--dtype").unwrap_or("f32") {
        "f32" | "float32" => false,
        "f16" | "float16" => true,
        d => usage(&format!("--dtype {d:?}: f32 or f16")),
    };
    let t0 = std::time::Instant::now();
    let run = || -> Result<String> {
        let (dim, metric) =
            persist::dir_shape(&dir)?.ok_or_else(|| Error::new(Status::NotFound, format!("{} holds no Kalos data", dir.display())))?;
        let mut store = store::Store::new(dim, metric, u32::MAX as usize, u32::MAX as usize);
        let popts = persist::PersistOptions { sync: SyncPolicy::Always, sync_interval_ms: 100 };
        let (p, rec) = persist::Persist::open(&dir, dim, metric, &popts, &mut store)?;
        if let Some(t) = &rec.torn_tail {
            eprintln!("kalosd: {t}");
        }
        let n = store.len();
        let mut vals = Vec::with_capacity(n * dim);
        for r in 0..n {
            vals.extend_from_slice(&store.vector_of_row(r));
        }
        if f16 {
            npy::write_f16(&PathBuf::from(vp), &[n, dim], &vals)?;
        } else {
            npy::write_f32(&PathBuf::from(vp), &[n, dim], &vals)?;
        }
        npy::write_u64(&PathBuf::from(ip), store.ids())?;
        if let Some(np) = a.get("--namespaces") {
            npy::write_u64(&PathBuf::from(np), store.namespaces())?;
        }
        if let Some(pp) = a.get("--payloads") {
            use std::io::Write;
            let f = std::fs::File::create(pp).map_err(|e| Error::io(&format!("create {pp}"), e))?;
            let mut w = std::io::BufWriter::new(f);
            for r in 0..n {
                let e = store.expires_ms()[r];
                let payload = match store.payload_at(r) {
                    None => "\"payload\":null".to_string(),
                    Some(b) => match std::str::from_utf8(b) {
                        Ok(s) => format!("\"payload\":{}", json_string(s)),
                        Err(_) => format!("\"payload_b64\":\"{}\"", b64_encode(b)),
                    },
                };
                writeln!(
                    w,
                    "{{\"id\":{},\"namespace\":{},\"created_ms\":{},\"expires_ms\":{},{payload}}}",
                    store.ids()[r],
                    store.namespaces()[r],
                    store.created_ms()[r],
                    if e == NEVER { "null".to_string() } else { e.to_string() }
                )
                .map_err(|e| Error::io(&format!("write {pp}"), e))?;
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

pub(super) fn repair(a: &Args) {
    let dir = PathBuf::from(a.get("--data-dir").unwrap_or_else(|| usage("repair needs --data-dir DIR")));
    match persist::repair(&dir) {
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
    fn json_and_base64() {
        let o =
            parse_json_object(r#"{"id": 5, "payload": "a\"b\\n\u00e9\ud83c\udf75", "expires_ms": null, "x": [1, {"y": "}"}]}"#).unwrap();
        assert_eq!(o[0], ("id".into(), J::Num(5)));
        assert_eq!(o[1], ("payload".into(), J::Str("a\"b\\n\u{e9}\u{1F375}".into())));
        assert_eq!(o[2], ("expires_ms".into(), J::Null));
        assert_eq!(o[3], ("x".into(), J::Raw(r#"[1, {"y": "}"}]"#.into())));
        assert!(parse_json_object("{\"id\": 1,}").is_err());
        for n in 0..10 {
            let b: Vec<u8> = (0..n).map(|i| (i * 37 + 1) as u8).collect();
            assert_eq!(b64_decode(&b64_encode(&b)).unwrap(), b);
        }
        assert_eq!(b64_encode(b"foob"), "Zm9vYg==");
        let s = "tab\there \"q\" \u{1} é";
        let o = parse_json_object(&format!("{{\"payload\":{}}}", json_string(s))).unwrap();
        assert_eq!(o[0].1, J::Str(s.into()));
    }
}
