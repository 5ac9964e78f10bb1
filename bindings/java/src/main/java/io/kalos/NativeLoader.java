package io.kalos;

import java.io.File;

/**
 * Loads {@code libkalos.so} once: from the absolute path in the {@code KALOS_LIBRARY} environment
 * variable (or the {@code kalos.library} system property) if set, else with
 * {@code System.loadLibrary("kalos")} through {@code java.library.path}.
 */
final class NativeLoader {
    private static volatile boolean loaded;
    /** The first failure's message, repeated on every later attempt (not a bare NoClassDefFoundError). */
    private static String failure;

    private NativeLoader() {}

    static synchronized void load() {
        if (loaded) {
            return;
        }
        if (failure != null) {
            throw new UnsatisfiedLinkError(failure);
        }
        try {
            doLoad();
        } catch (UnsatisfiedLinkError e) {
            failure = e.getMessage();
            throw e;
        }
        loaded = true;
    }

    private static void doLoad() {
        String path = System.getProperty("kalos.library");
        String source = "system property kalos.library";
        if (path == null || path.isEmpty()) {
            path = System.getenv("KALOS_LIBRARY");
            source = "environment variable KALOS_LIBRARY";
        }
        if (path != null && !path.isEmpty()) {
            File f = new File(path);
            if (!f.isAbsolute()) {
                throw new UnsatisfiedLinkError(source + " must be an absolute path to libkalos.so, got \"" + path + "\"");
            }
            if (!f.isFile()) {
                throw new UnsatisfiedLinkError(source + " names \"" + path + "\", which does not exist");
            }
            System.load(f.getAbsolutePath());
        } else {
            try {
                System.loadLibrary("kalos");
            } catch (UnsatisfiedLinkError e) {
                UnsatisfiedLinkError u = new UnsatisfiedLinkError(
                        "cannot load the Kalos native library: set KALOS_LIBRARY to the absolute path of libkalos.so, "
                                + "or add its directory to -Djava.library.path (now: \""
                                + System.getProperty("java.library.path") + "\"). Build it with `cargo build --release`. Cause: "
                                + e.getMessage());
                u.initCause(e);
                throw u;
            }
        }
    }
}
