//go:build tools

// Package operators pins the workload controllers the real-plane tests run against the session
// plane (tests/servers/operators.py); build.sh builds them from this module.
package operators

import (
	_ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
)
