"""Human formats of a diagnosis (text for a terminal at 3 am, Markdown for a ticket)."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from trainmedic.models import Diagnosis, where_words

MAX_EVIDENCE = 12

_env = Environment(
    loader=PackageLoader("trainmedic.reports", "templates"),
    undefined=StrictUndefined,
    autoescape=False,  # noqa: S701 - text and Markdown only; HTML reports get an autoescaping environment
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)

LABELS = {
    "en": {
        "ok": "No failure found",
        "ok_detail": "{lines} lines scanned; nothing matched a failure rule.",
        "root": "ROOT CAUSE",
        "where": "WHERE",
        "chain": "WAIT CHAIN",
        "candidates": "CANDIDATES",
        "vendor_causes": "CAUSES",
        "vendor_steps": "STEPS",
        "vendor": "VENDOR SAYS",
        "action": "ACTION",
        "todo": "WHAT TO DO",
        "evidence": "EVIDENCE",
        "explained": "explained by",
        "lines": "lines",
        "distinct": "distinct",
        "scanned": "lines scanned",
        "seen": "seen",
        "times": "times",
        "more": "more finding(s) not shown",
    },
    "zh": {
        "ok": "未发现故障",
        "ok_detail": "共扫描 {lines} 行，没有命中任何故障规则。",
        "root": "根因",
        "where": "位置",
        "chain": "等待链",
        "candidates": "候选根因",
        "vendor_causes": "可能原因",
        "vendor_steps": "处理步骤",
        "vendor": "厂商建议",
        "action": "处置",
        "todo": "建议操作",
        "evidence": "证据",
        "explained": "由此引起：",
        "lines": "行",
        "distinct": "条不同",
        "scanned": "行已扫描",
        "seen": "出现",
        "times": "次",
        "more": "条其余发现未显示",
    },
}


def context(diagnosis: Diagnosis, lang: str) -> dict[str, Any]:
    rc = diagnosis.root_cause
    evidence = []
    for f in diagnosis.findings[:MAX_EVIDENCE]:
        place = where_words(f.node, f.device, f.rank, lang)
        sep = "，" if lang == "zh" else ", "
        evidence.append(
            {
                "where": f"{f.file or '-'}:{f.line_no or '-'}" + (f" [{sep.join(place)}]" if place else ""),
                "rule_id": f.rule_id,
                "code": f.code,
                "fault_class": f.fault_class.value,
                "count": f.count,
                "consequence_of": f.consequence_of,
                "text": f.text if len(f.text) <= 240 else f.text[:237] + "...",
                "is_root": rc is not None and f.rule_id == rc.rule_id and f.code == rc.code,
            }
        )
    where = []
    if rc is not None:
        labels = {"en": ("node", "device", "rank", "ranks"), "zh": ("节点", "设备", "rank", "涉及 rank")}[lang]
        for label, value in zip(labels, (rc.node, rc.device, rc.rank, None), strict=True):
            if value is not None:
                where.append(f"{label} {value}")
        if rc.rank is None and rc.ranks:
            where.append(f"{labels[3]} {', '.join(map(str, rc.ranks[:16]))}")
    return {
        "t": LABELS[lang],
        "lines_scanned": diagnosis.lines_scanned,
        "root": None
        if rc is None
        else {
            **rc.contract_dict(lang),
            # The chain and the candidates with their node and device where the logs say them.
            "chain": [p.label(lang) for p in rc.chain_places] or list(rc.chain),
            "candidates": [p.label(lang) for p in rc.candidate_places] or list(rc.candidates),
            "occurrences": rc.occurrences,
            "where": ", ".join(where) if lang == "en" else "，".join(where),
        },
        "evidence": evidence,
        "hidden": max(0, len(diagnosis.findings) - MAX_EVIDENCE),
        "total_lines": sum(f.count for f in diagnosis.findings),
        "distinct": len(diagnosis.findings),
    }


def render(diagnosis: Diagnosis, fmt: str, lang: str = "en") -> str:
    template = _env.get_template({"text": "diagnose.txt.j2", "markdown": "diagnose.md.j2"}[fmt])
    return template.render(**context(diagnosis, lang))
