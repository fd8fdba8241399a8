"""tools/gpu/knee.py: the lr, warm-up and batch a lent GPU trains at from the throughput knee bench.train_mfu measured."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tools.gpu import knee as knee_module


@pytest.mark.parametrize("rule, lr", [("sqrt", 4e-4), ("linear", 8e-4), ("none", 2e-4)])
def test_the_rule_scales_the_lr_and_keeps_the_warm_up_in_images(rule, lr):
    got = knee_module.at_knee(2048, batch_ref=512, lr_ref=2e-4, warmup_ref=100, rule=rule)
    assert got == {"train.batch_size": 2048, "train.lr": pytest.approx(lr), "train.lr_warmup_steps": 25}
    with pytest.raises(ValueError, match="rule must be one of"):
        knee_module.at_knee(2048, 512, 2e-4, 100, rule="cubic")


def test_the_command_reads_the_reference_after_the_runs_overrides(tmp_path):
    measured = tmp_path / "knee.json"
    measured.write_text(json.dumps({"knee": 1024, "batch": 1024, "img_per_s": {"fast": 5000.0}}))
    # as tools/gpu/run.sh calls it: the config checked with the run's data folder
    out = subprocess.run([sys.executable, "-m", "tools.gpu.knee", str(measured), "cifar10",
                          "--set", f"data.path={tmp_path}", "--set", "data.val_size=0",
                          "--set", "train.batch_size=256", "--set", "train.lr=0.0001"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    # the linear rule: 4x the batch, 4x the lr; cifar10's warm-up, 200 steps of 256 images, is 50 steps of 1024
    assert out == ["train.batch_size=1024", "train.lr=0.0004", "train.lr_warmup_steps=50"]
