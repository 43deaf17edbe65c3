#!/bin/sh
# The big-endian (s390x) build of kvd, run by qemu-user: see make cross.
exec qemu-s390x -L / "$(dirname "$0")/kvd-s390x" "$@"
