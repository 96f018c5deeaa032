"""Packed training against one config at a time, in one process: config-rounds per second by pack size.

    python benchmarks/pack.py --device cuda --models mlp cnn resnet18 --packs 1 8 16 32 64 --json OUT

For each model, P configs (seeds 0..P−1 of one FedAvg config: K = 10 of N = 100 clients, E = 5 steps
of B = 10, ρ = 0.5 stragglers) are trained for ``--rounds`` rounds on synthetic data of the model's
shape (digits-shaped 1×8×8 for the MLP and CNN, CIFAR-shaped 3×32×32 for ResNet-18), once packed
(``fedsweep.sweep.pack.train_packed``, rows merged by its rule for the device) and once one after another
(``fedsweep.runs.run.train``). Reported: seconds of each, config-rounds per second, and the ratio. Time
includes Lightning's set-up, as a sweep's trial pays it; one untimed warm-up run comes first.

``--arithmetic`` adds what packing can gain at most for the MLP: the bare arithmetic of one local
step (forward, backward and SGD update of B = 10 samples, as batched matrix products, nothing else)
for the 10·P client rows of a pack, each row with its own weights. If the time per row stays flat
or grows with P, the device was already busy at one config and packing can only save the work
around the arithmetic (Lightning, the plan, aggregation); if it falls, one config left it idle.

``--sweep SWEEP --pack N`` times a shipped sweep's own trials instead, on ``--device``: every trial
one after another (``fedsweep.runs.run.train``), then the same trials in the packs ``pack: N`` makes of
them (``fedsweep.sweep.pack.train_packed``, one pack after another), both in this process, without Ray
or MLflow; reported as trials per minute of each and their ratio, the training side of the goal
"≥ 4× the unpacked sweep's trials per minute" (a whole sweep adds Ray's and MLflow's work on the
CPU: ``benchmarks/sweep.py``)::

    python benchmarks/pack.py --device cuda --sweep sweeps/fedlga.yaml --pack 8 --json OUT

Each trial is also timed alone: ``ms_a_trial_by_method`` holds the mean of each method's trials.
With ``--baseline DIR`` (another checkout of fedsweep) every timing runs in a fresh process, the
baseline's first and then this checkout's, ``--repeat`` times in turn, so a change to a round's
work is judged against the code before it under the same machine conditions, in a fifth of the
time of ``benchmarks/sweep.py --baseline`` (which adds Ray and MLflow)::

    git worktree add /tmp/base <commit>
    python benchmarks/pack.py --sweep sweeps/fedlga.yaml --threads 1 --skip-packed --repeat 3 --baseline /tmp/base
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def configs(model: str, pack: int, rounds: int, device: str, engine: str, matmul_precision: str = "highest"):
    from fedsweep.config.schema import build_config
    return [build_config({
        "seed": s, "rounds": rounds, "engine": engine, "device": device, "matmul_precision": matmul_precision,
        "clients_per_round": 10,
        "data": {"num_clients": 100}, "model": {"name": model},
        "local": {"steps": 5, "batch_size": 10, "lr": 0.05},
        "heterogeneity": {"kind": "stragglers", "rho": 0.5},
        "eval": {"every": rounds}, "mlflow": {"enabled": False}}) for s in range(pack)]


def arithmetic(packs: list[int], device: str, clients: int = 10, batch: int = 10, seconds: float = 1.0) -> list[dict]:
    """The MLP's bare local step for ``clients``·P rows at each pack size P (see the docstring)."""
    from fedsweep.config.schema import build_config
    from fedsweep.sim.models import build_model
    cfg = build_config({"model": {"name": "mlp"}, "mlflow": {"enabled": False}})
    layers = [m for m in build_model(cfg.model, (1, 8, 8), 10).modules() if isinstance(m, torch.nn.Linear)]
    macs = [m.in_features * m.out_features for m in layers]
    # forward 2 a MAC, the weights' gradient 2, the inputs' gradient 2 (none for the first layer)
    flop_per_sample = 6 * sum(macs) - 2 * macs[0]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = []
    for pack in packs:
        rows = clients * pack
        x = torch.rand(rows, batch, layers[0].in_features, device=device)
        ws = [torch.randn(rows, m.in_features, m.out_features, device=device) * 0.05 for m in layers]
        g_out = torch.randn(rows, batch, layers[-1].out_features, device=device)

        def step():
            acts, h = [x], x
            for i, w in enumerate(ws):
                h = torch.bmm(h, w)
                if i < len(ws) - 1:
                    h = h.clamp_min(0)
                acts.append(h)
            g = g_out
            for i in range(len(ws) - 1, -1, -1):
                grad_w = torch.bmm(acts[i].transpose(1, 2), g)
                if i:
                    g = torch.bmm(g, ws[i].transpose(1, 2)) * (acts[i] > 0)
                ws[i].sub_(grad_w, alpha=0.01)

        t0 = time.perf_counter()
        for _ in range(5):   # warm-up, and the step count for about `seconds` of timing
            step()
        sync()
        reps = max(5, int(seconds / ((time.perf_counter() - t0) / 5)))
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        sync()
        dt = (time.perf_counter() - t0) / reps
        out.append({"pack": pack, "rows": rows, "step_ms": dt * 1e3, "us_per_row": dt / rows * 1e6,
                    "gflops": flop_per_sample * batch * rows / dt / 1e9})
        print(f"mlp arithmetic pack {pack:>3} ({rows:>4} rows): {dt * 1e3:8.3f} ms a step, {dt / rows * 1e6:7.1f} us a "
              f"row, {out[-1]['gflops']:6.1f} GFLOP/s", file=sys.stderr, flush=True)
    for row in out:
        row["us_per_row_vs_pack_1"] = row["us_per_row"] / out[0]["us_per_row"]
    return out


def sweep_trials(path: str, pack, device: str, repeat: int = 1, packed_too: bool = True) -> dict:
    """The trials of sweep ``path`` on ``device``, one after another and (``packed_too``) in the packs
    ``pack: N`` makes (see the docstring); the median of ``repeat`` timings of each."""
    import fedsweep
    from fedsweep.sweep.pack import train_packed
    from fedsweep.runs.run import train
    from fedsweep.sweep.spec import expand, load_sweep
    from fedsweep.sweep.units import pack_units
    sweep = load_sweep(path)
    trials = expand(sweep, source=path)
    cfgs = [t.config.model_copy(update={"mlflow": t.config.mlflow.model_copy(update={"enabled": False}),
                                        "device": device}) for t in trials]
    units = pack_units(sweep.model_copy(update={"pack": pack}), trials)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    train(cfgs[0].model_copy(update={"rounds": 2}), progress=False)      # warm-up: imports, CUDA context
    train_packed([c.model_copy(update={"rounds": 2}) for c in cfgs[:2]])
    one_by_one, packed, by_method = [], [], {}
    for i in range(repeat):
        sync()
        t0 = time.perf_counter()
        for c in cfgs:
            t1 = time.perf_counter()
            train(c, progress=False)
            sync()
            by_method.setdefault(c.algorithm.name, []).append(time.perf_counter() - t1)
        one_by_one.append(time.perf_counter() - t0)
        if packed_too:
            t0 = time.perf_counter()
            for unit in units:
                train_packed([cfgs[j] for j in unit], ids=unit)
            sync()
            packed.append(time.perf_counter() - t0)
        print(f"[{i + 1}/{repeat}] {len(cfgs)} trials one after another {one_by_one[-1]:.2f} s" +
              (f", in {len(units)} packs {packed[-1]:.2f} s" if packed_too else ""), file=sys.stderr, flush=True)
    a = statistics.median(one_by_one)
    out = {"sweep": path, "pack": pack, "trials": len(cfgs), "packs": len(units), "one_by_one_s": one_by_one,
           "fedsweep": str(Path(fedsweep.__file__).resolve().parents[1]),      # the checkout that trained
           "ms_a_trial_by_method": {k: 1e3 * statistics.fmean(v) for k, v in by_method.items()},
           "trials_per_min_one_by_one": 60 * len(cfgs) / a}
    if packed_too:
        b = statistics.median(packed)
        out.update(packed_s=packed, trials_per_min_packed=60 * len(cfgs) / b, ratio=a / b)
    return out


def against_baseline(args) -> dict:
    """``--sweep`` with ``--baseline``: each timing in a fresh process, the baseline checkout's first,
    then this one's, ``--repeat`` times in turn (see the docstring)."""
    codes = {"baseline": Path(args.baseline).resolve(), "now": Path(__file__).resolve().parents[1]}
    runs: dict[str, list[dict]] = {c: [] for c in codes}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for name, code in codes.items():
                out = Path(tmp) / f"{name}-{i}.json"
                cmd = [sys.executable, str(Path(__file__).resolve()), "--sweep", str(Path(args.sweep).resolve()),
                       "--pack", args.pack, "--device", args.device, "--json", str(out)]
                cmd += ["--threads", str(args.threads)] if args.threads else []
                cmd += ["--skip-packed"] if args.skip_packed else []
                # the checkout's own fedsweep, first on the path (an editable install is later on it)
                path = os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))
                env = {**os.environ, "PYTHONPATH": path}
                proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True)
                if proc.returncode:
                    sys.exit(f"{name} ({code}) failed:\n{proc.stderr[-3000:]}")
                r = json.loads(out.read_text())
                if r["fedsweep"] != str(code):
                    sys.exit(f"{name}: the process imported fedsweep from {r['fedsweep']}, not {code}")
                runs[name].append(r)
                packed = f", packed {r['packed_s'][0]:.2f} s" if "packed_s" in r else ""
                per_trial = ", ".join(f"{k} {v:.0f}" for k, v in r["ms_a_trial_by_method"].items())
                print(f"[{i + 1}/{args.repeat}] {name:<8} {r['trials']} trials one after another "
                      f"{r['one_by_one_s'][0]:.2f} s{packed}; ms a trial: {per_trial}", file=sys.stderr, flush=True)
    res = {"sweep": args.sweep, "pack": args.pack, "repeat": args.repeat, "order": "baseline first, each time"}
    for name, code in codes.items():
        rs = runs[name]
        res[name] = {"code": str(code), "one_by_one_s": [r["one_by_one_s"][0] for r in rs],
                     "ms_a_trial_by_method": {k: [r["ms_a_trial_by_method"][k] for r in rs]
                                              for k in rs[0]["ms_a_trial_by_method"]}}
        if "packed_s" in rs[0]:
            res[name]["packed_s"] = [r["packed_s"][0] for r in rs]
    res["now_over_baseline_one_by_one"] = (statistics.median(res["now"]["one_by_one_s"]) /
                                           statistics.median(res["baseline"]["one_by_one_s"]))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--models", nargs="*", default=["mlp"])
    ap.add_argument("--packs", nargs="+", type=int, default=[1, 4, 8])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--engine", default="auto", choices=["auto", "vectorized", "loop"])
    ap.add_argument("--arithmetic", action="store_true",
                    help="also time the MLP's bare local step at each pack size (what packing can gain at most)")
    ap.add_argument("--matmul-precision", default="highest", choices=["highest", "high", "medium"],
                    help="the configs' matmul_precision, and the arithmetic's (high: TF32 on NVIDIA tensor cores)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's own; a sweep's worker runs 1)")
    ap.add_argument("--sweep", help="time this sweep file's own trials instead (see the docstring)")
    ap.add_argument("--pack", default="8", help="with --sweep: its pack: setting (a number or seeds; default 8)")
    ap.add_argument("--repeat", type=int, default=1, help="with --sweep: timings of each, medians reported")
    ap.add_argument("--skip-packed", action="store_true", help="with --sweep: the trials one after another only")
    ap.add_argument("--baseline", help="with --sweep: a checkout of fedsweep to time right before this one, "
                                       "each in a fresh process, --repeat times in turn")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.baseline:
        if not args.sweep:
            ap.error("--baseline: only with --sweep")
        if not (Path(args.baseline) / "fedsweep" / "__init__.py").is_file():
            ap.error(f"--baseline {args.baseline}: not a fedsweep checkout (no fedsweep/__init__.py)")
        res = against_baseline(args)
        b, n = res["baseline"], res["now"]
        print(f"one after another: baseline {statistics.median(b['one_by_one_s']):.2f} s, now "
              f"{statistics.median(n['one_by_one_s']):.2f} s ({res['now_over_baseline_one_by_one']:.3f}x); ms a trial "
              "(median): " + ", ".join(f"{k} {statistics.median(b['ms_a_trial_by_method'][k]):.0f} -> "
                                       f"{statistics.median(v):.0f}" for k, v in n["ms_a_trial_by_method"].items()),
              file=sys.stderr)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sweep:
        res = sweep_trials(args.sweep, int(args.pack) if args.pack.isdigit() else args.pack, args.device, args.repeat,
                           packed_too=not args.skip_packed)
        res.update(device=args.device, gpu=torch.cuda.get_device_name(0) if args.device == "cuda" else None,
                   torch=torch.__version__, threads=torch.get_num_threads(), machine=platform.machine())
        print(f"{res['trials']} trials of {args.sweep} on {args.device}: {res['trials_per_min_one_by_one']:.0f} "
              f"trials/min one after another" + (f", {res['trials_per_min_packed']:.0f} in {res['packs']} packs "
              f"(pack: {res['pack']}): {res['ratio']:.2f}x" if "ratio" in res else ""), file=sys.stderr)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0
    from fedsweep.runs.bench import shape, synthetic
    from fedsweep.sweep.pack import train_packed
    from fedsweep.runs.run import train
    rows = []
    print(f"{'model':<10}{'pack':>6}{'packed s':>10}{'one by one s':>14}{'cfg-rounds/s packed':>21}{'ratio':>8}",
          file=sys.stderr)
    for model in args.models:
        data = synthetic(100, shape(model))
        warm = configs(model, 1, 2, args.device, args.engine, args.matmul_precision)
        train(warm[0], progress=False, data=data)
        for pack in args.packs:
            cfgs = configs(model, pack, args.rounds, args.device, args.engine, args.matmul_precision)
            t0 = time.perf_counter()
            train_packed(cfgs, data=[data] * pack)
            packed = time.perf_counter() - t0
            t0 = time.perf_counter()
            for c in cfgs:
                train(c, progress=False, data=data)
            single = time.perf_counter() - t0
            row = {"model": model, "pack": pack, "packed_s": packed, "one_by_one_s": single,
                   "config_rounds_per_s_packed": pack * args.rounds / packed,
                   "config_rounds_per_s_one_by_one": pack * args.rounds / single, "ratio": single / packed}
            rows.append(row)
            print(f"{model:<10}{pack:>6}{packed:>10.2f}{single:>14.2f}{row['config_rounds_per_s_packed']:>21.1f}"
                  f"{row['ratio']:>7.2f}x", file=sys.stderr, flush=True)
    out = {"device": args.device, "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
           "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
           "rounds": args.rounds, "engine": args.engine, "matmul_precision": args.matmul_precision,
           "results": rows}
    if args.arithmetic:
        from fedsweep.runs.run import matmul_precision
        with matmul_precision(args.matmul_precision):
            out["mlp_arithmetic"] = arithmetic(args.packs, args.device)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
