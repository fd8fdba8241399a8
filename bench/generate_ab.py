"""Does a speed piece pay for a whole Generate? Each against today's eager path, end to end (issues 58 and 59).

    PYTHONPATH=/path/to/openvino-wheel-dir .venv/bin/python -m bench.generate_ab --openvino --bf16
    .venv/bin/python -m bench.generate_ab --direct-conv

bench/cpu_roofline.py times the UNet call alone; this times what a person waits for: the model's own Generate of
`--images` images (its folder's sampler, steps and guidance; classes spread, or the prompt "red apple") through
`denoiser.sampling.plan.resolve`/`run`, as the CLI and the app run it. Sides, alternating run by run after a warm-up, median
of `--repeats`:
  - eager:        today's path (float32 here where bf16 does not measure faster: denoiser.fast.precision decides);
  - openvino-f32 (`--openvino`): the same run with each UNet call served by OpenVINO's CPU plugin (INFERENCE_PRECISION_HINT f32), a
                  model converted from `torch.export` and compiled per input shape during the warm-up, i.e. the best
                  case for it: no conversion or compile counted, as if prepared when the model was installed;
  - openvino-bf16 (`--bf16`): the same with OpenVINO's bf16 inference precision;
  - direct-conv (`--direct-conv`): eager with DENOISER_WINOGRAD=0, i.e. torch's own 3x3 convolutions instead of
                  denoiser.fast.winograd's (the path before issue 58's Winograd kernel).
It prints each side's seconds, its speed against eager (above 1: faster) and the largest pixel difference of the images (0..255). The repository keeps a piece only if this shows it pays at least 5 % on a whole Generate (bench/generate_ab.md).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from bench.common import cpu_name
from denoiser.fast.precision import choose_precision
from denoiser.fast.winograd import switched
from denoiser.folders.model_dir import load
from denoiser.request import SampleRequest
from denoiser.sampling.plan import resolve, run

WEIGHTS = Path(__file__).resolve().parent.parent / "weights"
INPUTS = ("class_labels", "encoder_hidden_states", "encoder_attention_mask")  # the UNet's optional tensor inputs


class _Positional(torch.nn.Module):
    """The UNet with positional tensor inputs (sample, a timestep per image, then the optional ones present) and a
    tensor output, as torch.export and OpenVINO take it."""

    def __init__(self, unet, names: tuple[str, ...]):
        super().__init__()
        self.unet, self.names = unet, names

    def forward(self, sample, timestep, *rest):
        return self.unet(sample, timestep, **dict(zip(self.names, rest))).sample


class OpenVinoServed:
    """Inside `with served:`, `unet.forward` is replaced by OpenVINO calls, one compiled model per input signature
    (batch, size, inputs present), compiled the first time it is seen and kept for later runs."""

    def __init__(self, unet, hint: str):
        import openvino as ov

        self.unet, self.hint, self.core, self.ov = unet, hint, ov.Core(), ov
        self.eager = unet.forward
        self.compiled: dict[tuple, object] = {}

    def __enter__(self):
        self.unet.forward = self.forward
        return self

    def __exit__(self, *exc) -> None:
        self.unet.forward = self.eager

    def forward(self, sample, timestep, class_labels=None, encoder_hidden_states=None, encoder_attention_mask=None,
                return_dict=True, **others):
        if others:  # anything this runtime was not converted for: eager
            return self.eager(sample, timestep, class_labels=class_labels, encoder_hidden_states=encoder_hidden_states,
                              encoder_attention_mask=encoder_attention_mask, return_dict=return_dict, **others)
        given = {"class_labels": class_labels, "encoder_hidden_states": encoder_hidden_states,
                 "encoder_attention_mask": encoder_attention_mask}
        names = tuple(k for k in INPUTS if given[k] is not None)
        t = torch.as_tensor(timestep).reshape(-1).expand(sample.shape[0]).contiguous()  # (B,)
        args = (sample.float().contiguous(), t, *(given[k].contiguous() for k in names))
        key = (names, *(tuple(a.shape) for a in args), *(a.dtype for a in args))
        if key not in self.compiled:
            with torch.no_grad():
                self.unet.forward = self.eager  # export traces the eager model
                try:
                    program = torch.export.export(_Positional(self.unet, names).eval(), args)
                finally:
                    self.unet.forward = self.forward
            model = self.ov.convert_model(program)
            compiled = self.core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": self.hint,
                                                              "INFERENCE_NUM_THREADS": torch.get_num_threads(),
                                                              "PERFORMANCE_HINT": "LATENCY"})
            self.compiled[key] = compiled.create_infer_request()
        request = self.compiled[key]
        request.infer([a.numpy() for a in args])
        out = torch.from_numpy(request.get_output_tensor(0).data.copy()).to(sample.dtype)
        return SimpleNamespace(sample=out) if return_dict else (out,)


def generate(model, images: int):
    if model.text is not None:
        request = SampleRequest(num_images=images, seed=0, prompts="red apple")
    else:
        request = SampleRequest(num_images=images, seed=0, classes="spread" if model.unet.config.num_class_embeds else None)
    return run(resolve(request, model)).images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["cifar10", "emoji"])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--openvino", action="store_true", help="add OpenVINO's f32 inference (needs openvino)")
    parser.add_argument("--bf16", action="store_true", help="with --openvino: add its bf16 inference precision")
    parser.add_argument("--direct-conv", action="store_true", help="add eager with torch's own 3x3 convolutions")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}; torch threads {torch.get_num_threads()}")
    if not (args.openvino or args.direct_conv):
        parser.error("nothing to compare eager with: pass --openvino (and --bf16), or --direct-conv")
    hints = (["f32", "bf16"] if args.bf16 else ["f32"]) if args.openvino else []
    others = [f"openvino-{h}" for h in hints] + (["direct-conv"] if args.direct_conv else [])
    print("| model | images | eager s | " + " | ".join(f"{side} s | its speed vs eager | max px diff" for side in others)
          + " |")
    print("|---|---|---|" + "---|---|---|" * len(others))
    for name in args.models:
        model = load(WEIGHTS / name)
        precision = choose_precision(model.unet)
        sides = {"eager": contextlib.nullcontext}
        served = {h: OpenVinoServed(model.unet, h) for h in hints}
        sides.update({f"openvino-{h}": (lambda s=served[h]: s) for h in hints})
        if args.direct_conv:
            sides["direct-conv"] = lambda: switched(False)
        times = {side: [] for side in sides}
        results = {}
        for rep in range(args.repeats + 1):  # the first round warms up (and compiles each shape): not counted
            for side, enter in sides.items():
                with enter():
                    t0 = time.perf_counter()
                    results[side] = generate(model, args.images)
                    if rep:
                        times[side].append(time.perf_counter() - t0)
        eager = statistics.median(times["eager"])
        cells = []
        for side in others:
            t = statistics.median(times[side])
            diff = (results[side].float() - results["eager"].float()).abs().max().item() * 255
            cells.append(f"{t:.2f} | {eager / t:.3f}x | {diff:.1f}")
        print(f"| {name} (eager {precision.name}) | {args.images} | {eager:.2f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
