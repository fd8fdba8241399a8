"""torch.compile against eager for CPU sampling and training, and what gradient checkpointing saves.

    OMP_NUM_THREADS=2 .venv/bin/python -m bench.compile_and_memory [--model weights/cifar10] [--repeats 5]

compile: the shipped model's UNet call at batch 8 as sample() runs it (eager: channels-last with packed
convolution weights and denoiser's kernels; compiled: `torch.compile(unet, fullgraph=True)`, inductor),
and one training step (forward + backward + fused AdamW, batch 32, fp32) eager vs compiled. Calls
alternate between the two after warm-up (the compile itself is timed separately); medians of the repeats.

memory: the peak resident memory (VmHWM) of a 64x64 training step of configs/emoji.yaml's model, batch 32,
with and without `enable_gradient_checkpointing()`, each in a fresh process; and the step time of both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from bench.common import cpu_name
from denoiser import UNet
from denoiser.fast import malloc
from denoiser.folders.model_dir import load_model

ROOT = Path(__file__).resolve().parent.parent


def _median_pair(a, b, repeats: int) -> tuple[float, float]:
    """Interleaved medians of two timed callables (seconds per call), after one warm-up call each."""
    a(), b()
    ta, tb = [], []
    for _ in range(repeats):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def sampling(model: str, repeats: int) -> dict:
    unet, _ = load_model(model)  # channels-last, as the CLI and the app run it
    x = torch.randn(8, 3, unet.config.sample_size, unet.config.sample_size).to(memory_format=torch.channels_last)
    t, y = torch.tensor(500), torch.arange(8) % max(unet.config.num_class_embeds or 1, 1)
    labels = y if unet.config.num_class_embeds else None
    compiled = torch.compile(unet, fullgraph=True)
    with torch.inference_mode():
        t0 = time.perf_counter()
        compiled(x, t, class_labels=labels)
        compile_s = time.perf_counter() - t0
        eager_s, comp_s = _median_pair(lambda: unet(x, t, class_labels=labels), lambda: compiled(x, t, class_labels=labels),
                                       repeats)
        diff = (compiled(x, t, class_labels=labels).sample - unet(x, t, class_labels=labels).sample).abs().max().item()
    return {"what": "sampling UNet call, batch 8", "eager_ms": eager_s * 1e3, "compiled_ms": comp_s * 1e3,
            "speedup": eager_s / comp_s, "compile_s": compile_s, "max_abs_diff": diff}


def training(model: str, repeats: int) -> dict:
    unet, _ = load_model(model)
    unet.train()
    size = unet.config.sample_size
    x = torch.randn(32, 3, size, size).to(memory_format=torch.channels_last)
    t = torch.randint(0, 1000, (32,), generator=torch.Generator().manual_seed(0))
    y = torch.arange(32) % (unet.config.num_class_embeds or 1) if unet.config.num_class_embeds else None
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-5, fused=True)
    compiled = torch.compile(unet, fullgraph=True)

    def step(m):
        def run():
            opt.zero_grad(set_to_none=True)
            m(x, t, class_labels=y).sample.square().mean().backward()
            opt.step()
        return run

    t0 = time.perf_counter()
    step(compiled)()
    compile_s = time.perf_counter() - t0
    eager_s, comp_s = _median_pair(step(unet), step(compiled), repeats)
    return {"what": "training step, batch 32, fp32", "eager_ms": eager_s * 1e3, "compiled_ms": comp_s * 1e3,
            "speedup": eager_s / comp_s, "compile_s": compile_s}


def _peak_rss_child(checkpointing: bool, repeats: int) -> None:
    """One process, one mode: prints {"peak_mb": ..., "step_ms": ...} for a 64x64 training step."""
    malloc.configure()
    cfg = yaml.safe_load((ROOT / "configs" / "emoji.yaml").read_text())["model"]
    torch.manual_seed(0)
    unet = UNet(**cfg).train().to(memory_format=torch.channels_last)
    if checkpointing:
        unet.enable_gradient_checkpointing()
    opt = torch.optim.AdamW(unet.parameters(), lr=1e-5, fused=True)
    x = torch.randn(32, 3, 64, 64).to(memory_format=torch.channels_last)
    t = torch.randint(0, 1000, (32,), generator=torch.Generator().manual_seed(0))
    y = torch.arange(32) % (cfg.get("num_class_embeds") or 1) if cfg.get("num_class_embeds") else None

    def step():
        opt.zero_grad(set_to_none=True)
        unet(x, t, class_labels=y).sample.square().mean().backward()
        opt.step()

    step()  # optimizer state and allocator warm
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident size
    base = _status_mb("VmRSS")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"peak_mb": _status_mb("VmHWM"), "base_mb": base, "step_ms": statistics.median(times) * 1e3}))


def _status_mb(key: str) -> float:
    line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith(key + ":"))
    return int(line.split()[1]) / 1024


def memory(repeats: int) -> dict:
    out = {}
    for mode in (False, True):
        res = subprocess.run([sys.executable, "-m", "bench.compile_and_memory", "--child", "ckpt" if mode else "plain", "--repeats", str(repeats)],
                             cwd=ROOT, capture_output=True, text=True, check=True)
        out["checkpointing" if mode else "plain"] = json.loads(res.stdout.strip().splitlines()[-1])
    return {"what": "64x64 training step, configs/emoji.yaml model, batch 32, fp32", **out,
            # peak against peak: after the warm-up step the heap keeps the freed activations (malloc.configure),
            # so the resident size before a step already differs between the two
            "peak_ratio": out["checkpointing"]["peak_mb"] / out["plain"]["peak_mb"],
            "time_ratio": out["checkpointing"]["step_ms"] / out["plain"]["step_ms"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "weights" / "cifar10"))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--only", choices=["sampling", "training", "memory"], action="append")
    p.add_argument("--child", choices=["plain", "ckpt"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _peak_rss_child(args.child == "ckpt", args.repeats)
        return
    malloc.configure()
    print(f"# {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    parts = {"sampling": lambda: sampling(args.model, args.repeats), "training": lambda: training(args.model, args.repeats),
             "memory": lambda: memory(args.repeats)}
    for name in args.only or parts:
        print(json.dumps({name: parts[name]()}, indent=1), flush=True)


if __name__ == "__main__":
    main()
