"""Typed configs: presets load; every bad config gets one clear error before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from denoiser.train.config import apply_overrides, config_from_dict, load_config
from tests.conftest import ROOT

CONFIGS = ROOT / "configs"


@pytest.mark.parametrize("name", ["tiny", "cifar10-small", "cifar10-cpu", "ddpm-cifar10", "photos64", "photos128"])
def test_presets_load(name, monkeypatch):
    monkeypatch.chdir(CONFIGS.parent)  # presets point at ../shared/data relative to the repo
    raw = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    if raw["data"].get("path") and not Path(raw["data"]["path"]).exists():
        raw["data"]["path"] = str(CONFIGS)  # the data set is not needed to check the config itself
    cfg = config_from_dict(raw, name)
    assert cfg.model == raw["model"]


BAD = [
    ({"model": {"nonsense": 1}}, "model.nonsense is not a UNet argument"),
    ({"trian": {}}, "unknown section"),
    ({"train": {"lr": "fast"}}, "train.lr should be float"),
    ({"train": {"batch_size": 0}}, "batch_size must be at least 1"),
    ({"train": {"batch_size": 2.5}}, "train.batch_size should be int"),
    ({"train": {"max_stpes": 10}}, "train.max_stpes is unknown"),
    ({"train": {"mixed_precision": "fp8"}}, "mixed_precision must be no, bf16 or fp16"),
    ({"model": {"sample_size": 30}}, "sample_size must be divisible by 4"),
    ({"model": {"base_channels": 20}}, "norm_num_groups=32 must divide"),
    ({"data": {"dataset": "folder", "path": "/does/not/exist"}}, "does not exist"),
    ({"data": {"dataset": "folder"}}, "data.path is required"),
    ({"data": {"dataset": "imagenet"}}, "data.dataset must be one of synthetic, folder, hf, webdataset, cifar10"),
    ({"data": {"num_workers": 0}}, "data.num_workers must be >= 1"),
    ({"diffusion": {"beta_schedule": "quadratic"}}, "beta_schedule must be linear or cosine"),
    ({"diffusion": {"prediction_type": "sample"}}, "prediction_type must be epsilon or v_prediction"),
    ({"train": {"class_dropout": 1.5}}, "class_dropout must be in"),
    ({"train": "fast"}, "must be a mapping"),
]


@pytest.mark.parametrize("raw,message", BAD)
def test_bad_configs_are_explained(raw, message):
    with pytest.raises(ValueError, match=message):
        config_from_dict(raw, "test")


def test_yaml_no_is_the_word_where_a_string_is_expected():
    # YAML 1.1 reads a bare `no` as False: `mixed_precision: no` (as the configs' comments suggest) means "no"
    raw = yaml.safe_load("train:\n  mixed_precision: no\n")
    assert raw == {"train": {"mixed_precision": False}}
    assert config_from_dict(raw).train.mixed_precision == "no"
    assert config_from_dict(apply_overrides({}, ["train.mixed_precision=no"])).train.mixed_precision == "no"
    with pytest.raises(ValueError, match="must be no, bf16 or fp16"):  # `yes` is no precision: said, not guessed
        config_from_dict({"train": {"mixed_precision": True}})


def test_overrides_dotted_and_bare():
    raw = apply_overrides({}, ["train.lr=1e-4", "batch_size=8", "model.sample_size=16", "ema=false"])
    assert raw == {"train": {"lr": "1e-4", "batch_size": 8, "ema": False}, "model": {"sample_size": 16}}
    cfg = config_from_dict(raw)
    assert cfg.train.lr == 1e-4 and cfg.train.batch_size == 8 and cfg.model == {"sample_size": 16}
    with pytest.raises(ValueError, match="key=value"):
        apply_overrides({}, ["lr"])
    with pytest.raises(ValueError, match="found in no section"):
        apply_overrides({}, ["learning_rate=1"])


def test_missing_config_file_lists_the_presets():
    with pytest.raises(FileNotFoundError, match="neither a file nor a preset; presets: cifar10, .*tiny"):
        load_config("nope.yaml")
    with pytest.raises(FileNotFoundError, match="neither a file nor a preset"):
        load_config("somewhere/tiny.yaml")  # a path is a path: no preset fallback


@pytest.mark.parametrize("name", ["tiny", "tiny.yaml", str(CONFIGS / "tiny.yaml")])
def test_presets_load_by_name_or_path(name):
    cfg = load_config(name)
    assert cfg.model == yaml.safe_load((CONFIGS / "tiny.yaml").read_text())["model"]


def test_older_run_folders_still_load(tmp_path):
    from denoiser.train.config import load_config

    path = tmp_path / "config.yaml"
    path.write_text("data:\n  num_workers: 4\n  val_size: 10\n")  # num_workers: removed once, back for preparation
    cfg = load_config(path)
    assert cfg.data.val_size == 10 and cfg.data.num_workers == 4 and cfg.data.image_column == "image"
