"""`denoiser train | sample | attention | attention-stats | evaluate | denoise | edit | inpaint | app | build-kernels`:
the command line, the only place that parses argv (`denoiser app` hands its arguments to the web app's own parser)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

logger = logging.getLogger("denoiser.cli")

__all__ = ["main", "build_parser"]


DEFAULT_MODEL = "synthetic-shapes"  # found by name: $DENOISER_WEIGHTS, then a clone's weights/


def _class_index(model_dir: str, text: str) -> int:
    """--class-label as an index: a number, or a name from the model folder's classes.txt."""
    if text.lstrip("-").isdigit():
        return int(text)
    from denoiser.model_dir import read_classes

    config = json.loads((Path(model_dir) / "unet" / "config.json").read_text())
    names = read_classes(model_dir, config.get("num_class_embeds"))
    if text not in names:
        raise ValueError(f"unknown class {text!r}; this model's classes: {', '.join(names) or 'none (unconditional)'}")
    return names.index(text)


def _pixel(text: str) -> tuple[int, int]:
    try:
        y, x = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--pixel expects Y,X (two integers), got {text!r}") from None
    return y, x


def _add_guidance(p: argparse.ArgumentParser, what: str = "samples") -> None:
    """The guidance flags (denoiser.guidance); unset ones come from the model folder's sampling.json, else off."""
    g = p.add_argument_group("guidance", f"how the {what} are guided; unset: the model folder's sampling.json, else off")
    g.add_argument("--guidance", type=float, default=None,
                   help="classifier-free guidance scale (class-conditional models with a class; 1 = off, 2-3 = clearer classes)")
    g.add_argument("--pag-scale", type=float, default=None,
                   help="perturbed-attention guidance: steer away from the model with attention switched to identity (0 = off)")
    g.add_argument("--pag-layers", default=None, metavar="NAMES",
                   help="comma-separated attention layers PAG perturbs (as `denoiser attention-stats` names them; default: the up path's first level, up.0.attn.*)")
    g.add_argument("--guide-model", default=None, metavar="FOLDER",
                   help="autoguidance: a smaller or less-trained model of the same data and classes")
    g.add_argument("--guide-scale", type=float, default=None, help="autoguidance weight (1 = off)")
    g.add_argument("--guidance-interval", type=float, nargs=2, default=None, metavar=("LO", "HI"),
                   help="apply the guidance only at timesteps LO..HI (one plain UNet pass at the others); "
                        "0 999 applies it at every step")


def _guidance(args, unet, sched, class_given: bool = True):
    from denoiser.guidance import guidance_for

    return guidance_for(args.model, unet, sched.config, args.guidance, args.pag_scale, args.pag_layers,
                        args.guide_model, args.guide_scale, has_class=class_given,
                        guidance_interval=args.guidance_interval)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="denoiser", description="Attention U-Net diffusion: train, sample, inspect.")
    sub = p.add_subparsers(dest="command", required=True)
    _add_train_args(sub)
    _add_sample_args(sub)
    _add_attention_args(sub)
    _add_restore_args(sub)
    _add_attention_stats_args(sub)
    _add_evaluate_args(sub)
    sub.add_parser("app", add_help=False, help="serve the web app on 127.0.0.1 (`denoiser app --help`: its options)")
    k = sub.add_parser("build-kernels", help="compile the optional C++ kernels for this torch and CPU (make venv runs it)")
    k.add_argument("--verbose", action="store_true", help="show the compiler's output")
    return p


def _add_train_args(sub) -> None:
    from denoiser.train import add_train_arguments  # shared with `accelerate launch -m denoiser.train`

    add_train_arguments(sub.add_parser("train", help="train a UNet (also: accelerate launch -m denoiser.train ...)"))


def _add_sample_args(sub) -> None:
    from denoiser.sample import SCHEDULERS, TIMESTEP_SPACINGS

    s = sub.add_parser("sample", help="generate images into a PNG grid")
    s.add_argument("--model", default=None, help="model folder (diffusers pipeline format); default: the shipped synthetic-shapes")
    s.add_argument("--out", required=True, help="output PNG")
    s.add_argument("--num-images", type=int, default=16)
    s.add_argument("--batch-size", type=int, default=64, help="images per forward pass")
    s.add_argument("--scheduler", default="ddim", choices=list(SCHEDULERS))
    s.add_argument("--timestep-spacing", default=None, choices=list(TIMESTEP_SPACINGS),
                   help="which timesteps the sampler visits (default: the scheduler's); trailing suits few-step DDIM")
    s.add_argument("--steps", type=int, default=50)
    s.add_argument("--eta", type=float, default=0.0, help="DDIM eta (0 = deterministic)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--class-label", default=None, help="class of a class-conditional model: an index or a name (classes.txt)")
    _add_guidance(s)
    s.add_argument("--trajectory", default=None, help="also write the denoising trajectory (x_t over x0) PNG here")
    s.add_argument("--trajectory-every", type=int, default=5)
    s.add_argument("--scale", type=int, default=4, help="upscale the grid (nearest) for viewing")


def _add_attention_args(sub) -> None:
    a = sub.add_parser("attention", help="attention maps of one pixel at every attention layer")
    a.add_argument("--model", default=None, help="model folder; default: the shipped synthetic-shapes")
    a.add_argument("--pixel", type=_pixel, required=True, help="query pixel Y,X in image coordinates")
    a.add_argument("--out", required=True, help="output PNG")
    a.add_argument("--steps", type=int, default=50)
    a.add_argument("--at-step", type=int, default=None, help="sampling step to inspect (default: the last)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--class-label", default=None, help="class index or name")


def _add_restore_args(sub) -> None:
    """denoise, edit and inpaint: one set of flags, and each operation's own."""
    from denoiser.restore import METHODS

    for name, what in (("denoise", "remove Gaussian noise from your image"), ("edit", "SDEdit: re-imagine your image"),
                       ("inpaint", "regenerate the masked pixels of your image")):
        r = sub.add_parser(name, help=what)
        r.add_argument("--model", default=None, help="model folder; default: the shipped synthetic-shapes")
        r.add_argument("--image", required=True, help="input image (any size or mode: converted to RGB, resized, centre-cropped)")
        r.add_argument("--out", required=True, help="output PNG (the model's size)")
        r.add_argument("--compare", default=None, help="also write input | result side by side (PNG)")
        r.add_argument("--steps", type=int, default=50, help="reverse-chain steps")
        r.add_argument("--seed", type=int, default=0)
        r.add_argument("--class-label", default=None, help="class index or name")
        _add_guidance(r, "restored images")
        r.add_argument("--add-noise", type=float, default=None, metavar="SIGMA",
                       help="add Gaussian noise of this std ([0, 1] pixel scale) first, to see the round trip (PSNR printed)")
        if name == "denoise":
            r.add_argument("--sigma", type=float, default=None, help="noise std of the input ([0, 1] scale); default: estimated")
            r.add_argument("--method", default="mmse", choices=METHODS,
                           help="mmse: one x0 prediction (smooth, best PSNR); sample: the reverse chain (sharper)")
        if name == "edit":
            r.add_argument("--strength", type=float, default=0.6, help="0 keeps the image, 1 samples anew")
        if name == "inpaint":
            r.add_argument("--mask", required=True, help="mask image of the input's size: white = regenerate, black = keep")


def _add_attention_stats_args(sub) -> None:
    st = sub.add_parser("attention-stats", help="what each attention layer and head does over the noise levels: CSV + charts")
    st.add_argument("--model", default=None, help="model folder; default: the shipped synthetic-shapes")
    st.add_argument("--out-dir", required=True, help="folder for attention_stats.csv and attention_stats.png")
    st.add_argument("--images", default=None, metavar="FOLDER",
                    help="your images (a folder, searched recursively; resized and centre-cropped); default: generated ones")
    st.add_argument("--num-images", type=int, default=8, help="images in the batch (generated: DDIM-25 from --seed)")
    st.add_argument("--timesteps", default=",".join(map(str, (999, 800, 600, 400, 250, 100, 30))),
                    help="comma-separated noise levels t")
    st.add_argument("--no-heads", action="store_true", help="layers only (one ablation call per layer, not per head)")
    st.add_argument("--class-label", default=None, help="class (index or name) of the generated images (default: spread evenly)")
    st.add_argument("--seed", type=int, default=0)


def _add_evaluate_args(sub) -> None:
    e = sub.add_parser("evaluate", help="held-out bits/dim and per-timestep MSE, as JSON")
    e.add_argument("--model", required=True)
    e.add_argument("--data", default=None, help="image folder (ImageFolder layout); default: the model's synthetic set")
    e.add_argument("--num-images", type=int, default=64, help="images evaluated (cost: T passes per image)")
    e.add_argument("--num-timesteps", type=int, default=None, help="evaluate a strided subset of timesteps (estimate)")
    e.add_argument("--val-size", type=int, default=None, help="use the validation split of this size (seeded) from --data")
    e.add_argument("--val-seed", type=int, default=0)
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--fid", action="store_true",
                   help="FID of --num-samples generated images (DDIM, classes spread evenly) against --reference instead")
    e.add_argument("--num-samples", type=int, default=1000, help="generated images for --fid (report FID-N with N)")
    e.add_argument("--sample-steps", type=int, default=50, help="DDIM steps for --fid")
    e.add_argument("--reference", default=None, metavar="STATS.safetensors",
                   help="reference statistics for --fid; computed once from --data (its --val-size split) when missing")
    e.add_argument("--samples", default=None, metavar="IMAGES.npy",
                   help="score these uint8 (N, H, W, 3) images instead of sampling (e.g. from bench/gpu/run.sh)")
    _add_guidance(e, "--fid samples")


def cmd_build_kernels(args) -> None:
    from denoiser.fast.kernels import build_kernels

    try:
        print(f"denoiser kernels: {build_kernels(verbose=args.verbose)}")
    except RuntimeError as err:  # no compiler: say so; everything still runs on the reference paths
        raise ValueError(str(err)) from err


def cmd_train(args) -> None:
    from denoiser.train import cmd_train as run_training  # also `accelerate launch -m denoiser.train`'s entry

    run_training(args)


def cmd_sample(args) -> None:
    from denoiser.image_io import save_grid
    from denoiser.model_dir import load_model
    from denoiser.sample import make_sampler, sample, trajectory_strip

    unet, train_sched = load_model(args.model)
    guidance = _guidance(args, unet, train_sched, args.class_label is not None)
    sched = make_sampler(args.scheduler, train_sched.config, args.timestep_spacing)
    chunks = []
    for start in range(0, args.num_images, args.batch_size):
        n = min(args.batch_size, args.num_images - start)
        res = sample(unet, sched, n, args.steps, seed=args.seed + start, eta=args.eta, class_labels=args.class_label,
                     guidance=guidance,
                     trajectory_every=args.trajectory_every if (args.trajectory and start == 0) else 0)
        chunks.append(res.images)
        if args.trajectory and start == 0:
            strip = trajectory_strip(res.trajectory)
            save_grid(strip, args.trajectory, nrow=strip.shape[0] // 2, scale=args.scale)
            print(f"trajectory: {args.trajectory} (top: x_t, bottom: predicted x0)")
    import torch

    print(f"samples: {save_grid(torch.cat(chunks), args.out, scale=args.scale)}")


def cmd_attention(args) -> None:
    from denoiser.image_io import save_png
    from denoiser.model_dir import load_model
    from denoiser.sample import make_sampler, sample
    from denoiser.visualize import attention_panel

    unet, train_sched = load_model(args.model)
    size = unet.config.sample_size
    y, x = args.pixel
    if not (0 <= y < size and 0 <= x < size):
        raise ValueError(f"--pixel {y},{x} is outside the {size}x{size} image; use 0..{size - 1}")
    at = args.steps - 1 if args.at_step is None else args.at_step
    if not 0 <= at < args.steps:
        raise ValueError(f"--at-step must be in 0..{args.steps - 1}, got {at}")
    res = sample(unet, make_sampler("ddim", train_sched.config), 1, args.steps, seed=args.seed,
                 class_labels=args.class_label, capture_steps=[at])
    panel = attention_panel(res.images[0], res.attention[at], (y, x))
    print(f"attention: {save_png(panel, args.out)} ({len(res.attention[at])} layers, step {at} of {args.steps})")


def _read_image(path: str, what: str = "image", min_side: int | None = None):
    """An image file as RGB (denoiser.image_io: bounded memory, upright); errors name the file."""
    from denoiser.image_io import open_image

    return open_image(path, min_side=min_side, what=f"{what} {path!r}")


def cmd_restore(args) -> None:
    import torch

    from denoiser.diffusion import Diffusion
    from denoiser.image_io import save_grid, to_unit
    from denoiser.model_dir import load_model
    from denoiser.restore import restore

    unet, sched = load_model(args.model)
    size = unet.config.sample_size
    img = _read_image(args.image, min_side=size)
    mask = _read_image(args.mask, "mask") if args.command == "inpaint" else None
    guidance = _guidance(args, unet, sched, args.class_label is not None)
    if img.size != (size, size):
        print(f"input resized and centre-cropped from {img.width}x{img.height} to {size}x{size} (the model's size)")
    own = {k: getattr(args, k) for k in ("method", "strength") if hasattr(args, k)}  # this subcommand's flags only
    res = restore(
        unet, Diffusion(sched), img, args.command, mask=mask, sigma=args.add_noise if getattr(args, "sigma", None) is None else args.sigma,
        noise_first=args.add_noise, steps=args.steps, seed=args.seed, class_label=args.class_label, guidance=guidance, **own,
    )
    print(f"{args.command}: {save_grid(res.result.images, args.out)}")
    if args.compare:
        shown = [to_unit(res.clean)] + ([to_unit(res.noisy)] if res.noisy is not None else []) + [res.result.images]
        save_grid(torch.cat(shown), args.compare, nrow=len(shown), scale=max(1, 128 // size))
        print(f"compare: {args.compare} (input{', noisy' if res.noisy is not None else ''}, result)")
    if res.noisy is not None:
        noisy_db, result_db = res.psnr()
        print(f"PSNR vs the clean input: noisy {noisy_db:.2f} dB, result {result_db:.2f} dB")


def cmd_attention_stats(args) -> None:
    import torch

    from denoiser.attention_stats import attention_stats, stats_chart, write_csv
    from denoiser.fid import spread_labels
    from denoiser.image_io import image_to_model, save_png
    from denoiser.model_dir import load_model
    from denoiser.sample import make_sampler, sample

    try:
        timesteps = [int(t) for t in args.timesteps.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--timesteps expects comma-separated integers, got {args.timesteps!r}") from None
    if not 1 <= args.num_images <= 256:
        raise ValueError(f"--num-images must be in 1..256, got {args.num_images}")
    unet, sched = load_model(args.model)
    n_cls = unet.config.num_class_embeds
    labels = None
    if n_cls:
        labels = spread_labels(args.num_images, n_cls) if args.class_label is None else torch.full((args.num_images,), args.class_label)
    if args.images:
        files = sorted(p for p in Path(args.images).rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp"))
        if not files:
            raise ValueError(f"no .png/.jpg/.webp images under {args.images!r}")
        size = unet.config.sample_size
        images = torch.cat([image_to_model(_read_image(str(f), min_side=size), size) for f in files[: args.num_images]])
        labels = None if labels is None else labels[: len(images)].fill_(n_cls)  # the user's images: "no class"
        how = f"{len(images)} images from {args.images}"
    else:
        images = sample(unet, make_sampler("ddim", sched.config), args.num_images, 25, seed=args.seed, class_labels=labels).images
        images = images * 2 - 1
        how = f"{args.num_images} generated images (DDIM-25, seed {args.seed})"
    rows = attention_stats(unet, sched, images, labels, timesteps, heads=not args.no_heads, seed=args.seed)
    out = Path(args.out_dir)
    csv_path = write_csv(rows, out / "attention_stats.csv")
    png = save_png(stats_chart(rows), out / "attention_stats.png")
    print(f"attention stats of {how}: {csv_path} ({len(rows)} rows), charts {png}")
    layers = [r for r in rows if r.head == -1]
    top = sorted(layers, key=lambda r: -r.output_change)[:5]
    print("largest effects of switching a layer to identity (t, layer, output change, eps-MSE change):")
    for r in top:
        print(f"  t={r.timestep:4d} {r.layer:16s} {r.output_change:.4f} {r.eps_mse_delta:+.5f}")


def cmd_fid(args) -> None:
    import numpy as np
    import torch

    from denoiser.fid import InceptionFeatures, fid_of_images, generate_images, reference_statistics
    from denoiser.model_dir import load_model

    if args.reference is None:
        raise ValueError("--fid needs --reference STATS.safetensors (with --data FOLDER to compute it the first time)")
    if args.num_samples < 2:
        raise ValueError(f"--num-samples must be at least 2 for a covariance, got {args.num_samples}")
    unet, sched = load_model(args.model)
    extractor = InceptionFeatures()
    ref = reference_statistics(args.reference, args.data, unet.config.sample_size, args.val_size or 0, args.val_seed, extractor)
    if args.samples:
        images = torch.from_numpy(np.load(args.samples)).permute(0, 3, 1, 2)[: args.num_samples]  # (N, H, W, 3) -> (N, 3, H, W)
        how = f"images from {args.samples}"
    else:  # the guide (if any) loads only when there is sampling to do
        guidance = _guidance(args, unet, sched, bool(unet.config.num_class_embeds))
        images = generate_images(unet, sched.config, args.num_samples, steps=args.sample_steps, seed=args.seed,
                                 batch_size=args.batch_size, guidance=guidance)
        how = f"ddim-{args.sample_steps}, {guidance.describe()}, seed {args.seed}, classes spread evenly"
    size = images.shape[-1]
    if ref.image_size is not None and ref.image_size != size:
        logger.warning("the reference statistics are of %dx%d images and these are %dx%d: the FID also measures the "
                       "resolution gap; for a model's own score compute a reference at its size (a new --reference "
                       "path with --data FOLDER)", ref.image_size, ref.image_size, size, size)
    score = fid_of_images(images, ref, extractor)
    print(json.dumps({"fid": round(score, 3), "num_samples": len(images), "samples": how,
                      "reference": {"path": args.reference, "num_images": ref.num_images, "image_size": ref.image_size}},
                     indent=1))


def cmd_evaluate(args) -> None:
    if args.fid:
        return cmd_fid(args)
    import torch

    from denoiser.config import DataConfig
    from denoiser.data import load_dataset, make_synthetic, split
    from denoiser.diffusion import Diffusion
    from denoiser.model_dir import load_model

    unet, sched = load_model(args.model)
    size = unet.config.sample_size
    if args.data:
        ds = load_dataset(DataConfig(dataset="folder", path=args.data), size)
    else:
        ds = make_synthetic(max(args.num_images, 1), size, seed=10_000)  # a seed the training set does not use
    if args.val_size:
        _, ds = split(ds, args.val_size, args.val_seed)
    n = min(args.num_images, len(ds))
    x, labels = ds.batch(torch.arange(n))
    if not unet.config.num_class_embeds:
        labels = None
    res = Diffusion(sched).evaluate(unet, x, labels, batch_size=args.batch_size, num_timesteps=args.num_timesteps,
                                    seed=args.seed)
    print(json.dumps(res.to_dict(), indent=1))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["app"]:  # the web app parses its own arguments (`denoiser app --help`)
        from denoiser.app import main as app_main

        app_main(argv[1:])
        return 0
    args = build_parser().parse_args(argv)
    handler = {"train": cmd_train, "sample": cmd_sample, "attention": cmd_attention, "evaluate": cmd_evaluate,
               "denoise": cmd_restore, "edit": cmd_restore, "inpaint": cmd_restore, "build-kernels": cmd_build_kernels,
               "attention-stats": cmd_attention_stats}
    from denoiser.fast import malloc

    malloc.configure()  # freed activations stay in the heap for the next step (denoiser/malloc.py)
    try:
        if hasattr(args, "model"):  # a folder, or a name under $DENOISER_WEIGHTS / a clone's weights/
            from denoiser.model_dir import find_model

            args.model = str(find_model(args.model or DEFAULT_MODEL))
        if getattr(args, "class_label", None) is not None:
            args.class_label = _class_index(args.model, args.class_label)
        handler[args.command](args)
    except (ValueError, FileNotFoundError) as err:
        print(f"denoiser {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
