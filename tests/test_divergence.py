"""What "diverged" means (docs/design.md §2.8): a NaN/inf loss or model, or a round's train/loss above
`eval.divergence_factor` × ln(number of classes); one rule for runs and pack members alike."""
from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from conftest import tiny_raw
from fedsweep.cli import main
from fedsweep.config.schema import ConfigError, build_config
from fedsweep.runs.module import divergence_limit, is_diverged
from fedsweep.runs.run import train
from fedsweep.sweep.pack import train_packed

LN10 = math.log(10)   # digits: 10 classes


def blowing_up(lr: float, **over) -> dict:
    """A tiny run whose η_l makes round 1's train/loss huge but finite (lr 1e6: ~2.3e22; lr 10: ~480;
    both settle below 3 × ln 10 by round 3), so only the loss limit can call it diverged."""
    return tiny_raw(rounds=4, local={"steps": 4, "batch_size": 5, "lr": lr}, **over)


def peak_loss(raw: dict) -> float:
    """The largest train/loss of ``raw`` trained with the loss limit off (NaN/inf only)."""
    raw = {**raw, "eval": {**raw.get("eval", {}), "divergence_factor": None}}
    module = train(build_config(raw), progress=False)
    assert not module.diverged and len(module.history) == raw["rounds"]
    losses = [h["train/loss"] for h in module.history]
    assert all(math.isfinite(x) for x in losses)
    return max(losses)


def test_the_rule():
    w, limit = torch.zeros(5), 2.0
    assert not is_diverged(2.0, w, limit)                        # at the limit: not above it
    assert is_diverged(math.nextafter(2.0, 3.0), w, limit)
    assert is_diverged(math.nan, w, limit) and is_diverged(math.inf, w, math.inf)
    assert not is_diverged(math.nan, w, limit, loss_measured=False)   # no client returned: no loss to judge
    assert is_diverged(math.nan, torch.tensor([0.0, math.inf]), limit, loss_measured=False)
    assert divergence_limit(1000.0, 10) == pytest.approx(1000 * LN10) and divergence_limit(None, 10) == math.inf


def test_a_huge_finite_loss_is_divergence_and_ends_as_divergence_does(tmp_path, monkeypatch, capsys):
    """η_l = 1e6 once ended `finished`, train/loss 2.3e22 at round 1 and chance accuracy: now status
    diverged, exit 3, and in MLflow status FAILED with fedsweep.diverged_round."""
    from mlflow import MlflowClient
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    raw = blowing_up(1e6, mlflow={"enabled": True, "tracking_uri": uri, "experiment": "div"})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(raw))
    assert main(["run", "cfg.yaml", "--quiet", "--output-json", "out.json"]) == 3
    summary = json.loads((tmp_path / "out.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_round"] == 1 and summary["rounds"] == 1
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("div").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["fedsweep.status"] == "diverged"
    assert run.data.tags["fedsweep.diverged_round"] == "1"
    (loss,) = client.get_metric_history(run.info.run_id, "train/loss")
    assert loss.step == 1 and 1000 * LN10 < loss.value < math.inf   # finite: the limit caught it


def test_a_normal_run_finishes_and_null_turns_the_limit_off():
    assert not train(build_config(tiny_raw(rounds=4)), progress=False).diverged
    assert peak_loss(blowing_up(1e6)) > 1e20           # NaN/inf only: the same run trains to the end


def test_the_limit_is_the_factor_times_ln_classes():
    """Just above the run's peak train/loss it finishes; just below, it diverges at the peak's round."""
    raw = blowing_up(10.0)
    peak = peak_loss(raw)
    assert peak / LN10 > 10
    above = train(build_config(raw, [f"eval.divergence_factor={peak / LN10 * (1 + 1e-6)!r}"]), progress=False)
    assert not above.diverged and len(above.history) == 4
    below = train(build_config(raw, [f"eval.divergence_factor={peak / LN10 * (1 - 1e-6)!r}"]), progress=False)
    assert below.diverged and below.history[-1]["train/loss"] == pytest.approx(peak)


def test_packed_members_diverge_by_the_same_rule_as_their_runs():
    """A pack of a normal config, two that pass the loss limit (at the default, and at a factor set
    just below the peak) and one just under it: each member ends as its unpacked run, the others go on."""
    peak = peak_loss(blowing_up(10.0))
    cfgs = [build_config(tiny_raw(rounds=4)), build_config(blowing_up(1e6)),
            build_config(blowing_up(10.0), [f"eval.divergence_factor={peak / LN10 * (1 - 1e-6)!r}"]),
            build_config(blowing_up(10.0), [f"eval.divergence_factor={peak / LN10 * (1 + 1e-6)!r}"])]
    packed = train_packed(cfgs)
    assert [m.diverged for m in packed.members] == [False, True, True, False]
    for cfg, member in zip(cfgs, packed.members):
        solo = train(cfg, progress=False)
        assert member.diverged == solo.diverged and len(member.history) == len(solo.history)
        for a, b in zip(solo.history, member.history):
            assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-5)


def test_a_round_in_which_every_client_dropped_out_is_not_divergence():
    """With no client back, a round has no train/loss (NaN): the model alone is judged."""
    raw = tiny_raw(rounds=6, clients_per_round=1, heterogeneity={"kind": "profiles", "dropout": 0.9})
    module = train(build_config(raw), progress=False)
    assert any(math.isnan(h["train/loss"]) for h in module.history)
    assert not module.diverged and len(module.history) == 6


@pytest.mark.parametrize("value", ["1", "0.5", ".nan"])
def test_a_factor_that_would_stop_every_run_is_refused(value):
    """Round 1's loss is about ln(C) itself: a factor of 1 or less would call every run diverged."""
    with pytest.raises(ConfigError, match=r"^eval\.divergence_factor: Input should be (greater than 1|a finite)"):
        build_config(tiny_raw(), [f"eval.divergence_factor={value}"])
