"""The "same pixels" promises (docs/reproducibility.md) across separate processes, as a person meets them: one
`denoiser sample` command run again and again, now and then beside a busy CPU, at another --batch-size, gives the same
files byte for byte, for both shipped models, in the precision this machine decided (denoiser.fast.precision)."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from tests.conftest import ROOT, cli

# the shipped models, each with what a person would ask of it
MODELS = {"cifar10": ["--class-label", "cat"], "emoji": ["--prompt", "red heart"]}


def _busy_cpu() -> list[subprocess.Popen]:
    """A process spinning on a core: the load under which a precision re-timed per process flipped."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])]


def _files(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.png"))}


@pytest.mark.slow  # three new interpreters a model
@pytest.mark.parametrize("model", MODELS)
def test_one_command_gives_the_same_files_run_after_run_busy_or_not_at_any_batch_size(model, tmp_path):
    # each run differs from the first in one thing: the batch size, then the load
    runs = {"quiet, batch 3": (3, False), "quiet, batch 2": (2, False), "busy, batch 3": (3, True)}
    seen = {}
    for name, (batch, busy) in runs.items():
        out = tmp_path / name.replace(", ", "-").replace(" ", "")
        spinning = _busy_cpu() if busy else []
        try:  # a new interpreter each time, in this machine's own precision (auto: not the suite's float32)
            res = cli("sample", "--model", f"weights/{model}", *MODELS[model], "--num-images", "3", "--steps", "3",
                      "--seed", "3", "--batch-size", str(batch), "--out-dir", str(out),
                      launcher=[sys.executable, "-m", "denoiser.cli"], env={"DENOISER_PRECISION": "auto"})
        finally:
            for p in spinning:
                p.kill()
                p.wait()
        assert "this machine's" in res.stdout or "no native bfloat16" in res.stdout, res.stdout  # auto ran
        seen[name] = _files(out)
        assert len(seen[name]) == 3, f"{name}: {sorted(seen[name])}"
    first = next(iter(seen.values()))
    differ = {name: sorted(k for k in files if files[k] != first[k]) for name, files in seen.items() if files != first}
    assert not differ, f"weights/{model}: files that differ from the first run's: {differ}"


def test_the_promises_page_names_a_test_that_exists_for_each_promise():
    """docs/reproducibility.md lists each promise with the tests that hold it: every one it names exists."""
    import re

    text = (ROOT / "docs" / "reproducibility.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)", text)
    assert len(named) >= 4, named
    missing = [f"{f}::{t}" for f, t in named if not re.search(rf"^def {t}\(", (ROOT / f).read_text(), re.M)]
    assert not missing, f"docs/reproducibility.md names tests that do not exist: {missing}"
