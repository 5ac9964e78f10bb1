package io.kalos;

import static io.kalos.TestUtil.*;
import static org.junit.jupiter.api.Assertions.*;

import java.util.Random;
import org.junit.jupiter.api.Test;

/** The int8 scan through the Java binding: answers equal to an exact store's, and its stats. */
class Int8ScanTest {
    @Test
    void int8StoreAnswersLikeAnExactStore() {
        int dim = 24;
        int n = 2000;
        Random r = new Random(3);
        float[][] data = randomVectors(r, n, dim);
        long[] ids = new long[n];
        for (int i = 0; i < n; i++) {
            ids[i] = 5L * i;
        }
        KalosOptions int8 = KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(dim).metric(KalosOptions.Metric.IP)
                .backend(KalosOptions.Backend.CPU).capacity(10_000).scanInt8(true).rerank(100).build();
        try (Kalos ex = Kalos.open(uniqueName("exact"), server(dim, KalosOptions.Metric.IP));
             Kalos q8 = Kalos.open(uniqueName("int8"), int8)) {
            ex.upsert(ids, data, UpsertOptions.DEFAULT);
            q8.upsert(ids, data, UpsertOptions.DEFAULT);
            for (int t = 0; t < 10; t++) {
                float[] q = randomVectors(r, 1, dim)[0];
                RecallResult a = ex.recall(q, 10);
                RecallResult b = q8.recall(q, 10);
                assertArrayEquals(a.ids(), b.ids());
                assertArrayEquals(a.scores(), b.scores());
            }
            Stats s = q8.stats();
            assertTrue(s.engineName.contains("int8"), s.engineName);
            assertEquals(10, s.rerankQueries);
            assertTrue(s.rerankUncertain >= 0 && s.rerankUncertain <= 10);
            assertEquals(0, ex.stats().rerankQueries);
        }
    }
}
