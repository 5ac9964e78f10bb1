import io.kalos.Kalos;
import io.kalos.KalosOptions;
import io.kalos.RecallOptions;
import io.kalos.RecallResult;
import io.kalos.Stats;
import io.kalos.UpsertOptions;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.LongBuffer;
import java.util.Arrays;
import java.util.Random;

/**
 * Recall round trip from Java to a kalosd in another process: p50/p99 of single-query recalls
 * through the three Java paths (RecallResult, recallInto arrays, direct buffers).
 *
 *   java -cp target/classes:bench RecallBench NAME N K ITERS WARMUP   (fills N vectors if empty)
 */
public final class RecallBench {
    interface Call {
        void run(int i);
    }

    static void measure(String label, int iters, int warmup, Call c, int k, int dim) {
        long[] lat = new long[iters];
        for (int i = 0; i < warmup + iters; i++) {
            long t0 = System.nanoTime();
            c.run(i);
            long t1 = System.nanoTime();
            if (i >= warmup) {
                lat[i - warmup] = t1 - t0;
            }
        }
        Arrays.sort(lat);
        double mean = Arrays.stream(lat).average().orElse(0);
        System.out.printf("%-12s min_us=%.2f p10_us=%.2f p50_us=%.2f p99_us=%.2f mean_us=%.2f iters=%d k=%d dim=%d%n", label,
                lat[0] / 1e3, lat[iters / 10] / 1e3, lat[iters / 2] / 1e3, lat[(int) (iters * 0.99)] / 1e3, mean / 1e3, iters, k, dim);
    }

    public static void main(String[] a) {
        String name = a[0];
        int n = Integer.parseInt(a[1]);
        int k = Integer.parseInt(a[2]);
        int iters = Integer.parseInt(a[3]);
        int warmup = Integer.parseInt(a[4]);
        try (Kalos kalos = Kalos.connect(name)) {
            int dim = kalos.dim();
            Random r = new Random(1);
            Stats st = kalos.stats();
            if (st.count == 0) {
                int chunk = 1000;
                for (int i0 = 0; i0 < n; i0 += chunk) {
                    int m = Math.min(chunk, n - i0);
                    long[] ids = new long[m];
                    float[] v = new float[m * dim];
                    for (int i = 0; i < m; i++) {
                        ids[i] = i0 + i;
                    }
                    for (int i = 0; i < v.length; i++) {
                        v[i] = (float) r.nextGaussian();
                    }
                    kalos.upsert(ids, v, UpsertOptions.DEFAULT);
                }
                st = kalos.stats();
            }
            System.out.println("# store " + name + ": count=" + st.count + " dim=" + dim + " engine=" + st.engineName);
            int nq = 256;
            float[][] qs = new float[nq][dim];
            for (float[] q : qs) {
                for (int j = 0; j < dim; j++) {
                    q[j] = r.nextFloat() * 2 - 1;
                }
            }
            long[] ids = new long[k];
            float[] scores = new float[k];
            FloatBuffer dq = ByteBuffer.allocateDirect(nq * dim * 4).order(ByteOrder.nativeOrder()).asFloatBuffer();
            for (float[] q : qs) {
                dq.put(q);
            }
            LongBuffer di = ByteBuffer.allocateDirect(k * 8).order(ByteOrder.nativeOrder()).asLongBuffer();
            FloatBuffer ds = ByteBuffer.allocateDirect(k * 4).order(ByteOrder.nativeOrder()).asFloatBuffer();
            FloatBuffer[] views = new FloatBuffer[nq];
            for (int i = 0; i < nq; i++) {
                dq.position(i * dim);
                views[i] = dq.slice();
            }
            long[] sink = new long[1];
            measure("java-result", iters, warmup, i -> {
                RecallResult res = kalos.recall(qs[i % nq], k);
                sink[0] += res.id(0);
            }, k, dim);
            measure("java-arrays", iters, warmup, i -> {
                kalos.recallInto(qs[i % nq], k, RecallOptions.ALL, ids, scores);
                sink[0] += ids[0];
            }, k, dim);
            measure("java-direct", iters, warmup, i -> {
                kalos.recallInto(views[i % nq], k, RecallOptions.ALL, di, ds);
                sink[0] += di.get(0);
            }, k, dim);
            if (sink[0] == 42) {
                System.out.println();
            }
        }
    }
}
