#!/usr/bin/python3
"""HTTP/1.1 on the client port, kvd beside etcd 3.7.3: /health (with and
without active alarms, ?exclude= repeated, ?serializable=true; 3.7's body
has a "reason"), /livez and /readyz (?verbose, ?exclude=, each check's own
path, NOSPACE and CORRUPT alarms), /version (also while a downgrade is
enabled), an unknown path, wrong methods, /v3 redirected, HTTP/1.0 --
status, headers (but Date) and body compared, the per-check lines sorted
(etcd runs its checks in Go's random map order); keep-alive and
pipelining; /metrics read by Prometheus' own parser
(python3-prometheus-client), its values checked against what was done and
its etcd_*/grpc_*/process_* names and types against etcd's, and etcd 3.7's
removed names absent; --listen-metrics-urls beside etcd's (/metrics and the
health endpoints, nothing else; the gateway has test/gateway.py); limits (a
9 KiB head: 431; garbage: 400; a transfer coding other than chunked: 501; a
head that never ends: closed) on kvd alone; /health over TLS through ALPN
http/1.1; and what curl over TLS (ALPN h2) gets -- the endpoints, the
gateway (its TLS-only metadata headers too) and a watch stream, on the
client port and a TLS metrics listener -- beside etcd 3.7.3.
Last line: "N passed, N failed".
"""
import datetime
import email.utils
import http.client
import os
import re
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
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
    # /livez and /readyz: etcd runs its checks in Go's map order (random)
    lines = body.split(b"\n")
    checks = sorted(x for x in lines if x[:3] in (b"[+]", b"[-]"))
    if checks:
        body = b"\n".join(checks + [x for x in lines if x[:3] not in (b"[+]", b"[-]")])
    return st, hd, body


def alarm(srv, kind, action=None):
    c = Client(srv.endpoint())
    c.call("Alarm", R.AlarmRequest(action=action if action is not None else R.AlarmRequest.ACTIVATE, memberID=1,
                                   alarm=kind), service="etcdserverpb.Maintenance", resp="AlarmResponse")
    c.close()


def pair(e, k, cases, what=""):
    for m, p in cases:
        a, b = one(e.port, m, p), one(k.port, m, p)
        check(a == b, "%s%s %s: etcd %s / kvd %s" % (what, m, p, a, b))


HEALTH = [("GET", "/health"), ("GET", "/health?exclude=NOSPACE"), ("GET", "/health?exclude=CORRUPT"),
          ("GET", "/health?exclude=NOSPACE&exclude=CORRUPT"), ("GET", "/health?exclude=CORRUPT&exclude=NOSPACE"),
          ("GET", "/health?exclude=nospace"), ("GET", "/health?serializable=true"),
          ("GET", "/health?serializable=true&exclude=NOSPACE"), ("GET", "/health?exclude=NO%53PACE"),
          ("GET", "/livez"), ("GET", "/livez?verbose"), ("GET", "/livez/serializable_read"),
          ("GET", "/readyz"), ("GET", "/readyz?verbose"), ("GET", "/readyz?verbose=0&exclude=data_corruption"),
          ("GET", "/readyz?exclude=data_corruption&exclude=bogus"), ("GET", "/readyz/data_corruption"),
          ("GET", "/readyz/data_corruption?verbose"), ("GET", "/readyz/linearizable_read"),
          ("GET", "/readyz/serializable_read?exclude=serializable_read"), ("GET", "/readyz/non_learner")]


@test
def endpoints_like_etcd():
    e = Etcd()
    k = Kvd()
    cases = HEALTH + [
        ("GET", "/version"), ("GET", "/nope"), ("POST", "/health"), ("PUT", "/version"), ("GET", "/healthz"),
        ("DELETE", "/livez"), ("POST", "/readyz"), ("PUT", "/readyz/linearizable_read"), ("GET", "/livez/"),
        ("GET", "/livez/linearizable_read"), ("GET", "/readyz/nope"), ("GET", "/readyzx"), ("GET", "/health/"),
        ("GET", "/v3"), ("POST", "/v3"), ("GET", "/v3?a=1&b=<x>"), ("GET", "/v3alpha/kv/range"),
        ("GET", "/config/local/log"), ("GET", "/v2/keys/a")]
    pair(e, k, cases)
    a = one(k.port, "GET", "/health")
    check(a[2] == b'{"health":"true","reason":""}' and "content-type" in a[1], "3.7's /health body: %s" % (a,))
    a, b = one(e.port, "GET", "/health", "1.0"), one(k.port, "GET", "/health", "1.0")
    check(a == b and a[0].startswith("HTTP/1.0 200"), "HTTP/1.0: %s / %s" % (a, b))
    # an active alarm: 503 on both, unless excluded; /readyz does not look at NOSPACE
    for srv in (e, k):
        alarm(srv, R.NOSPACE)
    pair(e, k, HEALTH, "NOSPACE active, ")
    a = one(k.port, "GET", "/health")
    check(a[0].startswith("HTTP/1.1 503") and a[2] == b'{"health":"false","reason":"ALARM NOSPACE"}\n',
          "503 ALARM NOSPACE while NOSPACE is active: %s" % (a,))
    check(one(k.port, "GET", "/health?exclude=NOSPACE")[0].startswith("HTTP/1.1 200"), "NOSPACE excluded: 200")
    import re
    from kvdtest import etcdctl
    hc = [etcdctl(s, "endpoint", "health") for s in (e, k)]  # the same verdict on both, whatever it is
    hc = [(r[0], re.sub(r"127.0.0.1:\d+|took = \S+", "X", r[1])) for r in hc]
    check(hc[0] == hc[1], "etcdctl endpoint health while an alarm is active: %r" % hc)
    # CORRUPT beside NOSPACE: /readyz's data_corruption fails (etcd lists its
    # alarms in map order, so /health's reason is compared with one excluded)
    for srv in (e, k):
        alarm(srv, R.CORRUPT)
    pair(e, k, [x for x in HEALTH if not (x[1] == "/health" or x[1].startswith("/health?serializable=true") or
                                          x[1] == "/health?exclude=nospace")], "NOSPACE and CORRUPT active, ")
    a = one(k.port, "GET", "/readyz")
    check(a[0].startswith("HTTP/1.1 503") and b"[-]data_corruption failed: alarm activated: CORRUPT" in a[2] and
          a[2].endswith(b"\n\n") and b"ok" not in a[2].split(b"\n"), "/readyz: 503, data_corruption failed, http.Error's newline: %s" % (a,))
    check(one(k.port, "GET", "/livez")[0].startswith("HTTP/1.1 200"), "/livez: still ok")
    check(one(k.port, "GET", "/health?exclude=NOSPACE")[2] == b'{"health":"false","reason":"ALARM CORRUPT"}\n',
          "/health?exclude=NOSPACE: ALARM CORRUPT")
    # etcd 3.7's counters of the checks run: the same series, the same last results (kvd ran a few more)
    got = []
    for srv in (e, k):
        _, vals = scrape(srv.port)
        got.append(({x: v for x, v in vals.items() if x[0] == "etcd_server_healthcheck"},
                    sorted(x for x in vals if x[0] == "etcd_server_healthchecks_total"),
                    all((x[0], x[1]) in vals for x in (("etcd_server_health_success_total", ()),
                                                        ("etcd_server_health_failures_total", ())))))
    check(got[0] == got[1] and len(got[0][0]) == 5 and got[0][2], "healthcheck metrics: %r / %r" % tuple(got))
    e.stop()
    k.stop()


@test
def version_follows_a_downgrade():
    """/version's etcdcluster and storage are 3.6.0 while a downgrade to 3.6
    is enabled, on etcd once its version monitor has seen it (waited for)."""
    e = Etcd()
    k = Kvd()
    for srv in (e, k):
        c = Client(srv.endpoint())
        r = c.call("Downgrade", R.DowngradeRequest(action=R.DowngradeRequest.ENABLE, version="3.6"),
                   service="etcdserverpb.Maintenance", resp="DowngradeResponse")
        check(r[0] == "ok", "downgrade enabled: %r" % (r,))
        c.close()
    want = b'{"etcdserver":"3.7.3","etcdcluster":"3.6.0","storage":"3.6.0"}'
    check(wait_for(lambda: one(e.port, "GET", "/version")[2] == want, 60), "etcd: %r" % (one(e.port, "GET", "/version"),))
    a, b = one(e.port, "GET", "/version"), one(k.port, "GET", "/version")
    check(a == b and b[2] == want, "/version while downgrading: etcd %s / kvd %s" % (a, b))
    e.stop()
    k.stop()


@test
def keep_alive_and_pipelining():
    """Keep-alive, and requests answered one at a time, in order [§35.2]:
    four on one connection, three pipelined in one write answered in
    order; a body nobody takes is read and dropped, the next request
    served."""
    k = Kvd()
    conn = http.client.HTTPConnection("127.0.0.1", k.port, timeout=10)
    bodies = []
    for p in ("/health", "/version", "/nope", "/health"):
        conn.request("GET", p)
        r = conn.getresponse()
        bodies.append((r.status, r.read()))
    check([s for s, _ in bodies] == [200, 200, 404, 200], "four requests on one connection: %s" % bodies)
    # Date: RFC 7231's IMF-fixdate, in UTC, now
    conn.request("GET", "/health")
    r = conn.getresponse()
    r.read()
    date = r.getheader("Date") or ""
    m = re.match(r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} "
                 r"\d\d:\d\d:\d\d GMT$", date)
    when = email.utils.parsedate_to_datetime(date) if m else None
    check(when is not None and when.strftime("%a, %d %b %Y %H:%M:%S GMT") == date and
          abs((when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()) < 3600, "Date: %r" % date)
    conn.close()
    data = raw(k.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /version HTTP/1.1\r\nHost: x\r\n\r\n"
                       b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    a = answers(data)
    h = b'{"health":"true","reason":""}'
    check([x[2] for x in a] == [h, b'{"etcdserver":"3.7.3","etcdcluster":"3.7.0","storage":"3.7.0"}', h],
          "three pipelined requests answered in order: %s" % a)
    # a body nobody takes is read and dropped; the next request is still served
    data = raw(k.port, b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nHELLOGET /version HTTP/1.1\r\n"
                       b"Host: x\r\nConnection: close\r\n\r\n")
    check([x[0] for x in answers(data)] == ["HTTP/1.1 200 OK"] * 2, "a body dropped: %s" % data[:200])
    k.stop()


@test
def limits_and_garbage():
    """On kvd alone: a 9 KiB head is 431, a header without a colon 400, a
    transfer coding other than chunked 501; a head that never ends is
    closed after KVD_PREFACE_TIMEOUT_MS without an answer [§35.4]; kvd
    serves on, gRPC on the same port."""
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
def framing_as_etcd37():
    """Request framing a proxy in front could read another way (request
    smuggling): each refused as etcd 3.7.3 refuses it -- a chunk-size line
    ending in a bare LF, Transfer-Encoding twice or "chunked, chunked", a
    chunk size of more than 16 digits (zeros too), no Host or two on
    HTTP/1.1 -- and a chunked body on HTTP/1.0 (etcd reads none and would
    take the chunks for a request) never reaches the store: one framing or
    a refusal [§33.2]."""
    body = b'{"key":"YzIxMQ==","value":"eA=="}'
    chunk = lambda sep=b"\r\n", size=None: (size or (b"%x" % len(body))) + sep + body + b"\r\n0\r\n\r\n"
    put = b"POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    cases = [
        ("bare LF after the chunk size", put + b"Transfer-Encoding: chunked\r\n\r\n" + chunk(b"\n"), 400),
        ("Transfer-Encoding twice", put + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" +
         chunk(), 501),
        ("chunked, chunked", put + b"Transfer-Encoding: chunked, chunked\r\n\r\n" + chunk(), 501),
        ("100 leading zeros", put + b"Transfer-Encoding: chunked\r\n\r\n" + chunk(size=b"0" * 100 + b"%x" % len(body)),
         400),
        ("17 digits", put + b"Transfer-Encoding: chunked\r\n\r\n" + chunk(size=b"%017x" % len(body)), 400),
        ("16 digits", put + b"Transfer-Encoding: chunked\r\n\r\n" + chunk(size=b"%016x" % len(body)), 200),
        ("no Host", b"POST /v3/kv/put HTTP/1.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
         400),
        ("two Hosts", put + b"Host: y\r\nContent-Length: %d\r\n\r\n" % len(body) + body, 400),
        ("no Host on HTTP/1.0", b"POST /v3/kv/put HTTP/1.0\r\nContent-Length: %d\r\n\r\n" % len(body) + body, 200),
        ("Content-Length and chunked", put + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(), 200),
    ]
    e, k = Etcd(), Kvd()
    for what, req, want in cases:
        got = []
        for srv in (e, k):
            c = Client(srv.endpoint())
            c.call("DeleteRange", R.DeleteRangeRequest(key=b"c211"))
            a = answers(raw(srv.port, req))
            st = int(a[0][0].split()[1]) if a else None
            stored = c.call("Range", R.RangeRequest(key=b"c211"))[1].count
            c.close()
            got.append((st, stored))
        check(got[0] == got[1] == [(want, int(want == 200))][0], "%s: etcd %s, kvd %s (want %d)" % (what, got[0], got[1], want))
    # HTTP/1.0 with chunks: etcd ignores the coding (and the chunks with it); kvd refuses it outright
    req = b"POST /v3/kv/put HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk()
    got = []
    for srv in (e, k):
        Client(srv.endpoint()).call("DeleteRange", R.DeleteRangeRequest(key=b"c211"))
        a = answers(raw(srv.port, req))
        got.append((int(a[0][0].split()[1]) if a else None, Client(srv.endpoint()).call(
            "Range", R.RangeRequest(key=b"c211"))[1].count))
    check(got[0][0] >= 400 and got[1] == (400, 0) and got[0][1] == 0,
          "chunked on HTTP/1.0: nothing stored (etcd %s, kvd %s)" % tuple(got))
    e.stop()
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
    check(r.stdout == '{"health":"true","reason":""} 200 1.1', "curl --http1.1 over TLS: %r %r" % (r.stdout, r.stderr))
    k.stop()
    subprocess.run(["rm", "-rf", d])


def tls_pair_dir():
    d = tempfile.mkdtemp(prefix="kvd-http2-tls-")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", d + "/k.pem", "-out", d + "/c.pem", "-days", "3", "-subj", "/CN=t",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return d


def curl(url, ca, method="GET", data=None, extra=()):
    """curl as a user runs it over TLS (ALPN offers h2 first): exit code,
    status line, headers but Date, body -- /livez's checks sorted, a
    gateway answer's header (ids differ) blanked."""
    cmd = ["curl", "-s", "-i", "--cacert", ca, "-X", method] + list(extra) + [url]
    if data is not None:
        cmd += ["--data-binary", data]
    r = subprocess.run(cmd, capture_output=True, timeout=60)
    head, _, body = r.stdout.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    hd = {}
    for line in lines[1:]:
        n, _, v = line.partition(":")
        hd[n.strip().lower()] = v.strip()
    hd.pop("date", None)
    body = re.sub(rb'"header":\{[^}]*\}', b'"header":{}', body)
    bl = body.split(b"\n")
    checks = sorted(x for x in bl if x[:3] in (b"[+]", b"[-]"))
    if checks:
        body = b"\n".join(checks + [x for x in bl if x[:3] not in (b"[+]", b"[-]")])
    return r.returncode, lines[0].strip(), hd, body


H2_CASES = [("GET", "/health", None), ("GET", "/health?exclude=NOSPACE", None), ("GET", "/livez", None),
            ("GET", "/readyz?verbose", None), ("GET", "/version", None), ("GET", "/nope", None),
            ("POST", "/health", None), ("GET", "/v3", None), ("OPTIONS", "/v3/kv/range", None),
            ("POST", "/v3/kv/put", '{"key":"aDI=","value":"dg=="}'), ("POST", "/v3/kv/range", '{"key":"aDI="}'),
            ("POST", "/v3/kv/range", '{"key":'), ("POST", "/v3/kv/range", '{"nokey":1}'),
            ("POST", "/v3/nope", "{}"), ("GET", "/v3/kv/range", None),
            ("POST", "/v3/kv/deleterange", '{"key":"aDI="}'), ("POST", "/v3/maintenance/alarm", "{}"),
            ("POST", "/v3/kv/put", '{"key":"aDI=","lease":"12345"}')]


@test
def http2_clients_like_etcd():
    """curl over TLS negotiates h2 (ALPN) and gets what etcd 3.7.3 answers:
    /health, /livez, /readyz, /version, the gateway (unary and a watch
    stream), errors -- status, headers but Date, body; a TLS metrics
    listener serves /metrics and /health to h2 clients too."""
    from kvdtest import free_port
    d = tls_pair_dir()
    ca = d + "/c.pem"
    tls = ["--cert-file", d + "/c.pem", "--key-file", d + "/k.pem"]
    srv = []
    for kind in ("etcd", "kvd"):
        p, mp = free_port(), free_port()
        # TLS alone: etcd with a plain listener beside it may send its
        # gateway's calls through either (Go's map order)
        urls = ["--listen-client-urls", "https://127.0.0.1:%d" % p, "--advertise-client-urls", "https://127.0.0.1:%d" % p,
                "--listen-metrics-urls", "https://127.0.0.1:%d" % mp] + tls
        if kind == "etcd":
            s = Etcd(args=urls, port=p, ready=lambda: curl("https://127.0.0.1:%d/health" % p, ca)[1] == "HTTP/2 200")
        else:
            s = Kvd(args=urls, port=p)
        s.tls_port, s.metrics_port = p, mp
        srv.append(s)
    e, k = srv
    for m, path, body in H2_CASES:
        a, b = [curl("https://127.0.0.1:%d%s" % (s.tls_port, path), ca, m, body) for s in srv]
        check(a == b and a[1].startswith("HTTP/2 "), "%s %s over h2: etcd %r / kvd %r" % (m, path, a, b))
    for m, path, body in H2_CASES[9:]:  # the gateway over TLS on HTTP/1.1: the same metadata as on h2
        a, b = [curl("https://127.0.0.1:%d%s" % (s.tls_port, path), ca, m, body, ["--http1.1"]) for s in srv]
        check(a == b and a[1].startswith("HTTP/1.1 "), "%s %s over TLS, HTTP/1.1: etcd %r / kvd %r" % (m, path, a, b))
    # http:// to the https:// port: closed without a byte on both; kvd's log
    # says so in plain words
    got = [subprocess.run(["curl", "-s", "-i", "http://127.0.0.1:%d/health" % s.tls_port], capture_output=True,
                          timeout=60) for s in srv]
    check([(r.returncode, r.stdout) for r in got] == [(52, b"")] * 2, "http:// on a TLS port: %r" % got)
    check(wait_for(lambda: "a plain HTTP request on a TLS port (the client said http://, not https://)" in
                   k.logtext()), "kvd's log says what happened")
    a = curl("https://127.0.0.1:%d/health" % k.tls_port, ca)
    check(a[0] == 0 and a[1] == "HTTP/2 200" and a[3] == b'{"health":"true","reason":""}',
          "curl https://.../health: 200 over HTTP/2 with the JSON: %r" % (a,))
    # Prometheus and curl on the metrics listener over TLS
    for s in srv:
        for path, want in (("/metrics", "HTTP/2 200"), ("/health", "HTTP/2 200"), ("/version", "HTTP/2 404"),
                           ("/v3/kv/range", "HTTP/2 404")):
            r = curl("https://127.0.0.1:%d%s" % (s.metrics_port, path), ca)
            check(r[0] == 0 and r[1] == want, "metrics listener over TLS (%s), GET %s: %r" % (type(s).__name__, path, r[:3]))
        r = curl("https://127.0.0.1:%d/metrics" % s.tls_port, ca)
        check(r[0] == 0 and r[1] == "HTTP/2 200" and b"\netcd_server_has_leader 1\n" in r[3] and
              r[2].get("content-type", "").startswith("text/plain; version=0.0.4"),
              "/metrics on the client port over h2 (%s): %r" % (type(s).__name__, r[:3]))
    # a watch stream over h2: the created line, then an event as it happens
    lines = []
    for s in srv:
        w = subprocess.Popen(["curl", "-s", "-N", "--cacert", ca, "-X", "POST", "--data-binary",
                              '{"create_request":{"key":"dw=="}}', "https://127.0.0.1:%d/v3/watch" % s.tls_port],
                             stdout=subprocess.PIPE)
        got = [w.stdout.readline()]
        curl("https://127.0.0.1:%d/v3/kv/put" % s.tls_port, ca, "POST", '{"key":"dw==","value":"MQ=="}')
        got.append(w.stdout.readline())
        w.kill()
        w.wait()
        lines.append([re.sub(rb'"header":\{[^}]*\}', b"{}", x) for x in got])
    check(lines[0] == lines[1] and b'"created":true' in lines[1][0] and b'"value":"MQ=="' in lines[1][1],
          "a watch over h2: etcd %r / kvd %r" % tuple(lines))
    for s in srv:
        s.stop()
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
    """/metrics read by Prometheus' parser, its values checked against what
    was done; the metrics listener serves /metrics and the health
    endpoints only -- no gateway, no gRPC, and every method on every path
    answered as etcd 3.7.3's metrics listener answers it [§35.1]; etcd's
    names and types."""
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
    # what etcd's Grafana dashboard and alerts (its mixin) query
    check(v.get(("etcd_disk_backend_commit_duration_seconds_count", ())) == n, "backend commits: the log's syncs")
    check(v.get(("etcd_network_client_grpc_received_bytes_total", ())) >= 6 * 5 and
          v.get(("etcd_network_client_grpc_sent_bytes_total", ())) > 6 * 20, "gRPC bytes in and out: %r %r" %
          (v.get(("etcd_network_client_grpc_received_bytes_total", ())),
           v.get(("etcd_network_client_grpc_sent_bytes_total", ()))))
    check(v.get(("etcd_server_proposals_failed_total", ())) == 0, "no failed proposals")
    # every family etcd's mixin queries (etcd-io/etcd contrib/mixin: dashboards/targets.libsonnet and
    # alerts/alerts.libsonnet, read for this list) but its peer panels, which a one-member kvd has not
    mixin = ["etcd_server_has_leader", "etcd_server_leader_changes_seen_total", "grpc_server_started_total",
             "grpc_server_handled_total", "grpc_server_handling_seconds", "etcd_server_proposals_failed_total",
             "etcd_disk_wal_fsync_duration_seconds", "etcd_disk_backend_commit_duration_seconds",
             "etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes",
             "etcd_server_quota_backend_bytes", "process_resident_memory_bytes",
             "etcd_network_client_grpc_received_bytes_total", "etcd_network_client_grpc_sent_bytes_total"]
    check(all(n in fams or n.replace("_total", "") in fams for n in mixin),
          "the mixin's families: missing %r" % [n for n in mixin if n not in fams and n.replace("_total", "") not in fams])
    hl = L("Put", None) + (("le", "+Inf"),)
    check(v.get(("grpc_server_handling_seconds_count", L("Put", None))) == 6 and
          v.get(("grpc_server_handling_seconds_bucket", tuple(sorted(hl)))) == 6,
          "grpc_server_handling_seconds: the 6 Puts: %r" % v.get(("grpc_server_handling_seconds_count", L("Put", None))))
    with open("/proc/%d/status" % k.p.pid) as f:
        rss = [int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:")][0]
    got = v.get(("process_resident_memory_bytes", ()))
    check(got and rss / 2 < got < rss * 2, "process_resident_memory_bytes %r near VmRSS %d" % (got, rss))
    # the metrics listener: /metrics and the health endpoints, nothing else; no gRPC
    fams2, v2 = scrape(mport)
    check(v2.get(("grpc_server_handled_total", L("Put", "OK"))) == 6, "the metrics listener: same counters")
    check(one(mport, "GET", "/health")[2] == b'{"health":"true","reason":""}', "the metrics listener: /health")
    check(one(mport, "GET", "/readyz?verbose")[2].count(b"ok\n") == 5, "the metrics listener: /readyz")
    check(one(mport, "POST", "/v3/kv/range")[0].startswith("HTTP/1.1 404"), "the metrics listener: no gateway")
    cm = Client("127.0.0.1:%d" % mport)
    check(cm.call("Range", R.RangeRequest(key=b"m0"), timeout=5)[0] == "err", "the metrics listener: no gRPC")
    cm.close()
    w.close()
    c.close()
    # etcd's names and types for the etcd_*, grpc_* and process_* families kvd
    # exports; the ones etcd 3.7 removed are gone from both
    emport = free_port()
    e = Etcd(["--listen-metrics-urls", "http://127.0.0.1:%d" % emport, "--metrics", "extensive"])
    for p in ("/health", "/livez", "/readyz", "/readyz?verbose", "/livez/serializable_read", "/readyz/non_learner",
              "/version", "/nope", "/v3/kv/range", "/metricsx"):
        for m in ("GET", "POST", "OPTIONS"):
            a, b = one(emport, m, p), one(mport, m, p)
            check(a == b, "metrics listener, %s %s: etcd %s / kvd %s" % (m, p, a, b))
    ce = Client(e.endpoint())
    ce.call("Put", R.PutRequest(key=b"m", value=b"v"))
    ce.call("Range", R.RangeRequest(key=b""))
    ef, _ = scrape(e.port)
    ce.close()
    gone = ["etcd_debugging_mvcc_%s_total" % x for x in ("put", "delete", "range", "txn")] + [
        "etcd_debugging_mvcc_db_total_size_in_bytes", "etcd_http_received_total", "etcd_http_failed_total",
        "etcd_http_successful_duration_seconds"]
    check(not [n for n in gone if n in ef or n in fams], "3.7's removed names: etcd %r, kvd %r" %
          ([n for n in gone if n in ef], [n for n in gone if n in fams]))
    body = raw(k.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    rss = [x for x in body.split(b"\n") if x.startswith(b"process_resident_memory_bytes")]
    check(rss and re.match(rb"process_resident_memory_bytes [0-9.e+]+$", rss[0]) and float(rss[0].split()[1]) > 0,
          "etcdctl check datascale's line, unlabelled: %r" % rss[:1])
    mine = {n: f.type for n, f in fams.items() if not n.startswith("kvd_")}
    theirs = {n: ef[n].type for n in mine if n in ef}
    check(mine == theirs, "names and types as etcd's: kvd %r\n  etcd %r" %
          (sorted(set(mine.items()) - set(theirs.items())), sorted(set(theirs.items()) - set(mine.items()))))
    e.stop()
    k.stop()


@test
def metrics_name_no_key_or_user():
    """/metrics (the client port and the metrics listener) says how much and
    how often, never which: after keys, users, roles, a lease, watches, a
    failed login and failed calls with distinctive names, none of those
    names (nor a password, nor a value) appears in either scrape."""
    from kvdtest import free_port, WatchStream
    mport = free_port()
    k = Kvd(args=["--listen-metrics-urls", "http://127.0.0.1:%d" % mport, "--bcrypt-cost", "4"])
    c = Client(k.endpoint())
    secret = ["sekrit-key-7f3a", "sekrit-value-c19e", "sekrit-user-42bd", "sekrit-pass-0d77", "sekrit-role-9e21"]
    c.call("Put", R.PutRequest(key=secret[0].encode(), value=secret[1].encode()))
    w = WatchStream(k.endpoint())
    w.create(key=secret[0].encode(), prev_kv=True)
    w.wait(1)
    auth = lambda m, req, resp: c.call(m, req, service="etcdserverpb.Auth", resp=resp)
    auth("UserAdd", R.AuthUserAddRequest(name="root", password="rootpw"), "AuthUserAddResponse")
    auth("UserGrantRole", R.AuthUserGrantRoleRequest(user="root", role="root"), "AuthUserGrantRoleResponse")
    auth("UserAdd", R.AuthUserAddRequest(name=secret[2], password=secret[3]), "AuthUserAddResponse")
    auth("RoleAdd", R.AuthRoleAddRequest(name=secret[4]), "AuthRoleAddResponse")
    auth("AuthEnable", R.AuthEnableRequest(), "AuthEnableResponse")
    auth("Authenticate", R.AuthenticateRequest(name=secret[2], password="wrong"), "AuthenticateResponse")
    c.call("Range", R.RangeRequest(key=secret[0].encode()))  # refused: no token
    w.close()
    for port in (k.port, mport):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
        conn.close()
        check(len(body) > 1000 and not [x for x in secret if x in body],
              "port %d: no name in /metrics (%s)" % (port, [x for x in secret if x in body]))
    c.close()
    k.stop()


@test
def left_out():
    """Built with KVD_NO_HTTP (make HTTP=0; make lean, KVD_NOHTTP=1): every
    HTTP/1.1 request -- /health, the gateway, over TLS too -- gets a 404
    that says why, and the connection closes; --listen-metrics-urls is
    refused; gRPC serves on the same port.  In the full build the same
    requests are served: the control that shows these checks can fail."""
    from kvdtest import free_port
    gone = os.environ.get("KVD_NOHTTP") == "1"
    why = b"kvd: built without HTTP/1.1 (KVD_NO_HTTP)\n"
    d = tempfile.mkdtemp(prefix="kvd-nohttp-")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", d + "/k.pem", "-out", d + "/c.pem", "-days", "3", "-subj", "/CN=t",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    port, tport = free_port(), free_port()
    k = Kvd(port=port, args=["--listen-client-urls", "http://127.0.0.1:%d,https://127.0.0.1:%d" % (port, tport),
                             "--cert-file", d + "/c.pem", "--key-file", d + "/k.pem"])
    health = answers(raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /version HTTP/1.1\r\nHost: x\r\n\r\n",
                         until_close=gone, timeout=10))
    gw = subprocess.run(["curl", "-s", "-w", " %{http_code}", "-X", "POST", "http://127.0.0.1:%d/v3/kv/put" % port,
                         "-d", '{"key":"aw==","value":"dg=="}'], capture_output=True, timeout=30).stdout
    tls = subprocess.run(["curl", "-s", "--http1.1", "--cacert", d + "/c.pem", "-w", " %{http_code}",
                          "https://127.0.0.1:%d/health" % tport], capture_output=True, timeout=30).stdout
    c = Client(k.endpoint())
    put = c.call("Put", R.PutRequest(key=b"g", value=b"1"))
    got = c.call("Range", R.RangeRequest(key=b"k"))
    c.close()
    k.stop()
    mport = free_port()
    m = Kvd(args=["--listen-metrics-urls", "http://127.0.0.1:%d" % mport], wait=False)
    wait_for(lambda: not m.alive() or "serving client requests" in m.logtext(), 60, 0.01)
    served = m.alive() and b"etcd_server_has_leader" in raw(mport, b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
                                                                     b"Connection: close\r\n\r\n")
    rc = m.stop()
    subprocess.run(["rm", "-rf", d])
    print("  %s: /health %r; gateway put %r; over TLS %r; gRPC %s; --listen-metrics-urls %s" %
          ("left out" if gone else "built in", [h[0] for h in health], gw[-3:], tls[-3:], put[0],
           "served" if served else "exit %r: %s" % (rc, m.logtext().strip().splitlines()[-1:])))
    check(put[0] == "ok", "gRPC: %r" % (put,))
    if gone:
        check(len(health) == 1 and health[0][0] == "HTTP/1.1 404 Not Found" and health[0][2] == why and
              health[0][1].get("connection") == "close", "/health, then closed: %r" % (health,))
        check(gw == why + b" 404" and tls == why + b" 404", "gateway %r, TLS %r" % (gw, tls))
        check(not served and rc != 0 and "--listen-metrics-urls: this kvd is built without HTTP/1.1" in m.logtext(),
              "--listen-metrics-urls: %r" % m.logtext()[-300:])
        check(got[0] == "ok" and not got[1].kvs, "the gateway's put never happened: %r" % (got,))
    else:
        check([h[0] for h in health] == ["HTTP/1.1 200 OK"] * 2 and health[0][2].startswith(b'{"health":"true"'),
              "/health and /version: %r" % (health,))
        check(gw.endswith(b" 200") and tls.endswith(b" 200") and served, "gateway %r, TLS %r" % (gw, tls))
        check(got[0] == "ok" and [x.value for x in got[1].kvs] == [b"v"], "the gateway's put: %r" % (got,))


if __name__ == "__main__":
    main_guard(sys.argv)
