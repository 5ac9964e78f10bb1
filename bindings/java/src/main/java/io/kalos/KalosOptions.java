package io.kalos;

import java.nio.file.Path;
import java.util.Objects;

/**
 * Options of {@link Kalos#open(String, KalosOptions)}: immutable, built with {@link #builder()}.
 * Defaults are the library's (see {@code kalos_options} in {@code include/kalos.h}).
 *
 * <pre>{@code
 * KalosOptions o = KalosOptions.builder().role(KalosOptions.Role.CLIENT).timeoutMs(2000).build();
 * }</pre>
 */
public final class KalosOptions {
    /** Which side of the store a handle takes. */
    public enum Role {
        /** Attach to a live server, else become it (the embedded default). */
        AUTO(0),
        /** Create the store and run the server thread in this JVM. */
        SERVER(1),
        /** Attach to an existing server (e.g. {@code kalosd}). */
        CLIENT(2);
        final int code;
        Role(int c) { code = c; }
    }

    /** Similarity metric (fixed when the store is created). */
    public enum Metric {
        /** Inner product, higher is better. */
        IP(0),
        /** Cosine similarity, higher is better. */
        COSINE(1),
        /** Squared Euclidean distance, lower is better. */
        L2(2);
        final int code;
        Metric(int c) { code = c; }
    }

    /** Element type of the GPU copy of the table. */
    public enum Dtype {
        F32(0), F16(1), BF16(2);
        final int code;
        Dtype(int c) { code = c; }
    }

    /** Engine selection. */
    public enum Backend {
        AUTO(0), CPU(1), CUDA(2);
        final int code;
        Backend(int c) { code = c; }
    }

    /** Write-ahead log sync policy (with a data directory). */
    public enum SyncPolicy {
        ALWAYS(0), INTERVAL(1), NEVER(2);
        final int code;
        SyncPolicy(int c) { code = c; }
    }

    final Role role;
    final int dim;
    final Metric metric;
    final Dtype dtype;
    final Backend backend;
    final long capacity;
    final int slots;
    final int slotBytes;
    final int mode;
    final int maxPayloadBytes;
    final long clientSpinNs;
    final long serverSpinNs;
    final long timeoutMs;
    final long heartbeatTimeoutMs;
    final SyncPolicy sync;
    final long syncIntervalMs;
    final int threads;
    final long gpuMemoryBytes;
    final Path dataDir;
    final boolean ephemeral;
    final boolean scanInt8;
    final int rerank;
    final int deviceShards;
    final boolean placementNamespace;
    final long gpus;

    private KalosOptions(Builder b) {
        role = b.role;
        dim = b.dim;
        metric = b.metric;
        dtype = b.dtype;
        backend = b.backend;
        capacity = b.capacity;
        slots = b.slots;
        slotBytes = b.slotBytes;
        mode = b.mode;
        maxPayloadBytes = b.maxPayloadBytes;
        clientSpinNs = b.clientSpinNs;
        serverSpinNs = b.serverSpinNs;
        timeoutMs = b.timeoutMs;
        heartbeatTimeoutMs = b.heartbeatTimeoutMs;
        sync = b.sync;
        syncIntervalMs = b.syncIntervalMs;
        threads = b.threads;
        gpuMemoryBytes = b.gpuMemoryBytes;
        dataDir = b.dataDir;
        ephemeral = b.ephemeral;
        scanInt8 = b.scanInt8;
        rerank = b.rerank;
        deviceShards = b.deviceShards;
        placementNamespace = b.placementNamespace;
        gpus = b.gpus;
    }

    /** A builder with the library defaults. */
    public static Builder builder() {
        return new Builder();
    }

    /** The defaults (role AUTO; creating a store then needs a dimension). */
    public static KalosOptions defaults() {
        return new Builder().build();
    }

    public Role role() { return role; }
    public int dim() { return dim; }
    public Metric metric() { return metric; }
    public long timeoutMs() { return timeoutMs; }

    /** The layout {@code src/ffi/jni.rs} expects (OPT_LEN = 24 entries, in this order). */
    long[] toNative() {
        return new long[] {
            role.code, dim, metric.code, dtype.code, backend.code, capacity, slots, slotBytes, mode,
            maxPayloadBytes, clientSpinNs, serverSpinNs, timeoutMs, heartbeatTimeoutMs, sync.code,
            syncIntervalMs, threads, gpuMemoryBytes, ephemeral ? 1 : 0, scanInt8 ? 1 : 0, rerank,
            deviceShards, placementNamespace ? 1 : 0, gpus,
        };
    }

    /** Mutable builder; {@link #build()} snapshots it. */
    public static final class Builder {
        private Role role = Role.AUTO;
        private int dim = 0;
        private Metric metric = Metric.COSINE;
        private Dtype dtype = Dtype.F32;
        private Backend backend = Backend.AUTO;
        private long capacity = 1L << 20;
        private int slots = 32;
        private int slotBytes = 1 << 20;
        private int mode = 0600;
        private int maxPayloadBytes = 64 * 1024;
        private long clientSpinNs = 50_000;
        private long serverSpinNs = 2_000_000;
        private long timeoutMs = 5_000;
        private long heartbeatTimeoutMs = 10_000;
        private SyncPolicy sync = SyncPolicy.ALWAYS;
        private long syncIntervalMs = 100;
        private int threads = 0;
        private long gpuMemoryBytes = 0;
        private Path dataDir = null;
        private boolean ephemeral = false;
        private boolean scanInt8 = false;
        private int rerank = 0;
        private int deviceShards = 0;
        private boolean placementNamespace = false;
        private long gpus = 0;

        private Builder() {}

        public Builder role(Role v) { role = Objects.requireNonNull(v); return this; }
        /** Vector dimension: required to create a store; 0 (accept the server's) or equal to it for a client. */
        public Builder dim(int v) { dim = v; return this; }
        public Builder metric(Metric v) { metric = Objects.requireNonNull(v); return this; }
        public Builder dtype(Dtype v) { dtype = Objects.requireNonNull(v); return this; }
        public Builder backend(Backend v) { backend = Objects.requireNonNull(v); return this; }
        /** Maximum number of memories (default 1048576). */
        public Builder capacity(long v) { capacity = v; return this; }
        /** Request slots in the segment: concurrent requests in flight (default 32). */
        public Builder slots(int v) { slots = v; return this; }
        /** Data bytes per slot (default 1 MiB): bounds one request or response. */
        public Builder slotBytes(int v) { slotBytes = v; return this; }
        /** Permission bits of the segment (default 0600). */
        public Builder mode(int v) { mode = v; return this; }
        /** Largest payload per memory in bytes (default 65536). */
        public Builder maxPayloadBytes(int v) { maxPayloadBytes = v; return this; }
        /**
         * Client busy-wait before sleeping on the futex, ns (default 50000; 0 = sleep at once).
         * When the handle's recent answers took longer, the wait stretches to twice their time,
         * at most 500 µs.
         */
        public Builder clientSpinNs(long v) { clientSpinNs = v; return this; }
        /** Server busy-poll window after the last request, ns (default 2000000). */
        public Builder serverSpinNs(long v) { serverSpinNs = v; return this; }
        /** Default deadline of every call, ms (default 5000). */
        public Builder timeoutMs(long v) { timeoutMs = v; return this; }
        /** A server silent for longer is treated as gone, ms (default 10000). */
        public Builder heartbeatTimeoutMs(long v) { heartbeatTimeoutMs = v; return this; }
        public Builder sync(SyncPolicy v) { sync = Objects.requireNonNull(v); return this; }
        public Builder syncIntervalMs(long v) { syncIntervalMs = v; return this; }
        /** CPU engine threads (0 = all cores; on hosts of 8 or more cores, all but one, whose
         *  workers stay awake for {@code serverSpinNs} after each request). */
        public Builder threads(int v) { threads = v; return this; }
        /** GPU memory the CUDA engine may use, bytes (0 = 90% of free memory). */
        public Builder gpuMemoryBytes(long v) { gpuMemoryBytes = v; return this; }
        /**
         * Write-ahead log + snapshot directory. Null: role AUTO keeps the store in
         * {@code $XDG_DATA_HOME/kalos/<name>} (or {@code ~/.local/share/kalos/<name>}) unless
         * {@link #ephemeral(boolean)}; role SERVER keeps it in memory only.
         */
        public Builder dataDir(Path v) { dataDir = v; return this; }
        /**
         * Role AUTO without a data directory: keep the store in memory only, alive exactly as
         * long as its server process (default false: durable, and taken over by another process's
         * AUTO handle when the server's process exits).
         */
        public Builder ephemeral(boolean v) { ephemeral = v; return this; }
        /**
         * The int8 scan (CPU engine; single queries on the GPU): scan an 8-bit copy of the table and re-score the best
         * {@link #rerank(int)} candidates of each query exactly. Scores stay exact;
         * {@link Stats#rerankUncertain} counts answers that may have missed a true neighbour.
         */
        public Builder scanInt8(boolean v) { scanInt8 = v; return this; }
        /** Candidates re-scored per query by the int8 scan (0 = max(8k, 64); at most 65536). */
        public Builder rerank(int v) { rerank = v; return this; }
        /**
         * Shards the table is split into (default 0 = one table; at most 64): each shard has its own engine on its
         * own server thread, a recall scans them in parallel and merges their top-k exactly, so a sharded store
         * answers like an unsharded one. Sharded stores run on the CPU engine: {@link Backend#CUDA} with more than one
         * shard, and more than 64 shards, fail {@link Kalos#open} with {@link InvalidArgumentException}.
         * {@link Stats#engineName} of a sharded store starts with {@code "shards<N>x["}.
         */
        public Builder deviceShards(int v) { deviceShards = v; return this; }
        /**
         * With {@link #deviceShards(int)} above 1: place memories on shards by a hash of their namespace (a
         * namespace-scoped recall then scans only the shards holding those namespaces; one large namespace fills its
         * shard alone) instead of by a hash of their id (the default, false: balanced shards, every recall scans every
         * shard).
         */
        public Builder placementByNamespace(boolean v) { placementNamespace = v; return this; }
        /**
         * The GPUs of a CUDA store as a bit mask of device ordinals (bit i = device i; -1 = every device; 0 = device 0
         * alone). More than one device shards the table over them.
         */
        public Builder gpus(long mask) { gpus = mask; return this; }

        public KalosOptions build() {
            return new KalosOptions(this);
        }
    }
}
