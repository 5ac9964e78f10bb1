/*
 * C reference for the Java benchmark: the same recall loop through the C ABI, against the same
 * kalosd, so the Java figure can be read next to the C one from the same run.
 *
 *   recall_bench NAME K ITERS WARMUP
 *
 * Prints: c p50_us=... p99_us=... mean_us=... iters=...
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kalos.h"

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s NAME K ITERS WARMUP\n", argv[0]);
        return 2;
    }
    const char *name = argv[1];
    uint32_t k = (uint32_t)atoi(argv[2]);
    int iters = atoi(argv[3]), warmup = atoi(argv[4]);

    kalos_options o;
    kalos_options_init(&o, sizeof o);
    o.role = KALOS_ROLE_CLIENT;
    kalos_handle *h = NULL;
    kalos_status s = kalos_open(name, &o, &h);
    if (s != KALOS_OK) {
        fprintf(stderr, "kalos_open: %s: %s\n", kalos_status_str(s), kalos_last_error());
        return 1;
    }
    uint32_t dim = 0;
    kalos_dim(h, &dim);
    int nq = 256;
    float *qs = malloc(sizeof(float) * dim * nq);
    for (size_t i = 0; i < (size_t)dim * nq; i++) qs[i] = frand();
    uint64_t *ids = malloc(sizeof(uint64_t) * k);
    float *scores = malloc(sizeof(float) * k);
    uint64_t *lat = malloc(sizeof(uint64_t) * iters);
    size_t count = 0;
    for (int i = 0; i < warmup + iters; i++) {
        const float *q = qs + (size_t)(i % nq) * dim;
        uint64_t t0 = now_ns();
        s = kalos_recall(h, q, dim, k, NULL, ids, k, scores, k, &count);
        uint64_t t1 = now_ns();
        if (s != KALOS_OK) {
            fprintf(stderr, "kalos_recall: %s: %s\n", kalos_status_str(s), kalos_last_error());
            return 1;
        }
        if (i >= warmup) lat[i - warmup] = t1 - t0;
    }
    qsort(lat, iters, sizeof(uint64_t), cmp_u64);
    double sum = 0;
    for (int i = 0; i < iters; i++) sum += (double)lat[i];
    printf("c            min_us=%.2f p10_us=%.2f p50_us=%.2f p99_us=%.2f mean_us=%.2f iters=%d k=%u dim=%u\n", lat[0] / 1e3,
           lat[iters / 10] / 1e3, lat[iters / 2] / 1e3, lat[(size_t)(iters * 0.99)] / 1e3, sum / iters / 1e3, iters, k, dim);
    kalos_close(h);
    free(qs); free(ids); free(scores); free(lat);
    return 0;
}
