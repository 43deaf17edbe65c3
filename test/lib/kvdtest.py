"""kvdtest: helpers shared by kvd's integration tests (run with /usr/bin/python3).

- Kvd: start a kvd binary on a free loopback port with a temporary data dir.
- a tiny test runner: @test functions, check(), and the "N passed, N failed" line.
- H2: a raw HTTP/2 client socket (frames built by hand, hpack for headers) to
  send what no well-behaved client sends.
- h2_call(): one gRPC call through python-h2, which raises on any protocol or
  flow-control violation by the server, with a small window and a slow reader.
- spawn(): every process a test starts (servers, clients) is tracked; when a
  test function ends, pass or fail, what it started and left running is
  stopped, and at exit (or SIGTERM/SIGINT) everything still running is.
"""
import atexit
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from hpack import Encoder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # test/lib/ -> the tree
# A member, cluster or lease id as etcdctl prints it: 64 bits in hex without
# leading zeros, so one id in 16 has 15 digits (those shorter than 16 must
# hold a letter, not to take a long decimal number for one).
HEX_ID = r"(?<![0-9A-Za-z])(?:[0-9a-f]{16}|(?=[0-9]*[a-f])[0-9a-f]{13,15})(?![0-9A-Za-z])"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
ERRORS = ["NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
          "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR",
          "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED"]


# ------------------------------------------------------------------ processes
_procs = []  # every process started through spawn(), in order


def spawn(cmd, **kw):
    """subprocess.Popen, tracked: stopped when the test that started it ends."""
    p = subprocess.Popen(cmd, **kw)
    _procs.append(p)
    return p


def _stop_procs(since=0):
    left = [p for p in _procs[since:] if p.poll() is None]
    for p in left:
        try:
            p.terminate()
        except OSError:
            pass
    for p in left:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return len(left)


_tmpdirs = []  # etcd data dirs on tmpfs: RAM, so never left behind


def _at_exit():
    _stop_procs()
    for d in _tmpdirs:
        subprocess.run(["rm", "-rf", d])


atexit.register(_at_exit)


def _on_signal(sig, frame):
    sys.exit(128 + sig)  # atexit stops what is running


for _sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(_sig, _on_signal)


# ------------------------------------------------------------------ runner
class _R:
    passed = 0
    failed = 0
    current = ""


_tests = []


def test(fn):
    _tests.append(fn)
    return fn


class Skipped(Exception):
    """Raised by a test whose peer this machine lacks (the etcd 3.7.3 oracle
    without Go >= GO_MIN): the runner says SKIPPED -- or, with
    KVD_REQUIRE_GO_PEERS set (CI), counts a failure."""


def check(cond, what=""):
    if cond:
        _R.passed += 1
    else:
        _R.failed += 1
        print("FAIL %s: %s" % (_R.current, what), flush=True)
    return cond


def check_script(script, port, timeout=120):
    """Run test/lib/<script> (a client in its own interpreter, e.g. python3-etcd3,
    whose generated etcd modules would clash with ours) against port; each
    "CHECK ok|FAIL what" line it prints becomes a check."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "test", "lib", script), str(port)],
                       capture_output=True, text=True, timeout=timeout)
    for line in r.stdout.splitlines():
        if line.startswith("CHECK "):
            ok, _, what = line[6:].partition(" ")
            check(ok == "ok", what)
    check(r.returncode == 0 and "CHECK " in r.stdout, "%s ran: %s" % (script, r.stderr[-800:]))
    return r.stdout


def split_options(argv, names):
    """A suite's own options (each of names, followed by its value) taken
    out of argv: (dict of them, argv left for run_tests: [prog, filter])."""
    opts, rest, i = {}, argv[:1], 1
    while i < len(argv):
        if argv[i] in names and i + 1 < len(argv):
            opts[argv[i]] = argv[i + 1]
            i += 2
        else:
            rest.append(argv[i])
            i += 1
    return opts, rest


def run_tests(argv):
    """Every @test whose name contains argv[1] (all without it), in order;
    the last line printed is "N passed, N failed" (checks); 1 if any failed."""
    only = argv[1] if len(argv) > 1 else ""
    for fn in _tests:
        if only and only not in fn.__name__:
            continue
        _R.current = fn.__name__
        t0 = time.time()
        mark = len(_procs)
        try:
            fn()
        except Skipped as e:
            if os.environ.get("KVD_REQUIRE_GO_PEERS"):
                check(False, "%s, and KVD_REQUIRE_GO_PEERS is set" % e)
            else:
                print("  SKIPPED: %s" % e, flush=True)
        except Exception as e:  # a test that raises has failed
            import traceback
            traceback.print_exc()
            check(False, "raised %s: %s" % (type(e).__name__, e))
        finally:
            n = _stop_procs(mark)  # what this test started and left running
            if n and _R.failed:
                print("  (stopped %d process(es) %s left running)" % (n, fn.__name__), flush=True)
        print("  %-40s %.2fs" % (fn.__name__, time.time() - t0), flush=True)
    print("%d passed, %d failed" % (_R.passed, _R.failed), flush=True)
    return 1 if _R.failed else 0


# ------------------------------------------------------------------ kvd process
def free_port(hosts=()):
    """A port free on 127.0.0.1 and on every address in hosts: a client
    dialling 127.0.0.N may hold an ephemeral port there that 127.0.0.1 knows
    nothing of (CI once lost a test to 127.0.0.2:<port> in use)."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        for h in hosts:
            t = socket.socket()
            try:
                t.bind((h, p))
            except OSError:
                break
            finally:
                t.close()
        else:
            return p


class Kvd:
    """A kvd process on 127.0.0.1:<free port>; log lines collected in .log."""

    def __init__(self, binary=None, args=(), data_dir=None, port=None, wait=True, wrap=(), hosts=()):
        """hosts: more loopback addresses to serve on (same port): a client
        dialling 127.0.0.N comes from 127.0.0.N, whatever the client."""
        self.binary = binary or os.environ.get("KVD", os.path.join(ROOT, "kvd"))
        self.port = port or free_port(hosts)
        self.dir = data_dir or tempfile.mkdtemp(prefix="kvd-test-")
        self.url = "http://127.0.0.1:%d" % self.port
        urls = ",".join([self.url] + ["http://%s:%d" % (h, self.port) for h in hosts])
        self.cmd = list(wrap) + [self.binary, "--data-dir", self.dir, "--listen-client-urls", urls,
                    "--advertise-client-urls", self.url] + list(args)
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0")
        self.p = spawn(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        self.log = []
        self._ready = threading.Event()
        self._log_reader = threading.Thread(target=self._reader, daemon=True)
        self._log_reader.start()
        if wait and not self._ready.wait(60):
            raise RuntimeError("kvd did not start: %s" % "".join(self.log))

    def _reader(self):
        for line in iter(self.p.stdout.readline, b""):
            s = line.decode(errors="replace")
            self.log.append(s)
            if "serving client requests on" in s:
                self._ready.set()

    def endpoint(self):
        return "127.0.0.1:%d" % self.port

    def alive(self):
        return self.p.poll() is None

    def rss_kb(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1

    def cpu_ticks(self):
        with open("/proc/%d/stat" % self.p.pid) as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return int(parts[11]) + int(parts[12])

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self._log_reader.join(30)  # every line it wrote is in .log
        return self.p.returncode

    def logtext(self):
        return "".join(self.log)


GO_MIN = "1.26.0"  # test/lib/deps.sh's GO_MIN: the Go that builds test/peers


def go_peer(name):
    """The path of an etcd 3.7.3 peer test/lib/deps.sh built from test/peers
    (etcd, etcdctl, etcdutl), or None when it could not (no Go >= GO_MIN):
    the caller says SKIPPED -- which, with KVD_REQUIRE_GO_PEERS set (CI), is
    a failure instead (go_peers_or_skip)."""
    import hashlib
    peers = os.path.join(ROOT, "test", "peers")
    h = hashlib.sha256()
    for f in ("go.mod", "go.sum"):
        with open(os.path.join(peers, f), "rb") as fh:
            h.update(fh.read())
    path = os.path.join(os.environ.get("KVD_CACHE", "/var/cache/kvd-test"), "go-peers-" + h.hexdigest()[:12], "bin", name)
    return path if os.access(path, os.X_OK) else None


def go_peers_or_skip(what):
    """True when the etcd 3.7.3 peers are built; else says SKIPPED (or, under
    KVD_REQUIRE_GO_PEERS, fails the check) and returns False."""
    if go_peer("etcd") and go_peer("etcdctl") and go_peer("etcdutl"):
        return True
    if os.environ.get("KVD_REQUIRE_GO_PEERS"):
        check(False, "%s: the etcd 3.7.3 peers are not built (test/lib/deps.sh test) and KVD_REQUIRE_GO_PEERS is set" % what)
    else:
        print("  SKIPPED: needs Go >= %s (%s: test/lib/deps.sh builds the etcd 3.7.3 peers with it)" % (GO_MIN, what))
    return False


def oracle():
    """The etcd every differential test compares kvd with: 3.7.3 from
    test/peers.  Without it the test is Skipped (a failure in CI)."""
    b = go_peer("etcd")
    if not b:
        raise Skipped("needs Go >= %s (test/lib/deps.sh builds the etcd 3.7.3 oracle with it)" % GO_MIN)
    return b


class Etcd:
    """etcd on 127.0.0.1:<free port>, data on tmpfs when possible (the
    differential tests compare semantics, not durability): the 3.7.3
    oracle(), or binary= ("etcd" is Debian's 3.4.23)."""

    def __init__(self, args=(), binary=None, port=None, ready=None):
        """ready: a predicate saying etcd serves (args may move its client
        port off plain HTTP); by default etcdctl endpoint health on .url."""
        binary = binary or oracle()
        self.port = port or free_port()
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = tempfile.mkdtemp(prefix="etcd-test-", dir=base)
        self.url = "http://127.0.0.1:%d" % self.port
        _tmpdirs.append(self.dir)
        self.p = spawn([binary, "--name", "ref", "--data-dir", self.dir,
                        "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                        "--listen-peer-urls", "http://127.0.0.1:%d" % free_port(),
                        "--log-level", "error"] + list(args),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_for(ready or (lambda: etcdctl(self, "endpoint", "health", timeout=10)[0] == 0), 60, 0.1):
            raise RuntimeError("etcd did not start")

    def endpoint(self):
        return "127.0.0.1:%d" % self.port

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        subprocess.run(["rm", "-rf", self.dir])


_PB = {}


def pb():
    """Python protobuf modules generated (once, into a temp dir) from kvd's
    own proto/ files, which are wire-identical to etcd's."""
    if not _PB:
        out = tempfile.mkdtemp(prefix="kvd-pb-")
        files = [f for f in os.listdir(os.path.join(ROOT, "proto")) if f.endswith(".proto")]
        subprocess.run(["protoc", "--python_out=" + out, "-I" + os.path.join(ROOT, "proto")] +
                       [os.path.join(ROOT, "proto", f) for f in files], check=True)
        sys.path.insert(0, out)
        import importlib
        for f in files:
            name = f[:-6] + "_pb2"
            _PB[f[:-6]] = importlib.import_module(name)
    return _PB


class Client:
    """grpcio calls with messages from pb(); answers ('ok', msg) or ('err', code, text)."""

    RESP = {"Range": "RangeResponse", "Put": "PutResponse", "DeleteRange": "DeleteRangeResponse",
            "Txn": "TxnResponse", "Compact": "CompactionResponse"}

    def __init__(self, endpoint):
        import grpc
        self.grpc = grpc
        self.ch = grpc.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", -1),
                                                           ("grpc.max_send_message_length", -1)])
        self.rpc = pb()["rpc"]

    def call(self, method, req, service="etcdserverpb.KV", resp=None, timeout=10):
        cls = getattr(self.rpc, resp or self.RESP[method])
        f = self.ch.unary_unary("/%s/%s" % (service, method), request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=cls.FromString)
        try:
            return ("ok", f(req, timeout=timeout))
        except self.grpc.RpcError as e:
            return ("err", e.code().name, e.details())

    def stream(self, method, req, resp, service="etcdserverpb.KV", timeout=30):
        cls = getattr(self.rpc, resp)
        f = self.ch.unary_stream("/%s/%s" % (service, method), request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=cls.FromString)
        try:
            return ("ok", list(f(req, timeout=timeout)))
        except self.grpc.RpcError as e:
            return ("err", e.code().name, e.details())

    def close(self):
        self.ch.close()


class WatchStream:
    """One Watch bidi stream through grpcio: send() requests, responses pile
    up in .got (a reader thread), wait_for() them."""

    def __init__(self, endpoint, metadata=None):
        import grpc
        import queue
        self.rpc = pb()["rpc"]
        self.ch = grpc.insecure_channel(endpoint, options=[("grpc.max_receive_message_length", -1)])
        self.q = queue.Queue()
        self.got = []
        self.error = None
        self.done = threading.Event()
        f = self.ch.stream_stream("/etcdserverpb.Watch/Watch", request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=self.rpc.WatchResponse.FromString)

        def reqs():
            while True:
                r = self.q.get()
                if r is None:
                    return
                yield r
        self.call = f(reqs(), metadata=metadata)

        def reader():
            try:
                for r in self.call:
                    self.got.append(r)
            except Exception as e:  # stream ended or cancelled
                self.error = e
            self.done.set()
        threading.Thread(target=reader, daemon=True).start()

    def create(self, **kw):
        r = self.rpc.WatchRequest()
        r.create_request.CopyFrom(self.rpc.WatchCreateRequest(**kw))
        self.q.put(r)

    def cancel(self, wid):
        r = self.rpc.WatchRequest()
        r.cancel_request.watch_id = wid
        self.q.put(r)

    def progress(self):
        r = self.rpc.WatchRequest()
        r.progress_request.SetInParent()
        self.q.put(r)

    def wait(self, n, timeout=60.0):
        """Wait until at least n responses arrived."""
        return wait_for(lambda: len(self.got) >= n, timeout, 0.005)

    def close(self):
        self.q.put(None)
        self.call.cancel()
        self.ch.close()


def etcdctl(kvd, *args, timeout=20, env=None):
    e = dict(os.environ, ETCDCTL_API="3")
    if env:
        e.update(env)
    r = subprocess.run(["etcdctl", "--endpoints", kvd.endpoint() if hasattr(kvd, "endpoint") else kvd]
                       + list(args), capture_output=True, timeout=timeout, env=e)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


# ------------------------------------------------------------------ gRPC bytes
def grpc_frame(msg, flag=0):
    return struct.pack(">BI", flag, len(msg)) + msg


def grpc_messages(data):
    out, i = [], 0
    while i + 5 <= len(data):
        n = struct.unpack(">I", data[i + 1:i + 5])[0]
        out.append(data[i + 5:i + 5 + n])
        i += 5 + n
    return out


def pb_string(field, s):
    b = s if isinstance(s, bytes) else s.encode()
    return varint((field << 3) | 2) + varint(len(b)) + b


def nested_txn(levels, leaf=b""):
    """A TxnRequest whose success branch holds a txn, levels deep (leaf
    innermost): what etcd's and kvd's nesting bounds are about."""
    inner = leaf
    for _ in range(levels):
        inner = pb_string(2, pb_string(4, inner))
    return inner


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def grpc_headers(path, port=0, extra=()):
    return [(":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", "127.0.0.1:%d" % port), ("content-type", "application/grpc"),
            ("te", "trailers")] + list(extra)


# ------------------------------------------------------------------ python-h2 client
class CallResult:
    def __init__(self):
        self.headers = None
        self.trailers = None
        self.data = b""
        self.reset = None
        self.goaway = None
        self.violation = None
        self.closed = False

    def status(self):
        h = dict(self.trailers or self.headers or {})
        return h.get("grpc-status")

    def message(self):
        h = dict(self.trailers or self.headers or {})
        return h.get("grpc-message")


def h2_call(port, path, body, window=65535, slow=0.0, extra=(), max_frame=16384, timeout=30,
            pad=0, half_close=True, read_until=None):
    """One call through python-h2.  The body is sent within the server's windows;
    the response is read with our window `window`, sleeping `slow` seconds
    before each WINDOW_UPDATE.  Protocol violations by the server land in
    .violation (python-h2 raises them)."""
    cfg = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    conn = h2.connection.H2Connection(config=cfg)
    conn.local_settings = h2.settings.Settings(client=True, initial_values={
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window,
        h2.settings.SettingCodes.MAX_FRAME_SIZE: max_frame,
        h2.settings.SettingCodes.ENABLE_PUSH: 0})
    conn.initiate_connection()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(conn.data_to_send())
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, grpc_headers(path, port, extra))
    res = CallResult()
    off, done, t0 = 0, False, time.time()
    sent_all = False
    while not done and time.time() - t0 < timeout:
        while not sent_all and off < len(body):
            room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size - pad - 1)
            if room <= 0:
                break
            chunk = body[off:off + room]
            off += len(chunk)
            conn.send_data(sid, chunk, end_stream=half_close and off >= len(body), pad_length=pad or None)
        if off >= len(body) and not sent_all:
            if not body and half_close:
                conn.end_stream(sid)
            sent_all = True
        s.sendall(conn.data_to_send())
        try:
            d = s.recv(1 << 16)
        except socket.timeout:
            break
        if not d:
            res.closed = True
            break
        try:
            events = conn.receive_data(d)
        except h2.exceptions.ProtocolError as e:
            res.violation = "%s: %s" % (type(e).__name__, e)
            break
        for ev in events:
            if isinstance(ev, h2.events.ResponseReceived):
                res.headers = ev.headers
            elif isinstance(ev, h2.events.DataReceived):
                res.data += ev.data
                if slow:
                    time.sleep(slow)
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.TrailersReceived):
                res.trailers = ev.headers
            elif isinstance(ev, h2.events.StreamEnded):
                done = True
            elif isinstance(ev, h2.events.StreamReset):
                res.reset = ev.error_code
                done = True
            elif isinstance(ev, h2.events.ConnectionTerminated):
                res.goaway = (ev.error_code, ev.last_stream_id, ev.additional_data)
                done = True
        if read_until and read_until(res):
            break
        try:
            s.sendall(conn.data_to_send())
        except OSError:
            break
    s.close()
    return res


# ------------------------------------------------------------------ raw frames
def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def settings(pairs=()):
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


class H2:
    """A raw client connection: send anything, read frames back."""

    def __init__(self, port, init_window=65535, preface=True, timeout=5, source=None):
        self.port = port
        self.s = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                          source_address=(source, 0) if source else None)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.enc = Encoder()
        self.buf = b""
        self.closed = False
        if preface:
            self.send(PREFACE + settings([(4, init_window)]) + frame(SETTINGS, 1, 0))

    def block(self, path="/grpc.health.v1.Health/Check", extra=()):
        return self.enc.encode(grpc_headers(path, self.port, extra))

    def send(self, data):
        try:
            self.s.sendall(data)
            return True
        except OSError:
            self.closed = True
            return False

    def call(self, sid, path="/grpc.health.v1.Health/Check", body=b"\0\0\0\0\0", extra=()):
        return self.send(frame(HEADERS, 4, sid, self.block(path, extra)) + frame(DATA, 1, sid, body))

    def frames(self, wait=1.0, until=None):
        """Frames read for up to `wait` seconds (or until `until(frames)`)."""
        out = []
        end = time.time() + wait
        while time.time() < end and not self.closed:
            self.s.settimeout(max(0.01, end - time.time()))
            try:
                d = self.s.recv(1 << 20)
            except socket.timeout:
                break
            except OSError:
                self.closed = True
                break
            if not d:
                self.closed = True
                break
            self.buf += d
            while len(self.buf) >= 9:
                ln = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) < 9 + ln:
                    break
                out.append((self.buf[3], self.buf[4], struct.unpack(">I", self.buf[5:9])[0] & 0x7FFFFFFF,
                            self.buf[9:9 + ln]))
                self.buf = self.buf[9 + ln:]
            if until and until(out):
                break
        return out

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


def goaways(frames):
    out = []
    for t, f, sid, p in frames:
        if t == GOAWAY:
            last, code = struct.unpack(">II", p[:8])
            out.append((last, ERRORS[code] if code < len(ERRORS) else code, p[8:]))
    return out


def rsts(frames):
    return [(sid, ERRORS[struct.unpack(">I", p)[0]]) for t, f, sid, p in frames if t == RST_STREAM]


def count(frames, ftype, flags=None):
    return sum(1 for t, f, sid, p in frames if t == ftype and (flags is None or f == flags))


def decode_headers(frames, sid):
    """Decode every HEADERS block kvd sent on sid (kvd never indexes, so a fresh
    decoder per block is fine)."""
    from hpack import Decoder
    out = []
    for t, f, s, p in frames:
        if t == HEADERS and s == sid:
            out.append(dict(Decoder().decode(p)))
    return out


def read_to_end(s):
    """Every byte a socket (or TLS socket) sends until the peer closes."""
    got = b""
    while True:
        d = s.recv(4096)
        if not d:
            return got
        got += d


def wait_for(pred, timeout=30.0, step=0.02):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def main_guard(argv):
    sys.exit(run_tests(argv))
