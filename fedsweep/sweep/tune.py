"""``fedsweep tune``: a sweep file -> Ray Tune trials -> MLflow parent/child runs (docs/design.md §1.3, §4).

Layout of the work (the measurements behind it: docs/design.md §7):

- the sweep's trials are grouped into units (:func:`fedsweep.sweep.units.pack_units`): one trial each,
  or packs of several trained together (``pack:``, :mod:`fedsweep.sweep.pack`); Tune runs one function
  trainable per unit (:mod:`fedsweep.sweep.trainable`), which checkpoints at a stable path of its own in
  the sweep's storage (:mod:`fedsweep.sweep.storage`: a folder, or a URI, that every node reaches; on a
  cluster each node is checked before any trial starts). Tune is given no checkpoints: its
  experiment snapshot can name a checkpoint it has already rotated away, and a sweep killed in that
  window could not restore the trial;
- only the driver writes to MLflow (:mod:`fedsweep.sweep.callbacks`): one child run per sweep
  trial, packed or not;
- this module checks everything before anything is written, holds the sweep's lock, starts (or
  joins) Ray, and closes the sweep's MLflow runs when Tune returns.
"""
from __future__ import annotations

import contextlib
import functools
import json
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from fedsweep.config.schema import ConfigError, flatten
from fedsweep.sweep.storage import STATE_FILE, TRIALS_FILE, Storage, seal
from fedsweep.sweep.search import search_summary
from fedsweep.sweep.progress import show, silenced
from fedsweep.sweep.dryrun import dry_run as print_dry_run
from fedsweep.sweep.checks import check_report, check_runnable, select_on_validation
from fedsweep.sweep.spec import (SweepConfig, Trial, iter_trials, load_sweep, run_name, sweep_record, sweep_source,
                                 trial_count, varying_keys)
from fedsweep.sweep.units import pack_units
from fedsweep.sweep import tuners
from fedsweep.sweep.looks import plan_first_look, plan_next_look

DEFAULT_STORAGE = "fedsweep_runs"   # in the driver's working folder


# ---------------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------------

def _trial_payload(t: Trial, sweep: SweepConfig, varying: list[str], recorded) -> dict:
    run = t.config.model_dump(mode="json")
    run["mlflow"]["enabled"] = False                       # the driver writes MLflow
    if run["device"] == "auto" and sweep.resources.gpu == 0:
        run["device"] = "cpu"                              # Ray leaves CUDA visible to CPU trials
    for key in ("root", ):                                 # trials run in Ray's working dirs
        if run["data"].get(key):
            run["data"][key] = str(Path(run["data"][key]).resolve())
    if run["heterogeneity"].get("trace"):
        run["heterogeneity"]["trace"] = str(Path(run["heterogeneity"]["trace"]).resolve())
    payload = {"run": run, "method": t.method, "seed": t.seed, "config_id": t.config_id, "label": t.label,
               "name": run_name(t, varying), "index": t.index}
    if t.config.plugins:   # what each run records, and what a worker checks it imports (sweep/trainable.py)
        payload["plugins"] = recorded(tuple(t.config.plugins))
    if t.sampled:   # what spec.drawn_payload needs once its values are drawn
        payload.update(overrides=t.overrides, varying=varying, draw=t.sample)
    return payload


def _trial_payloads(trials: list[Trial], sweep: SweepConfig) -> list[dict]:
    varying = varying_keys(trials)
    from fedsweep.config.plugins import records
    recorded = functools.lru_cache(maxsize=None)(lambda specs: records(list(specs)))   # once per sweep and set
    return [_trial_payload(t, sweep, varying, recorded) for t in trials]


def _current_trials_file(text: str | None) -> bool:
    """A trials file as this fedsweep writes it (older ones held a bare list of trials)."""
    try:
        return text is not None and isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _changed_since_start(saved: dict, payloads: list[dict], units: list[list[int]], search: str = "") -> str:
    """How the trials of a sweep file now differ from those its sweep started with ('' if they do
    not): `--resume` runs the saved trials, so an edit made since would be silently ignored. Keys a
    later fedsweep added to the config (absent from the saved trials) are not compared."""
    if saved.get("search", search) != search:   # an optuna slot's values are not in its payload
        return f"{saved['search'] or 'no search'} then, {search or 'no search'} now"
    old, new = saved["trials"], json.loads(json.dumps(payloads))   # compared as saved: JSON values
    if len(old) != len(new):
        return f"{len(old)} trials then, {len(new)} now"
    differ = []
    for i, (a, b) in enumerate(zip(old, new)):
        fa, fb = flatten(a["run"]), flatten(b["run"])
        keys = [k for k in fa if fa[k] != fb.get(k)]
        if keys:
            differ.append(f"{a.get('label', f'trial {i}')}: " +
                          ", ".join(f"{k} {fa[k]!r} then, {fb.get(k)!r} now" for k in keys[:3]))
    if differ:
        return f"{len(differ)} of {len(old)} trials differ; {differ[0]}"
    if saved["units"] != units:
        return f"its trials were packed into {len(saved['units'])} units, now {len(units)} (pack:)"
    return ""


def _search_text(sweep: SweepConfig) -> str:
    return search_summary(sweep) if sweep.search is not None else ""


def open_storage(location: str | Path | None = None) -> Storage:
    """``--storage``: a folder (default ``./fedsweep_runs``) or a URI (:mod:`fedsweep.sweep.storage`)."""
    return Storage(location or Path.cwd() / DEFAULT_STORAGE)


def lock_folder(storage: Storage) -> Path:
    """Where a sweep's lock file lives: in a folder storage, else (a URI) in ``./fedsweep_runs``; a
    lock is a file of the driver's machine (:class:`~fedsweep.util.locks.SweepLock`)."""
    return Path(storage.root) if storage.local else Path.cwd() / DEFAULT_STORAGE


def _discard(store: Storage) -> None:
    """Delete a finished or restarted sweep's folder (``store``), and only a folder fedsweep made:
    its state file must be inside. Anything else under that name is the user's, and is left alone.
    An empty folder (a driver killed right after making it leaves one) holds nothing: the sweep uses
    it as it is."""
    if store.is_empty():
        return
    if not store.exists(STATE_FILE):
        raise ConfigError(f"{store.where()} exists and was not made by fedsweep (no {STATE_FILE} inside); it is "
                          "left as it is: give the sweep another `name`, or another --storage")
    store.delete()


def tune_sweep(path: str | Path | dict, *, resume: bool = False, restart: bool = False, address: str | None = None,
               dry_run: bool = False, storage: str | Path | None = None, out=None, show_all: bool = False,
               progress: bool = True) -> dict:
    """Run (or resume) a sweep; returns counts of trial outcomes and the MLflow parent run id.

    ``path``: the sweep file, or (the Python API) its mapping, whose messages call it ``sweep`` and
    whose parent run keeps it as ``sweep.yaml``, written from the mapping. ``progress``: the sweep's
    terminal view (:mod:`fedsweep.sweep.progress`; False: :func:`~fedsweep.sweep.progress.silenced`).

    Everything that can be checked is checked before anything is written: the sweep file, the
    cluster (reachable, same authentication mode), the storage and the MLflow store; what
    ``--resume`` needs of the sweep it continues, under the sweep's lock (which exists by then); on
    a cluster, that every node a trial fits on reaches the storage (once Ray is up, before the MLflow
    experiment is made). A second driver of a running sweep is refused
    (:class:`~fedsweep.util.locks.SweepLock`); one that finds the lock of a killed driver ends what that
    driver's local Ray instance left running."""
    from fedsweep.runs.tracking import check_store
    out = out or sys.stdout
    sweep = load_sweep(path)
    source = sweep_source(path)
    if dry_run:
        return print_dry_run(sweep, source, out, show_all=show_all, local=not address)
    record = sweep_record(path)   # the parent run's sweep.yaml: the file as it was read, or the mapping
    from fedsweep.sweep.dryrun import Progress
    trials = list(iter_trials(sweep, source=source, progress=Progress(trial_count(sweep)) if progress else None))
    check_report(sweep, trials, source=source)   # a typo here would only surface after the sweep
    select_on_validation(sweep, trials, source=source)

    check_runnable(sweep, trials, source=source, local=not address)
    mode = None
    if address:
        from fedsweep.sweep.cluster import check_cluster
        mode = check_cluster(address)                  # reachable, and in the head's auth mode
    else:
        from fedsweep.sweep.cluster import check_local_ray
        check_local_ray()                              # Ray's temporary folder, and its token under HOME
    root = open_storage(storage)
    root.check_writable()
    uri = check_store(sweep.mlflow.tracking_uri or sweep.base.get("mlflow", {}).get("tracking_uri"))
    store = root.child(sweep.name)
    if resume and not store.exists(STATE_FILE):       # before the lock, which would make its folder
        raise ConfigError(f"--resume: no sweep {sweep.name!r} to resume under {root.where()}")
    from fedsweep.util.locks import SweepLock, end_leftovers
    with SweepLock(lock_folder(root) / f"{sweep.name}.lock", sweep.name) as lock:
        stale = lock.acquire()
        ended = end_leftovers(stale) if stale else []
        if ended:
            print(f"ended {len(ended)} Ray processes left by a killed fedsweep driver (pid {stale.get('pid')})",
                  file=sys.stderr)
        if resume:   # under the lock: a driver still setting the sweep up is named as running, not misread
            _check_resumable(sweep, trials, source, store)
        superseded = None
        if not resume and store.exists():
            text = store.read_text(STATE_FILE)
            state = json.loads(text) if text is not None else {}
            if state.get("finished") or restart or text is None:
                _discard(store)                        # refuses a folder that is not a fedsweep sweep's
                if not state.get("finished") and state.get("tracking_uri") == uri:
                    superseded = state   # `--restart`: its open runs are over
            else:
                from fedsweep.sweep.ending import resume_problem
                problem = resume_problem(store)
                how = "continue it with --resume, or start over with --restart" if problem is None else \
                    f"--resume cannot continue it ({problem}): start it over with --restart"
                raise ConfigError(f"sweep {sweep.name!r} has an unfinished run in {store.where()}; {how}")
        from mlflow.exceptions import MlflowException
        try:
            with contextlib.nullcontext() if progress else silenced():
                return _run_sweep(sweep, trials, source, record, root, uri, resume=resume, address=address, mode=mode,
                                  lock=lock, superseded=superseded)
        except MlflowException as e:   # the store failed while the sweep was set up (Tune's own run never raises it)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise ConfigError(f"MLflow store {uri}: {first}; no trial ran: try again once it answers") from None


def _check_resumable(sweep: SweepConfig, trials: list[Trial], source: str, store: Storage) -> None:
    """``--resume``: the sweep whose state is in ``store`` got as far as its trials, and started from
    this sweep file (or mapping)."""
    if json.loads(store.read_text(STATE_FILE)).get("parent_run_id") is None:
        raise ConfigError(f"--resume: sweep {sweep.name!r} in {store.where()} was stopped while it was being set up, "
                          "before any trial started; start it over with --restart")
    from fedsweep.sweep.ending import check_resumable_record
    check_resumable_record(store, sweep.name)
    saved = store.read_text(TRIALS_FILE)
    if not _current_trials_file(saved):
        raise ConfigError(f"--resume: {store.where()} was made by an older fedsweep (its {TRIALS_FILE} is missing or "
                          "of an older format); start it over with --restart")
    saved = json.loads(saved)
    recorded = next((t["plugins"] for t in saved["trials"] if t.get("plugins")), None)
    if recorded:   # before the comparison of configs: a changed plugin is the one thing to say
        from fedsweep.config.plugins import check_unchanged
        check_unchanged(recorded, "--resume")
    n_trials, n_units = saved.get("confirm_from", [len(saved["trials"]), len(saved["units"])])   # the tuning part
    changed = _changed_since_start({**saved, "trials": saved["trials"][:n_trials], "units": saved["units"][:n_units]},
                                   _trial_payloads(trials, sweep), pack_units(sweep, trials), _search_text(sweep))
    from fedsweep.sweep.confirm import confirm_record
    then, now = saved.get("confirm"), confirm_record(sweep)
    if not changed and then != now:
        changed = f"confirm {_confirm_text(then)} then, {_confirm_text(now)} now"
    if changed:
        what = "the mapping" if source == "sweep" else "the file"
        raise ConfigError(f"--resume: {source} changed since sweep {sweep.name!r} started ({changed}); a resumed "
                          f"sweep runs the trials it started with: restore {what} (its MLflow parent run "
                          f"keeps it as sweep.yaml), or start the edited sweep over with --restart")


def _confirm_text(record) -> str:
    if not record:
        return "none"
    if isinstance(record, dict):
        return f"seeds {record['seeds']} up to {record['max_seeds']} in steps of {record['step']}"
    return f"seeds {record}"


def _run_sweep(sweep: SweepConfig, trials: list[Trial], source: str, record: bytes, root: Storage, uri: str, *,
               resume: bool, address: str | None, mode: str | None, lock, superseded: dict | None = None) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from fedsweep.sweep.cluster import check_trial_fits, nodes_a_trial_fits, ray_session, remove_session
    from fedsweep.runs.tracking import experiment_id, open_store, quiet_store_logs
    quiet_store_logs()   # the driver imports neither Lightning (~4 s) nor torch (~0.8 s)
    experiment = sweep.mlflow.experiment or sweep.name
    with ThreadPoolExecutor(1) as pool:
        # MLflow's import and the store's opening (its schema migrations, for a new store) take
        # seconds, mostly while Ray starts its processes: overlap them. The experiment and the runs
        # are written only once Ray is up and the trials fit on it: a sweep refused there leaves no
        # experiment behind (only a store that did not exist yet, as its schema).
        mlflow_store = pool.submit(open_store, uri)
        shipped = None
        if address:   # a cluster's nodes may not have the driver's disk: Ray carries the plugins to them
            from fedsweep.config.plugins import ship_paths
            shipped = ship_paths(list(dict.fromkeys(s for t in trials for s in t.config.plugins))) or None
        with ray_session(address, mode=mode, py_modules=shipped) as session:
            lock.write(ray_session=session)   # what a driver taking over after a SIGKILL must end
            waiting = check_trial_fits(sweep.resources.cpu, sweep.resources.gpu, address, source=source)
            if waiting:
                print(waiting, file=sys.stderr)
            if address:   # one machine's instance shares the driver's disk by definition
                from fedsweep.sweep.storage import check_nodes_reach
                check_nodes_reach(root, nodes_a_trial_fits(sweep.resources.cpu, sweep.resources.gpu))
            client = mlflow_store.result()
            from fedsweep.runs.orphans import end_orphaned_runs
            end_orphaned_runs(uri)   # runs of killed `fedsweep run`s: never left RUNNING
            exp_id = experiment_id(client, experiment, uri)
            if superseded:
                from fedsweep.sweep.ending import close_superseded
                close_superseded(client, superseded)
            result = _fit(sweep, trials, record, root, uri, resume, client, exp_id, experiment, source)
    # The local instance's session folder (Ray's logs) is deleted once every trial ended well, and kept
    # where one failed or the sweep was cut short: there it is what to read (a crashed worker's stderr).
    ended_well = not address and not result["unfinished"] and not result.get("failed")
    return {**result, "ray_session": session,
            "ray_session_kept": bool(session) and not (ended_well and remove_session(session))}


def _fit(sweep, trials, record: bytes, root: Storage, uri, resume, client, exp_id, experiment, source: str) -> dict:
    """Inside the Ray session: the parent run, Tune's run of the tuning stage (new or restored), then,
    with ``confirm:``, the confirm stage's (:mod:`fedsweep.sweep.confirm`), and the sweep's outcome."""
    from fedsweep.sweep.confirm import confirm_record, confirm_size, look_experiment, most_confirm_trials
    from fedsweep.sweep.ending import end_sweep, look_not_started, quiet_tune_state_errors, replay_unlogged
    store = root.child(sweep.name)
    if resume:
        state = json.loads(store.read_text(STATE_FILE))
        parent_id = state["parent_run_id"]
        replay_unlogged(state, uri)   # what an earlier driver's store did not take: before any trial runs
        saved = json.loads(store.read_text(TRIALS_FILE))
        payloads, units = saved["trials"], saved["units"]
        client.set_terminated(parent_id, status="RUNNING")
    else:
        units = pack_units(sweep, trials)
        # The state file first: from here on the folder is known as this sweep's (`--restart` may
        # delete it), whatever a kill leaves of the rest; it names the parent run by a tag the run
        # carries from its creation, so a driver killed before the run's id is written below still
        # leaves the way to close it. Each trial reads it to know its node reaches the storage.
        state = {"sweep_id": uuid.uuid4().hex, "parent_run_id": None, "tracking_uri": uri,
                 "experiment": experiment, "finished": False}
        store.write_text(STATE_FILE, json.dumps(state))
        parent_id = _create_parent(client, exp_id, sweep, trials, units, record, state["sweep_id"], source)
        state["parent_run_id"] = parent_id
        store.write_text(STATE_FILE, json.dumps(state))
        payloads = _trial_payloads(trials, sweep)
        store.write_text(TRIALS_FILE, json.dumps({"trials": payloads, "units": units, "search": _search_text(sweep),
                                                  "confirm": confirm_record(sweep)}))
    confirming = state.get("stage") == "confirm"
    look = state.get("look", 1) if confirming else 0           # the confirm stage's look under way
    ahead = 0 if confirming else confirm_size(sweep, trials)   # confirm trials not planned yet
    most = 0 if confirming else most_confirm_trials(sweep, trials)
    total = len(payloads) + ahead
    packs = f" in {len(units)} packs" if len(units) < len(payloads) else ""
    upto = f" (up to {most} as seeds are added until answered)" if most > ahead else ""
    then = f", then {ahead} confirm trials{upto}" if ahead else " (on to its confirm stage)" if confirming else ""
    show(f"{sweep.name}: {len(payloads) if not confirming else total} trials{packs}{then}; MLflow experiment "
         f"{experiment!r} at {uri}")
    from fedsweep.util.startup import end_startup
    end_startup()   # the driver's imports (Ray, MLflow) are done
    quiet_tune_state_errors(store.where())
    grace = float(payloads[0]["run"]["mlflow"].get("retry_seconds", 120.0))
    sweep_id = state.get("sweep_id")
    where = store.child(look_experiment(look)) if confirming else store
    if resume and confirming and "look_from" in state and look_not_started(where):
        where.delete()   # what Tune wrote of the look before any trial: it starts anew, as planned
        tuner = tuners.confirm_tuner(sweep, payloads, units, state["look_from"], store, sweep_id, uri, exp_id,
                                     parent_id, look, adopt=True)
        seal(store, where, state)
    elif resume:
        tuner = tuners.restored_tuner(sweep, payloads, units, store, sweep_id, where)
    else:
        tuner = tuners.new_tuner(sweep, trials, payloads, units, root, store, sweep_id, uri, exp_id, parent_id)
        seal(store, store, state)
    stopped, grace = _drive(tuner, lambda: tuners.restored_tuner(sweep, payloads, units, store, sweep_id, where), grace)
    while stopped is None and sweep.confirm is not None:   # the confirm stage, a look at a time
        try:
            planned = (plan_first_look(sweep, payloads, units, store, state, uri, client, exp_id, parent_id, experiment,
                                     grace) if look == 0 else
                       plan_next_look(sweep, trials, payloads, units, store, state, uri, client, exp_id, parent_id,
                                       experiment, grace, look + 1))
        except ConfigError as e:   # the records cannot be read, or a method has none to select
            stopped, planned = e, None
        except KeyboardInterrupt as e:   # Ctrl-C while the look is planned: --resume plans it again
            stopped, planned = e, None
        if planned is None:        # interrupted (Ctrl-C: --resume goes on with it), or every question answered
            break
        payloads, units, tuner = planned
        look, total = look + 1, len(payloads)
        stopped, grace = _drive(tuner, lambda: tuners.restored_tuner(
            sweep, payloads, units, store, sweep_id, store.child(look_experiment(look))), grace)
    ended = end_sweep(name=sweep.name, store=store, state=state, parent_id=parent_id, total=total, units=units,
                      uri=uri, client=client, exp_id=exp_id, grace=grace, stopped=stopped)
    return {"trials": total, "sweep": sweep.name, "parent_run_id": parent_id, "tracking_uri": uri,
            "experiment": experiment, "experiment_id": exp_id, **ended}


def _drive(tuner, restore, grace: float):
    """Run ``tuner`` to its end; returns (what stopped it, or None; the grace left for MLflow's writes)."""
    for lost in range(LOST_RESULT_RETRIES + 1):
        try:
            with _own_ctrl_c():
                tuner.fit()
            return None, grace
        except RuntimeError as e:
            if lost == LOST_RESULT_RETRIES or not _lost_with_its_node(e):
                return e, grace
            # A node died after a trial's result was made there and before the driver fetched it:
            # Ray Tune 2.60 stops on that (it expects only an actor's death). What a trial needs to
            # go on is in the storage, so the sweep continues as `--resume` would, in this process.
            print("[sweep] Ray Tune stopped: a trial's result was lost with its node; continuing from "
                  "the trials' checkpoints, as --resume would", file=sys.stderr)
            tuner = restore()
        except Exception as e:  # noqa: BLE001 - Tune stopped on a fault (a full or vanished storage): said after
            return e, grace
        except KeyboardInterrupt as e:   # a second Ctrl-C: Tune stops at once; what it left open is closed
            return e, min(grace, 5.0)
    return None, grace


@contextlib.contextmanager
def _own_ctrl_c():
    """Ray Tune's Ctrl-C handler only while Tune runs: Tune 2.60 installs it at each run's start and
    leaves it installed when the run ends well, where a Ctrl-C (while the confirm stage's next look is
    planned, or the sweep ends) would set the flag of a run that is over and be lost."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():   # Tune installs none there either
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


LOST_RESULT_RETRIES = 3   # restores in one driver after results lost with dead nodes, then it stops


def _lost_with_its_node(error: RuntimeError) -> bool:
    """Ray Tune's "Caught unexpected exception" around a result object that died with its node."""
    from ray.exceptions import ObjectLostError
    return isinstance(error.__cause__, ObjectLostError)


def _create_parent(client, exp_id: str, sweep: SweepConfig, trials: list[Trial], units: list[list[int]],
                   record: bytes, sweep_id: str, source: str) -> str:
    # What the sweep is, as tags, not params: the MLflow UI offers every param of the runs shown in
    # its pickers (Compare, charts, Group by), where the parent's grid would stand beside, and before,
    # the children's own keys with no value for them.
    described = {"sweep.trials": len(trials), "sweep.seeds": sweep.seeds,
                 "sweep.methods": ",".join(sorted({t.method for t in trials})), "sweep.pack": sweep.pack,
                 "sweep.units": len(units), **{f"sweep.grid.{k}": v for k, v in sweep.grid.items()},
                 **({"sweep.search": search_summary(sweep)} if sweep.search is not None else {})}
    from fedsweep.config.plugins import load_plugins, plugin_tags, records, source_files
    # imported before the run exists (the reports package takes seconds to import): what follows the run's
    # creation is a few quick writes, not an import a locked store could overtake
    from fedsweep.reports.view import write_view
    specs = list(dict.fromkeys(s for t in trials for s in t.config.plugins))
    run = client.create_run(exp_id, run_name=sweep.name, tags={
        "fedsweep.role": "sweep", "fedsweep.sweep": sweep.name, "fedsweep.sweep_id": sweep_id,
        # which file it was: another file of the same `name:` writes into the same sweep (the report says so)
        "fedsweep.sweep_file": str(Path(source).resolve()) if source != "sweep" else "(a mapping, from Python)",
        **{k: str(v)[:8000] for k, v in described.items()}, **plugin_tags(records(specs))})
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sweep.yaml").write_bytes(record)
        for plugin in load_plugins(specs):   # the code the trials run, beside the file that names it
            for name, file in source_files(plugin):
                (Path(tmp) / "plugins" / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(file, Path(tmp) / "plugins" / name)
        client.log_artifacts(run.info.run_id, tmp)
    write_view(client, exp_id, sweep, trials)   # the MLflow UI's views of the config runs (`fedsweep ui` opens them)
    return run.info.run_id
