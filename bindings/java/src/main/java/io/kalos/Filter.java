package io.kalos;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * A metadata filter expression (docs/FORMATS.md, "Filter expressions"), built with the static
 * methods and passed to {@link RecallOptions#withFilter} or {@link Kalos#deleteWhere}. Values:
 * {@code String} keyword, {@code Long}/{@code Integer} int64, {@code Double}/{@code Float}
 * float64, {@code Boolean} bool, {@link Instant} timestamp (unix ms). {@link #encode()} gives the
 * binary form, byte for byte the one the Python ({@code kalos.filters}) and Go builders give for
 * the same filter. Immutable.
 *
 * <pre>{@code
 * Filter f = Filter.and(Filter.or(Filter.eq("user", "ann"), Filter.contains("tags", "urgent")),
 *                       Filter.not(Filter.exists("archived")));
 * }</pre>
 *
 * Semantics: {@code eq}/{@code in}/{@code contains} on a tags field match when any tag does;
 * {@code ne} and {@code nin} match memories without the field; orderings compare numbers with
 * numbers, strings bytewise and bools; a value of another kind than the field matches nothing.
 */
public final class Filter {
    /** Deepest nesting the library accepts (the root is depth 1). */
    public static final int MAX_DEPTH = 32;

    private static final int AND = 1, OR = 2, NOT = 3, EQ = 4, NE = 5, GT = 6, GTE = 7, LT = 8, LTE = 9, IN = 10,
            NIN = 11, EXISTS = 12, CONTAINS = 13;
    private static final String[] NAMES = {"", "and", "or", "not", "eq", "ne", "gt", "gte", "lt", "lte", "in", "nin",
            "exists", "contains"};
    static final int T_KEYWORD = 1, T_TAGS = 2, T_INT = 3, T_FLOAT = 4, T_BOOL = 5, T_TIMESTAMP = 6;

    private final int op;
    private final String field;
    private final Object[] values;
    private final Filter[] children;

    private Filter(int op, String field, Object[] values, Filter[] children) {
        this.op = op;
        this.field = field;
        this.values = values;
        this.children = children;
    }

    private static Filter leaf(int op, String field, Object... values) {
        if (field == null) {
            throw new NullPointerException("field");
        }
        for (Object v : values) {
            checkScalar(v);
        }
        return new Filter(op, field, values.clone(), new Filter[0]);
    }

    public static Filter eq(String field, Object value) { return leaf(EQ, field, value); }
    /** Not equal; also matches memories without the field. */
    public static Filter ne(String field, Object value) { return leaf(NE, field, value); }
    public static Filter gt(String field, Object value) { return leaf(GT, field, value); }
    public static Filter gte(String field, Object value) { return leaf(GTE, field, value); }
    public static Filter lt(String field, Object value) { return leaf(LT, field, value); }
    public static Filter lte(String field, Object value) { return leaf(LTE, field, value); }
    /** A tags field holds {@code value} (a keyword field: equals it). */
    public static Filter contains(String field, Object value) { return leaf(CONTAINS, field, value); }
    /** The memory has a value for the field. */
    public static Filter exists(String field) { return leaf(EXISTS, field); }

    /** The field equals one of {@code values}; no values matches nothing. */
    public static Filter in(String field, Object... values) {
        return values.length == 0 ? and(not(exists(field)), exists(field)) : leaf(IN, field, values);
    }

    /** The field equals none of {@code values} (or is absent); no values matches every memory. */
    public static Filter nin(String field, Object... values) {
        return values.length == 0 ? not(in(field)) : leaf(NIN, field, values);
    }

    public static Filter and(Filter... fs) { return combine(AND, fs); }
    public static Filter or(Filter... fs) { return combine(OR, fs); }

    public static Filter not(Filter f) {
        if (f == null) {
            throw new NullPointerException("filter");
        }
        return new Filter(NOT, null, new Object[0], new Filter[] {f});
    }

    private static Filter combine(int op, Filter[] fs) {
        if (fs.length == 0) {
            throw new IllegalArgumentException(NAMES[op] + " needs at least one filter");
        }
        List<Filter> flat = new ArrayList<>();
        for (Filter f : fs) {
            if (f == null) {
                throw new NullPointerException("filter");
            }
            if (f.op == op) {
                flat.addAll(Arrays.asList(f.children));
            } else {
                flat.add(f);
            }
        }
        return flat.size() == 1 ? flat.get(0) : new Filter(op, null, new Object[0], flat.toArray(new Filter[0]));
    }

    private static void checkScalar(Object v) {
        if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                throw new IllegalArgumentException("float " + d + " is not finite");
            }
        } else if (!(v instanceof String || v instanceof Long || v instanceof Integer || v instanceof Short
                || v instanceof Boolean || v instanceof Instant)) {
            throw new IllegalArgumentException("unsupported filter value " + v
                    + (v == null ? "" : " (" + v.getClass().getSimpleName() + ")"));
        }
    }

    /** The binary form (docs/FORMATS.md). A field name or string too long throws IllegalArgumentException. */
    public byte[] encode() {
        Out o = new Out();
        o.u8(1);
        put(o, 1);
        return o.bytes();
    }

    private void put(Out o, int depth) {
        if (depth > MAX_DEPTH) {
            throw new IllegalArgumentException("filter nested deeper than " + MAX_DEPTH + " levels");
        }
        o.u8(op);
        if (op == AND || op == OR) {
            o.u16(children.length);
            for (Filter c : children) {
                c.put(o, depth + 1);
            }
        } else if (op == NOT) {
            children[0].put(o, depth + 1);
        } else {
            o.name(field);
            if (op == IN || op == NIN) {
                o.u16(values.length);
            }
            for (Object v : values) {
                o.value(v);
            }
        }
    }

    @Override
    public String toString() {
        StringBuilder b = new StringBuilder(NAMES[op]).append('(');
        if (field != null) {
            b.append('"').append(field).append('"');
            for (Object v : values) {
                b.append(", ").append(v instanceof String ? "\"" + v + "\"" : String.valueOf(v));
            }
        } else {
            for (int i = 0; i < children.length; i++) {
                b.append(i > 0 ? ", " : "").append(children[i]);
            }
        }
        return b.append(')').toString();
    }

    // ------------------------------------------------------------------- fields (upsert, getFields)

    /**
     * The fields block of an upsert (docs/FORMATS.md): one map per item (null = no fields). Value
     * types as for filters, plus a {@code Collection<String>} for a tags field; null values are
     * left out.
     */
    static byte[] encodeFields(List<? extends Map<String, ?>> items) {
        Out o = new Out();
        o.u8(1);
        o.u32(items.size());
        for (Map<String, ?> m : items) {
            Map<String, Object> sorted = new TreeMap<>();
            if (m != null) {
                for (Map.Entry<String, ?> e : m.entrySet()) {
                    if (e.getValue() != null) {
                        sorted.put(e.getKey(), e.getValue());
                    }
                }
            }
            o.u16(sorted.size());
            for (Map.Entry<String, Object> e : sorted.entrySet()) {
                o.name(e.getKey());
                Object v = e.getValue();
                if (v instanceof Collection) {
                    Collection<?> tags = (Collection<?>) v;
                    if (tags.size() > 256) {
                        throw new IllegalArgumentException(tags.size() + " tags in field " + e.getKey() + " (at most 256)");
                    }
                    o.u8(T_TAGS);
                    o.u16(tags.size());
                    for (Object t : tags) {
                        if (!(t instanceof String)) {
                            throw new IllegalArgumentException("a tags value holds strings only: field " + e.getKey());
                        }
                        o.str((String) t);
                    }
                } else {
                    checkScalar(v);
                    o.value(v);
                }
            }
        }
        return o.bytes();
    }

    /** Reads items packed back to back, one length per item. Timestamps as Instant, int64 as Long, tags as a sorted List. */
    static List<Map<String, Object>> decodeFields(byte[] packed, int[] lens) {
        ByteBuffer b = ByteBuffer.wrap(packed).order(ByteOrder.LITTLE_ENDIAN);
        List<Map<String, Object>> out = new ArrayList<>(lens.length);
        for (int len : lens) {
            int end = b.position() + len;
            Map<String, Object> m = new LinkedHashMap<>();
            int n = Short.toUnsignedInt(b.getShort());
            for (int j = 0; j < n; j++) {
                String name = str(b, Byte.toUnsignedInt(b.get()));
                int t = b.get();
                Object v;
                switch (t) {
                    case T_KEYWORD: v = str(b, Short.toUnsignedInt(b.getShort())); break;
                    case T_TAGS: {
                        int c = Short.toUnsignedInt(b.getShort());
                        List<String> tags = new ArrayList<>(c);
                        for (int k = 0; k < c; k++) {
                            tags.add(str(b, Short.toUnsignedInt(b.getShort())));
                        }
                        v = tags;
                        break;
                    }
                    case T_INT: v = b.getLong(); break;
                    case T_FLOAT: v = b.getDouble(); break;
                    case T_BOOL: v = b.get() != 0; break;
                    case T_TIMESTAMP: v = Instant.ofEpochMilli(b.getLong()); break;
                    default: throw new IllegalStateException("unknown field type " + t);
                }
                m.put(name, v);
            }
            if (b.position() != end) {
                throw new IllegalStateException("fields item of " + len + " bytes read as " + (b.position() - end + len));
            }
            out.add(m);
        }
        return out;
    }

    private static String str(ByteBuffer b, int n) {
        byte[] s = new byte[n];
        b.get(s);
        return new String(s, StandardCharsets.UTF_8);
    }

    /** Little-endian writer of the binary forms. */
    private static final class Out {
        private final ByteArrayOutputStream b = new ByteArrayOutputStream();

        void u8(int v) { b.write(v); }
        void u16(int v) { b.write(v); b.write(v >>> 8); }
        void u32(int v) { u16(v); u16(v >>> 16); }
        void i64(long v) { u32((int) v); u32((int) (v >>> 32)); }
        byte[] bytes() { return b.toByteArray(); }

        void name(String s) {
            byte[] raw = s.getBytes(StandardCharsets.UTF_8);
            if (raw.length < 1 || raw.length > 64) {
                throw new IllegalArgumentException("field name \"" + s + "\" has " + raw.length + " bytes (1 to 64)");
            }
            u8(raw.length);
            b.write(raw, 0, raw.length);
        }

        void str(String s) {
            byte[] raw = s.getBytes(StandardCharsets.UTF_8);
            if (raw.length > 1024) {
                throw new IllegalArgumentException("string of " + raw.length + " bytes (at most 1024)");
            }
            u16(raw.length);
            b.write(raw, 0, raw.length);
        }

        void value(Object v) {
            if (v instanceof Boolean) {
                u8(T_BOOL);
                u8((Boolean) v ? 1 : 0);
            } else if (v instanceof Long || v instanceof Integer || v instanceof Short) {
                u8(T_INT);
                i64(((Number) v).longValue());
            } else if (v instanceof Double || v instanceof Float) {
                u8(T_FLOAT);
                i64(Double.doubleToLongBits(((Number) v).doubleValue()));
            } else if (v instanceof String) {
                u8(T_KEYWORD);
                str((String) v);
            } else {
                u8(T_TIMESTAMP);
                i64(((Instant) v).toEpochMilli());
            }
        }
    }
}
