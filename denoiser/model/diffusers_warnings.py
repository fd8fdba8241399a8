"""diffusers' empty "kept in float32: []" warning, dropped inside `UNet.to`: a patch of diffusers' logging.

Written against diffusers 0.42.1. There, `ModelMixin.to(dtype)` warns "modules that should be kept in float32: []"
for every model that keeps none (it tests `self._keep_in_fp32_modules or []` against None), a warning that names
nothing to act on. `UNet.to` drops that one message, during its own call and in its own thread only
(`quiet_empty_fp32_warning`); the same message from other models, other threads or other moments passes.

What would let it go: diffusers no longer warning for an empty list. tests/model/test_unet_contract.py has a test that
fails on that day. The other diffusers patch, the pipeline's name, is `denoiser.sampling.registry`; this one is a module
of its own because the registry reaches `denoiser.sampling.pipeline`, which imports the UNet that calls this one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

__all__ = ["quiet_empty_fp32_warning"]


class _EmptyFp32ListFilter(logging.Filter):
    """Drops diffusers' "should be kept in float32: []" warning (see the module docstring), only for a thread
    inside `UNet.to`: the filter sits on diffusers' logger while any thread is, and other threads' records pass."""

    def __init__(self):
        super().__init__()
        self.lock, self.calls, self.inside = threading.Lock(), 0, threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.inside, "depth", 0) or "should be kept in float32: []" not in record.getMessage()

    @contextlib.contextmanager
    def during_call(self, logger: logging.Logger) -> Iterator[None]:
        with self.lock:
            if self.calls == 0:
                logger.addFilter(self)
            self.calls += 1
        self.inside.depth = getattr(self.inside, "depth", 0) + 1
        try:
            yield
        finally:
            self.inside.depth -= 1
            with self.lock:
                self.calls -= 1
                if self.calls == 0:
                    logger.removeFilter(self)


_EMPTY_FP32_LIST = _EmptyFp32ListFilter()


def quiet_empty_fp32_warning() -> contextlib.AbstractContextManager[None]:
    """Within, this thread's calls do not log diffusers' "should be kept in float32: []" warning (`UNet.to`)."""
    return _EMPTY_FP32_LIST.during_call(logging.getLogger("diffusers.models.modeling_utils"))
