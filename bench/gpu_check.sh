#!/usr/bin/env bash
# The device check of issue "CUDA", in two steps, since the GPU machine has no Rust toolchain and
# no network (the `device` tool of ../.library lends one to some sessions):
#
#   here:  bench/gpu_check.sh prepare [DIR]   builds the CUDA crates' binaries and monogen in
#                                              release, strips them and copies them, with the
#                                              real models and their references, into DIR
#                                              (default gpu-check/, which .git/info/exclude
#                                              should list), to carry to the GPU machine
#   there: bench/gpu_check.sh run [DIR]       parity of the CUDA crates against transformers'
#                                              references, then the TinyLlama-shaped crate's
#                                              speed on synthetic bf16 weights against the floor,
#                                              the cuBLAS peak and PyTorch + transformers
#                                              (bench/gpu_check.py), in a few minutes
#
# With the device tool: run(command="bench/gpu_check.sh run", carry=["gpu-check"], timeout_s=540).
# The figures land in $OUT/gpu_check_*.json; record them in bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
step=${1:-}
dir=${2:-gpu-check}
crates="stories260k-cuda-f32 stories260k-cuda-bf16 aidreams260k-cuda-f32 tinyllama-bench-cuda-bf16"

case "$step" in
prepare)
    models=${MONOGEN_MODELS:-../shared/models}
    rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/models"
    cargo build --release --quiet -p monogen
    cp target/release/monogen "$dir/bin/"
    for c in $crates; do
        CARGO_PROFILE_RELEASE_STRIP=symbols cargo build --release --quiet \
            --manifest-path "generated/$c/Cargo.toml" --target-dir target/gpu-check-build
        cp "target/gpu-check-build/release/$c" "$dir/bin/"
    done
    strip "$dir/bin/monogen" 2>/dev/null || true
    for m in stories260k aidreams260k; do
        mkdir -p "$dir/models/$m"
        cp "$models/$m"/*.json "$models/$m/model.safetensors" "$dir/models/$m/"
        cp -r "$models/$m/reference" "$dir/models/$m/"
    done
    du -sh "$dir"
    ;;
run)
    nvidia-smi -L || true
    # cudarc finds the driver by its usual names; NVRTC may be the toolkit's of another major
    # version than the crates name, so its library is linked under the plain name.
    nvrtc=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt -name 'libnvrtc.so*' \
        ! -name '*builtins*' ! -name '*alt*' 2>/dev/null | sort | tail -n 1 || true)
    if [ -n "$nvrtc" ]; then
        mkdir -p /tmp/nvrtc && ln -sf "$nvrtc" /tmp/nvrtc/libnvrtc.so
        export LD_LIBRARY_PATH="/tmp/nvrtc:$(dirname "$nvrtc"):${LD_LIBRARY_PATH:-}"
        echo "NVRTC: $nvrtc"
    else
        echo "no libnvrtc found: the crates cannot compile their kernels" >&2
    fi
    export PYTHONUNBUFFERED=1
    status=0
    python3 bench/gpu_check.py parity "$dir/bin" "$dir/models" || status=1
    synth=/tmp/tinyllama-bench-cuda-bf16
    [ -d "$synth" ] || MONOGEN_ROOT=$PWD "$dir/bin/monogen" synth-weights \
        workloads/tinyllama-bench-cuda-bf16.toml --out "$synth"
    python3 bench/gpu_check.py speed "$dir/bin/tinyllama-bench-cuda-bf16" "$synth" || status=1
    exit $status
    ;;
*)
    sed -n '2,19p' "$0" >&2
    exit 2
    ;;
esac
