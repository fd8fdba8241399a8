"""How close the UNet forward runs to this CPU's own GEMM rate, per path: the CPU's roofline, as MFU is a GPU's.

    .venv/bin/python -m bench.cpu_roofline                       # both shipped models, batch 1, 8, 32
    .venv/bin/python -m bench.cpu_roofline --models cifar10 --batches 8 --repeats 9 --compile

The CPU's rate: a 2048² matmul in float32 and in bfloat16 (median of 5). Then for each shipped model and batch, the
UNet forward (a sampling call: inference mode, channels-last, the model loaded as every door loads it, a text
model with its prompt's token states) on each path, the paths alternating call by call after a warm-up, median of
`--repeats`:
  - float32:  eager, inside `sampling_context` held to float32 (what runs where bf16 does not pay), its 3x3
              convolutions by Winograd's algorithm (denoiser.fast.winograd) where the kernels are built;
  - float32-direct: the same with torch's own convolutions (the path before the Winograd kernel);
  - mixed:    the per-op mix (denoiser.fast.mixed): Winograd's products, the linear layers and 1x1 convolutions in
              bf16, the rest float32 (left out with bfloat16, below);
  - bfloat16: eager under CPU bf16 autocast, inside `sampling_context` held to bfloat16 (left out, with the bf16
              GEMM rate, where the CPU has no native bfloat16 and autocast emulates it: 0.16x float32 on a Zen 3;
              `--bf16` keeps it);
  - compile:  `torch.compile` of the float32 path (`--compile`: minutes of compiling first);
  - openvino-f32 / openvino-bf16: OpenVINO (when `openvino` is importable) from `torch.export`, its CPU plugin with
    INFERENCE_PRECISION_HINT f32 / bf16, 2 threads, static shapes.
FLOPs per image come from `torch.utils.flop_counter` over one float32 call. The share is achieved FLOP/s over the best
of the two GEMM rates (the roof a person's CPU offers); `max |Δε|` is the path's largest difference from float32's
predicted noise. Prints a Markdown table; bench/cpu_roofline.md keeps the runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.common import bf16_timed, cpu_name, gemm_rate, model_inputs
from denoiser.fast.precision import asked, choose_precision, running
from denoiser.fast.winograd import switched
from denoiser.folders.model_dir import load
from denoiser.sampling.loop import sampling_context

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"


def eager_side(unet, inputs: dict, choice: str, winograd: bool = True):
    """Calls in `choice` (denoiser.fast.precision's float32, mixed or bfloat16), as a plan's run holds it."""
    chosen = choose_precision(unet, choice)

    def call():
        with torch.inference_mode(), running(chosen), sampling_context(unet), switched(winograd):
            return unet(**inputs).sample

    return call


def compiled_side(unet, inputs: dict):
    compiled = torch.compile(unet)

    def call():
        with torch.inference_mode(), asked(unet, torch.float32):
            return compiled(**inputs).sample

    return call


class _Positional(torch.nn.Module):
    """The UNet with positional inputs and a tensor output, as torch.export and OpenVINO take it."""

    def __init__(self, unet, names):
        super().__init__()
        self.unet, self.names = unet, names

    def forward(self, *args):
        return self.unet(**dict(zip(self.names, args))).sample


def openvino_sides(unet, inputs: dict) -> dict:
    import openvino as ov

    names = list(inputs)
    args = tuple(inputs[k].contiguous() for k in names)
    with torch.no_grad():
        program = torch.export.export(_Positional(unet, names).eval(), args)
    model = ov.convert_model(program)
    core, sides = ov.Core(), {}
    for hint in ("f32", "bf16"):
        compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS":
                                                     torch.get_num_threads(), "PERFORMANCE_HINT": "LATENCY"})
        request = compiled.create_infer_request()
        feed = [a.numpy() for a in args]

        def call(request=request, feed=feed):
            request.infer(feed)
            return torch.from_numpy(request.get_output_tensor(0).data.copy())

        sides[f"openvino-{hint}"] = call
    return sides


def flops_per_image(unet, inputs: dict, batch: int) -> float:
    """A direct convolution's FLOPs (Winograd's algorithm does fewer: its rate is an effective one, as cuDNN's)."""
    with torch.inference_mode(), switched(False), FlopCounterMode(display=False) as counter:
        unet(**inputs)
    return counter.get_total_flops() / batch


def measure(sides: dict, warmup: int, repeats: int) -> dict[str, float]:
    """Median seconds per call of each side, the sides alternating call by call after `warmup` rounds."""
    for _ in range(warmup):
        for call in sides.values():
            call()
    times = {k: [] for k in sides}
    for _ in range(repeats):
        for name, call in sides.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["cifar10", "emoji"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="add torch.compile's float32 path (slow to start)")
    parser.add_argument("--no-openvino", action="store_true", help="leave OpenVINO out even where it is installed")
    parser.add_argument("--bf16", action="store_true", help="time bfloat16 even where the CPU emulates it")
    args = parser.parse_args()

    torch.manual_seed(0)
    bf16 = bf16_timed(args.bf16)
    rates = {"float32": gemm_rate(torch.float32), "bfloat16": gemm_rate(torch.bfloat16) if bf16 else 0.0}
    roof = max(rates.values())
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"GEMM 2048²: float32 {rates['float32'] / 1e12:.3f} TFLOP/s, "
          + (f"bfloat16 {rates['bfloat16'] / 1e12:.3f} TFLOP/s" if bf16 else "bfloat16 not timed (no native bf16 here)"))
    print(f"precision every door picks here: {choose_precision().describe()}\n")
    print("| model | batch | path | ms / call | img/s | vs float32 | TFLOP/s | share of the best GEMM rate | max abs Δε |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        model = load(WEIGHTS / name)
        unet = model.unet
        for batch in args.batches:
            inputs = model_inputs(model, batch)
            flops = flops_per_image(unet, inputs, batch)
            sides = {"float32": eager_side(unet, inputs, "float32"),
                     "float32-direct": eager_side(unet, inputs, "float32", winograd=False)}
            if bf16:
                sides["mixed"] = eager_side(unet, inputs, "mixed")
                sides["bfloat16"] = eager_side(unet, inputs, "bfloat16")
            if args.compile:
                sides["compile"] = compiled_side(unet, inputs)
            if not args.no_openvino:
                try:
                    sides.update(openvino_sides(unet, inputs))
                except ImportError:
                    pass
            reference = sides["float32"]().float()
            error = {k: float((call().float() - reference).abs().max()) for k, call in sides.items()}
            seconds = measure(sides, args.warmup, args.repeats)
            for path, s in seconds.items():
                achieved = flops * batch / s
                print(f"| {name} | {batch} | {path} | {s * 1e3:.1f} | {batch / s:.1f} | {seconds['float32'] / s:.2f}x | "
                      f"{achieved / 1e12:.3f} | {achieved / roof:.0%} | {error[path]:.1e} |", flush=True)
        print(f"\n{name}: {flops / 1e9:.2f} GFLOP per image (torch.utils.flop_counter)\n")


if __name__ == "__main__":
    main()
