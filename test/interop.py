#!/usr/bin/python3
"""Interop tests: real clients (etcdctl 3.4, grpcio, python-h2, h2load, curl)
against kvd.  KVD=./kvd is the release build, KVD_TEST=test/kvd-test the
ASan build with the test-only kvd.test.Test methods (large and streamed
responses).  Last line: "N passed, N failed".
"""
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
import kvdtest
from kvdtest import (Kvd, H2, check, test, etcdctl, grpc_frame, grpc_messages, pb_string,
                     h2_call, frame, goaways, rsts, decode_headers, count, wait_for, run_tests, spawn,
                     free_port, ROOT, DATA, HEADERS, PING, WINDOW_UPDATE)

KVD = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))
KVD_TEST = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))
HEALTH = "/grpc.health.v1.Health/Check"


def channel(k, big=False):
    opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)] if big else []
    return grpc.insecure_channel(k.endpoint(), options=opts)


def grpc_error(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return None, None


# ------------------------------------------------------------------ etcdctl
@test
def etcdctl_endpoint_status():
    k = Kvd(KVD, ["--name", "node1"])
    rc, out, err = etcdctl(k, "endpoint", "status", "-w", "json")
    check(rc == 0, "etcdctl endpoint status rc=%d %s" % (rc, err))
    st = json.loads(out)[0]["Status"]
    h = st["header"]
    check(st["version"] == "3.7.3", "version %r" % st.get("version"))
    check(st["leader"] == h["member_id"], "leader is self")
    check(h["revision"] == 1 and h["raft_term"] == 2, "header %r" % h)
    check(st["raftIndex"] == 1 and st["raftAppliedIndex"] == 1, "raft index %r" % st)
    check(h["cluster_id"] != 0 and h["member_id"] != 0, "ids set")
    rc, out, err = etcdctl(k, "endpoint", "status")
    check(rc == 0 and ", true, false," in out, "table shows IS LEADER true: %r" % out)
    rc, out, err = etcdctl(k, "endpoint", "status", "--cluster", "-w", "json")
    check(rc == 0 and json.loads(out)[0]["Endpoint"] == k.url, "--cluster dials clientURLs: %r %r" % (out, err))
    check(k.stop() == 0, "clean exit")


@test
def etcdctl_member_list():
    k = Kvd(KVD, ["--name", "node1", "--initial-advertise-peer-urls", "http://10.0.0.1:2380,http://10.0.0.2:2380"])
    rc, out, err = etcdctl(k, "member", "list", "-w", "json")
    check(rc == 0, "member list rc=%d %s" % (rc, err))
    ml = json.loads(out)
    m = ml["members"]
    check(len(m) == 1 and m[0]["name"] == "node1", "one member named node1: %r" % m)
    check(m[0]["peerURLs"] == ["http://10.0.0.1:2380", "http://10.0.0.2:2380"], "peer urls %r" % m[0])
    check(m[0]["clientURLs"] == [k.url], "client urls %r" % m[0])
    check(m[0]["ID"] == ml["header"]["member_id"], "member id in header")
    check("revision" not in ml["header"], "MemberList header carries no revision, as etcd")
    rc, out, err = etcdctl(k, "member", "list")
    check(rc == 0 and ", started, node1," in out, "table shows started: %r" % out)
    k.stop()


@test
def same_ids_as_etcd():
    """etcd derives member and cluster ids from peer URLs and token; so does kvd."""
    k = Kvd(KVD)
    rc, out, err = etcdctl(k, "member", "list", "-w", "json")
    ml = json.loads(out)
    # values a default etcd 3.4.23 reports (peer URL http://localhost:2380, token etcd-cluster)
    check(ml["header"]["member_id"] == 10276657743932975437, "member id %r" % ml["header"])
    check(ml["header"]["cluster_id"] == 14841639068965178418, "cluster id %r" % ml["header"])
    k.stop()


@test
def etcdctl_move_leader_like_etcd():
    """MoveLeader (Debian's etcdctl 3.4 move-leader) as a one-member etcd 3.7.3
    answers it: to an unknown member, "bad leader transferee"; to itself,
    done.  The same name, so the same member id."""
    import re
    from kvdtest import Etcd
    e, k = Etcd(), Kvd(KVD, ["--name", "ref"])
    me = json.loads(etcdctl(k, "endpoint", "status", "-w", "json")[1])[0]["Status"]["header"]["member_id"]
    for target in ("1", "%x" % me):
        a = [etcdctl(s, "move-leader", target) for s in (e, k)]
        a = [(r[0], r[1], re.sub(r'\{"level".*\n', "", r[2])) for r in a]
        check(a[0] == a[1], "move-leader %s: etcd %r / kvd %r" % (target, a[0], a[1]))
    check("bad leader transferee" in a[0][2] or "bad leader transferee" in etcdctl(k, "move-leader", "1")[2],
          "the unknown member's refusal")
    e.stop()
    k.stop()


def cluster_calls(endpoint, peer):
    """Membership calls a one-node etcd answers without losing quorum (a
    voter is never added: etcd would accept it and stop serving)."""
    import re
    from kvdtest import pb
    R = pb()["rpc"]
    ch = grpc.insecure_channel(endpoint)

    def u(m, req, resp):
        f = ch.unary_unary("/etcdserverpb.Cluster/%s" % m, request_serializer=lambda x: x.SerializeToString(),
                           response_deserializer=resp.FromString)
        try:
            r = f(req, timeout=10)
            return ("ok", r)
        except grpc.RpcError as e:
            return ("err", e.code().name, e.details())

    def show(a, learner=0):
        if a[0] != "ok":
            return a
        from google.protobuf import text_format
        t = text_format.MessageToString(a[1], as_one_line=True)
        t = re.sub(r"(cluster_id|member_id|raft_term): \d+", r"\1: X", t)
        t = re.sub(r'clientURLs: "[^"]*"', 'clientURLs: C', t)
        t = t.replace("ID: %d " % learner, "ID: LEARNER ") if learner else t
        # members come by id (the learner's differs between the servers): compare them as a set
        ms = re.findall(r"members \{[^{}]*\}", t)
        return ("ok", re.sub(r"members \{[^{}]*\}", "", t), sorted(ms))

    out = []
    me = u("MemberList", R.MemberListRequest(), R.MemberListResponse)[1].members[0].ID
    out.append(show(u("MemberPromote", R.MemberPromoteRequest(ID=me), R.MemberPromoteResponse)))
    for m, req, resp in (("MemberPromote", R.MemberPromoteRequest(ID=12345), R.MemberPromoteResponse),
                         ("MemberRemove", R.MemberRemoveRequest(ID=12345), R.MemberRemoveResponse),
                         ("MemberUpdate", R.MemberUpdateRequest(ID=12345, peerURLs=["http://127.0.0.1:1"]),
                          R.MemberUpdateResponse),
                         ("MemberAdd", R.MemberAddRequest(peerURLs=["not a url"]), R.MemberAddResponse),
                         ("MemberAdd", R.MemberAddRequest(), R.MemberAddResponse),
                         ("MemberAdd", R.MemberAddRequest(peerURLs=["http://h:1/path"], isLearner=True),
                          R.MemberAddResponse),
                         ("MemberAdd", R.MemberAddRequest(peerURLs=[peer]), R.MemberAddResponse),
                         ("MemberRemove", R.MemberRemoveRequest(ID=me), R.MemberRemoveResponse)):
        out.append(show(u(m, req, resp)))
    la = u("MemberAdd", R.MemberAddRequest(peerURLs=["http://127.0.0.1:23999"], isLearner=True), R.MemberAddResponse)
    lid = la[1].member.ID if la[0] == "ok" else 0
    out.append(show(la, lid))
    out.append(show(u("MemberAdd", R.MemberAddRequest(peerURLs=["http://127.0.0.1:23998"], isLearner=True),
                      R.MemberAddResponse), lid))
    out.append(show(u("MemberPromote", R.MemberPromoteRequest(ID=lid), R.MemberPromoteResponse), lid))
    out.append(show(u("MemberUpdate", R.MemberUpdateRequest(ID=lid, peerURLs=[peer]), R.MemberUpdateResponse), lid))
    out.append(show(u("MemberUpdate", R.MemberUpdateRequest(ID=lid, peerURLs=["http://127.0.0.1:23997"]),
                      R.MemberUpdateResponse), lid))
    out.append(show(u("MemberList", R.MemberListRequest(), R.MemberListResponse), lid))
    out.append(show(u("MemberRemove", R.MemberRemoveRequest(ID=lid), R.MemberRemoveResponse), lid))
    out.append(show(u("MemberUpdate", R.MemberUpdateRequest(ID=me, peerURLs=[peer]), R.MemberUpdateResponse)))
    out.append(show(u("MemberList", R.MemberListRequest(), R.MemberListResponse)))
    ch.close()
    return out


@test
def cluster_like_etcd():
    """Membership RPCs as a one-node etcd 3.7 answers them (same flags, so
    the same member and cluster ids), then etcdctl's member commands: kvd
    never removed [§23.1], only a learner added and never promoted [§23.2],
    ids, URL checks and lists as etcd's [§23.3]."""
    from kvdtest import Etcd
    peer = "http://127.0.0.1:%d" % free_port()
    flags = ["--initial-advertise-peer-urls", peer, "--name", "m1"]
    e = Etcd(flags + ["--listen-peer-urls", peer, "--initial-cluster", "m1=" + peer])
    k = Kvd(KVD, flags)
    a, b = cluster_calls(e.endpoint(), peer), cluster_calls(k.endpoint(), peer)
    for i, (x, y) in enumerate(zip(a, b)):
        check(x == y, "call %d: etcd %r / kvd %r" % (i, x, y))
    for args in (["member", "list"], ["member", "add", "l1", "--learner", "--peer-urls", "http://127.0.0.1:23990"],
                 ["member", "list", "-w", "table"], ["member", "promote", "1"], ["member", "remove", "1"]):
        x, y = etcdctl(e, *args), etcdctl(k, *args)
        def mask(r):  # ids masked; lines and ETCD_INITIAL_CLUSTER's members in any order (they come by id)
            t = re.sub(kvdtest.HEX_ID, "ID", r[1] + "".join(
                x for x in r[2].splitlines(True) if not x.startswith('{"level"'))).replace(k.url, "URL").replace(e.url, "URL")
            t = re.sub(r'ETCD_INITIAL_CLUSTER="([^"]*)"', lambda m: ",".join(sorted(m.group(1).split(","))), t)
            return r[0], sorted(t.splitlines())
        check(mask(x) == mask(y), "etcdctl %s: etcd %r / kvd %r" % (" ".join(args), mask(x), mask(y)))
    # a voter: etcd takes it and loses quorum; kvd refuses it with etcd's words for that case
    rc, out, err = etcdctl(k, "member", "add", "m2", "--peer-urls", "http://127.0.0.1:2390")
    check(rc != 0 and "re-configuration failed due to not enough started members" in err, "a voter: %r" % err)
    e.stop()
    k.stop()


@test
def systemd_notify():
    """NOTIFY_SOCKET as systemd sets it (a path, then an abstract name), read
    by a test-side datagram socket: READY=1 once serving, WATCHDOG=1 pings
    at half WATCHDOG_USEC, STOPPING=1 on SIGTERM; none with another
    WATCHDOG_PID."""
    import tempfile
    for abstract in (False, True):
        d = tempfile.mkdtemp(prefix="kvd-notify-")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        name = "\0kvd-notify-%d" % os.getpid() if abstract else os.path.join(d, "notify")
        s.bind(name)
        s.settimeout(30)
        port = free_port()
        env = dict(os.environ, NOTIFY_SOCKET=("@" + name[1:]) if abstract else name, WATCHDOG_USEC="200000")
        p = spawn([KVD, "--data-dir", d + "/data", "--listen-client-urls", "http://127.0.0.1:%d" % port],
                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        got = [s.recv(4096).decode()]
        check(got[0].startswith("READY=1\nSTATUS=serving 1 listener(s)"), "READY=1 first: %r" % got[0])
        c = socket.create_connection(("127.0.0.1", port), timeout=10)  # it does serve
        c.close()
        while got.count("WATCHDOG=1") < 3:
            got.append(s.recv(4096).decode())
        p.send_signal(signal.SIGTERM)
        while not got[-1].startswith("STOPPING=1"):
            got.append(s.recv(4096).decode())
        check(p.wait(30) == 0, "a clean stop")
        check(set(got[1:-1]) == {"WATCHDOG=1"}, "%s: pings, then STOPPING=1: %r" % ("abstract" if abstract else "path",
                                                                                   got))
        s.close()
        subprocess.run(["rm", "-rf", d])
    # another process's watchdog: no pings
    d = tempfile.mkdtemp(prefix="kvd-notify-")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(os.path.join(d, "notify"))
    s.settimeout(30)
    env = dict(os.environ, NOTIFY_SOCKET=os.path.join(d, "notify"), WATCHDOG_USEC="2000", WATCHDOG_PID="1")
    p = spawn([KVD, "--data-dir", d + "/data", "--listen-client-urls", "http://127.0.0.1:%d" % free_port()],
              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    got = [s.recv(4096).decode()]
    p.send_signal(signal.SIGTERM)
    while not got[-1].startswith("STOPPING=1"):
        got.append(s.recv(4096).decode())
    check(len(got) == 2 and got[0].startswith("READY=1"), "WATCHDOG_PID of another process: no pings: %r" % got)
    p.wait(30)
    s.close()
    subprocess.run(["rm", "-rf", d])


# ------------------------------------------------------------------ grpcio
@test
def grpcio_health_and_errors():
    k = Kvd(KVD)
    ch = channel(k)
    check(ch.unary_unary(HEALTH)(b"", timeout=5) == b"\x08\x01", "SERVING")
    code, det = grpc_error(lambda: ch.unary_unary(HEALTH)(pb_string(1, "nope"), timeout=5))
    check(code == grpc.StatusCode.NOT_FOUND and det == "unknown service", "unknown health service")
    code, det = grpc_error(lambda: ch.unary_unary("/etcdserverpb.KV/Nope")(b"", timeout=5))
    check(code == grpc.StatusCode.UNIMPLEMENTED and det == "unknown method Nope for service etcdserverpb.KV",
          "unknown method %r %r" % (code, det))
    code, det = grpc_error(lambda: ch.unary_unary("/foo.Bar/Baz")(b"", timeout=5))
    check(code == grpc.StatusCode.UNIMPLEMENTED and det == "unknown service foo.Bar", "unknown service")
    code, det = grpc_error(lambda: ch.unary_unary("/etcdserverpb.Maintenance/Status")(b"\x0a\x03foo\xff", timeout=5))
    check(code == grpc.StatusCode.INTERNAL and det.startswith("grpc: error unmarshalling request"), "bad pb %r" % det)
    code, det = grpc_error(lambda: ch.unary_unary(HEALTH)(b"\x0a" + b"\xff" * 11, timeout=5))
    check(code == grpc.StatusCode.INTERNAL, "bad varint")
    # a message over the receive cap (max-request-bytes + 512 KiB), as etcd words it
    big = b"\x0a\x03foo" + b"x" * 2200000
    code, det = grpc_error(lambda: channel(k, True).unary_unary(HEALTH)(big, timeout=10))
    check(code == grpc.StatusCode.RESOURCE_EXHAUSTED and
          det == "grpc: received message larger than max (%d vs. 2097152)" % len(big), "too big: %r" % det)
    # the connection is still good
    check(ch.unary_unary(HEALTH)(b"", timeout=5) == b"\x08\x01", "still serving")
    ch.close()
    k.stop()


@test
def grpcio_large_request_and_response():
    k = Kvd(KVD_TEST)
    ch = channel(k, True)
    # 1.5 MiB request: a health check for a 1.5 MiB service name
    name = "s" * (1536 * 1024)
    code, det = grpc_error(lambda: ch.unary_unary(HEALTH)(pb_string(1, name), timeout=20))
    check(code == grpc.StatusCode.NOT_FOUND, "1.5 MiB request reached the handler: %r" % code)
    body = os.urandom(1536 * 1024)
    check(ch.unary_unary("/kvd.test.Test/Echo")(body, timeout=20) == body, "1.5 MiB echo")
    out = ch.unary_unary("/kvd.test.Test/Fill")(b"6000000", timeout=30)
    check(len(out) == 6000000 and out[:3] == b"abc" and out[-1:] == bytes([ord("a") + 5999999 % 26]), "6 MB response")
    msgs = list(ch.unary_stream("/kvd.test.Test/Stream")(b"200 40000", timeout=30))
    check(len(msgs) == 200 and all(len(m) == 40000 for m in msgs), "server stream 200 x 40000")
    # several concurrent big calls on one connection, grpcio interleaving
    # their frames (this once deadlocked kvd's flow control, 1 run in ~50)
    ok = 0
    for _ in range(60):
        futs = [ch.unary_unary("/kvd.test.Test/Echo").future(body, timeout=60) for _ in range(4)]
        ok += all(f.result() == body for f in futs)
    check(ok == 60, "4 concurrent 1.5 MiB echoes, 60 times: %d" % ok)
    ch.close()
    k.stop()


@test
def h2_small_window_slow_reader():
    """python-h2 raises on any flow-control violation: 1.5 MiB up, 5 MB down
    through a 1000-byte window, and a slow reader."""
    k = Kvd(KVD_TEST)
    body = grpc_frame(os.urandom(1536 * 1024))
    r = h2_call(k.port, "/kvd.test.Test/Echo", body, window=1000)
    check(r.violation is None, "no violation: %s" % r.violation)
    check(r.status() == "0" and r.data == body, "echo through a 1000-byte window (%d bytes)" % len(r.data))
    r = h2_call(k.port, "/kvd.test.Test/Fill", grpc_frame(b"5000000"), window=1000, max_frame=16384)
    check(r.violation is None and r.status() == "0" and len(r.data) == 5000005, "5 MB through 1000-byte window")
    r = h2_call(k.port, "/kvd.test.Test/Fill", grpc_frame(b"300000"), window=4000, slow=0.002)
    check(r.violation is None and r.status() == "0" and len(r.data) == 300005, "slow reader")
    r = h2_call(k.port, "/kvd.test.Test/Stream", grpc_frame(b"50 20000"), window=3000)
    check(r.violation is None and r.status() == "0" and len(grpc_messages(r.data)) == 50, "stream, small window")
    r = h2_call(k.port, HEALTH, grpc_frame(b""), pad=20)
    check(r.violation is None and r.status() == "0", "padded request")
    k.stop()


@test
def server_side_deadline():
    k = Kvd(KVD)
    t0 = time.time()
    r = h2_call(k.port, "/grpc.health.v1.Health/Watch", grpc_frame(b""), extra=[("grpc-timeout", "300m")])
    dt = time.time() - t0
    check(r.status() == "4" and r.message() == "context deadline exceeded", "deadline: %r" % (r.trailers,))
    check(grpc_messages(r.data) == [b"\x08\x01"], "watch sent SERVING first")
    check(dt >= 0.29, "not before the deadline (%.3f s)" % dt)
    # a unary call whose body never completes
    r = h2_call(k.port, HEALTH, b"\0\0\0\0\x09ab", extra=[("grpc-timeout", "200m")], half_close=False)
    check(r.status() == "4" and r.reset == 0, "partial body: DEADLINE_EXCEEDED then RST(NO_ERROR): %r %r" %
          (r.trailers or r.headers, r.reset))
    k.stop()


@test
def grpcio_health_watch_and_cancel():
    k = Kvd(KVD_TEST)
    ch = channel(k)
    call = ch.unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=10)
    first = next(call)
    check(first == b"\x08\x01", "watch SERVING")
    call.cancel()
    stats = lambda: ch.unary_unary("/kvd.test.Test/Stats")(b"", timeout=5).decode()
    check(wait_for(lambda: "streams=1 " in stats(), 60), "cancel freed the watch stream: %s" % stats())
    ch.close()
    k.stop()


@test
def h2load_100k():
    k = Kvd(KVD)
    path = "/tmp/kvd-h2load-body.bin"
    with open(path, "wb") as f:
        f.write(grpc_frame(b""))
    r = subprocess.run(["h2load", "-n", "100000", "-c", "16", "-m", "8", "-t", "1", "-d", path,
                        "-H", "content-type: application/grpc", "-H", "te: trailers",
                        "http://127.0.0.1:%d%s" % (k.port, HEALTH)], capture_output=True, timeout=120)
    out = r.stdout.decode()
    line = [l for l in out.splitlines() if l.startswith("requests:")]
    check(line and "100000 succeeded, 0 failed, 0 errored" in line[0], "h2load: %s" % (line or out[-400:]))
    st = [l for l in out.splitlines() if l.startswith("status codes:")]
    check(st and st[0].startswith("status codes: 100000 2xx"), "all 2xx: %s" % st)
    rc, out, err = etcdctl(k, "endpoint", "status")
    check(rc == 0, "still serving after 100k calls")
    check(k.rss_kb() < 8192, "RSS after load %d KiB" % k.rss_kb())
    k.stop()


@test
def nghttp_trailers():
    k = Kvd(KVD)
    path = "/tmp/kvd-nghttp-body.bin"
    with open(path, "wb") as f:
        f.write(grpc_frame(b""))
    r = subprocess.run(["nghttp", "-v", "-d", path, "-H", "content-type: application/grpc", "-H", "te: trailers",
                        "http://127.0.0.1:%d%s" % (k.port, HEALTH)], capture_output=True, timeout=20)
    out = r.stdout.decode()
    check(r.returncode == 0 and "grpc-status: 0" in out, "nghttp sees grpc-status 0")
    check("PROTOCOL_ERROR" not in out and "COMPRESSION" not in out, "nghttp is happy")
    k.stop()


@test
def rangestream_bounded_memory():
    """A 6 MB range streams in chunks through a small window while kvd holds
    about one chunk; the merged chunks equal Range's answer."""
    from kvdtest import Client, pb
    R = pb()["rpc"]
    k = Kvd(KVD_TEST)
    c = Client(k.endpoint())
    for t0 in range(0, 6000, 100):
        t = R.TxnRequest()
        for i in range(t0, t0 + 100):
            t.success.add().request_put.CopyFrom(R.PutRequest(key=b"big/%05d" % i, value=bytes([65 + i % 26]) * 1000))
        check(c.call("Txn", t)[0] == "ok", "load")
    stats = lambda: dict(x.split("=") for x in c.ch.unary_unary("/kvd.test.Test/Stats")(b"").decode().split())
    base = int(stats()["peak"])
    req = R.RangeRequest(key=b"big/", range_end=b"big0", limit=5500)
    r = h2_call(k.port, "/etcdserverpb.KV/RangeStream", grpc_frame(req.SerializeToString()), window=8192)
    check(r.violation is None and r.status() == "0", "stream ok: %r %s" % (r.trailers, r.violation))
    chunks = [R.RangeStreamResponse.FromString(m) for m in grpc_messages(r.data)]
    merged = R.RangeResponse()
    for ch in chunks:
        merged.MergeFrom(ch.range_response)
    check(len(chunks) > 5 and all(not ch.range_response.HasField("header") for ch in chunks[:-1]),
          "%d chunks, header only in the last" % len(chunks))
    peak = int(stats()["peak"])
    check(peak - base < 1024 * 1024, "kvd's peak grew %d bytes for a %d-byte answer" % (peak - base, len(r.data)))
    ans = c.call("Range", req)
    check(ans[0] == "ok" and merged == ans[1], "merged chunks == Range (%d kvs, more=%s, count=%d)" %
          (len(merged.kvs), merged.more, merged.count))
    check(merged.more and merged.count == 6000 and len(merged.kvs) == 5500, "limit, more and count")
    c.close()
    k.stop()


@test
def rangestream_header_is_the_start():
    """A RangeStream's header carries the revision it read (the store's when
    it started, as etcd), not a write's that landed while it streamed: the
    chunks equal a Range at the header's revision [§19.5].  (The robustness
    harness found this as a linearizability violation.)"""
    import threading
    from kvdtest import Client, pb
    R = pb()["rpc"]
    k = Kvd(KVD_TEST)
    c = Client(k.endpoint())
    for t0 in range(0, 400, 100):
        t = R.TxnRequest()
        for i in range(t0, t0 + 100):
            t.success.add().request_put.CopyFrom(R.PutRequest(key=b"rs/%05d" % i, value=b"v" * 1000))
        check(c.call("Txn", t)[0] == "ok", "load")
    stop, writes = threading.Event(), []

    def writer():
        w = Client(k.endpoint())
        while not stop.is_set():
            a = w.call("Put", R.PutRequest(key=b"rs/%05d" % (len(writes) % 400), value=b"w%d" % len(writes)))
            writes.append(a[1].header.revision if a[0] == "ok" else 0)
        w.close()
    th = threading.Thread(target=writer)
    th.start()
    try:
        req = R.RangeRequest(key=b"rs/", range_end=b"rs0")
        r = h2_call(k.port, "/etcdserverpb.KV/RangeStream", grpc_frame(req.SerializeToString()), window=8192, slow=0.02)
    finally:
        stop.set()
        th.join()
    check(r.violation is None and r.status() == "0", "stream ok: %r %s" % (r.trailers, r.violation))
    chunks = [R.RangeStreamResponse.FromString(m) for m in grpc_messages(r.data)]
    merged = R.RangeResponse()
    for ch in chunks:
        merged.MergeFrom(ch.range_response)
    hrev = merged.header.revision
    check(writes and max(writes) > hrev, "writes landed while it streamed (%d writes, last at %s, header %d)" %
          (len(writes), max(writes or [0]), hrev))
    at = c.call("Range", R.RangeRequest(key=b"rs/", range_end=b"rs0", revision=hrev))
    check(at[0] == "ok" and [(kv.key, kv.value) for kv in merged.kvs] == [(kv.key, kv.value) for kv in at[1].kvs],
          "the %d streamed kvs are the store at the header's revision %d" % (len(merged.kvs), hrev))
    c.close()
    k.stop()


# ------------------------------------------------------------------ lifecycle and flags
@test
def graceful_shutdown():
    """SIGTERM as etcd stops (a real Patroni cluster lost its primary while
    kvd kept streams open for the whole grace): streams end at once with
    UNAVAILABLE "transport is closing" (a Health watcher sees NOT_SERVING
    first), GOAWAY(2^31-1) + PING, the final GOAWAY on the PING's return,
    and kvd exits long before a 60 s --shutdown-grace; a unary call in
    flight is answered within the grace. [§26.4]"""
    k = Kvd(KVD, ["--shutdown-grace", "60s"])
    c = H2(k.port)
    c.send(frame(HEADERS, 4, 1, c.block("/grpc.health.v1.Health/Watch")) + frame(DATA, 1, 1, grpc_frame(b"")))
    fs = c.frames(5.0, until=lambda f: count(f, DATA) >= 1)
    t0 = time.time()
    k.p.send_signal(signal.SIGTERM)
    fs += c.frames(30.0, until=lambda f: count(f, PING) >= 1 and len(decode_headers(fs + f, 1)) >= 2)
    h = decode_headers(fs, 1)
    msgs = grpc_messages(b"".join(p for t, f, s, p in fs if t == DATA and s == 1))
    check(msgs[-1:] == [b"\x08\x02"], "the watcher learns NOT_SERVING: %r" % msgs)
    check(h and h[-1].get("grpc-status") == "14" and h[-1].get("grpc-message") == "transport is closing",
          "the open stream ends UNAVAILABLE at once, not after the grace: %r" % h)
    g = goaways(fs)
    check(g and g[0][0] == 0x7FFFFFFF and g[0][1] == "NO_ERROR", "first GOAWAY(2^31-1): %r" % g)
    ping = [p for t, f, s, p in fs if t == PING and f == 0]
    check(ping, "PING after the first GOAWAY")
    c.send(frame(PING, 1, 0, ping[0]))
    fs += c.frames(30.0, until=lambda f: len(goaways(fs + f)) >= 2)
    g = goaways(fs)
    check(len(g) >= 2 and g[1][0] == 1, "final GOAWAY names stream 1: %r" % g)
    rc = k.p.wait(60)
    took = time.time() - t0
    check(rc == 0 and took < 30, "exit 0 well within the 60 s grace (rc=%r, %.2fs)" % (rc, took))
    print("    SIGTERM with a Health watch open: exit after %.3f s" % took)
    # a unary call in flight when SIGTERM comes is answered (and made
    # durable) before kvd exits: a login whose bcrypt takes a while
    k = Kvd(KVD, ["--bcrypt-cost", "12"])
    R = __import__("kvdtest").pb()["rpc"]
    ch = channel(k)
    call = lambda m, req, resp, md=None: ch.unary_unary("/etcdserverpb.Auth/" + m, request_serializer=lambda x: x.SerializeToString(),
                                                      response_deserializer=getattr(R, resp).FromString)(req, timeout=60, metadata=md)
    call("UserAdd", R.AuthUserAddRequest(name="root", password="pw"), "AuthUserAddResponse")
    call("UserGrantRole", R.AuthUserGrantRoleRequest(user="root", role="root"), "AuthUserGrantRoleResponse")
    call("AuthEnable", R.AuthEnableRequest(), "AuthEnableResponse")
    f = ch.unary_unary("/etcdserverpb.Auth/Authenticate", request_serializer=lambda x: x.SerializeToString(),
                       response_deserializer=R.AuthenticateResponse.FromString).future(
        R.AuthenticateRequest(name="root", password="pw"), timeout=60)
    import urllib.request
    started = lambda: 'grpc_method="Authenticate"' in urllib.request.urlopen(k.url + "/metrics", timeout=10).read().decode()
    check(wait_for(started, 60), "kvd has the login (its started counter says so)")
    k.p.send_signal(signal.SIGTERM)
    try:
        tok = f.result(60).token
    except grpc.RpcError as e:
        tok = "error: %s %s" % (e.code(), e.details())
    check(tok and "." in tok, "the login in flight got its token: %r" % tok)
    check(k.p.wait(60) == 0, "then exit 0")
    ch.close()
    # a new connection is refused once shutdown began
    k2 = Kvd(KVD)
    ch = channel(k2)
    check(ch.unary_unary(HEALTH)(b"", timeout=5) == b"\x08\x01", "serving")
    k2.p.send_signal(signal.SIGINT)
    check(k2.p.wait(10) == 0, "SIGINT: exit 0 with an idle client connection")
    ch.close()


@test
def flags_and_errors():
    def run(*args):
        r = subprocess.run([KVD] + list(args), capture_output=True, timeout=10)
        return r.returncode, r.stdout.decode(), r.stderr.decode()
    rc, out, err = run("--nope")
    check(rc == 2 and err.count("\n") == 1 and "unknown flag --nope" in err, "unknown flag: %r" % err)
    rc, out, err = run("--max-request-bytes", "lots")
    check(rc == 2 and "invalid value" in err, "bad value: %r" % err)
    rc, out, err = run("--listen-client-urls", "https://127.0.0.1:1")
    check(rc == 2 and "--cert-file" in err and err.count("\n") == 1, "https without a certificate refused: %r" % err)
    rc, out, err = run("--version")
    check(rc == 0 and out.startswith("kvd Version: ") and "etcd API Version: 3.7.3" in out, "version: %r" % out)
    rc, out, err = run("--help")
    check(rc == 0 and "--listen-client-urls" in out, "help")
    k = Kvd(KVD)
    rc, out, err = run("--data-dir", "/tmp/kvd-other-%d" % os.getpid(), "--listen-client-urls", k.url)
    check(rc == 1 and "address already in use" in err, "busy port: %r" % err)
    rc, out, err = run("--data-dir", k.dir, "--listen-client-urls", "http://127.0.0.1:%d" % free_port())
    check(rc == 1 and "in use by another kvd" in err, "locked data dir: %r" % err)
    k.stop()
    r = subprocess.run([KVD, "--name", "x"], capture_output=True, timeout=10,
                       env=dict(os.environ, ETCD_NAME="y"))
    check(r.returncode == 2 and b"conflicting environment variable" in r.stderr, "env conflict")


@test
def default_data_dir_and_ipv6():
    d = "/tmp/kvd-cwd-%d" % os.getpid()
    os.makedirs(d, exist_ok=True)
    port = free_port()
    p = spawn([KVD, "--name", "n1", "--listen-client-urls",
                          "http://127.0.0.1:%d,http://[::1]:%d" % (port, port)], cwd=d,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    check(wait_for(lambda: etcdctl("127.0.0.1:%d" % port, "endpoint", "status")[0] == 0, 60, 0.1), "IPv4 listener")
    check(os.path.isdir(os.path.join(d, "n1.etcd")), "default data dir is <name>.etcd in cwd")
    try:
        socket.create_connection(("::1", port), timeout=2).close()
        v6 = True
    except OSError:
        v6 = False
    if v6:
        rc, out, err = etcdctl("[::1]:%d" % port, "member", "list")
        check(rc == 0, "IPv6 listener: %r" % err)
    else:
        print("  (no IPv6 loopback on this machine: IPv6 listener not exercised)")
    p.send_signal(signal.SIGTERM)
    check(p.wait(10) == 0, "exit 0")


@test
def http1_gets_an_answer():
    k = Kvd(KVD)
    s = socket.create_connection(("127.0.0.1", k.port), timeout=5)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        d = s.recv(4096)
        if not d:
            break
        data += d
    check(data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b'{"health":"true","reason":""}'), "HTTP/1.1 answer: %r" % data[:80])
    k.stop()


@test
def connection_limits_and_timeouts():
    k = Kvd(KVD, ["--max-connections", "2", "--max-idle-time", "400ms", "--stall-timeout", "500ms"])
    # two connections serving calls (Health/Watch streams): full of busy ones, a third is refused
    a, b = H2(k.port), H2(k.port)
    a.call(1, "/grpc.health.v1.Health/Watch")
    b.call(1, "/grpc.health.v1.Health/Watch")
    check(a.frames(2.0, until=lambda f: count(f, DATA)) and b.frames(2.0, until=lambda f: count(f, DATA)),
          "two watches served")
    c = H2(k.port)
    g = goaways(c.frames(2.0, until=goaways))
    check(g and g[0][1] == "ENHANCE_YOUR_CALM" and g[0][2] == b"too_many_connections", "3rd conn refused: %r" % g)
    c.close()
    # a busy connection is never idle, however quiet
    b.close()
    d = None
    end = time.time() + 60
    while time.time() < end:  # until kvd has reaped b (a slot frees): a condition, however busy the machine
        d = H2(k.port)
        if not goaways(d.frames(0.3, until=goaways)):
            break
        d.close()
    # idle: no call and no progress for 400 ms -> GOAWAY NO_ERROR max_idle, close
    g = goaways(d.frames(30.0, until=goaways))
    check(g and g[0][1] == "NO_ERROR" and g[0][2] == b"max_idle", "idle close: %r" % g)
    check(not goaways(a.frames(0.5)) and not a.closed, "the watching connection stays")
    a.close()
    d.close()
    # stall: our window is 0, a response waits: stream reset after 500 ms
    z = None
    end = time.time() + 60
    while time.time() < end:  # until a slot is free again
        z = H2(k.port, init_window=0)
        z.call(1)
        fs = z.frames(30.0, until=lambda f: rsts(f) or goaways(f))
        if not goaways(fs):
            break
        z.close()
    check(("CANCEL" in [c for s, c in rsts(fs) if s == 1]), "stalled stream reset: %r" % rsts(fs))
    z.close()
    k.stop()


@test
def full_table_evicts_the_oldest_idle():
    """--max-connections full of idle connections: a new client gets a slot,
    the connection idle the longest gets GOAWAY too_many_connections."""
    k = Kvd(KVD, ["--max-connections", "3"])
    old = [H2(k.port) for _ in range(3)]
    for c in old:
        c.frames(0.2)
    old[1].send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1000)))  # not progress: it stays the oldest
    new = H2(k.port)
    new.call(1)
    fs = new.frames(3.0, until=lambda f: count(f, HEADERS) >= 2)
    check(decode_headers(fs, 1) and decode_headers(fs, 1)[-1].get("grpc-status") == "0", "new client served")
    g = goaways(old[0].frames(3.0, until=goaways))
    check(g and g[0][1] == "NO_ERROR" and g[0][2] == b"too_many_connections", "oldest evicted: %r" % g)
    check(not goaways(old[1].frames(0.3)) and not goaways(old[2].frames(0.3)), "the others stay")
    for c in old + [new]:
        c.close()
    k.stop()


@test
def downgrade_like_etcd():
    """Maintenance/Downgrade as a one-member etcd 3.7.3 answers it: validate
    (3.6 and 3.6.x taken, 3.5 and 3.8 invalid, "x" a bad format, an unknown
    action), enable, a second enable (in progress), Status' downgradeInfo and
    storageVersion and /version once etcd has lowered its cluster version
    (at its next check, within seconds: waited for, not slept), a cancel,
    and the versions back; each answer compared field by field [§22.5]."""
    import urllib.request
    from kvdtest import Etcd, pb, wait_for
    R = pb()["rpc"]
    e, k = Etcd(), Kvd(KVD)

    def call(ep, m, req, resp):
        ch = grpc.insecure_channel(ep)
        f = ch.unary_unary("/etcdserverpb.Maintenance/%s" % m, request_serializer=lambda x: x.SerializeToString(),
                           response_deserializer=resp.FromString)
        try:
            r = f(req, timeout=10)
            r.header.Clear() if r.HasField("header") and m == "Status" else None
            if m == "Downgrade":
                r.header.cluster_id = r.header.member_id = r.header.raft_term = 0
            if m == "Status":
                for f_ in ("dbSize", "dbSizeInUse", "leader", "raftIndex", "raftTerm", "raftAppliedIndex"):
                    setattr(r, f_, 0)
            return ("ok", r.SerializeToString(deterministic=True).hex())
        except grpc.RpcError as x:
            return ("err", x.code().name, x.details())
        finally:
            ch.close()

    def version(srv):
        return json.loads(urllib.request.urlopen("http://%s/version" % srv.endpoint(), timeout=10).read())

    V, E, C = (R.DowngradeRequest.VALIDATE, R.DowngradeRequest.ENABLE, R.DowngradeRequest.CANCEL)
    def steps(todo):
        for act, ver in todo:
            a = [call(s.endpoint(), "Downgrade", R.DowngradeRequest(action=act, version=ver), R.DowngradeResponse)
                 for s in (e, k)]
            check(a[0] == a[1], "%d %r: etcd %r / kvd %r" % (act, ver, a[0], a[1]))
    steps([(V, "3.6"), (V, "3.6.9"), (V, "3.6.0-rc.1"), (V, "3.5"), (V, "3.8"), (V, "x"), (V, "3"), (V, ""),
           (7, "3.6"), (C, ""), (E, "3.5"), (E, "3.6")])
    # etcd lowers the cluster version at its next check; what it answers next depends on it: wait
    check(wait_for(lambda: version(e)["etcdcluster"] == "3.6.0" and version(e)["storage"] == "3.6.0", 60),
          "etcd lowered its cluster version: %r" % version(e))
    steps([(E, "3.6"), (V, "3.6"), (V, "3.5")])
    check(version(e) == version(k), "/version while downgrading: %r %r" % (version(e), version(k)))
    st = [call(s.endpoint(), "Status", R.StatusRequest(), R.StatusResponse) for s in (e, k)]
    check(st[0] == st[1], "Status while downgrading (downgradeInfo, storageVersion): %r %r" % tuple(st))
    a = [call(s.endpoint(), "Downgrade", R.DowngradeRequest(action=C), R.DowngradeResponse) for s in (e, k)]
    check(a[0] == a[1] and a[0][0] == "ok", "cancel: %r %r" % tuple(a))
    check(wait_for(lambda: version(e)["etcdcluster"] == "3.7.0", 60), "etcd's cluster version back: %r" % version(e))
    check(version(e) == version(k) == {"etcdserver": "3.7.3", "etcdcluster": "3.7.0", "storage": "3.7.0"},
          "/version after the cancel: %r %r" % (version(e), version(k)))
    st = [call(s.endpoint(), "Status", R.StatusRequest(), R.StatusResponse) for s in (e, k)]
    check(st[0] == st[1], "Status after the cancel: %r %r" % tuple(st))
    e.stop()
    k.stop()


@test
def failed_tests_leave_nothing_running():
    """The harness: servers a test started are stopped when it fails or
    raises, and when the runner itself is killed."""
    import re
    script = """
import sys, time
sys.path.insert(0, %r)
from kvdtest import Kvd, Etcd, test, run_tests, check
@test
def raises():
    k = Kvd(%r)
    print("PID", k.p.pid, flush=True)
    raise RuntimeError("boom")
@test
def fails():
    e = Etcd()
    print("PID", e.p.pid, flush=True)
    check(False, "on purpose")
@test
def hangs():
    k = Kvd(%r)
    print("PID", k.p.pid, flush=True)
    if len(sys.argv) > 1:
        time.sleep(600)
run_tests(sys.argv[:1] + sys.argv[2:])
""" % (os.path.join(ROOT, "test", "lib"), KVD, KVD)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    pids = re.findall(r"PID (\d+)", r.stdout)
    check(len(pids) == 3 and r.stdout.splitlines()[-1] == "0 passed, 2 failed", "ran: %r" % r.stdout[-300:])
    check(all(not os.path.exists("/proc/%s" % p) for p in pids), "all stopped: %r" % pids)
    # the runner killed while a test waits: what it started goes too
    p = subprocess.Popen([sys.executable, "-c", script, "hang", "hangs"], stdout=subprocess.PIPE, text=True)
    line = ""
    for line in p.stdout:
        if line.startswith("PID"):
            break
    p.terminate()
    p.wait(30)
    pid = line.split()[1] if line.startswith("PID") else "0"
    check(wait_for(lambda: not os.path.exists("/proc/%s" % pid), 60), "stopped with the runner: %s" % pid)


def main():
    return run_tests(sys.argv)


if __name__ == "__main__":
    sys.exit(main())
