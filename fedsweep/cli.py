"""Command line: ``fedsweep run | tune | report | ui | log | config | bench | check | algorithms | models | datasets``.

User errors (bad keys, values, missing files) print one line and exit with status 2, before any
training starts; no traceback.
"""
from __future__ import annotations

import argparse
import os
import sys

from fedsweep.config.schema import ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedsweep", description="Simulate system-heterogeneous federated "
                                "learning and sweep its hyperparameters.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="one training run (Lightning), summary table, logged to MLflow",
                       epilog="exit status: 0 finished, 2 refused before training (one line naming the key), "
                              "3 diverged (model NaN/inf, or train/loss NaN/inf or above "
                              "eval.divergence_factor × ln(classes)), 5 trained but the MLflow store did not take the "
                              "run (its records are kept in a folder the last line names: fedsweep log FOLDER writes "
                              "them later), "
                              "130 interrupted (Ctrl-C or SIGTERM: after the round in progress, "
                              "checkpoint, summary and MLflow run (KILLED) as at a run's end)")
    r.add_argument("config", help="run config YAML (see docs/config.md)")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set local.lr=0.1 (repeatable)")
    r.add_argument("--output-json", metavar="PATH", help="write the summary as JSON")
    r.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    r.add_argument("--quiet", action="store_true", help="no per-evaluation progress lines")
    r.add_argument("--checkpoint-dir", metavar="DIR", help="save DIR/last.ckpt (model, server optimizer, "
                   "algorithm state, round)")
    r.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="also save every N rounds "
                   "(default 0: only at the end)")
    r.add_argument("--resume", metavar="CKPT", help="continue a run from its checkpoint")

    t = sub.add_parser("tune", help="run a sweep file as Ray Tune trials, each logged to MLflow",
                       epilog="exit status: 0 every trial ended (finished, diverged or stopped), 1 interrupted or "
                              "stopped by a fault (the last lines say whether --resume or --restart continues), 2 refused "
                              "before anything ran (one line naming the key), 4 some trials failed (each error printed "
                              "once) or are incomplete (trained, but their summary and artifacts did not reach the "
                              "driver; the runs named), 5 every trial ended but the MLflow store did not take the last "
                              "records (kept on disk; --resume writes them)")
    t.add_argument("sweep", help="sweep YAML (see docs/sweeps.md)")
    t.add_argument("--dry-run", action="store_true", help="check every trial's config, print the trial count and "
                   "table (its first 100 rows) and exit")
    t.add_argument("--all", action="store_true", help="with --dry-run: print every row of the trial table")
    t.add_argument("--resume", action="store_true", help="continue an interrupted sweep")
    t.add_argument("--restart", action="store_true", help="discard an unfinished sweep and start over")
    t.add_argument("--no-report", action="store_true", help="do not run `fedsweep report` at the end (by default a "
                   "sweep whose trials all ended writes ./reports/<name>/ and logs it onto its MLflow parent run; "
                   "FEDSWEEP_NO_REPORT=1 does the same as --no-report)")
    t.add_argument("--address", metavar="ADDR", help="an existing Ray cluster (e.g. 127.0.0.1:6379 after "
                   "`ray start --head`); default: start a local Ray instance")
    t.add_argument("--storage", metavar="DIR|URI", help="where Ray Tune keeps the sweep's state and each trial its "
                   "checkpoint (default ./fedsweep_runs); on a cluster every node that runs trials must reach it: a "
                   "folder mounted at the same path on each (NFS), or a URI such as s3://bucket/path (docs/sweeps.md)")

    lg = sub.add_parser("log", help="write the MLflow records a run or sweep kept on disk when its store failed",
                        epilog="exit status: 0 written (or already), 2 the store still fails, the folder is not one "
                               "fedsweep kept or is damaged (the line names what is wrong), or another `fedsweep log` "
                               "is writing it (nothing lost: run it again)")
    lg.add_argument("folder", help="the folder `fedsweep run` or `tune` named (under ./fedsweep_unlogged)")
    lg.add_argument("--tracking-uri", metavar="URI", help="another MLflow store to write them to (default: the "
                    "one they were meant for)")
    lg.add_argument("--experiment", metavar="NAME", help="another experiment for the runs they create (default: "
                    "the one they were meant for; say, when that one was deleted)")

    rp = sub.add_parser("report", help="tables and plots of a finished sweep, read from MLflow")
    rp.add_argument("sweep", help="the sweep YAML that was run")
    rp.add_argument("--out", metavar="DIR", help="output folder (default ./reports/<sweep name>)")

    u = sub.add_parser("ui", help="the MLflow UI on fedsweep's store, at an address that opens the runs",
                       epilog="with a sweep file (or run config): its MLflow store and experiment; without: "
                              "$MLFLOW_TRACKING_URI, else ./mlflow.db, every experiment that holds runs. exit status: "
                              "0 stopped with Ctrl-C, 2 no store there, the port taken, or the UI did not start")
    u.add_argument("sweep", nargs="?", help="a sweep file or run config whose runs to open")
    u.add_argument("--backend-store-uri", metavar="URI", help="the MLflow store (default: the sweep file's, else "
                   "$MLFLOW_TRACKING_URI, else sqlite:///$PWD/mlflow.db)")
    u.add_argument("--experiment", metavar="NAME", help="the experiment to open (default: the sweep's, else all)")
    u.add_argument("--run", metavar="RUN_ID", help="print the address of this run's page too")
    u.add_argument("--port", type=int, metavar="N", help="the port to serve on (default, or 0: a free one)")
    u.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this "
                   "machine only; 0.0.0.0 lets others reach it)")

    b = sub.add_parser("bench", help="rounds per second of both engines, side by side")
    b.add_argument("--json", metavar="PATH", help="write the results as JSON")
    b.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100], metavar="K")
    b.add_argument("--models", nargs="+", default=["mlp", "cnn"], metavar="MODEL",
                   help="registered models to time (`fedsweep models`), each on synthetic data of the input shape it "
                   "was registered with (CIFAR's for resnet18 and mobilenet_v2)")
    b.add_argument("--plugins", metavar="FILE", help="a plugin file (or a config naming plugins) whose models to time")
    b.add_argument("--rounds", type=int, default=5, help="timed rounds per case (after one warm-up)")
    b.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    b.add_argument("--matmul-precision", default="highest", choices=["highest", "high", "medium"],
                   help="the runs' matmul_precision (docs/config.md); high: TF32 on NVIDIA tensor cores")

    ck = sub.add_parser("check", help="check an algorithm against the contract on a tiny problem, in seconds",
                        epilog="exit status: 0 every check passed, 1 some check failed (its line names the hook and "
                               "what to do), 2 an unknown algorithm, a bad --set or a plugin that does not import")
    ck.add_argument("algorithm", help="the algorithm's name (`fedsweep algorithms`; yours: with --plugins)")
    ck.add_argument("--plugins", metavar="FILE", help="a plugin .py file or package folder, or a run config or sweep "
                    "file naming plugins, that registers the algorithm")
    ck.add_argument("--set", dest="overrides", action="append", default=[], metavar="algorithm.KEY=VALUE",
                    help="one of the algorithm's parameters, e.g. --set algorithm.mu=0.1 (repeatable)")

    for kind, what in (("algorithms", "the algorithms and their parameters (algorithm.*)"),
                       ("models", "the models and their options (model.options.*)"),
                       ("datasets", "the datasets, where their data comes from, and their options (data.options.*)")):
        ls = sub.add_parser(kind, help=f"list {what}")
        ls.add_argument("file", nargs="?", metavar="FILE", help="a run config or sweep file (or a plugin .py file or "
                        "package folder): list its plugins' too")
    c = sub.add_parser("config", help="validate a config and print it resolved (every default filled in)")
    c.add_argument("config")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except ConfigError as e:
        print(f"fedsweep: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedsweep: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:   # output piped into `head` and the like: stop quietly, as Unix tools do
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:   # noqa: BLE001 - a user's code failing: one line, its traceback in a file
        line = _user_code_failure(e)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1


def _user_code_failure(e: Exception) -> str | None:
    """One line for an exception raised in a user's code (:func:`fedsweep.util.errors.user_frame`): the
    hook, file and line, what it raised, and the file its whole traceback went to (./fedsweep_errors/);
    None for any other (fedsweep's own: its traceback is the report)."""
    import datetime
    import os
    import traceback

    from fedsweep.util.errors import user_frame
    frame = user_frame(e)
    if frame is None:
        return None
    folder = os.path.join(os.getcwd(), "fedsweep_errors")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{stamp}-{os.getpid()}.txt")
        with open(path, "w") as f:
            f.write("".join(traceback.format_exception(e)))
        kept = f"; the whole traceback: {os.path.relpath(path)}"
    except OSError:
        kept = ""
    what = (str(e).strip().splitlines() or [""])[0][:300]
    return (f"fedsweep: error: your code raised {type(e).__name__}: {what} (in {frame.name}, "
            f"{frame.filename}:{frame.lineno}){kept}")


# A trial's fedsweep.status values (fedsweep.runs.tracking.MLFLOW_STATUS), in the end-of-sweep line.
STATUS_WORDS = ("finished", "diverged", "stopped", "failed", "incomplete", "interrupted", "running")


def sweep_outcome(result: dict, sweep_path: str, reporting: bool = False) -> str:
    """The last lines of ``fedsweep tune``: the trials' outcomes, each failure's error once, the runs
    that ended without their summary (and why), what stopped the sweep and what recovers it (only a
    command that works: ``--resume`` when the sweep's record and Ray Tune's are whole, else
    ``--restart``), MLflow records kept on disk, where Ray's logs are kept if something went wrong,
    and what to run next (``reporting``: the report is made next, and says where it went)."""
    from fedsweep.runs.tracking import ui_command
    counts = ", ".join(f"{v} {k}" for k, v in sorted(result.items()) if k in STATUS_WORDS)
    lines = [f"sweep stopped: {result['stopped_by']}"] if result.get("stopped_by") else []
    if result["unfinished"]:
        lines.append(f"sweep interrupted: {counts or 'no trials started'}; {result['unfinished']} of "
                     f"{result['trials']} unfinished")
    else:
        lines.append(f"sweep done: {counts or 'no trials'}")
    for error, n in sorted(result["errors"].items(), key=lambda e: -e[1]):
        lines.append(f"failed ({n} trial{'s' if n > 1 else ''}): {error}")
    for error, names in sorted(result.get("incomplete_runs", {}).items(), key=lambda e: -len(e[1])):
        shown = ", ".join(sorted(names)[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        lines.append(f"incomplete ({shown}): {error}")
    if result.get("storage"):
        done = "" if result["unfinished"] else "; every trial's result is in MLflow all the same"
        lines.append(f"storage: {result['storage']}{done}")
    if result.get("unlogged"):
        lines.append(f"MLflow: the store did not take the sweep's last records ({result['mlflow_cause']}); they are kept "
                     f"in {result['unlogged']}: once the store works, `fedsweep tune {sweep_path} --resume` writes them "
                     f"(or `fedsweep log {result['unlogged']}`)")
    elif result.get("unlogged_lost"):
        lines.append(f"MLflow: the store did not take the sweep's last records: {result['unlogged_lost']}")
    recover = result.get("recover")
    if recover == "--resume" and (result["unfinished"] or result.get("stopped_by")):
        lines.append(f"continue with:  fedsweep tune {sweep_path} --resume")
    elif recover == "--restart" and (result["unfinished"] or result.get("stopped_by") or result.get("storage")):
        lines.append(f"--resume cannot continue it ({result['resume_problem']}): start it over with:  "
                     f"fedsweep tune {sweep_path} --restart")
    if result.get("ray_session_kept") and (result["unfinished"] or result.get("failed") or result.get("stopped_by")):
        lines.append(f"Ray's logs of it: {result['ray_session']}/logs")
    lines += [f"MLflow parent run {result['parent_run_id']} in experiment {result['experiment']!r}",
              f"compare the trials:  {ui_command(result['tracking_uri'], sweep=sweep_path)}"]
    if not reporting:   # else the report, made next, says where it is and how to remake it
        lines.append(f"report:              fedsweep report {sweep_path}")
    return "\n".join(lines)


def tune_status(result: dict) -> int:
    """``fedsweep tune``'s exit status (its epilog says what each means)."""
    if result["unfinished"] or result.get("stopped_by"):
        return 1
    if result.get("unlogged") or result.get("unlogged_lost"):
        return 5
    return 4 if result.get("failed") or result.get("incomplete") else 0


def _dispatch(args) -> int:
    if args.command in ("run", "tune", "report", "bench", "check"):   # before Lightning or the plots import matplotlib
        from fedsweep.util.mplconfig import use_writable_config_dir
        use_writable_config_dir()
    if args.command in ("run", "config"):
        from fedsweep.config.schema import build_config, read_run_config
        raw, note = read_run_config(args.config, "running" if args.command == "run" else "printing")
        cfg = build_config(raw, args.overrides)
        if note:   # a sweep file: what of it is not run, said rather than silently skipped (once it is valid)
            print(f"fedsweep: note: {note}", file=sys.stderr)
        if args.command == "config":
            import yaml
            print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
            return 0
        if args.no_mlflow:
            cfg.mlflow.enabled = False
        from fedsweep.runs.run import run   # checks every option and output, then loads the data, then trains
        summary = run(cfg, output_json=args.output_json, progress=not args.quiet,
                      ckpt_dir=args.checkpoint_dir, ckpt_every=args.checkpoint_every, resume=args.resume)
        unlogged = 5 if "mlflow_unlogged" in summary else None
        if summary["status"] == "interrupted":
            last = os.path.join(args.checkpoint_dir or "", "last.ckpt")
            more = (f"its last checkpoint could not be written ({summary['checkpoint_error']}): --resume {last} "
                    "would start from an older one, if any" if summary.get("checkpoint_error") else
                    f"continue with --resume {last}" if args.checkpoint_dir
                    else "without --checkpoint-dir it cannot be continued")
            print(f"fedsweep: interrupted after round {summary['rounds']} of {cfg.rounds}; {more}", file=sys.stderr)
            return 130
        return unlogged or (0 if summary["status"] == "finished" else 3)
    if args.command == "log":
        from fedsweep.runs.kept import log_unlogged
        return log_unlogged(args.folder, args.tracking_uri, args.experiment)
    if args.command == "tune":
        if args.all and not args.dry_run:
            raise ConfigError("--all: it prints every row of --dry-run's trial table; give it with --dry-run")
        from fedsweep.sweep.tune import tune_sweep
        result = tune_sweep(args.sweep, resume=args.resume, restart=args.restart, address=args.address,
                            dry_run=args.dry_run, storage=args.storage, show_all=args.all)
        if args.dry_run:
            return 0
        status = tune_status(result)
        reporting = status in (0, 4) and not args.no_report and os.environ.get("FEDSWEEP_NO_REPORT", "") in ("", "0")
        print(sweep_outcome(result, args.sweep, reporting))
        if reporting:
            _report_after_tune(args.sweep)
        return status
    if args.command == "report":
        return _report(args)
    if args.command == "ui":
        from fedsweep.sweep.ui import serve
        return serve(args.sweep, uri=args.backend_store_uri, experiment=args.experiment, run_id=args.run,
                     port=args.port, host=args.host)
    if args.command == "bench":
        from fedsweep.runs.bench import main as bench_main
        return bench_main(args)
    if args.command == "check":
        return _check(args)
    if args.command in ("algorithms", "models", "datasets"):
        from fedsweep.config.listing import list_components
        print(list_components(args.command, args.file), end="")
        return 0
    return 1


def _report_after_tune(sweep_path: str) -> None:
    """``tune``'s report of a sweep whose trials all ended: ``fedsweep report`` with its defaults; a
    report that cannot be made costs one line (the sweep's runs are in MLflow all the same)."""
    try:
        _report(argparse.Namespace(sweep=sweep_path, out=None), remake=True)
    except ConfigError as e:
        print(f"fedsweep: the report was not made: {e}; make it with: fedsweep report {sweep_path}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - the sweep ended as it says; its report is `fedsweep report` again
        print(f"fedsweep: the report was not made ({type(e).__name__}: {str(e)[:200]}); "
              f"make it with: fedsweep report {sweep_path}", file=sys.stderr)


def _report(args, remake: bool = False) -> int:
    """``fedsweep report``: the sweep file and ``--out`` are checked before MLflow is read
    (:func:`fedsweep.api.sweep_report`, which ``fedsweep.report`` shares); its verdicts, a line each, after
    where it was written (``remake``: and how to make it again, after ``tune``)."""
    from fedsweep.api import sweep_report
    from fedsweep.reports.verdicts import verdict_lines
    result = sweep_report(args.sweep, args.out, option="--out", quiet=False)
    again = f"; remake it with: fedsweep report {args.sweep}" if remake else ""
    print(f"report: wrote {result.path} (+ plots in {os.path.dirname(result.path) or '.'}){again}")
    reference = result.comparisons["reference"].iloc[0] if len(result.comparisons) and \
        "reference" in result.comparisons else None
    for line in verdict_lines(result.comparisons, reference):
        print(line)
    return 0


def _check(args) -> int:
    """``fedsweep check``: the plugins, the algorithm's parameters (``--set algorithm.KEY=VALUE``), a line per
    check as it ends (fedsweep/testing.py), a summary; 1 if a check failed."""
    import time

    from fedsweep.config.schema import parse_override, set_dotted
    from fedsweep.testing import check_algorithm
    if args.plugins is not None:
        from fedsweep.config.listing import load_file_plugins
        load_file_plugins(args.plugins, "--plugins")
    params: dict = {}
    for text in args.overrides:
        key, value = parse_override(text)
        if not key.startswith("algorithm.") or key == "algorithm.name":
            raise ConfigError(f"--set {text}: fedsweep check takes the algorithm's own parameters (algorithm.KEY=VALUE) "
                              "and trains its own tiny config; the algorithm is the command's argument")
        set_dotted(params, key.removeprefix("algorithm."), value)
    start = time.perf_counter()
    checks = check_algorithm(args.algorithm, params, raise_on_failure=False, progress=lambda c: print(c.line(), flush=True))
    failed, took = [c for c in checks if c.failed], f"{time.perf_counter() - start:.1f} s"
    skipped = sum(c.skipped for c in checks)
    hooks = ", ".join(dict.fromkeys(c.hook for c in failed))
    after = f"; {skipped} more not made: they follow from it" if skipped else ""
    print(f"{args.algorithm}: {len(failed)} of {len(checks)} checks failed ({hooks}{after}; {took})" if failed
          else f"{args.algorithm}: all {len(checks)} checks passed ({took})")
    return 1 if failed else 0


def entry() -> None:
    """The ``fedsweep`` command. A sweep's driver ends with ``os._exit`` once its exit handlers have
    run: by then every MLflow run is closed, Ray is shut down and the lock is released, and what is
    left is the interpreter tearing down the modules of Ray, MLflow and (then) torch, 1.7 s measured
    on 2 cores (of a 30 s sweep). ``main`` itself returns normally (tests call it in-process).
    Every command but ``bench`` starts up without the cyclic garbage collector (fedsweep/util/startup.py):
    ``run``, ``tune`` and ``report`` turn it back on once their imports are done; ``config``,
    ``algorithms`` and ``datasets`` end right after theirs. ``bench`` times training as a sweep's
    workers run it, collector on."""
    if len(sys.argv) > 1 and sys.argv[1] != "bench":
        from fedsweep.util.startup import pause_collector
        pause_collector()
    code = main()
    if len(sys.argv) > 1 and sys.argv[1] == "tune":
        import atexit
        atexit._run_exitfuncs()   # logging's flush, Ray's and MLflow's own handlers
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    entry()
