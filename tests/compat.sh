#!/usr/bin/env bash
# The newest CPython on this machine runs the tests of the code that reads CPython's private regex
# parser (detectors/anchors.py: the `re` path's required literals; detectors/hang_regex.py: the hang
# markers' rewriter), which changes between Python versions: every shipped rule's examples through
# both engine paths, the phase markers, the hang markers' examples and their fast == re checks.
# `make test` runs it after the suite.
#
# The interpreter: the highest python3.N (N >= 12) among pyenv's versions and /usr/bin. Its own
# environment (.venv-compat) is rebuilt when the interpreter or pyproject.toml changes. No newer
# Python here: a notice, or a failure under CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."

candidates=()
root="${PYENV_ROOT:-$HOME/.pyenv}"
for py in "$root"/versions/3.*/bin/python3.* /usr/bin/python3.* /usr/local/bin/python3.*; do
  [[ -x "$py" && "$py" =~ python3\.[0-9]+$ ]] && candidates+=("$py")
done
best="" best_minor=11
for py in "${candidates[@]}"; do
  minor=$("$py" -c 'import sys; print(sys.version_info[1] if sys.version_info[0] == 3 else 0)' 2>/dev/null) || continue
  if (( minor > best_minor )); then best="$py" best_minor=$minor; fi
done
if [[ -z "$best" ]]; then
  if [[ "${CI:-}" == "true" ]]; then
    echo "compat: no CPython newer than 3.11 found (pyenv versions, /usr/bin): the compatibility run cannot happen" >&2
    exit 1
  fi
  echo "compat: no CPython newer than 3.11 here; skipped"
  exit 0
fi

venv=.venv-compat
version=$("$best" -c 'import sys; print(sys.version.split()[0])')
stamp="$venv/.stamp-$version-$(sha256sum pyproject.toml | cut -c1-12)"
if [[ ! -f "$stamp" ]]; then
  rm -rf "$venv"
  "$best" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e '.[fast]' pytest hypothesis pytest-asyncio pytest-timeout looptime
  touch "$stamp"
fi
echo "compat: Python $version ($best)"
"$venv/bin/trainmedic" rules test                                          # the fast path
"$venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/rules/test_shipped_rules.py tests/detectors/test_phase.py           # the re path
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/detectors/test_hang.py \
  -k "marker_examples or fast_path_equals_re_path or batch_scan_equals"       # the markers' rewriter
