"""denoiser.fast.malloc: glibc settings are process-wide, so each case runs in a fresh Python process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from denoiser.fast import malloc

pytestmark = pytest.mark.skipif(malloc._glibc() is None, reason="mallopt is glibc's; elsewhere configure does nothing")

# a training-like step whose activations pass glibc's 32 MiB mmap cap (64 x 8 x 128 x 128 floats); the page
# faults of steps 2-5, after the first has sized the heap
_STEPS = """
import json, resource, sys, threading
import torch
from denoiser.fast import malloc
torch.set_num_threads(1)
ok = malloc.configure(**json.loads(sys.argv[1]))
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.SiLU(), torch.nn.Conv2d(8, 8, 3, padding=1))
x = torch.randn(64, 8, 128, 128)
def step():
    net(x).square().mean().backward()
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
big = {}
def in_thread():  # a thread's arena cannot grow past 64 MiB: glibc must still serve it (its mmap fallback)
    big["sum"] = float(torch.ones(100 * 2**20).sum())
t = threading.Thread(target=in_thread)
t.start()
t.join()
print(json.dumps({"ok": ok, "faults": faults, "thread_sum": big.get("sum")}))
"""


def _run(**kwargs) -> dict:
    out = subprocess.run([sys.executable, "-c", _STEPS, json.dumps(kwargs)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_keep_peak_reuses_blocks_over_the_mmap_cap_without_page_faults():
    plain, kept = _run(), _run(keep_peak=True)
    assert plain["ok"] and kept["ok"]
    activation_pages = 4 * 32 * 2**20 // 4096  # 4 steps of at least one 32 MiB activation
    assert plain["faults"] >= activation_pages  # mapped afresh every step: every page faulted in again
    assert kept["faults"] < 0.3 * plain["faults"]  # the heap kept the earlier steps' pages (measured: ~0.06)
    assert kept["thread_sum"] == plain["thread_sum"] == 100 * 2**20  # large blocks in other threads still work


def test_keep_peak_and_a_server_arena_cap_do_not_mix():
    with pytest.raises(ValueError, match="pass one of them"):
        malloc.configure(arena_max=2, keep_peak=True)
