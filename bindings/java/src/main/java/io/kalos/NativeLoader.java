package io.kalos;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.net.URL;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.Locale;

/**
 * Loads {@code libkalos.so} once, from the first of:
 *
 * <ol>
 *   <li>the absolute path in the system property {@code kalos.library};
 *   <li>the absolute path in the environment variable {@code KALOS_LIBRARY};
 *   <li>the copy bundled in the jar, {@code /io/kalos/native/<os>-<arch>/libkalos.so} (the jar that
 *       {@code scripts/package.sh} builds carries {@code linux-x86_64}), extracted to a private
 *       temporary directory (mode 0700, under {@code java.io.tmpdir}), loaded, and deleted at once:
 *       the loaded mapping stays valid and nothing is left behind, even after a crash;
 *   <li>{@code System.loadLibrary("kalos")} through {@code java.library.path}.
 * </ol>
 *
 * The scheme is sqlite-jdbc's: a jar on the classpath is all a service needs, and an explicit
 * path always wins over what the jar carries.
 */
final class NativeLoader {
    private static volatile boolean loaded;
    /** The first failure's message, repeated on every later attempt (not a bare NoClassDefFoundError). */
    private static String failure;
    /** Where the loaded library came from (a path, or the jar resource's URL). */
    private static volatile String source;

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

    /** Where the library was loaded from; loads it first if needed. */
    static String source() {
        load();
        return source;
    }

    /** {@code linux-x86_64}, {@code linux-aarch64}, ...: the resource directory for this JVM. */
    static String platform() {
        String os = System.getProperty("os.name", "").toLowerCase(Locale.ROOT);
        String arch = System.getProperty("os.arch", "").toLowerCase(Locale.ROOT);
        if (os.startsWith("linux")) {
            os = "linux";
        } else if (os.startsWith("mac") || os.startsWith("darwin")) {
            os = "macos";
        }
        if (arch.equals("amd64") || arch.equals("x86_64")) {
            arch = "x86_64";
        } else if (arch.equals("arm64")) {
            arch = "aarch64";
        }
        return os + "-" + arch;
    }

    static String resourceName() {
        return "/io/kalos/native/" + platform() + "/" + System.mapLibraryName("kalos");
    }

    private static void doLoad() {
        String path = System.getProperty("kalos.library");
        String what = "system property kalos.library";
        if (path == null || path.isEmpty()) {
            path = System.getenv("KALOS_LIBRARY");
            what = "environment variable KALOS_LIBRARY";
        }
        if (path != null && !path.isEmpty()) {
            File f = new File(path);
            if (!f.isAbsolute()) {
                throw new UnsatisfiedLinkError(what + " must be an absolute path to libkalos.so, got \"" + path + "\"");
            }
            if (!f.isFile()) {
                throw new UnsatisfiedLinkError(what + " names \"" + path + "\", which does not exist");
            }
            System.load(f.getAbsolutePath());
            source = f.getAbsolutePath();
            return;
        }
        URL bundled = NativeLoader.class.getResource(resourceName());
        if (bundled != null) {
            loadBundled(bundled);
            return;
        }
        try {
            System.loadLibrary("kalos");
            source = "java.library.path (" + System.getProperty("java.library.path") + ")";
        } catch (UnsatisfiedLinkError e) {
            UnsatisfiedLinkError u = new UnsatisfiedLinkError(
                    "cannot load the Kalos native library: this jar carries none for " + platform()
                            + "; set -Dkalos.library or KALOS_LIBRARY to the absolute path of libkalos.so, "
                            + "or add its directory to -Djava.library.path (now: \""
                            + System.getProperty("java.library.path") + "\"). Cause: " + e.getMessage());
            u.initCause(e);
            throw u;
        }
    }

    private static void loadBundled(URL url) {
        Path dir = null;
        Path lib = null;
        try {
            // createTempDirectory makes the directory 0700 on POSIX: no other user can swap the
            // file between the copy and the load.
            dir = Files.createTempDirectory("kalos-native-");
            lib = dir.resolve(System.mapLibraryName("kalos"));
            try (InputStream in = url.openStream()) {
                Files.copy(in, lib, StandardCopyOption.REPLACE_EXISTING);
            }
            System.load(lib.toString());
            source = url.toString();
        } catch (IOException e) {
            UnsatisfiedLinkError u = new UnsatisfiedLinkError("cannot extract the bundled " + url + " to "
                    + System.getProperty("java.io.tmpdir") + " (set -Djava.io.tmpdir, or -Dkalos.library to a "
                    + "libkalos.so on disk): " + e);
            u.initCause(e);
            throw u;
        } catch (UnsatisfiedLinkError e) {
            UnsatisfiedLinkError u = new UnsatisfiedLinkError("cannot load the bundled " + url + " extracted to " + lib
                    + " (a noexec java.io.tmpdir? set -Djava.io.tmpdir, or -Dkalos.library to a libkalos.so on disk): "
                    + e.getMessage());
            u.initCause(e);
            throw u;
        } finally {
            deleteQuietly(lib);
            deleteQuietly(dir);
        }
    }

    private static void deleteQuietly(Path p) {
        if (p != null) {
            try {
                Files.deleteIfExists(p);
            } catch (IOException ignored) {
                // a leftover file in a private temporary directory; nothing to report
            }
        }
    }
}
