// Kalos GPU kernels: table and query preparation: rows scattered into the device table, batch
// queries checked and converted to the storage type.

#include "common.cuh"

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
