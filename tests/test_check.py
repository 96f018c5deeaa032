"""``fedsweep check`` (fedsweep/testing.py): every shipped algorithm passes it, and algorithms that break the
contract, written as plugins the way a user writes one, fail it with a line naming the broken hook."""
from __future__ import annotations

import sys
import textwrap

import pytest

from fedsweep.cli import main
from fedsweep.config.registry import ALGORITHMS


def _shipped() -> list[str]:
    return [e.name for e in ALGORITHMS.entries() if e.builtin]


def _failed_lines(out: str) -> list[str]:
    return [line.removeprefix("FAILED  ") for line in out.splitlines() if line.startswith("FAILED  ")]


#: options that change what a client uploads or what the server keeps, checked beside each default
OPTIONS = [("scaffold", ["algorithm.option=1"]), ("fedlga", ["algorithm.grad_source=last"]),
           ("fedsoftmax", ["algorithm.optimal_loss=running_min"]), ("fednova", ["algorithm.momentum=0.5", "algorithm.mu=0.1"])]


@pytest.mark.parametrize("name, options", [(n, []) for n in _shipped()] + OPTIONS,
                         ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_every_shipped_algorithm_passes(name, options, capsys):
    code = main(["check", name, *(arg for option in options for arg in ("--set", option))])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.strip().splitlines()
    assert not _failed_lines(out) and len(lines) >= 9 and all(line.startswith("ok      ") for line in lines[:-1])
    assert lines[-1].startswith(f"{name}: all {len(lines) - 1} checks passed")


#: name -> (the plugin's class body, the hook every failed line must name, what the first failed line must say)
BROKEN = {
    # branches on a tensor's value: the loop engine runs it, vmap cannot
    "branchy_step": ('''
        def client_step(self, state, batch, ops, lr, shared):
            loss, g = ops.grad(state["w"], batch)
            if loss > 1:
                g = 0.5 * g
            return {**state, "w": state["w"] - lr * g}
        ''', "client_step", "torch.where"),
    # declared row-wise, but the norm is taken over all K stacked rows at once
    "whole_norm": ('''
        rowwise = True

        def client_final(self, state, w0, ops, probe):
            delta = state["w"] - w0
            return {"delta": delta / (1 + delta.norm())}
        ''', "rowwise", "differ from each client alone"),
    # declared row-wise, but one number for all clients is uploaded: the stacked rows raise
    "scalar_upload": ('''
        rowwise = True

        def client_final(self, state, w0, ops, probe):
            return {"delta": state["w"] - w0, "scale": w0.norm()}
        ''', "rowwise", "raises on the stacked clients"),
    # server momentum kept in an attribute that state_dict does not hold: a resumed run restarts it
    "forgetful_momentum": ('''
        def __init__(self, params, ctx):
            super().__init__(params, ctx)
            self.m = None

        def aggregate(self, w, uploads, plan):
            u = super().aggregate(w, uploads, plan)
            self.m = u if self.m is None else 0.9 * self.m + u
            return self.m
        ''', "state_dict/load_state_dict", "not restored: self.m"),
    # averages every sampled client's upload, the dropped ones' too
    "mean_of_all": ('''
        def aggregate(self, w, uploads, plan):
            return uploads["delta"].mean(0)
        ''', "aggregate", "depends on the uploads of clients that dropped out"),
    # counts an upload from every sampled client, returned or not
    "counts_dropped": ('''
        def communication(self, plan):
            return float(plan.num_sampled), float(plan.num_sampled)
        ''', "communication", "none of the 4 sampled clients returned"),
    # declares a metric round_metrics never logs: a sweep selecting on it would wait for it in vain
    "silent_metric": ('''
        metrics = ("silent_metric/spread",)

        def round_metrics(self, plan):
            return {"silent_metric/mean": 1.0}
        ''', "metrics", "declares 'silent_metric/spread', which round_metrics never logged"),
    # logs under fedsweep's own prefix: read as fedsweep's test metric
    "test_clash": ('''
        def round_metrics(self, plan):
            return {"test/spread": 1.0}
        ''', "round_metrics", "logs 'test/spread', not of the form <prefix>/<name>"),
    # one personal model for all clients: per-client evaluation would score the wrong rows
    "one_personal": ('''
        def personal_models(self, w, clients):
            return w.unsqueeze(0)
        ''', "personal_models", "returned shape (1, "),
}


@pytest.fixture
def plugin(tmp_path):
    """Writes ``check_<name>.py`` registering algorithm ``name`` (a subclass of fedsweep.Algorithm with
    ``body``); the algorithm and its module are forgotten after the test."""
    written = []

    def write(name: str, body: str):
        path = tmp_path / f"check_{name}.py"
        path.write_text("import fedsweep\nfrom pydantic import BaseModel, ConfigDict\n\n\n@fedsweep.register_algorithm\n"
                        f"class Broken(fedsweep.Algorithm):\n    name = {name!r}\n"
                        + textwrap.indent(textwrap.dedent(body), "    "))
        written.append(name)
        return path
    yield write
    for name in written:
        ALGORITHMS.remove(name)
        sys.modules.pop(f"check_{name}", None)


@pytest.mark.parametrize("name", BROKEN)
def test_a_broken_algorithm_fails_naming_the_hook(name, plugin, capsys):
    body, hook, says = BROKEN[name]
    code = main(["check", name, "--plugins", str(plugin(name, body))])
    out = capsys.readouterr().out
    failed = _failed_lines(out)
    assert code == 1 and failed, out
    assert {line.split(":")[0] for line in failed} == {hook}, out
    assert says in failed[0], out
    assert out.strip().splitlines()[-1].startswith(f"{name}: {len(failed)} of ")


def test_a_plugin_named_by_a_run_config_and_a_parameter_set(tmp_path, plugin, capsys):
    """--plugins also takes a run config naming the plugin; --set gives the algorithm's own parameters."""
    plugin("scaled_fedavg", '''
        class Params(BaseModel):
            model_config = ConfigDict(extra="forbid")
            scale: float = 1.0

        def aggregate(self, w, uploads, plan):
            return self.params.scale * super().aggregate(w, uploads, plan)
        ''')
    config = tmp_path / "run.yaml"
    config.write_text("plugins: [check_scaled_fedavg.py]\nalgorithm: {name: scaled_fedavg}\n")
    assert main(["check", "scaled_fedavg", "--plugins", str(config), "--set", "algorithm.scale=0.5"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("scaled_fedavg: all ")
    assert main(["check", "scaled_fedavg", "--set", "algorithm.scale=x"]) == 2
    assert capsys.readouterr().err.startswith("fedsweep: error: algorithm.scale: ")


@pytest.mark.parametrize("args, says", [
    (["nope"], "algorithm.name: unknown algorithm 'nope'"),
    (["fedavg", "--plugins", "{tmp}/missing.py"], "--plugins {tmp}/missing.py: no such file or folder"),
    (["fedavg", "--set", "local.lr=0.1"], "--set local.lr=0.1: fedsweep check takes the algorithm's own parameters"),
    (["fedprox", "--set", "algorithm.nu=1"], "algorithm.nu: unknown key; allowed for fedprox"),
])
def test_user_errors_are_one_line_and_exit_2(args, says, tmp_path, capsys):
    args = [a.format(tmp=tmp_path) for a in args]
    assert main(["check", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"fedsweep: error: {says.format(tmp=tmp_path)}"), captured.err


def test_check_algorithm_in_python():
    """The Python form: all-ok checks for FedAvg; AlgorithmContractError listing the failed checks for a class
    that breaks the contract, registered only while it is checked; a name clash is one failed check."""
    from fedsweep.algorithms.base import Algorithm
    from fedsweep.algorithms.fedavg import FedAvg
    from fedsweep.testing import AlgorithmContractError, Check, check_algorithm

    seen: list[Check] = []
    checks = check_algorithm(FedAvg, progress=seen.append)
    assert checks == seen and all(c.ok and c.message == "" and c.seconds >= 0 for c in checks)
    assert {"rowwise", "state_dict/load_state_dict", "aggregate", "communication", "compute"} <= {c.hook for c in checks}

    class CountsDroppedWork(Algorithm):
        name = "counts_dropped_work"

        def compute(self, plan):
            return float(plan.work.numel())          # every sampled client's, returned or not

    with pytest.raises(AlgorithmContractError) as raised:
        check_algorithm(CountsDroppedWork)
    message = str(raised.value)
    assert message.startswith("counts_dropped_work breaks the algorithm contract (1 of ")
    assert message.splitlines()[1].strip().startswith("compute: 4 gradient evaluations in a round where none")
    assert [c.hook for c in raised.value.checks if not c.ok] == ["compute"]
    assert "counts_dropped_work" not in ALGORITHMS.names()

    class Clash(Algorithm):
        name = "fedavg"

    (refused,) = check_algorithm(Clash, raise_on_failure=False)
    assert not refused.ok and refused.hook == "name" and "registered twice" in refused.message
    assert ALGORITHMS.get("fedavg").obj is FedAvg
