//! Typed metadata fields of memories: values, their binary encoding (shared by the C ABI, the
//! slot protocol, the write-ahead log and snapshots; docs/FORMATS.md, "Metadata fields") and the
//! columnar storage the engines read ([`Columns`]).
//!
//! # Typed on first write
//! A store has no declared schema: a field gets its type from the first write that sets it, and
//! every later write must give that field a value of the same type (or one that converts without
//! loss of meaning: an int for a float field, an int for a timestamp field and back, one keyword
//! for a tags field). A write that gives a field another type is refused with
//! `INVALID_ARGUMENT` naming the field, the id and both types; nothing of that write is applied.
//! Why not a schema declared at open: the integrations (LangChain, LlamaIndex, mem0) hand Kalos
//! whatever metadata dict the application has, and a schema would have to be declared by every
//! client process that may create the store. The cost: a typo or a stray type in the first write
//! fixes a field's type for the life of the store (until `clear`), and a field's type is known
//! only once some memory has set it (a filter on a field no memory has set matches nothing).
//!
//! # Columns
//! One column per field, parallel to the store's other columns (row `r` of every column is the
//! same memory): keyword values as `u32` codes into one dictionary shared by every field (0 =
//! absent), tags as a list of codes per row (empty = absent), int64 / timestamp as `i64` and
//! float64 as `f64` with a presence bit, bool as a byte (0 absent, 1 false, 2 true). The
//! dictionary only grows while the server runs (a string stays interned after the last memory
//! that used it is gone); a restart rebuilds it from the live rows.
//!
//! [`Columns`]: crate::meta::Columns

use std::collections::HashMap;

use crate::error::{Error, Result, Status};

/// Most fields one memory may carry.
/// cbindgen:ignore
pub const MAX_ITEM_FIELDS: usize = 64;
/// Most distinct fields one store may have.
/// cbindgen:ignore
pub const MAX_STORE_FIELDS: usize = 256;
/// Longest field name, in bytes (UTF-8, at least 1).
/// cbindgen:ignore
pub const MAX_FIELD_NAME: usize = 64;
/// Longest keyword (or tag), in bytes (UTF-8).
/// cbindgen:ignore
pub const MAX_KEYWORD: usize = 1024;
/// Most tags in one value.
/// cbindgen:ignore
pub const MAX_TAGS: usize = 256;
/// Most bytes the encoded fields of one memory may take (`count u16 | (name, value)*`).
/// cbindgen:ignore
pub const MAX_ITEM_FIELD_BYTES: usize = 16384;
/// Version byte that starts a fields block.
/// cbindgen:ignore
pub const FIELDS_VERSION: u8 = 1;

/// The type of a field (fixed by the first write that sets it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldType {
    Keyword = 1,
    Tags = 2,
    Int = 3,
    Float = 4,
    Bool = 5,
    Timestamp = 6,
}

impl FieldType {
    pub fn from_u8(t: u8) -> Option<FieldType> {
        Some(match t {
            1 => FieldType::Keyword,
            2 => FieldType::Tags,
            3 => FieldType::Int,
            4 => FieldType::Float,
            5 => FieldType::Bool,
            6 => FieldType::Timestamp,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            FieldType::Keyword => "keyword",
            FieldType::Tags => "tags",
            FieldType::Int => "int64",
            FieldType::Float => "float64",
            FieldType::Bool => "bool",
            FieldType::Timestamp => "timestamp",
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Keyword(String),
    Tags(Vec<String>),
    Int(i64),
    /// Finite.
    Float(f64),
    Bool(bool),
    /// Unix milliseconds.
    Timestamp(i64),
}

impl Value {
    pub fn field_type(&self) -> FieldType {
        match self {
            Value::Keyword(_) => FieldType::Keyword,
            Value::Tags(_) => FieldType::Tags,
            Value::Int(_) => FieldType::Int,
            Value::Float(_) => FieldType::Float,
            Value::Bool(_) => FieldType::Bool,
            Value::Timestamp(_) => FieldType::Timestamp,
        }
    }
}

/// One named value of a memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    pub value: Value,
}

impl Field {
    pub fn new(name: &str, value: Value) -> Field {
        Field { name: name.to_string(), value }
    }
}

fn bad(msg: impl Into<String>) -> Error {
    Error::new(Status::InvalidArgument, msg.into())
}

/// A bounds-checked little-endian reader over untrusted bytes.
pub struct Cursor<'a> {
    pub(crate) b: &'a [u8],
    pub(crate) o: usize,
    /// Names the input in errors ("fields", "filter").
    pub(crate) what: &'static str,
}

impl<'a> Cursor<'a> {
    pub fn new(b: &'a [u8], what: &'static str) -> Cursor<'a> {
        Cursor { b, o: 0, what }
    }
    pub(crate) fn take(&mut self, n: usize, item: &str) -> Result<&'a [u8]> {
        if self.b.len() - self.o < n {
            return Err(bad(format!("{}: truncated at byte {} (reading {item})", self.what, self.o)));
        }
        let s = &self.b[self.o..self.o + n];
        self.o += n;
        Ok(s)
    }
    pub(crate) fn u8(&mut self, item: &str) -> Result<u8> {
        Ok(self.take(1, item)?[0])
    }
    pub(crate) fn u16(&mut self, item: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, item)?.try_into().unwrap()))
    }
    pub(crate) fn u32(&mut self, item: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, item)?.try_into().unwrap()))
    }
    pub(crate) fn i64(&mut self, item: &str) -> Result<i64> {
        Ok(i64::from_le_bytes(self.take(8, item)?.try_into().unwrap()))
    }
    pub(crate) fn remaining(&self) -> usize {
        self.b.len() - self.o
    }
    /// A `len u8 | bytes` field name: 1 to MAX_FIELD_NAME bytes of UTF-8.
    pub(crate) fn name(&mut self) -> Result<String> {
        let at = self.o;
        let n = self.u8("field name length")? as usize;
        if n == 0 || n > MAX_FIELD_NAME {
            return Err(bad(format!("{}: field name at byte {at} has {n} bytes (1 to {MAX_FIELD_NAME})", self.what)));
        }
        let s = self.take(n, "field name")?;
        String::from_utf8(s.to_vec()).map_err(|_| bad(format!("{}: field name at byte {at} is not UTF-8", self.what)))
    }
    fn string(&mut self, item: &str) -> Result<String> {
        let at = self.o;
        let n = self.u16(item)? as usize;
        if n > MAX_KEYWORD {
            return Err(bad(format!("{}: {item} at byte {at} has {n} bytes (at most {MAX_KEYWORD})", self.what)));
        }
        let s = self.take(n, item)?;
        String::from_utf8(s.to_vec()).map_err(|_| bad(format!("{}: {item} at byte {at} is not UTF-8", self.what)))
    }
    /// A `type u8 | value` (docs/FORMATS.md). `tags_ok`: whether a tags value is allowed here.
    pub(crate) fn value(&mut self, tags_ok: bool) -> Result<Value> {
        let at = self.o;
        let t = self.u8("value type")?;
        Ok(match FieldType::from_u8(t) {
            Some(FieldType::Keyword) => Value::Keyword(self.string("keyword")?),
            Some(FieldType::Tags) if tags_ok => {
                let n = self.u16("tag count")? as usize;
                if n > MAX_TAGS {
                    return Err(bad(format!("{}: {n} tags at byte {at} (at most {MAX_TAGS})", self.what)));
                }
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string("tag")?);
                }
                Value::Tags(v)
            }
            Some(FieldType::Int) => Value::Int(self.i64("int64")?),
            Some(FieldType::Float) => {
                let f = f64::from_bits(self.i64("float64")? as u64);
                if !f.is_finite() {
                    return Err(bad(format!("{}: float64 at byte {at} is not finite", self.what)));
                }
                Value::Float(f)
            }
            Some(FieldType::Bool) => match self.u8("bool")? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(bad(format!("{}: bool at byte {at} is {b} (0 or 1)", self.what))),
            },
            Some(FieldType::Timestamp) => Value::Timestamp(self.i64("timestamp")?),
            _ => return Err(bad(format!("{}: unknown value type {t} at byte {at}", self.what))),
        })
    }
}

pub(crate) fn put_name(b: &mut Vec<u8>, name: &str) {
    b.push(name.len() as u8);
    b.extend_from_slice(name.as_bytes());
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u16).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// Appends `type u8 | value`.
pub(crate) fn put_value(b: &mut Vec<u8>, v: &Value) {
    b.push(v.field_type() as u8);
    match v {
        Value::Keyword(s) => put_str(b, s),
        Value::Tags(t) => {
            b.extend_from_slice(&(t.len() as u16).to_le_bytes());
            for s in t {
                put_str(b, s);
            }
        }
        Value::Int(i) | Value::Timestamp(i) => b.extend_from_slice(&i.to_le_bytes()),
        Value::Float(f) => b.extend_from_slice(&f.to_le_bytes()),
        Value::Bool(x) => b.push(*x as u8),
    }
}

/// Checks one memory's fields against the limits a decoder enforces (names, lengths, counts,
/// finiteness, no name twice), so that what is encoded always decodes.
pub fn check_item_fields(fields: &[Field], id: u64) -> Result<()> {
    if fields.len() > MAX_ITEM_FIELDS {
        return Err(bad(format!("id {id} has {} fields (at most {MAX_ITEM_FIELDS})", fields.len())));
    }
    for (i, f) in fields.iter().enumerate() {
        if f.name.is_empty() || f.name.len() > MAX_FIELD_NAME {
            return Err(bad(format!("id {id}: field name {:?} has {} bytes (1 to {MAX_FIELD_NAME})", f.name, f.name.len())));
        }
        if fields[..i].iter().any(|g| g.name == f.name) {
            return Err(bad(format!("id {id}: field {:?} is given twice", f.name)));
        }
        match &f.value {
            Value::Keyword(s) if s.len() > MAX_KEYWORD => {
                return Err(bad(format!("id {id}: field {:?} has a keyword of {} bytes (at most {MAX_KEYWORD})", f.name, s.len())))
            }
            Value::Tags(t) => {
                if t.len() > MAX_TAGS {
                    return Err(bad(format!("id {id}: field {:?} has {} tags (at most {MAX_TAGS})", f.name, t.len())));
                }
                if let Some(s) = t.iter().find(|s| s.len() > MAX_KEYWORD) {
                    return Err(bad(format!("id {id}: field {:?} has a tag of {} bytes (at most {MAX_KEYWORD})", f.name, s.len())));
                }
            }
            Value::Float(x) if !x.is_finite() => return Err(bad(format!("id {id}: field {:?} is not finite", f.name))),
            _ => {}
        }
    }
    let mut b = Vec::new();
    encode_item(&mut b, fields);
    if b.len() > MAX_ITEM_FIELD_BYTES {
        return Err(bad(format!("id {id}: its fields take {} bytes encoded (at most {MAX_ITEM_FIELD_BYTES})", b.len())));
    }
    Ok(())
}

/// Appends one memory's fields: `count u16 | (name, value)*`.
pub fn encode_item(b: &mut Vec<u8>, fields: &[Field]) {
    b.extend_from_slice(&(fields.len() as u16).to_le_bytes());
    for f in fields {
        put_name(b, &f.name);
        put_value(b, &f.value);
    }
}

/// Reads one memory's fields (`count u16 | (name, value)*`), checked as [`check_item_fields`].
pub fn decode_item(c: &mut Cursor<'_>) -> Result<Vec<Field>> {
    let at = c.o;
    let n = c.u16("field count")? as usize;
    if n > MAX_ITEM_FIELDS {
        return Err(bad(format!("{}: {n} fields at byte {at} (at most {MAX_ITEM_FIELDS} per memory)", c.what)));
    }
    let mut v: Vec<Field> = Vec::with_capacity(n);
    for _ in 0..n {
        let name = c.name()?;
        if v.iter().any(|f| f.name == name) {
            return Err(bad(format!("{}: field {name:?} given twice in one memory (at byte {at})", c.what)));
        }
        let value = c.value(true)?;
        v.push(Field { name, value });
    }
    if c.o - at > MAX_ITEM_FIELD_BYTES {
        return Err(bad(format!("{}: one memory's fields take {} bytes at byte {at} (at most {MAX_ITEM_FIELD_BYTES})", c.what, c.o - at)));
    }
    Ok(v)
}

/// Encodes the fields of `items.len()` memories as a fields block: `version u8 (1) | count u32 |
/// item*` (the form of `kalos_upsert_params.fields`).
pub fn encode_fields_block(items: &[&[Field]]) -> Vec<u8> {
    let mut b = vec![FIELDS_VERSION];
    b.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for f in items {
        encode_item(&mut b, f);
    }
    b
}

/// Decodes a fields block of exactly `n` memories; the whole block must be used.
pub fn decode_fields_block(b: &[u8], n: usize) -> Result<Vec<Vec<Field>>> {
    let mut c = Cursor::new(b, "fields");
    let v = c.u8("version")?;
    if v != FIELDS_VERSION {
        return Err(bad(format!("fields: version {v}; this build reads version {FIELDS_VERSION}")));
    }
    let count = c.u32("count")? as usize;
    if count != n {
        return Err(bad(format!("fields: the block describes {count} memories; the call has {n}")));
    }
    let mut out = Vec::with_capacity(n.min(b.len()));
    for _ in 0..n {
        out.push(decode_item(&mut c)?);
    }
    if c.remaining() != 0 {
        return Err(bad(format!("fields: {} trailing bytes after {n} memories", c.remaining())));
    }
    Ok(out)
}

/// `v` converted for a field of type `t`, or None when it cannot be stored there.
fn coerce(t: FieldType, v: &Value) -> Option<Value> {
    Some(match (t, v) {
        (a, b) if a == b.field_type() => v.clone(),
        (FieldType::Float, Value::Int(i)) => Value::Float(*i as f64),
        (FieldType::Timestamp, Value::Int(i)) => Value::Timestamp(*i),
        (FieldType::Int, Value::Timestamp(i)) => Value::Int(*i),
        (FieldType::Tags, Value::Keyword(s)) => Value::Tags(vec![s.clone()]),
        _ => return None,
    })
}

/// One field's values, one per row.
#[derive(Debug, Clone)]
pub enum ColumnData {
    /// Keyword codes (0 = absent).
    Code(Vec<u32>),
    /// Sorted, deduplicated tag codes per row (empty = absent).
    Tags(Vec<Box<[u32]>>),
    /// Int64 and timestamp values; `has[r]` says whether row r has one.
    I64 {
        v: Vec<i64>,
        has: Vec<bool>,
    },
    F64 {
        v: Vec<f64>,
        has: Vec<bool>,
    },
    /// 0 absent, 1 false, 2 true.
    Bool(Vec<u8>),
}

impl ColumnData {
    fn new(t: FieldType, len: usize) -> ColumnData {
        match t {
            FieldType::Keyword => ColumnData::Code(vec![0; len]),
            FieldType::Tags => ColumnData::Tags(vec![Box::default(); len]),
            FieldType::Int | FieldType::Timestamp => ColumnData::I64 { v: vec![0; len], has: vec![false; len] },
            FieldType::Float => ColumnData::F64 { v: vec![0.0; len], has: vec![false; len] },
            FieldType::Bool => ColumnData::Bool(vec![0; len]),
        }
    }
    fn push_absent(&mut self) {
        match self {
            ColumnData::Code(v) => v.push(0),
            ColumnData::Tags(v) => v.push(Box::default()),
            ColumnData::I64 { v, has } => {
                v.push(0);
                has.push(false)
            }
            ColumnData::F64 { v, has } => {
                v.push(0.0);
                has.push(false)
            }
            ColumnData::Bool(v) => v.push(0),
        }
    }
    fn clear_row(&mut self, r: usize) {
        match self {
            ColumnData::Code(v) => v[r] = 0,
            ColumnData::Tags(v) => v[r] = Box::default(),
            ColumnData::I64 { has, .. } | ColumnData::F64 { has, .. } => has[r] = false,
            ColumnData::Bool(v) => v[r] = 0,
        }
    }
    fn move_row(&mut self, from: usize, to: usize) {
        match self {
            ColumnData::Code(v) => v[to] = v[from],
            ColumnData::Tags(v) => v.swap(to, from),
            ColumnData::I64 { v, has } => {
                v[to] = v[from];
                has[to] = has[from];
            }
            ColumnData::F64 { v, has } => {
                v[to] = v[from];
                has[to] = has[from];
            }
            ColumnData::Bool(v) => v[to] = v[from],
        }
    }
    fn truncate(&mut self, n: usize) {
        match self {
            ColumnData::Code(v) => v.truncate(n),
            ColumnData::Tags(v) => v.truncate(n),
            ColumnData::I64 { v, has } => {
                v.truncate(n);
                has.truncate(n)
            }
            ColumnData::F64 { v, has } => {
                v.truncate(n);
                has.truncate(n)
            }
            ColumnData::Bool(v) => v.truncate(n),
        }
    }
    fn reserve(&mut self, n: usize) {
        match self {
            ColumnData::Code(v) => v.reserve(n),
            ColumnData::Tags(v) => v.reserve(n),
            ColumnData::I64 { v, has } => {
                v.reserve(n);
                has.reserve(n)
            }
            ColumnData::F64 { v, has } => {
                v.reserve(n);
                has.reserve(n)
            }
            ColumnData::Bool(v) => v.reserve(n),
        }
    }
}

/// A field's column.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub ty: FieldType,
    pub data: ColumnData,
}

/// Every field column of a store, and the keyword dictionary.
#[derive(Debug, Clone, Default)]
pub struct Columns {
    cols: Vec<Column>,
    by_name: HashMap<String, usize>,
    /// Code c ≥ 1 is `strings[c - 1]`.
    strings: Vec<Box<str>>,
    codes: HashMap<Box<str>, u32>,
    len: usize,
}

impl Columns {
    pub fn columns(&self) -> &[Column] {
        &self.cols
    }
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.by_name.get(name).map(|&i| &self.cols[i])
    }
    /// The index of a field's column in [`Columns::columns`] (None: no memory has the field).
    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
    /// The code of an interned string (None: no memory has ever stored it).
    pub fn code_of(&self, s: &str) -> Option<u32> {
        self.codes.get(s).copied()
    }
    /// Number of interned strings (codes 1 ..= this).
    pub fn string_count(&self) -> usize {
        self.strings.len()
    }
    /// The string of code `c` ≥ 1.
    pub fn string(&self, c: u32) -> &str {
        &self.strings[c as usize - 1]
    }
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&c) = self.codes.get(s) {
            return c;
        }
        self.strings.push(s.into());
        let c = self.strings.len() as u32;
        self.codes.insert(s.into(), c);
        c
    }

    /// Checks the fields of a batch of writes against the field types (and against the types
    /// the batch itself fixes for new fields, in order) and the field count limit.
    pub fn check<'a>(&self, items: impl Iterator<Item = (u64, &'a [Field])>) -> Result<()> {
        let mut fresh: HashMap<&str, FieldType> = HashMap::new();
        for (id, fields) in items {
            check_item_fields(fields, id)?;
            for f in fields {
                let t = match self.by_name.get(f.name.as_str()) {
                    Some(&i) => self.cols[i].ty,
                    None => *fresh.entry(f.name.as_str()).or_insert_with(|| f.value.field_type()),
                };
                if coerce(t, &f.value).is_none() {
                    return Err(bad(format!(
                        "field {:?} of id {id} is {}; the store's field {:?} has type {} (fields are typed by their first write)",
                        f.name,
                        f.value.field_type().name(),
                        f.name,
                        t.name()
                    )));
                }
            }
        }
        if self.cols.len() + fresh.len() > MAX_STORE_FIELDS {
            return Err(bad(format!(
                "the store has {} fields and this write adds {}; at most {MAX_STORE_FIELDS}",
                self.cols.len(),
                fresh.len()
            )));
        }
        Ok(())
    }

    /// Appends an empty row (no field set).
    pub(crate) fn push_row(&mut self) {
        for c in &mut self.cols {
            c.data.push_absent();
        }
        self.len += 1;
    }

    pub(crate) fn reserve(&mut self, n: usize) {
        for c in &mut self.cols {
            c.data.reserve(n);
        }
    }

    /// Replaces every field of row `r` by `fields` (checked by [`Columns::check`]; a value that
    /// does not fit its field's type is skipped).
    pub(crate) fn set_row(&mut self, r: usize, fields: &[Field]) {
        for c in &mut self.cols {
            c.data.clear_row(r);
        }
        for f in fields {
            let i = match self.by_name.get(f.name.as_str()) {
                Some(&i) => i,
                None => {
                    self.cols.push(Column {
                        name: f.name.clone(),
                        ty: f.value.field_type(),
                        data: ColumnData::new(f.value.field_type(), self.len),
                    });
                    self.by_name.insert(f.name.clone(), self.cols.len() - 1);
                    self.cols.len() - 1
                }
            };
            let Some(v) = coerce(self.cols[i].ty, &f.value) else {
                debug_assert!(false, "unchecked field type");
                continue;
            };
            let tags: Option<Box<[u32]>> = match &v {
                Value::Tags(t) => {
                    let mut codes: Vec<u32> = t.iter().map(|s| self.intern(s)).collect();
                    codes.sort_unstable();
                    codes.dedup();
                    Some(codes.into_boxed_slice())
                }
                _ => None,
            };
            let code = match &v {
                Value::Keyword(s) => self.intern(s),
                _ => 0,
            };
            match (&mut self.cols[i].data, v) {
                (ColumnData::Code(col), _) => col[r] = code,
                (ColumnData::Tags(col), _) => col[r] = tags.unwrap_or_default(),
                (ColumnData::I64 { v, has }, Value::Int(x) | Value::Timestamp(x)) => {
                    v[r] = x;
                    has[r] = true;
                }
                (ColumnData::F64 { v, has }, Value::Float(x)) => {
                    v[r] = x;
                    has[r] = true;
                }
                (ColumnData::Bool(col), Value::Bool(x)) => col[r] = 1 + x as u8,
                _ => debug_assert!(false, "coerce gave a value of another type"),
            }
        }
    }

    /// Moves row `last` into row `r` and drops the last row (the store's delete).
    pub(crate) fn swap_remove(&mut self, r: usize, last: usize) {
        for c in &mut self.cols {
            if r != last {
                c.data.move_row(last, r);
            }
            c.data.truncate(last);
        }
        self.len = last;
    }

    /// The fields of row `r`, in column order.
    pub fn row(&self, r: usize) -> Vec<Field> {
        let mut out = Vec::new();
        for c in &self.cols {
            let v = match &c.data {
                ColumnData::Code(v) if v[r] != 0 => Value::Keyword(self.string(v[r]).to_string()),
                ColumnData::Tags(v) if !v[r].is_empty() => {
                    // A set: read back sorted, without duplicates.
                    let mut t: Vec<String> = v[r].iter().map(|&t| self.string(t).to_string()).collect();
                    t.sort_unstable();
                    Value::Tags(t)
                }
                ColumnData::I64 { v, has } if has[r] => {
                    if c.ty == FieldType::Timestamp {
                        Value::Timestamp(v[r])
                    } else {
                        Value::Int(v[r])
                    }
                }
                ColumnData::F64 { v, has } if has[r] => Value::Float(v[r]),
                ColumnData::Bool(v) if v[r] != 0 => Value::Bool(v[r] == 2),
                _ => continue,
            };
            out.push(Field { name: c.name.clone(), value: v });
        }
        out
    }

    /// Whether row `r` has any field.
    pub fn row_has_fields(&self, r: usize) -> bool {
        self.cols.iter().any(|c| match &c.data {
            ColumnData::Code(v) => v[r] != 0,
            ColumnData::Tags(v) => !v[r].is_empty(),
            ColumnData::I64 { has, .. } | ColumnData::F64 { has, .. } => has[r],
            ColumnData::Bool(v) => v[r] != 0,
        })
    }

    /// Drops every column and the dictionary (the store is empty).
    pub(crate) fn reset(&mut self) {
        *self = Columns::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_block_round_trips_and_rejects_damage() {
        let a = vec![
            Field::new("user", Value::Keyword("ann".into())),
            Field::new("tags", Value::Tags(vec!["x".into(), "y".into()])),
            Field::new("n", Value::Int(-3)),
            Field::new("f", Value::Float(2.5)),
            Field::new("b", Value::Bool(true)),
            Field::new("t", Value::Timestamp(1_700_000_000_000)),
        ];
        let b: Vec<Field> = vec![];
        let blk = encode_fields_block(&[&a, &b]);
        assert_eq!(decode_fields_block(&blk, 2).unwrap(), vec![a.clone(), b]);
        assert_eq!(decode_fields_block(&blk, 3).unwrap_err().status, Status::InvalidArgument);
        for cut in 0..blk.len() {
            assert_eq!(decode_fields_block(&blk[..cut], 2).unwrap_err().status, Status::InvalidArgument, "cut {cut}");
        }
        let mut extra = blk.clone();
        extra.push(0);
        assert!(decode_fields_block(&extra, 2).unwrap_err().message.contains("trailing"));
        let dup = encode_fields_block(&[&[Field::new("a", Value::Int(1)), Field::new("a", Value::Int(2))]]);
        assert!(decode_fields_block(&dup, 1).unwrap_err().message.contains("twice"));
        let nan = encode_fields_block(&[&[Field::new("a", Value::Float(f64::NAN))]]);
        assert!(decode_fields_block(&nan, 1).unwrap_err().message.contains("finite"));
    }

    #[test]
    fn first_write_types_a_field() {
        let mut c = Columns::default();
        let one = [Field::new("n", Value::Int(1))];
        c.check([(1u64, &one[..])].into_iter()).unwrap();
        c.push_row();
        c.set_row(0, &one);
        let s = [Field::new("n", Value::Keyword("x".into()))];
        let e = c.check([(2u64, &s[..])].into_iter()).unwrap_err();
        assert!(e.message.contains("\"n\"") && e.message.contains("id 2") && e.message.contains("int64"), "{}", e.message);
        // Within one batch, the first item types a new field.
        let f1 = [Field::new("m", Value::Float(1.0))];
        let f2 = [Field::new("m", Value::Bool(true))];
        assert!(c.check([(3u64, &f1[..]), (4u64, &f2[..])].into_iter()).is_err());
        // An int is stored in a float field as a float.
        let f3 = [Field::new("m", Value::Int(2))];
        c.check([(3u64, &f1[..]), (4u64, &f3[..])].into_iter()).unwrap();
        c.push_row();
        c.set_row(0, &f1);
        c.set_row(1, &f3);
        assert_eq!(c.row(1), vec![Field::new("m", Value::Float(2.0))]);
        assert_eq!(c.row(0), vec![Field::new("m", Value::Float(1.0))], "set_row replaces every field");
        c.swap_remove(0, 1);
        assert_eq!(c.row(0), vec![Field::new("m", Value::Float(2.0))]);
    }
}
