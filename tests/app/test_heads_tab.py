"""The Heads tab (denoiser/app/heads_tab.py): its statistics and its switch are jobs like Generate, with their own
status lines and Stop; before any generation they hint, as the other views do."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio")

from denoiser.app.heads_tab import HeadsTab  # noqa: E402
from denoiser.app.jobs import Jobs  # noqa: E402
from denoiser.request import SampleRequest  # noqa: E402
from tests.conftest import app_page  # noqa: E402


def _run(gen_fn):
    """Every update a generator handler yields, until it ends."""
    return list(gen_fn)


def test_the_heads_statistics_are_a_job_that_stops(weights):
    from denoiser.app.streaming import stream

    page = app_page(weights)
    tab, engine = page.tab(HeadsTab), page.engine
    gen = engine.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=2, seed=0, num_images=1))
    updates = _run(tab.head_stats(gen, 0, progress=lambda *a, **k: None))
    assert any(str(u.get(tab.stats_status)).startswith("measuring: step") for u in updates)
    rows, layers, line = (updates[-1][c] for c in (tab.stats_table, tab.off_layers, tab.stats_status))
    assert line.startswith("done:") and rows and layers["choices"] and layers["value"] == []
    # the walk, seed 1 step 140: a layer picked from another model's statistics stayed picked when this model's were
    # listed, and Switch off then failed in Gradio's own words ("Value: 'up.1.attn.0' ... not in the list of
    # choices"); now the new list keeps only this model's layers
    mine = layers["choices"][0]
    relisted = _run(tab.head_stats(gen, 0, ["up.1.attn.0", mine], progress=lambda *a, **k: None))[-1][tab.off_layers]
    assert relisted["value"] == [mine] and "up.1.attn.0" not in relisted["choices"]
    # Stop: the page closes the handler at a yield; the worker stops at its next UNet call and is joined
    import time

    full: list = []
    engine.views.head_table(gen, 0, on_step=lambda *a: full.append(1))

    def slow(on_step):  # each UNet call takes 50 ms longer, so the close comes mid-way
        return engine.views.head_table(gen, 0, on_step=lambda *a: (calls.append(1), time.sleep(0.05), on_step(*a)))

    calls: list = []
    job = stream(slow, lambda *a, **k: None, "measuring")
    next(job)
    job.close()
    stopped = len(calls)
    time.sleep(0.3)
    assert 0 < stopped < len(full) and len(calls) == stopped  # stopped mid-way, and nothing ran after the close


def test_switch_off_before_a_generation_hints_as_compute_statistics_does(weights):
    """Issue 51 item 4: the same "no generation yet" case was a Warning from Compute statistics and an Error from
    Switch off. Both now warn and say it on their line."""
    tab = app_page(weights).tab(HeadsTab)
    quiet = dict(progress=lambda *a, **k: None)
    stats = _run(tab.head_stats(None, 0, **quiet))  # neither raises: no Error toast
    off = _run(tab.switch_off(None, ["mid_attn"], "all", **quiet))
    assert stats[-1][tab.stats_status] == off[-1][tab.off_status] and off[-1][tab.off_status].startswith("generate images first")


def test_switch_off_is_a_job_with_its_own_status_line(weights):
    """Issue 60 item 1: "Switch off and regenerate" had no status line of its own and no Stop (its progress showed far
    below the button). It now says how far it is and what it did on its own line, and refuses in words."""
    page = app_page(weights)
    tab = page.tab(HeadsTab)
    gen = page.engine.generate("tiny-classes", SampleRequest(scheduler="ddim", steps=3, seed=0, num_images=1))
    layer = page.engine.views.records(gen, 0)[0].name
    updates = _run(tab.switch_off(gen, [layer], "all", progress=lambda *a, **k: None))
    lines = [u[tab.off_status] for u in updates if isinstance(u.get(tab.off_status), str)]
    assert any(line.startswith("switching off: step") for line in lines), lines
    assert lines[-1] == f"done: {layer} switched off, 3 steps" and "switched to identity attention" in updates[-1][tab.off_text]
    refused = tab.switch_off(gen, [], "all", progress=lambda *a, **k: None)
    assert next(refused)[tab.off_status].startswith("**not started**: choose at least one attention layer to switch off")
    # a layer listed by another model's statistics (the walk, seed 11 step 134): said in words, on the status line
    lines = []
    with pytest.raises(Exception, match="not a layer of tiny-classes, the model of the images shown"):
        for out in tab.switch_off(gen, ["down.7.attn.3"], "all", progress=lambda *a, **k: None):
            lines.append(out.get(tab.off_status))
    assert lines[-1].startswith("**not done**: down.7.attn.3: not a layer of tiny-classes") and "Compute statistics" in lines[-1]
    stopped = Jobs._stopped_text("switching off: step 2 / 3 · about 1 s left")
    assert stopped.startswith("**stopped at step 2 / 3**")
