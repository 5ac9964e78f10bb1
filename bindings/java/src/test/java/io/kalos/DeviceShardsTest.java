package io.kalos;

import static io.kalos.TestUtil.*;
import static org.junit.jupiter.api.Assertions.*;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashSet;
import java.util.Random;
import java.util.Set;
import org.junit.jupiter.api.Test;

/**
 * Device shards ({@link KalosOptions.Builder#deviceShards(int)},
 * {@link KalosOptions.Builder#placementByNamespace(boolean)}): a sharded store answers every recall exactly like an
 * unsharded one holding the same memories (same ids, same scores, same order), with and without namespace filters,
 * single and batched. Vectors and queries hold small integers, so every ip and l2 score is exact in float whatever the
 * summation order, and ties are common: both stores must break them the same way (lower id first). The seed is in
 * every failure message; the system property or environment variable KALOS_TEST_SEED replays a run.
 */
class DeviceShardsTest {
    private static final int DIM = 16;
    private static final int ROWS = 4000;
    private static final int NAMESPACES = 12;

    private static long seed() {
        String s = System.getProperty("KALOS_TEST_SEED", System.getenv("KALOS_TEST_SEED"));
        return s != null && !s.isEmpty() ? Long.parseLong(s) : new Random().nextLong();
    }

    private static float[] intVectors(Random r, int n) {
        float[] v = new float[n * DIM];
        for (int i = 0; i < v.length; i++) {
            v[i] = r.nextInt(7) - 3;
        }
        return v;
    }

    private static KalosOptions.Builder options(KalosOptions.Metric metric) {
        return KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(DIM).metric(metric)
                .backend(KalosOptions.Backend.CPU).capacity(20_000);
    }

    /**
     * One random history of writes applied to both stores: upserts with payloads, a tenth replaced with new vectors
     * and namespaces (moving between shards under namespace placement), 300 deleted by id, one namespace deleted.
     * Returns the live count.
     */
    private static long writeSame(Random r, Kalos... stores) {
        long[] ids = new long[ROWS];
        Set<Long> seen = new HashSet<>();
        for (int i = 0; i < ROWS; i++) {
            do {
                ids[i] = 1 + (r.nextLong() >>> 24);
            } while (!seen.add(ids[i]));
        }
        float[] vecs = intVectors(r, ROWS);
        long[] ns = new long[ROWS];
        byte[][] payloads = new byte[ROWS][];
        for (int i = 0; i < ROWS; i++) {
            ns[i] = r.nextInt(NAMESPACES);
            payloads[i] = ("memory " + ids[i]).getBytes(StandardCharsets.UTF_8);
        }
        long[] again = Arrays.copyOf(ids, ROWS / 10);
        long[] againNs = new long[again.length];
        for (int i = 0; i < again.length; i++) {
            againNs[i] = r.nextInt(NAMESPACES);
        }
        float[] againVecs = intVectors(r, again.length);
        long[] gone = Arrays.copyOfRange(ids, ROWS - 300, ROWS);
        long live = -1;
        for (Kalos k : stores) {
            k.upsert(ids, vecs, UpsertOptions.DEFAULT.withNamespaces(ns).withPayloads(payloads));
            k.upsert(again, againVecs, UpsertOptions.DEFAULT.withNamespaces(againNs));
            assertEquals(gone.length, k.delete(gone));
            k.deleteNamespace(5);
            long count = k.stats().count;
            assertTrue(live < 0 || live == count, "counts differ");
            live = count;
        }
        return live;
    }

    /** All namespaces, or 1 to 3 namespaces, sometimes the deleted one or one never used. */
    private static RecallOptions randomNamespaces(Random r) {
        if (r.nextDouble() < 0.4) {
            return RecallOptions.ALL;
        }
        long[] ns = new long[1 + r.nextInt(3)];
        for (int i = 0; i < ns.length; i++) {
            ns[i] = r.nextInt(NAMESPACES + 2);
        }
        return RecallOptions.namespaces(ns);
    }

    private static void assertSame(RecallResult a, RecallResult b, String what) {
        assertArrayEquals(b.ids(), a.ids(), what + ": ids");
        assertArrayEquals(b.scores(), a.scores(), what + ": scores");
    }

    private static void checkSameAnswers(boolean byNamespace, KalosOptions.Metric metric) {
        long seed = seed();
        Random r = new Random(seed);
        String ctx = "seed " + seed + " (KALOS_TEST_SEED=" + seed + " to replay)";
        try (Kalos sharded = Kalos.open(uniqueName("shards3"), options(metric).deviceShards(3).placementByNamespace(byNamespace).build());
             Kalos plain = Kalos.open(uniqueName("plain"), options(metric).build())) {
            assertTrue(sharded.stats().engineName.startsWith("shards3x["), sharded.stats().engineName);
            assertFalse(plain.stats().engineName.startsWith("shards"), plain.stats().engineName);
            long live = writeSame(r, sharded, plain);
            assertTrue(live > ROWS / 2, ctx);
            for (int t = 0; t < 300; t++) {
                float[] q = intVectors(r, 1);
                int k = 1 + r.nextInt(50);
                RecallOptions o = randomNamespaces(r);
                RecallResult a = sharded.recall(q, k, o);
                assertSame(a, plain.recall(q, k, o), ctx + ", recall " + t);
                if (o == RecallOptions.ALL) {
                    assertEquals(Math.min(k, live), a.size(), ctx + ", recall " + t);
                }
            }
            for (int t = 0; t < 20; t++) {
                float[] q = intVectors(r, 1);
                int k = 1 + r.nextInt(50);
                RecallOptions o = randomNamespaces(r);
                RecallResult a = sharded.recallWithPayloads(q, k, o);
                RecallResult b = plain.recallWithPayloads(q, k, o);
                assertSame(a, b, ctx + ", recall with payloads " + t);
                for (int i = 0; i < a.size(); i++) {
                    assertArrayEquals(b.payload(i), a.payload(i), ctx + ", payload " + i);
                }
            }
            int hits = 0;
            for (int t = 0; t < 20; t++) {
                int nq = 2 + r.nextInt(38);
                float[] qs = intVectors(r, nq);
                int k = 1 + r.nextInt(50);
                RecallOptions o = randomNamespaces(r);
                RecallResult[] a = sharded.recallBatch(qs, nq, k, o);
                RecallResult[] b = plain.recallBatch(qs, nq, k, o);
                assertEquals(b.length, a.length);
                for (int i = 0; i < nq; i++) {
                    assertSame(a[i], b[i], ctx + ", batch " + t + " query " + i);
                    hits += a[i].size();
                }
            }
            assertTrue(hits > 0, ctx + ": no batch found any memory");
        }
    }

    @Test
    void shardedByIdAnswersLikeUnsharded() {
        checkSameAnswers(false, KalosOptions.Metric.IP);
    }

    @Test
    void shardedByNamespaceAnswersLikeUnsharded() {
        checkSameAnswers(true, KalosOptions.Metric.L2);
    }

    @Test
    void optionsAreChecked() {
        InvalidArgumentException e = assertThrows(InvalidArgumentException.class,
                () -> Kalos.open(uniqueName("shards65"), options(KalosOptions.Metric.IP).deviceShards(65).build()));
        assertTrue(e.getMessage().contains("device_shards = 65"), e.getMessage());
        assertThrows(InvalidArgumentException.class,
                () -> Kalos.open(uniqueName("shardsneg"), options(KalosOptions.Metric.IP).deviceShards(-1).build()));
        // A sharded CUDA store: one CUDA engine a shard where there is a GPU, else a clear error.
        try (Kalos g = Kalos.open(uniqueName("shardscuda"),
                options(KalosOptions.Metric.IP).deviceShards(2).backend(KalosOptions.Backend.CUDA).build())) {
            assertTrue(g.stats().engineName.startsWith("shards2x[cuda"), g.stats().engineName);
        } catch (KalosException x) {
            assertEquals(KalosException.Status.BACKEND_UNAVAILABLE, x.status(), x.getMessage());
        }
        // One shard is one table; the largest count opens.
        try (Kalos one = Kalos.open(uniqueName("shards1"), options(KalosOptions.Metric.IP).deviceShards(1).build());
             Kalos many = Kalos.open(uniqueName("shards64"),
                     options(KalosOptions.Metric.IP).deviceShards(64).placementByNamespace(true).build())) {
            assertFalse(one.stats().engineName.startsWith("shards"), one.stats().engineName);
            assertTrue(many.stats().engineName.startsWith("shards64x["), many.stats().engineName);
        }
    }
}
