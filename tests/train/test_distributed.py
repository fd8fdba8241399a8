"""Same command, any scale: 2 CPU processes (gloo) against one; SIGKILL at any moment, then resume."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT, cli, photo_folder, write_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launcher(processes: int) -> list[str]:
    # `accelerate launch --cpu --num_processes 2` starts ONE process; --multi_gpu with ACCELERATE_USE_CPU starts two.
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(_free_port()), "-m", "denoiser.train"]


def _final(run):
    return load_file(str(run / "checkpoints" / "checkpoint-00000006" / "model.safetensors"))


def test_two_processes_match_one_with_the_same_global_batch(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", train={"lr_scheduler": "cosine", "lr_warmup_steps": 2, "checkpoint_every": 3})
    one, two = tmp_path / "one", tmp_path / "two"
    cli("train", "--config", str(cfg), "--output-dir", str(one))
    # two processes, each with 2 accumulation steps of 2 images: still 8 images per optimizer step; and the fast path
    # (inputs resident on the device, the loss read every 4 steps) against the one process's host path
    cli("--config", str(cfg), "--output-dir", str(two), "--set", "train.gradient_accumulation_steps=2",
        "--set", "train.device_data=true", "--set", "train.log_every=4", launcher=_launcher(2), env={"ACCELERATE_USE_CPU": "true"})
    summary = json.loads((two / "train_summary.json").read_text())
    ranks = summary["per_rank"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["images"] == ranks[1]["images"] == 6 * 4  # 6 steps x 4 images each
    assert ranks[0]["index_checksum"] != ranks[1]["index_checksum"]  # different data on each rank
    assert summary["images_seen"] == json.loads((one / "train_summary.json").read_text())["images_seen"] == 48
    a, b = _final(one), _final(two)
    for k in a:
        if k.endswith("qkv.bias"):
            # The key bias adds the same q·b_k to every score of a query, which the softmax cancels:
            # its exact gradient is zero, so Adam turns rounding noise into ±lr steps. Skip that third.
            C = a[k].shape[0] // 3
            a[k], b[k] = torch.cat([a[k][:C], a[k][2 * C :]]), torch.cat([b[k][:C], b[k][2 * C :]])
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    # LR schedule length in optimizer steps, whatever the processes and accumulation
    s1 = json.loads((one / "checkpoints" / "checkpoint-00000006" / "state.json").read_text())
    s2 = json.loads((two / "checkpoints" / "checkpoint-00000006" / "state.json").read_text())
    assert s1["lr_scheduler"]["last_epoch"] == s2["lr_scheduler"]["last_epoch"] == 6
    assert s1["ema"]["optimization_step"] == s2["ema"]["optimization_step"] == 6


def _lines(path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def test_sigkill_at_any_moment_then_resume_completes(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", train={"max_steps": 40, "checkpoint_every": 1, "keep_checkpoints": 2})
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "denoiser.cli.main", "train", "--config", str(cfg), "--output-dir", str(run)]
    env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    killed = []
    # Kill once a given step is logged, after a jitter: lands mid-step and mid-checkpoint-write.
    for target, jitter in ((3, 0.0), (11, 0.021), (19, 0.043), (27, 0.09)):
        resume = ["--resume", "latest"] if list((run / "checkpoints").glob("checkpoint-*")) else []
        proc = subprocess.Popen(cmd + resume, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while _lines(run / "loss.csv") < target and proc.poll() is None and time.time() < deadline:
            time.sleep(0.005)
        time.sleep(jitter)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed.append(_lines(run / "loss.csv"))
        _, err = proc.communicate()
        assert b"Traceback" not in err, err.decode()[-2000:]
    assert len(killed) >= 3, killed
    res = cli("train", "--config", str(cfg), "--output-dir", str(run), "--resume", "latest")
    assert (run / "model" / "model_index.json").is_file()
    state = json.loads((run / "checkpoints" / "checkpoint-00000040" / "state.json").read_text())
    assert state["step"] == 40
    assert [int(x.split(",")[0]) for x in (run / "loss.csv").read_text().splitlines()] == list(range(1, 41))
    assert not list((run / "checkpoints").glob(".tmp-*"))  # leftovers of killed writes are cleaned up
    assert "Traceback" not in res.stderr


def test_sigterm_saves_a_checkpoint_and_exits(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", train={"max_steps": 100000, "checkpoint_every": 100000})
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "denoiser.cli.main", "train", "--config", str(cfg), "--output-dir", str(run)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # the loop installs its SIGTERM handler before step 1, so a second row of loss.csv means the handler is in place
    deadline = time.time() + 120
    while _lines(run / "loss.csv") < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"training ended before the signal:\n{proc.communicate()[1][-2000:]}"
    assert _lines(run / "loss.csv") >= 2, "no training step logged within 120 s"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "checkpoint saved" in err
    saved = list((run / "checkpoints").glob("checkpoint-*"))
    assert len(saved) == 1 and (saved[0] / "state.json").is_file()


def test_cpu_launch_with_more_processes_than_started_warns(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", train={"max_steps": 1, "checkpoint_every": 1})
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "denoiser.train"]
    res = cli("--config", str(cfg), "--output-dir", str(tmp_path / "run"), launcher=launcher)
    assert "accelerate launch asked for 2 processes but 1 started" in res.stderr
    assert "ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2" in res.stderr
    assert json.loads((tmp_path / "run" / "train_summary.json").read_text())["per_rank"][0]["rank"] == 0  # it still trains


def test_launch_warning_reads_the_launcher_command_line():
    from denoiser.train.launch import launch_warning, requested_processes

    assert requested_processes(["accelerate", "launch", "--num-processes=4", "x.py"]) == 4
    assert requested_processes(["accelerate", "launch", "x.py"]) is None
    assert launch_warning(2, ["/bin/python", "accelerate", "launch", "--multi_gpu", "--num_processes", "2"]) is None
    assert "check the devices" in launch_warning(1, ["/bin/python", "accelerate", "launch", "--num_processes", "2"])
    assert launch_warning(1, ["/bin/bash", "run.sh", "--num_processes", "2"]) is None  # not an accelerate launch


@pytest.mark.slow
def test_two_machines_match_one_process(tmp_path):
    """`accelerate launch --num_machines 2`, two "machines" of one CPU process each on this host: they race to
    prepare the same store (one prepares, the other waits), train, and give one process's weights."""
    data = photo_folder(tmp_path / "photos", n=24, size=(12, 16), classes=("b", "a"), spread=(80, 9, 8, 60))
    cfg = write_config(tmp_path / "c.yaml", data={"dataset": "folder", "path": str(data)}, model={"num_class_embeds": 2},
                       train={"lr_scheduler": "cosine", "lr_warmup_steps": 2, "checkpoint_every": 3})
    one, two = tmp_path / "one", tmp_path / "two"
    cli("train", "--config", str(cfg), "--output-dir", str(one), env={"DENOISER_CACHE": str(tmp_path / "cache1")})
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true", "DENOISER_CACHE": str(tmp_path / "cache2")}
    procs = []
    for rank in (0, 1):
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "2",
               "--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
               "--num_processes", "2", "--mixed_precision", "no", "--dynamo_backend", "no",
               "-m", "denoiser.train", "--config", str(cfg), "--output-dir", str(two)]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for _, e in outs]
    stores = list((tmp_path / "cache2" / "data").iterdir())
    assert len([s for s in stores if not s.name.startswith(".")]) == 1  # prepared once, shared by both machines
    summary = json.loads((two / "train_summary.json").read_text())
    assert [r["rank"] for r in summary["per_rank"]] == [0, 1] and summary["images_seen"] == 48
    assert [int(x.split(",")[0]) for x in (two / "loss.csv").read_text().splitlines()] == list(range(1, 7))  # logged once
    assert (two / "model" / "model_index.json").is_file()
    assert (two / "model" / "classes.txt").read_text().split() == ["a", "b"]
    a, b = _final(one), _final(two)
    for k in a:
        if k.endswith("qkv.bias"):  # see test_two_processes_match_one_with_the_same_global_batch
            C = a[k].shape[0] // 3
            a[k], b[k] = torch.cat([a[k][:C], a[k][2 * C :]]), torch.cat([b[k][:C], b[k][2 * C :]])
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
