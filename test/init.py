"""kvd under init systems: exit codes and the checks made before the data dir
is touched (a FIFO where a file belongs is refused, never waited on), --log-outputs (stdout, a file, syslog through a /dev/log the test
binds), --config-file (etcd's sample file, side by side with etcd), and the
README's blocks run as make packages writes them: the quick start, the
systemd unit, the sysvinit script, the OpenWrt procd script, uci file and
feed package Makefile; make dist's tarball; the Buildroot package and the
Yocto recipe through stand-ins.  Run with /usr/bin/python3."""
import configparser
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import struct
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
import kvdtest  # noqa: E402
from kvdtest import ROOT, Client, Kvd, check, etcdctl, free_port, pb, run_tests, spawn, test  # noqa: E402

KVD = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))


def wait_for(cond, timeout=60.0):
    return kvdtest.wait_for(cond, timeout)


def readme_block(name, text=None):
    """The fenced block after '<!-- block: name -->' in the README (or text)."""
    text = text or open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"<!-- block: %s -->\n```[a-z]*\n(.*?)\n```\n" % re.escape(name), text, re.S)
    check(m is not None, "the README has the %s block" % name)
    return m.group(1) + "\n" if m else ""


_PACKAGES = {}


def packages():
    """make packages, once per run, into a directory of the test's own (the
    tree's Makefile and README.md, as a user runs it): that directory, or None."""
    if "dir" not in _PACKAGES:
        d = tempfile.mkdtemp(prefix="kvd-pkg-")
        import atexit
        atexit.register(shutil.rmtree, d, True)
        _PACKAGES["readme"] = open(os.path.join(ROOT, "README.md")).read()  # what make reads, in a tree being edited
        r = subprocess.run(["make", "-s", "-C", ROOT, "packages", "PKG_OUT=" + d, "PREFIX=/usr/local"],
                           capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, "make packages: %s" % (r.stdout + r.stderr)[-1500:])
        _PACKAGES["dir"] = d if r.returncode == 0 else None
    return _PACKAGES["dir"]


def kvd_version():
    m = re.search(r'^#define KVD_VERSION "([^"]+)"', open(os.path.join(ROOT, "kvd.h")).read(), re.M)
    return m.group(1)


def sha256(path, algo="sha256"):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.new(algo, f.read()).hexdigest()


def filled_block(name, out, usr_bin=False):
    """README block name with the placeholders as make packages into out fills them."""
    v = kvd_version()
    lic = os.path.join(ROOT, "LICENSE")
    text = (readme_block(name, _PACKAGES.get("readme")).replace("@VERSION@", v).replace("@URL@", "file://" + out)
            .replace("@SHA256@", sha256(os.path.join(out, "kvd-%s.tar.gz" % v)))
            .replace("@LICENSE_MD5@", sha256(lic, "md5")).replace("@LICENSE_SHA256@", sha256(lic)))
    return text.replace("/usr/local/bin/kvd", "/usr/bin/kvd") if usr_bin else text


def written(out, rel, block, usr_bin=False, mode=0o644):
    """The file make packages wrote at out/rel, checked to be README's block
    (filled in) with its mode: its text."""
    path = os.path.join(out, rel)
    text = open(path).read() if os.path.exists(path) else ""
    check(text == filled_block(block, out, usr_bin), "%s is README's %s block%s" %
          (rel, block, " (with /usr/bin/kvd)" if usr_bin else ""))
    check(os.path.exists(path) and os.stat(path).st_mode & 0o777 == mode, "%s: mode %o" % (rel, mode))
    return text


def healthy(port):
    rc, out, err = etcdctl("127.0.0.1:%d" % port, "endpoint", "health", timeout=10)
    return rc == 0 and "is healthy" in (out + err)


class Syslog:
    """A /dev/log of the test's own: a datagram socket bound at /dev/log, or,
    when the machine has one, bound elsewhere and mounted over /dev/log in a
    private mount namespace for the processes started through .wrap()."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kvd-syslog-")
        self.own = not os.path.exists("/dev/log")
        self.path = "/dev/log" if self.own else os.path.join(self.dir, "log")
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind(self.path)
        self.s.settimeout(0.2)
        self.lines = []

    def wrap(self, cmd):
        if self.own:
            return cmd
        return ["unshare", "-m", "sh", "-c", 'mount --bind "$0" /dev/log && exec "$@"', self.path] + cmd

    def read(self):
        while True:
            try:
                self.lines.append(self.s.recv(65536).decode(errors="replace"))
            except socket.timeout:
                return self.lines

    def saw(self, text, timeout=60):
        return wait_for(lambda: any(text in l for l in self.read()), timeout)

    def close(self):
        self.s.close()
        if self.own:
            os.unlink(self.path)
        shutil.rmtree(self.dir, ignore_errors=True)


def run(args, env=None, timeout=30):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([KVD] + args, capture_output=True, text=True, timeout=timeout, env=e)


# ------------------------------------------------------------------ exit codes
@test
def etcd_cluster_flags_as_kubeadm_passes_them():
    """kubeadm's etcd command line (peers, WAL, snapshots), ETCD_* variables
    and config file keys: taken, each warned about once, and kvd serves; a
    cluster of several members is refused, exit 2, before the data dir."""
    d = tempfile.mkdtemp(prefix="kvd-cluster-")
    port = free_port()
    kubeadm = ["--name", "cp1", "--data-dir", d + "/a", "--listen-client-urls", "http://127.0.0.1:%d" % port,
               "--advertise-client-urls", "http://127.0.0.1:%d" % port,
               "--initial-advertise-peer-urls", "https://127.0.0.1:2380",
               "--initial-cluster", "cp1=https://127.0.0.1:2380", "--initial-cluster-state", "new",
               "--listen-peer-urls", "https://127.0.0.1:2380", "--peer-cert-file", "/etc/kubernetes/pki/etcd/peer.crt",
               "--peer-key-file", "/etc/kubernetes/pki/etcd/peer.key", "--peer-client-cert-auth=true",
               "--peer-trusted-ca-file", "/etc/kubernetes/pki/etcd/ca.crt", "--snapshot-count=10000",
               "--feature-gates=InitialCorruptCheck=true", "--watch-progress-notify-interval=5s"]
    p = spawn([KVD] + kubeadm, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    check(wait_for(lambda: healthy(port), 60), "kubeadm's etcd flags: serving")
    p.terminate()
    out = p.communicate(timeout=60)[0].decode()
    for f in ("listen-peer-urls", "initial-cluster-state", "peer-cert-file", "peer-key-file", "peer-client-cert-auth",
              "peer-trusted-ca-file", "snapshot-count"):
        check(out.count("W | kvd: --%s is etcd's and is ignored" % f) == 1, "--%s: one warning: %r" % (f, out[-600:]))
    r = run(["--name", "cp1", "--data-dir", d + "/m3", "--listen-client-urls", "http://127.0.0.1:%d" % free_port(),
             "--initial-cluster", "cp1=https://10.0.0.1:2380,cp2=https://10.0.0.2:2380,cp3=https://10.0.0.3:2380"])
    check(r.returncode == 2 and "names 2 member(s) besides --name cp1" in r.stderr and not os.path.exists(d + "/m3"),
          "three members: exit 2 before the data dir: %d %r" % (r.returncode, r.stderr))
    r = run(["--data-dir", d + "/b", "--listen-client-urls", "http://127.0.0.1:%d" % free_port()],
            env={"ETCD_INITIAL_CLUSTER": "default=http://a:2380,other=http://b:2380"})
    check(r.returncode == 2 and "besides --name default" in r.stderr and not os.path.exists(d + "/b"),
          "ETCD_INITIAL_CLUSTER with two: exit 2: %r" % r.stderr)
    with open(d + "/c.yml", "w") as f:
        f.write("data-dir: %s/c\nlisten-client-urls: http://127.0.0.1:%d\ninitial-cluster: default=http://a:2380,"
                "x=http://b:2380\n" % (d, free_port()))
    r = run(["--config-file", d + "/c.yml"])
    check(r.returncode == 2 and "besides --name default" in r.stderr, "the config file's: exit 2: %r" % r.stderr)
    port = free_port()
    p = spawn([KVD, "--data-dir", d + "/e", "--listen-client-urls", "http://127.0.0.1:%d" % port],
              env=dict(os.environ, ETCD_SNAPSHOT_COUNT="5000", ETCD_LISTEN_PEER_URLS="http://127.0.0.1:2380"),
              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    check(wait_for(lambda: healthy(port), 60), "ETCD_* of etcd's flags: serving")
    p.terminate()
    out = p.communicate(timeout=60)[0].decode()
    check("--snapshot-count is etcd's and is ignored" in out and "--listen-peer-urls is etcd's" in out,
          "their warnings: %r" % out[-400:])
    r = run(["--data-dir", d + "/f", "--peer-cert-file"])
    check(r.returncode == 2 and "flag needs an argument: --peer-cert-file" in r.stderr, "a value still needed: %r" % r.stderr)
    shutil.rmtree(d)


@test
def configuration_errors_exit_2_before_the_data_dir():
    """A configuration error changes nothing [§40.2]: bad flags, variables,
    URLs, files (certificates, keys, the confd key, a snapshot, a log
    output, the config file) and values each exit 2 with one line, and the
    data dir is not made."""
    d = tempfile.mkdtemp(prefix="kvd-init-")
    dd = os.path.join(d, "data")
    key = os.path.join(d, "key")
    with open(key, "w") as f:
        f.write("k" * 32)
    os.chmod(key, 0o600)
    bad_yaml = os.path.join(d, "bad.yml")
    with open(bad_yaml, "w") as f:
        f.write("name: x\n# fine\nlisten-client-url: http://127.0.0.1:1\n")
    cases = [
        (["--nope"], {}, "unknown flag --nope"),
        (["--max-txn-ops", "x"], {}, "invalid value"),
        (["--name", "a"], {"ETCD_NAME": "b"}, "conflicting environment variable"),
        (["--listen-client-urls", "https://127.0.0.1:%d" % free_port()], {}, "must be provided"),
        (["--listen-client-urls", "http://example.com:2379"], {}, "IP address"),
        (["--listen-metrics-urls", "ftp://127.0.0.1:1"], {}, ""),
        (["--cert-file", d + "/none.pem", "--key-file", d + "/none.key", "--listen-client-urls",
          "https://127.0.0.1:%d" % free_port()], {}, "none.pem"),
        # a file that is not what the flag wants: plain words before mbedtls' own
        (["--cert-file", bad_yaml, "--key-file", key, "--listen-client-urls", "https://127.0.0.1:%d" % free_port()],
         {}, "not a certificate kvd can read (PEM or DER X.509)"),
        (["--confd-hmac-key-file", d + "/nokey"], {}, "No such file"),
        (["--confd-hmac-key-file", key, "--confd-listen", "nonsense"], {}, "bad address"),
        (["--restore-snapshot", d + "/nosnap"], {}, "--restore-snapshot"),
        (["--log-outputs", "/nonexistent-dir/kvd.log"], {}, "cannot open"),
        (["--log-outputs", "stderr,"], {}, "empty output name"),
        (["--logger", "logrus"], {}, 'unknown logger option "logrus"'),
        (["--logger", "capnslog"], {}, "--logger=capnslog is removed in v3.5"),       # etcd 3.7's words
        (["--experimental-watch-progress-notify-interval", "1s"], {}, "flag provided but not defined"),
        (["--log-level", "loud"], {}, "log-level"),
        (["--config-file", d + "/none.yml"], {}, "--config-file"),
        (["--config-file", bad_yaml], {}, 'line 3: unknown key "listen-client-url"'),
        (["--auth-token", "jwt,sign-method=RS256,pub-key=%s/none.pub" % d], {}, "none.pub"),
        (["--election-timeout", "100"], {}, "at least as 5 times"),
    ]
    for args, env, want in cases:
        r = run(["--data-dir", dd] + args, env)
        check(r.returncode == 2 and want in r.stderr and len(r.stderr.strip().splitlines()) == 1,
              "%s: exit 2 with %r: %d %r" % (args, want, r.returncode, r.stderr[-300:]))
        check(not os.path.exists(dd), "%s: the data dir was not created" % args)
    for args in (["--help"], ["--version"]):
        r = run(args)
        check(r.returncode == 0 and r.stdout, "%s: exit 0" % args)
    # --help groups every flag as etcd's does, each with its value's type;
    # --version's build options are plain name=value words
    h = run(["--help"]).stdout
    flags = re.findall(r"^  --([a-z0-9-]+) (string|uint|duration|level|bool)$", h, re.M)
    check("\nOther:" not in h and all(g in h for g in ("\nMember:\n", "\nSecurity:\n", "\nLogging:\n")) and
          len(flags) > 60, "--help: grouped, %d flags typed: %r" % (len(flags), h[:300]))
    opts = run(["--version"]).stdout.split("Build options: ")[1].split()
    check(all(re.match(r"^[a-z0-9-]+=[A-Za-z0-9.\-]+$", o) for o in opts) and "max-output=262144" in opts,
          "--version: plain numbers: %r" % opts)
    shutil.rmtree(d)


@test
def tls_version_and_feature_gate_flags_as_etcd():
    """--tls-min-version / --tls-max-version and --feature-gates: etcd 3.7's
    values and refusals, the same words from both (etcd exits 1 or 2 on
    them, kvd 2 as for any configuration error)."""
    if not kvdtest.go_peers_or_skip("tls_version_and_feature_gate_flags_as_etcd"):
        return
    cases = [(["--tls-min-version", "TLS1.1"], 'unexpected TLS version "TLS1.1" (must be one of: TLS1.2, TLS1.3)'),
             (["--tls-max-version", "tls1.3"], 'unexpected TLS version "tls1.3" (must be one of: TLS1.2, TLS1.3)'),
             (["--tls-min-version", "TLS1.3", "--tls-max-version", "TLS1.2"],
              "min version (TLS1.3) is greater than max version (TLS1.2)"),
             (["--tls-min-version", "TLS1.3", "--cipher-suites", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
              "cipher suites cannot be configured when only TLS1.3 is enabled"),
             (["--feature-gates", "InitialCorruptCheck=true,Nope=true"], "unrecognized feature gate: Nope"),
             (["--feature-gates", "InitialCorruptCheck=maybe"],
              'invalid value of InitialCorruptCheck=maybe, err: strconv.ParseBool: parsing "maybe": invalid syntax')]
    for args, want in cases:
        d = tempfile.mkdtemp(prefix="kvd-tlsv-")
        r = run(["--data-dir", d + "/data"] + args)
        e = subprocess.run([kvdtest.oracle(), "--data-dir", d + "/etcd"] + args, capture_output=True, text=True,
                           timeout=60)
        check(r.returncode == 2 and want in r.stderr, "kvd %s: %d %r" % (args, r.returncode, r.stderr[-300:]))
        check(e.returncode != 0 and want in e.stderr.replace("\\\"", "\""), "etcd %s: %d %r" % (args, e.returncode, e.stderr[-300:]))
        shutil.rmtree(d)
    k = Kvd(KVD, ["--tls-min-version", "TLS1.2", "--tls-max-version", "TLS1.3",
                  "--feature-gates", "StopGRPCServiceOnDefrag=true,FastLeaseKeepAlive=False"])
    check(healthy(k.port), "TLS1.2 to TLS1.3 is taken (this build's newest is its maximum); etcd's gates too")
    k.stop()


def unix_get(path, target):
    """GET target over the unix socket at path: (status, body)."""
    import http.client

    class C(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(20)
            self.sock.connect(path)
    c = C("localhost")
    c.request("GET", target)
    r = c.getresponse()
    out = (r.status, r.read())
    c.close()
    return out


@test
def unix_sockets_as_etcd():
    """unix:// listeners (client and metrics URLs) side by side with etcd
    3.7.3: etcdctl 3.7 and Debian's 3.4 over the socket, HTTP on it, a stale
    socket file replaced, the file gone after a stop.  kvd leaves a file that
    is not a socket alone and refuses to start (etcd would delete it)."""
    if not kvdtest.go_peers_or_skip("unix_sockets_as_etcd"):
        return
    ctl37 = kvdtest.go_peer("etcdctl")
    outs = {}
    for name in ("etcd", "kvd"):
        d = tempfile.mkdtemp(prefix="kvd-unix-")
        sock, msock = os.path.join(d, "c.sock"), os.path.join(d, "m.sock")
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(sock)
        stale.close()  # the file stays: a socket nobody listens on
        port = free_port()
        # a metrics URL's socket is its host alone (etcd's createMetricsListener): a name in the cwd
        urls = ["--listen-client-urls", "unix://%s,http://127.0.0.1:%d" % (sock, port),
                "--advertise-client-urls", "http://127.0.0.1:%d" % port, "--listen-metrics-urls", "unix://m.sock"]
        if name == "etcd":
            p = spawn([kvdtest.oracle(), "--data-dir", d + "/data", "--listen-peer-urls",
                       "http://127.0.0.1:%d" % free_port(), "--log-level", "error"] + urls,
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=d)
        else:
            p = spawn([KVD, "--data-dir", d + "/data"] + urls, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                      cwd=d)
        check(wait_for(lambda: healthy(port), 60), "%s serves" % name)
        ep = "unix://" + sock
        got = []
        for args in (["put", "k", "v"], ["get", "k"], ["endpoint", "health", "-w", "json"]):
            r = subprocess.run([ctl37, "--endpoints", ep] + args, capture_output=True, text=True, timeout=30)
            got.append((r.returncode, re.sub(r'"took":"[^"]*"', "", r.stdout).replace(d, "D")))
        rc, out, err = etcdctl(ep, "get", "k", "--print-value-only")
        got.append((rc, out))
        st, body = unix_get(sock, "/version")
        got.append((st, json.loads(body)))
        st, body = unix_get(msock, "/health")
        got.append((st, body))
        st, body = unix_get(msock, "/metrics")
        got.append((st, b"\nprocess_resident_memory_bytes " in body))
        outs[name] = got
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        check(not os.path.exists(sock) and not os.path.exists(msock), "%s removed its socket files" % name)
        shutil.rmtree(d)
    check(outs["etcd"] == outs["kvd"] and outs["kvd"][1][0] == 0 and "v" in outs["kvd"][3][1],
          "the same answers over unix sockets: %r" % outs)
    d = tempfile.mkdtemp(prefix="kvd-unix-")
    open(os.path.join(d, "c.sock"), "w").close()
    r = run(["--data-dir", d + "/data", "--listen-client-urls", "unix://%s/c.sock" % d])
    check(r.returncode != 0 and "not a socket" in r.stderr and os.path.isfile(os.path.join(d, "c.sock")),
          "a regular file where the socket goes is left alone: %d %r" % (r.returncode, r.stderr[-200:]))
    r = run(["--data-dir", d + "/data", "--listen-metrics-urls", "unix://%s/m.sock" % d])
    check(r.returncode == 2 and "takes the URL's host alone" in r.stderr,
          "a metrics URL with an empty host (etcd would bind no file) is refused: %r" % r.stderr[-200:])
    shutil.rmtree(d)


@test
def runtime_failures_exit_1_and_a_clean_stop_0():
    """One kvd per data dir [§39.5]: a second on a served dir exits 1 (its
    lock is taken); a port in use exits 1 and, the sockets bound first,
    leaves no data dir; SIGTERM and SIGINT stop with 0; an unusable data
    dir is refused."""
    k = Kvd(KVD)
    # the data dir is locked by a running kvd
    r = run(["--data-dir", k.dir, "--listen-client-urls", "http://127.0.0.1:%d" % free_port()])
    check(r.returncode == 1 and "in use by another kvd" in r.stderr, "locked data dir: %d %r" % (r.returncode, r.stderr))
    # the port is taken
    d = tempfile.mkdtemp(prefix="kvd-init-")
    r = run(["--data-dir", d + "/data", "--listen-client-urls", k.url])
    check(r.returncode == 1 and "address already in use" in r.stderr, "busy port: %d %r" % (r.returncode, r.stderr))
    check(not os.path.exists(d + "/data"), "the sockets are bound before the data dir is made (as etcd)")
    check(k.stop(signal.SIGTERM) == 0, "SIGTERM: exit 0")
    k = Kvd(KVD, data_dir=k.dir)
    check(k.stop(signal.SIGINT) == 0 and "stopped" in k.logtext(), "SIGINT: exit 0")
    # a data dir kvd cannot write (as root, a file where the dir should be)
    with open(d + "/file", "w") as f:
        f.write("x")
    r = run(["--data-dir", d + "/file/sub", "--listen-client-urls", "http://127.0.0.1:%d" % free_port()])
    check(r.returncode in (1, 2) and "file/sub" in r.stderr, "unusable data dir refused: %d %r" % (r.returncode, r.stderr))
    shutil.rmtree(d)


def _crc32c(crc, data):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


@test
def log_of_a_newer_kvd_exit_2_untouched():
    """A log whose header says a format newer than this build reads (a
    downgraded firmware): exit 2 -- configuration, no init system retries
    it -- naming both formats, the log byte for byte as it was; a header
    damaged in a way no kvd writes stays corruption (exit 1)."""
    k = Kvd(KVD)
    c = Client(k.endpoint())
    c.call("Put", pb()["rpc"].PutRequest(key=b"a", value=b"1"))
    c.close()
    check(k.stop() == 0, "stopped")
    log = os.path.join(k.dir, "kvd.log")
    with open(log, "rb") as f:
        orig = f.read()
    n = struct.unpack(">I", orig[:4])[0]
    check(_crc32c(_crc32c(0, orig[:4]), orig[8:9 + n]) == struct.unpack(">I", orig[4:8])[0],
          "the header's CRC-32C recomputed here matches kvd's")
    for fmt, want, words in ((4, 2, "written by a newer kvd (log format 4; this kvd reads formats 1 to 3)"),
                             (0, 1, "bad header record")):
        hdr = bytearray(orig[:9 + n])
        struct.pack_into(">I", hdr, 9 + 8, fmt)
        struct.pack_into(">I", hdr, 4, _crc32c(_crc32c(0, hdr[:4]), hdr[8:9 + n]))
        data = bytes(hdr) + orig[9 + n:]
        with open(log, "wb") as f:
            f.write(data)
        r = run(["--data-dir", k.dir, "--listen-client-urls", "http://127.0.0.1:%d" % free_port()])
        with open(log, "rb") as f:
            after = f.read()
        check(r.returncode == want and words in r.stderr and after == data,
              "log format %d: exit %s %r, log untouched: %s" % (fmt, r.returncode, r.stderr[-300:], after == data))
    with open(log, "wb") as f:
        f.write(orig)
    k = Kvd(KVD, data_dir=k.dir)
    check(k.alive(), "the original log serves again")
    k.stop()


# ------------------------------------------------------------------ logs
@test
def log_format_json_and_console_as_etcd():
    """--log-format json: one JSON object a line with etcd 3.7.3's level, ts
    (the same shape), caller and msg; console: zap's tab-separated fields;
    from the config file too; a bad value refused with etcd's words."""
    from kvdtest import oracle
    e = subprocess.Popen([oracle(), "--data-dir", tempfile.mkdtemp(prefix="etcd-logfmt-"), "--listen-client-urls",
                          "http://127.0.0.1:%d" % free_port(), "--advertise-client-urls", "http://127.0.0.1:1",
                          "--listen-peer-urls", "http://127.0.0.1:%d" % free_port(), "--log-format", "json"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    eline = json.loads(e.stderr.readline())
    e.kill()
    e.wait()
    k = Kvd(KVD, args=["--log-format", "json"])
    k.stop()
    lines = [json.loads(l) for l in k.logtext().splitlines()]
    tsre = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$"
    check(all({"level", "ts", "caller", "msg"} <= set(x) and re.match(tsre, x["ts"]) for x in lines + [eline]) and
          any(x["msg"].startswith("serving client requests on") and x["level"] == "info" for x in lines),
          "json lines with etcd's keys and ts: kvd %r, etcd %r" % (lines[:2], eline))
    d = tempfile.mkdtemp(prefix="kvd-logfmt-")
    with open(d + "/c.yml", "w") as f:
        f.write("data-dir: %s/data\nlisten-client-urls: http://127.0.0.1:%d\nlog-format: console\n" % (d, free_port()))
    k = Kvd(KVD, args=["--config-file", d + "/c.yml"])
    k.stop()
    check(any(re.match(r"^\d{4}-\d\d-\d\dT[\d:.]+Z\tinfo\tkvd\tserving client requests on", l)
              for l in k.logtext().splitlines()), "console from the config file: %r" % k.logtext()[:300])
    r = run(["--log-format", "xml", "--data-dir", d + "/x"])
    check(r.returncode == 2 and "unknown log format: xml, supported values json, console" in r.stderr and
          not os.path.exists(d + "/x"), "a bad format: %r" % r.stderr)
    shutil.rmtree(d)


def _auth_probe(endpoint):
    """root with password rootpw, auth on; then a wrong password, a user
    nobody added (a newline in the name), a token nobody issued."""
    R = pb()["rpc"]
    c = Client(endpoint)

    def call(method, req, resp, token=None, svc="Auth"):
        f = c.ch.unary_unary("/etcdserverpb.%s/%s" % (svc, method), request_serializer=lambda m: m.SerializeToString(),
                             response_deserializer=getattr(R, resp).FromString)
        try:
            return ("ok", f(req, timeout=60, metadata=[("token", token)] if token else None))
        except c.grpc.RpcError as e:
            return ("err", e.code().name)

    call("UserAdd", R.AuthUserAddRequest(name="root", password="rootpw"), "AuthUserAddResponse")
    call("RoleAdd", R.AuthRoleAddRequest(name="root"), "AuthRoleAddResponse")
    call("UserGrantRole", R.AuthUserGrantRoleRequest(user="root", role="root"), "AuthUserGrantRoleResponse")
    got = [call("AuthEnable", R.AuthEnableRequest(), "AuthEnableResponse")[0],
           call("Authenticate", R.AuthenticateRequest(name="root", password="wrong"), "AuthenticateResponse"),
           call("Authenticate", R.AuthenticateRequest(name="no\nbody", password="x"), "AuthenticateResponse"),
           call("Range", R.RangeRequest(key=b"a"), "RangeResponse", token="not-a-token", svc="KV")]
    c.close()
    return got


@test
def failed_authentication_is_logged_as_etcd():
    """What operators grep etcd's log for, side by side with etcd 3.7.3 (its
    JSON lines): a wrong password is "invalid password" (info, user-name),
    every refused Authenticate "invalid authentication was requested" (warn,
    user, the auth error), a token nobody issued "invalid auth token" with
    the same token-fingerprint etcd computes, never the token; a name's
    newline cannot split kvd's line."""
    from kvdtest import oracle
    d = tempfile.mkdtemp(prefix="kvd-authlog-")
    port = free_port()
    with open(d + "/etcd.log", "wb") as elog:
        e = subprocess.Popen([oracle(), "--data-dir", d + "/etcd", "--listen-client-urls", "http://127.0.0.1:%d" % port,
                              "--advertise-client-urls", "http://127.0.0.1:%d" % port, "--listen-peer-urls",
                              "http://127.0.0.1:%d" % free_port(), "--log-format", "json", "--bcrypt-cost", "4"],
                             stdout=subprocess.DEVNULL, stderr=elog)
        try:
            check(wait_for(lambda: healthy(port), 60), "etcd serves")
            eans = _auth_probe("127.0.0.1:%d" % port)
        finally:
            e.terminate()
            e.wait()
    ej = [json.loads(l) for l in open(d + "/etcd.log") if l.startswith("{")]
    k = Kvd(KVD, args=["--bcrypt-cost", "4"])
    kans = _auth_probe(k.endpoint())
    k.stop()
    check(eans == kans, "the same answers: etcd %r, kvd %r" % (eans, kans))
    t = k.logtext()
    pw = [x for x in ej if x["msg"] == "invalid password"]
    check(pw and pw[0]["level"] == "info" and pw[0]["user-name"] == "root", "etcd: %r" % pw)
    check(re.search(r' I \| kvd: invalid password: user-name "root"\n', t), "kvd's invalid password: %r" % t[-900:])
    req = [x for x in ej if x["msg"] == "invalid authentication was requested"]
    check([(x["level"], x["user"], x["error"]) for x in req] ==
          [("warn", "root", "auth: authentication failed, invalid user ID or password"),
           ("warn", "no\nbody", "auth: authentication failed, invalid user ID or password")], "etcd: %r" % req)
    for who in ("root", "no\\x0abody"):
        check(' W | kvd: invalid authentication was requested: user "%s": auth: authentication failed, invalid user '
              'ID or password\n' % who in t, "kvd's warning for %s: %r" % (who, t[-900:]))
    tok = [x for x in ej if x["msg"] == "invalid auth token"]
    check(len(tok) == 1 and tok[0]["level"] == "warn", "etcd: %r" % tok)
    check(tok and ' W | kvd: invalid auth token: token-fingerprint %s\n' % tok[0]["token-fingerprint"] in t,
          "kvd's, with etcd's fingerprint: %r" % t[-900:])
    check("not-a-token" not in t and "not-a-token" not in open(d + "/etcd.log").read(), "never the token")
    shutil.rmtree(d)


@test
def debug_level_request_stats_and_slow_calls_as_etcd():
    """--log-level debug adds etcd's "request stats" line for each unary call
    (method, remote, time spent, status, sizes); at info a call slower than
    --warning-unary-request-duration (300 ms) is the same line as a warning
    (the test build's injected fdatasync delay makes a Put slow)."""
    R = pb()["rpc"]
    k = Kvd(KVD, args=["--log-level", "debug"])
    c = Client(k.endpoint())
    c.call("Put", R.PutRequest(key=b"a", value=b"1"))
    check(c.call("Range", R.RangeRequest(key=b"zz"))[0] == "ok", "a range")
    c.close()
    k.stop()
    t = k.logtext()
    check(re.search(r" D \| kvd: request stats: method /etcdserverpb\.KV/Put, remote 127\.0\.0\.1:\d+, time spent "
                    r"\d+\.\d{3}ms, status OK, request size 6, response size \d+\n", t) and
          re.search(r" D \| kvd: request stats: method /etcdserverpb\.KV/Range, .*, status OK, request size 4, ", t),
          "debug lines: %r" % t[-900:])
    kt = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))
    os.environ["KVD_TEST_FSYNC_DELAY_MS"] = "60"
    try:
        k = Kvd(kt, args=["--warning-unary-request-duration", "50ms"])
    finally:
        del os.environ["KVD_TEST_FSYNC_DELAY_MS"]
    c = Client(k.endpoint())
    c.call("Put", R.PutRequest(key=b"a", value=b"1"), timeout=30)
    c.call("Range", R.RangeRequest(key=b"a"))
    c.close()
    k.stop()
    t = k.logtext()
    check(re.search(r" W \| kvd: request stats: method /etcdserverpb\.KV/Put, .*time spent \d+\.\d{3}ms, status OK", t)
          and "KV/Range" not in t and " D | " not in t, "one warning, for the slow Put: %r" % t[-900:])


@test
def slow_fdatasync_is_warned_about():
    """An fdatasync over 1 s (a worn SD card; here the test build's injected
    delay) is logged as etcd logs it: "slow fdatasync", took, expected 1s."""
    kt = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))
    os.environ["KVD_TEST_FSYNC_DELAY_MS"] = "1100"
    try:
        k = Kvd(kt)
    finally:
        del os.environ["KVD_TEST_FSYNC_DELAY_MS"]
    c = Client(k.endpoint())
    c.call("Put", pb()["rpc"].PutRequest(key=b"a", value=b"1"), timeout=30)
    c.close()
    k.stop()
    check(re.search(r"W \| kvd: slow fdatasync: took \d+\.\d{3}s, expected-duration 1s", k.logtext()),
          "the warning: %r" % k.logtext()[-400:])


@test
def unused_tls_flags_are_said():
    """--cert-file/--key-file with no https:// listener: served (as etcd),
    with a warning for each, so a forgotten https:// is found."""
    d = tempfile.mkdtemp(prefix="kvd-tls-unused-")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", d + "/k.pem", "-out", d + "/c.pem", "-days", "3", "-subj", "/CN=t"],
                   check=True, capture_output=True)
    k = Kvd(KVD, data_dir=d + "/data", args=["--cert-file", d + "/c.pem", "--key-file", d + "/k.pem"])
    k.stop()
    t = k.logtext()
    check("W | kvd: --cert-file is set, but no listener is https:// or unixs://: it is not used" in t and
          "--key-file is set, but no listener" in t and "serving client requests" in t, "warned: %r" % t[:500])
    shutil.rmtree(d)


@test
def salvage_a_log_damaged_mid_file():
    """A byte flipped mid-log: kvd refuses (exit 1) naming --salvage-log;
    with it the whole log is saved as kvd.log.damaged first (byte for
    byte), the log kept up to the damage, and the log says what was lost
    (bytes, revisions); the keys written before the damage are served."""
    k = Kvd(KVD)
    c = Client(k.endpoint())
    R = pb()["rpc"]
    revs = [c.call("Put", R.PutRequest(key=b"k%02d" % i, value=b"v" * 300))[1].header.revision for i in range(30)]
    c.close()
    check(k.stop() == 0, "stopped")
    log = os.path.join(k.dir, "kvd.log")
    with open(log, "r+b") as f:
        f.seek(os.path.getsize(log) // 2)
        f.write(b"\xff\xff")
    with open(log, "rb") as f:
        damaged = f.read()
    r = run(["--data-dir", k.dir, "--listen-client-urls", "http://127.0.0.1:%d" % free_port()])
    check(r.returncode == 1 and "--salvage-log" in r.stderr, "refused, naming --salvage-log: %r" % r.stderr)
    k = Kvd(KVD, data_dir=k.dir, args=["--salvage-log"])
    c = Client(k.endpoint())
    got = c.call("Range", R.RangeRequest(key=b"k", range_end=b"l"))[1]
    c.close()
    k.stop()
    t = k.logtext()
    m = re.search(r"kept the (\d+) bytes before the damage \(revision (\d+)\), dropped (\d+) bytes", t)
    lost = re.search(r"revisions (\d+) to (\d+) are lost", t)
    with open(log + ".damaged", "rb") as f:
        saved = f.read()
    check(saved == damaged, "the whole log saved first, byte for byte")
    check(m and lost and int(m.group(1)) + int(m.group(3)) == len(damaged) and int(lost.group(2)) == revs[-1] and
          int(lost.group(1)) == int(m.group(2)) + 1, "what went is said: %r" % t[:600])
    kept = int(m.group(2)) if m else -1
    check(got.header.revision == kept and [x.mod_revision for x in got.kvs] == [v for v in revs if v <= kept] and
          len(got.kvs) > 5, "the writes before the damage are served: %d keys at %d" % (len(got.kvs), got.header.revision))


@test
def long_work_says_it_begins():
    """A replay of a large log and an import say they begin (a slow board's
    operator sees kvd working, not a silent process), then what they did."""
    k = Kvd(KVD)
    c = Client(k.endpoint())
    R = pb()["rpc"]
    for i in range(600):  # a 4.8 MiB log
        c.call("Put", R.PutRequest(key=b"k%03d" % (i % 50), value=b"v" * 8000))
    snap = os.path.join(k.dir, "..", os.path.basename(k.dir) + ".db")
    c.close()
    check(k.stop() == 0, "stopped")
    r = run(["--data-dir", k.dir, "--snapshot-save", snap])
    check(r.returncode == 0, "a snapshot saved: %r" % r.stderr)
    k = Kvd(KVD, data_dir=k.dir)
    k.stop()
    lines = k.logtext().splitlines()
    i = [n for n, l in enumerate(lines) if "replaying the log: " in l]
    j = [n for n, l in enumerate(lines) if "log replayed: " in l]
    check(i and j and i[0] < j[0] and re.search(r"replaying the log: \d{7,} bytes$", lines[i[0]]),
          "the replay says it begins: %r" % lines[:3])
    d = tempfile.mkdtemp(prefix="kvd-import-")
    k = Kvd(KVD, data_dir=d + "/new", args=["--restore-snapshot", snap])
    k.stop()
    t = k.logtext()
    check(re.search(r"importing \S+\.db \(\d+ bytes\) into %s/new\n" % re.escape(d), t) and
          t.index("importing ") < t.index("imported "), "the import says it begins: %r" % t[:400])
    shutil.rmtree(d)
    os.unlink(snap)


@test
def long_work_says_how_far_it_is():
    """On a slow board (the test build's KVD_TEST_SLOW_MS: a replay sleeps
    every 1024 records, an import too, a rewrite every slice, a snapshot
    every chunk) an import, a replay, a rewrite and a snapshot that run past
    5 s log how far they are, every 5 s, between their first and last
    lines."""
    kt = os.path.abspath(os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test")))
    R = pb()["rpc"]
    k = Kvd(kt, args=["--unsafe-no-fsync"])
    c = Client(k.endpoint())
    for i in range(4200):
        c.call("Put", R.PutRequest(key=b"k%04d" % (i % 800), value=b"v" * 100))
    c.close()
    check(k.stop() == 0, "stopped")
    snap = k.dir + ".db"
    r = run(["--data-dir", k.dir, "--snapshot-save", snap])
    check(r.returncode == 0, "saved: %r" % r.stderr)
    os.environ["KVD_TEST_SLOW_MS"] = "1300"
    try:
        imp = Kvd(kt, data_dir=k.dir + ".imported", args=["--restore-snapshot", snap])
    finally:
        del os.environ["KVD_TEST_SLOW_MS"]
    imp.stop()
    t = imp.logtext()
    check(re.search(r"importing \S+ \(\d+ bytes\) into .*\n(.*\n)*.*importing: \d+ key records so far, revision \d+, "
                    r"\d+ bytes written\n(.*\n)*.*imported \d+ key records", t), "the import's progress: %r" % t[-900:])
    os.unlink(snap)
    os.environ["KVD_TEST_SLOW_MS"] = "1300"
    try:
        k = Kvd(kt, data_dir=k.dir, args=["--auto-rewrite=false"])
    finally:
        del os.environ["KVD_TEST_SLOW_MS"]
    c = Client(k.endpoint())
    check(c.call("Defragment", R.DefragmentRequest(), service="etcdserverpb.Maintenance",
                 resp="DefragmentResponse", timeout=120)[0] == "ok", "defragmented")
    rev = c.call("Range", R.RangeRequest(key=b"k"))[1].header.revision
    check(c.call("Compact", R.CompactionRequest(revision=rev, physical=True))[0] == "ok", "compacted")
    snap = c.stream("Snapshot", R.SnapshotRequest(), "SnapshotResponse", service="etcdserverpb.Maintenance",
                    timeout=120)
    check(snap[0] == "ok" and len(snap[1]) >= 6, "a snapshot of 6 chunks or more: %r" % (snap[:1] + (len(snap[1]),),))
    c.close()
    k.stop()
    lines = k.logtext().splitlines()

    def at(pat):
        return [n for n, l in enumerate(lines) if re.search(pat, l)]
    prog = at(r"replaying the log: \d+ of \d+ bytes \(\d+%\), revision \d+$")
    done = at(r"log replayed: ")
    check(prog and done and prog[0] < done[0], "the replay's progress: %r" % lines[:6])
    start, end = at(r"log rewrite started \(Defragment\)"), at(r"log rewritten: ")
    prog = at(r"log rewrite: [a-z ]+, \d+ of \d+ (bytes read \(\d+%\)|keys), \d+ bytes written$")
    check(start and end and prog and start[0] < prog[0] < end[0], "the rewrite's progress: %r" % lines[-8:])
    start, end = at(r"snapshot at revision %d: \d+ bytes, " % rev), at(r"snapshot at revision %d sent" % rev)
    prog = at(r"snapshot at revision %d: \d+ of \d+ bytes \(\d+%%\)$" % rev)
    check(start and end and prog and start[0] < prog[0] < end[0], "the snapshot's progress: %r" % lines[-8:])


@test
def log_outputs_stdout_file_and_syslog():
    d = tempfile.mkdtemp(prefix="kvd-init-")
    port = free_port()
    p = spawn([KVD, "--data-dir", d + "/a", "--listen-client-urls", "http://127.0.0.1:%d" % port,
               "--log-outputs", "stdout," + d + "/kvd.log"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    check(wait_for(lambda: os.path.exists(d + "/kvd.log") and "serving client requests" in open(d + "/kvd.log").read()),
          "the file gets the lines")
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    out = out.decode()
    check(p.returncode == 0 and not err and "serving client requests" in out and out.endswith("I | kvd: stopped\n"),
          "stdout gets them, stderr none: %r %r" % (out[-200:], err[-200:]))
    check(out == open(d + "/kvd.log").read(), "the file and stdout hold the same lines")
    # appended, never truncated
    p = spawn([KVD, "--data-dir", d + "/a", "--listen-client-urls", "http://127.0.0.1:%d" % port,
               "--log-outputs", d + "/kvd.log"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    check(wait_for(lambda: open(d + "/kvd.log").read().count("serving client requests") == 2), "appended")
    p.terminate()
    p.wait(30)
    # syslog: priority daemon.info (30) / daemon.warning (28), ident kvd[pid], no timestamp of ours
    with open(d + "/a/kvd.log", "ab") as f:
        f.write(b"K\x01\x02")  # a torn tail: cut with a warning
    sl = Syslog()
    p = spawn(sl.wrap([KVD, "--data-dir", d + "/a", "--listen-client-urls", "http://127.0.0.1:%d" % port,
                       "--log-outputs", "syslog", "--unsafe-no-fsync"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    check(sl.saw("serving client requests"), "syslog gets the lines")
    p.send_signal(signal.SIGHUP)
    check(sl.saw("SIGHUP: reading"), "SIGHUP is logged")
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    check(p.returncode == 0 and not out and not err, "nothing on stdout/stderr: %r %r" % (out, err))
    check(wait_for(lambda: any("kvd: stopped" in l or "]: stopped" in l for l in sl.read()), 60), "the last line")
    lines = sl.read()
    info = [l for l in lines if "serving client requests" in l][0]
    # RFC 3164 without a TIMESTAMP: the syslog daemon stamps it in its own time zone
    check(re.match(r"<30>kvd\[%d\]: serving client requests on 127\.0\.0\.1:%d " % (p.pid, port), info) is not None,
          "daemon.info, ident kvd[pid]: %r" % info)
    check(any(l.startswith("<28>") for l in lines), "a warning is daemon.warning: %r" % lines[:4])
    check(not any(" I | " in l for l in lines), "no timestamp of kvd's in syslog lines")
    # a start that fails reaches every output, not stderr alone: a locked data
    # dir (a kvd serves it), a corrupt log -- in the file and in syslog
    k = Kvd(KVD, data_dir=d + "/a")
    p = spawn(sl.wrap([KVD, "--data-dir", d + "/a", "--listen-client-urls", "http://127.0.0.1:%d" % free_port(),
                       "--log-outputs", "syslog," + d + "/fail.log"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=60)
    for i in range(20):
        etcdctl(k, "put", "k%d" % i, "v" * 50)
    k.stop()
    text = open(d + "/fail.log").read()
    check(p.returncode == 1 and "is in use by another kvd" in err.decode() and
          " E | kvd: cannot start: data dir %s/a is in use by another kvd" % d in text and
          sl.saw("cannot start: data dir %s/a is in use" % d),
          "a locked data dir: stderr, the file and syslog: %d %r %r" % (p.returncode, err[-200:], text[-300:]))
    with open(d + "/a/kvd.log", "r+b") as f:  # valid records follow the damage: corruption, not a torn tail
        f.seek(os.path.getsize(d + "/a/kvd.log") // 2)
        f.write(b"\xff\xff")
    r = subprocess.run([KVD, "--data-dir", d + "/a", "--listen-client-urls", "http://127.0.0.1:%d" % free_port(),
                        "--log-outputs", d + "/fail.log"], capture_output=True, text=True, timeout=60)
    text = open(d + "/fail.log").read()
    check(r.returncode == 1 and "cannot start: %s/a/kvd.log: " % d in text and "refusing to start" in text.splitlines()[-1],
          "a damaged log: in the file too: %d %r" % (r.returncode, text[-300:]))
    sl.close()
    shutil.rmtree(d)


# ------------------------------------------------------------------ config file
SAMPLE = """# This is the configuration file for the etcd server (the shape of etcd 3.4's sample, with keys
# 3.7 added and keys it removed, which its YAML decoding ignores).
name: 'cfg-member'
data-dir: %(dir)s
wal-dir:
snapshot-count: 10000
heartbeat-interval: 100
election-timeout: 1000
quota-backend-bytes: 0
listen-peer-urls: http://127.0.0.1:%(peer)d
listen-client-urls: http://127.0.0.1:%(port)d
max-snapshots: 5
max-wals: 5
cors:
initial-advertise-peer-urls: http://127.0.0.1:%(apeer)d
advertise-client-urls: http://127.0.0.1:%(port)d
discovery:
discovery-fallback: 'proxy'
discovery-proxy:
discovery-srv:
initial-cluster:
initial-cluster-token: 'kvd-cfg-cluster'
initial-cluster-state: 'new'
strict-reconfig-check: false
enable-v2: false
enable-pprof: false
proxy: 'off'
proxy-failure-wait: 5000
proxy-refresh-interval: 30000
proxy-dial-timeout: 1000
proxy-write-timeout: 5000
proxy-read-timeout: 0
client-transport-security:
  # Path to the client server TLS cert file.
  cert-file:
  key-file:
  client-cert-auth: false
  trusted-ca-file:
  auto-tls: false
peer-transport-security:
  cert-file:
  key-file:
  client-cert-auth: false
  trusted-ca-file:
  auto-tls: false
debug: false
logger: zap
log-outputs: [stderr]
force-new-cluster: false
auto-compaction-mode: periodic
auto-compaction-retention: "1"
experimental-compaction-batch-limit: 500
feature-gates: InitialCorruptCheck=true
watch-progress-notify-interval: 600000000000
max-txn-ops: 3
"""


@test
def config_file_as_etcd_reads_it():
    """The same file (but its ports and data dir) for etcd and kvd: same
    member id and name, same max-txn-ops refusal; flags beside it ignored."""
    apeer = free_port()
    answers = []
    for server in ("etcd", "kvd"):
        d = tempfile.mkdtemp(prefix="kvd-cfg-")
        port = free_port()
        path = os.path.join(d, "conf.yml")
        with open(path, "w") as f:
            f.write(SAMPLE % {"dir": d + "/data", "peer": apeer if server == "etcd" else free_port(),
                              "apeer": apeer, "port": port})
        cmd = [kvdtest.oracle(), "--config-file", path] if server == "etcd" else \
            [KVD, "--config-file", path, "--name", "ignored", "--max-txn-ops", "100"]
        p = spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ, ETCD_NAME="ignored2"))
        check(wait_for(lambda: healthy(port), 60), "%s serves from its config file" % server)
        rc, out, err = etcdctl("127.0.0.1:%d" % port, "member", "list", "-w", "json")
        m = json.loads(out)["members"][0] if rc == 0 else {}
        r = subprocess.run(["etcdctl", "--endpoints", "127.0.0.1:%d" % port, "txn"], input="\nput a 1\nput b 2\n"
                           "put c 3\nput d 4\n\n\n", capture_output=True, text=True, timeout=20,
                           env=dict(os.environ, ETCDCTL_API="3"))
        answers.append((m.get("ID"), m.get("name"), m.get("peerURLs"), r.stderr.strip().splitlines()[-1:]))
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        shutil.rmtree(d)
    check(answers[0] == answers[1] and answers[0][1] == "cfg-member" and "too many operations" in str(answers[0][3]),
          "etcd and kvd read the file alike: %r" % answers)


def gateway_on(port):
    """Does the JSON gateway answer at port (a Range through it)?"""
    import http.client
    try:
        h = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        h.request("POST", "/v3/kv/range", body='{"key":"YQ=="}')
        st = h.getresponse().status
        h.close()
        return st == 200
    except OSError:
        return None


@test
def booleans_as_etcd_reads_them():
    """A bool in the config file takes YAML 1.1's words as go-yaml resolves
    them (y, YES, ON, n, NO, Off, ...), and an empty ETCD_* variable sets
    nothing (ETCD_CLIENT_CERT_AUTH= is false): beside etcd 3.7.3."""
    got = {}
    for word in ("y", "YES", "ON", "On", "True", "n", "NO", "OFF", "Off", "FALSE"):
        for server in ("etcd", "kvd"):
            d = tempfile.mkdtemp(prefix="kvd-cfg-")
            port = free_port()
            path = os.path.join(d, "conf.yml")
            with open(path, "w") as f:
                f.write("name: b\ndata-dir: %s/data\nlisten-client-urls: http://127.0.0.1:%d\n"
                        "advertise-client-urls: http://127.0.0.1:%d\nlisten-peer-urls: http://127.0.0.1:%d\n"
                        "initial-advertise-peer-urls: http://127.0.0.1:%d\ninitial-cluster: b=http://127.0.0.1:%d\n"
                        "enable-grpc-gateway: %s\n" % (d, port, port, free_port(), 2380, 2380, word))
            cmd = [kvdtest.oracle(), "--config-file", path] if server == "etcd" else [KVD, "--config-file", path]
            p = spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            up = wait_for(lambda: healthy(port) or p.poll() is not None, 60) and p.poll() is None
            got[(word, server)] = gateway_on(port) if up else "exit %s" % p.poll()
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
            shutil.rmtree(d)
        check(got[(word, "etcd")] == got[(word, "kvd")] and got[(word, "kvd")] == (word in ("y", "YES", "ON", "On", "True")),
              "enable-grpc-gateway: %s -- etcd %s, kvd %s" % (word, got[(word, "etcd")], got[(word, "kvd")]))
    for server in ("etcd", "kvd"):
        d = tempfile.mkdtemp(prefix="kvd-env-")
        port = free_port()
        env = dict(os.environ, ETCD_CLIENT_CERT_AUTH="", ETCD_ENABLE_GRPC_GATEWAY="", ETCD_DATA_DIR=d + "/data",
                   ETCD_LISTEN_CLIENT_URLS="http://127.0.0.1:%d" % port,
                   ETCD_ADVERTISE_CLIENT_URLS="http://127.0.0.1:%d" % port,
                   ETCD_LISTEN_PEER_URLS="http://127.0.0.1:%d" % free_port())
        p = spawn([kvdtest.oracle() if server == "etcd" else KVD], stdout=subprocess.DEVNULL,
                  stderr=subprocess.PIPE, env=env)
        up = wait_for(lambda: healthy(port) or p.poll() is not None, 60) and p.poll() is None
        check(up and gateway_on(port), "%s: empty ETCD_CLIENT_CERT_AUTH= and ETCD_ENABLE_GRPC_GATEWAY= "
              "set nothing (exit %s)" % (server, p.poll()))
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
        shutil.rmtree(d)


@test
def config_file_refusals_name_the_line():
    d = tempfile.mkdtemp(prefix="kvd-cfg-")
    cases = [
        ("name: a\nlisten-client-url: http://127.0.0.1:1\n", 'line 2: unknown key "listen-client-url"'),
        ("name: a\n\nheartbeat-interval: often\n", "line 3: invalid value \"often\" for flag --heartbeat-interval"),
        ("name: a\nclient-transport-security:\n  cert-file: /x\n  verify: true\n",
         'line 4: unknown key in client-transport-security "verify"'),
        ("name: *anchor\n", "line 1: unsupported YAML"),
        ("log-outputs:\n\t- stderr\n", "line 2: tab in indentation"),
        ("client-transport-security:\n  cert-file: %s/none.pem\n  key-file: %s/none.key\n"
         "listen-client-urls: https://127.0.0.1:1\n" % (d, d), "none.pem"),
    ]
    for text, want in cases:
        with open(d + "/c.yml", "w") as f:
            f.write(text)
        r = subprocess.run([KVD, "--config-file", d + "/c.yml", "--data-dir", d + "/data"], cwd=d,
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and want in r.stderr, "%r: %d %r" % (want, r.returncode, r.stderr))
        check(not os.path.exists(d + "/data") and not os.path.exists(d + "/default.etcd"), "nothing created")
    shutil.rmtree(d)


# ------------------------------------------------------------------ FIFOs
@test
def fifos_where_files_belong():
    """Every file a flag names is opened without blocking and must be a
    regular file: a FIFO is refused at start (exit 2, before the data dir),
    never waited on; on SIGHUP a FIFO is refused and the old file kept."""
    d = tempfile.mkdtemp(prefix="kvd-fifo-")
    dd = os.path.join(d, "data")
    fifo = os.path.join(d, "fifo")
    os.mkfifo(fifo)
    link = os.path.join(d, "link")
    os.symlink(fifo, link)
    cert, key = os.path.join(d, "c.pem"), os.path.join(d, "k.pem")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", key, "-out", cert, "-days", "30", "-subj", "/CN=kvd-fifo",
                        "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True, text=True)
    check(r.returncode == 0, "a certificate: %s" % r.stderr[-300:])
    hmac_key = os.path.join(d, "hmac.key")
    with open(hmac_key, "w") as f:
        f.write("5f2b7c0e9a1d4e8b3c6f0a2d5e8b1c4f7a0d3e6b\n")
    os.chmod(hmac_key, 0o600)
    yaml = os.path.join(d, "fifo.yml")
    with open(yaml, "w") as f:
        f.write("data-dir: %s\nlisten-client-urls: https://127.0.0.1:%d\nclient-transport-security:\n"
                "  cert-file: %s\n  key-file: %s\n" % (dd, free_port(), fifo, key))

    def https():
        return ["--listen-client-urls", "https://127.0.0.1:%d" % free_port()]
    nonreg = "%s: not a regular file"
    enxio = "--log-outputs: cannot open %s: No such device or address"  # O_WRONLY|O_NONBLOCK, no reader: ENXIO
    F = "@F@"  # where the case's path goes
    cases = [  # args naming F, what stderr must say ("%s": the path), the same through a symlink to it
        (["--config-file", F], "--config-file " + nonreg, None),
        (["--cert-file", F, "--key-file", key] + https(), "--cert-file " + nonreg, None),
        (["--cert-file", cert, "--key-file", F] + https(), "--key-file " + nonreg, None),
        (["--cert-file", cert, "--key-file", key, "--trusted-ca-file", F] + https(), "--trusted-ca-file " + nonreg, None),
        (["--cert-file", cert, "--key-file", key, "--trusted-ca-file", cert, "--client-cert-auth",
          "--client-crl-file", F] + https(), "--client-crl-file " + nonreg, None),
        (["--auto-tls", "--trusted-ca-file", F] + https(), "--trusted-ca-file " + nonreg, None),
        # the key file is opened O_NOFOLLOW (as before): a symlink is refused as one
        (["--confd-hmac-key-file", F], "--confd-hmac-key-file " + nonreg,
         "--confd-hmac-key-file %s: Too many levels of symbolic links"),
        (["--restore-snapshot", F], "--restore-snapshot " + nonreg, None),
        (["--auth-token", "jwt,sign-method=RS256,pub-key=" + F], "--auth-token: pub-key " + nonreg, None),
        (["--auth-token", "jwt,sign-method=ES256,priv-key=" + F], "--auth-token: priv-key " + nonreg, None),
        (["--auth-token", "jwt,sign-method=HS256,priv-key=" + F], "--auth-token: priv-key " + nonreg, None),
        (["--log-outputs", F], enxio, None),
        (["--log-outputs", "stderr," + F], enxio, None),
    ]

    def attempt(args):
        a = ["--data-dir", dd] + args  # never the default ports: a kvd that starts must not take 2379 or 1814
        if "--listen-client-urls" not in args:
            a += ["--listen-client-urls", "http://127.0.0.1:%d" % free_port()]
        if "--confd-hmac-key-file" in args:
            a += ["--confd-listen", "127.0.0.1:%d" % free_port()]
        try:
            r = run(a, timeout=30)
            return r.returncode, r.stderr
        except subprocess.TimeoutExpired as e:  # blocked (or started): run() killed it
            err = e.stderr or b""
            return "blocked for 30 s", err.decode(errors="replace") if isinstance(err, bytes) else err

    for args, want, via_link in cases:
        for path, w in ((fifo, want), (link, via_link or want)):
            a = [x.replace(F, path) for x in args]
            rc, err = attempt(a)
            check(rc == 2 and (w % path) in err and len(err.strip().splitlines()) == 1,
                  "%s: exit 2 with %r: %s %r" % (a, w % path, rc, err[-300:]))
            check(not os.path.exists(dd), "%s: the data dir was not created" % a)
            shutil.rmtree(dd, ignore_errors=True)
    # the same through a config file's client-transport-security
    rc, err = attempt(["--config-file", yaml])
    check(rc == 2 and ("--cert-file " + nonreg % fifo) in err and not os.path.exists(dd),
          "a config file naming a FIFO as its cert-file: %s %r" % (rc, err[-300:]))
    # the positive control: a regular file, wrong in content, is read and refused (not waited on either)
    junk, empty = os.path.join(d, "junk"), os.path.join(d, "empty")
    for path, text in ((junk, "junk\n"), (empty, "")):
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o600)
    for args, want, _ in cases:
        if args[0] == "--log-outputs":
            continue  # a regular file is a fine log
        bad = empty if args[0] == "--confd-hmac-key-file" or "HS256" in args[-1] else junk  # any bytes are a key
        a = [x.replace(F, bad) for x in args]
        rc, err = attempt(a)
        check(rc == 2 and "not a regular file" not in err and bad in err,
              "%s: refused for its content: %s %r" % (a, rc, err[-300:]))
        shutil.rmtree(dd, ignore_errors=True)
    # a FIFO with a reader is a log output like any other
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    got = [b""]

    def drain():
        while True:
            try:
                b = os.read(rfd, 65536)
            except BlockingIOError:
                break
            if not b:
                break
            got[0] += b
        return b"serving client requests" in got[0]
    p = spawn([KVD, "--data-dir", dd, "--listen-client-urls", "http://127.0.0.1:%d" % free_port(), "--log-outputs",
               fifo], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    check(wait_for(drain), "a FIFO with a reader gets the log lines: %r" % got[0][-300:])
    p.terminate()
    check(p.wait(30) == 0, "and kvd stops cleanly")
    os.close(rfd)
    shutil.rmtree(dd, ignore_errors=True)
    # SIGHUP: the confd key and the certificate become FIFOs; refused, the old ones kept, the loop never blocked
    port = free_port()
    log = os.path.join(d, "run.log")
    ckey, ccert = os.path.join(d, "hmac2.key"), os.path.join(d, "c2.pem")
    shutil.copy(hmac_key, ckey)
    shutil.copy(cert, ccert)
    p = spawn([KVD, "--data-dir", dd, "--listen-client-urls", "https://127.0.0.1:%d" % port, "--cert-file", ccert,
               "--key-file", key, "--confd-hmac-key-file", ckey, "--confd-listen", "127.0.0.1:%d" % free_port(),
               "--log-outputs", log], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    text = lambda: open(log).read() if os.path.exists(log) else ""
    check(wait_for(lambda: "serving client requests" in text()), "kvd serves over TLS: %r" % text()[-300:])

    def tls_healthy():
        rc, out, err = etcdctl("https://127.0.0.1:%d" % port, "--cacert", cert, "endpoint", "health", timeout=20)
        return rc == 0 and "is healthy" in (out + err)
    check(tls_healthy(), "healthy over TLS")
    for f in (ckey, ccert):
        os.unlink(f)
        os.mkfifo(f)
    p.send_signal(signal.SIGHUP)
    check(wait_for(lambda: "confd: key not reloaded" in text() and "TLS reload" in text()),
          "SIGHUP: both refused: %r" % text()[-600:])
    t = text()
    check(("--confd-hmac-key-file %s: not a regular file" % ckey) in t and
          ("--cert-file %s: not a regular file" % ccert) in t, "each says why: %r" % t[-600:])
    p.send_signal(signal.SIGHUP)
    check(wait_for(lambda: text().count("SIGHUP: reading") == 2), "a second SIGHUP handled: the loop runs")
    check(tls_healthy(), "still healthy over TLS with the old certificate")
    p.terminate()
    check(p.wait(30) == 0, "a clean stop")
    shutil.rmtree(d)


# ------------------------------------------------------------------ the README's blocks
@test
def readme_quick_start_verbatim():
    """README's first lines, as written, in a copy of the tree: make run, then
    the etcdctl lines from another shell."""
    text = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"\*\*If you run etcd\*\*[^\n]*\n(?:[^\n]+\n)*\n    (make run)\n\n(?:.*\n)*?"
                  r"then, from another shell[^:]*:\n\n((?:    .*\n)+)", text)
    check(m is not None, "the README's quick start is where the test looks")
    if not m:
        return
    lines = [l[4:] for l in m.group(2).splitlines()]
    if healthy(2379) or socket.socket().connect_ex(("127.0.0.1", 2379)) == 0:
        check(False, "port 2379 is taken: the quick start cannot run as written here")
        return
    d = tempfile.mkdtemp(prefix="kvd-quick-")
    files = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True).stdout.split()
    for f in files:
        if os.path.exists(os.path.join(ROOT, f)):
            os.makedirs(os.path.dirname(os.path.join(d, f)) or d, exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), os.path.join(d, f))
    p = spawn(["sh", "-c", m.group(1)], cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
              start_new_session=True)
    try:
        quick_start(p, d, lines)
    finally:
        os.killpg(p.pid, signal.SIGTERM)  # make and the kvd it started
        p.wait(60)
    check(os.path.exists(os.path.join(d, "default.etcd", "kvd.log")), "data in ./default.etcd")
    shutil.rmtree(d)


@test
def readme_embedding_example():
    """README's Embedding example, as written: its C block saved as example.c
    beside a copy of kvd.c, kvd.h and proto/, its build line run there
    (builds with libev, runs the program), which must exit 0 and print the
    README's output block on a fresh data dir."""
    code, build, want = (readme_block(b) for b in ("embed-example", "embed-build", "embed-output"))
    if not (code and build and want):
        return
    d = tempfile.mkdtemp(prefix="kvd-embed-ex-")
    try:
        for f in ("kvd.c", "kvd.h"):
            shutil.copy2(os.path.join(ROOT, f), d)
        shutil.copytree(os.path.join(ROOT, "proto"), os.path.join(d, "proto"))
        with open(os.path.join(d, "example.c"), "w") as f:
            f.write(code)
        r = subprocess.run(["sh", "-c", build], cwd=d, capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, "the README's build line and example: rc %d: %s" % (r.returncode, r.stderr[-1500:]))
        check(r.stdout == want, "the example prints what the README says: %r, not %r" % (r.stdout, want))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def quick_start(p, d, lines):
    check(wait_for(lambda: healthy(2379), 300), "make run serves on 127.0.0.1:2379")
    outs = []
    for line in lines:
        r = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60, cwd=d)
        outs.append(r)
        check(r.returncode == 0, "%s: %s" % (line, r.stderr[-300:]))
    check(outs[0].stdout.strip() == "OK", "put: %r" % outs[0].stdout)
    got = json.loads(outs[1].stdout) if outs[1].returncode == 0 else {}
    kv = got.get("kvs", [{}])[0]
    check(kv.get("key") == "Z3JlZXRpbmc=" and kv.get("value") == "aGVsbG8=", "get -w json: %r" % got)
    check("127.0.0.1:2379" in outs[2].stdout and "3.7.3" in outs[2].stdout, "endpoint status table: %r" % outs[2].stdout)


def notify_socket(d):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(os.path.join(d, "notify"))
    s.settimeout(60)
    return s


@test
def readme_systemd_unit():
    out = packages()
    if not out:
        return
    unit = written(out, "systemd/kvd.service", "systemd-unit")  # make install's /usr/local/bin/kvd
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.optionxform = str
    cp.read_string(unit)
    svc = cp["Service"]
    check(svc.get("Type") == "notify" and svc.get("RestartPreventExitStatus") == "2" and "WatchdogSec" in svc and
          svc.get("NoNewPrivileges") == "yes" and svc.get("ProtectSystem") == "strict", "the unit's settings")
    d = tempfile.mkdtemp(prefix="kvd-unit-")
    if shutil.which("systemd-analyze"):
        u = os.path.join(d, "kvd.service")
        with open(u, "w") as f:
            f.write(unit.replace("/usr/local/bin/kvd", KVD))
        r = subprocess.run(["systemd-analyze", "verify", u], capture_output=True, text=True)
        check(r.returncode == 0, "systemd-analyze verify: %s" % r.stderr[-500:])
    argv = shlex.split(svc["ExecStart"])
    check(argv[0] == "/usr/local/bin/kvd", "ExecStart runs kvd")
    argv = [KVD] + [a.replace("/var/lib/kvd", d + "/state") for a in argv[1:]]
    wd = svc["WatchdogSec"]
    wd_us = int(wd[:-1]) * 1000000 if wd.endswith("s") else int(wd) * 1000000
    s = notify_socket(d)
    port = free_port()
    env = dict(os.environ, NOTIFY_SOCKET=os.path.join(d, "notify"), WATCHDOG_USEC=str(wd_us),
               ETCD_LISTEN_CLIENT_URLS="http://127.0.0.1:%d" % port)
    p = spawn(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ready = s.recv(4096).decode()
    check(ready.startswith("READY=1") and "MAINPID=%d" % p.pid in ready, "READY=1 with MAINPID: %r" % ready)
    check(healthy(port), "serving once READY=1 came")
    mainpid = re.search(r"MAINPID=(\d+)", ready).group(1)
    reload_cmd = shlex.split(svc["ExecReload"].replace("$MAINPID", mainpid))
    check(subprocess.run(reload_cmd).returncode == 0, "ExecReload ran")
    got = [s.recv(4096).decode() for _ in range(2)]
    check(got == ["RELOADING=1", "READY=1"] or got[0] == "WATCHDOG=1", "reload: RELOADING=1, READY=1: %r" % got)
    while "WATCHDOG=1" not in got:  # half of WatchdogSec
        got.append(s.recv(4096).decode())
    p.send_signal(signal.SIGTERM)  # systemd's KillSignal
    while not got[-1].startswith("STOPPING=1"):
        got.append(s.recv(4096).decode())
    check(p.wait(30) == 0, "SIGTERM: exit 0 (not a failure for Restart=on-failure)")
    # a configuration error: 2, which RestartPreventExitStatus keeps from respawning
    env["ETCD_LOG_LEVEL"] = "chatty"
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    check(r.returncode == 2, "configuration error: exit 2: %d %r" % (r.returncode, r.stderr))
    s.close()
    shutil.rmtree(d)


@test
def readme_sysvinit_script():
    """The script make packages writes (README's block), run with Debian's
    start-stop-daemon under /bin/sh, and with busybox's start-stop-daemon
    and sleep under busybox sh, as on a Buildroot or busybox-init board."""
    out = packages()
    if not out:
        return
    text = written(out, "sysvinit/kvd", "sysvinit", mode=0o755)
    if not shutil.which("start-stop-daemon"):
        check(False, "start-stop-daemon missing")
    else:
        sysvinit_script_runs(text, [])
    if not shutil.which("busybox"):
        check(False, "busybox missing (busybox-init boards' start-stop-daemon)")
        return
    bb = tempfile.mkdtemp(prefix="kvd-busybox-")
    for applet in ("start-stop-daemon", "sleep"):
        os.symlink(shutil.which("busybox"), os.path.join(bb, applet))
    sysvinit_script_runs(text, ["busybox", "sh"], path=bb)
    shutil.rmtree(bb)


def sysvinit_script_runs(text, shell, path=None):
    d = tempfile.mkdtemp(prefix="kvd-sysv-")
    script = os.path.join(d, "kvd.init")
    with open(script, "w") as f:
        f.write(text.replace("/var/lib/kvd", d + "/state"))
    os.chmod(script, 0o755)
    port = free_port()
    env = dict(os.environ, DAEMON=KVD, PIDFILE=d + "/kvd.pid", ETCD_LISTEN_CLIENT_URLS="http://127.0.0.1:%d" % port)
    if path:
        env["PATH"] = path + ":" + env["PATH"]
    sl = Syslog()
    what = " ".join(shell) or "sh"

    def check(cond, msg=""):
        return kvdtest.check(cond, "%s: %s" % (what, msg))

    def svc(action, wrap=False):
        cmd = shell + [script, action]
        return subprocess.run(sl.wrap(cmd) if wrap else cmd, env=env, capture_output=True, text=True, timeout=60)

    check(svc("status").returncode == 3, "status before start: 3 (LSB: not running)")
    r = svc("start", wrap=True)
    check(r.returncode == 0, "start: %r" % r.stderr)
    check(wait_for(lambda: healthy(port), 60), "started and serving")
    check(sl.saw("serving client requests"), "its log goes to syslog")
    pid = int(open(d + "/kvd.pid").read())
    r = svc("status")
    check(r.returncode == 0 and "running" in r.stdout, "status: running")
    r = svc("start")
    check(r.returncode == 0 and "already running" in r.stdout and int(open(d + "/kvd.pid").read()) == pid,
          "start again: the same process")
    check(etcdctl("127.0.0.1:%d" % port, "put", "k", "v")[0] == 0, "a write")
    check(svc("reload").returncode == 0 and sl.saw("SIGHUP: reading"), "reload: SIGHUP")
    r = svc("stop")
    check(r.returncode == 0 and not os.path.exists(d + "/kvd.pid"), "stop: %r" % r.stdout)
    check(sl.saw("]: stopped"), "a clean stop")
    check(not os.path.exists("/proc/%d" % pid) or open("/proc/%d/stat" % pid).read().split()[2] == "Z", "gone")
    check(svc("status").returncode == 3, "status after stop: 3")
    r = svc("restart", wrap=True)
    check(r.returncode == 0 and wait_for(lambda: healthy(port), 60), "restart")
    rc, out, _ = etcdctl("127.0.0.1:%d" % port, "get", "k", "--print-value-only")
    check(out.strip() == "v", "the write survived")
    check(svc("stop").returncode == 0, "stop")
    check(svc("bogus").returncode == 2, "usage: 2")
    # a start that fails (its port taken): start says so, non-zero; the
    # reason is in syslog; status: not running
    busy = socket.socket()
    busy.bind(("127.0.0.1", port))
    busy.listen(1)
    r = svc("start", wrap=True)
    check(r.returncode != 0 and "address already in use" in r.stderr and "did not start" in r.stdout,
          "a failed start: exit %d %r %r" % (r.returncode, r.stdout, r.stderr))
    check(sl.saw("cannot start: listen tcp 127.0.0.1:%d: bind: address already in use" % port),
          "the reason in syslog")
    check(svc("status").returncode == 3 and not os.path.exists(d + "/kvd.pid"), "status after it: 3, no pid file")
    busy.close()
    sl.close()
    shutil.rmtree(d)


@test
def makefile_rebuilds_when_flags_change():
    """A firmware tree that changes CFLAGS (or CC, CROSS_COMPILE, a knob)
    gets a new kvd, not "up to date"; the same flags again rebuild nothing."""
    d = tempfile.mkdtemp(prefix="kvd-make-")
    for f in ("kvd.c", "kvd.h", "Makefile"):
        shutil.copy(os.path.join(ROOT, f), d)
    shutil.copytree(os.path.join(ROOT, "proto"), os.path.join(d, "proto"))

    def make(*args):
        r = subprocess.run(["make", "-C", d, "kvd"] + list(args), capture_output=True, text=True, timeout=600)
        return r.returncode, " -o kvd kvd.c" in r.stdout

    check(make("CFLAGS=-O0") == (0, True), "a first build")
    check(make("CFLAGS=-O0") == (0, False), "the same flags: nothing to do")
    check(make("CFLAGS=-O0 -DKVD_FLAGS_CHANGED") == (0, True), "other CFLAGS: built again")
    check(make("CFLAGS=-O0 -DKVD_FLAGS_CHANGED", "HTTP=0") == (0, True), "a knob: built again")
    check(make("CFLAGS=-O0 -DKVD_FLAGS_CHANGED", "HTTP=0") == (0, False), "then nothing to do")
    shutil.rmtree(d)


@test
def library_sources_from_variables_and_a_pool_not_apt():
    """make static's library sources (test/lib/xlibs.sh): a tree named by
    MBEDTLS_SRC/PROTOBUF_C_SRC/MUSL_SRC is used as is; what is missing comes
    from DEBIAN_POOL (here a file:// copy of the pool's layout), checked
    against the pinned SHA-256; a tampered file is refused and named; the
    host's apt sources are never touched."""
    cache = os.environ.get("KVD_CACHE", "/var/cache/kvd-test")
    xlibs = os.path.join(ROOT, "test", "lib", "xlibs.sh")
    real = os.path.join(cache, "src")
    if not os.path.isdir(os.path.join(real, "mbedtls-3.6.6")):
        check(subprocess.run([xlibs, "--sources"], capture_output=True).returncode == 0, "the real cache's sources")
    d = tempfile.mkdtemp(prefix="kvd-xlibs-")
    pool = os.path.join(d, "pool", "p", "protobuf-c")
    os.makedirs(pool)
    for f in ("protobuf-c_1.4.1.orig.tar.gz", "protobuf-c_1.4.1-1.debian.tar.xz"):
        have = [p for p in (os.path.join(real, "dl", f), os.path.join(real, f)) if os.path.exists(p)]
        if have:
            shutil.copy(have[0], pool)
        else:
            subprocess.run(["curl", "-sSfL", "-o", os.path.join(pool, f),
                            "http://deb.debian.org/debian/pool/main/p/protobuf-c/" + f], check=True)

    def apt_state():
        return sorted(os.listdir("/etc/apt/sources.list.d")) if os.path.isdir("/etc/apt/sources.list.d") else []

    before = apt_state()
    env = dict(os.environ, KVD_CACHE=os.path.join(d, "cache"), DEBIAN_POOL="file://" + os.path.join(d, "pool"),
               MBEDTLS_SRC=os.path.join(real, "mbedtls-3.6.6"), MUSL_SRC=os.path.join(real, "musl-1.2.3"))
    r = subprocess.run([xlibs, "--sources"], capture_output=True, text=True, env=env)
    got = os.path.join(d, "cache", "src", "protobuf-c-1.4.1", "protobuf-c", "protobuf-c.c")
    check(r.returncode == 0 and os.path.exists(got), "protobuf-c from the pool: " + r.stdout + r.stderr)
    check(os.path.exists(got) and open(got, "rb").read() ==
          open(os.path.join(real, "protobuf-c-1.4.1", "protobuf-c", "protobuf-c.c"), "rb").read(), "the same source")
    check(not os.path.exists(os.path.join(d, "cache", "src", "mbedtls-3.6.6")), "MBEDTLS_SRC: nothing fetched")
    # a tampered pool: refused, the file named, nothing unpacked
    shutil.rmtree(os.path.join(d, "cache"))
    with open(os.path.join(pool, "protobuf-c_1.4.1-1.debian.tar.xz"), "ab") as f:
        f.write(b"x")
    r = subprocess.run([xlibs, "--sources"], capture_output=True, text=True, env=env)
    check(r.returncode != 0 and "protobuf-c_1.4.1-1.debian.tar.xz" in r.stdout and "PROTOBUF_C_SRC" in r.stdout,
          "a tampered file refused: " + r.stdout + r.stderr)
    check(not os.path.exists(os.path.join(d, "cache", "src", "protobuf-c-1.4.1")), "nothing unpacked")
    # a tree of the wrong version is said so before anything is built
    env["MBEDTLS_SRC"] = os.path.join(d, "cache")
    env["PROTOBUF_C_SRC"] = os.path.join(real, "protobuf-c-1.4.1")
    r = subprocess.run([xlibs, "x", "cc", "-Os", "small", "3.6"], capture_output=True, text=True, env=env)
    check(r.returncode != 0 and "not an mbedtls 3.6 source tree" in r.stdout, "a wrong MBEDTLS_SRC: " + r.stdout)
    check(apt_state() == before, "apt sources untouched: %s -> %s" % (before, apt_state()))
    shutil.rmtree(d)


PROCD_SHIM = r'''
# rc.common and procd, as far as the README's script uses them: the uci file
# is read for real; the instance is recorded (one argument per line).
config_load() { :; }
config_get() {
	v=$(awk -v s="$2" -v o="$3" '
		$1 == "config" { gsub(/'"'"'/, "", $3); sec = $3 }
		$1 == "option" && sec == s && $2 == o { $1 = ""; $2 = ""; sub(/^ +/, ""); gsub(/^'"'"'|'"'"'$/, ""); print; exit }
	' "$UCI")
	[ -n "$v" ] || v=$4
	eval "$1=\$v"
}
procd_open_instance() { : > "$OUT.cmd"; : > "$OUT.params"; }
procd_set_param() {
	p=$1; shift
	if [ "$p" = command ]; then printf '%s\n' "$@" > "$OUT.cmd"; else echo "$p $*" >> "$OUT.params"; fi
}
procd_append_param() { p=$1; shift; [ "$p" = command ] && printf '%s\n' "$@" >> "$OUT.cmd"; }
procd_close_instance() { :; }
procd_add_reload_trigger() { echo "reload_trigger $*" >> "$OUT.params"; }
'''


@test
def readme_openwrt_procd_script_and_uci():
    """The feed's files/kvd.init and files/kvd.config (README's blocks) under
    the procd stand-in."""
    out = packages()
    if not out:
        return
    d = tempfile.mkdtemp(prefix="kvd-procd-")
    init = written(out, "openwrt/kvd/files/kvd.init", "procd-init", mode=0o755)
    check(init.startswith("#!/bin/sh /etc/rc.common\n") and "USE_PROCD=1" in init, "a procd script")
    port = free_port()
    uci = written(out, "openwrt/kvd/files/kvd.config", "uci-config").replace("/srv/kvd", d + "/srv").replace(
        "http://127.0.0.1:2379", "http://127.0.0.1:%d" % port).replace("'info'", "'warn'")
    for name, text in (("kvd.init", init), ("kvd.config", uci), ("shim.sh", PROCD_SHIM)):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    r = subprocess.run(["sh", "-n", d + "/kvd.init"], capture_output=True, text=True)
    check(r.returncode == 0, "sh -n: %s" % r.stderr)
    r = subprocess.run(["sh", "-c", '. "$0/shim.sh"; . "$0/kvd.init"; start_service; service_triggers', d],
                       env=dict(os.environ, UCI=d + "/kvd.config", OUT=d + "/instance"), capture_output=True, text=True)
    check(r.returncode == 0, "start_service ran: %s" % r.stderr)
    argv = open(d + "/instance.cmd").read().splitlines()
    params = open(d + "/instance.params").read()
    check(argv[:1] == ["/usr/bin/kvd"], "the instance runs /usr/bin/kvd: %r" % argv)
    check("respawn 3600 5 5" in params and "reload_signal HUP" in params and "file /etc/config/kvd" in params and
          "reload_trigger kvd" in params, "respawn, reload signal, config file, trigger: %r" % params)
    check(argv[1:] == ["--data-dir", d + "/srv", "--listen-client-urls", "http://127.0.0.1:%d" % port,
                       "--log-level", "warn", "--log-outputs", "syslog", "--auto-compaction-mode", "revision",
                       "--auto-compaction-retention", "1000", "--quota-backend-bytes", "8388608"],
          "uci mapped to flags: %r" % argv)
    sl = Syslog()
    # revision mode's check every 1 s here (etcd's 5 minutes in the field)
    p = spawn(sl.wrap([KVD] + argv[1:]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
              env=dict(os.environ, ETCD_AUTO_COMPACTION_CHECK_INTERVAL="1s"))
    check(wait_for(lambda: healthy(port), 60), "the declared command serves")
    check(os.path.exists(d + "/srv/kvd.log"), "in the uci data_dir")
    # the board settings keep the flash bounded: 4000 overwrites of a 1 KB key
    # (4 MB written) leave the log under 2 MB once compaction and rewrite ran
    c = Client("127.0.0.1:%d" % port)
    for i in range(4000):
        c.call("Put", pb()["rpc"].PutRequest(key=b"status", value=b"%04d" % i * 256))
    c.close()
    logf = d + "/srv/kvd.log"
    check(wait_for(lambda: os.path.getsize(logf) < 2000000, 120),
          "4 MB written, the log bounded by the uci settings: %d bytes" % os.path.getsize(logf))
    p.send_signal(signal.SIGHUP)  # reload_signal
    p.send_signal(signal.SIGTERM)
    check(p.wait(30) == 0, "procd's stop (SIGTERM): exit 0")
    check(not any("serving client requests" in l for l in sl.read()), "--log-level warn from uci: no info lines")
    # a confd key in uci becomes the flag
    uci2 = uci.replace("option confd_hmac_key_file ''", "option confd_hmac_key_file '/etc/ganeti/hmac.key'")
    with open(d + "/kvd.config", "w") as f:
        f.write(uci2)
    subprocess.run(["sh", "-c", '. "$0/shim.sh"; . "$0/kvd.init"; start_service', d],
                   env=dict(os.environ, UCI=d + "/kvd.config", OUT=d + "/instance"), check=True)
    argv = open(d + "/instance.cmd").read().splitlines()
    check(argv[-2:] == ["--confd-hmac-key-file", "/etc/ganeti/hmac.key"], "confd key appended: %r" % argv)
    sl.close()
    shutil.rmtree(d)


RULES_MK = """INCLUDE_DIR := $(TOPDIR)/include
BUILD_DIR := $(TOPDIR)/build_dir
CP := cp -fpR
INSTALL_DIR := install -d -m0755
INSTALL_BIN := install -m0755
INSTALL_CONF := install -m0600
TARGET_CC := mips-linux-gnu-gcc
TARGET_CFLAGS := -Os -pipe -mips16 -minterlink-mips16
TARGET_CPPFLAGS := -I/var/cache/kvd-test/mips-mips16-mbedtls3.6/include
TARGET_LDFLAGS := -L/var/cache/kvd-test/mips-mips16-mbedtls3.6/lib -static
"""
# OpenWrt's default Build/Prepare: PKG_SOURCE into DL_DIR as scripts/download.pl
# fetches from a file:// PKG_SOURCE_URL (the one file of that name found in
# the directory, copied, refused unless its sha256 is PKG_HASH), then
# unpacked into PKG_BUILD_DIR's parent as OpenWrt's unpack does
PACKAGE_MK = r"""PKG_BUILD_DIR := $(BUILD_DIR)/$(PKG_NAME)-$(PKG_VERSION)
IPKG_DIR := $(BUILD_DIR)/ipkg-$(PKG_NAME)
DL_DIR := $(TOPDIR)/dl
define Download/file
	case '$(PKG_SOURCE_URL)' in file://*) ;; *) echo "the stand-in fetches file:// only"; exit 1;; esac
	mkdir -p $(DL_DIR)
	f=$$(find '$(patsubst file://%,%,$(PKG_SOURCE_URL))' -follow -name '$(PKG_SOURCE)'); \
	[ -n "$$f" ] && [ $$(echo "$$f" | wc -l) = 1 ] || { echo "not one $(PKG_SOURCE) in $(PKG_SOURCE_URL)"; exit 1; }; \
	cp "$$f" $(DL_DIR)/$(PKG_SOURCE).dl; \
	h=$$(sha256sum < $(DL_DIR)/$(PKG_SOURCE).dl | cut -d' ' -f1); \
	[ "$$h" = '$(PKG_HASH)' ] || { echo "Hash of the downloaded file does not match (file: $$h, requested: $(PKG_HASH))"; \
	  rm -f $(DL_DIR)/$(PKG_SOURCE).dl; exit 1; }; \
	mv $(DL_DIR)/$(PKG_SOURCE).dl $(DL_DIR)/$(PKG_SOURCE)
endef
define Build/Prepare/Default
	$(Download/file)
	mkdir -p $(PKG_BUILD_DIR)
	gzip -dc $(DL_DIR)/$(PKG_SOURCE) | tar -C $(PKG_BUILD_DIR)/.. -xf -
endef
Build/Prepare = $(Build/Prepare/Default)
define BuildPackage
compile:
	$$(Build/Prepare)
	$$(Build/Compile)
install: compile
	$$(call Package/$(1)/install,$$(IPKG_DIR))
endef
"""


@test
def readme_openwrt_package_makefile():
    """The feed make packages writes, openwrt/kvd: its Makefile (README's block,
    filled in) under the SDK stand-in, which fetches the tarball from its
    file:// PKG_SOURCE_URL, checks PKG_HASH, unpacks it, and builds and
    installs kvd for MIPS16e; a wrong PKG_HASH is refused before anything is
    unpacked."""
    out = packages()
    if not out:
        return
    mk = written(out, "openwrt/kvd/Makefile", "openwrt-makefile")
    v = kvd_version()
    tarball = os.path.join(out, "kvd-%s.tar.gz" % v)
    check("PKG_SOURCE:=$(PKG_NAME)-$(PKG_VERSION).tar.gz\n" in mk and "PKG_VERSION:=%s\n" % v in mk and
          "PKG_SOURCE_URL:=file://%s\n" % out in mk and "PKG_HASH:=%s\n" % sha256(tarball) in mk and
          "DEPENDS:=+libmbedtls +libprotobuf-c\n" in mk and "Build/Prepare" not in mk and
          "define Package/kvd/conffiles\n/etc/config/kvd\nendef" in mk, "a feed package: source, hash, depends")
    if not shutil.which("mips-linux-gnu-gcc") or not shutil.which("qemu-mips"):
        check(False, "mips-linux-gnu-gcc and qemu-mips are needed (test/lib/deps.sh test installs them)")
        return
    # as OpenWrt 24.10 builds for MIPS routers: mbedtls 3.6, MIPS16e (the
    # libraries test/cross.sh builds, the same stamp)
    r = subprocess.run([os.path.join(ROOT, "test", "lib", "xlibs.sh"), "mips-mips16-mbedtls3.6", "mips-linux-gnu-gcc",
                        "-O2 -mips16 -minterlink-compressed", "debian", "3.6"],
                       capture_output=True, text=True)
    check(r.returncode == 0, "mbedtls and protobuf-c for mips: %s" % r.stderr[-300:])
    top = tempfile.mkdtemp(prefix="kvd-sdk-")
    os.makedirs(top + "/include")
    with open(top + "/rules.mk", "w") as f:
        f.write(RULES_MK)
    with open(top + "/include/package.mk", "w") as f:
        f.write(PACKAGE_MK)
    # the feed as src-link uses it: the package directory in place
    pkg = os.path.join(top, "bad")
    shutil.copytree(os.path.join(out, "openwrt", "kvd"), pkg)
    with open(pkg + "/Makefile", "w") as f:
        f.write(mk.replace(sha256(tarball), "0" * 64))
    r = subprocess.run(["make", "-C", pkg, "TOPDIR=" + top, "compile"], capture_output=True, text=True, timeout=600)
    check(r.returncode != 0 and "Hash of the downloaded file does not match" in r.stdout and
          not os.path.exists(os.path.join(top, "build_dir")) and not os.path.exists(top + "/dl/kvd-%s.tar.gz" % v),
          "a wrong PKG_HASH: refused, nothing unpacked: %s" % (r.stdout + r.stderr)[-600:])
    pkg = os.path.join(out, "openwrt", "kvd")
    r = subprocess.run(["make", "-C", pkg, "TOPDIR=" + top, "install"],
                       capture_output=True, text=True, timeout=600)
    check(r.returncode == 0, "the package builds and installs: %s" % (r.stdout + r.stderr)[-1500:])
    got = top + "/dl/kvd-%s.tar.gz" % v
    check(os.path.exists(got) and sha256(got) == sha256(tarball), "the tarball fetched into dl/")
    ipkg = os.path.join(top, "build_dir", "ipkg-kvd")
    kvd = ipkg + "/usr/bin/kvd"
    if not os.path.exists(kvd):
        return
    with open(kvd, "rb") as f:
        h = f.read(20)
    check(h[:4] == b"\x7fELF" and h[4] == 1 and h[5] == 2 and h[18:20] == b"\x00\x08",
          "a 32-bit big-endian MIPS executable")
    r = subprocess.run(["qemu-mips", kvd, "--version"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and "etcd API Version" in r.stdout, "it runs: %r" % r.stdout)
    st = os.stat(ipkg + "/etc/config/kvd")
    check(oct(st.st_mode & 0o777) == "0o600" and os.access(ipkg + "/etc/init.d/kvd", os.X_OK),
          "conffile 0600, init script executable")
    shutil.rmtree(top)



@test
def make_dist_is_reproducible_and_builds():
    """make dist: the same bytes from a copy of the files with other times and
    modes, exactly the files it should hold under kvd-VERSION/; unpacked (no
    git), it builds kvd and makes the same tarball again."""
    out = packages()
    if not out:
        return
    v = kvd_version()
    tarball = os.path.join(out, "kvd-%s.tar.gz" % v)
    import tarfile
    with tarfile.open(tarball) as tf:
        members = tf.getmembers()
    protos = sorted(f for f in os.listdir(os.path.join(ROOT, "proto")) if f.endswith((".proto", ".pb-c.c", ".pb-c.h")))
    want = ["kvd.c", "kvd.h", "Makefile", "LICENSE", "README.md"] + ["proto/" + f for f in protos]
    check([m.name for m in members] == ["kvd-%s/%s" % (v, f) for f in want], "its files: %r" % [m.name for m in members])
    check(all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.mode == 0o644 and m.isfile() for m in members),
          "times 0, owner 0, mode 644")
    # unpacked (no .git), and a copy of that touched now, group-writable
    # (the tree's own files may have changed since): the same bytes
    d = tempfile.mkdtemp(prefix="kvd-dist-")
    with tarfile.open(tarball) as tf:
        tf.extractall(d + "/x")
    x = os.path.join(d, "x", "kvd-" + v)
    src = os.path.join(d, "src")
    shutil.copytree(x, src)
    for f in want:
        os.utime(os.path.join(src, f))
        os.chmod(os.path.join(src, f), 0o664)
    r = subprocess.run(["make", "-s", "-C", src, "dist", "PKG_OUT=" + d + "/again"], capture_output=True, text=True)
    again = os.path.join(d, "again", "kvd-%s.tar.gz" % v)
    check(r.returncode == 0 and os.path.exists(again) and sha256(again) == sha256(tarball),
          "a copy made now, other modes: the same sha256: %s" % r.stderr[-300:])
    r = subprocess.run(["make", "-C", x, "kvd", "CFLAGS=-O1"], capture_output=True, text=True, timeout=600)
    check(r.returncode == 0, "make kvd in the unpacked tarball: %s" % (r.stdout + r.stderr)[-800:])
    if r.returncode == 0:
        r = subprocess.run([x + "/kvd", "--version"], capture_output=True, text=True)
        check(r.returncode == 0 and "kvd Version: %s" % v in r.stdout, "it runs: %r" % r.stdout[:200])
    r = subprocess.run(["make", "-s", "-C", x, "dist", "packages", "PKG_OUT=" + d + "/x-pkg"],
                       capture_output=True, text=True)
    check(r.returncode == 0 and sha256(d + "/x-pkg/kvd-%s.tar.gz" % v) == sha256(tarball),
          "make dist and packages in the unpacked tree: the same tarball: %s" % r.stderr[-300:])
    shutil.rmtree(d)


# Buildroot's side of a generic package, as far as kvd.mk uses it: the
# BR2_EXTERNAL tree's external.mk includes kvd.mk, generic-package is nothing;
# the download (file method: a copy from KVD_SITE) checked against kvd.hash as
# support/download/check-hash does, unpacked into $(@D) without its top
# directory, the license file checked, the build and install commands run with
# TARGET_CONFIGURE_OPTS and TARGET_MAKE_ENV (the host's compiler here)
BUILDROOT_MK = r"""BUILD_DIR := $(BR)/build
TARGET_DIR := $(BR)/target
DL_DIR := $(BR)/dl
INSTALL := install
TARGET_MAKE_ENV := PATH="$(PATH)"
TARGET_CONFIGURE_OPTS := PATH="$(PATH)" AR="ar" CC="gcc" CPP="cpp" LD="ld" CPPFLAGS="-D_LARGEFILE_SOURCE" \
	CFLAGS="-O1 -g0" LDFLAGS="" STRIP="strip"
generic-package :=
include $(BR2_EXTERNAL_KVD_PATH)/external.mk
KVD_PKGDIR := $(BR2_EXTERNAL_KVD_PATH)/package/kvd/
HASH = awk '$$1 == "sha256" && $$3 == "$(2)" { print $$2 }' $(KVD_PKGDIR)kvd.hash
check_hash = h=$$($(HASH)); [ -n "$$h" ] && [ "$$h" = "$$(sha256sum < $(1) | cut -d' ' -f1)" ] || \
	{ echo "ERROR: $(2) has wrong sha256 hash (kvd.hash: $$h)"; exit 1; }
KVD_DIR := $(BUILD_DIR)/kvd-$(KVD_VERSION)

download: $(DL_DIR)/$(KVD_SOURCE)
$(DL_DIR)/$(KVD_SOURCE):
	case '$(KVD_SITE)' in file://*) ;; *) echo "the stand-in fetches file:// only"; exit 1;; esac
	mkdir -p $(DL_DIR)
	cp '$(patsubst file://%,%,$(KVD_SITE))/$(KVD_SOURCE)' $@.tmp
	$(call check_hash,$@.tmp,$(KVD_SOURCE)) || { rm -f $@.tmp; exit 1; }
	mv $@.tmp $@
$(KVD_DIR)/.stamp_extracted: $(DL_DIR)/$(KVD_SOURCE)
	mkdir -p $(@D)
	gzip -dc $< | tar --strip-components=1 -C $(@D) -xf -
	$(foreach f,$(KVD_LICENSE_FILES),$(call check_hash,$(@D)/$(f),$(f)) &&) touch $@
$(KVD_DIR)/.stamp_built: $(KVD_DIR)/.stamp_extracted
	$(KVD_BUILD_CMDS)
	touch $@
install: $(KVD_DIR)/.stamp_built
	$(KVD_INSTALL_TARGET_CMDS)
	$(KVD_INSTALL_INIT_SYSV)
	$(KVD_INSTALL_INIT_SYSTEMD)
show:
	@echo 'KVD_DEPENDENCIES=$(KVD_DEPENDENCIES)'
	@echo 'KVD_LICENSE=$(KVD_LICENSE)'
	@echo 'KVD_LICENSE_FILES=$(KVD_LICENSE_FILES)'
"""


@test
def buildroot_package():
    """The BR2_EXTERNAL tree make packages writes: its files are README's
    blocks; Config.in's form; kvd.mk under the Buildroot stand-in fetches the
    tarball, checks kvd.hash, builds kvd and installs it with the sysvinit
    script and the unit (/usr/bin/kvd); a wrong hash in kvd.hash is refused."""
    out = packages()
    if not out:
        return
    v = kvd_version()
    br = os.path.join(out, "buildroot")
    written(out, "buildroot/external.desc", "buildroot-external-desc")
    top_config = written(out, "buildroot/Config.in", "buildroot-external-config-in")
    written(out, "buildroot/external.mk", "buildroot-external-mk")
    config = written(out, "buildroot/package/kvd/Config.in", "buildroot-config-in")
    written(out, "buildroot/package/kvd/kvd.mk", "buildroot-mk")
    hashes = written(out, "buildroot/package/kvd/kvd.hash", "buildroot-hash")
    written(out, "buildroot/package/kvd/S95kvd", "sysvinit", usr_bin=True, mode=0o755)
    written(out, "buildroot/package/kvd/kvd.service", "systemd-unit", usr_bin=True)
    desc = open(br + "/external.desc").read()
    check(re.search(r"^name: KVD$", desc, re.M) is not None, "external.desc names KVD: %r" % desc)
    srcs = re.findall(r'^source "\$BR2_EXTERNAL_KVD_PATH/([^"]+)"$', top_config, re.M)
    check(srcs and all(os.path.exists(os.path.join(br, s)) for s in srcs), "the tree's Config.in sources %r" % srcs)
    check(re.search(r'^config BR2_PACKAGE_KVD\n\tbool "kvd"\n', config) is not None and
          re.search(r"^\tselect BR2_PACKAGE_MBEDTLS$", config, re.M) is not None and
          re.search(r"^\tselect BR2_PACKAGE_PROTOBUF_C$", config, re.M) is not None and
          re.search(r"^\thelp\n\t  \S", config, re.M) is not None, "Config.in: config, bool, selects, help")
    # every dependency protobuf-c has, kvd has too (a select does not bring them)
    check(all("depends on %s" % dep in config for dep in ("BR2_INSTALL_LIBSTDCPP", "BR2_TOOLCHAIN_HAS_THREADS",
                                                          "BR2_PACKAGE_HOST_PROTOBUF_ARCH_SUPPORTS")),
          "Config.in: protobuf-c's dependencies")
    check("sha256  %s  kvd-%s.tar.gz" % (sha256(os.path.join(out, "kvd-%s.tar.gz" % v)), v) in hashes and
          "sha256  %s  LICENSE" % sha256(os.path.join(ROOT, "LICENSE")) in hashes, "kvd.hash: the tarball, LICENSE")
    d = tempfile.mkdtemp(prefix="kvd-br-")
    with open(d + "/standin.mk", "w") as f:
        f.write(BUILDROOT_MK)

    def br_make(ext, work, *targets):
        return subprocess.run(["make", "-f", d + "/standin.mk", "BR=" + work, "BR2_EXTERNAL_KVD_PATH=" + ext] +
                              list(targets), capture_output=True, text=True, timeout=600)
    r = br_make(br, d + "/o", "show")
    check("KVD_DEPENDENCIES=mbedtls protobuf-c\n" in r.stdout and "KVD_LICENSE=BSD-2-Clause\n" in r.stdout and
          "KVD_LICENSE_FILES=LICENSE\n" in r.stdout, "dependencies, license: %r" % (r.stdout + r.stderr)[-400:])
    # a planted fault: the tarball's hash wrong in kvd.hash
    shutil.copytree(br, d + "/bad")
    with open(d + "/bad/package/kvd/kvd.hash", "w") as f:
        f.write(hashes.replace(sha256(os.path.join(out, "kvd-%s.tar.gz" % v)), "1" * 64))
    r = br_make(d + "/bad", d + "/b", "install")
    check(r.returncode != 0 and "kvd-%s.tar.gz has wrong sha256 hash" % v in r.stdout and
          not os.path.exists(d + "/b/build") and not os.path.exists(d + "/b/dl/kvd-%s.tar.gz" % v),
          "a wrong hash in kvd.hash: refused, nothing unpacked: %s" % (r.stdout + r.stderr)[-500:])
    r = br_make(br, d + "/o", "install")
    check(r.returncode == 0, "kvd.mk: fetched, built, installed: %s" % (r.stdout + r.stderr)[-1500:])
    installed_as_packaged(d + "/o/target", v, (("etc/init.d/S95kvd", 0o755, br + "/package/kvd/S95kvd"),
                                                ("usr/lib/systemd/system/kvd.service", 0o644,
                                                 br + "/package/kvd/kvd.service")))
    shutil.rmtree(d)


def installed_as_packaged(root, v, files):
    """A package's install step under root: /usr/bin/kvd (0755, runs, says
    version v) and each (path, mode, the packaged file it must equal)."""
    for path, mode, same in (("usr/bin/kvd", 0o755, None),) + tuple(files):
        p = os.path.join(root, path)
        check(os.path.exists(p) and os.stat(p).st_mode & 0o777 == mode and
              (same is None or open(p).read() == open(same).read()), "installed: /%s, mode %o" % (path, mode))
    if os.path.exists(root + "/usr/bin/kvd"):
        r = subprocess.run([root + "/usr/bin/kvd", "--version"], capture_output=True, text=True)
        check(r.returncode == 0 and "kvd Version: %s" % v in r.stdout, "the kvd installed runs: %r" % r.stdout[:200])


def bb_parse(text):
    """A .bb as far as the recipe uses it: VAR = "value" (+=, .= ...; continued lines),
    VAR[flag] = "value", inherit, and shell functions name() { ... }."""
    vars_, funcs, inherits = {}, {}, []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^([a-z_]+)\(\) \{$", line)
        if m:
            j = lines.index("}", i)
            funcs[m.group(1)] = "\n".join(lines[i + 1:j]) + "\n"
            i = j + 1
            continue
        while line.endswith("\\"):
            i += 1
            line = line[:-1] + lines[i]
        m = re.match(r'^([A-Za-z0-9_:${}\[\]]+) (\?\?=|\?=|\+=|\.=|:=|=) "(.*)"$', line)
        if m:
            vars_[m.group(1)] = ((vars_.get(m.group(1), "") if m.group(2) == "+=" else "") + " " + m.group(3)).strip()
        elif line.startswith("inherit "):
            inherits += line.split()[1:]
        elif line.strip() and not line.startswith("#"):
            vars_.setdefault("?unparsed", []).append(line)
        i += 1
    return vars_, funcs, inherits


# bitbake's variables the recipe's functions may use, as OE sets them
# (usrmerge's systemd_system_unitdir); the host's compiler
YOCTO_VARS = {"bindir": "/usr/bin", "sysconfdir": "/etc", "systemd_system_unitdir": "/usr/lib/systemd/system",
              "CC": "gcc", "CFLAGS": "-O1 -pipe", "CPPFLAGS": "", "LDFLAGS": "-Wl,-O1 -Wl,--as-needed"}


def yocto_fetch_checks(recipe_dir, recipe, v, unpackdir):
    """What bitbake's fetch and license QA check of the recipe, done here:
    SRC_URI's files (the tarball against SRC_URI[sha256sum]) unpacked into
    unpackdir, LIC_FILES_CHKSUM's md5 against S's file.  Problems, or []."""
    vars_, funcs, inherits = bb_parse(recipe)
    bad = []
    uris = vars_.get("SRC_URI", "").replace("${PV}", v).split()
    if not uris or not re.match(r"^file:///.*/kvd-%s\.tar\.gz$" % re.escape(v), uris[0]):
        return ["SRC_URI's first is not the tarball: %r" % uris]
    tarball = uris[0][len("file://"):]
    if not os.path.exists(tarball) or sha256(tarball) != vars_.get("SRC_URI[sha256sum]"):
        bad.append("SRC_URI[sha256sum] is not the tarball's")
    os.makedirs(unpackdir, exist_ok=True)
    if os.path.exists(tarball):
        subprocess.run(["tar", "-C", unpackdir, "-xzf", tarball], check=True)
    for u in uris[1:]:
        f = os.path.join(recipe_dir, "files", u[len("file://"):])
        if not u.startswith("file://") or not os.path.exists(f):
            bad.append("%s: not in files/" % u)
        else:
            shutil.copy(f, unpackdir)
    s = os.path.join(unpackdir, "kvd-" + v)  # the default S, ${UNPACKDIR}/${BP}
    m = re.match(r"^file://([^;]+);md5=([0-9a-f]{32})$", vars_.get("LIC_FILES_CHKSUM", ""))
    if not m or not os.path.exists(os.path.join(s, m.group(1))) or sha256(os.path.join(s, m.group(1)), "md5") != m.group(2):
        bad.append("LIC_FILES_CHKSUM %r is not the md5 of S's file" % vars_.get("LIC_FILES_CHKSUM"))
    return bad


@test
def yocto_recipe():
    """The layer make packages writes: layer.conf and the recipe are README's
    blocks, the layer finds the recipe; the recipe's SRC_URI sha256 and
    LIC_FILES_CHKSUM md5 match the files (a planted wrong one of each is
    caught); do_compile and do_install run under sh with bitbake's variables
    and oe_runmake, and install kvd, the unit and the init script."""
    out = packages()
    if not out:
        return
    v = kvd_version()
    layer = os.path.join(out, "yocto")
    rdir = os.path.join(layer, "recipes-support", "kvd")
    conf = written(out, "yocto/conf/layer.conf", "yocto-layer-conf")
    recipe = written(out, "yocto/recipes-support/kvd/kvd_%s.bb" % v, "yocto-recipe")
    written(out, "yocto/recipes-support/kvd/files/kvd.service", "systemd-unit", usr_bin=True)
    written(out, "yocto/recipes-support/kvd/files/kvd.init", "sysvinit", usr_bin=True, mode=0o755)
    cvars, _, _ = bb_parse(conf)
    import glob
    pattern = cvars.get("BBFILES", "").strip().replace("${LAYERDIR}", layer)
    check(glob.glob(pattern) == [os.path.join(rdir, "kvd_%s.bb" % v)] and cvars.get("BBFILE_COLLECTIONS") == "kvd" and
          "scarthgap" in cvars.get("LAYERSERIES_COMPAT_kvd", ""), "layer.conf: BBFILES finds the recipe: %r" % pattern)
    vars_, funcs, inherits = bb_parse(recipe)
    check("?unparsed" not in vars_, "every line of the recipe understood: %r" % vars_.get("?unparsed"))
    check(vars_.get("LICENSE") == "BSD-2-Clause" and vars_.get("DEPENDS", "").split() == ["mbedtls", "protobuf-c"] and
          inherits == ["systemd", "update-rc.d"] and vars_.get("SYSTEMD_SERVICE:${PN}") == "kvd.service" and
          vars_.get("INITSCRIPT_NAME") == "kvd" and set(funcs) == {"do_compile", "do_install"},
          "license, depends, classes, service, init script, functions")
    d = tempfile.mkdtemp(prefix="kvd-yocto-")
    # planted faults: a wrong sha256, a wrong md5
    tar_sha = sha256(os.path.join(out, "kvd-%s.tar.gz" % v))
    lic_md5 = sha256(os.path.join(ROOT, "LICENSE"), "md5")
    check(any("sha256sum" in b for b in yocto_fetch_checks(rdir, recipe.replace(tar_sha, "2" * 64), v, d + "/f1")),
          "a wrong SRC_URI[sha256sum] is caught")
    check(any("LIC_FILES_CHKSUM" in b for b in yocto_fetch_checks(rdir, recipe.replace(lic_md5, "3" * 32), v, d + "/f2")),
          "a wrong LIC_FILES_CHKSUM md5 is caught")
    work = d + "/work"
    unpackdir = work + "/sources"
    bad = yocto_fetch_checks(rdir, recipe, v, unpackdir)
    check(bad == [], "fetch and license checks: %r" % bad)
    s = os.path.join(unpackdir, "kvd-" + v)
    env = dict(os.environ, WORKDIR=work, UNPACKDIR=unpackdir, S=s, B=s, D=work + "/image", PN="kvd", PV=v, **YOCTO_VARS)
    used = set(re.findall(r"\$\{([A-Za-z_]+)\}", funcs.get("do_compile", "") + funcs.get("do_install", "")))
    known = set(YOCTO_VARS) | {"WORKDIR", "UNPACKDIR", "S", "B", "D", "PN", "PV"}
    check(used <= known, "the functions use bitbake's variables only: %r" % (used - known))
    for fn in ("do_compile", "do_install"):
        r = subprocess.run(["sh", "-e", "-c", 'oe_runmake() { make "$@"; }\n' + funcs.get(fn, "false")],
                           cwd=s, env=env, capture_output=True, text=True, timeout=600)
        check(r.returncode == 0, "%s: %s" % (fn, (r.stdout + r.stderr)[-1500:]))
    installed_as_packaged(work + "/image", v, (("etc/init.d/kvd", 0o755, rdir + "/files/kvd.init"),
                                               ("usr/lib/systemd/system/kvd.service", 0o644,
                                                rdir + "/files/kvd.service")))
    shutil.rmtree(d)


def source_functions(lines):
    """For each line of C source, the function it lies in (its definition's
    name), or None outside any: a definition starts at column 0 and is not a
    prototype."""
    out, name = [], None
    for l in lines:
        m = re.match(r"^[A-Za-z_][^(=;]*?\b(\w+)\(", l)
        if m and not l.rstrip().endswith(";") and not l.startswith(("#", "struct ", "union ", "enum ")):
            name = m.group(1)
        elif l.startswith("}"):
            out.append(name)
            name = None
            continue
        out.append(name)
    return out


def c_code(line):
    """A line of C without its comments (a comment opened and not closed on
    it is cut at its start; lines inside a block comment begin with '*')."""
    line = re.sub(r"/\*.*?\*/", "", line)
    line = line.split("/*")[0]
    return "" if line.lstrip().startswith("*") else line


def knob_faults(src):
    """What breaks section 0's rule in src: every KVD_* default stands under
    its own #ifndef (a value from outside wins), whose line carries "@@" and
    words after it.  The few KVD_* constants that are not knobs (sizes of
    kvd's own tables, what a knob implies) are named here."""
    not_knobs = {"KVD_NO_JWT", "KVD_UNUSED", "KVD_RESIDENT", "KVD_METRIC_METHODS", "KVD_FSYNC_BUCKETS",
                 "KVD_COMMIT_BUCKETS", "KVD_HANDLING_BUCKETS"}
    lines = src.split("\n")
    faults, stack = [], []  # stack: for each open #if, the knob it guards (or None)
    for i, l in enumerate(lines):
        nxt = next((x for x in lines[i + 1:i + 4] if x.strip()), "")
        m = re.match(r"#\s*ifndef\s+(KVD_\w+)(.*)", l)
        if re.match(r"#\s*if", l):
            knob = m.group(1) if m and re.match(r"#\s*define\s+%s\b" % m.group(1), nxt) else None
            stack.append(knob)
            if knob and not re.search(r"@@\s*\S+\s+\S+", m.group(2)):
                faults.append("line %d: %s's #ifndef line does not carry \"@@\" and what it bounds" % (i + 1, knob))
            continue
        if re.match(r"#\s*endif", l) and stack:
            stack.pop()
            continue
        d = re.match(r"#\s*define\s+(KVD_\w+)(?!\()\s+\S", l)
        if d and d.group(1) not in not_knobs and not any(stack):
            faults.append("line %d: %s is set without an #ifndef guard" % (i + 1, d.group(1)))
    return faults


@test
def knobs_are_guarded_and_marked():
    """Every compile-time knob is #ifndef-guarded, so a value given from
    outside wins, and its #ifndef line carries "@@" and says what it bounds
    (`grep -n @@ kvd.c` lists them all); a knob planted without the mark,
    one planted without its guard, are caught. [§0.1]"""
    src = open(os.path.join(ROOT, "kvd.c")).read()
    faults = knob_faults(src)
    check(not faults, "kvd.c: " + "; ".join(faults[:5]))
    n = len(re.findall(r"^#ifndef KVD_\w+ /\* @@", src, re.M))
    check(n > 40, "the knobs are found: %d" % n)
    at = src.index("#ifndef KVD_DEFAULT_MAX_CONNECTIONS")
    for what, text in (("a knob without @@", src[:at] + "#ifndef KVD_PLANTED\n#define KVD_PLANTED 1\n#endif\n" + src[at:]),
                       ("a knob without its guard", src[:at] + "#define KVD_PLANTED 1\n" + src[at:]),
                       ("@@ without words", src[:at] + "#ifndef KVD_PLANTED /* @@ */\n#define KVD_PLANTED 1\n#endif\n"
                        + src[at:])):
        check(any("KVD_PLANTED" in f for f in knob_faults(text)), "%s is caught" % what)


# Where kvd reads the wall clock, and why: log lines, and what a peer's
# protocol says in wall-clock time.  Everything else runs on the monotonic
# clock (util_now_ms, k->now).
WALL_CLOCK_READERS = {
    "kvd_log": "log lines",
    "lease_next_id": "lease ids, as etcd's generator makes them",
    "auth_jwt_issue": "JWT timestamps",
    "auth_jwt_check": "JWT timestamps",
    "svc_member_add": "member ids",
    "tls_self_signed": "certificates",
    "confd_wall": "confd timestamps",
    "http_date": "HTTP dates",
    "kvd_init": "/metrics' process_start_time_seconds",
}


def clock_faults(src):
    lines = src.split("\n")
    fns = source_functions(lines)
    faults, readers = [], set()
    for i, l in enumerate(lines):
        code = c_code(l)
        if re.search(r"\btime\s*\(\s*(NULL|0|&)|CLOCK_REALTIME|\bgettimeofday\s*\(|\b(localtime|gmtime|mktime)\w*\s*\(",
                     code):
            readers.add(fns[i])
            if fns[i] not in WALL_CLOCK_READERS:
                faults.append("line %d: %s reads the wall clock" % (i + 1, fns[i]))
        if re.search(r"next_timer\s*=[^=]", code) and fns[i] not in ("util_wake_by", "loop_timers", "kvd_init"):
            faults.append("line %d: %s sets the loop's wake-up without util_wake_by" % (i + 1, fns[i]))
    for f in sorted(set(WALL_CLOCK_READERS) - readers):
        faults.append("%s is named a wall-clock reader and reads none" % f)
    return faults


@test
def wall_clock_only_where_a_protocol_speaks_it():
    """Timers run on the monotonic clock and ask for their wake-up through
    util_wake_by; the wall clock is read only in the functions named in
    WALL_CLOCK_READERS (log lines, JWT and confd timestamps, HTTP dates,
    certificates, ids).  A planted read in a timer, and a timer setting the
    loop's wake-up by hand, are caught. [§3.4]"""
    src = open(os.path.join(ROOT, "kvd.c")).read()
    faults = clock_faults(src)
    check(not faults, "kvd.c: " + "; ".join(faults[:5]))
    renew = re.search(r"\n(static void lease_renew\(.*?\n\{\n)", src, re.S)
    check(renew is not None, "lease_renew is found")
    if renew:
        at = renew.end()
        for what, text in (("a wall-clock deadline", src[:at] + "\t(void)time(NULL);\n" + src[at:]),
                           ("a wake-up set by hand", src[:at] + "\tk->next_timer = 0;\n" + src[at:])):
            check(any("lease_renew" in f for f in clock_faults(text)), "%s in lease_renew is caught" % what)


@test
def only_libc_mbedtls_and_protobuf_c():
    """kvd links libc, mbedtls and protobuf-c and nothing else; without TLS
    (KVD_NO_TLS, make TLS=0) the TLS and X.509 headers are left out and it
    links with mbedcrypto alone. [§1.1]"""
    cc = os.environ.get("CC", "cc")
    d = tempfile.mkdtemp(prefix="kvd-libs-")

    def headers(*flags):
        r = subprocess.run([cc, "-std=c99", "-E"] + list(flags) + [os.path.join(ROOT, "kvd.c")],
                           capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, "%s -E %s: %s" % (cc, " ".join(flags), r.stderr[-300:]))
        return {m.group(1) for m in re.finditer(r'^# \d+ "([^"]+)"', r.stdout, re.M)}

    def needed(binary):
        r = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True, timeout=60)
        return {re.sub(r"\.so.*", "", n) for n in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout)}

    tls = re.compile(r"mbedtls/(ssl|x509\w*|net_sockets|ctr_drbg|entropy|oid)\.h$")
    check(any(tls.search(h) for h in headers()), "the default build includes the TLS headers (the control)")
    left = sorted(h for h in headers("-DKVD_NO_TLS") if tls.search(h))
    check(not left, "without TLS no TLS or X.509 header is included: %s" % left)
    out = os.path.join(d, "kvd-notls")
    r = subprocess.run([cc, "-std=c99", "-O0", "-DKVD_NO_TLS", "-o", out, os.path.join(ROOT, "kvd.c"),
                        "-lprotobuf-c", "-lmbedcrypto"], capture_output=True, text=True, timeout=600)
    check(r.returncode == 0, "without TLS it links with mbedcrypto and protobuf-c alone: %s" % r.stderr[-500:])
    if r.returncode == 0:
        libs = needed(out)
        check(libs <= {"libc", "libmbedcrypto", "libprotobuf-c"}, "without TLS it needs %s" % sorted(libs))
    check(os.path.exists(KVD), "%s is built" % KVD)
    if os.path.exists(KVD):
        libs = needed(KVD)
        check("libprotobuf-c" in libs and libs <= {"libc", "libmbedtls", "libmbedx509", "libmbedcrypto", "libprotobuf-c"},
              "%s needs %s" % (KVD, sorted(libs)))
    shutil.rmtree(d)


@test
def toc_catches_planted_faults():
    """make toc's checker (test/lib/toc.py) passes kvd.c as it is and fails
    each planted fault: a sub-banner the index does not list, a WHERE IS hop
    naming the wrong section, a hop naming no function, a function whose
    prefix its section's banner does not name, a comment naming a function
    that is not there, a section past 1 500 lines, the map's durable write
    run in the order it runs (back up the file); test/README.md's index of tests by name (make toc's
    second part) catches a test left out or one that is gone; and the
    invariants' checker (its third) catches an invariant nothing cites, an
    id that names none, a citation that is neither at a check nor a
    reference, and numbers that do not run 1, 2, 3."""
    src = open(os.path.join(ROOT, "kvd.c")).read()
    tool = os.path.join(ROOT, "test", "lib", "toc.py")
    d = tempfile.mkdtemp(prefix="kvd-toc-")

    def run(text):
        f = os.path.join(d, "kvd.c")
        open(f, "w").write(text)
        r = subprocess.run([sys.executable, tool, f], capture_output=True, text=True)
        return r.returncode, r.stdout
    rc, out = run(src)
    check(rc == 0 and out.startswith("toc: ok"), "kvd.c as it is: " + out.strip()[:200])
    m = re.search(r"mvcc_put §(\d+)", src)
    check(m is not None, "the WHERE IS map names mvcc_put")
    hop = m.group(0)
    wrong = "mvcc_put §%d" % (int(m.group(1)) + 1)
    at = src.index("/* ===== 5. ")
    faults = {
        "an unlisted sub-banner": src[:at] + "/* ---- planted ---- */\n" + src[at:],
        "a hop in the wrong section": src.replace(hop, wrong, 1),
        "a hop naming no function": src.replace(hop, "mvcc_no_such_fn §%s" % m.group(1), 1),
        "a function outside its prefix": src.replace("static void buf_free(", "static void planted_free(", 1)
                                             .replace("buf_free(", "planted_free("),
        "a comment naming a function gone": src[:at] + "/* what mvcc_planted_gone does */\n" + src[at:],
    }
    a = src.index(" *   - a durable write")
    b = src.index(" *   - ", a + 1)
    hops = re.findall(r"\w+ §\d+", src[a:b])
    check(len(hops) >= 8, "the durable write has its hops: %d" % len(hops))
    runs = ["h2_on_data", "grpc_on_data", "call_message", "svc_put_rpc", "mvcc_put", "call_finish", "call_hold",
            "loop_log_flush", "mvcc_flush", "h2_stream_send", "net_write"]  # the order it runs in
    byname = dict(h.split(" ") for h in hops)
    check(set(runs) == set(byname), "the durable write names the functions it runs: %s" % sorted(byname))
    faults["a section past 1 500 lines"] = src[:at] + "/*\n" + " *\n" * 1500 + " */\n" + src[at:]
    faults["the durable write back up the file"] = (src[:a] + " *   - a durable write: " +
                                                   " > ".join("%s %s" % (f, byname.get(f, "§0")) for f in runs)
                                                   + "\n" + src[b:])
    for what, text in faults.items():
        rc, out = run(text)
        check(rc == 1 and "toc:" in out, "%s is caught: %s" % (what, out.strip()[:160]))
    # test/README.md's index of tests by name: current, and a test left out is caught
    index = os.path.join(ROOT, "test", "lib", "testindex.py")
    readme = open(os.path.join(ROOT, "test", "README.md")).read()
    for what, text, want in (("as it is", readme, 0),
                             ("a test left out", readme.replace(", `toc_catches_planted_faults`", "", 1), 1),
                             ("a test that is gone", readme.replace("`kill_and_recover`", "`kill_and_recover`, `gone`", 1), 1)):
        f = os.path.join(d, "README.md")
        open(f, "w").write(text)
        r = subprocess.run([sys.executable, index, f], capture_output=True, text=True)
        check(text != readme or want == 0, "the fault was planted: " + what)
        check(r.returncode == want, "test index, %s: %s" % (what, r.stdout.strip()))
    # every numbered invariant cited by a check or a test
    inv = os.path.join(ROOT, "test", "lib", "invariants.py")
    first = re.search(r"\n \*   1\. Every knob is #ifndef-guarded[^\n]*\n", src)
    check(first is not None, "section 0's first invariant is where the test looks")
    at0 = src.index("\n", src.index("/* ===== 1. ")) + 1
    for what, text, want in (
            ("as it is", src, 0),
            ("an invariant nothing cites", src.replace(" */\n\n#ifdef KVD_CONFIG_FILE", " *   2. A planted promise.\n */\n\n"
                                                     "#ifdef KVD_CONFIG_FILE", 1), 1),
            ("an id that names none", src[:at0] + "static int planted(int x) { return KVD_ALWAYS(x); } /* [§0" + ".9] */\n"
             + src[at0:], 1),
            ("a stray citation", src[:at0] + "/* [§0" + ".1] */\n" + src[at0:], 1),
            ("numbers that skip", src.replace(first.group(0), first.group(0).replace("   1. ", "   3. "), 1), 1)):
        f = os.path.join(d, "kvd.c")
        open(f, "w").write(text)
        r = subprocess.run([sys.executable, inv, f], capture_output=True, text=True)
        check(text != src or want == 0, "the fault was planted: " + what)
        check(r.returncode == want and (want or "invariants: ok" in r.stdout),
              "invariants, %s: %s" % (what, r.stdout.strip()[-200:]))
    shutil.rmtree(d)


def not_exported_as_promised(src):
    """Functions kvd.c defines at file scope that are neither static, nor
    KVD_API with a kvd_ name, nor main."""
    lines = src.split("\n")
    bad = []
    for i, line in enumerate(lines):
        m = re.match(r"^([A-Za-z_][\w \t*]*?)\b(\w+)\(", line)
        if not m or line.rstrip().endswith(";") or m.group(1).split()[0] in ("typedef", "return", "else", "if"):
            continue
        j = i
        while j < len(lines) - 1 and j - i < 8 and not lines[j].rstrip().endswith((")", ";", "{")):
            j += 1
        if j + 1 >= len(lines) or lines[j + 1] != "{" or not lines[j].rstrip().endswith(")"):
            continue
        words, name = m.group(1).split(), m.group(2)
        if "static" in words or ("KVD_API" in words and name.startswith("kvd_")) or (words == ["int"] and name == "main"):
            continue
        bad.append(name)
    return bad


def main_is_kvd_main(src):
    """kvd.c's one main() is kvd_main() and nothing more."""
    return (len(re.findall(r"^\w[\w \t*]*\bmain\(", src, re.M)) == 1 and
            "\nint main(int argc, char **argv)\n{\n\treturn kvd_main(argc, argv);\n}\n" in src)


@test
def the_program_is_kvd_main_and_exports_kvd_only():
    """main only calls kvd_main [§41.1]: kvd.c's one main() is `return
    kvd_main(argc, argv);`, so flags, signals, the loop and the exit status
    are kvd_main's.  Only kvd_* functions, main and the generated
    protobuf-c symbols are exported [§40.1]: every function kvd.c defines
    at file scope is static or KVD_API (and then named kvd_), and the kvd
    binary's defined global symbols keep make symcheck's rule.  Each rule
    catches a planted fault."""
    src = open(os.path.join(ROOT, "kvd.c")).read()
    check(main_is_kvd_main(src), "main() is kvd_main() and nothing more")
    planted = src.replace("\treturn kvd_main(argc, argv);\n}", "\tsignal(SIGPIPE, SIG_IGN);\n\treturn kvd_main(argc, argv);\n}", 1)
    check(not main_is_kvd_main(planted), "a main() that does more is caught")
    check(not main_is_kvd_main(src + "\nint main(void)\n{\n\treturn 0;\n}\n"), "a second main() is caught")
    bad = not_exported_as_promised(src)
    check(bad == [], "every function is static or KVD_API kvd_*: not %r" % bad[:10])
    for what, text, name in (
            ("a function left non-static", src.replace("KVD_RESIDENT static void buf_free(", "KVD_RESIDENT void buf_free(", 1),
             "buf_free"),
            ("a KVD_API function not named kvd_", src.replace("KVD_API void kvd_reload(", "KVD_API void reload_kvd(", 1),
             "reload_kvd")):
        check(not_exported_as_promised(text) == [name], "%s is caught: %r" % (what, not_exported_as_promised(text)))
    r = subprocess.run(["nm", "-g", "--defined-only", KVD], capture_output=True, text=True)
    syms = [x.split()[2] for x in r.stdout.splitlines() if len(x.split()) == 3 and x.split()[1] in "TDBR" and "@" not in x]
    allowed = re.compile(r"^(kvd_|etcdserverpb__|mvccpb__|authpb__|v3lockpb__|v3electionpb__|grpc__health__v1__|main$|_)")
    check(r.returncode == 0 and "kvd_main" in syms and "main" in syms and not [x for x in syms if not allowed.match(x)],
          "%s exports kvd_*, main and protobuf-c's only: %r" % (KVD, [x for x in syms if not allowed.match(x)][:10] or r.stderr))


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
