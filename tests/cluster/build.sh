#!/bin/sh
# Builds the real Kubernetes control plane the realplane tests start (tests/servers/kubeplane.py):
# kube-apiserver, kube-controller-manager and kube-scheduler from this module's pinned
# k8s.io/kubernetes, etcd at the version that release uses (./etcd), and KWOK for the fake nodes,
# into a cache directory keyed by version:
#   ${XDG_CACHE_HOME:-~/.cache}/trainmedic/kube-<version>/bin
# and the workload controllers the realplane tests run on that plane (tests/servers/operators.py),
# each from a module of its own at the version it pins, into a cache directory keyed by that version:
# the Kubeflow Training Operator (./training-operator)
#   ${XDG_CACHE_HOME:-~/.cache}/trainmedic/training-operator-<version>/bin
# and Volcano's vc-controller-manager and vc-scheduler (./volcano)
#   ${XDG_CACHE_HOME:-~/.cache}/trainmedic/volcano-<version>/bin
# Idempotent: a binary already there is not rebuilt. Prints the (Kubernetes) bin directory on success.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "k8s.io/kubernetes" { print $2 } $1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$here/go.mod")
[ -n "$version" ] || { echo "build.sh: no k8s.io/kubernetes requirement in $here/go.mod" >&2; exit 1; }
kwok_version=v0.8.0
cache=${XDG_CACHE_HOME:-$HOME/.cache}/trainmedic/kube-$version
bin=$cache/bin
mkdir -p "$bin"
cd "$here"
# Static, no cgo, no debug info: what the Kubernetes release builds use, and faster to link.
export CGO_ENABLED=0
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$version" | cut -d. -f2)"
for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
	if [ ! -x "$bin/$cmd" ]; then
		echo "building $cmd $version" >&2
		go build -trimpath -ldflags "$ldflags" -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
		mv "$bin/$cmd.tmp" "$bin/$cmd"
	fi
done
if [ ! -x "$bin/etcd" ]; then
	echo "building etcd (go.etcd.io/etcd/server/v3)" >&2
	go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" ./etcd
	mv "$bin/etcd.tmp" "$bin/etcd"
fi
if [ ! -x "$bin/kwok" ]; then
	echo "building kwok $kwok_version" >&2
	tmp=$(mktemp -d)
	GOBIN=$tmp go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$kwok_version"
	mv "$tmp/kwok" "$bin/kwok"
	rmdir "$tmp"
fi
# The Kubeflow Training Operator's manager (cmd/training-operator.v1), for the PyTorchJobs of the
# realplane tests (tests/servers/operators.py). Its own module, as it needs client-go and
# controller-runtime at the versions it was released with, not the ones k8s.io/kubernetes uses.
op_version=$(awk '$1 == "github.com/kubeflow/training-operator" { print $2 } $1 == "require" && $2 == "github.com/kubeflow/training-operator" { print $3 }' "$here/training-operator/go.mod")
[ -n "$op_version" ] || { echo "build.sh: no github.com/kubeflow/training-operator requirement in $here/training-operator/go.mod" >&2; exit 1; }
op_bin=${XDG_CACHE_HOME:-$HOME/.cache}/trainmedic/training-operator-$op_version/bin
if [ ! -x "$op_bin/training-operator" ]; then
	echo "building training-operator $op_version" >&2
	mkdir -p "$op_bin"
	(cd "$here/training-operator" && go build -trimpath -ldflags "-s -w" -o "$op_bin/training-operator.tmp" \
		github.com/kubeflow/training-operator/cmd/training-operator.v1)
	mv "$op_bin/training-operator.tmp" "$op_bin/training-operator"
fi
# Volcano's job controllers and its scheduler (vc-scheduler: the job controller creates a job's pods
# only once the scheduler has put its PodGroup in the queue). A module of its own as well: Volcano
# requires k8s.io/kubernetes v1.30 and replaces the staging modules with their v0.30. One `go build`
# for both, which share most of their packages.
vc_version=$(awk '$1 == "volcano.sh/volcano" { print $2 } $1 == "require" && $2 == "volcano.sh/volcano" { print $3 }' "$here/volcano/go.mod")
[ -n "$vc_version" ] || { echo "build.sh: no volcano.sh/volcano requirement in $here/volcano/go.mod" >&2; exit 1; }
vc_bin=${XDG_CACHE_HOME:-$HOME/.cache}/trainmedic/volcano-$vc_version/bin
if [ ! -x "$vc_bin/vc-controller-manager" ] || [ ! -x "$vc_bin/vc-scheduler" ]; then
	echo "building vc-controller-manager and vc-scheduler $vc_version" >&2
	rm -rf "$vc_bin.tmp" && mkdir -p "$vc_bin.tmp" "$vc_bin"
	(cd "$here/volcano" && go build -trimpath -ldflags "-s -w" -o "$vc_bin.tmp/" \
		volcano.sh/volcano/cmd/controller-manager volcano.sh/volcano/cmd/scheduler)
	mv "$vc_bin.tmp/controller-manager" "$vc_bin/vc-controller-manager"
	mv "$vc_bin.tmp/scheduler" "$vc_bin/vc-scheduler"
	rmdir "$vc_bin.tmp"
fi
# KWOK's stock stages (the ones kwokctl gives its clusters), from KWOK's own module: node
# initialisation, the heartbeat that goes with node leases, pods made ready and deleted. Not its
# pod-complete stage, which finishes a Job's pods at once: training pods run until deleted.
# Written every time (cheap), so a change here always reaches the file.
stages=$cache/kwok-stages.yaml
src=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$kwok_version/kustomize/stage
[ -d "$src" ] || (cd / && go mod download "sigs.k8s.io/kwok@$kwok_version")
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
	pod/fast/pod-ready.yaml pod/fast/pod-delete.yaml; do
	echo "---"
	cat "$src/$f"
done >"$stages.tmp"
mv "$stages.tmp" "$stages"
echo "$bin"
