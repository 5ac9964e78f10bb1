/*
 * Kalos C quickstart: open a store (role auto: becomes the server when none runs), write a few
 * memories with payloads in two namespaces, and recall the best ones for one user.
 *
 *   cargo build --release
 *   gcc -std=c99 -Wall -Iinclude examples/quickstart.c -Ltarget/release -lkalos \
 *       -Wl,-rpath,$PWD/target/release -o quickstart && ./quickstart
 */
#include <stdio.h>
#include <string.h>

#include "kalos.h"

#define DIM 4

static int fail(const char *what, kalos_status st) {
    fprintf(stderr, "%s failed: %s (%s)\n", what, kalos_status_str(st), kalos_last_error());
    return 1;
}

int main(void) {
    kalos_options opts;
    kalos_options_init(&opts, sizeof opts);
    opts.dim = DIM;
    opts.metric = KALOS_METRIC_COSINE;

    kalos_handle *h = NULL;
    kalos_status st = kalos_open("quickstart", &opts, &h);
    if (st != KALOS_OK) return fail("kalos_open", st);

    /* Three memories: two of user 1, one of user 2. Payloads are packed back to back. */
    uint64_t ids[3] = {101, 102, 201};
    float vecs[3 * DIM] = {
        0.9f, 0.1f, 0.0f, 0.0f, /* "likes green tea"      */
        0.0f, 0.2f, 0.9f, 0.1f, /* "lives in Lisbon"      */
        0.8f, 0.2f, 0.1f, 0.0f, /* "prefers black coffee" */
    };
    uint64_t users[3] = {1, 1, 2};
    const char *text = "likes green tealives in Lisbonprefers black coffee";
    uint32_t lens[3] = {15, 15, 20};

    kalos_upsert_params up;
    kalos_upsert_params_init(&up, sizeof up);
    up.namespaces = users;
    up.namespaces_len = 3;
    up.payloads = (const uint8_t *)text;
    up.payloads_len = strlen(text);
    up.payload_lens = lens;
    up.payload_lens_len = 3;
    st = kalos_upsert(h, ids, 3, vecs, 3 * DIM, &up);
    if (st != KALOS_OK) return fail("kalos_upsert", st);

    /* Recall for user 1 only: the filter runs inside the scan, so the result is exact. */
    float query[DIM] = {1.0f, 0.0f, 0.0f, 0.0f};
    uint64_t user = 1;
    kalos_recall_params rp;
    kalos_recall_params_init(&rp, sizeof rp);
    rp.namespaces = &user;
    rp.namespaces_len = 1;

    uint64_t out_ids[2];
    float out_scores[2];
    uint32_t out_lens[2];
    char payload[256];
    size_t count = 0, needed = 0;
    st = kalos_recall_payloads(h, query, DIM, 2, &rp, out_ids, 2, out_scores, 2, (uint8_t *)payload,
                               sizeof payload, out_lens, 2, &count, &needed);
    if (st != KALOS_OK) return fail("kalos_recall_payloads", st);

    size_t off = 0;
    for (size_t i = 0; i < count; i++) {
        int n = out_lens[i] == KALOS_NO_PAYLOAD ? 0 : (int)out_lens[i];
        printf("id=%llu score=%.3f memory=\"%.*s\"\n", (unsigned long long)out_ids[i], out_scores[i], n, payload + off);
        off += (size_t)n;
    }
    kalos_close(h);
    return 0;
}
