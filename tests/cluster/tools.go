//go:build tools

// Package cluster pins the Kubernetes control-plane commands the real-plane tests run
// (tests/servers/kubeplane.py); build.sh builds them from this module.
package cluster

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
