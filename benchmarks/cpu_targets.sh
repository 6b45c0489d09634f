#!/usr/bin/env bash
# The CPU measurements of docs/benchmarks.md on this machine, one command (run from the repository root after
# `make install`):  bash benchmarks/cpu_targets.sh
# Writes under CPU_OUT (default benchmarks/results/cpu_<kind>, kind = amx | avx512bf16 | avx512 |
# avx2 from /proc/cpuinfo), each step under a wall limit:
# 1. The precision axis at the served shape: single model vs Hydra (paper merge, shared trunk),
#    fp32 and bf16 eager, MiniLM-L6, batch 32 x seq 64 -> results_precision.{json,md}
#    (BENCH_SECONDS, default 900). Target (a): served Hydra bf16 <= 1.0x single fp32 eager on a
#    bf16-capable CPU.
# 2. The default pipeline from a fresh clone of HEAD with this checkout's .venv (the install
#    done): `/usr/bin/time -v hydra-ens run` -> pipeline_time.txt, pipeline.log (RUN_SECONDS,
#    default 3600). Target: <= 8 min on the AMX kind.
# 3. The quality half of (a) on that run's model: bf16 against fp32, paired bootstrap ->
#    precision_quality.json (QUALITY_SECONDS, default 900).
# 4. What each stage's `precision: auto` and batched MC Dropout buy here, side by side ->
#    stage_precision.json (benchmarks.stage_precision), and what the run's stages resolved
#    (their metrics' `precision`) -> precisions.txt; what compile's eager probe saves on the
#    run's Hydra (every candidate built vs the probe first, empty inductor caches) ->
#    compile_probe.json (benchmarks.compile_probe); what training the members in the stage's
#    own process saves against a process per member -> member_processes.json
#    (benchmarks.member_processes).
# 5. Disk: the run's footprint (workspace models/ + artifacts/, .dvc/cache, .dvc-remote, each
#    file counted once) -> footprint.txt; then a second run with one param changed
#    (SECOND_SET, default members.finetune.seed_offset=101) -> pipeline2.log, its footprint too
#    (SKIP_SECOND=1 skips it).
# Extra arguments go to step 1's benchmarks.run (e.g. --budget 5). SKIP_PIPELINE=1 runs step 1
# only. Exit status 1 if a step failed or ran past its limit.
set -uo pipefail
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DVC_NO_ANALYTICS=1 PYTHONUNBUFFERED=1
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
REPO=$(pwd)
PY=$REPO/.venv/bin/python
[ -x "$PY" ] || { echo "error: $PY not found; run 'make install' first" >&2; exit 2; }
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
case "$flags" in
  *amx_bf16*) KIND=amx ;;
  *avx512_bf16*) KIND=avx512bf16 ;;
  *avx512f*) KIND=avx512 ;;
  *) KIND=avx2 ;;
esac
OUT=${CPU_OUT:-benchmarks/results/cpu_$KIND}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
{ lscpu | grep -E 'Model name|^CPU\(s\)'; echo "kind: $KIND"; git rev-parse HEAD; } \
  | tee "$OUT/machine.txt"
status=0
timeout "${BENCH_SECONDS:-900}" "$PY" -m benchmarks.run --models minilm --batches 32 --seqs 64 \
  --precisions fp32,bf16 --backends none --tag _precision --out "$OUT" "$@" || status=1
[ "${SKIP_PIPELINE:-0}" = 1 ] && exit $status
clone=$(mktemp -d "${TMPDIR:-/tmp}/hydra-ens-cpu-targets-XXXXXX")
git clone -q "$REPO" "$clone/project" || exit 1
timer=()
[ -x /usr/bin/time ] && timer=(/usr/bin/time -v -o "$OUT/pipeline_time.txt")
start=$(date +%s)
( cd "$clone/project" && timeout "${RUN_SECONDS:-3600}" "${timer[@]}" \
    "$REPO/.venv/bin/hydra-ens" run ) > "$OUT/pipeline.log" 2>&1 || status=1
echo "default pipeline, fresh clone: $(( $(date +%s) - start )) s wall" \
  | tee "$OUT/pipeline_wall.txt"
# the records name no path of this machine: <repo> is this checkout, <clone> the run's clone
for f in "$OUT/pipeline.log" "$OUT/pipeline_time.txt"; do
  [ -f "$f" ] && sed -i -e "s#$clone#<clone>#g" -e "s#$REPO#<repo>#g" "$f"
done
timeout "${QUALITY_SECONDS:-900}" "$PY" -m benchmarks.precision_quality --project "$clone/project" \
  --precisions bf16 --out "$OUT/precision_quality.json" || status=1
timeout "${BENCH_SECONDS:-900}" "$PY" -m benchmarks.stage_precision --rounds 5 \
  --out "$OUT/stage_precision.json" || status=1
grep -h '"precision"' "$clone"/project/metrics/*.json > "$OUT/precisions.txt" 2>/dev/null || true
timeout "${BENCH_SECONDS:-900}" "$PY" -m benchmarks.compile_probe --project "$clone/project" \
  --rounds 1 --out "$OUT/compile_probe.json" || status=1
timeout "${BENCH_SECONDS:-900}" "$PY" -m benchmarks.member_processes --project "$clone/project" \
  --rounds 1 --out "$OUT/member_processes.json" || status=1
footprint() {  # $1: label; du counts a file with several hard links once per invocation
  ( cd "$clone/project" && echo "$1: $(du -sb --apparent-size . | cut -f1) bytes apparent; du -sh:" \
    && du -sh models artifacts .dvc/cache .dvc-remote . 2>/dev/null ) >> "$OUT/footprint.txt"
}
: > "$OUT/footprint.txt"
footprint "after the default run"
if [ "${SKIP_SECOND:-0}" != 1 ]; then
  start=$(date +%s)
  ( cd "$clone/project" && timeout "${RUN_SECONDS:-3600}" "$REPO/.venv/bin/hydra-ens" run \
      --set "${SECOND_SET:-members.finetune.seed_offset=101}" ) > "$OUT/pipeline2.log" 2>&1 || status=1
  echo "second run (${SECOND_SET:-members.finetune.seed_offset=101}): $(( $(date +%s) - start )) s wall" \
    | tee -a "$OUT/pipeline_wall.txt"
  footprint "after a second run with one param changed"
  sed -i -e "s#$clone#<clone>#g" -e "s#$REPO#<repo>#g" "$OUT/pipeline2.log"
fi
echo "[cpu_targets] results in $OUT; the run's project stays in $clone/project"
exit $status
