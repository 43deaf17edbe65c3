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
is served and memory stays bounded.  --trusted-ca-file alone already
requires a client certificate signed by it, on both.  With
--client-cert-auth and auth on, the certificate's CN is the user by its
exact bytes: a CN "root\\0.tenant42.example" is not root, a 73-character CN
is not the user named by its first 64, on both (with the same error texts),
while a CN "root" is root.  A flood of half-open ClientHellos from four
addresses (127.0.0.2-5, ~300 a second) does not push out a slow honest
handshake from a fifth (150 ms each way): the address holding the most
handshakes yields its slot.
Last line: "N passed, N failed".
"""
import datetime
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
from kvdtest import (ROOT, Kvd, check, free_port, go_peer, go_peers_or_skip, main_guard, pb, spawn, test,
                     read_to_end, wait_for)

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

    def __init__(self, args, binary="etcd", probe="bob"):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="etcd-tls-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        url = "https://127.0.0.1:%d" % self.port
        self.p = spawn([binary, "--name", "ref", "--data-dir", self.dir, "--listen-client-urls", url,
                        "--advertise-client-urls", url, "--listen-peer-urls", "http://127.0.0.1:%d" % free_port(),
                        "--log-level", "error"] + list(args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # up when it answers anyone it accepts (bob passes every configuration here but
        # the allowed host names that refuse him: then up when it takes connections)
        if probe:
            wait_for(lambda: ctl(self, None, probe, "--insecure-skip-tls-verify", "endpoint", "health",
                                 fail=True)[0] == 0, 60, 0.1)
        else:
            wait_for(lambda: admitted(self.port, None) != "ConnectionRefusedError", 60, 0.1)

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


def ctl_error(r):
    """etcdctl's own "Error: ..." line (the rest of stderr is its client's
    retry log, with times)."""
    return [line for line in r[2].splitlines() if line.startswith("Error:")]


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


def admitted(port, client):
    """Does a server at port serve /health over TLS to this client
    certificate (as a curl would ask)?  True, or what refused it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    if client:
        ctx.load_cert_chain(p(client + ".pem"), p(client + ".key"))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with ctx.wrap_socket(raw) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                got = read_to_end(s)
        return True if got.startswith(b"HTTP/1.1 200") else got[:40]
    except (ssl.SSLError, OSError) as e:
        return type(e).__name__


def make_crl(ca, name, revoke=(), last=None, nxt=None):
    """ca's CRL listing the certificates named in revoke, its dates given
    (openssl's YYYYMMDDHHMMSSZ) or from now."""
    for r in revoke:
        subprocess.run(["openssl", "ca", "-config", ca + ".cnf", "-revoke", r + ".pem"], cwd=D, capture_output=True)
    args = ["openssl", "ca", "-config", ca + ".cnf", "-gencrl", "-out", name + ".tmp"]
    if last:
        args += ["-crl_lastupdate", last, "-crl_nextupdate", nxt]
    sh(*args)
    sh("openssl", "crl", "-in", name + ".tmp", "-outform", "DER", "-out", name + ".new")  # etcd reads DER only
    os.rename(p(name + ".new"), p(name))


@test
def crls_and_allowed_hosts_as_etcd37():
    """--client-crl-file refuses the serials it lists and nobody else,
    whatever its dates or issuer (a CRL past its nextUpdate, one dated in
    the future by a board's wrong clock, one from another CA), and a change
    to the file takes effect without a restart; --client-cert-allowed-hostname
    matches SANs only (a CN alone names nothing), wildcards as Go does, a
    comma list untrimmed -- each beside etcd 3.7.3."""
    if not go_peers_or_skip("crls_and_allowed_hosts_as_etcd37"):
        return
    etcd = go_peer("etcd")
    make_ca("ca3")
    # ca3 gives the serial the revoked certificate has in ca: a foreign CRL listing it
    serial = sh("openssl", "x509", "-in", "revoked.pem", "-noout", "-serial").strip().split("=")[1]
    open(os.path.join(D, "ca3.db", "serial"), "w").write(serial + "\n")
    make_cert("ca3", "twin", "twin", usage="clientAuth")
    make_crl("ca3", "crl-foreign.der", revoke=["twin"])
    make_crl("ca", "crl-stale.der", last="20200101000000Z", nxt="20200201000000Z")
    make_crl("ca", "crl-future.der", last="20900101000000Z", nxt="20900201000000Z")
    make_crl("ca", "crl-live.der")
    for crl in ("crl-stale.der", "crl-future.der", "crl-foreign.der", "crl-live.der"):
        flags = ["--client-cert-auth", "--trusted-ca-file", p("ca.pem"), "--client-crl-file", p(crl)]
        e = EtcdTLS(server_args(extra=flags), binary=etcd)
        k = kvd_tls(server_args(extra=flags))
        for client in ("alice", "bob", "revoked"):
            x, y = admitted(e.port, client), admitted(k.tport, client)
            check((x is True) == (y is True), "%s, %s: etcd %s, kvd %s" % (crl, client, x, y))
            if client == "alice":
                check(y is True, "%s: alice is served" % crl)
            if client == "revoked":
                check(y is not True, "%s: the revoked serial is refused" % crl)
        if crl == "crl-live.der":  # the file replaced: no restart, no SIGHUP
            make_crl("ca", "crl-live.der", revoke=["bob"])
            for srv, port in ((e, e.port), (k, k.tport)):
                check(wait_for(lambda: admitted(port, "bob") is not True, 10),
                      "%s: bob refused once the CRL lists him" % type(srv).__name__)
                check(admitted(port, "alice") is True, "%s: alice still served" % type(srv).__name__)
        check(wait_for(lambda: "revoked" in k.logtext(), 10), "kvd says why (%s)" % crl)
        e.stop()
        k.stop()
    # allowed host names: SANs only, Go's wildcards, the list as etcd splits it
    make_cert("ca", "cnonly", "bob.example", usage="clientAuth")
    make_cert("ca", "wild", "wild", "DNS:*.example.com", usage="clientAuth")
    make_cert("ca", "ipsan", "ipsan", "IP:10.1.2.3", usage="clientAuth")
    for allowed, want in (("bob.example", {"bob": 1, "cnonly": 0, "wild": 0}),
                          ("BOB.example.", {"bob": 1}),
                          ("x.example.com", {"wild": 1, "bob": 0}),
                          ("example.com", {"wild": 0}), ("a.b.example.com", {"wild": 0}),
                          ("nope,bob.example", {"bob": 1}), ("nope, bob.example", {"bob": 0}),
                          ("[10.1.2.3]", {"ipsan": 1, "bob": 0}), ("::ffff:10.1.2.3", {"ipsan": 1})):
        flags = ["--client-cert-auth", "--trusted-ca-file", p("ca.pem"), "--client-cert-allowed-hostname", allowed]
        e = EtcdTLS(server_args(extra=flags), binary=etcd, probe="bob" if want.get("bob") else None)
        k = kvd_tls(server_args(extra=flags))
        for client, ok in want.items():
            x, y = admitted(e.port, client), admitted(k.tport, client)
            check((x is True) == bool(ok) and (y is True) == bool(ok),
                  "allowed %r, %s: want %s, etcd %s, kvd %s" % (allowed, client, bool(ok), x, y))
        e.stop()
        k.stop()


@test
def trusted_ca_alone_requires_a_client_certificate():
    """--trusted-ca-file without --client-cert-auth: etcd (its listener sets
    RequireAndVerifyClientCert when a CA file is given) requires a client
    certificate that CA signed; so does kvd.  Side by side: alice's works,
    none or mallory's (another CA) fails on both; grpcio too, on kvd.  The
    CN is still no user name there (etcd takes it only with
    --client-cert-auth): with auth on, a CN "root" is refused on both."""
    flags = ["--trusted-ca-file", p("ca.pem")]
    e = EtcdTLS(server_args(extra=flags))
    k = kvd_tls(server_args(extra=flags))
    for args in (("put", "tc", "1"), ("get", "tc", "--print-value-only")):
        x, y = both(e, k, "ca", "alice", *args)
        check(x[0] == y[0] == 0 and x[1] == y[1], "alice's certificate: etcdctl %s on both: %s / %s" % (args, x, y))
    for client, what in ((None, "no client certificate"), ("mallory", "a certificate from another CA")):
        x, y = both(e, k, "ca", client, "get", "tc", fail=True)
        check(x[0] != 0 and y[0] != 0, "%s fails on both (etcd %d, kvd %d: %s)" % (what, x[0], y[0], y[2][-160:]))
    check(wait_for(lambda: "TLS handshake failed" in k.logtext(), 10), "kvd logs why a handshake failed")
    import grpc
    ch = grpc_channel(k.tport, "alice")
    got = call(ch, "Range", R.RangeRequest(key=b"tc"), "RangeResponse")
    check(len(got.kvs) == 1 and got.kvs[0].value == b"1", "grpcio with alice's certificate: %s" % got)
    ch.close()
    ch = grpc_channel(k.tport)
    try:
        call(ch, "Range", R.RangeRequest(key=b"tc"), "RangeResponse", timeout=10)
        refused = None
    except grpc.RpcError as ex:
        refused = ex.code()
    check(refused == grpc.StatusCode.UNAVAILABLE, "grpcio without a client certificate: refused (%s)" % refused)
    ch.close()
    # without --client-cert-auth the CN names no user once auth is on, on both: a CN "root" is not root
    make_cert("ca", "tc-root", "root", usage="clientAuth")
    for args in (("user", "add", "root:rootpw"), ("user", "grant-role", "root", "root"), ("auth", "enable")):
        x, y = both(e, k, "ca", "alice", *args)
        check(x[0] == y[0] == 0 and x[1] == y[1], "etcdctl %s on both: %s / %s" % (" ".join(args), x, y))
    for args in (("put", "tc", "2"), ("user", "list")):
        x, y = both(e, k, "ca", "tc-root", *args)
        check(x[0] != 0 and y[0] != 0 and ctl_error(x) == ctl_error(y) != [],
              "a CN \"root\" without --client-cert-auth: etcdctl %s refused on both, the same text: %s / %s" %
              (" ".join(args), ctl_error(x), ctl_error(y)))
    x, y = both(e, k, "ca", "tc-root", "--user", "root:rootpw", "get", "tc", "--print-value-only")
    check(x[0] == y[0] == 0 and x[1] == y[1] == "1\n", "a password still works over it, on both: %s / %s" % (x, y))
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
    # valid from now for 365 days, as etcd's
    ed, kd = peer_cert_dates(e.port), peer_cert_dates(k.tport)
    now = datetime.datetime.now(datetime.timezone.utc)
    check(ed[1] - ed[0] == datetime.timedelta(days=365) and kd[1] - kd[0] == ed[1] - ed[0],
          "365 days of validity on both: etcd %s, kvd %s" % (ed, kd))
    check(abs((kd[0] - now).total_seconds()) < 3600, "kvd's begins now (UTC): %s, now %s" % (kd[0], now))
    e.stop()
    k.stop()


def peer_cert_openssl(port, *args):
    """What `openssl x509 ARGS` prints of the server's certificate, taken
    without verifying it."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        with ctx.wrap_socket(s) as t:
            der = t.getpeercert(binary_form=True)
    r = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout"] + list(args), input=der, capture_output=True)
    return r.stdout.decode().splitlines()


def peer_cert_dates(port):
    """The server certificate's notBefore and notAfter (UTC datetimes)."""
    d = dict(l.split("=", 1) for l in peer_cert_openssl(port, "-dates") if "=" in l)
    f = lambda v: datetime.datetime.strptime(v, "%b %d %H:%M:%S %Y GMT").replace(tzinfo=datetime.timezone.utc)
    return f(d["notBefore"]), f(d["notAfter"])


def peer_cert_cn_noverify(port):
    for line in peer_cert_openssl(port, "-subject", "-nameopt", "multiline"):
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


def make_cert_cn(ca, name, cn):
    """A client certificate signed by ca whose CN is cn exactly, characters
    openssl's -subj cannot carry (a NUL) or more than its 64 (X.509's upper
    bound ub-common-name): made with python3-cryptography's
    CertificateBuilder, the CN a UTF8String of cn's UTF-8 bytes (which Go
    parses too; a PrintableString may not hold a NUL).  _validate=False lets
    a cryptography that checks the 64-character bound build it anyway."""
    import datetime
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    ca_key = serialization.load_pem_private_key(open(p(ca + ".key"), "rb").read(), None)
    ca_cert = x509.load_pem_x509_certificate(open(p(ca + ".pem"), "rb").read())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.utcnow()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn, _validate=False)] if cn is not None
                                    else [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "no CN")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    raw = (cn or "").encode()
    der = cert.public_bytes(serialization.Encoding.DER)
    assert cn is None or bytes([0x0C, len(raw)]) + raw in der, "the CN's UTF8String holds every byte"  # len < 128
    open(p(name + ".pem"), "wb").write(cert.public_bytes(serialization.Encoding.PEM))
    open(p(name + ".key"), "wb").write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    sh("openssl", "verify", "-CAfile", ca + ".pem", name + ".pem")


@test
def certificate_cn_bytes_exactly():
    """With --client-cert-auth and auth on, a call without a token is the
    user the client certificate's CN names, all of its bytes.  kvd used to
    copy the CN as a C string capped at 64 bytes: a CN "root\\0.tenant42.example"
    was root, and a 73-character CN whose first 64 characters name a user with
    the root role was that user.  etcd (Go) takes the whole CN; neither is a
    user, so both refuse, with the same texts.  Controls that the setup can
    tell: a CN "root", and one that is exactly the 64-character name, are
    root on both. [§27.3]"""
    r64 = "r" * 64
    make_cert_cn("ca", "cn-nul", "root\x00.tenant42.example")
    make_cert_cn("ca", "cn-long", r64 + "123456789")
    make_cert("ca", "cn-root", "root", usage="clientAuth")
    make_cert("ca", "cn-r64", r64, usage="clientAuth")
    make_cert_cn("ca", "cn-empty", "")
    make_cert_cn("ca", "cn-none", None)
    flags = ["--client-cert-auth", "--trusted-ca-file", p("ca.pem")]
    e = EtcdTLS(server_args(extra=flags), binary=go_peer("etcd") or "etcd")
    k = kvd_tls(["--bcrypt-cost", "4"] + server_args(extra=flags))
    # alice (her certificate's CN) is a plain user once auth is on; root and r64 have the root role
    for args in (("user", "add", "root:rootpw"), ("user", "grant-role", "root", "root"),
                 ("user", "add", r64 + ":r64pw"), ("user", "grant-role", r64, "root"),
                 ("role", "add", "r"), ("role", "grant-permission", "r", "readwrite", "cn/", "--prefix"),
                 ("user", "add", "alice:alicepw"), ("user", "grant-role", "alice", "r"), ("auth", "enable")):
        x, y = both(e, k, "ca", "alice", *args)
        check(x[0] == y[0] == 0 and x[1] == y[1], "etcdctl %s on both: %s / %s" % (" ".join(args), x, y))
    x, y = both(e, k, "ca", "alice", "--user", r64 + ":r64pw", "user", "list")
    check(x[0] == y[0] == 0 and x[1] == y[1] and "alice" in y[1],
          "the 64-character user is an admin by password on both: %s / %s" % (x, y))
    x, y = both(e, k, "ca", "alice", "put", "x", "1")
    check(x[0] != 0 and y[0] != 0 and ctl_error(x) == ctl_error(y) != [],
          "alice (a plain user by her CN) may not write x on both: %s / %s" % (ctl_error(x), ctl_error(y)))
    for cert, what in (("cn-root", 'a CN "root"'), ("cn-r64", "a CN of the 64-character admin's name")):
        for args in (("put", "x", cert), ("user", "list")):
            x, y = both(e, k, "ca", cert, *args)
            check(x[0] == y[0] == 0 and x[1] == y[1], "%s is an admin: etcdctl %s on both: %s / %s" %
                  (what, " ".join(args), x, y))
    for cert, what in (("cn-nul", 'a CN "root\\0.tenant42.example"'),
                       ("cn-long", "a 73-character CN, the admin's name and 9 more"),
                       ("cn-empty", "an empty CN (the user \"\": permission denied)"),
                       ("cn-none", "no CN at all (the same)")):
        for args in (("put", "x", "1"), ("user", "list"), ("get", "x")):
            x, y = both(e, k, "ca", cert, *args)
            print("    %s, etcdctl %s: etcd %d %s, kvd %d %s" % (cert, " ".join(args), x[0], ctl_error(x), y[0],
                                                                 ctl_error(y)), flush=True)
            check(x[0] != 0 and y[0] != 0 and ctl_error(x) == ctl_error(y) != [],
                  "%s is no user: etcdctl %s refused on both, the same text: %s / %s" %
                  (what, " ".join(args), (x[0], x[1], ctl_error(x)), (y[0], y[1], ctl_error(y))))
    x, y = both(e, k, "ca", "cn-root", "get", "x", "--print-value-only")
    check(x[0] == y[0] == 0 and x[1] == y[1] == "cn-r64\n", "x as the admins left it, on both: %s / %s" % (x, y))
    e.stop()
    k.stop()


def peer_cert_cn(port):
    ctx = ssl.create_default_context(cafile=p("ca.pem"))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
            return dict(x[0] for x in t.getpeercert()["subject"])["commonName"], t.selected_alpn_protocol()


@test
def sighup_rereads_certificates():
    """SIGHUP: new connections get the new certificates while an open one
    goes on with its own generation; a bad set keeps the one in use. [§27.4]"""
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


def kvd_has_tls13():
    """Does this kvd's mbedtls have a TLS 1.3 server (--version says)?"""
    r = subprocess.run([os.environ.get("KVD", os.path.join(ROOT, "kvd")), "--version"], capture_output=True,
                       text=True, timeout=30)
    return "+tls1.3" in r.stdout


def s_client(port, *args):
    """openssl s_client to port with args (it stays a second to see a
    session ticket arrive): the protocol and cipher it negotiated (None, None
    when refused), the key exchange group, and whether a ticket came."""
    r = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % port, "-CAfile", p("ca.pem"),
                        "-servername", "localhost"] + list(args), input="", capture_output=True, text=True,
                       timeout=30)
    import re
    m = re.search(r"^New, (TLSv1\.[23]), Cipher is (\S+)", r.stdout, re.M)
    g = re.search(r"^(?:Server|Peer) Temp Key: ([^,]+)", r.stdout, re.M)
    return (m.group(1) if m else None, m.group(2) if m else None, g.group(1) if g else None,
            "New Session Ticket arrived" in r.stdout)


@test
def tls_versions_like_etcd37():
    """--tls-min-version / --tls-max-version side by side with etcd 3.7.3,
    which offers TLS 1.3: openssl s_client asking for 1.2 only and 1.3 only
    gets the same answer from both (the version, or a refusal).  A kvd built
    with mbedtls 3.6 negotiates TLS 1.3 with each of its three suites and
    X25519, P-256 and P-384 as etcd does, and sends no session ticket (etcd
    sends one: the check can see it).  A kvd on mbedtls 2.28 has no TLS 1.3:
    it refuses --tls-min-version TLS1.3 at start, and serves 1.2 where etcd
    would serve 1.3."""
    if not go_peers_or_skip("TLS versions beside etcd 3.7.3"):
        return
    has13 = kvd_has_tls13()
    print("    this kvd: TLS 1.2%s" % (" and 1.3" if has13 else " only (mbedtls without TLS 1.3)"), flush=True)
    for flags in ([], ["--tls-min-version", "TLS1.3"], ["--tls-max-version", "TLS1.2"],
                  ["--tls-min-version", "TLS1.2", "--tls-max-version", "TLS1.3"]):
        e = EtcdTLS(server_args(extra=flags), binary=go_peer("etcd"))
        if not has13 and flags[:2] == ["--tls-min-version", "TLS1.3"]:
            d = os.path.join(tempfile.mkdtemp(prefix="kvd-tls13-"), "data")
            r = subprocess.run([os.environ.get("KVD", os.path.join(ROOT, "kvd")), "--data-dir", d,
                                "--listen-client-urls", "https://127.0.0.1:%d" % free_port()] + server_args(extra=flags),
                               capture_output=True, text=True, timeout=30)
            check(r.returncode == 2 and "has no TLS 1.3" in r.stderr, "no TLS 1.3 here: %s refused at start: %r" %
                  (flags, r.stderr))
            e.stop()
            continue
        k = kvd_tls(server_args(extra=flags))
        for v in ("-tls1_2", "-tls1_3"):
            x, y = s_client(e.port, v)[0], s_client(k.tport, v)[0]
            want = x if has13 or x != "TLSv1.3" else ("TLSv1.2" if v == "-tls1_2" else None)
            print("    %s, client %s: etcd %s, kvd %s" % (" ".join(flags) or "defaults", v, x, y), flush=True)
            check(y == want, "%s, client %s: etcd %s, kvd %s (want %s)" % (flags, v, x, y, want))
        if not flags:
            x, y = s_client(e.port)[0], s_client(k.tport)[0]
            check(x == "TLSv1.3" and y == ("TLSv1.3" if has13 else "TLSv1.2"),
                  "a client that offers both gets the newest: etcd %s, kvd %s" % (x, y))
            if has13:
                for suite in ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"):
                    x, y = s_client(e.port, "-tls1_3", "-ciphersuites", suite), s_client(k.tport, "-tls1_3",
                                                                                         "-ciphersuites", suite)
                    check(x[:2] == y[:2] == ("TLSv1.3", suite), "TLS 1.3 with %s on both: %s / %s" % (suite, x, y))
                for group, shown in (("X25519", "X25519"), ("P-256", "ECDH"), ("P-384", "ECDH")):
                    x, y = s_client(e.port, "-tls1_3", "-groups", group), s_client(k.tport, "-tls1_3", "-groups", group)
                    check(x[0] == y[0] == "TLSv1.3" and x[2] == y[2] == shown,
                          "TLS 1.3 key exchange over %s on both: %s / %s" % (group, x, y))
                x, y = s_client(e.port, "-tls1_3"), s_client(k.tport, "-tls1_3")
                check(x[3] and not y[3], "session tickets: etcd sends one (%s), kvd none (%s)" % (x[3], y[3]))
        e.stop()
        k.stop()
    # etcd's words for a contradiction, at start
    for flags, text in ((["--tls-min-version", "TLS1.3", "--tls-max-version", "TLS1.2"],
                         "min version (TLS1.3) is greater than max version (TLS1.2)"),
                        (["--tls-min-version", "TLS1.3", "--cipher-suites", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
                         "cipher suites cannot be configured when only TLS1.3 is enabled"),
                        (["--tls-max-version", "TLS1.4"], "unexpected TLS version")):
        d = os.path.join(tempfile.mkdtemp(prefix="kvd-tlsv-"), "data")
        r = subprocess.run([os.environ.get("KVD", os.path.join(ROOT, "kvd")), "--data-dir", d,
                            "--listen-client-urls", "https://127.0.0.1:%d" % free_port()] + server_args(extra=flags),
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and text in r.stderr and not os.path.exists(d), "%s: refused: %r" % (flags, r.stderr))


@test
def hostile_client_hellos():
    """A real ClientHello (Python's: it offers TLS 1.3 with an X25519 key
    share, and 1.2), mutated 300 ways -- a byte flipped, cut short, a length
    made huge, the key share garbled -- each on its own connection while an
    honest client calls: kvd answers each with an alert or a close, and the
    honest client and a TLS 1.3 (or 1.2) handshake still work after."""
    import random
    k = kvd_tls(server_args(extra=["--max-connections-per-ip", "0"]), plain=True)
    ch = grpc_channel(k.tport)
    hello = client_hello()
    rnd = random.Random(int(os.environ.get("KVD_SEED", "1307")))
    mem0 = kvd_mem(k)
    share = hello.find(bytes([0x00, 0x33]))  # the key_share extension's type
    closed = 0
    for batch in range(3):  # 100 at a time: within --max-connections, past the 64 handshake slots
        socks = []
        for i in range(100):
            h = bytearray(hello)
            kind = i % 5
            if kind == 0:
                h[rnd.randrange(len(h))] ^= 1 << rnd.randrange(8)
            elif kind == 1:
                h = h[:rnd.randrange(5, len(h))]
            elif kind == 2:
                j = rnd.randrange(5, len(h) - 2)
                h[j], h[j + 1] = 0xff, 0xff
            elif kind == 3 and share > 0:
                for j in range(share + 4, min(len(h), share + 4 + 40)):
                    h[j] = rnd.randrange(256)
            else:
                h[rnd.randrange(len(h))] = rnd.randrange(256)
            s = socket.create_connection(("127.0.0.1", k.tport), timeout=30)
            s.sendall(bytes(h))
            s.setblocking(False)
            socks.append(s)
        # each is answered (an alert, a close) or, if a length now asks for
        # more than came, closed by the first-bytes timeout (10 s)
        import selectors
        sel = selectors.DefaultSelector()
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        deadline = time.time() + 40
        while sel.get_map() and time.time() < deadline:
            for key, _ in sel.select(1):
                try:
                    if key.fileobj.recv(4096):
                        continue
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                sel.unregister(key.fileobj)
                closed += 1
        for s in socks:
            s.close()
    check(closed == 300, "every mutated ClientHello answered with an alert or a close: %d/300" % closed)
    call(ch, "Put", R.PutRequest(key=b"after", value=b"1"), "PutResponse")
    check(k.alive() and peer_cert_cn(k.tport)[0] == "kvd-server", "kvd serves TLS after them")
    v = s_client(k.tport)[0]
    check(v == ("TLSv1.3" if kvd_has_tls13() else "TLSv1.2"), "and negotiates its newest version: %s" % v)
    check(wait_for(lambda: kvd_mem(k) - mem0 < 256 * 1024, 30),
          "kvd's memory back after them: %d -> %d bytes" % (mem0, kvd_mem(k)))
    ch.close()
    k.stop()


def kvd_mem(k):
    """kvd_memory_bytes from /metrics on k's plain URL."""
    import urllib.request
    t = urllib.request.urlopen(k.plain_url + "/metrics", timeout=10).read().decode()
    return int(float([x for x in t.splitlines() if x.startswith("kvd_memory_bytes ")][0].split()[1]))


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
    rss0, mem0 = k.rss_kb(), kvd_mem(k)
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
    # kvd's own count (mbedtls' blocks in it too where mbedtls allocates
    # through kvd): back near where it was once the flood is gone
    check(wait_for(lambda: kvd_mem(k) - mem0 < 256 * 1024, 30),
          "kvd's memory back after the flood: %d -> %d bytes" % (mem0, kvd_mem(k)))
    ch.close()
    k.stop()
    import re
    m = re.search(r"tls: (\d+) handshakes, (\d+) failed, (\d+) displaced", k.logtext())
    check(m and int(m.group(3)) >= 400 - 64 - 10, "silent handshakes beyond 64 displaced the oldest: %s" %
          (m.group(0) if m else k.logtext()[-300:]))


def paced_handshake(port, latency, source="127.0.0.1"):
    """One TLS handshake with kvd over a slow link: ssl.MemoryBIO + SSLObject
    over a plain socket, each flight held back `latency` seconds before it
    leaves and again after it arrives.  The server certificate's CN; raises
    if kvd closes the connection or the handshake fails."""
    ctx = ssl.create_default_context(cafile=p("ca.pem"))
    ctx.set_alpn_protocols(["h2"])
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="127.0.0.1")
    link = threading.Event()  # never set: its wait() is the simulated latency
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as s:
        while True:
            try:
                obj.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            flight = out.read()
            if flight:
                link.wait(latency)  # simulates network latency: our flight on its way to kvd
                s.sendall(flight)
            if done:
                break
            d = s.recv(65536)
            if not d:
                raise ConnectionError("kvd closed the connection in the handshake")
            link.wait(latency)  # simulates network latency: kvd's flight on its way back
            s.settimeout(0)
            try:  # the rest of kvd's flight arrived meanwhile
                while True:
                    more = s.recv(65536)
                    if not more:
                        break
                    d += more
            except BlockingIOError:
                pass
            s.settimeout(30)
            inc.write(d)
        # a TLS 1.3 client is done before kvd has read its Finished: only an
        # answer shows that kvd finished the handshake too (and kept the slot)
        obj.write(b"GET /health HTTP/1.1\r\nHost: kvd\r\n\r\n")
        s.sendall(out.read())
        while True:
            d = s.recv(65536)
            if not d:
                raise ConnectionError("kvd closed the connection before it answered")
            inc.write(d)
            try:
                if obj.read(65536):
                    break
            except ssl.SSLWantReadError:
                pass
        return dict(x[0] for x in obj.getpeercert()["subject"])["commonName"]


class Flood:
    """Half-open TLS connections at `rate` a second in all, spread over the
    source addresses: each sends the first 40 bytes of a real ClientHello
    and stays silent, held open (the newest 600 per address; kvd has
    displaced the older ones by then).  made[i]: connections from address i."""

    def __init__(self, port, sources, rate):
        self.port, self.stop, self.made, self.errors = port, threading.Event(), [0] * len(sources), [0]
        self.first = None  # the flood's first connection: kvd closes it once the table is full
        hello = client_hello()[:40]
        self.threads = [threading.Thread(target=self.run, args=(i, src, rate / len(sources), hello), daemon=True)
                        for i, src in enumerate(sources)]
        for t in self.threads:
            t.start()

    def run(self, i, src, rate, hello):
        import collections
        held, t0, n = collections.deque(), time.time(), 0
        while not self.stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=5, source_address=(src, 0))
                s.sendall(hello)
                self.made[i] += 1
                if self.first is None and i == 0:
                    self.first = s
                else:
                    held.append(s)
            except OSError:
                self.errors[0] += 1
            if len(held) > 600:
                held.popleft().close()
            n += 1
            self.stop.wait(max(0.0, t0 + n / rate - time.time()))  # pacing: the attack's rate, n/rate seconds in
        for s in held:
            s.close()

    def total(self):
        return sum(self.made)

    def first_closed(self):
        if self.first is None:
            return False
        self.first.settimeout(0)
        try:
            return self.first.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def end(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)
        if self.first is not None:
            self.first.close()


def flood_and_handshake(k, sources, rate=300, n=5, latency=0.15):
    """A Flood from sources; once it has filled the handshake slots, n paced
    handshakes from 127.0.0.1; then the flood ends (whatever happened).
    (filled, completed, failures, the flood's connections made during each
    handshake, the flood's connections in all, its connect errors)."""
    flood = Flood(k.tport, sources, rate)
    ok, failures, during = 0, [], []
    try:
        # full: past 64 at once, and its first connection displaced
        filled = wait_for(lambda: flood.total() > 128 and flood.first_closed(), 60)
        for _ in range(n if filled else 0):
            before = flood.total()
            try:
                ok += paced_handshake(k.tport, latency) == "kvd-server"
            except (OSError, ssl.SSLError) as ex:
                failures.append("%s: %s" % (type(ex).__name__, ex))
            during.append(flood.total() - before)
    finally:
        flood.end()
    return filled, ok, failures, during, flood.total(), flood.errors[0]


@test
def handshake_flood_from_few_addresses():
    """At most KVD_MAX_HANDSHAKES (64) TLS handshakes are in progress; when
    full, a new one displaces one.  kvd used to displace the oldest of all:
    ~300 half-open ClientHellos a second from four addresses (127.0.0.2-5)
    turn the 64 slots over every 64/300 ~ 0.2 s, while an honest handshake
    over a link with 150 ms latency (held 150 ms before each flight leaves
    and after each arrives: ~0.45 s in a slot, from its connect to kvd's
    Finished) needs longer, so it always became the oldest and was pushed
    out: 0/5 completed.  Now the address holding the most handshakes yields:
    5/5 must complete.  That the attack was strong enough to push out a
    handshake under the old rule is checked too, by counting, not timing:
    once the table is full, a handshake during which 64 newer ones arrive
    becomes the oldest of all, so each honest handshake must have seen at
    least 64 flood connections made while it ran.  The control: the same
    flood from the honest client's own address, where the new rule falls
    back to that address's oldest, i.e. the old rule: the paced handshakes
    that saw 64 newer ones are pushed out. [§27.2]"""
    k = kvd_tls(server_args(extra=["--max-connections", "1024"]))
    filled, ok, failures, during, made, errors = flood_and_handshake(k, ["127.0.0.%d" % i for i in (2, 3, 4, 5)])
    check(filled, "the flood filled the 64 handshake slots (its first connection displaced)")
    check(ok == 5, "5 slow honest handshakes from 127.0.0.1 complete during the flood: %d/5 %s" % (ok, failures[:3]))
    check(during and min(during) >= 64, "each saw at least 64 flood connections made while it ran (the old rule "
          "would have pushed it out): %s" % during)
    # the control: the old rule, as the new one still applies it when everything comes from one address
    filled, cok, cfailures, cduring, cmade, cerrors = flood_and_handshake(k, ["127.0.0.1"])
    check(filled, "the control flood filled the handshake slots")
    strong = sum(1 for d in cduring if d >= 64)
    check(strong and cok <= 5 - strong, "control: the same flood from 127.0.0.1 pushes out the paced handshakes "
          "that saw 64 newer ones: %d/5 completed, flood connections during each %s" % (cok, cduring))
    made += cmade
    errors += cerrors
    check(k.alive() and peer_cert_cn(k.tport)[0] == "kvd-server", "kvd serves TLS after the floods")
    ch = grpc_channel(k.tport)
    call(ch, "Put", R.PutRequest(key=b"after", value=b"flood"), "PutResponse")
    check(call(ch, "Range", R.RangeRequest(key=b"after"), "RangeResponse").kvs[0].value == b"flood",
          "and gRPC calls over it")
    ch.close()
    k.stop()
    import re
    m = re.search(r"tls: (\d+) handshakes, (\d+) failed, (\d+) displaced", k.logtext())
    print("    honest handshakes (150 ms each way) completed during the flood from 127.0.0.2-5: %d/5, flood "
          "connections during each %s; control from 127.0.0.1: %d/5, %s; flood connections %d (%d errors); "
          "kvd: %s" % (ok, during, cok, cduring, made, errors, m.group(0) if m else "no tls line"),
          flush=True)
    check(m and int(m.group(3)) >= made // 2, "the floods displaced themselves: %s of %d" %
          (m.group(0) if m else k.logtext()[-300:], made))


if __name__ == "__main__":
    try:
        certs()
        main_guard(sys.argv)
    finally:
        shutil.rmtree(D, ignore_errors=True)
