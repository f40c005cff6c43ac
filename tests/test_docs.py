"""The documentation builds and its code blocks run.

`mkdocs build --strict` must succeed (a broken link or a page missing from the navigation fails
it), and every fenced ```python, ```bash, ```sh or ```shell block of README.md and docs/*.md is
either run or marked as not runnable, with a reason. The marker is an HTML comment on the last
non-blank line before the block (the site shows nothing of it):

    <!-- run -->                  run the block alone: `python` for Python, `bash -e` for shell
    <!-- run: np=2 -->            Python only: run it as a job of 2 ranks through horovodlikerun
    <!-- run: group=NAME -->      blocks of one page with the same group are joined, in order,
                                  into one script, run where the group's first block stands (the
                                  options of all its blocks apply, a later one's winning); so a
                                  page may show a script in parts
    <!-- run: expect="TEXT" -->   the output must contain TEXT as well (repeatable)
    <!-- run: timeout=S -->       seconds the block may take (default 120)
    <!-- run: requires=MODULE --> skipped, as the suite's own tests of it are, when MODULE
                                  (e.g. tensorflow) cannot be imported
    <!-- skip: REASON -->         not run, e.g. it needs a GPU, several hosts or a Spark cluster

Blocks check their own results with `assert` where that is cheap (an allreduce's value, a
rank's share of the data): a block that raises or exits non-zero fails its test. Blocks run in a
scratch folder holding links to the repository's examples/, benchmarks/ and scripts/, with
`horovodlikerun` and `python` on PATH, and the horovodlike that these tests import. Blocks of
other languages (console output, YAML, text) are not run.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPO, job_env

DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUNNABLE_LANGUAGES = {"python": "python", "bash": "shell", "sh": "shell", "shell": "shell"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*(?P<kind>run|skip)\s*(?::\s*(?P<args>.*?))?\s*-->$")
OPTION = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


@dataclass
class Block:
    path: Path
    line: int            # 1-based line of the opening fence
    language: str        # "python" or "shell"
    code: str
    kind: str = ""       # "run", "skip", or "" when unmarked
    reason: str = ""
    options: dict = field(default_factory=dict)

    @property
    def where(self):
        return f"{self.path.relative_to(REPO)}:{self.line}"


def parse_marker(text):
    match = MARKER.match(text.strip())
    if not match:
        return None, "", {}
    kind, args = match.group("kind"), (match.group("args") or "").strip()
    if kind == "skip":
        return kind, args, {}
    options = {"expect": []}
    for key, value in OPTION.findall(args):
        if value.startswith('"'):
            value = bytes(value[1:-1], "utf-8").decode("unicode_escape")
        if key == "expect":
            options["expect"].append(value)
        else:
            options[key] = value
    return kind, "", options


def blocks_of(path):
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, indent, start = match.group("fence"), len(match.group("indent")), i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i][indent:])
            i += 1
        i += 1
        language = RUNNABLE_LANGUAGES.get(match.group("lang"))
        if language is None:
            continue
        before = start - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        kind, reason, options = parse_marker(lines[before]) if before >= 0 else (None, "", {})
        found.append(Block(path, start + 1, language, "\n".join(body) + "\n", kind or "",
                           reason, options))
    return found


ALL_BLOCKS = [block for path in DOC_FILES for block in blocks_of(path)]


def runs():
    """The scripts to run: one per block marked `run`, or per group at its last block."""
    scripts, groups = [], {}
    for block in ALL_BLOCKS:
        if block.kind != "run":
            continue
        group = block.options.get("group")
        if group is None:
            scripts.append([block])
            continue
        key = (block.path, group)
        if key not in groups:
            groups[key] = []
            scripts.append(groups[key])
        groups[key].append(block)
    return scripts


def test_every_block_is_run_or_marked_with_a_reason():
    unmarked = [b.where for b in ALL_BLOCKS if b.kind == ""]
    assert not unmarked, f"code blocks with neither <!-- run --> nor <!-- skip: why -->: {unmarked}"
    no_reason = [b.where for b in ALL_BLOCKS if b.kind == "skip" and not b.reason]
    assert not no_reason, f"<!-- skip --> without a reason: {no_reason}"
    mixed = [s[0].where for s in runs() if len({b.language for b in s}) > 1]
    assert not mixed, f"a group mixes Python and shell: {mixed}"
    shell_np = [b.where for b in ALL_BLOCKS if b.language == "shell" and "np" in b.options]
    assert not shell_np, f"np= is for Python blocks: {shell_np}"


def test_the_parser_sees_markers_and_groups():
    """The checks above would pass vacuously if the parser found no blocks or no markers."""
    assert len(ALL_BLOCKS) >= 20
    assert sum(b.kind == "run" for b in ALL_BLOCKS) >= 15
    assert any(b.options.get("np") for b in ALL_BLOCKS if b.kind == "run")
    assert any(len(s) > 1 for s in runs())
    kind, reason, _ = parse_marker("<!-- skip: needs a GPU -->")
    assert (kind, reason) == ("skip", "needs a GPU")
    kind, _, options = parse_marker('<!-- run: np=2 expect="a b" expect=c -->')
    assert kind == "run" and options == {"np": "2", "expect": ["a b", "c"]}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder to run blocks in, with the repository's examples and `horovodlikerun` and
    `python` on PATH, both this interpreter."""
    folder = tmp_path_factory.mktemp("docs-blocks")
    for name in ("examples", "benchmarks", "scripts"):
        (folder / name).symlink_to(REPO / name)
    bin_dir = folder / ".bin"
    bin_dir.mkdir()
    (bin_dir / "horovodlikerun").write_text(
        f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m horovodlike.runner.launch \"$@\"\n")
    (bin_dir / "python").symlink_to(sys.executable)
    (bin_dir / "python3").symlink_to(sys.executable)
    for tool in bin_dir.iterdir():
        if not tool.is_symlink():
            tool.chmod(0o755)
    return folder


def merged_options(blocks):
    options = {"expect": []}
    for block in blocks:
        options.update({k: v for k, v in block.options.items() if k != "expect"})
        options["expect"] += block.options.get("expect", [])
    return options


def run_script(blocks, scratch, tmp_path):
    first = blocks[0]
    code = "".join(b.code for b in blocks)
    options = merged_options(blocks)
    timeout = float(options.get("timeout", 120))
    work = tmp_path / "work"
    shutil.copytree(scratch, work, symlinks=True)
    env = job_env({"PATH": f"{scratch / '.bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                   "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
    if first.language == "python":
        script = work / "block.py"
        script.write_text(code)
        command = [sys.executable, str(script)]
        if "np" in options:
            command = [sys.executable, "-m", "horovodlike.runner.launch", "-np", options["np"],
                       *command]
    else:
        script = work / "block.sh"
        script.write_text("set -euo pipefail\n" + code)
        command = ["bash", str(script)]
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True,
                            timeout=timeout)
    output = result.stdout + result.stderr
    where = ", ".join(b.where for b in blocks)
    assert result.returncode == 0, f"{where} exited {result.returncode}:\n{code}\n{output[-6000:]}"
    for text in options.get("expect", []):
        assert text in output, f"{where}: {text!r} not in the output:\n{output[-6000:]}"


@pytest.mark.parametrize("blocks", runs(), ids=lambda s: s[0].where)
def test_block_runs(blocks, scratch, tmp_path):
    required = merged_options(blocks).get("requires")
    if required:
        pytest.importorskip(required)
    run_script(blocks, scratch, tmp_path)


def test_a_failing_block_fails(scratch, tmp_path):
    """The runner above reports a block that raises, exits non-zero or lacks its output."""
    bad = [Block(REPO / "README.md", 1, "python", "assert 1 + 1 == 3\n", "run")]
    with pytest.raises(AssertionError, match="exited 1"):
        run_script(bad, scratch, tmp_path / "a")
    quiet = [Block(REPO / "README.md", 1, "shell", "echo hello\n", "run",
                   options={"expect": ["goodbye"]})]
    with pytest.raises(AssertionError, match="not in the output"):
        run_script(quiet, scratch, tmp_path / "b")


def test_mkdocs_build_strict(tmp_path):
    """mkdocs and mkdocs-material come with the test extra (pip install '.[test]')."""
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                             "--site-dir", str(tmp_path / "site")],
                            cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    site = tmp_path / "site"
    assert (site / "index.html").is_file()
    assert (site / "troubleshooting" / "index.html").is_file()
    # README.md is not part of the site, so mkdocs does not check its links: check them here,
    # anchors against the built pages.
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", (REPO / "README.md").read_text())
    assert len(links) >= 10
    for target, anchor in links:
        assert (REPO / target).is_file(), f"README.md links to {target}, which does not exist"
        if anchor:
            page = site / Path(target).relative_to("docs").with_suffix("") / "index.html"
            assert f'id="{anchor}"' in page.read_text(), f"README.md: {target}#{anchor}"


def test_the_performance_plots_are_the_benchmarks_own():
    """docs/img holds copies of the plots in benchmarks/results (regenerate.sh copies them);
    a plot regenerated without its copy would show the site an old figure."""
    copies = sorted((REPO / "docs" / "img").glob("*.png"))
    assert len(copies) == 6
    for copy in copies:
        original = REPO / "benchmarks" / "results" / copy.name
        assert copy.read_bytes() == original.read_bytes(), f"{copy.name} differs from {original}"
    shown = "".join(p.read_text() for p in DOC_FILES)
    assert all(f"(img/{copy.name})" in shown for copy in copies)


def test_the_development_page_shows_these_markers():
    """docs/development.md repeats the markers of this module's docstring for writers of the
    documentation; the two must not drift apart."""
    page = (REPO / "docs" / "development.md").read_text()
    markers = [line.strip() for line in __doc__.splitlines() if line.strip().startswith("<!--")]
    assert len(markers) >= 6
    for marker in markers:
        assert marker in page, f"docs/development.md lacks {marker!r}"
