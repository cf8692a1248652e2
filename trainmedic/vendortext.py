"""Vendor message templates read for people: the `%s` of a catalog's verbatim text filled in.

Some vendor catalogs keep the error-message registry as it is, placeholders and all (CANN's GE and
AclNN errors: "Value %s for parameter %s is invalid. Reason: %s"). Shown as it is, a report says
"Reason: %s". `fill` puts in the values of the log line the code was found in, by finding the
template's literal parts in the line in order (str.find, linear, no regex built from the template);
where the line does not follow the template, each placeholder reads "…". `elide` does the second
part alone, for texts with no line to read from.
"""

from __future__ import annotations

import re

__all__ = ["ELLIPSIS", "MAX_VALUE_CHARS", "elide", "fill"]

ELLIPSIS = "…"
MAX_VALUE_CHARS = 120
# C printf conversions as vendors write them: %s, %d, %u, %lu, %llu, %zu, %x, %08x, %1$s, %.*s.
_PRINTF = re.compile(r"%(?:\d+\$)?[-+#0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|z|j|t)?[sdiuxXcfgp]")


def elide(text: str) -> str:
    """`text` with every printf placeholder as "…"."""
    return _PRINTF.sub(ELLIPSIS, text) if "%" in text else text


def _cut(value: str) -> str:
    value = value.strip()
    return value if len(value) <= MAX_VALUE_CHARS else value[: MAX_VALUE_CHARS - 1] + ELLIPSIS


def fill(template: str, line: str | None) -> str:
    """`template` with its placeholders replaced by the values `line` has in their places, or "…".

    A template that is nothing but placeholders says nothing of its own: "" then.
    """
    if "%" not in template:
        return template
    literals = _PRINTF.split(template)
    if not any(part.strip() for part in literals):
        return ""
    values = _values(literals, line or "")
    if values is None:
        return elide(template)
    out = [literals[0]]
    for value, literal in zip(values, literals[1:], strict=True):
        out.extend((value, literal))
    return "".join(out)


def _values(literals: list[str], line: str) -> list[str] | None:
    """The text between the template's literal parts, found in `line` in order (leftmost each)."""
    first = literals[0]
    if first:
        at = line.find(first)
        if at < 0:
            return None
        pos = at + len(first)
    else:
        pos = -1  # a template that opens with a placeholder: its value is the word before the next part
    values: list[str] = []
    for i, literal in enumerate(literals[1:], start=1):
        last = i == len(literals) - 1
        if not literal:
            if not last:
                return None  # two placeholders side by side: no way to tell where one ends
            end = len(line)
        else:
            end = line.find(literal, max(pos, 0))
            if end < 0:
                return None
        if pos < 0:
            words = line[:end].split()
            value = words[-1] if words else ""
        else:
            value = line[pos:end]
        if not value.strip():
            return None
        values.append(_cut(value))
        pos = end + len(literal)
    return values
