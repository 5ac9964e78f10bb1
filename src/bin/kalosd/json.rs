//! The JSON forms of metadata fields and filter expressions (docs/FORMATS.md, "Filter
//! expressions", "The JSON form"), as `kalosd query`, `import` and `export` read and write them.
//!
//! A filter translates to the binary expression the Python builder `kalos.filters.from_dict`
//! gives for the same JSON, byte for byte (tests/data/filter_vectors.jsonl checks it).

use kalos::filter::{Cmp, Expr};
use kalos::meta::{Field, Value};
use serde_json::Value as J;

/// A JSON filter as an expression, or a message naming what is wrong and where.
pub fn filter(j: &J) -> Result<Expr, String> {
    let J::Object(m) = j else { return Err(format!("a filter must be a JSON object, got {j}")) };
    let mut parts = Vec::new();
    for (k, v) in m {
        match k.as_str() {
            "$and" | "$or" => {
                let subs = match v {
                    J::Array(a) if !a.is_empty() => a.iter().map(filter).collect::<Result<Vec<_>, _>>()?,
                    _ => return Err(format!("{k} takes a non-empty list of filters, got {v}")),
                };
                parts.push(if k == "$and" { and(subs) } else { or(subs) });
            }
            "$not" => parts.push(Expr::Not(Box::new(filter(v)?))),
            _ if k.starts_with('$') => return Err(format!("unknown filter operator {k:?}")),
            _ => parts.push(field_cond(k, v)?),
        }
    }
    if parts.is_empty() {
        return Err("an empty filter object".into());
    }
    Ok(and(parts))
}

fn field_cond(field: &str, cond: &J) -> Result<Expr, String> {
    check_name(field)?;
    match cond {
        J::Object(m) if !is_date(cond) => {
            let mut parts = Vec::new();
            for (op, v) in m {
                let cmp = |c: Cmp| -> Result<Expr, String> { Ok(Expr::Cmp(c, field.into(), scalar(field, op, v)?)) };
                parts.push(match op.as_str() {
                    "$eq" => cmp(Cmp::Eq)?,
                    "$ne" => cmp(Cmp::Ne)?,
                    "$gt" => cmp(Cmp::Gt)?,
                    "$gte" => cmp(Cmp::Gte)?,
                    "$lt" => cmp(Cmp::Lt)?,
                    "$lte" => cmp(Cmp::Lte)?,
                    "$contains" => Expr::Contains(field.into(), scalar(field, op, v)?),
                    "$in" | "$nin" => {
                        let J::Array(a) = v else { return Err(format!("{op} on field {field:?} takes a list, got {v}")) };
                        let vals = a.iter().map(|x| scalar(field, op, x)).collect::<Result<Vec<_>, _>>()?;
                        in_(op == "$nin", field, vals)
                    }
                    "$exists" => match v {
                        J::Bool(true) => Expr::Exists(field.into()),
                        J::Bool(false) => Expr::Not(Box::new(Expr::Exists(field.into()))),
                        _ => return Err(format!("$exists on field {field:?} takes true or false, got {v}")),
                    },
                    "$not" => Expr::Not(Box::new(field_cond(field, v)?)),
                    _ => return Err(format!("unknown filter operator {op:?} on field {field:?}")),
                });
            }
            if parts.is_empty() {
                return Err(format!("empty condition on field {field:?}"));
            }
            Ok(and(parts))
        }
        J::Array(a) => Ok(in_(false, field, a.iter().map(|x| scalar(field, "$in", x)).collect::<Result<Vec<_>, _>>()?)),
        _ => Ok(Expr::Cmp(Cmp::Eq, field.into(), scalar(field, "$eq", cond)?)),
    }
}

/// `in` with no values matches nothing and `nin` with none everything, as in the Python builder.
fn in_(nin: bool, field: &str, vals: Vec<Value>) -> Expr {
    if !vals.is_empty() {
        return Expr::In(nin, field.into(), vals);
    }
    let exists = || Expr::Exists(field.into());
    let nothing = and(vec![Expr::Not(Box::new(exists())), exists()]);
    if nin {
        Expr::Not(Box::new(nothing))
    } else {
        nothing
    }
}

/// And (`is_and`) or or of `v`, flattening nested nodes of the same kind; one child stands alone.
fn combine(v: Vec<Expr>, is_and: bool) -> Expr {
    let mut flat = Vec::with_capacity(v.len());
    for e in v {
        match e {
            Expr::And(c) if is_and => flat.extend(c),
            Expr::Or(c) if !is_and => flat.extend(c),
            e => flat.push(e),
        }
    }
    match (flat.len(), is_and) {
        (1, _) => flat.pop().expect("one child"),
        (_, true) => Expr::And(flat),
        (_, false) => Expr::Or(flat),
    }
}

fn and(v: Vec<Expr>) -> Expr {
    combine(v, true)
}

fn or(v: Vec<Expr>) -> Expr {
    combine(v, false)
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("field name {name:?} has {} bytes (1 to 64)", name.len()));
    }
    Ok(())
}

fn is_date(j: &J) -> bool {
    matches!(j, J::Object(m) if m.len() == 1 && m.contains_key("$date"))
}

/// One scalar: a string, a number (integers as int64, others as float64), a bool, or
/// `{"$date": unix ms}` for a timestamp.
fn scalar(field: &str, op: &str, v: &J) -> Result<Value, String> {
    let bad = || format!("{op} on field {field:?} takes a string, number, bool or {{\"$date\": ms}}, got {v}");
    Ok(match v {
        J::String(s) => Value::Keyword(s.clone()),
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None if n.is_u64() => return Err(format!("{op} on field {field:?}: {n} does not fit int64")),
            None => Value::Float(n.as_f64().ok_or_else(bad)?),
        },
        J::Object(m) if is_date(v) => Value::Timestamp(m["$date"].as_i64().ok_or_else(bad)?),
        _ => return Err(bad()),
    })
}

/// A memory's fields from a JSON object: scalars as in filters, a list of strings for tags;
/// null values are left out.
pub fn fields(j: &J) -> Result<Vec<Field>, String> {
    let J::Object(m) = j else { return Err(format!("fields must be a JSON object, got {j}")) };
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        check_name(k)?;
        let value = match v {
            J::Null => continue,
            J::Array(a) => Value::Tags(
                a.iter()
                    .map(|t| t.as_str().map(str::to_string).ok_or_else(|| format!("field {k:?}: a tags list holds strings only, got {t}")))
                    .collect::<Result<_, _>>()?,
            ),
            _ => scalar(k, "field", v)?,
        };
        out.push(Field::new(k, value));
    }
    Ok(out)
}

/// A memory's fields as a JSON object (timestamps as `{"$date": ms}`).
pub fn fields_to_json(f: &[Field]) -> J {
    let mut m = serde_json::Map::new();
    for x in f {
        let v = match &x.value {
            Value::Keyword(s) => J::from(s.as_str()),
            Value::Tags(t) => J::from(t.clone()),
            Value::Int(i) => J::from(*i),
            Value::Float(v) => J::from(*v),
            Value::Bool(b) => J::from(*b),
            Value::Timestamp(ms) => serde_json::json!({ "$date": ms }),
        };
        m.insert(x.name.clone(), v);
    }
    J::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every vector of tests/data/filter_vectors.jsonl with a JSON form translates to its bytes.
    #[test]
    fn filter_vectors_match() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/filter_vectors.jsonl")).unwrap();
        let mut checked = 0;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: J = serde_json::from_str(line).unwrap();
            if v["filter"].is_null() {
                continue;
            }
            let got = filter(&v["filter"]).unwrap_or_else(|e| panic!("{}: {e}", v["name"]));
            let hex: String = got.encode().iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex, v["hex"].as_str().unwrap(), "{}", v["name"]);
            checked += 1;
        }
        assert!(checked >= 20, "only {checked} vectors checked");
    }

    #[test]
    fn malformed_filters_are_named() {
        for (j, want) in [
            (r#"[1]"#, "must be a JSON object"),
            (r#"{}"#, "empty filter"),
            (r#"{"$xor": []}"#, "unknown filter operator \"$xor\""),
            (r#"{"$and": []}"#, "$and takes a non-empty list"),
            (r#"{"$or": {"a": 1}}"#, "$or takes a non-empty list"),
            (r#"{"n": {"$gte": [1]}}"#, "$gte on field \"n\" takes"),
            (r#"{"n": {"$in": 3}}"#, "$in on field \"n\" takes a list"),
            (r#"{"n": {"$exists": 1}}"#, "$exists on field \"n\" takes true or false"),
            (r#"{"n": {"$regex": "x"}}"#, "unknown filter operator \"$regex\" on field \"n\""),
            (r#"{"n": {}}"#, "empty condition on field \"n\""),
            (r#"{"n": null}"#, "$eq on field \"n\" takes"),
            (r#"{"": 1}"#, "field name"),
            (r#"{"n": 18446744073709551615}"#, "does not fit int64"),
        ] {
            let err = filter(&serde_json::from_str(j).unwrap()).unwrap_err();
            assert!(err.contains(want), "{j}: {err:?} lacks {want:?}");
        }
    }

    #[test]
    fn dates_and_fields_round_trip() {
        let f = filter(&serde_json::json!({"at": {"$gte": {"$date": 1704164645000i64}}})).unwrap();
        assert_eq!(f, Expr::Cmp(Cmp::Gte, "at".into(), Value::Timestamp(1704164645000)));
        let f = filter(&serde_json::json!({"at": {"$date": 5}})).unwrap();
        assert_eq!(f, Expr::Cmp(Cmp::Eq, "at".into(), Value::Timestamp(5)));
        let j = serde_json::json!({"a": "x", "at": {"$date": 7}, "b": true, "f": 1.5, "n": -2, "t": ["p", "q"]});
        let fl = fields(&j).unwrap();
        assert_eq!(fields_to_json(&fl), j);
        assert!(fields(&serde_json::json!({"t": [1]})).unwrap_err().contains("strings only"));
        assert!(fields(&serde_json::json!({"o": {"x": 1}})).unwrap_err().contains("field \"o\""));
    }
}
