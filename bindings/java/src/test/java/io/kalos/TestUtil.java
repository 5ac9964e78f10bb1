package io.kalos;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/** Helpers shared by the tests: unique names, brute-force reference, .npy writer, kalosd child. */
final class TestUtil {
    private static final AtomicInteger SEQ = new AtomicInteger();

    private TestUtil() {}

    /** A store name unique to this JVM and call. */
    static String uniqueName(String tag) {
        return "jt-" + tag + "-" + ProcessHandle.current().pid() + "-" + SEQ.incrementAndGet() + "-"
                + Long.toHexString(System.nanoTime() & 0xffffff);
    }

    static Path root() {
        String r = System.getProperty("kalos.root");
        if (r == null) {
            r = "../..";
        }
        return Paths.get(r).toAbsolutePath().normalize();
    }

    static Path kalosd() {
        String env = System.getenv("KALOSD");
        if (env != null && !env.isEmpty()) {
            return Paths.get(env);
        }
        Path rel = root().resolve("target/release/kalosd");
        if (Files.isExecutable(rel)) {
            return rel;
        }
        return root().resolve("target/debug/kalosd");
    }

    static KalosOptions server(int dim, KalosOptions.Metric metric) {
        return KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(dim).metric(metric).backend(KalosOptions.Backend.CPU)
                .capacity(10_000).slots(32).build();
    }

    static float[][] randomVectors(Random r, int n, int dim) {
        float[][] v = new float[n][dim];
        for (float[] row : v) {
            for (int j = 0; j < dim; j++) {
                row[j] = (float) r.nextGaussian();
            }
        }
        return v;
    }

    static float[] flatten(float[][] v) {
        int dim = v[0].length;
        float[] f = new float[v.length * dim];
        for (int i = 0; i < v.length; i++) {
            System.arraycopy(v[i], 0, f, i * dim, dim);
        }
        return f;
    }

    static double score(KalosOptions.Metric m, float[] q, float[] x) {
        double dot = 0, qq = 0, xx = 0, l2 = 0;
        for (int i = 0; i < q.length; i++) {
            dot += (double) q[i] * x[i];
            qq += (double) q[i] * q[i];
            xx += (double) x[i] * x[i];
            double d = (double) q[i] - x[i];
            l2 += d * d;
        }
        switch (m) {
            case IP: return dot;
            case COSINE: return dot / (Math.sqrt(qq) * Math.sqrt(xx));
            default: return l2;
        }
    }

    /** Brute-force top-k: indices into {@code data}, best first, ties by lower id. */
    static int[] bruteTopK(KalosOptions.Metric m, float[] q, float[][] data, long[] ids, boolean[] include, int k) {
        List<Integer> idx = new ArrayList<>();
        double[] s = new double[data.length];
        for (int i = 0; i < data.length; i++) {
            if (include == null || include[i]) {
                idx.add(i);
                s[i] = score(m, q, data[i]);
            }
        }
        boolean lower = m == KalosOptions.Metric.L2;
        Collections.sort(idx, (a, b) -> {
            int c = lower ? Double.compare(s[a], s[b]) : Double.compare(s[b], s[a]);
            return c != 0 ? c : Long.compareUnsigned(ids[a], ids[b]);
        });
        int n = Math.min(k, idx.size());
        int[] out = new int[n];
        for (int i = 0; i < n; i++) {
            out[i] = idx.get(i);
        }
        return out;
    }

    /**
     * Checks a recall result against brute force: same length, and at every rank the returned
     * score equals the reference score (1e-4 relative), and each returned id's true score equals
     * its returned score. Robust to exact ties, strict on everything else.
     */
    static void assertMatchesReference(KalosOptions.Metric m, float[] q, float[][] data, long[] ids, boolean[] include,
                                       int k, long[] gotIds, float[] gotScores, int n) {
        // The top k + 1: the last one is only for the near-tie check below.
        int[] ext = bruteTopK(m, q, data, ids, include, k + 1);
        int[] ref = Arrays.copyOf(ext, Math.min(k, ext.length));
        assertEquals(ref.length, n, "hit count");
        java.util.Map<Long, Integer> pos = new java.util.HashMap<>();
        for (int i = 0; i < ids.length; i++) {
            pos.put(ids[i], i);
        }
        for (int i = 0; i < n; i++) {
            double refScore = score(m, q, data[ref[i]]);
            double tol = 1e-4 * Math.max(1.0, Math.abs(refScore));
            assertEquals(refScore, gotScores[i], tol, "score at rank " + i);
            Integer p = pos.get(gotIds[i]);
            assertTrue(p != null, "unknown id " + gotIds[i] + " at rank " + i);
            if (include != null) {
                assertTrue(include[p], "id " + gotIds[i] + " is outside the filter");
            }
            assertEquals(score(m, q, data[p]), gotScores[i], tol, "true score of id " + gotIds[i]);
        }
        if (n > 0 && Arrays.stream(ref).distinct().count() == n) {
            // Exact ids when the reference has no near-ties around the returned ranks, the
            // last one and the first row left out included.
            boolean nearTie = false;
            for (int i = 0; i + 1 < ext.length; i++) {
                if (Math.abs(score(m, q, data[ext[i]]) - score(m, q, data[ext[i + 1]])) < 1e-5) {
                    nearTie = true;
                }
            }
            if (!nearTie) {
                for (int i = 0; i < n; i++) {
                    assertEquals(ids[ref[i]], gotIds[i], "id at rank " + i);
                }
            }
        }
    }

    // ---------------------------------------------------------------------------------- .npy

    /** Writes a C-order .npy v1.0 file: {@code descr} is e.g. "<f4" or "<u8". */
    static void writeNpy(Path path, String descr, int[] shape, ByteBuffer data) throws IOException {
        StringBuilder sh = new StringBuilder("(");
        for (int s : shape) {
            sh.append(s).append(", ");
        }
        if (shape.length > 1) {
            sh.setLength(sh.length() - 2);
        } else {
            sh.setLength(sh.length() - 1);
        }
        sh.append(")");
        String dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + sh + ", }";
        int total = 10 + dict.length() + 1;
        int pad = (64 - total % 64) % 64;
        String header = dict + " ".repeat(pad) + "\n";
        try (OutputStream o = Files.newOutputStream(path)) {
            o.write(new byte[] {(byte) 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0});
            int hl = header.length();
            o.write(new byte[] {(byte) (hl & 0xff), (byte) (hl >> 8)});
            o.write(header.getBytes(StandardCharsets.US_ASCII));
            data.rewind();
            byte[] b = new byte[data.remaining()];
            data.get(b);
            o.write(b);
        }
    }

    static void writeF32Npy(Path path, float[][] v) throws IOException {
        int dim = v[0].length;
        ByteBuffer b = ByteBuffer.allocate(v.length * dim * 4).order(ByteOrder.LITTLE_ENDIAN);
        for (float[] row : v) {
            for (float x : row) {
                b.putFloat(x);
            }
        }
        writeNpy(path, "<f4", new int[] {v.length, dim}, b);
    }

    static void writeU64Npy(Path path, long[] v) throws IOException {
        ByteBuffer b = ByteBuffer.allocate(v.length * 8).order(ByteOrder.LITTLE_ENDIAN);
        for (long x : v) {
            b.putLong(x);
        }
        writeNpy(path, "<u8", new int[] {v.length}, b);
    }

    // ---------------------------------------------------------------------------------- kalosd

    /** A kalosd child process serving a store; stdout/stderr are drained into {@link #log}. */
    static final class Kalosd implements AutoCloseable {
        final Process process;
        final String name;
        final StringBuffer log = new StringBuffer();

        Kalosd(String name, List<String> args) throws IOException, InterruptedException {
            this.name = name;
            List<String> cmd = new ArrayList<>();
            cmd.add(kalosd().toString());
            cmd.add("serve");
            cmd.add("--name");
            cmd.add(name);
            cmd.addAll(args);
            ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true);
            pb.environment().put("KALOS_BACKEND", "cpu");
            process = pb.start();
            CountDownLatch ready = new CountDownLatch(1);
            Thread t = new Thread(() -> {
                try (BufferedReader r = new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
                    String line;
                    while ((line = r.readLine()) != null) {
                        log.append(line).append('\n');
                        if (line.startsWith("kalosd: serving")) {
                            ready.countDown();
                        }
                    }
                } catch (IOException e) {
                    log.append("reader: ").append(e).append('\n');
                }
                ready.countDown();
            }, "kalosd-log-" + name);
            t.setDaemon(true);
            t.start();
            if (!ready.await(60, TimeUnit.SECONDS) || !process.isAlive()) {
                process.destroyForcibly();
                throw new IllegalStateException("kalosd did not start: " + cmd + "\n" + log);
            }
        }

        /** SIGKILL and reap; removes the stale segment and election lock it leaves behind. */
        void kill() throws InterruptedException {
            process.destroyForcibly();
            process.waitFor(10, TimeUnit.SECONDS);
            for (String f : new String[] {"/dev/shm/kalos." + name, "/dev/shm/kalos." + name + ".lock"}) {
                try {
                    Files.deleteIfExists(Paths.get(f));
                } catch (IOException ignored) {
                    // best effort
                }
            }
        }

        @Override
        public void close() {
            try {
                if (process.isAlive()) {
                    process.destroy(); // SIGTERM: clean stop
                    if (!process.waitFor(10, TimeUnit.SECONDS)) {
                        kill();
                    }
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                process.destroyForcibly();
            }
        }
    }
}
