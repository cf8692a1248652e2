"""A real HTTP exporter for tests: Prometheus text exposition whose series the test sets.

It stands in for the vendors' exporters (dcgm-exporter, MindCluster npu-exporter, Cambricon
mlu-exporter) in front of a real Prometheus: the label sets below are the ones those exporters
write (udal/nvidia.py, udal/ascend.py and udal/cambricon.py name the sources). One `Exporter` is one
node's exporter on its own loopback port. `respond()` turns it into any other HTTP endpoint (a broken
Prometheus API answering 503 or HTML) for the error-path tests.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() else repr(value)


@dataclass
class _Family:
    help: str
    kind: str
    series: dict[tuple[tuple[str, str], ...], float] = field(default_factory=dict)


class Exporter:
    """A /metrics endpoint on 127.0.0.1:<free port>, served by a thread."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._families: dict[str, _Family] = {}
        self._lock = threading.Lock()
        self._custom: dict[str, tuple[int, str, bytes]] = {}
        self.requests = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- series -----------------------------------------------------------------------------------

    def set(self, name: str, labels: Mapping[str, str], value: float, *, help: str = "", kind: str = "gauge") -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            family = self._families.setdefault(name, _Family(help or name, kind))
            family.series[key] = float(value)

    def remove(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        with self._lock:
            if labels is None:
                self._families.pop(name, None)
            elif name in self._families:
                self._families[name].series.pop(tuple(sorted(labels.items())), None)

    def render(self) -> bytes:
        lines: list[str] = []
        with self._lock:
            for name in sorted(self._families):
                family = self._families[name]
                lines.append(f"# HELP {name} {family.help}")
                lines.append(f"# TYPE {name} {family.kind}")
                for key, value in family.series.items():
                    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in key)
                    lines.append(f"{name}{{{labels}}} {_fmt(value)}" if labels else f"{name} {_fmt(value)}")
        return ("\n".join(lines) + "\n").encode()

    # -- other answers ----------------------------------------------------------------------------

    def respond(self, path: str, status: int, body: bytes | str, content_type: str = "application/json") -> None:
        """Answer GET `path` (without the query string) with this status and body from now on."""
        data = body.encode() if isinstance(body, str) else body
        with self._lock:
            self._custom[path] = (status, content_type, data)

    # -- server -----------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("exporter not started")
        return int(self._server.server_address[1])

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> Self:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                with exporter._lock:
                    exporter.requests += 1
                    custom = exporter._custom.get(path)
                if custom is not None:
                    status, content_type, body = custom
                elif path == "/metrics":
                    status, content_type, body = 200, CONTENT_TYPE, exporter.render()
                else:
                    status, content_type, body = 404, "text/plain", b"not found\n"
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        server = self._server
        self._thread = threading.Thread(
            target=lambda: server.serve_forever(poll_interval=0.05), name=f"exporter-{self.port}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- realistic label sets ------------------------------------------------------------------------


def dcgm_labels(gpu: int, hostname: str, *, model: str = "NVIDIA H100 80GB HBM3") -> dict[str, str]:
    """dcgm-exporter's GPU labels (render_metrics.go: gpu, UUID, device, modelName, Hostname)."""
    return {
        "gpu": str(gpu),
        "UUID": f"GPU-8b2f1c4e-{gpu:04d}-4d3c-9a1e-5f0b6c7d8e9f",
        "device": f"nvidia{gpu}",
        "modelName": model,
        "Hostname": hostname,
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }


def npu_labels(chip: int, *, model: str = "910B3-Ascend-V1") -> dict[str, str]:
    """npu-exporter's chip labels (id, model_name, vdie_id, pcie_bus_info; no node label)."""
    return {
        "id": str(chip),
        "model_name": model,
        "vdie_id": f"64036E64-00A0{chip:04X}-5C350CF2-B9D00485-104301E2",
        "pcie_bus_info": f"0000:C{chip + 1:X}:00.0",
        "namespace": "",
        "pod_name": "",
        "container_name": "",
    }


def mlu_labels(mlu: int, node: str, *, model: str = "MLU370-X8") -> dict[str, str]:
    """mlu-exporter's labels (examples/metrics.yaml: mlu, uuid, sn, model, type, driver, mcu, node)."""
    return {
        "mlu": str(mlu),
        "uuid": f"MLU-20001012-1916-0000-0000-00000000{mlu:04d}",
        "sn": f"SN0000{mlu:04d}",
        "model": model,
        "type": "MLU370",
        "driver": "v5.10.22",
        "mcu": "v1.1.6",
        "node": node,
    }


def nvidia_node(exp: Exporter, hostname: str, gpus: int = 2, *, util: float = 87.0) -> None:
    """A dcgm-exporter with the default counters (and the ECC ones enabled)."""
    for g in range(gpus):
        lab = dcgm_labels(g, hostname)
        exp.set("DCGM_FI_DEV_GPU_UTIL", lab, util + g, help="GPU utilization (in %).")
        exp.set("DCGM_FI_DEV_FB_USED", lab, 61_000 + g, help="Framebuffer memory used (in MiB).")
        exp.set("DCGM_FI_DEV_FB_FREE", lab, 20_000 - g, help="Framebuffer memory free (in MiB).")
        exp.set("DCGM_FI_DEV_GPU_TEMP", lab, 61 + g, help="GPU temperature (in C).")
        exp.set("DCGM_FI_DEV_POWER_USAGE", lab, 512.5 + g, help="Power draw (in W).")
        exp.set("DCGM_FI_DEV_MEM_CLOCK", lab, 2619, help="Memory clock frequency (in MHz).")  # not mapped
        exp.set("DCGM_FI_DEV_XID_ERRORS", lab, 0, help="Value of the last XID error encountered.")
        exp.set(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            lab,
            0,
            help="Total number of double-bit volatile ECC errors.",
            kind="counter",
        )
        # The "blank" sentinel DCGM writes when a field has no value (dropped by the source).
        exp.set("DCGM_FI_DEV_MEMORY_TEMP", lab, 9223372036854775794, help="Memory temperature (in C).")


def ascend_node(exp: Exporter, chips: int = 2, *, util: float = 45.0) -> None:
    exp.set("npu_exporter_version_info", {"exporterVersion": "v6.0.0"}, 1)  # not mapped
    exp.set("machine_npu_nums", {}, chips)  # not mapped
    for c in range(chips):
        lab = npu_labels(c)
        exp.set("npu_chip_info_utilization", lab, util + c, help="the ai core utilization")
        exp.set("npu_chip_info_hbm_used_memory", lab, 30_000 + c, help="the npu hbm used memory")
        exp.set("npu_chip_info_hbm_total_memory", lab, 65_536, help="the npu hbm total memory")
        exp.set("npu_chip_info_temperature", lab, 48 + c, help="the npu temperature")
        exp.set("npu_chip_info_power", lab, 180.5, help="the npu power")
        exp.set("npu_chip_info_health_status", lab, 1, help="the npu health status")
        exp.set("npu_chip_info_link_status", lab, 1, help="the npu link status")
        exp.set("npu_chip_info_network_status", lab, 1, help="the npu network health status")
        exp.set("npu_chip_info_error_code", lab, 0, help="the First npu error code")


def cambricon_node(exp: Exporter, node: str, mlus: int = 2, *, util: float = 66.0, links: int = 2) -> None:
    for m in range(mlus):
        lab = mlu_labels(m, node)
        exp.set("mlu_utilization", {**lab, "vf": ""}, util + m, help="The utilization of Cambricon MLU, unit is '%'")
        exp.set("mlu_memory_used", lab, 12_884_901_888 + m, help="The used physical memory of Cambricon MLU")
        exp.set("mlu_memory_total", lab, 51_539_607_552, help="The total physical memory of Cambricon MLU")
        exp.set("mlu_temperature", lab, 40 + m, help="The board temperature of Cambricon MLU")
        exp.set("mlu_power_usage", {**lab, "vf": ""}, 150 + m, help="The power usage of Cambricon MLU")
        exp.set("mlu_health", lab, 1, help="The health state of Cambricon MLU, 1 means health, 0 means sick")
        for link in range(links):
            exp.set("mlu_mlulink_status", {**lab, "link": str(link)}, 1, help="The status of Cambricon MLU MLULink")
