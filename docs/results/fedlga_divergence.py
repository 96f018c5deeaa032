"""Why FedLGA's continuation reading diverges on real MNIST images and not on digits: per round, over
the stragglers, the client gradient's norm ‖g_i‖, a_i = η_l m_i ‖g_i‖² (the factor the rank-1
Hessian term scales ŵ − w_i by, along g_i), and the norm of that term's displacement,
η_l m_i ‖G_i (ŵ − w_i)‖, against the straggler's own update ‖Δ_i‖.

    python docs/results/fedlga_divergence.py [--rounds 30] [--json OUT]

Runs sweeps/fedlga.yaml's base as the study of real images sets it (N = 40 clients of 2 classes,
K = 8, E = 5 steps of B = 10, τ_max = 4, η_l = 0.1, ρ = 0.5, seed 0) on digits and on mnist_5k, with
FedLGA's default reading and each safeguard (``algorithm.damping``), and prints one line per round.
"""
from __future__ import annotations

import argparse
import json
import math

import torch

from fedsweep.config.schema import build_config
from fedsweep.config.registry import get_algorithm_class
from fedsweep.runs.run import train

BASE = {"seed": 0, "rounds": 30, "clients_per_round": 8, "device": "cpu",
        "data": {"num_clients": 40, "partition": {"kind": "classes", "classes_per_client": 2}},
        "model": {"name": "mlp", "options": {"hidden": 400}}, "local": {"steps": 5, "batch_size": 10, "lr": 0.1},
        "heterogeneity": {"kind": "stragglers", "rho": 0.5, "tau_max": 4},
        "algorithm": {"name": "fedlga"}, "eval": {"every": 1}, "mlflow": {"enabled": False}}


def watch(records: list[dict]):
    """Wrap FedLGA.compensated so each round appends the stragglers' quantities to ``records``."""
    cls = get_algorithm_class("fedlga")
    plain = cls.compensated

    def compensated(self, w, uploads, plan):
        out = plain(self, w, uploads, plan)
        slow = plan.stragglers.to(out.device)
        full = (plan.participated & ~plan.stragglers).to(out.device)
        if bool(slow.any()) and bool(full.any()):
            rows = slow.nonzero().squeeze(1)
            d = uploads["delta"][rows]
            g = self.client_gradients(uploads, plan, rows)
            step = self.missing_step_size(plan, d)[rows].squeeze(1)            # η_l m_i
            gg = (g * g).sum(1)
            v = w + uploads["delta"][full].mean(0) - (w + d)                     # ŵ − w_i
            hv = ((g * v).sum(1) / (1.0 + self.damping_for(step, gg))).unsqueeze(1) * g
            records.append({"round": len(records) + 1,
                            "grad_norm": gg.sqrt().median().item(),
                            "a": (step * gg).median().item(), "a_max": (step * gg).max().item(),
                            "hessian_over_delta": ((step.unsqueeze(1) * hv).norm(dim=1)
                                                   / d.norm(dim=1).clamp(min=1e-12)).median().item()})
        return out
    cls.compensated = compensated
    return lambda: setattr(cls, "compensated", plain)


def run(dataset: str, damping, rounds: int) -> dict:
    records: list[dict] = []
    undo = watch(records)
    try:
        raw = {**BASE, "rounds": rounds, "data": {**BASE["data"], "name": dataset},
               "algorithm": {"name": "fedlga", "damping": damping}}
        m = train(build_config(raw), progress=False)
    finally:
        undo()
    accs = [h["test/accuracy"] for h in m.history if "test/accuracy" in h]
    return {"dataset": dataset, "damping": damping, "diverged_round": m.history[-1]["round"] if m.diverged else None,
            "best_accuracy": max(accs), "rounds": records}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = []
    for dataset in ("digits", "mnist_5k"):
        for damping in (0.0, 1.0, "step"):
            r = run(dataset, damping, args.rounds)
            out.append(r)
            how = f"diverged at round {r['diverged_round']}" if r["diverged_round"] else "finished"
            print(f"\n{dataset}, damping {damping}: {how}, best accuracy {r['best_accuracy']:.3f}")
            print("round  ‖g‖ (median)  a = η_l m ‖g‖² (median / max)  ‖Hessian term‖ / ‖Δ_i‖ (median)")
            for rec in r["rounds"][:12]:
                if all(math.isfinite(v) for v in rec.values()):
                    print(f"{rec['round']:>5}  {rec['grad_norm']:>12.3f}  {rec['a']:>14.2f} / {rec['a_max']:<10.2f}"
                          f"  {rec['hessian_over_delta']:>10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
