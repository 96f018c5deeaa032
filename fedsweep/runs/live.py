"""``fedsweep run``'s MLflow run, written while it trains (docs/run.md, "Where runs go").

The run exists in MLflow from its start (RUNNING, with its params, tags and dataset input), its
metric rows arrive at each evaluation, and its artifacts, summary and status at its end, as
Lightning's ``MLFlowLogger`` would write them; every write goes through a
:class:`~fedsweep.runs.writer.Writer`, so a store that fails mid-run never stops the training. A
resumed run (``--resume``) continues the MLflow run its checkpoint names, from the first round
that run lacks. If the store still fails once the run has ended (``mlflow.retry_seconds``), the
whole run is kept in a folder and ``fedsweep log FOLDER`` writes it later: :func:`keep_unlogged`.
"""
from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from fedsweep.config.schema import ConfigError, RunConfig
from fedsweep.runs.kept import keep_unlogged, kept_records_of, log_unlogged
from fedsweep.runs.store_errors import silence
from fedsweep.runs.writer import Writer

KEY = "run"
#: How long a run's start waits for the store before it trains anyway: enough for a store that
#: answers to say that the experiment was deleted, before any work.
START_WAIT_S = 5.0
#: Metric rows reach MLflow at most this often while a run trains (runs/writer.py says why).
ROWS_EVERY_S = 5.0


class LiveRun:
    """One run's MLflow record, written as it trains. ``identity``: the run's (and its checkpoint's)
    ``run_uid``, and for a resumed run the MLflow run it continues. ``out``: where the run's first
    line goes, naming the MLflow run and the command to watch it (default stdout), or saying that a
    slow store has not answered yet (default stderr); the Python API's quiet run gives a sink.
    ``say``: where the store's faults are said (default stderr)."""

    def __init__(self, cfg: RunConfig, uri: str, identity: dict, say=None, out=None, checkpoint_dir=None):
        self.cfg, self.uri, self.identity, self.checkpoint_dir = cfg, uri, identity, checkpoint_dir
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.out = out
        self.writer = Writer(uri, say=self.say, rows_every=ROWS_EVERY_S)
        self.sent = 0
        self.engine_logged = False
        self.started = False
        self.beating = threading.Event()   # set: the heartbeat stops

    @property
    def name(self) -> str:
        return self.cfg.mlflow.run_name or f"{self.cfg.algorithm.name}-seed{self.cfg.seed}"

    def _open(self, writer: Writer, reopen: str | None) -> None:
        from fedsweep.config.plugins import plugin_tags, records
        from fedsweep.runs.orphans import writer_tags
        writer.open_run(KEY, self.cfg.mlflow.experiment, self.name, reopen=reopen,
                        tags={"fedsweep.status": "running", "fedsweep.algorithm": self.cfg.algorithm.name,
                              "fedsweep.run_uid": self.identity["run_uid"], **plugin_tags(records(self.cfg.plugins)),
                              **writer_tags(self.checkpoint_dir)},
                        params=self.cfg.flat(), config=self.cfg.model_dump(mode="json"))
        if reopen:   # it goes on: an earlier process's failure no longer describes it (a new one says its own)
            writer.delete_tag(KEY, "fedsweep.error")

    def start(self) -> None:
        """Create (or reopen) the run; wait up to :data:`START_WAIT_S` for the store, so that a store
        that refuses the run for good (a deleted experiment) is said in one line before any training."""
        from fedsweep.runs.orphans import end_orphaned_runs
        # Runs of killed processes in this store end KILLED (off the training's path: a locked store
        # would hold it up to 20 s a query)
        threading.Thread(target=end_orphaned_runs, args=(self.uri, self.say), daemon=True,
                         name="fedsweep-orphans").start()
        if "tracking_uri" in self.identity:   # a resumed run: what an earlier process of it kept goes first
            self._log_kept()
        same_store = self.identity.get("tracking_uri") == self.uri
        self._open(self.writer, self.identity.get("mlflow_run_id") if same_store else None)
        self.started = True
        threading.Thread(target=self._heartbeat, daemon=True, name="fedsweep-heartbeat").start()
        self.identity["tracking_uri"] = self.uri
        if self.writer.drain(START_WAIT_S):
            self.identity["mlflow_run_id"] = self.writer.run_id(KEY)
            from fedsweep.runs.tracking import ui_command
            print(f"MLflow run {self.identity['mlflow_run_id']}: watch it train with:  "
                  f"{ui_command(self.uri, experiment=self.cfg.mlflow.experiment, run_id=self.identity['mlflow_run_id'])}",
                  file=self.out or sys.stdout, flush=True)
            return
        failure = self.writer.failure
        if failure is not None and failure[1]:
            self.writer.close(0)
            raise ConfigError(f"mlflow.experiment {self.cfg.mlflow.experiment!r}: {failure[0]}")
        line = (f"MLflow: the store at {self.uri} has not answered in {START_WAIT_S:.0f} s" +
                (f" ({failure[0]})" if failure else "") + "; training starts, and its records wait until it does")
        if failure is None:   # slow, not failing (a new store's tables take seconds to make): the first line
            print(line, file=self.out or sys.stderr, flush=True)
        else:
            self.say(line)

    def _heartbeat(self) -> None:
        """``fedsweep.heartbeat`` every :data:`~fedsweep.runs.orphans.HEARTBEAT_S` seconds while the run
        lives: how a command on another machine tells a live run from a killed one."""
        from fedsweep.runs.orphans import HEARTBEAT_S
        while not self.beating.wait(HEARTBEAT_S):
            self.writer.batch(KEY, tags={"fedsweep.heartbeat": str(int(time.time()))})

    def _log_kept(self) -> None:
        """The records an earlier process of this run kept on disk (its store failed: exit 5, or Ctrl-C
        while it waited), written now, before the run goes on: the resumed run then continues the
        MLflow run they begin, and ``fedsweep log`` of their folder says they are logged. While the
        store still fails they stay kept (one line says so) and the run goes on without them."""
        import io
        import json
        for folder, record_uri in kept_records_of(self.identity["run_uid"]):
            if record_uri != self.uri:
                self.say(f"fedsweep: records of this run kept in {folder} are for the store at {record_uri}, not "
                         f"{self.uri}; log them there with: fedsweep log {folder}")
                continue
            try:
                log_unlogged(folder, out=io.StringIO())
            except ConfigError as e:
                self.say(f"fedsweep: the records of this run kept in {folder} cannot be written yet ({e}); "
                         "the run goes on and they stay kept")
                continue
            ids = json.loads((folder / "logged.json").read_text()).get("ids", {})
            if ids.get(KEY):
                self.identity["mlflow_run_id"] = ids[KEY]
                self.say(f"fedsweep: wrote the records an earlier process of this run kept in {folder}; "
                         f"it continues MLflow run {ids[KEY]}")

    def callback(self):
        """The Lightning callback that sends the metric rows at each evaluation (and where a run
        stops early), and keeps the MLflow run's id in the run's identity for its checkpoints."""
        import lightning as L
        live = self

        class LiveMetrics(L.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                live.identity["mlflow_run_id"] = live.writer.run_id(KEY)
                if module.history and ("test/accuracy" in module.history[-1] or module.diverged):
                    live.send(module)
        return LiveMetrics()

    def send(self, module) -> None:
        self.writer.rows(KEY, module.history[self.sent:])
        self.sent = len(module.history)
        if not self.engine_logged and getattr(module, "engine_name", None):
            why = getattr(module, "engine_why", "")
            self.writer.batch(KEY, params={"engine_used": module.engine_name},
                              tags={"fedsweep.engine_why": why} if why else None)
            self.engine_logged = True

    def _final(self, writer: Writer, summary: dict, files: dict[str, bytes]) -> None:
        from fedsweep.runs.tracking import MLFLOW_STATUS, run_tags, summary_metrics
        writer.files(KEY, files)
        writer.batch(KEY, metrics={m.key: m.value for m in summary_metrics(summary, 0)}, tags=run_tags(summary))
        writer.end(KEY, MLFLOW_STATUS.get(summary.get("status", "finished"), "FAILED"))

    def abort(self, error: BaseException, grace: float = 10.0) -> None:
        """The run stopped on ``error`` mid-training (a crash; a second Ctrl-C): its MLflow run ends
        ``failed`` with the error's last line (``interrupted`` for Ctrl-C), with the rows it sent, if
        the store takes it within ``grace`` seconds."""
        if not self.started:
            return
        self.beating.set()
        from fedsweep.runs.tracking import MLFLOW_STATUS
        status = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
        line = (str(error).strip().splitlines() or [""])[-1]
        tags = {"fedsweep.status": status, **({"fedsweep.error": f"{type(error).__name__}: {line}"[:5000]}
                                              if status == "failed" else {})}
        self.writer.batch(KEY, tags=tags)
        self.writer.end(KEY, MLFLOW_STATUS[status])
        self.writer.close(min(grace, self.cfg.mlflow.retry_seconds))

    def finish(self, module, summary: dict, files: dict[str, bytes]) -> tuple[str, str] | Path:
        """The last rows, the artifacts (``files``), the summary and the status. Returns (experiment id,
        run id) once the store has all of it; else, after ``mlflow.retry_seconds`` (or at once when
        the store refuses the run for good, or on Ctrl-C), the folder the whole run is kept in."""
        self.beating.set()
        self.send(module)
        self._final(self.writer, summary, files)
        try:
            done = self.writer.close(self.cfg.mlflow.retry_seconds)
        except KeyboardInterrupt:   # Ctrl-C while waiting for the store: keep the records at once
            done = self.writer.close(0)
        if done:
            return self.writer.experiment_id(self.cfg.mlflow.experiment), self.writer.run_id(KEY)
        return keep_unlogged(self._whole_run(module, summary, files), self.name,
                             cause=self.writer.failure[0] if self.writer.failure else
                             silence(self.cfg.mlflow.retry_seconds))

    def _whole_run(self, module, summary: dict, files: dict[str, bytes]) -> Writer:
        """Every write of the run, from its creation (or the reopening of the MLflow run the store
        already began) to its status, held for :func:`keep_unlogged`: replayed, it writes exactly
        what the store lacks."""
        kept = Writer(self.uri, start=False)
        self._open(kept, self.writer.run_id(KEY))
        kept.rows(KEY, module.history)
        if getattr(module, "engine_name", None):
            kept.batch(KEY, params={"engine_used": module.engine_name})
        self._final(kept, summary, files)
        return kept


def end_run(live: LiveRun, module, summary: dict, out) -> None:
    """The run's last MLflow writes (:meth:`fedsweep.runs.live.LiveRun.finish`) and the lines saying
    where the run is: the summary gets ``mlflow_run_id``, or ``mlflow_unlogged`` (the folder its
    records are kept in, '' where none could keep them) when the store did not take it."""
    from fedsweep.runs.tracking import ui_command
    cfg, uri = live.cfg, live.uri
    try:
        files = artifact_bytes(cfg, module, summary)
    except OSError as e:   # no room to draw them (a full temp folder): the run is logged without them
        print(f"fedsweep: the run's artifacts could not be made ({e.strerror or e}); it is logged without them",
              file=sys.stderr)
        files = {}
    try:
        ended = live.finish(module, summary, files)
    except OSError as e:   # the store failed and no folder could keep its records either
        ended = e
    cause = live.writer.failure[0] if live.writer.failure else silence(cfg.mlflow.retry_seconds)
    if isinstance(ended, OSError):
        summary["mlflow_unlogged"] = ""
        print(f"fedsweep: the MLflow store at {uri} did not take this run ({cause}), and its records could not be "
              f"kept on disk either ({ended.strerror or ended}); the summary above is what is left of it",
              file=sys.stderr)
    elif isinstance(ended, Path):
        summary["mlflow_unlogged"] = str(ended)
        print(f"fedsweep: the MLflow store at {uri} did not take this run ({cause}); its records are kept in "
              f"{ended}: once the store works, log them with: fedsweep log {ended}", file=sys.stderr)
    else:
        experiment_id, run_id = ended
        summary["mlflow_run_id"], summary["mlflow_tracking_uri"] = run_id, uri
        print(f"logged to MLflow run {run_id} (experiment {cfg.mlflow.experiment!r})\n"
              f"open it with:  {ui_command(uri, experiment=cfg.mlflow.experiment, run_id=run_id)}", file=out)


def artifact_bytes(cfg: RunConfig, module, summary: dict) -> dict[str, bytes]:
    """A run's artifacts (:func:`fedsweep.runs.run.write_artifacts`) as name -> content."""
    from fedsweep.runs.artifacts import artifact_dict, write_artifacts
    with tempfile.TemporaryDirectory(prefix="fedsweep-") as tmp:
        write_artifacts(cfg, module, summary, Path(tmp))
        return artifact_dict(Path(tmp))
