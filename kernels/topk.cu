// Kalos GPU kernels: fused scan + exact top-k (single query), GEMM-tile selection (batches),
// incremental table updates. Compiled at server start by NVRTC to a CUBIN for the device's own
// architecture, specialised by the defines below (no headers: NVRTC needs none of the toolkit).
//
//   DIM     vector dimension                        (default 128)
//   DTYPE   0 = f32, 1 = f16, 2 = bf16 table storage (default 0)
//   METRIC  0 = ip, 1 = cosine (stored normalised: ip), 2 = l2 (squared distance)
//
// Ranking uses a 32-bit "key" per row: the float score mapped to an unsigned integer whose
// order is the float order (l2 scores are negated distances first). Key 0 never comes from a
// float and marks a row the request may not see (namespace filter, expiry). Ties on the key are
// broken by the lower 64-bit id, exactly as the CPU engine does, so results match bit for bit
// in order whenever the scores do.
//
// Selection is a block-wide radix select (4 passes of 8 bits over the key, then, only if more
// rows share the k-th key than are needed, 8 passes over the ids of those rows), so any k up to
// 1024 works the same way. Every block selects the top k of its own slice of the table, raises a
// global bound to its k-th key (the best k-th key of any block bounds the answer's k-th key from
// below) and appends only its candidates at or above the bound; the last block to finish (an
// atomic ticket) merges the few survivors (a direct rank when they are at most one per thread,
// the radix select otherwise) and writes the sorted answer: one kernel for the whole
// single-query path.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;

#ifndef DIM
#define DIM 128
#endif
#ifndef DTYPE
#define DTYPE 0
#endif
#ifndef METRIC
#define METRIC 0
#endif

#define NT 256          // threads per block
#define CHUNK 4096      // most rows one block scores (keys held in shared memory)
#define KMAX 1024
#define MAXNS 64
#define NONE_U32 0xFFFFFFFFu
#define FLAG_EXPIRY 1u
#define FLAG_RECENCY 2u

#if DTYPE == 0
#define VEC 4
#else
#define VEC 8
#endif
#define DP (((DIM + VEC - 1) / VEC) * VEC)   // padded row length (elements); 16-byte rows
#define NV (DP / VEC)                         // 16-byte vectors per row
#if NV >= 17
#define GS 32
#elif NV >= 9
#define GS 16
#elif NV >= 5
#define GS 8
#elif NV >= 3
#define GS 4
#elif NV == 2
#define GS 2
#else
#define GS 1
#endif
#define NCH ((NV + GS - 1) / GS)              // 16-byte loads per lane per row
#if NCH * VEC <= 48
#define QREG 1                                // query slice held in registers
#else
#define QREG 0                                // query read from shared memory
#endif
#if NCH >= 12
#define RU0 1
#elif (12 / NCH) > 8
#define RU0 8
#else
#define RU0 (12 / NCH)                        // rows in flight per lane group
#endif
// PIPE=1 (default): the scan loads the next rows before it computes the current ones, with half
// as many rows per step (PIPE=2: as many), so loads stay in flight across the compute.
#ifndef SLOTS
#define SLOTS 1  // single query: fixed candidate slots per block (see scan_topk_body)
#endif
#ifndef PIPE
#define PIPE 1
#endif
#ifndef SMALL_FIRST
#define SMALL_FIRST 1  // single query: blocks of <= SMALL_ROWS rows rank their keys directly (at
                       // 10k x 128 on the H200 the select phase went 2.1 -> 1.7 us)
#endif
#if PIPE == 1 && RU0 > 1
#define RU (RU0 / 2)
#else
#define RU RU0
#endif

// Request parameters, copied to the device with the query (layout mirrored in cuda.rs).
struct Params {
    u32 n;        // table rows
    u32 k;        // results wanted (1..1024)
    u32 nns;      // namespaces in the filter, NONE_U32 = no filter
    u32 flags;    // FLAG_EXPIRY | FLAG_RECENCY
    u64 now_ms;
    float w;      // recency weight
    float qnorm;  // |q|^2 (l2, single query)
    double hl;    // recency half-life, ms
    u32 grid;     // blocks taking part (single-query kernel)
    u32 chunk;    // rows per block
    u32 ntiles;   // batched path: candidate blocks per query = ntiles * grid
    u32 fseg;     // batch_filter: steps per cruise segment (<= 1: a barrier every step)
    u32 seq;      // single query: sequence number published after the results
    float qscale; // single query, f16 packed path: max |q| (the query is scaled to <= 1 in f16)
    u64 ns[MAXNS];
    u64 dst;      // single query: device address of the client's slot (its response body), or 0
};
#define PARAMS_BYTES 640
// Dynamic shared memory of the search kernels before the (optional) query copy: the chunk keys
// (CHUNK*4) share the first 32 KiB with the merge input (MCAP*8); then 16 KiB of merge output.
#define SMEM_MAIN (4096 * 8 + 1024 * 16)
#define MCAP 4096  // candidates the final merge compacts into shared memory

// Table columns on the device.
struct Table {
    const void* vecs;        // n x DP elements
    const float* norms;      // l2: |x|^2
    const u64* ids;
    const u64* ns;
    const u64* created;
    const u64* expires;
};

__device__ __forceinline__ u32 f2key(float f) {
    u32 u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key2f(u32 k) {
    u32 u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    return __uint_as_float(u);
}
__device__ __forceinline__ float h2f(u32 h) {
    float f;
    unsigned short s = (unsigned short)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    unsigned short s;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(s) : "f"(f));
    return s;
}
__device__ __forceinline__ u16 f2bf(float f) {
    unsigned short s;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(s) : "f"(f));
    return s;
}

// Phase timestamps of the single-query kernel (PROF=1, KALOS_PROF=1 on the host: a tuning aid):
// u64 stamps written after the results in the mapped output buffer, at PROF_OFF.
#ifndef PROF
#define PROF 0
#endif
#define PROF_OFF (8 + KMAX * 12)
__device__ __forceinline__ void stamp(unsigned char* out, int i) {
#if PROF
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    ((volatile u64*)(out + PROF_OFF))[i] = t;
#endif
}

// Table rows are read once per query: they bypass L1 allocation (LDNA=0 gives a plain __ldg;
// the two measured the same on the H200, LDNA=1 is the configuration the benchmark ran).
#ifndef LDNA
#define LDNA 1
#endif
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
#if LDNA
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
#else
    return __ldg(p);
#endif
}

// Dot product of one 16-byte vector of stored elements with VEC query values.
__device__ __forceinline__ float dot16(uint4 v, const float* q, float acc) {
#if DTYPE == 0
    acc = fmaf(__uint_as_float(v.x), q[0], acc);
    acc = fmaf(__uint_as_float(v.y), q[1], acc);
    acc = fmaf(__uint_as_float(v.z), q[2], acc);
    acc = fmaf(__uint_as_float(v.w), q[3], acc);
#elif DTYPE == 1
    acc = fmaf(h2f(v.x & 0xffffu), q[0], acc);
    acc = fmaf(h2f(v.x >> 16), q[1], acc);
    acc = fmaf(h2f(v.y & 0xffffu), q[2], acc);
    acc = fmaf(h2f(v.y >> 16), q[3], acc);
    acc = fmaf(h2f(v.z & 0xffffu), q[4], acc);
    acc = fmaf(h2f(v.z >> 16), q[5], acc);
    acc = fmaf(h2f(v.w & 0xffffu), q[6], acc);
    acc = fmaf(h2f(v.w >> 16), q[7], acc);
#else
    acc = fmaf(__uint_as_float(v.x << 16), q[0], acc);
    acc = fmaf(__uint_as_float(v.x & 0xffff0000u), q[1], acc);
    acc = fmaf(__uint_as_float(v.y << 16), q[2], acc);
    acc = fmaf(__uint_as_float(v.y & 0xffff0000u), q[3], acc);
    acc = fmaf(__uint_as_float(v.z << 16), q[4], acc);
    acc = fmaf(__uint_as_float(v.z & 0xffff0000u), q[5], acc);
    acc = fmaf(__uint_as_float(v.w << 16), q[6], acc);
    acc = fmaf(__uint_as_float(v.w & 0xffff0000u), q[7], acc);
#endif
    return acc;
}

#if DTYPE == 1 && QREG
// f16 storage: packed half2 products of 8 elements summed in f16 (4 HFMA2), then added in f32.
// One 16-byte load costs 4 HFMA2 + 2 conversions instead of 8 conversions + 8 FFMA: the
// conversion rate, not memory, bounded the plain version. The query is pre-scaled to |q| <= 1
// (P.qscale) so partial sums stay far from the f16 range limit for stored |x| < ~8000.
#define HALF2_DOT 1
__device__ __forceinline__ float dot16h(uint4 v, const u32* qh, float acc) {
    u32 a;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(a) : "r"(v.x), "r"(qh[0]), "r"(0u));
    asm("fma.rn.f16x2 %0, %1, %2, %0;" : "+r"(a) : "r"(v.y), "r"(qh[1]));
    asm("fma.rn.f16x2 %0, %1, %2, %0;" : "+r"(a) : "r"(v.z), "r"(qh[2]));
    asm("fma.rn.f16x2 %0, %1, %2, %0;" : "+r"(a) : "r"(v.w), "r"(qh[3]));
    return acc + h2f(a & 0xffffu) + h2f(a >> 16);
}
#else
#define HALF2_DOT 0
#endif

// l2: the negated squared distance from the dot product and the two squared norms.
__device__ __forceinline__ float l2_score(float dot, float qnorm, float norm) {
    return -fmaxf(qnorm - 2.0f * dot + norm, 0.0f);
}

// Raw similarity (dot, or for l2 the dot turned into a negated distance) -> ranking key,
// applying recency, the namespace filter and expiry. `sns` is the filter in shared memory.
__device__ __forceinline__ u32 make_key(float dot, float qnorm, u32 row, const Params& P, const Table& T,
                                        const u64* sns) {
#if METRIC == 2
    float s = l2_score(dot, qnorm, T.norms[row]);
#else
    float s = dot;
#endif
    if (P.flags & FLAG_RECENCY) {
        u64 c = T.created[row];
        u64 age = P.now_ms > c ? P.now_ms - c : 0ull;
        float boost = (float)exp2(-(double)age / P.hl);
        s = (1.0f - P.w) * s + P.w * boost;
    }
    bool ok = true;
    if (P.nns != NONE_U32) {
        u64 ns = T.ns[row];
        ok = false;
        for (u32 i = 0; i < P.nns; i++) ok |= (sns[i] == ns);
    }
    if (P.flags & FLAG_EXPIRY) ok &= T.expires[row] > P.now_ms;
    return ok ? f2key(s) : 0u;
}

// ---------------------------------------------------------------------------------------------
// Block-wide radix select.
// ---------------------------------------------------------------------------------------------

struct SelShared {
    u32 hist[256];
    u32 wsum[NT / 32];
    u32 prefix, mask, need, bincount, total, all;
    u64 idprefix, idmask;
    u32 idneed, tie;  // tie: 1 when tied rows are cut by id (idprefix is the largest id taken)
    u32 cnt;
    u32 last;
    u32 mbound, mtotal;  // values read from global memory by one thread for the whole block
};

// Inclusive scan of one value per thread (NT threads), top-down or bottom-up order handled by
// the caller. Returns the inclusive prefix for thread t.
__device__ __forceinline__ u32 block_scan(u32 v, SelShared& S) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u32 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) S.wsum[warp] = x;
    __syncthreads();
    u32 add = 0;
    for (int w = 0; w < warp; w++) add += S.wsum[w];
    __syncthreads();
    return x + add;
}

// Accessor over the chunk keys of one block (shared memory).
struct ChunkAcc {
    const u32* keys;
    u32 row0;
    const u64* ids;
    __device__ __forceinline__ u32 key(u32 i) const { return keys[i]; }
    __device__ __forceinline__ u32 row(u32 i) const { return row0 + i; }
    __device__ __forceinline__ u64 id(u32 i) const { return ids[row0 + i]; }
};

// Accessor over the flat candidate array of the single-query path (global memory, appended by
// every block): entries below the bound `lo` read as key 0 (not taken).
struct FlatAcc {
    const u32* ckey;
    const u32* crow;
    u32 lo;
    const u64* ids;
    __device__ __forceinline__ u32 key(u32 i) const {
        u32 kk = __ldcg(ckey + i);
        return kk >= lo ? kk : 0u;
    }
    __device__ __forceinline__ u32 row(u32 i) const { return __ldcg(crow + i); }
    __device__ __forceinline__ u64 id(u32 i) const { return ids[__ldcg(crow + i)]; }
};

// Finds the rule that takes exactly min(k, valid) elements of `a[0..m)`; result in S. With
// `ties`, every element equal to the k-th key is taken too (the ids are not consulted), so more
// than k may be: f16 score tiles (below) must never cut between rows whose rounded keys tie.
template <class A>
__device__ void select_rule(const A& a, u32 m, u32 k, SelShared& S, bool ties = false) {
    const int t = threadIdx.x;
    if (t == 0) { S.prefix = 0; S.mask = 0; S.need = k; S.all = 0; S.tie = 0; S.total = 0; }
    __syncthreads();
    for (int pass = 0; pass < 4; pass++) {
        const int shift = 24 - 8 * pass;
        S.hist[t] = 0;
        __syncthreads();
        const u32 prefix = S.prefix, mask = S.mask;
        for (u32 i = t; i < m; i += NT) {
            u32 kk = a.key(i);
            // Scores cluster in a few bins of the top digits: aggregate equal bins per warp so
            // that one shared-memory atomic serves every lane that hit the bin.
            u32 bin = (kk != 0u && (kk & mask) == prefix) ? ((kk >> shift) & 255u) : 256u;
            u32 peers = __match_any_sync(__activemask(), bin);
            if (bin < 256u && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&S.hist[bin], (u32)__popc(peers));
        }
        __syncthreads();
        // Counts from the top digit down: thread t looks at digit 255 - t.
        u32 v = S.hist[255 - t];
        u32 need = S.need;  // read before block_scan: its barriers keep the write below after every read
        u32 incl = block_scan(v, S);
        if (pass == 0 && t == NT - 1) S.total = incl;
        if (incl >= need && incl - v < need) {
            S.prefix = prefix | ((u32)(255 - t) << shift);
            S.mask = mask | (255u << shift);
            S.need = need - (incl - v);
            S.bincount = v;
        }
        __syncthreads();
        if (pass == 0 && S.total <= k) {  // every valid element is taken
            if (t == 0) { S.all = 1; S.prefix = 0; S.mask = 0; }
            __syncthreads();
            return;
        }
        if (S.bincount == S.need) return;  // the whole bin is taken: the prefix decides
        __syncthreads();
    }
    // More elements share the k-th key than are needed: take the lowest ids among them (or,
    // with `ties`, all of them).
    if (ties) return;
    if (t == 0) { S.tie = 1; S.idprefix = 0; S.idmask = 0; S.idneed = S.need; }
    __syncthreads();
    const u32 kth = S.prefix;
    for (int pass = 0; pass < 8; pass++) {
        const int shift = 56 - 8 * pass;
        S.hist[t] = 0;
        __syncthreads();
        const u64 ip = S.idprefix, im = S.idmask;
        for (u32 i = t; i < m; i += NT) {
            if (a.key(i) == kth) {
                u64 id = a.id(i);
                if ((id & im) == ip) atomicAdd(&S.hist[(u32)(id >> shift) & 255u], 1u);
            }
        }
        __syncthreads();
        u32 v = S.hist[t];  // ascending digits: smallest ids first
        u32 need = S.idneed;
        u32 incl = block_scan(v, S);
        if (incl >= need && incl - v < need) {
            S.idprefix = ip | ((u64)t << shift);
            S.idmask = im | (255ull << shift);
            S.idneed = need - (incl - v);
        }
        __syncthreads();
    }
    // ids are unique: idprefix is now the largest id to take.
}

template <class A>
__device__ __forceinline__ bool take(const A& a, u32 i, u32 kk, const SelShared& S) {
    if (kk == 0u) return false;
    if (S.all) return true;
    u32 km = kk & S.mask;
    if (km > S.prefix) return true;
    if (km < S.prefix) return false;
    if (!S.tie) return true;
    return a.id(i) <= S.idprefix;
}

// Selects the top k of a[0..m) and writes (key,row) pairs to okey/orow; returns the count
// (valid in every thread), at most k written. With `ties`, every element tied with the k-th key is taken too, at
// most `lim` (>= k) written; S.cnt then holds how many were taken (> lim: the output is
// incomplete and the caller reports an overflow).
template <class A>
__device__ u32 select_to(const A& a, u32 m, u32 k, SelShared& S, u32* okey, u32* orow, bool ties = false,
                         u32 lim = 0xFFFFFFFFu) {
    if (!ties) lim = min(lim, k);  // without ties exactly k are taken (ids are unique); enforced
    select_rule(a, m, k, S, ties);
    if (threadIdx.x == 0) S.cnt = 0;
    __syncthreads();
    for (u32 i = threadIdx.x; i < m; i += NT) {
        u32 kk = a.key(i);
        if (take(a, i, kk, S)) {
            u32 p = atomicAdd(&S.cnt, 1u);
            if (p < lim) {
                okey[p] = kk;
                orow[p] = a.row(i);
            }
        }
    }
    __syncthreads();
    return min(S.cnt, lim);
}

// Top k of a[0..m) into okey/orow, exactly k (ties cut by id), or with `ties` every row tied with
// the k-th key, at most `lim`; on more, sets bit 2 of *overflow. Returns the count written.
template <class A>
__device__ __forceinline__ u32 select_cut(const A& a, u32 m, u32 k, bool ties, u32 lim, u32* overflow, SelShared& S,
                                          u32* okey, u32* orow) {
    if (!ties) return select_to(a, m, k, S, okey, orow);
    const u32 c = select_to(a, m, k, S, okey, orow, true, lim);
    if (threadIdx.x == 0 && S.cnt > lim) atomicOr(overflow, 2u);
    __syncthreads();  // S.cnt is read above before the next selection resets it
    return c;
}

// Accessor over candidates compacted into shared memory.
struct SmemAcc {
    const u32* keys;
    const u32* rows;
    const u64* ids;
    __device__ __forceinline__ u32 key(u32 i) const { return keys[i]; }
    __device__ __forceinline__ u32 row(u32 i) const { return rows[i]; }
    __device__ __forceinline__ u64 id(u32 i) const { return ids[rows[i]]; }
};

// The score reported for a ranking key (l2: the distance, not its negation).
__device__ __forceinline__ float key_score(u32 kk) {
    float s = key2f(kk);
#if METRIC == 2
    s = -s;
#endif
    return s;
}

// Hit r of c into a recall response body at dst, the wire format the client parses (count u32,
// ids u64[c], scores f32[c]: ids are only 4-byte aligned, so each goes as two u32 stores); the
// caller's thread 0 writes the count. dst is the client's slot: host memory mapped into the
// device, published by the __threadfence_system before the sequence word.
__device__ __forceinline__ void body_hit(u32* dst, u32 c, u32 r, u64 id, float score) {
    dst[1 + 2 * r] = (u32)id;
    dst[2 + 2 * r] = (u32)(id >> 32);
    ((float*)dst)[1 + 2 * c + r] = score;
}

// Sorts c <= KMAX (key, id, row) entries in shared memory best first (key desc, id asc) and
// writes ids and scores (and, when dst is not null, the response body there).
__device__ void sort_and_write(u32* skey, u32* srow, u64* sid, u32 c, const u64* ids, u64* out_ids,
                               float* out_scores, u32* out_count, u32* dst) {
    const int t = threadIdx.x;
    u32 p2 = 1;
    while (p2 < c) p2 <<= 1;
    for (u32 i = t; i < p2; i += NT) {
        if (i < c) sid[i] = ids[srow[i]];
        else { skey[i] = 0u; sid[i] = ~0ull; }
    }
    __syncthreads();
    for (u32 size = 2; size <= p2; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 i = t; i < p2; i += NT) {
                u32 j = i ^ stride;
                if (j > i) {
                    bool up = (i & size) == 0;  // this run sorts best first
                    u32 ki = skey[i], kj = skey[j];
                    u64 ii = sid[i], ij = sid[j];
                    bool jbetter = kj > ki || (kj == ki && ij < ii);
                    if (jbetter == up) {
                        skey[i] = kj; skey[j] = ki;
                        sid[i] = ij; sid[j] = ii;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (u32 i = t; i < c; i += NT) {
        out_ids[i] = sid[i];
        out_scores[i] = key_score(skey[i]);
        if (dst) body_hit(dst, c, i, sid[i], key_score(skey[i]));
    }
    if (t == 0) {
        *out_count = c;
        if (dst) dst[0] = c;
    }
}

// Raises the bound *bnd to the smallest of the c keys just selected (skey, shared) when c >= k:
// with k rows at or above it, it bounds the final k-th key from below. Returns the bound after
// the update (max of the old one and this block's), in every thread; must be reached by every
// thread of the block.
__device__ __forceinline__ u32 raise_bound(const u32* skey, u32 c, u32 k, u32* bnd, SelShared& S, bool wait = true) {
    const u32 t = threadIdx.x;
    if (t == 0) S.last = 0xFFFFFFFFu;
    __syncthreads();
    u32 mn = 0xFFFFFFFFu;
    for (u32 i = t; i < c; i += NT) mn = min(mn, skey[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    if ((t & 31) == 0) atomicMin(&S.last, mn);
    __syncthreads();
    if (t == 0) {
        const u32 mine = (c >= k && c > 0) ? S.last : 0u;  // more than k: rows tied at the cut
        if (wait) S.last = max(atomicMax(bnd, mine), mine);
        else {  // result unused: a reduction the block does not wait for; returns its own key
            atomicMax(bnd, mine);
            S.last = mine;
        }
    }
    __syncthreads();
    const u32 b = S.last;
    __syncthreads();
    return b;
}

// Rank selection of c <= NT candidates (mkey/mrow, shared memory): thread i counts the
// candidates better than its own (key desc, id asc; ids are unique, so ranks are distinct) and
// writes it at that rank when it is among the first k (and into the response body at dst when
// not null). Sorted output in one pass, no radix.
__device__ void rank_write(const u32* mkey, const u32* mrow, u32 c, u32 k, const u64* ids, u64* sid, u64* out_ids,
                           float* out_scores, u32* out_count, u32* dst) {
    const u32 t = threadIdx.x;
    u32 kk = 0u;
    u64 id = 0ull;
    if (t < c) {
        kk = mkey[t];
        id = ids[mrow[t]];
        sid[t] = id;
    }
    __syncthreads();
    if (t < c) {
        u32 r = 0;
        for (u32 j = 0; j < c; j++) {
            const u32 kj = mkey[j];
            const u64 ij = sid[j];
            r += (kj > kk || (kj == kk && ij < id)) ? 1u : 0u;
        }
        if (r < k) {
            out_ids[r] = id;
            out_scores[r] = key_score(kk);
            if (dst) body_hit(dst, min(c, k), r, id, key_score(kk));
        }
    }
    if (t == 0) {
        *out_count = min(c, k);
        if (dst) dst[0] = min(c, k);
    }
}

// A lower bound of the k-th largest (k <= BOUND_K) of the values the block holds, one `tmax` per
// thread (that thread's largest; 0 for none): the k-th largest of the maxima of the 32 groups of 8
// threads. k disjoint groups each hold a value at or above it, so the k-th value cannot be below
// it; it is 0 when fewer than k groups hold a value. Must be reached by every thread; uses
// S.hist as scratch; returns the bound in every thread.
#define BOUND_K 32
__device__ __forceinline__ u32 group_max_bound(u32 tmax, u32 k, SelShared& S) {
    const u32 t = threadIdx.x;
    u32 g = tmax;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) g = max(g, __shfl_xor_sync(0xffffffffu, g, o));
    if ((t & 7) == 0) S.hist[t >> 3] = g;
    __syncthreads();
    if (t < NT / 8) {  // rank of each group maximum (ties by group index: ranks are distinct)
        const u32 v = S.hist[t];
        u32 r = 0;
#pragma unroll 8
        for (u32 j = 0; j < NT / 8; j++) {
            const u32 w = S.hist[j];
            r += (w > v || (w == v && j < t)) ? 1u : 0u;
        }
        if (r == k - 1) S.hist[NT / 8] = v;
    }
    __syncthreads();
    const u32 b = S.hist[NT / 8];
    __syncthreads();
    return b;
}

// Rank selection of c <= NT entries (keys ckey, shared memory; rows crow, or row0 + i when crow
// is null) into okey/orow: thread i counts the entries better than its own (key desc, then lower
// id: ids are read only where keys tie) and writes it at that rank when it is among the first k.
// Ranks are distinct, so the output is sorted and dense. Key 0 (a row the request may not see) is
// skipped. The work is c * c compares: fine for a few dozen entries, or for blocks of at most
// SMALL_ROWS rows (with 253 rows it took 7.4 us against 5.0 for the radix select on the H200).
// Returns the count, in every thread; must be reached by every thread.
#define SMALL_ROWS 64
__device__ __forceinline__ u32 rank_select(const u32* ckey, const u32* crow, u32 row0, u32 c, u32 k, const u64* ids,
                                           u32* okey, u32* orow) {
    const u32 t = threadIdx.x;
    const u32 kk = t < c ? ckey[t] : 0u;
    if (kk != 0u) {
        const u32 row = crow ? crow[t] : row0 + t;
        u32 r = 0, eq = 0;
        for (u32 j = 0; j < c; j++) {
            const u32 kj = ckey[j];
            r += kj > kk ? 1u : 0u;
            eq += (kj == kk && j != t) ? 1u : 0u;
        }
        if (eq && r < k) {  // tied keys: the lower id ranks first
            const u64 id = ids[row];
            for (u32 j = 0; j < c; j++)
                if (j != t && ckey[j] == kk && ids[crow ? crow[j] : row0 + j] < id) r++;
        }
        if (r < k) {
            okey[r] = kk;
            orow[r] = row;
        }
    }
    return min((u32)__syncthreads_count(kk != 0u), k);
}

// Top k (k <= BOUND_K) of m chunk keys (keys[0..m), rows row0 + i, shared memory): every key below
// group_max_bound is dropped, the few left (usually about k) are compacted into ckey/crow and
// ranked directly, instead of the radix passes. Returns the count (sorted, dense, in okey/orow),
// or NONE_U32 when more than NT keys reach the bound (heavy ties): the caller then selects by
// radix. Must be reached by every thread.
__device__ __noinline__ u32 select_bound(const u32* keys, u32 m, u32 row0, u32 k, const u64* ids, u32* ckey, u32* crow,
                                         u32* okey, u32* orow, SelShared& S) {
    const u32 t = threadIdx.x;
    // Group g of 8 threads takes the g-th 32nd of the keys, so that all 32 groups hold keys even
    // in a block of a few dozen rows.
    const u32 g = t >> 3;
    u32 tmax = 0u;
    for (u32 i = g * m / (NT / 8) + (t & 7), e = (g + 1) * m / (NT / 8); i < e; i += 8) tmax = max(tmax, keys[i]);
    if (t == 0) S.cnt = 0;
    const u32 lo = max(group_max_bound(tmax, k, S), 1u);  // key 0: a row the request may not see
    for (u32 i = t; i < m; i += NT) {
        const u32 kk = keys[i];
        if (kk >= lo) {
            const u32 p = atomicAdd(&S.cnt, 1u);
            if (p < NT) {
                ckey[p] = kk;
                crow[p] = row0 + i;
            }
        }
    }
    __syncthreads();
    const u32 c = S.cnt;
    if (c > NT) return NONE_U32;
    return rank_select(ckey, crow, 0u, c, k, ids, okey, orow);
}

// Final merge of the single-query path (the last block): the blocks appended `total` candidates,
// each at or above the bound at the time; every entry below the final bound `lo` cannot be in the
// top k. The survivors are compacted into shared memory with independent loads (one memory round
// trip for MCAP entries); a few (<= NT, the usual case) are ranked directly, more go through the
// radix select and a sort. Writes the results to out (and the response body to dst, the client's
// slot, when not null).
__device__ __noinline__ void merge_flat(const u32* ckey, const u32* crow, u32 total, u32 lo, u32 k, const u64* ids, u32* dst,
                                        unsigned char* smem, SelShared& S, unsigned char* out) {
    const u32 t = threadIdx.x;
    u64* out_ids = (u64*)(out + 8);
    float* out_scores = (float*)(out + 8 + 8 * (size_t)k);
    u32* mkey = (u32*)smem;
    u32* mrow = mkey + MCAP;
    u32* skey = (u32*)(smem + MCAP * 8);
    u32* srow = skey + KMAX;
    u64* sid = (u64*)(srow + KMAX);
    if (total > MCAP) {  // many candidates (large k, ties): select straight from global memory
        if (PROF && t == 0) stamp(out, 5);
        FlatAcc a{ckey, crow, lo, ids};
        const u32 c = select_to(a, total, k, S, skey, srow);
        sort_and_write(skey, srow, sid, c, ids, out_ids, out_scores, (u32*)out, dst);
        return;
    }
    if (t == 0) S.cnt = 0;
    // All entries (total <= MCAP = NT*16) in one memory round trip of 16-byte loads: load u of
    // thread t is vector u*NT + t, so the entries spread over every group of threads (the bound
    // below needs k groups holding entries). Entries past `total` are left from earlier requests:
    // masked by index (a load never passes the allocation: it holds a multiple of 4 entries >=
    // total).
    u32 kk[16], rr[16];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const u32 v = u * NT + t;
        const bool in = 4 * v < total;
        const uint4 kv = in ? __ldcg((const uint4*)ckey + v) : make_uint4(0u, 0u, 0u, 0u);
        const uint4 rv = in ? __ldcg((const uint4*)crow + v) : make_uint4(0u, 0u, 0u, 0u);
        kk[4 * u] = kv.x; kk[4 * u + 1] = kv.y; kk[4 * u + 2] = kv.z; kk[4 * u + 3] = kv.w;
        rr[4 * u] = rv.x; rr[4 * u + 1] = rv.y; rr[4 * u + 2] = rv.z; rr[4 * u + 3] = rv.w;
    }
    u32 lo2 = max(lo, 1u), tmax = 0u;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        if (4 * ((j / 4) * NT + t) + (j % 4) >= total || kk[j] < lo2) kk[j] = 0u;
        tmax = max(tmax, kk[j]);
    }
    // The blocks' bound is weak when blocks are small (each block's k-th key of ~100-250 rows):
    // about 90 % of the entries pass it. The k-th of the group maxima cuts them to about k.
    if (k <= BOUND_K) lo2 = max(lo2, group_max_bound(tmax, k, S));
    else __syncthreads();
#pragma unroll
    for (int j = 0; j < 16; j++) {
        if (kk[j] != 0u && kk[j] >= lo2) {
            const u32 p = atomicAdd(&S.cnt, 1u);
            mkey[p] = kk[j];
            mrow[p] = rr[j];
        }
    }
    __syncthreads();
    const u32 c = S.cnt;
    if (PROF && t == 0) {
        stamp(out, 5);
        ((volatile u64*)(out + PROF_OFF))[8] = ((u64)total << 32) | c;  // candidates, survivors
    }
    __syncthreads();
    if (c <= NT) {
        rank_write(mkey, mrow, c, k, ids, sid, out_ids, out_scores, (u32*)out, dst);
        return;
    }
    SmemAcc a{mkey, mrow, ids};
    const u32 got = select_to(a, c, k, S, skey, srow);
    sort_and_write(skey, srow, sid, got, ids, out_ids, out_scores, (u32*)out, dst);
}

#define FULLMASK 0xffffffffu

// ---------------------------------------------------------------------------------------------
// Single query: fused scan + top-k, one launch.
// Dynamic shared memory: SMEM_MAIN + DP*4 bytes (the query copy).
// ---------------------------------------------------------------------------------------------

struct Out {
    u32 count;
    u32 _pad;
    // followed by u64 ids[k], float scores[k] (k = the request's k; see out_* below)
};

// Params and query passed to the kernel by value when they fit the 4 KiB of classic kernel
// parameter space (no copy node in the graph); larger dims use the H2D-copied buffer.
#define ARG_BYTES (PARAMS_BYTES + DP * 4)
#if ARG_BYTES <= 4096
#define BYVAL 1
struct Arg {
    Params p;
    unsigned char _pad[PARAMS_BYTES - sizeof(Params)];
    float q[DP];
};
#else
#define BYVAL 0
#endif

// The whole single-query path after P (shared) and the query (qg: DP floats, shared or global)
// are in place.
__device__ __forceinline__ void scan_topk_body(const Params& P, const float* qg, const Table& T, u32* cand_key,
                                               u32* cand_row, u32* ctl, unsigned char* out,
                                               unsigned char* smem, SelShared& S, const u64* sns) {
    const int t = threadIdx.x;
    if (PROF && blockIdx.x == 0 && t == 0) stamp(out, 0);
    u32* keys = (u32*)smem;
#if !QREG
    float* qs = (float*)(smem + SMEM_MAIN);
    if (qs != qg)
        for (int i = t; i < DP; i += NT) qs[i] = qg[i];
    __syncthreads();
#endif

    const u32 n = P.n, b = blockIdx.x;
    const u32 r0 = min(n, b * P.chunk), r1 = min(n, r0 + P.chunk);
    const int lane = t & (GS - 1);
#if HALF2_DOT
    const float qinv = 1.0f / P.qscale;
    u32 qh[NCH][4];
#pragma unroll
    for (int c = 0; c < NCH; c++) {
        int vi = c * GS + lane;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float lo = (vi < NV) ? qg[vi * VEC + 2 * e] * qinv : 0.0f;
            float hi = (vi < NV) ? qg[vi * VEC + 2 * e + 1] * qinv : 0.0f;
            qh[c][e] = (u32)f2h(lo) | ((u32)f2h(hi) << 16);
        }
    }
#elif QREG
    float qr[NCH][VEC];
#pragma unroll
    for (int c = 0; c < NCH; c++) {
        int vi = c * GS + lane;
#pragma unroll
        for (int e = 0; e < VEC; e++) qr[c][e] = (vi < NV) ? qg[vi * VEC + e] : 0.0f;
    }
#endif
    const uint4* V = (const uint4*)T.vecs;
    // Each lane group takes RU rows at a time. The loop bound is uniform across a warp (all
    // groups of a warp step together) so the shuffles below always have every lane present.
    const u32 wbase0 = r0 + (u32)(t / 32) * (32 / GS) * RU;
    const u32 wstep = (u32)(NT / 32) * (32 / GS) * RU;
    const u32 sub = (u32)((t & 31) / GS);
    auto load_rows = [&](uint4(&v)[RU][NCH], u32 wb) {
#pragma unroll
        for (int u = 0; u < RU; u++) {
            u32 row = wb + sub * RU + u;
#pragma unroll
            for (int c = 0; c < NCH; c++) {
                int vi = c * GS + lane;
                if (row < r1 && vi < NV) v[u][c] = ld_stream(V + (size_t)row * NV + vi);
                else v[u][c] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    };
#if PIPE
    uint4 nxt[RU][NCH];
    load_rows(nxt, wbase0);
#endif
    for (u32 wb = wbase0; wb < r1; wb += wstep) {
        uint4 v[RU][NCH];
#if PIPE
#pragma unroll
        for (int u = 0; u < RU; u++)
#pragma unroll
            for (int c = 0; c < NCH; c++) v[u][c] = nxt[u][c];
        load_rows(nxt, wb + wstep);
#else
        load_rows(v, wb);
#endif
        float acc[RU];
#pragma unroll
        for (int u = 0; u < RU; u++) {
            float a = 0.0f;
#pragma unroll
            for (int c = 0; c < NCH; c++) {
#if HALF2_DOT
                a = dot16h(v[u][c], qh[c], a);
#elif QREG
                a = dot16(v[u][c], qr[c], a);
#else
                int vi = c * GS + lane;
                a = dot16(v[u][c], qs + (vi < NV ? vi : 0) * VEC, a);
#endif
            }
#if HALF2_DOT
            acc[u] = a * P.qscale;
#else
            acc[u] = a;
#endif
        }
#pragma unroll
        for (int u = 0; u < RU; u++) {
#pragma unroll
            for (int o = GS / 2; o > 0; o >>= 1) acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], o, GS);
        }
        if (lane == 0) {
#pragma unroll
            for (int u = 0; u < RU; u++) {
                u32 row = wb + sub * RU + u;
                if (row < r1) keys[row - r0] = make_key(acc[u], P.qnorm, row, P, T, sns);
            }
        }
    }
    __syncthreads();
    if (PROF && b == 0 && t == 0) stamp(out, 1);

    const u32 k = P.k;
    // The block's own top k: for k <= BOUND_K the keys below the group-max bound are dropped and
    // the rest ranked; else (or with heavy ties) by radix select, or by rank for a block of at
    // most SMALL_ROWS rows (into shared memory past the keys). Then the
    // candidates at or above the bound (the best k-th key any block has found so far; ctl[1]) are
    // appended to the flat candidate array (ctl[2] counts them).
    u32* skey = (u32*)(smem + MCAP * 8);
    u32* srow = skey + KMAX;
    u32 got = NONE_U32;
    if (SMALL_FIRST && r1 - r0 <= SMALL_ROWS) {  // a few dozen keys: rank them all at once
        got = rank_select(keys, nullptr, r0, r1 - r0, k, T.ids, skey, srow);
    } else if (k <= BOUND_K) {  // scratch: the 16 KB past the chunk keys, unused until the merge
        u32* ck = (u32*)(smem + CHUNK * 4);
        got = select_bound(keys, r1 - r0, r0, k, T.ids, ck, ck + NT, skey, srow, S);
    }
    if (got == NONE_U32) {  // k > BOUND_K, or more than NT keys tie at the bound
        if (r1 - r0 <= SMALL_ROWS) {
            got = rank_select(keys, nullptr, r0, r1 - r0, k, T.ids, skey, srow);
        } else {
            ChunkAcc ca{keys, r0, T.ids};
            got = select_to(ca, r1 - r0, k, S, skey, srow);
        }
    }
    // SLOTS=1 (default since 2026-12-01; on the H200 the GPU round trip went 17.3 -> 16.0 us at
    // 10k x 128 f32 and 51.4 -> 49.4 us at 100k x 768 f16; SLOTS=0 is the older path): when
    // every block's k fit the merge's shared memory, block b writes its k entries at b*k (key 0 pads a short list) and
    // raises the bound without waiting for the old value: two dependent L2 round trips (the
    // bound's return, the append position) fewer per block. Otherwise blocks append only the
    // entries at or above the bound, at a position from ctl[2].
    const bool fixed = SLOTS && P.grid * k <= MCAP;
    if (fixed) {
        raise_bound(skey, got, k, ctl + 1, S, false);
        for (u32 i = t; i < k; i += NT) {
            cand_key[b * k + i] = i < got ? skey[i] : 0u;
            cand_row[b * k + i] = i < got ? srow[i] : 0u;
        }
    } else {
        const u32 lo = raise_bound(skey, got, k, ctl + 1, S);
        u32* tkey = (u32*)smem;  // the chunk keys are no longer needed
        u32* trow = tkey + MCAP;
        if (t == 0) S.cnt = 0;
        __syncthreads();
        for (u32 i = t; i < got; i += NT) {
            if (skey[i] >= lo) {
                const u32 p = atomicAdd(&S.cnt, 1u);
                tkey[p] = skey[i];
                trow[p] = srow[i];
            }
        }
        __syncthreads();
        if (t == 0) S.prefix = atomicAdd(ctl + 2, S.cnt);
        __syncthreads();
        const u32 base = S.prefix, nc = S.cnt;
        for (u32 i = t; i < nc; i += NT) {
            cand_key[base + i] = tkey[i];
            cand_row[base + i] = trow[i];
        }
    }

    // The last block to finish (ticket ctl[0]) merges everything.
    __threadfence();
    __syncthreads();
    if (PROF && b == 0 && t == 0) stamp(out, 2);
    if (t == 0) S.last = (atomicAdd(ctl, 1u) == P.grid - 1) ? 1u : 0u;
    __syncthreads();
    if (!S.last) return;
    if (PROF && t == 0) stamp(out, 3);
    __threadfence();
    // One thread reads the bound and the count for the block (every barrier decision below then
    // rests on shared memory, not on per-thread reads of global memory) and resets ctl, ready
    // for the next replay (every other block is done with it).
    if (t == 0) {
        S.mbound = __ldcg(ctl + 1);
        S.mtotal = fixed ? P.grid * k : __ldcg(ctl + 2);
        ctl[0] = 0u;
        ctl[1] = 0u;
        ctl[2] = 0u;
    }
    __syncthreads();
    const u32 bound = S.mbound, total = S.mtotal;
    if (PROF && t == 0) stamp(out, 4);
    merge_flat(cand_key, cand_row, total, bound, k, T.ids, (u32*)P.dst, smem, S, out);
    // `out` is pinned host memory mapped into the device: the server thread spins on the
    // sequence word, so publish it only after every result is visible to the host.
    __syncthreads();
    if (PROF && t == 0) stamp(out, 6);
    __threadfence_system();
    __syncthreads();
    if (PROF && t == 0) stamp(out, 7);
    if (t == 0) *(volatile u32*)(out + 4) = P.seq;
}

// Request parameters from device memory into shared memory (P, and the namespace filter in sns).
__device__ __forceinline__ void load_params(const unsigned char* in, Params& P, u64* sns) {
    const int t = threadIdx.x;
    const u32* src = (const u32*)in;
    u32* dst = (u32*)&P;
    for (int i = t; i < (int)(sizeof(Params) / 4); i += NT) dst[i] = src[i];
    __syncthreads();
    if (P.nns != NONE_U32)
        for (u32 i = t; i < P.nns && i < MAXNS; i += NT) sns[i] = P.ns[i];
    __syncthreads();
}

// Params + query copied to device memory (`in`) by a copy node before the kernel.
extern "C" __global__ void __launch_bounds__(NT) scan_topk(const unsigned char* __restrict__ in, Table T,
                                                           u32* cand_key, u32* cand_row, u32* ctl,
                                                           unsigned char* out) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ SelShared S;
    __shared__ u64 sns[MAXNS];
    __shared__ Params P;
    load_params(in, P, sns);
    scan_topk_body(P, (const float*)(in + PARAMS_BYTES), T, cand_key, cand_row, ctl, out, smem, S, sns);
}

#if BYVAL
// Params' fields before the namespace list (n .. qscale), which both by-value arguments start with.
#define PARAMS_HEAD 64
static_assert(__builtin_offsetof(Params, ns) == PARAMS_HEAD, "Params head");

// The compact by-value argument: Params' head, the response address and up to NS_INLINE
// namespaces, 104 bytes in place of Params' 640 (a filter of more namespaces takes
// scan_topk_v). Each request's graph update copies the whole argument: on the H200 a kernel
// node with a 4-byte argument answers in 6.4-6.6 us, with 1152 bytes in 9.4-9.6 us
// (tests/gpu/probe_resident.cu). Layout mirrored in cuda.rs (ParamsC).
#define NS_INLINE 4
struct ParamsC {
    u32 head[PARAMS_HEAD / 4];
    u64 dst;
    u64 ns[NS_INLINE];
};
struct ArgC {
    ParamsC p;
    float q[DP];
};

// Params + query as the kernel's by-value argument: no copy node, no dependent global load.
// (scan_topk_c repeats this preamble for the compact argument; this one stays as it was checked
// on the H200 until the compact path has run on a GPU, then the two can share it.)
extern "C" __global__ void __launch_bounds__(NT) scan_topk_v(const Arg a, Table T, u32* cand_key, u32* cand_row,
                                                             u32* ctl, unsigned char* out) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ SelShared S;
    __shared__ u64 sns[MAXNS];
    __shared__ Params P;
    const int t = threadIdx.x;
    float* qs = (float*)(smem + SMEM_MAIN);
    for (int i = t; i < DP; i += NT) qs[i] = a.q[i];
    for (int i = t; i < (int)(sizeof(Params) / 4); i += NT) ((u32*)&P)[i] = ((const u32*)&a.p)[i];
    if (a.p.nns != NONE_U32)
        for (u32 i = t; i < a.p.nns && i < MAXNS; i += NT) sns[i] = a.p.ns[i];
    __syncthreads();
    scan_topk_body(P, qs, T, cand_key, cand_row, ctl, out, smem, S, sns);
}

// The compact argument (requests filtered by at most NS_INLINE namespaces): Params' head and
// the response address into shared memory, the namespaces into sns, then the single-query path.
extern "C" __global__ void __launch_bounds__(NT) scan_topk_c(const ArgC a, Table T, u32* cand_key, u32* cand_row,
                                                             u32* ctl, unsigned char* out) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ SelShared S;
    __shared__ u64 sns[MAXNS];
    __shared__ Params P;
    const int t = threadIdx.x;
    float* qs = (float*)(smem + SMEM_MAIN);
    for (int i = t; i < DP; i += NT) qs[i] = a.q[i];
    for (int i = t; i < PARAMS_HEAD / 4; i += NT) ((u32*)&P)[i] = a.p.head[i];
    if (t == 0) P.dst = a.p.dst;
    const u32 nns = a.p.head[2];  // Params::nns
    if (nns != NONE_U32)
        for (u32 i = t; i < nns && i < NS_INLINE; i += NT) sns[i] = a.p.ns[i];
    __syncthreads();
    scan_topk_body(P, qs, T, cand_key, cand_row, ctl, out, smem, S, sns);
}
#endif

// ---------------------------------------------------------------------------------------------
// Batches. The GEMM writes a tile of scores, column-major [rows x nq] (ld >= rows, a multiple of
// 4). Every query owns a candidate buffer (key, row) of `cap` entries with a count, and a
// threshold thr[q]: a lower bound of its final k-th key (0 at first). Block (x, q) of
// batch_filter streams `span` rows of query q's column with 16-byte loads and keeps the rows
// whose key reaches its bound in a shared-memory buffer; when the buffer could overflow, and at
// the end, it cuts the buffer to its top k by radix select and raises its bound (and thr[q]) to
// the k-th key. So after the first tile nearly every row is rejected by one float compare. It
// appends at most k rows per tile to q's buffer; with one block
// per query (gridDim.x == 1) it also cuts that buffer to its top k when it passes `high`, else
// batch_tighten does that after the tile. The host sizes `cap` as high + (blocks per query) * k,
// so a buffer can never overflow (an overflow would be reported as a count of 0xFFFFFFFF, never
// as wrong results). batch_final selects and sorts each query's top k.
// ---------------------------------------------------------------------------------------------

#ifndef FU
#define FU 2                  // 16-byte score loads per thread per step (the host passes -DFU)
#endif
#define FSTEP (NT * FU * 4)   // rows per step of a filter block
#ifndef FPD
#define FPD 2                 // steps loaded ahead
#endif
#ifndef FMINB
#define FMINB 5               // resident filter blocks per SM the registers are budgeted for
#endif

// Writes the rows [0, c) of (skey, srow) at the end of query q's buffer; returns the new count.
__device__ __forceinline__ u32 append(const u32* skey, const u32* srow, u32 c, u32* bkey, u32* brow, u32* bcnt,
                                      u32 cap, SelShared& S) {
    if (threadIdx.x == 0) S.cnt = c ? atomicAdd(bcnt, c) : __ldcg(bcnt);
    __syncthreads();
    const u32 base = S.cnt;
    for (u32 i = threadIdx.x; i < c; i += NT) {
        if (base + i < cap) {
            bkey[base + i] = skey[i];
            brow[base + i] = srow[i];
        }
    }
    __syncthreads();
    return base + c;
}

// Cuts query q's buffer (cnt entries, global memory) to its top k (with `ties`, also every row
// tied with the k-th key, at most `lim`) and raises thr[q]; the caller owns the buffer (no other
// block touches it during the call). skey/srow: `lim` (>= k) entries of shared memory.
__device__ void cut_buffer(u32* okey, u32* orow, u32 cnt, u32 k, const u64* ids, u32* thr_q, u32* bcnt_q,
                           u32* skey, u32* srow, SelShared& S, bool ties, u32 lim, u32* overflow) {
    SmemAcc a{okey, orow, ids};
    const u32 c = select_cut(a, cnt, k, ties, lim, overflow, S, skey, srow);
    for (u32 i = threadIdx.x; i < c; i += NT) {
        okey[i] = skey[i];
        orow[i] = srow[i];
    }
    raise_bound(skey, c, k, thr_q, S);
    if (threadIdx.x == 0) *bcnt_q = c;
    __syncthreads();
}

// Score tiles hold f32 (SV = 4 scores per 16-byte load) or f16 (SV = 8, f16 storage with ip or
// cosine and no recency: half the bytes written by the GEMM and read here). The GEMM accumulates
// in f32 either way; an f16 tile rounds each accumulated score to nearest, a monotone map: a row
// whose accumulated score is higher never gets a lower f16 key. So a cut that keeps every row
// tied with its k-th key keeps a superset of the rows an f32 tile's cut would keep (if row r is
// dropped, k kept rows have higher f16 keys, hence higher f32 scores, than r), and batch_final
// rescores the survivors in f32 before the exact selection: the answers are those of f32 tiles
// (up to f32 rounding of near-ties, as between any two summation orders). Every cut of an f16
// batch keeps ties (`ties`, at most kx = 2k per filter block and `high` per buffer); a tie group
// beyond that, or a score beyond the f16 range, sets *overflow (bit 2 / bit 1) and the host
// answers the batch again from f32 tiles. The f16 variant loads FU / 2 vectors per thread per
// step, so a step is FSTEP rows in both and the host's tiling is the same.
template <int SV>
__device__ __forceinline__ void unpack(const uint4& v, float (&e)[SV]);
template <>
__device__ __forceinline__ void unpack<4>(const uint4& v, float (&e)[4]) {
    e[0] = __uint_as_float(v.x); e[1] = __uint_as_float(v.y); e[2] = __uint_as_float(v.z); e[3] = __uint_as_float(v.w);
}
template <>
__device__ __forceinline__ void unpack<8>(const uint4& v, float (&e)[8]) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        e[2 * i] = h2f(w[i] & 0xFFFFu);
        e[2 * i + 1] = h2f(w[i] >> 16);
    }
}

// Dynamic shared memory: (sb + kx) * 8 bytes, sb = kx + FSTEP * 3 / 2 survivor slots, kx = k
// (f32 tiles) or 2k (f16 tiles: cuts keep ties). `overflow` (f16 tiles only): bit 1 when a score
// of the tile is not finite (beyond the f16 range), bit 2 when a tie group outgrew its room; the
// host then answers the batch again from f32 tiles.
template <int SV>
__device__ __forceinline__ void batch_filter_body(const unsigned char* __restrict__ in,
                                                  const float* __restrict__ qnorms, const Table& T,
                                                  const void* __restrict__ scores, u32 ld, u32 row0,
                                                  u32 rows, u32 span, u32* bkey, u32* brow, u32* bcnt,
                                                  u32 cap, u32 high, u32* thr, u32* overflow) {
    constexpr int FV = SV == 4 ? FU : (FU / 2 > 0 ? FU / 2 : 1);  // 16-byte loads per thread per step
    static_assert(FV * SV == FU * 4, "a step is FSTEP rows for either score type");
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ SelShared S;
    __shared__ u64 sns[MAXNS];
    __shared__ Params P;
    __shared__ u32 nsurv, lost, lb0;
    const int t = threadIdx.x, lane = t & 31;
    const u32 q = blockIdx.y;
    const u32 l0 = min(rows, blockIdx.x * span), l1 = min(rows, l0 + span);
    const uint4* col = (const uint4*)((const unsigned char*)scores + (size_t)q * ld * (SV == 4 ? 4 : 2));
    // Scores are loaded one step ahead: the loads of step s+1 are in flight while step s is
    // examined (and the first step's while the parameters load).
    uint4 nv[FPD][FV];
    auto load_step = [&](uint4(&d)[FV], u32 base) {
#pragma unroll
        for (int u = 0; u < FV; u++) {
            const u32 i = base + ((u32)u * NT + t) * SV;
            d[u] = i < l1 ? __ldcs(col + i / SV) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
#pragma unroll
    for (int d = 0; d < FPD; d++) load_step(nv[d], l0 + (u32)d * FSTEP);
    // The bound is read once, by one thread, and shared: other blocks of query q raise thr[q]
    // at any time, and warps that read it at different moments could disagree on `lb != 0`,
    // hence on `cruise`, and take different numbers of barriers below (undefined behaviour,
    // seen as an illegal instruction). Every decision that guards a barrier is block-uniform.
    if (t == 0) {
        nsurv = 0;
        lb0 = __ldcg(thr + q);
    }
    load_params(in, P, sns);  // its barrier publishes nsurv and lb0
    // Survivor slots: room for a whole step after the k kept by a cut, plus half a step of slack
    // so that a cut happens only when the buffer really fills (without it, the first tile cut
    // at every step).
    constexpr bool ties = SV == 8;
    const u32 k = P.k, kx = ties ? 2 * k : k, sb = kx + FSTEP + FSTEP / 2;
    const float qn = qnorms[q];
    u32 lb = lb0;
    const bool plain = P.flags == 0u && P.nns == NONE_U32;  // no expiry, recency or namespace filter
    u32* ckey = (u32*)smem;  // survivors
    u32* crow = ckey + sb;
    u32* skey = crow + sb;   // selection output (kx entries)
    u32* srow = skey + kx;
    // One step: FSTEP rows from `base` (uniform across the block). In cruise mode (`cruise`)
    // no barrier is taken: a warp reserves room for its survivors with one shared atomic, and a
    // survivor that does not fit sets `lost` (the caller then redoes the segment step by step).
    auto step = [&](u32 base, bool cruise) {
        uint4 v[FV];
#pragma unroll
        for (int u = 0; u < FV; u++) v[u] = nv[0][u];
#pragma unroll
        for (int d = 0; d + 1 < FPD; d++)
#pragma unroll
            for (int u = 0; u < FV; u++) nv[d][u] = nv[d + 1][u];
        load_step(nv[FPD - 1], base + (u32)FPD * FSTEP);
        // Fast rejection: without filters the key depends on the score (and for l2 the row's
        // norm) only, so one float compare against the bound decides for most rows; a warp
        // takes the exact path below only when one of its rows may pass (`!(x < tf)` also sends
        // NaN there, so both paths agree on every value).
        bool maybe = true;
        if (plain && lb != 0u) {
#if METRIC == 2
            // The exact path computes the same l2_score; a margin of a few ulps keeps the fast
            // rejection conservative even if the compiler contracted the two differently.
            const float tf = key2f(lb) - fabsf(key2f(lb)) * 1e-6f;
#else
            const float tf = key2f(lb);  // the key of x is f2key(x): the same value, no margin
#endif
            maybe = false;
#pragma unroll
            for (int u = 0; u < FV; u++) {
                float e[SV];
                unpack<SV>(v[u], e);
#pragma unroll
                for (int j = 0; j < SV; j++) {
                    float x = e[j];
#if METRIC == 2
                    const u32 i = base + ((u32)u * NT + t) * SV + j;
                    x = l2_score(x, qn, i < l1 ? T.norms[row0 + i] : 0.0f);
#endif
                    maybe |= !(x < tf);
                }
            }
        }
        if (!__any_sync(FULLMASK, maybe)) return;
#pragma unroll
        for (int u = 0; u < FV; u++) {
            float e[SV];
            unpack<SV>(v[u], e);
#pragma unroll
            for (int j = 0; j < SV; j++) {
                const u32 i = base + ((u32)u * NT + t) * SV + j;
                u32 kk = 0u;
                if (i < l1) {
                    // Inf here is an f16 tile's overflow; -Inf scores are caught too, since
                    // the fast rejection sends them here while the bound is 0 or -Inf itself.
                    if (SV == 8 && (__float_as_uint(e[j]) & 0x7f800000u) == 0x7f800000u) atomicOr(overflow, 1u);
                    kk = make_key(e[j], qn, row0 + i, P, T, sns);
                }
                const bool keep = kk != 0u && kk >= lb;
                const u32 m = __ballot_sync(FULLMASK, keep);
                if (m) {
                    u32 pos = 0;
                    if (lane == __ffs(m) - 1) pos = atomicAdd(&nsurv, (u32)__popc(m));
                    pos = __shfl_sync(FULLMASK, pos, __ffs(m) - 1) + __popc(m & ((1u << lane) - 1u));
                    if (keep) {
                        if (!cruise || pos < sb) {
                            ckey[pos] = kk;
                            crow[pos] = row0 + i;
                        } else {
                            lost = 1u;
                        }
                    }
                }
            }
        }
    };
    // Steps are taken one at a time with a barrier each (the block decides whether to cut its
    // survivors first) until the bound is known; then, without filters, in cruise segments of
    // P.fseg steps with no barrier inside: after the first tiles nearly every warp of a step
    // rejects all its rows, and the two barriers a step cost more than the compares. A segment
    // whose survivors outgrow the free slots is discarded (nsurv back to its start) and redone
    // step by step, so no row is lost or counted twice.
    u32 hunt_until = l0;  // no cruise before this row (a segment being redone)
    for (u32 base = l0; base < l1;) {  // uniform across the block
        __syncthreads();  // the last step's appends are done; thread 0 decides for the block
        if (t == 0) lost = 0u;
        if (__syncthreads_or(t == 0 && nsurv + FSTEP > sb)) {  // make room: keep the top k, raise the bound
            SmemAcc a{ckey, crow, T.ids};
            const u32 c = select_cut(a, nsurv, k, ties, kx, overflow, S, skey, srow);
            for (u32 i = t; i < c; i += NT) {
                ckey[i] = skey[i];
                crow[i] = srow[i];
            }
            lb = max(lb, raise_bound(skey, c, k, thr + q, S));
            if (t == 0) nsurv = c;
            __syncthreads();
        }
        const u32 seg = P.fseg;
        const bool cruise = seg > 1u && plain && lb != 0u && base >= hunt_until;
        // nsurv has not changed since the last barrier; every thread reads it before any warp
        // of a cruise segment appends (a warp that read it late would see this segment's rows).
        const u32 s0 = nsurv, end = cruise ? min(l1, base + seg * FSTEP) : base + FSTEP;
        if (cruise) __syncthreads();
        for (u32 b = base; b < end && b < l1; b += FSTEP) step(b, cruise);
        if (!cruise) {
            base = end;
            continue;
        }
        __syncthreads();
        if (lost) {  // redo [base, end) step by step, from a reloaded pipeline
            __syncthreads();  // every thread has read `lost`
            if (t == 0) nsurv = s0;
#pragma unroll
            for (int d = 0; d < FPD; d++) load_step(nv[d], base + (u32)d * FSTEP);
            hunt_until = end;
        } else {
            base = end;
        }
    }
    __syncthreads();
    const u32 c = nsurv;
    u32* okey = bkey + (size_t)q * cap;
    u32* orow = brow + (size_t)q * cap;
    u32 cnt;
    if (c <= k) {
        cnt = append(ckey, crow, c, okey, orow, bcnt + q, cap, S);
    } else {
        SmemAcc a{ckey, crow, T.ids};
        const u32 got = select_cut(a, c, k, ties, kx, overflow, S, skey, srow);
        raise_bound(skey, got, k, thr + q, S);
        cnt = append(skey, srow, got, okey, orow, bcnt + q, cap, S);
    }
    if (gridDim.x == 1 && cnt > high && cnt <= cap)
        cut_buffer(okey, orow, cnt, k, T.ids, thr + q, bcnt + q, skey, srow, S, ties, kx, overflow);
}

extern "C" __global__ void __launch_bounds__(NT, FMINB) batch_filter(const unsigned char* __restrict__ in,
                                                              const float* __restrict__ qnorms, Table T,
                                                              const float* __restrict__ scores, u32 ld, u32 row0,
                                                              u32 rows, u32 span, u32* bkey, u32* brow, u32* bcnt,
                                                              u32 cap, u32 high, u32* thr) {
    batch_filter_body<4>(in, qnorms, T, scores, ld, row0, rows, span, bkey, brow, bcnt, cap, high, thr, nullptr);
}

extern "C" __global__ void __launch_bounds__(NT, FMINB) batch_filter_h(const unsigned char* __restrict__ in,
                                                                const float* __restrict__ qnorms, Table T,
                                                                const u16* __restrict__ scores, u32 ld, u32 row0,
                                                                u32 rows, u32 span, u32* bkey, u32* brow, u32* bcnt,
                                                                u32 cap, u32 high, u32* thr, u32* overflow) {
    batch_filter_body<8>(in, qnorms, T, scores, ld, row0, rows, span, bkey, brow, bcnt, cap, high, thr, overflow);
}

// f16 tiles: the f32 score of table row `row` against query q's f16 row (the GEMM's B operand,
// DP halves), one warp, returned in every lane: batch_final ranks the survivors of f16 cuts by it.
__device__ __forceinline__ float rescore_h(const Table& T, u32 row, const u16* __restrict__ q16) {
    const int lane = threadIdx.x & 31;
    const uint4* x = (const uint4*)((const u16*)T.vecs + (size_t)row * DP);
    const uint4* y = (const uint4*)q16;
    float acc = 0.0f;
    for (int j = lane; j < DP / 8; j += 32) {
        float a[8], b[8];
        unpack<8>(x[j], a);
        unpack<8>(y[j], b);
#pragma unroll
        for (int i = 0; i < 8; i++) acc = fmaf(a[i], b[i], acc);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(FULLMASK, acc, o);
    return acc;
}

// Block q: when q's buffer holds more than `high` entries, keep only its top k (and raise thr).
// With final != 0 (batch_final): always select, then sort and write q's results. With ties (f16
// score tiles): cuts keep every row tied with the k-th key (at most `high`, else bit 2 of
// *overflow), and the final selection first rescores every candidate in f32 (q16: the queries
// in f16, DP each).
__device__ __forceinline__ void tighten_or_final(const unsigned char* in, const Table& T, u32* bkey, u32* brow,
                                                 u32* bcnt, u32 cap, u32 high, u32* thr, bool final, u64* out_ids,
                                                 float* out_scores, u32* out_counts, unsigned char* smem, bool ties,
                                                 const u16* q16, u32* overflow) {
    __shared__ SelShared S;
    const Params* P = (const Params*)in;
    const u32 q = blockIdx.x, k = P->k, t = threadIdx.x;
    // One thread reads the count: the early returns below are then the same for every thread.
    if (t == 0) S.mtotal = __ldcg(bcnt + q);
    __syncthreads();
    const u32 cnt = S.mtotal;
    if (cnt > cap) {  // cannot happen with the host's sizing; never return partial results
        if (final && t == 0) out_counts[q] = 0xFFFFFFFFu;
        return;
    }
    if (!final && cnt <= high) return;
    u32* okey = bkey + (size_t)q * cap;
    u32* orow = brow + (size_t)q * cap;
    u32* mkey = (u32*)smem;
    u32* mrow = mkey + MCAP;
    u32* skey = (u32*)(smem + MCAP * 8);
    u32* srow = skey + KMAX;
    if (!final) {
        cut_buffer(okey, orow, cnt, k, T.ids, thr + q, bcnt + q, skey, srow, S, ties, min(high, (u32)KMAX), overflow);
        return;
    }
    const bool inmem = cnt <= MCAP;  // one parallel pass into shared memory, then select there
    if (inmem) {
        for (u32 i = t; i < cnt; i += NT) { mkey[i] = okey[i]; mrow[i] = orow[i]; }
        __syncthreads();
    }
    u32* ck = inmem ? mkey : okey;
    const u32* cr = inmem ? mrow : orow;
#if DTYPE == 1
    if (ties) {
        for (u32 i = t >> 5; i < cnt; i += NT / 32) {
            const float sc = rescore_h(T, cr[i], q16 + (size_t)q * DP);
            if ((t & 31) == 0) ck[i] = f2key(sc);
        }
        __syncthreads();
    }
#endif
    SmemAcc a{ck, cr, T.ids};
    const u32 c = select_to(a, cnt, k, S, skey, srow);
    u64* sid = (u64*)(srow + KMAX);
    sort_and_write(skey, srow, sid, c, T.ids, out_ids + (size_t)q * k, out_scores + (size_t)q * k, out_counts + q, nullptr);
}

extern "C" __global__ void __launch_bounds__(NT) batch_tighten(const unsigned char* __restrict__ in, Table T, u32* bkey,
                                                               u32* brow, u32* bcnt, u32 cap, u32 high, u32* thr,
                                                               u32 ties, u32* overflow) {
    extern __shared__ __align__(16) unsigned char smem[];
    tighten_or_final(in, T, bkey, brow, bcnt, cap, high, thr, false, nullptr, nullptr, nullptr, smem, ties != 0u, nullptr,
                     overflow);
}

extern "C" __global__ void __launch_bounds__(NT) batch_final(const unsigned char* __restrict__ in, Table T, u32* bkey,
                                                             u32* brow, u32* bcnt, u32 cap, u64* out_ids,
                                                             float* out_scores, u32* out_counts, u32 ties,
                                                             const u16* q16) {
    extern __shared__ __align__(16) unsigned char smem[];
    tighten_or_final(in, T, bkey, brow, bcnt, cap, 0, nullptr, true, out_ids, out_scores, out_counts, smem, ties != 0u,
                     q16, nullptr);
}

// Gated tiles (f16 storage, ip / cosine, no filter, recency or expiry; the host's
// search_batch_tiles). After the first tile has set every query's bound thr[q] (the k-th key of
// its rows, kernels above), each later tile's GEMM (cuBLASLt, epilogue RELU_BIAS, queries as the
// rows of the output) writes max(0, score + bias[q]) in f16, bias[q] = -(thr[q] - margin), so a
// score tile is zero except where a row may still enter q's top k; gate_scan streams the tile and
// appends every nonzero (q, row) to q's candidate buffer, and batch_final rescores all of them in
// f32. No per-query cuts are needed: the buffers only grow by the rows above the bound.
//
// The margin keeps the gate conservative. thr[q] is an f16-rounded GEMM score: the k rows of the
// first tile it came from score at least thr[q] - ulp/2 in f32, so q's final k-th score does too;
// any row above that passes the gate when margin >= ulp/2 plus the f32 rounding difference of two
// summation orders, and its output must not round to an f16 zero. margin = max(|thr|, |top|) /
// 512 + 2^-22 (top: q's best key so far) is at least one f16 ulp of thr, for scores near zero a
// fraction of the scale of q's scores, and at least 4 steps of f16's subnormals (2^-24), so that
// a passing row's output (>= margin - ulp/2) never rounds to zero; the bias is then rounded up to
// f16 (the gate only widens). A query with no bound (thr = 0) gets bias +inf:
// every row passes, the buffer overflows and the host answers the batch again from f32 tiles.
extern "C" __global__ void gate_bias(const u32* __restrict__ thr, const u32* __restrict__ bkey,
                                     const u32* __restrict__ bcnt, u32 cap, u32 m, u16* bias) {
    const u32 q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= m) return;
    const u32 key = thr[q];
    if (key == 0u) {
        bias[q] = 0x7c00u;  // +inf
        return;
    }
    const float t = key2f(key);
    float top = t;
    const u32 c = min(bcnt[q], cap);
    for (u32 i = 0; i < c; i++) top = fmaxf(top, key2f(bkey[(size_t)q * cap + i]));
    const float margin = fmaxf(fabsf(t), fabsf(top)) * (1.0f / 512.0f) + 2.384185791015625e-7f;  // + 2^-22
    const float b = -(t - margin);
    u16 h = f2h(b);  // nearest; step up when below b (the bias may only grow)
    if (!(h2f(h) >= b)) h = (h & 0x8000u) ? (h == 0x8000u ? (u16)1u : (u16)(h - 1u)) : (u16)(h + 1u);
    bias[q] = h;
}

// Appends every nonzero score of a gated tile (f16, ldm x rows, queries contiguous per row; the
// padding queries m..ldm are skipped) to its query's buffer. Candidates past `cap` set bit 2 of
// *overflow (the host answers the batch again from f32 tiles). Keys are placeholders: batch_final
// rescores every candidate of an f16 batch. -0 counts as zero.
__device__ __forceinline__ void gate_emit(const uint4& v, unsigned long long i, u32 ldm, u32 m, u32 row0, u32* bkey,
                                          u32* brow, u32* bcnt, u32 cap, u32* overflow) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
    if (((w[0] | w[1] | w[2] | w[3]) & 0x7fff7fffu) == 0u) return;
    for (int j = 0; j < 8; j++) {
        if (((w[j >> 1] >> ((j & 1) * 16)) & 0x7fffu) == 0u) continue;
        const unsigned long long e = i * 8 + (unsigned long long)j;
        const u32 q = (u32)(e % ldm), r = (u32)(e / ldm);
        if (q >= m) continue;
        const u32 pos = atomicAdd(bcnt + q, 1u);
        if (pos < cap) {
            bkey[(size_t)q * cap + pos] = 1u;
            brow[(size_t)q * cap + pos] = row0 + r;
        } else {
            atomicOr(overflow, 2u);
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT) gate_scan(const uint4* __restrict__ d, unsigned long long n16, u32 ldm,
                                                         u32 m, u32 row0, u32* bkey, u32* brow, u32* bcnt, u32 cap,
                                                         u32* overflow) {
    const unsigned long long stride = (unsigned long long)gridDim.x * NT;
    unsigned long long i = (unsigned long long)blockIdx.x * NT + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = __ldcs(d + i + u * stride);
#pragma unroll
        for (int u = 0; u < 4; u++) gate_emit(v[u], i + u * stride, ldm, m, row0, bkey, brow, bcnt, cap, overflow);
    }
    for (; i < n16; i += stride) gate_emit(__ldcs(d + i), i, ldm, m, row0, bkey, brow, bcnt, cap, overflow);
}

// Stores v at element i of a storage-type array (f32, f16 or bf16 by DTYPE).
__device__ __forceinline__ void store_elem(void* base, size_t i, float v) {
#if DTYPE == 0
    ((float*)base)[i] = v;
#elif DTYPE == 1
    ((u16*)base)[i] = f2h(v);
#else
    ((u16*)base)[i] = f2bf(v);
#endif
}

// ---------------------------------------------------------------------------------------------
// Table updates: m rows staged as f32 (DIM values each) plus their columns, scattered to
// their row numbers and converted to the storage type (rows padded with zeros to DP).
// ---------------------------------------------------------------------------------------------

extern "C" __global__ void scatter_rows(const u32* __restrict__ rows, const float* __restrict__ norms,
                                        const u64* __restrict__ ids, const u64* __restrict__ ns,
                                        const u64* __restrict__ created, const u64* __restrict__ expires,
                                        const float* __restrict__ src, u32 m, void* dvecs, float* dnorms,
                                        u64* dids, u64* dns, u64* dcreated, u64* dexpires) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t nth = (size_t)gridDim.x * blockDim.x;
    for (size_t i = tid; i < m; i += nth) {
        u32 r = rows[i];
        dnorms[r] = norms[i];
        dids[r] = ids[i];
        dns[r] = ns[i];
        dcreated[r] = created[i];
        dexpires[r] = expires[i];
    }
    const size_t total = (size_t)m * DP;
    for (size_t i = tid; i < total; i += nth) {
        size_t j = i / DP, c = i - j * DP;
        float v = c < DIM ? src[j * DIM + c] : 0.0f;
        store_elem(dvecs, (size_t)rows[j] * DP + c, v);
    }
}

// Batches whose queries were copied to the device straight from the client's slot (which the
// client could change during the copy): checks the device copy, the one every later kernel
// reads. One warp per query: bad[0] = the smallest flat index of a non-finite value (left at
// 0xFFFFFFFF when there is none; the host then fails the batch); with norms = 1 each query's
// |q|^2 into qn (l2); with norms = 2 (cosine) each query's 1 / |q| (summed in f64, as the
// server's normalize_queries) into qn for convert_queries, and bad[1] = the first all-zero query.
extern "C" __global__ void check_queries(const float* __restrict__ src, u32 nq, float* qn, u32 norms, u32* bad) {
    const u32 w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (w >= nq) return;
    const float* q = src + (size_t)w * DIM;
    float acc = 0.0f;
    double accd = 0.0;
    u32 first = NONE_U32;
    for (u32 c = lane; c < DIM; c += 32) {
        const float v = q[c];
        if ((__float_as_uint(v) & 0x7f800000u) == 0x7f800000u) first = min(first, w * DIM + c);
        acc = fmaf(v, v, acc);
        if (norms == 2u) accd = fma((double)v, (double)v, accd);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        acc += __shfl_xor_sync(FULLMASK, acc, o);
        accd += __shfl_xor_sync(FULLMASK, accd, o);
        first = min(first, __shfl_xor_sync(FULLMASK, first, o));
    }
    if (lane == 0) {
        if (norms == 1u) qn[w] = acc;
        if (norms == 2u) {
            if (accd == 0.0) atomicMin(bad + 1, w);
            qn[w] = accd > 0.0 ? (float)(1.0 / sqrt(accd)) : 0.0f;
        }
        if (first != NONE_U32) atomicMin(bad, first);
    }
}

// Queries (f32, nq x DIM) to the storage type, padded to DP: the batched GEMM's B operand. With
// `lo` set, the residual instead, v - storage(v) rounded to the storage type: a second GEMM with
// it (beta = 1) brings the bf16 path's query to ~16 significant bits, as the single-query path
// (f32 query) has; with the query in bf16 alone, batch recall@10 fell to 0.988 on the H200.
// With `scale` (cosine queries from a slot: check_queries' 1 / |q|), each query is first scaled.
extern "C" __global__ void convert_queries(const float* __restrict__ src, u32 nq, void* dst, u32 lo,
                                           const float* __restrict__ scale) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t nth = (size_t)gridDim.x * blockDim.x;
    for (size_t i = tid; i < (size_t)nq * DP; i += nth) {
        size_t j = i / DP, c = i - j * DP;
        float v = c < DIM ? src[j * DIM + c] : 0.0f;
        if (scale) v *= scale[j];
        if (lo) {
#if DTYPE == 1
            v -= h2f(f2h(v));
#elif DTYPE == 2
            v -= __uint_as_float((u32)f2bf(v) << 16);
#else
            v = 0.0f;
#endif
        }
        store_elem(dst, i, v);
    }
}
