#!/bin/sh
# test/footprint.sh - the README's footprint table: kvd static on musl for
# x86_64, mips (the standard ISA and MIPS16e) and armhf, TLS on and off, confd on and off, stripped, with
# mbedtls 3.6 configured small (test/lib/xlibs.sh) and, for x86_64, 2.28 small and
# with Debian's configuration too; and the idle RSS of the x86_64 one.  musl for mips and armhf is built from Debian's
# source with the cross compilers (once, in $KVD_CACHE, /var/cache/kvd-test); each binary
# is run once (qemu-user for the others) to show it starts.
set -eu
cd "$(dirname "$0")/.."
top=${KVD_CACHE:-/var/cache/kvd-test}
out=${FOOTPRINT_DIR:-/tmp/kvd-footprint}
mkdir -p "$out"
musl_for() { # $1 = target, $2 = cross gcc: a musl-gcc wrapper around it
	t=$1 cc=$2 p=$top/muslcc-$1
	[ -x "$p/bin/musl-gcc" ] && return 0
	./test/lib/xlibs.sh --sources # Debian's source packages, musl's among them
	src=${MUSL_SRC:-$top/src/musl-1.2.3}/
	b=$(mktemp -d)
	cp -r "$src" "$b/musl"
	echo "footprint: musl for $t"
	(cd "$b/musl" && ./configure -q --prefix="$p" --target="${cc%-gcc}" CROSS_COMPILE="${cc%gcc}" CC="$cc" \
		--disable-shared --enable-wrapper=gcc >/dev/null && make -s -j2 >/dev/null 2>&1 && make -s install >/dev/null)
	rm -rf "$b"
}
command -v musl-gcc >/dev/null || ./test/lib/deps.sh test
musl_for mips mips-linux-gnu-gcc
musl_for armhf arm-linux-gnueabihf-gcc
printf '| target | mbedtls | TLS | confd | left out | stripped bytes |\n|---|---|---|---|---|---|\n' > "$out/table.md"
LEAN="RECIPES=0 AUTH=0 JWT=0 SNAPSHOT=0 HTTP=0" # every part a firmware may leave out
# mips and armhf with mbedtls 3.6 (OpenWrt 24.10's); x86_64 with 3.6 and 2.28
for t in x86_64 mips mips16 armhf; do
	isa=""
	case $t in
	x86_64) mcc=musl-gcc run="" vers="3.6 2.28" ;;
	mips) mcc=$top/muslcc-mips/bin/musl-gcc run=qemu-mips vers=3.6 ;;
	mips16) mcc=$top/muslcc-mips/bin/musl-gcc run=qemu-mips vers=3.6 isa=MIPS16=1 ;;
	armhf) mcc=$top/muslcc-armhf/bin/musl-gcc run=qemu-arm vers=3.6 ;;
	esac
	for ver in $vers; do for prof in small debian; do
		[ $prof = debian ] && { [ $t != x86_64 ] || [ $ver != 2.28 ]; } && continue
		for tls in 1 0; do for confd in 1 0; do for lean in 0 1; do
			[ $tls = 0 ] && [ $ver != ${vers%% *} ] && continue # no TLS: the mbedtls version hardly matters
			# the knobs: with everything else, and with nothing else
			[ $lean = 1 ] && { [ $prof != small ] || [ $ver != ${vers%% *} ] || [ $tls != $confd ]; } && continue
			knobs="" sfx=""
			if [ $lean = 1 ]; then knobs=$LEAN sfx=-lean; fi
			make -s -B kvd-static MUSL_CC=$mcc $isa MBEDTLS_PROFILE=$prof MBEDTLS_VERSION=$ver TLS=$tls CONFD=$confd \
				$knobs >/dev/null
			f=$out/kvd-$t-$ver-$prof-tls$tls-confd$confd$sfx
			mv kvd-static "$f"
			$run "$f" --version | grep -q "etcd API" # it starts
			printf '| %s | %s %s | %s | %s | %s | %s |\n' $t $ver $prof "$([ $tls = 1 ] && echo on || echo off)" \
				"$([ $confd = 1 ] && echo on || echo off)" "${knobs:--}" \
				"$(wc -c < "$f")" >> "$out/table.md"
		done; done; done
	done; done
done
# idle RSS: the x86_64 binary with everything, and with every knob, serving, nothing asked yet
for v in tls1-confd1 tls0-confd0-lean; do
	d=$(mktemp -d)
	"$out/kvd-x86_64-3.6-small-$v" --data-dir "$d/data" --listen-client-urls http://127.0.0.1:0 2> "$d/log" &
	pid=$!
	n=0
	until grep -q "serving client requests" "$d/log"; do n=$((n + 1)); [ $n -lt 600 ] || break; sleep 0.1; done
	rss=$(awk '/^VmRSS/ {print $2}' /proc/$pid/status)
	kill $pid; wait $pid || true
	rm -rf "$d"
	echo "idle RSS (x86_64 static, $v): $rss KiB" >> "$out/table.md"
done
cat "$out/table.md"
