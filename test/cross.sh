#!/bin/sh
# test/cross.sh TARGET... - kvd on the CPUs routers and boards use, under
# qemu-user (make cross, make cross-all).  For each target: mbedtls 3.6 (as
# OpenWrt 24.10 ships it) and protobuf-c built from Debian's source
# (test/lib/xlibs.sh), the unit tests (a sampled TLS allocation sweep among them) and
# the daemon linked static, the unit tests run, then the daemon through the
# differential test against etcd (and, on mips, mutual TLS and auth).
# Targets: mips (32-bit big-endian; everything in the MIPS16e compressed ISA,
# as OpenWrt builds for MIPS routers and as make footprint measures it),
# mipsel (the standard ISA), armhf, arm64.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}
CF="-std=c99 -Wall -Wextra -Wshadow -Wundef -Wstrict-prototypes -Wmissing-prototypes -Wpointer-arith -Wwrite-strings -Wformat=2 -ffunction-sections -fdata-sections"
LIBS="-lprotobuf-c -lmbedtls -lmbedx509 -lmbedcrypto"
for t in "$@"; do
	isa=""
	case $t in
	mips) cc=mips-linux-gnu-gcc q=qemu-mips isa="-mips16 -minterlink-compressed" ;;
	mipsel) cc=mipsel-linux-gnu-gcc q=qemu-mipsel ;;
	armhf) cc=arm-linux-gnueabihf-gcc q=qemu-arm ;;
	arm64) cc=aarch64-linux-gnu-gcc q=qemu-aarch64 ;;
	*) echo "cross.sh: unknown target $t"; exit 2 ;;
	esac
	if ! command -v $cc >/dev/null || ! command -v $q >/dev/null; then
		echo "cross $t: SKIPPED ($cc or $q missing; test/lib/deps.sh test installs them)"
		continue
	fi
	# mbedtls 3.6, as OpenWrt 24.10 builds kvd's targets
	X=$t${isa:+-mips16}-mbedtls3.6
	./test/lib/xlibs.sh $X $cc "-O2 $isa" debian 3.6
	X=${KVD_CACHE:-/var/cache/kvd-test}/$X
	echo "== cross $t: unit tests ($q)"
	$cc -O1 -g -Werror $CF $isa -I$X/include -o test/test-$t test/test.c -L$X/lib $LIBS -static
	T_LIFE_PUTS=300000 $q test/test-$t | tail -1 | tee test/cross-$t.log
	grep -q ' 0 failed$' test/cross-$t.log
	echo "== cross $t: the daemon against etcd"
	$cc -O2 $CF $isa -I$X/include -o test/kvd-$t kvd.c -L$X/lib -Wl,--gc-sections $LIBS -static
	KVD=test/lib/kvd-x.sh KVD_X=$t KVD_DIFF_OPS=2000 KVD_DIFF_SEEDS=77 $PY test/diff.py
	if [ $t = mips ]; then
		KVD=test/lib/kvd-x.sh KVD_X=$t $PY test/tls.py grpcio
		KVD=test/lib/kvd-x.sh KVD_X=$t $PY test/auth.py differential
	fi
done
