"""The end of ``fedsweep tune``, however it came (docs/sweeps.md, "What survives which fault").

Whatever stopped the sweep (its last trial, Ctrl-C, Ray Tune failing on a full or vanished
storage, an MLflow store that fails), the driver leaves no MLflow run RUNNING: the runs it opened
and did not end become ``interrupted`` (KILLED), the parent run ends, and MLflow writes the store
would not take are kept in a folder (``./fedsweep_unlogged``) that ``--resume`` writes first (or
``fedsweep log``). Its last lines say what recovers, and only what does: ``--resume`` when the
sweep's own record and Ray Tune's are whole in the storage, else ``--restart``.
"""
from __future__ import annotations

import json
import logging
import sys
import time

from fedsweep.config.schema import ConfigError
from fedsweep.runs.tracking import MLFLOW_STATUS
from fedsweep.sweep.callbacks import FINAL_STATUSES, PARENT, SWEEPS, trial_error
from fedsweep.sweep.progress import member_statuses
from fedsweep.sweep.storage import STATE_FILE, TRIALS_FILE, seal_problem


def end_sweep(*, name: str, store, state: dict, parent_id: str, total: int, units: list[list[int]], uri: str, client,
              exp_id: str, grace: float, stopped: BaseException | None) -> dict:
    """Close what the sweep left open and count its outcome; returns the counts of trial statuses,
    ``unfinished``, and where something went wrong: ``stopped_by`` (what stopped Tune, one line),
    ``recover`` (``--resume`` or ``--restart``, checked), ``unlogged`` (the folder of MLflow writes the
    store did not take) and ``storage`` (why the storage cannot hold the sweep's record)."""
    from fedsweep.runs.writer import Writer
    callback = SWEEPS.pop(parent_id, None)
    writer = callback.writer if callback is not None else Writer(uri)
    if callback is None:
        writer.adopt(PARENT, parent_id)
    interrupted = callback.close_open_runs() if callback is not None else 0
    counts, deadline = None, time.monotonic() + grace
    if writer.drain(max(grace - writer.announce_wait(grace), 0.0)):   # the store has every write: its runs are the truth
        try:
            interrupted += _close_interrupted(client, exp_id, parent_id)
            counts = outcomes(client, exp_id, parent_id)
        except Exception:  # noqa: BLE001 - the store failed again: Tune's view below
            counts = None
    if counts is None:
        counts = _outcomes_from_tune(callback, units)
    unfinished = max(total - sum(counts.get(s, 0) for s in FINAL_STATUSES), 0)
    writer.end(PARENT, "FINISHED" if unfinished == 0 and stopped is None else "KILLED")
    result = {**counts, "unfinished": unfinished, "interrupted_runs": interrupted}
    if not writer.close(max(deadline - time.monotonic(), 0.0)):
        from fedsweep.runs.kept import keep_unlogged
        from fedsweep.runs.store_errors import silence
        cause = writer.failure[0] if writer.failure else silence(grace)
        try:
            result["unlogged"] = str(keep_unlogged(writer, name, cause))
        except OSError as e:
            result["unlogged_lost"] = f"{cause}; and they could not be kept on disk either ({e})"
        result["mlflow_cause"] = cause
    gone = _record_gone(store)   # its folder was deleted while it ran: nothing to resume
    # The state file even then: it marks the folder (which Tune and the trials may have made again) as
    # this sweep's, so that --restart may delete it.
    storage = _save_state(store, {**state, "unlogged": result.get("unlogged"),
                                  "finished": unfinished == 0 and "unlogged" not in result and stopped is None})
    if gone:
        storage = f"the sweep's record in {store.where()} is gone (its folder was deleted while the sweep ran?)"
    if stopped is not None:
        result["stopped_by"] = _one_line(stopped)
    if storage:
        result["storage"] = storage
    if unfinished or stopped is not None or "unlogged" in result or gone:
        problem = resume_problem(store)
        result["recover"] = "--resume" if problem is None else "--restart"
        if problem:
            result["resume_problem"] = problem
    return result


def _record_gone(store) -> bool:
    try:
        return not store.exists(TRIALS_FILE)
    except OSError:
        return True


def _save_state(store, state: dict) -> str | None:
    """The sweep's state file; why it could not be written (a full or vanished storage), or None."""
    try:
        store.write_text(STATE_FILE, json.dumps(state))
    except OSError as e:
        return f"its state could not be written to {store.where()} ({_one_line(e)}){_full(store)}"
    return None


def _full(store) -> str:
    free = store.free_bytes()
    return f"; the storage has {free // 1024} KB free" if free is not None and free < 1 << 20 else ""


def _one_line(error: BaseException) -> str:
    text = (str(error).strip().splitlines() or [""])[0]
    line = f"{type(error).__name__}: {text}".rstrip(": ")
    return line if len(line) <= 300 else line[:299] + "…"


def resume_problem(store) -> str | None:
    """Why ``--resume`` cannot continue the sweep whose folder of the storage is ``store`` (None if
    it can): its state file and trials file must be whole, and so must Ray Tune's record (its
    newest experiment state and its tuner), which a storage that filled up mid-write leaves cut short."""
    root = store
    try:
        state = json.loads(store.read_text(STATE_FILE) or "null")
        trials = json.loads(store.read_text(TRIALS_FILE) or "null")
        names = store.names()
    except (OSError, ValueError) as e:
        return f"its record in {store.where()} cannot be read ({_one_line(e)})"
    if not isinstance(state, dict) or not isinstance(trials, dict):
        return f"its record in {store.where()} is gone"
    if state.get("parent_run_id") is None:
        return "it was stopped while it was being set up, before any trial started"
    if state.get("stage") == "confirm":   # the confirm stage's Tune run is the one to continue
        from fedsweep.sweep.confirm import look_experiment
        store = store.child(look_experiment(state.get("look", 1)))
        if "look_from" in state and look_not_started(store):
            return None   # stopped before Tune held any trial of the look: --resume starts it anew
        try:
            names = store.names()
        except OSError as e:
            return f"its confirm stage's record in {store.where()} cannot be read ({_one_line(e)})"
    if "tuner.pkl" not in names or not store.read_bytes("tuner.pkl"):
        return f"Ray Tune's record of it (tuner.pkl) is missing or empty in {store.where()}"
    unsealed = seal_problem(root, store)   # before Ray unpickles it
    if unsealed:
        return unsealed
    newest = max((n for n in names if n.startswith("experiment_state-") and n.endswith(".json")), default=None)
    if newest is None:
        return f"Ray Tune's record of its trials (experiment_state-*.json) is missing in {store.where()}"
    try:
        json.loads(store.read_text(newest))
    except (OSError, ValueError) as e:
        return f"Ray Tune's record of its trials ({newest}) is cut short or damaged ({_one_line(e)})"
    return None


def look_not_started(look) -> bool:
    """Ray Tune's record of a confirm look (its folder ``look``) holds no trial: the sweep was stopped
    between the look's planning and Tune's first snapshot with trials in it (Tune then fails to
    restore it, and restarts it from a state half read)."""
    try:
        names = look.names() if look.exists() else []
        newest = max((n for n in names if n.startswith("experiment_state-") and n.endswith(".json")), default=None)
        return newest is None or not json.loads(look.read_text(newest) or "{}").get("trial_data")
    except (OSError, ValueError):
        return False   # unreadable: resume_problem says so


def check_resumable_record(store, name: str) -> None:
    """``--resume`` refused in one line when :func:`resume_problem` finds one."""
    problem = resume_problem(store)
    if problem:
        raise ConfigError(f"--resume: sweep {name!r} cannot be continued: {problem}; start it over with --restart")


def replay_unlogged(state: dict, uri: str) -> int:
    """The MLflow writes an earlier driver of the sweep kept on disk (its store failed), made now,
    before any trial runs (its trials' runs must exist when the resumed trials look them up).
    Refused in one line while the store still fails: nothing is lost, nothing runs."""
    import os
    from pathlib import Path

    from fedsweep.runs.kept import load, replay
    from fedsweep.runs.writer import RECORDS
    folder = state.get("unlogged")
    if not folder or not os.path.isfile(os.path.join(folder, RECORDS)):
        return 0
    from fedsweep.runs.kept import damaged
    try:
        record = json.loads((Path(folder) / RECORDS).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--resume: the MLflow writes this sweep kept in {folder} cannot be read ({e}); "
                          "move the folder away to go on without them") from None
    problem = damaged(record, Path(folder))
    if problem:
        raise ConfigError(f"--resume: the MLflow writes this sweep kept in {folder} are damaged ({problem}); "
                          "move the folder away to go on without them (the trials' runs are finished from "
                          "their checkpoints)")
    try:
        made = replay(load(record, Path(folder), uri))
    except ConfigError as e:
        raise ConfigError(f"--resume: the MLflow writes this sweep kept in {folder} cannot be made yet: {e}") from None
    (Path(folder) / "logged.json").write_text(json.dumps({"tracking_uri": uri, "ids": record.get("ids", {})}))
    (Path(folder) / RECORDS).unlink()
    print(f"[mlflow] wrote the {made} records an earlier driver of this sweep kept in {folder}", file=sys.stderr)
    return made


def _outcomes_from_tune(callback, units: list[list[int]]) -> dict:
    """The sweep's outcome as Ray Tune saw it, with what this driver decided of each trial it ended
    (``incomplete``, and each failure's error): for when the MLflow store cannot be read."""
    counts: dict = {}
    errors: dict[str, int] = {}
    incomplete: dict[str, list[str]] = {}
    for trial in getattr(callback, "tune_trials", []):
        for index, status in zip(units[trial.config["trial"]], member_statuses(trial, units)):
            status, error = callback.ended.get(index, (status, ""))
            counts[status] = counts.get(status, 0) + 1
            if status == "failed":
                error = error or trial_error(trial)
                errors[error] = errors.get(error, 0) + 1
            elif status == "incomplete":
                incomplete.setdefault(error, []).append(callback.payloads[index].get("name", str(index)))
    return {**counts, "errors": errors, "incomplete_runs": incomplete}


def close_superseded(client, state: dict) -> None:
    """``--restart`` of an unfinished sweep (``state``: its state file): the MLflow runs it left open
    (a killed driver's, still RUNNING) end as an interrupted sweep's do, KILLED with
    ``fedsweep.status`` interrupted, and its parent run KILLED; otherwise they would show as running
    forever beside the new sweep's. A driver killed between creating the parent run and writing its
    id left the parent's ``fedsweep.sweep_id`` tag as the way to it."""
    from mlflow.exceptions import MlflowException
    parent_id = state.get("parent_run_id")
    if parent_id is None and state.get("sweep_id"):
        exp = client.get_experiment_by_name(state.get("experiment") or "")
        found = exp and client.search_runs([exp.experiment_id], max_results=1, filter_string=(
            f"tags.`fedsweep.role` = 'sweep' and tags.`fedsweep.sweep_id` = '{state['sweep_id']}'"))
        parent_id = found[0].info.run_id if found else None
    if parent_id is None:                  # killed before the parent run was made
        return
    try:
        parent = client.get_run(parent_id)
    except MlflowException:                # deleted since
        return
    _close_interrupted(client, parent.info.experiment_id, parent_id)
    if parent.info.status == "RUNNING":
        client.set_terminated(parent_id, status="KILLED")


def _close_interrupted(client, exp_id: str, parent_id: str) -> int:
    """Trials still open in the store become KILLED (tag ``interrupted``); ``--resume`` reopens them.
    Those of this driver are closed by its callback; these are a killed driver's."""
    from mlflow.entities import RunTag
    runs = client.search_runs([exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}' and "
                              "tags.`fedsweep.status` = 'running'", max_results=50_000)
    for r in runs:
        client.log_batch(r.info.run_id, tags=[RunTag("fedsweep.status", "interrupted")])
        client.set_terminated(r.info.run_id, status=MLFLOW_STATUS["interrupted"])
    return len(runs)


def outcomes(client, exp_id: str, parent_id: str) -> dict:
    """How many of the sweep's trials ended in each status; ``errors``: each failed trial's error
    line (its run's ``fedsweep.error`` tag) with how many trials ended with it; ``incomplete_runs``:
    for each reason a run ended without its summary, the names of those runs."""
    runs = client.search_runs([exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}' and "
                              "tags.`fedsweep.role` = 'trial'", max_results=50_000)
    counts: dict = {}
    errors: dict[str, int] = {}
    incomplete: dict[str, list[str]] = {}
    for r in runs:
        s = r.data.tags.get("fedsweep.status", "running")
        counts[s] = counts.get(s, 0) + 1
        e = r.data.tags.get("fedsweep.error", "no error recorded")
        if s == "failed":
            errors[e] = errors.get(e, 0) + 1
        elif s == "incomplete":
            incomplete.setdefault(e, []).append(r.info.run_name)
    return {**counts, "errors": errors, "incomplete_runs": incomplete}


class _TuneStateErrors(logging.Filter):
    """Ray Tune logs a traceback each time it cannot save its experiment state (a full storage):
    said once, in one line, here."""

    def __init__(self, where: str):
        super().__init__()
        self.where, self.said = where, False

    def filter(self, record: logging.LogRecord) -> bool:
        if "experiment state" not in record.getMessage():
            return True
        if not self.said:
            self.said = True
            cause = (str(record.exc_info[1]).strip().splitlines() or [""])[0] if record.exc_info else ""
            print(f"[storage] Ray Tune cannot save the sweep's record to {self.where} ({cause}); trials go on, "
                  "and the sweep's last lines say what recovers", file=sys.stderr, flush=True)
        return False


def quiet_tune_state_errors(where: str) -> None:
    logging.getLogger("ray.tune.execution.experiment_state").addFilter(_TuneStateErrors(where))
