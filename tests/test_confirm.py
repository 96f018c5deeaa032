"""The confirm stage (`confirm: {seeds: [...]}`): each method's selected config per setting is run again
on fresh seeds once the tuning trials have ended; the report scores methods on those runs only;
`--dry-run` counts them and `--resume` continues across the stage. A real Ray Tune run and MLflow store."""
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fedsweep.cli import main
from fedsweep.config.schema import ConfigError
from fedsweep.sweep.spec import expand, load_sweep

pytestmark = pytest.mark.usefixtures("fresh_home")   # Ray keeps a token in ~/.ray: none is shared

SWEEP = {
    "base": {"rounds": 20, "clients_per_round": 4, "device": "cpu",
             "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "classes"}},
             "model": {"name": "mlp", "options": {"hidden": 16}}, "eval": {"every": 5, "target_accuracy": 0.5}},
    "grid": {"local.lr": [0.02, 0.2], "heterogeneity.rho": [0.0, 0.5]},
    "methods": {"fedavg": {}, "fedprox": {"algorithm.mu": [0.01]}},
    "seeds": [0, 1],
    "confirm": {"seeds": [10, 11]},
    "report": {"settings": ["heterogeneity.rho"]},
    "max_concurrent": 1,   # one trial worker, not two (test_tune.TINY says why)
}


def write(tmp_path, name="conf", **over):
    base = {**SWEEP["base"], "heterogeneity": {"kind": "stragglers"}, "local": {"steps": 3}}
    spec = {**SWEEP, "base": base, "name": name, **over}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def runs(uri, name):
    from fedsweep.runs.tracking import open_store
    client = open_store(uri)
    exp = client.get_experiment_by_name(name)
    return client, client.search_runs([exp.experiment_id], filter_string="tags.`fedsweep.role` = 'trial'")


def test_confirm_seeds_must_be_fresh_and_the_dry_run_counts_the_stage(tmp_path, capsys):
    path = write(tmp_path, confirm={"seeds": [1, 10]})
    with pytest.raises(ConfigError, match=r"confirm.seeds: 1 also tune the configs \(seeds:\); a confirm run must "
                                          r"not share the seed its config was picked on"):
        load_sweep(path)
    with pytest.raises(ConfigError, match="confirm.seeds: a seed is given twice"):
        load_sweep(write(tmp_path, confirm={"seeds": [10, 10]}))
    assert main(["tune", write(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    # 2 methods x 2 values of the setting rho; each best config on seeds 10 and 11
    assert "then a confirm stage: 8 trials, the selected config of each of 4 (method, setting) pairs on each of " \
           "seeds 10, 11" in out
    # 2 seeds: no p below 2 / 2^2 = 0.5; Holm over fedprox vs fedavg at 2 settings on 2 metrics starts at 0.05/4
    assert "note: with 2 confirm seeds no comparison can be called better, worse or equivalent: the exact tests' " \
           "smallest p with 2 paired seeds is 0.5, not below Holm's first level over the report's 4 comparisons, " \
           "0.05/4 = 0.0125; 8 seeds are the fewest that can call one (`confirm.seeds`, `confirm.max_seeds`)" in out
    assert main(["tune", write(tmp_path, confirm={"seeds": list(range(10, 18))}), "--dry-run"]) == 0
    # enough seeds; but rounds are seen every 5 and the default margin of 2 rounds holds only [0, 0]
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert notes == ["note: report.margin.rounds 2 is at most half of eval.every 5: rounds to target are seen every 5 "
                     "rounds, so a difference's interval moves in steps of 2.5 and lies inside ±2 only as [0, 0]; "
                     "`equivalent` on rounds is then called only where every paired seed reached the target at the "
                     "same evaluation (a margin above 2.5, or eval.every below 4, lets it be called)"]
    wide = write(tmp_path, confirm={"seeds": list(range(10, 18))}, report={**SWEEP["report"], "margin": {"rounds": 3}})
    assert main(["tune", wide, "--dry-run"]) == 0
    assert "note:" not in capsys.readouterr().out
    # what the confirm stage would refuse, refused before any trial runs; a boolean is not a seed
    assert main(["tune", write(tmp_path, confirm={"seeds": [-3]}), "--dry-run"]) == 2
    assert "confirm.seeds: seed -3: Input should be greater than or equal to 0" in capsys.readouterr().err
    assert main(["tune", write(tmp_path, confirm={"seeds": [True]}), "--dry-run"]) == 2
    assert "confirm.seeds.0: Input should be a valid integer (got True)" in capsys.readouterr().err
    assert main(["tune", write(tmp_path, seeds=[False], confirm={"seeds": [10]}), "--dry-run"]) == 2
    assert "seeds.0: Input should be a valid integer (got False)" in capsys.readouterr().err


def test_confirm_trials_are_packed_as_the_tuning_ones_into_enough_packs_for_every_slot(tmp_path):
    from fedsweep.sweep.confirm import confirm_units
    planned = [{"index": 100 + i, "config_id": f"c{i // 5}",
                "run": {"seed": 10 + i % 5, "algorithm": {"name": "fedavg" if i < 15 else "fedprox"},
                        "local": {"lr": 0.1}}} for i in range(30)]
    units = lambda **over: confirm_units(load_sweep(write(tmp_path, **over)), planned, slots=2)   # noqa: E731
    assert units() == [[p["index"]] for p in planned]                        # no pack: one trial each
    by_seeds = units(pack="seeds")
    assert sorted(map(sorted, by_seeds)) == [list(range(100 + 5 * c, 105 + 5 * c)) for c in range(6)]
    big = units(pack=36)                                   # not one pack of 30: each of 2 slots gets work
    assert sorted(i for u in big for i in u) == list(range(100, 130)) and len(big) >= 2
    assert all(len(u) <= 15 for u in big)
    assert len(units(pack=4)) >= 30 // 4


@pytest.mark.slow   # the protocol end to end, confirm stage included, is tests/test_selection.py's A/A sweep
def test_the_selected_configs_are_confirmed_on_fresh_seeds_and_scored_on_them(tmp_path, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path)
    assert main(["tune", path]) == 0
    err = capsys.readouterr().err
    assert "conf: 16 trials, then 8 confirm trials" in err and "[sweep] confirm stage: 8 trials" in err
    client, children = runs(uri, "conf")
    tuning = [r for r in children if r.data.tags.get("fedsweep.stage", "tune") == "tune"]
    confirm = [r for r in children if r.data.tags.get("fedsweep.stage") == "confirm"]
    assert len(tuning) == 16 and len(confirm) == 8
    assert sorted({r.data.params["seed"] for r in confirm}) == ["10", "11"]
    assert sorted(int(r.data.tags["fedsweep.trial"]) for r in confirm) == list(range(16, 24))
    assert all(r.data.tags["fedsweep.status"] == "finished" and r.info.run_name.endswith(" confirm") for r in confirm)

    from fedsweep.reports.trials import selected_configs
    chosen = selected_configs(uri, "conf", "conf", ["heterogeneity.rho"], "fedavg")
    assert len(chosen) == 4                                   # each method under each rho
    picked = set(chosen["config_id"])
    assert {r.data.tags["fedsweep.config_id"] for r in confirm} == picked   # exactly the selected configs
    for cid in picked:
        assert sorted(r.data.params["seed"] for r in confirm if r.data.tags["fedsweep.config_id"] == cid) == ["10", "11"]

    assert main(["report", path]) == 0
    text = (tmp_path / "reports" / "conf" / "report.md").read_text()
    assert "every number of a best config comes from its confirm runs (fresh seeds)" in text
    table = text.split("## Best config per method")[1].split("\n\n")[1]
    assert all(line.split(" | ")[3] == "2" for line in table.splitlines()[2:])   # 2 seeds each: the confirm ones


def write_sequential(tmp_path, name: str, rounds: int, every: int, **over) -> Path:
    """A sweep whose confirm stage adds seeds until answered (8, then 4 more up to 12): FedProx pinned
    to the server's model (it diverges: `worse` at once), FedCM with α = 1 (FedAvg's very updates, never
    `equivalent` with margin 0: open to the end) and FedAvg, their reference."""
    spec = {"name": name,
            "base": {"rounds": rounds, "clients_per_round": 4, "device": "cpu",
                     "model": {"name": "mlp", "options": {"hidden": 16}},
                     "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "iid"},
                              "validation_fraction": 0.1},
                     "local": {"steps": 2, "batch_size": 10, "lr": 0.1}, "eval": {"every": every}},
            "methods": {"fedavg": {}, "fedcm": {"algorithm.alpha": [1.0]}, "fedprox": {"algorithm.mu": [1000.0]}},
            "seeds": [0], "confirm": {"seeds": list(range(10, 18)), "max_seeds": 12, "step": 4},
            "report": {"settings": [], "margin": {"accuracy": 0, "rounds": 0}}, **over}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_seeds_are_added_until_answered_clear_differences_stop_early(tmp_path, monkeypatch, capsys):
    """`confirm: {seeds: 8, max_seeds: 12, step: 4}`: FedProx pinned to the server's model (it
    diverges) is `worse` at the first look and runs no more seeds; FedCM with α = 1 (FedAvg's very
    updates, never `equivalent` with margin 0) stays inconclusive, and it and FedAvg, its reference,
    get the next four seeds: the budget goes to the question still open."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    path = write_sequential(tmp_path, "seq", rounds=12, every=3, pack="seeds")
    assert main(["tune", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "and where a comparison is not answered, 4 seeds more at a time for its two configs, at most 1 times " \
           "(seeds 18, 19, 20, 21): at most 36 confirm trials; looks after 8, 12 seeds, each at its share of " \
           "α = 0.05 (0.0333, 0.0167)" in out
    assert main(["tune", str(path)]) == 0
    err = capsys.readouterr().err
    assert "then 24 confirm trials (up to 36 as seeds are added until answered)" in err
    assert "[sweep] confirm look 2 of 2: 1 comparison not answered after 8 seeds; 8 trials, 2 configs on seeds " \
           "18, 19, 20, 21" in err
    client, children = runs(uri, "seq")
    seeds = {}
    for r in children:
        if r.data.tags.get("fedsweep.stage") == "confirm":
            seeds.setdefault(r.data.params["algorithm.name"], []).append(int(r.data.params["seed"]))
    assert {m: sorted(v) for m, v in seeds.items()} == {"fedprox": list(range(10, 18)), "fedavg": list(range(10, 22)),
                                                        "fedcm": list(range(10, 22))}
    later = [r for r in children if r.data.tags.get("fedsweep.stage") == "confirm" and int(r.data.params["seed"]) >= 18]
    assert {r.info.run_name for r in later} >= {"fedcm s18 confirm", "fedavg s21 confirm"}   # named as the first look's
    assert {r.data.tags["fedsweep.config"] for r in later} == {"fedcm confirm", "fedavg confirm"}
    assert main(["report", str(path)]) == 0
    rows = {r["method"]: r for r in csv.DictReader(open(tmp_path / "reports" / "seq" / "comparisons.csv"))}
    assert (rows["fedprox"]["verdict"], rows["fedprox"]["seeds_used"], rows["fedprox"]["stop_reason"]) == \
        ("worse", "8", "answered")
    assert (rows["fedcm"]["verdict"], rows["fedcm"]["seeds_used"], rows["fedcm"]["stop_reason"]) == \
        ("inconclusive", "12", "max_seeds reached")
    text = (tmp_path / "reports" / "seq" / "report.md").read_text()
    assert "| fedprox | 8 (answered) |" in text and "| fedcm | 12 (max_seeds reached) |" in text


@pytest.mark.slow   # 80 s; the looks themselves: test_seeds_are_added_until_answered_clear_differences_stop_early
def test_resume_continues_a_later_look_of_the_confirm_stage(tmp_path):
    """Ctrl-C while the confirm stage's second look runs: `--resume` continues that look (its own Tune
    experiment, confirm-2), and the sweep ends as it would have: FedProx on the first look's 8 seeds,
    FedAvg and FedCM on 12, every round of every run once."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = write_sequential(tmp_path, "seqr", rounds=300, every=50, max_concurrent=1)
    with open(tmp_path / "driver.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "tune", str(path)], cwd=tmp_path, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    try:
        end = time.time() + 300
        while "[sweep] confirm look 2 of 2" not in (tmp_path / "driver.log").read_text() and time.time() < end \
                and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(2)                       # a look-2 trial under way
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = (tmp_path / "driver.log").read_text()
    assert proc.returncode == 1 and "--resume" in text, text[-3000:]
    cwd = os.getcwd()
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        os.chdir(tmp_path)
        assert main(["tune", str(path), "--resume"]) == 0
    finally:
        os.chdir(cwd)
        del os.environ["MLFLOW_TRACKING_URI"]
    client, children = runs(uri, "seqr")
    seeds = {}
    for r in children:
        if r.data.tags.get("fedsweep.stage") == "confirm":
            seeds.setdefault(r.data.params["algorithm.name"], []).append(int(r.data.params["seed"]))
            assert r.data.tags["fedsweep.status"] in ("finished", "diverged")
            if r.data.tags["fedsweep.status"] == "finished":
                steps = [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")]
                assert steps == list(range(1, 301))
    assert {m: sorted(v) for m, v in seeds.items()} == {"fedprox": list(range(10, 18)), "fedavg": list(range(10, 22)),
                                                        "fedcm": list(range(10, 22))}


@pytest.mark.parametrize("stage", [pytest.param("tuning", marks=pytest.mark.slow), "confirm",
                                   pytest.param("confirm unsaved", marks=pytest.mark.slow)])
def test_resume_continues_across_the_stages(tmp_path, stage):
    """Ctrl-C in the tuning stage: `--resume` finishes it, then plans and runs the confirm stage;
    Ctrl-C in the confirm stage: `--resume` continues that stage; and so when Ray Tune's record of the
    confirm look holds no trial yet (Ctrl-C before its first snapshot with trials, which Tune cannot
    restore: the look starts anew, continuing the runs it had begun). Every round of every run once."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = write(tmp_path, base={**SWEEP["base"], "rounds": 400, "eval": {"every": 50, "target_accuracy": 0.5}},
                 grid={"local.lr": [0.05, 0.1]}, methods={"fedavg": {}}, report={"settings": []},
                 max_concurrent=1)
    with open(tmp_path / "driver.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "tune", path], cwd=tmp_path, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    try:
        def reached():
            text = (tmp_path / "driver.log").read_text()
            return "[sweep] confirm stage" in text if stage.startswith("confirm") else "[finished]" in text
        end = time.time() + 240
        while not reached() and time.time() < end and proc.poll() is None:
            time.sleep(0.2)
        # "confirm unsaved": kill -9 as the look starts (a Ctrl-C may come after its 2 short trials ended)
        os.killpg(proc.pid, signal.SIGKILL if stage == "confirm unsaved" else signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = (tmp_path / "driver.log").read_text()
    if stage == "confirm unsaved":   # Tune's snapshots of the look as they are before it adds a trial
        assert proc.returncode == -signal.SIGKILL and "[sweep] confirm stage" in text, text[-3000:]
        for state in (tmp_path / "fedsweep_runs" / "conf" / "confirm").glob("experiment_state-*.json"):
            state.write_text(json.dumps({**json.loads(state.read_text()), "trial_data": []}))
    else:
        assert proc.returncode == 1 and "--resume" in text, text[-3000:]
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        cwd = os.getcwd()
        os.chdir(tmp_path)
        assert main(["tune", path, "--resume"]) == 0
    finally:
        os.chdir(cwd)
        del os.environ["MLFLOW_TRACKING_URI"]
    client, children = runs(uri, "conf")
    confirm = [r for r in children if r.data.tags.get("fedsweep.stage") == "confirm"]
    assert len(children) == 6 and len(confirm) == 2
    assert all(r.data.tags["fedsweep.status"] == "finished" for r in children)
    for r in children:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")] == list(range(1, 401))
