"""GEMM rates of the operand types a batch pass could use, through torch's cuBLASLt paths.

For 1024 queries x 768 dims against 131,072 rows (one batch tile) and 1M rows: f16 x f16 -> f16,
FP8 e4m3 x e4m3 -> f16 (`torch._scaled_mm`, unit scales) and int8 x int8 -> int32
(`torch._int_mm`). Random operands; mean of 20 timed runs after 3 warm-ups, CUDA events.
Run on the GPU machine: `python3 gemm_probe.py`.
"""

import torch

M, K = 1024, 768


def timed(fn, it=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(it):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / it


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for n in (131072, 1000000):
        a16 = torch.randn(M, K, device=dev, dtype=torch.float16)
        b16 = torch.randn(n, K, device=dev, dtype=torch.float16)
        a8 = torch.randint(-127, 128, (M, K), device=dev, dtype=torch.int8)
        b8 = torch.randint(-127, 128, (n, K), device=dev, dtype=torch.int8)
        t16 = timed(lambda: a16 @ b16.T)
        ti8 = timed(lambda: torch._int_mm(a8, b8.T))
        try:
            af = a16.to(torch.float8_e4m3fn)
            bf = b16.to(torch.float8_e4m3fn)
            one = torch.tensor(1.0, device=dev)
            tf8 = timed(lambda: torch._scaled_mm(af, bf.T, scale_a=one, scale_b=one, out_dtype=torch.float16))
        except (RuntimeError, AttributeError) as e:
            tf8 = float("nan")
            print("fp8:", e)
        tflop = 2 * M * n * K / 1e12
        print(
            f"M={M} N={n} K={K}: f16 {t16:.3f} ms ({tflop / t16 * 1e3:.0f} TF/s)  "
            f"int8->i32 {ti8:.3f} ms ({tflop / ti8 * 1e3:.0f} TOP/s)  "
            f"fp8->f16 {tf8:.3f} ms ({tflop / tf8 * 1e3:.0f} TF/s)"
        )
        del a16, b16, a8, b8
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
