package io.kalos;

/** The request is wrong: an invalid argument, dimension, k, name or size, or a NaN/Inf value; the same call fails the same way again. See {@link KalosException} for the statuses of each family. */
public class InvalidArgumentException extends KalosException {
    private static final long serialVersionUID = 1L;

    /** Use {@link KalosException#of(int, String)}, which picks the subclass of a status. */
    InvalidArgumentException(int code, String message) {
        super(code, message);
    }
}
