"""Pieces every tab of the page is built with: a job's Run and Stop buttons with its status line, and a tab's
components kept by name for the wiring (denoiser/app/layout.py, denoiser/app/edit.py)."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

__all__ = ["SESSION_TTL_S", "keep", "run_controls"]

SESSION_TTL_S = 1800  # a session's state (its generation, its upload) is dropped this long after its last update


def keep(c: SimpleNamespace, scope: dict) -> None:
    """A tab's components onto `c` under their variable names, for the wiring."""
    for name, value in scope.items():
        if isinstance(value, gr.blocks.Block):
            setattr(c, name, value)


def run_controls(label: str, run_id: str, stop_id: str, status_id: str):
    """A job's Run and Stop buttons side by side, and the line under them that says how far the job is."""
    with gr.Row():
        run = gr.Button(label, variant="primary", elem_id=run_id, scale=3)
        stop = gr.Button("Stop", variant="stop", elem_id=stop_id, scale=1)
    return run, stop, gr.Markdown(elem_id=status_id)
