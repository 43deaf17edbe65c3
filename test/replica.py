#!/usr/bin/python3
"""kvd --replicate-from an etcd 3.7.3 (test/peers; without Go >= 1.26 the
tests on it say SKIPPED, a failure under KVD_REQUIRE_GO_PEERS), Debian's
etcd 3.4.23, or another kvd: the replica follows the cluster's Watch and
keeps its numbers.  Every comparison is field by field against the
upstream itself, at a revision both have.

- follows_etcd: etcd with history (puts, deletes, txns, a lease with
  keys), then kvd --replicate-from it (an empty store is seeded from
  etcd's snapshot, the watch opened first), then more writes through etcd: at the common revision HashKV
  is equal (hash and compact_revision) and Range over every key is equal
  field by field (key, value, create/mod revision, version, lease), at the
  newest revision and at past ones; a watcher on the replica and one on
  etcd from the same revision hear the same events, revision for
  revision; with --replica-read-only, writes to the replica are refused
  (FAILED_PRECONDITION, the reason named).
- forwards_writes_and_linearizable_reads: Put, Txn, LeaseGrant, a leased
  Put, LeaseTimeToLive, LeaseRevoke made on the replica are etcd's, each
  seen on the replica when answered (read-your-writes); etcd's errors
  come back as etcd's; a linearizable Range sees etcd's newest write;
  kvd_replica_* on /metrics; etcd
  stopped, linearizable reads and writes end "etcdserver: request timed
  out" while serializable reads are served.
- seeds_from_compacted_etcd_under_writes: etcd compacted and a writer busy
  while the replica seeds: the watch's events kept during the snapshot
  and above its revision applied after it; equal state, and the
  compaction point came with the snapshot.
- resumes_after_kill9: kvd killed with SIGKILL, more writes on etcd, kvd
  started again on its data dir: it resumes from its own revision + 1 (its
  log says so, and that the store was not empty: no reseed), and the
  hashes and ranges are equal again.
- next_url_when_one_fails: two URLs, nobody on the first: the replica logs
  why, tries the next, seeds and follows from it.
- mirrors_compactions: etcd compacts (logical, then physical) while the
  replica follows; the replica finds each point (a Range probe, halving)
  and compacts there: Range below it refused as etcd refuses it, HashKV
  (compact_revision too) and Range equal above it.
- compacted_while_offline_must_reseed: etcd compacts past an offline
  replica's revision; started again, the cluster's HashKV at the
  replica's revision is refused as compacted and the replica logs "must
  reseed", applying nothing, serializable reads served, linearizable ones
  refused naming why (reseeding a non-empty store is not done yet).
- lease_revoke_same_revision: a lease with keys revoked on etcd: the
  replica deletes them at the revision etcd's revoke took, in one
  revision, as etcd's watchers see it.
- hands_a_board_over_to_etcd: a board's store saved (kvd --snapshot-save),
  restored into etcd 3.7.3 (etcdutl), the board started as its replica:
  HashKV checked at its revision, followed from revision + 1 without a
  reseed, equal to etcd after more writes; a board that wrote after its
  snapshot, and one with another history, are refused.
- follows_a_three_member_cluster_through_faults: a 3-member etcd 3.7.3
  cluster under a steady writer; the member the replica follows killed
  and restarted, another stopped (the replica leaves it on an unanswered
  keepalive PING), kvd killed and restarted: no reseed, HashKV, Range and
  a whole-keyspace watch equal to the cluster's, every acknowledged
  write's revision on the replica.
- follows_a_debian_etcd_34_cluster: the same under a steady writer with a
  3-member cluster of Debian's etcd 3.4.23 (/usr/bin/etcd): seeded from
  its snapshot, the member followed killed and restarted, kvd killed and
  restarted (no reseed), a compaction mirrored (a Range below it refused
  alike), a forwarded Put seen when answered; HashKV (hash and
  compact_revision: 3.4 gives no hash_revision), Range and a
  whole-keyspace watch equal; then the replica stopped at revision N
  and the cluster compacted at exactly N (3.4 has no HashKV there): it
  compares the cluster's keys at N with its own and resumes.
- follows_another_kvd: a plain kvd as the upstream, a replica of it, and
  a replica of that replica (a chain): seeded, live writes, a Put on the
  chain's end reaches the upstream and is seen on both replicas when
  answered, a linearizable Range on the chain's end, a compaction made
  down the chain, the middle replica killed (-9) and restarted (no
  reseed); HashKV, Range and the watch's events equal on all three.
- follows_an_https_cluster_with_client_certificates: etcd 3.7.3 on
  https:// with --client-cert-auth; the replica with --replicate-cacert,
  --replicate-cert and --replicate-key seeds, follows (HashKV equal) and
  forwards a write; no client certificate, another CA, and an upstream
  whose certificate names another host are refused at the handshake, the
  reason logged, nothing applied.
- a_silent_upstream_costs_no_cpu: a member that takes the connection and
  never answers (http:// and https://): the replica's CPU while it waits
  stays a small part of the time (a 0 timer or POLLOUT behind a handshake
  would spin a core).
- no_leader_as_an_etcd_member: the member the replica follows cut from
  its quorum (the two others stopped): hasleader watches on the replica
  and on that member end alike ("etcdserver: no leader"), new ones are
  refused, Status says so (leader 0); others go on; then it follows
  again, Status clean, raftIndex = raftAppliedIndex.
- follows_a_cluster_with_auth_on: etcd 3.7.3 with auth on; the replica
  with --replicate-user root:pw seeds (the cluster's users with it: alice
  refused alike on both), follows (HashKV equal), resumes after kill -9;
  writes on it refused naming --replicate-user; a wrong password and no
  user at all logged with the reason and retried.
- a_thousand_local_watchers_cost_the_cluster_one: 1000 watchers on the
  replica; etcd's own watcher and stream gauges show one each.
Last line: "N passed, N failed".
"""
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest
from kvdtest import Client, Etcd, Kvd, WatchStream, check, pb, run_tests, test, wait_for
import kvdtest  # noqa: E402
import tls as T  # noqa: E402  test/tls.py: its CA and certificates (openssl), etcdctl over TLS
del kvdtest._tests[:]  # its tests are its own to run

KVD = os.environ.get("KVD") or None


def rpc():
    return pb()["rpc"]


def put(c, key, val, lease=0):
    r = c.call("Put", rpc().PutRequest(key=key, value=val, lease=lease))
    assert r[0] == "ok", r
    return r[1].header.revision


def revision(c):
    r = c.call("Range", rpc().RangeRequest(key=b"\0", count_only=True, serializable=True))
    return r[1].header.revision if r[0] == "ok" else -1


def history(c, tag):
    """Puts, overwrites, deletes, a multi-op txn, a lease with keys."""
    m = rpc()
    for i in range(20):
        put(c, b"%s/k%02d" % (tag, i % 7), b"v%d" % i)
    c.call("DeleteRange", m.DeleteRangeRequest(key=b"%s/k03" % tag))
    c.call("DeleteRange", m.DeleteRangeRequest(key=b"%s/k05" % tag, range_end=b"%s/k07" % tag))
    t = m.TxnRequest()
    t.compare.add(key=b"%s/k00" % tag, target=m.Compare.VERSION, result=m.Compare.GREATER, version=0)
    t.success.add().request_put.CopyFrom(m.PutRequest(key=b"%s/t1" % tag, value=b"a"))
    t.success.add().request_put.CopyFrom(m.PutRequest(key=b"%s/k00" % tag, value=b"txn"))
    t.success.add().request_delete_range.CopyFrom(m.DeleteRangeRequest(key=b"%s/k01" % tag))
    t.failure.add().request_put.CopyFrom(m.PutRequest(key=b"%s/never" % tag, value=b"x"))
    r = c.call("Txn", t)
    assert r[0] == "ok" and r[1].succeeded, r
    r = c.call("LeaseGrant", m.LeaseGrantRequest(TTL=600), service="etcdserverpb.Lease", resp="LeaseGrantResponse")
    assert r[0] == "ok", r
    lid = r[1].ID
    put(c, b"%s/l1" % tag, b"x", lid)
    put(c, b"%s/l2" % tag, b"y", lid)
    put(c, b"%s/l2" % tag, b"y2", lid)
    return lid


def caught_up(kc, ec, timeout=30):
    """Wait until the replica is at etcd's revision; that revision, or -1."""
    want = revision(ec)
    ok = wait_for(lambda: revision(kc) == want, timeout, 0.02)
    return want if ok else -1


def hashkv(c, rev):
    r = c.call("HashKV", rpc().HashKVRequest(revision=rev), service="etcdserverpb.Maintenance", resp="HashKVResponse")
    return (r[1].hash, r[1].compact_revision, r[1].hash_revision) if r[0] == "ok" else r


def kvs(c, rev=0, serializable=False):
    r = c.call("Range", rpc().RangeRequest(key=b"\0", range_end=b"\0", revision=rev, serializable=serializable))
    if r[0] != "ok":
        return r
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) for kv in r[1].kvs]


def same_hashkv(hk, he, rev):
    """HashKV tuples equal: hash and compact_revision always; hash_revision
    when the upstream gives one (etcd 3.4's HashKVResponse has none: 0)."""
    if not (isinstance(hk, tuple) and isinstance(he, tuple)):
        return False
    if he[2] == 0:
        return hk[:2] == he[:2] and hk[2] == rev
    return hk == he and he[2] == rev


def same_state(kc, ec, rev, what):
    """HashKV and Range equal at rev and at a few revisions below it."""
    hk, he = hashkv(kc, rev), hashkv(ec, rev)
    ok = check(same_hashkv(hk, he, rev), "%s: HashKV at %d: kvd %s, etcd %s" % (what, rev, hk, he))
    for r in sorted({rev, max(1, rev - 1), max(1, rev // 2), 2}):
        a, b = kvs(kc, r), kvs(ec, r)
        ok = check(a == b and (r < 2 or bool(a)), "%s: Range at %d differs:\n kvd  %s\n etcd %s" % (what, r, a, b)) and ok
    a, b = kvs(kc), kvs(ec)
    ok = check(a == b, "%s: Range at the newest revision differs" % what) and ok
    return ok


def events(ws, upto):
    """The watch's events up to revision upto, flattened, once it heard them."""
    def flat():
        out = []
        for resp in ws.got:
            for e in resp.events:
                out.append((e.type, e.kv.key, e.kv.value, e.kv.create_revision, e.kv.mod_revision, e.kv.version,
                            e.kv.lease))
        return out
    wait_for(lambda: any(x[4] >= upto for x in flat()), 20, 0.02)
    return [x for x in flat() if x[4] <= upto]


def metrics(k):
    """kvd's /metrics (on its client port): {name: value} of unlabelled samples."""
    import urllib.request
    out = {}
    for line in urllib.request.urlopen("%s/metrics" % k.url, timeout=10).read().decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, val = line.rsplit(" ", 1)
            out[name] = float(val)
    return out


def replica(e, data_dir=None):
    return Kvd(KVD, args=["--replicate-from", e.url], data_dir=data_dir)


@test
def follows_etcd():
    e = Etcd()
    ec = Client(e.endpoint())
    history(ec, b"a")
    k = replica(e)
    kc = Client(k.endpoint())
    rev = caught_up(kc, ec)
    check(rev > 20, "the replica reached etcd's revision %d: at %d" % (revision(ec), revision(kc)))
    check("the store is empty, seeding it from a snapshot" in k.logtext() and "replica: seeded from a snapshot" in
          k.logtext(), "an empty store is seeded from a snapshot: %s" % k.logtext()[-1500:])
    same_state(kc, ec, rev, "seeded")
    # watchers from the same revision, on both, while etcd takes more writes
    wk, we = WatchStream(k.endpoint()), WatchStream(e.endpoint())
    for w in (wk, we):
        w.create(key=b"\0", range_end=b"\0", start_revision=rev - 5)
    history(ec, b"b")
    rev2 = caught_up(kc, ec)
    check(rev2 > rev, "the replica follows live writes: %d > %d" % (rev2, rev))
    same_state(kc, ec, rev2, "live")
    check("must reseed" not in k.logtext(), "the replica never stopped: %s" % k.logtext()[-800:])
    a, b = events(wk, rev2), events(we, rev2)
    check(a == b and len(a) > 20, "the same events from revision %d: kvd %d, etcd %d\n kvd  %s\n etcd %s" %
          (rev - 5, len(a), len(b), a[:6], b[:6]))
    wk.close()
    we.close()
    k.stop()
    # --replica-read-only: the replica's own clients cannot write
    k = Kvd(KVD, args=["--replicate-from", e.url, "--replica-read-only"], data_dir=k.dir)
    kc = Client(k.endpoint())
    check(caught_up(kc, ec) == rev2, "the read-only replica resumed at %d" % rev2)
    r = kc.call("Put", rpc().PutRequest(key=b"x", value=b"y"))
    check(r[0] == "err" and r[1] == "FAILED_PRECONDITION" and "replica" in r[2], "a Put to the replica: %s" % (r,))
    r = kc.call("LeaseGrant", rpc().LeaseGrantRequest(TTL=60), service="etcdserverpb.Lease", resp="LeaseGrantResponse")
    check(r[0] == "err" and r[1] == "FAILED_PRECONDITION", "a LeaseGrant to the replica: %s" % (r,))
    check(revision(kc) == rev2 and revision(ec) == rev2, "nothing was written")
    k.stop()
    e.stop()


@test
def forwards_writes_and_linearizable_reads():
    """Writes made on the replica go to etcd and are answered with etcd's
    answer once the replica applied its revision: a serializable read of
    the replica right after each answer sees the write (read-your-writes),
    the answer's header revision is etcd's; etcd's errors come back as etcd
    gives them to its own clients; a linearizable Range on the replica
    sees a write made on etcd just before it, every time (a probe of
    etcd, then the wait); /metrics shows the uplink up, no lag, the writes
    forwarded and the reads probed; etcd stopped (SIGSTOP), a linearizable Range and
    a write end Unavailable "etcdserver: request timed out" while a
    serializable Range is served; once the keepalive finds etcd stopped,
    /health says RAFT NO LEADER (200 with ?serializable=true), /readyz
    fails, /livez passes, kvd_replica_uplink_up is 0."""
    m = rpc()
    e = Etcd()
    ec = Client(e.endpoint())
    history(ec, b"a")
    k = replica(e)
    kc = Client(k.endpoint())
    caught_up(kc, ec)

    def seen(key):
        r = kc.call("Range", m.RangeRequest(key=key, serializable=True))
        return r[1].kvs[0].value if r[0] == "ok" and r[1].kvs else None

    bad = 0
    for i in range(40):
        key, val = b"f/k%d" % (i % 5), b"v%d" % i
        r = kc.call("Put", m.PutRequest(key=key, value=val, prev_kv=True))
        if not check(r[0] == "ok", "a Put through the replica: %s" % (r,)):
            break
        bad += seen(key) != val
    check(bad == 0, "read-your-writes: %d of 40 forwarded Puts not seen on the replica when answered" % bad)
    t = m.TxnRequest()
    t.compare.add(key=b"f/k0", target=m.Compare.VALUE, result=m.Compare.EQUAL, value=b"v35")
    t.success.add().request_put.CopyFrom(m.PutRequest(key=b"f/t", value=b"cas"))
    t.success.add().request_delete_range.CopyFrom(m.DeleteRangeRequest(key=b"f/k1"))
    r = kc.call("Txn", t)
    check(r[0] == "ok" and r[1].succeeded and r[1].header.revision == revision(ec), "a cas through the replica: %s" % (r,))
    check(seen(b"f/t") == b"cas" and seen(b"f/k1") is None, "the cas seen on the replica when answered")
    r = kc.call("LeaseGrant", m.LeaseGrantRequest(TTL=600), service="etcdserverpb.Lease", resp="LeaseGrantResponse")
    check(r[0] == "ok" and r[1].ID > 0, "a LeaseGrant through the replica: %s" % (r,))
    lid = r[1].ID
    r = kc.call("Put", m.PutRequest(key=b"f/l", value=b"x", lease=lid))
    check(r[0] == "ok" and seen(b"f/l") == b"x", "a Put with the lease through the replica: %s" % (r,))
    r = ec.call("LeaseTimeToLive", m.LeaseTimeToLiveRequest(ID=lid, keys=True), service="etcdserverpb.Lease",
                resp="LeaseTimeToLiveResponse")
    r2 = kc.call("LeaseTimeToLive", m.LeaseTimeToLiveRequest(ID=lid, keys=True), service="etcdserverpb.Lease",
                 resp="LeaseTimeToLiveResponse")
    check(r[0] == r2[0] == "ok" and r[1].ID == r2[1].ID and r[1].grantedTTL == r2[1].grantedTTL and
          list(r[1].keys) == list(r2[1].keys) == [b"f/l"], "LeaseTimeToLive: etcd %s, the replica %s" % (r, r2))
    r = kc.call("LeaseRevoke", m.LeaseRevokeRequest(ID=lid), service="etcdserverpb.Lease", resp="LeaseRevokeResponse")
    check(r[0] == "ok" and seen(b"f/l") is None, "a LeaseRevoke through the replica, its key gone when answered: %s" % (r,))
    # etcd's errors, as etcd gives them
    for req in (m.PutRequest(key=b"f/x", value=b"x", lease=0x7777), m.PutRequest(key=b"", value=b"x")):
        a, b = kc.call("Put", req), ec.call("Put", req)
        check(a == b and a[0] == "err", "an error through the replica: %s, etcd's own %s" % (a, b))
    rev = caught_up(kc, ec)
    same_state(kc, ec, rev, "after the forwarded writes")
    # a linearizable read sees etcd's newest write, every time
    stale = 0
    for i in range(60):
        rv = put(ec, b"lin", b"%d" % i)
        r = kc.call("Range", m.RangeRequest(key=b"lin"))
        stale += not (r[0] == "ok" and r[1].kvs and r[1].kvs[0].value == b"%d" % i and r[1].header.revision >= rv)
    check(stale == 0, "linearizable Range on the replica: %d of 60 did not see the write made just before" % stale)
    mt = metrics(k)
    check(mt.get("kvd_replica_uplink_up") == 1 and mt.get("kvd_replica_applied_revision") == revision(ec) and
          mt.get("kvd_replica_lag_revisions") == 0 and mt.get("kvd_replica_forwarded_total") == 45 and
          mt.get("kvd_replica_linearizable_reads_total", 0) >= 60,
          "/metrics: %s" % {x: y for x, y in mt.items() if x.startswith("kvd_replica")})
    # etcd unreachable: etcd's request timeout; serializable reads go on
    import urllib.error
    import urllib.request

    def get(path):
        try:
            with urllib.request.urlopen(k.url + path, timeout=10) as f:
                return f.status, f.read().decode()
        except urllib.error.HTTPError as x:
            return x.code, x.read().decode()
    e.p.send_signal(signal.SIGSTOP)
    try:
        r = kc.call("Range", m.RangeRequest(key=b"lin"), timeout=30)
        check(r[0] == "err" and r[1] == "UNAVAILABLE" and r[2] == "etcdserver: request timed out",
              "a linearizable Range, etcd stopped: %s" % (r,))
        r = kc.call("Put", m.PutRequest(key=b"lin", value=b"x"), timeout=30)
        check(r[0] == "err" and r[1] == "UNAVAILABLE" and r[2].startswith("etcdserver: request timed out"),
              "a Put, etcd stopped: %s" % (r,))
        check(seen(b"lin") == b"59", "a serializable Range, etcd stopped")
        # the keepalive finds etcd stopped: the uplink is down, /health says so as etcd without a leader
        check(wait_for(lambda: get("/health")[0] == 503, 30, 0.1), "/health, the uplink down: %s" % (get("/health"),))
        check(get("/health") == (503, '{"health":"false","reason":"RAFT NO LEADER"}\n') and
              get("/health?serializable=true")[0] == 200 and get("/readyz")[0] == 503 and get("/livez")[0] == 200,
              "/health %s, ?serializable=true %s, /readyz %s, /livez %s" %
              (get("/health"), get("/health?serializable=true"), get("/readyz"), get("/livez")))
        check(metrics(k).get("kvd_replica_uplink_up") == 0 and metrics(k).get("etcd_server_has_leader") == 0,
              "kvd_replica_uplink_up and etcd_server_has_leader 0")
    finally:
        e.p.send_signal(signal.SIGCONT)
    check(wait_for(lambda: kc.call("Range", m.RangeRequest(key=b"lin"))[0] == "ok", 30, 0.1),
          "a linearizable Range once etcd runs again")
    check(wait_for(lambda: get("/health")[0] == 200, 30, 0.1), "/health once etcd runs again")
    k.stop()
    e.stop()


@test
def seeds_from_compacted_etcd_under_writes():
    """etcd compacted (a whole-history watch would be cancelled), and a
    writer busy while the replica seeds: the snapshot, then the watch's
    kept events above its revision, leave the replica equal to etcd."""
    import threading
    e = Etcd()
    ec = Client(e.endpoint())
    history(ec, b"a")
    for i in range(24):  # a snapshot of some 24 MB: the writer goes on while it streams
        put(ec, b"big/%d" % i, os.urandom(1 << 20))
    crev = revision(ec) - 4
    r = ec.call("Compact", rpc().CompactionRequest(revision=crev, physical=True))
    check(r[0] == "ok", "etcd compacted at %d: %s" % (crev, r))
    stop = threading.Event()
    wc = Client(e.endpoint())

    def writer():
        i = 0
        while not stop.is_set():
            put(wc, b"w/%d" % (i % 50), b"%d" % i)
            i += 1
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    k = replica(e)
    kc = Client(k.endpoint())
    wait_for(lambda: "replica: seeded from a snapshot" in k.logtext(), 30, 0.02)
    wait_for(lambda: revision(kc) > crev + 50, 30, 0.02)
    stop.set()
    t.join(30)
    rev = caught_up(kc, ec)
    log = k.logtext()
    check(rev > crev + 50, "caught up with the writer: %d; the replica's log:\n%s" %
          (rev, "".join(x for x in k.log if "replica" in x)[-3000:]))
    check("replica: seeded from a snapshot" in log and "must reseed" not in log, "seeded: %s" % log[-1500:])
    import re
    m = re.search(r"replica: (\d+) revisions the watch kept while seeding applied", log)
    check(m is not None, "the kept revisions were applied: %s" % log[-1500:])
    print("  %s revisions kept during the seed and applied after it" % (m.group(1) if m else "?"))
    same_state(kc, ec, rev, "seeded under writes")
    check(hashkv(kc, rev)[1] == crev, "the compaction came with the snapshot: %s" % (hashkv(kc, rev),))
    k.stop()
    e.stop()


@test
def resumes_after_kill9():
    e = Etcd()
    ec = Client(e.endpoint())
    history(ec, b"a")
    k = replica(e)
    kc = Client(k.endpoint())
    rev = caught_up(kc, ec)
    check(rev > 0, "caught up before the kill")
    d = k.dir
    k.stop(sig=signal.SIGKILL)
    kc.close()
    history(ec, b"b")
    k = replica(e, data_dir=d)
    kc = Client(k.endpoint())
    rev2 = caught_up(kc, ec)
    log = k.logtext()
    check(rev2 > rev, "resumed to etcd's revision: %d" % rev2)
    check("resuming from the store's revision %d (no reseed)" % rev in log and "the store is empty" not in log,
          "the restart resumed from revision %d without a reseed: %s" % (rev, log[-1500:]))
    check("watching %s from revision %d" % (e.url, rev + 1) in log, "its watch starts at %d" % (rev + 1))
    same_state(kc, ec, rev2, "resumed")
    check("must reseed" not in k.logtext(), "the replica never stopped: %s" % k.logtext()[-800:])
    k.stop()
    e.stop()


@test
def next_url_when_one_fails():
    """--replicate-from with two URLs, the first where nobody listens: the
    replica says why it failed, tries the next, seeds and follows."""
    from kvdtest import free_port
    e = Etcd()
    ec = Client(e.endpoint())
    history(ec, b"a")
    dead = "http://127.0.0.1:%d" % free_port()
    k = Kvd(KVD, args=["--replicate-from", "%s,%s" % (dead, e.url)])
    kc = Client(k.endpoint())
    rev = caught_up(kc, ec)
    log = k.logtext()
    check(rev > 0 and ("replica: %s:" % dead) in log and "replica: seeded from a snapshot of %s" % e.url in log,
          "the dead URL failed, the next one served: %s" % log[-1500:])
    same_state(kc, ec, rev, "from the second URL")
    k.stop()
    e.stop()


@test
def mirrors_compactions():
    """etcd compacts (logically, then physically) while the replica
    follows: the replica finds each compaction point and compacts there
    (its log says so); Range below it is refused with etcd's error, and
    HashKV (compact_revision included) and Range agree above it."""
    e = Etcd()
    ec = Client(e.endpoint())
    history(ec, b"a")
    k = replica(e)
    kc = Client(k.endpoint())
    caught_up(kc, ec)
    for physical, tag in ((False, b"b"), (True, b"c")):
        history(ec, tag)
        crev = revision(ec) - 5
        r = ec.call("Compact", rpc().CompactionRequest(revision=crev, physical=physical))
        check(r[0] == "ok", "etcd compacted at %d: %s" % (crev, r))
        put(ec, tag + b"/after", b"1")
        rev = caught_up(kc, ec)
        ok = wait_for(lambda: "replica: compacted at revision %d, as the cluster" % crev in k.logtext(), 20, 0.05)
        check(ok, "the replica compacted at %d: %s" % (crev, k.logtext()[-1000:]))
        a, b = kvs(kc, crev - 1), kvs(ec, crev - 1)
        check(a == b and a[0] == "err" and a[1] == "OUT_OF_RANGE", "Range below the compaction: kvd %s, etcd %s" %
              (a, b))
        same_state(kc, ec, rev, "compacted at %d (physical %s)" % (crev, physical))
    check("must reseed" not in k.logtext(), "the replica never stopped")
    k.stop()
    e.stop()


@test
def compacted_while_offline_must_reseed():
    """The replica offline while etcd writes and compacts past its
    revision: started again, the cluster's HashKV at its revision is
    refused as compacted, and it says so -- "must reseed", a clear state --
    applying nothing, serving what it had to serializable reads (a
    linearizable one fails, naming why); reseeding a store that is not
    empty is not done yet."""
    e = Etcd()
    ec = Client(e.endpoint())
    history(ec, b"a")
    k = replica(e)
    kc = Client(k.endpoint())
    rev = caught_up(kc, ec)
    before = kvs(kc)
    d = k.dir
    k.stop(sig=signal.SIGKILL)
    kc.close()
    history(ec, b"b")
    crev = revision(ec) - 2
    r = ec.call("Compact", rpc().CompactionRequest(revision=crev, physical=True))
    check(r[0] == "ok", "etcd compacted at %d" % crev)
    k = replica(e, data_dir=d)
    kc = Client(k.endpoint())
    said = wait_for(lambda: "must reseed" in k.logtext(), 30, 0.02)
    line = [x for x in k.log if "must reseed" in x]
    check(said and "compacted past revision %d" % (rev + 1) in line[0],
          "the compacted history is a clear state: %s" % (line or k.logtext()[-1500:]))
    check(revision(kc) == rev and kvs(kc, serializable=True) == before, "nothing applied; the store served as it was")
    r = kc.call("Range", rpc().RangeRequest(key=b"a/k00"))
    check(r[0] == "err" and r[1] == "UNAVAILABLE" and "stopped following" in r[2],
          "a linearizable read of a replica that stopped: %s" % (r,))
    k.stop()
    e.stop()


@test
def lease_revoke_same_revision():
    m = rpc()
    e = Etcd()
    ec = Client(e.endpoint())
    lid = history(ec, b"a")
    k = replica(e)
    kc = Client(k.endpoint())
    rev = caught_up(kc, ec)
    wk, we = WatchStream(k.endpoint()), WatchStream(e.endpoint())
    for w in (wk, we):
        w.create(key=b"\0", range_end=b"\0", start_revision=rev + 1)
    r = ec.call("LeaseRevoke", m.LeaseRevokeRequest(ID=lid), service="etcdserverpb.Lease", resp="LeaseRevokeResponse")
    check(r[0] == "ok", "revoke on etcd: %s" % (r,))
    rrev = r[1].header.revision
    check(caught_up(kc, ec) == rrev, "the replica reached the revoke's revision %d" % rrev)
    a, b = events(wk, rrev), events(we, rrev)
    check(a == b and len(a) == 2 and all(x[0] == 1 and x[4] == rrev for x in a),
          "the lease's keys deleted at revision %d on both: kvd %s, etcd %s" % (rrev, a, b))
    check(kvs(kc) == kvs(ec) and not [x for x in kvs(kc) if x[5]], "no leased key left on the replica")
    same_state(kc, ec, rrev, "revoked")
    check("must reseed" not in k.logtext(), "the replica never stopped: %s" % k.logtext()[-800:])
    wk.close()
    we.close()
    k.stop()
    e.stop()


def restored_etcd(snap, top):
    """etcd 3.7.3 on a data dir etcdutl 3.7.3 restored from snap: (process, url)."""
    from kvdtest import free_port, go_peer, oracle, spawn
    port, peer = free_port(), free_port()
    purl, url = "http://127.0.0.1:%d" % peer, "http://127.0.0.1:%d" % port
    d = os.path.join(top, "r.etcd")
    r = subprocess.run([go_peer("etcdutl"), "snapshot", "restore", snap, "--data-dir", d, "--name", "r",
                        "--initial-cluster", "r=" + purl, "--initial-advertise-peer-urls", purl],
                       capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, "etcdutl snapshot restore: %s" % r.stderr[-300:])
    p = spawn([oracle(), "--name", "r", "--data-dir", d, "--listen-client-urls", url, "--advertise-client-urls", url,
               "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl, "--initial-cluster", "r=" + purl,
               "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c = Client(url[7:])
    check(wait_for(lambda: c.call("Range", rpc().RangeRequest(key=b"x"), timeout=2)[0] == "ok", 60, 0.1),
          "the restored etcd serves")
    return p, url


@test
def hands_a_board_over_to_etcd():
    """The growth path: a board's kvd with history (puts, deletes, a txn,
    a lease with keys, a compaction) is stopped, its store saved as a
    snapshot (kvd --snapshot-save), restored into etcd 3.7.3 (etcdutl),
    and the board started again as that etcd's replica: it checks the
    cluster's HashKV at its revision against its own, follows from its
    revision + 1 without a reseed, and its state equals etcd's after more
    writes on etcd.  A board that wrote after its snapshot is refused
    ("must reseed": the cluster is behind it), and so is a board pointed
    at an etcd whose history is another's; neither applies anything."""
    import shutil
    import tempfile
    k = Kvd(KVD)
    kc = Client(k.endpoint())
    history(kc, b"board")
    kc.call("Compact", rpc().CompactionRequest(revision=revision(kc) - 5), resp="CompactionResponse")
    rev = revision(kc)
    k.stop()
    top = tempfile.mkdtemp(prefix="kvd-handover-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        snap = os.path.join(top, "board.db")
        r = subprocess.run([k.binary, "--data-dir", k.dir, "--snapshot-save", snap], capture_output=True, text=True,
                           timeout=120)
        check(r.returncode == 0, "kvd --snapshot-save: %s" % r.stderr[-300:])
        board_copy = os.path.join(top, "board-copy")
        shutil.copytree(k.dir, board_copy)
        ep, url = restored_etcd(snap, top)
        ec = Client(url[7:])
        check(revision(ec) == rev, "etcd restored at the board's revision %d: %d" % (rev, revision(ec)))
        # a board that wrote after its snapshot: refused, nothing applied
        b = Kvd(KVD, data_dir=board_copy)
        put(Client(b.endpoint()), b"late", b"lost?")
        b.stop()
        b = Kvd(KVD, args=["--replicate-from", url], data_dir=board_copy)
        bc = Client(b.endpoint())
        check(wait_for(lambda: "must reseed" in b.logtext(), 30, 0.05) and "behind this store" in b.logtext(),
              "a board that wrote after its snapshot is refused: %s" % b.logtext()[-900:])
        check(revision(bc) == rev + 1, "it applied nothing: %d" % revision(bc))
        b.stop()
        k = Kvd(KVD, args=["--replicate-from", url], data_dir=k.dir)
        kc = Client(k.endpoint())
        put(ec, b"after/1", b"x")
        put(ec, b"board/k00", b"changed on etcd")
        rev2 = caught_up(kc, ec)
        check(rev2 == rev + 2, "the board follows etcd from %d: at %d" % (rev + 1, revision(kc)))
        log = k.logtext()
        check("is this store's" in log and "resuming from the store's revision %d" % rev in log and
              "seeding" not in log and "must reseed" not in log, "verified, no reseed: %s" % log[-900:])
        same_state(kc, ec, rev2, "handed over")
        k.stop()
        # a board pointed at another history (etcd wrote the same number of revisions)
        o = Kvd(KVD)
        oc = Client(o.endpoint())
        for i in range(rev2 - 1):
            put(oc, b"other", b"%d" % i)
        o.stop()
        o = Kvd(KVD, args=["--replicate-from", url], data_dir=o.dir)
        check(wait_for(lambda: "must reseed" in o.logtext(), 30, 0.05) and "HashKV" in o.logtext(),
              "another history is refused: %s" % o.logtext()[-900:])
        o.stop()
        ep.terminate()
        ep.wait(60)
    finally:
        shutil.rmtree(top, ignore_errors=True)


class Cluster:
    """A 3-member etcd cluster on loopback (data on tmpfs), each member a
    process of its own, to kill, restart and stop: etcd 3.7.3 (oracle()),
    or binary= ("etcd" is Debian's 3.4.23; the same flags)."""

    def __init__(self, n=3, binary=None):
        import tempfile
        from kvdtest import free_port, oracle, spawn
        self.spawn, self.bin = spawn, binary or oracle()
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.ports = [(free_port(), free_port()) for _ in range(n)]
        self.dirs = [tempfile.mkdtemp(prefix="etcd-m%d-" % i, dir=base) for i in range(n)]
        self.urls = ["http://127.0.0.1:%d" % c for c, _ in self.ports]
        self.initial = ",".join("m%d=http://127.0.0.1:%d" % (i, p) for i, (_, p) in enumerate(self.ports))
        self.p = [None] * n
        for i in range(n):
            self.start(i, "new")
        if not check(wait_for(lambda: all(self.ready(i) for i in range(n)), 60, 0.1), "the cluster started"):
            for i in range(n):  # why: each member's exit status and the end of its log
                print("  m%d (%s): exit %s, ready %s: %s" % (i, self.urls[i], self.p[i].poll(), self.ready(i),
                                                         self.logtail(i)), flush=True)

    def start(self, i, state="existing"):
        c, p = self.ports[i]
        with open(self.dirs[i] + ".log", "ab") as log:  # the member's errors, for logtail()
            self.p[i] = self.spawn([self.bin, "--name", "m%d" % i, "--data-dir", self.dirs[i],
                                    "--listen-client-urls", self.urls[i], "--advertise-client-urls", self.urls[i],
                                    "--listen-peer-urls", "http://127.0.0.1:%d" % p,
                                    "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % p,
                                    "--initial-cluster", self.initial, "--initial-cluster-state", state,
                                    "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=log)

    def logtail(self, i, n=600):
        """The end of member i's log (its errors: --log-level error)."""
        try:
            with open(self.dirs[i] + ".log", "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError as e:
            return str(e)

    def ready(self, i):
        try:
            return Client(self.urls[i][7:]).call("Range", rpc().RangeRequest(key=b"ready"), timeout=2)[0] == "ok"
        except Exception:
            return False

    def kill(self, i):
        self.p[i].kill()
        self.p[i].wait()

    def stop(self):
        for x in self.p:
            if x.poll() is None:
                x.send_signal(signal.SIGCONT)
                x.terminate()
                x.wait(60)
        import shutil
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
            if os.path.exists(d + ".log"):
                os.unlink(d + ".log")


@test
def follows_a_three_member_cluster_through_faults():
    """A 3-member etcd 3.7.3 cluster takes writes (puts, deletes, a lease
    and its revoke) all along, through whichever member answers, while the
    member the replica follows is killed (-9) and restarted, another is
    stopped (SIGSTOP: its keepalive PING unanswered, the replica leaves it)
    and continued, and kvd itself is killed (-9) and
    started again: the replica goes on from the next URL each time and
    from its own revision after its restart (no reseed); at the end its
    HashKV equals the cluster's at every revision checked, its Range
    equals the cluster's, and a watcher on the replica and one on the
    cluster from the same revision heard the same events, none skipped or
    repeated."""
    import threading
    import time
    m = rpc()
    cl = Cluster()
    try:
        clients = [Client(u[7:]) for u in cl.urls]
        stop, acked, errors = threading.Event(), [], [0]

        def writer():  # through one member until it fails, then the next
            i = cur = 0
            while not stop.is_set():
                c = clients[cur % 3]
                key = b"w/%d" % (i % 50)
                if i % 97 == 5:
                    r = c.call("DeleteRange", m.DeleteRangeRequest(key=b"w/1", range_end=b"w/2"), timeout=3)
                else:
                    r = c.call("Put", m.PutRequest(key=key, value=b"%d" % i), timeout=3)
                if r[0] == "ok":
                    acked.append(r[1].header.revision)
                else:
                    errors[0] += 1
                    cur += 1
                    time.sleep(0.05)
                i += 1
                time.sleep(0.004)
        t = threading.Thread(target=writer, daemon=True)
        t.start()
        wait_for(lambda: len(acked) > 50, 30, 0.02)
        k = Kvd(KVD, args=["--replicate-from", ",".join(cl.urls)])
        kc = Client(k.endpoint())
        check(wait_for(lambda: revision(kc) > 50, 30, 0.05), "the replica seeded and follows")
        r0 = revision(kc)
        wk, wc = WatchStream(k.endpoint()), WatchStream(cl.urls[2][7:])
        for w in (wk, wc):
            w.create(key=b"\0", range_end=b"\0", start_revision=r0)
        lid = clients[2].call("LeaseGrant", m.LeaseGrantRequest(TTL=600), service="etcdserverpb.Lease",
                              resp="LeaseGrantResponse")[1].ID
        clients[2].call("Put", m.PutRequest(key=b"leased/a", value=b"x", lease=lid))
        clients[2].call("Put", m.PutRequest(key=b"leased/b", value=b"y", lease=lid))

        def advances(c, secs=30):
            was = revision(c)
            return wait_for(lambda: revision(c) > was + 20, secs, 0.05)
        # the member the replica follows, killed and restarted
        cl.kill(0)
        check(advances(kc), "the replica went on from the next member after m0 was killed: %s" % k.logtext()[-600:])
        cl.start(0)
        check(wait_for(lambda: cl.ready(0), 60, 0.1), "m0 back")
        # another member stopped, then continued
        cl.p[1].send_signal(signal.SIGSTOP)
        check(advances(kc), "the replica goes on while m1 is stopped: %s" % k.logtext()[-800:])
        check("keepalive ping failed to receive ACK within timeout" in k.logtext(),
              "the replica left the stopped member (keepalive): %s" % k.logtext()[-800:])
        cl.p[1].send_signal(signal.SIGCONT)
        clients[2].call("LeaseRevoke", m.LeaseRevokeRequest(ID=lid), service="etcdserverpb.Lease",
                        resp="LeaseRevokeResponse")
        # kvd killed, started again on its data dir: it resumes
        k.stop(signal.SIGKILL)
        wk.close()
        k = Kvd(KVD, args=["--replicate-from", ",".join(cl.urls)], data_dir=k.dir)
        kc = Client(k.endpoint())
        check("resuming from the store's revision" in k.logtext(), "no reseed after kill -9: %s" % k.logtext()[-600:])
        check(advances(kc), "the replica follows again after its restart")
        stop.set()
        t.join(10)
        ec = clients[2]
        rev = caught_up(kc, ec, 60)
        check(rev > 0 and len(acked) > 300, "caught up at %d (%d writes acknowledged, %d refused during faults)" %
              (rev, len(acked), errors[0]))
        check(max(acked) <= rev, "every acknowledged write's revision is on the replica")
        same_state(kc, ec, rev, "after the faults")
        for r in (r0, (r0 + rev) // 2, rev - 1):
            check(hashkv(kc, r) == hashkv(ec, r), "HashKV at %d: kvd %s, etcd %s" % (r, hashkv(kc, r), hashkv(ec, r)))
        wk2 = WatchStream(k.endpoint())
        wk2.create(key=b"\0", range_end=b"\0", start_revision=r0)
        a, b = events(wk2, rev), events(wc, rev)
        check(a == b and len(a) == rev - r0 + 1 + sum(1 for x in b if x[4] == b[0][4]) - 1 or a == b,
              "the same events from %d to %d: kvd %d, the cluster %d" % (r0, rev, len(a), len(b)))
        check(len(a) >= rev - r0 and len({x[4] for x in a}) == rev - r0 + 1, "no revision skipped: %d events" % len(a))
        check("must reseed" not in k.logtext(), "never stopped following: %s" % k.logtext()[-600:])
        print("  %d writes acknowledged, %d refused during the faults; the replica at %d" % (len(acked), errors[0], rev))
        wk2.close()
        wc.close()
        k.stop()
    finally:
        cl.stop()


def steady_writer(clients):
    """A thread writing (Puts over 50 keys, a range delete now and then)
    through clients[0] until a call fails, then the next: (thread, stop
    event, the acknowledged revisions, [refused])."""
    import threading
    import time
    m = rpc()
    stop, acked, errors = threading.Event(), [], [0]

    def writer():
        i = cur = 0
        while not stop.is_set():
            c = clients[cur % len(clients)]
            if i % 97 == 5:
                r = c.call("DeleteRange", m.DeleteRangeRequest(key=b"w/1", range_end=b"w/2"), timeout=3)
            else:
                r = c.call("Put", m.PutRequest(key=b"w/%d" % (i % 50), value=b"%d" % i), timeout=3)
            if r[0] == "ok":
                acked.append(r[1].header.revision)
            else:
                errors[0] += 1
                cur += 1
                time.sleep(0.05)
            i += 1
            time.sleep(0.004)
    t = threading.Thread(target=writer, daemon=True)
    t.start()
    return t, stop, acked, errors


def advances(c, by=20, secs=30):
    was = revision(c)
    return wait_for(lambda: revision(c) > was + by, secs, 0.05)


@test
def follows_a_debian_etcd_34_cluster():
    """A 3-member cluster of Debian's etcd 3.4.23 (/usr/bin/etcd) under a
    steady writer: the replica seeds from its snapshot and follows; the
    member it follows is killed (-9) and restarted; kvd is killed (-9) and
    started again on its data dir (it resumes, no reseed); the cluster
    compacts and the replica compacts at the same revision (a Range below
    it refused on both alike); a Put made through the replica is seen on
    it when answered; at the end HashKV (hash and compact_revision: 3.4's
    HashKVResponse has no hash_revision), Range field by field and a
    whole-keyspace watch from the same revision are equal to the
    cluster's, and every acknowledged write's revision is on the replica."""
    m = rpc()
    cl = Cluster(binary="etcd")
    try:
        clients = [Client(u[7:]) for u in cl.urls]
        ec = clients[2]
        history(ec, b"h")
        t, stop, acked, errors = steady_writer(clients)
        wait_for(lambda: len(acked) > 50, 30, 0.02)
        urls = ",".join(cl.urls)
        k = Kvd(KVD, args=["--replicate-from", urls])
        kc = Client(k.endpoint())
        check(wait_for(lambda: revision(kc) > 80, 30, 0.05), "the replica seeded and follows: %s" % k.logtext()[-800:])
        check("replica: seeded from a snapshot of %s" % cl.urls[0] in k.logtext(),
              "seeded from etcd 3.4's snapshot: %s" % k.logtext()[-800:])
        # the member the replica follows, killed and restarted
        cl.kill(0)
        check(advances(kc), "the replica went on from the next member after m0 was killed: %s" % k.logtext()[-600:])
        cl.start(0)
        check(wait_for(lambda: cl.ready(0), 60, 0.1), "m0 back")
        # kvd killed, started again on its data dir: it resumes
        k.stop(signal.SIGKILL)
        kc.close()
        k = Kvd(KVD, args=["--replicate-from", urls], data_dir=k.dir)
        kc = Client(k.endpoint())
        log = k.logtext()
        check("resuming from the store's revision" in log and "the store is empty" not in log,
              "no reseed after kill -9: %s" % log[-600:])
        r1 = revision(kc)
        wk, wc = WatchStream(k.endpoint()), WatchStream(cl.urls[2][7:])
        for w in (wk, wc):
            w.create(key=b"\0", range_end=b"\0", start_revision=r1)
        check(advances(kc), "the replica follows again after its restart: %s" % k.logtext()[-600:])
        check("is this store's" in k.logtext(), "the cluster's HashKV verified the store: %s" % k.logtext()[-600:])
        # a compaction on the cluster, mirrored
        crev = revision(ec) - 5
        r = ec.call("Compact", m.CompactionRequest(revision=crev, physical=True))
        check(r[0] == "ok", "the cluster compacted at %d: %s" % (crev, r))
        check(wait_for(lambda: "replica: compacted at revision %d, as the cluster" % crev in k.logtext(), 20, 0.05),
              "the replica compacted at %d: %s" % (crev, k.logtext()[-800:]))
        a, b = kvs(kc, crev - 1), kvs(ec, crev - 1)
        check(a == b and a[0] == "err" and a[1] == "OUT_OF_RANGE", "Range below the compaction: kvd %s, etcd %s" %
              (a, b))
        # a Put through the replica: etcd 3.4's answer, seen on the replica when answered
        r = kc.call("Put", m.PutRequest(key=b"fwd", value=b"through the replica"))
        rv = r[1].header.revision if r[0] == "ok" else -1
        g = kc.call("Range", m.RangeRequest(key=b"fwd", serializable=True))
        check(r[0] == "ok" and g[0] == "ok" and [(x.value, x.mod_revision) for x in g[1].kvs] ==
              [(b"through the replica", rv)], "a forwarded Put seen on the replica when answered: %s, %s" % (r, g))
        stop.set()
        t.join(10)
        rev = caught_up(kc, ec, 60)
        check(rev > 0 and len(acked) > 300, "caught up at %d (%d writes acknowledged, %d refused during faults)" %
              (rev, len(acked), errors[0]))
        check(max(acked) <= rev and rv <= rev, "every acknowledged write's revision is on the replica")
        same_state(kc, ec, rev, "etcd 3.4 after the faults")
        check(hashkv(kc, rev)[1] == crev, "the compaction point: %s" % (hashkv(kc, rev),))
        # not at crev itself: etcd 3.4 refuses HashKV at its compaction revision as compacted, while 3.5+
        # (3.7.3, and kvd, which answers as 3.7.3) hash it with compact_revision -1
        for x in (crev + 1, (crev + rev) // 2, rev - 1):
            hk, he = hashkv(kc, x), hashkv(ec, x)
            check(same_hashkv(hk, he, x), "HashKV at %d: kvd %s, etcd %s" % (x, hk, he))
        a, b = events(wk, rev), events(wc, rev)
        check(a == b and len({x[4] for x in a}) == rev - r1 + 1,
              "the same events from %d to %d: kvd %d, the cluster %d" % (r1, rev, len(a), len(b)))
        check("must reseed" not in k.logtext(), "never stopped following: %s" % k.logtext()[-600:])
        print("  %d writes acknowledged, %d refused during the faults; the replica at %d, compacted at %d" %
              (len(acked), errors[0], rev, crev))
        wk.close()
        wc.close()
        # etcd 3.4 refuses HashKV at its compaction revision (3.5+ answers it): a replica stopped at
        # revision N, the cluster compacted at exactly N, compares the cluster's keys at N instead
        # (a Range at N, which 3.4 serves) and resumes; a Range at N refused would mean "past N"
        k.stop(signal.SIGKILL)
        kc.close()
        r = ec.call("Compact", m.CompactionRequest(revision=rev))
        check(r[0] == "ok", "the cluster compacted at the replica's revision %d: %s" % (rev, r))
        put(ec, b"after", b"1")
        k = Kvd(KVD, args=["--replicate-from", urls], data_dir=k.dir)
        kc = Client(k.endpoint())
        check(caught_up(kc, ec, 15) == rev + 1 and "must reseed" not in k.logtext() and
              "its %d keys there are this store's" % len(kvs(ec, rev)) in k.logtext(),
              "resumed at the cluster's compaction revision %d, its keys there compared: %s" %
              (rev, k.logtext()[-600:]))
        # and a store of another history at the same revision N is refused, the key that differs named
        k.stop()
        kc.close()
        o = Kvd(KVD)
        oc = Client(o.endpoint())
        while revision(oc) < rev:
            put(oc, b"w/1", b"another history")
        o.stop()
        k = Kvd(KVD, args=["--replicate-from", urls], data_dir=o.dir)
        check(wait_for(lambda: "must reseed" in k.logtext(), 20, 0.05) and "is not this store's" in k.logtext() and
              revision(Client(k.endpoint())) == rev, "another store at revision %d is refused: %s" %
              (rev, k.logtext()[-600:]))
        k.stop()
    finally:
        cl.stop()


@test
def follows_another_kvd():
    """The board's hot standby: a plain kvd as the upstream, a kvd
    replica following it, and a second-level replica following the first
    (a chain).  Both seed from a snapshot and follow live writes; a Put
    made on the chain's end reaches the upstream and is seen on both
    replicas when answered; a linearizable Range on the chain's end sees
    a write made on the upstream just before; the upstream's compaction is
    made down the chain (a Range below it refused alike on all three); the
    middle replica killed (-9) and started again on its port resumes
    without a reseed and the chain's end follows it again; HashKV, Range
    and a whole-keyspace watch equal on all three."""
    m = rpc()
    u = Kvd(KVD)
    uc = Client(u.endpoint())
    history(uc, b"a")
    r1 = Kvd(KVD, args=["--replicate-from", "http://" + u.endpoint()])
    r1c = Client(r1.endpoint())
    r2 = Kvd(KVD, args=["--replicate-from", r1.url])
    r2c = Client(r2.endpoint())
    rev = caught_up(r2c, uc)
    check(rev > 20 and revision(r1c) == rev, "the chain reached the upstream's revision %d: %d, %d" %
          (revision(uc), revision(r1c), revision(r2c)))
    for x, up in ((r1, u.url), (r2, r1.url)):
        check("replica: seeded from a snapshot of %s" % up in x.logtext(), "seeded from %s: %s" %
              (up, x.logtext()[-800:]))
    same_state(r1c, uc, rev, "the first replica seeded")
    same_state(r2c, uc, rev, "the chain's end seeded")
    w = [WatchStream(x.endpoint()) for x in (u, r2)]
    for x in w:
        x.create(key=b"\0", range_end=b"\0", start_revision=rev - 5)
    history(uc, b"b")
    rev2 = caught_up(r2c, uc)
    check(rev2 > rev and revision(r1c) == rev2, "live writes down the chain: %d" % rev2)
    same_state(r2c, uc, rev2, "live")
    # a Put on the chain's end goes up to the upstream, seen on both replicas when answered
    bad = 0
    for i in range(20):
        r = r2c.call("Put", m.PutRequest(key=b"f/%d" % (i % 3), value=b"v%d" % i))
        if not check(r[0] == "ok", "a Put through the chain: %s" % (r,)):
            break
        rv = r[1].header.revision
        for c in (uc, r1c, r2c):
            g = c.call("Range", m.RangeRequest(key=b"f/%d" % (i % 3), serializable=True))
            bad += not (g[0] == "ok" and [(x.value, x.mod_revision) for x in g[1].kvs] == [(b"v%d" % i, rv)])
    check(bad == 0, "read-your-writes down the chain: %d of 60 reads did not see the Put when answered" % bad)
    # a linearizable Range on the chain's end sees the upstream's newest write
    stale = 0
    for i in range(30):
        rv = put(uc, b"lin", b"%d" % i)
        r = r2c.call("Range", m.RangeRequest(key=b"lin"))
        stale += not (r[0] == "ok" and r[1].kvs and r[1].kvs[0].value == b"%d" % i and r[1].header.revision >= rv)
    check(stale == 0, "linearizable Range on the chain's end: %d of 30 did not see the write made just before" % stale)
    # the upstream compacts: down the chain
    history(uc, b"c")
    crev = revision(uc) - 5
    r = uc.call("Compact", m.CompactionRequest(revision=crev, physical=True))
    check(r[0] == "ok", "the upstream compacted at %d: %s" % (crev, r))
    put(uc, b"c/after", b"1")
    for x in (r1, r2):
        check(wait_for(lambda: "replica: compacted at revision %d, as the cluster" % crev in x.logtext(), 20, 0.05),
              "the replica compacted at %d: %s" % (crev, x.logtext()[-800:]))
    a = [kvs(c, crev - 1) for c in (uc, r1c, r2c)]
    check(a[0] == a[1] == a[2] and a[0][0] == "err" and a[0][1] == "OUT_OF_RANGE",
          "Range below the compaction: %s" % (a,))
    # the middle replica killed, started again on its port and data dir: resumes, and the end follows it again
    rev3 = caught_up(r2c, uc)
    r1.stop(signal.SIGKILL)
    r1c.close()
    history(uc, b"d")
    r1 = Kvd(KVD, args=["--replicate-from", "http://" + u.endpoint()], data_dir=r1.dir, port=r1.port)
    r1c = Client(r1.endpoint())
    rev4 = caught_up(r2c, uc)
    log = r1.logtext()
    check(rev4 > rev3 and revision(r1c) == rev4, "the chain follows again: %d > %d" % (rev4, rev3))
    check("resuming from the store's revision %d (no reseed)" % rev3 in log and "the store is empty" not in log and
          "is this store's" in log, "the middle replica resumed from %d: %s" % (rev3, log[-800:]))
    for x, seeds in ((r1, 0), (r2, 1)):  # r1 is a new process: its seed was in the one killed
        check("must reseed" not in x.logtext() and x.logtext().count("seeded from a snapshot") == seeds,
              "%d seed(s), never stopped: %s" % (seeds, x.logtext()[-800:]))
    for c, what in ((r1c, "the middle replica"), (r2c, "the chain's end")):
        same_state(c, uc, rev4, what)
        check(hashkv(c, rev4)[1] == crev, "%s's compaction point: %s" % (what, hashkv(c, rev4)))
    w.append(WatchStream(r1.endpoint()))
    w[2].create(key=b"\0", range_end=b"\0", start_revision=crev)
    a, b = events(w[0], rev4), events(w[1], rev4)
    check(a == b and len({x[4] for x in a}) == rev4 - rev + 6,
          "the same events from %d to %d: the upstream %d, the chain's end %d" % (rev - 5, rev4, len(a), len(b)))
    c = events(w[2], rev4)
    check(c == [x for x in a if x[4] >= crev] and c, "the middle replica's events from %d: %d" % (crev, len(c)))
    for x in w:
        x.close()
    for x in (r2, r1, u):
        x.stop()

@test
def follows_an_https_cluster_with_client_certificates():
    """etcd 3.7.3 serving https:// with --client-cert-auth (as kubeadm runs
    it): the replica connects with --replicate-cacert, --replicate-cert and
    --replicate-key, seeds and follows (HashKV equal), and a write made on
    the replica reaches etcd; no client certificate, a CA that did not sign
    etcd's, and an upstream whose certificate names another host are each
    refused at the handshake, the reason in kvd's log, nothing applied."""
    import json
    from kvdtest import oracle
    T.make_ca("rca")
    T.make_ca("rca2")
    T.make_cert("rca", "rserver", "etcd-server", "IP:127.0.0.1,DNS:localhost")
    T.make_cert("rca", "relsewhere", "elsewhere", "DNS:elsewhere.example")
    T.make_cert("rca", "rboard", "board", usage="clientAuth")
    mtls = ["--client-cert-auth", "--trusted-ca-file", T.p("rca.pem")]
    e = T.EtcdTLS(T.server_args("rserver", mtls), binary=oracle(), probe=None)
    ctl = lambda *a: T.ctl(e, "rca", "rboard", *a)  # noqa: E731

    def erev():
        r = ctl("get", "nothing", "-w", "json")
        return json.loads(r[1])["header"]["revision"] if r[0] == 0 else -1
    check(wait_for(lambda: erev() > 0, 60, 0.2), "etcd serves https:// to the board's certificate")
    for i in range(30):
        ctl("put", "k%02d" % (i % 9), "v%d" % i)
    ctl("del", "k03")
    url = "https://127.0.0.1:%d" % e.port
    cert = ["--replicate-cacert", T.p("rca.pem"), "--replicate-cert", T.p("rboard.pem"),
            "--replicate-key", T.p("rboard.key")]
    k = Kvd(KVD, args=["--replicate-from", url] + cert)
    kc = Client(k.endpoint())
    check(wait_for(lambda: revision(kc) == erev(), 30, 0.05), "the replica reached etcd's revision %d over TLS: %d\n%s" %
          (erev(), revision(kc), k.logtext()[-800:]))
    rev = revision(kc)
    r = ctl("endpoint", "hashkv", "--rev=%d" % rev, "-w", "json")
    eh = json.loads(r[1])[0]["HashKV"]["hash"] if r[0] == 0 else None
    check(hashkv(kc, rev)[0] == eh, "HashKV at %d: kvd %s, etcd %s" % (rev, hashkv(kc, rev), eh))
    w = put(kc, b"from-board", b"1")
    r = ctl("get", "from-board", "-w", "json")
    check(r[0] == 0 and json.loads(r[1])["kvs"][0]["mod_revision"] == w, "a write on the replica is etcd's: %s" % (r,))
    ctl("put", "later", "x")
    check(wait_for(lambda: revision(kc) == erev(), 30, 0.05), "live writes follow over TLS")
    k.p.send_signal(signal.SIGHUP)  # a board's rotated client certificate: read again
    check(wait_for(lambda: "client certificates read again" in k.logtext(), 10, 0.05),
          "SIGHUP reads the client certificates again: %s" % k.logtext()[-300:])
    ctl("put", "after-hup", "x")
    check(wait_for(lambda: revision(kc) == erev(), 30, 0.05), "still following after SIGHUP")
    k.stop()

    def refused(args, why, upstream=url):
        x = Kvd(KVD, args=["--replicate-from", upstream] + args)
        ok = wait_for(lambda: why in x.logtext(), 30, 0.05)
        check(ok and revision(Client(x.endpoint())) <= 1, "%s: %s" % (why, x.logtext()[-700:]))
        x.stop()
    # no client certificate: etcd's alert, in the handshake (TLS 1.2) or just after it (1.3: mbedtls 3.6)
    refused(["--replicate-cacert", T.p("rca.pem")], "fatal alert")
    refused(["--replicate-cacert", T.p("rca2.pem"), "--replicate-cert", T.p("rboard.pem"), "--replicate-key",
             T.p("rboard.key")], "TLS handshake failed: The certificate is not correctly signed by the trusted CA")
    # an upstream whose certificate (rca's, trusted) names another host
    u = T.kvd_tls(T.server_args("relsewhere"))
    refused(cert, "the server's certificate is not valid for 127.0.0.1", "https://127.0.0.1:%d" % u.tport)
    u.stop()
    e.stop()


@test
def a_silent_upstream_costs_no_cpu():
    """A member that takes the TCP connection and never answers (http://:
    no SETTINGS; https://: no ServerHello): the replica waits in poll, its
    CPU time over a few seconds a small part of them (a timer due at 0, or
    POLLOUT for a request queued behind a handshake, spins a core), then
    leaves the connection and tries again; stopped, it does not wait for
    it.  Keeps [§27.5]."""
    import socket
    import time
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    held = []
    for scheme in ("http", "https"):
        args = ["--replicate-from", "%s://127.0.0.1:%d" % (scheme, s.getsockname()[1])]
        k = Kvd(KVD, args=args + (["--replicate-insecure-skip-tls-verify"] if scheme == "https" else []))
        s.settimeout(20)
        held.append(s.accept()[0])

        def cpu():
            f = open("/proc/%d/stat" % k.p.pid).read().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        c0, t0 = cpu(), time.monotonic()
        wait_for(lambda: time.monotonic() - t0 > 3, 10, 0.2)
        used, spent = cpu() - c0, time.monotonic() - t0
        check(used < 0.25 * spent, "%s: the replica used %.2f s of CPU in %.1f s waiting for a silent member" %
              (scheme, used, spent))
        t0 = time.monotonic()
        check(k.stop() == 0, "%s: SIGTERM: exit 0" % scheme)
        print("  %s: SIGTERM while the member stays silent: exit after %.2f s (no drain of kvd's own "
              "connection; it took 5 s for https before)" % (scheme, time.monotonic() - t0))
    for c in held:
        c.close()
    s.close()


@test
def no_leader_as_an_etcd_member():
    """The replica's one member is cut from its quorum (the two others
    SIGSTOPped): etcd ends that member's hasleader streams "etcdserver: no
    leader", the replica's replication watch among them, so the replica
    has no leader either and says so as etcd's member does, side by side:
    a hasleader watch (etcdctl's, kube-apiserver's) open on each ends
    Unavailable "etcdserver: no leader", a new one is refused at once,
    Status has that error first and leader 0; a watch without hasleader
    goes on and serializable reads are served.  The two continued, the
    replica follows again, Status clean, raftIndex (the cluster's
    revision) and raftAppliedIndex (the replica's) equal once caught up."""
    import grpc
    m = rpc()
    cl = Cluster()
    try:
        ec = Client(cl.urls[0][7:])
        put(ec, b"a", b"1")
        k = Kvd(KVD, args=["--replicate-from", cl.urls[0]])
        kc = Client(k.endpoint())
        rev = caught_up(kc, ec)
        hl = [("hasleader", "true")]

        def status(c):
            r = c.call("Status", m.StatusRequest(), service="etcdserverpb.Maintenance", resp="StatusResponse")
            return r[1] if r[0] == "ok" else None
        check(not status(kc).errors and status(kc).leader != 0, "Status before: %s" % status(kc))
        wk, we, wplain = WatchStream(k.endpoint(), hl), WatchStream(cl.urls[0][7:], hl), WatchStream(k.endpoint())
        for w in (wk, we, wplain):
            w.create(key=b"a")

        def ended(w):
            return (w.error.code() if w.error else None, w.error.details() if w.error else None)
        for i in (1, 2):
            cl.p[i].send_signal(signal.SIGSTOP)
        check(wait_for(lambda: wk.done.is_set() and we.done.is_set(), 40, 0.1),
              "hasleader watches ended: replica %s, etcd %s\n%s" % (ended(wk), ended(we), k.logtext()[-800:]))
        want = (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader")
        check(ended(wk) == want and ended(we) == want, "as etcd's: replica %s, etcd %s" % (ended(wk), ended(we)))
        check("etcdserver: no leader" in k.logtext(), "the replication watch was ended by the leaderless member: %s" %
              k.logtext()[-800:])
        check(not wplain.done.is_set(), "a watch without hasleader goes on: %s" % (ended(wplain),))
        w2k, w2e = WatchStream(k.endpoint(), hl), WatchStream(cl.urls[0][7:], hl)
        for w in (w2k, w2e):
            w.create(key=b"a")
        check(wait_for(lambda: w2k.done.is_set() and w2e.done.is_set(), 10, 0.05) and ended(w2k) == want and
              ended(w2e) == want, "a new hasleader watch refused at once: replica %s, etcd %s" % (ended(w2k), ended(w2e)))
        sk, se = status(kc), status(ec)
        check(sk and se and list(sk.errors[:1]) == list(se.errors[:1]) == ["etcdserver: no leader"] and
              sk.leader == se.leader == 0, "Status without a leader: replica %s / %s, etcd %s / %s" %
              (sk and list(sk.errors), sk and sk.leader, se and list(se.errors), se and se.leader))
        check(revision(kc) == rev, "serializable reads go on at %d" % rev)
        for i in (1, 2):
            cl.p[i].send_signal(signal.SIGCONT)
        put(Client(cl.urls[1][7:]), b"a", b"2") if wait_for(lambda: cl.ready(1), 30, 0.1) else None
        r2 = caught_up(kc, Client(cl.urls[1][7:]), 60)
        check(r2 > rev, "the replica follows again: %d" % r2)
        check(wait_for(lambda: not status(kc).errors, 30, 0.1), "Status clean again: %s" % status(kc))
        sk = status(kc)
        check(sk.raftIndex == sk.raftAppliedIndex == r2 and sk.leader != 0,
              "raftIndex %d (the cluster's), raftAppliedIndex %d (the replica's), at %d" %
              (sk.raftIndex, sk.raftAppliedIndex, r2))
        w3 = WatchStream(k.endpoint(), hl)
        w3.create(key=b"a", start_revision=r2)
        check(wait_for(lambda: any(r.events for r in w3.got), 10, 0.05), "a hasleader watch is served again")
        for w in (wplain, w3):
            w.close()
        k.stop()
    finally:
        cl.stop()


@test
def follows_a_cluster_with_auth_on():
    """etcd 3.7.3 with auth on (root, and alice without a role): the replica
    with --replicate-user root:pw authenticates on each connection and
    sends the token on every call; seeded (the cluster's users come with
    the snapshot: a client of the replica logs in with the cluster's
    passwords, and alice is refused what etcd refuses her), followed
    (HashKV equal), resumed after kill -9 (the history checked as root);
    writes on the replica are refused naming --replicate-user (its
    credentials are not lent to its clients); a wrong password and no
    user at all are each logged with the reason and retried, nothing
    applied."""
    import json
    e = Etcd()
    ep = e.endpoint()

    def ctl(endpoint, *a, user="root:pw"):
        r = subprocess.run(["etcdctl", "--endpoints", endpoint, "--command-timeout", "10s"] +
                           (["--user", user] if user else []) + list(a), capture_output=True, text=True,
                           env=dict(os.environ, ETCDCTL_API="3"), timeout=60)
        return r.returncode, r.stdout, r.stderr

    def rev(endpoint):
        r = ctl(endpoint, "get", "x", "-w", "json", "--consistency=s")
        return json.loads(r[1])["header"]["revision"] if r[0] == 0 else -1

    def hk(endpoint, at):
        r = ctl(endpoint, "endpoint", "hashkv", "--rev=%d" % at, "-w", "json")
        return json.loads(r[1])[0]["HashKV"]["hash"] if r[0] == 0 else r[2][-200:]
    for a in (("user", "add", "root:pw"), ("user", "grant-role", "root", "root"), ("user", "add", "alice:apw"),
              ("auth", "enable")):
        check(ctl(ep, *a, user=None)[0] == 0, "etcd: %s" % " ".join(a))
    for i in range(20):
        ctl(ep, "put", "k%d" % (i % 7), "v%d" % i)
    k = Kvd(KVD, args=["--replicate-from", e.url, "--replicate-user", "root:pw"])
    check(wait_for(lambda: rev(k.endpoint()) == rev(ep), 30, 0.2), "the replica caught up as root: %d vs %d\n%s" %
          (rev(k.endpoint()), rev(ep), k.logtext()[-600:]))
    at = rev(ep)
    check(hk(k.endpoint(), at) == hk(ep, at), "HashKV at %d: %s vs %s" % (at, hk(k.endpoint(), at), hk(ep, at)))
    a, b = ctl(k.endpoint(), "get", "k1", user="alice:apw"), ctl(ep, "get", "k1", user="alice:apw")
    check(a[0] == b[0] != 0 and "permission denied" in a[2] and "permission denied" in b[2],
          "alice, the cluster's user, is refused alike: %s / %s" % (a[2][-120:], b[2][-120:]))
    r = ctl(k.endpoint(), "put", "from-board", "1")
    check(r[0] != 0 and "--replicate-user" in r[2], "a write on the replica is refused naming why: %s" % r[2][-300:])
    k.stop(signal.SIGKILL)
    for i in range(5):
        ctl(ep, "put", "later%d" % i, "x")
    k = Kvd(KVD, args=["--replicate-from", e.url, "--replicate-user", "root:pw"], data_dir=k.dir)
    check(wait_for(lambda: rev(k.endpoint()) == rev(ep), 30, 0.2) and "is this store's" in k.logtext(),
          "resumed after kill -9, its history checked as root: %s" % k.logtext()[-600:])
    k.stop()
    for args, why in ((["--replicate-user", "root:wrong"], "Authenticate as root: etcdserver: authentication failed"),
                      ([], "user name is empty (a cluster with auth on: --replicate-user)")):
        x = Kvd(KVD, args=["--replicate-from", e.url] + args)
        check(wait_for(lambda: why in x.logtext(), 20, 0.05) and "must reseed" not in x.logtext(),
              "%s: %s" % (why, x.logtext()[-500:]))
        check(revision(Client(x.endpoint())) <= 1, "nothing applied")
        x.stop()
    e.stop()


@test
def a_thousand_local_watchers_cost_the_cluster_one():
    """1000 watchers on the replica (10 streams of 100): etcd's own gauges
    (etcd_debugging_mvcc_watcher_total, _watch_stream_total) show one
    watcher and one stream, the replica's, before and after; the local
    watchers hear etcd's writes."""
    import urllib.request
    e = Etcd()
    ec = Client(e.endpoint())
    put(ec, b"k0", b"1")

    def gauges():
        t = urllib.request.urlopen("%s/metrics" % e.url, timeout=10).read().decode()
        return {ln.split()[0]: float(ln.split()[1]) for ln in t.splitlines()
                if ln.startswith(("etcd_debugging_mvcc_watcher_total ", "etcd_debugging_mvcc_watch_stream_total "))}
    k = replica(e)
    kc = Client(k.endpoint())
    caught_up(kc, ec)
    one = {"etcd_debugging_mvcc_watcher_total": 1.0, "etcd_debugging_mvcc_watch_stream_total": 1.0}
    check(gauges() == one, "the replica's one watch on etcd: %s" % gauges())
    ws = []
    for j in range(10):
        w = WatchStream(k.endpoint())
        for i in range(100):
            w.create(key=b"k%d" % (j * 100 + i))
        ws.append(w)
    check(wait_for(lambda: sum(len(w.got) for w in ws) >= 1000, 30, 0.05), "1000 watchers created on the replica")
    for i in range(0, 1000, 100):
        put(ec, b"k%d" % i, b"x")
    caught_up(kc, ec)
    check(wait_for(lambda: sum(1 for w in ws for r in w.got if r.events) >= 10, 20, 0.05),
          "the local watchers heard etcd's writes")
    check(gauges() == one, "with 1000 local watchers etcd still has one: %s" % gauges())
    for w in ws:
        w.close()
    k.stop()
    e.stop()


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
