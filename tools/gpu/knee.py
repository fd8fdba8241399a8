"""A run's batch and learning rate at the measured throughput knee (tools/gpu/run.sh with BATCH=auto).

    python3 -m tools.gpu.knee KNEE_JSON CONFIG [--rule sqrt] [--set key=value ...]

KNEE_JSON is `python -m bench.train_mfu --batches ... --json`'s output (its "knee": the smallest batch within 10 % of the
best img/s, as that bench measures it). The reference is the config's (train.batch_size, train.lr, train.lr_warmup_steps) after the --set
overrides the run is given; the run trains at the knee with

    lr = lr_ref * knee / batch_ref               (--rule linear, the default)
    lr = lr_ref * (knee / batch_ref) ** 0.5      (--rule sqrt)        lr = lr_ref   (--rule none)

and the same warm-up in images (its steps scaled by batch_ref / knee). Prints the overrides, one per line
(`train.batch_size=...`), for `denoiser train --set`.

Linear, because it is what matched the reference when measured (bench/lr_batch_rule.md: 4x the batch at equal
images, FID-500 280.5 linear against the reference's 281.7; square-root 324.2). Checked at 4x only: past that, or far
from the reference, measure again (bench/lr_batch_rule.sh).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from denoiser.train.config import load_config

RULES = {"sqrt": 0.5, "linear": 1.0, "none": 0.0}  # lr grows as (batch ratio) ** exponent


def at_knee(knee: int, batch_ref: int, lr_ref: float, warmup_ref: int, rule: str = "linear") -> dict[str, float | int]:
    """The overrides for a run at batch `knee` from a reference (batch, lr, warm-up steps), by `rule`."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {sorted(RULES)}, got {rule!r}")
    if knee < 1 or batch_ref < 1:
        raise ValueError(f"batches must be positive, got knee {knee} and reference {batch_ref}")
    ratio = knee / batch_ref
    return {"train.batch_size": knee, "train.lr": float(f"{lr_ref * ratio ** RULES[rule]:.3g}"),
            "train.lr_warmup_steps": max(1, math.ceil(warmup_ref / ratio))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("knee_json", type=Path)
    p.add_argument("config")
    p.add_argument("--rule", default="linear", choices=sorted(RULES))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    train = load_config(args.config, args.overrides).train
    knee = int(json.loads(args.knee_json.read_text())["knee"])
    for key, value in at_knee(knee, train.batch_size, train.lr, train.lr_warmup_steps, args.rule).items():
        print(f"{key}={value}")


if __name__ == "__main__":
    main()
