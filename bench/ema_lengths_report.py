"""bench/ema_lengths.sh's table as a curve: FID against each tracked EMA's averaging length at the run's last step.

    .venv/bin/python -m bench.ema_lengths_report runs/ema-lengths runs/ema-lengths.log --out bench/ema_lengths

A power-function warm-up EMA (decay_k = 1 - (1 + k / inv_gamma) ** -power, capped at the ceiling) averages, at step
n, over about 1 / (1 - decay_n) = (1 + n / inv_gamma) ** power steps: its length. Writes OUT.png (FID against length)
and OUT.md (the table, the run's settings, the spread against FID's own noise).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml

from denoiser.image_io import save_png
from denoiser.pictures import loss_curve

FID_NOISE = 1.31  # FID-1k's spread over seeds at this size (weights/cifar10/sampling.json's note)


def length(step: int, power: float, ceiling: float, inv_gamma: float = 1.0) -> float:
    """Steps an EMA of this warm-up averages over at `step` (1 / (1 - decay))."""
    decay = min(ceiling, 1 - (1 + step / inv_gamma) ** -power)
    return 1 / (1 - decay)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("log", type=Path, help="bench/ema_lengths.sh's output (its table at the end)")
    p.add_argument("--out", type=Path, default=Path("bench/ema_lengths"))
    p.add_argument("--cpu", default="", help="the CPU the run used (lscpu), for the note")
    args = p.parse_args()
    train = yaml.safe_load((args.run / "config.yaml").read_text())["train"]
    step = json.loads((args.run / "train_summary.json").read_text()).get("step") or int(
        re.findall(r"reached at step (\d+)", args.log.read_text())[-1])
    rows = []
    for folder, fid in re.findall(r"^\| (model\S*) \| ([\d.]+) \|$", args.log.read_text(), re.M):
        power = float(folder.removeprefix("model-ema-power-")) if folder.startswith("model-ema-power-") else train["ema_power"]
        rows.append((length(step, power, train["ema_max_decay"], train.get("ema_inv_gamma", 1.0)), power, folder, float(fid)))
    rows.sort()
    spread = max(r[3] for r in rows) - min(r[3] for r in rows)
    curve = loss_curve([round(r[0]) for r in rows], [r[3] for r in rows], title=f"FID-1k against EMA length (step {step})")
    save_png(curve, args.out.with_suffix(".png"))
    lines = [
        "# FID against EMA length (issue 50, item 3)",
        "",
        f"One run continuing `weights/cifar10` ({step} steps of batch {train['batch_size']}, lr {train['lr']}, "
        f"configs/cifar10.yaml) tracked {len(rows)} EMA lengths (`train.ema_extra_powers`; the run's own EMA: power "
        f"{train['ema_power']}), each exported and scored with FID-1k on the 5,000-image validation split "
        f"(`bench/ema_lengths.sh`). {args.cpu}",
        "",
        "| EMA | warm-up power | length at the last step (steps) | FID-1k |",
        "|---|---|---|---|",
        *(f"| {folder} | {power:g} | {n:,.0f} | {fid:.2f} |" for n, power, folder, fid in rows),
        "",
        f"Spread: **{spread:.2f}** against FID-1k's own noise of {FID_NOISE} (the same model scored with other seeds). "
        + ("The spread is within the noise: the tracked lengths are kept, and post-hoc EMA (EDM2) is not built."
           if spread <= FID_NOISE else
           f"The spread is {spread / FID_NOISE:.1f}x the noise: at its edge. Best: {rows[min(range(len(rows)), key=lambda i: rows[i][3])][2]}."
           if spread < 2 * FID_NOISE else
           "The spread is more than twice the noise: EMA length matters here, and post-hoc EMA (EDM2) would pay."),
        "",
        f"![FID against EMA length]({args.out.with_suffix('.png').name})",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
