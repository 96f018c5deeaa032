"""`fedsweep tune --address` against real `ray start --head` clusters, as a user runs it: its own
HOME, nothing exported, the sweep in a subprocess. A head with no token runs without auth, one with
a token (`ray get-auth-token --generate`) with it; fedsweep must follow either by itself."""
import subprocess
import sys
import threading

import pytest
import yaml

from fedsweep.cli import main
from raycluster import can_hide_folders, ray_head, ray_node, ray_node_without, user_env
from test_tune import AT_ONCE, TINY, trial_runs


def sweep_file(tmp_path, name, **over):
    spec = {**AT_ONCE, "name": name, "methods": {"fedavg": {}}, **over}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def fedsweep(tmp_path, home, *args, **env):
    """``fedsweep ARGS`` in ``tmp_path`` as the user whose HOME is ``home``."""
    return subprocess.run([sys.executable, "-m", "fedsweep.cli", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=400,
                          env=user_env(home, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", **env))


def test_head_without_token_and_fractional_gpus(tmp_path, tmp_path_factory):
    """No token where the head started: it runs without auth, and so must the driver (one that demands a
    token dies in Ray's native check), even once the driver's machine has a token of its
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


def test_nodes_without_the_drivers_disk(tmp_path, tmp_path_factory, monkeypatch):
    """Worker nodes that are other machines: each joins from a mount namespace of its own, in which
    the driver's folder (its sweep file, MLflow store and default storage) is an empty disk. A
    storage there is refused before anything is trained, in one line naming the node. With a shared
    storage the sweep runs; its node is killed mid-trial (every process at once, as a machine that
    goes down) and another joins: the trials continue there from their last checkpoint, and every
    run ends with each round once, its summary and its artifacts, none of which ever were on the
    driver's disk. Nothing fedsweep wrote is left on the nodes' disks."""
    why = can_hide_folders()
    if why:
        pytest.skip(why)
    import os
    import time

    from mlflow import MlflowClient
    home = tmp_path_factory.mktemp("home")
    driver, shared = tmp_path / "driver", tmp_path / "shared"
    driver.mkdir()
    base = {**TINY["base"], "rounds": 2000, "eval": {"every": 100, "target_accuracy": 0.3}}
    path = sweep_file(driver, "far", base=base, grid={"local.lr": [0.05, 0.1]}, checkpoint_every=1, max_failures=3)
    uri = f"sqlite:///{driver / 'mlflow.db'}"
    # the head notices a silent node in ~2 s (Ray's default: ~15 s)
    with ray_head(home, num_cpus=0, ip="127.0.0.2", system_config={
            "health_check_period_ms": 500, "health_check_failure_threshold": 3}) as address:
        with ray_node_without([driver], home, address, ip="127.0.0.3") as first:
            refused = fedsweep(driver, home, "tune", path, "--address", address)
            err = refused.stderr.strip()
            assert refused.returncode == 2 and len(err.splitlines()) == 1, err[-2000:]
            assert err.startswith(f"fedsweep: error: --storage {driver / 'fedsweep_runs'}: node 127.0.0.3 ") and \
                "cannot read what this driver writes there (no such file there)" in err and "NFS" in err, err
            assert MlflowClient(uri).get_experiment_by_name("far") is None            # nothing made, nothing run

            with open(tmp_path / "driver.log", "w") as log:
                proc = subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "tune", path, "--address", address,
                                         "--storage", str(shared)], cwd=driver, stdout=log, stderr=subprocess.STDOUT,
                                        env=user_env(home, MLFLOW_TRACKING_URI=uri))
            try:
                ckpts = shared / "far" / "trial_checkpoints"
                deadline = time.time() + 240
                while not (ckpts.is_dir() and len(list(ckpts.glob("*.ckpt"))) == 2):   # both trials part-way
                    assert proc.poll() is None and time.time() < deadline, (tmp_path / "driver.log").read_text()[-3000:]
                    time.sleep(0.2)
                first.kill()
                with ray_node_without([driver], home, address, ip="127.0.0.4") as second:
                    assert proc.wait(timeout=300) == 0, (tmp_path / "driver.log").read_text()[-3000:]
                    assert os.listdir(f"/proc/{second.raylet()}/root{driver}") == []   # its view of the driver's folder
            finally:
                proc.kill()
    printed = (tmp_path / "driver.log").read_text()
    assert "sweep done: 2 finished" in printed and printed.count("[resumed] ") == 2, printed[-3000:]
    client, runs = trial_runs(uri, "far")
    assert len(runs) == 2
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.tags["fedsweep.status"] == "finished"
        assert 0 < int(r.data.tags["fedsweep.resumed_from_round"]) < 2000              # from its checkpoint
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")]
        assert steps == list(range(1, 2001))                                          # each round once
        assert r.data.metrics["summary/rounds"] == 2000 and r.data.metrics["best/test_accuracy"] > 0.3
        assert {"config.yaml", "metrics.csv", "curves.png", "summary.json"} <= \
            {a.path for a in client.list_artifacts(r.info.run_id)}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["report", path, "--out", str(driver / "rep")]) == 0
    text = (driver / "rep" / "report.md").read_text()
    for r in runs:                                                                     # scored from the summaries
        assert f"| local.lr={r.data.params['local.lr']} | {r.data.metrics['best/test_accuracy']:.4f} | " in text


def test_plugins_reach_nodes_without_the_drivers_disk(tmp_path, tmp_path_factory):
    """A sweep whose algorithm, model and dataset are plugins in the driver's folder, on a cluster whose
    only worker node cannot see that folder (another machine's disk): fedsweep ships the plugin file
    and the plugin package through Ray's runtime_env, every trial imports them there and finishes, and
    each run records the driver's files and hashes; the node's own disk never held them."""
    why = can_hide_folders()
    if why:
        pytest.skip(why)
    import os
    import shutil
    from pathlib import Path

    from fedsweep.config.plugins import digest
    home = tmp_path_factory.mktemp("home")
    driver, shared = tmp_path / "driver", tmp_path / "shared"
    shutil.copytree(Path(__file__).resolve().parent.parent / "examples" / "mylab", driver)
    (driver / "labpkg").mkdir()
    (driver / "labpkg" / "__init__.py").write_text("from . import algos  # noqa: F401\n")
    (driver / "labpkg" / "algos.py").write_text(
        "import fedsweep\n\n\n@fedsweep.register_algorithm\nclass Third(fedsweep.Algorithm):\n"
        "    \"\"\"FedAvg taking a third of the step.\"\"\"\n    name = 'third'\n\n"
        "    def aggregate(self, w, uploads, plan):\n        return (self.weights(plan) @ uploads['delta']) / 3\n")
    spec = yaml.safe_load((driver / "sweep.yaml").read_text())
    spec.update(plugins=["mylab.py", "labpkg"], name="far_plugins", grid={}, seeds=[0],
                methods={"fedavg_decay": {}, "third": {}})
    spec["base"]["rounds"] = 6
    (driver / "sweep.yaml").write_text(yaml.safe_dump(spec))
    uri = f"sqlite:///{driver / 'mlflow.db'}"
    with ray_head(home, num_cpus=0, ip="127.0.0.2") as address:
        with ray_node_without([driver], home, address, ip="127.0.0.3") as node:
            done = fedsweep(driver, home, "tune", "sweep.yaml", "--address", address, "--storage", str(shared))
            assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
            assert os.listdir(f"/proc/{node.raylet()}/root{driver}") == []         # the node's view: empty
    assert "sweep done: 2 finished" in done.stdout, done.stdout[-2000:]
    client, runs = trial_runs(uri, "far_plugins")
    assert sorted(r.data.params["algorithm.name"] for r in runs) == ["fedavg_decay", "third"]
    for r in runs:
        assert r.info.status == "FINISHED" and r.data.metrics["summary/rounds"] == 6
        assert r.data.tags["fedsweep.plugins"] == "mylab, labpkg"
        assert r.data.tags["fedsweep.plugin.mylab.sha256"] == digest(str(driver / "mylab.py"))
        assert r.data.tags["fedsweep.plugin.labpkg.sha256"] == digest(str(driver / "labpkg"))
        assert {"plugins/mylab.py", "plugins/labpkg"} <= {a.path for a in client.list_artifacts(r.info.run_id, "plugins")}
