"""denoiser/train/run_dir.py: run_info.json keeps one entry per sitting, and a write that fails keeps the earlier ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from denoiser.train.config import RunConfig
from denoiser.train.run_dir import write_run_info


def test_each_sitting_adds_an_entry(tmp_path):
    write_run_info(tmp_path, RunConfig(), 1)
    write_run_info(tmp_path, RunConfig(), 2)
    runs = json.loads((tmp_path / "run_info.json").read_text())
    assert [r["processes"] for r in runs] == [1, 2]
    assert {"started", "git_commit", "torch", "diffusers", "accelerate"} <= set(runs[0])


def test_a_write_killed_midway_keeps_the_earlier_sittings(tmp_path, monkeypatch):
    write_run_info(tmp_path, RunConfig(), 1)
    before = (tmp_path / "run_info.json").read_text()

    def half_then_fail(self: Path, data: str, *args, **kwargs) -> int:
        with open(self, "w") as f:  # a disk that fills up (or a kill) halfway through the file
            f.write(data[: len(data) // 2])
        raise OSError("No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        write_run_info(tmp_path, RunConfig(), 2)
    monkeypatch.undo()
    assert (tmp_path / "run_info.json").read_text() == before  # written directly, it would be half a JSON list
    assert [p.name for p in tmp_path.iterdir()] == ["run_info.json"]  # no temporary left behind
