#!/usr/bin/env bash
# The main job: builds Release and writes a report to out/: the machine's measured limits, the
# kernel benchmark summary (throughput as a fraction of those limits, ratio to the baseline run
# in the same process) and the simulator's pipeline report for the int8 MLA decode kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/setup.sh
ditops_ensure_packages

cmake --preset release
# Only what the report needs (the tests are tools/test.sh's job): keeps the demo under 5 minutes.
cmake --build --preset release --target ditops-info ditops_bench ditops-sim bench-summary
build=build/release
mkdir -p out

"$build/tools/ditops-info" | tee out/machine.txt

echo "== benchmarks (roofline, RMSNorm, RoPE, attention, MLA decode) =="
# Attention: the quick FLUX shapes only (S=2048, 24 heads, D=128, causal and not, 2 threads;
# flash fp32, flash_bf16 and the reference baseline; int8 chunk 1/2/4 beside flash fp32):
# about 15 s on 2 cores.
attention='attention_(flash_(f32|bf16)/shape:[01]|int8/shape:0)/threads:2/'
"$build/bench/ditops_bench" --benchmark_filter="peak|triad|rms_norm|rope|$attention|mla_decode/" \
  --benchmark_min_time=0.2 --benchmark_out=out/bench.json --benchmark_out_format=json \
  | tee out/bench.txt

if [ -x "$build/tools/ditops-sim" ]; then
  echo "== simulator: int8 MLA decode, batch 1, kv 2048 =="
  for chunk in 1 2 4; do
    "$build/tools/ditops-sim" mla --batch 1 --kv 2048 --chunk "$chunk" \
      --trace "out/sim_chunk${chunk}_trace.json" --csv "out/sim_chunk${chunk}.csv" \
      --svg "out/sim_chunk${chunk}.svg" | tee "out/sim_chunk${chunk}.txt"
  done
  "$build/tools/ditops-sim" sweep | tee out/sim_sweep.txt
  echo "== CPU MLA decode chunk 1/2/4 beside the simulator's (128 heads, kv 2048, 2 threads) =="
  "$build/bench/ditops_bench" --benchmark_filter='mla_grid/b:(1|4|16)/kv:2048/h:128/chunk:[124]/threads:2/' \
    --benchmark_repetitions=3 --benchmark_out=out/mla_chunks.json --benchmark_out_format=json \
    > out/mla_chunks.txt
  "$build/tools/ditops-sim" sweep --batch 1,4,16 --kv 2048 --cpu out/mla_chunks.json \
    | tee out/sim_vs_cpu.txt
fi

{
  echo "# ditops demo report"
  echo
  echo '```'
  cat out/machine.txt
  echo '```'
  echo
  echo "## Kernels (fraction of this machine's measured limits; ratio to the same-run baseline)"
  echo
  "$build/tools/bench-summary" out/bench.json
  echo
  echo "## Attention (GFLOP/s; fraction of the FP32 FMA peak, BF16 peak for flash_bf16, VNNI peak for int8)"
  echo
  "$build/tools/bench-summary" out/bench.json | grep -E '^\|( *-| *[Kk]ernel| *[Bb]enchmark| *[Nn]ame)|attention' || true
  if [ -f out/sim_sweep.txt ]; then
    echo
    echo "## Simulator: int8 MLA decode, batch 1, kv 2048"
    for chunk in 1 2 4; do
      echo
      echo "### chunk $chunk (trace out/sim_chunk${chunk}_trace.json, Gantt out/sim_chunk${chunk}.svg)"
      echo '```'
      cat "out/sim_chunk${chunk}.txt"
      echo '```'
    done
    echo
    echo "## Simulator sweep"
    echo '```'
    cat out/sim_sweep.txt
    echo '```'
    echo
    echo "## MLA decode chunk ratios: CPU kernel (median of 3) beside the simulator"
    echo '```'
    cat out/sim_vs_cpu.txt
    echo '```'
  fi
} > out/summary.md
echo "tools/demo.sh: report written to out/summary.md"
