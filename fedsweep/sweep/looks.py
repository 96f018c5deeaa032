"""The confirm stage as the sweep's driver plans it (:mod:`fedsweep.sweep.tune` runs it): its first
look once every tuning trial has ended, and with ``confirm.max_seeds`` each later look from the
comparisons the looks so far left open (:mod:`fedsweep.sweep.confirm`). Each is kept in the trials
and state files before it runs, so ``--resume`` continues exactly it."""
from __future__ import annotations

import json

from fedsweep.config.schema import ConfigError
from fedsweep.sweep import tuners
from fedsweep.sweep.progress import show
from fedsweep.sweep.storage import STATE_FILE, TRIALS_FILE, Storage, seal


def _every_trial_ended(payloads, client, exp_id, parent_id, grace, what: str) -> bool:
    """Every trial so far has ended, and the store holds their records (which the next look is planned
    from); False while some has not (Ctrl-C); ConfigError (``what``) where the store has not taken them."""
    from fedsweep.sweep.callbacks import FINAL_STATUSES, SWEEPS
    from fedsweep.sweep.ending import outcomes
    if not SWEEPS[parent_id].writer.drain(grace):
        raise ConfigError(f"confirm: the MLflow store has not taken every {what}")
    counts = outcomes(client, exp_id, parent_id)
    return sum(counts.get(s, 0) for s in FINAL_STATUSES) >= len(payloads)


def _start_look(sweep, payloads, units, planned, store: Storage, state: dict, uri, exp_id, parent_id, look: int,
                saved_extra: dict):
    """``planned`` kept in the trials file (as Tune trials packed like the others) and ``look`` in the
    state file, so that `--resume` runs exactly them; then (the trials, the units, the look's Tune run)."""
    from fedsweep.sweep.confirm import concurrent_slots, confirm_units
    first = len(units)
    units = units + confirm_units(sweep, planned, concurrent_slots(sweep))
    saved = json.loads(store.read_text(TRIALS_FILE))
    store.write_text(TRIALS_FILE, json.dumps({**saved, "trials": payloads + planned, "units": units, **saved_extra}))
    state["stage"], state["look"], state["look_from"] = "confirm", look, first
    store.write_text(STATE_FILE, json.dumps(state))
    payloads = payloads + planned
    tuner = tuners.confirm_tuner(sweep, payloads, units, first, store, state.get("sweep_id"), uri, exp_id, parent_id,
                                 look)
    from fedsweep.sweep.confirm import look_experiment
    seal(store, store.child(look_experiment(look)), state)   # before a kill could leave it unsealed
    return payloads, units, tuner


def plan_first_look(sweep, payloads, units, store: Storage, state: dict, uri, client, exp_id, parent_id, experiment,
                    grace):
    """The confirm stage planned from the tuning trials' runs (once the store holds every write of
    them, and every tuning trial has ended), kept in the trials and state files (so `--resume` runs
    exactly it), and its Tune run; None while some tuning trial has not ended (Ctrl-C)."""
    from fedsweep.sweep.confirm import plan_confirm
    if not _every_trial_ended(payloads, client, exp_id, parent_id, grace, "tuning trial's record, and the selected "
                              "configs are read from them; --resume plans the confirm stage once it has"):
        return None
    planned = plan_confirm(sweep, payloads, uri, experiment)
    started = _start_look(sweep, payloads, units, planned, store, state, uri, exp_id, parent_id, 1,
                          {"confirm_from": [len(payloads), len(units)]})
    added = len(started[1]) - len(units)
    packs = f" in {added} packs" if added < len(planned) else ""
    more = sweep.confirm.max_seeds and sweep.confirm.max_seeds > len(sweep.confirm.seeds)
    show(f"[sweep] confirm stage: {len(planned)} trials{packs}, each method's selected config per setting on seeds "
         f"{', '.join(map(str, sweep.confirm.seeds))}"
         + (f"; more, up to {sweep.confirm.max_seeds} seeds, where a comparison is not answered" if more else ""))
    return started


def plan_next_look(sweep, trials, payloads, units, store: Storage, state: dict, uri, client, exp_id, parent_id,
                   experiment, grace, look: int):
    """Look ``look`` of a sequential confirm stage (:func:`fedsweep.sweep.confirm.plan_look`): once every
    trial so far has ended and the store holds their records, the next seeds for the configs of the
    comparisons still open, kept in the trials and state files, and its Tune run; None once every
    comparison is answered, the looks are spent, or some trial has not ended (Ctrl-C)."""
    from fedsweep.sweep.confirm import looks, plan_look, seed_order
    plan = looks(sweep)
    if plan is None or look > len(plan):
        return None
    if not _every_trial_ended(payloads, client, exp_id, parent_id, grace, "confirm trial's record, which decide "
                              "which comparisons need more seeds; --resume goes on once it has"):
        return None
    resolution = max(t.config.eval.every for t in trials)
    planned, still_open = plan_look(sweep, payloads, uri, experiment, look, resolution)
    if not planned:
        show(f"[sweep] confirm stage: every comparison answered after {plan[look - 2]} seeds")
        return None
    started = _start_look(sweep, payloads, units, planned, store, state, uri, exp_id, parent_id, look, {})
    seeds = seed_order(sweep)[plan[look - 2]:plan[look - 1]]
    show(f"[sweep] confirm look {look} of {len(plan)}: {still_open} comparison{'s' if still_open != 1 else ''} "
         f"not answered after {plan[look - 2]} seeds; {len(planned)} trials, {len({p['config_id'] for p in planned})} "
         f"configs on seeds {', '.join(map(str, seeds))}")
    return started
