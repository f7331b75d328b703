#!/usr/bin/env bash
# Every accelerator figure the closing notes report, from one device session, in one log.
#
#   bash benchmarks/accelerator_session.sh            # on a GPU (or TPU) machine: about 25 minutes
#   OUT=/tmp/figures bash benchmarks/accelerator_session.sh
#
# A device call may run 10 minutes at most and a session has 15 minutes of device time (a call's
# start and transfers took ~30 s on an H100), so on a lent machine run the parts an issue needs
# (PARTS selects; each part's *_B budget and *_T limit bound it; PEAK=718.4 skips measuring the
# peak again). Measured on an H100 (2026-11-28), one call of 315 s:
#   PARTS="device peak kernels fp8 qgen moe" KER_B=95 FP8_SIZES=1b FP8_B=110 QGEN_B=55 \
#     MOE_E=8,64 MOE_K=2 MOE_B=45 bash benchmarks/accelerator_session.sh
# The rest of issues 29-31 in one call of ~8 minutes (prepared, not yet run on a device):
#   PEAK=718.4 PARTS="device kernels fp8 qgen moe moemodel longctx" KER_E=64 KER_B=45 KER_T=60 \
#     FP8_SIZES=1b FP8_LOSS=30 FP8_HLO=$OUT/hlo FP8_B=55 FP8_T=75 QGEN_B=50 \
#     QGEN_T=75 MOE_E=8,32,64,128 MOE_K=2,8 MOE_B=95 MOE_T=110 MOEM_DISPATCHES=grouped MOEM_B=75 \
#     MOEM_T=90 LONG_SIZES=1b-32k LONG_B=40 LONG_T=65 bash benchmarks/accelerator_session.sh
# Other groups: PARTS="check accelerator generate example" (baselines, ~6 min); "qmoe" (decoding a
# Mixtral-width model with int8/float8 experts, ~1.5 min; MOEM_P=...,matmul=float8 with "moemodel"
# times float8 experts in training); "context"
# (context_shards.py, ~1 min); "device ringblock" (the ring's attention block kernels and four
# Pallas configurations, ~2.5 min).
#
# Runs, each under its own time limit so that one slow part cannot eat the others' time:
# cuDNN numerics (accelerator.py --check), the accelerator benchmark (peak matmul, attention,
# the example/100m/1b training rows), float8 training against bfloat16 (accelerator.py --precision
# fp8: 100m/1b/8b-wide), the generation benchmark, decoding with int8/float8 weights against
# bfloat16 (generate.py --weights, an 8B-wide model), grouped_matmul alone per implementation and
# block configuration (grouped_matmul.py), the MoE dispatches (ms, active TFLOP/s), the Mixtral-
# and Qwen3-MoE-shaped model steps per dispatch against their dense twins (moe_model.py), one
# context-parallel shard's attention per strategy (ring in order / zig-zag balanced, Ulysses,
# all-gather: context_shards.py), one ring block's forward+backward with its log-sum-exp by the
# Pallas flash-attention kernel against cuDNN and the XLA block (ring_block.py), the 1b model on
# one sequence of 32k and 64k
# tokens (peak memory, tokens/s per remat policy: accelerator.py), and the main example for 150
# steps. Installs nothing; uses $PY (default python3) from the repository
# root. The log is $OUT/all.log (default /tmp/namedaxes-figures). On a CPU it runs the same
# scripts at their tiny CPU sizes, which checks the script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
# A persistent compilation cache, so that a program compiled twice (for its text, then to run)
# costs one compile: device time is what a session is short of.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/namedaxes-jax-cache}
PY=${PY:-python3}
OUT=${OUT:-/tmp/namedaxes-figures}
mkdir -p "$OUT"
quiet() { grep -v "^WARNING\|^I0000\|^E0000"; }
PARTS=${PARTS:-device peak kernels check accelerator fp8 generate qgen qmoe moe moemodel context ringblock longctx example}
backend=$("$PY" -c 'import jax; print(jax.default_backend())' 2>/dev/null)
part() {  # part KEY TITLE SECONDS COMMAND...: one part (if KEY is in $PARTS), logged
  local key=$1 title=$2 limit=$3
  shift 3
  case " $PARTS " in *" $key "*) ;; *) return 0 ;; esac
  echo "== $title" | tee -a "$OUT/all.log"
  timeout "$limit" "$@" 2>&1 | quiet | tee -a "$OUT/all.log"
}
part device "device" 30 "$PY" benchmarks/device_info.py
# The bfloat16 matmul peak, measured once (TFLOP/s; the MFU denominator of the parts below).
case " $PARTS " in *" peak "*)
  PEAK=${PEAK:-$("$PY" -c 'import sys; sys.path.insert(0, "benchmarks")
from accelerator import peak_bf16; from _timing import Budget
print(round(peak_bf16(Budget(15)) / 1e12, 1))' 2>/dev/null | tail -1)}
  echo "== peak: ${PEAK:-?} TFLOP/s" | tee -a "$OUT/all.log" ;;
esac
peak=${PEAK:+--peak $PEAK}
# grouped_matmul alone: each implementation and tiling (Pallas/Triton, Mosaic GPU) against
# ragged_dot and a plain matmul of the same FLOPs, with its error: sets the GPU defaults.
part kernels "grouped_matmul kernels" "${KER_T:-120}" "$PY" benchmarks/grouped_matmul.py \
  --budget "${KER_B:-95}" $peak ${KER_E:+--experts "$KER_E"} $([ "$backend" = cpu ] && echo --quick)
# The kernel table's fastest Mosaic configuration (at the expert count where each ran slowest)
# runs the MoE benchmarks' grouped rows (MOSAIC=rows,contraction,columns,depth,sweep overrides).
MOSAIC=${MOSAIC:-$(grep -o "best mosaic: [0-9,]*" "$OUT/all.log" 2>/dev/null | tail -1 | cut -d' ' -f3)}
mosaic=${MOSAIC:+--mosaic $MOSAIC}
part check "accelerator --check" "${CHECK_T:-45}" "$PY" benchmarks/accelerator.py --check
# ACC_SIZES picks rows (default: the script's own, example/100m/1b on an accelerator).
part accelerator "accelerator" "${ACC_T:-170}" "$PY" benchmarks/accelerator.py --rounds 5 \
  --budget "${ACC_B:-140}" ${ACC_SIZES:+--sizes "$ACC_SIZES"} $peak
part generate "generate" "${GEN_T:-90}" "$PY" benchmarks/generate.py --budget "${GEN_B:-65}" --rounds 3
# FP8_SIZES picks rows (default 100m/1b/8b-wide on an accelerator); FP8_P=fp8-row for row scaling.
part fp8 "accelerator --precision fp8" "${FP8_T:-240}" "$PY" benchmarks/accelerator.py \
  --precision "${FP8_P:-fp8}" --rounds 5 --budget "${FP8_B:-210}" ${FP8_SIZES:+--sizes "$FP8_SIZES"} \
  ${FP8_LOSS:+--loss-steps "$FP8_LOSS"} ${FP8_FORM:+--fp8-form "$FP8_FORM"} \
  ${FP8_HLO:+--save-hlo "$FP8_HLO"} $peak
part qgen "generate --weights" "${QGEN_T:-90}" "$PY" benchmarks/generate.py --dtype bfloat16 \
  --weights bfloat16,int8,float8 --only-weights --batches 1,16 --budget "${QGEN_B:-70}" --rounds 5 \
  --model "${QGEN_M:-8b-wide}" --new-tokens "${QGEN_N:-128}"
# The same for a Mixtral-width mixture of experts (grouped dispatch, its kernel reading the
# quantized experts' narrow values: opt-in on GPUs until this has run, NAMEDAXES_NARROW_EXPERTS).
part qmoe "generate --weights (mixture of experts)" "${QMOE_T:-90}" env NAMEDAXES_NARROW_EXPERTS=1 \
  "$PY" benchmarks/generate.py \
  --dtype bfloat16 --weights bfloat16,int8,float8 --only-weights --batches 1,16 \
  --budget "${QMOE_B:-70}" --rounds 5 --model mixtral-wide --new-tokens "${QGEN_N:-128}"
moe_quick=$([ "$backend" = cpu ] && echo --quick)  # its real sizes take hours on a CPU
# Every dispatch at 8/32/64/128 experts, top-2 and top-8, active TFLOP/s against the peak; then
# grouped_matmul's tilings (GPU). MOE_B bounds the rows it runs, MOE_T the whole part.
part moe "moe dispatch" "${MOE_T:-200}" "$PY" benchmarks/moe_dispatch.py --steps 5 \
  --budget "${MOE_B:-170}" $moe_quick $peak $mosaic ${MOE_E:+--experts "$MOE_E"} ${MOE_K:+--top-k "$MOE_K"}
# Mixtral- and Qwen3-MoE-shaped training steps, one row per dispatch, against the dense model with
# the same active parameters: tokens/s, MFU on active parameters. MOEM_MODELS (mixtral-ish,
# qwen3-moe-ish) and MOEM_DISPATCHES (dense,ragged,grouped,capacity) pick rows; MOEM_B bounds them;
# MOEM_P sets every row's policy (e.g. params=float32,compute=bfloat16,matmul=float8).
part moemodel "moe model" "${MOEM_T:-150}" "$PY" benchmarks/moe_model.py --budget "${MOEM_B:-120}" \
  $moe_quick $peak $mosaic ${MOEM_MODELS:+--models "$MOEM_MODELS"} \
  ${MOEM_DISPATCHES:+--dispatches "$MOEM_DISPATCHES"} ${MOEM_P:+--precision "$MOEM_P"}
part context "context shards" "${CTX_T:-70}" "$PY" benchmarks/context_shards.py --budget "${CTX_B:-55}"
# One ring block (2k/4k/8k tokens, causal diagonal and full), bfloat16, 16 heads x 64: the Pallas
# kernel (implementation="pallas"), cuDNN and the XLA block, forward+backward; pallas/cudnn is the
# issue's bar (<= 1.3). Each Pallas configuration of RB_PALLAS ('bq,bk,warps,stages;...', default
# four) is a column, and the log names the fastest: set it as the kernel's default.
# RB_TOKENS picks block lengths; on a CPU tiny sizes in interpret mode.
part ringblock "ring block kernels" "${RB_T:-150}" "$PY" benchmarks/ring_block.py \
  --budget "${RB_B:-120}" ${RB_TOKENS:+--tokens "$RB_TOKENS"} ${RB_PALLAS:+--pallas "$RB_PALLAS"} \
  $([ "$backend" = cpu ] && echo --quick)
# The 1b model on one sequence of 32k and 64k tokens: peak device memory, tokens/s and MFU, a row
# per remat policy (LONG_REMAT, e.g. full,offload,carry,dots: least memory first; default each
# size's own, dots at 32k and carry at 64k). On a CPU the same code at 512 and 1024 tokens.
long_sizes=$([ "$backend" = cpu ] && echo example-long,example-longer || echo 1b-32k,1b-64k)
part longctx "long context" "${LONG_T:-150}" "$PY" benchmarks/accelerator.py --sizes \
  "${LONG_SIZES:-$long_sizes}" --rounds 3 --steps 1 --budget "${LONG_B:-125}" $peak \
  ${LONG_REMAT:+--remat "$LONG_REMAT"}
part example "example, 150 steps" "${EX_T:-60}" "$PY" examples/train_lm.py --steps 150
echo "== done: $OUT/all.log" | tee -a "$OUT/all.log"
