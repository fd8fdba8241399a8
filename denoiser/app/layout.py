"""The web app's page: its tabs (TABS, in their order), each a module with its components, handlers and wiring
(denoiser/app/sample_tab.py, photo_tab.py, attention_tab.py, heads_tab.py), around what they share
(denoiser/app/page.py); the page's style and how every server launches it. A new tab is its module and a line in TABS.
"""

from __future__ import annotations

import gradio as gr

from denoiser.app.attention_tab import AttentionTab
from denoiser.app.cache_sweep import sweep_safe, whole_files
from denoiser.app.controls import STATUS_CSS
from denoiser.app.engine import Engine
from denoiser.app.heads_tab import HeadsTab
from denoiser.app.page import Page
from denoiser.app.photo_tab import EXAMPLES, PhotoTab
from denoiser.app.sample_tab import SampleTab

__all__ = ["build_app", "build_page", "LAUNCH", "TABS"]

TABS = (SampleTab, PhotoTab, AttentionTab, HeadsTab)  # the page's tabs, in their order

# a model's images are 16-64 pixels: enlarged in the galleries, each pixel stays a sharp square
# every failure reaches the page as a toast that stays (streaming.user_error) and the status lines say in words what
# happened (a refusal, a stop); Gradio's red "Error" pill, drawn over each output of a failed event, would repeat it
# over pictures and text that are still true (the ones from before), so it is not drawn
# a drop zone as tall as its "Drop File Here - or - Click to Upload" under its label (Gradio fixes the height given:
# the settings box's 90 px cut the last line)
DROP_ZONES = (":is(#settings-png, #photo) .upload-container { height: auto !important; min-height: 90px; }\n"
              ":is(#settings-png, #photo) [data-testid=block-label] { position: static; }\n"  # above, not over
              ":is(#settings-png, #photo) [data-testid=upload-text] { min-height: 0; }\n"  # Gradio's is 240 px
              "#settings-png [data-testid=upload-icon] { display: none; }\n")  # a small box: its words alone
# on a phone (issue 72 finding 2) the Sample tab's two columns stack, dissolved into the row so that their pieces take
# this order: Generate and its status; the prompt (or class) and its examples; the live preview and the results with
# their buttons and word edit; then the model and the other settings; then the settings box and the earlier results
PHONE_ORDER = ("  #sample-main, #sample-settings { display: contents; }\n"
               "  #sample-main > *, #sample-settings > * { flex: 1 1 100%; min-width: 0; }\n"
               "  #sample-settings > * { order: 2; }\n"
               "  #sample-settings > :has(#prompt), #sample-settings > #prompt-examples, #sample-settings > #class-box"
               " { order: 0; }\n"
               "  #preview, #gallery, #download-all, #use-settings, #word-edit { order: 1; }\n"
               "  #settings-png, #earlier, #use-earlier { order: 3; }\n")
# on a phone a gallery's columns fit the width (Gradio's 100 px minimum put 4 columns in 326 px: the 4th off-screen),
# and a picture's label sits above it, not over its first row
PHONE_GALLERIES = ("  :is(#gallery, #earlier, #photo-result) .grid-container { grid-template-columns: repeat(auto-fill,"
                   " minmax(72px, 1fr)) !important; grid-template-rows: none !important; grid-auto-rows: auto; }\n"
                   "  :is(#gallery, #earlier, #photo-result, #preview, #photo-preview) [data-testid=block-label]"
                   " { position: static; }\n")
# on a phone a chart keeps its own size, its box scrolls sideways: shrunk to the width, its names were ~4 px tall and
# the fullscreen and download icons covered its header (they sit in the blank band above it at its own size)
CHARTS = ":is(#word-maps, #word-weights, #maps, #stages)"
PHONE_CHARTS = (f"  {CHARTS} [data-testid=block-label] {{ position: static; }}\n"
                f"  {CHARTS} .image-container {{ display: block; overflow-x: auto; }}\n"
                f"  {CHARTS} :is(.image-container > button, .image-frame) {{ display: block; width: max-content;"
                " max-width: none; margin: 0; }\n"
                f"  {CHARTS} img {{ max-width: none !important; width: auto !important; height: auto !important; }}\n")
# the "try these" table keeps its model, steps, class, guidance and prompt columns, so that it fits the width (a click
# still sets everything, and the form shows it); its columns as wide as their headers' longest word, so that a header
# breaks between words, never inside one ("guidan/ce": equal columns were narrower than "guidance")
PHONE_TABLE = ("  #try-these :is(th, td):is(:nth-child(2), :nth-child(4), :nth-child(5), :nth-child(8), :nth-child(9))"
               " { display: none; } #try-these table { width: 100%; table-layout: auto; }\n"
               "  #try-these :is(th, td) { padding: 2px; font-size: 13px; white-space: normal; overflow-wrap: anywhere; }\n"
               "  #try-these th { overflow-wrap: normal !important; word-break: keep-all; }\n")
CSS = ("#gallery img, #earlier img, #photo-result img, #preview img, #photo-preview img { image-rendering: pixelated; }\n"
       "[data-testid=status-tracker] .error { display: none; }\n" + DROP_ZONES
       + "@media (max-width: 700px) {\n" + PHONE_ORDER + PHONE_GALLERIES + PHONE_CHARTS + PHONE_TABLE + "}")
# launch() settings every server of this app uses: uploads (a photo on the Photo tab) of at most 25 MB, what a
# phone or camera writes; image_io then refuses more than 50 megapixels before decoding
# show_error: Gradio's own input validation (e.g. a raw API call with steps: null) reaches the client as its
# message instead of "the upstream app has raised an exception"; our handlers' errors are already short
# and escaped (streaming.user_error), so no traceback or server path is shown either way
# state_session_capacity: the sessions whose generations stay in memory (oldest dropped first; app.py's
# --max-sessions); with the work budget, one generation holds at most ~200 MB of step inputs (the 16x16 model: 64 images x 1000 steps)
LAUNCH = {"max_file_size": "25mb", "show_error": True, "state_session_capacity": 32, "css": CSS + STATUS_CSS}


INTRO = ("# denoiser — attention U-Net diffusion\nGenerate on the **Sample** tab, or denoise, edit and inpaint your own "
         "photo on the **Photo** tab; then click any pixel on the **Attention** tab to see where each attention layer "
         "of the U-Net looks; the **Heads** tab measures what each layer and head does and switches them off.")


def build_page(engine: Engine) -> Page:
    """The page of `engine`'s models: every tab of TABS built (in order), then wired (a tab's events may name another
    tab's components: AttentionTab.show sets the generation's views from every tab that samples). page.app: its Blocks."""
    page = Page(engine)
    # the example pictures are served from the package, never copied into the cache the sweep below empties
    gr.set_static_paths([EXAMPLES])
    with gr.Blocks(title="denoiser", delete_cache=(300, 900), analytics_enabled=False) as app:
        page.states()
        gr.Markdown(INTRO)
        page.tabs = [kind(page) for kind in TABS]
        for tab in page.tabs:
            tab.build()
        for tab in page.tabs:
            tab.wire(app)
    page.app = app
    return page


def build_app(engine: Engine) -> gr.Blocks:
    """The web app of `engine`'s models (denoiser.app.serve launches it with LAUNCH)."""
    app = build_page(engine).app
    whole_files()  # a picture returned again is not rewritten under a response still serving it
    return sweep_safe(app)  # the delete_cache sweep above survives files added while it runs
