"""Files and folders written whole or not at all."""

from __future__ import annotations

import pytest

from denoiser.atomic import atomic_path, is_temporary, publish, remove_temporaries, temp_sibling


def test_a_finished_write_lands_and_a_failed_one_keeps_the_old_file(tmp_path):
    path = tmp_path / "sub" / "loss.csv"
    with atomic_path(path) as tmp:
        tmp.write_text("1,0.5\n")
        assert not path.exists()  # nobody sees it before it is complete
    assert path.read_text() == "1,0.5\n"
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the disk filled up")
    assert path.read_text() == "1,0.5\n"  # what was saved before is kept
    assert [p.name for p in path.parent.iterdir()] == ["loss.csv"]  # no temporary file left behind


def test_a_folder_replaces_the_old_one_only_once_complete(tmp_path):
    path = tmp_path / "model"
    with atomic_path(path) as tmp:
        tmp.mkdir()
        (tmp / "a.txt").write_text("old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        tmp.mkdir()
        (tmp / "a.txt").write_text("new, half")
        assert (path / "a.txt").read_text() == "old"  # readers still see the old folder
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"] and (path / "a.txt").read_text() == "old"
    with atomic_path(path) as tmp:
        tmp.mkdir()
        (tmp / "b.txt").write_text("new")
    assert sorted(p.name for p in path.iterdir()) == ["b.txt"]  # replaced whole, not merged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # the old one aside is gone too


def test_writers_agree_on_a_tag_and_leftovers_are_removed(tmp_path):
    path = tmp_path / "checkpoint-1"
    shared = temp_sibling(path, "ranks")
    assert shared == temp_sibling(path, "ranks") and shared.parent == tmp_path and is_temporary(shared.name)
    assert temp_sibling(path) != temp_sibling(path)  # without a tag: one writer's own
    shared.mkdir()
    (shared / "rank1.bin").write_bytes(b"1")  # every process writes into it; one publishes
    publish(shared, path)
    assert (path / "rank1.bin").exists() and not shared.exists()
    for name in (".checkpoint-1.tmp-123-ab", ".checkpoint-1.old-9"):  # a writer killed midway
        (tmp_path / name).mkdir()
    (tmp_path / ".checkpoint-10.tmp-1").mkdir()  # another path's: not ours to remove
    remove_temporaries(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".checkpoint-10.tmp-1", "checkpoint-1"]
    assert not is_temporary("checkpoint-1") and not is_temporary("loss.csv")
