"""Scene bundle ("保留现场"): the evidence of an incident, kept before anything is changed.

Remediation deletes pods and recreates workloads, and what they knew goes with them. So before any
action the responder saves one directory per incident, for the people who look into it later and
for tools that analyse it again (`trainmedic diagnose --scene DIR`):

    <root>/<incident_id>/
        manifest.json          every file with its size, sha256, line count, whether it was cut and
                               how many secrets were redacted; the job, the root cause; what could
                               not be collected and why; the limits used
        findings.json          the diagnosis (docs/contracts.md JSON), each finding with its place
                               and its evidence: the line in this bundle's own files where it is
        layout/<node>/rank<R>_<pod>_<container>.log (+ .previous.log after a restart)   the last N
                               lines of each container, one folder per node as collected logs
                               are laid out (`diagnose --logs` of the bundle places them too)
        events.yaml            core/v1 events about the job, its pods and their nodes
        objects/workload.yaml  the workload as it was: what a crashed restart recreates it from
        objects/pods/<pod>.yaml, objects/nodes/<node>.yaml
        layout/<node>/dmesg    the node's kernel lines around the fault, oldest first, beside its
                               containers' logs (manifest `kernel_sections`), so a bundle read as a
                               collected layout (`diagnose --logs`) names the node of a host fault as
                               `--scene` does; bundles written before keep them in one `kernel.log`
        metrics.json           the nodes' accelerator metrics before the fault
        checkpoints.json       the checkpoint listing
        stacks/<pod>.txt       for a hang: the Python stacks of the training processes, taken before
                               anything kills them (remediations.stacks)

Atomic: the bundle is built in `<root>/.<incident_id>.partial/` and renamed into place once whole
(the manifest written last), so a crash leaves a partial directory, never a bundle that looks
complete; the next call starts it afresh. A complete bundle is never rewritten: a second call
returns it as it is.

Safe to hand around: env values in pod and workload specs are replaced unless the name only
configures the job (RANK, MASTER_ADDR, NCCL_*, ...), last-applied-configuration annotations are
dropped, and every text goes through one redaction pass (bearer tokens, Authorization headers, AWS
keys, password= / token= / secret= values, private keys, URL credentials, JWTs, vendor tokens),
counted per file.

Bounded and best effort: a per-file cap (a log over it keeps its tail), a total cap (bulky files
past it are skipped), a cap per line, undecodable bytes replaced; a pod whose log cannot be read,
metrics that are not available, an exec that is forbidden are each a `problems` entry, never a
failure of the bundle.

Fast: logs are fetched concurrently (bounded) and cleaned, redacted, hashed and written in worker
threads, with no per-line Python work on the common path: line scans are numpy passes, and the
redaction regexes run only on the lines that Hyperscan (or, without it, literal triggers) finds
may hold a secret.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import yaml

from trainmedic import hsdb
from trainmedic.errors import TrainmedicError
from trainmedic.events import DiagnosisEvent
from trainmedic.models import Finding, Source
from trainmedic.remediations.stacks import ExecResult, StackDump, StackSettings, dump_stacks
from trainmedic.timefmt import rfc3339
from trainmedic.udal.registry import env_prefixes, visible_devices_envs

_hs = hsdb.hs

__all__ = [
    "MANIFEST",
    "SCHEMA_VERSION",
    "LoadedScene",
    "SceneError",
    "SceneInputs",
    "SceneLog",
    "SceneResult",
    "SceneSettings",
    "SceneSource",
    "clean_log_text",
    "event_order",
    "load_scene",
    "log_rel",
    "pod_containers",
    "pod_rank",
    "redact_text",
    "save_scene",
    "valid_bundle_name",
]

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
MASK = "<redacted>"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
T = TypeVar("T")

try:
    _YAML_DUMPER: Any = yaml.CSafeDumper
    _YAML_LOADER: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML without libyaml
    _YAML_DUMPER = yaml.SafeDumper
    _YAML_LOADER = yaml.SafeLoader


class SceneError(TrainmedicError):
    """A bundle that cannot be written or read (bad incident id, corrupt manifest, ...)."""


def valid_bundle_name(name: str) -> bool:
    """Whether `name` can name a bundle's directory (the incident id: letters, digits, . _ -)."""
    return bool(_ID.match(name))


# ------------------------------------------------------------------------------------------------
# Inputs, settings, results


class SceneSource(Protocol):
    """Where the scene reads from: the API server (remediations.kube.KubeOps, exec over
    remediations.stacks.exec_in_pod) and the agent's metrics. Failures are recorded as problems.

    `list_events(namespace, involved=...)` returns the namespace's core/v1 events about the
    (kind, name) pairs given; `metrics_range` returns {series name: [(time, value), ...]} for a
    node, or None (or raises NotImplementedError) where no metrics source is configured."""

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        tail_lines: int,
        previous: bool = False,
        limit_bytes: int = ...,
    ) -> str: ...

    async def list_events(self, namespace: str, *, involved: set[tuple[str, str]]) -> list[dict[str, Any]]: ...

    async def metrics_range(
        self, node: str, start: float, end: float, step: float
    ) -> Mapping[str, list[tuple[float, float]]] | None: ...

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult: ...


ENV_ALLOW_NAMES = (
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "NPROC_PER_NODE",
    "OMP_NUM_THREADS",
    "PYTHONUNBUFFERED",
    "TRAINMEDIC_RESUME_FROM",
    "TRAINMEDIC_RESUME_STEP",
)
ENV_ALLOW_PREFIXES = ("TORCH_", "PYTORCH_")
# Beside these, every chip plugin's visible-devices variables (CUDA_VISIBLE_DEVICES, ...) and
# collective-library prefixes (NCCL_, HCCL_, CNCL_, ...) are kept (SceneSettings' defaults).
# A name on the allowlist is still redacted when it looks like a credential (TORCH_HUB_TOKEN).
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|(?:^|_)KEY(?:$|_)", re.IGNORECASE)
DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


@dataclass(frozen=True, kw_only=True)
class SceneSettings:
    """What a scene collects and its bounds (the `remediate.scene` settings)."""

    # Last lines kept per container instance (the current one and, after a restart, the previous).
    log_lines: int = 10_000
    # A file over this keeps its tail (logs) or is left out (objects); marked `truncated`.
    max_file_bytes: int = 8 << 20
    # Bulky files (logs, kernel, metrics, stacks, events) past this total are left out, each a problem.
    max_total_bytes: int = 256 << 20
    # Longer lines are cut to this many bytes (a marker says how much went).
    max_line_bytes: int = 64 << 10
    # Container logs fetched at the same time.
    concurrency: int = 16
    # Kernel lines kept from this long before the fault to this long after it, at most max_kernel_lines.
    kernel_before_s: float = 600.0
    kernel_after_s: float = 60.0
    max_kernel_lines: int = 20_000
    # Accelerator metrics of this window before the fault, at this resolution.
    metrics_window_s: float = 900.0
    # After the fault, up to the scene's own time: what the fault did to the devices.
    metrics_after_s: float = 60.0
    metrics_step_s: float = 15.0
    max_metric_series: int = 256
    max_metric_points: int = 4096
    max_events: int = 5000
    # Stack dumps for a hang (remediations.stacks), bounded per pod.
    stacks: bool = True
    stack_timeout_s: float = 20.0
    # fsync files and directories before the bundle is renamed into place (survives a power loss).
    durable: bool = True
    env_allow_names: tuple[str, ...] = field(default_factory=lambda: (*ENV_ALLOW_NAMES, *visible_devices_envs()))
    env_allow_prefixes: tuple[str, ...] = field(default_factory=lambda: (*env_prefixes(), *ENV_ALLOW_PREFIXES))

    def limits(self) -> dict[str, object]:
        out = asdict(self)
        out.pop("env_allow_names")
        out.pop("env_allow_prefixes")
        return out


@dataclass(frozen=True, kw_only=True)
class SceneInputs:
    """What the responder knows when it saves a scene. Objects are the API's JSON (camelCase dicts).

    `kernel_lines`: node -> [(wall-clock time, line)]; `ranks`: pod name -> rank, where the agent's
    job index knows it (else the pod's RANK env is used).
    """

    incident_id: str
    diagnosis: DiagnosisEvent
    workload: Mapping[str, Any] | None = None
    pods: Sequence[Mapping[str, Any]] = ()
    nodes: Sequence[Mapping[str, Any]] = ()
    kernel_lines: Mapping[str, Sequence[tuple[float, str]]] = field(default_factory=dict)
    checkpoints: Sequence[Mapping[str, Any]] = ()
    hang: bool = False
    now: float
    ranks: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SceneResult:
    dir: Path
    manifest: dict[str, Any]
    # False: the bundle was already complete and was returned as it is.
    created: bool

    @property
    def problems(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("problems") or [])


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


_KV_KEYS = r"(?:password|passwd|token|secret|api[_-]?key|access[_-]?key|private[_-]?key)"
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
        "kv",
        r"""(?P<k_kv>(?i:""" + _KV_KEYS + r""")["']?[ \t]*[=:][ \t]*["']?)[^\s"',;&<]+""",
        _KV_KEYS + r"""["']?[ \t]*[=:][ \t]*["']?[^\s"',;&<]""",
        (
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
        ),
        caseless=True,
    ),
    _Branch(
        # `--password X`, `--api-key X`, `--hf_token X`: a secret-named flag and its value after a space.
        "flag",
        r"""(?P<k_flag>(?<![A-Za-z0-9])--?(?:[A-Za-z0-9]+[_-])*(?i:""" + _KV_KEYS + r""")[ \t]+)"""
        r"""[^\s"',;&<-][^\s"',;&<]*""",
        r"""--?(?:[a-z0-9]+[_-])*""" + _KV_KEYS + r"""[ \t]+[^\s"',;&<-]""",
        ("passw", "token", "secret", "api_key", "api-key", "apikey", "access_key", "access-key", "private_key"),
        caseless=True,
    ),
    _Branch(
        # Slack incoming-webhook and workflow URLs: the path is the credential.
        "slack",
        r"""(?P<k_slack>hooks\.slack\.com/(?:services|workflows|triggers)/)[^\s"'<>]+""",
        r"""hooks\.slack\.com/(?:services|workflows|triggers)/[^\s"'<>]""",
        ("hooks.slack.com",),
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


# ------------------------------------------------------------------------------------------------
# Text cleaning (bytes in, bytes out; numpy for the line scans)


def _newlines(data: bytes) -> np.ndarray[Any, Any]:
    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)


def _keep_tail_lines(data: bytes, n: int) -> bytes:
    if n <= 0:
        return b""
    if data.count(b"\n") < n:
        return data
    nl = _newlines(data)
    # Lines are the text between newlines; a final newline ends the last one.
    full = len(nl) if data.endswith(b"\n") else len(nl) + 1
    if full <= n:
        return data
    cut = int(nl[full - n - 1]) + 1
    return data[cut:]


def _cut_long_lines(data: bytes, limit: int) -> tuple[bytes, int]:
    if len(data) <= limit:
        return data, 0
    nl = _newlines(data)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [len(data)]))
    long = np.flatnonzero(ends - starts > limit)
    if not len(long):
        return data, 0
    parts: list[bytes] = []
    pos = 0
    for i in long.tolist():
        s, e = int(starts[i]), int(ends[i])
        parts.append(data[pos : s + limit])
        parts.append(b" [... %d bytes cut]" % (e - s - limit))
        pos = e
    parts.append(data[pos:])
    return b"".join(parts), len(long)


def _clean(data: bytes, settings: SceneSettings, *, tail_lines: int | None) -> tuple[bytes, bool, int]:
    """(text, truncated, lines cut): the last lines within the file cap, long lines cut, valid UTF-8."""
    truncated = False
    if tail_lines is not None:
        kept = _keep_tail_lines(data, tail_lines)
        truncated = len(kept) < len(data)
        data = kept
    if len(data) > settings.max_file_bytes:
        data = data[-settings.max_file_bytes :]
        nl = data.find(b"\n")
        if 0 <= nl < len(data) - 1:
            data = data[nl + 1 :]
        truncated = True
    data, cut = _cut_long_lines(data, settings.max_line_bytes)
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            data = data.decode("utf-8", "replace").encode("utf-8")
    if b"\x00" in data:
        data = data.replace(b"\x00", "\ufffd".encode())
    return data, truncated, cut


def _prepare_text(
    raw: bytes, settings: SceneSettings, redactor: _Redactor, tail_lines: int | None
) -> tuple[bytes, bool, int, int]:
    """(text, truncated, lines cut, redactions): what a text file of the bundle holds."""
    data, truncated, cut = _clean(raw, settings, tail_lines=tail_lines)
    data, redactions = redactor.redact_bytes(data)
    if len(data) > settings.max_file_bytes:  # the masks made it longer
        data = data[-settings.max_file_bytes :]
        truncated = True
    return data, truncated, cut, redactions


def clean_log_text(text: str, settings: SceneSettings | None = None) -> bytes:
    """A container log as a bundle keeps it (its last `log_lines` within the file cap, long lines cut,
    valid UTF-8, secrets redacted): what `diagnose --job` classifies, so it reads what `--scene` reads."""
    settings = settings or SceneSettings()
    raw = text.encode("utf-8", "replace")
    return _prepare_text(raw, settings, _redactor(), settings.log_lines)[0]


def event_order(e: Mapping[str, Any]) -> tuple[str, str, str]:
    """How events are ordered in a bundle and in a diagnosis: by time, then namespace and name."""
    meta = _map(e.get("metadata"))
    return (_event_key(e), str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _count_lines(data: bytes) -> int:
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


# ------------------------------------------------------------------------------------------------
# The writer: files of the partial bundle, written in threads, with the budget and the entries


class _Abandoned(Exception):
    """The bundle is being abandoned (the build failed or was cancelled): write nothing more."""


class _Writer:
    def __init__(self, base: Path, settings: SceneSettings, redactor: _Redactor) -> None:
        self.base = base
        self.settings = settings
        self.redactor = redactor
        self.entries: list[dict[str, Any]] = []
        self.problems: list[dict[str, Any]] = []
        self.total = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._inflight = 0
        self._closed = False

    # -- bookkeeping (any thread) --

    def problem(self, what: str, en: str, zh: str) -> None:
        with self._lock:
            self.problems.append({"what": what, "reason": {"en": en, "zh": zh}})

    def _enter(self) -> None:
        with self._lock:
            if self._closed:
                raise _Abandoned
            self._inflight += 1

    def _leave(self) -> None:
        with self._lock:
            self._inflight -= 1
            self._idle.notify_all()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread, counted so that `abandon` can wait for it."""

        def guarded() -> T:
            self._enter()
            try:
                return fn(*args)
            finally:
                self._leave()

        return await asyncio.to_thread(guarded)

    def _wait_idle(self) -> None:
        with self._lock:
            self._closed = True
            while self._inflight:
                self._idle.wait()

    async def abandon(self) -> None:
        """Stop: nothing is written after this returns (threads in flight are waited for)."""
        with self._lock:
            self._closed = True
        await asyncio.shield(asyncio.to_thread(self._wait_idle))

    # -- files (worker threads) --

    def _reserve(self, rel: str, size: int, bulky: bool) -> bool:
        with self._lock:
            if bulky and self.total + size > self.settings.max_total_bytes:
                self.problems.append(
                    {
                        "what": rel,
                        "reason": {
                            "en": f"left out: the bundle's total cap ({self.settings.max_total_bytes} bytes) "
                            "is reached",
                            "zh": f"未保存：已达到现场包总大小上限（{self.settings.max_total_bytes} 字节）",
                        },
                    }
                )
                return False
            self.total += size
            return True

    def _write(self, rel: str, data: bytes) -> str:
        path = self.base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(data).hexdigest()
        with open(path, "wb") as fh:
            fh.write(data)
            if self.settings.durable:
                fh.flush()
                os.fsync(fh.fileno())
        return digest

    def put_text(
        self,
        rel: str,
        kind: str,
        raw: bytes,
        *,
        tail_lines: int | None = None,
        bulky: bool = True,
        meta: Mapping[str, Any] | None = None,
        needles: Sequence[bytes] = (),
    ) -> tuple[dict[str, Any] | None, dict[int, tuple[int, int]]]:
        """A text file: cleaned, redacted, bounded. Returns its entry and where the needles are
        (index -> first and last line number), or (None, {}) when it was left out."""
        data, truncated, cut, redactions = _prepare_text(raw, self.settings, self.redactor, tail_lines)
        if not self._reserve(rel, len(data), bulky):
            return None, {}
        entry: dict[str, Any] = {
            "path": rel,
            "kind": kind,
            "bytes": len(data),
            "sha256": self._write(rel, data),
            "truncated": truncated,
            "lines": _count_lines(data),
            "redactions": redactions,
        }
        if cut:
            entry["cut_lines"] = cut
        entry.update(meta or {})
        hits: dict[int, tuple[int, int]] = {}
        for i, needle in enumerate(needles):
            first = data.find(needle) if needle else -1
            if first >= 0:
                last = data.rfind(needle)
                hits[i] = (data.count(b"\n", 0, first) + 1, data.count(b"\n", 0, last) + 1)
        with self._lock:
            self.entries.append(entry)
        return entry, hits

    def put_data(
        self,
        rel: str,
        kind: str,
        obj: Any,
        *,
        fmt: str,
        bulky: bool,
        meta: Mapping[str, Any] | None = None,
        redactions: int | None = None,
    ) -> dict[str, Any] | None:
        """A YAML or JSON file: every string redacted first (the syntax stays valid); never cut.

        `redactions` given: the caller has redacted the strings of `obj` already (bulk numeric data
        such as metrics, whose walk would cost more than the file), so it is written compact as is."""
        counter = [0]
        if redactions is None:
            clean = _redact_obj(obj, self.settings, counter, self.redactor)
        else:
            clean, counter[0] = obj, redactions
        try:
            if fmt == "yaml":
                text = yaml.dump(clean, Dumper=_YAML_DUMPER, sort_keys=False, allow_unicode=True, width=4096)
            elif redactions is not None:
                # No indent: the C encoder (the indented one is pure Python, ~10x slower on big arrays).
                text = json.dumps(clean, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
            else:
                text = json.dumps(clean, ensure_ascii=False, indent=1, allow_nan=False) + "\n"
        except (yaml.YAMLError, TypeError, ValueError) as exc:
            self.problem(rel, f"cannot be serialized: {exc}", f"无法序列化：{exc}")
            return None
        data = text.encode("utf-8", "replace")
        if len(data) > self.settings.max_file_bytes:
            self.problem(
                rel,
                f"left out: {len(data)} bytes is over the per-file cap ({self.settings.max_file_bytes})",
                f"未保存：{len(data)} 字节超过单文件上限（{self.settings.max_file_bytes}）",
            )
            return None
        if not self._reserve(rel, len(data), bulky):
            return None
        entry: dict[str, Any] = {
            "path": rel,
            "kind": kind,
            "bytes": len(data),
            "sha256": self._write(rel, data),
            "truncated": False,
            "redactions": counter[0],
        }
        entry.update(meta or {})
        with self._lock:
            self.entries.append(entry)
        return entry


# ------------------------------------------------------------------------------------------------
# Small accessors of API objects


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _name(obj: Mapping[str, Any]) -> str | None:
    name = _map(obj.get("metadata")).get("name")
    return str(name) if isinstance(name, str) and name else None


def _safe(name: str) -> str:
    """A file name from an object name (Kubernetes names are safe already; input is not trusted)."""
    safe = _UNSAFE.sub("_", name)[:200]
    return safe if safe not in ("", ".", "..") else "_"


@dataclass
class _PodInfo:
    namespace: str
    name: str
    file: str
    node: str | None
    rank: int | None
    uid: str | None
    containers: list[dict[str, Any]]


def log_rel(node: str | None, rank: int | None, pod: str, container: str, *, previous: bool) -> str:
    """Where a container's log goes: `layout/<node>/rank<R>_<pod>_<container>[.previous].log`, the
    collected layout `diagnose --logs` reads (detectors/layout.py: one folder per node, the rank in
    the name), so the bundle diagnosed as a directory places its findings as `--scene` does. A pod
    with no node goes under `layout/_unscheduled/`; one with no rank has no `rank<R>_`. The name a
    live `diagnose --job` gives the same log, so both report the same `file`."""
    folder = _safe(node) if node else "_unscheduled"
    prefix = f"rank{rank}_" if rank is not None else ""
    return f"layout/{folder}/{prefix}{_safe(pod)}_{_safe(container)}{'.previous' if previous else ''}.log"


def _log_rel(p: _PodInfo, c: Mapping[str, Any], *, previous: bool) -> str:
    node = _safe(p.node) if p.node else "_unscheduled"
    rank = f"rank{p.rank}_" if p.rank is not None else ""
    return f"layout/{node}/{rank}{p.file}_{c['file']}{'.previous' if previous else ''}.log"


def pod_containers(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The containers whose logs a bundle keeps, init containers first: name, restarts, and whether a
    previous instance's log is worth reading (it restarted, or its last state is a termination)."""
    spec, status = _map(pod.get("spec")), _map(pod.get("status"))
    statuses = {
        str(_map(s).get("name")): _map(s)
        for s in [*_list(status.get("initContainerStatuses")), *_list(status.get("containerStatuses"))]
    }
    names: list[str] = []
    for key in ("initContainers", "containers"):
        names += [str(_map(c).get("name")) for c in _list(spec.get(key)) if _map(c).get("name")]
    names += [n for n in statuses if n not in names]
    out = []
    for c in names:
        s = statuses.get(c, {})
        restarts = s.get("restartCount")
        restarted = (isinstance(restarts, int) and restarts > 0) or "terminated" in _map(s.get("lastState"))
        out.append(
            {
                "name": c,
                "file": _safe(c),
                "restarts": restarts if isinstance(restarts, int) else 0,
                "restarted": restarted,
            }
        )
    return out


def pod_rank(pod: Mapping[str, Any], ranks: Mapping[str, int] | None = None) -> int | None:
    """A pod's rank as a bundle records it: the job index's (`ranks`), else its RANK env."""
    rank = (ranks or {}).get(str(_name(pod)))
    return rank if isinstance(rank, int) else _rank_env(pod)


def _rank_env(pod: Mapping[str, Any]) -> int | None:
    for c in _list(_map(pod.get("spec")).get("containers")):
        for item in _list(_map(c).get("env")):
            e = _map(item)
            if e.get("name") == "RANK" and str(e.get("value", "")).isdigit():
                return int(str(e["value"]))
    return None


def _pod_infos(inputs: SceneInputs) -> list[_PodInfo]:
    out: list[_PodInfo] = []
    used: set[str] = set()
    for pod in inputs.pods:
        if not isinstance(pod, Mapping) or _name(pod) is None:
            continue
        meta, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
        name = str(meta["name"])
        file = _safe(name)
        while file in used:
            file += "_"
        used.add(file)
        containers = pod_containers(pod)
        node = spec.get("nodeName")
        uid = meta.get("uid")
        out.append(
            _PodInfo(
                namespace=str(meta.get("namespace") or "default"),
                name=name,
                file=file,
                node=str(node) if isinstance(node, str) and node else None,
                rank=pod_rank(pod, inputs.ranks),
                uid=str(uid) if isinstance(uid, str) else None,
                containers=containers,
            )
        )
    return out


def _fault_time(d: DiagnosisEvent, now: float) -> float:
    times = [f.timestamp for f in d.diagnosis.findings if f.timestamp is not None and math.isfinite(f.timestamp)]
    if times:
        return min(times)
    return d.window_start if d.window_start and math.isfinite(d.window_start) else now


def _needle(finding: Finding, redactor: _Redactor) -> bytes:
    """The part of a finding's text to look for in the saved files (its first line, without the
    ellipses of a clipped text, redacted as the files are)."""
    first = finding.text.split("\n", 1)[0]
    piece = max(first.split("…"), key=len).strip()
    if len(piece) < 8:
        return b""
    piece, _ = redactor.redact_str(piece)
    return piece.encode("utf-8", "replace")


# ------------------------------------------------------------------------------------------------
# save_scene


def _read_complete(final: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((final / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("schema_version") == SCHEMA_VERSION else None


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def _fsync_tree(path: Path) -> None:
    for d, _dirs, _files in os.walk(path):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _commit(partial: Path, final: Path, manifest: dict[str, Any], durable: bool) -> dict[str, Any]:
    data = (json.dumps(manifest, ensure_ascii=False, indent=1, allow_nan=False) + "\n").encode()
    with open(partial / MANIFEST, "wb") as fh:
        fh.write(data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    if durable:
        _fsync_tree(partial)
    try:
        os.rename(partial, final)
    except OSError:
        existing = _read_complete(final)
        if existing is None:
            raise
        shutil.rmtree(partial, ignore_errors=True)
        return existing
    if durable:
        _fsync_dir(final.parent)
    return manifest


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def save_scene(
    root: Path | str,
    inputs: SceneInputs,
    source: SceneSource,
    settings: SceneSettings = SceneSettings(),
) -> SceneResult:
    """Save (once) the scene of an incident under `root/<incident_id>/` and return it.

    Idempotent: a complete bundle is returned unchanged (`created` False). What cannot be collected
    is listed in the manifest's `problems`; only a bad incident id, an unwritable root, or the task
    being cancelled stop it (then only a `.partial` directory is left, which the next call replaces).
    """
    if not _ID.match(inputs.incident_id):
        raise SceneError(f"incident id {inputs.incident_id!r} cannot name a directory (letters, digits, . _ -)")
    root = Path(root)
    final = root / inputs.incident_id
    existing = await asyncio.to_thread(_read_complete, final)
    if existing is not None:
        return SceneResult(dir=final, manifest=existing, created=False)
    if final.exists():
        raise SceneError(f"{final} exists but holds no complete scene bundle (no readable {MANIFEST})")
    partial = root / f".{inputs.incident_id}.partial"
    try:
        await asyncio.to_thread(_fresh_dir, partial)
    except OSError as exc:
        raise SceneError(f"cannot create {partial}: {exc.strerror or exc}") from exc
    writer = _Writer(partial, settings, _redactor())
    started = time.monotonic()
    try:
        manifest = await _build(writer, inputs, source, settings)
        manifest["collect_s"] = round(time.monotonic() - started, 3)
        manifest = await writer.run(_commit, partial, final, manifest, settings.durable)
    except BaseException:
        await writer.abandon()
        raise
    return SceneResult(dir=final, manifest=manifest, created=True)


async def _build(writer: _Writer, inputs: SceneInputs, source: SceneSource, settings: SceneSettings) -> dict[str, Any]:
    d = inputs.diagnosis
    fault = _fault_time(d, inputs.now)
    pods = _pod_infos(inputs)
    redactor = writer.redactor

    job: dict[str, Any] | None = None
    if d.job is not None:
        job = {"namespace": d.job.namespace, "name": d.job.name, "kind": d.job.kind, "api_version": d.job.api_version}
    elif inputs.workload is not None:
        meta = _map(inputs.workload.get("metadata"))
        job = {
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "kind": inputs.workload.get("kind"),
            "api_version": inputs.workload.get("apiVersion"),
        }

    # Stacks first: for a hang they exist only while the processes live, and SIGUSR1 dumps land in
    # the logs collected next.
    stacks: dict[str, StackDump] = {}
    if inputs.hang and settings.stacks and pods:
        stacks = await dump_stacks(
            source,
            [p for p in inputs.pods if isinstance(p, Mapping)],
            timeout_s=settings.stack_timeout_s,
            settings=StackSettings(concurrency=settings.concurrency),
        )

    findings = list(d.diagnosis.findings)
    needles = [_needle(f, redactor) for f in findings]
    evidence: dict[int, dict[str, Any]] = {}

    node_names = sorted(
        {p.node for p in pods if p.node}
        | {n for n in (_name(x) for x in inputs.nodes if isinstance(x, Mapping)) if n}
        | set(inputs.kernel_lines)
    )

    await _all(
        _collect_logs(writer, pods, source, settings, findings, needles, evidence),
        _collect_events(writer, inputs, pods, node_names, source, settings),
        _collect_metrics(writer, node_names, fault, inputs.now, source, settings),
    )
    # Every node's kernel lines in the window around the fault, one file per node, written in one job
    # off the event loop (a large job has hundreds of nodes).
    kernel_sections = await writer.run(_write_kernel, writer, inputs, fault, settings, findings, needles, evidence)
    await writer.run(_write_objects, writer, inputs, pods)
    await writer.run(_write_stacks, writer, stacks, pods)
    await writer.run(
        lambda: writer.put_data(
            "checkpoints.json", "checkpoints", {"checkpoints": list(inputs.checkpoints)}, fmt="json", bulky=False
        )
    )
    await writer.run(
        lambda: writer.put_data(
            "findings.json", "findings", _findings_doc(d, findings, evidence), fmt="json", bulky=False
        )
    )

    rc = d.diagnosis.root_cause
    entries = sorted(writer.entries, key=lambda e: str(e["path"]))
    by_path = {str(e["path"]): e for e in entries}
    return {
        "schema_version": SCHEMA_VERSION,
        "incident_id": inputs.incident_id,
        "created": rfc3339(inputs.now),
        "fault_time": rfc3339(fault),
        "job": job,
        "diagnosis_id": d.diagnosis_id,
        "root_cause": rc.contract_dict("en") if rc else None,
        "hang": inputs.hang,
        "pods": [
            {
                "name": p.name,
                "namespace": p.namespace,
                "node": p.node,
                "rank": p.rank,
                "uid": p.uid,
                "object": f"objects/pods/{p.file}.yaml" if f"objects/pods/{p.file}.yaml" in by_path else None,
                "containers": [
                    {
                        "name": c["name"],
                        "restarts": c["restarts"],
                        "log": _present(by_path, _log_rel(p, c, previous=False)),
                        "previous_log": _present(by_path, _log_rel(p, c, previous=True)),
                    }
                    for c in p.containers
                ],
            }
            for p in pods
        ],
        "nodes": node_names,
        "kernel_sections": kernel_sections,
        "stacks": {name: dump.as_dict() for name, dump in sorted(stacks.items())},
        "files": entries,
        "problems": sorted(writer.problems, key=lambda p: str(p["what"])),
        "limits": settings.limits(),
        "total_bytes": writer.total,
    }


async def _all(*coros: Coroutine[Any, Any, None]) -> None:
    """Run side by side; when one fails (or this is cancelled), the others are cancelled and waited
    for before the failure goes on, so nothing keeps writing into an abandoned bundle."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _present(by_path: Mapping[str, Any], rel: str) -> str | None:
    return rel if rel in by_path else None


async def _collect_logs(
    writer: _Writer,
    pods: list[_PodInfo],
    source: SceneSource,
    settings: SceneSettings,
    findings: list[Finding],
    needles: list[bytes],
    evidence: dict[int, dict[str, Any]],
) -> None:
    gate = asyncio.Semaphore(max(1, settings.concurrency))

    async def one(p: _PodInfo, c: dict[str, Any], previous: bool) -> None:
        rel = _log_rel(p, c, previous=previous)
        mine = [
            i
            for i, f in enumerate(findings)
            if f.pod == p.name and (f.namespace in (None, p.namespace)) and needles[i] and i not in evidence
        ]
        async with gate:
            try:
                text = await source.pod_log(
                    p.namespace,
                    p.name,
                    c["name"],
                    tail_lines=settings.log_lines,
                    previous=previous,
                    limit_bytes=settings.max_file_bytes,
                )
            except Exception as exc:  # noqa: BLE001 - one pod's log is a problem entry, not a failure
                writer.problem(
                    rel,
                    f"the log could not be read: {type(exc).__name__}: {exc}"[:500],
                    f"无法读取日志：{type(exc).__name__}: {exc}"[:500],
                )
                return
            if previous and not text:
                writer.problem(
                    rel,
                    "the previous instance's log is gone (or was empty)",
                    "上一次运行的容器日志已不存在（或为空）",
                )
                return
            raw = text.encode("utf-8", "replace") if isinstance(text, str) else bytes(text)
            meta = {"pod": p.name, "namespace": p.namespace, "container": c["name"], "previous": previous}
            entry, hits = await writer.run(
                lambda: writer.put_text(
                    rel,
                    "previous_log" if previous else "log",
                    raw,
                    tail_lines=settings.log_lines,
                    meta=meta,
                    needles=[needles[i] for i in mine],
                )
            )
        if entry is None:
            return
        for j, (first, last) in hits.items():
            i = mine[j]
            # The current instance's log wins over the previous one's.
            if i not in evidence or not previous:
                evidence[i] = {"path": rel, "line": first, "last_line": last}

    jobs = [
        one(p, c, prev) for p in pods for c in p.containers for prev in ((False, True) if c["restarted"] else (False,))
    ]
    await _all(*jobs)


def _event_key(e: Mapping[str, Any]) -> str:
    for k in ("lastTimestamp", "eventTime", "firstTimestamp"):
        v = e.get(k)
        if isinstance(v, str) and v:
            return v
    v = _map(e.get("metadata")).get("creationTimestamp")
    return v if isinstance(v, str) else ""


async def _collect_events(
    writer: _Writer,
    inputs: SceneInputs,
    pods: list[_PodInfo],
    nodes: list[str],
    source: SceneSource,
    settings: SceneSettings,
) -> None:
    wanted: dict[str, set[tuple[str, str]]] = {}
    d = inputs.diagnosis
    if d.job is not None and d.job.kind != "Pod":
        wanted.setdefault(d.job.namespace, set()).add((d.job.kind, d.job.name))
    for p in pods:
        wanted.setdefault(p.namespace, set()).add(("Pod", p.name))
    if nodes:
        # The kubelet and node-problem-detector record node events in the default namespace.
        wanted.setdefault("default", set()).update(("Node", n) for n in nodes)
    if not wanted:
        return
    events: dict[tuple[str, str], dict[str, Any]] = {}
    for ns, involved in sorted(wanted.items()):
        try:
            found = await source.list_events(ns, involved=involved)
        except Exception as exc:  # noqa: BLE001 - recorded
            writer.problem(
                f"events.yaml ({ns})",
                f"events could not be listed: {type(exc).__name__}: {exc}"[:500],
                f"无法列出事件：{type(exc).__name__}: {exc}"[:500],
            )
            continue
        for e in found if isinstance(found, list) else []:
            if isinstance(e, Mapping):
                meta = _map(e.get("metadata"))
                key = (str(meta.get("namespace") or ns), str(meta.get("name") or len(events)))
                events[key] = dict(e)
    ordered = sorted(events.values(), key=event_order)
    if len(ordered) > settings.max_events:
        writer.problem(
            "events.yaml",
            f"{len(ordered)} events, the newest {settings.max_events} kept",
            f"共 {len(ordered)} 条事件，保留最新的 {settings.max_events} 条",
        )
        ordered = ordered[-settings.max_events :]
    await writer.run(lambda: writer.put_data("events.yaml", "events", ordered, fmt="yaml", bulky=True))


async def _collect_metrics(
    writer: _Writer, nodes: list[str], fault: float, now: float, source: SceneSource, settings: SceneSettings
) -> None:
    """The nodes' accelerator metrics from `metrics_window_s` before the fault to `metrics_after_s`
    after it (no later than the scene's time): read concurrently (bounded by `concurrency`: one range
    query per node, a Prometheus round trip each), cleaned and written off the event loop (tens of
    thousands of points for a large job)."""
    if not nodes:
        return
    start, end = fault - settings.metrics_window_s, max(fault, min(now, fault + settings.metrics_after_s))
    gate = asyncio.Semaphore(max(1, settings.concurrency))

    async def read(node: str) -> Any:
        async with gate:
            try:
                return await source.metrics_range(node, start, end, settings.metrics_step_s)
            except NotImplementedError:
                return None
            except Exception as exc:  # noqa: BLE001 - recorded
                writer.problem(
                    f"metrics.json ({node})",
                    f"metrics could not be read: {type(exc).__name__}: {exc}"[:500],
                    f"无法读取指标：{type(exc).__name__}: {exc}"[:500],
                )
                return _UNREADABLE

    read_all = await asyncio.gather(*(read(node) for node in nodes))
    missing = [node for node, series in zip(nodes, read_all, strict=True) if series is None]
    if missing:
        writer.problem(
            "metrics.json",
            f"no metrics source for node(s) {', '.join(missing)}",
            f"节点 {', '.join(missing)} 没有可用的指标来源",
        )
    found = [(node, series) for node, series in zip(nodes, read_all, strict=True) if series not in (None, _UNREADABLE)]
    if not found:
        return

    def write() -> None:
        out: dict[str, dict[str, list[list[float | None]]]] = {}
        redactions = 0
        for node, series in found:
            node_out: dict[str, list[list[float | None]]] = {}
            for raw_name, points in list(_map(series).items())[: settings.max_metric_series]:
                name, n = writer.redactor.redact_str(str(raw_name))
                redactions += n
                node_out[name] = _clean_points(points, settings.max_metric_points)
            node_name, n = writer.redactor.redact_str(node)
            redactions += n
            out[node_name] = node_out
        doc = {"window": {"start": start, "end": end, "step": settings.metrics_step_s}, "nodes": out}
        writer.put_data("metrics.json", "metrics", doc, fmt="json", bulky=True, redactions=redactions)

    await writer.run(write)


_UNREADABLE = object()
_INF = math.inf


def _clean_points(points: Any, limit: int) -> list[list[float | None]]:
    """The last `limit` points of a series as [time, value] floats (Prometheus sends the value as a
    string); a non-finite value becomes None (JSON has no NaN), a malformed point is dropped."""
    if not isinstance(points, Sequence) or isinstance(points, str | bytes):
        return []
    clean: list[list[float | None]] = []
    append = clean.append
    for pt in (points if isinstance(points, list | tuple) else list(points))[-limit:]:
        try:
            v = float(pt[1])
            append([float(pt[0]), v if -_INF < v < _INF else None])
        except (TypeError, ValueError, IndexError, KeyError):
            continue
    return clean


def _write_kernel(
    writer: _Writer,
    inputs: SceneInputs,
    fault: float,
    settings: SceneSettings,
    findings: list[Finding],
    needles: list[bytes],
    evidence: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    lo, hi = fault - settings.kernel_before_s, fault + settings.kernel_after_s
    per_node: list[tuple[str, list[tuple[float, str]]]] = []
    for node in sorted(inputs.kernel_lines):
        kept = []
        for item in inputs.kernel_lines[node]:
            try:
                t, line = float(item[0]), str(item[1])
            except (TypeError, ValueError, IndexError):
                continue
            if lo <= t <= hi:
                kept.append((t, line))
        if kept:
            kept.sort(key=lambda x: x[0])
            per_node.append((node, kept))
    if not per_node:
        return []
    share = max(1, settings.max_kernel_lines // len(per_node))
    sections: list[dict[str, Any]] = []
    for node, lines in per_node:
        rel = kernel_rel(node)
        kept = lines
        if len(kept) > share:
            writer.problem(
                rel,
                f"{len(kept)} kernel lines in the window, the last {share} kept",
                f"时间窗口内共 {len(kept)} 行内核日志，保留最后 {share} 行",
            )
            kept = kept[-share:]
        raw = ("\n".join(line.replace("\r", "") for _, line in kept) + "\n").encode("utf-8", "replace")
        # A kernel finding's evidence is in its own node's file; one without a node in the first that has it.
        mine = [
            i
            for i, f in enumerate(findings)
            if f.source is Source.KERNEL and needles[i] and i not in evidence and f.node in (node, None)
        ]
        entry, hits = writer.put_text(rel, "kernel", raw, meta={"node": node}, needles=[needles[i] for i in mine])
        if entry is None:
            continue
        sections.append(
            {
                "node": node,
                "path": rel,
                "first_line": 1,
                "last_line": entry["lines"],
                "first_time": kept[0][0],
                "last_time": kept[-1][0],
            }
        )
        for j, (first, last) in hits.items():
            evidence[mine[j]] = {"path": rel, "line": first, "last_line": last}
    return sections


def kernel_rel(node: str) -> str:
    """Where a node's kernel lines go: `layout/<node>/dmesg`, beside that node's container logs."""
    return f"layout/{_safe(node)}/dmesg"


def _write_objects(writer: _Writer, inputs: SceneInputs, pods: list[_PodInfo]) -> None:
    if inputs.workload is not None:
        writer.put_data("objects/workload.yaml", "workload", inputs.workload, fmt="yaml", bulky=False)
    else:
        writer.problem("objects/workload.yaml", "no workload object was given", "未提供工作负载对象")
    by_name = {p.name: p for p in pods}
    for pod in inputs.pods:
        name = _name(pod) if isinstance(pod, Mapping) else None
        if name is None or name not in by_name:
            continue
        writer.put_data(
            f"objects/pods/{by_name[name].file}.yaml", "pod", pod, fmt="yaml", bulky=False, meta={"pod": name}
        )
    used: set[str] = set()
    for node in inputs.nodes:
        name = _name(node) if isinstance(node, Mapping) else None
        if name is None:
            continue
        file = _safe(name)
        while file in used:
            file += "_"
        used.add(file)
        writer.put_data(f"objects/nodes/{file}.yaml", "node", node, fmt="yaml", bulky=False, meta={"node": name})


def _write_stacks(writer: _Writer, stacks: Mapping[str, StackDump], pods: list[_PodInfo]) -> None:
    files = {p.name: p.file for p in pods}
    for name, dump in sorted(stacks.items()):
        head = [
            f"# pod: {dump.namespace}/{dump.pod}",
            f"# container: {dump.container or '-'}",
            f"# method: {dump.method.value if dump.method else 'none'}",
            f"# pids: {' '.join(map(str, dump.pids)) or '-'}",
        ]
        if dump.reason is not None:
            head.append(f"# reason: {dump.reason.en}")
            writer.problem(f"stacks/{files.get(name, _safe(name))}.txt", dump.reason.en, dump.reason.zh)
        head += [f"# tried: {a}" for a in dump.attempts]
        body = "\n".join(head) + "\n\n" + dump.text + ("\n" if dump.text and not dump.text.endswith("\n") else "")
        writer.put_text(
            f"stacks/{files.get(name, _safe(name))}.txt",
            "stacks",
            body.encode("utf-8", "replace"),
            meta={"pod": name, "method": dump.method.value if dump.method else None},
        )


def _findings_doc(d: DiagnosisEvent, findings: list[Finding], evidence: Mapping[int, dict[str, Any]]) -> dict[str, Any]:
    rc = d.diagnosis.root_cause
    doc: dict[str, Any] = {
        "diagnosis_id": d.diagnosis_id,
        "revision": d.revision,
        "final": d.final,
        "window_start": d.window_start,
        "window_end": d.window_end,
        "root_cause": rc.contract_dict("en") if rc else None,
        "root_cause_zh": rc.contract_dict("zh") if rc else None,
        "findings": [],
    }
    for i, f in enumerate(findings):
        item = f.contract_dict()
        item.update(
            {
                "last_line_no": f.last_line_no,
                "timestamp": f.timestamp,
                "node": f.node,
                "device": f.device,
                "pod": f.pod,
                "namespace": f.namespace,
                "rank": f.rank,
                "severity": f.severity.value,
                "consequence_of": f.consequence_of,
                "evidence": evidence.get(i),
            }
        )
        doc["findings"].append(item)
    if d.error_lines or d.exit_codes:
        # An `unknown` diagnosis: what there is (each rank's last error lines, the exit codes).
        doc["error_lines"] = {rank: [redact_text(x)[0] for x in lines] for rank, lines in d.error_lines.items()}
        doc["exit_codes"] = dict(d.exit_codes)
    return doc


# ------------------------------------------------------------------------------------------------
# load_scene


@dataclass(frozen=True, slots=True)
class SceneLog:
    """A text of the bundle to diagnose again, with where it came from."""

    path: Path
    rel: str
    source: Source
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    node: str | None = None
    rank: int | None = None
    previous: bool = False
    # Kernel sections: the lines of the file that are this node's (all of layout/<node>/dmesg; a
    # range of kernel.log in bundles written before).
    first_line: int = 1
    last_line: int | None = None


@dataclass(frozen=True)
class LoadedScene:
    dir: Path
    manifest: dict[str, Any]

    @property
    def incident_id(self) -> str:
        return str(self.manifest["incident_id"])

    @property
    def files(self) -> list[dict[str, Any]]:
        return list(self.manifest["files"])

    def file(self, rel: str) -> Path:
        return self.dir / rel

    def has(self, rel: str) -> bool:
        return any(e["path"] == rel for e in self.files)

    def _yaml(self, rel: str) -> Any:
        try:
            return yaml.load(self.file(rel).read_bytes(), Loader=_YAML_LOADER)  # noqa: S506 - a safe loader
        except (OSError, yaml.YAMLError) as exc:
            raise SceneError(f"{self.file(rel)}: cannot be read: {exc}".splitlines()[0]) from exc

    def events(self) -> list[dict[str, Any]]:
        if not self.has("events.yaml"):
            return []
        data = self._yaml("events.yaml")
        return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []

    def pods(self) -> list[dict[str, Any]]:
        out = []
        for e in self.files:
            if e.get("kind") == "pod":
                obj = self._yaml(e["path"])
                if isinstance(obj, dict):
                    out.append(obj)
        return out

    def nodes(self) -> list[dict[str, Any]]:
        out = []
        for e in self.files:
            if e.get("kind") == "node":
                obj = self._yaml(e["path"])
                if isinstance(obj, dict):
                    out.append(obj)
        return out

    def workload(self) -> dict[str, Any] | None:
        if not self.has("objects/workload.yaml"):
            return None
        obj = self._yaml("objects/workload.yaml")
        return obj if isinstance(obj, dict) else None

    def logs(self) -> list[SceneLog]:
        """Kernel sections (node by node), then every container log (previous before current)."""
        out: list[SceneLog] = []
        for s in self.manifest.get("kernel_sections") or []:
            rel = s.get("path", "kernel.log") if isinstance(s, dict) else None
            if isinstance(rel, str) and self.has(rel) and isinstance(s.get("first_line"), int):
                out.append(
                    SceneLog(
                        path=self.file(rel),
                        rel=rel,
                        source=Source.KERNEL,
                        node=str(s.get("node") or "") or None,
                        first_line=int(s["first_line"]),
                        last_line=int(s["last_line"]) if isinstance(s.get("last_line"), int) else None,
                    )
                )
        for p in self.manifest.get("pods") or []:
            if not isinstance(p, dict):
                continue
            rank = p.get("rank")
            for c in p.get("containers") or []:
                for key, previous in (("previous_log", True), ("log", False)):
                    rel = c.get(key) if isinstance(c, dict) else None
                    if isinstance(rel, str):
                        out.append(
                            SceneLog(
                                path=self.file(rel),
                                rel=rel,
                                source=Source.CONTAINER_LOG,
                                pod=str(p.get("name")),
                                namespace=str(p.get("namespace") or "default"),
                                container=str(c.get("name")),
                                node=p.get("node") if isinstance(p.get("node"), str) else None,
                                rank=rank if isinstance(rank, int) else None,
                                previous=previous,
                            )
                        )
        return out


def _check_manifest(manifest: Any, where: Path) -> dict[str, Any]:
    if not isinstance(manifest, dict):
        raise SceneError(f"{where}: not a JSON object")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise SceneError(f"{where}: schema_version {manifest.get('schema_version')!r} is not {SCHEMA_VERSION}")
    if not isinstance(manifest.get("incident_id"), str):
        raise SceneError(f"{where}: incident_id is missing")
    files = manifest.get("files")
    if not isinstance(files, list):
        raise SceneError(f"{where}: files is missing")
    for e in files:
        rel = e.get("path") if isinstance(e, dict) else None
        if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in Path(rel).parts:
            raise SceneError(f"{where}: a file entry has no usable path: {e!r}"[:300])
        if not isinstance(e.get("sha256"), str) or not isinstance(e.get("bytes"), int):
            raise SceneError(f"{where}: {rel}: sha256 or bytes missing")
    return manifest


def _iter_entries(scene_dir: Path, manifest: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Path]]:
    for e in manifest["files"]:
        yield e, scene_dir / e["path"]


def load_scene(path: Path | str, *, verify: bool = False) -> LoadedScene:
    """A saved bundle: its manifest checked, every file it lists present (and with `verify`, of the
    size and sha256 the manifest records). SceneError with a one-line reason otherwise."""
    scene_dir = Path(path)
    if not scene_dir.is_dir():
        raise SceneError(f"{scene_dir}: not a directory")
    where = scene_dir / MANIFEST
    try:
        raw = where.read_bytes()
    except OSError as exc:
        raise SceneError(f"{where}: cannot be read: {exc.strerror or exc}") from exc
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise SceneError(f"{where}: not valid JSON: {exc}") from exc
    manifest = _check_manifest(manifest, where)
    for e, file in _iter_entries(scene_dir, manifest):
        try:
            size = file.stat().st_size
        except OSError as exc:
            raise SceneError(f"{file}: listed in the manifest but cannot be read: {exc.strerror or exc}") from exc
        if size != e["bytes"]:
            raise SceneError(f"{file}: {size} bytes, the manifest says {e['bytes']}")
        if verify:
            digest = hashlib.sha256(file.read_bytes()).hexdigest()
            if digest != e["sha256"]:
                raise SceneError(f"{file}: content does not match its sha256 in the manifest")
    return LoadedScene(dir=scene_dir, manifest=manifest)
