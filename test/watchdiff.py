#!/usr/bin/python3
"""Watch, differential: the same random KV operations and the same watch
requests (every kind: keys, prefixes, ranges, from-key, past/current/future,
compacted, exactly-compacted and negative start revisions, filters, prev_kv,
fragment, chosen and duplicate ids, cancels, progress requests) against the
etcd 3.7.3 oracle and kvd, on several concurrent Watch streams.  Each watch
id's responses are compared in order, field by field (ids and raft term
aside).  Order across watch ids is not compared: etcd's comes from a Go map
and from a select between two channels.  Last line: "N passed, N failed".

etcd's Watch stream has two paths to the client, merged by a Go select in
its send loop, so their relative order is not defined: the control path
(created, rejected and cancel replies, in request order) and the event path
(events, compaction cancels and -- since 3.5 -- RequestProgress answers, in
the order they were queued).  The test's synchronisation, with no fixed
sleep anywhere, rests on both orders:

- barrier(si): a sentinel watcher on stream si with an explicit id (SENT,
  far above any id etcd's counter hands out; explicit ids never advance that
  counter, and the sentinel is gone before the next create) on a key only
  the test writes (SKEY, put once at revision 2).  Its created reply, on the
  control path, proves every earlier request on the stream was handled and
  its control reply delivered; its cancel reply is awaited too, and both
  servers' unsynced-watcher counts (etcd: etcd_debugging_mvcc_slow_watcher_
  total on /metrics, victims included; kvd: kvd.test.Test/Stats) must be 0.
- barrier(si, drain=True) also drains the event path: the sentinel starts
  at revision 1, so it has history to catch up -- SKEY's put, or, once that
  is compacted, a compaction cancel -- queued on the event path only after
  the sentinel exists, hence after everything the stream's earlier requests
  and writes queued there.  When its response arrived, nothing due on the
  stream is still in flight, so a cancel cannot overtake its watcher's
  events and a progress answer either came before it or never will.

RequestProgress under 3.7 is answered ({watch_id -1, header.revision =
current}, on the event path) only if the stream has a watcher, every one of
its watchers is synced, and the current revision >= each one's
start_revision; otherwise not at all.  A watcher cancelled by compaction
stays registered, unsynced, until the client cancels it, so it blocks the
answer.  Progress requests are sent only between two drain barriers, with
no write in between: every watcher is synced except compaction-cancelled
ones, which the test knows (start_revision in (0, compact revision) at
creation), so the answer depends only on state both servers share.  Each
server's answers between the request and the second barrier's sentinel
history must be exactly what that rule predicts (a model error if etcd
itself disagrees), and the progress answers are compared in order too.

  test/watchdiff.py [name-filter]     one test per seed: watch_seed_N
  KVD_WATCHDIFF_OPS=N (default 400 per seed), KVD_WATCHDIFF_SEEDS=1,2,3
  KVD_WATCHDIFF_SELF=1: a second etcd 3.7.3 instead of kvd (proves the test
  sound and deterministic against the oracle itself)
  KVD_WATCHDIFF_VERBOSE=1: every response and op of a failing seed
"""
import os
import random
import re
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import ROOT, Etcd, Kvd, Client, WatchStream, check, pb, run_tests, test, wait_for
from diff import Gen, canon, prefix_end, KEYS, normalize, brief, show as kvshow

R = pb()["rpc"]
KVD_TEST = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))
SELF = bool(os.environ.get("KVD_WATCHDIFF_SELF"))
NSTREAMS = 3
SENT = 1 << 62                  # the sentinel's watch id: no counter gets there
SKEY = b"~watchdiff/sentinel"   # written once, by the test, at revision 2


class Side:
    def __init__(self, server, name):
        self.server = server
        self.name = name
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
            return int(float(re.search(r"^etcd_debugging_mvcc_slow_watcher_total (\S+)", text, re.M).group(1)))
        st = dict(kv.split("=") for kv in self.c.ch.unary_unary("/kvd.test.Test/Stats")(b"", timeout=10).decode().split())
        return int(st["unsynced"])

    def sentinel(self, si, mark, pred):
        """Index in stream si's responses (from mark on) of the first
        sentinel response that pred accepts, or None."""
        got = self.ws[si].got
        for i in range(mark, len(got)):
            if got[i].watch_id == SENT and pred(got[i]):
                return i
        return None


class Unsettled(Exception):
    pass


def settle(what, sides, pred):
    """Wait until pred(side) holds for every side.  No fixed pause: a busy
    machine takes as long as it takes, and a reply that never comes is a
    failure, not a shorter wait."""
    if not wait_for(lambda: all(pred(s) for s in sides), 120, 0.005):
        raise Unsettled("servers did not settle: %s (still waiting on %s)" %
                        (what, ", ".join(s.name for s in sides if not pred(s))))


def synced(s):
    return s.unsynced() == 0


def is_created(r):
    return r.created and not r.canceled


def is_cancel_reply(r):
    return r.canceled and not r.created and not r.compact_revision


def is_event_path(r):
    return bool(r.events or r.compact_revision)


def barrier(sides, si, what, drain=False):
    """Every request sent on stream si so far is handled and its control
    reply delivered, no watcher is unsynced; with drain, every event-path
    response due on si is delivered as well (see the docstring).  Answers,
    per side, the index of the sentinel's history response (drain) and the
    revision its created reply reports (the current one)."""
    settle(what + ": unsynced watchers", sides, synced)
    marks = [len(s.ws[si].got) for s in sides]
    for s in sides:
        s.ws[si].create(key=SKEY, watch_id=SENT, start_revision=1 if drain else 0)
    settle(what + ": sentinel created", sides,
           lambda s: s.sentinel(si, marks[sides.index(s)], is_created) is not None)
    fence = [None] * len(sides)
    if drain:
        settle(what + ": sentinel history (event path)", sides,
               lambda s: s.sentinel(si, marks[sides.index(s)], is_event_path) is not None)
        fence = [s.sentinel(si, m, is_event_path) for s, m in zip(sides, marks)]
    revs = [s.ws[si].got[s.sentinel(si, m, is_created)].header.revision for s, m in zip(sides, marks)]
    for s in sides:
        s.ws[si].cancel(SENT)
    settle(what + ": sentinel cancelled", sides,
           lambda s: s.sentinel(si, marks[sides.index(s)], is_cancel_reply) is not None)
    settle(what + ": unsynced watchers after the sentinel", sides, synced)
    return fence, revs


def is_progress(r):
    return r.watch_id == -1 and not (r.events or r.created or r.canceled or r.compact_revision)


def by_id(resps):
    """Responses per watch id, the sentinel's left out.  Progress answers
    are a list of their own.  A client may pick -1 for a watcher, and every
    rejected create is answered with -1: -1's control replies and its
    event-path responses are two lists, since etcd sends events for -1
    without holding them behind the created reply."""
    out = {}
    for r in resps:
        if r.watch_id == SENT:
            continue
        if is_progress(r):
            wid = "progress"
        elif r.watch_id == -1:
            wid = "-1 events" if is_event_path(r) else "-1 control"
        else:
            wid = r.watch_id
        out.setdefault(wid, []).append(normalize(r).SerializeToString(deterministic=True))
    return out


def show(r):
    from google.protobuf import text_format
    return text_format.MessageToString(R.WatchResponse.FromString(r), as_one_line=True)[:400]


def progress_rule(watchers, rev):
    """3.7's rule (watchable_store.go progressIfSync): an answer only when
    the stream has a watcher and each is synced (a compaction-cancelled one
    never is) with start_revision <= the current revision.  Answers the
    reason: "answered", or why not."""
    if not watchers:
        return "no watcher"
    if any(comp for start, comp in watchers.values()):
        return "compacted watcher"
    if any(start > rev for start, comp in watchers.values()):
        return "future watcher"
    return "answered"


def run_seed(seed, nops):
    rng = random.Random(seed * 7919)
    g = Gen(seed)
    e = Side(Etcd(), "etcd")
    try:
        k = Side(Etcd(), "etcd#2") if SELF else Side(Kvd(KVD_TEST, ["--unsafe-no-fsync"]), "kvd")
    except Exception:
        e.close()
        raise
    sides = [e, k]
    ids = [[] for _ in range(NSTREAMS)]       # ids the generator chose per stream
    ever = [set() for _ in range(NSTREAMS)]   # ids etcd ever created per stream
    live = [{} for _ in range(NSTREAMS)]      # etcd's live watchers: id -> (start, compacted)
    log = []
    bad = []
    i = -1
    prog = {}                                 # progress ops per progress_rule()
    try:
        put = R.PutRequest(key=SKEY, value=b"s")
        a, b = e.c.call("Put", put), k.c.call("Put", put)
        if canon(a) != canon(b) or a[0] != "ok" or a[1].header.revision != 2:
            print("KV MISMATCH seed=%d sentinel key put: %r %r" % (seed, a, b))
            return False
        g.learn("Put", put, a)
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
                if sc < 0.3 or (sc < 0.36 and g.compacted < 2):
                    kw["start_revision"] = rng.randint(max(1, g.compacted - 2), g.rev)
                elif sc < 0.36:
                    kw["start_revision"] = rng.randint(1, g.compacted - 1)    # compacted
                elif sc < 0.46:
                    kw["start_revision"] = g.rev + rng.randint(1, 3)
                elif sc < 0.5:
                    kw["start_revision"] = g.rev + rng.randint(20, 500)       # far future
                elif sc < 0.55:
                    kw["start_revision"] = rng.choice([-1, -2, -1000])
                elif sc < 0.6 and g.compacted > 0:
                    kw["start_revision"] = g.compacted                      # exactly compacted
                if rng.random() < 0.3:
                    kw["filters"] = rng.sample([0, 1], rng.randint(1, 2))
                kw["prev_kv"] = rng.random() < 0.4
                kw["fragment"] = rng.random() < 0.2
                wc = rng.random()
                if wc < 0.1 and ids[si]:
                    kw["watch_id"] = rng.choice(ids[si])       # a duplicate
                elif wc < 0.2:
                    kw["watch_id"] = rng.choice([-7, -1, 5, 100, 3])
                mark = len(e.ws[si].got)
                for side in sides:
                    side.ws[si].create(**kw)
                log.append("create s%d %r" % (si, kw))
                if "watch_id" in kw:
                    ids[si].append(kw["watch_id"])
                barrier(sides, si, "create")
                r = next(r for r in e.ws[si].got[mark:] if r.created and r.watch_id != SENT)
                if not r.canceled:
                    start = kw.get("start_revision", 0)
                    live[si][r.watch_id] = (start, 0 < start < g.compacted)
                    ever[si].add(r.watch_id)
            elif c < 0.18:
                wc = rng.random()
                if wc < 0.6 and live[si]:
                    wid = rng.choice(sorted(live[si]))
                elif wc < 0.8 and ever[si]:
                    wid = rng.choice(sorted(ever[si]))     # maybe cancelled already
                else:
                    wid = rng.randint(-3, 50)
                barrier(sides, si, "before cancel", drain=True)
                for side in sides:
                    side.ws[si].cancel(wid)
                log.append("cancel s%d %d (live %r)" % (si, wid, sorted(live[si])))
                barrier(sides, si, "cancel")
                live[si].pop(wid, None)
            elif c < 0.22:
                n = rng.choice([1, 1, 1, 2])
                _, revs = barrier(sides, si, "before progress", drain=True)
                why = progress_rule(live[si], revs[0])
                want = [revs[0]] * n if why == "answered" else []
                prog[why] = prog.get(why, 0) + 1
                marks = [len(s.ws[si].got) for s in sides]
                for side in sides:
                    for _ in range(n):
                        side.ws[si].progress()
                log.append("progress s%d x%d (rev %d, watchers %r: %s)" % (si, n, revs[0], live[si], why))
                fence, _ = barrier(sides, si, "after progress", drain=True)
                for s, m, f in zip(sides, marks, fence):
                    got = [r.header.revision for r in s.ws[si].got[m:f] if is_progress(r)]
                    if got != want:
                        bad.append("PROGRESS MISMATCH seed=%d op=%d stream=%d: %s answered %r, 3.7's rule says %r (%s)%s" %
                                   (seed, i, si, s.name, got, want, why,
                                    " (the test's model of 3.7 is wrong)" if s is e else ""))
            else:
                method, req = g.next()
                if method == "Put" and len(req.value) > 100000:
                    continue
                a, b = e.c.call(method, req), k.c.call(method, req)
                log.append(method)
                if canon(a) != canon(b):
                    print("KV MISMATCH seed=%d op=%d %s\n  %s: %s\n  %s: %s" %
                          (seed, i, brief(method, req), e.name, kvshow(a), k.name, kvshow(b)))
                    return False
                g.learn(method, req, a)
        for si in range(NSTREAMS):
            barrier(sides, si, "the end", drain=True)
        ok = not bad
        for line in bad:
            print(line)
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
                            print("  #%d %s: %s\n  #%d %s: %s" % (n, e.name, show(x) if x else "-",
                                                                  n, k.name, show(y) if y else "-"))
                            break
                    if os.environ.get("KVD_WATCHDIFF_VERBOSE"):
                        for x in a:
                            print("    %s: %s" % (e.name, show(x)))
                        for y in b:
                            print("    %s: %s" % (k.name, show(y)))
        if not ok:
            print("  ops: " + "; ".join(log[-40:] if not os.environ.get("KVD_WATCHDIFF_VERBOSE") else log))
        return ok, sum(len(w.got) for w in k.ws), prog
    except Unsettled as x:
        print("WATCH STALL seed=%d op=%d: %s" % (seed, i, x))
        print("  ops: " + "; ".join(log[-40:]))
        return False
    finally:
        e.close()
        k.close()


def seed_test(seed, nops):
    """The test watch_seed_<seed>: nops ops and watch requests, both sides."""
    def fn():
        res = run_seed(seed, nops)
        if check(bool(res and res[0]), "seed %d: a mismatch (above)" % seed):
            print("  seed %d: %d ops, %d watch responses identical%s; progress requests as 3.7 rules: %s" %
                  (seed, nops, res[1], " (etcd vs etcd)" if SELF else "",
                   ", ".join("%s %d" % kv for kv in sorted(res[2].items()))), flush=True)
    fn.__name__ = "watch_seed_%d" % seed
    return fn


def main(argv):
    nops = int(os.environ.get("KVD_WATCHDIFF_OPS", "400"))
    seeds = [int(s) for s in os.environ.get("KVD_WATCHDIFF_SEEDS", "1,2,3").split(",")]
    for seed in seeds:
        test(seed_test(seed, nops))
    return run_tests(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
