// Kalos GPU kernels: single query: one fused scan + exact top-k launch, its request passed
// by value (small dims) or copied to device memory.

#include "common.cuh"

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
#if BYVAL
struct Arg {
    Params p;
    unsigned char _pad[PARAMS_BYTES - sizeof(Params)];
    float q[DP];
};
#endif

#if DTYPE == 4
// 16-byte vectors of an 8-bit code row (the dimension padded to 16 bytes; Geometry::of_codes).
#define NV8 ((DIM + 15) / 16)

// The 4-bit pass's 8-bit stage: X's c candidates (the best P.k rows by 4-bit key, best first)
// are scored from their 8-bit codes C8 as the int8 scan scores a row (the filters already
// applied by the pass), ranked by that key (ties: lower id), and the best P.kf written to out
// as the int8 scan writes its candidates. Slot P.k - 1 (kf < k) carries the pass's own cut: its
// candidate count in the ids, the 4-bit score of its last candidate in the scores. Table's fields
// come by value: a reference to the kernel's by-value Table would copy it to the stack.
__device__ __noinline__ void rescore8(const Params& P, const uint4* C8, const float* rscale, const float* norms,
                                      const u64* created, const u64* ids, const float* qg, Resc& X,
                                      unsigned char* smem, unsigned char* out) {
    const u32 t = threadIdx.x;
    const u32 c = X.cnt, k = P.k, kf = P.kf;
    u32* q8 = (u32*)smem;            // the query's codes, four to a word (NV8 * 4 words)
    u32* key8 = q8 + NV8 * 4;        // the candidates' 8-bit keys
    for (u32 w = t; w < NV8 * 4; w += NT) q8[w] = pack4(qg + 4 * w, 1, (int)min(4u, DIM - min(DIM, 4 * w)));
    __syncthreads();
    // Eight lanes a row, NT / 8 rows at a time; every lane of a warp runs the same trip count.
    const u32 g = t >> 3, gl = t & 7;
    for (u32 i0 = 0; i0 < c; i0 += NT / 8) {
        const u32 i = i0 + g;
        int a = 0;
        if (i < c) {
            const uint4* row = C8 + (size_t)X.row[i] * NV8;
            for (u32 v = gl; v < NV8; v += 8) a = dot16i(__ldg(row + v), q8 + 4 * v, a);
        }
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o, 8);
        if (gl == 0 && i < c) {
            const u32 r = X.row[i];
            const float s = row_score((float)a * (P.qscale * rscale[r]), P.qnorm, r, P, norms, created);
            key8[i] = f2key(s);
        }
    }
    __syncthreads();
    if (t < c) {
        const u32 kk = key8[t], row = X.row[t];
        const u32 r = rank_of(key8, X.row, 0u, c, t, kk, row, kf, ids);
        if (r < kf) {
            ((u64*)(out + 8))[r] = ids[row];
            ((float*)(out + 8 + 8 * (size_t)k))[r] = key_score(kk);
        }
    }
    if (t == 0) {
        ((u64*)(out + 8))[k - 1] = c;
        ((float*)(out + 8 + 8 * (size_t)k))[k - 1] = c > 0u ? key_score(X.key[c - 1]) : __int_as_float(0xff800000);
        *(u32*)out = min(c, kf) | (X.cutinc ? CUT_FLAG : 0u);
    }
}
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
#if DTYPE == 3
    // The query's integer codes (passed as floats), packed four to a word.
    u32 qi[NCH][4];
#pragma unroll
    for (int c = 0; c < NCH; c++) {
        int vi = c * GS + lane;
#pragma unroll
        for (int e = 0; e < 4; e++) qi[c][e] = pack4(qg + vi * VEC + 4 * e, 1, vi < NV ? 4 : 0);
    }
#elif DTYPE == 4
    // The query's integer codes (passed as floats), four to a word: of each word of 4-bit codes
    // (eight elements) the even elements in qe, the odd ones in qo. qadj: this lane's share of
    // -8 * (sum of the codes), which undoes the codes' offset of 8.
    u32 qe[NCH][4], qo[NCH][4];
    int qadj = 0;
#pragma unroll
    for (int c = 0; c < NCH; c++) {
        int vi = c * GS + lane;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float* q = qg + vi * VEC + 8 * e;
            qe[c][e] = pack4(q, 2, vi < NV ? 4 : 0);
            qo[c][e] = pack4(q + 1, 2, vi < NV ? 4 : 0);
            qadj -= 8 * (__dp4a((int)qe[c][e], 0x01010101, 0) + __dp4a((int)qo[c][e], 0x01010101, 0));
        }
    }
#elif HALF2_DOT
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
            const bool live = row < r1 && row_live(T, row);
#pragma unroll
            for (int c = 0; c < NCH; c++) {
                int vi = c * GS + lane;
                if (live && vi < NV) v[u][c] = ld_stream(V + (size_t)row * NV + vi);
                else v[u][c] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    };
    uint4 nxt[RU][NCH];
    load_rows(nxt, wbase0);
    for (u32 wb = wbase0; wb < r1; wb += wstep) {
        uint4 v[RU][NCH];
#pragma unroll
        for (int u = 0; u < RU; u++)
#pragma unroll
            for (int c = 0; c < NCH; c++) v[u][c] = nxt[u][c];
        load_rows(nxt, wb + wstep);
        float acc[RU];
#if DTYPE == 3 || DTYPE == 4
#pragma unroll
        for (int u = 0; u < RU; u++) {
#if DTYPE == 3
            int a = 0;
#pragma unroll
            for (int c = 0; c < NCH; c++) a = dot16i(v[u][c], qi[c], a);
#else
            int a = qadj;
#pragma unroll
            for (int c = 0; c < NCH; c++) a = dot32n(v[u][c], qe[c], qo[c], a);
#endif
#pragma unroll
            for (int o = GS / 2; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o, GS);
            acc[u] = (float)a;
        }
#else
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
#endif
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

    // With FLAG_CUT (the int8 scan's R candidates, when grid * R overflows the merge's shared
    // memory) each block keeps only its best KCUT: the merge then bounds the rows left out by
    // the blocks' cuts and flags the answer when they could reach the R-th candidate.
    const bool cut = (P.flags & FLAG_CUT) != 0u;
    const u32 k = cut ? min(P.k, (u32)KCUT) : P.k;
    // The block's own top k: for k <= BOUND_K the keys below the group-max bound are dropped and
    // the rest ranked; else (or with heavy ties) by radix select, or by rank for a block of at
    // most SMALL_ROWS rows (into shared memory past the keys; at 10k x 128 on the H200 ranking
    // them took the select phase from 2.1 to 1.7 us). Then the
    // candidates at or above the bound (the best k-th key any block has found so far; ctl[1]) are
    // appended to the flat candidate array (ctl[2] counts them).
    u32* skey = (u32*)(smem + MCAP * 8);
    u32* srow = skey + KMAX;
    u32 got = NONE_U32;
    if (r1 - r0 <= SMALL_ROWS) {  // a few dozen keys: rank them all at once
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
    // Fixed slots: when every block's k fit the merge's shared memory, block b writes its k
    // entries at b*k (key 0 pads a short list) and raises the bound without waiting for the old
    // value: two dependent L2 round trips (the bound's return, the append position) fewer per
    // block than appending (on the H200 the GPU round trip went 17.3 -> 16.0 us at 10k x 128 f32
    // and 51.4 -> 49.4 us at 100k x 768 f16). Otherwise blocks append only the entries at or
    // above the bound, at a position from ctl[2].
    const bool fixed = cut || P.grid * k <= MCAP;
    if (cut) {  // fixed slots, no bound (a block's KCUT-th key bounds no R-th key)
        for (u32 i = t; i < k; i += NT) {
            cand_key[b * k + i] = i < got ? skey[i] : 0u;
            cand_row[b * k + i] = i < got ? srow[i] : 0u;
        }
        if (t == 0) {
            u32 mx = 0u, mn = NONE_U32;
            for (u32 i = 0; i < got; i++) {
                mx = max(mx, skey[i]);
                mn = min(mn, skey[i]);
            }
            cand_key[P.grid * k + b] = mx;  // the block maxima, past the slots
            if (got == k) atomicMax(ctl + 3, mn);  // rows below its k-th key were left out
        }
    } else if (fixed) {
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
        S.mcut = __ldcg(ctl + 3);
        ctl[0] = 0u;
        ctl[1] = 0u;
        ctl[2] = 0u;
        ctl[3] = 0u;
    }
    __syncthreads();
    const u32 bound = S.mbound, total = S.mtotal;
    if (PROF && t == 0) stamp(out, 4);
    if (cut) merge_cut(cand_key, cand_row, P.grid, k, P.k, S.mcut, T.ids, smem, S, out);
    else merge_flat(cand_key, cand_row, total, bound, k, T.ids, (u32*)P.dst, smem, S, out);
#if DTYPE == 4
    if (t == 0 && !cut) RX.cutinc = 0u;
    __syncthreads();
    rescore8(P, (const uint4*)T.codes8, T.rscale, T.norms, T.created, T.ids, qg, RX, smem, out);
#endif
    // `out` is pinned host memory mapped into the device: the server thread spins on the
    // sequence word, so publish it only after every result is visible to the host.
    __syncthreads();
    if (PROF && t == 0) stamp(out, 6);
    __threadfence_system();
    __syncthreads();
    if (PROF && t == 0) stamp(out, 7);
    if (t == 0) *(volatile u32*)(out + 4) = P.seq;
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

// The compact by-value argument: Params' head, the response address and up to NS_INLINE
// namespaces, 112 bytes in place of Params' 640 (a filter of more namespaces takes
// scan_topk_v). Each request's graph update copies the whole argument: on the H200 a kernel
// node with a 4-byte argument answers in 6.4-6.6 us, with 1152 bytes in 9.4-9.6 us
// (tests/gpu/probe_resident.cu). Layout mirrored in src/engine/cuda/single.rs (ParamsC).
struct ParamsC {
    u32 head[PARAMS_HEAD / 4];
    u64 dst;
    u64 ns[NS_INLINE];
};
struct ArgC {
    ParamsC p;
    float q[DP];
};

// Params + query as the kernel's by-value argument: no copy node, no dependent global load. Takes
// the requests whose filter holds more namespaces than the compact argument (scan_topk_c) can.
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
