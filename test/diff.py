#!/usr/bin/python3
"""Differential test: the same seeded random KV operations against the etcd
3.7.3 oracle (test/peers) and kvd, every response compared field by field
(headers without cluster_id, member_id, raft_term).  Errors must match in
code and text.

  test/diff.py [--ops N] [--seeds a,b,c] [--kvd PATH] [name-filter]
  test/diff.py --replay FILE     rerun a saved sequence, print every answer pair

One test per seed (kv_seed_N; KVD_DIFF_SEEDS=1,2,3,4 and KVD_DIFF_OPS=5000
unless --seeds/--ops say otherwise), run by kvdtest's runner.

Also checks, on kvd alone, that RangeStream's merged chunks equal Range's
answer for the same request.  On a mismatch it prints the seed, the op, both
answers, then shrinks the run to the shortest failing sequence it can find
(both servers restarted fresh for every attempt).  Last line:
"N passed, N failed".
"""
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import ROOT, Etcd, Kvd, Client, check, pb, run_tests, split_options, test

R = pb()["rpc"]
KEYS = [b"a", b"b", b"c", b"ab", b"abc", b"b\x00", b"\x00", b"\x01", b"\xff", b"\xff\xff", b"a\xff",
        b"k/1", b"k/2", b"k/10", b"k/2/x", b"k0", b"z", b"zz", b"p/", b"p/050", b"p/100"]


def prefix_end(k):
    k = bytearray(k)
    while k and k[-1] == 0xFF:
        k.pop()
    if not k:
        return b"\x00"
    k[-1] += 1
    return bytes(k)


class Gen:
    """Random requests; knows the revision and compaction point so that
    revision arguments hit past, current, future and compacted values."""

    def __init__(self, seed):
        self.r = random.Random(seed)
        self.rev = 1
        self.compacted = 0

    def key(self, allow_empty=True):
        r = self.r.random()
        if allow_empty and r < 0.01:
            return b""
        if r < 0.05:
            return bytes(self.r.randrange(256) for _ in range(self.r.randint(1, 3)))
        return self.r.choice(KEYS)

    def end(self, key):
        c = self.r.random()
        if c < 0.45:
            return b""
        if c < 0.6:
            return b"\x00"
        if c < 0.8:
            return prefix_end(key or b"a")
        return self.r.choice(KEYS)

    def value(self):
        c = self.r.random()
        if c < 0.1:
            return b""
        if c < 0.12:
            return bytes(self.r.randrange(256) for _ in range(self.r.randint(100, 3000)))
        return bytes(self.r.choice(b"xyz01") for _ in range(self.r.randint(1, 8)))

    def rev_arg(self):
        c = self.r.random()
        if c < 0.6:
            return 0
        if c < 0.7:
            return self.rev
        if c < 0.75:
            return self.rev + self.r.randint(1, 3)
        if c < 0.8:
            return max(0, self.compacted - self.r.randint(0, 2))
        return self.r.randint(1, max(1, self.rev))

    def range_req(self, nested=False):
        k = self.key()
        q = R.RangeRequest(key=k, range_end=self.end(k))
        if self.r.random() < 0.3:
            q.limit = self.r.choice([-1, 0, 1, 2, 3, 5, 2 ** 63 - 1])
        q.revision = self.rev_arg()
        if self.r.random() < 0.35:
            q.sort_order = self.r.choice([0, 1, 2, 2, 1, 5])
            q.sort_target = self.r.choice([0, 1, 2, 3, 4])
        q.serializable = self.r.random() < 0.2
        q.keys_only = self.r.random() < 0.15
        q.count_only = self.r.random() < 0.1
        if self.r.random() < 0.2:
            for f in ("min_mod_revision", "max_mod_revision", "min_create_revision", "max_create_revision"):
                if self.r.random() < 0.4:
                    setattr(q, f, self.r.randint(0, self.rev + 1))
        return q

    def put_req(self):
        q = R.PutRequest(key=self.key(), value=self.value())
        c = self.r.random()
        if c < 0.05:
            q.lease = self.r.choice([1, 12345, -7])
        q.prev_kv = self.r.random() < 0.3
        if self.r.random() < 0.06:
            q.ignore_value = True
            if self.r.random() < 0.7:
                q.value = b""
        if self.r.random() < 0.06:
            q.ignore_lease = True
            if self.r.random() < 0.8:
                q.lease = 0
        return q

    def delete_req(self):
        k = self.key()
        return R.DeleteRangeRequest(key=k, range_end=self.end(k), prev_kv=self.r.random() < 0.4)

    def compare(self):
        c = R.Compare(key=self.key(), result=self.r.choice([0, 1, 2, 3, 0, 0, 7]),
                      target=self.r.choice([0, 1, 2, 3, 4]))
        if self.r.random() < 0.2:
            c.range_end = self.end(c.key)
        u = self.r.random()
        t = c.target if u < 0.8 else self.r.choice([0, 1, 2, 3, 4])
        if u < 0.95:
            if t == 0:
                c.version = self.r.randint(0, 4)
            elif t == 1:
                c.create_revision = self.r.randint(0, self.rev)
            elif t == 2:
                c.mod_revision = self.r.randint(0, self.rev)
            elif t == 3:
                c.value = self.value()
            else:
                c.lease = self.r.choice([0, 0, 1])
        return c

    def op(self, depth):
        c = self.r.random()
        o = R.RequestOp()
        if c < 0.3:
            o.request_range.CopyFrom(self.range_req())
        elif c < 0.65:
            o.request_put.CopyFrom(self.put_req())
        elif c < 0.85:
            o.request_delete_range.CopyFrom(self.delete_req())
        elif c < 0.97 and depth < 2:
            o.request_txn.CopyFrom(self._txn_req(depth + 1))
        elif c < 0.985:
            pass  # an empty RequestOp
        else:
            o.request_range.CopyFrom(self.range_req())
        return o

    @staticmethod
    def _walk(t):
        for br in (t.success, t.failure):
            for o in br:
                yield o
                if o.HasField("request_txn"):
                    yield from Gen._walk(o.request_txn)

    def txn_req(self, depth=0):
        t = self._txn_req(depth)
        if depth == 0 and any(o.HasField("request_delete_range") for o in self._walk(t)):
            # etcd 3.4 panics (apply.go "unexpected error during txn") when an
            # ignore_value/ignore_lease put meets a key deleted earlier in the
            # same txn; kvd answers "etcdserver: key not found".  Keep etcd alive.
            for o in self._walk(t):
                if o.HasField("request_put"):
                    o.request_put.ignore_value = False
                    o.request_put.ignore_lease = False
        return t

    def _txn_req(self, depth=0):
        t = R.TxnRequest()
        if depth == 0 and self.r.random() < 0.02:  # the max-txn-ops edge
            n = self.r.choice([128, 129])
            for i in range(n):
                t.success.add().request_put.CopyFrom(R.PutRequest(key=b"m/%d" % i, value=b"v"))
            return t
        for _ in range(self.r.randint(0, 3)):
            t.compare.append(self.compare())
        for _ in range(self.r.randint(0, 4)):
            t.success.append(self.op(depth))
        for _ in range(self.r.randint(0, 3)):
            t.failure.append(self.op(depth))
        return t

    def bulk_req(self):
        """Many keys under p/ with patterned values, so sorts see ties,
        runs and reversals (pdqsort's insertion, ninther and pattern paths)."""
        t = R.TxnRequest()
        n = self.r.randint(20, 128)
        pat = self.r.choice(["asc", "desc", "same", "saw", "rand"])
        for i in self.r.sample(range(200), n):
            v = {"asc": i, "desc": 200 - i, "same": 7, "saw": i % 5, "rand": self.r.randrange(10)}[pat]
            t.success.add().request_put.CopyFrom(R.PutRequest(key=b"p/%03d" % i, value=b"%03d" % v))
        return t

    def compact_req(self):
        c = self.r.random()
        if c < 0.5:
            rev = self.r.randint(max(0, self.compacted - 1), self.rev)
        elif c < 0.7:
            rev = self.rev + self.r.randint(0, 2)
        else:
            rev = self.r.randint(0, max(1, self.compacted))
        return R.CompactionRequest(revision=rev, physical=self.r.random() < 0.5)

    def next(self):
        c = self.r.random()
        if c < 0.33:
            return "Put", self.put_req()
        if c < 0.63:
            return "Range", self.range_req()
        if c < 0.73:
            return "DeleteRange", self.delete_req()
        if c < 0.96:
            return "Txn", self.txn_req()
        if c < 0.985:
            return "Compact", self.compact_req()
        if c < 0.995:
            return "Txn", self.bulk_req()
        if c < 0.9965:  # over --max-request-bytes (not over the gRPC cap)
            return "Put", R.PutRequest(key=b"big", value=b"v" * 1600000)
        return "Put", R.PutRequest(key=b"big", value=b"v" * 1400000)

    def learn(self, method, req, ans):
        """Track revision and compaction from etcd's answer."""
        if ans[0] == "ok" and ans[1].HasField("header"):
            self.rev = max(self.rev, ans[1].header.revision)
        if method == "Compact" and ans[0] == "ok":
            self.compacted = req.revision


def normalize(msg):
    """Clear what legitimately differs: cluster/member ids, raft term."""
    for fd, val in msg.ListFields():
        if fd.message_type is None:
            continue
        items = val if fd.label == fd.LABEL_REPEATED else [val]
        for v in items:
            if fd.message_type.name == "ResponseHeader":
                v.ClearField("cluster_id")
                v.ClearField("member_id")
                v.ClearField("raft_term")
            else:
                normalize(v)
    return msg


def canon(ans):
    if ans[0] == "ok":
        return ("ok", normalize(ans[1]).SerializeToString(deterministic=True))
    return ans


def show(ans):
    if ans[0] == "ok":
        from google.protobuf import text_format
        return text_format.MessageToString(ans[1], as_one_line=True, as_utf8=False)[:1500]
    return "%s %r" % (ans[1], ans[2])


def brief(method, req):
    from google.protobuf import text_format
    t = text_format.MessageToString(req, as_one_line=True)
    return "%s %s" % (method, t[:600] + ("..." if len(t) > 600 else ""))


def merge_stream(chunks):
    out = R.RangeResponse()
    for c in chunks:
        out.MergeFrom(c.range_response)
    return out


class Pair:
    def __init__(self, kvd_bin):
        self.etcd = Etcd()
        # log rewrites often, so answers and hashes are compared across them too
        self.kvd = Kvd(kvd_bin, ["--unsafe-no-fsync", "--auto-rewrite-percent", "0",
                                 "--auto-rewrite-min-bytes", "65536"])
        self.ce = Client(self.etcd.endpoint())
        self.ck = Client(self.kvd.endpoint())

    def run(self, method, req):
        return self.ce.call(method, req), self.ck.call(method, req)

    def close(self):
        self.ce.close()
        self.ck.close()
        self.etcd.stop()
        self.kvd.stop()
        self.rewrites = self.kvd.logtext().count("log rewritten:")


def replay(kvd_bin, ops):
    """Run ops on fresh servers; index of the first mismatch or -1."""
    p = Pair(kvd_bin)
    try:
        for i, (m, q) in enumerate(ops):
            e, k = p.run(m, q)
            if canon(e) != canon(k):
                return i
        return -1
    finally:
        p.close()


def shrink(kvd_bin, ops, budget=60):
    """Greedy delta debugging: drop chunks while a mismatch remains."""
    n = 2
    while len(ops) >= 2 and budget > 0:
        chunk = max(1, len(ops) // n)
        removed = False
        for s in range(0, len(ops), chunk):
            if budget <= 0:
                break
            cand = ops[:s] + ops[s + chunk:]
            budget -= 1
            i = replay(kvd_bin, cand)
            if i >= 0:
                ops = cand[:i + 1]
                n = max(n - 1, 2)
                removed = True
                break
        if not removed:
            if chunk == 1:
                break
            n = min(len(ops), n * 2)
    return ops


def hashkv_check(p, g, rnd, seed, i, stats):
    """HashKV at the current revision and at one between the compaction and
    now (or just past it): same hash, compact revision and errors."""
    for rev in (0, rnd.randint(max(1, g.compacted), g.rev + 1)):
        q = R.HashKVRequest(revision=rev)
        e = p.ce.call("HashKV", q, service="etcdserverpb.Maintenance", resp="HashKVResponse")
        k = p.ck.call("HashKV", q, service="etcdserverpb.Maintenance", resp="HashKVResponse")
        stats["hashkv"] += 1
        if not check(canon(e) == canon(k), "HASHKV MISMATCH seed=%d op=%d rev=%d" % (seed, i, rev)):
            print("  etcd: %s\n  kvd:  %s" % (show(e), show(k)))


def run_seed(kvd_bin, seed, nops, stats):
    g = Gen(seed)
    p = Pair(kvd_bin)
    rnd = random.Random(seed * 7919)
    physical = True  # etcd purges a compaction in the background unless asked to wait
    done = []
    try:
        for i in range(nops):
            method, req = g.next()
            e, k = p.run(method, req)
            done.append((method, req))
            stats["ops"] += 1
            stats[e[0]] += 1
            if canon(e) != canon(k):
                print("MISMATCH seed=%d op=%d: %s" % (seed, i, brief(method, req)))
                print("  etcd: %s" % show(e))
                print("  kvd:  %s" % show(k))
                if not p.kvd.alive():
                    print("  kvd DIED: %s" % p.kvd.logtext()[-3000:])
                return done
            g.learn(method, req, e)
            if method == "Compact" and e[0] == "ok":
                physical = req.physical
            if (i % 40 == 0 or (method == "Compact" and e[0] == "ok")) and physical:
                hashkv_check(p, g, rnd, seed, i, stats)
            if i % 25 == 0:  # RangeStream property, on kvd alone
                q = g.range_req()
                q.sort_order = 0
                q.sort_target = 0
                for f in ("min_mod_revision", "max_mod_revision", "min_create_revision", "max_create_revision"):
                    q.ClearField(f)
                if q.key:
                    a = p.ck.call("Range", q)
                    b = p.ck.stream("RangeStream", q, "RangeStreamResponse")
                    if a[0] == "ok":
                        ok = b[0] == "ok" and canon(("ok", merge_stream(b[1]))) == canon(a)
                    else:
                        ok = b[0] == "err" and b[1:] == a[1:]
                    stats["stream"] += 1
                    if not check(ok, "RANGESTREAM MISMATCH seed=%d op=%d: %s" % (seed, i, brief("Range", q))):
                        print("  Range:       %s" % show(a))
                        print("  RangeStream: %s" % (show(("ok", merge_stream(b[1]))) if b[0] == "ok" else show(b)))
        return None
    finally:
        p.close()
        stats["rewrites"] = stats.get("rewrites", 0) + p.rewrites


def save(path, ops):
    import base64
    with open(path, "w") as f:
        for m, q in ops:
            f.write("%s %s\n" % (m, base64.b64encode(q.SerializeToString()).decode()))


def load(path):
    import base64
    cls = {"Range": R.RangeRequest, "Put": R.PutRequest, "DeleteRange": R.DeleteRangeRequest,
           "Txn": R.TxnRequest, "Compact": R.CompactionRequest}
    ops = []
    with open(path) as f:
        for line in f:
            m, _, b = line.strip().partition(" ")
            ops.append((m, cls[m].FromString(base64.b64decode(b))))
    return ops


def seed_test(kvd_bin, seed, nops):
    """The test kv_seed_<seed>: nops random ops on a fresh etcd and kvd,
    every answer compared, RangeStream and HashKV checked on the way; a
    mismatch shrinks to the shortest failing sequence, saved for --replay."""
    def fn():
        stats = {"ops": 0, "ok": 0, "err": 0, "stream": 0, "hashkv": 0}
        t0 = time.time()
        bad = run_seed(kvd_bin, seed, nops, stats)
        if check(bad is None, "seed %d: a mismatch (above)" % seed):
            print("  seed %d: %d ops identical" % (seed, nops), flush=True)
        else:
            print("shrinking %d ops..." % len(bad), flush=True)
            small = shrink(kvd_bin, bad)
            print("shortest failing sequence (seed %d, %d ops):" % (seed, len(small)))
            for m, q in small:
                print("  " + brief(m, q))
            path = "/tmp/kvd-diff-seed%d.ops" % seed
            save(path, small)
            print("saved: replay with test/diff.py --replay %s" % path)
        print("  %d ops (%d answered, %d errors) in %.1fs; %d RangeStream checks, %d HashKV comparisons, "
              "%d log rewrites in kvd" % (stats["ops"], stats["ok"], stats["err"], time.time() - t0, stats["stream"],
                                          stats["hashkv"], stats.get("rewrites", 0)), flush=True)
    fn.__name__ = "kv_seed_%d" % seed
    return fn


def main(argv):
    if "--replay" in argv:  # run a saved sequence, print every answer pair
        p = Pair(os.environ.get("KVD", os.path.join(ROOT, "kvd")))
        try:
            for m, q in load(argv[argv.index("--replay") + 1]):
                e, k = p.run(m, q)
                print(("same  " if canon(e) == canon(k) else "DIFF  ") + brief(m, q))
                if canon(e) != canon(k):
                    print("  etcd: %s\n  kvd:  %s" % (show(e), show(k)))
        finally:
            p.close()
        return 0
    opts, argv = split_options(argv, ("--ops", "--seeds", "--kvd"))
    nops = int(opts.get("--ops", os.environ.get("KVD_DIFF_OPS", "5000")))
    seeds = [int(x) for x in opts.get("--seeds", os.environ.get("KVD_DIFF_SEEDS", "1,2,3,4")).split(",")]
    kvd_bin = opts.get("--kvd", os.environ.get("KVD", os.path.join(ROOT, "kvd")))
    for seed in seeds:  # registered here, not at import: other suites import this module
        test(seed_test(kvd_bin, seed, nops))
    return run_tests(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
