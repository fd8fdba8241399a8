"""What the page's form may ask for, and the checks of its values.

The sliders are drawn from LIMITS (the Sample and Photo tabs), and each tab's request is checked against the same
LIMITS where the form is read (denoiser.app.form.form_request, Engine.restore_request), so an API call that skips the
page is held to what the page allows. A value out of range is refused with its name, its
range and what was given.
"""

from __future__ import annotations

__all__ = ["LIMITS", "MAX_PROMPT_CHARS", "check_int", "check_scales"]

LIMITS = {"steps": (1, 1000), "num_images": (1, 64), "seed": (0, 2**32 - 1), "guidance_scale": (1.0, 10.0),
          "pag_scale": (0.0, 10.0), "guide_scale": (1.0, 10.0),
          # the Photo tab's: the noise σ of a photo, the noise added first (σ, [0, 1] pixel scale), an edit's strength
          "sigma": (0.0, 1.0), "add_noise": (0.0, 0.5), "strength": (0.01, 1.0)}
MAX_PROMPT_CHARS = 1000  # a prompt longer than this is refused (the tokenizer keeps its first max_length words anyway)


def check_int(name: str, value, lo: int, hi: int) -> int:
    """A whole number in lo..hi (ints, integral floats from sliders and boxes, numeric strings), else a clear error
    that quotes what was given (an empty box: says so; 2.5: never rounded)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{name} must be a whole number in {lo}..{hi}: the box is empty")
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not v.is_integer() or not lo <= v <= hi:
        typed = f"{value:g}" if isinstance(value, float) else repr(value)
        raise ValueError(f"{name} must be a whole number in {lo}..{hi}, got {typed}")
    return int(v)


def check_scales(guidance_scale, pag_scale, guide_scale) -> dict:
    """The page's guidance sliders as GuidanceRequest fields, each within LIMITS; None (an API call's unset) stays
    None: the model folder's."""
    values = {}
    for name, value in (("guidance_scale", guidance_scale), ("pag_scale", pag_scale), ("guide_scale", guide_scale)):
        if value is None:
            values[name] = None
            continue
        try:
            values[name] = float(value)
        except (TypeError, ValueError):
            values[name] = float("nan")
        lo, hi = LIMITS[name]
        if not lo <= values[name] <= hi:  # NaN fails too
            label = {"guidance_scale": "guidance"}.get(name, name.replace("_", " "))  # as the page's sliders say
            raise ValueError(f"{label} must be a number in {lo:g}..{hi:g}, got {value!r}")
    return values
