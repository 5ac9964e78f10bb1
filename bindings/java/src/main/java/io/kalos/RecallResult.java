package io.kalos;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;

/**
 * The top-k of one query: ids and scores, best first (ties by lower id), and, for
 * {@link Kalos#recallWithPayloads}, each hit's payload. Scores: ip and cosine higher is better;
 * l2 is the squared distance (lower is better).
 */
public final class RecallResult {
    private final long[] ids;
    private final float[] scores;
    private final byte[][] payloads;

    RecallResult(long[] ids, float[] scores, byte[][] payloads) {
        this.ids = ids;
        this.scores = scores;
        this.payloads = payloads;
    }

    /** Number of hits: {@code min(k, matching memories)}. */
    public int size() {
        return ids.length;
    }

    public long id(int i) {
        return ids[i];
    }

    public float score(int i) {
        return scores[i];
    }

    /** Hit ids, best first (a copy). */
    public long[] ids() {
        return ids.clone();
    }

    /** Hit scores, best first (a copy). */
    public float[] scores() {
        return scores.clone();
    }

    /** True when this result carries payloads ({@link Kalos#recallWithPayloads}). */
    public boolean hasPayloads() {
        return payloads != null;
    }

    /** Payload of hit {@code i} (null when it has none, or when payloads were not requested). */
    public byte[] payload(int i) {
        if (payloads == null) {
            return null;
        }
        byte[] p = payloads[i];
        return p == null ? null : p.clone();
    }

    /** Payload of hit {@code i} as UTF-8 text (null when none). */
    public String payloadText(int i) {
        byte[] p = payloads == null ? null : payloads[i];
        return p == null ? null : new String(p, StandardCharsets.UTF_8);
    }

    @Override
    public String toString() {
        return "RecallResult{ids=" + Arrays.toString(ids) + ", scores=" + Arrays.toString(scores) + "}";
    }
}
