"""The UNet under the contract diffusers' own model tests check for UNet2DModel (ModelTesterMixin,
TrainingTesterMixin, MemoryTesterMixin, TorchCompileTesterMixin), as CPU-runnable equivalents: export,
compile without graph breaks, gradient checkpointing, layerwise casting, dtypes, save/load, determinism."""

from __future__ import annotations

import copy
import logging
import re
import warnings

import pytest
import torch
from diffusers.training_utils import EMAModel

from denoiser import UNet
from denoiser.folders.model_dir import WEIGHTS_DIR, load_model
from tests.conftest import TINY


@pytest.fixture
def class_unet():
    torch.manual_seed(0)
    return UNet(**TINY, num_class_embeds=3, dropout=0.1).eval()


def _inputs(batch: int = 2, size: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=g), torch.tensor([5, 700])[:batch], torch.tensor([0, 3])[:batch]


# --- export and compile ------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_labels", [False, True])
def test_export_with_and_without_class_labels(class_unet, with_labels):
    x, t, y = _inputs()
    kwargs = {"class_labels": y} if with_labels else {}
    exported = torch.export.export(class_unet, (x, t), kwargs)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x, t, **kwargs).sample, class_unet(x, t, **kwargs).sample,
                                   rtol=1e-5, atol=1e-5)
    graph = str(exported.graph)
    assert "aten.any" not in graph and "small_head_attention" not in graph  # no eager-only check or kernel traced


def test_shipped_model_exports():
    unet, _ = load_model(WEIGHTS_DIR / "synthetic-shapes")  # channels-last, as the app and CLI run it
    x, t, y = _inputs()
    exported = torch.export.export(unet, (x, t), {"class_labels": y})
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x, t, class_labels=y).sample, unet(x, t, class_labels=y).sample,
                                   rtol=1e-5, atol=1e-5)


def test_compile_fullgraph_no_graph_breaks_no_recompiles(class_unet):
    torch._dynamo.reset()
    x, t, y = _inputs()
    with torch.no_grad():
        explained = torch._dynamo.explain(class_unet)(x, t, class_labels=y)
        assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
        compiled = torch.compile(class_unet, fullgraph=True, backend="aot_eager")
        with torch._dynamo.config.patch(error_on_recompile=True):
            for labels in (y, torch.tensor([1, 2])):  # new label values: no recompilation
                torch.testing.assert_close(compiled(x, t, class_labels=labels).sample,
                                           class_unet(x, t, class_labels=labels).sample, rtol=1e-5, atol=1e-5)


def test_inductor_compile_matches_eager(class_unet):
    # the default backend, as TorchCompileTesterMixin runs it (about 30 s of C++ compiling on 2 cores)
    torch._dynamo.reset()
    x, t, y = _inputs()
    with torch.no_grad():
        out = torch.compile(class_unet, fullgraph=True)(x, t, class_labels=y).sample
        torch.testing.assert_close(out, class_unet(x, t, class_labels=y).sample, rtol=1e-4, atol=1e-5)


def test_eager_calls_keep_their_checks(class_unet):
    x, t, _ = _inputs()
    with pytest.raises(ValueError, match="class_labels must lie in 0..2"):
        class_unet(x, t, class_labels=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="timestep must be"):
        class_unet(x, torch.tensor([1, 2, 3]))


# --- training features -------------------------------------------------------------------------------------


def test_gradient_checkpointing_gives_the_same_gradients(class_unet):
    plain = class_unet.train()
    ckpt = copy.deepcopy(plain)
    ckpt.enable_gradient_checkpointing()
    assert ckpt.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    x, t, y = _inputs()
    grads = []
    for model in (plain, ckpt):
        torch.manual_seed(1)  # dropout: the recomputation replays the same masks (checkpoint keeps the RNG state)
        loss = model(x, t, class_labels=y).sample.square().mean()
        loss.backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(g1 is not None and torch.equal(g1, g2) for g1, g2 in zip(*grads))
    calls = []
    ckpt._gradient_checkpointing_func = lambda module, *args: calls.append(type(module).__name__) or module(*args)
    ckpt(x, t, class_labels=y)
    assert "ResBlock" in calls and "SpatialSelfAttention" in calls  # every block is checkpointed
    calls.clear()
    with torch.no_grad():
        ckpt(x, t, class_labels=y)
    assert not calls  # inference never recomputes
    ckpt.disable_gradient_checkpointing()
    assert not ckpt.is_gradient_checkpointing


def test_a_training_step_with_ema_updates_every_parameter(class_unet):
    model = class_unet.train()
    ema = EMAModel(model.parameters(), decay=0.9, update_after_step=0)
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, t, y = _inputs()
    model(x, t, class_labels=y).sample.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing
    opt.step()
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) == len(before)
    ema.step(model.parameters())  # diffusers' EMA takes our parameters; its first step copies them
    ema.step(model.parameters())
    ema.copy_to(averaged := copy.deepcopy(model).parameters())
    assert all(torch.equal(a, p) for a, p in zip(averaged, model.parameters()))


# --- dtypes and memory -------------------------------------------------------------------------------------


def test_layerwise_casting_stores_small_and_computes_like_rounded_weights(class_unet):
    x, t, y = _inputs()
    reference = copy.deepcopy(class_unet)
    cast = copy.deepcopy(class_unet)
    cast.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    skip = [re.compile(p) for p in ("norm", *UNet._skip_layerwise_casting_patterns)]
    n_cast = 0
    for name, module in reference.named_modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear, torch.nn.Embedding)) and not any(p.search(name) for p in skip):
            n_cast += 1
            for p in module.parameters(recurse=False):  # what the storage dtype keeps of each weight
                p.data = p.data.to(torch.float8_e4m3fn).float()
            assert dict(cast.named_modules())[name].weight.dtype == torch.float8_e4m3fn
    assert n_cast > 20
    assert all(m.weight.dtype == torch.float32 for n, m in cast.named_modules() if n.endswith("norm1"))
    with torch.no_grad():
        assert torch.equal(cast(x, t, class_labels=y).sample, reference(x, t, class_labels=y).sample)
    assert cast.get_memory_footprint() < 0.5 * class_unet.get_memory_footprint()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_casts_and_loads_without_warnings(class_unet, dtype, tmp_path, caplog):
    class_unet.save_pretrained(tmp_path / "unet")
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")
        moved = copy.deepcopy(class_unet).to(dtype)
        loaded = UNet.from_pretrained(tmp_path / "unet", torch_dtype=dtype)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert moved.dtype == loaded.dtype == dtype
    x, t, y = _inputs()
    with torch.no_grad():
        out = loaded(x.to(dtype), t, class_labels=y).sample
        ref = class_unet(x, t, class_labels=y).sample
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, rtol=0.1, atol=0.05)  # half precision: a few ulps of fp16/bf16


class _Records(logging.Handler):
    """diffusers' loggers do not propagate to the root (so caplog sees nothing of them): listen on one directly."""

    def __init__(self, name: str):
        super().__init__(logging.WARNING)
        self.logger, self.messages = logging.getLogger(name), []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self):
        self.logger.addHandler(self)
        return self.messages

    def __exit__(self, *exc):
        self.logger.removeHandler(self)


def test_diffusers_warns_about_an_empty_fp32_list():
    # the reason UNet.to quiets one message (diffusers 0.42.1); should diffusers stop, this fails and UNet.to can go
    from diffusers import ConfigMixin, ModelMixin
    from diffusers.configuration_utils import register_to_config

    class Plain(ModelMixin, ConfigMixin):
        @register_to_config
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

    with _Records("diffusers.models.modeling_utils") as messages:
        Plain().to(torch.float16)
    assert any("should be kept in float32: []" in m for m in messages), messages


def test_unet_to_drops_only_that_warning_and_only_during_its_call(class_unet):
    import threading

    from denoiser.model.diffusers_warnings import _EMPTY_FP32_LIST

    logger = logging.getLogger("diffusers.models.modeling_utils")
    message = "There are modules in X that should be kept in float32: []"
    filters = list(logger.filters)
    with _Records("diffusers.models.modeling_utils") as messages:
        copy.deepcopy(class_unet).to(torch.bfloat16)
        assert messages == []
        with _EMPTY_FP32_LIST.during_call(logger):  # as inside UNet.to: another thread's record still passes
            logger.warning(message)
            other = threading.Thread(target=logger.warning, args=(message,))
            other.start()
            other.join()
        logger.warning(message)  # another model's, after
    assert len(messages) == 2 and logger.filters == filters  # nothing stays installed


def test_save_load_round_trip_is_deterministic(class_unet, tmp_path):
    class_unet.save_pretrained(tmp_path / "unet")
    loaded = UNet.from_pretrained(tmp_path / "unet").eval()
    x, t, y = _inputs()
    with torch.no_grad():
        first = loaded(x, t, class_labels=y).sample
        assert torch.equal(first, loaded(x, t, class_labels=y).sample)  # determinism
        assert torch.equal(first, class_unet(x, t, class_labels=y).sample)
        tup = loaded(x, t, class_labels=y, return_dict=False)
    assert isinstance(tup, tuple) and tup[0].shape == x.shape
    def public(config):  # json keeps lists where the constructor got tuples
        return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items() if not k.startswith("_")}

    assert public(loaded.config) == public(class_unet.config)


def test_compile_with_a_prompt_no_graph_breaks_no_recompiles():
    torch._dynamo.reset()
    torch.manual_seed(0)
    unet = UNet(**TINY, cross_attention_dim=8).eval()
    x, t, _ = _inputs()
    states = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])  # diffusers' encoder_attention_mask: 1 = token, 0 = padding
    with torch.no_grad():
        explained = torch._dynamo.explain(unet)(x, t, encoder_hidden_states=states, encoder_attention_mask=mask)
        assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
        compiled = torch.compile(unet, fullgraph=True, backend="aot_eager")
        with torch._dynamo.config.patch(error_on_recompile=True):
            for m in (mask, torch.zeros_like(mask)):  # another prompt, then an empty one: no recompilation
                kwargs = {"encoder_hidden_states": states, "encoder_attention_mask": m}
                torch.testing.assert_close(compiled(x, t, **kwargs).sample, unet(x, t, **kwargs).sample,
                                           rtol=1e-5, atol=1e-5)
