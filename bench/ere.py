"""Translate rule patterns (Python `re`, ASCII semantics) into POSIX ERE for `LC_ALL=C grep -E`.

Only what decides whether a line matches has to survive: group names and non-capturing markers
become plain groups, lazy and possessive quantifiers become greedy ones, Python class shorthands
become POSIX classes, case-insensitive parts become bracket pairs (`[aA]`). Constructs ERE has no
equivalent for (lookaround, back-references, `\\n` inside a line, verbose mode) raise
`Unconvertible`, and the benchmark leaves those patterns out and counts them.
"""

from __future__ import annotations

import re

ERE_SPECIAL = set(".[]()*+?{}|^$\\")
_SHORTHAND = {
    "d": "[0-9]",
    "D": "[^0-9]",
    "s": "[[:space:]]",
    "S": "[^[:space:]]",
    "w": "[[:alnum:]_]",
    "W": "[^[:alnum:]_]",
}
_CLASS_SHORTHAND = {"d": "[:digit:]", "s": "[:space:]", "w": "[:alnum:]"}
_CONTROL = {"t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_QUANT = re.compile(r"\{(\d*)(,?)(\d*)\}")
_FLAGS = re.compile(r"\(\?([aiLmsux]*)(?:-([imsx]+))?(\)|:)")


class Unconvertible(ValueError):
    """The pattern uses a construct POSIX ERE cannot express."""


def to_ere(pattern: str) -> str:
    """The ERE equivalent of `pattern` for matching single lines, or raise Unconvertible."""
    return _Translator(pattern).run()


class _Translator:
    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0
        self.out: list[str] = []
        self.ci_stack: list[bool] = [False]

    @property
    def ci(self) -> bool:
        return self.ci_stack[-1]

    def run(self) -> str:
        p = self.p
        while self.i < len(p):
            c = p[self.i]
            if c == "\\":
                self.out.append(self._escape())
            elif c == "[":
                self.out.append(self._bracket())
            elif c == "(":
                self._open_group()
            elif c == ")":
                if len(self.ci_stack) <= 1:
                    raise Unconvertible("unbalanced )")
                self.ci_stack.pop()
                self.out.append(")")
                self.i += 1
            elif c in "*+?":
                self.out.append(c)
                self.i += 1
                self._skip_lazy()
            elif c == "{":
                m = _QUANT.match(p, self.i)
                if m is not None and (m.group(1) or m.group(3)):
                    lo = m.group(1) or "0"
                    self.out.append("{" + lo + m.group(2) + m.group(3) + "}")
                    self.i = m.end()
                    self._skip_lazy()
                else:
                    self.out.append("\\{")
                    self.i += 1
            elif c in ".^$|":
                self.out.append(c)
                self.i += 1
            else:
                self.out.append(self._literal(c))
                self.i += 1
        if len(self.ci_stack) != 1:
            raise Unconvertible("unbalanced (")
        expr = "".join(self.out)
        if not expr:
            raise Unconvertible("empty pattern")
        return expr

    def _skip_lazy(self) -> None:
        if self.i < len(self.p) and self.p[self.i] in "?+":
            self.i += 1

    def _literal(self, c: str) -> str:
        if c == "\n":
            raise Unconvertible("newline in a single-line match")
        if c in ERE_SPECIAL:
            return "\\" + c
        if self.ci and c.isascii() and c.isalpha():
            return f"[{c.lower()}{c.upper()}]"
        if not c.isascii():
            # Several bytes in the C locale: group them so a following quantifier covers them all.
            return f"({c})"
        return c

    def _open_group(self) -> None:
        p, i = self.p, self.i
        if not p.startswith("(?", i):
            self.ci_stack.append(self.ci)
            self.out.append("(")
            self.i += 1
            return
        if p.startswith("(?P<", i):
            end = p.find(">", i)
            if end < 0:
                raise Unconvertible("bad group name")
            self.ci_stack.append(self.ci)
            self.out.append("(")
            self.i = end + 1
            return
        m = _FLAGS.match(p, i)
        if m is None:
            raise Unconvertible(f"unsupported group {p[i : i + 4]!r}")
        on, off, kind = m.group(1), m.group(2) or "", m.group(3)
        if "x" in on or "L" in on:
            raise Unconvertible("verbose or locale flag")
        # `s` and `m` change nothing for one line at a time; `a`/`u` are the default in the C locale.
        ci = ("i" in on or self.ci) and "i" not in off
        self.i = m.end()
        if kind == ")":
            if i != 0 and off:
                raise Unconvertible("inline flag off in the middle of a pattern")
            if i != 0 and ci != self.ci:
                raise Unconvertible("inline flag in the middle of a pattern")
            self.ci_stack[-1] = ci
            return
        self.ci_stack.append(ci)
        self.out.append("(")

    def _escape(self) -> str:
        p = self.p
        if self.i + 1 >= len(p):
            raise Unconvertible("trailing backslash")
        c = p[self.i + 1]
        self.i += 2
        if c in _SHORTHAND:
            return _SHORTHAND[c]
        if c in "bB":
            return "\\" + c  # GNU grep extension, same meaning for ASCII text
        if c == "A":
            return "^"
        if c == "Z":
            return "$"
        if c == "n":
            raise Unconvertible("newline in a single-line match")
        if c in _CONTROL:
            return self._literal(_CONTROL[c])
        if c == "x":
            return self._literal(self._hex(2))
        if c in "uU":
            return self._literal(self._hex(4 if c == "u" else 8))
        if c.isdigit():
            raise Unconvertible("back-reference or octal escape")
        if c.isascii() and c.isalpha():
            raise Unconvertible(f"escape \\{c}")
        return self._literal(c)

    def _hex(self, width: int) -> str:
        digits = self.p[self.i : self.i + width]
        if len(digits) != width:
            raise Unconvertible("short hex escape")
        self.i += width
        return chr(int(digits, 16))

    def _bracket(self) -> str:
        p = self.p
        i = self.i + 1
        negate = i < len(p) and p[i] == "^"
        if negate:
            i += 1
        chars: set[str] = set()
        ranges: list[tuple[str, str]] = []
        classes: list[str] = []
        first = True
        while True:
            if i >= len(p):
                raise Unconvertible("unterminated class")
            c = p[i]
            if c == "]" and not first:
                i += 1
                break
            first = False
            if c == "\\":
                if i + 1 >= len(p):
                    raise Unconvertible("trailing backslash")
                e = p[i + 1]
                i += 2
                if e in _CLASS_SHORTHAND:
                    classes.append(_CLASS_SHORTHAND[e])
                    if e == "w":
                        chars.add("_")
                    continue
                if e in "DSW":
                    raise Unconvertible(f"negated shorthand \\{e} inside a class")
                if e == "n":
                    continue  # a line never holds a newline
                if e in _CONTROL:
                    item = _CONTROL[e]
                elif e == "x":
                    digits = p[i : i + 2]
                    i += 2
                    item = chr(int(digits, 16))
                elif e.isascii() and e.isalnum():
                    raise Unconvertible(f"escape \\{e} inside a class")
                else:
                    item = e
            else:
                item = c
                i += 1
            if not item.isascii():
                raise Unconvertible("non-ASCII character inside a class")
            if i + 1 < len(p) and p[i] == "-" and p[i + 1] != "]":
                hi = p[i + 1]
                if hi == "\\":
                    raise Unconvertible("escaped range bound")
                i += 2
                if not hi.isascii():
                    raise Unconvertible("non-ASCII range bound")
                ranges.append((item, hi))
                continue
            chars.add(item)
        if self.ci:
            for ch in list(chars):
                if ch.isalpha():
                    chars.update((ch.lower(), ch.upper()))
            for lo, hi in list(ranges):
                if lo.isalpha() and hi.isalpha() and lo.islower() == hi.islower():
                    ranges.append((lo.swapcase(), hi.swapcase()))
        self.i = i
        return _emit_class(negate, chars, ranges, classes)


def _emit_class(negate: bool, chars: set[str], ranges: list[tuple[str, str]], classes: list[str]) -> str:
    if not chars and not ranges and not classes:
        if negate:
            return "."
        raise Unconvertible("class that only holds a newline")
    if not negate and not ranges and not classes and len(chars) == 1:
        (only,) = chars
        return "\\" + only if only in ERE_SPECIAL else only
    body = ""
    if "]" in chars:
        body += "]"
    body += "".join(sorted(ch for ch in chars if ch not in "]^[-"))
    body += "".join(f"{lo}-{hi}" for lo, hi in ranges)
    body += "".join(classes)
    if "^" in chars:
        body += "^"
    if "[" in chars:
        body += "["
    if "-" in chars:
        body += "-"
    if body.startswith("^") and not negate:
        # Only `^`, `[` and `-` are present: a leading `^` would negate the class.
        body = ("-" if "-" in chars else "") + ("[" if "[" in chars else "") + "^"
    return ("[^" if negate else "[") + body + "]"
