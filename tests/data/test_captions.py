"""Captions (denoiser/data/captions.py) through every source: a folder's metadata.csv, an `hf` text column and a
WebDataset sample's .txt, into the store and the stream alike; one seeded pick per image and step that a resume, the
number of processes or accumulation never changes; prompt dropout; columns the data lacks refused."""

from __future__ import annotations

import csv
import io
import tarfile

import pytest
import torch
from PIL import Image

from denoiser.data import load_dataset, open_training_data, prepare
from denoiser.data.captions import CaptionSpec, pick_caption
from denoiser.data.sources import open_shards, open_source
from denoiser.data.store import store_path
from denoiser.train.config import DataConfig, config_from_dict
from tests.conftest import TRAIN_CONFIG

S = 8
EMOJI = [  # file, name, short_name, keywords, category: as the emoji set's metadata.csv has them
    ("animals/cat.png", "cat", "cat", "pet|Cat", "Animals & Nature"),
    ("animals/dog.png", "dog face", "dog", "pet|puppy", "Animals & Nature"),
    ("food/apple.png", "red apple", "apple", "fruit|red", "Food & Drink"),
    ("food/pear.png", "pear", "pear", "", "Food & Drink"),
    ("food/lemon.png", "lemon", "", "citrus", "Food & Drink"),
    ("food/tea.png", "teacup without handle", "tea", "drink|green", "Food & Drink"),
]
COLUMNS = ["name", "short_name", "keywords", "category"]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DENOISER_CACHE", str(tmp_path / "cache"))


def _png(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (10 + i % 3, 9), (30 * i % 256, 200 - 9 * i, 60)).save(buf, format="PNG")
    return buf.getvalue()


def emoji_folder(root, rows=EMOJI, file_column="file"):
    """Class sub-folders and a metadata.csv naming each image in `file_column` (the emoji set's layout)."""
    for i, (rel, *_) in enumerate(rows):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(_png(i))
    with open(root / "metadata.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow([file_column, *COLUMNS, "vendor"])
        out.writerows([*row, "google"] for row in rows)
    return root


def _want(row) -> list[list[str]]:
    """The candidates a row should give: keywords split at "|", empties and repeats (ignoring case) left out."""
    return CaptionSpec(tuple(COLUMNS)).candidates(row[1:])


def test_candidates_are_groups_per_column_split_stripped_and_without_repeats():
    spec = CaptionSpec(("name", "short_name", "keywords", "category"))
    assert spec.candidates(["red apple", "apple", " fruit | red |", "Food & Drink"]) == [
        ["red apple"], ["apple"], ["fruit", "red"], ["Food & Drink"]]
    assert spec.candidates(["cat", "cat", "pet|Cat", None]) == [["cat"], ["pet"]]  # a repeat is asked for once
    assert CaptionSpec(("tags",), separator=None).candidates([["a|b", "c"]]) == [["a|b", "c"]]  # a list: one text each
    assert spec.candidates([None, "", [], "  "]) == []


def test_a_folder_metadata_csv_gives_each_image_its_candidates_in_the_store(tmp_path):
    root = emoji_folder(tmp_path / "emoji")
    got = load_dataset(DataConfig(dataset="folder", path=str(root), caption_columns=COLUMNS), S)
    assert got.classes == ["animals", "food"] and got.labels.tolist() == [0, 0, 1, 1, 1, 1]  # still labelled by folder
    files = sorted(EMOJI)  # the class sub-folders' order
    assert got.candidates[torch.arange(6)] == [_want(r) for r in files]
    assert got.candidates[torch.tensor([3])] == [[["lemon"], ["citrus"], ["Food & Drink"]]]  # empty short name left out
    # a flat folder in Hugging Face's imagefolder layout (file_name) carries its text the same way
    flat = emoji_folder(tmp_path / "flat", [(r[0].split("/")[1], *r[1:]) for r in EMOJI], file_column="file_name")
    got = load_dataset(DataConfig(dataset="folder", path=str(flat), label_column="category", caption_columns=["name"]), S)
    assert got.classes == ["Animals & Nature", "Food & Drink"] and got.candidates[torch.tensor([0, 2])] == [[["cat"]], [["red apple"]]]


def test_asking_for_captions_prepares_another_store_and_none_keeps_the_old_key(tmp_path):
    root = emoji_folder(tmp_path / "emoji")
    plain = DataConfig(dataset="folder", path=str(root))
    texted = DataConfig(dataset="folder", path=str(root), caption_columns=COLUMNS)
    assert prepare(plain, S).path != prepare(texted, S).path  # the old store, without captions, is not reused
    assert load_dataset(plain, S).candidates is None
    names_only = DataConfig(dataset="folder", path=str(root), caption_columns=["name"])
    assert store_path(open_source(names_only), S) != store_path(open_source(texted), S)
    before = store_path(open_source(texted), S)
    with open(root / "metadata.csv", "a", newline="") as f:  # the text changed, the images did not
        csv.writer(f).writerow(["food/apple.png", "apple again", "", "", "", "google"])
    assert store_path(open_source(texted), S) != before


def _hf_saved(path, shards: int = 1):
    import datasets

    feats = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string"),
                               "tags": datasets.Sequence(datasets.Value("string"))})
    ds = datasets.Dataset.from_dict({
        "image": [{"bytes": _png(i), "path": None} for i in range(len(EMOJI))],
        "text": [r[1] for r in EMOJI], "tags": [r[3].split("|") if r[3] else [] for r in EMOJI],
    }, features=feats)
    ds.save_to_disk(str(path), num_shards=shards)
    return str(path)


def test_an_hf_text_column_reaches_the_store_and_the_stream(tmp_path):
    path = _hf_saved(tmp_path / "saved", shards=2)
    want = [[[r[1]], *([[t for t in r[3].split("|") if t.casefold() != r[1].casefold()]] if r[3] else [])] for r in EMOJI]
    want = [[g for g in w if g] for w in want]
    cfg = DataConfig(dataset="hf", path=path, label_column=None, caption_columns=["text", "tags"])
    stored = load_dataset(cfg, S)
    assert stored.candidates[torch.arange(6)] == want
    shards = open_shards(DataConfig(**{**cfg.__dict__, "streaming": True}))
    assert [c for shard in shards.candidates for c in shard] == want


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_shards(root, per_shard=(4, 3, 5)) -> str:
    """Tar shards of PNGs with a .txt caption ("thing i") and a .cls; sample 5 has no .txt."""
    root.mkdir(parents=True)
    i = 0
    for s, n in enumerate(per_shard):
        with tarfile.open(root / f"{s:03d}.tar", "w") as tar:
            for _ in range(n):
                _add(tar, f"k{i:04d}.png", _png(i))
                _add(tar, f"k{i:04d}.cls", str(i % 2).encode())
                if i != 5:
                    _add(tar, f"k{i:04d}.txt", f"thing {i}\n".encode())
                i += 1
    return str(root / f"{{000..{len(per_shard) - 1:03d}}}.tar")


def test_webdataset_txt_members_reach_the_store_and_the_stream(tmp_path):
    pattern = write_shards(tmp_path / "shards")
    cfg = DataConfig(dataset="webdataset", path=pattern, caption_columns=["txt"])
    want = [[[f"thing {i}"]] if i != 5 else [] for i in range(12)]
    assert load_dataset(cfg, S).candidates[torch.arange(12)] == want
    shards = open_shards(DataConfig(**{**cfg.__dict__, "streaming": True}))
    assert [c for shard in shards.candidates for c in shard] == want


def _counted_folder(root, n=24):
    """n flat images in metadata.csv layout, image i named "item i" with keywords "k{i}a|k{i}b"."""
    root.mkdir(parents=True)
    with open(root / "metadata.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["file_name", "name", "keywords"])
        for i in range(n):
            (root / f"{i:03d}.png").write_bytes(_png(i))
            out.writerow([f"{i:03d}.png", f"item {i}", f"k{i}a|k{i}b"])
    return str(root)


def _run(data: dict, **train):
    return config_from_dict({"model": TRAIN_CONFIG["model"], "data": {"val_size": 4, "random_flip": False, **data},
                             "train": {"batch_size": 8, "seed": 5, **train}})


def _open(cfg, rank=0, world=1):
    t = cfg.train
    return open_training_data(cfg.data, S, seed=t.seed, batch_size=t.batch_size, accumulation=t.gradient_accumulation_steps,
                              rank=rank, world=world, caption_dropout=t.caption_dropout)


def test_each_step_picks_one_caption_per_image_by_seed_step_and_image(tmp_path):
    cfg = _run({"dataset": "folder", "path": _counted_folder(tmp_path / "items"), "caption_columns": ["name", "keywords"]},
               caption_dropout=0.0)
    data = _open(cfg)
    assert data.captioned
    seen = set()
    for step in range(6):
        batch = data.batch(step)
        for row, caption in zip(batch.ids.tolist(), batch.captions):
            candidates = data.train.candidates[torch.tensor([row])][0]
            assert caption in [t for g in candidates for t in g]  # one of its own texts
            assert caption == pick_caption(candidates, cfg.train.seed, step, row)
            seen.add((row, caption))
    rows = {r for r, _ in seen}
    assert len(seen) > len(rows)  # an image seen at several steps is not always given the same text
    again = _open(cfg).batch(3)  # a fresh process, as a resumed run opens it at step 3
    assert again.captions == data.batch(3).captions
    texts = [["item 0"], ["k0a", "k0b"]]
    assert len({pick_caption(texts, seed, 3, 0) for seed in range(20)}) == 3  # another seed, another pick


@pytest.mark.parametrize("world,accumulation", [(2, 1), (2, 2), (4, 1)])
def test_the_stores_captions_do_not_depend_on_processes_or_accumulation(tmp_path, world, accumulation):
    data = {"dataset": "folder", "path": _counted_folder(tmp_path / "items"), "caption_columns": ["name", "keywords"]}
    whole = _open(_run(data, caption_dropout=0.3))
    cfg = _run(data, caption_dropout=0.3, gradient_accumulation_steps=accumulation)
    parts = [_open(cfg, rank, world) for rank in range(world)]
    for step in (0, 4):
        want = whole.batch(step)
        rebuilt = [None] * 8
        for part in parts:
            batch = part.batch(step)
            for row, caption in zip(batch.draw_rows.tolist(), batch.captions):
                rebuilt[row] = caption
        assert rebuilt == want.captions


def test_the_streams_captions_do_not_depend_on_workers_or_where_it_resumed(tmp_path):
    from denoiser.data.stream import open_stream

    cfg = DataConfig(dataset="webdataset", path=write_shards(tmp_path / "shards"), caption_columns=["txt"], streaming=True,
                     val_size=2, shuffle_buffer=3)
    stream = open_stream(cfg, S, seed=4, rank=0, world=1, caption_dropout=0.25)
    one, two = stream.batches(4, workers=0), stream.batches(4, workers=2)
    try:
        straight = [one.get(k) for k in range(7)]  # past the end of the first epoch
        resumed = [two.get(k) for k in range(3, 7)]  # resumed at step 3, decoded by two workers
    finally:
        one.close()
        two.close()
    for a, b in zip(straight[3:], resumed):
        assert torch.equal(a.ids, b.ids) and a.captions == b.captions
    for step, batch in enumerate(straight):  # on any rank and world size, item i at step s takes the same caption
        for i, caption in zip(batch.ids.tolist(), batch.captions):
            texts = [[f"thing {i}"]] if i != 5 else []
            assert caption == pick_caption(texts, 4, step, i, 0.25)
    assert stream.validation().candidates[torch.arange(2)] == [[["thing 0"]], [["thing 1"]]]


def test_prompt_dropout_drops_about_the_rate_asked_and_keeps_the_other_picks():
    candidates = [["red apple"], ["apple"], ["fruit", "red", "food"], ["Food & Drink"]]
    items = range(4000)
    picks = {rate: [pick_caption(candidates, 7, 12, i, rate) for i in items] for rate in (0.0, 0.2, 0.5)}
    assert "" not in picks[0.0]
    for rate in (0.2, 0.5):
        dropped = picks[rate].count("")
        assert abs(dropped / len(items) - rate) < 0.04, (rate, dropped)
        assert dropped == [pick_caption(candidates, 7, 12, i, rate) for i in items].count("")  # the same again
        assert all(p == q for p, q in zip(picks[rate], picks[0.0]) if p)  # what is kept is what no dropout picks
    # each column equally likely, then each of its texts
    share = {t: picks[0.0].count(t) / len(items) for t in ("red apple", "apple", "fruit", "Food & Drink")}
    assert abs(share["red apple"] - 0.25) < 0.04 and abs(share["fruit"] - 0.25 / 3) < 0.03, share


def test_dropout_through_the_training_data_is_seeded_and_near_its_rate(tmp_path):
    data = {"dataset": "folder", "path": _counted_folder(tmp_path / "items", n=40), "caption_columns": ["name"]}
    runs = [_open(_run(data, caption_dropout=0.3)) for _ in range(2)]
    captions = [[c for step in range(60) for c in run.batch(step).captions] for run in runs]
    assert captions[0] == captions[1]
    assert abs(captions[0].count("") / len(captions[0]) - 0.3) < 0.06


def test_columns_the_data_lacks_are_refused_naming_those_it_has(tmp_path):
    root = emoji_folder(tmp_path / "emoji")
    with pytest.raises(ValueError, match=r"names the column 'title', not in .*metadata.csv \(found there: file, name, "
                                         r"short_name, keywords, category, vendor\)"):
        open_source(DataConfig(dataset="folder", path=str(root), caption_columns=["name", "title"]))
    with pytest.raises(ValueError, match=r"names the column 'caption', not in .*\(found there: image, text, tags\)"):
        open_source(DataConfig(dataset="hf", path=_hf_saved(tmp_path / "saved"), caption_columns=["caption"]))
    pattern = write_shards(tmp_path / "shards")
    with pytest.raises(ValueError, match=r"member extension 'json', not in the samples of .*\(found there: cls, png, txt\)"):
        open_source(DataConfig(dataset="webdataset", path=pattern, caption_columns=["json"]))
    plain = tmp_path / "plain"
    (plain / "a").mkdir(parents=True)
    (plain / "a" / "x.png").write_bytes(_png(0))
    with pytest.raises(ValueError, match="needs a metadata.csv or metadata.jsonl"):
        open_source(DataConfig(dataset="folder", path=str(plain), caption_columns=["name"]))
    with pytest.raises(ValueError, match="dataset 'synthetic' carries no text"):
        _run({"dataset": "synthetic", "caption_columns": ["name"]})
    with pytest.raises(ValueError, match="train.caption_dropout must be in"):
        _run({"dataset": "synthetic"}, caption_dropout=1.0)


def test_data_without_text_has_no_captions(tmp_path):
    data = _open(_run({"dataset": "folder", "path": _counted_folder(tmp_path / "items")}))  # metadata.csv, text not asked for
    assert not data.captioned and data.batch(0).captions is None and data.train.candidates is None
