#!/usr/bin/env python3
"""Compiles CUDA C files with NVRTC for GPU architectures, without a GPU: what CI runs over every
kernel file of the committed CUDA crates (tests/tests/cuda.rs), so that a kernel that does not
compile fails CI rather than a deployment. Where ptxas is found too, the PTX is assembled for
each architecture, as the driver does at load: inline PTX (a tensor-core instruction) that NVRTC
passes through unchecked is checked there.

NVRTC comes from the CUDA toolkit or from PyPI's nvidia-cuda-nvrtc-cu12 wheel (found through
the `nvidia.cuda_nvrtc` package, LD_LIBRARY_PATH, or CUDA_HOME); ptxas from the toolkit or from
PyPI's nvidia-cuda-nvcc-cu12.

usage: nvrtc_compile.py --arch sm_80 --arch sm_90 FILE.cu...
Exits 0 when every file compiles for every architecture, 1 when one does not (its log printed),
2 when NVRTC cannot be found.
"""
import argparse
import ctypes
import glob
import os
import subprocess
import sys
import tempfile


def find_nvrtc():
    candidates = []
    try:
        import nvidia.cuda_nvrtc as pkg

        for root in list(getattr(pkg, "__path__", [])):
            candidates += sorted(glob.glob(os.path.join(root, "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates += sorted(glob.glob(os.path.join(os.environ[var], "lib64", "libnvrtc.so*")))
    candidates += ["libnvrtc.so.12", "libnvrtc.so"]
    for path in candidates:
        if "builtins" in path or ".alt." in path:
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def find_ptxas():
    candidates = []
    try:
        import nvidia.cuda_nvcc as pkg

        candidates += [os.path.join(root, "bin", "ptxas") for root in getattr(pkg, "__path__", [])]
    except ImportError:
        pass
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "ptxas"))
    candidates.append("/usr/local/cuda/bin/ptxas")
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def compile_file(nvrtc, path, arch, ptxas=None):
    source = open(path, "rb").read()
    prog = ctypes.c_void_p()
    name = os.path.basename(path).encode()
    status = nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, name, 0, None, None)
    if status != 0:
        return f"nvrtcCreateProgram failed with status {status}"
    options = [f"--gpu-architecture={arch}".encode()]
    array = (ctypes.c_char_p * len(options))(*options)
    status = nvrtc.nvrtcCompileProgram(prog, len(options), array)
    log = ""
    if status != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buffer = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, buffer)
        log = buffer.value.decode(errors="replace") or f"status {status}"
    else:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
        if size.value <= 1:
            log = "compiled to empty PTX"
        elif ptxas:
            ptx = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetPTX(prog, ptx)
            with tempfile.TemporaryDirectory() as tmp:
                source = os.path.join(tmp, "kernel.ptx")
                with open(source, "wb") as f:
                    f.write(ptx.value)
                out = subprocess.run([ptxas, f"-arch={arch}", source, "-o", os.path.join(tmp, "kernel.cubin")],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    log = f"ptxas: {out.stderr or out.stdout}"
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return log


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", action="append", required=True, help="e.g. sm_90; may repeat")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    nvrtc = find_nvrtc()
    if nvrtc is None:
        print("NVRTC not found: pip install nvidia-cuda-nvrtc-cu12, or set CUDA_HOME", file=sys.stderr)
        return 2
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    ptxas = find_ptxas()
    failed = 0
    for path in args.files:
        for arch in args.arch:
            log = compile_file(nvrtc, path, arch, ptxas)
            if log:
                failed += 1
                print(f"FAIL {path} ({arch}):\n{log}")
            else:
                print(f"ok {path} ({arch})")
    assembled = "assembled by ptxas" if ptxas else "not assembled (no ptxas)"
    print(f"NVRTC {major.value}.{minor.value}, {assembled}: {len(args.files)} files x {len(args.arch)} architectures, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
