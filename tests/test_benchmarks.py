"""The benchmark scripts run end to end on tiny inputs and write the numbers they promise."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_tune import TINY

ROOT = Path(__file__).parent.parent
pytestmark = pytest.mark.usefixtures("fresh_home")


def test_pack_benchmark(tmp_path):
    out = tmp_path / "pack.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pack.py"), "--packs", "1", "2", "--rounds", "2",
                    "--json", str(out)], check=True, capture_output=True, cwd=tmp_path)
    rows = json.loads(out.read_text())["results"]
    assert [(r["model"], r["pack"]) for r in rows] == [("mlp", 1), ("mlp", 2)]
    assert all(r["packed_s"] > 0 and r["one_by_one_s"] > 0 and r["ratio"] > 0 for r in rows)


@pytest.mark.slow   # ~100 s: two real sweeps, three `fedsweep run`s and the trials in process
def test_sweep_benchmark(tmp_path):
    sweep = tmp_path / "b.yaml"
    sweep.write_text(yaml.safe_dump({**TINY, "name": "b", "grid": {"local.lr": [0.05, 0.1]},
                                     "methods": {"fedavg": {}}}))
    out = tmp_path / "sweep.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep.py"), str(sweep), "--pack", "2", "--json", str(out)],
                   check=True, capture_output=True, cwd=tmp_path)
    got = json.loads(out.read_text())
    assert got["trials"] == 2 and got["pack"] == 2
    assert got["in_process"]["sum_s"] > 0 and got["goal_wall_s"] > got["ideal_wall_s"]
    for run in ("unpacked", "packed"):
        assert got[run]["trials"] == 2 and got[run]["statuses"] == ["finished"]
        assert 0 < got[run]["startup_s"] < got[run]["wall_s"]
    assert got["import_lightning_s"] > 0 and got["fedsweep_run_1_round_no_mlflow_s"] > 0
