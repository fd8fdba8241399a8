#!/usr/bin/env bash
# On a lent GPU (the device tool), from the repository root: train configs/cifar10.yaml and configs/emoji.yaml
# in bf16 through `accelerate launch`, then write to $OUT what comes back: fp16 model folders (one tar
# each), samples for FID, the log. Nothing in the project depends on it.
#
#   bash tools/gpu/run.sh smoke                      # ~15 s of training each: checks every step end to end
#   bash tools/gpu/run.sh full CIFAR_MIN CIFAR_STEPS CIFAR_N EMOJI_MIN EMOJI_STEPS EMOJI_N
#   MEASURE=1 bash tools/gpu/run.sh full ...         # first bench/train_mfu.py: eager / fast / diffusers, MEASURE_S s a side
#                                                    # (CIFAR_STEPS or EMOJI_STEPS "auto": the schedule sized to the measured speed)
#   BATCH=auto bash tools/gpu/run.sh full ...        # first the throughput knee over KNEE_BATCHES (after MEASURE's sides):
#                                                    # each model trains there, its lr by LR_RULE (linear) from SET_NAME's
#                                                    # or the config's (batch, lr), its warm-up the same in images
#
# Training runs the fast path (issue 50): the loss read every LOG_EVERY steps (default 50), the split resident on the
# GPU with its noise drawn there (train.device_data: on by default on a GPU). With MEASURE=1 and MEASURE_COMPILE=1 the
# measurement also times torch.compile (COMPILE_MODE, default reduce-overhead: CUDA graphs), and training compiles
# only where that measured faster; COMPILE=1 or COMPILE=0 decides without measuring. EMA_POWERS="0.5 0.9" (warm-up
# powers: what sets the length in a short run) and EMA_EXTRA="0.999" (ceilings) track more EMA lengths, each exported as
# model-ema-<name>/ and brought back as NAME-ema-<name>-unet.safetensors (and -text_encoder), fp16, for FID against length.
#
# Each run continues the shipped weights (`--init-from weights/NAME`: a fresh optimizer and LR schedule)
# with the config they were trained with (weights/emoji: configs/emoji32.yaml; CONFIG_NAME picks another);
# INIT_cifar10=none (or INIT_emoji=none) trains that model from scratch instead. SET_NAME adds --set overrides.
#
# Needs .gpu/data/{cifar10,emoji}.safetensors (tools/gpu/pack_data.py) and, where diffusers is missing,
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

measure() {  # bench/train_mfu.py side by side: eager / fast / diffusers on cifar10's config, then torch.compile, then the text model
  local s=${MEASURE_S:-20} b=${MEASURE_BATCH:-512}
  log "measure cifar10: eager, fast, diffusers (synthetic 32x32 images, batch $b, $s s a side)"
  timeout 300 $PY -m bench.train_mfu --config configs/cifar10.yaml --batch "$b" --seconds "$s" --json "$OUT/measure-cifar10.json" \
    2>>"$OUT/measure.err" | tee -a "$OUT/log.txt"
  if [ "${MEASURE_COMPILE:-1}" = 1 ] && [ -z "${COMPILE:-}" ]; then
    log "measure cifar10: eager against fast + torch.compile (mode ${COMPILE_MODE:-reduce-overhead})"
    timeout 300 $PY -m bench.train_mfu --config configs/cifar10.yaml --batch "$b" --seconds "$s" --sides eager fast --compile \
      --compile-mode "${COMPILE_MODE:-reduce-overhead}" --json "$OUT/measure-cifar10-compile.json" 2>>"$OUT/measure.err" | tee -a "$OUT/log.txt"
    COMPILE=$($PY - "$OUT" <<'EOP'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
try:
    plain, comp = (json.loads((out / f).read_text())["img_per_s"]["fast"] for f in ("measure-cifar10.json", "measure-cifar10-compile.json"))
    print(1 if comp > 1.05 * plain else 0)
except (OSError, KeyError, ValueError):
    print(0)
EOP
)
    log "torch.compile in training: $COMPILE"
  fi
  if [ -d /tmp/data/emoji ] && [ -n "${CONFIG_emoji:-}" ] && grep -q cross_attention_dim "$CONFIG_emoji"; then
    log "measure the text model ($CONFIG_emoji): eager, fast"
    timeout 240 $PY -m bench.train_mfu --config "$CONFIG_emoji" --data-path /tmp/data/emoji --batch "$b" --seconds "$s" \
      --sides eager fast --json "$OUT/measure-emoji.json" 2>>"$OUT/measure.err" | tee -a "$OUT/log.txt"
  fi
}
knee_sweep() {  # CIFAR_MIN EMOJI_MIN: the throughput knee of each model that trains, as it will train (COMPILE)
  local s=${MEASURE_S:-20} name conf data compiled=()
  [ "${COMPILE:-0}" = 1 ] && compiled=(--compile --compile-mode "${COMPILE_MODE:-reduce-overhead}")
  for name in $([ "$1" = 0 ] || echo cifar10) $([ "$2" = 0 ] || echo emoji); do
    conf="CONFIG_$name" data=()
    [ "$name" = emoji ] && data=(--data-path /tmp/data/emoji)
    log "measure $name: the throughput knee over batches ${KNEE_BATCHES:-256 512 1024 2048} (fast, compile ${COMPILE:-0})"
    timeout 300 $PY -m bench.train_mfu --config "${!conf:-configs/$name.yaml}" "${data[@]}" --seconds "$s" \
      --batches ${KNEE_BATCHES:-256 512 1024 2048} "${compiled[@]}" --json "$OUT/measure-$name-knee.json" \
      2>>"$OUT/measure.err" | tee -a "$OUT/log.txt"
  done
}
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
  sets+=(--set "train.log_every=${LOG_EVERY:-50}")  # the fast path: one read of the loss every LOG_EVERY steps
  [ "${COMPILE:-0}" = 1 ] && sets+=(--set train.compile=true --set "train.compile_mode=${COMPILE_MODE:-reduce-overhead}")
  [ -n "${EMA_EXTRA:-}" ] && sets+=(--set "train.ema_extra_decays=[${EMA_EXTRA// /,}]")
  [ -n "${EMA_POWERS:-}" ] && sets+=(--set "train.ema_extra_powers=[${EMA_POWERS// /,}]")
  log "unpack $name"
  [ -d "/tmp/data/$name" ] || $PY -m tools.gpu.unpack_data ".gpu/data/$name.safetensors" "/tmp/data/$name" | tee -a "$OUT/log.txt"
  if [ "${BATCH:-}" = auto ] && [ -f "$OUT/measure-$name-knee.json" ]; then  # batch, lr and warm-up at the knee
    local knee_sets=(--set "data.path=/tmp/data/$name" --set data.val_size=0) at_knee
    for kv in ${!extra:-}; do knee_sets+=(--set "$kv"); done
    at_knee=$($PY -m tools.gpu.knee "$OUT/measure-$name-knee.json" "$config" --rule "${LR_RULE:-linear}" "${knee_sets[@]}" \
      2>>"$OUT/log.txt") || { log "$name: tools/gpu/knee.py failed (above): not trained"; return 1; }
    for kv in $at_knee; do sets+=(--set "$kv"); done
  fi
  if [ "$steps" = auto ]; then  # the cosine schedule sized to the time limit at the measured speed (MEASURE=1 first)
    steps=$($PY - "$OUT" "$name" "$minutes" "${COMPILE:-0}" "${BATCH:-}" <<'EOP'
import json, sys
from pathlib import Path
out, name, minutes, compiled, auto = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1", sys.argv[5] == "auto"
files = [f"measure-{name}-knee.json"] * auto + [f"measure-{name}-compile.json"] * compiled + [f"measure-{name}.json"]
found = next((json.loads((out / f).read_text()) for f in files if (out / f).is_file()), None)
# 85 %: start-up, the reads, the final checkpoint and export take the rest of the time limit
print(int(0.85 * found["img_per_s"]["fast"] * minutes * 60 / found["batch"]) if found else 100000)
EOP
)
    log "$name: max_steps $steps from the measured speed"
  fi
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
  $PY -m tools.gpu.finish "/tmp/runs/$name" "$name" "$OUT" "$n" "weights/$name" 2>&1 | tr '\r' '\n' | grep -v "sampling:" | tee -a "$OUT/log.txt"
  # files come back at most 16 MiB each (a text model's folder is more): parts NAME.tar.00, .01 (cat them back)
  if ls -d /tmp/runs/$name/model-ema-* >/dev/null 2>&1; then  # extra EMA lengths: each UNet in fp16, one file each (< 16 MiB)
    $PY - "/tmp/runs/$name" "$OUT/$name" <<'EOP'
import sys
from pathlib import Path
from safetensors.torch import load_file, save_file
run, prefix = Path(sys.argv[1]), sys.argv[2]
for folder in sorted(run.glob("model-ema-*")):  # a text model's EMA covers its text encoder too
    for part in sorted(folder.glob("*/*.safetensors")):  # unet/, text_encoder/
        w = load_file(str(part))
        save_file({k: v.half() for k, v in w.items()}, f"{prefix}-{folder.name[len('model-'):]}-{part.parent.name}.safetensors")
EOP
  fi
  if [ "$(stat -c %s "$OUT/$name.tar")" -gt 16000000 ]; then
    split -b 15000000 -d "$OUT/$name.tar" "$OUT/$name.tar." && rm "$OUT/$name.tar"
  fi
}
CONFIG_emoji=${CONFIG_emoji:-configs/emoji32.yaml}  # the shipped emoji model is the 32x32 one (its text model: configs/emoji-text.yaml)
mkdir -p /tmp/runs
if [ "${MEASURE:-0}" = 1 ] || [ "${BATCH:-}" = auto ]; then
  [ "$5" = 0 ] || [ -d /tmp/data/emoji ] || $PY -m tools.gpu.unpack_data .gpu/data/emoji.safetensors /tmp/data/emoji | tee -a "$OUT/log.txt"
fi
[ "${MEASURE:-0}" = 1 ] && measure
[ "${BATCH:-}" = auto ] && knee_sweep "$2" "$5"
[ "$2" = 0 ] || train cifar10 "$2" "$3" "$4"  # CIFAR_MIN 0: emoji alone
[ "$5" = 0 ] || train emoji "$5" "$6" "$7"  # EMOJI_MIN 0: cifar10 alone (the tree then travels without the emoji data)
log "done"
ls -la "$OUT"
