"""The shell commands of the docs, read as a person copies them: tests/project/test_doc_commands.py parses and runs them.

Where commands are: the lines of the ```bash, ```sh, ```shell and ```console fences of README.md, docs/*.md and
weights/*/README.md (in ```console, only the lines after a `$ ` prompt; the others are output). Every other fence
holds no command: an untagged one is a drawing or a listing (docs/architecture.md's trees), and `untagged_commands`
finds a line there that reads as a command, so that none hides from the test.

How a line is read, as the shell would: a line ending in `\\` goes on on the next one; `# ...` is a comment;
`&&`, `||`, `;` and `|` separate commands; `NAME=value` words before the program are its environment; `nice -n 10`,
`srun` and `bash -c '...'` wrap the command they run. What the docs write for a reader to fill in is filled in:
an optional `[--flag value]` is taken (its flag counts), `0|1` takes the first choice, a shell expansion (`$VAR`,
`$(...)`, `$((...))`) stands for 1, and VALUES gives the numbers a placeholder stands for. The folders the docs
name in capitals (MY_PHOTOS, ...) are made by the test's work folder, not here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import ROOT

SHELL_FENCES = ("bash", "sh", "shell", "console")
# the numbers a doc's placeholder stands for (`--max-work UNITS`): argparse checks a number's type
VALUES = {"UNITS": "1000", "S": "30"}
# the programs whose commands are this project's, by kind (how test_doc_commands checks and runs them)
OURS = {"denoiser": "denoiser", ".venv/bin/denoiser": "denoiser", "python": "python", "python3": "python",
        ".venv/bin/python": "python", "accelerate": "accelerate", "make": "make", "pip": "pip", ".venv/bin/pip": "pip",
        "bash": "bash"}
# other tools and shell builtins: nothing of this project's to check
NOT_OURS = ("mkdir", "git", "tar", "export", "cd", "scontrol", "head", "ls", "cp", "rm")
# the clone's folders of scripts, run as modules from its root (`python -m bench.x`, `python -m tools.emoji_text.x`):
# not the package's commands, so each is checked as a script is, by its --help
SCRIPT_PACKAGES = ("bench", "tools")
# programs that run the command after them; each one's options that take a value
WRAPPERS = {"nice": ("-n",), "srun": (), "time": ()}
DRAWING = re.compile(r"[\u2500-\u257f\u25b6\u25bc\u2190-\u21ff]")  # box drawing and arrows: a tree, not a command
_EXPANSION = re.compile(r"\$\(\((?:[^()]|\([^()]*\))*\)\)|\$\((?:[^()]|\([^()]*\))*\)|\$\{\w+\}|\$\w+")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_SEPARATORS = {"&&", "||", ";", "|"}


@dataclass(frozen=True)
class Command:
    doc: str  # the file, relative to the clone: README.md, docs/guidance.md
    line: int  # the doc's line where the command starts
    text: str  # the command as the doc writes it (continued lines joined, the comment left out)
    argv: tuple[str, ...]  # the program and its arguments, read as above
    env: dict[str, str] = field(default_factory=dict, hash=False)  # NAME=value before the program
    part: int = 0  # the command's place on its line (`a && b`: 0, 1)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}" + (f"+{self.part}" if self.part else "")

    @property
    def program(self) -> str:
        return self.argv[0]

    @property
    def kind(self) -> str | None:
        """OURS's kind of the program (None: another tool's)."""
        return OURS.get(self.program)

    @property
    def script(self) -> str | None:
        """The file a `python` line runs as a script, relative to the clone: `bench/x.py` for `python bench/x.py` and
        for `python -m bench.x` (a module of SCRIPT_PACKAGES); None for the package's modules and other programs."""
        if self.kind != "python" or len(self.argv) < 2:
            return None
        if self.argv[1] != "-m":
            return self.argv[1]
        module = self.argv[2] if len(self.argv) > 2 else ""
        return module.replace(".", "/") + ".py" if module.split(".")[0] in SCRIPT_PACKAGES else None


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "weights").glob("*/README.md"))]


def fences(path: Path) -> list[tuple[str, int, list[str]]]:
    """(info string, first line number, lines) of each fenced block of a Markdown file."""
    found, block = [], None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = re.match(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)", line)
        if block is None and m:
            block = (m.group(1), m.group(2).lower(), number + 1, [])
        elif block is not None and m and line.strip() == block[0][0] * len(line.strip()) and len(line.strip()) >= len(block[0]):
            found.append((block[1], block[2], block[3]))
            block = None
        elif block is not None:
            block[3].append(line)
    return found


def strip_comment(text: str) -> str:
    """`text` without its shell comment: a `#` that starts a word, outside quotes."""
    quote = None
    for k, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or text[k - 1].isspace()):
            return text[:k].rstrip()
    return text.rstrip()


def logical_lines(lines: list[str], first: int, console: bool = False) -> list[tuple[int, str]]:
    """(line number, text) of each command line of a block: continuations joined, comments and blank lines left out."""
    out, pending, start = [], "", first
    for number, raw in enumerate(lines, first):
        if not pending:
            if console and not raw.lstrip().startswith("$ "):
                continue  # a console block's output
            raw = raw.lstrip().removeprefix("$ ") if console else raw
            start = number
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        text = strip_comment(pending + raw).strip()
        pending = ""
        if text:
            out.append((start, text))
    return out


def _fill(tokens: list[str]) -> list[str]:
    """Optional groups opened (`[--at-step 40]`), choices (`0|1`) and placeholders (VALUES) filled."""
    out, group = [], False
    for token in tokens:
        if token.startswith("[-"):
            token, group = token[1:], True
        if group and token.endswith("]"):
            token, group = token[:-1], False
        if re.fullmatch(r"[\w.-]+(\|[\w.-]+)+", token):
            token = token.split("|")[0]
        out.append(VALUES.get(token, token))
    return out


def commands_of(text: str, doc: str, line: int) -> list[Command]:
    """The commands of one logical line."""
    tokens = shlex.split(_EXPANSION.sub("1", text))
    parts, current = [], []
    for token in tokens:
        if token in _SEPARATORS:
            parts.append(current)
            current = []
        else:
            current.append(token)
    parts.append(current)
    found = []
    for words in parts:
        env = {}
        while words and _ASSIGNMENT.match(words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        while words and words[0] in WRAPPERS:
            takes = WRAPPERS[words.pop(0)]
            while words and words[0].startswith("-"):
                words = words[2:] if words[0] in takes else words[1:]
        if words[:2] == ["bash", "-c"] and len(words) > 2:
            found += commands_of(words[2], doc, line)
        elif words:  # words left empty: only assignments (`MASTER=$(...)`), which run nothing
            found.append(Command(doc, line, text, tuple(_fill(words)), env))
    return [Command(c.doc, c.line, c.text, c.argv, c.env, part) for part, c in enumerate(found)]


def doc_commands() -> list[Command]:
    """Every command of the docs' shell fences, in the docs' order (each a line of OURS or NOT_OURS: the test says
    which when neither)."""
    found = []
    for path in docs():
        doc = path.relative_to(ROOT).as_posix()
        for info, first, lines in fences(path):
            if info in SHELL_FENCES:
                for number, text in logical_lines(lines, first, console=info == "console"):
                    found += commands_of(text, doc, number)
    return found


def untagged_commands() -> list[str]:
    """Lines of fences without a language that read as a command: a program of OURS first (after NAME=value words),
    a --flag after it, and no drawing character. Such a line belongs in a ```bash fence, where the test finds it."""
    found = []
    for path in docs():
        for info, first, lines in fences(path):
            if info:
                continue
            for number, line in enumerate(lines, first):
                words = [w for w in line.split() if not _ASSIGNMENT.match(w)]
                if words and words[0] in OURS and " --" in line and not DRAWING.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found
