#!/usr/bin/python3
"""Watch with real clients: etcdctl 3.4 watch side by side with etcd,
python3-etcd3 watch/watch_prefix/cancel/compacted, a slow reader while 100k
events are written (kvd's memory stays bounded, every event arrives in
order), progress notifications, fragments, and `etcdctl make-mirror` from
kvd into a real etcd.  Last line: "N passed, N failed".
"""
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import (ROOT, Kvd, Etcd, Client, WatchStream, pb, check, check_script, test, run_tests, wait_for,
                     grpc_frame, grpc_headers, spawn)

KVD = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))
KVD_TEST = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))
R = pb()["rpc"]


def ctl_env():
    return dict(os.environ, ETCDCTL_API="3")


def watchers(server):
    """Watchers the server has now: kvd's own count (kvd.test.Test/Stats),
    etcd's gauge on /metrics."""
    if isinstance(server, Etcd):
        text = urllib.request.urlopen("http://%s/metrics" % server.endpoint(), timeout=10).read().decode()
        return int(re.search(r"^etcd_debugging_mvcc_watcher_total (\d+)", text, re.M).group(1))
    ch = grpc.insecure_channel(server.endpoint())
    try:
        out = ch.unary_unary("/kvd.test.Test/Stats")(b"", timeout=10).decode()
    finally:
        ch.close()
    return int(dict(kv.split("=") for kv in out.split())["watchers"])


def watch_session(server, argv, actions, stdin=None, until=None, exits=False):
    """Run `etcdctl watch ...`: once the server has its watcher, actions(client)
    writes; then wait until its output shows `until` (the last write's marker), or
    the process ends by itself.  No fixed pause: on a busy machine every step
    waits as long as it needs.  Its stdout, stderr and exit code."""
    before = watchers(server)
    p = spawn(["etcdctl", "--endpoints", server.endpoint(), "watch"] + argv,
              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ctl_env())
    out, err = [], []
    readers = [threading.Thread(target=lambda f=f, into=into: into.extend(iter(lambda: f.read1(65536), b"")),
                                daemon=True) for f, into in ((p.stdout, out), (p.stderr, err))]
    for r in readers:
        r.start()
    if stdin:
        p.stdin.write(stdin.encode())
        p.stdin.flush()
    wait_for(lambda: watchers(server) > before or p.poll() is not None, 60, 0.05)
    c = Client(server.endpoint())
    actions(c)
    c.close()
    if until:
        wait_for(lambda: until.encode() in b"".join(out) or p.poll() is not None, 60, 0.05)
    if exits:  # it ends by itself (a canceled watch)
        wait_for(lambda: p.poll() is not None, 60, 0.05)
    else:
        p.send_signal(signal.SIGINT)
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    for r in readers:
        r.join(10)
    return b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace"), p.returncode


def writes(c, last=None):
    c.call("Put", R.PutRequest(key=b"/a/1", value=b"one"))
    c.call("Put", R.PutRequest(key=b"/a/1", value=b"uno"))
    c.call("Put", R.PutRequest(key=b"/b", value=b"bee"))
    t = R.TxnRequest()
    t.success.add().request_put.CopyFrom(R.PutRequest(key=b"/a/2", value=b"two"))
    t.success.add().request_delete_range.CopyFrom(R.DeleteRangeRequest(key=b"/a/1"))
    c.call("Txn", t)
    c.call("Put", R.PutRequest(key=b"foo", value=b"bar"))
    if last:  # a write the watcher sees last: its marker in etcdctl's output ends the wait
        c.call("Put", R.PutRequest(key=last, value=b"END"))


def ending(key):
    return lambda c: writes(c, key)


@test
def etcdctl_watch_side_by_side():
    e, k = Etcd(), Kvd(KVD_TEST)
    try:
        for side in (e, k):  # some history first: revisions 2..4
            c = Client(side.endpoint())
            for v in (b"h1", b"h2", b"h3"):
                c.call("Put", R.PutRequest(key=b"/a/h", value=v))
            c.close()
        for argv, stdin, last, marker in ((["--prefix", "/a"], None, b"/a/9", "END"),
                                          (["--prefix", "/a", "--prev-kv"], None, b"/a/9", "END"),
                                          # from revision 2 the earlier sessions' END comes first:
                                          # wait for this session's own last event
                                          (["--rev", "2", "--prefix", "/"], None, b"/z", "/z\nEND"),
                                          (["foo"], None, b"foo", "END"),
                                          (["/a/1", "/a/3"], None, b"/a/2", "END"),
                                          (["-i"], "watch --prefix /a\n", b"/a/9", "END"),
                                          (["--prefix", "/a", "-w", "json"], None, b"/a/9", "RU5E")):
            a = watch_session(e, argv, ending(last), stdin, marker)
            b = watch_session(k, argv, ending(last), stdin, marker)
            norm = lambda s: __import__("re").sub(r'"(cluster_id|member_id|raft_term)":[0-9]+,?', "", s)
            check(norm(a[0]) == norm(b[0]) and a[0], "etcdctl watch %s:\n    etcd: %r\n    kvd:  %r" %
                  (" ".join(argv), a[0][:600], b[0][:600]))
        # compacted: etcdctl prints etcd's message and exits 5
        for side in (e, k):
            c = Client(side.endpoint())
            c.call("Compact", R.CompactionRequest(revision=4))
            c.close()
        a = watch_session(e, ["--rev", "2", "/a/h"], lambda c: None, exits=True)
        b = watch_session(k, ["--rev", "2", "/a/h"], lambda c: None, exits=True)
        check(a[2] == b[2] == 5 and "required revision has been compacted" in b[1], "compacted: %r / %r" %
              (a[1:], b[1:]))
    finally:
        e.stop()
        k.stop()


@test
def etcdctl_watch_interactive_progress():
    k = Kvd(KVD_TEST)
    out, err, rc = watch_session(k, ["-i"], ending(b"/a/9"), "watch --prefix /a\nprogress\n", "progress notify: ")
    check("PUT\n/a/1\none" in out and "progress notify: " in out, "watch -i + progress: %r %r" % (out, err))
    k.stop()


@test
def python_etcd3():
    """python3-etcd3 in its own interpreter: its kv.proto would clash with ours."""
    k = Kvd(KVD)
    check_script("etcd3client.py", k.port, 60)
    k.stop()


def raw_watch_stream(port, window=65535):
    """A raw HTTP/2 connection with one Watch stream (id 1) whose reading we control."""
    from hpack import Encoder
    s = socket.create_connection(("127.0.0.1", port))
    fr = lambda t, f, sid, p=b"": struct.pack(">I", len(p))[1:] + bytes([t, f]) + struct.pack(">I", sid) + p
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + fr(4, 0, 0, struct.pack(">HI", 4, window)) + fr(4, 1, 0))
    s.sendall(fr(1, 4, 1, Encoder().encode(grpc_headers("/etcdserverpb.Watch/Watch", port))))
    return s, fr


@test
def slow_reader_100k_events():
    """The client stops reading while 100k events (1000 keys, each rewritten
    100 times) are written: kvd's own memory stays bounded [§25.3]; when it
    reads again, every event arrives in order, none lost, none twice
    [§25.2]."""
    k = Kvd(KVD_TEST)
    s, fr = raw_watch_stream(k.port)
    req = R.WatchRequest()
    req.create_request.CopyFrom(R.WatchCreateRequest(key=b"ev/", range_end=b"ev0"))
    s.sendall(fr(0, 0, 1, grpc_frame(req.SerializeToString())))
    c = Client(k.endpoint())
    stats = lambda: dict(x.split("=") for x in c.ch.unary_unary("/kvd.test.Test/Stats")(b"").decode().split())
    check(wait_for(lambda: stats()["watchers"] == "1", 60), "the watcher is there")
    base = int(stats()["mem"])
    peak = 0
    for t0 in range(0, 100000, 100):
        t = R.TxnRequest()
        for i in range(t0, t0 + 100):
            t.success.add().request_put.CopyFrom(R.PutRequest(key=b"ev/%03d" % (i % 1000), value=b"v" * 40))
        check(c.call("Txn", t)[0] == "ok", "write") if t0 % 20000 == 0 else c.call("Txn", t)
        if t0 % 10000 == 0:
            peak = max(peak, int(stats()["mem"]))
    peak = max(peak, int(stats()["mem"]))
    print("    kvd's memory grew %d KiB while %d MB of events waited behind a stopped reader"
          % ((peak - base) // 1024, 100000 * 75 // 1000000))
    check(peak - base < 2 * 1024 * 1024, "kvd's memory while the reader sleeps: +%d bytes for %d MB of events"
          % (peak - base, 100000 * 75 // 1000000))
    # now read everything, returning window credit as we go
    buf, sbuf, revs = b"", b"", []
    s.settimeout(10)
    t_end = time.time() + 120
    while len(revs) < 100000 and time.time() < t_end:
        try:
            d = s.recv(1 << 20)
        except socket.timeout:
            break
        if not d:
            break
        buf += d
        out = b""
        while len(buf) >= 9:
            ln = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + ln:
                break
            typ, flags, sid, p = buf[3], buf[4], struct.unpack(">I", buf[5:9])[0] & 0x7FFFFFFF, buf[9:9 + ln]
            buf = buf[9 + ln:]
            if typ == 0 and sid == 1 and p:
                out += fr(8, 0, 1, struct.pack(">I", len(p))) + fr(8, 0, 0, struct.pack(">I", len(p)))
                sbuf += p
            elif typ == 6 and not flags:
                out += fr(6, 1, 0, p)
        while len(sbuf) >= 5 and len(sbuf) >= 5 + struct.unpack(">I", sbuf[1:5])[0]:
            ml = struct.unpack(">I", sbuf[1:5])[0]
            for ev in R.WatchResponse.FromString(sbuf[5:5 + ml]).events:
                revs.append(ev.kv.mod_revision)
            sbuf = sbuf[5 + ml:]
        if out:
            s.sendall(out)
    keys = len(revs)
    s.close()
    check(keys == 100000, "all 100k events after the pause (%d)" % keys)
    check(all(revs[i] <= revs[i + 1] for i in range(len(revs) - 1)), "in revision order")
    check(len(set(revs)) == 1000, "one revision per txn of 100 (%d)" % len(set(revs)))
    check(k.alive(), "kvd alive")
    c.close()
    k.stop()


@test
def max_watchers():
    """--max-watchers counts watchers across streams; a create beyond it is
    answered created + canceled with the reason, and a cancel frees a slot."""
    k = Kvd(KVD_TEST, ["--max-watchers", "3"])
    a, b = WatchStream(k.endpoint()), WatchStream(k.endpoint())
    for i in range(2):
        a.create(key=b"m%d" % i)
    check(a.wait(2), "two created")
    b.create(key=b"m2")
    b.create(key=b"m3")
    check(b.wait(2), "answers on the second stream")
    r = b.got[1]
    check(r.created and r.canceled and r.watch_id == -1 and "--max-watchers" in r.cancel_reason,
          "fourth refused: %r" % (r,))
    a.cancel(a.got[0].watch_id)
    check(a.wait(3), "cancel answered")
    b.create(key=b"m4")
    check(b.wait(3) and b.got[2].created and not b.got[2].canceled, "a slot freed by the cancel")
    c = Client(k.endpoint())
    c.call("Put", R.PutRequest(key=b"m4", value=b"x"))
    check(b.wait(4) and [e.kv.key for e in b.got[3].events] == [b"m4"], "the new watcher works")
    c.close()
    a.close()
    b.close()
    k.stop()


@test
def progress_notify_and_fragments():
    k = Kvd(KVD, ["--watch-progress-notify-interval", "300ms", "--max-request-bytes", "10000"])
    w = WatchStream(k.endpoint())
    w.create(key=b"pn", progress_notify=True)
    check(w.wait(1), "created")
    prog = lambda: [r for r in w.got[1:] if not r.events and not r.created]
    check(wait_for(lambda: len(prog()) >= 2, 60) and all(r.watch_id == 0 for r in prog()),
          "progress notifications (every 300 ms): %d" % len(prog()))
    c = Client(k.endpoint())
    n0 = len(w.got)
    c.call("Put", R.PutRequest(key=b"pn", value=b"x"))
    check(wait_for(lambda: any(r.events for r in w.got[n0:]), 60), "event delivered")
    # fragments: one revision's events bigger than --max-request-bytes, split on request
    for i in range(12):
        c.call("Put", R.PutRequest(key=b"fr/%02d" % i, value=b"z" * 3000))
    n0 = len(w.got)
    w.create(key=b"fr/", range_end=b"fr0", fragment=True, prev_kv=True)
    w.create(key=b"fr/", range_end=b"fr0", prev_kv=True)
    check(wait_for(lambda: sum(1 for r in w.got[n0:] if r.created) == 2, 60), "two more created")
    n0 = len(w.got)
    check(c.call("DeleteRange", R.DeleteRangeRequest(key=b"fr/", range_end=b"fr0"))[0] == "ok", "delete 12 keys")
    frag = lambda: [r for r in w.got[n0:] if r.watch_id == 1]
    whole = lambda: [r for r in w.got[n0:] if r.watch_id == 2]
    wait_for(lambda: sum(len(r.events) for r in frag()) >= 12 and whole(), 60)
    frag, whole = frag(), whole()
    check(len(frag) >= 3 and all(r.fragment for r in frag[:-1]) and not frag[-1].fragment and
          sum(len(r.events) for r in frag) == 12, "fragments: %r" % [(len(r.events), r.fragment) for r in frag])
    check(len(whole) == 1 and len(whole[0].events) == 12, "without fragment: one response")
    c.close()
    w.close()
    k.stop()


@test
def make_mirror_into_etcd():
    """The migration path: etcdctl make-mirror from kvd into a real etcd."""
    e, k = Etcd(), Kvd(KVD)
    c = Client(k.endpoint())
    for i in range(50):
        c.call("Put", R.PutRequest(key=b"cfg/%02d" % i, value=b"v%d" % i))
    p = spawn(["etcdctl", "--endpoints", k.endpoint(), "make-mirror", e.endpoint()],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ctl_env())
    ce = Client(e.endpoint())
    get_all = lambda: ce.call("Range", R.RangeRequest(key=b"cfg/", range_end=b"cfg0"))
    check(wait_for(lambda: get_all()[0] == "ok" and len(get_all()[1].kvs) == 50, 60), "existing keys copied")
    c.call("Put", R.PutRequest(key=b"cfg/new", value=b"live"))
    c.call("DeleteRange", R.DeleteRangeRequest(key=b"cfg/00"))
    c.call("Put", R.PutRequest(key=b"cfg/01", value=b"changed"))
    ok = wait_for(lambda: {kv.key: kv.value for kv in get_all()[1].kvs}.get(b"cfg/new") == b"live" and
                  {kv.key: kv.value for kv in get_all()[1].kvs}.get(b"cfg/01") == b"changed" and
                  b"cfg/00" not in {kv.key for kv in get_all()[1].kvs}, 60)
    check(ok, "live updates mirrored")
    p.send_signal(signal.SIGINT)
    try:  # make-mirror syncs what it has before it exits; a busy machine takes its time
        p.wait(120)
    except subprocess.TimeoutExpired:
        check(False, "make-mirror did not exit within 120 s of SIGINT")
    c.close()
    ce.close()
    e.stop()
    k.stop()


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
