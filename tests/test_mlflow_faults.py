"""No path loses a trained run: a real MLflow store locked by another writer, filled up (a small tmpfs
in a mount namespace of its own) or whose experiment is deleted mid-run; a checkpoint folder another
run uses; a sweep's storage that fills up or vanishes; and the metrics of a run read from another
process while it trains."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedsweep.cli import main
from conftest import tiny_raw

pytestmark = pytest.mark.usefixtures("fresh_home")   # Ray keeps a token in ~/.ray: none is shared


def client_of(uri):
    """A client of the store, opened as fedsweep opens one (under its folder's lock: a store a
    fedsweep process is creating is not created a second time here)."""
    from fedsweep.runs.tracking import open_store
    return open_store(uri)


def runs_of(uri, experiment):
    if not Path(uri[len("sqlite:///"):]).exists():
        return []
    client = client_of(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], run_view_type=3)


def steps(uri, run_id, key="train/loss"):
    return [m.step for m in client_of(uri).get_metric_history(run_id, key)]


def write_run(tmp_path, uri, **over):
    raw = tiny_raw(**over)
    raw["mlflow"] = {"enabled": True, "tracking_uri": uri, "experiment": "faults", **raw.get("mlflow_extra", {})}
    raw.pop("mlflow_extra", None)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def wait_for(predicate, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"waited {timeout} s for {what}")


def start(argv, cwd, log="driver.log", **env):
    """``fedsweep ARGV`` in a subprocess that leads its own process group (as a shell job); its output
    goes to ``cwd/log``."""
    with open(Path(cwd) / log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "fedsweep.cli", *argv], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **env})


def end(proc, sig=signal.SIGINT, timeout=120):
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


LOCKER = """import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN EXCLUSIVE")   # what another writer holding the store looks like to MLflow
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("COMMIT")
"""


# Longer than sqlite waits on a lock (20 s) after the writer's next write begins, which is up to 5 s
# (ROWS_EVERY_S) after the lock is taken, more on a loaded machine: 25 s let a write begun late wait the
# lock out and succeed, with no failure to report.
LOCKED_S = 45


def lock_store(db: Path, seconds: float = LOCKED_S) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", LOCKER, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def in_small_tmpfs(folder: Path, size: str, argv: list[str], cwd) -> subprocess.CompletedProcess:
    """``argv`` run with a tmpfs of ``size`` mounted on ``folder`` in a mount namespace of its own
    (the rest of the machine never sees it); skipped where this user cannot make one."""
    folder.mkdir(parents=True, exist_ok=True)
    script = f'mount -t tmpfs -o size={size} tmpfs "{folder}" && exec "$@"'
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here: a small full disk needs a mount namespace")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace here ({probe.stderr.strip()[:120]})")
    return subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


# -- fedsweep run ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_run_is_in_mlflow_while_it_trains_and_trains_on_through_a_locked_store(tmp_path):
    """The run exists (RUNNING, with its params and dataset) and holds metric rows while it trains,
    read here, from another process; a store locked by another writer for longer than sqlite waits
    (20 s) stops no round, and once it is free every round is written, each once."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = write_run(tmp_path, uri, rounds=10_000_000, eval={"every": 100})
    proc = start(["run", cfg, "--quiet"], tmp_path)
    try:
        run = wait_for(lambda: [r for r in runs_of(uri, "faults") if steps(uri, r.info.run_id, "test/accuracy")],
                       120, "metric rows while the run trains")[0]
        assert proc.poll() is None and run.info.status == "RUNNING"
        assert run.data.tags["fedsweep.status"] == "running" and run.data.params["local.lr"] == "0.1"
        assert run.inputs.dataset_inputs[0].dataset.name == "digits classes2 N8"
        locker = lock_store(tmp_path / "mlflow.db")
        locker.wait(timeout=60)
        log = tmp_path / "driver.log"
        wait_for(lambda: "answers again" in log.read_text(), 90, "the store to be written again")
        assert proc.poll() is None                          # it trained on all along
    finally:
        code = end(proc)
    text = (tmp_path / "driver.log").read_text()
    assert code == 130 and "Traceback" not in text, text[-2000:]
    assert "MLflow: the store at" in text and "database is locked" in text
    (run,) = runs_of(uri, "faults")
    done = int(run.data.metrics["summary/rounds"])
    assert run.info.status == "KILLED" and run.data.tags["fedsweep.status"] == "interrupted"
    assert steps(uri, run.info.run_id) == list(range(1, done + 1))   # every round, each once
    assert {a.path for a in client_of(uri).list_artifacts(run.info.run_id)} >= {"metrics.csv", "summary.json"}


@pytest.mark.slow
def test_a_full_store_keeps_the_run_on_disk_and_fedsweep_log_writes_it_later(tmp_path):
    """A store on a disk that fills up mid-run: the run trains to its end, exits 5 with one line
    naming the folder its records are kept in and the command that logs them; `fedsweep log` writes
    the whole run (to another store here), and a second `fedsweep log` says it is done."""
    small = tmp_path / "small"
    uri = f"sqlite:///{small / 'mlflow.db'}"
    cfg = write_run(tmp_path, uri, rounds=3000, eval={"every": 1},
                    mlflow_extra={"retry_seconds": 2})
    done = in_small_tmpfs(small, "2m", [sys.executable, "-m", "fedsweep.cli", "run", cfg, "--quiet"], tmp_path)
    assert done.returncode == 5, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "did not take this run" in last and "database or disk is full" in last and "Traceback" not in done.stderr
    folder = Path(last.split("fedsweep log ")[-1])
    assert folder.parent == tmp_path / "fedsweep_unlogged" and (folder / "records.json").is_file()
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert main(["log", str(folder), "--tracking-uri", other]) == 0
    (run,) = runs_of(other, "faults")
    assert run.info.status == "FINISHED" and run.data.tags["fedsweep.status"] == "finished"
    assert steps(other, run.info.run_id) == list(range(1, 3001))
    assert run.data.params["engine_used"] == "vectorized" and run.data.metrics["summary/rounds"] == 3000
    assert {a.path for a in client_of(other).list_artifacts(run.info.run_id)} >= {"config.yaml", "model.pt",
                                                                                   "metrics.csv", "curves.png"}
    assert main(["log", str(folder)]) == 0 and not (folder / "records.json").exists()


def test_a_deleted_experiment_is_refused_before_training_and_mid_run_keeps_the_run(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = client_of(uri)
    client.delete_experiment(client.create_experiment("faults", artifact_location=(tmp_path / "art").as_uri()))
    cfg = write_run(tmp_path, uri, rounds=2)
    capsys.readouterr()                                 # MLflow's own lines as it made the store here
    assert main(["run", cfg, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "experiment 'faults' was deleted" in err
    assert "mlflow experiments restore --experiment-id 1" in err
    client.restore_experiment("1")

    # deleted while it trains: a write the store refuses for good is not waited for
    cfg = write_run(tmp_path, uri, rounds=10_000_000, eval={"every": 100})
    proc = start(["run", cfg, "--quiet"], tmp_path)
    try:
        wait_for(lambda: [r for r in runs_of(uri, "faults") if steps(uri, r.info.run_id, "test/accuracy")],
                 120, "the run to write rows")
        client.delete_experiment("1")
        log = tmp_path / "driver.log"
        wait_for(lambda: "MLflow: the store at" in log.read_text(), 60, "the refused write")
    finally:
        code = end(proc)
    text = (tmp_path / "driver.log").read_text()
    assert code == 130 and "did not take this run" in text and "Traceback" not in text, text[-2000:]
    folder = next(line for line in text.splitlines() if "fedsweep log " in line).split("fedsweep log ")[-1]
    assert main(["log", folder]) == 2                                    # still deleted: nothing lost
    assert "was deleted" in capsys.readouterr().err
    client.restore_experiment("1")
    assert main(["log", folder]) == 0
    (run,) = [r for r in runs_of(uri, "faults") if r.info.status != "FINISHED"]
    assert run.info.status == "KILLED" and run.data.tags["fedsweep.status"] == "interrupted"
    done = int(run.data.metrics["summary/rounds"])
    assert steps(uri, run.info.run_id) == list(range(1, done + 1))


def test_a_failing_write_waits_out_its_pause_while_rounds_keep_coming(tmp_path):
    """A write the store refuses is tried again after its pause (1 s, then 2 s, ...), not at every
    operation a round submits: retried at each, the growing backlog was rewritten and rolled back
    every round (299 tries in 3 s here, and a run 7x slower once its disk filled)."""
    from fedsweep.runs.writer import Writer

    class Counted(Writer):
        tries = 0

        def apply(self, op):
            Counted.tries += 1
            super().apply(op)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    said = []
    writer = Counted(uri, say=said.append)
    writer.open_run("run", experiment="faults", name="r")
    writer.rows("run", [{"round": 1, "train/loss": 1.0}])
    wait_for(lambda: not writer.ops, 120, "the run to be written")
    client_of(uri).delete_experiment(writer.experiment_id("faults"))   # every later write is refused
    before, start = Counted.tries, time.monotonic()
    for r in range(2, 302):                                            # 3 s of rounds, 100 a second
        writer.rows("run", [{"round": r, "train/loss": 1.0}])
        time.sleep(0.01)
    tries = Counted.tries - before
    assert len(said) == 1 and "deleted" in said[0]
    assert 1 <= tries <= 2 + (time.monotonic() - start) // 2, tries   # at 0 s, 1 s, 3 s (+ slack)
    assert writer.close(0.5) is False and writer.ops                   # refused: kept for `fedsweep log`


def test_a_resumed_run_continues_its_mlflow_run(tmp_path):
    """`--resume` of a run stopped early continues the MLflow run its checkpoint names, from the
    first round it lacks, without the error an earlier process of it recorded; resumed with another round count (a param MLflow cannot change), it is a
    new run with every round."""
    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import run
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    raw = {**tiny_raw(rounds=5), "mlflow": {"tracking_uri": uri, "experiment": "faults"}}
    first = run(build_config(raw), progress=False, ckpt_dir=tmp_path / "ck", max_rounds=2)
    client_of(uri).set_tag(first["mlflow_run_id"], "fedsweep.error", "RuntimeError: what an earlier process died of")
    second = run(build_config(raw), progress=False, ckpt_dir=tmp_path / "ck", resume=tmp_path / "ck" / "last.ckpt")
    assert first["mlflow_run_id"] == second["mlflow_run_id"]
    tags = client_of(uri).get_run(second["mlflow_run_id"]).data.tags
    assert tags["fedsweep.status"] == "finished" and "fedsweep.error" not in tags   # it went on and finished
    assert steps(uri, second["mlflow_run_id"]) == [1, 2, 3, 4, 5]
    third = run(build_config({**raw, "rounds": 6}), progress=False, ckpt_dir=tmp_path / "ck",
                resume=tmp_path / "ck" / "last.ckpt")
    assert third["mlflow_run_id"] != second["mlflow_run_id"] and steps(uri, third["mlflow_run_id"]) == [1, 2, 3, 4, 5, 6]
    assert client_of(uri).get_run(second["mlflow_run_id"]).data.params["rounds"] == "5"   # its record stays true


def test_two_runs_never_write_one_checkpoint_folder_at_once(tmp_path, capsys):
    from fedsweep.util.locks import SweepLock
    (tmp_path / "ck").mkdir()
    with SweepLock(tmp_path / "ck" / "last.ckpt.lock", "", busy="x") as held:   # another run holds it
        held.acquire()
        raw = tiny_raw(rounds=1)
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(raw))
        assert main(["run", str(tmp_path / "run.yaml"), "--checkpoint-dir", str(tmp_path / "ck"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "another fedsweep run writes its checkpoint there" in err and f"pid {os.getpid()}" in err
    assert not (tmp_path / "ck" / "last.ckpt").exists()


# -- fedsweep tune --------------------------------------------------------------------------------

SWEEP = {
    "base": {"rounds": 3000, "clients_per_round": 4, "device": "cpu",
             "data": {"name": "digits", "num_clients": 8}, "model": {"name": "mlp", "options": {"hidden": 16}},
             "eval": {"every": 100}, "mlflow": {"retry_seconds": 5}},
    "grid": {"local.lr": [0.05, 0.1]},
    "seeds": [0],
    "max_concurrent": 1,
}


def write_sweep(tmp_path, name, **over):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "name": name, **over}))
    return str(path)


def no_run_left_running(uri, name):
    runs = runs_of(uri, name)
    assert runs and all(r.info.status != "RUNNING" for r in runs), [(r.info.run_name, r.info.status) for r in runs]
    return runs


def test_a_sweep_whose_experiment_is_deleted_keeps_its_records_and_resume_writes_them(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path, "gone")
    proc = start(["tune", path], tmp_path, MLFLOW_TRACKING_URI=uri)
    try:
        wait_for(lambda: len(runs_of(uri, "gone")) >= 2, 120, "the first trial's run")
        client_of(uri).delete_experiment(runs_of(uri, "gone")[0].info.experiment_id)
        proc.wait(timeout=300)
    finally:
        end(proc, signal.SIGKILL)
    text = (tmp_path / "driver.log").read_text()
    assert proc.returncode == 5 and "Traceback" not in text, text[-3000:]
    assert "sweep done: 2 finished" in text and f"`fedsweep tune {path} --resume` writes them" in text
    client = client_of(uri)
    exp = client.get_experiment_by_name("gone")
    client.restore_experiment(exp.experiment_id)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["tune", path, "--resume"]) == 0
    runs = no_run_left_running(uri, "gone")
    children = [r for r in runs if r.data.tags.get("fedsweep.role") == "trial"]
    assert len(children) == 2 and all(r.data.tags["fedsweep.status"] == "finished" for r in children)
    assert all(steps(uri, r.info.run_id) == list(range(1, 3001)) for r in children)

    # Ray Tune's record cut short (a storage that filled up mid-write): --resume says so, in one line
    store = tmp_path / "fedsweep_runs" / "gone"
    state = max(store.glob("experiment_state-*.json"))
    state.write_text(state.read_text()[:100])
    assert main(["tune", path, "--resume"]) == 2


def _advised(text: str, path: str) -> list[str] | None:
    """The command the sweep's last lines say recovers it (None if they say nothing is to recover)."""
    for line in text.splitlines():
        for flag in ("--resume", "--restart"):
            if line.strip().endswith(f"fedsweep tune {path} {flag}"):
                return ["tune", path, flag]
    return None


@pytest.mark.slow
def test_a_full_storage_loses_no_trained_trial_and_the_advice_works(tmp_path, monkeypatch):
    """Trials whose checkpoints cannot be written train on and reach MLflow; Ray Tune's own record
    may be cut short: the last lines say what recovers it (if anything is left to), and that works."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = write_sweep(tmp_path, "full", base={**SWEEP["base"], "rounds": 400, "eval": {"every": 10}},
                       grid={"local.lr": [0.05, 0.1, 0.2, 0.3]}, seeds=[0, 1], max_concurrent=2)
    done = in_small_tmpfs(tmp_path / "st", "150k", [sys.executable, "-m", "fedsweep.cli", "tune", path,
                                                   "--storage", str(tmp_path / "st")], tmp_path)
    text = done.stdout + done.stderr
    assert "Traceback" not in text and done.returncode in (0, 1), text[-3000:]
    runs = no_run_left_running(uri, "full")
    finished = [r for r in runs if r.data.tags.get("fedsweep.status") == "finished"]
    assert len(finished) == 8 and all(steps(uri, r.info.run_id) == list(range(1, 401)) for r in finished)
    advised = _advised(text, path)
    if advised:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        assert main([*advised, "--storage", str(tmp_path / "st")]) == 0


@pytest.mark.slow
def test_a_storage_deleted_mid_sweep_is_said_and_restart_works(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path, "vanish", seeds=[0, 1], max_concurrent=2)
    proc = start(["tune", path], tmp_path, MLFLOW_TRACKING_URI=uri)
    try:
        wait_for(lambda: any(r.data.tags.get("fedsweep.status") == "finished" for r in runs_of(uri, "vanish")),
                 180, "a finished trial")
        shutil.rmtree(tmp_path / "fedsweep_runs" / "vanish")
        proc.wait(timeout=300)
    finally:
        end(proc, signal.SIGKILL)
    text = (tmp_path / "driver.log").read_text()
    assert "Traceback" not in text, text[-3000:]
    no_run_left_running(uri, "vanish")
    advised = _advised(text, path)
    assert advised != ["tune", path, "--resume"]     # nothing of Tune's record is left to resume
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(advised or ["tune", path]) in (0, 4)
    no_run_left_running(uri, "vanish")


@pytest.mark.slow
def test_a_sweep_trains_on_through_a_locked_store(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path, "locked", base={**SWEEP["base"], "mlflow": {"retry_seconds": 120}})
    proc = start(["tune", path], tmp_path, MLFLOW_TRACKING_URI=uri)
    try:
        wait_for(lambda: len(runs_of(uri, "locked")) >= 2, 120, "the first trial's run")
        lock_store(tmp_path / "mlflow.db").wait(timeout=60)
        proc.wait(timeout=300)
    finally:
        end(proc, signal.SIGKILL)
    text = (tmp_path / "driver.log").read_text()
    assert proc.returncode == 0 and "database is locked" in text and "Traceback" not in text, text[-3000:]
    children = [r for r in no_run_left_running(uri, "locked") if r.data.tags.get("fedsweep.role") == "trial"]
    assert len(children) == 2 and all(steps(uri, r.info.run_id) == list(range(1, 3001)) for r in children)


FOLDER_HOLDER = """import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)          # as a run creating the store holds it
print("held", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)    # then Ctrl-Z
"""


@pytest.mark.parametrize("command", ["run", "report"])
def test_a_stopped_holder_of_the_store_folders_lock_is_named_within_seconds(tmp_path, command):
    """A process that took the store folder's lock (creating the store) and was then stopped (Ctrl-Z)
    would hold it until continued: a second run, or a report, says within seconds who holds it and,
    within 30 s, gives up in one line naming that process and the fix (exit 2), leaving nothing open."""
    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    client_of(uri).search_experiments()     # the store exists (a run made it, and is held up in its next one)
    holder = subprocess.Popen([sys.executable, "-c", FOLDER_HOLDER, str(store)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        if command == "run":
            argv = ["run", write_run(tmp_path, uri), "--quiet"]
        else:
            (tmp_path / "s.yaml").write_text(yaml.safe_dump({**SWEEP, "name": "s", "mlflow": {"tracking_uri": uri}}))
            argv = ["report", str(tmp_path / "s.yaml")]
        began = time.time()
        proc = subprocess.run([sys.executable, "-m", "fedsweep.cli", *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        took = time.time() - began
        assert proc.returncode == 2 and took < 30, (took, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert lines[0].startswith("waiting for the MLflow store folder's lock") and f"pid {holder.pid}" in lines[0]
        error = [line for line in lines if line.startswith("fedsweep: error")]
        assert len(error) == 1 and f"locked by pid {holder.pid}" in error[0] and "stopped" in error[0], lines
        assert f"kill -CONT {holder.pid}" in error[0] and "Traceback" not in proc.stderr
    finally:
        holder.kill()
        holder.wait()


def test_a_wait_whose_grace_is_spent_is_not_announced_as_a_wait(tmp_path):
    """Writes still waiting when the time left for them is under a second: said as kept on disk,
    never as "waiting up to 0 s"."""
    from fedsweep.runs.writer import Writer
    said = []
    writer = Writer(f"sqlite:///{tmp_path / 'mlflow.db'}", say=said.append, start=False)   # nothing gets written
    writer.rows("run", [{"round": 1, "train/loss": 1.0}])
    writer.announce_wait(0.3)
    assert said == ["MLflow: the store has not taken the last 1 writes (a write under way has not come back); "
                    "they are kept on disk"], said
