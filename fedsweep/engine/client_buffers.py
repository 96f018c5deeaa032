"""Each client's own copy of the model's buffers (BatchNorm's running statistics), for an algorithm that
keeps them on the clients (``Algorithm.local_buffers``: FedBN).

The model's buffers are not in w: a training forward pass updates them in place (BatchNorm's running
mean and variance). Shared, every client's pass would move one copy, in turn. With a store, client k
trains on its own copy (the global one's, at its first round), kept only if it returned
(``plan.participated``, as ``ClientRows`` keeps rows), and per-client evaluation scores a client's personal
model with its copy (``of(client, keep=False)``). The global copy is then never trained: the global
model's BatchNorm statistics stay as initialized. Checkpoints keep the store, so a resume is exact.
"""
from __future__ import annotations

import contextlib

import torch


class ClientBuffers:
    def __init__(self, fmodel):
        self.fmodel = fmodel
        self.own: dict[int, dict[str, torch.Tensor]] = {}

    def held(self, client: int) -> bool:
        return client in self.own

    @contextlib.contextmanager
    def of(self, client: int, keep: bool = True):
        """The model's buffers are ``client``'s own inside (a copy of the global ones where it has none
        yet); with ``keep``, what the forward passes made of them is the client's afterwards."""
        shared = self.fmodel.buffers
        mine = self.own.get(client)
        if mine is None:
            mine = {k: v.clone() for k, v in shared.items()}
        self.fmodel.buffers = mine
        try:
            yield
        finally:
            self.fmodel.buffers = shared
            if keep:
                self.own[client] = mine

    def state_dict(self) -> dict:
        ids = sorted(self.own)
        return {"clients": torch.tensor(ids, dtype=torch.int64),
                **{name: torch.stack([self.own[c][name].detach().cpu() for c in ids]) if ids else torch.zeros(0)
                   for name in self.fmodel.buffers}}

    def load_state_dict(self, state: dict) -> None:
        device = {k: v.device for k, v in self.fmodel.buffers.items()}
        self.own = {int(c): {name: state[name][i].to(device[name]) for name in self.fmodel.buffers}
                    for i, c in enumerate(state["clients"].tolist())}
