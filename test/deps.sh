#!/bin/sh
# test/deps.sh [build|test] - install what is missing from Debian's packages:
# the build dependencies, and with "test" the real peers the tests talk to.
# As root it runs apt-get; otherwise it prints the command and fails.
set -u
BUILD="gcc make libc6-dev libmbedtls-dev libprotobuf-c-dev"
TEST="protobuf-c-compiler protobuf-compiler clang libclang-rt-14-dev etcd-server etcd-client python3 python3-grpcio \
python3-h2 python3-hpack python3-etcd3 python3-protobuf nghttp2-client curl procps"
pkgs=$BUILD
[ "${1:-build}" = test ] && pkgs="$BUILD $TEST"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "deps: installing:$missing"
if [ "$(id -u)" = 0 ]; then
	SUDO=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
	SUDO="sudo"
else
	echo "deps: missing Debian packages; run: sudo apt-get install -y$missing" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || exit 1
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null || exit 1
echo "deps: done"
