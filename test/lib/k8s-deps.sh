#!/bin/sh
# test/lib/k8s-deps.sh - build the Kubernetes peers of test/k8s.py, once per
# machine, outside the tree: kube-apiserver, kube-controller-manager,
# kube-scheduler and kubectl of Kubernetes v1.37.2 (test/k8s: k8s.io/kubernetes
# with its staging modules replaced by their published v0.37.2) and kine
# v0.17.5 (test/k8s/kine, SQLite), pinned by their go.mod and go.sum, into
# $KVD_CACHE/k8s-<hash of the four files>/bin.  It prints that directory.
# Without Go >= GO_MIN it says SKIPPED and exits 2 -- unless
# KVD_REQUIRE_GO_PEERS is set (CI), when it fails (exit 1).
# The first build takes many minutes on 2 cores and ~3 GB of RAM; Go's module
# and build caches make a second build of a changed pin quick.
set -u
GO_MIN=1.26.0
K8S_VERSION=v1.37.2
KVD_CACHE=${KVD_CACHE:-/var/cache/kvd-test}
top=$(cd "$(dirname "$0")/../.." && pwd)
go=$(command -v go || true)
[ -z "$go" ] && [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go
have=$([ -n "$go" ] && "$go" env GOVERSION 2>/dev/null | sed 's/^go//')
if [ -z "$have" ] || [ "$(printf '%s\n%s\n' "$GO_MIN" "$have" | sort -V | head -1)" != "$GO_MIN" ]; then
	echo "k8s-deps: SKIPPED: needs Go >= $GO_MIN to build kube-apiserver and kine (found: ${have:-none})" >&2
	[ -n "${KVD_REQUIRE_GO_PEERS:-}" ] && { echo "k8s-deps: KVD_REQUIRE_GO_PEERS is set: failing" >&2; exit 1; }
	exit 2
fi
out=$KVD_CACHE/k8s-$(cd "$top/test/k8s" && cat go.mod go.sum kine/go.mod kine/go.sum | sha256sum | cut -c1-12)
bins="kube-apiserver kube-controller-manager kube-scheduler kubectl kine"
ok=1
for b in $bins; do [ -x "$out/bin/$b" ] || ok=0; done
if [ $ok = 0 ]; then
	echo "k8s-deps: building Kubernetes $K8S_VERSION's control plane, kubectl and kine v0.17.5 with Go $have into $out" >&2
	mkdir -p "$KVD_CACHE" && rm -rf "$out.tmp" || exit 1
	# /version and the feature gates' emulation version come from these
	v=k8s.io/component-base/version
	ld="-s -w -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=37 -X $v.gitTreeState=clean"
	(cd "$top/test/k8s" && export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0 &&
		for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
			echo "k8s-deps: go build $c" >&2
			"$go" build -trimpath -ldflags "$ld" -o "$out.tmp/bin/$c" k8s.io/kubernetes/cmd/$c || exit 1
		done) &&
	(cd "$top/test/k8s/kine" && export GOTOOLCHAIN=local GOFLAGS=-mod=readonly &&
		echo "k8s-deps: go build kine" >&2 &&
		"$go" build -trimpath -ldflags "-s -w" -o "$out.tmp/bin/kine" github.com/k3s-io/kine) || {
		echo "k8s-deps: the Kubernetes peers did not build" >&2
		exit 1
	}
	mv "$out.tmp" "$out"
fi
# The storage conformance test (test/k8s/*_test.go) is built again whenever
# its source changes (bin/storage.test.src holds the hash it was built from),
# not part of the directory's hash: editing it rebuilds no binary above.
src=$(cd "$top/test/k8s" && for f in $(ls *_test.go 2>/dev/null | LC_ALL=C sort); do echo "$f" && cat "$f"; done | sha256sum | cut -c1-64)
if ls "$top"/test/k8s/*_test.go >/dev/null 2>&1 && { ! [ -x "$out/bin/storage.test" ] || [ "$(cat "$out/bin/storage.test.src" 2>/dev/null)" != "$src" ]; }; then
	echo "k8s-deps: go test -c (the storage conformance test)" >&2
	(cd "$top/test/k8s" && export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0 &&
		"$go" test -c -trimpath -o "$out/bin/storage.test.tmp" .) &&
		echo "$src" >"$out/bin/storage.test.src" && mv "$out/bin/storage.test.tmp" "$out/bin/storage.test" || {
		echo "k8s-deps: the storage conformance test did not build" >&2
		rm -f "$out/bin/storage.test.tmp"
		exit 1
	}
fi
echo "$out/bin"
