#!/usr/bin/env bash
# The quality-cost frontier of sampling (issue 42): FID-N of each sampler and step count on the shipped models
# (weights/cifar10: FID-1k with CFG 3; weights/emoji: FID-500 unguided), in order of what decides the knee first.
# Each group runs on two shard processes of one thread each (the last shard to finish a setting scores it); a
# finished setting is skipped, so the script resumes where it stopped. `seed-100000` draws the same setting from
# seeds 100000 + k: the gap to the first draw is FID's own noise. `thresh-0.995-1` clips the multistep solvers'
# x0 prediction to [-1, 1] as the folders' DDIM does (clip_sample; diffusers' thresholding with sample_max_value 1
# is that clip). DDIM-50 is the earlier default, scored by `denoiser evaluate --fid` (the same images). Then
# `python -m bench.sampling_frontier cost|table` (see there).
#   bash bench/sampling_frontier.sh
set -euo pipefail
cd "$(dirname "$0")/.."

group() {  # MODEL SAMPLER-STEPS[+PART ...] ...
  local model=$1 n=500 g="" settings=()
  shift
  if [ "$model" = cifar10 ]; then n=1000; g="cfg-3+"; fi
  for s in "$@"; do
    local base=${s%%+*} extra=""
    [ "$base" != "$s" ] && extra="+${s#*+}"
    settings+=("${g}sampler-${base%-*}+steps-${base##*-}${extra}")
  done
  for k in 0 1; do
    OMP_NUM_THREADS=1 .venv/bin/python -m bench.guidance_table run --model "weights/$model" --num-samples $n \
      --shard "$k/2" --settings "${settings[@]}" &
  done
  wait
}

noise=ddim-25+seed-100000
clip=thresh-0.995-1
group cifar10 ddim-25 dpmpp-15 $noise unipc-15 dpmpp-10 unipc-10 ddim-35 dpmpp-15+$clip unipc-15+$clip
group emoji ddim-25 $noise unipc-15 dpmpp-15 ddim-15 unipc-10 dpmpp-10 ddim-35 ddim-10 ddim-20
group cifar10 ddim-15 ddim-20 unipc-20+$clip dpmpp-20+$clip dpmpp-20 unipc-20 ddim-10 dpmpp-8 unipc-8
group emoji dpmpp-20 unipc-20 dpmpp-8 unipc-8
