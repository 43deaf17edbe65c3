#!/usr/bin/python3
"""Ganeti's own confd client library (Debian's ganeti-3.0, run with
/usr/bin/python3) against a confd server:

  test/lib/ganeticlient.py PORT KEYFILE '[[type, query], ...]' [timeout [skew:SECONDS|magic:FOURCC]]

Packing, signing, verifying and rsalt matching are all Ganeti's code; the
last argument bends it: requests stamped SECONDS away from now, or packed
with another magic.  One
JSON line per query: [status, answer, serial] for a verified reply, or
"NOREPLY".  Exit 3 if Ganeti's library raised on a reply."""
import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")  # asyncore is deprecated in 3.11
for d in ("/usr/share/ganeti/3.0", "/var/cache/kvd-test/ganeti-3.0/usr/share/ganeti/3.0"):
    if os.path.isdir(os.path.join(d, "ganeti")):
        sys.path.insert(0, d)
        break

from ganeti.confd import client as cc  # noqa: E402


def main(argv):
    port, keyfile, queries = int(argv[1]), argv[2], json.loads(argv[3])
    timeout = float(argv[4]) if len(argv) > 4 else 2.0
    tamper = argv[5].split(":", 1) if len(argv) > 5 else ["", ""]
    if tamper[0] == "skew":
        pack = cc.ConfdClient._PackRequest
        cc.ConfdClient._PackRequest = lambda self, req, now=None: pack(self, req, time.time() + float(tamper[1]))
    elif tamper[0] == "magic":
        cc.confd.PackMagic = lambda payload: tamper[1].encode() + payload
    with open(keyfile) as f:
        key = f.read()  # the whole file, newline included, as Ganeti reads it
    got = {}

    def callback(up):
        if up.type == cc.UPCALL_REPLY:
            got[up.salt] = up.server_reply
    c = cc.ConfdClient(key, ["127.0.0.1"], callback, port=port)
    try:
        for typ, query in queries:
            req = cc.ConfdClientRequest(type=typ, query=query)
            c.SendRequest(req, async_=False)
            c.WaitForReply(req.rsalt, timeout=timeout)
            rep = got.get(req.rsalt)
            print(json.dumps("NOREPLY" if rep is None else [rep.status, rep.answer, rep.serial]), flush=True)
    except Exception as e:  # the library choked on a reply
        print("RAISED %s: %s" % (type(e).__name__, e), flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
