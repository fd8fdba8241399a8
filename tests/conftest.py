from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# training-data stores (denoiser/data/store.py) of this session's tmp folders: never in the user's cache
os.environ["DENOISER_CACHE"] = tempfile.mkdtemp(prefix="denoiser-test-cache-")
# every test runs in float32 unless it asks otherwise: a suite's result must not depend on which precision this machine
# decided (denoiser.fast.precision: bf16 autocast on some CPUs); tests/fast/test_precision.py drives the decision itself
os.environ["DENOISER_PRECISION"] = "float32"

import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

pytest_plugins = ["tests.app.browser"]  # the app's server and browser fixtures

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs files on 2 workers (pytest-xdist): one core each, not 2 threads each
    torch.set_num_threads(1)

# make test's longest files by their path under tests/ (rooms may share a file name), longest first (seconds on 2
# workers, AVX2 Zen 3, 2026-12-07): the workers take them first and end together on the short ones, where xdist's own
# order (most tests first) left one worker alone on the walk for the last 80 s. The order only schedules; a file
# missing here runs after these
LONGEST_FILES = ("app/test_sample.py", "app/test_photo_tab.py", "train/test_distributed.py", "app/test_app.py",  # 206..89 s
                 "app/test_serve.py", "train/test_loop.py", "app/test_walk.py", "project/test_doc_commands.py",  # 78..60 s
                 "project/test_same_pixels.py", "app/test_photo_tab_page.py",  # ~60 s
                 "app/test_text.py", "project/test_install.py", "app/test_word_edit.py", "app/test_attention_tab.py")  # 49..33 s


def pytest_collection_modifyitems(items: list) -> None:
    """The longest files first (LONGEST_FILES; `make test` passes --no-loadscope-reorder to keep this order)."""
    rank = {name: k for k, name in enumerate(LONGEST_FILES)}
    here = Path(__file__).resolve().parent
    items.sort(key=lambda item: rank.get(item.path.relative_to(here).as_posix(), len(rank)))


TINY = dict(
    sample_size=16, base_channels=16, channel_mult=(1, 2), layers_per_block=1, attention_resolutions=(8,),
    mid_attention=True, num_heads=2, norm_num_groups=8,
)


def _kernels_here() -> tuple[bool, str | None]:
    from denoiser.fast.kernels import kernel_error, load_kernels

    return load_kernels(), kernel_error()


# Tests of a C++ kernel run where it is built (`make venv` builds it) and skip, saying why, elsewhere
# (no compiler, DENOISER_KERNELS=0): a kernel test never compares a fallback with itself.
_KERNELS_LOADED, _KERNEL_ERROR = _kernels_here()
needs_kernels = pytest.mark.skipif(not _KERNELS_LOADED, reason=f"denoiser's C++ kernels are not loaded here: {_KERNEL_ERROR}")


def generators(seed: int, n: int) -> list[torch.Generator]:
    """The seed rule (denoiser.request): image k of a request with seed S has its own generator, seeded S + k."""
    return [torch.Generator().manual_seed(seed + k) for k in range(n)]


def seeded_noise(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """(B, ...) starting noise as the seed rule draws it: image k from generators(seed, B)[k]."""
    return torch.cat([torch.randn((1, *shape[1:]), generator=g) for g in generators(seed, shape[0])])


@contextlib.contextmanager
def unet_calls(unet: torch.nn.Module):
    """A list that fills with the rows of each call of `unet` while the context is open."""
    rows: list[int] = []
    hook = unet.register_forward_pre_hook(lambda m, args: rows.append(args[0].shape[0]))
    try:
        yield rows
    finally:
        hook.remove()


@pytest.fixture
def prompt_reads(monkeypatch):
    """How many times each prompt is parsed (`denoiser.sampling.prompt_weights.parse_prompt`), counted in every
    denoiser module that holds the parser by name: a Counter, prompt -> reads."""
    from collections import Counter

    import denoiser.sampling.prompt_weights as prompt_weights

    read, parse = Counter(), prompt_weights.parse_prompt

    def counted(prompt):
        read[prompt] += 1
        return parse(prompt)

    for name, module in list(sys.modules.items()):
        if name.startswith("denoiser") and getattr(module, "parse_prompt", None) is parse:
            monkeypatch.setattr(module, "parse_prompt", counted)
    return read


def random_text_model(folder: Path, width: int = 12) -> Path:
    """A tiny text model folder (UNet with cross-attention, hashed-word encoder of `width`, tokenizer) with random
    weights everywhere, the zero-initialised output projections included, so maps and bounds are not flat."""
    from diffusers import DDPMScheduler

    from denoiser import UNet
    from denoiser.model.text import HashTextEncoder, WordHashTokenizer
    from denoiser.sampling.pipeline import save_pipeline

    torch.manual_seed(0)
    unet = UNet(**TINY, cross_attention_dim=width).eval()
    encoder = HashTextEncoder(num_buckets=64, hidden_size=width, num_layers=1, num_heads=2).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in [*unet.parameters(), *encoder.parameters()]:
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return save_pipeline(unet, DDPMScheduler(), folder, text_encoder=encoder, tokenizer=WordHashTokenizer(num_buckets=64))


@pytest.fixture
def tiny_unet():
    torch.manual_seed(0)
    from denoiser import UNet

    return UNet(**TINY).eval()


@pytest.fixture
def class_unet():
    """A tiny class-conditional UNet (3 classes): guidance and sampling tests."""
    torch.manual_seed(0)
    from denoiser import UNet

    return UNet(**TINY, num_class_embeds=3).eval()


@pytest.fixture
def guide_unet():
    """A smaller model of the same data as class_unet: autoguidance's guide."""
    torch.manual_seed(1)
    from denoiser import UNet

    return UNet(**{**TINY, "base_channels": 8, "norm_num_groups": 4}, num_class_embeds=3).eval()


ROOT = Path(__file__).resolve().parent.parent

# A config small enough that a training step takes milliseconds; dropout off so runs compare exactly.
TRAIN_CONFIG = {
    "model": {
        "sample_size": 8, "base_channels": 16, "channel_mult": [1, 2], "layers_per_block": 1,
        "attention_resolutions": [4], "num_heads": 2, "norm_num_groups": 8, "num_class_embeds": 4,
    },
    "data": {"num_images": 96, "val_size": 8},
    "train": {
        "batch_size": 8, "max_steps": 6, "lr": 0.001, "lr_scheduler": "constant_with_warmup", "lr_warmup_steps": 4,
        "checkpoint_every": 2, "sample_every": 0, "num_sample_images": 4, "sample_steps": 2, "channels_last": False,
    },
}


def photo_folder(root: Path, n: int = 6, size: tuple[int, int] = (18, 24), classes: tuple[str, str] = ("dogs", "cats"),
                 spread: tuple[int, int, int, int] = (60, 40, 30, 90)) -> Path:
    """n small JPEGs of distinct colours in two class folders (odd images in classes[1]); returns root.
    spread: (noise amplitude, red step, green step, blue) of image i's colour (a·noise + (r·i, 200 - g·i, b))."""
    import numpy as np
    from PIL import Image

    amp, r, g, b = spread
    rng = np.random.default_rng(0)
    for i in range(n):
        arr = (rng.random((*size, 3)) * amp + np.array([r * i, 200 - g * i, b])).clip(0, 255).astype(np.uint8)
        path = root / classes[i % 2] / f"{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).save(path, quality=90)
    return root


def write_config(path: Path, **sections) -> Path:
    """TRAIN_CONFIG with section updates, e.g. write_config(p, train={"max_steps": 3})."""
    cfg = {k: dict(v) for k, v in TRAIN_CONFIG.items()}
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    path.write_text(yaml.safe_dump(cfg))
    return path


def cli(*args: str, launcher: list[str] | None = None, env: dict | None = None, check: bool = True, timeout: int = 300):
    """Run `denoiser ...` in a process of its own (optionally under a launcher), returning the CompletedProcess: a fork
    of a process that has imported torch and the rest (tests/forked_cli.py: 5 s less a command), or a new interpreter
    under a launcher or with an environment of its own."""
    from tests import forked_cli

    cmd = (launcher or [sys.executable, "-m", "denoiser.cli.main"]) + list(args)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    res = None if launcher else forked_cli.run(list(args), str(ROOT), full_env, timeout)
    if res is None:
        res = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


def app_page(root):
    """The web app's page of the model folders under `root`, built as a server builds it (denoiser.app.layout.build_page):
    its tabs' job handlers yield updates keyed by their components (page.tab(SampleTab).status, page.generation)."""
    from denoiser.app.engine import Engine
    from denoiser.app.layout import build_page

    return build_page(Engine(root))
