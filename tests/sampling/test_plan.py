"""The sampling core (denoiser/sampling/plan.py; the loop under it is tests/sampling/test_loop.py's): one request
resolved against a model folder, one seed rule, the same images through every front door (the CLI, `evaluate --fid`,
the pipeline, the app's engine), whatever the batch size."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, DiffusionPipeline
from PIL import Image

from denoiser.app.engine import Engine
from denoiser.cli.main import main
from denoiser.evaluate.fid import Statistics
from denoiser.folders.model_dir import LoadedModel, read_defaults
from denoiser.image_io import to_pil
from denoiser.request import BUILT_IN, SCHEDULERS, UNGUIDED, GuidanceRequest, SampleRequest
from denoiser.sampling.loop import SAMPLERS, sample, spread_labels
from denoiser.sampling.pipeline import save_pipeline
from denoiser.sampling.plan import resolve, run
from tests.conftest import ROOT


@pytest.fixture
def folder(tmp_path, class_unet):
    """A class-conditional model folder as training writes it, with class names."""
    out = save_pipeline(class_unet, DDPMScheduler(timestep_spacing="trailing"), tmp_path / "weights" / "m",
                        classes=["red", "green", "blue"])
    return out


def _png(path) -> torch.Tensor:
    return torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)  # (H, W, 3) -> (3, H, W)


def _uint8(images: torch.Tensor) -> torch.Tensor:
    return images.mul(255).round().to(torch.uint8)


def test_the_request_names_the_samplers_offered():
    assert tuple(SAMPLERS) == SCHEDULERS


# How far the UNet's batching may move a pixel: not at all. Every sampling door computes an image's rows the same way
# in any batch (Winograd's per-image blocks, the timestep rows one at a time, the RGB convolutions one image at a
# time: docs/reproducibility.md); before that, float32 rounding moved pixels by up to 1.1e-4 (DDPM, AVX2-only Zen 3).
BATCHING_ATOL = 0.0


@pytest.mark.parametrize("scheduler", ["ddim", "ddpm"])
def test_batch_size_never_changes_an_image(folder, scheduler):
    request = SampleRequest(num_images=5, classes="spread", seed=11, steps=3, scheduler=scheduler, eta=0.0)
    whole = run(resolve(SampleRequest(**{**request.__dict__, "batch_size": 5}), folder)).images
    for batch_size in (1, 2):
        split = run(resolve(SampleRequest(**{**request.__dict__, "batch_size": batch_size}), folder)).images
        # the same noise; only the UNet's batching differs
        torch.testing.assert_close(split, whole, rtol=0, atol=BATCHING_ATOL)
    # image k is seeded seed + k: the request that starts at seed 13 gives images 2.. of this one
    later = run(resolve(SampleRequest(**{**request.__dict__, "seed": 13, "num_images": 3, "classes": [2, 0, 1]}), folder))
    torch.testing.assert_close(later.images, whole[2:], rtol=0, atol=BATCHING_ATOL)
    shard = run(resolve(request, folder), indices=[3, 4]).images  # one shard of an FID run
    torch.testing.assert_close(shard, whole[3:], rtol=0, atol=BATCHING_ATOL)


def test_ddpm_and_ddim_eta_draw_their_step_noise_per_image(folder):
    for fields in ({"scheduler": "ddpm"}, {"scheduler": "ddim", "eta": 0.7}):
        plan = resolve(SampleRequest(num_images=3, seed=4, steps=3, batch_size=3, **fields), folder)
        together = run(plan).images
        alone = run(resolve(SampleRequest(num_images=1, seed=5, steps=3, **fields), folder)).images
        torch.testing.assert_close(alone, together[1:2], rtol=0, atol=BATCHING_ATOL)
        assert (together[0] - together[1]).abs().max() > 0.05  # and the images differ from each other


@pytest.mark.parametrize("scheduler", ["ddim", "ddpm"])
def test_every_front_door_gives_the_same_images(folder, tmp_path, capsys, monkeypatch, scheduler):
    n, seed = 4, 7
    args = ["--model", str(folder), "--seed", str(seed), "--steps", "3", "--scheduler", scheduler, "--class-label", "green",
            "--guidance-scale", "2"]
    # the CLI, in two batch sizes, one PNG per image
    assert main(["sample", *args, "--num-images", str(n), "--out-dir", str(tmp_path / "a"), "--batch-size", "3"]) == 0
    assert main(["sample", *args, "--num-images", str(n), "--out-dir", str(tmp_path / "b"), "--batch-size", "1"]) == 0
    cli = torch.stack([_png(tmp_path / "a" / f"{k:06d}.png") for k in range(n)])
    other_batches = torch.stack([_png(tmp_path / "b" / f"{k:06d}.png") for k in range(n)])
    assert (cli.int() - other_batches.int()).abs().max() <= 1  # float rounding of a batched UNet, at most one level
    # the diffusers pipeline, one generator per image seeded seed + k
    pipe = DiffusionPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    if scheduler == "ddpm":
        pipe.scheduler = DDPMScheduler.from_config(pipe.scheduler.config)
    gens = [torch.Generator().manual_seed(seed + k) for k in range(n)]
    piped = _uint8(pipe(n, class_labels="green", guidance_scale=2.0, num_inference_steps=3, generator=gens,
                        output_type="pt").images)
    assert (piped.int() - cli.int()).abs().max() <= 1
    # the app's engine
    engine = Engine(folder.parent)
    gen = engine.generate("m", SampleRequest(scheduler=scheduler, steps=3, seed=seed, num_images=n, classes=1,
                                             guidance=GuidanceRequest(guidance_scale=2.0)))
    assert (_uint8(gen.images).int() - cli.int()).abs().max() <= 1
    # evaluate --fid scores exactly these images
    scored = []

    def fid_of_images(images, reference, extractor=None) -> float:  # the Inception network is not what is tested
        scored.append(images)
        return 1.0

    monkeypatch.setattr("denoiser.evaluate.fid.fid_of_images", fid_of_images)
    monkeypatch.setattr("denoiser.evaluate.fid.InceptionFeatures", lambda *a, **k: None)
    monkeypatch.setattr("denoiser.evaluate.fid.reference_statistics", lambda *a, **k: Statistics(torch.zeros(1), torch.eye(1), 1, 16))
    assert main(["evaluate", "--fid", "--num-samples", str(n), "--reference", "r.safetensors", *args, "--batch-size", "3"]) == 0
    capsys.readouterr()
    assert (scored[0].int() - cli.int()).abs().max() <= 1


def test_folder_defaults_fill_what_the_request_leaves_unset(folder):
    assert read_defaults(folder, 3).scheduler == "ddim"  # training writes a DDIM scheduler: the measured best sampler
    assert json.loads((folder / "model_index.json").read_text())["scheduler"] == ["diffusers", "DDIMScheduler"]
    plan = resolve(SampleRequest(num_images=2), folder)
    assert (plan.scheduler_name, plan.steps, plan.batch_size, plan.labels) == ("ddim", 50, BUILT_IN["cpu_batch_size"], None)
    assert plan.scheduler.config.timestep_spacing == "trailing"  # the folder's spacing
    (folder / "sampling.json").write_text(json.dumps({"guidance_scale": 2.5, "num_inference_steps": 7}))
    plan = resolve(SampleRequest(num_images=2, classes="blue"), folder)
    assert (plan.steps, plan.guidance.scale, plan.labels.tolist()) == (7, 2.5, [2, 2])
    assert resolve(SampleRequest(num_images=2), folder).guidance.scale == 1.0  # CFG needs a class
    plan = resolve(SampleRequest(num_images=2, classes="blue", steps=3, guidance=UNGUIDED, scheduler="dpm++",
                                 timestep_spacing="leading"), folder)
    assert (plan.steps, plan.guidance.scale, plan.scheduler_name, plan.scheduler.config.timestep_spacing) == (
        3, 1.0, "dpm++", "leading")
    # a folder saved with the training scheduler (DDPM) still samples with DDIM unless asked
    ddpm = DDPMScheduler(timestep_spacing="trailing").save_pretrained
    ddpm(folder / "scheduler")
    assert read_defaults(folder, 3).scheduler == "ddim"


def test_classes_by_name_index_list_and_spread(folder):
    def labels(classes, n=4):
        return resolve(SampleRequest(num_images=n, classes=classes), folder).labels.tolist()

    assert labels("green") == labels(1) == labels("1") == [1, 1, 1, 1]
    assert labels(["red", 2, "blue", "0"]) == [0, 2, 2, 0]
    assert labels("spread", 5) == [0, 1, 2, 0, 1] == spread_labels(5, 3).tolist()
    with pytest.raises(ValueError, match="unknown class 'cat'; this model's classes: red, green, blue"):
        labels("cat")
    with pytest.raises(ValueError, match="one class or one per image"):
        labels([0, 1])


def test_spread_and_spacing_are_checked_for_loaded_models_too(tmp_path, tiny_unet, class_unet):
    """A loaded model (the pipeline's path) gets the same checks: "spread" needs classes, spacings are named."""
    scheduler = DDPMScheduler()
    with pytest.raises(ValueError, match="'spread' needs a class-conditional model"):
        resolve(SampleRequest(classes="spread"), LoadedModel.of(tiny_unet, scheduler))
    with pytest.raises(ValueError, match="timestep spacing must be one of leading, trailing, linspace"):
        resolve(SampleRequest(timestep_spacing="sideways"), LoadedModel.of(class_unet, scheduler))


def test_bad_requests_fail_before_any_work(folder):
    for fields, match in (({"steps": 0}, "steps must be"), ({"num_images": 0}, "number of images"),
                          ({"scheduler": "heun"}, "unknown scheduler"), ({"timestep_spacing": "sideways"}, "spacing"),
                          ({"guidance": GuidanceRequest(guide_scale=2.0)}, "needs a guide model"),
                          ({"guidance": GuidanceRequest(guidance_scale=0.5)}, ">= 1"),
                          # the walk, seed 4: classifier-free guidance without a class was refused a step into the run
                          ({"guidance": GuidanceRequest(guidance_scale=3.0)}, "guidance needs a class")):
        with pytest.raises(ValueError, match=match):
            resolve(SampleRequest(**fields), folder)
    with pytest.raises(ValueError, match="one generator per image"):
        run(resolve(SampleRequest(num_images=2, steps=1), folder), generator=[torch.Generator()])


def test_a_single_generator_draws_the_whole_batch_as_diffusers_does(folder, class_unet):
    plan = resolve(SampleRequest(num_images=2, steps=2, scheduler="ddim", batch_size=1), folder)
    ours = run(plan, generator=torch.Generator().manual_seed(3)).images
    sched = DDIMScheduler.from_config(plan.scheduler.config)
    want = sample(plan.unet, sched, 2, 2, generator=torch.Generator().manual_seed(3)).images
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-6)


def test_sample_png_grid_equals_the_images(folder, tmp_path):
    assert main(["sample", "--model", str(folder), "--out", str(tmp_path / "g.png"), "--num-images", "2", "--steps", "2",
                 "--scale", "1"]) == 0
    images = run(resolve(SampleRequest(num_images=2, steps=2), folder)).images
    assert Image.open(tmp_path / "g.png").convert("RGB").tobytes() == to_pil(images).tobytes()
    assert main(["sample", "--model", str(folder), "--steps", "2"]) == 2  # neither --out nor --out-dir


@pytest.mark.slow
def test_import_is_light_and_the_pipeline_registers_in_either_order():
    code = ("import sys, denoiser; print(sorted(m for m in ('gradio', 'tensorboard', 'torch', 'diffusers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
    for order in ("import denoiser, diffusers", "import diffusers, denoiser"):
        code = (f"{order}; from diffusers import DiffusionPipeline; "
                f"p = DiffusionPipeline.from_pretrained({str(ROOT / 'weights' / 'synthetic-shapes')!r}); "
                "print(type(p).__name__, type(p.scheduler).__name__)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
        assert out.stdout.split()[-2:] == ["DenoiserPipeline", "DDIMScheduler"], out.stderr[-2000:]


def test_sampling_json_gives_the_defaults_and_arguments_win(tmp_path, class_unet, guide_unet):
    def guidance_for(folder, unet, scheduler_config, has_class=True, **fields):
        request = SampleRequest(num_images=1, classes=0 if has_class else None, guidance=GuidanceRequest(**fields))
        return resolve(request, folder).guidance

    sched = DDPMScheduler(num_train_timesteps=1000)
    main = save_pipeline(class_unet, sched, tmp_path / "m")
    save_pipeline(guide_unet, sched, main / "guide")
    (main / "sampling.json").write_text(json.dumps(
        {"guidance_scale": 2.0, "pag_scale": 0.5, "pag_layers": ["mid_attn"], "guide_model": "guide", "guide_scale": 1.5,
         "guidance_interval": [80, 580]}))
    g = guidance_for(main, class_unet, sched.config)
    assert (g.scale, g.pag_scale, g.pag_layers, g.guide_scale, g.interval) == (2.0, 0.5, ("mid_attn",), 1.5, (80.0, 580.0))
    assert guidance_for(main, class_unet, sched.config, guidance_interval=(0, 999)).interval == (0.0, 999.0)
    assert g.guide is not None and g.guide.config.base_channels == 8
    g = guidance_for(main, class_unet, sched.config, guidance_scale=1.0, pag_scale=0.0, guide_scale=1.0)
    assert (g.classifier_free, g.pag, g.autoguidance) == (False, False, False)
    assert guidance_for(main, class_unet, sched.config, has_class=False).scale == 1.0  # CFG needs a class
    (main / "sampling.json").write_text(json.dumps({"guidance": 2}))
    with pytest.raises(ValueError, match="unknown key"):
        guidance_for(main, class_unet, sched.config)


def test_words_no_caption_held_are_named_by_the_plan_and_the_cli(tmp_path, caplog):
    """Issue 51 item 6: a model folder that keeps its captions' words (tokenizer/vocabulary.txt) says which words of a
    prompt it never saw: Plan.unseen, and a warning from `denoiser sample`; a folder without a vocabulary says nothing."""
    from denoiser.cli.main import main
    from denoiser.model.text import WordHashTokenizer
    from tests.conftest import random_text_model

    folder = random_text_model(tmp_path / "words")
    request = SampleRequest(num_images=1, prompts="a red 日本 zorblat apple", steps=1)
    assert resolve(request, folder).unseen(0) == ()  # no vocabulary: nothing known to be unseen
    WordHashTokenizer(num_buckets=64, vocabulary=["a red apple", "a blue car"]).save_pretrained(folder / "tokenizer")
    assert resolve(request, folder).unseen(0) == ("日本", "zorblat")
    caplog.clear()
    assert main(["sample", "--model", str(folder), "--prompt", "a red 日本 zorblat apple", "--steps", "1",
                 "--num-images", "1", "--out", str(tmp_path / "x.png")]) == 0
    assert "never seen in training" in caplog.text and "日本 zorblat" in caplog.text


def test_a_door_that_runs_fewer_samplers_gets_the_folders_where_it_can_and_builtin_where_not(folder):
    """Issue 72 part 5: resolve is the one place a folder's defaults are applied, the app's rule included (its samplers
    are those whose steps it can re-run): a folder naming a sampler the door runs keeps it, one naming another samples
    with BUILT_IN's, and a request naming one outside them is refused in words."""
    offered = ("ddim", "ddpm", "unipc")
    assert resolve(SampleRequest(num_images=1), folder, samplers=offered).scheduler_name == "ddim"
    config = folder / "scheduler" / "scheduler_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "_class_name": "EulerDiscreteScheduler"}))
    assert resolve(SampleRequest(num_images=1), folder).scheduler_name == "euler"  # every sampler: the folder's
    assert resolve(SampleRequest(num_images=1), folder, samplers=offered).scheduler_name == BUILT_IN["scheduler"]
    assert resolve(SampleRequest(num_images=1, scheduler="unipc"), folder, samplers=offered).scheduler_name == "unipc"
    with pytest.raises(ValueError, match=r"^scheduler must be one of ddim, ddpm, unipc, got 'euler'$"):
        resolve(SampleRequest(num_images=1, scheduler="euler"), folder, samplers=offered)


def test_each_prompt_is_read_once_and_the_plan_carries_it(tmp_path, prompt_reads):
    """Issue 72 part 5: a prompt was parsed 14 times on its way from the app's form to its pictures and notes. resolve
    reads each distinct prompt once (a malformed weight refused there, before any work); the plan's encoding, words,
    weights and notes read what it carries."""
    from tests.conftest import random_text_model

    folder = random_text_model(tmp_path / "words")
    read = prompt_reads
    plan = resolve(SampleRequest(num_images=3, prompts=["(red:1.5) apple", "blue car", "(red:1.5) apple"], steps=1),
                   folder)
    run(plan)
    assert plan.words(0) == ("red", "apple") and plan.word_weights(0)[:2] == (1.5, 1.0)
    assert plan.image_notes(0) == [] and plan.log_notes() == [] and plan.unread(2) == ()
    assert read == {"(red:1.5) apple": 1, "blue car": 1, "": 1}, read
    with pytest.raises(ValueError, match="prompt weighting"):
        resolve(SampleRequest(num_images=1, prompts="(red:x) apple"), folder)
