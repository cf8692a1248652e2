"""Rule files written as YAML text for tests of loading and caching (tests/detectors/test_loader.py,
tests/core/test_cache.py): one made-up rule, `rule`, and a file of them, `rule_file`."""

from __future__ import annotations


def rule(
    rule_id: str = "test.frob",
    *,
    status: str = "stable",
    fault_class: str = "device_error",
    patterns: tuple[str, ...] = (r"FROBNICATOR FAILED code=(?P<num>\d+)",),
    code: str = "frob:{num}",
    extra: str = "",
    examples: str | None = None,
) -> str:
    """One rule as YAML text, indented for a `rules:` list. `extra` lines go after `severity`."""
    if examples is None:
        examples = (
            "    examples:\n"
            "      match:\n"
            "        - line: 'x FROBNICATOR FAILED code=7'\n"
            "          code: 'frob:7'\n"
            "      no_match:\n"
            "        - 'frobnicator is fine'\n"
        )
    pats = "".join(f"      - '{p}'\n" for p in patterns)
    return (
        f"  - id: {rule_id}\n"
        f"    status: {status}\n"
        "    source: [container_log]\n"
        "    chip: generic\n"
        f"    fault_class: {fault_class}\n"
        "    patterns:\n"
        f"{pats}"
        f"    code: '{code}'\n"
        "    severity: critical\n"
        f"{extra}"
        "    message: {en: 'frobnicator failed', zh: 'frobnicator 失败'}\n"
        "    hint: {en: 'replace the frobnicator', zh: '更换 frobnicator'}\n"
        f"{examples}"
    )


def rule_file(*rules: str, header: str = "version: 1\n") -> str:
    return header + "rules:\n" + "".join(rules)
