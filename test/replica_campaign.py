#!/usr/bin/python3
"""The replica's long fault campaign (`make replica-campaign`, MINUTES=60 by
default; not part of `make test`, whose bounded 3-member test is
test/replica.py's follows_a_three_member_cluster_through_faults).

Rounds until the time is up.  Each round: a fresh 3-member etcd 3.7.3
cluster on loopback, a TCP relay in front of each member (so the link can
be cut or stalled), kvd --replicate-from the three relays, a writer on the
cluster (puts over 64 keys, deletes of ranges, txns, leases granted with
keys and revoked) and a writer through the replica (forwarded puts, each
read back from the replica when answered: read-your-writes).  Every few
seconds one fault, at random:
  kill_member   a member killed (-9), restarted a moment later;
  stop_member   a member SIGSTOPped for 8-12 s (the replica's keepalive
                leaves it when it is the one followed), then continued;
  cut_link      the relay to the member followed resets every connection
                and refuses new ones for 3 s;
  stall_link    the relay to the member followed holds every byte for
                12 s, no reset (only the keepalive finds it);
  kill9_kvd     kvd killed (-9) and started again on its data dir;
  term_kvd      kvd stopped (SIGTERM) and started again;
  compact       the cluster compacts 50 revisions below its newest.
After each fault, a progress point: the replica must go past the
cluster's revision at the fault's end, and its HashKV at its own
revision must equal the cluster's at the same revision.  At each round's
end: caught up, Range field by field and HashKV equal, every write the
cluster acknowledged (above the last compaction) found on the replica at
its revision, a watcher on the replica and one on the cluster from the
same revision hear the same events with no revision skipped or repeated,
and the replica never said "must reseed".

Its counts print at the end (and go in the README); the last line is
"N passed, N failed" (checks).
"""
import os
import random
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # test/: replica.py's helpers
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import replica as R  # noqa: E402
from kvdtest import Client, Kvd, WatchStream, check, run_tests, test, wait_for  # noqa: E402

MINUTES = float(os.environ.get("MINUTES", "60"))
ROUND_S = float(os.environ.get("ROUND_SECONDS", "90"))
FAULTS = ["kill_member", "stop_member", "cut_link", "stall_link", "kill9_kvd", "term_kvd", "compact"]


class Relay:
    """127.0.0.1:port -> a member's port, byte for byte, until cut (every
    connection reset, new ones refused) or stalled (bytes held, no reset)."""

    def __init__(self, target):
        self.target = target
        self.s = socket.socket()
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(64)
        self.port = self.s.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.refuse_until = self.stall_until = 0.0
        self.pairs, self.closed = [], False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.s.accept()
            except OSError:
                return
            if time.monotonic() < self.refuse_until:
                self._reset(c)
                continue
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=2)
                u.settimeout(None)
            except OSError:
                self._reset(c)
                continue
            self.pairs.append((c, u))
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                while time.monotonic() < self.stall_until:
                    time.sleep(0.05)
                b.sendall(d)
        except OSError:
            pass
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @staticmethod
    def _reset(c):
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        c.close()

    def cut(self, secs):
        self.refuse_until = time.monotonic() + secs
        pairs, self.pairs = self.pairs, []
        for a, b in pairs:
            for x in (a, b):
                try:
                    self._reset(x)
                except OSError:
                    pass

    def stall(self, secs):
        self.stall_until = time.monotonic() + secs

    def close(self):
        self.closed = True
        self.s.close()
        self.cut(0)


TOTAL = {"rounds": 0, "faults": {f: 0 for f in FAULTS}, "acked": 0, "forwarded": 0, "refused": 0,
         "progress_points": 0, "revisions": 0, "events_compared": 0, "kvd_restarts": 0}


def one_round(deadline, rng):
    m = R.rpc()
    cl = R.Cluster()
    relays = [Relay(int(u.rsplit(":", 1)[1])) for u in cl.urls]
    stopped, down = set(), set()
    k = None
    try:
        clients = [Client(u[7:]) for u in cl.urls]

        def live():
            for i in rng.sample(range(3), 3):
                if i not in stopped and i not in down:
                    return clients[i]
            return clients[0]
        stop, acked, fwd, errors, compacted = threading.Event(), [], [], [0], [0]
        box = {}

        def writer():
            i = cur = 0
            while not stop.is_set():
                c = clients[cur % 3]
                key = b"w/%02d" % (i % 64)
                if i % 101 == 7:
                    r = c.call("DeleteRange", m.DeleteRangeRequest(key=b"w/1", range_end=b"w/2"), timeout=3)
                elif i % 53 == 3:
                    t = m.TxnRequest()
                    t.compare.add(key=key, target=m.Compare.VERSION, result=m.Compare.GREATER, version=0)
                    t.success.add().request_put.CopyFrom(m.PutRequest(key=key, value=b"txn%d" % i))
                    t.success.add().request_put.CopyFrom(m.PutRequest(key=b"t/%d" % (i % 7), value=b"%d" % i))
                    t.failure.add().request_put.CopyFrom(m.PutRequest(key=key, value=b"new%d" % i))
                    r = c.call("Txn", t, timeout=3)
                elif i % 89 == 11:
                    r = c.call("LeaseGrant", m.LeaseGrantRequest(TTL=600), service="etcdserverpb.Lease",
                               resp="LeaseGrantResponse", timeout=3)
                    if r[0] == "ok":
                        lid = r[1].ID
                        c.call("Put", m.PutRequest(key=b"l/%d" % (i % 5), value=b"x", lease=lid), timeout=3)
                        c.call("Put", m.PutRequest(key=b"l/%d" % (i % 5 + 5), value=b"y", lease=lid), timeout=3)
                        r = c.call("LeaseRevoke", m.LeaseRevokeRequest(ID=lid), service="etcdserverpb.Lease",
                                   resp="LeaseRevokeResponse", timeout=3)
                else:
                    r = c.call("Put", m.PutRequest(key=key, value=b"%d" % i), timeout=3)
                    if r[0] == "ok":
                        acked.append((key, r[1].header.revision))
                if r[0] != "ok":
                    errors[0] += 1
                    cur += 1
                    time.sleep(0.05)
                i += 1
                time.sleep(0.004)

        def forwarder():  # writes made on the replica: etcd's, and seen on the replica when answered
            i = 0
            while not stop.is_set():
                kc = box.get("kc")
                if not kc:
                    time.sleep(0.05)
                    continue
                key = b"f/%02d" % (i % 16)
                try:
                    r = kc.call("Put", m.PutRequest(key=key, value=b"%d" % i), timeout=10)
                except Exception:  # kvd restarted under it
                    r = ("err",)
                if r[0] == "ok":
                    rev = r[1].header.revision
                    try:
                        g = kc.call("Range", m.RangeRequest(key=key, serializable=True), timeout=5)
                    except Exception:
                        g = ("err",)
                    check(g[0] != "ok" or (g[1].kvs and g[1].kvs[0].mod_revision >= rev),
                          "a forwarded write at %d seen on the replica when answered: %s" % (rev, g))
                    fwd.append((key, rev))
                i += 1
                time.sleep(0.05)

        def start_kvd(data_dir=None):
            x = Kvd(R.KVD, args=["--replicate-from", ",".join(r.url for r in relays)], data_dir=data_dir)
            box["kc"] = Client(x.endpoint())
            return x
        ts = [threading.Thread(target=f, daemon=True) for f in (writer, forwarder)]
        ts[0].start()
        wait_for(lambda: len(acked) > 30, 30, 0.02)
        k = start_kvd()
        check(wait_for(lambda: R.revision(box["kc"]) > 30, 60, 0.05), "the replica seeded: %s" % k.logtext()[-600:])
        ts[1].start()
        r0 = R.revision(box["kc"])
        end = min(deadline, time.monotonic() + ROUND_S)
        while time.monotonic() < end:
            f = rng.choice(FAULTS)
            TOTAL["faults"][f] += 1
            i = rng.randrange(3)
            if f == "kill_member":
                down.add(i)
                cl.kill(i)
                time.sleep(rng.uniform(0.5, 3))
                cl.start(i)
                check(wait_for(lambda: cl.ready(i), 60, 0.1), "member %d back" % i)
                down.discard(i)
            elif f == "stop_member":
                stopped.add(i)
                cl.p[i].send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(8, 12))
                cl.p[i].send_signal(signal.SIGCONT)
                stopped.discard(i)
            elif f == "cut_link":
                for r in relays:
                    if r.pairs:
                        r.cut(3)
                time.sleep(3)
            elif f == "stall_link":
                for r in relays:
                    if r.pairs:
                        r.stall(12)
                time.sleep(12)
            elif f in ("kill9_kvd", "term_kvd"):
                k.stop(signal.SIGKILL if f == "kill9_kvd" else signal.SIGTERM)
                box.pop("kc").close()
                TOTAL["kvd_restarts"] += 1
                k = start_kvd(k.dir)
                check("resuming from the store's revision" in k.logtext(), "no reseed after %s: %s" %
                      (f, k.logtext()[-600:]))
            elif f == "compact":
                c = live()
                rev = R.revision(c)
                if rev - 50 > compacted[0]:
                    r = c.call("Compact", m.CompactionRequest(revision=rev - 50), timeout=10)
                    if r[0] == "ok":
                        compacted[0] = rev - 50
            # a progress point: past the cluster's revision now, and the same HashKV
            want = R.revision(live())
            kc = box["kc"]
            ok = wait_for(lambda: R.revision(kc) >= want, 60, 0.05)
            check(ok, "after %s the replica reached %d: at %d\n%s" % (f, want, R.revision(kc), k.logtext()[-800:]))
            at = R.revision(kc)
            if ok and at > compacted[0]:  # a compaction is found within the replica's probe (2 s): waited for
                ec = live()  # a member just continued may still be behind `at`: asked once it has it
                wait_for(lambda: R.revision(ec) >= at and R.hashkv(kc, at) == R.hashkv(ec, at), 15, 0.1)
                hk, he = R.hashkv(kc, at), R.hashkv(ec, at)
                check(hk == he, "after %s: HashKV at %d: kvd %s, the cluster %s" % (f, at, hk, he))
                TOTAL["progress_points"] += 1
            time.sleep(rng.uniform(1, 4))
        stop.set()
        for t in ts:
            t.join(20)
        kc, ec = box["kc"], live()
        rev = R.caught_up(kc, ec, 60)
        check(rev > 0, "caught up at the round's end: %d vs %d" % (R.revision(kc), R.revision(ec)))
        R.same_state(kc, ec, rev, "the round's end")
        def found(key, at):
            g = kc.call("Range", m.RangeRequest(key=key, revision=at, serializable=True), timeout=10)
            return g[0] == "ok" and len(g[1].kvs) == 1 and g[1].kvs[0].mod_revision == at
        missing = [(key, at) for key, at in acked + fwd if at > compacted[0] and not found(key, at)]
        check(not missing, "%d acknowledged writes not on the replica at their revision: %s" %
              (len(missing), missing[:5]))
        start = max(r0, compacted[0] + 1)
        wk, wc = WatchStream(k.endpoint()), WatchStream(cl.urls[0][7:])
        for w in (wk, wc):
            w.create(key=b"\0", range_end=b"\0", start_revision=start)
        a, b = R.events(wk, rev), R.events(wc, rev)
        check(a == b and len({x[4] for x in a}) == rev - start + 1,
              "the same events from %d to %d: kvd %d, the cluster %d" % (start, rev, len(a), len(b)))
        wk.close()
        wc.close()
        check("must reseed" not in k.logtext(), "never stopped following: %s" % k.logtext()[-600:])
        TOTAL["rounds"] += 1
        TOTAL["acked"] += len(acked)
        TOTAL["forwarded"] += len(fwd)
        TOTAL["refused"] += errors[0]
        TOTAL["revisions"] += rev
        TOTAL["events_compared"] += len(a)
        print("  round %d: %d writes acknowledged, %d forwarded, %d refused during faults; revision %d" %
              (TOTAL["rounds"], len(acked), len(fwd), errors[0], rev), flush=True)
    finally:
        if k:
            k.stop()
        for r in relays:
            r.close()
        cl.stop()


@test
def campaign():
    """Rounds of faults until MINUTES are up (see the module's text)."""
    seed = int(os.environ.get("SEED", str(int(time.time()))))
    rng = random.Random(seed)
    print("  seed %d, %.0f minutes, rounds of %.0f s" % (seed, MINUTES, ROUND_S), flush=True)
    deadline = time.monotonic() + MINUTES * 60
    while time.monotonic() < deadline - 20:
        one_round(deadline, rng)
    print("  campaign: %d rounds, faults %s (%d), %d writes acknowledged by the cluster, %d forwarded by the "
          "replica, %d refused during faults, %d kvd restarts, %d progress points (HashKV equal), %d events "
          "compared, %d revisions followed" %
          (TOTAL["rounds"], ", ".join("%s %d" % kv for kv in TOTAL["faults"].items()),
           sum(TOTAL["faults"].values()), TOTAL["acked"], TOTAL["forwarded"], TOTAL["refused"],
           TOTAL["kvd_restarts"], TOTAL["progress_points"], TOTAL["events_compared"], TOTAL["revisions"]),
          flush=True)


if __name__ == "__main__":
    sys.exit(run_tests([sys.argv[0], "campaign"]))
