"""Environment faults: a HOME that cannot be written, Ray's temporary folder in the way, a report's
folder that cannot be written or a disk that fills while it is. Each is one line (exit 2) or works.

Real unwritable places: a file where a folder must be (any user), and for a read-only folder or a full
disk, as root, a mount namespace of the command's own (`unshare`: a read-only bind mount, a tiny tmpfs),
since permissions do not stop root; as another user, a folder without write permission."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest
import yaml

from conftest import tiny_raw
from fedsweep.cli import main
from fedsweep.config.schema import ConfigError
from test_report import EXPERIMENT, SWEEP, _build_store
from test_tune import write_sweep

pytestmark = pytest.mark.usefixtures("fresh_home")

ROOT = os.geteuid() == 0


@cache
def namespace_problem() -> str | None:
    """Why a command cannot get a mount namespace of its own here (None if it can)."""
    if not ROOT or shutil.which("unshare") is None:
        return "needs root and `unshare`"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                           capture_output=True, text=True)
    return f"cannot make a mount namespace here: {probe.stderr.strip()[:200]}" if probe.returncode else None


def fedsweep(args: list[str], cwd: Path, *, read_only: tuple[Path, ...] = (), tiny_disk: Path | None = None,
             **env) -> subprocess.CompletedProcess:
    """``fedsweep ARGS`` in ``cwd`` where each folder of ``read_only`` cannot be written and
    ``tiny_disk`` (if given) is a full disk of 8 KB."""
    command = [sys.executable, "-m", "fedsweep.cli", *args]
    inherited = {k: v for k, v in os.environ.items() if k != "MPLCONFIGDIR"}   # fedsweep's own choice is tested
    full_env = {**inherited, "PYTHONUNBUFFERED": "1", **env}
    if not ROOT:
        assert tiny_disk is None, "a full disk needs root"
        with unwritable(read_only):
            return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)
    mounts = [f"mount --bind {shlex.quote(str(p))} {shlex.quote(str(p))} && "
              f"mount -o remount,bind,ro {shlex.quote(str(p))}" for p in read_only]
    if tiny_disk is not None:
        mounts.append(f"mount -t tmpfs -o size=8k tmpfs {shlex.quote(str(tiny_disk))}")
    script = " && ".join([*mounts, 'exec "$@"'])
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *command],
                          cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)


@contextmanager
def unwritable(folders):
    modes = {p: p.stat().st_mode for p in folders}
    for p in folders:
        p.chmod(0o555)
    try:
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def one_line(proc: subprocess.CompletedProcess) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], err[-2000:])
    assert len(err.splitlines()) == 1 and err.startswith("fedsweep: error: "), err
    return err


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def report_sweep(folder: Path) -> str:
    """A sweep file whose runs are test_report's hand-made sweep, in ``folder``'s MLflow store."""
    (folder / "s.yaml").write_text(yaml.safe_dump({"name": SWEEP, "base": {"rounds": 2},
                                                   "mlflow": {"experiment": EXPERIMENT}}))
    return str(folder / "s.yaml")


# ----- Ray's folders (fedsweep tune) --------------------------------------------------------------

def test_a_home_where_ray_cannot_write_its_token_is_refused_before_anything(tmp_path, monkeypatch, capsys):
    """A local Ray instance writes a new token to ~/.ray/auth_token when none is found: HOME a regular
    file stops it with a traceback. Refused before the storage, the store or Ray."""
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "unused"))   # else set for the rest of this process
    path = write_sweep(tmp_path / "s.yaml", "s")
    before = listing(tmp_path)
    assert main(["tune", path]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"fedsweep: error: HOME {home}: a local Ray instance writes a new token to {home}/.ray/auth_token, "
                   f"but {home} is a file, not a folder; set HOME to a writable folder, or RAY_AUTH_TOKEN to a token "
                   "of your own (e.g. export RAY_AUTH_TOKEN=$(openssl rand -hex 32))")
    assert listing(tmp_path) == before            # no lock, no storage, no MLflow store


def test_a_token_or_no_token_mode_needs_no_writable_home(tmp_path, monkeypatch):
    """Ray writes nothing under HOME when it finds a token or runs without token authentication."""
    from fedsweep.sweep.cluster import check_local_ray
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(ConfigError, match="^HOME "):
        check_local_ray()
    monkeypatch.setenv("RAY_AUTH_TOKEN", "0" * 64)
    check_local_ray()
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    check_local_ray()


def test_ray_temporary_folder_in_the_way_is_refused_and_rays_own_failure_is_one_line(tmp_path, monkeypatch, capsys):
    """RAY_TMPDIR/ray a file: refused before anything (naming RAY_TMPDIR); and where ray.init fails all
    the same, its error is one line naming the folder, not Ray's traceback."""
    from fedsweep.sweep.cluster import ray_session
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rt").mkdir()
    (tmp_path / "rt" / "ray").write_text("a file where Ray's folder goes")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "rt"))
    monkeypatch.setenv("RAY_AUTH_TOKEN", "0" * 64)
    path = write_sweep(tmp_path / "s.yaml", "s")
    before = listing(tmp_path)
    assert main(["tune", path]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"fedsweep: error: RAY_TMPDIR {tmp_path}/rt: a local Ray instance keeps its logs and sockets "
                   f"in {tmp_path}/rt/ray, but {tmp_path}/rt/ray is a file, not a folder; set RAY_TMPDIR to a "
                   "writable folder (Ray uses RAY_TMPDIR/ray)")
    assert listing(tmp_path) == before
    folder = re.escape(f"{tmp_path}/rt/ray")
    with pytest.raises(ConfigError, match=rf"^Ray's temporary folder {folder}: a local Ray instance could not start "
                                          rf"\(File exists: {folder}; \d+ MB free there\); set RAY_TMPDIR"):
        with ray_session():
            pass


@pytest.mark.skipif(namespace_problem() is not None, reason=str(namespace_problem()))
def test_a_full_disk_under_ray_temporary_folder_is_refused(tmp_path):
    """Ray on a full disk waits 30 s for its raylet, then fails with a traceback that does not say why."""
    (tmp_path / "rt").mkdir()
    path = write_sweep(tmp_path / "s.yaml", "s")
    err = one_line(fedsweep(["tune", path], tmp_path, tiny_disk=tmp_path / "rt", RAY_TMPDIR=str(tmp_path / "rt"),
                            RAY_AUTH_TOKEN="0" * 64))
    assert f"RAY_TMPDIR {tmp_path}/rt: a local Ray instance keeps its logs and sockets" in err
    assert "MB free (at least 50 MB needed); free space there, or set RAY_TMPDIR to a folder on another disk" in err


# ----- a read-only HOME: run, report, tune -------------------------------------------------------

def read_only_home(tmp_path: Path) -> tuple[Path, dict]:
    """A HOME folder that cannot be written, and the environment of commands run with it."""
    if ROOT and namespace_problem():
        pytest.skip(namespace_problem())
    home = tmp_path / "home"
    home.mkdir()
    return home, {"HOME": str(home), "MLFLOW_TRACKING_URI": _build_store(tmp_path, with_target=True)}


def test_run_and_report_with_a_read_only_home(tmp_path):
    """Both work, without matplotlib's two warning lines about its folder under HOME."""
    home, env = read_only_home(tmp_path)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tiny_raw(mlflow={"enabled": True, "experiment": "ro"})))
    ran = fedsweep(["run", "cfg.yaml", "--quiet"], tmp_path, read_only=(home,), **env)
    assert ran.returncode == 0 and "status                             finished" in ran.stdout, ran.stderr[-2000:]
    reported = fedsweep(["report", report_sweep(tmp_path), "--out", "rep"], tmp_path, read_only=(home,), **env)
    assert reported.returncode == 0 and (tmp_path / "rep" / "accuracy_curves.png").stat().st_size > 10_000
    for proc in (ran, reported):
        assert proc.stderr.strip() == "", proc.stderr[-2000:]     # no "Matplotlib created a temporary cache ..."
    assert listing(home) == []


def test_tune_with_a_read_only_home_says_what_ray_needs_and_the_advice_works(tmp_path):
    home, env = read_only_home(tmp_path)
    path = write_sweep(tmp_path / "t.yaml", "t")
    err = one_line(fedsweep(["tune", path], tmp_path, read_only=(home,), **env))
    assert f"HOME {home}: a local Ray instance writes a new token to {home}/.ray/auth_token, but folder {home} is " \
           "not writable; set HOME to a writable folder, or RAY_AUTH_TOKEN" in err
    swept = fedsweep(["tune", path], tmp_path, read_only=(home,), RAY_AUTH_TOKEN="0" * 64, **env)
    assert swept.returncode == 0 and "sweep done: 2 diverged, 2 finished" in swept.stdout, swept.stderr[-2000:]
    assert listing(home) == []


# ----- fedsweep report --out ----------------------------------------------------------------------

@pytest.mark.parametrize("out,problem", [("afile", "{t}/afile is a file, not a folder"),
                                         ("afile/sub", "{t}/afile is a file, not a folder")])
def test_report_out_that_cannot_be_a_folder_is_refused_before_mlflow(tmp_path, monkeypatch, capsys, out, problem):
    """Checked before MLflow is read: the store here does not even exist, and is not named."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'none' / 'mlflow.db'}")
    (tmp_path / "afile").write_text("x")
    assert main(["report", report_sweep(tmp_path), "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"fedsweep: error: --out {out}: {problem.format(t=tmp_path)}; give --out a folder that can be written"
    assert listing(tmp_path) == ["afile", "s.yaml"]


def test_report_out_in_a_read_only_folder_is_refused(tmp_path):
    if ROOT and namespace_problem():
        pytest.skip(namespace_problem())
    (tmp_path / "ro").mkdir()
    env = {"MLFLOW_TRACKING_URI": _build_store(tmp_path, with_target=True)}
    err = one_line(fedsweep(["report", report_sweep(tmp_path), "--out", "ro/rep"], tmp_path,
                            read_only=(tmp_path / "ro",), **env))
    assert err == (f"fedsweep: error: --out ro/rep: folder {tmp_path}/ro is not writable; give --out a folder that "
                   "can be written")
    home = tmp_path / "work"              # the default, reports/<name>, under a read-only working folder
    home.mkdir()
    err = one_line(fedsweep(["report", report_sweep(tmp_path)], home, read_only=(home,), **env))
    assert err.startswith(f"fedsweep: error: --out (default) reports/{SWEEP}: folder {home} is not writable")


@pytest.mark.skipif(namespace_problem() is not None, reason=str(namespace_problem()))
def test_a_report_that_fills_its_disk_says_so(tmp_path):
    (tmp_path / "disk").mkdir()
    env = {"MLFLOW_TRACKING_URI": _build_store(tmp_path, with_target=True)}
    err = one_line(fedsweep(["report", report_sweep(tmp_path), "--out", "disk/rep"], tmp_path,
                            tiny_disk=tmp_path / "disk", **env))
    assert err == ("fedsweep: error: --out disk/rep: its disk is full (No space left on device), so the report there "
                   "is incomplete; free space there, or give --out a folder on another disk")
