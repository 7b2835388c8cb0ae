#!/usr/bin/env bash
# LLaMA decoding at the shapes of the benchmark workloads: the crates monogen generates against
# candle-transformers' Llama (CPU, from crates.io), on the same synthetic weights
# (`monogen synth-weights`) and the same 128 prompt ids, each side run as its own process,
# alternating run by run, at 1 and 2 threads. Prints prefill tok/s (128 tokens), decode tok/s
# (64 tokens), load time and the time from process start to the first token, the cores each
# side kept busy, and the ratios; then this machine's read bandwidth over a buffer of each
# model's weight bytes and the FMA peaks (bench/peaks), from which the decode floor (weight
# bytes read per token / bandwidth) and the prefill's share of the FMA peak are computed.
#
# Each shape runs in each weight dtype of DTYPES (default "f32 bf16": the workloads
# workloads/<shape>-bench-cpu-<dtype>.toml; candle computes in the same dtype, and for int8 runs
# its quantized Llama on a Q8_0 GGUF of the same weights: int8 with a scale per 32 values, as
# the int8 crates hold them; "bf16-amx" is the bf16 workload whose products run on AMX tiles,
# workloads/<shape>-bench-cpu-bf16-amx.toml, on a CPU that has them, and "bf16-bf16act-amx" the
# one whose products also round their activations to bfloat16; "bf16-bf16act" rounds them too,
# for AVX512_BF16 dot products on a CPU without AMX, and its prefill's share of the FMA peak can
# pass 100%: a `vdpbf16ps` lane does two multiply-adds). The 1-thread
# crates are the same workloads generated with `threads = 1` under target/. Everything is built
# and written under target/bench-llama (TinyLlama's weights take 4.4 GB in f32, 2.2 in bf16).
#
# Usage: [DTYPES="f32 bf16 int8 bf16-bf16act bf16-amx bf16-bf16act-amx"] bench/llama_vs_candle.sh [ROUNDS] [SHAPE...]
#        (SHAPE: stories15m stories110m tinyllama)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
shift || true
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(stories15m stories110m tinyllama)
work="$PWD/target/bench-llama"
mkdir -p "$work"
monogen() { cargo run -q --release -p monogen -- "$@"; }

export CARGO_TARGET_DIR="$PWD/target/bench-candle"
cargo build -q --release --manifest-path bench/llama_vs_candle/Cargo.toml
harness="$CARGO_TARGET_DIR/release/llama-vs-candle"
CARGO_TARGET_DIR="$PWD/target/bench-peaks" cargo build -q --release --manifest-path bench/peaks/Cargo.toml
peaks="$PWD/target/bench-peaks/release/monogen-peaks"

# On a CPU without AVX-512 (an AMD EPYC of Zen 3, say) the committed crates refuse to start:
# both crates are then generated under target/ for x86-64-v3 (the features of
# workloads/stories260k-cpu-f32.toml) without a hardware class, so that the highest declared
# priority chooses their kernels.
v3=()
grep -qw avx512f /proc/cpuinfo || v3=(-e "s/^cpu_features = .*/$(grep '^cpu_features' workloads/stories260k-cpu-f32.toml)/")

for shape in "${shapes[@]}"; do
  for dtype in ${DTYPES:-f32 bf16}; do
    workload="workloads/$shape-bench-cpu-$dtype.toml"
    name="$shape-bench-cpu-$dtype"
    monogen check "$workload" >/dev/null || {
        echo "generated/$name is stale: run monogen build first" >&2
        exit 1
    }
    model="$work/models/$shape-$dtype"
    [ -f "$model/model.safetensors" ] || monogen synth-weights "$workload" --out "$model" >/dev/null
    # The same workload with one thread, generated under target/.
    sed -e "s/^name = \"$name\"/name = \"$name-t1\"/" -e 's/^threads = .*/threads = 1/' \
        -e '/^hardware = /d' "${v3[@]}" "$workload" > "$work/$name-t1.toml"
    monogen build "$work/$name-t1.toml" --out "$work/crates/$name-t1" >/dev/null
    two="$name"
    crates=("generated/$name" "$work/crates/$name-t1")
    if [ ${#v3[@]} -gt 0 ]; then
        two="$name-v3"
        sed -e "s/^name = \"$name\"/name = \"$two\"/" -e '/^hardware = /d' "${v3[@]}" "$workload" \
            > "$work/$two.toml"
        monogen build "$work/$two.toml" --out "$work/crates/$two" >/dev/null
        crates=("$work/crates/$two" "$work/crates/$name-t1")
    fi
    for crate in "${crates[@]}"; do
        CARGO_TARGET_DIR="$work/target" cargo build -q --release --manifest-path "$crate/Cargo.toml"
    done
    # The builds leave tens of megabytes of dirty pages, which the kernel writes back about
    # 30 s later, in the middle of the timed runs: the 2-thread time to first token at
    # stories15M measured 34-38 ms without this flush and 28 ms with it (bench/RESULTS.md).
    sync
    # Then the weights leave the page cache, so that the first run below, our crate's warm-up
    # run, reads them back: a crate asks for huge pages before it maps the file
    # (templates/runtime/tensor_file.rs), so they come back as 2 MiB folios, which both sides
    # then map. Left as another reader cached them (in 4 KiB pages, say, as `synth-weights`
    # writes them), a stories110M bf16 decode with a third of its file in huge folios ran 1.17x
    # slower than from huge pages (bench/RESULTS.md).
    evict() { python3 -c 'import os, sys; os.posix_fadvise(os.open(sys.argv[1], os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)' "$1"; }
    evict "$model/model.safetensors"
    echo "== $shape ($(du -h "$model/model.safetensors" | cut -f1) of $dtype weights)"
    # An int8 crate races candle's quantized Llama on the same weights in Q8_0, a file converted
    # ahead of time: ours reads the model directory it writes with `--save-model`, whose matrices
    # are int8 already (both crates quantize alike; the thread count only splits the work).
    q8=()
    q8_t1=()
    if [ "$dtype" = int8 ]; then
        "$work/target/release/$two" --model "$model" --save-model "$model-saved"
        sync
        evict "$model-saved/model.safetensors"
        q8=(q8 "$model-saved")
    elif grep -q PACKED_LAYOUT "${crates[0]}/src/kernels/mod.rs"; then
        # A crate whose matmul packs its matrices reads them packed from the directory it
        # writes with `--save-model` (and so does the 1-thread crate, below), rather than packing
        # them at every start: at stories110M in bf16-bf16act that took 104 of 161 ms to the
        # first token (bench/RESULTS.md).
        "$work/target/release/$two" --model "$model" --save-model "$model-packed"
        sync
        evict "$model-packed/model.safetensors"
        q8=(saved "$model-packed")
    fi
    # The 1-thread crate reads the same directory, but a packed one only where its matmul reads
    # the same layout (it names no hardware class, so the declared priorities choose its
    # kernels); else the checkpoint.
    layout() { grep -h 'PACKED_LAYOUT: &str' "$1/src/kernels/mod.rs" | cut -d'"' -f2; }
    if [ "$dtype" = int8 ] || [ "$(layout "${crates[0]}")" = "$(layout "$work/crates/$name-t1")" ]; then
        q8_t1=("${q8[@]}")
    fi
    "$harness" compare "$work/target/release/$name-t1" "$model" 1 "$rounds" "${q8_t1[@]}" | tee "$work/compare-1.txt"
    "$harness" compare "$work/target/release/$two" "$model" 2 "$rounds" "${q8[@]}" | tee "$work/compare-2.txt"
    # Weight bytes read per decoded token, as the crate holds them, and the operations of a
    # prefill token (bench/weight_bytes.py says how each is counted).
    # An int8 crate whose matmul packs its weights holds their scales in binary16.
    held=$dtype
    if [ "$dtype" = int8 ] && layout "${crates[0]}" | grep -q '^matmul/q8-avx512-vnni-packed-threads'; then
        held=int8-packed
    fi
    read -r bytes ops < <(python3 bench/weight_bytes.py "$model" "$held")
    "$peaks" --rounds 3 "$bytes" | tee "$work/peaks.txt" | sed 's/^/  peaks: /'
    echo "  weight bytes read per decoded token: $bytes"
    # Each decode figure against its floor (those bytes over the read bandwidth of the same
    # run, at the same thread count), and the prefill against the peak of its instructions.
    python3 - "$work/compare-1.txt" "$work/compare-2.txt" "$work/peaks.txt" "$bytes" "$ops" "$dtype" <<'PY'
import re, sys
one, two, peaks_file, size, ops, dtype = sys.argv[1:]
size, ops = int(size), int(ops)
def ours(path, what):
    for line in open(path):
        if line.strip().startswith(what):
            return float(re.search(r"monogen\s+([0-9.]+)", line).group(1))
peaks = {}
for line in open(peaks_file):
    fields = line.split()
    peaks[(fields[0], fields[-2])] = float(fields[-1])
for threads, path in (("1t", one), ("2t", two)):
    bandwidth = peaks[("read_gb_s", threads)]
    floor = size / (bandwidth * 1e9) * 1e3
    measured = 1e3 / ours(path, "decode tok/s")
    # Without AVX-512, against the AVX2 FMA peak (an int8 crate's products then run on
    # vpmaddubsw, whose peak is not measured: its GOP/s are put beside the FMA's GFLOP/s).
    avx512 = ("fma_avx512_gflop_s", threads) in peaks
    if dtype == "int8" and ("vnni_avx512_gop_s", threads) in peaks:
        peak_name, unit = "vnni_avx512_gop_s", "GOP/s of the VNNI"
    else:
        peak_name = "fma_avx512_gflop_s" if avx512 else "fma_avx2_gflop_s"
        unit = "GFLOP/s of the FMA" if avx512 else "GFLOP/s of the AVX2 FMA"
    rate = ours(path, "prefill tok/s") * ops / 1e9
    # A crate on AMX tiles: its prefill against the tiles' peak as well.
    amx = ""
    if dtype.endswith("-amx") and ("amx_bf16_gflop_s", threads) in peaks:
        amx_peak = peaks[("amx_bf16_gflop_s", threads)]
        amx = f", {100 * rate / amx_peak:.0f}% of the {amx_peak:.0f} GFLOP/s of the AMX bf16 peak"
    print(
        f"  {threads}: decode floor {floor:.2f} ms ({size / 1e6:.0f} MB at {bandwidth:.2f} GB/s), measured {measured:.2f} ms,"
        f" floor / measured {floor / measured:.2f}; prefill {rate:.0f} {unit.split(' of')[0]}, {100 * rate / peaks[(peak_name, threads)]:.0f}% of the"
        f" {peaks[(peak_name, threads)]:.0f} {unit} peak{amx}"
    )
PY
  done
done
