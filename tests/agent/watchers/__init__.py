"""Tests of the watchers (agent/watchers)."""
