package io.kalos;

/** An unknown id, or (role client) no store of that name. See {@link KalosException} for the statuses of each family. */
public class NotFoundException extends KalosException {
    private static final long serialVersionUID = 1L;

    /** Use {@link KalosException#of(int, String)}, which picks the subclass of a status. */
    NotFoundException(int code, String message) {
        super(code, message);
    }
}
