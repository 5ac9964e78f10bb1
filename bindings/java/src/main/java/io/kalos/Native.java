package io.kalos;

import java.nio.Buffer;

/** The JNI surface ({@code src/ffi/jni.rs}). Package-private: use {@link Kalos}. */
final class Native {
    static {
        NativeLoader.load();
        init(KalosException.class);
    }

    private Native() {}

    static native void init(Class<?> exceptionClass);

    static native String version();

    static native String statusName(int status);

    static native int debugPanic();

    static native long open(String name, long[] options, String dataDir);

    static native void close(long h);

    static native int dim(long h);

    static native int maxPayloadBytes(long h);

    static native boolean isServer(long h);

    // The recall options travel as (ns, filter, w, halfLife, timeoutMs, consistency, minSeqs);
    // lag, when not null, receives {entries, ms}.
    static native int recall(long h, float[] query, int k, long[] ns, byte[] filter, float w, double halfLife, long timeoutMs,
                             int consistency, long[] minSeqs, long[] ids, float[] scores, long[] lag);

    static native int recallDirect(long h, Buffer query, int qPos, int k, long[] ns, byte[] filter, float w, double halfLife,
                                   long timeoutMs, int consistency, long[] minSeqs, Buffer ids, int idsPos, Buffer scores,
                                   int scoresPos, long[] lag);

    static native byte[] recallPayloads(long h, float[] query, int k, long[] ns, byte[] filter, float w, double halfLife,
                                        long timeoutMs, int consistency, long[] minSeqs, long[] ids, float[] scores,
                                        int[] countAndLens);

    static native void recallBatch(long h, float[] queries, int nq, int k, long[] ns, byte[] filter, float w, double halfLife,
                                   long timeoutMs, int consistency, long[] minSeqs, long[] ids, float[] scores, int[] counts);

    static native long[] writeSeqs(long h);

    static native void upsert(long h, long[] ids, float[] vectors, long namespace, long[] namespaces, byte[] payloads,
                              int[] payloadLens, long ttlMs, long expiresAtMs, long timeoutMs, byte[] fields);

    static native long delete(long h, long[] ids, long timeoutMs);

    static native long deleteWhere(long h, long[] ns, byte[] filter);

    static native byte[] getFields(long h, long[] ids, int[] lens);

    static native long[] list(long h, long[] ns, byte[] filter, boolean hasAfter, long after, int limit, long timeoutMs,
                              long[] remaining);

    static native long deleteNamespace(long h, long namespace);

    static native long clear(long h);

    static native byte[] get(long h, long[] ids, float[] vectors, long[] meta, int[] lens);

    static native String[] stats(long h, long[] out, long[][] ops);

    static native String opName(int op);
}
