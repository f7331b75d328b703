#!/usr/bin/env bash
# Every accelerator figure the closing notes report, from one device session, in one log.
#
#   bash benchmarks/accelerator_session.sh            # on a GPU (or TPU) machine: about 14 minutes
#   OUT=/tmp/figures bash benchmarks/accelerator_session.sh
#
# Runs, each under its own time limit so that one slow part cannot eat the others' time:
# cuDNN numerics (accelerator.py --check), the accelerator benchmark (peak matmul, attention,
# the example/100m/1b training rows), float8 training against bfloat16 (accelerator.py --precision
# fp8: 100m/1b/8b-wide), the generation benchmark, decoding with int8/float8 weights against
# bfloat16 (generate.py --weights), the MoE dispatch comparison, and the main example for 150
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
part() {  # part TITLE SECONDS COMMAND...: one part, its output appended to the log
  local title=$1 limit=$2
  shift 2
  echo "== $title" | tee -a "$OUT/all.log"
  timeout "$limit" "$@" 2>&1 | quiet | tee -a "$OUT/all.log"
}
part "device" 60 "$PY" -c 'import jax; print(jax.__version__, jax.devices())'
part "accelerator --check" "${CHECK_T:-60}" "$PY" benchmarks/accelerator.py --check
# ACC_SIZES picks rows (default: the script's own, example/100m/1b on an accelerator).
part "accelerator" "${ACC_T:-200}" "$PY" benchmarks/accelerator.py --rounds 5 \
  --budget "${ACC_B:-170}" ${ACC_SIZES:+--sizes "$ACC_SIZES"}
# FP8_SIZES picks rows (default 100m/1b/8b-wide on an accelerator); FP8_P=fp8-row for row scaling.
part "accelerator --precision fp8" "${FP8_T:-330}" "$PY" benchmarks/accelerator.py \
  --precision "${FP8_P:-fp8}" --rounds 5 --budget "${FP8_B:-300}" ${FP8_SIZES:+--sizes "$FP8_SIZES"}
part "generate" "${GEN_T:-110}" "$PY" benchmarks/generate.py --budget "${GEN_B:-80}" --rounds 3
part "generate --weights" "${QGEN_T:-120}" "$PY" benchmarks/generate.py --dtype bfloat16 \
  --weights bfloat16,int8,float8 --only-weights --batches 1,16 --budget "${QGEN_B:-90}" --rounds 5
backend=$("$PY" -c 'import jax; print(jax.default_backend())' 2>/dev/null)
moe_small=$([ "$backend" = cpu ] && echo --small)  # its real sizes take minutes on a CPU
part "moe dispatch" "${MOE_T:-40}" "$PY" benchmarks/moe_dispatch.py --steps 5 $moe_small
part "example, 150 steps" "${EX_T:-60}" "$PY" examples/train_lm.py --steps 150
echo "== done: $OUT/all.log" | tee -a "$OUT/all.log"
