import io.kalos.Kalos;
import io.kalos.KalosException;
import io.kalos.KalosOptions;
import io.kalos.RecallOptions;
import io.kalos.RecallResult;
import io.kalos.UpsertOptions;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Gateway-style use of Kalos from Java: an LLM gateway that, for every chat request, recalls the
 * user's own memories (one namespace per user, so a recall never sees another user's data),
 * builds the prompt from them, and stores the new turn as a memory.
 *
 * Run (from the repository root, after `cargo build --release` and `mvn -q -f bindings/java compile`):
 *
 *   java -Djava.library.path=target/release -cp bindings/java/target/classes examples/java/Gateway.java
 *
 * With no argument it opens the store with role AUTO (becomes the server in this JVM if no kalosd
 * serves it). Pass a store name served by `kalosd serve --name NAME --dim 256` to attach to it.
 *
 * The embedding function here is a toy (hashed bag of words) so the example runs with no model;
 * a real gateway calls its embedding model and passes the float[] as is.
 */
public final class Gateway {
    static final int DIM = 256;

    /** One Kalos handle for the whole gateway: thread-safe, opened once, closed at shutdown. */
    private final Kalos kalos;
    private final AtomicLong nextId = new AtomicLong(1);

    Gateway(Kalos kalos) {
        this.kalos = kalos;
    }

    /** Toy embedding: hashed bag of words, L2-normalised. Replace with the real model. */
    static float[] embed(String text) {
        float[] v = new float[DIM];
        for (String w : text.toLowerCase().split("\\W+")) {
            if (!w.isEmpty()) {
                int h = w.hashCode();
                v[Math.floorMod(h, DIM)] += 1f;
                v[Math.floorMod(h * 31 + 7, DIM)] += 0.5f;
            }
        }
        double n = 0;
        for (float x : v) {
            n += x * x;
        }
        if (n == 0) {
            v[0] = 1;
            return v;
        }
        for (int i = 0; i < DIM; i++) {
            v[i] /= (float) Math.sqrt(n);
        }
        return v;
    }

    /** Handles one chat request of {@code userId}: recall, build the prompt, remember the turn. */
    String handle(long userId, String message) {
        float[] q = embed(message);
        // Per-request recall scoped to this user's namespace, with the memory texts, bounded by a
        // 50 ms deadline so a slow memory store never stalls the request.
        RecallOptions scope = RecallOptions.namespaces(userId).withTimeoutMs(50);
        StringBuilder prompt = new StringBuilder("Relevant memories:\n");
        try {
            RecallResult r = kalos.recallWithPayloads(q, 3, scope);
            for (int i = 0; i < r.size(); i++) {
                prompt.append(String.format("  - (%.2f) %s%n", r.score(i), r.payloadText(i)));
            }
        } catch (KalosException e) {
            // Degrade gracefully: answer without memories (TIMEOUT, SERVER_GONE, ...).
            prompt.append("  (memory unavailable: ").append(e.status()).append(")\n");
        }
        prompt.append("User: ").append(message);
        // ... call the LLM with `prompt` here ...
        long id = nextId.getAndIncrement();
        kalos.upsert(id, q, UpsertOptions.namespace(userId)
                .withPayloads(message.getBytes(StandardCharsets.UTF_8))
                .withTtlMs(30L * 24 * 3600 * 1000)); // forget after 30 days
        return prompt.toString();
    }

    public static void main(String[] args) throws Exception {
        String name = args.length > 0 ? args[0] : "gateway-example-" + ProcessHandle.current().pid();
        KalosOptions opts = KalosOptions.builder().dim(DIM).metric(KalosOptions.Metric.COSINE).build();
        try (Kalos kalos = Kalos.open(name, opts)) {
            System.out.println("store " + name + " (server in this JVM: " + kalos.isServer() + ")");
            Gateway gw = new Gateway(kalos);
            List<String[]> history = List.of(
                    new String[] {"1", "My dog is called Pixel and she loves the beach"},
                    new String[] {"2", "I am allergic to peanuts"},
                    new String[] {"1", "I work as a nurse on night shifts"},
                    new String[] {"2", "My favourite city is Lisbon"},
                    new String[] {"1", "I am learning to play the cello"});
            for (String[] h : history) {
                gw.handle(Long.parseLong(h[0]), h[1]);
            }
            // Concurrent requests from many gateway worker threads, one shared handle.
            ExecutorService pool = Executors.newFixedThreadPool(4);
            Future<String> a = pool.submit(() -> gw.handle(1, "what should I do with my dog this weekend at the beach?"));
            Future<String> b = pool.submit(() -> gw.handle(2, "suggest a snack, remember my peanuts allergy"));
            Future<String> c = pool.submit(() -> gw.handle(3, "hello, I am new here"));
            System.out.println("--- user 1\n" + a.get());
            System.out.println("--- user 2\n" + b.get());
            System.out.println("--- user 3 (no memories yet)\n" + c.get());
            pool.shutdown();
            System.out.println("--- stats: " + kalos.stats());
            // GDPR-style erasure of one user: one call.
            System.out.println("forgot " + kalos.deleteNamespace(2) + " memories of user 2");
        }
    }
}
