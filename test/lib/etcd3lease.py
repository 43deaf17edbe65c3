#!/usr/bin/python3
"""python3-etcd3 0.12 leases and locks against kvd on 127.0.0.1:PORT (run
by test/lease.py in its own process: python3-etcd3 brings its own generated
etcd protobuf modules).  Prints one "CHECK ok|FAIL what" line per check."""
import sys
import time

import etcd3


def check(cond, what):
    print("CHECK %s %s" % ("ok" if cond else "FAIL", what), flush=True)


def main(port):
    c = etcd3.client(port=port)
    lease = c.lease(30)
    check(lease.id > 0 and lease.granted_ttl == 30, "lease granted: %r %r" % (lease.id, lease.granted_ttl))
    c.put("/l/a", "1", lease=lease)
    c.put("/l/b", "2", lease=lease)
    check(sorted(lease.keys) == [b"/l/a", b"/l/b"], "lease keys: %r" % lease.keys)
    check(28 <= lease.remaining_ttl <= 30, "remaining ttl %r" % lease.remaining_ttl)
    r = lease.refresh()
    check(r[0].TTL == 30, "refresh: %r" % r)
    v, meta = c.get("/l/a")
    check(v == b"1" and meta.lease_id == lease.id, "key carries the lease")
    lease.revoke()
    check(c.get("/l/a")[0] is None and c.get("/l/b")[0] is None, "revoke deleted the keys")
    t0 = time.monotonic()
    short = c.lease(2)
    c.put("/l/short", "x", lease=short)
    while c.get("/l/short")[0] is not None and time.monotonic() - t0 < 60:
        time.sleep(0.05)
    took = time.monotonic() - t0
    # never early (expiry is semantics); how late is the machine's business
    check(c.get("/l/short")[0] is None and took >= 2, "a 2 s lease expired with its key after %.2f s" % took)

    # locks: mutual exclusion between two clients, then hand-over
    c2 = etcd3.client(port=port)
    l1 = c.lock("res", ttl=10)
    l2 = c2.lock("res", ttl=10)
    check(l1.acquire(timeout=5), "first lock acquired")
    check(l1.is_acquired(), "is_acquired")
    # A waiting acquire() is broken in Debian's python3-etcd3 0.12 with
    # tenacity 8 (its wait callback has the old signature; the same TypeError
    # against etcd), so the contender polls with timeout=0, which never waits.
    check(l2.acquire(timeout=0) is False, "second is refused while the first holds it")
    check(l1.refresh() and l2.acquire(timeout=0) is False, "still refused after the holder refreshes")
    l1.release()
    check(l2.acquire(timeout=0) is True, "second acquired after the release")
    check(not l1.is_acquired() and l2.is_acquired(), "holder changed")
    l2.release()
    with c.lock("other", ttl=5) as lk:
        check(lk.is_acquired(), "lock as a context manager")
    print("DONE", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
