"""`fedsweep tune` through a real Ray Tune run into a real (temporary) MLflow store."""
import contextlib
import csv
import io
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from mlflow.artifacts import download_artifacts

from fedsweep.cli import main
from fedsweep.util.locks import _processes, store_lock
from fedsweep.sweep.spec import expand, load_sweep
from conftest import write_mnist
from raycluster import interrupt

pytestmark = pytest.mark.usefixtures("fresh_home")   # Ray keeps a token in ~/.ray: none is shared

TINY = {
    "base": {"rounds": 4, "clients_per_round": 4, "device": "cpu",
             "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "classes"}},
             "model": {"name": "mlp", "options": {"hidden": 16}}, "local": {"steps": 4, "batch_size": 5, "lr": 0.1},
             "heterogeneity": {"kind": "stragglers", "rho": 0.5}, "eval": {"every": 2, "target_accuracy": 0.05}},
    "grid": {"local.lr": [0.1, 1.0e30]},
    "methods": {"fedavg": {}, "fedlga": {"algorithm.damping": [1.0]}},
    "seeds": [0],
    # One trial at a time: one trial worker imports torch and Lightning (~4 CPU-s a sweep) instead of two.
    # The tests of trials at once (and of what they share) set max_concurrent themselves.
    "max_concurrent": 1,
}
#: TINY with as many trials at once as the machine (or a cluster's nodes) holds
AT_ONCE = {**TINY, "max_concurrent": None}


def write_sweep(path, name, **over):
    spec = {**TINY, "name": name, **over}
    path.write_text("# a tiny test sweep\n" + yaml.safe_dump(spec))
    return str(path)


def trial_runs(uri, experiment, parent=None):
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    flt = "tags.`fedsweep.role` = 'trial'" + (f" and tags.`mlflow.parentRunId` = '{parent}'" if parent else "")
    return client, client.search_runs([exp.experiment_id], filter_string=flt)


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.setenv("HOME", str(tmp_path_factory.mktemp("home")))
        for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
            mp.delenv(var, raising=False)
        mp.chdir(tmp)
        mp.delenv("FEDSWEEP_NO_REPORT", raising=False)   # tune ends with its report (on the parent run too)
        # 8 trials at once on 2 cores: only the driver writes MLflow, so nothing may be lost
        path = write_sweep(tmp / "tiny.yaml", "tiny", seeds=[0, 1], max_concurrent=8,
                           resources={"cpu": 0.25})
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(["tune", path]) == 0
        (tmp / "tune.out").write_text(printed.getvalue())
        assert not ray_processes_of(os.getpgid(0))      # the local Ray instance is gone
        yield tmp, uri, path


def test_child_runs_params_metrics_and_divergence(finished_sweep):
    tmp, uri, path = finished_sweep
    client, runs = trial_runs(uri, "tiny")
    assert len(runs) == 8
    (parent,) = {r.data.tags["mlflow.parentRunId"] for r in runs}
    assert client.get_run(parent).data.tags["fedsweep.role"] == "sweep"
    assert client.get_run(parent).data.tags["fedsweep.sweep_file"] == str(Path(path).resolve())   # which file it was
    assert client.get_run(parent).data.params == {}     # nothing for the UI's pickers to offer beside the children's
    # tune's report, on the parent: each method's selected result as metrics, the report as artifacts
    # and as the run's description
    sweep_run = client.get_run(parent)
    assert sweep_run.data.metrics["fedlga/test_accuracy"] == pytest.approx((0.1889 + 0.1694) / 2, abs=1e-3)
    assert sweep_run.data.metrics["fedlga/seeds_reached_target"] == 2
    assert {"report/report.md", "report/trials.csv", "report/comparisons.csv", "report/accuracy_curves.png"} <= \
        {a.path for a in client.list_artifacts(parent, "report")}
    note = sweep_run.data.tags["mlflow.note.content"]
    assert note.startswith("## Verdicts against fedavg") and "\n# Sweep report: tiny" in note
    assert (tmp / "reports" / "tiny" / "report.md").exists()
    # the children's seedless config, which the UI's Group by turns into one row per config
    assert {(r.data.tags["fedsweep.config"], r.info.run_name) for r in runs} == {
        (f"{m} ηl{lr}", f"{m} ηl{lr} s{seed}") for m in ("fedavg", "fedlga") for lr in ("0.1", "1e+30") for seed in (0, 1)}
    from fedsweep.reports.view import TAG_PREFIX, read_view
    tags = client.get_experiment_by_name("tiny").tags
    view, tuning = read_view(tags[TAG_PREFIX + "fedsweep-tiny"]), read_view(tags[TAG_PREFIX + "fedsweep-tiny-tuning"])
    assert view["groupBy"] is None and "tags.`fedsweep.role` = 'config'" in view["searchFilter"]
    assert view["selectedColumns"][:4] == ["params.`algorithm.name`", "params.`local.lr`", "tags.`verdict_rounds`",
                                           "tags.`verdict`"]
    assert view["orderByKey"] == "metrics.`rounds/mean`" and view["orderByAsc"]          # fewest rounds first
    assert tuning["orderByKey"] == "metrics.`selects_rounds`" and "'tuning'" in tuning["searchFilter"]
    configs = client.search_runs([exp.experiment_id], "tags.`fedsweep.role` = 'config'") if (
        exp := client.get_experiment_by_name("tiny")) else []
    assert sorted(r.data.tags["fedsweep.stage"] for r in configs) == ["selected"] * 2 + ["tuning"] * 4
    assert all(r.data.tags["mlflow.parentRunId"] == parent and r.info.status == "FINISHED" for r in configs)
    assert {k: v for k, v in client.get_run(parent).data.tags.items() if k.startswith("sweep.")} == {
        "sweep.trials": "8", "sweep.seeds": "[0, 1]", "sweep.methods": "fedavg,fedlga", "sweep.pack": "None",
        "sweep.units": "8", "sweep.grid.local.lr": "[0.1, 1e+30]"}
    status = {(r.data.tags["fedsweep.method"], r.data.params["local.lr"], r.data.params["seed"]):
              r.data.tags["fedsweep.status"] for r in runs}
    assert status == {(m, lr, seed): "finished" if lr == "0.1" else "diverged"
                      for m in ("fedavg", "fedlga") for lr in ("0.1", "1e+30") for seed in ("0", "1")}
    # names that tell the configs apart at a glance: the method, then the keys the sweep varies
    assert {r.info.run_name for r in runs} == {f"{m} ηl{lr} s{seed}" for m in ("fedavg", "fedlga")
                                               for lr in ("0.1", "1e+30") for seed in (0, 1)}
    exp = client.get_experiment_by_name("tiny")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"   # opens on the runs
    for r in runs:
        assert r.data.params["algorithm.name"] == r.data.tags["fedsweep.method"]
        (data,) = r.inputs.dataset_inputs                                      # the Dataset column
        assert data.dataset.name == "digits classes2 N8"
        assert {"config.yaml", "metrics.csv", "curves.png", "summary.json"} <= \
            {a.path for a in client.list_artifacts(r.info.run_id)}
        if r.data.tags["fedsweep.status"] == "diverged":
            # the UI's status column tells it from a usable run; the loss shows where it went
            assert r.info.status == "FAILED" and r.data.tags["fedsweep.diverged_round"] == "1"
            (loss,) = client.get_metric_history(r.info.run_id, "train/loss")
            assert loss.step == 1 and not math.isfinite(loss.value)
            got = download_artifacts(run_id=r.info.run_id, artifact_path="summary.json", dst_path=str(tmp / r.info.run_id),
                                     tracking_uri=uri)
            summary = json.loads(Path(got).read_text())                 # strict JSON: null, not NaN
            assert summary["status"] == "diverged" and summary["diverged_round"] == 1
            assert summary["final_test_loss"] is None or math.isfinite(summary["final_test_loss"])
        else:
            assert r.info.status == "FINISHED" and "fedsweep.diverged_round" not in r.data.tags
        if r.data.tags["fedsweep.status"] == "finished":
            losses = client.get_metric_history(r.info.run_id, "train/loss")
            assert [m.step for m in losses] == [1, 2, 3, 4]            # every round, once
            assert r.data.metrics["train/loss"] == losses[-1].value    # the runs table shows the last
            assert [m.step for m in client.get_metric_history(r.info.run_id, "test/accuracy")] == [2, 4]
            assert r.data.metrics["summary/rounds"] == 4 and "best/test_accuracy" in r.data.metrics


def test_the_driver_writes_no_second_copy_of_the_metrics_or_artifacts(finished_sweep):
    """Tune's default loggers (result.json, progress.csv, TensorBoard events in every trial's
    folder) would write each metric row again beside MLflow, in the driver, at every report; and
    the artifacts each worker draws reach the driver in its final report, so no copy of them is
    written to any disk but MLflow's."""
    tmp, _, _ = finished_sweep
    drawn = {"summary.json", "curves.png", "metrics.csv", "config.yaml"}
    assert not [p for p in (tmp / "fedsweep_runs").rglob("*") if p.name in drawn]
    trial_dirs = [p for p in (tmp / "fedsweep_runs" / "tiny").iterdir() if p.name.startswith("run_unit_")]
    assert len(trial_dirs) == 8
    written = {f.name for d in trial_dirs for f in d.rglob("*") if f.is_file()}
    assert not written & {"result.json", "progress.csv", "params.json", "params.pkl"}, written
    assert not any(name.startswith("events.out.tfevents") for name in written), written


def test_tune_ends_with_where_the_report_is_and_a_line_per_verdict(finished_sweep):
    tmp, _, path = finished_sweep
    lines = (tmp / "tune.out").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("report: wrote reports/tiny/report.md"))
    assert lines[at].endswith(f"; remake it with: fedsweep report {path}")
    assert not any(line.startswith("report:   ") for line in lines)     # no to-do line once it is written
    assert lines[at + 1].startswith("verdicts against fedavg (paired by seed;")
    verdicts = lines[at + 2:]
    comparisons = pd.read_csv(tmp / "reports" / "tiny" / "comparisons.csv")
    assert len(verdicts) == len(comparisons) and len(verdicts) >= 1
    for line, (_, c) in zip(verdicts, comparisons.iterrows()):
        assert line.split()[1] == c["method"] and line.split()[-1] == c["verdict"].split()[-1]
        assert f"{c['n_seeds']} seeds" in line


def test_report_from_the_store(finished_sweep, capsys):
    tmp, _, path = finished_sweep
    out = tmp / "report"
    assert main(["report", path, "--out", str(out)]) == 0
    assert "verdicts against fedavg" in capsys.readouterr().out
    text = (out / "report.md").read_text()
    assert "fedavg" in text and "fedlga" in text and "has not ended" not in text
    assert (out / "accuracy_curves.png").stat().st_size > 0 and (out / "rounds_to_target.png").stat().st_size > 0


def test_a_report_made_before_its_sweep_ends_says_so_and_leaves_the_open_run_alone(finished_sweep, capsys):
    """While the sweep's run is open (a sweep running, or a killed driver's), the report says how many of its
    trials it reads, and its run keeps what it has: the sweep logs its own report when it ends."""
    tmp, uri, path = finished_sweep
    client, runs = trial_runs(uri, "tiny")
    (parent,) = {r.data.tags["mlflow.parentRunId"] for r in runs}
    before = client.get_run(parent).data
    client.set_terminated(parent, status="RUNNING")
    try:
        assert main(["report", path, "--out", str(tmp / "early")]) == 0
    finally:
        client.set_terminated(parent, status="FINISHED")
    err = capsys.readouterr().err
    line = (f"its MLflow run {parent} is still open (the sweep runs, or its driver was killed: `fedsweep tune "
            "--resume` continues it); 8 of its 8 trials have a result, and this report reads only those. It is not "
            "logged onto the open run: the sweep logs its own report when it ends")
    assert f"report: note: {line}" in err and f"- **the sweep has not ended**: {line}" in (tmp / "early" / "report.md").read_text()
    after = client.get_run(parent).data
    assert after.tags == before.tags and after.metrics == before.metrics     # the open run: as it was


def _main_without_torch(argv: list[str], cwd, uri: str) -> subprocess.CompletedProcess:
    """``fedsweep <argv>`` as a fresh process in which importing torch is an error."""
    code = ("import sys\n"
            "class NoTorch:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'torch':\n"
            "            raise ImportError('torch imported')\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "from fedsweep.cli import main\n"
            f"sys.exit(main({argv!r}))\n")
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "MLFLOW_TRACKING_URI": uri})


@pytest.mark.parametrize("command", [["report", "tiny.yaml", "--out", "report-no-torch"], ["config", "tiny.yaml"],
                                     ["algorithms"]])
def test_commands_that_train_nothing_do_not_import_torch(finished_sweep, command):
    """`fedsweep report`, `config` and `algorithms` read the algorithms' declarations and the run
    plan's types but train nothing: torch (~0.8 s of a 1.2 s command) is not imported. Each is run
    on the real sweep's store."""
    tmp, uri, _ = finished_sweep
    proc = _main_without_torch(command, tmp, uri)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip()


def test_the_driver_does_not_import_torch(tmp_path):
    """A sweep's driver checks its trials' data splits (numpy), runs Tune and logs every trial to
    MLflow, finished and diverged ones, without torch (~0.8 s of its start-up, before Ray); only its
    workers train. A real sweep whose driver cannot import torch."""
    path = write_sweep(tmp_path / "s.yaml", "s")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = _main_without_torch(["tune", path], tmp_path, uri)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = trial_runs(uri, "s")
    assert sorted(r.data.tags["fedsweep.status"] for r in runs) == ["diverged"] * 2 + ["finished"] * 2


def test_dry_run_and_bad_sweep_files(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path / "s.yaml", "s")
    assert main(["tune", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "s: 4 trials" in out and "fedlga" in out
    cases = [({"grid": {"local.lrr": [0.1]}}, "local.lrr: unknown key"),
             ({"grid": {"local.lr": ["fast"]}}, "local.lr: Input should be a valid number"),
             ({"methods": {"fedfoo": {}}}, "algorithm.name: unknown algorithm 'fedfoo'"),
             ({"methods": {"fedavg": {"algorithm.damping": [1.0]}}}, "algorithm.damping: unknown key"),
             ({"seedz": [1]}, "seedz: unknown key"),
             ({"grid": {"heterogeneity.rho": [1.5]}}, "heterogeneity.rho"),
             ({"report": {"settings": ["server_data.fractoin"]}},
              "report.settings: 'server_data.fractoin' is not a config key"),
             ({"report": {"reference": "clg_sgd"}}, "report.reference: 'clg_sgd' is not a method of this sweep; "
              "allowed: fedavg, fedlga")]
    for over, needle in cases:
        bad = write_sweep(tmp_path / "bad.yaml", "bad", **over)
        assert main(["tune", bad, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, (over, err)


def test_what_changed_since_a_sweep_started(tmp_path):
    """What `--resume` compares: the saved trials against those the sweep file gives now."""
    from fedsweep.sweep.units import pack_units
    from fedsweep.sweep.tune import _changed_since_start, _trial_payloads

    def state(**over):
        sweep = load_sweep(write_sweep(tmp_path / "c.yaml", "c", **over))
        trials = expand(sweep)
        return json.loads(json.dumps({"trials": _trial_payloads(trials, sweep),
                                      "units": pack_units(sweep, trials)}))

    saved = state()
    now = lambda **over: _changed_since_start(saved, (s := state(**over))["trials"], s["units"])  # noqa: E731
    assert now() == ""
    assert now(seeds=[0, 1]) == "4 trials then, 8 now"
    assert now(base={**TINY["base"], "rounds": 5}) == \
        "4 of 4 trials differ; fedavg local.lr=0.1 seed=0: rounds 4 then, 5 now"
    assert now(pack=2) == "its trials were packed into 4 units, now 2 (pack:)"
    older = json.loads(json.dumps(saved))          # a key a later fedsweep added is not a change
    del older["trials"][0]["run"]["eval"]["every"]
    assert _changed_since_start(older, saved["trials"], saved["units"]) == ""


def test_the_status_line_comes_while_no_trial_reports(monkeypatch):
    """Tune waiting on a node that died with nothing to take its trials reports nothing for a minute
    or more: the status line still comes on time, and says how long no trial has reported."""
    import io

    from ray.tune.experiment import Trial

    from fedsweep.sweep import progress
    monkeypatch.setattr(progress, "STATUS_EVERY_S", 0.2)
    stream = io.StringIO()
    callback = progress.make_progress_callback([{"run": {"rounds": 4}, "label": "fedavg seed=0"}], [[0]],
                                               stream=stream)
    trial = Trial("run_unit", config={"trial": 0}, trial_id="t0", stub=True)
    trial.set_status(Trial.RUNNING)
    callback.setup()
    callback.on_step_begin(0, [trial])
    callback.last_report -= 75                        # as if the last report came 75 s ago
    assert _wait_for(lambda: "no trial has reported for 1 min 15 s" in stream.getvalue(), 5)
    callback.on_experiment_end([trial])
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[sweep] 1 trials: 1 running | ") and callback.ticker.is_set()


def test_the_status_line_leads_by_what_selection_ranks():
    """Per setting, the live leader is ranked as selection ranks: the fewest validation rounds to the
    target (a run that has not reached it below every one that has), then validation accuracy; test
    accuracy is never read where there is a validation split."""
    import io

    from ray.tune.experiment import Trial

    from fedsweep.sweep import progress
    run = {"rounds": 9, "eval": {"target_accuracy": 0.8}, "heterogeneity": {"rho": 0.5}}
    payloads = [{"run": run, "label": name} for name in ("fast", "accurate", "test-only")]
    payloads.append({"run": {**run, "heterogeneity": {"rho": 0.9}}, "label": "slow"})
    stream = io.StringIO()
    callback = progress.make_progress_callback(payloads, [[0, 1, 2, 3]], stream=stream,
                                               settings=["heterogeneity.rho"])
    trial = Trial("run_unit", config={"trial": 0}, trial_id="t0", stub=True)
    trial.set_status(Trial.RUNNING)

    def report(index, rows):
        callback.on_trial_result(0, [trial], trial, {"members": {str(index): {"rows": rows}}})

    report(0, [{"round": 1, "val/accuracy": 0.5, "test/accuracy": 0.99}, {"round": 2, "val/accuracy": 0.81}])
    report(1, [{"round": 1, "val/accuracy": 0.79}, {"round": 2, "val/accuracy": 0.79}])
    report(1, [{"round": 3, "val/accuracy": 0.95}])            # reaches it later, with more accuracy
    report(2, [{"round": 1, "val/accuracy": 0.7, "test/accuracy": 1.0}])
    report(3, [{"round": 1, "val/accuracy": 0.6}])             # ρ = 0.9: nobody there has reached it
    callback.on_experiment_end([trial])
    line = stream.getvalue().splitlines()[-1]
    assert "leading on val: 2 rounds to 0.8 fast; 0.6000 slow" in line, line

    def status(**options) -> str:
        """The last status line after the same reports, with rows carrying a per-client metric too."""
        out = io.StringIO()
        cb = progress.make_progress_callback(payloads, [[0, 1, 2, 3]], stream=out, settings=["heterogeneity.rho"],
                                             **options)
        for index, p10 in ((0, 0.70), (1, 0.75), (3, 0.40)):
            cb.on_trial_result(0, [trial], trial, {"members": {str(index): {"rows": [
                {"round": 1, "val/accuracy": 0.99, "served/val_accuracy_p10": p10, "served/accuracy_p10": 1.0}]}}})
        cb.on_experiment_end([trial])
        return out.getvalue().splitlines()[-1]
    # report.metric: ranked by its validation twin, not by accuracy or rounds; none in the confirm stage
    assert "leading on val by served/val_accuracy_p10: 0.7500 accurate; 0.4000 slow" in \
        status(metric="served/accuracy_p10")
    assert "leading" not in status(lead=False)


def test_durations_read_as_people_say_them():
    from fedsweep.runs.run import duration
    assert [duration(x) for x in (0.4, 59.4, 61, 3599, 3600, 7620)] == \
        ["0 s", "59 s", "1 min 01 s", "59 min 59 s", "1 h 00 min", "2 h 07 min"]


def test_grid_expansion_crosses_methods_and_seeds(tmp_path):
    path = write_sweep(tmp_path / "g.yaml", "g", seeds=[0, 1, 2],
                       grid={"local.lr": [0.1, 0.2], "heterogeneity.rho": [0.1, 0.5, 0.9]})
    trials = expand(load_sweep(path))
    assert len(trials) == 2 * 3 * 2 * 3                                # methods × grid × seeds
    ids = {}
    for t in trials:
        ids.setdefault(t.config_id, set()).add(t.seed)
    assert all(seeds == {0, 1, 2} for seeds in ids.values()) and len(ids) == 12


def _wait_for(predicate, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def ray_processes_of(pgid: int) -> list[int]:
    """Live Ray processes (gcs, raylet, ``ray::`` agents and workers) in process group ``pgid``."""
    return sorted({pid for pid, _, group, cmd in _processes() if group == pgid and pid != os.getpid()
                   and ("ray::" in cmd or "site-packages/ray/" in cmd)})


def start_sweep(path, cwd, uri):
    """``fedsweep tune PATH`` in a subprocess that leads its own process group, as a shell job does;
    its output goes to ``cwd/driver.log`` (a pipe nobody reads while we wait would block it)."""
    with open(Path(cwd) / "driver.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "tune", path], cwd=cwd,
                                env={**os.environ, "MLFLOW_TRACKING_URI": uri}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _statuses(uri, name):
    """The trials' statuses, read without creating the store or reading it while fedsweep creates it."""
    db = Path(uri[len("sqlite:///"):])
    if not db.exists():
        return []
    try:
        with store_lock(db.parent):
            _, runs = trial_runs(uri, name)
    except Exception:  # noqa: BLE001 - no experiment yet
        return []
    return [r.data.tags.get("fedsweep.status") for r in runs]


def test_resume_after_kill_reruns_nothing_finished(tmp_path, monkeypatch, capsys):
    """`kill -9` of the driver alone (Ray's agents outlive it): the next `fedsweep tune` ends what
    that driver left and only that, refuses to start over silently, refuses a tuner.pkl that is not
    the one its driver wrote (crafted to run a command, or damaged) before Ray unpickles it, and
    `--resume` finishes the sweep without rerunning or duplicating anything."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec_over = {"grid": {"local.lr": [0.05, 0.1]}, "seeds": [0, 1], "max_concurrent": 1,
                 "base": {**TINY["base"], "rounds": 30, "eval": {"every": 3}}}
    path = write_sweep(tmp_path / "r.yaml", "r", **spec_over)
    proc = start_sweep(path, tmp_path, uri)
    try:
        assert _wait_for(lambda: _statuses(uri, "r").count("finished") >= 2, 240), \
            (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        os.kill(proc.pid, signal.SIGKILL)                              # the driver only
        proc.wait()
    _, before = trial_runs(uri, "r")
    # Closed runs only: the driver tags a run's status, then ends it; a kill between the two leaves a
    # run tagged finished but still RUNNING, which the resumed sweep ends (its end time is then new).
    done_before = {r.info.run_id: r.info.end_time for r in before
                   if r.data.tags["fedsweep.status"] == "finished" and r.info.end_time is not None}
    assert len(done_before) < 8                                       # killed mid-sweep
    bystander = subprocess.Popen(["sleep", "300"])                    # in our group, not Ray: kept

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    assert main(["tune", path]) == 2                                  # refuses to silently start over ...
    assert not ray_processes_of(proc.pid)                             # ... after ending what was left
    started = Path(path).read_text()
    edited = yaml.safe_load(started)
    edited["grid"]["local.lr"] = [0.05, 0.2]
    Path(path).write_text(yaml.safe_dump(edited))
    assert main(["tune", path, "--resume"]) == 2                      # an edit would be silently ignored
    assert "changed since sweep 'r' started (4 of 8 trials differ; " in capsys.readouterr().err
    Path(path).write_text(started)
    (record,) = tmp_path.glob("**/r/tuner.pkl")                       # Ray Tune's pickle: reading it runs code
    kept = record.read_bytes()
    import pickle

    class Crafted:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'PWNED'}",)
    for foreign in (pickle.dumps(Crafted()), os.urandom(300)):
        record.write_bytes(foreign)
        assert main(["tune", path, "--resume"]) == 2                  # refused before Ray reads it
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "is not the one this sweep's driver wrote" in err, err
        assert "--restart" in err and not (tmp_path / "PWNED").exists()
    record.write_bytes(kept)
    assert main(["tune", path, "--resume"]) == 0
    assert bystander.poll() is None
    bystander.kill()
    client, after = trial_runs(uri, "r")
    assert len(after) == 8                                            # nothing lost, nothing duplicated
    assert len({(r.data.tags["fedsweep.config_id"], r.data.params["seed"]) for r in after}) == 8
    assert all(r.data.tags["fedsweep.status"] == "finished" for r in after)
    for r in after:
        if r.info.run_id in done_before:                              # finished trials were not rerun
            assert r.info.end_time == done_before[r.info.run_id]
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")]
        assert steps == list(range(1, 31)), f"each round logged exactly once: {steps}"


def _driver_writer(tmp_path):
    """The sweep driver's MLflow writer for the tiny sweep, on a new store with a parent run, outside
    Tune, and a Tune trial (``t1``) of its sweep trial 1: (client, writer, payloads, trial)."""
    from mlflow import MlflowClient
    from ray.tune.experiment import Trial

    from fedsweep.sweep.storage import Storage
    from fedsweep.runs.tracking import experiment_id
    from fedsweep.sweep.tune import _trial_payloads
    from fedsweep.sweep.callbacks import make_mlflow_callback
    sweep = load_sweep(write_sweep(tmp_path / "p.yaml", "p"))
    trials = expand(sweep)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = experiment_id(client, "p", uri)                       # its artifacts beside the store, as a sweep's
    parent = client.create_run(exp).info.run_id
    payloads = _trial_payloads(trials, sweep)
    writer = make_mlflow_callback(uri, exp, parent, "p", Storage(tmp_path / "storage" / "p"), payloads,
                                  [[t.index] for t in trials])
    return client, writer, payloads, Trial("run_unit", config={"trial": 1}, trial_id="t1", stub=True)


def written(callback, key=("t1", 1)) -> str:
    """The MLflow id of ``callback``'s run ``key``, once its writer has made every write it holds
    (the driver's writes go through a thread of their own)."""
    assert callback.writer.drain(30)
    return callback.writer.run_id(callback.runs[key])


def test_a_resumed_sweep_mends_the_runs_a_killed_driver_left_half_written(tmp_path):
    """The driver creates a trial's run, then logs its params: `kill -9` between the two left a run
    without them (seen once in ten runs of the test above, as a KeyError on `seed`). Tune's restored
    MLflow writer, finding that run, logs what it lacks and keeps what it has; and it ends a run
    whose last write went through but whose end did not."""
    import sqlite3

    from ray import cloudpickle

    from fedsweep.config.schema import RunConfig
    client, writer, payloads, trial = _driver_writer(tmp_path)
    restored = cloudpickle.loads(cloudpickle.dumps(writer))      # as Tune restores it on --resume
    writer.on_trial_start(0, [trial], trial)
    run_id = written(writer)
    expected = {k: str(v) for k, v in RunConfig(**payloads[1]["run"]).flat().items() if not k.startswith("mlflow.")}
    assert expected["local.lr"] == "1e+30" and expected["algorithm.name"] == "fedavg"
    assert client.get_run(run_id).data.params == expected
    with sqlite3.connect(tmp_path / "mlflow.db") as db:          # what the killed driver left
        db.execute("DELETE FROM params WHERE run_uuid = ? AND key != 'seed'", (run_id,))
    assert client.get_run(run_id).data.params == {"seed": expected["seed"]}
    restored.on_trial_start(0, [trial], trial)
    assert written(restored) == run_id and client.get_run(run_id).data.params == expected

    # A failed run that --resume retries is reopened: running again, without the old error (a run
    # that then finishes is not reported failed)
    client.set_tag(run_id, "fedsweep.status", "failed")
    client.set_tag(run_id, "fedsweep.error", "OSError: [Errno 28] No space left on device")
    client.set_terminated(run_id, status="FAILED")
    reopened = cloudpickle.loads(cloudpickle.dumps(writer))
    reopened.on_trial_start(0, [trial], trial)
    assert written(reopened) == run_id
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and run.data.tags["fedsweep.status"] == "running"
    assert "fedsweep.error" not in run.data.tags

    # Killed after the run's last write (its status tag says finished) and before ending it: the
    # restored writer ends it, and leaves it closed (Tune replays the trial; nothing is rewritten).
    client.set_tag(run_id, "fedsweep.status", "finished")
    assert client.get_run(run_id).info.status == "RUNNING"
    again = cloudpickle.loads(cloudpickle.dumps(writer))
    again.on_trial_start(0, [trial], trial)
    assert written(again) == run_id
    assert client.get_run(run_id).info.status == "FINISHED" and ("t1", 1) in again.closed
    # Tune's replay ends that trial again, its final report carrying the artifacts drawn again: the
    # run is kept as it was, and nothing is logged a second time.
    again.on_trial_result(0, [trial], trial, {"members": {"1": {"rows": [], "status": "finished",
                                                                "artifacts": {"summary.json": b"{}"}}}})
    again.on_trial_complete(0, [trial], trial)
    assert written(again) == run_id
    assert client.get_run(run_id).info.status == "FINISHED" and client.list_artifacts(run_id) == []


def test_a_members_last_rows_are_written_at_its_last_report(tmp_path):
    """Rows reach MLflow at most every FLUSH_SECONDS, except at a member's last report (the one with
    its status): its rows are written then, while its worker draws the artifacts, not left for the
    run's close; the run's summary and status still come only with the close."""
    client, writer, _, trial = _driver_writer(tmp_path)
    writer.on_trial_start(0, [trial], trial)
    run_id = written(writer)

    def report(rounds, **final):
        rows = [{"round": r, "train/loss": 1.0 / r} for r in rounds]
        result = {"members": {"1": {"rows": rows, **final}}}
        writer.on_trial_result(0, [trial], trial, result)
        trial.update_last_result(result)                 # as Tune does, after its callbacks: the same dict
        written(writer)
        return [m.step for m in client.get_metric_history(run_id, "train/loss")]

    assert report([1, 2]) == [1, 2]                  # the first report is written
    assert report([3]) == [1, 2]                     # the next waits for FLUSH_SECONDS...
    drawn = {"summary.json": json.dumps({"status": "finished", "best_test_accuracy": 0.5, "rounds": 4}).encode(),
             "curves.png": b"png"}
    assert report([4], status="finished", artifacts=drawn) == [1, 2, 3, 4]   # ...unless it is the member's last
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and run.data.tags["fedsweep.status"] == "running"
    assert "artifacts" not in trial.last_result["members"]["1"]   # not kept in Tune's snapshots
    writer.on_trial_complete(0, [trial], trial)      # the close writes the summary, artifacts and status
    written(writer)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["fedsweep.status"] == "finished"
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [1, 2, 3, 4]
    assert run.data.metrics["summary/rounds"] == 4 and run.data.metrics["best/test_accuracy"] == 0.5
    assert sorted(a.path for a in client.list_artifacts(run_id)) == ["curves.png", "summary.json"]


def test_a_run_whose_summary_cannot_be_had_ends_incomplete_and_is_named(tmp_path, monkeypatch):
    """A run is closed as finished only with its summary. One whose final report carried no
    artifacts, and one a scheduler stopped whose checkpoint the driver cannot read (a storage the
    nodes did not share), each end `incomplete` (MLflow FAILED) with the reason; the sweep's last
    lines name them and exit 4, and `fedsweep report` names them and scores only the complete run
    (never such a run as accuracy 0, "no target accuracy was set")."""
    from ray.tune.experiment import Trial

    from fedsweep.cli import sweep_outcome
    from fedsweep.sweep.ending import outcomes
    client, writer, payloads, missing = _driver_writer(tmp_path)
    done, stopped = (Trial("run_unit", config={"trial": i}, trial_id=f"t{i}", stub=True) for i in (0, 2))
    rows = [{"round": r, "train/loss": 1.0, "round/seconds": 0.1, "comm/up_models": 4.0, "comm/down_models": 4.0,
             "compute/grad_evals": 16.0, **({"test/accuracy": 0.2 * r, "test/loss": 1.0} if r % 2 == 0 else {})}
            for r in (1, 2, 3, 4)]
    from fedsweep.config.schema import RunConfig
    from fedsweep.runs.run import summarize, summary_json
    summary = summary_json(summarize(RunConfig(**payloads[0]["run"]), rows)).encode()
    for trial, final in ((done, {"status": "finished", "artifacts": {"summary.json": summary}}),
                         (missing, {"status": "finished"}), (stopped, {})):
        writer.on_trial_start(0, [trial], trial)
        result = {"members": {str(trial.config["trial"]): {"rows": rows, **final}},
                  **({"fedsweep_done": True} if final else {})}
        writer.on_trial_result(0, [trial], trial, result)
        trial.update_last_result(result)
        writer.on_trial_complete(0, [trial], trial)
    assert writer.writer.drain(30)
    runs = {r.data.tags["ray.trial_id"]: r for r in trial_runs(writer.uri, "p")[1]}
    assert runs["t0"].info.status == "FINISHED" and runs["t0"].data.tags["fedsweep.status"] == "finished"
    where = tmp_path / "storage" / "p" / "trial_checkpoints"
    for tid, last in (("t1", "its final report carried none"), ("t2", "stopped by the scheduler")):
        run = runs[tid]
        assert run.info.status == "FAILED" and run.data.tags["fedsweep.status"] == "incomplete"
        assert run.data.tags["fedsweep.error"] == (f"no summary or artifacts reached the driver ({last}; no "
                                                   f"checkpoint at {where / f'{tid}.ckpt'})")
        assert "summary/rounds" not in run.data.metrics and client.list_artifacts(run.info.run_id) == []
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [1, 2, 3, 4]

    outcome = outcomes(client, runs["t0"].info.experiment_id, writer.parent_id)
    assert outcome["finished"] == 1 and outcome["incomplete"] == 2
    lines = sweep_outcome({**outcome, "trials": 3, "unfinished": 0, "parent_run_id": writer.parent_id,
                           "experiment": "p", "experiment_id": runs["t0"].info.experiment_id,
                           "tracking_uri": writer.uri}, "p.yaml").splitlines()
    assert lines[0] == "sweep done: 1 finished, 2 incomplete"
    assert {line.split(": ", 1)[0] for line in lines[1:3]} == {
        f"incomplete ({runs[t].info.run_name})" for t in ("t1", "t2")}

    monkeypatch.setenv("MLFLOW_TRACKING_URI", writer.uri)
    assert main(["report", str(tmp_path / "p.yaml"), "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "- trials: 3 (finished 1, incomplete 2)" in text and "## Incomplete runs" in text
    for tid in ("t1", "t2"):
        assert f"| {runs[tid].info.run_name} | `{runs[tid].data.tags['fedsweep.config_id']}` |" in text
    assert "## Failed trials" not in text


def test_metric_rows_are_written_in_whole_rounds_within_mlflows_limit():
    """A write of metric rows: at most 1000 metrics a call (MLflow's limit), no round split over two
    calls, so a driver cut off between two calls leaves no round half written."""
    from fedsweep.runs.writer import whole_rounds
    rows = [{"round": r, "train/loss": 1.0, "test/accuracy": 0.5, "round/seconds": 0.1} for r in range(1, 401)]
    chunks = whole_rounds(rows)                                  # 3 metrics a round, 1200 in all
    assert [len(c) for c in chunks] == [333, 67] and sum(chunks, []) == rows
    assert whole_rounds(rows[:333]) == [rows[:333]] and whole_rounds([]) == []
    assert [len(c) for c in whole_rounds([{"round": 1, **{f"m{i}": 1.0 for i in range(1200)}}])] == [1]   # never split


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["ctrl-c", "kill"])
def test_ctrl_c_marks_open_trials_killed_and_resume_finishes(tmp_path, monkeypatch, capsys, stop):
    """Ctrl-C (SIGINT to the whole foreground group, as a terminal sends it) or `kill PID` (SIGTERM
    to the driver alone): the open trials' runs become KILLED, the line counts the whole sweep, no
    Ray process is left, no native stack dump; `--resume` reopens them and its status line counts
    every trial of the sweep, not only this invocation's."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # Long enough trials that both are still open 3 s after they start (their imports take ~2 s of
    # it since fedsweep/util/startup.py; with 400 rounds both had sometimes finished by then).
    path = write_sweep(tmp_path / "i.yaml", "i", methods={"fedavg": {}}, seeds=[0, 1], max_concurrent=2,
                       grid={"local.lr": [0.05, 0.1]}, base={**TINY["base"], "rounds": 3000, "eval": {"every": 300}})
    proc = start_sweep(path, tmp_path, uri)
    try:
        assert _wait_for(lambda: _statuses(uri, "i").count("running") == 2, 240), \
            (tmp_path / "driver.log").read_text()[-3000:]
        time.sleep(3)
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=180)
        out = (tmp_path / "driver.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    statuses = _statuses(uri, "i")
    unfinished = 4 - statuses.count("finished")
    assert proc.returncode == 1 and f"; {unfinished} of 4 unfinished\ncontinue with:  fedsweep tune {path} --resume" \
        in out, out[-3000:]
    assert "logging.cc" not in out and "Traceback" not in out, out[-3000:]
    assert "running" not in statuses and statuses.count("interrupted") >= 1, statuses
    _, runs = trial_runs(uri, "i")
    assert all(r.info.status == "KILLED" for r in runs if r.data.tags["fedsweep.status"] == "interrupted")
    assert _wait_for(lambda: not ray_processes_of(proc.pid), 30), "Ray processes outlived the driver"

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    assert main(["tune", path, "--resume"]) == 0
    assert "[sweep] 4 trials: 4 finished" in capsys.readouterr().err
    _, runs = trial_runs(uri, "i")
    assert sorted((r.data.tags["fedsweep.status"], r.info.status) for r in runs) == [("finished", "FINISHED")] * 4


def _sweep_and_store(tmp_path, monkeypatch, name: str):
    """A one-method tiny sweep ``name`` run from ``tmp_path``, and its MLflow store with its experiment
    made: (uri, sweep path, client, experiment id)."""
    from mlflow import MlflowClient
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    path = write_sweep(tmp_path / f"{name}.yaml", name, methods={"fedavg": {}})
    client = MlflowClient(tracking_uri=uri)
    return uri, path, client, client.create_experiment(name)


def test_restart_closes_the_runs_a_killed_sweep_left_open(tmp_path, monkeypatch, capsys):
    """`--restart` of a sweep whose driver was killed: the old sweep's runs that MLflow still shows
    RUNNING end KILLED (tagged interrupted, as after Ctrl-C) and its parent run KILLED; finished runs
    stay as they are; the new sweep runs as usual."""
    from fedsweep.sweep.tune import STATE_FILE
    uri, path, client, exp = _sweep_and_store(tmp_path, monkeypatch, "z")
    old = client.create_run(exp, tags={"fedsweep.role": "sweep", "fedsweep.sweep": "z"}).info.run_id
    child = {s: client.create_run(exp, tags={"mlflow.parentRunId": old, "fedsweep.role": "trial",
                                             "fedsweep.status": s}).info.run_id for s in ("running", "finished")}
    client.set_terminated(child["finished"], status="FINISHED")
    exp_dir = tmp_path / "fedsweep_runs" / "z"      # what the killed driver left: its state, unfinished
    exp_dir.mkdir(parents=True)
    (exp_dir / STATE_FILE).write_text(json.dumps({"parent_run_id": old, "tracking_uri": uri,
                                                 "experiment": "z", "finished": False}))
    assert main(["tune", path]) == 2                                  # unfinished: resume or restart
    assert client.get_run(old).info.status == "RUNNING"
    assert main(["tune", path, "--restart"]) == 0
    assert client.get_run(old).info.status == "KILLED"
    running = client.get_run(child["running"])
    assert running.info.status == "KILLED" and running.data.tags["fedsweep.status"] == "interrupted"
    finished = client.get_run(child["finished"])
    assert finished.info.status == "FINISHED" and finished.data.tags["fedsweep.status"] == "finished"
    _, runs = trial_runs(uri, "z")
    new = [r for r in runs if r.data.tags["mlflow.parentRunId"] != old]
    assert len(new) == 2 and all(r.data.tags["fedsweep.status"] in ("finished", "diverged") for r in new)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_restart_closes_the_parent_of_a_sweep_killed_while_it_was_set_up(tmp_path, monkeypatch, capsys):
    """A driver killed after creating the parent run and before writing its id to the state file
    (between the two, it logs the run's params and sweep.yaml) left a parent RUNNING that no state
    names: the state's sweep id, which the parent carries as a tag from its creation, leads
    `--restart` to it; `--resume` says the sweep never got as far as its trials (or, while a driver
    holds the sweep's lock, that it is running). A parent of another sweep of the same name
    (another --storage: another lock, another sweep id) is not touched."""
    from fedsweep.sweep.tune import STATE_FILE
    uri, path, client, exp = _sweep_and_store(tmp_path, monkeypatch, "k")
    tags = {"fedsweep.role": "sweep", "fedsweep.sweep": "k"}
    orphan = client.create_run(exp, tags={**tags, "fedsweep.sweep_id": "a" * 32}).info.run_id
    other = client.create_run(exp, tags={**tags, "fedsweep.sweep_id": "b" * 32}).info.run_id
    exp_dir = tmp_path / "fedsweep_runs" / "k"      # what the killed driver left
    exp_dir.mkdir(parents=True)
    (exp_dir / STATE_FILE).write_text(json.dumps({"sweep_id": "a" * 32, "parent_run_id": None, "tracking_uri": uri,
                                                 "experiment": "k", "finished": False}))
    from fedsweep.util.locks import SweepLock
    with SweepLock(tmp_path / "fedsweep_runs" / "k.lock", "k") as setting_up:   # a driver still at it
        setting_up.acquire()
        assert main(["tune", path, "--resume"]) == 2
        assert "is already running since" in capsys.readouterr().err
    assert main(["tune", path, "--resume"]) == 2
    assert "stopped while it was being set up" in capsys.readouterr().err
    assert main(["tune", path, "--restart"]) == 0
    assert client.get_run(orphan).info.status == "KILLED"
    assert client.get_run(other).info.status == "RUNNING"
    # The new sweep's state names its parent, which carries the state's sweep id.
    state = json.loads((exp_dir / STATE_FILE).read_text())
    parent = client.get_run(state["parent_run_id"])
    assert parent.data.tags["fedsweep.sweep_id"] == state["sweep_id"] not in ("a" * 32, "b" * 32)
    assert parent.info.status == "FINISHED" and state["finished"]


def test_what_a_trial_would_find_late_is_refused_before_ray(tmp_path, capsys, monkeypatch):
    """A torchvision dataset's missing files, a `device: cuda` trial given no GPU and a split of the
    data that cannot be made would fail every trial, after Ray started and after each retry: refused
    first, one line, nothing written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "MNIST" / "raw").mkdir(parents=True)
    (tmp_path / "data" / "MNIST" / "raw" / "train-images-idx3-ubyte").write_bytes(b"")   # 1 of 4 files
    mnist = {**TINY["base"], "data": {**TINY["base"]["data"], "name": "mnist", "root": str(tmp_path / "data")}}
    cases = [({"grid": {"data.name": ["digits", "mnist"]}, "base": mnist},
              f"data.root: no usable MNIST files under {tmp_path / 'data'} (expected "),
             ({"base": {**TINY["base"], "device": "cuda"}}, "device: 'cuda' (trial fedavg local.lr=0.1 seed=0) "
              "needs resources.gpu > 0"),
             # a split that cannot be made: every trial using it would fail once its data is made
             ({"grid": {"data.partition.classes_per_client": [2, 12]}}, "late.yaml: data.partition.classes_per_client: "
              "P=12 but the training set has 10 classes; allowed 1..10 (trial fedavg "
              "data.partition.classes_per_client=12 seed=0)"),
             ({"base": {**TINY["base"], "data": {"name": "synthetic", "num_clients": 8, "train_size": 10}}},
              "data.train_size: 'synthetic' comes split over clients already; unset train_size")]
    for over, needle in cases:
        path = write_sweep(tmp_path / "late.yaml", "late", **over)
        assert main(["tune", path]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "late.yaml"]


def test_unreachable_cluster_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path / "u.yaml", "u")
    port = _free_port()                                   # nothing listens there
    assert main(["tune", path, "--address", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fedsweep: error: --address 127.0.0.1:{port}: no Ray head answers there")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "fedsweep_runs").exists()


def test_a_sweep_that_ended_well_leaves_no_ray_session_folder(tmp_path, monkeypatch):
    """Ray keeps every session's folder (logs, sockets, staging copies; ~5 MB a sweep) in /tmp until
    the machine restarts, and /tmp is memory on many systems: a local instance's folder goes with a
    sweep whose trials all ended well (a failed trial's keeps it: the crash test below)."""
    from fedsweep.sweep.tune import tune_sweep
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    path = write_sweep(tmp_path / "s.yaml", "s", methods={"fedavg": {}}, grid={"local.lr": [0.1]})
    ctrl_c = signal.getsignal(signal.SIGINT)
    result = tune_sweep(path)
    assert result.get("finished") == 1 and result["ray_session"] and not result["ray_session_kept"]
    # Ray Tune's Ctrl-C handler, left installed, would swallow a Ctrl-C after its run (between stages)
    assert signal.getsignal(signal.SIGINT) is ctrl_c
    folder = Path(result["ray_session"])
    assert folder.name.startswith("session_") and folder.parent.is_dir() and not folder.exists()
    assert os.path.realpath(folder.parent / "session_latest") != str(folder)


def test_resources_no_node_has_are_refused_once_ray_is_up(tmp_path):
    """`resources` this machine's Ray instance does not have: Tune would wait for ever (such a sweep
    hung with no word). Refused once Ray is up, in one line naming the key and what there is, before
    any experiment, run or trial folder is made. In a process of its own with a time limit: the old
    hang fails the test instead of stalling the suite."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cases = [({"cpu": 1, "gpu": 64}, "resources.gpu: a trial asks for 1 CPU and 64 GPUs on one node, but "
               "this machine's Ray instance has ", "set resources.gpu to "),
             ({"cpu": 4096, "gpu": 0}, "resources.cpu: a trial asks for 4096 CPUs and 0 GPUs on one node, "
              "but this machine's Ray instance has ", "so no trial could start; set resources.cpu to at most ")]
    for resources, start, end in cases:
        path = write_sweep(tmp_path / "res.yaml", "res", resources=resources)
        done = subprocess.run([sys.executable, "-m", "fedsweep.cli", "tune", path], cwd=tmp_path, text=True,
                              capture_output=True, timeout=180, env={**os.environ, "MLFLOW_TRACKING_URI": uri})
        err = done.stderr.strip()
        assert done.returncode == 2 and len(err.splitlines()) == 1, err[-2000:]
        assert err.startswith(f"fedsweep: error: {path}: {start}") and end in err, err
        assert not (tmp_path / "fedsweep_runs" / "res").exists()
        from mlflow import MlflowClient
        assert MlflowClient(tracking_uri=uri).get_experiment_by_name("res") is None   # no experiment, no run


def test_crashing_trial_is_retried_then_failed_and_asha_stops_a_laggard(tmp_path, monkeypatch, capsys):
    """A trial that crashes (here: more clients than its MNIST files have samples, found only once the
    data is loaded inside the trial: torchvision datasets are not made before Ray) is retried
    `max_failures` times, then marked failed with its error, and the sweep goes on, then exits 4
    naming the error; ASHA stops a trial that lags."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("FEDSWEEP_TIMELINE", str(tmp_path / "timeline"))   # each trial's phases and checkpoints
    (tmp_path / "timeline").mkdir()
    write_mnist(tmp_path / "data", n_train=4)
    base = {**TINY["base"], "rounds": 8, "clients_per_round": 8, "eval": {"every": 2},
            "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "iid"}, "root": str(tmp_path / "data")},
            "model": {"name": "mlp", "options": {"hidden": 64}}}
    path = write_sweep(tmp_path / "a.yaml", "a", base=base, methods={"fedavg": {}}, seeds=[0],
                       grid={"data.name": ["digits", "mnist"], "local.lr": [0.5, 1.0e-6]},
                       max_concurrent=1, max_failures=1, checkpoint_every=4,
                       scheduler={"kind": "asha", "metric": "test/accuracy", "mode": "max",
                                  "grace_period": 2, "reduction_factor": 2})
    assert main(["tune", path]) == 4
    printed = capsys.readouterr()
    error = "data.num_clients: N=8 clients but only 4 training samples"
    logs = re.search(r"^Ray's logs of it: (.+)$", printed.out, re.M)   # a trial failed: Ray's logs are kept
    assert logs and Path(logs[1]).is_dir() and any(Path(logs[1]).glob("raylet*")), printed.out
    assert f"failed (2 trials): {error}" in printed.out
    assert printed.err.count("[failed] fedavg data.name=mnist") == 2 and "/error.txt)" in printed.err
    assert printed.err.count("[retrying] fedavg data.name=mnist") == 2           # max_failures: 1
    assert "Trials did not complete" not in printed.err                  # Tune's list of trial ids
    assert re.search(r"^\[sweep\] 4 trials: 2 failed, 1 finished, 1 stopped \| leading on test: .* \| \d+ s$", printed.err, re.M)
    assert error in printed.err.split("[retrying] ")[1] and " (failure 1; traceback: " in printed.err
    assert _wait_for(lambda: not ray_processes_of(os.getpgid(0)), 30)   # Ray is gone after crashed trials too
    client, runs = trial_runs(uri, "a")
    status = {(r.data.params["data.name"], r.data.params["local.lr"]): r.data.tags["fedsweep.status"]
              for r in runs}
    assert status == {("digits", "0.5"): "finished", ("digits", "1e-06"): "stopped",
                      ("mnist", "0.5"): "failed", ("mnist", "1e-06"): "failed"}
    # With a scheduler a trial reports where ASHA decides (its rungs: rounds 2, 4 and 8) and at most
    # once a second otherwise, each report with a checkpoint (whatever `checkpoint_every` says: the
    # laggard is stopped before its 4th evaluation): the finished trial at rounds 2 and 4 (and 6 if a
    # second passed), then before its final report. ASHA stops it at that report (round 8 = max_t),
    # and Tune closes its run at once, before the trial's function returns: its artifacts are drawn
    # before the report.
    phases = " ".join(line.split()[1] for f in (tmp_path / "timeline").glob("*.txt")
                      for line in f.read_text().splitlines())
    trials = [t.split() for t in phases.split("start") if t.strip()]
    assert any(t[-3:] == ["trained", "artifacts", "checkpoint"] and t[:-3] in (["checkpoint"] * 2, ["checkpoint"] * 3)
               for t in trials), trials
    for r in runs:
        if r.data.tags["fedsweep.status"] == "failed":
            assert r.info.status == "FAILED" and r.data.tags["fedsweep.error"].startswith(error)
        else:   # the finished run's from its worker, the stopped one's from its checkpoint: all of them
            assert "fedsweep.error" not in r.data.tags
            arts = {a.path: a.file_size for a in client.list_artifacts(r.info.run_id)}
            assert {"config.yaml", "metrics.csv", "summary.json", "curves.png"} <= set(arts), arts
            png = Path(download_artifacts(run_id=r.info.run_id, artifact_path="curves.png", tracking_uri=uri))
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.read_bytes().endswith(b"IEND\xaeB`\x82")
            csv_rows = Path(download_artifacts(run_id=r.info.run_id, artifact_path="metrics.csv", tracking_uri=uri))
            evals = [h.step for h in client.get_metric_history(r.info.run_id, "test/accuracy")]
            assert [int(row["round"]) for row in csv.DictReader(csv_rows.open()) if row["test/accuracy"]] \
                == sorted(evals) and r.data.metrics["summary/rounds"] == max(evals)   # every round reported
    assert main(["report", path, "--out", "rep"]) == 0               # the others are scored, the error listed
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "## Failed trials" in text and f"| 2 | `{error}" in text


@pytest.mark.parametrize("path", sorted(str(p) for p in (Path(__file__).parent.parent / "sweeps").rglob("*.yaml")))
def test_shipped_sweeps_validate(path):
    """Every sweep in sweeps/ expands into valid trials and has valid report keys (what tune checks first)."""
    from fedsweep.sweep.checks import check_data, check_report
    sweep = load_sweep(path)
    trials = expand(sweep, source=path)
    check_report(sweep, trials, source=path)
    check_data(trials, source=path)
    # a config is its values, or (optuna's slots, alike until drawn) its draw number in its study
    assert trials and len({(t.config_id, t.sample) for t in trials}) * len(sweep.seeds or [0]) == len(trials)


@pytest.mark.parametrize("path", sorted(str(p) for p in (Path(__file__).parent.parent / "sweeps").rglob("*.yaml")))
def test_shipped_sweeps_select_on_validation_and_score_confirm_runs(path):
    """Sound by default: every sweep in sweeps/ selects on a validation split and scores only its
    confirm runs (timing inputs live in benchmarks/sweeps/, which make no claim)."""
    sweep = load_sweep(path)
    trials = expand(sweep, source=path)
    assert all(t.config.data.validation_fraction > 0 for t in trials), f"{path}: no validation split"
    assert sweep.confirm is not None and sweep.confirm.seeds, f"{path}: no confirm stage"
    assert not set(sweep.confirm.seeds) & set(sweep.seeds or [0]), f"{path}: confirm seeds must be fresh"


def test_loss_aware_sweep_round_trip(tmp_path, monkeypatch):
    """A FedSoftMax sweep through Ray Tune: per-client weights reach MLflow, and the report computes R90
    against FedAvg's final accuracy (its Table 3) and draws the weights (its Figs. 6 and 7)."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    base = {**TINY["base"], "eval": {"every": 1}, "mlflow": {"tracking_uri": uri}}
    path = write_sweep(tmp_path / "soft.yaml", "soft", base=base, grid={"local.lr": [0.1]},
                       methods={"fedavg": {}, "fedsoftmax": {"algorithm.temperature": [0.3, 3.0]}},
                       report={"settings": ["algorithm.temperature"], "relative_target": 0.9})
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)   # as a notebook running several sweeps
    try:
        assert main(["tune", path]) == 0
        assert ray.is_initialized() and ray.get(ray.put(1)) == 1   # the sweep ran on this Ray and left it up
    finally:
        ray.shutdown()
    client, runs = trial_runs(uri, "soft")
    by_method = {}
    for r in runs:
        by_method.setdefault(r.data.tags["fedsweep.method"], []).append(r)
        assert "summary/stability" in r.data.metrics
    assert len(by_method["fedsoftmax"]) == 2 and len(by_method["fedavg"]) == 1
    for r in by_method["fedsoftmax"]:
        assert "clients.csv" in {a.path for a in client.list_artifacts(r.info.run_id)}
        assert len(client.get_metric_history(r.info.run_id, "weights/max_abs_dev")) == 4
    assert "clients.csv" not in {a.path for a in client.list_artifacts(by_method["fedavg"][0].info.run_id)}
    assert main(["report", path, "--out", str(tmp_path / "rep")]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "0.9 × the final accuracy of fedavg's best config" in text
    assert "| algorithm.temperature=0.3 |" in text and "| algorithm.temperature=3 |" in text
    for name in ("weights_fedsoftmax.png", "settings_curves.png"):
        assert (tmp_path / "rep" / name).stat().st_size > 10_000


def test_run_names_show_the_keys_a_sweep_varies_in_short(tmp_path):
    from fedsweep.sweep.spec import run_name, varying_keys
    path = write_sweep(tmp_path / "n.yaml", "n", grid={"heterogeneity.rho": [0.1, 0.9], "local.lr": [0.05],
                                                       "data.partition": [{"kind": "dirichlet", "alpha": 0.3},
                                                                          {"kind": "classes"}]},
                       methods={"fedavg": {}, "fedprox": {"algorithm.mu": [0.1, 1.0]},
                                "scaffold": {"algorithm.option": [2]}}, seeds=[0, 1])
    trials = expand(load_sweep(path))
    varying = varying_keys(trials)
    # one value (local.lr 0.05, SCAFFOLD's option 2) does not tell trials apart: left out
    assert varying == ["data.partition", "heterogeneity.rho", "seed", "algorithm.mu"]   # as the file orders them
    names = [run_name(t, varying) for t in trials]
    assert len(set(names)) == len(trials)
    assert "fedavg dir0.3 ρ0.1 s0" in names and "fedprox classes2 ρ0.9 μ1 s1" in names
    assert "scaffold classes2 ρ0.9 s1" in names
    assert max(map(len, names)) <= 30


def test_ray_messages_on_the_terminal_are_one_short_line():
    from fedsweep.sweep.progress import short_cause
    from fedsweep.sweep.cluster import raylet_line
    dead = ("The node with node id: aadb5b8617f5dc7be6c1d45171e4cd2f506604afe838b9d218913efc and address: "
            "127.0.0.3 and node name: 127.0.0.3 has been marked dead because the detector has missed too many "
            "heartbeats from it. This can happen when a \t(1) raylet crashes unexpectedly (OOM, etc.) \n\t(2) "
            "raylet has lagging heartbeats due to slow network or busy workload.")
    line = raylet_line(dead)
    assert "\n" not in line and len(line) <= 200 and line.startswith("The node with node id: aadb5b86 and")
    assert line.endswith("heartbeats from it.")
    unavailable = ("ray.exceptions.ActorUnavailableError: The actor ff219e1a6c0eee9b7d8c0e1f02000000 is "
                   "unavailable: The actor is temporarily unavailable: RpcError: RPC error: recvmsg:Connection "
                   "reset by peer rpc_code: 14. The task may or may not have been executed on the actor." * 3)
    assert short_cause(unavailable) == "its worker or its node stopped answering"
    assert short_cause("ValueError: boom") == "ValueError: boom"
    long = "RuntimeError: " + "x" * 500
    assert len(short_cause(long)) == 160 and short_cause(long).endswith("…")


def test_the_mlflow_ui_answers_which_config_wins_and_shows_the_report_and_a_live_run(finished_sweep, tmp_path):
    """What a user sees in a real browser (Debian's chromium driven by Playwright) at the addresses
    `fedsweep ui SWEEP` prints: the sweep's view is one row per selected config with the report's
    numbers (its score, seeds, verdict), the tuning view one row per tuning config; *Views* opens them
    from the plain runs page, which opens on runs (not MLflow 3's GenAI overview); the sweep's run
    holds the report (report.md and its plots, the report as its description); and a run that is still
    training shows its metrics. FEDSWEEP_SCREENSHOTS=DIR keeps the screenshots docs/sweeps.md uses."""
    import shutil
    import subprocess
    import sys
    import time

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no chromium: the README's set-up installs Debian's (apt-get install chromium)")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    from uiview import addresses, check_rows, report_numbers, shown_rows, ui_lines

    from fedsweep.runs.tracking import ui_url
    tmp, uri, path = finished_sweep
    client, runs = trial_runs(uri, "tiny")
    shots = os.environ.get("FEDSWEEP_SCREENSHOTS")
    import fedsweep
    expected = report_numbers(fedsweep.report(path, out=tmp_path / "report"))
    assert len(expected["selected"]) == 2 and len(expected["tuning"]) == 4
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    ui = subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "ui", path], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=tmp, env=env)
    live = None
    try:
        lines = ui_lines(ui)
        view, tuning, parent_page, every = addresses(lines)
        view_line = next(line for line in lines if view in line)   # "still starting" lines may come first
        assert "viewStateShareKey=fedsweep-tiny&" in view and "one row per selected config" in view_line, lines
        assert "viewStateShareKey=fedsweep-tiny-tuning" in tuning, lines
        port = int(view.split(":")[2].split("/")[0])
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium)
            page = None

            def open_page(url):   # a new tab: MLflow's app does not reload from a shared view to a plain address
                nonlocal page
                if page is not None:
                    page.close()
                page = browser.new_page(viewport={"width": 3200, "height": 900})   # every column drawn
                page.goto(url)

            def close_assistant():
                if page.get_by_role("button", name="Close").count():
                    page.get_by_role("button", name="Close").first.click()

            open_page(view)
            rows = shown_rows(page, expected["selected"])
            close_assistant()
            check_rows(rows, expected["selected"])
            open_page(tuning)
            check_rows(shown_rows(page, expected["tuning"]), expected["tuning"])

            open_page(every)    # every run: the parent expands into its children, each named and with its data
            parent = page.locator(".ag-row", has_text="tiny").first
            parent.wait_for(timeout=60_000)
            assert page.get_by_text("Run Name", exact=True).count() and not page.get_by_text("Token Usage").count()
            close_assistant()
            parent.locator("button").first.click()
            page.locator(".ag-row", has_text="fedavg").first.wait_for(timeout=30_000)
            shown = " | ".join(page.locator(".ag-row").all_inner_texts())
            assert all(r.info.run_name in shown for r in runs) and shown.count("digits classes2 N8") >= 8, shown
            child = next(r for r in runs if r.data.tags["fedsweep.status"] == "finished")
            open_page(ui_url(child.info.experiment_id, child.info.run_id, port=port).replace("?", "/artifacts?"))
            page.get_by_text("curves.png", exact=True).click(timeout=60_000)
            page.locator("img[alt$='curves.png']").wait_for(timeout=30_000)            # shown inline
            for artifact in ("config.yaml", "metrics.csv", "summary.json"):
                assert page.get_by_text(artifact, exact=True).count(), artifact

            open_page(every)                  # README: Views -> the sweep's view
            page.locator(".ag-row").first.wait_for(timeout=60_000)
            close_assistant()
            page.get_by_role("button", name="Views").click()
            page.get_by_text("fedsweep: tiny selected configs").click()
            check_rows(shown_rows(page, expected["selected"]), expected["selected"])

            open_page(parent_page.replace("?", "/artifacts?"))     # the sweep's run: its report
            page.get_by_text("report", exact=True).first.wait_for(timeout=60_000)
            close_assistant()
            page.get_by_text("report", exact=True).first.click(timeout=60_000)
            page.get_by_text("report.md", exact=True).wait_for(timeout=30_000)
            page.get_by_text("accuracy_curves.png", exact=True).click()
            page.locator("img[alt$='accuracy_curves.png']").wait_for(timeout=30_000)
            if shots:
                page.screenshot(path=os.path.join(shots, "mlflow_sweep_report.png"))
            open_page(parent_page)
            page.get_by_text("Sweep report: tiny").first.wait_for(timeout=30_000)   # its description

            # a run that trains while the browser looks at it (its MLflow run is made before round 1),
            # started only now: its training beside the pages before cost 13 CPU-s of 2 cores' time
            live = subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "run", path, "--set", "rounds=100000",
                                     "--set", "eval.every=1", "--set", "mlflow.experiment=live", "--quiet"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp, env=env,
                                    start_new_session=True)
            announced = ""
            while "watch it train" not in announced:   # "MLflow run ID: watch it train with:  fedsweep ui ..."
                announced = live.stdout.readline()
                assert announced or live.poll() is None
            run_id = announced.split()[2].rstrip(":")
            assert "watch it train with:  fedsweep ui" in announced and f"--run {run_id}" in announced, announced
            deadline = time.time() + 120
            while "test/accuracy" not in client.get_run(run_id).data.metrics:
                assert time.time() < deadline and live.poll() is None
                time.sleep(1)
            open_page(ui_url(client.get_run(run_id).info.experiment_id, run_id, port=port)
                      .replace("?", "/model-metrics?"))
            page.get_by_placeholder("Search metric charts").wait_for(timeout=60_000)
            close_assistant()
            page.get_by_placeholder("Search metric charts").fill("test/accuracy")
            page.get_by_text("accuracy", exact=True).first.wait_for(timeout=60_000)   # the chart's title
            page.locator("svg.main-svg .scatterlayer .trace").first.wait_for(state="attached", timeout=60_000)
            assert client.get_run(run_id).info.status == "RUNNING" and live.poll() is None   # still training
            if shots:
                page.screenshot(path=os.path.join(shots, "mlflow_live_run.png"))
            browser.close()
    finally:
        for proc in (live, ui):
            if proc is not None:
                interrupt(proc, 60)
    assert ui.returncode == 0 and live.returncode == 130    # both stopped by Ctrl-C, cleanly


SEARCH = {"space": {"local.lr": {"loguniform": [0.01, 1.0]}}, "num_samples": 3, "seed": 0}


def test_search_draws_the_same_configs_from_the_same_seed_and_a_budget_per_method(tmp_path):
    from fedsweep.sweep.search import samples
    methods = {"fedavg": {}, "fedprox": {"algorithm.mu": {"loguniform": [0.001, 1.0]}}}
    path = write_sweep(tmp_path / "s.yaml", "s", grid={}, methods=methods, search=SEARCH, seeds=[0, 1])
    sweep = load_sweep(path)
    trials = expand(sweep)
    assert len(trials) == 2 * 3 * 2                                     # methods × num_samples × seeds
    for method in ("fedavg", "fedprox"):
        configs = {t.config_id for t in trials if t.method == method}
        assert len(configs) == 3                                        # the same budget for each method
        lrs = [t.config.local.lr for t in trials if t.method == method]
        assert all(0.01 <= lr <= 1.0 for lr in lrs)
    assert all("algorithm.mu" in t.overrides for t in trials if t.method == "fedprox")
    assert not any("algorithm.mu" in t.overrides for t in trials if t.method == "fedavg")
    assert [t.overrides for t in expand(load_sweep(path))] == [t.overrides for t in trials]   # same file, same draws
    again = write_sweep(tmp_path / "t.yaml", "t", grid={}, methods={"fedavg": {}}, search=SEARCH, seeds=[0, 1])
    assert samples(load_sweep(again), "fedavg") == samples(sweep, "fedavg")   # a method added: others unchanged
    other = write_sweep(tmp_path / "u.yaml", "u", grid={}, methods=methods, search={**SEARCH, "seed": 1})
    assert samples(load_sweep(other), "fedavg") != samples(sweep, "fedavg")


@pytest.mark.parametrize("space,needle", [
    ({"local.lr": {"loguniform": [0.0, 1.0]}}, "search.space.local.lr: loguniform takes [low, high] with 0 < low < high"),
    ({"local.lr": {"normal": [0, 1]}}, "search.space.local.lr: a distribution is one of loguniform, uniform"),
    ({"local.steps": {"randint": [1, 2.5]}}, "search.space.local.steps: randint takes [low, high], integers"),
    ({"local.lr": {"quniform": [0.1, 1.0]}}, "search.space.local.lr: quniform takes [low, high, q]"),
])
def test_a_bad_distribution_is_one_line_naming_its_key(tmp_path, capsys, space, needle):
    path = write_sweep(tmp_path / "b.yaml", "b", grid={}, search={**SEARCH, "space": space})
    assert main(["tune", path, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_a_searched_sweep_runs_resumes_its_draws_and_reports_the_sampled_keys(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    methods = {"fedavg": {}, "fedprox": {"algorithm.mu": {"loguniform": [0.001, 1.0]}}}
    path = write_sweep(tmp_path / "s.yaml", "s", grid={}, methods=methods, search=SEARCH, pack="seeds")
    assert main(["tune", path, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "search: random, 3 configs per method (seed 0): local.lr ~ loguniform(0.01, 1.0); fedprox: " \
           "algorithm.mu ~ loguniform(0.001, 1.0)" in printed
    assert main(["tune", path]) == 0
    client, runs = trial_runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "s")
    assert len(runs) == 6 and len({r.info.run_name for r in runs}) == 6
    assert all(r.info.run_name.startswith(("fedavg ηl", "fedprox ηl")) for r in runs), [r.info.run_name for r in runs]
    # the same file resumes the same draws (a redraw would be refused as a changed sweep)
    assert main(["tune", path, "--resume"]) == 0
    assert main(["report", path]) == 0
    report = tmp_path / "reports" / "s"
    assert (report / "search.png").stat().st_size > 10_000
    assert "## Sampled configs" in (report / "report.md").read_text()
