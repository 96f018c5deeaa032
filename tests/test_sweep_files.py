"""Sweep files and run configs mean exactly what they say: a mapping merges into its section, keys that
would run other trials than written are refused in one line naming where, YAML's duplicate keys and
layout mistakes name their line, and `--dry-run` says at once how many trials there are."""
import pytest
import yaml

from fedsweep.cli import main
from fedsweep.config.schema import ConfigError, build_config
from fedsweep.sweep.dryrun import trial_table
from fedsweep.sweep.spec import drawn_payload, expand, load_sweep, run_name, trial_count, varying_keys
from conftest import tiny_raw

BASE = {"rounds": 4, "clients_per_round": 4, "device": "cpu",
        "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "classes"}},
        "model": {"name": "mlp", "options": {"hidden": 16}}, "local": {"steps": 3, "batch_size": 5, "lr": 0.1},
        "heterogeneity": {"kind": "stragglers", "rho": 0.5}, "eval": {"every": 2}}


def sweep_file(tmp_path, text: str = "", **spec) -> str:
    """A sweep file: ``text`` as written (for YAML mistakes), else ``spec`` over a one-method sweep of BASE."""
    path = tmp_path / "s.yaml"
    path.write_text(text or yaml.safe_dump({"name": "s", "base": BASE, "seeds": [0], **spec}, sort_keys=False))
    return str(path)


def refused(capsys, argv) -> str:
    """``fedsweep ARGV`` must exit 2 with one line on stderr and no traceback; returns that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("fedsweep: error: ")
    return err


def trials_of(tmp_path, **spec):
    return expand(load_sweep(sweep_file(tmp_path, **spec)))


# ---- a mapping given for a section merges into it ----------------------------------------------

def test_a_mapping_in_a_grid_sets_only_the_keys_it_names(tmp_path):
    trials = trials_of(tmp_path, grid={"local": [{"lr": 0.2}, {"lr": 0.3}]})
    assert [(t.config.local.lr, t.config.local.steps, t.config.local.batch_size) for t in trials] == \
        [(0.2, 3, 5), (0.3, 3, 5)]      # base's steps and batch size kept (they used to go back to 5 and 10)


def test_a_mapping_covaries_its_keys_and_its_trials_are_told_apart(tmp_path):
    trials = trials_of(tmp_path, grid={"local": [{"lr": 0.1, "steps": 2}, {"lr": 0.05, "steps": 4}],
                                       "server.lr": [0.5, 1.0]})
    assert [(t.config.local.lr, t.config.local.steps) for t in trials] == [(0.1, 2)] * 2 + [(0.05, 4)] * 2
    varying = varying_keys(trials)
    assert varying == ["local", "server.lr"]
    names = [run_name(t, varying) for t in trials]
    assert names[0] == "fedavg ηl0.1,E2 ηg0.5" and len(set(names)) == 4
    assert len({t.label for t in trials}) == len({t.config_id for t in trials}) == 4
    table = trial_table(trials).splitlines()
    assert "{'lr': 0.05, 'steps': 4}" in table[4]


def test_a_partial_partition_is_named_as_the_trial_resolves_it(tmp_path):
    base = {**BASE, "data": {**BASE["data"], "partition": {"kind": "dirichlet", "alpha": 0.5}}}
    trials = trials_of(tmp_path, base=base, grid={"data.partition": [{"alpha": 0.3}, {"alpha": 1.0}]})
    assert [t.config.data.partition.kind for t in trials] == ["dirichlet", "dirichlet"]
    assert [run_name(t, varying_keys(trials)) for t in trials] == ["fedavg dir0.3", "fedavg dir1"]


def test_a_method_grid_mapping_keeps_the_base_algorithms_parameters(tmp_path):
    base = {**BASE, "algorithm": {"name": "fedlga", "damping": 1.0}}
    trials = trials_of(tmp_path, base=base, methods={"fedlga": {"algorithm": [{"reading": "continuation"},
                                                                                {"name": "fedlga"}]}})
    assert [(t.config.algorithm.reading, t.config.algorithm.damping) for t in trials] == \
        [("continuation", 1.0), ("extrapolation", 1.0)]


def test_set_and_drawn_values_merge_the_same_way(tmp_path):
    cfg = build_config(tiny_raw(), ["local={lr: 0.3}"])
    assert (cfg.local.lr, cfg.local.steps, cfg.local.batch_size) == (0.3, 4, 5)
    search = {"num_samples": 4, "space": {"local": {"choice": [{"lr": 0.2}, {"lr": 0.4, "steps": 2}]}}}
    trials = trials_of(tmp_path, search=search)
    assert {(t.config.local.lr, t.config.local.steps) for t in trials} <= {(0.2, 3), (0.4, 2)}
    # optuna: a slot's values drawn when it starts go into its payload's config the same way
    trials = trials_of(tmp_path, search={"searcher": "optuna", "num_samples": 2, "space": {
        "local": {"choice": [{"lr": 0.2, "steps": 2}, {"lr": 0.4, "steps": 4}]}}})
    t = trials[0]
    payload = {"run": t.config.model_dump(mode="json"), "overrides": t.overrides, "index": t.index,
               "method": t.method, "seed": t.seed, "varying": varying_keys(trials)}
    drawn = drawn_payload(payload, {"local": {"lr": 0.4, "steps": 4}})
    assert {k: drawn["run"]["local"][k] for k in ("lr", "steps", "batch_size")} == {"lr": 0.4, "steps": 4,
                                                                                  "batch_size": 5}


def test_optuna_refuses_choices_of_mappings_with_different_keys(tmp_path, capsys):
    search = {"searcher": "optuna", "num_samples": 2,
              "space": {"local": {"choice": [{"lr": 0.2}, {"lr": 0.4, "steps": 2}]}}}
    err = refused(capsys, ["tune", sweep_file(tmp_path, search=search), "--dry-run"])
    assert "search.space: local: with `searcher: optuna` every mapping of a choice names the same keys" in err


# ---- keys that would run other trials than written ---------------------------------------------

@pytest.mark.parametrize("spec,needle", [
    ({"grid": {"algorithm.name": ["fedavg", "fedprox"]}}, "grid: algorithm.name: would choose the algorithm; a "
     "sweep's algorithms are its methods, one entry each under `methods:` (e.g. methods: {fedavg: {}, fedprox: "),
    ({"grid": {"algorithm": [{"name": "fedprox", "mu": 0.1}]}},
     "grid: algorithm: its `name` would choose the algorithm"),
    ({"methods": {"fedavg": {"algorithm.name": ["fedprox"]}}},
     "methods.fedavg: algorithm.name: 'fedprox' is not this method's algorithm; a sweep's algorithms are its methods"),
    ({"methods": {"fedlga": {"algorithm": [{"name": "fedlga"}, {"name": "fedavg"}]}}},
     "methods.fedlga: algorithm: 'fedavg' is not this method's algorithm"),
    ({"search": {"num_samples": 2, "space": {"algorithm.name": {"choice": ["fedavg", "fedprox"]}}}},
     "search.space: algorithm.name: would choose the algorithm"),
    ({"grid": {"seed": [0, 1]}}, "grid: seed: repeats of every config go under `seeds:`"),
    ({"methods": {"fedavg": {"seed": [1]}}}, "methods.fedavg: seed: repeats of every config go under `seeds:`"),
    ({"search": {"num_samples": 2, "space": {"seed": {"randint": [0, 9]}}}}, "search.space: seed: repeats"),
    ({"grid": {"mlflow.experiment": ["a", "b"]}}, "grid: mlflow.experiment: no trial uses its mlflow keys: the driver "
     "logs every trial to the sweep's one MLflow store and experiment (its top-level `mlflow:`)"),
    ({"grid": {"mlflow": [{"log_model": False}]}}, "grid: mlflow: no trial uses its mlflow keys"),
    ({"grid": {"local.lr": [0.1]}, "methods": {"fedavg": {"local.lr": [0.3]}}},
     "local.lr is given in both grid and methods.fedavg; a config key may be given once across grid, methods "
     "and search.space"),
    ({"grid": {"local": [{"lr": 0.1}], "local.lr": [0.2]}}, "local.lr (grid) is inside local (grid)"),
    ({"grid": {"data.partition.kind": ["iid"]}, "methods": {"fedavg": {"data.partition": [{"kind": "classes"}]}}},
     "data.partition.kind (grid) is inside data.partition (methods.fedavg)"),
    ({"grid": {"local.lr": [0.1]}, "search": {"num_samples": 2, "space": {"local.lr": {"uniform": [0.1, 0.2]}}}},
     "local.lr is given in both grid and search.space"),
    ({"methods": {"fedprox": {"algorithm": [{"mu": 0.1}], "algorithm.mu": {"uniform": [0.1, 0.2]}}},
      "search": {"num_samples": 2}}, "algorithm.mu (methods.fedprox) is inside algorithm (methods.fedprox)"),
])
def test_a_key_that_would_run_other_trials_is_refused_naming_where(tmp_path, capsys, spec, needle):
    err = refused(capsys, ["tune", sweep_file(tmp_path, **spec), "--dry-run"])
    assert needle in err, err


def test_a_method_may_name_its_own_algorithm_in_its_grid(tmp_path):
    trials = trials_of(tmp_path, methods={"fedlga": {"algorithm": [{"name": "fedlga"}, {"reading": "projection"}]}})
    assert [(t.method, t.config.algorithm.name) for t in trials] == [("fedlga", "fedlga")] * 2


@pytest.mark.parametrize("spec,needle", [
    ({"grid": {"local.lrr": [0.1]}}, "s.yaml: grid: local.lrr: unknown key; allowed here: steps, unit"),
    ({"grid": {"local": [{"stepz": 2}]}}, "s.yaml: grid: local: local.stepz: unknown key"),
    ({"methods": {"fedavg": {"algorithm.damping": [1.0]}}}, "s.yaml: methods.fedavg: algorithm.damping: unknown key"),
    ({"methods": {"fedfoo": {}}}, "s.yaml: methods: algorithm.name: unknown algorithm 'fedfoo'"),
    ({"seeds": [0, -1]}, "s.yaml: seeds: seed: Input should be greater than or equal to 0"),
])
def test_a_bad_value_names_where_the_file_gives_it(tmp_path, capsys, spec, needle):
    err = refused(capsys, ["tune", sweep_file(tmp_path, **spec), "--dry-run"])
    assert needle in err, err


# ---- YAML as written ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,needle", [
    ("name: s\nbase: {rounds: 2, rounds: 3}\n", "s.yaml:2: duplicate key 'rounds' (first at line 2); a key may "
     "appear once in a mapping"),
    ("name: s\nbase:\n  local: {lr: 0.1}\n  rounds: 2\n  local:\n    steps: 3\n",
     "s.yaml:5: duplicate key 'local' (first at line 3); a key may appear once in a mapping"),
    ("name: s\nbase: {}\ngrid:\n  local.lr: [0.1]\n  local.lr: [0.2]\n", "s.yaml:5: duplicate key 'local.lr' "
     "(first at line 4)"),
    ("name: s\nbase:\n\trounds: 2\n", "s.yaml:3: a tab (column 1); YAML indents with spaces, never tabs"),
    ("name: s\nbase:\n  rounds: 2\n local: {}\n", "s.yaml:4: not valid YAML: this line's indentation matches no "
     "mapping or list above it"),
    ("name: s\nbase: {rounds: 2\n", "s.yaml:3: not valid YAML: expected ',' or '}'"),
    # a "billion laughs": nine levels of an alias used ten times, 1.2e10 values once expanded (0.003 s)
    ("name: s\nbase: {}\na: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]\n" for i in range(9)),
     "s.yaml: its aliases (*name) expand to more than 1,000,000 values (1.23e+10)"),
    ("name: s\nbase: {}\nloop: &l [1, *l]\n", "s.yaml: an alias (*name) refers to a value that holds it"),
    ("name: s\nbase: {}\ndeep: " + "[" * 5000 + "]" * 5000 + "\n", "s.yaml: nests deeper than a YAML file can be read"),
])
def test_yaml_mistakes_in_a_sweep_file_name_their_line(tmp_path, capsys, text, needle):
    err = refused(capsys, ["tune", sweep_file(tmp_path, text), "--dry-run"])
    assert needle in err, err


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    text = "name: s\nshared: &l {lr: 0.1, steps: 2}\nbase:\n  local:\n    <<: *l\n    lr: 0.3\n"
    from fedsweep.config.schema import load_yaml
    path = tmp_path / "m.yaml"
    path.write_text(text)
    assert load_yaml(path)["base"]["local"] == {"lr": 0.3, "steps": 2}


def test_run_configs_and_set_values_refuse_duplicate_keys(tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text("rounds: 2\nlocal:\n  lr: 0.1\nrounds: 3\n")
    assert "cfg.yaml:4: duplicate key 'rounds' (first at line 1)" in refused(capsys, ["run", str(path)])
    path.write_text(yaml.safe_dump(tiny_raw()))
    err = refused(capsys, ["config", str(path), "--set", "local={lr: 0.1, lr: 0.2}"])
    assert "--set local={lr: 0.1, lr: 0.2}: duplicate key 'lr'; a key may appear once in a mapping" in err
    assert main(["config", str(path), "--set", "mlflow.run_name=a: b: c"]) == 0   # not YAML: the string as given
    assert "run_name: 'a: b: c'" in capsys.readouterr().out


# ---- fedsweep run: an empty file, a sweep file -------------------------------------------------

def test_an_empty_run_config_is_refused_and_braces_run_every_default(tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text("# nothing yet\n")
    err = refused(capsys, ["run", str(path)])
    assert "cfg.yaml: the file is empty (or holds only comments)" in err and "`{}` to run every default" in err
    path.write_text("{}\n")
    assert main(["config", str(path)]) == 0 and "rounds: 50" in capsys.readouterr().out
    path.write_text("\n")
    assert "cfg.yaml: the file is empty (or holds only comments); a sweep file needs a `base:`" in \
        refused(capsys, ["tune", str(path), "--dry-run"])


def test_run_of_a_sweep_file_says_it_runs_the_base_only(tmp_path, capsys):
    path = sweep_file(tmp_path, base={**tiny_raw(), "rounds": 1}, grid={"local.lr": [0.1, 0.2]},
                      methods={"fedavg": {}, "fedprox": {}})
    assert main(["run", path, "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fedsweep: note: {path} is a sweep file: running its base config only (its grid, methods and "
                   f"seeds are for `fedsweep tune {path}`)"]
    assert "local.lr: Input should be a valid number" in refused(capsys, ["run", path, "--set", "local.lr=fast"])


# ---- --dry-run of a large grid -----------------------------------------------------------------

def big_grid(n: int) -> dict:
    return {"local.lr": [round(0.01 * (i + 1), 4) for i in range(n)], "server.lr": [0.5, 1.0]}


def test_dry_run_counts_first_shows_100_rows_and_all_with_all(tmp_path, capsys, monkeypatch):
    import fedsweep.sweep.dryrun as dryrun
    monkeypatch.setattr(dryrun, "PROGRESS_EVERY_S", 0.0)     # a progress line at every config
    path = sweep_file(tmp_path, grid=big_grid(40), methods={"fedavg": {}, "fedprox": {"algorithm.mu": [0.1, 1.0]}},
                      seeds=[0, 1])
    assert trial_count(load_sweep(path)) == len(expand(load_sweep(path))) == 480
    assert main(["tune", path, "--dry-run"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == "s: 480 trials"
    assert lines[1].split() == ["#", "method", "algorithm.mu", "local.lr", "server.lr", "seed", "config_id"]
    assert len(lines) == 2 + 1 + 100 + 1 and lines[-2].startswith("99 ")
    assert lines[-1] == f"... and 380 more trials: `fedsweep tune {path} --dry-run --all` prints every one"
    progress = captured.err.splitlines()
    assert progress[0] == "checked 2 of 480 trial configs" and progress[-1] == "checked 480 of 480 trial configs"
    assert main(["tune", path, "--dry-run", "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 + 480 and lines[-1].startswith("479 ")
    err = refused(capsys, ["tune", path, "--all"])
    assert "--all: it prints every row of --dry-run's trial table; give it with --dry-run" in err


def test_seed_copies_are_the_configs_a_full_validation_gives(tmp_path):
    methods = {"fedavg": {}, "fedprox": {"algorithm.mu": [0.1]}}
    sweep = load_sweep(sweep_file(tmp_path, grid={"local": [{"lr": 0.2}], "heterogeneity.rho": [0.5, 0.75]},
                                  methods=methods, seeds=[3, 1, 2]))
    trials = expand(sweep)
    assert len(trials) == trial_count(sweep) == 12
    assert [t.seed for t in trials[:3]] == [3, 1, 2]
    for t in trials:
        raw = {**BASE}
        full = build_config(raw, [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}"
                                  for k, v in t.overrides.items()])
        assert t.config.model_dump() == full.model_dump()


def test_a_config_error_is_a_config_error_in_process(tmp_path):
    with pytest.raises(ConfigError, match="grid: seed: repeats"):
        load_sweep(sweep_file(tmp_path, grid={"seed": [0, 1]}))
