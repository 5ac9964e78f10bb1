package io.kalos;

/**
 * Cluster mode: the replica that would answer may be behind its log and the recall did not opt in
 * to stale reads ({@link RecallOptions#withAllowStale()}) (STALE). See {@link KalosException} for
 * the statuses of each family.
 */
public class StaleException extends KalosException {
    private static final long serialVersionUID = 1L;

    /** Use {@link KalosException#of(int, String)}, which picks the subclass of a status. */
    StaleException(int code, String message) {
        super(code, message);
    }
}
