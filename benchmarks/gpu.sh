#!/usr/bin/env bash
# The GPU check and table (issue 4): run from the repository root on a CUDA machine:
#   bash benchmarks/gpu.sh [extra run.py flags]
# 1. benchmarks/gpu_check.py (hydra_ops + torch + transformers only: no Prefect/DVC/typer needed):
#    fine-tunes one pruned MiniLM-shaped member in bf16 on CUDA, merges, checks merged == stacked
#    members, then times single vs Hydra in bf16 and fp32 at batch 64 (eager, inductor, TensorRT
#    when it imports) -> benchmarks/results/gpu_check.json; prints Hydra / single (paper: 1.07 bf16).
# 2. If typer imports: the full benchmark with the precision axis (bf16, fp32 side by side against
#    the single model, fp32 eager), batch 1 and 64 -> benchmarks/results/results_gpu.{json,md}.
#    Target: Hydra bf16 / single bf16 <= 1.15 at batch 64 ("latency ×single same precision").
set -euo pipefail
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
"$PY" benchmarks/gpu_check.py --device cuda --steps 20 --batch 64 \
  --out benchmarks/results/gpu_check.json
if ! "$PY" -c "import typer, psutil" 2>/dev/null; then
  echo "[gpu.sh] typer/psutil not installed: skipping the full benchmark (gpu_check done)"
  exit 0
fi
BACKENDS=inductor,export
if "$PY" -c "import torch, sys; import torch_tensorrt; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  BACKENDS=tensorrt,$BACKENDS
fi
"$PY" -m benchmarks.run --device cuda --precisions bf16,fp32 --batches 1,64 --threads 8 \
  --backends "$BACKENDS" --budget 10 --min-rounds 10 --max-rounds 100 --tag _gpu "$@"
