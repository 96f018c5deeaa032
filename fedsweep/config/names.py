"""Short names for config values, where width is scarce: MLflow run names (``fedlga ρ0.9 ηl0.1 ηg1
s2``), the Dataset column (``mnist_5k classes2 N50``) and plot legends."""
from __future__ import annotations

from typing import Any

#: How the keys people sweep are written; other keys go by their last name (``steps5``), and the
#: keys in VALUE_ONLY by their value alone (``mnist_5k``, ``dir0.3``, ``extrapolation``).
SHORT_KEYS = {"heterogeneity.rho": "ρ", "local.lr": "ηl", "server.lr": "ηg", "server_data.lr": "γ",
              "server_data.fraction": "ms", "algorithm.temperature": "T", "algorithm.mu": "μ",
              "algorithm.alpha": "α", "algorithm.beta": "β", "algorithm.radius": "r", "algorithm.damping": "λ",
              "clients_per_round": "K", "local.steps": "E", "local.batch_size": "B", "heterogeneity.tau_max": "τ",
              "data.num_clients": "N", "seed": "s"}
VALUE_ONLY = ("data.name", "data.partition", "model.name", "algorithm.reading", "algorithm.grad_source",
              "algorithm.weighting", "heterogeneity.kind", "engine", "local.unit")


def partition_label(partition: dict) -> str:
    """A partition in a few characters: ``iid``, ``classes2``, ``dir0.3``, ``shards33``, ``qty4``."""
    kind = partition.get("kind", "iid")
    value = {"classes": partition.get("classes_per_client"), "dirichlet": partition.get("alpha"),
             "shards": partition.get("shard_size"), "quantity": partition.get("ratio")}.get(kind)
    short = {"dirichlet": "dir", "quantity": "qty"}.get(kind, kind)
    return short if value is None else f"{short}{value:g}"


def short(key: str, value: Any) -> str:
    """``key``'s ``value`` in a few characters: ``ρ0.9``, ``ηl0.1``, ``s2``, ``dir0.3``, ``T0.3``."""
    if key == "data.partition" and isinstance(value, dict):
        return partition_label(value)
    if isinstance(value, dict):     # e.g. a whole `algorithm:` block: its settings but the name
        return ",".join(short(f"{key}.{k}", v) for k, v in value.items() if k != "name")
    text = f"{value:g}" if isinstance(value, float) else str(value)
    if key in VALUE_ONLY:
        return text
    return SHORT_KEYS.get(key, key.rsplit(".", 1)[-1]) + text


def config_title(cfg) -> str:
    """A run's config in one line, for a plot's title: the method and its own settings, the data,
    then what every FL run sets (``fedlga on digits classes2 N50 · K10 ρ0.5 E5 B10 ηl0.1 ηg1 · s0``)."""
    flat = cfg.flat()
    own = [short(k, v) for k, v in flat.items() if k.startswith("algorithm.") and k != "algorithm.name"
           and k in SHORT_KEYS]
    data = f"{cfg.data.name} {partition_label(cfg.data.partition.model_dump())} N{cfg.data.num_clients}"
    work = [short(k, flat[k]) for k in ("clients_per_round", "heterogeneity.rho", "local.steps", "local.batch_size",
                                        "local.lr", "server.lr") if k in flat and flat[k] is not None]
    return " · ".join([" ".join([cfg.algorithm.name, *own]) + f" on {data}", " ".join(work), short("seed", cfg.seed)])
