"""Generate udal/ascend_acl_catalog.yaml: the ACL / runtime / GE return codes of CANN.

Usage: python tools/catalogs/gen_acl.py <torch_npu/include folder of the torch-npu wheel>
Reads acl/acl_base_rt.h (ACL_ERROR_*), acl/error_codes/rt_error_codes.h (ACL_ERROR_RT_*, with the
header's comment as description) and acl/error_codes/ge_error_codes.h (ACL_ERROR_GE_*).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from common import row, write

# CANN's rules for aclError ("aclError", CANN API reference): 1XXXXX environment or code logic the
# developer can fix; 2XXXXX resources or API/argument mismatch with the hardware; 3XXXXX abnormal
# service (queue full/empty ...); 5XXXXX internal software/hardware errors the user cannot resolve.
RULE = {
    "1": "Rule 1 (1XXXXX): abnormal development environment or incorrect code logic that can be optimized",
    "2": "Rule 2 (2XXXXX): resource insufficiency or APIs/arguments mismatched with the hardware",
    "3": "Rule 3 (3XXXXX): abnormal services (full or empty queue, or others)",
    "5": "Rule 4 (5XXXXX): abnormal internal hardware and software errors that need to be reported to technical support",
}
OOM = {207001, 207018, 245000, 200000}
HANG = {507046, 507047, 507048, 507012, 507014, 507017, 507034, 507915, 107019, 107020, 207020}
HARDWARE = {
    507053: "memory",
    507054: "memory",
    507055: "memory",
    507056: "interconnect",
    507057: "interconnect",
    507914: "interconnect",
    507010: "hardware",
    507013: "hardware",
    507899: "driver",
    507901: "driver",
}
KERNEL_FAULT = {
    507015,
    507016,
    507018,
    507035,
    507036,
    507042,
    507043,
    507044,
    507045,
    507049,
    507050,
    207003,
    207016,
    207017,
    507011,
    507000,
    507001,
    507904,
    507916,
}
BENIGN = {0, 507023}
# "model execute failed" / "stream sync" wrappers report an earlier task error.
CONSEQUENCE = {507011}


def classify(value: int, name: str) -> tuple[str | None, str, str]:
    if value in BENIGN:
        return None, "unknown", "ignore"
    if value in OOM:
        return "accelerator_oom", "memory", "restart_app"
    if value in HARDWARE:
        origin = HARDWARE[value]
        action = (
            "isolate_node" if value in (507053, 507054) else "reset_device" if origin != "driver" else "restart_app"
        )
        return "device_error", origin, action
    if value in HANG:
        return "hang", "unknown", "restart_app"
    if value in KERNEL_FAULT:
        return "device_error", "application" if "OVER_FLOW" in name or "TRAP" in name else "hardware", "restart_app"
    first = str(value)[0]
    if first == "1" or (first == "2" and value not in OOM):
        return "app_error", "application", "notify_owner"
    if first == "3":
        return "unknown", "unknown", "restart_app"
    return "device_error", "unknown", "contact_support"


def parse(include: Path) -> list[tuple[int, str, str | None, str]]:
    out: list[tuple[int, str, str | None, str]] = []
    base = (include / "acl" / "acl_base_rt.h").read_text(encoding="utf-8")
    for name, value in re.findall(r"static const int (ACL_ERROR_\w+|ACL_SUCCESS) = (\d+);", base):
        out.append((int(value), name, None, "acl_base_rt.h"))
    ge = (include / "acl" / "error_codes" / "ge_error_codes.h").read_text(encoding="utf-8")
    for name, value in re.findall(r"static const uint32_t (ACL_ERROR_GE_\w+) = (\d+)U;", ge):
        out.append((int(value), name, None, "ge_error_codes.h"))
    rt = (include / "acl" / "error_codes" / "rt_error_codes.h").read_text(encoding="utf-8")
    for name, value, comment in re.findall(r"#define\s+(ACL_\w+)\s+(\d+)\s*//\s*(.*)", rt):
        out.append((int(value), name, comment.strip(), "rt_error_codes.h"))
    return out


def main(include: Path) -> None:
    rows = []
    seen: set[int] = set()
    for value, name, comment, header in parse(include):
        if value in seen:  # ACL_ERROR_NONE / ACL_SUCCESS / ACL_RT_SUCCESS share 0: keep the first
            continue
        seen.add(value)
        fault_class, origin, action = classify(value, name)
        rule = RULE.get(str(value)[0]) if value else None
        desc = comment or name
        note = f"{header}."
        if rule:
            note += f" CANN return-code {rule}."
        inferred = comment is None
        if inferred:
            note += " The header gives the name only; description = the name. Action chosen by trainmedic from the rule and the name."
        else:
            note += " Description = the header's comment. Action chosen by trainmedic from the rule and the comment."
        words = desc.rstrip(".")
        consequence = value in CONSEQUENCE
        if consequence:
            note += " Usually the consequence of an earlier device-side error: look for the first error of the device."
        rows.append(
            row(
                f"acl:{value}",
                mnemonic=name,
                description=desc,
                action=action,
                origin=origin,
                fault_class=fault_class,
                en=f"Ascend ACL/runtime returned {value} ({name}): {words}.",
                zh=f"昇腾 ACL/Runtime 返回 {value}（{name}）：{words}。",
                note=note,
                inferred=inferred,
                consequence=consequence,
            )
        )
    rows.sort(key=lambda r: int(r["code"].split(":")[1]))
    header = """# Huawei Ascend ACL / runtime / GE return codes for trainmedic (chip: ascend). Loaded by udal/ascend.py with
# ascend_catalog.yaml.
#
# Source: CANN acl headers as shipped in the torch-npu 2.14.0 wheel (PyPI torch-npu, folder
#   torch_npu/include/acl, CANN Open Software License 2.0, 2025): acl_base_rt.h (ACL_ERROR_* 100000-series,
#   148xxx, 200000-series, 300000, 500000-series), error_codes/ge_error_codes.h (ACL_ERROR_GE_* 145xxx, 245xxx,
#   345xxx, 545xxx), error_codes/rt_error_codes.h (ACL_ERROR_RT_* 107xxx, 207xxx, 507xxx, with a one-line
#   comment per code). The CANN API reference "aclError" table documents the same values
#   (https://www.hiascend.com/document/detail/en/canncommercial/850/API/appdevgapi/aclcppdevg_03_1344.html).
# Code `acl:<n>`; mnemonic = the ACL_ERROR_* name; description = the rt header's comment verbatim, or
#   the name where the header has no comment (those rows are `inferred: true`). The reference's
#   per-code "Possible Cause and Solution" column could not be read in full and is not transcribed.
# vendor_action is null: CANN's only bucket is the numbering rule (1XXXXX developer-fixable, 2XXXXX
#   resources, 3XXXXX service, 5XXXXX internal errors for technical support), named in each note; the
#   action is trainmedic's from that rule and the text. Generated by tools/catalogs/gen_acl.py.
"""
    write(
        "ascend_acl_catalog.yaml",
        header,
        {
            "chip": "ascend",
            "source": {
                "title": "CANN acl_base_rt.h, rt_error_codes.h, ge_error_codes.h (aclError return codes)",
                "url": "https://www.hiascend.com/document/detail/en/canncommercial/850/API/appdevgapi/aclcppdevg_03_1344.html",
                "version": "headers of torch-npu 2.14.0 (CANN 2025)",
            },
            "action_map": {},
            "entries": rows,
        },
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
