"""The LightningModule: a round changes the model, metrics are recorded, resume is exact."""
import os
import signal

import pytest
import torch

from fedsweep.config.schema import build_config
from fedsweep.runs.run import summarize, train
from conftest import resumed_run, tiny_raw


def test_smoke_one_round_changes_model_and_logs_metrics():
    cfg = build_config(tiny_raw(rounds=1))
    from fedsweep.runs.module import FederatedModule
    w0 = FederatedModule(cfg).w.detach().clone()
    m = train(cfg, progress=False)
    assert not torch.allclose(m.w.detach(), w0)
    (h,) = m.history
    assert h["round"] == 1
    for key in ("test/accuracy", "test/loss", "train/loss", "round/seconds", "comm/up_models",
                "comm/down_models", "stragglers/fraction"):
        assert key in h
    assert h["stragglers/fraction"] == 0.5 and h["comm/up_models"] == 4 == h["comm/down_models"]


READINGS = ("projection", "continuation", "extrapolation")


@pytest.mark.parametrize("reading", READINGS)
def test_rho_zero_fedlga_equals_fedavg(reading):
    over = dict(heterogeneity={"kind": "stragglers", "rho": 0.0}, rounds=2)
    a = train(build_config(tiny_raw(**over)), progress=False)
    b = train(build_config(tiny_raw(**over, algorithm={"name": "fedlga", "reading": reading})), progress=False)
    assert torch.equal(a.w, b.w)


def test_fedlga_readings_differ_from_fedavg_and_each_other_under_stragglers():
    a = train(build_config(tiny_raw()), progress=False)
    ws = [train(build_config(tiny_raw(algorithm={"name": "fedlga", "reading": r})), progress=False).w
          for r in READINGS]
    for i, w in enumerate(ws):
        assert not torch.allclose(a.w, w) and not any(torch.allclose(w, v) for v in ws[i + 1:])


@pytest.mark.parametrize("unit", ["steps", "epochs"])
def test_fedlga_continuation_resumes_exactly(tmp_path, unit):
    raw = tiny_raw(rounds=5, local={"steps": 3, "unit": unit, "batch_size": 5, "lr": 0.05}, eval={"every": 2},
                   algorithm={"name": "fedlga", "reading": "continuation", "grad_source": "exact"})
    resumed_run(raw, tmp_path, stop=2)


@pytest.mark.parametrize("algo,server", [("fedavg", {"optimizer": "momentum", "lr": 0.5}),
                                         ("fedlga", {"optimizer": "adam", "lr": 0.01})])
def test_resume_from_checkpoint_is_exact(tmp_path, algo, server):
    raw = tiny_raw(rounds=6, algorithm={"name": algo}, server=server, eval={"every": 2})
    _, resumed, _ = resumed_run(raw, tmp_path, stop=3)
    assert [h["round"] for h in resumed.history] == list(range(1, 7))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_stops_after_the_round_in_progress_and_resume_is_exact(tmp_path, sig):
    """Ctrl-C or SIGTERM while round 3 trains: round 3 ends, the checkpoint is saved there, the run
    ends evaluated and marked interrupted, the handlers before are back; resumed from that
    checkpoint it ends where an uninterrupted run ends."""
    import lightning as L
    raw = tiny_raw(rounds=6, eval={"every": 2}, algorithm={"name": "fedlga"},
                   server={"optimizer": "momentum", "lr": 0.5})
    full = train(build_config(raw), progress=False)

    class Press(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if module.rounds_done == 2:
                os.kill(os.getpid(), sig)

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    cut = train(build_config(raw), progress=False, ckpt_dir=tmp_path, callbacks=[Press()])
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert cut.interrupted and cut.rounds_done == 3 and "test/accuracy" in cut.history[-1]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["fedsweep"]["rounds_done"] == 3
    resumed = train(build_config(raw), progress=False, resume=tmp_path / "last.ckpt")
    assert not resumed.interrupted and torch.equal(resumed.w, full.w)
    strip = lambda hs: [{k: v for k, v in h.items() if k != "round/seconds"} for h in hs]  # noqa: E731
    assert strip(resumed.history) == strip(full.history)


@pytest.mark.parametrize("precision", ["highest", "high"])
def test_a_run_trains_at_its_matmul_precision_and_puts_back_the_one_before(precision, capsys):
    """``matmul_precision`` holds while the rounds train, and the process gets its own precision back
    (the default is full float32); the run's header names a precision other than the default."""
    import lightning as L
    seen = []

    class Look(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append(torch.get_float32_matmul_precision())

    raw = tiny_raw() if precision == "highest" else {**tiny_raw(), "matmul_precision": precision}
    torch.set_float32_matmul_precision("medium")     # the caller's own, to be given back
    try:
        train(build_config(raw), progress=True, callbacks=[Look()])
        assert seen == [precision] * 3 and torch.get_float32_matmul_precision() == "medium"
        header = capsys.readouterr().err.splitlines()[0]
        assert header.endswith("on cpu" if precision == "highest" else "on cpu, matmul_precision high"), header
    finally:
        torch.set_float32_matmul_precision("highest")


def test_summary_rounds_to_target_and_eval_cadence():
    cfg = build_config(tiny_raw(rounds=5, eval={"every": 2, "target_accuracy": 0.05}))
    m = train(cfg, progress=False)
    assert [h["round"] for h in m.history if "test/accuracy" in h] == [2, 4, 5]   # and always the last
    s = summarize(cfg, m.history)
    assert s["rounds_to_target"] == 2 and s["rounds"] == 5
    assert s["comm_up_models"] == 20 and s["best_test_accuracy"] >= s["final_test_accuracy"] - 1e-12
    cfg = build_config(tiny_raw(rounds=2, eval={"target_accuracy": 1.0}))
    assert summarize(cfg, train(cfg, progress=False).history)["rounds_to_target"] is None


def test_divergence_stops_and_is_reported():
    cfg = build_config(tiny_raw(rounds=5, local={"steps": 4, "batch_size": 5, "lr": 1e30}))
    m = train(cfg, progress=False)
    assert m.diverged and len(m.history) < 5
    assert summarize(cfg, m.history, m.diverged)["status"] == "diverged"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), None])
def test_a_round_that_leaves_the_model_non_finite_is_divergence(bad):
    """The clients' loss can be finite while the server step overflows the model: the model itself
    is checked, every value of it (one bad entry among n), and a finite model is not divergence."""
    from fedsweep.runs.module import FederatedModule
    m = FederatedModule(build_config(tiny_raw(rounds=5, eval={"every": 100})))
    with torch.no_grad():
        m.w.fill_(3e38)                     # large but finite: 0·w still sums to 0
        if bad is not None:
            m.w[m.w.numel() // 2] = bad
    assert m.record_round({"round": 1, "train/loss": 0.5}) is (bad is not None)
    assert m.diverged is (bad is not None)


def test_validate_evaluates_a_checkpoint(tmp_path):
    import lightning as L

    from fedsweep.runs.module import FederatedModule
    cfg = build_config(tiny_raw(rounds=2))
    trained = train(cfg, progress=False, ckpt_dir=tmp_path)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    (metrics,) = trainer.validate(FederatedModule(cfg), ckpt_path=str(tmp_path / "last.ckpt"), verbose=False)
    assert metrics["test/accuracy"] == pytest.approx(trained.history[-1]["test/accuracy"])
    assert metrics["test/loss"] == pytest.approx(trained.history[-1]["test/loss"], rel=1e-5)
