"""The remediation policy: the shipped file, validation, rule matching, budgets, backoff,
escalation, the circuit breaker, opt-out, modes, and the framework-aware OOM hints.

Root causes come from real log lines run through the real engine and correlator, so the policy is
checked against the codes, vendor buckets and normalized actions the catalogs really produce.
Time is a parameter (`PolicyContext.now`): nothing sleeps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from paths import DATA

from trainmedic.detectors.diagnose import diagnose_text
from trainmedic.detectors.engine import Engine
from trainmedic.models import Diagnosis, Finding
from trainmedic.remediations.hints import (
    HintError,
    default_hints,
    fragmentation,
    oom_hints,
    parse_hints,
    recognise_frameworks,
)
from trainmedic.remediations.policy import (
    ALL_NODES_POOL,
    POLICY_FILE,
    ActionName,
    Mode,
    Plan,
    Policy,
    PolicyContext,
    PolicyError,
    format_duration,
    load_policy,
    opt_out,
    parse_duration,
    parse_policy,
    parse_quantity,
)
from trainmedic.remediations.policy_state import MemoryPolicyState, SqlitePolicyState

CORPUS = DATA / "real-logs.jsonl"
Q = ActionName.QUARANTINE_NODE
R = ActionName.RESTART_FROM_CHECKPOINT
M = ActionName.RAISE_MEMORY_LIMIT
N = ActionName.NOTIFY

# Real log lines (the rule files' own examples and the corpus), one per kind of failure.
XID79 = "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
XID13 = (
    "[Wed Jun 24 15:44:20 2026] NVRM: Xid (PCI:0000:70:00): 13, Graphics SM Warp Exception on "
    "(GPC 1, TPC 1, SM 1): MMU Fault"
)
XID62 = (
    "Mar 27 17:40:36 kernel: NVRM: Xid (PCI:0000:01:00): 62, 223b6a66 00002100 00000000 20662342 "
    "20662ba6 20664272 2065f7ca 2063f48c"
)
XID43 = "NVRM: Xid (PCI:0000:3b:00): 43, pid=2876, name=python, Ch 00000008"
ASCEND_SEPARATE = (
    "k8s_event: type=Warning reason=Occur object=Pod/ascend-device-plugin-daemonset-910-x7k2p message=device "
    "fault, nodeName:npu-node-3, assertion:Occur, cardID:5, deviceID:0, faultCodes:80E18402,80E18401, "
    "faultLevelName:SeparateNPU, alarmRaisedTime:2025-04-09 10:57:35"
)
ASCEND_RESTART_REQUEST = (
    "[ERROR] FAULT_MANAGER(-1,null):2024-04-20-17:02:52.772.875 [fault_manager] event_id: [0x80C98000]"
)
CAMBRICON_DBE = "MLU 3 health check failed: CNDEV_FR_DBE_VIOLATION"
HCCL_EI0006 = (
    "[rank1]: EI0006: [PID: 1292363] 2025-04-08-18:07:20.444.436 Getting socket times out. Reason: Remote "
    "Rank did not send the data in time. Please check the reason for the rank being stuck"
)
HCCL_EI0004 = "EI0004: 2024-08-05-18:15:21.270.506 The ranktable is invalid. Reason: The ranktable config is incorrect."
NCCL_SYSTEM = (
    "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system error, "
    "NCCL version 2.7.8"
)
NCCL_USAGE = (
    "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, invalid usage, "
    "NCCL version 2.14.3"
)
WATCHDOG = (
    "[rank4]:[E1206 18:44:12.755262105 ProcessGroupNCCL.cpp:607] [Rank 4] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=544997376, NumelOut=68124672, "
    "Timeout(ms)=600000) ran for 600099 milliseconds before timing out."
)
OOMKILLED = "pod_status: container=trainer state=terminated reason=OOMKilled exit_code=137 restarts=2"

# Lines around real OOMs that show the framework (copied from the public issue threads named).
DEEPSPEED_LINES = (
    # deepspeedai/DeepSpeed#7021
    "[2025-02-10 07:34:25,340] [INFO] [logging.py:128:log_dist] [Rank 0] DeepSpeed info: version=0.16.1, "
    "git-hash=unknown, git-branch=unknown",
    '[rank0]:   File "/home/lorenaromerom/TFM/env/lib/python3.10/site-packages/deepspeed/runtime/engine.py", '
    "line 271, in __init__",
)
MEGATRON_LINES = (
    # NVIDIA/Megatron-LM#818
    '  File "/workspace/Megatron-LM/pretrain_gpt.py", line 278, in <module>',
    '  File "/workspace/Megatron-LM/megatron/training/training.py", line 376, in pretrain',
)
HF_TRAINER_LINES = (
    # huggingface/transformers#28872 (Trainer with DeepSpeed)
    '  File "/home/user/miniconda3/envs/train-transformers/lib/python3.11/site-packages/transformers/trainer.py", '
    "line 1539, in train",
)


def corpus() -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {r["id"]: r for r in rows}


CORPUS_ROWS = corpus()


def diagnose(engine: Engine, text: str) -> Diagnosis:
    diagnosis = diagnose_text(text, engine)
    assert diagnosis.root_cause is not None, f"no root cause for {text[:80]!r}"
    return diagnosis


def ctx(
    now: float = 1_700_000_000.0,
    *,
    namespace: str = "train",
    job: str | None = "job:train/llama",
    node: str | None = "gpu-node-1",
    device: str | None = None,
    pool: str = ALL_NODES_POOL,
    pool_size: int | None = 20,
    opt_out: bool = False,
    texts: tuple[str, ...] = (),
) -> PolicyContext:
    return PolicyContext(
        namespace=namespace,
        job_key=job,
        node=node,
        device=device,
        pool=pool,
        pool_size=pool_size,
        remediate_opt_out=opt_out,
        now=now,
        texts=texts,
    )


@pytest.fixture(scope="module")
def shipped() -> Policy:
    return load_policy()


def policy_with(**sections: str) -> Policy:
    """A small enforce-mode policy with the given YAML sections (budgets, circuit_breaker, ...)."""
    parts = ["version: 1", "mode: enforce"]
    for name, body in sections.items():
        parts.append(f"{name}:\n{body}")
    if "rules" not in sections:
        parts.append(
            "rules:\n"
            "  - id: device\n"
            "    match: {fault_class: device_error}\n"
            "    actions: [quarantine_node, restart_from_checkpoint]\n"
            "  - id: comm-init\n"
            "    match: {fault_class: comm_init}\n"
            "    actions: [restart_from_checkpoint]\n"
            "  - id: rest\n"
            "    actions: [notify]"
        )
    return parse_policy("\n".join(parts) + "\n", "test-policy.yaml")


# --- the shipped policy -----------------------------------------------------------------------


def test_shipped_policy_loads_cleanly(shipped: Policy) -> None:
    assert shipped.warnings == ()
    assert shipped.mode is Mode.DRY_RUN
    assert shipped.source == str(POLICY_FILE)
    assert shipped.rules[-1].match.is_catch_all


@pytest.mark.parametrize(
    ("line", "fault_class", "rule", "actions"),
    [
        pytest.param(XID79, "device_error", "device-error-node", [Q, R], id="xid79-restart-bm"),
        pytest.param(XID62, "device_error", "device-error-node", [Q, R], id="xid62-reset-gpu"),
        pytest.param(XID13, "device_error", "device-error-restart-app", [R], id="xid13-restart-app"),
        pytest.param(XID43, "device_error", "ignore", [N], id="xid43-ignore"),
        pytest.param(ASCEND_SEPARATE, "device_error", "device-error-node", [Q, R], id="ascend-separate-npu"),
        pytest.param(
            ASCEND_RESTART_REQUEST, "device_error", "device-error-restart-app", [R], id="ascend-restart-request"
        ),
        pytest.param(CAMBRICON_DBE, "device_error", "device-error-node", [Q, R], id="cambricon-dbe"),
        pytest.param(HCCL_EI0006, "comm_init", "comm-init", [R], id="hccl-init-timeout"),
        pytest.param(HCCL_EI0004, "comm_init", "comm-config-error", [N], id="hccl-bad-ranktable"),
        pytest.param(NCCL_SYSTEM, "comm_error", "comm-error", [R], id="nccl-system-error"),
        pytest.param(NCCL_USAGE, "comm_error", "comm-config-error", [N], id="nccl-invalid-usage"),
        pytest.param(WATCHDOG, "hang", "hang", [ActionName.DUMP_STACKS, R], id="nccl-watchdog"),
        pytest.param(CORPUS_ROWS["gpu_oom-5"]["text"], "accelerator_oom", "accelerator-oom", [N], id="cuda-oom"),
        pytest.param(OOMKILLED, "host_oom", "host-oom", [N], id="oomkilled"),
    ],
)
def test_shipped_policy_actions_per_fault(
    shipped: Policy, re_engine: Engine, line: str, fault_class: str, rule: str, actions: list[ActionName]
) -> None:
    diagnosis = diagnose(re_engine, line)
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.fault_class.value == fault_class
    plan = shipped.decide("inc-1", diagnosis.root_cause, diagnosis.findings, ctx(), MemoryPolicyState())
    assert plan.matched == rule
    assert plan.names() == actions
    assert plan.mode is Mode.DRY_RUN
    assert not plan.page and plan.blocked is None
    json.dumps(plan.as_dict())  # JSON-able
    assert Plan.from_dict(plan.as_dict()) == plan


def test_shipped_host_oom_raise_memory_is_opt_in(shipped: Policy, re_engine: Engine) -> None:
    diagnosis = diagnose(re_engine, OOMKILLED)
    assert diagnosis.root_cause is not None
    plan = shipped.decide("inc-1", diagnosis.root_cause, diagnosis.findings, ctx(), MemoryPolicyState())
    assert [s.name for s in plan.skipped] == [M]
    assert "enabled: false" in plan.skipped[0].reason.en


def test_enabled_raise_memory_carries_its_limits(re_engine: Engine) -> None:
    policy = policy_with(
        rules="  - id: host-oom\n"
        "    match: {fault_class: host_oom}\n"
        "    actions:\n"
        "      - notify\n"
        "      - {action: raise_memory_limit, enabled: true, factor: 2, max: 1.5Ti}\n"
    )
    diagnosis = diagnose(re_engine, OOMKILLED)
    assert diagnosis.root_cause is not None
    plan = policy.decide("inc-1", diagnosis.root_cause, diagnosis.findings, ctx(), MemoryPolicyState())
    raise_memory = plan.action(M)
    assert raise_memory is not None
    assert raise_memory.params["factor"] == 2
    assert raise_memory.params["max_bytes"] == int(1.5 * 1024**4)


def test_device_plan_excludes_the_bad_node_from_the_restart(shipped: Policy, re_engine: Engine) -> None:
    diagnosis = diagnose(re_engine, XID79)
    assert diagnosis.root_cause is not None
    plan = shipped.decide("inc-1", diagnosis.root_cause, diagnosis.findings, ctx(node="n7"), MemoryPolicyState())
    quarantine, restart = plan.actions
    assert quarantine.params["node"] == "n7"
    assert restart.params["exclude_nodes"] == ["n7"]
    assert "n7" in quarantine.reason.en and "n7" in quarantine.reason.zh


def test_no_matching_rule_notifies_only(re_engine: Engine) -> None:
    policy = policy_with(
        rules="  - id: only-hangs\n    match: {fault_class: hang}\n    actions: [restart_from_checkpoint]\n"
    )
    diagnosis = diagnose(re_engine, XID79)
    assert diagnosis.root_cause is not None
    plan = policy.decide("inc-1", diagnosis.root_cause, diagnosis.findings, ctx(), MemoryPolicyState())
    assert plan.matched == ""
    assert plan.names() == [N]


@pytest.mark.parametrize(
    ("match", "line", "matches"),
    [
        ("{code: ['xid:7*']}", XID79, True),
        ("{code: ['xid:[0-6]*']}", XID79, False),
        ("{vendor_action: RESTART_BM}", XID79, True),
        ("{vendor_action: ['RESET_*']}", XID79, False),
        ("{vendor_action: SeparateNPU}", ASCEND_SEPARATE, True),
        ("{chip: ascend}", XID79, False),
        ("{chip: [nvidia, ascend]}", XID79, True),
        ("{action: reboot_node}", XID79, True),
        ("{action: [restart_app]}", XID79, False),
        ("{severity_at_least: critical}", XID79, True),
        ("{severity_at_least: critical}", HCCL_EI0006, False),
        ("{severity_at_least: warning}", HCCL_EI0006, True),
        ("{fault_class: device_error, chip: nvidia, code: 'xid:79'}", XID79, True),
        ("{vendor_action: RESTART_BM}", HCCL_EI0006, False),  # no vendor bucket at all
    ],
)
def test_match_fields(re_engine: Engine, match: str, line: str, matches: bool) -> None:
    policy = policy_with(
        rules=f"  - id: target\n    match: {match}\n    actions: [notify]\n  - id: other\n    actions: [notify]\n"
    )
    diagnosis = diagnose(re_engine, line)
    assert diagnosis.root_cause is not None
    assert (policy.match(diagnosis.root_cause).id == "target") is matches  # type: ignore[union-attr]


# --- validation -------------------------------------------------------------------------------

GOOD_RULES = "rules:\n  - id: all\n    actions: [notify]\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("mode: dry-run\nrules: [\n  - id: x\n", [(3, "YAML syntax")], id="syntax-error"),
        pytest.param(
            "mode: dry-run\ncolour: red\n" + GOOD_RULES,
            [(2, "colour: unknown key")],
            id="unknown-top-level-key",
        ),
        pytest.param(
            "rules:\n  - id: a\n    match: {fault_class: hang, colour: red}\n    actions: [notify]\n",
            [(3, "rules.0.match.colour: unknown key")],
            id="unknown-match-key",
        ),
        pytest.param(
            "budgets:\n  restarts:\n    max: 3\n    window: 1y\n" + GOOD_RULES,
            [(4, "bad duration '1y'")],
            id="bad-duration",
        ),
        pytest.param(
            "budgets:\n  restarts:\n    max: 3\n    window: 3600\n" + GOOD_RULES,
            [(4, "a duration is a number with a unit")],
            id="duration-without-unit",
        ),
        pytest.param(
            "circuit_breaker:\n  window: 60d\n" + GOOD_RULES,
            [(2, "longer than the 30 days")],
            id="window-over-retention",
        ),
        pytest.param(
            "rules:\n  - id: a\n    match:\n      code: ['xid:[79']\n    actions: [notify]\n",
            [(4, "'[' at position 4 is never closed")],
            id="bad-glob-unclosed",
        ),
        pytest.param(
            "namespaces:\n  - match: Team_A*\n    mode: observe\n" + GOOD_RULES,
            [(2, "'T' cannot appear in a namespace")],
            id="bad-namespace-glob",
        ),
        pytest.param(
            "circuit_breaker:\n  max_share: 0\n" + GOOD_RULES,
            [(2, "max_share: Input should be greater than 0")],
            id="share-zero",
        ),
        pytest.param(
            "circuit_breaker:\n  max_share: 1.5\n  min_nodes: 0\n" + GOOD_RULES,
            [(2, "max_share: Input should be less than or equal to 1"), (3, "min_nodes")],
            id="share-over-one-and-min-nodes-zero",
        ),
        pytest.param(
            "rules:\n  - id: a\n    actions: [notify]\n  - id: b\n    actions: [notify]\n"
            "  - id: a\n    actions: [notify]\n",
            [(6, "duplicate id 'a', first defined at line 2")],
            id="duplicate-rule-ids",
        ),
        pytest.param(
            "escalation:\n  - id: a\n    times: 2\n    window: 1h\nrules:\n  - id: a\n    actions: [notify]\n",
            [(6, "duplicate id 'a'")],
            id="escalation-and-rule-share-an-id",
        ),
        pytest.param(
            "rules:\n  - id: a\n    actions: [notify, reboot_node]\n",
            [(3, "Input tag 'reboot_node'")],
            id="unknown-action",
        ),
        pytest.param(
            "rules:\n  - id: a\n    actions:\n      - action: raise_memory_limit\n        factor: 0.9\n"
            "        max: 12Q\n        colour: red\n",
            [(5, "factor: Input should be greater than 1"), (6, "bad memory size '12Q'"), (7, "colour: unknown key")],
            id="bad-action-params",
        ),
        pytest.param(
            "rules:\n  - id: a\n    actions: [notify, notify]\n",
            [(2, "listed more than once: notify")],
            id="action-twice",
        ),
        pytest.param(
            "rules:\n  - id: Bad Id\n    actions: [notify]\n",
            [(2, "rules.0.id")],
            id="bad-rule-id",
        ),
        pytest.param(
            "rules:\n  - id: a\n    match: {fault_class: melted}\n    actions: [notify]\n",
            [(3, "fault_class.0")],
            id="unknown-fault-class",
        ),
        pytest.param(
            "budgets:\n  backoff:\n    base: 10m\n    max: 1m\n" + GOOD_RULES,
            [(3, "backoff max (1m) is below base (10m)")],
            id="backoff-max-below-base",
        ),
        pytest.param("mode: sometimes\n" + GOOD_RULES, [(1, "mode: Input should be")], id="unknown-mode"),
        pytest.param("mode: dry-run\n", [(1, "rules: Field required")], id="no-rules"),
        pytest.param(
            "namespaces:\n  - match: team-a\n  - match: team-a\n    mode: observe\n" + GOOD_RULES,
            [(3, "listed twice")],
            id="namespace-twice",
        ),
        pytest.param("- just\n- a list\n", [(1, "a policy file is a mapping")], id="not-a-mapping"),
    ],
)
def test_broken_policy_lists_every_problem_with_its_line(text: str, expected: list[tuple[int, str]]) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "broken.yaml")
    problems = info.value.problems
    errors = [p for p in problems if not p.warning]
    assert len(errors) == len(expected), [str(p) for p in problems]
    for line, fragment in expected:
        assert any(p.line == line and fragment in str(p) for p in errors), (line, fragment, [str(p) for p in errors])
    for p in errors:
        assert str(p).startswith(f"broken.yaml:{p.line}: error")
    assert "broken.yaml:" in str(info.value)


def test_one_file_with_many_problems_reports_them_all() -> None:
    text = (
        "mode: dry-run\n"
        "circuit_breaker:\n"
        "  max_share: 0\n"
        "  window: 2w\n"
        "rules:\n"
        "  - id: a\n"
        "    match: {code: ['EI[00']}\n"
        "    actions: [notify, reboot]\n"
        "  - id: a\n"
        "    actions: [notify]\n"
    )
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "many.yaml")
    lines = sorted(p.line or 0 for p in info.value.problems)
    assert lines == [3, 4, 7, 8, 9]


def test_unreachable_rules_after_a_catch_all_are_warnings() -> None:
    policy = parse_policy(
        "rules:\n  - id: all\n    actions: [notify]\n  - id: late\n    match: {fault_class: hang}\n"
        "    actions: [restart_from_checkpoint]\n",
        "w.yaml",
    )
    assert [(p.line, p.rule_id, p.warning) for p in policy.warnings] == [(4, "late", True)]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        pytest.param(None, "cannot read", id="missing"),
        pytest.param(b"\xff\xfe mode: x", "not UTF-8", id="not-utf8"),
        pytest.param(b"mode: enforce\nrules: nope\n", "broken-file.yaml:2", id="bad-content"),
    ],
)
def test_load_policy_refuses_a_broken_file(tmp_path: Path, content: bytes | None, fragment: str) -> None:
    path = tmp_path / "broken-file.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert fragment in str(info.value)


def test_load_policy_refuses_a_broken_hints_file(tmp_path: Path) -> None:
    hints = tmp_path / "hints.yaml"
    hints.write_text("frameworks:\n  - id: x\n    name: X\n    patterns: ['(']\n", encoding="utf-8")
    with pytest.raises(PolicyError) as info:
        load_policy(None, hints_path=hints)
    assert f"{hints}:4" in str(info.value)


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("10m", 600), ("1h", 3600), ("2d", 172800), ("1.5h", 5400)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1", "1y", "h", "-1h", "1 h x", "1h30"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (59, "59s"), (90, "1m30s"), (3600, "1h"), (90061, "1d1h1m1s")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512Gi", 512 * 1024**3),
        ("1.5G", 1_500_000_000),
        ("64Mi", 64 * 1024**2),
        ("129e6", 129_000_000),
        ("1024", 1024),
        ("1k", 1000),
        ("0.5Ki", 512),
    ],
)
def test_parse_quantity(text: str, size: int) -> None:
    assert parse_quantity(text) == size


@pytest.mark.parametrize("text", ["", "12Q", "Gi", "-1Gi", "0", "1m", "1.2.3Gi", "99999999999Ei"])
def test_parse_quantity_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="memory size"):
        parse_quantity(text)


# --- modes and namespaces ---------------------------------------------------------------------

NAMESPACES = """\
  - match: research-*
    mode: approve
  - match: research-prod
    mode: enforce
  - match: "*-sandbox"
    mode: observe
  - match: team-?
    disabled_actions: [quarantine_node]
    budgets:
      restarts: {max: 1, window: 1h}
"""


@pytest.mark.parametrize(
    ("namespace", "mode"),
    [
        ("research-prod", Mode.ENFORCE),  # an exact name wins over an earlier glob
        ("research-dev", Mode.APPROVE),
        ("research-sandbox", Mode.APPROVE),  # the first glob that matches
        ("ml-sandbox", Mode.OBSERVE),
        ("team-a", Mode.DRY_RUN),  # an override without a mode keeps the file's mode
        ("train", Mode.DRY_RUN),
        ("", Mode.DRY_RUN),
    ],
)
def test_mode_for_namespace(namespace: str, mode: Mode) -> None:
    policy = parse_policy(f"mode: dry-run\nnamespaces:\n{NAMESPACES}{GOOD_RULES}", "ns.yaml")
    assert policy.mode_for(namespace) is mode


@pytest.mark.parametrize(("namespace", "mode"), [("kube-system", Mode.OBSERVE), ("train", Mode.DRY_RUN)])
def test_shipped_modes(shipped: Policy, namespace: str, mode: Mode) -> None:
    assert shipped.mode_for(namespace) is mode


def test_observe_mode_plans_notify_only(shipped: Policy, re_engine: Engine) -> None:
    diagnosis = diagnose(re_engine, XID79)
    assert diagnosis.root_cause is not None
    plan = shipped.decide(
        "inc-1", diagnosis.root_cause, diagnosis.findings, ctx(namespace="kube-system"), MemoryPolicyState()
    )
    assert plan.mode is Mode.OBSERVE
    assert plan.names() == [N]
    assert [s.name for s in plan.skipped] == [Q, R]
    assert not plan.acts


def test_namespace_disables_actions_and_overrides_budgets(re_engine: Engine) -> None:
    policy = parse_policy(
        f"mode: enforce\nnamespaces:\n{NAMESPACES}rules:\n  - id: device\n    match: {{fault_class: device_error}}\n"
        "    actions: [quarantine_node, restart_from_checkpoint]\n",
        "ns.yaml",
    )
    diagnosis = diagnose(re_engine, XID79)
    assert diagnosis.root_cause is not None
    state = MemoryPolicyState()
    c = ctx(namespace="team-b", job="job:team-b/x")
    plan = policy.decide("inc-1", diagnosis.root_cause, diagnosis.findings, c, state)
    assert plan.names() == [R]
    assert plan.skipped[0].name is Q and "team-b" in plan.skipped[0].reason.en
    assert plan.acts
    policy.commit(plan, c, state)
    # The namespace allows one restart per hour: the next one pages.
    later = ctx(now=c.now + 1800, namespace="team-b", job="job:team-b/x")
    second = policy.decide("inc-2", diagnosis.root_cause, diagnosis.findings, later, state)
    assert R not in second.names()
    assert second.page and second.blocked is not None and "budget" in second.blocked.en


# --- opt-out ----------------------------------------------------------------------------------


def test_opt_out_notifies_only(shipped: Policy, re_engine: Engine) -> None:
    diagnosis = diagnose(re_engine, XID79)
    assert diagnosis.root_cause is not None
    plan = shipped.decide("inc-1", diagnosis.root_cause, diagnosis.findings, ctx(opt_out=True), MemoryPolicyState())
    assert plan.names() == [N]
    assert plan.blocked is not None
    assert 'trainmedic.io/remediate: "false"' in plan.blocked.en
    assert "trainmedic.io/remediate" in plan.blocked.zh
    assert {s.name for s in plan.skipped} == {Q, R}
    assert not plan.page


@pytest.mark.parametrize("keyword", ["opt_out", "remediate_opt_out"])
def test_opt_out_context_takes_either_name(keyword: str) -> None:
    c = PolicyContext(namespace="train", job_key="job:train/a", **{keyword: True})  # type: ignore[arg-type]
    assert c.opt_out and c.remediate_opt_out


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"trainmedic.io/remediate": "false"}, True),
        ({"trainmedic.io/remediate": "False"}, True),
        ({"trainmedic.io/remediate": "true"}, False),
        ({}, False),
        (None, False),
        ({"trainmedic.io/remediate": 0}, False),
    ],
)
def test_opt_out_annotation(annotations: dict[str, Any] | None, expected: bool) -> None:
    assert opt_out(annotations) is expected


# --- budgets and backoff ----------------------------------------------------------------------

FAST_BACKOFF = "  restarts: {max: 3, window: 1h}\n  backoff: {base: 1s, factor: 1, max: 1s}\n"


def restart_plan(policy: Policy, engine: Engine, state: MemoryPolicyState, now: float, incident: str) -> Plan:
    diagnosis = diagnose(engine, WATCHDOG)
    assert diagnosis.root_cause is not None
    return policy.decide(incident, diagnosis.root_cause, diagnosis.findings, ctx(now), state)


@pytest.mark.parametrize(
    ("previous", "blocked"),
    [([], False), ([0], False), ([0, 100], False), ([0, 100, 200], True), ([-4000, 100, 200], False)],
)
def test_restart_budget(re_engine: Engine, previous: list[float], blocked: bool) -> None:
    policy = policy_with(budgets=FAST_BACKOFF, rules="  - id: hang\n    actions: [restart_from_checkpoint]\n")
    state = MemoryPolicyState()
    for t in previous:
        state.record("restart", "job:train/llama", t)
    plan = restart_plan(policy, re_engine, state, 300.0, "inc-x")
    assert (R not in plan.names()) is blocked
    assert plan.page is blocked
    if blocked:
        assert plan.blocked is not None
        assert "Restart budget spent: 3 restarts of job:train/llama in the last 1h" in plan.blocked.en
        assert "重启预算已用完" in plan.blocked.zh
        assert plan.names() == [N]
        notify = plan.action(N)
        assert notify is not None and notify.params["page"] is True


def test_budget_counts_only_committed_restarts(re_engine: Engine) -> None:
    policy = policy_with(budgets=FAST_BACKOFF, rules="  - id: hang\n    actions: [restart_from_checkpoint]\n")
    state = MemoryPolicyState()
    for i in range(3):
        plan = restart_plan(policy, re_engine, state, 10.0 * i, f"inc-{i}")
        assert R in plan.names()
        policy.commit(plan, ctx(10.0 * i), state)
    # A commit replayed for the same incident is not counted twice.
    policy.commit(plan, ctx(25.0), state)
    assert state.count("restart", "job:train/llama", 0) == 3
    assert R not in restart_plan(policy, re_engine, state, 40.0, "inc-3").names()
    # Decisions alone (no commit) never spend the budget.
    assert R in restart_plan(policy, re_engine, state, 3700.0, "inc-4").names()
    assert R in restart_plan(policy, re_engine, state, 3701.0, "inc-5").names()


@pytest.mark.parametrize(
    ("restarts", "now", "not_before"),
    [
        pytest.param([1000], 1030, 1060, id="second-within-base"),
        pytest.param([1000], 1060, None, id="second-after-base"),
        pytest.param([1000, 1060], 1100, 1180, id="third-waits-twice-base"),
        pytest.param([1000, 1060], 1180, None, id="third-after-backoff"),
        pytest.param([], 1000, None, id="first-never-waits"),
    ],
)
def test_backoff_between_restarts(
    shipped: Policy, re_engine: Engine, restarts: list[float], now: float, not_before: float | None
) -> None:
    state = MemoryPolicyState()
    for t in restarts:
        state.record("restart", "job:train/llama", t)
    plan = restart_plan(shipped, re_engine, state, now, "inc-b")
    assert plan.not_before == not_before
    assert (R in plan.names()) is (not_before is None)
    assert not plan.page  # waiting is not a reason to wake anyone
    if not_before is not None:
        assert plan.blocked is not None
        iso = "1970-01-01T00:" + f"{int(not_before) // 60:02d}:{int(not_before) % 60:02d}Z"
        assert f"may run at {iso} (in {format_duration(not_before - now)})" in plan.blocked.en
        assert iso in plan.blocked.zh


# --- escalation -------------------------------------------------------------------------------


def hccl_incident(
    policy: Policy, engine: Engine, state: MemoryPolicyState, now: float, incident: str, node: str = "npu-node-3"
) -> Plan:
    diagnosis = diagnose(engine, HCCL_EI0006)
    assert diagnosis.root_cause is not None
    c = ctx(now, node=node)
    policy.observe_fault(diagnosis.root_cause, c, state, incident_id=incident)
    return policy.decide(incident, diagnosis.root_cause, diagnosis.findings, c, state)


@pytest.mark.parametrize(
    ("times", "escalated"),
    [
        pytest.param([0, 1200, 2400], [False, False, True], id="three-within-1h"),
        pytest.param([0, 2000, 4000], [False, False, False], id="three-over-more-than-1h"),
        pytest.param([0, 3599, 3600], [False, False, True], id="window-edge-inclusive"),
        pytest.param([0, 1200, 2400, 3000], [False, False, True, True], id="stays-escalated"),
    ],
)
def test_comm_init_escalates_on_the_same_node(
    shipped: Policy, re_engine: Engine, times: list[float], escalated: list[bool]
) -> None:
    state = MemoryPolicyState()
    got = [hccl_incident(shipped, re_engine, state, t, f"inc-{i}") for i, t in enumerate(times)]
    assert [p.escalated for p in got] == escalated
    for now, plan in zip(times, got, strict=True):
        if plan.escalated:
            assert plan.names() == [Q, R]
            assert plan.escalation == "comm-init-repeats-on-node"
            quarantine = plan.action(Q)
            assert quarantine is not None
            seen = len([t for t in times if now - 3600 <= t <= now])
            assert f"seen {seen} times on node npu-node-3 within 1h" in quarantine.reason.en
            assert f"{seen} 次" in quarantine.reason.zh
            restart = plan.action(R)
            assert restart is not None and restart.params["exclude_nodes"] == ["npu-node-3"]
        else:
            assert plan.names() == [R]


def test_escalation_counts_per_node(shipped: Policy, re_engine: Engine) -> None:
    state = MemoryPolicyState()
    plans = [
        hccl_incident(shipped, re_engine, state, t, f"inc-{i}", node)
        for i, (t, node) in enumerate([(0, "a"), (100, "b"), (200, "a"), (300, "b")])
    ]
    assert not any(p.escalated for p in plans)


def test_escalation_counts_observed_faults_once_per_incident(shipped: Policy, re_engine: Engine) -> None:
    diagnosis = diagnose(re_engine, HCCL_EI0006)
    rc = diagnosis.root_cause
    assert rc is not None
    state = MemoryPolicyState()
    for i, t in enumerate([0.0, 100.0]):
        assert shipped.observe_fault(rc, ctx(t, node="n"), state, incident_id=f"inc-{i}")
        # A replayed diagnosis of the same incident is not counted again.
        assert not shipped.observe_fault(rc, ctx(t + 5, node="n"), state, incident_id=f"inc-{i}")
    # Deciding never records: the third incident counts once it is observed.
    assert not shipped.decide("inc-2", rc, diagnosis.findings, ctx(200.0, node="n"), state).escalated
    assert not shipped.decide("inc-2", rc, diagnosis.findings, ctx(201.0, node="n"), state).escalated
    assert shipped.observe_fault(rc, ctx(202.0, node="n"), state)  # without an id: always recorded
    assert shipped.decide("inc-2", rc, diagnosis.findings, ctx(203.0, node="n"), state).escalated


def test_escalation_without_a_node_does_not_count(shipped: Policy, re_engine: Engine) -> None:
    state = MemoryPolicyState()
    plans = [hccl_incident(shipped, re_engine, state, t, f"inc-{t}", node="") for t in (0, 10, 20)]
    assert not any(p.escalated for p in plans)


def test_device_scoped_escalation(shipped: Policy, re_engine: Engine) -> None:
    """MindCluster's default: 0x80C98000 twice on one NPU within a day -> isolate."""
    diagnosis = diagnose(re_engine, ASCEND_RESTART_REQUEST)
    rc = diagnosis.root_cause
    assert rc is not None
    state = MemoryPolicyState()
    got = []
    for i, (t, device) in enumerate([(0, "3"), (1000, "4"), (2000, "3")]):
        c = ctx(t, node="npu-node-1", device=device)
        shipped.observe_fault(rc, c, state, incident_id=f"inc-{i}")
        got.append(shipped.decide(f"inc-{i}", rc, diagnosis.findings, c, state))
    assert [p.escalated for p in got] == [False, False, True]
    assert got[2].escalation == "ascend-chip-fault-frequency"
    assert got[2].names() == [Q, R]


# --- circuit breaker --------------------------------------------------------------------------


def breaker_policy(share: float, min_nodes: int, window: str = "24h") -> Policy:
    return policy_with(
        circuit_breaker=f"  max_share: {share}\n  window: {window}\n  min_nodes: {min_nodes}\n",
        budgets=FAST_BACKOFF,
    )


def quarantine_incident(
    policy: Policy,
    engine: Engine,
    state: MemoryPolicyState,
    now: float,
    node: str,
    pool_size: int | None,
    incident: str,
) -> Plan:
    diagnosis = diagnose(engine, XID79)
    assert diagnosis.root_cause is not None
    c = ctx(now, node=node, pool="node.kubernetes.io/instance-type=h100", pool_size=pool_size, job=f"job:train/{node}")
    plan = policy.decide(incident, diagnosis.root_cause, diagnosis.findings, c, state)
    policy.commit(plan, c, state)
    return plan


@pytest.mark.parametrize(
    ("pool_size", "share", "min_nodes", "allowed"),
    [
        pytest.param(20, 0.1, 1, 2, id="20-nodes-10pct"),
        pytest.param(25, 0.1, 1, 2, id="25-nodes-10pct-rounds-down"),
        pytest.param(30, 0.1, 1, 3, id="30-nodes-10pct"),
        pytest.param(5, 0.1, 1, 1, id="small-pool-min-one"),
        pytest.param(5, 0.1, 2, 2, id="min-nodes-floor"),
        pytest.param(None, 0.1, 1, 1, id="unknown-pool-size"),
        pytest.param(4, 1.0, 1, 4, id="share-one"),
    ],
)
def test_circuit_breaker_trips_exactly_at_the_share(
    re_engine: Engine, pool_size: int | None, share: float, min_nodes: int, allowed: int
) -> None:
    policy = breaker_policy(share, min_nodes)
    state = MemoryPolicyState()
    plans = [
        quarantine_incident(policy, re_engine, state, 100.0 * i, f"node-{i}", pool_size, f"inc-{i}")
        for i in range(allowed + 1)
    ]
    for plan in plans[:allowed]:
        assert plan.names() == [Q, R] and not plan.page and not plan.breaker_open
    tripped = plans[allowed]
    # A tripped breaker stops every change, the restart too: only the notification (a page) is left.
    assert tripped.names() == ["notify"]
    assert {s.name.value for s in tripped.skipped} == {Q, R}
    assert tripped.page and tripped.breaker_open
    assert tripped.blocked is not None and "Circuit breaker open" in tripped.blocked.en
    assert f"{allowed} of {pool_size if pool_size is not None else '?'} nodes" in tripped.blocked.en
    assert "熔断" in tripped.blocked.zh


def test_circuit_breaker_stays_open_for_the_window(re_engine: Engine) -> None:
    policy = breaker_policy(0.1, 1, window="1h")
    state = MemoryPolicyState()
    assert Q in quarantine_incident(policy, re_engine, state, 0.0, "a", 10, "inc-a").names()
    tripped = quarantine_incident(policy, re_engine, state, 600.0, "b", 10, "inc-b")
    assert tripped.breaker_open
    # The first quarantine left the window at 3600 s, but the breaker opened at 600 s: still open.
    assert quarantine_incident(policy, re_engine, state, 3700.0, "c", 10, "inc-c").breaker_open
    # The open breaker is recorded again by each tripped commit; once an hour passes with none, it closes.
    reopened = quarantine_incident(policy, re_engine, state, 3700.0 + 3601.0, "d", 10, "inc-d")
    assert not reopened.breaker_open and Q in reopened.names()


def test_quarantining_an_already_quarantined_node_is_not_counted(re_engine: Engine) -> None:
    policy = breaker_policy(0.1, 1)
    state = MemoryPolicyState()
    first = quarantine_incident(policy, re_engine, state, 0.0, "a", 10, "inc-1")
    again = quarantine_incident(policy, re_engine, state, 100.0, "a", 10, "inc-2")
    assert Q in first.names() and Q in again.names()
    assert not again.breaker_open
    assert state.count("quarantine", "pool:node.kubernetes.io/instance-type=h100", 0) == 1


def test_pools_are_counted_separately(re_engine: Engine) -> None:
    policy = breaker_policy(0.1, 1)
    state = MemoryPolicyState()
    diagnosis = diagnose(re_engine, XID79)
    assert diagnosis.root_cause is not None
    for i, pool in enumerate(["type=a", "type=b"]):
        c = ctx(float(i), node=f"n{i}", pool=pool, pool_size=5, job=f"job:train/j{i}")
        plan = policy.decide(f"inc-{i}", diagnosis.root_cause, diagnosis.findings, c, state)
        assert Q in plan.names()
        policy.commit(plan, c, state)


def test_quarantine_without_a_node_pages(shipped: Policy, re_engine: Engine) -> None:
    diagnosis = diagnose(re_engine, XID79)
    assert diagnosis.root_cause is not None
    plan = shipped.decide("inc-1", diagnosis.root_cause, diagnosis.findings, ctx(node=None), MemoryPolicyState())
    assert plan.names() == [R, N]
    assert plan.page and plan.blocked is not None and "no node was localised" in plan.blocked.en


NODES = [{"metadata": {"name": f"h{i}", "labels": {"node.kubernetes.io/instance-type": "h100"}}} for i in range(3)] + [
    {"metadata": {"name": "a0", "labels": {"node.kubernetes.io/instance-type": "a100"}}},
    {"metadata": {"name": "bare"}},
    {"metadata": {"labels": {}}},  # malformed: no name, ignored
    "not-a-node",
]


@pytest.mark.parametrize(
    ("node", "pool", "size"),
    [
        ("h1", "node.kubernetes.io/instance-type=h100", 3),
        ("a0", "node.kubernetes.io/instance-type=a100", 1),
        ("bare", ALL_NODES_POOL, 5),
        ("unknown", ALL_NODES_POOL, 5),
        (None, ALL_NODES_POOL, 5),
    ],
)
def test_pool_of(shipped: Policy, node: str | None, pool: str, size: int) -> None:
    assert shipped.pool_of(node, NODES) == (pool, size)  # type: ignore[arg-type]


# --- commit -----------------------------------------------------------------------------------


def test_commit_records_only_what_was_executed(re_engine: Engine) -> None:
    policy = breaker_policy(0.5, 1)
    diagnosis = diagnose(re_engine, XID79)
    assert diagnosis.root_cause is not None
    state = MemoryPolicyState()
    c = ctx(10.0, node="n1", pool="p", pool_size=10)
    plan = policy.decide("inc-1", diagnosis.root_cause, diagnosis.findings, c, state)
    assert policy.commit(plan, c, state, executed=[Q]) == ["quarantine"]
    assert state.count("restart", "job:train/llama", 0) == 0
    # The restart done later for the same incident is recorded then, once.
    assert policy.commit(plan, c, state, executed=[Q, R]) == ["restart"]
    assert policy.commit(plan, c, state) == []


def test_per_action_commits(shipped: Policy) -> None:
    state = MemoryPolicyState()
    c = ctx(100.0, node="n1", pool="p", pool_size=10)
    assert shipped.commit_quarantine("n1", c, state, incident_id="inc-1")
    assert not shipped.commit_quarantine("n1", c, state, incident_id="inc-1")  # same incident: once
    assert not shipped.commit_quarantine("n1", ctx(200.0, pool="p"), state)  # already quarantined: not counted
    assert state.count("quarantine", "pool:p", 0) == 1
    assert shipped.commit_restart(c, state, incident_id="inc-1")
    assert not shipped.commit_restart(c, state, incident_id="inc-1")
    assert not shipped.commit_restart(ctx(job=None), state)
    assert shipped.commit_breaker(c, state)
    assert state.count("restart", "job:train/llama", 0) == 1
    assert state.count("breaker_open", "pool:p", 0) == 1


def test_plan_context_round_trips(shipped: Policy, re_engine: Engine) -> None:
    diagnosis = diagnose(re_engine, XID79)
    assert diagnosis.root_cause is not None
    c = ctx(node="n1", pool="type=h100", pool_size=7)
    data = shipped.decide("inc-1", diagnosis.root_cause, diagnosis.findings, c, MemoryPolicyState()).as_dict()
    assert data["context"] == {
        "namespace": "train",
        "job_key": "job:train/llama",
        "node": "n1",
        "pool": "type=h100",
        "pool_size": 7,
    }


def test_plan_persisted_state_survives_reopen(tmp_path: Path, shipped: Policy, re_engine: Engine) -> None:
    path = tmp_path / "policy.db"
    diagnosis = diagnose(re_engine, WATCHDOG)
    assert diagnosis.root_cause is not None
    with SqlitePolicyState(path, now=1000.0) as state:
        c = ctx(1000.0)
        plan = shipped.decide("inc-1", diagnosis.root_cause, diagnosis.findings, c, state)
        shipped.commit(plan, c, state)
    with SqlitePolicyState(path, now=1010.0) as state:
        again = shipped.decide("inc-2", diagnosis.root_cause, diagnosis.findings, ctx(1010.0), state)
    assert again.not_before == 1060.0


# --- hints ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "frameworks", "hints"),
    [
        pytest.param("gpu_oom-13", ["vllm"], ["vllm.memory", "generic.other_processes"], id="gpu_oom-13"),
        pytest.param(
            "gpu_oom-14",
            ["vllm"],
            ["pytorch.expandable_segments", "vllm.memory", "generic.other_processes"],
            id="gpu_oom-14",
        ),
        pytest.param(
            "gpu_oom-15",
            [],
            ["pytorch.expandable_segments", "generic.reduce_memory", "generic.other_processes"],
            id="gpu_oom-15",
        ),
        pytest.param("gpu_oom-16", ["jax"], ["jax.memory", "generic.other_processes"], id="gpu_oom-16"),
        pytest.param(
            "gpu_oom-5",
            [],
            ["pytorch.expandable_segments", "generic.reduce_memory", "generic.other_processes"],
            id="gpu_oom-5",
        ),
        pytest.param(
            "gpu_oom-7", [], ["nccl.buffers", "generic.reduce_memory", "generic.other_processes"], id="gpu_oom-7"
        ),
        pytest.param(
            "gpu_oom-8", [], ["nccl.buffers", "generic.reduce_memory", "generic.other_processes"], id="gpu_oom-8"
        ),
        pytest.param(
            "npu_oom-3",
            ["hf"],
            ["torch_npu.expandable_segments", "hf.trainer", "generic.other_processes"],
            id="npu_oom-3-llamafactory",
        ),
        pytest.param(
            "npu_oom-4",
            ["vllm"],
            ["torch_npu.expandable_segments", "vllm.memory", "generic.other_processes"],
            id="npu_oom-4-vllm-ascend",
        ),
        pytest.param("npu_oom-7", ["mindspore"], ["mindspore.memory", "generic.other_processes"], id="npu_oom-7"),
        pytest.param("npu_oom-8", [], ["generic.reduce_memory", "generic.other_processes"], id="npu_oom-8"),
    ],
)
def test_oom_hints_on_real_corpus_entries(
    re_engine: Engine, entry: str, frameworks: list[str], hints: list[str]
) -> None:
    row = CORPUS_ROWS[entry]
    assert row["label"] in ("gpu_oom", "npu_oom")
    diagnosis = diagnose(re_engine, row["text"])
    lines = row["text"].splitlines()
    assert recognise_frameworks(diagnosis.findings, lines) == frameworks
    book = default_hints()
    assert [h.id for h in book.select(diagnosis.findings[0].fault_class, diagnosis.findings, lines)] == hints
    texts = oom_hints(diagnosis.findings, lines)
    assert len(texts) == len(hints) and all(t.en and t.zh for t in texts)


@pytest.mark.parametrize(
    ("context", "hint", "absent"),
    [
        pytest.param(DEEPSPEED_LINES, "deepspeed.zero", "generic.reduce_memory", id="deepspeed"),
        pytest.param(MEGATRON_LINES, "megatron.memory", "generic.reduce_memory", id="megatron"),
        pytest.param(HF_TRAINER_LINES, "hf.trainer", "generic.reduce_memory", id="hf-trainer"),
        pytest.param((), "generic.reduce_memory", "deepspeed.zero", id="generic"),
    ],
)
def test_oom_hints_pick_the_framework_from_the_log_tail(
    re_engine: Engine, context: tuple[str, ...], hint: str, absent: str
) -> None:
    diagnosis = diagnose(re_engine, CORPUS_ROWS["gpu_oom-5"]["text"])
    ids = [h.id for h in default_hints().select(diagnosis.findings[0].fault_class, diagnosis.findings, context)]
    assert hint in ids and absent not in ids
    assert "pytorch.expandable_segments" in ids  # gpu_oom-5 shows 194.87 MiB reserved-unallocated for 22 MiB


def test_plan_carries_framework_hints(shipped: Policy, re_engine: Engine) -> None:
    diagnosis = diagnose(re_engine, CORPUS_ROWS["gpu_oom-5"]["text"])
    assert diagnosis.root_cause is not None
    plan = shipped.decide(
        "inc-1", diagnosis.root_cause, diagnosis.findings, ctx(texts=MEGATRON_LINES), MemoryPolicyState()
    )
    assert any("--micro-batch-size" in h.en and "--micro-batch-size" in h.zh for h in plan.hints)
    assert any("expandable_segments:True" in h.en for h in plan.hints)
    assert plan.as_dict()["hints"][0].keys() == {"en", "zh"}


def test_framework_from_pod_name() -> None:
    finding = Finding.model_validate(
        {
            "rule_id": "nvidia.cuda_oom.pytorch",
            "fault_class": "accelerator_oom",
            "chip": "nvidia",
            "code": "cuda_oom",
            "source": "container_log",
            "severity": "error",
            "text": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            "pod": "deepspeed-llama-worker-3",
        }
    )
    assert recognise_frameworks([finding]) == ["deepspeed"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(CORPUS_ROWS["gpu_oom-13"]["text"], False, id="1.32GiB-spare-for-1.88GiB"),
        pytest.param(CORPUS_ROWS["gpu_oom-14"]["text"], True, id="23MiB-spare-for-20MiB"),
        pytest.param(CORPUS_ROWS["gpu_oom-15"]["text"], True, id="torch1-reserved-minus-allocated"),
        pytest.param(CORPUS_ROWS["npu_oom-3"]["text"], True, id="torch-npu"),
        pytest.param(CORPUS_ROWS["npu_oom-8"]["text"], False, id="no-numbers"),
        pytest.param("", False, id="empty"),
    ],
)
def test_fragmentation_signal(text: str, expected: bool) -> None:
    assert fragmentation(text.splitlines()) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("hints: [\n", [(2, "YAML syntax")], id="syntax"),
        pytest.param(
            "frameworks:\n  - id: x\n    name: X\n    patterns: ['(', '.*']\n",
            [(4, "bad regex '('"), (4, "matches an empty text")],
            id="bad-regexes",
        ),
        pytest.param(
            "hints:\n  - id: a\n    when: {frameworks: [nope], signals: [sunspots]}\n    en: e\n    zh: z\n",
            [(3, "unknown framework 'nope'"), (3, "unknown signal 'sunspots'")],
            id="unknown-references",
        ),
        pytest.param(
            "hints:\n  - id: a\n    en: e\n    zh: z\n  - id: a\n    en: e\n    zh: z\n    colour: red\n",
            [(5, "duplicate id 'a'"), (8, "colour: unknown key")],
            id="unknown-key-and-duplicate",
        ),
        pytest.param(
            "hints:\n  - id: a\n    en: e\n    zh: z\n  - id: a\n    en: e\n    zh: z\n",
            [(5, "duplicate id 'a', first defined at line 2")],
            id="duplicate-id",
        ),
        pytest.param(
            "frameworks:\n  - id: x\n    name: X\n    patterns: [x]\nhints:\n  - id: a\n"
            "    when: {generic: true, frameworks: [x]}\n    en: e\n    zh: z\n",
            [(7, "generic hint cannot also name frameworks")],
            id="generic-with-framework",
        ),
        pytest.param("hints:\n  - id: a\n    en: e\n", [(2, "zh: Field required")], id="missing-zh"),
    ],
)
def test_broken_hints_file(text: str, expected: list[tuple[int, str]]) -> None:
    with pytest.raises(HintError) as info:
        parse_hints(text, "hints.yaml")
    problems = info.value.problems
    assert len(problems) == len(expected), [str(p) for p in problems]
    for line, fragment in expected:
        assert any(p.line == line and fragment in str(p) for p in problems), (
            line,
            fragment,
            [str(p) for p in problems],
        )


def test_shipped_hints_cover_accelerator_oom_in_both_languages() -> None:
    book = default_hints()
    assert {fw.id for fw in book.frameworks} >= {"deepspeed", "megatron", "hf", "vllm", "jax", "mindspore"}
    assert any(h.generic for h in book.hints)
    for h in book.hints:
        assert h.text.en and h.text.zh


def test_hints_for_other_classes_are_empty(shipped: Policy, re_engine: Engine) -> None:
    diagnosis = diagnose(re_engine, XID79)
    assert diagnosis.root_cause is not None
    assert shipped.decide("i", diagnosis.root_cause, diagnosis.findings, ctx(), MemoryPolicyState()).hints == []


@pytest.mark.parametrize("budget", [1, 2])
def test_a_restart_reserves_its_place_in_the_budget_atomically(budget: int) -> None:
    """Two brains restarting one job at once (a rebalance): together no more than the budget."""
    from trainmedic.remediations.policy import PolicyContext
    from trainmedic.remediations.policy_state import MemoryPolicyState

    policy = parse_policy(
        f"version: 1\nmode: enforce\nbudgets:\n  restarts: {{max: {budget}, window: 1h}}\n"
        "  backoff: {base: 1s, max: 1s}\n"
        "rules:\n  - id: r\n    match: {fault_class: device_error}\n    actions: [restart_from_checkpoint]\n"
    )
    state = MemoryPolicyState()
    ctx = PolicyContext(namespace="train", job_key="job:train/llama", now=1000.0)
    allowed = [i for i in range(4) if policy.restart_refused(ctx, state, f"inc-{i}") is None]
    assert allowed == list(range(budget))
    # A reservation given back (nothing was deleted) frees its place; a committed one keeps it.
    policy.release_restart(ctx, state, "inc-0")
    assert policy.restart_refused(ctx, state, "inc-9") is None
    policy.commit_restart(ctx, state, incident_id="inc-9")
    assert policy.restart_refused(ctx, state, "inc-10") is not None
