package io.kalos;

import java.nio.charset.StandardCharsets;

/** One stored memory, as returned by {@link Kalos#get(long...)}. */
public final class Record {
    private final long id;
    private final long namespace;
    private final float[] vector;
    private final byte[] payload;
    private final long createdMs;
    private final long expiresMs;

    Record(long id, long namespace, float[] vector, byte[] payload, long createdMs, long expiresMs) {
        this.id = id;
        this.namespace = namespace;
        this.vector = vector;
        this.payload = payload;
        this.createdMs = createdMs;
        this.expiresMs = expiresMs;
    }

    public long id() { return id; }
    public long namespace() { return namespace; }
    /** The vector as stored (normalised for cosine stores). A copy. */
    public float[] vector() { return vector.clone(); }
    /** The payload, or null. A copy. */
    public byte[] payload() { return payload == null ? null : payload.clone(); }
    public String payloadText() { return payload == null ? null : new String(payload, StandardCharsets.UTF_8); }
    /** Creation time, unix ms. */
    public long createdMs() { return createdMs; }
    /** Expiry, unix ms, or -1 for never. */
    public long expiresMs() { return expiresMs; }
}
