"""The training loop end to end: outputs, exact resume, failures that keep what was saved."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from diffusers import DiffusionPipeline
from safetensors.torch import load_file

import denoiser  # noqa: F401
from denoiser.data.order import batch_indices
from denoiser.model.unet import UNet
from denoiser.train.init_from import adapt_classes
from tests.conftest import cli, write_config


def weights(run, name="model.safetensors", step=None):
    ckpts = sorted((run / "checkpoints").iterdir())
    folder = ckpts[-1] if step is None else run / "checkpoints" / f"checkpoint-{step:08d}"
    return load_file(str(folder / name))


def test_run_writes_everything_and_exports_a_pipeline(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", train={"sample_every": 3, "log_every": 1})
    run = tmp_path / "run"
    res = cli("train", "--config", str(cfg), "--output-dir", str(run))
    assert "model:" in res.stdout
    for name in ("config.yaml", "run_info.json", "loss.csv", "loss.png", "train_summary.json", "samples/step-00000003.png"):
        assert (run / name).is_file(), name
    assert any((run / "logs").rglob("events.out.tfevents*"))
    info = json.loads((run / "run_info.json").read_text())[0]
    assert info["torch"] == torch.__version__ and "git_commit" in info
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["train"]["max_steps"] == 6 and saved["train"]["lr"] == 0.001  # the resolved config
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == ["checkpoint-00000004", "checkpoint-00000006"]
    pipe = DiffusionPipeline.from_pretrained(run / "model")
    out = pipe(batch_size=2, num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="np")
    assert out.images.shape == (2, 8, 8, 3)
    assert pipe.classes == ["circle", "square", "triangle", "cross"]  # the data's class names, in classes.txt
    # the export holds the EMA weights, not the raw ones
    ema = weights(run, "ema.safetensors")
    exported = pipe.unet.state_dict()
    raw = weights(run)
    name = next(k for k in raw if k.endswith("conv_in.weight"))
    assert torch.equal(exported["conv_in.weight"], ema[str(list(exported).index("conv_in.weight"))])
    assert not torch.equal(exported["conv_in.weight"], raw[name])


@pytest.mark.parametrize(
    "train", [{}, {"channels_last": True, "mixed_precision": "bf16"}], ids=["fp32", "bf16-channels-last-kernel"]
)
def test_resume_continues_exactly(tmp_path, train):
    cfg = write_config(tmp_path / "c.yaml", train=train)
    straight, split = tmp_path / "straight", tmp_path / "split"
    cli("train", "--config", str(cfg), "--output-dir", str(straight))
    cli("train", "--config", str(cfg), "--output-dir", str(split), "--max-steps", "3")  # warmup is 4: LR state matters
    cli("train", "--config", str(cfg), "--output-dir", str(split), "--resume", "latest")
    a, b = weights(straight), weights(split)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ea, eb = weights(straight, "ema.safetensors"), weights(split, "ema.safetensors")
    assert all(torch.equal(ea[k], eb[k]) for k in ea)
    sa = json.loads((straight / "checkpoints" / "checkpoint-00000006" / "state.json").read_text())
    sb = json.loads((split / "checkpoints" / "checkpoint-00000006" / "state.json").read_text())
    assert sa["lr_scheduler"] == sb["lr_scheduler"] and sa["ema"] == sb["ema"]
    steps = [int(line.split(",")[0]) for line in (split / "loss.csv").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_nan_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", train={"lr": 1e12, "max_grad_norm": None, "checkpoint_every": 1, "max_steps": 50})
    run = tmp_path / "run"
    res = cli("train", "--config", str(cfg), "--output-dir", str(run), check=False)
    assert res.returncode != 0
    assert "loss is nan at step" in res.stderr or "loss is inf at step" in res.stderr
    kept = sorted((run / "checkpoints").iterdir())
    assert kept and all((p / "state.json").is_file() for p in kept)
    for p in kept:
        assert all(torch.isfinite(t).all() for t in load_file(str(p / "model.safetensors")).values())
    assert not (run / "model").exists()


def test_bad_inputs_fail_before_any_work(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    run = tmp_path / "run"
    res = cli("train", "--config", str(cfg), "--output-dir", str(run), "--resume", str(tmp_path), check=False)
    assert res.returncode == 2 and "not a complete checkpoint" in res.stderr
    res = cli("train", "--config", str(cfg), "--set", "train.batch_size=0", "--output-dir", str(run), check=False)
    assert res.returncode == 2 and "batch_size must be at least 1" in res.stderr
    res = cli("train", "--config", str(cfg), "--set", "batch_size=6", "--set", "gradient_accumulation_steps=4",
              "--output-dir", str(run), check=False)
    assert res.returncode == 2 and "must be divisible by processes x gradient_accumulation_steps" in res.stderr
    assert not (run / "checkpoints").exists()


def test_output_dir_of_another_config_is_not_overwritten(tmp_path):
    run = tmp_path / "run"
    cli("train", "--config", str(write_config(tmp_path / "a.yaml", train={"max_steps": 2})), "--output-dir", str(run))
    other = write_config(tmp_path / "b.yaml", train={"max_steps": 2, "lr": 0.01})
    res = cli("train", "--config", str(other), "--output-dir", str(run), check=False)
    assert res.returncode == 2 and "different config (differs in: train.lr)" in res.stderr
    res = cli("train", "--config", str(tmp_path / "a.yaml"), "--output-dir", str(run), check=False)
    assert res.returncode == 2 and "--resume latest" in res.stderr
    cli("train", "--config", str(other), "--output-dir", str(run), "--overwrite")
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["lr"] == 0.01


def test_batch_indices_are_epoch_permutations():
    seen = torch.cat([batch_indices(20, 5, m, seed=1) for m in range(4)])
    assert sorted(seen.tolist()) == list(range(20))  # one epoch covers every image once
    nxt = torch.cat([batch_indices(20, 5, m, seed=1) for m in range(4, 8)])
    assert not torch.equal(seen, nxt) and sorted(nxt.tolist()) == list(range(20))


@pytest.mark.parametrize("accum", [1, 2])
def test_lr_schedule_counts_optimizer_steps(tmp_path, accum):
    from diffusers.optimization import get_scheduler

    cfg = write_config(tmp_path / "c.yaml", train={"lr_scheduler": "cosine", "lr_warmup_steps": 2, "max_steps": 5,
                                                     "gradient_accumulation_steps": accum, "checkpoint_every": 3})
    run = tmp_path / "run"
    cli("train", "--config", str(cfg), "--output-dir", str(run))
    state = json.loads((run / "checkpoints" / "checkpoint-00000003" / "state.json").read_text())
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.001)
    ref = get_scheduler("cosine", opt, num_warmup_steps=2, num_training_steps=5)
    for _ in range(3):
        opt.step()
        ref.step()
    assert state["lr_scheduler"]["_last_lr"] == pytest.approx(ref.get_last_lr())
    assert state["lr_scheduler"]["last_epoch"] == 3


def test_fp16_mixed_precision_trains_on_cpu(tmp_path):
    # fp16 autocast with Accelerate's gradient scaler; channels_last defaults to off here (the NHWC
    # GroupNorm kernel covers fp32 and bf16 only)
    cfg = write_config(tmp_path / "c.yaml", train={"mixed_precision": "fp16", "channels_last": None, "max_steps": 3})
    run = tmp_path / "run"
    cli("train", "--config", str(cfg), "--output-dir", str(run))
    losses = [float(line.split(",")[1]) for line in (run / "loss.csv").read_text().splitlines()]
    assert len(losses) == 3 and all(0 < v < 10 for v in losses)
    unet = DiffusionPipeline.from_pretrained(run / "model").unet
    assert all(torch.isfinite(p).all() for p in unet.parameters())
    # the same 3 steps in fp32 (same data, noise and init): fp16 autocast only rounds differently
    ref_run = tmp_path / "fp32"
    cli("train", "--config", str(write_config(tmp_path / "f.yaml", train={"max_steps": 3})), "--output-dir", str(ref_run))
    ref = [float(line.split(",")[1]) for line in (ref_run / "loss.csv").read_text().splitlines()]
    assert losses == pytest.approx(ref, rel=0.02)


def test_resume_latest_without_a_checkpoint_starts_fresh(tmp_path):
    # a preemptible job passes the same command every time, the first sitting included
    cfg = write_config(tmp_path / "c.yaml", train={"max_steps": 2})
    run = tmp_path / "run"
    res = cli("train", "--config", str(cfg), "--output-dir", str(run), "--resume", "latest")
    assert "no checkpoint" in res.stderr and "starting a new run" in res.stderr
    assert (run / "model" / "unet" / "config.json").is_file()
    assert json.loads((run / "train_summary.json").read_text())["step"] == 2


def test_init_from_starts_at_a_model_folders_weights(tmp_path):
    first = tmp_path / "first"
    cli("train", "--config", str(write_config(tmp_path / "a.yaml", train={"max_steps": 2})), "--output-dir", str(first))
    # LR 0 at the first warm-up step: one step leaves the weights, and their fresh EMA, where they started
    second = tmp_path / "second"
    cfg = write_config(tmp_path / "b.yaml", train={"max_steps": 1}, diffusion={"prediction_type": "v_prediction"})
    res = cli("train", "--config", str(cfg), "--output-dir", str(second), "--init-from", str(first / "model"))
    assert "initialised from" in res.stderr
    start = load_file(str(first / "model" / "unet" / "diffusion_pytorch_model.safetensors"))
    end = load_file(str(second / "model" / "unet" / "diffusion_pytorch_model.safetensors"))
    assert start.keys() == end.keys() and all(torch.equal(start[k], end[k]) for k in start)
    other = write_config(tmp_path / "c.yaml", model={"base_channels": 8})
    res = cli("train", "--config", str(other), "--output-dir", str(tmp_path / "x"), "--init-from", str(first / "model"), check=False)
    assert res.returncode == 2 and "another architecture (base_channels: 16 there, 8 here)" in res.stderr
    res = cli("train", "--config", str(cfg), "--output-dir", str(tmp_path / "y"), "--init-from", str(tmp_path), check=False)
    assert res.returncode == 2 and "not a model folder" in res.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y" / "checkpoints").exists()


@pytest.mark.parametrize("before, after", [(3, 5), (5, 3), (3, None), (None, 4), (3, 3)])
def test_init_from_another_class_count_keeps_old_classes_and_starts_new_ones_unconditional(before, after):
    arch = dict(sample_size=8, base_channels=16, channel_mult=(1, 2), attention_resolutions=(4,), norm_num_groups=8)
    torch.manual_seed(0)
    old = UNet(**arch, num_class_embeds=before).eval()
    if before:  # a trained table: every row different
        torch.nn.init.normal_(old.class_embed.weight)
    new = UNet(**arch, num_class_embeds=after).eval()
    new.load_state_dict(adapt_classes({k: v.clone() for k, v in old.state_dict().items()}, after))
    x, t = torch.randn(2, 3, 8, 8), torch.tensor([10, 700])

    def out(model, label):
        return model(x, t, class_labels=None if label is None else torch.tensor([label, label])).sample

    with torch.no_grad():
        unconditional = out(old, None)  # no label: the "no class" row
        torch.testing.assert_close(out(new, None), unconditional, rtol=1e-5, atol=1e-6)
        for label in range(after or 0):
            want = out(old, label) if label < (before or 0) else unconditional  # kept row, or a new class
            torch.testing.assert_close(out(new, label), want, rtol=1e-5, atol=1e-6)
        if before and after and after > 1:  # the kept classes stay apart
            assert not torch.allclose(out(new, 0), out(new, 1))


def test_init_from_a_model_with_other_classes_trains(tmp_path):
    first = tmp_path / "first"
    cli("train", "--config", str(write_config(tmp_path / "a.yaml", train={"max_steps": 1})), "--output-dir", str(first))
    cfg = write_config(tmp_path / "b.yaml", model={"num_class_embeds": 6}, train={"max_steps": 1})
    res = cli("train", "--config", str(cfg), "--output-dir", str(tmp_path / "second"), "--init-from", str(first / "model"))
    assert "initialised from" in res.stderr
    end = load_file(str(tmp_path / "second" / "model" / "unet" / "diffusion_pytorch_model.safetensors"))
    assert end["class_embed.weight"].shape[0] == 7  # 6 classes and "no class"


def test_fid_during_training_logs_and_keeps_the_best(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", data={"num_images": 96, "val_size": 8},
                       train={"max_steps": 4, "fid_every": 2, "fid_samples": 4, "sample_steps": 2, "keep_best": True})
    run = tmp_path / "run"
    cli("train", "--config", str(cfg), "--output-dir", str(run))
    rows = (run / "fid.csv").read_text().splitlines()
    assert rows[0] == "step,fid,num_samples" and [r.split(",")[0] for r in rows[1:]] == ["2", "4"]
    scores = [float(r.split(",")[1]) for r in rows[1:]]
    assert all(s > 0 for s in scores)
    best = json.loads((run / "best-model" / "fid.json").read_text())
    assert best["fid"] == pytest.approx(min(scores), abs=1e-3) and best["num_samples"] == 4
    assert (run / "best-model" / "unet" / "config.json").is_file()
    from denoiser.evaluate.fid import Statistics

    assert Statistics.load(run / "fid-reference.safetensors").num_images == 8  # the run's validation split
    bad = write_config(tmp_path / "b.yaml", train={"keep_best": True})
    res = cli("train", "--config", str(bad), "--output-dir", str(tmp_path / "x"), check=False)
    assert res.returncode == 2 and "keep_best needs train.fid_every" in res.stderr


def test_gradient_checkpointing_trains_the_same_weights(tmp_path):
    plain, ckpt = tmp_path / "plain", tmp_path / "ckpt"
    cli("train", "--config", str(write_config(tmp_path / "a.yaml", train={"max_steps": 3})), "--output-dir", str(plain))
    cfg = write_config(tmp_path / "b.yaml", train={"max_steps": 3, "gradient_checkpointing": True})
    cli("train", "--config", str(cfg), "--output-dir", str(ckpt))
    a, b = weights(plain), weights(ckpt)
    assert all(torch.equal(a[k], b[k]) for k in a)  # recomputed activations are the same numbers
    assert yaml.safe_load((ckpt / "config.yaml").read_text())["train"]["gradient_checkpointing"] is True


def test_a_run_folder_from_before_new_config_keys_still_resumes(tmp_path):
    """A config.yaml written before data.image_column etc. existed: the missing keys count as their defaults."""
    from denoiser.train.config import config_from_dict
    from denoiser.train.run_dir import prepare_output_dir

    cfg = config_from_dict(yaml.safe_load(write_config(tmp_path / "c.yaml").read_text()))
    old = cfg.to_dict()
    for key in ("image_column", "label_column", "split", "num_workers"):
        del old["data"][key]
    del old["train"]["report_to"]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(old))
    prepare_output_dir(tmp_path / "run", cfg, resuming=True, overwrite=False)  # no "different config" error
    cfg.data.image_column = "picture"
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(old))
    with pytest.raises(ValueError, match="differs in: data.image_column"):
        prepare_output_dir(tmp_path / "run", cfg, resuming=True, overwrite=False)


def test_a_flat_photo_folder_with_a_broken_file_trains_unconditionally(tmp_path):
    import numpy as np
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(20):
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(photos / f"{i:02d}.jpg")
    (photos / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    model = {k: v for k, v in yaml.safe_load(write_config(tmp_path / "c0.yaml").read_text())["model"].items()
             if k != "num_class_embeds"}
    cfg = tmp_path / "c.yaml"
    raw = yaml.safe_load(write_config(tmp_path / "c1.yaml", data={"dataset": "folder", "path": str(photos), "val_size": 4},
                                      train={"max_steps": 2, "checkpoint_every": 2}).read_text())
    raw["model"] = model
    cfg.write_text(yaml.safe_dump(raw))
    res = cli("train", "--config", str(cfg), "--output-dir", str(tmp_path / "run"), env={"DENOISER_CACHE": str(tmp_path / "cache")})
    line = next(x for x in res.stderr.splitlines() if "skipped" in x)
    assert "skipped 1 of 21 files: see" in line and line.endswith("skipped.txt")
    listed = (tmp_path / "cache").glob("data/*/skipped.txt")
    assert "broken.jpg" in next(listed).read_text()
    assert (tmp_path / "run" / "model" / "model_index.json").is_file()
    assert not (tmp_path / "run" / "model" / "classes.txt").exists()  # a flat folder: unconditional


def test_a_failed_summary_keeps_the_previous_one(tmp_path, monkeypatch):
    from pathlib import Path

    from accelerate.state import AcceleratorState

    from denoiser.atomic import is_temporary
    from denoiser.train.config import load_config
    from denoiser.train.loop import train

    cfg, run = write_config(tmp_path / "c.yaml", train={"max_steps": 2}), tmp_path / "run"
    original = Path.write_text

    def half_then_fail(self, *args, **kwargs):  # a full disk or a killed process, midway through the summary
        if "train_summary.json" not in self.name:
            return original(self, *args, **kwargs)
        self.write_bytes(b'{"step": ')
        raise OSError(28, "No space left on device")

    try:
        train(load_config(cfg), run)
        AcceleratorState._reset_state(reset_partial_state=True)
        before = (run / "train_summary.json").read_text()
        monkeypatch.setattr(Path, "write_text", half_then_fail)
        with pytest.raises(OSError, match="No space"):
            train(load_config(cfg, ["train.max_steps=3"]), run, resume="latest")
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert (run / "train_summary.json").read_text() == before and json.loads(before)["step"] == 2
    assert not [p.name for p in run.iterdir() if is_temporary(p.name)]
