"""Packed trials (fedsweep/sweep/pack.py): each member ends exactly where its unpacked run ends."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny_raw, write_mnist
from fedsweep.config.schema import ConfigError, build_config
from fedsweep.sweep.pack import PackedModule, train_packed
from fedsweep.sweep.units import pack_key
from fedsweep.config.registry import available, get_algorithm_class
from fedsweep.runs.run import train


def strip(history):
    return [{k: v for k, v in h.items() if k != "round/seconds"} for h in history]


def assert_members_match(cfgs, packed, atol=1e-5):
    """Every member's model and metric history equal its unpacked run's within ``atol``."""
    for cfg, member in zip(cfgs, packed.members):
        solo = train(cfg, progress=False)
        torch.testing.assert_close(member.w.detach(), solo.w.detach(), rtol=0, atol=atol)
        assert len(member.history) == len(solo.history)
        for a, b in zip(strip(solo.history), strip(member.history)):
            assert a.keys() == b.keys()
            for k in a:
                assert b[k] == pytest.approx(a[k], abs=atol, nan_ok=True), (cfg.algorithm.name, k, a["round"])
        assert member.client_log == solo.client_log


def family_raw(name: str, **over) -> dict:
    raw = tiny_raw(algorithm={"name": name}, **over)
    if get_algorithm_class(name).local_buffers:     # FedBN: a BatchNorm model, on the loop engine
        raw["model"] = {"name": "mlp", "options": {"hidden": 16, "batchnorm": True}}
    if get_algorithm_class(name).needs_server_data:
        raw["server_data"] = {"fraction": 0.05, "steps": 2, "lr": 0.1, "batch_size": 16}
    return raw


@pytest.mark.parametrize("name", available())
def test_every_algorithm_packed_equals_unpacked(name):
    """Seeds, η_l, η_g and ρ differ inside one pack: two client groups (two η_l), three plans."""
    cfgs = [build_config(family_raw(name), [f"seed={s}", f"local.lr={lr}", f"server.lr={slr}",
                                            f"heterogeneity.rho={rho}"])
            for s, lr, slr, rho in [(3, 0.1, 1.0, 0.5), (4, 0.1, 0.5, 0.25), (3, 0.05, 1.0, 0.75)]]
    assert_members_match(cfgs, train_packed(cfgs))


def test_members_with_different_partitions_batches_steps_and_units():
    """What differs per member only in shapes: B (padded), E and unit (masked), the partition and N."""
    raws = [tiny_raw(), tiny_raw(local={"steps": 2, "batch_size": 8, "lr": 0.1}),
            tiny_raw(local={"unit": "epochs", "steps": 2, "batch_size": 3, "lr": 0.1}),
            tiny_raw(data={"name": "digits", "num_clients": 12, "partition": {"kind": "dirichlet", "alpha": 0.3}}),
            tiny_raw(algorithm={"name": "fedlga"}, heterogeneity={"kind": "profiles", "speeds": 1.0})]
    cfgs = [build_config(r) for r in raws]
    for max_rows in (None, 8):                           # one engine call per group, or cut in chunks
        packed = train_packed(cfgs, max_rows=max_rows)
        assert_members_match(cfgs, packed)
    assert len(set(packed.offsets)) == 1                 # digits kept once, whatever the partition


def test_a_group_that_runs_out_of_device_memory_is_split(monkeypatch, capsys):
    """On a GPU a group's rows are not capped, and a large model's pack can run out of memory: the
    group is split and later groups capped at half its rows, with the members' results unchanged.
    No GPU here, so a group's engine call of more than 10 rows raises torch's OutOfMemoryError, as a
    device that holds 10 would (the error is torch's own; the training around it is real)."""
    train_group = PackedModule._train_group
    calls = []

    def small_device(self, idx, works, lr):
        rows = sum(w.plan.num_sampled for w in works)
        calls.append(rows)
        if rows > 10:
            raise torch.OutOfMemoryError("CUDA out of memory (a 10-row device)")
        return train_group(self, idx, works, lr)
    monkeypatch.setattr(PackedModule, "_train_group", small_device)
    cfgs = [build_config(tiny_raw(rounds=3), [f"seed={s}"]) for s in (3, 4, 5, 6)]   # 4 rows each
    packed = train_packed(cfgs)                          # max_rows None: one call of 16 rows at first
    assert packed.max_rows == 8 and calls == [16] + [8] * 6   # 3 rounds of two groups of 2 members
    assert capsys.readouterr().err.count("ran out of device memory") == 1
    monkeypatch.setattr(PackedModule, "_train_group", train_group)
    assert_members_match(cfgs, packed)


def test_members_of_a_file_backed_dataset_share_one_copy_of_it(tmp_path):
    """A pack of MNIST members (each loads its own data, as a sweep's pack does) holds the dataset
    once: every member's tensors and the pack's concatenation are one tensor (a pack of 36 CIFAR-10
    members held 36 copies, 27 GB, and one more for the concatenation), and each member still ends
    as its unpacked run does."""
    write_mnist(tmp_path)
    data = {"name": "mnist", "root": str(tmp_path), "num_clients": 4, "partition": {"kind": "iid"}}
    cfgs = [build_config(tiny_raw(data=data, clients_per_round=2, local={"steps": 2, "batch_size": 3, "lr": 0.1}),
                         [f"seed={s}"]) for s in (3, 4, 5)]
    packed = train_packed(cfgs)
    assert all(m.data.x_train is packed.x and m.data.y_train is packed.y for m in packed.members)
    assert len({id(m.data.x_test) for m in packed.members}) == 1 and packed.offsets == [0, 0, 0]
    assert_members_match(cfgs, packed)


def test_mnist_5k_members_share_one_copy_and_end_as_unpacked():
    """The real-image dataset packs as digits does: one copy of its images for the pack, and each
    member where its unpacked run ends."""
    data = {"name": "mnist_5k", "num_clients": 10, "partition": {"kind": "classes", "classes_per_client": 2}}
    cfgs = [build_config(tiny_raw(data=data, rounds=2, clients_per_round=3), [f"seed={s}"]) for s in (3, 4)]
    packed = train_packed(cfgs)
    assert all(m.data.x_train is packed.x for m in packed.members) and packed.offsets == [0, 0]
    assert_members_match(cfgs, packed)


def test_loop_engine_members_run_their_own_engines():
    cfgs = [build_config({**tiny_raw(), "engine": "loop"}, [f"seed={s}"]) for s in (3, 4)]
    assert_members_match(cfgs, train_packed(cfgs))


def test_a_diverged_member_stops_alone():
    cfgs = [build_config(tiny_raw(rounds=4), ["local.lr=1e30"]), build_config(tiny_raw(rounds=4))]
    packed = train_packed(cfgs)
    bad, good = packed.members
    assert bad.diverged and len(bad.history) == 1 and not math.isfinite(bad.history[-1]["train/loss"])
    assert not good.diverged and len(good.history) == 4
    assert_members_match(cfgs[1:], type("P", (), {"members": [good]}))


def test_resume_is_exact(tmp_path):
    """A pack stopped after round 2 and resumed from its checkpoint ends as the uninterrupted pack,
    and a member diverged before the checkpoint stays stopped."""
    import lightning as L
    cfgs = [build_config(tiny_raw(rounds=5, algorithm={"name": name}), [f"seed={s}"])
            for name, s in [("scaffold", 3), ("fedlga", 4), ("fedavg", 5)]]
    cfgs.append(build_config(tiny_raw(rounds=5), ["local.lr=1e30"]))
    full = train_packed(cfgs)

    class Stop(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if module.rounds_done == 2:
                trainer.save_checkpoint(tmp_path / "pack.ckpt")
                trainer.should_stop = True
    train_packed(cfgs, callbacks=[Stop()])
    resumed = train_packed(cfgs, resume=tmp_path / "pack.ckpt")
    for a, b in zip(full.members, resumed.members):
        torch.testing.assert_close(a.w, b.w, rtol=0, atol=0, equal_nan=True)
        assert str(strip(a.history)) == str(strip(b.history))   # str: NaN == NaN
        assert a.diverged == b.diverged
    assert resumed.members[-1].diverged


def test_a_pack_trains_at_its_matmul_precision_and_puts_back_the_one_before():
    import lightning as L
    seen = []

    class Look(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append(torch.get_float32_matmul_precision())

    cfgs = [build_config({**tiny_raw(rounds=2), "matmul_precision": "high"}, [f"seed={s}"]) for s in (3, 4)]
    train_packed(cfgs, callbacks=[Look()])
    assert seen == ["high"] * 2 and torch.get_float32_matmul_precision() == "highest"


def test_configs_that_cannot_share_a_pack_are_refused():
    a, b = build_config(tiny_raw()), build_config(tiny_raw(model={"name": "mlp", "options": {"hidden": 32}}))
    assert pack_key(a) != pack_key(b)
    assert pack_key(a) == pack_key(build_config(tiny_raw(seed=9, data={"name": "digits", "num_clients": 5})))
    assert pack_key(a) != pack_key(build_config({**tiny_raw(), "matmul_precision": "high"}))
    with pytest.raises(ConfigError, match="pack: configs in one pack must share model"):
        PackedModule([a, b])
