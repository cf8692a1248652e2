"""Reading YAML data files (rules, hang markers, policy, hints) with every problem located as file:line.

A leaf module: the rule loader, the hang markers, the remediation policy and the hints all read their
file the same way (bounded, UTF-8: `read_data_file`) and report their problems the same way (the
key's own line for an unknown key, the nearest parent otherwise).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmedic.errors import Problem

if TYPE_CHECKING:
    import yaml


def read_data_file(path: Path, limit: int, name: str | None = None) -> tuple[bytes, str] | Problem:
    """The bytes and the text of a data file of at most `limit` bytes, or the problem (unreadable,
    too large, not UTF-8) named `name` (the path by default). Never reads more than `limit` + 1 bytes."""
    name = str(path) if name is None else name
    try:
        with path.open("rb") as f:
            raw = f.read(limit + 1)
            size = max(len(raw), os.fstat(f.fileno()).st_size) if len(raw) > limit else len(raw)
    except OSError as exc:
        return Problem(name, None, f"cannot read: {exc.strerror or exc}")
    if size > limit:
        return Problem(name, None, f"file is {size} bytes, over the {limit} limit")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Problem(name, None, f"not UTF-8: {exc}")
    return raw, text


def node_line(node: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """The 1-based line of the YAML node at `loc` (a pydantic error location), or its nearest parent."""
    import yaml  # imported when a file is read, not when a cached rule set is used

    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
            if nxt is None:
                # Unknown key: point at the key itself.
                knode = next((k for k, _ in node.value if getattr(k, "value", None) == key), None)
                return knode.start_mark.line + 1 if knode is not None else line
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
        line = node.start_mark.line + 1
    return line


def repeated_keys(
    root: yaml.Node | None, items: Any, section: str, key: str, seen: dict[str, int | None]
) -> list[tuple[str, int | None, int | None]]:
    """The items of a list (the raw document's `section`) whose string `key` was seen before, in `seen`
    (filled as it goes, so one `seen` can span sections): (value, its line, the line it was first at)."""
    out: list[tuple[str, int | None, int | None]] = []
    if not isinstance(items, list):
        return out
    for i, item in enumerate(items):
        value = item.get(key) if isinstance(item, dict) else None
        if not isinstance(value, str):
            continue
        line = node_line(root, [section, i, key])
        if value in seen:
            out.append((value, line, seen[value]))
        else:
            seen[value] = line
    return out


def fast_loader() -> type[yaml.SafeLoader]:
    """libyaml's safe loader when PyYAML was built with it: the pure-Python one is ~7 times slower."""
    import yaml

    loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return loader


def load_yaml(text: str | bytes) -> Any:
    """`yaml.safe_load`, with libyaml when available (raises yaml.YAMLError as safe_load does)."""
    import yaml

    return yaml.load(text, Loader=fast_loader())  # noqa: S506 - a safe loader


def parse_yaml(text: str, name: str) -> tuple[yaml.Node | None, Any, Problem | None]:
    """The node tree (for line numbers) and the data of a YAML document, or the syntax problem."""
    import yaml

    try:
        # One libyaml pass: its nodes carry the same line marks as the pure-Python parser's.
        loader = fast_loader()(text)
        try:
            root = loader.get_single_node()
            return root, (loader.construct_document(root) if root is not None else None), None
        finally:
            loader.dispose()
    except yaml.YAMLError:
        pass  # libyaml words syntax errors differently: report them as the pure-Python parser does
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader), yaml.safe_load(text), None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        return None, None, Problem(name, mark.line + 1 if mark else None, f"YAML syntax: {exc.problem or exc}")
    except yaml.YAMLError as exc:
        return None, None, Problem(name, None, f"YAML: {exc}")


def format_error(err: Any) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"])
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{loc}: {msg}" if loc else msg


def short_text(text: str, limit: int = 100) -> str:
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
