"""Shared fixtures: tiny configs that train in well under a second on 2 CPU cores."""
from __future__ import annotations

import os
from pathlib import Path
import struct

import numpy as np
import pytest
import torch

os.environ.setdefault("PYTHONHASHSEED", "0")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n: each worker leads a process group of its own, as a lone pytest does, so that "the
    # processes of this test's group" (a local Ray instance's, a sweep's) are never another worker's
    os.setpgid(0, 0)
torch.set_num_threads(min(2, torch.get_num_threads()))


def tiny_raw(**over) -> dict:
    raw = {
        "seed": 3, "rounds": 3, "clients_per_round": 4, "device": "cpu",
        "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "classes", "classes_per_client": 2}},
        "model": {"name": "mlp", "options": {"hidden": 16}},
        "local": {"steps": 4, "batch_size": 5, "lr": 0.1},
        "heterogeneity": {"kind": "stragglers", "rho": 0.5},
        "algorithm": {"name": "fedavg"},
        "eval": {"every": 1},
        "mlflow": {"enabled": False},
    }
    for key, value in over.items():
        section, _, leaf = key.partition("__")
        if leaf:
            raw.setdefault(section, {})[leaf] = value
        else:
            raw[section] = value
    return raw


def final(engine: str, over: dict):
    """(final flat model, metric history) of the tiny run ``tiny_raw(**over)`` on ``engine``."""
    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import train
    m = train(build_config({**tiny_raw(**over), "engine": engine}), progress=False)
    return m.w.detach().clone(), m.history


def engine_runs(over: dict, keys: tuple[str, ...] = ()):
    """Train ``tiny_raw(**over)`` on both engines; they must end at the same model and agree on the
    per-round metrics ``keys``. Returns the (loop, vectorized) modules for further checks."""
    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import train
    loop, vec = (train(build_config({**tiny_raw(**over), "engine": e}), progress=False)
                 for e in ("loop", "vectorized"))
    torch.testing.assert_close(vec.w, loop.w, rtol=1e-4, atol=1e-5)
    for a, b in zip(loop.history, vec.history):
        for key in keys:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key
    return loop, vec


def assert_engines_agree(over: dict, keys: tuple[str, ...]):
    """:func:`engine_runs`, and the seed matters."""
    loop, _ = engine_runs(over, keys)
    assert not torch.equal(loop.w, final("loop", {**over, "seed": 4})[0])


def resumed_run(raw: dict, tmp_path, stop: int):
    """Train ``raw`` uninterrupted, and again stopped after ``stop`` rounds and resumed from its
    checkpoint: both must end at the same model with the same metric history (wall time aside).
    Returns (uninterrupted, resumed, the checkpoint's fedsweep state)."""
    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import train
    full = train(build_config(raw), progress=False)
    train(build_config(raw), progress=False, ckpt_dir=tmp_path, max_rounds=stop)
    ckpt = tmp_path / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)["fedsweep"]       # loads with weights_only
    assert saved["rounds_done"] == stop
    resumed = train(build_config(raw), progress=False, resume=ckpt)
    assert torch.equal(resumed.w, full.w)
    strip = lambda hs: [{k: v for k, v in h.items() if k != "round/seconds"} for h in hs]  # noqa: E731
    assert strip(resumed.history) == strip(full.history)
    return full, resumed, saved


@pytest.fixture(autouse=True)
def no_report_after_tune(monkeypatch):
    """`fedsweep tune` reports at its end unless FEDSWEEP_NO_REPORT=1 (= --no-report): off in tests,
    whose sweeps are there for something else (~3 s each, 50 sweeps); the tests of that report turn
    it back on (monkeypatch.delenv)."""
    monkeypatch.setenv("FEDSWEEP_NO_REPORT", "1")


REPO = Path(__file__).resolve().parent.parent
#: What runs write into the folder they run in: never into the repository (.gitignore lists them too).
RUN_OUTPUTS = ("mlruns", "mlartifacts", "mlflow.db", "fedsweep_runs", "fedsweep_unlogged", "reports", "lightning_logs")


@pytest.fixture(autouse=True)
def no_run_outputs_in_the_repository():
    """A test whose runs write into the repository (an MLflow experiment made without an artifact
    location puts its artifacts under ./mlruns of the working folder, the repository's under pytest)
    fails, naming what it left."""
    before = {name for name in RUN_OUTPUTS if (REPO / name).exists()}
    yield
    left = [name for name in RUN_OUTPUTS if (REPO / name).exists() and name not in before]
    assert not left, f"the test left run outputs in the repository: {', '.join(left)}"


@pytest.fixture(autouse=True)
def torch_state():
    """Each test starts from torch's global RNG seeded, so a test that draws from it (test data made
    with ``torch.randn``) sees the same numbers whichever tests ran before it and however many draws
    they made (test_models' vmap check once drew, after the tests before it, one of the rare inputs
    float32 cannot check); and it must leave torch's process-wide float32 matmul precision as it
    found it (PyTorch passes `high` on to oneDNN's CPU products, so a run must not leave it set)."""
    torch.manual_seed(0)
    before = torch.get_float32_matmul_precision()
    yield
    assert torch.get_float32_matmul_precision() == before, "a test left torch's matmul precision changed"


@pytest.fixture
def tmp_mlflow(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def fresh_home(tmp_path_factory, monkeypatch):
    """A new, empty HOME and no RAY_AUTH_* variables: what a user's fresh machine has. Ray keeps
    its token in ~/.ray, so a test must not see what another left there."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    return home


def _idx(path, arr: np.ndarray):
    """Write an idx-ubyte file: magic 0x00000800 | ndim (uint8 data), big-endian dims, raw bytes."""
    with open(path, "wb") as f:
        f.write(struct.pack(">I", 0x0800 | arr.ndim))
        f.write(struct.pack(f">{arr.ndim}I", *arr.shape))
        f.write(arr.astype(np.uint8).tobytes())


def write_mnist(root, cls_name="MNIST", n_train=24, n_test=8):
    """Tiny MNIST-family files in torchvision's on-disk format (``root/<cls_name>/raw``, idx-ubyte);
    returns the arrays written, per split."""
    rng = np.random.default_rng(0)
    raw = root / cls_name / "raw"
    raw.mkdir(parents=True)
    out = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        x[0] = 0
        x[1] = 255
        y = np.arange(n) % 10
        _idx(raw / f"{split}-images-idx3-ubyte", x)
        _idx(raw / f"{split}-labels-idx1-ubyte", y)
        out[split] = (x, y)
    return out


@pytest.fixture(autouse=True)
def registries_as_they_were():
    """Whatever a test registers (a plugin it loads, in-process) is forgotten after it, with the module
    that registered it, so no other test sees it (tests/test_plots.py checks every registered algorithm
    has a colour)."""
    import sys

    from fedsweep.config import plugins
    from fedsweep.config.registry import ALGORITHMS, DATASETS, MODELS, load_builtins
    load_builtins()
    before = {r: set(r.names()) for r in (ALGORITHMS, MODELS, DATASETS)}
    yield
    modules = set()
    for registry, names in before.items():
        for name in set(registry.names()) - names:
            modules.add(registry.get(name).module)
            registry.remove(name)
    for name in modules - {"__main__"}:
        sys.modules.pop(name, None)
    for spec, (plugin, *_) in list(plugins._loaded.items()):
        if plugin.module in modules:
            del plugins._loaded[spec]


@pytest.fixture
def plugin_dir(tmp_path):
    """A folder for plugin files a test writes (``write(name, text)`` returns the path); what they
    register is forgotten after the test (:func:`registries_as_they_were`), and so are the modules
    they import from it."""
    import sys
    import textwrap

    from fedsweep.config import plugins
    folder = tmp_path / "lab"
    folder.mkdir()
    modules = set(sys.modules)

    def write(name: str, text: str):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path
    write.folder = folder
    yield write
    for name in set(sys.modules) - modules:
        if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]
    for spec in [s for s in plugins._loaded if s.startswith(str(tmp_path))]:
        del plugins._loaded[spec]
