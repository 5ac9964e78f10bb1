//! Filter expressions over metadata fields: the AST, its compact binary form (the C ABI's and
//! the slot protocol's; docs/FORMATS.md, "Filter expressions"), checked decoding, and evaluation
//! into a bitmap of matching rows over the store's field columns.
//!
//! Semantics (every operator on a row):
//! - `eq`, `in`, `contains`: the row's value equals the value (one of the values). On a tags
//!   field the row matches when any of its tags does; `contains` on a keyword field is `eq`.
//! - `gt`, `gte`, `lt`, `lte`: ordered comparison within one kind: numbers (int64, float64 and
//!   timestamp compare by exact numeric value, an int64 against a float64 without rounding),
//!   keywords (bytewise UTF-8), bools (false < true). Tags fields never match an ordering.
//! - `ne` is `not eq` and `nin` is `not in`: they match rows where the field is absent.
//! - `exists`: the row has a value for the field (a tags field: at least one tag).
//! - A value of another kind than the field (a keyword against an int64 field), or a field no
//!   memory has set, matches nothing (so `ne` / `nin` match every row).

use crate::error::{Error, Result, Status};
pub mod program;

use crate::meta::{put_name, put_value, ColumnData, Columns, Cursor, FieldType, Value};

/// Version byte that starts an encoded expression.
/// cbindgen:ignore
pub const FILTER_VERSION: u8 = 1;
/// Largest encoded expression, in bytes.
/// cbindgen:ignore
pub const MAX_FILTER_BYTES: usize = 65536;
/// Deepest nesting of and / or / not (the root is depth 1).
/// cbindgen:ignore
pub const MAX_FILTER_DEPTH: usize = 32;
/// Most nodes (operators and values together) in one expression.
/// cbindgen:ignore
pub const MAX_FILTER_NODES: usize = 4096;

const OP_AND: u8 = 1;
const OP_OR: u8 = 2;
const OP_NOT: u8 = 3;
const OP_EQ: u8 = 4;
const OP_NE: u8 = 5;
const OP_GT: u8 = 6;
const OP_GTE: u8 = 7;
const OP_LT: u8 = 8;
const OP_LTE: u8 = 9;
const OP_IN: u8 = 10;
const OP_NIN: u8 = 11;
const OP_EXISTS: u8 = 12;
const OP_CONTAINS: u8 = 13;

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
}

/// A filter expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Not(Box<Expr>),
    Cmp(Cmp, String, Value),
    /// `In(false, ..)` = in, `In(true, ..)` = nin.
    In(bool, String, Vec<Value>),
    Exists(String),
    Contains(String, Value),
}

/// A decoded, checked expression with the bytes it came from (recalls with the same bytes share
/// one engine call).
#[derive(Debug, Clone, PartialEq)]
pub struct Compiled {
    pub bytes: Vec<u8>,
    pub expr: Expr,
}

impl Compiled {
    pub fn new(bytes: &[u8]) -> Result<Compiled> {
        Ok(Compiled { bytes: bytes.to_vec(), expr: Expr::decode(bytes)? })
    }
}

fn bad(msg: impl Into<String>) -> Error {
    Error::new(Status::InvalidArgument, msg.into())
}

impl Expr {
    pub fn eq(f: &str, v: Value) -> Expr {
        Expr::Cmp(Cmp::Eq, f.into(), v)
    }
    /// The binary form: `version u8 (1) | node`.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![FILTER_VERSION];
        self.put(&mut b);
        b
    }
    fn put(&self, b: &mut Vec<u8>) {
        match self {
            Expr::And(v) | Expr::Or(v) => {
                b.push(if matches!(self, Expr::And(_)) { OP_AND } else { OP_OR });
                b.extend_from_slice(&(v.len() as u16).to_le_bytes());
                for e in v {
                    e.put(b);
                }
            }
            Expr::Not(e) => {
                b.push(OP_NOT);
                e.put(b);
            }
            Expr::Cmp(op, f, v) => {
                b.push(match op {
                    Cmp::Eq => OP_EQ,
                    Cmp::Ne => OP_NE,
                    Cmp::Gt => OP_GT,
                    Cmp::Gte => OP_GTE,
                    Cmp::Lt => OP_LT,
                    Cmp::Lte => OP_LTE,
                });
                put_name(b, f);
                put_value(b, v);
            }
            Expr::In(neg, f, vs) => {
                b.push(if *neg { OP_NIN } else { OP_IN });
                put_name(b, f);
                b.extend_from_slice(&(vs.len() as u16).to_le_bytes());
                for v in vs {
                    put_value(b, v);
                }
            }
            Expr::Exists(f) => {
                b.push(OP_EXISTS);
                put_name(b, f);
            }
            Expr::Contains(f, v) => {
                b.push(OP_CONTAINS);
                put_name(b, f);
                put_value(b, v);
            }
        }
    }

    /// Decodes and checks an expression: the version, every operator and value type, the
    /// limits ([`MAX_FILTER_BYTES`], [`MAX_FILTER_DEPTH`], [`MAX_FILTER_NODES`]), no empty
    /// and / or / in, no tags value, and no trailing bytes. Errors are `INVALID_ARGUMENT` naming
    /// the byte offset.
    pub fn decode(b: &[u8]) -> Result<Expr> {
        if b.len() > MAX_FILTER_BYTES {
            return Err(bad(format!("filter: {} bytes (at most {MAX_FILTER_BYTES})", b.len())));
        }
        let mut c = Cursor::new(b, "filter");
        let v = c.u8("version")?;
        if v != FILTER_VERSION {
            return Err(bad(format!("filter: version {v}; this build reads version {FILTER_VERSION}")));
        }
        let mut nodes = 0usize;
        let e = node(&mut c, 1, &mut nodes)?;
        if c.remaining() != 0 {
            return Err(bad(format!("filter: {} trailing bytes after the expression (at byte {})", c.remaining(), c.o)));
        }
        Ok(e)
    }
}

fn count(nodes: &mut usize, n: usize) -> Result<()> {
    *nodes += n;
    if *nodes > MAX_FILTER_NODES {
        return Err(bad(format!("filter: more than {MAX_FILTER_NODES} nodes")));
    }
    Ok(())
}

fn node(c: &mut Cursor<'_>, depth: usize, nodes: &mut usize) -> Result<Expr> {
    if depth > MAX_FILTER_DEPTH {
        return Err(bad(format!("filter: nested deeper than {MAX_FILTER_DEPTH} levels (at byte {})", c.o)));
    }
    count(nodes, 1)?;
    let at = c.o;
    let op = c.u8("operator")?;
    Ok(match op {
        OP_AND | OP_OR => {
            let n = c.u16("operand count")? as usize;
            if n == 0 {
                return Err(bad(format!("filter: {} of no operands at byte {at}", if op == OP_AND { "and" } else { "or" })));
            }
            let mut v = Vec::with_capacity(n.min(64));
            for _ in 0..n {
                v.push(node(c, depth + 1, nodes)?);
            }
            if op == OP_AND {
                Expr::And(v)
            } else {
                Expr::Or(v)
            }
        }
        OP_NOT => Expr::Not(Box::new(node(c, depth + 1, nodes)?)),
        OP_EQ..=OP_LTE => {
            let f = c.name()?;
            let v = c.value(false)?;
            count(nodes, 1)?;
            let cmp = [Cmp::Eq, Cmp::Ne, Cmp::Gt, Cmp::Gte, Cmp::Lt, Cmp::Lte][(op - OP_EQ) as usize];
            Expr::Cmp(cmp, f, v)
        }
        OP_IN | OP_NIN => {
            let f = c.name()?;
            let n = c.u16("value count")? as usize;
            if n == 0 {
                return Err(bad(format!("filter: {} of no values at byte {at}", if op == OP_IN { "in" } else { "nin" })));
            }
            count(nodes, n)?;
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(c.value(false)?);
            }
            Expr::In(op == OP_NIN, f, v)
        }
        OP_EXISTS => Expr::Exists(c.name()?),
        OP_CONTAINS => {
            let f = c.name()?;
            count(nodes, 1)?;
            Expr::Contains(f, c.value(false)?)
        }
        _ => return Err(bad(format!("filter: unknown operator {op} at byte {at}"))),
    })
}

/// A bitmap of rows, one bit per row (bit r of word r / 64).
#[derive(Debug, Clone, PartialEq)]
pub struct Bitmap {
    pub words: Vec<u64>,
    pub len: usize,
}

impl Bitmap {
    fn new(len: usize, set: bool) -> Bitmap {
        let mut b = Bitmap { words: vec![if set { !0 } else { 0 }; len.div_ceil(64)], len };
        b.trim();
        b
    }
    fn trim(&mut self) {
        if !self.len.is_multiple_of(64) {
            if let Some(w) = self.words.last_mut() {
                *w &= (1u64 << (self.len % 64)) - 1;
            }
        }
    }
    #[inline]
    pub fn get(&self, r: usize) -> bool {
        self.words[r / 64] >> (r % 64) & 1 != 0
    }
    #[inline]
    pub fn clear(&mut self, r: usize) {
        self.words[r / 64] &= !(1 << (r % 64));
    }
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }
    pub fn from_fn(len: usize, f: impl Fn(usize) -> bool) -> Bitmap {
        let mut words = vec![0u64; len.div_ceil(64)];
        for (wi, w) in words.iter_mut().enumerate() {
            let base = wi * 64;
            let n = 64.min(len - base);
            let mut x = 0u64;
            for j in 0..n {
                x |= (f(base + j) as u64) << j;
            }
            *w = x;
        }
        Bitmap { words, len }
    }
    fn not(mut self) -> Bitmap {
        for w in &mut self.words {
            *w = !*w;
        }
        self.trim();
        self
    }
    /// The set rows, ascending.
    pub fn rows(&self) -> Vec<u32> {
        let mut v = Vec::with_capacity(self.count());
        for (wi, &w) in self.words.iter().enumerate() {
            let mut x = w;
            while x != 0 {
                v.push((wi * 64 + x.trailing_zeros() as usize) as u32);
                x &= x - 1;
            }
        }
        v
    }
}

/// Exact order of an int64 and a float64 (finite).
fn cmp_i64_f64(x: i64, f: f64) -> std::cmp::Ordering {
    use std::cmp::Ordering::*;
    if f >= 9_223_372_036_854_775_808.0 {
        return Less;
    }
    if f < -9_223_372_036_854_775_808.0 {
        return Greater;
    }
    let t = f.floor();
    match x.cmp(&(t as i64)) {
        Equal if f > t => Less,
        o => o,
    }
}

/// A filter value resolved against a column: how a row value compares to it.
enum Key {
    Code(Option<u32>, String),
    I(i64),
    F(f64),
    B(bool),
}

fn key_for(cols: &Columns, t: FieldType, v: &Value) -> Option<Key> {
    Some(match (t, v) {
        (FieldType::Keyword | FieldType::Tags, Value::Keyword(s)) => Key::Code(cols.code_of(s), s.clone()),
        (FieldType::Int | FieldType::Timestamp | FieldType::Float, Value::Int(i) | Value::Timestamp(i)) => Key::I(*i),
        (FieldType::Int | FieldType::Timestamp | FieldType::Float, Value::Float(f)) => Key::F(*f),
        (FieldType::Bool, Value::Bool(b)) => Key::B(*b),
        _ => return None,
    })
}

fn ord_ok(op: Cmp, o: std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::*;
    match op {
        Cmp::Eq => o == Equal,
        Cmp::Ne => o != Equal,
        Cmp::Gt => o == Greater,
        Cmp::Gte => o != Less,
        Cmp::Lt => o == Less,
        Cmp::Lte => o != Greater,
    }
}

/// Rows of `cols` (a table of `len` rows) where field `f` compares `op` to `v` (`op` ≠ Ne).
fn cmp_rows(cols: &Columns, len: usize, op: Cmp, f: &str, v: &Value) -> Bitmap {
    let Some(col) = cols.column(f) else { return Bitmap::new(len, false) };
    let Some(key) = key_for(cols, col.ty, v) else { return Bitmap::new(len, false) };
    match (&col.data, key) {
        (ColumnData::Code(c), Key::Code(code, s)) => {
            if op == Cmp::Eq {
                match code {
                    None => Bitmap::new(len, false),
                    Some(k) => Bitmap::from_fn(len, |r| c[r] == k),
                }
            } else {
                // Order of every code against `s`, computed once per code.
                let ord: Vec<bool> =
                    (1..=cols.string_count()).map(|k| ord_ok(op, cols.string(k as u32).as_bytes().cmp(s.as_bytes()))).collect();
                Bitmap::from_fn(len, |r| c[r] != 0 && ord[c[r] as usize - 1])
            }
        }
        (ColumnData::Tags(t), Key::Code(code, _)) => match (op, code) {
            (Cmp::Eq, Some(k)) => Bitmap::from_fn(len, |r| t[r].binary_search(&k).is_ok()),
            _ => Bitmap::new(len, false),
        },
        (ColumnData::I64 { v, has }, Key::I(k)) => Bitmap::from_fn(len, |r| has[r] && ord_ok(op, v[r].cmp(&k))),
        (ColumnData::I64 { v, has }, Key::F(k)) => Bitmap::from_fn(len, |r| has[r] && ord_ok(op, cmp_i64_f64(v[r], k))),
        (ColumnData::F64 { v, has }, Key::I(k)) => Bitmap::from_fn(len, |r| has[r] && ord_ok(op, cmp_i64_f64(k, v[r]).reverse())),
        (ColumnData::F64 { v, has }, Key::F(k)) => {
            Bitmap::from_fn(len, |r| has[r] && ord_ok(op, v[r].partial_cmp(&k).unwrap_or(std::cmp::Ordering::Equal)))
        }
        (ColumnData::Bool(c), Key::B(k)) => Bitmap::from_fn(len, |r| c[r] != 0 && ord_ok(op, (c[r] == 2).cmp(&k))),
        _ => Bitmap::new(len, false),
    }
}

fn or_into(a: &mut Bitmap, b: &Bitmap) {
    for (x, y) in a.words.iter_mut().zip(&b.words) {
        *x |= *y;
    }
}

fn and_into(a: &mut Bitmap, b: &Bitmap) {
    for (x, y) in a.words.iter_mut().zip(&b.words) {
        *x &= *y;
    }
}

/// Rows where field `f` equals one of `vs`.
fn in_rows(cols: &Columns, len: usize, f: &str, vs: &[Value]) -> Bitmap {
    let Some(col) = cols.column(f) else { return Bitmap::new(len, false) };
    match &col.data {
        ColumnData::Code(_) | ColumnData::Tags(_) if vs.len() > 4 => {
            // A set of codes, one lookup per row (or per tag).
            let mut want: Vec<u32> = vs
                .iter()
                .filter_map(|v| match v {
                    Value::Keyword(s) => cols.code_of(s),
                    _ => None,
                })
                .collect();
            want.sort_unstable();
            want.dedup();
            match &col.data {
                ColumnData::Code(c) => Bitmap::from_fn(len, |r| c[r] != 0 && want.binary_search(&c[r]).is_ok()),
                ColumnData::Tags(t) => Bitmap::from_fn(len, |r| t[r].iter().any(|k| want.binary_search(k).is_ok())),
                _ => unreachable!(),
            }
        }
        _ => {
            let mut acc = Bitmap::new(len, false);
            for v in vs {
                or_into(&mut acc, &cmp_rows(cols, len, Cmp::Eq, f, v));
            }
            acc
        }
    }
}

/// Rows of a table of `len` rows (field columns `cols`) that match `e`.
pub fn eval(e: &Expr, cols: &Columns, len: usize) -> Bitmap {
    match e {
        Expr::And(v) => {
            let mut acc = eval(&v[0], cols, len);
            for x in &v[1..] {
                if acc.words.iter().all(|&w| w == 0) {
                    break;
                }
                and_into(&mut acc, &eval(x, cols, len));
            }
            acc
        }
        Expr::Or(v) => {
            let mut acc = eval(&v[0], cols, len);
            for x in &v[1..] {
                or_into(&mut acc, &eval(x, cols, len));
            }
            acc
        }
        Expr::Not(x) => eval(x, cols, len).not(),
        Expr::Cmp(Cmp::Ne, f, v) => cmp_rows(cols, len, Cmp::Eq, f, v).not(),
        Expr::Cmp(op, f, v) => cmp_rows(cols, len, *op, f, v),
        Expr::In(false, f, vs) => in_rows(cols, len, f, vs),
        Expr::In(true, f, vs) => in_rows(cols, len, f, vs).not(),
        Expr::Contains(f, v) => cmp_rows(cols, len, Cmp::Eq, f, v),
        Expr::Exists(f) => match cols.column(f) {
            None => Bitmap::new(len, false),
            Some(c) => match &c.data {
                ColumnData::Code(v) => Bitmap::from_fn(len, |r| v[r] != 0),
                ColumnData::Tags(v) => Bitmap::from_fn(len, |r| !v[r].is_empty()),
                ColumnData::I64 { has, .. } | ColumnData::F64 { has, .. } => Bitmap::from_fn(len, |r| has[r]),
                ColumnData::Bool(v) => Bitmap::from_fn(len, |r| v[r] != 0),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_int_float_order() {
        use std::cmp::Ordering::*;
        assert_eq!(cmp_i64_f64(3, 3.0), Equal);
        assert_eq!(cmp_i64_f64(3, 3.5), Less);
        assert_eq!(cmp_i64_f64(4, 3.5), Greater);
        assert_eq!(cmp_i64_f64(-4, -3.5), Less);
        assert_eq!(cmp_i64_f64(i64::MAX, 9.3e18), Less);
        assert_eq!(cmp_i64_f64(i64::MIN, -9.3e18), Greater);
        // 2^53 + 1 is not a float64: the int is larger than the float 2^53.
        assert_eq!(cmp_i64_f64((1 << 53) + 1, (1u64 << 53) as f64), Greater);
    }

    #[test]
    fn decode_round_trips_and_limits() {
        let e = Expr::And(vec![
            Expr::eq("user", Value::Keyword("ann".into())),
            Expr::Or(vec![Expr::Cmp(Cmp::Gte, "n".into(), Value::Int(3)), Expr::Not(Box::new(Expr::Exists("x".into())))]),
            Expr::In(true, "k".into(), vec![Value::Bool(true), Value::Float(1.5), Value::Timestamp(9)]),
            Expr::Contains("tags".into(), Value::Keyword("t".into())),
        ]);
        let b = e.encode();
        assert_eq!(Expr::decode(&b).unwrap(), e);
        for cut in 0..b.len() {
            assert_eq!(Expr::decode(&b[..cut]).unwrap_err().status, Status::InvalidArgument);
        }
        let mut deep = Expr::Exists("a".into());
        for _ in 0..MAX_FILTER_DEPTH {
            deep = Expr::Not(Box::new(deep));
        }
        assert!(Expr::decode(&deep.encode()).unwrap_err().message.contains("deeper"));
        assert!(Expr::decode(&Expr::And(vec![]).encode()).unwrap_err().message.contains("no operands"));
        let tags = Expr::eq("t", Value::Tags(vec!["a".into()]));
        assert!(Expr::decode(&tags.encode()).unwrap_err().message.contains("value type 2"));
    }
}
