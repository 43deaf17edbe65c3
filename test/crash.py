#!/usr/bin/python3
"""Crash safety: kill -9 kvd at random moments under concurrent write load,
with auto-compaction and log rewrites running, restart, and check that every
acknowledged write is there with its revision and that no txn is half
applied.  Real fsync, data dir on a real disk.

  KVD_CRASH_ROUNDS=N (default 8)
Last line: "N passed, N failed".
"""
import os
import random
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import ROOT, Kvd, Client, pb, check, test, run_tests, free_port

KVD = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))
R = pb()["rpc"]
ROUNDS = int(os.environ.get("KVD_CRASH_ROUNDS", "8"))
# compaction and rewrites often, so kills land in the middle of rewrites too
LIFE = ["--auto-compaction-mode", "revision", "--auto-compaction-retention", "100",
        "--auto-compaction-check-interval", "50ms", "--auto-rewrite-percent", "0", "--auto-rewrite-min-bytes", "8192"]


def writer(endpoint, wid, rnd, acked, stop):
    """Txns that put two keys at once; each acked one is recorded with its revision."""
    c = Client(endpoint)
    seq = 0
    while not stop.is_set():
        seq += 1
        a = b"w%d/r%d/%06d/a" % (wid, rnd, seq)
        b = b"w%d/r%d/%06d/b" % (wid, rnd, seq)
        v = b"%d" % seq * random.randint(1, 40)
        t = R.TxnRequest()
        t.success.add().request_put.CopyFrom(R.PutRequest(key=a, value=v))
        t.success.add().request_put.CopyFrom(R.PutRequest(key=b, value=v))
        ans = c.call("Txn", t, timeout=5)
        if ans[0] != "ok":
            break
        acked.append((a, b, v, ans[1].header.revision))
    c.close()


@test
def kill_and_recover():
    d = tempfile.mkdtemp(prefix="kvd-crash-", dir="/var/tmp")
    port = free_port()
    acked_all = []
    max_rev = 1
    rng = random.Random(42)
    rewrites = 0
    for rnd in range(ROUNDS):
        k = Kvd(KVD, data_dir=d, port=port, args=LIFE)
        # everything acknowledged before must still be there, exactly
        c = Client(k.endpoint())
        lost = []
        for a, b, v, rev in acked_all:
            for key in (a, b):
                ans = c.call("Range", R.RangeRequest(key=key))
                if ans[0] != "ok" or len(ans[1].kvs) != 1 or ans[1].kvs[0].value != v or \
                        ans[1].kvs[0].mod_revision != rev:
                    lost.append((key, rev))
        check(not lost, "round %d: %d acknowledged writes lost or changed: %r" % (rnd, len(lost), lost[:3]))
        st = c.call("Range", R.RangeRequest(key=b"w", range_end=b"x"))
        kvs = {kv.key: kv for kv in st[1].kvs} if st[0] == "ok" else {}
        half = [kk for kk in kvs if kk.endswith(b"/a") and (kk[:-1] + b"b") not in kvs] + \
               [kk for kk in kvs if kk.endswith(b"/b") and (kk[:-1] + b"a") not in kvs]
        check(st[0] == "ok" and not half, "round %d: half-applied txns: %r" % (rnd, half[:3]))
        check(all(kvs[kk].mod_revision == kvs[kk[:-1] + b"b"].mod_revision for kk in kvs if kk.endswith(b"/a")
                  and (kk[:-1] + b"b") in kvs), "round %d: a txn's keys share one revision" % rnd)
        rev = c.call("Range", R.RangeRequest(key=b"x"))[1].header.revision
        check(rev >= max_rev, "round %d: revision %d went back (had %d acknowledged)" % (rnd, rev, max_rev))
        c.close()
        # load, then kill -9 at a random moment
        acked, stop = [], threading.Event()
        ws = [threading.Thread(target=writer, args=(k.endpoint(), w, rnd, acked, stop)) for w in range(4)]
        for w in ws:
            w.start()
        time.sleep(rng.uniform(0.1, 0.8))
        k.p.send_signal(signal.SIGKILL)
        k.p.wait()
        k.stop()
        rewrites += k.logtext().count("log rewrite started")
        stop.set()
        for w in ws:
            w.join(10)
        acked_all += acked
        if acked:
            max_rev = max(max_rev, max(a[3] for a in acked))
        print("  round %d: %d txns acknowledged before the kill" % (rnd, len(acked)), flush=True)
    check(len(acked_all) > ROUNDS * 5, "load was applied (%d txns)" % len(acked_all))
    check(rewrites > 0, "log rewrites ran under the load the kills cut (%d started)" % rewrites)
    k = Kvd(KVD, data_dir=d, port=port)
    log = k.logtext()
    k.stop()
    check("log replayed" in log, "final replay: %s" % log[-300:])
    os.system("rm -rf " + d)


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
