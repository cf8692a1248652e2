"""Every shipped catalog loads, validates, and says what the contracts promise."""

from __future__ import annotations

import re
from importlib import resources

import pytest
import yaml

from trainmedic.models import Action, Chip, FaultClass
from trainmedic.udal import ORIGINS, CatalogEntry, CatalogError, ChipPlugin, get_plugin, load_catalog_text
from trainmedic.udal.ascend import AscendPlugin
from trainmedic.udal.cambricon import CambriconPlugin
from trainmedic.udal.fake import FakePlugin
from trainmedic.udal.generic import GenericPlugin
from trainmedic.udal.nvidia import NvidiaPlugin

PLUGINS: list[ChipPlugin] = [NvidiaPlugin(), AscendPlugin(), CambriconPlugin(), GenericPlugin(), FakePlugin()]
CATALOG_FILES = sorted(p.name for p in resources.files("trainmedic.udal").iterdir() if p.name.endswith("_catalog.yaml"))


def _all_entries() -> list[tuple[str, CatalogEntry]]:
    return [(p.name, e) for p in PLUGINS for e in p.catalog().values()]


ALL_ENTRIES = _all_entries()


@pytest.mark.parametrize("filename", CATALOG_FILES)
def test_catalog_file_loads(filename: str) -> None:
    text = resources.files("trainmedic.udal").joinpath(filename).read_text(encoding="utf-8")
    catalog = load_catalog_text(text, filename)
    assert catalog.entries


@pytest.mark.parametrize("filename", CATALOG_FILES)
def test_catalog_file_header_names_source(filename: str) -> None:
    text = resources.files("trainmedic.udal").joinpath(filename).read_text(encoding="utf-8")
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert len(header) >= 3
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert data["source"]["url"].startswith("https://")


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_every_plugin_file_is_shipped(plugin: ChipPlugin) -> None:
    assert set(plugin.catalog_files()) <= set(CATALOG_FILES)
    assert plugin.catalog_source()


@pytest.mark.parametrize("filename", CATALOG_FILES)
def test_every_catalog_file_is_owned_by_a_plugin(filename: str) -> None:
    assert any(filename in p.catalog_files() for p in PLUGINS)


@pytest.mark.parametrize(("plugin_name", "entry"), ALL_ENTRIES, ids=[f"{n}-{e.code}" for n, e in ALL_ENTRIES])
def test_entry_is_complete(plugin_name: str, entry: CatalogEntry) -> None:
    assert isinstance(entry.action, Action)
    assert entry.origin in ORIGINS
    assert entry.message.en.strip() and entry.message.zh.strip()
    assert re.search(r"[\u4e00-\u9fff]", entry.message.zh), "zh message must contain Chinese"
    if entry.inferred:
        assert entry.note, "an inferred row must say why"


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_action_map_in_code_matches_data_file(plugin: ChipPlugin) -> None:
    assert dict(plugin.action_map) == dict(plugin._catalog().action_map)


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_vendor_buckets_follow_the_action_map(plugin: ChipPlugin) -> None:
    for entry in plugin.catalog().values():
        if entry.vendor_action is not None and entry.vendor_action in plugin.action_map:
            assert entry.action == plugin.action_map[entry.vendor_action]


@pytest.mark.parametrize("n", range(1, 173))
def test_every_xid_of_the_catalog_is_present(n: int) -> None:
    entry = get_plugin(Chip.NVIDIA).lookup(f"xid:{n}")
    assert entry is not None
    assert entry.mnemonic


@pytest.mark.parametrize(
    ("code", "vendor_action", "action", "origin"),
    [
        ("xid:13", "RESTART_APP", Action.RESTART_APP, "application"),
        ("xid:31", "RESTART_APP", Action.RESTART_APP, "application"),
        ("xid:43", "IGNORE", Action.IGNORE, "application"),
        ("xid:45", "WORKFLOW_XID_45", Action.IGNORE, "application"),
        ("xid:48", "WORKFLOW_XID_48", Action.RESET_DEVICE, "hardware"),
        ("xid:63", "IGNORE", Action.IGNORE, "hardware"),
        ("xid:64", "RESET_GPU", Action.RESET_DEVICE, "hardware"),
        ("xid:74", "WORKFLOW_NVLINK_ERR", Action.RESET_DEVICE, "hardware"),
        ("xid:79", "RESTART_BM", Action.REBOOT_NODE, "hardware"),
        ("xid:92", "IGNORE", Action.IGNORE, "hardware"),
        ("xid:94", "RESTART_APP", Action.RESTART_APP, "hardware"),
        ("xid:95", "RESET_GPU", Action.RESET_DEVICE, "hardware"),
        ("xid:151", "RESTART_VM", Action.REBOOT_NODE, "driver"),
    ],
)
def test_known_xids(code: str, vendor_action: str, action: Action, origin: str) -> None:
    entry = get_plugin(Chip.NVIDIA).lookup(code)
    assert entry is not None
    assert (entry.vendor_action, entry.action, entry.origin) == (vendor_action, action, origin)


def test_xid_45_is_a_consequence() -> None:
    entry = get_plugin(Chip.NVIDIA).lookup("xid:45")
    assert entry is not None and entry.consequence


@pytest.mark.parametrize(
    ("chip", "code", "fault_class"),
    [
        (Chip.NVIDIA, "cuda_oom", FaultClass.ACCELERATOR_OOM),
        (Chip.NVIDIA, "cuda_ecc_uncorrectable", FaultClass.DEVICE_ERROR),
        (Chip.NVIDIA, "cuda_illegal_address", FaultClass.DEVICE_ERROR),
        (Chip.NVIDIA, "cuda_launch_failure", FaultClass.DEVICE_ERROR),
        (Chip.NVIDIA, "gpu_fallen_off_bus", FaultClass.DEVICE_ERROR),
        (Chip.NVIDIA, "ncclSystemError", FaultClass.COMM_ERROR),
        (Chip.NVIDIA, "ncclInternalError", FaultClass.COMM_ERROR),
        (Chip.NVIDIA, "ncclUnhandledCudaError", FaultClass.COMM_ERROR),
        (Chip.NVIDIA, "ncclRemoteError", FaultClass.COMM_ERROR),
        (Chip.NVIDIA, "ncclInvalidUsage", FaultClass.COMM_ERROR),
        (Chip.NVIDIA, "nccl_watchdog", FaultClass.HANG),
        (Chip.NVIDIA, "nccl_ib_completion", FaultClass.COMM_ERROR),
        (Chip.ASCEND, "EL0004", FaultClass.ACCELERATOR_OOM),
        (Chip.ASCEND, "EI0002", FaultClass.HANG),
        (Chip.ASCEND, "EI0006", FaultClass.COMM_INIT),
        (Chip.ASCEND, "EI0013", FaultClass.COMM_ERROR),
        (Chip.ASCEND, "EJ0001", FaultClass.COMM_INIT),
        (Chip.ASCEND, "npu_oom", FaultClass.ACCELERATOR_OOM),
        (Chip.ASCEND, "ERR02200", FaultClass.COMM_ERROR),
        (Chip.ASCEND, "hccl:9", FaultClass.HANG),
        (Chip.ASCEND, "0x80C98000", FaultClass.DEVICE_ERROR),
        (Chip.CAMBRICON, "cnrt_oom", FaultClass.ACCELERATOR_OOM),
        (Chip.CAMBRICON, "mlu_oom", FaultClass.ACCELERATOR_OOM),
        (Chip.CAMBRICON, "cndev:XID_ERROR", FaultClass.DEVICE_ERROR),
        (Chip.CAMBRICON, "cncl:CNCL_RET_ERR_SYS_SOCKET", FaultClass.COMM_ERROR),
        (Chip.GENERIC, "oom_killed", FaultClass.HOST_OOM),
        (Chip.GENERIC, "exit_137", FaultClass.HOST_OOM),
        (Chip.GENERIC, "no_progress", FaultClass.HANG),
        (Chip.GENERIC, "rendezvous_timeout", FaultClass.COMM_INIT),
    ],
)
def test_contract_codes_exist_with_their_class(chip: Chip, code: str, fault_class: FaultClass) -> None:
    entry = get_plugin(chip).lookup(code)
    assert entry is not None, code
    assert entry.fault_class == fault_class


@pytest.mark.parametrize(
    ("code", "level", "action"),
    [
        ("0x80E21007", "NotHandleFault", Action.IGNORE),
        ("0x80C98008", "RestartRequest", Action.RESTART_APP),
        ("0x8C204E00", "RestartBusiness", Action.RESTART_APP),
        ("0x8C0E4E00", "FreeRestartNPU", Action.RESET_DEVICE),
        ("0x8C03A000", "RestartNPU", Action.RESET_DEVICE),
        ("0x80E3A201", "SeparateNPU", Action.ISOLATE_NODE),
        ("0x81A3880C", "SubHealthFault", Action.IGNORE),
        ("0xA2301001", "SeparateNPU", Action.ISOLATE_NODE),  # listed twice upstream: highest level wins
    ],
)
def test_ascend_fault_levels(code: str, level: str, action: Action) -> None:
    entry = get_plugin(Chip.ASCEND).lookup(code)
    assert entry is not None
    assert (entry.vendor_action, entry.action) == (level, action)


@pytest.mark.parametrize(
    ("chip", "written", "canonical"),
    [
        (Chip.NVIDIA, "Xid 79", "xid:79"),
        (Chip.NVIDIA, "XID:13", "xid:13"),
        (Chip.ASCEND, "80c98008", "0x80C98008"),
        (Chip.ASCEND, "0x80818200", "0x80818200"),
        (Chip.ASCEND, "ei0002", "EI0002"),
        (Chip.ASCEND, "HCCL: 9", "hccl:9"),
        (Chip.CAMBRICON, "CNCL:cncl_ret_err_system", "cncl:CNCL_RET_ERR_SYSTEM"),
    ],
)
def test_codes_are_normalized_before_lookup(chip: Chip, written: str, canonical: str) -> None:
    entry = get_plugin(chip).lookup(written)
    assert entry is not None
    assert entry.code == canonical


def test_unknown_code_is_none() -> None:
    assert get_plugin(Chip.NVIDIA).lookup("xid:9999") is None


def _good_catalog() -> dict[str, object]:
    return {
        "chip": "generic",
        "source": {"title": "t", "url": "https://example.invalid", "version": "1"},
        "action_map": {"R": "restart_app"},
        "entries": [
            {
                "code": "x:1",
                "description": "d",
                "vendor_action": "R",
                "action": "restart_app",
                "origin": "unknown",
                "severity": "error",
                "message": {"en": "e", "zh": "中"},
            }
        ],
    }


def test_loader_accepts_good_catalog() -> None:
    assert "x:1" in load_catalog_text(yaml.safe_dump(_good_catalog()), "good.yaml").entries


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["entries"][0].update(action="explode"), r"bad\.yaml: entry x:1: action"),
        (lambda d: d["entries"][0].update(origin="moon"), r"bad\.yaml: entry x:1: origin"),
        (lambda d: d["entries"][0].pop("message"), r"bad\.yaml: entry x:1: message"),
        (lambda d: d["entries"][0].update(colour="red"), r"bad\.yaml: entry x:1: colour"),
        (lambda d: d["entries"][0].update(action="ignore"), r"bad\.yaml: entry x:1: .*disagrees"),
        (lambda d: d["entries"].append(dict(d["entries"][0])), r"bad\.yaml: entry x:1: duplicate"),
        (lambda d: d.update(entries=[]), r"bad\.yaml: entries"),
        (lambda d: d.update(chip="tpu"), r"bad\.yaml: header"),
        (lambda d: d.update(extra=1), r"bad\.yaml: unknown top-level"),
    ],
)
def test_loader_rejects_bad_rows_with_file_and_key(mutate: object, expected: str) -> None:
    data = _good_catalog()
    assert callable(mutate)
    mutate(data)
    with pytest.raises(CatalogError, match=expected):
        load_catalog_text(yaml.safe_dump(data), "bad.yaml")


def test_loader_rejects_invalid_yaml() -> None:
    with pytest.raises(CatalogError, match=r"bad\.yaml: not valid YAML"):
        load_catalog_text("entries: [", "bad.yaml")


def test_xid154_action_from_message() -> None:
    from trainmedic.udal.nvidia import xid154_action

    line = "Xid 154 GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert xid154_action(line) == Action.REBOOT_NODE
    assert xid154_action("nothing here") is None
