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
import ctypes
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("KALOS_NVRTC_DIR", os.path.join(ROOT, "target", "nvrtc-pip"))
ARCHS = ["sm_80", "sm_90"]
DIMS = [1, 3, 128, 768, 8192]
DTYPES = [0, 1, 2]   # f32, f16, bf16
METRICS = [0, 1, 2]  # ip, cosine, l2


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
    os.makedirs(CACHE, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", CACHE, "nvidia-cuda-nvrtc"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print("SKIP: could not install nvidia-cuda-nvrtc with pip (%s):\n%s" % (" ".join(cmd), (r.stderr or r.stdout)[-2000:]))
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
    failures = 0
    count = 0
    for path in kernels:
        src = open(path, "rb").read()
        name = os.path.basename(path).encode()
        for arch in ARCHS:
            for dim in DIMS:
                for dt in DTYPES:
                    for mt in METRICS:
                        opts = ["--gpu-architecture=%s" % arch, "-DDIM=%d" % dim, "-DDTYPE=%d" % dt,
                                "-DMETRIC=%d" % mt, "--std=c++17", "-default-device"]
                        prog = ctypes.c_void_p()
                        rc = nv.nvrtcCreateProgram(ctypes.byref(prog), src, name, 0, None, None)
                        if rc != 0:
                            print("FAIL create", path, rc)
                            return 1
                        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
                        rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
                        size = ctypes.c_size_t()
                        nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                        log = ctypes.create_string_buffer(size.value + 1)
                        nv.nvrtcGetProgramLog(prog, log)
                        cub = ctypes.c_size_t()
                        if rc == 0:
                            rc2 = nv.nvrtcGetCUBINSize(prog, ctypes.byref(cub))
                            if rc2 != 0 or cub.value == 0:
                                rc = 1000 + rc2
                        count += 1
                        if rc != 0:
                            failures += 1
                            print("FAIL %s %s: rc=%d\n%s" % (os.path.basename(path), " ".join(opts), rc, log.value.decode(errors="replace")))
                        elif log.value.strip() and count == 1:
                            print("log (%s):\n%s" % (" ".join(opts), log.value.decode(errors="replace")))
                        nv.nvrtcDestroyProgram(ctypes.byref(prog))
    print("%d compiles, %d failures (%d kernels x %s x dims %s x dtypes x metrics)" % (count, failures, len(kernels), ARCHS, DIMS))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
