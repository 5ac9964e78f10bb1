// Kalos GPU kernels: several queries in one pass over the table (f16 and bf16 storage).
//
// scan_multi<QT> reads every row once for up to 8*QT queries that share one filter: each warp
// scores 16 rows against all the queries with tensor-core MMA (m16n8k16, f32 accumulation),
// and each query keeps its own candidates in shared memory behind its own bound, so the Q x N
// score matrix never leaves the registers. The query is split into a high and a low part in
// the storage type (q = hi + lo), both multiplied: the score carries f32-level precision of the
// query, not the storage type's. multi_merge then merges each query's candidates from every
// block (one block per query) and writes its sorted top k.
//
// The K dimension of the MMA may be permuted freely as long as rows and queries use the same
// permutation: lane (g, c) of a warp (g = lane / 4, c = lane % 4) loads 16 contiguous bytes (8
// elements) of rows g and g + 8, and the MMA's fragment positions are assigned so that the
// matching query elements are the same 8 elements of query g. Row loads stay 16-byte and
// coalesced (4 lanes read 64 contiguous bytes of a row), with no shared-memory staging.

#include "common.cuh"

#if DTYPE != 0

// From the engine (compile.rs): MQ_CAP candidates per query in shared memory (ranked directly,
// so at most NT), MQ_KMAX the largest k, MQ_MAXQ queries of the widest variant, MQ_OUT_STRIDE
// bytes of one query's output.
#if !defined(MQ_CAP) || !defined(MQ_KMAX) || !defined(MQ_MAXQ) || !defined(MQ_OUT_STRIDE)
#error "compile the kernels through KernelSpec::options (src/engine/cuda/compile.rs)"
#endif
#define MQ_ROUND ((NT / 32) * 16)  // rows per round: 16 per warp
static_assert(MQ_CAP <= NT && MQ_KMAX + MQ_ROUND <= MQ_CAP, "a round must never overflow a compacted buffer");
static_assert(MQ_OUT_STRIDE >= 8 + 12 * MQ_KMAX && MQ_OUT_STRIDE % 8 == 0, "multi-query output layout");
#define MQ_DPM ((DP + 31) / 32 * 32)  // query elements, padded to the 32 of one lane group step
// Shared-memory stride of one query, 64 bytes past a multiple of 128: the 16-byte loads of a
// quarter warp (lanes (g, c) and (g + 1, c), c = 0..3) then fall on 8 distinct bank groups.
#define MQ_QS (MQ_DPM % 64 == 0 ? MQ_DPM + 32 : MQ_DPM)
#define MQ_NJ (MQ_DPM / 32)           // steps of 32 elements per row
#define MQ_JB 4                       // steps loaded ahead (16-byte loads per lane per row)
#define MQ_WARP_RANK 64               // at most this many candidates: a query's final rank by one warp

// Input (device memory, written by the host per pass): Params (the shared filter, n, k, grid,
// chunk), then qscale[MQ_MAXQ], qnorm[MQ_MAXQ], then the queries as f32, nq x DP (zero-padded).
#define MQ_IN_QSCALE PARAMS_BYTES
#define MQ_IN_QNORM (PARAMS_BYTES + 4 * MQ_MAXQ)
#define MQ_IN_Q (PARAMS_BYTES + 8 * MQ_MAXQ)

__device__ __forceinline__ float st2f(u32 h) {
#if DTYPE == 1
    return h2f(h);
#else
    return __uint_as_float(h << 16);
#endif
}
__device__ __forceinline__ u32 f2st(float f) {
#if DTYPE == 1
    return f2h(f);
#else
    return f2bf(f);
#endif
}

// c += a * b for one 16x8x16 tile: a = rows (row-major), b = queries (col-major).
__device__ __forceinline__ void mma16816(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if DTYPE == 1
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// Dynamic shared memory of scan_multi for QN queries (mirrored in src/engine/cuda/multi.rs):
// queries (high and low parts, 2 x QN x MQ_QS elements), candidates (QN x MQ_CAP keys and rows),
// the compaction output (MQ_KMAX keys and rows), then thr, cnt, qscale, qnorm (QN each).

// Compacts query q's candidates to its top k (sorted) and raises its bounds; every thread.
// For k <= BOUND_K the k-th largest maximum of the 8-slot groups bounds the k-th key from below:
// only the candidates at or above it (usually about k of MQ_CAP) are ranked.
__device__ __forceinline__ void mq_compact(u32* bkey, u32* brow, u32* cnt, u32* thr, u32 k, const u64* ids, u32* okey,
                                           u32* orow, u32* gbound, SelShared& S) {
    const u32 t = threadIdx.x;
    u32 c = *cnt;
    __syncthreads();
    if (k <= BOUND_K && c > 2 * BOUND_K) {
        const u32 kk = t < c ? bkey[t] : 0u;  // c <= MQ_CAP <= NT: one candidate a thread
        const u32 rr = t < c ? brow[t] : 0u;
        if (t == 0) S.cnt = 0;
        const u32 lo = max(group_max_bound(kk, k, S), 1u);  // its barriers order the reads above
        if (kk >= lo) {
            const u32 p = atomicAdd(&S.cnt, 1u);
            bkey[p] = kk;
            brow[p] = rr;
        }
        __syncthreads();
        c = S.cnt;
    }
    const u32 got = rank_select(bkey, brow, 0u, c, k, ids, okey, orow);
    for (u32 i = t; i < got; i += NT) {
        bkey[i] = okey[i];
        brow[i] = orow[i];
    }
    if (t == 0) {
        *cnt = got;
        if (got >= k) {
            const u32 kth = okey[k - 1];
            const u32 g = max(atomicMax(gbound, kth), kth);
            *thr = max(*thr, g);
        }
    }
    __syncthreads();
}

template <int QT>
__device__ __forceinline__ void scan_multi_body(unsigned char* smem, const unsigned char* __restrict__ in, u32 nq, const Table& T,
                                                u32* cand_key, u32* cand_row, u32* gbound) {
    constexpr u32 QN = 8 * QT;
    __shared__ SelShared S;
    __shared__ u64 sns[MAXNS];
    __shared__ Params P;
    u16* qsm = (u16*)smem;  // [2][QN][MQ_QS]
    u32* bkey = (u32*)(smem + 2 * QN * MQ_QS * 2);
    u32* brow = bkey + QN * MQ_CAP;
    u32* okey = brow + QN * MQ_CAP;
    u32* orow = okey + MQ_KMAX;
    u32* thr = orow + MQ_KMAX;
    u32* cnt = thr + QN;
    float* qscale = (float*)(cnt + QN);
    float* qnorm = qscale + QN;
    const u32 t = threadIdx.x;

    load_params(in, P, sns);
    const float* qin = (const float*)(in + MQ_IN_Q);
    for (u32 i = t; i < QN; i += NT) {
        qscale[i] = i < nq ? ((const float*)(in + MQ_IN_QSCALE))[i] : 1.0f;
        qnorm[i] = i < nq ? ((const float*)(in + MQ_IN_QNORM))[i] : 0.0f;
        thr[i] = max(1u, i < nq ? __ldcg(gbound + i) : 0u);
        cnt[i] = 0u;
    }
    __syncthreads();
    // Queries into shared memory, scaled to |q| <= 1 (qscale) and split: hi = q rounded to the
    // storage type, lo = the rest rounded again.
    for (u32 i = t; i < QN * MQ_QS; i += NT) {
        const u32 q = i / MQ_QS, e = i % MQ_QS;
        const float x = (q < nq && e < DP) ? qin[(size_t)q * DP + e] / qscale[q] : 0.0f;
        const u32 hi = f2st(x);
        qsm[i] = (u16)hi;
        qsm[QN * MQ_QS + i] = (u16)f2st(x - st2f(hi));
    }
    __syncthreads();

    const u32 n = P.n, k = P.k, b = blockIdx.x;
    const u32 r0 = min(n, b * P.chunk), r1 = min(n, r0 + P.chunk);
    const u32 lane = t & 31, warp = t >> 5, g = lane >> 2, c = lane & 3;
    const uint4* V = (const uint4*)T.vecs;

    // Rows of a round: warp w takes rows base + 16w .. + 16; lane (g, c) loads rows g and g + 8.
    struct Rows {
        u32 ra, rb;
        bool ina, inb;
        const uint4* va;
        const uint4* vb;
    };
    auto rows_at = [&](u32 base) {
        Rows r;
        r.ra = base + warp * 16 + g;
        r.rb = r.ra + 8;
        r.ina = r.ra < r1 && row_live(T, r.ra);
        r.inb = r.rb < r1 && row_live(T, r.rb);
        r.va = V + (size_t)(r.ina ? r.ra : 0u) * NV;
        r.vb = V + (size_t)(r.inb ? r.rb : 0u) * NV;
        return r;
    };
    uint4 na[MQ_JB], nb[MQ_JB];
    auto load = [&](const Rows& r, u32 j0) {
#pragma unroll
        for (int j = 0; j < MQ_JB; j++) {
            const u32 vi = (j0 + j) * 4 + c;
            const bool ok = j0 + j < MQ_NJ && vi < NV;
            na[j] = (ok && r.ina) ? ld_stream(r.va + vi) : make_uint4(0u, 0u, 0u, 0u);
            nb[j] = (ok && r.inb) ? ld_stream(r.vb + vi) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    Rows cur = rows_at(r0);
    load(cur, 0);
    for (u32 base = r0; base < r1; base += MQ_ROUND) {
        const Rows nxt = rows_at(base + MQ_ROUND);
        // The best k-th key any block has found bounds every query's answer from below: read
        // while this round is scored, applied after it (no L2 round trip between barriers).
        const u32 gb = t < nq ? __ldcg(gbound + t) : 0u;
        float acc[QT][4];
#pragma unroll
        for (int nt = 0; nt < QT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
#pragma unroll 1
        for (u32 j0 = 0; j0 < MQ_NJ; j0 += MQ_JB) {
            uint4 va[MQ_JB], vb[MQ_JB];
#pragma unroll
            for (int j = 0; j < MQ_JB; j++) {
                va[j] = na[j];
                vb[j] = nb[j];
            }
            // The next loads are in flight during this step's MMAs; after the last step of a
            // round, those of the next round's rows (across the round's barriers).
            if (j0 + MQ_JB < MQ_NJ) load(cur, j0 + MQ_JB);
            else load(nxt, 0);
#pragma unroll
            for (int j = 0; j < MQ_JB; j++) {
                if (j0 + j >= MQ_NJ) break;
                const u32 e0 = (j0 + j) * 32 + c * 8;
#pragma unroll
                for (int nt = 0; nt < QT; nt++) {
#pragma unroll
                    for (int part = 0; part < 2; part++) {
                        const uint4 qv = *(const uint4*)(qsm + (part * QN + nt * 8 + g) * MQ_QS + e0);
                        mma16816(acc[nt], va[j].x, vb[j].x, va[j].y, vb[j].y, qv.x, qv.y);
                        mma16816(acc[nt], va[j].z, vb[j].z, va[j].w, vb[j].w, qv.z, qv.w);
                    }
                }
            }
        }
        const u32 ra = cur.ra, rb = cur.rb;
        const bool ina = cur.ina, inb = cur.inb;
        cur = nxt;
        // acc[nt][i]: row (i < 2 ? ra : rb), query nt * 8 + 2c + (i & 1).
#pragma unroll
        for (int nt = 0; nt < QT; nt++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const u32 q = nt * 8 + 2 * c + (i & 1);
                const u32 row = i < 2 ? ra : rb;
                if (q < nq && (i < 2 ? ina : inb)) {
                    const u32 kk = make_key(acc[nt][i] * qscale[q], qnorm[q], row, P, T, sns);
                    if (kk != 0u && kk >= thr[q]) {
                        const u32 p = atomicAdd(cnt + q, 1u);
                        bkey[q * MQ_CAP + p] = kk;
                        brow[q * MQ_CAP + p] = row;
                    }
                }
            }
        }
        __syncthreads();
        if (t < nq) thr[t] = max(thr[t], gb);
        // One barrier tells every thread whether a query's candidates could overflow in the
        // next round (it also orders these reads of cnt before the next round's appends).
        if (__syncthreads_or(t < nq && cnt[t] > MQ_CAP - MQ_ROUND)) {
            for (u32 q = 0; q < nq; q++)
                if (cnt[q] > MQ_CAP - MQ_ROUND)
                    mq_compact(bkey + q * MQ_CAP, brow + q * MQ_CAP, cnt + q, thr + q, k, T.ids, okey, orow, gbound + q, S);
        }
    }

    // Each query's top k of this block into its fixed slots (key 0 pads a short list), with its
    // k-th key raising the query's bound for the merge. A query left with at most MQ_WARP_RANK
    // candidates (the usual case) is ranked by one warp, several queries at once; more go through
    // the block-wide compaction.
    const u32 stride = (P.grid * k + 3u) & ~3u;  // 16-byte aligned lists (merge_flat's loads)
    for (u32 q = warp; q < nq; q += NT / 32) {
        const u32 c = cnt[q];
        if (c > MQ_WARP_RANK) continue;
        const u32* qk = bkey + q * MQ_CAP;
        const u32* qr = brow + q * MQ_CAP;
        u32* ok = cand_key + q * stride + b * k;
        u32* orow2 = cand_row + q * stride + b * k;
        // Every key here is nonzero and every row distinct: the ranks (key desc, then lower id)
        // are 0 .. c - 1, so the first min(c, k) slots are filled.
        for (u32 i = lane; i < c; i += 32) {
            const u32 kk = qk[i], row = qr[i];
            const u32 r = rank_of(qk, qr, 0u, c, i, kk, row, k, T.ids);
            if (r < k) {
                ok[r] = kk;
                orow2[r] = row;
                if (r == k - 1) atomicMax(gbound + q, kk);
            }
        }
        for (u32 i = min(c, k) + lane; i < k; i += 32) {
            ok[i] = 0u;
            orow2[i] = 0u;
        }
    }
    for (u32 q = 0; q < nq; q++) {
        if (cnt[q] <= MQ_WARP_RANK) continue;  // the same in every thread: cnt is settled
        mq_compact(bkey + q * MQ_CAP, brow + q * MQ_CAP, cnt + q, thr + q, k, T.ids, okey, orow, gbound + q, S);
        const u32 got = cnt[q];
        for (u32 i = t; i < k; i += NT) {
            cand_key[q * stride + b * k + i] = i < got ? bkey[q * MQ_CAP + i] : 0u;
            cand_row[q * stride + b * k + i] = i < got ? brow[q * MQ_CAP + i] : 0u;
        }
    }
}

// Up to 8, 16 or 32 queries sharing one filter, one pass over the table. Launch: P.grid blocks,
// mq_smem(8 * QT) bytes of dynamic shared memory; gbound (one word per query) is 0 before the
// launch and is reset by multi_merge.
extern "C" __global__ void __launch_bounds__(NT) scan_multi1(const unsigned char* __restrict__ in, u32 nq, Table T,
                                                             u32* cand_key, u32* cand_row, u32* gbound) {
    extern __shared__ __align__(16) unsigned char smem[];
    scan_multi_body<1>(smem, in, nq, T, cand_key, cand_row, gbound);
}
extern "C" __global__ void __launch_bounds__(NT) scan_multi2(const unsigned char* __restrict__ in, u32 nq, Table T,
                                                             u32* cand_key, u32* cand_row, u32* gbound) {
    extern __shared__ __align__(16) unsigned char smem[];
    scan_multi_body<2>(smem, in, nq, T, cand_key, cand_row, gbound);
}
extern "C" __global__ void __launch_bounds__(NT, 1) scan_multi4(const unsigned char* __restrict__ in, u32 nq, Table T,
                                                             u32* cand_key, u32* cand_row, u32* gbound) {
    extern __shared__ __align__(16) unsigned char smem[];
    scan_multi_body<4>(smem, in, nq, T, cand_key, cand_row, gbound);
}

// Merges query blockIdx.x's candidates (P.grid * k fixed slots) into its sorted top k at
// out + blockIdx.x * MQ_OUT_STRIDE (count u32, pad, ids u64[k], scores f32[k]) and resets its
// bound for the next pass. Dynamic shared memory: SMEM_MAIN.
extern "C" __global__ void __launch_bounds__(NT) multi_merge(const unsigned char* __restrict__ in, Table T, const u32* cand_key,
                                                             const u32* cand_row, u32* gbound, unsigned char* out) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ SelShared S;
    const u32 q = blockIdx.x, t = threadIdx.x;
    const Params& P = *(const Params*)in;
    const u32 k = P.k, total = P.grid * k, stride = (total + 3u) & ~3u;
    if (t == 0) S.mbound = __ldcg(gbound + q);
    __syncthreads();
    const u32 lo = S.mbound;
    merge_flat(cand_key + (size_t)q * stride, cand_row + (size_t)q * stride, total, lo, k, T.ids, nullptr, smem, S,
               out + (size_t)q * MQ_OUT_STRIDE);
    __syncthreads();
    if (t == 0) gbound[q] = 0u;
}

#endif
