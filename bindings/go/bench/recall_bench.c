/*
 * recall_bench: the C reference figure for the Go binding's benchmark.
 *
 * Attaches to a running store as a client (role client) and times the same recall round
 * trip as BenchmarkRecall in ../bench_test.go: one query of `dim` random floats, top-k,
 * default parameters, a caller-owned result buffer. Prints p50/p99/mean over `iters` calls
 * after `warmup` calls. With `--fill N` it first upserts N random vectors (ids 0..N-1).
 *
 *   gcc -O2 -I include recall_bench.c -L target/release -lkalos -Wl,-rpath,target/release
 *   recall_bench NAME [--k K] [--iters N] [--warmup N] [--fill N]
 */
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

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
	rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
	return (float)((rng >> 40) & 0xFFFFFF) / (float)0x1000000 * 2.0f - 1.0f;
}

static int cmp_u64(const void *a, const void *b) {
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void die(const char *what, kalos_status st) {
	fprintf(stderr, "recall_bench: %s: %s: %s\n", what, kalos_status_str(st), kalos_last_error());
	exit(1);
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: recall_bench NAME [--k K] [--iters N] [--warmup N] [--fill N]\n");
		return 2;
	}
	const char *name = argv[1];
	uint32_t k = 10;
	size_t iters = 20000, warmup = 2000, fill = 0;
	for (int i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--k")) k = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--iters")) iters = (size_t)atol(argv[i + 1]);
		else if (!strcmp(argv[i], "--warmup")) warmup = (size_t)atol(argv[i + 1]);
		else if (!strcmp(argv[i], "--fill")) fill = (size_t)atol(argv[i + 1]);
	}
	kalos_options o;
	kalos_options_init(&o, sizeof o);
	o.role = KALOS_ROLE_CLIENT;
	kalos_handle *h = NULL;
	kalos_status st = kalos_open(name, &o, &h);
	if (st != KALOS_OK) die("open", st);
	uint32_t dim = 0;
	if ((st = kalos_dim(h, &dim)) != KALOS_OK) die("dim", st);

	if (fill > 0) {
		const size_t chunk = 4096;
		float *v = malloc(chunk * dim * sizeof(float));
		uint64_t *ids = malloc(chunk * sizeof(uint64_t));
		for (size_t at = 0; at < fill; at += chunk) {
			size_t n = fill - at < chunk ? fill - at : chunk;
			for (size_t i = 0; i < n * dim; i++) v[i] = frand();
			for (size_t i = 0; i < n; i++) ids[i] = at + i;
			if ((st = kalos_upsert(h, ids, n, v, n * dim, NULL)) != KALOS_OK) die("upsert", st);
		}
		free(v);
		free(ids);
		printf("filled %zu vectors of dim %u\n", fill, dim);
	}

	/* A pool of queries, cycled, like the Go benchmark. */
	const size_t nqpool = 256;
	float *qs = malloc(nqpool * dim * sizeof(float));
	for (size_t i = 0; i < nqpool * dim; i++) qs[i] = frand();
	uint64_t *ids = malloc(k * sizeof(uint64_t));
	float *scores = malloc(k * sizeof(float));
	uint64_t *lat = malloc((iters ? iters : 1) * sizeof(uint64_t));
	size_t count = 0;
	for (size_t i = 0; i < warmup + iters; i++) {
		const float *q = qs + (i % nqpool) * dim;
		uint64_t t0 = now_ns();
		st = kalos_recall(h, q, dim, k, NULL, ids, k, scores, k, &count);
		uint64_t t1 = now_ns();
		if (st != KALOS_OK) die("recall", st);
		if (i >= warmup) lat[i - warmup] = t1 - t0;
	}
	if (iters == 0) {
		kalos_close(h);
		return 0;
	}
	double sum = 0;
	for (size_t i = 0; i < iters; i++) sum += (double)lat[i];
	qsort(lat, iters, sizeof(uint64_t), cmp_u64);
	printf("C recall_bench: store=%s dim=%u k=%u iters=%zu p50=%.2fus p99=%.2fus mean=%.2fus\n", name, dim, k,
	       iters, lat[iters / 2] / 1e3, lat[(size_t)(iters * 0.99)] / 1e3, sum / iters / 1e3);
	kalos_close(h);
	free(qs); free(ids); free(scores); free(lat);
	return 0;
}
