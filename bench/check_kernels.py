#!/usr/bin/env python3
"""Compile kernels/src/gpu/kernels.cu as braid does at run time (NVRTC), then
run ptxas on the PTX to print registers, spills and shared memory per kernel:
compile errors and spills show up here, with no GPU and no device time.

Setup, once (pip wheels; no CUDA install needed):
    python3 -m pip install --target /tmp/cuda-tools \
        nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12
Usage:
    python3 bench/check_kernels.py [--tools /tmp/cuda-tools] [--arch 90] [-D NAME=VALUE] [KERNEL ...]
With KERNEL names, only their ptxas lines are printed.
"""
import argparse
import ctypes
import pathlib
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--tools", default="/tmp/cuda-tools")
ap.add_argument("--arch", default="90", help="compute capability, e.g. 90 for H100/H200")
ap.add_argument("-D", dest="defines", action="append", default=[],
                help="a macro for NVRTC, e.g. -D ROLL_CAP=3456 (the long-window module)")
ap.add_argument("kernels", nargs="*")
args = ap.parse_args()

tools = pathlib.Path(args.tools) / "nvidia"
src_path = pathlib.Path(__file__).resolve().parent.parent / "kernels/src/gpu/kernels.cu"
lib = ctypes.CDLL(str(next((tools / "cuda_nvrtc/lib").glob("libnvrtc.so*"))))
prog = ctypes.c_void_p()
if lib.nvrtcCreateProgram(ctypes.byref(prog), src_path.read_bytes(), b"kernels.cu", 0, None, None):
    sys.exit("nvrtcCreateProgram failed")
# The options launch.rs passes (virtual architecture: ptxas takes the PTX).
opts = [f"--gpu-architecture=compute_{args.arch}".encode(), b"-std=c++17"]
opts += [f"-D{d}".encode() for d in args.defines]
rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
size = ctypes.c_size_t()
lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
log = ctypes.create_string_buffer(size.value)
lib.nvrtcGetProgramLog(prog, log)
if log.value.strip():
    print(log.value.decode())
if rc:
    sys.exit("NVRTC failed")
lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
ptx = ctypes.create_string_buffer(size.value)
lib.nvrtcGetPTX(prog, ptx)
with tempfile.TemporaryDirectory() as d:
    p = pathlib.Path(d) / "kernels.ptx"
    p.write_bytes(ptx.value)
    r = subprocess.run(
        [str(tools / "cuda_nvcc/bin/ptxas"), f"-arch=sm_{args.arch}", "-v", str(p), "-o", str(p.with_suffix(".cubin"))],
        capture_output=True, text=True)
out = (r.stdout + r.stderr).splitlines()
if args.kernels:
    keep, show = [], False
    for line in out:
        if "Compiling entry function" in line:
            show = any(f"'{k}'" in line for k in args.kernels)
        if show:
            keep.append(line)
    out = keep
print("\n".join(out))
sys.exit(r.returncode)
