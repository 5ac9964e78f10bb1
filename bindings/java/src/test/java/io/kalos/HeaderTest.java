package io.kalos;

import static org.junit.jupiter.api.Assertions.*;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/** The Java enums must match the C ABI's constants in include/kalos.h. */
class HeaderTest {
    static Map<String, Long> defines() throws Exception {
        Path h = TestUtil.root().resolve("include/kalos.h");
        Pattern p = Pattern.compile("^#define\\s+KALOS_([A-Z0-9_]+)\\s+(-?\\d+)\\s*$");
        Map<String, Long> m = new HashMap<>();
        for (String line : Files.readAllLines(h)) {
            Matcher mm = p.matcher(line.trim());
            if (mm.matches()) {
                m.put(mm.group(1), Long.parseLong(mm.group(2)));
            }
        }
        assertFalse(m.isEmpty(), "no #define KALOS_* in " + h);
        return m;
    }

    /** Members of {@code enum kalos_status_code}: {@code KALOS_<NAME> = <n>,}. */
    static Map<String, Long> statusCodes() throws Exception {
        String h = Files.readString(TestUtil.root().resolve("include/kalos.h"));
        Matcher body = Pattern.compile("(?s)enum kalos_status_code\\b[^{]*\\{(.*?)\\};").matcher(h);
        assertTrue(body.find(), "enum kalos_status_code not found in kalos.h");
        Matcher mm = Pattern.compile("(?m)^\\s*KALOS_([A-Z0-9_]+)\\s*=\\s*(\\d+)\\s*,").matcher(body.group(1));
        Map<String, Long> m = new HashMap<>();
        while (mm.find()) {
            m.put(mm.group(1), Long.parseLong(mm.group(2)));
        }
        assertFalse(m.isEmpty(), "no status codes parsed");
        return m;
    }

    @Test
    void statusEnumMatchesHeader() throws Exception {
        Map<String, Long> d = statusCodes();
        int seen = 0;
        for (KalosException.Status s : KalosException.Status.values()) {
            if (s == KalosException.Status.UNKNOWN) {
                continue;
            }
            assertEquals(d.get(s.name()), Long.valueOf(s.code()), "KALOS_" + s.name());
            seen++;
        }
        for (Map.Entry<String, Long> e : d.entrySet()) {
            KalosException.Status s = KalosException.Status.valueOf(e.getKey());
            assertEquals(e.getValue().longValue(), s.code(), "Java Status." + s);
        }
        assertEquals(d.size(), seen, "one Java Status for each KALOS_ status of the header");
    }

    @Test
    void optionEnumsMatchHeader() throws Exception {
        Map<String, Long> d = defines();
        for (KalosOptions.Role x : KalosOptions.Role.values()) {
            assertEquals(d.get("ROLE_" + x.name()), Long.valueOf(x.code), x.toString());
        }
        for (KalosOptions.Metric x : KalosOptions.Metric.values()) {
            assertEquals(d.get("METRIC_" + x.name()), Long.valueOf(x.code), x.toString());
        }
        for (KalosOptions.Dtype x : KalosOptions.Dtype.values()) {
            assertEquals(d.get("DTYPE_" + x.name()), Long.valueOf(x.code), x.toString());
        }
        for (KalosOptions.Backend x : KalosOptions.Backend.values()) {
            assertEquals(d.get("BACKEND_" + x.name()), Long.valueOf(x.code), x.toString());
        }
        for (KalosOptions.SyncPolicy x : KalosOptions.SyncPolicy.values()) {
            assertEquals(d.get("SYNC_" + x.name()), Long.valueOf(x.code), x.toString());
        }
        assertEquals(1024L, d.get("MAX_K"));
        // KalosOptions.toNative writes placementByNamespace as these values.
        assertEquals(0L, d.get("PLACEMENT_ID"));
        assertEquals(1L, d.get("PLACEMENT_NAMESPACE"));
        assertEquals(64L, d.get("MAX_DEVICE_SHARDS"));
    }
}
