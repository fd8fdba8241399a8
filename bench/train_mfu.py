"""Training speed the way the field reports it, on any device: img/s, TFLOP/s, MFU, launches and host syncs per step.

    .venv/bin/python -m bench.train_mfu                                   # CPU: cifar10's config, batch 32, bf16
    python -m bench.train_mfu --batch 512 --seconds 60                    # a GPU (tools/gpu/run.sh measure)
    python -m bench.train_mfu --config emoji-text --sides eager fast      # the text model (no diffusers twin)

Sides, each built as its user runs it and measured in one process, alternating blocks after warm-up:
  - eager:  denoiser's `TrainLoop` with today's settings: the loss read on the host after every step
            (train.log_every=1), inputs made on the host (train.device_data=false), no compile;
  - fast:   the same loop with the fast path: reads every --read-every steps, the split resident on the device
            with its noise drawn there (train.device_data=true), `--compile` adds torch.compile (--compile-mode);
  - diffusers: the step of diffusers' examples/unconditional_image_generation/train_unconditional.py: its
            `UNet2DModel` at the config's widths and attention (matched FLOPs: printed), `torch.optim.AdamW` as it
            builds it (weight_decay 1e-6, torch's default implementation), `EMAModel` (decay 0.9999, warm-up, not
            foreach), `clip_grad_norm_(1.0)`, `loss.detach().item()` every step, prepared by the same Accelerator.
            Its batch is already on the device (its DataLoader's cost is left out: in its favour).
Every side runs `loop.advance()`-sized steps: forward, backward, clipping, AdamW, the EMA and what its loop reads.

A block is --read-every steps ended by a device synchronize, so a block's time includes the GPU's work; img/s is
batch / (median block time / steps). FLOPs per image are counted by `torch.utils.flop_counter.FlopCounterMode` over
one step (forward + backward). MFU = achieved FLOP/s / peak: the table below for a named GPU (bf16 dense), and
always a square GEMM measured here in the run's precision. Launches: aten ops per step (nested included) from
`torch.profiler`, and on a GPU its kernel launches; host syncs: CUDA synchronize calls on a GPU, and on a CPU the
`.item()`-like reads (`aten::_local_scalar_dense`: `.item()`, `float()`, `if tensor`) outside the optimizer, per step
over one block that ends in a read, and in the steps between reads.

`--batches 128 256 512 1024`: the throughput knee instead. The fast side alone (with `--compile` if given) at each
global batch, alternating blocks as above; the knee is the smallest batch whose img/s is within 10 % of the best
(`knee` below, written to --json). tools/gpu/run.sh trains there (BATCH=auto), its lr scaled from the config's (batch,
lr) by the rule bench/lr_batch_rule.md measured (linear: tools/gpu/knee.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

import torch
from accelerate.state import AcceleratorState
from diffusers import UNet2DModel
from diffusers.training_utils import EMAModel
from torch.utils.flop_counter import FlopCounterMode

from bench.common import cpu_name
from denoiser.fast import malloc
from denoiser.train.config import load_config
from denoiser.train.loop import TrainLoop

KNEE_WITHIN = 0.10  # the knee: the smallest batch within 10 % of the best img/s
PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 tensor-core FLOP/s, vendor data sheets
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
LAUNCH_EVENTS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_loop(config: str, batch: int, precision: str | None, out: Path, overrides: list[str],
               data_path: str | None = None) -> TrainLoop:
    """The preset's TrainLoop on the built-in synthetic images at its size (no data set read), or on the image folder
    `data_path` (a text model needs its captions), checkpoints off."""
    prec = [] if precision is None else [f"train.mixed_precision={chr(34) + 'no' + chr(34) if precision == 'fp32' else precision}"]
    data = ([f"data.path={data_path}", "data.val_size=0"] if data_path else
            ["data.dataset=synthetic", f"data.num_images={max(4 * batch, 512)}", "data.val_size=16", "data.caption_columns=[]"])
    cfg = load_config(config, [*prec, f"train.batch_size={batch}", *data, "train.report_to=null", "train.sample_every=0",
                               "train.checkpoint_every=1000000", "train.max_steps=1000000", "train.lr_warmup_steps=1",
                               "train.lr=1e-5", *overrides])
    loop = TrainLoop(cfg, out, resume=None, overwrite=True, init_from=None)
    loop.begin()
    loop.bar.disable = True
    return loop


class Ours:
    """denoiser's loop, one `advance()` a step."""

    def __init__(self, loop: TrainLoop):
        self.loop, self.device, self.batch = loop, loop.accelerator.device, loop.train_cfg.batch_size

    def step(self) -> None:
        self.loop.advance()

    def align(self, n: int) -> None:
        """Steps until the next n end with a read."""
        while self.loop.step % n:
            self.step()

    def flops_step(self) -> None:
        self.loop.run_step()


class Diffusers:
    """train_unconditional.py's step, on the same Accelerator (its mixed precision), its batch on the device."""

    def __init__(self, loop: TrainLoop, widths: dict, batch: int):
        acc = loop.accelerator
        self.acc, self.device, self.batch = acc, acc.device, batch
        torch.manual_seed(0)
        model = UNet2DModel(sample_size=loop.cfg.model["sample_size"], **widths)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.95, 0.999), weight_decay=1e-6, eps=1e-8)
        self.ema = EMAModel(model.parameters(), decay=0.9999, use_ema_warmup=True, inv_gamma=1.0, power=3 / 4,
                            model_cls=UNet2DModel, model_config=model.config)
        self.model, self.optimizer = acc.prepare(model, optimizer)
        self.ema.to(acc.device)
        self.params = sum(p.numel() for p in model.parameters())
        S = loop.cfg.model["sample_size"]
        self.clean = torch.rand(batch, 3, S, S, device=self.device) * 2 - 1
        self.scheduler = loop.diffusion.noise_schedule

    def step(self) -> float:
        noise = torch.randn(self.clean.shape, device=self.device)
        timesteps = torch.randint(0, 1000, (self.batch,), device=self.device).long()
        noisy = self.scheduler.add_noise(self.clean, noise, timesteps)
        out = self.model(noisy, timesteps).sample
        loss = torch.nn.functional.mse_loss(out.float(), noise.float())
        self.acc.backward(loss)
        self.acc.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.ema.step(self.model.parameters())
        return loss.detach().item()  # its logs, every step

    flops_step = step

    def align(self, n: int) -> None:
        pass  # it reads every step


def diffusers_widths(model: dict) -> dict:
    """UNet2DModel arguments for denoiser's `model:` section: the same widths, ResBlocks and attention resolutions."""
    mult, base, S = model["channel_mult"], model["base_channels"], model["sample_size"]
    attn = set(model.get("attention_resolutions", ()))
    down = tuple("AttnDownBlock2D" if S // 2**i in attn else "DownBlock2D" for i in range(len(mult)))
    up = tuple("AttnUpBlock2D" if b.startswith("Attn") else "UpBlock2D" for b in reversed(down))
    return dict(block_out_channels=tuple(base * m for m in mult), layers_per_block=model.get("layers_per_block", 2),
                down_block_types=down, up_block_types=up, dropout=model.get("dropout", 0.0),
                attention_head_dim=base * mult[-1] // model.get("num_heads", 1))  # heads as ours at the deepest width


def flops_per_image(side) -> float:
    with FlopCounterMode(display=False) as counter:
        side.flops_step()
    sync(side.device)
    return counter.get_total_flops() / side.batch


def block(side, steps: int) -> float:
    sync(side.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        side.step()
    sync(side.device)
    return (time.perf_counter() - t0) / steps


def host_reads(events) -> int:
    """`.item()`-like reads (`aten::_local_scalar_dense`) outside the optimizer: on a CPU, where every tensor is on the
    device, the reads a GPU would wait for (a CPU AdamW reads its host-side step counters, a GPU one does not)."""
    def in_optimizer(e) -> bool:
        while e is not None:
            if e.name.startswith("Optimizer.step"):
                return True
            e = e.cpu_parent
        return False
    return sum(e.name == "aten::_local_scalar_dense" and not in_optimizer(e) for e in events)


def counts(side, steps: int) -> tuple[float, float, float, float]:
    """Per step over `steps` steps that end with a read (torch.profiler): aten ops (nested included), kernel launches
    and host syncs (CUDA synchronize calls on a GPU; on a CPU, `host_reads`); and host syncs in the steps before the
    read. No dispatch mode here: under one, a compiled model runs eagerly."""
    cuda = side.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + [torch.profiler.ProfilerActivity.CUDA] * cuda
    side.align(steps)
    per_step = []
    for _ in range(steps):
        with torch.profiler.profile(activities=activities) as prof:
            side.step()
        ev = prof.events()
        syncs = sum(e.name in SYNC_EVENTS for e in ev) if cuda else host_reads(ev)
        per_step.append((sum(e.name.startswith("aten::") for e in ev), sum(e.name in LAUNCH_EVENTS for e in ev), syncs))
    aten, launches, syncs = (sum(c[i] for c in per_step) / steps for i in range(3))
    between = sum(c[2] for c in per_step[:-1]) / max(steps - 1, 1)
    return aten, launches, syncs, between


def gemm_peak(device: torch.device, dtype: torch.dtype, n: int = 2048, repeats: int = 5) -> float:
    """FLOP/s of a square matmul in `dtype` on `device` (the practical peak)."""
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    a @ b
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def time_sides(sides: dict, n: int, warmup: int, repeats: int, seconds: float | None) -> dict[str, list[float]]:
    """Seconds per step of each side: `warmup` blocks of n steps each, then blocks in turn (side by side) until each
    side has `repeats` blocks or has run `seconds`."""
    for _ in range(warmup):
        for s in sides.values():
            block(s, n)
    times: dict[str, list[float]] = {k: [] for k in sides}
    spent = dict.fromkeys(sides, 0.0)
    while True:
        for k, s in sides.items():
            times[k].append(block(s, n))
            spent[k] += times[k][-1] * n
        if (seconds and min(spent.values()) >= seconds) or (not seconds and min(map(len, times.values())) >= repeats):
            return times


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def fast_overrides(args) -> list[str]:
    """The fast side's settings: reads every --read-every steps, the split on the device, torch.compile if asked."""
    fast = [f"train.log_every={args.read_every}", "train.device_data=true"]
    if args.compile:
        fast += ["train.compile=true"] + ([f"train.compile_mode={args.compile_mode}"] if args.compile_mode else [])
    return fast


def peaks(device: torch.device, prec: str) -> tuple[float, float | None]:
    """(a GEMM measured now in the run's precision, the data-sheet bf16 peak of a named GPU or None), printed."""
    dtype = torch.bfloat16 if prec == "bf16" else torch.float32
    gemm = gemm_peak(device, dtype)
    sheet = next((v for key, v in PEAK_BF16.items() if key in device_name(device)), None) if prec == "bf16" else None
    print(f"peak: measured {dtype} GEMM {gemm / 1e12:.3f} TFLOP/s" +
          (f"; data-sheet bf16 dense {sheet / 1e12:.0f} TFLOP/s" if sheet else ""))
    return gemm, sheet


def knee(img_per_s: dict[int, float], within: float = KNEE_WITHIN) -> int:
    """The smallest batch whose img/s is within `within` of the best: past it a bigger batch buys little speed and
    costs optimizer steps (fewer of them for the same images)."""
    best = max(img_per_s.values())
    return min(b for b, ips in img_per_s.items() if ips >= (1 - within) * best)


def sweep(args, out: Path) -> None:
    """The throughput knee: the fast side at each of --batches, side by side; prints the table and the knee."""
    sides = {b: Ours(build_loop(args.config, b, args.precision, out / f"b{b}", fast_overrides(args), args.data_path))
             for b in args.batches}
    first = next(iter(sides.values()))
    device, prec = first.device, first.loop.train_cfg.mixed_precision
    print(f"{device_name(device)}; torch {torch.__version__}, {torch.get_num_threads()} threads; config {args.config}, "
          f"{prec}, fast side{' + torch.compile' if args.compile else ''}; batches {args.batches}, blocks of "
          f"{args.read_every} steps, alternating")
    flops = flops_per_image(first)
    times = time_sides(sides, args.read_every, args.warmup, args.repeats, args.seconds)
    gemm, sheet = peaks(device, prec)
    ips = {b: b / statistics.median(t) for b, t in times.items()}
    print("| batch | img/s | TFLOP/s | MFU (GEMM) | MFU (sheet) | steps/s | blocks |\n|---|---|---|---|---|---|---|")
    for b, v in ips.items():
        sheet_mfu = f"{v * flops / sheet:.1%}" if sheet else "-"
        print(f"| {b} | {v:.1f} | {v * flops / 1e12:.3f} | {v * flops / gemm:.1%} | {sheet_mfu} | {v / b:.2f} | "
              f"{len(times[b])} |")
    k = knee(ips)
    print(f"knee: batch {k} ({ips[k]:.1f} img/s, the smallest within {KNEE_WITHIN:.0%} of the best)")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": args.config, "compile": args.compile, "knee": k, "batch": k,
                                               "img_per_s": {"fast": ips[k]}, "by_batch": ips}))
    for side in sides.values():
        side.loop.end()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="cifar10")
    p.add_argument("--batch", type=int, default=None, help="global batch (default: 32 on a CPU, the config's on a GPU)")
    p.add_argument("--data-path", default=None, help="an image folder to read instead of synthetic images (text models)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None, help="default: the config's")
    p.add_argument("--sides", nargs="+", default=["eager", "fast", "diffusers"], choices=["eager", "fast", "diffusers"])
    p.add_argument("--read-every", type=int, default=10, help="the fast side's train.log_every, and each block's steps")
    p.add_argument("--compile", action="store_true", help="the fast side also torch.compiles the UNet")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (reduce-overhead: CUDA graphs)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up blocks per side")
    p.add_argument("--repeats", type=int, default=5, help="timed blocks per side (alternating)")
    p.add_argument("--seconds", type=float, default=None, help="instead of --repeats: time blocks for this long per side")
    p.add_argument("--json", default=None, help="also write {side: img/s, ...} to this file (tools/gpu/run.sh reads it)")
    p.add_argument("--batches", type=int, nargs="+", default=None, help="the throughput knee over these global batches")
    args = p.parse_args()
    logging.disable(logging.WARNING)
    malloc.configure(keep_peak=True)  # as `denoiser train` runs
    if args.batches:
        with tempfile.TemporaryDirectory() as out:
            sweep(args, Path(out))
        sys.exit(0)
    cuda = torch.cuda.is_available()
    batch = args.batch or (32 if not cuda else load_config(args.config).train.batch_size)
    n = args.read_every
    tmp = tempfile.TemporaryDirectory()
    AcceleratorState._reset_state(reset_partial_state=True)
    sides: dict[str, object] = {}
    loops = {}
    for name, extra in (("eager", ["train.log_every=1", "train.device_data=false"]), ("fast", fast_overrides(args))):
        if name in args.sides or (name == "eager" and "diffusers" in args.sides):
            loops[name] = build_loop(args.config, batch, args.precision, Path(tmp.name) / name, extra, args.data_path)
            if name in args.sides:
                sides[name] = Ours(loops[name])
    first = next(iter(loops.values()))
    if "diffusers" in args.sides:
        sides["diffusers"] = Diffusers(first, diffusers_widths(first.cfg.model), batch)
    device, prec = first.accelerator.device, first.train_cfg.mixed_precision
    timing = f"{args.seconds:.0f} s" if args.seconds else f"{args.repeats} blocks"
    print(f"{device_name(device)}; torch {torch.__version__}, {torch.get_num_threads()} threads; config {args.config} "
          f"({sum(p.numel() for p in first.model.parameters()) / 1e6:.2f}M params), batch {batch}, {prec}; blocks of {n} "
          f"steps, {args.warmup} warm-up blocks then {timing} per side, alternating")
    flops = {k: flops_per_image(s) for k, s in sides.items()}
    times = time_sides(sides, n, args.warmup, args.repeats, args.seconds)
    peak_gemm, peak_table = peaks(device, prec)
    print("| side | GFLOP/img | img/s | TFLOP/s | MFU (GEMM) | MFU (sheet) | aten ops/step | kernel launches/step "
          "| host syncs/step | syncs between reads | blocks |\n|---|---|---|---|---|---|---|---|---|---|---|")
    ips = {}
    for k, s in sides.items():
        ips[k] = batch / statistics.median(times[k])
        achieved = ips[k] * flops[k]
        aten, launches, syncs, between = counts(s, n)
        sheet = f"{achieved / peak_table:.1%}" if peak_table else "-"
        print(f"| {k} | {flops[k] / 1e9:.2f} | {ips[k]:.1f} | {achieved / 1e12:.3f} | {achieved / peak_gemm:.1%} | {sheet} | "
              f"{aten:.0f} | {launches:.0f} | {syncs:.2f} | {between:.2f} | {len(times[k])} |", flush=True)
    for a, b in (("fast", "eager"), ("fast", "diffusers"), ("eager", "diffusers")):
        if a in ips and b in ips:
            print(f"{a} / {b}: {ips[a] / ips[b]:.2f}x img/s")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": args.config, "batch": batch, "compile": args.compile,
                                               "compile_mode": args.compile_mode, "img_per_s": ips}))
    for loop in loops.values():
        loop.end()
    tmp.cleanup()
    sys.exit(0)


if __name__ == "__main__":
    main()
