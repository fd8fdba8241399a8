#!/usr/bin/env bash
# The device tool sends the working tree (tracked and untracked-not-ignored files, plus `carry`) up to 64 MiB; the
# repository's tracked files alone are more (FID reference statistics, three model folders, docs' pictures). Before a
# device call, this leaves in the index only what tools/gpu/run.sh needs for ONE model; afterwards it puts it back.
#
#   bash tools/gpu/travel.sh cifar10      # or emoji: index = denoiser/ configs/ tools/gpu/ bench/train_mfu.py and the
#                                         #   bench/ and tools/ package files, the text model's FID prompts, pyproject.toml
#                                         #   weights/NAME
#   ... device run, carry [".gpu"] (only .gpu/data/NAME.safetensors in it: move the other one aside) ...
#   bash tools/gpu/travel.sh restore      # the index and .git/info/exclude as they were (the files never moved)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude=.git/info/exclude saved=.git/info/exclude.before-travel
case "${1:?cifar10, emoji or restore}" in
  restore)
    [ -f "$saved" ] && mv "$saved" "$exclude"
    git reset -q
    git status --short | head ;;
  *)
    [ -d "weights/$1" ] || { echo "no weights/$1" >&2; exit 1; }
    [ -f "$saved" ] || cp "$exclude" "$saved"
    cat "$saved" - > "$exclude" <<EOT
/*
!/denoiser/
!/configs/
!/bench/
/bench/*
!/bench/__init__.py
!/bench/common.py
!/bench/train_mfu.py
!/bench/fid-reference/
/bench/fid-reference/*
!/bench/fid-reference/emoji32-val500-prompts.txt
!/tools/
/tools/*
!/tools/__init__.py
!/tools/gpu/
!/weights/
/weights/*
!/weights/$1/
!/pyproject.toml
EOT
    git rm -r -q --cached . && git add -A
    echo "travels: $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes tracked + $(du -sb .gpu | cut -f1) in .gpu (limit 67108864)" ;;
esac
