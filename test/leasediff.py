#!/usr/bin/python3
"""Differential test for leases: the same seeded random lease and KV
operations against the etcd 3.7.3 oracle (test/peers) and kvd, every answer
compared (headers without cluster_id, member_id, raft_term).  Lease ids are
chosen by the test (explicit ids, negative ones and duplicates included) so
both servers hold the same ids; server-chosen ids are checked on their own.
A watcher on the whole keyspace (with prev_kv) runs throughout and its events
are compared at the end: revokes delete a lease's keys in one revision, in key
order.

What legitimately differs is normalized: LeaseTimeToLive's remaining TTL may
differ by one second (it is truncated on two clocks), its keys and
LeaseLeases' ids are compared as sets (etcd builds them from Go maps).

  test/leasediff.py [--ops N] [--seeds a,b] [name-filter]   Last line: "N passed, N failed"

One test per seed (lease_seed_N), then server_chosen_ids.
"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import ROOT, Etcd, Kvd, Client, WatchStream, check, pb, run_tests, split_options, test, wait_for
from diff import normalize

R = pb()["rpc"]
IDS = [1, 2, 3, 7, 100, -3, -1, 12345, 2 ** 62, 2 ** 63 - 1]
KEYS = [b"a", b"b", b"c", b"k/1", b"k/2", b"k/3", b"k/10", b"l", b"m/x", b"m/y", b"z"]
LEASE = "etcdserverpb.Lease"


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def lease_id(self, grant=False):
        """An id of the pool; sometimes 0 or one never granted (a grant of 0
        makes the server choose: not comparable, so never here)."""
        if self.r.random() < 0.15:
            return self.r.choice([999] if grant else [0, 999])
        return self.r.choice(IDS)

    def put(self):
        q = R.PutRequest(key=self.r.choice(KEYS), value=b"v%d" % self.r.randrange(100))
        c = self.r.random()
        if c < 0.6:
            q.lease = self.lease_id()
        elif c < 0.7:
            q.ignore_lease = True
        q.prev_kv = self.r.random() < 0.3
        return q

    def next(self):
        """A list of (kind, method, request): some ops are two requests."""
        c = self.r.random()
        if c < 0.18:
            return [("unary", "LeaseGrant", R.LeaseGrantRequest(ID=self.lease_id(True),
                                                                TTL=self.r.choice([100, 300, 1000, 5000])))]
        if c < 0.24:  # a small or odd TTL: revoked at once, before it could expire
            i = self.lease_id(True)
            return [("unary", "LeaseGrant", R.LeaseGrantRequest(ID=i, TTL=self.r.choice([0, -5, 1, 2, 3, 4]))),
                    ("unary", "LeaseRevoke", R.LeaseRevokeRequest(ID=i))]
        if c < 0.26:
            return [("unary", "LeaseGrant", R.LeaseGrantRequest(ID=self.lease_id(True),
                                                                TTL=self.r.choice([9000000000, 9000000001,
                                                                                   2 ** 62])))]
        if c < 0.36:
            return [("unary", "LeaseRevoke", R.LeaseRevokeRequest(ID=self.lease_id()))]
        if c < 0.44:
            return [("keepalive", "LeaseKeepAlive", [R.LeaseKeepAliveRequest(ID=self.lease_id())
                                                     for _ in range(self.r.randint(1, 3))])]
        if c < 0.52:
            return [("unary", "LeaseTimeToLive", R.LeaseTimeToLiveRequest(ID=self.lease_id(),
                                                                           keys=self.r.random() < 0.7))]
        if c < 0.56:
            return [("unary", "LeaseLeases", R.LeaseLeasesRequest())]
        if c < 0.76:
            return [("kv", "Put", self.put())]
        if c < 0.82:
            k = self.r.choice(KEYS)
            return [("kv", "DeleteRange", R.DeleteRangeRequest(key=k, range_end=self.r.choice([b"", b"\x00", b"m0"]),
                                                               prev_kv=True))]
        if c < 0.92:
            t = R.TxnRequest()
            for _ in range(self.r.randint(1, 4)):
                o = t.success.add()
                if self.r.random() < 0.7:
                    o.request_put.CopyFrom(self.put())
                else:
                    o.request_delete_range.CopyFrom(R.DeleteRangeRequest(key=self.r.choice(KEYS)))
            if self.r.random() < 0.3:
                t.compare.add(key=self.r.choice(KEYS), target=R.Compare.LEASE, result=R.Compare.EQUAL,
                              lease=self.lease_id())
            return [("kv", "Txn", t)]
        return [("kv", "Range", R.RangeRequest(key=b"\x00", range_end=b"\x00"))]


def canon(method, ans):
    """Comparable form of an answer; (ok, bytes) or the error."""
    if ans[0] != "ok":
        return ans
    if method == "LeaseKeepAlive":
        return ("ok", [normalize(m).SerializeToString(deterministic=True) for m in ans[1]])
    m = normalize(ans[1])
    if method == "LeaseTimeToLive":
        keys = sorted(m.keys)
        del m.keys[:]
        m.keys.extend(keys)
        m.TTL = -1 if m.TTL < 0 else 0  # compared separately, with a second of slack
    if method == "LeaseLeases":
        ids = sorted(l.ID for l in m.leases)
        del m.leases[:]
        for i in ids:
            m.leases.add(ID=i)
    return ("ok", m.SerializeToString(deterministic=True))


def show(ans):
    from google.protobuf import text_format
    if ans[0] != "ok":
        return "%s %r" % (ans[1], ans[2])
    msgs = ans[1] if isinstance(ans[1], list) else [ans[1]]
    return " | ".join(text_format.MessageToString(m, as_one_line=True)[:600] for m in msgs)


def keepalive(client, reqs):
    import grpc
    f = client.ch.stream_stream("/%s/LeaseKeepAlive" % LEASE, request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=R.LeaseKeepAliveResponse.FromString)
    try:
        return ("ok", list(f(iter(reqs), timeout=10)))
    except grpc.RpcError as e:
        return ("err", e.code().name, e.details())


def call(client, kind, method, req):
    if kind == "keepalive":
        return keepalive(client, req)
    if kind == "kv":
        return client.call(method, req)
    return client.call(method, req, service=LEASE, resp=method.replace("Request", "") + "Response")


def run_seed(kvd_bin, seed, nops):
    g = Gen(seed)
    e, k = Etcd(), Kvd(kvd_bin, ["--unsafe-no-fsync"])
    ce, ck = Client(e.endpoint()), Client(k.endpoint())
    we, wk = WatchStream(e.endpoint()), WatchStream(k.endpoint())
    for w in (we, wk):
        w.create(key=b"\x00", range_end=b"\x00", prev_kv=True)
    ok = wait_for(lambda: we.got and wk.got, 60)
    n = 0
    try:
        for i in range(nops):
            for kind, method, req in g.next():
                a, b = call(ce, kind, method, req), call(ck, kind, method, req)
                n += 1
                same = canon(method, a) == canon(method, b)
                if same and method == "LeaseTimeToLive" and a[0] == "ok":
                    same = abs(a[1].TTL - b[1].TTL) <= 1
                if not same:
                    print("MISMATCH seed=%d op=%d: %s %s" % (seed, i, method, str(req).replace("\n", " ")[:300]))
                    print("  etcd: %s\n  kvd:  %s" % (show(a), show(b)))
                    return False
        # the watchers saw the same events (revokes included)
        last = ce.call("Range", R.RangeRequest(key=b"x"))[1].header.revision
        wait_for(lambda: all(any(r.header.revision >= last or (r.events and r.events[-1].kv.mod_revision >= last)
                                 for r in w.got) for w in (we, wk)) or last <= 1, 60)
        ev = lambda w: [(x.type, x.kv.key, x.kv.mod_revision, x.kv.value, x.kv.lease, x.prev_kv.value)
                        for r in w.got for x in r.events]
        if ev(we) != ev(wk):
            print("WATCH MISMATCH seed=%d: %d vs %d events" % (seed, len(ev(we)), len(ev(wk))))
            for a, b in zip(ev(we), ev(wk)):
                if a != b:
                    print("  first difference: etcd %r / kvd %r" % (a, b))
                    break
            return False
        print("  seed %d: %d requests, %d watch events identical" % (seed, n, len(ev(we))))
        return ok
    finally:
        for x in (we, wk, ce, ck):
            x.close()
        e.stop()
        k.stop()


def server_chosen_ids(kvd_bin):
    """ID 0: the server picks a positive id, different every time."""
    k = Kvd(kvd_bin)
    c = Client(k.endpoint())
    ids = [c.call("LeaseGrant", R.LeaseGrantRequest(TTL=60), service=LEASE, resp="LeaseGrantResponse")[1].ID
           for _ in range(50)]
    c.close()
    k.stop()
    good = all(i > 0 for i in ids) and len(set(ids)) == 50
    print("  server-chosen ids: %s" % ("50 distinct positive" if good else repr(ids[:5])))
    return good


def seed_test(kvd_bin, seed, nops):
    """The test lease_seed_<seed>: nops random lease and KV ops on both."""
    def fn():
        check(run_seed(kvd_bin, seed, nops), "seed %d: a mismatch (above)" % seed)
    fn.__name__ = "lease_seed_%d" % seed
    return fn


def main(argv):
    opts, argv = split_options(argv, ("--ops", "--seeds"))
    nops = int(opts.get("--ops", 400))
    seeds = [int(x) for x in opts.get("--seeds", "1,2,3").split(",")]
    kvd_bin = os.environ.get("KVD", os.path.join(ROOT, "kvd"))
    for s in seeds:  # registered here, not at import (test/lib/mkcorpus.py imports this module)
        test(seed_test(kvd_bin, s, nops))

    def server_chosen_ids_test():
        check(server_chosen_ids(kvd_bin), "server-chosen lease ids")
    server_chosen_ids_test.__name__ = "server_chosen_ids"
    test(server_chosen_ids_test)
    return run_tests(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
