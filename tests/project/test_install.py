"""The package as a user installs it: a wheel built from the project, installed into a folder of its own and run
from a directory outside the checkout, with the source tree off sys.path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from denoiser.cli.main import DEFAULT_MODEL
from tests.conftest import ROOT

pytestmark = pytest.mark.slow
SHAPES = ROOT / "weights" / "synthetic-shapes"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, install target, a working directory outside the checkout, a models folder)."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"  # a copy: building writes build/ and *.egg-info next to the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "denoiser", "configs"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, src / name, **({"symlinks": True, "ignore": shutil.ignore_patterns("__pycache__")}
                                         if copy is shutil.copytree else {}))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)], check=True,
                   capture_output=True, timeout=300)
    wheel, = (tmp / "dist").glob("attention_denoiser-*.whl")
    target = tmp / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)], check=True,
                   capture_output=True, timeout=300)
    models = tmp / "models"
    shutil.copytree(SHAPES, models / "synthetic-shapes")
    shutil.copytree(ROOT / "weights" / DEFAULT_MODEL, models / DEFAULT_MODEL)  # what `denoiser sample` finds by name
    work = tmp / "elsewhere"
    work.mkdir()
    return wheel, target, work, models


def run_installed(installed, *args: str, env: dict | None = None, script: bool = True) -> subprocess.CompletedProcess:
    """`denoiser ARGS` (the installed console script) or `python -c ARGS[0]`, run by `python -S` so that no .pth file
    (the checkout's editable install) runs: sys.path is the install target and the dependencies, nothing else."""
    _, target, work, _ = installed
    deps = sysconfig.get_paths()["purelib"]
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DENOISER_WEIGHTS")}
    full_env.update({"PYTHONPATH": os.pathsep.join([str(target), deps]), "OMP_NUM_THREADS": "1", **(env or {})})
    cmd = [sys.executable, "-S", str(target / "bin" / "denoiser"), *args] if script else [sys.executable, "-S", "-c", *args]
    return subprocess.run(cmd, cwd=work, env=full_env, capture_output=True, text=True, timeout=300)


def test_wheel_holds_the_package_presets_and_kernel_sources_only(installed):
    wheel = installed[0]
    names = zipfile.ZipFile(wheel).namelist()
    assert "denoiser/app/layout.py" in names and "denoiser/presets/cifar10.yaml" in names
    assert "denoiser/fast/csrc/attention_small_head.cpp" in names
    assert not [n for n in names if n.startswith(("tests/", "weights/", "bench/")) or n.endswith(".safetensors")]
    assert wheel.stat().st_size < 1_000_000
    assert wheel.name.startswith("attention_denoiser-")  # our own distribution name; the import name is denoiser


def test_gradio_is_the_app_extra_and_nothing_else_needs_it(installed):
    """pip install attention-denoiser gives the UNet, the pipeline, training and the CLI; [app] adds Gradio."""
    meta = next(zipfile.ZipFile(installed[0]).read(n).decode() for n in zipfile.ZipFile(installed[0]).namelist()
                if n.endswith(".dist-info/METADATA"))
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist: gradio")]
    assert requires and all("extra == \"app\"" in line or "extra == \"dev\"" in line for line in requires), requires
    assert "Provides-Extra: app" in meta


def test_imports_come_from_the_install_not_the_checkout(installed):
    res = run_installed(installed, "import denoiser, json, sys; print(denoiser.__file__); print(json.dumps(sys.path))",
                        script=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].startswith(str(installed[1]))
    entries = [Path(p or installed[2]).resolve() for p in json.loads(res.stdout.splitlines()[1])]
    assert ROOT not in entries and not (Path(installed[2]) / "denoiser").exists()


def test_sample_by_folder_and_by_name_and_the_error_says_where_it_looked(installed):
    _, _, work, models = installed
    res = run_installed(installed, "sample", "--model", str(models / "synthetic-shapes"), "--out", "a.png",
                        "--num-images", "2", "--steps", "2")
    assert res.returncode == 0, res.stderr
    assert (work / "a.png").is_file()
    res = run_installed(installed, "sample", "--out", "b.png", "--num-images", "2", "--steps", "2",
                        env={"DENOISER_WEIGHTS": str(models)})  # the default model, found by name
    assert res.returncode == 0, res.stderr
    res = run_installed(installed, "sample", "--out", "c.png", "--num-images", "1", "--steps", "1")
    assert res.returncode == 2 and f"unknown model '{DEFAULT_MODEL}'" in res.stderr and "DENOISER_WEIGHTS" in res.stderr
    assert "Traceback" not in res.stderr and not (work / "c.png").exists()


def test_presets_ship_and_app_help_runs(installed):
    _, _, work, _ = installed
    res = run_installed(installed, "train", "--config", "tiny", "--output-dir", "run", "--max-steps", "1",
                        "--set", "data.num_images=64", "--set", "data.val_size=8", "--set", "train.batch_size=8",
                        "--set", "train.sample_every=0", "--set", "train.checkpoint_every=1")
    assert res.returncode == 0, res.stderr[-2000:]
    assert (work / "run" / "model" / "unet" / "config.json").is_file()
    res = run_installed(installed, "train", "--config", "nope", "--output-dir", "run2")
    assert res.returncode == 2 and "presets: cifar10" in res.stderr
    res = run_installed(installed, "app", "--help")
    assert res.returncode == 0 and "--weights" in res.stdout and "DENOISER_WEIGHTS" in res.stdout


def test_pipeline_with_class_labels_from_the_install(installed):
    models = installed[3]
    code = (
        "import denoiser, torch; from diffusers import DiffusionPipeline\n"
        f"pipe = DiffusionPipeline.from_pretrained({str(models / 'synthetic-shapes')!r})\n"
        "pipe.set_progress_bar_config(disable=True)\n"
        "out = pipe(2, class_labels=['circle', 'cross'], num_inference_steps=2, output_type='np').images\n"
        "print(type(pipe).__name__, out.shape, pipe.classes)"
    )
    res = run_installed(installed, code, script=False)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "DenoiserPipeline (2, 16, 16, 3) ['circle', 'square', 'triangle', 'cross']" in res.stdout
