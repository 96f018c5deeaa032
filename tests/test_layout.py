"""The package's folders import one way (docs/design.md §6): a module imports, at module level, only
from its own folder and the folders listed before its own. A lazy import inside a function may reach
further (the registry finds algorithms by name); those are not module-level and not checked here."""
from __future__ import annotations

import ast
from pathlib import Path

ORDER = ["util", "config", "sim", "data", "algorithms", "engine", "runs", "testing", "sweep", "reports", "api", "cli"]
FILES = ("testing", "api", "cli")   # one module each, not a folder
PACKAGE = Path(__file__).parent.parent / "fedsweep"
# data and algorithms sit side by side (neither imports the other), as do sweep and reports.
SIDE_BY_SIDE = {frozenset({"data", "algorithms"}), frozenset({"sweep", "reports"})}


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "fedsweep" else None


def _module_level_imports(path: Path):
    for node in ast.parse(path.read_text()).body:          # module level only, not inside functions
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def test_folders_import_one_way():
    top = sorted(p.name for p in PACKAGE.iterdir() if not p.name.startswith(("_", ".")))
    assert top == sorted(f"{f}.py" if f in FILES else f for f in ORDER), top
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if own not in ORDER:
            continue
        for line, module in _module_level_imports(path):
            other = _part(module)
            if other is None or other == own or other not in ORDER:
                continue
            if ORDER.index(other) > ORDER.index(own) or frozenset({own, other}) in SIDE_BY_SIDE:
                wrong.append(f"{path.relative_to(PACKAGE)}:{line} imports {module}")
    assert not wrong, "imports against the layer order (docs/design.md §6):\n" + "\n".join(wrong)


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
