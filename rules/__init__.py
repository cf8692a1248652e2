"""The shipped rule files (data). `RULES_DIR` is where the loader finds them."""

from pathlib import Path

RULES_DIR = Path(__file__).resolve().parent
