/* A C program built outside the checkout with `pkg-config --cflags --libs kalos` against the
 * installed tarball (tests/package/run.sh). Usage: consumer STORE_NAME EXPECTED_VERSION */
#include <stdio.h>
#include <string.h>

#include <kalos.h>

#define DIM 4

static int fail(const char *what, kalos_status st) {
    fprintf(stderr, "c: %s failed: %s (%s)\n", what, kalos_status_str(st), kalos_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    if (strcmp(kalos_version(), argv[2]) != 0) {
        fprintf(stderr, "c: library version %s, expected %s\n", kalos_version(), argv[2]);
        return 1;
    }
    kalos_options o;
    kalos_options_init(&o, sizeof o);
    o.role = KALOS_ROLE_SERVER;
    o.dim = DIM;
    o.metric = KALOS_METRIC_IP;
    o.backend = KALOS_BACKEND_CPU;
    kalos_handle *h = NULL;
    kalos_status st = kalos_open(argv[1], &o, &h);
    if (st != KALOS_OK) return fail("kalos_open", st);
    const uint64_t ids[3] = {10, 20, 30};
    const float vecs[3 * DIM] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0};
    st = kalos_upsert(h, ids, 3, vecs, 3 * DIM, NULL);
    if (st != KALOS_OK) return fail("kalos_upsert", st);
    const float q[DIM] = {0, 0.2f, 0.9f, 0};
    uint64_t out[2];
    float scores[2];
    size_t n = 0;
    st = kalos_recall(h, q, DIM, 2, NULL, out, 2, scores, 2, &n);
    if (st != KALOS_OK) return fail("kalos_recall", st);
    kalos_close(h);
    if (n != 2 || out[0] != 30 || out[1] != 20) {
        fprintf(stderr, "c: recall gave %zu hits: %llu %llu\n", n, (unsigned long long)out[0],
                (unsigned long long)out[1]);
        return 1;
    }
    printf("c: ok, kalos %s, top ids %llu %llu\n", kalos_version(), (unsigned long long)out[0],
           (unsigned long long)out[1]);
    return 0;
}
