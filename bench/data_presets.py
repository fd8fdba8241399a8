"""The photo presets (configs/photos64.yaml, configs/photos128.yaml): time and peak memory of one training step
on this CPU, with bf16 autocast and gradient checkpointing on and off, so the presets' choices are measured.

    OMP_NUM_THREADS=2 .venv/bin/python -m bench.data_presets [--batch 8] [--steps 3]

Each row is a fresh process: the preset's UNet, a batch of random images at its size, the epsilon loss at
random timesteps, backward and a fused AdamW step; one warm-up step, then the median of --steps timed steps.
Peak memory is the process's VmHWM (resident high-water mark, after the imports' baseline is subtracted).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = [("photos64", "bf16", False), ("photos64", "no", False), ("photos128", "bf16", True), ("photos128", "bf16", False)]


def _status(key: str) -> float:
    line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith(key + ":"))
    return int(line.split()[1]) / 1024


def child(args) -> None:
    import torch
    import yaml

    from denoiser.diffusion import Diffusion, DiffusionConfig
    from denoiser.model.unet import UNet

    base = _status("VmRSS")
    model = yaml.safe_load((ROOT / "configs" / f"{args.preset}.yaml").read_text())["model"]
    torch.manual_seed(0)
    unet = UNet(**model)
    if args.ckpt:
        unet.enable_gradient_checkpointing()
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-4, fused=True)
    diffusion = Diffusion.from_config(DiffusionConfig())
    S = model["sample_size"]
    x = torch.randn(args.batch, 3, S, S)
    times = []
    for _ in range(args.steps + 1):
        tic = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = diffusion.training_loss(unet, x, None)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - tic)
    print(json.dumps({"params_m": round(sum(p.numel() for p in unet.parameters()) / 1e6, 1),
                      "step_s": round(statistics.median(times[1:]), 2), "peak_mb": round(_status("VmHWM") - base)}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--child", nargs=3, metavar=("PRESET", "PRECISION", "CKPT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.preset, args.precision, args.ckpt = args.child[0], args.child[1], args.child[2] == "1"
        return child(args)
    from bench.common import cpu_name

    print(f"# one training step, batch {args.batch}, on {cpu_name()}, {len(os.sched_getaffinity(0))} cores, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print("| preset | params (M) | precision | gradient checkpointing | step (s) | images/s | peak memory (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for preset, precision, ckpt in ROWS:
        res = subprocess.run([sys.executable, "-m", "bench.data_presets", "--batch", str(args.batch), "--steps", str(args.steps), "--child",
                              preset, precision, "1" if ckpt else "0"], cwd=ROOT, capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(res.stderr[-3000:])
        r = json.loads(res.stdout.strip().splitlines()[-1])
        print(f"| {preset} | {r['params_m']} | {precision} | {'on' if ckpt else 'off'} | {r['step_s']} | "
              f"{args.batch / r['step_s']:.1f} | {r['peak_mb']} |", flush=True)


if __name__ == "__main__":
    main()
