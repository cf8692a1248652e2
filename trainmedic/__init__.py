"""trainmedic: fault diagnosis and self-healing for AI training jobs on Kubernetes."""

__version__ = "0.1.0"
