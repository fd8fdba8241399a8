"""`denoiser evaluate` (held-out bits/dim and per-timestep MSE, or --fid) and `denoiser attention-stats`."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from denoiser.cli.common import add_model, add_precision, add_sampling, parse_classes, read_image, sampling_request
from denoiser.request import BUILT_IN, UNGUIDED, SampleRequest

logger = logging.getLogger("denoiser.cli.main")

__all__ = ["cmd_evaluate", "cmd_attention_stats"]


def add_attention_stats_args(p: argparse.ArgumentParser) -> None:
    add_model(p)
    p.add_argument("--out-dir", required=True, help="folder for attention_stats.csv and attention_stats.png")
    p.add_argument("--images", default=None, metavar="FOLDER",
                   help="your images (a folder, searched recursively; resized and centre-cropped); default: generated ones")
    p.add_argument("--num-images", type=int, default=BUILT_IN["num_images"],
                   help=f"images in the batch (generated: {BUILT_IN['statistics_scheduler']}-{BUILT_IN['statistics_steps']} "
                        "from --seed, unguided)")
    p.add_argument("--timesteps", default=",".join(map(str, BUILT_IN["statistics_timesteps"])),
                   help="comma-separated noise levels t")
    p.add_argument("--no-heads", action="store_true", help="layers only (one ablation call per layer, not per head)")
    add_precision(p)
    p.add_argument("--class-label", default="spread", help="class (index or name) of the generated images (default: spread evenly)")
    p.add_argument("--seed", type=int, default=0)


def add_evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    p.add_argument("--data", default=None, help="image folder (ImageFolder layout); default: the model's synthetic set")
    p.add_argument("--num-images", type=int, default=64, help="images evaluated (cost: T passes per image)")
    p.add_argument("--num-timesteps", type=int, default=None, help="evaluate a strided subset of timesteps (estimate)")
    p.add_argument("--val-size", type=int, default=None, help="use the validation split of this size (seeded) from --data")
    p.add_argument("--val-seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"images per batch (default 64; --fid's samples: as `denoiser sample`, "
                        f"{BUILT_IN['cpu_batch_size']} on the CPU)")
    p.add_argument("--fid", action="store_true",
                   help="FID of --num-samples generated images against --reference instead: the images `denoiser sample` "
                        "gives with the same flags (classes spread evenly unless --class-label says otherwise)")
    p.add_argument("--num-samples", type=int, default=1000, help="generated images for --fid (report FID-N with N)")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="a text model's prompts, one per line, cycled over the images: the --fid samples' prompts, or the prompt "
                        "each --data image's bound is conditioned on (line k for image k: e.g. the held-out images' names)")
    p.add_argument("--reference", default=None, metavar="STATS.safetensors",
                   help="reference statistics for --fid; computed once from --data (its --val-size split) when missing")
    p.add_argument("--samples", default=None, metavar="IMAGES.npy",
                   help="score these uint8 (N, H, W, 3) images instead of sampling (e.g. from tools/gpu/run.sh)")
    add_sampling(p, "--fid samples", images=False)
    p.set_defaults(class_label="spread")


def cmd_attention_stats(args) -> None:
    import torch

    from denoiser.evaluate.attention_stats import attention_stats, stats_chart, write_csv
    from denoiser.folders.model_dir import load
    from denoiser.image_io import image_to_model, save_png
    from denoiser.pixels import unit_to_model
    from denoiser.sampling.plan import resolve, run

    try:
        timesteps = [int(t) for t in args.timesteps.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--timesteps expects comma-separated integers, got {args.timesteps!r}") from None
    if not 1 <= args.num_images <= 256:
        raise ValueError(f"--num-images must be in 1..256, got {args.num_images}")
    model = load(args.model)
    unet, sched = model.unet, model.noise_schedule
    n_cls = unet.config.num_class_embeds
    # the generated images: a fixed recipe (BUILT_IN's statistics sampler, no guidance), the classes asked for
    request = SampleRequest(num_images=args.num_images, classes=parse_classes(args.class_label) if n_cls else None,
                            seed=args.seed, scheduler=BUILT_IN["statistics_scheduler"], steps=BUILT_IN["statistics_steps"],
                            guidance=UNGUIDED, precision=args.precision)
    plan = resolve(request, model)
    labels = plan.labels
    if args.images:
        files = sorted(p for p in Path(args.images).rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp"))
        if not files:
            raise ValueError(f"no .png/.jpg/.webp images under {args.images!r}")
        size = unet.config.sample_size
        images = torch.cat([image_to_model(read_image(str(f), min_side=size), size) for f in files[: args.num_images]])
        labels = None if labels is None else labels[: len(images)].fill_(n_cls)  # the user's images: "no class"
        how = f"{len(images)} images from {args.images}"
    else:
        images = unit_to_model(run(plan).images)
        how = f"{args.num_images} generated images ({plan.describe()})"
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

    from denoiser.evaluate.fid import InceptionFeatures, fid_of_images, reference_statistics
    from denoiser.folders.model_dir import load
    from denoiser.pixels import to_uint8
    from denoiser.sampling.plan import resolve, run

    if args.reference is None:
        raise ValueError("--fid needs --reference STATS.safetensors (with --data FOLDER to compute it the first time)")
    if args.num_samples < 2:
        raise ValueError(f"--num-samples must be at least 2 for a covariance, got {args.num_samples}")
    model = load(args.model)
    unet = model.unet
    extractor = InceptionFeatures()
    ref = reference_statistics(args.reference, args.data, unet.config.sample_size, args.val_size or 0, args.val_seed, extractor)
    if args.samples:
        images = torch.from_numpy(np.load(args.samples)).permute(0, 3, 1, 2)[: args.num_samples]  # (N, H, W, 3) -> (N, 3, H, W)
        how = f"images from {args.samples}"
    else:  # the images `denoiser sample` gives with the same flags; the guide (if any) loads only to sample
        classes = parse_classes(args.class_label) if unet.config.num_class_embeds else None  # "spread" needs classes
        prompts = _prompts(args, unet, args.num_samples)
        fields = {"prompts": prompts} if prompts is not None else {}
        plan = resolve(sampling_request(args, num_images=args.num_samples, classes=classes, **fields), model)
        images = to_uint8(run(plan, progress=True).images)
        how = f"{plan.describe()}, " + (f"prompts {args.prompts or repr(args.prompt)}" if unet.config.cross_attention_dim
                                        else f"classes {args.class_label}")
    size = images.shape[-1]
    if ref.image_size is not None and ref.image_size != size:
        logger.warning("the reference statistics are of %dx%d images and these are %dx%d: the FID also measures the "
                       "resolution gap; for a model's own score compute a reference at its size (a new --reference "
                       "path with --data FOLDER)", ref.image_size, ref.image_size, size, size)
    score = fid_of_images(images, ref, extractor)
    print(json.dumps({"fid": round(score, 3), "num_samples": len(images), "samples": how,
                      "reference": {"path": args.reference, "num_images": ref.num_images, "image_size": ref.image_size}},
                     indent=1))


def _prompts(args, unet, n: int) -> list[str] | None:
    """A text model's prompts for `n` images: --prompts FILE's lines cycled over the images (e.g. the held-out
    images' own names), else None (--prompt for all); None for a class model (its classes)."""
    if unet.config.cross_attention_dim is None:
        if args.prompts:
            raise ValueError("--prompts is for a text model; this one has classes (--class-label)")
        return None
    if not args.prompts:
        if args.prompt is None:
            raise ValueError("a text model's evaluation needs prompts: --prompts FILE (one per line, cycled over the "
                             "images; e.g. the validation images' names) or --prompt TEXT for all (\"\": no condition)")
        return None
    from denoiser.model.text import prompts_from_file

    return prompts_from_file(args.prompts, n)


def cmd_evaluate(args) -> None:
    if args.fid:
        return cmd_fid(args)
    import torch

    from denoiser.data import load_dataset, make_synthetic, split
    from denoiser.diffusion import Diffusion
    from denoiser.folders.model_dir import load
    from denoiser.train.config import DataConfig

    model = load(args.model)
    unet, sched = model.unet, model.noise_schedule
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
    text = {}
    if unet.config.cross_attention_dim:  # a text model: the bound given each image's prompt
        from denoiser.model.text import encode_prompts

        prompts = _prompts(args, unet, n) or [args.prompt] * n
        with torch.no_grad():
            states, mask = encode_prompts(model.text.tokenizer, model.text.encoder, prompts)
        text = {"encoder_hidden_states": states, "encoder_attention_mask": mask.bool()}  # (N, L, D), (N, L)
    res = Diffusion(sched).evaluate(unet, x, labels, batch_size=args.batch_size or 64, num_timesteps=args.num_timesteps,
                                    seed=args.seed, unet_kwargs=text)
    print(json.dumps(res.to_dict(), indent=1))
