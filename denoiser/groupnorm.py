"""GroupNorm (Wu & He 2018) with the SiLU that follows it in the U-Net, fast for channels-last CPU tensors.

`GroupNorm` is `nn.GroupNorm` (same parameters, same state-dict keys) with an optional fused SiLU.
Its readable reference is `torch.nn.functional.group_norm` followed by `F.silu`, used for every
tensor the fast path does not cover. The fast path is a small C++ kernel
(`denoiser/csrc/group_norm_nhwc.cpp`) for channels-last fp32/bf16 CPU tensors, where torch's own
GroupNorm is 3-12x slower than for NCHW (bf16 especially) while the convolutions around it are
fastest channels-last. Tests assert that both paths compute the same function, forward and backward.

The kernel is compiled on first use with torch's C++-extension builder (about 10 s with g++, cached under
~/.cache/torch_extensions). Without a C++ compiler, or with DENOISER_FAST_GROUPNORM=0, everything
runs on the reference path and only speed changes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import threading
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GroupNorm", "group_norm", "load_fast_kernel", "default_channels_last"]

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).parent / "csrc" / "group_norm_nhwc.cpp"
_lock = threading.Lock()
_state: dict[str, object] = {}  # "ok": bool once a load was attempted, "error": str when it failed


def _cpu_tag() -> str:
    """Short hash of this CPU's instruction-set flags: the kernel is built with -march=native, so a cached
    build must never be loaded on a CPU that lacks its instructions (e.g. a home folder shared by machines)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor() or platform.machine()
    return hashlib.sha1(flags.encode()).hexdigest()[:8]


def _put_ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; the pip package's binary is not there unless the venv is
    activated (e.g. `.venv/bin/python -m pytest`)."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def load_fast_kernel() -> bool:
    """Compile (once per machine) and load the channels-last kernel; False, with the reason logged, if it cannot.
    Called on every GroupNorm of a channels-last tensor: once decided, it answers without the lock."""
    if "ok" in _state:
        return bool(_state["ok"])
    with _lock:
        if "ok" in _state:
            return bool(_state["ok"])
        if os.environ.get("DENOISER_FAST_GROUPNORM", "1") == "0":
            _state.update(ok=False, error="disabled by DENOISER_FAST_GROUPNORM=0")
            return False
        try:
            from torch.utils.cpp_extension import load

            _put_ninja_on_path()

            log.info("loading the channels-last GroupNorm kernel (its first build on a machine takes about 10 s)")
            cflags = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
            if platform.machine() in ("x86_64", "AMD64"):
                cflags.append("-mprefer-vector-width=512")  # gcc defaults to 256-bit vectors on AVX-512 CPUs
            load(
                name=f"denoiser_group_norm_nhwc_{_cpu_tag()}",
                sources=[str(_SOURCE)],
                extra_cflags=cflags,
                extra_ldflags=["-fopenmp"],
                is_python_module=False,
                verbose=False,
            )
            _state["ok"] = True
        except Exception as e:  # no compiler, no headers, ...: the reference path still works
            _state.update(ok=False, error=f"{type(e).__name__}: {e}")
            log.warning(
                "denoiser: the fast channels-last GroupNorm kernel could not be built (%s); using torch's "
                "GroupNorm instead (same results, slower channels-last). It needs a C++ compiler (g++) and "
                "ninja (a dependency of denoiser); set DENOISER_FAST_GROUPNORM=0 to skip the attempt.",
                _state["error"][-2000:],
            )
        return bool(_state["ok"])


def default_channels_last(device: torch.device | str, mixed_precision: str = "no") -> bool:
    """Whether to train channels-last: convolutions are faster that way everywhere, but on CPU only where
    the GroupNorm kernel covers the activations' dtype (fp32, bf16); torch's own NHWC GroupNorm is
    several times slower in bf16/fp16 and would eat the gain."""
    if torch.device(device).type != "cpu":
        return True
    if mixed_precision == "no":
        return True
    return mixed_precision == "bf16" and load_fast_kernel()


class _GroupNormNHWC(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, groups: int, eps: float, silu: bool):
        y, mean, rstd = torch.ops.denoiser.group_norm_nhwc_forward(x, weight, bias, groups, eps, silu)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.groups, ctx.silu, ctx.eps = groups, silu, eps
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the reference so higher orders work
            inputs = [t if t.requires_grad else t.detach().requires_grad_() for t in (x, weight, bias)]
            y = F.group_norm(inputs[0], ctx.groups, inputs[1], inputs[2], ctx.eps)
            y = F.silu(y) if ctx.silu else y
            return (*torch.autograd.grad(y, inputs, dy, create_graph=True), None, None, None)
        dx, dw, db = torch.ops.denoiser.group_norm_nhwc_backward(dy, x, weight, bias, mean, rstd, ctx.groups, ctx.silu)
        return dx, dw, db, None, None, None


_functorch_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", lambda t: False)


def _plain(*tensors: torch.Tensor) -> bool:
    """Not under vmap/grad/jvp transforms and without forward-mode tangents: the kernel has no rules for
    those, so such tensors take the reference path (which torch differentiates any way asked)."""
    if any(_functorch_wrapped(t) for t in tensors):
        return False
    if torch.autograd.forward_ad._current_level >= 0:  # inside a dual_level: tangents may exist
        return all(torch.autograd.forward_ad.unpack_dual(t).tangent is None for t in tensors)
    return True


def _fast_path_applies(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    return (
        weight is not None
        and bias is not None
        and _plain(x, weight, bias)  # first: vmap'd tensors cannot even be asked is_contiguous
        and x.device.type == "cpu"
        and x.dim() == 4
        and x.dtype in (torch.float32, torch.bfloat16)
        and weight.dtype == torch.float32
        and bias.dtype == torch.float32
        and weight.is_contiguous()
        and bias.is_contiguous()
        and x.is_contiguous(memory_format=torch.channels_last)
        and not x.is_contiguous()  # truly NHWC; NCHW tensors are torch's fast case
        and not torch.compiler.is_compiling()
        and load_fast_kernel()
    )


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    silu: bool = False,
    fast: bool | None = None,
) -> torch.Tensor:
    """GroupNorm of (B, C, H, W) x, then SiLU if `silu`. fast: None picks the kernel where it applies,
    False forces the reference (F.group_norm, F.silu), True requires the kernel."""
    use_fast = _fast_path_applies(x, weight, bias) if fast is None else fast
    if use_fast:
        if not load_fast_kernel():
            raise RuntimeError(f"fast GroupNorm kernel unavailable: {_state.get('error')}")
        if not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or bias.requires_grad)):
            # inference: the op alone (an autograd.Function costs ~30 us a call, 10% of a sampling step)
            return torch.ops.denoiser.group_norm_nhwc_forward(x, weight, bias, num_groups, eps, silu)[0]
        return _GroupNormNHWC.apply(x, weight, bias, num_groups, eps, silu)
    y = F.group_norm(x, num_groups, weight, bias, eps)
    return F.silu(y) if silu else y


class GroupNorm(nn.GroupNorm):
    """`nn.GroupNorm` with an optional fused SiLU; `fast` as in `group_norm` (None: automatic)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-6, silu: bool = False):
        super().__init__(num_groups, num_channels, eps=eps)
        self.silu = silu
        self.fast: bool | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps, self.silu, self.fast)

    def extra_repr(self) -> str:
        return super().extra_repr() + (", silu=True" if self.silu else "")
