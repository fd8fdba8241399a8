"""Model folders read (denoiser/folders/model_dir.py): loads from several threads at once (the app's) leave torch as they found it."""

from __future__ import annotations

import threading

import torch
from diffusers import DDPMScheduler

from denoiser.folders.model_dir import load_model, load_text
from denoiser.model.text import HashTextEncoder, WordHashTokenizer
from denoiser.model.unet import UNet
from denoiser.sampling.pipeline import save_pipeline
from tests.conftest import TINY


def test_loads_in_several_threads_at_once_leave_module_construction_alone(tmp_path):
    torch.manual_seed(0)
    encoder = HashTextEncoder(num_buckets=64, hidden_size=12, num_layers=1, num_heads=2)
    folder = save_pipeline(UNet(**TINY, cross_attention_dim=12), DDPMScheduler(), tmp_path / "m", text_encoder=encoder,
                           tokenizer=WordHashTokenizer(num_buckets=64))
    register = torch.nn.Module.register_parameter
    start, errors, loaded = threading.Barrier(4), [], []

    def load() -> None:
        try:
            start.wait()
            for _ in range(3):
                loaded.append(load_model(folder)[0])
                loaded.append(load_text(folder).encoder)
        except Exception as err:  # noqa: BLE001  (reported below)
            errors.append(err)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # accelerate's init_empty_weights swaps this for a meta-device one while a load runs; interleaved loads could
    # "restore" the swapped one for good, and every later module would be built on meta
    assert torch.nn.Module.register_parameter is register
    assert torch.nn.Linear(2, 2).weight.device.type == "cpu"
    assert all(p.device.type == "cpu" for m in loaded for p in m.parameters())
