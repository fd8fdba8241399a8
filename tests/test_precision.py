"""The inference precision (denoiser.fast.precision): chosen by measurement, named where it ran, float32 when asked
for, and attention maps captured exactly in float32 whatever the sampling runs in. Nothing here depends on which
precision this CPU picks: the choice is driven through the environment, the measurement and `asked`."""

from __future__ import annotations

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
def fresh_choice(monkeypatch):
    """The process's choice made again under the test's environment, and forgotten after it."""
    precision._cpu_choice.cache_clear()
    yield monkeypatch
    precision._cpu_choice.cache_clear()


@pytest.mark.parametrize("speedup, dtype", [(2.0, torch.bfloat16), (1.05, torch.float32), (0.5, torch.float32)])
def test_bf16_is_chosen_only_where_it_measures_faster(fresh_choice, speedup, dtype):
    fresh_choice.delenv(precision.PRECISION_ENV, raising=False)
    fresh_choice.setattr(precision, "native_bf16", lambda: True)
    fresh_choice.setattr(precision, "measure_bf16_speedup", lambda: speedup)
    chosen = choose_precision()
    assert chosen.dtype == dtype and chosen.autocast == (dtype == torch.bfloat16)
    assert f"{speedup:.2f}x" in chosen.why


def test_a_cpu_without_native_bf16_is_not_measured(fresh_choice):
    fresh_choice.delenv(precision.PRECISION_ENV, raising=False)
    fresh_choice.setattr(precision, "native_bf16", lambda: False)
    fresh_choice.setattr(precision, "measure_bf16_speedup", lambda: pytest.fail("measured an emulated bf16"))
    assert choose_precision() == Precision(torch.float32, "this CPU has no native bfloat16")


def test_the_environment_sets_it_and_a_typo_is_refused(fresh_choice):
    fresh_choice.setenv(precision.PRECISION_ENV, "bf16")
    assert choose_precision().autocast
    precision._cpu_choice.cache_clear()
    fresh_choice.setenv(precision.PRECISION_ENV, "half")
    with pytest.raises(ValueError, match="DENOISER_PRECISION must be auto, float32 or bfloat16, got 'half'"):
        choose_precision()


def test_the_measurement_is_a_positive_ratio():
    assert precision.measure_bf16_speedup(repeats=1) > 0


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


def test_a_plan_names_its_precision_and_torch_dtype_float32_is_kept(tmp_path, tiny_unet, fresh_choice):
    """The plan says what runs; diffusers' `torch_dtype=torch.float32` keeps a pipeline in float32 even where bf16
    would be chosen, as in diffusers."""
    from diffusers import DiffusionPipeline

    import denoiser  # noqa: F401  (registers the pipeline with diffusers)
    from denoiser.sampling.pipeline import save_pipeline

    fresh_choice.setenv(precision.PRECISION_ENV, "bfloat16")
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
