"""`search: {searcher: optuna}`: slots planned before Ray, Optuna's TPE through Ray Tune's OptunaSearch
filling them (one study per method and grid point, a config's seeds averaged), ASHA beside it, and
`--resume` continuing the search without a redraw."""
import os
import signal
import subprocess
import sys
import time

import pytest

from fedsweep.cli import main
from fedsweep.sweep.spec import expand, load_sweep
from test_tune import TINY, _statuses, _wait_for, start_sweep, trial_runs, write_sweep

pytestmark = pytest.mark.usefixtures("fresh_home")

OPTUNA = {"searcher": "optuna", "num_samples": 3, "random_first": 1, "space": {"local.lr": {"loguniform": [0.02, 0.5]}}}
METHODS = {"fedavg": {}, "fedprox": {"algorithm.mu": {"loguniform": [0.01, 1.0]}}}


def test_optuna_plans_slots_per_study_and_checks_every_end_of_a_distribution(tmp_path, capsys):
    path = write_sweep(tmp_path / "o.yaml", "o", grid={"heterogeneity.rho": [0.1, 0.9]}, methods=METHODS,
                       search=OPTUNA, seeds=[0, 1])
    trials = expand(load_sweep(path))
    assert len(trials) == 2 * 2 * 3 * 2                          # methods × grid points × num_samples × seeds
    studies = {t.study for t in trials}
    assert studies == {"fedavg heterogeneity.rho=0.1", "fedavg heterogeneity.rho=0.9",
                       "fedprox heterogeneity.rho=0.1", "fedprox heterogeneity.rho=0.9"}
    for study in studies:                                        # the same budget for each: 3 configs × 2 seeds
        assert sorted((t.sample, t.seed) for t in trials if t.study == study) == [(s, d) for s in range(3) for d in (0, 1)]
    assert {t.sampled for t in trials} == {("local.lr",), ("algorithm.mu", "local.lr")}
    assert main(["tune", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "search: optuna (max best/test_accuracy, 1 random first), 3 configs per method and grid point" in out
    assert "~: drawn by optuna when the config's first trial starts" in out
    # a value at the far end of a distribution that no config takes: refused before anything runs
    bad = write_sweep(tmp_path / "b.yaml", "b", grid={}, methods={"fedavg": {}},
                      search={**OPTUNA, "space": {"heterogeneity.rho": {"uniform": [0.1, 1.5]}}})
    assert main(["tune", bad, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "heterogeneity.rho" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("over,needle", [
    ({"pack": "seeds"}, "pack: optuna draws each config when its trial starts"),
    ({"search": {**OPTUNA, "metric": "train/loss"}}, "search.metric: 'train/loss' is not a metric trials report"),
    ({"search": {**OPTUNA, "searcher": "random"}}, "search.random_first: only `searcher: optuna` learns"),
])
def test_what_optuna_cannot_do_is_one_line(tmp_path, capsys, over, needle):
    path = write_sweep(tmp_path / "b.yaml", "b", grid={}, **{"search": OPTUNA, **over})
    assert main(["tune", path, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_without_optuna_installed_the_error_names_the_install_command(tmp_path):
    path = write_sweep(tmp_path / "o.yaml", "o", grid={}, search=OPTUNA)
    broken = tmp_path / "site"
    broken.mkdir()                   # an `optuna` that cannot be imported, first on the path
    (broken / "optuna.py").write_text("raise ImportError(\"No module named 'optuna'\")\n")
    out = subprocess.run([sys.executable, "-m", "fedsweep.cli", "tune", path, "--dry-run"], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(broken)}, timeout=120)
    assert out.returncode == 2
    assert "optuna needs the optuna package, not installed here: pip install 'fedsweep[optuna]'" in out.stderr


def _studies(num_samples=3, seeds=2, startup=1, studies=("a", "b")):
    from fedsweep.sweep.searcher import Studies
    slots = [(i, s, n) for i, (s, n, _) in enumerate((s, n, d) for s in studies for n in range(num_samples)
                                                        for d in range(seeds))]
    space = {"local.lr": ("loguniform", [0.001, 1.0]), "local.steps": ("choice", [[1], [2, 3], {"x": 4}])}
    return Studies(slots, {s: space for s in studies}, "m", "max", 0, startup)


def test_studies_hand_out_slots_round_robin_with_a_configs_values_on_each_seed():
    searcher = _studies()
    handed = [searcher.suggest(f"t{i}") for i in range(12)]
    assert searcher.suggest("t12") == "FINISHED"
    # slots round-robin over studies: a's first config (both seeds), b's first, a's second, ...
    assert [h["trial"] for h in handed] == [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]
    for first, second in zip(handed[::2], handed[1::2]):
        assert first["sampled"] == second["sampled"]            # a config's seeds share its values
    assert len({h["sampled"]["local.lr"] for h in handed}) == 6
    assert all(h["sampled"]["local.steps"] in ([1], [2, 3], {"x": 4}) for h in handed)   # any choice value


def test_a_study_learns_the_mean_over_seeds_and_resumes_where_it_stopped(tmp_path):
    """The objective peaks at lr = 0.05; one seed's value is 0.1 lower, so only their mean ranks configs
    right. After a save and a restore the searcher hands out the very configs an uninterrupted one does."""
    import math

    def objective(lr, seed):
        return -abs(math.log(lr / 0.05)) - 0.1 * seed

    def run(searcher, start, stop, save_at=None):
        for i in range(start, stop):
            h = searcher.suggest(f"t{i}")
            if h == "FINISHED":
                return
            yield h
            searcher.on_trial_complete(f"t{i}", {"m": objective(h["sampled"]["local.lr"], h["trial"] % 2)})

    whole = _studies(num_samples=16, studies=("a",), startup=4)
    drawn = [h["sampled"]["local.lr"] for h in run(whole, 0, 40)]
    far = [abs(math.log(lr / 0.05)) for lr in drawn[::2]]
    assert sum(far[-6:]) / 6 < sum(far[:4]) / 4 / 2        # TPE's draws close in on the best lr
    told = whole.studies["a"]._ot_study.trials
    assert len(told) == 16 and told[0].value == pytest.approx(objective(drawn[0], 0) / 2 + objective(drawn[0], 1) / 2)

    first = _studies(num_samples=16, studies=("a",), startup=4)
    before = []
    for i in range(11):                                          # the 11th trial is still running at the save
        before.append(first.suggest(f"t{i}")["sampled"]["local.lr"])
        if i < 10:
            first.on_trial_complete(f"t{i}", {"m": objective(before[-1], i % 2)})
    first.save(str(tmp_path / "state.pkl"))
    restored = _studies(num_samples=16, studies=("a",), startup=4)
    restored.restore(str(tmp_path / "state.pkl"))
    restored.on_trial_complete("t10", {"m": objective(before[-1], 0)})   # and ends after the restore
    after = [h["sampled"]["local.lr"] for h in run(restored, 11, 40)]
    assert before + after == drawn


@pytest.mark.slow
def test_an_optuna_sweep_with_asha_is_interrupted_resumed_without_a_redraw_and_reported(tmp_path, monkeypatch,
                                                                                        capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = write_sweep(tmp_path / "o.yaml", "o", grid={}, methods={"fedavg": {}}, search=OPTUNA, seeds=[0, 1],
                       max_concurrent=2, scheduler={"grace_period": 600, "metric": "test/accuracy"},
                       base={**TINY["base"], "rounds": 3000, "eval": {"every": 300}})
    proc = start_sweep(path, tmp_path, uri)
    try:
        assert _wait_for(lambda: _statuses(uri, "o").count("running") == 2, 240), \
            (tmp_path / "driver.log").read_text()[-3000:]
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, (tmp_path / "driver.log").read_text()[-3000:]
    _, runs = trial_runs(uri, "o")
    drawn_before = {r.data.params["local.lr"] for r in runs}
    assert len(drawn_before) == 1                                # the first config's two seeds, one draw

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    assert main(["tune", path, "--resume"]) == 0
    _, runs = trial_runs(uri, "o")
    by_lr: dict[str, list] = {}
    for r in runs:
        by_lr.setdefault(r.data.params["local.lr"], []).append(r.data.params["seed"])
    assert len(runs) == 6 and len(by_lr) == 3                    # 3 configs, each on both seeds
    assert all(sorted(seeds) == ["0", "1"] for seeds in by_lr.values()), by_lr
    assert drawn_before <= set(by_lr)                           # not redrawn on --resume
    assert {r.data.tags["fedsweep.status"] for r in runs} <= {"finished", "stopped"}
    assert all(r.info.run_name.startswith("fedavg ηl") for r in runs), [r.info.run_name for r in runs]
    assert main(["report", path]) == 0
    report = tmp_path / "reports" / "o"
    assert (report / "search.png").stat().st_size > 10_000
    assert (report / "search_draws.png").stat().st_size > 10_000          # the study's configs in draw order
    assert "![optuna's draws in order](search_draws.png)" in (report / "report.md").read_text()
