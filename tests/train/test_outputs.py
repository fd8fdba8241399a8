"""What a run writes besides checkpoints (denoiser/train/outputs.py): the loss curve and the best model with its FID
replace the previous ones whole or not at all (denoiser/atomic.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

import denoiser.evaluate.fid
from denoiser.atomic import is_temporary
from denoiser.diffusion import Diffusion
from denoiser.model.unet import UNet
from denoiser.train import outputs as train_outputs
from denoiser.train.config import load_config
from denoiser.train.run_dir import record_loss
from tests.conftest import write_config


def _run(tmp_path, **train):
    cfg = load_config(write_config(tmp_path / "c.yaml", train={"fid_samples": 2, "keep_best": True, "fid_every": 1, **train}))
    torch.manual_seed(0)
    return cfg, UNet(**cfg.model), Diffusion.from_config(cfg.diffusion), tmp_path / "run"


def _fail_midway(monkeypatch, cls, method: str, name: str):
    """Writes to a file whose name holds `name` write half, then fail (a full disk, a killed process)."""
    original = getattr(cls, method)

    def write(self, *args, **kwargs):
        target = Path(args[0] if cls is Image.Image else self)
        if name not in target.name:
            return original(self, *args, **kwargs)
        target.write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cls, method, write)


def _temporaries(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if is_temporary(p.name)]


def test_a_failed_loss_curve_keeps_the_previous_one(tmp_path, monkeypatch):
    cfg, unet, diffusion, out = _run(tmp_path)
    out.mkdir()
    for step in (1, 2):
        record_loss(out, step, 0.5 / step)
    train_outputs.sample_grid(unet, None, diffusion, cfg, out, 2)
    before = (out / "loss.png").read_bytes()
    record_loss(out, 3, 0.1)
    _fail_midway(monkeypatch, Image.Image, "save", "loss.png")
    with pytest.raises(OSError, match="No space"):
        train_outputs.sample_grid(unet, None, diffusion, cfg, out, 3)
    assert (out / "loss.png").read_bytes() == before and not _temporaries(out)


class _Accelerator:
    def log(self, values, step):
        pass


def test_a_failed_best_model_keeps_the_previous_model_and_its_score(tmp_path, monkeypatch):
    cfg, unet, diffusion, out = _run(tmp_path)
    out.mkdir()
    reference = tmp_path / "reference.safetensors"
    reference.write_bytes(b"")  # never read: the statistics and the score are stubbed (no Inception here)
    cfg.train.fid_reference = str(reference)
    scores = iter([2.0, 1.0])
    monkeypatch.setattr(train_outputs, "_inception", lambda device: None)
    monkeypatch.setattr(denoiser.evaluate.fid, "reference_statistics", lambda path: None)
    monkeypatch.setattr(denoiser.evaluate.fid, "fid_of_images", lambda images, ref, extractor: next(scores))
    train_outputs.evaluate_fid(_Accelerator(), unet, None, diffusion, cfg, None, out, 1)
    best = out / "best-model"
    weights = (best / "unet" / "diffusion_pytorch_model.safetensors").read_bytes()
    assert json.loads((best / "fid.json").read_text())["fid"] == 2.0

    with torch.no_grad():
        next(unet.parameters()).add_(1.0)  # a better model at step 2, whose score fails to write
    _fail_midway(monkeypatch, Path, "write_text", "fid.json")
    with pytest.raises(OSError, match="No space"):
        train_outputs.evaluate_fid(_Accelerator(), unet, None, diffusion, cfg, None, out, 2)
    assert json.loads((best / "fid.json").read_text()) == {"step": 1, "fid": 2.0, "num_samples": 2}
    assert (best / "unet" / "diffusion_pytorch_model.safetensors").read_bytes() == weights  # the pair, unchanged
    assert not _temporaries(out)


@pytest.mark.parametrize("num_class_embeds", [None, 4])
def test_the_best_model_is_a_folder_like_the_runs_model(tmp_path, monkeypatch, num_class_embeds):
    """An unconditional model's FID asked for its classes spread over the images, and failed; a class model's
    best-model/ had no classes.txt, so its classes had no names. Both now score, and best-model/ names its classes."""
    cfg = load_config(write_config(tmp_path / "c.yaml", model={"num_class_embeds": num_class_embeds},
                                   train={"fid_samples": 2, "keep_best": True, "fid_every": 1}))
    torch.manual_seed(0)
    unet, out = UNet(**cfg.model), tmp_path / "run"
    out.mkdir()
    reference = tmp_path / "reference.safetensors"
    reference.write_bytes(b"")  # never read: the statistics and the score are stubbed (no Inception here)
    cfg.train.fid_reference = str(reference)
    monkeypatch.setattr(train_outputs, "_inception", lambda device: None)
    monkeypatch.setattr(denoiser.evaluate.fid, "reference_statistics", lambda path: None)
    monkeypatch.setattr(denoiser.evaluate.fid, "fid_of_images", lambda images, ref, extractor: 3.0)
    names = ["cat", "dog", "fox", "owl"] if num_class_embeds else None
    train_outputs.evaluate_fid(_Accelerator(), unet, None, Diffusion.from_config(cfg.diffusion), cfg, None, out, 1,
                               classes=names)
    from denoiser.folders.model_dir import load

    assert list(load(out / "best-model").defaults.classes or ()) == (names or [])
