#!/usr/bin/env bash
# The DiT example's weights pipeline at a small shape, as a user runs it: dit_block
# --save-weights writes the synthetic block as a checkpoint, ditops-quantize quantizes it
# (W8A8_DYNAMIC), dit_block --weights runs the loaded block; a config the file does not fit
# fails naming the layer (exit 1), and contradictory flags are usage errors (exit 2). That the
# loaded block equals the synthetic one bit for bit is tests/dit's to check.
# Usage: dit_block_weights_test.sh DIT_BLOCK DITOPS_QUANTIZE WORK_DIR   (ctest passes them)
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 DIT_BLOCK DITOPS_QUANTIZE WORK_DIR" >&2; exit 2; }
dit_block=$1 quantize=$2 work=$3
rm -rf "$work"
mkdir -p "$work/model"

source "$(dirname "$0")/checks.sh"

# expect_status NAME STATUS ARGS...: dit_block's exit status (its output in $work/std{out,err}).
expect_status() {
  local name=$1 expected=$2 status=0
  shift 2
  "$dit_block" "$@" >"$work/stdout" 2>"$work/stderr" || status=$?
  [ "$status" -eq "$expected" ] ||
    fail "$name: exit status $status, expected $expected: $(cat "$work/stderr")"
}

shape=(--hidden 64 --heads 4 --image 24 --text 8 --threads 2)
run=(--cfg fused --steps 1 --warmup 0)
description="$work/model/quant_model_description_w8a8_dynamic.json"

expect_status save 0 "${shape[@]}" --seed 5 --save-weights "$work/block.safetensors"
[ -s "$work/block.safetensors" ] || fail "--save-weights wrote nothing"
grep -q 'transformer_blocks.0.' "$work/stdout" || fail "--save-weights names no prefix"

"$quantize" --weights "$work/block.safetensors" --out "$work/model" --algo W8A8_DYNAMIC \
  >"$work/quantize.out" || fail "ditops-quantize failed"
# 7 linear layers per stream, two streams.
grep -q "quantized 14 layer(s)" "$work/quantize.out" || fail "quantized: $(cat "$work/quantize.out")"
grep -q '"transformer_blocks.0.attn.add_q_proj.weight": "W8A8_DYNAMIC"' "$description" ||
  fail "the description lacks the text stream's q projection"
grep -q '"transformer_blocks.0.attn.norm_q.weight": "FLOAT"' "$description" ||
  fail "the description lacks the q norm"

expect_status load 0 "${shape[@]}" "${run[@]}" --weights "$description" --json
grep -q '"weights": "file"' "$work/stdout" || fail "the JSON report does not say file weights"
grep -q '"linear": "W8A8_DYNAMIC"' "$work/stdout" || fail "the JSON report lacks the algorithm"
grep -q "weights: $description" "$work/stderr" || fail "the text report does not name the model"

# The file's MLP is 4 x hidden wide; the text stream's is checked first.
expect_status wrong-shape 1 "${shape[@]}" "${run[@]}" --weights "$description" --mlp-ratio 2
grep -q 'layer "transformer_blocks.0.ff_context.net.0.proj"' "$work/stderr" ||
  fail "wrong-shape: $(cat "$work/stderr")"
expect_status other-block 1 "${shape[@]}" "${run[@]}" --weights "$description" \
  --prefix transformer_blocks.1.
grep -q 'no layer "transformer_blocks.1.norm1_context.linear"' "$work/stderr" ||
  fail "other-block: $(cat "$work/stderr")"
expect_status missing-model 1 "${shape[@]}" "${run[@]}" --weights "$work/none.json"
grep -q "none.json" "$work/stderr" || fail "missing-model: $(cat "$work/stderr")"

expect_status both 2 "${shape[@]}" --weights "$description" --save-weights "$work/x.safetensors"
expect_status compare 2 "${shape[@]}" --weights "$description" --compare

finish "dit_block weights pipeline"
