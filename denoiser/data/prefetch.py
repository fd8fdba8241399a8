"""Step k+1's batch made on a background thread while step k computes.

The data path has no decoding left to parallelise (the store holds pixels at the model's size), so what
remains per step is a memory-mapped gather, flips and the noise draws: one thread hides it behind the
step, without worker processes and their copies. Each batch is a pure function of the step (its own
seeded generator), so computing it early, on another thread, gives the very same numbers.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Prefetcher"]

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """`get(step)` returns `make(step)` and starts `make(step + 1)` on a background thread."""

    def __init__(self, make: Callable[[int], T]):
        self.make = make
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prefetch")
        self.ahead: tuple[int, concurrent.futures.Future] | None = None

    def get(self, step: int) -> T:
        if self.ahead is not None and self.ahead[0] == step:
            batch = self.ahead[1].result()
        else:  # the first step, or a jump
            batch = self.make(step)
        self.ahead = (step + 1, self.pool.submit(self.make, step + 1))
        return batch

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
