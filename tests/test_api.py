"""The Python API (fedsweep.run, tune, report) on real components: a real MLflow store, a real Ray Tune
run, plugins written to a file, a model class registered from ``__main__`` as a notebook cell does."""
from __future__ import annotations

import contextlib
import io
import sys
import textwrap

import numpy as np
import pytest
import torch
import yaml
from mlflow import MlflowClient
from torch import nn

import fedsweep
from conftest import tiny_raw

LAB = '''
    """A plugin of the test: an algorithm, a model with an option, a dataset."""
    import math
    from typing import Annotated

    import numpy as np
    from pydantic import Field
    from torch import nn

    import fedsweep


    @fedsweep.register_algorithm
    class HalfStep(fedsweep.Algorithm):
        """FedAvg with half the server step."""
        name = "api_halfstep"

        def aggregate(self, w, uploads, plan):
            return 0.5 * (self.weights(plan) @ uploads["delta"])


    @fedsweep.register_model("api_wide", input_shape=(6,))
    class Wide(nn.Module):
        """One hidden layer of `width` units."""

        def __init__(self, input_shape, num_classes, width: Annotated[int, Field(ge=1)] = 8):
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(),
                                     nn.Linear(width, num_classes))

        def forward(self, x):
            return self.net(x)


    @fedsweep.register_dataset("api_blobs")
    def blobs(seed: int):
        """Two Gaussian blobs in 6 dimensions: 160 training and 40 test samples."""
        rng = np.random.default_rng(seed)
        y = np.arange(200) % 2
        x = (rng.normal(size=(200, 6)) + 1.5 * y[:, None]).astype(np.float32)
        return fedsweep.Source(x[:160], y[:160], x[160:], y[160:], num_classes=2)
'''

SWEEP = {
    "name": "apilab", "plugins": ["api_lab.py"],   # relative to the working folder
    "base": {"rounds": 4, "clients_per_round": 4, "device": "cpu",
             "data": {"name": "api_blobs", "num_clients": 8, "partition": {"kind": "iid"}},
             "model": {"name": "api_wide"}, "local": {"steps": 3, "batch_size": 8, "lr": 0.1},
             "heterogeneity": {"kind": "stragglers", "rho": 0.5}, "eval": {"every": 2}},
    "grid": {"model.options.width": [np.int64(4), np.int64(16)]},   # numpy numbers, as a notebook makes them
    "methods": {"fedavg": {}, "api_halfstep": {}},
    "seeds": [0],
    "max_concurrent": 1,   # one trial worker, not two (test_tune.TINY says why)
}


def one_line_error(call, *args, **kwargs) -> str:
    with pytest.raises(fedsweep.ConfigError) as e:
        call(*args, **kwargs)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


# ----- fedsweep.run ------------------------------------------------------------------------------

def test_run_from_a_dict_is_quiet_and_is_what_mlflow_holds(tmp_mlflow, tmp_path, capsys):
    result = fedsweep.run(tiny_raw(rounds=4, eval={"every": 2}, mlflow={"experiment": "api"}))
    assert capsys.readouterr() == ("", "")                      # no header, progress, summary or MLflow lines
    assert result.status == "finished" and result.config.rounds == 4
    assert list(result.rounds.index) == [1, 2, 3, 4] and list(result.history.index) == [2, 4]
    assert result.history["test/accuracy"].notna().all() and result.rounds["test/accuracy"].isna().sum() == 2

    client = MlflowClient(tmp_mlflow)
    logged = client.get_run(result.run_id)
    assert logged.info.status == "FINISHED" and result.tracking_uri == tmp_mlflow
    assert logged.data.metrics["summary/best_test_accuracy"] == pytest.approx(result.summary["best_test_accuracy"])
    assert logged.data.metrics["summary/rounds"] == result.summary["rounds"] == 4
    for key in ("test/accuracy", "test/loss"):
        steps = {m.step: m.value for m in client.get_metric_history(result.run_id, key)}
        assert steps == pytest.approx(result.history[key].to_dict())
    # the model returned is the model logged (model.pt), on the CPU
    saved = torch.load(client.download_artifacts(result.run_id, "model.pt", str(tmp_path)), weights_only=True)
    assert saved.keys() == result.model.state_dict().keys()
    assert all(torch.equal(saved[k], v) for k, v in result.model.state_dict().items())


def test_run_from_a_file_with_overrides(tmp_mlflow, tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_raw(mlflow={"experiment": "api"})))
    as_words = fedsweep.run(path, ["local.lr=0.05", "rounds=2"])
    as_dict = fedsweep.run(str(path), {"local.lr": 0.05, "rounds": 2, "local": {"steps": 3}})
    assert capsys.readouterr() == ("", "")
    assert as_words.config.local.lr == as_dict.config.local.lr == 0.05
    assert as_words.summary["rounds"] == as_dict.summary["rounds"] == 2
    assert as_dict.config.local.steps == 3 and as_dict.config.local.batch_size == 5   # a mapping merges
    params = MlflowClient(tmp_mlflow).get_run(as_words.run_id).data.params
    assert params["local.lr"] == "0.05" and params["rounds"] == "2"

    # a sweep file runs its base, and its note is not printed; mlflow=False logs nothing
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": tiny_raw(), "grid": {"local.lr": [0.1, 0.2]}}))
    base = fedsweep.run(sweep, mlflow=False)
    assert base.run_id is None and base.config.local.lr == 0.1 and capsys.readouterr() == ("", "")


def test_progress_prints_what_fedsweep_run_prints(capsys):
    fedsweep.run(tiny_raw(), mlflow=False, progress=True)
    out, err = capsys.readouterr()
    assert "best test accuracy" in out                          # the summary table
    assert "round    3/3  test acc" in err and "engine" in err   # the header and a line per evaluation


def test_bad_input_raises_one_line_config_error(tmp_path, tmp_mlflow):
    assert one_line_error(fedsweep.run, {"rounds": 0}).startswith("rounds: ")
    assert one_line_error(fedsweep.run, {"local": {"lrr": 0.1}}).startswith("local.lrr: unknown key; allowed here: ")
    assert one_line_error(fedsweep.run, tiny_raw(), {"rounds.x": 1}) == "rounds.x: 'rounds' is a value, not a section"
    assert one_line_error(fedsweep.run, tmp_path / "none.yaml") == f"config file not found: {tmp_path / 'none.yaml'}"
    assert one_line_error(fedsweep.run, 3).startswith("config: expected a path")
    assert one_line_error(fedsweep.tune, {"base": {}}).startswith("sweep: name: a sweep given as a mapping needs")
    assert one_line_error(fedsweep.tune, {"name": "bad", "base": tiny_raw(), "grid": {"local.lrr": [0.1]}},
                          dry_run=True).startswith("sweep: grid: local.lrr: unknown key")
    assert "no MLflow" in one_line_error(fedsweep.report, {"name": "nothing", "base": {}})


# ----- a component defined in __main__ (a notebook cell) ----------------------------------------

class NotebookModel(nn.Module):
    """A model as a notebook cell defines it: its module is __main__."""

    def __init__(self, input_shape, num_classes, width: int = 8):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))

    def forward(self, x):
        return self.net(x)


NotebookModel.__module__ = "__main__"


@pytest.fixture
def notebook_model():
    from fedsweep.config.registry import MODELS
    fedsweep.register_model("api_notebook_model")(NotebookModel)
    assert MODELS.get("api_notebook_model").module == "__main__"
    yield "api_notebook_model"
    MODELS.remove("api_notebook_model")


def test_a_notebook_class_runs_here_and_a_sweep_of_it_is_refused_before_ray(notebook_model, tmp_mlflow, fresh_home):
    import ray
    model = {"name": notebook_model, "options": {"width": 12}}
    result = fedsweep.run(tiny_raw(model=model, mlflow={"experiment": "api"}))
    assert result.status == "finished" and result.run_id is not None
    assert type(result.model).__name__ == "NotebookModel" and result.model.net[1].out_features == 12
    for dry_run in (True, False):   # a dry run makes the check a sweep makes
        error = one_line_error(fedsweep.tune, {"name": "notebook", "base": tiny_raw(model=model), "seeds": [0]},
                               dry_run=dry_run)
        assert f"model.name '{notebook_model}' is defined in __main__" in error and "put it in a .py file" in error
    assert not ray.is_initialized()


# ----- fedsweep.tune and fedsweep.report on a sweep given as a dict, with plugins -----------------

@pytest.fixture(scope="module")
def lab_sweep(tmp_path_factory):
    """SWEEP run once by fedsweep.tune from its working folder (its report at the end too), the
    plugin file beside it; what the plugin registered is forgotten after the module's tests."""
    from fedsweep.config import plugins
    from fedsweep.config.registry import ALGORITHMS, DATASETS, MODELS
    tmp = tmp_path_factory.mktemp("lab")
    (tmp / "api_lab.py").write_text(textwrap.dedent(LAB))
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.setenv("HOME", str(tmp_path_factory.mktemp("home")))   # Ray keeps a token in ~/.ray
        for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "FEDSWEEP_NO_REPORT"):
            mp.delenv(var, raising=False)
        mp.chdir(tmp)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            planned = fedsweep.tune(SWEEP, dry_run=True)
            table = fedsweep.tune(SWEEP)
        yield tmp, uri, planned, table, printed.getvalue()
    for registry, name in ((ALGORITHMS, "api_halfstep"), (MODELS, "api_wide"), (DATASETS, "api_blobs")):
        registry.remove(name)
    sys.modules.pop("api_lab", None)
    for spec in [s for s in plugins._loaded if s.startswith(str(tmp))]:
        del plugins._loaded[spec]


def test_tune_from_a_dict_returns_a_row_per_trial_with_the_swept_keys(lab_sweep):
    tmp, uri, planned, table, printed = lab_sweep
    assert printed == ""                                        # progress=False: nothing on the terminal
    assert len(planned) == 4 and set(planned["status"]) == {"planned"}
    assert list(table.columns[:6]) == ["method", "model.options.width", "seed", "stage", "status", "best_test_accuracy"]
    assert sorted(zip(table["method"], table["model.options.width"])) == \
        [("api_halfstep", 4), ("api_halfstep", 16), ("fedavg", 4), ("fedavg", 16)]
    assert set(table["stage"]) == {"tune"} and set(table["status"]) == {"finished"} and set(table["seed"]) == {0}
    assert {"final_test_accuracy", "rounds_to_target", "rounds", "run_id", "config_id"} <= set(table.columns)
    assert "best_val_accuracy" not in table                     # no validation split: no validation columns
    assert sorted(table["config_id"]) == sorted(planned["config_id"])

    client = MlflowClient(uri)
    for _, row in table.iterrows():
        logged = client.get_run(row["run_id"])
        assert logged.data.tags["mlflow.parentRunId"] == table.attrs["parent_run_id"]
        assert logged.data.params["model.options.width"] == str(row["model.options.width"])
        assert logged.data.metrics["summary/best_test_accuracy"] == pytest.approx(row["best_test_accuracy"])
        assert logged.data.tags["fedsweep.plugin.api_lab.sha256"]   # the plugin's hash, beside every result
    # the parent run keeps the dict as sweep.yaml; the report was written at the end, as fedsweep tune does
    kept = client.download_artifacts(table.attrs["parent_run_id"], "sweep.yaml", str(tmp))
    assert yaml.safe_load(open(kept)) == SWEEP
    assert (tmp / "reports" / "apilab" / "report.md").is_file()


def test_report_returns_its_tables_quietly(lab_sweep, tmp_path, capsys):
    tmp, _, _, table, _ = lab_sweep
    made = fedsweep.report(SWEEP, out=tmp_path / "rep")
    assert capsys.readouterr() == ("", "")
    assert made.path == tmp_path / "rep" / "report.md" and made.path.is_file()
    assert sorted(made.trials["run_id"]) == sorted(table["run_id"])
    assert set(made.best["method"]) == {"fedavg", "api_halfstep"} and len(made.best) == 2
    assert len(made.configs) == 4 and set(made.configs["rank"]) == {1, 2}
    assert list(made.comparisons["method"].unique()) == ["api_halfstep"]
    assert set(made.comparisons["reference"]) == {"fedavg"}
    assert len(made.comparisons) == len(open(tmp_path / "rep" / "comparisons.csv").readlines()) - 1


def test_a_sweep_that_did_not_end_says_what_continues_it():
    from fedsweep.api import _ending_text
    outcome = {"sweep": "s", "trials": 4, "finished": 1, "unfinished": 3, "stopped_by": "KeyboardInterrupt",
               "recover": "--resume"}
    assert _ending_text(outcome, {"name": "s"}) == ("sweep 's' interrupted: 1 finished; 3 of 4 unfinished; stopped by "
                                                    "KeyboardInterrupt; continue it with fedsweep.tune(sweep, resume=True)")
    assert _ending_text({**outcome, "recover": "--restart", "resume_problem": "its record is gone"}, "s.yaml").endswith(
        "resume cannot continue it (its record is gone): start it over with fedsweep.tune('s.yaml', restart=True)")
