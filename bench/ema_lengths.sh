#!/usr/bin/env bash
# FID against EMA length (issue 50, item 3): one run continuing a shipped model tracks several EMA lengths
# (train.ema_extra_powers: the warm-up power sets the length of a short run; train.ema_extra_decays: the ceiling, for
# long ones), then each length's export is scored with FID-N. The spread against FID's noise (~1.3 at FID-1k here)
# decides whether post-hoc EMA (EDM2) is worth building.
#
#   bash bench/ema_lengths.sh [MINUTES] [FID_N] [POWERS] [STEPS]  # default: 60 minutes, FID-1k, "0.5 0.6 0.9", 50
#
# STEPS: the DDIM steps each length is scored at (classifier-free guidance 3, as weights/cifar10's sampling.json);
# the lengths are compared with each other, so fewer steps (10) give the spread in a fifth of the time.
# bench/ema_lengths_report.py turns the table into bench/ema_lengths.md and .png.
#
# On a CPU (niced, bf16 where the CPU has it) the run is `denoiser train --init-from weights/cifar10` with
# configs/cifar10.yaml at batch 32; the model's own EMA (ema_power 0.75) is the fourth length. On a GPU the same
# lengths come back from tools/gpu/run.sh with EMA_POWERS (NAME-emas.tar): score them with the FID lines below.
set -euo pipefail
MINUTES=${1:-60}
N=${2:-1000}
POWERS=${3:-"0.5 0.6 0.9"}
STEPS=${4:-50}
PY=${PY:-.venv/bin/python}
RUN=${RUN:-runs/ema-lengths}
REF=bench/fid-reference/cifar10-val5000.safetensors
nice -n 10 "$PY" -m denoiser.cli train --config configs/cifar10.yaml --init-from weights/cifar10 --output-dir "$RUN" \
  --overwrite --set train.batch_size=32 --set train.lr=0.0001 --set train.lr_warmup_steps=50 \
  --set train.max_steps=100000 --set "train.time_limit_minutes=$MINUTES" --set train.sample_every=0 \
  --set "train.ema_extra_powers=[${POWERS// /,}]"
echo "| EMA | FID-$N |"
echo "|---|---|"
for folder in "$RUN"/model "$RUN"/model-ema-*; do
  # the shipped folder's guidance at STEPS steps: a sampling.json beside the run's UNet
  echo "{\"guidance_scale\": 3.0, \"num_inference_steps\": $STEPS}" > "$folder/sampling.json"
  fid=$(nice -n 10 "$PY" -m denoiser.cli evaluate --model "$folder" --fid --num-samples "$N" --reference "$REF" 2>/dev/null \
        | "$PY" -c "import json, sys; print(json.load(sys.stdin)['fid'])")
  echo "| $(basename "$folder") | $fid |"
done
