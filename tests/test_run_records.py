"""One training, one MLflow run, never left RUNNING: `fedsweep run` killed with SIGKILL is ended
KILLED by the next fedsweep command (with its last round and the command that continues it), and
that command continues the same MLflow run, whatever `mlflow.*` keys it changes; a run whose records
were kept on disk (its store failed) is continued by `--resume` as the run the store began, so
`fedsweep log` then says it is logged. A real sqlite store, real processes."""
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedsweep.cli import main
from test_mlflow_faults import client_of, runs_of, start, steps, wait_for, write_run

pytestmark = pytest.mark.usefixtures("fresh_home")


def test_a_killed_run_is_ended_by_the_next_command_and_its_resume_continues_the_same_run(tmp_path, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rounds = 1000   # 4-7 s of training: killed long before its end (rows come at its first round, then every 5 s)
    cfg = write_run(tmp_path, uri, rounds=rounds, eval={"every": 10})
    ckpt = tmp_path / "ckpt"
    proc = start(["run", cfg, "--quiet", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "20"], tmp_path)
    try:
        wait_for(lambda: [r for r in runs_of(uri, "faults") if steps(uri, r.info.run_id)]
                 and (ckpt / "last.ckpt").is_file(), 240, "rounds written and a checkpoint")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (run,) = runs_of(uri, "faults")
    assert run.info.status == "RUNNING"                       # nothing could close it
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    capsys.readouterr()
    assert main(["run", write_run(other, uri, rounds=1), "--quiet"]) == 0   # the next command on the store
    (run,) = wait_for(lambda: [r for r in runs_of(uri, "faults") if r.info.run_id == run.info.run_id
                               and r.info.status == "KILLED"], 60, "the killed run ended")
    err = capsys.readouterr().err
    assert "was left RUNNING: its process" in err and "ended KILLED after round" in err
    last = max(steps(uri, run.info.run_id))
    assert run.info.status == "KILLED" and run.data.tags["fedsweep.status"] == "interrupted"
    assert f"after round {last}" in run.data.tags["fedsweep.error"]
    resume = run.data.tags["fedsweep.continue_with"]
    assert resume.endswith(f"--resume {ckpt / 'last.ckpt'}") and "--checkpoint-dir" in resume

    # the command it names, with an mlflow.* key changed: the same MLflow run goes on
    argv = resume.split()[1:] + ["--set", "mlflow.retry_seconds=7"]
    assert main(argv) == 0
    (after,) = [r for r in runs_of(uri, "faults") if r.info.run_id == run.info.run_id]
    assert after.info.status == "FINISHED" and len(runs_of(uri, "faults")) == 2   # the killed one, and the other
    assert steps(uri, after.info.run_id) == list(range(1, rounds + 1))
    assert after.data.tags["fedsweep.resumed_with.mlflow.retry_seconds"] == "7.0"
    assert after.data.tags["fedsweep.status"] == "finished"


def test_a_resume_asking_for_more_rounds_ends_the_run_it_cannot_continue(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = write_run(tmp_path, uri, rounds=6, eval={"every": 2})
    ckpt = tmp_path / "ckpt"
    monkeypatch.chdir(tmp_path)
    assert main(["run", cfg, "--quiet", "--checkpoint-dir", str(ckpt)]) == 0
    (first,) = runs_of(uri, "faults")
    assert main(["run", cfg, "--quiet", "--checkpoint-dir", str(ckpt), "--resume", str(ckpt / "last.ckpt"),
                 "--set", "rounds=8"]) == 0
    runs = {r.info.run_id: r for r in runs_of(uri, "faults")}
    assert len(runs) == 2
    old = runs[first.info.run_id]
    (new,) = [r for r in runs.values() if r.info.run_id != first.info.run_id]
    assert old.info.status != "RUNNING" and old.data.tags["fedsweep.continued_in"] == new.info.run_id
    assert new.info.status == "FINISHED"


WRITE_LOCKER = """import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")   # another writer mid-transaction: readers go on, writers wait
print("locked", flush=True)
time.sleep(3600)
"""


def hold_for_writing(db: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WRITE_LOCKER, str(db)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_kept_run_is_continued_by_resume_and_then_is_logged(tmp_path, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client_of(uri).create_experiment("faults", artifact_location=(tmp_path / "art").as_uri())   # then another writer holds it
    cfg = write_run(tmp_path, uri, rounds=5, eval={"every": 1}, mlflow_extra={"retry_seconds": 2})
    ckpt = tmp_path / "ckpt"
    monkeypatch.chdir(tmp_path)
    locker = hold_for_writing(tmp_path / "mlflow.db")      # it reads (the run's checks pass), no one writes
    try:
        assert main(["run", cfg, "--quiet", "--checkpoint-dir", str(ckpt)]) == 5
    finally:
        locker.kill()
        locker.wait()
    err = capsys.readouterr().err
    folder = Path(err.strip().splitlines()[-1].split("fedsweep log ")[-1])
    assert (folder / "records.json").is_file()
    assert main(["run", cfg, "--quiet", "--checkpoint-dir", str(ckpt), "--resume", str(ckpt / "last.ckpt")]) == 0
    runs = runs_of(uri, "faults")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert steps(uri, runs[0].info.run_id) == [1, 2, 3, 4, 5]
    capsys.readouterr()
    assert main(["log", str(folder)]) == 0 and "already logged" in capsys.readouterr().out
    assert len(runs_of(uri, "faults")) == 1


def test_a_live_run_is_left_alone(tmp_path):
    from fedsweep.runs.orphans import gone, writer_tags
    tags = writer_tags()
    assert gone(tags) is None                                 # this process
    assert "has ended" in gone({**tags, "fedsweep.pid": "999999999"})
    assert "another process's" in gone({**tags, "fedsweep.pid_started": "1"})
    other = {**tags, "fedsweep.host": "elsewhere"}
    assert gone(other) is None                                # a fresh heartbeat on another machine
    assert "has not written for 11 min" in gone(other, now=float(tags["fedsweep.heartbeat"]) + 660)
