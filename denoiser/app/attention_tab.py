"""The Attention tab: click a pixel of a generated image and see where each attention layer looks from it (every
layer's maps, the four stages of one layer and head), a text model's word maps, and the maps averaged over the whole
chain (a job with its own Stop). One module: its components (`AttentionTab.build`), its handlers and its wiring
(`AttentionTab.wire`). The generation it shows is the session's (the page's shared state), set by every tab that
samples with what `AttentionTab.show` gives for it.
"""

from __future__ import annotations

import gradio as gr

from denoiser.app.controls import CLEAR_TOASTS, form_slider, job_controls, run_controls
from denoiser.app.page import Page
from denoiser.app.streaming import friendly, user_error
from denoiser.app.views import (
    click_to_pixel,
    clickable_image,
    index_slider,
    of_this_generation,
    require_generation,
    stages_text,
)
from denoiser.app.words import (
    word_choices,
    word_label,
    word_maps_label,
    word_maps_view,
    word_weights_chart,
    word_weights_label,
    words_label,
)

__all__ = ["AttentionTab", "image_words"]


def image_words(gen, image, word):
    """The Attention tab's words for the chosen image (the two pictures of a word edit have different words): their
    choices labelled with their weights, the word chosen kept where the image has it."""
    if gen is None or not gen.words:
        return gr.skip()
    words = gen.words_of(int(image))
    keep_word = word if word is not None and 0 <= int(word) < len(words) else None
    return gr.update(choices=word_choices(words, gen.weights_of(int(image))), value=keep_word)


class AttentionTab:
    """The Attention tab of one page: built inside the page's Blocks (`build`), then wired to the session's
    generation and clicked pixel (`wire`)."""

    def __init__(self, page: Page) -> None:
        self.page, self.engine, self.jobs = page, page.engine, page.jobs

    def build(self) -> None:
        with gr.Tab("Attention", elem_id="attention-tab"):
            gr.Markdown("Click any pixel of the image to see where each attention layer looks from it. Nothing here "
                        "yet? Generate on the **Sample** tab or run the **Photo** tab first.", elem_id="attention-hint")
            with gr.Row():
                with gr.Column(scale=1):
                    # shown once there is a generation (their ranges follow it)
                    self.image_idx = form_slider(0, 1, value=0, step=1, label="image", visible=False,
                                                 elem_id="image-index")
                    self.step = form_slider(0, 1, value=0, step=1, label="denoising step", visible=False)
                    self.clickable = gr.Image(label="click a pixel", format="png", type="pil", interactive=False,
                                              elem_id="clickable")
                    with gr.Row():
                        # typed values reach the check as typed
                        self.py = gr.Number(value=0, precision=None, label="pixel y")
                        self.px = gr.Number(value=0, precision=None, label="pixel x")
                        self.show_btn = gr.Button("show", size="sm")
                    # a text model's generation: its prompt's words (`AttentionTab.show` lists them)
                    self.words = gr.Radio([], label=words_label((), ()), elem_id="words", visible=False,
                                          info="click a word: its map in each cross-attention layer; click a pixel: its "
                                               "weights over the words (both on the right, at the chosen step)")
                    self.word_heads = gr.Checkbox(False, label="each head of the word's map", elem_id="word-heads",
                                                  visible=False, info="a row per layer: the mean of heads, then each head")
                    # custom values allowed: a session's API call may name a layer before its page has listed any (the
                    # handlers refuse one that is not a layer of the generation, in words)
                    self.layer = gr.Dropdown([], label="layer (four stages)", elem_id="layer", allow_custom_value=True)
                    self.head = gr.Dropdown([0], value=0, label="head (four stages)", elem_id="head")  # the layer's heads
                    # long work (one U-Net call per step): a job of its own, with progress and Stop
                    self.mean_run, self.mean_stop, self.mean_status = run_controls(
                        "average the maps over every step", "mean-run", "mean-stop", "mean-status")
                with gr.Column(scale=2):
                    # a text model's cross-attention, above its self-attention: the chosen word's map, the pixel's words
                    self.word_maps = gr.Image(label=word_maps_label(), format="png", type="pil", interactive=False,
                                              elem_id="word-maps", visible=False)
                    self.word_weights = gr.Image(label=word_weights_label(), format="png", type="pil",
                                                 interactive=False, elem_id="word-weights", visible=False)
                    # titles above the images: a floating label would cover the first row's layer names
                    gr.Markdown("**Attention of the clicked pixel** (pixels to pixels): one row per layer, mean of heads, "
                                "then each head")
                    self.maps = gr.Image(label="attention maps", show_label=False, format="png", type="pil", interactive=False, elem_id="maps")
                    gr.Markdown("**The four stages** for one layer and head")
                    self.stages = gr.Image(label="four stages", show_label=False, format="png", type="pil", interactive=False,
                                           elem_id="stages")
                    self.stage_text = gr.Markdown(label="four stages in numbers", show_label=False, elem_id="stage-text")

    @property
    def generation_outputs(self) -> list:
        """What a new generation sets (`show`'s keys, in this order): the generation itself, the image and step
        sliders, the image to click, the layer and head selectors, and the views of the generation before cleared:
        the pixel, the maps, the stages, the words and their views."""
        return [self.page.generation, self.image_idx, self.step, self.clickable, self.layer, self.head, self.page.pixel,
                self.maps, self.stages, self.stage_text, self.words, self.word_maps, self.word_weights, self.word_heads]

    def show(self, gen) -> dict:
        """A new generation on the page (any tab that samples yields this): its image and step sliders (its last step
        chosen), its first image to click, its last step's layers (the first chosen) and the first layer's heads; no
        pixel, no maps of the generation before; its prompt's words (if any), no word chosen."""
        records = self.engine.views.records(gen, gen.num_steps - 1)
        names = self.engine.views.layer_names(gen, gen.num_steps - 1)
        text = bool(gen.words)
        return {self.page.generation: gen, self.image_idx: index_slider(gen.images.shape[0], 0),
                self.step: index_slider(gen.num_steps, gen.num_steps - 1), self.clickable: clickable_image(gen, 0, None),
                self.layer: gr.update(choices=[(name, i) for i, name in enumerate(names)], value=0),
                self.head: gr.update(choices=list(range(records[0].num_heads)), value=0),
                self.page.pixel: None, self.maps: None, self.stages: None, self.stage_text: "",
                self.words: gr.update(choices=word_choices(gen.words_of(0), gen.weights_of(0)), value=None,
                                      visible=text, label=words_label(gen.words, gen.unread, gen.unseen)),
                self.word_maps: gr.update(value=None, visible=text), self.word_weights: gr.update(value=None, visible=text),
                self.word_heads: gr.update(visible=text)}  # the word maps' "each head": as the person left it

    def wire(self, app: gr.Blocks) -> None:
        """Every view follows the image, the step, a clicked or typed pixel, the layer and head; the averaging is a job."""
        gen_state, pixel_state = self.page.generation, self.page.pixel
        job_controls(self.mean_run, self.mean_stop, self.mean_status, self.jobs, self.mean_maps,
                     [gen_state, self.image_idx, pixel_state], [self.maps, self.mean_status], api_name="mean_maps")
        self.show_btn.click(None, js=f"() => {{ {CLEAR_TOASTS} }}", api_name=False, queue=False)  # older messages close
        pixel_outputs = [pixel_state, self.py, self.px, self.clickable, self.maps, self.stages, self.stage_text]
        views = [gen_state, self.image_idx, self.step, pixel_state, self.layer, self.head]
        shown = [self.clickable, self.maps, self.stages, self.stage_text]
        # a text model's words: the chosen word's maps and the pixel's weights over the words follow every change
        word_views = dict(fn=self.word_views, inputs=[gen_state, self.image_idx, self.step, pixel_state, self.words,
                                                      self.word_heads],
                          outputs=[self.word_maps, self.word_weights], api_name=False)
        # another image: its words (a word edit's two differ), then its views
        self.image_idx.change(self.refresh, views, shown, api_name=False).then(
            image_words, [gen_state, self.image_idx, self.words], self.words, api_name=False).then(**word_views)
        self.step.change(self.refresh, views, shown, api_name="refresh").then(**word_views)
        self.clickable.select(self.click, [gen_state, self.image_idx, self.step, self.layer, self.head], pixel_outputs,
                              api_name=False).then(**word_views)
        self.show_btn.click(self.at_pixel, [gen_state, self.image_idx, self.step, self.py, self.px, self.layer,
                                            self.head], pixel_outputs, api_name="attention").then(**word_views)
        self.words.input(**word_views)
        self.word_heads.input(**word_views)
        # another layer: its stages, and the head selector offers its heads; another head: its stages
        self.layer.change(self.restage, views, [self.stages, self.stage_text, self.head], api_name=False)
        self.head.change(self.restage_head, views, [self.stages, self.stage_text], api_name=False)

    @friendly
    def at_pixel(self, gen, image, step, y, x, layer, head):
        """The views of one pixel at one step: the clickable image marked, every layer's maps, the four stages."""
        require_generation(gen)
        pixel = (y, x)
        try:
            maps = self.engine.views.attention_maps(gen, image, step, pixel)
        except ValueError as err:
            raise user_error(err) from None
        try:
            stages, numbers = self.engine.views.four_stages(gen, image, step, pixel, layer or 0, head or 0)
            text = stages_text(numbers)
        except ValueError as err:  # a layer typed that is none: said on the stages' line; the pixel's views still show
            stages, text = None, f"**Not shown:** {user_error(err).message}"
        y, x = int(y), int(x)
        return (y, x), y, x, clickable_image(gen, int(image), (y, x)), maps, stages, text

    @friendly
    def click(self, gen, image, step, layer, head, evt: gr.SelectData):
        require_generation(gen)
        y, x = click_to_pixel(evt.index, gen.images.shape[-1])
        return self.at_pixel(gen, image, step, y, x, layer, head)

    @friendly
    @of_this_generation(4)
    def refresh(self, gen, image, step, pixel, layer, head):
        """Every view at the current (image, step, pixel): the clickable image, the maps, the four stages."""
        if gen is None:
            return None, None, None, ""
        if pixel is None:
            return clickable_image(gen, int(image), None), None, None, ""
        return self.at_pixel(gen, image, step, pixel[0], pixel[1], layer, head)[3:]

    @friendly
    @of_this_generation(2)
    def word_views(self, gen, image, step, pixel, word, heads=False):
        """A text model's cross-attention at (image, step): the chosen word's map, all layers together and in every
        cross-attention layer (heads: each head's too), and the clicked pixel's weights over the prompt's words;
        None where there is no word or pixel (or no prompt)."""
        if gen is None or not gen.words:
            return None, None
        try:
            weights_of = gen.weights_of(image)
            labels = [word_label(w, x) for w, x in zip(gen.words_of(image), weights_of)]
            maps = None
            if word is not None:
                panel = self.engine.views.word_maps(gen, image, step, word)
                maps = gr.update(value=word_maps_view(gen.images[int(image)], panel, None if pixel is None else tuple(pixel),
                                                       heads=bool(heads)), label=word_maps_label(labels[int(word)]))
            weights = None
            if pixel is not None:
                weights = gr.update(value=word_weights_chart(self.engine.views.word_weights(gen, image, step, pixel), labels),
                                    label=word_weights_label(any(x != 1 for x in weights_of)))
        except ValueError as err:
            raise user_error(err) from None
        return maps, weights

    def mean_maps(self, gen, image, pixel, progress=gr.Progress(), request: gr.Request = None):
        """The clicked pixel's maps averaged over every step of the chain: long work (one UNet call per step), so a
        job like Generate (the one-job queue, the work budget, progress, Stop). Yields updates of the maps and the
        status line."""
        try:
            require_generation(gen)
            if pixel is None:
                raise ValueError("click a pixel of the image first: the maps are of that pixel")
        except Exception as err:  # noqa: BLE001 - said on the status line, then raised
            yield from self.jobs.refuse(request, self.mean_status, err)

        def job(on_step):
            return self.engine.views.mean_attention_maps(gen, image, pixel, on_step=on_step)

        maps = yield from self.jobs.run(request, self.mean_status, job, progress, "averaging")
        if maps is None:  # stopped: its line says where
            return
        yield self.jobs.done(request, self.mean_status, {
            self.maps: maps,
            self.mean_status: f"done: the maps of pixel (y {pixel[0]}, x {pixel[1]}) averaged over all {gen.num_steps} "
                              "steps"})

    @friendly
    @of_this_generation(3)
    def restage(self, gen, image, step, pixel, layer, head):
        """The four stages at the chosen layer and head; the head selector offers the chosen layer's heads (a
        head the layer lacks becomes head 0)."""
        if gen is None:
            return None, "", gr.skip()
        records = self.engine.views.records(gen, step)
        try:
            layer = self.engine.views.check_layer(gen, layer)
        except ValueError as err:  # a layer typed that is none: said in words, the head list kept, no stale stages
            message = user_error(err).message
            gr.Warning(message)
            return None, f"**Not shown:** {message}", gr.skip()
        heads = records[layer].num_heads
        head = int(head) if head is not None and 0 <= int(head) < heads else 0
        choices = gr.update(choices=list(range(heads)), value=head)
        if pixel is None:
            return None, "", choices
        stages, numbers = self.engine.views.four_stages(gen, image, step, pixel, layer, head)
        return stages, stages_text(numbers), choices

    def restage_head(self, gen, image, step, pixel, layer, head):
        """The four stages at another head of the chosen layer."""
        return self.restage(gen, image, step, pixel, layer, head)[:2]
