#!/usr/bin/env bash
# The current benchmark figures: runs a fixed set of benchmarks per operator family into
# Google Benchmark JSON under bench/results/<machine>/, and renders bench/RESULTS.md from the
# template bench/RESULTS.in.md and that JSON.
#
# Usage: tools/bench-results.sh run BUILD_DIR [FAMILY...]
#        tools/bench-results.sh render [BUILD_DIR]
#
#   run      runs each family's benchmarks (the C++ families, or the ones named; `python`
#            names every python-* family) from BUILD_DIR (built: bench/ditops_bench,
#            bench/ditops_linear_bench, tools/ditops-info; for the python-* families the
#            Python module in BUILD_DIR/python, run by ${DITOPS_VENV:-build/venv}/bin/python) and
#            writes bench/results/<machine>/<family>.json and machine.txt. <machine> is a slug
#            for the CPU and the dispatched ISA (zen4-avx512, zen3-avx2, xeon-emr-avx512),
#            from /proc/cpuinfo and ditops-info (DITOPS_ISA=avx2 gives zen4-avx2). A family's
#            file is replaced only when its run succeeds. Every benchmark runs 3 repetitions
#            and reports their aggregates: the tables show the medians. Run it on an idle
#            machine: about 20 minutes on 2 Zen 4 cores. The families and their filters are
#            declared below (bench/README.md lists them too). The python-* families run
#            bench/python scripts with --json (bench/python/bench_json.py writes the same JSON
#            shape: one entry per repetition and their aggregates) at small sizes: about 6
#            minutes in all on 2 idle Zen 1 cores.
#   render   writes bench/RESULTS.md from bench/RESULTS.in.md: each line
#              <!-- table: MACHINE/FAMILY.json [filter=REGEX] [baseline=ARG:VALUE] [time] -->
#            becomes bench-summary's table of that file's rows (BUILD_DIR/tools/bench-summary,
#            default build/release) and a line naming its source (file, date, commit, load
#            average, repetitions); the line <!-- machines -->
#            becomes a table of the machines in bench/results/. REGEX has no spaces.
set -euo pipefail

usage() {
  echo "usage: tools/bench-results.sh run BUILD_DIR [FAMILY...] | render [BUILD_DIR]" >&2
  exit 2
}

# family: binary (under BUILD_DIR/bench), benchmark filter, options beyond the repetitions.
families=(limits rowwise guidance attention int8 sparse mla linear)
declare -A binary filter options
binary[limits]=ditops_bench
filter[limits]='^BM_(peak_|memory_triad)'
# RMSNorm, add_rms_norm, LayerNorm + AdaLN and RoPE on their FLUX-sized shapes and the fused q/k
# norm + RoPE against the two calls, on 2 threads (the whole run fits about 20 minutes).
binary[rowwise]=ditops_bench
filter[rowwise]='^BM_((add_)?rms_norm<.*>/shape:[01]/threads:2/|layer_norm_scale_shift<(float|bf16)>/shape:0/threads:2/|rope<.*>/seq:0/interleaved:[01]/threads:2/.*/head_first:0/|norm_rope<.*>/shape:0/threads:2/)'
options[rowwise]=--benchmark_min_time=0.2
binary[guidance]=ditops_bench
filter[guidance]='^BM_cfg_combine<'
options[guidance]=--benchmark_min_time=0.2
# flash fp32 and flash_bf16 on every shape, the reference backend on FLUX S = 2048 and decode.
binary[attention]=ditops_bench
filter[attention]='^attention_flash_(f32|bf16)/'
binary[int8]=ditops_bench
filter[int8]='^attention_int8/'
# Aligned rows, and dense / RainFusion 0.75 / block-sparse on buffers as allocators place them.
binary[sparse]=ditops_bench
filter[sparse]='^sparse_attention/'
# The quick decode set, the grid at chunk 2, and chunk 1 / 4 at kv 2048 on 2 threads.
binary[mla]=ditops_bench
filter[mla]='^mla_decode/|^mla_grid/.*/chunk:2/|^mla_grid/b:(1|4|16)/kv:2048/h:(16|128)/chunk:[14]/threads:2/'
options[mla]=--benchmark_min_time=0.2
# Every kind aligned; ditops' W8A8 and W8A8_DYNAMIC on 2 threads on misaligned x and y too;
# the bf16 FLOAT layers beside oneDNN's bf16 matmul.
binary[linear]=ditops_linear_bench
filter[linear]='^BM_linear/.*/misaligned:0/|^BM_linear/shape:[0-4]/kind:[01]/threads:2/misaligned:1/|^BM_linear_bf16/|^BM_dnnl_bf16/'
# Repetitions in random order: the tables are ratios to oneDNN's rows, and a shared host's noise
# drifts over the minutes a family takes (oneDNN's FLUX row 1,252-1,732 ms in four repetitions).
options[linear]=--benchmark_enable_random_interleaving=true
repetitions=(--benchmark_repetitions=3 --benchmark_report_aggregates_only=true)

# python-* family: script (under bench/python) and its options; {build} stands for BUILD_DIR.
# Sized to keep the run short on 2 cores: few tokens at the models' real widths, one or a few runs.
python_families=(python-overhead python-linear python-layernorm python-sparse python-ring
  python-models python-quant python-cache python-pipeline)
declare -A script
script[python-overhead]='overhead.py --calls 5000 --repetitions 7'
script[python-linear]='linear_speed.py --tokens 256 --runs 3'
script[python-layernorm]='layernorm_scale_shift.py --runs 5 --shape flux --memory reused'
script[python-sparse]='sparse_speed.py --frames 3 --runs 3'
script[python-ring]='ring_speed.py --seq 2048 --processes 2 --runs 3'
script[python-models]='model_speed.py --size small --runs 1 --tools {build}/tools'
script[python-quant]='online_quant.py --size small --runs 1'
script[python-cache]='cache_loop.py --model wan --runs 1'
script[python-pipeline]='pipeline_speed.py --size tiny --height 128 --width 128 --text 64 --steps 4 --runs 1'
python=${DITOPS_VENV:-build/venv}/bin/python

[ $# -ge 1 ] || usage
command=$1
shift
# Paths are taken relative to the caller's directory, then used from the repository root
# (relative there, so that no absolute path lands in the JSON).
build=""
if [ $# -ge 1 ]; then
  build=$(realpath -m -- "$1")
  shift
fi
cd "$(dirname "$0")/.."
if [ -n "$build" ]; then build=$(realpath -m --relative-to=. -- "$build"); fi

# A short name for this CPU: the microarchitecture from /proc/cpuinfo's vendor, family and
# model, then the ISA ditops dispatches to (ditops-info's output in $1).
machine_slug() {
  local vendor family model cpu isa
  vendor=$(awk -F': *' '/^vendor_id/ {print $2; exit}' /proc/cpuinfo)
  family=$(awk -F': *' '/^cpu family/ {print $2; exit}' /proc/cpuinfo)
  model=$(awk -F': *' '/^model[[:space:]]*:/ {print $2; exit}' /proc/cpuinfo)
  case "$vendor/$family" in
    AuthenticAMD/23) cpu=$([ "$model" -ge 48 ] && echo zen2 || echo zen) ;;
    AuthenticAMD/25)
      if [ "$model" -ge 16 ] && [ "$model" -le 31 ] || [ "$model" -ge 96 ] && [ "$model" -le 127 ] ||
        [ "$model" -ge 160 ] && [ "$model" -le 175 ]; then
        cpu=zen4
      else
        cpu=zen3
      fi
      ;;
    AuthenticAMD/26) cpu=zen5 ;;
    GenuineIntel/6)
      case "$model" in
        85) cpu=xeon-skx ;;
        106 | 108) cpu=xeon-icx ;;
        143) cpu=xeon-spr ;;
        207) cpu=xeon-emr ;;
        173 | 174) cpu=xeon-gnr ;;
        *) cpu=intel-m$model ;;
      esac
      ;;
    *) cpu=$(echo "${vendor:-cpu}" | tr '[:upper:]' '[:lower:]')-f${family:-0}m${model:-0} ;;
  esac
  isa=$(awk '/isa \(dispatch\)/ {print $3; exit}' <<<"$1")
  echo "$cpu-${isa:-unknown}"
}

# The commit the build in $build was configured from (its CMakeCache's source directory: this
# checkout or another), and how many source files there differ from it (python/ too where $1 is
# "python").
tree_state() {
  local source changed paths=(ops include bench cmake CMakeLists.txt tools)
  [ "${1:-}" != python ] || paths+=(python)
  source=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null)
  [ -n "$source" ] || source=.
  changed=$(git -C "$source" status --porcelain -- "${paths[@]}" ':!bench/results' ':!bench/*.md' |
    wc -l)
  if [ "$changed" -eq 0 ]; then
    echo "commit $(git -C "$source" rev-parse --short HEAD)"
  else
    echo "commit $(git -C "$source" rev-parse --short HEAD) + $changed uncommitted source files"
  fi
}

run() {
  [ -n "$build" ] || usage
  local requested=("$@") selected=() name cxx=0 py=0
  [ ${#requested[@]} -gt 0 ] || requested=("${families[@]}")
  for name in "${requested[@]}"; do
    if [ "$name" = python ]; then
      selected+=("${python_families[@]}")
    elif [ -n "${binary[$name]:-}" ] || [ -n "${script[$name]:-}" ]; then
      selected+=("$name")
    else
      echo "tools/bench-results.sh: unknown family '$name' (families: ${families[*]}" \
        "${python_families[*]}; python: every python-* family)" >&2
      exit 2
    fi
  done
  for name in "${selected[@]}"; do
    if [ -n "${script[$name]:-}" ]; then py=1; else cxx=1; fi
  done
  local tools=(tools/ditops-info)
  [ "$cxx" -eq 0 ] || tools+=(bench/ditops_bench bench/ditops_linear_bench)
  for tool in "${tools[@]}"; do
    [ -x "$build/$tool" ] || {
      echo "tools/bench-results.sh: $build/$tool is not built (cmake --build $build first)" >&2
      exit 2
    }
  done
  if [ "$py" -eq 1 ]; then
    compgen -G "$build/python/ditops/_ditops*.so" >/dev/null || {
      echo "tools/bench-results.sh: $build has no Python module (configure it with" \
        "-DDITOPS_PYTHON=ON and build it)" >&2
      exit 2
    }
    "$python" -c 'import torch, diffusers, transformers' 2>/dev/null || {
      echo "tools/bench-results.sh: $python cannot import torch, diffusers and transformers" \
        "(tools/setup.sh installs them; DITOPS_VENV names another virtual environment)" >&2
      exit 2
    }
  fi
  local info slug dir state python_state
  info=$("$build/tools/ditops-info")
  slug=$(machine_slug "$info")
  dir=bench/results/$slug
  state=$(tree_state)
  python_state=$(tree_state python)
  mkdir -p "$dir"
  if [ "$cxx" -eq 1 ]; then
    echo "tools/bench-results.sh: machine $slug, $state; writing $dir/"
  else
    echo "tools/bench-results.sh: machine $slug, $python_state; writing $dir/"
  fi
  # Earlier runs' lines for the families not run now.
  local lines=() rerun
  rerun=$(
    IFS='|'
    echo "${selected[*]}"
  )
  if [ -f "$dir/machine.txt" ]; then
    mapfile -t lines < <(grep -E '^  [a-z0-9-]+: ' "$dir/machine.txt" | grep -v -E "^  ($rerun): " || true)
  fi
  local start load status=0 script_args
  for name in "${selected[@]}"; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "== $name (load average $load) =="
    start=$SECONDS
    if [ -n "${script[$name]:-}" ]; then
      read -ra script_args <<<"${script[$name]//\{build\}/$build}"
      if ! PYTHONPATH=$build/python "$python" "bench/python/${script_args[0]}" "${script_args[@]:1}" \
        --json "$dir/$name.json.tmp"; then
        echo "tools/bench-results.sh: family $name failed; $dir/$name.json left as it was" >&2
        rm -f -- "$dir/$name.json.tmp"
        status=1
        continue
      fi
      mv -- "$dir/$name.json.tmp" "$dir/$name.json"
      lines+=("  $name: $(date -u +%F), $python_state, ${script_args[*]}; $((SECONDS - start)) s, load average $load at its start")
      continue
    fi
    if ! "$build/bench/${binary[$name]}" --benchmark_filter="${filter[$name]}" "${repetitions[@]}" \
      ${options[$name]:+"${options[$name]}"} --benchmark_out="$dir/$name.json.tmp" --benchmark_out_format=json; then
      echo "tools/bench-results.sh: family $name failed; $dir/$name.json left as it was" >&2
      rm -f -- "$dir/$name.json.tmp"
      status=1
      continue
    fi
    # No host name in the repository; the executable by its path in the build tree; strict JSON:
    # a non-finite field (the coefficient of variation of a counter that is 0 in every
    # repetition) left out, or null where it ends its entry.
    sed -i -E -e 's/^(\s*"host_name": )"[^"]*"/\1""/' \
      -e '/^\s*"[^"]*": -?(nan|NaN|inf|Infinity),$/d' \
      -e 's/^(\s*"[^"]*": )-?(nan|NaN|inf|Infinity)$/\1null/' \
      -e "s#^(\\s*\"executable\": )\"[^\"]*/(bench/[^/\"]+)\"#\\1\"\\2\"#" "$dir/$name.json.tmp"
    mv -- "$dir/$name.json.tmp" "$dir/$name.json"
    lines+=("  $name: $(date -u +%F), $state, ${binary[$name]} --benchmark_filter='${filter[$name]}' ${repetitions[*]}${options[$name]:+ ${options[$name]}}; $((SECONDS - start)) s, load average $load at its start")
  done
  {
    echo "# written by tools/bench-results.sh run; the runs behind $dir/*.json"
    echo "machine: $slug"
    echo "cpu: $(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo)" \
      "($(awk -F': *' '/^vendor_id/ {v=$2} /^cpu family/ {f=$2} /^model[[:space:]]*:/ {m=$2}
        END {print v " family " f " model " m}' /proc/cpuinfo)), $(nproc) logical CPUs"
    echo "families:"
    printf '%s\n' "${lines[@]}" | sort -t: -k1,1
    echo "ditops-info:"
    echo "$info"
  } >"$dir/machine.txt"
  echo "tools/bench-results.sh: $dir/machine.txt written in $SECONDS s"
  return "$status"
}

# machine.txt's field `key:` (first line), or its family line.
field() { sed -n "s/^$2: //p" "$1" | head -n 1; }

render() {
  [ -n "$build" ] || build=build/release
  local summary=$build/tools/bench-summary template=bench/RESULTS.in.md out=bench/RESULTS.md
  [ -x "$summary" ] || {
    echo "tools/bench-results.sh: $summary is not built (cmake --build $build --target bench-summary)" >&2
    exit 2
  }
  local usage_text
  usage_text=$("$summary" 2>&1 || true)
  [[ $usage_text == *--filter* ]] || {
    echo "tools/bench-results.sh: $summary has no --filter: rebuild it (cmake --build $build --target bench-summary)" >&2
    exit 2
  }
  local tmp line spec json words word args table info lineno=0
  tmp=$(mktemp)
  trap 'rm -f -- "$tmp"' EXIT
  {
    echo "<!-- Generated by tools/bench-results.sh render from bench/RESULTS.in.md and" \
      "bench/results/*/*.json: edit those, not this file. -->"
    while IFS= read -r line || [ -n "$line" ]; do
      lineno=$((lineno + 1))
      if [[ $line == '<!-- machines -->' ]]; then
        echo "| machine | CPU | dispatch, kernel variant | cores | measured |"
        echo "|---|---|---|---:|---|"
        for info in bench/results/*/machine.txt; do
          [ -f "$info" ] || continue
          local dates
          dates=$(sed -n 's/^  [a-z0-9-]*: \([0-9-]*\), \(commit [^,]*\),.*/\1, \2/p' "$info" | sort -u |
            paste -sd ';' | sed 's/;/; /g')
          echo "| \`$(field "$info" machine)\` | $(field "$info" cpu) |" \
            "$(awk '/isa \(dispatch\)/ {print $3; exit}' "$info"), $(awk '/kernel variant/ {print $3; exit}' "$info") |" \
            "$(awk '/physical cores/ {print $3; exit}' "$info") | $dates |"
        done
      elif [[ $line =~ ^'<!-- table: '([^[:space:]]+)(.*)' -->'$ ]]; then
        spec=${BASH_REMATCH[1]}
        json=bench/results/$spec
        read -ra words <<<"${BASH_REMATCH[2]}"
        args=()
        local shown=""
        for word in "${words[@]}"; do
          case "$word" in
            filter=*) args+=(--filter "${word#filter=}") shown+=", rows matching \`${word#filter=}\`" ;;
            baseline=*) args+=(--baseline "${word#baseline=}") shown+=", baseline ${word#baseline=}" ;;
            time) args+=(--time) ;;
            *)
              echo "tools/bench-results.sh: $template:$lineno: unknown table option '$word'" >&2
              exit 1
              ;;
          esac
        done
        [ -f "$json" ] || {
          echo "tools/bench-results.sh: $template:$lineno: $json not found (tools/bench-results.sh run)" >&2
          exit 1
        }
        table=$("$summary" "${args[@]}" "$json")
        [ "$(wc -l <<<"$table")" -gt 2 ] || {
          echo "tools/bench-results.sh: $template:$lineno: no rows of $json match" >&2
          exit 1
        }
        echo "$table"
        local family=${spec#*/}
        family=${family%.json}
        info=$(dirname "$json")/machine.txt
        echo
        local when runs
        # Date, commit and the load average at the family's start, from its machine.txt line.
        when=$(sed -n "s/^  $family: \\([0-9-]*\\), \\(commit [^,]*\\),.*; [0-9]* s, \\(load average [0-9.]*\\) at its start\$/\\1, \\2, \\3/p" \
          "$info" 2>/dev/null)
        # The repetitions the JSON's first entry reports: its rows are their medians.
        runs=$(grep -m 1 -o -E '"repetitions": [0-9]+' "$json" | grep -o -E '[0-9]+$' || true)
        case "$runs" in
          '' | 1) runs="one run" ;;
          *) runs="medians of $runs runs" ;;
        esac
        echo "Source: [$spec](results/$spec)$shown; ${when:-its run not in machine.txt}; $runs."
      else
        echo "$line"
      fi
    done <"$template"
  } >"$tmp"
  mv -- "$tmp" "$out"
  trap - EXIT
  echo "tools/bench-results.sh: $out written ($(wc -l <"$out") lines)"
}

case "$command" in
  run) run "$@" ;;
  render)
    [ $# -eq 0 ] || usage
    render
    ;;
  -h | --help) usage ;;
  *) usage ;;
esac
