"""fedsweep touches nothing it did not make, and two drivers never run one sweep.

Real files, real locks, real processes; every refusal is one line, exit 2, before Ray starts."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

from fedsweep.cli import main
from fedsweep.util.locks import SweepLock, _processes, end_leftovers, leftovers
from test_tune import TINY, trial_runs, write_sweep

pytestmark = pytest.mark.usefixtures("fresh_home")


def listing(root):
    """Every path under ``root`` with its size: what must be unchanged after a refusal."""
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*"))


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedsweep: error: "), err
    return err


@pytest.mark.parametrize("name", ["..", "../x", "/tmp/fedsweep-abs", ".", ".hidden", "a/b", "a b", "x" * 101, ""])
def test_unsafe_sweep_names_are_refused_before_anything_runs(tmp_path, monkeypatch, capsys, name):
    """`name: ".."` run twice must not delete the whole current directory."""
    work = tmp_path / "work"
    (work / "mine").mkdir(parents=True)
    (work / "mine" / "notes.txt").write_text("keep me")
    (work / "mlflow.db").write_text("not really a store, but mine")
    monkeypatch.chdir(work)
    path = write_sweep(work / "s.yaml", name)
    before = listing(tmp_path)
    for args in (["tune", path], ["tune", path, "--restart"], ["tune", path, "--dry-run"], ["report", path]):
        assert main(args) == 2
        err = one_line_error(capsys)
        assert "name: " in err and "allowed: 1-100 letters, digits" in err
    assert listing(tmp_path) == before


def test_a_file_name_that_cannot_name_a_sweep_asks_for_a_name(tmp_path, capsys):
    path = write_sweep(tmp_path / "my sweep.yaml", None)
    assert main(["tune", path, "--dry-run"]) == 2
    assert "name: the file name 'my sweep' cannot name a sweep folder; set `name:`" in one_line_error(capsys)


@pytest.mark.parametrize("flags", [[], ["--restart"], ["--resume"]])
def test_a_folder_fedsweep_did_not_make_is_never_deleted(tmp_path, monkeypatch, capsys, flags):
    """`--storage` and `name` pointing at an existing folder of the user's: refused, naming it."""
    monkeypatch.chdir(tmp_path)
    storage = tmp_path / "results"
    (storage / "exp" / "deep").mkdir(parents=True)
    (storage / "exp" / "thesis.tex").write_text("\\documentclass{article}")
    (storage / "exp" / "deep" / "data.csv").write_text("a,b\n1,2\n")
    path = write_sweep(tmp_path / "exp.yaml", "exp")
    before = listing(tmp_path)
    assert main(["tune", path, "--storage", str(storage), *flags]) == 2
    err = one_line_error(capsys)
    needle = "no sweep 'exp' to resume" if flags == ["--resume"] else \
        f"{storage / 'exp'} exists and was not made by fedsweep"
    assert needle in err
    after = listing(tmp_path)
    assert [p for p in after if not p[0].endswith(".lock")] == before     # the lock file is fedsweep's own


def test_what_a_killed_driver_left_of_a_new_sweep_folder_is_its_own(tmp_path):
    """A driver killed between making the sweep's folder and writing into it leaves it empty: the next
    start uses it as it is. Once the state file is there (it is written first), the folder is
    fedsweep's: `--restart` deletes it even without the trials file. Anything else stays refused."""
    from fedsweep.config.schema import ConfigError
    from fedsweep.sweep.storage import STATE_FILE, Storage
    from fedsweep.sweep.tune import _discard
    empty = tmp_path / "empty"
    empty.mkdir()
    _discard(Storage(empty))
    assert empty.is_dir() and not any(empty.iterdir())
    half = tmp_path / "half"
    half.mkdir()
    (half / STATE_FILE).write_text("{}")
    _discard(Storage(half))
    assert not half.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="was not made by fedsweep"):
        _discard(Storage(mine))
    assert (mine / "notes.txt").read_text() == "mine"


def test_storage_that_cannot_be_a_folder_fails_before_training(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    path = write_sweep(tmp_path / "s.yaml", "s")
    assert main(["tune", path, "--storage", str(tmp_path / "afile" / "store")]) == 2
    assert "--storage" in one_line_error(capsys) and not (tmp_path / "mlflow.db").exists()


def test_a_running_sweep_is_not_run_twice(tmp_path, monkeypatch, capsys):
    """A second `fedsweep tune` of a sweep whose driver holds its lock: one line naming that driver."""
    monkeypatch.chdir(tmp_path)
    path = write_sweep(tmp_path / "s.yaml", "s")
    storage = tmp_path / "fedsweep_runs"
    with SweepLock(storage / "s.lock", "s") as held:
        assert held.acquire() == {}
        before = listing(tmp_path)
        for flags in ([], ["--resume"], ["--restart"]):
            assert main(["tune", path, *flags]) == 2
            err = one_line_error(capsys)
            if flags != ["--resume"]:   # --resume first finds no sweep state to resume
                assert "sweep 's' is already running since " in err and f"pid {os.getpid()}" in err
        assert listing(tmp_path) == before
    assert (storage / "s.lock").read_text() == ""                  # released cleanly: no record left


def orphans(*argv0s: str) -> list[int]:
    """Processes whose command lines read ``argv0 300`` (a Ray agent's reads ``ray::DashboardAgent``),
    orphaned in one new process group, as a SIGKILLed driver leaves its Ray: the subshell that made
    them (the group's leader) has exited. Their pids, in order."""
    inner = " ".join(f'(exec -a "{a}" sleep 300 </dev/null >/dev/null 2>&1) & echo $!;' for a in argv0s)
    out = subprocess.run(["bash", "-c", f"set -m; ( {inner} ) & wait"], capture_output=True, text=True, timeout=30)
    pids = [int(x) for x in out.stdout.split()]
    time.sleep(0.3)
    return pids


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="leftover processes are found through /proc")
def test_a_stale_lock_is_taken_over_and_its_leftovers_ended(tmp_path):
    """A lock whose driver died (no flock held, its record still there) is taken over; what the dead
    driver's local Ray left (orphaned `ray::` processes of its group) is ended, and nothing else:
    not a non-Ray process of that group, not the Ray processes of another group or machine."""
    agent, plain = orphans("ray::DashboardAgent", "my-own-tool")
    (other_ray,) = orphans("ray::RuntimeEnvAgent")                   # someone else's Ray, another group
    group = os.getpgid(agent)
    assert os.getpgid(plain) == group != os.getpgid(other_ray)
    lock_path = tmp_path / "s.lock"
    dead = {"pid": 999_999_999, "pgid": group, "host": socket.gethostname(), "since": "2026-01-01T00:00:00",
            "ray_session": "/tmp/ray/session_x"}
    lock_path.write_text(json.dumps(dead))
    try:
        with SweepLock(lock_path, "s") as lock:
            stale = lock.acquire()
            assert stale == dead
            assert json.loads(lock_path.read_text())["pid"] == os.getpid()
            assert leftovers(stale) == [agent]
            assert leftovers({**stale, "host": "another-machine"}) == []
            assert end_leftovers(stale) == [agent]
            assert not alive(agent) and alive(plain) and alive(other_ray)
    finally:
        for pid in (agent, plain, other_ray):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="leftover processes are found through /proc")
def test_ray_processes_under_a_live_parent_are_not_leftovers():
    """A Ray process whose parent is a live non-Ray process of the group (a running driver) is kept."""
    driver = subprocess.Popen([sys.executable, "-c", "import subprocess, time; "
                               "subprocess.Popen(['bash', '-c', 'exec -a ray::IDLE sleep 300']); time.sleep(300)"],
                              start_new_session=True)
    try:
        time.sleep(1.0)
        assert leftovers({"pgid": driver.pid, "host": socket.gethostname()}) == []
    finally:
        os.killpg(driver.pid, 9)
        driver.wait()


def descendants(pid: int) -> set[int]:
    """Live processes whose parent chain leads to ``pid`` (zombies are not alive)."""
    parent = {child: ppid for child, ppid, _, _ in _processes()}
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="processes are found through /proc")
def test_a_local_ray_session_ends_every_process_it_started():
    """The local Ray instance of a sweep (its GCS, raylet, monitor, dashboard, agents and workers) is
    gone when the session ends, the autoscaler monitor that fedsweep ends itself first included (that
    it saves a second is measured in benchmarks/sweep.py, not here); a process this test started
    before the session is left running."""
    import ray
    import ray._private.worker as worker

    from fedsweep.sweep.cluster import ray_session
    mine = subprocess.Popen(["sleep", "300"])
    try:
        with ray_session(num_cpus=1) as session:
            assert session and os.path.isdir(session)
            started = {kind: [i.process for i in infos] for kind, infos in worker._global_node.all_processes.items()}
            assert "monitor" in started and "raylet" in started
            worker_pid = ray.get(ray.remote(lambda: os.getpid()).remote())
            assert worker_pid in descendants(os.getpid())
            assert len(descendants(os.getpid())) > len(started)
        deadline = time.monotonic() + 30
        while descendants(os.getpid()) - {mine.pid} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert descendants(os.getpid()) == {mine.pid}
        assert all(p.poll() is not None for infos in started.values() for p in infos)
    finally:
        mine.kill()
        mine.wait()


def test_two_runs_creating_one_fresh_store_at_once(tmp_path):
    """Two `fedsweep run`s that both find no store create it together: both land (the schema
    migration must not fail in one of them)."""
    raw = {**TINY["base"], "rounds": 2, "mlflow": {"experiment": "race"}}
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"}
    procs = [subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "run", str(cfg), "--quiet",
                               "--set", f"seed={s}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for s in (0, 1)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    (exp,) = [e for e in client.search_experiments() if e.name == "race"]
    assert sorted(r.data.params["seed"] for r in client.search_runs([exp.experiment_id])) == ["0", "1"]


def test_trial_runs_helper_sees_no_store_as_an_error(tmp_path):
    """(trial_runs is shared by the sweep tests: a missing experiment must not pass silently)"""
    with pytest.raises(AttributeError):
        trial_runs(f"sqlite:///{tmp_path / 'none.db'}", "nothing")


def test_two_sweeps_started_together_run_once(tmp_path):
    """Two `fedsweep tune` of one sweep started together in a fresh folder: one runs it, the other
    says it is running and exits 2 (neither dies in MLflow's schema migration, and no trial runs twice
    into one experiment)."""
    path = write_sweep(tmp_path / "twice.yaml", "twice", methods={"fedavg": {}}, grid={"local.lr": [0.1, 0.2]},
                       base={**TINY["base"], "rounds": 20})
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    logs = [(tmp_path / f"out{i}.log", tmp_path / f"err{i}.log") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "fedsweep.cli", "tune", path], cwd=tmp_path, env=env,
                              stdout=open(out, "w"), stderr=open(err, "w")) for out, err in logs]
    results = [(p.wait(timeout=400), out.read_text(), err.read_text()) for p, (out, err) in zip(procs, logs)]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    (refused,) = [err.strip() for code, _, err in results if code == 2]
    assert len(refused.splitlines()) == 1 and "sweep 'twice' is already running since" in refused
    client, runs = trial_runs(env["MLFLOW_TRACKING_URI"], "twice")
    assert sorted(r.data.params["local.lr"] for r in runs) == ["0.1", "0.2"]
    exp = client.get_experiment_by_name("twice")
    parents = client.search_runs([exp.experiment_id], filter_string="tags.`fedsweep.role` = 'sweep'")
    assert len(parents) == 1
