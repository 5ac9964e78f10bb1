package io.kalos;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * Library loading, in child JVMs: -Dkalos.library, then KALOS_LIBRARY, then the copy bundled in
 * the jar, then java.library.path; clear errors.
 */
class LoaderTest {
    /** Entry point of the child JVM: prints the version or the loader's error. */
    public static final class Main {
        public static void main(String[] a) {
            try {
                System.out.println("version=" + Kalos.version());
                System.out.println("from=" + Kalos.libraryPath());
            } catch (UnsatisfiedLinkError e) {
                System.out.println("error=" + e.getMessage());
            }
        }
    }

    static String runChild(Map<String, String> env, String libraryPath) throws IOException, InterruptedException {
        return runChild(env, libraryPath, null, List.of());
    }

    /** Runs {@link Main}; {@code extraCp} (may be null) goes first on the classpath. */
    static String runChild(Map<String, String> env, String libraryPath, Path extraCp, List<String> props)
            throws IOException, InterruptedException {
        Path javaBin = Paths.get(System.getProperty("java.home"), "bin", "java");
        String cp = Paths.get("target/classes").toAbsolutePath() + java.io.File.pathSeparator
                + Paths.get("target/test-classes").toAbsolutePath();
        if (extraCp != null) {
            cp = extraCp + java.io.File.pathSeparator + cp;
        }
        List<String> cmd = new ArrayList<>(List.of(javaBin.toString(), "-cp", cp));
        if (libraryPath != null) {
            cmd.add("-Djava.library.path=" + libraryPath);
        }
        cmd.addAll(props);
        cmd.add(Main.class.getName());
        ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true);
        pb.environment().remove("KALOS_LIBRARY");
        pb.environment().putAll(env);
        Process p = pb.start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        p.waitFor();
        return out;
    }

    @Test
    void loadsFromLibraryPathAndFromKalosLibrary() throws Exception {
        String dir = System.getProperty("java.library.path");
        String out = runChild(Map.of(), dir);
        assertTrue(out.contains("version="), out);
        Path lib = null;
        for (String d : dir.split(java.io.File.pathSeparator)) {
            Path c = Paths.get(d, "libkalos.so");
            if (c.toFile().isFile()) {
                lib = c.toAbsolutePath();
            }
        }
        assertNotNull(lib, "libkalos.so in " + dir);
        out = runChild(Map.of("KALOS_LIBRARY", lib.toString()), "/nonexistent");
        assertTrue(out.contains("version="), out);
    }

    static Path builtLibrary() {
        for (String d : System.getProperty("java.library.path").split(java.io.File.pathSeparator)) {
            Path c = Paths.get(d, "libkalos.so");
            if (c.toFile().isFile()) {
                return c.toAbsolutePath();
            }
        }
        return fail("libkalos.so in " + System.getProperty("java.library.path"));
    }

    @Test
    void bundledResourceIsExtractedAndAnExplicitPathWins(@org.junit.jupiter.api.io.TempDir Path tmp) throws Exception {
        Path lib = builtLibrary();
        // A classpath entry carrying the library where the packaged jar carries it.
        Path res = tmp.resolve("res");
        Path inJar = res.resolve(NativeLoader.resourceName().substring(1));
        java.nio.file.Files.createDirectories(inJar.getParent());
        java.nio.file.Files.copy(lib, inJar);
        Path extractTo = java.nio.file.Files.createDirectory(tmp.resolve("tmpdir"));

        String out = runChild(Map.of(), "/nonexistent", res, List.of("-Djava.io.tmpdir=" + extractTo));
        assertTrue(out.contains("version=") && out.contains("from=file:" + inJar), out);
        // Extracted, loaded and deleted: nothing left in the temporary directory.
        try (var left = java.nio.file.Files.list(extractTo)) {
            assertEquals(List.of(), left.map(Path::toString).collect(java.util.stream.Collectors.toList()));
        }
        // An explicit path beats the bundled copy: the system property, then KALOS_LIBRARY.
        Path other = java.nio.file.Files.copy(lib, tmp.resolve("libkalos-other.so"));
        out = runChild(Map.of("KALOS_LIBRARY", lib.toString()), "/nonexistent", res, List.of("-Dkalos.library=" + other));
        assertTrue(out.contains("from=" + other + "\n"), out);
        out = runChild(Map.of("KALOS_LIBRARY", other.toString()), "/nonexistent", res, List.of());
        assertTrue(out.contains("from=" + other + "\n"), out);
        out = runChild(Map.of(), "/nonexistent", res, List.of("-Dkalos.library=/nonexistent/libkalos.so"));
        assertTrue(out.contains("error=") && out.contains("kalos.library") && out.contains("does not exist"), out);
    }

    @Test
    void clearErrors() throws Exception {
        String out = runChild(Map.of(), "/nonexistent");
        assertTrue(out.contains("error=") && out.contains("KALOS_LIBRARY") && out.contains("java.library.path"), out);
        out = runChild(Map.of("KALOS_LIBRARY", "/nonexistent/libkalos.so"), null);
        assertTrue(out.contains("error=") && out.contains("does not exist"), out);
        out = runChild(Map.of("KALOS_LIBRARY", "relative/libkalos.so"), null);
        assertTrue(out.contains("error=") && out.contains("absolute path"), out);
    }
}
