package io.kalos;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;

/**
 * Per-call upsert options: namespace (one for all items, or one per item), payloads, expiry and
 * deadline. Immutable; {@code with*} return copies. {@link #DEFAULT}: namespace 0, no payloads,
 * no expiry.
 */
public final class UpsertOptions {
    public static final UpsertOptions DEFAULT = new UpsertOptions(0, null, null, 0, 0, 0, null);

    final long namespace;
    final long[] namespaces;
    final byte[][] payloads;
    final long ttlMs;
    final long expiresAtMs;
    final long timeoutMs;
    final byte[] fields;

    private UpsertOptions(long ns, long[] nss, byte[][] p, long ttl, long exp, long t, byte[] f) {
        fields = f;
        namespace = ns;
        namespaces = nss;
        payloads = p;
        ttlMs = ttl;
        expiresAtMs = exp;
        timeoutMs = t;
    }

    /** Every item in namespace {@code ns}. */
    public static UpsertOptions namespace(long ns) {
        return DEFAULT.withNamespace(ns);
    }

    public UpsertOptions withNamespace(long ns) {
        return new UpsertOptions(ns, null, payloads, ttlMs, expiresAtMs, timeoutMs, fields);
    }

    /** One namespace per item. */
    public UpsertOptions withNamespaces(long... ns) {
        return new UpsertOptions(namespace, ns == null ? null : ns.clone(), payloads, ttlMs, expiresAtMs, timeoutMs, fields);
    }

    /** One payload per item (null entries = no payload). The arrays are not copied until the call. */
    public UpsertOptions withPayloads(byte[]... p) {
        return new UpsertOptions(namespace, namespaces, p, ttlMs, expiresAtMs, timeoutMs, fields);
    }

    /** One UTF-8 text payload per item (null entries = no payload). */
    public UpsertOptions withTextPayloads(String... texts) {
        byte[][] p = new byte[texts.length][];
        for (int i = 0; i < texts.length; i++) {
            p[i] = texts[i] == null ? null : texts[i].getBytes(StandardCharsets.UTF_8);
        }
        return withPayloads(p);
    }

    /**
     * Typed metadata fields, one map per item (null = none): {@code String} keyword,
     * {@code Collection<String>} tags, {@code Long}/{@code Integer} int64, {@code Double} float64,
     * {@code Boolean} bool, {@link java.time.Instant} timestamp. An upsert replaces every field a
     * memory had; a field is typed by the first write that sets it. Encoded here: an unsupported
     * value throws IllegalArgumentException.
     */
    public UpsertOptions withFields(List<? extends Map<String, ?>> items) {
        return new UpsertOptions(namespace, namespaces, payloads, ttlMs, expiresAtMs, timeoutMs,
                items == null ? null : Filter.encodeFields(items));
    }

    /** Time to live from now, ms (0 = none). */
    public UpsertOptions withTtlMs(long ms) {
        return new UpsertOptions(namespace, namespaces, payloads, ms, expiresAtMs, timeoutMs, fields);
    }

    /** Absolute expiry, unix ms (0 = never); must be in the future. */
    public UpsertOptions withExpiresAtMs(long unixMs) {
        return new UpsertOptions(namespace, namespaces, payloads, ttlMs, unixMs, timeoutMs, fields);
    }

    /** Deadline of this call in ms (0 = the handle's default). */
    public UpsertOptions withTimeoutMs(long ms) {
        return new UpsertOptions(namespace, namespaces, payloads, ttlMs, expiresAtMs, ms, fields);
    }
}
