"""Ray Tune's runs of a sweep (:mod:`fedsweep.sweep.tune` drives them): the tuning stage's (a grid
over the sweep's units, or optuna's slots; ASHA), the confirm stage's (:mod:`fedsweep.sweep.confirm`:
the selected configs on fresh seeds, a Tune experiment of its own), and either restored from the
storage. Every one runs :func:`fedsweep.sweep.trainable.run_unit` and reports to the same driver
callbacks (MLflow, the terminal)."""
from __future__ import annotations

from fedsweep.config.schema import ConfigError
from fedsweep.sweep.callbacks import make_mlflow_callback
from fedsweep.sweep.progress import make_progress_callback
from fedsweep.sweep.spec import SweepConfig, Trial
from fedsweep.sweep.storage import Storage, seal_problem
from fedsweep.sweep.trainable import run_unit

# A trial reports to Tune at most this often (every row still arrives), and where a scheduler decides:
# a report is a round trip to the driver, and a 1-second trial evaluating every 5 rounds made 20.
REPORT_EVERY_S = 1.0


def restored_tuner(sweep: SweepConfig, payloads: list[dict], units: list[list[int]], store: Storage,
                   sweep_id: str | None, where: Storage | None = None):
    """Tune's run of the sweep from its experiment state in the storage (``--resume``, or after a
    result lost with its node): finished trials stay finished, the others continue from their
    checkpoints. ``where``: the folder of that Tune experiment (default the sweep's, ``store``; the
    confirm stage's is inside it). Its tuner.pkl is checked first (:func:`fedsweep.sweep.storage.seal_problem`)."""
    from ray import tune
    where = where or store
    problem = seal_problem(store, where)
    if problem:
        raise ConfigError(f"--resume: {problem}; start the sweep over with --restart")
    return tune.Tuner.restore(where.root, trainable=trainable(sweep, payloads, units, store, sweep_id),
                              resume_errored=True, storage_filesystem=where.fs)


def trainable(sweep: SweepConfig, payloads: list[dict], units: list[list[int]], store: Storage,
               sweep_id: str | None):
    """``run_unit`` with the trials' configs and the sweep's storage put once into Ray's object store
    (every node reads them there) and each unit's resources."""
    from ray import tune
    return tune.with_resources(tune.with_parameters(run_unit, payloads=payloads, units=units, store=store,
                                                    sweep_id=sweep_id),
                               {"cpu": sweep.resources.cpu, "gpu": sweep.resources.gpu})


def asha_rungs(scheduler) -> list[float] | None:
    """The rounds at which an ASHA scheduler decides on a trial (its rungs: grace period × η^k up to
    max_t), where each trial must report (:class:`fedsweep.sweep.trainable.Rungs`); read from the scheduler
    itself (Ray keeps them in its brackets' ``_rungs``), so they are Ray's own to the last bit. None
    where a Ray version keeps them elsewhere: trials then report at every evaluation."""
    try:
        return sorted({float(milestone) for bracket in scheduler._brackets for milestone, _ in bracket._rungs})
    except (AttributeError, TypeError, ValueError):
        return None


def optuna_studies(sweep: SweepConfig, trials: list[Trial]):
    """``searcher: optuna``'s Tune searcher over the sweep's slots (:mod:`fedsweep.sweep.searcher`), else None."""
    if sweep.search is None or sweep.search.searcher != "optuna":
        return None
    from fedsweep.sweep.search import method_space
    from fedsweep.sweep.searcher import Studies
    methods = {t.study: t.method for t in trials}   # each study's method, its space read once
    spaces = {study: method_space(sweep, method) for study, method in methods.items()}
    return Studies([(t.index, t.study, t.sample) for t in trials], spaces, sweep.search.metric, sweep.search.mode,
                   sweep.search.seed, sweep.search.startup())


def new_tuner(sweep, trials, payloads, units, root: Storage, store: Storage, sweep_id: str, uri, exp_id, parent_id):
    """The tuning stage's Tune run: a grid over the units (or optuna's slots, handed out by its
    studies), ASHA where the sweep asks, the experiment named by the sweep under ``root``."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    scheduler = None
    if sweep.scheduler is not None:
        s = sweep.scheduler
        scheduler = ASHAScheduler(time_attr="round", metric=s.metric, mode=s.mode, grace_period=s.grace_period,
                                  reduction_factor=s.reduction_factor,
                                  max_t=max(p["run"]["rounds"] for p in payloads))
    studies = optuna_studies(sweep, trials)   # with optuna, it hands Tune each trial's index and drawn values
    param_space = {**({"trial": tune.grid_search(list(range(len(units))))} if studies is None else {}),
                   "checkpoint_every": sweep.checkpoint_every, "report_every_s": REPORT_EVERY_S,
                   "scheduler": scheduler is not None,   # it may stop a trial at any report
                   "rungs": asha_rungs(scheduler) if scheduler is not None else None}
    return tune.Tuner(
        trainable(sweep, payloads, units, store, sweep_id), param_space=param_space,
        tune_config=tune.TuneConfig(scheduler=scheduler, reuse_actors=True, search_alg=studies,
                                    num_samples=1 if studies is None else len(units),
                                    max_concurrent_trials=sweep.max_concurrent),
        run_config=tune.RunConfig(
            name=sweep.name, **root.tune_args(), verbose=0,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            callbacks=[make_mlflow_callback(uri, exp_id, parent_id, sweep.name, store, payloads, units),
                       make_progress_callback(payloads, units, store,
                                              later="to draw" if studies is not None else "pending",
                                              settings=sweep.report.settings, metric=sweep.report.metric,
                                              mode=sweep.report.mode)]))


def confirm_tuner(sweep, payloads, units, first: int, store: Storage, sweep_id: str, uri, exp_id, parent_id,
                  look: int = 1, adopt: bool = False):
    """The confirm stage's Tune run (:mod:`fedsweep.sweep.confirm`) of look ``look``: units ``first``
    onwards (the selected configs on the look's confirm seeds), each run to its last round (no
    scheduler, nothing drawn), as a Tune experiment of its own inside the sweep's folder of the storage."""
    from ray import tune

    from fedsweep.sweep.confirm import look_experiment
    indices = [i for unit in units[first:] for i in unit]
    return tune.Tuner(
        trainable(sweep, payloads, units, store, sweep_id),
        param_space={"trial": tune.grid_search(list(range(first, len(units)))), "checkpoint_every": sweep.checkpoint_every,
                     "report_every_s": REPORT_EVERY_S, "scheduler": False, "rungs": None},
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=sweep.max_concurrent),
        run_config=tune.RunConfig(
            name=look_experiment(look), **store.tune_args(), verbose=0,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            callbacks=[make_mlflow_callback(uri, exp_id, parent_id, sweep.name, store, payloads, units, adopt),
                       make_progress_callback(payloads, units, store, indices=indices,
                                              settings=sweep.report.settings, metric=sweep.report.metric,
                                              mode=sweep.report.mode, lead=False)]))
