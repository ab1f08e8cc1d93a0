#!/usr/bin/env python3
"""Compiles kernels/src/gpu/kernels.cu to PTX with NVRTC, as the GPU code
does at run time (launch.rs: the same options and build defines), on a
machine without a GPU: NVRTC needs none. A change to the kernels can be
checked to compile here before device time is spent on it, and two
sources compared entry by entry (same instructions, in any order, after
registers and labels are renamed: a restructuring that moved code but
changed no operation).

    python3 -m pip install nvidia-cuda-nvrtc
    python3 bench/nvrtc_compile.py kernels/src/gpu/kernels.cu
    python3 bench/nvrtc_compile.py NEW.cu --against OLD.cu

Builds: the default one and the long-window one (`Build::LongWindows`).
Exit status 1 when a source does not compile.
"""

import argparse
import ctypes
import glob
import os
import re
import sys

BUILDS = {
    "default": [],
    "long": ["-DROLL_CAP=3456", "-DROLL_TILE=2048", "-DROLL_THREADS=512", "-DROLL_MINB=2"],
}


def nvrtc():
    import nvidia  # the pip package's namespace

    for base in nvidia.__path__:
        libs = sorted(glob.glob(os.path.join(base, "**", "libnvrtc.so*"), recursive=True))
        libs = [p for p in libs if "builtins" not in p]
        if libs:
            return ctypes.CDLL(libs[0])
    sys.exit("libnvrtc not found: python3 -m pip install nvidia-cuda-nvrtc")


def compile_ptx(lib, path, defines, arch):
    src = open(path, "rb").read()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"kernels.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"] + [d.encode() for d in defines]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        print(f"{path} {defines}: does not compile\n{log.value.decode()}")
        return None
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def entries(ptx):
    """Entry and function bodies by name, registers and labels renamed."""
    out = {}
    for part in re.split(r"(?=\.visible \.entry|\.func)", ptx):
        m = re.match(r"\.(?:visible \.entry|func)\s+(?:\([^)]*\)\s*)?(\w+)", part)
        if m:
            body = re.sub(r"\$L__\w+", "L", re.sub(r"%\w+\d+", "R", part))
            out[m.group(1)] = body.splitlines()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("source")
    ap.add_argument("--against", help="an older source to compare entry by entry")
    ap.add_argument("--arch", default="sm_90")
    a = ap.parse_args()
    lib = nvrtc()
    failed = False
    for build, defines in BUILDS.items():
        new = compile_ptx(lib, a.source, defines, a.arch)
        if new is None:
            failed = True
            continue
        print(f"{build}: compiles ({len(new)} bytes of PTX)")
        if a.against:
            old = compile_ptx(lib, a.against, defines, a.arch)
            if old is None:
                continue
            e_new, e_old = entries(new), entries(old)
            for name in sorted(set(e_new) | set(e_old)):
                x, y = e_old.get(name), e_new.get(name)
                if x == y:
                    continue
                if x is None or y is None:
                    verdict = "only in one"
                elif sorted(x) == sorted(y):
                    verdict = "same instructions, other order"
                else:
                    verdict = f"differs ({len(x)} -> {len(y)} lines)"
                print(f"  {name}: {verdict}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
