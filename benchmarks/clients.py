"""A round's cost and a run's peak memory from N = 100 to 1,000,000 clients: what a round costs should
be what its K sampled clients cost, whatever N is.

    python benchmarks/clients.py --json benchmarks/results-clients-cpu-2core.json          # ~20 min

Each case (N, algorithm, K) runs in a fresh process (the peak memory is the process's): FedProx's
synthetic(1, 1) data (lognormal client sizes, ``--mean-samples`` a client on average, 60 features, 10
classes: the data grow with N), the 28k-parameter MLP (one hidden layer of 400), E = 5 local steps of
B = 10, ``--rounds`` rounds, no evaluation until the last round, through ``fedsweep.runs.run.train``
(Lightning, the vectorized engine) as ``fedsweep run`` trains. Reported per case: set-up seconds (data
and model), the median round time over rounds 2.. (``round/seconds``: planning, batches, local training,
aggregation, server step), the data's bytes, the per-client state held at the end, and the peak
resident memory (``ru_maxrss``); per (algorithm, K), each round time as a ratio to N's smallest.
Round times of one process move by ±25% between processes (which clients a round samples, and the
machine), so each case runs ``--repeat`` times, the repeats going round every case, and the median
of the processes' medians is reported (with each one's).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def case(n: int, algorithm: str, k: int, rounds: int, mean_samples: int, threads: int) -> dict:
    """One (N, algorithm, K) case in this process."""
    import torch
    torch.set_num_threads(threads)
    from fedsweep.config.schema import build_config
    from fedsweep.data import load_federated
    from fedsweep.runs.memory import data_bytes
    from fedsweep.runs.run import train
    cfg = build_config({
        "seed": 0, "rounds": rounds, "clients_per_round": k, "device": "cpu", "engine": "vectorized",
        "data": {"name": "synthetic", "num_clients": n, "synthetic": {"mean_samples": mean_samples}},
        "model": {"name": "mlp", "hidden": 400}, "local": {"steps": 5, "batch_size": 10, "lr": 0.05},
        "algorithm": {"name": algorithm}, "eval": {"every": rounds}, "mlflow": {"enabled": False}})
    start = time.perf_counter()
    data = load_federated(cfg.data, cfg.seed)
    loaded = time.perf_counter() - start
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    module = train(cfg, progress=False, data=data)
    seconds = [h["round/seconds"] for h in module.history]
    held, clients, _ = module.algorithm.client_state_held()
    return {"clients": n, "algorithm": algorithm, "K": k, "rounds": rounds,
            "train_samples": int(data.y_train.numel()), "largest_client": data.client_indices.max_size,
            "data_mb": data_bytes(data) / 1e6, "load_s": loaded,
            "first_round_ms": 1e3 * seconds[0], "round_ms": 1e3 * statistics.median(seconds[1:]),
            "client_state_mb": held / 1e6, "clients_with_state": clients,
            "peak_rss_after_data_mb": rss_loaded, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10_000, 100_000, 1_000_000])
    ap.add_argument("--algorithms", nargs="+", default=["fedavg", "scaffold"])
    ap.add_argument("--k", type=int, nargs="+", default=[10, 100], help="clients per round")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--mean-samples", type=int, default=10, help="mean training samples a client")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes a case; the median of their medians")
    ap.add_argument("--json")
    ap.add_argument("--case", nargs=3, metavar=("N", "ALGORITHM", "K"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        n, algorithm, k = args.case
        print(json.dumps(case(int(n), algorithm, int(k), args.rounds, args.mean_samples, args.threads)))
        return 0
    cases = [(a, k, n) for a in args.algorithms for k in args.k for n in args.clients if k <= n]
    runs: dict[tuple, list[dict]] = {c: [] for c in cases}
    for r in range(args.repeat):          # repeats go round all cases, so drift reaches every N alike
        for algorithm, k, n in cases:
            cmd = [sys.executable, __file__, "--case", str(n), algorithm, str(k), "--rounds", str(args.rounds),
                   "--mean-samples", str(args.mean_samples), "--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return done.returncode
            row = json.loads(done.stdout.strip().splitlines()[-1])
            runs[(algorithm, k, n)].append(row)
            print(f"[{r + 1}/{args.repeat}] {algorithm:9s} K={k:<4d} N={n:>9,d}  load {row['load_s']:6.1f} s  round "
                  f"{row['round_ms']:6.2f} ms  data {row['data_mb']:8.1f} MB  state {row['client_state_mb']:7.1f} MB  "
                  f"peak {row['peak_rss_mb']:8.0f} MB", file=sys.stderr, flush=True)
    rows = []
    for algorithm, k, n in cases:
        done = runs[(algorithm, k, n)]
        row = dict(done[-1])
        times = sorted(d["round_ms"] for d in done)
        row.update(round_ms=statistics.median(times), round_ms_each=times, repeats=len(done),
                   peak_rss_mb=max(d["peak_rss_mb"] for d in done))
        first = next(r for r in rows + [row] if r["algorithm"] == algorithm and r["K"] == k)
        row["round_vs_smallest_n"] = row["round_ms"] / first["round_ms"]
        rows.append(row)
    print(f"\n{'algorithm':9s} {'K':>4s} {'N':>9s} {'round ms':>9s} {'vs N0':>6s} {'data MB':>9s} {'state MB':>9s} "
          f"{'peak MB':>8s}", file=sys.stderr)
    for r in rows:
        print(f"{r['algorithm']:9s} {r['K']:>4d} {r['clients']:>9,d} {r['round_ms']:>9.2f} {r['round_vs_smallest_n']:>5.2f}x "
              f"{r['data_mb']:>9.1f} {r['client_state_mb']:>9.1f} {r['peak_rss_mb']:>8.0f}", file=sys.stderr)
    if args.json:
        import torch
        out = {"date": datetime.date.today().isoformat(), "machine": platform.machine(), "python": platform.python_version(),
               "torch": torch.__version__, "threads": args.threads, "mean_samples": args.mean_samples, "rounds": args.rounds,
               "repeat": args.repeat, "results": rows}
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
