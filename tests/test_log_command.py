"""`fedsweep log FOLDER` on kept folders damaged in ordinary ways, and two of them at once: one line,
exit 2, never a traceback; the folder, once whole again, still logs (a real sqlite store)."""
import fcntl
import json
import os
import shutil
from pathlib import Path

import pytest

from fedsweep.cli import main
from fedsweep.runs.writer import Writer


def kept_folder(tmp_path: Path, uri: str) -> Path:
    """The records a run would keep when its store failed: its creation, two rounds, an artifact, its end."""
    writer = Writer(uri, start=False)
    writer.open_run("run", experiment="kept", name="a run", tags={"fedsweep.status": "running"}, params={"seed": 0})
    writer.rows("run", [{"round": 1, "train/loss": 2.0}, {"round": 2, "train/loss": 1.5}])
    writer.files("run", {"summary.json": b"{}"})
    writer.batch("run", tags={"fedsweep.status": "finished"})
    writer.end("run", "FINISHED")
    return writer.save(tmp_path / "kept", "database is locked")


def damage(folder: Path, how: str) -> None:
    records = folder / "records.json"
    record = json.loads(records.read_text())
    if how == "list":
        records.write_text("[]")
    elif how == "empty dict":
        records.write_text("{}")
    elif how == "no ops":
        record.pop("ops")
        records.write_text(json.dumps(record))
    elif how == "no store":
        record.pop("tracking_uri")
        records.write_text(json.dumps(record))
    elif how == "cut short":
        records.write_text(records.read_text()[:40])
    elif how == "artifact removed":
        next((folder / "files").rglob("summary.json")).unlink()
    elif how == "unknown write":
        record["ops"].append({"op": "drop_table"})
        records.write_text(json.dumps(record))
    elif how == "write without its run":
        del record["ops"][1]["run"]
        records.write_text(json.dumps(record))


@pytest.mark.parametrize("how", ["list", "empty dict", "no ops", "no store", "cut short", "artifact removed",
                                 "unknown write", "write without its run"])
def test_a_damaged_folder_is_one_line_and_exit_2(tmp_path, capsys, how):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    folder = kept_folder(tmp_path, uri)
    whole = tmp_path / "whole"
    shutil.copytree(folder, whole)
    damage(folder, how)
    capsys.readouterr()
    assert main(["log", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and str(folder) in err, err
    assert not Path(uri[len("sqlite:///"):]).exists()        # nothing half written
    assert main(["log", str(whole)]) == 0                     # the undamaged copy logs


def test_two_logs_of_one_folder_at_once(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    folder = kept_folder(tmp_path, uri)
    fd = os.open(folder, os.O_RDONLY)                         # what a first `fedsweep log` holds while it writes
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["log", str(folder)]) == 2
        err = capsys.readouterr().err
        assert "another `fedsweep log` is writing these records now" in err and "Traceback" not in err
    finally:
        os.close(fd)
    assert main(["log", str(folder)]) == 0
    assert main(["log", str(folder)]) == 0 and "already logged" in capsys.readouterr().out
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("kept").experiment_id])
    assert run.info.status == "FINISHED" and [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [1, 2]


def test_not_a_folder(tmp_path, capsys):
    assert main(["log", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_store_errors_read_as_what_they_mean():
    from fedsweep.runs.store_errors import cause, silence
    autoflush = Exception("(raised as a result of Query-invoked autoflush; consider using a session.no_autoflush block "
                          "if this flush is occurring prematurely)\n(sqlite3.OperationalError) database or disk is full\n"
                          "[SQL: INSERT INTO metrics ...]")
    assert cause(autoflush).startswith("the disk under the store is full (database or disk is full): free space")
    assert cause(Exception("(sqlite3.OperationalError) database is locked")).startswith(
        "another process holds the store's lock")
    assert silence(30).startswith("no answer in 30 s: the write under way still waits")


def test_a_store_whose_folder_was_deleted_is_not_made_anew(tmp_path, capsys):
    """The records' own store is gone with its folder: one line, nothing created there; --tracking-uri
    writes them elsewhere."""
    uri = f"sqlite:///{tmp_path / 'gone' / 'mlflow.db'}"
    folder = kept_folder(tmp_path, uri)
    assert main(["log", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is gone" in err and "--tracking-uri" in err, err
    assert not (tmp_path / "gone").exists()
    assert main(["log", str(folder), "--tracking-uri", f"sqlite:///{tmp_path / 'other.db'}"]) == 0
