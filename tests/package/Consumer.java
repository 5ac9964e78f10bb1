import io.kalos.Kalos;
import io.kalos.KalosOptions;
import io.kalos.NotFoundException;
import io.kalos.RecallResult;

/**
 * A Java program outside the checkout with only the packaged jar on its classpath: the jar
 * loads the libkalos.so it carries (tests/package/run.sh). Usage: Consumer STORE_NAME VERSION
 */
public final class Consumer {
    public static void main(String[] args) {
        String name = args[0];
        if (!Kalos.version().equals(args[1])) {
            throw new AssertionError("library version " + Kalos.version() + ", expected " + args[1]);
        }
        if (!Kalos.libraryPath().startsWith("jar:file:")) {
            throw new AssertionError("libkalos.so did not come from the jar: " + Kalos.libraryPath());
        }
        KalosOptions o = KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(4)
                .metric(KalosOptions.Metric.IP).backend(KalosOptions.Backend.CPU).build();
        try (Kalos k = Kalos.open(name, o)) {
            k.upsert(10, new float[] {1, 0, 0, 0});
            k.upsert(20, new float[] {0, 1, 0, 0});
            k.upsert(30, new float[] {0, 0, 1, 0});
            RecallResult r = k.recall(new float[] {0, 0.2f, 0.9f, 0}, 2);
            if (r.size() != 2 || r.id(0) != 30 || r.id(1) != 20) {
                throw new AssertionError("recall gave " + java.util.Arrays.toString(r.ids()));
            }
            try {
                k.get(99);
                throw new AssertionError("get of an unknown id did not throw");
            } catch (NotFoundException expected) {
                // the typed exception of the NOT_FOUND family
            }
            System.out.println("java: ok, kalos " + Kalos.version() + " from " + Kalos.libraryPath()
                    + ", top ids " + r.id(0) + " " + r.id(1));
        }
    }
}
