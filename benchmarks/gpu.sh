#!/usr/bin/env bash
# The GPU check and table of docs/benchmarks.md: run from the repository root on a CUDA machine:
#   bash benchmarks/gpu.sh [extra run.py flags]
# Environment: GPU_OUT (output folder, default benchmarks/results), GPU_BENCH_SECONDS (wall limit
# of step 3, default 240; 0 skips it), GPU_CHECK_SECONDS (wall limit of steps 0, 1 and 2 each,
# default 300), PYTHON (interpreter; default .venv/bin/python, else python3).
# 0. benchmarks.gpu_stages in bf16, fp16 and fp32: every model stage's hydra_ops calls on CUDA
#    (fine-tune, Taylor + circuit scoring, member fine-tunes, merge == members, calibration,
#    MC Dropout, OOD metrics, save + load onto the GPU) -> $GPU_OUT/gpu_stages_<p>.json.
# 1. benchmarks.gpu_check --shape minilm (hydra_ops + torch + transformers only: no Prefect,
#    DVC or typer): for the paper's merge and the served default's shared trunk (L/2 layers),
#    fine-tunes one pruned MiniLM-shaped member in bf16 on CUDA, merges, checks merged ==
#    stacked members, then times single vs Hydra in bf16 and fp32 at batch 64 (eager, inductor,
#    CUDA graphs, TensorRT when it imports), and runs compile_model(auto, precision=auto) as
#    the compile stage would -> $GPU_OUT/gpu_check_minilm.json. Both checks use padded_bmm,
#    what merge.attention ships by default (picking by eager timing is noise on a large GPU).
# 2. The same at the BERT-base shape (the paper's text scale; MiniLM at batch 64 is launch-bound
#    on a large GPU) -> $GPU_OUT/gpu_check_bert_base.json. Paper: Hydra / single 1.07 in bf16.
# 3. If typer imports: the full benchmark (benchmarks.run) with the precision axis (bf16, fp32
#    side by side against the single model, fp32 eager) at batch 64 -> $GPU_OUT/results_gpu.{json,md}, stopped after
#    GPU_BENCH_SECONDS. Target: Hydra bf16 / single bf16 <= 1.15 at batch 64.
set -uo pipefail
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
OUT_DIR=${GPU_OUT:-benchmarks/results}
BENCH_SECONDS=${GPU_BENCH_SECONDS:-240}
CHECK_SECONDS=${GPU_CHECK_SECONDS:-300}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p "$OUT_DIR"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
status=0
for p in bf16 fp16 fp32; do
  timeout "$CHECK_SECONDS" "$PY" -m benchmarks.gpu_stages --device cuda --precision "$p" \
    --train-precision "$p" --out "$OUT_DIR/gpu_stages_$p.json" || status=1
done
timeout "$CHECK_SECONDS" "$PY" -m benchmarks.gpu_check --device cuda --shape minilm --steps 20 \
  --batch 64 --shared-layers 0,half --implementation padded_bmm --auto-compile \
  --out "$OUT_DIR/gpu_check_minilm.json" || status=1
timeout "$CHECK_SECONDS" "$PY" -m benchmarks.gpu_check --device cuda --shape bert-base --steps 20 \
  --batch 64 --shared-layers 0,half --implementation padded_bmm \
  --out "$OUT_DIR/gpu_check_bert_base.json" || status=1
if [ "$BENCH_SECONDS" = 0 ] || ! "$PY" -c "import typer, psutil" 2>/dev/null; then
  echo "[gpu.sh] full benchmark skipped (GPU_BENCH_SECONDS=0 or typer/psutil missing)"
  exit $status
fi
BACKENDS=inductor
if "$PY" -c "import torch, sys; import torch_tensorrt; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  BACKENDS=tensorrt,$BACKENDS
fi
timeout "$BENCH_SECONDS" "$PY" -m benchmarks.run --device cuda --precisions bf16,fp32 \
  --batches 64 --threads 8 --backends "$BACKENDS" --budget 2 --min-rounds 10 \
  --max-rounds 50 --tag _gpu --out "$OUT_DIR" "$@" || status=1
exit $status
