"""What a run keeps besides its MLflow metrics: config.yaml, metrics.csv, clients.csv, client_eval.csv,
summary.json, curves.png, its plugins' source and model.pt, written into a folder (``fedsweep run``'s
MLflow run and a sweep's trials log them from there)."""
from __future__ import annotations

import csv
from pathlib import Path

import yaml

from fedsweep.config.schema import RunConfig
from fedsweep.runs.summary import summary_json
from fedsweep.util.lazy import torch


def write_artifacts(cfg: RunConfig, module, summary: dict, directory: Path, log_model: bool | None = None) -> Path:
    """config.yaml, metrics.csv, clients.csv, client_eval.csv (``eval.clients``), summary.json, curves.png, the source of each plugin the
    config names (``plugins/``) and (``mlflow.log_model``, unless ``log_model`` says otherwise) model.pt
    of a run, into ``directory``."""
    from fedsweep.runs.plots import curves_png
    directory.mkdir(parents=True, exist_ok=True)
    write_plugin_sources(cfg, directory / "plugins")
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
    scored = getattr(module, "client_eval_rows", None)
    if scored:   # one row per evaluated client: its scores at the last evaluation (eval.clients)
        with open(directory / "client_eval.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in scored for k in row)))
            writer.writeheader()
            writer.writerows(scored)
    (directory / "summary.json").write_text(summary_json(summary))
    from fedsweep.config.names import config_title
    curves_png(module.history, directory / "curves.png", title=config_title(cfg), method=cfg.algorithm.name)
    if cfg.mlflow.log_model if log_model is None else log_model:
        net = module.fmodel.load_into(module.w.detach())
        torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()}, directory / "model.pt")
    return directory


def write_plugin_sources(cfg: RunConfig, folder: Path) -> None:
    """The source files of the plugins ``cfg`` names, as they are now (their hashes are the run's
    ``fedsweep.plugin.*`` tags), into ``folder``; nothing without plugins."""
    if not cfg.plugins:
        return
    from fedsweep.config.plugins import load_plugins, source_files
    for plugin in load_plugins(cfg.plugins):
        for name, path in source_files(plugin):
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(path.read_bytes())


def artifact_dict(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory``, by its path relative to it (``plugins/mylab.py``)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
