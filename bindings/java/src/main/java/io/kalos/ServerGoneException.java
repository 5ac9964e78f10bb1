package io.kalos;

/** The server died or stopped; open the store again. See {@link KalosException} for the statuses of each family. */
public class ServerGoneException extends KalosException {
    private static final long serialVersionUID = 1L;

    /** Use {@link KalosException#of(int, String)}, which picks the subclass of a status. */
    ServerGoneException(int code, String message) {
        super(code, message);
    }
}
