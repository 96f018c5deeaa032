"""Checks of a run config that read two of its sections (``RunConfig``'s cross-checks call them);
each raises a one-line :class:`ConfigError` naming the key."""
from __future__ import annotations

from pathlib import Path

from fedsweep.util.errors import ConfigError


def check_local_work(h, e: int) -> None:
    """The ``heterogeneity`` model ``h`` fits E = ``local.steps`` (docs/design.md §2.3)."""
    if h.kind == "stragglers":
        if h.rho > 0 and e < 2:
            raise ConfigError("heterogeneity.rho: stragglers need local.steps ≥ 2 (a straggler does fewer than E)")
        if h.tau_max is not None and h.tau_max > max(e - 1, 1):
            raise ConfigError(f"heterogeneity.tau_max: {h.tau_max} exceeds local.steps−1 = {e - 1}; "
                              f"allowed 1..{max(e - 1, 1)}")
    if h.kind == "uniform":
        hi = h.max_steps if h.max_steps is not None else e
        if not h.min_steps <= hi <= e:
            raise ConfigError(f"heterogeneity.max_steps: need min_steps ≤ max_steps ≤ local.steps, "
                              f"got {h.min_steps}, {hi}, {e}")
    if h.kind == "profiles" and h.trace is not None and not Path(h.trace).is_file():
        raise ConfigError(f"heterogeneity.trace: file not found: {h.trace}")


def check_validation_clients(data, evaluation) -> None:
    """``eval.validation_clients`` samples the clients of a federated validation split: it needs one
    (``data.validation_fraction`` > 0, ``data.validation: federated``) and at most N clients."""
    wanted = evaluation.validation_clients
    if wanted is None:
        return
    if data.validation_fraction == 0:
        raise ConfigError("eval.validation_clients: there is no validation split to sample clients of; set "
                          "data.validation_fraction > 0 with data.validation: federated, "
                          "or unset eval.validation_clients")
    if data.validation != "federated":
        raise ConfigError("eval.validation_clients: a central validation split (data.validation: central) is held "
                          "by no client and evaluated whole; set data.validation: federated, "
                          "or unset eval.validation_clients")
    if wanted > data.num_clients:
        raise ConfigError(f"eval.validation_clients: {wanted} is more than data.num_clients N={data.num_clients}; "
                          f"allowed 1..{data.num_clients} (unset: every client)")


def unseen_count(share: float, num_clients: int) -> int:
    """How many of N clients ``eval.unseen_clients`` holds out of training: round(share·N), at least one
    for a share above 0."""
    return max(1, round(share * num_clients)) if share else 0


def check_client_evaluation(data, evaluation, clients_per_round: int) -> None:
    """``eval.clients``: at least 1 and at most N; fine-tuning and unseen clients are scored per client, so
    they need them; unseen clients leave at least K clients to train."""
    wanted = evaluation.clients
    if isinstance(wanted, int) and not 1 <= wanted <= data.num_clients:
        raise ConfigError(f"eval.clients: {wanted} clients cannot be drawn from data.num_clients N={data.num_clients}; "
                          f"allowed 1..{data.num_clients} or all (unset: no per-client evaluation)")
    if wanted is None:
        for key in ("finetune_steps", "finetune_lr", "unseen_clients"):
            if key in evaluation.model_fields_set and getattr(evaluation, key):
                what = "unseen clients are" if key == "unseen_clients" else "fine-tuned models are"
                raise ConfigError(f"eval.{key}: {what} scored per client; set eval.clients "
                                  f"(all, or how many to draw) or unset eval.{key}")
    share = evaluation.unseen_clients
    if share:
        unseen = unseen_count(share, data.num_clients)
        if data.num_clients - unseen < clients_per_round:
            raise ConfigError(f"eval.unseen_clients: {share} of data.num_clients N={data.num_clients} holds {unseen} "
                              f"clients out of training, leaving {data.num_clients - unseen}, fewer than "
                              f"clients_per_round K={clients_per_round}; allowed: a share leaving at least K")


def check_leaf_keys(data) -> None:
    """``data.name: leaf`` reads LEAF's files from ``data.root``, which fedsweep cannot fetch: LEAF
    makes them with its own scripts (its preprocess.sh samples and splits the users)."""
    if not data.root:
        raise ConfigError("data.root: dataset 'leaf' reads LEAF's JSON files; set data.root to the folder holding "
                          "their train/ and test/ folders (LEAF's data/<dataset>/data, which its preprocess.sh "
                          "writes)")
    if data.download:
        raise ConfigError("data.download: fedsweep cannot fetch LEAF's files; make them with LEAF's preprocess.sh "
                          "(e.g. ./preprocess.sh -s niid --sf 1.0 -k 0 -t sample in leaf/data/femnist) and set "
                          "data.download: false")
