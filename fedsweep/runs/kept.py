"""MLflow writes a store did not take, kept on disk, and written later (docs/run.md, "When the MLflow
store fails").

A run (or a sweep's driver) whose store still fails when its work is done keeps what waits in a
folder under ``./fedsweep_unlogged`` (:func:`keep_unlogged`, :meth:`fedsweep.runs.writer.Writer.save`):
``records.json`` (the operations, in order, and the ids of the runs they name) and the artifacts
beside it. ``fedsweep log FOLDER`` (:func:`log_unlogged`) writes them as they would have been
written, once; a resumed run writes its own first (:func:`kept_records_of`), and a sweep's
``--resume`` its driver's.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

from fedsweep.config.schema import ConfigError
from fedsweep.runs.store_errors import cause
from fedsweep.runs.writer import Writer

UNLOGGED = "fedsweep_unlogged"


def keep_unlogged(writer: Writer, name: str, cause: str) -> Path:
    """Save ``writer``'s waiting writes under ``./fedsweep_unlogged/<time>-<name>`` (or the temp
    folder if the working folder cannot take them); returns the folder. Raises OSError if neither can."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:80] or "run"
    last = None
    for base in (Path.cwd() / UNLOGGED, Path(tempfile.gettempdir()) / UNLOGGED):
        folder = base / f"{stamp}-{safe}"
        n = 1
        while folder.exists():
            n += 1
            folder = base / f"{stamp}-{safe}-{n}"
        try:
            return writer.save(folder, cause)
        except OSError as e:
            last = e
    raise last


def kept_records_of(run_uid: str) -> list[tuple[Path, str | None]]:
    """(folder, the store its records are meant for) of each folder under ``./fedsweep_unlogged``
    (and the temp folder's) whose records, not yet logged, create or continue the run ``run_uid``."""
    import json
    found = []
    for base in dict.fromkeys((Path.cwd() / UNLOGGED, Path(tempfile.gettempdir()) / UNLOGGED)):
        for records in sorted(base.glob("*/records.json")):
            try:
                record = json.loads(records.read_text())
                ops = record.get("ops", [])
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(ops, list) and any(isinstance(op, dict) and op.get("op") == "open"
                                             and (op.get("tags") or {}).get("fedsweep.run_uid") == run_uid for op in ops):
                found.append((records.parent, record.get("tracking_uri")))
    return found


def log_unlogged(folder: str | Path, uri: str | None = None, experiment: str | None = None, out=None) -> int:
    """``fedsweep log FOLDER``: write the MLflow records a run or a sweep kept there (to the store
    and experiment they were meant for, or ``uri`` and ``experiment``); 0 once all are written. A
    folder that is not whole, or one another ``fedsweep log`` is writing, is refused in one line
    (ConfigError: exit 2); a store that fails part-way keeps what is left in the folder."""
    import errno
    import fcntl
    import json

    from fedsweep.runs.tracking import check_store, sqlite_path
    from fedsweep.runs.writer import RECORDS
    out = out or sys.stdout
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder (`fedsweep log` takes a folder of records fedsweep kept "
                          f"for MLflow, under ./{UNLOGGED})")
    try:   # one writer per folder: a second would make the same writes, and delete what the first reads
        fd = os.open(folder, os.O_RDONLY)
    except OSError as e:
        raise ConfigError(f"{folder}: cannot be opened ({e.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(f"{folder}: another `fedsweep log` is writing these records now; wait for it "
                                  "(it says when they are written)") from None
        if (folder / "logged.json").is_file() and not (folder / RECORDS).is_file():
            try:
                ids = json.loads((folder / "logged.json").read_text()).get("ids", {})
            except (OSError, ValueError, AttributeError):
                ids = {}
            print(f"{folder}: already logged (MLflow run {', '.join(map(str, ids.values())) or '?'}); "
                  "the folder can be deleted", file=out)
            return 0
        if not (folder / RECORDS).is_file():
            raise ConfigError(f"{folder}: no {RECORDS} there: not a folder of records fedsweep kept for MLflow")
        try:
            record = json.loads((folder / RECORDS).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"{folder}/{RECORDS}: cannot be read ({e}); the folder is damaged") from None
        problem = damaged(record, folder, needs_uri=uri is None)
        if problem:
            raise ConfigError(f"{folder}/{RECORDS}: {problem}; the folder is damaged, so these records cannot be "
                              "written (what they held is in the folder for a person to read)")
        meant = record["tracking_uri"]
        if uri is None and meant.startswith("sqlite:///") and not sqlite_path(meant).parent.is_dir():
            # the run made that folder: gone now (deleted, moved, unmounted), not a store to create anew
            raise ConfigError(f"{folder}: the store these records were meant for, {meant}, is gone (its folder "
                              f"{sqlite_path(meant).parent} is not there); nothing written, nothing created: put "
                              "it back, or write them to another store with --tracking-uri")
        target = check_store(uri or meant, key="--tracking-uri" if uri else "the records' store",
                             experiment=experiment)
        from fedsweep.runs.orphans import end_orphaned_runs
        end_orphaned_runs(target)
        writer = load(record, folder, target, experiment)
        try:
            n = replay(writer)
        except ConfigError:
            try:   # what went through is not made again: the folder keeps only what is left
                writer.save(folder)
            except OSError:
                pass
            raise
        (folder / "logged.json").write_text(json.dumps({"tracking_uri": target, "ids": writer.ids}))
        (folder / RECORDS).unlink()
        print(f"logged {n} records to MLflow run {', '.join(writer.ids.values())} at {target}; {folder} can be deleted",
              file=out)
        return 0
    finally:
        os.close(fd)


#: Each kept operation's kind, and the fields it cannot be made without.
OPERATIONS = {"open": ("run",), "adopt": ("run", "id"), "rows": ("run", "rows"), "batch": ("run",),
              "delete_tag": ("run", "name"), "files": ("run", "files"), "status": ("run", "status"),
              "end": ("run", "status")}


def damaged(record, folder: Path, needs_uri: bool = True) -> str | None:
    """What is wrong with a kept ``records.json`` (read as ``record``) and its folder, or None."""
    if not isinstance(record, dict):
        return f"holds {type(record).__name__} {str(record)[:40]}, not a record of MLflow writes"
    if needs_uri and not isinstance(record.get("tracking_uri"), str):
        return "names no store (\"tracking_uri\"); give one with --tracking-uri"
    ops = record.get("ops")
    if not isinstance(ops, list):
        return "holds no list of writes (\"ops\")"
    if not isinstance(record.get("ids", {}), dict):
        return "its run ids (\"ids\") are not a mapping"
    for i, op in enumerate(ops):
        kind = op.get("op") if isinstance(op, dict) else None
        if kind not in OPERATIONS:
            return f"write {i + 1} of {len(ops)} is not one fedsweep makes ({str(op)[:60]})"
        missing = [f for f in OPERATIONS[kind] if f not in op]
        if missing:
            return f"write {i + 1} of {len(ops)} ({kind}) lacks {', '.join(missing)}"
        if kind == "files":
            gone = [n for n in op["files"] if not (folder / "files" / str(i) / n).is_file()]
            if gone:
                return f"artifact {gone[0]} of write {i + 1} is missing from {folder / 'files' / str(i)}"
    return None


def load(record: dict, folder: Path | None = None, uri: str | None = None, experiment: str | None = None) -> Writer:
    """A :class:`Writer` holding the writes ``record`` (what :meth:`Writer.save` kept in ``folder``) leaves to make, against ``uri`` (default the store they were
    meant for) and, for the runs they create, ``experiment`` (default the one they were meant for).
    Runs already created keep their ids only in that same store."""
    target = uri or record["tracking_uri"]
    writer = Writer(target, start=False)
    if target == record["tracking_uri"]:
        writer.ids.update(record.get("ids", {}))
    for i, op in enumerate(record["ops"]):
        if op["op"] == "files":
            op = {**op, "files": {n: (folder / "files" / str(i) / n).read_bytes() for n in op["files"]}}
        if op["op"] == "open" and experiment:
            op = {**op, "experiment": experiment, "experiment_id": None}
        writer.ops.append(op)
    if target != record["tracking_uri"]:
        _refuse_runs_begun_elsewhere(writer, record)
    return writer


def _refuse_runs_begun_elsewhere(writer: Writer, record: dict) -> None:
    """Writes meant for runs another store holds, sent to a new store: each such run is made there
    anew from its first kept ``open`` (one exists where the run was created by the kept writes)."""
    missing = {op["run"] for op in writer.ops if "run" in op} - {op["run"] for op in writer.ops if op["op"] == "open"}
    if missing:
        raise ConfigError(f"--tracking-uri: {len(missing)} of these runs were already begun in "
                          f"{record['tracking_uri']}; their earlier records are there, so log them to that store")


def replay(writer: Writer, say=None) -> int:
    """Make every write ``writer`` holds, here and now, in order; returns how many. Raises
    :class:`ConfigError` with the store's error and how many writes are still left if one fails."""
    made = 0
    while writer.ops:
        try:
            writer.apply(writer.ops[0])
        except Exception as e:  # noqa: BLE001 - the store's words, in one line
            raise ConfigError(f"MLflow store {writer.uri}: {cause(e)}; {len(writer.ops)} writes are still "
                              f"to make (nothing is lost: run this again once the store works)") from None
        writer.ops.popleft()
        made += 1
    return made
