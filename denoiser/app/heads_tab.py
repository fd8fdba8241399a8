"""The Heads tab: what each attention layer and head does for the chosen image, at the noise levels of `denoiser
attention-stats` (its charts and table; BUILT_IN's statistics_timesteps), and a switch that regenerates the same seed
with the chosen layers or heads at identity attention. One module: its components (`HeadsTab.build`), its handlers
and its wiring (`HeadsTab.wire`). The image is the Attention tab's image slider's, of the session's generation (the
page's shared state).
"""

from __future__ import annotations

import gradio as gr
import torch

from denoiser.app.attention_tab import AttentionTab
from denoiser.app.controls import job_controls, run_controls
from denoiser.app.page import Page
from denoiser.app.views import NO_GENERATION, enlarge
from denoiser.image_io import to_pil
from denoiser.request import BUILT_IN

__all__ = ["HeadsTab", "HEAD_COLUMNS"]

HEAD_COLUMNS = ["layer", "head", "grid", "distance (px)", "entropy / log N", "self-weight", "output change"]


def _head_rows(rows) -> list[list]:
    """attention_stats rows -> one table row per (layer, head), averaged over the noise levels."""
    groups: dict[tuple[str, int], list] = {}
    for r in rows:
        groups.setdefault((r.layer, r.head), []).append(r)
    table = []
    for (layer, head), rs in groups.items():
        n = len(rs)
        table.append([layer, head, f"{rs[0].resolution}x{rs[0].resolution}",
                      round(sum(r.mean_distance for r in rs) / n, 2), round(sum(r.entropy / r.max_entropy for r in rs) / n, 3),
                      round(sum(r.self_weight for r in rs) / n, 3), round(sum(r.output_change for r in rs) / n, 4)])
    return table


def _parse_heads(text) -> list[int] | None:
    """'all' (or empty) -> None; '0, 2' -> [0, 2]."""
    text = str(text or "").strip().lower()
    if text in ("", "all"):
        return None
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"heads must be 'all' or comma-separated numbers such as 0,2; got {text[:40]!r}") from None


class HeadsTab:
    """The Heads tab of one page: built inside the page's Blocks (`build`), then wired to the page's generation and
    image slider (`wire`)."""

    def __init__(self, page: Page) -> None:
        self.page, self.engine, self.jobs = page, page.engine, page.jobs

    def build(self) -> None:
        with gr.Tab("Heads", elem_id="heads-tab"):
            noise_levels = ", ".join(map(str, BUILT_IN["statistics_timesteps"]))  # `denoiser attention-stats`' too
            gr.Markdown("What each attention layer and head does for the chosen image (Attention tab's image slider), "
                        f"at the noise levels t = {noise_levels}: how far it looks (mean distance in image pixels), how "
                        "spread its weights are (entropy / log N: 1 = uniform), how much a pixel keeps of itself, and how "
                        "much the U-Net's output changes when the layer or head is switched to identity attention.")
            with gr.Row():
                with gr.Column(scale=1):
                    self.stats_run, self.stats_stop, self.stats_status = run_controls(
                        "Compute statistics", "stats-run", "stats-stop", "stats-status")
                    # a layer the page no longer lists (an API call's, say) reaches the switch, which says why in words
                    self.off_layers = gr.Dropdown([], multiselect=True, label="layers to switch off", elem_id="off-layers",
                                                  info="listed once the statistics are computed", allow_custom_value=True)
                    self.off_heads = gr.Textbox("all", label="heads to switch off (all, or e.g. 0,2)", elem_id="off-heads")
                    self.off_run, self.off_stop, self.off_status = run_controls(
                        "Switch off and regenerate (same seed)", "off-run", "off-stop", "off-status")
                with gr.Column(scale=2):
                    gr.Markdown("**Per layer** (heads averaged), over the noise level t (noisy on the left)")
                    self.stats_chart = gr.Image(label="per layer", show_label=False, format="png", type="pil", interactive=False,
                                                elem_id="stats-chart")
                    self.stats_table = gr.Dataframe(headers=HEAD_COLUMNS, label="layers x heads (mean over the noise "
                                                    "levels; head -1 = the whole layer)", elem_id="stats-table",
                                                    interactive=False)
                    gr.Markdown("**Switched off**: as generated (top row), the same seed without the chosen attention "
                                "(bottom)")
                    self.off_image = gr.Image(label="switched off", show_label=False, format="png", type="pil", interactive=False,
                                              elem_id="off-image")
                    self.off_text = gr.Markdown(label="switched off in numbers", show_label=False)

    def wire(self, app: gr.Blocks) -> None:
        """Its two jobs, each with its Stop and status line (job_controls), on the session's generation and the image
        the Attention tab's slider chose."""
        gen_state, image_idx = self.page.generation, self.page.tab(AttentionTab).image_idx
        job_controls(self.stats_run, self.stats_stop, self.stats_status, self.jobs, self.head_stats,
                     [gen_state, image_idx, self.off_layers],
                     [self.stats_chart, self.stats_table, self.off_layers, self.stats_status], api_name="heads")
        job_controls(self.off_run, self.off_stop, self.off_status, self.jobs, self.switch_off,
                     [gen_state, self.off_layers, self.off_heads], [self.off_image, self.off_text, self.off_status],
                     api_name="switch_off")

    def head_stats(self, gen, image, chosen=None, progress=gr.Progress(), request: gr.Request = None):
        """The Heads tab's statistics of one generated image: long work (a UNet call per noise level, layer and head),
        so a job like Generate. `chosen`: the layers picked to switch off; those this model lacks (picked from another
        model's statistics) are dropped with the new list. Yields updates of the chart, the table, the layers to switch
        off and the status line."""
        if gen is None:  # a hint, not an error: no "Error" badge over the chart and the layer list
            gr.Warning(NO_GENERATION)
            yield self.jobs.done(request, self.stats_status, {self.stats_status: NO_GENERATION})
            return

        def job(on_step):
            return self.engine.views.head_table(gen, image, on_step=on_step)

        measured = yield from self.jobs.run(request, self.stats_status, job, progress, "measuring")
        if measured is None:  # stopped: its line says where
            return
        rows, chart = measured
        unprompted = " (a text model: measured without its prompt, unconditional)" if gen.words else ""
        layers = list(dict.fromkeys(r.layer for r in rows))
        kept = [name for name in (chosen or []) if name in layers]  # another model's layers: not offered, not kept
        yield self.jobs.done(request, self.stats_status, {
            self.stats_chart: chart, self.stats_table: _head_rows(rows),
            self.off_layers: gr.update(choices=layers, value=kept),
            self.stats_status: f"done: {len({r.layer for r in rows})} layers at {len({r.timestep for r in rows})} "
                               f"noise levels{unprompted}"})

    def switch_off(self, gen, layers, heads, progress=gr.Progress(), request: gr.Request = None):
        """The Heads tab's switch: the same seed regenerated with the chosen layers or heads at identity attention, a
        job like Generate (its own status line and Stop). Before any generation, the hint Compute statistics gives (a
        warning and its line, not an error). Yields updates of the picture, its text and the status line."""
        if gen is None:
            gr.Warning(NO_GENERATION)
            yield self.jobs.done(request, self.off_status, {self.off_status: NO_GENERATION})
            return
        try:
            head_ids = _parse_heads(heads)
            if not layers:
                raise ValueError("choose at least one attention layer to switch off (listed once the statistics are "
                                 "computed)")
        except Exception as err:  # noqa: BLE001 - said on the status line, then raised
            yield from self.jobs.refuse(request, self.off_status, err)

        def job(on_step):
            return self.engine.views.ablate(gen, list(layers), head_ids, on_step=on_step)

        off = yield from self.jobs.run(request, self.off_status, job, progress, "switching off", self.off_image, enlarge)
        if off is None:  # stopped: its line says where
            return
        which = ", ".join(layers) + ("" if head_ids is None else f" (heads {', '.join(map(str, head_ids))})")
        change = float((off.images - gen.images).abs().mean())
        yield self.jobs.done(request, self.off_status, {
            self.off_image: enlarge(to_pil(torch.cat([gen.images, off.images]), nrow=gen.images.shape[0]), target=768),
            self.off_text: f"Top row: as generated. Bottom row: the same seed with **{which}** switched to identity "
                           f"attention (each pixel attends only to itself). Mean pixel change: {change:.4f}",
            self.off_status: f"done: {which} switched off, {off.num_steps} steps"})
