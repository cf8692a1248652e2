"""The vendor tables transcribed into the catalogs: every family is complete, every row says where it
comes from, the normalizers accept the forms logs write, and vendor message texts find their row."""

from __future__ import annotations

import functools
import re
from importlib import resources

import pytest
import yaml

from trainmedic import udal
from trainmedic.models import Action, Chip, FaultClass
from trainmedic.udal import CatalogEntry, CatalogError, ChipPlugin, get_plugin, load_catalog_text
from trainmedic.udal.base import MIN_TEXT_LENGTH, TextIndex, merge_catalogs
from trainmedic.udal.nvidia import ACTION_MAP as NVIDIA_ACTION_MAP

VENDOR_PLUGINS: list[ChipPlugin] = [get_plugin(Chip.NVIDIA), get_plugin(Chip.ASCEND), get_plugin(Chip.CAMBRICON)]
FILES = [(p.name, f) for p in VENDOR_PLUGINS for f in p.catalog_files()]


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _text(filename: str) -> str:
    return resources.files("trainmedic.udal").joinpath(filename).read_text(encoding="utf-8")


@functools.cache
def _rows(filename: str) -> list[dict[str, object]]:
    data = yaml.load(_text(filename), Loader=_LOADER)
    rows = data["entries"]
    assert isinstance(rows, list)
    return rows


@pytest.mark.parametrize(("plugin_name", "filename"), FILES, ids=[f for _, f in FILES])
def test_file_parses_and_names_its_source_and_version(plugin_name: str, filename: str) -> None:
    catalog = load_catalog_text(_text(filename), filename)
    assert catalog.chip.value == plugin_name
    assert catalog.source.url.startswith("https://")
    assert catalog.source.version.strip()
    header = [line for line in _text(filename).splitlines() if line.startswith("#")]
    assert any("Source" in line or "Sources" in line for line in header), "the header names its source"


@pytest.mark.parametrize(("plugin_name", "filename"), FILES, ids=[f for _, f in FILES])
def test_codes_unique_within_a_file(plugin_name: str, filename: str) -> None:
    codes = [str(r["code"]) for r in _rows(filename)]
    assert len(codes) == len(set(codes))


@pytest.mark.parametrize("plugin", VENDOR_PLUGINS, ids=lambda p: p.name)
def test_codes_unique_across_the_files_of_a_chip(plugin: ChipPlugin) -> None:
    codes = [str(r["code"]) for f in plugin.catalog_files() for r in _rows(f)]
    assert len(codes) == len(set(codes)) == len(plugin.catalog())


@pytest.mark.parametrize(("plugin_name", "filename"), FILES, ids=[f for _, f in FILES])
def test_rows_follow_their_file_action_map(plugin_name: str, filename: str) -> None:
    catalog = load_catalog_text(_text(filename), filename)
    for entry in catalog.entries.values():
        if entry.vendor_action is not None and entry.vendor_action in catalog.action_map:
            assert entry.action == catalog.action_map[entry.vendor_action], entry.code


_PLACEHOLDER = re.compile(r"\b(?:TODO|TBD|FIXME|XXX|lorem|placeholder)\b", re.IGNORECASE)


@pytest.mark.parametrize(("plugin_name", "filename"), FILES, ids=[f for _, f in FILES])
def test_no_placeholder_rows(plugin_name: str, filename: str) -> None:
    catalog = load_catalog_text(_text(filename), filename)
    for entry in catalog.entries.values():
        for text in (entry.description, entry.message.en, entry.message.zh, entry.note or ""):
            assert not _PLACEHOLDER.search(text), f"{entry.code}: {text}"
        assert re.search(r"[\u4e00-\u9fff]", entry.message.zh), entry.code
        assert entry.message.en != entry.description, f"{entry.code}: the message must say more than the code"
        assert all(s.strip() for s in (*entry.causes, *entry.steps, *entry.texts)), entry.code
        if entry.inferred or entry.vendor_action is None:
            assert entry.note, f"{entry.code}: a row without a vendor bucket says how its action was chosen"


@pytest.mark.parametrize(
    ("chip", "prefix", "at_least"),
    [
        (Chip.NVIDIA, "cuda:", 130),  # cudaError_t of CUDA 13.x: 138 values
        (Chip.NVIDIA, "dcgm:", 118),  # DCGM_FR_OK .. DCGM_FR_TEST_SKIPPED
        (Chip.NVIDIA, "sxid:", 300),
        (Chip.NVIDIA, "xid:", 172),
        (Chip.ASCEND, "acl:", 240),
        (Chip.ASCEND, "0x", 300),
        (Chip.CAMBRICON, "cnrt:", 41),
        (Chip.CAMBRICON, "cndev:CNDEV_", 19),
        (Chip.CAMBRICON, "cndrv:", 130),
        (Chip.CAMBRICON, "cncl:", 30),
    ],
)
def test_family_sizes(chip: Chip, prefix: str, at_least: int) -> None:
    assert sum(1 for code in get_plugin(chip).catalog() if code.startswith(prefix)) >= at_least


@pytest.mark.parametrize(
    "name",
    [
        "ncclSuccess",
        "ncclUnhandledCudaError",
        "ncclSystemError",
        "ncclInternalError",
        "ncclInvalidArgument",
        "ncclInvalidUsage",
        "ncclRemoteError",
        "ncclInProgress",
        "ncclTimeout",
    ],
)
def test_every_nccl_result_is_present(name: str) -> None:
    assert get_plugin(Chip.NVIDIA).lookup(name) is not None


@pytest.mark.parametrize(
    ("chip", "written", "canonical"),
    [
        (Chip.NVIDIA, "SXid 12028", "sxid:12028"),
        (Chip.NVIDIA, "sxid:20034", "sxid:20034"),
        (Chip.NVIDIA, "DCGM_FR_XID_ERROR", "dcgm:DCGM_FR_XID_ERROR"),
        (Chip.NVIDIA, "dcgm:dcgm_fr_faulty_memory", "dcgm:DCGM_FR_FAULTY_MEMORY"),
        (Chip.NVIDIA, "DCGM_FR_CLOCKS_EVENT_THERMAL", "dcgm:DCGM_FR_CLOCK_THROTTLE_THERMAL"),
        (Chip.NVIDIA, "cudaErrorIllegalAddress", "cuda:cudaErrorIllegalAddress"),
        (Chip.NVIDIA, "cuda:cudaErrorECCUncorrectable", "cuda:cudaErrorECCUncorrectable"),
        (Chip.NVIDIA, "cuda_oom", "cuda_oom"),
        (Chip.NVIDIA, "nccl:8", "ncclTimeout"),
        (Chip.NVIDIA, "ncclRemoteError", "ncclRemoteError"),
        (Chip.ASCEND, "507015", "acl:507015"),
        (Chip.ASCEND, "acl:507011", "acl:507011"),
        (Chip.ASCEND, "ACL_ERROR_RT_AICORE_EXCEPTION", "acl:507015"),
        (Chip.ASCEND, "ACL_ERROR_GE_MEMORY_ALLOCATION", "acl:245000"),
        (Chip.ASCEND, "ACL_ERROR_INVALID_PARAM", "acl:100000"),
        (Chip.ASCEND, "EL0004", "EL0004"),
        (Chip.ASCEND, "ez9999", "EZ9999"),
        (Chip.ASCEND, "E19999", "E19999"),
        (Chip.ASCEND, "E39999", "E39999"),
        (Chip.CAMBRICON, "cnrtErrorNoMem", "cnrt:cnrtErrorNoMem"),
        (Chip.CAMBRICON, "cnrt:cnrtErrorCndrvFuncCall", "cnrt:cnrtErrorCndrvFuncCall"),
        (Chip.CAMBRICON, "CN_MEMORY_ERROR_OUT_OF_MEMORY", "cndrv:CN_MEMORY_ERROR_OUT_OF_MEMORY"),
        (Chip.CAMBRICON, "cndrv:CN_ERROR_ECC_UNCORRECTABLE", "cndrv:CN_ERROR_ECC_UNCORRECTABLE"),
        (Chip.CAMBRICON, "CNDEV_ERROR_NO_DRIVER", "cndev:CNDEV_ERROR_NO_DRIVER"),
        (Chip.CAMBRICON, "CNCL_RET_ERR_SYSTEM", "cncl:CNCL_RET_ERR_SYSTEM"),
    ],
)
def test_written_forms_normalize_and_resolve(chip: Chip, written: str, canonical: str) -> None:
    entry = udal.lookup(chip, written)
    assert entry is not None, written
    assert entry.code == canonical


@pytest.mark.parametrize(
    ("chip", "code"),
    [
        (Chip.NVIDIA, "xid:9999"),
        (Chip.NVIDIA, "sxid:99999"),
        (Chip.NVIDIA, "dcgm:DCGM_FR_NOT_A_CODE"),
        (Chip.NVIDIA, "cudaErrorNotACode"),
        (Chip.NVIDIA, ""),
        (Chip.NVIDIA, "   "),
        (Chip.ASCEND, "acl:599999"),
        (Chip.ASCEND, "ACL_ERROR_RT_NOT_A_CODE"),
        (Chip.ASCEND, "EQ0001"),
        (Chip.CAMBRICON, "cnrtErrorNotACode"),
        (Chip.CAMBRICON, "CN_NOT_A_CODE"),
        (Chip.GENERIC, "anything"),
        ("tpu", "xid:79"),
    ],
)
def test_unknown_codes_give_none(chip: Chip | str, code: str) -> None:
    assert udal.lookup(chip, code) is None


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda:cudaErrorIllegalAddress"),
        ("CUDA error: uncorrectable ECC error encountered", "cuda:cudaErrorECCUncorrectable"),
        ("RuntimeError: CUDA error: device-side assert triggered", "cuda:cudaErrorAssert"),
        ("RuntimeError: CUDA error: unspecified launch failure", "cuda:cudaErrorLaunchFailure"),
        (
            "CUDA error: no kernel image is available for execution on the device",
            "cuda:cudaErrorNoKernelImageForDevice",
        ),
        ("CUDA driver version is insufficient for CUDA runtime version", "cuda:cudaErrorInsufficientDriver"),
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error "
            "(run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
            "ncclSystemError",
        ),
        ("ncclRemoteError: remote process exited or there was a network error", "ncclRemoteError"),
        ("internal error - please report this issue to the NCCL developers", "ncclInternalError"),
        ("Detected XID 79 for GPU 3", "dcgm:DCGM_FR_XID_ERROR"),
        ("Found 12 faulty memory elements on GPU 0", "dcgm:DCGM_FR_FAULTY_MEMORY"),
        ("Detected 2 volatile double-bit ECC error(s) in GPU 5.", "dcgm:DCGM_FR_VOLATILE_DBE_DETECTED"),
        ("GPU 1 had uncorrectable memory errors and row remapping failed.", "dcgm:DCGM_FR_ROW_REMAP_FAILURE"),
    ],
)
def test_lookup_text_on_nvidia_vendor_strings(line: str, code: str) -> None:
    entry = udal.lookup_text(Chip.NVIDIA, line)
    assert entry is not None, line
    assert entry.code == code


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("EI0006: Getting socket times out. Reason: 1. The remote does not initiate a connect request.", "EI0006"),
        (
            "EJ0001: Failed to initialize the HCCP process. Reason: Maybe the last training process is running.",
            "EJ0001",
        ),
        ("E19999: Inner Error! Unknown error occurred. Please check the log.", "E19999"),
        ("E13024: Value 8x for environment variable HCCL_BUFFSIZE is invalid. Reason: not a number.", "E13024"),
        ("E10501: IR for Op MatMulV9 with optype MatMulV9 is not registered.", "E10501"),
    ],
)
def test_lookup_text_on_ascend_vendor_strings(line: str, code: str) -> None:
    entry = udal.lookup_text(Chip.ASCEND, line)
    assert entry is not None, line
    assert entry.code == code


@pytest.mark.parametrize(
    "line",
    [
        "step 100 loss 2.31 lr 1e-4",
        "no error",
        "timeout",
        "",
        "Out of memory: Killed process 1234 (python)",
    ],
)
def test_lookup_text_finds_nothing_in_ordinary_lines(line: str) -> None:
    assert udal.lookup_text(Chip.NVIDIA, line) is None


def test_lookup_text_on_other_chips_is_none_cleanly() -> None:
    assert udal.lookup_text(Chip.GENERIC, "an illegal memory access was encountered") is None
    assert udal.lookup_text(Chip.ASCEND, "an illegal memory access was encountered") is None


def test_text_index_is_built_once_per_process() -> None:
    plugin = get_plugin(Chip.NVIDIA)
    assert plugin._text_index() is plugin._text_index()
    assert len(plugin._text_index()) > 200


def _entry(code: str, texts: tuple[str, ...]) -> CatalogEntry:
    return CatalogEntry(
        chip=Chip.GENERIC,
        code=code,
        description="d",
        action=Action.IGNORE,
        origin="unknown",
        severity="info",
        message={"en": "e", "zh": "中"},
        texts=texts,
    )


def test_text_index_longest_text_wins_and_shared_or_short_texts_are_skipped() -> None:
    entries = {
        "a": _entry("a", ("device not available right now",)),
        "b": _entry("b", ("the device not available right now for this job",)),
        "c": _entry("c", ("shared vendor text here",)),
        "d": _entry("d", ("shared vendor text here",)),
        "e": _entry("e", ("x" * (MIN_TEXT_LENGTH - 1),)),
        "f": _entry("f", ("Detected %ld %s for GPU %u which is above the threshold %ld",)),
    }
    index = TextIndex(entries)
    found = index.find("err: the device not available right now for this job")
    assert found is not None and found.code == "b"
    found = index.find("device not available right now")
    assert found is not None and found.code == "a"
    assert index.find("shared vendor text here") is None
    assert index.find("x" * 40) is None
    found = index.find("Detected 5 volatile DBE errors for GPU 2 which is above the threshold 0")
    assert found is not None and found.code == "f"
    assert index.find("Detected 5 volatile DBE errors for GPU 2") is None


def _catalog_data(code: str, bucket_action: str = "restart_app") -> dict[str, object]:
    return {
        "chip": "generic",
        "source": {"title": "t", "url": "https://example.invalid", "version": "1"},
        "action_map": {"R": bucket_action},
        "entries": [
            {
                "code": code,
                "description": "d",
                "vendor_action": "R",
                "action": bucket_action,
                "origin": "unknown",
                "severity": "error",
                "message": {"en": "e", "zh": "中"},
                "causes": ["c1"],
                "steps": ["s1", "s2"],
                "texts": ["t1"],
            }
        ],
    }


def test_optional_fields_load_as_tuples() -> None:
    catalog = load_catalog_text(yaml.safe_dump(_catalog_data("x:1")), "a.yaml")
    entry = catalog.entries["x:1"]
    assert (entry.causes, entry.steps, entry.texts) == (("c1",), ("s1", "s2"), ("t1",))


def test_merge_rejects_a_code_in_two_files() -> None:
    a = load_catalog_text(yaml.safe_dump(_catalog_data("x:1")), "a.yaml")
    b = load_catalog_text(yaml.safe_dump(_catalog_data("x:1")), "b.yaml")
    with pytest.raises(CatalogError, match=r"b\.yaml: entry x:1: duplicate"):
        merge_catalogs([a, b], ["a.yaml", "b.yaml"])


def test_merge_rejects_a_bucket_mapped_two_ways() -> None:
    a = load_catalog_text(yaml.safe_dump(_catalog_data("x:1")), "a.yaml")
    b = load_catalog_text(yaml.safe_dump(_catalog_data("x:2", "ignore")), "b.yaml")
    with pytest.raises(CatalogError, match=r"b\.yaml: action_map R"):
        merge_catalogs([a, b], ["a.yaml", "b.yaml"])


def test_yaml_loader_is_libyaml_when_available() -> None:
    from trainmedic.datafile import fast_loader

    # udal.base reads catalogs through trainmedic.datafile.load_yaml.
    assert fast_loader() is getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@pytest.mark.parametrize(
    ("bucket", "action"),
    [
        ("DCGM_ERROR_ISOLATE", Action.ISOLATE_NODE),
        ("DCGM_ERROR_RESET", Action.RESET_DEVICE),
        ("DCGM_ERROR_MONITOR", Action.IGNORE),
        ("DCGM_ERROR_TRIAGE", Action.CONTACT_SUPPORT),
    ],
)
def test_dcgm_severity_buckets(bucket: str, action: Action) -> None:
    assert NVIDIA_ACTION_MAP[bucket] == action
    rows = [e for c, e in get_plugin(Chip.NVIDIA).catalog().items() if c.startswith("dcgm:")]
    assert any(e.vendor_action == bucket for e in rows)


@pytest.mark.parametrize(
    ("chip", "code", "fault_class", "action"),
    [
        (Chip.NVIDIA, "cuda:cudaErrorMemoryAllocation", FaultClass.ACCELERATOR_OOM, Action.RESTART_APP),
        (Chip.NVIDIA, "cuda:cudaErrorECCUncorrectable", FaultClass.DEVICE_ERROR, Action.RESET_DEVICE),
        (Chip.NVIDIA, "cuda:cudaErrorInvalidValue", FaultClass.APP_ERROR, Action.NOTIFY_OWNER),
        (Chip.NVIDIA, "ncclTimeout", FaultClass.HANG, Action.RESTART_APP),
        (Chip.NVIDIA, "dcgm:DCGM_FR_VOLATILE_DBE_DETECTED", FaultClass.DEVICE_ERROR, Action.ISOLATE_NODE),
        (Chip.ASCEND, "acl:207001", FaultClass.ACCELERATOR_OOM, Action.RESTART_APP),
        (Chip.ASCEND, "acl:507054", FaultClass.DEVICE_ERROR, Action.ISOLATE_NODE),
        (Chip.ASCEND, "acl:507046", FaultClass.HANG, Action.RESTART_APP),
        (Chip.ASCEND, "acl:100000", FaultClass.APP_ERROR, Action.NOTIFY_OWNER),
        (Chip.ASCEND, "E19999", FaultClass.UNKNOWN, Action.CONTACT_SUPPORT),
        (Chip.CAMBRICON, "cnrt:cnrtErrorNoMem", FaultClass.ACCELERATOR_OOM, Action.RESTART_APP),
        (Chip.CAMBRICON, "cndrv:CN_MEMORY_ERROR_OUT_OF_MEMORY", FaultClass.ACCELERATOR_OOM, Action.RESTART_APP),
        (Chip.CAMBRICON, "cndrv:CN_ERROR_ECC_UNCORRECTABLE", FaultClass.DEVICE_ERROR, Action.RESET_DEVICE),
        (Chip.CAMBRICON, "cndev:CNDEV_ERROR_IN_PROBLEM", FaultClass.DEVICE_ERROR, Action.ISOLATE_NODE),
    ],
)
def test_classification_of_key_codes(chip: Chip, code: str, fault_class: FaultClass, action: Action) -> None:
    entry = udal.lookup(chip, code)
    assert entry is not None
    assert (entry.fault_class, entry.action) == (fault_class, action)


@pytest.mark.parametrize("code", ["EI0002", "EI0006", "EI0013", "EJ0001"])
def test_hccl_codes_carry_the_registry_causes_and_steps(code: str) -> None:
    entry = udal.lookup(Chip.ASCEND, code)
    assert entry is not None
    assert entry.steps
    assert len(entry.steps) == len(set(entry.steps))


@pytest.mark.parametrize(
    ("code", "fault_class", "causes", "first_step"),
    [
        (
            "hccl_heartbeat_lost",
            FaultClass.HANG,
            ("Process has exited", "Network Disconnected"),
            "检查所有卡的报错情况",
        ),
        ("hccl_stuck", FaultClass.HANG, ("Process is stuck",), "检查所有卡的报错情况"),
        (
            "aicpu_exception",
            FaultClass.DEVICE_ERROR,
            (
                "data input mismatch (including data format or broadcast dimension)",
                "out-of-bounds access",
                "AI CPU thread suspension",
                "operator execution timeout (30 seconds by default)",
            ),
            "Check the logs of the AI CPU",
        ),
    ],
)
def test_rule_codes_carry_the_guides_causes_and_ordered_steps(
    code: str, fault_class: FaultClass, causes: tuple[str, ...], first_step: str
) -> None:
    """Codes rules give to CANN lines without a vendor code: the HCCL guide's and CANN troubleshooting's
    causes and steps (udal/ascend_hccl_guide_catalog.yaml), in the published order."""
    entry = udal.lookup(Chip.ASCEND, code)
    assert entry is not None
    assert entry.fault_class is fault_class
    assert entry.causes == causes
    assert entry.steps[0].startswith(first_step)
    assert len(entry.steps) == len(set(entry.steps))
    assert entry.note
