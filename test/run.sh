#!/bin/sh
# test/run.sh - integration tests with real peers (etcdctl, grpcio, python-h2,
# h2load, nghttp); `make test` runs the unit tests and sanitizers first.
# Each suite is run as test/README.md's convention says (one by hand:
# KVD=./kvd KVD_TEST=./test/kvd-test /usr/bin/python3 test/lock.py [filter]).
set -u
cd "$(dirname "$0")/.." || exit 1
PY=/usr/bin/python3
fail=0
for t in interop abuse malformed diff etcdctl crash enospc lifecycle snapshot etcd37 h2client tls auth http1 gateway lock init memory watchdiff watch leasediff lease confd embed robustness replica; do
	echo "== test/$t.py"
	KVD=./kvd KVD_TEST=./test/kvd-test $PY test/$t.py || fail=1
done
[ $fail = 0 ] && echo "integration: all suites passed" || echo "integration: FAILED"
exit $fail
