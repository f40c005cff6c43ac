"""The core's folders are layers (csrc/README.md): each includes only the ones below it, so
there is no include cycle between folders; no block of code is copied between sources (link
backends included); the environment is read in one place (common/env_config.cc, once per
init); no function is over 100 lines and no file over 600."""

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parents[1] / "csrc"
# Lowest first: a folder may include itself and the folders before it.
LAYERS = ["common", "reduce", "links", "cuda", "collectives", "core", "python"]


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


def test_only_python_includes_pybind11():
    # The core knows no Python: the bindings are csrc/python/'s alone.
    binders = [str(p.relative_to(CSRC)) for p in sources()
               if re.search(r"^#include <pybind11/", p.read_text(), re.M)]
    assert binders and all(b.startswith("python/") for b in binders), binders


def test_only_common_reads_the_environment():
    # Links, providers and the runtime take their settings from the Config read at init().
    readers = [str(p.relative_to(CSRC)) for p in sources()
               if layer_of(p) != "common" and re.search(r"\b(getenv|secure_getenv|environ)\b",
                                                         p.read_text())]
    assert not readers, f"these read the environment instead of the Config: {readers}"


def test_no_block_of_six_lines_is_copied_between_sources():
    # Six consecutive non-trivial lines (ignoring blank lines, braces and comments) that appear
    # in two source files: between link backends (tcp, shm, mpi, gloo), between providers, or
    # anywhere else in csrc/, a copied block belongs in one place that both use.
    def blocks(path):
        lines = [line.strip() for line in path.read_text().splitlines()]
        lines = [l for l in lines if l and l not in ("{", "}", "};")
                 and not l.startswith(("//", "#include"))]
        return {tuple(lines[i:i + 6]) for i in range(len(lines) - 5)}
    files = [p for p in sources() if p.suffix == ".cc"]
    assert any(layer_of(p) == "links" for p in files)
    found = {p: blocks(p) for p in files}
    copied = []
    for i, a in enumerate(files):
        for b in files[i + 1:]:
            copied += [(a, b, block) for block in found[a] & found[b]]
    assert not copied, "\n\n".join(f"{a.relative_to(CSRC)} and {b.relative_to(CSRC)}:\n" +
                                     "\n".join(block) for a, b, block in copied[:3])


def test_no_function_is_over_100_lines():
    # A function of the core that long mixes steps that deserve names. Counted from the line
    # that opens its body to the closing brace, for every definition at namespace level.
    def code(line):
        line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
        line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
        return line.split("//")[0]

    long = []
    for path in sources():
        if path.suffix != ".cc":
            continue
        depth, namespaces, start, header = 0, 0, None, ""
        for number, line in enumerate(path.read_text().splitlines()):
            line = code(line)
            for char in line:
                if char == "{":
                    if depth == namespaces and start is None:
                        if re.match(r"\s*(namespace|extern)\b", header + line):
                            namespaces += 1
                        else:
                            start, signature = number, (header + line).strip()
                    depth += 1
                elif char == "}":
                    depth -= 1
                    if start is not None and depth == namespaces:
                        if number - start + 1 > 100:
                            long.append(f"{path.relative_to(CSRC)}: {signature[:70]} "
                                        f"({number - start + 1} lines)")
                        start = None
                    elif depth < namespaces:
                        namespaces = depth
            if line.strip().endswith((";", "}", "{")) or not line.strip():
                header = ""
            elif depth == namespaces:
                header += line + " "
    assert not long, "\n".join(long)


def test_no_file_is_over_600_lines():
    # One concept per file: a file this long holds several.
    package = CSRC.parent / "src" / "horovodlike"
    files = sources() + sorted(package.rglob("*.py"))
    long = [f"{p.relative_to(CSRC.parent)} ({n} lines)" for p in files
            if (n := len(p.read_text().splitlines())) > 600]
    assert not long, "\n".join(long)


def test_every_folder_says_what_it_holds():
    # A newcomer finds each concept by its folder: every folder of csrc/ has a README.md.
    folders = sorted({p.parent for p in sources()})
    silent = [str(f.relative_to(CSRC)) for f in folders if not (f / "README.md").is_file()]
    assert not silent, f"folders without a README.md: {silent}"
