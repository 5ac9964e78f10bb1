package io.kalos;

/** The call's deadline passed before the server answered. See {@link KalosException} for the statuses of each family. */
public class KalosTimeoutException extends KalosException {
    private static final long serialVersionUID = 1L;

    /** Use {@link KalosException#of(int, String)}, which picks the subclass of a status. */
    KalosTimeoutException(int code, String message) {
        super(code, message);
    }
}
