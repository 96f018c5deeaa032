"""A run's summary: the numbers runs are compared on (``summary/<key>`` in MLflow, ``--output-json``),
made from its metric history alone, so that the driver of a sweep makes a stopped trial's from its
checkpoint as the trial itself would (:mod:`fedsweep.sweep.callbacks`)."""
from __future__ import annotations

import json
import math

import numpy as np

from fedsweep.config.schema import RunConfig

#: The models per-client evaluation scores (``eval.clients``), as their metrics' prefixes
#: (:mod:`fedsweep.runs.client_eval`): the global model, it fine-tuned, the algorithm's personal ones,
#: and the model each client is served (its personal one where the algorithm has them, else the global);
#: with ``eval.unseen_clients``, the global model and it fine-tuned on the clients held out of training.
CLIENT_KINDS = ("clients", "finetuned", "personal", "served", "unseen", "unseen_finetuned")
#: How errors and docs name them: ``<clients|finetuned|...>``.
CLIENT_KINDS_TEXT = "<" + "|".join(CLIENT_KINDS) + ">"

SUMMARY_KEYS = ("best_test_accuracy", "final_test_accuracy", "rounds_to_target", "rounds",
                "seconds_per_round", "comm_up_models", "comm_down_models")


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


def first_at_target(history: list[dict], target: float | None, key: str = "test/accuracy") -> dict | None:
    """The first evaluated row of ``history`` whose ``key`` accuracy is at or above ``target``; None if
    none (or no target)."""
    return next((h for h in history if target is not None and h.get(key, -1.0) >= target), None)


def validation_summary(evals: list[dict], target: float | None) -> dict:
    """The summary's validation numbers (None without a validation split): the best val/accuracy, the
    first evaluated round reaching it and test/accuracy there (the model validation would stop at:
    the run's score), the last val/accuracy, and the first round at ``target`` on validation."""
    vals = [h for h in evals if "val/accuracy" in h]
    if not vals:
        return dict.fromkeys(("best_val_accuracy", "best_val_round", "test_accuracy_at_best_val",
                              "final_val_accuracy", "val_rounds_to_target"))
    best = max(vals, key=lambda h: h["val/accuracy"])   # the first of equal ones: the earliest round
    hit = first_at_target(vals, target, "val/accuracy")
    return {"best_val_accuracy": best["val/accuracy"], "best_val_round": best["round"],
            "test_accuracy_at_best_val": best["test/accuracy"], "final_val_accuracy": vals[-1]["val/accuracy"],
            "val_rounds_to_target": hit["round"] if hit else None}


def summarize(cfg: RunConfig, history: list[dict], diverged: bool = False) -> dict:
    """The numbers a user compares runs on; ``rounds_to_target`` is None if never reached, as are
    the validation numbers (:func:`validation_summary`) without a validation split."""
    evals = [h for h in history if "test/accuracy" in h]
    hit = first_at_target(evals, cfg.eval.target_accuracy)
    upto = [h for h in history if hit is None or h["round"] <= hit["round"]]
    secs = [h["round/seconds"] for h in history]
    def total(key, rows):
        return float(sum(h[key] for h in rows))
    return {
        "status": "diverged" if diverged else "finished",
        "diverged_round": history[-1]["round"] if diverged and history else None,
        "best_test_accuracy": max((h["test/accuracy"] for h in evals), default=None),
        "final_test_accuracy": evals[-1]["test/accuracy"] if evals else None,
        "final_test_loss": evals[-1]["test/loss"] if evals else None,
        "rounds_to_target": hit["round"] if hit else None,
        "seconds_to_target": total("round/seconds", upto) if hit else None,
        "comm_up_to_target": total("comm/up_models", upto) if hit else None,
        **validation_summary(evals, cfg.eval.target_accuracy),
        "rounds": len(history),
        "seconds_per_round": sum(secs) / len(secs) if secs else None,
        "comm_up_models": total("comm/up_models", history),
        "comm_down_models": total("comm/down_models", history),
        "grad_evals": total("compute/grad_evals", history),
        "stability": stability(h["test/accuracy"] for h in evals),
        "target_accuracy": cfg.eval.target_accuracy,
        **client_summary(evals),
        **own_summary(history),
    }


#: The prefixes of fedsweep's own metric names; any other ``<prefix>/<name>`` is an algorithm's own: what
#: its ``round_metrics`` logs each round, declared in ``Algorithm.metrics`` (q-FFL's ``qffl/mean_Fq``).
FEDSWEEP_PREFIXES = frozenset({"test", "val", "best", "train", "round", "comm", "compute", "stragglers", "server",
                               "summary", *CLIENT_KINDS})


def own_metric(name: str) -> bool:
    """Whether ``name`` is an algorithm's own metric (:data:`FEDSWEEP_PREFIXES`): measured on training
    data, as of the latest round that logged it, so selection may read it with or without a validation split."""
    prefix, slash, rest = name.partition("/")
    return bool(slash and prefix and rest) and prefix not in FEDSWEEP_PREFIXES


def own_summary(history: list[dict]) -> dict:
    """The latest value of each metric an algorithm's ``round_metrics`` logs (:func:`own_metric`; a round
    may log none, as q-FFL's where no client returned) and of ``server/loss``, as ``final_<metric>``
    (``qffl/mean_Fq`` -> ``final_qffl_mean_Fq``): what a run's own metrics end at, in the summary (MLflow's
    ``summary/*``, trials.csv, ``fedsweep.tune``'s table), and what ``report.metric`` scores by."""
    latest = latest_own(history, also=("server/loss",))
    return {f"final_{k.replace('/', '_')}": v for k, v in latest.items()}


def latest_own(history: list[dict], also: tuple[str, ...] = ()) -> dict:
    """Each of an algorithm's own metrics (and the keys ``also``) as of the latest round that logged it."""
    out = {}
    for row in history:
        out.update({k: v for k, v in row.items() if k in also or own_metric(k)})
    return out


def client_summary(evals: list[dict]) -> dict:
    """The last evaluation's per-client metrics as ``final_<kind>_<metric>`` (``clients/accuracy_p10`` ->
    ``final_clients_accuracy_p10``), and for each per-client accuracy what selection and scoring read
    (``report.metric``): its best over the evaluations (``best_clients_accuracy_p10``) and, with a
    validation split, its twin's best (``best_clients_val_accuracy_p10``) and the metric at the first
    evaluation reaching that (``clients_accuracy_p10_at_best_val``: the run's score as validation would
    early-stop it); {} without per-client evaluation."""
    last = evals[-1] if evals else {}
    out = {f"final_{k.replace('/', '_')}": v for k, v in last.items() if k.partition("/")[0] in CLIENT_KINDS}
    for key in last:
        kind, _, name = key.partition("/")
        if kind not in CLIENT_KINDS or name.startswith("val_") or name.endswith("_std"):
            continue                  # (a spread is no score: lower is not worse for every question)
        flat, twin = key.replace("/", "_"), f"{kind}/val_{name}"
        rows = [h for h in evals if key in h]
        out[f"best_{flat}"] = max(h[key] for h in rows)
        rows = [h for h in rows if twin in h]
        if rows:
            best = max(rows, key=lambda h: h[twin])    # the first of equal ones: the earliest round
            out[f"best_{twin.replace('/', '_')}"] = best[twin]
            out[f"{flat}_at_best_val"] = best[key]
    return out


def summary_json(summary: dict) -> str:
    """The summary as strict JSON: a NaN or infinite number (a diverged run's loss) becomes null."""
    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v
    return json.dumps({k: clean(v) for k, v in summary.items()}, indent=2, allow_nan=False)


def format_summary(summary: dict) -> str:
    def fmt(v):
        if v is None:
            return "—"
        if isinstance(v, float):
            return f"{v:.4f}" if abs(v) < 10 else f"{v:,.1f}"
        return str(v)
    status = summary["status"]
    if summary.get("diverged_round") is not None:
        status = f"diverged at round {summary['diverged_round']}"
    rows = [("status", status),
            ("best test accuracy", summary["best_test_accuracy"]),
            ("final test accuracy", summary["final_test_accuracy"]),
            (f"rounds to target ({fmt(summary['target_accuracy'])})", summary["rounds_to_target"]),
            *_validation_rows(summary, fmt),
            *_client_rows(summary, fmt),
            ("rounds", summary["rounds"]),
            ("seconds per round", summary["seconds_per_round"]),
            ("stability (lag-1 autocorrelation)", summary["stability"]),
            ("models up / down", f"{fmt(summary['comm_up_models'])} / {fmt(summary['comm_down_models'])}")]
    width = max(len(r[0]) for r in rows)
    line = "─" * (width + 16)
    return "\n".join([line] + [f"{k:<{width}}  {fmt(v)}" for k, v in rows] + [line])


def _client_rows(summary: dict, fmt) -> list[tuple]:
    """format_summary's rows of per-client evaluation: each model's accuracy over the clients."""
    return [(f"{kind} accuracy: mean / worst 10% / min",
             " / ".join(fmt(summary.get(f"final_{kind}_accuracy_{s}")) for s in ("mean", "p10", "min")))
            for kind in CLIENT_KINDS if kind != "served" and f"final_{kind}_accuracy_mean" in summary]


def _validation_rows(summary: dict, fmt) -> list[tuple]:
    """format_summary's rows of a run with a validation split (none without)."""
    if summary.get("best_val_accuracy") is None:
        return []
    return [("best val accuracy", f"{fmt(summary['best_val_accuracy'])} (round {summary['best_val_round']})"),
            ("test accuracy at best val", summary["test_accuracy_at_best_val"]),
            ("final val accuracy", summary["final_val_accuracy"]),
            (f"val rounds to target ({fmt(summary['target_accuracy'])})", summary["val_rounds_to_target"])]
