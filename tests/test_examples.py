"""The examples (examples/): each copied to a folder outside the repository and swept there with the
installed `fedsweep` command, `tune` then `report`, as a user who never edits fedsweep would: its own
algorithm, model or dataset named in `plugins:`, every run in MLflow with its plugin's source."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FEDSWEEP = shutil.which("fedsweep", path=os.path.dirname(sys.executable)) or "fedsweep"
# the example -> (the sweep's trials, a method of its own in the report, a plugin module)
SWEEPS = {"fedexp": (12, "fedexp", "fedexp"), "model": (8, "fedprox", "models"),
          "dataset": (12, "scaffold", "datasets"), "mylab": (12, "fedavg_decay", "mylab"),
          "personal": (12, "lgfedavg", "lgfedavg")}


def _fedsweep(folder: Path, home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run([FEDSWEEP, *args], cwd=folder, env={**env, "HOME": str(home), "FEDSWEEP_NO_REPORT": "1"},
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", list(SWEEPS))
def test_an_example_sweeps_and_reports_from_a_folder_outside_the_repository(name, tmp_path, fresh_home):
    folder = tmp_path / name
    shutil.copytree(EXAMPLES / name, folder)
    trials, method, module = SWEEPS[name]
    tune = _fedsweep(folder, fresh_home, "tune", "sweep.yaml")
    assert tune.returncode == 0, (tune.stdout + tune.stderr)[-3000:]
    assert f"sweep done: {trials} finished" in tune.stdout, tune.stdout[-2000:]
    report = _fedsweep(folder, fresh_home, "report", "sweep.yaml")
    assert report.returncode == 0, report.stderr[-2000:]
    from fedsweep.sweep.spec import load_sweep
    text = (folder / "reports" / load_sweep(folder / "sweep.yaml").name / "report.md").read_text()
    assert f"| {method} |" in text
    from mlflow import MlflowClient
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(load_sweep(folder / "sweep.yaml").name)
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`fedsweep.role` = 'trial'")
    assert len(runs) == trials and {r.info.status for r in runs} == {"FINISHED"}
    source = folder / f"{module}.py"
    for run in runs:                                     # each run names its plugin, and keeps its source
        assert run.data.tags["fedsweep.plugins"] == module
        assert run.data.tags[f"fedsweep.plugin.{module}.file"] == str(source)
    (local,) = [client.download_artifacts(runs[0].info.run_id, f"plugins/{module}.py", str(tmp_path / "got"))]
    assert Path(local).read_text() == source.read_text()
    if name == "personal":   # every run scored per client; the personalized ones' personal models too
        assert "## Per-client accuracy" in text and "| fine-tuned: mean / worst 10% / min |" in text
        assert "personal: mean / worst 10% / min" in text and "![each client's test accuracy](client_accuracy.png)" in text
        assert (folder / "reports" / "personal_example" / "client_accuracy.png").stat().st_size > 10_000
        for run in runs:
            metrics = run.data.metrics
            assert 0 <= metrics["summary/final_clients_accuracy_p10"] <= metrics["summary/final_finetuned_accuracy_mean"]
            personal = run.data.tags["fedsweep.method"] in ("fedper", "lgfedavg")
            assert ("summary/final_personal_accuracy_p10" in metrics) == personal
            assert any(a.path == "client_eval.csv" for a in client.list_artifacts(run.info.run_id))


def test_the_batchnorm_model_trains_on_the_loop_engine_and_says_why(tmp_path, fresh_home):
    folder = tmp_path / "model"
    shutil.copytree(EXAMPLES / "model", folder)
    ran = _fedsweep(folder, fresh_home, "run", "batchnorm.yaml", "--no-mlflow", "--set", "rounds=2")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "loop engine (auto: torch.func.vmap cannot run this model: RuntimeError: " in ran.stderr.splitlines()[0]


def test_the_examples_algorithms_pass_fedsweep_check(tmp_path, fresh_home):
    for name, algorithm, plugin in (("fedexp", "fedexp", "fedexp.py"), ("mylab", "fedavg_decay", "sweep.yaml"),
                                    ("personal", "lgfedavg", "lgfedavg.py")):
        folder = tmp_path / name
        shutil.copytree(EXAMPLES / name, folder)
        checked = _fedsweep(folder, fresh_home, "check", algorithm, "--plugins", plugin)
        assert checked.returncode == 0 and f"{algorithm}: all " in checked.stdout, checked.stdout + checked.stderr


def test_the_python_api_example_runs_from_a_folder_outside_the_repository(tmp_path, fresh_home):
    """examples/api.py, with the plugin folder it names beside it, as a script from its own folder."""
    shutil.copy(EXAMPLES / "api.py", tmp_path / "api.py")
    shutil.copytree(EXAMPLES / "mylab", tmp_path / "mylab")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    ran = subprocess.run([sys.executable, "api.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={**env, "HOME": str(fresh_home), "FEDSWEEP_NO_REPORT": "1"})
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:]
    assert "fedavg_decay" in ran.stdout and "ReportResult(path='reports/api_mylab/report.md', trials=12" in ran.stdout
    assert (tmp_path / "reports" / "api_mylab" / "comparisons.csv").is_file()
