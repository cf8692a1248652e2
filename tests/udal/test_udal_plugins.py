"""Registry, label detection, visible devices, metric names, the fake plugin."""

from __future__ import annotations

import tomllib
from importlib.metadata import EntryPoint, entry_points

import pytest
from paths import ROOT

from trainmedic.models import Action, Chip
from trainmedic.udal import (
    CORE_METRICS,
    ENTRY_POINT_GROUP,
    METRIC_VOCABULARY,
    ChipPlugin,
    PluginError,
    builtin_plugins,
    detect_chip,
    discover,
    get_plugin,
    load_plugins,
    lookup,
    parse_visible_devices,
)
from trainmedic.udal.ascend import AscendPlugin
from trainmedic.udal.cambricon import CambriconPlugin
from trainmedic.udal.fake import FakePlugin
from trainmedic.udal.generic import GenericPlugin
from trainmedic.udal.nvidia import NvidiaPlugin

REAL = [NvidiaPlugin(), AscendPlugin(), CambriconPlugin()]
# The test double, registered by tests/conftest.py rather than shipped as an entry point.
FAKE = ("fake", "trainmedic.udal.fake:FakePlugin")


@pytest.mark.parametrize(
    "table",
    [
        builtin_plugins(),
        tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"][
            "trainmedic.chips"
        ],
    ],
    ids=["builtin", "pyproject"],
)
def test_the_fake_chip_is_not_shipped(table: dict[str, str]) -> None:
    assert FAKE[0] not in table and FAKE[1] not in table.values()
    assert table == builtin_plugins()


def test_the_suite_registers_the_fake_chip() -> None:
    assert isinstance(get_plugin(FAKE[0]), FakePlugin)


def test_load_plugins_has_every_builtin() -> None:
    plugins = load_plugins()
    for key in (Chip.NVIDIA, Chip.ASCEND, Chip.CAMBRICON, Chip.GENERIC, "fake"):
        assert key in plugins
    assert load_plugins() == plugins  # cached: same instances


def test_fallback_without_distribution_metadata() -> None:
    plugins = discover(eps=[])
    assert {p.name for p in plugins.values()} == set(builtin_plugins())
    assert isinstance(plugins[Chip.NVIDIA], NvidiaPlugin)


def test_discover_from_entry_points() -> None:
    table = builtin_plugins() | {FAKE[0]: FAKE[1]}
    eps = [EntryPoint(name=name, value=target, group=ENTRY_POINT_GROUP) for name, target in table.items()]
    plugins = discover(eps=eps)
    assert isinstance(plugins[Chip.ASCEND], AscendPlugin)
    assert isinstance(plugins["fake"], FakePlugin)


def test_installed_entry_points_match_builtins_when_installed() -> None:
    installed = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if not installed:
        pytest.skip("trainmedic is not pip-installed: no entry points to compare")
    assert installed == builtin_plugins()


def test_discover_rejects_non_plugin() -> None:
    eps = [EntryPoint(name="bad", value="trainmedic.udal.base:CatalogEntry", group=ENTRY_POINT_GROUP)]
    with pytest.raises(PluginError, match="bad"):
        discover(eps=eps)


@pytest.mark.parametrize("chip", ["tpu", "", "unknown-vendor"])
def test_get_plugin_falls_back_to_generic(chip: str) -> None:
    assert isinstance(get_plugin(chip), GenericPlugin)


@pytest.mark.parametrize(
    ("chip", "cls"),
    [
        (Chip.NVIDIA, NvidiaPlugin),
        ("ascend", AscendPlugin),
        ("Cambricon", CambriconPlugin),
        ("fake", FakePlugin),
    ],
)
def test_get_plugin_by_chip_or_name(chip: Chip | str, cls: type[ChipPlugin]) -> None:
    assert isinstance(get_plugin(chip), cls)


def test_lookup_shortcut() -> None:
    entry = lookup(Chip.NVIDIA, "xid:79")
    assert entry is not None and entry.action == Action.REBOOT_NODE
    assert lookup("tpu", "xid:79") is None


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"ai.accelerator/chip-type": "nvidia"}, "nvidia"),
        ({"nvidia.com/gpu.present": "true"}, "nvidia"),
        ({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "nvidia"),
        ({"feature.node.kubernetes.io/pci-0302_10de.present": "true"}, "nvidia"),
        ({"ai.accelerator/chip-type": "ascend"}, "ascend"),
        ({"accelerator": "huawei-Ascend910"}, "ascend"),
        ({"node.kubernetes.io/npu.chip.name": "910B3"}, "ascend"),
        ({"servertype": "Ascend910B-20"}, "ascend"),
        ({"feature.node.kubernetes.io/pci-1200_19e5.present": "true"}, "ascend"),
        ({"ai.accelerator/chip-type": "cambricon"}, "cambricon"),
        ({"cambricon.com/mlu.present": "true"}, "cambricon"),
        ({"feature.node.kubernetes.io/pci-1200_cabc.present": "true"}, "cambricon"),
        ({"ai.accelerator/chip-type": "fake"}, "fake"),
        ({"trainmedic.io/fake-accelerator": "true"}, "fake"),
        ({"kubernetes.io/hostname": "cpu-node"}, None),
        ({"nvidia.com/gpu.present": "false"}, None),
        # The generic label wins over vendor labels.
        ({"ai.accelerator/chip-type": "ascend", "nvidia.com/gpu.present": "true"}, "ascend"),
    ],
)
def test_label_detection(labels: dict[str, str], expected: str | None) -> None:
    plugin = detect_chip(labels)
    assert (plugin.name if plugin else None) == expected


@pytest.mark.parametrize("plugin", REAL, ids=lambda p: p.name)
def test_real_plugins_name_resources(plugin: ChipPlugin) -> None:
    assert plugin.resource_names
    assert plugin.visible_devices_env
    assert "pytorch" in plugin.frameworks


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", []),
        ("none", []),
        ("void", []),
        ("all", None),
        ("0", [0]),
        ("0,1,3", [0, 1, 3]),
        (" 2 , 5 ", [2, 5]),
        ("GPU-8b2f1c4e-1111-2222-3333-444455556666", None),
        ("MIG-GPU-xyz/1/0", None),
    ],
)
def test_parse_visible_devices(value: str | None, expected: list[int] | None) -> None:
    assert parse_visible_devices(value) == expected


@pytest.mark.parametrize(
    ("plugin", "env", "expected"),
    [
        (NvidiaPlugin(), {"CUDA_VISIBLE_DEVICES": "1,2"}, [1, 2]),
        (NvidiaPlugin(), {"NVIDIA_VISIBLE_DEVICES": "3"}, [3]),
        (NvidiaPlugin(), {"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": "all"}, [0]),
        (NvidiaPlugin(), {}, None),
        (AscendPlugin(), {"ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"}, [4, 5, 6, 7]),
        (AscendPlugin(), {"ASCEND_VISIBLE_DEVICES": "0"}, [0]),
        (CambriconPlugin(), {"MLU_VISIBLE_DEVICES": "0,1"}, [0, 1]),
        (FakePlugin(), {"FAKE_VISIBLE_DEVICES": "0"}, [0]),
        (GenericPlugin(), {"CUDA_VISIBLE_DEVICES": "0"}, None),
    ],
    ids=lambda v: getattr(v, "name", None),
)
def test_visible_devices(plugin: ChipPlugin, env: dict[str, str], expected: list[int] | None) -> None:
    assert plugin.visible_devices(env) == expected


ALL_PLUGINS = [*REAL, GenericPlugin(), FakePlugin()]


@pytest.mark.parametrize("plugin", ALL_PLUGINS, ids=lambda p: p.name)
def test_metric_names_use_the_vocabulary(plugin: ChipPlugin) -> None:
    assert set(plugin.metric_names.values()) <= METRIC_VOCABULARY


@pytest.mark.parametrize("plugin", [*REAL, FakePlugin()], ids=lambda p: p.name)
@pytest.mark.parametrize("metric", sorted(CORE_METRICS))
def test_core_metrics_are_covered(plugin: ChipPlugin, metric: str) -> None:
    assert metric in set(plugin.metric_names.values())


@pytest.mark.parametrize(
    ("plugin", "vendor", "unified"),
    [
        (NvidiaPlugin(), "DCGM_FI_DEV_GPU_UTIL", "accelerator_utilization"),
        (NvidiaPlugin(), "DCGM_FI_DEV_FB_USED", "accelerator_memory_used"),
        (NvidiaPlugin(), "DCGM_FI_DEV_XID_ERRORS", "xid_errors"),
        (NvidiaPlugin(), "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_dbe"),
        (AscendPlugin(), "npu_chip_info_utilization", "accelerator_utilization"),
        (AscendPlugin(), "npu_chip_info_hbm_used_memory", "accelerator_memory_used"),
        (AscendPlugin(), "npu_chip_info_health_status", "health"),
        (AscendPlugin(), "npu_chip_info_link_status", "link_status"),
        (CambriconPlugin(), "mlu_utilization", "accelerator_utilization"),
        (CambriconPlugin(), "mlu_memory_used", "accelerator_memory_used"),
        (CambriconPlugin(), "mlu_health", "health"),
    ],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_known_metric_names(plugin: ChipPlugin, vendor: str, unified: str) -> None:
    assert plugin.unified_metric(vendor) == unified


def test_fake_plugin_is_a_usable_test_double() -> None:
    fake = get_plugin("fake")
    assert isinstance(fake, FakePlugin)
    entry = fake.lookup("fake:2")
    assert entry is not None
    assert (entry.vendor_action, entry.action) == ("RESET", Action.RESET_DEVICE)
    consequence = fake.lookup("fake:3")
    assert consequence is not None and consequence.consequence
    assert fake.lookup("xid:79") is None
    assert "fake" in fake.catalog_source()


def test_load_plugins_falls_back_when_metadata_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainmedic.udal import registry

    monkeypatch.setattr(registry, "entry_points", lambda group: [])
    registry.clear_cache()
    try:
        plugins = load_plugins()
        # The built-ins, and the test double the suite registers (tests/conftest.py).
        assert {p.name for p in plugins.values()} == set(builtin_plugins()) | {FAKE[0]}
    finally:
        monkeypatch.undo()
        registry.clear_cache()
