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
    """One (N, algorithm, K) case in this process (of whichever fedsweep is imported: ``--baseline``
    runs it on another checkout, so only what every version has is read)."""
    import torch
    torch.set_num_threads(threads)
    from fedsweep.config.schema import build_config
    from fedsweep.data import load_federated
    from fedsweep.runs.run import train
    cfg = build_config({
        "seed": 0, "rounds": rounds, "clients_per_round": k, "device": "cpu", "engine": "vectorized",
        "data": {"name": "synthetic", "num_clients": n, "options": {"mean_samples": mean_samples}},
        "model": {"name": "mlp", "options": {"hidden": 400}}, "local": {"steps": 5, "batch_size": 10, "lr": 0.05},
        "algorithm": {"name": algorithm}, "eval": {"every": rounds}, "mlflow": {"enabled": False}})
    start = time.perf_counter()
    data = load_federated(cfg.data, cfg.seed)
    loaded = time.perf_counter() - start
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    try:
        module = train(cfg, progress=False, data=data)
    except (RuntimeError, MemoryError) as e:     # the padded table of an older checkout at large N
        return {"clients": n, "algorithm": algorithm, "K": k, "rounds": rounds, "error": str(e).splitlines()[0][:200],
                "load_s": loaded, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}
    seconds = [h["round/seconds"] for h in module.history]
    tensors = [data.x_train, data.y_train, data.x_test, data.y_test]
    index = getattr(module, "clients_cpu", None)
    index_bytes = index.nbytes() if index is not None else module.table_cpu.numel() * 8
    if hasattr(module.algorithm, "client_state_held"):
        held, clients, _ = module.algorithm.client_state_held()
    else:                                        # an older checkout: per-client state as (N, n) tensors
        rows = [v for v in module.algorithm.state_dict().values() if torch.is_tensor(v) and v.dim() == 2]
        held, clients = sum(v.numel() * v.element_size() for v in rows), (n if rows else 0)
    return {"clients": n, "algorithm": algorithm, "K": k, "rounds": rounds,
            "train_samples": int(data.y_train.numel()), "largest_client": int(data.client_sizes.max()),
            "data_mb": sum(t.numel() * t.element_size() for t in tensors) / 1e6, "client_index_mb": index_bytes / 1e6,
            "load_s": loaded, "first_round_ms": 1e3 * seconds[0], "round_ms": 1e3 * statistics.median(seconds[1:]),
            "client_state_mb": held / 1e6, "clients_with_state": clients,
            "peak_rss_after_data_mb": rss_loaded, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}


def run_case(n: int, algorithm: str, k: int, args, checkout: str | None) -> dict:
    """One case in a fresh process, on this checkout's fedsweep or on ``checkout``'s."""
    import os
    cmd = [sys.executable, __file__, "--case", str(n), algorithm, str(k), "--rounds", str(args.rounds),
           "--mean-samples", str(args.mean_samples), "--threads", str(args.threads)]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout)) if checkout else None
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"clients": n, "algorithm": algorithm, "K": k, "error": f"exit {done.returncode}: {tail[:200]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(done: list[dict], version: str) -> dict:
    """A case's repeats as one row: the median of the processes' median round times (and each one's)."""
    ok = [d for d in done if "error" not in d]
    if not ok:
        return {**done[-1], "version": version, "repeats": len(done)}
    row = dict(ok[-1], version=version, repeats=len(done))
    times = sorted(d["round_ms"] for d in ok)
    row.update(round_ms=statistics.median(times), round_ms_each=times, peak_rss_mb=max(d["peak_rss_mb"] for d in ok))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10_000, 100_000, 1_000_000])
    ap.add_argument("--algorithms", nargs="+", default=["fedavg", "scaffold"])
    ap.add_argument("--k", type=int, nargs="+", default=[10, 100], help="clients per round")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--mean-samples", type=int, default=10, help="mean training samples a client")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes a case; the median of their medians")
    ap.add_argument("--baseline", metavar="DIR", help="another checkout (e.g. git worktree add /tmp/base <commit>): "
                    "every case runs on it too, in the same rounds of repeats")
    ap.add_argument("--json")
    ap.add_argument("--case", nargs=3, metavar=("N", "ALGORITHM", "K"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        n, algorithm, k = args.case
        print(json.dumps(case(int(n), algorithm, int(k), args.rounds, args.mean_samples, args.threads)))
        return 0
    cases = [(a, k, n) for a in args.algorithms for k in args.k for n in args.clients if k <= n]
    versions = ["this"] + (["baseline"] * bool(args.baseline))
    runs: dict[tuple, list[dict]] = {(v, *c): [] for v in versions for c in cases}
    for r in range(args.repeat):          # repeats go round all cases, so drift reaches every N alike
        for algorithm, k, n in cases:
            for version in versions:
                if runs[(version, algorithm, k, n)] and "error" in runs[(version, algorithm, k, n)][0]:
                    continue                     # it failed once (the padded table's memory): it fails again
                row = run_case(n, algorithm, k, args, args.baseline if version == "baseline" else None)
                runs[(version, algorithm, k, n)].append(row)
                said = (f"error: {row['error'][:80]}" if "error" in row else
                        f"load {row['load_s']:6.1f} s  round {row['round_ms']:6.2f} ms  data {row['data_mb']:8.1f} MB  "
                        f"index {row['client_index_mb']:8.1f} MB  state {row['client_state_mb']:8.1f} MB  "
                        f"peak {row['peak_rss_mb']:8.0f} MB")
                print(f"[{r + 1}/{args.repeat}] {version:8s} {algorithm:9s} K={k:<4d} N={n:>9,d}  {said}",
                      file=sys.stderr, flush=True)
    rows = [summarize(runs[key], version) for key in runs for version in [key[0]]]
    for row in rows:
        first = next(r for r in rows if r["version"] == row["version"] and r["algorithm"] == row["algorithm"]
                     and r["K"] == row["K"])
        if "round_ms" in row and "round_ms" in first:
            row["round_vs_smallest_n"] = row["round_ms"] / first["round_ms"]
    print(f"\n{'version':8s} {'algorithm':9s} {'K':>4s} {'N':>9s} {'round ms':>9s} {'vs N0':>6s} {'data MB':>9s} "
          f"{'index MB':>9s} {'state MB':>9s} {'peak MB':>8s}", file=sys.stderr)
    for r in rows:
        if "error" in r:
            print(f"{r['version']:8s} {r['algorithm']:9s} {r['K']:>4d} {r['clients']:>9,d}  {r['error'][:90]}",
                  file=sys.stderr)
            continue
        print(f"{r['version']:8s} {r['algorithm']:9s} {r['K']:>4d} {r['clients']:>9,d} {r['round_ms']:>9.2f} "
              f"{r.get('round_vs_smallest_n', float('nan')):>5.2f}x {r['data_mb']:>9.1f} {r['client_index_mb']:>9.1f} "
              f"{r['client_state_mb']:>9.1f} {r['peak_rss_mb']:>8.0f}", file=sys.stderr)
    if args.json:
        import torch
        out = {"date": datetime.date.today().isoformat(), "machine": platform.machine(), "python": platform.python_version(),
               "torch": torch.__version__, "threads": args.threads, "mean_samples": args.mean_samples, "rounds": args.rounds,
               "repeat": args.repeat, "results": rows}
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
