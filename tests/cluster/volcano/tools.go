//go:build tools

// Package volcano pins Volcano's job controllers (vc-controller-manager) and scheduler
// (vc-scheduler), which the real-plane tests run against the session plane
// (tests/servers/operators.py); build.sh builds them from this module.
package volcano

import (
	_ "volcano.sh/volcano/cmd/controller-manager"
	_ "volcano.sh/volcano/cmd/scheduler"
)
