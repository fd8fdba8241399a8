"""What every tab of one page shares: the engine, the job bookkeeping (Stop's status lines), the model form, and the
session's state that passes between tabs (the generation the Attention and Heads tabs show, the pixel clicked on it).
A tab is a class built with the page (`tab = Kind(page)`), that lays out its components (`tab.build()`) and then binds
its events (`tab.wire(app)`), once every tab is built; the tabs and their order are denoiser/app/layout.py's TABS.
"""

from __future__ import annotations

from typing import TypeVar

import gradio as gr

from denoiser.app.controls import SESSION_TTL_S
from denoiser.app.engine import Engine
from denoiser.app.form import ModelForm
from denoiser.app.jobs import Jobs
from denoiser.request import BUILT_IN

__all__ = ["Page"]

T = TypeVar("T")


class Page:
    """The shared parts of one page (all its sessions'), and its tabs once built."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.jobs = Jobs()  # which job of which session runs on which status line (Stop's line)
        self.form = ModelForm(engine)  # what a model's form shows
        self.tabs: list = []
        self.app: gr.Blocks | None = None  # the page itself, once built (layout.build_page)
        self.generation: gr.State | None = None  # made inside the page's Blocks (states)
        self.pixel: gr.State | None = None

    @property
    def models(self) -> list[str]:
        """The model folders the page offers (every tab's model list)."""
        return self.engine.models()

    @property
    def default_model(self) -> str | None:
        """The model every tab starts at: BUILT_IN's (`denoiser sample`'s without --model) where it is served, else the
        small synthetic-shapes (a test server's), else the first."""
        models = self.models
        preferred = [m for m in (BUILT_IN["model"], "synthetic-shapes") if m in models]
        return preferred[0] if preferred else (models[0] if models else None)

    def states(self) -> None:
        """The session's state the tabs share, made inside the page's Blocks: its latest generation (every tab that
        samples sets it, the Attention and Heads tabs show it) and the pixel clicked on it."""
        self.generation = gr.State(None, time_to_live=SESSION_TTL_S)
        self.pixel = gr.State(None, time_to_live=SESSION_TTL_S)

    def tab(self, kind: type[T]) -> T:
        """The page's tab of this kind."""
        for tab in self.tabs:
            if isinstance(tab, kind):
                return tab
        raise LookupError(f"the page has no {kind.__name__}: add it to denoiser/app/layout.py's TABS")
