"""``fedsweep tune SWEEP --dry-run``: the sweep's trial count, then its trials validated, then its table.

A grid of a million trials is a real sweep file's mistake or plan, so the dry run must say what it
is at once: the count comes from the grids' sizes before any config is made, a line on stderr every
2 s says how far validating has got, and the table shows its first :data:`TABLE_ROWS` rows unless
``--all`` asks for every one. Only the trials it prints are kept (all of them for ``pack:``, whose
packs need every config).
"""
from __future__ import annotations

import sys
import time

from fedsweep.sweep.search import search_summary
from fedsweep.sweep.checks import check_report
from fedsweep.sweep.confirm import looks, seed_order, selection_group
from fedsweep.sweep.spec import SweepConfig, Trial, iter_trials, trial_count
from fedsweep.sweep.units import pack_units

TABLE_ROWS = 100        # rows of the table without --all
PROGRESS_EVERY_S = 2.0  # a progress line while validating, this often (none for a sweep checked sooner)


class Progress:
    """``checked 120,000 of 1,000,000 trial configs`` on ``err`` every PROGRESS_EVERY_S seconds."""

    def __init__(self, total: int, err=None):
        self.total, self.err = total, err or sys.stderr
        self.next = time.monotonic() + PROGRESS_EVERY_S

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if now >= self.next:
            print(f"checked {done:,} of {self.total:,} trial configs", file=self.err, flush=True)
            self.next = now + PROGRESS_EVERY_S


def seeds_note(seeds: int, comparisons: int, alpha: float = 0.05, who: str = "") -> str:
    """What ``seeds`` confirm seeds cannot show: the report's exact tests (sign-flip, signed-rank) have
    no p below 2 / 2^n with n paired seeds, and Holm's first level over ``comparisons`` is α / m (α:
    0.05, or a sequential look's share of it; ``who``: that look, which then can call nothing)."""
    from fedsweep.reports.stats import smallest_p
    m = max(1, comparisons)
    if smallest_p(seeds) < alpha / m:
        return ""
    fewest = next(n for n in range(2, 64) if smallest_p(n) < alpha / m)
    share = f"{alpha:.3g}/{m}" if alpha != 0.05 else f"0.05/{m}"
    cannot = f"{who} can call nothing" if who else "no comparison can be called"
    return (f"with {seeds} confirm seeds {cannot} better, worse or equivalent: the exact tests' "
            f"smallest p with {seeds} paired seeds is {smallest_p(seeds):.3g}, not below Holm's first level over "
            f"the report's {m} comparison{'s' if m != 1 else ''}, {share} = {alpha / m:.3g}; {fewest} seeds are the "
            "fewest that can call one (`confirm.seeds`, `confirm.max_seeds`)")


def rounds_margin_note(margin: float, every: int) -> str:
    """Why ``report.margin.rounds`` cannot make an `equivalent` where rounds are seen every ``every``
    rounds: paired differences come in steps of ``every``, their interval's ends in steps of every / 2, so
    a margin of at most every / 2 holds only the interval [0, 0]; "" where it can."""
    if every <= 1 or margin <= 0 or margin > every / 2:
        return ""
    return (f"report.margin.rounds {margin:g} is at most half of eval.every {every}: rounds to target are seen every "
            f"{every} rounds, so a difference's interval moves in steps of {every / 2:g} and lies inside ±{margin:g} "
            f"only as [0, 0]; `equivalent` on rounds is then called only where every paired seed reached the target "
            f"at the same evaluation (a margin above {every / 2:g}, or eval.every below {2 * margin:g}, lets it be "
            "called)")


def dry_run(sweep: SweepConfig, path: str, out, show_all: bool = False, local: bool = True) -> dict:
    """Print the sweep's trial count, search, packs and trial table to ``out``; check every trial's
    config, the ``report:`` keys and what the trials need to run (:func:`check_runnable`: plugins, data
    splits, per-client state in memory; ``local``: files, this machine's memory) as ``tune`` does before
    running. Returns ``{"trials": count}``."""
    total = trial_count(sweep)
    print(f"{sweep.name}: {total:,} trials", file=out, flush=True)
    if sweep.search is not None:
        print(search_summary(sweep), file=out, flush=True)
    from fedsweep.config.registry import DATASETS
    keep_all = show_all or sweep.pack not in (None, 1)
    kept, first_of_method, distinct, runnable, count, groups = [], {}, {}, {}, 0, set()
    for trial in iter_trials(sweep, source=path, progress=Progress(total)):
        if keep_all or count < TABLE_ROWS:
            kept.append(trial)
        first_of_method.setdefault(trial.method, trial)
        c = trial.config   # what tune's checks read: each distinct combination once
        distinct.setdefault((c.algorithm.name, c.model.name, c.data.name, c.data.validation_fraction > 0,
                             tuple(c.plugins)), trial)
        seeded = "seed" in DATASETS.get(c.data.name).takes          # its split differs by seed (synthetic)
        runnable.setdefault(c.model_dump_json(exclude={"seed"}) + (str(c.seed) if seeded else ""), trial)
        if sweep.confirm is not None:
            groups.add(selection_group(sweep, trial))
        count += 1
    methods = list(first_of_method.values())   # their keys are every trial's (a method's trials set the same)
    check_report(sweep, methods, source=path)
    from fedsweep.sweep.checks import check_runnable, select_on_validation
    select_on_validation(sweep, list(distinct.values()), source=path)   # ASHA's and optuna's metric
    packed = sweep.pack not in (None, 1)
    check_runnable(sweep, kept if packed else list(runnable.values()), source=path, local=local)   # as tune does
    units = pack_units(sweep, kept) if packed else []
    if units and len(units) < count:
        print(f"in {len(units):,} packs of up to {max(map(len, units))} trials (pack: {sweep.pack})", file=out)
    shown = kept if show_all else kept[:TABLE_ROWS]
    print(trial_table(shown, columns_of=methods), file=out)
    if len(shown) < count:
        print(f"... and {count - len(shown):,} more trials: `fedsweep tune {path} --dry-run --all` prints every one",
              file=out)
    if groups:
        print(f"then a confirm stage: {len(groups) * len(sweep.confirm.seeds):,} trials, the selected config of each "
              f"of {len(groups)} (method, setting) pairs on each of seeds {', '.join(map(str, sweep.confirm.seeds))}",
              file=out)
        from fedsweep.reports.stats import spent
        from fedsweep.sweep.checks import reference_method
        plan, order = looks(sweep) or [len(sweep.confirm.seeds)], seed_order(sweep)
        levels = spent(plan)                      # [0.05] for one look
        if len(plan) > 1:
            print(f"  and where a comparison is not answered, {sweep.confirm.step} seeds more at a time for its two "
                  f"configs, at most {len(plan) - 1} times (seeds {', '.join(map(str, order[len(sweep.confirm.seeds):]))}): "
                  f"at most {len(groups) * len(order):,} confirm trials; looks after {', '.join(map(str, plan))} seeds, "
                  f"each at its share of α = 0.05 ({', '.join(f'{a:.3g}' for a in levels)})", file=out)
        reference = reference_method(sweep, first_of_method)
        compared = sum(method != reference for method, _ in groups) if reference is not None else 0
        target = methods[0].config.eval.target_accuracy is not None or sweep.report.relative_target is not None
        m = compared * (2 if target else 1)
        note = ""
        if compared:
            note = seeds_note(plan[-1], m, levels[-1]) or (seeds_note(plan[0], m, levels[0], "the first look")
                                                          if len(plan) > 1 else "")
        if note:
            print(f"note: {note}", file=out)
        if compared and target:
            margin_note = rounds_margin_note(sweep.report.margin.rounds, max(t.config.eval.every for t in methods))
            if margin_note:
                print(f"note: {margin_note}", file=out)
    if any(t.sampled for t in methods):
        print("~: drawn by optuna when the config's first trial starts, from its study's results so far", file=out)
    return {"trials": count, "confirm": len(groups) * len(sweep.confirm.seeds) if groups else 0,
            "confirm_most": len(groups) * len(seed_order(sweep)) if groups else 0}


def trial_table(trials: list[Trial], columns_of: list[Trial] | None = None) -> str:
    """The trials as an aligned text table (``fedsweep tune --dry-run``); its columns are the keys that
    ``columns_of`` (default: ``trials``) set, so that the first rows of a sweep show every column."""
    keys = sorted({k for t in columns_of or trials for k in t.overrides if k not in ("seed", "algorithm.name")})
    header = ["#", "method", *keys, "seed", "config_id"]
    cell = lambda t, k: "~" if k in t.sampled else str(t.overrides.get(k, ""))  # noqa: E731 - `~`: drawn later
    rows = [[str(t.index), t.method, *[cell(t, k) for k in keys], str(t.seed), "~" if t.sampled else t.config_id]
            for t in trials]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)])
