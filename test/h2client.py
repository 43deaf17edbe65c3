#!/usr/bin/python3
"""kvd as a gRPC client (kvd.c section 30's client role), against real
servers: etcd 3.7.3 (test/peers, the oracle) and kvd itself.  The client
runs as `test/test --h2c URL FILE` (one JSON line a call; `make test/test`
builds it) and its answers are compared with what etcdctl 3.7.3 sees.

- client_role_against_etcd_3_7_and_kvd: Put, a 200 KiB Put (past the 64
  KiB windows both ways), a Range of the prefix, a Watch that hears a Put,
  a Snapshot saved to a file, an unknown method.  Against each server: the
  Range's keys, value digests and revisions are etcdctl's `get --prefix`;
  the watch event is the key etcdctl reads (value, mod revision); the
  snapshot file is one `etcdutl snapshot status` reads as it reads
  etcdctl's own `snapshot save` (hash, revision, keys); the unknown method
  ends UNIMPLEMENTED.  And etcd's transcript and kvd's are the same, line
  for line.
Last line: "N passed, N failed".
"""
import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
import kvdtest
from kvdtest import ROOT, Etcd, Kvd, check, go_peer, oracle, run_tests, test

KVD = os.environ.get("KVD") or None
TEST_BIN = os.path.join(ROOT, "test", "test")


def ctl37(endpoint, *args, timeout=60):
    r = subprocess.run([go_peer("etcdctl"), "--endpoints", endpoint] + list(args), capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def status37(path):
    r = subprocess.run([go_peer("etcdutl"), "snapshot", "status", path, "-w", "json"], capture_output=True,
                       text=True, timeout=60)
    if r.returncode:
        return {"error": r.stderr[-300:]}
    s = json.loads(r.stdout)
    return {k: s[k] for k in ("hash", "revision", "totalKey")}


def client_run(url, snapfile):
    """test/test --h2c: its lines, parsed, and its exit status."""
    r = subprocess.run([TEST_BIN, "--h2c", url, snapfile], capture_output=True, text=True, timeout=120)
    lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    return r.returncode, lines, r.stderr


def against(name, url, endpoint, tmp):
    """The client against one server; its transcript."""
    snap = os.path.join(tmp, name + "-client.db")
    rc, lines, err = client_run(url, snap)
    check(rc == 0, "%s: the client's calls all answered (%s)" % (name, err[-300:]))
    steps = [l["step"] for l in lines]
    check(steps == ["put", "put", "range", "range", "watch", "watch", "snapshot", "unknown"], "%s: %s" % (name, steps))
    by = {}
    for l in lines:
        by.setdefault(l["step"], []).append(l)
    # the Range: what etcdctl reads
    rc, out, _ = ctl37(endpoint, "get", "--prefix", "h2c/", "-w", "json")
    kvs = json.loads(out).get("kvs", []) if rc == 0 else []
    want = [{"step": "range", "key": base64.b64decode(kv["key"]).hex(),
             "value_sha256": hashlib.sha256(base64.b64decode(kv.get("value", ""))).hexdigest(),
             "len": len(base64.b64decode(kv.get("value", ""))), "create": kv["create_revision"],
             "mod": kv["mod_revision"], "version": kv["version"]} for kv in kvs if kv["key"] != base64.b64encode(b"h2c/w").decode()]
    check(by.get("range") == want, "%s: the Range is etcdctl's get --prefix: %s vs %s" % (name, by.get("range"), want))
    check(len(want) == 2 and want[1]["len"] == 200000, "%s: both keys, the 200 KiB value whole" % name)
    # the Watch event: the key as etcdctl reads it
    rc, out, _ = ctl37(endpoint, "get", "h2c/w", "-w", "json")
    kv = json.loads(out)["kvs"][0] if rc == 0 else {}
    ev = by.get("watch", [{}, {}])[-1]
    check(ev.get("type") == 0 and ev.get("key") == "h2c/w" and ev.get("value") == base64.b64decode(kv.get("value", "")).decode()
          and ev.get("mod") == kv.get("mod_revision"), "%s: watch event %s vs etcdctl's %s" % (name, ev, kv))
    # the Snapshot: etcdutl reads it as it reads etcdctl's own
    theirs = os.path.join(tmp, name + "-etcdctl.db")
    rc, _, err = ctl37(endpoint, "snapshot", "save", theirs)
    check(rc == 0, "%s: etcdctl snapshot save: %s" % (name, err[-300:]))
    a, b = status37(snap), status37(theirs)
    check("error" not in a and a == b, "%s: snapshot status, the client's %s vs etcdctl's %s" % (name, a, b))
    check(a.get("totalKey") == 3, "%s: three keys in the snapshot: %s" % (name, a))
    u = by.get("unknown", [{}])[0]
    check(u.get("code") == 12, "%s: an unknown method ends UNIMPLEMENTED: %s" % (name, u))
    return lines


@test
def client_role_against_etcd_3_7_and_kvd():
    """kvd's client role against etcd 3.7.3 and against kvd: the answers are
    what etcdctl 3.7.3 sees, and the two transcripts are the same."""
    oracle()  # Skipped without the etcd 3.7.3 peers (a failure in CI)
    check(os.access(TEST_BIN, os.X_OK), "test/test is built (make test/test)")
    tmp = tempfile.mkdtemp(prefix="h2client-")
    e = Etcd()
    try:
        el = against("etcd", e.url, e.endpoint(), tmp)
    finally:
        e.stop()
    k = Kvd(binary=KVD)
    try:
        kl = against("kvd", k.url, k.endpoint(), tmp)
    finally:
        k.stop()
    for l in el + kl:  # the snapshot's message count is each server's own chunking
        l.pop("messages", None)
    check(el == kl, "etcd's transcript and kvd's: %s vs %s" % (el, kl))
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
