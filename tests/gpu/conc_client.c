/* One client process of the concurrency benchmark (tests/gpu/concurrency.py).
 *
 * Attaches to a running store as a client (KALOS_ROLE_CLIENT), waits for a common start time,
 * then calls kalos_recall with one fresh random query at a time, back to back, until the end of
 * its window. Every request that completes inside the measured window (after the warm-up) has
 * its latency recorded; at the end the latencies go to OUTFILE as raw little-endian uint64 ns
 * (the driver merges every client's file) and one JSON line of summary numbers goes to stdout.
 *
 *   conc_client NAME START_NS WARM_MS SECS_MS SEED OUTFILE [K]
 *
 * START_NS is a CLOCK_MONOTONIC time in ns (Python: time.monotonic_ns(); one host). The
 * measured window is [START + WARM, START + WARM + SECS); a request counts when it completes in
 * it. Queries: dim floats, each the sum of four 16-bit uniforms from one xorshift64* draw,
 * centred and scaled to unit variance (Irwin-Hall, standard-normal-ish), seeded per process.
 *
 * Environment: CONC_CLIENT_SPIN_NS sets kalos_options.client_spin_ns (default: the library's);
 * CONC_TIMEOUT_MS sets the per-call deadline (default 5000).
 *
 * Never hangs: every call has its deadline, the loop ends at the window's end, and alarm()
 * kills the process 15 s + one deadline after it. A recall error is counted (by status, first
 * message kept); SERVER_GONE ends the loop at once.
 * Exit: 0 ok, 1 usage, 2 open failed, 3 recall errors (the JSON line and OUTFILE are written).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kalos.h"

#define NSTATUS 64

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    struct timespec ts;
    ts.tv_sec = (time_t)(t / 1000000000ull);
    ts.tv_nsec = (long)(t % 1000000000ull);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t xorshift64s(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* One standard-normal-ish value per draw: (u1+u2+u3+u4 - 2) * sqrt(3), u_i 16-bit uniforms. */
static void fill_query(float *q, uint32_t dim, uint64_t *rng) {
    for (uint32_t i = 0; i < dim; i++) {
        uint64_t r = xorshift64s(rng);
        uint32_t s = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) + (uint32_t)((r >> 32) & 0xffff) +
                     (uint32_t)(r >> 48);
        q[i] = ((float)s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
    }
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array (p in [0, 100]). */
static uint64_t pct(const uint64_t *v, size_t n, double p) {
    if (n == 0) return 0;
    size_t i = (size_t)(p / 100.0 * (double)n);
    if (i >= n) i = n - 1;
    return v[i];
}

/* Writes s as a JSON string body (quotes, backslashes and control characters escaped). */
static void json_str(const char *s) {
    putchar('"');
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s NAME START_NS WARM_MS SECS_MS SEED OUTFILE [K]\n", argv[0]);
        return 1;
    }
    const char *name = argv[1];
    uint64_t start = strtoull(argv[2], NULL, 10);
    uint64_t warm_ns = strtoull(argv[3], NULL, 10) * 1000000ull;
    uint64_t secs_ns = strtoull(argv[4], NULL, 10) * 1000000ull;
    uint64_t seed = strtoull(argv[5], NULL, 10);
    const char *outfile = argv[6];
    uint32_t k = argc > 7 ? (uint32_t)strtoul(argv[7], NULL, 10) : 10;
    if (k == 0 || k > KALOS_MAX_K || secs_ns == 0) {
        fprintf(stderr, "bad K or SECS_MS\n");
        return 1;
    }
    uint64_t timeout_ms = getenv("CONC_TIMEOUT_MS") ? strtoull(getenv("CONC_TIMEOUT_MS"), NULL, 10) : 5000;
    uint64_t w0 = start + warm_ns, w1 = w0 + secs_ns;
    uint64_t t_launch = now_ns();
    /* Hard self-deadline: the end of the window plus one call deadline plus 15 s. */
    uint64_t left_ns = w1 > t_launch ? w1 - t_launch : 0;
    alarm((unsigned)(left_ns / 1000000000ull + timeout_ms / 1000 + 16));

    kalos_options o;
    kalos_options_init(&o, sizeof o);
    o.role = KALOS_ROLE_CLIENT;
    o.timeout_ms = timeout_ms;
    if (getenv("CONC_CLIENT_SPIN_NS")) o.client_spin_ns = strtoull(getenv("CONC_CLIENT_SPIN_NS"), NULL, 10);
    kalos_handle *h = NULL;
    kalos_status st = kalos_open(name, &o, &h);
    if (st != KALOS_OK) {
        printf("{\"pid\":%ld,\"open_status\":%d,\"open_status_name\":", (long)getpid(), (int)st);
        json_str(kalos_status_str(st));
        printf(",\"error\":");
        json_str(kalos_last_error());
        printf("}\n");
        return 2;
    }
    uint32_t dim = 0;
    st = kalos_dim(h, &dim);
    if (st != KALOS_OK || dim == 0) {
        printf("{\"pid\":%ld,\"open_status\":%d,\"error\":", (long)getpid(), (int)st);
        json_str(st != KALOS_OK ? kalos_last_error() : "dim 0");
        printf("}\n");
        kalos_close(h);
        return 2;
    }
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 12345;
    rng = splitmix64(&rng) | 1; /* xorshift state must be non-zero */
    float *q = malloc(sizeof(float) * dim);
    uint64_t *ids = malloc(sizeof(uint64_t) * k);
    float *scores = malloc(sizeof(float) * k);
    size_t cap = 1 << 16, n = 0;
    uint64_t *lat = malloc(sizeof(uint64_t) * cap);
    if (!q || !ids || !scores || !lat) {
        fprintf(stderr, "out of memory\n");
        return 2;
    }
    uint64_t ready = now_ns();
    int64_t late_ns = (int64_t)(ready - start); /* > 0: this client was ready after the start */

    sleep_until(start);
    uint64_t n_all = 0, n_err = 0, n_err_window = 0, gen_ns = 0, hits_short = 0;
    uint64_t err_by_status[NSTATUS] = {0};
    int first_err = -1;
    char first_msg[512] = "";
    size_t count = 0;
    uint64_t t_end = 0;
    for (;;) {
        uint64_t g0 = now_ns();
        if (g0 >= w1) break;
        fill_query(q, dim, &rng);
        uint64_t t0 = now_ns();
        st = kalos_recall(h, q, dim, k, NULL, ids, k, scores, k, &count);
        uint64_t t1 = now_ns();
        gen_ns += t0 - g0;
        n_all++;
        t_end = t1;
        if (st != KALOS_OK) {
            n_err++;
            if (t1 >= w0 && t1 < w1) n_err_window++;
            err_by_status[(st >= 0 && st < NSTATUS) ? st : NSTATUS - 1]++;
            if (first_err < 0) {
                first_err = st;
                snprintf(first_msg, sizeof first_msg, "%s", kalos_last_error());
            }
            if (st == KALOS_SERVER_GONE || st == KALOS_CLOSED) break;
            continue;
        }
        if (count != k) hits_short++;
        if (t1 >= w0 && t1 < w1) {
            if (n == cap) {
                cap *= 2;
                uint64_t *nl = realloc(lat, sizeof(uint64_t) * cap);
                if (!nl) {
                    fprintf(stderr, "out of memory\n");
                    return 2;
                }
                lat = nl;
            }
            lat[n++] = t1 - t0;
        }
    }
    kalos_close(h);

    FILE *f = fopen(outfile, "wb");
    int wrote = f && fwrite(lat, sizeof(uint64_t), n, f) == n;
    if (f && fclose(f) != 0) wrote = 0;
    qsort(lat, n, sizeof(uint64_t), cmp_u64);
    long double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (long double)lat[i];
    printf("{\"pid\":%ld,\"seed\":%llu,\"dim\":%u,\"k\":%u,\"late_ns\":%lld,\"n\":%zu,\"n_all\":%llu,"
           "\"p50_ns\":%llu,\"p99_ns\":%llu,\"p999_ns\":%llu,\"max_ns\":%llu,\"mean_ns\":%.1f,"
           "\"gen_ns_mean\":%.1f,\"hits_short\":%llu,\"overrun_ns\":%lld,\"errors\":%llu,\"errors_in_window\":%llu,"
           "\"wrote\":%s,\"errors_by_status\":{",
           (long)getpid(), (unsigned long long)seed, dim, k, (long long)late_ns, n, (unsigned long long)n_all,
           (unsigned long long)pct(lat, n, 50), (unsigned long long)pct(lat, n, 99), (unsigned long long)pct(lat, n, 99.9),
           (unsigned long long)(n ? lat[n - 1] : 0), n ? (double)(sum / n) : 0.0,
           n_all ? (double)gen_ns / (double)n_all : 0.0, (unsigned long long)hits_short,
           (long long)(t_end > w1 ? t_end - w1 : 0), (unsigned long long)n_err, (unsigned long long)n_err_window,
           wrote ? "true" : "false");
    int sep = 0;
    for (int s = 0; s < NSTATUS; s++) {
        if (err_by_status[s]) {
            printf("%s", sep ? "," : "");
            json_str(kalos_status_str(s));
            printf(":%llu", (unsigned long long)err_by_status[s]);
            sep = 1;
        }
    }
    printf("},\"first_error_status\":%d,\"first_error\":", first_err);
    json_str(first_msg);
    printf("}\n");
    fflush(stdout);
    free(q);
    free(ids);
    free(scores);
    free(lat);
    if (!wrote) {
        fprintf(stderr, "cannot write %s\n", outfile);
        return 2;
    }
    return n_err ? 3 : 0;
}
