"""A run's checkpoint (``--checkpoint-dir DIR``: ``DIR/last.ckpt``) and what may resume it.

A checkpoint belongs to one run: it carries that run's identity (a ``run_uid`` drawn when the run
first started and kept by every resume, the MLflow run it is logged to) beside its config. So:

- a run writes ``DIR/last.ckpt`` only if the folder holds no checkpoint, or its own (the one it
  resumes): another run's, even an interrupted one that was told to resume from it, is never
  replaced (:func:`check_checkpoint_dir`); and two runs never write one folder at once (a lock);
- ``--resume`` continues a checkpoint only with the config it was trained with: every key but
  ``rounds`` (a run may be continued further, never cut below what it has done) and where it is
  logged (``mlflow.*``) must be the same, so the record a resumed run leaves says what trained it
  (:func:`check_checkpoint`).
"""
from __future__ import annotations

import os
from pathlib import Path

from fedsweep.config.schema import ConfigError, flatten
from fedsweep.util.lazy import torch

LAST = "last.ckpt"
# Keys a resumed run may set apart from its checkpoint: how far it goes, and where it is logged.
MAY_DIFFER = ("rounds", "eval.batch_size")
MAY_DIFFER_PREFIX = ("mlflow.",)


def load_state(path: str | Path, key: str = "--resume") -> tuple[dict, "torch.Tensor"]:
    """(the fedsweep state, the flat model ``w``) of a fedsweep checkpoint; one-line :class:`ConfigError`
    naming ``key`` if the file is empty, truncated, damaged or not a fedsweep checkpoint. Loads with
    ``weights_only=True, mmap=True``: tensor data is mapped, not read, so it costs a few ms whatever the
    checkpoint's size."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(4)
    if size < 4:
        what = "empty file" if not size else f"{size} bytes"
        raise ConfigError(f"{key} {path}: damaged or truncated checkpoint ({what})")
    if magic != b"PK\x03\x04":
        raise ConfigError(f"{key} {path}: not a fedsweep checkpoint (not a zip archive as torch.save writes)")
    import pickle
    import zipfile
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"{key} {path}: damaged or truncated checkpoint (its zip archive has no end: "
                          f"the file was cut short)")
    try:
        ckpt = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except pickle.UnpicklingError:
        raise ConfigError(f"{key} {path}: not a fedsweep checkpoint (it holds Python objects, not only "
                          f"tensors and plain data)") from None
    except Exception as e:   # zip/storage read errors come as OSError, RuntimeError, KeyError, EOFError
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")[:160]
        raise ConfigError(f"{key} {path}: damaged or truncated checkpoint ({reason})") from None
    state = ckpt.get("fedsweep") if isinstance(ckpt, dict) else None
    weights = ckpt.get("state_dict") if isinstance(ckpt, dict) else None
    w = weights.get("w") if isinstance(weights, dict) else None
    if not isinstance(state, dict) or not isinstance(w, torch.Tensor):
        has = ", ".join(map(str, list(ckpt)[:6])) or "nothing" if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ConfigError(f"{key} {path}: not a fedsweep checkpoint (no fedsweep state; it holds: {has})")
    return state, w


def check_checkpoint(path: str | Path, module, key: str = "--resume") -> None:
    """``path`` is a fedsweep checkpoint that ``module`` (built from this run's config) can resume:
    :func:`load_state`, and the checkpoint's config equals this one but for :data:`MAY_DIFFER`
    (``rounds`` at least the rounds it has done). Keys a later fedsweep added to the config, absent
    from an older checkpoint, are not compared."""
    state, w = load_state(path, key)
    saved = flatten(state["config"]) if isinstance(state.get("config"), dict) else {}
    here = module.cfg.flat()
    diff = [k for k in here if k in saved and saved[k] != here[k] and k not in MAY_DIFFER
            and not k.startswith(MAY_DIFFER_PREFIX)]
    if w.numel() != module.w.numel() and not diff:
        raise ConfigError(f"{key} {path}: the checkpoint does not match this config (its model has "
                          f"{w.numel()} parameters, this one {module.w.numel()})")
    if diff:
        said = ", ".join(f"{k}: {saved[k]!r} in the checkpoint, {here[k]!r} here" for k in diff[:4])
        more = f" and {len(diff) - 4} more" if len(diff) > 4 else ""
        raise ConfigError(f"{key} {path}: the checkpoint does not match this config ({said}{more}); a resumed "
                          f"run keeps the config it was trained with (only rounds and mlflow.* may change)")
    if state.get("plugins"):   # trained by plugins: their source must be what it was
        from fedsweep.config.plugins import check_unchanged
        check_unchanged(state["plugins"], f"{key} {path}")
    done = int(state.get("rounds_done", 0))
    if module.cfg.rounds < done:
        raise ConfigError(f"{key} {path}: the checkpoint has done {done} rounds, more than rounds={module.cfg.rounds} "
                          f"here; resume with rounds of at least {done}")


def identity_of(path: str | Path, key: str = "--resume") -> dict:
    """The identity a checkpoint carries (``run_uid``, ``mlflow_run_id``, ``tracking_uri``); {} for one
    written before checkpoints carried it."""
    state, _ = load_state(path, key)
    identity = state.get("identity")
    return dict(identity) if isinstance(identity, dict) else {}


def describe(path: Path) -> tuple[str, bool]:
    """A checkpoint in a few words, for messages (its algorithm, seed and round), and whether its run
    stopped before its last round (so it can be continued)."""
    try:
        state, _ = load_state(path)
    except ConfigError:
        return "a file that is not a readable fedsweep checkpoint", False
    cfg = state.get("config") or {}
    algorithm = (cfg.get("algorithm") or {}).get("name", "?")
    done, rounds = state.get("rounds_done", "?"), cfg.get("rounds", "?")
    return f"{algorithm}, seed {cfg.get('seed', '?')}, round {done} of {rounds}", done != rounds


def check_checkpoint_dir(ckpt_dir: str | Path, resume: str | Path | None, resume_identity: dict) -> None:
    """``--checkpoint-dir``'s ``last.ckpt``, if there is one, is this run's own: the checkpoint it
    resumes (the same file, or one of the same run by its ``run_uid``). Any other run's checkpoint is
    refused in one line, never replaced."""
    last = Path(ckpt_dir) / LAST
    if not last.is_file():
        return
    if resume is not None and os.path.samefile(last, resume):
        return
    uid = resume_identity.get("run_uid")
    if uid is not None:
        try:
            if identity_of(last, "--checkpoint-dir").get("run_uid") == uid:
                return
        except ConfigError:
            pass
    what, unfinished = describe(last)
    continued = f"continue that run with --resume {last}, or " if resume is None and unfinished else ""
    raise ConfigError(f"--checkpoint-dir {ckpt_dir}: it holds another run's checkpoint ({what}), which this run "
                      f"would replace; {continued}give this run a folder of its own")


def new_identity() -> dict:
    import uuid
    return {"run_uid": uuid.uuid4().hex}


class Checkpointer:
    """Saves ``<dir>/last.ckpt`` every ``every`` rounds and at the end (atomic rename). A checkpoint
    that cannot be written (a disk that filled up) stops no training: the run goes on, says so once,
    and keeps why in ``module.checkpoint_error`` (the last one written, if any, stays whole)."""

    def __new__(cls, directory: Path, every: int):
        import sys

        import lightning as L

        class _Checkpointer(L.Callback):
            def _save(self, trainer):
                tmp = directory / f"{LAST}.tmp"
                try:
                    directory.mkdir(parents=True, exist_ok=True)
                    trainer.save_checkpoint(tmp)
                    tmp.replace(directory / LAST)
                except OSError as e:
                    tmp.unlink(missing_ok=True)
                    module = trainer.lightning_module
                    if not getattr(module, "checkpoint_error", None):
                        print(f"fedsweep: --checkpoint-dir {directory}: a checkpoint could not be written "
                              f"({e.strerror or e}); the run trains on, and --resume would start from the last "
                              "one written", file=sys.stderr, flush=True)
                    module.checkpoint_error = f"{e.strerror or e}"
                    return
                trainer.lightning_module.checkpoint_error = None

            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                if every and module.rounds_done % every == 0:
                    self._save(trainer)

            def on_train_end(self, trainer, module):
                self._save(trainer)
        return _Checkpointer()
