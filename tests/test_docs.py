"""The docs point at things that exist, and the commands they show parse.

README.md and docs/*.md are read as a newcomer reads them:

- every repository path they name (``stability/report/evidence/fetch.py``,
  ``conf/study/adding.yaml``, a relative Markdown link) exists; paths under generated folders
  (``reports/``, ``multirun/``, ``benchmarks/results/``), placeholders (``<sweep_id>``) and
  ``COMMIT:path`` (a file of an older commit) are not checked;
- every dotted name under ``stability.``, ``benchmarks.`` or ``hydra_plugins.`` resolves to a
  module file, and the name after the module (if any) is defined in it;
- every command they show, in a ```` ```bash ```` block or on a ``$ `` line of a
  ```` ```console ```` block, parses with the real parser: Hydra entry points
  (``python experiments/sweep.py``, ``stability sweep|report|check``) compose their config with
  the given overrides in-process, without running (the first value of a sweep stands for it);
  argparse entry points (``stability ui|sync``, ``experiments/benchmark.py|sync.py``,
  ``python -m MODULE``) parse their arguments and stop there; ``make TARGET`` names a target
  of the Makefile. Other programs (pip, docker, curl, pytest, ...) are not checked.

The checker is tested on planted mistakes too, so a test here can fail.
"""

from __future__ import annotations

import argparse
import functools
import glob
import os
import re
import runpy
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150

# Top-level folders of the repository whose paths a doc may name; a path under a generated
# folder is output, not source.
SOURCE_ROOTS = ("stability", "experiments", "conf", "tests", "examples", "docs", "hydra_plugins",
                "benchmarks")
GENERATED = ("benchmarks/results/",)
TOP_FILES = ("Makefile", "pyproject.toml", "docker-compose.yml")
ROOTS_ALT = "|".join(SOURCE_ROOTS)
TOPS_ALT = "|".join(re.escape(f) for f in TOP_FILES)
PATH_RE = re.compile(rf"(?<![\w./:@$-])((?:{ROOTS_ALT})/[\w.*{{}},/-]*)")
TOP_RE = re.compile(rf"(?<![\w./-])({TOPS_ALT})(?![\w.-])")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
DOTTED_RE = re.compile(r"(?<![\w./:-])((?:stability|benchmarks|hydra_plugins)(?:\.\w+)+)")
STRING_RE = re.compile(r"[\"']((?:stability|benchmarks|hydra_plugins)(?:\.\w+)+)[\"']")
FENCE_RE = re.compile(r"^\s*```(\w*)\s*$")
SHELL_LANGS = ("bash", "sh", "shell")

# Hydra entry points: the config each composes (experiments/X.py and `stability X` alike).
HYDRA_CONFIGS = {"sweep": "config", "report": "report", "check": "check"}
ARGPARSE_SCRIPTS = ("experiments/benchmark.py", "experiments/sync.py", "experiments/gpu_check.py",
                    "experiments/report_identity.py")
PYTHONS = re.compile(r"^(?:\S*/)?python(?:3(?:\.\d+)?)?$")


@dataclass(frozen=True)
class Command:
    """One command a doc shows: where, the folder it runs in, and its words."""

    doc: str
    line: int
    cwd: Path
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


@dataclass(frozen=True)
class Doc:
    """A Markdown file split into prose, shell commands and Python blocks."""

    name: str
    folder: Path
    prose: str
    commands: tuple[Command, ...]
    python: str


def read_doc(name: str, text: str, folder: Path) -> Doc:
    """Split ``text`` (Markdown) into what the checks read.

    Args:
        name: The doc's name in messages.
        text: Its Markdown.
        folder: The folder its relative links start from.

    Returns:
        The prose (outside fenced blocks), the commands of shell and console blocks (with the
        folder each runs in, following ``cd`` within a block), and the Python blocks' text.
    """
    prose: list[str] = []
    python: list[str] = []
    commands: list[Command] = []
    lang: str | None = None
    cwd = ROOT
    pending = ""
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE_RE.match(line)
        if fence:
            if lang is None:
                lang, cwd, pending = fence.group(1), ROOT, ""
            else:
                lang = None
            continue
        if lang is None:
            prose.append(line)
        elif lang == "python":
            python.append(line)
        elif lang in SHELL_LANGS or (lang == "console" and (pending or line.startswith("$ "))):
            body = line[2:] if lang == "console" and not pending else line
            if not pending:
                start = number
            if body.rstrip().endswith("\\"):
                pending += body.rstrip()[:-1] + " "
                continue
            full = (pending + body).strip()
            pending = ""
            if not full or full.startswith("#"):
                continue
            for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", full):
                words = _words(part)
                if words[:1] == ["cd"] and len(words) == 2:
                    cwd = (cwd / words[1]).resolve()
                    commands.append(Command(doc=name, line=start, cwd=cwd, text=part))
                elif words:
                    commands.append(Command(doc=name, line=start, cwd=cwd, text=part))
    return Doc(name, folder, "\n".join(prose), tuple(commands), "\n".join(python))


def _words(command: str) -> list[str]:
    command = re.sub(r"<[^<>\s]*>", "x", command)  # a placeholder (<id>) stands for a value
    try:
        return shlex.split(command, comments=True)
    except ValueError:  # an unbalanced quote: kept whole, so the command check reports it
        return [command]


def load(path: Path) -> Doc:
    """The doc at ``path``, read by :func:`read_doc`."""
    path = path.resolve()
    return read_doc(str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"), path.parent)


# ----------------------------------------------------------------------------- paths


def _expand(path: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    head, tail = path[:match.start()], path[match.end():]
    return [p for alt in match.group(1).split(",") for p in _expand(head + alt + tail)]


def _exists(path: Path) -> bool:
    return bool(glob.glob(str(path))) if "*" in str(path) else path.exists()


def missing_paths(doc: Doc) -> list[str]:
    """Repository paths and relative links named by ``doc`` that do not exist.

    Args:
        doc: The doc, as :func:`read_doc` split it.

    Returns:
        One ``"path (how it was named)"`` per missing path, in order of appearance.
    """
    text = doc.prose + "\n" + "\n".join(c.text for c in doc.commands)
    missing: list[str] = []
    for raw in PATH_RE.findall(text):
        path = re.sub(r"(:\d[\d,-]*)$", "", raw.rstrip(".,;:)`'\""))
        path = path.split("#")[0]
        if "<" in path or "..." in path or path.startswith(GENERATED):
            continue
        for one in _expand(path):
            if not _exists(ROOT / one):
                missing.append(f"{one} (named as {raw})")
    for top in TOP_RE.findall(text):
        if not (ROOT / top).exists():
            missing.append(f"{top} (a top-level file)")
    for target in LINK_RE.findall(doc.prose):
        if re.match(r"^[a-z]+:", target):
            continue
        link, _, anchor = target.partition("#")
        if link and not _exists(doc.folder / link):
            missing.append(f"{link} (a link)")
        elif anchor and (not link or link.endswith(".md")):
            prose = load(doc.folder / link).prose if link else doc.prose
            if anchor not in anchors(prose):
                missing.append(f"{target} (no such heading)")
    return missing


def anchors(prose: str) -> set[str]:
    """The anchors GitHub gives the headings of a doc's prose (outside fenced blocks).

    Args:
        prose: The doc's text outside fenced blocks.

    Returns:
        Each heading's slug (lower case, punctuation dropped, spaces to hyphens), with ``-1``,
        ``-2`` ... for repeats.
    """
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", prose, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def unresolved_names(doc: Doc) -> list[str]:
    """Dotted names (``stability.x.y[.attr]``) in ``doc`` that name no module or definition.

    A name the code spells as a string (an MLflow tag such as ``stability.kind``, a resolver)
    is data, not a module. Otherwise the longest prefix that is a module file or package is the
    module; the next name, if any, must be defined there (``def``, ``class``, an assignment or
    an import).

    Args:
        doc: The doc, as :func:`read_doc` split it.

    Returns:
        One message per name that does not resolve.
    """
    text = doc.prose + "\n" + "\n".join(c.text for c in doc.commands) + "\n" + doc.python
    bad: list[str] = []
    for name in dict.fromkeys(DOTTED_RE.findall(text)):
        if name in code_strings():
            continue
        parts = name.split(".")
        module, rest = None, parts
        for i in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:i])
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    module, rest = candidate, parts[i:]
                    break
            if module:
                break
        if module is None:
            bad.append(f"{name}: no module {parts[0]}/...")
        elif rest and not _defines(module, rest[0]):
            bad.append(f"{name}: {module.relative_to(ROOT)} defines no {rest[0]!r}")
    return bad


@functools.cache
def code_strings() -> frozenset[str]:
    """Dotted names the code writes as string literals (tag keys, resolver names)."""
    found: set[str] = set()
    for folder in ("stability", "hydra_plugins"):
        for source in (ROOT / folder).rglob("*.py"):
            found.update(STRING_RE.findall(source.read_text(encoding="utf-8")))
    return frozenset(found)


def _defines(module: Path, attr: str) -> bool:
    source = module.read_text(encoding="utf-8")
    name = re.escape(attr)
    return bool(re.search(rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^\s*{name}\s*[:=]"
                          rf"|^\s*(?:from\s+\S+\s+)?import\s[^\n]*\b{name}\b", source, re.M))


# ----------------------------------------------------------------------------- commands


class Parsed(BaseException):
    """Raised by the argparse seam once the real parser has accepted the arguments."""


@contextmanager
def parse_only() -> Iterator[None]:
    """A seam that stands in for the rest of a command: ``ArgumentParser.parse_args`` parses
    with the real parser, then raises :class:`Parsed`, so nothing after parsing runs."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):  # noqa: ANN001, ANN202
        original(self, args, namespace)
        raise Parsed

    from stability import cli

    store_check = cli.missing_store  # where the store is is the machine's, not the doc's
    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign]
    cli.missing_store = lambda argv: None  # type: ignore[assignment]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        cli.missing_store = store_check  # type: ignore[assignment]


def _argparse(run: object, argv: list[str], label: str, cwd: Path | None = None) -> str | None:
    """Run an entry point with ``argv`` under :func:`parse_only`: None once its parser accepts.

    It runs in ``cwd`` when given (the folder the doc's command runs in: ``--config-dir .``
    is read there). The import path, ``$PYTHONPATH``, ``sys.argv`` (which ``stability`` and
    the scripts set before parsing) and the working folder are restored afterwards.
    """
    saved = list(sys.argv), list(sys.path), os.environ.get("PYTHONPATH")
    here = os.getcwd()
    sys.argv = [label, *argv]
    if cwd is not None:
        os.chdir(cwd)
    try:
        with parse_only():
            run()  # type: ignore[operator]
    except Parsed:
        return None
    except SystemExit as stop:
        return f"the parser refused {argv} (exit {stop.code})"
    finally:
        os.chdir(here)
        sys.argv[:], sys.path[:] = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved[2]
    return "the command ran without parsing any arguments"


def hydra_error(config: str, argv: list[str], cwd: Path) -> str | None:
    """Compose ``config`` with a Hydra command line, as the entry point would, without running.

    Args:
        config: The primary config's name (``config``, ``report``, ``check``).
        argv: The arguments after the script or subcommand.
        cwd: The folder the command runs in (``--config-dir`` is relative to it).

    Returns:
        None when it composes, else why not.
    """
    overrides: list[str] = []
    words = list(argv)
    while words:
        word = words.pop(0)
        if word in ("-m", "--multirun"):
            continue
        if word in ("-v", "--verbose"):
            overrides.append("hydra.sweeper.verbose=true")
        elif word in ("--config-dir", "-cd"):
            folder = (cwd / words.pop(0)).resolve()
            if not folder.is_dir():
                return f"--config-dir {folder} is not a folder"
            overrides.append(f"hydra.searchpath=[file://{folder}]")
        elif word in ("--cfg", "-c"):
            if words.pop(0) not in ("job", "hydra", "all"):
                return f"{word} takes job, hydra or all"
        elif word in ("--package", "-p"):
            words.pop(0)
        elif word.startswith("-"):
            return f"unknown option {word}"
        else:
            overrides.append(word)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as err:  # Hydra's own message says which override and why
        return f"overrides do not parse: {err}"
    single = [f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}"
              if o.is_sweep_override() else o.input_line for o in parsed]
    if GlobalHydra.instance().is_initialized():  # left by an earlier test in this process
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            compose(config_name=config, overrides=single, return_hydra_config=True)
    except Exception as err:  # noqa: BLE001 - any composition error is the finding
        return f"does not compose: {type(err).__name__}: {err}"
    return None


def command_error(command: Command, makefile_targets: set[str]) -> str | None:
    """Check one shown command with the parser it would meet.

    Args:
        command: The command.
        makefile_targets: The targets the Makefile defines.

    Returns:
        None when it parses (or is another program's), else why not.
    """
    words = _words(command.text)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value prefixes
        words.pop(0)
    if not words:
        return None
    program, args = words[0], words[1:]
    if program == "cd":
        return None if command.cwd.is_dir() else f"no folder {command.cwd}"
    if program == "make":
        unknown = [t for t in args if not t.startswith("-") and "=" not in t
                   and t not in makefile_targets]
        return f"no Makefile target {unknown}" if unknown else None
    if program == "stability":
        if not args:
            return "stability needs a subcommand"
        sub, rest = args[0], args[1:]
        from stability import cli

        if sub in HYDRA_CONFIGS:  # Hydra's own parser, as `stability` calls it, then the config
            return (_argparse(lambda: cli.main([sub, *rest]), rest, "stability", command.cwd)
                    or hydra_error(HYDRA_CONFIGS[sub], rest, command.cwd))
        if sub == "ui":
            return _argparse(lambda: cli.ui(rest), rest, "stability ui")
        if sub == "sync":
            return _argparse(lambda: cli.sync(rest), rest, "stability sync")
        return f"unknown subcommand {sub!r}: allowed values are {', '.join(cli.COMMANDS)}"
    if Path(program).name == "torchrun":
        while args and args[0].startswith("-"):
            args.pop(0)
        program, args = "python", args
    if not PYTHONS.match(program):
        return None
    if args[:1] == ["-m"]:
        module = args[1]
        base = ROOT.joinpath(*module.split("."))
        source = next((p for p in (base.with_suffix(".py"), base / "__main__.py")
                       if p.is_file()), None)
        if source is None:
            return None if not module.startswith(("stability", "benchmarks")) else \
                f"no module {module}"
        if "ArgumentParser" not in source.read_text(encoding="utf-8"):
            return None
        return _argparse(lambda: runpy.run_module(module, run_name="__main__"), args[2:],
                         module)
    if not args or args[0].startswith("-"):
        return None
    script = args[0]
    path = (command.cwd / script).resolve()
    if not path.is_file():
        return f"no script {script}"
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else script
    if rel in ARGPARSE_SCRIPTS:
        return _argparse(lambda: runpy.run_path(str(path), run_name="__main__"), args[1:], rel)
    name = Path(rel).stem
    if rel.startswith("experiments/") and name in HYDRA_CONFIGS:
        return (_argparse(lambda: runpy.run_path(str(path), run_name="__main__"), args[1:], rel)
                or hydra_error(HYDRA_CONFIGS[name], args[1:], command.cwd))
    return f"{rel}: not an entry point this test knows how to parse"


def makefile_targets() -> set[str]:
    """The targets the Makefile defines (``name:`` at the start of a line)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M))


# ----------------------------------------------------------------------------- the tests

LOADED = [load(p) for p in DOCS]
COMMANDS = [c for d in LOADED for c in d.commands]


@pytest.mark.parametrize("doc", LOADED, ids=lambda d: d.name)
def test_every_path_a_doc_names_exists(doc: Doc) -> None:
    assert missing_paths(doc) == []


@pytest.mark.parametrize("doc", LOADED, ids=lambda d: d.name)
def test_every_dotted_module_name_resolves(doc: Doc) -> None:
    assert unresolved_names(doc) == []


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_shown_command_parses(command: Command) -> None:
    assert command_error(command, makefile_targets()) is None


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES
    first_screen = "\n".join(lines[:30])
    assert "make run" in first_screen and "make test" in first_screen
    assert "python experiments/sweep.py -m" in "\n".join(lines)


def test_the_checks_read_commands_from_the_docs() -> None:
    shown = {c.text.split("#")[0].strip() for c in COMMANDS}
    assert "make run" in shown and "make test" in shown
    assert any(c.startswith("stability sweep -m") for c in shown)


# ----------------------------------------------------------------------------- planted mistakes

PLANTED = """\
See [the report](report.md#outputs), [a section](sweeps.md#no-such-section), [below](#below),
`stability/report/no_such_module.py`,
`conf/study/{adding,nosuch}.yaml` and `stability.core.step.NoSuchThing`; output goes to
`reports/<sweep_id>/report.md` and `benchmarks/results/bench.json` (generated) and
`git show 1e932ca:benchmarks/bulk.py` (an old commit).

```bash
make run
make no-such-target
python experiments/sweep.py -m clip.max_nrom=1,5
python experiments/sweep.py -m seed=0,1 precision=fp32,bf16 +study=adding
stability report experiment=x task_target=my.Task
stability ui --prot 5000
python experiments/benchmark.py --part nosuch
python experiments/report.py --no-such-flag
cd examples/own_task
stability sweep -m --config-dir . task=my_task
```

```console
$ stability sweep -m seed=0,1 hydra.sweeper.dry_run=true
[sweep] would run: stability/not/checked.py
```
"""


def test_the_checks_find_planted_mistakes() -> None:
    doc = read_doc("planted.md", PLANTED, ROOT / "docs")
    assert missing_paths(doc) == [
        "stability/report/no_such_module.py (named as stability/report/no_such_module.py)",
        "conf/study/nosuch.yaml (named as conf/study/{adding,nosuch}.yaml)",
        "sweeps.md#no-such-section (no such heading)",
        "#below (no such heading)",
    ]
    assert unresolved_names(doc) == [
        "stability.core.step.NoSuchThing: stability/core/step.py defines no 'NoSuchThing'"]
    targets = makefile_targets()
    verdicts = {c.text: command_error(c, targets) for c in doc.commands}
    failing = {text for text, error in verdicts.items() if error}
    assert failing == {"make no-such-target", "python experiments/sweep.py -m clip.max_nrom=1,5",
                       "stability ui --prot 5000", "python experiments/benchmark.py --part nosuch",
                       "python experiments/report.py --no-such-flag"}
    assert "clip.max_nrom" in verdicts["python experiments/sweep.py -m clip.max_nrom=1,5"]
    assert len(doc.commands) == 11  # the console block's output line is not a command


def test_the_readme_answer_is_the_reports_terminal_answer() -> None:
    """README's "The answer, as the report prints it" block has the shape ``stability report``
    prints (``sections.answer.first_screen(plain=True)``): its table has the answer table's
    columns in its layout, then the guarantee, the sealed test and the stability line. Its
    numbers are one CPU's, so the section names where they were produced (CPU, torch build,
    date) and claims across machines only the chosen config, the one the block's first line
    names; no test pretends the numbers are what every machine prints (issue 58)."""
    import re

    import torch

    from stability.report.present import answer_table

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The answer, as the report prints it", 1)[1]
    intro, block_text = section.split("```text\n", 1)
    block = block_text.split("```", 1)[0].splitlines()
    assert block[0].startswith("Train with `") and "chosen factor by factor from all" in block[0]
    intro = " ".join(intro.split())
    made = re.search(r"Produced on: (?P<cpu>[^,]+), torch (?P<torch>\S+), "
                     r"(?P<date>\d{4}-\d\d-\d\d)", intro)
    assert made, "the answer's provenance line: 'Produced on: <CPU>, torch <build>, <date>'"
    assert re.search(r"EPYC|Xeon|Core|Ryzen|Graviton|Apple", made["cpu"]), made["cpu"]
    # the torch build the Makefile pins (the numbers are that build's)
    pinned = re.search(r"^TORCH\s*:=\s*torch==(\S+)", (ROOT / "Makefile").read_text(), re.M)
    assert pinned and made["torch"].split("+")[0] == pinned[1], (made["torch"], pinned)
    assert torch.__version__.split("+")[0] == pinned[1]  # the suite runs that build too
    chosen = re.match(r"Train with `([^`]+)`", block[0])
    assert chosen and f"chosen config, `{chosen[1]}`" in intro, \
        "the part said to hold across machines is the block's chosen config"
    header = next(i for i, line in enumerate(block) if line.startswith("factor "))
    assert re.split(r"\s{2,}", block[header].strip()) == answer_table.HEADER
    assert set(block[header + 1].replace(" ", "")) == {"-"}
    rows = block[header + 2:block.index("", header)]
    assert any(r.startswith("Clipping ") for r in rows) and any("→ " in r for r in rows)
    rest = block[block.index("", header) + 1:]
    assert rest[0].startswith("Guarantee: ")
    assert any(r.startswith("Sealed test (split of ") for r in rest)
    assert any(r.startswith("Stability: ") for r in rest)
