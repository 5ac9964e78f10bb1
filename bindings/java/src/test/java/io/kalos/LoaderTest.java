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

/** Library loading, in child JVMs: KALOS_LIBRARY first, java.library.path next, clear errors. */
class LoaderTest {
    /** Entry point of the child JVM: prints the version or the loader's error. */
    public static final class Main {
        public static void main(String[] a) {
            try {
                System.out.println("version=" + Kalos.version());
            } catch (UnsatisfiedLinkError e) {
                System.out.println("error=" + e.getMessage());
            }
        }
    }

    static String runChild(Map<String, String> env, String libraryPath) throws IOException, InterruptedException {
        Path javaBin = Paths.get(System.getProperty("java.home"), "bin", "java");
        String cp = Paths.get("target/classes").toAbsolutePath() + java.io.File.pathSeparator
                + Paths.get("target/test-classes").toAbsolutePath();
        List<String> cmd = new ArrayList<>(List.of(javaBin.toString(), "-cp", cp));
        if (libraryPath != null) {
            cmd.add("-Djava.library.path=" + libraryPath);
        }
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
