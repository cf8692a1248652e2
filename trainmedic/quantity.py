"""Kubernetes quantities ("512Gi", "1.5G", "250m", "129e6"): one grammar, one reader.

The grammar is apimachinery's resource.Quantity: an optionally signed decimal number, then a binary
suffix (Ki Mi Gi Ti Pi Ei), a decimal one (n u m "" k M G T P E) or a decimal exponent (e3, E-2).
"1E" is an exa and "1e3" an exponent; "m" is milli, not mega. The text is checked against that
grammar here (the `kubernetes` client's own reader also takes forms the API server refuses, such as
"1e3Mi", "NaN" or "1_000") and its value is then read by the client's
`kubernetes.utils.quantity.parse_quantity`, exactly (at a precision no 64-character quantity can
exceed).
"""

from __future__ import annotations

import decimal
import re
from fractions import Fraction
from typing import Literal

_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?\d+)|(?P<dec>[numkMGTPE]))?$"
)
MAX_QUANTITY_CHARS = 64
MAX_EXPONENT = 64

Reason = Literal["type", "syntax", "exponent"]
_WHY = {"type": "is not a string", "syntax": "is not a Kubernetes quantity", "exponent": "exponent out of range"}


class BadQuantity(ValueError):
    """Not a Kubernetes quantity: `reason` says why (not a string, the grammar, an exponent beyond
    +-64), `shown` is the text as it may be quoted (cut to 64 characters)."""

    def __init__(self, reason: Reason, shown: str) -> None:
        what = {
            "type": "is not a string",
            "syntax": "is not a Kubernetes quantity",
            "exponent": "exponent out of range",
        }
        super().__init__(f"{shown!r}: {what[reason]}")
        self.reason: Reason = reason
        self.shown = shown


def parse_quantity(text: object) -> Fraction:
    """A Kubernetes quantity as an exact number (surrounding white space ignored). Raises BadQuantity."""
    if not isinstance(text, str):
        raise BadQuantity("type", repr(text)[:MAX_QUANTITY_CHARS])
    s = text.strip()
    m = _QUANTITY.match(s) if len(s) <= MAX_QUANTITY_CHARS else None
    if m is None:
        raise BadQuantity("syntax", s if len(s) <= MAX_QUANTITY_CHARS else s[:MAX_QUANTITY_CHARS] + "...")
    if m["exp"] or m["dec"]:
        exp = int(m["exp"][1:]) if m["exp"] else 0
        if abs(exp) > MAX_EXPONENT:
            raise BadQuantity("exponent", s)
    from kubernetes.utils.quantity import parse_quantity as k8s_parse_quantity  # ~0.2 s to import

    # Exact: 64 digits times at most 1024**6 or 10**64 stays far within 200 significant digits.
    with decimal.localcontext(decimal.Context(prec=200, Emax=999, Emin=-999, traps=[decimal.Inexact])):
        value = k8s_parse_quantity(s)  # type: ignore[no-untyped-call]
    return Fraction(value)
