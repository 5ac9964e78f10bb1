package kalos

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"time"
	"unicode/utf8"
)

// Metadata fields and filter expressions (docs/FORMATS.md, "Metadata fields" and "Filter
// expressions"). The bytes these builders produce are the same as those of the Python
// builders in kalos.filters for the same filter (tests/data/filter_vectors.jsonl checks it in
// every binding and in kalosd).

// Fields are the typed metadata of one memory. A value's Go type picks the field type:
// string keyword, []string tags, int/int32/int64/uint/uint32/uint64 (up to MaxInt64) int64,
// float32/float64 float64, bool bool, time.Time timestamp (unix milliseconds, rounded down).
// A field is typed by the first write that sets it; a later write of another type fails with
// an error matching ErrInvalidArgument.
type Fields map[string]any

const (
	filterVersion = 1
	fieldsVersion = 1
	// MaxFilterDepth is the deepest nesting of a filter expression (the root is depth 1).
	MaxFilterDepth = 32
	maxNameBytes   = 64
	maxStringBytes = 1024
	maxTags        = 256
)

type filterOp uint8

const (
	opAnd filterOp = iota + 1
	opOr
	opNot
	opEq
	opNe
	opGt
	opGte
	opLt
	opLte
	opIn
	opNin
	opExists
	opContains
)

const (
	tKeyword = iota + 1
	tTags
	tInt
	tFloat
	tBool
	tTimestamp
)

var opNames = [...]string{opAnd: "and", opOr: "or", opNot: "not", opEq: "eq", opNe: "ne", opGt: "gt",
	opGte: "gte", opLt: "lt", opLte: "lte", opIn: "in", opNin: "nin", opExists: "exists", opContains: "contains"}

// Filter is a metadata filter expression, built with Eq, Ne, Gt, Gte, Lt, Lte, In, Nin,
// Exists, Contains, And, Or and Not. A builder given a bad argument (an unsupported value
// type, a non-finite float) does not fail at once: the error comes back from Encode, or
// from the call the filter is passed to. Semantics: docs/FORMATS.md, "Filter expressions".
type Filter struct {
	op       filterOp
	field    string
	values   []any
	children []*Filter
}

func leaf(op filterOp, field string, values ...any) *Filter {
	return &Filter{op: op, field: field, values: values}
}

// Eq matches memories whose field equals v (a tags field: holds v).
func Eq(field string, v any) *Filter { return leaf(opEq, field, v) }

// Ne matches memories whose field does not equal v, including those without the field.
func Ne(field string, v any) *Filter { return leaf(opNe, field, v) }

// Gt matches memories whose field is greater than v (numbers with numbers, strings bytewise).
func Gt(field string, v any) *Filter { return leaf(opGt, field, v) }

// Gte matches memories whose field is at least v.
func Gte(field string, v any) *Filter { return leaf(opGte, field, v) }

// Lt matches memories whose field is less than v.
func Lt(field string, v any) *Filter { return leaf(opLt, field, v) }

// Lte matches memories whose field is at most v.
func Lte(field string, v any) *Filter { return leaf(opLte, field, v) }

// Contains matches memories whose tags field holds v (a keyword field: equals v).
func Contains(field string, v any) *Filter { return leaf(opContains, field, v) }

// Exists matches memories that have a value for the field.
func Exists(field string) *Filter { return leaf(opExists, field) }

// In matches memories whose field equals one of vs. No values matches nothing.
func In(field string, vs ...any) *Filter {
	if len(vs) == 0 {
		return And(Not(Exists(field)), Exists(field))
	}
	return leaf(opIn, field, vs...)
}

// Nin matches memories whose field equals none of vs, including those without the field.
// No values matches every memory.
func Nin(field string, vs ...any) *Filter {
	if len(vs) == 0 {
		return Not(In(field))
	}
	return leaf(opNin, field, vs...)
}

func combine(op filterOp, fs []*Filter) *Filter {
	flat := make([]*Filter, 0, len(fs))
	for _, f := range fs {
		if f != nil && f.op == op {
			flat = append(flat, f.children...)
		} else {
			flat = append(flat, f)
		}
	}
	if len(flat) == 1 {
		return flat[0]
	}
	return &Filter{op: op, children: flat}
}

// And matches memories that match every f (at least one).
func And(fs ...*Filter) *Filter { return combine(opAnd, fs) }

// Or matches memories that match at least one f (at least one).
func Or(fs ...*Filter) *Filter { return combine(opOr, fs) }

// Not matches memories that f does not match.
func Not(f *Filter) *Filter { return &Filter{op: opNot, children: []*Filter{f}} }

// String shows the expression, e.g. and(eq("user", "ann"), not(exists("archived"))).
func (f *Filter) String() string {
	if f == nil {
		return "<nil>"
	}
	s := opNames[f.op] + "("
	if f.op == opAnd || f.op == opOr || f.op == opNot {
		for i, c := range f.children {
			if i > 0 {
				s += ", "
			}
			s += c.String()
		}
		return s + ")"
	}
	s += fmt.Sprintf("%q", f.field)
	for _, v := range f.values {
		s += fmt.Sprintf(", %#v", v)
	}
	return s + ")"
}

// Encode returns the binary form (docs/FORMATS.md) that recalls and DeleteWhere send, or an
// error matching ErrInvalidArgument naming what is wrong.
func (f *Filter) Encode() ([]byte, error) {
	b := []byte{filterVersion}
	b, err := f.put(b, 1)
	if err != nil {
		return nil, newError("filter", StatusInvalidArgument, err.Error())
	}
	return b, nil
}

func (f *Filter) put(b []byte, depth int) ([]byte, error) {
	if f == nil {
		return nil, fmt.Errorf("a nil filter")
	}
	if depth > MaxFilterDepth {
		return nil, fmt.Errorf("filter nested deeper than %d levels", MaxFilterDepth)
	}
	b = append(b, byte(f.op))
	var err error
	switch f.op {
	case opAnd, opOr:
		if len(f.children) == 0 {
			return nil, fmt.Errorf("%s needs at least one expression", opNames[f.op])
		}
		b = binary.LittleEndian.AppendUint16(b, uint16(len(f.children)))
		for _, c := range f.children {
			if b, err = c.put(b, depth+1); err != nil {
				return nil, err
			}
		}
	case opNot:
		return f.children[0].put(b, depth+1)
	default:
		if b, err = putName(b, f.field); err != nil {
			return nil, err
		}
		if f.op == opIn || f.op == opNin {
			b = binary.LittleEndian.AppendUint16(b, uint16(len(f.values)))
		}
		for _, v := range f.values {
			if b, err = putValue(b, v, false); err != nil {
				return nil, fmt.Errorf("%s on field %q: %w", opNames[f.op], f.field, err)
			}
		}
	}
	return b, nil
}

func putName(b []byte, name string) ([]byte, error) {
	if n := len(name); n < 1 || n > maxNameBytes || !utf8.ValidString(name) {
		return nil, fmt.Errorf("field name %q has %d bytes (1 to %d, UTF-8)", name, n, maxNameBytes)
	}
	return append(append(b, byte(len(name))), name...), nil
}

func putString(b []byte, s string) ([]byte, error) {
	if len(s) > maxStringBytes || !utf8.ValidString(s) {
		return nil, fmt.Errorf("string of %d bytes (at most %d, UTF-8)", len(s), maxStringBytes)
	}
	return append(binary.LittleEndian.AppendUint16(b, uint16(len(s))), s...), nil
}

func putInt(b []byte, t byte, v int64) []byte {
	return binary.LittleEndian.AppendUint64(append(b, t), uint64(v))
}

func putValue(b []byte, v any, tagsOK bool) ([]byte, error) {
	switch x := v.(type) {
	case bool:
		if x {
			return append(b, tBool, 1), nil
		}
		return append(b, tBool, 0), nil
	case int:
		return putInt(b, tInt, int64(x)), nil
	case int32:
		return putInt(b, tInt, int64(x)), nil
	case int64:
		return putInt(b, tInt, x), nil
	case uint32:
		return putInt(b, tInt, int64(x)), nil
	case uint:
		return putValue(b, uint64(x), tagsOK)
	case uint64:
		if x > math.MaxInt64 {
			return nil, fmt.Errorf("%d does not fit int64", x)
		}
		return putInt(b, tInt, int64(x)), nil
	case float32:
		return putValue(b, float64(x), tagsOK)
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("float %v is not finite", x)
		}
		return binary.LittleEndian.AppendUint64(append(b, tFloat), math.Float64bits(x)), nil
	case string:
		return putString(append(b, tKeyword), x)
	case time.Time:
		return putInt(b, tTimestamp, x.UnixMilli()), nil
	case []string:
		if !tagsOK {
			return nil, fmt.Errorf("a tags value is not allowed in a filter: %v", x)
		}
		if len(x) > maxTags {
			return nil, fmt.Errorf("%d tags (at most %d)", len(x), maxTags)
		}
		b = binary.LittleEndian.AppendUint16(append(b, tTags), uint16(len(x)))
		var err error
		for _, t := range x {
			if b, err = putString(b, t); err != nil {
				return nil, err
			}
		}
		return b, nil
	default:
		return nil, fmt.Errorf("unsupported value %#v (%T)", v, v)
	}
}

// encodeFields is the fields block of an upsert: one item per memory.
func encodeFields(items []Fields) ([]byte, error) {
	b := binary.LittleEndian.AppendUint32([]byte{fieldsVersion}, uint32(len(items)))
	for i, m := range items {
		names := make([]string, 0, len(m))
		for k, v := range m {
			if v != nil {
				names = append(names, k)
			}
		}
		sort.Strings(names) // a stable encoding for the same map
		b = binary.LittleEndian.AppendUint16(b, uint16(len(names)))
		var err error
		for _, k := range names {
			if b, err = putName(b, k); err != nil {
				return nil, fmt.Errorf("item %d: %w", i, err)
			}
			if b, err = putValue(b, m[k], true); err != nil {
				return nil, fmt.Errorf("item %d, field %q: %w", i, k, err)
			}
		}
	}
	return b, nil
}

// decodeFields reads items packed back to back, one length per item, as the library writes
// them (kalos_get_fields). Timestamps come back as UTC time.Time, tags sorted.
func decodeFields(buf []byte, lens []uint32) ([]Fields, error) {
	out := make([]Fields, len(lens))
	off := 0
	for i, l := range lens {
		if off+int(l) > len(buf) {
			return nil, fmt.Errorf("fields of item %d run past the buffer", i)
		}
		m, err := decodeItem(buf[off : off+int(l)])
		if err != nil {
			return nil, fmt.Errorf("fields of item %d: %w", i, err)
		}
		out[i] = m
		off += int(l)
	}
	return out, nil
}

// reader reads the library's own field encoding; a short buffer sets err.
type reader struct {
	b   []byte
	o   int
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil || r.o+n > len(r.b) {
		r.err = fmt.Errorf("truncated at byte %d", r.o)
		return make([]byte, n)
	}
	s := r.b[r.o : r.o+n]
	r.o += n
	return s
}

func (r *reader) u16() int    { return int(binary.LittleEndian.Uint16(r.take(2))) }
func (r *reader) i64() int64  { return int64(binary.LittleEndian.Uint64(r.take(8))) }
func (r *reader) str() string { return string(r.take(r.u16())) }

func decodeItem(b []byte) (Fields, error) {
	r := &reader{b: b}
	n := r.u16()
	m := make(Fields, n)
	for j := 0; j < n && r.err == nil; j++ {
		name := string(r.take(int(r.take(1)[0])))
		switch t := r.take(1)[0]; t {
		case tKeyword:
			m[name] = r.str()
		case tTags:
			tags := make([]string, r.u16())
			for k := range tags {
				tags[k] = r.str()
			}
			m[name] = tags
		case tInt:
			m[name] = r.i64()
		case tFloat:
			m[name] = math.Float64frombits(uint64(r.i64()))
		case tBool:
			m[name] = r.take(1)[0] != 0
		case tTimestamp:
			m[name] = time.UnixMilli(r.i64()).UTC()
		default:
			return nil, fmt.Errorf("unknown field type %d", t)
		}
	}
	return m, r.err
}
