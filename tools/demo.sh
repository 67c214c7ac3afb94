#!/usr/bin/env bash
# The main job: builds Release (build/demo: only the kernel variants this CPU runs) and writes a
# report to out/: the machine's measured limits, the kernel benchmark summary (throughput as a
# fraction of those limits, ratio to the baseline run in the same process) and the simulator's
# pipeline report for the int8 MLA decode kernel.
#
# Usage: tools/demo.sh [--full | --tiny] [--pipelines] [--out DIR] [--build-dir DIR]
#   (no flag)        the quick report: 5-8 minutes on 2 cores from a fresh clone, build
#                    included. 2 threads; RMSNorm, fused add+RMSNorm and RoPE on one shape each,
#                    attention on the FLUX S=2048 shapes (int8 at chunk 2), the MLA decode subset,
#                    and the CPU MLA chunk ratios at kv 2048, batch 1/4/16, beside the simulator's;
#                    with PyTorch and ONNX Runtime installed (tools/bench-peers.sh), attention
#                    beside them at S=2048 (about a minute more). The DiT block example
#                    (examples/dit_block) at a small shape (CFG fused and two passes, two
#                    instances, each attention and linear kind) and at FLUX's (one CFG block).
#                    Where build/venv has torch, diffusers and transformers (--pipelines, or
#                    tools/test.sh, installed them): the Python module too, and a whole FLUX
#                    pipeline at full width (two blocks) at 256 x 256, 4 steps, diffusers' default
#                    beside ditops.diffusers.optimize, with its PNGs (about two minutes more).
#   --pipelines      first installs torch, diffusers and transformers from PyPI into build/venv
#                    (the tests' venv: about 6 GB and several minutes the first time), so that the
#                    pipeline section runs.
#   --full           the long grids as well (about 5 more minutes): RMSNorm and RoPE on every
#                    shape and dtype at 1 and 2 threads, int8 attention at chunk 1/2/4 on three
#                    FLUX shapes, and the CPU chunk ratios over the simulator sweep's whole grid;
#                    the FLUX and Wan pipelines at the bench's default size (FLUX 512 x 512, Wan
#                    9 frames at 320 x 192), 20 steps (about 10 minutes more).
#   --tiny           one small case per family with minimal times: checks that the pipeline
#                    works (tests/tools/demo_pipeline_test.sh runs it); its figures mean little.
#   --out DIR        where the report goes (default: out/ in the repository). DIR must be new,
#                    empty, or an earlier demo run's (it holds the file .ditops-demo); the demo
#                    replaces only its own files there. Anything else is refused with status 2.
#   --build-dir DIR  a build tree already built (ditops-info, ditops_bench, ditops-sim and
#                    bench-summary; build/release after tools/test.sh): no package install, no
#                    configure, no build.
#
# The sections (build, machine, benchmarks, sparse, simulator, cpu-vs-simulator, peers, pipeline,
# summary) run one after the other, each with its log in DIR/logs/. A section that fails is
# recorded at the end of DIR/summary.md (its name, exit status and the last lines of its log), the
# sections after it still run where they can, and the script exits 1 at the end if any failed.
set -euo pipefail

usage() {
  echo "usage: tools/demo.sh [--full | --tiny] [--pipelines] [--out DIR] [--build-dir DIR]" >&2
  exit 2
}

mode=quick
out=""
build=""
pipelines=0
while [ $# -gt 0 ]; do
  case "$1" in
    --pipelines) pipelines=1 ;;
    --full | --tiny)
      [ "$mode" = quick ] || { echo "tools/demo.sh: --full and --tiny exclude each other" >&2; usage; }
      mode=${1#--}
      ;;
    --out | --build-dir)
      [ $# -ge 2 ] || usage
      # Relative to where the user ran the script (it works from the repository root).
      if [ "$1" = --out ]; then out=$(realpath -m -- "$2"); else build=$(realpath -m -- "$2"); fi
      shift
      ;;
    -h | --help) usage ;;
    *)
      echo "tools/demo.sh: unknown argument '$1'" >&2
      usage
      ;;
  esac
  shift
done
cd "$(dirname "$0")/.."
source tools/setup.sh

# The output directory must be the demo's: out/ in the repository (ignored by git), or one that
# is new, empty or marked by an earlier run. Only the demo's own files in it are replaced.
marker=.ditops-demo
if [ -z "$out" ]; then
  out=$PWD/out
elif [ -e "$out" ] && [ ! -d "$out" ]; then
  echo "tools/demo.sh: --out $out exists and is not a directory; refusing to write there" >&2
  exit 2
elif [ -d "$out" ] && [ ! -f "$out/$marker" ] && [ -n "$(ls -A -- "$out")" ]; then
  echo "tools/demo.sh: --out $out is not empty and not a demo output directory (no $marker);" \
    "refusing to write there" >&2
  exit 2
fi
mkdir -p "$out/logs"
echo "tools/demo.sh output directory: each run replaces the demo's own files here" >"$out/$marker"
rm -f -- "$out"/{machine.txt,bench.json,bench.txt,mla_chunks.json,mla_chunks.txt} \
  "$out"/{sparse.json,sparse.txt,sparse.md,linear.json,linear.txt,linear.md} \
  "$out"/{dit.json,dit.txt,dit.md} "$out"/{pipeline.json,pipeline.md,{flux,wan}_{outputs,time}.png} \
  "$out"/{sim_sweep.txt,sim_vs_cpu.txt,summary.md} "$out"/sim_chunk[124]* "$out"/logs/*.{log,notes}

# What each mode measures. Attention on 2 threads: flash fp32 and flash_bf16 on FLUX S=2048
# (causal and not) beside the reference baseline, int8 beside flash fp32. The simulator sweeps
# sim_grid (its whole default grid but in --tiny). CPU MLA chunk ratios: 128 heads, 2 threads,
# median of 3 repetitions (ditops-sim takes the median), over cpu_grid.
attention='attention_(flash_(f32|bf16)/shape:[01]/threads:2/|int8/shape:0/threads:2/chunk:[02]/)'
sparse_filter='sparse_attention/threads:2/case:([0-3]|5|7|8|9|10)/'
case "$mode" in
  quick)
    norm='BM_(rms_norm<(float|bf16)>|add_rms_norm<float>)/shape:0/threads:2/'
    rope='BM_rope<(float|bf16)>/seq:0/interleaved:[01]/threads:2/'
    bench_filter="peak|triad|$norm|$rope|$attention|mla_decode/"
    min_time=0.1
    sim_grid=()
    cpu_grid=(--batch "1,4,16" --kv 2048)
    chunk_filter='mla_grid/b:(1|4|16)/kv:2048/h:128/chunk:[124]/threads:2/'
    linear_filter='BM_linear/shape:[01]/kind:[0-4]/threads:2/'
    dit_small=(--hidden 768 --heads 12 --image 1024 --text 128 --frames 4 --steps 2 --instances 2 --compare)
    dit_flux=(--cfg fused --warmup 0 --steps 1)
    pipeline=(--model flux --size tiny --steps 4 --text 64 --runs 1)
    ;;
  full)
    attention='attention_(flash_(f32|bf16)/shape:[01]|int8/shape:[0-2])/threads:2/'
    bench_filter="peak|triad|rms_norm|rope|$attention|mla_decode/"
    min_time=0.2
    sim_grid=()
    cpu_grid=()
    chunk_filter='mla_grid/b:[0-9]+/kv:[0-9]+/h:128/chunk:[124]/threads:2/'
    linear_filter='BM_linear/'
    dit_small=(--hidden 768 --heads 12 --image 1024 --text 128 --frames 4 --steps 3 --instances 2 --compare)
    dit_flux=(--cfg both --warmup 1 --steps 1 --instances 2)
    pipeline=(--steps 20 --runs 1)
    ;;
  tiny)
    bench_filter='peak|triad|BM_rms_norm<float>/shape:1/threads:2/eigen:./misaligned:0|BM_rope<float>/seq:0/interleaved:0/threads:2/|attention_flash_f32/shape:5/threads:2/|mla_decode/b:1/kv:2048/h:16/chunk:2/threads:2/splits:0'
    min_time=0.01
    sim_grid=(--batch 1 --kv 512)
    cpu_grid=(--batch 1 --kv 512 --heads 16)
    linear_filter='BM_linear/shape:1/kind:[03]/threads:2/'
    chunk_filter='mla_grid/b:1/kv:512/h:16/chunk:[124]/threads:2/'
    dit_small=(--hidden 256 --heads 4 --image 256 --text 64 --steps 1)
    dit_flux=()
    pipeline=(--narrow --size tiny --height 64 --width 64 --frames 5 --steps 2 --text 16 --runs 1)
    ;;
esac

# Whether build/venv can run the pipeline section (torch, diffusers, transformers).
pipeline_venv_ready() {
  "$ditops_venv/bin/python" -c 'import torch, diffusers, transformers, tokenizers, PIL' \
    2>/dev/null
}

# build/demo: Release with the kernel variants this CPU dispatches to and scalar (a third of the
# kernels a portable build compiles, or less), no test suite; the Python module where the
# venv can run the pipelines.
section_build() {
  ditops_ensure_packages demo
  [ "$pipelines" = 0 ] || ditops_ensure_venv
  local python_module=()
  if pipeline_venv_ready; then
    python_module=(-DDITOPS_PYTHON=ON "-DPython_EXECUTABLE=$(cd "$ditops_venv" && pwd)/bin/python")
  fi
  cmake --preset demo "${python_module[@]}"
  # One target for the tools: make builds the targets named on its command line one after the
  # other, but the dependencies of one target in parallel.
  cmake --build --preset demo --target demo-tools
  if [ ${#python_module[@]} -gt 0 ]; then cmake --build --preset demo --target _ditops; fi
}

section_check_build() {
  for tool in tools/ditops-info bench/ditops_bench bench/ditops_linear_bench tools/ditops-sim \
    tools/bench-summary examples/dit_block/dit_block; do
    if [ ! -x "$build/$tool" ]; then
      echo "$build/$tool is not built (cmake --build $build first)" >&2
      return 1
    fi
  done
}

section_machine() {
  "$build/tools/ditops-info" | tee "$out/machine.txt"
}

# W8A8 linear layers beside Eigen's fp32 GEMM and oneDNN's int8 matmul (where the build found
# libdnnl-dev): FLUX's hidden size 3072 over 4608 image tokens and over 16 rows.
section_linear() {
  "$build/bench/ditops_linear_bench" --benchmark_filter="$linear_filter" \
    --benchmark_min_time="$min_time" --benchmark_out="$out/linear.json" \
    --benchmark_out_format=json >"$out/linear.txt"
  "$build/tools/bench-summary" "$out/linear.json" | tee "$out/linear.md"
  if grep -q 'built without oneDNN' "$out/linear.json"; then
    note "oneDNN's int8 matmul not timed: the build found no oneDNN (Debian: libdnnl-dev)"
  fi
}

section_benchmarks() {
  "$build/bench/ditops_bench" --benchmark_filter="$bench_filter" --benchmark_min_time="$min_time" \
    --benchmark_out="$out/bench.json" --benchmark_out_format=json | tee "$out/bench.txt"
}

# RainFusion and block-sparse attention beside dense flash (Wan-like 12 x 16 x 32 + 128 text,
# 4 heads, D 128), 2 threads: sparsity 0.5 / 0.75 / 0.9 (spatial), temporal and textural at
# 0.75 / stride 2, classified heads, 25 % of the blocks, and the classification alone.
section_sparse() {
  "$build/bench/ditops_bench" --benchmark_filter="$sparse_filter" --benchmark_min_time="$min_time" \
    --benchmark_out="$out/sparse.json" --benchmark_out_format=json >"$out/sparse.txt"
  "$build/tools/bench-summary" "$out/sparse.json" | tee "$out/sparse.md"
}

# The DiT block example (examples/dit_block): the double-stream block (the CLI's default), W8A8
# linears and flash fp32 attention on 2 threads, a small shape (a 4-frame latent, so RainFusion
# has frames to skip) with CFG fused beside two passes, one instance of one core beside two, and
# every attention and linear kind (--compare), then FLUX's (hidden 3072, 24 heads, 4608 image +
# 512 text tokens; about 18 s per CFG block on 2 idle AVX2 cores, so the quick demo times one fused
# block without a warm-up, and --full adds the warm-up, two passes and two instances: about 3
# minutes). dit.json holds the runs' reports, dit.md their text.
section_dit() {
  local tool=$build/examples/dit_block/dit_block
  "$tool" "${dit_small[@]}" --threads 2 --json >"$out/dit_small.json" 2>"$out/dit.txt"
  local runs
  runs=$(cat "$out/dit_small.json")
  if [ ${#dit_flux[@]} -gt 0 ]; then
    echo >>"$out/dit.txt"
    "$tool" --hidden 3072 --heads 24 --image 4608 --text 512 "${dit_flux[@]}" --threads 2 \
      --json >"$out/dit_flux.json" 2>>"$out/dit.txt"
    runs="$runs,$(cat "$out/dit_flux.json")"
  fi
  echo "{\"runs\": [$runs]}" >"$out/dit.json"
  rm -f -- "$out/dit_small.json" "$out/dit_flux.json"
  code_block "$out/dit.txt" | tee "$out/dit.md"
}

section_simulator() {
  for chunk in 1 2 4; do
    "$build/tools/ditops-sim" mla --batch 1 --kv 2048 --chunk "$chunk" \
      --trace "$out/sim_chunk${chunk}_trace.json" --csv "$out/sim_chunk${chunk}.csv" \
      --svg "$out/sim_chunk${chunk}.svg" | tee "$out/sim_chunk${chunk}.txt"
  done
  "$build/tools/ditops-sim" sweep "${sim_grid[@]}" | tee "$out/sim_sweep.txt"
}

section_cpu_vs_simulator() {
  "$build/bench/ditops_bench" --benchmark_filter="$chunk_filter" --benchmark_repetitions=3 \
    --benchmark_out="$out/mla_chunks.json" --benchmark_out_format=json >"$out/mla_chunks.txt"
  "$build/tools/ditops-sim" sweep "${cpu_grid[@]}" --cpu "$out/mla_chunks.json" |
    tee "$out/sim_vs_cpu.txt"
}

# ditops attention beside PyTorch and ONNX Runtime (tools/bench-peers.sh) when their virtual
# environment exists; installing them needs PyPI, so the demo only says how.
peers_venv=${DITOPS_PEERS_VENV:-$ditops_venv}
section_peers() {
  if ! "$peers_venv/bin/python" -c 'import torch, onnxruntime, onnx, numpy' 2>/dev/null; then
    # Headed like bench-peers.sh's report, whose first two lines the summary drops.
    printf '# Peers\n\n%s %s %s\n' \
      "PyTorch and ONNX Runtime are not installed in $peers_venv: run" \
      "tools/bench-peers.sh once (it installs them from PyPI into that virtual environment)" \
      "to compare." \
      >"$out/peers.md"
    note "skipped: PyTorch and ONNX Runtime are not installed in $peers_venv" \
      "(tools/bench-peers.sh installs them from PyPI)"
    return 0
  fi
  DITOPS_PEERS_VENV=$peers_venv tools/bench-peers.sh --quick --out "$out" --build-dir "$build"
}

# Whole diffusers pipelines (bench/python/pipeline_speed.py: FLUX and Wan assembled from random
# components, the transformers at full width with two blocks; --tiny at the test suite's small
# widths), diffusers' default beside ditops.diffusers.optimize: pipeline.md (times, where they go,
# drift), pipeline.json, and per model MODEL_outputs.png (the outputs side by side) and
# MODEL_time.png (where the time goes). Runs where the build tree has the Python module and the
# venv has torch, diffusers and transformers; otherwise the summary says why not.
section_pipeline() {
  local python=$ditops_venv/bin/python
  if ! pipeline_venv_ready; then
    note "skipped: torch, diffusers and transformers are not installed in $ditops_venv" \
      "(tools/demo.sh --pipelines installs them)"
    return 0
  fi
  if ! compgen -G "$build/python/ditops/_ditops*.so" >/dev/null; then
    note "skipped: $build has no Python module (configure it with -DDITOPS_PYTHON=ON," \
      "as tools/demo.sh and tools/test.sh do where the venv has torch)"
    return 0
  fi
  PYTHONPATH=$build/python DITOPS_TOOLS_DIR=$build/tools OMP_NUM_THREADS=2 \
    "$python" bench/python/pipeline_speed.py "${pipeline[@]}" --threads 2 \
    --json "$out/pipeline.json" --png "$out" --markdown "$out/pipeline.md"
}

# A line for the summary's list of sections: what part of this section did not run, and why.
note() {
  echo "$*" | tee -a "$out/logs/$current_section.notes"
}

# `file` in a code block, or a note where its section did not write it.
code_block() {
  echo '```'
  if [ -f "$1" ]; then cat "$1"; else echo "(not written: see the failed sections at the end)"; fi
  echo '```'
}

section_summary() {
  {
    echo "# ditops demo report ($mode)"
    echo
    code_block "$out/machine.txt"
    if [ -f "$out/bench.json" ]; then
      local table
      table=$("$build/tools/bench-summary" "$out/bench.json")
      echo
      echo "## Kernels (fraction of this machine's measured limits; ratio to the same-run baseline)"
      echo
      echo "$table"
      echo
      echo "## Attention (GFLOP/s; fraction of the FP32 FMA peak, BF16 peak for flash_bf16," \
        "int8 peak for int8: vpdpbusd with AVX512-VNNI, else vpmaddubsw)"
      echo
      grep -E '^\|( *-| *benchmark)|attention' <<<"$table" || true
    fi
    echo
    if [ "$mode" != tiny ]; then
      echo "## RainFusion sparse attention beside dense flash (Wan-like 12 x 16 x 32 + 128 text," \
        "4 heads, D 128, 2 threads; 'vs baseline' = dense time / this time)"
      echo
      if [ -f "$out/sparse.md" ]; then cat "$out/sparse.md"; else echo "(not run)"; fi
      echo
    fi
    echo "## W8A8 linear layers beside Eigen f32 and oneDNN int8 (GOP/s; frac_int8 of the int8" \
      "dot-product peak, frac_peak of the FP32 FMA peak)"
    echo
    if [ -f "$out/linear.md" ]; then cat "$out/linear.md"; else echo "(not run)"; fi
    echo
    echo "## DiT block example (examples/dit_block; seconds per CFG block, operator shares)"
    echo
    if [ -f "$out/dit.md" ]; then cat "$out/dit.md"; else echo "(not run)"; fi
    echo
    echo "## Simulator: int8 MLA decode, batch 1, kv 2048"
    for chunk in 1 2 4; do
      echo
      echo "### chunk $chunk (trace sim_chunk${chunk}_trace.json, Gantt sim_chunk${chunk}.svg)"
      code_block "$out/sim_chunk${chunk}.txt"
    done
    echo
    echo "## Simulator sweep"
    code_block "$out/sim_sweep.txt"
    echo
    echo "## MLA decode chunk ratios: CPU kernel (median of 3) beside the simulator"
    code_block "$out/sim_vs_cpu.txt"
    echo
    echo "## Attention beside PyTorch SDPA and ONNX Runtime (tools/bench-peers.sh --quick)"
    echo
    if [ -f "$out/peers.md" ]; then sed '1,2d' "$out/peers.md"; else echo "(not run)"; fi
    echo
    echo "## Whole diffusers pipelines: diffusers' default beside ditops.diffusers.optimize" \
      "(pipeline.md; outputs side by side: MODEL_outputs.png; where the time goes: MODEL_time.png)"
    echo
    if [ -f "$out/pipeline.md" ]; then cat "$out/pipeline.md"; else echo "(not run)"; fi
  } >"$out/summary.md"
}

# Runs one section in a subshell with errexit and pipefail in force (a function called as the
# condition of `if` or `||` would run with errexit off), its output on the terminal and in its
# log; records its time and, where it fails, its name and status.
failed=()
sections=()
run_section() {
  local name=$1 start=$SECONDS status
  shift
  echo "== $name =="
  current_section=$name
  set +e
  (
    set -euo pipefail
    "$@"
  ) 2>&1 | tee "$out/logs/$name.log"
  status=${PIPESTATUS[0]}
  set -e
  local line="$name: $((SECONDS - start)) s"
  [ "$status" -eq 0 ] || line+=", failed (exit status $status)"
  if [ -f "$out/logs/$name.notes" ]; then
    line+="; $(paste -sd ';' "$out/logs/$name.notes" | sed 's/;/; /g')"
  fi
  sections+=("$line")
  if [ "$status" -ne 0 ]; then
    failed+=("$name $status")
    echo "tools/demo.sh: section '$name' failed with exit status $status" \
      "(log: $out/logs/$name.log)" >&2
  fi
}

if [ -n "$build" ]; then
  run_section build section_check_build
else
  build=$PWD/build/demo
  run_section build section_build
fi
run_section machine section_machine
run_section benchmarks section_benchmarks
if [ "$mode" = tiny ]; then
  sections+=("sparse: not in --tiny")
else
  run_section sparse section_sparse
fi
run_section linear section_linear
run_section dit section_dit
run_section simulator section_simulator
run_section cpu-vs-simulator section_cpu_vs_simulator
if [ "$mode" = tiny ]; then
  sections+=("peers: not in --tiny")
else
  run_section peers section_peers
fi
run_section pipeline section_pipeline
run_section summary section_summary

{
  echo
  echo "## Sections (time; what did not run, and why)"
  echo
  printf -- '- %s\n' "${sections[@]}"
  if [ ${#failed[@]} -gt 0 ]; then
    echo
    echo "## Sections that failed"
    for entry in "${failed[@]}"; do
      name=${entry% *}
      echo
      echo "### $name: exit status ${entry##* } (last lines of logs/$name.log)"
      echo '```'
      tail -n 20 "$out/logs/$name.log"
      echo '```'
    done
  fi
} >>"$out/summary.md"

if [ ${#failed[@]} -gt 0 ]; then
  echo "tools/demo.sh: report written to $out/summary.md; failed sections: ${failed[*]%% *}" >&2
  exit 1
fi
echo "tools/demo.sh: report written to $out/summary.md in $SECONDS s"
