"""``fedsweep run``: one federated training run through Lightning, summarised and logged to MLflow."""
from __future__ import annotations

import csv
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import yaml

from fedsweep.config import ConfigError, RunConfig

SUMMARY_KEYS = ("best_test_accuracy", "final_test_accuracy", "rounds_to_target", "rounds",
                "seconds_per_round", "comm_up_models", "comm_down_models")


def resolve_device(name: str) -> str:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' asked for but no CUDA device is available; allowed here: auto, cpu")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def stability(accuracies) -> float | None:
    """Lag-one autocorrelation of the normalized changes of test accuracy between evaluations.

    The FedSoftMax paper's stability measure (§3.2, Table 4: "a lag one autocorrelation measure based
    on the normalized standard deviation of the variations over one round"): with d_t the change
    between consecutive evaluations and z_t = (d_t − mean d) / std d, it is Σ z_t z_{t+1} / Σ z_t².
    In [−1, 1]: near 1 the curve moves smoothly (changes persist), negative it zig-zags. The paper's
    values exceed 1, so its exact normalisation is not this one; compare runs within fedsweep only.
    None with fewer than 4 evaluations or a flat curve. Evaluate every round (``eval.every: 1``) to
    measure round-to-round changes as the paper does."""
    d = np.diff(np.asarray(list(accuracies), dtype=np.float64))
    if len(d) < 3 or not np.isfinite(d).all() or d.std() == 0:
        return None
    z = (d - d.mean()) / d.std()
    return float((z[:-1] * z[1:]).sum() / (z * z).sum())


def summarize(cfg: RunConfig, history: list[dict], diverged: bool = False) -> dict:
    """The numbers a user compares runs on; ``rounds_to_target`` is None if never reached."""
    evals = [h for h in history if "test/accuracy" in h]
    target = cfg.eval.target_accuracy
    hit = next((h for h in evals if target is not None and h["test/accuracy"] >= target), None)
    upto = [h for h in history if hit is None or h["round"] <= hit["round"]]
    secs = [h["round/seconds"] for h in history]
    def total(key, rows):
        return float(sum(h[key] for h in rows))
    return {
        "status": "diverged" if diverged else "finished",
        "best_test_accuracy": max((h["test/accuracy"] for h in evals), default=None),
        "final_test_accuracy": evals[-1]["test/accuracy"] if evals else None,
        "final_test_loss": evals[-1]["test/loss"] if evals else None,
        "rounds_to_target": hit["round"] if hit else None,
        "seconds_to_target": total("round/seconds", upto) if hit else None,
        "comm_up_to_target": total("comm/up_models", upto) if hit else None,
        "rounds": len(history),
        "seconds_per_round": sum(secs) / len(secs) if secs else None,
        "comm_up_models": total("comm/up_models", history),
        "comm_down_models": total("comm/down_models", history),
        "grad_evals": total("compute/grad_evals", history),
        "stability": stability(h["test/accuracy"] for h in evals),
        "target_accuracy": target,
    }


def format_summary(summary: dict) -> str:
    def fmt(v):
        if v is None:
            return "—"
        if isinstance(v, float):
            return f"{v:.4f}" if abs(v) < 10 else f"{v:,.1f}"
        return str(v)
    rows = [("status", summary["status"]),
            ("best test accuracy", summary["best_test_accuracy"]),
            ("final test accuracy", summary["final_test_accuracy"]),
            (f"rounds to target ({fmt(summary['target_accuracy'])})", summary["rounds_to_target"]),
            ("rounds", summary["rounds"]),
            ("seconds per round", summary["seconds_per_round"]),
            ("stability (lag-1 autocorrelation)", summary["stability"]),
            ("models up / down", f"{fmt(summary['comm_up_models'])} / {fmt(summary['comm_down_models'])}")]
    width = max(len(r[0]) for r in rows)
    line = "─" * (width + 16)
    return "\n".join([line] + [f"{k:<{width}}  {fmt(v)}" for k, v in rows] + [line])


class _Progress:
    """A Lightning callback printing one line per evaluation (long runs show they are alive)."""

    def __new__(cls, total: int):
        import lightning as L

        class Progress(L.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                h = module.history[-1]
                if "test/accuracy" in h:
                    print(f"round {h['round']:>4}/{total}  test acc {h['test/accuracy']:.4f}  "
                          f"test loss {h['test/loss']:.4f}  train loss {h['train/loss']:.4f}  "
                          f"{1000 * h['round/seconds']:.1f} ms/round", file=sys.stderr, flush=True)
        return Progress()


class _Checkpointer:
    """Saves ``<dir>/last.ckpt`` every ``every`` rounds and at the end (atomic rename)."""

    def __new__(cls, directory: Path, every: int):
        import lightning as L

        class Checkpointer(L.Callback):
            def _save(self, trainer):
                directory.mkdir(parents=True, exist_ok=True)
                tmp = directory / "last.ckpt.tmp"
                trainer.save_checkpoint(tmp)
                tmp.replace(directory / "last.ckpt")

            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                if every and module.rounds_done % every == 0:
                    self._save(trainer)

            def on_train_end(self, trainer, module):
                self._save(trainer)
        return Checkpointer()


def quiet_logs() -> None:
    """Only warnings and errors from Lightning, MLflow's store set-up and alembic."""
    import lightning  # noqa: F401  (its import resets the logger level: set it after)
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)   # schema-creation chatter
    logging.getLogger("alembic").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def train(cfg: RunConfig, *, progress: bool = True, ckpt_dir: str | Path | None = None, ckpt_every: int = 0,
          resume: str | Path | None = None, max_rounds: int | None = None, callbacks=(), data=None):
    """Build the module and fit it; returns the module (``module.history`` holds the metrics)."""
    import lightning as L

    from fedsweep.module import FederatedModule
    quiet_logs()
    accelerator = resolve_device(cfg.device)
    if resume is not None and not Path(resume).is_file():
        raise ConfigError(f"--resume: checkpoint not found: {resume}")
    module = FederatedModule(cfg, data=data)
    if progress:
        print(f"{module.data.describe()}; {cfg.algorithm.name}, K={cfg.clients_per_round}, "
              f"{cfg.rounds} rounds, {cfg.engine} engine on {accelerator}", file=sys.stderr, flush=True)
        convs = any(isinstance(m, torch.nn.Conv2d) for m in module.fmodel.module.modules())
        if convs and cfg.engine == "vectorized" and accelerator == "cpu":
            print("note: on CPU the loop engine runs conv models faster than the vectorized one "
                  "(benchmarks/README.md); set engine: loop", file=sys.stderr, flush=True)
    cbs = list(callbacks)
    if progress:
        cbs.append(_Progress(cfg.rounds))
    if ckpt_dir is not None:
        cbs.append(_Checkpointer(Path(ckpt_dir), ckpt_every))
    # Rounds are counted by optimizer steps (one server step per round), not epochs: a checkpoint
    # saved at the end of a cut-short fit marks its epoch complete, and resuming must still go on.
    trainer = L.Trainer(accelerator=accelerator, devices=1, max_epochs=-1,
                        max_steps=min(max_rounds or cfg.rounds, cfg.rounds),
                        limit_val_batches=0, num_sanity_val_steps=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=cbs)
    torch.set_float32_matmul_precision("high")
    trainer.fit(module, ckpt_path=str(resume) if resume is not None else None)
    if module.history and "test/accuracy" not in module.history[-1]:
        module.record_eval()   # a run cut short (divergence, max_rounds) still ends evaluated
    return module


def write_artifacts(cfg: RunConfig, module, summary: dict, directory: Path) -> Path:
    from fedsweep.plots import curves_png
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    keys = sorted({k for h in module.history for k in h}, key=lambda k: (k != "round", k))
    with open(directory / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(module.history)
    log = getattr(module, "client_log", None)
    if log:   # one row per (round, sampled client): the algorithm's per-client record
        cols = [k for k in log[0] if k != "round"]
        with open(directory / "clients.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["round", *cols])
            for r in log:
                writer.writerows([r["round"], *row] for row in zip(*(r[c] for c in cols)))
    (directory / "summary.json").write_text(json.dumps(summary, indent=2))
    curves_png(module.history, directory / "curves.png", title=f"{cfg.algorithm.name} on {cfg.data.name}")
    if cfg.mlflow.log_model:
        net = module.fmodel.load_into(module.w.detach())
        torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()}, directory / "model.pt")
    return directory


def run(cfg: RunConfig, *, output_json: str | Path | None = None, progress: bool = True,
        ckpt_dir=None, ckpt_every: int = 0, resume=None, max_rounds=None, data=None, out=None) -> dict:
    """Train, summarise, log to MLflow; returns the summary (also written to ``output_json``)."""
    from fedsweep.tracking import log_run, resolve_tracking_uri, ui_command
    out = out or sys.stdout
    t0 = time.perf_counter()
    module = train(cfg, progress=progress, ckpt_dir=ckpt_dir, ckpt_every=ckpt_every, resume=resume,
                   max_rounds=max_rounds, data=data)
    summary = summarize(cfg, module.history, module.diverged)
    summary["wall_seconds"] = time.perf_counter() - t0
    print(format_summary(summary), file=out)
    if cfg.mlflow.enabled:
        uri = resolve_tracking_uri(cfg.mlflow.tracking_uri)
        with tempfile.TemporaryDirectory() as tmp:
            write_artifacts(cfg, module, summary, Path(tmp))
            run_id = log_run(cfg, module.history, summary, Path(tmp), uri=uri)
        summary["mlflow_run_id"], summary["mlflow_tracking_uri"] = run_id, uri
        print(f"logged to MLflow run {run_id} (experiment {cfg.mlflow.experiment!r})\n"
              f"open it with:  {ui_command(uri)}", file=out)
    if output_json is not None:
        Path(output_json).write_text(json.dumps(summary, indent=2))
    return summary
