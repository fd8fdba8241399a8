"""The app under load: many sessions at once, each its own Generate, same-seed twins compared to the pixel (issue 72).

    .venv/bin/python -m tools.app_load [--sessions 16] [--model cifar10] [--steps 10] [--images 2]

Starts `python app.py` (the shipped weights/, 127.0.0.1, a free port) as a process of its own, then opens `--sessions`
gradio_client sessions at once, each in a thread, each calling /generate with the model's own sampler, `--steps`
steps and `--images` images; sessions 2k and 2k+1 ask for seed k, so every seed is asked twice. Prints each
session's wait and run as the client saw them (from its submit to its result), whether every session got its images,
and whether each pair of same-seed twins came out identical to the pixel; exits 1 if not.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(log: Path) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port)], cwd=ROOT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while True:
        try:
            httpx.get(url, timeout=2)
            return proc, url
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(f"app.py did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.5)


def _pixels(gallery) -> list[np.ndarray]:
    """The gallery's images as arrays (gradio_client gives each as a dict with a local file path)."""
    return [np.asarray(Image.open(item["image"] if isinstance(item.get("image"), str) else item["image"]["path"]))
            for item in gallery]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--model", default="cifar10")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--images", type=int, default=2)
    args = p.parse_args()
    from gradio_client import Client

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = _start(Path(tmp) / "app.log")
        results: dict[int, tuple[float, list[np.ndarray] | Exception]] = {}
        start = threading.Barrier(args.sessions)

        def session(k: int) -> None:
            client = Client(url, verbose=False)
            start.wait()  # every session asks at once
            t0 = time.monotonic()
            try:
                out = client.predict(args.model, None, args.steps, k // 2, args.images, api_name="/generate")
                results[k] = (time.monotonic() - t0, _pixels(out[1]))
            except Exception as err:  # noqa: BLE001  (reported below, per session)
                results[k] = (time.monotonic() - t0, err)
            finally:
                client.close()

        threads = [threading.Thread(target=session, args=(k,)) for k in range(args.sessions)]
        tic = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - tic
        proc.terminate()
        proc.wait(timeout=30)

    failed = {k: r for k, (_, r) in results.items() if isinstance(r, Exception) or len(r) != args.images}
    twins = [(2 * s, 2 * s + 1) for s in range(args.sessions // 2)]
    same = [a not in failed and b not in failed and all(np.array_equal(x, y) for x, y in zip(results[a][1], results[b][1]))
            for a, b in twins]
    differ = sum(not np.array_equal(results[0][1][0], results[a][1][0]) for a, _ in twins[1:] if a not in failed)
    waits = sorted(t for t, _ in results.values())
    print(f"{args.sessions} sessions at once, {args.model}, {args.steps} steps, {args.images} images each: all done in "
          f"{wall:.1f} s; a session's wait and run {waits[0]:.1f} s (first) / {statistics.median(waits):.1f} s (median) "
          f"/ {waits[-1]:.1f} s (last)")
    print(f"sessions with all their images: {args.sessions - len(failed)} / {args.sessions}"
          + "".join(f"\n  session {k}: {r!r}" for k, r in failed.items()))
    print(f"same-seed twins identical to the pixel: {sum(same)} / {len(twins)}; seeds that differ from seed 0's: "
          f"{differ} / {len(twins) - 1}")
    if failed or not all(same):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
