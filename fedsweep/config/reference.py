"""Generate docs/config.md from the config models' field descriptions and the registries (every built-in
algorithm's parameters, model's and dataset's options): ``python -m fedsweep.config.reference``.

The test suite checks that docs/config.md is current, so an option cannot ship undocumented.
"""
from __future__ import annotations

import typing

from pydantic import BaseModel

from fedsweep.config.registry import ALGORITHMS, DATASETS, MODELS
from fedsweep.config.schema import RunConfig


def _type_name(annotation) -> str:
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if typing.get_origin(annotation) in (list, dict):
        inner = " to ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{typing.get_origin(annotation).__name__} of {inner}" if inner else typing.get_origin(annotation).__name__
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if args:
        return " \\| ".join(_type_name(a) for a in args) + (" or null" if type(None) in typing.get_args(annotation) else "")
    return getattr(annotation, "__name__", str(annotation))


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += _rows(ann, f"{prefix}{name}.")
            continue
        default = "—" if field.is_required() else f"`{field.get_default(call_default_factory=True)!r}`"
        desc = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {_type_name(ann)} | {default} | {desc} |")
    return rows


def config_reference() -> str:
    lines = ["# Configuration reference", "",
             "Generated from `fedsweep/config/schema.py` by `python -m fedsweep.config.reference > docs/config.md`; "
             "every key can be set in YAML or with `--set key=value`. "
             "η_l is `local.lr`, η_g is `server.lr`, ρ is `heterogeneity.rho`.", "",
             "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    lines += _rows(RunConfig, "")
    for registry, title, where, prefix in (
            (ALGORITHMS, "Algorithm parameters", "Set under `algorithm:` next to `name`; each algorithm accepts only "
             "its own keys.", "algorithm."),
            (MODELS, "Model options", "Set under `model.options`; each model accepts only its own (its factory's "
             "keyword parameters).", "model.options."),
            (DATASETS, "Dataset options", "Set under `data.options`; each dataset accepts only its own (its "
             "function's keyword parameters).", "data.options.")):
        lines += ["", f"## {title}", "", f"{where} fedsweep's own, registered as a plugin's are "
                  "(docs/extending.md); `fedsweep algorithms|models|datasets FILE` lists a file's plugins too.", ""]
        for e in registry.entries():
            if not e.builtin:
                continue
            lines += [f"### `{e.name}`", "", e.description(), ""]
            rows = _rows(e.options, prefix)
            lines += (["| key | type | default | meaning |", "| --- | --- | --- | --- |"] + rows) if rows \
                else ["No parameters." if registry is ALGORITHMS else "No options."]
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(config_reference(), end="")
