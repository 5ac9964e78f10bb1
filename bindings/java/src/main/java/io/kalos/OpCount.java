package io.kalos;

/**
 * One request counter of {@link Stats#requestsBy}: the requests of one op that the server
 * answered with one status.
 */
public final class OpCount {
    /**
     * The op: "recall", "upsert", "delete", "delete_namespace", "get", "stats", "clear",
     * "delete_where" or "list".
     */
    public final String op;
    /** The status the requests were answered with ({@code OK} or an error). */
    public final KalosException.Status status;
    public final long count;

    OpCount(String op, KalosException.Status status, long count) {
        this.op = op;
        this.status = status;
        this.count = count;
    }

    @Override
    public String toString() {
        return op + "/" + status + "=" + count;
    }
}
