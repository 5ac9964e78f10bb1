/*
 * C test harness for libkalos: multi-process correctness, error cases, server death.
 *
 * Build and run (tests/c/run.sh does this):
 *   gcc -std=c99 -O2 -Wall -Wextra -Werror -Iinclude tests/c/harness.c \
 *       -Ltarget/release -lkalos -Wl,-rpath,$PWD/target/release -lm -o tests/c/build/harness
 *   tests/c/build/harness
 *
 * Fresh random data every run (the seed is printed; KALOS_SEED=n repeats a run).
 * Prints "N passed, M failed" last; exits non-zero when anything failed.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kalos.h"

static int g_pass = 0, g_fail = 0;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            g_pass++;                                                      \
        } else {                                                           \
            g_fail++;                                                      \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);           \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, " (last error: %s)\n", kalos_last_error());    \
        }                                                                  \
    } while (0)

#define CHECK_STATUS(expr, want)                                                     \
    do {                                                                             \
        kalos_status st_ = (expr);                                                   \
        CHECK(st_ == (want), "%s returned %s, want %s", #expr, kalos_status_str(st_), \
              kalos_status_str(want));                                               \
    } while (0)

/* ---- random numbers (xorshift64*) ---- */
static uint64_t g_rng;
static uint64_t rnd(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 2685821657736338717ULL;
}
static float rndf(void) { return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- brute-force reference (double precision), inner product ---- */
typedef struct {
    double score;
    uint64_t id;
} ref_hit;

static int ref_cmp(const void *a, const void *b) {
    const ref_hit *x = a, *y = b;
    if (x->score > y->score) return -1;
    if (x->score < y->score) return 1;
    return (x->id < y->id) ? -1 : (x->id > y->id);
}

static size_t reference(const float *table, const uint64_t *ids, size_t n, size_t dim, const float *q,
                        size_t k, ref_hit *out, ref_hit *scratch) {
    for (size_t i = 0; i < n; i++) {
        double s = 0;
        for (size_t d = 0; d < dim; d++) s += (double)table[i * dim + d] * q[d];
        scratch[i].score = s;
        scratch[i].id = ids[i];
    }
    qsort(scratch, n, sizeof(ref_hit), ref_cmp);
    size_t m = k < n ? k : n;
    memcpy(out, scratch, m * sizeof(ref_hit));
    return m;
}

/* Results agree when there are k of them (fewer where the reference has fewer rows), every
 * returned score matches the reference score at that rank, and ids match wherever the reference
 * has no near-tie at that rank. `ref` holds the reference's top k + 1 (m rows): the k-th best
 * row and the next one may be a near-tie, and then either may come last. */
static int agree(const uint64_t *ids, const float *scores, size_t count, const ref_hit *ref, size_t m, size_t k) {
    if (count != (m < k ? m : k)) return 0;
    for (size_t i = 0; i < count; i++) {
        double tol = 1e-4 * (1.0 + fabs(ref[i].score));
        if (fabs(scores[i] - ref[i].score) > tol) return 0;
        int tie = (i > 0 && fabs(ref[i].score - ref[i - 1].score) < tol) ||
                  (i + 1 < m && fabs(ref[i].score - ref[i + 1].score) < tol);
        if (!tie && ids[i] != ref[i].id) return 0;
    }
    return 1;
}

/* Checks one answer of at most k hits against the reference's top k + 1 for query q; prints what
 * differs, labelled `what` and `j`. Returns 1 when the answer agrees. */
static int check_answer(const char *what, int j, const float *table, const uint64_t *ids, size_t n, size_t dim,
                        const float *q, size_t k, const uint64_t *got_ids, const float *got_scores, size_t count,
                        ref_hit *ref, ref_hit *scratch) {
    size_t m = reference(table, ids, n, dim, q, k + 1, ref, scratch);
    if (agree(got_ids, got_scores, count, ref, m, k)) return 1;
    fprintf(stderr, "%s %d: %zu hits (want %zu), first id %llu (want %llu)\n", what, j, count, m < k ? m : k,
            (unsigned long long)(count ? got_ids[0] : 0), (unsigned long long)(m ? ref[0].id : 0));
    return 0;
}

static void opts_default(kalos_options *o, uint32_t role, uint32_t dim) {
    kalos_options_init(o, sizeof *o);
    o->role = role;
    o->dim = dim;
    o->metric = KALOS_METRIC_IP;
    o->timeout_ms = 3000;
}

/* ---- 1. many forked clients against one server ---- */
#define DIM 48
#define NROWS 6000
#define NCHILD 8
#define NQ 150
#define K 10

static int child_client(const char *name, const float *table, const uint64_t *ids, int rfd) {
    char c;
    if (read(rfd, &c, 1) != 1) return 100;
    kalos_options o;
    opts_default(&o, KALOS_ROLE_CLIENT, DIM);
    kalos_handle *h = NULL;
    kalos_status st = kalos_open(name, &o, &h);
    if (st != KALOS_OK) {
        fprintf(stderr, "child open: %s\n", kalos_last_error());
        return 101;
    }
    ref_hit *scratch = malloc(NROWS * sizeof(ref_hit));
    ref_hit ref[K + 1];
    int bad = 0;
    for (int i = 0; i < NQ; i++) {
        float q[DIM];
        for (int d = 0; d < DIM; d++) q[d] = rndf();
        uint64_t rid[K];
        float rsc[K];
        size_t cnt = 0;
        st = kalos_recall(h, q, DIM, K, NULL, rid, K, rsc, K, &cnt);
        if (st != KALOS_OK) {
            fprintf(stderr, "child recall: %s\n", kalos_last_error());
            bad++;
            continue;
        }
        if (!check_answer("child query", i, table, ids, NROWS, DIM, q, K, rid, rsc, cnt, ref, scratch)) bad++;
    }
    /* A batch too. */
    float qs[4 * DIM];
    for (int i = 0; i < 4 * DIM; i++) qs[i] = rndf();
    uint64_t bid[4 * K];
    float bsc[4 * K];
    size_t bcnt[4];
    st = kalos_recall_batch(h, qs, 4 * DIM, 4, K, NULL, bid, 4 * K, bsc, 4 * K, bcnt, 4);
    if (st != KALOS_OK) {
        fprintf(stderr, "child batch: %s\n", kalos_last_error());
        bad++;
    }
    for (int j = 0; st == KALOS_OK && j < 4; j++) {
        if (!check_answer("child batch query", j, table, ids, NROWS, DIM, qs + j * DIM, K, bid + j * K, bsc + j * K,
                          bcnt[j], ref, scratch))
            bad++;
    }
    free(scratch);
    kalos_close(h);
    return bad > 0 ? 1 : 0;
}

static void test_multiprocess(void) {
    char name[64];
    snprintf(name, sizeof name, "charness-mp-%d", (int)getpid());
    float *table = malloc((size_t)NROWS * DIM * sizeof(float));
    uint64_t *ids = malloc(NROWS * sizeof(uint64_t));
    for (size_t i = 0; i < (size_t)NROWS * DIM; i++) table[i] = rndf();
    for (size_t i = 0; i < NROWS; i++) ids[i] = 1000000 + i * 7 + (rnd() % 7);
    /* Exact duplicates with different ids: ties must be broken by the lower id. */
    memcpy(table + 10 * DIM, table + 20 * DIM, DIM * sizeof(float));

    /* Fork the clients first (before this process starts any threads); release them through a
     * pipe once the server holds the data. */
    int pfd[2];
    if (pipe(pfd) != 0) abort();
    pid_t kids[NCHILD];
    for (int c = 0; c < NCHILD; c++) {
        g_rng = g_rng * 31 + (uint64_t)c + 1; /* distinct query streams */
        kids[c] = fork();
        if (kids[c] == 0) {
            close(pfd[1]);
            _exit(child_client(name, table, ids, pfd[0]));
        }
    }
    close(pfd[0]);

    kalos_options o;
    opts_default(&o, KALOS_ROLE_SERVER, DIM);
    o.capacity = NROWS;
    kalos_handle *srv = NULL;
    CHECK_STATUS(kalos_open(name, &o, &srv), KALOS_OK);
    CHECK_STATUS(kalos_upsert(srv, ids, NROWS, table, (size_t)NROWS * DIM, NULL), KALOS_OK);
    char go[NCHILD];
    memset(go, 'g', sizeof go);
    CHECK(write(pfd[1], go, NCHILD) == NCHILD, "release children");
    close(pfd[1]);
    for (int c = 0; c < NCHILD; c++) {
        int wst = 0;
        waitpid(kids[c], &wst, 0);
        CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "client process %d: every result matches the reference (exit %d)", c,
              WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
    }
    kalos_stats_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK_STATUS(kalos_stats(srv, &info), KALOS_OK);
    CHECK(info.count == NROWS, "stats count %llu", (unsigned long long)info.count);
    CHECK(info.queries >= NCHILD * (NQ + 4), "stats queries %llu", (unsigned long long)info.queries);
    CHECK(info.dim == DIM, "stats dim");
    CHECK(info.fallback_reason[sizeof info.fallback_reason - 1] == '\0', "fallback_reason is NUL-terminated");
    /* A caller built against the first, shorter kalos_stats_info (up to engine_name) gets the
       fields it knows, and nothing past its struct_size is written. */
    memset(&info, 0x5a, sizeof info);
    info.struct_size = (uint32_t)offsetof(kalos_stats_info, fallback_reason);
    CHECK_STATUS(kalos_stats(srv, &info), KALOS_OK);
    CHECK(info.count == NROWS && info.struct_size == offsetof(kalos_stats_info, fallback_reason), "stats with the old struct_size");
    CHECK((unsigned char)info.fallback_reason[0] == 0x5a, "nothing written past the caller's struct_size");
    info.struct_size = (uint32_t)offsetof(kalos_stats_info, engine_name);
    CHECK_STATUS(kalos_stats(srv, &info), KALOS_INVALID_ARGUMENT);
    kalos_close(srv);
    free(table);
    free(ids);
}

/* ---- 2. error cases ---- */
static void test_errors(void) {
    char name[64];
    snprintf(name, sizeof name, "charness-err-%d", (int)getpid());
    kalos_options o;
    opts_default(&o, KALOS_ROLE_SERVER, 4);
    o.capacity = 3;
    o.max_payload_bytes = 16;
    kalos_handle *h = NULL;

    kalos_close(NULL); /* no-op */
    CHECK_STATUS(kalos_open(NULL, &o, &h), KALOS_NULL_POINTER);
    CHECK_STATUS(kalos_open(name, &o, NULL), KALOS_NULL_POINTER);
    CHECK_STATUS(kalos_open("bad/name", &o, &h), KALOS_INVALID_NAME);
    CHECK_STATUS(kalos_open("", &o, &h), KALOS_INVALID_NAME);
    CHECK(strlen(kalos_last_error()) > 0, "last error has a message");
    {
        kalos_options small = o;
        small.struct_size = 8;
        CHECK_STATUS(kalos_open(name, &small, &h), KALOS_INVALID_ARGUMENT);
        kalos_options nodim = o;
        nodim.dim = 0;
        CHECK_STATUS(kalos_open(name, &nodim, &h), KALOS_INVALID_ARGUMENT);
        kalos_options badmetric = o;
        badmetric.metric = 9;
        CHECK_STATUS(kalos_open(name, &badmetric, &h), KALOS_INVALID_ARGUMENT);
    }
    {
        kalos_options c;
        opts_default(&c, KALOS_ROLE_CLIENT, 4);
        c.timeout_ms = 200;
        CHECK_STATUS(kalos_open(name, &c, &h), KALOS_NOT_FOUND);
    }
    CHECK_STATUS(kalos_open(name, &o, &h), KALOS_OK);
    {
        kalos_handle *h2 = NULL;
        CHECK_STATUS(kalos_open(name, &o, &h2), KALOS_ALREADY_EXISTS);
        kalos_options c;
        opts_default(&c, KALOS_ROLE_CLIENT, 5);
        CHECK_STATUS(kalos_open(name, &c, &h2), KALOS_DIMENSION_MISMATCH);
    }
    float v[12] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0};
    uint64_t ids[3] = {1, 2, 3};
    float q[4] = {1, 0, 0, 0};
    uint64_t rid[8];
    float rsc[8];
    size_t cnt = 99;

    /* recall on an empty store */
    CHECK_STATUS(kalos_recall(h, q, 4, 5, NULL, rid, 8, rsc, 8, &cnt), KALOS_OK);
    CHECK(cnt == 0, "empty store returns 0 hits, got %zu", cnt);

    /* buffers not aligned for their element type are refused, not read */
    {
        unsigned char raw[64] __attribute__((aligned(16)));
        memcpy(raw + 1, q, sizeof q);
        CHECK_STATUS(kalos_recall(h, (const float *)(raw + 1), 4, 5, NULL, rid, 8, rsc, 8, &cnt), KALOS_INVALID_ARGUMENT);
        CHECK(strstr(kalos_last_error(), "query is not aligned") != NULL, "misaligned query: %s", kalos_last_error());
        CHECK_STATUS(kalos_recall(h, q, 4, 5, NULL, (uint64_t *)(raw + 4), 5, rsc, 8, &cnt), KALOS_INVALID_ARGUMENT);
        CHECK_STATUS(kalos_upsert(h, (const uint64_t *)(raw + 2), 1, q, 4, NULL), KALOS_INVALID_ARGUMENT);
    }

    /* bad upserts change nothing */
    CHECK_STATUS(kalos_upsert(h, ids, 3, v, 11, NULL), KALOS_DIMENSION_MISMATCH);
    float vnan[4] = {1, NAN, 0, 0};
    CHECK_STATUS(kalos_upsert(h, ids, 1, vnan, 4, NULL), KALOS_NON_FINITE);
    float vinf[4] = {1, INFINITY, 0, 0};
    CHECK_STATUS(kalos_upsert(h, ids, 1, vinf, 4, NULL), KALOS_NON_FINITE);
    CHECK_STATUS(kalos_upsert(h, NULL, 3, v, 12, NULL), KALOS_NULL_POINTER);
    {
        kalos_upsert_params p;
        kalos_upsert_params_init(&p, sizeof p);
        uint8_t big[17] = {0};
        uint32_t lens[1] = {17};
        p.payloads = big;
        p.payloads_len = 17;
        p.payload_lens = lens;
        p.payload_lens_len = 1;
        CHECK_STATUS(kalos_upsert(h, ids, 1, v, 4, &p), KALOS_PAYLOAD_TOO_LARGE);
        kalos_upsert_params_init(&p, sizeof p);
        p.expires_at_ms = 1000; /* 1970 */
        CHECK_STATUS(kalos_upsert(h, ids, 1, v, 4, &p), KALOS_INVALID_ARGUMENT);
    }
    CHECK_STATUS(kalos_recall(h, q, 4, 5, NULL, rid, 8, rsc, 8, &cnt), KALOS_OK);
    CHECK(cnt == 0, "failed upserts wrote nothing, got %zu hits", cnt);

    /* duplicate id within one upsert: the last occurrence wins */
    {
        uint64_t dup[2] = {7, 7};
        float dv[8] = {0, 0, 0, 1, 1, 0, 0, 0};
        CHECK_STATUS(kalos_upsert(h, dup, 2, dv, 8, NULL), KALOS_OK);
        float got[4];
        uint64_t id7 = 7;
        CHECK_STATUS(kalos_get(h, &id7, 1, got, 4, NULL, 0, NULL, 0, NULL, 0, NULL), KALOS_OK);
        CHECK(got[0] == 1 && got[3] == 0, "duplicate id: last wins");
        uint64_t del = 0;
        CHECK_STATUS(kalos_delete(h, &id7, 1, &del), KALOS_OK);
        CHECK(del == 1, "deleted 1");
    }

    CHECK_STATUS(kalos_upsert(h, ids, 3, v, 12, NULL), KALOS_OK);
    /* store full: a 4th new id */
    {
        uint64_t id4 = 4;
        CHECK_STATUS(kalos_upsert(h, &id4, 1, v, 4, NULL), KALOS_STORE_FULL);
        /* replacing an existing id still works when full */
        CHECK_STATUS(kalos_upsert(h, ids, 1, v, 4, NULL), KALOS_OK);
    }
    /* recall errors */
    CHECK_STATUS(kalos_recall(h, q, 3, 2, NULL, rid, 8, rsc, 8, &cnt), KALOS_DIMENSION_MISMATCH);
    CHECK_STATUS(kalos_recall(h, q, 4, 0, NULL, rid, 8, rsc, 8, &cnt), KALOS_K_OUT_OF_RANGE);
    {
        static uint64_t bid[1025];
        static float bsc[1025];
        CHECK_STATUS(kalos_recall(h, q, 4, 1025, NULL, bid, 1025, bsc, 1025, &cnt), KALOS_K_OUT_OF_RANGE);
        CHECK_STATUS(kalos_recall(h, q, 4, 1024, NULL, bid, 1024, bsc, 1024, &cnt), KALOS_OK);
        CHECK(cnt == 3, "k above the count returns the count (%zu)", cnt);
    }
    float qnan[4] = {NAN, 0, 0, 0};
    CHECK_STATUS(kalos_recall(h, qnan, 4, 2, NULL, rid, 8, rsc, 8, &cnt), KALOS_NON_FINITE);
    CHECK_STATUS(kalos_recall(NULL, q, 4, 2, NULL, rid, 8, rsc, 8, &cnt), KALOS_NULL_POINTER);
    CHECK_STATUS(kalos_recall(h, NULL, 4, 2, NULL, rid, 8, rsc, 8, &cnt), KALOS_NULL_POINTER);
    CHECK_STATUS(kalos_recall(h, q, 4, 2, NULL, rid, 8, rsc, 8, NULL), KALOS_NULL_POINTER);
    CHECK_STATUS(kalos_recall(h, q, 4, 5, NULL, rid, 4, rsc, 8, &cnt), KALOS_BUFFER_TOO_SMALL);
    {
        kalos_recall_params p;
        kalos_recall_params_init(&p, sizeof p);
        uint64_t many[65] = {0};
        p.namespaces = many;
        p.namespaces_len = 65;
        CHECK_STATUS(kalos_recall(h, q, 4, 2, &p, rid, 8, rsc, 8, &cnt), KALOS_INVALID_ARGUMENT);
    }
    CHECK_STATUS(kalos_recall(h, q, 4, 2, NULL, rid, 8, rsc, 8, &cnt), KALOS_OK);
    CHECK(cnt == 2 && rid[0] == 1, "recall after errors still works (ids %llu)", (unsigned long long)rid[0]);
    /* kalos_recall_with: the same recall from a struct, and the same errors */
    {
        kalos_recall_args a;
        kalos_recall_args_init(&a, sizeof a);
        CHECK(a.struct_size == sizeof a && a.k == 10 && a.count == 0, "kalos_recall_args_init");
        uint64_t wid[8];
        float wsc[8];
        a.handle = h;
        a.query = q;
        a.query_len = 4;
        a.k = 2;
        a.ids = wid;
        a.ids_len = 8;
        a.scores = wsc;
        a.scores_len = 8;
        CHECK_STATUS(kalos_recall_with(&a), KALOS_OK);
        CHECK(a.count == cnt && wid[0] == rid[0] && wid[1] == rid[1] && wsc[0] == rsc[0] && wsc[1] == rsc[1],
              "kalos_recall_with matches kalos_recall (count %zu)", a.count);
        a.query_len = 3;
        CHECK_STATUS(kalos_recall_with(&a), KALOS_DIMENSION_MISMATCH);
        CHECK(a.count == cnt, "count is left alone by an error (%zu)", a.count);
        a.query_len = 4;
        a.k = 0;
        CHECK_STATUS(kalos_recall_with(&a), KALOS_K_OUT_OF_RANGE);
        a.k = 9;
        CHECK_STATUS(kalos_recall_with(&a), KALOS_BUFFER_TOO_SMALL);
        a.k = 2;
        a.query = qnan;
        CHECK_STATUS(kalos_recall_with(&a), KALOS_NON_FINITE);
        a.query = q;
        a.handle = NULL;
        CHECK_STATUS(kalos_recall_with(&a), KALOS_NULL_POINTER);
        a.handle = h;
        a.ids = NULL;
        CHECK_STATUS(kalos_recall_with(&a), KALOS_NULL_POINTER);
        a.ids = wid;
        a.struct_size = 8;
        CHECK_STATUS(kalos_recall_with(&a), KALOS_INVALID_ARGUMENT);
        CHECK_STATUS(kalos_recall_with(NULL), KALOS_NULL_POINTER);
        kalos_recall_args_init(NULL, sizeof a); /* a no-op */
        kalos_recall_args_init(&a, sizeof a);
        a.handle = h;
        a.query = q;
        a.query_len = 4;
        a.k = 1;
        a.ids = wid;
        a.ids_len = 8;
        a.scores = wsc;
        a.scores_len = 8;
        CHECK_STATUS(kalos_recall_with(&a), KALOS_OK);
        CHECK(a.count == 1 && wid[0] == rid[0], "kalos_recall_with after errors (count %zu)", a.count);
    }
    /* unknown id: reported, nothing deleted */
    {
        uint64_t mix[2] = {2, 999};
        uint64_t del = 12345;
        CHECK_STATUS(kalos_delete(h, mix, 2, &del), KALOS_NOT_FOUND);
        CHECK(strstr(kalos_last_error(), "999") != NULL, "message names the unknown id: %s", kalos_last_error());
        CHECK(del == 12345, "outputs untouched on failure");
        float got[8];
        CHECK_STATUS(kalos_get(h, mix, 2, got, 8, NULL, 0, NULL, 0, NULL, 0, NULL), KALOS_NOT_FOUND);
        CHECK_STATUS(kalos_get(h, mix, 1, got, 4, NULL, 0, NULL, 0, NULL, 0, NULL), KALOS_OK);
    }
    /* status strings, version */
    CHECK(strcmp(kalos_status_str(KALOS_SERVER_GONE), "SERVER_GONE") == 0, "status_str");
    CHECK(strcmp(kalos_status_str(-5), "UNKNOWN") == 0, "status_str unknown");
    CHECK(strlen(kalos_version()) > 0, "version");
    kalos_close(h);
}

/* ---- 3. a segment of another layout version ---- */
static void test_version_mismatch(void) {
    char name[64], path[96];
    snprintf(name, sizeof name, "charness-ver-%d", (int)getpid());
    snprintf(path, sizeof path, "/kalos.%s", name);
    int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0, "create fake segment");
    if (fd < 0) return;
    size_t len = 4096 * 4;
    CHECK(ftruncate(fd, (off_t)len) == 0, "size fake segment");
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    memcpy(p, "KALOSSHM", 8);          /* magic */
    uint32_t v = 999;
    memcpy(p + 8, &v, 4);               /* layout_version */
    munmap(p, len);
    close(fd);
    kalos_options o;
    opts_default(&o, KALOS_ROLE_CLIENT, 0);
    kalos_handle *h = NULL;
    CHECK_STATUS(kalos_open(name, &o, &h), KALOS_VERSION_MISMATCH);
    shm_unlink(path);
}

/* ---- 4. the server is SIGKILLed: clients get an error within their deadline ---- */
static void test_server_killed(void) {
    char name[64];
    snprintf(name, sizeof name, "charness-kill-%d", (int)getpid());
    int pfd[2];
    if (pipe(pfd) != 0) abort();
    pid_t srv = fork();
    if (srv == 0) {
        close(pfd[0]);
        kalos_options o;
        opts_default(&o, KALOS_ROLE_SERVER, 8);
        kalos_handle *h = NULL;
        if (kalos_open(name, &o, &h) != KALOS_OK) _exit(1);
        uint64_t id = 1;
        float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        kalos_upsert(h, &id, 1, v, 8, NULL);
        if (write(pfd[1], "r", 1) != 1) _exit(2);
        for (;;) pause();
    }
    close(pfd[1]);
    char c;
    CHECK(read(pfd[0], &c, 1) == 1, "server child ready");
    close(pfd[0]);
    kalos_options o;
    opts_default(&o, KALOS_ROLE_CLIENT, 8);
    o.timeout_ms = 2000;
    kalos_handle *h = NULL;
    CHECK_STATUS(kalos_open(name, &o, &h), KALOS_OK);
    float q[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    uint64_t rid[1];
    float rsc[1];
    size_t cnt = 0;
    CHECK_STATUS(kalos_recall(h, q, 8, 1, NULL, rid, 1, rsc, 1, &cnt), KALOS_OK);
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
    double t0 = now_s();
    kalos_status st = kalos_recall(h, q, 8, 1, NULL, rid, 1, rsc, 1, &cnt);
    double dt = now_s() - t0;
    CHECK(st == KALOS_SERVER_GONE, "recall after SIGKILL gives SERVER_GONE, got %s", kalos_status_str(st));
    CHECK(dt < 2.5, "error within the deadline (%.3f s)", dt);
    kalos_close(h);
    /* A new server can take the name over, and a client can reopen and carry on. */
    kalos_options so;
    opts_default(&so, KALOS_ROLE_SERVER, 8);
    kalos_handle *s2 = NULL;
    CHECK_STATUS(kalos_open(name, &so, &s2), KALOS_OK);
    kalos_handle *c2 = NULL;
    CHECK_STATUS(kalos_open(name, &o, &c2), KALOS_OK);
    CHECK_STATUS(kalos_recall(c2, q, 8, 1, NULL, rid, 1, rsc, 1, &cnt), KALOS_OK);
    CHECK(cnt == 0, "new server starts empty (memory only)");
    kalos_close(c2);
    kalos_close(s2);
}

/* ---- 5. the server's owner closes it while a client waits: SERVER_GONE, no hang ---- */
static void test_server_closed(void) {
    char name[64];
    snprintf(name, sizeof name, "charness-close-%d", (int)getpid());
    kalos_options o;
    opts_default(&o, KALOS_ROLE_SERVER, 4);
    kalos_handle *s = NULL;
    CHECK_STATUS(kalos_open(name, &o, &s), KALOS_OK);
    kalos_options co;
    opts_default(&co, KALOS_ROLE_CLIENT, 4);
    kalos_handle *c = NULL;
    CHECK_STATUS(kalos_open(name, &co, &c), KALOS_OK);
    kalos_close(s);
    float q[4] = {1, 0, 0, 0};
    uint64_t rid[1];
    float rsc[1];
    size_t cnt;
    double t0 = now_s();
    CHECK_STATUS(kalos_recall(c, q, 4, 1, NULL, rid, 1, rsc, 1, &cnt), KALOS_SERVER_GONE);
    CHECK(now_s() - t0 < 1.0, "fast SERVER_GONE after a clean stop");
    kalos_close(c);
    /* A second close is a no-op, and any call on a closed handle is KALOS_CLOSED, not a crash. */
    kalos_close(c);
    kalos_close(s);
    CHECK_STATUS(kalos_recall(c, q, 4, 1, NULL, rid, 1, rsc, 1, &cnt), KALOS_CLOSED);
    kalos_stats_info st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK_STATUS(kalos_stats(s, &st), KALOS_CLOSED);
}

/* ---- 6. role auto: the first opener becomes the server, the second attaches ---- */
static void test_role_auto(void) {
    char name[64];
    snprintf(name, sizeof name, "charness-auto-%d", (int)getpid());
    kalos_options o;
    opts_default(&o, KALOS_ROLE_AUTO, 4);
    kalos_handle *a = NULL, *b = NULL;
    CHECK_STATUS(kalos_open(name, &o, &a), KALOS_OK);
    CHECK_STATUS(kalos_open(name, &o, &b), KALOS_OK);
    uint64_t id = 5;
    float v[4] = {0, 1, 0, 0};
    CHECK_STATUS(kalos_upsert(b, &id, 1, v, 4, NULL), KALOS_OK);
    uint64_t rid[1];
    float rsc[1];
    size_t cnt = 0;
    CHECK_STATUS(kalos_recall(a, v, 4, 1, NULL, rid, 1, rsc, 1, &cnt), KALOS_OK);
    CHECK(cnt == 1 && rid[0] == 5, "auto handles share one store");
    kalos_close(b);
    kalos_close(a);
}

/* A program built against an older header allocates the older, shorter structs: the
 * initialisers write only the size it passes, and the library reads only struct_size bytes. */
static void test_older_layouts(void) {
    size_t old = offsetof(kalos_options, ephemeral);
    unsigned char *buf = malloc(old + 64);
    memset(buf, 0xA5, old + 64);
    kalos_options_init((kalos_options *)buf, old);
    int canary = 1;
    for (size_t i = old; i < old + 64; i++) canary &= buf[i] == 0xA5;
    kalos_options *o = (kalos_options *)buf;
    CHECK(canary && o->struct_size == old, "options init wrote past the caller's %zu bytes", old);
    o->role = KALOS_ROLE_SERVER;
    o->dim = 4;
    o->timeout_ms = 3000;
    char name[64];
    snprintf(name, sizeof name, "charness-old-%d", (int)getpid());
    kalos_handle *h = NULL;
    CHECK_STATUS(kalos_open(name, o, &h), KALOS_OK);
    size_t oldp = offsetof(kalos_recall_params, filter);
    unsigned char pbuf[sizeof(kalos_recall_params) + 16];
    memset(pbuf, 0x5A, sizeof pbuf);
    kalos_recall_params_init((kalos_recall_params *)pbuf, oldp);
    canary = 1;
    for (size_t i = oldp; i < sizeof pbuf; i++) canary &= pbuf[i] == 0x5A;
    CHECK(canary, "recall params init wrote past the caller's %zu bytes", oldp);
    uint64_t id = 9, rid[1];
    float v[4] = {0, 0, 1, 0}, rsc[1];
    size_t cnt = 0;
    CHECK_STATUS(kalos_upsert(h, &id, 1, v, 4, NULL), KALOS_OK);
    CHECK_STATUS(kalos_recall(h, v, 4, 1, (kalos_recall_params *)pbuf, rid, 1, rsc, 1, &cnt), KALOS_OK);
    CHECK(cnt == 1 && rid[0] == 9, "recall with the older params layout");
    kalos_options_init(NULL, sizeof *o);
    kalos_options_init(o, 2); /* below struct_size itself: a no-op */
    CHECK(o->struct_size == old, "a 2-byte init changed the struct");
    kalos_close(h);
    free(buf);
}

/* ---- 8. the cluster-mode API on a single host (cluster mode itself: tests/cluster.rs) ---- */
static void test_cluster_api(void) {
    kalos_options o;
    kalos_options_init(&o, sizeof o);
    o.role = KALOS_ROLE_SERVER;
    o.dim = 4;
    o.timeout_ms = 3000;
    char name[64];
    snprintf(name, sizeof name, "charness-cl-%d", (int)getpid());
    kalos_handle *h = NULL;
    CHECK_STATUS(kalos_open(name, &o, &h), KALOS_OK);
    uint64_t ids[2] = {1, 2}, rid[2], lid[2], le = 7, lm = 7, seqs[4];
    float v[8] = {1, 0, 0, 0, 0, 1, 0, 0}, rsc[2], lsc[2];
    size_t cnt = 9, lcnt = 9;
    CHECK_STATUS(kalos_upsert(h, ids, 2, v, 8, NULL), KALOS_OK);
    /* Outside cluster mode a write carries no token. */
    CHECK_STATUS(kalos_last_write_seqs(h, seqs, 4, &cnt), KALOS_OK);
    CHECK(cnt == 0, "single-host write token has %zu entries", cnt);
    CHECK_STATUS(kalos_last_write_seqs(h, NULL, 0, NULL), KALOS_NULL_POINTER);
    /* The consistency flags and min_seqs are accepted and ignored; the lag is 0. */
    kalos_recall_params p;
    kalos_recall_params_init(&p, sizeof p);
    CHECK(p.consistency == 0 && p.min_seqs == NULL && p.min_seqs_len == 0, "recall params init: cluster fields");
    uint64_t min[3] = {5, 0, 9};
    p.consistency = KALOS_RECALL_READ_YOUR_WRITES | KALOS_RECALL_ALLOW_STALE;
    p.min_seqs = min;
    p.min_seqs_len = 3;
    CHECK_STATUS(kalos_recall(h, v, 4, 2, NULL, rid, 2, rsc, 2, &cnt), KALOS_OK);
    CHECK_STATUS(kalos_recall_lag(h, v, 4, 2, &p, lid, 2, lsc, 2, &lcnt, &le, &lm), KALOS_OK);
    CHECK(lcnt == cnt && lid[0] == rid[0] && lid[1] == rid[1] && le == 0 && lm == 0,
          "kalos_recall_lag: %zu hits (want %zu), lag %llu entries %llu ms", lcnt, cnt, (unsigned long long)le,
          (unsigned long long)lm);
    CHECK_STATUS(kalos_recall_lag(h, v, 4, 2, &p, lid, 2, lsc, 2, &lcnt, NULL, &lm), KALOS_NULL_POINTER);
    p.consistency = 4;
    CHECK_STATUS(kalos_recall(h, v, 4, 2, &p, rid, 2, rsc, 2, &cnt), KALOS_INVALID_ARGUMENT);
    /* A caller built before the cluster fields (struct ending at filter_len) keeps its filter. */
    size_t prev = offsetof(kalos_recall_params, consistency);
    unsigned char pbuf[sizeof(kalos_recall_params)];
    memset(pbuf, 0x5A, sizeof pbuf);
    kalos_recall_params_init((kalos_recall_params *)pbuf, prev);
    kalos_recall_params *pp = (kalos_recall_params *)pbuf;
    uint64_t ns7 = 7;
    pp->namespaces = &ns7; /* no memory is in namespace 7 */
    pp->namespaces_len = 1;
    CHECK_STATUS(kalos_recall(h, v, 4, 2, pp, rid, 2, rsc, 2, &cnt), KALOS_OK);
    CHECK(cnt == 0, "a recall with the previous params layout ignored its namespace filter (%zu hits)", cnt);
    kalos_close(h);
}

/* ---- 7. request counters by op and status (kalos_stats_ops) ---- */
static void test_stats_ops(void) {
    char name[64];
    snprintf(name, sizeof name, "charness-ops-%d", (int)getpid());
    kalos_options o;
    opts_default(&o, KALOS_ROLE_SERVER, 4);
    kalos_handle *h = NULL;
    CHECK_STATUS(kalos_open(name, &o, &h), KALOS_OK);
    float v[4] = {1, 0, 0, 0};
    for (uint64_t id = 1; id <= 2; id++) CHECK_STATUS(kalos_upsert(h, &id, 1, v, 4, NULL), KALOS_OK);
    uint64_t rid[1];
    float rsc[1];
    size_t cnt = 0;
    for (int i = 0; i < 3; i++) CHECK_STATUS(kalos_recall(h, v, 4, 1, NULL, rid, 1, rsc, 1, &cnt), KALOS_OK);
    uint64_t missing = 99, del = 0;
    CHECK_STATUS(kalos_delete(h, &missing, 1, &del), KALOS_NOT_FOUND);

    /* Size query: three (op, status) pairs so far. */
    size_t needed = 0;
    CHECK_STATUS(kalos_stats_ops(h, NULL, 0, &needed), KALOS_BUFFER_TOO_SMALL);
    CHECK(needed == 3, "needed %zu, want 3", needed);
    /* Too small: out untouched, needed written (the size query is now counted too). */
    kalos_op_count out[16];
    memset(out, 0x5a, sizeof out);
    CHECK_STATUS(kalos_stats_ops(h, out, 2, &needed), KALOS_BUFFER_TOO_SMALL);
    CHECK(needed == 4 && (unsigned char)((unsigned char *)out)[0] == 0x5a, "too small: needed %zu, out untouched", needed);
    CHECK_STATUS(kalos_stats_ops(h, out, 16, &needed), KALOS_OK);
    CHECK(needed == 4, "needed %zu, want 4", needed);
    /* Ordered by op code, then status. */
    const kalos_op_count want[3] = {
        {KALOS_OP_RECALL, KALOS_OK, 3},
        {KALOS_OP_UPSERT, KALOS_OK, 2},
        {KALOS_OP_DELETE, KALOS_NOT_FOUND, 1},
    };
    for (int i = 0; i < 3; i++) {
        CHECK(out[i].op == want[i].op && out[i].status == want[i].status && out[i].count == want[i].count,
              "counter %d: %s/%s=%llu", i, kalos_op_name(out[i].op), kalos_status_str(out[i].status),
              (unsigned long long)out[i].count);
    }
    /* The server answers a stats request OK even when the caller's buffer is too small. */
    CHECK(out[3].op == KALOS_OP_STATS && out[3].status == KALOS_OK && out[3].count == 2, "stats counter: %s/%s=%llu",
          kalos_op_name(out[3].op), kalos_status_str(out[3].status), (unsigned long long)out[3].count);
    CHECK_STATUS(kalos_stats_ops(h, NULL, 0, NULL), KALOS_BUFFER_TOO_SMALL);
    CHECK_STATUS(kalos_stats_ops(h, NULL, 4, &needed), KALOS_NULL_POINTER);
    CHECK_STATUS(kalos_stats_ops(NULL, out, 16, &needed), KALOS_NULL_POINTER);
    CHECK(strcmp(kalos_op_name(KALOS_OP_RECALL), "recall") == 0 && strcmp(kalos_op_name(KALOS_OP_DELETE_WHERE), "delete_where") == 0,
          "op names");
    CHECK(strcmp(kalos_op_name(KALOS_OP_UNKNOWN), "unknown") == 0 && strcmp(kalos_op_name(1000), "unknown") == 0,
          "unknown op names");
    kalos_close(h);
}

/* ---- 8. listing ids in pages (kalos_list) ---- */
static int u64_cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Every id that params selects, in pages of `page` walked with the cursor; returns the count
   (at most cap) or (size_t)-1 on an error or a wrong `remaining`. */
static size_t list_pages(kalos_handle *h, kalos_list_params *p, size_t page, uint64_t *out, size_t cap) {
    size_t n = 0;
    p->has_after = 0;
    for (;;) {
        size_t cnt = 0;
        uint64_t remaining = 0;
        if (n + page > cap) return (size_t)-1;
        kalos_status st = kalos_list(h, p, out + n, page, &cnt, &remaining);
        if (st != KALOS_OK) return (size_t)-1;
        n += cnt;
        if (cnt < page || remaining == 0) return n;
        p->has_after = 1;
        p->after = out[n - 1];
    }
}

static void test_list(void) {
    char name[64];
    snprintf(name, sizeof name, "charness-list-%d", (int)getpid());
    kalos_options o;
    opts_default(&o, KALOS_ROLE_SERVER, 4);
    o.slot_bytes = 4096; /* a reply holds 510 ids: long pages take several requests */
    o.max_payload_bytes = 1024;
    kalos_handle *h = NULL;
    CHECK_STATUS(kalos_open(name, &o, &h), KALOS_OK);
    enum { N = 3000 };
    static uint64_t ids[N], want[N], got[N + 1024];
    static float vecs[N * 4];
    /* Distinct ids spread over the u64 range (an odd multiplier is a bijection). */
    for (size_t i = 0; i < N; i++) {
        ids[i] = (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull;
        for (int d = 0; d < 4; d++) vecs[i * 4 + d] = rndf();
    }
    /* Fields block: one item per id, field "p" = int64 i % 3 (docs/FORMATS.md). */
    static unsigned char blk[5 + N * 13];
    size_t at = 0;
    blk[at++] = 1;
    uint32_t nitems = N;
    memcpy(blk + at, &nitems, 4);
    at += 4;
    for (size_t i = 0; i < N; i++) {
        uint16_t one = 1;
        int64_t v = (int64_t)(i % 3);
        memcpy(blk + at, &one, 2);
        at += 2;
        blk[at++] = 1;
        blk[at++] = 'p';
        blk[at++] = 3;
        memcpy(blk + at, &v, 8);
        at += 8;
    }
    kalos_upsert_params up;
    kalos_upsert_params_init(&up, sizeof up);
    static uint64_t nss[N];
    for (size_t i = 0; i < N; i++) nss[i] = i % 2;
    up.namespaces = nss;
    up.namespaces_len = N;
    up.fields = blk;
    up.fields_len = at;
    CHECK_STATUS(kalos_upsert(h, ids, N, vecs, N * 4, &up), KALOS_OK);
    uint64_t gone[100];
    for (size_t i = 0; i < 100; i++) gone[i] = ids[i * 29];
    CHECK_STATUS(kalos_delete(h, gone, 100, NULL), KALOS_OK);

    /* Every memory, NULL params, one call. */
    size_t m = 0;
    for (size_t i = 0; i < N; i++)
        if (i % 29 != 0 || i / 29 >= 100) want[m++] = ids[i];
    qsort(want, m, sizeof *want, u64_cmp);
    size_t cnt = 0;
    uint64_t remaining = 99;
    CHECK_STATUS(kalos_list(h, NULL, got, N + 1024, &cnt, &remaining), KALOS_OK);
    CHECK(cnt == m && remaining == 0 && memcmp(got, want, m * sizeof *got) == 0, "list all: %zu of %zu", cnt, m);

    /* Pages of several sizes; namespace 1 and p == 0 (a filter). */
    kalos_list_params p;
    kalos_list_params_init(&p, sizeof p);
    size_t sizes[3] = {1, 97, 1200};
    for (int s = 0; s < 3; s++) {
        size_t n = list_pages(h, &p, sizes[s], got, N + 1024);
        CHECK(n == m && memcmp(got, want, m * sizeof *got) == 0, "pages of %zu: %zu of %zu", sizes[s], n, m);
    }
    uint64_t one_ns = 1;
    const unsigned char eq_p0[] = {1, 4, 1, 'p', 3, 0, 0, 0, 0, 0, 0, 0, 0};
    p.namespaces = &one_ns;
    p.namespaces_len = 1;
    p.filter = eq_p0;
    p.filter_len = sizeof eq_p0;
    size_t w = 0;
    for (size_t i = 0; i < N; i++)
        if ((i % 29 != 0 || i / 29 >= 100) && i % 2 == 1 && i % 3 == 0) want[w++] = ids[i];
    qsort(want, w, sizeof *want, u64_cmp);
    size_t n = list_pages(h, &p, 50, got, N + 1024);
    CHECK(n == w && memcmp(got, want, w * sizeof *got) == 0, "namespace 1, p == 0: %zu of %zu", n, w);
    /* Counting only: ids NULL, ids_len 0. */
    p.has_after = 0;
    cnt = 7;
    CHECK_STATUS(kalos_list(h, &p, NULL, 0, &cnt, &remaining), KALOS_OK);
    CHECK(cnt == 0 && remaining == w, "count only: %llu, want %zu", (unsigned long long)remaining, w);

    /* Deletes between pages: an id ahead of the cursor is not listed. */
    p.namespaces = NULL;
    p.namespaces_len = 0;
    p.filter = NULL;
    p.filter_len = 0;
    CHECK_STATUS(kalos_list(h, &p, got, 10, &cnt, &remaining), KALOS_OK);
    uint64_t ahead = want[w - 1];
    CHECK_STATUS(kalos_delete(h, &ahead, 1, NULL), KALOS_OK);
    p.has_after = 1;
    p.after = got[9];
    CHECK_STATUS(kalos_list(h, &p, got, N + 1024, &cnt, &remaining), KALOS_OK);
    int seen = 0, up_only = 1;
    for (size_t i = 0; i < cnt; i++) {
        seen |= got[i] == ahead;
        if (i > 0 && got[i] <= got[i - 1]) up_only = 0;
    }
    CHECK(!seen && up_only && cnt == m - 11, "after a delete ahead of the cursor: %zu ids, want %zu", cnt, m - 11);

    /* Bad input: a malformed filter, has_after 2, a short struct, NULL count or ids; outputs
       untouched. */
    const unsigned char bad[] = {1, 99};
    kalos_list_params_init(&p, sizeof p);
    p.filter = bad;
    p.filter_len = sizeof bad;
    cnt = 12345;
    CHECK_STATUS(kalos_list(h, &p, got, 10, &cnt, &remaining), KALOS_INVALID_ARGUMENT);
    CHECK(cnt == 12345 && strstr(kalos_last_error(), "unknown operator 99") != NULL, "malformed filter: %s", kalos_last_error());
    kalos_list_params_init(&p, sizeof p);
    p.has_after = 2;
    CHECK_STATUS(kalos_list(h, &p, got, 10, &cnt, &remaining), KALOS_INVALID_ARGUMENT);
    kalos_list_params_init(&p, sizeof p);
    p.struct_size = 8;
    CHECK_STATUS(kalos_list(h, &p, got, 10, &cnt, &remaining), KALOS_INVALID_ARGUMENT);
    CHECK_STATUS(kalos_list(h, NULL, got, 10, NULL, &remaining), KALOS_NULL_POINTER);
    CHECK_STATUS(kalos_list(h, NULL, NULL, 10, &cnt, &remaining), KALOS_NULL_POINTER);
    CHECK_STATUS(kalos_list(NULL, NULL, got, 10, &cnt, &remaining), KALOS_NULL_POINTER);
    CHECK(cnt == 12345, "count untouched by failed calls");
    CHECK_STATUS(kalos_list(h, NULL, got, 10, &cnt, NULL), KALOS_OK);
    CHECK(cnt == 10, "remaining may be NULL");
    /* The initialiser stays within the caller's size. */
    unsigned char pbuf[sizeof(kalos_list_params) + 8];
    memset(pbuf, 0x5A, sizeof pbuf);
    kalos_list_params_init((kalos_list_params *)pbuf, 16);
    int canary = 1;
    for (size_t i = 16; i < sizeof pbuf; i++) canary &= pbuf[i] == 0x5A;
    CHECK(canary && ((kalos_list_params *)pbuf)->struct_size == 16, "list params init wrote past 16 bytes");
    CHECK(strcmp(kalos_op_name(KALOS_OP_LIST), "list") == 0, "op name of list");
    kalos_close(h);
}

/* ---- 9. device shards: a sharded store answers exactly like an unsharded one ----
 * Both stores get the same writes (upserts in random namespaces, a tenth replaced with new vectors
 * and namespaces, deletes by id and by namespace); every recall, single and batched, with and
 * without a namespace filter, must give the same ids and bit-identical scores. The vectors hold
 * small integers, so every ip and l2 score is exact in float whatever the summation order, and
 * ties (broken by the lower id) are common. */
#define SH_DIM 16
#define SH_ROWS 4000
#define SH_NS 12
#define SH_K 50
#define SH_NQ 24

static void int_vectors(float *v, size_t n) {
    for (size_t i = 0; i < n * SH_DIM; i++) v[i] = (float)(int)(rnd() % 7) - 3.0f;
}

static int engine_is_sharded(kalos_handle *h, const char *prefix) {
    kalos_stats_info si;
    memset(&si, 0, sizeof si);
    si.struct_size = sizeof si;
    if (kalos_stats(h, &si) != KALOS_OK) return -1;
    return strncmp(si.engine_name, prefix, strlen(prefix)) == 0;
}

/* Both stores' answers to one request; returns 1 when they are identical. */
static int same_batch(kalos_handle *a, kalos_handle *b, const float *qs, size_t nq, uint32_t k,
                      const kalos_recall_params *p, size_t *hits) {
    static uint64_t ia[SH_NQ * SH_K], ib[SH_NQ * SH_K];
    static float sa[SH_NQ * SH_K], sb[SH_NQ * SH_K];
    size_t ca[SH_NQ], cb[SH_NQ];
    memset(ia, 0, sizeof ia);
    memset(ib, 0, sizeof ib);
    memset(sa, 0, sizeof sa);
    memset(sb, 0, sizeof sb);
    if (nq == 1) {
        if (kalos_recall(a, qs, SH_DIM, k, p, ia, k, sa, k, &ca[0]) != KALOS_OK) return 0;
        if (kalos_recall(b, qs, SH_DIM, k, p, ib, k, sb, k, &cb[0]) != KALOS_OK) return 0;
    } else {
        if (kalos_recall_batch(a, qs, nq * SH_DIM, nq, k, p, ia, nq * k, sa, nq * k, ca, nq) != KALOS_OK) return 0;
        if (kalos_recall_batch(b, qs, nq * SH_DIM, nq, k, p, ib, nq * k, sb, nq * k, cb, nq) != KALOS_OK) return 0;
    }
    for (size_t i = 0; i < nq; i++) {
        if (ca[i] != cb[i]) return 0;
        if (memcmp(ia + i * k, ib + i * k, ca[i] * sizeof *ia) != 0) return 0;
        if (memcmp(sa + i * k, sb + i * k, ca[i] * sizeof *sa) != 0) return 0;
        *hits += ca[i];
    }
    return 1;
}

static void test_device_shards(void) {
    static uint64_t ids[SH_ROWS], ns[SH_ROWS], again_ns[SH_ROWS / 10], gone[300];
    static float vecs[SH_ROWS * SH_DIM], again_vecs[SH_ROWS / 10 * SH_DIM], qs[SH_NQ * SH_DIM];
    for (uint32_t placement = KALOS_PLACEMENT_ID; placement <= KALOS_PLACEMENT_NAMESPACE; placement++) {
        char sname[64], pname[64];
        snprintf(sname, sizeof sname, "charness-shards-%u-%d", placement, (int)getpid());
        snprintf(pname, sizeof pname, "charness-plain-%u-%d", placement, (int)getpid());
        kalos_options o;
        opts_default(&o, KALOS_ROLE_SERVER, SH_DIM);
        o.backend = KALOS_BACKEND_CPU;
        o.metric = placement == KALOS_PLACEMENT_ID ? KALOS_METRIC_IP : KALOS_METRIC_L2;
        o.capacity = 20000;
        kalos_handle *plain = NULL, *sharded = NULL;
        CHECK_STATUS(kalos_open(pname, &o, &plain), KALOS_OK);
        o.device_shards = 3;
        o.placement = placement;
        CHECK_STATUS(kalos_open(sname, &o, &sharded), KALOS_OK);
        if (!plain || !sharded) {
            kalos_close(plain);
            kalos_close(sharded);
            return;
        }
        CHECK(engine_is_sharded(sharded, "shards3x[") == 1, "sharded engine name (placement %u)", placement);
        CHECK(engine_is_sharded(plain, "shards") == 0, "unsharded engine name");

        for (size_t i = 0; i < SH_ROWS; i++) {
            ids[i] = (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull; /* distinct: an odd multiplier */
            ns[i] = rnd() % SH_NS;
        }
        int_vectors(vecs, SH_ROWS);
        for (size_t i = 0; i < SH_ROWS / 10; i++) again_ns[i] = rnd() % SH_NS;
        int_vectors(again_vecs, SH_ROWS / 10);
        for (size_t i = 0; i < 300; i++) gone[i] = ids[SH_ROWS - 1 - i * 7];
        kalos_handle *both[2] = {plain, sharded};
        uint64_t live[2] = {0, 0};
        for (int s = 0; s < 2; s++) {
            kalos_upsert_params up;
            kalos_upsert_params_init(&up, sizeof up);
            up.namespaces = ns;
            up.namespaces_len = SH_ROWS;
            CHECK_STATUS(kalos_upsert(both[s], ids, SH_ROWS, vecs, SH_ROWS * SH_DIM, &up), KALOS_OK);
            up.namespaces = again_ns;
            up.namespaces_len = SH_ROWS / 10;
            CHECK_STATUS(kalos_upsert(both[s], ids, SH_ROWS / 10, again_vecs, SH_ROWS / 10 * SH_DIM, &up), KALOS_OK);
            CHECK_STATUS(kalos_delete(both[s], gone, 300, NULL), KALOS_OK);
            CHECK_STATUS(kalos_delete_namespace(both[s], 5, NULL), KALOS_OK);
            kalos_stats_info si;
            memset(&si, 0, sizeof si);
            si.struct_size = sizeof si;
            CHECK_STATUS(kalos_stats(both[s], &si), KALOS_OK);
            live[s] = si.count;
        }
        CHECK(live[0] == live[1] && live[0] > SH_ROWS / 2, "live counts %llu and %llu", (unsigned long long)live[0],
              (unsigned long long)live[1]);

        int bad = 0;
        size_t hits = 0;
        for (int t = 0; t < 300 && !bad; t++) {
            size_t nq = t % 4 == 0 ? 2 + rnd() % (SH_NQ - 1) : 1;
            uint32_t k = 1 + (uint32_t)(rnd() % SH_K);
            int_vectors(qs, nq);
            uint64_t nss[3];
            kalos_recall_params p;
            kalos_recall_params_init(&p, sizeof p);
            if (rnd() % 5 >= 2) {
                p.namespaces_len = 1 + rnd() % 3;
                for (size_t i = 0; i < p.namespaces_len; i++) nss[i] = rnd() % (SH_NS + 2);
                p.namespaces = nss;
            }
            if (!same_batch(sharded, plain, qs, nq, k, &p, &hits)) {
                bad = 1;
                CHECK(0, "placement %u, request %d (nq %zu, k %u, %zu namespaces): sharded and unsharded differ", placement,
                      t, nq, k, p.namespaces_len);
            }
        }
        CHECK(bad || hits > 300, "placement %u: %zu hits in all", placement, hits);
        kalos_close(sharded);
        kalos_close(plain);
    }

    /* Bad options: too many shards, an unknown placement, the CUDA backend; no handle. */
    char name[64];
    snprintf(name, sizeof name, "charness-shards-bad-%d", (int)getpid());
    kalos_options o;
    opts_default(&o, KALOS_ROLE_SERVER, 4);
    o.backend = KALOS_BACKEND_CPU;
    kalos_handle *h = NULL;
    o.device_shards = KALOS_MAX_DEVICE_SHARDS + 1;
    CHECK_STATUS(kalos_open(name, &o, &h), KALOS_INVALID_ARGUMENT);
    CHECK(strstr(kalos_last_error(), "device_shards = 65") != NULL, "65 shards: %s", kalos_last_error());
    o.device_shards = 2;
    o.placement = 7;
    CHECK_STATUS(kalos_open(name, &o, &h), KALOS_INVALID_ARGUMENT);
    o.placement = KALOS_PLACEMENT_ID;
    o.backend = KALOS_BACKEND_CUDA;
    /* A sharded CUDA store: one CUDA engine a shard where there is a GPU, else a clear error. */
    kalos_status_code st = kalos_open(name, &o, &h);
    if (st == KALOS_OK) {
        CHECK(engine_is_sharded(h, "shards2x[cuda") == 1, "a sharded CUDA store without CUDA shards");
        kalos_close(h);
        h = NULL;
    } else {
        CHECK(st == KALOS_BACKEND_UNAVAILABLE, "sharded CUDA store: status %d (%s)", (int)st, kalos_last_error());
        CHECK(h == NULL, "a failed open wrote a handle");
    }
    /* A caller built before device_shards (struct_size ends before it) gets one table. */
    o.backend = KALOS_BACKEND_CPU;
    o.device_shards = KALOS_MAX_DEVICE_SHARDS + 1;
    o.struct_size = offsetof(kalos_options, device_shards);
    CHECK_STATUS(kalos_open(name, &o, &h), KALOS_OK);
    if (h) {
        CHECK(engine_is_sharded(h, "shards") == 0, "an older options struct opened a sharded store");
        kalos_close(h);
    }
}

int main(void) {
    const char *seed = getenv("KALOS_SEED");
    g_rng = seed ? strtoull(seed, NULL, 10) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    if (g_rng == 0) g_rng = 1;
    printf("kalos C harness: library %s, seed %llu\n", kalos_version(), (unsigned long long)g_rng);
    test_errors();
    test_version_mismatch();
    test_role_auto();
    test_older_layouts();
    test_stats_ops();
    test_list();
    test_device_shards();
    test_cluster_api();
    test_server_closed();
    test_server_killed();
    test_multiprocess();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail == 0 ? 0 : 1;
}
