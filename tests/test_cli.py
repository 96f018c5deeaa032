"""`fedsweep run` end to end: JSON summary, a real MLflow store, and clean one-line user errors."""
import json
import os
import signal
import subprocess
import sys

import pytest
import torch
import yaml

from fedsweep.algorithms import available
from fedsweep.cli import main
from conftest import tiny_raw


def write(tmp_path, raw):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_ctrl_c_ends_a_run_after_its_round_saved_summarised_and_logged(tmp_path):
    """`fedsweep run` in a terminal, Ctrl-C once it trains: exit 130, one line saying where it stopped and
    how to continue, the summary (status interrupted), the checkpoint and a KILLED MLflow run."""
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = write(tmp_path, tiny_raw(rounds=100_000, eval={"every": 50}, mlflow={"enabled": True, "tracking_uri": uri}))
    proc = subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "run", cfg, "--checkpoint-dir", "ck",
                             "--output-json", "s.json"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in proc.stderr:           # wait until it trains: the first evaluation's line
            if line.startswith("round "):
                break
        os.killpg(proc.pid, signal.SIGINT)   # a terminal sends Ctrl-C to the whole foreground group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert (tmp_path / "s.json").exists(), f"rc {proc.returncode}, no summary; stderr:\n{err[-3000:]}"
    summary = json.loads((tmp_path / "s.json").read_text())
    assert proc.returncode == 130 and summary["status"] == "interrupted", err
    n = summary["rounds"]
    assert "SIGINT: stopping after the round in progress" in err and "Traceback" not in err
    assert f"fedsweep: interrupted after round {n} of 100000; continue with --resume ck/last.ckpt" in err
    assert "status                             interrupted" in out
    assert torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)["fedsweep"]["rounds_done"] == n
    (run,) = MlflowClient(tracking_uri=uri).search_runs([MlflowClient(tracking_uri=uri)
                                                         .get_experiment_by_name("fedsweep").experiment_id])
    assert run.info.status == "KILLED" and run.data.tags["fedsweep.status"] == "interrupted"
    assert run.data.metrics["summary/rounds"] == n


def test_run_writes_json_and_mlflow(tmp_path, tmp_mlflow, capsys):
    raw = tiny_raw(rounds=3, mlflow={"experiment": "cli-test"}, eval={"every": 1, "target_accuracy": 0.01})
    out = tmp_path / "summary.json"
    assert main(["run", write(tmp_path, raw), "--set", "algorithm.name=fedlga", "--output-json", str(out)]) == 0
    summary = json.loads(out.read_text())
    for key in ("best_test_accuracy", "final_test_accuracy", "rounds_to_target", "rounds",
                "seconds_per_round", "comm_up_models", "comm_down_models"):
        assert key in summary
    assert summary["rounds"] == 3 and summary["rounds_to_target"] == 1
    printed = capsys.readouterr()
    assert "best test accuracy" in printed.out and "open it with:  fedsweep ui --backend-store-uri" in printed.out
    assert "watch it train with:  fedsweep ui --backend-store-uri" in printed.out.splitlines()[0]   # before round 1
    assert "round    3/3" in printed.err
    assert "vectorized engine (auto) on cpu" in printed.err              # engine: auto, an MLP

    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=tmp_mlflow)
    exp = client.get_experiment_by_name("cli-test")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.params["algorithm.name"] == "fedlga" and run.data.params["local.lr"] == "0.1"
    assert run.data.params["engine"] == "auto" and run.data.params["engine_used"] == "vectorized"
    assert run.data.tags["fedsweep.status"] == "finished"
    history = client.get_metric_history(run.info.run_id, "test/accuracy")
    assert [m.step for m in history] == [1, 2, 3]
    assert run.data.metrics["best/test_accuracy"] == pytest.approx(summary["best_test_accuracy"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "metrics.csv", "curves.png", "model.pt", "summary.json"} <= artifacts
    # the MLflow UI opens the experiment on its runs (not MLflow 3's GenAI overview) and names the data
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    (data,) = run.inputs.dataset_inputs
    assert data.dataset.name == "digits classes2 N8" and json.loads(data.dataset.profile)["clients"] == 8
    assert {t.key: t.value for t in data.tags} == {"mlflow.data.context": "training"}


def test_an_experiment_made_before_is_tagged_for_the_runs_view_on_its_next_use(tmp_path, tmp_mlflow):
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=tmp_mlflow)
    exp_id = client.create_experiment("older", artifact_location=(tmp_path / "art").as_uri())   # an older fedsweep's
    assert "mlflow.experimentKind" not in client.get_experiment(exp_id).tags
    raw = tiny_raw(rounds=1, mlflow={"experiment": "older"})
    assert main(["run", write(tmp_path, raw), "--quiet"]) == 0
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"


@pytest.mark.parametrize("override,needle", [
    ("data.colour=red", "data.colour: unknown key; allowed here: name, options, root"),
    ("algorithm.name=fedfoo", "algorithm.name: unknown algorithm 'fedfoo'; allowed: " + ", ".join(available())),
    ("data.name=imagenet", "data.name: unknown dataset 'imagenet'; allowed: cifar10, cifar100, digits"),
    ("data.partition.kind=zipf", "data.partition.kind: 'zipf' is not allowed"),
    ("heterogeneity.rho=1.5", "heterogeneity.rho: Input should be less than or equal to 1"),
    ("clients_per_round=20", "clients_per_round: K=20 is larger than data.num_clients N=8"),
    ("local.lr=fast", "local.lr: Input should be a valid number"),
    ("algorithm.mu=0.1", "algorithm.mu: unknown key"),
    ("algorithm.grad_source=best", "algorithm.grad_source: 'best' is not allowed"),
])
def test_bad_config_is_one_clean_line(tmp_path, capsys, override, needle):
    raw = tiny_raw(algorithm={"name": "fedlga"})
    assert main(["run", write(tmp_path, raw), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_missing_data_folder_and_config_file(tmp_path, capsys):
    raw = tiny_raw(data={"name": "fashion_mnist", "root": str(tmp_path / "nowhere")})
    assert main(["run", write(tmp_path, raw)]) == 2
    assert capsys.readouterr().err.startswith("fedsweep: error: data.root")
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


@pytest.mark.parametrize("content", [bytes(range(256)), b"name: x\x00\n"])
def test_a_file_that_is_not_text_is_one_line(tmp_path, capsys, content):
    path = tmp_path / "binary.yaml"
    path.write_bytes(content)
    for argv in (["run", str(path)], ["tune", str(path), "--dry-run"], ["report", str(path)], ["config", str(path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert f"{path}: not a text file" in err and len(err.splitlines()) == 1, (argv, err)


def test_config_command_prints_resolved_defaults(tmp_path, capsys):
    assert main(["config", write(tmp_path, tiny_raw(algorithm={"name": "fedlga"}))]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["algorithm"] == {"name": "fedlga", "weighting": "uniform", "reading": "extrapolation", "grad_source": "mean",
                                     "damping": 0.0, "fallback": "fedavg"}


def test_bench_json(tmp_path):
    out = tmp_path / "bench.json"
    # the CNN, not ResNet-18 (the same rule, 5 s rather than 100 s on 2 cores; benchmarks/ time the big models)
    assert main(["bench", "--clients", "2", "--models", "mlp", "cnn", "--rounds", "1", "--matmul-precision",
                 "high", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["matmul_precision"] == "high"
    mlp, cnn = report["results"]
    for row in (mlp, cnn):
        assert row["clients_per_round"] == 2 and row["speedup"] > 0 and row["faster_here"] in ("loop", "vectorized")
    assert mlp["auto_picks"] == "vectorized" and cnn["auto_picks"] == "loop"   # convolutions on a CPU


def test_switching_algorithm_names_the_stale_key_and_what_is_allowed(tmp_path, capsys):
    path = write(tmp_path, tiny_raw(algorithm={"name": "fedlga", "grad_source": "last"}))
    assert main(["config", path, "--set", "algorithm.name=fedavg"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("fedsweep: error: algorithm.grad_source: unknown key; fedavg takes no parameters "
                   "(allowed: name, weighting)")
    assert main(["config", path, "--set", "algorithm.name=fedprox"]) == 2
    assert capsys.readouterr().err.strip().endswith("unknown key; allowed for fedprox: name, weighting, mu")


def test_algorithms_lists_each_family_with_its_whole_first_paragraph(capsys):
    import sys
    from fedsweep.algorithms import get_algorithm_class
    assert main(["algorithms"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 100 for line in out.splitlines() if not line.startswith("    algorithm."))
    text = " ".join(out.split())
    for name in available():
        cls = get_algorithm_class(name)       # its own docstring, else its module's (a family's)
        doc = (cls.__dict__.get("__doc__") or sys.modules[cls.__module__].__doc__).strip().split("\n\n")[0]
        assert f"{name} {' '.join(doc.split())}" in text, name    # every line of it, not just the first
    assert "algorithm.damping (default 0.0):" in out


def test_engine_auto_picks_by_model_and_device(capsys):
    """The measured rule (benchmarks/README.md): convolutions on a CPU run on the loop engine,
    everything else vectorized; an explicit engine is kept."""
    import torch

    from fedsweep.config.schema import ModelConfig, build_config
    from fedsweep.engine import choose_engine
    from fedsweep.sim.models import build_model
    from fedsweep.runs.run import train
    mlp, cnn = (build_model(ModelConfig(name=n), (1, 8, 8), 10) for n in ("mlp", "cnn"))
    assert choose_engine("auto", mlp, "cpu") == "vectorized" and choose_engine("auto", cnn, "cpu") == "loop"
    assert choose_engine("auto", cnn, torch.device("cuda")) == "vectorized"
    assert choose_engine("vectorized", cnn, "cpu") == "vectorized" and choose_engine("loop", mlp, "cpu") == "loop"
    module = train(build_config(tiny_raw(rounds=1, model={"name": "cnn"})), progress=True)
    assert module.engine_name == "loop" and "loop engine (auto) on cpu" in capsys.readouterr().err


def test_python_dash_m_fedsweep_is_the_command(tmp_path):
    """`python -m fedsweep` runs the same command line as the `fedsweep` script (for environments whose
    scripts are not on PATH): its output, and exit 2 for a mistake."""
    import subprocess
    import sys
    listed = subprocess.run([sys.executable, "-m", "fedsweep", "algorithms"], capture_output=True, text=True,
                            cwd=tmp_path, timeout=120)
    assert listed.returncode == 0 and "fedavg" in listed.stdout and "scaffold" in listed.stdout
    wrong = subprocess.run([sys.executable, "-m", "fedsweep", "run", str(tmp_path / "missing.yaml")],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert wrong.returncode == 2 and wrong.stderr.startswith("fedsweep: error: ") and "Traceback" not in wrong.stderr
