package io.kalos;

import static io.kalos.TestUtil.*;
import static org.junit.jupiter.api.Assertions.*;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.LongBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

/** Many Java threads on one handle; close racing with calls in flight. */
class ThreadsTest {
    static final int DIM = 32;

    @Test
    void manyThreadsOneHandle() throws Exception {
        Random r = new Random(5);
        int n = 2000;
        float[][] data = randomVectors(r, n, DIM);
        long[] ids = new long[n];
        for (int i = 0; i < n; i++) {
            ids[i] = i * 3L + 1;
        }
        int nq = 64;
        float[][] qs = randomVectors(r, nq, DIM);
        try (Kalos srv = Kalos.open(uniqueName("mt"), server(DIM, KalosOptions.Metric.IP));
             Kalos k = Kalos.connect(srv.name())) {
            srv.upsert(ids, data, UpsertOptions.DEFAULT);
            RecallResult[] expected = new RecallResult[nq];
            for (int i = 0; i < nq; i++) {
                expected[i] = k.recall(qs[i], 10);
                assertMatchesReference(KalosOptions.Metric.IP, qs[i], data, ids, null, 10, expected[i].ids(),
                        expected[i].scores(), expected[i].size());
            }
            int threads = 16;
            int per = 400;
            ExecutorService ex = Executors.newFixedThreadPool(threads);
            CountDownLatch go = new CountDownLatch(1);
            List<Future<Integer>> fs = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                final int tt = t;
                fs.add(ex.submit(() -> {
                    go.await();
                    FloatBuffer dq = ByteBuffer.allocateDirect(DIM * 4).order(ByteOrder.nativeOrder()).asFloatBuffer();
                    LongBuffer di = ByteBuffer.allocateDirect(10 * 8).order(ByteOrder.nativeOrder()).asLongBuffer();
                    FloatBuffer ds = ByteBuffer.allocateDirect(10 * 4).order(ByteOrder.nativeOrder()).asFloatBuffer();
                    int ok = 0;
                    for (int i = 0; i < per; i++) {
                        int qi = (tt * 7 + i) % nq;
                        long[] got;
                        switch (i % 3) {
                            case 0:
                                got = k.recall(qs[qi], 10).ids();
                                break;
                            case 1: {
                                dq.clear();
                                dq.put(qs[qi]).flip();
                                int c = k.recallInto(dq, 10, RecallOptions.ALL, di, ds);
                                got = new long[c];
                                for (int j = 0; j < c; j++) {
                                    got[j] = di.get(j);
                                }
                                break;
                            }
                            default:
                                got = srv.recall(qs[qi], 10).ids(); // the server's own handle too
                        }
                        assertArrayEquals(expected[qi].ids(), got, "thread " + tt + " call " + i);
                        ok++;
                    }
                    return ok;
                }));
            }
            go.countDown();
            int total = 0;
            for (Future<Integer> f : fs) {
                total += f.get(120, TimeUnit.SECONDS);
            }
            ex.shutdown();
            assertEquals(threads * per, total);
        }
    }

    @Test
    void writersAndReadersConcurrently() throws Exception {
        try (Kalos k = Kalos.open(uniqueName("rw"), server(4, KalosOptions.Metric.IP))) {
            int threads = 8;
            int per = 200;
            ExecutorService ex = Executors.newFixedThreadPool(threads);
            List<Future<?>> fs = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                final long base = t * 1000L;
                fs.add(ex.submit(() -> {
                    for (int i = 0; i < per; i++) {
                        k.upsert(base + i, new float[] {1, (float) i, 0, 0}, UpsertOptions.namespace(base));
                        RecallResult r = k.recall(new float[] {0, 1, 0, 0}, 1, RecallOptions.namespaces(base));
                        assertEquals(base + i, r.id(0));
                    }
                    return null;
                }));
            }
            for (Future<?> f : fs) {
                f.get(120, TimeUnit.SECONDS);
            }
            ex.shutdown();
            assertEquals(threads * per, k.stats().count);
        }
    }

    @Test
    void moreThreadsThanSlots() throws Exception {
        // 4 request slots, 24 threads: callers wait for a free slot (bounded by the deadline).
        String name = uniqueName("slots");
        try (Kalos k = Kalos.open(name, KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(8)
                .metric(KalosOptions.Metric.IP).backend(KalosOptions.Backend.CPU).slots(4).build())) {
            for (int i = 0; i < 8; i++) {
                float[] v = new float[8];
                v[i] = 1;
                k.upsert(i, v);
            }
            ExecutorService ex = Executors.newFixedThreadPool(24);
            List<Future<?>> fs = new ArrayList<>();
            for (int t = 0; t < 24; t++) {
                final int tt = t;
                fs.add(ex.submit(() -> {
                    for (int i = 0; i < 300; i++) {
                        float[] q = new float[8];
                        q[(tt + i) % 8] = 1;
                        assertEquals((tt + i) % 8, k.recall(q, 1).id(0));
                    }
                    return null;
                }));
            }
            for (Future<?> f : fs) {
                f.get(120, TimeUnit.SECONDS);
            }
            ex.shutdown();
        }
    }

    @Test
    void cleanerFreesAnUnclosedHandle() throws Exception {
        // Safety net only: a server handle that is dropped without close() is freed by the
        // Cleaner once unreachable, which stops its server and removes the segment.
        String name = uniqueName("cleaner");
        openAndDrop(name);
        java.nio.file.Path seg = java.nio.file.Paths.get("/dev/shm/kalos." + name);
        for (int i = 0; i < 200 && java.nio.file.Files.exists(seg); i++) {
            System.gc();
            Thread.sleep(20);
        }
        assertFalse(java.nio.file.Files.exists(seg), "segment removed after the handle was collected");
    }

    private static void openAndDrop(String name) {
        Kalos k = Kalos.open(name, server(4, KalosOptions.Metric.IP));
        k.upsert(1, new float[] {1, 0, 0, 0});
        assertTrue(java.nio.file.Files.exists(java.nio.file.Paths.get("/dev/shm/kalos." + name)));
    }

    @Test
    void closeRacesWithCalls() throws Exception {
        for (int round = 0; round < 5; round++) {
            String name = uniqueName("race");
            Kalos srv = Kalos.open(name, server(8, KalosOptions.Metric.IP));
            srv.upsert(1, new float[] {1, 0, 0, 0, 0, 0, 0, 0});
            Kalos k = Kalos.connect(name);
            int threads = 8;
            ExecutorService ex = Executors.newFixedThreadPool(threads);
            AtomicLong ok = new AtomicLong();
            AtomicInteger closedSeen = new AtomicInteger();
            CountDownLatch started = new CountDownLatch(threads);
            List<Future<?>> fs = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                fs.add(ex.submit(() -> {
                    started.countDown();
                    float[] q = {1, 0, 0, 0, 0, 0, 0, 0};
                    while (true) {
                        try {
                            assertEquals(1, k.recall(q, 1).id(0));
                            ok.incrementAndGet();
                        } catch (IllegalStateException e) {
                            closedSeen.incrementAndGet();
                            return null;
                        }
                    }
                }));
            }
            started.await();
            Thread.sleep(20);
            // Several threads close at once while recalls are in flight.
            Thread c1 = new Thread(k::close);
            Thread c2 = new Thread(k::close);
            c1.start();
            c2.start();
            k.close();
            c1.join();
            c2.join();
            for (Future<?> f : fs) {
                f.get(30, TimeUnit.SECONDS);
            }
            ex.shutdown();
            assertEquals(threads, closedSeen.get());
            assertTrue(ok.get() > 0);
            srv.close();
        }
    }
}
