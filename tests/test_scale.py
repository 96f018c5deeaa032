"""Clients at scale: a round reads its K sampled clients only, and gives the numbers the dense
structures gave (the (N, n_max) padded table, the (N, n) per-client state, ``torch.randperm``)."""
import math

import numpy as np
import pytest
import torch

from fedsweep.algorithms.client_rows import ClientRows
from fedsweep.cli import main
from fedsweep.config.schema import ConfigError, build_config
from fedsweep.engine import probe_batches
from fedsweep.runs.memory import StateBound, check_state_fits, state_bound
from fedsweep.runs.run import train
from fedsweep.sim.client_index import ClientIndex
from fedsweep.sim.heterogeneity import Planner, RoundPlan, sample_clients, schedule_batches
from fedsweep.sim.rng import derive_seed


# ----- client sampling ----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 10, 100, 4097, 100_000, 1_000_000])
def test_clients_sampled_in_o_k_are_torch_randperms(n):
    for seed in (0, 7, derive_seed(3, 11, "clients")):
        for k in sorted({1, min(n, 10), min(n, 100), min(n, 1000)}):
            g = torch.Generator().manual_seed(seed)
            assert torch.equal(sample_clients(n, k, seed), torch.randperm(n, generator=g)[:k]), (n, k, seed)
    assert sorted(sample_clients(n, n, 5).tolist()) == list(range(n)) if n <= 4097 else True


def test_sample_clients_refuses_impossible_counts():
    with pytest.raises(ValueError):
        sample_clients(5, 6, 0)


# ----- the compressed client index ------------------------------------------------------------------

class PaddedTable:
    """The (N, n_max) table the client index replaced (each row a client's indices, padded with 0),
    read the way schedule_batches and probe_batches read it before: the oracle of the tests below."""

    def __init__(self, parts):
        self.sizes = torch.tensor([len(p) for p in parts])
        self.table = torch.zeros(len(parts), int(self.sizes.max()), dtype=torch.long)
        for i, p in enumerate(parts):
            self.table[i, :len(p)] = p

    def gather(self, clients, local):
        return self.table[clients, local]

    def rows(self, clients):
        rows = self.table[clients]
        return rows, torch.arange(rows.shape[1]).view(1, -1) < self.sizes[clients].view(-1, 1)


def _heavy_tailed_parts(n_clients, seed):
    rng = np.random.default_rng(seed)
    sizes = np.maximum(1, np.floor(rng.lognormal(1.5, 1.2, n_clients))).astype(int)
    order = rng.permutation(int(sizes.sum()))
    cuts = np.concatenate([[0], np.cumsum(sizes)])
    return [torch.from_numpy(order[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


@pytest.mark.parametrize("unit", ["steps", "epochs"])
def test_batches_and_probes_are_those_of_the_padded_table(unit):
    parts = _heavy_tailed_parts(300, seed=1)
    index, padded = ClientIndex.from_parts(parts), PaddedTable(parts)
    assert index.max_size == int(padded.sizes.max()) and torch.equal(index.sizes, padded.sizes)
    for t in range(6):
        clients = sample_clients(300, 12, derive_seed(0, t, "clients")).sort().values
        work = torch.randint(1, 4, (12,), generator=torch.Generator().manual_seed(t))
        sizes = padded.sizes[clients]
        steps = work * ((sizes + 4) // 5) if unit == "epochs" else work
        plan = RoundPlan(t, clients, work, steps, sizes, torch.zeros(12, dtype=torch.bool), 3, 0.1)
        a, b = (schedule_batches(plan, x, 5, unit, seed=3) for x in (index, padded))
        assert torch.equal(a.index, b.index) and torch.equal(a.mask, b.mask)
        for kind in ("minibatch", "full"):
            a, b = (probe_batches(kind, plan, x, 5, seed=3) for x in (index, padded))
            assert torch.equal(a.index, b.index) and torch.equal(a.mask, b.mask)


def test_the_index_reads_like_the_list_of_clients_and_costs_no_padding():
    parts = [torch.arange(3), torch.arange(3, 100_003), torch.arange(100_003, 100_004)]
    index = ClientIndex.from_parts(parts)
    assert len(index) == 3 and [p.tolist() for p in index][0] == [0, 1, 2]
    assert torch.equal(index[1], parts[1]) and torch.equal(index[-1], parts[2])
    assert index.nbytes() == 8 * (100_004 + 4)                 # one int64 a sample and a client: no (N, n_max)
    with pytest.raises(IndexError):
        index[3]
    rows, mask = index.rows(torch.tensor([0, 2]), width=4)
    assert rows.tolist() == [[0, 1, 2, 0], [100_003, 0, 0, 0]] and mask.sum().item() == 4


# ----- per-client state -----------------------------------------------------------------------------

def test_client_rows_read_and_write_as_the_dense_table_does():
    g = torch.Generator().manual_seed(0)
    rows, dense = ClientRows(50, 4, "cpu", torch.float64), torch.zeros(50, 4, dtype=torch.float64)
    for _ in range(40):
        ids = torch.randperm(50, generator=g)[:7]
        assert torch.equal(rows.get(ids), dense[ids])
        new = dense[ids] + torch.randn(7, 4, generator=g, dtype=torch.float64)
        rows.set(ids, new)
        dense[ids] = new
    assert torch.equal(rows.dense(), dense)
    assert len(rows) == int((dense != 0).any(1).sum())


def test_state_is_allocated_for_the_clients_that_took_part_only(tmp_path):
    cfg = build_config({"rounds": 6, "clients_per_round": 5, "mlflow": {"enabled": False},
                        "data": {"name": "synthetic", "num_clients": 5000, "options": {"mean_samples": 3}},
                        "model": {"options": {"hidden": 16}}, "algorithm": {"name": "scaffold"},
                        "heterogeneity": {"kind": "profiles", "dropout": 0.4}})
    m = train(cfg, progress=False)
    took_part = set()
    for t in range(6):
        plan = m.planner.plan(t)
        took_part |= set(plan.clients[plan.participated].tolist())
    held, clients, used = m.algorithm.client_state_held()
    assert clients == len(took_part) < 30 and used == clients * m.fmodel.dim * 4
    assert set(m.algorithm.c_i.clients.tolist()) == took_part
    assert held < 5000 * m.fmodel.dim * 4 / 50                 # far below the dense (N, n) table
    # a checkpoint carries the rows of those clients only, and resumes into the same state
    state = m.algorithm.state_dict()
    assert state["c_i"].shape == (clients, m.fmodel.dim) and state["c_i_shape"].tolist() == [5000, m.fmodel.dim]


@pytest.mark.parametrize("name, table", [("scaffold", "c_i"), ("feddyn", "grad_prev")])
def test_a_checkpoint_with_the_whole_table_loads(name, table):
    """Checkpoints written when the state was an (N, n) tensor restore the same rows."""
    from quadratic import make_algorithm
    a = make_algorithm(name, 6, 3, [1] * 6)
    dense = torch.zeros(6, 3, dtype=torch.float64)
    dense[[1, 4]] = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, 0.0]], dtype=torch.float64)
    old = {k: v for k, v in a.state_dict().items() if not k.startswith(table)}
    a.load_state_dict({**old, table: dense})
    assert torch.equal(getattr(a, table).dense(), dense) and len(getattr(a, table)) == 2
    with pytest.raises(ValueError, match=r"this run needs \(6, 3\)"):
        a.load_state_dict({**old, table: torch.zeros(7, 3, dtype=torch.float64)})


# ----- memory ---------------------------------------------------------------------------------------------

def test_state_that_cannot_fit_is_refused_in_one_line_before_training(capsys, tmp_path, monkeypatch):
    cfg = build_config({"rounds": 4000, "clients_per_round": 10, "mlflow": {"enabled": False},
                        "data": {"name": "synthetic", "num_clients": 20_000, "options": {"mean_samples": 2}},
                        "model": {"options": {"hidden": 50_000}}, "algorithm": {"name": "feddyn"}})
    bound = state_bound(cfg, dim=61 * 50_000 + 50_000 * 10 + 10)  # 60 inputs (+ bias), 10 classes
    assert bound.clients == 20_000 and bound.total > 2e11                # ~285 GB: more than any test machine has
    with pytest.raises(ConfigError, match=r"^algorithm\.name: feddyn keeps 1 row\(s\) of 14\.2 MB for each client "
                                          r"that takes part, up to min\(N, rounds·K\) = 20,000 clients: 284 GB"):
        train(cfg, progress=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "big.yaml").write_text("rounds: 4000\nclients_per_round: 10\nalgorithm: {name: feddyn}\n"
                                       "model: {options: {hidden: 50000}}\n"
                                       "data: {name: synthetic, num_clients: 20000, options: {mean_samples: 2}}\n")
    capsys.readouterr()
    assert main(["run", "--no-mlflow", "big.yaml"]) == 2
    err = capsys.readouterr().err
    assert "algorithm.name: feddyn keeps" in err and "round " not in err


def test_a_pack_counts_every_members_state():
    bounds = [(build_config({"algorithm": {"name": "scaffold"}}), StateBound(1, 10**9, 10**3))] * 3
    with pytest.raises(ConfigError, match=r"\(3 runs in this process\)"):
        check_state_fits(bounds, "cpu")
    check_state_fits([(build_config({}), StateBound(0, 10**9, 0))], "cpu")   # no per-client state: nothing to refuse


def test_the_run_says_what_it_holds(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "run.yaml"
    path.write_text("rounds: 3\nclients_per_round: 4\nalgorithm: {name: scaffold}\nmodel: {options: {hidden: 8}}\n"
                    "data: {name: synthetic, num_clients: 1000, options: {mean_samples: 4}}\n")
    assert main(["run", "--no-mlflow", str(path)]) == 0
    err = capsys.readouterr().err
    dim = 61 * 8 + 9 * 10
    assert f"scaffold keeps {dim * 4 / 1000:.3g} kB for each client that takes part (from its first round): up to" in err
    assert "min(N, rounds·K) = 12 clients" in err
    line = next(x for x in err.splitlines() if x.startswith("per-client state:"))
    took = int(line.split("rows for the ")[1].split(" of ")[0])
    assert 1 <= took <= 12 and "of 1,000 clients that took part" in line


def test_a_round_at_large_n_touches_only_its_clients():
    """N = 200,000 clients of a few samples: the index is the data's own size, the planner draws the
    clients in O(K), and the state of SCAFFOLD holds its participants' rows."""
    cfg = build_config({"rounds": 2, "clients_per_round": 10, "mlflow": {"enabled": False}, "eval": {"every": 100},
                        "data": {"name": "synthetic", "num_clients": 200_000, "options": {"mean_samples": 2}},
                        "model": {"options": {"hidden": 8}}, "algorithm": {"name": "scaffold"}})
    m = train(cfg, progress=False)
    samples = m.data.client_indices.values.numel()
    assert m.clients_cpu.nbytes() == 8 * (samples + 200_001)
    assert len(m.algorithm.c_i) <= 20 and m.algorithm.c_i.rows.shape[0] <= 32
    assert math.isfinite(m.history[-1]["test/accuracy"])
    assert isinstance(m.planner, Planner)
