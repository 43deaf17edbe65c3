#!/usr/bin/python3
"""Malformed requests, side by side with etcd 3.7.3: the same bytes to both,
the same gRPC code and text back (clients match errors by text).

- hand-made faults: every fault etcd's decoder (protobuf-go since 3.6; 3.4
  had gogo, with a text per fault) tells apart, at the top level and inside
  nested messages, and what it skips (mistyped known fields, groups) there;
- seeded mutations of valid requests of every method both serve (bit flips,
  cut, inserted and deleted bytes, rewritten tags), compared code and text;
- a Txn nested 4 400 levels deep (29 KB) -- the request that once crashed
  kvd -- and txns at kvd's nesting bound, with kvd running on a 128 KiB stack
  (`ulimit -s 128`): kvd answers and keeps serving.
Known, documented differences are named where they are skipped: txns
nested deeper than kvd's bound (32) but within etcd's (--max-txn-ops).
Last line: "N passed, N failed".
"""
import os
import random
import resource
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import (Kvd, Etcd, check, test, run_tests, h2_call, grpc_frame, pb, ROOT,
                     pb_string as field, nested_txn as nested)

KVD = os.environ.get("KVD", os.path.join(ROOT, "kvd"))
SEEDS = [int(s) for s in os.environ.get("KVD_MALFORMED_SEEDS", "1,2,3").split(",")]
MUTANTS = int(os.environ.get("KVD_MALFORMED_MUTANTS", "300"))
NEST = 32  # KVD_MAX_TXN_NEST
E, K = None, None


def answer(port, path, body):
    r = h2_call(port, path, grpc_frame(body), timeout=20)
    if r.violation or r.reset is not None or r.goaway:
        return ("transport", r.violation, r.reset, r.goaway)
    return (r.status(), r.message())


def both(path, body):
    return answer(E.port, path, body), answer(K.port, path, body)


@test
def decoder_faults():
    kv = "/etcdserverpb.KV/"
    key = field(1, b"k")
    cases = [
        (kv + "Put", key + bytes([4 << 3 | 1]) + b"\1" * 8),             # bool as fixed64
        (kv + "Put", key + b"\x0a\x05ab"),                               # cut
        (kv + "Put", key + b"\x28" + b"\xff" * 10 + b"\x01"),            # 11-byte varint
        (kv + "Put", key + b"\x0a" + b"\xff" * 9 + b"\x01"),             # negative length
        (kv + "Put", key + b"\x04"),                                     # end group
        (kv + "Put", key + b"\x02\x00"),                                 # tag 0
        (kv + "Put", key + b"\x82\x80\x80\x80\x80\x01\x00"),             # tag 0 after int32(wire >> 3)
        (kv + "Put", key + b"\x7e"),                                     # wire type 6
        (kv + "Put", key + b"\x7f"),                                     # wire type 7
        (kv + "Put", key + b"\x7d\x01\x02"),                             # fixed32 cut
        (kv + "Put", key + b"\x79" + b"\x01" * 7),                       # fixed64 cut
        (kv + "Put", key + b"\xf8\x01\x00"),                             # unknown varint field 31
        (kv + "Range", field(1, b"a") + b"\x10\x01"),                    # range_end as varint
        (kv + "Range", field(1, b"a") + b"\x1a\x01\x00"),                # limit as bytes
        (kv + "Txn", field(2, b"\x08\x01")),                             # RequestOp field 1 as varint
        (kv + "Txn", field(1, b"\x09" + b"\0" * 8)),                     # Compare.result as fixed64
        (kv + "Txn", field(1, b"\x08\x05")),                             # a compare without a key
        (kv + "Txn", field(2, field(4, field(2, b"\x04")))),             # end group two levels down
        (kv + "Txn", field(2, field(2, b"\x0a"))),                       # cut inside a nested put
        (kv + "DeleteRange", b"\x18\x02"),                               # prev_kv = 2
        (kv + "Compact", b"\x08" + b"\xff" * 9 + b"\x01"),               # revision -1
        (kv + "Compact", b"\x0a\x00"),
        ("/etcdserverpb.Lease/LeaseGrant", b"\x0a\x00"),                 # TTL as bytes
        ("/etcdserverpb.Lease/LeaseRevoke", b"\x09" + b"\0" * 8),
        ("/etcdserverpb.Lease/LeaseTimeToLive", b"\x08\x01\x12\x00"),
        ("/etcdserverpb.Maintenance/Status", b"\x0a\x01"),
        ("/etcdserverpb.Cluster/MemberList", b"\x08"),
        # grpc-go's health service: protobuf-go too (in 3.4 golang/protobuf, etcd's own gogo)
        ("/grpc.health.v1.Health/Check", b"\x08\x01"),                 # mistyped: skipped
        ("/grpc.health.v1.Health/Check", b"\x09" + b"\0" * 8),
        ("/grpc.health.v1.Health/Check", b"\x0c"),                       # field 1 as end group
        ("/grpc.health.v1.Health/Check", b"\x84\x00"),                   # tag 0
        ("/grpc.health.v1.Health/Check", b"\x02\x00"),
        ("/grpc.health.v1.Health/Check", b"\x7e"),
        ("/grpc.health.v1.Health/Check", b"\x0a\x05ab"),
        ("/grpc.health.v1.Health/Check", b"\x08" + b"\xff" * 9 + b"\x02"),  # 10th byte > 1
        ("/grpc.health.v1.Health/Check", b"\x08" + b"\xff" * 9 + b"\x01"),
        ("/grpc.health.v1.Health/Check", b"\x0a" + b"\xff" * 9 + b"\x01"),
        ("/grpc.health.v1.Health/Check", b"\x7b\x7b\x78\x01\x7c\x7c"),   # groups, skipped
        ("/grpc.health.v1.Health/Check", b"\x7b\x78\x01"),
        ("/grpc.health.v1.Health/Check", b"\x0a\x02\xff\xfe"),            # bad UTF-8, reported where met
        ("/grpc.health.v1.Health/Check", b"\x0a\x02\xc0\x80\x0a\x01a"),
        ("/grpc.health.v1.Health/Check", b"\x0a\x02\xff\xfe\x7e"),
        ("/grpc.health.v1.Health/Check", b"\x0a\x03\xed\xa0\x80"),
        ("/grpc.health.v1.Health/Check", b"\x0a\x03foo"),
        ("/grpc.health.v1.Health/Check", b"\x82\x80\x80\x80\x80\x01\x00"),
        ("/etcdserverpb.Auth/Authenticate", b"\x0a\x02\xc3\x28"),          # bad UTF-8 in etcd's own
        ("/etcdserverpb.Auth/Authenticate", b"\x0a\x02\xc3\x28\x7e"),      # ... before a worse fault
        ("/etcdserverpb.Auth/Authenticate", b"\x7e\x0a\x02\xc3\x28"),      # ... after one
        ("/etcdserverpb.Cluster/MemberAdd", b"\x0a\x02\xc3\x28"),           # a repeated string
        (kv + "Put", field(1, b"\xc3\x28")),                             # bytes: anything
        (kv + "Put", key + b"\xf8\xff\xff\xff\x0f\x00"),                 # field 2^29-1
        (kv + "Put", key + b"\x80\x80\x80\x80\x10\x00"),                 # field 2^29
        (kv + "Put", key + b"\x7b\x78\x01\x84\x01"),                      # a group closed by another number
        # unknown fields as groups: skipped by both
        (kv + "Put", key + b"\x7b\x78\x01\x7c"),
        (kv + "Range", field(1, b"a") + b"\x7b\x7b\x7c\x7c\x7b\x74"),
    ]
    for path, body in cases:
        e, k = both(path, body)
        check(e == k, "%s %s: etcd %r, kvd %r" % (path, body.hex(), e, k))
    # below the top level, what etcd skips and protobuf-c cannot take: kvd strips it first
    for body in (field(2, field(2, key + b"\x7b\x78\x01\x7c")),       # a group in a Put in a Txn
                 field(2, field(1, key + b"\x18\x00")),                  # RangeRequest.range_end as a varint
                 field(2, field(4, field(2, field(1, b"\x0a\x01\x61" + b"\x8a\x80\x80\x80\x80\x00\x01b"))))):
        e, k = both(kv + "Txn", body)
        check(e == k and e[0] == "0", "stripped below the top level %s: etcd %r, kvd %r" % (body.hex(), e, k))


@test
def repeated_messages_are_merged():
    """A singular message field sent twice is one message, its copies'
    fields merged (protobuf's rule; etcd's decoder), not the last copy
    alone: a put's key from one copy and its value from the other, a
    watch's key and range end, a permission's key and type.  A oneof set
    to another member in between starts afresh."""
    from kvdtest import Client
    rpc = pb()["rpc"]
    kv = "/etcdserverpb.KV/"
    put = lambda **kw: field(2, rpc.PutRequest(**kw).SerializeToString())      # RequestOp.request_put
    rng = lambda **kw: field(1, rpc.RangeRequest(**kw).SerializeToString())    # RequestOp.request_range
    cases = [
        field(2, put(key=b"m1") + put(value=b"mv")),                     # one put: m1=mv
        field(2, put(key=b"m2", value=b"a") + put(value=b"b") + put(key=b"m3")),  # m3=b
        field(2, put(key=b"m4", value=b"x") + rng(key=b"m4") + put(value=b"y")),  # switched: put of "" (refused)
        field(2, put(key=b"m5", value=b"x") + rng(key=b"m5")),           # a range of m5
        field(2, field(4, field(1, rpc.Compare(key=b"m1", target=3, value=b"mv").SerializeToString())) +
              field(4, field(2, put(key=b"m6", value=b"t")))),          # txn{compare} txn{success}: m6=t
    ]
    for i, body in enumerate(cases):
        e, k = both(kv + "Txn", body)
        check(e == k, "case %d %s: etcd %r, kvd %r" % (i, body.hex(), e, k))
    for key in (b"m1", b"m2", b"m3", b"m4", b"m5", b"m6", b""):
        r = [Client(x.endpoint()).call("Range", rpc.RangeRequest(key=key)) for x in (E, K)]
        kvs = [[(kv_.key, kv_.value) for kv_ in a[1].kvs] if a[0] == "ok" else a for a in r]
        check(kvs[0] == kvs[1], "%r as etcd stores it: etcd %r, kvd %r" % (key, kvs[0], kvs[1]))
    e = Client(E.endpoint()).call("Range", rpc.RangeRequest(key=b"m1"))
    check(e[0] == "ok" and [(x.key, x.value) for x in e[1].kvs] == [(b"m1", b"mv")], "etcd merged them: %r" % (e,))
    # a watch created from two copies of create_request: [w1, w3) from revision 1
    from kvdtest import grpc_messages
    creq = lambda **kw: field(1, rpc.WatchCreateRequest(**kw).SerializeToString())
    seen = []
    for x in (E, K):
        c = Client(x.endpoint())
        first = None
        for key in (b"w0", b"w2", b"w4"):
            a = c.call("Put", rpc.PutRequest(key=key, value=b"v"))
            first = first or a[1].header.revision
        body = grpc_frame(creq(key=b"w1", start_revision=first) + creq(range_end=b"w3"))
        evs = lambda r: [e.kv.key for m in grpc_messages(r.data) for e in rpc.WatchResponse.FromString(m).events]
        r = h2_call(x.port, "/etcdserverpb.Watch/Watch", body, timeout=10, half_close=False,
                    read_until=lambda r: evs(r))
        seen.append(evs(r))
    check(seen[0] == seen[1] == [b"w2"], "the watch covers [w1, w3): etcd %r, kvd %r" % tuple(seen))
    # a permission from two copies: key from one, READWRITE from the other
    perm = lambda **kw: field(2, pb()["auth"].Permission(**kw).SerializeToString())
    for x in (E, K):
        c = Client(x.endpoint())
        c.call("RoleAdd", rpc.AuthRoleAddRequest(name="mr"), service="etcdserverpb.Auth", resp="AuthRoleAddResponse")
    body = pb_string_name(b"mr") + perm(key=b"pk") + perm(permType=2)
    e, k = both("/etcdserverpb.Auth/RoleGrantPermission", body)
    check(e == k and e[0] == "0", "RoleGrantPermission: etcd %r, kvd %r" % (e, k))
    got = []
    for x in (E, K):
        a = Client(x.endpoint()).call("RoleGet", rpc.AuthRoleGetRequest(role="mr"), service="etcdserverpb.Auth",
                                      resp="AuthRoleGetResponse")
        got.append([(p.key, p.permType) for p in a[1].perm] if a[0] == "ok" else a)
    check(got[0] == got[1] == [(b"pk", 2)], "the permission as etcd merged it: etcd %r, kvd %r" % tuple(got))


def no_revisions(m):
    """m with its headers and every revision field cleared (two servers'
    histories differ): what a request did, compared."""
    for f, v in list(m.ListFields()):
        if f.name == "header" or f.name.endswith("revision"):
            m.ClearField(f.name)
        elif f.type == f.TYPE_MESSAGE:
            for x in (v if f.label == f.LABEL_REPEATED else [v]):
                no_revisions(x)
    return m


@test
def random_repeated_fields_merge_as_etcd():
    """Seeded random Txns whose ops are each several copies of oneof members
    (puts, ranges and deletes of three keys, in pieces): kvd's answers and
    effects as etcd 3.7.3's, revisions aside."""
    from kvdtest import grpc_messages
    rpc = pb()["rpc"]
    keys = [b"rm-a", b"rm-b", b"rm-c"]
    for seed in SEEDS:
        rnd = random.Random(seed)
        for i in range(60):
            def piece():
                k, v = rnd.choice(keys), b"v%d" % rnd.randrange(100)
                return rnd.choice([
                    field(2, rpc.PutRequest(key=k).SerializeToString()),
                    field(2, rpc.PutRequest(value=v).SerializeToString()),
                    field(2, rpc.PutRequest(prev_kv=True).SerializeToString()),
                    field(2, rpc.PutRequest(key=k, value=v).SerializeToString()),
                    field(1, rpc.RangeRequest(key=k).SerializeToString()),
                    field(1, rpc.RangeRequest(range_end=b"rm-z").SerializeToString()),
                    field(3, rpc.DeleteRangeRequest(key=k, prev_kv=rnd.random() < 0.5).SerializeToString())])
            ops = [b"".join(piece() for _ in range(rnd.randint(1, 4))) for _ in range(rnd.randint(1, 3))]
            body = b"".join(field(2, op) for op in ops)
            got = []
            for x in (E, K):
                r = h2_call(x.port, "/etcdserverpb.KV/Txn", grpc_frame(body), timeout=20)
                msgs = grpc_messages(r.data)
                got.append((r.status(), r.message(),
                            no_revisions(rpc.TxnResponse.FromString(msgs[0])) if msgs else None))
            if not check(got[0] == got[1], "seed %d #%d %s: etcd %s, kvd %s" % (seed, i, body.hex(), got[0], got[1])):
                return


def pb_string_name(b):
    return field(1, b)


def valid_requests(rpc):
    kv = "/etcdserverpb.KV/"
    put = rpc.PutRequest(key=b"k1", value=b"v1", prev_kv=True)
    txn = rpc.TxnRequest(compare=[rpc.Compare(result=1, target=3, key=b"k1", value=b"v1")],
                         success=[rpc.RequestOp(request_put=put),
                                  rpc.RequestOp(request_range=rpc.RangeRequest(key=b"k1"))],
                         failure=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=b"k1"))])
    return [
        (kv + "Put", put),
        (kv + "Range", rpc.RangeRequest(key=b"a", range_end=b"z", limit=3, sort_order=2, sort_target=1)),
        (kv + "DeleteRange", rpc.DeleteRangeRequest(key=b"q", range_end=b"r", prev_kv=True)),
        (kv + "Txn", txn),
        (kv + "Txn", rpc.TxnRequest(success=[rpc.RequestOp(request_txn=txn)])),
        ("/etcdserverpb.Lease/LeaseTimeToLive", rpc.LeaseTimeToLiveRequest(ID=5, keys=True)),
        ("/etcdserverpb.Lease/LeaseRevoke", rpc.LeaseRevokeRequest(ID=77)),
        ("/etcdserverpb.Maintenance/Status", rpc.StatusRequest()),
        ("/grpc.health.v1.Health/Check", pb()["health"].HealthCheckRequest(service="")),
        ("/etcdserverpb.Cluster/MemberList", rpc.MemberListRequest(linearizable=True)),
    ]


def mutate(rnd, b):
    b = bytearray(b)
    for _ in range(rnd.randint(1, 3)):
        op = rnd.randrange(6)
        if op == 0 and b:
            i = rnd.randrange(len(b))
            b[i] ^= 1 << rnd.randrange(8)
        elif op == 1 and b:
            del b[rnd.randrange(len(b)):]
        elif op == 2:
            b.insert(rnd.randrange(len(b) + 1), rnd.randrange(256))
        elif op == 3 and b:
            del b[rnd.randrange(len(b))]
        elif op == 4:  # a tag with a random field number and wire type
            b[rnd.randrange(len(b) + 1):0] = bytes([rnd.randrange(1, 16) << 3 | rnd.randrange(8)])
        elif op == 5 and b:
            i = rnd.randrange(len(b))
            b[i] = rnd.choice([0x00, 0x7f, 0x80, 0xff])
    return bytes(b)


def ranges(m):
    """Every RangeRequest in a request, nested txns included."""
    if m.DESCRIPTOR.name == "RangeRequest":
        yield m
    elif m.DESCRIPTOR.name == "TxnRequest":
        for op in list(m.success) + list(m.failure):
            if op.HasField("request_range"):
                yield op.request_range
            elif op.HasField("request_txn"):
                yield from ranges(op.request_txn)


@test
def mutated_requests():
    rpc = pb()["rpc"]
    reqs = valid_requests(rpc)
    same = skipped = 0
    for seed in SEEDS:
        rnd = random.Random(seed)
        for i in range(MUTANTS):
            path, m = rnd.choice(reqs)
            body = mutate(rnd, m.SerializeToString())
            e, k = both(path, body)
            if not check(e == k, "seed %d #%d %s %s: etcd %r, kvd %r" % (seed, i, path, body.hex(), e, k)):
                return
            same += 1
    print("    %d mutated requests answered alike" % same)


def small_stack():
    resource.setrlimit(resource.RLIMIT_STACK, (128 * 1024, 128 * 1024))


@test
def deep_txn_on_a_small_stack():
    """kvd on a 128 KiB stack: the 29 KB txn nested 4 400 deep gets etcd's
    answer, txns at the bound are served, and kvd goes on serving."""
    import kvdtest
    spawn = kvdtest.spawn
    kvdtest.spawn = lambda cmd, **kw: spawn(cmd, preexec_fn=small_stack, **kw)
    try:
        k = Kvd(KVD)
    finally:
        kvdtest.spawn = spawn
    put = field(1, b"deep") + field(2, b"v")
    deep = nested(4400)
    check(len(deep) > 29000, "29 KB: %d" % len(deep))
    for levels, leaf, want_ok in ((4400, b"", False), (NEST + 1, b"", False), (NEST, field(2, field(2, put)), True),
                                  (NEST, b"", True)):
        body = nested(levels, leaf)
        got = answer(k.port, "/etcdserverpb.KV/Txn", body)
        want = ("0", "") if want_ok else ("3", "etcdserver: too many operations in txn request")
        check(got == want, "%d levels: %r" % (levels, got))
        check(k.alive(), "kvd alive after %d levels" % levels)
        if levels < 128:  # within --max-txn-ops etcd serves it all, kvd up to its bound
            e = answer(E.port, "/etcdserverpb.KV/Txn", body)
            check(e == ("0", ""), "etcd, %d levels: %r" % (levels, e))
    r = answer(k.port, "/etcdserverpb.KV/Range", field(1, b"deep"))
    check(r == ("0", ""), "served after: %r" % (r,))
    st = open("/proc/%d/limits" % k.p.pid).read()
    check("Max stack size            131072" in st, "kvd ran with a 128 KiB stack")
    k.stop()
    check(k.p.returncode == 0, "clean exit: %r" % k.p.returncode)


def main():
    global E, K
    E, K = Etcd(), Kvd(KVD, ["--unsafe-no-fsync"])
    try:
        return run_tests(sys.argv)
    finally:
        K.stop()
        E.stop()


if __name__ == "__main__":
    sys.exit(main())
