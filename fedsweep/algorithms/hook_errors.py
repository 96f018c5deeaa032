"""What an error raised in an algorithm's hook means, in one line naming the hook (``fedsweep check``
reads it: :mod:`fedsweep.testing`): the hook it was raised in, where, and for the errors vmap raises
on code that cannot run under it, what to write instead."""
from __future__ import annotations

import traceback

from fedsweep.algorithms.base import Algorithm

HOOKS = frozenset(n for n, v in vars(Algorithm).items() if callable(v) and not n.startswith("_"))

#: Where an algorithm's random numbers come from (docs/extending.md, "The rules").
RANDOM_ADVICE = ("draw a client hook's random numbers with fedsweep.client_normal(batch, like, purpose) (or "
                 "client_uniform), declaring `random = True`, and a server hook's from "
                 "fedsweep.generator(self.ctx.seed, plan.round, purpose); never from torch's own generator")


def origin(e: BaseException) -> tuple[str | None, str]:
    """(the interface method ``e`` was raised in, " at FILE:LINE" of the innermost frame of an Algorithm's)."""
    hook, at = None, ""
    for frame, line in reversed(list(traceback.walk_tb(e.__traceback__))):
        if not isinstance(frame.f_locals.get("self"), Algorithm):
            continue
        at = at or f" at {frame.f_code.co_filename}:{line}"
        if frame.f_code.co_name in HOOKS:
            hook = frame.f_code.co_name
            break
    return hook, at


def hook_error(e: BaseException, check_hook: str = "the run") -> tuple[str, str]:
    """(hook, one line) of an error raised in a run: the hook it was raised in (else ``check_hook``), the
    error, where, and for vmap's refusals what to write instead."""
    hook, at = origin(e)
    hook = hook or check_hook
    first, advice = first_line(e), ""
    if "random operation while in randomness error mode" in first:
        first, advice = "draws from torch's random generator, which vmap refuses", f"; {RANDOM_ADVICE}"
    elif "data-dependent control flow" in first or ".item()" in first:
        first = ("vmap cannot run .item(), float() or bool() of a tensor" if ".item()" in first
                 else "vmap cannot branch on a tensor's value (Python if/while on it)")
        advice = ("; the vectorized engine runs it for all K clients at once under torch.func.vmap: compute both "
                  "branches and keep one per element with torch.where")
    return hook, f"{hook}: {type(e).__name__}: {first}{at}{advice}"


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]
