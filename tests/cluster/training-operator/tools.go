//go:build tools

// Package trainingoperator pins the Kubeflow Training Operator the real-plane tests run against the
// session plane (tests/servers/operators.py); build.sh builds its manager from this module.
package trainingoperator

import (
	_ "github.com/kubeflow/training-operator/cmd/training-operator.v1"
)
