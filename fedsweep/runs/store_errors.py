"""What an MLflow store's failure means, in one line a user can act on, and whether retrying can mend it."""
from __future__ import annotations

#: MLflow's words for errors that retrying will not mend: a deleted run or experiment, a value it
#: refuses. Anything else (a locked or full store, a server that does not answer) may pass.
PERMANENT_CODES = ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "INVALID_STATE",
                   "RESOURCE_ALREADY_EXISTS", "PERMISSION_DENIED", "UNAUTHENTICATED")


class Refused(Exception):
    """An operation the store refuses for good (a deleted experiment, say): retrying cannot mend it."""


#: What a store's error means, by words it carries, and what to do (the first that matches is said).
KNOWN_CAUSES = (
    ("database or disk is full", "the disk under the store is full (database or disk is full): free space there"),
    ("No space left on device", "the disk under the store is full (no space left on device): free space there"),
    ("database is locked", "another process holds the store's lock (database is locked): it may be a stuck "
                           "`mlflow ui`, a notebook or another fedsweep writing it; once it lets go, the writes go through"),
    ("attempt to write a readonly database", "the store cannot be written here (readonly database): check the "
                                             "permissions of the database file and its folder"),
    ("unable to open database file", "the store's database file cannot be opened (was its folder moved or deleted?)"),
)


def cause(error: BaseException) -> str:
    """An error in one line, at most 200 characters, saying what it means where it is known
    (:data:`KNOWN_CAUSES`; SQLAlchemy puts the database's own words after lines of its own, e.g.
    "(raised as a result of Query-invoked autoflush ...)"), else its first line."""
    full = str(error).strip()
    for words, meaning in KNOWN_CAUSES:
        if words in full:
            return meaning
    text = (full.splitlines() or [type(error).__name__])[0]
    if len(text) > 200 and not isinstance(error, Refused):
        text = text[:199] + "…"
    if "Current state is deleted" in text:   # MLflow's words for a run of a deleted experiment
        text += " (its experiment was deleted in MLflow: `mlflow experiments restore --experiment-id N` brings it back)"
    return text


def silence(seconds: float) -> str:
    """Why writes still wait when no write failed: the one under way has not come back."""
    return (f"no answer in {seconds:.0f} s: the write under way still waits (on a sqlite store, most often another "
            "process holding its lock; on a server, one that does not answer)")


def permanent(error: BaseException) -> bool:
    return isinstance(error, Refused) or getattr(error, "error_code", None) in PERMANENT_CODES
