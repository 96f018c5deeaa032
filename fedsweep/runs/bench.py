"""``fedsweep bench``: rounds per second of the engines, side by side in one process.

Three ways to train the K clients of a FedAvg round are timed on the same plan and batches:

- ``torch_loop``: the usual PyTorch code — one ``nn.Module`` copy and ``torch.optim.SGD`` per
  client, ``loss.backward(); opt.step()`` (a benchmark-only baseline: the loop that a naive
  ``vmap(grad)`` beat 4.6× for 10 MLP clients on 2 cores, docs/design.md §7);
- ``loop``: fedsweep's reference engine (flat vectors, plain autograd, one client at a time);
- ``vectorized``: all K at once with torch.func.

Each row also says which engine ``engine: auto`` picks for that model and device, and which one was
faster: the rule (``fedsweep.engine.choose_engine``) is checked against the measurement.

Each case runs the real round (plan, batches, local training, aggregation, server step) through
Lightning on synthetic data of the model's shape (:func:`shape`: the ``input_shape`` it was registered
with: digits' 1×8×8 for the MLP and CNN, MNIST's 1×28×28 for LeNet-5, CIFAR's 3×32×32 for ResNet-18
and MobileNetV2; a plugin's model that names none, 1×8×8; 10 classes, 30 samples per client), so it needs no dataset and measures the engines rather than I/O. One warm-up
round, then ``--rounds`` timed rounds; the median round time is reported. Output: a table and, with
``--json``, a file.
"""
from __future__ import annotations

import json
import platform
import statistics
import sys

import torch

from fedsweep.config.schema import ConfigError, build_config
from fedsweep.data import FederatedData


def shape(model: str) -> tuple[int, ...]:
    """The input a model is benchmarked on: the shape of the data it is made for, as registered."""
    from fedsweep.config.registry import MODELS
    return MODELS.get(model).extra.get("input_shape") or (1, 8, 8)


def synthetic(num_clients: int, shape: tuple[int, ...] = (1, 8, 8), per_client: int = 30,
              seed: int = 0) -> FederatedData:
    g = torch.Generator().manual_seed(seed)
    n = num_clients * per_client
    x = torch.rand(n, *shape, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    idx = list(torch.arange(n).view(num_clients, per_client))
    return FederatedData("bench", x, y, x[:200], y[:200], idx, 10, shape)


class TorchLoop:
    """Conventional per-client training (FedAvg clients only): a module and an optimizer per client."""

    def __init__(self, fmodel, algorithm, data):
        import copy
        self.fmodel, self.data = fmodel, data
        self.net = copy.deepcopy(fmodel.module)
        self.ops = None

    def run(self, w, plan, batches, probe, shared, own):
        import torch.nn.functional as F
        deltas, losses = [], []
        for k in range(plan.num_sampled):
            self.fmodel.load_into(w, self.net)
            opt = torch.optim.SGD(self.net.parameters(), lr=plan.lr)
            step_losses = []
            for s in range(int(plan.steps[k])):
                keep = batches.index[k, s][batches.mask[k, s]]
                opt.zero_grad()
                loss = F.cross_entropy(self.net(self.data.x[keep]), self.data.y[keep])
                loss.backward()
                opt.step()
                step_losses.append(loss.detach())
            deltas.append(self.fmodel.flatten(self.net) - w)
            losses.append(torch.stack(step_losses).mean())
        return {"delta": torch.stack(deltas)}, torch.stack(losses)


def time_case(model: str, K: int, engine: str, rounds: int, device: str, algorithm: str = "fedavg",
              matmul_precision: str = "highest") -> float:
    from fedsweep.runs.run import train
    N = max(K, 100)
    baseline = engine == "torch_loop"
    cfg = build_config({
        "rounds": rounds + 1, "engine": "loop" if baseline else engine, "device": device, "clients_per_round": K,
        "data": {"num_clients": N}, "model": {"name": model},
        "local": {"steps": 5, "batch_size": 10, "lr": 0.05},
        "heterogeneity": {"kind": "stragglers", "rho": 0.5},
        "algorithm": {"name": algorithm}, "eval": {"every": 10_000}, "mlflow": {"enabled": False},
        "matmul_precision": matmul_precision,
    })
    callbacks = [_SwapEngine()] if baseline else []
    module = train(cfg, progress=False, data=synthetic(N, shape(model)), callbacks=callbacks)
    return statistics.median(h["round/seconds"] for h in module.history[1:])


def _auto_choice(model: str, device: str) -> str:
    """What ``engine: auto`` picks for ``model`` on ``device`` (the rule the table checks)."""
    from fedsweep.config.schema import ModelConfig
    from fedsweep.engine import choose_engine
    from fedsweep.sim.models import build_model
    return choose_engine("auto", build_model(ModelConfig(name=model), shape(model), 10), device)


class _SwapEngine:
    """Installs the TorchLoop baseline in place of the module's engine once it is set up."""

    def __new__(cls):
        import lightning as L

        class Swap(L.Callback):
            def on_train_start(self, trainer, module):
                module.engine = TorchLoop(module.fmodel, module.algorithm, module.engine.data)
        return Swap()


def main(args) -> int:
    from fedsweep.config.listing import load_file_plugins
    from fedsweep.config.registry import MODELS
    if getattr(args, "plugins", None):
        load_file_plugins(args.plugins, "--plugins")
    for model in args.models:
        entry = MODELS.get(model)   # an unknown one: one line naming the allowed
        if entry.options.model_fields and any(f.is_required() for f in entry.options.model_fields.values()):
            raise ConfigError(f"--models: model {model!r} has options without defaults; bench times models as they "
                              "are registered")
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else \
        ("cpu" if args.device == "auto" else args.device)
    results = []
    print(f"{'model':<7}{'K':>5}{'torch-loop ms':>15}{'loop ms':>10}{'vect ms':>10}{'vect r/s':>10}"
          f"{'vs loop':>9}{'vs torch-loop':>15}{'auto picks':>12}", file=sys.stderr)
    for model in args.models:
        for K in args.clients:
            torch_loop, loop, vect = (time_case(model, K, engine, args.rounds, device,
                                                matmul_precision=args.matmul_precision)
                                      for engine in ("torch_loop", "loop", "vectorized"))
            auto = _auto_choice(model, device)
            faster = "loop" if loop < vect else "vectorized"
            row = {"model": model, "clients_per_round": K, "auto_picks": auto, "faster_here": faster,
                   "torch_loop_seconds_per_round": torch_loop, "loop_seconds_per_round": loop,
                   "vectorized_seconds_per_round": vect, "loop_rounds_per_second": 1 / loop,
                   "vectorized_rounds_per_second": 1 / vect, "speedup": loop / vect,
                   "speedup_vs_torch_loop": torch_loop / vect}
            results.append(row)
            print(f"{model:<7}{K:>5}{1000 * torch_loop:>15.1f}{1000 * loop:>10.1f}{1000 * vect:>10.1f}"
                  f"{1 / vect:>10.1f}{loop / vect:>8.1f}x{torch_loop / vect:>14.1f}x{auto:>12}"
                  f"{'' if auto == faster else ' (slower one!)'}", file=sys.stderr, flush=True)
    report = {"device": device, "torch": torch.__version__, "threads": torch.get_num_threads(),
              "machine": platform.machine(), "matmul_precision": args.matmul_precision, "local_steps": 5,
              "batch_size": 10, "rounds_timed": args.rounds,
              "data": "synthetic, each model's registered input shape (fedsweep.runs.bench.shape), 10 classes, 30 samples/client",
              "results": results}
    text = json.dumps(report, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)
    return 0
