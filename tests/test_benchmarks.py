"""The benchmark scripts run end to end on tiny inputs and write the numbers they promise."""
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from test_tune import AT_ONCE   # a benchmarked sweep runs as many trials at once as the machine holds

ROOT = Path(__file__).parent.parent
pytestmark = pytest.mark.usefixtures("fresh_home")


def test_pack_benchmark(tmp_path):
    out = tmp_path / "pack.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pack.py"), "--packs", "1", "2", "--rounds", "2",
                    "--arithmetic", "--threads", "1", "--json", str(out)], check=True, capture_output=True, cwd=tmp_path)
    result = json.loads(out.read_text())
    assert result["threads"] == 1 and result["matmul_precision"] == "highest"
    rows = result["results"]
    assert [(r["model"], r["pack"]) for r in rows] == [("mlp", 1), ("mlp", 2)]
    assert all(r["packed_s"] > 0 and r["one_by_one_s"] > 0 and r["ratio"] > 0 for r in rows)
    bound = result["mlp_arithmetic"]
    assert [(r["pack"], r["rows"]) for r in bound] == [(1, 10), (2, 20)]
    assert bound[0]["us_per_row_vs_pack_1"] == 1.0
    assert all(r["step_ms"] > 0 and r["gflops"] > 0 for r in bound)


def test_worker_timelines_and_their_plot(tmp_path, monkeypatch):
    """The marks a trial writes (fedsweep.sweep.trainable, as in a sweep's worker) are read back phase by
    phase and drawn, one lane a worker and sweep."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import sweep as bench

    from fedsweep.sweep.trainable import _phase_marks
    folder = tmp_path / "timeline"
    folder.mkdir()
    monkeypatch.setenv("FEDSWEEP_TIMELINE", str(folder))
    mark = _phase_marks()
    start = time.time()
    for _ in range(3):                               # three trials of one worker
        for phase in ("start", "checkpoint", "trained", "checkpoint", "reported", "artifacts"):
            time.sleep(0.01)
            mark(phase)
    (worker,) = bench.worker_timelines(folder, start)
    # checkpoints are counted; the phases they fall in stay whole
    assert worker["units"] == 3 and [p for _, p in worker["marks"]] == ["start", "trained", "reported", "artifacts"] * 3
    assert worker["checkpoints"] == 6 and worker["training_s"] > 0.05 and worker["final_report_s"] > 0.05
    times = [t for t, _ in worker["marks"]]
    assert times == sorted(times) and times[0] == pytest.approx(worker["first_start_s"], abs=1e-3)
    assert worker["training_s"] > 0.02 and worker["between_trials_s"] > 0.01
    assert worker["final_report_s"] > 0.02 and worker["artifacts_s"] > 0.02
    # A baseline checkout older than the artifacts drawn during the report marks them before it.
    old = tmp_path / "old"
    old.mkdir()
    (old / "1.txt").write_text("".join(f"{start + 0.1 * i + 0.01 * j:.4f} {p}\n" for i in range(3)
                                       for j, p in enumerate(("start", "trained", "artifacts", "reported"))))
    (before,) = bench.worker_timelines(old, start)
    assert before["between_trials_s"] == pytest.approx(0.14, abs=1e-3) and before["artifacts_s"] == pytest.approx(0.03, abs=1e-3)
    out = {"sweep": "s.yaml", "trials": 3, "concurrency": 1,
           "unpacked": {"wall_s": times[-1] + 0.1, "workers": [worker]},
           "packed": {"wall_s": times[-1] + 0.1, "workers": [worker]},
           "baseline": {"unpacked": {"wall_s": times[-1], "workers": [worker, worker]}}}
    from PIL import Image
    two = Image.open(bench.timeline_png({**out, "baseline": None}, tmp_path / "two.png"))
    four = Image.open(bench.timeline_png(out, tmp_path / "four.png"))
    assert two.width == four.width and four.height > two.height    # a lane for each worker of each sweep


def test_pack_benchmark_of_a_sweeps_own_trials(tmp_path):
    """`--sweep`: the sweep's own trials one after another and in the packs `pack: N` makes, in one
    process without Ray or MLflow (how a machine without them, such as a lent GPU's, measures it)."""
    sweep = tmp_path / "p.yaml"
    sweep.write_text(yaml.safe_dump({**AT_ONCE, "name": "p", "methods": {"fedavg": {}}, "grid": {"local.lr": [0.05, 0.1]},
                                     "seeds": [0, 1, 2]}))
    out = tmp_path / "pack.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pack.py"), "--sweep", str(sweep), "--pack", "4",
                    "--repeat", "2", "--threads", "1", "--json", str(out)],
                   check=True, capture_output=True, cwd=tmp_path)
    got = json.loads(out.read_text())
    assert (got["trials"], got["packs"], got["pack"], got["device"]) == (6, 2, 4, "cpu")   # 6 configs: packs of 3
    assert len(got["one_by_one_s"]) == len(got["packed_s"]) == 2 and min(got["one_by_one_s"] + got["packed_s"]) > 0
    assert got["ratio"] == pytest.approx(got["trials_per_min_packed"] / got["trials_per_min_one_by_one"])


@pytest.mark.slow
def test_pack_benchmark_against_a_baseline(tmp_path):
    """`--sweep --baseline DIR`: each timing in a fresh process whose fedsweep is the named checkout's
    (first on the path, before the editable install), the baseline's first, in turn."""
    sweep = tmp_path / "b.yaml"
    sweep.write_text(yaml.safe_dump({**AT_ONCE, "name": "b", "methods": {"fedavg": {}, "fedprox": {}}, "seeds": [0, 1]}))
    base = tmp_path / "base"
    shutil.copytree(ROOT / "fedsweep", base / "fedsweep")
    out = tmp_path / "ab.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pack.py"), "--sweep", str(sweep),
                           "--threads", "1", "--skip-packed", "--repeat", "2", "--baseline", str(base),
                           "--json", str(out)],
                          check=True, capture_output=True, text=True, cwd=tmp_path)
    got = json.loads(out.read_text())
    # each side's processes trained with its own checkout's fedsweep (the script checks what they imported)
    assert got["baseline"]["code"] == str(base.resolve()) and got["now"]["code"] == str(ROOT.resolve())
    for side in ("baseline", "now"):
        assert len(got[side]["one_by_one_s"]) == 2 and "packed_s" not in got[side]
        assert set(got[side]["ms_a_trial_by_method"]) == {"fedavg", "fedprox"}
    lines = proc.stderr.splitlines()
    assert [ln.split()[1] for ln in lines if ln.startswith("[")] == ["baseline", "now"] * 2


def test_pack_memory_benchmark(tmp_path):
    out = tmp_path / "mem.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pack_memory.py"), "--pack", "3", "--root",
                    str(tmp_path / "cifar"), "--images-per-batch", "40", "--json", str(out)],
                   check=True, capture_output=True, cwd=tmp_path)
    got = json.loads(out.read_text())
    assert got["pack"] == 3 and got["seconds"] > 0 and got["peak_rss_gb"] > 0
    assert len(list((tmp_path / "cifar" / "cifar-10-batches-py").iterdir())) == 7   # 5 + 1 batches, meta


@pytest.mark.slow   # ~100 s: two real sweeps, three `fedsweep run`s and the trials in process
def test_sweep_benchmark(tmp_path):
    sweep = tmp_path / "b.yaml"
    sweep.write_text(yaml.safe_dump({**AT_ONCE, "name": "b", "grid": {"local.lr": [0.05, 0.1]},
                                     "methods": {"fedavg": {}}}))
    out = tmp_path / "sweep.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep.py"), str(sweep), "--pack", "2", "--json", str(out),
                    "--plot", str(tmp_path / "timeline.png")], check=True, capture_output=True, cwd=tmp_path)
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    got = json.loads(out.read_text())
    assert got["trials"] == 2 and got["pack"] == 2
    assert got["in_process"]["sum_s"] > 0 and got["goal_wall_s"] > got["ideal_wall_s"]
    assert got["in_parallel"]["wall_s"] > 0 and got["in_parallel"]["scaling"] > 0   # the 2 trials, 2 at once
    for run in ("unpacked", "packed"):
        assert got[run]["trials"] == 2 and got[run]["statuses"] == ["finished"]
        assert 0 < got[run]["startup_s"] < got[run]["wall_s"]
        assert got[run]["over_parallel_s"] == pytest.approx(got[run]["wall_s"] - got["in_parallel"]["wall_s"])
        assert got[run]["over_goal_s"] == pytest.approx(got[run]["wall_s"] - got["goal_wall_s"])
        assert got[run]["over_goal_s_all"] == [pytest.approx(got[run]["over_goal_s"])]
        workers = got[run]["workers"]                        # each Ray worker's trials, phase by phase
        assert sum(w["units"] for w in workers) == (2 if run == "unpacked" else 1)
        for w in workers:
            assert 0 < w["first_start_s"] < w["last_end_s"] < got[run]["wall_s"]
            # artifacts_s: the drawing left after the final report, often none of it
            assert w["training_s"] > 0 and w["artifacts_s"] >= 0 and w["final_report_s"] > 0
            assert w["training_s"] + w["artifacts_s"] + w["final_report_s"] + w["between_trials_s"] <= \
                w["last_end_s"] - w["first_start_s"] + 1e-3
            assert w["marks"][0] == [pytest.approx(w["first_start_s"], abs=1e-3), "start"]
    assert got["import_lightning_s"] > 0 and got["fedsweep_run_1_round_no_mlflow_s"] > 0
    assert set(got["commands_s"]) == {"config", "algorithms", "datasets"} and min(got["commands_s"].values()) > 0
    assert got["unpacked"]["report_s"] > 0 and "report_s" not in got["packed"]


@pytest.mark.slow   # ~2 min: 4 real sweeps, 4 in-process sums and 4 in-process runs 2 at once
def test_sweep_benchmark_repeats_against_a_baseline(tmp_path):
    """--repeat medians with every value kept; --baseline measures another checkout (here this one
    again) right before this one, each time. The sweep has a scheduler, beside which fedsweep refuses
    `pack:`: the benchmark says so and measures the rest (test_sweep_benchmark measures a packed run)."""
    sweep = tmp_path / "a.yaml"
    sweep.write_text(yaml.safe_dump({**AT_ONCE, "name": "a", "grid": {"local.lr": [0.05, 0.1]}, "methods": {"fedavg": {}},
                                     "scheduler": {"kind": "asha", "metric": "test/accuracy", "grace_period": 2}}))
    out = tmp_path / "sweep.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep.py"), str(sweep), "--repeat", "2",
                           "--baseline", str(ROOT), "--json", str(out)],
                          check=True, capture_output=True, text=True, cwd=tmp_path)
    assert "packed: not measured: " in proc.stdout and "has a scheduler (asha)" in proc.stdout
    got = json.loads(out.read_text())
    assert got["pack"] is None and "packed_speedup" not in got
    for res in (got, got["baseline"]):
        assert "packed" not in res
        assert len(res["in_process"]["sum_s_all"]) == 2 and res["in_process"]["sum_s"] in res["in_process"]["sum_s_all"]
        assert len(res["in_parallel"]["wall_s_all"]) == 2
        run = res["unpacked"]
        assert len(run["wall_s_all"]) == 2 and run["wall_s"] in run["wall_s_all"]
        assert run["trials"] == 2 and set(run["statuses"]) <= {"finished", "stopped"}
        # each repeat's sweep against the goal from the in-process sum measured beside it
        assert run["over_goal_s_all"] == [pytest.approx(w - (1.3 * t / got["concurrency"] + 10)) for t, w
                                          in zip(res["in_process"]["sum_s_all"], run["wall_s_all"])]
    order = [line.split("]")[1].split(":")[0].strip() for line in proc.stdout.splitlines() if line.startswith("[")]
    assert order[:6] == ["baseline in_process", "now in_process", "baseline in_parallel", "now in_parallel",
                         "baseline unpacked", "now unpacked"]
    assert len(order) == 12
    assert proc.stdout.count(f"against the goal (≤ 1.3 × sum / {got['concurrency']} + 10 s): ") == 2


def test_sweep_benchmark_refuses_a_baseline_that_is_not_fedsweep(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep.py"), "x.yaml", "--baseline", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and "not a fedsweep checkout" in proc.stderr


def test_clients_benchmark(tmp_path):
    """benchmarks/clients.py: one fresh process a case and repeat, the ratio to N's smallest, the state
    SCAFFOLD held and the memory figures it promises."""
    out = tmp_path / "clients.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "clients.py"), "--clients", "100", "2000",
                    "--algorithms", "scaffold", "--k", "10", "--rounds", "3", "--repeat", "2",
                    "--threads", "1", "--json", str(out)], check=True, capture_output=True, cwd=tmp_path)
    result = json.loads(out.read_text())
    assert result["repeat"] == 2 and result["threads"] == 1
    rows = result["results"]
    assert [(r["algorithm"], r["clients"]) for r in rows] == [("scaffold", 100), ("scaffold", 2000)]
    assert all(len(r["round_ms_each"]) == 2 and r["round_ms"] > 0 and r["peak_rss_mb"] > r["data_mb"] for r in rows)
    assert rows[0]["round_vs_smallest_n"] == 1.0 and rows[1]["data_mb"] > 10 * rows[0]["data_mb"]
    assert all(0 < r["clients_with_state"] <= 30 and r["client_state_mb"] > 0 for r in rows)


def test_client_eval_benchmark(tmp_path):
    out = tmp_path / "client_eval.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "client_eval.py"), "--clients", "20", "--rounds", "10",
                    "--mean-samples", "5", "--repeat", "1", "--threads", "1", "--json", str(out)],
                   check=True, capture_output=True, cwd=tmp_path)
    result = json.loads(out.read_text())
    (part,) = result["parts"]
    assert part["clients"] == 20 and part["test_samples_held"] >= part["distinct_test_samples"] > 0
    assert all(part[f"{p}_ms"] > 0 and part[f"{p}_loop_vs_vectorized"] > 0 for p in ("global", "own", "finetune_64"))
    (cost,) = result["rounds_cost"]
    assert cost["round_ms_without"] > 0 and cost["clients_vs_without"] > 0 and cost["finetune_vs_without"] > 0
