package io.kalos;

/**
 * An error reported by Kalos. {@link #status()} is the library's status code; its numeric value
 * ({@link Status#code()}) is the C ABI's ({@code KALOS_*} in {@code include/kalos.h}), so logs and
 * metrics agree across languages.
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

    /** Called from native code ({@code src/ffi/jni.rs}) with the raw status code. */
    public KalosException(int code, String message) {
        super(Status.fromCode(code).name() + ": " + message);
        this.code = code;
        this.status = Status.fromCode(code);
    }

    public KalosException(Status status, String message) {
        this(status.code(), message);
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
