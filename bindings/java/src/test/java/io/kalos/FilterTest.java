package io.kalos;

import static io.kalos.TestUtil.*;
import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.nio.file.Files;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.function.IntPredicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/** Filter builders (bytes shared with Python and Go), fields, filtered recall, deleteWhere. */
class FilterTest {
    static final int DIM = 8;

    /** The filters of tests/data/filter_vectors.jsonl, built with the Java builders. */
    static Map<String, Filter> cases() {
        Map<String, Filter> m = new LinkedHashMap<>();
        m.put("eq_keyword", Filter.eq("user", "ann"));
        m.put("eq_int", Filter.eq("n", 42));
        m.put("eq_negative_int", Filter.eq("n", -7L));
        m.put("eq_float", Filter.eq("score", 0.5));
        m.put("eq_bool", Filter.eq("done", true));
        m.put("eq_timestamp", Filter.eq("at", Instant.parse("2024-01-02T03:04:05Z")));
        m.put("lt_timestamp_before_1970", Filter.lt("at", Instant.parse("1969-12-31T23:59:59.999500Z")));
        m.put("ne", Filter.ne("user", "bob"));
        m.put("gt_float", Filter.gt("score", 1.25));
        m.put("lte_int", Filter.lte("n", -3));
        m.put("range", Filter.and(Filter.gte("n", 3), Filter.lt("n", 9)));
        m.put("in", Filter.in("kind", "fact", "pref"));
        m.put("in_list_shorthand", Filter.in("n", 1, 2));
        m.put("nin", Filter.nin("n", 1, 2, 3));
        m.put("in_empty", Filter.in("kind"));
        m.put("nin_empty", Filter.nin("kind"));
        m.put("exists", Filter.exists("archived"));
        m.put("not_exists", Filter.not(Filter.exists("archived")));
        m.put("contains", Filter.contains("tags", "urgent"));
        m.put("field_not", Filter.not(Filter.eq("user", "ann")));
        m.put("and_flat", Filter.and(Filter.eq("a", 1), Filter.and(Filter.eq("b", 2), Filter.eq("c", 3))));
        m.put("or", Filter.or(Filter.eq("user", "ann"), Filter.eq("agent", "x")));
        m.put("nested", Filter.and(Filter.or(Filter.eq("user", "ann"), Filter.contains("tags", "urgent")),
                Filter.not(Filter.exists("archived"))));
        m.put("unicode", Filter.eq("名前", "ünï"));
        return m;
    }

    @Test
    void buildersMatchTheSharedVectors() throws IOException {
        Pattern p = Pattern.compile("\"name\": \"([^\"]+)\".*\"hex\": \"([0-9a-f]+)\"");
        Map<String, Filter> cases = cases();
        List<String> seen = new ArrayList<>();
        for (String line : Files.readAllLines(root().resolve("tests/data/filter_vectors.jsonl"))) {
            Matcher mt = p.matcher(line);
            assertTrue(mt.find(), line);
            Filter f = cases.get(mt.group(1));
            assertNotNull(f, "no Java case for vector " + mt.group(1));
            assertEquals(mt.group(2), HexFormat.of().formatHex(f.encode()), mt.group(1) + " = " + f);
            seen.add(mt.group(1));
        }
        assertEquals(new ArrayList<>(cases.keySet()), seen);
    }

    @Test
    void badFilterArgumentsThrow() {
        assertThrows(IllegalArgumentException.class, () -> Filter.gt("x", Double.NaN));
        assertThrows(IllegalArgumentException.class, () -> Filter.eq("x", new int[] {1}));
        assertThrows(IllegalArgumentException.class, () -> Filter.in("x", 1, null));
        assertThrows(IllegalArgumentException.class, () -> Filter.eq("", 1).encode());
        assertThrows(IllegalArgumentException.class, () -> Filter.and());
        Filter deep = Filter.eq("a", 1);
        for (int i = 0; i < Filter.MAX_DEPTH; i++) {
            deep = Filter.not(deep);
        }
        Filter d = deep;
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, d::encode);
        assertTrue(e.getMessage().contains("deeper than 32"), e.getMessage());
        assertThrows(IllegalArgumentException.class,
                () -> UpsertOptions.DEFAULT.withFields(List.of(Map.of("x", new Object()))));
    }

    @Test
    void filteredRecallDeleteWhereAndFields() {
        Random r = new Random(11);
        int n = 600;
        float[][] data = randomVectors(r, n, DIM);
        long[] ids = new long[n];
        List<Map<String, Object>> fields = new ArrayList<>();
        String[] users = {"ann", "bob", "cy"};
        Instant base = Instant.parse("2025-06-01T00:00:00Z");
        for (int i = 0; i < n; i++) {
            ids[i] = i + 1;
            Map<String, Object> f = new HashMap<>();
            f.put("user", users[i % 3]);
            f.put("n", i);
            f.put("score", i / 10.0);
            f.put("at", base.plusSeconds(60L * i));
            if (i % 5 == 0) {
                f.put("tags", List.of("x", "urgent"));
            }
            if (i % 7 == 0) {
                f.put("done", true);
            }
            fields.add(f);
        }
        Map<String, Filter> filters = new LinkedHashMap<>();
        Map<String, IntPredicate> match = new HashMap<>();
        filters.put("ann", Filter.eq("user", "ann"));
        match.put("ann", i -> i % 3 == 0);
        filters.put("ann_n>=300", Filter.and(Filter.eq("user", "ann"), Filter.gte("n", 300)));
        match.put("ann_n>=300", i -> i % 3 == 0 && i >= 300);
        filters.put("urgent|done", Filter.or(Filter.contains("tags", "urgent"), Filter.eq("done", true)));
        match.put("urgent|done", i -> i % 5 == 0 || i % 7 == 0);
        filters.put("ne_done", Filter.ne("done", true));
        match.put("ne_done", i -> i % 7 != 0);
        filters.put("at<10min", Filter.lt("at", base.plusSeconds(600)));
        match.put("at<10min", i -> i < 10);
        filters.put("nin_user", Filter.nin("user", "ann", "bob"));
        match.put("nin_user", i -> i % 3 == 2);
        String name = uniqueName("filter");
        try (Kalos srv = Kalos.open(name, server(DIM, KalosOptions.Metric.IP)); Kalos k = Kalos.connect(name)) {
            k.upsert(ids, data, UpsertOptions.DEFAULT.withFields(fields));
            for (Map.Entry<String, Filter> e : filters.entrySet()) {
                boolean[] include = new boolean[n];
                for (int i = 0; i < n; i++) {
                    include[i] = match.get(e.getKey()).test(i);
                }
                for (int t = 0; t < 5; t++) {
                    float[] q = randomVectors(r, 1, DIM)[0];
                    RecallResult res = k.recall(q, 20, RecallOptions.filter(e.getValue()));
                    assertMatchesReference(KalosOptions.Metric.IP, q, data, ids, include, 20, res.ids(), res.scores(),
                            res.ids().length);
                }
            }

            List<Map<String, Object>> got = k.getFields(1, 6, 2);
            Map<String, Object> f0 = got.get(0);
            assertEquals("ann", f0.get("user"));
            assertEquals(0L, f0.get("n"));
            assertEquals(0.0, f0.get("score"));
            assertEquals(base, f0.get("at"));
            assertEquals(List.of("urgent", "x"), f0.get("tags"));
            assertEquals(true, f0.get("done"));
            assertEquals(5L, got.get(1).get("n"));
            assertEquals(4, got.get(2).size());
            assertThrows(NotFoundException.class, () -> k.getFields(99_999));

            // A field typed int64 by its first write refuses a string.
            InvalidArgumentException ia = assertThrows(InvalidArgumentException.class,
                    () -> k.upsert(new long[] {1}, data[0], UpsertOptions.DEFAULT.withFields(List.of(Map.of("n", "five")))));
            assertTrue(ia.getMessage().contains("n"), ia.getMessage());

            assertEquals(n / 3, k.deleteWhere(Filter.eq("user", "bob")));
            assertEquals(0, srv.recall(data[1], 10, RecallOptions.filter(Filter.eq("user", "bob"))).ids().length);
            assertEquals(0, k.deleteWhere(Filter.eq("user", "ann"), 5));
            assertEquals(10, srv.deleteWhere(Filter.and(Filter.eq("user", "ann"), Filter.lt("n", 30)), 0));
        }
    }

    /** Unsigned ascending order of ids, as listPage returns them. */
    static long[] sortedUnsigned(List<Long> v) {
        return v.stream().sorted(Long::compareUnsigned).mapToLong(Long::longValue).toArray();
    }

    @Test
    void listMatchesAReferenceInPages() {
        Random r = new Random(5);
        int n = 3000;
        long[] ids = new long[n];
        java.util.Set<Long> seen = new java.util.HashSet<>();
        List<Map<String, Object>> fields = new ArrayList<>();
        long[] ns = new long[n];
        String[] users = {"ann", "bob", "cy"};
        for (int i = 0; i < n; i++) {
            do {
                ids[i] = r.nextLong(); // the whole u64 range: negative longs are the upper half
            } while (!seen.add(ids[i]));
            fields.add(Map.of("user", users[i % 3], "n", i));
            ns[i] = i % 2;
        }
        String name = uniqueName("list");
        KalosOptions o = KalosOptions.builder().role(KalosOptions.Role.SERVER).dim(4).metric(KalosOptions.Metric.IP)
                .backend(KalosOptions.Backend.CPU).capacity(10_000).slotBytes(4096).maxPayloadBytes(1024).build();
        try (Kalos srv = Kalos.open(name, o); Kalos k = Kalos.connect(name)) {
            k.upsert(ids, randomVectors(r, n, 4), UpsertOptions.DEFAULT.withFields(fields).withNamespaces(ns));
            Map<String, ListOptions> opts = new LinkedHashMap<>();
            Map<String, IntPredicate> match = new HashMap<>();
            opts.put("all", ListOptions.ALL);
            match.put("all", i -> true);
            opts.put("bob", ListOptions.ALL.withFilter(Filter.eq("user", "bob")));
            match.put("bob", i -> i % 3 == 1);
            opts.put("ns1_n<1000", ListOptions.ALL.withNamespaces(1).withFilter(Filter.lt("n", 1000)));
            match.put("ns1_n<1000", i -> i % 2 == 1 && i < 1000);
            opts.put("none", ListOptions.ALL.withFilter(Filter.eq("user", "zed")));
            match.put("none", i -> false);
            for (Map.Entry<String, ListOptions> e : opts.entrySet()) {
                List<Long> w = new ArrayList<>();
                for (int i = 0; i < n; i++) {
                    if (match.get(e.getKey()).test(i)) {
                        w.add(ids[i]);
                    }
                }
                long[] want = sortedUnsigned(w);
                assertArrayEquals(want, k.list(e.getValue()), e.getKey());
                for (int size : new int[] {1, 17, 700}) {
                    List<Long> paged = new ArrayList<>();
                    ListOptions lo = e.getValue();
                    while (true) {
                        ListPage p = k.listPage(lo, size);
                        assertTrue(p.ids.length <= size);
                        for (long id : p.ids) {
                            paged.add(id);
                        }
                        assertEquals(want.length - paged.size(), p.remaining, e.getKey() + " remaining");
                        if (p.isLast()) {
                            break;
                        }
                        lo = lo.withAfter(p.ids[p.ids.length - 1]);
                    }
                    assertArrayEquals(want, paged.stream().mapToLong(Long::longValue).toArray(), e.getKey() + " in pages of " + size);
                }
                ListPage count = k.listPage(e.getValue(), 0);
                assertEquals(0, count.ids.length);
                assertEquals(want.length, count.remaining);
            }
            // A delete ahead of the cursor between pages: the id is not listed.
            long[] all = k.list(ListOptions.ALL);
            ListPage first = k.listPage(ListOptions.ALL, 100);
            srv.delete(all[500]);
            long[] rest = k.list(ListOptions.ALL.withAfter(first.ids[99]));
            assertEquals(all.length - 101, rest.length);
            for (long id : rest) {
                assertNotEquals(all[500], id);
                assertTrue(Long.compareUnsigned(id, first.ids[99]) > 0);
            }
            InvalidArgumentException bad = assertThrows(InvalidArgumentException.class,
                    () -> k.list(ListOptions.ALL.withNamespaces(new long[65])));
            assertTrue(bad.getMessage().contains("64"), bad.getMessage());
            assertThrows(IllegalArgumentException.class, () -> k.listPage(ListOptions.ALL, -1));
            assertTrue(k.stats().requestsBy.stream().anyMatch(c -> c.op.equals("list")));
        }
    }
}
