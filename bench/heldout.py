"""Diagnosis accuracy on real excerpts the rules were not written from: `heldout_macro_f1`.

The corpus is tests/data/corpus/excerpts.jsonl (real failure and negative excerpts from public
threads, forums and vendor guides, each with its source; its README says how it was built). Its
split is fixed in the file by thread: `heldout` rows come from threads no rule was written from and
are never tuned on. Each excerpt is diagnosed as `trainmedic diagnose` would (the shipped rules, the
correlator) and the root cause's class is compared with the label.

Figures (held-out rows; entries whose notes start with AMBIGUOUS are reported apart, not scored):
- `heldout_macro_f1`: the mean over the fault classes present in the labels of the per-class F1
  (precision and recall of "root cause class == label", a negative counting as the class `none`);
- `heldout_negatives_fired`: negatives that gave a root cause (must be 0);
- `heldout_chip_wrong`: excerpts whose class is right but whose chip is not (generic counts as
  right for a chip-neutral label);
- the same macro-F1 on the train split (`train_macro_f1`), for comparison, and per-class F1s.

`python -m bench.heldout [--split heldout|train|all] [--show-misses]` prints the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "corpus" / "excerpts.jsonl"
NONE = "none"


@dataclass(frozen=True, slots=True)
class Outcome:
    id: str
    split: str
    label: str
    chip: str
    predicted: str
    predicted_chip: str | None
    code: str | None
    ambiguous: bool


def load(path: Path = CORPUS) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def diagnose_all(rows: Iterable[dict[str, Any]]) -> list[Outcome]:
    from trainmedic.detectors.diagnose import diagnose_text, make_engine

    engine = make_engine()
    out = []
    for row in rows:
        rc = diagnose_text(str(row["text"]), engine).root_cause
        out.append(
            Outcome(
                id=str(row["id"]),
                split=str(row.get("split")),
                label=str(row.get("fault_class") or NONE),
                chip=str(row.get("chip") or "generic"),
                predicted=rc.fault_class.value if rc else NONE,
                predicted_chip=rc.chip.value if rc else None,
                code=rc.code if rc else None,
                ambiguous=str(row.get("notes") or "").startswith("AMBIGUOUS"),
            )
        )
    return out


def macro_f1(outcomes: list[Outcome]) -> tuple[float | None, dict[str, float]]:
    """Mean per-class F1 over the fault classes among the labels (`none` is not a class of its own:
    a negative that fires costs the predicted class's precision)."""
    classes = sorted({o.label for o in outcomes} - {NONE})
    per: dict[str, float] = {}
    for c in classes:
        tp = sum(1 for o in outcomes if o.label == c and o.predicted == c)
        fp = sum(1 for o in outcomes if o.label != c and o.predicted == c)
        fn = sum(1 for o in outcomes if o.label == c and o.predicted != c)
        per[c] = 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)
    return (round(sum(per.values()) / len(per), 4) if per else None), {k: round(v, 4) for k, v in per.items()}


def _chip_right(o: Outcome) -> bool:
    return o.chip in (o.predicted_chip, "generic") or o.predicted_chip == "generic"


def figures(path: Path = CORPUS) -> dict[str, Any]:
    if not path.exists():
        return {"heldout_macro_f1": None, "heldout_corpus": None}
    outcomes = diagnose_all(load(path))
    scored = [o for o in outcomes if not o.ambiguous]
    held = [o for o in scored if o.split == "heldout"]
    train = [o for o in scored if o.split == "train"]
    held_f1, held_per = macro_f1(held)
    train_f1, _ = macro_f1(train)
    return {
        "heldout_macro_f1": held_f1,
        "heldout_per_class_f1": held_per,
        "heldout_excerpts": len(held),
        "heldout_negatives": sum(1 for o in held if o.label == NONE),
        "heldout_negatives_fired": sum(1 for o in held if o.label == NONE and o.predicted != NONE),
        "heldout_chip_wrong": sum(1 for o in held if o.label == o.predicted != NONE and not _chip_right(o)),
        "heldout_class_counts": dict(sorted(Counter(o.label for o in held).items())),
        "train_macro_f1": train_f1,
        "train_excerpts": len(train),
        "train_negatives_fired": sum(1 for o in train if o.label == NONE and o.predicted != NONE),
        "ambiguous_excerpts": sum(1 for o in outcomes if o.ambiguous),
        "heldout_corpus": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--show-misses", choices=("heldout", "train", "all"), default=None)
    args = ap.parse_args(argv)
    result = figures(args.corpus)
    if args.show_misses:
        for o in diagnose_all(load(args.corpus)):
            if o.predicted != o.label and (args.show_misses in ("all", o.split)):
                result.setdefault("misses", []).append(
                    {"id": o.id, "label": o.label, "predicted": o.predicted, "code": o.code, "ambiguous": o.ambiguous}
                )
    json.dump(result, sys.stdout, indent=1, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
