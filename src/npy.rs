//! Minimal `.npy` (NumPy format v1/v2/v3) reader and writer for the types Kalos exchanges:
//! `<f4`, `<f2` (read and converted to f32), `<u8`/`<i8` (ids, namespaces). C order only.
//!
//! Why not a crate: `npyz` 0.8.4 (`default-features = false`), the maintained npy crate, was
//! measured against this reader for `kalosd import` / `serve --load` / `export`:
//! - malformed files: 16 hand-made cases (bad magic, truncated header or data, overflowing
//!   and negative shapes, a `)` before `(`, a non-UTF-8 header, a missing key, Fortran order,
//!   `>f4`, `<f8`, trailing bytes, duplicate keys, two valid files). The two agree on 12. npyz
//!   reads Fortran order (reporting it) and big-endian `>f4`, which Kalos has no use for and
//!   this reader refuses. And npyz accepts a shape whose element count overflows
//!   (`(9223372036854775808, 2)`, `(4294967296, 4294967296)`): `len()` wraps to 0 and
//!   `into_vec` returns 0 values under the huge shape, the bug that tests/fuzz.rs found here and
//!   that `tests::a_shape_whose_element_count_overflows_is_refused` pins.
//! - speed, 100k x 768 `<f4` (307 MB) from memory: 0.94-0.99 s here, 1.25-1.43 s with npyz
//!   (3 rounds each, on a loaded 2-core machine).
//! - build cost: npyz brings 18 crates Kalos does not already build (py_literal with pest and
//!   pest_derive, num-bigint, num-complex, stacker and psm, which compiles C through cc): 47
//!   CPU-seconds of release build for npyz and its dependencies, paid again by the wheel's zig
//!   build and by clippy. This file is 90 lines of parser, fuzzed by tests/fuzz.rs (`fuzz_npy`).
//!
//! So the reader stays until a crate does better on these three counts.

use std::io::{Read, Write};
use std::path::Path;

use crate::error::{Error, Result, Status};

#[derive(Debug, Clone, PartialEq)]
pub enum NpyData {
    F32(Vec<f32>),
    U64(Vec<u64>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Npy {
    pub shape: Vec<usize>,
    pub data: NpyData,
}

fn corrupt(path: &Path, m: impl std::fmt::Display) -> Error {
    Error::new(Status::Corrupt, format!("{}: {m}", path.display()))
}

pub fn read(path: &Path) -> Result<Npy> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(&format!("open {}", path.display()), e))?;
    let mut all = Vec::new();
    f.read_to_end(&mut all).map_err(|e| Error::io(&format!("read {}", path.display()), e))?;
    parse(&all).map_err(|m| corrupt(path, m))
}

pub fn parse(all: &[u8]) -> std::result::Result<Npy, String> {
    if all.len() < 10 || &all[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let major = all[6];
    let (hlen, hstart) = match major {
        1 => (u16::from_le_bytes([all[8], all[9]]) as usize, 10),
        2 | 3 => {
            if all.len() < 12 {
                return Err("truncated header".into());
            }
            (u32::from_le_bytes(all[8..12].try_into().unwrap()) as usize, 12)
        }
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = std::str::from_utf8(all.get(hstart..hstart + hlen).ok_or("truncated header")?).map_err(|_| "header is not text")?;
    let field = |key: &str| -> std::result::Result<&str, String> {
        let i = header.find(&format!("'{key}'")).ok_or(format!("header lacks '{key}'"))?;
        Ok(header[i + key.len() + 2..].trim_start().trim_start_matches(':').trim_start())
    };
    let descr = field("descr")?;
    let descr = descr.trim_start_matches('\'');
    let descr = &descr[..descr.find('\'').ok_or("bad descr")?];
    if field("fortran_order")?.starts_with("True") {
        return Err("Fortran-order arrays are not supported; save with np.ascontiguousarray".into());
    }
    let shape_s = field("shape")?;
    let open = shape_s.find('(').ok_or("bad shape")? + 1;
    let shape_s = &shape_s[open..open + shape_s[open..].find(')').ok_or("bad shape")?];
    let shape: Vec<usize> = shape_s
        .split(',')
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format!("bad shape entry {s:?}")))
        .collect::<std::result::Result<_, _>>()?;
    let overflow = || format!("shape {shape:?}: its size overflows");
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(overflow)?;
    let body = &all[hstart + hlen..];
    let need = |w: usize| -> std::result::Result<&[u8], String> {
        let bytes = n.checked_mul(w).ok_or_else(overflow)?;
        body.get(..bytes).ok_or(format!("data holds {} bytes; shape {:?} of {w}-byte items needs {bytes}", body.len(), shape))
    };
    let data = match descr {
        "<f4" => NpyData::F32(need(4)?.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()),
        "<f2" => NpyData::F32(need(2)?.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
        "<u8" | "<i8" => NpyData::U64(need(8)?.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect()),
        "<u4" | "<i4" => NpyData::U64(need(4)?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as u64).collect()),
        d => return Err(format!("unsupported dtype {d} (use float32, float16, uint64 or int64)")),
    };
    Ok(Npy { shape, data })
}

fn header_bytes(descr: &str, shape: &[usize]) -> Vec<u8> {
    let shape_s = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!("({})", shape.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_s}, }}");
    let total = 10 + h.len() + 1;
    h.push_str(&" ".repeat((64 - total % 64) % 64));
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    out
}

pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    let mut out = header_bytes("<f4", shape);
    for x in data {
        out.extend_from_slice(&x.to_le_bytes());
    }
    write_file(path, &out)
}

/// Writes `<f2` (IEEE half; values are rounded to nearest).
pub fn write_f16(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    let mut out = header_bytes("<f2", shape);
    for x in data {
        out.extend_from_slice(&half::f16::from_f32(*x).to_le_bytes());
    }
    write_file(path, &out)
}

pub fn write_u64(path: &Path, data: &[u64]) -> Result<()> {
    let mut out = header_bytes("<u8", &[data.len()]);
    for x in data {
        out.extend_from_slice(&x.to_le_bytes());
    }
    write_file(path, &out)
}

fn write_file(path: &Path, b: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(|e| Error::io(&format!("create {}", path.display()), e))?;
    f.write_all(b).map_err(|e| Error::io(&format!("write {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn roundtrip() {
        let d = std::env::temp_dir().join(format!("npy-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        write_f32(&d.join("a.npy"), &[2, 3], &[1., 2., 3., 4., 5., 6.]).unwrap();
        let a = read(&d.join("a.npy")).unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.data, NpyData::F32(vec![1., 2., 3., 4., 5., 6.]));
        write_u64(&d.join("b.npy"), &[7, 8]).unwrap();
        assert_eq!(read(&d.join("b.npy")).unwrap().data, NpyData::U64(vec![7, 8]));
        assert!(parse(b"garbage").is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A shape whose element count passes usize is refused (found by tests/fuzz.rs: the count
    /// wrapped to 0, the empty array was accepted with its huge shape, and `kalosd import` then
    /// collected `shape[0]` ids).
    #[test]
    fn a_shape_whose_element_count_overflows_is_refused() {
        for shape in ["(9223372036854775808, 2)", "(4294967296, 4294967296)", "(2, 3, 3074457345618258603)"] {
            let h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}\n");
            let mut b = b"\x93NUMPY\x01\x00".to_vec();
            b.extend_from_slice(&(h.len() as u16).to_le_bytes());
            b.extend_from_slice(h.as_bytes());
            b.extend_from_slice(&[0; 16]);
            let e = parse(&b).unwrap_err();
            assert!(e.contains("overflows"), "{shape}: {e}");
        }
    }

    /// A ')' before the shape's '(' is a bad shape, not a panic (found by tests/fuzz.rs).
    #[test]
    fn a_shape_closed_before_it_opens_is_refused() {
        let h = "{'descr': '<f4', 'fortran_order': False, 'shape': ) (1, 2, }\n";
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&[0; 8]);
        assert_eq!(parse(&b).unwrap_err(), "bad shape");
    }
}
