"""Files written whole or not at all."""

from __future__ import annotations

import pytest

from denoiser.atomic import atomic_path


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
