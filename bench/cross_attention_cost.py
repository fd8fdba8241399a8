"""What a prompt costs: one UNet call with cross-attention against one with a class, interleaved A/B.

    nice -n 10 .venv/bin/python -m bench.cross_attention_cost [--model weights/emoji] [--batch 8] [--tokens 16]
        [--kept 6] [--context-dim 256] [--rounds 15] [--calls 5] [--threads 1]

The issue's budget: one sampling step with a prompt costs at most 1.15x one with a class, at the same size. A step
is one UNet call (the text encoder runs once per prompt, not per step; the scheduler's update is the same), so
this times UNet calls as `denoiser.sampling.loop` makes them: channels-last, inference mode, the speed layer on
(the kernels), glibc malloc configured as the CLI does. Configurations:

    class           the shipped model (`--model`), class labels: today's step
    prompt          the same architecture with `cross_attention_dim` (a cross-attention block after every
                    self-attention block), `--tokens` tokens of which `--kept` are the prompt and the rest
                    padding (encoder_attention_mask)
    prompt, no mask the same prompt with no mask (every token attended)

The cross-attention weights are random (time does not depend on their values). Each round runs every
configuration once (`--calls` calls after two unmeasured ones) in turn, so a machine whose speed drifts slows all
of them alike; the table gives the median over rounds and the ratio to `class`, in wall time and in this
process's CPU time (which other processes on a shared machine disturb less; with `--threads 1` it is the
compute itself). Results: cross_attention_cost.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

from denoiser import UNet
from denoiser.fast import malloc
from denoiser.folders.model_dir import load_model


def cpu_name() -> str:
    """The CPU's model name and the flags that matter here (lscpu), with the thread count torch uses."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    name = fields.get("Model name", "unknown CPU").strip()
    flags = fields.get("Flags", "").split()
    isa = [f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni") or f.startswith("amx")]
    return f"{name} ({', '.join(isa) or 'no AVX2'}), {torch.get_num_threads()} threads"


def with_cross_attention(unet: UNet, context_dim: int) -> UNet:
    """The same architecture and weights with a cross-attention block after every self-attention block."""
    config = {k: v for k, v in unet.config.items() if not k.startswith("_")}
    cross = UNet(**{**config, "cross_attention_dim": context_dim})
    cross.load_state_dict(unet.state_dict(), strict=False)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in cross.named_parameters():
            if "cross" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return cross.eval().to(memory_format=torch.channels_last)


def time_calls(call, calls: int) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) per call, after two unmeasured ones."""
    for _ in range(2):
        call()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call()
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="weights/emoji")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16, help="context length L (prompt + padding)")
    parser.add_argument("--kept", type=int, default=6, help="tokens of the prompt; the rest is padding")
    parser.add_argument("--context-dim", type=int, default=256, help="cross_attention_dim (the text encoder's width)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    malloc.configure()  # as the CLI and the app do
    unet, _ = load_model(args.model)  # channels-last, eval, fp32
    cross = with_cross_attention(unet, args.context_dim)
    size, B = unet.config.sample_size, args.batch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, unet.config.in_channels, size, size, generator=g).contiguous(memory_format=torch.channels_last)
    t = torch.full((B,), 500)
    labels = torch.arange(B) % unet.config.num_class_embeds if unet.config.num_class_embeds else None
    states = torch.randn(B, args.tokens, args.context_dim, generator=g)
    mask = (torch.arange(args.tokens) < args.kept).long().expand(B, -1)  # 1 = token, 0 = padding
    configurations = {
        "class": (unet, lambda: unet(x, t, class_labels=labels)),
        "prompt": (cross, lambda: cross(x, t, encoder_hidden_states=states, encoder_attention_mask=mask)),
        "prompt, no mask": (cross, lambda: cross(x, t, encoder_hidden_states=states)),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in configurations}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, (_, call) in configurations.items():
                times[name].append(time_calls(call, args.calls))
    n_params = {name: sum(p.numel() for p in model.parameters()) for name, (model, _) in configurations.items()}
    wall = {name: statistics.median(w for w, _ in samples) for name, samples in times.items()}
    cpu = {name: statistics.median(c for _, c in samples) for name, samples in times.items()}
    print(f"{args.model} architecture at {size}x{size}, batch {B}, context {args.tokens} tokens ({args.kept} kept) x "
          f"{args.context_dim}, torch {torch.__version__}, CPU {cpu_name()}; median of {args.rounds} interleaved "
          f"rounds x {args.calls} calls")
    print()
    print("| configuration | parameters | wall ms / UNet call | vs class | CPU ms / UNet call | vs class |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in times:
        print(f"| {name} | {n_params[name] / 1e6:.2f}M | {1000 * wall[name]:.1f} | {wall[name] / wall['class']:.3f}x "
              f"| {1000 * cpu[name]:.1f} | {cpu[name] / cpu['class']:.3f}x |")


if __name__ == "__main__":
    main()
