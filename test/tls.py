#!/usr/bin/python3
"""TLS and mutual TLS on the client port, kvd beside Debian's etcd with the
same certificates (made here with Debian's openssl): etcdctl 3.4, grpcio and
python3-etcd3 over TLS; the same operations succeed and the same failures
fail on both (wrong CA, wrong host name, no client certificate, a client
certificate from another CA, an expired one, a revoked one, a host name
not allowed); plain and TLS listeners side by side; large messages through
HTTP/2 flow control over TLS; SIGHUP re-reads the certificates (a bad set
keeps the old one); hostile input on the TLS port (garbage, a handshake
that stops half way, a slow one, a ClientHello flood) while an honest client
is served and memory stays bounded.
Last line: "N passed, N failed".
"""
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvdtest import (ROOT, Kvd, check, free_port, main_guard, pb, spawn, test, wait_for)

R = pb()["rpc"]
D = tempfile.mkdtemp(prefix="kvd-tls-")


def sh(*args, **kw):
    r = subprocess.run(list(args), capture_output=True, text=True, cwd=D, **kw)
    if r.returncode:
        raise RuntimeError("%s: %s" % (" ".join(args), r.stderr[-500:]))
    return r.stdout


def make_ca(name):
    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
       "-keyout", name + ".key", "-out", name + ".pem", "-days", "30", "-subj", "/CN=" + name)
    os.makedirs(os.path.join(D, name + ".db"), exist_ok=True)
    open(os.path.join(D, name + ".db", "index.txt"), "w").close()
    open(os.path.join(D, name + ".db", "serial"), "w").write("1000\n")
    open(os.path.join(D, name + ".db", "crlnumber"), "w").write("1000\n")
    open(os.path.join(D, name + ".cnf"), "w").write(
        "[ca]\ndefault_ca = d\n[d]\ndir = %s\ndatabase = $dir/index.txt\nserial = $dir/serial\n"
        "crlnumber = $dir/crlnumber\nnew_certs_dir = $dir\ncertificate = %s\nprivate_key = %s\n"
        "default_md = sha256\ndefault_crl_days = 30\npolicy = p\ncopy_extensions = copy\nunique_subject = no\n"
        "[p]\ncommonName = supplied\n" % (os.path.join(D, name + ".db"), os.path.join(D, name + ".pem"),
                                           os.path.join(D, name + ".key")))


def make_cert(ca, name, cn, san=None, start=None, end=None, usage="serverAuth,clientAuth"):
    """A key and a certificate signed by ca (openssl ca: dates may lie in the past)."""
    ext = os.path.join(D, name + ".ext")
    open(ext, "w").write("[x]\nextendedKeyUsage = %s\nbasicConstraints = CA:FALSE\n%s" %
                         (usage, "subjectAltName = %s\n" % san if san else ""))
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
       name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn)
    args = ["openssl", "ca", "-batch", "-config", ca + ".cnf", "-in", name + ".csr", "-out", name + ".pem",
            "-extfile", ext, "-extensions", "x", "-notext"]
    args += ["-startdate", start, "-enddate", end] if start else ["-days", "30"]
    sh(*args)


def certs():
    make_ca("ca")
    make_ca("ca2")
    make_cert("ca", "server", "kvd-server", "IP:127.0.0.1,DNS:localhost")
    make_cert("ca", "server-b", "kvd-server-b", "IP:127.0.0.1,DNS:localhost")
    make_cert("ca", "wronghost", "elsewhere", "DNS:elsewhere.example")
    make_cert("ca", "alice", "alice", usage="clientAuth")
    make_cert("ca", "bob", "bob", "DNS:bob.example", usage="clientAuth")
    make_cert("ca2", "mallory", "mallory", usage="clientAuth")
    make_cert("ca", "old", "old", start="20200101000000Z", end="20200201000000Z", usage="clientAuth")
    make_cert("ca", "revoked", "revoked", usage="clientAuth")
    sh("openssl", "ca", "-config", "ca.cnf", "-revoke", "revoked.pem")
    sh("openssl", "ca", "-config", "ca.cnf", "-gencrl", "-out", "crl.pem")


def p(name):
    return os.path.join(D, name)


class EtcdTLS:
    """Debian's etcd serving https:// with the given flags."""

    def __init__(self, args):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="etcd-tls-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        url = "https://127.0.0.1:%d" % self.port
        self.p = spawn(["etcd", "--name", "ref", "--data-dir", self.dir, "--listen-client-urls", url,
                        "--advertise-client-urls", url, "--listen-peer-urls", "http://127.0.0.1:%d" % free_port(),
                        "--log-level", "error"] + list(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # up when it answers anyone it accepts (bob passes every configuration here)
        wait_for(lambda: ctl(self, None, "bob", "--insecure-skip-tls-verify", "endpoint", "health",
                             fail=True)[0] == 0, 60, 0.1)

    def stop(self):
        self.p.terminate()
        self.p.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)


def kvd_tls(args, plain=False):
    port = free_port()
    urls = "https://127.0.0.1:%d" % port
    plain_url = "http://127.0.0.1:%d" % free_port()
    if plain:
        urls += "," + plain_url
    k = Kvd(args=["--listen-client-urls", urls] + list(args))
    k.tport = port
    k.plain_url = plain_url
    return k


def ctl(srv, ca, client, *args, host="127.0.0.1", fail=False):
    """etcdctl over TLS to srv (a kvd or an etcd): (rc, stdout, stderr).
    fail: a refusal is expected (etcdctl retries a failed handshake until
    its dial timeout; the servers' own logs say why)."""
    port = srv.tport if hasattr(srv, "tport") else srv.port
    a = ["etcdctl", "--endpoints", "https://%s:%d" % (host, port), "--dial-timeout", "1s" if fail else "5s",
         "--command-timeout", "2s" if fail else "10s"]
    if ca:
        a += ["--cacert", p(ca + ".pem")]
    if client:
        a += ["--cert", p(client + ".pem"), "--key", p(client + ".key")]
    r = subprocess.run(a + list(args), capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, ETCDCTL_API="3"))
    return r.returncode, r.stdout, r.stderr


def both(e, k, ca, client, *args, fail=False):
    return ctl(e, ca, client, *args, fail=fail), ctl(k, ca, client, *args, fail=fail)


SERVER = ["--cert-file", None, "--key-file", None]


def server_args(cert="server", extra=()):
    return ["--cert-file", p(cert + ".pem"), "--key-file", p(cert + ".key")] + list(extra)


# ------------------------------------------------------------------ tests
@test
def server_tls_like_etcd():
    e = EtcdTLS(server_args())
    k = kvd_tls(server_args(), plain=True)
    for args in (("put", "a", "1"), ("get", "a"), ("del", "a"), ("get", "a", "-w", "json")):
        x, y = both(e, k, "ca", None, *args)
        if args[-1] == "json":
            strip = lambda s: {kk: v for kk, v in json.loads(s).get("header", {}).items()
                               if kk not in ("cluster_id", "member_id", "raft_term")}
            check(x[0] == y[0] == 0 and strip(x[1]) == strip(y[1]), "etcdctl %s: %s / %s" % (args, x, y))
        else:
            check(x[0] == y[0] == 0 and x[1] == y[1], "etcdctl %s over TLS: %s / %s" % (args, x, y))
    x, y = both(e, k, "ca2", None, "get", "a", fail=True)
    check(x[0] != 0 and y[0] != 0, "a client trusting another CA fails on both: %s" % y[2][-200:])
    x, y = both(e, k, None, None, "get", "a", fail=True)
    check(x[0] != 0 and y[0] != 0, "a client with the system CAs fails on both")
    # plain beside TLS, as etcd allows mixed listeners
    r = subprocess.run(["etcdctl", "--endpoints", k.plain_url, "put", "p", "q"], capture_output=True, text=True,
                       env=dict(os.environ, ETCDCTL_API="3"))
    got = ctl(k, "ca", None, "get", "p", "--print-value-only")
    check(r.returncode == 0 and got[1].strip() == "q",
          "the plain listener and the TLS one serve the same store: %s %s" % (r.stderr[-200:], got))
    e.stop()
    # a certificate that does not name the address: refused by the client on both
    e = EtcdTLS(server_args("wronghost"))
    k2 = kvd_tls(server_args("wronghost"))
    x, y = both(e, k2, "ca", None, "get", "a", fail=True)
    check(x[0] != 0 and y[0] != 0, "wrong host name fails on both: %s" % y[2][-200:])
    e.stop()
    k2.stop()
    k.stop()


@test
def mutual_tls_like_etcd():
    flags = ["--client-cert-auth", "--trusted-ca-file", p("ca.pem"), "--client-crl-file", p("crl.pem")]
    e = EtcdTLS(server_args(extra=flags))
    k = kvd_tls(server_args(extra=flags))
    x, y = both(e, k, "ca", "alice", "put", "m", "1")
    check(x[0] == 0 and y[0] == 0, "alice's certificate: put works on both: %s" % (y,))
    for client, what in ((None, "no client certificate"), ("mallory", "a certificate from another CA"),
                         ("old", "an expired certificate"), ("revoked", "a revoked certificate")):
        x, y = both(e, k, "ca", client, "get", "m", fail=True)
        check(x[0] != 0 and y[0] != 0, "%s fails on both (etcd %d, kvd %d: %s)" % (what, x[0], y[0], y[2][-160:]))
    check(wait_for(lambda: "TLS handshake failed" in k.logtext(), 10), "kvd logs why a handshake failed")
    e.stop()
    k.stop()
    # --client-cert-allowed-hostname: bob's SAN names bob.example, alice's does not
    flags = ["--client-cert-auth", "--trusted-ca-file", p("ca.pem"), "--client-cert-allowed-hostname", "bob.example"]
    e = EtcdTLS(server_args(extra=flags))
    k = kvd_tls(server_args(extra=flags))
    x, y = both(e, k, "ca", "bob", "put", "h", "1")
    check(x[0] == 0 and y[0] == 0, "bob is allowed on both: %s" % (y,))
    x, y = both(e, k, "ca", "alice", "get", "h", fail=True)
    check(x[0] != 0 and y[0] != 0, "alice is not, on both: %s" % (y[2][-160:],))
    e.stop()
    k.stop()


@test
def auto_tls_like_etcd():
    """--auto-tls: a self-signed certificate; clients that skip verification
    get in, clients that verify do not, on both."""
    e = EtcdTLS(["--auto-tls"])
    k = kvd_tls(["--auto-tls"])
    x, y = both(e, k, None, None, "--insecure-skip-tls-verify", "--insecure-transport=false", "put", "at", "1")
    check(x[0] == 0 and y[0] == 0 and x[1] == y[1], "skipping verification: put works on both: %s" % (y,))
    x, y = both(e, k, "ca", None, "get", "at", fail=True)
    check(x[0] != 0 and y[0] != 0, "verifying against a CA: refused by both")
    cn = peer_cert_cn_noverify(k.tport)
    check(cn == "kvd", "kvd's self-signed certificate: %s" % cn)
    e.stop()
    k.stop()


def peer_cert_cn_noverify(port):
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        with ctx.wrap_socket(s) as t:
            der = t.getpeercert(binary_form=True)
    r = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-subject", "-nameopt", "multiline"],
                       input=der, capture_output=True)
    for line in r.stdout.decode().splitlines():
        if "commonName" in line:
            return line.split("=", 1)[1].strip()
    return None


def grpc_channel(port, client=None):
    import grpc
    creds = grpc.ssl_channel_credentials(open(p("ca.pem"), "rb").read(),
                                         open(p(client + ".key"), "rb").read() if client else None,
                                         open(p(client + ".pem"), "rb").read() if client else None)
    return grpc.secure_channel("127.0.0.1:%d" % port, creds, options=[("grpc.max_receive_message_length", -1),
                                                                     ("grpc.max_send_message_length", -1)])


def call(ch, method, req, resp, service="etcdserverpb.KV", timeout=20):
    f = ch.unary_unary("/%s/%s" % (service, method), request_serializer=lambda m: m.SerializeToString(),
                       response_deserializer=getattr(R, resp).FromString)
    return f(req, timeout=timeout)


@test
def grpcio_and_etcd3_over_tls():
    flags = ["--client-cert-auth", "--trusted-ca-file", p("ca.pem")]
    k = kvd_tls(server_args(extra=flags))
    ch = grpc_channel(k.tport, "alice")
    big = os.urandom(1500 * 1024)
    call(ch, "Put", R.PutRequest(key=b"big", value=big), "PutResponse")
    got = call(ch, "Range", R.RangeRequest(key=b"big"), "RangeResponse")
    check(got.kvs[0].value == big, "1.5 MB through HTTP/2 flow control over TLS")
    # many values at once: a 6 MB answer over TLS records
    for i in range(4):
        call(ch, "Put", R.PutRequest(key=b"v/%d" % i, value=big), "PutResponse")
    got = call(ch, "Range", R.RangeRequest(key=b"v/", range_end=b"v0"), "RangeResponse")
    check(len(got.kvs) == 4 and all(kv.value == big for kv in got.kvs), "a 6 MB answer over TLS")
    ch.close()
    script = ("import etcd3, sys\n"
              "c = etcd3.client(host='127.0.0.1', port=%d, ca_cert=%r, cert_key=%r, cert_cert=%r)\n"
              "c.put('e3', 'yes')\n"
              "print('CHECK %%s python3-etcd3 over mTLS' %% ('ok' if c.get('e3')[0] == b'yes' else 'FAIL'))\n"
              % (k.tport, p("ca.pem"), p("alice.key"), p("alice.pem")))
    r = subprocess.run(["/usr/bin/python3", "-c", script], capture_output=True, text=True, timeout=60)
    check("CHECK ok" in r.stdout, "python3-etcd3 over mTLS: %s %s" % (r.stdout, r.stderr[-300:]))
    k.stop()


def peer_cert_cn(port):
    ctx = ssl.create_default_context(cafile=p("ca.pem"))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
            return dict(x[0] for x in t.getpeercert()["subject"])["commonName"], t.selected_alpn_protocol()


@test
def sighup_rereads_certificates():
    d = tempfile.mkdtemp(prefix="kvd-tls-reload-", dir=D)
    for ext in ("pem", "key"):
        shutil.copy(p("server." + ext), os.path.join(d, "cur." + ext))
    k = kvd_tls(["--cert-file", os.path.join(d, "cur.pem"), "--key-file", os.path.join(d, "cur.key")])
    check(peer_cert_cn(k.tport) == ("kvd-server", "h2"), "serves its certificate, ALPN h2")
    ch = grpc_channel(k.tport)
    call(ch, "Put", R.PutRequest(key=b"r", value=b"1"), "PutResponse")
    for ext in ("pem", "key"):
        shutil.copy(p("server-b." + ext), os.path.join(d, "cur." + ext))
    k.p.send_signal(signal.SIGHUP)
    check(wait_for(lambda: "TLS reload: certificates read again" in k.logtext(), 10), "reloaded")
    check(peer_cert_cn(k.tport)[0] == "kvd-server-b", "new connections get the new certificate")
    check(call(ch, "Range", R.RangeRequest(key=b"r"), "RangeResponse").kvs[0].value == b"1",
          "an open connection goes on")
    open(os.path.join(d, "cur.pem"), "w").write("not a certificate\n")
    k.p.send_signal(signal.SIGHUP)
    check(wait_for(lambda: "keeping the certificates in use" in k.logtext(), 10), "a bad file is refused, said why")
    check(peer_cert_cn(k.tport)[0] == "kvd-server-b", "and the old certificate still serves")
    ch.close()
    k.stop()


@test
def bad_tls_settings_refused_before_the_data_dir():
    for args, text in ((["--listen-client-urls", "https://127.0.0.1:%d" % free_port()], "--cert-file"),
                       (["--listen-client-urls", "https://127.0.0.1:%d" % free_port()] + server_args("server") +
                        ["--cert-file", p("nothing.pem")], "--cert-file"),
                       (["--listen-client-urls", "https://127.0.0.1:%d" % free_port(), "--cert-file",
                         p("server.pem"), "--key-file", p("alice.key")], "does not match"),
                       (["--listen-client-urls", "https://127.0.0.1:%d" % free_port(), "--client-cert-auth"] +
                        server_args(), "--trusted-ca-file"),
                       (["--listen-client-urls", "https://127.0.0.1:%d" % free_port(), "--cipher-suites",
                         "TLS_NOPE"] + server_args(), "cipher suite")):
        d = os.path.join(tempfile.mkdtemp(prefix="kvd-tls-bad-"), "data")
        r = subprocess.run([os.environ.get("KVD", os.path.join(ROOT, "kvd")), "--data-dir", d] + args, capture_output=True,
                           text=True, timeout=30)
        check(r.returncode == 2 and text in r.stderr and len(r.stderr.strip().splitlines()) == 1 and
              not os.path.exists(d), "%s: one line, exit 2, no data dir: %r" % (text, r.stderr))


def client_hello():
    """The first flight of a real TLS client (Python's ssl), as bytes."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    i, o = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(i, o, server_side=False, server_hostname="kvd")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return o.read()


@test
def hostile_input_on_the_tls_port():
    # the flood comes from one address: no per-address cap, so the handshake bound is what holds
    k = kvd_tls(server_args(extra=["--max-connections-per-ip", "0"]), plain=True)
    ch = grpc_channel(k.tport)
    stop = threading.Event()
    served, failed = [0], []

    lat = []

    def honest():
        while not stop.is_set():
            try:
                t0 = time.time()
                call(ch, "Put", R.PutRequest(key=b"honest", value=b"%d" % served[0]), "PutResponse", timeout=10)
                lat.append(time.time() - t0)
                served[0] += 1
            except Exception as ex:  # noqa
                failed.append(str(ex)[:200])
    th = threading.Thread(target=honest, daemon=True)
    th.start()
    hello = client_hello()
    rss0 = k.rss_kb()
    socks = []
    # garbage instead of a ClientHello, a truncated record, half a handshake then silence
    for data in (b"GARBAGE" * 100, hello[:20], hello):
        s = socket.create_connection(("127.0.0.1", k.tport))
        s.sendall(data)
        socks.append(s)
    # a 1-byte-per-second handshake
    slow = socket.create_connection(("127.0.0.1", k.tport))
    # a flood of ClientHellos: 400 connections, each makes kvd do a key exchange
    for i in range(400):
        try:
            s = socket.create_connection(("127.0.0.1", k.tport), timeout=5)
            s.sendall(hello)
            socks.append(s)
        except OSError:
            pass
        if i % 50 == 0:
            try:
                slow.send(hello[i // 50:i // 50 + 1])
            except OSError:
                pass
    n0 = served[0]
    check(wait_for(lambda: served[0] > n0 + 20, 30), "the honest client is served during the flood (%d)" % served[0])
    ls = sorted(lat)
    print("    honest Puts while the flood ran: %d, p50 %.1f ms, p99 %.1f ms, max %.1f ms" %
          (len(ls), 1000 * ls[len(ls) // 2], 1000 * ls[len(ls) * 99 // 100], 1000 * ls[-1]), flush=True)
    rss1 = k.rss_kb()
    check(rss1 - rss0 < 8 * 1024, "memory bounded under the flood: %d -> %d KiB" % (rss0, rss1))

    def closed(s, within):
        """kvd closed it: the peer's end (or a reset) arrives within the time."""
        s.settimeout(within)
        try:
            while s.recv(4096):
                pass
            return True
        except socket.timeout:
            return False
        except OSError:
            return True
    check(closed(socks[0], 10), "garbage instead of a ClientHello: closed")
    check(closed(socks[1], 30), "a truncated record then silence: closed (the first-bytes timeout)")
    check(closed(socks[2], 30), "half a handshake then silence: closed")
    check(closed(slow, 30), "a handshake at a byte a while: closed")
    for s in socks:
        s.close()
    slow.close()
    stop.set()
    th.join(20)
    check(not failed, "no honest call failed: %s" % failed[:3])
    check(k.alive() and peer_cert_cn(k.tport)[0] == "kvd-server", "kvd serves TLS after it")
    ch.close()
    k.stop()
    import re
    m = re.search(r"tls: (\d+) handshakes, (\d+) failed, (\d+) displaced", k.logtext())
    check(m and int(m.group(3)) >= 400 - 64 - 10, "silent handshakes beyond 64 displaced the oldest: %s" %
          (m.group(0) if m else k.logtext()[-300:]))


if __name__ == "__main__":
    try:
        certs()
        main_guard(sys.argv)
    finally:
        shutil.rmtree(D, ignore_errors=True)
