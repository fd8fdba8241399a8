"""The README's code runs as written: the "UNet in your own diffusers pipeline" block, line for line; and the
commands and files it names exist."""

from __future__ import annotations

import argparse
import functools
import re

import numpy as np
import pytest
import torch

from tests.conftest import ROOT


def _python_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow  # samples the shipped CIFAR-10 model and traces it whole
def test_pipeline_export_compile_checkpointing_block_runs(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # the block names weights/cifar10 relative to a clone
    code = _python_block("### The UNet in your own diffusers pipeline")
    scope: dict = {}
    torch._dynamo.reset()
    # The block's torch.compile is traced whole (fullgraph: a graph break still fails here) and run without inductor's
    # code generation, which took ~70 of this test's 104 s on one thread; inductor's output for this UNet is checked
    # against eager in tests/model/test_unet_contract.py.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    exec(compile(code, "README.md", "exec"), scope)
    assert type(scope["pipe"]).__name__ == "DenoiserPipeline"
    assert "'airplane', 'automobile'" in capsys.readouterr().out
    assert len(scope["images"]) == 4 and scope["images"][0].size == (32, 32)
    arrays = scope["arrays"]
    assert isinstance(arrays, np.ndarray) and arrays.shape == (4, 32, 32, 3) and 0 <= arrays.min() <= arrays.max() <= 1
    assert isinstance(scope["exported"], torch.export.ExportedProgram)
    assert scope["eps"].shape == (2, 3, 32, 32)
    unet = scope["unet"]
    assert unet.is_gradient_checkpointing and all(p.grad is not None for p in unet.parameters() if p.requires_grad)
    assert unet.conv_in.weight.dtype == torch.float8_e4m3fn  # layerwise casting: stored in fp8


def _package_table(text: str) -> str:
    start = text.index("### The package")
    return text[start:text.index("\n### ", start + 1)]


def test_readme_names_every_subcommand_and_module():
    """Every `denoiser` subcommand appears in the README's shell fences (read by tests/project/doc_commands.py, whose test
    parses and runs each line), and the package table names every module and only paths that exist."""
    from denoiser.cli.main import build_parser
    from tests.project.doc_commands import doc_commands

    text = (ROOT / "README.md").read_text()
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    shown = {c.argv[1] for c in doc_commands() if c.doc == "README.md" and c.kind == "denoiser" and len(c.argv) > 1}
    assert set(subparsers) <= shown, f"subcommands missing from the README's shell fences: {set(subparsers) - shown}"

    named = set(re.findall(r"`(denoiser/[^`\s]*)`", _package_table(text)))
    missing = sorted(p for p in named if not ((ROOT / p).is_dir() if p.endswith("/") else (ROOT / p).is_file()))
    assert not missing, f"the README's package table names paths that do not exist: {missing}"
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "denoiser").rglob("*.py")
               if "__pycache__" not in p.parts and "presets" not in p.parts}
    assert modules <= named, f"modules missing from the README's package table: {sorted(modules - named)}"


def test_readme_speed_figures_are_the_ones_its_cited_files_hold():
    """Issue 52: each speed ratio in the README ("1.33x") appears in the bench file cited right after it, so the
    sentence cannot drift from the measurement (before: the README said 1.42x where the file said 1.21x)."""
    text = (ROOT / "README.md").read_text()
    checked, wrong, start = 0, [], 0
    # a block's figures (a paragraph, a whole list, a table row) belong to the one file it cites: what a reader (or a
    # checker) takes them for, wherever in the block the citation sits; a list without blank lines is one paragraph
    for block in re.split(r"\n(?=\s*\n|\||#)", text):
        cites, figures = set(re.findall(r"\]\((bench/[^)\s]+)\)", block)), re.findall(r"(\d+\.\d+)x\b", block)
        assert len(cites) <= 1 or not figures, f"one cited file a block with figures: {block.strip()[:300]}"
        for cited in cites:
            held = (ROOT / cited).read_text()
            wrong += [f"{f}x is not in {cited}" for f in figures if not re.search(rf"(?<![\d.]){re.escape(f)}(?!\d)", held)]
    for link in re.finditer(r"\]\((bench/[^)\s]+)\)", text):
        span = text[start : link.start()]
        start = link.end()
        cited = (ROOT / link.group(1)).read_text()
        for figure in re.findall(r"(\d+\.\d+)x\b", span):
            checked += 1
            if not re.search(rf"(?<![\d.]){re.escape(figure)}(?!\d)", cited):
                wrong.append(f"{figure}x is not in {link.group(1)}")
    assert checked >= 3 and not wrong, wrong


def test_the_package_imports_in_no_circle():
    """Every import between the package's modules, lazy ones inside functions included, points one way: the file
    list reads as a data flow (a module's imports never come back to it)."""
    import ast

    modules = {p.relative_to(ROOT).with_suffix("").as_posix().replace("/", "."): p
               for p in (ROOT / "denoiser").rglob("*.py") if "__pycache__" not in p.parts}
    modules = {name.removesuffix(".__init__"): path for name, path in modules.items()}
    edges = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            edges[name] |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    done, path, circles = set(), [], []

    def visit(node: str) -> None:
        if node in path:
            circles.append(" -> ".join(path[path.index(node):] + [node]))
            return
        if node in done:
            return
        path.append(node)
        for nxt in sorted(edges[node]):
            visit(nxt)
        path.pop()
        done.add(node)

    for name in sorted(modules):
        visit(name)
    assert not circles, "import circles:\n" + "\n".join(circles[:10])


# the rooms of denoiser/ in the order the data flows (docs/architecture.md): a room imports only rooms before it
ROOMS = ("fast", "data", "model", "folders", "sampling", "restore", "evaluate", "train", "app", "cli")


def test_no_room_imports_one_after_it_in_the_flow():
    """Issue 59: the file list is the architecture. Each subpackage of denoiser/ imports only the top level (what
    every room shares) and the rooms before it in ROOMS, lazy imports inside functions included (type-checking
    imports are no dependency); the top level imports no room, except the package's face (denoiser/__init__.py)."""
    import ast

    rooms = sorted(p.name for p in (ROOT / "denoiser").iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert sorted(ROOMS) == rooms, f"ROOMS and docs/architecture.md should list every subpackage: {rooms}"

    def room(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[1] in ROOMS else "top"

    wrong = []
    for path in (ROOT / "denoiser").rglob("*.py"):
        name = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
        if name == "denoiser.__init__" or "presets" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and getattr(node.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(node)}
        here = room(name)
        allowed = {"top", here} | set(ROOMS[: ROOMS.index(here)] if here != "top" else ())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("denoiser") \
                    and id(node) not in typing_only and room(node.module) not in allowed:
                wrong.append(f"{name} imports {node.module}")
    assert not wrong, "imports against the flow:\n" + "\n".join(sorted(wrong))


def test_readme_names_the_rooms_in_import_order_and_lists_each_module_in_its_room():
    """Issue 70 item 4: the README gave the rooms as data → model → train → folders → ..., though ROOMS (the order the
    imports keep) has train after evaluate, and listed sampling/pipeline.py, sampling/registry.py and
    model/diffusers_warnings.py under folders. Its chain of rooms is ROOMS, its table's rows come in that order, and
    each row lists only its room's files (the shared row: the top level's)."""
    table = _package_table((ROOT / "README.md").read_text())
    chain = re.search(r"`\w+/`(?:\s*→\s*`\w+/`)+", table)
    assert chain, "the README's package section gives its rooms as `a/` → `b/` → ..."
    assert tuple(re.findall(r"`(\w+)/`", chain.group(0))) == ROOMS, f"the README's room order: {chain.group(0)}"
    rows = re.findall(r"^\| ([\w ()]+?) \| (.*) \|$", table, re.M)
    rooms = [name.split()[0] for name, _ in rows if name != "room"]
    assert rooms == ["shared", *ROOMS], f"the table's rows, in order: {rooms}"
    misplaced = [f"{path} (in the {room} row)" for room, paths in
                 ((name.split()[0], re.findall(r"`(denoiser/[^`\s]*)`", cells)) for name, cells in rows)
                 for path in paths
                 if not (re.fullmatch(r"denoiser/[\w.]+", path) if room == "shared" else path.startswith(f"denoiser/{room}/"))]
    assert not misplaced, f"files listed in another room's row: {misplaced}"


@pytest.mark.parametrize("folder, at_least", [("bench", 25), ("tools", 10)])
def test_bench_readme_names_every_bench_script(folder, at_least):
    """Issue 70 item 4: bench/README.md said it listed every benchmark script and missed 8. Every script in bench/ (and
    in tools/, issue 73) and its folders (a file run as __main__; a helper module that scripts import needs no row) is
    named in the folder's README.md, by its path under the folder in backticks."""
    text = (ROOT / folder / "README.md").read_text()
    scripts = [p for p in [*(ROOT / folder).glob("*.py"), *(ROOT / folder).glob("*/*.py")]
               if re.search(r"""^if __name__ == ["']__main__["']""", p.read_text(), re.M)]
    assert len(scripts) >= at_least, f"found only {len(scripts)} scripts in {folder}/"
    missing = sorted(rel for p in scripts if f"`{(rel := p.relative_to(ROOT / folder).as_posix())}`" not in text)
    assert not missing, f"scripts {folder}/README.md does not name: {missing}"
