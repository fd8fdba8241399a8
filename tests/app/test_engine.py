"""The app's logic: generation with previews, exact attention for a clicked pixel, the four stages, limits."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDPMScheduler
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

from denoiser import UNet
from denoiser.app.attention_tab import AttentionTab
from denoiser.app.engine import Engine
from denoiser.app.form import ModelForm
from denoiser.app.heads_tab import HeadsTab
from denoiser.app.layout import build_page
from denoiser.app.page import Page
from denoiser.app.sample_tab import SampleTab
from denoiser.app.views import stages_text
from denoiser.model.attention_blocks import identity_attention
from denoiser.pixels import to_uint8
from denoiser.request import GuidanceRequest, SampleRequest
from denoiser.sampling.guidance import Guidance
from denoiser.sampling.loop import make_sampler, sample
from denoiser.sampling.pipeline import save_pipeline
from tests.conftest import TINY


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    save_pipeline(UNet(**TINY, num_class_embeds=3).eval(), DDPMScheduler(), root / "tiny-classes")
    (root / "tiny-classes" / "classes.txt").write_text("red\ngreen\nblue\n")  # one name per line
    save_pipeline(UNet(**TINY).eval(), DDPMScheduler(), root / "tiny")
    return root


def test_generate_matches_sampler_and_streams_previews(weights):
    ex = Engine(weights)
    assert ex.models() == ["tiny", "tiny-classes"]
    previews = []
    gen = ex.generate("tiny", SampleRequest(scheduler="ddim", steps=4, seed=3, num_images=2),
                      on_step=lambda i, n, x0: previews.append((i, n, x0)))
    assert [p[0] for p in previews] == [0, 1, 2, 3] and previews[0][2].shape == (2, 3, 16, 16)
    unet, sched = ex.loaded("tiny").unet, ex.loaded("tiny").noise_schedule
    ref = sample(unet, make_sampler("ddim", sched.config), 2, 4, seed=3).images
    assert torch.equal(gen.images, ref)
    assert gen.num_steps == 4 and len(gen.inputs) == 4


def test_attention_is_exactly_that_of_the_sampling_pass(weights):
    ex = Engine(weights)
    gen = ex.generate("tiny", SampleRequest(scheduler="ddim", steps=3, seed=0, num_images=2))
    unet, sched = ex.loaded("tiny").unet, ex.loaded("tiny").noise_schedule
    during = sample(unet, make_sampler("ddim", sched.config), 2, 3, seed=0, capture_steps=[1]).attention[1]
    recs = ex.views.records(gen, 1)
    assert [r.name for r in recs] == [r.name for r in during]
    for a, b in zip(recs, during):
        assert torch.equal(a.q, b.q) and torch.equal(a.k, b.k)  # bit-identical to the sampling pass
    panel = ex.views.attention_maps(gen, image=1, step=1, pixel=(5, 9))
    assert panel.width > 100 and panel.height > 100
    # one name per layer everywhere (issue 35 item 13): the module name --pag-layers takes, and the grid
    assert ex.views.layer_names(gen, 1) == [f"{r.name} (8x8)" for r in recs]
    assert ex.views.layer_names(gen, 1)[1] == "mid_attn (8x8)"


def test_guided_attention_is_the_class_half_of_the_guided_call(weights):
    ex = Engine(weights)
    gen = ex.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=3, seed=0, num_images=2, classes=1,
                                                    guidance=GuidanceRequest(guidance_scale=2.5)))
    unet, sched = ex.loaded("tiny-classes").unet, ex.loaded("tiny-classes").noise_schedule
    res = sample(unet, make_sampler("ddim", sched.config), 2, 3, seed=0, class_labels=1, guidance=Guidance(scale=2.5),
                 capture_steps=[1])
    assert torch.equal(gen.images, res.images)
    recs = ex.views.records(gen, 1)
    for a, b in zip(recs, res.attention[1], strict=True):
        assert b.q.shape[0] == 4 and a.q.shape[0] == 2  # sampling ran class + no-class in one batch
        assert torch.equal(a.q, b.q[:2]) and torch.equal(a.k, b.k[:2])
    with pytest.raises(ValueError, match="guidance needs a class"):
        ex.generate("tiny-classes", SampleRequest(steps=2, num_images=1, guidance=GuidanceRequest(guidance_scale=2)))
    with pytest.raises(ValueError, match="guidance must be a number in 1..10"):
        ModelForm(ex).request("tiny-classes", steps=2, num_images=1, class_name="red", guidance_scale="abc")


def test_four_stages_scores_and_weights(weights):
    ex = Engine(weights)
    gen = ex.generate("tiny", SampleRequest(scheduler="ddim", steps=2, seed=0, num_images=1))
    img, numbers = ex.views.four_stages(gen, image=0, step=0, pixel=(4, 6), layer=1, head=1)
    text = stages_text(numbers)  # the page's words for them
    rec = ex.views.records(gen, 0)[1]
    w = rec.weights((2, 3))[0, 1]
    torch.testing.assert_close(w, torch.softmax(rec.scores((2, 3))[0, 1].flatten(), 0).reshape(8, 8))
    assert "mid_attn (8x8), head 1" in text and "sum to 1.000000" in text
    assert img.width > 100


def test_classes_and_limits(weights):
    """The form's values are held to the page's LIMITS where the form is read (ModelForm.request), the request to the
    model by its plan (Engine.plan)."""
    ex = Engine(weights)
    assert ex.classes("tiny-classes") == ["red", "green", "blue"] and ex.classes("tiny") == []
    gen = ex.generate("tiny-classes", SampleRequest(steps=2, num_images=1, classes=2))
    assert gen.labels.tolist() == [2]
    for kwargs, msg in [
        ({"steps": 0}, "steps must be a whole number in 1..1000"),
        ({"steps": 1001}, "steps must be a whole number in 1..1000"),
        ({"num_images": 65}, "number of images must be a whole number in 1..64"),
        ({"seed": -1}, "seed must be a whole number"),
        ({"seed": 2.5}, "seed must be a whole number"),
        ({"scheduler": "euler"}, "scheduler must be one of ddim, ddpm, dpm\\+\\+, unipc, got 'euler'"),
        ({"class_name": "red"}, "is not one of this model's classes: none"),
    ]:
        with pytest.raises(ValueError, match=msg):
            ex.generate("tiny", ModelForm(ex).request("tiny", **{"steps": 2, "num_images": 1, **kwargs}))
    with pytest.raises(ValueError, match="has no classes"):
        ex.generate("tiny", SampleRequest(steps=2, num_images=1, classes=1))
    with pytest.raises(ValueError, match="class must be a whole number in 0..2"):
        ex.generate("tiny-classes", SampleRequest(steps=2, num_images=1, classes=3))
    for bad in ("../tiny", "/etc/passwd", "nope"):
        with pytest.raises(ValueError, match="unknown model"):
            ex.generate(bad, SampleRequest(steps=2, num_images=1))


def test_memory_stays_bounded_over_100_generations(weights):
    import gc

    import psutil

    ex = Engine(weights)
    proc = psutil.Process()
    gen = None
    rss = []
    for i in range(100):
        gen = ex.generate("tiny", SampleRequest(steps=2, seed=i, num_images=4))  # a session keeps only its latest generation
        ex.views.attention_maps(gen, image=i % 4, step=i % 2, pixel=(i % 16, (3 * i) % 16))
        if i in (19, 99):
            gc.collect()
            rss.append(proc.memory_info().rss)
    assert rss[1] - rss[0] < 30e6, f"RSS grew by {(rss[1] - rss[0]) / 1e6:.1f} MB over 80 generations"
    assert len(gen.attention) == 1  # one step's attention cached per generation


def test_work_budget_refuses_oversized_requests_up_front(weights, monkeypatch):
    from denoiser.app.work_budget import model_cost

    ex = Engine(weights)
    unet = ex.loaded("tiny").unet
    cost = model_cost(unet)
    monkeypatch.setenv("DENOISER_WORK_BUDGET", str(10 * 4 * cost))  # 10 images x 4 steps
    ex.generate("tiny", SampleRequest(steps=4, num_images=10))
    with pytest.raises(ValueError, match=r"use at most 2 steps with 20 images, or 10 images with 4 steps"):
        ex.generate("tiny", SampleRequest(steps=4, num_images=20))
    with pytest.raises(ValueError, match="over the budget"):
        ex.generate("tiny-classes", SampleRequest(steps=4, num_images=10, classes=0,
                                                  guidance=GuidanceRequest(guidance_scale=2)))  # guidance doubles the calls


def test_pag_and_autoguidance_match_the_sampler_and_count_in_the_budget(weights, tmp_path, monkeypatch):
    import json
    import shutil

    root = tmp_path / "w"
    shutil.copytree(weights, root)
    torch.manual_seed(3)
    small = {**TINY, "base_channels": 8, "norm_num_groups": 4}
    save_pipeline(UNet(**small, num_class_embeds=3).eval(), DDPMScheduler(), root / "tiny-classes" / "guide")
    defaults = {"guide_model": "guide", "guide_scale": 2.0, "guidance_interval": [300, 700]}
    (root / "tiny-classes" / "sampling.json").write_text(json.dumps(defaults))
    ex = Engine(root)
    assert ex.models() == ["tiny", "tiny-classes"]  # the guide is no model of its own
    assert ex.defaults("tiny-classes").guidance == defaults
    gen = ex.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=3, seed=0, num_images=2, classes=1,
                                                    guidance=GuidanceRequest(pag_scale=1.5, guide_scale=2.0)))
    unet, sched = ex.loaded("tiny-classes").unet, ex.loaded("tiny-classes").noise_schedule
    # the folder's interval applies: DDIM-3 visits 666, 333, 0 and guides the first two
    g = Guidance(pag_scale=1.5, guide=ex.guide("tiny-classes"), guide_scale=2.0, interval=(300, 700))
    assert gen.guidance == g and "t = 300..700" in ModelForm(ex).cfg_default("tiny-classes", "red")["info"]
    res = sample(unet, make_sampler("ddim", sched.config), 2, 3, seed=0, class_labels=1, guidance=g, capture_steps=[1, 2])
    assert torch.equal(gen.images, res.images)
    for step in (1, 2):  # t = 333 guided (the images' own rows of the batched call), t = 0 one plain pass
        for a, b in zip(ex.views.records(gen, step), res.attention[step], strict=True):
            assert torch.equal(a.q, b.q[:2]) and torch.equal(a.k, b.k[:2])
    with pytest.raises(ValueError, match="ships no guide model"):
        ex.generate("tiny", SampleRequest(steps=2, num_images=1, guidance=GuidanceRequest(guide_scale=2.0)))
    monkeypatch.setenv("DENOISER_WORK_BUDGET", "3")
    tiny = ex.loaded("tiny").unet  # no sampling.json: every step guided
    cost = 16**2 / 32**2 * sum(p.numel() for p in tiny.parameters()) / 1e6
    steps = int(3 // (2 * cost))  # 2 passes: the plain one and the perturbed one
    ex.generate("tiny", SampleRequest(steps=steps, num_images=1, guidance=GuidanceRequest(pag_scale=1.0)))
    with pytest.raises(ValueError, match="PAG"):
        ex.generate("tiny", SampleRequest(steps=steps + 1, num_images=1, guidance=GuidanceRequest(pag_scale=1.0)))
    cost = 16**2 / 32**2 * sum(p.numel() for p in unet.parameters()) / 1e6
    # with the interval only the guided steps count double: DDIM-3 guides 2 of its 3 steps (5/3 passes per step)
    pag_interval = Guidance(pag_scale=1.0, interval=(300, 700))
    fits = int(3 // (5 / 3 * cost))
    assert fits > steps
    ex.check_work(unet, 1, fits, pag_interval, [666, 333, 0])
    with pytest.raises(ValueError, match="over the budget"):
        ex.check_work(unet, 1, fits + 1, pag_interval, [666, 333, 0])


def test_heads_view_mean_maps_and_switching_layers_off(weights):
    ex = Engine(weights)
    gen = ex.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=3, seed=0, num_images=2, classes=2))
    rows, chart = ex.views.head_table(gen, image=1, timesteps=(500, 50))
    assert {r.layer for r in rows} == {"down.1.attn.0", "mid_attn", "up.0.attn.0", "up.0.attn.1"} and chart.width == 480  # one column (phones)
    mean = ex.views.mean_attention_maps(gen, image=1, pixel=(4, 5))
    last = ex.views.attention_maps(gen, image=1, step=2, pixel=(4, 5))
    assert mean.size == last.size and mean.tobytes() != last.tobytes()
    off = ex.views.ablate(gen, ["mid_attn"])
    unet, sched = ex.loaded("tiny-classes").unet, ex.loaded("tiny-classes").noise_schedule
    with identity_attention(unet, ["mid_attn"]):
        want = sample(unet, make_sampler("ddim", sched.config), 2, 3, seed=0, class_labels=2).images
    assert torch.equal(off.images, want) and not torch.equal(off.images, gen.images)
    one_head = ex.views.ablate(gen, ["mid_attn"], [0])
    assert not torch.equal(one_head.images, off.images)
    with pytest.raises(ValueError, match="at least one attention layer"):
        ex.views.ablate(gen, [])


def test_inpaint_with_a_mask_of_another_size_changes_only_where_it_was_painted(weights):
    from PIL import Image

    explorer = Engine(weights)
    # the case: a 256x256 photo, a 300x100 mask layer with a rectangle over x 100-200 (a third of the width)
    rng = torch.Generator().manual_seed(0)
    photo = Image.fromarray((torch.rand(256, 256, 3, generator=rng) * 255).to(torch.uint8).numpy())
    mask = Image.new("L", (300, 100), 0)
    mask.paste(255, (100, 0, 200, 100))
    gen, _ = explorer.restore("tiny-classes", explorer.restore_request("inpaint", steps=3), photo, mask)
    from denoiser.image_io import image_to_model

    size = gen.images.shape[-1]
    before = (image_to_model(photo, size) / 2 + 0.5).clamp(0, 1)
    changed = (gen.images - before).abs().amax(dim=(0, 1)) > 1e-5  # (S, S): pixels the inpainting replaced
    cols = changed.any(dim=0).nonzero().flatten().tolist()
    lo, hi = 100 / 300 * size, 200 / 300 * size  # where the rectangle lands on the model's grid
    assert changed.any(dim=1).all()  # every row: the rectangle spans the mask's full height
    assert cols and min(cols) >= int(lo) - 1 and max(cols) <= int(hi) + 1  # only its columns, not the whole width
    with pytest.raises(ValueError, match="the mask is empty: paint the area"):  # the page: nothing painted
        explorer.restore("tiny-classes", explorer.restore_request("inpaint", steps=3), photo, Image.new("L", (300, 100), 0))


def test_advanced_settings_reach_the_sampler_as_a_request_would(weights, tmp_path):
    """Issue 34 item 3: the app's folded-away options (spacing, eta, guidance interval, PAG layers) give the images
    the sampling core gives for the same request; left empty, the model's own; bad values refused up front."""
    from denoiser.app.png_settings import read_settings
    from denoiser.request import GuidanceRequest, SampleRequest
    from denoiser.sampling.plan import resolve, run

    ex = Engine(weights)
    form = ModelForm(ex)
    common = dict(steps=3, seed=1, num_images=2, class_name="blue", guidance_scale=2.0, pag_scale=1.0)
    advanced = dict(timestep_spacing="trailing", eta=0.5, guidance_interval="0, 600", pag_layers="mid_attn")
    gen = ex.generate("tiny-classes", form.request("tiny-classes", "ddim", **common, **advanced))
    request = SampleRequest(num_images=2, classes=2, seed=1, scheduler="ddim", steps=3, timestep_spacing="trailing",
                            eta=0.5, guidance=GuidanceRequest(guidance_scale=2.0, pag_scale=1.0, guidance_interval=(0, 600),
                                                              pag_layers=["mid_attn"]))
    assert torch.equal(gen.images, run(resolve(request, weights / "tiny-classes")).images)
    assert gen.guidance.interval == (0.0, 600.0) and gen.guidance.pag_layers == ("mid_attn",)
    plain = ex.generate("tiny-classes", form.request("tiny-classes", "ddim", **common))
    assert not torch.allclose(gen.images, plain.images)
    for bad, match in ((dict(timestep_spacing="even"), "timestep spacing must be one of"), (dict(eta=2.0), "eta must be"),
                       (dict(guidance_interval="600"), "guidance interval"), (dict(pag_layers="nope"), "unknown PAG layer")):
        with pytest.raises(ValueError, match=match):
            ex.generate("tiny-classes", form.request("tiny-classes", "ddim", **common, **bad))
    # the form through the handler: a result's PNG carries the changed advanced settings, "use these settings" reads
    # them back (the ones left at the model's own come back as such)
    page = build_page(ex)
    sample = page.tab(SampleTab)
    *_, last = sample.generate("tiny-classes", "ddim", 3, 1, 2, "blue", 2.0, 1.0, 1.0, "trailing", 0.5, "0, 600", "")
    files = last[sample.gallery]
    assert read_settings(files[0])["timestep_spacing"] == "trailing" and "pag_layers" not in read_settings(files[0])
    updates = page.form.use_settings(files, 0)
    values = [u["value"] for u in updates[:-1]]
    assert values == ["tiny-classes", "ddim", 3, 1, 2, "blue", 2.0, 1.0, 1.0, "trailing", 0.5, "0, 600", "", "", ""]  # the prompts: none for a class model


def test_denoise_sigma_and_edit_strength_are_separate_checked_settings(weights):
    """The Photo tab's two amounts (issue 34 item 6): the noise σ only denoise reads, the strength only edit reads."""
    from PIL import Image

    ex = Engine(weights)
    photo = Image.new("RGB", (16, 16), (200, 40, 40))
    weak, _ = ex.restore("tiny", ex.restore_request("edit", strength=0.2, steps=10), photo)
    strong, _ = ex.restore("tiny", ex.restore_request("edit", strength=0.9, steps=10), photo)
    assert weak.num_steps == 2 and strong.num_steps == 9  # the strength sets how much of the chain runs
    same, _ = ex.restore("tiny", ex.restore_request("edit", sigma=0.5, strength=0.2, steps=10), photo)
    assert torch.equal(same.images, weak.images)  # edit ignores the denoise σ
    for bad, match in ((dict(operation="edit", strength=0.0), "edit strength 0"), (dict(operation="denoise", sigma=1.5),
                       "noise σ must be a number in 0..1"), (dict(operation="edit", strength=float("nan")), "strength must"),
                       (dict(operation="denoise", add_noise=0.8), "added noise σ must be a number in 0.*0.5")):
        with pytest.raises(ValueError, match=match):
            ex.restore_request(steps=10, **bad)  # the form's values, checked before any photo is read


def test_the_page_starts_at_the_folders_sampler_steps_and_guidance(tmp_path):
    """A model folder's measured best reaches the app (issue 34): its sampling.json's step count and guidance fill
    the Sample tab when the model is chosen, and a request that leaves them unset gets them."""
    import json

    torch.manual_seed(0)
    save_pipeline(UNet(**TINY, num_class_embeds=3).eval(), DDPMScheduler(), tmp_path / "m", classes=["a", "b", "c"])
    (tmp_path / "m" / "sampling.json").write_text(json.dumps({"num_inference_steps": 7, "guidance_scale": 2.5}))
    ex = Engine(tmp_path)
    class_update, guidance, scheduler, steps, pag, guide = ModelForm(ex).model_form("m")
    assert class_update["value"] == "a" and guidance["value"] == 2.5 and pag["value"] == 0.0
    assert scheduler["value"] == "ddim" and steps["value"] == 7 and guide["visible"] is False
    gen = ex.generate("m", SampleRequest(seed=0, num_images=1, classes=0, guidance=GuidanceRequest(guidance_scale=2.5)))
    assert gen.num_steps == 7 and gen.replay.steps == 7
    # switching a layer off samples the same request again: the same guidance, interval and PAG layers
    gen = ex.generate("m", SampleRequest(steps=3, num_images=1, classes=0, guidance=GuidanceRequest(
        guidance_scale=2.5, pag_scale=1.0, pag_layers="mid_attn", guidance_interval="0, 600")))
    off = ex.views.ablate(gen, ["mid_attn"])
    assert off.guidance == gen.guidance and off.guidance.interval == (0.0, 600.0) and off.num_steps == 3
    assert not torch.equal(off.images, gen.images)


def test_the_budget_note_says_over_exactly_when_generate_refuses(weights, tmp_path, monkeypatch):
    """Issue 40 item 1: one rule counts a request's work. For a model whose sampling.json guides only t in [300, 700]
    and ships a guide (autoguidance), the note under the sliders says "over" exactly when Generate refuses, with the
    same numbers, over a sweep of steps and images around the budget; the form's own interval too."""
    import json
    import re
    import shutil

    from denoiser.app import engine as engine_module
    from denoiser.app.work_budget import model_cost

    root = tmp_path / "w"
    shutil.copytree(weights, root)
    torch.manual_seed(3)
    small = {**TINY, "base_channels": 8, "norm_num_groups": 4}
    save_pipeline(UNet(**small, num_class_embeds=3).eval(), DDPMScheduler(), root / "tiny-classes" / "guide")
    defaults = {"guidance_scale": 3.0, "guide_model": "guide", "guide_scale": 2.0, "guidance_interval": [300, 700]}
    (root / "tiny-classes" / "sampling.json").write_text(json.dumps(defaults))
    ex = Engine(root)
    form_of = ModelForm(ex)
    unet = ex.loaded("tiny-classes").unet
    monkeypatch.setenv("DENOISER_WORK_BUDGET", str(40 * model_cost(unet)))  # 40 plain image-steps

    class Admitted(Exception):
        """Generate got past its refusal (nothing is sampled: the sweep only asks whether it would be)."""

    def admitted(plan, **kwargs):
        raise Admitted

    monkeypatch.setattr(engine_module, "run", admitted)
    verdicts = set()
    for interval in ("", "100, 900"):  # the folder's interval, then the form's
        for num_images in (1, 2, 5):
            for steps in range(1, 41):
                form = {"guidance_interval": interval} if interval else {}  # the page's seven inputs, or one more
                note = form_of.budget_note("tiny-classes", steps, num_images, "red", 3.0, 0.0, 2.0, **form)
                try:
                    ex.generate("tiny-classes", form_of.request("tiny-classes", "ddim", steps, 0, num_images, "red", 3.0,
                                                                guide_scale=2.0, guidance_interval=interval))
                except Admitted:
                    refusal = None
                except ValueError as err:
                    refusal = str(err)
                    assert "over the budget" in refusal
                case = f"{num_images} images x {steps} steps, interval {interval or 'of the folder'}: {note!r} / {refusal!r}"
                if refusal is None:
                    assert re.fullmatch(r"work: [\d,]+ of [\d,]+ units", note), case
                else:  # over, with the same work and the same advice
                    assert note.startswith("**over the work budget**"), case
                    work, budget = re.search(r"is ([\d,]+) work units .* budget of ([\d,]+)", refusal).groups()
                    advice = re.search(r"use at most (\d+) steps with \d+ images, or (\d+) images", refusal).groups()
                    assert f"({work} of {budget} units): at most {advice[0]} steps" in note, case
                    assert f"or {advice[1]} images with {steps} steps" in note, case
                verdicts.add(refusal is None)
    assert verdicts == {True, False}  # the sweep crosses the boundary


def test_the_heads_and_layer_views_answer_in_words_not_error_badges(weights):
    """Issue 41 items 5 and 6: Compute statistics before any generation gives a hint (a warning toast), not an error
    over the chart and the layer list (before: gr.Error); a layer typed as text ("zzz") is refused with a sentence
    naming the layers (before: "invalid literal for int() with base 10: 'zzz'")."""
    import gradio as gr

    page = build_page(Engine(weights))
    heads, attention = page.tab(HeadsTab), AttentionTab(Page(page.engine))
    with pytest.warns(UserWarning, match="generate images first"):
        # a job now (issue 41 item 7): its status line says it too
        update = next(heads.head_stats(None, 0))
    assert list(update) == [heads.stats_status] and "generate images first" in update[heads.stats_status]  # the rest kept
    gen = page.engine.generate("tiny", SampleRequest(scheduler="ddim", steps=2, seed=0, num_images=1))
    with pytest.warns(UserWarning, match="not one of this generation's"):  # the walk, seed 10 step 55: before, an
        stages, text, heads = attention.restage(gen, 0, 1, (3, 4), "zzz", 0)  # error emptied the head list, stale text stayed
    assert stages is None and "not one of this generation's" in text and "invalid literal" not in text
    assert isinstance(heads, type(gr.skip()))  # the head list keeps the last real layer's heads
    # and the pixel's views still show with that layer typed (the walk, seed 10 step 65: the image went blank)
    _, _, _, shown, maps, stages, text = attention.at_pixel(gen, 0, 1, 3, 4, "zzz", 0)
    assert shown is not None and maps is not None and stages is None and text.startswith("**Not shown:** layer 'zzz'")
    stages, text, heads = attention.restage(gen, 0, 1, (3, 4), 1, 0)
    assert stages is not None and "head 0" in text and heads["value"] == 0


def _unet_calls(unet) -> list:
    """A list that gets one entry per forward call of `unet` from now on (the caller removes the hook: .remove())."""
    calls = []
    calls.append(unet.register_forward_hook(lambda *_: calls.append(1)))
    return calls


def test_long_attention_work_is_refused_over_the_budget_before_any_unet_call(weights, monkeypatch):
    """Issue 41 item 7 (the engine side): "averaged over every step" and the Heads statistics count their UNet calls by
    the budget's one rule (work_of) and refuse before the first call."""
    from denoiser.app.work_budget import model_cost

    ex = Engine(weights)
    gen = ex.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=6, seed=0, num_images=2, classes=1,
                                                    guidance=GuidanceRequest(guidance_scale=2.0)))
    unet = ex.loaded("tiny-classes").unet
    calls = _unet_calls(unet)
    monkeypatch.setenv("DENOISER_WORK_BUDGET", str(2 * 6 * 2 * model_cost(unet) - 1))  # 2 images x 6 steps x CFG's 2
    try:
        with pytest.raises(ValueError, match="over the budget"):
            ex.views.mean_attention_maps(gen, image=0, pixel=(3, 3))
        with pytest.raises(ValueError, match="over the budget"):
            ex.views.head_table(gen, image=0, timesteps=tuple(range(100, 900, 10)))
        assert calls[1:] == []  # not one UNet call
        monkeypatch.setenv("DENOISER_WORK_BUDGET", str(2 * 6 * 2 * model_cost(unet)))  # exactly the work: allowed
        ex.views.mean_attention_maps(gen, image=0, pixel=(3, 3))
    finally:
        calls[0].remove()


def test_long_attention_work_reports_every_step_and_stops_when_asked(weights):
    """on_step sees every step of "averaged over every step" and every UNet call of the Heads statistics, with the
    generated image as preview; the results are those without on_step; raising from on_step stops the work."""
    from denoiser.app.attention_views import _stats_calls_per_timestep

    ex = Engine(weights)
    gen = ex.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=3, seed=0, num_images=2, classes=2))
    seen = []
    mean = ex.views.mean_attention_maps(gen, 1, (4, 5), on_step=lambda i, n, x: seen.append((i, n, tuple(x.shape))))
    assert seen == [(0, 3, (1, 3, 16, 16)), (1, 3, (1, 3, 16, 16)), (2, 3, (1, 3, 16, 16))]
    assert mean.tobytes() == ex.views.mean_attention_maps(gen, 1, (4, 5)).tobytes()
    unet = ex.loaded("tiny-classes").unet
    per_t = _stats_calls_per_timestep(unet)
    assert per_t == 1 + 4 + 4 * 2  # the plain call, 4 layers, each of their 2 heads (TINY)
    steps, calls = [], _unet_calls(unet)
    try:
        rows, _ = ex.views.head_table(gen, 1, timesteps=(500, 50), on_step=lambda i, n, x: steps.append((i, n)))
    finally:
        calls[0].remove()
    assert steps == [(i, 2 * per_t) for i in range(2 * per_t)] and len(calls) - 1 == 2 * per_t  # one per UNet call
    assert [r.output_change for r in rows] == [r.output_change for r in ex.views.head_table(gen, 1, timesteps=(500, 50))[0]]

    class Stop(Exception):
        pass

    def stop_at(k):
        def on_step(i, n, x):
            if i == k:
                raise Stop

        return on_step

    with pytest.raises(Stop):
        ex.views.head_table(gen, 1, timesteps=(500, 50), on_step=stop_at(3))
    with pytest.raises(Stop):
        ex.views.mean_attention_maps(gen, 1, (4, 5), on_step=stop_at(1))
    ex.generate("tiny-classes", SampleRequest(steps=2, num_images=1))  # the stopped run's hook is gone: nothing raises here


def test_a_photo_denoise_counts_tiles_and_over_the_budget_runs_on_a_scaled_copy(weights, monkeypatch):
    """Issue 41 item 9, issue 51 item 13: the tiled denoise's progress "step k / N" counts tiles; a photo over the
    budget is not refused but denoised as a copy scaled down to photo_limit, the result saying so (its settings'
    scaled_from, its file name)."""
    from PIL import Image

    from denoiser.app.png_settings import settings_name
    from denoiser.restore.tiles import count_tiles

    ex = Engine(weights)
    unet = ex.loaded("tiny").unet
    photo = Image.new("RGB", (100, 60), (90, 120, 200))
    steps = []
    gen, done = ex.restore("tiny", ex.restore_request("denoise", sigma=0.1), photo,
                           on_step=lambda i, n, x: steps.append((i, n, tuple(x.shape))))
    total = count_tiles(unet, 60, 100)
    assert gen is None and steps[-1][:2] == (total - 1, total) and all(n == total for _, n, _ in steps)
    assert done.image.size == (100, 60) and done.tiles == total and done.sigma == 0.1
    assert "scaled_from" not in done.settings
    # a photo of about 2 megapixels (1600x1200): the limit is what the measured speed denoises in the photo budget
    assert ex.tile_rate("tiny") > 0  # measured on this machine; fixed below so the sizes are exact
    monkeypatch.setattr(ex, "tile_rate", lambda model: 500.0)
    monkeypatch.setenv("DENOISER_PHOTO_SECONDS", str(ex.photo_time("tiny", 1600, 1200).seconds))
    assert ex.photo_limit("tiny") == pytest.approx(1.92, rel=0.05)
    assert ex.photo_time("tiny", 1600, 1200).describe() == f"about {round(count_tiles(unet, 1200, 1600) / 500)} s " \
        f"({count_tiles(unet, 1200, 1600):,} tiles at 500 a second)"
    monkeypatch.setenv("DENOISER_PHOTO_SECONDS", str(ex.photo_time("tiny", 240, 160).seconds))  # a small budget: fast
    big = Image.new("RGB", (400, 300), (90, 120, 200))
    _, scaled = ex.restore("tiny", ex.restore_request("denoise", sigma=0.1), big)
    w, h = scaled.image.size
    assert abs(w / h - 400 / 300) < 0.02 and w >= 200 and w * h <= 240 * 160 * 1.2
    assert scaled.settings["scaled_from"] == [400, 300] and scaled.settings["size"] == [w, h]
    assert f"scaled-from-400x300-{w}x{h}" in settings_name({"model": "tiny", **scaled.settings})
    assert not ex.photo_time("tiny", w, h).over  # what ran is within the budget


def test_a_layer_is_checked_in_one_place(weights):
    """Issue 41 item 6 (the engine side): the layer selector's value, an int or text a person typed, becomes the
    layer's index or a sentence naming how many layers there are; the four stages use the same rule."""
    ex = Engine(weights)
    gen = ex.generate("tiny", SampleRequest(scheduler="ddim", steps=2, seed=0, num_images=1))
    assert [ex.views.check_layer(gen, v) for v in (0, 3, "3", " 2 ", 1.0)] == [0, 3, 3, 2, 1]
    for bad in ("zzz", "4", 4, -1, "1.5", None, "", True):
        with pytest.raises(ValueError, match=f"layer {str(bad)[:40]!r} is not one of this generation's 4 attention layers: pick one"):
            ex.views.check_layer(gen, bad)
    with pytest.raises(ValueError, match="layer 'zzz' is not one of this generation's 4 attention layers"):
        ex.views.four_stages(gen, 0, 1, (3, 4), "zzz", 0)
    panel, stages = ex.views.four_stages(gen, 0, 1, (3, 4), "1", 0)
    assert stages.layer == ex.views.layer_names(gen, 1)[1]


def test_a_generate_resolves_its_plan_once(weights, monkeypatch):
    """Issue 59 finding 2: a Generate resolved its plan in the handler (to refuse before the job starts) and again in
    the engine. The handler's plan is now the one that runs: one resolve per Generate, and the same images."""
    from denoiser.app import engine as engine_module

    ex = Engine(weights)
    calls = []
    resolve_plan = engine_module.resolve

    def counted(request, *args, **kwargs):
        calls.append(request)
        return resolve_plan(request, *args, **kwargs)

    sample = build_page(ex).tab(SampleTab)  # the page's form shows what resolve fills: counted from Generate on
    monkeypatch.setattr(engine_module, "resolve", counted)
    *_, last = sample.generate("tiny-classes", "ddim", 3, 5, 2, "green", guidance_scale=2.0)
    assert len(calls) == 1, calls
    assert last[sample.status].startswith("done: 2 image(s) of class green, 3 steps")
    gen = ex.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=3, seed=5, num_images=2, classes=1,
                                                    guidance=GuidanceRequest(guidance_scale=2.0)))
    shown = torch.stack([pil_to_tensor(Image.open(path)) for path in last[sample.gallery]])  # (B, 3, H, W) uint8: the PNGs
    assert torch.equal(shown, to_uint8(gen.images))


def test_guidance_without_a_class_is_refused_before_the_job_starts(weights):
    """The walk, seed 4 step 21: with the class at "(any)" and guidance at 3.5, Generate started ("denoising:
    starting"), then said "not done: guidance needs a class": the check ran in the loop. The plan checks it now, so
    the page's status says the job never started and the pictures shown are the ones before."""
    import gradio as gr

    sample = build_page(Engine(weights)).tab(SampleTab)
    run = sample.generate("tiny-classes", "ddim", 2, 0, 2, "(any)", guidance_scale=3.5, progress=lambda *a, **k: None)
    first = next(run)
    assert list(first) == [sample.status]  # the pictures shown stay
    status = first[sample.status]
    assert status.startswith("**not started**: guidance needs a class") and "pick a class or set guidance to 1" in status
    with pytest.raises(gr.Error, match="guidance needs a class"):
        next(run)

