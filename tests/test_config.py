"""Config and sweep validation: one-line errors naming the key, no inf, no shared state between builds,
and a config layer that does not import the algorithms it validates against."""
import math
import subprocess
import sys

import pytest
import yaml

from fedsweep.algorithms import available, get_algorithm_class
from fedsweep.cli import main
from fedsweep.config.schema import ConfigError, build_config
from conftest import tiny_raw


def error(raw, *overrides) -> str:
    with pytest.raises(ConfigError) as e:
        build_config(raw, list(overrides))
    msg = str(e.value)
    assert len(msg.splitlines()) == 1, msg
    return msg


# ---- unknown algorithm keys ---------------------------------------------------------------------

def test_switching_to_an_algorithm_without_parameters_names_the_allowed_keys():
    raw = tiny_raw(algorithm={"name": "fedlga", "grad_source": "last"})
    assert error(raw, "algorithm.name=fedavg") == \
        "algorithm.grad_source: unknown key; fedavg takes no parameters (allowed: name, weighting)"


def test_unknown_key_of_an_algorithm_with_parameters_lists_them():
    raw = tiny_raw(algorithm={"name": "fedlga"})
    assert error(raw, "algorithm.mu=0.1") == \
        "algorithm.mu: unknown key; allowed for fedlga: name, weighting, reading, grad_source, damping, fallback"


@pytest.mark.parametrize("name", available())
def test_every_algorithm_names_its_own_keys_on_an_unknown_one(name):
    msg = error(tiny_raw(algorithm={"name": name, "no_such_key": 1}, server_data={"fraction": 0.1}))
    assert msg.startswith("algorithm.no_such_key: unknown key; ")
    assert not msg.endswith((": ", "allowed: ")), msg
    for key in ("name", "weighting", *get_algorithm_class(name).Params.model_fields):
        assert key in msg.split("; ", 1)[1], (key, msg)


# ---- inf and nan ------------------------------------------------------------------------------

@pytest.mark.parametrize("override", [
    "local.lr=inf", "local.lr=.inf", "server.lr=inf", "server.momentum=-.inf", "server_data.lr=inf",
    "data.partition.alpha=.inf", "heterogeneity.deadline=inf", "local.lr=nan",
])
def test_non_finite_numbers_are_refused(override):
    key = override.split("=")[0]
    assert error(tiny_raw(), override).startswith(f"{key}: Input should be a finite number")


@pytest.mark.parametrize("algorithm,override", [
    ("fedlga", "algorithm.damping=inf"), ("fedprox", "algorithm.mu=.inf"), ("fedcm", "algorithm.alpha=nan"),
    ("fedmax_k", "algorithm.k=inf"),   # k's own validator would raise OverflowError on int(inf)
    ("fedsoftmax", "algorithm.temperature=.inf"),
])
def test_algorithm_parameters_refuse_non_finite_numbers(algorithm, override):
    key = override.split("=")[0]
    msg = error(tiny_raw(algorithm={"name": algorithm}), override)
    assert msg.startswith(f"{key}: Input should be a finite number"), msg


def test_large_finite_values_and_null_defaults_still_work():
    cfg = build_config(tiny_raw(algorithm={"name": "fedmax_k"}),
                       ["data.partition.kind=dirichlet", "data.partition.alpha=1e9", "local.lr=1e30",
                        "heterogeneity.kind=profiles", "heterogeneity.deadline=null", "algorithm.k=1e300"])
    assert cfg.data.partition.alpha == 1e9 and cfg.local.lr == 1e30 and cfg.heterogeneity.deadline is None
    assert cfg.algorithm.params.k == 1e300 and math.isfinite(cfg.algorithm.params.k)


# ---- build_config does not write into its input ------------------------------------------------

def test_overrides_do_not_leak_into_the_callers_dict_or_the_next_build():
    base = tiny_raw()
    before = yaml.safe_dump(base)
    assert build_config(base, ["heterogeneity.kind=uniform", "data.partition.kind=iid"]).heterogeneity.kind \
        == "uniform"
    assert yaml.safe_dump(base) == before
    cfg = build_config(base, ["seed=1"])
    assert cfg.heterogeneity.kind == "stragglers" and cfg.data.partition.kind == "classes" and cfg.seed == 1


# ---- layering: errors <- registry <- config; algorithms imported lazily -------------------------

@pytest.mark.parametrize("module", ["fedsweep.config.schema", "fedsweep.algorithms", "fedsweep.config.registry",
                                    "fedsweep.algorithms.fedlga", "fedsweep.sim.heterogeneity"])
def test_modules_import_alone_without_a_cycle(module):
    code = (f"import sys, {module}; "
            "loaded = sorted(m for m in sys.modules if m.startswith('fedsweep.algorithms.')); print(loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    if module in ("fedsweep.config.schema", "fedsweep.algorithms", "fedsweep.config.registry"):
        assert out.strip() == "[]"   # the algorithm modules load on the first lookup, not at import


def test_config_error_and_registry_have_one_home():
    import fedsweep.algorithms as algorithms
    import fedsweep.config.schema as config
    import fedsweep.util.errors as errors
    import fedsweep.config.registry as registry
    assert config.ConfigError is errors.ConfigError is registry.ConfigError
    assert algorithms.get_algorithm_class is registry.get_algorithm_class
    assert algorithms.register is registry.register and algorithms.available is registry.available
    with pytest.raises(errors.ConfigError, match="algorithm.name: unknown algorithm 'fedfoo'"):
        registry.get_algorithm_class("fedfoo")


# ---- sweep files: `fedsweep tune --dry-run` refuses them in one line ----------------------------

SWEEP = {
    "base": {"rounds": 4, "clients_per_round": 4, "device": "cpu",
             "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "classes"}},
             "model": {"name": "mlp", "options": {"hidden": 16}}, "local": {"steps": 4, "batch_size": 5, "lr": 0.1},
             "heterogeneity": {"kind": "stragglers", "rho": 0.5}, "eval": {"every": 2}},
    "grid": {"local.lr": [0.1, 0.2]},
    "methods": {"fedavg": {}, "fedlga": {"algorithm.damping": [1.0]}},
    "seeds": [0],
}


def dry_run(tmp_path, capsys, **over):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "name": "s", **over}))
    code = main(["tune", str(path), "--dry-run"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


@pytest.mark.parametrize("over,needle", [
    ({"seeds": []}, "seeds: List should have at least 1 item"),
    ({"grid": {"local.lr": []}}, "grid key local.lr: empty list of values"),
    ({"grid": []}, "grid: Input should be a valid dictionary"),
    ({"methods": {"fedlga": {"algorithm.damping": []}}}, "grid key algorithm.damping: empty list of values"),
    ({"scheduler": {"kind": "asha", "metric": "test/acc"}},
     "scheduler.metric: 'test/acc' is not a metric trials report; allowed: test/accuracy, test/loss, "
     "best/test_accuracy"),
    ({"scheduler": {"metric": "round"}}, "scheduler.metric: 'round' is not a metric trials report"),
    ({"scheduler": {"reduction_factor": math.inf}}, "scheduler.reduction_factor: Input should be a finite number"),
    ({"grid": {"server.lr": [1.0, math.inf]}}, "server.lr: Input should be a finite number"),
])
def test_bad_sweep_is_one_line_naming_the_key(tmp_path, capsys, monkeypatch, over, needle):
    monkeypatch.chdir(tmp_path)
    code, _, err = dry_run(tmp_path, capsys, **over)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert needle in err and "Traceback" not in err, err


@pytest.mark.parametrize("metric", ["test/accuracy", "test/loss", "best/test_accuracy"])
def test_scheduler_metrics_the_trials_report_pass_the_dry_run(tmp_path, capsys, monkeypatch, metric):
    monkeypatch.chdir(tmp_path)
    mode = "min" if metric == "test/loss" else "max"
    code, out, _ = dry_run(tmp_path, capsys, scheduler={"kind": "asha", "metric": metric, "mode": mode})
    assert code == 0 and "s: 4 trials" in out


def test_sweep_seeds_and_base_are_not_shared_between_trials(tmp_path):
    from fedsweep.sweep.spec import expand, load_sweep
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "name": "s", "seeds": None,
                                    "grid": {"heterogeneity.kind": ["uniform", "stragglers"]}}))
    sweep = load_sweep(path)
    base = yaml.safe_dump(sweep.base)
    trials = expand(sweep)
    assert yaml.safe_dump(sweep.base) == base
    assert [t.config.heterogeneity.kind for t in trials] == ["uniform", "stragglers"] * 2
    assert {t.seed for t in trials} == {0}     # no seeds: base.seed (default 0)
