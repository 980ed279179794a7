"""The docs and the CLI agree: every command has `--help` with an example, and every
`fullthrottle ...` / `bin/envrun fullthrottle ...` / `make ...` command shown in README.md and
docs/*.md is accepted by the real parser (or the Makefile), or listed below with a reason.

And the docs document: their links resolve, they carry no dated journal entries, and
their benchmark figures, targets and sizes are generated (LATEST.json, the bench's registry)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fullthrottle.cli import COMMANDS, build_parser, main
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Commands shown in the docs that the parser is not asked to accept, each with the reason.
# Keys are the command as written (after `bin/envrun `), values why it is exempt.
EXCEPTIONS: dict[str, str] = {}
_PREFIXES = ("fullthrottle ", "make ")


def _commands_in(path: Path) -> list[tuple[str, int, str]]:
    """(file, line, command) for each command in fenced code blocks and inline code spans."""
    found = []
    in_block = False
    pending = ""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        candidates = []
        if in_block:
            text = pending + line.strip()
            if text.endswith("\\"):  # shell continuation: join with the next line
                pending = text[:-1] + " "
                continue
            pending = ""
            candidates.append(re.sub(r"^\$\s+", "", text))
        else:
            candidates += re.findall(r"`([^`]+)`", line)
        for text in candidates:
            text = re.sub(r"\s+#.*$", "", text.strip())  # a trailing shell comment
            if text.startswith("bin/envrun "):
                text = text[len("bin/envrun ") :]
            if not text.startswith(_PREFIXES):
                continue
            words = text.split()
            if len(words) > 1 and words[1].endswith(":"):
                continue  # output shown in the docs ("fullthrottle run: error: ..."), not a command
            found.append((path.name, number, text))
    return found


ALL_COMMANDS = [c for path in DOCS if path.exists() for c in _commands_in(path)]


def _subcommands() -> list[str]:
    """The names the parser accepts (a module `deploy_kit` may register `deploy-kit`)."""
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


SUBCOMMANDS = _subcommands()


def _make_targets() -> set[str]:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z0-9_.-]+):", makefile, flags=re.MULTILINE))


def test_the_docs_show_commands_at_all():
    shown = {c for _, _, c in ALL_COMMANDS}
    assert "make run" in shown and "make test" in shown
    # The own-data walkthrough's commands are among them.
    assert any(c.startswith("fullthrottle init ") for c in shown)
    assert any(c.startswith("fullthrottle doctor") for c in shown)


@pytest.mark.parametrize(
    ("doc", "line", "command"), ALL_COMMANDS, ids=[f"{d}:{n}" for d, n, _ in ALL_COMMANDS]
)
def test_every_command_in_the_docs_is_accepted(doc, line, command):
    if command in EXCEPTIONS:
        pytest.skip(EXCEPTIONS[command])
    # A usage synopsis ("fullthrottle ui [--port 5000]") is checked without its optional parts.
    synopsis = re.sub(r"\s*\[[^\[\]]*\]", "", command)
    while synopsis != command:
        command, synopsis = synopsis, re.sub(r"\s*\[[^\[\]]*\]", "", synopsis)
    argv = shlex.split(command, comments=True)
    if argv[0] == "make":
        targets = [a for a in argv[1:] if "=" not in a and not a.startswith("-")]
        unknown = set(targets) - _make_targets()
        assert not unknown, f"{doc}:{line}: `{command}` names no Makefile target {unknown}"
        return
    if len(argv) == 2 and argv[1] in SUBCOMMANDS:
        return  # a mention of the command by name in prose, e.g. "see `fullthrottle schema`"
    try:
        args = build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        assert exc.code == 0, f"{doc}:{line}: the CLI rejects `{command}`"
        return
    assert args.command in SUBCOMMANDS


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_command_has_help_with_an_example(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "Example" in text, f"`fullthrottle {name} --help` shows no example"
    example_lines = [
        line.strip()
        for line in text.split("Example", 1)[1].splitlines()
        if line.strip().startswith("fullthrottle ")
    ]
    assert example_lines, text
    for example in example_lines:  # the examples themselves parse
        # Help text annotates examples after two spaces: "fullthrottle run    (the bundled data)".
        example = re.sub(r"\s{2,}(\(.*\)|#.*)$", "", example)
        try:
            build_parser().parse_args(shlex.split(example)[1:])
        except SystemExit as err:
            assert err.code == 0, f"the example `{example}` in `{name} --help` does not parse"


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert len(SUBCOMMANDS) == len(COMMANDS)  # one subcommand per module in cli.COMMANDS
    for name in SUBCOMMANDS:
        assert name in text


def test_errors_are_one_paragraph_and_debug_shows_the_trace(tmp_path, capsys):
    missing = tmp_path / "nope.csv"
    assert (
        main(["init", "--data", str(missing), "--label", "y", "--output", str(tmp_path / "c.yaml")])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("fullthrottle init: error: data path") and str(missing) in err
    assert "Traceback" not in err
    # --debug adds the stack trace and keeps the exit status.
    args = ["init", "--data", str(missing), "--label", "y", "--output", str(tmp_path / "c.yaml")]
    assert main(["--debug", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "DataError: data path" in err
    assert "fullthrottle init: error: data path" in err


def test_help_prints_no_tensorflow_log_lines():
    """Every command loads TensorFlow; its C++ lines (oneDNN while it loads, `failed call to
    cuInit` without a GPU) are shown with --verbose only. --help, as a user starts it."""
    result = run_cli("--help")
    assert result.returncode == 0 and "usage: fullthrottle" in result.stdout
    assert result.stderr == ""


def test_processes_a_run_starts_that_load_tensorflow_print_no_load_notes(capfd):
    """Beam's SDK workers (`multi_processing` mode) are processes of their own that load
    TensorFlow: the run drops their load notes as it drops its own (core/native_logs.py). Here
    a child process loads TensorFlow as the run's environment has it (TF_CPP_MIN_LOG_LEVEL=3)
    and writes a note of absl's format and a line of its own."""
    from fullthrottle.core.native_logs import load_notes_dropped

    child = (
        "import os, tensorflow;"
        "os.write(2, b'I1207 22:10:21.739627     138 port.cc:153] a load note\\n');"
        "os.write(2, b'the line of its own\\n')"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    with load_notes_dropped():
        subprocess.run([sys.executable, "-c", child], env=env, check=True)
        print("and this process's line", file=sys.stderr, flush=True)
    err = capfd.readouterr().err
    assert err.splitlines() == ["the line of its own", "and this process's line"], err


def test_the_docs_benchmark_figures_are_generated_from_latest_json():
    import json

    from fullthrottle.bench import docs

    latest = json.loads(docs.LATEST_JSON.read_text(encoding="utf-8"))
    assert {p.resolve() for p in docs.PAGES} == {p.resolve() for p in DOCS}
    # Every generated block is exactly what LATEST.json (and the registry) renders to, so every
    # figure in it is the JSON's, and rewriting the pages from the JSON (as `fullthrottle bench`
    # does) changes nothing: a hand-edited figure, a stale one, or a block of a benchmark whose
    # reading LATEST.json lacks fails here.
    for path in DOCS:
        page = path.read_text(encoding="utf-8")
        assert docs.render_page(page, latest) == page, f"{path.name}: stale generated block"
    blocks = {name for path in DOCS for name in docs.blocks_in(path.read_text(encoding="utf-8"))}
    assert blocks == set(docs.BLOCKS), "every figure the generator writes is on some page"
    performance = docs.blocks_in((REPO / "docs" / "performance.md").read_text(encoding="utf-8"))
    assert {"latest", "targets", "sizes"} <= set(performance)


# What a benchmark figure looks like in prose: a ratio (0.90x), a rate of five or more digits
# (275,011), a rate in thousands (317k), a range of ratios (0.75-0.86), "17 s vs 47 s".
_FIGURE = re.compile(
    r"\b\d+\.\d+x\b|\b\d{2,3}(,\d{3})+\b|\b\d+,\d{3},\d{3}\b|\b\d+(\.\d+)?k\b"
    r"|\b0\.\d+-[01]\.\d+\b|\b\d+(\.\d+)? s vs \d+(\.\d+)? s\b"
)


@pytest.mark.parametrize("name", ["README.md", "performance.md"])
def test_the_benchmark_pages_quote_figures_only_in_generated_blocks(name):
    """README.md and docs/performance.md quote benchmark figures only inside generated blocks
    (checked against LATEST.json above): a figure typed into their prose goes stale unseen."""
    path = REPO / name if name == "README.md" else REPO / "docs" / name
    text = _outside_generated_blocks(path.read_text(encoding="utf-8"))
    found = [
        f"{name}:{number}: {match.group(0)}"
        for number, line in enumerate(text.splitlines(), start=1)
        for match in _FIGURE.finditer(line)
    ]
    assert not found, found
    # The check finds each kind of figure the pages once held in prose.
    for typed in ("2.3x", "275,011", "317k", "0.75-0.86", "17 s vs 47 s", "1,269,638"):
        assert _FIGURE.search(f"measured {typed} here"), typed
    assert not _FIGURE.search("one record per 1,024 rows, 48 tokens, >= 20%, batch 64")


def _outside_generated_blocks(text: str) -> str:
    from fullthrottle.bench.docs import outside_blocks

    return outside_blocks(text)


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_docs_document_and_keep_no_journal(path):
    # Dated entries, session notes and issue markers belong in commit messages; a measured
    # figure says on what machine, not when. The generated results block names its runs' times.
    text = _outside_generated_blocks(path.read_text(encoding="utf-8"))
    journal = re.compile(
        r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2}:\d\d UTC\b|\bthis (session|evening|morning|afternoon)\b"
        r"|\bissue \d+\b",
        re.IGNORECASE,
    )
    found = [
        f"{path.name}:{number}: {match.group(0)}"
        for number, line in enumerate(text.splitlines(), start=1)
        for match in journal.finditer(line)
    ]
    assert not found, found


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    anchors, in_block = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
        elif not in_block and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_links_in_the_docs_resolve(path):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto: ...
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists() or (
            anchor and linked.suffix == ".md" and anchor not in _anchors(linked)
        ):
            broken.append(target)
    assert not broken, f"{path.name}: links to nothing: {broken}"
