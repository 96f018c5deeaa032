"""Shared fixtures: tiny configs that train in well under a second on 2 CPU cores."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("PYTHONHASHSEED", "0")
torch.set_num_threads(min(2, torch.get_num_threads()))


def tiny_raw(**over) -> dict:
    raw = {
        "seed": 3, "rounds": 3, "clients_per_round": 4, "device": "cpu",
        "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "classes", "classes_per_client": 2}},
        "model": {"name": "mlp", "hidden": 16},
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
    from fedsweep.config import build_config
    from fedsweep.run import train
    m = train(build_config({**tiny_raw(**over), "engine": engine}), progress=False)
    return m.w.detach().clone(), m.history


def assert_engines_agree(over: dict, keys: tuple[str, ...]):
    """Loop and vectorized engines end at the same model with the same per-round ``keys``; the seed matters."""
    w_loop, h_loop = final("loop", over)
    w_vec, h_vec = final("vectorized", over)
    assert not torch.equal(w_loop, final("loop", {**over, "seed": 4})[0])   # the seed matters
    torch.testing.assert_close(w_vec, w_loop, rtol=1e-4, atol=1e-5)
    for a, b in zip(h_loop, h_vec):
        for key in keys:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key


@pytest.fixture
def tmp_mlflow(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri
