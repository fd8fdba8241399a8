"""`DiffusionPipeline.from_pretrained(folder)` returns a `DenoiserPipeline` after `import denoiser`, whichever of
denoiser and diffusers is imported first, while `import denoiser` itself stays light (no torch, no diffusers).

This is a patch to diffusers, written against diffusers 0.42.1. There, `DiffusionPipeline.from_pretrained` finds a
folder's pipeline class as `getattr(diffusers, model_index["_class_name"])`
(`diffusers.pipelines.pipeline_loading_utils._get_pipeline_class`): only names of the diffusers module. Its ways
to a class from elsewhere, `custom_pipeline=` or a `_class_name` of [file, class] with that .py file in the folder,
run code from the folder and refuse without `trust_remote_code=True`. Without the patch,
`DenoiserPipeline.from_pretrained(folder)` loads a folder through diffusers' public API alone (the class asks for
itself); the patch is what lets diffusers' generic `DiffusionPipeline.from_pretrained` find it.

The patch is one name: a module-level `__getattr__` (PEP 562) in the diffusers module's namespace answers
`DenoiserPipeline` by importing denoiser.sampling.pipeline, and leaves every other name to diffusers' own lookup. When
diffusers is already imported that happens at once; otherwise a one-shot import hook does it right after
diffusers' own module has run. Nothing is imported early, so the command line's `denoiser --help` never pays the
seconds that importing diffusers costs.

What would let it go: diffusers resolving a `_class_name` from an installed library without remote code (as it
resolves each component's [library, class]); the model folders would then name ["denoiser.sampling.pipeline",
"DenoiserPipeline"]. tests/sampling/test_registry.py fails the day diffusers finds the class without this module, or
stops looking it up where this module puts it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType

__all__ = ["register_with_diffusers"]

NAME = "DenoiserPipeline"


def _teach(diffusers: ModuleType) -> None:
    """Give the diffusers module a module-level `__getattr__` that answers `DenoiserPipeline` (imported on first
    use) and hands every other name on: to a `__getattr__` diffusers had there, else to its own module type."""
    before = vars(diffusers).get("__getattr__")
    if getattr(before, "_denoiser", False):
        return

    def __getattr__(name: str):
        if name == NAME:
            from denoiser.sampling.pipeline import DenoiserPipeline

            return DenoiserPipeline
        if before is not None:
            return before(name)
        # AttributeError: Python then asks the module type's own __getattr__ (diffusers' lazy module)
        raise AttributeError(f"module {diffusers.__name__!r} has no attribute {name!r}")

    __getattr__._denoiser = True
    diffusers.__getattr__ = __getattr__


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
