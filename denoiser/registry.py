"""`DiffusionPipeline.from_pretrained(folder)` returns a `DenoiserPipeline` after `import denoiser`, whichever of
denoiser and diffusers is imported first, while `import denoiser` itself stays light (no torch, no diffusers).

diffusers finds a folder's pipeline class by its name in the `diffusers` module (model_index.json's
`_class_name`). We teach that module one more name, resolved on first lookup: `diffusers.DenoiserPipeline`
imports denoiser.pipeline then. When diffusers is already imported that happens at once; otherwise a one-shot
import hook does it right after diffusers' own module has run. Nothing is imported early, so the command line's
`denoiser --help` never pays the seconds that importing diffusers costs.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType

__all__ = ["register_with_diffusers"]

NAME = "DenoiserPipeline"


def _teach(diffusers: ModuleType) -> None:
    """Give the diffusers module a lazily imported `DenoiserPipeline` (its other names resolve as before)."""
    base = type(diffusers)
    if getattr(base, "_knows_denoiser", False):
        return

    class _WithDenoiser(base):  # diffusers' own lazy module type, plus one name
        _knows_denoiser = True

        def __getattr__(self, name: str):
            if name == NAME:
                from denoiser.pipeline import DenoiserPipeline  # sets the attribute: later lookups skip this

                return DenoiserPipeline
            if hasattr(base, "__getattr__"):
                return base.__getattr__(self, name)
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

        def __dir__(self):
            return sorted(set(super().__dir__()) | {NAME})

    diffusers.__class__ = _WithDenoiser


class _AfterDiffusers(importlib.abc.MetaPathFinder):
    """Finds `diffusers` as the other finders do, and teaches its module the name once it has run."""

    def find_spec(self, name, path, target=None):
        if name != "diffusers":
            return None
        sys.meta_path.remove(self)  # one shot: the lookup below and every later import go the usual way
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            _teach(sys.modules.get(name, module))

        spec.loader.exec_module = exec_module  # this spec's own loader object: nothing else sees the change
        return spec


def register_with_diffusers() -> None:
    """Make `diffusers.DenoiserPipeline` resolve now if diffusers is loaded, else as soon as it is."""
    if "diffusers" in sys.modules:
        _teach(sys.modules["diffusers"])
    elif not any(isinstance(f, _AfterDiffusers) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDiffusers())
