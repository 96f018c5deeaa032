"""The package's folders import one way (docs/design.md §6): a module imports, at module level and
lazily inside a function alike, only from its own folder and the folders listed before its own (the
registry finds the built-in algorithms by name, not by an import); and no modules import each other
in a circle."""
from __future__ import annotations

import ast
from pathlib import Path

ORDER = ["util", "config", "sim", "data", "algorithms", "engine", "runs", "testing", "reports", "sweep", "api", "cli"]
FILES = ("testing", "api", "cli")   # one module each, not a folder
PACKAGE = Path(__file__).parent.parent / "fedsweep"
# data and algorithms sit side by side (neither imports the other).
SIDE_BY_SIDE = {frozenset({"data", "algorithms"})}
EVERYWHERE = ("cli",)   # the command: each command's modules, lazily


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "fedsweep" else None


def _imports(path: Path):
    """(line, module, names) of every import of the file, module-level and inside functions."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(("fedsweep", *path.relative_to(PACKAGE).with_suffix("").parts))
        out[name.removesuffix(".__init__")] = path
    return out


def test_folders_import_one_way():
    top = sorted(p.name for p in PACKAGE.iterdir() if not p.name.startswith(("_", ".")))
    assert top == sorted(f"{f}.py" if f in FILES else f for f in ORDER), top
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if own not in ORDER:
            continue
        if own in EVERYWHERE:
            continue
        for line, module, _ in _imports(path):
            other = _part(module)
            if other is None or other == own or other not in ORDER:
                continue
            if ORDER.index(other) > ORDER.index(own) or frozenset({own, other}) in SIDE_BY_SIDE:
                wrong.append(f"{path.relative_to(PACKAGE)}:{line} imports {module}")
    assert not wrong, "imports against the layer order (docs/design.md §6):\n" + "\n".join(wrong)


def test_no_import_circle():
    """No modules import each other in a circle, directly or through others, lazily or not: the
    strongly connected parts of the import graph are single modules (Tarjan's algorithm)."""
    modules = _modules()
    graph = {m: set() for m in modules}
    for m, path in modules.items():
        if m == "fedsweep" or m == "fedsweep.cli":   # exports by name; the command at the top
            continue
        for _, target, names in _imports(path):
            hits = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules] or \
                ([target] if target in modules else [])
            graph[m].update(h for h in hits if h != m)
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))
    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, f"modules importing each other in a circle: {circles}"


def test_no_module_is_long():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 450}
    assert not long, f"modules over 450 lines (split them by role): {long}"


def test_no_run_outputs_are_tracked():
    """Run stores, checkpoints and kept MLflow records never enter the repository (.gitignore)."""
    import subprocess
    repo = PACKAGE.parent
    if not (repo / ".git").exists():
        return   # an installed copy without its history: nothing is tracked
    tracked = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True, check=True).stdout.split()
    outputs = [f for f in tracked if f.split("/")[0] in ("mlruns", "mlartifacts", "fedsweep_runs", "fedsweep_unlogged",
                                                         "lightning_logs", "reports")
               or f.endswith((".ckpt", "mlflow.db", "model.pt"))]
    assert not outputs, f"run outputs tracked by git: {outputs[:5]}"
    ignored = subprocess.run(["git", "check-ignore", "mlruns/1/x", "mlflow.db", "fedsweep_runs/s/x", "fedsweep_unlogged/r",
                              "last.ckpt", "reports/s/report.md"], cwd=repo, capture_output=True, text=True).stdout
    assert len(ignored.split()) == 6, ignored
