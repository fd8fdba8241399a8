#!/usr/bin/env bash
# On a lent GPU (the device tool), from the repository root: train configs/cifar10.yaml and configs/emoji.yaml
# in bf16 through `accelerate launch`, then write to $OUT what comes back: fp16 model folders (one tar
# each), samples for FID, the log. Nothing in the project depends on it.
#
#   bash bench/gpu/run.sh smoke                      # ~15 s of training each: checks every step end to end
#   bash bench/gpu/run.sh full CIFAR_MIN CIFAR_STEPS CIFAR_N EMOJI_MIN EMOJI_STEPS EMOJI_N
#
# Each run continues the shipped weights (`--init-from weights/NAME`: a fresh optimizer and LR schedule)
# with the config they were trained with (weights/emoji: configs/emoji32.yaml; CONFIG_NAME picks another);
# INIT_cifar10=none (or INIT_emoji=none) trains that model from scratch instead. SET_NAME adds --set overrides.
#
# Needs .gpu/data/{cifar10,emoji}.safetensors (bench/gpu/pack_data.py) and, where diffusers is missing,
# its wheel in .gpu/whl; the device command names .gpu in `carry`.
set -uo pipefail
MODE=${1:-smoke}
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export DENOISER_KERNELS=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TQDM_MININTERVAL=20
PY=${PY:-python3}
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }
if [ -d .gpu/whl ] && ! $PY -c "import diffusers" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/log.txt"
$PY -c "import torch, diffusers, accelerate; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'accelerate', accelerate.__version__)" | tee -a "$OUT/log.txt"

if [ "$MODE" = smoke ]; then
  set -- smoke 0.2 100000 100 0.2 100000 100
fi
train() {  # name minutes max_steps num_fid_samples
  local name=$1 minutes=$2 steps=$3 n=$4 kv sets=()
  local extra="SET_$name"  # e.g. SET_cifar10="train.batch_size=512 train.lr=5e-4"
  for kv in ${!extra:-}; do sets+=(--set "$kv"); done
  local init="INIT_$name" conf="CONFIG_$name" from config
  from=${!init:-weights/$name} config=${!conf:-configs/$name.yaml}
  [ "$from" = none ] || sets+=(--init-from "$from")
  log "unpack $name"
  [ -d "/tmp/data/$name" ] || $PY bench/gpu/unpack_data.py ".gpu/data/$name.safetensors" "/tmp/data/$name" | tee -a "$OUT/log.txt"
  log "train $name ($config): time limit $minutes min, max_steps $steps ${sets[*]}"
  $PY -m accelerate.commands.launch --num_processes 1 --num_machines 1 --mixed_precision bf16 --dynamo_backend no \
    -m denoiser.train --config "$config" --output-dir "/tmp/runs/$name" --overwrite \
    --set "data.path=/tmp/data/$name" --set data.val_size=0 --set "train.time_limit_minutes=$minutes" \
    --set "train.max_steps=$steps" --set train.checkpoint_every=100000 "${sets[@]}" > "/tmp/runs/$name.log" 2>&1
  local rc=$?
  tr '\r' '\n' < "/tmp/runs/$name.log" | grep -v '^\s*$' | tail -n 6 | tee -a "$OUT/log.txt"
  [ $rc = 0 ] || { log "train $name failed: rc $rc"; return 1; }
  cat "/tmp/runs/$name/train_summary.json" | tr -d '\n' | head -c 600 | tee -a "$OUT/log.txt"; echo
  cp "/tmp/runs/$name.log" "/tmp/runs/$name/train.log"
  log "finish $name"
  $PY bench/gpu/finish.py "/tmp/runs/$name" "$name" "$OUT" "$n" "weights/$name" 2>&1 | tr '\r' '\n' | grep -v "sampling:" | tee -a "$OUT/log.txt"
  # files come back at most 16 MiB each (a text model's folder is more): parts NAME.tar.00, .01 (cat them back)
  if [ "$(stat -c %s "$OUT/$name.tar")" -gt 16000000 ]; then
    split -b 15000000 -d "$OUT/$name.tar" "$OUT/$name.tar." && rm "$OUT/$name.tar"
  fi
}
CONFIG_emoji=${CONFIG_emoji:-configs/emoji32.yaml}  # the shipped emoji model is the 32x32 one (its text model: configs/emoji-text.yaml)
mkdir -p /tmp/runs
[ "$2" = 0 ] || train cifar10 "$2" "$3" "$4"  # CIFAR_MIN 0: emoji alone
[ "$5" = 0 ] || train emoji "$5" "$6" "$7"  # EMOJI_MIN 0: cifar10 alone (the tree then travels without the emoji data)
log "done"
ls -la "$OUT"
