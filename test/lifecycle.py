#!/usr/bin/python3
"""The store's lifecycle on a real disk: Defragment as an online log rewrite
(clients keep going, watchers and RangeStreams cross the switch), kill -9 at
every point of a rewrite, the automatic rewrite keeping the data dir bounded,
auto-compaction as etcd 3.4 does it, and quota/alarms side by side with etcd.

Last line: "N passed, N failed".
"""
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import ROOT, Kvd, Etcd, Client, WatchStream, pb, check, test, run_tests, free_port, etcdctl, wait_for

KVD = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))
KVD_TEST = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))
R = pb()["rpc"]
DISK = "/var/tmp"  # a real disk: fsync means something


def status(c):
    return c.call("Status", R.StatusRequest(), service="etcdserverpb.Maintenance", resp="StatusResponse")


def defrag(c, timeout=120):
    return c.call("Defragment", R.DefragmentRequest(), service="etcdserverpb.Maintenance",
                  resp="DefragmentResponse", timeout=timeout)


def alarm(c, action, member=0, typ=0):
    return c.call("Alarm", R.AlarmRequest(action=action, memberID=member, alarm=typ),
                  service="etcdserverpb.Maintenance", resp="AlarmResponse")


def bulk(c, prefix, n, vsize, rounds):
    """rounds x n keys of vsize bytes, 100 puts per txn: history to rewrite."""
    for r in range(rounds):
        for base in range(0, n, 100):
            t = R.TxnRequest()
            for i in range(base, min(n, base + 100)):
                t.success.add().request_put.CopyFrom(
                    R.PutRequest(key=b"%s%05d" % (prefix, i), value=bytes([97 + r % 26]) * vsize))
            ans = c.call("Txn", t, timeout=30)
            if ans[0] != "ok":
                return ans
    return ("ok",)


class Writer(threading.Thread):
    """Puts w<seq> until stopped; every acknowledged one is kept with its
    revision and how long it took."""

    def __init__(self, endpoint, prefix=b"w"):
        super().__init__(daemon=True)
        self.c = Client(endpoint)
        self.prefix = prefix
        self.acked = []
        self.lat = []
        self.errors = []
        self.stop_ev = threading.Event()

    def run(self):
        seq = 0
        while not self.stop_ev.is_set():
            seq += 1
            key = b"%s%06d" % (self.prefix, seq)
            t0 = time.time()
            ans = self.c.call("Put", R.PutRequest(key=key, value=b"v%d" % seq), timeout=10)
            if ans[0] != "ok":
                self.errors.append(ans)
                if len(self.errors) > 3:
                    return
                continue
            self.lat.append(time.time() - t0)
            self.acked.append((key, b"v%d" % seq, ans[1].header.revision))

    def stop(self):
        self.stop_ev.set()
        self.join(30)
        self.c.close()


def lost_writes(c, acked):
    bad = []
    for key, v, rev in acked:
        ans = c.call("Range", R.RangeRequest(key=key))
        if ans[0] != "ok" or len(ans[1].kvs) != 1 or ans[1].kvs[0].value != v or ans[1].kvs[0].mod_revision != rev:
            bad.append((key, rev))
    return bad


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] * 1000 if xs else 0.0


def watch_revs(ws):
    return [e.kv.mod_revision for r in ws.got for e in r.events]


@test
def defragment_online():
    d = tempfile.mkdtemp(prefix="kvd-life-", dir=DISK)
    k = Kvd(KVD, data_dir=d, args=["--auto-rewrite=false"])
    c = Client(k.endpoint())
    check(bulk(c, b"h", 1000, 2048, 6)[0] == "ok", "6 x 1000 keys of 2 KiB written")
    rev = status(c)[1].header.revision
    check(c.call("Compact", R.CompactionRequest(revision=rev - 1))[0] == "ok", "compacted")
    st0 = status(c)[1]
    w = Writer(k.endpoint())
    w.start()
    check(wait_for(lambda: len(w.acked) > 20, 30), "writer going")
    w1 = WatchStream(k.endpoint())  # from the compacted revision: catch-up crosses the switch
    w1.create(key=b"w", range_end=b"x", start_revision=rev - 1)
    result = {}
    th = threading.Thread(target=lambda: result.update(d=defrag(c)))
    th.start()
    # while it runs: a pinned RangeStream, a new watcher, and the writer
    pinned = status(c)[1].header.revision
    rs = c.stream("RangeStream", R.RangeRequest(key=b"h", range_end=b"i", revision=pinned),
                  "RangeStreamResponse", timeout=60)
    w2 = WatchStream(k.endpoint())
    w2.create(key=b"w", range_end=b"x", start_revision=rev)
    th.join(180)
    during = len(w.acked)
    check(wait_for(lambda: len(w.acked) > during + 20, 30), "writes go on after the switch")
    w.stop()
    check(result.get("d", ("none",))[0] == "ok", "Defragment answered OK: %r" % (result.get("d"),))
    check("log rewritten:" in k.logtext(), "the rewrite says what it did")
    st1 = status(c)[1]
    check(st1.dbSize < st0.dbSize / 3, "the log shrank: %d -> %d bytes" % (st0.dbSize, st1.dbSize))
    check(not w.errors, "no write failed during the rewrite: %r" % w.errors[:2])
    print("  Put latency, %d puts during/around the rewrite: p50 %.2f ms, p99 %.2f ms, max %.1f ms" %
          (len(w.lat), pct(w.lat, 0.5), pct(w.lat, 0.99), max(w.lat) * 1000))
    # the RangeStream read one revision, as a Range at that revision does
    ans = c.call("Range", R.RangeRequest(key=b"h", range_end=b"i", revision=pinned))
    got = [kv for m in rs[1] for kv in m.range_response.kvs] if rs[0] == "ok" else None
    check(got is not None and [(x.key, x.mod_revision, x.value) for x in got] ==
          [(x.key, x.mod_revision, x.value) for x in ans[1].kvs] and len(got) == 1000,
          "RangeStream across the switch: %s" % (rs[0] if rs[0] != "ok" else len(got)))
    # watchers: every write once, in order
    last = w.acked[-1][2]
    want = [r for _, _, r in w.acked]
    for name, ws in (("from the compacted revision", w1), ("created during the rewrite", w2)):
        check(wait_for(lambda: watch_revs(ws) and watch_revs(ws)[-1] >= last, 60), "watcher %s caught up" % name)
        got = watch_revs(ws)
        check(got == want, "watcher %s: every write once, in order (%d events, %d writes)" %
              (name, len(got), len(want)))
        ws.close()
    check(not lost_writes(c, w.acked), "every acknowledged write is there")
    c.close()
    check(k.stop() == 0, "clean exit")
    k = Kvd(KVD, data_dir=d, args=["--auto-rewrite=false"])
    c = Client(k.endpoint())
    check(not lost_writes(c, w.acked), "after a restart too")
    ans = c.call("Range", R.RangeRequest(key=b"h00850", revision=rev - 1))
    check(ans[0] == "ok" and len(ans[1].kvs) == 1 and ans[1].kvs[0].mod_revision == rev - 1 and
          ans[1].kvs[0].value == b"f" * 2048, "the compacted revision still reads")
    ans = c.call("Range", R.RangeRequest(key=b"h00007", revision=rev - 2))
    check(ans[0] == "err" and ans[1] == "OUT_OF_RANGE", "below it: compacted, as before")
    ans = etcdctl(k, "defrag")
    check(ans[0] == 0 and "Finished defragmenting etcd member[" in ans[1], "etcdctl defrag: %r" % (ans,))
    c.close()
    k.stop()
    subprocess.run(["rm", "-rf", d])


POINTS = ["slice:1", "slice:3", "slice:6", "synced", "renamed", "dirsynced", "switched"]


@test
def kill_at_every_point():
    """kill -9 at each point of a rewrite (test build), restart the plain build:
    every acknowledged write is there once, a partial file is cleaned up.
    [§13.1]"""
    for point in POINTS:
        d = tempfile.mkdtemp(prefix="kvd-rwcrash-", dir=DISK)
        os.environ["KVD_TEST_REWRITE_CRASH"] = point
        try:
            k = Kvd(KVD_TEST, data_dir=d, args=["--auto-rewrite=false"])
        finally:
            del os.environ["KVD_TEST_REWRITE_CRASH"]
        c = Client(k.endpoint())
        bulk(c, b"h", 1000, 1024, 3)
        rev = status(c)[1].header.revision
        c.call("Compact", R.CompactionRequest(revision=rev - 1))
        w = Writer(k.endpoint())
        w.start()
        wait_for(lambda: len(w.acked) > 10, 30)
        ans = defrag(c)
        died = wait_for(lambda: not k.alive(), 60)
        w.stop()
        c.close()
        check(died and k.p.returncode == -9, "%s: killed there (%r, %r)" % (point, k.p.returncode, ans))
        k.stop()
        partial = os.path.exists(os.path.join(d, "kvd.log.new"))
        k = Kvd(KVD, data_dir=d, args=["--auto-rewrite=false"])
        c = Client(k.endpoint())
        bad = lost_writes(c, w.acked)
        check(not bad, "%s: every acknowledged write once, at its revision (%d acked; lost %r)" %
              (point, len(w.acked), bad[:3]))
        ans = c.call("Range", R.RangeRequest(key=b"h", range_end=b"i", count_only=True))
        check(ans[0] == "ok" and ans[1].count == 1000, "%s: the bulk keys" % point)
        ans = c.call("Compact", R.CompactionRequest(revision=rev - 1))
        check(ans[0] == "err" and ans[1] == "OUT_OF_RANGE", "%s: the compaction point kept" % point)
        check(not os.path.exists(os.path.join(d, "kvd.log.new")), "%s: no partial file left" % point)
        removed = "a log rewrite that did not finish" in k.logtext()
        check(removed == partial, "%s: a partial file is removed with one log line (partial %s)" % (point, partial))
        ans = defrag(c)  # and a rewrite works from there
        check(ans[0] == "ok" and not lost_writes(c, w.acked), "%s: a rewrite after the restart" % point)
        c.close()
        k.stop()
        subprocess.run(["rm", "-rf", d])


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
               if f.startswith("kvd.log") and os.path.exists(os.path.join(d, f)))


@test
def automatic_rewrite_bounds_the_disk():
    d = tempfile.mkdtemp(prefix="kvd-auto-", dir=DISK)
    k = Kvd(KVD, data_dir=d, args=["--auto-rewrite-percent", "0", "--auto-rewrite-min-bytes", "262144"])
    c = Client(k.endpoint())
    peak, ok = 0, True
    # 400 txns of 10 keys x 1 KiB over 100 keys: 4 MB of writes for ~100 KB live.
    # Small txns from one serial client: what arrives while a rewrite runs (a
    # few loop iterations) stays small beside the bound.
    for r in range(400):
        t = R.TxnRequest()
        for i in range(10):
            t.success.add().request_put.CopyFrom(R.PutRequest(key=b"a%03d" % ((r * 10 + i) % 100),
                                                              value=bytes([97 + r % 26]) * 1024))
        ans = c.call("Txn", t)
        ok = ok and ans[0] == "ok"
        if ans[0] == "ok":  # the history of the last txn is kept, as a compactor would
            c.call("Compact", R.CompactionRequest(revision=ans[1].header.revision))
        peak = max(peak, dir_bytes(d))
    check(ok, "every txn applied")
    check(wait_for(lambda: k.logtext().count("log rewritten:") >= 5, 60), "rewrites ran on their own: %d" %
          k.logtext().count("log rewritten:"))
    live = 100 * (1024 + 30)
    check(peak <= 2 * live + 262144 + 150000, "data dir peak %d bytes for %d live bytes" % (peak, live))
    print("  data dir peak %d bytes for %d live bytes (bound %d)" % (peak, live, 2 * live + 262144 + 150000))
    ans = c.call("Range", R.RangeRequest(key=b"a", range_end=b"b"))
    want = [bytes([97 + (390 + j // 10) % 26]) * 1024 for j in range(100)]
    check(ans[0] == "ok" and [kv.value for kv in ans[1].kvs] == want, "the latest values")
    c.close()
    k.stop()
    subprocess.run(["rm", "-rf", d])


def disk_counters(port):
    """kvd_disk_written_bytes_total, kvd_disk_syncs_total (by writer) and
    kvd_log_payload_bytes_total from /metrics, as plain numbers."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for m in re.finditer(r'^(kvd_disk_written_bytes_total|kvd_disk_syncs_total)\{writer="(\w+)"\} (\S+)$', body, re.M):
        out[(m.group(1), m.group(2))] = int(float(m.group(3)))
    m = re.search(r"^kvd_log_payload_bytes_total (\S+)$", body, re.M)
    out["payload"] = int(float(m.group(1))) if m else None
    return out


@test
def disk_writes_accounted():
    """What kvd writes, by writer, on /metrics (issue 53's breakdown): the
    log's bytes are exactly what kvd.log grew by, the payload exactly the
    keys and values written (a delete's key; a txn's ops; an unchanged
    txn nothing), one fdatasync per group commit at most; the reserve file
    once at start; a Defragment's new log and its syncs under "rewrite",
    and its bytes are the new kvd.log's size."""
    d = tempfile.mkdtemp(prefix="kvd-disk-", dir=DISK)
    k = Kvd(KVD, data_dir=d)
    c = Client(k.endpoint())
    log = os.path.join(d, "kvd.log")
    c0, size0 = disk_counters(k.port), os.path.getsize(log)
    check(c0[("kvd_disk_written_bytes_total", "reserve")] == 131072 and
          c0[("kvd_disk_syncs_total", "reserve")] == 1, "the reserve, once: %r" % c0)
    payload, calls = 0, 0
    for i in range(20):
        check(c.call("Put", R.PutRequest(key=b"wa%02d" % i, value=b"x" * (1000 + i)))[0] == "ok", "put")
        payload += 4 + 1000 + i
        calls += 1
    t = R.TxnRequest()
    for i in range(3):
        t.success.add().request_put.CopyFrom(R.PutRequest(key=b"tx%d" % i, value=b"y" * 100))
    check(c.call("Txn", t)[0] == "ok", "txn")
    payload += 3 * (3 + 100)
    check(c.call("DeleteRange", R.DeleteRangeRequest(key=b"wa00"))[0] == "ok", "delete")
    payload += 4
    check(c.call("DeleteRange", R.DeleteRangeRequest(key=b"nothing"))[0] == "ok", "a delete of nothing")
    calls += 3
    c1, size1 = disk_counters(k.port), os.path.getsize(log)
    logged = c1[("kvd_disk_written_bytes_total", "log")] - c0[("kvd_disk_written_bytes_total", "log")]
    syncs = c1[("kvd_disk_syncs_total", "log")] - c0[("kvd_disk_syncs_total", "log")]
    print("  %d payload bytes, %d log bytes (%.3f), %d fdatasyncs for %d writes" %
          (c1["payload"] - c0["payload"], logged, logged / max(payload, 1), syncs, calls))
    check(c1["payload"] - c0["payload"] == payload, "payload %d, want %d" % (c1["payload"] - c0["payload"], payload))
    check(logged == size1 - size0, "log bytes %d, kvd.log grew %d" % (logged, size1 - size0))
    check(payload < logged < payload + 100 * calls, "framing bounded: %d for %d" % (logged, payload))
    check(1 <= syncs <= calls, "syncs %d for %d writes" % (syncs, calls))
    check(c1[("kvd_disk_written_bytes_total", "rewrite")] == 0, "no rewrite yet")
    check(defrag(c)[0] == "ok", "Defragment")
    c2 = disk_counters(k.port)
    rw = c2[("kvd_disk_written_bytes_total", "rewrite")]
    check(rw == os.path.getsize(log) and rw > payload - 1004, "rewrite bytes %d, the new log %d" %
          (rw, os.path.getsize(log)))
    check(c2[("kvd_disk_syncs_total", "rewrite")] >= 1, "the rewrite synced")
    c.close()
    k.stop()
    subprocess.run(["rm", "-rf", d])


@test
def auto_compaction_periodic_and_revision():
    k = Kvd(KVD, args=["--auto-compaction-mode", "periodic", "--auto-compaction-retention", "2s",
                       "--auto-rewrite=false"])
    c = Client(k.endpoint())
    revs = []
    # revisions over time, until the second compaction (the first, after one
    # retention, goes to the revision kvd started at, as etcd's does)
    while k.logtext().count("Finished auto-compaction at revision") < 2 and len(revs) < 20000:
        ans = c.call("Put", R.PutRequest(key=b"p", value=b"%f" % time.time()))
        revs.append((time.time(), ans[1].header.revision))
        time.sleep(0.005)
    m = re.findall(r"Starting auto-compaction at revision (\d+) \(retention: 2s\)", k.logtext())
    check(len(m) >= 2 and m[0] == "1", "etcd's log lines with the retention: %r" % m)
    if len(m) >= 2:
        crev = int(m[1])
        # to a revision sampled about a retention ago, never to the newest
        check(1 < crev < revs[-1][1], "compacted to %d of %d" % (crev, revs[-1][1]))
        ans = c.call("Range", R.RangeRequest(key=b"p", revision=crev - 1))
        check(ans[0] == "err" and ans[2] == "etcdserver: mvcc: required revision has been compacted",
              "history before it is gone")
    c.close()
    k.stop()
    k = Kvd(KVD, args=["--auto-compaction-mode", "revision", "--auto-compaction-retention", "10",
                       "--auto-compaction-check-interval", "200ms"])
    c = Client(k.endpoint())
    for i in range(30):
        c.call("Put", R.PutRequest(key=b"r", value=b"%d" % i))
    check(wait_for(lambda: "Starting auto-compaction at revision 21 (retention: 10 revisions)" in k.logtext(), 30),
          "revision mode keeps the last 10 revisions: %s" % k.logtext()[-300:])
    ans = c.call("Range", R.RangeRequest(key=b"r", revision=20))
    check(ans[0] == "err" and ans[1] == "OUT_OF_RANGE", "revision 20 compacted")
    ans = c.call("Range", R.RangeRequest(key=b"r", revision=21))
    check(ans[0] == "ok" and ans[1].kvs[0].value == b"19", "revision 21 kept")
    c.close()
    k.stop()
    for bad in (["--auto-compaction-mode", "daily", "--auto-compaction-retention", "1"],
                ["--auto-compaction-mode", "revision", "--auto-compaction-retention", "1h"]):
        r = subprocess.run([KVD, "--data-dir", tempfile.mkdtemp(prefix="kvd-bad-")] + bad,
                           capture_output=True, text=True, timeout=30)
        check(r.returncode != 0 and ("auto-compaction" in r.stderr or "auto compaction" in r.stderr),
              "refused: %s -> %r" % (" ".join(bad), r.stderr.strip()[-200:]))


def norm(text, ids):
    for i in ids:
        text = text.replace(str(i), "ID").replace("%x" % i, "ID")
    return text


@test
def quota_and_alarms_like_etcd():
    """The same steps against etcd and kvd, both with a small quota: the
    answers (codes, texts, etcdctl's output) compared.  [§13.5]"""
    outs = []
    for srv in ("etcd", "kvd"):
        if srv == "etcd":
            s = Etcd(args=["--quota-backend-bytes", "1200000"])
        else:
            s = Kvd(KVD, args=["--quota-backend-bytes", "1200000"])
        c = Client(s.endpoint())
        member = status(c)[1].header.member_id
        steps = []
        n = 0
        while n < 400:  # until the quota stops writes
            ans = c.call("Put", R.PutRequest(key=b"q%04d" % n, value=b"x" * 8192))
            n += 1
            if ans[0] != "ok":
                steps.append(("first refused put", ans))
                break
        steps.append(("filled", n < 400))
        steps.append(("put", c.call("Put", R.PutRequest(key=b"more", value=b"y"))[:3]))
        t = R.TxnRequest()
        t.success.add().request_put.CopyFrom(R.PutRequest(key=b"t", value=b"z"))
        steps.append(("txn with a put", c.call("Txn", t)[:3]))
        t = R.TxnRequest()
        t.success.add().request_delete_range.CopyFrom(R.DeleteRangeRequest(key=b"q0000"))
        a = c.call("Txn", t)
        steps.append(("txn with a delete", a[0] if a[0] == "ok" else a))
        steps.append(("lease grant", c.call("LeaseGrant", R.LeaseGrantRequest(TTL=60), service="etcdserverpb.Lease",
                                            resp="LeaseGrantResponse")[:3]))
        a = c.call("DeleteRange", R.DeleteRangeRequest(key=b"q0001"))
        steps.append(("delete", a[0] if a[0] == "ok" else a))
        a = c.call("Range", R.RangeRequest(key=b"q0002"))
        steps.append(("range", a[0] if a[0] == "ok" else a))
        a = alarm(c, 0)
        steps.append(("alarm get", [(x.memberID == member, x.alarm) for x in a[1].alarms] if a[0] == "ok" else a))
        st = status(c)[1]
        steps.append(("status errors", [norm(e, [member]) for e in st.errors]))
        steps.append(("etcdctl alarm list", norm(etcdctl(s, "alarm", "list")[1], [member])))
        for i in range(2, n):
            c.call("DeleteRange", R.DeleteRangeRequest(key=b"q%04d" % i))
        rev = status(c)[1].header.revision
        a = c.call("Compact", R.CompactionRequest(revision=rev, physical=True))  # etcd: purged before defrag
        steps.append(("compact", a[0] if a[0] == "ok" else a))
        a = defrag(c)
        steps.append(("defrag", a[0] if a[0] == "ok" else a))
        steps.append(("still refused after defrag", c.call("Put", R.PutRequest(key=b"more", value=b"y"))[:3]))
        a = alarm(c, 1, member, 2)  # ACTIVATE CORRUPT, then GET only NOSPACE
        steps.append(("activate", [(x.memberID == member, x.alarm) for x in a[1].alarms] if a[0] == "ok" else a))
        a = c.call("Put", R.PutRequest(key=b"more", value=b"y"))
        steps.append(("put while corrupt", a[0] if a[0] == "ok" else a))
        a = c.call("DeleteRange", R.DeleteRangeRequest(key=b"q0001"))
        steps.append(("delete while corrupt", a[0] if a[0] == "ok" else a))
        a = c.call("Range", R.RangeRequest(key=b"q0002"))
        steps.append(("range while corrupt", a[0] if a[0] == "ok" else a))
        a = alarm(c, 0, 0, 1)
        steps.append(("get nospace", [(x.memberID == member, x.alarm) for x in a[1].alarms] if a[0] == "ok" else a))
        a = alarm(c, 2, member, 2)
        steps.append(("deactivate", [(x.memberID == member, x.alarm) for x in a[1].alarms] if a[0] == "ok" else a))
        a = alarm(c, 2, member, 2)
        steps.append(("deactivate again", [x.alarm for x in a[1].alarms] if a[0] == "ok" else a))
        steps.append(("etcdctl alarm disarm", norm(etcdctl(s, "alarm", "disarm")[1], [member])))
        steps.append(("etcdctl alarm list after", etcdctl(s, "alarm", "list")[1]))
        a = c.call("Put", R.PutRequest(key=b"more", value=b"y"))
        steps.append(("put after disarm", a[0] if a[0] == "ok" else a))
        outs.append(steps)
        c.close()
        s.stop()
    for (name, e), (_, kv) in zip(*outs):
        check(e == kv, "%s: etcd %r, kvd %r" % (name, e, kv))
    check(len(outs[0]) == len(outs[1]), "same steps")


@test
def alarm_survives_restart():
    d = tempfile.mkdtemp(prefix="kvd-alarm-")
    k = Kvd(KVD, data_dir=d, args=["--quota-backend-bytes", "4096"])
    c = Client(k.endpoint())
    for i in range(100):
        if c.call("Put", R.PutRequest(key=b"a%d" % i, value=b"x" * 200))[0] != "ok":
            break
    check(len(status(c)[1].errors) == 1, "NOSPACE raised")
    c.close()
    k.stop()
    k = Kvd(KVD, data_dir=d)  # the default quota: space enough, but the alarm stays until disarmed
    c = Client(k.endpoint())
    ans = c.call("Put", R.PutRequest(key=b"b", value=b"y"))
    check(ans[0] == "err" and ans[2] == "etcdserver: mvcc: database space exceeded", "still refused: %r" % (ans,))
    check(defrag(c)[0] == "ok" and len(status(c)[1].errors) == 1, "a rewrite keeps the alarm")
    c.close()
    k.stop()
    k = Kvd(KVD, data_dir=d)
    c = Client(k.endpoint())
    check(len(status(c)[1].errors) == 1, "so does the restart after it")
    check(etcdctl(k, "alarm", "disarm")[0] == 0 and c.call("Put", R.PutRequest(key=b"b", value=b"y"))[0] == "ok",
          "disarmed, writes go")
    c.close()
    k.stop()
    k = Kvd(KVD, data_dir=d)
    c = Client(k.endpoint())
    check(not status(c)[1].errors, "the disarm is kept too")
    c.close()
    k.stop()
    subprocess.run(["rm", "-rf", d])


@test
def rewrite_when_nothing_is_live_at_the_base():
    """Compaction at C where no key was live at C - 1: the rewritten log
    still says its revision (an empty BASE record), restarts, goes on."""
    d = tempfile.mkdtemp(prefix="kvd-empty-base-")
    k = Kvd(KVD, data_dir=d, args=["--auto-rewrite=false"])
    c = Client(k.endpoint())
    c.call("Put", R.PutRequest(key=b"a", value=b"1"))
    c.call("DeleteRange", R.DeleteRangeRequest(key=b"a"))
    c.call("Put", R.PutRequest(key=b"b", value=b"2"))
    c.call("Compact", R.CompactionRequest(revision=4))
    check(defrag(c)[0] == "ok", "rewritten")
    c.close()
    k.stop()
    for rnd in range(2):
        k = Kvd(KVD, data_dir=d, args=["--auto-rewrite=false"], wait=False)
        check(wait_for(lambda: "serving client requests" in k.logtext() or not k.alive(), 60) and k.alive(),
              "restarts after the rewrite: %s" % k.logtext()[-400:])
        if not k.alive():
            return
        c = Client(k.endpoint())
        a = c.call("Range", R.RangeRequest(key=b"b"))
        check(a[0] == "ok" and a[1].header.revision == 4 + rnd and a[1].kvs[0].mod_revision == 4, "b at 4: %s" % (a,))
        c.call("Put", R.PutRequest(key=b"c", value=b"3"))
        check(defrag(c)[0] == "ok", "rewritten again")
        c.close()
        k.stop()
    subprocess.run(["rm", "-rf", d])


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
