package io.kalos;

import static io.kalos.TestUtil.*;
import static org.junit.jupiter.api.Assertions.*;

import io.kalos.KalosException.Status;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.LongBuffer;
import java.util.List;
import java.util.Random;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The cluster options of a recall (docs/CLUSTER.md) on a single host: read-your-writes, a write
 * token and stale reads are accepted and satisfied at once, the token is empty and the lag is
 * zero; bad tokens are refused. bindings/python/tests/test_cluster.py runs them against a
 * cluster, with {@link ClusterPeer} as one of the writers and readers.
 */
class ConsistencyTest {
    static final int DIM = 8;
    static final int N = 30;
    static Kalos k;
    static float[][] vecs;

    @BeforeAll
    static void open() {
        k = Kalos.open(uniqueName("cons"), server(DIM, KalosOptions.Metric.COSINE));
        vecs = randomVectors(new Random(5), N, DIM);
        long[] ids = new long[N];
        for (int i = 0; i < N; i++) {
            ids[i] = i + 1;
        }
        k.upsert(ids, vecs, UpsertOptions.DEFAULT);
    }

    @AfterAll
    static void close() {
        k.close();
    }

    /** Sequences no log has reached: a recall that waited for them would throw TIMEOUT. */
    static final long[] FAR = {1L << 62, 1L << 62, 1L << 62};

    @Test
    void optionsAreSatisfiedAtOnceOnASingleHost() {
        float[] q = vecs[4];
        RecallResult want = k.recall(q, 5);
        assertEquals(5, want.id(0));
        RecallOptions base = RecallOptions.ALL.withTimeoutMs(2000);
        for (RecallOptions o : List.of(base.withReadYourWrites(), base.withMinSeqs(FAR), base.withMinSeqs(), base.withAllowStale(),
                base.withReadYourWrites().withAllowStale().withMinSeqs(FAR).withNamespaces(0))) {
            RecallResult r = k.recall(q, 5, o);
            assertArrayEquals(want.ids(), r.ids());
            assertArrayEquals(want.scores(), r.scores());
            assertArrayEquals(want.ids(), k.recallWithPayloads(q, 5, o).ids());
            RecallResult[] b = k.recallBatch(new float[][] {vecs[0], vecs[1]}, 5, o);
            assertEquals(1, b[0].id(0));
            assertEquals(2, b[1].id(0));
        }
    }

    @Test
    void writeTokenIsEmptyOnASingleHost() {
        assertArrayEquals(new long[0], k.writeSeqs());
        k.upsert(100, vecs[0]);
        assertArrayEquals(new long[0], k.writeSeqs());
    }

    @Test
    void lastLagIsPerThreadAndZeroOnASingleHost() throws Exception {
        // Every test may run on its own thread; start from a thread of this test's own.
        AtomicReference<Throwable> failure = new AtomicReference<>();
        Thread t = new Thread(() -> {
            try {
                float[] q = vecs[0];
                assertNull(k.lastLag());
                k.recall(q, 3);
                assertNull(k.lastLag(), "a recall without withAllowStale reports no lag");
                k.recall(q, 3, RecallOptions.ALL.withAllowStale());
                assertEquals(new Lag(0, 0), k.lastLag());
                k.recall(q, 3);
                assertEquals(new Lag(0, 0), k.lastLag(), "a recall without withAllowStale leaves it as it is");
                // The zero-copy recall reports it too.
                FloatBuffer qb = ByteBuffer.allocateDirect(DIM * 4).order(ByteOrder.nativeOrder()).asFloatBuffer();
                qb.put(q).flip();
                LongBuffer ids = ByteBuffer.allocateDirect(3 * 8).order(ByteOrder.nativeOrder()).asLongBuffer();
                FloatBuffer sc = ByteBuffer.allocateDirect(3 * 4).order(ByteOrder.nativeOrder()).asFloatBuffer();
                k.recallWithPayloads(q, 3, RecallOptions.ALL.withAllowStale());
                assertNull(k.lastLag(), "payload recalls report no lag");
                assertEquals(3, k.recallInto(qb, 3, RecallOptions.ALL.withAllowStale(), ids, sc));
                assertEquals(new Lag(0, 0), k.lastLag());
                k.recallBatch(new float[][] {q}, 3, RecallOptions.ALL.withAllowStale());
                assertNull(k.lastLag(), "batches report no lag");
                k.recallInto(q, 3, RecallOptions.ALL.withAllowStale(), new long[3], new float[3]);
                assertEquals(new Lag(0, 0), k.lastLag());
            } catch (Throwable e) {
                failure.set(e);
            }
        });
        t.start();
        t.join();
        if (failure.get() != null) {
            throw new AssertionError(failure.get());
        }
        assertNull(k.lastLag(), "another thread's lag is its own");
    }

    @Test
    void badTokensAreRefused() {
        float[] q = vecs[0];
        RecallOptions big = RecallOptions.ALL.withMinSeqs(new long[4097]);
        for (org.junit.jupiter.api.function.Executable e : List.<org.junit.jupiter.api.function.Executable>of(
                () -> k.recall(q, 3, big), () -> k.recallWithPayloads(q, 3, big),
                () -> k.recallBatch(new float[][] {q}, 3, big))) {
            ErrorsTest.assertStatus(Status.INVALID_ARGUMENT, e);
            InvalidArgumentException ex = assertThrows(InvalidArgumentException.class, e);
            assertTrue(ex.getMessage().contains("min_seqs has 4097 entries; at most 4096"), ex.getMessage());
        }
        assertEquals(1, k.recall(q, 3, RecallOptions.ALL.withMinSeqs(new long[4096])).id(0));
    }

    @Test
    void withMinSeqsCopiesTheToken() {
        long[] tok = {0, 0, 0};
        RecallOptions o = RecallOptions.ALL.withMinSeqs(tok);
        tok[0] = 1L << 62; // would make a cluster recall wait; the options keep their own copy
        assertArrayEquals(new long[] {0, 0, 0}, o.minSeqs);
    }

    @Test
    void clusterStatusesAreTypedExceptions() {
        KalosException u = KalosException.of(Status.UNAVAILABLE, "no quorum");
        assertInstanceOf(UnavailableException.class, u);
        assertEquals("UNAVAILABLE: no quorum", u.getMessage());
        KalosException s = KalosException.of(26, "shard 1 behind");
        assertInstanceOf(StaleException.class, s);
        assertEquals(Status.STALE, s.status());
    }
}
