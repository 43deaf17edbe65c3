#!/bin/sh
# test/lib/deps.sh [build|test] - install what is missing from Debian's packages:
# the build dependencies, and with "test" the real peers the tests talk to
# (Debian's, and etcd 3.7.3's built with Go from test/peers, pinned),
# then (best effort) the cross toolchains, qemu-user and musl for `make cross`
# and `make static` (with "cross-all", those of `make cross-all` too).
# As root it runs apt-get; otherwise it prints the command and fails.
set -u
BUILD="gcc make libc6-dev libmbedtls-dev libprotobuf-c-dev"
TEST="protobuf-c-compiler protobuf-compiler clang libclang-rt-14-dev etcd-server etcd-client python3 python3-grpcio \
python3-h2 python3-hpack python3-etcd3 python3-protobuf nghttp2-client curl procps \
ganeti-haskell-3.0 python3-simplejson python3-openssl python3-bitarray python3-bcrypt netcat-openbsd openssl \
python3-prometheus-client faketime btrfs-progs busybox libev-dev libuv1-dev libsystemd-dev"
# Ganeti's Python confd client: the ganeti-3.0 package unpacked (installing
# it would pull in openssh-server, lvm2 and 20 more packages it does not need)
GANETI_LIB=/var/cache/kvd-test/ganeti-3.0
# make cross: i386 on Debian's multiarch libraries; mips and armhf static on
# mbedtls and protobuf-c built from Debian's source (test/lib/xlibs.sh: curl, patch);
# musl-tools for make static.  make cross-all adds the rest (CROSS_ALL).
CROSS="gcc-i686-linux-gnu libc6-dev-i386-cross libprotobuf-c-dev:i386 libmbedtls-dev:i386 qemu-user curl patch \
gcc-mips-linux-gnu libc6-dev-mips-cross gcc-arm-linux-gnueabihf libc6-dev-armhf-cross musl-tools"
CROSS_ALL="gcc-mipsel-linux-gnu libc6-dev-mipsel-cross gcc-aarch64-linux-gnu libc6-dev-arm64-cross \
gcc-s390x-linux-gnu libc6-dev-s390x-cross libprotobuf-c-dev:s390x libmbedtls-dev:s390x"

missing() {
	m=""
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || m="$m $p"
	done
	echo "$m"
}

need=$(missing $BUILD)
[ "${1:-build}" = test ] && need="$need$(missing $TEST)"
cross=""
[ "${1:-build}" = test ] && cross=$(missing $CROSS)
[ "${1:-build}" = cross-all ] && cross=$(missing $CROSS $CROSS_ALL)
# The Go test peers (test/peers: etcd, etcdctl and etcdutl 3.7.3, pinned by
# its go.mod and go.sum), built once per machine into
# $KVD_CACHE/go-peers-<hash of go.mod and go.sum>/bin, outside the tree.
# Beside them, recipes (test/peers/recipes: clientv3 3.7's recipes, for
# etcd37.py), built again whenever its source changes: bin/recipes.src holds
# the hash of the source it was built from (recipes_src; etcd37.py computes
# the same to refuse a stale binary).  Its source is not in the directory's
# hash so that editing it does not rebuild etcd, etcdctl and etcdutl (the
# slow part) nor move the directory kvdtest.go_peer() finds them in.  The
# robustness harness (test/robust, its own module: etcd 3.7.3's robustness
# checkers and porcupine) is built beside them the same way.
# Go comes from PATH or /usr/local/go; without Go >= GO_MIN the suites that
# need the peers say SKIPPED -- unless KVD_REQUIRE_GO_PEERS is set (CI), when
# that is a failure.
GO_MIN=1.26.0
KVD_CACHE=${KVD_CACHE:-/var/cache/kvd-test}
recipes_src() { # the paths and contents of test/peers/recipes/*.go, hashed
	(cd "$1/test/peers" && for f in $(find recipes -type f -name '*.go' | LC_ALL=C sort); do
		echo "$f" && cat "$f"
	done) | sha256sum | cut -c1-64
}
go_peers() {
	[ "${1:-build}" = test ] || return 0
	top=$(cd "$(dirname "$0")/../.." && pwd)
	go=$(command -v go || true)
	[ -z "$go" ] && [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go
	have=$([ -n "$go" ] && "$go" env GOVERSION 2>/dev/null | sed 's/^go//')
	if [ -z "$have" ] || [ "$(printf '%s\n%s\n' "$GO_MIN" "$have" | sort -V | head -1)" != "$GO_MIN" ]; then
		echo "deps: SKIPPED: needs Go >= $GO_MIN for the etcd 3.7.3 test peers (found: ${have:-none})"
		[ -n "${KVD_REQUIRE_GO_PEERS:-}" ] && { echo "deps: KVD_REQUIRE_GO_PEERS is set: failing" >&2; exit 1; }
		return 0
	fi
	out=$KVD_CACHE/go-peers-$(cat "$top/test/peers/go.mod" "$top/test/peers/go.sum" | sha256sum | cut -c1-12)
	if ! [ -x "$out/bin/etcd" ] || ! [ -x "$out/bin/etcdctl" ] || ! [ -x "$out/bin/etcdutl" ]; then
		echo "deps: building the Go test peers (etcd, etcdctl, etcdutl 3.7.3) with Go $have into $out"
		mkdir -p "$KVD_CACHE" && rm -rf "$out.tmp" || exit 1
		(cd "$top/test/peers" && export GOTOOLCHAIN=local GOFLAGS=-mod=readonly &&
			"$go" build -trimpath -o "$out.tmp/bin/etcd" go.etcd.io/etcd/server/v3 &&
			"$go" build -trimpath -o "$out.tmp/bin/etcdctl" go.etcd.io/etcd/etcdctl/v3 &&
			"$go" build -trimpath -o "$out.tmp/bin/etcdutl" go.etcd.io/etcd/etcdutl/v3) || {
			echo "deps: the Go test peers did not build" >&2
			exit 1
		}
		mv "$out.tmp" "$out"
	fi
	go_program recipes "$top/test/peers" ./recipes "$(recipes_src "$top")" "the clientv3 3.7.3 recipes program"
	go_program robust "$top/test/robust" . "$(robust_src "$top")" "the robustness harness (etcd 3.7.3's checkers)"
}
robust_src() { # test/robust: its own module (go.etcd.io/etcd/tests/v3 v3.7.3, porcupine)
	(cd "$1/test/robust" && for f in go.mod go.sum $(ls *.go | LC_ALL=C sort); do
		echo "$f" && cat "$f"
	done) | sha256sum | cut -c1-64
}
# go_program NAME DIR PKG SRC-HASH WHAT: $out/bin/NAME, built again when the
# hash of its source (in $out/bin/NAME.src) changed
go_program() {
	[ -n "$4" ] || exit 1
	[ -x "$out/bin/$1" ] && [ "$(cat "$out/bin/$1.src" 2>/dev/null)" = "$4" ] && return 0
	echo "deps: building $5 into $out/bin"
	(cd "$2" && export GOTOOLCHAIN=local GOFLAGS=-mod=readonly &&
		"$go" build -trimpath -o "$out/bin/$1.tmp" "$3") &&
		echo "$4" >"$out/bin/$1.src.tmp" &&
		mv "$out/bin/$1.tmp" "$out/bin/$1" && mv "$out/bin/$1.src.tmp" "$out/bin/$1.src" || {
		echo "deps: $5 did not build" >&2
		rm -f "$out/bin/$1.tmp" "$out/bin/$1.src.tmp"
		exit 1
	}
}

ganeti_lib() {
	[ "${1:-build}" = test ] || return 0
	[ -d /usr/share/ganeti/3.0/ganeti ] || [ -d $GANETI_LIB/usr/share/ganeti/3.0/ganeti ] && return 0
	d=$(mktemp -d) && (cd "$d" && apt-get download ganeti-3.0 >/dev/null 2>&1 && mkdir -p $GANETI_LIB &&
		dpkg -x ganeti-3.0_*.deb $GANETI_LIB) || echo "deps: could not unpack ganeti-3.0 (confd client tests will fail)"
	rm -rf "$d"
}
[ -z "$need$cross" ] && { ganeti_lib "${1:-build}"; go_peers "${1:-build}"; exit 0; }
if [ "$(id -u)" = 0 ]; then
	SUDO=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
	SUDO="sudo"
else
	echo "deps: missing Debian packages; run: sudo apt-get install -y$need$cross" >&2
	[ -n "$need" ] && exit 1
	exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if [ -n "$cross" ]; then
	for arch in i386 s390x; do # only these come from multiarch
		dpkg --print-foreign-architectures | grep -qx $arch || $SUDO dpkg --add-architecture $arch
	done
fi
# a mirror mid-sync fails one index now and then: retry, then go on with what we have
$SUDO apt-get update -qq || { sleep 5; $SUDO apt-get update -qq; } || echo "deps: apt-get update had errors"
if [ -n "$need" ]; then
	echo "deps: installing:$need"
	$SUDO apt-get install -y -qq --no-install-recommends $need >/dev/null || exit 1
fi
if [ -n "$cross" ]; then
	# multiarch needs the foreign libc at the host's exact version; a lagging
	# mirror can refuse that, so cross toolchains never fail the install
	echo "deps: installing (best effort):$cross"
	$SUDO apt-get install -y -qq --no-install-recommends $cross >/dev/null ||
		echo "deps: cross toolchains unavailable: make cross will say SKIPPED"
fi
ganeti_lib "${1:-build}"
go_peers "${1:-build}"
echo "deps: done"
