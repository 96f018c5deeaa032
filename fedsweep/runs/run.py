"""``fedsweep run``: one federated training run through Lightning, summarised and logged to MLflow."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

from fedsweep.config.schema import ConfigError, RunConfig
from fedsweep.runs.artifacts import artifact_dict, write_artifacts, write_plugin_sources  # noqa: F401 (re-exported)
from fedsweep.runs.summary import (SUMMARY_KEYS, first_at_target, format_summary, stability,  # noqa: F401
                                   summarize, summary_json, validation_summary)  # (re-exported)
from fedsweep.util.lazy import torch


def resolve_device(name: str) -> str:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: 'cuda' asked for but no CUDA device is available; allowed here: auto, cpu")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def duration(seconds: float) -> str:
    """12 s, 3 min 05 s, 2 h 07 min."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class _Progress:
    """A Lightning callback printing one line per evaluation (long runs show they are alive), with
    about how long is left: the rounds to go at the mean time of the last 50."""

    def __new__(cls, total: int):
        import lightning as L

        class Progress(L.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                h = module.history[-1]
                if "test/accuracy" in h:
                    recent = [r["round/seconds"] for r in module.history[-50:]]
                    left = (total - h["round"]) * sum(recent) / len(recent)
                    val = f"val acc {h['val/accuracy']:.4f}  " if "val/accuracy" in h else ""
                    print(f"round {h['round']:>4}/{total}  test acc {h['test/accuracy']:.4f}  "
                          f"test loss {h['test/loss']:.4f}  {val}train loss {h['train/loss']:.4f}  "
                          f"{1000 * h['round/seconds']:.1f} ms/round" + (f"  ~{duration(left)} left" if left else ""),
                          file=sys.stderr, flush=True)
        return Progress()


class _StopAfterRound:
    """Ctrl-C or SIGTERM during a run: finish the round in progress, then end the fit there, as a run
    ends after its last round (its checkpoint saved at that round, its evaluation, a summary). A
    second Ctrl-C stops at once. Lightning's own answers are ``sys.exit(1)`` mid-round for Ctrl-C,
    with nothing saved or said, and an exception before the next round for SIGTERM. Only in the main
    thread: a Ray worker's trials run in threads of their own, and Tune stops them."""

    def __new__(cls):
        import lightning as L

        class StopAfterRound(L.Callback):
            signal: str | None = None      # the signal that asked to stop
            active = False

            def asked(self, signum, frame):
                self.signal = signal.Signals(signum).name
                signal.signal(signal.SIGINT, signal.default_int_handler)   # a second Ctrl-C: at once
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                print(f"\n{self.signal}: stopping after the round in progress (Ctrl-C again to stop at once)",
                      file=sys.stderr, flush=True)

            def on_train_start(self, trainer, module):
                if self.active and not self.signal:   # over the SIGTERM handler Lightning set in fit
                    signal.signal(signal.SIGTERM, self.asked)

            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                if self.signal:
                    trainer.should_stop = True
        return StopAfterRound()


@contextlib.contextmanager
def matmul_precision(precision: str):
    """torch's float32 matmul precision (``RunConfig.matmul_precision``) for the block, then the one
    before: it is process-wide, and what else runs in the process (the next pack in a Ray worker, a
    test) must not inherit it. PyTorch passes it on to oneDNN's CPU products too
    (``torch.backends.mkldnn.matmul.fp32_precision``): on CPUs with reduced-precision units, ``high``
    changes the CPU's numbers as well."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextlib.contextmanager
def _stop_after_round_on_signal(stop):
    """``stop`` answers Ctrl-C and SIGTERM while the block runs; the handlers before are put back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in before:
        signal.signal(s, stop.asked)
    stop.active = True
    try:
        yield
    finally:
        stop.active = False
        for s, handler in before.items():
            signal.signal(s, handler)


def quiet_logs() -> None:
    """Only warnings and errors from Lightning, MLflow's store set-up and alembic."""
    from fedsweep.runs.tracking import quiet_store_logs
    quiet_store_logs()
    import lightning  # noqa: F401  (its import resets the logger level: set it after)
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def preflight(cfg: RunConfig, *, output_json: str | Path | None = None, ckpt_dir: str | Path | None = None,
              ckpt_every: int = 0, resume: str | Path | None = None) -> tuple[str | None, dict]:
    """What :func:`run` checks before any work: options, output locations, the checkpoint to resume
    and the one ``--checkpoint-dir`` holds (another run's is never replaced), the MLflow store and
    experiment. One-line :class:`ConfigError` on the first problem; writes nothing. Returns the
    resolved tracking URI (None without MLflow) and the run's identity (its checkpoint's, when
    resumed). The resumed checkpoint's fit with the config is checked by :func:`train` (it needs the
    built model). Cost: a few ms for a local sqlite store (~2 s with the MLflow import when it
    exists), one HTTP round trip for a server (up to 5 s when none answers)."""
    from fedsweep.runs.checkpoints import check_checkpoint_dir, identity_of, new_identity
    from fedsweep.runs.paths import check_writable_dir, check_writable_file
    from fedsweep.runs.tracking import check_store
    if ckpt_every < 0:
        raise ConfigError(f"--checkpoint-every: must be 0 or more (0: save only at the end), got {ckpt_every}")
    if ckpt_every and ckpt_dir is None:
        raise ConfigError("--checkpoint-every: needs --checkpoint-dir (where to save)")
    if resume is not None and not Path(resume).is_file():
        raise ConfigError(f"--resume: checkpoint not found: {resume}")
    identity = identity_of(resume) if resume is not None else {}
    if output_json is not None:
        check_writable_file(output_json, "--output-json")
    if ckpt_dir is not None:
        check_writable_dir(ckpt_dir, "--checkpoint-dir")
        check_checkpoint_dir(ckpt_dir, resume, identity)
    uri = check_store(cfg.mlflow.tracking_uri, experiment=cfg.mlflow.experiment) if cfg.mlflow.enabled else None
    return uri, identity or new_identity()


def train(cfg: RunConfig, *, progress: bool = True, ckpt_dir: str | Path | None = None, ckpt_every: int = 0,
          resume: str | Path | None = None, max_rounds: int | None = None, callbacks=(), data=None,
          identity: dict | None = None, before_fit=None):
    """Build the module and fit it; returns the module (``module.history`` holds the metrics).
    ``identity``: the run's (:mod:`fedsweep.runs.checkpoints`), saved in its checkpoints.
    ``before_fit()``: called once the data is made and the checkpoint checked, right before the first
    round (``fedsweep run`` opens its MLflow run there: a run refused before then leaves none)."""
    from fedsweep.runs.checkpoints import Checkpointer, check_checkpoint
    from fedsweep.util.allocator import keep_freed_memory
    from fedsweep.runs.memory import check_state_fits, memory_line, state_bound, state_line
    from fedsweep.runs.module import FederatedModule
    from fedsweep.util.startup import end_startup
    quiet_logs()
    end_startup()   # `fedsweep run`: its imports are done (Lightning's in quiet_logs)
    keep_freed_memory()
    accelerator = resolve_device(cfg.device)
    if resume is not None and not Path(resume).is_file():
        raise ConfigError(f"--resume: checkpoint not found: {resume}")
    with matmul_precision(cfg.matmul_precision):
        module = FederatedModule(cfg, data=data)
        module.identity = identity
        if resume is not None:
            check_checkpoint(resume, module)
        check_state_fits([(cfg, state_bound(cfg, module.fmodel.dim))], accelerator)
        from fedsweep.engine import choose_engine, engine_choice
        # before any round: a model the chosen engine cannot run is one line here, not a crash in round 1
        engine, why = engine_choice(cfg.engine, module.fmodel.module, accelerator, module.data.input_shape)
        if progress:
            how = f" (auto: {why})" if cfg.engine == "auto" and why else " (auto)" if cfg.engine == "auto" else ""
            lower = "" if cfg.matmul_precision == "highest" else f", matmul_precision {cfg.matmul_precision}"
            print(f"{module.data.describe()}; {cfg.algorithm.name}, K={cfg.clients_per_round}, "
                  f"{cfg.rounds} rounds, {engine} engine{how} on {accelerator}{lower}", file=sys.stderr, flush=True)
            if engine == "vectorized" and choose_engine("auto", module.fmodel.module, accelerator) == "loop":
                print("note: on CPU the loop engine runs conv models faster than the vectorized one "
                      "(benchmarks/README.md); engine: auto picks it", file=sys.stderr, flush=True)
            print(memory_line(cfg, module.data, module.fmodel.dim), file=sys.stderr, flush=True)
        if before_fit is not None:
            before_fit()
        cbs = list(callbacks)
        if progress:
            cbs.append(_Progress(cfg.rounds))
        if ckpt_dir is not None:
            cbs.append(Checkpointer(Path(ckpt_dir), ckpt_every))
        # Rounds are counted by optimizer steps (one server step per round), not epochs: a checkpoint
        # saved at the end of a cut-short fit marks its epoch complete, and resuming must still go on.
        stop = _StopAfterRound()
        trainer = lightning_trainer(accelerator, min(max_rounds or cfg.rounds, cfg.rounds), [stop, *cbs])
        try:
            with _stop_after_round_on_signal(stop):
                trainer.fit(module, ckpt_path=str(resume) if resume is not None else None)
        except SystemExit:
            if trainer.interrupted:     # a second Ctrl-C: Lightning ran its exception hooks, then exit(1)
                signal.signal(signal.SIGINT, signal.default_int_handler)   # it left Ctrl-C ignored
                raise KeyboardInterrupt from None
            raise
        module.interrupted = bool(stop.signal) and module.rounds_done < cfg.rounds
        module.record_eval()   # a run cut short (divergence, max_rounds, Ctrl-C) still ends evaluated
        held = state_line(module.algorithm, module.data.num_clients) if progress and module.algorithm else None
        if held:
            print(held, file=sys.stderr, flush=True)
    return module


def lightning_trainer(accelerator: str, max_steps: int, callbacks: list, max_epochs: int = -1):
    """The Trainer of a run: fedsweep's own evaluation and checkpoints, no logger or progress bar."""
    import lightning as L
    return L.Trainer(accelerator=accelerator, devices=1, max_epochs=max_epochs, max_steps=max_steps,
                     limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)


def run(cfg: RunConfig, *, output_json: str | Path | None = None, progress: bool = True,
        ckpt_dir=None, ckpt_every: int = 0, resume=None, max_rounds=None, data=None, out=None) -> dict:
    """Check (:func:`preflight`), train while the MLflow run is written (:mod:`fedsweep.runs.live`),
    summarise; returns the summary (also written to ``output_json``, its folders created, before
    the end of the MLflow run and again with the run id). If the MLflow store still fails at the end,
    the summary's ``mlflow_unlogged`` names the folder its records are kept in. ``progress``: the
    header and a line per evaluation on stderr; ``out``: where the summary table and the lines about
    the MLflow run go (default stdout; :class:`~fedsweep.runs.live.LiveRun` says where its first line
    goes). What fails (the store, a file) is said on stderr either way."""
    return run_with_module(cfg, output_json=output_json, progress=progress, ckpt_dir=ckpt_dir, ckpt_every=ckpt_every,
                           resume=resume, max_rounds=max_rounds, data=data, out=out)[0]


def run_with_module(cfg: RunConfig, *, output_json: str | Path | None = None, progress: bool = True,
                    ckpt_dir=None, ckpt_every: int = 0, resume=None, max_rounds=None, data=None, out=None):
    """:func:`run`, returning (the summary, the trained module): the Python API's result reads the
    metric history and the final model from the module."""
    uri, identity = preflight(cfg, output_json=output_json, ckpt_dir=ckpt_dir, ckpt_every=ckpt_every, resume=resume)
    with _checkpoint_dir_lock(ckpt_dir, resume, identity):
        return _run(cfg, uri, identity, output_json=output_json, progress=progress, ckpt_dir=ckpt_dir,
                    ckpt_every=ckpt_every, resume=resume, max_rounds=max_rounds, data=data, out=out)


@contextlib.contextmanager
def _checkpoint_dir_lock(ckpt_dir, resume, identity: dict):
    """One run at a time writes ``--checkpoint-dir``: its lock is held while the run trains, and the
    folder's checkpoint is checked again under it (another run may have written one since preflight)."""
    if ckpt_dir is None:
        yield
        return
    from fedsweep.runs.checkpoints import check_checkpoint_dir
    from fedsweep.util.locks import SweepLock
    Path(ckpt_dir).mkdir(parents=True, exist_ok=True)
    with SweepLock(Path(ckpt_dir) / "last.ckpt.lock", "", busy=f"--checkpoint-dir {ckpt_dir}: another fedsweep run "
                   "writes its checkpoint there") as lock:
        lock.acquire()
        check_checkpoint_dir(ckpt_dir, resume, identity)
        yield


def _write_summary(path, summary: dict, again: bool = False) -> None:
    """``--output-json``: a disk that filled up since the run's start costs the file, never the run
    (its MLflow record, or the summary printed above); said once, in one line."""
    if path is None:
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(summary_json(summary))
    except OSError as e:
        if not again:
            print(f"fedsweep: --output-json {path}: could not be written ({e.strerror or e}); the summary is the one "
                  "printed above", file=sys.stderr)


def _run(cfg: RunConfig, uri: str | None, identity: dict, *, output_json, progress, ckpt_dir, ckpt_every, resume,
         max_rounds, data, out) -> tuple[dict, object]:
    from fedsweep.runs.live import LiveRun, end_run
    live = None
    if cfg.mlflow.enabled:
        if uri.startswith(("http://", "https://")):   # a server gone mid-run: fail each try in seconds,
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")   # not MLflow's ~4 min (7)
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")      # (120 s per request)
        live = LiveRun(cfg, uri, identity, out=out, checkpoint_dir=ckpt_dir)
    t0 = time.perf_counter()
    try:
        module = train(cfg, progress=progress, ckpt_dir=ckpt_dir, ckpt_every=ckpt_every, resume=resume,
                       max_rounds=max_rounds, data=data, identity=identity, before_fit=live and live.start,
                       callbacks=[live.callback()] if live else ())
    except BaseException as e:   # a crash, a second Ctrl-C: its MLflow run does not stay RUNNING
        if live is not None:
            live.abort(e)
        raise
    summary = summarize(cfg, module.history, module.diverged)
    if module.interrupted:
        summary["status"] = "interrupted"
    summary["wall_seconds"] = time.perf_counter() - t0
    if getattr(module, "checkpoint_error", None):
        summary["checkpoint_error"] = module.checkpoint_error
    print(format_summary(summary), file=out or sys.stdout)
    _write_summary(output_json, summary)   # before MLflow's end: a store that fails now does not lose the summary
    if live is None:
        return summary, module
    try:
        end_run(live, module, summary, out or sys.stdout)
    except KeyboardInterrupt as e:   # a second Ctrl-C while the last writes are made
        live.abort(e)
        raise
    _write_summary(output_json, summary, again=True)
    return summary, module
