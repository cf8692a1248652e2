"""Build excerpts.jsonl from the staged source files in src/.

src/*.txt format: records separated by header lines
    === id | fault_class | chip | code | url | notes
optionally followed by one line "@origin {json}"; every following line up to
the next header is the verbatim excerpt (trailing blank lines dropped).
fault_class "-" means negative (null); code "-" means null.
"""

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def thread_key(url: str) -> str:
    u = re.sub(r"^https?://", "", url.strip())
    u = re.sub(r"^www\.", "", u)
    u = u.split("#")[0].split("?")[0].rstrip("/")
    m = re.match(r"(github\.com/[^/]+/[^/]+/(?:issues|pull|discussions)/\d+)", u)
    if m:
        return m.group(1)
    m = re.match(r"(discuss\.[^/]+/t/[^/]+/\d+)", u)
    if m:
        return m.group(1)
    m = re.match(r"(forums\.developer\.nvidia\.com/t/[^/]+/\d+)", u)
    if m:
        return m.group(1)
    return u


def split_of(thread: str) -> str:
    return "heldout" if int(hashlib.sha1(thread.encode()).hexdigest(), 16) % 5 == 0 else "train"


def parse(path: Path) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("=== "):
            if cur is not None:
                recs.append(cur)
            parts = [p.strip() for p in line[4:].split(" | ", 5)]
            if len(parts) != 6:
                sys.exit(f"{path}: bad header {line!r}")
            rid, fc, chip, code, url, notes = parts
            cur = {
                "id": rid,
                "fault_class": None if fc == "-" else fc,
                "chip": chip,
                "code": None if code == "-" else code,
                "origin": None,
                "url": url,
                "notes": notes,
                "lines": [],
            }
        elif cur is not None:
            if not cur["lines"] and line.startswith("@origin "):
                cur["origin"] = json.loads(line[8:])
            else:
                cur["lines"].append(line)
    if cur is not None:
        recs.append(cur)
    out: list[dict[str, Any]] = []
    for r in recs:
        lines: list[str] = r.pop("lines")
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        url = str(r.pop("url"))
        th = thread_key(url)
        out.append(
            {
                "id": r["id"],
                "fault_class": r["fault_class"],
                "chip": r["chip"],
                "code": r["code"],
                "origin": r["origin"],
                "text": "\n".join(lines),
                "source": url,
                "thread": th,
                "split": split_of(th),
                "notes": r["notes"],
            }
        )
    return out


def main() -> None:
    rows = []
    conv = HERE / "src" / "converted.jsonl"
    if conv.exists():
        for line in conv.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                r["thread"] = thread_key(r["source"])
                r["split"] = split_of(r["thread"])
                rows.append(r)
    for p in sorted((HERE / "src").glob("*.txt")):
        rows.extend(parse(p))
    ids = [r["id"] for r in rows]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        sys.exit(f"duplicate ids: {sorted(dup)}")
    for r in rows:
        if not r["text"].strip():
            sys.exit(f"empty text: {r['id']}")
    with open(HERE / "excerpts.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    from collections import Counter

    print(len(rows), Counter(r["fault_class"] for r in rows).most_common(), flush=True)
    print(Counter(r["chip"] for r in rows), Counter(r["split"] for r in rows))


if __name__ == "__main__":
    main()
