"""`data.name: leaf`: LEAF's JSON files (fedsweep/data/leaf.py) as one client a user, written here in
LEAF's own layout and format, through the split, a run, and a sweep with its report."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import yaml

from conftest import tiny_raw
from fedsweep.cli import main
from fedsweep.config.schema import ConfigError, DataConfig, ServerDataConfig, build_config
from fedsweep.data import load_federated, split_federated
from fedsweep.data.sources import load_source
from fedsweep.runs.run import train
from fedsweep.sim.rng import np_rng
from test_tune import trial_runs

# user -> (training samples, test samples), spread over two files each split in an order that is not
# the users' sorted order; w11 has no test sample (LEAF's -t sample can leave a small user none).
USERS = {"w07": (5, 2), "w02": (4, 3), "w11": (6, 0), "w00": (7, 2), "w05": (3, 1), "w09": (4, 2)}
SORTED = sorted(USERS)
NUM_CLASSES = 4        # labels 0..2 in training, one test label 3: classes = max over both + 1


def samples(user: str, n: int, dim: int, split: str) -> tuple[list, list]:
    """x: [user number, sample number, 0 train / 1 test, ...]; y: (user number + sample number) % 3."""
    number = int(user[1:])
    x = [[float(number), float(j), float(split == "test")] + [0.5] * (dim - 3) for j in range(n)]
    y = [(number + j) % 3 for j in range(n)]
    if split == "test" and user == "w00":
        y[0] = 3
    return x, y


def write_leaf(dataset, dim: int = 5, users: dict = USERS) -> str:
    """LEAF's layout: ``dataset/data/{train,test}/all_data_<f>_niid_0_keep_0_<split>_9.json``, users
    alternating over two files; returns the ``data/`` folder."""
    folder = dataset / "data"
    names = list(users)
    for split in ("train", "test"):
        (folder / split).mkdir(parents=True)
        for f in range(2):
            mine = names[f::2]
            doc = {"users": mine, "num_samples": [], "hierarchies": [], "user_data": {}}
            for u in mine:
                x, y = samples(u, users[u][split == "test"], dim, split)
                doc["num_samples"].append(len(x))
                doc["user_data"][u] = {"x": x, "y": y}
            (folder / split / f"all_data_{f}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))
    return str(folder)


def edit(folder, split: str, f: int, change) -> None:
    """Rewrite file ``f`` of ``split`` with ``change(doc)`` applied."""
    path = os.path.join(folder, split, f"all_data_{f}_niid_0_keep_0_{split}_9.json")
    with open(path) as fh:
        doc = json.load(fh)
    change(doc)
    with open(path, "w") as fh:
        json.dump(doc, fh)


def leaf(root, **over) -> DataConfig:
    return DataConfig(name="leaf", root=str(root), num_clients=over.pop("num_clients", len(USERS)), **over)


@pytest.fixture
def folder(tmp_path):
    return write_leaf(tmp_path / "toy")


# ---- the split -------------------------------------------------------------------------------------

def test_one_client_a_user_in_sorted_order_and_the_test_set_their_union(folder):
    s = split_federated(leaf(folder), seed=0)
    src = s.source
    assert s.scheme == "natural split" and s.pool is None and src.num_classes == NUM_CLASSES
    assert src.x_train.shape == (sum(n for n, _ in USERS.values()), 5) and src.x_train.dtype == np.float32
    assert src.y_train.dtype == np.int64 and src.x_test.shape == (sum(t for _, t in USERS.values()), 5)
    assert len(s.parts) == len(USERS)
    for user, part in zip(SORTED, s.parts):                      # client i is the i-th user by id
        x, y = samples(user, USERS[user][0], 5, "train")
        np.testing.assert_array_equal(src.x_train[part], np.asarray(x, np.float32))
        np.testing.assert_array_equal(src.y_train[part], y)
    assert np.concatenate(s.parts).tolist() == list(range(len(src.y_train)))
    want = [samples(u, USERS[u][1], 5, "test") for u in SORTED]
    np.testing.assert_array_equal(src.x_test, np.concatenate([np.asarray(x, np.float32).reshape(-1, 5)
                                                              for x, _ in want]))
    np.testing.assert_array_equal(src.y_test, [c for _, y in want for c in y])


def test_data_root_may_be_the_dataset_folder_or_its_data_folder(folder):
    a, b = (load_source(leaf(r), seed=0) for r in (folder, os.path.dirname(folder)))
    assert a.x_train is b.x_train and a.y_test is b.y_test


def test_femnist_images_load_as_28x28_and_become_tensors(tmp_path):
    d = load_federated(leaf(write_leaf(tmp_path / "femnist", dim=784)), seed=0)
    assert d.input_shape == (1, 28, 28) and tuple(d.x_test.shape[1:]) == (1, 28, 28)
    assert d.describe() == "leaf: 29 train / 10 test, 4 classes, 6 clients (natural split), sizes 3..7"
    assert [int(d.x_train[ix[0], 0, 0, 0]) for ix in d.client_indices] == [int(u[1:]) for u in SORTED]


def test_the_files_are_parsed_once_until_they_change_and_their_arrays_are_read_only(folder):
    first, again = load_source(leaf(folder), 0), load_source(leaf(folder), 1)
    assert again.x_train is first.x_train and again.client_indices[0] is first.client_indices[0]
    for a in (first.x_train, first.y_train, first.x_test, first.y_test, *first.client_indices):
        assert not a.flags.writeable
    edit(folder, "train", 0, lambda d: d["user_data"]["w07"].update(y=[2] + d["user_data"]["w07"]["y"][1:]))
    os.utime(os.path.join(folder, "train", "all_data_0_niid_0_keep_0_train_9.json"), ns=(1, 1))   # a new stamp
    changed = load_source(leaf(folder), 0)
    assert changed.x_train is not first.x_train and changed.y_train[changed.client_indices[SORTED.index("w07")][0]] == 2


def test_fewer_clients_than_users_is_a_subset_drawn_from_the_seed(folder):
    def users(seed):
        src = load_source(leaf(folder, num_clients=3), seed)
        held = [sorted({f"w{int(v):02d}" for v in src.x_train[p, 0]}) for p in src.client_indices]
        assert all(len(h) == 1 for h in held)
        return [h[0] for h in held], src

    for seed in (0, 1):
        chosen, src = users(seed)
        want = [SORTED[i] for i in np.sort(np_rng(seed, -1, "leaf_users").choice(6, 3, replace=False))]
        assert chosen == want and users(seed)[0] == want
        assert len(src.y_train) == sum(USERS[u][0] for u in want)            # only theirs
        assert sorted({f"w{int(v):02d}" for v in src.x_test[:, 0]}) == sorted(u for u in want if USERS[u][1])
        assert len(src.y_test) == sum(USERS[u][1] for u in want)
    assert len({tuple(users(seed)[0]) for seed in range(6)}) > 1


# ---- refusals --------------------------------------------------------------------------------------

def _delete(path):
    for name in os.listdir(path):
        os.remove(os.path.join(path, name))


def _user(doc, user, **entry):
    doc["users"].append(user)
    doc["num_samples"].append(len(entry["x"]))
    doc["user_data"][user] = entry


def _empty(doc):
    doc.update(num_samples=[0] * len(doc["users"]), user_data={u: {"x": [], "y": []} for u in doc["users"]})


REFUSALS = {
    "no test folder": (lambda f: (_delete(f"{f}/test"), os.rmdir(f"{f}/test")), {},
                       "data.root: no test/ folder under"),
    "no json files": (lambda f: (_delete(f"{f}/train"), open(f"{f}/train/notes.txt", "w").close()), {},
                      "/train holds no .json files; expected LEAF's train split as train/*.json"),
    "malformed json": (lambda f: open(f"{f}/test/all_data_1_niid_0_keep_0_test_9.json", "a").write("}"), {},
                       "all_data_1_niid_0_keep_0_test_9.json is not valid JSON (Extra data at line 1"),
    "not a LEAF file": (lambda f: edit(f, "train", 0, lambda d: d.pop("user_data")), {},
                        "is not a LEAF file: expected 'users' and 'num_samples'"),
    "num_samples off": (lambda f: edit(f, "train", 1, lambda d: d["num_samples"].__setitem__(0, 9)), {},
                        "all_data_1_niid_0_keep_0_train_9.json, user 'w02': num_samples says 9 but x has 4 and y 4"),
    "user without data": (lambda f: edit(f, "train", 0, lambda d: d["user_data"].pop("w07")), {},
                          "lists user 'w07' in 'users' but 'user_data' has no x and y lists for it"),
    "user in two files": (lambda f: edit(f, "train", 1, lambda d: _user(d, "w07", x=[[0.0] * 5], y=[0])), {},
                          "data.root: user 'w07' is in both"),
    "test-only user": (lambda f: edit(f, "test", 0, lambda d: _user(d, "zz", x=[[0.0] * 5], y=[0])), {},
                       "data.root: users 'zz' have test samples"),
    "user without training samples": (lambda f: edit(f, "train", 0, lambda d: _user(d, "w99", x=[], y=[])), {},
                                      "data.root: user 'w99' in"),
    "text samples (Shakespeare)": (lambda f: edit(f, "train", 0, lambda d: _user(d, "ham", x=["to be or not to "],
                                                                                   y=["b"])), {},
                                   "holds samples that are strings (user 'ham': text, or image file names); "
                                   "fedsweep's models take numeric features"),
    "tweets (Sent140)": (lambda f: edit(f, "train", 0, lambda d: _user(d, "tw", x=[["1", "Mon", "q", "tw", "hi"]],
                                                                         y=[1])), {},
                         "need a sequence model or the image files"),
    "string labels": (lambda f: edit(f, "train", 0, lambda d: _user(d, "s", x=[[0.0] * 5], y=["a"])), {},
                      "holds labels that are strings (user 's')"),
    "ragged samples": (lambda f: edit(f, "train", 0, lambda d: _user(d, "r", x=[[0.0] * 5, [0.0] * 4], y=[0, 0])),
                       {}, "user 'r': each sample x must be a flat list of numbers, all of one length"),
    "another length": (lambda f: edit(f, "test", 0, lambda d: d["user_data"]["w07"].__setitem__("x", [[0.0] * 4] * 2)),
                       {},
                       "user 'w07': samples of 4 values, where 'w00''s have 5"),
    "fractional labels": (lambda f: edit(f, "train", 0, lambda d: _user(d, "fl", x=[[0.0] * 5], y=[0.5])), {},
                          "user 'fl': labels y must be integers (class ids)"),
    "negative label": (lambda f: edit(f, "train", 0, lambda d: _user(d, "neg", x=[[0.0] * 5], y=[-1])), {},
                       "has a negative label (-1); labels are class ids 0..C-1"),
    "a label no class id": (lambda f: edit(f, "train", 0, lambda d: _user(d, "big", x=[[0.0] * 5], y=[2_000_000_001])),
                            {}, "has a label 2,000,000,001 among its 5 distinct labels; labels are class ids 0..C-1 "
                                "(C = the largest + 1: 2,000,000,002 classes here), so renumber them"),
    "no test sample": (lambda f: [edit(f, "test", i, _empty) for i in (0, 1)], {},
                       "data.root: no user has a test sample under"),
    "more clients than users": (lambda f: None, {"num_clients": 7},
                                "data.num_clients: 7 exceeds the 6 users of the LEAF data under"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_what_cannot_be_read_is_one_line_naming_the_key_and_the_file(folder, case):
    change, over, needle = REFUSALS[case]
    change(folder)
    with pytest.raises(ConfigError) as e:
        split_federated(leaf(folder, **over), seed=0)
    msg = str(e.value)
    key = "data.num_clients: " if case == "more clients than users" else "data.root: "
    assert "\n" not in msg and msg.startswith(key) and needle in msg
    if case == "more clients than users":
        assert msg.endswith("; allowed 1..6 (one client a user)")


@pytest.mark.parametrize("data,needle", [
    ({"name": "leaf"}, "data.root: dataset 'leaf' reads LEAF's JSON files; set data.root"),
    ({"name": "leaf", "root": "/nonexistent/leaf", "download": True}, "data.download: fedsweep cannot fetch"),
])
def test_a_run_config_without_leafs_files_is_refused_when_built(data, needle):
    with pytest.raises(ConfigError, match=needle):
        build_config(tiny_raw(data={**data, "num_clients": 8}))


def test_users_drawn_without_a_test_sample_are_refused(tmp_path):
    folder = write_leaf(tmp_path / "toy", users={"u1": (2, 0), "u2": (2, 1), "u3": (3, 0)})
    seed = next(s for s in range(100) if np_rng(s, -1, "leaf_users").choice(3, 1)[0] != 1)   # not u2
    with pytest.raises(ConfigError, match=f"^data.num_clients: the 1 users drawn at seed {seed} have no test sample "
                                          "under .*; allowed 1..3: draw more of them$"):
        load_source(leaf(folder, num_clients=1), seed)


def test_a_root_that_is_no_folder_is_named(tmp_path):
    with pytest.raises(ConfigError, match=f"data.root: {tmp_path / 'nowhere'} is not a folder"):
        load_source(leaf(tmp_path / "nowhere"), 0)


# ---- with the rest of fedsweep ---------------------------------------------------------------------

def test_validation_splits_and_the_server_pool_take_from_the_users_own_samples(folder):
    plain = split_federated(leaf(folder), 0)
    central = split_federated(leaf(folder, validation_fraction=0.2), 0)
    assert len(central.val) == int(np.ceil(0.2 * len(plain.source.y_train)))
    for p, c in zip(plain.parts, central.parts):
        assert len(c) and set(c) <= set(p) and not set(c) & set(central.val)
    fed = split_federated(leaf(folder, validation_fraction=0.25, validation="federated"), 0)
    for p, t, v in zip(plain.parts, fed.parts, fed.val_parts):
        assert sorted([*t, *v]) == sorted(p) and len(v) == int(np.ceil(0.25 * len(p)))
    pooled = split_federated(leaf(folder), 0, ServerDataConfig(fraction=0.2))
    assert len(pooled.pool) and all(len(p) for p in pooled.parts)
    assert not set(pooled.pool) & set(np.concatenate(pooled.parts))


@pytest.mark.parametrize("kind", ["central", "federated"])
def test_a_run_evaluates_its_validation_split(folder, kind):
    cfg = build_config(tiny_raw(data={"name": "leaf", "root": folder, "num_clients": 6, "validation": kind,
                                      "validation_fraction": 0.25}, rounds=2, clients_per_round=3))
    m = train(cfg, progress=False)
    assert [h["round"] for h in m.history] == [1, 2]
    assert all(0 <= h["val/accuracy"] <= 1 and 0 <= h["test/accuracy"] <= 1 for h in m.history)


def test_fedsweep_run_trains_lenet5_on_femnist_shaped_users(tmp_path, capsys):
    raw = tiny_raw(data={"name": "leaf", "root": write_leaf(tmp_path / "femnist", dim=784), "num_clients": 4},
                   model={"name": "lenet5"}, rounds=2, clients_per_round=2)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--output-json", str(tmp_path / "s.json")]) == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["rounds"] == 2 and summary["status"] == "finished"
    assert re.search(r"^leaf: \d+ train / \d+ test, 4 classes, 4 clients \(natural split\)", capsys.readouterr().err,
                     re.M)


def test_a_sweep_on_leaf_runs_on_ray_tune_into_mlflow_and_reports(tmp_path, monkeypatch, fresh_home):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = {"name": "leafsweep", "seeds": [0], "max_concurrent": 1, "grid": {"local.lr": [0.05, 0.2]},
            "methods": {"fedavg": {}, "fedprox": {"algorithm.mu": [0.01]}},
            "base": {"rounds": 2, "clients_per_round": 3, "device": "cpu", "mlflow": {"tracking_uri": uri},
                     "data": {"name": "leaf", "root": os.path.relpath(write_leaf(tmp_path / "toy")), "num_clients": 5},
                     "model": {"name": "mlp", "options": {"hidden": 8}}, "local": {"steps": 2, "batch_size": 4},
                     "eval": {"every": 1, "target_accuracy": 0.05}}}
    (tmp_path / "leaf.yaml").write_text(yaml.safe_dump(spec))
    assert main(["tune", "leaf.yaml"]) == 0
    client, runs = trial_runs(uri, "leafsweep")
    assert len(runs) == 4 and {r.data.tags["fedsweep.status"] for r in runs} == {"finished"}
    assert {r.data.params["data.name"] for r in runs} == {"leaf"}
    assert all(r.data.metrics["summary/rounds"] == 2 for r in runs)
    assert main(["report", "leaf.yaml", "--out", "rep"]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert text.startswith("# Sweep report: leafsweep") and "fedavg" in text and "fedprox" in text
