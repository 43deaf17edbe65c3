#!/usr/bin/python3
"""kvd beside etcd 3.7.3 -- the etcd people run today -- through its own
tools, built from test/peers (go.mod and go.sum pin etcd, etcdctl and
etcdutl v3.7.3; test/deps.sh builds them once per machine, outside the
tree).  Without Go >= 1.26 every test here says SKIPPED; with
KVD_REQUIRE_GO_PEERS set (CI) that is a failure.

- snapshots_with_etcdutl_3_7: a kvd store (the differential generator's
  history, leases, a compaction) saved by etcdctl 3.7, read by etcdutl 3.7
  `snapshot status` and restored by `etcdutl snapshot restore`; etcd 3.7
  serves every key, lease and HashKV at past revisions as kvd does.  The
  other way: etcd 3.7's own snapshot imported by `kvd --restore-snapshot`,
  the same store.
Last line: "N passed, N failed".
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvdtest
from kvdtest import Client, Kvd, check, go_peer, go_peers_or_skip, run_tests, test
import snapshot  # its store generator and comparisons
del kvdtest._tests[:]  # its tests are its own to run

KVD = os.environ.get("KVD") or None


def ctl37(*args, timeout=120):
    """etcdctl 3.7.3 (it has no ETCDCTL_API: v3 only)."""
    r = subprocess.run([go_peer("etcdctl")] + list(args), capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def utl37(*args, timeout=120):
    """etcdutl 3.7.3 (snapshot status and restore moved there from etcdctl)."""
    r = subprocess.run([go_peer("etcdutl")] + list(args), capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


@test
def snapshots_with_etcdutl_3_7():
    if not go_peers_or_skip("snapshots_with_etcdutl_3_7"):
        return
    rnd = random.Random(7)
    d = tempfile.mkdtemp(prefix="kvd-37-")
    k = Kvd(KVD)
    ck, g = snapshot.build_store(k, 37)
    path = os.path.join(d, "kvd.db")
    rc, out, err = ctl37("--endpoints", k.endpoint(), "snapshot", "save", path)
    check(rc == 0 and "Snapshot saved" in out, "etcdctl 3.7.3 snapshot save from kvd: %s %s" % (out[-200:], err[-300:]))
    rc, out, err = utl37("snapshot", "status", path, "-w", "json")
    st = json.loads(out) if rc == 0 else {}
    want = snapshot.all_kvs(ck)
    check(rc == 0 and st.get("revision") == want[2] and st.get("totalKey", 0) > 0,
          "etcdutl 3.7.3 snapshot status reads it: revision %s (kvd %s): %s %s" % (st.get("revision"), want[2],
                                                                                 out[-200:], err[-200:]))
    r = snapshot.Restored(path, restore=[go_peer("etcdutl")], etcd=go_peer("etcd"))
    check(r.restore_rc == 0, "etcdutl 3.7.3 snapshot restore takes it: %s" % r.restore_err[-300:])
    if r.p:
        cr = Client(r.endpoint())
        snapshot.same_store(ck, cr, g, "kvd -> etcdutl 3.7 -> etcd 3.7", rnd)
        # and back: etcd 3.7's own snapshot of that store, imported by kvd
        back = os.path.join(d, "etcd37.db")
        rc, out, err = ctl37("--endpoints", r.endpoint(), "snapshot", "save", back)
        check(rc == 0, "etcdctl 3.7.3 snapshot save from etcd 3.7.3: %s" % err[-300:])
        k2 = Kvd(KVD, data_dir=os.path.join(d, "k2"), args=["--restore-snapshot", back])
        c2 = Client(k2.endpoint())
        snapshot.same_store(cr, c2, g, "etcd 3.7 -> kvd", rnd)
        a = c2.call("Put", kvdtest.pb()["rpc"].PutRequest(key=b"after", value=b"x"))
        check(a[0] == "ok" and a[1].header.revision == want[2] + 1, "writes go on at the next revision: %r" % (a,))
        c2.close()
        k2.stop()
        cr.close()
    r.stop()
    ck.close()
    k.stop()
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
