package io.kalos;

import java.util.Arrays;
import java.util.stream.Collectors;

/**
 * The Java side of the Python binding's cross-language cluster test
 * (bindings/python/tests/test_cluster.py). It attaches to one kalosd of a cluster as a client and
 * does one thing:
 *
 * <pre>
 *   ClusterPeer write STORE ID NAMESPACE V,V,...   upserts one memory; prints the handle's write
 *                                                  token (writeSeqs), comma-separated
 *   ClusterPeer read STORE NAMESPACE TOKEN V,V,...  one recall (k = 1) of NAMESPACE with TOKEN
 *                                                  (comma-separated; "" = none) as withMinSeqs;
 *                                                  prints the hit's id, or "none"
 * </pre>
 *
 * Compiled by Maven with the tests (so it keeps compiling) and by the Python test with javac.
 */
public final class ClusterPeer {
    private ClusterPeer() {}

    static float[] floats(String csv) {
        String[] f = csv.split(",");
        float[] v = new float[f.length];
        for (int i = 0; i < f.length; i++) {
            v[i] = Float.parseFloat(f[i]);
        }
        return v;
    }

    static long[] token(String csv) {
        return csv.isEmpty() ? new long[0] : Arrays.stream(csv.split(",")).mapToLong(Long::parseUnsignedLong).toArray();
    }

    public static void main(String[] args) {
        if (args.length != 5 || !(args[0].equals("write") || args[0].equals("read"))) {
            System.err.println("usage: ClusterPeer write STORE ID NAMESPACE V,V,... | read STORE NAMESPACE TOKEN V,V,...");
            System.exit(2);
        }
        KalosOptions o = KalosOptions.builder().role(KalosOptions.Role.CLIENT).timeoutMs(10_000).build();
        try (Kalos k = Kalos.open(args[1], o)) {
            if (args[0].equals("write")) {
                long id = Long.parseUnsignedLong(args[2]);
                k.upsert(new long[] {id}, floats(args[4]), UpsertOptions.DEFAULT.withNamespace(Long.parseUnsignedLong(args[3])));
                System.out.println(Arrays.stream(k.writeSeqs()).mapToObj(Long::toUnsignedString).collect(Collectors.joining(",")));
            } else {
                RecallOptions ro = RecallOptions.namespaces(Long.parseUnsignedLong(args[2])).withMinSeqs(token(args[3]));
                RecallResult r = k.recall(floats(args[4]), 1, ro);
                System.out.println(r.size() == 0 ? "none" : Long.toUnsignedString(r.id(0)));
            }
        } catch (KalosException e) {
            System.err.println("ClusterPeer: " + e.getMessage());
            System.exit(1);
        }
    }
}
