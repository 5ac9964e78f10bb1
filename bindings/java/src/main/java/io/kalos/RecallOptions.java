package io.kalos;

/**
 * Per-call recall options: a namespace and metadata filter (exact: applied inside the scan), recency
 * weighting, a deadline and, in cluster mode, the consistency a recall asks for (read-your-writes,
 * a write token to wait for, stale reads). Immutable; {@code with*} return copies. {@link #ALL} is
 * the default.
 */
public final class RecallOptions {
    /** All namespaces, no recency weighting, the handle's default deadline. */
    public static final RecallOptions ALL = new RecallOptions(null, null, 0f, 1.0, 0, 0, null);

    /** {@code KALOS_RECALL_READ_YOUR_WRITES}. */
    static final int READ_YOUR_WRITES = 1;
    /** {@code KALOS_RECALL_ALLOW_STALE}. */
    static final int ALLOW_STALE = 2;

    final long[] namespaces;
    final byte[] filter;
    final float recencyWeight;
    final double recencyHalfLifeMs;
    final long timeoutMs;
    /** {@link #READ_YOUR_WRITES} | {@link #ALLOW_STALE}. */
    final int consistency;
    final long[] minSeqs;

    private RecallOptions(long[] namespaces, byte[] filter, float w, double halfLife, long timeoutMs, int consistency,
                          long[] minSeqs) {
        this.namespaces = namespaces;
        this.filter = filter;
        this.recencyWeight = w;
        this.recencyHalfLifeMs = halfLife;
        this.timeoutMs = timeoutMs;
        this.consistency = consistency;
        this.minSeqs = minSeqs;
    }

    /** Only memories in these namespaces (at most 64). */
    public static RecallOptions namespaces(long... ns) {
        return ALL.withNamespaces(ns);
    }

    /** Only memories in these namespaces (at most 64); null = all. */
    public RecallOptions withNamespaces(long... ns) {
        return new RecallOptions(ns == null ? null : ns.clone(), filter, recencyWeight, recencyHalfLifeMs, timeoutMs,
                consistency, minSeqs);
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
        return new RecallOptions(namespaces, f == null ? null : f.encode(), recencyWeight, recencyHalfLifeMs, timeoutMs,
                consistency, minSeqs);
    }

    /**
     * Recency weighting: {@code score' = (1-w)·score + w·2^(-age/halfLife)} (ip and cosine);
     * weight 0 turns it off.
     */
    public RecallOptions withRecency(float weight, double halfLifeMs) {
        return new RecallOptions(namespaces, filter, weight, halfLifeMs, timeoutMs, consistency, minSeqs);
    }

    /** Deadline of this call in ms (0 = the handle's default). */
    public RecallOptions withTimeoutMs(long ms) {
        return new RecallOptions(namespaces, filter, recencyWeight, recencyHalfLifeMs, ms, consistency, minSeqs);
    }

    /**
     * Cluster mode (docs/CLUSTER.md): wait, up to the deadline, until the replica that answers has
     * applied this handle's acknowledged writes ({@link Kalos#writeSeqs()}). Satisfied at once on
     * a single host.
     */
    public RecallOptions withReadYourWrites() {
        return new RecallOptions(namespaces, filter, recencyWeight, recencyHalfLifeMs, timeoutMs,
                consistency | READ_YOUR_WRITES, minSeqs);
    }

    /**
     * Cluster mode: a replica that may be behind its log may answer; without it such a recall
     * throws {@link StaleException}. {@link Kalos#lastLag()} then says how far behind it was.
     */
    public RecallOptions withAllowStale() {
        return new RecallOptions(namespaces, filter, recencyWeight, recencyHalfLifeMs, timeoutMs,
                consistency | ALLOW_STALE, minSeqs);
    }

    /**
     * Cluster mode: wait, up to the deadline, until the replica that answers has applied the
     * writes of a write token: {@link Kalos#writeSeqs()} of any handle, in any process or language
     * (per shard log sequences, unsigned; at most 4096 entries). Ignored on a single host; null =
     * none. The array is copied.
     */
    public RecallOptions withMinSeqs(long... token) {
        return new RecallOptions(namespaces, filter, recencyWeight, recencyHalfLifeMs, timeoutMs, consistency,
                token == null ? null : token.clone());
    }

    boolean allowStale() {
        return (consistency & ALLOW_STALE) != 0;
    }
}
