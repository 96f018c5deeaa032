"""What a whole sweep costs against what its trials cost, unpacked and packed, in one run.

    python benchmarks/sweep.py sweeps/fedlga.yaml --pack 36 --json benchmarks/results-sweep-cpu-2core.json

Measured, in this order, each on the same machine with nothing else running:

1. ``import lightning`` and ``fedsweep run`` of 1 round (logging to a new MLflow store, to that
   store again, and with ``--no-mlflow``), each a fresh ``python`` process; and the commands that
   train nothing, ``fedsweep config``, ``algorithms`` and ``datasets`` (``report`` in step 4);
2. every trial of the sweep trained in one process, one after another, on as many threads as a
   Ray worker gets (``resources.cpu``) and on the device a trial gets (the CPU unless
   ``resources.gpu`` gives it a GPU): the sum is what the trials cost;
3. the same trials split over as many processes as the sweep runs at once, all started together
   (no Ray, no MLflow): the wall time of their training, and its "scaling", sum / (concurrency ×
   wall) (1.0 if the processes did not slow each other down). This is the floor of any sweep of
   these trials on this machine;
4. ``fedsweep tune`` of the sweep (a fresh process, its own MLflow store and storage): wall time,
   fixed start-up (command start -> first trial's MLflow run created), per-trial overhead
   ((wall − start-up) × concurrency / trials − mean in-process trial time), and its seconds over
   step 3's wall; and each Ray worker's timeline (``FEDSWEEP_TIMELINE``, fedsweep/sweep/trainable.py):
   when its first trial started, and the seconds its trials spent training (the first one's
   Lightning import included), drawing their artifacts (which the final report carries), in their
   final report (a checkpoint, then Tune's synchronous report: the wait for the driver), and
   between trials (Tune's gap); trials cut short (stopped, or crashed) count apart
   (``cut_short_s``); then
   ``fedsweep report`` of the sweep, from its store;
5. the same with ``pack:`` set (``--pack``): wall time and trials per minute against step 4 (not
   for a sweep with a scheduler, beside which fedsweep refuses ``pack:``).

Steps 2–5 run ``--repeat`` times, in turn (2, 3, 4, 5, 2, 3, ...), and the medians are reported
with every value. With ``--baseline DIR`` (another checkout of fedsweep, e.g. ``git worktree add
/tmp/base <commit>``), each of those measurements is taken with DIR's code right before this
checkout's, so a change is judged against its baseline under the same machine conditions: on a
shared 2-core machine the same command's times drifted by a third within an hour (the in-process
sum of ``sweeps/fedlga.yaml`` 28.2 -> 38.8 s), more than most changes move them.

Goals: wall ≤ 1.3 × sum / concurrency + 10 s unpacked (each sweep's ``over_goal_s``,
below 0 when met; ``over_goal_s_all``: each repeat against the sum measured in the same repeat);
packed ≥ 4× the unpacked trials per minute. Output: a table on stdout; with ``--json``, every number (each worker's phase
marks included); with ``--plot PNG``, each sweep's workers against time, one lane a worker.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def timed_process(cmd: list[str], env: dict | None = None, cwd: str | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc.stderr


def in_process_trials(sweep_path: str, threads: int, share: tuple[int, int] = (0, 1)) -> dict:
    """Trials trained in this process (no MLflow), as a Ray worker runs them: every one, or share
    ``(i, n)`` of them (trials i, i + n, ...). Returns the seconds of each and when the timed part
    started and ended (``time.time()``, comparable across processes). Run in a fresh process of its
    own (``--in-process-only``), so the code measured is the one on its path."""
    import torch

    from fedsweep.runs.run import train
    from fedsweep.sweep.spec import expand, load_sweep
    torch.set_num_threads(threads)
    sweep = load_sweep(sweep_path)
    # on the device a trial of the sweep gets: the CPU unless the sweep gives its trials a GPU
    cfgs = [t.config.model_copy(update={"mlflow": t.config.mlflow.model_copy(update={"enabled": False}),
                                        "device": t.config.device if sweep.resources.gpu > 0 else "cpu"})
            for t in expand(sweep, source=sweep_path)]
    train(cfgs[0], progress=False)          # untimed: imports (Lightning) happen once per worker too
    times, start = [], time.time()
    for cfg in cfgs[share[0]::share[1]]:
        t0 = time.perf_counter()
        train(cfg, progress=False)
        times.append(time.perf_counter() - t0)
    return {"times": times, "start": start, "end": time.time()}


def code_env(code: str | None) -> dict:
    """The environment of a measured process: this checkout's fedsweep, or ``code``'s (a baseline
    checkout, first on PYTHONPATH; Ray's workers inherit it)."""
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(code).resolve()), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _trial_shares(sweep_path: str, threads: int, processes: int, code: str | None) -> list[dict]:
    """The sweep's trials split over ``processes`` fresh processes started together (``--in-process-only``
    with ``--share i processes``); what :func:`in_process_trials` returned in each."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"times{i}.json" for i in range(processes)]
        errs = [out.with_suffix(".err") for out in outs]   # files, not pipes: a full pipe would stall its writer
        procs = []
        for i, (out, err) in enumerate(zip(outs, errs)):
            cmd = [sys.executable, str(Path(__file__).resolve()), str(Path(sweep_path).resolve()), "--in-process-only",
                   str(out), "--threads", str(threads), "--share", str(i), str(processes)]
            with open(err, "w") as f:
                procs.append(subprocess.Popen(cmd, env=code_env(code), cwd=tmp, stdout=subprocess.DEVNULL, stderr=f))
        for p, err in zip(procs, errs):
            if p.wait() != 0:
                raise RuntimeError(f"in-process share failed ({p.returncode}):\n{err.read_text()[-3000:]}")
        return [json.loads(out.read_text()) for out in outs]


def in_process_sum(sweep_path: str, threads: int, code: str | None) -> dict:
    """Step 2: every trial, one after another, in one process."""
    times = _trial_shares(sweep_path, threads, 1, code)[0]["times"]
    return {"sum_s": sum(times), "mean_s": sum(times) / len(times), "max_s": max(times)}


def in_process_parallel(sweep_path: str, threads: int, concurrency: int, code: str | None) -> dict:
    """Step 3: the same trials split over ``concurrency`` processes that run at once (no Ray, no
    MLflow): the wall time of their training, from the first process's start to the last one's
    end. On a machine whose cores slow each other down (shared caches and memory bandwidth) this
    is above sum / concurrency: it is the floor any sweep of these trials can reach here."""
    parts = _trial_shares(sweep_path, threads, concurrency, code)
    return {"wall_s": max(p["end"] for p in parts) - min(p["start"] for p in parts),
            "sum_s": sum(sum(p["times"]) for p in parts)}


def tune_wall(sweep_path: str, work: Path, pack, code: str | None = None) -> dict:
    """``fedsweep tune`` in a fresh process on a copy of the sweep (``pack`` set), its own store."""
    from mlflow import MlflowClient
    spec = yaml.safe_load(Path(sweep_path).read_text())
    spec["name"] = (f"{spec.get('name', Path(sweep_path).stem)}_{'packed' if pack else 'unpacked'}"
                    f"_{int(time.time() * 1000)}")
    spec.pop("pack", None)
    if pack:
        spec["pack"] = pack
    path = work / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    uri = f"sqlite:///{work / (spec['name'] + '.db')}"
    timeline = work / f"{spec['name']}-timeline"
    timeline.mkdir()
    env = {**code_env(code), "MLFLOW_TRACKING_URI": uri, "FEDSWEEP_TIMELINE": str(timeline)}
    start_ms = time.time() * 1000
    wall, err = timed_process([sys.executable, "-m", "fedsweep.cli", "tune", str(path),
                               "--storage", str(work / "runs")], env=env, cwd=str(work))
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(spec["name"])
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`fedsweep.role` = 'trial'",
                              max_results=50_000)
    statuses = sorted({r.data.tags.get("fedsweep.status") for r in runs})
    first = min(r.info.start_time for r in runs)
    result = {"wall_s": wall, "startup_s": (first - start_ms) / 1000, "trials": len(runs), "statuses": statuses,
              "trials_per_min": 60 * len(runs) / wall, "workers": worker_timelines(timeline, start_ms / 1000)}
    if not pack:   # `fedsweep report` of the sweep, from its store
        result["report_s"], _ = timed_process([sys.executable, "-m", "fedsweep.cli", "report", str(path),
                                               "--out", str(work / f"{spec['name']}-report")], env=env, cwd=str(work))
    return result


def worker_timelines(folder: Path, start: float) -> list[dict]:
    """Each worker's phases (fedsweep/sweep/trainable.py ``_phase_marks``) summed over its trials. A baseline
    checkout older than the marks leaves none."""
    workers = []
    for path in sorted(folder.glob("*.txt")):
        marks = [(float(t), phase) for t, phase in (line.split() for line in path.read_text().splitlines())]
        checkpoints = sum(phase == "checkpoint" for _, phase in marks)   # written inside the phases below
        marks = [(t, phase) for t, phase in marks if phase != "checkpoint"]
        spent = {"training_s": 0.0, "artifacts_s": 0.0, "final_report_s": 0.0, "between_trials_s": 0.0,
                 "cut_short_s": 0.0}
        into = {"trained": "training_s", "artifacts": "artifacts_s", "reported": "final_report_s",
                "start": "between_trials_s"}
        for (t0, before), (t1, phase) in zip(marks, marks[1:]):
            # A trial ends at its last mark ("reported"; "artifacts" in checkouts that drew the artifacts
            # while the final report waited, and with a scheduler that stopped the trial at that report).
            # A start right after a start: the trial before ended before its last round, stopped by a
            # scheduler or crashed, and its time is ``cut_short_s``.
            if phase != "start" or before in ("artifacts", "reported"):
                spent[into[phase]] += t1 - t0
            elif before == "start":
                spent["cut_short_s"] += t1 - t0
        workers.append({"units": sum(p == "start" for _, p in marks), "first_start_s": marks[0][0] - start,
                        "last_end_s": marks[-1][0] - start, **spent, "checkpoints": checkpoints,
                        "marks": [[round(t - start, 4), phase] for t, phase in marks]})
    return workers


# A worker's phases as timeline_png draws them: (the mark that ends the phase, its colour, its label).
PHASES = {"trained": ("tab:blue", "training"),
          "artifacts": ("tab:orange", "artifacts (curves.png, CSVs), drawn for the final report"),
          "reported": ("tab:red", "final report (carries the artifacts; waits for the driver)"),
          "start": ("lightgrey", "between trials (Tune)")}


def timeline_png(out: dict, path: str | Path) -> Path:
    """Each sweep's Ray workers against time, one lane a worker, from the median runs in ``out`` (this
    code's and, with ``--baseline``, the baseline's): start-up until a worker's first trial, its first
    trial's training (with its imports) apart from the rest, then every trial's phases."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    runs = [(f"{label}{name}", res[name]) for label, res in (("", out), ("baseline ", out.get("baseline") or {}))
            for name in ("unpacked", "packed") if res.get(name, {}).get("workers")]
    lanes = sum(len(r["workers"]) for _, r in runs)
    height = 0.45 * lanes + 2.4
    fig, ax = plt.subplots(figsize=(11, height))
    y, ticks = 0, []
    for name, r in runs:
        for i, w in enumerate(r["workers"]):
            marks = w["marks"]
            ax.barh(y, marks[0][0], left=0, color="whitesmoke", edgecolor="grey", linewidth=0.3)
            first = True
            for (t0, _), (t1, phase) in zip(marks, marks[1:]):
                colour = PHASES[phase][0]
                if phase == "trained" and first:
                    colour, first = "tab:purple", False
                ax.barh(y, t1 - t0, left=t0, color=colour, linewidth=0)
            ax.plot([r["wall_s"]] * 2, [y - 0.4, y + 0.4], color="black", linewidth=1.5)
            ticks.append((y, f"{name}, worker {i + 1}"))
            y += 1
        y += 0.5
    ax.set_yticks([t for t, _ in ticks], [lab for _, lab in ticks])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the command started")
    ax.set_title(f"{out['sweep']}: {out['trials']} trials, {out['concurrency']} at once — where each worker's time goes")
    handles = [Patch(color="whitesmoke", label="start-up (driver, Ray, the worker's start)"),
               Patch(color="tab:purple", label="first trial (with the worker's imports)"),
               *[Patch(color=c, label=lab) for c, lab in PHASES.values()],
               plt.Line2D([], [], color="black", label="the command ends")]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.75 / height, 1, 1))   # the legend's three rows below the axes
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


# The number each step is judged by.
MEASURE = {"in_process": "sum_s", "in_parallel": "wall_s", "unpacked": "wall_s", "packed": "wall_s"}


def _median(samples: list[dict], key: str) -> dict:
    """The sample of median ``key`` (the upper one of an even count), with every value beside
    (``<key>_all``, in the order measured)."""
    ordered = sorted(samples, key=lambda r: r[key])
    return {**ordered[len(ordered) // 2], f"{key}_all": [r[key] for r in samples]}


def goal_wall(sum_s: float, concurrency: int) -> float:
    """The goal for a sweep's wall time, 1.3 × sum / concurrency + 10 s, from the in-process sum of its trials."""
    return 1.3 * sum_s / concurrency + 10


def _summarize(res: dict, samples: dict, concurrency: int, repeat: int, label: str) -> None:
    """Medians of one code's measurements into ``res``, and their lines on stdout."""
    if samples["in_process"]:
        res["in_process"] = _median(samples["in_process"], MEASURE["in_process"])
        res["ideal_wall_s"] = res["in_process"]["sum_s"] / concurrency
        res["goal_wall_s"] = goal_wall(res["in_process"]["sum_s"], concurrency)
        print(f"{label}in process: sum {res['in_process']['sum_s']:.1f} s (ideal wall at {concurrency} at once: "
              f"{res['ideal_wall_s']:.1f} s; goal ≤ {res['goal_wall_s']:.1f} s)", flush=True)
    if samples["in_parallel"]:
        r = res["in_parallel"] = _median(samples["in_parallel"], MEASURE["in_parallel"])
        if "in_process" in res:
            # 1.0: the processes did not slow each other down; below: the machine's cores did
            r["scaling"] = res["in_process"]["sum_s"] / (concurrency * r["wall_s"])
        print(f"{label}in process, {concurrency} at once: wall {r['wall_s']:.1f} s"
              + (f" ({r['scaling']:.2f} of perfect scaling)" if "scaling" in r else ""), flush=True)
    for name in ("unpacked", "packed"):
        if not samples[name]:   # a sweep with a scheduler is not packed
            continue
        r = res[name] = _median(samples[name], MEASURE[name])
        if "in_process" in res:
            r["per_trial_overhead_s"] = ((r["wall_s"] - r["startup_s"]) * concurrency / r["trials"]
                                         - res["in_process"]["mean_s"])
        if "in_parallel" in res:   # what Ray, Tune, MLflow and start-up add to the trials run at once
            r["over_parallel_s"] = r["wall_s"] - res["in_parallel"]["wall_s"]
        if "goal_wall_s" in res:   # the goal's rule; below 0: met. Each repeat against its own sum too
            r["over_goal_s"] = r["wall_s"] - res["goal_wall_s"]
            r["over_goal_s_all"] = [wall - goal_wall(total, concurrency) for total, wall in
                                    zip(res["in_process"]["sum_s_all"], r["wall_s_all"])]
        print(f"{label}{name}: wall {r['wall_s']:.1f} s" + (f" (median of {repeat})" if repeat > 1 else "")
              + f", start-up {r['startup_s']:.1f} s, {r['trials_per_min']:.0f} trials/min"
              + (f", per-trial overhead {r['per_trial_overhead_s']:.2f} s" if "per_trial_overhead_s" in r else "")
              + (f", {r['over_parallel_s']:.1f} s over the trials run {concurrency} at once" if "over_parallel_s" in r
                 else "") + (f"; fedsweep report of it {r['report_s']:.1f} s" if "report_s" in r else ""), flush=True)
        if "over_goal_s" in r:
            each = ", ".join(f"{x:+.1f}" for x in r["over_goal_s_all"])
            print(f"{label}  against the goal (≤ 1.3 × sum / {concurrency} + 10 s): "
                  + ("met" if r["over_goal_s"] <= 0 else "not met") + f", {r['over_goal_s']:+.1f} s"
                  + (f" (each repeat against its own sum: {each} s)" if repeat > 1 else ""), flush=True)
        for w in r.get("workers", []):
            print(f"{label}  a worker: {w['units']} Tune trials from {w['first_start_s']:.1f} s to "
                  f"{w['last_end_s']:.1f} s: training {w['training_s']:.2f} s"
                  + (f" ({w['checkpoints']} checkpoints)" if w.get("checkpoints") else "")
                  + f", final reports {w['final_report_s']:.2f} s, "
                  f"artifacts {w['artifacts_s']:.2f} s, "
                  f"between trials {w['between_trials_s']:.2f} s"
                  + (f", trials cut short (stopped or crashed) {w['cut_short_s']:.2f} s" if w.get("cut_short_s")
                     else ""), flush=True)
    if "packed" in res:
        res["packed_speedup"] = res["packed"]["trials_per_min"] / res["unpacked"]["trials_per_min"]
        print(f"{label}packed / unpacked trials per minute: {res['packed_speedup']:.1f}×")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", help="a sweep file (e.g. sweeps/fedlga.yaml)")
    ap.add_argument("--pack", default=None, help="the pack: setting of the packed run (a number or seeds); "
                    "default: trials ÷ concurrency")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--skip-in-process", action="store_true", help="skip steps 2 and 3 (the trials without Ray)")
    ap.add_argument("--repeat", type=int, default=1, help="measure steps 2-5 this many times, in turn; "
                    "medians reported (default 1)")
    ap.add_argument("--baseline", help="a checkout of fedsweep to measure right before this one, every time")
    ap.add_argument("--plot", metavar="PNG", help="draw each sweep's workers against time (the median runs) here")
    ap.add_argument("--in-process-only", metavar="OUT", help=argparse.SUPPRESS)   # steps 2 and 3: one share of the trials
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--share", type=int, nargs=2, default=(0, 1), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.in_process_only:
        Path(args.in_process_only).write_text(json.dumps(in_process_trials(args.sweep, args.threads,
                                                                           tuple(args.share))))
        return 0
    if args.repeat < 1:
        ap.error("--repeat: at least 1")
    if args.baseline and not (Path(args.baseline) / "fedsweep" / "__init__.py").is_file():
        ap.error(f"--baseline {args.baseline}: not a fedsweep checkout (no fedsweep/__init__.py)")
    from fedsweep.sweep.spec import expand, load_sweep
    sweep = load_sweep(args.sweep)
    trials = expand(sweep, source=args.sweep)
    cpus = os.cpu_count() or 1
    concurrency = min(sweep.max_concurrent or cpus, int(cpus // sweep.resources.cpu) or 1)
    if sweep.resources.gpu > 0:   # as many trials at once as the GPUs hold too
        import torch
        concurrency = max(min(concurrency, int(torch.cuda.device_count() // sweep.resources.gpu)), 1)
    pack = args.pack or -(-len(trials) // concurrency)
    pack = int(pack) if str(pack).isdigit() else pack
    out: dict = {"sweep": args.sweep, "trials": len(trials), "concurrency": concurrency, "pack": pack,
                 "machine": {"cpus": cpus, "platform": platform.platform(), "python": platform.python_version()}}

    out["import_lightning_s"], _ = timed_process([sys.executable, "-c", "import lightning"])
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.yaml"
        base.write_text(yaml.safe_dump({**sweep.base, "rounds": 1}))
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{Path(tmp) / 'mlflow.db'}"}
        out["fedsweep_run_1_round_new_store_s"], _ = timed_process(
            [sys.executable, "-m", "fedsweep.cli", "run", str(base)], env=env, cwd=tmp)
        out["fedsweep_run_1_round_s"], _ = timed_process(
            [sys.executable, "-m", "fedsweep.cli", "run", str(base)], env=env, cwd=tmp)
        out["fedsweep_run_1_round_no_mlflow_s"], _ = timed_process(
            [sys.executable, "-m", "fedsweep.cli", "run", str(base), "--no-mlflow"], cwd=tmp)
    print(f"import lightning {out['import_lightning_s']:.2f} s; fedsweep run of 1 round "
          f"{out['fedsweep_run_1_round_s']:.2f} s logged to MLflow ({out['fedsweep_run_1_round_new_store_s']:.2f} s "
          f"creating the store), {out['fedsweep_run_1_round_no_mlflow_s']:.2f} s with --no-mlflow", flush=True)
    # The commands that train nothing (`report` is timed after the unpacked sweep, on its store).
    out["commands_s"] = {name: timed_process([sys.executable, "-m", "fedsweep.cli", *argv])[0]
                         for name, argv in (("config", ["config", args.sweep]), ("algorithms", ["algorithms"]),
                                            ("datasets", ["datasets"]))}
    print("; ".join(f"fedsweep {k} {v:.2f} s" for k, v in out["commands_s"].items()), flush=True)

    codes = {"now": None, **({"baseline": args.baseline} if args.baseline else {})}
    samples: dict = {c: {step: [] for step in MEASURE} for c in codes}
    skipped = {"in_process", "in_parallel"} if args.skip_in_process else set()
    if sweep.scheduler is not None:   # fedsweep refuses `pack:` beside a scheduler (docs/sweeps.md)
        skipped.add("packed")
        out["pack"] = None
        print(f"packed: not measured: {args.sweep} has a scheduler ({sweep.scheduler.kind}), and a pack "
              "trains its configs to the end together", flush=True)
    threads = max(int(sweep.resources.cpu), 1)
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for step in MEASURE:
                if step in skipped:
                    continue
                for c in sorted(codes, key=lambda c: c != "baseline"):   # the baseline first, each time
                    r = (in_process_sum(args.sweep, threads, codes[c]) if step == "in_process" else
                         in_process_parallel(args.sweep, threads, concurrency, codes[c]) if step == "in_parallel" else
                         tune_wall(args.sweep, Path(tmp), pack if step == "packed" else None, codes[c]))
                    samples[c][step].append(r)
                    print(f"[{i + 1}/{args.repeat}] {c} {step}: {r[MEASURE[step]]:.1f} s", flush=True)
    for c in codes:
        res = out if c == "now" else out.setdefault("baseline", {"code": str(Path(args.baseline).resolve())})
        _summarize(res, samples[c], concurrency, args.repeat, label="" if c == "now" else "baseline ")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.plot:
        print(f"wrote {timeline_png(out, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
