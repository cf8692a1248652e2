"""Loading the progress-marker file (detectors/progress.yaml): validated markers, where each came
from, and the matcher built from them. Every example is run through the real matcher at load.

Errors:

    RuleLoadError (trainmedic.errors)   the file is unusable: every problem with file:line
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from trainmedic import cache
from trainmedic.datafile import format_error, node_line, parse_yaml, read_data_file, short_text
from trainmedic.detectors.hang_matcher import ProgressMatcher
from trainmedic.detectors.hang_schema import (
    MARKERS_FILE,
    MAX_MARKER_FILE_BYTES,
    Marker,
    MarkerHit,
    _MarkerFileHeader,
)
from trainmedic.errors import Problem, RuleLoadError


@dataclass(frozen=True)
class ProgressMarkers:
    """Validated markers, where each came from, and the matcher built from them."""

    markers: tuple[Marker, ...]
    origins: dict[str, tuple[str, int | None]]
    matcher: ProgressMatcher


def parse_markers(text: str, name: str) -> tuple[list[tuple[Marker, int | None]], list[Problem]]:
    """Parse marker-file text. Returns the valid markers (with their line) and every problem found."""
    problems: list[Problem] = []
    root, data, problem = parse_yaml(text, name)
    if problem is not None:
        return [], [problem]
    if not isinstance(data, dict):
        return [], [Problem(name, 1, "a marker file is a mapping with `version` and `markers`")]
    try:
        header = _MarkerFileHeader.model_validate(data)
    except ValidationError as exc:
        return [], [Problem(name, node_line(root, e["loc"]), format_error(e)) for e in exc.errors()]
    if not header.markers:
        return [], [Problem(name, node_line(root, ["markers"]), "no markers")]

    good: list[tuple[Marker, int | None]] = []
    seen: dict[str, int | None] = {}
    for i, item in enumerate(header.markers):
        line = node_line(root, ["markers", i])
        marker_id = item.get("id") if isinstance(item, dict) else None
        try:
            marker = Marker.model_validate(item)
        except ValidationError as exc:
            for err in exc.errors():
                problems.append(
                    Problem(
                        name,
                        node_line(root, ["markers", i, *err["loc"]]),
                        format_error(err),
                        str(marker_id) if marker_id else None,
                    )
                )
            continue
        if marker.id in seen:
            problems.append(Problem(name, line, f"duplicate id, first defined at line {seen[marker.id]}", marker.id))
            continue
        seen[marker.id] = line
        good.append((marker, line))

    # Every example is run through the real matcher built from the whole file, so a marker shadowed
    # by an earlier one of the same kind is caught here, not in production.
    matcher = ProgressMatcher([m for m, _ in good])
    for marker, line in good:
        for ex in marker.examples:
            hit = next((h for h in _match_all(matcher, ex.line) if h.marker_id == marker.id), None)
            if hit is None:
                taken = [h.marker_id for h in _match_all(matcher, ex.line) if h.kind is marker.kind]
                why = f" (taken by {taken[0]})" if taken else ""
                problems.append(Problem(name, line, f"example does not match{why}: {short_text(ex.line)}", marker.id))
                continue
            if ex.step is not None and hit.step != ex.step:
                problems.append(
                    Problem(
                        name,
                        line,
                        f"example gives step {hit.step}, expected {ex.step}: {short_text(ex.line)}",
                        marker.id,
                    )
                )
            if ex.epoch is not None and hit.epoch != ex.epoch:
                problems.append(
                    Problem(
                        name,
                        line,
                        f"example gives epoch {hit.epoch}, expected {ex.epoch}: {short_text(ex.line)}",
                        marker.id,
                    )
                )
        for neg in marker.no_match:
            if any(h.marker_id == marker.id for h in _match_all(matcher, neg)):
                problems.append(Problem(name, line, f"no_match example matches: {short_text(neg)}", marker.id))
    return good, problems


def _match_all(matcher: ProgressMatcher, text: str) -> list[MarkerHit]:
    """Hits of a (possibly multi-line) example through the batch path the detector uses."""
    return [h for _, _, hits in matcher.scan(text.split("\n")) for h in hits]


def load_markers(path: Path | None = None) -> ProgressMarkers:
    """Load and validate a marker file (the shipped detectors/progress.yaml by default).

    Raises RuleLoadError carrying every problem, each with file and line. A file that loads without
    error is kept in the on-disk cache (trainmedic/cache.py), keyed by its path and bytes: the next
    process skips parsing, validation and the examples (problems are never cached).
    """
    path = path or MARKERS_FILE
    name = str(path)
    got = read_data_file(path, MAX_MARKER_FILE_BYTES, name)
    if isinstance(got, Problem):
        raise RuleLoadError([got])
    raw, text = got
    key = cache.make_key("markers", [name, raw]) if cache.cache_dir() is not None else None
    cached = cache.load("markers", key) if key is not None else None
    if isinstance(cached, list):
        good: list[tuple[Marker, int | None]] = cached
    else:
        good, problems = parse_markers(text, name)
        if problems or not good:
            raise RuleLoadError(problems or [Problem(name, None, "no markers")])
        if key is not None:
            cache.store("markers", key, good)
    markers = tuple(m for m, _ in good)
    return ProgressMarkers(
        markers=markers,
        origins={m.id: (name, line) for m, line in good},
        matcher=ProgressMatcher(markers),
    )


@functools.cache
def shipped_markers() -> ProgressMarkers:
    """The shipped marker file, loaded and validated once per process."""
    return load_markers()
