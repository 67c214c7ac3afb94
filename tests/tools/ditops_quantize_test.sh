#!/usr/bin/env bash
# ditops-quantize's command line: --help, a dynamic quantization of a tiny hand-written
# safetensors file (the pair is written with msmodelslim's names), a rank suffix, and bad
# arguments (exit 2, one line on stderr) or unreadable files (exit 1, the file named).
# Usage: ditops_quantize_test.sh DITOPS_QUANTIZE WORK_DIR   (ctest passes them)
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 DITOPS_QUANTIZE WORK_DIR" >&2; exit 2; }
tool=$1 work=$2
rm -rf "$work"
mkdir -p "$work/out"

source "$(dirname "$0")/checks.sh"

# expect_status NAME STATUS ARGS...: the exit status, and exactly one line on stderr if not 0.
expect_status() {
  local name=$1 expected=$2 status=0
  shift 2
  "$tool" "$@" >"$work/stdout" 2>"$work/stderr" || status=$?
  [ "$status" -eq "$expected" ] || fail "$name: exit status $status, expected $expected"
  if [ "$expected" -ne 0 ]; then
    [ "$(wc -l <"$work/stderr")" -eq 1 ] ||
      fail "$name: stderr is not one line: $(cat "$work/stderr")"
  fi
}

# A layer l of weight [2, 2] = [[1, -2], [0.5, 4]] in F32: the 8-byte little-endian header
# length, the header, the data.
header='{"l.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}'
{
  printf "\\x$(printf '%02x' ${#header})\\x00\\x00\\x00\\x00\\x00\\x00\\x00"
  printf '%s' "$header"
  printf '\x00\x00\x80\x3f\x00\x00\x00\xc0\x00\x00\x00\x3f\x00\x00\x80\x40'
} >"$work/model.safetensors"

expect_status help 0 --help
grep -q "usage: ditops-quantize" "$work/stdout" || fail "--help prints no usage"

expect_status dynamic 0 --weights "$work/model.safetensors" --out "$work/out" --algo W8A8_DYNAMIC
for file in quant_model_description_w8a8_dynamic.json quant_model_weight_w8a8_dynamic.safetensors; do
  [ -s "$work/out/$file" ] || fail "$file not written"
done
grep -q '"l.weight_scale": "W8A8_DYNAMIC"' "$work/out/quant_model_description_w8a8_dynamic.json" ||
  fail "the description lacks l.weight_scale"
expect_status rank 0 --weights "$work/model.safetensors" --out "$work/out" --algo W8A8_DYNAMIC \
  --rank 3
[ -s "$work/out/quant_model_weight_w8a8_dynamic_3.safetensors" ] || fail "rank 3 not written"

# W8A8_TIMESTEP from ranges a calibration run recorded: l.input_range [2 steps, 2, 2 channels],
# step 0 max [1, 2] min [-1, -2], step 1 max [4, 4] min [0, -4].
header='{"l.input_range":{"dtype":"F32","shape":[2,2,2],"data_offsets":[0,32]}}'
{
  printf "\\x$(printf '%02x' ${#header})\\x00\\x00\\x00\\x00\\x00\\x00\\x00"
  printf '%s' "$header"
  printf '\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x80\xbf\x00\x00\x00\xc0'
  printf '\x00\x00\x80\x40\x00\x00\x80\x40\x00\x00\x00\x00\x00\x00\x80\xc0'
} >"$work/ranges.safetensors"
expect_status timestep 0 --weights "$work/model.safetensors" --out "$work/out" \
  --algo W8A8_TIMESTEP --calibration "$work/ranges.safetensors"
grep -q '"l.input_scale": "W8A8_TIMESTEP"' "$work/out/quant_model_description_w8a8_timestep.json" ||
  fail "the timestep description lacks l.input_scale"
expect_status timestep-without-calibration 2 --weights "$work/model.safetensors" --out "$work/out" \
  --algo W8A8_TIMESTEP

expect_status unknown-flag 2 --weights "$work/model.safetensors" --out "$work/out" --bogus 1
expect_status no-value 2 --weights
expect_status bad-algo 2 --weights "$work/model.safetensors" --out "$work/out" --algo W4A16
expect_status bad-smooth 2 --weights "$work/model.safetensors" --out "$work/out" \
  --algo W8A8_DYNAMIC --smooth 2
expect_status bad-rank 2 --weights "$work/model.safetensors" --out "$work/out" --rank -1
expect_status static-without-calibration 2 --weights "$work/model.safetensors" --out "$work/out"
grep -q "needs --calibration" "$work/stderr" || fail "static without calibration: $(cat "$work/stderr")"
expect_status no-out 2 --weights "$work/model.safetensors"

expect_status missing-weights 1 --weights "$work/none.safetensors" --out "$work/out" \
  --algo W8A8_DYNAMIC
grep -q "none.safetensors: does not exist" "$work/stderr" || fail "missing file not named"
expect_status out-not-dir 1 --weights "$work/model.safetensors" --out "$work/model.safetensors" \
  --algo W8A8_DYNAMIC

finish "ditops-quantize"
