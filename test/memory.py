"""kvd in small memory: 100k keys inside a 16 MiB address-space limit (and a
16 MiB cgroup where the machine has cgroup v1's memory controller), written,
read back, replayed at restart; and the allocation-failure sweep run against
the daemon (test/kvd-test, ASan): every allocation of each kind of request
made to fail in turn, the request must get an error or succeed, kvd must go
on serving, and every acknowledged write must be there, after a restart too.
Run with /usr/bin/python3."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
import kvdtest  # noqa: E402
from kvdtest import ROOT, Client, Kvd, check, pb, run_tests, test  # noqa: E402

KVD = os.environ.get("KVD", os.path.join(ROOT, "kvd"))
KVD_TEST = os.environ.get("KVD_TEST", os.path.join(ROOT, "test", "kvd-test"))
LIMIT = 16 << 20


def wait_for(cond, timeout=60.0):
    return kvdtest.wait_for(cond, timeout)


def load(c, n, prefix=b"key/", vlen=40):
    R = pb()["rpc"]
    done = 0
    while done < n:
        ops = []
        for i in range(done, min(n, done + 128)):
            k = prefix + b"%06d" % i
            ops.append(R.RequestOp(request_put=R.PutRequest(key=k, value=(k * 4)[:vlen])))
        r = c.call("Txn", R.TxnRequest(success=ops), timeout=30)
        if r[0] != "ok":
            return r
        done += len(ops)
    return ("ok", done)


def count(c, prefix=b"key/"):
    R = pb()["rpc"]
    r = c.call("Range", R.RangeRequest(key=prefix, range_end=prefix[:-1] + bytes([prefix[-1] + 1]), count_only=True),
               timeout=30)
    return r[1].count if r[0] == "ok" else r


def vm(k, field):
    with open("/proc/%d/status" % k.p.pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


@test
def hundred_thousand_keys_in_16_mib_of_address_space():
    """prlimit --as: every mapping counts (the binary, libc, mbedtls, stacks, heap)."""
    args = []
    wrap = ["prlimit", "--as=%d" % LIMIT, "--"]
    k = Kvd(KVD, args=args, wrap=wrap)
    c = Client(k.endpoint())
    r = load(c, 100000)
    check(r == ("ok", 100000), "100k keys written under the limit: %r" % (r,))
    check(count(c) == 100000, "100k keys read back")
    peak = vm(k, "VmPeak")
    rss = vm(k, "VmRSS")
    print("  100k keys: VmPeak %d KiB, VmRSS %d KiB (limit %d KiB)" % (peak, rss, LIMIT >> 10))
    check(0 < peak <= LIMIT >> 10, "inside the limit")
    c.close()
    check(k.stop() == 0, "a clean stop")
    k = Kvd(KVD, args=args, wrap=wrap, data_dir=k.dir)  # the replay under the same limit
    c = Client(k.endpoint())
    check(count(c) == 100000, "replayed under the limit")
    R = pb()["rpc"]
    r = c.call("Range", R.RangeRequest(key=b"key/054321"))
    check(r[0] == "ok" and r[1].kvs[0].value == (b"key/054321" * 4)[:40], "a value intact")
    # past the limit: more keys until an allocation fails; a clear error, no crash
    errs = load(c, 400000, prefix=b"more/", vlen=200)
    check(errs[0] == "err" and errs[1] == "RESOURCE_EXHAUSTED" and errs[2] == "kvd: out of memory",
          "past the limit: a clear error: %r" % (errs,))
    print("  past the limit: %r" % (errs,))
    check(k.p.poll() is None, "still running")
    check(count(c) == 100000, "the first 100k still there")
    c.close()
    k.stop()


@test
def hundred_thousand_keys_in_a_16_mib_cgroup():
    """cgroup v1's memory controller (what OpenWrt's procd and systemd set):
    RSS and the page cache of the log count; the kernel must not kill kvd."""
    base = "/sys/fs/cgroup/memory"
    if not os.access(base, os.W_OK):
        print("  SKIPPED: no writable cgroup v1 memory controller here")
        return
    g = os.path.join(base, "kvd-test-%d" % os.getpid())
    os.mkdir(g)
    try:
        with open(g + "/memory.limit_in_bytes", "w") as f:
            f.write(str(LIMIT))
        wrap = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', g]
        k = Kvd(KVD, wrap=wrap)
        c = Client(k.endpoint())
        r = load(c, 100000)
        check(r == ("ok", 100000) and count(c) == 100000, "100k keys in the cgroup: %r" % (r,))
        with open(g + "/memory.max_usage_in_bytes") as f:
            peak = int(f.read())
        with open(g + "/memory.failcnt") as f:
            failcnt = int(f.read())
        print("  cgroup peak %d KiB (RSS and page cache), %d times at the limit" % (peak >> 10, failcnt))
        check(k.p.poll() is None and peak <= LIMIT, "alive, inside the cgroup")
        c.close()
        check(k.stop() == 0, "a clean stop")
        k = Kvd(KVD, wrap=wrap, data_dir=k.dir)
        c = Client(k.endpoint())
        check(count(c) == 100000, "replayed inside the cgroup")
        c.close()
        k.stop()
    finally:
        os.rmdir(g)


# The sweep: each request kind, each of its allocations failed in turn.
def fail_alloc(ch, n):
    """Set the n-th allocation from now to fail; the call itself may be the
    one that meets a failure set before: it is asked again until answered."""
    f = ch.unary_unary("/kvd.test.Test/FailAlloc")
    out = []

    def ask():
        try:
            out.append(f(str(n).encode(), timeout=10).decode())
        except Exception:
            pass
        return bool(out)
    wait_for(ask, 60)
    return out[0] if out else None


@test
def allocation_failure_sweep_in_the_daemon():
    import grpc
    R = pb()["rpc"]
    k = Kvd(KVD_TEST)
    ch = grpc.insecure_channel(k.endpoint())
    c = Client(k.endpoint())
    acked = {}
    state = {"i": 0, "lease": 0}

    def put():
        state["i"] += 1
        key, val = b"sweep/%06d" % state["i"], b"v%d" % state["i"]
        r = c.call("Put", R.PutRequest(key=key, value=val))
        if r[0] == "ok":
            acked[key] = val
        return r

    def txn():
        state["i"] += 1
        key, val = b"sweep/%06d" % state["i"], b"t%d" % state["i"]
        r = c.call("Txn", R.TxnRequest(compare=[R.Compare(key=b"sweep/", target=R.Compare.VERSION,
                                                            result=R.Compare.GREATER, version=-1)],
                                       success=[R.RequestOp(request_put=R.PutRequest(key=key, value=val)),
                                                R.RequestOp(request_range=R.RangeRequest(key=b"sweep/",
                                                                                         range_end=b"sweep0"))]))
        if r[0] == "ok":
            acked[key] = val
        return r

    def rng():
        return c.call("Range", R.RangeRequest(key=b"sweep/", range_end=b"sweep0", limit=50))

    def delete():
        state["i"] += 1
        key = b"sweep/%06d" % state["i"]
        c.call("Put", R.PutRequest(key=key, value=b"x"))
        r = c.call("DeleteRange", R.DeleteRangeRequest(key=key))
        if r[0] != "ok":
            acked.pop(key, None)
        return r

    def lease():
        r = c.call("LeaseGrant", R.LeaseGrantRequest(TTL=600), service="etcdserverpb.Lease",
                   resp="LeaseGrantResponse")
        if r[0] == "ok":
            state["i"] += 1
            key = b"sweep/%06d" % state["i"]
            if c.call("Put", R.PutRequest(key=key, value=b"l", lease=r[1].ID))[0] == "ok":
                acked[key] = b"l"
        return r

    def watch():
        f = ch.stream_stream("/etcdserverpb.Watch/Watch", request_serializer=lambda m: m.SerializeToString(),
                             response_deserializer=R.WatchResponse.FromString)
        req = R.WatchRequest(create_request=R.WatchCreateRequest(key=b"sweep/", range_end=b"sweep0",
                                                                 start_revision=1))
        try:
            it = f(iter([req]), timeout=10)
            first = next(it)
            it.cancel()
            return ("ok", first)
        except grpc.RpcError as e:
            return ("err", e.code().name, e.details())
        except StopIteration:
            return ("err", "EOF", "")

    def keepalive():
        r = c.call("LeaseGrant", R.LeaseGrantRequest(TTL=600), service="etcdserverpb.Lease",
                   resp="LeaseGrantResponse")
        if r[0] != "ok":
            return r
        f = ch.stream_stream("/etcdserverpb.Lease/LeaseKeepAlive", request_serializer=lambda m: m.SerializeToString(),
                             response_deserializer=R.LeaseKeepAliveResponse.FromString)
        try:
            it = f(iter([R.LeaseKeepAliveRequest(ID=r[1].ID)]), timeout=10)
            first = next(it)
            it.cancel()
            return ("ok", first) if first.TTL > 0 else ("err", "TTL", str(first))
        except grpc.RpcError as e:
            return ("err", e.code().name, e.details())
        except StopIteration:
            return ("err", "EOF", "")

    def gateway():  # HTTP/1.1 and the JSON mapping
        import base64
        import http.client
        import json
        state["i"] += 1
        key, val = b"sweep/%06d" % state["i"], b"g%d" % state["i"]
        body = json.dumps({"key": base64.b64encode(key).decode(), "value": base64.b64encode(val).decode()})
        h = http.client.HTTPConnection("127.0.0.1", k.port, timeout=10)
        try:
            h.request("POST", "/v3/kv/put", body=body, headers={"Content-Type": "application/json"})
            resp = h.getresponse()
            text = resp.read().decode(errors="replace")
        except TimeoutError as e:
            return ("err", "HANG", "no answer in 10 s: %s" % e)
        except (OSError, http.client.HTTPException) as e:
            return ("err", "UNAVAILABLE", "connection: %s" % e)
        finally:
            h.close()
        if resp.status == 200:
            acked[key] = val
            return ("ok", text)
        return ("err", "RESOURCE_EXHAUSTED" if "out of memory" in text else "HTTP %d" % resp.status, text)

    kinds = [("Put", put), ("Txn", txn), ("Range", rng), ("DeleteRange", delete), ("Lease", lease),
             ("Watch", watch), ("KeepAlive", keepalive), ("Gateway", gateway)]
    seen = set()
    allowed = ("RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL", "UNKNOWN", "CANCELLED")
    for name, fn in kinds:
        before = int(fail_alloc(ch, 0).split()[0].split("=")[1])
        fn()
        after = int(fail_alloc(ch, 0).split()[0].split("=")[1])
        n = after - before + 3
        errors = 0
        for i in range(1, n + 1):
            fail_alloc(ch, i)
            r = fn()
            fail_alloc(ch, 0)
            if r[0] != "ok":
                errors += 1
                seen.add((r[1], r[2][:60]))
                if not check(r[1] in allowed, "%s, allocation %d failed: %r" % (name, i, r)):
                    break
            if not check(k.p.poll() is None, "%s, allocation %d failed: kvd still runs" % (name, i)):
                break
        print("  %-12s %3d allocations swept, %3d answered with an error" % (name, n, errors))
        if k.p.poll() is not None:
            break
        r = c.call("Range", R.RangeRequest(key=b"sweep/", range_end=b"sweep0"))
        got = {kv.key: kv.value for kv in r[1].kvs} if r[0] == "ok" else {}
        lost = [key for key, v in acked.items() if got.get(key) != v]
        check(r[0] == "ok" and not lost, "%s: every acknowledged write is there (%d lost)" % (name, len(lost)))
    print("  errors seen: %s" % sorted(seen))
    c.close()
    ch.close()
    check(k.stop() == 0, "a clean stop, no sanitizer report: %s" % k.logtext()[-2000:])
    k = Kvd(KVD_TEST, data_dir=k.dir)
    c = Client(k.endpoint())
    r = c.call("Range", R.RangeRequest(key=b"sweep/", range_end=b"sweep0"))
    got = {kv.key: kv.value for kv in r[1].kvs} if r[0] == "ok" else {}
    lost = [key for key, v in acked.items() if got.get(key) != v]
    check(r[0] == "ok" and not lost and len(acked) > 50, "after a restart, %d acknowledged writes, %d lost" %
          (len(acked), len(lost)))
    c.close()
    k.stop()


IDLE_RSS_GOAL = 512  # KiB: the footprint goal for the static binary (README: Build)


@test
def idle_rss():
    """The x86_64 static binary (KVD_STATIC=./kvd-static: make static-check
    builds it and runs this) idle under 512 KiB of RSS: freshly started, and
    restarted on a small store (keys, a leased key, a user, a compaction:
    the replay's code).  It holds because kvd.c's KVD_RESIDENT keeps the
    code a start and an idle loop run together, where the kernel maps text
    64 KB around each page touched; without the marks it is about 560 and
    660 KiB.  Not the dynamic build: its shared libraries are mapped by
    their own rules."""
    binary = os.environ.get("KVD_STATIC")
    if not binary:
        print("  SKIPPED: KVD_STATIC unset (make static-check sets it to the static binary it builds)")
        return
    R = pb()["rpc"]
    A = pb()["auth"]
    k = Kvd(binary)
    fresh = k.rss_kb()
    c = Client(k.endpoint())
    for n in (0, 100):
        check(c.call("Txn", R.TxnRequest(success=[R.RequestOp(request_put=R.PutRequest(key=b"k%d" % i, value=b"v" * 100))
                                                  for i in range(n, n + 100)]))[0] == "ok", "keys written")
    lease = c.call("LeaseGrant", R.LeaseGrantRequest(TTL=600), service="etcdserverpb.Lease",
                   resp="LeaseGrantResponse")
    check(lease[0] == "ok" and c.call("Put", R.PutRequest(key=b"leased", value=b"x", lease=lease[1].ID))[0] == "ok",
          "a leased key")
    check(c.call("UserAdd", R.AuthUserAddRequest(name="u", password="pw", options=A.UserAddOptions()),
                 service="etcdserverpb.Auth", resp="AuthUserAddResponse")[0] == "ok", "a user")
    check(c.call("Compact", R.CompactionRequest(revision=3), resp="CompactionResponse")[0] == "ok", "a compaction")
    check(c.call("Put", R.PutRequest(key=b"k1", value=b"again"))[0] == "ok", "an overwrite")
    c.close()
    check(k.stop() == 0, "a clean stop")
    k = Kvd(binary, data_dir=k.dir)
    restarted = k.rss_kb()
    c = Client(k.endpoint())
    r = c.call("Range", R.RangeRequest(key=b"k1"))
    check(r[0] == "ok" and r[1].kvs[0].value == b"again", "the store replayed")
    c.close()
    k.stop()
    print("  idle RSS of %s: %d KiB fresh, %d KiB restarted on a small store (goal < %d KiB)" %
          (os.path.basename(binary), fresh, restarted, IDLE_RSS_GOAL))
    check(0 < fresh < IDLE_RSS_GOAL, "fresh: %d KiB" % fresh)
    check(0 < restarted < IDLE_RSS_GOAL, "restarted: %d KiB" % restarted)


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
