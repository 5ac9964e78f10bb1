#pragma once
// Kalos GPU kernels, shared code: types, the constants and request layout shared with the host,
// row loads and dot products, ranking keys and the block-wide radix select. Every module
// (scan.cu, batch.cu, table.cu) includes it; the engine compiles each module with NVRTC to a
// CUBIN for the device's own architecture, specialised by the defines it passes (no toolkit
// headers: NVRTC needs none).
//
//   DIM     vector dimension
//   DTYPE   0 = f32, 1 = f16, 2 = bf16 table storage; 3 = the int8 scan's codes (scan = "int8":
//           scan.cu only, dimensions whose query slice fits in registers; rows of DP signed
//           bytes with a per-row scale in Table::rscale, queries passed as their integer codes);
//           4 = the int8 scan's 4-bit first pass (scan.cu only: rows of DP packed 4-bit codes,
//           the best k re-scored from the 8-bit codes in Table::codes8, the best kf kept)
//   METRIC  0 = ip (cosine rows are stored normalised and compile as ip), 2 = l2 (squared distance)
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

// Every constant shared with the host, and the dimension's geometry, come from the engine as
// -D defines (src/engine/cuda/compile.rs, KernelSpec::options): one source of truth.
#if !defined(NT) || !defined(CHUNK) || !defined(KMAX) || !defined(MAXNS) || !defined(PARAMS_BYTES) || !defined(PARAMS_HEAD) || !defined(SMEM_MAIN) || !defined(PROF_OFF) || !defined(FLAG_EXPIRY) || !defined(FLAG_RECENCY) || !defined(FLAG_CUT) || !defined(KCUT) || !defined(MCAP) || !defined(CUT_FLAG) || !defined(NS_INLINE) || !defined(FU) || !defined(DIM) || !defined(DTYPE) || !defined(METRIC) || !defined(VEC) || !defined(DP) || !defined(NV) || !defined(GS) || !defined(NCH) || !defined(QREG) || !defined(RU0) || !defined(BYVAL) || !defined(PROF) || !defined(FPROG_MAX)
#error "compile the kernels through KernelSpec::options (src/engine/cuda/compile.rs)"
#endif
// NT: threads per block. CHUNK: most rows one block scores. DP: padded row length (elements,
// 16-byte rows), NV: 16-byte vectors per row, GS: lanes per row, NCH: 16-byte loads per lane per
// row, QREG: query slice held in registers, RU0: rows in flight per lane group.
#define NONE_U32 0xFFFFFFFFu

// The scan loads the next rows before it computes the current ones, with half as many rows per
// step (RU = RU0 / 2 when RU0 > 1), so loads stay in flight across the compute.
#if RU0 > 1
#define RU (RU0 / 2)
#else
#define RU RU0
#endif

// Request parameters, copied to the device with the query (layout mirrored in src/engine/cuda/mod.rs).
// Params' fields before the namespace list: the head both by-value arguments start with. A base
// struct, so that its size (the offset of Params::ns) can be checked with sizeof, which every
// NVRTC accepts in a constant expression (NVRTC 13.0 has no __builtin_offsetof).
struct ParamsHead {
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
    u32 kf;       // DTYPE 4: candidates the 8-bit stage keeps (k is the 4-bit pass's count)
    u32 _pad;
};
static_assert(sizeof(ParamsHead) == PARAMS_HEAD, "Params head: mirrored in cuda/mod.rs (PARAMS_HEAD)");
static_assert(KCUT % 4 == 0, "merge_cut reads the cut candidates four at a time");
struct Params : ParamsHead {
    u64 ns[MAXNS];
    u64 dst;      // single query: device address of the client's slot (its response body), or 0
};
// Dynamic shared memory of the search kernels before the (optional) query copy (SMEM_MAIN): the
// chunk keys (CHUNK*4) share the first MCAP*8 bytes with the merge input (MCAP candidates the
// final merge compacts into shared memory); then KMAX*16 bytes of merge output.

// Table columns on the device.
struct Table {
    const void* vecs;        // n x DP elements
    const float* norms;      // l2: |x|^2
    const u64* ids;
    const u64* ns;
    const u64* created;
    const u64* expires;
    const u32* mask;         // metadata filter: bit r set = row r may match; NULL = no filter
    const float* rscale;     // DTYPE 3 and 4: each row's 8-bit scale (x ~ rscale * code); else unused
    const void* codes8;      // DTYPE 4: the 8-bit codes (NV8 16-byte vectors a row); else unused
};

#if DTYPE == 4
// The merge's best k candidates (k <= NT), by 4-bit rank, for the 8-bit stage (scan.cu,
// rescore8) instead of the response.
struct Resc {
    u32 key[NT];
    u32 row[NT];
    u32 cnt;     // candidates kept (min(c, k))
    u32 cutinc;  // the FLAG_CUT merge could not prove its k complete
};
__shared__ Resc RX;
#endif

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
__device__ __forceinline__ void stamp(unsigned char* out, int i) {
#if PROF
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    ((volatile u64*)(out + PROF_OFF))[i] = t;
#endif
}

// Table rows are read once per query: they bypass L1 allocation (a plain __ldg measured the same
// on the H200; this is the load the benchmarks ran).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}

// Whether `row` may match the metadata filter (every row when there is none). The scans read
// no bytes of a row the mask leaves out: `make_key` gives it key 0 whatever its values.
__device__ __forceinline__ bool row_live(const Table& T, u32 row) {
    return !T.mask || ((__ldg(T.mask + (row >> 5)) >> (row & 31)) & 1u);
}

#if (DTYPE == 3 || DTYPE == 4) && !QREG
#error "the int8 scan needs the query slice in registers (Geometry::of_codes / of_nibbles(dim).qreg)"
#endif

// Four integer codes (passed as floats) q[0], q[stride], q[2 * stride], q[3 * stride], packed
// into the bytes of one word, lowest first; elements from the n-th on are zero.
__device__ __forceinline__ u32 pack4(const float* q, int stride, int n) {
    u32 w = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int x = j < n ? (int)q[j * stride] : 0;
        w |= ((u32)x & 0xffu) << (8 * j);
    }
    return w;
}

// Dot product of 16 signed bytes with 16 packed query codes, accumulated exactly in 32 bits.
__device__ __forceinline__ int dot16i(uint4 v, const u32* q, int acc) {
    asm("dp4a.s32.s32 %0, %1, %2, %0;" : "+r"(acc) : "r"(v.x), "r"(q[0]));
    asm("dp4a.s32.s32 %0, %1, %2, %0;" : "+r"(acc) : "r"(v.y), "r"(q[1]));
    asm("dp4a.s32.s32 %0, %1, %2, %0;" : "+r"(acc) : "r"(v.z), "r"(q[2]));
    asm("dp4a.s32.s32 %0, %1, %2, %0;" : "+r"(acc) : "r"(v.w), "r"(q[3]));
    return acc;
}

// Dot product of 32 packed 4-bit codes (byte b: element 2b in the low nibble, 2b + 1 in the
// high one, each stored as code + 8 in 1..15) with the query's codes, the even elements of each
// word's eight packed in qe and the odd ones in qo. Accumulated exactly in 32 bits; the caller
// subtracts 8 * (sum of the query's codes).
__device__ __forceinline__ int dot32n(uint4 v, const u32* qe, const u32* qo, int acc) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const u32 lo = w[e] & 0x0f0f0f0fu, hi = (w[e] >> 4) & 0x0f0f0f0fu;
        asm("dp4a.s32.s32 %0, %1, %2, %0;" : "+r"(acc) : "r"(lo), "r"(qe[e]));
        asm("dp4a.s32.s32 %0, %1, %2, %0;" : "+r"(acc) : "r"(hi), "r"(qo[e]));
    }
    return acc;
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

// Score of a row from its dot product: for l2 the negated distance, then recency weighting.
__device__ __forceinline__ float row_score(float dot, float qnorm, u32 row, const Params& P, const float* norms,
                                           const u64* created) {
#if METRIC == 2
    float s = l2_score(dot, qnorm, norms[row]);
#else
    float s = dot;
#endif
    if (P.flags & FLAG_RECENCY) {
        u64 c = created[row];
        u64 age = P.now_ms > c ? P.now_ms - c : 0ull;
        float boost = (float)exp2(-(double)age / P.hl);
        s = (1.0f - P.w) * s + P.w * boost;
    }
    return s;
}

// The 4-bit codes' scale over the 8-bit one: a row whose largest magnitude is m has 8-bit scale
// m / 127 (T.rscale) and 4-bit scale m / 7.
#define NIB_RATIO (127.0f / 7.0f)

// Raw similarity (dot, or for l2 the dot turned into a negated distance) -> ranking key,
// applying recency, the namespace filter and expiry. `sns` is the filter in shared memory.
__device__ __forceinline__ u32 make_key(float dot, float qnorm, u32 row, const Params& P, const Table& T,
                                        const u64* sns) {
#if DTYPE == 3
    // The int8 scan's approximate dot product: the integer sum times both scales, multiplied
    // in the order of the CPU engine's (src/engine/cpu/mod.rs, score_rows).
    dot = dot * (P.qscale * T.rscale[row]);
#elif DTYPE == 4
    dot = dot * (P.qscale * (T.rscale[row] * NIB_RATIO));
#endif
    const float s = row_score(dot, qnorm, row, P, T.norms, T.created);
    bool ok = true;
    if (P.nns != NONE_U32) {
        u64 ns = T.ns[row];
        ok = false;
        for (u32 i = 0; i < P.nns; i++) ok |= (sns[i] == ns);
    }
    if (P.flags & FLAG_EXPIRY) ok &= T.expires[row] > P.now_ms;
    if (T.mask) ok &= (T.mask[row >> 5] >> (row & 31)) & 1u;
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
    u32 mbound, mtotal, mcut;  // values read from global memory by one thread for the whole block
    u32 over;
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
#if DTYPE == 4
                        const u32 ri = srow[i];
                        srow[i] = srow[j];
                        srow[j] = ri;
#endif
                    }
                }
            }
            __syncthreads();
        }
    }
#if DTYPE == 4
    for (u32 i = t; i < c; i += NT) {  // c <= k <= NT
        RX.key[i] = skey[i];
        RX.row[i] = srow[i];
    }
    if (t == 0) RX.cnt = c;
    return;
#endif
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
#if DTYPE == 4
        if (r < k) {
            RX.key[r] = kk;
            RX.row[r] = mrow[t];
        }
    }
    if (t == 0) RX.cnt = min(c, k);
#else
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
#endif
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

// The rank of entry i (key kk, row `row`) among the c entries ckey[0..c) (rows crow[j], or row0 + j
// when crow is null): how many rank before it (key desc, then lower id). Ids are read only where
// keys tie and the rank is still below k.
__device__ __forceinline__ u32 rank_of(const u32* ckey, const u32* crow, u32 row0, u32 c, u32 i, u32 kk, u32 row,
                                       u32 k, const u64* ids) {
    u32 r = 0, eq = 0;
    for (u32 j = 0; j < c; j++) {
        const u32 kj = ckey[j];
        r += kj > kk ? 1u : 0u;
        eq += (kj == kk && j != i) ? 1u : 0u;
    }
    if (eq && r < k) {
        const u64 id = ids[row];
        for (u32 j = 0; j < c; j++)
            if (j != i && ckey[j] == kk && ids[crow ? crow[j] : row0 + j] < id) r++;
    }
    return r;
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
        const u32 r = rank_of(ckey, crow, row0, c, t, kk, row, k, ids);
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

// The final merges' shared memory (SMEM_MAIN): MCAP compacted candidates (keys, rows), then
// the selection's KMAX keys, rows and ids; and the response they write to `out` (count word,
// k ids, k scores) and to `dst` (the client's slot, when not null).
struct MergeOut {
    u32* mkey;
    u32* mrow;
    u32* skey;
    u32* srow;
    u64* sid;
    u64* out_ids;
    float* out_scores;
    u32* count;
    u32* dst;
    __device__ __forceinline__ MergeOut(unsigned char* smem, unsigned char* out, u32 k, u32* dst_)
        : mkey((u32*)smem), mrow((u32*)smem + MCAP), skey((u32*)(smem + MCAP * 8)), srow(skey + KMAX),
          sid((u64*)(srow + KMAX)), out_ids((u64*)(out + 8)), out_scores((float*)(out + 8 + 8 * (size_t)k)),
          count((u32*)out), dst(dst_) {}

    // The top k of the c candidates compacted into mkey/mrow (c <= MCAP): a few (<= NT, the
    // usual case) ranked directly, more through the radix select and a sort.
    __device__ __forceinline__ void rank(u32 c, u32 k, const u64* ids, SelShared& S) {
        if (c <= NT) {
            rank_write(mkey, mrow, c, k, ids, sid, out_ids, out_scores, count, dst);
            return;
        }
        SmemAcc a{mkey, mrow, ids};
        const u32 got = select_to(a, c, k, S, skey, srow);
        sort_and_write(skey, srow, sid, got, ids, out_ids, out_scores, count, dst);
    }

    // The top k of `total` candidates at or above `lo`, selected straight from global memory
    // (more than MCAP survive: large k, heavy ties).
    __device__ __forceinline__ void select_global(const u32* ckey, const u32* crow, u32 total, u32 lo, u32 k,
                                                  const u64* ids, SelShared& S) {
        FlatAcc a{ckey, crow, lo, ids};
        const u32 got = select_to(a, total, k, S, skey, srow);
        sort_and_write(skey, srow, sid, got, ids, out_ids, out_scores, count, dst);
    }
};

// Final merge of the single-query path (the last block): the blocks appended `total` candidates,
// each at or above the bound at the time; every entry below the final bound `lo` cannot be in the
// top k. The survivors are compacted into shared memory with independent loads (one memory round
// trip for MCAP entries); a few (<= NT, the usual case) are ranked directly, more go through the
// radix select and a sort. Writes the results to out (and the response body to dst, the client's
// slot, when not null).
__device__ __noinline__ void merge_flat(const u32* ckey, const u32* crow, u32 total, u32 lo, u32 k, const u64* ids, u32* dst,
                                        unsigned char* smem, SelShared& S, unsigned char* out) {
    const u32 t = threadIdx.x;
    MergeOut M(smem, out, k, dst);
    u32* mkey = M.mkey;
    u32* mrow = M.mrow;
    if (total > MCAP) {  // many candidates (large k, ties): select straight from global memory
        if (PROF && t == 0) stamp(out, 5);
        M.select_global(ckey, crow, total, lo, k, ids, S);
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
    M.rank(c, k, ids, S);
}

// Accessor over keys in shared memory (no rows, no ids: a rule with `ties` only).
struct KeyAcc {
    const u32* keys;
    __device__ __forceinline__ u32 key(u32 i) const { return keys[i]; }
    __device__ __forceinline__ u32 row(u32 i) const { return i; }
    __device__ __forceinline__ u64 id(u32 i) const { return 0ull; }
};

// Final merge of a FLAG_CUT single query (the last block): `grid` blocks each left kb (a multiple
// of 4) candidates at fixed slots and their maximum at ckey[grid * kb + b]; the top k (k > kb) is
// wanted. The k-th largest block maximum bounds the k-th key from below (k blocks each hold a
// key at or above it), which leaves a few hundred of the grid * kb entries; they are compacted
// into shared memory and ranked. `cutmax` is the largest key a block cut at (rows at or below it
// may be missing): when fewer than k entries lie above it, the count word's top bit is set and
// the caller scans again without the cut.
__device__ __noinline__ void merge_cut(const u32* ckey, const u32* crow, u32 grid, u32 kb, u32 k, u32 cutmax,
                                       const u64* ids, unsigned char* smem, SelShared& S, unsigned char* out) {
    const u32 t = threadIdx.x;
    MergeOut M(smem, out, k, nullptr);
    u32* mkey = M.mkey;
    u32* mrow = M.mrow;
    const u32 total = grid * kb;
    u32 lo = 1u;
    if (grid <= MCAP) {
        for (u32 i = t; i < grid; i += NT) mrow[i] = __ldcg(ckey + total + i);
        __syncthreads();
        KeyAcc ka{mrow};
        select_rule(ka, grid, k, S, true);
        // The rule's prefix (its undecided low bits zero) is at most the k-th largest maximum.
        if (!S.all) lo = max(lo, S.prefix);
        __syncthreads();
    }
    if (t == 0) { S.cnt = 0; S.over = 0; }
    __syncthreads();
    // 16-byte loads, four in flight per thread (kb = KCUT is a multiple of 4); rows are read only
    // for the entries kept.
    u32 over = 0;
    const u32 nv = total / 4;
    for (u32 v0 = t; v0 < nv; v0 += 4 * NT) {
        uint4 kv[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const u32 v = v0 + u * NT;
            kv[u] = v < nv ? __ldcg((const uint4*)ckey + v) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const u32 e[4] = {kv[u].x, kv[u].y, kv[u].z, kv[u].w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const u32 kk = e[j];
                over += kk > cutmax ? 1u : 0u;
                if (kk >= lo) {
                    const u32 p = atomicAdd(&S.cnt, 1u);
                    if (p < MCAP) {
                        mkey[p] = kk;
                        mrow[p] = __ldcg(crow + 4 * (v0 + u * NT) + j);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) over += __shfl_xor_sync(0xffffffffu, over, o);
    if ((t & 31) == 0 && over) atomicAdd(&S.over, over);
    __syncthreads();
    const u32 c = S.cnt;
    const bool incomplete = cutmax != 0u && S.over < k;
    if (PROF && t == 0) {
        stamp(out, 5);
        ((volatile u64*)(out + PROF_OFF))[8] = ((u64)total << 32) | c;  // candidates, survivors
    }
    __syncthreads();
    if (c > MCAP) M.select_global(ckey, crow, total, lo, k, ids, S);  // heavy ties at the bound
    else M.rank(c, k, ids, S);
#if DTYPE == 4
    if (t == 0) RX.cutinc = incomplete ? 1u : 0u;
#else
    if (t == 0 && incomplete) *(u32*)out |= CUT_FLAG;
#endif
}

#define FULLMASK 0xffffffffu

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
