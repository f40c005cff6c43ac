"""The core's folders are layers (csrc/README.md): each includes only the ones below it, so
there is no include cycle between folders; the Python packages are layers too: no import cycle
between modules, and no package imports one above it; no block of code is copied, within a file
or between files (C++ sources, headers and Python); the environment is read in one place
(common/env_config.cc, once per init); no function is over 100 lines and no file over 600."""

import ast
import re
from pathlib import Path

CSRC = Path(__file__).resolve().parents[1] / "csrc"
PACKAGE = CSRC.parent / "src" / "horovodlike"
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


def test_only_env_config_reads_the_environment():
    # Links, providers and the runtime take their settings from the Config read at init(); the
    # few read before it (the log's output, GPU library paths) are env_config.cc's too.
    readers = [str(p.relative_to(CSRC)) for p in sources()
               if p.relative_to(CSRC) != Path("common/env_config.cc") and
               re.search(r"\b(getenv|secure_getenv|environ)\b", p.read_text())]
    assert not readers, f"these read the environment instead of the Config: {readers}"


def _cc_lines(path):
    """(line number, text) of a C++ file's lines that say something: not blank, not a lone
    brace, not a comment, not an #include."""
    lines = [(n, line.strip()) for n, line in enumerate(path.read_text().splitlines(), 1)]
    return [(n, l) for n, l in lines if l and l not in ("{", "}", "};")
            and not l.startswith(("//", "#include"))]


def _py_lines(path):
    """(line number, text) of a Python file's lines that say something: not blank, not a
    comment, not an import (the counterpart of an #include)."""
    source = path.read_text()
    imports = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.update(range(node.lineno, node.end_lineno + 1))
    lines = [(n, line.strip()) for n, line in enumerate(source.splitlines(), 1)]
    return [(n, l) for n, l in lines if l and not l.startswith("#") and n not in imports]


def _copied_blocks(files):
    """[(places, block)]: six consecutive lines that say something (see _cc_lines, _py_lines)
    found at two places or more, in two files or twice in one file; a place is (path, first
    line, last line)."""
    seen = {}
    for path in files:
        lines = _py_lines(path) if path.suffix == ".py" else _cc_lines(path)
        for i in range(len(lines) - 5):
            block = tuple(text for _, text in lines[i:i + 6])
            seen.setdefault(block, []).append((path, lines[i][0], lines[i + 5][0]))
    copied = []
    for block, places in seen.items():
        # Overlapping windows of one file (a run of like lines) are no copy.
        distinct = [places[0]]
        for place in places[1:]:
            if all(place[0] != p[0] or place[1] > p[2] for p in distinct):
                distinct.append(place)
        if len(distinct) > 1:
            copied.append((distinct, block))
    return copied


def test_no_block_of_six_lines_is_copied():
    # Between link backends, providers, framework layers, or within one file: a copied block
    # belongs in one place that both use.
    files = [p for p in sources()] + sorted(PACKAGE.rglob("*.py"))
    assert any(layer_of(p) == "links" for p in files if p.suffix == ".cc")
    copied = _copied_blocks(files)
    root = CSRC.parent
    assert not copied, "\n\n".join(
        " and ".join(f"{p.relative_to(root)}:{first}" for p, first, _ in places) + ":\n" +
        "\n".join(block) for places, block in copied[:5])


def test_the_copy_check_sees_copies_within_a_file_and_not_imports(tmp_path):
    body = "".join(f"    total += {i}\n" for i in range(6))
    (tmp_path / "twice.py").write_text(f"def f(total):\n{body}\n\ndef g(total):\n{body}")
    imports = "".join(f"from m import name{i}\n" for i in range(6))
    (tmp_path / "a.py").write_text(imports)
    (tmp_path / "b.py").write_text(imports)
    (tmp_path / "c.h").write_text("".join(f"int x{i} = {i};\n{{\n" for i in range(6)))
    (tmp_path / "d.cc").write_text("".join(f"int x{i} = {i};\n// a note\n" for i in range(6)))
    copied = _copied_blocks(sorted(tmp_path.iterdir()))
    assert sorted((p.name, first) for places, _ in copied for p, first, _ in places) == \
        [("c.h", 1), ("d.cc", 1), ("twice.py", 2), ("twice.py", 11)]


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


# Python functions allowed over 100 lines, each with why; remove an entry once it is fixed.
LONG_PYTHON_FUNCTIONS: set = set()  # (file, function) allowed over the limit, each with why


def test_no_python_function_is_over_100_lines():
    long, allowed = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if (where, node.name) in LONG_PYTHON_FUNCTIONS:
                    allowed.add((where, node.name))
                elif lines > 100:
                    long.append(f"{where}: {node.name} ({lines} lines)")
    assert not long, "\n".join(long)
    # An entry whose function is gone or was shortened is stale: keep the list honest.
    assert allowed == LONG_PYTHON_FUNCTIONS, LONG_PYTHON_FUNCTIONS - allowed


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


# ---------------------------------------------------------------------------------- Python imports

def _python_modules():
    """{dotted module name: path} of every module of the package."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("horovodlike",) + path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(modules):
    """{module: the package's modules it imports}, every import counted (function-local ones
    too). ``from a import b`` imports a.b when that is a module, else a; importing a package
    that holds the importer (its parents, which Python runs first anyway) is no edge."""
    def owner(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                names += [base] + [f"{base}.{alias.name}" for alias in node.names]
        targets = {owner(name) for name in names if name.split(".")[0] == "horovodlike"}
        graph[module] = {t for t in targets
                         if t and t != module and not module.startswith(t + ".")}
    return graph


def _third_party_imports(path):
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def _cycles(graph):
    """The import cycles of ``graph``: its strongly connected components of several modules
    (Tarjan's algorithm, iteratively)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def enter(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return node, iter(sorted(graph[node]))

    for start in sorted(graph):
        if start in index:
            continue
        work = [enter(start)]
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    work.append(enter(target))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = [stack.pop()]
                    while component[-1] != node:
                        component.append(stack.pop())
                    on_stack.difference_update(component)
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_no_import_cycle_between_python_modules():
    # Modules depend downwards only: a cycle, even through an import inside a function, means
    # two modules that cannot be understood, tested or loaded one without the other.
    cycles = _cycles(_imports(_python_modules()))
    assert not cycles, "import cycles:\n" + "\n".join(" ".join(c) for c in cycles)


def test_the_import_graph_sees_imports_inside_functions(tmp_path):
    # A cycle closed by a relative import inside a function, and "from package import module".
    (tmp_path / "a.py").write_text("from horovodlike.x import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .c import g\n")
    (tmp_path / "c.py").write_text("import horovodlike.x.a\n")
    (tmp_path / "d.py").write_text("from horovodlike.x import a\n")
    modules = {f"horovodlike.x.{name}": tmp_path / f"{name}.py" for name in "abcd"}
    graph = _imports(modules)
    assert graph["horovodlike.x.b"] == {"horovodlike.x.c"}
    assert _cycles(graph) == [["horovodlike.x.a", "horovodlike.x.b", "horovodlike.x.c"]]


def _layer(module):
    """The package of ours a module belongs to: horovodlike.tensorflow.keras is Horovod's path
    for the Keras API (it re-exports horovodlike.keras), so it counts as keras."""
    parts = module.split(".")
    if parts[1:3] == ["tensorflow", "keras"]:
        return "keras"
    return parts[1] if len(parts) > 1 else ""


FRAMEWORKS = {"torch", "tensorflow", "keras"}
# What each package may import of ours beside itself; None: no rule.
MAY_IMPORT = {
    "common": set(),  # the layer below every other: no framework package, no launcher
    "torch": {"common", "data"},
    "tensorflow": {"common"},
    "keras": {"common", "tensorflow"},
    "data": {"common"},
}


def test_python_packages_import_only_downwards():
    graph = _imports(_python_modules())
    wrong = []
    for module, targets in sorted(graph.items()):
        mine = _layer(module)
        if mine not in MAY_IMPORT:
            continue
        for target in sorted(targets):
            theirs = _layer(target)
            if theirs != mine and theirs not in MAY_IMPORT[mine] and \
                    (theirs in FRAMEWORKS or mine in ("common", "data") and theirs):
                wrong.append(f"{module} imports {target}")
    # No framework itself in common/: it serves them all and needs none.
    for module, path in _python_modules().items():
        if _layer(module) == "common" and _third_party_imports(path) & FRAMEWORKS:
            wrong.append(f"{module} imports {sorted(_third_party_imports(path) & FRAMEWORKS)}")
    assert not wrong, "\n".join(wrong)
