package io.kalos;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/** Server statistics ({@link Kalos#stats()}). */
public final class Stats {
    public final long count;
    public final long capacity;
    public final long dim;
    public final long metric;
    public final long dtype;
    /** 1 = cpu, 2 = cuda. */
    public final long engine;
    public final long requests;
    public final long queries;
    public final long batches;
    public final long errors;
    /** Server-side service time percentiles over the last 4096 requests, ns. */
    public final long p50Ns;
    public final long p99Ns;
    public final long queueDepth;
    public final long serverPid;
    public final long epoch;
    public final long payloadBytes;
    public final long uptimeMs;
    public final long engineFallbacks;
    /** Queries answered by the int8 scan ({@link KalosOptions.Builder#scanInt8}). */
    public final long rerankQueries;
    /**
     * Of those, queries whose k-th exact score fell inside the 8-bit error bound of the rows left
     * out of the candidates (a true neighbour may have been missed).
     */
    public final long rerankUncertain;
    /** Engine description, e.g. "cpu-avx2-x2". */
    public final String engineName;
    /**
     * Why the CUDA engine is not serving: it could not start under backend auto, or it failed while
     * serving. Empty when nothing fell back.
     */
    public final String fallbackReason;

    /**
     * The requests answered since the server started by op and status, ordered by op code, then
     * status.
     */
    public final List<OpCount> requestsBy;

    /** Number of counters {@code Native.stats} fills. */
    static final int N = 20;

    Stats(long[] v, String engineName, String fallbackReason, long[] ops) {
        count = v[0];
        capacity = v[1];
        dim = v[2];
        metric = v[3];
        dtype = v[4];
        engine = v[5];
        requests = v[6];
        queries = v[7];
        batches = v[8];
        errors = v[9];
        p50Ns = v[10];
        p99Ns = v[11];
        queueDepth = v[12];
        serverPid = v[13];
        epoch = v[14];
        payloadBytes = v[15];
        uptimeMs = v[16];
        engineFallbacks = v[17];
        rerankQueries = v[18];
        rerankUncertain = v[19];
        this.engineName = engineName;
        this.fallbackReason = fallbackReason;
        List<OpCount> by = new ArrayList<>(ops.length / 3);
        for (int i = 0; i + 2 < ops.length; i += 3) {
            by.add(new OpCount(Native.opName((int) ops[i]), KalosException.Status.fromCode((int) ops[i + 1]), ops[i + 2]));
        }
        requestsBy = Collections.unmodifiableList(by);
    }

    @Override
    public String toString() {
        return "Stats{count=" + count + ", capacity=" + capacity + ", dim=" + dim + ", engine=" + engineName
                + (fallbackReason.isEmpty() ? "" : ", fallbackReason=" + fallbackReason)
                + ", requests=" + requests + ", queries=" + queries + ", batches=" + batches + ", errors=" + errors
                + ", p50Ns=" + p50Ns + ", p99Ns=" + p99Ns + ", serverPid=" + serverPid + "}";
    }
}
