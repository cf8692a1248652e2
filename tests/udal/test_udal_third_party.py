"""A chip that trainmedic does not ship is one plugin: registered, every part of the pipeline knows it.

The Zeta NPU (tests/zetachip.py) is registered with `udal.registry.register` for these tests only;
nothing outside its plugin names it. Each test checks one place that used to hard-code the built-in
chips: the chip name itself, node detection by resource name, visible-devices and library variables,
the Prometheus source, the metric rules, log rules, localisation, alerts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from trainmedic.agent.api import AlertmanagerWebhook, alert_events
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.watchers.k8s import node_status
from trainmedic.agent.watchers.metrics import PrometheusSource
from trainmedic.detectors.diagnose import diagnose_text
from trainmedic.detectors.engine import Engine
from trainmedic.detectors.loader import load_rules
from trainmedic.detectors.localize import localize
from trainmedic.detectors.metric_rules import MetricRules
from trainmedic.errors import RuleLoadError
from trainmedic.events import MetricBatch, decode
from trainmedic.models import Action, Chip, Finding
from trainmedic.remediations.scene import SceneSettings
from trainmedic.udal import registry

TARGET = "zetachip:ZetaPlugin"


@pytest.fixture
def zeta() -> Iterator[str]:
    registry.register("zeta", TARGET)
    try:
        yield "zeta"
    finally:
        registry.unregister("zeta")


# -- the name ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["zeta", "tpu", "Zeta", "", "nvidia gpu"])
def test_a_name_no_plugin_carries_is_not_a_chip(name: str) -> None:
    with pytest.raises(ValueError, match="chip"):
        Chip(name)


def test_a_registered_plugin_name_is_a_chip(zeta: str) -> None:
    chip = Chip(zeta)
    assert (chip, chip.value, registry.is_chip(zeta)) == ("zeta", "zeta", True)
    assert registry.get_plugin(chip).chip == "zeta"


def test_the_name_goes_with_the_plugin() -> None:
    registry.register("zeta", TARGET)
    registry.unregister("zeta")
    with pytest.raises(ValueError, match="no chip plugin"):
        Chip("zeta")


@pytest.mark.parametrize("name", ["Zeta", "zeta npu", "", "-x"])
def test_register_refuses_a_name_that_cannot_be_a_chip(name: str) -> None:
    with pytest.raises(ValueError, match="not a chip name"):
        registry.register(name, TARGET)


def test_an_installed_chip_beside_a_tree_never_installed_keeps_the_builtins() -> None:
    ep = EntryPoint(name="zeta", value=TARGET, group=registry.ENTRY_POINT_GROUP)  # no trainmedic metadata
    plugins = registry.discover(eps=[ep])
    assert set(plugins) == set(registry.builtin_plugins()) | {"zeta"}
    assert type(plugins["zeta"]).__name__ == "ZetaPlugin"


def test_an_entry_point_must_carry_its_plugins_name() -> None:
    ep = EntryPoint(name="zeta2", value=TARGET, group=registry.ENTRY_POINT_GROUP)
    with pytest.raises(registry.PluginError, match=r"zeta2.*'zeta'"):
        registry.discover(eps=[ep])


@pytest.mark.parametrize("chip", ["nvidia", "ascend", "cambricon", "generic"])
def test_builtin_names_stay_the_constants(chip: str) -> None:
    assert Chip(chip) is {c.value: c for c in Chip}[chip]


# -- nodes -------------------------------------------------------------------------------------------


def _node(capacity: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "z-node-1", "labels": labels or {}},
        "status": {"capacity": {"cpu": "64", **capacity}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


@pytest.mark.parametrize(
    ("capacity", "labels", "accelerators"),
    [
        ({"zeta.example/npu": "8"}, {}, {"zeta.example/npu": 8}),
        ({"zeta.example/vnpu-2c": "4"}, {}, {"zeta.example/vnpu-2c": 4}),
        ({}, {"zeta.example/npu.present": "true"}, {}),
        ({}, {"ai.accelerator/chip-type": "zeta"}, {}),
    ],
    ids=["resource", "resource-prefix", "vendor-label", "generic-label"],
)
def test_a_node_is_detected_by_the_plugins_resources_and_labels(
    zeta: str, capacity: dict[str, str], labels: dict[str, str], accelerators: dict[str, int]
) -> None:
    status = node_status(_node(capacity, labels))
    assert (status.chip, status.accelerators) == (zeta, accelerators)


@pytest.mark.parametrize(
    ("resource", "chip"),
    [
        ("nvidia.com/gpu", "nvidia"),
        ("nvidia.com/gpu.shared", "nvidia"),
        ("nvidia.com/mig-1g.10gb", "nvidia"),
        ("huawei.com/Ascend910", "ascend"),
        ("huawei.com/Ascend910-4c", "ascend"),
        ("huawei.com/Ascend310P", "ascend"),
        ("cambricon.com/mlu", "cambricon"),
        ("cambricon.com/mlu370.smlu.vcore", "cambricon"),
    ],
)
def test_the_builtin_plugins_resources_keep_their_chips(resource: str, chip: str) -> None:
    status = node_status(_node({resource: "4"}))
    assert (status.chip, status.accelerators) == (chip, {resource: 4})


def test_a_node_with_no_plugins_resource_has_no_chip(zeta: str) -> None:
    status = node_status(_node({"other.example/fpga": "2"}))
    assert (status.chip, status.accelerators) == (None, {})


# -- environment -------------------------------------------------------------------------------------


def test_visible_devices_env_is_read(zeta: str) -> None:
    plugin = registry.get_plugin(zeta)
    assert plugin.visible_devices({"ZETA_VISIBLE_DEVICES": "1,3", "CUDA_VISIBLE_DEVICES": "0"}) == [1, 3]
    assert "ZETA_VISIBLE_DEVICES" in registry.visible_devices_envs()


@pytest.mark.parametrize("name", ["ZETA_VISIBLE_DEVICES", "ZCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "NCCL_IB_HCA"])
def test_the_scene_keeps_the_chips_variables(zeta: str, name: str) -> None:
    settings = SceneSettings()
    assert name in settings.env_allow_names or name.startswith(settings.env_allow_prefixes)


def test_the_scene_keeps_no_variable_of_an_unknown_chip() -> None:
    settings = SceneSettings()
    assert "ZETA_VISIBLE_DEVICES" not in settings.env_allow_names
    assert not "ZCCL_DEBUG".startswith(settings.env_allow_prefixes)


# -- metrics -----------------------------------------------------------------------------------------


class VectorClient:
    """A PromClient answering one fixed instant vector (the mapping, not the transport, is tested)."""

    def __init__(self, vector: list[dict[str, Any]]) -> None:
        self.vector = vector
        self.queries: list[str] = []

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        self.queries.append(query)
        return self.vector

    def custom_query_range(
        self, query: str, start_time: datetime, end_time: datetime, step: str, params: dict[str, Any] | None = None
    ) -> Any:
        return []


def _series(name: str, value: float, **labels: str) -> dict[str, Any]:
    return {"metric": {"__name__": name, "node": "z-node-1", **labels}, "value": [1700000000.0, str(value)]}


def test_the_prometheus_source_queries_the_plugins_metric_names(zeta: str) -> None:
    source = PrometheusSource("http://x.invalid", bus=MemoryBus(), client=VectorClient([]))
    for vendor in ("zeta_npu_utilization", "zeta_npu_ecc_dbe_total", "zeta_npu_health", "DCGM_FI_DEV_GPU_UTIL"):
        assert vendor in source.query


def test_without_the_plugin_its_metric_names_are_not_queried() -> None:
    source = PrometheusSource("http://x.invalid", bus=MemoryBus(), client=VectorClient([]))
    assert "zeta_npu" not in source.query


@pytest.mark.asyncio
async def test_the_plugins_series_become_a_batch_of_its_chip(zeta: str) -> None:
    bus = MemoryBus()
    await bus.start()
    try:
        vector = [
            _series("zeta_npu_utilization", 71.0, npu="3", uuid="ZPU-aa"),
            _series("zeta_npu_ecc_dbe_total", 0.0, npu="3"),
            _series("zeta_npu_temperature_unmapped", 50.0, npu="3"),
        ]
        source = PrometheusSource("http://x.invalid", bus=bus, client=VectorClient(vector))
        events = await source.poll_once()
    finally:
        await bus.stop()
    assert len(events) == 1
    payload = decode(events[0].model_dump_json().encode()).payload
    assert isinstance(payload, MetricBatch)
    assert (payload.node, payload.chip) == ("z-node-1", zeta)
    got = {(s.name, s.device, s.vendor_name, s.value) for s in payload.samples}
    assert got == {
        ("accelerator_utilization", "3", "zeta_npu_utilization", 71.0),
        ("ecc_dbe", "3", "zeta_npu_ecc_dbe_total", 0.0),
    }


def test_a_metric_rule_fires_with_the_plugins_catalog_code(zeta: str) -> None:
    rules = MetricRules()
    source = PrometheusSource("http://x.invalid", bus=MemoryBus(), client=VectorClient([]))
    findings: list[Finding] = []
    for t, value in ((10.0, 0.0), (25.0, 2.0)):
        series = source.parse_vector([_series("zeta_npu_ecc_dbe_total", value, npu="1")])
        for (node, chip), samples in source.group(series).items():
            findings += rules.observe(node=node, chip=chip, job_key="job:ns/llm", samples=samples, t=t)
    assert len(findings) == 1
    f = findings[0]
    assert (f.chip, f.code, f.device, f.vendor_action, f.action) == (zeta, "ecc_dbe", "1", "RESET", Action.RESET_DEVICE)
    assert f.groups["catalog_code"] == "zeta:7"
    assert f.contract_dict()["chip"] == "zeta"


# -- logs --------------------------------------------------------------------------------------------

RULE = """\
version: 1
rules:
  - id: zeta.hbm_dbe
    status: stable
    source: [container_log]
    chip: zeta
    fault_class: device_error
    patterns:
      - 'HBM double-bit ECC error \\(ZPU \\d+; code (?P<num>\\d+)\\)'
    code: 'zeta:{num}'
    severity: critical
    message: {en: 'Zeta NPU ECC error', zh: 'Zeta NPU ECC 错误'}
    hint: {en: 'reset the NPU', zh: '复位该 NPU'}
    examples:
      match:
        - line: 'ZetaRuntimeError: HBM double-bit ECC error (ZPU 2; code 7)'
          code: 'zeta:7'
      no_match:
        - 'HBM ECC errors: none'
"""
LOG = "step 120 loss 1.93\n[rank5]: ZetaRuntimeError: HBM double-bit ECC error (ZPU 2; code 7)\n"


def _rules_dir(tmp_path: Path) -> Path:
    (tmp_path / "zeta.yaml").write_text(RULE, encoding="utf-8")
    return tmp_path


def test_a_log_rule_of_the_chip_diagnoses_under_its_name(zeta: str, tmp_path: Path) -> None:
    ruleset = load_rules([_rules_dir(tmp_path)], include_shipped=False)
    diagnosis = diagnose_text(LOG, Engine(ruleset.rules, fast=False))
    rc = diagnosis.root_cause
    assert rc is not None
    assert (rc.chip, rc.code, rc.vendor_action, rc.action, rc.device, rc.rank) == (
        zeta,
        "zeta:7",
        "RESET",
        Action.RESET_DEVICE,
        "2",
        5,
    )
    payload = json.loads(json.dumps(diagnosis.contract_dict()))
    assert payload["root_cause"]["chip"] == "zeta"
    assert [f["chip"] for f in payload["findings"]] == ["zeta"]


def test_a_log_rule_naming_an_unknown_chip_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuleLoadError, match=r"zeta\.yaml") as info:
        load_rules([_rules_dir(tmp_path)], include_shipped=False)
    assert "zeta" in str(info.value)


@pytest.mark.parametrize(
    ("line", "device"),
    [("ZPU 4 has a total capacity of 64 GiB", "4"), ("tensor on zeta:6 is not contiguous", "6"), ("(ZPU 1; x)", "1")],
)
def test_the_plugins_device_words_localise_a_line(zeta: str, line: str, device: str) -> None:
    assert localize(line, {}).device == device


def test_without_the_plugin_its_device_words_say_nothing() -> None:
    assert localize("ZPU 4 has a total capacity of 64 GiB", {}).device is None


# -- alerts ------------------------------------------------------------------------------------------


def _alert(labels: dict[str, str]) -> AlertmanagerWebhook:
    return AlertmanagerWebhook.model_validate(
        {
            "version": "4",
            "groupKey": "{}:{}",
            "status": "firing",
            "receiver": "trainmedic",
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093",
            "alerts": [
                {
                    "status": "firing",
                    "labels": {"alertname": "ZetaUnhealthy", "node": "z-node-1", "npu": "0", **labels},
                    "annotations": {},
                    "startsAt": "2026-11-21T02:00:00Z",
                    "endsAt": "0001-01-01T00:00:00Z",
                    "generatorURL": "http://prometheus:9090/graph",
                    "fingerprint": "00000000000000aa",
                }
            ],
        }
    )


@pytest.mark.parametrize(
    "labels",
    [{"chip": "zeta"}, {"model": "Zeta N1"}],
    ids=["chip-label", "exporter-labels"],
)
def test_an_alert_about_the_chip_is_a_batch_of_its_chip(zeta: str, labels: dict[str, str]) -> None:
    conv = alert_events(_alert({"trainmedic_metric": "health", "trainmedic_value": "0", **labels}))
    batches = [e.payload for e in conv.events if isinstance(e.payload, MetricBatch)]
    assert [(b.chip, b.samples[-1].device) for b in batches] == [(zeta, "0")]


def test_an_alert_naming_an_unknown_chip_is_generic() -> None:
    conv = alert_events(_alert({"trainmedic_metric": "health", "trainmedic_value": "0", "chip": "zeta"}))
    assert [e.payload.chip for e in conv.events if isinstance(e.payload, MetricBatch)] == ["generic"]
