#!/usr/bin/python3
"""Auth side by side with Debian's etcd 3.4: users, roles, permissions and
simple tokens on every RPC.

The differential part sends the same seeded random sequence -- user, role and
permission changes, Authenticate with right and wrong passwords, auth on and
off, and Range/Put/DeleteRange/Txn/Compact/Lease/Watch/maintenance calls made
as root, as other users, with no token, with a stale or made-up token -- to
both servers and compares every answer (headers without ids and term; a
token by its shape).  Then: durability (restart, log rewrite), etcdctl's own
auth commands, python3-etcd3 with a password, bcrypt against Python's bcrypt
and against etcd (snapshots both ways), the client certificate's CN as the
user, a brute-force flood that must not starve other clients, tokens' TTL.

  test/auth.py [test-name-part]        last line: "N passed, N failed"
"""
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
import kvdtest
from kvdtest import (ROOT, Etcd, Kvd, Client, pb, test, check, run_tests, etcdctl, wait_for, free_port)
from diff import normalize, show, prefix_end
import snapshot  # its bbolt reader and restored etcd; tls: its certificates
import tls
del kvdtest._tests[:]  # their tests are theirs to run

R = pb()["rpc"]
AUTHPB = pb()["auth"]
TOKEN = re.compile(r"^[a-zA-Z]{16}\.[0-9]+$")
COST = ["--bcrypt-cost", "4"]  # the differential runs compare semantics; cost 10 is tried below
SAN = os.environ.get("KVD_TEST") or None  # ASan+UBSan build (test/run.sh), where speed does not matter

# method -> (service, request class, response class)
M = {
    "AuthEnable": ("Auth", "AuthEnableRequest", "AuthEnableResponse"),
    "AuthDisable": ("Auth", "AuthDisableRequest", "AuthDisableResponse"),
    "Authenticate": ("Auth", "AuthenticateRequest", "AuthenticateResponse"),
    "UserAdd": ("Auth", "AuthUserAddRequest", "AuthUserAddResponse"),
    "UserGet": ("Auth", "AuthUserGetRequest", "AuthUserGetResponse"),
    "UserList": ("Auth", "AuthUserListRequest", "AuthUserListResponse"),
    "UserDelete": ("Auth", "AuthUserDeleteRequest", "AuthUserDeleteResponse"),
    "UserChangePassword": ("Auth", "AuthUserChangePasswordRequest", "AuthUserChangePasswordResponse"),
    "UserGrantRole": ("Auth", "AuthUserGrantRoleRequest", "AuthUserGrantRoleResponse"),
    "UserRevokeRole": ("Auth", "AuthUserRevokeRoleRequest", "AuthUserRevokeRoleResponse"),
    "RoleAdd": ("Auth", "AuthRoleAddRequest", "AuthRoleAddResponse"),
    "RoleGet": ("Auth", "AuthRoleGetRequest", "AuthRoleGetResponse"),
    "RoleList": ("Auth", "AuthRoleListRequest", "AuthRoleListResponse"),
    "RoleDelete": ("Auth", "AuthRoleDeleteRequest", "AuthRoleDeleteResponse"),
    "RoleGrantPermission": ("Auth", "AuthRoleGrantPermissionRequest", "AuthRoleGrantPermissionResponse"),
    "RoleRevokePermission": ("Auth", "AuthRoleRevokePermissionRequest", "AuthRoleRevokePermissionResponse"),
    "Range": ("KV", "RangeRequest", "RangeResponse"),
    "Put": ("KV", "PutRequest", "PutResponse"),
    "DeleteRange": ("KV", "DeleteRangeRequest", "DeleteRangeResponse"),
    "Txn": ("KV", "TxnRequest", "TxnResponse"),
    "Compact": ("KV", "CompactionRequest", "CompactionResponse"),
    "LeaseGrant": ("Lease", "LeaseGrantRequest", "LeaseGrantResponse"),
    "LeaseRevoke": ("Lease", "LeaseRevokeRequest", "LeaseRevokeResponse"),
    "LeaseTimeToLive": ("Lease", "LeaseTimeToLiveRequest", "LeaseTimeToLiveResponse"),
    "Hash": ("Maintenance", "HashRequest", "HashResponse"),
    "HashKV": ("Maintenance", "HashKVRequest", "HashKVResponse"),
    "Alarm": ("Maintenance", "AlarmRequest", "AlarmResponse"),
    "Status": ("Maintenance", "StatusRequest", "StatusResponse"),
}


class Peer:
    """One server seen through grpcio, with the tokens it gave, by user."""

    def __init__(self, endpoint):
        self.c = Client(endpoint)
        self.tok = {}
        self.leases = []  # lease ids this server gave, in order: requests name them by index + 1

    def lease_ids(self, method, req):
        """A copy of req with the test's lease numbers made this server's ids."""
        if method not in ("Put", "LeaseRevoke", "LeaseTimeToLive"):
            return req
        q = type(req)()
        q.CopyFrom(req)
        f = "lease" if method == "Put" else "ID"
        n = getattr(q, f)
        if n:
            setattr(q, f, self.leases[n - 1] if n <= len(self.leases) else 12345)
        return q

    def call(self, method, req, token=None, timeout=30):
        svc, _, resp = M[method]
        cls = getattr(R, resp)
        f = self.c.ch.unary_unary("/etcdserverpb.%s/%s" % (svc, method),
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=cls.FromString)
        try:
            return ("ok", f(req, timeout=timeout, metadata=[("token", token)] if token else None))
        except self.c.grpc.RpcError as e:
            return ("err", e.code().name, e.details())

    def call_raw(self, path, req, token=None):
        """Any unary method by path: ('ok', bytes) or ('err', code, text)."""
        f = self.c.ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=lambda b: b)
        try:
            return ("ok", f(req, timeout=30, metadata=[("token", token)] if token else None))
        except self.c.grpc.RpcError as e:
            return ("err", e.code().name, e.details())

    def watch(self, creq, token=None):
        """The first answer to one watch create, then the stream goes."""
        f = self.c.ch.stream_stream("/etcdserverpb.Watch/Watch", request_serializer=lambda m: m.SerializeToString(),
                                    response_deserializer=R.WatchResponse.FromString)
        done = threading.Event()

        def reqs():
            yield R.WatchRequest(create_request=creq)
            done.wait(30)
        it = f(reqs(), timeout=30, metadata=[("token", token)] if token else None)
        try:
            first = next(it)
            return ("ok", first)
        except self.c.grpc.RpcError as e:
            return ("err", e.code().name, e.details())
        finally:
            done.set()
            it.cancel()

    def defragment(self, token=None):
        f = self.c.ch.unary_unary("/etcdserverpb.Maintenance/Defragment",
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=R.DefragmentResponse.FromString)
        return f(R.DefragmentRequest(), timeout=60, metadata=[("token", token)] if token else None)

    def close(self):
        self.c.close()


def canon(ans, peer=None):
    """Comparable form: headers without ids and term; a token by its shape;
    lease ids by the order the server gave them."""
    if ans[0] != "ok":
        return ans
    m = ans[1]
    if isinstance(m, R.AuthenticateResponse):
        m = R.AuthenticateResponse()
        m.CopyFrom(ans[1])
        m.token = "TOKEN" if TOKEN.match(m.token) else "BAD:" + m.token
    if isinstance(m, (R.StatusResponse, R.HashResponse, R.HashKVResponse)):
        return ("ok", type(m).__name__)  # Hash covers bcrypt's random salts, HashKV lease ids
    if isinstance(m, R.LeaseGrantResponse):  # ids are each server's own
        m = R.LeaseGrantResponse()
        m.CopyFrom(ans[1])
        m.ID = 1
    if isinstance(m, R.LeaseTimeToLiveResponse) and m.TTL > 0:  # seconds left, truncated: a tick apart
        m = R.LeaseTimeToLiveResponse()
        m.CopyFrom(ans[1])
        m.TTL = 1
    if peer is None or not peer.leases:
        return ("ok", normalize(m).SerializeToString(deterministic=True))
    from google.protobuf import text_format
    t = text_format.MessageToString(normalize(m), as_one_line=True)
    ids = {str(x): "L%d" % (i + 1) for i, x in enumerate(peer.leases)}
    return ("ok", re.sub(r"\b\d{6,}\b", lambda mm: ids.get(mm.group(0), mm.group(0)), t))


USERS = ["root", "u1", "u2", "u3"]
ROLES = ["root", "r1", "r2", "r3"]
KEYS = [b"a", b"b", b"c", b"ab", b"abc", b"b\x00", b"k/1", b"k/2", b"k/10", b"z"]


class Gen:
    """Random auth-heavy sequences.  Avoids the three requests where kvd is
    deliberately stricter than 3.4.23 (see the auth essay in kvd.c): nested
    txns, LeaseTimeToLive with keys and from-key watches by non-root users
    are tried in their own test, not compared."""

    def __init__(self, seed):
        self.r = random.Random(seed)
        self.pw = {}      # user -> password as the test believes it
        self.leases = []

    def name(self, pool):
        c = self.r.random()
        return "" if c < 0.03 else "nobody" if c < 0.08 else self.r.choice(pool)

    def key(self):
        return self.r.choice(KEYS)

    def end(self, key):
        c = self.r.random()
        if c < 0.4:
            return b""
        if c < 0.55:
            return b"\x00"
        if c < 0.8:
            return prefix_end(key)
        return self.r.choice(KEYS)

    def perm(self):
        k = self.key()
        return AUTHPB.Permission(permType=self.r.randrange(3), key=k, range_end=self.end(k))

    def who(self):
        c = self.r.random()
        if c < 0.35:
            return "root"
        if c < 0.8:
            return self.r.choice(USERS[1:])
        if c < 0.92:
            return None
        return "forged"

    def next(self):
        r = self.r
        c = r.random()
        if c < 0.05:
            u = self.name(USERS)
            pw = r.choice(["", "pw-%d" % r.randrange(100)])
            nopw = r.random() < 0.1
            return ("UserAdd", R.AuthUserAddRequest(name=u, password=pw, options=AUTHPB.UserAddOptions(
                no_password=nopw)), self.who(), (u, None if nopw else pw))
        if c < 0.09:
            return ("UserGrantRole", R.AuthUserGrantRoleRequest(user=self.name(USERS), role=self.name(ROLES)),
                    self.who(), None)
        if c < 0.11:
            return ("UserRevokeRole", R.AuthUserRevokeRoleRequest(name=self.name(USERS), role=self.name(ROLES)),
                    self.who(), None)
        if c < 0.13:
            u = self.name(USERS[1:])  # root keeps its password: the test needs it
            pw = "pw-%d" % r.randrange(100)
            return ("UserChangePassword", R.AuthUserChangePasswordRequest(name=u, password=pw), self.who(), (u, pw))
        if c < 0.14:
            return ("UserDelete", R.AuthUserDeleteRequest(name=self.name(USERS[1:] + ["root"] * (r.random() < 0.1))),
                    self.who(), None)
        if c < 0.17:
            return ("RoleAdd", R.AuthRoleAddRequest(name=self.name(ROLES)), self.who(), None)
        if c < 0.23:
            return ("RoleGrantPermission", R.AuthRoleGrantPermissionRequest(name=self.name(ROLES), perm=self.perm()),
                    self.who(), None)
        if c < 0.25:
            p = self.perm()
            return ("RoleRevokePermission", R.AuthRoleRevokePermissionRequest(role=self.name(ROLES), key=p.key,
                                                                              range_end=p.range_end),
                    self.who(), None)
        if c < 0.26:
            return ("RoleDelete", R.AuthRoleDeleteRequest(role=self.name(ROLES)), self.who(), None)
        if c < 0.29:
            return ("UserGet", R.AuthUserGetRequest(name=self.name(USERS)), self.who(), None)
        if c < 0.32:
            return ("RoleGet", R.AuthRoleGetRequest(role=self.name(ROLES)), self.who(), None)
        if c < 0.33:
            return ("UserList", R.AuthUserListRequest(), self.who(), None)
        if c < 0.34:
            return ("RoleList", R.AuthRoleListRequest(), self.who(), None)
        if c < 0.36:
            return ("AuthEnable", R.AuthEnableRequest(), self.who(), None)
        if c < 0.37:
            return ("AuthDisable", R.AuthDisableRequest(), self.who(), None)
        if c < 0.45:
            u = self.name(USERS)
            pw = self.pw.get(u, "x") if r.random() < 0.8 else "wrong"
            return ("Authenticate", R.AuthenticateRequest(name=u, password=pw), None, u)
        who = self.who()
        k = self.key()
        if c < 0.58:
            return ("Range", R.RangeRequest(key=k, range_end=self.end(k), serializable=r.random() < 0.5), who, None)
        if c < 0.70:
            lease = r.randrange(len(self.leases)) + 1 if self.leases and r.random() < 0.2 else 0
            return ("Put", R.PutRequest(key=k, value=b"v%d" % r.randrange(9), lease=lease,
                                        prev_kv=r.random() < 0.2), who, None)
        if c < 0.76:
            return ("DeleteRange", R.DeleteRangeRequest(key=k, range_end=self.end(k), prev_kv=r.random() < 0.3),
                    who, None)
        if c < 0.84:
            t = R.TxnRequest()
            for _ in range(r.randint(0, 2)):
                kk = self.key()
                t.compare.add(key=kk, range_end=self.end(kk), target=R.Compare.VERSION, result=R.Compare.GREATER,
                              version=0)
            for branch in (t.success, t.failure):
                used = set()
                for _ in range(r.randint(0, 2)):
                    kk = self.key()
                    if kk in used:
                        continue
                    used.add(kk)
                    op = branch.add()
                    x = r.random()
                    if x < 0.4:
                        op.request_range.key = kk
                        op.request_range.range_end = self.end(kk)
                    elif x < 0.8:
                        op.request_put.key = kk
                        op.request_put.value = b"t"
                    else:
                        op.request_delete_range.key = kk
                        op.request_delete_range.prev_kv = r.random() < 0.5
            return ("Txn", t, who, None)
        if c < 0.86:
            return ("LeaseGrant", R.LeaseGrantRequest(TTL=600), who, None)
        if c < 0.88 and self.leases:
            return ("LeaseRevoke", R.LeaseRevokeRequest(ID=r.randrange(len(self.leases)) + 1), who, None)
        if c < 0.89:
            return ("Compact", R.CompactionRequest(revision=1), who, None)
        if c < 0.91:
            return ("Hash" if r.random() < 0.5 else "HashKV",
                    R.HashRequest() if r.random() < 0.5 else R.HashKVRequest(), who, None)
        if c < 0.92:
            return ("Alarm", R.AlarmRequest(action=R.AlarmRequest.GET), who, None)
        if c < 0.93:
            return ("LeaseTimeToLive", R.LeaseTimeToLiveRequest(ID=r.randrange(max(1, len(self.leases))) + 1),
                    who, None)
        kk = self.key()
        e = self.end(kk)
        if e == b"\x00" and who != "root":
            e = b""
        return ("Watch", R.WatchCreateRequest(key=kk, range_end=e), who, None)

    def learn(self, method, extra, ans):
        if ans[0] != "ok":
            return
        if method in ("UserAdd", "UserChangePassword") and extra[1] is not None:
            self.pw[extra[0]] = extra[1]
        if method == "LeaseGrant":
            self.leases.append(1)


def token_for(p, who):
    if who is None:
        return None
    if who == "forged":
        return "abcdefghijklmnop.1"
    return p.tok.get(who)


def run_seed(seed, nops):
    e = Etcd(COST)
    k = Kvd(binary=SAN, args=COST)
    pe, pk = Peer(e.endpoint()), Peer(k.endpoint())
    g = Gen(seed)
    # a root user with the root role, and the roles, so auth can be on
    for p in (pe, pk):
        p.call("UserAdd", R.AuthUserAddRequest(name="root", password="rootpw"))
        p.call("UserGrantRole", R.AuthUserGrantRoleRequest(user="root", role="root"))
    g.pw["root"] = "rootpw"
    bad = 0
    compared = 0
    kinds = {}
    for i in range(nops):
        method, req, who, extra = g.next()
        if method == "Watch":
            ans = [p.watch(req, token_for(p, who)) for p in (pe, pk)]
        else:
            ans = [p.call(method, p.lease_ids(method, req), token_for(p, who)) for p in (pe, pk)]
        compared += 1
        if method == "LeaseGrant":
            for p, a in zip((pe, pk), ans):
                if a[0] == "ok":
                    p.leases.append(a[1].ID)
        if method == "Authenticate":
            for p, a in zip((pe, pk), ans):
                if a[0] == "ok":
                    p.tok[extra] = a[1].token
        for p, a in zip((pe, pk), ans):  # a token that stopped working goes
            if a[0] == "err" and a[2] == "etcdserver: invalid auth token" and who in p.tok:
                del p.tok[who]
        if canon(ans[0], pe) != canon(ans[1], pk):
            bad += 1
            if bad <= int(os.environ.get("AUTH_SHOW", "3")):
                print("seed %d op %d: %s as %s %s\n  etcd: %s\n  kvd:  %s" % (
                    seed, i, method, who, str(req).replace("\n", " ")[:300],
                    show(ans[0]) if ans[0][0] == "ok" else ans[0],
                    show(ans[1]) if ans[1][0] == "ok" else ans[1]), flush=True)
        g.learn(method, extra, ans[1])
        kk = "ok" if ans[1][0] == "ok" else ans[1][2].split(": ", 1)[-1]
        if method == "Watch" and ans[1][0] == "ok" and ans[1][1].canceled:
            kk = "watch refused"
        kinds[kk] = kinds.get(kk, 0) + 1
    check(bad == 0, "seed %d: %d of %d answers differ" % (seed, bad, compared))
    print("  seed %d: %d ops compared; %s" % (seed, compared, ", ".join(
        "%s %d" % (k_, v) for k_, v in sorted(kinds.items(), key=lambda x: -x[1]))))
    check(k.alive(), "kvd alive after seed %d" % seed)
    return e, k, pe, pk, g


def listing(p, token):
    """Every user's roles and every role's permissions, as p's root sees them."""
    out = []
    users = p.call("UserList", R.AuthUserListRequest(), token)
    roles = p.call("RoleList", R.AuthRoleListRequest(), token)
    if users[0] != "ok" or roles[0] != "ok":
        return (users, roles)
    for u in users[1].users:
        out.append((u, canon(p.call("UserGet", R.AuthUserGetRequest(name=u), token))))
    for r in roles[1].roles:
        out.append((r, canon(p.call("RoleGet", R.AuthRoleGetRequest(role=r), token))))
    st = canon(p.call("Authenticate", R.AuthenticateRequest(name="root", password="rootpw")))
    return (list(users[1].users), list(roles[1].roles), out, st)


def root_token(p):
    a = p.call("Authenticate", R.AuthenticateRequest(name="root", password="rootpw"))
    return a[1].token if a[0] == "ok" else None


@test
def differential_random_sequences():
    """Four seeded sequences of user, role, permission and key operations by
    root, users, nobody and a forged token, beside etcd 3.7.3: every answer
    the same, so each check reads the users and roles as they are now, no
    permission cached [§17.2]; checks fail in etcd's order with its texts,
    empty and unknown names included [§21.2] (an error compared by its gRPC
    code and etcd's text byte for byte [§2.1]); listings show roles and
    permissions in etcd's order, and root stays while auth is on [§21.5]."""
    for seed in (1, 2, 3, 4):
        e, k, pe, pk, g = run_seed(seed, 600)
        # durable: the same users and roles after a restart and after a rewrite
        te, tk = root_token(pe), root_token(pk)
        want = listing(pe, te)
        check(listing(pk, tk) == want, "seed %d: kvd's users and roles equal etcd's" % seed)
        pk.close()
        k.stop()
        k2 = Kvd(binary=SAN, args=COST, data_dir=k.dir)
        pk2 = Peer(k2.endpoint())
        tk = root_token(pk2)
        check(listing(pk2, tk) == want, "seed %d: the same after a restart" % seed)
        pk2.defragment(tk)
        pk2.close()
        k2.stop()
        k3 = Kvd(binary=SAN, args=COST, data_dir=k.dir)
        pk3 = Peer(k3.endpoint())
        check(listing(pk3, root_token(pk3)) == want, "seed %d: the same after a log rewrite and a restart" % seed)
        pk3.close()
        pe.close()
        k3.stop()
        e.stop()


def setup_alice(p):
    """root (root role), alice with r1: readwrite on the prefix /app/, read on k1."""
    for m, req in (("UserAdd", R.AuthUserAddRequest(name="root", password="rootpw")),
                   ("UserGrantRole", R.AuthUserGrantRoleRequest(user="root", role="root")),
                   ("UserAdd", R.AuthUserAddRequest(name="alice", password="apw")),
                   ("RoleAdd", R.AuthRoleAddRequest(name="r1")),
                   ("RoleGrantPermission", R.AuthRoleGrantPermissionRequest(name="r1", perm=AUTHPB.Permission(
                       permType=2, key=b"/app/", range_end=b"/app0"))),
                   ("RoleGrantPermission", R.AuthRoleGrantPermissionRequest(name="r1", perm=AUTHPB.Permission(
                       permType=0, key=b"k1"))),
                   ("UserGrantRole", R.AuthUserGrantRoleRequest(user="alice", role="r1")),
                   ("AuthEnable", R.AuthEnableRequest())):
        a = p.call(m, req)
        assert a[0] == "ok", (m, a)
    p.tok["root"] = root_token(p)
    p.tok["alice"] = p.call("Authenticate", R.AuthenticateRequest(name="alice", password="apw"))[1].token


@test
def stricter_than_3_4_where_3_4_leaks():
    """Nested txns, LeaseTimeToLive with keys and from-key watches: kvd checks
    what later etcd releases check; 3.4.23 lets these through."""
    k = Kvd(binary=SAN, args=COST)
    p = Peer(k.endpoint())
    setup_alice(p)
    root, alice = p.tok["root"], p.tok["alice"]
    check(p.call("Put", R.PutRequest(key=b"secret", value=b"s"), root)[0] == "ok", "root writes a secret")
    t = R.TxnRequest()
    t.success.add().request_txn.success.add().request_range.key = b"secret"
    a = p.call("Txn", t, alice)
    check(a == ("err", "PERMISSION_DENIED", "etcdserver: permission denied"), "a nested txn is checked: %s" % (a,))
    lease = p.call("LeaseGrant", R.LeaseGrantRequest(TTL=600), root)[1].ID
    p.call("Put", R.PutRequest(key=b"secret2", value=b"s", lease=lease), root)
    a = p.call("LeaseTimeToLive", R.LeaseTimeToLiveRequest(ID=lease, keys=True), alice)
    check(a == ("err", "PERMISSION_DENIED", "etcdserver: permission denied"), "TTL with keys is checked: %s" % (a,))
    a = p.call("LeaseTimeToLive", R.LeaseTimeToLiveRequest(ID=lease), alice)
    check(a[0] == "ok" and a[1].TTL > 0, "TTL without keys is not: %s" % (a,))
    a = p.call("LeaseRevoke", R.LeaseRevokeRequest(ID=lease), alice)
    check(a == ("err", "PERMISSION_DENIED", "etcdserver: permission denied"), "revoke needs write on its keys")
    w = p.watch(R.WatchCreateRequest(key=b"k1", range_end=b"\x00"), alice)
    check(w[0] == "ok" and w[1].canceled and w[1].created and "permission denied" in w[1].cancel_reason,
          "a from-key watch needs read on the whole interval: %s" % (w,))
    w = p.watch(R.WatchCreateRequest(key=b"/app/", range_end=b"/app0"), alice)
    check(w[0] == "ok" and w[1].created and not w[1].canceled, "a permitted watch is created")
    p.close()
    check(k.stop() == 0, "kvd stopped cleanly")


def ctl(srv, *args, stdin=None):
    e = dict(os.environ, ETCDCTL_API="3")
    r = subprocess.run(["etcdctl", "--endpoints", srv.endpoint()] + list(args), input=stdin,
                       capture_output=True, text=True, timeout=60, env=e)
    err = r.stderr.strip().splitlines()
    return r.returncode, r.stdout, err[-1] if err else ""


@test
def etcdctl_side_by_side():
    e = Etcd(COST)
    k = Kvd(binary=SAN, args=COST)
    steps = [
        ("user", "add", "root", "--interactive=false", "<rootpw\n"),
        ("user", "add", "alice:apw"),
        ("user", "add", "bob", "--new-user-password=bpw"),
        ("role", "add", "app"),
        ("role", "grant-permission", "app", "readwrite", "/app/", "--prefix"),
        ("role", "grant-permission", "app", "read", "k1"),
        ("role", "grant-permission", "app", "write", "from/", "--from-key"),
        ("role", "grant-permission", "app", "read", "a", "c"),
        ("user", "grant-role", "alice", "app"),
        ("role", "get", "app"),
        ("auth", "enable"),
        ("--user", "alice:apw", "put", "/app/x", "1"),
        ("--user", "alice:apw", "get", "/app/", "--prefix"),
        ("--user", "alice:apw", "put", "/elsewhere", "1"),
        ("--user", "alice:apw", "put", "from/z", "1"),
        ("--user", "alice:apw", "get", "b"),
        ("--user", "alice:apw", "get", "a", "d"),
        ("--user", "bob:bpw", "get", "k1"),
        ("--user", "alice:wrong", "get", "k1"),
        ("get", "k1"),
        ("--user", "root:rootpw", "user", "list"),
        ("--user", "root:rootpw", "role", "list"),
        ("--user", "root:rootpw", "user", "get", "alice"),
        ("--user", "alice:apw", "user", "get", "alice"),
        ("--user", "alice:apw", "user", "get", "bob"),
        ("--user", "alice:apw", "role", "get", "app"),
        ("--user", "alice:apw", "user", "list"),
        ("--user", "root:rootpw", "role", "revoke-permission", "app", "k1"),
        ("--user", "root:rootpw", "role", "revoke-permission", "app", "nothere"),
        ("--user", "root:rootpw", "user", "revoke-role", "alice", "app"),
        ("--user", "alice:apw", "get", "/app/x"),
        ("--user", "root:rootpw", "user", "passwd", "alice", "--interactive=false", "<apw2\n"),
        ("--user", "alice:apw2", "get", "/app/x"),
        ("--user", "root:rootpw", "user", "delete", "root"),
        ("--user", "root:rootpw", "role", "delete", "root"),
        ("--user", "root:rootpw", "user", "revoke-role", "root", "root"),
        ("--user", "root:rootpw", "role", "delete", "app"),
        ("--user", "root:rootpw", "user", "delete", "bob"),
        ("--user", "root:rootpw", "user", "add", "root:again"),
        ("--user", "root:rootpw", "endpoint", "hashkv"),
        ("--user", "root:rootpw", "auth", "disable"),
        ("get", "k1"),
        ("user", "list"),
    ]
    same = 0
    for st in steps:
        args, stdin = list(st), None
        if args[-1].startswith("<"):
            stdin = args.pop()[1:]
        a, b = ctl(e, *args, stdin=stdin), ctl(k, *args, stdin=stdin)
        if "hashkv" in args:  # the same store, but a different endpoint in the output
            a = (a[0], re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "EP", a[1]), a[2])
            b = (b[0], re.sub(r"\d+\.\d+\.\d+\.\d+:\d+", "EP", b[1]), b[2])
        a = (a[0], a[1], re.sub(r"^\{.*\}$", "", a[2]))
        b = (b[0], b[1], re.sub(r"^\{.*\}$", "", b[2]))
        if check(a == b, "etcdctl %s: etcd %r, kvd %r" % (" ".join(args), a, b)):
            same += 1
    print("  %d etcdctl commands, same output on both" % same)
    e.stop()
    k.stop()


@test
def python_etcd3_with_a_password():
    # grpcio sends call credentials (python3-etcd3's token) only over TLS
    tls.certs()
    k = tls.kvd_tls(COST + tls.server_args(), plain=True)
    p = Peer(k.plain_url[len("http://"):])
    setup_alice(p)
    p.close()
    out = subprocess.run(["/usr/bin/python3", "-c", r"""
import sys, etcd3
ca = sys.argv[2]
c = etcd3.client(host="127.0.0.1", port=int(sys.argv[1]), user="alice", password="apw", ca_cert=ca)
c.put("/app/py", "1")
v, m = c.get("/app/py")
print("CHECK", "ok" if v == b"1" else "FAIL", "get back what was put")
try:
    c.put("/nope", "1")
    print("CHECK FAIL a put outside the role went through")
except Exception as e:
    print("CHECK", "ok" if "permission denied" in str(e) else "FAIL", "denied: %s" % e)
try:
    etcd3.client(host="127.0.0.1", port=int(sys.argv[1]), user="alice", password="bad", ca_cert=ca).get("k1")
    print("CHECK FAIL a wrong password worked")
except Exception as e:
    print("CHECK", "ok" if "authentication failed" in str(e) else "FAIL", "wrong password: %s" % e)
""", str(k.tport), tls.p("ca.pem")], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("CHECK ")]
    for ln in lines:
        ok, _, what = ln[6:].partition(" ")
        check(ok == "ok", what)
    check(len(lines) == 3, "python3-etcd3 ran: %s" % out.stderr[-600:])
    k.stop()


def users_in_snapshot(path):
    with open(path, "rb") as f:
        data = f.read()
    b, _ = snapshot.bolt_read(data[:len(data) - 32])
    return {k: AUTHPB.User.FromString(v) for k, v in b.get("authUsers", [])}, dict(b.get("auth", []))


@test
def bcrypt_as_python_and_etcd_make_it():
    import bcrypt
    k = Kvd()  # cost 10, the default
    p = Peer(k.endpoint())
    pws = {"u%d" % i: pw for i, pw in enumerate(["", "a", "pässwörd", "x" * 71, "y" * 72, "z" * 100, "\x01\x7f"])}
    for u, pw in pws.items():
        check(p.call("UserAdd", R.AuthUserAddRequest(name=u, password=pw))[0] == "ok", "add %s" % u)
    p.call("UserAdd", R.AuthUserAddRequest(name="root", password="rootpw"))
    p.call("UserGrantRole", R.AuthUserGrantRoleRequest(user="root", role="root"))
    snap = tempfile.mktemp(suffix=".db")
    r = etcdctl(k, "snapshot", "save", snap)
    check(r[0] == 0, "etcdctl snapshot save: %s" % r[2][-300:])
    users, authb = users_in_snapshot(snap)
    for u, pw in pws.items():
        h = users[u.encode()].password
        check(h.startswith(b"$2a$10$") and len(h) == 60, "%s: Go's format: %r" % (u, h))
        check(bcrypt.checkpw(pw.encode()[:72], h), "%s: Python's bcrypt accepts kvd's hash" % u)
        check(not bcrypt.checkpw(b"wrong", h), "%s: and refuses another password" % u)
    check(authb.get(b"authRevision") == (len(pws) + 3).to_bytes(8, "big"),
          "auth revision in the snapshot: %r" % authb.get(b"authRevision"))
    # etcd restores kvd's snapshot and takes its hashes; a user etcd adds comes back to kvd
    re_ = snapshot.Restored(snap)
    try:
        pe = Peer(re_.endpoint())
        check(pe.call("AuthEnable", R.AuthEnableRequest())[0] == "ok", "auth on in the restored etcd")
        for u, pw in pws.items():
            tok = pe.call("Authenticate", R.AuthenticateRequest(name=u, password=pw))
            check(tok[0] == "ok" and TOKEN.match(tok[1].token), "etcd accepts kvd's hash for %s: %s" % (u, tok))
        rt = root_token(pe)
        pe.call("UserAdd", R.AuthUserAddRequest(name="made-by-etcd", password="etcdpw"), rt)
        snap2 = tempfile.mktemp(suffix=".db")
        r = etcdctl(re_, "--user", "root:rootpw", "snapshot", "save", snap2)
        check(r[0] == 0, "snapshot from etcd: %s" % r[2][-300:])
        pe.close()
    finally:
        re_.stop()
    k.stop()
    d = tempfile.mkdtemp(prefix="kvd-auth-")
    k2 = Kvd(args=["--restore-snapshot", snap2], data_dir=d)
    pk = Peer(k2.endpoint())
    tok = pk.call("Authenticate", R.AuthenticateRequest(name="made-by-etcd", password="etcdpw"))
    check(tok[0] == "ok", "kvd accepts etcd's hash after the import: %s" % (tok,))
    bad = pk.call("Authenticate", R.AuthenticateRequest(name="made-by-etcd", password="nope"))
    check(bad == ("err", "INVALID_ARGUMENT", "etcdserver: authentication failed, invalid user ID or password"),
          "and refuses a wrong one: %s" % (bad,))
    st = pk.call("UserList", R.AuthUserListRequest(), root_token(pk))
    check(st[0] == "ok" and "made-by-etcd" in st[1].users and "u6" in st[1].users, "every user came back")
    pk.close()
    k2.stop()
    for f in (snap, snap2):
        os.unlink(f)


@test
def client_certificate_cn_is_the_user():
    tls.certs()
    k = tls.kvd_tls(COST + tls.server_args(extra=["--trusted-ca-file", tls.p("ca.pem"), "--client-cert-auth"]))

    def run(*args):
        return tls.ctl(k, "ca", "alice", *args)
    for args in (("user", "add", "root:rootpw"), ("user", "grant-role", "root", "root"), ("role", "add", "r"),
                 ("role", "grant-permission", "r", "readwrite", "cn/", "--prefix"),
                 ("user", "add", "alice:whatever"), ("user", "grant-role", "alice", "r"), ("auth", "enable")):
        r = run(*args)
        check(r[0] == 0, "etcdctl %s: %s" % (" ".join(args), r[2][-300:]))
    r = run("put", "cn/x", "1")
    check(r[0] == 0, "no token: the certificate's CN (alice) may write cn/: %s" % r[2][-300:])
    r = run("put", "other", "1")
    check(r[0] != 0 and "permission denied" in r[2], "and nothing else: %s" % r[2][-200:])
    r = run("--user", "root:rootpw", "put", "other", "1")
    check(r[0] == 0, "a token wins over the CN: %s" % r[2][-200:])
    r = tls.ctl(k, "ca", "bob", "get", "cn/x")
    check(r[0] != 0 and "permission denied" in r[2], "bob's certificate names no user: %s" % r[2][-200:])
    k.stop()


def timed_ranges(endpoint, token, stop, lat, errs):
    c = Peer(endpoint)
    while not stop.is_set():
        t0 = time.time()
        a = c.call("Range", R.RangeRequest(key=b"/app/x"), token)
        lat.append(time.time() - t0)
        if a[0] != "ok":
            errs.append(a)
    c.close()


@test
def brute_force_does_not_starve_others():
    """48 concurrent wrong-password guessers at bcrypt cost 10: an honest
    reader's Ranges go on meanwhile (no hash runs inside a handler), and the
    hash queue's bound turns guessers away.  [§12.4]"""
    k = Kvd()  # cost 10: each wrong password costs a real hash
    p = Peer(k.endpoint())
    setup_alice(p)
    stop, lat, errs = threading.Event(), [], []
    reader = threading.Thread(target=timed_ranges, args=(k.endpoint(), p.tok["alice"], stop, lat, errs))
    reader.start()
    wait_for(lambda: len(lat) > 5, 30)
    results = []

    def guesser(n):
        c = Peer(k.endpoint())
        for i in range(n):
            results.append(c.call("Authenticate", R.AuthenticateRequest(name="alice", password="guess%d" % i)))
        c.close()
    before = len(lat)
    gs = [threading.Thread(target=guesser, args=(6,)) for _ in range(48)]
    t0 = time.time()
    for g in gs:
        g.start()
    for g in gs:
        g.join()
    took = time.time() - t0
    during = len(lat) - before
    stop.set()
    reader.join()
    failed = [r for r in results if r == ("err", "INVALID_ARGUMENT",
                                          "etcdserver: authentication failed, invalid user ID or password")]
    busy = [r for r in results if r == ("err", "RESOURCE_EXHAUSTED", "etcdserver: too many requests")]
    check(len(failed) + len(busy) == len(results), "every guess failed or was turned away: %s" %
          [r for r in results if r not in failed and r not in busy][:3])
    check(len(failed) > 0, "guesses were hashed")
    check(len(busy) > 0, "48 concurrent guessers exceed the hash queue: some turned away")
    check(not errs, "the honest reader never failed: %s" % errs[:3])
    check(during > len(failed), "the honest reader kept going during the flood: %d ranges for %d hashes" %
          (during, len(failed)))
    s = sorted(lat[before:before + during]) or [0]
    print("  %d guesses hashed, %d turned away in %.1fs; reader meanwhile: %d ranges, p50 %.1f ms, max %.1f ms" %
          (len(failed), len(busy), took, during, s[len(s) // 2] * 1000, s[-1] * 1000))
    a = p.call("Authenticate", R.AuthenticateRequest(name="alice", password="apw"))
    check(a[0] == "ok", "the right password still works after the flood")
    # an unauthenticated flood: errors, no work
    c = Peer(k.endpoint())
    r = [c.call("Put", R.PutRequest(key=b"/app/x", value=b"1")) for _ in range(200)]
    check(all(x == ("err", "INVALID_ARGUMENT", "etcdserver: user name is empty") for x in r),
          "no token: 'user name is empty' every time")
    r = [c.call("Put", R.PutRequest(key=b"/app/x", value=b"1"), "made.up") for _ in range(200)]
    check(all(x == ("err", "UNAUTHENTICATED", "etcdserver: invalid auth token") for x in r),
          "a made-up token: 'invalid auth token' every time")
    c.close()
    p.close()
    check(k.stop() == 0, "kvd stopped cleanly")


@test
def empty_ranges_as_etcd():
    """A range with key >= range_end reads and deletes nothing, but etcd
    still checks it, through its interval tree: whether it is permitted
    depends on where the red-black insertion put each permission (the
    overlap test calls an inverted range "overlapping" some nodes and
    "right of" others, and the maximum-end pruning skips subtrees).  kvd let
    every one through; it now builds etcd's tree for them.  Random users
    with random permissions (inverted ones too, which 3.4 stores), inverted
    and ordinary ranges, side by side with etcd 3.4."""
    e, k = Etcd(), Kvd(binary=SAN, args=COST)
    pe, pk = Peer(e.endpoint()), Peer(k.endpoint())
    keys = [b"a", b"b", b"c", b"ab", b"abc", b"b\x00", b"k/1", b"k/2", b"k/10", b"z", b"m", b"q", b"y"]
    for p in (pe, pk):
        for m_, req in (("UserAdd", R.AuthUserAddRequest(name="root", password="rootpw")),
                        ("UserGrantRole", R.AuthUserGrantRoleRequest(user="root", role="root")),
                        ("AuthEnable", R.AuthEnableRequest())):
            assert p.call(m_, req)[0] == "ok", m_
        p.tok["root"] = root_token(p)
    n = differ = inverted = denied = 0
    for seed in range(24):
        r = random.Random(seed)
        u, roles = "u%d" % seed, ["r%d_%d" % (seed, i) for i in range(r.randrange(1, 4))]
        perms = []
        for _ in range(r.randrange(1, 12)):
            key = r.choice(keys)
            c = r.random()
            end = b"" if c < 0.15 else b"\x00" if c < 0.25 else prefix_end(key) if c < 0.4 else r.choice(keys)
            perms.append((r.choice(roles), AUTHPB.Permission(permType=r.randrange(3), key=key, range_end=end)))
        for p in (pe, pk):
            t = p.tok["root"]
            p.call("UserAdd", R.AuthUserAddRequest(name=u, password="pw"), t)
            for ro in roles:
                p.call("RoleAdd", R.AuthRoleAddRequest(name=ro), t)
                p.call("UserGrantRole", R.AuthUserGrantRoleRequest(user=u, role=ro), t)
            for ro, pe_ in perms:
                p.call("RoleGrantPermission", R.AuthRoleGrantPermissionRequest(name=ro, perm=pe_), t)
            p.tok[u] = p.call("Authenticate", R.AuthenticateRequest(name=u, password="pw"))[1].token
        for q in range(40):
            key = r.choice(keys)
            end = r.choice(keys) if r.random() < 0.8 else prefix_end(key)
            meth = r.choice(["Range", "DeleteRange", "Txn"])
            ans = []
            for p in (pe, pk):
                if meth == "Range":
                    a = p.call("Range", R.RangeRequest(key=key, range_end=end), p.tok[u])
                elif meth == "DeleteRange":
                    a = p.call("DeleteRange", R.DeleteRangeRequest(key=key, range_end=end), p.tok[u])
                else:
                    t = R.TxnRequest()
                    t.success.add().request_range.CopyFrom(R.RangeRequest(key=key, range_end=end))
                    a = p.call("Txn", t, p.tok[u])
                ans.append(a[0] if a[0] == "ok" else a)
            n += 1
            inverted += key >= end
            denied += ans[0] != "ok"
            if ans[0] != ans[1]:
                differ += 1
                if differ <= 5:
                    check(False, "seed %d: %s [%r, %r): etcd %r, kvd %r; perms %r" %
                          (seed, meth, key, end, ans[0], ans[1], [(ro, x.permType, x.key, x.range_end) for ro, x in perms]))
    check(differ == 0, "%d of %d checks differ" % (differ, n))
    check(inverted > 300 and 0 < denied < n, "the sample holds inverted ranges (%d) and denials (%d of %d)" %
          (inverted, denied, n))
    print("    %d permission checks (%d inverted ranges, %d denied): all as etcd 3.4" % (n, inverted, denied))
    pe.close()
    pk.close()
    e.stop()
    k.stop()


@test
def logins_are_fair_under_a_flood():
    """64 wrong-password Authenticate(root) calls kept in flight used to fill
    the 32-job bcrypt queue, and 0 of 40 honest logins got through ("too
    many requests").  Hashes are now made in turns by address (then by
    connection), and a full queue makes room for a newcomer holding fewer:
    every honest login succeeds, from another address and from another
    connection of the attacker's own address."""
    k = Kvd(binary=SAN, args=["--bcrypt-cost", "8"], hosts=["127.0.0.2"])
    p = Peer(k.endpoint())
    setup_alice(p)
    for where in ("127.0.0.2", "127.0.0.1"):
        stop, outcome = threading.Event(), {"busy": 0, "failed": 0}
        atk = Peer("%s:%d" % (where, k.port))
        atk.c.ch.close()  # a connection of its own (grpcio would share one with p's channel)
        atk.c.ch = kvdtest_grpc().insecure_channel("%s:%d" % (where, k.port), options=[("grpc.use_local_subchannel_pool", 1)])
        f = atk.c.ch.unary_unary("/etcdserverpb.Auth/Authenticate", request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=R.AuthenticateResponse.FromString)
        pending = set()
        lock = threading.Lock()

        def fire():
            fu = f.future(R.AuthenticateRequest(name="root", password="wrong"), timeout=120)
            with lock:
                pending.add(fu)

            def done(x):
                with lock:
                    pending.discard(x)
                    try:
                        x.result()
                    except kvdtest_grpc().RpcError as e:
                        outcome["busy" if "too many" in e.details() else "failed"] += 1
                if not stop.is_set():
                    fire()
            fu.add_done_callback(done)
        for _ in range(64):
            fire()
        check(wait_for(lambda: outcome["failed"] + outcome["busy"] >= 64, 120), "the flood runs (%r)" % outcome)
        ok = 0
        for i in range(40):
            a = p.call("Authenticate", R.AuthenticateRequest(name="alice", password="apw"))
            ok += a[0] == "ok"
        stop.set()
        check(wait_for(lambda: not pending, 120), "the flood's calls end")
        check(ok == 40, "flood from %s: %d of 40 honest logins succeeded" % (where, ok))
        print("    64 wrong logins in flight from %s: %d/40 honest logins; the flood: %d hashed, %d turned away" %
              (where, ok, outcome["failed"], outcome["busy"]))
        atk.close()
    p.close()
    check(k.stop() == 0, "kvd stopped cleanly")


def kvdtest_grpc():
    import grpc
    return grpc


@test
def one_user_cannot_take_every_watcher():
    """--max-watchers was one pool: an ordinary user's stream took all of it
    and even root's Watch was refused until it left.  With auth on, watchers
    are shared by user: the user holding the most gives up its newest to
    one holding fewer."""
    k = Kvd(binary=SAN, args=COST + ["--max-watchers", "500"])
    p = Peer(k.endpoint())
    setup_alice(p)
    hog = kvdtest.WatchStream(k.endpoint(), metadata=[("token", p.tok["alice"])])
    for i in range(600):
        hog.create(key=b"/app/%d" % i)
    check(hog.wait(600), "alice's 600 creates answered")
    made = sum(1 for r in hog.got if r.created and not r.canceled)
    check(made == 500, "alice alone takes the whole pool: %d created" % made)
    rw = kvdtest.WatchStream(k.endpoint(), metadata=[("token", p.tok["root"])])
    for i in range(10):
        rw.create(key=b"/root/%d" % i)
    check(rw.wait(10), "root's creates answered")
    check(all(r.created and not r.canceled for r in rw.got[:10]), "root's 10 watches are created: %r" %
          [(r.created, r.canceled, r.cancel_reason) for r in rw.got[:10] if r.canceled][:2])
    check(wait_for(lambda: sum(1 for r in hog.got if r.canceled and not r.created) >= 10, 30),
          "alice's newest 10 were cancelled for them")
    hog.close()
    rw.close()
    p.close()
    check(k.stop() == 0, "kvd stopped cleanly")


@test
def tokens_are_random_and_expire():
    """Simple tokens: random, alive while used, dead after their TTL; a dead
    one fails "invalid auth token" and, auth off, none is looked at [§17.1];
    a user's go when it is deleted or its password changes, every one when
    auth is disabled [§17.2] [§21.4]."""
    k = Kvd(args=COST + ["--auth-token-ttl", "3"])
    p = Peer(k.endpoint())
    setup_alice(p)
    toks = set()
    for _ in range(300):
        a = p.call("Authenticate", R.AuthenticateRequest(name="alice", password="apw"))
        check(a[0] == "ok" and TOKEN.match(a[1].token), "etcd's shape: %s" % (a,))
        toks.add(a[1].token.split(".")[0])
    check(len(toks) == 300, "300 tokens, all different")
    check(len(set("".join(toks))) == 52, "all 52 letters used")
    # used every 0.2 s it stays alive past its TTL; left alone it dies after it
    t, t2 = p.tok["alice"], p.call("Authenticate", R.AuthenticateRequest(name="alice", password="apw"))[1].token
    t0 = time.time()
    used = []
    while time.time() < t0 + 5:
        used.append(p.call("Range", R.RangeRequest(key=b"k1"), t)[0])
        wait_for(lambda: time.time() > t0 + 0.2 * len(used), 5, 0.05)
    check(all(u == "ok" for u in used), "a token in use stays alive: %s" % used[-3:])
    check(p.call("Range", R.RangeRequest(key=b"k1"), t2) == ("err", "UNAUTHENTICATED", "etcdserver: invalid auth token"),
          "an unused token expired after --auth-token-ttl")
    # a changed password, a deleted user, auth off: their tokens end at once
    rt = root_token(p)
    t3 = p.call("Authenticate", R.AuthenticateRequest(name="alice", password="apw"))[1].token
    p.call("UserChangePassword", R.AuthUserChangePasswordRequest(name="alice", password="new"), rt)
    check(p.call("Range", R.RangeRequest(key=b"k1"), t3) == ("err", "UNAUTHENTICATED", "etcdserver: invalid auth token"),
          "a password change ends the user's tokens")
    check(p.call("Range", R.RangeRequest(key=b"k1"), rt)[0] == "ok", "root's token lives on")
    t4 = p.call("Authenticate", R.AuthenticateRequest(name="alice", password="new"))[1].token
    p.call("UserDelete", R.AuthUserDeleteRequest(name="alice"), rt)
    check(p.call("Range", R.RangeRequest(key=b"k1"), t4) == ("err", "UNAUTHENTICATED", "etcdserver: invalid auth token"),
          "deleting the user ends its tokens")
    p.call("AuthDisable", R.AuthDisableRequest(), rt)
    check(p.call("Range", R.RangeRequest(key=b"k1"), rt)[0] == "ok",
          "auth off, a token is not looked at (etcd 3.7; 3.4 still refused a dead one)")
    check(p.call("Range", R.RangeRequest(key=b"k1"))[0] == "ok", "no token: fine with auth off")
    check(p.call("AuthEnable", R.AuthEnableRequest())[0] == "ok", "auth on again")
    check(p.call("Range", R.RangeRequest(key=b"k1"), rt) == ("err", "UNAUTHENTICATED", "etcdserver: invalid auth token"),
          "auth off ended every token")
    p.close()
    k.stop()


def jwt_keys():
    d = tempfile.mkdtemp(prefix="kvd-jwt-")
    for args in (["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "rsa.key"],
                 ["pkey", "-in", "rsa.key", "-pubout", "-out", "rsa.pub"],
                 ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ec.key"],
                 ["pkey", "-in", "ec.key", "-pubout", "-out", "ec.pub"],
                 ["rand", "-out", "hmac.key", "32"]):
        subprocess.run(["openssl"] + args, cwd=d, check=True, capture_output=True)
    return d


def jwt_claims(tok):
    import base64
    import json
    parts = tok.split(".")
    pad = lambda s: s + "=" * (-len(s) % 4)
    return json.loads(base64.urlsafe_b64decode(pad(parts[0]))), json.loads(base64.urlsafe_b64decode(pad(parts[1])))


@test
def jwt_tokens_as_etcd_makes_them():
    """JWTs as etcd 3.7.3 makes them, for each kind of key: the same header
    and claims, each server taking the other's; a damaged signature refused;
    after an auth change an older token is "revision of auth store is old"
    on key ops, a fresh one works [§17.2]."""
    d = jwt_keys()
    for method, pub, priv in (("RS256", "rsa.pub", "rsa.key"), ("PS384", "rsa.pub", "rsa.key"),
                              ("ES256", "ec.pub", "ec.key"), ("HS256", "hmac.key", "hmac.key")):
        spec = "jwt,pub-key=%s/%s,priv-key=%s/%s,sign-method=%s,ttl=10m" % (d, pub, d, priv, method)
        e = Etcd(COST + ["--auth-token", spec])
        k = Kvd(binary=SAN, args=COST + ["--auth-token", spec])
        pe, pk = Peer(e.endpoint()), Peer(k.endpoint())
        setup_alice(pe)
        setup_alice(pk)
        te, tk = pe.tok["alice"], pk.tok["alice"]
        he, ce = jwt_claims(te)
        hk, ck = jwt_claims(tk)
        check(he == hk == {"alg": method, "typ": "JWT"}, "%s: the same header: %s %s" % (method, he, hk))
        check(sorted(ce) == sorted(ck) == ["exp", "revision", "username"] and ck["username"] == "alice" and
              ce["revision"] == ck["revision"], "%s: the same claims: %s %s" % (method, ce, ck))
        check(abs(ck["exp"] - time.time() - 600) < 60, "%s: exp in ttl: %s" % (method, ck["exp"]))
        # one key, one format: each server takes the other's tokens
        for p, t, who in ((pk, te, "etcd's token on kvd"), (pe, tk, "kvd's token on etcd")):
            a = p.call("Range", R.RangeRequest(key=b"k1"), t)
            check(a[0] == "ok", "%s %s: %s" % (method, who, a))
            a = p.call("Put", R.PutRequest(key=b"/elsewhere", value=b"1"), t)
            check(a == ("err", "PERMISSION_DENIED", "etcdserver: permission denied"), "%s %s denied: %s" %
                  (method, who, a))
        bad = tk[:-4] + ("AAAA" if not tk.endswith("AAAA") else "BBBB")
        for p in (pe, pk):
            check(p.call("Range", R.RangeRequest(key=b"k1"), bad) == ("err", "UNAUTHENTICATED",
                                                                       "etcdserver: invalid auth token"),
                  "%s: a damaged signature is refused" % method)
        # an auth change makes older tokens old, on reads (writes: etcd retries until the deadline)
        for p in (pe, pk):
            p.call("RoleAdd", R.AuthRoleAddRequest(name="another"), p.tok["root"])
        a = [p.call("Range", R.RangeRequest(key=b"k1"), t) for p, t in ((pe, te), (pk, tk))]
        check(a[0] == a[1] == ("err", "INVALID_ARGUMENT", "etcdserver: revision of auth store is old"),
              "%s: a token from before an auth change: %s" % (method, a))
        fresh = pk.call("Authenticate", R.AuthenticateRequest(name="alice", password="apw"))[1].token
        check(pk.call("Range", R.RangeRequest(key=b"k1"), fresh)[0] == "ok", "%s: a fresh one works" % method)
        pe.close()
        pk.close()
        e.stop()
        k.stop()
    # verify only: no private key
    spec = "jwt,pub-key=%s/rsa.pub,sign-method=RS256" % d
    k = Kvd(args=COST + ["--auth-token", spec])
    p = Peer(k.endpoint())
    for m, req in (("UserAdd", R.AuthUserAddRequest(name="root", password="rootpw")),
                   ("UserGrantRole", R.AuthUserGrantRoleRequest(user="root", role="root")),
                   ("AuthEnable", R.AuthEnableRequest())):
        p.call(m, req)
    a = p.call("Authenticate", R.AuthenticateRequest(name="root", password="rootpw"))
    check(a[0] == "err" and "verify-only" in a[2], "verify-only: no token issued: %s" % (a,))
    p.close()
    k.stop()
    # expiry
    spec = "jwt,pub-key=%s/ec.pub,priv-key=%s/ec.key,sign-method=ES256,ttl=1s" % (d, d)
    k = Kvd(args=COST + ["--auth-token", spec])
    p = Peer(k.endpoint())
    setup_alice(p)
    t0 = time.time()
    t = p.tok["alice"]
    exp = jwt_claims(t)[1]["exp"]
    wait_for(lambda: time.time() > exp + 1.5, 10, 0.1)
    check(p.call("Range", R.RangeRequest(key=b"k1"), t) == ("err", "UNAUTHENTICATED", "etcdserver: invalid auth token"),
          "an expired token is refused")
    p.close()
    k.stop()
    subprocess.run(["rm", "-rf", d])


@test
def jwt_claims_as_etcd_reads_them():
    """Hand-signed HS256 tokens with odd claims, beside etcd 3.7.3: an nbf in
    the future and an exp past what Go's time can hold (1e300) are refused;
    a claim given twice is the last one (Go fills a map), so both servers
    read one signed token as the same user; exp 0 means none; an iat in the
    future is not looked at; a username holding a NUL is nobody."""
    import base64
    import hashlib
    import hmac
    d = jwt_keys()
    key = open(d + "/hmac.key", "rb").read()
    spec = "jwt,pub-key=%s/hmac.key,priv-key=%s/hmac.key,sign-method=HS256,ttl=10m" % (d, d)
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    now = int(time.time())

    def sign(claims):
        head = b64(b'{"alg":"HS256","typ":"JWT"}') + "." + b64(claims.encode())
        return head + "." + b64(hmac.new(key, head.encode(), hashlib.sha256).digest())
    out = {}
    for name, srv in (("etcd", Etcd(COST + ["--auth-token", spec])),
                      ("kvd", Kvd(binary=SAN, args=COST + ["--auth-token", spec]))):
        p = Peer(srv.endpoint())
        setup_alice(p)
        rev = jwt_claims(p.tok["alice"])[1]["revision"]
        cases = [
            '{"username":"alice","revision":%d,"exp":%d}' % (rev, now + 600),
            '{"username":"alice","revision":%d,"exp":%d,"nbf":%d}' % (rev, now + 600, now + 300),
            '{"username":"alice","revision":%d,"exp":%d,"nbf":%d}' % (rev, now + 600, now - 300),
            '{"username":"alice","revision":%d,"exp":1e300}' % rev,
            '{"username":"alice","revision":%d,"exp":1e19}' % rev,
            '{"username":"alice","revision":%d,"exp":-5}' % rev,
            '{"username":"alice","revision":%d,"exp":0}' % rev,
            '{"username":"alice","revision":%d,"exp":"%d"}' % (rev, now + 600),
            '{"username":"alice","revision":%d,"exp":null}' % rev,
            '{"username":"alice","revision":%d,"exp":%d,"iat":%d}' % (rev, now + 600, now + 9999),
            '{"username":"alice","username":"root","revision":%d,"exp":%d}' % (rev, now + 600),
            '{"username":"root","username":"alice","revision":%d,"exp":%d}' % (rev, now + 600),
            '{"username":"alice","revision":%d,"exp":%d,"exp":%d}' % (rev, now + 600, now - 600),
            '{"username":"root\\u0000","revision":%d,"exp":%d}' % (rev, now + 600),
        ]
        got = out[name] = []
        for c in cases:
            t = sign(c)
            got.append((p.call("Range", R.RangeRequest(key=b"k1"), t)[:3],
                        p.call("Put", R.PutRequest(key=b"/elsewhere", value=b"1"), t)[:3]))
        p.close()
        srv.stop()
    strip = lambda a: [tuple(x if x[0] == "err" else ("ok",) for x in pair) for pair in a]
    e, k = strip(out["etcd"]), strip(out["kvd"])
    for i, (x, y) in enumerate(zip(e, k)):
        check(x == y, "claims case %d as etcd 3.7.3 reads it: etcd %s, kvd %s" % (i, x, y))
    check(e[1][0][:2] == ("err", "UNAUTHENTICATED") and e[3][0][:2] == ("err", "UNAUTHENTICATED"),
          "etcd refuses a future nbf and exp 1e300: %s" % ((e[1], e[3]),))
    check(e[10][1] == ("ok",) and e[11][1][:2] == ("err", "PERMISSION_DENIED"), "the last username wins: %s" % ((e[10], e[11]),))
    subprocess.run(["rm", "-rf", d])


@test
def jwt_left_out():
    """Built with KVD_NO_JWT (make JWT=0; make lean, KVD_NOJWT=1): kvd refuses
    to start with --auth-token jwt,... and says why; simple tokens serve.  In
    the full build the same flags start it and its tokens are JWTs: the
    control that shows these checks can fail."""
    gone = os.environ.get("KVD_NOJWT") == "1"
    binary = SAN or os.environ.get("KVD", os.path.join(ROOT, "kvd"))
    d = jwt_keys()
    spec = "jwt,pub-key=%s/hmac.key,priv-key=%s/hmac.key,sign-method=HS256" % (d, d)
    ver = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    check(("jwt=no" in ver) == gone, "--version: %r" % ver)
    if gone:
        dd = tempfile.mkdtemp(prefix="kvd-nojwt-")
        r = subprocess.run([binary, "--data-dir", dd + "/data", "--listen-client-urls", "http://127.0.0.1:%d" % free_port(),
                            "--auth-token", spec], capture_output=True, text=True, timeout=60)
        subprocess.run(["rm", "-rf", dd])
        print("  left out: exit %d, %s" % (r.returncode, r.stderr.strip().splitlines()[-1:]))
        check(r.returncode != 0 and "built without JWT tokens (KVD_NO_JWT)" in r.stderr, "refused: %r" % (r.stderr,))
        k = Kvd(binary=SAN, args=COST)
    else:
        k = Kvd(binary=SAN, args=COST + ["--auth-token", spec])
    p = Peer(k.endpoint())
    setup_alice(p)
    tok = p.tok["alice"]
    a = p.call("Range", R.RangeRequest(key=b"k1"), tok)
    print("  %s: alice's token %r, Range %s" % ("left out" if gone else "built in", tok[:24], a[0]))
    check(a[0] == "ok", "a token works: %r" % (a,))
    check(bool(TOKEN.match(tok)) == gone and (tok.count(".") == 2) != gone, "simple or JWT token: %r" % tok)
    p.close()
    k.stop()
    subprocess.run(["rm", "-rf", d])


@test
def auth_left_out():
    """Built with KVD_NO_AUTH (make AUTH=0; make lean, KVD_NOAUTH=1): the Auth
    service is unknown (UNIMPLEMENTED, as grpc-go says of a service it does
    not serve), and so are the gateway's /v3/auth/ paths (404); keys serve as
    with auth off, a token sent is not looked at; --auth-token jwt,... is
    refused at start; a store that holds a user (made by the full build) is
    refused, saying why, its log left as it was, and so is a snapshot that
    holds one, while a store and a snapshot without auth serve.  In the full
    build the same steps succeed: the control that shows these checks can
    fail."""
    import http.client
    gone = os.environ.get("KVD_NOAUTH") == "1"
    binary = os.environ.get("KVD", os.path.join(ROOT, "kvd"))
    full = os.path.join(ROOT, "kvd")  # makes the stores and the snapshot that hold auth
    why = "built without auth (KVD_NO_AUTH)"
    ver = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    check(("auth=no" in ver) == gone, "--version: %r" % ver)
    tmp = tempfile.mkdtemp(prefix="kvd-noauth-")
    # the service, the keys, a token nobody gave
    k = Kvd(binary=binary, args=COST)
    p = Peer(k.endpoint())
    add = p.call("UserAdd", R.AuthUserAddRequest(name="root", password="pw"))
    put = p.call("Put", R.PutRequest(key=b"k", value=b"v"), token="madeupmadeupmade.1")
    got = p.call("Range", R.RangeRequest(key=b"k"), token="madeupmadeupmade.1")
    print("  %s: UserAdd %r; Put and Range with a made-up token: %s %s" % (
        "left out" if gone else "built in", add[:3] if add[0] == "err" else add[:1], put[0], got[0]))
    check(put[0] == "ok" and got[0] == "ok" and got[1].kvs[0].value == b"v", "keys serve: %r %r" % (put, got))
    if gone:
        check(add == ("err", "UNIMPLEMENTED", "unknown service etcdserverpb.Auth"), "UserAdd: %r" % (add,))
    else:
        check(add[0] == "ok", "UserAdd: %r" % (add,))
    if "http=no" not in ver:
        h = http.client.HTTPConnection("127.0.0.1", k.port, timeout=30)
        h.request("POST", "/v3/auth/status", body=b"{}", headers={"Content-Type": "application/json"})
        r = h.getresponse()
        body = r.read()
        h.close()
        check(r.status == (404 if gone else 200), "POST /v3/auth/status: %d %r" % (r.status, body[:200]))
    p.close()
    k.stop()
    # --auth-token jwt,...
    keys = jwt_keys()
    spec = "jwt,pub-key=%s/hmac.key,priv-key=%s/hmac.key,sign-method=HS256" % (keys, keys)
    if gone:
        r = subprocess.run([binary, "--data-dir", tmp + "/jwt", "--listen-client-urls",
                            "http://127.0.0.1:%d" % free_port(), "--auth-token", spec],
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and "--auth-token jwt," in r.stderr and why in r.stderr and
              not os.path.exists(tmp + "/jwt"), "--auth-token jwt refused: %d %r" % (r.returncode, r.stderr))
    else:
        k = Kvd(binary=binary, args=COST + ["--auth-token", spec])
        k.stop()
    subprocess.run(["rm", "-rf", keys])
    # a store with a user in it (the full build's), and one without
    for with_user in (True, False):
        d = os.path.join(tmp, "user" if with_user else "plain")
        k = Kvd(binary=full, args=COST, data_dir=d)
        p = Peer(k.endpoint())
        check(p.call("Put", R.PutRequest(key=b"x", value=b"1"))[0] == "ok", "a key")
        if with_user:
            check(p.call("UserAdd", R.AuthUserAddRequest(name="u", password="pw"))[0] == "ok", "a user")
        p.close()
        k.stop()
        before = open(os.path.join(d, "kvd.log"), "rb").read()
        if gone and with_user:
            r = subprocess.run([binary, "--data-dir", d, "--listen-client-urls", "http://127.0.0.1:%d" % free_port()],
                               capture_output=True, text=True, timeout=60)
            print("  a store with a user: exit %d, %s" % (r.returncode, r.stderr.strip().splitlines()[-1:]))
            check(r.returncode == 2 and why in r.stderr, "refused: %d %r" % (r.returncode, r.stderr[-300:]))
            check(open(os.path.join(d, "kvd.log"), "rb").read() == before, "the log as it was")
        else:
            k = Kvd(binary=binary, args=COST, data_dir=d)
            p = Peer(k.endpoint())
            a = p.call("Range", R.RangeRequest(key=b"x"))
            check(a[0] == "ok" and a[1].kvs[0].value == b"1", "served: %r" % (a,))
            if with_user:
                check(p.call("UserGet", R.AuthUserGetRequest(name="u"))[0] == "ok", "the user kept")
            p.close()
            k.stop()
    # snapshots (etcdctl snapshot save from the full build), with a user and without
    if "snapshot=no" not in ver:
        for with_user in (True, False):
            k = Kvd(binary=full, args=COST)
            p = Peer(k.endpoint())
            check(p.call("Put", R.PutRequest(key=b"y", value=b"2"))[0] == "ok", "a key")
            if with_user:
                check(p.call("UserAdd", R.AuthUserAddRequest(name="u", password="pw"))[0] == "ok", "a user")
            path = os.path.join(tmp, "%s.db" % with_user)
            rc, err = snapshot.snapshot_save(k.endpoint(), path)
            check(rc == 0, "etcdctl snapshot save: %r" % err[-300:])
            p.close()
            k.stop()
            rc, log = snapshot.refused(os.path.join(tmp, "restored-%s" % with_user), path)
            if gone and with_user:
                check(rc is not None and rc != 0 and why in log, "--restore-snapshot refused: %r %r" % (rc, log[-400:]))
            else:
                check(rc is None, "--restore-snapshot served: %r" % log[-400:])
    subprocess.run(["rm", "-rf", tmp])


@test
def a_watcher_keeps_its_stream_after_a_revoke():
    """As etcd 3.4: permission is checked when a watch is created; a revoke
    later does not cancel it (its events keep coming) [§25.5]."""
    e = Etcd(COST)
    k = Kvd(args=COST)
    got = {}
    for name, srv in (("etcd", e), ("kvd", k)):
        p = Peer(srv.endpoint())
        setup_alice(p)
        f = p.c.ch.stream_stream("/etcdserverpb.Watch/Watch", request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=R.WatchResponse.FromString)
        done = threading.Event()

        def reqs():
            yield R.WatchRequest(create_request=R.WatchCreateRequest(key=b"/app/", range_end=b"/app0"))
            done.wait(30)
        it = f(reqs(), timeout=30, metadata=[("token", p.tok["alice"])])
        first = next(it)
        rt = p.tok["root"]
        p.call("UserRevokeRole", R.AuthUserRevokeRoleRequest(name="alice", role="r1"), rt)
        p.call("Put", R.PutRequest(key=b"/app/after", value=b"1"), rt)
        ev = next(it)
        got[name] = (first.created, first.canceled, [(x.kv.key, x.kv.value) for x in ev.events], ev.canceled)
        a = p.call("Range", R.RangeRequest(key=b"/app/after"), p.tok["alice"])
        got[name] += (a,)
        done.set()
        it.cancel()
        p.close()
    check(got["etcd"] == got["kvd"], "the same: %s" % got)
    check(got["kvd"][2] == [(b"/app/after", b"1")], "the event came after the revoke: %s" % (got["kvd"],))
    e.stop()
    k.stop()


@test
def hostile_tokens_are_refused():
    """Random and damaged tokens against the JWT verifier (the sanitizer build
    when the test runner gives one): each refused, nothing else happens."""
    import base64
    import json
    d = jwt_keys()
    spec = "jwt,pub-key=%s/ec.pub,priv-key=%s/ec.key,sign-method=ES256" % (d, d)
    k = Kvd(binary=SAN, args=COST + ["--auth-token", spec])
    p = Peer(k.endpoint())
    setup_alice(p)
    good = p.tok["alice"]
    h, c, s = good.split(".")
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    r = random.Random(7)
    bad = ["", ".", "..", "...", good + ".", "." + good, h + "." + c, good[:-1], good + "A", h + ".." + s,
           b64(b'{"alg":"none","typ":"JWT"}') + "." + c + ".",
           b64(b'{"alg":"HS256","typ":"JWT"}') + "." + c + "." + s,
           h + "." + b64(json.dumps({"username": "root", "revision": 99, "exp": 2 ** 40}).encode()) + "." + s,
           "A" * 5000, h + "." + "A" * 4000 + "." + s, "a" * 16 + ".1"]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/\\"
    for _ in range(300):
        t = list(good)
        while "".join(t) == good:  # a character replaced by itself is no damage
            for _ in range(r.randint(1, 6)):
                t[r.randrange(len(t))] = r.choice(alphabet)
        bad.append("".join(t))
        bad.append("".join(r.choice(alphabet) for _ in range(r.randint(1, 300))))
    refused = 0
    for t in bad:
        a = p.call("Range", R.RangeRequest(key=b"k1"), t or None)
        refused += a in (("err", "UNAUTHENTICATED", "etcdserver: invalid auth token"),
                         ("err", "INVALID_ARGUMENT", "etcdserver: user name is empty"))
    check(refused == len(bad), "every damaged token refused: %d of %d" % (refused, len(bad)))
    for t in (" " + good, good + " "):  # a field value may not begin or end with a space (RFC 9113 8.2.1)
        a = p.call("Range", R.RangeRequest(key=b"k1"), t)
        check(a[0] == "err" and a[1] == "INTERNAL", "%r: the stream is reset: %s" % (t[:8], a))
    check(p.call("Range", R.RangeRequest(key=b"k1"), good)[0] == "ok", "the good one still works")
    p.close()
    check(k.stop() == 0, "kvd stopped cleanly (no sanitizer report)")
    subprocess.run(["rm", "-rf", d])


def gw_post(port, path, body, token=None):
    """One gateway POST (JSON text in, (status, JSON object) out)."""
    import http.client
    import json
    h = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    hdr = {"Content-Type": "application/json"}
    if token:
        hdr["Authorization"] = token
    h.request("POST", path, body=body, headers=hdr)
    r = h.getresponse()
    d = r.read()
    h.close()
    try:
        return r.status, json.loads(d)
    except ValueError:
        return r.status, d


@test
def names_are_whole_with_a_nul():
    """proto3 strings may hold U+0000: a name is taken with its wire length,
    as etcd 3.7.3 takes it ("root\0x" is nobody, "root\0" is no role), by
    gRPC and through the gateway's \u0000 alike.  Creating a user or role
    whose name holds a NUL is kvd's one deliberate difference: etcd stores
    it, kvd refuses it (README: security notes). [§5.5]"""
    srv = {"etcd": Etcd(args=COST), "kvd": Kvd(binary=SAN, args=COST)}
    got = {}
    for name, s in srv.items():
        p = Peer(s.endpoint())
        setup_alice(p)
        root = p.tok["root"]
        a = got[name] = []
        a.append(p.call("Authenticate", R.AuthenticateRequest(name="root\0x", password="rootpw")))
        a.append(p.call("Authenticate", R.AuthenticateRequest(name="root\0", password="rootpw")))
        a.append(p.call("UserGrantRole", R.AuthUserGrantRoleRequest(user="alice", role="root\0"), root))
        a.append(p.call("UserGrantRole", R.AuthUserGrantRoleRequest(user="alice\0", role="r1"), root))
        a.append(p.call("UserGet", R.AuthUserGetRequest(name="alice\0x"), root))
        a.append(p.call("UserGet", R.AuthUserGetRequest(name="alice\0"), p.tok["alice"]))  # not oneself
        a.append(p.call("RoleGet", R.AuthRoleGetRequest(role="r1\0root"), root))
        a.append(p.call("RoleGet", R.AuthRoleGetRequest(role="root\0"), root))
        a.append(p.call("UserDelete", R.AuthUserDeleteRequest(name="alice\0"), root))
        a.append(p.call("UserDelete", R.AuthUserDeleteRequest(name="root\0"), root))
        a.append(p.call("UserChangePassword", R.AuthUserChangePasswordRequest(name="alice\0", password="x"), root))
        a.append(p.call("UserRevokeRole", R.AuthUserRevokeRoleRequest(name="alice", role="r1\0"), root))
        a.append(p.call("UserRevokeRole", R.AuthUserRevokeRoleRequest(name="root\0", role="root"), root))
        a.append(p.call("RoleDelete", R.AuthRoleDeleteRequest(role="r1\0"), root))
        a.append(p.call("RoleGrantPermission", R.AuthRoleGrantPermissionRequest(
            name="r1\0", perm=AUTHPB.Permission(permType=0, key=b"k")), root))
        a.append(p.call("RoleRevokePermission", R.AuthRoleRevokePermissionRequest(role="r1\0", key=b"k1"), root))
        # a password is every byte of it: "pw" is not "pw\0z"
        a.append(p.call("UserAdd", R.AuthUserAddRequest(name="nulpw", password="pw\0z"), root)[0])
        a.append(p.call("Authenticate", R.AuthenticateRequest(name="nulpw", password="pw"))[:2])
        a.append(p.call("Authenticate", R.AuthenticateRequest(name="nulpw", password="pw\0z"))[0])
        a.append(p.call("UserChangePassword", R.AuthUserChangePasswordRequest(name="nulpw", password="q\0"), root)[0])
        a.append(p.call("Authenticate", R.AuthenticateRequest(name="nulpw", password="q"))[:2])
        a.append(p.call("Authenticate", R.AuthenticateRequest(name="nulpw", password="q\0"))[0])
        # the gateway: \u0000 in JSON
        st, js = gw_post(s.port, "/v3/auth/authenticate", '{"name":"root\\u0000x","password":"rootpw"}')
        a.append((st, js.get("code") if isinstance(js, dict) else js, "token" in js if isinstance(js, dict) else None))
        # other strings: the health service's name, peer URLs
        a.append(p.call_raw("/grpc.health.v1.Health/Check", pb()["health"].HealthCheckRequest(service="\0x")))
        a.append(p.call_raw("/etcdserverpb.Cluster/MemberAdd", R.MemberAddRequest(peerURLs=["http://127.0.0.1:2\0"]), root))
        a.append(p.call_raw("/etcdserverpb.Maintenance/Downgrade", R.DowngradeRequest(action=0, version="3.6\0"), root))
        a.append(p.call("Status", R.StatusRequest(), root)[0])
        # kvd's deliberate difference: etcd stores these names, kvd refuses them
        got[name + "-add"] = (p.call("UserAdd", R.AuthUserAddRequest(name="eve\0root", password="e"), root),
                              p.call("RoleAdd", R.AuthRoleAddRequest(name="r\0root"), root),
                              p.call("UserGet", R.AuthUserGetRequest(name="eve"), root)[:2])
        p.close()
    for i, (x, y) in enumerate(zip(got["etcd"], got["kvd"])):
        check(x == y, "answer %d as etcd 3.7.3's: etcd %s, kvd %s" % (i, x, y))
    check(got["etcd"][0] == ("err", "INVALID_ARGUMENT", "etcdserver: authentication failed, invalid user ID or password"),
          "etcd: root\\0x is nobody: %s" % (got["etcd"][0],))
    check(got["etcd"][2][:2] == ("err", "FAILED_PRECONDITION"), "etcd: root\\0 is no role: %s" % (got["etcd"][2],))
    eadd, kadd = got["etcd-add"], got["kvd-add"]
    check(eadd[0][0] == "ok" and eadd[1][0] == "ok", "etcd 3.7.3 stores names with a NUL: %s" % (eadd,))
    nul = ("err", "INVALID_ARGUMENT", "kvd: a user or role name holding a NUL byte is not supported")
    check(kadd[0] == nul and kadd[1] == nul, "kvd refuses them, saying why: %s" % (kadd,))
    check(kadd[2] == ("err", "FAILED_PRECONDITION"), "and stored no \"eve\": %s" % (kadd[2],))
    for s in srv.values():
        s.stop()


@test
def bad_settings_are_refused():
    for args, want in ((["--auth-token", "jwt,pub-key=/nonexistent,sign-method=RS256"], "pub-key /nonexistent: No such file"),
                       (["--auth-token", "jwt,pub-key=/x"], "sign-method (missing)"),
                       (["--auth-token", "jwt,sign-method=RS256"], "needs priv-key"),
                       (["--auth-token", "jwt,sign-method=XS256,pub-key=/x"], "want RS256"),
                       (["--auth-token", "jwt,sign-method=RS256,pub-key=/x,colour=blue"], "unknown option colour"),
                       (["--auth-token", "magic"], "unknown token type"),
                       (["--bcrypt-cost", "3"], "want an integer 4..4294967295"),
                       (["--bcrypt-cost", "32"], "want 4..31")):
        d = tempfile.mkdtemp(prefix="kvd-auth-")
        r = subprocess.run([os.environ.get("KVD", os.path.join(ROOT, "kvd")), "--data-dir", d + "/x"] + args,
                           capture_output=True, text=True, timeout=30)
        check(r.returncode == 2 and want in r.stderr and not os.path.exists(d + "/x"),
              "%s refused before the data dir: %d %s" % (args, r.returncode, r.stderr.strip()[-200:]))



# ------------------------------------------------------------------ etcd 3.7's authorization matrix
EMPTY = ("err", "INVALID_ARGUMENT", "etcdserver: user name is empty")
BADTOK = ("err", "UNAUTHENTICATED", "etcdserver: invalid auth token")
DENIED = ("err", "PERMISSION_DENIED", "etcdserver: permission denied")
BADMGMT = ("err", "INVALID_ARGUMENT", "etcdserver: invalid auth management")
NOPERM = ("err", "INVALID_ARGUMENT", "etcdserver: permission not given")
NOROLE = ("err", "FAILED_PRECONDITION", "etcdserver: role name not found")
CALLERS = ["none", "invalid", "alice", "bob", "root"]
BEARER = {"alice:Bearer": "alice", "root:Bearer": "root", "invalid:Bearer": "invalid"}  # -> the plain caller


def rule(kind, watch=False, **over):
    """What each caller gets under a 3.7 rule of the delta notes (section 3):
    'user' (any valid token), 'root', 'none' (AuthStatus); key permissions
    as overrides (alice= / bob= / root=).  For Watch an error is the
    created+canceled reply's cancel_reason."""
    d = {"user": dict(none=EMPTY, invalid=BADTOK, alice="ok", bob="ok", root="ok"),
         "root": dict(none=EMPTY, invalid=BADTOK, alice=DENIED, bob=DENIED, root="ok"),
         "none": dict(none="ok", invalid=BADTOK, alice="ok", bob="ok", root="ok")}[kind]
    d.update(over)
    if watch:  # the reason is the gRPC status' text (rpctypes.ErrGRPC*.Error()), code and all
        camel = lambda c: "".join(w.capitalize() for w in c.split("_"))
        d = {k: v if v == "ok" else ("canceled", "rpc error: code = %s desc = %s" % (camel(v[1]), v[2]))
             for k, v in d.items()}
    return d


def caller_md(p, caller):
    """The call's metadata: no token, a made-up one, a user's, or as
    'authorization: Bearer <tok>'."""
    who, _, bearer = caller.partition(":")
    if who == "none":
        return None
    tok = "abcdefghijklmnop.1" if who == "invalid" else p.tok[who]
    return [("authorization", "Bearer " + tok)] if bearer else [("token", tok)]


def m_unary(svc, method, resp, req):
    """A cell calling svc/method; req is a message or req(p, ctx)."""
    def f(p, md, ctx):
        q = req(p, ctx) if callable(req) else req
        call = p.c.ch.unary_unary("/etcdserverpb.%s/%s" % (svc, method),
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=getattr(R, resp).FromString)
        try:
            return ("ok", call(q, timeout=60, metadata=md))
        except p.c.grpc.RpcError as e:
            return ("err", e.code().name, e.details())
    return f


def m_stream(svc, method, resp, req, bidi=True):
    """A cell answering the first message of a stream (Watch, LeaseKeepAlive:
    one request sent; Snapshot), or the status it ended with."""
    def f(p, md, ctx):
        q = req(p, ctx) if callable(req) else req
        mk = p.c.ch.stream_stream if bidi else p.c.ch.unary_stream
        call = mk("/etcdserverpb.%s/%s" % (svc, method), request_serializer=lambda m: m.SerializeToString(),
                  response_deserializer=getattr(R, resp).FromString)
        done = threading.Event()

        def reqs():
            yield q
            done.wait(60)
        it = call(reqs() if bidi else q, timeout=60, metadata=md)
        try:
            return ("ok", next(it))
        except p.c.grpc.RpcError as e:
            return ("err", e.code().name, e.details())
        except StopIteration:
            return ("err", "ended without a message", "")
        finally:
            done.set()
            it.cancel()
    return f


def m_outcome(ans):
    """ok, an error, or a watch's ('canceled', cancel_reason)."""
    if ans[0] != "ok":
        return ans
    if isinstance(ans[1], R.WatchResponse) and ans[1].canceled:
        return ("canceled", ans[1].cancel_reason)
    return "ok"


def m_relabel(p, m):
    """Lease ids (fields ID and lease) as the order the test made them in."""
    for fd, val in m.ListFields():
        if fd.message_type is not None:
            for v in (val if fd.label == fd.LABEL_REPEATED else [val]):
                m_relabel(p, v)
        elif fd.name in ("ID", "lease") and fd.type == fd.TYPE_INT64:
            setattr(m, fd.name, p.names.get(val, -7))


def m_canon(p, ans):
    """Comparable: headers without ids and term, lease ids relabelled, TTLs
    that tick by 1, and what is each server's own (hashes, snapshot bytes,
    member URLs, Status' sizes) left out."""
    if ans[0] != "ok":
        return ans
    m = type(ans[1])()
    m.CopyFrom(ans[1])
    normalize(m)
    if isinstance(m, (R.StatusResponse, R.HashResponse)):
        return ("ok", type(m).__name__, m.header.revision)
    if isinstance(m, R.HashKVResponse):
        return ("ok", "HashKV", m.header.revision, m.compact_revision, m.hash_revision)
    if isinstance(m, R.SnapshotResponse):
        return ("ok", "Snapshot", m.HasField("header"), len(m.blob) > 0, m.version)
    if isinstance(m, R.MemberListResponse):
        return ("ok", "MemberList", len(m.members), m.header.SerializeToString(deterministic=True))
    m_relabel(p, m)
    if isinstance(m, (R.LeaseTimeToLiveResponse, R.LeaseKeepAliveResponse)) and m.TTL > 0:
        m.TTL = 1
    if isinstance(m, R.LeaseTimeToLiveResponse):  # etcd's come in Go's map order
        ks = sorted(m.keys)
        del m.keys[:]
        m.keys.extend(ks)
    if isinstance(m, R.LeaseLeasesResponse):
        ids = sorted(x.ID for x in m.leases)
        del m.leases[:]
        for i in ids:
            m.leases.add(ID=i)
    return ("ok", m.SerializeToString(deterministic=True))


def m_short(o):
    """A cell of the printed table."""
    if o == "ok":
        return "ok"
    abbr = {"etcdserver: user name is empty": "E", "etcdserver: invalid auth token": "I",
            "etcdserver: permission denied": "D", "etcdserver: invalid auth management": "MGMT",
            "etcdserver: permission not given": "NOPERM", "etcdserver: role name not found": "NOROLE"}
    if o[0] == "canceled":
        return "c" + abbr.get(o[1].split(" desc = ")[-1], o[1] or "''")
    return abbr.get(o[2], o[1][:6])


def m_grant(p, key=None):
    """A lease from root, with key attached when given; its label is the next number."""
    lid = p.call("LeaseGrant", R.LeaseGrantRequest(TTL=600), p.tok["root"])[1].ID
    p.names[lid] = len(p.names) + 1
    if key is not None:
        assert p.call("Put", R.PutRequest(key=key, value=b"l", lease=lid), p.tok["root"])[0] == "ok"
    return lid


def m_setup(p):
    """root (role root); alice with role app: readwrite [/app/, /app0), read
    on the single key k1, write only on [w/, w0); bob with no role; role
    other (no user)."""
    A = AUTHPB.Permission
    for m, req in (("UserAdd", R.AuthUserAddRequest(name="root", password="rootpw")),
                   ("UserGrantRole", R.AuthUserGrantRoleRequest(user="root", role="root")),
                   ("UserAdd", R.AuthUserAddRequest(name="alice", password="apw")),
                   ("UserAdd", R.AuthUserAddRequest(name="bob", password="bpw")),
                   ("RoleAdd", R.AuthRoleAddRequest(name="app")),
                   ("RoleAdd", R.AuthRoleAddRequest(name="other")),
                   ("RoleGrantPermission", R.AuthRoleGrantPermissionRequest(name="app", perm=A(
                       permType=A.READWRITE, key=b"/app/", range_end=b"/app0"))),
                   ("RoleGrantPermission", R.AuthRoleGrantPermissionRequest(name="app", perm=A(
                       permType=A.READ, key=b"k1"))),
                   ("RoleGrantPermission", R.AuthRoleGrantPermissionRequest(name="app", perm=A(
                       permType=A.WRITE, key=b"w/", range_end=b"w0"))),
                   ("UserGrantRole", R.AuthUserGrantRoleRequest(user="alice", role="app")),
                   ("AuthEnable", R.AuthEnableRequest())):
        a = p.call(m, req)
        assert a[0] == "ok", (m, a)
    for u, pw in (("root", "rootpw"), ("alice", "apw"), ("bob", "bpw")):
        p.tok[u] = p.call("Authenticate", R.AuthenticateRequest(name=u, password=pw))[1].token
    for k, v in ((b"/app/x", b"1"), (b"k1", b"1"), (b"secret", b"s")):
        assert p.call("Put", R.PutRequest(key=k, value=v), p.tok["root"])[0] == "ok"
    p.names, p.lease = {}, {}
    p.lease["app"] = m_grant(p, b"/app/leased")  # alice may write its key, bob may not


def m_more_leases(p):
    p.lease["secret"] = m_grant(p, b"secret/l")  # neither may read or write its key
    p.lease["k1"] = m_grant(p, b"k1")  # alice may read its key, not write it
    p.lease["empty"] = m_grant(p)  # no keys


def m_realign(pe, pk):
    """Where kvd wrote and etcd refused (or the reverse), the one behind
    gets root puts on /pad until both are at the same revision: one cell's
    difference does not shift every later revision.  Returns the pads."""
    rev = lambda p: p.call("Range", R.RangeRequest(key=b"/pad"), p.tok["root"])[1].header.revision
    pads = 0
    while True:
        a, b = rev(pe), rev(pk)
        if a == b:
            return pads
        pads += 1
        p = pe if a < b else pk
        p.call("Put", R.PutRequest(key=b"/pad", value=b"%d" % pads), p.tok["root"])


def m_txn(*ops, nested=False, compare=None):
    """A TxnRequest with ops (kind, key, extra) in success, or inside a txn in success."""
    def build(p, ctx):
        t = R.TxnRequest()
        if compare:
            t.compare.add(key=compare, target=R.Compare.VERSION, result=R.Compare.GREATER, version=0)
        br = t.success.add().request_txn.success if nested else t.success
        for kind, key, extra in ops:
            key = ctx if key is None else key  # None: the key the row's setup made
            op = br.add()
            if kind == "range":
                op.request_range.key = key
            elif kind == "put":
                op.request_put.key = key
                op.request_put.value = b"t"
                if extra == "prev_kv":
                    op.request_put.prev_kv = True
                elif extra:
                    op.request_put.lease = p.lease[extra]
        return t
    return build


def m_rows():
    """(label, expected by caller, cell, per-cell setup or None); a bare
    function is a step run on both servers between rows."""
    Wc = R.WatchCreateRequest
    KV = lambda m, resp, req: m_unary("KV", m, resp, req)
    LE = lambda m, resp, req: m_unary("Lease", m, resp, req)
    MA = lambda m, resp, req: m_unary("Maintenance", m, resp, req)
    AU = lambda m, resp, req: m_unary("Auth", m, resp, req)
    watch = lambda creq: m_stream("Watch", "Watch", "WatchResponse", R.WatchRequest(create_request=creq))
    keepalive = lambda name: m_stream("Lease", "LeaseKeepAlive", "LeaseKeepAliveResponse",
                                      lambda p, ctx: R.LeaseKeepAliveRequest(ID=p.lease[name]))
    ttl = lambda name, keys: LE("LeaseTimeToLive", "LeaseTimeToLiveResponse",
                                lambda p, ctx: R.LeaseTimeToLiveRequest(ID=p.lease[name], keys=keys))
    revoke = LE("LeaseRevoke", "LeaseRevokeResponse", lambda p, ctx: R.LeaseRevokeRequest(ID=ctx))
    leases = LE("LeaseLeases", "LeaseLeasesResponse", R.LeaseLeasesRequest())
    grantp = lambda perm: AU("RoleGrantPermission", "AuthRoleGrantPermissionResponse",
                             R.AuthRoleGrantPermissionRequest(name="other", perm=perm))
    A = AUTHPB.Permission
    lease_grant = LE("LeaseGrant", "LeaseGrantResponse", R.LeaseGrantRequest(TTL=600))

    def grant_cell(p, md, ctx):  # a granted lease gets the next label
        a = lease_grant(p, md, ctx)
        if a[0] == "ok":
            p.names[a[1].ID] = len(p.names) + 1
        return a

    def current_rev(p):  # after a write: each root cell compacts a revision of its own
        return p.call("Put", R.PutRequest(key=b"/app/c", value=b"1"), p.tok["root"])[1].header.revision

    def w_key(p):  # a key of its own for each cell, root's value in it: a prev_kv shows it
        p.seq = getattr(p, "seq", 0) + 1
        key = b"w/%d" % p.seq
        p.call("Put", R.PutRequest(key=key, value=b"root's"), p.tok["root"])
        return key

    def member_id(p):
        return p.call("Status", R.StatusRequest(), p.tok["root"])[1].header.member_id

    return [
        ("Range /app/x (rw)", rule("user", bob=DENIED), KV("Range", "RangeResponse", R.RangeRequest(key=b"/app/x")), None),
        ("Range k1 (read)", rule("user", bob=DENIED), KV("Range", "RangeResponse", R.RangeRequest(key=b"k1")), None),
        ("Range secret", rule("user", alice=DENIED, bob=DENIED), KV("Range", "RangeResponse", R.RangeRequest(key=b"secret")), None),
        ("Range [k1, \\0)", rule("user", alice=DENIED, bob=DENIED),
         KV("Range", "RangeResponse", R.RangeRequest(key=b"k1", range_end=b"\x00")), None),
        ("Put /app/x prev_kv", rule("user", bob=DENIED),
         KV("Put", "PutResponse", R.PutRequest(key=b"/app/x", value=b"2", prev_kv=True)), None),
        ("Put k1 (read only)", rule("user", alice=DENIED, bob=DENIED), KV("Put", "PutResponse", R.PutRequest(key=b"k1", value=b"2")), None),
        ("Put /app/p lease=L(app)", rule("user", bob=DENIED),
         KV("Put", "PutResponse", lambda p, ctx: R.PutRequest(key=b"/app/p", value=b"1", lease=p.lease["app"])), None),
        ("Put w/x (write only)", rule("user", bob=DENIED), KV("Put", "PutResponse", R.PutRequest(key=b"w/x", value=b"1")), None),
        ("Put w/n prev_kv (write only)", rule("user", alice=DENIED, bob=DENIED),
         KV("Put", "PutResponse", lambda p, ctx: R.PutRequest(key=ctx, value=b"1", prev_kv=True)), w_key),
        ("DeleteRange /app/d prev_kv", rule("user", bob=DENIED),
         KV("DeleteRange", "DeleteRangeResponse", R.DeleteRangeRequest(key=b"/app/d", prev_kv=True)), None),
        ("DeleteRange k1 (read only)", rule("user", alice=DENIED, bob=DENIED),
         KV("DeleteRange", "DeleteRangeResponse", R.DeleteRangeRequest(key=b"k1")), None),
        ("Txn range /app/x", rule("user", bob=DENIED), KV("Txn", "TxnResponse", m_txn(("range", b"/app/x", None))), None),
        ("Txn compare secret", rule("user", alice=DENIED, bob=DENIED),
         KV("Txn", "TxnResponse", m_txn(("range", b"/app/x", None), compare=b"secret")), None),
        ("Txn put secret", rule("user", alice=DENIED, bob=DENIED), KV("Txn", "TxnResponse", m_txn(("put", b"secret", None))), None),
        ("Txn put w/x (write only)", rule("user", bob=DENIED), KV("Txn", "TxnResponse", m_txn(("put", b"w/x", None))), None),
        ("Txn put w/n prev_kv (write only)", rule("user", alice=DENIED, bob=DENIED),
         KV("Txn", "TxnResponse", m_txn(("put", None, "prev_kv"))), w_key),
        ("Txn nested put /app/n", rule("user", bob=DENIED),
         KV("Txn", "TxnResponse", m_txn(("put", b"/app/n", None), nested=True)), None),
        ("Txn nested put secret", rule("user", alice=DENIED, bob=DENIED),
         KV("Txn", "TxnResponse", m_txn(("put", b"secret", None), nested=True)), None),
        ("Txn nested range secret", rule("user", alice=DENIED, bob=DENIED),
         KV("Txn", "TxnResponse", m_txn(("range", b"secret", None), nested=True)), None),
        ("Txn put /app/t lease=L(app)", rule("user", bob=DENIED),
         KV("Txn", "TxnResponse", m_txn(("put", b"/app/t", "app"))), None),
        ("LeaseLeases (L(app) only)", rule("user", bob=DENIED), leases, None),
        m_more_leases,
        ("Put /app/p lease=L(secret)", rule("user", alice=DENIED, bob=DENIED),
         KV("Put", "PutResponse", lambda p, ctx: R.PutRequest(key=b"/app/p", value=b"1", lease=p.lease["secret"])), None),
        ("Txn put /app/t lease=L(secret)", rule("user", alice=DENIED, bob=DENIED),
         KV("Txn", "TxnResponse", m_txn(("put", b"/app/t", "secret"))), None),
        ("Txn nested put /app/t lease=L(secret)", rule("user", alice=DENIED, bob=DENIED),
         KV("Txn", "TxnResponse", m_txn(("put", b"/app/t", "secret"), nested=True)), None),
        ("Compact (current rev)", rule("root"),
         KV("Compact", "CompactionResponse", lambda p, ctx: R.CompactionRequest(revision=ctx)), current_rev),
        ("Watch /app/ prefix", rule("user", watch=True, bob=DENIED), watch(Wc(key=b"/app/", range_end=b"/app0")), None),
        ("Watch k1", rule("user", watch=True, bob=DENIED), watch(Wc(key=b"k1")), None),
        ("Watch [k1, \\0)", rule("user", watch=True, alice=DENIED, bob=DENIED), watch(Wc(key=b"k1", range_end=b"\x00")), None),
        ("Watch [\"\", \\0)", rule("user", watch=True, alice=DENIED, bob=DENIED), watch(Wc(key=b"", range_end=b"\x00")), None),
        ("LeaseGrant", rule("user"), grant_cell, None),
        ("LeaseRevoke L(no keys)", rule("user"), revoke, lambda p: m_grant(p)),
        ("LeaseRevoke L(/app/rv)", rule("user", bob=DENIED), revoke, lambda p: m_grant(p, b"/app/rv")),
        ("LeaseRevoke L(secret/rv)", rule("user", alice=DENIED, bob=DENIED), revoke, lambda p: m_grant(p, b"secret/rv")),
        ("LeaseKeepAlive L(no keys)", rule("user"), keepalive("empty"), None),
        ("LeaseKeepAlive L(app)", rule("user", bob=DENIED), keepalive("app"), None),
        ("LeaseKeepAlive L(k1: read only)", rule("user", alice=DENIED, bob=DENIED), keepalive("k1"), None),
        ("LeaseKeepAlive L(secret)", rule("user", alice=DENIED, bob=DENIED), keepalive("secret"), None),
        ("LeaseTimeToLive L(secret)", rule("user"), ttl("secret", False), None),
        ("LeaseTimeToLive L(secret) keys", rule("user", alice=DENIED, bob=DENIED), ttl("secret", True), None),
        ("LeaseTimeToLive L(k1) keys", rule("user", bob=DENIED), ttl("k1", True), None),
        ("LeaseTimeToLive L(no keys) keys", rule("user"), ttl("empty", True), None),
        ("LeaseLeases (L(secret) too)", rule("user", alice=DENIED, bob=DENIED), leases, None),
        ("MemberList linearizable", rule("user"),
         m_unary("Cluster", "MemberList", "MemberListResponse", R.MemberListRequest(linearizable=True)), None),
        ("Status", rule("user"), MA("Status", "StatusResponse", R.StatusRequest()), None),
        ("Alarm GET", rule("user"), MA("Alarm", "AlarmResponse", R.AlarmRequest(action=R.AlarmRequest.GET)), None),
        ("Alarm ACTIVATE NONE", rule("root"),
         MA("Alarm", "AlarmResponse", R.AlarmRequest(action=R.AlarmRequest.ACTIVATE, alarm=R.NONE)), None),
        ("Alarm DEACTIVATE NOSPACE", rule("root"),
         MA("Alarm", "AlarmResponse", R.AlarmRequest(action=R.AlarmRequest.DEACTIVATE, alarm=R.NOSPACE)), None),
        ("MoveLeader (to itself)", rule("root"),
         MA("MoveLeader", "MoveLeaderResponse", lambda p, ctx: R.MoveLeaderRequest(targetID=ctx)), member_id),
        ("Downgrade VALIDATE 3.6", rule("root"),
         MA("Downgrade", "DowngradeResponse", R.DowngradeRequest(action=R.DowngradeRequest.VALIDATE, version="3.6")), None),
        ("Defragment", rule("root"), MA("Defragment", "DefragmentResponse", R.DefragmentRequest()), None),
        ("Snapshot", rule("root"), m_stream("Maintenance", "Snapshot", "SnapshotResponse", R.SnapshotRequest(), bidi=False), None),
        ("Hash", rule("root"), MA("Hash", "HashResponse", R.HashRequest()), None),
        ("HashKV", rule("root"), MA("HashKV", "HashKVResponse", R.HashKVRequest()), None),
        ("AuthStatus", rule("none"), AU("AuthStatus", "AuthStatusResponse", R.AuthStatusRequest()), None),
        ("UserGet alice", rule("root", alice="ok"), AU("UserGet", "AuthUserGetResponse", R.AuthUserGetRequest(name="alice")), None),
        ("UserGet bob", rule("root", bob="ok"), AU("UserGet", "AuthUserGetResponse", R.AuthUserGetRequest(name="bob")), None),
        ("RoleGet app", rule("root", alice="ok"), AU("RoleGet", "AuthRoleGetResponse", R.AuthRoleGetRequest(role="app")), None),
        ("RoleGet root (never added)", rule("root", root=NOROLE), AU("RoleGet", "AuthRoleGetResponse", R.AuthRoleGetRequest(role="root")), None),
        ("RoleGrantPermission key ''", rule("root", root=BADMGMT), grantp(A(permType=A.READ, key=b"")), None),
        ("RoleGrantPermission ['', \\0)", rule("root", root=BADMGMT), grantp(A(permType=A.READ, key=b"", range_end=b"\x00")), None),
        ("RoleGrantPermission [b, a)", rule("root", root=BADMGMT), grantp(A(permType=A.READ, key=b"b", range_end=b"a")), None),
        ("RoleGrantPermission [b, b)", rule("root", root=BADMGMT), grantp(A(permType=A.READ, key=b"b", range_end=b"b")), None),
        ("RoleGrantPermission [f/, \\0)", rule("root"), grantp(A(permType=A.WRITE, key=b"f/", range_end=b"\x00")), None),
        ("RoleGrantPermission no perm", rule("root", root=NOPERM),
         AU("RoleGrantPermission", "AuthRoleGrantPermissionResponse", R.AuthRoleGrantPermissionRequest(name="other")), None),
        ("RoleGet other (after)", rule("root"), AU("RoleGet", "AuthRoleGetResponse", R.AuthRoleGetRequest(role="other")), None),
        ("AuthStatus (after)", rule("none"), AU("AuthStatus", "AuthStatusResponse", R.AuthStatusRequest()), None),
    ]


@test
def authorization_matrix_of_3_7():
    """Section 3 of the 3.7 delta notes, cell by cell, side by side with
    etcd 3.7.3: every RPC called with no token, a made-up token, alice (a
    read-write and a read permission), bob (no role) and root -- and as
    'authorization: Bearer <tok>' for alice, root and the made-up token.
    Each cell: etcd's answer is the 3.7 rule's, and kvd's equals etcd's
    (code and text; successes with ids, terms and TTL ticks normalised).
    Where one server wrote and the other refused, revisions are realigned
    before the next cell, so a difference shows in its own cell only.  One
    correction to the notes: a refused watch's cancel_reason is the whole
    gRPC status text, "rpc error: code = PermissionDenied desc = etcdserver:
    permission denied", not the bare message.  Keys need covering roles,
    admin calls root [§17.1]; checks in etcd's order [§21.2]; Maintenance's
    and MemberList's permissions [§22.1]; a refused watch is created and
    canceled, not an error [§25.5]."""
    e = Etcd(COST)
    k = Kvd(binary=SAN, args=COST)
    pe, pk = Peer(e.endpoint()), Peer(k.endpoint())
    for p in (pe, pk):
        m_setup(p)
    table, differ = [], []
    for row in m_rows():
        if callable(row):
            for p in (pe, pk):
                row(p)
            continue
        label, want, cell, setup = row
        got = {}
        for caller in CALLERS + list(BEARER):
            ans = []
            for p in (pe, pk):
                ctx = setup(p) if setup else None
                ans.append(cell(p, caller_md(p, caller), ctx))
            oe, ok_ = m_outcome(ans[0]), m_outcome(ans[1])
            rule_o = want[BEARER.get(caller, caller)]
            check(oe == rule_o, "%s as %s: etcd answers %s, the 3.7 rule says %s" % (label, caller, oe, rule_o))
            same = m_canon(pe, ans[0]) == m_canon(pk, ans[1])
            if not check(same, "%s as %s: etcd %s, kvd %s" % (label, caller, show(ans[0])[:400], show(ans[1])[:400])):
                differ.append((label, caller, show(ans[0])[:300], show(ans[1])[:300]))
            got[caller] = m_short(oe) if same else "%s/kvd:%s" % (m_short(oe), m_short(ok_))
            pads = m_realign(pe, pk)
            if pads:
                print("  after %s as %s: %d revision(s) realigned" % (label, caller, pads))
        table.append((label, got))
    cols = CALLERS + list(BEARER)
    w = max(len(r[0]) for r in table)
    print("  %-*s %s" % (w, "RPC", " ".join("%-8s" % c[:8] for c in cols)))
    for label, got in table:
        print("  %-*s %s" % (w, label, " ".join("%-8s" % got[c] for c in cols)))
    print("  (E user name is empty, I invalid auth token, D permission denied, c.. a created+canceled watch;"
          " x/kvd:y where kvd differs)")
    print("  %d rows x %d callers; %d cells where kvd differs from etcd 3.7.3%s" % (
        len(table), len(cols), len(differ), ":" if differ else ""))
    for label, caller, a, b in differ:
        print("    %s as %s:\n      etcd: %s\n      kvd:  %s" % (label, caller, a or "{}", b or "{}"))
    check(k.alive(), "kvd alive after the matrix")
    pe.close()
    pk.close()
    e.stop()
    check(k.stop() == 0, "kvd stopped cleanly")


if __name__ == "__main__":
    sys.exit(run_tests(sys.argv))
