"""fedsweep report: a fake sweep written to a temporary sqlite MLflow store exactly per the layout
in docs/sweeps.md, with hand-chosen numbers so each method's best config is known in advance."""
from __future__ import annotations

import math
import sqlite3
import time

import numpy as np
import pytest
import yaml

from fedsweep.config.schema import ConfigError
from fedsweep.reports import (best_configs, config_table, load_trials, rounds_to_target_png, seed_values,
                             selection_rule, write_report)
from fedsweep.reports.stats import COLUMNS, add_intervals

SWEEP, EXPERIMENT, TARGET, ROUNDS = "fakesweep", "fake-exp", 0.8, 60

# (method, rho, local.lr) -> per seed (best accuracy, rounds to target or None, status)
TRIALS = {
    ("fedavg", 0.1, 0.05): [(0.90, 30, "finished"), (0.92, 34, "finished")],   # seed 0 rerun below
    ("fedavg", 0.1, 0.1): [(0.86, 20, "finished"), (0.88, 22, "finished")],
    ("fedavg", 0.5, 0.05): [(0.85, 40, "finished"), (0.87, 44, "finished")],
    ("fedavg", 0.5, 0.1): [(0.50, None, "diverged"), (0.95, 10, "finished")],
    ("fedlga", 0.1, 0.05): [(0.91, 25, "finished"), (0.93, 27, "finished")],
    ("fedlga", 0.1, 0.1): [(0.89, 25, "finished"), (0.89, 27, "finished")],   # same rounds: tie on accuracy
    ("fedlga", 0.5, 0.05): [(0.70, None, "finished"), (0.81, 50, "finished")],
    ("fedlga", 0.5, 0.1): [(0.79, None, "finished"), (0.79, None, "finished")],
}
RERUN = (("fedavg", 0.1, 0.05), 0, (0.94, 28, "finished"))         # newer: supersedes seed 0 above
LATE_FAILURE = (("fedlga", 0.1, 0.1), 1, (0.10, None, "failed"))    # newer but failed: ignored

# expected best local.lr per (method, rho) under each rule
BEST_BY_TARGET = {("fedavg", 0.1): 0.1, ("fedavg", 0.5): 0.05, ("fedlga", 0.1): 0.05, ("fedlga", 0.5): 0.05}
BEST_BY_ACCURACY = {("fedavg", 0.1): 0.05, ("fedavg", 0.5): 0.05, ("fedlga", 0.1): 0.05, ("fedlga", 0.5): 0.1}


def _curve(best: float, rtt: int | None, last: int) -> dict[int, float]:
    """test/accuracy every 2 rounds: reaches TARGET at `rtt` (if any), then levels off at `best`."""
    out = {}
    for t in range(2, last + 1, 2):
        if rtt is None:
            out[t] = best * (1 - math.exp(-t / 12))
        elif t < rtt:
            out[t] = TARGET * t / rtt * 0.99
        else:
            out[t] = TARGET + (best - TARGET) * (1 - math.exp(-(t - rtt + 1) / 8))
    return out


def _log_trial(client, exp_id, parent, method, rho, lr, seed, best, rtt, status, with_target):
    from mlflow.entities import Metric, Param, RunTag

    cid = f"{method}-{rho}-{lr}"
    run = client.create_run(exp_id, run_name=f"{cid}-s{seed}", tags={
        "mlflow.parentRunId": parent, "fedsweep.role": "trial", "fedsweep.sweep": SWEEP,
        "ray.trial_id": f"t{seed}{cid}", "fedsweep.method": method, "fedsweep.config_id": cid,
        "fedsweep.status": status})
    rid, now = run.info.run_id, int(time.time() * 1000)
    params = {"seed": seed, "algorithm.name": method, "local.lr": lr, "heterogeneity.rho": rho,
              "server.lr": 1.0, "data.name": "digits", "mlflow.run_name": f"{cid}-s{seed}"}
    last = 12 if status in ("diverged", "failed") else ROUNDS
    curve = _curve(best, rtt, last)
    spr = 0.1 if method == "fedavg" else 0.12
    metrics = [Metric("test/accuracy", v, now, t) for t, v in curve.items()]
    metrics += [Metric("round/seconds", spr, now, t) for t in range(1, last + 1)]
    summary = {"best/test_accuracy": best, "summary/best_test_accuracy": best,
               "summary/final_test_accuracy": curve[last], "summary/rounds": last,
               "summary/seconds_per_round": spr}
    if with_target:
        summary["summary/target_accuracy"] = TARGET
        if rtt is not None:
            summary.update({"rounds_to_target": rtt, "summary/seconds_to_target": rtt * spr,
                            "summary/comm_up_to_target": rtt * 10})
    metrics += [Metric(k, float(v), now, 0) for k, v in summary.items()]
    client.log_batch(rid, metrics=metrics, params=[Param(k, str(v)) for k, v in params.items()],
                     tags=[RunTag("fedsweep.algorithm", method)])
    client.set_terminated(rid, status="FAILED" if status == "failed" else "FINISHED")
    return rid


def _build_store(root, with_target: bool) -> str:
    from mlflow import MlflowClient

    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment(EXPERIMENT, artifact_location=(root / "artifacts").as_uri())
    parents = [client.create_run(exp_id, run_name=SWEEP, tags={"fedsweep.role": "sweep", "fedsweep.sweep": SWEEP})
               .info.run_id for _ in range(2)]
    for (method, rho, lr), seeds in TRIALS.items():
        for seed, (best, rtt, status) in enumerate(seeds):
            _log_trial(client, exp_id, parents[0], method, rho, lr, seed, best, rtt, status, with_target)
    for (method, rho, lr), seed, (best, rtt, status) in (RERUN, LATE_FAILURE):
        _log_trial(client, exp_id, parents[1], method, rho, lr, seed, best, rtt, status, with_target)
    # another sweep in the same experiment must not leak in
    _log_trial(client, exp_id, parents[1], "fedavg", 0.9, 0.3, 0, 0.99, 2, "finished", with_target)
    client.set_tag(client.search_runs([exp_id], "tags.`fedsweep.config_id` = 'fedavg-0.9-0.3'")[0].info.run_id,
                   "fedsweep.sweep", "other")
    for parent in parents:   # the sweeps have ended (a report of an open one says so)
        client.set_terminated(parent, status="FINISHED")
    return uri


@pytest.fixture(scope="module")
def store_target(tmp_path_factory):
    return _build_store(tmp_path_factory.mktemp("target"), with_target=True)


@pytest.fixture(scope="module")
def store_plain(tmp_path_factory):
    return _build_store(tmp_path_factory.mktemp("plain"), with_target=False)


def _best_lr(uri) -> dict:
    best = best_configs(config_table(load_trials(uri, EXPERIMENT, SWEEP)))
    return {(r["method"], r["heterogeneity.rho"]): float(r["config"].split("=")[1]) for _, r in best.iterrows()}


def test_load_trials_dedups_and_keeps_only_varying_params(store_target):
    df = load_trials(store_target, EXPERIMENT, SWEEP)
    assert len(df) == 16 and df.attrs["runs_read"] == 18
    assert df.attrs["params"] == ["heterogeneity.rho", "local.lr"]       # server.lr, data.name, mlflow.* dropped
    assert {"run_id", "method", "config_id", "seed", "status", "best/test_accuracy",
            "rounds_to_target", "summary/target_accuracy"} <= set(df.columns)
    assert not {"server.lr", "mlflow.run_name", "algorithm.name"} & set(df.columns)
    assert not df.duplicated(["config_id", "seed"]).any()
    rerun = df[(df.config_id == "fedavg-0.1-0.05") & (df.seed == 0)].iloc[0]
    assert rerun["best/test_accuracy"] == pytest.approx(0.94)               # the newer finished run
    kept = df[(df.config_id == "fedlga-0.1-0.1") & (df.seed == 1)].iloc[0]
    assert kept["status"] == "finished"                                     # not the later failed one
    assert df["status"].value_counts().to_dict() == {"finished": 15, "diverged": 1}


def test_best_config_by_rounds_to_target(store_target):
    assert selection_rule(load_trials(store_target, EXPERIMENT, SWEEP)) == "target"
    assert _best_lr(store_target) == BEST_BY_TARGET


def test_best_config_by_accuracy_without_target(store_plain):
    assert selection_rule(load_trials(store_plain, EXPERIMENT, SWEEP)) == "accuracy"
    assert _best_lr(store_plain) == BEST_BY_ACCURACY


def test_config_numbers(store_target):
    table = config_table(load_trials(store_target, EXPERIMENT, SWEEP)).set_index("config_id")
    assert len(table) == 8 and table.attrs["settings"] == ["heterogeneity.rho"]
    dup = table.loc["fedavg-0.1-0.05"]
    assert dup["n"] == 2 and dup["acc_mean"] == pytest.approx(0.93)
    assert dup["acc_std"] == pytest.approx(np.std([0.94, 0.92], ddof=1))
    assert dup["rtt_mean"] == pytest.approx(31) and dup["rtt_std"] == pytest.approx(np.std([28, 34], ddof=1))
    assert dup["sec_to_target"] == pytest.approx(3.1) and dup["comm_to_target"] == pytest.approx(310)
    div = table.loc["fedavg-0.5-0.1"]                       # diverged seed counts as accuracy 0, not reached
    assert div["diverged"] == 1 and div["reached"] == 1 and div["rtt_mean"] == pytest.approx(10)
    assert div["acc_mean"] == pytest.approx(0.475) and div["acc_std"] == pytest.approx(np.std([0, 0.95], ddof=1))
    never = table.loc["fedlga-0.5-0.1"]
    assert never["reached"] == 0 and math.isnan(never["rtt_mean"])
    assert table.loc["fedlga-0.1-0.1", "statuses"] == "finished 2"
    assert table.loc["fedlga-0.1-0.05", "sec_per_round"] == pytest.approx(0.12)


def test_write_report(store_target, tmp_path):
    path = write_report(store_target, EXPERIMENT, SWEEP, tmp_path / "out")
    assert path == tmp_path / "out" / "report.md"
    for name in ("accuracy_curves.png", "rounds_to_target.png"):
        data = (tmp_path / "out" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    text = path.read_text()
    assert f"# Sweep report: {SWEEP}" in text and store_target in text
    assert "trials: 16 (diverged 1, finished 15); 2 superseded duplicate run(s) ignored" in text
    assert "fewest mean rounds to the target accuracy 0.8" in text
    # best-config rows: rho, method, config, seeds, best acc, final acc, rounds to target, reached, ...
    # means with their 95% t-interval over 2 seeds: mean ± t(0.975, 1) · sd / √2 = ± 12.706 · sd / √2
    assert "| 0.1 | fedavg | local.lr=0.1 | 2 | 0.8700 [0.7429, 0.9971] |" in text
    assert "| 0.5 | fedavg | local.lr=0.05 | 2 | 0.8600 [0.7329, 0.9871] |" in text
    assert "| 0.5 | fedlga | local.lr=0.05 | 2 | 0.7550 [0.0562, 1.0000] |" in text
    assert "| 50.0 [1 seed: no CI] | 1/2 |" in text                     # rounds to target of that row: one seed
    # full table: every config, with its rank and statuses
    assert "| fedavg | 0.5 | 2 | local.lr=0.1 | 0.4750 ± 0.6718 | 10.0 | 1/2 | 2 | diverged 1, finished 1 |" in text
    assert text.count("`fedlga-") == 4 and text.count("`fedavg-") == 4


def test_the_paired_comparisons_as_a_forest_plot_a_latex_table_and_in_the_rounds_table(store_target, tmp_path):
    """The report shows what the verdicts read: comparisons.png (a row per comparison), verdicts.tex (a
    booktabs row per comparison, its numbers comparisons.csv's) and each rounds cell's paired verdict."""
    import pandas as pd
    path = write_report(store_target, EXPERIMENT, SWEEP, tmp_path / "out", reference="fedavg")
    out, text = path.parent, path.read_text()
    comparisons = pd.read_csv(out / "comparisons.csv")
    assert len(comparisons) == 4                 # fedlga at 2 values of rho, on 2 metrics
    png = (out / "comparisons.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000 and "](comparisons.png)" in text
    tex = (out / "verdicts.tex").read_text().splitlines()
    assert r"\toprule" in tex and r"\bottomrule" in tex and tex[-1] == r"\end{tabular}"
    rows = [line for line in tex if line.startswith("heterogeneity.rho")]
    assert len(rows) == len(comparisons)
    for line, (_, c) in zip(rows, comparisons.iterrows()):
        assert line.endswith((rf"\textbf{{{c['verdict']}}} \\", rf"{c['verdict']} \\")) and f"& {c['n_seeds']} &" in line
    rounds = text.split("## Rounds to target per setting")[1].split("##")[0]
    for _, c in comparisons[comparisons["metric"] == "rounds_to_target"].iterrows():
        assert f"; {c['verdict']}" in rounds or f"; **{c['verdict']}**" in rounds
    # across the two settings, descriptive: IQM and P(fedlga > fedavg) from the same per-seed scores, by hand
    from scipy import stats
    aggregate = pd.read_csv(out / "aggregate.csv").set_index("method")
    trials = pd.read_csv(out / "trials.csv")
    score = "best/test_accuracy"
    runs = {(m, rho): trials[(trials["method"] == m) & (trials["heterogeneity.rho"] == rho) &
                             (trials["local.lr"] == lr) & trials["status"].isin(["finished", "diverged"])]
            for (m, rho), lr in BEST_BY_TARGET.items()}
    scores = {k: v[score].where(v["status"] != "diverged", 0.0).to_numpy(float) for k, v in runs.items()}
    for m in ("fedavg", "fedlga"):
        pooled = np.concatenate([scores[(m, rho)] for rho in (0.1, 0.5)])
        assert aggregate.loc[m, "iqm"] == pytest.approx(stats.trim_mean(pooled, 0.25))
        assert aggregate.loc[m, "iqm_low"] <= aggregate.loc[m, "iqm"] <= aggregate.loc[m, "iqm_high"]
    by_hand = np.mean([np.mean([(a > b) + 0.5 * (a == b) for a in scores[("fedlga", rho)] for b in scores[("fedavg", rho)]])
                       for rho in (0.1, 0.5)])
    assert aggregate.loc["fedlga", "p_improvement"] == pytest.approx(by_hand) and math.isnan(aggregate.loc["fedavg", "p_improvement"])
    assert "## Across settings (descriptive)" in text and (out / "profile.png").stat().st_size > 10_000
    # how often each reaches the target, paired by seed: its own metric and its own Holm family
    reached = pd.read_csv(out / "reached.csv").set_index("setting")
    for rho in (0.1, 0.5):
        share = {m: runs[(m, rho)]["rounds_to_target"].notna().mean() for m in ("fedavg", "fedlga")}
        row = reached.loc[f"heterogeneity.rho={rho}"]
        assert row["method"] == "fedlga" and row["difference"] == pytest.approx(share["fedlga"] - share["fedavg"])
        assert row["verdict"] in ("inconclusive", "not tested")     # 2 seeds can call nothing
    assert "## Reaching the target" in text


def test_rounds_to_target_png_marks_never_reached(store_target, tmp_path):
    best = best_configs(config_table(load_trials(store_target, EXPERIMENT, SWEEP)))
    best.loc[best["method"] == "fedlga", "reached"] = 0
    for max_rounds in (ROUNDS, None):
        path = rounds_to_target_png(best, tmp_path / f"bars{max_rounds}.png", max_rounds, TARGET)
        assert path.stat().st_size > 10_000


def test_write_report_without_target(store_plain, tmp_path):
    text = write_report(store_plain, EXPERIMENT, SWEEP, tmp_path).read_text()
    assert "best mean over seeds of the best test accuracy" in text
    assert "| 0.5 | fedlga | local.lr=0.1 | 2 | 0.7900 [0.7900, 0.7900] |" in text      # equal seeds: a point
    assert (tmp_path / "rounds_to_target.png").stat().st_size > 10_000
    best, every = (text.split(f"## {name}")[1].split("\n\n")[1].splitlines()[0] for name in ("Best config", "All configs"))
    assert "| final acc | s / round |" in best and "| best acc (± std) | seeds |" in every   # no target: no reaching it
    assert not any(word in best + every for word in ("target", "reached"))


def test_a_sweep_whose_every_run_diverged_says_nothing_was_selected(tmp_path):
    """Runs with a validation split that all diverge before it is read: the report says what happened,
    not that the runs have no validation split."""
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment(EXPERIMENT, artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp_id, run_name=SWEEP, tags={"fedsweep.role": "sweep", "fedsweep.sweep": SWEEP})
    for lr in (0.05, 0.1):
        for seed in (0, 1):
            _log_trial(client, exp_id, parent.info.run_id, "fedavg", 0.1, lr, seed, 0.1, None, "diverged", True)
    text = write_report(uri, EXPERIMENT, SWEEP, tmp_path / "out").read_text()
    assert "nothing was selected: every tuning run diverged or failed" in text
    assert "no validation split" not in text


def test_missing_experiment_or_sweep_is_one_line_config_error(store_target):
    with pytest.raises(ConfigError, match=r"no MLflow experiment 'nope' in store sqlite:///.*fedsweep tune") as e:
        load_trials(store_target, "nope", SWEEP)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"holds no trial runs of sweep 'other-sweep'.*fedsweep tune"):
        write_report(store_target, EXPERIMENT, "other-sweep", "unused")


def test_report_of_a_missing_or_foreign_store_creates_nothing(tmp_path, monkeypatch, capsys):
    """MLflow opening a store that is not there creates one: `fedsweep report` from the wrong folder
    must say so and leave the folder as it was (no mlflow.db, no mlartifacts/)."""
    from fedsweep.cli import main
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": SWEEP, "base": {"rounds": 2}}))
    assert main(["report", "s.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fedsweep: error: mlflow.tracking_uri (default) sqlite:///{tmp_path}/mlflow.db: "
                          "no MLflow store there") and "\n" not in err
    (tmp_path / "empty.db").write_bytes(b"")      # an empty file is no store either
    with pytest.raises(ConfigError, match="empty.db: no MLflow store there"):
        load_trials(str(tmp_path / "empty.db"), EXPERIMENT, SWEEP)
    notes = tmp_path / "notes.db"                  # somebody else's database
    con = sqlite3.connect(notes)
    con.execute("CREATE TABLE notes (t TEXT)")
    con.commit()
    con.close()
    before = notes.read_bytes()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{notes}")
    assert main(["report", "s.yaml"]) == 2
    assert "notes.db is a sqlite database of something else (tables notes), not an MLflow store" in \
        capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db", "notes.db", "s.yaml"]
    assert notes.read_bytes() == before and (tmp_path / "empty.db").stat().st_size == 0


def test_a_sweep_whose_trials_all_failed_is_one_line_naming_the_error(tmp_path):
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(EXPERIMENT, artifact_location=(tmp_path / "artifacts").as_uri())
    for lr, error in ((0.1, "data.num_clients: N=5000 clients but only 1437 training samples"),
                      (0.2, "data.num_clients: N=5000 clients but only 1437 training samples"), (0.3, "")):
        run = client.create_run(exp, tags={"fedsweep.role": "trial", "fedsweep.sweep": SWEEP,
                                           "fedsweep.config_id": f"c{lr}", "fedsweep.status": "failed",
                                           **({"fedsweep.error": error} if error else {})})
        client.log_param(run.info.run_id, "local.lr", lr)
        client.set_terminated(run.info.run_id, "FAILED")
    with pytest.raises(ConfigError) as e:
        write_report(uri, EXPERIMENT, SWEEP, tmp_path / "out")
    assert str(e.value) == (f"report: none of the 3 trials of sweep {SWEEP!r} has a result to score (failed 3); "
                            "the most common error: data.num_clients: N=5000 clients but only 1437 training samples")
    assert not (tmp_path / "out").exists()


def test_rounds_per_setting_table_with_speedups(store_target, tmp_path):
    """FedCLG Table I shape: mean rounds of each method's best config per setting, speed-up over a reference."""
    text = write_report(store_target, EXPERIMENT, SWEEP, tmp_path, reference="fedavg").read_text()
    section = text.split("## Rounds to target per setting")[1].split("##")[0]
    assert "speed-up over fedavg" in section
    assert "| setting | fedavg | fedlga |" in section                        # reference column first
    # 21/26, and the paired verdict (2 seeds: nothing can be called)
    assert "| heterogeneity.rho=0.1 | 21.0 [8.3, 33.7] (1.00×) | 26.0 [13.3, 38.7] (0.81×); inconclusive |" in section
    # 42/50; one seed of two reached the target
    assert ("| heterogeneity.rho=0.5 | 42.0 [16.6, 60.0] (1.00×) | 50.0 [1 seed: no CI] (0.84×), 1/2 reached; "
            "inconclusive |" in section)
    plain = write_report(store_target, EXPERIMENT, SWEEP, tmp_path / "noref").read_text()
    assert "| heterogeneity.rho=0.5 | 42.0 [16.6, 60.0] | 50.0 [1 seed: no CI], 1/2 reached |" in plain
    assert "×" not in plain and "No reference method, so no verdicts" in plain
    assert (tmp_path / "noref" / "comparisons.csv").read_text().strip() == ",".join(COLUMNS)   # the header only


def test_settings_curves_only_when_a_setting_varies(store_target, tmp_path):
    """FedCLG Fig. 6 shape (one panel per method, one curve per setting value), drawn only if it has two curves."""
    text = write_report(store_target, EXPERIMENT, SWEEP, tmp_path / "a").read_text()
    assert "](settings_curves.png)" in text
    assert (tmp_path / "a" / "settings_curves.png").stat().st_size > 10_000
    text = write_report(store_target, EXPERIMENT, SWEEP, tmp_path / "b", setting_keys=()).read_text()
    assert not (tmp_path / "b" / "settings_curves.png").exists() and "settings_curves" not in text
    rounds = text.split("## Rounds to target per setting")[1]
    assert "| all | 21.0 [8.3, 33.7] | 26.0 [13.3, 38.7] |" in rounds     # rho tuned now


def test_never_reached_cell(store_target, tmp_path):
    from fedsweep.reports.tables import _rounds_table
    trials = load_trials(store_target, EXPERIMENT, SWEEP)
    best = best_configs(config_table(trials))
    best = add_intervals(best, seed_values(best, trials, ["rounds_to_target"]), {"rtt": ("rounds_to_target", 1, 60)})
    best.loc[best["method"] == "fedavg", "reached"] = 0
    table = _rounds_table(best, "fedavg")
    # no speed-up over a reference that never got there
    assert "| heterogeneity.rho=0.1 | not reached (0/2) | 26.0 [13.3, 38.7] |" in table
    assert "| heterogeneity.rho=0.5 | not reached (0/2) | 50.0 [1 seed: no CI], 1/2 reached |" in table


# ----- relative targets, methods without a setting key, per-client weights ----------------------

# (method, temperature or None) -> per seed: accuracy at rounds 2, 4, 6, 8
SOFT = {("fedavg", None): [(0.5, 0.7, 0.78, 0.80), (0.6, 0.77, 0.85, 0.90)],      # final mean 0.85 -> 0.765
        ("fedsoftmax", 0.1): [(0.77, 0.8, 0.8, 0.82), (0.7, 0.79, 0.8, 0.8)],     # reach at 2 and 4
        ("fedsoftmax", 1.0): [(0.5, 0.6, 0.7, 0.76), (0.6, 0.8, 0.8, 0.8)]}       # never; 4


@pytest.fixture(scope="module")
def store_soft(tmp_path_factory):
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param

    root = tmp_path_factory.mktemp("soft")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("soft", artifact_location=(root / "artifacts").as_uri())
    parent = client.create_run(exp, run_name="soft", tags={"fedsweep.role": "sweep", "fedsweep.sweep": "soft"}).info.run_id
    now = int(time.time() * 1000)
    for (method, temp), seeds in SOFT.items():
        cid = f"{method}-{temp}"
        for seed, accs in enumerate(seeds):
            rid = client.create_run(exp, run_name=f"{cid}-s{seed}", tags={
                "mlflow.parentRunId": parent, "fedsweep.role": "trial", "fedsweep.sweep": "soft",
                "fedsweep.method": method, "fedsweep.config_id": cid, "fedsweep.status": "finished"}).info.run_id
            params = {"seed": seed, "algorithm.name": method, **({"algorithm.temperature": temp} if temp else {})}
            metrics = [Metric("test/accuracy", a, now, 2 * (i + 1)) for i, a in enumerate(accs)]
            metrics += [Metric(k, v, now, 0) for k, v in {"best/test_accuracy": max(accs), "summary/rounds": 8,
                                                          "summary/final_test_accuracy": accs[-1]}.items()]
            client.log_batch(rid, metrics=metrics, params=[Param(k, str(v)) for k, v in params.items()])
            if method == "fedsoftmax":
                path = root / f"{rid}.csv"
                rows = ["round,client,p,alpha,abs_dev,loss_global,gap"]
                for t in range(1, 9):
                    alpha = np.array([0.4, 0.3, 0.2, 0.1]) / t + 0.25 * (1 - 1 / t)
                    rows += [f"{t},{i},0.25,{a},{abs(a - 0.25)},1.0,1.0" for i, a in enumerate(alpha)]
                path.write_text("\n".join(rows) + "\n")
                client.log_artifact(rid, str(path.rename(root / "clients.csv")))
            client.set_terminated(rid)
    return uri


def test_relative_target_broadcast_reference_and_weight_figures(store_soft, tmp_path):
    text = write_report(store_soft, "soft", "soft", tmp_path, setting_keys=["algorithm.temperature"],
                        reference="fedavg", relative_target=0.9).read_text()
    assert "0.9 × the final accuracy of fedavg's best config" in text and "all: 0.7650" in text
    section = text.split("## Rounds to target per setting")[1].split("##")[0]
    # t-intervals [-7.7, 17.7] and [-9.7, 15.7] over two seeds, cut to [1 round, the 8 a run had]
    assert "| algorithm.temperature=0.1 | 5.0 [1.0, 8.0] (1.00×) | 3.0 [1.0, 8.0] (1.67×); inconclusive |" in section
    assert ("| algorithm.temperature=1 | 5.0 [1.0, 8.0] (1.00×) | 4.0 [1 seed: no CI] (1.25×), 1/2 reached; "
            "inconclusive |" in section)
    for name in ("settings_curves.png", "weights_fedsoftmax.png", "accuracy_curves.png", "rounds_to_target.png"):
        assert (tmp_path / name).stat().st_size > 10_000, name
    assert "](weights_fedsoftmax.png)" in text and "weights_fedavg" not in text
    trials = load_trials(store_soft, "soft", "soft")
    assert "rounds_to_target" not in trials                        # nothing logged: the report computes it


def test_relative_target_needs_a_reference_that_ran(store_soft, tmp_path):
    with pytest.raises(ConfigError, match="reference method 'fedprox' has no finished trials"):
        write_report(store_soft, "soft", "soft", tmp_path, setting_keys=["algorithm.temperature"],
                     reference="fedprox", relative_target=0.9)


def test_a_setting_of_numbers_and_words_is_reported(tmp_path):
    """algorithm.damping takes a number or 'step': a setting holding both sorts and plots (its
    numbers read as words beside 'step'; sorting the mixed column failed)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("mixed", artifact_location=(tmp_path / "artifacts").as_uri())
    parent = client.create_run(exp, run_name="mixed", tags={"fedsweep.role": "sweep", "fedsweep.sweep": "mixed"})
    for i, damping in enumerate(["0.0", "1.0", "step"]):
        run = client.create_run(exp, run_name=f"d{damping}", tags={
            "mlflow.parentRunId": parent.info.run_id, "fedsweep.role": "trial", "fedsweep.sweep": "mixed",
            "fedsweep.method": "fedlga", "fedsweep.config_id": f"c{i}", "fedsweep.status": "finished"})
        acc = 0.8 + 0.05 * i
        client.log_batch(run.info.run_id, params=[Param("seed", "0"), Param("algorithm.name", "fedlga"),
                                                  Param("algorithm.damping", damping)],
                         metrics=[Metric("test/accuracy", acc, 0, 1), Metric("round/seconds", 0.1, 0, 1),
                                  Metric("best/test_accuracy", acc, 0, 0), Metric("summary/rounds", 1, 0, 0)])
        client.set_terminated(run.info.run_id)
    trials = load_trials(uri, "mixed", "mixed")
    assert sorted(trials["algorithm.damping"]) == ["0", "1", "step"]
    path = write_report(uri, "mixed", "mixed", tmp_path / "rep", setting_keys=["algorithm.damping"])
    text = path.read_text()
    assert all(f"| {d} | fedlga |" in text for d in ("0", "1", "step")) and (path.parent / "settings_curves.png").is_file()


# ----- 95% intervals and verdicts against the reference, over ten seeds --------------------------

SEEDS = range(10)


def _seeded(method: str, rho: float, seed: int) -> tuple[float, int | None]:
    """(best accuracy, rounds to target) of each arm: at rho 0.1 fedlga clearly better than fedavg and
    fedcm the same as fedavg (FedCM with α = 1 makes FedAvg's updates); at rho 0.5 fedlga reaches the
    target once in ten seeds, and fedcm is 1 round faster on every seed, evaluated every 2 rounds."""
    acc, rtt = (0.85 + 0.01 * (seed % 3), 30 + 2 * (seed % 4)) if rho == 0.1 else \
        (0.83 + 0.01 * (seed % 3), 40 + 2 * (seed % 3))
    if method == "fedlga" and rho == 0.1:
        return acc + 0.05 + 0.005 * (seed % 2), rtt - 10 - 2 * (seed % 2)
    if method == "fedlga":
        return 0.78 + 0.01 * (seed % 2), 56 if seed == 0 else None
    if method == "fedcm" and rho == 0.5:
        return acc + 0.002 * (-1) ** seed * (seed % 3), rtt - 1
    return acc, rtt


@pytest.fixture(scope="module")
def store_seeds(tmp_path_factory):
    from mlflow import MlflowClient

    root = tmp_path_factory.mktemp("seeds")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment(EXPERIMENT, artifact_location=(root / "artifacts").as_uri())
    parent = client.create_run(exp_id, run_name=SWEEP, tags={"fedsweep.role": "sweep", "fedsweep.sweep": SWEEP})
    for method in ("fedavg", "fedcm", "fedlga"):
        for rho in (0.1, 0.5):
            for seed in SEEDS:
                best, rtt = _seeded(method, rho, seed)
                _log_trial(client, exp_id, parent.info.run_id, method, rho, 0.1, seed, best, rtt, "finished", True)
    return uri


def test_report_gives_intervals_and_verdicts_paired_by_seed(store_seeds, tmp_path):
    import pandas as pd
    from scipy import stats

    text = write_report(store_seeds, EXPERIMENT, SWEEP, tmp_path, reference="fedavg", resolution=2).read_text()
    table = pd.read_csv(tmp_path / "comparisons.csv", keep_default_na=False, na_values=[""])
    assert list(table.columns) == COLUMNS == ["setting", "metric", "method", "reference", "n_seeds", "difference",
                                              "ci_low", "ci_high", "p_adjusted", "verdict", "mde", "test",
                                              "censored_method", "censored_reference", "note", "adj_ci_low",
                                              "adj_ci_high", "margin", "power_mde", "seeds_used", "stop_reason"]
    assert len(table) == 8 and (table["reference"] == "fedavg").all() and (table["n_seeds"] == 10).all()
    rows = {(r.setting, r.metric, r.method): r for r in table.itertuples()}
    faster = rows[("heterogeneity.rho=0.1", "rounds_to_target", "fedlga")]
    assert faster.verdict == "better" and faster.difference == pytest.approx(-11) and faster.test == "signed-rank (exact)"
    assert faster.adj_ci_high < 0 and faster.p_adjusted == pytest.approx(8 * 2 / 2 ** 10)
    assert rows[("heterogeneity.rho=0.1", "best/test_accuracy", "fedlga")].verdict == "better"
    for metric in ("rounds_to_target", "best/test_accuracy"):                 # the A/A pair
        same = rows[("heterogeneity.rho=0.1", metric, "fedcm")]
        assert same.verdict == "equivalent" and same.adj_ci_low == same.adj_ci_high == same.difference == 0
    # nine of ten fedlga runs never reached the target: ranked last (R + 1 = 61), never averaged
    never = rows[("heterogeneity.rho=0.5", "rounds_to_target", "fedlga")]
    assert never.verdict == "worse" and never.test == "signed-rank (exact)" and never.adj_ci_low > 0
    assert (never.censored_method, never.censored_reference) == (9, 0) and 16 <= never.difference <= 21
    assert "the estimate counts them at R + 1" in never.note
    step = rows[("heterogeneity.rho=0.5", "rounds_to_target", "fedcm")]       # 1 round faster, seen every 2
    assert step.verdict == "equivalent" and -2 < step.adj_ci_low and step.adj_ci_high < 0   # inside the margin ±2
    noise = rows[("heterogeneity.rho=0.5", "best/test_accuracy", "fedcm")]
    assert noise.verdict == "equivalent" and noise.power_mde > 0 and noise.margin == 0.01
    assert (table["seeds_used"] == 10).all() and (table["stop_reason"] == "fixed seeds").all()

    section = text.split("## Comparisons with fedavg")[1].split("\n## ")[0]
    assert "paired by seed" in section and "adjusted over the 8 tested comparisons" in section
    assert "| heterogeneity.rho=0.1 | rounds_to_target | fedlga | 10 (fixed seeds) | -11.0 [" in section
    assert (f"| {never.p_adjusted:.3g} | worse | ±{never.power_mde:.1f} | signed-rank (exact) | 9 / 0 | "
            "censored runs: the estimate counts") in section
    # the lead from rho 0.1 to 0.5: FedLGA's 11 rounds ahead become ~19 behind, tested per seed, not read off
    changes = pd.read_csv(tmp_path / "interactions.csv")
    fedlga = changes[(changes["method"] == "fedlga") & (changes["metric"] == "rounds_to_target")].iloc[0]
    assert fedlga["verdict"] == "lead shrinks" and fedlga["adj_ci_low"] > 0 and fedlga["n_seeds"] == 10
    assert "## Does the lead change with heterogeneity.rho?" in text and len(changes) == 4
    # the best-config table: every mean with its 95% t-interval over the ten seeds
    acc = [_seeded("fedlga", 0.1, s)[0] for s in SEEDS]
    low, high = stats.t.interval(0.95, 9, loc=np.mean(acc), scale=stats.sem(acc))
    assert f"| 0.1 | fedlga | — | 10 | {np.mean(acc):.4f} [{low:.4f}, {high:.4f}] |" in text
    assert "| 0.5 | fedlga | — | 10 | 0.7850 [" in text and "| 56.0 [1 seed: no CI] | 1/10 |" in text


def test_runs_of_one_sweep_name_from_two_files_are_said_in_one_line(tmp_path):
    """Two sweep files of one `name:` write into one sweep: the report reads them as one and says so, naming
    both files (their sweep runs carry `fedsweep.sweep_file`); one file, or runs without the tag: nothing."""
    from mlflow import MlflowClient

    from fedsweep.reports.trials import files_warning, sweep_files
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("same", artifact_location=(tmp_path / "art").as_uri())
    tags = {"fedsweep.role": "sweep", "fedsweep.sweep": "same"}
    for file in ("/lab/a/sweep.yaml", "/lab/a/sweep.yaml", "/lab/b/sweep.yaml", None):
        client.create_run(exp, tags={**tags, **({"fedsweep.sweep_file": file} if file else {})})
    client.create_run(exp, tags={**tags, "fedsweep.sweep": "other", "fedsweep.sweep_file": "/lab/c/x.yaml"})
    files = sweep_files(client, exp, "same")
    assert files == {"/lab/a/sweep.yaml": 2, "/lab/b/sweep.yaml": 1}
    assert files_warning(files, "same") == (
        "runs of sweep 'same' were started from 2 sweep files: /lab/a/sweep.yaml (2 runs of it); /lab/b/sweep.yaml "
        "(1 run of it). They are read as one sweep (a later run of a config replacing an earlier one); give each "
        "file a `name:` of its own to keep them apart")
    assert files_warning({"/lab/a/sweep.yaml": 2}, "same") is None and files_warning({}, "same") is None
