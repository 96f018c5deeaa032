"""Plugins: a user's own algorithm, model and dataset in files outside fedsweep, named in `plugins:`,
used by name like the built-ins (fedsweep/config/plugins.py, fedsweep/config/registry.py); every bad
plugin is one line and exit 2 before anything trains."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import tiny_raw
from fedsweep.cli import main
from fedsweep.config.registry import ALGORITHMS, DATASETS, MODELS
from fedsweep.config.schema import ConfigError, build_config, read_run_config

LAB = '''
from typing import Annotated

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

import fedsweep


@fedsweep.register_algorithm
class HalfStep(fedsweep.Algorithm):
    """FedAvg taking half the averaged step."""
    name = "{prefix}half"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        share: float = Field(0.5, gt=0, description="The share of the step taken.")

    def aggregate(self, w, uploads, plan):
        return self.params.share * (self.weights(plan) @ uploads["delta"])


@fedsweep.register_model("{prefix}mlp")
class Wide(nn.Module):
    """An MLP of `width` units."""

    def __init__(self, input_shape, num_classes, width: Annotated[int, Field(ge=1)] = 8, out: int = 0):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), width), nn.ReLU(),
                                 nn.Linear(width, out or num_classes))

    def forward(self, x):
        return self.net(x)


@fedsweep.register_dataset("{prefix}blobs")
def blobs(seed, num_clients, test_fraction, n: int = 300, labels: str = "int"):
    """Three Gaussian blobs in 5 dimensions."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (rng.normal(size=(n, 5)) + 3 * np.eye(3, 5)[y]).astype(np.float32)
    cut = int(n * (1 - test_fraction))
    y = y.astype(float) if labels == "float" else y
    x_train = x[:cut - 1] if labels == "short" else x[:cut]
    return fedsweep.Source(x_train, y[:cut], x[cut:], y[cut:], num_classes=3)
'''


def lab_text(prefix: str = "lab_") -> str:
    return LAB.replace("{prefix}", prefix)


def raw_with(path, **over) -> dict:
    raw = tiny_raw(**over)
    return {"plugins": [str(path)], **raw}


def test_a_plugin_file_registers_what_configs_then_name(plugin_dir, tmp_path):
    plugin_dir("lab.py", lab_text())
    config = plugin_dir.folder / "run.yaml"
    config.write_text(yaml.safe_dump({**tiny_raw(algorithm={"name": "lab_half", "share": 0.25},
                                                 model={"name": "lab_mlp", "options": {"width": 4}},
                                                 data={"name": "lab_blobs", "num_clients": 6}),
                                      "plugins": ["lab.py"]}))
    os.chdir(tmp_path)                                        # relative to the file, not the working folder
    raw, _ = read_run_config(config)
    cfg = build_config(raw)
    assert cfg.plugins == [str(plugin_dir.folder / "lab.py")]
    assert cfg.model.options == {"width": 4, "out": 0} and cfg.data.options == {"n": 300, "labels": "int"}
    assert cfg.algorithm.params.share == 0.25
    from fedsweep.runs.run import train
    module = train(cfg, progress=False)
    assert module.rounds_done == cfg.rounds and module.fmodel.dim == 5 * 4 + 4 + 4 * 3 + 3
    assert MODELS.get("lab_mlp").where() == f"lab ({plugin_dir.folder / 'lab.py'})"


def test_options_are_checked_against_the_signature(plugin_dir):
    path = plugin_dir("lab.py", lab_text())
    with pytest.raises(ConfigError, match=r"^model\.options\.widht: unknown option of model 'lab_mlp'; allowed: "
                                          r"width \(default 8\), out \(default 0\)$"):
        build_config(raw_with(path, model={"name": "lab_mlp", "options": {"widht": 3}}))
    with pytest.raises(ConfigError, match=r"^model\.options\.width: Input should be greater than or equal to 1"):
        build_config(raw_with(path, model={"name": "lab_mlp", "options": {"width": 0}}))
    with pytest.raises(ConfigError, match=r"^model\.width: the options of model 'lab_mlp' go under model\.options "
                                          r"\(model\.options\.width\)"):
        build_config(raw_with(path, model={"name": "lab_mlp", "width": 3}))
    with pytest.raises(ConfigError, match=r"^data\.options\.n: Input should be a valid integer"):
        build_config(raw_with(path, data={"name": "lab_blobs", "options": {"n": "many"}}))
    # a key of the data section given as an option (which a dataset function may take by name too)
    with pytest.raises(ConfigError, match=r"^data\.options\.test_fraction: not an option but a key of the data "
                                          r"section itself, .*; set data\.test_fraction \(not under data\.options\)$"):
        build_config(raw_with(path, data={"name": "digits", "options": {"test_fraction": 0.3}}))
    with pytest.raises(ConfigError, match=r"^data\.options\.seed: not an option: .*\(the top-level key seed"):
        build_config(raw_with(path, data={"name": "digits", "options": {"seed": 3}}))
    plugin_dir("req.py", '''
        import fedsweep
        from torch import nn
        @fedsweep.register_model("req_mlp")
        def make(input_shape, num_classes, width):
            return nn.Linear(1, 1)
    ''')
    with pytest.raises(ConfigError, match=r"^model\.options\.width: model 'req_mlp' needs it; allowed: width "
                                          r"\(required\)$"):
        build_config(raw_with(plugin_dir.folder / "req.py", model={"name": "req_mlp"}))


def test_the_forms_of_a_plugin_a_package_a_bare_name_and_a_module_name(plugin_dir, monkeypatch):
    plugin_dir("labpkg/__init__.py", "from . import algos\n")
    plugin_dir("labpkg/algos.py", lab_text("pkg_"))
    config = plugin_dir.folder / "run.yaml"
    config.write_text(yaml.safe_dump({"plugins": ["labpkg"], "algorithm": {"name": "pkg_half"}}))
    raw, _ = read_run_config(config)                          # a bare name beside the file: its package
    assert raw["plugins"] == [str(plugin_dir.folder / "labpkg")]
    assert build_config(raw).algorithm.name == "pkg_half"
    assert ALGORITHMS.get("pkg_half").module == "labpkg.algos"
    other = plugin_dir("elsewhere/labmod.py", lab_text("mod_"))
    monkeypatch.syspath_prepend(str(other.parent))            # an importable module, named by its name
    assert build_config({"plugins": ["labmod"], "algorithm": {"name": "mod_half"}}).plugins == ["labmod"]
    with pytest.raises(ConfigError, match=r"^plugins: labmod_typo: no module named 'labmod_typo' on this Python's "
                                          r"path; a file or folder of your own is named by its path"):
        build_config({"plugins": ["labmod_typo"]})


BAD = {
    "missing file": ("", {}, r"plugins: .*/lab/nothere\.py: no such file or folder"),
    "import error": ("x = 1 / 0\n", {}, r"plugins: .*/lab/bad\.py: importing it failed \(ZeroDivisionError: "
                                        r"division by zero at .*/lab/bad\.py:1\)"),
    "syntax error": ("import fedsweep\n\ndef f(:\n    pass\n", {},
                     r"plugins: .*/lab/bad\.py: importing it failed \(SyntaxError: invalid syntax at .*/lab/bad\.py:3\)"),
    "not an algorithm": ("import fedsweep\n@fedsweep.register_algorithm\nclass Nope:\n    name = 'nope'\n", {},
                         r"plugins: .*bad\.py: register_algorithm: Nope is not a subclass of fedsweep\.Algorithm"),
    "clash": ("import fedsweep\n@fedsweep.register_algorithm\nclass Mine(fedsweep.Algorithm):\n    name = 'fedavg'\n",
              {}, r"plugins: .*bad\.py: algorithm 'fedavg' is registered twice: by fedsweep\.algorithms\.fedavg and "
                  r"by bad \(.*/lab/bad\.py\); rename one of them"),
    "float labels": (None, {"data": {"name": "lab_blobs", "num_clients": 6, "options": {"labels": "float"}}},
                     r"data\.name: dataset 'lab_blobs': y_train holds float64 values; labels must be one integer "
                     r"class id a sample, 0\.\.2"),
    "lengths": (None, {"data": {"name": "lab_blobs", "num_clients": 6, "options": {"labels": "short"}}},
                r"data\.name: dataset 'lab_blobs': x_train has 239 samples but y_train 240 labels"),
    "output width": (None, {"data": {"name": "lab_blobs", "num_clients": 6},
                            "model": {"name": "lab_mlp", "options": {"out": 7}}},
                     r"model\.name: 'lab_mlp' gives outputs of shape \(2, 7\) for a batch of 2; it must give one "
                     r"logit per class, \(2, 3\) for this dataset's 3 classes"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("command", ["run", "tune"])
def test_a_bad_plugin_is_one_line_before_anything_trains(plugin_dir, tmp_path, capsys, monkeypatch, case, command,
                                                        tmp_mlflow):
    text, over, message = BAD[case]
    name = "nothere.py" if text == "" else "lab.py" if text is None else "bad.py"
    if text is not None and text != "":
        plugin_dir(name, text)
    elif text is None:
        plugin_dir(name, lab_text())
    base = {**tiny_raw(**over), "plugins": [name]}
    if command == "run":
        path = plugin_dir.folder / "run.yaml"
        path.write_text(yaml.safe_dump(base))
    else:
        path = plugin_dir.folder / "sweep.yaml"
        path.write_text(yaml.safe_dump({"plugins": base.pop("plugins"), "name": "bad", "base": base,
                                        "grid": {"local.lr": [0.1]}}))
    monkeypatch.chdir(tmp_path)
    assert main([command, str(path)]) == 2
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("fedsweep: error: ") and __import__("re").search(message, err), err
    assert "round " not in out + err and not (tmp_path / "fedsweep_runs").exists()   # nothing trained or started


def test_a_model_vmap_cannot_run_trains_on_the_loop_engine_and_says_why(plugin_dir, capsys, tmp_path):
    path = plugin_dir("bn.py", '''
        import fedsweep
        from torch import nn
        @fedsweep.register_model("bn_mlp")
        class BN(nn.Module):
            def __init__(self, input_shape, num_classes):
                super().__init__()
                self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU(),
                                         nn.Linear(8, num_classes))
            def forward(self, x):
                return self.net(x)
    ''')
    raw = raw_with(path, model={"name": "bn_mlp"}, rounds=4)
    from fedsweep.runs.run import train
    module = train(build_config(raw), progress=True)
    err = capsys.readouterr().err
    assert "loop engine (auto: torch.func.vmap cannot run this model: RuntimeError: " in err.splitlines()[0]
    assert module.engine_name == "loop"
    with pytest.raises(ConfigError, match=r"^engine: 'vectorized' runs every client's model under torch\.func\.vmap, "
                                          r"which cannot run this model \(RuntimeError: .*\); use engine: loop"):
        train(build_config({**raw, "engine": "vectorized"}), progress=False)
    from conftest import resumed_run                          # its running statistics resume with it
    full, _, saved = resumed_run(raw, tmp_path / "ckpt", stop=2)
    assert set(saved["buffers"]) == {"net.2.running_mean", "net.2.running_var", "net.2.num_batches_tracked"}


def test_each_run_records_its_plugins_and_a_changed_one_does_not_resume(plugin_dir, tmp_mlflow, capsys, tmp_path):
    path = plugin_dir("lab.py", lab_text())
    config = plugin_dir.folder / "run.yaml"
    config.write_text(yaml.safe_dump({**tiny_raw(algorithm={"name": "lab_half"}, mlflow={"enabled": True},
                                                 rounds=4), "plugins": ["lab.py"]}))
    ckpt = tmp_path / "ckpt"
    assert main(["run", str(config), "--checkpoint-dir", str(ckpt), "--set", "rounds=2"]) == 0
    from fedsweep.config.plugins import digest
    from mlflow import MlflowClient
    client = MlflowClient(tmp_mlflow)
    run = client.search_runs([client.get_experiment_by_name("fedsweep").experiment_id])[0]
    assert run.data.tags["fedsweep.plugins"] == "lab"
    assert run.data.tags["fedsweep.plugin.lab.file"] == str(path)
    assert run.data.tags["fedsweep.plugin.lab.sha256"] == digest(str(path))
    assert run.data.params["algorithm.name"] == "lab_half" and run.data.params["algorithm.share"] == "0.5"
    local = client.download_artifacts(run.info.run_id, "plugins/lab.py", str(tmp_path))
    assert open(local).read() == path.read_text()
    capsys.readouterr()
    path.write_text(path.read_text().replace("half the averaged step", "a changed docstring"))
    assert main(["run", str(config), "--resume", str(ckpt / "last.ckpt")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"plugin lab ({path}) changed (sha256 " in err and \
        "since it started" in err, err


def test_listing_names_fedsweeps_own_and_a_files_plugins(plugin_dir, capsys):
    plugin_dir("lab.py", lab_text())
    config = plugin_dir.folder / "sweep.yaml"
    config.write_text(yaml.safe_dump({"plugins": ["lab.py"], "base": {}}))
    assert main(["models", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.index("mlp ") < out.index("models of plugins:") < out.index("lab_mlp ")
    assert f"    from lab ({plugin_dir.folder / 'lab.py'})" in out
    assert "    model.options.width (default 8)" in out and "    model.options.hidden (default 400): Hidden" in out
    assert main(["datasets", str(plugin_dir.folder / "lab.py")]) == 0          # the plugin file itself
    out = capsys.readouterr().out
    assert "lab_blobs      Three Gaussian blobs in 5 dimensions." in out and "    data.options.n (default 300)" in out
    assert "    data.num_clients: passed as its `num_clients`" in out
    assert main(["algorithms", str(config)]) == 0
    assert "lab_half       FedAvg taking half the averaged step.\n" in capsys.readouterr().out


def test_an_installed_package_plugs_in_by_its_entry_point(tmp_path):
    """A package that declares the `fedsweep.plugins` entry point is loaded without being named: by
    `run`, and by `tune` (dry run and sweep) with no `plugins:` though what it registers lives in a
    submodule of its package. One that fails to load is one warning, fatal only where its names are
    used; FEDSWEEP_DISABLE_PLUGIN_AUTOLOAD=1 skips them."""
    site = tmp_path / "site"
    (site / "labdist-1.0.dist-info").mkdir(parents=True)
    (site / "labdist-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: labdist\nVersion: 1.0\n")
    (site / "labdist-1.0.dist-info" / "entry_points.txt").write_text("[fedsweep.plugins]\nlab = labdist_plugin\n")
    (site / "labdist_plugin.py").write_text(lab_text("ep_"))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**tiny_raw(algorithm={"name": "ep_half"}), "rounds": 2}))
    env = {**os.environ, "PYTHONPATH": str(site), "HOME": str(tmp_path)}
    listed = subprocess.run([sys.executable, "-m", "fedsweep.cli", "algorithms"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0 and "algorithms of plugins:\nep_half " in listed.stdout, listed.stderr
    ran = subprocess.run([sys.executable, "-m", "fedsweep.cli", "run", str(config), "--quiet"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0 and "finished" in ran.stdout, ran.stderr[-2000:]
    sweep = tmp_path / "s.yaml"   # a sweep of it, with no plugins: (its registration in a submodule of its package)
    (site / "labpkg").mkdir()
    (site / "labpkg" / "__init__.py").write_text("")
    (site / "labpkg" / "hook.py").write_text("import labpkg.algos\n")
    (site / "labpkg" / "algos.py").write_text(lab_text("pk_"))
    (site / "labdist-1.0.dist-info" / "entry_points.txt").write_text(
        "[fedsweep.plugins]\nlab = labdist_plugin\npkg = labpkg.hook\n")
    sweep.write_text(yaml.safe_dump({"name": "eps", "base": {**tiny_raw(), "rounds": 2}, "methods": {"pk_half": {}},
                                     "seeds": [0], "max_concurrent": 1, "mlflow": {"tracking_uri": f"sqlite:///{tmp_path / 'm.db'}"}}))
    for argv in (["--dry-run"], []):
        swept = subprocess.run([sys.executable, "-m", "fedsweep.cli", "tune", str(sweep), *argv], env=env,
                               capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert swept.returncode == 0, swept.stderr[-2000:]
    assert "sweep done: 1 finished" in swept.stdout + swept.stderr, (swept.stdout + swept.stderr)[-2000:]
    (site / "labdist_plugin.py").write_text("raise RuntimeError('broken install')\n")
    warning = ("fedsweep: warning: installed plugin 'lab' (labdist: labdist_plugin) failed to load (RuntimeError: "
               "broken install); what it registers is unavailable: uninstall or fix it "
               "(FEDSWEEP_DISABLE_PLUGIN_AUTOLOAD=1 skips installed plugins)")
    listed = subprocess.run([sys.executable, "-m", "fedsweep.cli", "algorithms"], env=env, capture_output=True,
                            text=True, timeout=120)   # one warning; the other installed plugin still loads
    assert listed.returncode == 0 and listed.stderr.strip() == warning and "pk_half " in listed.stdout, listed.stderr
    ran = subprocess.run([sys.executable, "-m", "fedsweep.cli", "run", str(config), "--quiet"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)   # fatal where it is used
    last = ran.stderr.strip().splitlines()[-1]
    assert ran.returncode == 2 and "unknown algorithm 'ep_half'" in last and \
        "installed plugin 'lab' (labdist: labdist_plugin) failed to load (RuntimeError: broken install)" in last, \
        ran.stderr
    quiet = subprocess.run([sys.executable, "-m", "fedsweep.cli", "algorithms"], capture_output=True, text=True,
                           timeout=120, env={**env, "FEDSWEEP_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert quiet.returncode == 0 and quiet.stderr == "" and "pk_half" not in quiet.stdout, quiet.stderr


def test_a_sweep_resumes_only_with_the_plugins_it_started_with(plugin_dir, tmp_path, monkeypatch, capsys):
    """A sweep interrupted (Ctrl-C) and its plugin edited: `--resume` is refused in one line naming the
    plugin; with the file as it was, `--resume` finishes every trial (each worker checks it imports
    the same source the sweep started with). Its report and `fedsweep ui` read it in a new process where
    the plugin file is gone, and where it is a file that would run code: neither imports it."""
    import time

    from raycluster import interrupt
    from test_tune import _statuses, _wait_for, start_sweep, trial_runs
    path = plugin_dir("lab.py", lab_text())
    original = path.read_text()
    sweep = plugin_dir.folder / "sweep.yaml"
    base = {**tiny_raw(algorithm={"name": "lab_half"}, rounds=1500, eval={"every": 150}), "mlflow": {}}
    sweep.write_text(yaml.safe_dump({"plugins": ["lab.py"], "name": "edited", "base": base,
                                     "methods": {"lab_half": {}}, "seeds": [0, 1], "max_concurrent": 2}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = start_sweep(str(sweep), tmp_path, uri)
    try:
        assert _wait_for(lambda: _statuses(uri, "edited").count("running") == 2, 240), \
            (tmp_path / "driver.log").read_text()[-3000:]
        time.sleep(2)
    finally:
        interrupt(proc, 180)                                  # Ctrl-C, as a terminal sends it
    assert "--resume" in (tmp_path / "driver.log").read_text()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    path.write_text(original + "\n# edited\n")
    capsys.readouterr()
    assert main(["tune", str(sweep), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--resume: plugin lab ({path}) changed (sha256 " in err, err
    path.write_text(original)
    assert main(["tune", str(sweep), "--resume"]) == 0
    _, runs = trial_runs(uri, "edited")
    assert sorted(r.data.tags["fedsweep.status"] for r in runs) == ["finished", "finished"]
    # read where the plugin is gone, or where its file would run code: report and ui import no plugin
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    path.unlink()
    report = subprocess.run([sys.executable, "-m", "fedsweep.cli", "report", str(sweep), "--out", "gone"], env=env,
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert report.returncode == 0 and "lab_half" in (tmp_path / "gone" / "report.md").read_text(), report.stderr
    path.write_text("open('PWNED', 'w').write('ran')\n")
    read = subprocess.run([sys.executable, "-c", "import fedsweep, sys; from fedsweep.sweep.ui import target_store; "
                           "print(target_store(sys.argv[1], None, None)); fedsweep.report(sys.argv[1], out='hostile')",
                           str(sweep)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert read.returncode == 0 and "(None, 'edited', 'edited')" in read.stdout, read.stderr   # the store: $MLFLOW_TRACKING_URI
    assert not (tmp_path / "PWNED").exists() and not (plugin_dir.folder / "PWNED").exists()


@pytest.mark.usefixtures("fresh_home")
def test_plugins_go_through_packs_validation_confirm_search_and_asha(plugin_dir, tmp_path, monkeypatch, capsys):
    """A plugin's algorithm, model (an option swept) and dataset through a packed sweep with a
    validation split and a confirm stage, then a searched sweep under ASHA; each ends with every run
    finished (or stopped by ASHA) in MLflow, and its report."""
    from test_tune import trial_runs
    plugin_dir("lab.py", lab_text())
    base = {**tiny_raw(algorithm={"name": "lab_half"}, model={"name": "lab_mlp"}, rounds=6,
                       data={"name": "lab_blobs", "num_clients": 6, "validation_fraction": 0.2,
                             "partition": {"kind": "iid"}}),
            "mlflow": {}, "eval": {"every": 2, "target_accuracy": 0.5}}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    packed = plugin_dir.folder / "packed.yaml"
    packed.write_text(yaml.safe_dump({"plugins": ["lab.py"], "name": "packed", "base": base, "pack": "seeds",
                                      "max_concurrent": 1,
                                      "grid": {"model.options.width": [4, 8]}, "seeds": [0, 1],
                                      "methods": {"fedavg": {}, "lab_half": {}}, "confirm": {"seeds": [5]}}))
    assert main(["tune", str(packed)]) == 0, capsys.readouterr().err[-3000:]
    _, runs = trial_runs(uri, "packed")
    assert len(runs) == 8 + 2 and {r.data.tags["fedsweep.status"] for r in runs} == {"finished"}
    assert sum(r.data.tags.get("fedsweep.stage") == "confirm" for r in runs) == 2
    assert {r.data.params["model.options.width"] for r in runs} == {"4", "8"} and "summary/best_val_accuracy" in \
        runs[0].data.metrics
    searched = plugin_dir.folder / "searched.yaml"
    searched.write_text(yaml.safe_dump({
        "plugins": ["lab.py"], "name": "searched", "base": {**base, "rounds": 8}, "seeds": [0], "max_concurrent": 1,
        "methods": {"lab_half": {}}, "search": {"space": {"model.options.width": {"choice": [4, 8]},
                                                          "algorithm.share": {"uniform": [0.2, 1.0]}},
                                               "num_samples": 4, "seed": 0},
        "scheduler": {"kind": "asha", "grace_period": 2, "reduction_factor": 2}}))
    assert main(["tune", str(searched)]) == 0, capsys.readouterr().err[-3000:]
    _, runs = trial_runs(uri, "searched")
    assert len(runs) == 4 and {r.data.tags["fedsweep.status"] for r in runs} <= {"finished", "stopped"}
    assert len({r.data.params["algorithm.share"] for r in runs}) == 4
    assert main(["report", str(searched), "--out", str(tmp_path / "rep")]) == 0
    assert "lab_half" in (tmp_path / "rep" / "report.md").read_text()


@pytest.mark.parametrize("name", ["json.py", "random.py", "csv.py", "statistics"])
def test_a_plugin_named_as_a_standard_library_module_is_refused_by_name(plugin_dir, tmp_path, capsys, monkeypatch,
                                                                      name, tmp_mlflow):
    """Whether or not the standard library's module of that name is imported yet, a plugin file or
    package named so would be imported as it (or shadow it in a worker): one line, nothing left behind."""
    text = "import fedsweep\n"
    if name.endswith(".py"):
        plugin_dir(name, text)
    else:
        (plugin_dir.folder / name).mkdir()
        (plugin_dir.folder / name / "__init__.py").write_text(text)
    path = plugin_dir.folder / "run.yaml"
    path.write_text(yaml.safe_dump({**tiny_raw(), "plugins": [name]}))
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    stem = name.removesuffix(".py")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{stem!r} is the name of a module of Python's standard library" in err and f"{stem}_plugin" in err, err
    assert not (tmp_path / "fedsweep_runs").exists() and not list(tmp_path.glob("**/*.lock"))


def test_a_plugin_failing_while_a_run_trains_is_one_line_naming_its_hook_and_line(plugin_dir, tmp_path, capsys,
                                                                                  monkeypatch):
    """An exception from a user's hook (here an algorithm's aggregate) ends `fedsweep run` with one line
    naming the hook, the file and line and what it raised, exit 1, the whole traceback kept in a file;
    fedsweep's own frames, Lightning's among them, stay out of the terminal."""
    plugin_dir("boom.py", "import fedsweep\n@fedsweep.register_algorithm\nclass Boom(fedsweep.Algorithm):\n"
                          "    \"\"\"Fails in its aggregate.\"\"\"\n    name = 'boom'\n\n"
                          "    def aggregate(self, w, uploads, plan):\n        raise ValueError('my bug')\n")
    path = plugin_dir.folder / "run.yaml"
    path.write_text(yaml.safe_dump({**tiny_raw(rounds=2, algorithm={"name": "boom"}), "plugins": ["boom.py"],
                                    "mlflow": {"enabled": False}}))
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(path), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert __import__("re").fullmatch(r"fedsweep: error: your code raised ValueError: my bug \(in aggregate, "
                                      r".*/lab/boom\.py:8\); the whole traceback: fedsweep_errors/.*\.txt", err), err
    (kept,) = (tmp_path / "fedsweep_errors").iterdir()
    assert "Traceback" in kept.read_text() and "lightning" in kept.read_text()



@pytest.mark.usefixtures("fresh_home")
def test_a_plugin_failing_in_a_sweep_fails_its_trial_once_with_its_line_and_traceback(plugin_dir, tmp_path, capsys,
                                                                                      monkeypatch):
    """An exception from a user's hook inside a sweep's trial: the trial fails at once (not retried, though
    `max_failures: 1`: it would fail the same way again), its line names the hook, file and line, its run
    keeps the traceback (error.txt), and the sweep exits 4 naming it."""
    from test_tune import trial_runs
    plugin_dir("boom.py", "import fedsweep\n@fedsweep.register_algorithm\nclass Boom(fedsweep.Algorithm):\n"
                          "    \"\"\"Fails in its aggregate.\"\"\"\n    name = 'boom'\n\n"
                          "    def aggregate(self, w, uploads, plan):\n        raise ValueError('my bug')\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sweep = plugin_dir.folder / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"plugins": ["boom.py"], "name": "boom", "base": tiny_raw(rounds=4),
                                     "methods": {"boom": {}}, "seeds": [0], "max_failures": 1,
                                     "mlflow": {"tracking_uri": uri}}))
    monkeypatch.chdir(tmp_path)
    assert main(["tune", str(sweep), "--no-report"]) == 4
    printed = capsys.readouterr()
    line = r"your code raised ValueError: my bug \(in aggregate, .*/lab/boom\.py:8\); not retried: it would fail " \
           r"the same way again"
    assert "[retrying]" not in printed.err and __import__("re").search(r"\[failed\] boom .*: " + line, printed.err), \
        printed.err
    client, (run,) = trial_runs(uri, "boom")
    assert run.data.tags["fedsweep.status"] == "failed" and run.info.status == "FAILED"
    assert __import__("re").fullmatch(line, run.data.tags["fedsweep.error"]), run.data.tags["fedsweep.error"]
    traceback = Path(client.download_artifacts(run.info.run_id, "error.txt", str(tmp_path))).read_text()
    assert "Traceback" in traceback and "ValueError: my bug" in traceback and "boom.py" in traceback
