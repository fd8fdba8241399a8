"""Every command of README.md, docs/*.md and weights/*/README.md runs in the suite as a person copies it (issue 70):
its program starts and takes every flag the line names, and the cheap ones run for real in a work folder laid out like
a clone. tests/project/doc_commands.py reads the docs; a command added to a doc is a new case here, with no new test code.

- `denoiser SUB ...`: the whole line through the real parser (`denoiser app`: the app's own).
- `python -m MODULE ...`, `accelerate launch [its flags] -m MODULE ...`: the module starts (its --help, once per
  module) and takes the line's flags (MODULE_PARSERS: its real parser); accelerate's flags through its launch parser.
- `python -m bench.x [SUB] ...` (and `python bench/x.py`, `python -m tools.x`: doc_commands.SCRIPT_PACKAGES): the
  script's --help (once per script and subcommand) names every flag of the line.
- `make T`: the Makefile has the target. `pip install ...`: a pin is the project's, an extra exists. `bash SCRIPT`:
  the script exists and bash reads it (`bash -n`).
- What runs for real, and how it is made cheap: RUNS, NOT_RUN, CHEAP and Work.why_not, below.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
import yaml
from PIL import Image

from tests import forked_cli
from tests.conftest import ROOT, photo_folder
from tests.project.doc_commands import NOT_OURS, OURS, Command, doc_commands, untagged_commands

COMMANDS = doc_commands()
CHECKED = [c for c in COMMANDS if c.kind]  # this project's: the others are other tools' (NOT_OURS)
TIMEOUT = 300

# What runs for real: a `denoiser` subcommand of RUNS, or a module that is one (MODULES) under `python -m` or under
# `accelerate launch` on one machine's CPU (ACCELERATE_USE_CPU); when every input it names is in the work folder or
# made by a doc command that runs, and a training run's data is there too. The rest is parsed only, for the reason
# NOT_RUN or Work.why_not gives.
RUNS = ("sample", "attention", "denoise", "edit", "inpaint", "attention-stats", "train", "prepare-data")
MODULES = {"denoiser.train": "train"}  # `python -m MODULE`, `accelerate launch -m MODULE`: the command of RUNS it is
NOT_RUN = {
    "app": "a server, up until stopped (tests/app/test_serve.py starts one)",
    "evaluate": "scores hundreds of samples or images (FID, bits/dim): minutes (tests/evaluate/test_fid.py and the CLI's tests "
                "run it small)",
    "build-kernels": "compiles C++ on a fresh machine (~30 s; make venv runs it; tests/fast/test_kernels.py)",
    "python": "a benchmark or a data-set build (minutes, or the network), or a module that is no command of RUNS",
    "make": "make's targets build the venv and run this suite",
    "pip": "installs packages",
    "bash": "a lent GPU machine's script (tools/gpu/)",
}
CHEAP = {  # appended to a line that runs: argparse keeps a flag's last value, and a later --set wins
    "sample": ["--steps", "2", "--num-images", "2"],
    "attention": ["--steps", "2"],
    "denoise": ["--steps", "2"],
    "edit": ["--steps", "2"],
    "inpaint": ["--steps", "2"],
    "attention-stats": ["--num-images", "1", "--timesteps", "999"],
    "prepare-data": [],
    # bf16 off: a CPU without native bf16 emulates it (configs/cifar10.yaml's note)
    "train": ["--max-steps", "2", "--set", "train.batch_size=4", "--set", "data.val_size=2", "--set", "train.sample_every=0",
              "--set", "train.checkpoint_every=2", "--set", "train.report_to=null", "--set", "train.mixed_precision=no"],
}
CHEAP_IF_NAMED = {"--at-step": "1"}  # a step the line picks must lie within CHEAP's steps
TINY_MODEL = ["--set", "model.base_channels=16", "--set", "model.layers_per_block=1", "--set", "model.norm_num_groups=8"]
INPUTS = ("--model", "--guide-model", "--image", "--mask", "--images", "--init-from")  # paths a command reads
OUTPUTS = ("--out", "--out-dir", "--compare", "--output-dir")  # paths it writes


def _train_parser() -> argparse.ArgumentParser:
    from denoiser.train.command import add_train_arguments

    parser = argparse.ArgumentParser(prog="python -m denoiser.train")
    add_train_arguments(parser)
    return parser


MODULE_PARSERS = {"denoiser.train": _train_parser}  # python -m MODULE: the real parser of its flags


def _parse(parse: Callable[[list[str]], argparse.Namespace], argv: list[str], prog: str) -> argparse.Namespace:
    """parse(argv), a refusal (argparse's exit) as an AssertionError that quotes it."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse(argv)
    except SystemExit as exc:
        raise AssertionError(f"{prog} refuses {' '.join(argv)}: {err.getvalue().strip() or exc}") from None


def _launch(argv: list[str]) -> argparse.Namespace:
    """accelerate launch's own reading of its arguments (argv: those after `launch`)."""
    from accelerate.commands.launch import launch_command_parser

    return _parse(launch_command_parser().parse_args, argv, "accelerate launch")


def _split(cmd: Command) -> tuple[str, list[str]]:
    """(what runs: a subcommand, module, script or target; its arguments)."""
    argv = list(cmd.argv)
    if cmd.kind == "denoiser":
        return argv[1], argv[2:]
    if cmd.kind == "accelerate":
        launch = _launch(argv[2:])
        return launch.training_script, launch.training_script_args
    if cmd.kind == "python":
        return (argv[2], argv[3:]) if argv[1] == "-m" else (argv[1], argv[2:])
    return argv[1], argv[2:]


def _value(args: list[str], flag: str) -> str | None:
    """The last value given to `flag` (argparse's rule)."""
    values = [args[k + 1] for k, a in enumerate(args[:-1]) if a == flag]
    return values[-1] if values else None


# ---------------------------------------------------------------------------------------------------------------------
# the work folder: a clone's layout, and the inputs the docs name

def _phone_photo(path: Path) -> None:
    """A phone's JPEG, small: 4:3, stored on its side with EXIF orientation 6 (turned upright when read)."""
    import numpy as np

    pixels = np.random.default_rng(0).integers(0, 255, (120, 160, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112], exif[0x010F], exif[0x0110] = 6, "Phone", "Phone 12"  # orientation, make, model
    Image.fromarray(pixels).save(path, quality=88, exif=exif)


def _saved_dataset(path: Path) -> None:
    """A Hugging Face `save_to_disk` folder of 6 images (data.dataset: hf)."""
    import datasets

    images = [Image.new("RGB", (24, 20), (40 * k, 200 - 30 * k, 90)) for k in range(6)]
    datasets.Dataset.from_dict({"image": images}).cast_column("image", datasets.Image()).save_to_disk(str(path))


class Work:
    """The folder the commands run in: weights/, configs/ and bench/ link to the clone's, and the inputs the docs
    name are made here (GUIDE: weights/cifar10 stands in for a guide of its data; FOLDER: a folder of model folders).
    A command runs once; one that reads what another writes (runs/demo/model, a run to resume) runs that one first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        for name in ("weights", "configs", "bench"):
            (path / name).symlink_to(ROOT / name)
        (path / "GUIDE").symlink_to(ROOT / "weights" / "cifar10")
        (path / "FOLDER").symlink_to(ROOT / "weights")
        _phone_photo(path / "photo.jpg")
        Image.new("RGB", (48, 40), (120, 60, 30)).save(path / "in.png")
        mask = Image.new("L", (48, 40), 0)
        mask.paste(255, (12, 10, 36, 30))
        mask.save(path / "mask.png")
        for name in ("MY_FOLDER", "MY_PHOTOS"):
            photo_folder(path / name)  # two class folders of small JPEGs
        _saved_dataset(path / "MY_SAVED_DATASET")
        self.results: dict[str, subprocess.CompletedProcess] = {}

    def reads(self, cmd: Command) -> list[str]:
        _, args = _split(cmd)
        reads = [v for flag in INPUTS if (v := _value(args, flag))]
        if _value(args, "--resume") == "latest":
            reads.append(str(Path(_value(args, "--output-dir") or "") / "checkpoints"))
        return reads

    def writes(self, cmd: Command) -> list[Path]:
        _, args = _split(cmd)
        out = [Path(v) for flag in OUTPUTS if (v := _value(args, flag))]
        run = _value(args, "--output-dir")
        return out + ([Path(run) / "model", Path(run) / "checkpoints"] if run else [])

    def maker(self, cmd: Command, path: str) -> Command | None:
        """The first doc command that runs here and writes `path`."""
        return next((c for c in CHECKED if c != cmd and c.kind in ("denoiser", "accelerate", "python")
                     and Path(path) in self.writes(c) and self.why_not(c) is None), None)

    def why_not(self, cmd: Command) -> str | None:
        """None when `cmd` runs for real here; else why it is parsed only."""
        what, args = _split(cmd)
        if cmd.kind == "accelerate":
            launch = _launch(list(cmd.argv[2:]))
            if cmd.env.get("ACCELERATE_USE_CPU") != "true":
                return "a GPU launch"
            if (launch.num_machines or 1) > 1:
                return "one launch per machine (tests/train/test_distributed.py runs two on one host)"
            what = MODULES.get(what, what)
        elif cmd.kind == "python" and cmd.argv[1] == "-m" and what in MODULES:
            what = MODULES[what]
        elif cmd.kind != "denoiser":
            return NOT_RUN[cmd.kind]
        if what not in RUNS:
            return NOT_RUN.get(what, f"{what} is not in RUNS")
        for path in self.reads(cmd):
            if not (self.path / path).exists() and self.maker(cmd, path) is None:
                return f"reads {path}, which neither the work folder holds nor a doc command that runs here makes"
        return self._data_missing(args) if what in ("train", "prepare-data") else None

    def _data_missing(self, args: list[str]) -> str | None:
        """Why a run's training data is not here (None: a data.path in the work folder, or none: built-in shapes)."""
        config = _value(args, "--config")
        path = self.path / config if (self.path / config).is_file() else self.path / "configs" / f"{config}.yaml"
        data = yaml.safe_load(path.read_text()).get("data") or {}
        for s in (args[k + 1] for k, a in enumerate(args[:-1]) if a == "--set" and args[k + 1].startswith("data.")):
            key, value = s.removeprefix("data.").split("=", 1)
            data[key] = yaml.safe_load(value)
        if data.get("path") is None or (self.path / str(data["path"])).exists():
            return None
        return f"trains on {data['path']}, which is not in the work folder"

    def run(self, cmd: Command) -> subprocess.CompletedProcess:
        """`cmd` run here once with CHEAP's flags, after the doc commands that make what it reads."""
        if cmd.id not in self.results:
            for path in self.reads(cmd):
                maker = self.maker(cmd, path)
                if not (self.path / path).exists() and maker is not None:
                    assert self.run(maker).returncode == 0, f"{maker.id}, which makes {path}, failed"
            env = {**os.environ, "OMP_NUM_THREADS": "1", **cmd.env}  # conftest.cli's environment
            if cmd.kind == "python":  # python -m MODULE (MODULES), as _python runs it
                module, args = cmd.argv[2], list(cmd.argv[3:])
                res = _python(["-m", module, *args, *_cheap(MODULES[module], args)], env, self.path)
            else:
                res = (self._accelerate if cmd.kind == "accelerate" else self._denoiser)(cmd, env)
            self.results[cmd.id] = res
        return self.results[cmd.id]

    def _denoiser(self, cmd: Command, env: dict[str, str]) -> subprocess.CompletedProcess:
        """As conftest.cli runs `denoiser` (a fork of its fork server, else a new interpreter), in this folder."""
        argv = [*cmd.argv[1:], *_cheap(cmd.argv[1], list(cmd.argv[2:]))]
        res = forked_cli.run(argv, str(self.path), env, TIMEOUT)
        if res is None:
            res = subprocess.run([sys.executable, "-m", "denoiser.cli.main", *argv], cwd=self.path, env=env,
                                 capture_output=True, text=True, timeout=TIMEOUT)
        return res

    def _accelerate(self, cmd: Command, env: dict[str, str]) -> subprocess.CompletedProcess:
        """`accelerate launch` as written, the module's arguments made cheap, on a free port where the line names none
        (accelerate's default, 29500, is taken while another launch of the suite runs)."""
        m = cmd.argv.index("-m")
        flags, module, args = list(cmd.argv[2:m]), cmd.argv[m + 1], list(cmd.argv[m + 2:])
        if not any(f.startswith("--main_process_port") for f in flags):
            flags += ["--main_process_port", str(_free_port())]
        accelerate = Path(sys.executable).parent / "accelerate"  # the venv's, as `accelerate` is on a person's PATH
        argv = [str(accelerate), "launch", *flags, "-m", module, *args, *_cheap(MODULES[module], args)]
        return subprocess.run(argv, cwd=self.path, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def _cheap(sub: str, args: list[str]) -> list[str]:
    flags = list(CHEAP[sub]) + [x for flag, v in CHEAP_IF_NAMED.items() if flag in args for x in (flag, v)]
    return flags + (TINY_MODEL if sub == "train" and "--init-from" not in args else [])


def _free_port() -> int:
    """A port nothing listens on now: the one the OS gives a socket bound to port 0, closed again."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Work:
    return Work(tmp_path_factory.mktemp("clone"))


# ---------------------------------------------------------------------------------------------------------------------
# the checks

def test_the_docs_hold_their_commands():
    """The extractor finds the docs' commands (a broken one finds few), knows every program, and no command hides in
    a fence without a language (those hold drawings: a line there that reads as a command belongs in ```bash)."""
    kinds = [c.kind for c in COMMANDS]
    assert len(COMMANDS) >= 85 and kinds.count("denoiser") >= 60 and kinds.count("accelerate") >= 5 \
        and kinds.count("python") >= 8, f"{len(COMMANDS)} commands: {sorted(set(map(str, kinds)))}"
    unknown = [f"{c.id}: {c.text}" for c in COMMANDS if c.program not in (*OURS, *NOT_OURS)]
    assert not unknown, "commands of a program the test does not know (add it to OURS or NOT_OURS):\n" + "\n".join(unknown)
    assert not untagged_commands(), untagged_commands()
    assert len({c.id for c in COMMANDS}) == len(COMMANDS)


@pytest.mark.parametrize("cmd", CHECKED, ids=[c.id for c in CHECKED])
def test_doc_command_starts_and_takes_its_flags(cmd, work, monkeypatch):
    what, args = _split(cmd)
    if cmd.kind == "denoiser" and what == "app":
        from denoiser.app.serve import _parse_args  # the app's parser: it checks --weights from the working folder

        monkeypatch.chdir(work.path)
        with mock.patch.dict(os.environ):  # where it leaves --max-work and the like for the app's modules
            _parse(_parse_args, args, "denoiser app")
    elif cmd.kind == "denoiser":
        from denoiser.cli.main import build_parser

        _parse(build_parser(what).parse_args, [what, *args], "denoiser")
    elif cmd.kind == "accelerate":
        assert cmd.argv[1] == "launch" and _launch(list(cmd.argv[2:])).module, "not `accelerate launch ... -m MODULE`"
        _check_python(["-m", what], args, cmd.env)
    elif cmd.kind == "python":
        _check_python(["-m", what] if cmd.argv[1] == "-m" else [what], args, cmd.env, cmd.script)
    elif cmd.kind == "make":
        assert re.search(rf"^{re.escape(what)}\s*:", (ROOT / "Makefile").read_text(), re.M), f"no make target {what}"
    elif cmd.kind == "pip":
        assert what == "install", f"pip {what}: the test knows pip install"
        _check_pip(args)
    elif cmd.kind == "bash":
        assert (ROOT / what).is_file(), f"no script {what}"
        assert subprocess.run(["bash", "-n", str(ROOT / what)]).returncode == 0, f"bash cannot read {what}"


def _check_python(entry: list[str], args: list[str], env: dict[str, str], script: str | None = None) -> None:
    """`python ENTRY [SUB] --help` starts and names every flag of args (SUB: a script's subcommand, `bench.guidance_table
    run`); a module of MODULE_PARSERS also parses them. script: the file a script line runs (Command.script)."""
    if script is not None:
        assert (ROOT / script).is_file(), f"no script {script}"
    sub = [] if script is None else args[: next((k for k, a in enumerate(args) if a.startswith("-")), len(args))]
    res = _help(tuple(entry + sub), tuple(sorted(env.items())))
    assert res.returncode == 0, f"python {' '.join(entry + sub)} --help failed ({res.returncode}):\n{res.stderr[-2000:]}"
    flags = {a.split("=", 1)[0] for a in args if re.match(r"--[A-Za-z]", a)}
    missing = sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", res.stdout))
    assert not missing, f"python {' '.join(entry + sub)} --help does not name {missing}"
    if entry[0] == "-m" and entry[1] in MODULE_PARSERS:
        _parse(MODULE_PARSERS[entry[1]]().parse_args, args, f"python -m {entry[1]}")


@functools.cache
def _help(argv: tuple[str, ...], env: tuple[tuple[str, str], ...]) -> subprocess.CompletedProcess:
    """`python *argv --help`, once per script or module."""
    return _python([*argv, "--help"], dict(env))


def _python(argv: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python *argv` (a script, or -m MODULE) as conftest.cli runs `denoiser`: a fork of its fork server, or a new
    interpreter where the environment is not the server's."""
    full = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    res = forked_cli.run(argv, str(cwd), full, TIMEOUT, python=True)
    if res is None:
        res = subprocess.run([sys.executable, *argv], cwd=cwd, env=full, capture_output=True, text=True, timeout=TIMEOUT)
    return res


def _check_pip(args: list[str]) -> None:
    """A pin the docs write is the project's own (Makefile, pyproject.toml); an extra they install exists."""
    project = (ROOT / "Makefile").read_text() + (ROOT / "pyproject.toml").read_text()
    pins = dict(re.findall(r"([A-Za-z0-9_.-]+)==([\w.]+)", project))
    section = project.split("[project.optional-dependencies]")[1].split("\n[")[0]
    extras = set(re.findall(r"^([\w-]+) = \[", section, re.M))
    for arg in (a for a in args if not a.startswith("-")):
        if m := re.fullmatch(r"\.\[([\w,-]+)\]", arg):
            assert set(m.group(1).split(",")) <= extras, f"pyproject.toml has no extra {m.group(1)}: {sorted(extras)}"
        else:
            name, _, version = arg.partition("==")
            assert pins.get(name) == version, f"the docs pin {arg}, the project {name}=={pins.get(name)}"


@pytest.mark.parametrize("cmd", CHECKED, ids=[c.id for c in CHECKED])
def test_doc_command_runs(cmd, work):
    """The command runs for real in the work folder (RUNS, CHEAP) and writes what it names."""
    why = work.why_not(cmd)
    if why is not None:
        pytest.skip(f"parsed only: {why}")
    res = work.run(cmd)
    assert res.returncode == 0, f"{cmd.id} failed ({res.returncode}): {cmd.text}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    for path in work.writes(cmd):
        where = work.path / path
        assert where.exists(), f"{cmd.id} did not write {path}: {cmd.text}"
        if where.suffix == ".png":
            with Image.open(where) as image:
                image.verify()
        elif where.name == "model":
            assert (where / "model_index.json").is_file(), f"{cmd.id}: {path} is no model folder"
        elif where.is_dir():
            assert any(where.iterdir()), f"{cmd.id}: {path} is empty"
    if cmd.kind == "accelerate":  # as many processes trained as the line asks for
        summary = json.loads((work.path / _value(list(cmd.argv), "--output-dir") / "train_summary.json").read_text())
        asked = _launch(list(cmd.argv[2:])).num_processes or 1
        assert [r["rank"] for r in summary["per_rank"]] == list(range(asked)), summary["per_rank"]


@pytest.mark.parametrize("module, argv", [("denoiser.train", []), ("denoiser.cli", ["train"])])
def test_python_m_exits_with_the_command_status(module, argv):
    """`python -m denoiser.train` (and `python -m denoiser.cli`) exit with the command's status: 2 for a config it
    refuses, 0 for --help (a __main__ that calls main() without sys.exit exits 0 after an error)."""
    bad = _python(["-m", module, *argv, "--config", "no-such-preset"])
    assert bad.returncode == 2 and "no-such-preset" in bad.stderr, (bad.returncode, bad.stderr[-2000:])
    assert _python(["-m", module, *argv, "--help"]).returncode == 0
