"""The core's folders are layers (csrc/README.md): each includes only the ones below it, so
there is no include cycle between folders, and no block of code is copied between links."""

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parents[1] / "csrc"
# Lowest first: a folder may include itself and the folders before it.
LAYERS = ["common", "reduce", "links", "collectives", "core", "python"]


def sources():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cc"))


def layer_of(path: Path) -> str:
    return path.relative_to(CSRC).parts[0]


def test_every_source_is_in_a_layer():
    assert {layer_of(p) for p in sources()} <= set(LAYERS)


def test_folders_include_only_the_layers_below_them():
    wrong = []
    for path in sources():
        mine = LAYERS.index(layer_of(path))
        for included in re.findall(r'^#include "([^"]+)"', path.read_text(), re.M):
            target = (path.parent / included).resolve()
            assert target.exists(), f"{path}: {included} does not exist"
            theirs = LAYERS.index(layer_of(target))
            if theirs > mine:
                wrong.append(f"{path.relative_to(CSRC)} includes {target.relative_to(CSRC)}")
    assert not wrong, "\n".join(wrong)


def test_no_block_of_six_lines_is_copied_between_links():
    # Six consecutive non-trivial lines (ignoring blank lines, braces and comments) that appear
    # in two different link backends.
    def blocks(path):
        lines = [line.strip() for line in path.read_text().splitlines()]
        lines = [l for l in lines if l and l not in ("{", "}", "};")
                 and not l.startswith(("//", "#include"))]
        return {tuple(lines[i:i + 6]) for i in range(len(lines) - 5)}
    backends = {}
    for path in (CSRC / "links").rglob("*.cc"):
        backends.setdefault(path.parent.name, set()).update(blocks(path))
    names = sorted(backends)
    copied = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            copied += [(a, b, block) for block in backends[a] & backends[b]]
    assert not copied, "\n\n".join(f"{a} and {b}:\n" + "\n".join(block)
                                   for a, b, block in copied[:3])
