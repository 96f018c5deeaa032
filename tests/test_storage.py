"""A sweep's storage (fedsweep.sweep.storage): a folder, and an S3 bucket of a real S3-compatible server
(moto's, on loopback) through pyarrow, as a cluster without a shared disk would use one."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedsweep.cli import main
from fedsweep.config.schema import ConfigError
from fedsweep.sweep.storage import Storage
from raycluster import end_session, free_port
from test_tune import TINY, trial_runs, write_sweep

pytestmark = pytest.mark.usefixtures("fresh_home")


def _exercise(store: Storage):
    """What a sweep does with its storage, the same on any kind."""
    assert store.is_empty() and not store.exists("a.txt") and store.read_text("a.txt") is None
    store.write_text("s/a.txt", "one")
    assert store.exists("s") and not store.is_empty() and store.child("s").read_text("a.txt") == "one"
    with pytest.raises(OSError, match="disk full"):       # a writer that fails replaces nothing
        with store.writing("s/a.txt") as path:
            path.write_text("half")
            raise OSError("disk full")
    assert store.read_text("s/a.txt") == "one"
    with store.writing("s/a.txt") as path:
        path.write_text("two")
    with store.reading("s/a.txt") as path:
        assert path.read_text() == "two"
    with store.reading("s/none.txt") as path:
        assert path is None
    store.child("s").delete()
    assert store.is_empty() and store.read_text("s/a.txt") is None
    store.delete("s")                                      # nothing there: nothing to do


def test_a_folder(tmp_path):
    store = Storage(tmp_path / "st")
    _exercise(store)
    assert store.local and store.where("x") == str(tmp_path / "st" / "x")
    with store.writing("f.ckpt") as path:
        assert path.parent == tmp_path / "st"             # a rename in the same folder: whole or not at all
        path.write_bytes(b"x")
    assert sorted(os.listdir(tmp_path / "st")) == ["f.ckpt"]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A bucket on a real S3-compatible server (moto's) on loopback, its process stopped exactly:
    yields the storage URI of its folder ``sweeps``."""
    server = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    if server is None:
        pytest.skip("moto's S3 server is not installed beside this Python (pip install -e '.[test]')")
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    query = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    try:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                         "AWS_EC2_METADATA_DISABLED": "true"}.items():
                mp.setenv(k, v)
            import pyarrow.fs
            deadline = time.time() + 60
            while True:
                try:
                    fs, _ = pyarrow.fs.FileSystem.from_uri(f"s3://bucket?{query}&allow_bucket_creation=true")
                    fs.create_dir("bucket")
                    break
                except OSError:
                    assert proc.poll() is None and time.time() < deadline, log.read_text()[-2000:]
                    time.sleep(0.3)
            yield f"s3://bucket/sweeps?{query}"
    finally:
        end_session(proc.pid)


def test_an_s3_bucket(s3):
    store = Storage(s3)
    _exercise(store)
    assert not store.local and store.where("x/y") == "s3://bucket/sweeps/x/y"   # the query (options) left out
    store.check_writable()
    with pytest.raises(ConfigError, match=r"^--storage s3://nobucket/s\?.*: cannot write there \(OSError: "):
        Storage(s3.replace("bucket/sweeps", "nobucket/s")).check_writable()
    with pytest.raises(ConfigError, match=r"^--storage nosuch://x: pyarrow cannot open it \("):
        Storage("nosuch://x")


@pytest.mark.slow
def test_a_sweep_in_an_s3_bucket_resumes_from_its_checkpoints_there(s3, tmp_path, monkeypatch, capsys):
    """`--storage s3://...`: Tune's experiment and each trial's checkpoint live in the bucket, and
    nothing of the sweep on the driver's disk but the lock. Ctrl-C part-way, then `--resume`: the
    trials continue from their checkpoints in the bucket, each round once in MLflow, every run with its
    summary and artifacts; a sweep started over deletes the finished one's folder in the bucket."""
    import pyarrow.fs
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = write_sweep(tmp_path / "b.yaml", "b", methods={"fedavg": {}}, seeds=[0, 1], checkpoint_every=1,
                       grid={}, base={**TINY["base"], "rounds": 2000, "eval": {"every": 100}})
    fs, root = pyarrow.fs.FileSystem.from_uri(s3)
    ckpts = pyarrow.fs.FileSelector(f"{root}/b/trial_checkpoints", allow_not_found=True)
    with open(tmp_path / "driver.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "tune", path, "--storage", s3], cwd=tmp_path,
                                env={**os.environ, "MLFLOW_TRACKING_URI": uri}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.time() + 240
        while len(fs.get_file_info(ckpts)) < 2:                 # both trials part-way
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "driver.log").read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=180) == 1, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert sorted(p.name for p in (tmp_path / "fedsweep_runs").iterdir()) == ["b.lock"]

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    assert main(["tune", path, "--resume", "--storage", s3]) == 0
    assert capsys.readouterr().err.count("[resumed] fedavg seed=") >= 1
    client, runs = trial_runs(uri, "b")
    assert sorted(r.data.tags["fedsweep.status"] for r in runs) == ["finished", "finished"]
    assert any(0 < int(r.data.tags.get("fedsweep.resumed_from_round", 0)) < 2000 for r in runs)
    for r in runs:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")] == list(range(1, 2001))
        assert r.data.metrics["summary/rounds"] == 2000
        assert {"config.yaml", "metrics.csv", "curves.png", "summary.json"} <= \
            {a.path for a in client.list_artifacts(r.info.run_id)}
    state = Storage(s3).child("b")
    assert '"finished": true' in state.read_text("fedsweep_sweep.json")
    old = {i.path for i in fs.get_file_info(pyarrow.fs.FileSelector(f"{root}/b", recursive=True))}
    from fedsweep.sweep.tune import _discard
    _discard(state)                                              # what a new run of a finished sweep does first
    assert not fs.get_file_info(pyarrow.fs.FileSelector(f"{root}/b", recursive=True, allow_not_found=True))
    assert any(p.endswith(".ckpt") for p in old)
