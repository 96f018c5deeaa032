"""`fedsweep ui`: the MLflow UI on the store a sweep file names, on a free port, its printed address
opening the sweep's runs; one line for a missing store or a taken port; Ctrl-C stops it and every
process it started. A real `mlflow ui` on a real store."""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from fedsweep.cli import main
from raycluster import interrupt


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc (each one's parent)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        pid = todo.pop()
        below = [p for p, parent in parents.items() if parent == pid]
        found += below
        todo += below
    return found


def _store_with_a_run(tmp_path, experiment="exp"):
    from mlflow import MlflowClient
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment(experiment, artifact_location=(tmp_path / "art").as_uri()),
                            run_name="a run")
    client.log_metric(run.info.run_id, "test/accuracy", 0.5)
    return uri, run


def test_a_missing_store_an_unknown_experiment_and_a_taken_port_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["ui"]) == 2
    err = capsys.readouterr().err
    assert "no MLflow store there (nothing read, nothing created)" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "mlflow.db").exists()
    uri, _ = _store_with_a_run(tmp_path)
    assert main(["ui", "--backend-store-uri", uri, "--experiment", "nope"]) == 2
    assert "experiment 'nope': not in the store" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["ui", "--backend-store-uri", uri, "--port", str(port)]) == 2
        assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "s", "base": {"mlflow": {"tracking_uri": uri}}, "seeds": [0]}))
    assert main(["ui", str(sweep)]) == 2      # its experiment has no runs yet
    assert "experiment 's': not in the store" in capsys.readouterr().err


def test_it_serves_the_sweeps_runs_on_a_free_port_and_ctrl_c_stops_all_of_it(tmp_path):
    uri, run = _store_with_a_run(tmp_path, experiment="sw")
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(yaml.safe_dump({"name": "sw", "base": {"mlflow": {"tracking_uri": uri}}, "seeds": [0]}))
    ui = subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "ui", str(sweep), "--run", run.info.run_id],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          cwd=tmp_path)
    try:
        lines = []
        deadline = time.time() + 120
        while not any(line.startswith("stop it with Ctrl-C") for line in lines):
            line = ui.stdout.readline()
            assert line or ui.poll() is None, ui.stderr.read()
            lines.append(line.strip())
            assert time.time() < deadline
        opens = [word for line in lines if not line.startswith("starting") for word in line.split()
                 if word.startswith("http://")]
        exp_id = run.info.experiment_id
        assert opens[0].endswith(f"/#/experiments/{exp_id}/runs/{run.info.run_id}?workflowType=machine_learning")
        assert opens[1].endswith(f"/#/experiments/{exp_id}/runs?workflowType=machine_learning")
        port = int(opens[1].split(":")[2].split("/")[0])
        assert port != 5000 and f"(port {port};" in lines[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as answer:
            assert answer.status == 200
        children = descendants(ui.pid)
        assert len(children) >= 1            # the MLflow server fedsweep started (and its workers)
        os.kill(ui.pid, signal.SIGINT)       # Ctrl-C
        assert ui.wait(timeout=30) == 0
        assert "stopping the MLflow UI" in ui.stdout.read()
        deadline = time.time() + 20      # each gets the group's SIGTERM; uvicorn's workers take a moment
        while [p for p in children if os.path.exists(f"/proc/{p}")] and time.time() < deadline:
            time.sleep(0.2)
        assert not [p for p in children if os.path.exists(f"/proc/{p}")]   # nothing left running
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        interrupt(ui, 30, group=False)   # Ctrl-C first: fedsweep ui then stops the UI's own session too


def test_a_killed_fedsweep_ui_leaves_no_mlflow_process(tmp_path):
    """SIGKILL gives fedsweep ui no chance to stop the UI it started (in a session of its own):
    the UI ends with it all the same (PR_SET_PDEATHSIG), and so does everything the UI started. (`--port
    0`: any free port, as a socket takes it.)"""
    uri, _ = _store_with_a_run(tmp_path)
    ui = subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "ui", "--backend-store-uri", uri, "--port", "0"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while "stop it with Ctrl-C" not in ui.stdout.readline():
            assert ui.poll() is None and time.time() < deadline
        children = descendants(ui.pid)
        assert children
        os.kill(ui.pid, signal.SIGKILL)
        ui.wait()
        deadline = time.time() + 30
        while [p for p in children if os.path.exists(f"/proc/{p}")] and time.time() < deadline:
            time.sleep(0.2)
        assert not [p for p in children if os.path.exists(f"/proc/{p}")]
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)
            ui.wait()
