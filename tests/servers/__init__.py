"""Launchers for the real servers the tests and benchmarks start on loopback (DESIGN.md "Real components")."""
