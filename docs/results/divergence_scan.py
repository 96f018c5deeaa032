"""How far above ln(C), the loss of a uniform guess, a round's train/loss goes in the shipped sweeps'
settings: the measurement behind `eval.divergence_factor`'s default (docs/design.md §2.8).

    python docs/results/divergence_scan.py        # 211 runs of 40 or 100 rounds

Every run is trained with `eval.divergence_factor: null` (stopped by a NaN/inf loss or model only),
and reports its largest train/loss / ln(C). Three groups:

1. sweeps/fedlga.yaml's base (100 rounds) with FedAvg and FedLGA on digits and mnist_5k, ρ 0.5 and
   0.9, at η_l 0.2 and at 0.8, the largest η_l a shipped sweep gives them (sweeps/fedlga_safeguards.yaml);
2. sweeps/fedlga_safeguards.yaml's grid points at η_l = 0.8 (both datasets and partitions, every ρ,
   FedAvg and its three qualified FedLGA variants, 3 seeds): whose rule counts a diverged seed against
   a variant, so the default must not turn these runs into diverged ones;
3. the nine methods of sweeps/baselines_search_mnist5k.yaml at the corner of its space (η_l 0.5,
   η_g 1.5, each method's own parameter at its default), 3 seeds;
4. SCAFFOLD's own draws in that sweep (8 configs, 3 seeds), the one method that blew up in 3.
"""
from __future__ import annotations

import copy
import itertools
import math
from pathlib import Path

import yaml

from fedsweep.config.schema import build_config
from fedsweep.runs.run import train

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"


def peak(raw: dict) -> tuple[float, float, bool]:
    """(largest train/loss / ln C of the run, its best test accuracy, whether it ended NaN/inf)."""
    raw = {**copy.deepcopy(raw), "device": "cpu", "mlflow": {"enabled": False}}
    raw.setdefault("eval", {})["divergence_factor"] = None
    module = train(build_config(raw), progress=False)
    losses = [h["train/loss"] for h in module.history if math.isfinite(h["train/loss"])]
    best = max((h.get("test/accuracy", 0.0) for h in module.history), default=0.0)
    return max(losses, default=math.nan) / math.log(module.data.num_classes), best, module.diverged


def show(label: str, runs: dict[str, dict]) -> None:
    """One line per run, then the largest peak among the runs that did not end NaN/inf."""
    print(f"--- {label}")
    largest = (0.0, "")
    for name, raw in runs.items():
        ratio, best, nan = peak(raw)
        print(f"{name}: peak {ratio:.3g} x ln C, best acc {best:.3f}{', NaN/inf' if nan else ''}", flush=True)
        if not nan and ratio > largest[0]:
            largest = (ratio, name)
    print(f"largest without NaN/inf: {largest[0]:.3g} x ln C ({largest[1]})")


def fedlga_base() -> dict[str, dict]:
    base = yaml.safe_load((SWEEPS / "fedlga.yaml").read_text())["base"]
    runs = {}
    for data, algo, rho, lr in itertools.product(("digits", "mnist_5k"), ("fedavg", "fedlga"), (0.5, 0.9), (0.2, 0.8)):
        raw = copy.deepcopy(base)
        raw["data"]["name"], raw["algorithm"] = data, {"name": algo}
        raw["heterogeneity"]["rho"], raw["local"]["lr"] = rho, lr
        runs[f"{data} {algo} rho={rho} lr={lr}"] = raw
    return runs


def safeguards() -> dict[str, dict]:
    sweep = yaml.safe_load((SWEEPS / "fedlga_safeguards.yaml").read_text())
    algos = [{"name": "fedavg"}] + [a for a in sweep["methods"]["fedlga"]["algorithm"] if a.get("damping") != 0.0]
    runs = {}
    for data, part, rho, algo, seed in itertools.product(("digits", "mnist_5k"), sweep["grid"]["data.partition"],
                                                         sweep["grid"]["heterogeneity.rho"], algos, sweep["seeds"]):
        raw = copy.deepcopy(sweep["base"])
        raw["data"]["name"], raw["data"]["partition"] = data, part
        raw["heterogeneity"]["rho"], raw["local"]["lr"], raw["algorithm"], raw["seed"] = rho, 0.8, algo, seed
        variant = " ".join(str(v) for k, v in algo.items() if k != "name")
        runs[f"{data} {part['kind']} rho={rho} {algo['name']} {variant} s{seed}".replace("  ", " ")] = raw
    return runs


def baselines_corner() -> dict[str, dict]:
    sweep = yaml.safe_load((SWEEPS / "baselines_search_mnist5k.yaml").read_text())
    runs = {}
    for method, seed in itertools.product(sweep["methods"], sweep["seeds"]):
        raw = copy.deepcopy(sweep["base"])
        raw["algorithm"], raw["seed"] = {"name": method}, seed
        raw["local"]["lr"], raw["server"]["lr"] = 0.5, 1.5
        runs[f"mnist_5k {method} lr=0.5 server.lr=1.5 s{seed}"] = raw
    return runs


def scaffold_draws() -> dict[str, dict]:
    from fedsweep.sweep.spec import expand, load_sweep
    path = SWEEPS / "baselines_search_mnist5k.yaml"
    return {t.label: t.config.model_dump(mode="json") for t in expand(load_sweep(path), source=str(path))
            if t.method == "scaffold"}


if __name__ == "__main__":
    show("sweeps/fedlga.yaml's base, seed 0", fedlga_base())
    show("sweeps/fedlga_safeguards.yaml at local.lr = 0.8", safeguards())
    show("sweeps/baselines_search_mnist5k.yaml at local.lr = 0.5, server.lr = 1.5", baselines_corner())
    show("SCAFFOLD's draws in sweeps/baselines_search_mnist5k.yaml", scaffold_draws())
