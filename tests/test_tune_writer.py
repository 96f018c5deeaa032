"""The sweep driver's MLflow writer (fedsweep.tune_callbacks.MlflowTrials): Tune's hooks only queue
MLflow work for one writer thread; Tune's snapshot (``get_state``) and the sweep's end wait for it."""
import threading

import pytest
from mlflow import MlflowClient
from ray.tune.experiment import Trial

from fedsweep.tune_callbacks import make_mlflow_callback

RUN = {"rounds": 3, "clients_per_round": 2, "device": "cpu",
       "data": {"name": "digits", "num_clients": 4}, "model": {"name": "mlp", "hidden": 8}}


def rows(first, last):
    return [{"round": r, "train/loss": 1.0 / r, "test/accuracy": 0.5, "test/loss": 1.0} for r in range(first, last + 1)]


@pytest.fixture()
def writer(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("w")
    parent = client.create_run(exp).info.run_id
    payloads = [{"run": RUN, "method": "fedavg", "seed": 0, "config_id": f"c{i}", "label": f"t{i}", "index": i}
                for i in range(2)]
    cb = make_mlflow_callback(uri, exp, parent, "w", str(tmp_path / "ckpt"), payloads, [[0], [1]])
    yield cb, client, exp
    if cb.writer is not None:
        cb.writer.shutdown()


def test_hooks_queue_and_get_state_waits_for_every_write(writer):
    cb, client, exp = writer
    trials = [Trial("run_unit", config={"trial": i}, trial_id=f"t_0000{i}", stub=True) for i in range(2)]
    gate = threading.Event()
    cb._later(gate.wait)                       # the writer is busy: everything after it waits in the queue
    for i, t in enumerate(trials):
        cb.on_trial_start(0, trials, t)
        cb.on_trial_result(0, trials, t, {"members": {str(i): {"rows": rows(1, 3), "engine": "vectorized"}}})
    assert client.search_runs([exp], filter_string="tags.`fedsweep.role` = 'trial'") == []   # nothing written yet

    state = threading.Thread(target=cb.get_state)   # Tune saving its snapshot
    state.start()
    state.join(0.3)
    assert state.is_alive()                         # ... waits for the writer
    gate.set()
    state.join(30)
    assert not state.is_alive()
    runs = client.search_runs([exp], filter_string="tags.`fedsweep.role` = 'trial'")
    assert sorted(r.info.run_name for r in runs) == ["t0", "t1"]   # written, in the hooks' order
    cb.on_experiment_end(trials)                    # the rows still waiting for their flush
    for r in runs:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")] == [1, 2, 3]
        assert client.get_run(r.info.run_id).data.params["engine_used"] == "vectorized"


def test_a_failed_write_is_raised_in_tunes_thread(writer):
    cb, client, exp = writer
    cb.experiment_id = "999"                      # the experiment is gone: create_run fails
    trial = Trial("run_unit", config={"trial": 0}, trial_id="t_00000", stub=True)
    cb.on_trial_start(0, [trial], trial)
    with pytest.raises(Exception, match="999|[Ee]xperiment"):
        cb.get_state()
    with pytest.raises(Exception, match="999|[Ee]xperiment"):   # and at the next hook: the sweep stops on it
        cb.on_trial_result(0, [trial], trial, {"members": {}})
