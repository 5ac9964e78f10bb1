// Kalos GPU kernels: batches: selection from cuBLAS GEMM score tiles (filter, tighten, final)
// and gated tiles (gate_bias, gate_scan).

#include "common.cuh"

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

// FU: 16-byte score loads per thread per step (from the host)
#define FSTEP (NT * FU * 4)   // rows per step of a filter block
#define FPD 2                 // steps loaded ahead (3: no gain, 4: slower; docs/GPU.md)
#define FMINB 5               // resident filter blocks per SM the registers are budgeted for

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
