"""In the sweep's driver: what the terminal shows of a sweep (:func:`make_progress_callback`).

One line per finished, stopped, diverged, failed or retried trial (a cause in one short line: Ray's
own messages for a lost worker or node in words), and a status line for the whole sweep every 10 s
with the time so far and an estimate of the time left. ``fedsweep.tune(progress=False)`` runs the
sweep inside :func:`silenced`, which these lines (and the sweep's first line) then skip.
"""
from __future__ import annotations

import contextlib
import math
import sys
import time

from fedsweep.config.names import short
from fedsweep.runs.summary import first_at_target, own_metric
from fedsweep.sweep.callbacks import member_status, trial_error
from fedsweep.sweep.spec import drawn_payload

#: Ray's long messages for a lost worker or node, said in words on the terminal (the full text stays
#: in the trial's error.txt, which the line names).
RAY_CAUSES = (("is unavailable", "its worker or its node stopped answering"),
              ("marked dead", "its node was marked dead"),
              ("The actor died", "its worker process died"),
              ("running low on memory", "its node ran out of memory"),
              ("OutOfMemoryError", "its node ran out of memory"))
TERMINAL_WIDTH = 160
STATUS_EVERY_S = 10.0   # the sweep's status line, this often


_silenced = 0   # blocks of `silenced` entered: a driver runs one sweep at a time (Ray's session is its process's)


@contextlib.contextmanager
def silenced():
    """The sweep's terminal view (its first line, a line per trial, the status lines) unprinted while
    the block runs; the MLflow store's faults are still said by the driver's writer. A switch of the
    process rather than an argument: a resumed sweep's callbacks are the ones Ray Tune pickled when
    the sweep started, and they call :func:`show`, which is pickled by reference and reads it here."""
    global _silenced
    _silenced += 1
    try:
        yield
    finally:
        _silenced -= 1


def show(text: str, stream=None) -> None:
    """One of the sweep's terminal lines, on stderr (or ``stream``), unless :func:`silenced`."""
    if not _silenced:
        print(text, file=stream or sys.stderr, flush=True)


def short_cause(error: str) -> str:
    """A trial's error for one terminal line: Ray's own lost-worker messages in words, anything else
    cut to TERMINAL_WIDTH characters."""
    for pattern, words in RAY_CAUSES:
        if pattern in error:
            return words
    return error if len(error) <= TERMINAL_WIDTH else error[:TERMINAL_WIDTH - 1] + "…"


def member_statuses(trial, units: list[list[int]]) -> list[str]:
    """fedsweep's word for where each sweep trial of a Tune trial stands: pending, running, finished,
    diverged, stopped or failed."""
    unit = units[trial.config["trial"]]
    if trial.status == "TERMINATED":
        return [member_status(trial, i) for i in unit]
    return ["failed" if trial.status == "ERROR" else trial.status.lower()] * len(unit)


def setting_of(payload: dict, settings) -> str:
    """The trial's values of the ``settings`` keys, short (``ρ0.5``); empty for none."""
    parts = []
    for key in settings:
        node = payload["run"]
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            parts.append(short(key, node))
    return " ".join(parts)


def make_progress_callback(payloads: list[dict], units: list[list[int]], store=None, stream=None,
                           indices: list[int] | None = None, later: str = "pending", settings=(),
                           metric: str | None = None, mode: str = "max", lead: bool = True):
    """A live view of the whole sweep: one line per finished trial and a status line every 10 s with
    the time so far and, once trials report, an estimate of the time left (from the rounds trained
    per second since the first report). Counts come from Tune's list of every trial, so a resumed
    sweep counts what ran before too. ``store``: the sweep's storage, to say where a failed trial's
    traceback is kept. ``indices``: the sweep trials this Tune run has (default every one; the confirm
    stage's run has only its own). ``later``: what the status line calls trials Tune has not made yet
    (``to draw`` for optuna's slots, whose values are drawn when they start). ``settings``: the keys
    methods are compared under (``report.settings``): the status line shows the run leading on
    validation (on test where runs have no validation split) under each of their values by what
    selection ranks: with a target accuracy, the fewest rounds to it so far (then accuracy; a run
    that has not reached it ranks below every one that has), else the best accuracy so far; with
    ``metric`` (``report.metric``, better as ``mode`` says) its best so far (a per-client accuracy: its
    validation twin where runs have that split). One seed's numbers: selection itself waits for every
    seed and takes their mean. ``lead`` False (the confirm stage, whose configs are chosen): none shown."""
    from ray import tune
    stage = list(range(len(payloads))) if indices is None else list(indices)

    class Progress(tune.Callback):
        def __init__(self):
            self.total, self.best = len(stage), {}   # setting -> (rank key, run name, split, text)
            self.seen: dict[int, tuple] = {}         # sweep trial -> (first round at target or None, best accuracy)
            self.scores: dict[int, tuple] = {}       # sweep trial -> (its best on the selecting split, the score there)
            self.storage_said = False
            self._start_clock()

        def _start_clock(self):
            self.rounds_total = sum(payloads[i]["run"]["rounds"] for i in stage)
            self.started, self.last_print = time.monotonic(), time.time()
            self.reported: dict[int, int] = {}   # sweep trial -> last round it reported
            self.first: tuple[float, int] | None = None   # (when, rounds done) at the first report
            self.last_report = time.monotonic()
            self.trials = None

        def __getstate__(self):                  # what Tune pickles: not this driver's ticker thread
            return {k: v for k, v in self.__dict__.items() if k not in ("ticker", "trials")}

        def __setstate__(self, state):           # restored by `--resume`: this driver's clock
            self.__dict__.update({"scores": {}, **state})   # (a sweep started before trials' scores were kept)
            self._start_clock()

        def setup(self, **info):
            """A status line every 10 s even when no trial reports (Tune waiting on a node that died,
            with nothing to take its trials; a first trial still importing): a sweep never looks hung."""
            import threading
            self.ticker = threading.Event()

            def tick():
                while not self.ticker.wait(min(1.0, STATUS_EVERY_S / 4)):
                    if self.trials is not None and time.time() - self.last_print > STATUS_EVERY_S:
                        self.last_print = time.time()
                        self._print(self._line(self.trials))
            threading.Thread(target=tick, name="fedsweep-status", daemon=True).start()

        def on_step_begin(self, iteration, trials, **info):
            self.trials = trials                 # Tune's own list: the ticker reads it as it is

        def _label(self, trial, index: int) -> str:
            payloads[index] = drawn_payload(payloads[index], trial.config.get("sampled"))   # optuna's values
            return payloads[index]["label"]

        def _rounds_done(self, trials) -> int:
            """Rounds trained over the sweep's trials; an ended trial counts whole (it needs no more)."""
            done = 0
            for t in trials:
                for i in units[t.config["trial"]]:
                    ended = t.status in ("TERMINATED", "ERROR")
                    done += payloads[i]["run"]["rounds"] if ended else self.reported.get(i, 0)
            return done

        def _line(self, trials) -> str:
            counts: dict[str, int] = {}
            for t in trials:
                for s in member_statuses(t, units):
                    counts[s] = counts.get(s, 0) + 1
            if sum(counts.values()) < self.total:   # trials Tune has not made yet (optuna's slots: not drawn)
                counts[later] = counts.get(later, 0) + self.total - sum(counts.values())
            parts = [f"{v} {k}" for k, v in sorted(counts.items())]
            best = ""
            if self.best:
                split = "val" if any(b[2] == "val" for b in self.best.values()) else "test"
                by = f" by {self._column(split)}" if metric else ""
                best = f" | leading on {split}{by}: " + "; ".join(
                    f"{text} {name}" for _, (_, name, _, text) in sorted(self.best.items()))
            now, done, total = time.monotonic(), self._rounds_done(trials), self.rounds_total
            from fedsweep.runs.run import duration
            clock = f" | {duration(now - self.started)}"
            if self.first and self.first[1] < done < total and now - self.first[0] >= 5:
                # rounds per second since the first report (start-up excluded) over what is left
                rate = (done - self.first[1]) / (now - self.first[0])
                clock += f", ~{duration((total - done) / rate)} left"
            quiet = now - self.last_report
            if quiet >= 3 * STATUS_EVERY_S and counts.get("running"):
                clock += f" | no trial has reported for {duration(quiet)}"
            return f"[sweep] {self.total} trials: {', '.join(parts)}{best}{clock}"

        def _print(self, text):
            show(text, stream)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.last_report = time.monotonic()
            if self.first is None:
                self.first = (time.monotonic(), self._rounds_done(trials))
            if result.get("storage_error") and not self.storage_said:
                self.storage_said = True
                where = store.where() if store is not None else "the storage"
                self._print(f"[storage] {self._label(trial, units[trial.config['trial']][0])}: its checkpoint could not "
                            f"be written to {where} ({result['storage_error']}); trials go on and their results reach "
                            "MLflow, but a retried or resumed trial starts from its last checkpoint written")
            if "resumed_from" in result:
                unit = units[trial.config["trial"]]
                what = self._label(trial, unit[0]) if len(unit) == 1 else \
                    f"pack {trial.config['trial']} ({len(unit)} trials)"
                self._print(f"[resumed] {what}: from round {result['resumed_from']} (its checkpoint)")
            for index, part in result.get("members", {}).items():
                if part.get("rows"):
                    self.reported[int(index)] = max(self.reported.get(int(index), 0), part["rows"][-1]["round"])
                self._keep_score(int(index), part.get("rows", []))
                self._lead(trial, int(index), part.get("rows", []))
            if time.time() - self.last_print > STATUS_EVERY_S:
                self.last_print = time.time()
                self._print(self._line(trials))

        def _keep_score(self, index: int, rows: list[dict]):
            """Keep ``index``'s best on the split that selects (validation where it has one) and the
            scored number at the first round reaching it, as its summary computes them: the line a
            trial ends with reads them, and a trial the scheduler stopped ends without a summary."""
            split = "val" if any(self._column("val") in r for r in rows) else "test"
            pick, score = self._column(split), self._column("test")
            sign = -1.0 if metric and mode == "min" else 1.0
            latest = bool(metric) and own_metric(metric)        # an own metric: its latest value selects
            best = self.scores.get(index)
            for r in rows:
                if math.isfinite(r.get(pick, math.nan)) and (best is None or latest or sign * r[pick] > sign * best[0]):
                    best = (r[pick], r.get(score, math.nan), split)
            if best is not None:
                self.scores[index] = best

        def _said(self, index: int, part: dict) -> str:
            """A trial's numbers on the line it ends with: what selection reads and what it is scored by
            (``report.metric`` where set), from its rows (:meth:`_keep_score`)."""
            best, score, split = self.scores.get(index, (math.nan, math.nan, "test"))
            if not metric:
                if split == "test":
                    return f"best acc {part.get('best/test_accuracy', best):.4f}"
                return f"best val acc {best:.4f}, test acc at best val {score:.4f}"
            pick, scored = self._column(split), self._column("test")
            if own_metric(metric):
                return f"{pick} {best:.4f} (its latest)"
            return f"best {pick} {best:.4f}, {scored} there {score:.4f}"

        @staticmethod
        def _column(split: str) -> str:
            """What a run is ranked by on ``split``: its accuracy, or ``metric`` (on val its twin)."""
            if not metric:
                return f"{split}/accuracy"
            return metric if split == "test" or own_metric(metric) else metric.replace("/accuracy_", "/val_accuracy_")

        def _lead(self, trial, index: int, rows: list[dict]):
            """Keep ``index``'s first round at the target and best accuracy (on val where it has a
            validation split) and, if it now leads its setting by selection's ranking, say so."""
            if not lead:
                return
            split = "val" if any("val/accuracy" in r for r in rows) else "test"
            column = self._column(split)
            accs = [(r["round"], r[column] if mode == "max" or not metric else -r[column]) for r in rows
                    if math.isfinite(r.get(column, math.nan))]
            if not accs:
                return
            target = None if metric else payloads[index]["run"].get("eval", {}).get("target_accuracy")
            hit, best = self.seen.get(index, (None, -math.inf))
            if hit is None and (row := first_at_target(rows, target, f"{split}/accuracy")):
                hit = row["round"]
            best = max(best, max(acc for _, acc in accs))
            self.seen[index] = (hit, best)
            key = (hit is not None, -(hit or 0), best)   # larger leads
            where = setting_of(payloads[index], settings)
            if where not in self.best or key > self.best[where][0]:
                self._label(trial, index)      # optuna's drawn values into the payload's name
                shown = -best if metric and mode == "min" else best
                text = f"{hit} rounds to {target:g}" if hit is not None else f"{shown:.4f}"
                self.best[where] = (key, payloads[index].get("name") or payloads[index]["label"], split, text)

        def on_trial_complete(self, iteration, trials, trial, **info):
            parts = (trial.last_result or {}).get("members", {})
            last = trial.last_result or {}
            for index in units[trial.config["trial"]]:
                part = {**last, **parts.get(str(index), {})}   # a stopped trial's last report says it
                if part.get("error"):
                    self._print(f"[failed] {self._label(trial, index)}: {part['error']}")
                    continue
                said = self._said(index, part)
                self._print(f"[{member_status(trial, index)}] {self._label(trial, index)}: {said} "
                            f"after {part.get('round', 0)} rounds")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._print_error(trial, "failed")

        def on_trial_recover(self, iteration, trials, trial, **info):
            self._print_error(trial, "retrying", f"failure {trial.num_failures}; ")

        def _print_error(self, trial, word: str, note: str = ""):
            where = f"{trial.path}/error.txt"   # kept with the sweep (error_file is Ray's staging copy)
            if store is not None and not store.local:
                where = f"{store.scheme}://{where}"
            for index in units[trial.config["trial"]]:
                self._print(f"[{word}] {self._label(trial, index)}: {short_cause(trial_error(trial))} "
                            f"({note}traceback: {where})")

        def on_experiment_end(self, trials, **info):
            if getattr(self, "ticker", None) is not None:
                self.ticker.set()
            self._print(self._line(trials))

    return Progress()
