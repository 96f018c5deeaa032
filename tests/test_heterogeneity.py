"""The round plan: straggler counts, step ranges, profiles, and the batch schedule."""
import torch

from fedsweep.config.schema import build_config
from fedsweep.sim.client_index import ClientIndex
from fedsweep.sim.heterogeneity import Planner, RoundPlan, schedule_batches


def planner(**het):
    cfg = build_config({"clients_per_round": 10, "data": {"num_clients": 30}, "local": {"steps": 5},
                        "heterogeneity": het})
    return Planner(cfg, torch.full((30,), 20))


def test_stragglers_exact_count_and_range():
    p = planner(kind="stragglers", rho=0.3, tau_max=2)
    for t in range(20):
        plan = p.plan(t)
        assert int(plan.stragglers.sum()) == 3                      # round(0.3 · 10)
        slow = plan.work[plan.stragglers]
        assert ((slow >= 3) & (slow <= 4)).all()                    # E − τ_max .. E − 1
        assert (plan.tau[~plan.stragglers] == 1).all()
        assert (plan.tau == 5 - plan.work + 1).all()
        assert len(set(plan.clients.tolist())) == 10


def test_rho_zero_and_one():
    assert not planner(kind="stragglers", rho=0.0).plan(0).stragglers.any()
    assert planner(kind="stragglers", rho=1.0).plan(0).stragglers.all()


def test_uniform_and_determinism():
    p = planner(kind="uniform", min_steps=2, max_steps=4)
    works = torch.cat([p.plan(t).work for t in range(30)])
    assert set(works.tolist()) == {2, 3, 4}
    assert torch.equal(p.plan(7).work, planner(kind="uniform", min_steps=2, max_steps=4).plan(7).work)
    assert not torch.equal(p.plan(7).clients, p.plan(8).clients)


def test_profiles_persistent_speeds_and_dropout(tmp_path):
    p = planner(kind="profiles", speeds=1.0, deadline=5.0, dropout=0.3)
    seen = {}
    dropped = 0
    for t in range(40):
        plan = p.plan(t)
        dropped += int(plan.dropped.sum())
        for c, w, d in zip(plan.clients.tolist(), plan.work.tolist(), plan.dropped.tolist()):
            if not d:
                assert seen.setdefault(c, w) == w                   # a client's speed persists
        assert (plan.work[plan.dropped] == 0).all()
    assert 0.15 < dropped / 400 < 0.45
    trace = tmp_path / "speeds.csv"
    trace.write_text("client,speed\n" + "\n".join(f"{i},{0.2 * (i + 1)}" for i in range(30)))
    plan = planner(kind="profiles", trace=str(trace), deadline=5.0).plan(0)
    expect = (0.2 * (plan.clients.double() + 1) * 5.0).floor().long().clamp(1, 5)
    assert torch.equal(plan.work, expect)


def _plan(sizes, steps):
    K = len(sizes)
    return RoundPlan(0, torch.arange(K), torch.tensor(steps), torch.tensor(steps), torch.tensor(sizes),
                     torch.zeros(K, dtype=torch.bool), max(steps), 0.1)


def test_batches_steps_unit_walk_permutations_of_own_data():
    sizes = [7, 3, 12]
    table = ClientIndex.from_parts([torch.arange(7), torch.arange(7, 10), torch.arange(10, 22)])
    b = schedule_batches(_plan(sizes, [3, 4, 2]), table, 5, "steps", seed=1)
    assert b.index.shape == (3, 4, 5)
    owned = [set(range(7)), set(range(7, 10)), set(range(10, 22))]
    for k, (n, s) in enumerate(zip(sizes, [3, 4, 2])):
        picked = b.index[k][b.mask[k]].tolist()
        assert set(picked) <= owned[k]
        assert len(picked) == s * min(5, n)                         # min(B, n_i) per step
        stream = picked
        for start in range(0, len(stream) - n + 1, n):              # each full pass is a permutation
            assert sorted(stream[start:start + n]) == sorted(owned[k])
        assert not b.mask[k, s:].any()


def test_batches_epochs_unit_cover_each_sample_once_per_epoch():
    sizes = [7, 12]
    table = ClientIndex.from_parts([torch.arange(7), torch.arange(7, 19)])
    plan = _plan(sizes, [2 * 2, 3])                                 # 2 epochs of ceil(7/5)=2; 1 of ceil(12/5)=3
    b = schedule_batches(plan, table, 5, "epochs", seed=1)
    first = b.index[0][b.mask[0]].tolist()
    assert sorted(first[:7]) == list(range(7)) and sorted(first[7:]) == list(range(7))
    assert b.mask[0, 1].sum() == 2                                  # last batch of the pass is partial
    assert sorted(b.index[1][b.mask[1]].tolist()) == list(range(7, 19))


def test_batches_deterministic_per_round_and_purpose():
    table = ClientIndex.from_parts([torch.arange(20), torch.arange(20, 40)])
    plan = _plan([20, 20], [3, 3])
    a = schedule_batches(plan, table, 4, "steps", seed=5)
    assert torch.equal(a.index, schedule_batches(plan, table, 4, "steps", seed=5).index)
    assert not torch.equal(a.index, schedule_batches(plan, table, 4, "steps", seed=6).index)
    assert not torch.equal(a.index, schedule_batches(plan, table, 4, "steps", seed=5, purpose="probe").index)
