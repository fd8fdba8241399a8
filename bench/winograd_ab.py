"""The Winograd kernel of this checkout against an earlier revision's, inside whole UNet calls, in one process.

    .venv/bin/python -m bench.winograd_ab [--before HEAD~1] [--rounds 7] [--models cifar10 emoji] [--rows 16 32]

Builds `denoiser/fast/csrc/winograd_conv.cpp` as it was at --before (its op renamed into a namespace of its own, with
the flags of `denoiser build-kernels`), then times the shipped UNets' calls (inside `sampling_context`, as sampling
runs them, on `cpu_roofline.model_inputs`) with each version of the op, alternating round by round after a warm-up
round (`profiling.interleaved`): median seconds per call, the speed-up, and the largest difference between the two
outputs. A change to the kernel is kept only if this pays.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from functools import partial
from pathlib import Path

import torch
from torch.utils.cpp_extension import load as build_extension

from bench.common import ROOT, cpu_name, interleaved, model_inputs
from denoiser.fast import malloc, winograd
from denoiser.fast.kernels import compile_flags, load_kernels
from denoiser.folders.model_dir import load
from denoiser.sampling.loop import sampling_context

SOURCE = "denoiser/fast/csrc/winograd_conv.cpp"


def build_before(rev: str, folder: Path):
    """The op of SOURCE at `rev`, registered as torch.ops.winograd_before.winograd_conv3x3."""
    text = subprocess.run(["git", "show", f"{rev}:{SOURCE}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    text = text.replace("TORCH_LIBRARY_FRAGMENT(denoiser, m)", "TORCH_LIBRARY(winograd_before, m)")
    text = text.replace("TORCH_LIBRARY_IMPL(denoiser, CPU, m)", "TORCH_LIBRARY_IMPL(winograd_before, CPU, m)")
    (folder / "before.cpp").write_text(text)
    build_extension(name="winograd_before", sources=[str(folder / "before.cpp")], extra_cflags=compile_flags(),
                    extra_ldflags=["-fopenmp"], build_directory=str(folder), is_python_module=False)
    return torch.ops.winograd_before.winograd_conv3x3


def run_calls(chosen: dict, op, unet, inputs: dict, calls: int, outputs: dict, side: str) -> None:
    """`calls` UNet calls with `op` as the Winograd op, as sampling runs them; the last output kept as outputs[side]."""
    chosen["op"] = op
    with sampling_context(unet), torch.inference_mode():
        for _ in range(calls):
            outputs[side] = unet(**inputs).sample


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="HEAD~1", help="the git revision whose kernel is the baseline")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=3, help="UNet calls per side per round")
    p.add_argument("--models", nargs="+", default=["cifar10", "emoji"])
    p.add_argument("--rows", nargs="+", type=int, default=[16, 32], help="rows per UNet call (images x 2 with guidance)")
    args = p.parse_args()
    if not load_kernels():
        raise SystemExit("the kernels are not built here: run `denoiser build-kernels` first")
    malloc.configure()
    with tempfile.TemporaryDirectory() as tmp:
        ops = {"before": build_before(args.before, Path(tmp)), "now": torch.ops.denoiser.winograd_conv3x3}
    chosen = {"op": ops["now"]}

    def forward(conv, x):  # winograd.Conv2d.forward with the op of the side being timed
        if not conv._applies(x):
            return torch.nn.Conv2d.forward(conv, x)
        return chosen["op"](x, conv._u(torch.float32), conv.bias)

    winograd.Conv2d.forward = forward
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}; before = {args.before}")
    for name in args.models:
        model = load(ROOT / "weights" / name)
        unet = model.unet
        for rows in args.rows:
            inputs = model_inputs(model, rows)
            outputs = {}
            sides = {side: partial(run_calls, chosen, op, unet, inputs, args.calls, outputs, side) for side, op in ops.items()}
            seconds = interleaved(sides, args.rounds)
            before, now = (statistics.median(seconds[side]) / args.calls for side in ("before", "now"))
            diff = (outputs["before"] - outputs["now"]).abs().max().item()
            print(f"{name}, {rows} rows: before {before * 1e3:.1f} ms, now {now * 1e3:.1f} ms a call: "
                  f"{before / now:.3f}x; max |Δ output| {diff:.1e}")


if __name__ == "__main__":
    main()
