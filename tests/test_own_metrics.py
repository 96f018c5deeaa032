"""An algorithm's own metrics (what its ``round_metrics`` logs, declared in ``Algorithm.metrics``): in the
summary, in Tune's reports, and selectable by ``report.metric``, ``search.metric`` and ``scheduler.metric``."""
from __future__ import annotations

import re

import pytest

from test_tune import trial_runs, write_sweep

# FedSoftMax and its reference, gen_fedavg (the loss-aware family), both log weights/*
OWN_SWEEP = {"grid": {"local.lr": [0.05, 0.2]}, "methods": {"gen_fedavg": {}, "fedsoftmax": {}},
             "max_concurrent": 1,
             "base": {"rounds": 6, "clients_per_round": 4, "device": "cpu",
                      "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "classes"}},
                      "model": {"name": "mlp", "options": {"hidden": 16}}, "local": {"steps": 4, "batch_size": 5},
                      "eval": {"every": 2}}}


def test_the_summary_keeps_each_own_metrics_latest_value():
    """A round may log none (q-FFL's where no client returned): final_<metric> is the latest logged."""
    from fedsweep.runs.summary import own_metric, own_summary
    history = [{"round": 1, "qffl/mean_Fq": 2.0, "train/loss": 1.0}, {"round": 2, "train/loss": 0.5},
               {"round": 3, "weights/max": 0.4, "test/accuracy": 0.7, "clients/accuracy_mean": 0.6}]
    assert own_summary(history) == {"final_qffl_mean_Fq": 2.0, "final_weights_max": 0.4}
    assert [own_metric(m) for m in ("qffl/mean_Fq", "server/loss", "clients/accuracy_p10", "val/accuracy",
                                    "rounds_to_target", "a/", "/b")] == [True] + [False] * 6


@pytest.mark.parametrize("over, needle", [
    ({"methods": {"fedavg": {}, "qffl": {}}, "report": {"settings": [], "metric": "qffl/mean_Fq", "mode": "min"}},
     "report.metric: 'qffl/mean_Fq' is not a metric algorithm 'fedavg' declares (its `metrics`: none), so trial "
     "fedavg"),
    ({"report": {"settings": [], "metric": "weights/nope"}}, "'weights/nope' is not a metric algorithm 'fedsoftmax' "
     "declares (its `metrics`: weights/max_abs_dev, weights/mean_abs_dev, weights/max, weights/effective_clients)"),
    ({"scheduler": {"metric": "weights/nope", "mode": "min"}}, "scheduler.metric: 'weights/nope' is not a metric"),
    ({"report": {"settings": [], "metric": "served/accuracy_mean", "mode": "min"}},
     "report.mode: min would rank a lower served/accuracy_mean better"),
    ({"report": {"settings": [], "mode": "min"}}, "report.mode: min needs report.metric"),
])
def test_an_own_metric_some_trial_would_never_report_is_refused(tmp_path, capsys, fresh_home, over, needle):
    from fedsweep.cli import main
    path = write_sweep(tmp_path / "o.yaml", "o", **{**OWN_SWEEP, **over})
    assert main(["tune", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_report_metric_of_the_algorithms_own_selects_scores_and_calls_verdicts(tmp_path, monkeypatch, fresh_home,
                                                                              capsys):
    """report.metric: weights/max_abs_dev, mode min — configs ranked by each run's final value (lowest
    first), confirm runs scored by it, a verdict paired by seed; ASHA reads it at its rungs; the report
    tabulates every own metric; each finished trial's line gives its final value."""
    import fedsweep
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    metric = "weights/max_abs_dev"
    sweep = {**OWN_SWEEP, "name": "own", "seeds": [0, 1], "confirm": {"seeds": [10, 11, 12]},
             "scheduler": {"metric": metric, "mode": "min", "grace_period": 2},
             "report": {"settings": [], "metric": metric, "mode": "min", "reference": "gen_fedavg"}}
    trials = fedsweep.tune(sweep, report=False, progress=True)
    assert len(trials) == 2 * 2 * 2 + 2 * 3
    _, runs = trial_runs(uri, "own")
    said = re.findall(rf"^\[finished\] .*: {metric} (\S+) \(its latest\) after", capsys.readouterr().err, re.M)
    assert sorted(said) == sorted(f"{r.data.metrics['summary/final_weights_max_abs_dev']:.4f}" for r in runs
                                  if r.data.tags["fedsweep.status"] == "finished")
    assert all(f"summary/final_{metric.replace('/', '_')}" in r.data.metrics for r in runs
               if r.data.tags["fedsweep.status"] == "finished")
    result = fedsweep.report(sweep)
    configs, best, comparisons = result.configs, result.best, result.comparisons
    column = "summary/final_weights_max_abs_dev"
    assert configs.attrs["rule"] == "metric" and configs.attrs["mode"] == "min"
    by_run = result.trials.set_index("run_id")
    for _, c in configs.iterrows():     # selection: the lowest mean final value of its method
        assert c["sel_acc_mean"] == pytest.approx(by_run.loc[c["run_ids"], column].mean())
        chosen = configs[(configs["method"] == c["method"]) & (configs["rank"] == 1)].iloc[0]
        assert chosen["sel_acc_mean"] <= c["sel_acc_mean"]
    for _, b in best.iterrows():        # scored on the confirm runs
        assert b["scored_on"] == "confirm" and set(by_run.loc[b["run_ids"], "seed"]) == {10, 11, 12}
        assert b["acc_mean"] == pytest.approx(by_run.loc[b["run_ids"], column].mean())
    (row,) = comparisons.to_dict("records")
    assert row["metric"] == column and row["method"] == "fedsoftmax" and row["n_seeds"] == 3
    assert row["verdict"] in ("better", "worse", "inconclusive")      # margin 0: never `equivalent`
    text = result.path.read_text()
    assert "lowest mean over seeds of `weights/max_abs_dev`" in text
    assert "## The methods' own metrics" in text and "weights_effective_clients" in text
