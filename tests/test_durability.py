"""A trial the driver called finished is never lost: `kill -9` of `fedsweep tune` around a trial's end
(right after its ``[finished]`` line, with the MLflow store locked, while the driver waits for the
store at the end), then `--resume`: every run FINISHED with every round, its summary and artifacts,
equal to an uninterrupted sweep's. Real Ray Tune, real sqlite stores, a real second writer holding
the store's lock."""
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from fedsweep.cli import main
from test_mlflow_faults import client_of, lock_store, runs_of, start, wait_for

pytestmark = [pytest.mark.usefixtures("fresh_home"), pytest.mark.slow]

ROUNDS = 12
SWEEP = {
    "base": {"rounds": ROUNDS, "clients_per_round": 4, "device": "cpu",
             "data": {"name": "digits", "num_clients": 8}, "model": {"name": "mlp", "options": {"hidden": 16}},
             "eval": {"every": 3}, "mlflow": {"retry_seconds": 600}},
    "grid": {"local.lr": [0.05, 0.1]},
    "seeds": [0, 1],
    "max_concurrent": 1,
}
TRIALS = 4


def write_sweep(folder: Path, name: str = "d") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "name": name}))
    return str(path)


def finished_lines(folder: Path) -> int:
    log = folder / "driver.log"
    return log.read_text().count("[finished]") if log.exists() else 0


def terminated_in_tune(folder: Path, name: str = "d") -> int:
    """How many trials Ray Tune's newest snapshot of the sweep (its experiment state) holds as ended."""
    import json
    states = sorted((folder / "fedsweep_runs" / name).glob("experiment_state-*.json"))
    try:
        data = json.loads(states[-1].read_text()) if states else {"trial_data": []}
        return sum(json.loads(t[0]).get("status") == "TERMINATED" for t in data["trial_data"])
    except (OSError, ValueError, KeyError, IndexError):   # a snapshot being written
        return 0


def kill_group(proc) -> None:
    """`kill -9` of the driver and the Ray processes it started (its process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def recorded(uri: str, name: str) -> dict:
    """Each trial run as (config, seed) -> what a user reads of it: MLflow status, fedsweep status,
    rounds logged, summary metrics, artifact names."""
    client = client_of(uri)
    out = {}
    for r in runs_of(uri, name):
        if r.data.tags.get("fedsweep.role") != "trial":
            continue
        key = (r.data.tags["fedsweep.config_id"], r.data.params["seed"])
        assert key not in out, f"two runs of one trial: {key}"
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")]
        out[key] = {"status": r.info.status, "fedsweep.status": r.data.tags.get("fedsweep.status"),
                    "steps": steps,
                    "summary": {k: round(v, 12) for k, v in r.data.metrics.items() if "/" not in k or k.startswith("best/")},
                    "artifacts": sorted(a.path for a in client.list_artifacts(r.info.run_id))}
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("whole")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    proc = start(["tune", write_sweep(folder)], folder, MLFLOW_TRACKING_URI=uri)
    assert proc.wait(timeout=600) == 0, (folder / "driver.log").read_text()[-3000:]
    return recorded(uri, "d")


def resume_and_compare(folder: Path, uri: str, path: str, whole: dict, monkeypatch, capsys) -> str:
    monkeypatch.chdir(folder)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    code = main(["tune", path, "--resume"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    got = recorded(uri, "d")
    assert len(got) == TRIALS and set(got) == set(whole)
    for key, run in got.items():
        assert run["status"] == "FINISHED" and run["fedsweep.status"] == "finished", (key, run)
        assert run["steps"] == list(range(1, ROUNDS + 1)), (key, run["steps"])
        assert run["summary"] == whole[key]["summary"], key
        assert run["artifacts"] == whole[key]["artifacts"], key
    return err


def test_kill_right_after_the_last_finished_line(tmp_path, uninterrupted, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = write_sweep(tmp_path)
    proc = start(["tune", path], tmp_path, MLFLOW_TRACKING_URI=uri)
    try:
        end = time.time() + 600
        while finished_lines(tmp_path) < TRIALS and time.time() < end and proc.poll() is None:
            time.sleep(0.01)
        assert finished_lines(tmp_path) == TRIALS, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        kill_group(proc)
    resume_and_compare(tmp_path, uri, path, uninterrupted, monkeypatch, capsys)


def killed_with_a_locked_store(folder: Path, locked_once: str, kill_when, what: str) -> tuple[str, str]:
    """`fedsweep tune` of the test sweep; the store locked by a second sqlite writer once a run of
    role ``locked_once`` exists; kill -9 of the driver's group once ``kill_when()``; then the lock
    goes. Returns (uri, sweep path)."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    path = write_sweep(folder)
    proc = start(["tune", path], folder, MLFLOW_TRACKING_URI=uri)
    locker = None
    try:
        wait_for(lambda: [r for r in runs_of(uri, "d") if r.data.tags.get("fedsweep.role") == locked_once], 300,
                 f"a {locked_once} run")
        locker = lock_store(folder / "mlflow.db", 3600)
        wait_for(kill_when, 600, what)
    finally:
        kill_group(proc)
        if locker is not None:
            locker.kill()
            locker.wait()
    return uri, path


def test_kill_with_the_store_locked_after_trials_finished(tmp_path, uninterrupted, monkeypatch, capsys):
    """The store locked by another writer once the first trial's run exists; kill -9 once Tune's
    snapshot holds two trials as ended (their last writes, and the next runs' creation, wait in the
    driver's memory: Tune replays nothing of them); the lock goes; resume."""
    uri, path = killed_with_a_locked_store(tmp_path, "trial", lambda: terminated_in_tune(tmp_path) >= 2,
                                           "Tune's snapshot with two trials ended")
    before = recorded(uri, "d")
    assert sum(r["fedsweep.status"] == "finished" for r in before.values()) < 2   # their ends were lost
    err = resume_and_compare(tmp_path, uri, path, uninterrupted, monkeypatch, capsys)
    assert "from their checkpoints" in err          # Tune held them as ended: nothing of them was replayed


def test_kill_while_the_driver_waits_for_a_locked_store_at_the_end(tmp_path, uninterrupted, monkeypatch, capsys):
    """Locked before any trial run was written: every trial trains, none reaches MLflow; the driver
    waits for the store at the end and is killed there."""
    uri, path = killed_with_a_locked_store(tmp_path, "sweep",
                                           lambda: "waiting up to" in (tmp_path / "driver.log").read_text(),
                                           "the driver waiting at the end")
    assert finished_lines(tmp_path) == TRIALS
    assert not [r for r in runs_of(uri, "d") if r.data.tags.get("fedsweep.role") == "trial"]   # none reached MLflow
    err = resume_and_compare(tmp_path, uri, path, uninterrupted, monkeypatch, capsys)
    assert "finishing the runs of 4 trial(s)" in err
