package io.kalos;

import static io.kalos.TestUtil.*;
import static org.junit.jupiter.api.Assertions.*;

import io.kalos.KalosException.Status;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.LongBuffer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/** Every error the binding can be made to report, each with its status. */
class ErrorsTest {
    static final int DIM = 8;
    static Kalos k;
    static String name;

    @BeforeAll
    static void open() {
        name = uniqueName("err");
        k = Kalos.open(name, KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(DIM).metric(KalosOptions.Metric.IP)
                .backend(KalosOptions.Backend.CPU).capacity(100).maxPayloadBytes(16).build());
        k.upsert(1, unit(0));
    }

    @AfterAll
    static void close() {
        k.close();
    }

    static float[] unit(int i) {
        float[] v = new float[DIM];
        v[i] = 1;
        return v;
    }

    /** The exception class of each status family (the specification KalosException.of follows). */
    static Class<? extends KalosException> family(Status s) {
        switch (s) {
            case INVALID_ARGUMENT: case NULL_POINTER: case DIMENSION_MISMATCH: case K_OUT_OF_RANGE:
            case NON_FINITE: case INVALID_NAME: case BUFFER_TOO_SMALL: case PAYLOAD_TOO_LARGE: case TOO_LARGE:
                return InvalidArgumentException.class;
            case NOT_FOUND:
                return NotFoundException.class;
            case STORE_FULL:
                return StoreFullException.class;
            case TIMEOUT:
                return KalosTimeoutException.class;
            case SERVER_GONE:
                return ServerGoneException.class;
            case IO: case CORRUPT: case PERMISSION_DENIED:
                return KalosIOException.class;
            case UNAVAILABLE:
                return UnavailableException.class;
            case STALE:
                return StaleException.class;
            default:
                return KalosException.class;
        }
    }

    static void assertStatus(Status s, Executable e) {
        KalosException ex = assertThrows(KalosException.class, e);
        assertEquals(s, ex.status(), ex.getMessage());
        assertEquals(s.code(), ex.code());
        assertEquals(family(s), ex.getClass(), ex.getMessage());
        assertTrue(ex.getMessage().startsWith(s.name() + ": "), ex.getMessage());
        String rest = ex.getMessage().substring(s.name().length() + 2);
        for (Status other : Status.values()) {
            assertFalse(rest.startsWith(other.name() + ": "), "repeated prefix: " + ex.getMessage());
        }
    }

    @Test
    void everyStatusHasItsFamilyClass() {
        for (Status s : Status.values()) {
            KalosException ex = KalosException.of(s.code(), "boom");
            assertEquals(family(s), ex.getClass(), s.name());
            assertEquals(s, ex.status());
            assertEquals(s.name() + ": boom", ex.getMessage());
            // A message that already names its status is not prefixed again.
            assertEquals(s.name() + ": boom", KalosException.of(s, s.name() + ": boom").getMessage());
        }
        assertEquals(KalosException.class, KalosException.of(999, "x").getClass());
        assertEquals(Status.UNKNOWN, KalosException.of(999, "x").status());
    }

    @Test
    void wrongDimension() {
        assertStatus(Status.DIMENSION_MISMATCH, () -> k.recall(new float[DIM + 1], 1));
        assertStatus(Status.DIMENSION_MISMATCH, () -> k.recall(new float[0], 1));
        assertStatus(Status.DIMENSION_MISMATCH, () -> k.upsert(2, new float[DIM - 1]));
        assertStatus(Status.DIMENSION_MISMATCH, () -> k.upsert(new long[] {2, 3}, new float[DIM], UpsertOptions.DEFAULT));
        assertStatus(Status.DIMENSION_MISMATCH, () -> k.recallBatch(new float[DIM * 2 + 1], 2, 1, RecallOptions.ALL));
        assertStatus(Status.DIMENSION_MISMATCH, () -> k.recallBatch(new float[][] {new float[DIM], new float[3]}, 1, RecallOptions.ALL));
        assertStatus(Status.DIMENSION_MISMATCH,
                () -> Kalos.open(name, KalosOptions.builder().role(KalosOptions.Role.CLIENT).dim(DIM + 1).build()));
    }

    @Test
    void nonFinite() {
        float[] q = unit(1);
        q[3] = Float.NaN;
        assertStatus(Status.NON_FINITE, () -> k.recall(q, 1));
        float[] v = unit(1);
        v[0] = Float.POSITIVE_INFINITY;
        assertStatus(Status.NON_FINITE, () -> k.upsert(3, v));
        assertStatus(Status.NON_FINITE, () -> k.recallBatch(new float[][] {unit(0), q}, 1, RecallOptions.ALL));
    }

    @Test
    void kOutOfRange() {
        assertStatus(Status.K_OUT_OF_RANGE, () -> k.recall(unit(0), 0));
        assertStatus(Status.K_OUT_OF_RANGE, () -> k.recall(unit(0), -3));
        assertStatus(Status.K_OUT_OF_RANGE, () -> k.recall(unit(0), 1025));
        assertStatus(Status.K_OUT_OF_RANGE, () -> k.recallWithPayloads(unit(0), 0, RecallOptions.ALL));
        assertStatus(Status.K_OUT_OF_RANGE, () -> k.recallBatch(new float[][] {unit(0)}, 2000, RecallOptions.ALL));
        assertEquals(1, k.recall(unit(0), 1024).size());
    }

    @Test
    void badName() {
        for (String bad : new String[] {"", "a/b", ".hidden", "x".repeat(201), "spa ce"}) {
            assertStatus(Status.INVALID_NAME, () -> Kalos.open(bad, 4));
        }
        assertThrows(NullPointerException.class, () -> Kalos.open(null, 4));
    }

    @Test
    void notFound() {
        assertStatus(Status.NOT_FOUND, () -> Kalos.connect(uniqueName("nobody")));
        assertStatus(Status.NOT_FOUND, () -> k.delete(424242));
        assertStatus(Status.NOT_FOUND, () -> k.get(1, 424242));
        // delete is all or nothing: id 1 is still there.
        assertStatus(Status.NOT_FOUND, () -> k.delete(1, 424242));
        assertEquals(1, k.get(1).size());
    }

    @Test
    void alreadyExists() {
        assertStatus(Status.ALREADY_EXISTS, () -> Kalos.open(name, server(DIM, KalosOptions.Metric.IP)));
    }

    @Test
    void storeFull() {
        String n = uniqueName("full");
        try (Kalos s = Kalos.open(n, KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(2).capacity(4)
                .backend(KalosOptions.Backend.CPU).build())) {
            s.upsert(new long[] {1, 2, 3}, new float[] {1, 0, 0, 1, 1, 1}, UpsertOptions.DEFAULT);
            assertStatus(Status.STORE_FULL, () -> s.upsert(new long[] {4, 5}, new float[] {1, 2, 2, 1}, UpsertOptions.DEFAULT));
            assertEquals(3, s.stats().count, "nothing was written");
            s.upsert(4, new float[] {3, 1});
            assertStatus(Status.STORE_FULL, () -> s.upsert(5, new float[] {1, 3}));
            s.upsert(4, new float[] {1, 3}); // replacing still works when full
        }
    }

    @Test
    void payloadTooLarge() {
        assertEquals(16, k.maxPayloadBytes());
        assertStatus(Status.PAYLOAD_TOO_LARGE, () -> k.upsert(7, unit(2), UpsertOptions.DEFAULT.withPayloads(new byte[17])));
        k.upsert(7, unit(2), UpsertOptions.DEFAULT.withPayloads(new byte[16]));
        k.delete(7);
    }

    @Test
    void invalidArguments() {
        long[] many = new long[65];
        assertStatus(Status.INVALID_ARGUMENT, () -> k.recall(unit(0), 1, RecallOptions.namespaces(many)));
        assertStatus(Status.INVALID_ARGUMENT, () -> k.recall(unit(0), 1, RecallOptions.ALL.withRecency(2f, 1000)));
        assertStatus(Status.INVALID_ARGUMENT, () -> k.recall(unit(0), 1, RecallOptions.ALL.withRecency(0.5f, -1)));
        assertStatus(Status.INVALID_ARGUMENT, () -> k.recall(unit(0), 1, RecallOptions.ALL.withTimeoutMs(-1)));
        assertStatus(Status.INVALID_ARGUMENT,
                () -> k.upsert(8, unit(1), UpsertOptions.DEFAULT.withExpiresAtMs(System.currentTimeMillis() - 1000)));
        assertStatus(Status.INVALID_ARGUMENT,
                () -> k.upsert(new long[] {8, 9}, new float[2 * DIM], UpsertOptions.DEFAULT.withNamespaces(1)));
        assertStatus(Status.INVALID_ARGUMENT,
                () -> k.upsert(new long[] {8, 9}, new float[2 * DIM], UpsertOptions.DEFAULT.withPayloads(new byte[1])));
        assertStatus(Status.INVALID_ARGUMENT, () -> k.recallBatch(new float[0], 0, 1, RecallOptions.ALL));
        assertStatus(Status.INVALID_ARGUMENT, () -> Kalos.open(uniqueName("neg"),
                KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(4).capacity(-1).build()));
        assertStatus(Status.INVALID_ARGUMENT, () -> Kalos.open(uniqueName("nodim"),
                KalosOptions.builder().role(KalosOptions.Role.SERVER).build()));
    }

    @Test
    void buffers() {
        long[] ids = new long[4];
        float[] sc = new float[4];
        assertStatus(Status.BUFFER_TOO_SMALL, () -> k.recallInto(unit(0), 5, RecallOptions.ALL, ids, sc));
        FloatBuffer heap = FloatBuffer.allocate(DIM);
        LongBuffer di = ByteBuffer.allocateDirect(80).order(ByteOrder.nativeOrder()).asLongBuffer();
        FloatBuffer ds = ByteBuffer.allocateDirect(40).order(ByteOrder.nativeOrder()).asFloatBuffer();
        FloatBuffer dq = ByteBuffer.allocateDirect(DIM * 4).order(ByteOrder.nativeOrder()).asFloatBuffer();
        FloatBuffer wrongOrder = ByteBuffer.allocateDirect(DIM * 4).order(
                ByteOrder.nativeOrder() == ByteOrder.BIG_ENDIAN ? ByteOrder.LITTLE_ENDIAN : ByteOrder.BIG_ENDIAN).asFloatBuffer();
        assertThrows(IllegalArgumentException.class, () -> k.recallInto(heap, 1, RecallOptions.ALL, di, ds));
        assertThrows(IllegalArgumentException.class, () -> k.recallInto(wrongOrder, 1, RecallOptions.ALL, di, ds));
        // A misaligned view (byte offset 1) is refused, never read unaligned.
        ByteBuffer raw = ByteBuffer.allocateDirect(DIM * 4 + 1).order(ByteOrder.nativeOrder());
        raw.position(1);
        FloatBuffer mis = raw.slice().order(ByteOrder.nativeOrder()).asFloatBuffer();
        assertThrows(IllegalArgumentException.class, () -> k.recallInto(mis, 1, RecallOptions.ALL, di, ds));
        assertThrows(IllegalArgumentException.class, () -> k.recallInto(dq, 1, RecallOptions.ALL, di.asReadOnlyBuffer(), ds));
        // Overlapping outputs (two views of one buffer) are refused.
        ByteBuffer shared = ByteBuffer.allocateDirect(80).order(ByteOrder.nativeOrder());
        assertThrows(IllegalArgumentException.class,
                () -> k.recallInto(dq, 2, RecallOptions.ALL, shared.asLongBuffer(), shared.asFloatBuffer()));
        assertStatus(Status.BUFFER_TOO_SMALL, () -> k.recallInto(dq, 11, RecallOptions.ALL, di, ds));
        dq.position(1);
        assertStatus(Status.DIMENSION_MISMATCH, () -> k.recallInto(dq, 1, RecallOptions.ALL, di, ds));
        dq.position(0);
        dq.put(0, Float.NaN);
        assertStatus(Status.NON_FINITE, () -> k.recallInto(dq, 1, RecallOptions.ALL, di, ds));
        assertStatus(Status.K_OUT_OF_RANGE, () -> k.recallInto(dq, 0, RecallOptions.ALL, di, ds));
    }

    @Test
    void responseTooLargeForSlot() {
        try (Kalos s = Kalos.open(uniqueName("big"), KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(4)
                .backend(KalosOptions.Backend.CPU).slotBytes(4096).maxPayloadBytes(2048).build())) {
            byte[][] p = new byte[8][];
            long[] ids = new long[8];
            float[] v = new float[32];
            for (int i = 0; i < 8; i++) {
                p[i] = new byte[2000];
                ids[i] = i;
                v[4 * i] = 1 + i;
            }
            s.upsert(ids, v, UpsertOptions.DEFAULT.withPayloads(p));
            assertEquals(1, s.recallWithPayloads(new float[] {1, 0, 0, 0}, 1, RecallOptions.ALL).size());
            assertStatus(Status.TOO_LARGE, () -> s.recallWithPayloads(new float[] {1, 0, 0, 0}, 8, RecallOptions.ALL));
            assertEquals(8, s.get(ids).size(), "get splits its requests to fit the slot");
        }
    }

    @Test
    void cudaBackendUnavailableOrWorks() {
        try (Kalos s = Kalos.open(uniqueName("cuda"), KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(4)
                .backend(KalosOptions.Backend.CUDA).build())) {
            s.upsert(1, new float[] {1, 0, 0, 0});
            assertEquals(1, s.recall(new float[] {1, 0, 0, 0}, 1).id(0));
        } catch (KalosException e) {
            assertEquals(Status.BACKEND_UNAVAILABLE, e.status(), e.getMessage());
        }
    }

    @Test
    void corruptAndForeignSegments() throws Exception {
        // A file in /dev/shm that is not a Kalos segment: CORRUPT. One with another layout
        // version: VERSION_MISMATCH. Neither may crash the client.
        String n1 = uniqueName("corrupt");
        java.nio.file.Path p1 = java.nio.file.Paths.get("/dev/shm/kalos." + n1);
        byte[] junk = new byte[8192];
        java.util.Arrays.fill(junk, (byte) 0xAB);
        java.nio.file.Files.write(p1, junk);
        String n2 = uniqueName("version");
        java.nio.file.Path p2 = java.nio.file.Paths.get("/dev/shm/kalos." + n2);
        ByteBuffer b = ByteBuffer.allocate(8192).order(ByteOrder.LITTLE_ENDIAN);
        b.put("KALOSSHM".getBytes(java.nio.charset.StandardCharsets.US_ASCII));
        b.putInt(999); // layout_version
        java.nio.file.Files.write(p2, b.array());
        try {
            assertStatus(Status.CORRUPT, () -> Kalos.connect(n1));
            assertStatus(Status.VERSION_MISMATCH, () -> Kalos.connect(n2));
        } finally {
            java.nio.file.Files.deleteIfExists(p1);
            java.nio.file.Files.deleteIfExists(p2);
        }
    }

    @Test
    void panicBecomesException() {
        assertStatus(Status.PANIC, Native::debugPanic);
        // The library still works after a caught panic.
        assertEquals(1, k.recall(unit(0), 1).id(0));
    }

    @Test
    void closedHandle() {
        Kalos c = Kalos.open(uniqueName("closed"), server(4, KalosOptions.Metric.IP));
        c.upsert(1, new float[] {1, 0, 0, 0});
        c.close();
        c.close(); // idempotent
        assertTrue(c.isClosed());
        float[] q = {1, 0, 0, 0};
        FloatBuffer dq = ByteBuffer.allocateDirect(16).order(ByteOrder.nativeOrder()).asFloatBuffer();
        LongBuffer di = ByteBuffer.allocateDirect(8).order(ByteOrder.nativeOrder()).asLongBuffer();
        FloatBuffer ds = ByteBuffer.allocateDirect(4).order(ByteOrder.nativeOrder()).asFloatBuffer();
        Executable[] calls = {
            () -> c.recall(q, 1),
            () -> c.recallInto(q, 1, RecallOptions.ALL, new long[1], new float[1]),
            () -> c.recallInto(dq, 1, RecallOptions.ALL, di, ds),
            () -> c.recallWithPayloads(q, 1, RecallOptions.ALL),
            () -> c.recallBatch(new float[][] {q}, 1, RecallOptions.ALL),
            () -> c.upsert(2, q),
            () -> c.delete(1),
            () -> c.deleteNamespace(0),
            () -> c.clear(),
            () -> c.get(1),
            () -> c.stats(),
            () -> c.isServer(),
            () -> c.maxPayloadBytes(),
        };
        for (Executable e : calls) {
            assertThrows(IllegalStateException.class, e);
        }
    }

    @Test
    void serverClosedGivesServerGone() {
        String n = uniqueName("gone");
        Kalos srv = Kalos.open(n, server(4, KalosOptions.Metric.IP));
        Kalos cli = Kalos.connect(n);
        srv.upsert(1, new float[] {1, 0, 0, 0});
        assertEquals(1, cli.recall(new float[] {1, 0, 0, 0}, 1).size());
        srv.close();
        assertStatus(Status.SERVER_GONE, () -> cli.recall(new float[] {1, 0, 0, 0}, 1));
        cli.close();
    }
}
