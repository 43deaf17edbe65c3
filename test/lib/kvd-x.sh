#!/bin/sh
# test/lib/kvd-x.sh - a cross build of kvd (test/kvd-$KVD_X, static), run by
# qemu-user: see test/cross.sh.  s390x is dynamic, on Debian's multiarch
# libraries.
d=$(dirname "$0")/.. # the binaries are in test/
case ${KVD_X:-s390x} in
mips) exec qemu-mips "$d/kvd-mips" "$@" ;;
mipsel) exec qemu-mipsel "$d/kvd-mipsel" "$@" ;;
armhf) exec qemu-arm "$d/kvd-armhf" "$@" ;;
arm64) exec qemu-aarch64 "$d/kvd-arm64" "$@" ;;
s390x) exec qemu-s390x -L / "$d/kvd-s390x" "$@" ;;
esac
echo "kvd-x.sh: unknown KVD_X=$KVD_X" >&2
exit 2
