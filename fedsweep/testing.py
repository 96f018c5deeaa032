"""``fedsweep check``: an algorithm's contract checked on a tiny problem in seconds, as scikit-learn's
``check_estimator`` checks an estimator.

The contract (docs/design.md §1.4, §2.7, §3, §5.1; what each check verifies: docs/algorithms.md,
"Checking an algorithm") is checked on real tiny runs (:func:`tiny_config`) trained through
:func:`fedsweep.runs.run.train`, and on rounds planned and trained by such a run's module; nothing is
mocked. A failed check says in one line which hook is wrong and what to do.

    from fedsweep.testing import check_algorithm
    check_algorithm(MyAlgorithm)      # raises AlgorithmContractError listing the failed checks
"""
from __future__ import annotations

import copy
import math
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from fedsweep.algorithms.base import Algorithm
from fedsweep.algorithms.hook_errors import RANDOM_ADVICE, first_line, hook_error, origin
from fedsweep.config.registry import ALGORITHMS, get_algorithm_class, register_algorithm
from fedsweep.config.schema import build_config
from fedsweep.util.compare import checkpoints_keep, garbage, gap, same, timeless
from fedsweep.util.errors import ConfigError
from fedsweep.util.lazy import torch

ENGINES_AGREE = {"rtol": 1e-4, "atol": 1e-5}   # loop vs vectorized (docs/design.md §2.7)
ROWS_AGREE = {"rtol": 1e-5, "atol": 1e-6}      # row-wise vs vmapped: float32 rounding (tests/test_batched.py)
GARBAGE = 1e6        # what a dropped client's uploads are replaced by: large but finite, so 0 × garbage stays 0
STRAGGLERS = {"kind": "stragglers", "rho": 0.5}
DROPOUT = {"kind": "profiles", "dropout": 0.5}   # with seed 3: rounds where some clients drop out
ROUNDS, RESUME_AFTER = 4, 2
CLIENT_HOOKS = "client_init/client_step/client_final"


def tiny_config(name: str, params: dict | None = None, heterogeneity: dict | None = None) -> dict:
    """The raw config the checks train: digits, 8 clients, an MLP of 8 hidden units, 4 rounds, ~20 ms a run;
    with BatchNorm for an algorithm that keeps each client's buffers (``local_buffers``: FedBN)."""
    raw = {"seed": 3, "rounds": ROUNDS, "clients_per_round": 4, "device": "cpu",
           "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "classes", "classes_per_client": 2}},
           "model": {"name": "mlp", "options": {"hidden": 8}}, "local": {"steps": 3, "batch_size": 5, "lr": 0.1},
           "heterogeneity": heterogeneity or STRAGGLERS, "algorithm": {**(params or {}), "name": name},
           "eval": {"every": RESUME_AFTER}, "mlflow": {"enabled": False}}
    if get_algorithm_class(name).needs_server_data:
        raw["server_data"] = {"fraction": 0.05}
    if get_algorithm_class(name).local_buffers:
        raw["model"]["options"]["batchnorm"] = True
    return raw


@dataclass
class Check:
    """One clause of the contract: what was checked, about which hook(s), whether it held; if not, one line
    naming the hook, what is wrong and what to do (``message``)."""
    name: str
    hook: str
    ok: bool
    message: str = ""
    seconds: float = 0.0
    #: not made: it follows from a failure reported before it (its root cause), said once there
    skipped: bool = False

    def line(self) -> str:
        if self.skipped:
            return f"skipped {self.name}: {self.message}"
        return f"ok      {self.name}  {self.seconds:.1f} s" if self.ok else f"FAILED  {self.message}"

    @property
    def failed(self) -> bool:
        """A failure of its own (a root cause): not ok, and not skipped as following from another."""
        return not self.ok and not self.skipped


class AlgorithmContractError(AssertionError):
    """Some check of :func:`check_algorithm` failed; the message lists the failed ones, one line each."""

    def __init__(self, name: str, checks: list[Check]):
        self.checks = checks
        failed = [c for c in checks if c.failed]
        super().__init__(f"{name} breaks the algorithm contract ({len(failed)} of {len(checks)} checks failed):\n"
                         + "\n".join(f"  {c.message}" for c in failed))


def check_algorithm(cls_or_name, params: dict | None = None, *, raise_on_failure: bool = True,
                    progress: Callable[[Check], None] | None = None) -> list[Check]:
    """Check an algorithm (its class, or its registered name) with ``params`` (its own, as under ``algorithm:``;
    bad ones: a ConfigError before anything runs); ``progress(check)`` is called as each check ends. A class not
    registered is registered while it is checked (a name the registry refuses: one failed check). Returns the
    checks; with ``raise_on_failure``, raises :class:`AlgorithmContractError` if one failed."""
    cls = get_algorithm_class(cls_or_name) if isinstance(cls_or_name, str) else cls_or_name
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"check_algorithm: {cls!r} is neither a subclass of fedsweep.Algorithm nor a registered name")
    checks: list[Check] = []

    def report(check: Check) -> None:
        checks.append(check)
        if progress is not None:
            progress(check)
    name = cls.__dict__.get("name")
    before = ALGORITHMS.get(name) if isinstance(name, str) and name in ALGORITHMS.names() else None
    try:
        if before is None or before.obj is not cls:
            register_algorithm(cls)
    except ConfigError as e:   # a name another module registered, or none
        report(Check("registered under its name", "name", False, f"name: {e}"))
    else:
        try:
            _Checker(cls, dict(params or {}), report).run_all()
        finally:
            if before is None or before.obj is not cls:
                ALGORITHMS.remove(name)
                if before is not None:
                    ALGORITHMS.add(before)   # the same module's earlier class of that name (a re-run notebook cell)
    if raise_on_failure and not all(c.ok for c in checks):
        raise AlgorithmContractError(getattr(cls, "name", cls.__name__), checks)
    return checks


class _Broken(Exception):
    """A check's finding: one line naming the hook (``hook``, where it is more precise than the check's);
    ``follows``: it only follows from a failure reported before (the check is then skipped, not failed)."""

    def __init__(self, message: str, hook: str | None = None, follows: bool = False):
        super().__init__(message)
        self.hook, self.follows = hook, follows


class _Checker:
    """The checks of one algorithm, sharing its tiny runs (each trained once, whichever check asks first)."""

    def __init__(self, cls, params: dict, report):
        self.cls, self.name, self.params, self.report = cls, cls.name, params, report
        self.twin = self.name            # the name of the same algorithm with rowwise off (run_all)
        self.results, self.raised, self.rounds = {}, {}, {}   # runs; errors reported -> hook; dropout_round's
        self.reproducible = True
        self.drew_torch_random = False   # a client hook drew from torch's generator (vmap said so)

    def run_all(self) -> None:
        build_config(tiny_config(self.name, self.params))   # bad parameters: one ConfigError, nothing run
        from fedsweep.runs import module  # noqa: F401  (Lightning's import, seconds: not the first check's time)
        clients, state = self.cls.uses_clients, "state_dict/load_state_dict"
        # a local_buffers algorithm trains a BatchNorm model, which the vectorized engine does not run:
        # its checks are the loop engine's (its client code is then never vmapped)
        self.vmapped = clients and not self.cls.local_buffers
        if self.cls.rowwise and self.vmapped:   # the same class with rowwise off: its client code under vmap
            self.twin = f"{self.name}_check_vmapped"
            register_algorithm(type(f"{self.cls.__name__}Vmapped", (self.cls,),
                                    {"name": self.twin, "rowwise": False, "__module__": __name__}))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)   # tiny tensors gain nothing from more; on busy shared cores 2 spinning threads cost 10x
        try:
            if self.vmapped:
                self.check("client code runs under torch.func.vmap", CLIENT_HOOKS, lambda: self.run("vectorized vmapped"))
            self.check("same seed, same numbers (each engine)", "every hook", self.same_seed)
            if self.vmapped and self.cls.rowwise:
                self.check("rowwise declared only where true", "rowwise", self.rowwise_holds, compares=True)
            if self.vmapped or not clients:
                self.check("engines agree (loop and vectorized)", CLIENT_HOOKS, lambda: self.engines_agree(""), True)
                self.check("engines agree with dropped clients", CLIENT_HOOKS, lambda: self.engines_agree(" dropout"),
                           True)
            self.check("state_dict round trip (torch.save, weights_only load)", state, self.state_round_trip)
            self.check("exact resume from a checkpoint", state, self.exact_resume, compares=True)
            if clients:
                self.check("uploads: 'delta' of shape (n,) per client", "client_final", self.uploads)
            self.check("aggregate ignores dropped clients' uploads", "aggregate", lambda: self.ignores_dropped(False),
                       compares=True)
            self.check("aggregate of a round where every client dropped", "aggregate", lambda: self.ignores_dropped(True),
                       compares=True)
            for hook in ("communication", "compute"):
                self.check(f"{hook} counts clients that returned", hook, lambda h=hook: self.accounting(h))
            self.check("round_metrics logs what metrics declares", "round_metrics", self.declared_metrics)
            if self.cls.personal_models is not Algorithm.personal_models:
                self.check("personal_models: one model a client, state unchanged", "personal_models", self.personal)
        finally:
            torch.set_num_threads(threads)
            if self.twin != self.name:
                ALGORITHMS.remove(self.twin)

    def check(self, name: str, hook: str, fn, compares: bool = False) -> None:
        """Run check ``fn`` and report it; one that ``compares`` two computations is not made when the same seed
        does not give the same numbers (both would differ whatever the hook)."""
        start, found = time.perf_counter(), None
        try:
            if compares and not self.reproducible:
                raise _Broken("not compared: the same seed does not give the same numbers (above)", follows=True)
            fn()
        except _Broken as e:
            found = e
        except Exception as e:  # noqa: BLE001 - the algorithm's own error, in one line where it was raised
            self.drew_torch_random |= "randomness error mode" in str(e)
            found, seen = _raised(e, hook), str(_raised(e, ""))
            if seen in self.raised:   # met before: refer to it, under the hook it was reported for
                before = self.raised[seen]
                found = _Broken(f"not checked: {before} raises the {type(e).__name__} reported above", before, True)
            else:
                self.raised[seen] = found.hook
        self.report(Check(name, found and found.hook or hook, found is None, str(found or ""),
                          time.perf_counter() - start, skipped=bool(found and found.follows)))

    # ----- the runs -------------------------------------------------------------------------------
    def run(self, key: str):
        """The module of tiny run ``key`` ("ENGINE [dropout] [vmapped] [again]"), trained once (or its error)."""
        words = [w for w in key.split() if w != "vmapped" or self.twin != self.name]
        key = " ".join(words)
        if key not in self.results:
            from fedsweep.runs.run import train
            raw = tiny_config(self.twin if "vmapped" in words else self.name, self.params,
                              DROPOUT if "dropout" in words else STRAGGLERS)
            try:
                self.results[key] = train(build_config({**raw, "engine": words[0]}), progress=False)
            except Exception as e:  # noqa: BLE001 - kept, and raised to each check that needs this run
                self.results[key] = e
        if isinstance(self.results[key], Exception):
            raise self.results[key]
        return self.results[key]

    def dropout_round(self, every: bool):
        """(the round's work, its uploads) of a round after the dropout run's, planned and trained by its
        module, in which some (``every``: all) of the sampled clients dropped out."""
        if every not in self.rounds:
            module = self.run("loop dropout")
            K = module.cfg.clients_per_round
            t = next(t for t in range(ROUNDS, ROUNDS + 1000)
                     if (lambda d: d == K if every else 0 < d < K)(int(module.planner.plan(t).dropped.sum())))
            work = module.prepare_round(t)
            self.rounds[every] = work, module.train_clients(work)[0]
        return self.rounds[every]

    def aggregated(self, plan, uploads) -> tuple:
        """(u, state_dict, round_metrics) of ``aggregate`` on a copy of the dropout run's algorithm."""
        module = self.run("loop dropout")
        algo = copy.deepcopy(module.algorithm)
        with torch.no_grad():
            u = algo.aggregate(module.w.detach().clone(), {k: v.clone() for k, v in uploads.items()}, plan)
        return u, algo.state_dict(), algo.round_metrics(plan)

    # ----- the checks -----------------------------------------------------------------------------
    def rowwise_holds(self) -> None:
        vmapped = self.run("vectorized vmapped")
        fix = ("make client_step and client_final row-wise (state (K, n), reductions along dim=-1, every upload "
               "(K, ...)) or declare rowwise = False")
        try:
            rows = self.run("vectorized")
        except Exception as e:  # noqa: BLE001 - what the stacked rows raised is the finding
            self.raised[str(_raised(e, ""))] = "rowwise"
            hook, at = origin(e)
            raise _Broken(f"rowwise: declared True, but {hook or 'the client code'} raises on the stacked clients "
                          f"({type(e).__name__}: {first_line(e)}){at}; {fix}", "rowwise") from None
        if not torch.allclose(rows.w, vmapped.w, **ROWS_AGREE):
            raise _Broken(f"rowwise: declared True, but client_step/client_final on the stacked clients differ from "
                          f"each client alone (under vmap) by {gap(rows.w, vmapped.w):.3g} in the final model; {fix}")

    def engines_agree(self, setting: str) -> None:
        loop, vec = self.run("loop" + setting), self.run("vectorized" + setting)
        what = "with clients dropping out" if setting else "with stragglers"
        advice = ("the client functions must be pure functions of their arguments (no state kept on self, no "
                  "in-place writes, the model only through ops)")
        if not torch.allclose(vec.w, loop.w, **ENGINES_AGREE):
            if self.twin != self.name and torch.allclose(self.run("vectorized vmapped" + setting).w, loop.w,
                                                         **ENGINES_AGREE):   # under vmap the same code agrees
                raise _Broken(f"rowwise: the vectorized engine ends {gap(vec.w, loop.w):.3g} from the loop engine "
                              f"(final model, {what}) on its row-wise path alone: the same client code under vmap "
                              "agrees with the loop (see rowwise above)", "rowwise")
            raise _Broken(f"{CLIENT_HOOKS}: the loop and vectorized engines end {gap(vec.w, loop.w):.3g} apart "
                          f"(final model, {what}; allowed: rtol 1e-4, atol 1e-5); {advice}")
        for a, b in zip(loop.history, vec.history):
            x, y = a["train/loss"], b["train/loss"]
            if not (math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5) or math.isnan(x) and math.isnan(y)):
                raise _Broken(f"{CLIENT_HOOKS}: train/loss of round {a['round']} is {x:.6g} on the loop engine and "
                              f"{y:.6g} on the vectorized one ({what}); {advice}")

    def same_seed(self) -> None:
        for engine in ("loop", "vectorized vmapped")[:2 if self.vmapped or not self.cls.uses_clients else 1]:
            # vmapped: the row-wise path is the rowwise check's
            first, second = self.run(engine), self.run(engine + " again")
            if not torch.equal(first.w, second.w) or not same(timeless(first.history), timeless(second.history)):
                self.reproducible = False
                if self.drew_torch_random:   # the same cause as the vmap failure above, said there
                    raise _Broken("not checked: a client hook draws from torch's generator (above)", follows=True)
                raise _Broken(f"every hook: the same config and seed, trained twice on the {engine.split()[0]} engine, end "
                              f"{gap(first.w, second.w):.3g} apart (model or metrics); {RANDOM_ADVICE}")

    def state_round_trip(self) -> None:
        algo = self.run("loop").algorithm
        state = algo.state_dict()
        if not isinstance(state, dict):
            raise _Broken(f"state_dict: returned a {type(state).__name__}; return a dict (checkpoints keep it)")
        for key, value in state.items():
            if not checkpoints_keep(value):
                raise _Broken(f"state_dict: state_dict()[{key!r}] is a {type(value).__name__}, which checkpoints "
                              "(torch.save, torch.load(weights_only=True)) do not keep; hold tensors and plain data")
        fresh = self.cls(algo.params, algo.ctx)
        fresh.load_state_dict(copy.deepcopy(state))
        again = fresh.state_dict()
        differ = sorted(k for k in set(state) | set(again) if not same(state.get(k), again.get(k)))
        if differ:
            raise _Broken(f"state_dict/load_state_dict: a fresh instance given load_state_dict(state_dict()) gives "
                          f"back another state_dict ({', '.join(map(repr, differ))}); restore every entry it holds")

    def exact_resume(self) -> None:
        from fedsweep.runs.run import train
        full = self.run("loop")
        cfg = build_config({**tiny_config(self.name, self.params), "engine": "loop"})
        with tempfile.TemporaryDirectory() as folder:
            stopped = train(cfg, progress=False, ckpt_dir=folder, max_rounds=RESUME_AFTER)
            resumed = train(cfg, progress=False, resume=Path(folder) / "last.ckpt")
        if torch.equal(resumed.w, full.w) and same(timeless(resumed.history), timeless(full.history)):
            return
        fresh = self.cls(stopped.algorithm.params, stopped.algorithm.ctx)
        fresh.load_state_dict(copy.deepcopy(stopped.algorithm.state_dict()))
        lost = [k for k, v in vars(stopped.algorithm).items() if not k.startswith("_")
                and isinstance(v, (torch.Tensor, int, float)) and not same(v, getattr(fresh, k, None))]
        hint = f" (not restored: {', '.join('self.' + k for k in lost)})" if lost else ""
        apart = f"{gap(resumed.w, full.w):.3g} away from" if not torch.equal(resumed.w, full.w) else "with other metrics than"
        raise _Broken(f"state_dict/load_state_dict: a run resumed from its checkpoint after round {RESUME_AFTER} ends "
                      f"{apart} the uninterrupted run (it must be bit for bit){hint}; "
                      "keep everything that persists across rounds in state_dict and restore it in load_state_dict")

    def uploads(self) -> None:
        work, uploads = self.dropout_round(every=False)
        K, n = work.plan.num_sampled, self.run("loop dropout").fmodel.dim
        delta = uploads.get("delta")
        if delta is None or tuple(delta.shape) != (K, n) or not delta.is_floating_point():
            got = "no 'delta'" if delta is None else f"'delta' of {delta.dtype}, {tuple(delta.shape[1:])} per client"
            raise _Broken(f"client_final: the uploads ({', '.join(uploads) or 'none'}) hold {got}; 'delta' must be "
                          f"w_i − w^t, of the model's shape ({n},) and float dtype, beside your own keys")
        if not bool(torch.isfinite(delta[work.plan.participated.to(delta.device)]).all()):
            raise _Broken("client_final: 'delta' holds NaN or inf for clients that returned, on a tiny run at lr 0.1")

    def ignores_dropped(self, every: bool) -> None:
        """``aggregate`` of a round where some (``every``: all) clients dropped out gives the same update,
        state and round_metrics when their uploads are replaced by garbage."""
        work, uploads = self.dropout_round(every)
        u, state, metrics = self.aggregated(work.plan, uploads)
        if every and (u.shape != self.run("loop dropout").w.shape or not bool(torch.isfinite(u).all())):
            raise _Broken(f"aggregate: in a round where every sampled client dropped out it returns {u.dtype} of shape "
                          f"{tuple(u.shape)} (NaN or inf: {not bool(torch.isfinite(u).all())}); return a finite update "
                          "of the model's shape (zeros: nothing to average)")
        u_junk, state_junk, metrics_junk = self.aggregated(work.plan, garbage(uploads, work.plan.dropped, GARBAGE))
        if not torch.allclose(u_junk, u, rtol=1e-5, atol=1e-6):
            raise _Broken("aggregate: the update depends on the uploads of clients that dropped out "
                          f"({'all' if every else 'some'} did): garbage in their rows moved it by {gap(u_junk, u):.3g}; "
                          "weight them 0 (self.weights(plan) does) or leave them out with torch.where on plan.participated")
        for what, before, after in (("state_dict", state, state_junk), ("round_metrics", metrics, metrics_junk)):
            differ = sorted(k for k in before if not same(before[k], after.get(k), close=True))
            if differ:
                raise _Broken(f"aggregate: {what} ({', '.join(map(repr, differ))}) depends on the uploads of clients "
                              "that dropped out; leave their part as it was (torch.where on plan.participated)")

    def personal(self) -> None:
        """``personal_models`` of every client (those that took part and those that never did): (N, n), finite,
        the same twice, in the state's dtype and device, and the algorithm's state unchanged by the call
        (evaluation runs between rounds: it must only read)."""
        module = self.run("loop")
        algo = module.algorithm
        w = module.w.detach()
        n, N = w.numel(), algo.ctx.num_clients
        ids = torch.arange(N, device=w.device)
        before = copy.deepcopy(algo.state_dict())
        W = algo.personal_models(w.clone(), ids)
        if W is None:
            return
        if not isinstance(W, torch.Tensor) or W.shape != (N, n) or W.dtype != w.dtype:
            got = f"shape {tuple(W.shape)}, {W.dtype}" if isinstance(W, torch.Tensor) else type(W).__name__
            raise _Broken(f"personal_models: for {N} clients returned {got}; return ({N}, {n}) {w.dtype}: one flat "
                          "model a client, in the order of the ids given (None: the algorithm has none)")
        if not bool(torch.isfinite(W).all()):
            raise _Broken("personal_models: returned non-finite values; a client without a personal model yet is "
                          "served the global model w")
        again = algo.personal_models(w.clone(), ids.flip(0))
        if again is None or not torch.equal(again.flip(0), W):
            raise _Broken("personal_models: the clients' models depend on the order or the number of calls; return "
                          "each client's own model for the ids given")
        changed = sorted(k for k in set(before) | set(algo.state_dict()) if not same(before.get(k), algo.state_dict().get(k)))
        if changed:
            raise _Broken(f"personal_models: changed the algorithm's state ({', '.join(map(repr, changed))}); it is "
                          "called between rounds to evaluate and must only read")

    def declared_metrics(self) -> None:
        """Every name in ``metrics`` is logged by ``round_metrics`` in the tiny run (a sweep may select on
        it), and none of what it logs takes a name of fedsweep's own (``test/...``: it would be overwritten
        or misread)."""
        from fedsweep.runs.summary import FEDSWEEP_PREFIXES
        module = self.run("loop")
        plan = module.planner.plan(ROUNDS)
        own = set(copy.deepcopy(module.algorithm).round_metrics(plan))
        logged = set().union(own, *(set(h) for h in module.history))
        clash = sorted(k for k in own if k.partition("/")[0] in FEDSWEEP_PREFIXES or "/" not in k)
        if clash:
            raise _Broken(f"round_metrics: logs {', '.join(map(repr, clash))}, not of the form <prefix>/<name> with a "
                          f"prefix of its own (fedsweep's: {', '.join(sorted(FEDSWEEP_PREFIXES))}); name it e.g. "
                          f"'{self.name}/{clash[0].rpartition('/')[2]}'")
        missing = [m for m in self.cls.metrics if m not in logged]
        if missing:
            raise _Broken(f"metrics: declares {', '.join(map(repr, missing))}, which round_metrics never logged in "
                          f"{len(module.history)} rounds; declare only what it logs (a sweep selecting on it would wait "
                          "for it in vain)", "metrics")

    def accounting(self, hook: str) -> None:
        """``communication`` or ``compute`` of a real plan with none, 1, ..., K of its clients returning."""
        module = self.run("loop")
        plan = module.planner.plan(ROUNDS)          # nobody drops out, some straggle
        algo, K, zero = copy.deepcopy(module.algorithm), plan.num_sampled, torch.zeros_like(plan.work)
        plans = [replace(plan, dropped=d, work=torch.where(d, zero, plan.work), steps=torch.where(d, zero, plan.steps))
                 for d in (torch.arange(K) >= returned for returned in range(K + 1))]
        counts = [[float(x) for x in (getattr(algo, hook)(p) if hook == "communication" else [algo.compute(p)])]
                  for p in plans]
        shown = ", ".join(f"{returned} returned: {'/'.join(f'{x:g}' for x in c)}" for returned, c in enumerate(counts))
        what = "models up/down" if hook == "communication" else "gradient evaluations"
        if not all(math.isfinite(x) and x >= 0 for c in counts for x in c):
            raise _Broken(f"{hook}: the {what} must be finite and ≥ 0 ({shown}, of {K} sampled)")
        if counts[0][0] != 0:
            fix = ("uploads" if hook == "communication" else "steps (plan.steps: 0 for one that dropped out) and probes")
            raise _Broken(f"{hook}: {counts[0][0]:g} {what.replace('/down', '')} in a round where none of the {K} "
                          f"sampled clients returned; count only the {fix} of clients that returned (plan.participated)")
        ups = [c[0] for c in counts]
        if hook == "communication" and (any(b < a for a, b in zip(ups, ups[1:])) or self.cls.uses_clients and not ups[-1]):
            raise _Broken(f"communication: the models uploaded do not grow with the clients that returned ({shown}); "
                          "count each returning client's uploads")


# ----- helpers -------------------------------------------------------------------------------------

def _raised(e: BaseException, check_hook: str = "the run") -> _Broken:
    """An error raised in a run, in one line naming the hook it was raised in (else the check's)."""
    hook, message = hook_error(e, check_hook)
    return _Broken(message, hook)
