#!/usr/bin/env python3
"""CI check: compile every kernel in kernels/*.cu with NVRTC from PyPI, for sm_80 and sm_90.

Needs no GPU. Installs the `nvidia-cuda-nvrtc` wheel into a cache folder (target/nvrtc-pip by
default, or $KALOS_NVRTC_DIR), loads libnvrtc.so with ctypes and compiles each kernel for every
specialisation the engine can ask for (a spread of dims, each dtype, each metric) to a CUBIN
with the same options the engine uses (src/engine/cuda.rs: nvrtc_options).

Exit status: 0 every compile succeeded; 1 a compile failed (the log is printed);
77 SKIP, only when the pip package cannot be installed (no network / no pip): the message says so.
Run: python3 tests/gpu/nvrtc_check.py      (the Rust test tests/nvrtc_compile.rs runs it too)
"""
import concurrent.futures
import ctypes
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("KALOS_NVRTC_DIR", os.path.join(ROOT, "target", "nvrtc-pip"))
ARCHS = ["sm_80", "sm_90"]
DIMS = [3, 128, 768, 8192]     # GS=1 path, f32 registers, f16 packed half2, query in shared memory
DTYPES = [0, 1, 2]   # f32, f16, bf16
METRICS = [0, 2]     # ip (cosine compiles the same code), l2


def find_lib():
    pats = [os.path.join(CACHE, "nvidia", "**", "libnvrtc.so*")]
    for p in pats:
        libs = sorted(l for l in glob.glob(p, recursive=True) if "builtins" not in l and "alt" not in os.path.basename(l))
        if libs:
            return libs[0]
    return None


def install():
    lib = find_lib()
    if lib:
        return lib
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", CACHE, "nvidia-cuda-nvrtc"]
    try:
        os.makedirs(CACHE, exist_ok=True)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        err = None if r.returncode == 0 else (r.stderr or r.stdout)[-2000:]
    except Exception as e:  # no pip, no network, unwritable cache, timeout
        err = repr(e)
    if err is not None:
        print("SKIP: could not install nvidia-cuda-nvrtc with pip (%s):\n%s" % (" ".join(cmd), err))
        sys.exit(77)
    lib = find_lib()
    if not lib:
        print("FAIL: nvidia-cuda-nvrtc installed but libnvrtc.so not found under", CACHE)
        sys.exit(1)
    return lib


def main():
    lib = install()
    nv = ctypes.CDLL(lib)
    major, minor = ctypes.c_int(), ctypes.c_int()
    nv.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    print("NVRTC %d.%d from %s" % (major.value, minor.value, lib))
    kernels = sorted(glob.glob(os.path.join(ROOT, "kernels", "*.cu")))
    if not kernels:
        print("FAIL: no kernels found")
        return 1
    jobs = [(path, arch, dim, dt, mt) for path in kernels for arch in ARCHS for dim in DIMS for dt in DTYPES for mt in METRICS]
    srcs = {p: open(p, "rb").read() for p in kernels}

    def compile_one(job):
        path, arch, dim, dt, mt = job
        opts = ["--gpu-architecture=%s" % arch, "-DDIM=%d" % dim, "-DDTYPE=%d" % dt,
                "-DMETRIC=%d" % mt, "--std=c++17", "-default-device"]
        prog = ctypes.c_void_p()
        rc = nv.nvrtcCreateProgram(ctypes.byref(prog), srcs[path], os.path.basename(path).encode(), 0, None, None)
        if rc != 0:
            return "create failed rc=%d" % rc, opts
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value + 1)
        nv.nvrtcGetProgramLog(prog, log)
        cub = ctypes.c_size_t()
        if rc == 0 and (nv.nvrtcGetCUBINSize(prog, ctypes.byref(cub)) != 0 or cub.value == 0):
            rc = 1000
        nv.nvrtcDestroyProgram(ctypes.byref(prog))
        return (None if rc == 0 else "rc=%d\n%s" % (rc, log.value.decode(errors="replace"))), opts

    workers = max(1, min(4, os.cpu_count() or 1))
    failures = 0
    count = 0
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        for (path, *_), (err, opts) in zip(jobs, ex.map(compile_one, jobs)):
            count += 1
            if err:
                failures += 1
                print("FAIL %s %s: %s" % (os.path.basename(path), " ".join(opts), err))
    print("%d compiles, %d failures (%d kernels x %s x dims %s x dtypes x metrics)" % (count, failures, len(kernels), ARCHS, DIMS))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
