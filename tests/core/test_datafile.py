"""The shared bounded read of data files (trainmedic/datafile.py `read_data_file`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmedic.datafile import read_data_file
from trainmedic.errors import Problem


@pytest.mark.parametrize(
    ("content", "limit"),
    [
        (b"", 10),
        (b"rules: []\n", 10),  # exactly at the limit
        ("名称: 值\n".encode(), 64),
        (b"\xef\xbb\xbfa: 1\n", 64),  # a BOM is kept as text, as before
    ],
)
def test_a_readable_file_gives_its_bytes_and_text(tmp_path: Path, content: bytes, limit: int) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(content)
    assert read_data_file(path, limit) == (content, content.decode("utf-8"))


@pytest.mark.parametrize(
    ("content", "limit", "message"),
    [
        (b"x" * 11, 10, "file is 11 bytes, over the 10 limit"),
        (b"x" * 5000, 10, "file is 5000 bytes, over the 10 limit"),  # the whole size, though only 11 are read
        (b"a: \xff\xfe\n", 64, "not UTF-8: 'utf-8' codec can't decode byte 0xff in position 3: invalid start byte"),
    ],
)
def test_too_large_or_not_utf8_is_a_problem(tmp_path: Path, content: bytes, limit: int, message: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(content)
    assert read_data_file(path, limit) == Problem(str(path), None, message)


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_an_unreadable_path_is_a_problem(tmp_path: Path, what: str) -> None:
    path = tmp_path / "x.yaml"
    if what == "directory":
        path.mkdir()
    got = read_data_file(path, 100)
    assert isinstance(got, Problem)
    assert got.file == str(path) and got.line is None
    assert got.message.startswith("cannot read: ")


def test_the_problem_carries_the_given_name(tmp_path: Path) -> None:
    got = read_data_file(tmp_path / "absent.yaml", 100, "rules/absent.yaml")
    assert got == Problem("rules/absent.yaml", None, "cannot read: No such file or directory")
