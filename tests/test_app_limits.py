"""denoiser.app.limits: the form's ranges and the checks the engine holds every value to."""

import math

import pytest

from denoiser.app.limits import LIMITS, check_int, check_scales


@pytest.mark.parametrize("value", [3, 3.0, "3", " 3 "])
def test_a_whole_number_comes_back_as_an_int(value):
    got = check_int("steps", value, 1, 10)
    assert got == 3 and type(got) is int


@pytest.mark.parametrize("value", [0, 11, 3.5, "three", None, math.nan, math.inf, [3]])
def test_anything_else_is_refused_with_its_name_range_and_value(value):
    with pytest.raises(ValueError, match=r"^steps must be a whole number in 1\.\.10, got ") as err:
        check_int("steps", value, 1, 10)
    assert repr(value) in str(err.value)


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
