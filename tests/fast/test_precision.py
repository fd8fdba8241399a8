"""The inference precision (denoiser.fast.precision): decided once per machine by measurement and kept in a file, named
where it ran, what a request asks for when it asks, and attention maps captured exactly in float32 whatever the
sampling runs in. Nothing here depends on which precision this machine decided: the decision is driven through a
decision folder of the test's own, the measurement, the environment and `asked`."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import DDPMScheduler

from denoiser.fast import precision
from denoiser.fast.precision import Precision, asked, choose_precision
from denoiser.folders.model_dir import load
from denoiser.model.attention_capture import capture_attention
from denoiser.request import SampleRequest
from denoiser.sampling.loop import sampling_context
from denoiser.sampling.plan import resolve, run


@pytest.fixture
def fresh_choice(monkeypatch, tmp_path):
    """The machine's decision made again in a decision folder of the test's own (tmp_path), under the test's
    environment (auto unless it says otherwise), and forgotten after it."""
    monkeypatch.setenv("DENOISER_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.delenv(precision.PRECISION_ENV, raising=False)
    precision._MACHINE.clear()
    yield monkeypatch
    precision._MACHINE.clear()


def _table(choice: str, ratios=(1.5, 1.4, 1.6)) -> dict:
    speedup, spread = sorted(ratios)[len(ratios) // 2], [min(ratios), max(ratios)]
    return {"choice": choice, "speedup": {"mixed": speedup, "bfloat16": speedup}, "spread": {"mixed": spread, "bfloat16": spread}}


@pytest.mark.parametrize("mix, autocast, choice", [
    ([2.0, 1.9, 2.1], [1.2, 1.3, 1.25], "mixed"),
    ([1.2, 1.16, 1.3, 1.18, 1.25], [0.5, 0.5, 0.5, 0.5, 0.5], "mixed"),
    ([1.3, 1.2, 1.25], [1.6, 1.5, 1.7], "bfloat16"),  # an AMX CPU's oneDNN may win with direct convolutions
    ([1.05, 1.1, 1.12], [1.1, 1.0, 1.05], "float32"),  # faster, but not by the margin
    ([0.42, 1.91, 0.94, 0.59, 1.2], [0.4, 1.9, 0.9, 0.6, 1.2], "float32"),  # the spread one command saw on a Zen 4
    ([1.9, 1.8, 0.95, 1.7, 1.6], [1.0, 1.0, 1.0, 1.0, 1.0], "float32"),  # one round slower: not steady enough
])
def test_the_rule_keeps_a_bf16_path_only_with_a_margin_in_every_round_and_the_faster_of_two(mix, autocast, choice):
    assert precision.rule({"mixed": mix, "bfloat16": autocast}) == choice


def test_the_machine_decides_once_and_every_later_process_reads_it(fresh_choice, tiny_unet):
    """The first choice measures and writes the decision file; a later one (a new process: nothing remembered) reads it
    and measures nothing, so a loaded machine cannot flip it."""
    fresh_choice.setattr(precision, "native_bf16", lambda: True)
    fresh_choice.setattr(precision, "measure", lambda unet: _table("mixed"))
    first = precision.choose_precision(tiny_unet)
    assert first.mixed and first.name == "mixed" and "mixed 1.50x float32 (1.40-1.60x)" in first.why
    path = precision.decision_path()
    assert path.parent == precision.kernels.library_path().parent.parent and json.loads(path.read_text())["choice"] == "mixed"
    precision._MACHINE.clear()  # as a new process
    fresh_choice.setattr(precision, "measure", lambda unet: pytest.fail("measured again"))
    assert precision.choose_precision(tiny_unet) == first
    path.write_text("{not json")  # a damaged file is measured again, not trusted
    precision._MACHINE.clear()
    fresh_choice.setattr(precision, "measure", lambda unet: _table("float32", (1.0, 1.05, 1.1)))
    assert precision.choose_precision(tiny_unet).name == "float32"


def test_the_decision_is_keyed_by_what_it_depends_on(fresh_choice, monkeypatch):
    """Another torch or another kernel build is another machine: its own decision file."""
    key = precision.machine_key()
    monkeypatch.setattr(precision.torch, "__version__", "0.0.1")
    assert precision.machine_key() != key


def test_a_cpu_without_native_bf16_is_not_measured(fresh_choice, tiny_unet):
    fresh_choice.setattr(precision, "native_bf16", lambda: False)
    fresh_choice.setattr(precision, "measure", lambda unet: pytest.fail("measured an emulated bf16"))
    assert choose_precision(tiny_unet) == Precision(torch.float32, "this CPU has no native bfloat16")
    assert not precision.decision_path().exists()


def test_a_request_wins_then_the_environment_then_the_machine(fresh_choice, tiny_unet):
    fresh_choice.setattr(precision, "native_bf16", lambda: True)
    fresh_choice.setattr(precision, "measure", lambda unet: _table("bfloat16"))
    assert choose_precision(tiny_unet).name == "bfloat16"  # the machine's
    assert choose_precision(tiny_unet, "float32").name == "float32"  # --precision float32
    fresh_choice.setenv(precision.PRECISION_ENV, "fp32")
    assert choose_precision(tiny_unet).name == "float32"
    assert choose_precision(tiny_unet, "bf16").autocast  # the request over the environment
    assert choose_precision(tiny_unet, "auto").name == "float32"  # auto: not asked, so the environment's


def test_a_typo_is_refused_naming_the_choices(fresh_choice):
    with pytest.raises(ValueError, match="precision must be auto, float32, mixed or bfloat16, got 'half'"):
        choose_precision(None, "half")
    fresh_choice.setenv(precision.PRECISION_ENV, "half")
    with pytest.raises(ValueError, match="DENOISER_PRECISION must be auto, float32, mixed or bfloat16, got 'half'"):
        choose_precision()


def test_the_measurement_times_whole_calls_in_both_precisions(tiny_unet):
    table = precision.measure(tiny_unet, rounds=2, rows=(2, 4))
    assert table["rows"] == [2, 4] and set(table["seconds"]) == set(precision.CANDIDATES)
    assert all(len(s) == 2 and min(s) > 0 for s in table["seconds"].values())
    assert table["choice"] in precision.CANDIDATES and table["model"]["sample_size"] == 16


def test_a_plan_holds_its_precision_for_its_whole_run(tmp_path, tiny_unet):
    """The plan's precision is what runs, whatever the environment says while it runs: resolved once, held by run."""
    from denoiser.sampling.pipeline import save_pipeline

    folder = save_pipeline(tiny_unet, DDPMScheduler(), tmp_path / "model")
    model = load(folder)
    asked_bf16 = resolve(SampleRequest(num_images=2, steps=3, precision="bfloat16"), model)
    f32 = resolve(SampleRequest(num_images=2, steps=3, precision="float32"), model)
    assert asked_bf16.describe().endswith("bfloat16 (bfloat16 was asked for)")
    with precision.running(f32.precision):  # an outer hold does not leak into another plan's run
        bf16_images = run(asked_bf16).images
    f32_images = run(f32).images
    with asked(model.unet, torch.float32):
        plain = run(resolve(SampleRequest(num_images=2, steps=3), model)).images
    assert torch.equal(f32_images, plain) and not torch.equal(bf16_images, plain)


def test_a_model_in_another_dtype_runs_in_it_and_a_precision_asked_for_wins(tiny_unet):
    assert choose_precision(tiny_unet.to(torch.bfloat16)).dtype == torch.bfloat16
    assert not choose_precision(tiny_unet).autocast  # its own dtype: never autocast on top
    tiny_unet.float()
    with asked(tiny_unet, torch.float32):
        assert choose_precision(tiny_unet).dtype == torch.float32 and not choose_precision(tiny_unet).autocast
    with asked(tiny_unet, torch.bfloat16):
        assert choose_precision(tiny_unet).autocast and choose_precision(tiny_unet).name == "bfloat16"
    assert getattr(tiny_unet, "dtype_asked", None) is None  # left as it was


def test_bf16_autocast_predicts_the_same_noise_within_bf16_error(tiny_unet):
    """The UNet under the bf16 path against float64: at most a bf16-sized error, and the output in the input's dtype
    (guidance and the scheduler then work in float32)."""
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(2, 3, 16, 16, generator=g), torch.tensor([10, 700])
    with torch.inference_mode():
        ref = tiny_unet.double()(x.double(), t).sample
        tiny_unet.float()
        with asked(tiny_unet, torch.bfloat16), sampling_context(tiny_unet):
            fast = tiny_unet(x, t).sample
        plain = tiny_unet(x, t).sample
    assert fast.dtype == torch.float32
    assert float((plain.double() - ref).abs().max()) < 1e-4
    err = float((fast.double() - ref).abs().max())
    assert 1e-4 < err < 0.1 * float(ref.abs().max())  # it did run in bf16, and stays close


def test_attention_is_captured_in_float32_under_bf16(tiny_unet):
    """The maps the app shows are the float32 model's exact weights whatever the sampling runs in."""
    x, t = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.tensor([500])
    with torch.inference_mode():
        with asked(tiny_unet, torch.float32), sampling_context(tiny_unet), capture_attention(tiny_unet) as plain:
            tiny_unet(x, t)
        with asked(tiny_unet, torch.bfloat16), sampling_context(tiny_unet), capture_attention(tiny_unet) as under_bf16:
            tiny_unet(x, t)
    assert len(plain) == len(under_bf16) > 0
    for a, b in zip(plain, under_bf16):
        assert b.q.dtype == torch.float32 and torch.equal(a.q, b.q) and torch.equal(a.k, b.k)
        assert torch.equal(a.weights((2, 3)), b.weights((2, 3)))


def test_a_plan_names_its_precision_and_torch_dtype_float32_is_kept(tmp_path, tiny_unet, monkeypatch):
    """The plan says what runs; diffusers' `torch_dtype=torch.float32` keeps a pipeline in float32 even where bf16
    would be chosen, as in diffusers."""
    from diffusers import DiffusionPipeline

    import denoiser  # noqa: F401  (registers the pipeline with diffusers)
    from denoiser.sampling.pipeline import save_pipeline

    monkeypatch.setenv(precision.PRECISION_ENV, "bfloat16")
    folder = save_pipeline(tiny_unet, DDPMScheduler(), tmp_path / "model")
    plan = resolve(SampleRequest(num_images=1, steps=2), folder)
    assert plan.precision.autocast and plan.describe().endswith(f"bfloat16 ({precision.PRECISION_ENV}=bfloat16)")
    held = DiffusionPipeline.from_pretrained(folder, torch_dtype=torch.float32)
    plain = DiffusionPipeline.from_pretrained(folder)
    assert choose_precision(held.unet).dtype == torch.float32 and choose_precision(plain.unet).autocast
    gens = [torch.Generator().manual_seed(0)]
    a = held(1, generator=gens, num_inference_steps=3, output_type="pt").images
    gens = [torch.Generator().manual_seed(0)]
    b = plain(1, generator=gens, num_inference_steps=3, output_type="pt").images
    model = load(folder)
    with asked(model.unet, torch.float32):
        ref = run(resolve(SampleRequest(num_images=1, steps=3, seed=0), model)).images
    # the pipeline's UNet is NCHW, the loaded one channels-last: equal to float32 rounding, unlike the bf16 run
    assert float((a - ref).abs().max()) < 1e-4 < float((b - ref).abs().max())


@pytest.mark.parametrize("model", ["cifar10", "emoji"])
def test_install_measures_the_shipped_architecture(model):
    """`denoiser build-kernels` decides the precision on PRECISION_REFERENCE: the shipped models' UNet, so the
    decision is measured on the calls people run (a changed shipped model must change the reference too)."""
    import json

    from denoiser.cli.main import PRECISION_REFERENCE
    from tests.conftest import ROOT

    shipped = json.loads((ROOT / "weights" / model / "unet" / "config.json").read_text())
    differ = {k: (v, shipped.get(k)) for k, v in PRECISION_REFERENCE.items()
              if k != "num_class_embeds" and (list(v) if isinstance(v, tuple) else v) != shipped.get(k)}
    assert not differ, differ
