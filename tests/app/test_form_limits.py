"""denoiser.app.form_limits: the form's ranges and the checks the engine holds every value to."""

import math

import pytest

from denoiser.app.form_limits import LIMITS, check_int, check_scales
from denoiser.request import SampleRequest


@pytest.mark.parametrize("value", [3, 3.0, "3", " 3 "])
def test_a_whole_number_comes_back_as_an_int(value):
    got = check_int("steps", value, 1, 10)
    assert got == 3 and type(got) is int


@pytest.mark.parametrize("value", [0, 11, 3.5, 2.25, "three", math.nan, math.inf, [3]])
def test_anything_else_is_refused_with_its_name_range_and_value(value):
    with pytest.raises(ValueError, match=r"^steps must be a whole number in 1\.\.10, got ") as err:
        check_int("steps", value, 1, 10)
    assert repr(value) in str(err.value)  # as typed: 2.25 is never rounded to 2


@pytest.mark.parametrize("value", [None, "", "  "])
def test_an_empty_box_is_refused_as_empty(value):
    """Issue 60 item 3: an empty box was "got None" on one tab and ran 1 step on the other."""
    with pytest.raises(ValueError, match=r"^steps must be a whole number in 1\.\.10: the box is empty$"):
        check_int("steps", value, 1, 10)


def test_the_ends_of_the_range_are_allowed():
    lo, hi = LIMITS["seed"]
    assert check_int("seed", lo, lo, hi) == lo and check_int("seed", str(hi), lo, hi) == hi


def test_scales_within_the_limits_come_back_as_request_fields():
    got = check_scales("2.5", 0, 10)
    assert got == {"guidance_scale": 2.5, "pag_scale": 0.0, "guide_scale": 10.0}


@pytest.mark.parametrize(("args", "label"), [((0.5, 0, 1), "guidance"), ((1, -1, 1), "pag scale"),
                                             ((1, 0, math.nan), "guide scale"), ((1, "x", 1), "pag scale")])
def test_a_scale_out_of_range_is_refused_by_its_slider_label(args, label):
    with pytest.raises(ValueError, match=rf"^{label} must be a number in \d"):
        check_scales(*args)


def test_gradio_still_refuses_an_out_of_range_slider_value_that_form_slider_lets_through():
    """denoiser.app.controls.form_slider exists because Gradio's Slider raises on a typed value out of its range
    (a traceback before the handler can say so); the day this fails, Gradio stopped and form_slider can go."""
    gr = pytest.importorskip("gradio")
    from denoiser.app.controls import form_slider, whole_box

    with pytest.raises(gr.exceptions.Error, match="less than minimum"):
        gr.Slider(1, 10).preprocess(-5)
    assert form_slider(1, 10).preprocess(-5) == -5
    assert whole_box("seed", 0, "seed", "seed").preprocess(1e20) == 10**20  # for check_int to refuse in words


def test_a_form_slider_takes_any_value_in_a_sessions_copy_too():
    """Found by the long click-walk (seeds 9 and 10): Gradio copies a component per session when a handler updates
    its props (the Attention tab's step slider, its maximum set by each generation), and the copy lost form_slider's
    bypass: a step of the generation before (199) arriving after a 2-step one raised "Value 199 is greater than
    maximum value 1." with a traceback."""
    from denoiser.app.controls import form_slider

    slider = form_slider(0, 1, value=0, step=1, label="denoising step")
    copy = slider.__class__(**{**slider.constructor_args, "maximum": 1, "render": False})  # as gradio's blocks.py does
    assert copy.preprocess(199) == 199


@pytest.mark.parametrize("box", ["steps", "num_images", "seed"])
def test_a_box_a_person_emptied_is_refused_not_filled_with_the_models_own(box):
    """Issue 72 finding 6: an emptied steps box ran the model's 50 steps without a word. On the page (typed) an empty
    number box is refused where the form is read, naming the box as every refusal does; the /generate API's unset
    field stays the model's own (a seed has none)."""
    from denoiser.app.form import form_request

    typed = {"steps": 25, "num_images": 8, "seed": 0}
    assert form_request([], False, **typed, typed=True).steps == 25  # all filled: nothing to say
    label = {"num_images": "number of images"}.get(box, box)
    lo, hi = LIMITS[box]
    for empty in (None, "", "  "):
        with pytest.raises(ValueError, match=rf"^{label} must be a whole number in {lo}\.\.{hi}: the box is empty"):
            form_request([], False, **{**typed, box: empty}, typed=True)
    if box == "seed":  # a seed has no model's own: an API call must give one
        with pytest.raises(ValueError, match="the box is empty"):
            form_request([], False, **{**typed, box: None})
    else:  # the API's unset: left to the request (its default, or the folder's as resolve fills it)
        assert getattr(form_request([], False, **{**typed, box: None}), box) == getattr(SampleRequest(), box)


def test_the_pages_generate_refuses_an_emptied_steps_box_and_the_api_takes_the_models_own(tmp_path, monkeypatch):
    """Issue 72 finding 6, through the page's own Generate listener: the steps box emptied, nothing runs and the status
    line says which box is empty; the /generate API's steps left unset runs the model's own."""
    import inspect

    import gradio as gr
    import torch
    from diffusers import DDPMScheduler

    from denoiser import UNet
    from denoiser.app.sample_tab import SampleTab
    from denoiser.sampling.pipeline import save_pipeline
    from tests.conftest import TINY, app_page

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    torch.manual_seed(0)
    save_pipeline(UNet(**TINY, num_class_embeds=3).eval(), DDPMScheduler(), tmp_path / "weights" / "tiny-classes")
    page = app_page(tmp_path / "weights")
    sample = page.tab(SampleTab)
    fns = [d for d in page.app.fns.values() if (sample.run._id, "click") in [tuple(t) for t in d.targets]]
    generate = [d for d in fns if inspect.isgeneratorfunction(d.fn)]  # the job: it streams its progress
    assert len(generate) == 1, [d.fn for d in fns]
    form = ["tiny-classes", "ddim", None, 0, 2, "(any)", 1.0, 0.0, 1.0, "(the model's)", 0.0, "", "", "", ""]
    given = form + [block.value for block in generate[0].inputs[len(form):]]  # the page's own inputs past the form
    said = []
    with pytest.raises(gr.Error, match="steps must be a whole number in 1..1000: the box is empty"):
        for update in generate[0].fn(*given):
            said.append(update)
    assert "the box is empty" in str(said[-1][sample.status])
    *_, last = sample.generate(*form)  # the API's door: unset is the model's own
    assert str(last[sample.status]).startswith("done: 2 image(s)")
