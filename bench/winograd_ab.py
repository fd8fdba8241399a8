"""The Winograd kernel of this checkout against an earlier revision's, inside whole UNet calls, in one process.

    .venv/bin/python bench/winograd_ab.py [--before HEAD~1] [--rounds 7] [--models cifar10 emoji] [--rows 16 32]

Builds `denoiser/fast/csrc/winograd_conv.cpp` as it was at --before (its op renamed into a namespace of its own, with
the flags of `denoiser build-kernels`), then times the shipped UNets' calls (inside `sampling_context`, as sampling
runs them) with each version of the op, alternating round by round after a warm-up: median seconds per call, the
speed-up, and the largest difference between the two outputs. A change to the kernel is kept only if this pays.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from profiling import cpu_name
from torch.utils.cpp_extension import load as build_extension

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from denoiser.fast import malloc, winograd  # noqa: E402
from denoiser.fast.kernels import _cflags, load_kernels  # noqa: E402
from denoiser.folders.model_dir import load  # noqa: E402
from denoiser.sampling.loop import sampling_context  # noqa: E402

SOURCE = "denoiser/fast/csrc/winograd_conv.cpp"


def build_before(rev: str, folder: Path):
    """The op of SOURCE at `rev`, registered as torch.ops.winograd_before.winograd_conv3x3."""
    text = subprocess.run(["git", "show", f"{rev}:{SOURCE}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    text = text.replace("TORCH_LIBRARY_FRAGMENT(denoiser, m)", "TORCH_LIBRARY(winograd_before, m)")
    text = text.replace("TORCH_LIBRARY_IMPL(denoiser, CPU, m)", "TORCH_LIBRARY_IMPL(winograd_before, CPU, m)")
    (folder / "before.cpp").write_text(text)
    build_extension(name="winograd_before", sources=[str(folder / "before.cpp")], extra_cflags=_cflags(),
                    extra_ldflags=["-fopenmp"], build_directory=str(folder), is_python_module=False)
    return torch.ops.winograd_before.winograd_conv3x3


def unet_inputs(unet, rows: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    size = unet.config.sample_size
    x = torch.randn(rows, 3, size, size).contiguous(memory_format=torch.channels_last)  # (B, 3, S, S)
    kwargs = {}
    if unet.config.get("num_class_embeds"):
        kwargs["class_labels"] = torch.zeros(rows, dtype=torch.long)
    if unet.config.get("cross_attention_dim"):
        kwargs["encoder_hidden_states"] = torch.randn(rows, 8, unet.config["cross_attention_dim"])  # (B, words, D)
    return x, torch.full((rows,), 500), kwargs


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
        return chosen["op"](x, conv._u(), conv.bias)

    winograd.Conv2d.forward = forward
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}; before = {args.before}")
    for name in args.models:
        unet = load(ROOT / "weights" / name).unet
        for rows in args.rows:
            x, t, kwargs = unet_inputs(unet, rows)
            seconds: dict[str, list[float]] = {side: [] for side in ops}
            with sampling_context(unet), torch.inference_mode():
                outputs = {}
                for side, op in ops.items():
                    chosen["op"] = op
                    outputs[side] = unet(x, t, **kwargs).sample  # also the warm-up
                for r in range(args.rounds):
                    for side in (("before", "now") if r % 2 == 0 else ("now", "before")):
                        chosen["op"] = ops[side]
                        start = time.perf_counter()
                        for _ in range(args.calls):
                            unet(x, t, **kwargs)
                        seconds[side].append((time.perf_counter() - start) / args.calls)
            before, now = statistics.median(seconds["before"]), statistics.median(seconds["now"])
            diff = (outputs["before"] - outputs["now"]).abs().max().item()
            print(f"{name}, {rows} rows: before {before * 1e3:.1f} ms, now {now * 1e3:.1f} ms a call: "
                  f"{before / now:.3f}x; max |Δ output| {diff:.1e}")


if __name__ == "__main__":
    main()
