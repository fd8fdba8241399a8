"""The page (denoiser/app/layout.py) walked tab by tab (issue 59 finding 5): its tabs are layout.TABS in order, each
tab's events call its own module's handlers (or the pieces every tab shares), and a new tab is its module and one line
in TABS."""

from __future__ import annotations

import inspect

import pytest

gr = pytest.importorskip("gradio")

from denoiser.app import layout  # noqa: E402
from denoiser.app.page import Page  # noqa: E402
from denoiser.app.sample_tab import SampleTab  # noqa: E402
from tests.conftest import app_page  # noqa: E402

# what every tab may call besides its own module: the page's shared parts (denoiser/app/page.py), the model form, the
# jobs' Stop lines, the controls, a run's result files; and Gradio's own (its Examples fill their inputs)
SHARED = ("denoiser.app.page", "denoiser.app.form", "denoiser.app.jobs", "denoiser.app.controls",
          "denoiser.app.result_files", "gradio.")
PANELS = {SampleTab: ("denoiser.app.word_edit",)}  # a tab's panels in modules of their own


def _tab_of(block) -> gr.Tab | None:
    """The tab a component sits in (None: the page itself, e.g. its load event)."""
    while block is not None and not isinstance(block, gr.Tab):
        block = block.parent
    return block


def _triggers(page: Page, event) -> set:
    """The tabs whose components trigger `event`; an event chained after another (.then, .success) is the first one's."""
    while event.trigger_after is not None:
        event = page.app.fns[event.trigger_after]
    return {_tab_of(page.app.blocks.get(block_id)) for block_id, _ in event.targets}


def _tab_blocks(page: Page) -> list[gr.Tab]:
    return [b for b in page.app.blocks.values() if isinstance(b, gr.Tab)]


def test_the_page_is_its_tabs_in_order(weights):
    page = app_page(weights)
    assert [type(tab) for tab in page.tabs] == list(layout.TABS)
    assert [t.label for t in _tab_blocks(page)] == ["Sample", "Photo", "Attention", "Heads"]


def test_each_tabs_events_call_its_own_handlers(weights):
    """Walk every tab: each event a component of the tab triggers calls a handler of the tab's own module (its
    panels' included) or a shared piece, never another tab's. A tab reaches another only through what it shares (the
    generation it sets with AttentionTab.show, the Attention tab's image slider the Heads tab reads)."""
    page = app_page(weights)
    modules = {tab: {type(tab).__module__, *PANELS.get(type(tab), ())} for tab in page.tabs}
    by_block = dict(zip(_tab_blocks(page), page.tabs))
    walked = {tab: 0 for tab in page.tabs}
    for event in page.app.fns.values():
        if event.fn is None:  # the page's own scripts (scroll_to_js, CLEAR_TOASTS)
            continue
        for trigger in _triggers(page, event) - {None}:
            tab = by_block[trigger]
            module = inspect.unwrap(event.fn).__module__
            assert module in modules[tab] or module.startswith(SHARED), (
                f"the {trigger.label} tab's {event.name} event calls {module}.{event.fn.__qualname__}")
            walked[tab] += 1
    assert all(walked.values()), walked  # every tab has events of its own


def test_a_new_tab_is_its_module_and_one_line_in_tabs(weights, monkeypatch):
    """A tab written as the four are (a class built with the page: build, then wire) joins the page by one line in
    TABS, and its events are wired with nothing else changed."""

    class Echo:
        def __init__(self, page: Page) -> None:
            self.page = page

        def build(self) -> None:
            with gr.Tab("Echo"):
                self.text = gr.Textbox(elem_id="echo-text")
                self.button = gr.Button("echo", elem_id="echo-run")
                self.out = gr.Markdown(elem_id="echo-out")

        def wire(self, app: gr.Blocks) -> None:
            self.button.click(self.echo, self.text, self.out, api_name="echo")

        def echo(self, text: str) -> dict:
            return {self.out: f"echo: {text}"}

    monkeypatch.setattr(layout, "TABS", (*layout.TABS, Echo))
    page = app_page(weights)
    echo = page.tab(Echo)
    assert [t.label for t in _tab_blocks(page)][-1] == "Echo" and page.tabs[-1] is echo
    (event,) = [e for e in page.app.fns.values() if e.api_name == "echo"]
    assert event.fn == echo.echo and [b._id for b in event.outputs] == [echo.out._id]
    assert echo.echo("hi") == {echo.out: "echo: hi"}
    with pytest.raises(LookupError, match="add it to denoiser/app/layout.py's TABS"):
        Page(page.engine).tab(Echo)  # a page without it says where tabs are listed


def test_every_button_is_drawn_in_the_pages_fonts(weights):
    """Issue 72 finding 8: the randomise button's dice (U+1F3B2) showed as a box: a browser without a colour-emoji font
    (Debian's chromium) draws no glyph for it. Every button says what it does in text the page's fonts draw."""
    page = app_page(weights)
    labels = [str(b.value) for b in page.app.blocks.values() if isinstance(b, gr.Button) and b.value]
    emoji = [label for label in labels if any(ord(c) >= 0x1F000 for c in label)]
    assert labels and not emoji, emoji
