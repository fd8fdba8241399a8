"""The attention views of the web app's engine: one pixel's attention in every layer, a text model's word maps,
the four stages of one head, attention averaged over the steps, the heads' statistics and layers switched off.

`AttentionViews` holds them; `Engine` (denoiser/app/engine.py) inherits it and supplies the models (`model`), the
work budget (`check_work`) and sampling (`generate`). A `Generation` is what they read: one sampling run with every
step's model input, from which `records` rebuilds a step's exact attention under `capture_attention`, keeping only
the latest step's (`StepAttention`). Returns tensors, images and plain data, as the engine does; this module never
imports the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from PIL import Image

from denoiser.app.form_limits import check_int
from denoiser.evaluate.attention_stats import LayerStats, attention_stats, stats_chart
from denoiser.model.attention import MultiHeadSelfAttention, attention_layer_names, attention_layers
from denoiser.model.attention_blocks import identity_attention
from denoiser.model.attention_capture import AttentionRecord, capture_attention
from denoiser.pictures import attention_panel, layer_label, maps_panel, stages_panel
from denoiser.pixels import unit_to_model
from denoiser.request import BUILT_IN, SampleRequest
from denoiser.sampling.guidance import Guidance, TextCondition
from denoiser.sampling.loop import sampling_context

__all__ = ["AttentionViews", "Generation", "StepAttention", "Stages"]


class StepAttention:
    """The exact attention of one denoising step of a generation, kept until another step is asked for: a
    session's memory stays bounded however many steps it opens."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._records: list[AttentionRecord] = []

    def get(self, step: int, capture: Callable[[], list[AttentionRecord]]) -> list[AttentionRecord]:
        """Step `step`'s records, from `capture()` unless they are the ones kept."""
        if step != self._step:
            self._step, self._records = None, []  # the old step's records go before the new ones are made
            self._records, self._step = capture(), step
        return self._records

    def __len__(self) -> int:
        return 0 if self._step is None else 1


@dataclass
class Generation:
    """One sampling run of one session: final images and every step's model input."""

    model: str
    images: torch.Tensor  # (B, 3, H, W) in [0, 1]
    inputs: list[torch.Tensor]  # x_t fed to the UNet at each step, (B, C, H, W)
    timesteps: list[int]
    labels: torch.Tensor | None
    guidance: Guidance = field(default_factory=Guidance)  # what the images were sampled with
    replay: SampleRequest | None = None  # the request, its steps the plan's: sampled again (None: a restore's chain)
    attention: StepAttention = field(default_factory=StepAttention, repr=False)  # the latest step's records
    text: TextCondition | None = None  # a text model's encoded prompts (the attention view's re-runs take them)
    prompt: str = ""  # a text model's prompt, image 0's ("" = no condition); a prompt-to-prompt edit's source
    words: tuple[str, ...] = ()  # image 0's words the model sees (weights taken out): one token, one map each
    image_words: tuple[tuple[str, ...], ...] = ()  # each image's words (an edit's differ from its source's)
    word_weights: tuple[tuple[float, ...], ...] = ()  # each image's weight per word ("(red:1.5) apple": 1.5, 1)
    unread: tuple[str, ...] = ()  # the prompt's words past the tokenizer's max_length: cut, the model never read them
    unseen: tuple[str, ...] = ()  # the prompt's words no training caption held: drawn from their letters, a guess
    notes: tuple[str, ...] = ()  # what a person should hear about the prompt (Plan.image_notes: read as, cut, unseen)
    precision: str = ""  # what the UNet ran in (denoiser.fast.precision): "float32" or "bfloat16"

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    def words_of(self, image: int) -> tuple[str, ...]:
        """Image `image`'s words (those of image 0 where the generation keeps no words per image)."""
        return self.image_words[int(image)] if self.image_words else self.words

    def weights_of(self, image: int) -> tuple[float, ...]:
        """Image `image`'s weight per word of `words_of(image)` (1 for a plain word)."""
        return self.word_weights[int(image)] if self.word_weights else (1.0,) * len(self.words_of(image))


@dataclass
class Stages:
    """One pixel's attention in one layer and head, stage by stage, for the page to show."""

    layer: str
    head: int
    query: tuple[int, int]  # (y, x) on the layer's grid
    grid: tuple[int, int]  # (H, W) of the layer
    head_dim: int
    step: int
    timestep: int
    score_range: tuple[float, float]  # stage (2): min, max of q·kᵀ/√d
    weight_sum: float  # stage (3): the softmax's weights sum to this (1)
    top: list[tuple[tuple[int, int], float, float]]  # the most attended pixels: ((y, x), score, weight)


class AttentionViews:
    """The attention views of a Generation (`Engine.views`): they use the engine's `loaded(name)`, `check_work(...)`
    and `generate(...)`."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def records(self, gen: Generation, step: int, kind: str = "self") -> list[AttentionRecord]:
        """Exact attention of step `step` for the whole batch (re-run under capture, cached per step): the pixel-to-pixel
        ("self") layers, or a text model's pixel-to-word ("cross") layers."""
        step = check_int("step", step, 0, gen.num_steps - 1)
        return [r for r in gen.attention.get(step, lambda: self._capture(gen, step)) if r.kind == kind]

    def _capture(self, gen: Generation, step: int) -> list[AttentionRecord]:
        unet = self.engine.loaded(gen.model).unet
        # the sampling pass's setup (packed weights): the same arithmetic, so the same q and k
        x, labels, B = gen.inputs[step], gen.labels, gen.images.shape[0]
        # the guided call as sampled: the images' own rows first, then "no class" (the negative prompt) and perturbed rows
        # (one call, as every captured call is; a batch of more rows than ROWS_PER_CALL was sampled in several calls
        # of whole images, the same rows: tests/sampling/test_guidance.py)
        with torch.inference_mode(), sampling_context(unet), capture_attention(unet) as recs:
            gen.guidance.main_pass(unet, x, gen.timesteps[step], labels, gen.text)
        # the images' own half, copied: a slice would keep the whole qkv projection (and v) alive
        return [dataclasses.replace(r, q=r.q[:B].clone(), k=r.k[:B].clone(),
                                    edit=None if r.edit is None else r.edit.first_rows(B),
                                    key_mask=None if r.key_mask is None else r.key_mask[:B].clone()) for r in recs]

    def attention_maps(self, gen: Generation, image: int, step: int, pixel: tuple[int, int]) -> Image.Image:
        """Every layer's attention of `pixel` (y, x in image coordinates) as overlays, labelled."""
        image = check_int("image", image, 0, gen.images.shape[0] - 1)
        S = gen.images.shape[-1]
        y, x = (check_int("pixel y", pixel[0], 0, S - 1), check_int("pixel x", pixel[1], 0, S - 1))
        return attention_panel(gen.images[image], self.records(gen, step), (y, x), batch_index=image)

    def is_text(self, name: str) -> bool:
        """Whether a model takes a prompt (its UNet has cross-attention) rather than classes."""
        return getattr(self.engine.loaded(name).unet.config, "cross_attention_dim", None) is not None

    def _word(self, gen: Generation, image: int, word) -> int:
        words = gen.words_of(image)
        if not words:
            raise ValueError("this generation has no prompt: its words' maps need a text model and a prompt")
        return check_int(f"word (0..{len(words) - 1}, of {' '.join(words)[:80]!r})", word, 0, len(words) - 1)

    def word_maps(self, gen: Generation, image: int, step: int, word: int) -> list[tuple[str, torch.Tensor]]:
        """Word `word` of the prompt: its map over the pixels in every cross-attention layer at `step`, as
        (layer label, weights (h, H, W)): each pixel's share of attention that goes to the word."""
        image = check_int("image", image, 0, gen.images.shape[0] - 1)
        j = self._word(gen, image, word)
        return [(layer_label(r), r.token_map(j)[image]) for r in self.records(gen, step, "cross")]

    def word_weights(self, gen: Generation, image: int, step: int, pixel: tuple[int, int]) -> list[tuple[str, torch.Tensor]]:
        """One pixel's weights over the prompt's words in every cross-attention layer at `step`, as (layer label,
        weights (h, words)); empty for a generation without a prompt."""
        image = check_int("image", image, 0, gen.images.shape[0] - 1)
        S = gen.images.shape[-1]
        y, x = (check_int("pixel y", pixel[0], 0, S - 1), check_int("pixel x", pixel[1], 0, S - 1))
        n = len(gen.words_of(image))
        if not n:
            return []
        out = []
        for r in self.records(gen, step, "cross"):
            H, W = r.size
            out.append((layer_label(r), r.weights((y * H // S, x * W // S))[image, :, :n]))  # (h, words)
        return out

    def check_layer(self, gen: Generation, layer) -> int:
        """The layer selector's value (an index among the generation's attention layers: an int, or text a person
        typed such as "3") as that index; anything else is refused in words naming how many layers there are."""
        count = len(attention_layer_names(self.engine.loaded(gen.model).unet))
        try:
            index = float(str(layer).strip()) if isinstance(layer, str) else float(layer)
        except (TypeError, ValueError):
            index = float("nan")
        if isinstance(layer, bool) or not index.is_integer() or not 0 <= index < count:  # NaN fails too
            raise ValueError(f"layer {str(layer)[:40]!r} is not one of this generation's {count} attention layers: "
                             "pick one from the list")
        return int(index)

    def layer_names(self, gen: Generation, step: int = 0) -> list[str]:
        return [layer_label(r) for r in self.records(gen, step)]

    def mean_attention_maps(self, gen: Generation, image: int, pixel: tuple[int, int],
                            on_step: Callable[[int, int, torch.Tensor], None] | None = None) -> Image.Image:
        """Every layer's attention of `pixel`, averaged over all denoising steps (one UNet call per step, the whole
        batch with its guidance: refused over the work budget before any work). on_step(i, total, the image in
        [0, 1]) after each step; raising from it stops the work."""
        image = check_int("image", image, 0, gen.images.shape[0] - 1)
        S = gen.images.shape[-1]
        y, x = (check_int("pixel y", pixel[0], 0, S - 1), check_int("pixel x", pixel[1], 0, S - 1))
        unet = self.engine.loaded(gen.model).unet
        self.engine.check_work(unet, gen.images.shape[0], gen.num_steps, gen.guidance)
        sums: dict[str, torch.Tensor] = {}
        for step in range(gen.num_steps):
            for rec in self.records(gen, step):
                H, W = rec.size
                w = rec.weights((y * H // S, x * W // S))[image]  # (h, H, W)
                sums[layer_label(rec)] = sums.get(layer_label(rec), 0) + w / gen.num_steps
            if on_step is not None:
                on_step(step, gen.num_steps, gen.images[image : image + 1])
        return maps_panel(gen.images[image], list(sums.items()), (y, x))

    def head_table(self, gen: Generation, image: int, timesteps=BUILT_IN["statistics_timesteps"],
                   on_step: Callable[[int, int, torch.Tensor], None] | None = None) -> tuple[list[LayerStats], Image.Image]:
        """`attention_stats` of one generated image (its class, heads included) and the charts. Its UNet calls (per
        noise level: one plain, then one per layer and per head switched off) are refused over the work budget
        before any work; on_step(i, total, the image in [0, 1]) after each call, and raising from it stops the work."""
        image = check_int("image", image, 0, gen.images.shape[0] - 1)
        model = self.engine.loaded(gen.model)
        unet, train_sched = model.unet, model.noise_schedule
        calls = len(timesteps) * _stats_calls_per_timestep(unet)
        self.engine.check_work(unet, 1, calls)
        labels = None if gen.labels is None else gen.labels[image : image + 1]
        x0 = unit_to_model(gen.images[image : image + 1])  # (1, C, H, W)
        shown = gen.images[image : image + 1]
        with _each_call(unet, None if on_step is None else (lambda i: on_step(i, calls, shown))):
            rows = attention_stats(unet, train_sched, x0, labels, timesteps)
        return rows, stats_chart(rows)

    def ablate(self, gen: Generation, layers: list[str], heads: list[int] | None = None, on_step=None) -> Generation:
        """The same seed and settings sampled again with `layers` (or their `heads`) switched to identity."""
        if gen.replay is None:
            raise ValueError("switching layers off samples the same seed again: generate images first (a Photo tab result has no seed to repeat)")
        if gen.replay.edit is not None:
            raise ValueError("a word edit's layers cannot be switched off: its edit takes the source's attention maps, "
                             "which identity attention replaces; switch layers off on a generation of one prompt")
        if not layers:
            raise ValueError("choose at least one attention layer to switch off")
        unet = self.engine.loaded(gen.model).unet
        if stale := [name for name in layers if name not in attention_layers(unet)]:  # checked before any work
            raise ValueError(f"{', '.join(stale)}: not a layer of {gen.model}, the model of the images shown (the list is "
                             "of an earlier generation's statistics): press Compute statistics, then choose among its "
                             "layers")
        with identity_attention(unet, layers, heads):
            return self.engine.generate(gen.model, gen.replay, on_step=on_step)

    def four_stages(
        self, gen: Generation, image: int, step: int, pixel: tuple[int, int], layer: int, head: int
    ) -> tuple[Image.Image, Stages]:
        """Scores before softmax and weights after, for one pixel, layer and head, as a picture and as numbers."""
        recs = self.records(gen, step)
        rec = recs[self.check_layer(gen, layer)]
        head = check_int("head", head, 0, rec.num_heads - 1)
        S = gen.images.shape[-1]
        H, W = rec.size
        yq, xq = pixel[0] * H // S, pixel[1] * W // S
        scores = rec.scores((yq, xq))[image, head]  # (H, W), stage (2)
        weights = rec.weights((yq, xq))[image, head]  # (H, W), stage (3)
        panel = stages_panel(gen.images[image], scores, weights, (pixel[0], pixel[1]))
        top = torch.topk(weights.flatten(), k=min(5, weights.numel()))
        return panel, Stages(
            layer=layer_label(rec), head=head, query=(yq, xq), grid=(H, W), head_dim=rec.q.shape[-1], step=step,
            timestep=gen.timesteps[step], score_range=(float(scores.min()), float(scores.max())),
            weight_sum=float(weights.sum()),
            top=[((int(i) // W, int(i) % W), float(scores.flatten()[i]), float(w)) for w, i in zip(top.values, top.indices)],
        )


def _stats_calls_per_timestep(unet) -> int:
    """UNet calls attention_stats makes per noise level: the plain call, then each layer switched off, then each
    head of a layer with several heads."""
    layers = [m for m in unet.modules() if isinstance(m, MultiHeadSelfAttention)]
    return 1 + sum(1 + (m.num_heads if m.num_heads > 1 else 0) for m in layers)


@contextlib.contextmanager
def _each_call(unet, after: Callable[[int], None] | None):
    """after(i) once the i-th UNet call (0-based) made by this thread inside the context has returned; an exception
    it raises ends the caller's work. Calls from other threads (other sessions) are not counted."""
    if after is None:
        yield
        return
    thread, count = threading.get_ident(), [0]

    def hook(module, args, output) -> None:
        if threading.get_ident() == thread:
            count[0] += 1
            after(count[0] - 1)

    handle = unet.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
