"""`fedsweep tune --address` against real `ray start --head` clusters, as a user runs it: its own
HOME, nothing exported, the sweep in a subprocess. A head with no token runs without auth, one with
a token (`ray get-auth-token --generate`) with it; fedsweep must follow either by itself."""
import subprocess
import sys
import threading

import yaml

from raycluster import ray_head, ray_node, user_env
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
    """No token where the head started: it runs without auth, and so must the driver (it used to
    demand a token and die in Ray's native check), even once the driver's machine has a token of its
    own (a local `ray.init`, such as a sweep run without --address, writes one to ~/.ray/auth_token):
    a driver in token mode against such a head ended every trial with "The actor never ran". The
    head advertises one GPU: `gpu: 0.25` puts four trials on it at once, and each still trains (on
    the CPU, as CUDA is absent here)."""
    home = tmp_path_factory.mktemp("home")
    with ray_head(home, num_gpus=1, num_cpus=2) as address:
        (home / ".ray").mkdir()
        (home / ".ray" / "auth_token").write_text("f" * 64)      # written after the head started
        base = {**TINY["base"], "device": "auto", "rounds": 30, "eval": {"every": 10}}
        path = sweep_file(tmp_path, "gpu", base=base, grid={"local.lr": [0.05, 0.1, 0.2, 0.3]},
                          resources={"cpu": 0.25, "gpu": 0.25})
        done = fedsweep(tmp_path, home, "tune", path, "--address", address)
        forced = fedsweep(tmp_path, home, "tune", path, "--address", address, RAY_AUTH_MODE="token")
    assert done.returncode == 0, done.stderr[-2000:]
    assert forced.returncode == 2 and forced.stderr.strip() == (
        f"fedsweep: error: --address {address}: RAY_AUTH_MODE=token, but the Ray head there runs without token "
        "authentication; unset RAY_AUTH_MODE")
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


def test_a_trial_no_node_can_hold_waits_for_one_and_says_so(tmp_path, tmp_path_factory):
    """A sweep asking for a GPU of a cluster that has none: Tune would wait for ever, and its warning
    is among the Ray logs fedsweep silences (such a sweep hung with no word). The driver says at once
    what its trials wait for; they start when a node with a GPU joins, and finish there."""
    home = tmp_path_factory.mktemp("home")
    with ray_head(home, num_cpus=1, num_gpus=0) as address:
        base = {**TINY["base"], "device": "auto"}
        path = sweep_file(tmp_path, "wait", base=base, grid={"local.lr": [0.1, 0.2]}, resources={"cpu": 1, "gpu": 1})
        proc = subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "tune", path, "--address", address],
                                cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=user_env(home, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}"))
        lines, waits = [], threading.Event()

        def read():
            for line in proc.stderr:
                lines.append(line)
                if line.startswith("waiting: "):
                    waits.set()
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert waits.wait(timeout=120), "".join(lines)[-2000:]
            assert [x for x in lines if x.startswith("waiting: ")] == [
                f"waiting: a trial asks for 1 CPU and 1 GPU on one node, and no node of the cluster at {address} "
                f"has that (1 node: 1 CPUs, 0 GPUs); the trials start once one does (a machine that joins with "
                f"`ray start --address {address} --num-gpus 1`, or a node an autoscaler adds). Ctrl-C stops the "
                "sweep\n"]
            with ray_node(home, address, num_cpus=1, num_gpus=1):
                assert proc.wait(timeout=300) == 0, "".join(lines)[-2000:]
        finally:
            proc.kill()
            reader.join(timeout=10)
    _, runs = trial_runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "wait")
    assert sorted(r.data.tags["fedsweep.status"] for r in runs) == ["finished", "finished"]
