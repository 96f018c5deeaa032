"""A sweep's storage (``fedsweep tune --storage``): where Ray Tune keeps its experiment state and
each trial its checkpoint, so that a retried or resumed trial continues from it on whatever node it
lands, and the driver reads a stopped trial's records from it.

It is a folder, or a URI that pyarrow opens as Ray Tune's own storage does (``s3://bucket/path``,
``gs://bucket/path``, ``hdfs://...``; pyarrow's options go in the query, e.g.
``s3://bucket/path?endpoint_override=127.0.0.1:9000&scheme=http``). On a cluster every node that
runs trials must reach it: a folder mounted at the same path on each node (NFS), or the URI
(:func:`check_nodes_reach` checks before any trial starts). Nothing a run's MLflow entry needs is
read from it: a trial's summary and artifacts travel with its final report.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

from fedsweep.util.errors import ConfigError

# A sweep's state, in its folder of the storage: written by the driver before any trial starts
# (fedsweep.sweep.tune), read by each trial to know that its node reaches the storage.
STATE_FILE = "fedsweep_sweep.json"
# The trials' resolved configs, written when a sweep starts: Tune's grid holds only their indices
# (a grid of thousands of full configs costs Tune quadratic time to expand), and `--resume` runs
# exactly the trials the sweep started with (a sweep file edited since is refused, naming the edit).
TRIALS_FILE = "fedsweep_trials.json"


def is_uri(location: str | os.PathLike) -> bool:
    return "://" in str(location)


class Storage:
    """A folder or a pyarrow URI, and the few operations a sweep needs on it; paths are relative
    to its root (``child`` roots one deeper). Picklable: Ray passes it to the trials, and pyarrow's
    file systems carry their options, not credentials found in the environment (each node finds its own)."""

    def __init__(self, location: str | os.PathLike):
        self.location = str(location)
        if is_uri(self.location):
            import pyarrow.fs
            try:
                self.fs, self.root = pyarrow.fs.FileSystem.from_uri(self.location)
            except Exception as e:  # noqa: BLE001 - pyarrow's errors are ArrowInvalid, OSError, ValueError
                raise ConfigError(f"--storage {self.location}: pyarrow cannot open it ({_first_line(e)}); "
                                  "give a folder, or a URI such as s3://bucket/path") from None
            self.scheme = self.location.split("://", 1)[0]
        else:
            self.fs, self.root, self.scheme = None, os.path.abspath(os.path.expanduser(self.location)), ""

    @property
    def local(self) -> bool:
        """A folder on this machine's file system (perhaps a network mount)."""
        return self.fs is None

    def child(self, name: str) -> Storage:
        other = object.__new__(Storage)
        other.__dict__.update(self.__dict__, root=self._path(name))
        return other

    def _path(self, rel: str = "") -> str:
        if not rel:
            return self.root
        return os.path.join(self.root, rel) if self.local else f"{self.root}/{rel}"

    def where(self, rel: str = "") -> str:
        """The location for messages: a path, or scheme://path (without the URI's query)."""
        return self._path(rel) if self.local else f"{self.scheme}://{self._path(rel)}"

    def tune_args(self) -> dict:
        """``RunConfig``'s storage arguments for a Tune experiment under this root."""
        return {"storage_path": self.root} if self.local else {"storage_path": self.root,
                                                                "storage_filesystem": self.fs}

    # -- reading ------------------------------------------------------------------------------

    def exists(self, rel: str = "") -> bool:
        if self.local:
            return os.path.exists(self._path(rel))
        import pyarrow.fs
        return self.fs.get_file_info(self._path(rel)).type != pyarrow.fs.FileType.NotFound

    def is_empty(self, rel: str = "") -> bool:
        """No such folder, or nothing in it."""
        if self.local:
            path = Path(self._path(rel))
            return not path.exists() or (path.is_dir() and not any(path.iterdir()))
        import pyarrow.fs
        return not self.fs.get_file_info(pyarrow.fs.FileSelector(self._path(rel), allow_not_found=True))

    def names(self, rel: str = "") -> list[str]:
        """The names of the files and folders in folder ``rel`` ([] if there is none)."""
        if self.local:
            path = Path(self._path(rel))
            return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        import pyarrow.fs
        infos = self.fs.get_file_info(pyarrow.fs.FileSelector(self._path(rel), allow_not_found=True))
        return sorted(info.base_name for info in infos)

    def free_bytes(self) -> int | None:
        """Free space where the storage is, for a folder (None for a URI, or a folder not there)."""
        if not self.local:
            return None
        path = Path(self.root)
        while not path.exists() and path != path.parent:
            path = path.parent
        try:
            return shutil.disk_usage(path).free
        except OSError:
            return None

    def read_bytes(self, rel: str) -> bytes | None:
        """The file's bytes; None if there is no such file."""
        if self.local:
            try:
                return Path(self._path(rel)).read_bytes()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return None
        if not self.exists(rel):
            return None
        with self.fs.open_input_stream(self._path(rel)) as f:
            return f.read()

    def read_text(self, rel: str) -> str | None:
        data = self.read_bytes(rel)
        return None if data is None else data.decode()

    @contextmanager
    def reading(self, rel: str):
        """A local path holding the file while the block runs (a downloaded copy for a URI), or
        None if there is no such file."""
        if self.local:
            path = Path(self._path(rel))
            yield path if path.is_file() else None
            return
        data = self.read_bytes(rel)
        if data is None:
            yield None
            return
        with tempfile.TemporaryDirectory(prefix="fedsweep-") as tmp:
            path = Path(tmp) / os.path.basename(rel)
            path.write_bytes(data)
            yield path

    # -- writing ------------------------------------------------------------------------------

    @contextmanager
    def writing(self, rel: str):
        """A local path to write the file to; it replaces ``rel`` whole when the block ends well
        (a rename in the folder; for a URI one upload, which object stores make visible at once or
        not at all), and nothing is replaced if the block raises."""
        if self.local:
            dest = Path(self._path(rel))
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".tmp")
            try:
                yield tmp
                tmp.replace(dest)
            finally:
                tmp.unlink(missing_ok=True)
            return
        with tempfile.TemporaryDirectory(prefix="fedsweep-") as tmp:
            path = Path(tmp) / os.path.basename(rel)
            yield path
            self.write_bytes(rel, path.read_bytes())

    def write_bytes(self, rel: str, data: bytes) -> None:
        if self.local:
            with self.writing(rel) as tmp:
                tmp.write_bytes(data)
            return
        with self.fs.open_output_stream(self._path(rel)) as f:
            f.write(data)

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode())

    def delete(self, rel: str = "") -> None:
        """The file or folder (with what is in it) at ``rel``; nothing if there is none."""
        path = self._path(rel)
        if self.local:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                Path(path).unlink(missing_ok=True)
            return
        import pyarrow.fs
        kind = self.fs.get_file_info(path).type
        if kind == pyarrow.fs.FileType.Directory:
            self.fs.delete_dir(path)
        elif kind == pyarrow.fs.FileType.File:
            self.fs.delete_file(path)

    def check_writable(self) -> None:
        """One line naming ``--storage`` if a file cannot be written there and read back (for a
        URI: no such bucket, no credentials, no server). Writes nothing that stays; creates a folder's
        missing parents."""
        if self.local:
            from fedsweep.runs.paths import check_writable_dir
            check_writable_dir(self.root, "--storage")
            return
        probe = f".fedsweep-probe-{uuid.uuid4().hex}"
        try:
            self.write_bytes(probe, b"fedsweep")
            ok = self.read_bytes(probe) == b"fedsweep"
            self.delete(probe)
        except Exception as e:  # noqa: BLE001 - one line for the user, whatever pyarrow raised
            raise ConfigError(f"--storage {self.location}: cannot write there ({_first_line(e)})") from None
        if not ok:
            raise ConfigError(f"--storage {self.location}: a file written there could not be read back")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def read_marker(store: Storage, rel: str) -> str:
    """What a node finds at ``rel`` of ``store``: the text, or why there is none. Runs as a Ray task
    on each node (:func:`check_nodes_reach`)."""
    try:
        text = store.read_text(rel)
    except Exception as e:  # noqa: BLE001 - reported to the driver, which words the refusal
        return f"cannot read it: {_first_line(e)}"
    return "no such file there" if text is None else text


def check_nodes_reach(store: Storage, nodes: list[dict], timeout: float = 60.0) -> None:
    """Each of ``nodes`` (``ray.nodes()`` entries) reads a file this driver writes to ``store``,
    in a task pinned to it; one line naming the first node that cannot (and how many more), and
    what to do, as a :class:`ConfigError`. The file is removed either way."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    if not nodes:
        return
    token = uuid.uuid4().hex
    marker = f".fedsweep-reach-{token}"
    store.write_text(marker, token)
    try:
        task = ray.remote(num_cpus=0, max_retries=0)(read_marker)
        asked = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                 .remote(store, marker): n for n in nodes}
        ready, late = ray.wait(list(asked), num_returns=len(asked), timeout=timeout)
        cannot = []
        for ref in ready:
            try:
                found = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - the node's worker died or could not start
                found = f"its check failed ({_first_line(e)})"
            if found != token:
                cannot.append((asked[ref], found[:200]))
        cannot += [(asked[ref], f"no answer within {timeout:g} s") for ref in late]
    finally:
        store.delete(marker)
    if cannot:
        node, why = cannot[0]
        more = f" (and {len(cannot) - 1} more of the {len(nodes)} nodes)" if len(cannot) > 1 else ""
        name = node.get("NodeManagerAddress", "?")
        host = node.get("NodeManagerHostname")
        label = f"{name} ({host})" if host and host != name else name
        how = ("mount that folder at the same path on every node (NFS), or give --storage a URI every node "
               "reaches (s3://bucket/path, gs://...)") if store.local else \
            "give every node access to it (credentials, network), or another --storage every node reaches"
        raise ConfigError(f"--storage {store.location}: node {label}{more} cannot read what this driver writes "
                          f"there ({why}), so its trials could not keep checkpoints every node reads; {how}")


#: Ray Tune's record of a Tune run, a pickle: reading it runs whatever code it names.
TUNER = "tuner.pkl"
#: The state file's key for each Tune run's fingerprint (sha256 of its tuner.pkl), by its folder.
SEALS = "tuner_sha256"


def _folder(store: Storage, where: Storage) -> str:
    return where.root[len(store.root):].strip("/")


def seal(store: Storage, where: Storage, state: dict) -> None:
    """Keep the fingerprint of the tuner.pkl Ray Tune has just written for a new Tune run (in ``where``:
    ``store``, or a confirm look's folder) in the sweep's state file: ``--resume`` lets Ray read no other."""
    import hashlib
    data = where.read_bytes(TUNER) or b""
    state.setdefault(SEALS, {})[_folder(store, where)] = hashlib.sha256(data).hexdigest()
    store.write_text(STATE_FILE, json.dumps(state))


def seal_problem(store: Storage, where: Storage) -> str | None:
    """Why the tuner.pkl in ``where`` must not be unpickled (None if it is the one this sweep's driver
    wrote, by its fingerprint in the state file): damaged, replaced, or never fingerprinted."""
    import hashlib
    state = json.loads(store.read_text(STATE_FILE) or "{}")
    want = (state.get(SEALS) or {}).get(_folder(store, where))
    data = where.read_bytes(TUNER) or b""
    if want is None:
        why = "fedsweep kept no fingerprint of it (a sweep started by an older fedsweep, or a file put there)"
    elif hashlib.sha256(data).hexdigest() != want:
        why = "it is not the one this sweep's driver wrote (damaged or replaced: its fingerprint differs)"
    else:
        return None
    return f"Ray Tune's record {where.where(TUNER)} is not read: {why}, and reading a pickle runs the code it names"
