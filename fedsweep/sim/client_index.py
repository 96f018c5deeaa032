"""Each client's sample indices as one compressed array (CSR): client i holds
``values[offsets[i]:offsets[i + 1]]``, int64 indices into ``x_train``.

Memory is one int64 per training sample plus one per client, whatever the clients' sizes. A padded
``(N, n_max)`` table is not: FedProx's lognormal client sizes make n_max grow with N (1.8 GB of padding
at N = 10,000, 150 GB at N = 100,000). A round reads its K sampled clients' rows only
(:meth:`ClientIndex.gather`, :meth:`ClientIndex.rows`), so its cost does not depend on N.

A :class:`ClientIndex` reads like the list of per-client tensors it replaces: ``len``, ``index[i]`` (a
view) and iteration over the clients in order.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from fedsweep.util.lazy import torch


class ClientIndex:
    """``offsets`` int64 (N + 1,) from 0, non-decreasing; ``values`` int64 (offsets[-1],), on one device."""

    def __init__(self, offsets: "torch.Tensor", values: "torch.Tensor"):
        self.offsets, self.values = offsets, values

    @classmethod
    def from_parts(cls, parts: Sequence) -> "ClientIndex":
        """From one index array (numpy or torch) per client, in client order."""
        if isinstance(parts, ClientIndex):
            return parts
        sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        if len(parts) and isinstance(parts[0], torch.Tensor):
            values = torch.cat([p.cpu().long() for p in parts])
        else:
            values = torch.from_numpy(np.concatenate(parts).astype(np.int64, copy=False) if len(parts)
                                      else np.zeros(0, dtype=np.int64))
        return cls(torch.from_numpy(offsets), values)

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    def __getitem__(self, i: int) -> "torch.Tensor":
        i = int(i)
        if not -len(self) <= i < len(self):
            raise IndexError(f"client {i} of {len(self)}")
        i %= len(self)
        return self.values[int(self.offsets[i]):int(self.offsets[i + 1])]

    def __iter__(self) -> Iterator["torch.Tensor"]:
        bounds = self.offsets.tolist()
        return (self.values[a:b] for a, b in zip(bounds[:-1], bounds[1:]))

    @property
    def sizes(self) -> "torch.Tensor":
        """int64 (N,) n_i, on the device of the index."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def max_size(self) -> int:
        """The largest client's size (computed once: O(N))."""
        if getattr(self, "_max_size", None) is None:
            self._max_size = int(self.sizes.max()) if len(self) else 0
        return self._max_size

    def to(self, device) -> "ClientIndex":
        return ClientIndex(self.offsets.to(device), self.values.to(device))

    def gather(self, clients: "torch.Tensor", local: "torch.Tensor") -> "torch.Tensor":
        """``index[clients[k]][local[k, ...]]`` for every k at once; ``clients`` broadcasts against
        ``local`` (e.g. (K, 1, 1) against (K, S, B)) and every ``local`` must lie within its client's size."""
        return self.values[self.offsets[clients] + local]

    def rows(self, clients: "torch.Tensor", width: int | None = None) -> tuple["torch.Tensor", "torch.Tensor"]:
        """The clients' whole index lists padded to ``width`` (default: the largest client's size, N's
        largest): ``(index, mask)`` of shape (K, width), padding 0 and masked out."""
        sizes = self.offsets[clients + 1] - self.offsets[clients]   # the K clients' only: not all N's
        width = self.max_size if width is None else width
        pos = torch.arange(width, device=self.offsets.device).view(1, width)
        mask = pos < sizes.view(-1, 1)
        # padding reads entry 0, not the client's offset: an empty last client's offset is past the end
        flat = torch.where(mask, self.offsets[clients].view(-1, 1) + pos, torch.zeros_like(pos))
        if self.values.numel() == 0:
            return flat, mask
        index = self.values[flat]
        return torch.where(mask, index, torch.zeros_like(index)), mask

    def nbytes(self) -> int:
        return self.offsets.element_size() * self.offsets.numel() + self.values.element_size() * self.values.numel()
