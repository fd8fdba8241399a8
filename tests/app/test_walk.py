"""Issue 41 item 2: a seeded random click-walk over the app's four tabs (tests/app/walk.py), checking after every
action that the page tells the truth. `make test` walks one fixed seed briefly; a longer walk:

    DENOISER_WALK_SEED=1,2,3 DENOISER_WALK_STEPS=200 DENOISER_WALK_SECONDS=900 \\
        nice -n 10 .venv/bin/python -m pytest -x -q tests/app/test_walk.py

A failure prints its seed and numbered steps; the same DENOISER_WALK_SEED and DENOISER_WALK_STEPS replay them.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from denoiser.folders.model_dir import WEIGHTS_DIR
from tests.app.browser import CHROMIUM, browser_page, screenshots

SEEDS = [int(s) for s in os.environ.get("DENOISER_WALK_SEED", "41").split(",") if s.strip()]
MAX_STEPS = int(os.environ.get("DENOISER_WALK_STEPS", "40"))  # actions per seed
MAX_SECONDS = float(os.environ.get("DENOISER_WALK_SECONDS", "40"))  # per seed: `make test` stays short
# a long walk's report: after a failure, note it, reload the page and walk on (the test fails at the end, naming each)
KEEP_GOING = os.environ.get("DENOISER_WALK_KEEP_GOING", "") not in ("", "0")
# shipped model folders (weights/) the page offers besides the tiny ones: cifar10 is then the page's default model
WIDTH = int(os.environ.get("DENOISER_WALK_WIDTH", "1280"))  # the page's width: 390 walks a phone's layout
SHIPPED = [m.strip() for m in os.environ.get("DENOISER_WALK_MODELS", "").split(",") if m.strip()]


@pytest.fixture(scope="module")
def weights(weights):
    """The page's models (tests/app/browser.py) and a tiny text model, "words": the walk types prompts (weighted ones,
    malformed ones), changes a result's words and opens their maps."""
    import json

    import torch
    from diffusers import DDPMScheduler

    from denoiser import UNet
    from denoiser.model.text import HashTextEncoder
    from denoiser.sampling.pipeline import save_pipeline
    from tests.conftest import TINY
    from tests.model.test_text import TEXT, D, _tokenizer, _wake_cross

    torch.manual_seed(0)
    unet = _wake_cross(UNet(**TINY, cross_attention_dim=D).eval())
    save_pipeline(unet, DDPMScheduler(), weights / "words", text_encoder=HashTextEncoder(**TEXT).eval(),
                  tokenizer=_tokenizer())
    (weights / "words" / "sampling.json").write_text(json.dumps({"guidance_scale": 2.5}))
    for name in SHIPPED:  # `make walk WALK_MODELS=cifar10,emoji`: the shipped models on the page too
        shutil.copytree(WEIGHTS_DIR / name, weights / name)
    return weights


class _Errors(logging.Handler):
    """Error records of any logger (uvicorn's file serving, the app's own failures), with their tracebacks."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"ERROR {record.name}: {logging.Formatter().format(record)}")


def _models(weights: Path) -> dict[str, list[str] | None]:
    """Each model the page offers and its class names (None: a folder that does not load)."""
    from denoiser.app.engine import Engine

    engine, out = Engine(weights), {}
    for name in engine.models():
        try:
            out[name] = engine.classes(name)
        except (ValueError, OSError):
            out[name] = None
    return out


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
@pytest.mark.parametrize("seed", SEEDS)
def test_browser_random_walk_keeps_the_page_true(server, demo, weights, tmp_path, capfd, seed):
    from tests.app.walk import Walk, WalkFailure

    errors = _Errors()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn.error"), logging.getLogger("uvicorn")]
    for logger in loggers:
        logger.addHandler(errors)

    def server_log() -> str:
        text = capfd.readouterr().err + "\n".join(errors.lines)
        errors.lines.clear()
        return text

    def idle() -> bool:
        return len(demo._queue) == 0 and demo._queue.get_active_worker_count() == 0

    try:
        with browser_page(server, width=WIDTH, height=844 if WIDTH < 600 else 900) as page:
            walk = Walk(page, idle, server_log, _models(weights), screenshots(tmp_path), seed)
            try:
                done, failed = walk.run(MAX_STEPS, MAX_SECONDS, KEEP_GOING), None
            except WalkFailure as failure:
                done, failed = len(walk.steps), str(failure)
    finally:
        for logger in loggers:
            logger.removeHandler(errors)
    if failed:
        pytest.fail(failed, pytrace=False)  # the seed and the steps, without the walk's locals
    print(f"click-walk seed {seed}: {done} actions, every invariant held:\n" + "\n".join(walk.steps))
    # a long walk (`make walk`) must walk all its actions: one cut short by its time limit says so, not "clean"
    least = MAX_STEPS if KEEP_GOING else min(MAX_STEPS, 5)
    assert done >= least, f"the walk took only {done} of {MAX_STEPS} actions in {MAX_SECONDS:g} s: raise WALK_SECONDS"


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="make test installs Debian's chromium")
def test_browser_the_walk_sees_a_page_that_is_not_true(server, demo, weights, tmp_path):
    """The walk's checks can fail: after a true state passes, a class the result was not made with and a status line
    that does not describe the gallery (written into the page behind the app's back) are each caught."""
    from tests.app.walk import Walk, WalkFailure

    with browser_page(server) as page:
        walk = Walk(page, lambda: len(demo._queue) == 0 and demo._queue.get_active_worker_count() == 0, lambda: "",
                    _models(weights), tmp_path, seed=0)
        walk.fill("steps", 2)
        walk.fill("num-images", 3)
        walk.generate()
        assert walk.settle()
        walk.check()  # the page as the app left it
        made = page.locator("#class input").input_value()
        other = next(c for c in walk.models[page.locator("#model input, [aria-label=model]").first.input_value()]
                     if c != made)
        page.locator("#class input").evaluate("(box, other) => { box.value = other; }", other)
        with pytest.raises(WalkFailure, match=f"the form shows class = '{other}', the result it describes was made "
                                              f"with '{made}'"):
            walk.check()
        page.locator("#class input").evaluate("(box, made) => { box.value = made; }", made)
        page.locator("#status .md").evaluate("line => { line.textContent = 'done: 5 image(s), 2 steps'; }")
        with pytest.raises(WalkFailure, match="the status says 'done: 5 image.s., 2 steps', the gallery shows 3 image"):
            walk.check()
