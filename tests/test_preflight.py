"""`fedsweep run` checks every output location, the MLflow store and a checkpoint to resume before the
first round: a bad one is one line (exit 2) and nothing is trained or written."""
import json
import sqlite3
import subprocess
import sys
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch
import yaml

from fedsweep.cli import main
from fedsweep.config.schema import ConfigError
from fedsweep.runs.paths import check_writable_dir, check_writable_file
from fedsweep.runs.tracking import check_store
from conftest import tiny_raw


def write(path, raw):
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A real 3-round checkpoint of ``tiny_raw()``."""
    d = tmp_path_factory.mktemp("ckpt")
    assert main(["run", write(d / "cfg.yaml", tiny_raw()), "--checkpoint-dir", str(d), "--quiet"]) == 0
    return d / "last.ckpt"


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A checkpoint of ``tiny_raw(rounds=5)`` stopped after round 2."""
    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import train
    d = tmp_path_factory.mktemp("half")
    train(build_config(tiny_raw(rounds=5)), progress=False, ckpt_dir=d, max_rounds=2)
    return d / "last.ckpt"


def files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def mlflow_at(uri):
    return ["--set", "mlflow.enabled=true", "--set", f"mlflow.tracking_uri={uri}"]


# (case, extra arguments given the test folder and the checkpoint, what the one line must name)
BAD = [
    ("http-nobody", lambda t, c: mlflow_at(f"http://127.0.0.1:{free_port()}"),
     "mlflow.tracking_uri http://127.0.0.1:"),
    ("sqlite-under-file", lambda t, c: mlflow_at(f"sqlite:///{t}/afile/mlflow.db"),
     "/afile is a file, not a folder"),
    ("sqlite-not-a-db", lambda t, c: mlflow_at(f"sqlite:///{t}/afile"), "is not a sqlite database"),
    ("sqlite-foreign-db", lambda t, c: mlflow_at(f"sqlite:///{t}/notes.db"),
     "notes.db is a sqlite database of something else (tables notes), not an MLflow store"),
    ("sqlite-artifacts-file", lambda t, c: mlflow_at(f"sqlite:///{t}/sub/mlflow.db"),
     "the artifacts folder"),
    ("file-store", lambda t, c: mlflow_at(f"file://{t}/mlruns"), "MLFLOW_ALLOW_FILE_STORE"),
    ("output-json-under-file", lambda t, c: ["--output-json", f"{t}/afile/out.json"], "--output-json"),
    ("output-json-is-dir", lambda t, c: ["--output-json", str(t)], "--output-json"),
    ("checkpoint-dir-under-file", lambda t, c: ["--checkpoint-dir", f"{t}/afile/ck"], "--checkpoint-dir"),
    ("checkpoint-dir-is-file", lambda t, c: ["--checkpoint-dir", f"{t}/afile"], "--checkpoint-dir"),
    ("checkpoint-every-negative", lambda t, c: ["--checkpoint-dir", f"{t}/ck", "--checkpoint-every", "-1"],
     "--checkpoint-every: must be 0 or more"),
    ("checkpoint-every-no-dir", lambda t, c: ["--checkpoint-every", "2"], "--checkpoint-every: needs"),
    ("resume-missing", lambda t, c: ["--resume", f"{t}/none.ckpt"], "--resume: checkpoint not found"),
    ("resume-empty", lambda t, c: ["--resume", f"{t}/empty.ckpt"], "damaged or truncated checkpoint (empty"),
    ("resume-truncated", lambda t, c: ["--resume", f"{t}/half.ckpt"], "damaged or truncated checkpoint"),
    ("resume-foreign-torch", lambda t, c: ["--resume", f"{t}/foreign.ckpt"], "not a fedsweep checkpoint"),
    ("resume-pickled-module", lambda t, c: ["--resume", f"{t}/module.ckpt"], "not a fedsweep checkpoint"),
    ("resume-text", lambda t, c: ["--resume", f"{t}/afile"], "not a fedsweep checkpoint"),
    ("resume-other-model", lambda t, c: ["--resume", str(c), "--set", "model.options.hidden=32"],
     "does not match this config (model.options.hidden: 16 in the checkpoint, 32 here)"),
    ("resume-other-algorithm", lambda t, c: ["--resume", str(c), "--set", "algorithm.name=scaffold"],
     "does not match this config (algorithm.name: 'fedavg' in the checkpoint, 'scaffold' here)"),
    ("resume-other-optimizer", lambda t, c: ["--resume", str(c), "--set", "server.optimizer=adam"],
     "server.optimizer: 'sgd' in the checkpoint, 'adam' here"),
    ("resume-other-lr", lambda t, c: ["--resume", str(c), "--set", "local.lr=0.05"],
     "(local.lr: 0.1 in the checkpoint, 0.05 here); a resumed run keeps the config it was trained with"),
    ("resume-fewer-rounds", lambda t, c: ["--resume", str(c), "--set", "rounds=2"],
     "the checkpoint has done 3 rounds, more than rounds=2 here"),
    ("resume-into-another-runs-folder", lambda t, c: ["--resume", str(c), "--checkpoint-dir", f"{t}/other"],
     "/other: it holds another run's checkpoint (fedavg, seed 3, round 2 of 5), which this run would replace; "
     "give this run a folder of its own"),
    ("fresh-run-into-an-interrupted-runs-folder", lambda t, c: ["--checkpoint-dir", f"{t}/half"],
     "continue that run with --resume"),
    ("experiment-name-too-long", lambda t, c: ["--set", "mlflow.enabled=true", "--set", f"mlflow.experiment={'x' * 501}"],
     "mlflow.experiment: 501 characters, and MLflow takes at most 500"),
]


@pytest.mark.parametrize("case,args,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_output_or_store_fails_before_training(tmp_path, monkeypatch, capsys, checkpoint, interrupted, case, args,
                                                   needle):
    monkeypatch.chdir(tmp_path)                    # a default store or a stray file would land here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    (tmp_path / "afile").write_text("a regular file\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mlartifacts").write_text("a file where the artifacts folder goes\n")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    con = sqlite3.connect(tmp_path / "notes.db")   # somebody else's database: MLflow would add its tables
    con.execute("CREATE TABLE notes (t TEXT)")
    con.commit()
    con.close()
    notes = (tmp_path / "notes.db").read_bytes()
    data = checkpoint.read_bytes()
    (tmp_path / "half.ckpt").write_bytes(data[:len(data) // 2])
    torch.save({"a": 1}, tmp_path / "foreign.ckpt")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.ckpt")
    (tmp_path / "other").mkdir()                     # another run's checkpoint
    (tmp_path / "other" / "last.ckpt").write_bytes(interrupted.read_bytes())
    (tmp_path / "half").mkdir()                      # a run stopped at round 2 of 5
    (tmp_path / "half" / "last.ckpt").write_bytes(interrupted.read_bytes())
    cfg = write(tmp_path / "cfg.yaml", tiny_raw())
    before = files(tmp_path)
    assert main(["run", cfg, *args(tmp_path, checkpoint)]) == 2
    printed = capsys.readouterr()
    err = printed.err.strip()
    assert len(err.splitlines()) == 1, err     # no data description, no "round ..." progress lines
    assert err.startswith("fedsweep: error: ") and needle in err and "Traceback" not in err
    assert printed.out == ""                   # no summary
    assert files(tmp_path) == before           # nothing written: no store, checkpoint folder or summary
    assert (tmp_path / "notes.db").read_bytes() == notes


def test_output_json_creates_its_folders(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", write(tmp_path / "cfg.yaml", tiny_raw()), "--output-json", "newdir/sub/out.json",
                 "--quiet"]) == 0
    summary = json.loads((tmp_path / "newdir" / "sub" / "out.json").read_text())
    assert summary["rounds"] == 3 and summary["status"] == "finished"


def test_resume_with_more_rounds_passes_the_check(tmp_path, capsys, checkpoint):
    cfg = write(tmp_path / "cfg.yaml", tiny_raw())
    out = tmp_path / "out.json"
    assert main(["run", cfg, "--resume", str(checkpoint), "--set", "rounds=4", "--set", "eval.batch_size=7",
                 "--output-json", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["rounds"] == 4


def test_path_checks_name_the_option_and_create_nothing(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match=r"^--storage .*afile is a file, not a folder$"):
        check_writable_dir(tmp_path / "afile" / "runs", "--storage")
    check_writable_dir(tmp_path / "a" / "b" / "c", "--storage")
    check_writable_file(tmp_path / "x" / "y.json", "--output-json")
    check_writable_file(tmp_path / "afile", "--output-json")    # an existing file is overwritten
    assert files(tmp_path) == ["afile"]


def test_check_store_http(tmp_path):
    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:   # any HTTP answer means a server is there
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        assert check_store(uri) == uri
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as silent:   # accepts connections, never answers: fails after the timeout
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(ConfigError, match=r"no MLflow server answers there \(timed out\)"):
            check_store(uri, timeout=0.5)


def test_check_store_sqlite_existing_and_outdated(tmp_path):
    db = tmp_path / "store" / "mlflow.db"
    uri = f"sqlite:///{db}"
    assert check_store(uri) == uri and not db.parent.exists()    # a new store: nothing created
    # made and then altered by another process: MLflow checks a store's schema once per process
    subprocess.run([sys.executable, "-c", "import sqlite3, sys; from mlflow import MlflowClient; "
                    "MlflowClient(tracking_uri=sys.argv[1]).search_experiments(); "
                    "c = sqlite3.connect(sys.argv[2]); c.execute(\"UPDATE alembic_version SET version_num = "
                    "'0123456789ab'\"); c.commit()", uri, str(db)], check=True, capture_output=True, timeout=120)
    with pytest.raises(ConfigError, match=r"MLflow cannot use this store .* mlflow db upgrade"):
        check_store(uri)
