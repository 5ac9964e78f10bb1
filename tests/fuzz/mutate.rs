//! Inputs for the fuzz targets: random values with a bias towards the ones parsers get wrong,
//! and structured mutations of valid inputs (bits flipped, bytes set, length and count fields set
//! to boundary values, truncation, insertion, deletion, duplication), followed by a fix-up of the
//! checksums so that a mutation reaches the code behind them.

use rand::rngs::StdRng;
use rand::{Rng, RngCore};

/// A little-endian integer field of a valid input: `width` (4 or 8) bytes at `off`.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub off: usize,
    pub width: usize,
}

impl Field {
    pub fn u32(off: usize) -> Field {
        Field { off, width: 4 }
    }
    pub fn u64(off: usize) -> Field {
        Field { off, width: 8 }
    }
}

/// Values that sit on the boundaries a parser checks: zero, one, powers of two, sign bits, the
/// largest values, lengths near the input's own length.
pub fn interesting(rng: &mut StdRng, width: usize, old: u64, len: usize) -> u64 {
    let max = if width == 8 { u64::MAX } else { u32::MAX as u64 };
    let v = match rng.random_range(0..16) {
        0 => 0,
        1 => 1,
        2 => rng.random_range(2..16),
        3 => max,
        4 => max - 1,
        5 => max >> 1,
        6 => (max >> 1) + 1,
        7 => 1u64 << rng.random_range(0..(8 * width as u32)),
        8 => len as u64,
        9 => (len as u64).wrapping_sub(rng.random_range(0..16)),
        10 => (len as u64).wrapping_add(rng.random_range(1..16)),
        11 => old.wrapping_add(1),
        12 => old.wrapping_sub(1),
        13 => old.wrapping_mul(2),
        14 => old ^ (1u64 << rng.random_range(0..(8 * width as u32))),
        _ => rng.next_u64(),
    };
    v & max
}

fn put(b: &mut [u8], f: Field, v: u64) {
    if f.off + f.width <= b.len() {
        b[f.off..f.off + f.width].copy_from_slice(&v.to_le_bytes()[..f.width]);
    }
}

fn get(b: &[u8], f: Field) -> u64 {
    if f.off + f.width > b.len() {
        return 0;
    }
    let mut x = [0u8; 8];
    x[..f.width].copy_from_slice(&b[f.off..f.off + f.width]);
    u64::from_le_bytes(x)
}

/// Random bytes, `len` of them.
pub fn bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

/// Random bytes, a length in `r` of them.
pub fn bytes_in(rng: &mut StdRng, r: std::ops::Range<usize>) -> Vec<u8> {
    let n = rng.random_range(r);
    bytes(rng, n)
}

/// Applies one to four mutations to a copy of `base`. `fields` are the length, count and flag
/// fields of `base` (their offsets go stale once bytes are inserted or removed, which is fine).
/// Bytes before `keep` are never changed (a target's own parameters). The result is at most
/// `max_len` bytes long.
pub fn mutate(rng: &mut StdRng, base: &[u8], fields: &[Field], keep: usize, max_len: usize) -> Vec<u8> {
    let mut b = base.to_vec();
    let n = rng.random_range(1..=4);
    for _ in 0..n {
        let len = b.len();
        let body = len.saturating_sub(keep);
        match rng.random_range(0..12) {
            // A field set to a boundary value (twice as likely as anything else).
            0 | 1 if !fields.is_empty() => {
                let f = fields[rng.random_range(0..fields.len())];
                if f.off >= keep {
                    let v = interesting(rng, f.width, get(&b, f), len);
                    put(&mut b, f, v);
                }
            }
            2 if body > 0 => {
                let i = keep + rng.random_range(0..body);
                b[i] ^= 1 << rng.random_range(0..8);
            }
            3 if body > 0 => {
                let i = keep + rng.random_range(0..body);
                b[i] = rng.random();
            }
            // Any aligned word set to a boundary value: a length field the map does not name.
            4 if body >= 4 => {
                let f = Field::u32(keep + rng.random_range(0..=(body - 4)) / 4 * 4);
                let v = interesting(rng, 4, get(&b, f), len);
                put(&mut b, f, v);
            }
            5 => {
                let at = keep + rng.random_range(0..=body);
                b.truncate(at);
            }
            6 => {
                let extra = bytes_in(rng, 1..64);
                b.extend_from_slice(&extra);
            }
            7 => {
                let at = keep + rng.random_range(0..=body);
                let extra = bytes_in(rng, 1..32);
                b.splice(at..at, extra);
            }
            8 if body > 0 => {
                let at = keep + rng.random_range(0..body);
                let end = (at + rng.random_range(1..64)).min(len);
                b.drain(at..end);
            }
            9 if body > 0 => {
                let at = keep + rng.random_range(0..body);
                let end = (at + rng.random_range(1..128)).min(len);
                let chunk = b[at..end].to_vec();
                let to = keep + rng.random_range(0..=body);
                b.splice(to..to, chunk);
            }
            10 if body > 0 => {
                let at = keep + rng.random_range(0..body);
                let end = (at + rng.random_range(1..32)).min(len);
                let fill = [0u8, 0xff, rng.random()][rng.random_range(0..3)];
                b[at..end].fill(fill);
            }
            _ => {}
        }
    }
    b.truncate(max_len);
    b
}

/// A random f32: mostly ordinary values, sometimes zero, subnormal, huge, or not finite.
pub fn float(rng: &mut StdRng) -> f32 {
    match rng.random_range(0..40) {
        0 => 0.0,
        1 => -0.0,
        2 => f32::MIN_POSITIVE / rng.random_range(1.0..1e6),
        3 => f32::MAX / rng.random_range(1.0..4.0),
        4 => -f32::MAX,
        5 => f32::from_bits(1),
        6 => f32::NAN,
        7 => f32::INFINITY,
        8 => f32::from_bits(rng.random()),
        _ => rng.random_range(-2.0..2.0),
    }
}

/// `n` random finite values, never all zero (a valid cosine vector).
pub fn vector(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n)
        .map(|_| loop {
            let x = float(rng);
            if x.is_finite() && x.abs() < 1e18 {
                break x;
            }
        })
        .collect();
    if let Some(x) = v.first_mut().filter(|x| **x == 0.0) {
        *x = 0.5;
    }
    v
}

/// Recomputes the CRC-32C of every `len u32 | crc u32 | body` frame from `from` on (log records,
/// snapshot blocks), following the lengths as they now are, and of the 48-byte file header.
pub fn reseal(b: &mut [u8], from: usize) {
    use kalos::persist::{crc32c, crc32c_update};
    if b.len() >= 44 {
        let c = crc32c(&b[..40]);
        b[40..44].copy_from_slice(&c.to_le_bytes());
    }
    let mut o = from;
    while o + 8 <= b.len() {
        let len = u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
        if len > b.len() - o - 8 {
            break;
        }
        let c = crc32c_update(crc32c(&b[o..o + 4]), &b[o + 8..o + 8 + len]);
        b[o + 4..o + 8].copy_from_slice(&c.to_le_bytes());
        o += 8 + len;
    }
}
