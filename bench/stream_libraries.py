"""Our stream (denoiser/data/stream.py) against the libraries that do the same, on the same shards (issue 40, item 2):
the `webdataset` package, `datasets`' IterableDataset (`split_dataset_by_node`, `state_dict()`) and torchdata's
`StatefulDataLoader` around it.

    .venv/bin/pip install --no-deps --target /tmp/benchlibs webdataset==1.0.2 braceexpand==0.1.7 torchdata==0.11.0
    PYTHONPATH=/tmp/benchlibs:. .venv/bin/python bench/stream_libraries.py --out /tmp/bench-libs

(`--no-deps --target`: the libraries lie beside .venv and never touch its torch; `datasets` is .venv's own.)

Writes --num CIFAR-10 training JPEGs (32,000: --late fits in one epoch; classes interleaved, item 7 of each shard
truncated) as 8 WebDataset tars (KEY.jpg + KEY.cls) and as a `datasets` save_to_disk folder with num_shards=8
(Image + ClassLabel + an `id` column), once, under --out. Every reader then serves rank 0 of 2 (4 of the 8 shards),
a shuffle buffer of --buffer items, batches of --batch images decoded like denoiser/data/decode.py (PIL draft, RGB,
bicubic short side, centre crop) to --size px, with 0 and 2 DataLoader workers, and each skips an undecodable item
in its own idiom:
  - ours: `open_stream(DataConfig(dataset="webdataset" | "hf", streaming=True))`, `batches(...).get(step)`;
  - webdataset: `WebDataset(shardshuffle, seed, nodesplitter).shuffle(buffer, seed).map(decode).batched(batch)`;
  - datasets: `load_from_disk(...).to_iterable_dataset(num_shards=8).shuffle(seed, buffer_size)`,
    `split_dataset_by_node`, `.map(decode).filter(...)`, through a torch DataLoader;
  - the same IterableDataset through torchdata's `StatefulDataLoader`.
Measured, interleaved --repeats times (medians), side by side in one run:
  - start-up: seconds from nothing to the first batch (opening or indexing the shards, forking workers);
  - throughput: images/s over --steps batches after that first one;
  - exactness of resume: one uninterrupted run of --late + 5 batches; its state after batch 5 and after batch --late
    (ours: the step number; datasets: `state_dict()`; StatefulDataLoader: its `state_dict()`; webdataset offers none,
    so a fresh pipeline with the same seeds discards that many batches), restored in a FRESH object, whose next 5
    batches are compared with the uninterrupted run's (item ids in order; the share of the same items);
  - resume cost: seconds from the fresh object to its first batch after batch --late;
  - the causes, apart: datasets without a shuffle buffer (0 and 2 workers), a state saved with 2 workers and restored
    with 0 (ours, StatefulDataLoader), and what datasets' resume after batch --late does to the rest of the epoch.
Also counts the lines of denoiser/data/ that a switch would remove, by definition name (ast), and this file's reader
that would replace them.
Prints markdown tables, the CPU and the library versions.
"""

from __future__ import annotations

import argparse
import ast
import functools
import io
import itertools
import logging
import os
import subprocess
import tarfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

CIFAR = Path("/work/shared/data/cifar10-jpeg/train")
RANK, WORLD, SEED, NUM_SHARDS = 0, 2, 0, 8
BROKEN = 7  # in each shard, item 7 is a truncated JPEG


def cpu_name() -> str:
    """The CPU's model name and the flags that matter here (lscpu), with the core count."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    info = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(info.get("Flags", "").split())
    has = [f"{f} {'yes' if f in flags else 'no'}" for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile")]
    return f"{info.get('Model name', '?').strip()} ({', '.join(has)}), {len(os.sched_getaffinity(0))} cores"


def versions() -> str:
    import datasets
    import PIL
    import pyarrow
    import torch
    import torchdata
    import webdataset

    return (f"torch {torch.__version__}, datasets {datasets.__version__}, webdataset {webdataset.__version__}, "
            f"torchdata {torchdata.__version__}, pyarrow {pyarrow.__version__}, Pillow {PIL.__version__}")


# --- the shards ---------------------------------------------------------------------------------------------------

def cifar_items(num: int) -> list[tuple[bytes, int]]:
    """`num` (JPEG bytes, class) from the CIFAR-10 JPEG folder, classes interleaved; item 7 of each shard truncated."""
    classes = sorted(p.name for p in CIFAR.iterdir())
    per_shard = num // NUM_SHARDS
    items = []
    for i in range(num):
        data = (CIFAR / classes[i % 10] / f"{i // 10:04d}.jpg").read_bytes()
        if i % per_shard == BROKEN:
            data = data[: len(data) // 3]  # cut inside the scan: PIL fails at load()
        items.append((data, i % 10))
    return items


def write_shards(out: Path, num: int) -> tuple[str, str]:
    """The same items as WebDataset tars and as a save_to_disk folder; (tar brace pattern, folder). Written once."""
    tars, hf = out / "tars", out / "hf"
    pattern = str(tars / f"{{00000..{NUM_SHARDS - 1:05d}}}.tar")
    if (out / f"done-{num}").is_file():
        return pattern, str(hf)
    import datasets

    items, per_shard = cifar_items(num), num // NUM_SHARDS
    tars.mkdir(parents=True, exist_ok=True)
    for s in range(NUM_SHARDS):
        with tarfile.open(tars / f"{s:05d}.tar", "w") as tar:
            for i in range(s * per_shard, (s + 1) * per_shard):
                data, label = items[i]
                for name, blob in ((f"{i:06d}.jpg", data), (f"{i:06d}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(blob)
                    tar.addfile(info, io.BytesIO(blob))
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=sorted(
        p.name for p in CIFAR.iterdir())), "id": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": d, "path": None} for d, _ in items[: per_shard * NUM_SHARDS]],
                                     "label": [c for _, c in items[: per_shard * NUM_SHARDS]],
                                     "id": list(range(per_shard * NUM_SHARDS))}, features=features)
    ds.save_to_disk(str(hf), num_shards=NUM_SHARDS)
    (out / f"done-{num}").touch()
    return pattern, str(hf)


# --- decoding as denoiser/data/decode.py does (kept here: denoiser/data/ is being refactored) ----------------------

def decode(data: bytes, size: int) -> np.ndarray:
    """JPEG bytes -> (3, size, size) uint8: DCT draft, EXIF, RGB, bicubic short side, centre crop."""
    from PIL import Image, ImageOps
    from torchvision import transforms

    with Image.open(io.BytesIO(data)) as img:
        img.draft("RGB", (size, size))
        img.load()
        rgb = ImageOps.exif_transpose(img).convert("RGB")
    bicubic = transforms.InterpolationMode.BICUBIC
    fit = transforms.Compose([transforms.Resize(size, interpolation=bicubic, antialias=True),
                              transforms.CenterCrop(size)])
    return np.asarray(fit(rgb)).transpose(2, 0, 1)


# --- the readers: open(state) a fresh object, next() -> (ids, labels), state() after the last batch, close() -------

class Ours:
    """denoiser's stream: the state is the step."""

    def __init__(self, kind: str, path: str, workers: int, args):
        from denoiser.train.config import DataConfig

        self.cfg = DataConfig(dataset=kind, path=path, streaming=True, val_size=0, shuffle_buffer=args.buffer,
                              label_column="label")
        self.workers, self.args = workers, args

    def open(self, state: int | None) -> None:
        from denoiser.data.stream import open_stream

        stream = open_stream(self.cfg, self.args.size, seed=SEED, rank=RANK, world=WORLD)
        self.batches, self.step = stream.batches(self.args.batch, self.workers), state or 0

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        b = self.batches.get(self.step)
        self.step += 1
        return b.ids.numpy(), b.labels.numpy()

    def state(self) -> int:
        return self.step

    def close(self) -> None:
        if hasattr(self, "batches"):
            self.batches.close()


def _rank_shards(src: Iterator) -> Iterator:
    return itertools.islice(src, RANK, None, WORLD)  # every WORLD-th shard, as split_dataset_by_node does


def _wds_sample(sample: dict, size: int) -> tuple[np.ndarray, int, int]:
    return decode(sample["jpg"], size), int(sample["__key__"]), int(sample["cls"])


class WebDatasetPackage:
    """webdataset: no state to save; resuming is a fresh pipeline with the same seeds that discards the batches."""

    def __init__(self, pattern: str, workers: int, args):
        self.pattern, self.workers, self.args = pattern, workers, args

    def open(self, state: int | None) -> None:
        import torch
        import webdataset as wds

        pipe = (wds.WebDataset(self.pattern, shardshuffle=NUM_SHARDS, seed=SEED, nodesplitter=_rank_shards,
                               empty_check=False)
                .shuffle(self.args.buffer, seed=SEED)
                .map(functools.partial(_wds_sample, size=self.args.size), handler=wds.ignore_and_continue)
                .batched(self.args.batch, partial=False))
        self.it = iter(torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=self.workers))
        self.taken = 0
        for _ in range(state or 0):
            self.next()

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        _, ids, labels = next(self.it)
        self.taken += 1
        return np.asarray(ids), np.asarray(labels)

    def state(self) -> int:
        return self.taken

    def close(self) -> None:
        self.it = None


def _hf_row(row: dict, size: int) -> dict:
    try:
        pixels = decode(row["image"]["bytes"], size)
    except Exception:  # noqa: BLE001 - an undecodable item is skipped (filtered out below)
        pixels = None
    return {"pixels": pixels, "id": row["id"], "label": row["label"]}


def _decoded(row: dict) -> bool:
    return row["pixels"] is not None


def hf_iterable(folder: str, args, shuffle: bool = True):
    """The save_to_disk folder as rank RANK's IterableDataset: shards and buffer shuffled, decoded, failures dropped."""
    import datasets
    from datasets.distributed import split_dataset_by_node

    ds = datasets.load_from_disk(folder).cast_column("image", datasets.Image(decode=False))
    it = ds.to_iterable_dataset(num_shards=NUM_SHARDS)
    if shuffle:
        it = it.shuffle(seed=SEED, buffer_size=args.buffer)  # a fixed seed: every node sees the same shard order
    it = split_dataset_by_node(it, rank=RANK, world_size=WORLD)
    return it.map(functools.partial(_hf_row, size=args.size), remove_columns=["image"]).filter(_decoded)


def _collate(rows: list[dict]) -> dict:
    import torch

    return {"pixels": torch.from_numpy(np.stack([r["pixels"] for r in rows])),
            "id": np.array([r["id"] for r in rows]), "label": np.array([r["label"] for r in rows])}


class HFIterable:
    """datasets' IterableDataset through a torch DataLoader; the state is the dataset's state_dict() (0 workers only:
    with workers, the state lives in the worker processes and a plain DataLoader cannot fetch it)."""

    def __init__(self, folder: str, workers: int, args, shuffle: bool = True):
        self.folder, self.workers, self.args, self.shuffle = folder, workers, args, shuffle

    def open(self, state: dict | None) -> None:
        import torch

        self.ds = hf_iterable(self.folder, self.args, self.shuffle)
        if state is not None:
            self.ds.load_state_dict(state)
        loader = torch.utils.data.DataLoader(self.ds, batch_size=self.args.batch, num_workers=self.workers,
                                             collate_fn=_collate, drop_last=True)
        self.it = iter(loader)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        b = next(self.it)
        return b["id"], b["label"]

    def state(self) -> dict | None:
        return self.ds.state_dict() if self.workers == 0 else None

    def close(self) -> None:
        self.it = None


class Stateful(HFIterable):
    """The same IterableDataset through torchdata's StatefulDataLoader; the state is the loader's state_dict()."""

    def open(self, state: dict | None) -> None:
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.loader = StatefulDataLoader(hf_iterable(self.folder, self.args, self.shuffle), batch_size=self.args.batch,
                                         num_workers=self.workers, collate_fn=_collate, drop_last=True)
        if state is not None:
            self.loader.load_state_dict(state)
        self.it = iter(self.loader)

    def state(self) -> dict:
        return self.loader.state_dict()


# --- the measurements ---------------------------------------------------------------------------------------------

def speed(make: Callable[[], object], steps: int, batch: int) -> tuple[float, float]:
    """(seconds from a fresh reader to its first batch, images/s over the next `steps` batches)."""
    reader = make()
    tic = time.perf_counter()
    reader.open(None)
    reader.next()
    started = time.perf_counter() - tic
    tic = time.perf_counter()
    for _ in range(steps):
        reader.next()
    rate = steps * batch / (time.perf_counter() - tic)
    reader.close()
    return started, rate


def resume(make: Callable[[], object], marks: tuple[int, ...], after: int = 5) -> dict[int, tuple | str]:
    """Per mark k: (of `after` batches after k, how many equal the uninterrupted run's ids in order, the share of its
    items present, seconds from a fresh reader restored at k to its first batch), or why the restore failed."""
    reader = make()
    reader.open(None)
    run, states = [], {}
    for i in range(max(marks) + after):
        if i in marks:
            states[i] = reader.state()
        run.append(reader.next()[0])
    reader.close()
    out = {}
    for k in marks:
        if states[k] is None:
            continue
        fresh = make()
        tic = time.perf_counter()
        try:
            fresh.open(states[k])
            got = [fresh.next()[0]]
        except Exception as err:  # noqa: BLE001 - a library that cannot restore its own state: that is the result
            out[k] = f"fails: {type(err).__name__}"
            fresh.close()
            continue
        cost = time.perf_counter() - tic
        got += take(fresh, after - 1)
        fresh.close()
        out[k] = (*compare(got, run[k : k + after]), cost)
    return out


def take(reader, count: int) -> list[np.ndarray]:
    """Up to `count` batches' ids (fewer where the reader's epoch ends first)."""
    got = []
    for _ in range(count):
        try:
            got.append(reader.next()[0])
        except StopIteration:
            break
    return got


def compare(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[int, float]:
    """(batches equal in order, the share of the wanted items, counted with repeats, that `got` holds)."""
    same = sum(np.array_equal(a, b) for a, b in zip(got, want))
    kept = Counter(np.concatenate(got).tolist() if got else []) & Counter(np.concatenate(want).tolist())
    return same, sum(kept.values()) / sum(map(len, want))


def cell(result: tuple | str) -> str:
    """A resume result as 'equal batches/5, share of the items kept', or the failure as it is."""
    return f"{result[0]}/5, {result[1]:.1%}" if isinstance(result, tuple) else result


def code_lines(folder: Path) -> tuple[dict[str, tuple[str, int]], dict[str, int]]:
    """({top-level def or class: (its module, its lines, decorators and docstring included)}, {module: lines}) of
    every module of a package folder; found by name, so it holds while the modules are being split or renamed."""
    defs, files = {}, {}
    for path in sorted(folder.glob("*.py")):
        text = path.read_text()
        files[path.name] = len(text.splitlines())
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defs[node.name] = (path.name, node.end_lineno - node.lineno + 1 + len(node.decorator_list))
    return defs, files


# What a switch would remove: the stream's order, resume and loader, and the shard reader that the library's own
# reading replaces. What stays either way: the sources (the prepared store reads through them), the validation
# holdout and the checks of Stream, open_stream and the config (a library needs the same plumbing), seed_of (the
# training loop's draws use it too).
ORDER_AND_LOADER = ["buffer_order", "Cursor", "_decode", "decode_items", "_next_good", "_StepImages", "_From", "_as_is",
                    "_one_thread", "StreamBatches"]
REMOVED = {
    "webdataset (tars)": ORDER_AND_LOADER + ["TarShards"],
    "datasets IterableDataset + StatefulDataLoader (hf)": ORDER_AND_LOADER + ["_shard_files", "_ArrowFile",
                                                                              "_ParquetFile", "HFShards"],
}
ADDED = {  # this file's reader for each: about what the switch would write instead
    "webdataset (tars)": ["_rank_shards", "_wds_sample", "WebDatasetPackage"],
    "datasets IterableDataset + StatefulDataLoader (hf)": ["_hf_row", "_decoded", "hf_iterable", "_collate",
                                                           "Stateful"],
}


def print_lines() -> None:
    defs, files = code_lines(Path("denoiser/data"))
    ours, _ = code_lines(Path(__file__).resolve().parent)
    streaming = [f for f in ("stream.py", "order.py", "webdataset.py", "hf_source.py") if f in files]
    print("\nLines of our streaming modules: " + ", ".join(f"{f} {files[f]}" for f in streaming))
    for switch, names in REMOVED.items():
        found = [n for n in names if n in defs]
        missing = [n for n in names if n not in defs]
        parts = ", ".join(f"{n} {defs[n][1]} ({defs[n][0]})" for n in found)
        added = sum(ours[n][1] for n in ADDED[switch] if n in ours)
        print(f"  a switch to {switch} removes {sum(defs[n][1] for n in found)} lines: {parts}"
              + (f"; not found: {', '.join(missing)}" if missing else "")
              + f"; this bench's reader for it is {added} lines")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/bench-libs", help="folder for the shards (written once, then reused)")
    parser.add_argument("--num", type=int, default=32000, help="CIFAR-10 images in 8 shards; --late must fit one epoch")
    parser.add_argument("--size", type=int, default=32, help="decoded image size")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--buffer", type=int, default=1000, help="shuffle buffer, items")
    parser.add_argument("--steps", type=int, default=30, help="timed batches per throughput run")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the speed rows")
    parser.add_argument("--late", type=int, default=200, help="the late batch to resume at")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    import datasets

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    if (args.late + 5) * args.batch + args.buffer > args.num // WORLD:
        parser.error(f"--late {args.late} batches of {args.batch} and a buffer of {args.buffer} overrun rank 0's "
                     f"epoch of {args.num // WORLD} items; raise --num (the libraries' resume is within an epoch)")
    tic = time.perf_counter()
    pattern, folder = write_shards(Path(args.out), args.num)
    print(f"shards ready in {time.perf_counter() - tic:.1f} s: {pattern}, {folder}", flush=True)
    load = [os.getloadavg()[0]]

    readers: dict[str, Callable[[int], object]] = {
        "ours, webdataset tars": lambda w: Ours("webdataset", pattern, w, args),
        "ours, hf save_to_disk": lambda w: Ours("hf", folder, w, args),
        "webdataset 1.0 (tars)": lambda w: WebDatasetPackage(pattern, w, args),
        "datasets IterableDataset + DataLoader": lambda w: HFIterable(folder, w, args),
        "datasets IterableDataset + StatefulDataLoader": lambda w: Stateful(folder, w, args),
    }
    rows = [(name, w) for name in readers for w in (0, 2)]
    starts: dict = {r: [] for r in rows}
    rates: dict = {r: [] for r in rows}
    for name, w in rows:  # warm-up, not counted: imports, the page cache, the first fork
        speed(functools.partial(readers[name], w), 2, args.batch)
    for rep in range(args.repeats):  # interleaved, so a change in the machine's load hits every row alike
        for name, w in rows:
            s, r = speed(functools.partial(readers[name], w), args.steps, args.batch)
            starts[(name, w)].append(s)
            rates[(name, w)].append(r)
        print(f"speed repeat {rep + 1} done, load {os.getloadavg()[0]:.1f}", flush=True)
        load.append(os.getloadavg()[0])
    exact = {}
    for name, w in rows:
        exact[(name, w)] = resume(functools.partial(readers[name], w), (5, args.late))
        print(f"resume {name}, {w} workers: {exact[(name, w)]}", flush=True)
    load.append(os.getloadavg()[0])
    extra = {  # the causes: the shuffle buffer, and the worker count between sittings
        "datasets IterableDataset + DataLoader, no shuffle buffer, 0 workers": resume(
            lambda: HFIterable(folder, 0, args, shuffle=False), (5, args.late)),
        "StatefulDataLoader, no shuffle buffer, 2 workers": resume(
            lambda: Stateful(folder, 2, args, shuffle=False), (5, args.late)),
        "ours (tars), saved with 2 workers, resumed with 0": other_workers(
            lambda w: Ours("webdataset", pattern, w, args)),
        "StatefulDataLoader, no shuffle buffer, saved with 2 workers, resumed with 0": other_workers(
            lambda w: Stateful(folder, w, args, shuffle=False)),
    }
    for name, res in extra.items():
        print(f"{name}: {res}", flush=True)
    rest = rest_of_epoch(lambda: HFIterable(folder, 0, args), args.late)

    print(f"\nCPU: {cpu_name()}; load average (1 min) during the run {min(load):.1f} to {max(load):.1f}")
    print(f"Versions: {versions()}")
    print(f"{args.num} CIFAR-10 JPEGs (8 truncated) in 8 shards; rank {RANK} of {WORLD}; batches of {args.batch} at "
          f"{args.size} px; shuffle buffer {args.buffer}; medians of {args.repeats} interleaved repeats\n")
    base = {w: np.array(rates[("ours, webdataset tars", w)]) for w in (0, 2)}
    print("| reader | workers | start-up s | images/s (each repeat) | vs ours (tars), median of per-repeat ratios | "
          f"resume at 5: batches 6-10 equal, items kept | resume at {args.late}: equal, kept | "
          f"s to first batch after {args.late} |")
    print("|---|---|---|---|---|---|---|---|")
    for name, w in rows:
        each = " / ".join(f"{x:,.0f}" for x in rates[(name, w)])
        ratio = np.median(np.array(rates[(name, w)]) / base[w])
        res = exact[(name, w)]
        cells = [cell(res.get(k, "no state")) for k in (5, args.late)]
        cost = f"{res[args.late][2]:.2f}" if isinstance(res.get(args.late), tuple) else "-"
        print(f"| {name} | {w} | {np.median(starts[(name, w)]):.2f} | {np.median(rates[(name, w)]):,.0f} ({each}) | "
              f"{ratio:.2f}x | {cells[0]} | {cells[1]} | {cost} |")
    print("\n| extra resume check | at 5: equal, kept | at late: equal, kept |\n|---|---|---|")
    for name, res in extra.items():
        print(f"| {name} | {cell(res.get(5, '-'))} | {cell(res.get(args.late, '-'))} |")
    print(f"\ndatasets IterableDataset (buffer {args.buffer}, 0 workers) resumed after batch {args.late}: the "
          f"uninterrupted epoch has {rest[0]:,} items left, the resumed one yields {rest[1]:,}: {rest[2]:,} of the "
          f"former never come, {rest[3]:,} it yields came before the checkpoint already")
    print_lines()


def rest_of_epoch(make: Callable[[], object], k: int) -> tuple[int, int, int, int]:
    """(items after batch k to the epoch's end uninterrupted, items a fresh reader restored at k yields to the end,
    items of the former that the latter never yields, items the latter yields that came before batch k already)."""
    reader = make()
    reader.open(None)
    before = set(np.concatenate([reader.next()[0] for _ in range(k)]).tolist())
    state = reader.state()
    want = np.concatenate(take(reader, 1 << 30))
    reader.close()
    fresh = make()
    fresh.open(state)
    got = np.concatenate(take(fresh, 1 << 30))
    fresh.close()
    return len(want), len(got), len(set(want.tolist()) - set(got.tolist())), len(set(got.tolist()) & before)


def other_workers(make: Callable[[int], object], saved: int = 2, resumed: int = 0) -> dict[int, tuple | str]:
    """State after batch 5 saved with `saved` workers, restored with `resumed`: batches 6-10 against the run's."""
    reader = make(saved)
    reader.open(None)
    run = [reader.next()[0] for _ in range(10)]
    reader.close()
    reader = make(saved)
    reader.open(None)
    for _ in range(5):
        reader.next()
    state = reader.state()
    reader.close()
    fresh = make(resumed)
    try:
        fresh.open(state)
        got = take(fresh, 5)
    except Exception as err:  # noqa: BLE001 - a refusal is the result
        return {5: f"fails: {type(err).__name__}"}
    finally:
        fresh.close()
    return {5: compare(got, run[5:])}


if __name__ == "__main__":
    main()
