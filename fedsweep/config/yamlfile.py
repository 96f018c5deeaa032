"""YAML as fedsweep reads it: safe loading, each key once per mapping, and every error naming its line.

PyYAML keeps the last of a key given twice (``base: {rounds: 2, rounds: 3}`` runs 3 rounds, a second
``local:`` mapping drops the first one's keys) and says nothing: here that is an error naming both
lines. Run configs, sweep files and ``--set`` values are all read through :func:`parse_yaml`.
"""
from __future__ import annotations

from typing import Any

import yaml

from fedsweep.util.errors import ConfigError

MERGE_TAG = "tag:yaml.org,2002:merge"   # `<<: *anchor`: keys it brings may be overridden, as YAML says
#: The most values a file may hold once its aliases are expanded: a config of the largest sweep holds
#: thousands; ten levels of an alias used ten times each (a "billion laughs") hold 10^10.
MAX_VALUES = 1_000_000


class DuplicateKey(yaml.MarkedYAMLError):
    """A key given twice in one mapping; ``first`` is where it was given first."""

    def __init__(self, key: Any, first: yaml.Mark, mark: yaml.Mark):
        super().__init__(problem=f"duplicate key {key!r}", problem_mark=mark)
        self.key, self.first = key, first


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (plain data only: no Python objects) that refuses a key given twice in a mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        # the mapping's own keys, read before SafeLoader flattens `<<` merges into them
        own = [k for k, _ in node.value if k.tag != MERGE_TAG] if isinstance(node, yaml.MappingNode) else []
        seen: dict[Any, yaml.Mark] = {}
        for key_node in own:
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise DuplicateKey(key, seen[key], key_node.start_mark)
                seen[key] = key_node.start_mark
            except TypeError:   # an unhashable key: SafeLoader's own error says so
                continue
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str) -> Any:
    """``text`` as YAML, or a ConfigError of one line: ``source:LINE: what is wrong``."""
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)   # noqa: S506 - a SafeLoader subclass
    except DuplicateKey as e:
        raise ConfigError(f"{source}:{e.problem_mark.line + 1}: duplicate key {e.key!r} (first at line "
                          f"{e.first.line + 1}); a key may appear once in a mapping") from None
    except yaml.MarkedYAMLError as e:
        raise ConfigError(_marked_error(e, source)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise ConfigError(f"{source}: nests deeper than a YAML file can be read here; a config is a few levels "
                          "deep") from None
    try:
        count = expanded_size(data)
    except RecursionError:
        raise ConfigError(f"{source}: nests deeper than a YAML file can be read here; a config is a few levels "
                          "deep") from None
    if count is None:
        raise ConfigError(f"{source}: an alias (*name) refers to a value that holds it: a config is a tree, and "
                          "this one never ends; use each anchor only outside its own value")
    if count > MAX_VALUES:
        raise ConfigError(f"{source}: its aliases (*name) expand to more than {MAX_VALUES:,} values "
                          f"({count:.3g}); a config holds far fewer: write the values out, or alias fewer times")
    return data


def expanded_size(data: Any) -> int | None:
    """How many values ``data`` holds with every alias expanded (a shared list or mapping counted each
    time it is used), in time linear in the distinct ones; None where one holds itself."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(x: Any) -> int | None:
        if not isinstance(x, (dict, list)):
            return 1
        key = id(x)
        if key in sizes:
            return sizes[key]
        if key in open_:
            return None
        open_.add(key)
        total = 1
        for item in (x.values() if isinstance(x, dict) else x):
            n = size(item)
            if n is None:
                return None
            total += n
        open_.discard(key)
        sizes[key] = total
        return total
    return size(data)


def _marked_error(e: yaml.MarkedYAMLError, source: str) -> str:
    """PyYAML's error in one line with its line number, and what usually causes it."""
    mark = e.problem_mark or e.context_mark
    where = f"{source}:{mark.line + 1}" if mark is not None else source
    problem = e.problem or "not valid YAML"
    if "'\\t'" in problem:
        return f"{where}: a tab (column {mark.column + 1}); YAML indents with spaces, never tabs"
    if problem.startswith("expected <block end>"):
        return (f"{where}: not valid YAML: this line's indentation matches no mapping or list above it; indent it "
                f"with spaces as its siblings are")
    if problem == "mapping values are not allowed here":
        return (f"{where}: not valid YAML: a `key:` where none may start (this line indented deeper than its "
                f"siblings, or a ': ' inside an unquoted value: quote the value)")
    context = ""
    if e.context:
        context = f" ({e.context}" + (f" at line {e.context_mark.line + 1})" if e.context_mark else ")")
    return f"{where}: not valid YAML: {problem}{context}"
