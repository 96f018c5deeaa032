"""With a scheduler a trial reports where ASHA decides (fedsweep.sweep.trainable.Rungs), not at every
evaluation: the decisions must be the ones reporting at every evaluation gets, from Ray's own ASHA."""
import random
from types import SimpleNamespace

import pytest
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from fedsweep.sweep.trainable import Rungs
from fedsweep.sweep.tuners import asha_rungs


def asha(grace, rf, max_t):
    return ASHAScheduler(time_attr="round", metric="acc", mode="max", grace_period=grace,
                         reduction_factor=rf, max_t=max_t)


def test_asha_rungs_are_read_from_rays_scheduler():
    assert asha_rungs(asha(10, 3, 100)) == [10, 30, 90]
    assert asha_rungs(asha(2, 2, 8)) == [2, 4, 8]            # the last rung is max_t itself
    assert asha_rungs(asha(5, 3.0, 200)) == [5, 15, 45, 135]
    assert asha_rungs(object()) is None                       # not found: trials report every evaluation


@pytest.mark.parametrize("grace,rf,every,seed", [(10, 3, 5, 0), (10, 3, 7, 1), (2, 2, 1, 2), (5, 2, 50, 3),
                                                 (3, 4, 2, 4), (1, 3, 1, 5)])
def test_reports_where_asha_decides_get_every_evaluations_decisions(grace, rf, every, seed):
    """Twelve trials with random accuracy curves, interleaved, fed to two real ASHA schedulers: one
    sees every evaluation, the other only the reports the trials make with Rungs and the final one,
    plus reports at random other evaluations (a trial also reports once a second). Each trial is
    stopped at the same round by both, and both record the same values at the same rungs."""
    rng = random.Random(seed)
    rounds = 200
    every_eval, rung_only = asha(grace, rf, rounds), asha(grace, rf, rounds)
    trials = [SimpleNamespace(trial_id=f"t{i}") for i in range(12)]
    for t in trials:
        every_eval.on_trial_add(None, t)
        rung_only.on_trial_add(None, t)
    curves = {t.trial_id: [rng.random() * r for r in range(rounds + 1)] for t in trials}
    rungs = {t.trial_id: Rungs(asha_rungs(rung_only)) for t in trials}
    stopped = {"every": {}, "rungs": {}}
    reports = {"every": 0, "rungs": 0}
    for r in range(every, rounds + 1, every):
        for t in trials:
            result = {"round": r, "acc": curves[t.trial_id][r]}
            if t.trial_id not in stopped["every"]:
                reports["every"] += 1
                if every_eval.on_trial_result(None, t, result) == TrialScheduler.STOP:
                    stopped["every"][t.trial_id] = r
            final = r + every > rounds                    # the last evaluation is always reported
            if t.trial_id not in stopped["rungs"] and (rungs[t.trial_id].due(r) or final or rng.random() < 0.2):
                reports["rungs"] += 1
                rungs[t.trial_id].reported(r)
                if rung_only.on_trial_result(None, t, result) == TrialScheduler.STOP:
                    stopped["rungs"][t.trial_id] = r
    assert stopped["every"] == stopped["rungs"] and stopped["every"]          # some were stopped
    assert [dict(rec) for _, rec in every_eval._brackets[0]._rungs] == \
        [dict(rec) for _, rec in rung_only._brackets[0]._rungs]
    if every < grace:
        assert reports["rungs"] < reports["every"] / 2
