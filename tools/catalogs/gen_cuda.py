# ruff: noqa: E501
"""Generate udal/nvidia_cuda_catalog.yaml: every cudaError_t of the CUDA runtime.

Usage: python tools/catalogs/gen_cuda.py <dir with include/driver_types.h and lib/libcudart.so.N>
(the nvidia/cu13 folder of the PyPI wheel nvidia-cuda-runtime). Names and values come from the
cudaError enum of driver_types.h, descriptions from its doc comments (first sentence), the texts
from cudaGetErrorString() of that libcudart (called through ctypes; no GPU needed).
"""

from __future__ import annotations

import ctypes
import glob
import re
import sys
from pathlib import Path

from common import row, write

APP = ("app_error", "application", "notify_owner")
CLASS: dict[str, tuple[str | None, str, str]] = {
    "cudaSuccess": (None, "unknown", "ignore"),
    "cudaErrorNotReady": (None, "unknown", "ignore"),
    "cudaErrorCudartUnloading": ("app_error", "application", "ignore"),
    "cudaErrorMemoryAllocation": ("accelerator_oom", "memory", "restart_app"),
    "cudaErrorInitializationError": ("device_error", "driver", "contact_support"),
    "cudaErrorInsufficientDriver": ("device_error", "driver", "contact_support"),
    "cudaErrorStubLibrary": ("device_error", "driver", "contact_support"),
    "cudaErrorCallRequiresNewerDriver": ("device_error", "driver", "contact_support"),
    "cudaErrorSystemDriverMismatch": ("device_error", "driver", "contact_support"),
    "cudaErrorSystemNotReady": ("device_error", "driver", "restart_app"),
    "cudaErrorCompatNotSupportedOnDevice": ("device_error", "driver", "contact_support"),
    "cudaErrorDevicesUnavailable": ("device_error", "driver", "restart_app"),
    "cudaErrorNoDevice": ("device_error", "driver", "contact_support"),
    "cudaErrorStartupFailure": ("device_error", "driver", "contact_support"),
    "cudaErrorUnknown": ("device_error", "unknown", "restart_app"),
    "cudaErrorECCUncorrectable": ("device_error", "hardware", "reset_device"),
    "cudaErrorNvlinkUncorrectable": ("device_error", "interconnect", "reset_device"),
    "cudaErrorContained": ("device_error", "hardware", "reset_device"),
    "cudaErrorHardwareStackError": ("device_error", "hardware", "restart_app"),
    "cudaErrorIllegalAddress": ("device_error", "application", "restart_app"),
    "cudaErrorIllegalInstruction": ("device_error", "application", "restart_app"),
    "cudaErrorMisalignedAddress": ("device_error", "application", "restart_app"),
    "cudaErrorInvalidAddressSpace": ("device_error", "application", "restart_app"),
    "cudaErrorInvalidPc": ("device_error", "application", "restart_app"),
    "cudaErrorLaunchFailure": ("device_error", "application", "restart_app"),
    "cudaErrorPriorLaunchFailure": ("device_error", "application", "restart_app"),
    "cudaErrorLaunchTimeout": ("device_error", "driver", "restart_app"),
    "cudaErrorTimeout": ("hang", "unknown", "restart_app"),
    "cudaErrorFabricNotReady": ("device_error", "interconnect", "restart_app"),
    "cudaErrorExternalDevice": ("device_error", "unknown", "restart_app"),
    "cudaErrorAssert": ("app_error", "application", "notify_owner"),
    "cudaErrorTensorMemoryLeak": ("app_error", "application", "notify_owner"),
    "cudaErrorOperatingSystem": ("device_error", "system", "contact_support"),
    "cudaErrorSoftwareValidityNotEstablished": ("device_error", "driver", "contact_support"),
    "cudaErrorDeviceNotLicensed": ("device_error", "driver", "contact_support"),
}
for _n in (
    "ConnectionFailed",
    "RpcFailure",
    "ServerNotReady",
    "MaxClientsReached",
    "MaxConnectionsReached",
    "ClientTerminated",
):
    CLASS[f"cudaErrorMps{_n}"] = ("device_error", "system", "restart_app")


def main(root: Path) -> None:
    src = (root / "include" / "driver_types.h").read_text(encoding="utf-8")
    body = re.search(r"enum __device_builtin__ cudaError\s*\{(.*?)\};", src, re.S)
    assert body is not None
    items = re.findall(r"/\*\*(.*?)\*/\s*(cudaError\w+|cudaSuccess)\s*=\s*(\d+)", body.group(1), re.S)
    version = re.search(r"#define CUDART_VERSION\s+(\d+)", (root / "include" / "cuda_runtime_api.h").read_text())
    lib = ctypes.CDLL(glob.glob(str(root / "lib" / "libcudart.so.*"))[0])
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    rows = []
    for doc, name, value in items:
        text = lib.cudaGetErrorString(int(value)).decode()
        words = " ".join(line.strip().lstrip("*").strip() for line in doc.splitlines()).strip()
        words = words.replace("::", "").replace("\\p ", "").replace("\\ref ", "")
        words = re.sub(r"\\note.*$", "", words).strip()
        first = re.split(r"(?<=[a-z)])\. ", words, maxsplit=1)[0].rstrip(".") + "."
        deprecated = "deprecated" in words.lower()
        fault_class, origin, action = CLASS.get(name, APP)
        what = f'CUDA runtime error {name} ({value}), "{text}".'
        zh = f"CUDA 运行时错误 {name}（{value}）：“{text}”。"
        note = "cudaError_t value; classification chosen by trainmedic from the header's description."
        if deprecated:
            note += " The header marks this value deprecated."
        if name == "cudaErrorMemoryAllocation":
            what += " The job ran out of GPU memory: lower the batch size or sequence length, or enable activation checkpointing."
            zh += "作业显存不足：请减小 batch size 或序列长度，或开启激活重计算。"
        rows.append(
            row(
                f"cuda:{name}",
                mnemonic=name,
                description=first,
                action=action,
                origin=origin,
                fault_class=fault_class,
                en=what,
                zh=zh,
                note=note,
                texts=[text] if name not in ("cudaSuccess",) else None,
            )
        )
    ver = int(version.group(1)) if version else 0
    header = f"""# NVIDIA CUDA runtime error catalog for trainmedic (chip: nvidia). Loaded by udal/nvidia.py with
# nvidia_catalog.yaml.
#
# Source: NVIDIA CUDA Runtime API, "Data types used by CUDA Runtime", enum cudaError
#   (https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html), as shipped in driver_types.h
#   of CUDA runtime {ver // 1000}.{(ver % 1000) // 10} (PyPI wheel nvidia-cuda-runtime 13.5.37).
#   Code `cuda:<name>`; mnemonic = the enumerator; description = the first sentence of the header's
#   doc comment (verbatim); texts = cudaGetErrorString() of that runtime (verbatim).
# Generated by tools/catalogs/gen_cuda.py. CUDA publishes no action bucket: vendor_action is null and
# action / origin / fault_class / severity / message are trainmedic's, chosen from the description:
# argument, usage, capture and build errors -> app_error / notify_owner; sticky kernel faults (illegal
# address, launch failure) -> device_error / restart_app; ECC, NVLink and contained hardware errors ->
# reset_device; driver and installation mismatches -> contact_support; out of memory -> accelerator_oom.
# The older cuda_* rows of nvidia_catalog.yaml stay as they are (rules emit them).
"""
    write(
        "nvidia_cuda_catalog.yaml",
        header,
        {
            "chip": "nvidia",
            "source": {
                "title": "CUDA Runtime API enum cudaError (driver_types.h) and cudaGetErrorString",
                "url": "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html",
                "version": f"CUDA runtime {ver // 1000}.{(ver % 1000) // 10}",
            },
            "action_map": {},
            "entries": rows,
        },
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
