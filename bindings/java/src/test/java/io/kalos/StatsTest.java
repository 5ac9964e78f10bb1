package io.kalos;

import static io.kalos.TestUtil.*;
import static org.junit.jupiter.api.Assertions.*;

import java.util.HashMap;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** {@link Stats#requestsBy}: each answered request counted under its op and status. */
class StatsTest {
    @Test
    void countsRequestsByOpAndStatus() {
        try (Kalos k = Kalos.open(uniqueName("ops"), server(4, KalosOptions.Metric.IP))) {
            float[] v = {1, 0, 0, 0};
            k.upsert(1, v);
            k.upsert(2, v);
            for (int i = 0; i < 3; i++) {
                k.recall(v, 1);
            }
            assertThrows(NotFoundException.class, () -> k.get(99));
            Stats s = k.stats();
            Map<String, Long> by = new HashMap<>();
            for (OpCount c : s.requestsBy) {
                assertTrue(c.count > 0, c.toString());
                by.put(c.op + "/" + c.status, c.count);
            }
            // One stats request reads every counter, before it is counted itself.
            assertEquals(Map.of("upsert/OK", 2L, "recall/OK", 3L, "get/NOT_FOUND", 1L), by, s.requestsBy.toString());
            Stats again = k.stats();
            OpCount last = again.requestsBy.get(again.requestsBy.size() - 1);
            assertEquals("stats", last.op);
            assertEquals(KalosException.Status.OK, last.status);
            assertEquals(1, last.count);
        }
    }
}
