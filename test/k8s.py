#!/usr/bin/python3
"""Kubernetes on kvd: the real control plane of Kubernetes v1.37.2
(kube-apiserver, kube-controller-manager, kube-scheduler, kubectl) and kine
v0.17.5, built from Go modules by test/lib/k8s-deps.sh (pinned by
test/k8s/go.mod, go.sum and test/k8s/kine's; cached per machine outside the
tree).  No kubelet and no containers: the control plane alone, which is what
the store sees.  `make k8s` runs it; without Go >= 1.26 every test says
SKIPPED, with KVD_REQUIRE_GO_PEERS set (CI) that is a failure.

- kubectl_like_etcd: one apiserver on etcd 3.7.3, one on kvd; /readyz
  (etcd and etcd-readiness included) goes green on both; the same kubectl
  session on each -- Namespaces, ConfigMaps, Secrets, Deployments, Services,
  a CRD and its objects; create, apply, get, list with --chunk-size, patch,
  replace, delete, a finalizer holding a delete, a server-side apply
  conflict, a stale resourceVersion refused with 409 -- gives the same exit
  codes and the same output, once resourceVersions, uids and times are
  normalised; and kvd's apiserver logs no etcd error its etcd twin does not.
- kubectl_differential_catches_a_planted_fault: the same session on a kvd
  holding a ConfigMap nobody wrote through the apiserver differs from
  etcd's where it must, and only there.
- tls_client_certs_and_prefix: kvd serving TLS with client certificates as
  kubeadm sets etcd up (--client-cert-auth, --trusted-ca-file), the apiserver
  with --etcd-cafile/--etcd-certfile/--etcd-keyfile and --etcd-prefix: ready,
  objects written under the prefix (read back from kvd directly).
- controllers_on_kvd: the controller-manager and the scheduler take their
  coordination.k8s.io Leases; a Deployment of 5 makes a ReplicaSet and 5
  Pods (Pending: no nodes); deleting it garbage-collects both.
- watch_cache_features: the apiserver's compactor compacts kvd (its
  compact_rev_key moves, an old revision reads as compacted); consistent
  reads are served from the watch cache (RequestProgress in use: the
  apiserver's metrics count cache reads that did not fall back), its lists
  use RangeStream (its etcd_requests_total, operation listStream), and a
  WatchList (sendInitialEvents) watch gets its bookmark.
- kill9_under_control_plane: kvd killed with SIGKILL under a running
  apiserver and controllers, restarted on the same data dir: the apiserver
  is ready again, every object is there at the same or a newer
  resourceVersion, a new Deployment still gets its Pods.
- storage_conformance: k8s.io/apiserver's storage conformance functions
  (pkg/storage/testing, all 60 Run*), called by test/k8s/storage_test.go as
  etcd3's own tests call them, a fresh server per test: every function and
  subtest that passes on etcd 3.7.3 passes on kvd (the one etcd3 cannot
  pass, an optional bookmark test, fails alike on both).
- watch_across_apiserver_restart: `kubectl get -w` on ConfigMaps, the
  apiserver restarted on the same store: events before and after arrive
  (compared with etcd 3.7.3).
Last line: "N passed, N failed".
"""
import base64
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))  # test/lib: kvdtest, helpers
import kvdtest
from kvdtest import ROOT, Kvd, Skipped, check, free_port, go_peer, main_guard, spawn, test, wait_for

_BIN = []


def k8s_bin(name):
    """The path of a Kubernetes peer built by test/lib/k8s-deps.sh (built
    on first use, cached per machine); Skipped without Go."""
    if not _BIN:
        r = subprocess.run([os.path.join(ROOT, "test", "lib", "k8s-deps.sh")], capture_output=True, text=True)
        sys.stderr.write(r.stderr)
        if r.returncode == 2:
            raise Skipped("needs Go >= %s (test/lib/k8s-deps.sh builds kube-apiserver and kine with it)" %
                          kvdtest.GO_MIN)
        if r.returncode != 0:
            raise RuntimeError("test/lib/k8s-deps.sh failed: %s" % r.stderr[-2000:])
        _BIN.append(r.stdout.strip().splitlines()[-1])
    return os.path.join(_BIN[0], name)


def etcd37():
    b = go_peer("etcd")
    if not b:
        raise Skipped("needs Go >= %s (test/lib/deps.sh builds etcd 3.7.3 with it)" % kvdtest.GO_MIN)
    return b


# ------------------------------------------------------------------ PKI
def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


class Pki:
    """A CA, the apiserver's service-account key, an etcd server certificate
    for 127.0.0.1 and an etcd client certificate, as kubeadm lays them out;
    and a token file for the control plane's users."""

    def __init__(self, d):
        self.d = d
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                "-subj", "/CN=kvd-test-ca", "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
        openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
        openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
        for name, ext in (("etcd-server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
                          ("apiserver-etcd-client", "extendedKeyUsage=clientAuth")):
            with open(os.path.join(d, name + ".ext"), "w") as f:
                f.write(ext + "\n")
            openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=" + name,
                    "-keyout", name + ".key", "-out", name + ".csr", cwd=d)
            openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                    "-days", "2", "-extfile", name + ".ext", "-out", name + ".crt", cwd=d)
        self.tokens = {"admin": ("admin-token", "system:masters"),
                       "system:kube-controller-manager": ("kcm-token", ""),
                       "system:kube-scheduler": ("sched-token", "")}
        with open(self.path("tokens.csv"), "w") as f:
            for i, (user, (tok, groups)) in enumerate(sorted(self.tokens.items())):
                f.write('%s,%s,%d,"%s"\n' % (tok, user, 1000 + i, groups))

    def path(self, name):
        return os.path.join(self.d, name)

    def kubeconfig(self, user, port):
        p = self.path("%s-%d.kubeconfig" % (user.replace(":", "_"), port))
        with open(p, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                       "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:%d" % port,
                                                              "insecure-skip-tls-verify": True}}],
                       "users": [{"name": "u", "user": {"token": self.tokens[user][0]}}],
                       "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}, f)
        return p


# ------------------------------------------------------------------ stores
class Store:
    """The store under an apiserver: kvd, etcd 3.7.3 or kine, with its
    --etcd-servers URL and the process to kill."""
    name = ""
    url = ""

    rss_kb = kvdtest.Kvd.rss_kb  # it reads only self.p


class KvdStore(Store):
    name = "kvd"

    @property
    def dir(self):
        return self.data_dir

    def __init__(self, data_dir=None, args=(), tls=None, port=None, base=None):
        self.args, self.tls = list(args), tls
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="kvd-k8s-", dir=base)
        self.port = port or free_port()
        self.start()

    def start(self):
        extra = []
        if self.tls:
            extra = ["--cert-file", self.tls.path("etcd-server.crt"), "--key-file", self.tls.path("etcd-server.key"),
                     "--client-cert-auth", "--trusted-ca-file", self.tls.path("ca.crt")]
        if self.tls:  # the last --listen-client-urls counts: serve https:// on the same port
            url = "https://127.0.0.1:%d" % self.port
            extra += ["--listen-client-urls", url, "--advertise-client-urls", url]
        self.k = Kvd(args=["--name", "k8s"] + extra + self.args, data_dir=self.data_dir, port=self.port)
        self.p = self.k.p
        self.url = ("https" if self.tls else "http") + "://127.0.0.1:%d" % self.port

    def kill9(self):
        self.k.stop(signal.SIGKILL)


class EtcdStore(Store):
    name = "etcd 3.7.3"

    def __init__(self, base=None):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="etcd-k8s-", dir=base)
        self.url = "http://127.0.0.1:%d" % self.port
        self.p = spawn([etcd37(), "--name", "ref", "--data-dir", self.dir, "--listen-client-urls", self.url,
                        "--advertise-client-urls", self.url, "--listen-peer-urls", "http://127.0.0.1:%d" % free_port(),
                        "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_for(lambda: kvdtest.etcdctl(self, "endpoint", "health", timeout=10)[0] == 0, 60, 0.1):
            raise RuntimeError("etcd did not start")

    def endpoint(self):
        return "127.0.0.1:%d" % self.port


class KineStore(Store):
    name = "kine (SQLite)"

    def __init__(self, base=None):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="kine-k8s-", dir=base)
        self.url = "http://127.0.0.1:%d" % self.port
        self.p = spawn([k8s_bin("kine"), "--listen-address", "127.0.0.1:%d" % self.port,
                        "--endpoint", "sqlite://%s/state.db?_journal=WAL&cache=shared" % self.dir],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir)
        if not wait_for(lambda: kvdtest.etcdctl(self, "endpoint", "status", timeout=10)[0] == 0, 60, 0.1):
            raise RuntimeError("kine did not start")

    def endpoint(self):
        return "127.0.0.1:%d" % self.port


# ------------------------------------------------------------------ control plane
class Apiserver:
    """kube-apiserver on 127.0.0.1:<free port> over store; log lines kept."""

    def __init__(self, pki, store, extra=(), tls=False, port=None):
        self.pki, self.store, self.extra, self.tls = pki, store, list(extra), tls
        self.port = port or free_port()
        self.cert_dir = tempfile.mkdtemp(prefix="apiserver-certs-")
        self.start()

    def start(self):
        args = [k8s_bin("kube-apiserver"), "--etcd-servers", self.store.url,
                "--bind-address", "127.0.0.1", "--secure-port", str(self.port), "--cert-dir", self.cert_dir,
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-signing-key-file", self.pki.path("sa.key"),
                "--service-account-key-file", self.pki.path("sa.pub"),
                "--service-cluster-ip-range", "10.0.0.0/24", "--authorization-mode", "RBAC",
                "--token-auth-file", self.pki.path("tokens.csv"), "--profiling=false", "-v", "2"] + self.extra
        if self.tls:
            args += ["--etcd-cafile", self.pki.path("ca.crt"), "--etcd-certfile", self.pki.path("apiserver-etcd-client.crt"),
                     "--etcd-keyfile", self.pki.path("apiserver-etcd-client.key")]
        self.log = []
        self.p = spawn(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not wait_for(lambda: self.ready(), 240, 0.5):
            raise RuntimeError("kube-apiserver on %s not ready: %s" % (self.store.name, "".join(self.log[-40:])))

    def _read(self):
        for line in iter(self.p.stdout.readline, b""):
            self.log.append(line.decode(errors="replace"))

    def get(self, path, timeout=10):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request("https://127.0.0.1:%d%s" % (self.port, path),
                                     headers={"Authorization": "Bearer admin-token"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=timeout) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except OSError as e:
            return 0, str(e)

    def ready(self):
        if self.p.poll() is not None:
            raise RuntimeError("kube-apiserver exited %s: %s" % (self.p.returncode, "".join(self.log[-40:])))
        return self.get("/readyz")[0] == 200

    def metrics(self):
        return self.get("/metrics", 30)[1]

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.reader.join(10)

    def kubectl(self, *args, stdin=None, timeout=60):
        r = subprocess.run([k8s_bin("kubectl"), "--kubeconfig", self.pki.kubeconfig("admin", self.port)] + list(args),
                           input=stdin, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr

    def etcd_errors(self):
        """The apiserver's error lines that name its store: klog E lines
        about etcd, grpc or storage, with times, addresses and numbers
        taken out so two runs compare."""
        out = set()
        for line in self.log:
            if not line.startswith("E") or not re.search(r"etcd|grpc|storage|transport", line, re.I):
                continue
            s = re.sub(r"^E\d{4} [\d:.]+\s+\d+ ", "E ", line.strip())
            s = re.sub(r"127\.0\.0\.1:\d+", "ADDR", s)
            s = re.sub(r"\d+", "N", s)
            out.add(s)
        return out


def metric_sum(text, name, **labels):
    """The sum of a Prometheus metric's samples whose labels include these."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        lab = line[len(name):].partition("}")[0]
        if all('%s="%s"' % (k, v) in lab for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Controllers:
    """kube-controller-manager and kube-scheduler against an apiserver, both
    with leader election on (their Leases in kube-system)."""

    def __init__(self, api):
        pki = api.pki
        self.kcm = spawn([k8s_bin("kube-controller-manager"), "--kubeconfig", pki.kubeconfig("system:kube-controller-manager", api.port),
                          "--service-account-private-key-file", pki.path("sa.key"), "--use-service-account-credentials",
                          "--root-ca-file", pki.path("ca.crt"), "--cluster-signing-cert-file", pki.path("ca.crt"),
                          "--cluster-signing-key-file", pki.path("ca.key"), "--service-cluster-ip-range", "10.0.0.0/24",
                          "--controllers", "*,-node-lifecycle-controller", "--secure-port", "0",
                          "--leader-elect=true", "-v", "1"],
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(api.cert_dir, "kcm.log"), "w"))
        cfg = os.path.join(api.cert_dir, "scheduler.yaml")
        with open(cfg, "w") as f:
            f.write("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                    "clientConnection:\n  kubeconfig: %s\nleaderElection:\n  leaderElect: true\n" %
                    pki.kubeconfig("system:kube-scheduler", api.port))
        self.sched = spawn([k8s_bin("kube-scheduler"), "--config", cfg, "--secure-port", "0", "-v", "1"],
                           stdout=subprocess.DEVNULL, stderr=open(os.path.join(api.cert_dir, "sched.log"), "w"))

    def stop(self):
        for p in (self.kcm, self.sched):
            if p.poll() is None:
                p.terminate()
                p.wait(60)


def holders(api):
    rc, out, _ = api.kubectl("get", "leases", "-n", "kube-system", "-o", "json")
    if rc:
        return {}
    return {i["metadata"]["name"]: i["spec"].get("holderIdentity", "") for i in json.loads(out)["items"]}


def count(api, *what):
    rc, out, _ = api.kubectl("get", *what, "-o", "json")
    return len(json.loads(out)["items"]) if rc == 0 else -1


# ------------------------------------------------------------------ the kubectl session
CRD = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.kvd.example.com}
spec:
  group: kvd.example.com
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}, color: {type: string}}}
"""

DEPLOY = """apiVersion: apps/v1
kind: Deployment
metadata: {name: %s, namespace: %s}
spec:
  replicas: %d
  selector: {matchLabels: {app: %s}}
  template:
    metadata: {labels: {app: %s}}
    spec: {containers: [{name: c, image: registry.k8s.io/pause:3.10}]}
"""


def session(api, plant=None):
    """A kubectl session's steps: (what, exit code, normalised output);
    plant(), when given, runs once the namespaces exist."""
    steps = []

    def run(what, *args, stdin=None):
        rc, out, err = api.kubectl(*args, stdin=stdin)
        steps.append((what, rc, normalise(out + err)))
        return rc, out

    run("create ns", "create", "namespace", "team-a")
    run("create ns 2", "create", "namespace", "team-b")
    run("dup ns", "create", "namespace", "team-a")
    if plant:
        plant()
    for i in range(30):
        api.kubectl("create", "configmap", "cm-%02d" % i, "-n", "team-a", "--from-literal=k=%s" % ("v" * (i * 50)))
    run("list cm chunked", "get", "configmaps", "-n", "team-a", "--chunk-size", "7", "-o", "name")
    run("list cm all chunked", "get", "configmaps", "-A", "--chunk-size", "4", "-o", "name")
    run("secret", "create", "secret", "generic", "s1", "-n", "team-a", "--from-literal=password=hunter2")
    run("get secret", "get", "secret", "s1", "-n", "team-a", "-o", "jsonpath={.data.password}")
    run("apply cm", "apply", "-f", "-", stdin="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: applied, namespace: team-a}\n"
        "data: {a: '1'}\n")
    run("apply cm again", "apply", "-f", "-", stdin="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: applied, namespace: team-a}\n"
        "data: {a: '2', b: '3'}\n")
    run("get applied", "get", "cm", "applied", "-n", "team-a", "-o", "jsonpath={.data}")
    run("patch merge", "patch", "cm", "cm-01", "-n", "team-a", "--type", "merge", "-p", '{"data":{"x":"y"}}')
    run("patch json", "patch", "cm", "cm-01", "-n", "team-a", "--type", "json",
        "-p", '[{"op":"replace","path":"/data/x","value":"z"}]')
    run("get patched", "get", "cm", "cm-01", "-n", "team-a", "-o", "jsonpath={.data.x}")
    rc, out = api.kubectl("get", "cm", "cm-02", "-n", "team-a", "-o", "json")[:2]
    obj = json.loads(out)
    obj["data"] = {"replaced": "yes"}
    run("replace", "replace", "-f", "-", stdin=json.dumps(obj))
    run("replace stale rv (409)", "replace", "-f", "-", stdin=json.dumps(obj))
    run("get replaced", "get", "cm", "cm-02", "-n", "team-a", "-o", "jsonpath={.data}")
    # server-side apply: a second manager changing the first's field conflicts
    ssa = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ssa, namespace: team-a}\ndata: {owner: %s}\n"
    run("ssa first", "apply", "--server-side", "--field-manager", "alice", "-f", "-", stdin=ssa % "alice")
    run("ssa conflict", "apply", "--server-side", "--field-manager", "bob", "-f", "-", stdin=ssa % "bob")
    run("ssa forced", "apply", "--server-side", "--field-manager", "bob", "--force-conflicts", "-f", "-", stdin=ssa % "bob")
    run("get ssa", "get", "cm", "ssa", "-n", "team-a", "-o", "jsonpath={.data.owner}")
    run("deploy", "apply", "-f", "-", stdin=DEPLOY % ("web", "team-a", 3, "web", "web"))
    run("service", "create", "service", "clusterip", "web", "-n", "team-a", "--tcp", "80:8080")
    run("get svc", "get", "svc", "web", "-n", "team-a", "-o", "jsonpath={.spec.ports}")
    run("scale", "scale", "deployment", "web", "-n", "team-a", "--replicas", "5")
    run("get deploy", "get", "deploy", "web", "-n", "team-a", "-o", "jsonpath={.spec.replicas}")
    run("crd", "apply", "-f", "-", stdin=CRD)
    wait_for(lambda: api.kubectl("get", "crd", "widgets.kvd.example.com", "-o",
                                 "jsonpath={.status.conditions[?(@.type=='Established')].status}")[1] == "True", 60, 0.2)
    wait_for(lambda: api.kubectl("get", "widgets", "-n", "team-a")[0] == 0, 60, 0.2)
    for i in range(5):
        run("widget %d" % i, "apply", "-f", "-", stdin="apiVersion: kvd.example.com/v1\nkind: Widget\n"
            "metadata: {name: w%d, namespace: team-a}\nspec: {size: %d, color: red}\n" % (i, i))
    run("list widgets chunked", "get", "widgets", "-n", "team-a", "--chunk-size", "2", "-o", "name")
    run("patch widget", "patch", "widget", "w1", "-n", "team-a", "--type", "merge", "-p", '{"spec":{"color":"blue"}}')
    run("get widget", "get", "widget", "w1", "-n", "team-a", "-o", "jsonpath={.spec}")
    # a finalizer holds the delete until it is removed
    run("cm with finalizer", "apply", "-f", "-", stdin="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: held, namespace: team-a, "
        "finalizers: [kvd.example.com/hold]}\ndata: {a: b}\n")
    run("delete held", "delete", "cm", "held", "-n", "team-a", "--wait=false")
    run("held has deletionTimestamp", "get", "cm", "held", "-n", "team-a", "-o",
        "jsonpath={.metadata.finalizers}{.metadata.deletionTimestamp}")
    run("release finalizer", "patch", "cm", "held", "-n", "team-a", "--type", "merge", "-p", '{"metadata":{"finalizers":null}}')
    wait_for(lambda: api.kubectl("get", "cm", "held", "-n", "team-a")[0] != 0, 30, 0.2)
    run("held gone", "get", "cm", "held", "-n", "team-a")
    run("delete cm", "delete", "cm", "cm-03", "-n", "team-a")
    run("delete missing", "delete", "cm", "cm-03", "-n", "team-a")
    run("delete widgets", "delete", "widgets", "--all", "-n", "team-a")
    run("delete crd", "delete", "crd", "widgets.kvd.example.com")
    run("delete ns", "delete", "namespace", "team-b", "--wait=false")
    run("final cm list", "get", "cm", "-n", "team-a", "-o", "name")
    return steps


def normalise(s):
    s = re.sub(r'"?(resourceVersion|uid|creationTimestamp|deletionTimestamp|time)"?: ?"[^"]*"', r"\1: X", s)
    s = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "TIME", s)
    s = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "UID", s)
    s = re.sub(r"10\.0\.0\.\d+", "CLUSTERIP", s)
    return s.strip()


# ------------------------------------------------------------------ tests
def pki():
    return Pki(tempfile.mkdtemp(prefix="k8s-pki-"))


_ETCD_SESSION = []


def etcd_session(p):
    """The kubectl session on etcd 3.7.3, run once per suite run."""
    if not _ETCD_SESSION:
        store = EtcdStore()
        api = Apiserver(p, store)
        code, body = api.get("/readyz?verbose")
        check(code == 200 and "[+]etcd ok" in body and "[+]etcd-readiness ok" in body,
              "%s: readyz lists etcd and etcd-readiness ok: %s" % (store.name, body[-600:]))
        _ETCD_SESSION.append((session(api), api.etcd_errors()))
        api.stop()
    return _ETCD_SESSION[0]


@test
def kubectl_like_etcd():
    p = pki()
    a, etcd_errors = etcd_session(p)
    api = Apiserver(p, KvdStore())
    code, body = api.get("/readyz?verbose")
    check(code == 200 and "[+]etcd ok" in body and "[+]etcd-readiness ok" in body,
          "kvd: readyz lists etcd and etcd-readiness ok: %s" % body[-600:])
    b, kvd_errors = session(api), api.etcd_errors()
    api.stop()
    check(len(a) == len(b) and len(a) > 40, "both sessions ran every step (%d, %d)" % (len(a), len(b)))
    for x, y in zip(a, b):
        check(x == y, "kubectl %s alike: etcd %r, kvd %r" % (x[0], x[1:], y[1:]))
    ok = dict((w, rc) for w, rc, _ in b)
    check(ok.get("replace stale rv (409)") == 1 and "Conflict" in dict((w, o) for w, _, o in b)["replace stale rv (409)"],
          "a stale resourceVersion is refused with a conflict")
    extra = kvd_errors - etcd_errors
    check(not extra, "kvd's apiserver logs no etcd error etcd's does not: %s" % sorted(extra)[:10])


@test
def kubectl_differential_catches_a_planted_fault():
    """The session's comparison is not blind: a store that serves a key
    nobody wrote through the apiserver (a ConfigMap put into kvd directly,
    after the namespaces are made) must differ from etcd in the steps that
    list it, and only there."""
    p = pki()
    a = etcd_session(p)[0]
    store = KvdStore()
    api = Apiserver(p, store)
    phantom = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "planted"},
                          "metadata": {"name": "phantom", "namespace": "team-a",
                                       "uid": "00000000-0000-0000-0000-000000000001",
                                       "creationTimestamp": "2026-01-01T00:00:00Z"}})

    def plant():
        rc, _, err = kvdtest.etcdctl(store.k, "put", "/registry/configmaps/team-a/phantom", phantom)
        check(rc == 0, "the phantom ConfigMap is put into kvd: %s" % err)
        wait_for(lambda: api.kubectl("get", "cm", "phantom", "-n", "team-a")[0] == 0, 30, 0.2)
    b = session(api, plant)
    api.stop()
    differ = [x[0] for x, y in zip(a, b) if x != y]
    check(len(a) == len(b), "the session ran every step on the planted kvd (%d, %d)" % (len(a), len(b)))
    check({"list cm chunked", "list cm all chunked", "final cm list"} <= set(differ),
          "the comparison flags the lists that show the phantom: %s" % differ)
    check(all(("cm" in w and "list" in w) for w in differ), "and only them: %s" % differ)


@test
def tls_client_certs_and_prefix():
    p = pki()
    store = KvdStore(tls=p)
    api = Apiserver(p, store, tls=True, extra=["--etcd-prefix", "/edge/registry"])
    code, body = api.get("/readyz?verbose")
    check(code == 200 and "[+]etcd ok" in body, "ready over TLS with client certificates: %s" % body[-400:])
    check(api.kubectl("create", "configmap", "over-tls", "--from-literal=a=b")[0] == 0, "a write over TLS")
    r = subprocess.run(["etcdctl", "--endpoints", store.url, "--cacert", p.path("ca.crt"), "--cert",
                        p.path("apiserver-etcd-client.crt"), "--key", p.path("apiserver-etcd-client.key"),
                        "get", "--prefix", "--keys-only", "/edge/registry/configmaps/default/over-tls"],
                       capture_output=True, text=True, env=dict(os.environ, ETCDCTL_API="3"))
    check("/edge/registry/configmaps/default/over-tls" in r.stdout, "the object is under --etcd-prefix: %r %r" %
          (r.stdout, r.stderr))
    r = subprocess.run(["etcdctl", "--endpoints", store.url, "--cacert", p.path("ca.crt"), "get", "x"],
                       capture_output=True, text=True, env=dict(os.environ, ETCDCTL_API="3"), timeout=30)
    check(r.returncode != 0, "without a client certificate kvd refuses the client")
    api.stop()


def deploy(api, name, ns, replicas):
    return api.kubectl("apply", "-f", "-", stdin=DEPLOY % (name, ns, replicas, name, name))[0] == 0


@test
def controllers_on_kvd():
    p = pki()
    store = KvdStore()
    api = Apiserver(p, store)
    ctl = Controllers(api)
    check(wait_for(lambda: holders(api).get("kube-controller-manager", "") != "" and
                   holders(api).get("kube-scheduler", "") != "", 120, 0.5),
          "controller-manager and scheduler hold their Leases: %s" % holders(api))
    check(deploy(api, "app", "default", 5), "a Deployment of 5")
    check(wait_for(lambda: count(api, "replicasets", "-l", "app=app") == 1 and count(api, "pods", "-l", "app=app") == 5,
                   120, 0.5), "a ReplicaSet and 5 Pods: %d, %d" % (count(api, "replicasets", "-l", "app=app"),
                                                                  count(api, "pods", "-l", "app=app")))
    rc, out, _ = api.kubectl("get", "pods", "-l", "app=app", "-o", "jsonpath={.items[*].status.phase}")
    check(out.split() == ["Pending"] * 5, "Pods Pending (no nodes): %r" % out)
    check(api.kubectl("delete", "deployment", "app")[0] == 0, "delete the Deployment")
    check(wait_for(lambda: count(api, "replicasets", "-l", "app=app") == 0 and count(api, "pods", "-l", "app=app") == 0,
                   120, 0.5), "garbage collection removes the ReplicaSet and the Pods")
    check(wait_for(lambda: count(api, "serviceaccounts", "-n", "default") >= 1, 60, 0.5),
          "the service-account controller wrote default's ServiceAccount")
    ctl.stop()
    api.stop()


@test
def watch_cache_features():
    p = pki()
    store = KvdStore()
    api = Apiserver(p, store, extra=["--etcd-compaction-interval", "10s"])
    for i in range(20):
        api.kubectl("create", "configmap", "c%d" % i, "--from-literal=a=%d" % i)

    def compact_rev():
        r = subprocess.run(["etcdctl", "--endpoints", store.url, "get", "compact_rev_key", "--print-value-only"],
                           capture_output=True, text=True, env=dict(os.environ, ETCDCTL_API="3"))
        return int(r.stdout.strip() or 0)
    check(wait_for(lambda: compact_rev() > 1, 90, 0.5), "the apiserver's compactor stored a revision: %d" % compact_rev())
    r = subprocess.run(["etcdctl", "--endpoints", store.url, "get", "x", "--rev", "1"], capture_output=True, text=True,
                       env=dict(os.environ, ETCDCTL_API="3"))
    check(wait_for(lambda: "compacted" in subprocess.run(
        ["etcdctl", "--endpoints", store.url, "get", "x", "--rev", "1"], capture_output=True, text=True,
        env=dict(os.environ, ETCDCTL_API="3")).stderr, 60, 0.5), "kvd was compacted by the apiserver: %r" % r.stderr)
    # consistent LISTs from the watch cache (RequestProgress): many reads, none fell back
    for i in range(20):
        api.get("/api/v1/configmaps")
    m = api.metrics()
    served = metric_sum(m, "apiserver_watch_cache_consistent_read_total", fallback="false", success="true")
    fell = metric_sum(m, "apiserver_watch_cache_consistent_read_total", fallback="true")
    check(served >= 20 and fell == 0, "consistent reads from the watch cache: %d served, %d fell back" % (served, fell))
    # Kubernetes 1.37 lists with RangeStream (EtcdRangeStream, beta, on) and
    # falls back to paginated Range on Unimplemented: on kvd it must not
    streams = metric_sum(m, "etcd_requests_total", operation="listStream")
    paged = metric_sum(m, "etcd_requests_total", operation="list")
    errs = metric_sum(m, "etcd_request_errors_total", operation="listStream")
    check(streams > 0 and errs == 0, "the apiserver's lists use RangeStream: %d streamed, %d paginated, %d errors" %
          (streams, paged, errs))
    print("    apiserver lists on kvd: %d by RangeStream, %d paginated" % (streams, paged))
    # a WatchList: initial events then the bookmark marking their end
    code, body = api.get("/api/v1/namespaces/default/configmaps?watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
                         "&resourceVersionMatch=NotOlderThan&timeoutSeconds=3", 30)
    evs = [json.loads(x) for x in body.splitlines() if x.strip()]
    added = [e for e in evs if e["type"] == "ADDED"]
    marks = [e for e in evs if e["type"] == "BOOKMARK" and
             e["object"]["metadata"].get("annotations", {}).get("k8s.io/initial-events-end") == "true"]
    check(code == 200 and len(added) >= 20 and marks, "WatchList: %d initial events and the end bookmark (%d events)" %
          (len(added), len(evs)))
    api.stop()


@test
def kill9_under_control_plane():
    p = pki()
    store = KvdStore()
    api = Apiserver(p, store)
    ctl = Controllers(api)
    check(deploy(api, "before", "default", 3), "a Deployment before the crash")
    check(wait_for(lambda: count(api, "pods", "-l", "app=before") == 3, 120, 0.5), "its 3 Pods")
    for i in range(20):
        api.kubectl("create", "configmap", "k%d" % i, "--from-literal=a=%d" % i)
    rc, out, _ = api.kubectl("get", "configmaps,deployments,replicasets,pods", "-A", "-o", "json")
    seen = {(i["kind"], i["metadata"].get("namespace"), i["metadata"]["name"]): int(i["metadata"]["resourceVersion"])
            for i in json.loads(out)["items"]}
    store.kill9()
    store.start()
    check(wait_for(lambda: api.ready(), 120, 0.5), "the apiserver is ready again after kvd's SIGKILL")
    rc, out, _ = api.kubectl("get", "configmaps,deployments,replicasets,pods", "-A", "-o", "json")
    now = {(i["kind"], i["metadata"].get("namespace"), i["metadata"]["name"]): int(i["metadata"]["resourceVersion"])
           for i in json.loads(out)["items"]}
    lost = [k for k in seen if k not in now]
    back = [k for k in seen if k in now and now[k] < seen[k]]
    check(rc == 0 and not lost and not back, "no object lost (%s) or gone back a resourceVersion (%s)" % (lost[:5], back[:5]))
    check(deploy(api, "after", "default", 2), "a Deployment after the crash")
    check(wait_for(lambda: count(api, "pods", "-l", "app=after") == 2, 120, 0.5), "the controllers carry on: its 2 Pods")
    ctl.stop()
    api.stop()


STORAGE_ONLY_ETCD_FAILS = {
    # etcd3's store sends a bookmark only through the watch cache; the
    # function is optional and etcd3's own tests do not call it
    "RunTestOptionalWatchBookmarksWithCorrectResourceVersion",
}


def storage_suite(store, only=None, **env):
    """test/k8s/storage_test.go (k8s.io/apiserver's storage conformance
    functions) run on one store: {test name: PASS|FAIL|SKIP}, subtests
    included; only: just these functions."""
    e = dict(os.environ, K8S_STORE=store, **env)
    run = ["-test.run", "^TestStorageConformance/(%s)$" % "|".join(only)] if only else []
    r = subprocess.run([k8s_bin("storage.test"), "-test.v", "-test.timeout", "30m", "-test.count", "1"] + run,
                       env=e, capture_output=True, timeout=2400, cwd=tempfile.mkdtemp(prefix="k8s-storage-"))
    out = r.stdout.decode("utf-8", "replace") + r.stderr.decode("utf-8", "replace")
    res = dict((m.group(2), m.group(1)) for m in re.finditer(r"^\s*--- (PASS|FAIL|SKIP): TestStorageConformance/(\S+)", out, re.M))
    return res, out


def storage_retry(store, res, out, **env):
    """Some functions wait fixed times (a bookmark within a second, say) and
    fail now and then on a busy machine -- etcd 3.7.3 itself failed
    RunTestWatchDispatchBookmarkEvents once in CI.  A function that failed
    (but the known) is run again alone, up to twice, on the same store; a
    pass then counts, and the retry is said.  One that fails every time
    still fails."""
    for _ in range(2):
        again = sorted(k for k, v in res.items() if "/" not in k and v == "FAIL" and k not in STORAGE_ONLY_ETCD_FAILS)
        if not again:
            break
        r, o = storage_suite(store, only=again, **env)
        passed = [k for k in again if r.get(k) == "PASS"]
        print("    %s: %s failed, run again: %s passed" % (store, again, passed or "none"), flush=True)
        for k in passed:
            for sub in [x for x in res if x == k or x.startswith(k + "/")]:
                res[sub] = r.get(sub, res[sub])
        out += o
    return res, out


@test
def storage_conformance():
    a, out_a = storage_retry("etcd", *storage_suite("etcd", ETCD=etcd37()), ETCD=etcd37())
    kvd = os.path.abspath(os.environ.get("KVD", os.path.join(ROOT, "kvd")))
    b, out_b = storage_retry("kvd", *storage_suite("kvd", KVD=kvd), KVD=kvd)
    top = lambda res: dict((k, v) for k, v in res.items() if "/" not in k)
    ta, tb = top(a), top(b)
    check(len(ta) >= 60, "every storage conformance function ran on etcd 3.7.3 (%d)" % len(ta))
    check(all(ta.get(k) == "FAIL" for k in STORAGE_ONLY_ETCD_FAILS),
          "the reader sees failures: the known one fails on etcd 3.7.3 (%s)" % [ta.get(k) for k in STORAGE_ONLY_ETCD_FAILS])
    bad = sorted(k for k, v in ta.items() if v != "PASS" and k not in STORAGE_ONLY_ETCD_FAILS)
    check(not bad, "etcd 3.7.3 passes them all but the known: %s" % bad)
    check(set(ta) == set(tb), "the same functions ran on kvd: missing %s" % sorted(set(ta) - set(tb)))
    for k in sorted(ta):
        if ta[k] == "PASS":
            check(tb.get(k) == "PASS", "%s passes on kvd as on etcd 3.7.3" % k)
        else:
            check(tb.get(k) == ta[k], "%s: %s on kvd as on etcd 3.7.3 (%s)" % (k, ta[k], tb.get(k)))
    sub = [k for k in a if "/" in k and a[k] == "PASS" and b.get(k) != "PASS"]
    check(not sub, "every subtest passing on etcd passes on kvd: %s" % sub[:10])
    print("    %d functions, %d subtests alike; etcd 3.7.3 and kvd" % (len(ta), len(a) - len(ta)))
    if bad or sub or any(tb.get(k) != "PASS" for k in ta if ta[k] == "PASS"):
        sys.stdout.write("    kvd's run, failures:\n" + "\n".join(l for l in out_b.splitlines() if "_tests.go:" in l)[:4000] + "\n")


def watch_restart(store):
    """kubectl get -w on ConfigMaps while the apiserver restarts: the names
    of the events it printed."""
    p = pki()
    api = Apiserver(p, store)
    api.kubectl("create", "configmap", "w0")
    w = subprocess.Popen([k8s_bin("kubectl"), "--kubeconfig", p.kubeconfig("admin", api.port), "get", "configmaps",
                          "-w", "--output-watch-events", "-o", "custom-columns=EVENT:.type,NAME:.object.metadata.name",
                          "--no-headers"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    threading.Thread(target=lambda: [lines.append(x.strip()) for x in w.stdout], daemon=True).start()
    api.kubectl("create", "configmap", "w1")
    wait_for(lambda: any("w1" in x for x in lines), 30, 0.1)
    api.stop()
    api.start()
    api.kubectl("create", "configmap", "w2")
    wait_for(lambda: any("w2" in x for x in lines), 30, 0.1)
    w.terminate()
    w.wait(10)
    api.stop()
    return [x for x in lines if re.match(r"^\S+\s+w\d$", x)]


@test
def watch_across_apiserver_restart():
    a = watch_restart(EtcdStore())
    b = watch_restart(KvdStore())
    check(a == b and any(x.endswith(" w1") for x in b), "the same events across a restart: etcd %s, kvd %s" % (a, b))


if __name__ == "__main__":
    main_guard(sys.argv)
