package io.kalos;

/**
 * An error reported by Kalos. {@link #status()} is the library's status code; its numeric value
 * ({@link Status#code()}) is the C ABI's ({@code KALOS_*} in {@code include/kalos.h}), so logs and
 * metrics agree across languages.
 *
 * <p>Each family of statuses has its own subclass, so a caller catches what it handles:
 * {@link InvalidArgumentException} (the request is wrong: INVALID_ARGUMENT, NULL_POINTER,
 * DIMENSION_MISMATCH, K_OUT_OF_RANGE, NON_FINITE, INVALID_NAME, BUFFER_TOO_SMALL,
 * PAYLOAD_TOO_LARGE, TOO_LARGE), {@link NotFoundException}, {@link StoreFullException},
 * {@link KalosTimeoutException}, {@link ServerGoneException} (reopen the store),
 * {@link KalosIOException} (IO, CORRUPT, PERMISSION_DENIED) and, in cluster mode,
 * {@link UnavailableException} and {@link StaleException}. Every other status is a plain
 * {@code KalosException}.
 *
 * <p>Programming errors on the Java side are reported with the usual JDK exceptions instead:
 * {@link IllegalStateException} for a closed handle, {@link IllegalArgumentException} for a
 * non-direct or misaligned NIO buffer, {@link NullPointerException} for null arguments.
 */
public class KalosException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** Status codes. The numeric values are the C ABI's and are never renumbered. */
    public enum Status {
        OK(0),
        INVALID_ARGUMENT(1),
        NULL_POINTER(2),
        DIMENSION_MISMATCH(3),
        K_OUT_OF_RANGE(4),
        NON_FINITE(5),
        INVALID_NAME(6),
        STORE_FULL(7),
        VERSION_MISMATCH(8),
        NOT_FOUND(9),
        ALREADY_EXISTS(10),
        TIMEOUT(11),
        SERVER_GONE(12),
        BUFFER_TOO_SMALL(13),
        PAYLOAD_TOO_LARGE(14),
        CORRUPT(15),
        IO(16),
        LOCKED(17),
        BACKEND_UNAVAILABLE(18),
        CUDA(19),
        PERMISSION_DENIED(20),
        TOO_LARGE(21),
        CLOSED(22),
        PANIC(23),
        INTERNAL(24),
        UNAVAILABLE(25),
        STALE(26),
        /** A code this version of the binding does not know (a newer library). */
        UNKNOWN(-1);

        private final int code;

        Status(int code) {
            this.code = code;
        }

        /** The numeric status, as in {@code include/kalos.h}. */
        public int code() {
            return code;
        }

        /** The status for a numeric code ({@link #UNKNOWN} if this binding does not know it). */
        public static Status fromCode(int code) {
            for (Status s : values()) {
                if (s.code == code) {
                    return s;
                }
            }
            return UNKNOWN;
        }
    }

    private final Status status;
    private final int code;

    /**
     * The exception for a status: the subclass of its family ({@link InvalidArgumentException},
     * {@link NotFoundException}, {@link StoreFullException}, {@link KalosTimeoutException},
     * {@link ServerGoneException}, {@link KalosIOException}, {@link UnavailableException},
     * {@link StaleException}), else a plain {@code KalosException}.
     * Native code ({@code src/ffi/jni.rs}) creates every exception it throws through this method.
     */
    public static KalosException of(int code, String message) {
        switch (Status.fromCode(code)) {
            case INVALID_ARGUMENT:
            case NULL_POINTER:
            case DIMENSION_MISMATCH:
            case K_OUT_OF_RANGE:
            case NON_FINITE:
            case INVALID_NAME:
            case BUFFER_TOO_SMALL:
            case PAYLOAD_TOO_LARGE:
            case TOO_LARGE:
                return new InvalidArgumentException(code, message);
            case NOT_FOUND:
                return new NotFoundException(code, message);
            case STORE_FULL:
                return new StoreFullException(code, message);
            case TIMEOUT:
                return new KalosTimeoutException(code, message);
            case SERVER_GONE:
                return new ServerGoneException(code, message);
            case IO:
            case CORRUPT:
            case PERMISSION_DENIED:
                return new KalosIOException(code, message);
            case UNAVAILABLE:
                return new UnavailableException(code, message);
            case STALE:
                return new StaleException(code, message);
            default:
                return new KalosException(code, message);
        }
    }

    /** {@link #of(int, String)} for a {@link Status}. */
    public static KalosException of(Status status, String message) {
        return of(status.code(), message);
    }

    /**
     * An exception with the raw status code; the message reads {@code STATUS: message} (a
     * message that already starts with its status name is not prefixed twice). Prefer
     * {@link #of(int, String)}, which picks the subclass.
     */
    public KalosException(int code, String message) {
        super(prefixed(Status.fromCode(code), message));
        this.code = code;
        this.status = Status.fromCode(code);
    }

    public KalosException(Status status, String message) {
        this(status.code(), message);
    }

    private static String prefixed(Status status, String message) {
        String prefix = status.name() + ": ";
        if (message == null || message.isEmpty()) {
            return status.name();
        }
        return message.startsWith(prefix) ? message : prefix + message;
    }

    /** The status of the failed call. */
    public Status status() {
        return status;
    }

    /** The raw numeric status (useful when {@link #status()} is {@link Status#UNKNOWN}). */
    public int code() {
        return code;
    }
}
