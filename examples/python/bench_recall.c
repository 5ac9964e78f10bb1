/* C side of the Python-overhead benchmark (examples/python/bench_overhead.py).
 *
 * Two ways to use it:
 * - as a program: attaches as a client to a running store, recalls the same query `iters`
 *   times and prints the per-call latency percentiles (q[i] = ((i * 7) % 13) / 13.0 - 0.5).
 *     gcc -O2 -I include examples/python/bench_recall.c -L target/release -lkalos \
 *         -Wl,-rpath,$PWD/target/release -o /tmp/bench_recall && /tmp/bench_recall NAME ITERS K
 * - as a shared library (-DBENCH_LIB -shared -fPIC): bench_overhead.py calls
 *   kalos_bench_recall() on its own handle, in blocks alternating with blocks of Python
 *   recalls, so both sides see the same server, handle, query and machine state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kalos.h"

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Times `iters` kalos_recall calls on `h` with parameters `p` (NULL for none); latencies (ns) go
 * to lat[]. Returns the first failing status, or KALOS_OK. */
kalos_status kalos_bench_recall(const kalos_handle *h, const float *q, uint32_t dim, uint32_t k, int iters,
                                const kalos_recall_params *p, uint64_t *ids, float *scores, uint64_t *lat) {
    size_t count = 0;
    for (int i = 0; i < iters; i++) {
        uint64_t t0 = now_ns();
        kalos_status st = kalos_recall(h, q, dim, k, p, ids, k, scores, k, &count);
        lat[i] = now_ns() - t0;
        if (st != KALOS_OK) return st;
    }
    return KALOS_OK;
}

/* As kalos_bench_recall, through kalos_recall_payloads with a payload buffer of `buf_len` bytes
 * at `buf` and k lengths at `lens` (bench_overhead.py --payloads). */
kalos_status kalos_bench_recall_payloads(const kalos_handle *h, const float *q, uint32_t dim, uint32_t k, int iters,
                                         const kalos_recall_params *p, uint64_t *ids, float *scores, uint64_t *lat,
                                         uint8_t *buf, size_t buf_len, uint32_t *lens) {
    size_t count = 0, needed = 0;
    for (int i = 0; i < iters; i++) {
        uint64_t t0 = now_ns();
        kalos_status st =
            kalos_recall_payloads(h, q, dim, k, p, ids, k, scores, k, buf, buf_len, lens, k, &count, &needed);
        lat[i] = now_ns() - t0;
        if (st != KALOS_OK) return st;
    }
    return KALOS_OK;
}

#ifndef BENCH_LIB
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s NAME ITERS K\n", argv[0]);
        return 1;
    }
    const char *name = argv[1];
    int iters = atoi(argv[2]);
    uint32_t k = (uint32_t)atoi(argv[3]);
    kalos_options o;
    kalos_options_init(&o, sizeof o);
    o.role = KALOS_ROLE_CLIENT;
    if (getenv("BENCH_SPIN_NS")) o.client_spin_ns = strtoull(getenv("BENCH_SPIN_NS"), NULL, 10);
    kalos_handle *h = NULL;
    if (kalos_open(name, &o, &h) != KALOS_OK) {
        fprintf(stderr, "kalos_open: %s\n", kalos_last_error());
        return 2;
    }
    uint32_t dim = 0;
    kalos_dim(h, &dim);
    float *q = malloc(sizeof(float) * dim);
    for (uint32_t i = 0; i < dim; i++) q[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    uint64_t *ids = malloc(sizeof(uint64_t) * k);
    float *scores = malloc(sizeof(float) * k);
    uint64_t *lat = malloc(sizeof(uint64_t) * (size_t)iters);
    size_t count = 0;
    for (int i = 0; i < 2000; i++) kalos_recall(h, q, dim, k, NULL, ids, k, scores, k, &count);
    for (int i = 0; i < iters; i++) {
        uint64_t t0 = now_ns();
        kalos_status st = kalos_recall(h, q, dim, k, NULL, ids, k, scores, k, &count);
        lat[i] = now_ns() - t0;
        if (st != KALOS_OK) {
            fprintf(stderr, "kalos_recall: %s\n", kalos_last_error());
            return 3;
        }
    }
    qsort(lat, (size_t)iters, sizeof(uint64_t), cmp_u64);
    printf("c_p50_ns=%llu c_p99_ns=%llu first_id=%llu count=%zu\n", (unsigned long long)lat[iters / 2],
           (unsigned long long)lat[(size_t)iters * 99 / 100], (unsigned long long)ids[0], count);
    kalos_close(h);
    return 0;
}
#endif
