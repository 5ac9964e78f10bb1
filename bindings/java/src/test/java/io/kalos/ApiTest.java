package io.kalos;

import static io.kalos.TestUtil.*;
import static org.junit.jupiter.api.Assertions.*;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.LongBuffer;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/** The whole API against an in-JVM server (role SERVER) and a second handle attached as CLIENT. */
class ApiTest {
    static final int DIM = 16;

    @Test
    void autoBackendReportsWhyTheGpuIsNotServing() {
        KalosOptions o = KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(8).capacity(1000).build();
        try (Kalos k = Kalos.open(uniqueName("auto"), o)) {
            Stats s = k.stats();
            assertTrue(s.engine == 2 || !s.fallbackReason.isEmpty(), s.toString());
        }
    }

    @Test
    void versionAndStatusNames() {
        assertFalse(Kalos.version().isEmpty());
        for (KalosException.Status s : KalosException.Status.values()) {
            if (s != KalosException.Status.UNKNOWN) {
                assertEquals(s.name(), Native.statusName(s.code()), "Rust's name of status " + s.code());
            }
        }
    }

    @ParameterizedTest
    @EnumSource(KalosOptions.Metric.class)
    void recallMatchesBruteForce(KalosOptions.Metric metric) {
        Random r = new Random(42 + metric.ordinal());
        int n = 500;
        float[][] data = randomVectors(r, n, DIM);
        long[] ids = new long[n];
        for (int i = 0; i < n; i++) {
            ids[i] = 1_000_000_000_000L + 7L * i;
        }
        String name = uniqueName("api");
        try (Kalos k = Kalos.open(name, server(DIM, metric))) {
            assertTrue(k.isServer());
            assertEquals(DIM, k.dim());
            assertEquals(name, k.name());
            k.upsert(ids, data, UpsertOptions.DEFAULT);
            assertEquals(n, k.stats().count);
            for (int t = 0; t < 20; t++) {
                float[] q = randomVectors(r, 1, DIM)[0];
                for (int kk : new int[] {1, 5, 10, 64}) {
                    RecallResult res = k.recall(q, kk);
                    assertMatchesReference(metric, q, data, ids, null, kk, res.ids(), res.scores(), res.size());
                }
            }
            // k larger than the table: returns every memory.
            RecallResult all = k.recall(data[0], 1024);
            assertEquals(n, all.size());
        }
    }

    @Test
    void recallIntoArraysAndDirectBuffers() {
        Random r = new Random(7);
        int n = 300;
        float[][] data = randomVectors(r, n, DIM);
        long[] ids = new long[n];
        for (int i = 0; i < n; i++) {
            ids[i] = i + 1;
        }
        try (Kalos k = Kalos.open(uniqueName("direct"), server(DIM, KalosOptions.Metric.IP))) {
            k.upsert(ids, flatten(data), UpsertOptions.DEFAULT);
            float[] q = randomVectors(r, 1, DIM)[0];
            RecallResult ref = k.recall(q, 10);

            long[] ia = new long[12];
            float[] sa = new float[12];
            assertEquals(10, k.recallInto(q, 10, RecallOptions.ALL, ia, sa));
            for (int i = 0; i < 10; i++) {
                assertEquals(ref.id(i), ia[i]);
                assertEquals(ref.score(i), sa[i]);
            }

            // Direct buffers, with non-zero positions: the query at position 3, results at 2.
            FloatBuffer qb = ByteBuffer.allocateDirect((DIM + 3) * 4).order(ByteOrder.nativeOrder()).asFloatBuffer();
            qb.position(3);
            qb.put(q);
            qb.position(3);
            LongBuffer ib = ByteBuffer.allocateDirect(12 * 8).order(ByteOrder.nativeOrder()).asLongBuffer();
            FloatBuffer sb = ByteBuffer.allocateDirect(12 * 4).order(ByteOrder.nativeOrder()).asFloatBuffer();
            ib.position(2);
            sb.position(2);
            assertEquals(10, k.recallInto(qb, 10, RecallOptions.ALL, ib, sb));
            assertEquals(3, qb.position(), "positions are not moved");
            assertEquals(2, ib.position());
            for (int i = 0; i < 10; i++) {
                assertEquals(ref.id(i), ib.get(2 + i));
                assertEquals(ref.score(i), sb.get(2 + i));
            }
        }
    }

    @Test
    void namespacesPayloadsGetDelete() {
        Random r = new Random(11);
        int n = 60;
        float[][] data = randomVectors(r, n, DIM);
        long[] ids = new long[n];
        long[] ns = new long[n];
        String[] texts = new String[n];
        for (int i = 0; i < n; i++) {
            ids[i] = 100 + i;
            ns[i] = i % 3; // users 0, 1, 2
            texts[i] = i % 5 == 0 ? null : "memory #" + i + " — ünïcode";
        }
        KalosOptions.Metric m = KalosOptions.Metric.COSINE;
        try (Kalos k = Kalos.open(uniqueName("ns"), server(DIM, m))) {
            k.upsert(ids, data, UpsertOptions.DEFAULT.withNamespaces(ns).withTextPayloads(texts));
            float[] q = randomVectors(r, 1, DIM)[0];

            // Namespace filter is exact (inside the scan).
            boolean[] inc = new boolean[n];
            for (int i = 0; i < n; i++) {
                inc[i] = ns[i] == 1;
            }
            RecallResult res = k.recall(q, 10, RecallOptions.namespaces(1));
            assertMatchesReference(m, q, data, ids, inc, 10, res.ids(), res.scores(), res.size());
            for (int i = 0; i < n; i++) {
                inc[i] = ns[i] != 0;
            }
            res = k.recall(q, 50, RecallOptions.namespaces(1, 2));
            assertMatchesReference(m, q, data, ids, inc, 50, res.ids(), res.scores(), res.size());
            assertEquals(40, res.size());

            // Payloads.
            RecallResult p = k.recallWithPayloads(q, 20, RecallOptions.ALL);
            RecallResult plain = k.recall(q, 20);
            assertEquals(20, p.size());
            assertTrue(p.hasPayloads());
            for (int i = 0; i < p.size(); i++) {
                assertEquals(plain.id(i), p.id(i));
                int idx = (int) (p.id(i) - 100);
                assertEquals(texts[idx], p.payloadText(i));
                if (texts[idx] != null) {
                    assertArrayEquals(texts[idx].getBytes(StandardCharsets.UTF_8), p.payload(i));
                }
            }

            // get: vectors as written (normalised for cosine), namespaces, payloads.
            List<Record> recs = k.get(105, 101, 159);
            assertEquals(3, recs.size());
            assertEquals(105, recs.get(0).id());
            assertEquals(ns[5], recs.get(0).namespace());
            assertNull(recs.get(0).payload());
            assertEquals(texts[1], recs.get(1).payloadText());
            assertEquals(-1, recs.get(2).expiresMs());
            assertTrue(recs.get(2).createdMs() > 0);
            float[] v = recs.get(1).vector();
            double cos = score(KalosOptions.Metric.COSINE, v, data[1]);
            assertEquals(1.0, cos, 1e-5);

            // delete, deleteNamespace, clear.
            assertEquals(2, k.delete(100, 101));
            assertEquals(n - 2, k.stats().count);
            long in2 = 0;
            for (int i = 2; i < n; i++) {
                if (ns[i] == 2) {
                    in2++;
                }
            }
            assertEquals(in2, k.deleteNamespace(2));
            assertEquals(0, k.recall(q, 10, RecallOptions.namespaces(2)).size());
            assertEquals(n - 2 - in2, k.clear());
            assertEquals(0, k.stats().count);
            assertEquals(0, k.recall(q, 10).size());
        }
    }

    @Test
    void upsertReplacesAndLastWins() {
        try (Kalos k = Kalos.open(uniqueName("upd"), server(4, KalosOptions.Metric.IP))) {
            k.upsert(1, new float[] {1, 0, 0, 0});
            k.upsert(1, new float[] {0, 1, 0, 0});
            k.upsert(new long[] {2, 2}, new float[] {0, 0, 1, 0, 0, 0, 0, 1}, UpsertOptions.namespace(9));
            assertEquals(2, k.stats().count);
            assertArrayEquals(new float[] {0, 1, 0, 0}, k.get(1).get(0).vector());
            assertArrayEquals(new float[] {0, 0, 0, 1}, k.get(2).get(0).vector());
            assertEquals(9, k.get(2).get(0).namespace());
            RecallResult r = k.recall(new float[] {0, 1, 0, 0}, 1);
            assertEquals(1, r.id(0));
            assertEquals(1.0f, r.score(0), 1e-6);
        }
    }

    @Test
    void batchMatchesSingle() {
        Random r = new Random(3);
        float[][] data = randomVectors(r, 200, DIM);
        long[] ids = new long[200];
        for (int i = 0; i < 200; i++) {
            ids[i] = i;
        }
        try (Kalos k = Kalos.open(uniqueName("batch"), server(DIM, KalosOptions.Metric.L2))) {
            k.upsert(ids, data, UpsertOptions.DEFAULT);
            float[][] qs = randomVectors(r, 33, DIM);
            RecallResult[] b = k.recallBatch(qs, 7, RecallOptions.ALL);
            assertEquals(33, b.length);
            for (int i = 0; i < qs.length; i++) {
                RecallResult s = k.recall(qs[i], 7);
                assertArrayEquals(s.ids(), b[i].ids(), "query " + i);
                assertArrayEquals(s.scores(), b[i].scores(), 1e-5f, "query " + i);
            }
        }
    }

    @Test
    void recencyAndExpiry() throws InterruptedException {
        try (Kalos k = Kalos.open(uniqueName("ttl"), server(4, KalosOptions.Metric.IP))) {
            k.upsert(1, new float[] {1, 0, 0, 0}, UpsertOptions.DEFAULT.withTtlMs(150));
            k.upsert(2, new float[] {0.5f, 0, 0, 0}, UpsertOptions.DEFAULT.withExpiresAtMs(System.currentTimeMillis() + 3_600_000));
            assertEquals(2, k.recall(new float[] {1, 0, 0, 0}, 5).size());
            long exp = k.get(1).get(0).expiresMs();
            assertTrue(exp > System.currentTimeMillis() - 1000 && exp < System.currentTimeMillis() + 1000, "expiry " + exp);
            Thread.sleep(400);
            RecallResult r = k.recall(new float[] {1, 0, 0, 0}, 5);
            assertEquals(1, r.size(), "expired memory is not recalled");
            assertEquals(2, r.id(0));
            // Recency weighting: with weight 1 the score is 2^(-age/halfLife) <= 1.
            RecallResult rr = k.recall(new float[] {1, 0, 0, 0}, 5, RecallOptions.ALL.withRecency(1.0f, 60_000));
            assertEquals(1, rr.size());
            assertTrue(rr.score(0) > 0.9f && rr.score(0) <= 1.0f, "recency score " + rr.score(0));
        }
    }

    @Test
    void clientHandleSeesServerData() {
        String name = uniqueName("cli");
        try (Kalos srv = Kalos.open(name, server(4, KalosOptions.Metric.IP))) {
            srv.upsert(5, new float[] {0, 0, 2, 0});
            try (Kalos cli = Kalos.connect(name)) {
                assertFalse(cli.isServer());
                assertEquals(4, cli.dim());
                assertEquals(5, cli.recall(new float[] {0, 0, 1, 0}, 1).id(0));
                cli.upsert(6, new float[] {0, 0, 3, 0});
                Stats s = cli.stats();
                assertEquals(2, s.count);
                assertEquals(ProcessHandle.current().pid(), s.serverPid);
                assertFalse(s.engineName.isEmpty());
                assertEquals("", s.fallbackReason, "an explicit CPU backend has no fallback");
            }
            assertEquals(6, srv.recall(new float[] {0, 0, 1, 0}, 1).id(0));
            // Role AUTO attaches to the live server.
            try (Kalos auto = Kalos.open(name, 4)) {
                assertFalse(auto.isServer());
            }
        }
    }

    @Test
    void autoRoleBecomesServer() {
        String name = uniqueName("auto");
        try (Kalos k = Kalos.open(name, 8)) {
            assertTrue(k.isServer());
            float[] v = new float[8];
            v[3] = 1;
            k.upsert(1, v);
            assertEquals(1, k.recall(v, 1).id(0));
        }
    }
}
