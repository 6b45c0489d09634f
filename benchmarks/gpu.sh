#!/usr/bin/env bash
# The GPU table (issue 4): bf16 and fp32, batch 1 and 64, inductor and (if it imports) tensorrt.
# Run from the repository root on a CUDA machine: bash benchmarks/gpu.sh [extra run.py flags]
# Writes benchmarks/results/results_gpu_{bfloat16,float32}.{json,md}; target: Hydra bf16 /
# single bf16 <= 1.15 at batch 64 (see the "latency xbase" column of the hydra rows).
set -euo pipefail
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PYTHON:-.venv/bin/python}
BACKENDS=inductor,export
if "$PY" -c "import torch, sys; import torch_tensorrt; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  BACKENDS=tensorrt,$BACKENDS
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
for DTYPE in bfloat16 float32; do
  "$PY" -m benchmarks.run --device cuda --dtype "$DTYPE" --batches 1,64 --threads 8 \
    --backends "$BACKENDS" --budget 10 --min-rounds 10 --max-rounds 100 \
    --tag "_gpu_${DTYPE}" "$@"
done
