"""Where a sampling UNet call's time goes, op by op, in each precision path (issue 71's per-op table).

    .venv/bin/python -m bench.unet_ops [--model cifar10] [--batch 8] [--paths float32 mixed bfloat16] [--calls 5]

For each path (denoiser.fast.precision's float32, mixed or bfloat16, held as a plan's run holds it, inside
`sampling_context`), after 3 warm-up calls: the median wall time of `--calls` calls, then torch.profiler over `--calls`
more, and the ops with the most self time per call (ms), with their share of the call and their calls per UNet call.
Prints Markdown; the CPU heads the output.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench.common import cpu_name, model_inputs
from denoiser.fast.precision import choose_precision, running
from denoiser.folders.model_dir import load
from denoiser.sampling.loop import sampling_context

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cifar10")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--paths", nargs="+", default=["float32", "mixed", "bfloat16"])
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args()

    model = load(WEIGHTS / args.model)
    unet, inputs = model.unet, model_inputs(model, args.batch)
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}; {args.model}, batch {args.batch}")
    for path in args.paths:
        chosen = choose_precision(unet, path)

        def call(chosen=chosen):
            with torch.inference_mode(), running(chosen), sampling_context(unet):
                unet(**inputs)

        for _ in range(3):
            call()
        walls = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            call()
            walls.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.calls):
                call()
        ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in ops) / args.calls / 1e3  # ms per call, every op's self time
        print(f"\n{path}: {statistics.median(walls) * 1e3:.1f} ms a call (median of {args.calls}); "
              f"ops' self time {total:.1f} ms a call\n")
        print("| op | ms / call | share | calls / call |\n|---|---|---|---|")
        for e in ops[: args.top]:
            ms = e.self_cpu_time_total / args.calls / 1e3
            print(f"| {e.key} | {ms:.1f} | {ms / total:.0%} | {e.count // args.calls} |")


if __name__ == "__main__":
    main()
