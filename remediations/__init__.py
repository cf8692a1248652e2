"""Remediation: scene bundles, policy, actions, checkpoint discovery, workload adapters.

Empty until the self-healing work lands; it may import udal and trainmedic.models only.
"""
