#!/usr/bin/env bash
# Which learning rate goes with a bigger batch (issue 50: "batch size and learning rate at the throughput knee, with
# the rule written down; check it with a short FID comparison"). Runs of equal images from scratch, the batch 4x the
# reference's, the lr scaled by each candidate rule, then FID-N of each run's EMA export on the held-out split:
#
#   ref     batch B,   lr L        the reference
#   sqrt    batch 4B,  lr 2L       square-root scaling (Adam's SDE rule, Malladi et al. 2022)
#   linear  batch 4B,  lr 4L       linear scaling (Goyal et al. 2017; diffusers' --scale_lr)
#   none    batch 4B,  lr L
#
# The rule that matches the reference at 4x the batch is the one tools/gpu/run.sh applies at the knee.
#
#   bash bench/lr_batch_rule.sh [IMAGES] [B] [L] [WIDTH] [FID_N] [RULES]
#   # default: 76800 images, B 32, L 0.0002, base_channels 32, FID-500, "ref sqrt linear none"
#
# configs/emoji32.yaml's data and recipe (v-prediction, bf16, EMA power 0.75), its model at base width WIDTH (32: a
# quarter of the shipped FLOPs, so a run of 76,800 images takes ~15 min on 2 cores); warm-up 6,400 images, cosine to 0.
# FID-N: `denoiser evaluate --fid` (DDIM-25, no guidance, classes spread) against bench/fid-reference/emoji32-val500.
set -euo pipefail
IMAGES=${1:-76800}
B=${2:-32}
L=${3:-0.0002}
WIDTH=${4:-32}
N=${5:-500}
RULES=${6:-"ref sqrt linear none"}
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs/lr-batch-rule}
REF=bench/fid-reference/emoji32-val500.safetensors
echo "| rule | batch | lr | steps | images | minutes | FID-$N |"
echo "|---|---|---|---|---|---|---|"
for rule in $RULES; do
  case $rule in
    ref) batch=$B; lr=$L ;;
    sqrt) batch=$((4 * B)); lr=$($PY -c "print($L * 2)") ;;
    linear) batch=$((4 * B)); lr=$($PY -c "print($L * 4)") ;;
    none) batch=$((4 * B)); lr=$L ;;
    *) echo "unknown rule $rule: ref, sqrt, linear or none" >&2; exit 2 ;;
  esac
  steps=$((IMAGES / batch)) warmup=$((6400 / batch))
  start=$(date +%s)
  nice -n 10 "$PY" -m denoiser.cli train --config configs/emoji32.yaml --output-dir "$RUNS/$rule" --overwrite \
    --set "model.base_channels=$WIDTH" --set "train.batch_size=$batch" --set "train.lr=$lr" \
    --set "train.max_steps=$steps" --set "train.lr_warmup_steps=$warmup" --set train.sample_every=0 \
    --set "train.checkpoint_every=$steps" > "$RUNS-$rule.log" 2>&1
  minutes=$(( ($(date +%s) - start) / 60 ))
  fid=$(nice -n 10 "$PY" -m denoiser.cli evaluate --model "$RUNS/$rule/model" --fid --num-samples "$N" --reference "$REF" \
        2>/dev/null | "$PY" -c "import json, sys; print(json.load(sys.stdin)['fid'])")
  echo "| $rule | $batch | $lr | $steps | $((steps * batch)) | $minutes | $fid |"
done
# bench/lr_batch_rule.png: each run's images 0-9 (image k seeded k, classes spread, DDIM-25, no guidance), a row each
for rule in $RULES; do
  rm -rf "$RUNS/$rule/look"
  "$PY" -m denoiser.cli sample --model "$RUNS/$rule/model" --out-dir "$RUNS/$rule/look" --num-images 10 --seed 0 \
    --class-label spread --scheduler ddim --steps 25 --guidance 1 > /dev/null
done
"$PY" - "$RUNS" $RULES <<'EOP'
import sys
from pathlib import Path

from PIL import Image
from torchvision.transforms.functional import to_tensor

from denoiser.image_io import save_png
from denoiser.pictures import tiles_image

runs, rules = Path(sys.argv[1]), sys.argv[2:]
rows = [[(f"{r} {k}" if k == 0 else str(k), to_tensor(Image.open(f).convert("RGB")))  # (3, 32, 32) in [0, 1]
         for k, f in enumerate(sorted((runs / r / "look").glob("*.png")))] for r in rules]
save_png(tiles_image(rows, scale=3), "bench/lr_batch_rule.png")
EOP
