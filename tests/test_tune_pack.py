"""`pack:` sweeps through a real Ray Tune run into a real MLflow store: every packed config is its
own MLflow run, with the numbers of its unpacked run; resume after `kill -9` stays exact."""
import os
import signal

import pytest

from fedsweep.cli import main
from fedsweep.runs.run import train
from fedsweep.sweep.spec import expand, load_sweep
from fedsweep.sweep.units import pack_units
from conftest import write_mnist
from test_tune import TINY, _statuses, _wait_for, ray_processes_of, start_sweep, trial_runs, write_sweep

pytestmark = pytest.mark.usefixtures("fresh_home")


def test_packed_sweep_logs_each_config_as_its_own_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("FEDSWEEP_TIMELINE", str(tmp_path))   # each worker's phases and checkpoints
    monkeypatch.setattr("fedsweep.sweep.tuners.REPORT_EVERY_S", 60.0)  # without a scheduler: no report before the last
    path = write_sweep(tmp_path / "p.yaml", "p", seeds=[0, 1], pack=4)
    sweep = load_sweep(path)
    trials = expand(sweep, source=path)
    units = pack_units(sweep, trials)
    assert sorted(map(len, units)) == [4, 4] and sorted(i for u in units for i in u) == list(range(8))
    assert main(["tune", path]) == 0
    err = capsys.readouterr().err
    assert "p: 8 trials in 2 packs" in err and "[sweep] 8 trials: 4 diverged, 4 finished" in err
    assert not ray_processes_of(os.getpgid(0))
    # A checkpoint goes with a report: no report before the last, so none before the pack's final one
    # (not one after each of its evaluations, even with `checkpoint_every: 1`).
    phases = [line.split()[1] for f in tmp_path.glob("*.txt") for line in f.read_text().splitlines()]
    assert phases.count("start") == 2 and phases.count("checkpoint") == 2
    assert all(phases[i + 1:i + 4] == ["artifacts", "checkpoint", "reported"]   # the report carries the artifacts
               for i, phase in enumerate(phases) if phase == "trained")

    client, runs = trial_runs(uri, "p")
    assert len(runs) == 8 and len({r.data.tags["fedsweep.pack"] for r in runs}) == 2
    from fedsweep.sweep.spec import run_name, varying_keys
    by_name = {r.info.run_name: r for r in runs}
    for t in trials:
        r = by_name[run_name(t, varying_keys(trials))]
        assert r.data.params["seed"] == str(t.seed) and r.data.tags["fedsweep.config_id"] == t.config_id
        assert r.data.params["engine"] == "auto" and r.data.params["engine_used"] == "vectorized"
        assert {"config.yaml", "metrics.csv", "curves.png", "summary.json"} <= \
            {a.path for a in client.list_artifacts(r.info.run_id)}
        losses = client.get_metric_history(r.info.run_id, "train/loss")
        if t.config.local.lr > 1:          # diverged at round 1, alone: its pack mates went on
            assert r.data.tags["fedsweep.status"] == "diverged" and r.info.status == "FAILED"
            assert [m.step for m in losses] == [1]
            continue
        assert r.data.tags["fedsweep.status"] == "finished" and r.info.status == "FINISHED"
        solo = train(t.config.model_copy(update={"mlflow": t.config.mlflow.model_copy(update={"enabled": False})}),
                     progress=False)
        assert [m.step for m in losses] == [1, 2, 3, 4]                      # every round, once
        assert [m.value for m in losses] == pytest.approx([h["train/loss"] for h in solo.history], abs=1e-5)
        acc = client.get_metric_history(r.info.run_id, "test/accuracy")
        assert [(m.step, m.value) for m in acc] == [(h["round"], pytest.approx(h["test/accuracy"], abs=1e-5))
                                                    for h in solo.history if "test/accuracy" in h]


def test_a_member_whose_data_cannot_be_made_fails_alone(tmp_path, monkeypatch, capsys):
    """More clients than the data has samples is found only when a member's data is made (a torchvision
    dataset's, here tiny MNIST files, is not made before Ray): that member ends failed with the error,
    at once, and its pack mates train as if it were not there; a pack whose members all fail ends at
    once too."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    write_mnist(tmp_path / "data", n_train=24)
    base = {**TINY["base"], "data": {**TINY["base"]["data"], "name": "mnist", "root": str(tmp_path / "data")}}
    path = write_sweep(tmp_path / "f.yaml", "f", methods={"fedavg": {}}, seeds=[0], pack=2, base=base,
                       grid={"data.num_clients": [8, 5000, 6000, 7000]})
    sweep = load_sweep(path)
    trials = expand(sweep, source=path)
    assert sorted(pack_units(sweep, trials)) == [[0, 2], [1, 3]]   # one pack mixed, one all failing
    assert main(["tune", path]) == 4
    printed = capsys.readouterr()
    assert "[sweep] 4 trials: 3 failed, 1 finished" in printed.err and "[retrying]" not in printed.err
    for n in (5000, 6000, 7000):
        assert f"[failed] fedavg data.num_clients={n} seed=0: data.num_clients: N={n} clients but only " in printed.err
    client, runs = trial_runs(uri, "f")
    by_n = {r.data.params["data.num_clients"]: r for r in runs}
    for n in ("5000", "6000", "7000"):
        r = by_n[n]
        assert r.info.status == "FAILED" and r.data.tags["fedsweep.status"] == "failed"
        assert r.data.tags["fedsweep.error"].startswith(f"data.num_clients: N={n} clients but only ")
        assert not client.get_metric_history(r.info.run_id, "train/loss")
    ok = by_n["8"]
    assert ok.data.tags["fedsweep.status"] == "finished" and "fedsweep.error" not in ok.data.tags
    solo = train(trials[0].config.model_copy(update={"mlflow": trials[0].config.mlflow.model_copy(
        update={"enabled": False})}), progress=False)
    losses = client.get_metric_history(ok.info.run_id, "train/loss")
    assert [m.value for m in losses] == pytest.approx([h["train/loss"] for h in solo.history], abs=1e-5)


@pytest.mark.slow
def test_packed_sweep_resumes_after_kill(tmp_path, monkeypatch):
    """`kill -9` of the driver mid-sweep; `--resume` finishes every packed config, each round logged
    exactly once, nothing duplicated. Each pack trains long enough (240 rounds, ~5 s) that the second
    is still training when the first one's runs read finished in MLflow (the driver writes them a
    moment after Tune has them): at 60 rounds both packs could end before the kill."""
    rounds = 240
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = write_sweep(tmp_path / "k.yaml", "k", methods={"fedavg": {}}, grid={"local.lr": [0.05, 0.1]},
                       seeds=[0, 1, 2], pack=3, max_concurrent=1, checkpoint_every=2,
                       base={**TINY["base"], "rounds": rounds, "eval": {"every": 3}})
    proc = start_sweep(path, tmp_path, uri)
    try:
        assert _wait_for(lambda: _statuses(uri, "k").count("finished") >= 3, 240), \
            (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    assert main(["tune", path, "--resume"]) == 0
    client, runs = trial_runs(uri, "k")
    assert len(runs) == 6 and all(r.data.tags["fedsweep.status"] == "finished" for r in runs)
    for r in runs:
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")]
        assert steps == list(range(1, rounds + 1)), f"each round logged exactly once: {steps}"


def test_pack_with_a_scheduler_is_refused(tmp_path, capsys):
    path = write_sweep(tmp_path / "s.yaml", "s", pack="seeds",
                       scheduler={"kind": "asha", "metric": "test/accuracy", "mode": "max"})
    assert main(["tune", path, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "pack: a scheduler stops trials one by one" in err and len(err.splitlines()) == 1
    path = write_sweep(tmp_path / "z.yaml", "z", pack=0)
    assert main(["tune", path, "--dry-run"]) == 2
    assert "pack: 0 is not allowed" in capsys.readouterr().err


def test_pack_seeds_packs_the_seeds_of_each_config(tmp_path, capsys):
    path = write_sweep(tmp_path / "d.yaml", "d", seeds=[0, 1, 2], pack="seeds")
    sweep = load_sweep(path)
    trials = expand(sweep, source=path)
    units = pack_units(sweep, trials)
    assert len(units) == 4 and all(len({trials[i].config_id for i in u}) == 1 for u in units)
    assert main(["tune", path, "--dry-run"]) == 0
    assert "d: 12 trials\nin 4 packs of up to 3 trials (pack: seeds)\n" in capsys.readouterr().out


def test_a_pack_whose_state_outgrows_the_memory_is_refused_by_dry_run_as_by_tune(tmp_path, capsys):
    """SCAFFOLD's c_i for up to 100,000 clients of a 568 kB model, two seeds in one process: what each
    trial would refuse once started is one line before Ray, from --dry-run and from tune alike; a small
    federation passes."""
    from fedsweep.runs.memory import available_bytes
    free = available_bytes("cpu")
    per_run = 100_000 * 142_010 * 4                    # clients × mlp(hidden 2000) on synthetic's 60 inputs × float32
    if free is None or not (free < 2 * per_run):
        pytest.skip("this machine has the memory for it")
    base = {"rounds": 100000, "clients_per_round": 10, "algorithm": {"name": "scaffold"}, "device": "cpu",
            "data": {"name": "synthetic", "num_clients": 100000, "options": {"mean_samples": 2}},
            "model": {"name": "mlp", "options": {"hidden": 2000}}}
    path = write_sweep(tmp_path / "m.yaml", "m", base=base, seeds=[0, 1], pack="seeds", grid={},
                       methods={"scaffold": {}})
    for argv in (["--dry-run"], []):
        capsys.readouterr()
        assert main(["tune", path, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "scaffold keeps 1 row(s) of 568 kB for each client" in err and \
            "(2 runs in this process)" in err and "pack fewer trials together (pack:)" in err and \
            "(a pack of 2 trials, scaffold seed=0 the first)" in err, err
    small = write_sweep(tmp_path / "s.yaml", "s", base={**base, "data": {**base["data"], "num_clients": 100}},
                        seeds=[0, 1], pack="seeds", grid={}, methods={"scaffold": {}})
    assert main(["tune", small, "--dry-run"]) == 0
