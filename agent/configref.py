"""The configuration reference, generated from the settings model so it cannot drift from it.

agent/config.py documents every setting where it is defined (kopf's style: grouped, attribute by
attribute). This module walks that model and writes the reference people read: one Markdown
table per settings group with each field's type, default, environment variable and description.
`trainmedic config reference` prints it, and docs/configuration.md is that output
(tests/project/test_docs.py fails when the page is stale).

The walk is generic: a field whose type is a settings model is a group (its environment variables
get one more `__` level); a list or map of models (notification sinks) is documented as an item
table whose fields have no environment variable of their own (the whole list is set at once:
`TRAINMEDIC_NOTIFY__SINKS='[{kind: slack, url: ...}]'`). Defaults computed at start (the host name)
are named, not evaluated, so the output is the same on every machine.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel, SecretStr
from pydantic.dataclasses import is_pydantic_dataclass
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from trainmedic.agent.config import ENV_PREFIX, Settings

__all__ = ["FieldDoc", "GroupDoc", "field_docs", "groups", "missing_descriptions", "reference_markdown"]

ENV_SEPARATOR = "__"


@dataclass(frozen=True)
class FieldDoc:
    """One setting as the reference shows it."""

    path: str  # dotted, as in the YAML file: "bus.bootstrap", "notify.sinks[].url"
    name: str  # the key inside its group
    type: str
    default: str
    env: str | None  # None: not settable on its own (a field of a list item)
    description: str


@dataclass(frozen=True)
class GroupDoc:
    """A settings group (or the items of a list of models) and its fields, in declaration order."""

    path: str  # "" for the top level, "bus", "notify.sinks[]"
    title: str
    doc: str
    env_prefix: str | None
    fields: tuple[FieldDoc, ...]


# ------------------------------------------------------------------------------------------------
# Types


def _strip_none(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    origin = get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in get_args(tp) if a is not type(None)]
        nullable = len(args) != len(get_args(tp))
        if len(args) == 1:
            return args[0], nullable
        return typing.Union[tuple(args)], nullable  # noqa: UP007 - rebuilt from its parts
    return tp, False


def _model_of(tp: Any) -> type[Any] | None:
    """A settings group: a pydantic model, or a pydantic dataclass that a component uses as its own
    settings (detectors.hang_state.HangSettings)."""
    if isinstance(tp, type) and (issubclass(tp, BaseModel) or is_pydantic_dataclass(tp)):
        return tp
    return None


def _fields_of(model: type[Any]) -> dict[str, FieldInfo]:
    if issubclass(model, BaseModel):
        return dict(model.model_fields)
    return dict(getattr(model, "__pydantic_fields__", {}))


def _item_model(tp: Any) -> tuple[type[Any], str] | None:
    """The model of a list / map of models and the path suffix of its items ("[]" or ".<key>")."""
    tp, _ = _strip_none(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin in (list, tuple, set, frozenset) and args and _model_of(args[0]):
        return typing.cast(type[Any], args[0]), "[]"
    if origin is dict and len(args) == 2 and _model_of(args[1]):
        return typing.cast(type[Any], args[1]), ".<key>"
    return None


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def type_text(tp: Any) -> str:
    """A type as people read it: `string`, `integer`, `list of string`, `"a" | "b"`, `... or null`."""
    inner, nullable = _strip_none(tp)
    text = _type_text(inner)
    return f"{text} or null" if nullable else text


def _type_text(tp: Any) -> str:
    if tp in _SCALARS:
        return _SCALARS[tp]
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type_text(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type_text(args[0])} to {_type_text(args[1])}" if len(args) == 2 else "map"
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_type_text(a) for a in get_args(tp))
    if tp is SecretStr:
        return "secret string"
    model = _model_of(tp)
    if model is not None:
        return "group"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp)


def _bounds(info: FieldInfo) -> str:
    """Constraints as a suffix: ` (>= 1, <= 1000)`, ` (matching `^[a-z]+$`)`."""
    parts = []
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            parts.append(f">= {m.ge}")
        elif isinstance(m, annotated_types.Gt):
            parts.append(f"> {m.gt}")
        elif isinstance(m, annotated_types.Le):
            parts.append(f"<= {m.le}")
        elif isinstance(m, annotated_types.Lt):
            parts.append(f"< {m.lt}")
        elif isinstance(m, annotated_types.MinLen):
            parts.append(f"at least {m.min_length} long")
        elif isinstance(m, annotated_types.MaxLen):
            parts.append(f"at most {m.max_length} long")
        elif isinstance(getattr(m, "pattern", None), str):
            parts.append(f"matching `{m.pattern}`")
    return f" ({', '.join(parts)})" if parts else ""


# ------------------------------------------------------------------------------------------------
# Defaults


def default_text(info: FieldInfo) -> str:
    """The default as YAML would write it, in backticks; a computed one by the function's name."""
    if info.default_factory is not None:
        factory: Any = info.default_factory
        if factory in (list, tuple, set, frozenset):
            return "`[]`"
        if factory is dict:
            return "`{}`"
        if _model_of(factory) is not None:
            return "(group)"
        name = getattr(factory, "__qualname__", None) or getattr(factory, "__name__", None) or repr(factory)
        # C functions report their private module (`_socket`); people know the public one.
        module = str(getattr(factory, "__module__", "") or "").lstrip("_")
        where = f"{module}.{name}" if module and module not in ("builtins", "__main__") else name
        return f"computed: `{where}()`"
    if info.default is PydanticUndefined:
        return "(required)"
    return f"`{_yaml_scalar(info.default)}`"


def _yaml_scalar(value: Any) -> str:
    if hasattr(value, "value") and not isinstance(value, str | int | float | bool):
        value = value.value  # an Enum member
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


# ------------------------------------------------------------------------------------------------
# The walk


def _env_name(prefix: str | None, name: str) -> str | None:
    return None if prefix is None else f"{prefix}{name.upper()}"


def _doc_of(model: type[Any]) -> str:
    doc = model.__doc__ or ""
    # pydantic gives models without a docstring the BaseModel docstring: not ours to show.
    if model.__doc__ == BaseModel.__doc__:
        return ""
    # A component's own settings class: its first paragraph is for people; the rest for its readers.
    return " ".join(doc.split("\n\n", 1)[0].split())


def groups(model: type[BaseModel] = Settings, *, env_prefix: str = ENV_PREFIX) -> list[GroupDoc]:
    """Every group of the settings model, depth first, the top level first."""
    out: list[GroupDoc] = []
    _walk(model, path="", title="General", env_prefix=env_prefix, out=out)
    return out


def _walk(model: type[Any], *, path: str, title: str, env_prefix: str | None, out: list[GroupDoc]) -> None:
    rows: list[FieldDoc] = []
    nested: list[tuple[type[Any], str, str, str | None]] = []
    for name, info in _fields_of(model).items():
        key = info.alias or name
        full = f"{path}.{key}" if path else key
        tp = info.annotation
        sub = _model_of(_strip_none(tp)[0])
        if sub is not None:
            nested.append((sub, full, f"`{full}`", None if env_prefix is None else f"{env_prefix}{key.upper()}__"))
            continue
        items = _item_model(tp)
        env = _env_name(env_prefix, key)
        description = " ".join((info.description or "").split())
        if items is not None:
            item_model, suffix = items
            nested.append((item_model, full + suffix, f"`{full + suffix}` (each item)", None))
            description = (description + " " if description else "") + f"Items: see `{full + suffix}`."
        rows.append(
            FieldDoc(
                path=full,
                name=key,
                type=type_text(tp) + _bounds(info),
                default=default_text(info),
                env=env,
                description=description,
            )
        )
    if rows or not path:
        out.append(GroupDoc(path=path, title=title, doc=_doc_of(model), env_prefix=env_prefix, fields=tuple(rows)))
    for sub, full, sub_title, sub_env in nested:
        _walk(sub, path=full, title=sub_title, env_prefix=sub_env, out=out)


def field_docs(model: type[BaseModel] = Settings) -> Iterator[FieldDoc]:
    """Every leaf setting (groups are walked into, not listed)."""
    for g in groups(model):
        yield from g.fields


def missing_descriptions(model: type[BaseModel] = Settings) -> list[str]:
    """Dotted paths of the settings that have no description (the reference needs one for each)."""
    return [f.path for f in field_docs(model) if not f.description]


# ------------------------------------------------------------------------------------------------
# Markdown


def _cell(text: str) -> str:
    """Table cell text: one line, pipes escaped (GitHub tables split on them even inside backticks)."""
    return " ".join(text.split()).replace("|", "\\|")


def reference_markdown(model: type[BaseModel] = Settings, *, heading_level: int = 1) -> str:
    """The configuration reference as Markdown: an introduction, then one table per group."""
    h = "#" * heading_level
    lines = [
        f"{h} Configuration reference",
        "",
        "Generated from the settings model (`agent/config.py`) by `trainmedic config reference`; "
        "`trainmedic config show [--config FILE]` prints the effective values (file and environment) "
        "with secrets hidden.",
        "",
        "Every setting has a default (only fields of list items can be required), so an empty file "
        "(or none) runs the embedded setup. Settings come "
        "from the YAML file given with `--config`, then from environment variables, which win. An "
        "environment variable is `TRAINMEDIC_<GROUP>__<FIELD>` (a double underscore between levels) and "
        "its value is read as a YAML scalar: `true`, `15`, `[a, b]`, `{k: v}`, `null`. Unknown keys are "
        "errors, and every problem is listed at start (`trainmedic run --check`).",
        "",
    ]
    for g in groups(model):
        lines.append(f"{h}# {g.title}")
        lines.append("")
        if g.doc and g.path:
            lines.append(g.doc)
            lines.append("")
        if g.env_prefix is None:
            lines.append(
                "These are the fields of each item; the whole list is set at once in the file, or with the "
                "list's environment variable as a YAML flow sequence."
            )
            lines.append("")
        lines.append("| Field | Type | Default | Environment | Description |")
        lines.append("|---|---|---|---|---|")
        for f in g.fields:
            env = f"`{f.env}`" if f.env else "-"
            lines.append(
                f"| `{f.name}` | {_cell(f.type)} | {_cell(f.default)} | {env} | {_cell(f.description) or '-'} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
