package io.kalos;

/** An operating-system error, a corrupt data file or segment, or a permission problem; the message names the file. See {@link KalosException} for the statuses of each family. */
public class KalosIOException extends KalosException {
    private static final long serialVersionUID = 1L;

    /** Use {@link KalosException#of(int, String)}, which picks the subclass of a status. */
    KalosIOException(int code, String message) {
        super(code, message);
    }
}
