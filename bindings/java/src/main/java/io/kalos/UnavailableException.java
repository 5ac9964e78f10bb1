package io.kalos;

/**
 * Cluster mode: the replicated log cannot take a write (the host is cut off from NATS, or the log
 * has no quorum), or no host of a shard answered a forwarded recall (UNAVAILABLE). A write refused
 * this way was not acknowledged; see docs/CLUSTER.md for when it may still have been logged. See
 * {@link KalosException} for the statuses of each family.
 */
public class UnavailableException extends KalosException {
    private static final long serialVersionUID = 1L;

    /** Use {@link KalosException#of(int, String)}, which picks the subclass of a status. */
    UnavailableException(int code, String message) {
        super(code, message);
    }
}
