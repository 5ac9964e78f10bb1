//! A filter expression lowered to a flat postfix program over "cells": one `u64` value and one
//! presence byte per row and field. This is the form the GPU evaluates (`filter_eval` in
//! `kernels/table.cu`); [`Program::eval`] runs the same program on the CPU, and the tests check
//! it against [`super::eval`] over random columns and expressions.
//!
//! Every comparison is resolved on the host into a test that needs no string or mixed-type
//! arithmetic on the device:
//! - keyword fields: membership of the row's code in a sorted set of codes (an ordering
//!   comparison becomes the set of dictionary codes whose strings satisfy it);
//! - int64 and timestamp fields: a closed interval of integers (a float operand is rounded to
//!   the exact integer bounds);
//! - float64 fields: an interval of floats with open or closed ends (an int operand beyond 2^53
//!   becomes the nearest float bound that keeps the comparison exact);
//! - bool fields: the set of allowed values.
//!
//! Tags fields (several values per row) have no cell form: [`compile`] returns `None` for an
//! expression that reads one, and the caller evaluates it with [`super::eval`].

use super::{cmp_i64_f64, ord_ok, Cmp, Expr};
use crate::meta::{Column, ColumnData, Columns, FieldType, Value};

/// Always false.
pub const P_FALSE: u32 = 0;
/// Always true.
pub const P_TRUE: u32 = 1;
/// The row has a value for column `col`.
pub const P_EXISTS: u32 = 2;
/// The row's keyword code is one of `consts[a .. a + b]` (sorted ascending).
pub const P_CODE_IN: u32 = 3;
/// The row's int64 is within `[consts[a], consts[a + 1]]` (as i64).
pub const P_I64_RANGE: u32 = 4;
/// The row's float64 is within `consts[a] .. consts[a + 1]` (f64 bits); `b` bit 0: the low end
/// is open, bit 1: the high end is open.
pub const P_F64_RANGE: u32 = 5;
/// The row's bool cell (1 = false, 2 = true) has its bit set in `a`.
pub const P_BOOL_SET: u32 = 6;
/// Pops one, pushes its negation.
pub const P_NOT: u32 = 7;
/// Pops two, pushes their conjunction.
pub const P_AND: u32 = 8;
/// Pops two, pushes their disjunction.
pub const P_OR: u32 = 9;

/// Deepest stack a program may need: the device keeps it in the bits of one u64.
pub const PROGRAM_STACK: usize = 64;

/// One instruction (mirrored by `struct FIns` in `kernels/table.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ins {
    pub op: u32,
    pub col: u32,
    pub a: u32,
    pub b: u32,
}

/// A compiled filter: postfix instructions and their constants. `col` indexes
/// [`Columns::columns`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Program {
    pub ins: Vec<Ins>,
    pub consts: Vec<u64>,
}

/// The cell of row `r` of a column: (value, present). Keyword: its code; int64 and timestamp:
/// the i64 bits; float64: the f64 bits; bool: 1 false, 2 true. `None` for a tags column.
pub fn cell(c: &ColumnData, r: usize) -> Option<(u64, bool)> {
    Some(match c {
        ColumnData::Code(v) => (v[r] as u64, v[r] != 0),
        ColumnData::I64 { v, has } => (v[r] as u64, has[r]),
        ColumnData::F64 { v, has } => (v[r].to_bits(), has[r]),
        ColumnData::Bool(v) => (v[r] as u64, v[r] != 0),
        ColumnData::Tags(_) => return None,
    })
}

struct Builder<'a> {
    cols: &'a Columns,
    p: Program,
    depth: usize,
    max_depth: usize,
}

impl<'a> Builder<'a> {
    fn push(&mut self, op: u32, col: u32, a: u32, b: u32) {
        self.p.ins.push(Ins { op, col, a, b });
        match op {
            P_NOT => {}
            P_AND | P_OR => self.depth -= 1,
            _ => {
                self.depth += 1;
                self.max_depth = self.max_depth.max(self.depth);
            }
        }
    }
    /// A field's column and its index (the `col` of an instruction).
    fn col(&self, f: &str) -> Option<(u32, &'a Column)> {
        let i = self.cols.position(f)?;
        Some((i as u32, &self.cols.columns()[i]))
    }
    fn konst(&mut self, v: bool) {
        self.push(if v { P_TRUE } else { P_FALSE }, 0, 0, 0);
    }
    fn consts(&mut self, v: &[u64]) -> u32 {
        let at = self.p.consts.len() as u32;
        self.p.consts.extend_from_slice(v);
        at
    }
    fn i64_range(&mut self, col: u32, lo: i64, hi: i64) {
        if lo > hi {
            return self.konst(false);
        }
        let a = self.consts(&[lo as u64, hi as u64]);
        self.push(P_I64_RANGE, col, a, 0);
    }
    fn f64_range(&mut self, col: u32, lo: f64, lo_open: bool, hi: f64, hi_open: bool) {
        let a = self.consts(&[lo.to_bits(), hi.to_bits()]);
        self.push(P_F64_RANGE, col, a, lo_open as u32 | (hi_open as u32) << 1);
    }
    fn code_in(&mut self, col: u32, mut codes: Vec<u64>) {
        codes.sort_unstable();
        codes.dedup();
        if codes.is_empty() {
            return self.konst(false);
        }
        let a = self.consts(&codes);
        self.push(P_CODE_IN, col, a, codes.len() as u32);
    }
    /// Folds the `n` values on top of the stack with `op` (n ≥ 1).
    fn fold(&mut self, op: u32, n: usize) {
        for _ in 1..n {
            self.push(op, 0, 0, 0);
        }
    }

    /// One comparison `field op v` (op ≠ Ne), as `super::cmp_rows` defines it.
    fn cmp(&mut self, op: Cmp, f: &str, v: &Value) -> Option<()> {
        let Some((ci, col)) = self.col(f) else {
            self.konst(false);
            return Some(());
        };
        match (col.ty, v) {
            (FieldType::Tags, _) => return None,
            (FieldType::Keyword, Value::Keyword(s)) => {
                let codes = if op == Cmp::Eq {
                    self.cols.code_of(s).map(|c| vec![c as u64]).unwrap_or_default()
                } else {
                    (1..=self.cols.string_count() as u32)
                        .filter(|&c| ord_ok(op, self.cols.string(c).as_bytes().cmp(s.as_bytes())))
                        .map(|c| c as u64)
                        .collect()
                };
                self.code_in(ci, codes);
            }
            (FieldType::Int | FieldType::Timestamp, Value::Int(k) | Value::Timestamp(k)) => {
                let k = *k;
                let (lo, hi) = match op {
                    Cmp::Eq => (k, k),
                    Cmp::Gt => (k.saturating_add(1), if k == i64::MAX { i64::MIN } else { i64::MAX }),
                    Cmp::Gte => (k, i64::MAX),
                    Cmp::Lt => (if k == i64::MIN { i64::MAX } else { i64::MIN }, k.saturating_sub(1)),
                    Cmp::Lte => (i64::MIN, k),
                    Cmp::Ne => unreachable!("ne is not eq"),
                };
                // An empty interval (lo > hi) compiles to false.
                self.i64_range(ci, lo, hi);
            }
            (FieldType::Int | FieldType::Timestamp, Value::Float(f)) => {
                // The integers x with `cmp_i64_f64(x, f)` satisfying op.
                let f = *f;
                if !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f) {
                    let below = f > 0.0; // every int64 is below f (else above)
                    let all = match op {
                        Cmp::Lt | Cmp::Lte => below,
                        Cmp::Gt | Cmp::Gte => !below,
                        _ => false,
                    };
                    if all {
                        self.push(P_EXISTS, ci, 0, 0);
                    } else {
                        self.konst(false);
                    }
                    return Some(());
                }
                let t = f.floor() as i64;
                let integral = f.floor() == f;
                // t < 2^63 - 1024 and t >= -2^63: t + 1 cannot overflow.
                let (lo, hi) = match op {
                    Cmp::Eq if integral => (t, t),
                    Cmp::Eq => (i64::MAX, i64::MIN),
                    Cmp::Gt => (t + 1, i64::MAX),
                    Cmp::Gte if integral => (t, i64::MAX),
                    Cmp::Gte => (t + 1, i64::MAX),
                    Cmp::Lt if integral && t == i64::MIN => (i64::MAX, i64::MIN),
                    Cmp::Lt if integral => (i64::MIN, t - 1),
                    Cmp::Lt | Cmp::Lte => (i64::MIN, t),
                    Cmp::Ne => unreachable!("ne is not eq"),
                };
                self.i64_range(ci, lo, hi);
            }
            (FieldType::Float, Value::Float(k)) => self.f64_cmp(ci, op, *k),
            (FieldType::Float, Value::Int(k) | Value::Timestamp(k)) => {
                let k = *k;
                let kf = k as f64;
                match cmp_i64_f64(k, kf) {
                    std::cmp::Ordering::Equal => self.f64_cmp(ci, op, kf),
                    // k is not a float: no row equals it, and the nearest float stands for it
                    // with the end open or closed as it lies above or below k.
                    o => {
                        let kf_above = o == std::cmp::Ordering::Less;
                        match op {
                            Cmp::Eq => self.konst(false),
                            Cmp::Gt | Cmp::Gte => self.f64_range(ci, kf, !kf_above, f64::INFINITY, false),
                            Cmp::Lt | Cmp::Lte => self.f64_range(ci, f64::NEG_INFINITY, false, kf, kf_above),
                            Cmp::Ne => unreachable!("ne is not eq"),
                        }
                    }
                }
            }
            (FieldType::Bool, Value::Bool(k)) => {
                let mut set = 0u32;
                for (cellv, b) in [(1u32, false), (2, true)] {
                    if ord_ok(op, b.cmp(k)) {
                        set |= 1 << cellv;
                    }
                }
                self.push(P_BOOL_SET, ci, set, 0);
            }
            _ => self.konst(false),
        }
        Some(())
    }

    fn f64_cmp(&mut self, ci: u32, op: Cmp, k: f64) {
        let (ninf, inf) = (f64::NEG_INFINITY, f64::INFINITY);
        match op {
            Cmp::Eq => self.f64_range(ci, k, false, k, false),
            Cmp::Gt => self.f64_range(ci, k, true, inf, false),
            Cmp::Gte => self.f64_range(ci, k, false, inf, false),
            Cmp::Lt => self.f64_range(ci, ninf, false, k, true),
            Cmp::Lte => self.f64_range(ci, ninf, false, k, false),
            Cmp::Ne => unreachable!("ne is not eq"),
        }
    }

    fn expr(&mut self, e: &Expr) -> Option<()> {
        match e {
            Expr::And(v) | Expr::Or(v) => {
                let op = if matches!(e, Expr::And(_)) { P_AND } else { P_OR };
                self.expr(&v[0])?;
                for x in &v[1..] {
                    self.expr(x)?;
                    self.push(op, 0, 0, 0);
                }
            }
            Expr::Not(x) => {
                self.expr(x)?;
                self.push(P_NOT, 0, 0, 0);
            }
            Expr::Cmp(Cmp::Ne, f, v) => {
                self.cmp(Cmp::Eq, f, v)?;
                self.push(P_NOT, 0, 0, 0);
            }
            Expr::Cmp(op, f, v) => self.cmp(*op, f, v)?,
            Expr::Contains(f, v) => self.cmp(Cmp::Eq, f, v)?,
            Expr::In(neg, f, vs) => {
                let col = self.col(f);
                if col.is_some_and(|(_, c)| c.ty == FieldType::Tags) {
                    return None;
                }
                if let Some((ci, _)) = col.filter(|(_, c)| c.ty == FieldType::Keyword) {
                    let codes = vs
                        .iter()
                        .filter_map(|v| match v {
                            Value::Keyword(s) => self.cols.code_of(s).map(|c| c as u64),
                            _ => None,
                        })
                        .collect();
                    self.code_in(ci, codes);
                } else if vs.is_empty() {
                    self.konst(false);
                } else {
                    for v in vs {
                        self.cmp(Cmp::Eq, f, v)?;
                    }
                    self.fold(P_OR, vs.len());
                }
                if *neg {
                    self.push(P_NOT, 0, 0, 0);
                }
            }
            Expr::Exists(f) => match self.col(f) {
                None => self.konst(false),
                Some((_, c)) if c.ty == FieldType::Tags => return None,
                Some((ci, _)) => self.push(P_EXISTS, ci, 0, 0),
            },
        }
        Some(())
    }
}

/// Lowers `e` over the columns `cols` into a cell program, or `None` when it reads a tags field
/// (or needs a deeper stack than [`PROGRAM_STACK`]).
pub fn compile(e: &Expr, cols: &Columns) -> Option<Program> {
    let mut b = Builder { cols, p: Program::default(), depth: 0, max_depth: 0 };
    b.expr(e)?;
    debug_assert_eq!(b.depth, 1);
    (b.max_depth <= PROGRAM_STACK).then_some(b.p)
}

impl Program {
    /// Whether row `r` matches, reading cells with `cell_of(col, r)` (the device's algorithm).
    pub fn matches(&self, cell_of: impl Fn(u32) -> (u64, bool)) -> bool {
        let mut st: u64 = 0;
        let mut sp = 0u32;
        for i in &self.ins {
            let v = match i.op {
                P_NOT => {
                    st ^= 1 << (sp - 1);
                    continue;
                }
                P_AND | P_OR => {
                    let x = st >> (sp - 1) & 1;
                    let y = st >> (sp - 2) & 1;
                    sp -= 2;
                    st &= !(3u64 << sp);
                    if i.op == P_AND {
                        x & y
                    } else {
                        x | y
                    }
                }
                P_FALSE => 0,
                P_TRUE => 1,
                op => {
                    let (v, has) = cell_of(i.col);
                    let c = &self.consts;
                    let a = i.a as usize;
                    (has && match op {
                        P_EXISTS => true,
                        P_CODE_IN => c[a..a + i.b as usize].binary_search(&v).is_ok(),
                        P_I64_RANGE => (c[a] as i64) <= v as i64 && v as i64 <= c[a + 1] as i64,
                        P_F64_RANGE => {
                            let (x, lo, hi) = (f64::from_bits(v), f64::from_bits(c[a]), f64::from_bits(c[a + 1]));
                            (if i.b & 1 != 0 { x > lo } else { x >= lo }) && (if i.b & 2 != 0 { x < hi } else { x <= hi })
                        }
                        P_BOOL_SET => i.a >> v & 1 != 0,
                        _ => false,
                    }) as u64
                }
            };
            st |= v << sp;
            sp += 1;
        }
        st & 1 != 0
    }

    /// The rows of a table of `len` rows that match (the CPU form of the device's evaluation).
    pub fn eval(&self, cols: &Columns, len: usize) -> super::Bitmap {
        let cs = cols.columns();
        super::Bitmap::from_fn(len, |r| self.matches(|c| cell(&cs[c as usize].data, r).unwrap_or((0, false))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::Field;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const WORDS: [&str; 6] = ["", "a", "ab", "b", "zz", "\u{e9}"];
    const INTS: [i64; 10] = [i64::MIN, -(1 << 53) - 1, -3, -1, 0, 2, 3, (1 << 53) + 1, i64::MAX - 1, i64::MAX];
    const FLOATS: [f64; 11] = [-1e300, -9.3e18, -2.5, -0.0, 0.0, 2.0, 2.5, 3.0, 9_007_199_254_740_992.0, 9.3e18, 1e300];

    fn value(r: &mut StdRng) -> Value {
        match r.random_range(0..5) {
            0 => Value::Keyword(WORDS[r.random_range(0..WORDS.len())].into()),
            1 => Value::Int(INTS[r.random_range(0..INTS.len())]),
            2 => Value::Float(FLOATS[r.random_range(0..FLOATS.len())]),
            3 => Value::Bool(r.random()),
            _ => Value::Timestamp(INTS[r.random_range(0..INTS.len())]),
        }
    }

    fn leaf(r: &mut StdRng) -> Expr {
        const NAMES: [&str; 6] = ["kw", "i", "f", "b", "ts", "nope"];
        let f = NAMES[r.random_range(0..NAMES.len())].to_string();
        match r.random_range(0..8) {
            0..=4 => {
                let op = [Cmp::Eq, Cmp::Ne, Cmp::Gt, Cmp::Gte, Cmp::Lt, Cmp::Lte][r.random_range(0..6)];
                Expr::Cmp(op, f, value(r))
            }
            5 => Expr::In(r.random(), f, (0..r.random_range(1..8)).map(|_| value(r)).collect()),
            6 => Expr::Exists(f),
            _ => Expr::Contains(f, value(r)),
        }
    }

    fn expr(r: &mut StdRng, depth: usize) -> Expr {
        if depth == 0 || r.random_range(0..3) == 0 {
            return leaf(r);
        }
        match r.random_range(0..3) {
            0 => Expr::And((0..r.random_range(1..4)).map(|_| expr(r, depth - 1)).collect()),
            1 => Expr::Or((0..r.random_range(1..4)).map(|_| expr(r, depth - 1)).collect()),
            _ => Expr::Not(Box::new(expr(r, depth - 1))),
        }
    }

    /// The program agrees with the reference evaluator row for row, on columns full of edge
    /// values (ints beyond 2^53, floats beyond the int64 range, -0.0, keywords in byte order).
    #[test]
    fn programs_match_the_reference_evaluator() {
        let mut r = StdRng::seed_from_u64(0x6b616c6f73);
        let mut cols = Columns::default();
        let n = 300;
        for row in 0..n {
            cols.push_row();
            let mut f = Vec::new();
            if r.random_bool(0.8) {
                f.push(Field::new("kw", Value::Keyword(WORDS[r.random_range(0..WORDS.len())].into())));
            }
            if r.random_bool(0.8) {
                f.push(Field::new("i", Value::Int(INTS[r.random_range(0..INTS.len())])));
            }
            if r.random_bool(0.8) {
                f.push(Field::new("f", Value::Float(FLOATS[r.random_range(0..FLOATS.len())])));
            }
            if r.random_bool(0.8) {
                f.push(Field::new("b", Value::Bool(r.random())));
            }
            if r.random_bool(0.8) {
                f.push(Field::new("ts", Value::Timestamp(INTS[r.random_range(0..INTS.len())])));
            }
            cols.check(std::iter::once((row as u64, f.as_slice()))).unwrap();
            cols.set_row(row, &f);
        }
        let mut checked = 0;
        for _ in 0..3000 {
            let e = expr(&mut r, 4);
            let p = compile(&e, &cols).expect("no tags field: always compiles");
            let want = super::super::eval(&e, &cols, n);
            let got = p.eval(&cols, n);
            assert_eq!(got, want, "expression {e:?}\nprogram {p:?}");
            checked += 1;
        }
        assert_eq!(checked, 3000);
    }

    #[test]
    fn a_tags_field_is_left_to_the_reference_evaluator() {
        let mut cols = Columns::default();
        cols.push_row();
        let f = [Field::new("t", Value::Tags(vec!["x".into()])), Field::new("n", Value::Int(1))];
        cols.check(std::iter::once((1, &f[..]))).unwrap();
        cols.set_row(0, &f);
        assert!(compile(&Expr::Contains("t".into(), Value::Keyword("x".into())), &cols).is_none());
        assert!(compile(&Expr::Not(Box::new(Expr::Exists("t".into()))), &cols).is_none());
        let p = compile(&Expr::eq("n", Value::Int(1)), &cols).unwrap();
        assert_eq!(p.eval(&cols, 1).count(), 1);
    }
}
