"""`fedsweep tune --address` against real `ray start --head` clusters, as a user runs it: its own
HOME, nothing exported, the sweep in a subprocess. A head with no token runs without auth, one with
a token (`ray get-auth-token --generate`) with it; fedsweep must follow either by itself."""
import subprocess
import sys

import yaml

from raycluster import ray_head, user_env
from test_tune import TINY, trial_runs


def sweep_file(tmp_path, name, **over):
    spec = {**TINY, "name": name, "methods": {"fedavg": {}}, **over}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def fedsweep(tmp_path, home, *args, **env):
    """``fedsweep ARGS`` in ``tmp_path`` as the user whose HOME is ``home``."""
    return subprocess.run([sys.executable, "-m", "fedsweep.cli", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=400,
                          env=user_env(home, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", **env))


def test_head_without_token_and_fractional_gpus(tmp_path, tmp_path_factory):
    """No token anywhere: the head runs without auth and so must the driver (it used to demand a
    token and die in Ray's native check). The head advertises one GPU: `gpu: 0.25` puts four
    trials on it at once, and each still trains (on the CPU, as CUDA is absent here)."""
    home = tmp_path_factory.mktemp("home")
    with ray_head(home, num_gpus=1, num_cpus=2) as address:
        base = {**TINY["base"], "device": "auto", "rounds": 30, "eval": {"every": 10}}
        path = sweep_file(tmp_path, "gpu", base=base, grid={"local.lr": [0.05, 0.1, 0.2, 0.3]},
                          resources={"cpu": 0.25, "gpu": 0.25})
        done = fedsweep(tmp_path, home, "tune", path, "--address", address)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (home / ".ray" / "auth_token").exists()
    _, runs = trial_runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "gpu")
    assert sorted(r.data.tags["fedsweep.status"] for r in runs) == ["finished"] * 4
    assert {r.data.params["device"] for r in runs} == {"auto"}
    # all four were running at one moment: each opened before any closed
    assert max(r.info.start_time for r in runs) < min(r.info.end_time for r in runs)
    for r in runs:
        assert r.data.metrics["summary/rounds"] == 30 and r.data.metrics["best/test_accuracy"] > 0.1


def test_head_with_token_and_every_mismatch(tmp_path, tmp_path_factory):
    """A token in ~/.ray/auth_token: the head runs with auth, and the same user's sweep connects
    with nothing exported. A user without the token, or with a wrong one, or one who asks for
    token mode without a token, gets one line naming what to set: exit 2, nothing written."""
    home = tmp_path_factory.mktemp("home")
    with ray_head(home, token=True) as address:
        path = sweep_file(tmp_path, "tok", grid={"local.lr": [0.1, 0.2]})
        done = fedsweep(tmp_path, home, "tune", path, "--address", address)
        assert done.returncode == 0, done.stderr[-2000:]
        _, runs = trial_runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "tok")
        assert sorted(r.data.tags["fedsweep.status"] for r in runs) == ["finished", "finished"]

        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        stranger = tmp_path_factory.mktemp("home")
        cases = [({}, "requires token authentication and no token was found", "RAY_AUTH_TOKEN"),
                 ({"RAY_AUTH_TOKEN": "0" * 64}, "rejected the token from $RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN"),
                 ({"RAY_AUTH_MODE": "token"}, "RAY_AUTH_MODE=token but no Ray token found", "~/.ray/auth_token"),
                 ({"RAY_AUTH_MODE": "sometimes"}, "RAY_AUTH_MODE: 'sometimes' is not allowed", "token, disabled")]
        for env, needle, names in cases:
            bad = fedsweep(elsewhere, stranger, "tune", path, "--address", address, **env)
            err = bad.stderr.strip()
            assert bad.returncode == 2 and len(err.splitlines()) == 1, (env, err[-1500:])
            assert err.startswith("fedsweep: error: ") and needle in err and names in err, (env, err)
            assert sorted(p.name for p in elsewhere.iterdir()) == [], env   # no store, no storage
