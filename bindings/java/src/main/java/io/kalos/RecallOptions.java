package io.kalos;

/**
 * Per-call recall options: a namespace and metadata filter (exact: applied inside the scan), recency
 * weighting and a deadline. Immutable; {@code with*} return copies. {@link #ALL} is the default.
 */
public final class RecallOptions {
    /** All namespaces, no recency weighting, the handle's default deadline. */
    public static final RecallOptions ALL = new RecallOptions(null, null, 0f, 1.0, 0);

    final long[] namespaces;
    final byte[] filter;
    final float recencyWeight;
    final double recencyHalfLifeMs;
    final long timeoutMs;

    private RecallOptions(long[] namespaces, byte[] filter, float w, double halfLife, long timeoutMs) {
        this.namespaces = namespaces;
        this.filter = filter;
        this.recencyWeight = w;
        this.recencyHalfLifeMs = halfLife;
        this.timeoutMs = timeoutMs;
    }

    /** Only memories in these namespaces (at most 64). */
    public static RecallOptions namespaces(long... ns) {
        return ALL.withNamespaces(ns);
    }

    /** Only memories in these namespaces (at most 64); null = all. */
    public RecallOptions withNamespaces(long... ns) {
        return new RecallOptions(ns == null ? null : ns.clone(), filter, recencyWeight, recencyHalfLifeMs, timeoutMs);
    }

    /** Only memories whose metadata fields match {@code f}. */
    public static RecallOptions filter(Filter f) {
        return ALL.withFilter(f);
    }

    /**
     * Only memories whose metadata fields match {@code f} (null = no filter). Applied inside the
     * scan with the namespaces, before the top-k: a recall returns k hits whenever k memories
     * match. The filter is encoded here.
     */
    public RecallOptions withFilter(Filter f) {
        return new RecallOptions(namespaces, f == null ? null : f.encode(), recencyWeight, recencyHalfLifeMs, timeoutMs);
    }

    /**
     * Recency weighting: {@code score' = (1-w)·score + w·2^(-age/halfLife)} (ip and cosine);
     * weight 0 turns it off.
     */
    public RecallOptions withRecency(float weight, double halfLifeMs) {
        return new RecallOptions(namespaces, filter, weight, halfLifeMs, timeoutMs);
    }

    /** Deadline of this call in ms (0 = the handle's default). */
    public RecallOptions withTimeoutMs(long ms) {
        return new RecallOptions(namespaces, filter, recencyWeight, recencyHalfLifeMs, ms);
    }
}
