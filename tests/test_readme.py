"""The README's code runs as written: the "UNet in your own diffusers pipeline" block, line for line."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # samples the shipped CIFAR-10 model and compiles it (~1 minute on 2 cores)


def _python_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_pipeline_export_compile_checkpointing_block_runs(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the block names weights/cifar10 relative to a clone
    code = _python_block("### The UNet in your own diffusers pipeline")
    scope: dict = {}
    torch._dynamo.reset()
    exec(compile(code, "README.md", "exec"), scope)
    assert type(scope["pipe"]).__name__ == "DenoiserPipeline"
    assert "'airplane', 'automobile'" in capsys.readouterr().out
    assert len(scope["images"]) == 4 and scope["images"][0].size == (32, 32)
    arrays = scope["arrays"]
    assert isinstance(arrays, np.ndarray) and arrays.shape == (4, 32, 32, 3) and 0 <= arrays.min() <= arrays.max() <= 1
    assert isinstance(scope["exported"], torch.export.ExportedProgram)
    assert scope["eps"].shape == (2, 3, 32, 32)
    unet = scope["unet"]
    assert unet.is_gradient_checkpointing and all(p.grad is not None for p in unet.parameters() if p.requires_grad)
    assert unet.conv_in.weight.dtype == torch.float8_e4m3fn  # layerwise casting: stored in fp8
