"""The training fast path inside the one TrainLoop: reads of the loss every train.log_every steps (a non-finite loss
still stops the run, late but before anything of it is saved), inputs made on the device equal the host's, a compiled
step equals an eager one, and the EMA lengths tracked in one run equal separate runs' EMAs."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file

from denoiser.data import open_training_data
from denoiser.diffusion import Diffusion
from denoiser.model.text import WordHashTokenizer
from denoiser.train.batch import StepInputs, with_draws
from denoiser.train.config import load_config
from denoiser.train.loop import TrainingError, TrainLoop, train
from tests.conftest import write_config
from tests.train.test_text import captioned_folder, reset_accelerate, text_config


@pytest.fixture(autouse=True)
def one_thread():
    """In this process on one thread (a tiny model only loses to thread hand-offs); Accelerate's process-wide state
    reset after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    reset_accelerate()


def unet_weights(folder):
    return load_file(str(folder / "unet" / "diffusion_pytorch_model.safetensors"))


def test_a_nan_loss_stops_the_run_at_the_next_read_without_saving_it(tmp_path):
    cfg = load_config(write_config(tmp_path / "c.yaml", train={"lr": 30.0, "max_grad_norm": None, "log_every": 4,
                                                              "checkpoint_every": 3, "max_steps": 50, "report_to": None}))
    run = tmp_path / "run"
    with pytest.raises(TrainingError) as err:
        train(cfg, run)
    found = re.search(r"loss is (nan|inf) at step (\d+) \(read at step (\d+)\); stopped without saving this state", str(err.value))
    assert found, str(err.value)
    bad, read = int(found[2]), int(found[3])
    assert 0 <= read - bad < 4 and (read % 4 == 0 or read % 3 == 0)  # at most log_every steps late, at a read
    kept = sorted((run / "checkpoints").iterdir())
    assert kept  # lr 30 in 4 warm-up steps: the loss turns non-finite after the first checkpoints
    assert all(int(p.name.split("-")[1]) < bad for p in kept)  # nothing from the bad step on was saved
    for p in kept:
        assert all(torch.isfinite(t).all() for t in load_file(str(p / "model.safetensors")).values())
    steps = [int(line.split(",")[0]) for line in (run / "loss.csv").read_text().splitlines()]
    assert steps == list(range(1, bad))  # every good step has its row, read in batches
    assert not (run / "model").exists()


def _inputs(cfg, rank: int, world: int, device_data: bool, tokenizer=None):
    cfg.train.device_data = device_data
    data = open_training_data(cfg.data, cfg.model["sample_size"], seed=cfg.train.seed, batch_size=cfg.train.batch_size,
                              rank=rank, world=world, caption_dropout=cfg.train.caption_dropout)
    conditional = bool(cfg.model.get("num_class_embeds"))
    return StepInputs(data, Diffusion.from_config(cfg.diffusion), cfg, conditional, tokenizer, torch.device("cpu")), data


@pytest.mark.parametrize("text", [False, True], ids=["classes", "captions"])
def test_inputs_resident_on_the_device_equal_the_hosts_on_every_process(tmp_path, text):
    if text:
        cfg = load_config(text_config(tmp_path / "c.yaml", captioned_folder(tmp_path / "data"), batch_size=8))
        tokenizer = WordHashTokenizer(**cfg.text.tokenizer_args())
    else:
        cfg = load_config(write_config(tmp_path / "c.yaml", data={"random_flip": True}))
        tokenizer = None
    whole, _ = _inputs(cfg, 0, 1, False, tokenizer)
    diffusion = Diffusion.from_config(cfg.diffusion)
    for step in (0, 1, 5, 13):  # into the second epoch and beyond
        host = whole(step)
        parts = []
        for rank in (0, 1):
            resident, data = _inputs(cfg, rank, 2, True, tokenizer)
            assert resident.resident is not None  # the split copied to the device once
            made = resident(step)
            # the same ids, pixels, labels (drops), noise, timesteps and caption tokens as the host path of that process
            reference = with_draws(data.batch(step), diffusion, cfg, resident.conditional, tokenizer)
            assert len(made) == len(reference) == (8 if text else 5)
            for a, b in zip(made, reference):
                assert torch.equal(a, b)
            parts.append(made)
        for k, v in enumerate(host[:5]):  # two processes' slices make up one process's global batch (tokens pad per batch)
            assert torch.equal(torch.cat([parts[0][k], parts[1][k]]), v)
    assert not torch.equal(whole(0)[3], whole(1)[3])  # each step its own noise


def test_a_resumed_run_with_device_data_ends_with_the_straight_runs_weights(tmp_path):
    cfg_file = write_config(tmp_path / "c.yaml", train={"device_data": True, "report_to": None})
    straight = train(load_config(cfg_file), tmp_path / "straight")
    reset_accelerate()
    train(load_config(cfg_file, ["train.max_steps=3"]), tmp_path / "split")
    reset_accelerate()
    resumed = train(load_config(cfg_file), tmp_path / "split", resume="latest")
    a, b = unet_weights(straight), unet_weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_compiled_step_matches_the_eager_step(tmp_path, monkeypatch):
    # The aot_eager backend traces the step's graphs (dynamo, AOTAutograd: the forward and backward a compiled run
    # executes) without generating code: inductor's first CPU compile of even this tiny UNet takes ~85 s on 2 cores.
    # Inductor's kernels are timed, and checked against eager, by bench/train_mfu.py --compile.
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: compile_(model, mode=mode, backend="aot_eager"))
    torch._dynamo.reset()
    cfg_file = write_config(tmp_path / "c.yaml", train={"max_steps": 2, "report_to": None})
    eager = TrainLoop(load_config(cfg_file), tmp_path / "eager", None, False, None)
    reset_accelerate()
    compiled = TrainLoop(load_config(cfg_file, ["train.compile=true"]), tmp_path / "compiled", None, False, None)
    assert hasattr(compiled.model, "_orig_mod")
    losses = []
    for loop in (eager, compiled):
        loop.begin()
        losses.append([loop.run_step()[0] for _ in range(2)])
        loop.end()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
    ours = dict(compiled.model._orig_mod.named_parameters())
    for name, p in eager.model.named_parameters():
        torch.testing.assert_close(ours[name], p, rtol=1e-4, atol=1e-5, msg=name)
    torch._dynamo.reset()


def test_ema_lengths_tracked_in_one_run_equal_separate_runs(tmp_path):
    common = {"max_steps": 5, "checkpoint_every": 3, "lr_warmup_steps": 1, "report_to": None, "ema_power": 1.0}
    extra = {"ema_max_decay": 0.9, "ema_extra_decays": [0.5], "ema_extra_powers": [0.5]}
    together = tmp_path / "together"
    cfg = load_config(write_config(tmp_path / "a.yaml", train={**common, **extra}))
    train(cfg, together)
    for folder, alone_train in (("model-ema-0.5", {"ema_max_decay": 0.5}), ("model-ema-power-0.5", {"ema_max_decay": 0.9,
                                                                                                    "ema_power": 0.5})):
        reset_accelerate()
        alone = tmp_path / folder
        train(load_config(write_config(tmp_path / f"{folder}.yaml", train={**common, **alone_train})), alone)
        a, b = unet_weights(together / folder), unet_weights(alone / "model")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), folder
        assert not torch.equal(a["conv_in.weight"], unet_weights(together / "model")["conv_in.weight"])  # lengths differ
    # a resumed run carries every length on
    reset_accelerate()
    split = tmp_path / "split"
    train(load_config(write_config(tmp_path / "s.yaml", train={**common, **extra, "max_steps": 3})), split)
    assert (split / "checkpoints" / "checkpoint-00000003" / "ema-2.safetensors").is_file()
    reset_accelerate()
    train(cfg, split, resume="latest")
    for folder in ("model", "model-ema-0.5", "model-ema-power-0.5"):
        a, b = unet_weights(together / folder), unet_weights(split / folder)
        assert all(torch.equal(a[k], b[k]) for k in a), folder


def test_ema_lengths_are_checked(tmp_path):
    with pytest.raises(ValueError, match=r"train.ema_extra_decays must be decays in \(0, 1\)"):
        load_config(write_config(tmp_path / "c.yaml", train={"ema_extra_decays": [0.9, 1.5]}))
    with pytest.raises(ValueError, match="train.ema_extra_powers must be positive"):
        load_config(write_config(tmp_path / "c.yaml", train={"ema_extra_powers": [0]}))
    with pytest.raises(ValueError, match="train.log_every must be >= 1"):
        load_config(write_config(tmp_path / "c.yaml", train={"log_every": 0}))
