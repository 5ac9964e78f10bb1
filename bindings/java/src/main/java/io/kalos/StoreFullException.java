package io.kalos;

/** The store is at its capacity; nothing of the write was applied. See {@link KalosException} for the statuses of each family. */
public class StoreFullException extends KalosException {
    private static final long serialVersionUID = 1L;

    /** Use {@link KalosException#of(int, String)}, which picks the subclass of a status. */
    StoreFullException(int code, String message) {
        super(code, message);
    }
}
