package io.kalos;

import java.lang.ref.Cleaner;
import java.lang.ref.Reference;
import java.nio.Buffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.LongBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.locks.Lock;
import java.util.concurrent.locks.ReentrantReadWriteLock;

/**
 * An open Kalos store: exact top-k recall over shared memory.
 *
 * <pre>{@code
 * try (Kalos kalos = Kalos.connect("memories")) {          // attach to a running kalosd
 *     RecallResult r = kalos.recall(queryEmbedding, 8, RecallOptions.namespaces(userId));
 *     for (int i = 0; i < r.size(); i++) System.out.println(r.id(i) + " " + r.score(i));
 * }
 * }</pre>
 *
 * <h2>Threads and lifecycle</h2>
 * A handle may be shared by any number of threads; every call is an independent request (the
 * library claims its own request slot per call). Calls hold the read side of a
 * {@link ReentrantReadWriteLock}; {@link #close()} takes the write side, so it waits for calls in
 * flight (each bounded by its deadline) and never frees the native handle under them.
 * {@code close()} is idempotent; any call after it throws {@link IllegalStateException}. A
 * {@link Cleaner} frees a handle that was never closed once it becomes unreachable, as a safety
 * net only: close handles deterministically with try-with-resources.
 *
 * <h2>Copies</h2>
 * The {@code float[]} recall variants copy the query once (JNI {@code GetFloatArrayRegion} into a
 * reused native buffer) before the request is sent, and copy the k results back; no Java array is
 * pinned and no JNI critical section is held while the thread waits for the server, so the GC is
 * never blocked by a recall. The {@link #recallInto(FloatBuffer, int, RecallOptions, LongBuffer,
 * FloatBuffer)} variant reads the query from and writes the results into direct NIO buffers with
 * no copy in JNI at all.
 *
 * <h2>Errors</h2>
 * Library errors throw {@link KalosException} with a {@link KalosException.Status}, as the
 * subclass of the status's family ({@link NotFoundException}, {@link KalosTimeoutException},
 * {@link ServerGoneException}, ...); a Rust panic inside the library becomes
 * {@code KalosException(PANIC)}, never a JVM abort.
 */
public final class Kalos implements AutoCloseable {
    private static final Cleaner CLEANER = Cleaner.create();

    /** The native handle, separate from {@code Kalos} so the Cleaner action does not keep it alive. */
    private static final class State implements Runnable {
        volatile long handle;

        State(long h) {
            handle = h;
        }

        @Override
        public void run() {
            long h = handle;
            handle = 0;
            if (h != 0) {
                Native.close(h);
            }
        }
    }

    private final State state;
    private final Cleaner.Cleanable cleanable;
    private final Lock readLock;
    private final Lock writeLock;
    private final String name;
    private final int dim;
    /** Per thread: the lag of its last stale-read recall on this handle ({@link #lastLag()}). */
    private final ThreadLocal<Lag> lastLag = new ThreadLocal<>();

    private Kalos(String name, long handle) {
        this.name = name;
        this.state = new State(handle);
        this.cleanable = CLEANER.register(this, state);
        ReentrantReadWriteLock rw = new ReentrantReadWriteLock();
        this.readLock = rw.readLock();
        this.writeLock = rw.writeLock();
        this.dim = Native.dim(handle);
    }

    /** Opens the store {@code name} with the given options (role AUTO by default). */
    public static Kalos open(String name, KalosOptions options) {
        Objects.requireNonNull(name, "name");
        Objects.requireNonNull(options, "options");
        NativeLoader.load();
        String dataDir = options.dataDir == null ? null : options.dataDir.toString();
        long h = Native.open(name, options.toNative(), dataDir);
        return new Kalos(name, h);
    }

    /** Opens {@code name} with role AUTO: attaches to a live server, else creates the store here. */
    public static Kalos open(String name, int dim) {
        return open(name, KalosOptions.builder().dim(dim).build());
    }

    /** Attaches to a running server (role CLIENT), e.g. a {@code kalosd}. */
    public static Kalos connect(String name) {
        return open(name, KalosOptions.builder().role(KalosOptions.Role.CLIENT).build());
    }

    /**
     * Where {@code libkalos.so} was loaded from: the path named by {@code -Dkalos.library} or
     * {@code KALOS_LIBRARY}, the URL of the copy bundled in the jar, or {@code java.library.path}.
     */
    public static String libraryPath() {
        return NativeLoader.source();
    }

    /** The library version, e.g. "0.1.0". */
    public static String version() {
        NativeLoader.load();
        return Native.version();
    }

    /** The store name. */
    public String name() {
        return name;
    }

    /** The store's vector dimension. */
    public int dim() {
        return dim;
    }

    /** True once {@link #close()} has been called. */
    public boolean isClosed() {
        return state.handle == 0;
    }

    private long acquire() {
        readLock.lock();
        long h = state.handle;
        if (h == 0) {
            readLock.unlock();
            throw new IllegalStateException("Kalos store \"" + name + "\" is closed");
        }
        return h;
    }

    private void release() {
        readLock.unlock();
        Reference.reachabilityFence(this);
    }

    /** True when this handle runs the server thread (role SERVER, or AUTO that became it). */
    public boolean isServer() {
        long h = acquire();
        try {
            return Native.isServer(h);
        } finally {
            release();
        }
    }

    /** Largest payload per memory, in bytes. */
    public int maxPayloadBytes() {
        long h = acquire();
        try {
            return Native.maxPayloadBytes(h);
        } finally {
            release();
        }
    }

    // ---------------------------------------------------------------------------------- recall

    /** Top-{@code k} over all namespaces. */
    public RecallResult recall(float[] query, int k) {
        return recall(query, k, RecallOptions.ALL);
    }

    /** Top-{@code k} (1..1024) for one query of {@link #dim()} floats. Copies the query once. */
    public RecallResult recall(float[] query, int k, RecallOptions options) {
        Objects.requireNonNull(query, "query");
        Objects.requireNonNull(options, "options");
        int cap = Math.max(0, Math.min(k, 1024));
        long[] ids = new long[cap];
        float[] scores = new float[cap];
        int n = recallInto(query, k, options, ids, scores);
        if (n < cap) {
            ids = Arrays.copyOf(ids, n);
            scores = Arrays.copyOf(scores, n);
        }
        return new RecallResult(ids, scores, null);
    }

    /**
     * Top-{@code k} into caller arrays (no result allocation): writes {@code n} ids and scores at
     * index 0 and returns {@code n = min(k, matching memories)}. Both arrays need at least
     * {@code k} entries. Copies the query once.
     */
    public int recallInto(float[] query, int k, RecallOptions options, long[] ids, float[] scores) {
        Objects.requireNonNull(query, "query");
        Objects.requireNonNull(options, "options");
        Objects.requireNonNull(ids, "ids");
        Objects.requireNonNull(scores, "scores");
        if (k > 0 && k <= 1024 && (ids.length < k || scores.length < k)) {
            throw KalosException.of(KalosException.Status.BUFFER_TOO_SMALL,
                    "ids/scores hold " + ids.length + "/" + scores.length + " entries; k = " + k);
        }
        long[] lag = options.allowStale() ? new long[2] : null;
        int n;
        long h = acquire();
        try {
            n = Native.recall(h, query, k, options.namespaces, options.filter, options.recencyWeight, options.recencyHalfLifeMs,
                    options.timeoutMs, options.consistency, options.minSeqs, ids, scores, lag);
        } finally {
            release();
        }
        noteLag(lag);
        return n;
    }

    /**
     * Zero-copy top-{@code k}: reads {@link #dim()} floats from {@code query} at its position and
     * writes up to {@code k} ids and scores at the positions of {@code ids} and {@code scores};
     * returns the hit count. Positions and limits are not changed. All three buffers must be
     * direct, in native byte order (e.g. {@code ByteBuffer.allocateDirect(n * 4)
     * .order(ByteOrder.nativeOrder()).asFloatBuffer()}), and {@code ids}/{@code scores} need
     * {@code k} remaining elements.
     */
    public int recallInto(FloatBuffer query, int k, RecallOptions options, LongBuffer ids, FloatBuffer scores) {
        Objects.requireNonNull(query, "query");
        Objects.requireNonNull(options, "options");
        Objects.requireNonNull(ids, "ids");
        Objects.requireNonNull(scores, "scores");
        checkDirect(query, query.order(), "query");
        checkDirect(ids, ids.order(), "ids");
        checkDirect(scores, scores.order(), "scores");
        if (ids.isReadOnly() || scores.isReadOnly()) {
            throw new IllegalArgumentException("ids and scores must be writable buffers");
        }
        if (query.remaining() < dim) {
            throw KalosException.of(KalosException.Status.DIMENSION_MISMATCH,
                    "query buffer has " + query.remaining() + " floats remaining; the store's dimension is " + dim);
        }
        if (k > 0 && k <= 1024 && (ids.remaining() < k || scores.remaining() < k)) {
            throw KalosException.of(KalosException.Status.BUFFER_TOO_SMALL,
                    "ids/scores buffers have " + ids.remaining() + "/" + scores.remaining() + " remaining; k = " + k);
        }
        long[] lag = options.allowStale() ? new long[2] : null;
        int n;
        long h = acquire();
        try {
            n = Native.recallDirect(h, query, query.position(), k, options.namespaces, options.filter, options.recencyWeight,
                    options.recencyHalfLifeMs, options.timeoutMs, options.consistency, options.minSeqs, ids, ids.position(),
                    scores, scores.position(), lag);
        } finally {
            release();
        }
        noteLag(lag);
        return n;
    }

    /** After a successful recall: the lag it reported ({@code lag} null: it did not allow stale reads). */
    private void noteLag(long[] lag) {
        if (lag != null) {
            lastLag.set(new Lag(lag[0], lag[1]));
        }
    }

    /**
     * The {@link Lag} that the calling thread's last recall on this handle with
     * {@link RecallOptions#withAllowStale()} reported: how far behind its log the replica that
     * answered was (cluster mode; {@code Lag(0, 0)} on a single host and for an up-to-date
     * replica). Null before such a recall, and after a {@link #recallWithPayloads} or
     * {@link #recallBatch} that allowed stale reads: the library reports the lag of single-query
     * recalls without payloads ({@code recall}, {@code recallInto}) only. Recalls that do not
     * allow stale reads leave it as it is.
     */
    public Lag lastLag() {
        return lastLag.get();
    }

    /**
     * This handle's write token (cluster mode): per shard (index = shard), the log sequence of
     * its last acknowledged write (unsigned), 0 for none. Pass it to
     * {@link RecallOptions#withMinSeqs(long...)} on a recall through any host, from any process
     * or language, to read these writes. Empty on a single host and before the first write.
     */
    public long[] writeSeqs() {
        long h = acquire();
        try {
            return Native.writeSeqs(h);
        } finally {
            release();
        }
    }

    private static void checkDirect(Buffer b, ByteOrder order, String what) {
        if (!b.isDirect()) {
            throw new IllegalArgumentException(what + " must be a direct buffer (ByteBuffer.allocateDirect)");
        }
        if (order != ByteOrder.nativeOrder()) {
            throw new IllegalArgumentException(what + " must be in native byte order (.order(ByteOrder.nativeOrder()))");
        }
    }

    /** Top-{@code k} with each hit's payload. */
    public RecallResult recallWithPayloads(float[] query, int k, RecallOptions options) {
        Objects.requireNonNull(query, "query");
        Objects.requireNonNull(options, "options");
        int cap = Math.max(0, Math.min(k, 1024));
        long[] ids = new long[cap];
        float[] scores = new float[cap];
        int[] lens = new int[cap + 1];
        byte[] packed;
        long h = acquire();
        try {
            packed = Native.recallPayloads(h, query, k, options.namespaces, options.filter, options.recencyWeight,
                    options.recencyHalfLifeMs, options.timeoutMs, options.consistency, options.minSeqs, ids, scores, lens);
        } finally {
            release();
        }
        if (options.allowStale()) {
            lastLag.remove();
        }
        int n = lens[0];
        byte[][] payloads = new byte[n][];
        int off = 0;
        for (int i = 0; i < n; i++) {
            int l = lens[1 + i];
            if (l >= 0) {
                payloads[i] = Arrays.copyOfRange(packed, off, off + l);
                off += l;
            }
        }
        return new RecallResult(Arrays.copyOf(ids, n), Arrays.copyOf(scores, n), payloads);
    }

    /** Top-{@code k} for each query; the server runs them as one batch (as few requests as the slot size allows). */
    public RecallResult[] recallBatch(float[][] queries, int k, RecallOptions options) {
        Objects.requireNonNull(queries, "queries");
        float[] flat = new float[queries.length * dim];
        for (int i = 0; i < queries.length; i++) {
            float[] q = Objects.requireNonNull(queries[i], "queries[i]");
            if (q.length != dim) {
                throw KalosException.of(KalosException.Status.DIMENSION_MISMATCH,
                        "query " + i + " has " + q.length + " values; the store's dimension is " + dim);
            }
            System.arraycopy(q, 0, flat, i * dim, dim);
        }
        return recallBatch(flat, queries.length, k, options);
    }

    /** Top-{@code k} for {@code nq} queries stored row-major in {@code queries} ({@code nq × dim} floats). */
    public RecallResult[] recallBatch(float[] queries, int nq, int k, RecallOptions options) {
        Objects.requireNonNull(queries, "queries");
        Objects.requireNonNull(options, "options");
        int kk = Math.max(0, Math.min(k, 1024));
        int nn = Math.max(nq, 0);
        if ((long) nn * kk > Integer.MAX_VALUE - 8) {
            throw KalosException.of(KalosException.Status.INVALID_ARGUMENT, "batch of " + nq + " x k=" + k + " results is too large");
        }
        long[] ids = new long[nn * kk];
        float[] scores = new float[nn * kk];
        int[] counts = new int[nn];
        long h = acquire();
        try {
            Native.recallBatch(h, queries, nq, k, options.namespaces, options.filter, options.recencyWeight, options.recencyHalfLifeMs,
                    options.timeoutMs, options.consistency, options.minSeqs, ids, scores, counts);
        } finally {
            release();
        }
        if (options.allowStale()) {
            lastLag.remove();
        }
        RecallResult[] out = new RecallResult[nn];
        for (int i = 0; i < nn; i++) {
            out[i] = new RecallResult(Arrays.copyOfRange(ids, i * kk, i * kk + counts[i]),
                    Arrays.copyOfRange(scores, i * kk, i * kk + counts[i]), null);
        }
        return out;
    }

    // ---------------------------------------------------------------------------------- writes

    /** Inserts or replaces one memory in namespace 0. */
    public void upsert(long id, float[] vector) {
        upsert(new long[] {id}, vector, UpsertOptions.DEFAULT);
    }

    /** Inserts or replaces one memory. */
    public void upsert(long id, float[] vector, UpsertOptions options) {
        upsert(new long[] {id}, vector, options);
    }

    /** Inserts or replaces {@code ids.length} memories, one vector each. */
    public void upsert(long[] ids, float[][] vectors, UpsertOptions options) {
        Objects.requireNonNull(ids, "ids");
        Objects.requireNonNull(vectors, "vectors");
        if (vectors.length != ids.length) {
            throw KalosException.of(KalosException.Status.INVALID_ARGUMENT, vectors.length + " vectors for " + ids.length + " ids");
        }
        float[] flat = new float[ids.length * dim];
        for (int i = 0; i < vectors.length; i++) {
            float[] v = Objects.requireNonNull(vectors[i], "vectors[i]");
            if (v.length != dim) {
                throw KalosException.of(KalosException.Status.DIMENSION_MISMATCH,
                        "vector " + i + " has " + v.length + " values; the store's dimension is " + dim);
            }
            System.arraycopy(v, 0, flat, i * dim, dim);
        }
        upsert(ids, flat, options);
    }

    /**
     * Inserts or replaces memories: {@code vectors} holds {@code ids.length × dim} floats,
     * row-major. A repeated id: the last occurrence wins. Returns once the write is applied
     * (durable per the sync policy with a data directory); every later recall sees it.
     */
    public void upsert(long[] ids, float[] vectors, UpsertOptions options) {
        Objects.requireNonNull(ids, "ids");
        Objects.requireNonNull(vectors, "vectors");
        Objects.requireNonNull(options, "options");
        byte[] packed = null;
        int[] lens = null;
        if (options.payloads != null) {
            lens = new int[options.payloads.length];
            int total = 0;
            for (int i = 0; i < lens.length; i++) {
                byte[] p = options.payloads[i];
                lens[i] = p == null ? -1 : p.length;
                total += p == null ? 0 : p.length;
            }
            packed = new byte[total];
            int off = 0;
            for (byte[] p : options.payloads) {
                if (p != null) {
                    System.arraycopy(p, 0, packed, off, p.length);
                    off += p.length;
                }
            }
        }
        long h = acquire();
        try {
            Native.upsert(h, ids, vectors, options.namespace, options.namespaces, packed, lens, options.ttlMs,
                    options.expiresAtMs, options.timeoutMs, options.fields);
        } finally {
            release();
        }
    }

    /**
     * Deletes ids, all or nothing: if any id is unknown nothing is deleted and the call throws
     * {@code KalosException(NOT_FOUND)} naming it. Returns the number deleted.
     */
    public long delete(long... ids) {
        Objects.requireNonNull(ids, "ids");
        long h = acquire();
        try {
            return Native.delete(h, ids, 0);
        } finally {
            release();
        }
    }

    /**
     * Deletes every memory that matches {@code filter} and, when {@code namespaces} are given,
     * lies in one of them. The server evaluates the filter, so any process deleting with the
     * same filter deletes the same memories. Returns how many were deleted.
     */
    public long deleteWhere(Filter filter, long... namespaces) {
        Objects.requireNonNull(filter, "filter");
        byte[] f = filter.encode();
        long h = acquire();
        try {
            return Native.deleteWhere(h, namespaces == null || namespaces.length == 0 ? null : namespaces, f);
        } finally {
            release();
        }
    }

    /**
     * One page of the ids of the live memories that {@code opts} selects, ascending (unsigned),
     * at most {@code limit} of them, and how many more match after the page's last id. The next
     * page is {@code listPage(opts.withAfter(last id), limit)} until {@link ListPage#isLast}. A
     * memory that lives and matches throughout is listed exactly once and no id twice; writes
     * between pages show in later pages. A limit of 0 only counts. Each request scans the table
     * once, so pages of thousands of ids are cheap and pages of one are not.
     */
    public ListPage listPage(ListOptions opts, int limit) {
        Objects.requireNonNull(opts, "opts");
        if (limit < 0) {
            throw new IllegalArgumentException("limit must be >= 0, got " + limit);
        }
        long[] remaining = new long[1];
        long[] ids;
        long h = acquire();
        try {
            ids = Native.list(h, opts.namespaces, opts.filter, opts.hasAfter, opts.after, limit, opts.timeoutMs, remaining);
        } finally {
            release();
        }
        return new ListPage(ids, remaining[0], limit);
    }

    /** Every id that {@code opts} selects, ascending (unsigned): {@link #listPage} in pages of 65536. */
    public long[] list(ListOptions opts) {
        final int page = 1 << 16;
        long[] all = new long[0];
        ListOptions o = opts;
        while (true) {
            ListPage p = listPage(o, page);
            long[] grown = java.util.Arrays.copyOf(all, all.length + p.ids.length);
            System.arraycopy(p.ids, 0, grown, all.length, p.ids.length);
            all = grown;
            if (p.isLast()) {
                return all;
            }
            o = o.withAfter(p.ids[p.ids.length - 1]);
        }
    }

    /** Deletes every memory of namespace {@code ns}; returns how many. */
    public long deleteNamespace(long ns) {
        long h = acquire();
        try {
            return Native.deleteNamespace(h, ns);
        } finally {
            release();
        }
    }

    /** Deletes every memory; returns how many. */
    public long clear() {
        long h = acquire();
        try {
            return Native.clear(h);
        } finally {
            release();
        }
    }

    // ---------------------------------------------------------------------------------- reads

    /** Fetches memories by id, in the order asked. An unknown id throws {@code KalosException(NOT_FOUND)}. */
    public List<Record> get(long... ids) {
        Objects.requireNonNull(ids, "ids");
        int n = ids.length;
        float[] vectors = new float[n * dim];
        long[] meta = new long[n * 3];
        int[] lens = new int[n];
        byte[] packed;
        long h = acquire();
        try {
            packed = Native.get(h, ids, vectors, meta, lens);
        } finally {
            release();
        }
        List<Record> out = new ArrayList<>(n);
        int off = 0;
        for (int i = 0; i < n; i++) {
            byte[] p = null;
            if (lens[i] >= 0) {
                p = Arrays.copyOfRange(packed, off, off + lens[i]);
                off += lens[i];
            }
            out.add(new Record(ids[i], meta[3 * i], Arrays.copyOfRange(vectors, i * dim, (i + 1) * dim), p,
                    meta[3 * i + 1], meta[3 * i + 2]));
        }
        return out;
    }

    /**
     * The metadata fields of memories by id, one map per id in the order asked (empty for a
     * memory without fields): int64 as Long, float64 as Double, timestamps as
     * {@link java.time.Instant}, tags as a sorted {@code List<String>}. An unknown id throws
     * {@link NotFoundException}.
     */
    public List<Map<String, Object>> getFields(long... ids) {
        Objects.requireNonNull(ids, "ids");
        int[] lens = new int[ids.length];
        byte[] packed;
        long h = acquire();
        try {
            packed = Native.getFields(h, ids, lens);
        } finally {
            release();
        }
        return Filter.decodeFields(packed, lens);
    }

    /** The server's statistics. */
    public Stats stats() {
        long[] v = new long[Stats.N];
        long[][] ops = new long[1][];
        String[] names;
        long h = acquire();
        try {
            names = Native.stats(h, v, ops);
        } finally {
            release();
        }
        return new Stats(v, names[0], names[1], ops[0]);
    }

    /**
     * Closes the handle: waits for calls in flight on other threads (each bounded by its
     * deadline), then frees the native handle. For the handle that runs the server thread this
     * stops the server (other clients get {@code SERVER_GONE}). Idempotent.
     */
    @Override
    public void close() {
        writeLock.lock();
        try {
            cleanable.clean();
        } finally {
            writeLock.unlock();
        }
    }

    @Override
    public String toString() {
        return "Kalos{name=" + name + ", dim=" + dim + (isClosed() ? ", closed" : "") + "}";
    }
}
