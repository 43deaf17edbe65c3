#!/usr/bin/python3
"""HTTP/1.1 on the client port, kvd beside Debian's etcd: /health (with and
without an active alarm, ?exclude=NOSPACE), /version, an unknown path, a
wrong method, HTTP/1.0 -- status, headers (but Date) and body compared;
keep-alive and pipelining; /metrics read by Prometheus' own parser
(python3-prometheus-client), its values checked against what was done and
its etcd_*/grpc_*/process_* names and types against etcd's, also on
--listen-metrics-urls (the gateway has test/gateway.py); limits (a 9 KiB head: 431; garbage: 400; a
transfer coding other than chunked: 501; a head that never ends: closed) on
kvd alone; /health over TLS through ALPN
http/1.1.
Last line: "N passed, N failed".
"""
import http.client
import os
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvdtest import Client, Etcd, Kvd, check, main_guard, pb, test, wait_for

R = pb()["rpc"]


def raw(port, data, until_close=True, timeout=15):
    """Send bytes, read until the server closes (or a pause): the answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
            if not until_close and out.count(b"\r\n\r\n") and len(out) >= head_len(out):
                break
    except socket.timeout:
        out += b"<timeout>"
    s.close()
    return out


def head_len(out):
    h, _, body = out.partition(b"\r\n\r\n")
    for line in h.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(h) + 4 + int(line.split(b":")[1])
    return len(out)


def answers(data):
    """Parse one or more HTTP answers: [(status line, {header: value}, body)]."""
    res = []
    while data.startswith(b"HTTP/"):
        h, _, rest = data.partition(b"\r\n\r\n")
        lines = h.decode().split("\r\n")
        hd = {}
        for line in lines[1:]:
            n, _, v = line.partition(":")
            hd[n.strip().lower()] = v.strip()
        n = int(hd.get("content-length", len(rest)))
        res.append((lines[0], hd, rest[:n]))
        data = rest[n:]
    return res


def one(port, method, path, version="1.1"):
    data = raw(port, ("%s %s HTTP/%s\r\nHost: x\r\nConnection: close\r\n\r\n" % (method, path, version)).encode())
    a = answers(data)
    if not a:
        return (data[:80], {}, b"")
    st, hd, body = a[0]
    hd.pop("date", None)
    hd.pop("connection", None)  # Go leaves it out of some answers, kvd says it: both close
    return st, hd, body


@test
def endpoints_like_etcd():
    e = Etcd()
    k = Kvd()
    cases = [("GET", "/health"), ("GET", "/version"), ("GET", "/nope"), ("POST", "/health"), ("PUT", "/version"),
             ("GET", "/health?exclude=NOSPACE"), ("GET", "/healthz")]
    for m, p in cases:
        a, b = one(e.port, m, p), one(k.port, m, p)
        check(a == b, "%s %s: etcd %s / kvd %s" % (m, p, a, b))
    a, b = one(e.port, "GET", "/health", "1.0"), one(k.port, "GET", "/health", "1.0")
    check(a == b and a[0].startswith("HTTP/1.0 200"), "HTTP/1.0: %s / %s" % (a, b))
    # an active alarm: 503 on both, unless excluded
    for srv in (e, k):
        c = Client(srv.endpoint())
        c.call("Alarm", R.AlarmRequest(action=R.AlarmRequest.ACTIVATE, memberID=1, alarm=R.NOSPACE),
               service="etcdserverpb.Maintenance", resp="AlarmResponse")
        c.close()
    for p in ("/health", "/health?exclude=NOSPACE"):
        a, b = one(e.port, "GET", p), one(k.port, "GET", p)
        check(a == b, "alarm active, GET %s: etcd %s / kvd %s" % (p, a, b))
    check(one(k.port, "GET", "/health")[0].startswith("HTTP/1.1 503"), "503 while NOSPACE is active")
    import re
    from kvdtest import etcdctl
    hc = [etcdctl(s, "endpoint", "health") for s in (e, k)]  # 3.4's etcdctl does not look at alarms
    hc = [(r[0], re.sub(r"127.0.0.1:\d+|took = \S+", "X", r[1])) for r in hc]
    check(hc[0] == hc[1] and hc[0][0] == 0, "etcdctl endpoint health while an alarm is active: %r" % hc)
    e.stop()
    k.stop()


@test
def keep_alive_and_pipelining():
    k = Kvd()
    conn = http.client.HTTPConnection("127.0.0.1", k.port, timeout=10)
    bodies = []
    for p in ("/health", "/version", "/nope", "/health"):
        conn.request("GET", p)
        r = conn.getresponse()
        bodies.append((r.status, r.read()))
    check([s for s, _ in bodies] == [200, 200, 404, 200], "four requests on one connection: %s" % bodies)
    conn.close()
    data = raw(k.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /version HTTP/1.1\r\nHost: x\r\n\r\n"
                       b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    a = answers(data)
    check([x[2] for x in a] == [b'{"health":"true"}', b'{"etcdserver":"3.4.23","etcdcluster":"3.4.0"}',
                                b'{"health":"true"}'], "three pipelined requests answered in order: %s" % a)
    # a body nobody takes is read and dropped; the next request is still served
    data = raw(k.port, b"GET /health HTTP/1.1\r\nContent-Length: 5\r\n\r\nHELLOGET /version HTTP/1.1\r\n"
                       b"Connection: close\r\n\r\n")
    check([x[0] for x in answers(data)] == ["HTTP/1.1 200 OK"] * 2, "a body dropped: %s" % data[:200])
    k.stop()


@test
def limits_and_garbage():
    k = Kvd()
    a = answers(raw(k.port, b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"))
    check(a and a[0][0].startswith("HTTP/1.1 431"), "a 9 KiB head: 431 and closed: %s" % (a[:1],))
    a = answers(raw(k.port, b"GET /health HTTP/1.1\r\nBad Header\r\n\r\n"))
    check(a and a[0][0].startswith("HTTP/1.1 400"), "a header without a colon: 400: %s" % (a[:1],))
    a = answers(raw(k.port, b"POST /health HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"))
    check(a and a[0][0].startswith("HTTP/1.1 501"), "a transfer coding other than chunked: 501: %s" % (a[:1],))
    out = raw(k.port, b"GET /health HTTP/1.1\r\nHost: x\r\n", timeout=30)
    check(out == b"", "a head that never ends: closed without an answer (%r)" % out[:60])
    check(k.alive(), "kvd serves on")
    c = Client(k.endpoint())
    check(c.call("Put", R.PutRequest(key=b"k", value=b"v"))[0] == "ok", "gRPC on the same port")
    c.close()
    k.stop()


@test
def health_over_tls_alpn_http11():
    d = tempfile.mkdtemp(prefix="kvd-http1-tls-")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", d + "/k.pem", "-out", d + "/c.pem", "-days", "3", "-subj", "/CN=t",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    from kvdtest import free_port
    port = free_port()
    k = Kvd(args=["--listen-client-urls", "https://127.0.0.1:%d" % port, "--cert-file", d + "/c.pem",
                  "--key-file", d + "/k.pem"])
    r = subprocess.run(["curl", "-s", "--http1.1", "--cacert", d + "/c.pem", "-w", " %{http_code} %{http_version}",
                        "https://127.0.0.1:%d/health" % port], capture_output=True, text=True, timeout=30)
    check(r.stdout == '{"health":"true"} 200 1.1', "curl --http1.1 over TLS: %r %r" % (r.stdout, r.stderr))
    k.stop()
    subprocess.run(["rm", "-rf", d])


def scrape(port, path="/metrics"):
    from prometheus_client.parser import text_string_to_metric_families
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    conn.close()
    check(r.status == 200 and r.getheader("content-type", "").startswith("text/plain; version=0.0.4"),
          "GET %s on %d: %s %s" % (path, port, r.status, r.getheader("content-type")))
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    vals = {}
    for f in fams.values():
        for smp in f.samples:
            vals[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    return fams, vals


@test
def metrics():
    from kvdtest import free_port, WatchStream
    mport = free_port()
    k = Kvd(os.environ.get("KVD_TEST", os.path.join(os.path.dirname(os.path.abspath(__file__)), "kvd-test")),
            args=["--listen-metrics-urls", "http://127.0.0.1:%d" % mport])
    c = Client(k.endpoint())
    for i in range(5):
        c.call("Put", R.PutRequest(key=b"m%d" % i, value=b"v"))
    c.call("Range", R.RangeRequest(key=b""))
    c.call("Put", R.PutRequest(key=b"m0", value=b"w"))
    w = WatchStream(k.endpoint())
    w.create(key=b"m0")
    w.wait(1)
    fams, v = scrape(k.port)
    L = lambda meth, code=None, svc="etcdserverpb.KV", kind="unary": tuple(sorted(
        ([("grpc_code", code)] if code else []) + [("grpc_method", meth), ("grpc_service", svc), ("grpc_type", kind)]))
    check(v.get(("grpc_server_handled_total", L("Put", "OK"))) == 6, "6 Puts handled OK: %r" %
          v.get(("grpc_server_handled_total", L("Put", "OK"))))
    check(v.get(("grpc_server_handled_total", L("Range", "InvalidArgument"))) == 1, "1 Range InvalidArgument")
    check(v.get(("grpc_server_started_total", L("Watch", None, "etcdserverpb.Watch", "bidi_stream"))) == 1,
          "the watch started")
    check(v.get(("etcd_debugging_mvcc_keys_total", ())) == 5, "5 keys")
    check(v.get(("etcd_debugging_mvcc_watcher_total", ())) == 1 and
          v.get(("etcd_debugging_mvcc_watch_stream_total", ())) == 1, "one watcher on one stream")
    check(v.get(("etcd_debugging_mvcc_current_revision", ())) == 7, "revision 7")
    st = c.call("Status", R.StatusRequest(), service="etcdserverpb.Maintenance", resp="StatusResponse")[1]
    check(v.get(("etcd_mvcc_db_total_size_in_bytes", ())) == st.dbSize, "db size as Status says: %r / %d" %
          (v.get(("etcd_mvcc_db_total_size_in_bytes", ())), st.dbSize))
    n = v.get(("etcd_disk_wal_fsync_duration_seconds_count", ()))
    bk = sorted((float(dict(lab)["le"]), val) for (name, lab), val in v.items()
                if name == "etcd_disk_wal_fsync_duration_seconds_bucket")
    check(n and n >= 6 and bk[-1] == (float("inf"), n) and all(a[1] <= b[1] for a, b in zip(bk, bk[1:])),
          "fsync histogram: %r of %r" % (bk, n))
    with open("/proc/%d/status" % k.p.pid) as f:
        rss = [int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:")][0]
    got = v.get(("process_resident_memory_bytes", ()))
    check(got and rss / 2 < got < rss * 2, "process_resident_memory_bytes %r near VmRSS %d" % (got, rss))
    # the metrics listener: /metrics and /health, nothing else; no gRPC
    fams2, v2 = scrape(mport)
    check(v2.get(("grpc_server_handled_total", L("Put", "OK"))) == 6, "the metrics listener: same counters")
    check(one(mport, "GET", "/health")[2] == b'{"health":"true"}', "the metrics listener: /health")
    check(one(mport, "POST", "/v3/kv/range")[0].startswith("HTTP/1.1 404"), "the metrics listener: no gateway")
    cm = Client("127.0.0.1:%d" % mport)
    check(cm.call("Range", R.RangeRequest(key=b"m0"), timeout=5)[0] == "err", "the metrics listener: no gRPC")
    cm.close()
    w.close()
    c.close()
    # etcd's names and types for the etcd_*, grpc_* and process_* families kvd exports
    e = Etcd()
    ce = Client(e.endpoint())
    ce.call("Put", R.PutRequest(key=b"m", value=b"v"))
    ce.call("Range", R.RangeRequest(key=b""))
    ef, _ = scrape(e.port)
    ce.close()
    mine = {n: f.type for n, f in fams.items() if not n.startswith("kvd_")}
    theirs = {n: ef[n].type for n in mine if n in ef}
    check(mine == theirs, "names and types as etcd's: kvd %r\n  etcd %r" %
          (sorted(set(mine.items()) - set(theirs.items())), sorted(set(theirs.items()) - set(mine.items()))))
    e.stop()
    k.stop()


if __name__ == "__main__":
    main_guard(sys.argv)
