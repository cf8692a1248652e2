"""The chip-neutral plugin: host OOM kills, signals, PyTorch store / rendezvous / Gloo timeouts, hangs.

Codes: `oom_killed`, `exit_137`, `sigkill`, `dataloader_killed`, `gloo_timeout`, `store_timeout`,
`rendezvous_timeout`, `no_progress`. `nccl_watchdog` lives in the nvidia plugin: NCCL is NVIDIA's
library, and the Ascend / Cambricon counterparts (HCCL EI0002, CNCL) have their own codes.
`get_plugin` falls back to this plugin for an unknown chip.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainmedic.models import Action
from trainmedic.udal.base import ChipPlugin


class GenericPlugin(ChipPlugin):
    name = "generic"
    resource_names = ()
    node_label_keys = ()
    visible_devices_env = ""
    metric_names: Mapping[str, str] = {}
    frameworks: Mapping[str, str] = {"pytorch": "torch (any backend)"}
    action_map: Mapping[str, Action] = {}
    catalog_file = "generic_catalog.yaml"

    def detect(self, labels: Mapping[str, str]) -> bool:
        """Never claims a node by itself: it is the fallback, not a chip."""
        return False
