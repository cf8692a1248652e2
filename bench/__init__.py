"""Throughput benchmarks for the rule engine (`make bench`)."""
