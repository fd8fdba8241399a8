"""Docs = code (issue 70 item 4): every module, file, function and config key that the README, docs/*.md and the
package's own docstrings and comments name exists under that name. Read with `ast`, never imported, so the check
loads no torch.

What counts as a name: a path (`denoiser/app/engine.py`, `bench/README.md`), a dotted module path
(`denoiser.restore.chains.with_noise`), a module's or class's member (`tiles.photo_sigma`, `Engine.views`), a file
(`precision.py`, `precision.py`'s `choose_precision`), a config key (`data.label_column`: a field of the `data:`
section), and a backticked name in a package's `__init__.py` docstring (its list of the package's parts)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "denoiser"
EXTENSIONS = {"py", "md", "json", "jsonl", "txt", "csv", "yaml", "yml", "png", "jpg", "safetensors", "cpp", "sh",
              "arrow", "parquet", "pt", "cls", "h", "log", "npy", "tar", "whl", "toml", "gz", "zip", "webp", "svg"}
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


class _Index:
    """The package's modules and classes, and what each defines, from its source."""

    def __init__(self) -> None:
        self.modules: dict[str, Path] = {}  # dotted name -> file
        self.top: dict[str, set[str]] = {}  # dotted name -> names defined (or imported) at its top level
        self.classes: dict[str, list[tuple[set[str], list[str]]]] = {}  # class name -> [(members, base names)]
        self.by_stem: dict[str, list[str]] = {}  # "tiles" -> ["denoiser.restore.tiles"]
        # each subpackage's names: those it defines, uses or spells in a string (docstrings aside)
        self.identifiers: dict[str, set[str]] = {}
        for path in sorted(PACKAGE.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            name = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
            self.modules[name] = path
            if path.stem != "__init__":
                self.by_stem.setdefault(path.stem, []).append(name)
            self._read(name, ast.parse(path.read_text()))

    def _read(self, module: str, tree: ast.Module) -> None:
        docstrings = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, DOCUMENTED) and ast.get_docstring(n)}
        top, names = set(), set(module.split("."))
        for node in tree.body:
            top |= _defined(node)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                members = set()
                for item in node.body:
                    members |= _defined(item)
                for item in ast.walk(node):  # self.x = ... in its methods
                    if isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store) \
                            and getattr(item.value, "id", None) == "self":
                        members.add(item.attr)
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "?") for b in node.bases]
                self.classes.setdefault(node.name, []).append((members, bases))
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                names |= set(re.findall(IDENT, node.value))
        self.top[module] = top
        self.identifiers.setdefault(".".join(module.split(".")[:2]), set()).update(names)

    def class_has(self, cls: str, member: str, seen: frozenset = frozenset()) -> bool:
        """The class (any of that name) defines member, or inherits it from a base outside the package."""
        for members, bases in self.classes.get(cls, []):
            if member in members:
                return True
            for base in bases:
                if base not in self.classes or (base not in seen and self.class_has(base, member, seen | {cls})):
                    return True
        return False

    def module_has(self, module: str, chain: list[str]) -> bool:
        """module.chain[0].chain[1] exists: a top-level name (or a submodule), then a member of that class."""
        first = chain[0]
        if f"{module}.{first}" in self.modules:
            return len(chain) == 1 or self.module_has(f"{module}.{first}", chain[1:])
        if first not in self.top[module]:
            return False
        return len(chain) == 1 or first not in self.classes or self.class_has(first, chain[1])

    def dotted(self, name: str) -> bool:
        """`denoiser.a.b.c`: the longest module prefix, then its members."""
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if module in self.modules:
                return cut == len(parts) or self.module_has(module, parts[cut:])
        return False


def _defined(node: ast.stmt) -> set[str]:
    """The names a top-level (or class-body) statement binds."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.If, ast.Try, ast.With)):  # definitions under `if TYPE_CHECKING:`, try/except ImportError
        return set().union(*(_defined(n) for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)))
    return set()


@cache
def _index() -> _Index:
    return _Index()


@cache
def _config_fields() -> dict[str, set[str]]:
    """`data:` -> DataConfig's fields, ...: the YAML keys of a training config (`model:` is the UNet's arguments)."""
    index = _index()
    sections = {"data": "DataConfig", "diffusion": "DiffusionConfig", "train": "TrainConfig", "text": "TextConfig"}
    fields = {key: set().union(*(m for m, _ in index.classes[cls])) for key, cls in sections.items()}
    unet = ast.parse((PACKAGE / "model" / "unet.py").read_text())
    init = next(n for c in ast.walk(unet) if isinstance(c, ast.ClassDef) and c.name == "UNet"
                for n in c.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    fields["model"] = {a.arg for a in init.args.args + init.args.kwonlyargs}
    return fields


@cache
def _files_by_name() -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for folder in ("denoiser", "bench", "tools", "tests", "docs", "configs", "weights"):
        for path in (ROOT / folder).rglob("*"):
            if "__pycache__" not in path.parts:
                found.setdefault(path.name, []).append(path)
    for path in ROOT.iterdir():
        found.setdefault(path.name, []).append(path)
    return found


def _texts() -> list[tuple[str, str, bool]]:
    """(where, text, is_python) of README.md, docs/*.md, and each docstring and comment of the package."""
    texts = [(p.relative_to(ROOT).as_posix(), p.read_text(), False) for p in [ROOT / "README.md",
                                                                              *sorted((ROOT / "docs").glob("*.md"))]]
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        source, where = path.read_text(), path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, DOCUMENTED) and (doc := ast.get_docstring(node, clean=False)):
                line = node.body[0].lineno
                texts.append((f"{where}:{line}" + (" (package docstring)" if isinstance(node, ast.Module)
                              and path.stem == "__init__" else ""), doc, True))
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                texts.append((f"{where}:{tok.start[0]}", tok.string, True))
    return texts


def _path_exists(path: str) -> bool:
    if any(c in path for c in "*<>{}") or re.search(r"[A-Z]{3,}", path):  # a pattern or a placeholder (NAME)
        return True
    return (ROOT / path.rstrip(".")).exists()


def stale_names(texts: list[tuple[str, str, bool]]) -> list[str]:
    """What each text names that the checkout does not hold: '<where>: <name> (<why>)'."""
    index, fields, files = _index(), _config_fields(), _files_by_name()
    wrong = []
    for where, text, python in texts:
        spans = re.findall(r"`([^`\n]+)`", text)
        # paths: backticked ones anywhere; in the package's own text, the package's paths even when not backticked
        paths = [s for s in spans if re.fullmatch(r"(denoiser|bench|tools|tests|docs|configs|weights)/[\w./*-]*", s)]
        if python:
            paths += re.findall(r"(?<![\w/.-])(denoiser/[\w/.-]*\w)", text)
        wrong += [f"{where}: {p} (no such file)" for p in paths if not _path_exists(p)]
        # dotted module paths: backticked, or bare in the package's own text
        # (a quoted one is a string the code reads: model_index.json's old ["denoiser.unet", "UNet"])
        dotted = re.findall(rf"(?<![\w/.\"'])(denoiser(?:\.{IDENT})+)(?![\w/])", "\n".join(spans) if not python else text)
        wrong += [f"{where}: {d} (no such module or name)" for d in dotted if not index.dotted(d)]
        # `module.name` and `Class.member`, backticked; `module.name` bare too in the package's own text
        short = [s.removesuffix("()") for s in spans if re.fullmatch(rf"{IDENT}(\.{IDENT})+(\(\))?", s)]
        if python:
            short += [m for m in re.findall(rf"(?<![\w./`-])({IDENT}\.{IDENT})(?![\w/`(-])", text)
                      if m.split(".")[0] in index.by_stem]
        for name in short:
            head, member = name.split(".")[:2]
            if head == "denoiser" or member in EXTENSIONS:
                continue
            if head in fields and head not in index.by_stem:
                if member not in fields[head]:
                    wrong.append(f"{where}: {name} (the {head}: section has no {member})")
                continue
            modules = index.by_stem.get(head, [])
            # `Engine.views`; `jobs.stopper`, `page.app`: an instance named after its class (Jobs, Page)
            classes = [c for c in (head, head.title().replace("_", "")) if c in index.classes]
            if not modules and not classes:
                continue  # another library's (torch.compile, nn.Conv2d) or a variable (pipe.classes)
            ok = any(index.module_has(m, [member]) for m in modules) or any(index.class_has(c, member) for c in classes)
            ok = ok or (head in fields and member in fields[head])  # `text.max_length`: a config key
            if not ok:
                wrong.append(f"{where}: {name} (no {member} in {head})")
        # files: `name.py`, and `name.py`'s `function`
        for name in re.findall(r"`([\w-]+\.(?:py|cpp|sh|md))`", text):
            if name not in files:
                wrong.append(f"{where}: {name} (no such file)")
        for stem, member in re.findall(rf"`({IDENT})\.py`'s `({IDENT})", text):
            if not any(index.module_has(m, [member]) for m in index.by_stem.get(stem, [])):
                wrong.append(f"{where}: {stem}.py's {member} (not defined there)")
        # a subpackage's docstring lists its parts by name: each is one of its modules or a name its code holds
        if where.endswith("(package docstring)"):
            package = ".".join(Path(where.split(":")[0]).parent.parts[:2])
            defined = set().union(*index.top.values())  # or a module-level name elsewhere (`sampling_context`)
            wrong += [f"{where}: {s} (no module or name of that name in {package})" for s in spans
                      if re.fullmatch(IDENT, s) and s not in index.identifiers.get(package, ()) and s not in defined]
    return wrong


def test_the_docs_and_docstrings_name_modules_files_and_functions_that_exist():
    wrong = stale_names(_texts())
    assert not wrong, "names in the docs and docstrings that the code does not hold:\n" + "\n".join(wrong)


def test_the_check_catches_the_stale_names_the_review_found():
    """The names issue 70 item 4 found in docstrings, each in its old sentence: every one is reported."""
    old = [
        ("denoiser/app/__init__.py:1 (package docstring)",
         "The app's parts, each in its own file: `serve` (arguments), `layout` (the page), `handlers` (Generate)", True),
        ("denoiser/app/engine.py:1", "the words a page shows are the handlers' (denoiser/app/handlers.py).", True),
        ("denoiser/app/form.py:26", "# a result's PNG carries it (layout._wire orders the form's controls the same way)",
         True),
        ("denoiser/cli/sample.py:1", "a sampling request from the flags (`denoiser.cli.main.sampling_request`)", True),
        ("denoiser/restore/tiles.py:85", "seeded as every restore's noise is (`denoiser.restore.chains.add_noise`)", True),
        ("README.md", "`tiles.photo_sigma` and `tiles.no_such_estimate`; `data.label_column`, `data.no_such_key`; "
                      "`denoiser/sampling/registry.py` and `denoiser/folders/registry.py`; `handlers.py`", False),
    ]
    found = stale_names(old)
    for name in ("handlers (", "denoiser/app/handlers.py", "layout._wire", "denoiser.cli.main.sampling_request",
                 "denoiser.restore.chains.add_noise", "tiles.no_such_estimate", "data.no_such_key",
                 "denoiser/folders/registry.py", "handlers.py (no such file)"):
        assert any(name in line for line in found), f"{name} not reported: {found}"
    assert len(found) == 9, found  # and nothing else: the real names in the same sentences pass
