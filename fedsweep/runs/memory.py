"""What a run holds in memory: said in one line before its first round, and refused before training
when the per-client state it may grow to cannot fit.

A round touches its K sampled clients only, so what grows with N is the data (each client's samples,
held once; docs/design.md §2.4) and the per-client state of algorithms that keep one (SCAFFOLD's c_i,
FedDyn's ∇L_i: ``Algorithm.client_rows`` rows of n numbers a client, allocated when the client first
takes part; :mod:`fedsweep.algorithms.client_rows`). At most min(N, rounds·K) clients take part, so
that bound times a row's size is what the state can reach; it is checked against the memory the
device has free (``MemAvailable`` of /proc/meminfo on a CPU, ``torch.cuda.mem_get_info`` on a GPU).
"""
from __future__ import annotations

from dataclasses import dataclass

from fedsweep.config.schema import ConfigError, RunConfig


def fmt_bytes(n: float) -> str:
    """1,234,567 -> '1.2 MB' (decimal units, as ``free -h --si`` and MLflow show them)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError


@dataclass
class StateBound:
    """The per-client state a run may grow to: ``rows`` rows of ``row_bytes`` for each of up to
    ``clients`` clients."""
    rows: int
    row_bytes: int
    clients: int

    @property
    def per_client(self) -> int:
        return self.rows * self.row_bytes

    @property
    def total(self) -> int:
        return self.per_client * self.clients


def state_bound(cfg: RunConfig, dim: int, element_size: int = 4) -> StateBound:
    """The per-client state ``cfg``'s algorithm may hold, for a model of ``dim`` parameters."""
    from fedsweep.algorithms import get_algorithm_class
    rows = get_algorithm_class(cfg.algorithm.name).client_rows
    clients = min(cfg.data.num_clients, cfg.rounds * cfg.clients_per_round) if rows else 0
    return StateBound(rows, dim * element_size, clients)


def available_bytes(device) -> int | None:
    """Memory free for this process on ``device``: CUDA's free memory, or Linux's MemAvailable; None
    where it cannot be read (then nothing is refused)."""
    import torch
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_state_fits(bounds: list[tuple[RunConfig, StateBound]], device) -> None:
    """One line naming the algorithm and what it needs when the runs' per-client state (summed: a pack
    trains them in one process) could outgrow the free memory of ``device``."""
    need = sum(b.total for _, b in bounds)
    free = available_bytes(device)
    if not need or free is None or need <= free:
        return
    cfg, b = max(bounds, key=lambda cb: cb[1].total)
    runs = f" ({len(bounds)} runs in this process)" if len(bounds) > 1 else ""
    raise ConfigError(
        f"algorithm.name: {cfg.algorithm.name} keeps {b.rows} row(s) of {fmt_bytes(b.row_bytes)} for each client "
        f"that takes part, up to min(N, rounds·K) = {b.clients:,} clients: {fmt_bytes(need)}{runs}, more than the "
        f"{fmt_bytes(free)} free on {device}; lower rounds, data.num_clients or the model's size, or use an "
        "algorithm without per-client state")


def data_bytes(data) -> int:
    """The bytes of a FederatedData's tensors and client indices."""
    tensors = [data.x_train, data.y_train, data.x_test, data.y_test, data.x_val, data.y_val, data.server_pool]
    total = sum(t.numel() * t.element_size() for t in tensors if t is not None)
    return total + data.client_indices.nbytes() + (data.val_indices.nbytes() if data.val_indices is not None else 0)


def memory_line(cfg: RunConfig, data, dim: int) -> str:
    """'memory: data 2.1 GB, model 112 kB; per-client state up to ...' for the run's start."""
    text = f"memory: data {fmt_bytes(data_bytes(data))}, model {fmt_bytes(dim * 4)}"
    b = state_bound(cfg, dim)
    if b.rows:
        text += (f"; {cfg.algorithm.name} keeps {fmt_bytes(b.per_client)} for each client that takes part "
                 f"(from its first round): up to {fmt_bytes(b.total)} for min(N, rounds·K) = {b.clients:,} clients")
    return text


def state_line(algorithm, num_clients: int) -> str | None:
    """'per-client state: rows for 30 of 100,000 clients (3.41 MB), 4.44 MB allocated' at a run's end
    (allocated: with the room the rows grow into and the client-to-row map); None without any."""
    held, clients, used = algorithm.client_state_held()
    if not clients:
        return None
    return (f"per-client state: rows for the {clients:,} of {num_clients:,} clients that took part "
            f"({fmt_bytes(used)}), {fmt_bytes(held)} allocated")
