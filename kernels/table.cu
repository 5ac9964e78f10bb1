// Kalos GPU kernels: table and query preparation: rows scattered into the device table, batch
// queries checked and converted to the storage type.

#include "common.cuh"

// The integer code of v at scale inv, clamped to [-q, q] (as a float).
__device__ __forceinline__ float code_of(float v, float inv, float q) {
    return fminf(fmaxf(roundf(__fmul_rn(v, inv)), -q), q);
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

// The int8 scan's copy (scan = "int8"): each staged row quantized as src/engine/quant.rs does
// it (per-row symmetric scale s = max|x| / 127, codes round(x * (127 / max|x|)) clamped to
// +-127; a zero or non-finite maximum gives scale 0 and zero codes), into rows of dp8 bytes
// (zero padded). With nib (the 4-bit first pass on), also 4-bit codes into rows of dpn bytes
// (padding elements code 0). One warp per row.
extern "C" __global__ void quantize_rows(const u32* __restrict__ rows, const float* __restrict__ src, u32 m,
                                         u32 dp8, signed char* codes, float* scales, u32 dpn,
                                         unsigned char* nib) {
    const u32 lane = threadIdx.x & 31;
    const u32 nw = (gridDim.x * blockDim.x) >> 5;
    for (u32 j = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; j < m; j += nw) {
        const float* x = src + (size_t)j * DIM;
        float mx = 0.0f;
        for (u32 c = lane; c < DIM; c += 32) mx = fmaxf(mx, fabsf(x[c]));
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const bool zero = !(mx > 0.0f) || mx == __int_as_float(0x7f800000);
        const float inv = zero ? 0.0f : __fdiv_rn(127.0f, mx);
        signed char* o = codes + (size_t)rows[j] * dp8;
        for (u32 c = lane; c < dp8; c += 32) {
            const float v = c < DIM ? x[c] : 0.0f;
            const float q = zero ? 0.0f : code_of(v, inv, 127.0f);
            o[c] = (signed char)(int)q;
        }
        if (nib) {  // 4-bit codes round(x * 7 / max|x|), stored + 8, two to a byte (low first)
            const float inv4 = zero ? 0.0f : __fdiv_rn(7.0f, mx);
            unsigned char* o4 = nib + (size_t)rows[j] * dpn;
            for (u32 c = lane; c < dpn; c += 32) {
                u32 b = 0;
#pragma unroll
                for (u32 h = 0; h < 2; h++) {
                    const u32 d = 2 * c + h;
                    const float v = d < DIM ? x[d] : 0.0f;
                    const float q = zero ? 0.0f : code_of(v, inv4, 7.0f);
                    b |= (u32)((int)q + 8) << (4 * h);
                }
                o4[c] = (unsigned char)b;
            }
        }
        if (lane == 0) scales[rows[j]] = zero ? 0.0f : __fdiv_rn(mx, 127.0f);
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

// ---------------------------------------------------------------------------------------------
// Metadata filters. Each field column lives on the device as one u64 cell and one presence byte
// per row (src/filter/program.rs: keyword code, int64 / timestamp bits, float64 bits, bool 1 / 2).
// col_scatter writes m staged cells to their rows; filter_eval runs a compiled filter program
// (postfix, a stack of bits in one u64) over every row into a bitmap of matching rows, and
// appends the first `cap` matching rows to `list` (in no particular order; count[0] counts all).
// ---------------------------------------------------------------------------------------------

extern "C" __global__ void col_scatter(const u32* __restrict__ rows, const u64* __restrict__ vals,
                                       const unsigned char* __restrict__ has, u32 m, u64* dvals,
                                       unsigned char* dhas) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x) {
        const u32 r = rows[i];
        dvals[r] = vals[i];
        dhas[r] = has[i];
    }
}

// The rows of a very selective filter (filter_eval's list, min(count, cap) of them) gathered
// into a compact table of `cap` rows, which the single-query kernel then scans: each row's nv16
// 16-byte vectors and its columns, and the compact table's mask (bit j set for the j < m rows
// gathered; the rows past them keep stale values and key 0). The count is read here, on the
// device: the host sizes the grid and the scan for `cap` rows without waiting for it.
extern "C" __global__ void gather_rows(const u32* __restrict__ list, const u32* __restrict__ count, u32 cap, u32 nv16,
                                       const uint4* __restrict__ svecs, const float* __restrict__ snorms,
                                       const u64* __restrict__ sids, const u64* __restrict__ sns,
                                       const u64* __restrict__ screated, const u64* __restrict__ sexpires, uint4* dvecs,
                                       float* dnorms, u64* dids, u64* dns, u64* dcreated, u64* dexpires,
                                       u32* __restrict__ dmask) {
    const u32 m = min(*count, cap);
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t nth = (size_t)gridDim.x * blockDim.x;
    for (size_t w = tid; w < (cap + 31u) / 32u; w += nth) {
        const u32 j0 = (u32)w * 32u;
        dmask[w] = m >= j0 + 32u ? 0xffffffffu : (m > j0 ? (1u << (m - j0)) - 1u : 0u);
    }
    for (size_t i = tid; i < (size_t)m * nv16; i += nth) {
        const size_t j = i / nv16, c = i - j * nv16;
        dvecs[i] = svecs[(size_t)list[j] * nv16 + c];
    }
    for (size_t j = tid; j < m; j += nth) {
        const u32 r = list[j];
        dnorms[j] = snorms[r];
        dids[j] = sids[r];
        dns[j] = sns[r];
        dcreated[j] = screated[r];
        dexpires[j] = sexpires[r];
    }
}

struct FIns {
    u32 op, col, a, b;  // src/filter/program.rs: Ins
};
struct FCol {
    const u64* vals;
    const unsigned char* has;
};
#define P_FALSE 0u
#define P_TRUE 1u
#define P_EXISTS 2u
#define P_CODE_IN 3u
#define P_I64_RANGE 4u
#define P_F64_RANGE 5u
#define P_BOOL_SET 6u
#define P_NOT 7u
#define P_AND 8u
#define P_OR 9u

__device__ __forceinline__ bool code_in(const u64* __restrict__ c, u32 n, u64 v) {
    u32 lo = 0, hi = n;
    while (lo < hi) {
        const u32 mid = (lo + hi) >> 1;
        const u64 x = c[mid];
        if (x == v) return true;
        if (x < v) lo = mid + 1;
        else hi = mid;
    }
    return false;
}

// One bit per row; the count of matching rows is summed per block (one global atomic a block),
// then a block whose rows start below `cap` in the list writes them there.
//
// The count: `counts` holds two counts and two block tallies, and an evaluation of parity `par`
// (the host alternates it) sums into counts[par], and block 0 zeroes counts[par ^ 1] and
// tallies[par ^ 1] for the next evaluation (nothing reads them now: the evaluation before this
// one and the gather behind it finished before this kernel started). The last block to finish
// its sum writes the count into `host_count` (pinned host memory, mapped): the host needs no
// reset or copy of its own.
__device__ __forceinline__ void filter_eval_body(const FIns* prog, u32 nins, const u64* consts, const FCol* cols, u32 n,
                                                 u32* __restrict__ mask, u32* __restrict__ list, u32 cap,
                                                 u32* counts, u32 par, u32* host_count) {
    __shared__ u32 s_cnt, s_base, s_pos;
    if (threadIdx.x == 0) {
        s_cnt = 0;
        s_pos = 0;
    }
    __syncthreads();
    const u32 nwords = (n + 31) / 32;
    const u32 lane = threadIdx.x & 31;
    const u32 wstep = gridDim.x * blockDim.x / 32;
    u32 mine = 0;
    for (u32 w = (blockIdx.x * blockDim.x + threadIdx.x) / 32; w < nwords; w += wstep) {
        const u32 r = w * 32 + lane;
        bool ok = false;
        if (r < n) {
            u64 st = 0;
            u32 sp = 0;
            for (u32 i = 0; i < nins; i++) {
                const FIns in = prog[i];
                u64 v;
                if (in.op == P_NOT) {
                    st ^= 1ull << (sp - 1);
                    continue;
                } else if (in.op == P_AND || in.op == P_OR) {
                    const u64 x = (st >> (sp - 1)) & 1ull, y = (st >> (sp - 2)) & 1ull;
                    sp -= 2;
                    st &= ~(3ull << sp);
                    v = in.op == P_AND ? (x & y) : (x | y);
                } else if (in.op <= P_TRUE) {
                    v = in.op;
                } else {
                    const FCol c = cols[in.col];
                    const u64 cell = c.vals[r];
                    bool t = c.has[r] != 0;
                    if (in.op == P_CODE_IN) t = t && code_in(consts + in.a, in.b, cell);
                    else if (in.op == P_I64_RANGE)
                        t = t && (long long)consts[in.a] <= (long long)cell && (long long)cell <= (long long)consts[in.a + 1];
                    else if (in.op == P_F64_RANGE) {
                        const double x = __longlong_as_double((long long)cell);
                        const double lo = __longlong_as_double((long long)consts[in.a]);
                        const double hi = __longlong_as_double((long long)consts[in.a + 1]);
                        t = t && ((in.b & 1u) ? x > lo : x >= lo) && ((in.b & 2u) ? x < hi : x <= hi);
                    } else if (in.op == P_BOOL_SET) t = t && ((in.a >> (u32)cell) & 1u);
                    else if (in.op != P_EXISTS) t = false;
                    v = t ? 1ull : 0ull;
                }
                st |= v << sp;
                sp++;
            }
            ok = st & 1ull;
        }
        const u32 bits = __ballot_sync(0xffffffffu, ok);
        if (lane == 0) mask[w] = bits;
        mine += (u32)__popc(bits);
    }
    if (lane == 0 && mine) atomicAdd(&s_cnt, mine);
    __syncthreads();
    if (threadIdx.x == 0) {
        s_base = s_cnt ? atomicAdd(&counts[par], s_cnt) : cap;
        if (blockIdx.x == 0) {
            counts[par ^ 1u] = 0;
            counts[2 + (par ^ 1u)] = 0;
        }
        // This block's sum is in before its tally: the block that completes the tally reads
        // every block's sum.
        __threadfence();
        if (atomicAdd(&counts[2 + par], 1u) == gridDim.x - 1) {
            __threadfence();
            *(volatile u32*)host_count = *(volatile u32*)&counts[par];
            __threadfence_system();
        }
    }
    __syncthreads();
    if (s_base >= cap) return;
    __threadfence_block();
    // This block's words again (each lane reads its own warp's words, written above by lane 0).
    for (u32 w = (blockIdx.x * blockDim.x + threadIdx.x) / 32; w < nwords; w += wstep) {
        const u32 bits = __shfl_sync(0xffffffffu, lane == 0 ? ((volatile u32*)mask)[w] : 0u, 0);
        if (!bits) continue;
        u32 at = 0;
        if (lane == 0) at = atomicAdd(&s_pos, (u32)__popc(bits));
        at = __shfl_sync(0xffffffffu, at, 0);
        if ((bits >> lane) & 1u) {
            const u32 p = s_base + at + (u32)__popc(bits & ((1u << lane) - 1u));
            if (p < cap) list[p] = w * 32 + lane;
        }
    }
}

// The program in device memory (programs of more than FPROG_MAX bytes).
extern "C" __global__ void filter_eval(const FIns* __restrict__ prog, u32 nins, const u64* __restrict__ consts,
                                       const FCol* __restrict__ cols, u32 n, u32* __restrict__ mask,
                                       u32* __restrict__ list, u32 cap, u32* counts, u32 par, u32* host_count) {
    filter_eval_body(prog, nins, consts, cols, n, mask, list, cap, counts, par, host_count);
}

// The program by value, in the launch's parameters (no upload before the launch): FPROG_MAX
// bytes laid out as filter_eval's three arrays, `o_consts` and `o_cols` bytes in.
struct FProgV {
    u64 w[FPROG_MAX / 8];
};
extern "C" __global__ void filter_eval_v(const __grid_constant__ FProgV P, u32 nins, u32 o_consts, u32 o_cols, u32 n,
                                         u32* __restrict__ mask, u32* __restrict__ list, u32 cap, u32* counts,
                                         u32 par, u32* host_count) {
    const unsigned char* b = (const unsigned char*)&P;
    filter_eval_body((const FIns*)b, nins, (const u64*)(b + o_consts), (const FCol*)(b + o_cols), n, mask, list, cap,
                     counts, par, host_count);
}
