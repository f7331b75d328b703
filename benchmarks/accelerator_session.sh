#!/usr/bin/env bash
# Every accelerator figure the closing notes report, from one device session, in one log.
#
#   bash benchmarks/accelerator_session.sh            # on a GPU (or TPU) machine: about 21 minutes
#   OUT=/tmp/figures bash benchmarks/accelerator_session.sh
#
# A device call may run 10 minutes at most and a session has 15 minutes of device time, so on a
# lent machine run the parts an issue needs, a call each on the same warm machine (PARTS selects):
#   PARTS="device moe context" bash benchmarks/accelerator_session.sh    # experts, long context: ~5 min
#   PARTS="device moemodel" bash benchmarks/accelerator_session.sh        # MoE model steps: ~3 min
#   PARTS="fp8 qgen" bash benchmarks/accelerator_session.sh              # low precision: ~5.5 min
#   PARTS="check accelerator generate example" bash benchmarks/accelerator_session.sh  # baselines: ~6 min
#   PARTS="device longctx" bash benchmarks/accelerator_session.sh         # 1b at 32k/64k tokens: ~3 min
#
# Runs, each under its own time limit so that one slow part cannot eat the others' time:
# cuDNN numerics (accelerator.py --check), the accelerator benchmark (peak matmul, attention,
# the example/100m/1b training rows), float8 training against bfloat16 (accelerator.py --precision
# fp8: 100m/1b/8b-wide), the generation benchmark, decoding with int8/float8 weights against
# bfloat16 (generate.py --weights), the MoE dispatches (ms, active TFLOP/s, grouped_matmul
# tilings), the Mixtral- and Qwen3-MoE-shaped model steps per dispatch against their dense twins
# (moe_model.py), one context-parallel shard's attention per strategy (ring in order / zig-zag
# balanced, Ulysses, all-gather: context_shards.py), the 1b model on one sequence of 32k and 64k
# tokens (peak memory, tokens/s per remat policy: accelerator.py), and the main example for 150
# steps. Installs nothing; uses $PY (default python3) from the repository
# root. The log is $OUT/all.log (default /tmp/namedaxes-figures). On a CPU it runs the same
# scripts at their tiny CPU sizes, which checks the script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PY:-python3}
OUT=${OUT:-/tmp/namedaxes-figures}
mkdir -p "$OUT"
quiet() { grep -v "^WARNING\|^I0000\|^E0000"; }
PARTS=${PARTS:-device check accelerator fp8 generate qgen moe moemodel context longctx example}
part() {  # part KEY TITLE SECONDS COMMAND...: one part (if KEY is in $PARTS), logged
  local key=$1 title=$2 limit=$3
  shift 3
  case " $PARTS " in *" $key "*) ;; *) return 0 ;; esac
  echo "== $title" | tee -a "$OUT/all.log"
  timeout "$limit" "$@" 2>&1 | quiet | tee -a "$OUT/all.log"
}
part device "device" 30 "$PY" -c 'import jax; print(jax.__version__, jax.devices())'
part check "accelerator --check" "${CHECK_T:-45}" "$PY" benchmarks/accelerator.py --check
# ACC_SIZES picks rows (default: the script's own, example/100m/1b on an accelerator).
part accelerator "accelerator" "${ACC_T:-170}" "$PY" benchmarks/accelerator.py --rounds 5 \
  --budget "${ACC_B:-140}" ${ACC_SIZES:+--sizes "$ACC_SIZES"}
part generate "generate" "${GEN_T:-90}" "$PY" benchmarks/generate.py --budget "${GEN_B:-65}" --rounds 3
# FP8_SIZES picks rows (default 100m/1b/8b-wide on an accelerator); FP8_P=fp8-row for row scaling.
part fp8 "accelerator --precision fp8" "${FP8_T:-240}" "$PY" benchmarks/accelerator.py \
  --precision "${FP8_P:-fp8}" --rounds 5 --budget "${FP8_B:-210}" ${FP8_SIZES:+--sizes "$FP8_SIZES"}
part qgen "generate --weights" "${QGEN_T:-90}" "$PY" benchmarks/generate.py --dtype bfloat16 \
  --weights bfloat16,int8,float8 --only-weights --batches 1,16 --budget "${QGEN_B:-70}" --rounds 5
backend=$("$PY" -c 'import jax; print(jax.default_backend())' 2>/dev/null)
moe_quick=$([ "$backend" = cpu ] && echo --quick)  # its real sizes take hours on a CPU
# Every dispatch at 8/32/64/128 experts, top-2 and top-8, active TFLOP/s against the peak; then
# grouped_matmul's tilings (GPU). MOE_B bounds the rows it runs, MOE_T the whole part.
part moe "moe dispatch" "${MOE_T:-200}" "$PY" benchmarks/moe_dispatch.py --steps 5 \
  --budget "${MOE_B:-170}" $moe_quick
# Mixtral- and Qwen3-MoE-shaped training steps, one row per dispatch, against the dense model with
# the same active parameters: tokens/s, MFU on active parameters. MOEM_MODELS (mixtral-ish,
# qwen3-moe-ish) and MOEM_DISPATCHES (dense,ragged,grouped,capacity) pick rows; MOEM_B bounds them.
part moemodel "moe model" "${MOEM_T:-150}" "$PY" benchmarks/moe_model.py --budget "${MOEM_B:-120}" \
  $moe_quick ${MOEM_MODELS:+--models "$MOEM_MODELS"} ${MOEM_DISPATCHES:+--dispatches "$MOEM_DISPATCHES"}
part context "context shards" "${CTX_T:-70}" "$PY" benchmarks/context_shards.py --budget "${CTX_B:-55}"
# The 1b model on one sequence of 32k and 64k tokens: peak device memory, tokens/s and MFU, a row
# per remat policy (LONG_REMAT, e.g. full,offload,carry,dots: least memory first; default each
# size's own, dots at 32k and carry at 64k). On a CPU the same code at 512 and 1024 tokens.
long_sizes=$([ "$backend" = cpu ] && echo example-long,example-longer || echo 1b-32k,1b-64k)
part longctx "long context" "${LONG_T:-150}" "$PY" benchmarks/accelerator.py --sizes \
  "${LONG_SIZES:-$long_sizes}" --rounds 3 --steps 1 --budget "${LONG_B:-125}" ${LONG_REMAT:+--remat "$LONG_REMAT"}
part example "example, 150 steps" "${EX_T:-60}" "$PY" examples/train_lm.py --steps 150
echo "== done: $OUT/all.log" | tee -a "$OUT/all.log"
