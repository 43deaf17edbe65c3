#!/usr/bin/python3
"""Watch, differential: the same random KV operations and the same watch
requests (every kind: keys, prefixes, ranges, from-key, past/current/future
and compacted start revisions, filters, prev_kv, chosen and duplicate ids,
cancels, progress requests) against Debian's etcd and kvd, on several
concurrent Watch streams.  Each watch id's responses are compared in order,
field by field (ids and raft term aside).  Order across watch ids is not
compared: etcd's comes from a Go map.  Last line: "N passed, N failed".

  KVD_WATCHDIFF_OPS=N (default 400 per seed), KVD_WATCHDIFF_SEEDS=1,2,3
"""
import os
import random
import re
import sys
import time
import urllib.request

from kvdtest import ROOT, Etcd, Kvd, Client, WatchStream, pb, wait_for
from diff import Gen, canon, prefix_end, KEYS, normalize

R = pb()["rpc"]
KVD_TEST = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))
NSTREAMS = 3


class Side:
    def __init__(self, server):
        self.server = server
        self.c = Client(server.endpoint())
        self.ws = [WatchStream(server.endpoint()) for _ in range(NSTREAMS)]

    def close(self):
        for w in self.ws:
            w.close()
        self.c.close()
        self.server.stop()

    def unsynced(self):
        """Watchers the server is still catching up from history: etcd's
        gauge on /metrics (victims included), kvd's own count
        (kvd.test.Test/Stats)."""
        if isinstance(self.server, Etcd):
            text = urllib.request.urlopen("http://%s/metrics" % self.server.endpoint(), timeout=10).read().decode()
            return int(re.search(r"^etcd_debugging_mvcc_slow_watcher_total (\d+)", text, re.M).group(1))
        st = dict(kv.split("=") for kv in self.c.ch.unary_unary("/kvd.test.Test/Stats")(b"", timeout=10).decode().split())
        return int(st["unsynced"])

    def progresses(self, si):
        return sum(1 for r in self.ws[si].got if is_progress(r))


def settle(what, pred):
    """No fixed pause: a busy machine takes as long as it takes, and a
    barrier that never comes is a failure, not a shorter wait."""
    if not wait_for(pred, 120, 0.01):
        raise AssertionError("servers did not settle after " + what)


def synced(e, k):
    return e.unsynced() == 0 and k.unsynced() == 0


def barrier(e, k, si, what):
    """Both servers have handled everything sent so far on stream si: a
    progress request after it is answered in order (etcd 3.4 queues the
    answer behind the stream's control responses), then neither server has
    a watcher still reading history."""
    n = [s.progresses(si) for s in (e, k)]
    for side in (e, k):
        side.ws[si].progress()
    settle(what, lambda: all(s.progresses(si) > m for s, m in zip((e, k), n)) and synced(e, k))


def is_progress(r):
    return r.watch_id == -1 and not (r.events or r.created or r.canceled or r.compact_revision)


def by_id(resps):
    """Responses per watch id.  Progress answers (id -1) are a list of their
    own: a client may also pick -1 for a watcher, and when its history
    arrives relative to a progress answer is the server's choice."""
    out = {}
    for r in resps:
        wid = "progress" if is_progress(r) else r.watch_id
        out.setdefault(wid, []).append(normalize(r).SerializeToString(deterministic=True))
    return out


def show(r):
    from google.protobuf import text_format
    return text_format.MessageToString(R.WatchResponse.FromString(r), as_one_line=True)[:400]


def run_seed(seed, nops):
    rng = random.Random(seed * 7919)
    g = Gen(seed)
    e, k = Side(Etcd()), Side(Kvd(KVD_TEST, ["--unsafe-no-fsync"]))
    ids = [[] for _ in range(NSTREAMS)]
    log = []
    try:
        for i in range(nops):
            c = rng.random()
            si = rng.randrange(NSTREAMS)
            if c < 0.12:
                key = rng.choice(KEYS + [b""])
                kw = {"key": key}
                rc = rng.random()
                if rc < 0.35:
                    kw["range_end"] = prefix_end(key or b"\x00")
                elif rc < 0.5:
                    kw["range_end"] = b"\x00"
                elif rc < 0.6:
                    kw["range_end"] = rng.choice(KEYS)
                sc = rng.random()
                if sc < 0.35:
                    kw["start_revision"] = rng.randint(max(1, g.compacted - 2), g.rev)
                elif sc < 0.45:
                    kw["start_revision"] = g.rev + rng.randint(1, 3)
                if rng.random() < 0.3:
                    kw["filters"] = rng.sample([0, 1], rng.randint(1, 2))
                kw["prev_kv"] = rng.random() < 0.4
                kw["fragment"] = rng.random() < 0.2
                wc = rng.random()
                if wc < 0.1 and ids[si]:
                    kw["watch_id"] = rng.choice(ids[si])       # a duplicate
                elif wc < 0.2:
                    kw["watch_id"] = rng.choice([-7, -1, 5, 100, 3])
                created = sum(1 for r in e.ws[si].got if r.created) + 1
                for side in (e, k):
                    side.ws[si].create(**kw)
                log.append("create s%d %r" % (si, kw))
                if "watch_id" in kw:
                    ids[si].append(kw["watch_id"])
                settle("create", lambda: all(sum(1 for r in s.ws[si].got if r.created) >= created for s in (e, k)))
                barrier(e, k, si, "create")
            elif c < 0.16:
                known = sorted(set(r.watch_id for r in e.ws[si].got if r.created and not r.canceled))
                wid = rng.choice(known) if known and rng.random() < 0.8 else rng.randint(-3, 50)
                for side in (e, k):
                    side.ws[si].cancel(wid)
                log.append("cancel s%d %d (known %r)" % (si, wid, known))
                barrier(e, k, si, "cancel")
            elif c < 0.18:
                n = len(e.ws[si].got)
                for side in (e, k):
                    side.ws[si].progress()
                log.append("progress s%d" % si)
                settle("progress", lambda: all(len(s.ws[si].got) > n for s in (e, k)))
            else:
                method, req = g.next()
                if method == "Put" and len(req.value) > 100000:
                    continue
                a, b = e.c.call(method, req), k.c.call(method, req)
                log.append(method)
                if canon(a) != canon(b):
                    print("KV MISMATCH seed=%d op=%d %s" % (seed, i, method))
                    return False
                g.learn(method, req, a)
        same = lambda: all(by_id(e.ws[si].got) == by_id(k.ws[si].got) for si in range(NSTREAMS))
        wait_for(lambda: synced(e, k) and same(), 120, 0.02)   # a mismatch is reported below
        ok = True
        for si in range(NSTREAMS):
            ge, gk = by_id(e.ws[si].got), by_id(k.ws[si].got)
            for wid in sorted(set(ge) | set(gk), key=str):
                a, b = ge.get(wid, []), gk.get(wid, [])
                if a != b:
                    ok = False
                    print("WATCH MISMATCH seed=%d stream=%d watch_id=%s (%d vs %d responses)" %
                          (seed, si, wid, len(a), len(b)))
                    for n, (x, y) in enumerate(zip(a + [b""] * len(b), b + [b""] * len(a))):
                        if x != y:
                            print("  #%d etcd: %s\n  #%d kvd:  %s" % (n, show(x) if x else "-", n, show(y) if y else "-"))
                            break
                    if os.environ.get("KVD_WATCHDIFF_VERBOSE"):
                        for x in a:
                            print("    etcd: " + show(x))
                        for y in b:
                            print("    kvd:  " + show(y))
        if not ok:
            print("  ops: " + "; ".join(log[-40:] if not os.environ.get("KVD_WATCHDIFF_VERBOSE") else log))
        return ok, sum(len(w.got) for w in k.ws)
    finally:
        e.close()
        k.close()


def main():
    nops = int(os.environ.get("KVD_WATCHDIFF_OPS", "400"))
    seeds = [int(s) for s in os.environ.get("KVD_WATCHDIFF_SEEDS", "1,2,3").split(",")]
    passed = failed = 0
    t0 = time.time()
    for seed in seeds:
        res = run_seed(seed, nops)
        if res and res[0]:
            passed += 1
            print("  seed %d: %d ops, %d watch responses identical" % (seed, nops, res[1]), flush=True)
        else:
            failed += 1
    print("watch differential in %.1fs" % (time.time() - t0))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
