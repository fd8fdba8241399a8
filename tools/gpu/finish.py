"""After a GPU run: the model in fp16, samples for FID, one tar to bring back.

    python3 -m tools.gpu.finish RUN_DIR NAME OUT_DIR NUM_FID_SAMPLES SHIPPED_DIR

Writes OUT_DIR/NAME.tar (the candidate model folder: SHIPPED_DIR, e.g. weights/cifar10, with this run's UNet in
fp16 in place of its own; plus the run's config, loss log, summary and sample grids) and two sample sets for FID,
uint8 (N, H, W, 3), drawn exactly as `denoiser evaluate --model FOLDER --fid --num-samples N` draws them (the
folder's scheduler and sampling.json, classes spread evenly, image k seeded k):
OUT_DIR/NAME-new.npy from the candidate and OUT_DIR/NAME-shipped.npy from SHIPPED_DIR itself, on the same
machine, so the two FIDs scored later on a CPU (`denoiser evaluate --fid --samples`) differ by the weights alone.
"""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch

from denoiser.folders.model_dir import load
from denoiser.model.text import prompts_from_file
from denoiser.request import SPREAD, SampleRequest
from denoiser.sampling.pipeline import DenoiserPipeline, save_pipeline
from denoiser.sampling.plan import resolve, run

TEXT_PROMPTS = Path("bench/fid-reference/emoji32-val500-prompts.txt")  # a text model's FID prompts: held-out image k's name, cycled
BATCH = 250  # images per UNet batch: speed only (image k is seeded k whatever its batch)


def candidate_folder(run_dir: Path, shipped: Path, device: str) -> Path:
    """`shipped` with the run's UNet (fp16) in place of its own: same scheduler, sampling.json, classes, card.
    A text model's run (text_encoder/ in its model folder) brings its text encoder and tokenizer too, and drops
    the shipped classes.txt (it has no classes)."""
    pipe = DenoiserPipeline.from_pretrained(run_dir / "model")
    fp16 = run_dir / "model-fp16"
    save_pipeline(pipe.unet, pipe.scheduler, fp16, dtype=torch.float16, text_encoder=pipe.text_encoder,
                  tokenizer=pipe.tokenizer)
    out = run_dir / "candidate"
    shutil.copytree(shipped, out, dirs_exist_ok=True)
    for part in ("unet", "text_encoder", "tokenizer", "model_index.json"):
        if (out / part).is_dir():
            shutil.rmtree(out / part)
        if (fp16 / part).is_dir():
            shutil.copytree(fp16 / part, out / part)
    index = json.loads((fp16 / "model_index.json").read_text())  # the shipped folder's sampler stays (its scheduler/)
    index["scheduler"] = json.loads((shipped / "model_index.json").read_text())["scheduler"]
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    if pipe.text_encoder is not None:
        (out / "classes.txt").unlink(missing_ok=True)
    return out


def draw(folder: Path, num_samples: int, device: str) -> np.ndarray:
    """The images `denoiser evaluate --model folder --fid --num-samples N` scores, uint8 (N, H, W, 3)."""
    model = load(folder, device=device)  # resolve takes the folder's own sampler
    unet = model.unet
    classes = SPREAD if unet.config.num_class_embeds else None
    # a text model: as `evaluate --fid --prompts TEXT_PROMPTS` (unconditioned samples would score otherwise)
    prompts = prompts_from_file(TEXT_PROMPTS, num_samples) if unet.config.cross_attention_dim else None  # None: no text
    plan = resolve(SampleRequest(num_images=num_samples, classes=classes, prompts=prompts, seed=0, batch_size=BATCH),
                   model, load=lambda path: load(path, device=device))
    tic = time.perf_counter()
    images = run(plan).images.mul(255).round().to(torch.uint8)
    dt = time.perf_counter() - tic
    print(f"{folder}: {len(images)} samples ({plan.describe()}) in {dt:.1f} s ({len(images) / dt:.0f} img/s)")
    return images.permute(0, 2, 3, 1).cpu().numpy()  # (N, C, H, W) -> (N, H, W, C)


def main(run_folder: str, name: str, out: str, num_samples: str, shipped_dir: str) -> None:
    run_dir, out_dir, shipped = Path(run_folder), Path(out), Path(shipped_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    candidate = candidate_folder(run_dir, shipped, device)
    with tarfile.open(out_dir / f"{name}.tar", "w") as tar:
        tar.add(candidate, arcname="model")
        for extra in ("config.yaml", "loss.csv", "train_summary.json", "loss.png", "run_info.json", "samples", "train.log"):
            if (run_dir / extra).exists():
                tar.add(run_dir / extra, arcname=extra)
    for suffix, folder in (("new", candidate), ("shipped", shipped)) if int(num_samples) else ():  # 0: score elsewhere
        np.save(out_dir / f"{name}-{suffix}.npy", draw(folder, int(num_samples), device))


if __name__ == "__main__":
    main(*sys.argv[1:])
