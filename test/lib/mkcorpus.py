#!/usr/bin/python3
"""Seed the fuzz corpora from real clients (run by hand, output committed).

usage: test/lib/mkcorpus.py KVD_PORT   (h2 and hpack seeds)
       test/lib/mkcorpus.py log        (log seeds: kvd's own logs under random traffic)
       test/lib/mkcorpus.py confd      (JSON documents and confd datagrams)
       test/lib/mkcorpus.py pb         (request messages of every gRPC method)
       test/lib/mkcorpus.py bolt       (snapshot files from etcd and kvd)
       test/lib/mkcorpus.py auth       (a log with AUTH records; snapshots with users and roles)
       test/lib/mkcorpus.py http1      (gateway requests as curl sends them; JSON for the mapping)
       test/lib/mkcorpus.py security2  (the second security round's inputs: NUL names, repeated oneofs, JWT claims, framings)
A relay on a free port records what each client sends to kvd at KVD_PORT:
etcdctl 3.4 (grpc-go), grpcio, python-h2 with padding/PRIORITY/CONTINUATION.
Each capture becomes test/corpus/h2/<name> (behind a mode byte, see
fuzz_h2.c) and its HEADERS blocks become test/corpus/hpack/<name>-N.
"""
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import grpc
import h2.config
import h2.connection

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # test/ (this file is in test/lib/)


def relay(kvd_port, record):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)

    def serve():
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            u = socket.create_connection(("127.0.0.1", kvd_port))

            def pump(a, b, rec):
                try:
                    while True:
                        d = a.recv(65536)
                        if not d:
                            break
                        if rec:
                            record.append(d)
                        b.sendall(d)
                except OSError:
                    pass
                try:
                    b.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
            threading.Thread(target=pump, args=(c, u, True), daemon=True).start()
            threading.Thread(target=pump, args=(u, c, False), daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    return ls


def capture(kvd_port, name, fn):
    rec = []
    ls = relay(kvd_port, rec)
    fn(ls.getsockname()[1])
    time.sleep(0.3)
    ls.close()
    data = b"".join(rec)
    if not data:
        return
    for mode, suffix in ((0x1E, ""), (0x10, "-bytewise")):
        with open(os.path.join(HERE, "corpus", "h2", name + suffix), "wb") as f:
            f.write(bytes([mode]) + data)
    # header blocks (HEADERS payload without padding/priority) for the hpack corpus
    off, i = 24, 0
    while off + 9 <= len(data):
        ln = int.from_bytes(data[off:off + 3], "big")
        typ, flags = data[off + 3], data[off + 4]
        p = data[off + 9:off + 9 + ln]
        if typ == 1:
            if flags & 0x8:
                p = p[1:len(p) - p[0]]
            if flags & 0x20:
                p = p[5:]
            with open(os.path.join(HERE, "corpus", "hpack", "%s-%d" % (name, i)), "wb") as f:
                f.write(b"\xff\x00" + p)
            i += 1
        off += 9 + ln


def etcdctl(*args):
    def run(port):
        subprocess.run(["etcdctl", "--endpoints", "127.0.0.1:%d" % port] + list(args),
                       env=dict(os.environ, ETCDCTL_API="3"), capture_output=True, timeout=10)
    return run


def grpcio_calls(port):
    ch = grpc.insecure_channel("127.0.0.1:%d" % port)
    ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5)
    for p in ("/etcdserverpb.Maintenance/Status", "/etcdserverpb.Cluster/MemberList", "/x.Y/Z"):
        try:
            ch.unary_unary(p)(b"", timeout=5)
        except grpc.RpcError:
            pass
    ch.close()


def h2_odd(port):
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    s = socket.create_connection(("127.0.0.1", port))
    hdrs = [(":method", "POST"), (":scheme", "http"), (":path", "/grpc.health.v1.Health/Check"),
            (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers"),
            ("grpc-timeout", "5S"), ("x-pad", "p" * 300)]
    c.send_headers(1, hdrs, priority_weight=32, priority_depends_on=0, priority_exclusive=False)
    c.send_data(1, b"\0\0\0\0\0", end_stream=True, pad_length=7)
    c.ping(b"12345678")
    c.increment_flow_control_window(1000)
    s.sendall(c.data_to_send())
    # a block split into HEADERS + CONTINUATION, by hand
    blk = c.encoder.encode(hdrs)
    fr = lambda t, f, sid, p: struct.pack(">I", len(p))[1:] + bytes([t, f]) + struct.pack(">I", sid) + p
    s.sendall(fr(1, 0, 3, blk[:20]) + fr(9, 0, 3, blk[20:40]) + fr(9, 4, 3, blk[40:]) +
              fr(0, 1, 3, b"\0\0\0\0\0"))
    time.sleep(0.3)
    s.close()


def log_seeds():
    """Logs written by kvd itself under random KV and lease traffic
    (test/diff.py's and test/leasediff.py's generators): test/corpus/log/."""
    sys.path.insert(0, HERE)
    from kvdtest import Kvd, Client
    from diff import Gen
    for seed, nops in ((1, 40), (2, 150), (3, 400)):
        k = Kvd(os.path.join(os.path.dirname(HERE), "kvd"))
        c = Client(k.endpoint())
        g = Gen(seed)
        for _ in range(nops):
            m, q = g.next()
            if m == "Put" and len(q.value) > 100000:
                continue
            g.learn(m, q, c.call(m, q))
        c.close()
        k.stop()
        data = open(os.path.join(k.dir, "kvd.log"), "rb").read()
        with open(os.path.join(HERE, "corpus", "log", "kvd-%d" % seed), "wb") as f:
            f.write(b"\x00" + data)
        with open(os.path.join(HERE, "corpus", "log", "kvd-%d-noheader" % seed), "wb") as f:
            f.write(b"\x01" + data[21:])
    # leases: grants, attached keys, revokes (test/leasediff.py's generator)
    from leasediff import Gen as LeaseGen, call
    for seed, nops in ((1, 60), (2, 200)):
        k = Kvd(os.path.join(os.path.dirname(HERE), "kvd"))
        c = Client(k.endpoint())
        g = LeaseGen(seed)
        for _ in range(nops):
            for kind, m, q in g.next():
                call(c, kind, m, q)
        c.close()
        k.stop()
        data = open(os.path.join(k.dir, "kvd.log"), "rb").read()
        with open(os.path.join(HERE, "corpus", "log", "kvd-lease-%d" % seed), "wb") as f:
            f.write(b"\x00" + data)
    # rewritten logs: BASE records, relinked history, COMPACT and ALARM records
    from kvdtest import pb
    R = pb()["rpc"]
    for seed, nops in ((3, 120), (4, 300)):
        k = Kvd(os.path.join(os.path.dirname(HERE), "kvd"), args=["--auto-rewrite=false"])
        c = Client(k.endpoint())
        g = LeaseGen(seed)
        for i in range(nops):
            for kind, m, q in g.next():
                call(c, kind, m, q)
            if i == nops // 2:
                rev = c.call("Range", R.RangeRequest(key=b"x"))[1].header.revision
                c.call("Compact", R.CompactionRequest(revision=max(2, rev // 2)))
                c.call("Alarm", R.AlarmRequest(action=1, memberID=7, alarm=1), service="etcdserverpb.Maintenance",
                       resp="AlarmResponse")
                c.call("Defragment", R.DefragmentRequest(), service="etcdserverpb.Maintenance",
                       resp="DefragmentResponse")
        c.close()
        k.stop()
        data = open(os.path.join(k.dir, "kvd.log"), "rb").read()
        with open(os.path.join(HERE, "corpus", "log", "kvd-rewritten-%d" % seed), "wb") as f:
            f.write(b"\x00" + data)


def confd_seeds():
    """JSON documents and confd datagrams: test/corpus/json/, test/corpus/confd/
    (byte 0 of a confd seed: 1 = wrap in a signed envelope, 2 = Ganeti mode,
    4 = a few keys; see test/fuzz_confd.c)."""
    import hashlib
    import hmac
    sys.path.insert(0, HERE)
    import ganeticonf
    cfg = ganeticonf.build(11, nodes=4, instances=4)
    with open(os.path.join(HERE, "corpus", "confd-config.json"), "w") as f:
        json.dump(cfg, f, sort_keys=True)
    docs = [cfg["cluster"], cfg["nodes"], [1, 2.5, -3e-7, "\u00e9\n", None, True, False, {}], "x", 0.1, {"a": {"b": []}}]
    for i, d in enumerate(docs):
        with open(os.path.join(HERE, "corpus", "json", "doc-%d" % i), "w") as f:
            json.dump(d, f)
    nodes = [n["name"] for n in cfg["nodes"].values()]
    insts = [i["name"] for i in cfg["instances"].values()]
    qs = [(t, None) for t in range(12)] + [(1, nodes[0]), (1, "node1"), (7, nodes[1]), (8, nodes[2]),
                                          (9, insts[0]), (2, {"1": "203.0.113.5"}), (2, {"2": ["203.0.113.5"], "0": "br0"}),
                                          (3, {"3": [0, 1, 2]}), (6, "br1"), (10, "/cluster/ipolicy"), (10, "/nodes"),
                                          (1, {"1": "x", "2": ["a"], "0": "l", "3": [1]}), (10, "a/"), (10, "a/x")]
    key = b"5f2b7c0e9a1d4e8b3c6f0a2d5e8b1c4f7a0d3e6b\n"
    for i, (t, q) in enumerate(qs):
        m = {"protocol": 1, "type": t, "rsalt": "r%d" % i}
        if q is not None:
            m["query"] = q
        msg = json.dumps(m)
        for flag in (3, 5):
            with open(os.path.join(HERE, "corpus", "confd", "q%d-%d" % (i, flag)), "wb") as f:
                f.write(bytes([flag]) + msg.encode())
        mac = hmac.new(key, ("1700000000" + msg).encode(), hashlib.sha1).hexdigest()
        with open(os.path.join(HERE, "corpus", "confd", "dg%d" % i), "wb") as f:
            f.write(b"\x02plj0" + json.dumps({"msg": msg, "salt": "1700000000", "hmac": mac}).encode())


def pb_seeds():
    """Request messages of every gRPC method: test/corpus/pb/ (byte 0: the
    method's index in kvd.c's tables; then 2-byte length + message, repeated
    for streaming calls; see test/fuzz_pb.c).  Includes the 29 KB Txn nested
    4400 levels deep that once crashed kvd, and txns at kvd's nesting bound."""
    import re
    sys.path.insert(0, HERE)
    from kvdtest import pb, pb_string as field, nested_txn as nested
    src = open(os.path.join(os.path.dirname(HERE), "kvd.c")).read()
    paths = [p for p in re.findall(r'^\t\{"(/[^"]+)", GRPC_', src, re.M) if not p.startswith("/kvd.test.")]
    rpc, lock, elect, health = pb()["rpc"], pb()["v3lock"], pb()["v3election"], pb()["health"]
    out = os.path.join(HERE, "corpus", "pb")
    os.makedirs(out, exist_ok=True)

    def seed(name, path, *msgs):
        blob = bytes([paths.index(path)])
        for m in msgs:
            b = m if isinstance(m, bytes) else m.SerializeToString()
            blob += struct.pack(">H", len(b)) + b
        with open(os.path.join(out, name), "wb") as f:
            f.write(blob)

    kv = "/etcdserverpb.KV/"
    put = rpc.PutRequest(key=b"k1", value=b"v1", prev_kv=True)
    seed("put", kv + "Put", put)
    seed("range", kv + "Range", rpc.RangeRequest(key=b"a", range_end=b"\0", limit=3, sort_order=2, sort_target=4,
                                                  min_mod_revision=1, revision=0, count_only=False))
    seed("rangestream", kv + "RangeStream", rpc.RangeRequest(key=b"\0", range_end=b"\0", keys_only=True))
    seed("delete", kv + "DeleteRange", rpc.DeleteRangeRequest(key=b"a", range_end=b"z", prev_kv=True))
    txn = rpc.TxnRequest(compare=[rpc.Compare(result=1, target=3, key=b"k1", value=b"v1")],
                         success=[rpc.RequestOp(request_put=put),
                                  rpc.RequestOp(request_range=rpc.RangeRequest(key=b"k1"))],
                         failure=[rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=b"k1"))])
    seed("txn", kv + "Txn", txn)
    seed("txn-nested", kv + "Txn", rpc.TxnRequest(success=[rpc.RequestOp(request_txn=txn)]))
    seed("txn-nest-4400", kv + "Txn", nested(4400))
    seed("txn-nest-bound", kv + "Txn", nested(32))
    seed("txn-nest-over", kv + "Txn", nested(33))
    seed("txn-nest-over-decoder", kv + "Txn", nested(34))
    seed("txn-nest-bound-put", kv + "Txn", nested(32, field(2, field(2, put.SerializeToString()))))
    seed("compact", kv + "Compact", rpc.CompactionRequest(revision=1, physical=True))
    seed("put-wrong-wire", kv + "Put", field(1, b"k") + bytes([4 << 3 | 1]) + b"\1" * 8)
    w = "/etcdserverpb.Watch/Watch"
    seed("watch", w, rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=b"a", range_end=b"b", prev_kv=True,
                                                                             progress_notify=True, filters=[0, 1])),
         rpc.WatchRequest(progress_request=rpc.WatchProgressRequest()),
         put,  # a put's bytes as a WatchRequest: whatever they decode to
         rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=b"k", start_revision=1, watch_id=7, fragment=True)),
         rpc.WatchRequest(cancel_request=rpc.WatchCancelRequest(watch_id=7)))
    l = "/etcdserverpb.Lease/"
    seed("lease-grant", l + "LeaseGrant", rpc.LeaseGrantRequest(TTL=60, ID=5))
    seed("lease-revoke", l + "LeaseRevoke", rpc.LeaseRevokeRequest(ID=5))
    seed("lease-keepalive", l + "LeaseKeepAlive", rpc.LeaseKeepAliveRequest(ID=5), rpc.LeaseKeepAliveRequest(ID=6))
    seed("lease-ttl", l + "LeaseTimeToLive", rpc.LeaseTimeToLiveRequest(ID=5, keys=True))
    seed("lease-leases", l + "LeaseLeases", rpc.LeaseLeasesRequest())
    seed("status", "/etcdserverpb.Maintenance/Status", rpc.StatusRequest())
    seed("members", "/etcdserverpb.Cluster/MemberList", rpc.MemberListRequest())
    seed("member-add", "/etcdserverpb.Cluster/MemberAdd", rpc.MemberAddRequest(peerURLs=["http://10.0.0.2:2380"]))
    seed("alarm", "/etcdserverpb.Maintenance/Alarm", rpc.AlarmRequest(action=1, memberID=1, alarm=1))
    seed("hashkv", "/etcdserverpb.Maintenance/HashKV", rpc.HashKVRequest(revision=3))
    seed("auth-user-add", "/etcdserverpb.Auth/UserAdd", rpc.AuthUserAddRequest(name="u", password="p"))
    seed("auth-grant", "/etcdserverpb.Auth/RoleGrantPermission",
         rpc.AuthRoleGrantPermissionRequest(name="r", perm=pb()["auth"].Permission(permType=2, key=b"a", range_end=b"b")))
    seed("lock", "/v3lockpb.Lock/Lock", lock.LockRequest(name=b"l", lease=5))
    seed("campaign", "/v3electionpb.Election/Campaign", elect.CampaignRequest(name=b"e", lease=5, value=b"v"))
    seed("health", "/grpc.health.v1.Health/Check", health.HealthCheckRequest(service=""))
    seed("health-watch", "/grpc.health.v1.Health/Watch", health.HealthCheckRequest(service="x"))


def bolt_seeds():
    """Small snapshot files, made by Debian's etcd and by kvd: histories with
    compaction, leases, tombstones, a pending compaction, an empty store.
    Byte 0 is fuzz_bolt's mode (0: no SHA-256 check, 1: check it)."""
    sys.path.insert(0, HERE)
    from kvdtest import Kvd, Etcd, Client, pb
    from snapshot import snapshot_save
    out = os.path.join(HERE, "corpus", "bolt")
    os.makedirs(out, exist_ok=True)
    R = pb()["rpc"]
    tmp = "/tmp/kvd-bolt-seeds.db"

    def save(server, name, mode=0):
        if snapshot_save(server.endpoint(), tmp)[0]:
            raise RuntimeError("snapshot save failed")
        with open(tmp, "rb") as f, open(os.path.join(out, name), "wb") as o:
            o.write(bytes([mode]) + f.read())

    def history(server, compact):
        c = Client(server.endpoint())
        L = "etcdserverpb.Lease"
        ids = [c.call("LeaseGrant", R.LeaseGrantRequest(TTL=600 + i), service=L, resp="LeaseGrantResponse")[1].ID
               for i in range(3)]
        for i in range(60):
            c.call("Put", R.PutRequest(key=b"k/%d" % (i % 15), value=b"v%d" % i, lease=ids[i % 3] if i % 7 == 0 else 0))
            if i % 9 == 4:
                c.call("DeleteRange", R.DeleteRangeRequest(key=b"k/%d" % (i % 15)))
        c.call("LeaseRevoke", R.LeaseRevokeRequest(ID=ids[0]), service=L, resp="LeaseRevokeResponse")
        rev = c.call("Range", R.RangeRequest(key=b"k"))[1].header.revision
        if compact:
            c.call("Compact", R.CompactionRequest(revision=rev - 20, physical=True))
        for i in range(10):
            c.call("Put", R.PutRequest(key=b"z%d" % (i % 4), value=b"w"))
        c.close()

    plain, rewriting = ((), ("--auto-rewrite-percent", "0", "--auto-rewrite-min-bytes", "1024"))
    for who, make in (("kvd", lambda a: Kvd(args=list(a))), ("etcd", lambda a: Etcd())):
        for name, args, compact in (("history", plain, False), ("compacted", rewriting, True)):
            s = make(args)
            if not compact:
                save(s, who + "-empty", 1)
            history(s, compact)
            save(s, "%s-%s" % (who, name))
            s.stop()


def auth_seeds():
    """A log with AUTH records (test/auth.py's generator, then a rewrite that
    states them whole) and snapshots whose auth buckets etcd and kvd filled:
    test/corpus/log/kvd-auth-*, test/corpus/bolt/*-auth."""
    sys.path.insert(0, HERE)
    from kvdtest import Kvd, Etcd, pb
    from snapshot import snapshot_save
    import auth
    R = pb()["rpc"]
    for seed, rewrite in ((1, False), (2, True)):
        k = Kvd(os.path.join(os.path.dirname(HERE), "kvd"), args=auth.COST)
        p = auth.Peer(k.endpoint())
        p.call("UserAdd", R.AuthUserAddRequest(name="root", password="rootpw"))
        p.call("UserGrantRole", R.AuthUserGrantRoleRequest(user="root", role="root"))
        g = auth.Gen(seed)
        g.pw["root"] = "rootpw"
        for _ in range(150):
            method, req, who, extra = g.next()
            if method == "Watch":
                continue
            a = p.call(method, p.lease_ids(method, req), auth.token_for(p, who))
            if method == "Authenticate" and a[0] == "ok":
                p.tok[extra] = a[1].token
            if method == "LeaseGrant" and a[0] == "ok":
                p.leases.append(a[1].ID)
            g.learn(method, extra, a)
        if rewrite:
            p.defragment(auth.root_token(p))  # no token while auth is off: none needed
        p.close()
        k.stop()
        data = open(os.path.join(k.dir, "kvd.log"), "rb").read()
        with open(os.path.join(HERE, "corpus", "log", "kvd-auth-%d" % seed), "wb") as f:
            f.write(b"\x00" + data)
    out = os.path.join(HERE, "corpus", "bolt")
    tmp = "/tmp/kvd-bolt-seeds.db"
    for who, make in (("kvd", lambda: Kvd(args=auth.COST)), ("etcd", lambda: Etcd(auth.COST))):
        s = make()
        p = auth.Peer(s.endpoint())
        auth.setup_alice(p)
        p.call("Put", R.PutRequest(key=b"/app/x", value=b"1"), p.tok["alice"])
        p.close()
        r = subprocess.run(["etcdctl", "--endpoints", s.endpoint(), "--user", "root:rootpw", "snapshot", "save", tmp],
                           capture_output=True, env=dict(os.environ, ETCDCTL_API="3"))
        if r.returncode:
            raise RuntimeError("snapshot save failed: %s" % r.stderr[-300:])
        with open(tmp, "rb") as f, open(os.path.join(out, who + "-auth"), "wb") as o:
            o.write(b"\x01" + f.read())
        s.stop()


def http1_seeds():
    """test/corpus/http1/ (see test/fuzz_http1.c): what curl sends for gateway
    requests (recorded through the relay, with a mode byte feeding it whole
    or byte by byte), bodies behind the target's own heads, and JSON
    requests of every gateway route for the mapping (mode bit 7)."""
    import re
    sys.path.insert(0, HERE)
    from google.protobuf import json_format
    from kvdtest import Kvd, pb
    out = os.path.join(HERE, "corpus", "http1")
    os.makedirs(out, exist_ok=True)
    src = open(os.path.join(os.path.dirname(HERE), "kvd.c")).read()
    body = src[src.index("} gw_routes[] = {"):]
    routes = re.findall(r'\{"([a-z/-]+)", "(/[^"]+)"\}', body[:body.index("};")])

    def seed(name, mode, data):
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([mode]) + data)

    k = Kvd(os.path.join(HERE, "kvd-test"))
    url = "http://127.0.0.1:%d" % k.port
    reqs = [("put", "/v3/kv/put", '{"key":"Zm9v","value":"YmFy","lease":"0"}', []),
            ("range", "/v3/kv/range", '{"key":"AA==","range_end":"AA==","sort_order":"DESCEND","limit":2}', []),
            ("txn", "/v3/kv/txn", '{"compare":[{"target":"CREATE","key":"Zm9v","createRevision":"0"}],'
                                  '"success":[{"requestPut":{"key":"Zm9v","value":"YmFy"}}]}',
             ["-H", "Expect: 100-continue", "-H", "Transfer-Encoding: chunked"]),
            ("grant", "/v3/lease/grant", '{"TTL":30,"ID":5}', []),
            ("auth", "/v3/auth/user/add", '{"name":"u","password":"p"}', ["-H", "Authorization: x.1"]),
            ("bad", "/v3/kv/range", '{"key":"Zm9v",', ["--http1.0"])]
    for name, path, data, extra in reqs:
        def run(port, path=path, data=data, extra=extra):
            subprocess.run(["curl", "-s", "-X", "POST", "http://127.0.0.1:%d%s" % (port, path), "-d", data] + extra,
                           capture_output=True, timeout=30)
        cap = capture_bytes(k.port, run)
        seed("curl-" + name, 0x1c, cap)
        seed("curl-" + name + "-bytewise", 0x00, cap)
    k.stop()
    seed("watch-body", 0x1d, b'5\r\n{"cre\r\n2a\r\nate_request":{"key":"YQ==","start_revision":"1"}}\r\n'
         b'1c\r\n{"progress_request":{}}  []\r\n0\r\n\r\n')
    seed("txn-body", 0x1e, b'{"success":[{"request_range":{"key":"YQ==","range_end":"AA=="}}]} trailing')
    seed("keepalive-body", 0x1f, b'a\r\n{"ID":"5"}\r\n7\r\n{"ID":5\r\n0\r\n\r\n')
    seed("pipelined", 0x1c, b"GET /health HTTP/1.1\r\n\r\nPOST /v3/kv/range HTTP/1.1\r\nContent-Length: 14\r\n\r\n"
         b'{"key":"YQ=="}OPTIONS / HTTP/1.1\r\n\r\nPOST /v3beta/watch HTTP/1.0\r\n\r\n')
    rpc = pb()["rpc"]
    examples = {
        "Range": rpc.RangeRequest(key=b"a", range_end=b"\0", limit=3, sort_order=2, sort_target=4, min_mod_revision=1),
        "Put": rpc.PutRequest(key=b"k", value=b"<v>&", lease=-5, prev_kv=True, ignore_value=True),
        "Txn": rpc.TxnRequest(compare=[rpc.Compare(result=3, target=4, key=b"k", lease=7, range_end=b"\0")],
                              success=[rpc.RequestOp(request_txn=rpc.TxnRequest())]),
        "Watch": rpc.WatchRequest(create_request=rpc.WatchCreateRequest(key=b"a", filters=[0, 1], watch_id=-1)),
        "MemberAdd": rpc.MemberAddRequest(peerURLs=["http://a:1", "\u2028"], isLearner=True),
        "RoleGrantPermission": rpc.AuthRoleGrantPermissionRequest(
            name="r", perm=pb()["auth"].Permission(permType=2, key=b"a", range_end=b"b")),
    }
    for i, (gw, path) in enumerate(routes):
        meth = path.rsplit("/", 1)[1]
        if meth in examples:
            for camel in (0, 1):
                js = json_format.MessageToJson(examples[meth], preserving_proto_field_name=not camel, indent=None)
                seed("json-%s-%d" % (meth, camel), 0x80 | i, js.encode())
        else:
            seed("json-%s" % gw.replace("/", "-"), 0x80 | i, b'{"name":"x","ID":"-1","key":"YQ==","revision":9}')
    seed("json-bad-b64", 0x80, b'{"key":"Zg=x","limit":"12a","sort_order":"NOPE"}')
    seed("json-uint64", 0x80 | [p for _, p in routes].index("/etcdserverpb.Cluster/MemberRemove"),
         b'{"ID":"18446744073709551615"}')


def capture_bytes(kvd_port, fn):
    """What fn(port) sends through the relay to kvd, as one byte string."""
    got = []
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(4)
    port = lst.getsockname()[1]

    def serve():
        c, _ = lst.accept()
        up = socket.create_connection(("127.0.0.1", kvd_port))
        c.settimeout(5)
        up.settimeout(5)
        try:
            while True:
                try:
                    d = c.recv(65536)
                except socket.timeout:
                    break
                if not d:
                    break
                got.append(d)
                up.sendall(d)
                try:
                    c.sendall(up.recv(65536))
                except socket.timeout:
                    pass
        finally:
            c.close()
            up.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    fn(port)
    t.join(10)
    lst.close()
    return b"".join(got)


def security2_seeds():
    """The inputs of the second security round (issue 48), written as seeds
    of the corpora they reach: names holding a NUL and repeated oneof
    members (pb), JWT claims doubled or out of time (auth, mode 1), and
    request framings a proxy could read another way (http1)."""
    import re
    sys.path.insert(0, HERE)
    from kvdtest import pb, pb_string as field
    src = open(os.path.join(os.path.dirname(HERE), "kvd.c")).read()
    paths = [x for x in re.findall(r'^\t\{"(/[^"]+)", GRPC_', src, re.M) if not x.startswith("/kvd.test.")]
    rpc, health = pb()["rpc"], pb()["health"]

    def write(corpus, name, blob):
        d = os.path.join(HERE, "corpus", corpus)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)

    def pbseed(name, path, *msgs):
        blob = bytes([paths.index(path)])
        for m in msgs:
            b = m if isinstance(m, bytes) else m.SerializeToString()
            blob += struct.pack(">H", len(b)) + b
        write("pb", name, blob)
    a = "/etcdserverpb.Auth/"
    pbseed("nul-authenticate", a + "Authenticate", rpc.AuthenticateRequest(name="root\0x", password="pw"))
    pbseed("nul-grant-root", a + "UserGrantRole", rpc.AuthUserGrantRoleRequest(user="u1", role="root\0"))
    pbseed("nul-user-add", a + "UserAdd", rpc.AuthUserAddRequest(name="eve\0root", password="p\0w"))
    pbseed("nul-user-get", a + "UserGet", rpc.AuthUserGetRequest(name="u1\0x"))
    pbseed("nul-role-get", a + "RoleGet", rpc.AuthRoleGetRequest(role="app\0root"))
    pbseed("nul-role-add", a + "RoleAdd", rpc.AuthRoleAddRequest(name="r\0"))
    pbseed("nul-member-add", "/etcdserverpb.Cluster/MemberAdd", rpc.MemberAddRequest(peerURLs=["http://a\0:1"]))
    pbseed("nul-downgrade", "/etcdserverpb.Maintenance/Downgrade", rpc.DowngradeRequest(action=0, version="3.6\0"))
    pbseed("nul-health", "/grpc.health.v1.Health/Check", health.HealthCheckRequest(service="\0x"))
    put = lambda **kw: field(2, rpc.PutRequest(**kw).SerializeToString())
    pbseed("oneof-put-twice", "/etcdserverpb.KV/Txn", field(2, put(key=b"m1") + put(value=b"mv")))
    pbseed("oneof-switch", "/etcdserverpb.KV/Txn", field(2, put(key=b"m1") + field(1, b"\x0a\x01a") + put(value=b"v")))
    pbseed("oneof-txn-twice", "/etcdserverpb.KV/Txn",
           field(2, field(4, field(1, b"\x1a\x01a")) + field(4, field(2, put(key=b"k") + put(value=b"v")))))
    creq = lambda **kw: field(1, rpc.WatchCreateRequest(**kw).SerializeToString())
    pbseed("oneof-watch-twice", "/etcdserverpb.Watch/Watch", creq(key=b"w1") + creq(range_end=b"w3"))
    pbseed("perm-twice", a + "RoleGrantPermission", field(1, b"r") + field(2, b"\x12\x01k") + field(2, b"\x08\x02"))
    pbseed("merge-quadratic", "/etcdserverpb.KV/Txn",
           field(2, (field(1, b"\x0a\x01a") + field(2, b"\x0a\x01b") * 2) * 200))
    for name, claims in (("dup-username", b'{"username":"alice","username":"root","revision":2,"exp":4102444800}'),
                         ("nbf-future", b'{"username":"u","revision":2,"exp":4102444800,"nbf":4102444000}'),
                         ("exp-huge", b'{"username":"u","revision":2,"exp":1e300}'),
                         ("exp-string", b'{"username":"u","revision":2,"exp":"4102444800"}'),
                         ("name-nul", b'{"username":"root\\u0000","revision":2}')):
        write("auth", "jwt-" + name, b"\x01" + b'{"alg":"HS256","typ":"JWT"}\0' + claims)
    body = b'{"key":"YzIxMQ==","value":"eA=="}'
    head = b"POST /v3/kv/put HTTP/1.1\r\nHost: x\r\n"
    for name, req in (("bare-lf-chunk", head + b"Transfer-Encoding: chunked\r\n\r\n%x\n" % len(body) + body +
                       b"\r\n0\r\n\r\n"),
                      ("te-twice", head + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                      ("te-list", head + b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n"),
                      ("zeros", head + b"Transfer-Encoding: chunked\r\n\r\n" + b"0" * 100 + b"%x\r\n" % len(body) +
                       body + b"\r\n0\r\n\r\n"),
                      ("no-host", b"POST /v3/kv/put HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body),
                      ("two-hosts", head + b"Host: y\r\nContent-Length: %d\r\n\r\n" % len(body) + body),
                      ("chunked-1.0", b"POST /v3/kv/put HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" %
                       len(body) + body + b"\r\n0\r\n\r\n")):
        write("http1", "smuggle-" + name, bytes([0x1c]) + req)
        write("http1", "smuggle-" + name + "-bytewise", bytes([0x00]) + req)


def h2http_seeds():
    """HTTP requests on HTTP/2 streams (issue 49: what curl sends over TLS
    with ALPN h2): the endpoints, the gateway with a body whole, in pieces,
    over its declared length and never finished, a watch stream, a request
    answered before its body ends.  Written as a client's bytes, behind
    test/fuzz_h2.c's mode byte (all at once with output drained; bytewise)."""
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    c.initiate_connection()

    def req(sid, method, path, body=None, extra=(), end=True, chunks=1, cl=True):
        hdrs = [(":method", method), (":scheme", "https"), (":path", path), (":authority", "127.0.0.1"),
                ("user-agent", "curl/7.88.1"), ("accept", "*/*")] + list(extra)
        if body is not None:
            hdrs.append(("content-type", "application/json"))
            if cl:
                hdrs.append(("content-length", str(len(body))))
        c.send_headers(sid, hdrs, end_stream=body is None)
        if body is not None:
            n = max(1, len(body) // chunks)
            for i in range(0, len(body), n):
                c.send_data(sid, body[i:i + n], end_stream=end and i + n >= len(body))
    req(1, "GET", "/health")
    req(3, "GET", "/readyz?verbose")
    req(5, "GET", "/metrics")
    req(7, "OPTIONS", "/v3/kv/range", extra=[("origin", "http://x")])
    req(9, "POST", "/v3/kv/put", b'{"key":"aDI=","value":"dg=="}', chunks=3)
    req(11, "POST", "/v3/kv/range", b'{"key":"aDI=","range_end":"AA=="}', cl=False)
    req(13, "POST", "/v3/watch", b'{"create_request":{"key":"dw=="}}{"progress_request":{}}', end=False)
    req(15, "POST", "/v3/nope", b"{}")
    req(17, "POST", "/v3/kv/range", b'{"key":', chunks=7)
    req(19, "POST", "/v3/lease/keepalive", b'{"ID":"1"}', end=False)
    data = c.data_to_send()
    for mode, suffix in ((0x1E, ""), (0x10, "-bytewise")):
        with open(os.path.join(HERE, "corpus", "h2", "http-over-h2" + suffix), "wb") as f:
            f.write(bytes([mode]) + data)
    # a body longer than its content-length, and a stream reset mid-body
    c2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, validate_outbound_headers=False))
    c2.initiate_connection()
    c2.send_headers(1, [(":method", "POST"), (":scheme", "https"), (":path", "/v3/kv/put"), (":authority", "x"),
                        ("content-type", "text/plain"), ("content-length", "4")])
    c2.send_data(1, b"{}{}{}", end_stream=True)
    c2.send_headers(3, [(":method", "POST"), (":scheme", "https"), (":path", "/v3/watch"), (":authority", "x")])
    c2.send_data(3, b'{"create_request":')
    c2.reset_stream(3)
    with open(os.path.join(HERE, "corpus", "h2", "http-over-h2-odd"), "wb") as f:
        f.write(bytes([0x1E]) + c2.data_to_send())


def main():
    if sys.argv[1:] == ["h2http"]:
        h2http_seeds()
        return 0
    if sys.argv[1:] == ["security2"]:
        security2_seeds()
        return 0
    if sys.argv[1:] == ["http1"]:
        http1_seeds()
        return 0
    if sys.argv[1:] == ["auth"]:
        auth_seeds()
        return 0
    if sys.argv[1:] == ["bolt"]:
        bolt_seeds()
        return 0
    if sys.argv[1:] == ["log"]:
        log_seeds()
        return 0
    if sys.argv[1:] == ["confd"]:
        confd_seeds()
        return 0
    if sys.argv[1:] == ["pb"]:
        pb_seeds()
        return 0
    port = int(sys.argv[1])
    capture(port, "etcdctl-status", etcdctl("endpoint", "status", "-w", "json"))
    capture(port, "etcdctl-members", etcdctl("member", "list"))
    capture(port, "etcdctl-get", etcdctl("get", "foo", "--prefix"))
    capture(port, "grpcio", grpcio_calls)
    capture(port, "h2-odd", h2_odd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
