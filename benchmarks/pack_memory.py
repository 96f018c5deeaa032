"""What a pack of CIFAR-10 members costs to set up: seconds and the process's peak memory.

    python benchmarks/pack_memory.py --pack 8

Writes CIFAR-10 files of the real size (50,000 + 10,000 images of random pixels) in torchvision's
on-disk format under ``--root`` (once; the real files cannot be downloaded here, and their content
does not matter for this), then trains ``--pack`` members of one config (seeds 0..P−1, an MLP, one
round of 2 clients) packed, in this process, as a sweep's pack does: each member loads its own data.
Reported: the wall time of ``train_packed`` and the peak resident memory (``ru_maxrss``). Run it in
a fresh process per setting: the peak is the process's.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def write_cifar10(root: Path, per_batch: int = 10000) -> None:
    """Random CIFAR-10 batches (5 + 1 of ``per_batch`` images) in torchvision's format under ``root``;
    torchvision's md5 list is set to theirs (it checks every file against it)."""
    import torchvision.datasets as tvd
    cls = tvd.CIFAR10
    folder = root / cls.base_folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def put(name: str, obj) -> str:
        path = folder / name
        if not path.exists():
            with open(path, "wb") as f:
                pickle.dump(obj, f)
        return hashlib.md5(path.read_bytes()).hexdigest()
    train = [[f"data_batch_{i}", put(f"data_batch_{i}", {
        "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
        "labels": rng.integers(0, 10, per_batch).tolist()})] for i in range(1, 6)]
    test = [["test_batch", put("test_batch", {"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                                              "labels": rng.integers(0, 10, per_batch).tolist()})]]
    meta = put(cls.meta["filename"], {"label_names": [f"c{i}" for i in range(10)]})
    cls.train_list, cls.test_list, cls.meta = train, test, {**cls.meta, "md5": meta}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", type=int, default=8)
    ap.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "fedsweep-cifar10-random"),
                    help="where the files are written (kept for the next run)")
    ap.add_argument("--images-per-batch", type=int, default=10000, help="10000: CIFAR-10's size (the default)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    write_cifar10(Path(args.root), args.images_per_batch)
    from fedsweep.config.schema import build_config
    from fedsweep.sweep.pack import train_packed
    cfgs = [build_config({
        "seed": s, "rounds": 1, "clients_per_round": 2, "device": "cpu",
        "data": {"name": "cifar10", "root": args.root, "num_clients": 100, "partition": {"kind": "iid"}},
        "model": {"name": "mlp", "options": {"hidden": 16}}, "local": {"steps": 1, "batch_size": 4, "lr": 0.1},
        "eval": {"every": 1, "batch_size": 2000}, "mlflow": {"enabled": False}}) for s in range(args.pack)]
    t0 = time.perf_counter()
    train_packed(cfgs)
    out = {"pack": args.pack, "seconds": time.perf_counter() - t0,
           "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}
    print(f"a pack of {args.pack} CIFAR-10 members, 1 round: {out['seconds']:.1f} s, peak memory "
          f"{out['peak_rss_gb']:.2f} GB", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
