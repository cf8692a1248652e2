"""An on-disk cache of compiled data: the validated rule set, Hyperscan databases, vendor catalogs.

`trainmedic diagnose` is a fresh process each time; without this cache it parses every rule file
and catalog, runs every rule example and compiles the Hyperscan database on every call.

Where: `$TRAINMEDIC_CACHE_DIR` when set (set and empty: no cache at all), else
`${XDG_CACHE_HOME:-~/.cache}/trainmedic/`. One file per entry, named by its key: the SHA-256 of
what it was built from (every input file's path and bytes) plus `code_fingerprint()` (the package
version, the Python and Hyperscan versions, and the source of the modules that build the data), so
any change to either builds a new entry; stale entries are simply never read again.

Safety: an entry is written to a temporary file in the same folder and renamed into place, so a
reader sees a whole entry or none, and two processes building at once both write a valid one (the
last rename wins). An entry that cannot be read, unpickled, or was written by another user is
ignored and rebuilt: the cache never makes a command fail. Entries are pickles, so the folder is
created private (0700) and only files owned by the current user are read.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainmedic import __version__

ENV_VAR = "TRAINMEDIC_CACHE_DIR"
# Entries kept per kind, the most recently used; older ones (other rule versions) are removed.
KEEP_PER_KIND = 32
# Bump when the layout of an entry changes.
FORMAT = 1
_MAGIC = b"trainmedic-cache\n"

# The package folder: its subpackages (trainmedic/detectors, trainmedic/udal, ...) lie under it in an
# installed wheel and, through relative symlinks to the top-level folders, in the repository.
_ROOT = Path(__file__).resolve().parent
# The modules whose code decides what a cached entry holds (the rule schema, the loader and the
# example checks through the engine, the models pickled, the catalog parser).
_CODE_FILES = (
    "cache.py",
    "datafile.py",
    "models.py",
    "detectors/schema.py",
    "detectors/loader.py",
    "detectors/engine.py",
    "detectors/prefilter.py",
    "detectors/lines.py",
    "detectors/findings.py",
    "detectors/anchors.py",
    "detectors/localize.py",
    "detectors/views.py",
    "detectors/phase.py",
    # The progress markers (detectors/progress.yaml) and their matcher's keyword database.
    "detectors/hang_schema.py",
    "detectors/hang_markers.py",
    "detectors/hang_matcher.py",
    "detectors/hang_regex.py",
    # Rule examples are checked through the phase markers and the catalogs' classes
    # (`catalog_class`): a change there must re-check them.
    "rules/phases/phases.yaml",
    "udal/base.py",
)
# ... and every vendor catalog data file under udal/.
_CODE_GLOBS = ("udal/*.yaml",)


def cache_dir() -> Path | None:
    """The cache folder, or None when caching is turned off (`TRAINMEDIC_CACHE_DIR=`)."""
    value = os.environ.get(ENV_VAR)
    if value is not None:
        return Path(value).expanduser() if value.strip() else None
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "trainmedic"


@functools.cache
def code_fingerprint() -> bytes:
    """What every key includes: versions of the package, Python and Hyperscan, and the source of
    the modules that build cached data (so a code change without a version bump is safe too)."""
    h = hashlib.sha256()
    h.update(f"{FORMAT}\0{__version__}\0{sys.version}\0{sys.platform}\0".encode())
    h.update(_hyperscan_version().encode())
    globbed = [str(p.relative_to(_ROOT)) for g in _CODE_GLOBS for p in sorted(_ROOT.glob(g))]
    for rel in (*_CODE_FILES, *globbed):
        try:
            h.update(rel.encode() + b"\0" + (_ROOT / rel).read_bytes() + b"\0")
        except OSError:
            h.update(rel.encode() + b"\0-\0")
    return h.digest()


def _hyperscan_version() -> str:
    try:
        import hyperscan
    except ImportError:
        return "no-hyperscan"
    return f"hyperscan {getattr(hyperscan, '__version__', '?')} {getattr(hyperscan, '__file__', '?')}"


def make_key(kind: str, parts: Iterable[bytes | str]) -> str:
    """The key of an entry of `kind` built from `parts` (each path and content that went in)."""
    h = hashlib.sha256(code_fingerprint())
    h.update(kind.encode() + b"\0")
    for part in parts:
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _path(folder: Path, kind: str, key: str) -> Path:
    return folder / f"{kind}-{key}.pickle"


def load(kind: str, key: str) -> Any | None:
    """The entry, or None when caching is off or the entry is missing, unreadable or not ours."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        with open(_path(folder, kind, key), "rb") as fh:
            st = os.fstat(fh.fileno())
            if hasattr(os, "getuid") and st.st_uid != os.getuid():
                return None
            if fh.read(len(_MAGIC)) != _MAGIC:
                return None
            stored_key, value = pickle.load(fh)  # noqa: S301 - a private folder of our own files
    except Exception:  # noqa: BLE001 - a missing or corrupt entry is rebuilt, never an error
        return None
    if stored_key != key:
        return None
    with contextlib.suppress(OSError):
        os.utime(_path(folder, kind, key))  # recently used: kept by _prune
    return value


def store(kind: str, key: str, value: Any) -> None:
    """Write an entry atomically (temporary file + rename); any failure leaves no entry, silently."""
    folder = cache_dir()
    if folder is None:
        return
    import tempfile

    tmp: str | None = None
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{kind}-", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as fh:
            fh.write(_MAGIC)
            pickle.dump((key, value), fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, _path(folder, kind, key))
        tmp = None
        _prune(folder, kind)
    except Exception as exc:  # noqa: BLE001 - a read-only or full disk only costs the next run its speed
        import logging

        logging.getLogger(__name__).debug("cache entry %s not written: %s", kind, exc)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _prune(folder: Path, kind: str) -> None:
    """Remove all but the KEEP_PER_KIND most recently used entries of `kind` (best effort)."""
    aged: list[tuple[float, Path]] = []
    for p in folder.glob(f"{kind}-*.pickle"):
        with contextlib.suppress(OSError):
            aged.append((p.stat().st_mtime, p))
    aged.sort(reverse=True)
    for _, p in aged[KEEP_PER_KIND:]:
        with contextlib.suppress(OSError):
            p.unlink()
