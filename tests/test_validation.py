"""The validation split (`data.validation_fraction`, `data.validation`; fedsweep/data/validation.py): how
it is drawn, its metrics at every evaluation, the run summary's validation numbers, what a trial reports
to Tune, and the one-line refusals."""
from __future__ import annotations

import hashlib
import math
import re

import numpy as np
import pytest
import torch
import yaml

from conftest import engine_runs, tiny_raw
from fedsweep.cli import main
from fedsweep.config.schema import ConfigError, build_config
from fedsweep.data import load_federated, split_federated
from fedsweep.runs.module import FederatedModule
from fedsweep.runs.run import summarize, train
from fedsweep.runs.tracking import summary_metrics
from fedsweep.sweep.pack import train_packed
from fedsweep.sweep.trainable import headline
from test_pack import assert_members_match
from test_tune import TINY, trial_runs, write_sweep

# Every dataset made in memory, with and without train_size and the hybrid server pool.
SETUPS = {
    "digits": ({"name": "digits", "num_clients": 8, "partition": {"kind": "classes"}}, {}),
    "digits server pool": ({"name": "digits", "num_clients": 8, "train_size": 1000,
                            "partition": {"kind": "dirichlet", "alpha": 0.3}}, {"fraction": 0.05}),
    "mnist_5k": ({"name": "mnist_5k", "num_clients": 10, "train_size": 1200, "partition": {"kind": "shards",
                                                                                             "shard_size": 40}}, {}),
    "synthetic": ({"name": "synthetic", "num_clients": 8}, {}),
    "synthetic server pool": ({"name": "synthetic", "num_clients": 8}, {"fraction": 0.05}),
}


def config(data: dict, server: dict | None = None, seed: int = 3, **over):
    raw = tiny_raw(data=data, **over)
    raw["seed"] = seed
    if server:
        raw["server_data"] = server
    return build_config(raw)


def split(data: dict, server: dict | None = None, seed: int = 3):
    cfg = config(data, server, seed)
    return split_federated(cfg.data, cfg.seed, cfg.server_data)


def held_out(s) -> np.ndarray:
    """Every validation sample of a split (central, or all clients' federated ones)."""
    return s.val if s.val is not None else np.concatenate(s.val_parts)


def error(raw: dict) -> str:
    with pytest.raises(ConfigError) as e:
        cfg = build_config(raw)
        split_federated(cfg.data, cfg.seed, cfg.server_data)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1, msg
    return msg


# ---- the split ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["central", "federated"])
@pytest.mark.parametrize("setup", SETUPS)
def test_train_validation_and_test_are_disjoint_and_together_the_training_pool(setup, kind):
    data, server = SETUPS[setup]
    without = split(data, server)
    pool = np.concatenate([*without.parts, without.pool if without.pool is not None else []]).astype(np.int64)
    s = split({**data, "validation_fraction": 0.2, "validation": kind}, server)
    val = held_out(s)
    together = np.concatenate([*s.parts, s.pool if s.pool is not None else [], val]).astype(np.int64)
    assert len(np.unique(together)) == len(together)           # no sample in two places
    assert set(together.tolist()) == set(pool.tolist())        # and every one in use somewhere
    assert all(len(p) for p in s.parts) and len(val) > 0
    if s.pool is not None:
        assert np.array_equal(s.pool, without.pool)            # the server pool is taken first
    # test is its own split, untouched: validation samples index the training samples only
    assert len(s.source.y_test) == len(without.source.y_test) and val.max() < len(s.source.y_train)
    cfg = config({**data, "validation_fraction": 0.2, "validation": kind}, server)
    d = load_federated(cfg.data, cfg.seed, cfg.server_data)
    if kind == "central":
        assert torch.equal(d.x_val, d.x_train[torch.from_numpy(val)]) and d.val_indices is None
    else:
        assert d.x_val is None and all(np.array_equal(a.numpy(), b) for a, b in zip(d.val_indices, s.val_parts))
    assert d.describe().endswith(f", validation 20% {kind} ({len(val)})")


def test_a_central_split_is_stratified_and_takes_its_share():
    for data, server in SETUPS.values():
        without, s = split(data, server), split({**data, "validation_fraction": 0.15}, server)
        labels = np.asarray(s.source.y_train)
        candidates = np.concatenate(without.parts)                # the samples the clients would hold
        n_val = len(s.val)
        assert n_val == math.ceil(0.15 * len(candidates))
        share = np.bincount(labels[candidates], minlength=20) * n_val / len(candidates)
        assert np.all(np.abs(np.bincount(labels[s.val], minlength=20) - share) < 1)


def test_each_client_keeps_its_share_of_its_own_samples_stratified():
    data = {"name": "digits", "num_clients": 8, "partition": {"kind": "dirichlet", "alpha": 0.5}}
    without, s = split(data), split({**data, "validation_fraction": 0.1, "validation": "federated"})
    labels = np.asarray(s.source.y_train)
    for before, train_part, val in zip(without.parts, s.parts, s.val_parts):
        assert sorted([*train_part, *val]) == sorted(before)
        assert list(train_part) == [i for i in before if i not in set(val)]   # its order kept
        assert len(val) == math.ceil(0.1 * len(before))
        share = np.bincount(labels[before], minlength=10) * len(val) / len(before)
        assert np.all(np.abs(np.bincount(labels[val], minlength=10) - share) < 1)


def test_a_client_of_one_sample_keeps_it_for_training():
    data = {"name": "digits", "num_clients": 8, "train_size": 9, "partition": {"kind": "iid"},
            "validation_fraction": 0.3, "validation": "federated"}
    s = split(data)
    sizes = [(len(p), len(v)) for p, v in zip(s.parts, s.val_parts)]
    assert sorted(sizes) == [(1, 0)] * 7 + [(1, 1)]              # the client of two keeps one of each


def test_the_central_split_is_the_same_for_every_algorithm_and_partition_at_a_seed():
    base = {"name": "digits", "validation_fraction": 0.1}
    splits = [split({**base, "num_clients": n, "partition": p}).val
              for n, p in [(8, {"kind": "classes"}), (20, {"kind": "iid"}), (8, {"kind": "dirichlet", "alpha": 0.2}),
                           (10, {"kind": "shards", "shard_size": 30}), (12, {"kind": "quantity"})]]
    assert all(np.array_equal(splits[0], v) for v in splits[1:])
    assert not np.array_equal(splits[0], split(base, seed=4).val)          # another seed, other samples
    modules = [FederatedModule(config({**base, "num_clients": 8}, algorithm={"name": name}))
               for name in ("fedavg", "scaffold", "fedlga")]
    for m in modules[1:]:
        assert torch.equal(m.data.x_val, modules[0].data.x_val) and torch.equal(m.data.y_val, modules[0].data.y_val)


# ---- bit for bit without it -----------------------------------------------------------------------

# Recorded before the validation split existed (2026-11-26, 2-core x86_64, torch 2.14.1, numpy's PCG64):
# each config's split (its clients' and server pool's indices: integer draws, the same on any machine)
# and its final model after 3 rounds (floats: the same on a machine of that kind, docs/design.md §2.7).
RECORDED = {
    "fedavg digits": ({}, "vectorized", "d0bb81f1137f9228", "201c8b8d850e3aca"),
    "scaffold dirichlet": ({"algorithm": {"name": "scaffold"}, "data": {
        "name": "digits", "num_clients": 8, "partition": {"kind": "dirichlet", "alpha": 0.3}}},
        "loop", "145510bfec10d504", "c20d1c2ad9b2b252"),
    "fedlga mnist_5k train_size": ({"algorithm": {"name": "fedlga"}, "data": {
        "name": "mnist_5k", "num_clients": 8, "train_size": 400, "partition": {"kind": "classes"}}},
        "vectorized", "56b79b27dbd4e484", "c20bf018f2c69ad2"),
    "fedclg_c server pool": ({"algorithm": {"name": "fedclg_c"}, "server_data": {"fraction": 0.05}},
                             "vectorized", "7d3f30f43ff96150", "75faf6fc4b9028cc"),
    "clg_sgd synthetic server pool": ({"algorithm": {"name": "clg_sgd"}, "server_data": {"fraction": 0.05},
                                       "data": {"name": "synthetic", "num_clients": 8}},
                                      "loop", "7e9cd5d0e17d84f5", "e91e6d6f5c55c04a"),
}


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("name", RECORDED)
def test_no_validation_split_gives_the_numbers_of_before(name):
    over, engine, split_digest, _model_digest = RECORDED[name]
    raw = {**tiny_raw(), **over, "engine": engine}
    raw["data"] = {**raw["data"], "validation_fraction": 0}
    cfg = build_config(raw)
    s = split_federated(cfg.data, cfg.seed, cfg.server_data)
    assert s.val is None and s.val_parts is None
    assert _digest(*s.parts, s.pool if s.pool is not None else np.zeros(0)) == split_digest
    m = train(cfg, progress=False)
    # The trained model's floats matched model_digest too, recorded on the 2-core x86_64 machine with
    # torch 2.14.1 (2026-11-26): not asserted, as other CPUs' kernels round differently.
    assert not any(k.startswith("val/") for h in m.history for k in h)


# ---- evaluation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["central", "federated"])
def test_val_metrics_come_with_every_evaluation(kind):
    data = {**tiny_raw()["data"], "validation_fraction": 0.2, "validation": kind}
    m = train(config(data, rounds=5, eval={"every": 2}), progress=False)
    assert [h["round"] for h in m.history if "val/accuracy" in h] == [2, 4, 5]
    for h in m.history:
        assert ("val/accuracy" in h) == ("val/loss" in h) == ("test/accuracy" in h)
    assert all(0 <= h["val/accuracy"] <= 1 and math.isfinite(h["val/loss"]) for h in m.history if "val/loss" in h)


def test_federated_clients_read_are_drawn_per_seed_and_round():
    data = {"name": "digits", "num_clients": 20, "partition": {"kind": "iid"},
            "validation_fraction": 0.2, "validation": "federated"}
    one, again = (FederatedModule(config(data, clients_per_round=4, eval={"validation_clients": 5})) for _ in "ab")
    drawn = [one.validation_samples(t) for t in range(6)]
    assert all(torch.equal(a, again.validation_samples(t)) for t, a in enumerate(drawn))   # a pure function
    assert len({tuple(a.tolist()) for a in drawn}) == 6                                     # of the round too
    for a in drawn:                                             # the pooled samples of 5 whole clients
        whole = [v for v in one.data.val_indices if set(v.tolist()) <= set(a.tolist())]
        assert len(whole) == 5 and sum(map(len, whole)) == len(a)
    other = FederatedModule(config(data, seed=4, clients_per_round=4, eval={"validation_clients": 5}))
    assert not torch.equal(other.validation_samples(0), drawn[0])
    every = FederatedModule(config(data, clients_per_round=4))
    assert sorted(every.validation_samples(0).tolist()) == sorted(torch.cat(list(every.data.val_indices)).tolist())


@pytest.mark.parametrize("kind", ["central", "federated"])
def test_loop_and_vectorized_engines_agree_on_the_val_metrics(kind):
    data = {**tiny_raw()["data"], "validation_fraction": 0.2, "validation": kind}
    over = {"data": data, **({"eval": {"every": 1, "validation_clients": 3}} if kind == "federated" else {})}
    loop, _ = engine_runs(over, keys=("val/accuracy", "val/loss", "test/accuracy"))
    assert all("val/accuracy" in h for h in loop.history)


def test_a_packs_members_equal_their_unpacked_runs_with_validation():
    data = {**tiny_raw()["data"], "validation_fraction": 0.2}
    cfgs = [config({**data, "validation": kind}, seed=seed, algorithm={"name": name}, eval=ev)
            for kind, seed, name, ev in [("central", 3, "fedavg", {"every": 1}), ("central", 4, "fedlga", {"every": 2}),
                                         ("federated", 3, "fedavg", {"every": 1, "validation_clients": 3}),
                                         ("federated", 5, "scaffold", {"every": 1})]]
    packed = train_packed(cfgs)
    assert all("val/accuracy" in m.history[-1] for m in packed.members)
    assert_members_match(cfgs, packed)


# ---- the summary and what a trial reports ------------------------------------------------------------

def _rows(*evals):
    """A history of evaluated rounds: (round, test accuracy, val accuracy or None)."""
    return [{"round": r, "round/seconds": 0.1, "comm/up_models": 1.0, "comm/down_models": 1.0,
             "compute/grad_evals": 1.0, "train/loss": 1.0, "test/accuracy": t, "test/loss": 1.0,
             **({"val/accuracy": v, "val/loss": 1.0} if v is not None else {})} for r, t, v in evals]


def test_the_summary_scores_a_run_where_validation_would_stop_it():
    cfg = config(tiny_raw()["data"], eval={"target_accuracy": 0.5})
    history = _rows((1, 0.30, 0.40), (2, 0.60, 0.55), (3, 0.70, 0.55), (4, 0.80, 0.45))
    s = summarize(cfg, history)
    assert (s["best_val_accuracy"], s["best_val_round"], s["test_accuracy_at_best_val"]) == (0.55, 2, 0.60)
    assert (s["final_val_accuracy"], s["val_rounds_to_target"], s["rounds_to_target"]) == (0.45, 2, 2)
    metrics = {m.key: m.value for m in summary_metrics(s, 0)}
    assert metrics["best/val_accuracy"] == 0.55 and metrics["val_rounds_to_target"] == 2
    assert metrics["summary/test_accuracy_at_best_val"] == 0.60 and metrics["summary/best_val_round"] == 2
    never = summarize(config(tiny_raw()["data"], eval={"target_accuracy": 0.7}), history)
    assert never["val_rounds_to_target"] is None and never["rounds_to_target"] == 3
    assert "val_rounds_to_target" not in {m.key for m in summary_metrics(never, 0)}
    plain = summarize(cfg, _rows((1, 0.3, None), (2, 0.6, None)))
    assert all(plain[k] is None for k in ("best_val_accuracy", "best_val_round", "test_accuracy_at_best_val",
                                          "final_val_accuracy", "val_rounds_to_target"))
    assert not [m.key for m in summary_metrics(plain, 0) if "val_" in m.key or "/val" in m.key]


def test_a_diverged_run_has_its_val_numbers_as_its_test_ones():
    data = {**tiny_raw()["data"], "validation_fraction": 0.2}
    m = train(config(data, local={"steps": 4, "batch_size": 5, "lr": 1e30}), progress=False)
    s = summarize(m.cfg, m.history, m.diverged)
    assert s["status"] == "diverged" and s["diverged_round"] == 1
    assert s["best_test_accuracy"] is not None and s["best_val_accuracy"] is not None
    assert s["best_val_round"] == 1 and s["test_accuracy_at_best_val"] == s["best_test_accuracy"]


def test_a_trials_reports_carry_the_val_metrics_only_with_a_validation_split():
    data = {**tiny_raw()["data"], "validation_fraction": 0.2}
    cfgs = [config(data, seed=s, rounds=4, eval={"target_accuracy": 0.15}) for s in (3, 4)]
    members = train_packed(cfgs).members
    val = headline(list(members), "val")
    best = max(members, key=lambda m: max(h["val/accuracy"] for h in m.history))
    assert val["best/val_accuracy"] == max(h["val/accuracy"] for h in best.history)
    assert (val["val/accuracy"], val["val/loss"]) == (best.history[-1]["val/accuracy"], best.history[-1]["val/loss"])
    hits = [summarize(c, m.history)["val_rounds_to_target"] or 5 for c, m in zip(cfgs, members)]
    assert val["val_rounds_to_target"] == min(hits)
    assert set(headline(list(members), "test")) == {"test/accuracy", "test/loss", "best/test_accuracy",
                                                     "rounds_to_target"}


@pytest.mark.usefixtures("fresh_home")
def test_a_sweep_stops_trials_by_val_accuracy_and_logs_the_val_numbers(tmp_path, tmp_mlflow, monkeypatch, capsys):
    """A real Ray Tune run under ASHA on val/accuracy (Tune would end the sweep at a report without it),
    into a real MLflow store: each run's per-round val metrics and its validation summary; the line a
    trial ends with gives the numbers its summary gives, a trial ASHA stopped (no summary in its last
    report) too."""
    monkeypatch.chdir(tmp_path)
    base = {**TINY["base"], "data": {**TINY["base"]["data"], "validation_fraction": 0.2}}
    path = write_sweep(tmp_path / "val.yaml", "val", base=base, grid={"local.lr": [0.1, 1.0e-6]},
                       methods={"fedavg": {}}, max_concurrent=1,
                       scheduler={"metric": "val/accuracy", "grace_period": 2, "reduction_factor": 2})
    assert main(["tune", path]) == 0
    err = capsys.readouterr().err
    client, runs = trial_runs(tmp_mlflow, "val")
    by_lr = {r.data.params["local.lr"]: r for r in runs}
    assert {lr: r.data.tags["fedsweep.status"] for lr, r in by_lr.items()} == {"0.1": "finished", "1e-06": "stopped"}
    run = by_lr["0.1"].data
    assert [m.step for m in client.get_metric_history(by_lr["0.1"].info.run_id, "val/accuracy")] == [2, 4]
    assert run.metrics["best/val_accuracy"] == run.metrics["summary/best_val_accuracy"]
    assert run.metrics["val_rounds_to_target"] == run.metrics["summary/val_rounds_to_target"]
    assert {"summary/best_val_round", "summary/test_accuracy_at_best_val", "summary/final_val_accuracy"} <= \
        set(run.metrics)
    for lr, word in (("0.1", "finished"), ("1e-06", "stopped")):
        m = by_lr[lr].data.metrics
        line = re.search(rf"^\[{word}\] fedavg local.lr={lr} seed=0: (.*)$", err, re.M)
        assert line and line[1] == (f"best val acc {m['summary/best_val_accuracy']:.4f}, test acc at best val "
                                    f"{m['summary/test_accuracy_at_best_val']:.4f} after {m['summary/rounds']:.0f} rounds"), err


# ---- refusals ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("data,eval_,needle", [
    ({}, {"validation_clients": 2}, "eval.validation_clients: there is no validation split to sample clients of"),
    ({"validation_fraction": 0.1}, {"validation_clients": 2},
     "eval.validation_clients: a central validation split (data.validation: central) is held by no client"),
    ({"validation_fraction": 0.1, "validation": "federated"}, {"validation_clients": 9},
     "eval.validation_clients: 9 is more than data.num_clients N=8; allowed 1..8"),
    ({"validation_fraction": 1.0}, {}, "data.validation_fraction: Input should be less than 1"),
    ({"validation": "clients"}, {}, "data.validation: 'clients' is not allowed"),
])
def test_a_wrong_validation_option_is_one_line_naming_it(data, eval_, needle):
    raw = tiny_raw(data={**tiny_raw()["data"], **data}, eval={"every": 1, **eval_})
    assert needle in error(raw)


@pytest.mark.parametrize("data,needle", [
    ({"train_size": 40, "partition": {"kind": "iid"}, "validation_fraction": 0.9, "validation": "federated"},
     "data.validation_fraction: 0.9 leaves a client of 5 samples with none to train on (it keeps ⌈0.9·5⌉ = 5 for "
     "validation); allowed up to 0.8 here"),
    ({"train_size": 8, "partition": {"kind": "iid"}, "validation_fraction": 0.5, "validation": "federated"},
     "data.validation_fraction: every client holds one sample, which it keeps for training, so the federated "
     "validation split would be empty"),
    ({"num_clients": 2, "train_size": 12, "partition": {"kind": "iid"}, "validation_fraction": 0.5},
     "data.validation_fraction: 0.5 takes every training sample of class 1 (1 of them) into the validation split"),
    ({"name": "synthetic", "validation_fraction": 0.5, "options": {"mean_samples": 6}},
     "data.validation_fraction: 0.5 takes every training sample of client 0 of 'synthetic' into the central "
     "validation split"),
])
def test_a_fraction_the_data_cannot_give_is_one_line_naming_it(data, needle):
    assert error(tiny_raw(data={**tiny_raw()["data"], **data}, seed=0, clients_per_round=1)).startswith(needle)


def test_fedsweep_run_and_tune_refuse_them_before_any_work(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw(data={**tiny_raw()["data"], "train_size": 8, "partition": {"kind": "iid"},
                                                 "validation_fraction": 0.5, "validation": "federated"})))
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedsweep: error: data.validation_fraction: every client holds one sample")
    assert len(err.splitlines()) == 1
    path = write_sweep(tmp_path / "s.yaml", "s", scheduler={"metric": "best/val_accuracy"})
    assert main(["tune", path, "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"fedsweep: error: {path}: scheduler.metric: 'best/val_accuracy' needs a validation split; set "
                   "base.data.validation_fraction (e.g. 0.1), or select on a test metric")
    assert not (tmp_path / "runs").exists()                    # refused before the storage was made
    base = {**TINY["base"], "data": {**TINY["base"]["data"], "train_size": 8, "partition": {"kind": "iid"},
                                     "validation": "federated"}}
    path = write_sweep(tmp_path / "d.yaml", "d", base=base, grid={"data.validation_fraction": [0.5]})
    assert main(["tune", path, "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fedsweep: error: {path}: data.validation_fraction: every client holds one sample")
    assert len(err.splitlines()) == 1 and err.endswith("(trial fedavg data.validation_fraction=0.5 seed=0)")
