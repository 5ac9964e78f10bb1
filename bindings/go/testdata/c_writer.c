/*
 * c_writer: the C side of the Go binding's cross-language test (kalosd_test.go).
 * Attaches to a running store as a client and upserts N memories through the C API with
 * per-item namespaces and packed payloads; Go then reads them back and checks them.
 *
 *   c_writer NAME N
 *
 * Memory i: id 1000+i, namespace 10+i%3, payload "memory-<i>" (none when i%5 == 4), and
 * vector[j] = ((i*31 + j*17) % 97) / 97.0 - 0.5 + (j == i % dim ? 1 : 0).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kalos.h"

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: c_writer NAME N\n");
		return 2;
	}
	size_t n = (size_t)atol(argv[2]);
	kalos_options o;
	kalos_options_init(&o, sizeof o);
	o.role = KALOS_ROLE_CLIENT;
	kalos_handle *h = NULL;
	kalos_status st = kalos_open(argv[1], &o, &h);
	if (st != KALOS_OK) {
		fprintf(stderr, "open: %s: %s\n", kalos_status_str(st), kalos_last_error());
		return 1;
	}
	uint32_t dim = 0;
	kalos_dim(h, &dim);
	uint64_t *ids = malloc(n * sizeof *ids);
	uint64_t *ns = malloc(n * sizeof *ns);
	uint32_t *lens = malloc(n * sizeof *lens);
	float *v = malloc(n * dim * sizeof *v);
	char *buf = malloc(n * 32 + 1);
	size_t off = 0;
	for (size_t i = 0; i < n; i++) {
		ids[i] = 1000 + i;
		ns[i] = 10 + i % 3;
		for (uint32_t j = 0; j < dim; j++)
			v[i * dim + j] = (float)((i * 31 + j * 17) % 97) / 97.0f - 0.5f + (j == i % dim ? 1.0f : 0.0f);
		if (i % 5 == 4) {
			lens[i] = (uint32_t)KALOS_NO_PAYLOAD;
		} else {
			int w = sprintf(buf + off, "memory-%zu", i);
			lens[i] = (uint32_t)w;
			off += (size_t)w;
		}
	}
	kalos_upsert_params p;
	kalos_upsert_params_init(&p, sizeof p);
	p.namespaces = ns;
	p.namespaces_len = n;
	p.payloads = (const uint8_t *)buf;
	p.payloads_len = off;
	p.payload_lens = lens;
	p.payload_lens_len = n;
	st = kalos_upsert(h, ids, n, v, n * dim, &p);
	if (st != KALOS_OK) {
		fprintf(stderr, "upsert: %s: %s\n", kalos_status_str(st), kalos_last_error());
		return 1;
	}
	printf("c_writer: upserted %zu memories of dim %u\n", n, dim);
	kalos_close(h);
	return 0;
}
