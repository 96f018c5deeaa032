"""What per-client evaluation (``eval.clients``) costs: each part vectorized against a per-client loop,
and a run's rounds with it against without.

    python benchmarks/client_eval.py --json benchmarks/results-client-eval-cpu-2core.json      # ~3 min

FedProx's synthetic(1, 1) data (N clients, ``--mean-samples`` a client on average, 60 features, 10
classes), the 28k-parameter MLP (one hidden layer of 400), K = 10, E = 5 steps of B = 10, on the CPU.
Each client's test data is matched to its labels (``eval.client_test_size`` samples, default 100).

* ``parts``: at N = ``--clients``, with all N evaluated, the median over ``--repeat`` calls of
  - ``global``: the global model on every client's test data: fedsweep scores each sample the
    clients hold once and sums per client (``engine.evaluate.one_model``) vs one evaluation a client
    (``FunctionalModel.evaluate`` on its own samples, the loop a script would write);
  - ``own``: one model a client (personal or fine-tuned, ``own_models``): chunks of clients under
    ``vmap`` vs one client at a time (the loop engine's path);
  - ``finetune``: ``eval.finetune_steps`` = 5 steps for every client, 64 at a time, vectorized vs loop engine.
* ``rounds``: whole runs of ``--rounds`` rounds evaluating every 10 (``fedsweep.runs.run.train``, the
  vectorized engine), the mean seconds a round (training and evaluation, wall time over the run) with
  ``eval.clients: all`` (and with fine-tuning too) against the same run without per-client evaluation:
  the goal is ≤ 1.5× at K = 10, N = 1,000 without fine-tuning. Each run ``--repeat`` times, alternating,
  the median reported.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time


def config(n: int, rounds: int, mean_samples: int, clients=None, finetune: int = 0):
    from fedsweep.config.schema import build_config
    return build_config({
        "seed": 0, "rounds": rounds, "clients_per_round": 10, "device": "cpu", "engine": "vectorized",
        "data": {"name": "synthetic", "num_clients": n, "options": {"mean_samples": mean_samples}},
        "model": {"name": "mlp", "options": {"hidden": 400}}, "local": {"steps": 5, "batch_size": 10, "lr": 0.05},
        "eval": {"every": 10, "clients": clients, "finetune_steps": finetune}, "mlflow": {"enabled": False}})


def timed(fn, repeat: int) -> float:
    """Median seconds of ``repeat`` calls (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def parts(n: int, mean_samples: int, repeat: int) -> dict:
    import torch

    from fedsweep.engine.evaluate import one_model, own_models
    from fedsweep.runs.client_eval import ClientEvaluator
    from fedsweep.runs.module import FederatedModule
    cfg = config(n, 1, mean_samples, clients="all", finetune=5)
    module = FederatedModule(cfg)
    module.build()
    ev = module.client_eval.groups[0]   # the training clients (no unseen ones here)
    fm, w, bs = module.fmodel, module.w.detach(), cfg.eval.batch_size
    x, y, index = module.data.x_test, module.data.y_test, ev.test
    W = w + 0.01 * torch.randn(len(index), w.numel(), generator=torch.Generator().manual_seed(0))
    loop_engine = ClientEvaluator(cfg, module.data, fm, "loop", module.algorithm, module.clients_cpu, None,
                                  ev.ids.numpy())
    chunk = torch.arange(min(64, n))
    out = {"clients": n, "test_samples_held": int(index.values.numel()),
           "distinct_test_samples": int(torch.unique(index.values).numel()),
           "global_ms": 1e3 * timed(lambda: one_model(fm, w, x, y, index, bs), repeat),
           "global_loop_ms": 1e3 * timed(lambda: [fm.evaluate(w, x[r], y[r], bs) for r in index], repeat),
           "own_ms": 1e3 * timed(lambda: own_models(fm, W, x, y, index, bs, True), repeat),
           "own_loop_ms": 1e3 * timed(lambda: own_models(fm, W, x, y, index, bs, False), repeat),
           "finetune_64_ms": 1e3 * timed(lambda: ev.finetuned(w, 0, chunk), repeat),
           "finetune_64_loop_ms": 1e3 * timed(lambda: loop_engine.finetuned(w, 0, chunk), repeat)}
    for part in ("global", "own", "finetune_64"):
        out[f"{part}_loop_vs_vectorized"] = out[f"{part}_loop_ms"] / out[f"{part}_ms"]
    return out


def run_seconds(n: int, rounds: int, mean_samples: int, clients, finetune: int) -> float:
    from fedsweep.data import load_federated
    from fedsweep.runs.run import train
    cfg = config(n, rounds, mean_samples, clients, finetune)
    data = load_federated(cfg.data, cfg.seed)
    start = time.perf_counter()
    train(cfg, progress=False, data=data)
    return (time.perf_counter() - start) / rounds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--mean-samples", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    result = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {args.threads} threads",
              "torch": torch.__version__, "rounds": args.rounds, "mean_samples": args.mean_samples, "parts": [],
              "rounds_cost": []}
    for n in args.clients:
        row = parts(n, args.mean_samples, args.repeat)
        result["parts"].append(row)
        print(f"N={n:>6,d}  global {row['global_ms']:8.2f} ms (loop {row['global_loop_ms']:8.2f})  own "
              f"{row['own_ms']:8.2f} ms (loop {row['own_loop_ms']:8.2f})  finetune 64 {row['finetune_64_ms']:8.2f} ms "
              f"(loop {row['finetune_64_loop_ms']:8.2f})", file=sys.stderr, flush=True)
    for n in args.clients:
        runs = {"none": [], "clients": [], "finetune": []}
        for _ in range(args.repeat):       # alternating, so drift reaches each alike
            runs["none"].append(run_seconds(n, args.rounds, args.mean_samples, None, 0))
            runs["clients"].append(run_seconds(n, args.rounds, args.mean_samples, "all", 0))
            runs["finetune"].append(run_seconds(n, args.rounds, args.mean_samples, "all", 5))
        med = {k: statistics.median(v) for k, v in runs.items()}
        row = {"clients": n, "K": 10, "eval_every": 10, "round_ms_without": 1e3 * med["none"],
               "round_ms_with_clients": 1e3 * med["clients"], "round_ms_with_finetune": 1e3 * med["finetune"],
               "clients_vs_without": med["clients"] / med["none"], "finetune_vs_without": med["finetune"] / med["none"],
               "each_ms": {k: [1e3 * s for s in v] for k, v in runs.items()}}
        result["rounds_cost"].append(row)
        print(f"N={n:>6,d}  a round {row['round_ms_without']:7.2f} ms; with eval.clients: all "
              f"{row['clients_vs_without']:.2f}x; with fine-tuning too {row['finetune_vs_without']:.2f}x",
              file=sys.stderr, flush=True)
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
