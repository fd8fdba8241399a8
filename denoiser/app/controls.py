"""Pieces every tab of the page is built with: a job's Run and Stop buttons with its status line and their wiring
(job_controls, stop_controls; the page's script that a Generate pressed right after Stop needs), the form's sliders and
number boxes (their values checked by the handlers, denoiser.app.form_limits), one listener for many controls, and a
gallery's selection."""

from __future__ import annotations

import gradio as gr

from denoiser.app.form_limits import LIMITS

__all__ = ["CANCELS_JS", "CLEAR_TOASTS", "SESSION_TTL_S", "STOPPED_JS", "STOP_DONE_JS", "form_slider", "job_controls",
           "on_any_change", "ran_js", "retry_js", "run_controls", "scroll_to_js", "selected_index", "stop_controls",
           "whole_box"]

SESSION_TTL_S = 1800  # a session's state (its generation, its upload) is dropped this long after its last update

# Stop, then Generate at once (issue 51 item 1): Gradio's page (6.31) skips a click on a button whose job it still counts
# as running (trigger_mode "once"), and it counts a stopped job as running until its /cancel returns, once the server
# has stopped it a UNet step later ("always_last" defers such a click, but drops it when the cancelled job ends in an
# error, and a click that goes out before the cancel has finished loses its Stop: the cancel forgets the new job). So a
# click pressed within RETRY_S of a Stop waits for Stop's line (written once the stopped job has ended: handlers'
# stopped, then STOP_DONE_JS) and is pressed again every 200 ms until its job has gone out (ran_js marks that): a
# skipped press does nothing, and the first that is not runs the job once
RETRY_S = 30
STOPPED_JS = "() => { window.denoiserStoppedAt = Date.now(); }"
STOP_DONE_JS = "() => { window.denoiserStopDone = Date.now(); }"

# A job sent while Stop's cancel is still in flight is lost to the next Stop (stop 62's CI): the page's cancel posts
# /cancel, then /reset, and once /reset answers it forgets the job of that button, whichever it is by then; the
# stopped job's own end, a moment before, already lets a click through. So the page counts its /cancel and /reset
# requests in flight (CANCELS_JS, run at page load: LAUNCH's js), and a job's click (ran_js) goes out only once none
# is left, after the page has forgotten the old job (CANCEL_WAIT_S at most)
CANCEL_WAIT_S = 10
# a Stop pressed this recently may not have posted its /cancel yet (a busy page runs its listeners late): a click waits
# that long after it too, so that a second Stop in the meantime drops it (a fresh clone's make test ran such a click)
STOP_POST_MS = 500
CANCELS_JS = r"""() => { if (window.denoiserCancels !== undefined) return; window.denoiserCancels = 0;
    const send = window.fetch;
    window.fetch = (url, ...rest) => {
        if (!/\/(cancel|reset)$/.test(String(url))) return send(url, ...rest);
        window.denoiserCancels += 1;
        return send(url, ...rest).finally(() => setTimeout(() => { window.denoiserCancels -= 1; }, 0)); }; }"""


# a new job's click closes the messages of earlier ones (they stay until closed: streaming.user_error), so that none
# is left about a request that is over ("generate images first" after a generation exists)
CLEAR_TOASTS = "document.querySelectorAll('[data-testid=toast-close]').forEach(b => b.click());"


def scroll_to_js(elem_id: str) -> str:
    """A function for the page that brings #elem_id to the top of the window (a job started from a row or panel far
    below it: its status line and live preview come into view)."""
    return (f"() => {{ document.querySelector('#{elem_id}').scrollIntoView({{block: 'start', behavior: 'instant'}}); "
            "window.scrollBy(0, -24); }")


def retry_js(button: str) -> str:
    """A click on #button: the earlier messages closed (CLEAR_TOASTS); within RETRY_S of a Stop that is not done yet,
    pressed again once it is, until ran_js(button) says its job went out, or until another Stop (the person stopped
    it). A click after Stop is done goes out as it is: pressing again then sent a second job under load (the job's
    own listener comes after the request note's answer, later than the first look), which ran after the next Stop."""
    return ("() => { " + CLEAR_TOASTS + " const at = Date.now(), stopped = window.denoiserStoppedAt || 0; "
            f"if (at - stopped > {RETRY_S * 1000} || (window.denoiserStopDone || 0) > stopped || window.denoiserRetry) "
            "return; "
            "let tries = 0; window.denoiserRetry = setInterval(() => { "
            f"if ((window.denoiserRan || {{}})['{button}'] >= at || (window.denoiserStoppedAt || 0) > stopped "
            f"|| ++tries > {RETRY_S * 5}) {{ "
            "clearInterval(window.denoiserRetry); window.denoiserRetry = null; return; } "
            f"if ((window.denoiserStopDone || 0) > stopped) document.querySelector('#{button}').click(); }}, 200); }}")


def ran_js(button: str) -> str:
    """The job of #button has been dispatched (its inputs pass unchanged): it goes out once no cancel is in flight
    (CANCELS_JS) and no Stop was pressed in the last STOP_POST_MS, unless a Stop was pressed while it waited: then it
    is dropped, as a job still in the queue is (a throw in an event's script ends the event before its request is sent)."""
    return (f"async (...args) => {{ (window.denoiserRan = window.denoiserRan || {{}})['{button}'] = Date.now(); "
            "const at = Date.now(); "
            f"while (((window.denoiserCancels || 0) > 0 || Date.now() - (window.denoiserStoppedAt || 0) < {STOP_POST_MS}) "
            f"&& Date.now() - at < {CANCEL_WAIT_S * 1000}) "
            "await new Promise(ok => setTimeout(ok, 50)); "
            "if ((window.denoiserStoppedAt || 0) > at) throw new Error('stopped before it was sent'); "
            "return args; }")


def job_controls(run: gr.Button, stop: gr.Button, status: gr.Markdown, jobs, fn, inputs: list, outputs: list, **kwargs):
    """A long job on `run` (one at a time on the server: the "sampling" slot), its progress on `status`, stopped by
    `stop`: pressed right after a Stop, `run` is pressed again until its job goes out (retry_js, before the job's own
    listener: Gradio runs a click's listeners in order); its request is noted at once, unqueued, so a Stop while it
    still waits says it never started (`jobs`: denoiser.app.jobs.Jobs). Returns the job's event."""
    run.click(None, js=retry_js(run.elem_id), api_name=False, queue=False)
    run.click(jobs.requester(status.elem_id), None, None, api_name=False, queue=False)
    job = run.click(fn, inputs, outputs, js=ran_js(run.elem_id), concurrency_limit=1, concurrency_id="sampling",
                    show_progress_on=[status], **kwargs)
    stop_controls(stop, status, [job], jobs)
    return job


def stop_controls(stop: gr.Button, status: gr.Markdown, events: list, jobs) -> None:
    """`stop` cancels `events`, and stops the session's job on `status` on the server at once (jobs.halter: Gradio's
    cancel alone can miss it); then its status line says where the job stopped (jobs.stopper, once the stopped job
    has ended), and the page may press a waiting Run (STOP_DONE_JS, retry_js)."""
    stop.click(jobs.halter(status.elem_id), None, None, js=STOPPED_JS, api_name=False, queue=False)  # its listener first
    stop.click(None, None, None, cancels=events, api_name=False).then(
        jobs.stopper(status.elem_id), status, status, api_name=False, show_progress="hidden").then(None, js=STOP_DONE_JS)


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
    return run, stop, gr.Markdown(label="status", show_label=False, elem_id=status_id)


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
    a mark that survives Gradio's per-session copies (an attribute set on the instance did not). tests/test_app_form_limits.py
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
