package io.kalos;

import static io.kalos.TestUtil.*;
import static org.junit.jupiter.api.Assertions.*;

import io.kalos.KalosException.Status;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Java reads what another process and language wrote: kalosd (Rust) loads .npy files written here
 * and serves them; Java recalls over shared memory and checks against brute force. Then the
 * kalosd child is killed and the client must get SERVER_GONE (not hang).
 */
class CrossLanguageTest {
    @TempDir
    Path tmp;

    @Test
    void javaReadsWhatKalosdLoaded() throws Exception {
        int n = 3000;
        int dim = 48;
        Random r = new Random(2026);
        float[][] data = randomVectors(r, n, dim);
        long[] ids = new long[n];
        long[] ns = new long[n];
        for (int i = 0; i < n; i++) {
            ids[i] = (1L << 40) + 13L * i;
            ns[i] = i % 4;
        }
        Path v = tmp.resolve("v.npy");
        Path idp = tmp.resolve("ids.npy");
        Path nsp = tmp.resolve("ns.npy");
        writeF32Npy(v, data);
        writeU64Npy(idp, ids);
        writeU64Npy(nsp, ns);
        String name = uniqueName("xl");
        try (TestUtil.Kalosd d = new TestUtil.Kalosd(name, List.of("--dim", String.valueOf(dim), "--metric", "cosine",
                "--backend", "cpu", "--load", v.toString(), "--ids", idp.toString(), "--namespaces", nsp.toString()));
             Kalos k = Kalos.connect(name)) {
            assertFalse(k.isServer());
            assertEquals(dim, k.dim());
            Stats s = k.stats();
            assertEquals(n, s.count);
            assertEquals(d.process.pid(), s.serverPid);
            for (int t = 0; t < 50; t++) {
                float[] q = randomVectors(r, 1, dim)[0];
                RecallResult res = k.recall(q, 10);
                assertMatchesReference(KalosOptions.Metric.COSINE, q, data, ids, null, 10, res.ids(), res.scores(), res.size());
                boolean[] inc = new boolean[n];
                for (int i = 0; i < n; i++) {
                    inc[i] = ns[i] == 3;
                }
                res = k.recall(q, 10, RecallOptions.namespaces(3));
                assertMatchesReference(KalosOptions.Metric.COSINE, q, data, ids, inc, 10, res.ids(), res.scores(), res.size());
            }
            // The vectors kalosd stored are the ones written (normalised for cosine).
            List<Record> recs = k.get(ids[17], ids[2999]);
            assertEquals(1.0, score(KalosOptions.Metric.COSINE, recs.get(0).vector(), data[17]), 1e-5);
            assertEquals(ns[2999], recs.get(1).namespace());
            // A self-match: querying with a stored vector finds it first.
            assertEquals(ids[1234], k.recall(data[1234], 1).id(0));
        }
    }

    /**
     * Java writes fields into a kalosd-served store; kalosd's own client ({@code kalosd query},
     * Rust, JSON filters) recalls and deletes by filter; Java sees the result.
     */
    @Test
    void kalosdQueryFiltersWhatJavaWrote() throws Exception {
        String name = uniqueName("xq");
        try (TestUtil.Kalosd d = new TestUtil.Kalosd(name, List.of("--dim", "2", "--metric", "ip", "--backend", "cpu"));
             Kalos k = Kalos.connect(name)) {
            long[] ids = new long[20];
            float[] vecs = new float[40];
            List<java.util.Map<String, Object>> fields = new java.util.ArrayList<>();
            for (int i = 0; i < 20; i++) {
                ids[i] = 100 + i;
                vecs[2 * i] = i;
                vecs[2 * i + 1] = 1;
                fields.add(java.util.Map.of("user", i % 2 == 0 ? "ann" : "bob", "n", (long) i,
                        "tags", i % 5 == 0 ? List.of("urgent") : List.of("low")));
            }
            k.upsert(ids, vecs, UpsertOptions.DEFAULT.withFields(fields));
            ProcessBuilder pb = new ProcessBuilder(kalosd().toString(), "query", "--name", name);
            Process p = pb.start();
            try (var w = new java.io.OutputStreamWriter(p.getOutputStream(), java.nio.charset.StandardCharsets.UTF_8)) {
                w.write("{\"op\": \"recall\", \"query\": [1, 0], \"k\": 3, \"filter\": {\"user\": \"ann\", \"n\": {\"$lt\": 15}}}\n");
                w.write("{\"op\": \"delete\", \"filter\": {\"$or\": [{\"tags\": {\"$contains\": \"urgent\"}}, {\"n\": {\"$gte\": 18}}]}}\n");
            }
            List<String> out = new String(p.getInputStream().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8)
                    .lines().toList();
            assertEquals(0, p.waitFor(), String.join("\n", out));
            assertEquals("{\"hits\":[{\"id\":114,\"score\":14.0},{\"id\":112,\"score\":12.0},{\"id\":110,\"score\":10.0}],\"ok\":true}",
                    out.get(0));
            assertEquals("{\"deleted\":6,\"ok\":true}", out.get(1)); // 0, 5, 10, 15, 18, 19
            assertEquals(14, k.stats().count);
            assertEquals(0, k.recall(new float[] {1, 0}, 20, RecallOptions.filter(Filter.contains("tags", "urgent"))).size());
        }
    }

    @Test
    void killedServerGivesServerGone() throws Exception {
        String name = uniqueName("kill");
        TestUtil.Kalosd d = new TestUtil.Kalosd(name, List.of("--dim", "4", "--metric", "ip", "--backend", "cpu"));
        try (Kalos k = Kalos.open(name, KalosOptions.builder().role(KalosOptions.Role.CLIENT).timeoutMs(3000).build())) {
            k.upsert(1, new float[] {1, 0, 0, 0});
            assertEquals(1, k.recall(new float[] {1, 0, 0, 0}, 1).id(0));
            d.kill();
            long t0 = System.nanoTime();
            KalosException e = assertThrows(KalosException.class, () -> k.recall(new float[] {1, 0, 0, 0}, 1));
            long ms = (System.nanoTime() - t0) / 1_000_000;
            assertEquals(Status.SERVER_GONE, e.status(), e.getMessage());
            assertTrue(ms < 3000, "SERVER_GONE after " + ms + " ms");
            assertThrows(KalosException.class, () -> k.upsert(2, new float[] {0, 1, 0, 0}));
        } finally {
            d.kill();
        }
    }

    @Test
    void frozenServerGivesTimeoutThenRecovers() throws Exception {
        String name = uniqueName("stop");
        TestUtil.Kalosd d = new TestUtil.Kalosd(name, List.of("--dim", "4", "--metric", "ip", "--backend", "cpu"));
        try (Kalos k = Kalos.connect(name)) {
            k.upsert(1, new float[] {1, 0, 0, 0});
            signal("STOP", d.process.pid()); // alive, heartbeat fresh, but not answering
            long t0 = System.nanoTime();
            KalosException e = assertThrows(KalosException.class,
                    () -> k.recall(new float[] {1, 0, 0, 0}, 1, RecallOptions.ALL.withTimeoutMs(200)));
            long ms = (System.nanoTime() - t0) / 1_000_000;
            assertEquals(Status.TIMEOUT, e.status(), e.getMessage());
            assertTrue(ms >= 150 && ms < 2000, "TIMEOUT after " + ms + " ms");
            signal("CONT", d.process.pid());
            assertEquals(1, k.recall(new float[] {1, 0, 0, 0}, 1).id(0), "works again after the server resumes");
        } finally {
            signal("CONT", d.process.pid());
            d.kill();
        }
    }

    static void signal(String sig, long pid) throws Exception {
        new ProcessBuilder("kill", "-" + sig, Long.toString(pid)).inheritIO().start().waitFor();
        if (sig.equals("STOP")) {
            // Delivery is asynchronous: wait until every thread of the process is stopped.
            long deadline = System.nanoTime() + 5_000_000_000L;
            while (System.nanoTime() < deadline) {
                boolean all = true;
                try (var tasks = Files.list(Path.of("/proc/" + pid + "/task"))) {
                    for (Path t : (Iterable<Path>) tasks::iterator) {
                        String st = Files.readString(t.resolve("stat"));
                        char state = st.charAt(st.lastIndexOf(')') + 2);
                        all &= state == 'T' || state == 't';
                    }
                }
                if (all) {
                    return;
                }
                Thread.sleep(1);
            }
            throw new IllegalStateException("process " + pid + " did not stop");
        }
    }

    @Test
    void stoppedServerGivesServerGone() throws Exception {
        String name = uniqueName("term");
        TestUtil.Kalosd d = new TestUtil.Kalosd(name, List.of("--dim", "4", "--metric", "ip", "--backend", "cpu"));
        try (Kalos k = Kalos.connect(name)) {
            k.upsert(1, new float[] {1, 0, 0, 0});
            d.close(); // SIGTERM: clean stop
            KalosException e = assertThrows(KalosException.class, () -> k.recall(new float[] {1, 0, 0, 0}, 1));
            assertEquals(Status.SERVER_GONE, e.status(), e.getMessage());
            assertFalse(Files.exists(Path.of("/dev/shm/kalos." + name)), "segment removed on clean stop");
        } finally {
            d.kill();
        }
    }
}
