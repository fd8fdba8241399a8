"""Pieces every tab of the page is built with: a job's Run and Stop buttons with its status line and their wiring
(job_controls, queued, stop_controls; STATUS_CSS), the form's sliders and number boxes (their values checked by the
handlers, denoiser.app.form_limits), one listener for many controls, and a gallery's selection."""

from __future__ import annotations

import gradio as gr

from denoiser.app.form_limits import LIMITS
from denoiser.app.jobs import TICK_S

__all__ = ["CLEAR_TOASTS", "JOB", "SESSION_TTL_S", "STATUS_CSS", "form_slider", "job_controls",
           "on_any_change", "queue_timer", "queued", "run_controls", "scroll_to_js", "selected_index", "stop_controls", "whole_box"]

SESSION_TTL_S = 1800  # a session's state (its generation, its upload) is dropped this long after its last update

# a long job's event settings (gradio 6.31). trigger_mode "always_last": a click while the job's event is still open
# (the job pressed again right after Stop: it ends a UNet step later) is sent once it has ended; "once", Gradio's
# default, dropped it (issue 51 item 1). show_progress "hidden": the status line is the job's own, from its click
# (queue_line) to its last line; Gradio's tracker over it showed its own ETA, "queue: 1/1 | 6.2/4.8s" for a wait of
# ~80 s, clipped on an empty line or drawn over the line's text (issue 72 item 1)
JOB = dict(concurrency_limit=1, concurrency_id="sampling", trigger_mode="always_last", show_progress="hidden")

# a new job's click closes the messages of earlier ones (they stay until closed: streaming.user_error), so that none
# is left about a request that is over ("generate images first" after a generation exists)
CLEAR_TOASTS = "document.querySelectorAll('[data-testid=toast-close]').forEach(b => b.click());"

# every job's status line (run_controls) keeps one line's height when it is empty: the page does not jump when a job
# writes it, and nothing is clipped on it
STATUS_CSS = ".job-status { min-height: 1.6em; }\n"


def scroll_to_js(elem_id: str) -> str:
    """A function for the page that brings #elem_id to the top of the window (a job started from a row or panel far
    below it: its status line and live preview come into view)."""
    return (f"() => {{ document.querySelector('#{elem_id}').scrollIntoView({{block: 'start', behavior: 'instant'}}); "
            "window.scrollBy(0, -24); }")


def queued(run: gr.Button | gr.events.Dependency, status: gr.Markdown, jobs) -> gr.events.Dependency:
    """`run`'s first listener (the page runs a click's listeners in order, each to its end; or what follows the
    event `run`): the earlier messages closed, the click noted at once, unqueued, and the status line says the
    job's place in the queue and its wait (jobs.requester: `jobs` is denoiser.app.jobs.Jobs), then again every
    TICK_S seconds while the job waits (`queue_timer`). Returns the event."""
    if isinstance(run, gr.Button):
        noted = run.click(jobs.requester(status.elem_id), None, status, js=f"() => {{ {CLEAR_TOASTS} }}",
                          api_name=False, queue=False, show_progress="hidden")
    else:
        noted = run.then(jobs.requester(status.elem_id), None, status, api_name=False, queue=False,
                         show_progress="hidden")
    noted.then(lambda: gr.Timer(active=True), None, queue_timer(status, jobs), api_name=False, queue=False,
               show_progress="hidden")
    return noted


def queue_timer(status: gr.Markdown, jobs) -> gr.Timer:
    """The status line's timer: while the session's job of the line waits in the queue, its line is said again each
    tick (jobs.ticker), and the timer stops itself once the job starts. One per status line, made on first use."""
    timer = getattr(status, "queue_timer", None)
    if timer is None:
        timer = status.queue_timer = gr.Timer(TICK_S, active=False)
        timer.tick(jobs.ticker(status.elem_id), None, [status, timer], api_name=False, queue=False,
                   show_progress="hidden")
    return timer


def job_controls(run: gr.Button, stop: gr.Button, status: gr.Markdown, jobs, fn, inputs: list, outputs: list, **kwargs):
    """A long job on `run` (one at a time on the server: the "sampling" slot; JOB), its queue place and progress on
    `status`, stopped by `stop`. Returns the job's event."""
    queued(run, status, jobs)
    job = run.click(fn, inputs, outputs, **JOB, **kwargs)
    stop_controls(stop, status, jobs)
    return job


def stop_controls(stop: gr.Button, status: gr.Markdown, jobs) -> None:
    """`stop` halts the session's job on `status` on the server, unqueued, at the click (jobs.stopper): a running job
    then writes where it stopped; a waiting one is said to be cancelled at once."""
    stop.click(jobs.stopper(status.elem_id), None, status, api_name=False, queue=False, show_progress="hidden")


def on_any_change(controls: list, fn, inputs: list, outputs, *, load: gr.Blocks | None = None, **kwargs):
    """One listener that runs `fn` when any of `controls` changes (and on `load`'s page load): what it shows is of
    the form's latest values. A listener per control could show an older form's answer: the page posts each
    listener's request on its own, and under load a later request can overtake an earlier one, so the older answer
    lands last (the budget note said 64 images x 50 steps with 1000 typed into steps). One listener in "always_last"
    mode (gradio 6.31) keeps one request in flight and sends one more, with the form as it is then, when it ends."""
    triggers = ([load.load] if load is not None else []) + [control.change for control in controls]
    return gr.on(triggers, fn, inputs, outputs, trigger_mode="always_last", api_name=False, **kwargs)


def selected_index(evt: gr.SelectData) -> int:
    """A gallery's select listener: the index of the result clicked (a gr.State keeps it for "use these settings")."""
    return int(evt.index)


def run_controls(label: str, run_id: str, stop_id: str, status_id: str):
    """A job's Run and Stop buttons side by side, and the line under them that says how far the job is."""
    with gr.Row():
        run = gr.Button(label, variant="primary", elem_id=run_id, scale=3)
        stop = gr.Button("Stop", variant="stop", elem_id=stop_id, scale=1)
    return run, stop, gr.Markdown(label="status", show_label=False, elem_id=status_id, elem_classes=["job-status"])


# marks a form_slider: Gradio copies a component per session when a handler updates its props (its class called with
# its constructor's arguments, gradio 6.31 blocks.py), so the mark is an argument (a CSS class) and the check a method
UNCHECKED = "form-value"
_CHECKED_PREPROCESS = gr.Slider.preprocess


def _preprocess(self: gr.Slider, payload):
    """Slider.preprocess, but a form_slider's value as the person typed it (form_slider)."""
    classes = [self.elem_classes] if isinstance(self.elem_classes, str) else (self.elem_classes or [])
    return payload if UNCHECKED in classes else _CHECKED_PREPROCESS(self, payload)


def form_slider(minimum: float, maximum: float, **kwargs) -> gr.Slider:
    """A slider whose value reaches its handler as the person typed it, in range or not. Gradio's Slider.preprocess
    (gradio 6.31) refuses a typed value outside minimum..maximum with gradio.exceptions.Error before any handler runs
    (a slider's change runs the budget note): a traceback in the server's log and a toast for what the page then
    moves into range itself (issue 51 item 2), and a stale value (the Attention tab's step 199 of the generation before,
    arriving after a 2-step one set the slider's maximum to 1) the same. The handlers check every value
    (denoiser.app.form_limits, through the engine) and say why nothing started. Not a subclass: Gradio writes a .pyi file
    next to the module of every component class; so Slider.preprocess skips the check for sliders marked UNCHECKED,
    a mark that survives Gradio's per-session copies (an attribute set on the instance did not). tests/app/test_form_limits.py
    fails the day Gradio stops refusing, when this can go."""
    gr.Slider.preprocess = _preprocess  # once is enough; the same function each time
    classes = kwargs.pop("elem_classes", None) or []
    classes = [classes] if isinstance(classes, str) else list(classes)
    return gr.Slider(minimum, maximum, elem_classes=[*classes, UNCHECKED], **kwargs)


def whole_box(name: str, value: int, label: str, elem_id: str, info: str = "") -> gr.Number:
    """A box for a whole number of LIMITS[name] (steps, images, a seed), its range said in its note and checked by the
    handlers. Not a slider: Gradio's slider moves a typed -5 to its minimum when the box loses focus, so Generate
    would run at 1 what the person never asked for; no minimum or maximum either: Gradio's would refuse an
    out-of-range value with a traceback before the handler can say so (form_slider)."""
    lo, hi = LIMITS[name]
    note = f"{lo}..{hi:,}" if name != "seed" else f"any whole number {lo}..{hi:,}"
    # precision None: the handler gets what was typed (2.5 stays 2.5 and is refused in words); Gradio's precision=0
    # rounded it before any check, so steps 2.5 ran 2 while the box still showed 2.5
    return gr.Number(value=value, precision=None, label=label, elem_id=elem_id, info=f"{note}{'; ' if info else ''}{info}")
