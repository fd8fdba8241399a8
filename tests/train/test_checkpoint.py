"""denoiser/train/checkpoint.py: every process writes into one temporary folder; it gets its name only when complete."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from denoiser.train.checkpoint import complete_checkpoints, find_checkpoint, remove_partial, save_checkpoint


class FakeAccelerator:
    """One process of a run: save_state writes this rank's file, wait_for_everyone is a shared barrier."""

    def __init__(self, rank: int, barrier: threading.Barrier):
        self.rank, self.barrier = rank, barrier
        self.is_main_process = rank == 0

    def wait_for_everyone(self) -> None:
        self.barrier.wait(timeout=30)

    def save_state(self, folder: str, safe_serialization: bool) -> None:
        assert Path(folder).is_dir() and not Path(folder).name.startswith("checkpoint-")  # not yet published
        (Path(folder) / f"rank{self.rank}.safetensors").write_text(str(self.rank))


def save_on_ranks(out: Path, step: int, ranks: int = 2) -> list[Path]:
    barrier, results, errors = threading.Barrier(ranks), [None] * ranks, []

    def rank(r: int) -> None:
        try:
            results[r] = save_checkpoint(FakeAccelerator(r, barrier), out, step, {"step": step})
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_every_rank_writes_into_the_one_checkpoint(tmp_path):
    paths = save_on_ranks(tmp_path, 100)
    assert paths[0] == paths[1] == tmp_path / "checkpoints" / "checkpoint-00000100"
    assert sorted(p.name for p in paths[0].iterdir()) == ["rank0.safetensors", "rank1.safetensors", "state.json"]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["checkpoint-00000100"]  # no temporaries
    assert find_checkpoint(tmp_path, "latest") == paths[0]


def test_saving_a_step_again_replaces_it_whole(tmp_path):
    first = save_on_ranks(tmp_path, 5, ranks=2)[0]
    (first / "stale.txt").write_text("from before")
    again = save_on_ranks(tmp_path, 5, ranks=1)[0]
    assert sorted(p.name for p in again.iterdir()) == ["rank0.safetensors", "state.json"]
    assert json.loads((again / "state.json").read_text()) == {"step": 5}


def test_a_killed_save_leaves_nothing_resume_could_pick_and_is_cleared(tmp_path):
    save_on_ranks(tmp_path, 1)
    root = tmp_path / "checkpoints"
    for name in (".checkpoint-00000002.tmp-ranks", ".tmp-checkpoint-00000003", "checkpoint-00000004"):
        (root / name).mkdir()  # killed mid-write: ours, an older naming, a folder without its state.json
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["checkpoint-00000001"]
    remove_partial(tmp_path)
    assert [p.name for p in root.iterdir()] == ["checkpoint-00000001"]
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        find_checkpoint(tmp_path, str(root / "checkpoint-00000004"))
