"""Metric rules: baseline, fire once, no re-fire while it persists, counter reset, clear and reoccur."""

from __future__ import annotations

import math

import pytest
from servers.loops import no_stray_event_loop  # noqa: F401 - autouse: closes looptime's stray loops

from trainmedic.detectors.metric_rules import RULES, MetricRules, flat_utilization
from trainmedic.events import MetricSample
from trainmedic.models import Action, Chip, FaultClass, Finding, Severity, Source

F, T = False, True


def sample(name: str, value: float, device: str | None = "0", vendor: str | None = None) -> MetricSample:
    return MetricSample(name=name, value=value, device=device, vendor_name=vendor)


def run(
    rules: MetricRules,
    name: str,
    values: list[float],
    *,
    chip: str = "nvidia",
    device: str = "0",
    job: str | None = None,
) -> list[bool]:
    fired = []
    for i, v in enumerate(values):
        found = rules.observe(node="n1", chip=chip, job_key=job, samples=[sample(name, v, device)], t=100.0 + i)
        assert len(found) <= 1
        fired.append(bool(found))
    return fired


@pytest.mark.parametrize(
    ("name", "values", "expected"),
    [
        # Xid: the value of the last Xid (a gauge).
        ("xid_errors", [79], [F]),
        ("xid_errors", [0, 79], [F, T]),
        ("xid_errors", [0, 79, 79, 79], [F, T, F, F]),
        ("xid_errors", [0, 79, 0, 79], [F, T, F, T]),
        ("xid_errors", [0, 79, 13], [F, T, T]),
        ("xid_errors", [79, 79, 13], [F, F, T]),
        ("xid_errors", [0, -1, 0], [F, F, F]),
        ("xid_errors", [0, math.nan, 48], [F, F, T]),
        # Uncorrectable ECC: a counter.
        ("ecc_dbe", [7], [F]),
        ("ecc_dbe", [0, 1], [F, T]),
        ("ecc_dbe", [0, 1, 2, 3], [F, T, F, F]),
        ("ecc_dbe", [0, 1, 1, 2], [F, T, F, T]),
        ("ecc_dbe", [5, 0, 0], [F, F, F]),
        ("ecc_dbe", [5, 0, 1], [F, F, T]),
        ("ecc_dbe", [0, math.inf, 1], [F, F, T]),
        # Health: 1 healthy, 0 not, -1 unknown.
        ("health", [0], [F]),
        ("health", [1, 0], [F, T]),
        ("health", [1, 0, 0, 0], [F, T, F, F]),
        ("health", [1, 0, 1, 0], [F, T, F, T]),
        ("health", [0, 0, 1, 0], [F, F, F, T]),
        ("health", [1, -1, 1, -1], [F, F, F, F]),
        ("health", [1, -1, 0], [F, F, T]),
        # Link and network state.
        ("link_status", [1, 0], [F, T]),
        ("link_status", [0, 0], [F, F]),
        ("link_status", [1, 0, 1, 0], [F, T, F, T]),
        ("network_status", [1, 0, 0], [F, T, F]),
        # Row remapping failure: a flag (NVIDIA) or a count (Cambricon).
        ("row_remap_failure", [0, 1], [F, T]),
        ("row_remap_failure", [0, 1, 2], [F, T, F]),
        ("row_remap_failure", [1], [F]),
        # Not a rule metric.
        ("accelerator_temperature", [40, 90], [F, F]),
    ],
    ids=lambda v: "-".join(map(str, v)) if isinstance(v, list) else str(v),
)
def test_rule_transitions(name: str, values: list[float], expected: list[bool]) -> None:
    assert run(MetricRules(), name, values) == expected


@pytest.mark.parametrize(
    ("name", "bad", "rule_id", "code", "fault_class"),
    [
        ("xid_errors", 79, "metric.xid", "xid:79", FaultClass.DEVICE_ERROR),
        ("ecc_dbe", 1, "metric.ecc_dbe", "ecc_dbe", FaultClass.DEVICE_ERROR),
        ("health", 0, "metric.health", "health", FaultClass.DEVICE_ERROR),
        ("link_status", 0, "metric.link_down", "link_down", FaultClass.COMM_ERROR),
        ("network_status", 0, "metric.network_down", "network_down", FaultClass.COMM_ERROR),
        ("row_remap_failure", 1, "metric.row_remap_failure", "row_remap_failure", FaultClass.DEVICE_ERROR),
    ],
)
def test_each_rule_makes_a_localised_metric_finding(
    name: str, bad: float, rule_id: str, code: str, fault_class: FaultClass
) -> None:
    rules = MetricRules()
    good = 1.0 if name in ("health", "link_status", "network_status") else 0.0
    base = [sample(name, good, "3", vendor=f"VENDOR_{name}")]
    assert rules.observe(node="gpu-7", chip="nvidia", job_key="job:ns/llama", samples=base, t=10.0) == []
    found = rules.observe(
        node="gpu-7", chip="nvidia", job_key="job:ns/llama", samples=[sample(name, bad, "3", f"VENDOR_{name}")], t=25.0
    )
    assert len(found) == 1
    f = found[0]
    assert (f.rule_id, f.code, f.fault_class, f.source) == (rule_id, code, fault_class, Source.METRIC)
    assert (f.node, f.device, f.job, f.timestamp, f.chip) == ("gpu-7", "3", "job:ns/llama", 25.0, Chip.NVIDIA)
    assert f.action is not None and f.message is not None
    assert f"VENDOR_{name}=" in f.text
    assert f.groups["metric"] == name
    assert f.message.en and f.message.zh and "{" not in f.message.en + f.message.zh


def test_every_rule_metric_is_in_the_vocabulary() -> None:
    from trainmedic.udal import METRIC_VOCABULARY

    assert {r.metric for r in RULES} <= METRIC_VOCABULARY
    assert len({r.rule_id for r in RULES}) == len(RULES)


def fire(
    chip: str, name: str, before: float, after: float, *, extra: list[MetricSample] | None = None
) -> list[Finding]:
    rules = MetricRules()
    rules.observe(node="n", chip=chip, job_key=None, samples=[sample(name, before)], t=1.0)
    return rules.observe(node="n", chip=chip, job_key=None, samples=[sample(name, after), *(extra or [])], t=2.0)


def test_nvidia_xid_takes_the_catalog_row() -> None:
    (f,) = fire("nvidia", "xid_errors", 0, 79)
    assert (f.code, f.vendor_action, f.action, f.severity) == (
        "xid:79",
        "RESTART_BM",
        Action.REBOOT_NODE,
        Severity.CRITICAL,
    )
    assert f.message is not None and "Xid 79" in f.message.en
    assert f.groups["catalog_code"] == "xid:79"


def test_unknown_xid_still_is_a_device_error() -> None:
    (f,) = fire("nvidia", "xid_errors", 0, 9999)
    assert (f.code, f.fault_class, f.vendor_action, f.action) == (
        "xid:9999",
        FaultClass.DEVICE_ERROR,
        None,
        Action.RESET_DEVICE,
    )
    assert "catalog_code" not in f.groups


def test_cambricon_xid_falls_back_to_the_cndev_row() -> None:
    (f,) = fire("cambricon", "xid_errors", 0, 5)
    assert (f.code, f.chip, f.action) == ("xid:5", Chip.CAMBRICON, Action.RESET_DEVICE)
    assert f.groups["catalog_code"] == "cndev:XID_ERROR"


def test_nvidia_dbe_carries_the_xid_48_bucket() -> None:
    (f,) = fire("nvidia", "ecc_dbe", 0, 2)
    assert (f.vendor_action, f.action, f.severity) == ("WORKFLOW_XID_48", Action.RESET_DEVICE, Severity.CRITICAL)
    assert (f.groups["previous"], f.groups["value"]) == ("0", "2")


def test_ascend_unhealthy_chip_names_its_fault_code() -> None:
    # npu_chip_info_error_code is the fault code in decimal: 0x4C4BA00C, MindCluster level SeparateNPU.
    (f,) = fire("ascend", "health", 1, 0, extra=[sample("error_code", 0x4C4BA00C)])
    assert f.groups["error_code"] == "0x4C4BA00C"
    assert (f.chip, f.vendor_action, f.action) == (Chip.ASCEND, "SeparateNPU", Action.ISOLATE_NODE)
    assert f.message is not None and "0x4C4BA00C" in f.message.en


def test_link_finding_names_the_link_and_the_device() -> None:
    rules = MetricRules()
    run(rules, "link_status", [1], chip="cambricon", device="2/link5")
    (f,) = rules.observe(
        node="n1", chip="cambricon", job_key=None, samples=[sample("link_status", 0, "2/link5")], t=500
    )
    assert (f.device, f.groups["link"], f.fault_class) == ("2", "5", FaultClass.COMM_ERROR)
    assert f.groups["catalog_code"] == "cndev:MLULINK_DOWN"


@pytest.mark.parametrize("job", ["job:ns/a", "job:ns/b"])
def test_each_job_has_its_own_state(job: str) -> None:
    """A node-level batch is copied to every job on the node: each copy must produce its job's finding."""
    rules = MetricRules()
    for j in ("job:ns/a", "job:ns/b"):
        rules.observe(node="n", chip="nvidia", job_key=j, samples=[sample("xid_errors", 0)], t=1)
    other = "job:ns/b" if job == "job:ns/a" else "job:ns/a"
    assert len(rules.observe(node="n", chip="nvidia", job_key=other, samples=[sample("xid_errors", 79)], t=2)) == 1
    assert len(rules.observe(node="n", chip="nvidia", job_key=job, samples=[sample("xid_errors", 79)], t=2)) == 1


@pytest.mark.parametrize(
    ("before_job", "after_job", "fires"),
    [
        # The Xid the job reported, still held by DCGM's gauge after the job moved off the node.
        pytest.param(0, 79, False, id="the-jobs-xid-held"),
        # A new Xid on the node once no job is there to see it.
        pytest.param(0, 48, True, id="a-new-xid-after"),
    ],
)
def test_what_a_job_reported_is_no_news_for_its_node_afterwards(
    before_job: float, after_job: float, fires: bool
) -> None:
    rules = MetricRules()
    # Before the job: the node's own copy (baseline).
    rules.observe(node="n", chip="nvidia", job_key=None, samples=[sample("xid_errors", before_job)], t=1)
    # The job's copies: 0, then the fault, reported to the job.
    rules.observe(node="n", chip="nvidia", job_key="job:ns/a", samples=[sample("xid_errors", 0)], t=2)
    (f,) = rules.observe(node="n", chip="nvidia", job_key="job:ns/a", samples=[sample("xid_errors", 79)], t=3)
    assert f.code == "xid:79"
    # The job is gone (recreated elsewhere): the node's own copy again.
    found = rules.observe(node="n", chip="nvidia", job_key=None, samples=[sample("xid_errors", after_job)], t=4)
    assert [x.code for x in found] == ([f"xid:{after_job:g}"] if fires else [])


def test_two_sources_of_one_gpu_do_not_flap() -> None:
    """DCGM still holds last week's Xid 13; NVML has seen none: alternating batches must not fire."""
    rules = MetricRules()
    fired = []
    for i in range(6):
        s = (
            sample("xid_errors", 13, vendor="DCGM_FI_DEV_XID_ERRORS")
            if i % 2 == 0
            else sample("xid_errors", 0, vendor="nvml")
        )
        fired += rules.observe(node="n", chip="nvidia", job_key=None, samples=[s], t=float(i))
    assert fired == []


def test_out_of_order_samples_are_ignored() -> None:
    rules = MetricRules()
    rules.observe(node="n", chip="nvidia", job_key=None, samples=[sample("health", 1)], t=10)
    assert rules.observe(node="n", chip="nvidia", job_key=None, samples=[sample("health", 0)], t=5) == []
    assert len(rules.observe(node="n", chip="nvidia", job_key=None, samples=[sample("health", 0)], t=11)) == 1


def test_stale_state_is_dropped_and_baselined_again() -> None:
    rules = MetricRules(stale_after_s=60)
    rules.observe(node="n", chip="nvidia", job_key=None, samples=[sample("xid_errors", 0)], t=0)
    rules.observe(node="other", chip="nvidia", job_key=None, samples=[sample("xid_errors", 0)], t=1000)
    # The first node's state is gone: its next sample is a baseline again, not a change.
    assert rules.observe(node="n", chip="nvidia", job_key=None, samples=[sample("xid_errors", 79)], t=1001) == []


@pytest.mark.parametrize("scope", [{"node": "n"}, {"job_key": "job:ns/a"}], ids=["node", "job"])
def test_forget(scope: dict[str, str]) -> None:
    rules = MetricRules()
    rules.observe(node="n", chip="nvidia", job_key="job:ns/a", samples=[sample("health", 1)], t=1)
    rules.forget(**scope)
    assert rules.observe(node="n", chip="nvidia", job_key="job:ns/a", samples=[sample("health", 0)], t=2) == []


def test_an_unknown_chip_falls_back_to_generic() -> None:
    (f,) = fire("tpu", "health", 1, 0)
    assert f.chip == Chip.GENERIC


# -- utilization history and flatness (for the hang detector) ----------------------------------------


@pytest.mark.parametrize(
    ("values", "level"),
    [
        ([0, 0, 0, 0], 0.0),
        ([100, 100, 99.5, 100], 99.875),
        ([40, 90, 35, 95], None),
        ([0, 0], None),  # too few samples
        ([0, math.nan, 0, -1, 0], 0.0),  # unreadable values are skipped
    ],
)
def test_flat_utilization(values: list[float], level: float | None) -> None:
    points = [(float(i), v) for i, v in enumerate(values)]
    assert flat_utilization(points) == level


def test_flat_devices_reads_the_remembered_utilization() -> None:
    rules = MetricRules(history_s=60)
    for i in range(10):
        t = 1000.0 + 15 * i
        batch = [sample("accelerator_utilization", 100.0, "0"), sample("accelerator_utilization", 30.0 + 7 * i, "1")]
        rules.observe(node="n", chip="nvidia", job_key=None, samples=batch, t=t)
        # The copy for a second job at the same instant is not a new point.
        rules.observe(node="n", chip="nvidia", job_key="job:x/y", samples=batch, t=t)
    now = 1000.0 + 15 * 9
    assert rules.flat_devices("n", since=now - 45) == {"0": 100.0}
    history = rules.utilization("n")
    assert len(history["0"]) == 5  # 60 s of history at 15 s
    assert rules.flat_devices("other", since=0) == {}
