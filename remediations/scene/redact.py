"""Redaction: what makes a bundle safe to hand around.

Safe to hand around: env values in pod and workload specs are replaced unless the name only
configures the job (RANK, MASTER_ADDR, NCCL_*, ...), last-applied-configuration annotations are
dropped, and every text goes through one redaction pass (bearer tokens, Authorization headers, AWS
keys, password= / token= / secret= / SECRET_KEY= values, quoted ones whole, secret flags' values
(`--password X`, `--hf_token 'X'`, and split in a printed list: `['--password', 'X']`), private
keys, URL credentials, the credential part of chat webhook URLs (trainmedic/hookurls.py), JWTs,
vendor tokens), counted per file. A flag or key naming a file that holds a secret
(`--password-file PATH`) keeps its path. The API and the web console serve incidents through the
same pass (docs/policy-and-actions.md lists the forms).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from trainmedic import hsdb
from trainmedic.hookurls import any_host_hooks, any_host_literals, hook_hosts, hosted_hooks
from trainmedic.remediations.scene.model import SceneSettings

_hs = hsdb.hs

MASK = "<redacted>"

# A name on the allowlist is still redacted when it looks like a credential (TORCH_HUB_TOKEN).
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|(?:^|_)KEY(?:$|_)", re.IGNORECASE)
DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


# ------------------------------------------------------------------------------------------------
# Redaction


@dataclass(frozen=True)
class _Branch:
    name: str
    # The replacement pattern (line-local except the private key block). `k` keeps a prefix, `t` a suffix.
    pattern: str
    # A compact form that finds candidates (Hyperscan, or `re` after the triggers): a match of
    # `pattern` contains a match of `anchor`.
    anchor: str
    # Lower-case literals one of which occurs in every match (the prefilter without Hyperscan).
    triggers: tuple[str, ...]
    caseless: bool = False
    mask: str = MASK


_KV_KEYS = r"(?:password|passwd|token|secret[_-]?key|secret|api[_-]?key|access[_-]?key|private[_-]?key)"
_KV_TRIGGERS = (
    "passw",
    "token",
    "secret",
    "api_key",
    "api-key",
    "apikey",
    "access_key",
    "access-key",
    "accesskey",
    "private_key",
    "private-key",
    "privatekey",
)

# What a quoted value is: up to the closing quote (the group `q` caught the opening one) or the
# line's end, and not a mask already there (a second pass leaves a redacted text as it is).
_QUOTED = r"(?!<redacted)(?:(?!\\?(?P={q}))[^\r\n])+"


def _value(q: str, bare: str) -> str:
    """A value in quotes runs to its closing quote (or the line's end: `--password "two words"`),
    else it is `bare`; `q` names the group that caught the opening quote. A quote escaped with a
    backslash, as in a JSON log line (`password=\\"X\\"`), is a quote too, its backslash kept."""
    return rf"(?({q}){_QUOTED.format(q=q)}|{bare})"


_BRANCHES: tuple[_Branch, ...] = (
    _Branch(
        "pk",
        r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----(?:[\s\S]{0,65536}?-----END[A-Z0-9 ]{0,40}PRIVATE KEY-----"
        r"|[^\n]*(?:\n[A-Za-z0-9+/=]{16,}[^\n]*)*)",
        r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----",
        ("private key",),
        mask="<redacted private key>",
    ),
    _Branch(
        "auth",
        r"""(?P<k_auth>(?i:authorization)["']?[ \t]*[:=][ \t]*["']?)[^\r\n"'<]+""",
        r"""authorization["']?[ \t]*[:=]""",
        ("authorization",),
        caseless=True,
    ),
    _Branch(
        "bearer",
        r"(?P<k_bearer>\b(?i:bearer)[ \t]+)[A-Za-z0-9._~+/=-]{8,}",
        r"\bbearer[ \t]+[A-Za-z0-9._~+/=-]{8}",
        ("bearer",),
        caseless=True,
    ),
    _Branch("aws", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}", ("akia", "asia")),
    _Branch(
        # `password=X`, `SECRET_KEY: X`, `"client_secret": "X"`, `--api-key="X Y"`.
        "kv",
        r"""(?P<k_kv>(?i:"""
        + _KV_KEYS
        + r""")\\?["']?[ \t]*[=:][ \t]*\\?(?P<q_kv>["'])?)"""
        + _value("q_kv", r"""[^\s"',;&<]+"""),
        _KV_KEYS + r"""\\?["']?[ \t]*[=:][ \t]*[^\s,;&<]""",
        _KV_TRIGGERS,
        caseless=True,
    ),
    _Branch(
        # `--password X`, `--api-key X`, `--hf_token 'X'`, `--secret-key "X"`: a secret-named flag and
        # its value after a space (a bare value starting with `-` is the next flag, not a value).
        "flag",
        r"""(?P<k_flag>(?<![A-Za-z0-9])--?(?:[A-Za-z0-9]+[_-])*(?i:"""
        + _KV_KEYS
        + r""")[ \t]+\\?(?P<q_flag>["'])?)"""
        + _value("q_flag", r"""[^\s"',;&<-][^\s"',;&<]*"""),
        r"""--?(?:[a-z0-9]+[_-])*""" + _KV_KEYS + r"""[ \t]+[^\s,;&<]""",
        _KV_TRIGGERS,
        caseless=True,
    ),
    _Branch(
        # An argument list printed as text, the flag and its value split in two:
        # `['--password', 'X']` (Python's repr, as CalledProcessError prints a command), `["--secret-key", "X"]`.
        "argv",
        r"""(?P<k_argv>["']--?(?:[A-Za-z0-9]+[_-])*(?i:"""
        + _KV_KEYS
        + r""")\\?["'][ \t]*,[ \t]*\\?(?P<q_argv>["']))"""
        + _QUOTED.format(q="q_argv"),
        r"""["']--?(?:[a-z0-9]+[_-])*""" + _KV_KEYS + r"""\\?["'][ \t]*,[ \t]*\\?["']""",
        _KV_TRIGGERS,
        caseless=True,
    ),
    _Branch(
        # Chat webhooks of known hosts whose URL is the credential (Slack, Feishu/Lark, Discord,
        # WeCom's ?key=, DingTalk's ?access_token=): trainmedic/hookurls.py, the table agent/urlsafe.py
        # masks settings and log records with.
        "hook",
        r"""(?P<k_hook>(?i:""" + hosted_hooks() + r"""))[^\s"'<>]+""",
        r"""(?:""" + hosted_hooks() + r""")[^\s"'<>]""",
        hook_hosts(),
        caseless=True,
    ),
    _Branch(
        # The same for a hook path of any host right after the host: `https://chat.example/hooks/<key>`.
        "hookpath",
        r"""(?P<k_hookpath>(?:(?<=://)|(?<=@))[A-Za-z0-9.-]+(?::[0-9]+)?(?i:""" + any_host_hooks() + r"""))"""
        r"""[^\s"'<>]+""",
        r"""[a-z0-9.-](?::[0-9]+)?(?:""" + any_host_hooks() + r""")[^\s"'<>]""",
        any_host_literals(),
        caseless=True,
    ),
    _Branch(
        "url",
        r"""(?P<k_url>(?<=[A-Za-z0-9+.-])://)[^\s/:@"'<>]+:[^\s/@"'<>]*(?P<t_url>@)""",
        r"""[A-Za-z0-9+.-]://[^\s/:@"'<>]+:[^\s/@"'<>]*@""",
        ("://",),
    ),
    _Branch(
        "jwt",
        r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8}",
        ("eyj",),
    ),
    _Branch(
        "vendor",
        r"\b(?:(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,}|glpat-[A-Za-z0-9_-]{20,}"
        r"|xox[abprs]-[A-Za-z0-9-]{10,}|hf_[A-Za-z0-9]{30,})",
        r"\b(?:(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30}|github_pat_[A-Za-z0-9_]{40}|glpat-[A-Za-z0-9_-]{20}"
        r"|xox[abprs]-[A-Za-z0-9-]{10}|hf_[A-Za-z0-9]{30})",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "xox", "hf_"),
    ),
)
_PK = 0
# A command-line flag that names a secret, alone in its argument (its value is the next one).
SECRET_FLAG = re.compile(r"^--?(?:[A-Za-z0-9]+[_-])*" + _KV_KEYS + r"$", re.IGNORECASE)


class _Redactor:
    """One redaction pass: candidates first (Hyperscan over the whole text, or literal triggers and
    the anchors), then the combined regex on the candidate lines only."""

    def __init__(self, *, use_hyperscan: bool = True) -> None:
        line_branches = [b for b in _BRANCHES if b.name != "pk"]
        combined = "|".join(f"(?P<b_{b.name}>{b.pattern})" for b in line_branches)
        self.line_b = re.compile(combined.encode())
        self.pk_b = re.compile(_BRANCHES[_PK].pattern.encode())
        self.all_s = re.compile(f"(?P<b_pk>{_BRANCHES[_PK].pattern})|{combined}")
        # Caseless anchors are lower-case and run on the lowered text (much faster than IGNORECASE).
        self.anchors = [re.compile(b.anchor.encode()) for b in _BRANCHES]
        self.caseless = [b.caseless for b in _BRANCHES]
        self.triggers = [tuple(t.encode() for t in b.triggers) for b in _BRANCHES]
        self.all_triggers = tuple(t for b in _BRANCHES for t in b.triggers)
        self.masks = {b.name: b.mask for b in _BRANCHES}
        self.db: Any = None
        self._local = threading.local()
        if use_hyperscan and _hs is not None:
            flags = [_hs.HS_FLAG_PREFILTER | (_hs.HS_FLAG_CASELESS if b.caseless else 0) for b in _BRANCHES]
            self.db = hsdb.compile_block([b.anchor.encode() for b in _BRANCHES], range(len(_BRANCHES)), flags)

    def _scratch(self) -> Any:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = _hs.Scratch(self.db)
        return scratch

    def candidates(self, data: bytes) -> tuple[list[int], list[int]]:
        """(end offsets of private key headers, end offsets of line-local candidates)."""
        pk: list[int] = []
        line: list[int] = []
        if not data:
            return pk, line
        if self.db is not None:

            def on_match(i: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
                (pk if i == _PK else line).append(end)

            self.db.scan(data, match_event_handler=on_match, scratch=self._scratch())
            return pk, line
        low = data.lower()
        for i, (anchor, triggers) in enumerate(zip(self.anchors, self.triggers, strict=True)):
            if any(t in low for t in triggers):
                text = low if self.caseless[i] else data
                (pk if i == _PK else line).extend(m.end() for m in anchor.finditer(text))
        return pk, line

    def _repl(self, m: re.Match[Any]) -> Any:
        name = (m.lastgroup or "b_")[2:]
        groups = m.groupdict()
        keep = groups.get(f"k_{name}") or m.group(0)[:0]
        tail = groups.get(f"t_{name}") or m.group(0)[:0]
        mask = self.masks.get(name, MASK)
        return keep + (mask.encode() if isinstance(keep, bytes) else mask) + tail

    def redact_bytes(self, data: bytes) -> tuple[bytes, int]:
        pk, line = self.candidates(data)
        count = 0
        if pk:
            data, count = self._redact_pk(data, pk)
            if count:
                _pk2, line = self.candidates(data)
        if not line:
            return data, count
        ranges = sorted({_line_range(data, end) for end in line})
        out: list[bytes] = []
        pos = 0
        for start, end in ranges:
            if start < pos:
                continue
            new, n = self.line_b.subn(self._repl, data[start:end])
            if n:
                out.append(data[pos:start])
                out.append(new)
                pos = end
                count += n
        if not out:
            return data, count
        out.append(data[pos:])
        return b"".join(out), count

    def _redact_pk(self, data: bytes, ends: list[int]) -> tuple[bytes, int]:
        out: list[bytes] = []
        pos = 0
        count = 0
        for end in sorted(ends):
            begin = data.rfind(b"-----BEGIN", pos, end)
            if begin < 0:
                continue
            m = self.pk_b.match(data, begin)
            if m is None:
                continue
            out.append(data[pos:begin])
            out.append(self.masks["pk"].encode())
            pos = m.end()
            count += 1
        out.append(data[pos:])
        return b"".join(out), count

    def redact_str(self, text: str) -> tuple[str, int]:
        if len(text) < 7:
            return text, 0
        low = text.lower()
        if not any(t in low for t in self.all_triggers):
            return text, 0
        new, n = self.all_s.subn(self._repl, text)
        return new, n


def _line_range(data: bytes, end: int) -> tuple[int, int]:
    start = data.rfind(b"\n", 0, max(end - 1, 0)) + 1
    stop = data.find(b"\n", end - 1 if end > 0 else 0)
    return start, len(data) if stop < 0 else stop


@cache
def _redactor(use_hyperscan: bool = True) -> _Redactor:
    return _Redactor(use_hyperscan=use_hyperscan)


def warm_redactor() -> None:
    """Build the redactor now (its regexes and Hyperscan database: a few hundred ms): callers on an
    event loop run this in a thread at start, so the first scene does not build it on the loop."""
    _redactor()


def redact_text(text: str) -> tuple[str, int]:
    """Secrets in a text replaced (the same pass every file of a bundle goes through), and how many."""
    data, n = _redactor().redact_bytes(text.encode("utf-8", "surrogatepass"))
    return data.decode("utf-8", "surrogatepass"), n


def _redact_obj(obj: Any, settings: SceneSettings, counter: list[int], redactor: _Redactor) -> Any:
    """A copy of a JSON-like object: env values redacted, noisy annotations dropped, every string
    passed through the text redaction."""
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            key = str(k)
            if key == "env" and isinstance(v, list):
                out[key] = [_redact_env(e, settings, counter, redactor) for e in v]
            elif key == "annotations" and isinstance(v, Mapping):
                kept = {}
                for ak, av in v.items():
                    if str(ak) in DROPPED_ANNOTATIONS:
                        counter[0] += 1
                        continue
                    kept[str(ak)] = _redact_obj(av, settings, counter, redactor)
                out[key] = kept
            else:
                out[key] = _redact_obj(v, settings, counter, redactor)
        return out
    if isinstance(obj, list | tuple):
        out_list: list[Any] = []
        for i, v in enumerate(obj):
            if i and isinstance(v, str) and isinstance(obj[i - 1], str) and SECRET_FLAG.match(obj[i - 1]):
                # args split in two: ["--hf_token", "hf_..."]: the value is the element after the flag.
                out_list.append(MASK)
                counter[0] += 1
            else:
                out_list.append(_redact_obj(v, settings, counter, redactor))
        return out_list
    if isinstance(obj, str):
        new, n = redactor.redact_str(obj)
        counter[0] += n
        return new
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    return str(obj)


def redact_object(obj: Any, settings: SceneSettings | None = None) -> Any:
    """A copy of a JSON-like object as the scene writes objects: env values masked unless they only
    configure the job, every string through the text redaction, secret flags' values in args."""
    return _redact_obj(obj, settings or SceneSettings(), [0], _redactor())


def _env_allowed(name: str, settings: SceneSettings) -> bool:
    if _SECRET_NAME.search(name):
        return False
    return name in settings.env_allow_names or name.startswith(settings.env_allow_prefixes)


def _redact_env(e: Any, settings: SceneSettings, counter: list[int], redactor: _Redactor) -> Any:
    if not isinstance(e, Mapping):
        return _redact_obj(e, settings, counter, redactor)
    out = _redact_obj({k: v for k, v in e.items() if k != "value"}, settings, counter, redactor)
    if "value" in e:
        value = e["value"]
        if _env_allowed(str(e.get("name", "")), settings) or value in (None, ""):
            out["value"] = _redact_obj(value, settings, counter, redactor)
        else:
            out["value"] = MASK
            counter[0] += 1
    return out
