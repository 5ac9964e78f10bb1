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
// 1024 works the same way. Every block selects the top k of its own slice of the table; the last
// block to finish (an atomic ticket) merges the blocks' candidates with the same routine, sorts
// the winners and writes the answer: one kernel for the whole single-query path.

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
#define RU 1
#elif (12 / NCH) > 8
#define RU 8
#else
#define RU (12 / NCH)                         // rows in flight per lane group
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
    u32 tile;     // batched path: index of this tile
    u32 seq;      // single query: sequence number published after the results
    float qscale; // single query, f16 packed path: max |q| (the query is scaled to <= 1 in f16)
    u64 ns[MAXNS];
};
#define PARAMS_BYTES 640
// Dynamic shared memory of the search kernels before the (optional) query copy: the chunk keys
// (CHUNK*4) share the first 32 KiB with the merge input (MCAP*8); then 16 KiB of merge output.
#define SMEM_MAIN (4096 * 8 + 1024 * 16)

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

// Raw similarity (dot, or for l2 the dot turned into a negated distance) -> ranking key,
// applying recency, the namespace filter and expiry. `sns` is the filter in shared memory.
__device__ __forceinline__ u32 make_key(float dot, float qnorm, u32 row, const Params& P, const Table& T,
                                        const u64* sns) {
#if METRIC == 2
    float s = -fmaxf(qnorm - 2.0f * dot + T.norms[row], 0.0f);
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

// Accessor over candidate lists (global memory, written by other blocks): `nb` lists of
// stride `k`, list b holding cnt[b] entries.
struct CandAcc {
    const u32* ckey;
    const u32* crow;
    const u32* ccnt;
    u32 k;
    const u64* ids;
    __device__ __forceinline__ u32 key(u32 i) const {
        u32 b = i / k, j = i - b * k;
        return j < __ldcg(ccnt + b) ? __ldcg(ckey + i) : 0u;
    }
    __device__ __forceinline__ u32 row(u32 i) const { return __ldcg(crow + i); }
    __device__ __forceinline__ u64 id(u32 i) const { return ids[__ldcg(crow + i)]; }
};

// Finds the rule that takes exactly min(k, valid) elements of `a[0..m)`; result in S.
template <class A>
__device__ void select_rule(const A& a, u32 m, u32 k, SelShared& S) {
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
    // More elements share the k-th key than are needed: take the lowest ids among them.
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
// (valid in every thread).
template <class A>
__device__ u32 select_to(const A& a, u32 m, u32 k, SelShared& S, u32* okey, u32* orow) {
    select_rule(a, m, k, S);
    if (threadIdx.x == 0) S.cnt = 0;
    __syncthreads();
    for (u32 i = threadIdx.x; i < m; i += NT) {
        u32 kk = a.key(i);
        if (take(a, i, kk, S)) {
            u32 p = atomicAdd(&S.cnt, 1u);
            okey[p] = kk;
            orow[p] = a.row(i);
        }
    }
    __syncthreads();
    return S.cnt;
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

// Merges `nb` candidate lists (stride k) into the top k. When they fit (MCAP entries), they are
// first compacted into shared memory with one parallel pass, so the radix passes read shared
// memory instead of dependent global loads. Results go to skey/srow; returns the count.
#define MCAP 4096
__device__ u32 merge_lists(const u32* ckey, const u32* crow, const u32* ccnt, u32 nb, u32 k, const u64* ids,
                           u32* mkey, u32* mrow, SelShared& S, u32* skey, u32* srow) {
    const u32 m = nb * k;
    if (m <= MCAP) {
        if (threadIdx.x == 0) S.cnt = 0;
        __syncthreads();
        for (u32 base = 0; base < m; base += NT * 4) {
            u32 cn[4], kk[4], rr[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {  // independent loads first: one memory round trip
                const u32 i = base + (u32)u * NT + threadIdx.x;
                const bool in = i < m;
                cn[u] = in ? __ldcg(ccnt + i / k) : 0u;
                kk[u] = in ? __ldcg(ckey + i) : 0u;
                rr[u] = in ? __ldcg(crow + i) : 0u;
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const u32 i = base + (u32)u * NT + threadIdx.x;
                if (i < m && i % k < cn[u]) {
                    u32 p = atomicAdd(&S.cnt, 1u);
                    mkey[p] = kk[u];
                    mrow[p] = rr[u];
                }
            }
        }
        __syncthreads();
        const u32 c = S.cnt;
        __syncthreads();
        SmemAcc a{mkey, mrow, ids};
        return select_to(a, c, k, S, skey, srow);
    }
    CandAcc a{ckey, crow, ccnt, k, ids};
    return select_to(a, m, k, S, skey, srow);
}

// Sorts c <= KMAX (key, id, row) entries in shared memory best first (key desc, id asc) and
// writes ids and scores.
__device__ void sort_and_write(u32* skey, u32* srow, u64* sid, u32 c, const u64* ids, u64* out_ids,
                               float* out_scores, u32* out_count) {
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
        float s = key2f(skey[i]);
#if METRIC == 2
        s = -s;
#endif
        out_scores[i] = s;
    }
    if (t == 0) *out_count = c;
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
                                               u32* cand_row, u32* cand_cnt, u32* ticket, unsigned char* out,
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
    for (u32 wb = wbase0; wb < r1; wb += wstep) {
        uint4 v[RU][NCH];
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
    u32* mkey = (u32*)smem;
    u32* mrow = mkey + MCAP;
    // Block's own top k by radix select -> candidate list b.
    ChunkAcc ca{keys, r0, T.ids};
    select_to(ca, r1 - r0, k, S, cand_key + (size_t)b * k, cand_row + (size_t)b * k);
    if (t == 0) cand_cnt[b] = S.cnt;

    // The last block to finish merges everything.
    __threadfence();
    __syncthreads();
    if (PROF && b == 0 && t == 0) stamp(out, 2);
    if (t == 0) S.last = (atomicAdd(ticket, 1u) == P.grid - 1) ? 1u : 0u;
    __syncthreads();
    if (!S.last) return;
    if (PROF && t == 0) stamp(out, 3);
    __threadfence();
    if (t == 0) *ticket = 0u;  // ready for the next replay
    u64* out_ids = (u64*)(out + 8);
    float* out_scores = (float*)(out + 8 + 8 * (size_t)k);
    u32* skey = (u32*)(smem + MCAP * 8);
    u32* srow = skey + KMAX;
    u64* sid = (u64*)(srow + KMAX);
    u32 c = merge_lists(cand_key, cand_row, cand_cnt, P.grid, k, T.ids, mkey, mrow, S, skey, srow);
    sort_and_write(skey, srow, sid, c, T.ids, out_ids, out_scores, (u32*)out);
    // `out` is pinned host memory mapped into the device: the server thread spins on the
    // sequence word, so publish it only after every result is visible to the host.
    __syncthreads();
    if (PROF && t == 0) stamp(out, 4);
    __threadfence_system();
    __syncthreads();
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
                                                           u32* cand_key, u32* cand_row, u32* cand_cnt,
                                                           u32* ticket, unsigned char* out) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ SelShared S;
    __shared__ u64 sns[MAXNS];
    __shared__ Params P;
    load_params(in, P, sns);
    scan_topk_body(P, (const float*)(in + PARAMS_BYTES), T, cand_key, cand_row, cand_cnt, ticket, out, smem, S, sns);
}

#if BYVAL
// Params + query as the kernel's by-value argument: no copy node, no dependent global load.
extern "C" __global__ void __launch_bounds__(NT) scan_topk_v(const Arg a, Table T, u32* cand_key, u32* cand_row,
                                                             u32* cand_cnt, u32* ticket, unsigned char* out) {
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
    scan_topk_body(P, qs, T, cand_key, cand_row, cand_cnt, ticket, out, smem, S, sns);
}
#endif

// ---------------------------------------------------------------------------------------------
// Batches. The GEMM writes a tile of scores, column-major [rows x nq] (ld = rows). Every query
// owns a candidate buffer (key, row) of `cap` entries with a count, and a threshold thr[q]: a
// lower bound of its final k-th key (0 at first). Block (b, q) of batch_filter takes FCH rows of
// query q's column, keeps the rows whose key reaches thr[q] and appends them (all of them when
// at most k, else their top k by radix select, raising thr[q] to the k-th key), so after the
// first tile nearly every block appends nothing and costs one pass over its scores.
// batch_tighten cuts a buffer that grew past `high` to its top k; the host sizes `cap` as
// high + (blocks per tile) * k, so a buffer can never overflow (an overflow would be reported as
// a count of 0xFFFFFFFF, never as wrong results). batch_final selects and sorts each query's top k.
// ---------------------------------------------------------------------------------------------

#define FCH 4096  // rows per filter block (CHUNK)


// Writes the rows [0, c) of (skey, srow) at the end of query q's buffer.
__device__ __forceinline__ void append(const u32* skey, const u32* srow, u32 c, u32* bkey, u32* brow, u32* bcnt,
                                       u32 cap, SelShared& S) {
    if (c == 0) return;
    if (threadIdx.x == 0) S.cnt = atomicAdd(bcnt, c);
    __syncthreads();
    const u32 base = S.cnt;
    for (u32 i = threadIdx.x; i < c; i += NT) {
        if (base + i < cap) {
            bkey[base + i] = skey[i];
            brow[base + i] = srow[i];
        }
    }
}

// Raises thr[q] to the smallest of the c = k keys just selected (skey, shared): with k rows at
// or above it, it bounds q's final k-th key from below. Does nothing when c < k. Must be
// reached by every thread of the block.
__device__ __forceinline__ void raise_bound(const u32* skey, u32 c, u32 k, u32* thr_q, SelShared& S) {
    const u32 t = threadIdx.x;
    if (t == 0) S.last = 0xFFFFFFFFu;
    __syncthreads();
    u32 mn = 0xFFFFFFFFu;
    for (u32 i = t; i < c; i += NT) mn = min(mn, skey[i]);
    atomicMin(&S.last, mn);
    __syncthreads();
    if (t == 0 && c == k) atomicMax(thr_q, S.last);
}

extern "C" __global__ void __launch_bounds__(NT) batch_filter(const unsigned char* __restrict__ in,
                                                              const float* __restrict__ qnorms, Table T,
                                                              const float* __restrict__ scores, u32 ld, u32 row0,
                                                              u32 rows, u32* bkey, u32* brow, u32* bcnt, u32 cap,
                                                              u32* thr) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ SelShared S;
    __shared__ u64 sns[MAXNS];
    __shared__ Params P;
    __shared__ u32 nsurv;
    const int t = threadIdx.x, lane = t & 31;
    if (t == 0) nsurv = 0;
    load_params(in, P, sns);
    const u32 q = blockIdx.y;
    const u32 l0 = min(rows, blockIdx.x * FCH), l1 = min(rows, l0 + FCH);
    const float qn = qnorms[q];
    const u32 lb = __ldcg(thr + q);
    const float* col = scores + (size_t)q * ld;
    u32* ckey = (u32*)smem;  // survivors, compacted
    u32* crow = ckey + FCH;
    for (u32 base0 = l0 + (u32)(t & ~31); base0 < l1; base0 += NT * 16) {  // uniform per warp
        float sc[16];
#pragma unroll
        for (int u = 0; u < 16; u++) {  // independent loads first: one memory round trip
            const u32 i = base0 + (u32)u * NT + lane;
            sc[u] = i < l1 ? col[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 16; u++) {
        const u32 i = base0 + (u32)u * NT + lane;
        u32 kk = 0u;
        if (i < l1) kk = make_key(sc[u], qn, row0 + i, P, T, sns);
        const bool keep = kk != 0u && kk >= lb;
        const u32 m = __ballot_sync(FULLMASK, keep);
        if (m) {
            u32 pos = 0;
            if (lane == __ffs(m) - 1) pos = atomicAdd(&nsurv, (u32)__popc(m));
            pos = __shfl_sync(FULLMASK, pos, __ffs(m) - 1) + __popc(m & ((1u << lane) - 1u));
            if (keep) { ckey[pos] = kk; crow[pos] = row0 + i; }
        }
        }
    }
    __syncthreads();
    const u32 c = nsurv, k = P.k;
    u32* okey = bkey + (size_t)q * cap;
    u32* orow = brow + (size_t)q * cap;
    if (c <= k) {
        append(ckey, crow, c, okey, orow, bcnt + q, cap, S);
        return;
    }
    u32* skey = (u32*)(smem + FCH * 8);
    u32* srow = skey + KMAX;
    SmemAcc a{ckey, crow, T.ids};
    const u32 got = select_to(a, c, k, S, skey, srow);
    raise_bound(skey, got, k, thr + q, S);
    append(skey, srow, got, okey, orow, bcnt + q, cap, S);
}

// Block q: when q's buffer holds more than `high` entries, keep only its top k (and raise thr).
// With final != 0 (batch_final): always select, then sort and write q's results.
__device__ __forceinline__ void tighten_or_final(const unsigned char* in, const Table& T, u32* bkey, u32* brow,
                                                 u32* bcnt, u32 cap, u32 high, u32* thr, bool final, u64* out_ids,
                                                 float* out_scores, u32* out_counts, unsigned char* smem) {
    __shared__ SelShared S;
    const Params* P = (const Params*)in;
    const u32 q = blockIdx.x, k = P->k, t = threadIdx.x;
    const u32 cnt = __ldcg(bcnt + q);
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
    u32 c;
    if (cnt <= MCAP) {  // one parallel pass into shared memory, then select there
        for (u32 i = t; i < cnt; i += NT) { mkey[i] = okey[i]; mrow[i] = orow[i]; }
        __syncthreads();
        SmemAcc a{mkey, mrow, T.ids};
        c = select_to(a, cnt, k, S, skey, srow);
    } else {
        SmemAcc a{okey, orow, T.ids};
        c = select_to(a, cnt, k, S, skey, srow);
    }
    if (final) {
        u64* sid = (u64*)(srow + KMAX);
        sort_and_write(skey, srow, sid, c, T.ids, out_ids + (size_t)q * k, out_scores + (size_t)q * k, out_counts + q);
        return;
    }
    for (u32 i = t; i < c; i += NT) { okey[i] = skey[i]; orow[i] = srow[i]; }
    raise_bound(skey, c, k, thr + q, S);
    if (t == 0) {
        bcnt[q] = c;
    }
}

extern "C" __global__ void __launch_bounds__(NT) batch_tighten(const unsigned char* __restrict__ in, Table T, u32* bkey,
                                                               u32* brow, u32* bcnt, u32 cap, u32 high, u32* thr) {
    extern __shared__ __align__(16) unsigned char smem[];
    tighten_or_final(in, T, bkey, brow, bcnt, cap, high, thr, false, nullptr, nullptr, nullptr, smem);
}

extern "C" __global__ void __launch_bounds__(NT) batch_final(const unsigned char* __restrict__ in, Table T, u32* bkey,
                                                             u32* brow, u32* bcnt, u32 cap, u64* out_ids,
                                                             float* out_scores, u32* out_counts) {
    extern __shared__ __align__(16) unsigned char smem[];
    tighten_or_final(in, T, bkey, brow, bcnt, cap, 0, nullptr, true, out_ids, out_scores, out_counts, smem);
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

// Queries (f32, DIM each) -> padded storage-type rows for the tensor-core GEMM.
extern "C" __global__ void convert_queries(const float* __restrict__ src, u32 nq, void* dst) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t nth = (size_t)gridDim.x * blockDim.x;
    for (size_t i = tid; i < (size_t)nq * DP; i += nth) {
        size_t j = i / DP, c = i - j * DP;
        store_elem(dst, i, c < DIM ? src[j * DIM + c] : 0.0f);
    }
}
