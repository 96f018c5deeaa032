"""Per-client state that the server keeps (SCAFFOLD's c_i, FedDyn's ∇L_i): one row of n numbers for each
client that has taken part, zero for every other.

The papers write it as an (N, n) table that starts at zero. Allocated whole, that table costs N·n
numbers whether or not a client ever takes part: 11 GB at N = 100,000 for a 28k-parameter MLP, for a
sweep that samples a few thousand of them. :class:`ClientRows` holds the same table sparsely: a row is
allocated when its client first takes part, a client never seen reads as zeros, and the numbers are
those of the dense table exactly (reads copy rows, writes store them; nothing is summed differently).
Its memory is (clients seen) · n numbers plus one int64 a client, reported by :meth:`nbytes` (the run's
memory line and summary) and bounded by :func:`dense_bytes` (the refusal before training).
"""
from __future__ import annotations

from fedsweep.util.lazy import torch


def dense_bytes(num_clients: int, dim: int, dtype) -> int:
    """What the rows of all N clients take once every client has taken part."""
    return num_clients * dim * torch.empty(0, dtype=dtype).element_size()


class ClientRows:
    """An (N, n) table of per-client rows, zero until written; rows live on ``device``, the map from
    client to row on the CPU (plan.clients are CPU tensors)."""

    def __init__(self, num_clients: int, dim: int, device, dtype):
        self.num_clients, self.dim, self.device, self.dtype = num_clients, dim, device, dtype
        self.slot = torch.full((num_clients,), -1, dtype=torch.long)   # client -> its row, −1: none yet
        self.clients = torch.zeros(0, dtype=torch.long)                # row -> its client
        self.rows = torch.zeros(0, dim, device=device, dtype=dtype)    # capacity ≥ len(self.clients)

    def __len__(self) -> int:
        """Clients holding a row (those that have taken part)."""
        return int(self.clients.numel())

    def get(self, ids: "torch.Tensor") -> "torch.Tensor":
        """(K, n): the rows of clients ``ids`` (zeros for clients without one)."""
        slots = self.slot[ids.cpu()]
        held = slots >= 0
        if not bool(held.any()):
            return torch.zeros(len(slots), self.dim, device=self.device, dtype=self.dtype)
        out = self.rows[slots.clamp(min=0).to(self.device)]       # one gather, as the dense table's
        if not bool(held.all()):
            out[(~held).to(self.device)] = 0                      # clients without a row read zeros
        return out

    def held(self, ids: "torch.Tensor") -> "torch.Tensor":
        """bool (K,) on the CPU: whether each of clients ``ids`` has a row (has been written)."""
        return self.slot[ids.cpu()] >= 0

    def set(self, ids: "torch.Tensor", values: "torch.Tensor", where: "torch.Tensor | None" = None) -> None:
        """Write the rows of clients ``ids`` (distinct), allocating those they do not have yet; with
        ``where`` (bool, like ``ids``) only theirs where it is true (a dropped client keeps its row, or
        gets none)."""
        ids = ids.cpu()
        if where is not None and not bool(where.all()):
            keep = torch.nonzero(where.cpu()).flatten()
            ids, values = ids[keep], values.index_select(0, keep.to(values.device))
        slots = self.slot[ids]
        new = ids[slots < 0]
        if new.numel():
            start = len(self)
            self._reserve(start + new.numel())
            self.slot[new] = torch.arange(start, start + new.numel())
            self.clients = torch.cat([self.clients, new])
            slots = self.slot[ids]
        self.rows[slots.to(self.device)] = values.to(self.device, self.dtype)

    def _reserve(self, count: int) -> None:
        """Room for ``count`` rows: capacity doubles (amortized O(1) a new client), never past N."""
        if count <= self.rows.shape[0]:
            return
        capacity = min(max(count, 2 * self.rows.shape[0], 16), self.num_clients)
        grown = torch.zeros(capacity, self.dim, device=self.device, dtype=self.dtype)
        grown[: self.rows.shape[0]] = self.rows
        self.rows = grown

    def dense(self) -> "torch.Tensor":
        """The whole (N, n) table (for tests and small N: it allocates N·n numbers)."""
        out = torch.zeros(self.num_clients, self.dim, device=self.device, dtype=self.dtype)
        out[self.clients.to(self.device)] = self.rows[: len(self)]
        return out

    def used_bytes(self) -> int:
        """Bytes of the rows of the clients that hold one."""
        return len(self) * self.dim * self.rows.element_size()

    def nbytes(self) -> int:
        """Bytes held now: the allocated rows (room to grow included) and the client-to-row map."""
        return (self.rows.numel() * self.rows.element_size()
                + (self.slot.numel() + self.clients.numel()) * self.slot.element_size())

    # ----- checkpoints ------------------------------------------------------------------------
    def state_dict(self, name: str) -> dict:
        """``name``: the rows of the clients that hold one (in order of first participation),
        ``name_clients``: those clients, ``name_shape``: (N, n) of the whole table."""
        return {name: self.rows[: len(self)].clone(), f"{name}_clients": self.clients.clone(),
                f"{name}_shape": torch.tensor([self.num_clients, self.dim])}

    def load_state_dict(self, state: dict, name: str, what: str) -> None:
        """Restore :meth:`state_dict`; a state holding ``name`` alone is a whole (N, n) table (as
        checkpoints held it before the rows were kept sparsely), of which the non-zero rows are kept.
        ``what`` names the state in the error for a table of another shape."""
        rows = state[name].to(self.device, self.dtype)
        clients = state.get(f"{name}_clients")
        shape = tuple(int(v) for v in state[f"{name}_shape"]) if clients is not None else tuple(rows.shape)
        if shape != (self.num_clients, self.dim):
            raise ValueError(f"{what} is {shape}; this run needs ({self.num_clients}, {self.dim})")
        if clients is None:
            clients = torch.nonzero((rows != 0).any(1)).flatten().cpu()
            rows = rows[clients.to(self.device)]
        self.__init__(self.num_clients, self.dim, self.device, self.dtype)
        self.set(clients.cpu().long(), rows)
