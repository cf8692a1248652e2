"""A command run in a pod's container through the API server's exec (the v4 channel protocol): its
stdout, stderr and exit status (`ExecResult`), bounded, off the event loop (`exec_in_pod`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EXEC_PROTOCOL = "v4.channel.k8s.io"
STDOUT, STDERR, ERROR = 1, 2, 3
# The Status on the error channel is small; anything longer is not one.
MAX_STATUS_BYTES = 64 * 1024
SIGUSR1_MASK = 1 << (signal.SIGUSR1.value - 1)


# ------------------------------------------------------------------------------------------------
# exec


@dataclass(frozen=True, slots=True)
class ExecResult:
    """What one command run in a container gave.

    `exit_code` is the command's own exit status, None when it never ran to one; `error` says why
    (exec refused by the API server, the runtime could not start the command, timed out, the
    connection failed); `status` is the HTTP status of an exec the API server refused (403, 404, ...).
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    error: str | None = None
    status: int | None = None
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None


class _Captured(Exception):
    """Carries the request the client built out of `call_api` (never raised to callers)."""

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        super().__init__(url)
        self.url = url
        self.headers = dict(headers)


def _exec_request(api_client: Any, namespace: str, pod: str, container: str, command: list[str]) -> _Captured:
    """The exec URL and headers (credentials included) as the generated client method builds them."""
    from kubernetes import client as kclient

    private: Any = kclient.ApiClient(api_client.configuration)

    def capture(
        method: str,
        url: str,
        header_params: Mapping[str, str] | None = None,
        body: object = None,
        post_params: object = None,
        _request_timeout: object = None,
    ) -> None:
        raise _Captured(url, header_params or {})

    private.call_api = capture
    try:
        kclient.CoreV1Api(private).connect_get_namespaced_pod_exec(
            pod,
            namespace,
            command=command,
            container=container,
            stdout=True,
            stderr=True,
            stdin=False,
            tty=False,
            _preload_content=False,
        )
    except _Captured as captured:
        return captured
    finally:
        private.close()
    raise RuntimeError("the client built no exec request")  # pragma: no cover - the method always calls call_api


def _status_message(body: bytes | None) -> str | None:
    if not body:
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        return body[:300].decode("utf-8", "replace").strip() or None
    if isinstance(obj, dict) and isinstance(obj.get("message"), str):
        return str(obj["message"])[:500]
    return None


def _parse_exit(raw: bytes) -> tuple[int | None, str | None]:
    """The error channel's Status: (exit code, None) or (None, why the command did not run)."""
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        return None, "the connection closed without an exit status"
    try:
        obj = json.loads(text)
    except ValueError:
        return None, text[:500]
    if not isinstance(obj, dict):
        return None, text[:500]
    if obj.get("status") == "Success":
        return 0, None
    details = obj.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else ():
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            try:
                return int(str(cause.get("message"))), None
            except ValueError:
                break
    message = obj.get("message")
    return None, str(message)[:500] if message else text[:500]


def _exec_blocking(
    api_client: Any,
    namespace: str,
    pod: str,
    container: str,
    command: list[str],
    timeout_s: float,
    max_bytes: int,
) -> ExecResult:
    import ssl

    import certifi
    import websocket
    from kubernetes.stream import ws_client as _ws_client

    ws_client: Any = _ws_client

    deadline = time.monotonic() + timeout_s
    what = f"exec in {namespace}/{pod} ({container})"
    req = _exec_request(api_client, namespace, pod, container, command)
    cfg = api_client.configuration
    url = ws_client.get_websocket_url(req.url)
    headers = [f"authorization: {req.headers['authorization']}"] if "authorization" in req.headers else []
    if url.startswith("wss://") and cfg.verify_ssl:
        sslopt: dict[str, Any] = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": cfg.ssl_ca_cert or certifi.where()}
        if cfg.assert_hostname is not None:
            sslopt["check_hostname"] = cfg.assert_hostname
    else:
        sslopt = {"cert_reqs": ssl.CERT_NONE}
    if cfg.cert_file:
        sslopt["certfile"] = cfg.cert_file
    if cfg.key_file:
        sslopt["keyfile"] = cfg.key_file
    if cfg.tls_server_name:
        sslopt["server_hostname"] = cfg.tls_server_name
    options: dict[str, Any] = {"header": headers, "subprotocols": [EXEC_PROTOCOL], "timeout": max(0.1, timeout_s)}
    if cfg.proxy or cfg.proxy_headers:
        options = ws_client.websocket_proxycare(options, cfg, url, req.headers)

    sock: Any = websocket.WebSocket(sslopt=sslopt, skip_utf8_validation=True)
    out, err, status = bytearray(), bytearray(), bytearray()
    truncated = False
    try:
        try:
            sock.connect(url, **options)
        except websocket.WebSocketBadStatusException as exc:
            message = _status_message(exc.resp_body) or str(exc)
            return ExecResult(error=f"{what} refused ({exc.status_code}): {message}", status=exc.status_code)
        except (OSError, websocket.WebSocketException) as exc:
            return ExecResult(error=f"{what}: cannot connect: {exc}")
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return ExecResult(
                    stdout=out.decode("utf-8", "replace"),
                    stderr=err.decode("utf-8", "replace"),
                    error=f"{what} timed out after {timeout_s:g} s",
                    truncated=truncated,
                )
            sock.settimeout(remaining)
            try:
                opcode, frame = sock.recv_data_frame(True)
            except websocket.WebSocketTimeoutException:
                continue
            except websocket.WebSocketConnectionClosedException:
                break
            except (OSError, websocket.WebSocketException) as exc:
                return ExecResult(
                    stdout=out.decode("utf-8", "replace"),
                    stderr=err.decode("utf-8", "replace"),
                    error=f"{what}: connection failed: {exc}",
                    truncated=truncated,
                )
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                break
            if opcode not in (websocket.ABNF.OPCODE_BINARY, websocket.ABNF.OPCODE_TEXT):
                continue
            data: bytes = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode()
            if not data:
                continue
            channel, payload = data[0], data[1:]
            target = {STDOUT: out, STDERR: err}.get(channel)
            if target is not None:
                # Past the bound the output is dropped, but the exit status is still read.
                room = max_bytes - len(out) - len(err)
                if len(payload) > room:
                    payload = payload[: max(room, 0)]
                    truncated = True
                target += payload
            elif channel == ERROR:
                status += payload[: MAX_STATUS_BYTES - len(status)]
    finally:
        # A polite close when the exchange ended normally; the socket is released in every case
        # (websocket-client's close() does nothing once the peer's close frame was answered).
        if time.monotonic() < deadline:
            with contextlib.suppress(OSError, websocket.WebSocketException):
                sock.close(timeout=min(0.5, max(0.05, deadline - time.monotonic())))
        sock.shutdown()
    exit_code, error = _parse_exit(bytes(status))
    return ExecResult(
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        exit_code=exit_code,
        error=None if exit_code is not None else f"{what}: {error}",
        truncated=truncated,
    )


async def exec_in_pod(
    api_client: Any,
    namespace: str,
    pod: str,
    container: str,
    command: Sequence[str],
    *,
    timeout_s: float,
    max_bytes: int = 1 << 20,
) -> ExecResult:
    """Run `command` (no shell implied) in a container and return what it printed and its exit code.

    Never raises for what the cluster answers: a refused exec (403 RBAC, 404 pod gone, 400 container
    not running), a command that cannot start, a timeout or a broken connection come back as
    `ExecResult.error`. Bounded: `timeout_s` for the whole exchange (connect included), `max_bytes`
    of stdout and stderr together.
    """
    if timeout_s <= 0 or max_bytes <= 0:
        raise ValueError("exec_in_pod: timeout_s and max_bytes must be positive")
    argv = [str(a) for a in command]
    if not argv:
        raise ValueError("exec_in_pod: empty command")
    return await asyncio.to_thread(_exec_blocking, api_client, namespace, pod, container, argv, timeout_s, max_bytes)
