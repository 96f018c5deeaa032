"""``searcher: optuna``: Optuna's TPE (through Ray Tune's ``OptunaSearch``) over a sweep's slots.

With ``searcher: optuna`` a sweep's trials are slots (:mod:`fedsweep.sweep.search`): one study per method
and grid point, ``num_samples`` configs per study, each config run on every seed. :class:`Studies` is
the Ray Tune searcher that fills them:

- it hands Tune the slots round-robin over the studies (every study's first config, then every
  study's second, ...; a config's seeds one after another), so that a study has its earlier results
  before it draws again, however many trials run at once;
- a config's values come from its study's ``OptunaSearch`` when the config's first seed starts; its
  other seeds get the same values;
- once every seed of a config has ended, its study is told the mean of their ``search.metric`` (a
  seed that failed counts for nothing; a config whose every seed failed is a failed Optuna trial).
  Under ASHA a stopped trial's value is its metric where ASHA stopped it.

Tune saves the searcher's state (studies, what was drawn, what is awaited) with the experiment's, so
``--resume`` continues the search: a config drawn before is not drawn again, and no result is lost.
"""
from __future__ import annotations

import math
import zlib
from collections import Counter
from typing import Any

from ray.tune.search import Searcher

from fedsweep.sweep.search import value_of


def _domain(kind: str, args: list[Any]):
    """A distribution as Ray Tune's search domain, which OptunaSearch turns into Optuna's; a choice
    is drawn as an index, so that its values may be anything a config takes (lists, dicts)."""
    from ray import tune
    if kind == "choice":
        return tune.choice(list(range(len(args))))
    return {"loguniform": tune.loguniform, "uniform": tune.uniform, "quniform": tune.quniform,
            "randint": tune.randint}[kind](*args)


class Studies(Searcher):
    """One Optuna study per method and grid point over the slots of a sweep (the module's docstring).

    ``slots``: ``(sweep trial index, study, config number)`` per trial, one Tune trial each;
    ``spaces``: study -> its sampled keys' ``(kind, args)``; ``seed``: each study's sampler is seeded
    from it and the study's name; ``startup``: configs each study draws at random first."""

    def __init__(self, slots: list[tuple[int, str, int]], spaces: dict[str, dict[str, tuple[str, list]]],
                 metric: str, mode: str, seed: int, startup: int):
        import optuna
        from ray.tune.search.optuna import OptunaSearch
        optuna.logging.set_verbosity(optuna.logging.WARNING)   # not a line per told result
        super().__init__(metric=metric, mode=mode)
        studies = list(spaces)
        self.order = [index for index, _, _ in sorted(slots, key=lambda s: (s[2], studies.index(s[1]), s[0]))]
        self.config_of = {index: (study, number) for index, study, number in slots}
        self.seeds = Counter(self.config_of.values())   # (study, number) -> its seeds' slots
        self.spaces = spaces
        self.studies = {
            study: OptunaSearch({k: _domain(*dist) for k, dist in space.items()}, metric=metric, mode=mode,
                                sampler=optuna.samplers.TPESampler(seed=(seed + zlib.crc32(study.encode())) % 2**32,
                                                                   n_startup_trials=startup))
            for study, space in spaces.items()}
        self.handed = 0                      # slots given to Tune so far, in `order`
        self.drawn: dict[tuple, dict] = {}   # (study, number) -> the config's values
        self.running: dict[str, tuple] = {}  # Tune trial id -> (study, number)
        self.ended: dict[tuple, list] = {}   # (study, number) -> its ended seeds' values (None: failed)

    def suggest(self, trial_id: str) -> dict | None:
        if self.handed == len(self.order):
            return Searcher.FINISHED
        index = self.order[self.handed]
        config = self.config_of[index]
        if config not in self.drawn:
            study, number = config
            raw = self.studies[study].suggest(f"{number}")
            self.drawn[config] = {k: value_of(*self.spaces[study][k], raw[k]) for k in self.spaces[study]}
        self.handed += 1
        self.running[trial_id] = config
        return {"trial": index, "sampled": self.drawn[config]}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        config = self.running.pop(trial_id, None)
        if config is None:
            return
        value = None if error or not result else result.get(self.metric)
        ended = self.ended.setdefault(config, [])
        ended.append(value if isinstance(value, (int, float)) and not math.isnan(value) else None)
        if len(ended) == self.seeds[config]:
            values = [v for v in ended if v is not None]
            study, number = config
            self.studies[study].on_trial_complete(
                f"{number}", result={self.metric: sum(values) / len(values)} if values else None, error=not values)

    def get_state(self) -> dict:
        return dict(self.__dict__)

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        import cloudpickle
        with open(checkpoint_path, "wb") as f:
            cloudpickle.dump(self.get_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        import pickle
        with open(checkpoint_path, "rb") as f:
            self.set_state(pickle.load(f))
