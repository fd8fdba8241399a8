"""An image folder without another config's validation images, so FID on those images stays held out.

    .venv/bin/python -m tools.emoji_text.holdout_folder --held-out configs/emoji32.yaml \
        --source ~/.cache/denoiser/datasets/emoji --out ~/.cache/denoiser/datasets/emoji-text

The held-out list is the project's own: `list_folder` gives the files in store order, `split` draws the
validation rows (the seeded permutation every emoji FID is scored against). Checked against the prepared
store of the held-out config: same number of rows, same labels, same pixels for the validation rows.
OUT = SOURCE minus those files (matched by relative path), images hard-linked (copied across devices),
metadata.csv filtered to the kept rows, README.md with a note. Written to a temporary sibling, then renamed.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
from pathlib import Path

import torch

from denoiser.atomic import atomic_path
from denoiser.data import ImageDataset, load_dataset, split
from denoiser.data.decode import decode_image, is_image_name
from denoiser.data.folder import list_folder
from denoiser.train.config import load_config


def held_out_files(config: str) -> tuple[Path, list[str]]:
    """(the config's folder, its validation files relative to it), as `denoiser.data.load_datasets` splits it."""
    cfg = load_config(config)
    d, size = cfg.data, cfg.model["sample_size"]
    source = list_folder(d.path, d.label_column)
    # split() over the row numbers themselves: the validation "images" it returns are the rows it picked
    rows = ImageDataset(torch.arange(len(source.files)), torch.tensor(source.labels), source.classes)
    val_rows = split(rows, d.val_size, d.val_seed)[1].images.tolist()
    files = [source.files[i] for i in val_rows]

    # the store the model was scored from must agree row for row (a skipped file would shift every row)
    store = load_dataset(d, size)
    if len(store) != len(source.files) or store.labels.tolist() != source.labels:
        raise ValueError(f"the store of {config} has {len(store)} rows, the folder {len(source.files)} files (or the "
                         "labels differ): some files were skipped; the held-out list cannot be read off the folder")
    val = split(store, d.val_size, d.val_seed)[1]
    pixels = torch.stack([torch.from_numpy(decode_image(source.root / f, size)) for f in files])  # (V, 3, S, S)
    if not torch.equal(pixels, val.images):
        raise ValueError(f"the validation files of {config} do not decode to its store's validation images")
    return source.root, files


def write_folder(source: Path, out: Path, held_out: set[str], note: str) -> int:
    """SOURCE minus `held_out` into `out` (which does not exist yet); returns the number of images kept."""
    kept = 0
    for here, dirs, names in os.walk(source):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            rel = str((Path(here) / name).relative_to(source))
            if name.startswith(".") or not is_image_name(name) or rel in held_out:
                continue
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source / rel, out / rel)
            except OSError:  # another file system, or no hard links there
                shutil.copy2(source / rel, out / rel)
            kept += 1
    meta = source / "metadata.csv"
    if meta.is_file():
        with open(meta, newline="") as f:
            reader = csv.DictReader(f)
            rows = [r for r in reader if r["file"] not in held_out]
        with open(out / "metadata.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, reader.fieldnames, lineterminator="\n")  # as the emoji set writes it
            writer.writeheader()
            writer.writerows(rows)
        if len(rows) != kept:
            raise ValueError(f"metadata.csv keeps {len(rows)} rows but {kept} images were kept; they must match")
    readme = source / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    (out / "README.md").write_text(text.rstrip("\n") + "\n\n" + note)
    return kept


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--held-out", required=True, help="config whose validation split must stay out (configs/emoji32.yaml)")
    p.add_argument("--source", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    args = p.parse_args()
    source, out = args.source.expanduser().resolve(), args.out.expanduser().resolve()
    if out.exists() and not args.overwrite:
        raise SystemExit(f"{out} exists; pass --overwrite to replace it, or choose another --out")

    cfg_root, files = held_out_files(args.held_out)
    found = [f for f in files if (source / f).is_file()]
    same = sum((source / f).read_bytes() == (cfg_root / f).read_bytes() for f in found)
    n_source = sum(1 for f in source.rglob("*") if f.is_file() and is_image_name(f.name))
    print(f"source images:                 {n_source}")
    print(f"held out ({args.held_out}): {len(files)}, found in source: {len(found)}")
    print(f"byte-identical to {cfg_root}: {same} of {len(found)}")
    if same != len(found):
        raise SystemExit("some held-out files differ from the held-out config's copies; matching by path is unsafe")

    cfg = load_config(args.held_out).data
    note = (f"## Held out\n\nThis folder is `{source.name}` without the {len(found)} images of the validation split of "
            f"`{args.held_out}` (data.val_size {cfg.val_size}, data.val_seed {cfg.val_seed}, over `{cfg.path}`), "
            "matched by relative path. Every emoji model's FID is measured against those images, so a model "
            "trained here never sees them. Written by `tools/emoji_text/holdout_folder.py`; the files left out:\n\n"
            + "".join(f"- {f}\n" for f in sorted(found)))
    with atomic_path(out) as tmp:
        tmp.mkdir()
        kept = write_folder(source, tmp, set(found), note)
    print(f"kept:                          {kept} -> {out}")


if __name__ == "__main__":
    main()
