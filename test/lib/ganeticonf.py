#!/usr/bin/python3
"""Ganeti 3.0 cluster configurations (config.data) for the confd tests,
built from a seed: nodes in groups, instances with NICs on several links,
plain and DRBD disks, networks.  Ganeti's ganeti-confd 3.0.2 loads them.

The generator also leaves out, at random, fields that ganeti-confd fills in
with defaults (tags, ctime/mtime, disk mode/iv_name/children...), and uses
names that make lookups interesting: short names that are a prefix of one
node (or of two: ambiguous), UUID lookups, duplicate instance IPs."""
import json
import random
import uuid as _uuid


def _uuid4(r):
    return str(_uuid.UUID(int=r.getrandbits(128), version=4))


def _ts(r):
    # timestamps as Ganeti writes them (Python floats, microseconds)
    return round(r.uniform(1.3e9, 1.7e9), r.choice([0, 3, 6]))


def _maybe(r, obj, field, p=0.2):
    """Drop a field ganeti-confd defaults, sometimes."""
    if r.random() < p:
        obj.pop(field, None)


def build(seed=1, nodes=5, instances=8):
    r = random.Random(seed)
    domain = r.choice(["example.com", "lab.kvd.test"])
    links = ["br0", "br1", "xen-br0"]
    groups = {}
    for gname in ("default", "rack2"):
        g = {"alloc_policy": "preferred", "diskparams": {}, "ipolicy": {}, "name": gname, "ndparams": {},
             "networks": {}, "serial_no": r.randint(1, 50), "tags": [], "uuid": _uuid4(r), "mtime": _ts(r)}
        _maybe(r, g, "tags")
        _maybe(r, g, "mtime")
        groups[g["uuid"]] = g
    gids = list(groups)
    # node names: node1, node2, ... plus an ambiguous pair (web.a / web.b share the prefix "web")
    names = ["node%d.%s" % (i + 1, domain) for i in range(nodes)]
    names[-1] = "web.%s" % domain
    names[-2] = "web.backup.%s" % domain if nodes > 3 else names[-2]
    node_objs = {}
    for i, name in enumerate(names):
        u = _uuid4(r)
        n = {"ctime": _ts(r), "drained": r.random() < 0.15, "group": r.choice(gids),
             "master_candidate": r.random() < 0.6, "master_capable": True, "mtime": _ts(r), "name": name,
             "ndparams": {}, "offline": r.random() < 0.15, "powered": True,
             "primary_ip": "192.0.2.%d" % (10 + i), "secondary_ip": "198.51.100.%d" % (10 + i),
             "serial_no": r.randint(1, 99), "tags": r.choice([[], ["t%d" % i]]), "uuid": u, "vm_capable": True}
        for f in ("ctime", "mtime", "tags"):
            _maybe(r, n, f)
        node_objs[u] = n
    nuuids = list(node_objs)
    master = nuuids[0]
    node_objs[master]["master_candidate"] = True
    node_objs[master]["offline"] = node_objs[master]["drained"] = False
    disks, inst_objs = {}, {}
    port = 11000
    for i in range(instances):
        iu = _uuid4(r)
        pn = r.choice(nuuids)
        dl = []
        for d in range(r.randint(0, 3)):
            du = _uuid4(r)
            size = r.choice([1024, 2048, 10240])
            if r.random() < 0.5 and len(nuuids) > 1:
                sn = r.choice([n for n in nuuids if n != pn])
                port += 1
                kids = []
                for part, sz in (("data", size), ("meta", 128)):
                    c = {"ctime": _ts(r), "dev_type": "plain", "logical_id": ["xenvg", "%s.disk%d_%s" % (du, d, part)],
                         "mtime": _ts(r), "nodes": [pn, sn], "params": {}, "serial_no": 1, "size": sz,
                         "uuid": _uuid4(r), "iv_name": "", "mode": "rw", "children": []}
                    for f in ("iv_name", "mode", "children", "ctime", "mtime"):
                        _maybe(r, c, f, 0.5)
                    kids.append(c)
                a, b = (pn, sn) if r.random() < 0.7 else (sn, pn)
                disk = {"children": kids, "ctime": _ts(r), "dev_type": "drbd", "iv_name": "disk/%d" % d,
                        "logical_id": [a, b, port, r.randint(0, 20), r.randint(0, 20), "%040x" % r.getrandbits(160)],
                        "mode": "rw", "mtime": _ts(r), "nodes": [pn, sn], "params": {}, "serial_no": r.randint(1, 9),
                        "size": size, "uuid": du}
            else:
                disk = {"ctime": _ts(r), "dev_type": "plain", "iv_name": "disk/%d" % d,
                        "logical_id": ["xenvg", "%s.disk%d" % (du, d)], "mode": r.choice(["rw", "ro"]),
                        "mtime": _ts(r), "nodes": [pn], "params": {}, "serial_no": r.randint(1, 9), "size": size,
                        "uuid": du}
            for f in ("ctime", "mtime", "iv_name"):
                _maybe(r, disk, f, 0.15)
            disks[du] = disk
            dl.append(du)
        nics = []
        for j in range(r.randint(0, 3)):
            nic = {"mac": "aa:00:00:%02x:%02x:%02x" % (i, j, r.randrange(256)), "nicparams": {}, "uuid": _uuid4(r)}
            if r.random() < 0.8:
                nic["ip"] = "203.0.113.%d" % r.randint(1, 40)  # duplicates happen: the later instance wins
            if r.random() < 0.6:
                nic["nicparams"] = {"link": r.choice(links)}
            nics.append(nic)
        inst = {"admin_state": r.choice(["up", "down"]), "admin_state_source": "admin", "beparams": {},
                "ctime": _ts(r), "disks": dl, "disks_active": True, "hvparams": {}, "hypervisor": "xen-pvm",
                "mtime": _ts(r), "name": "inst%d.%s" % (i + 1, domain), "nics": nics, "os": "debootstrap",
                "osparams": {}, "osparams_private": {}, "primary_node": pn, "serial_no": r.randint(1, 30),
                "tags": [], "uuid": iu}
        for f in ("tags", "ctime", "mtime", "beparams", "hvparams", "osparams"):
            _maybe(r, inst, f, 0.15)
        inst_objs[iu] = inst
    net = {"name": "net1", "network": "203.0.113.0/24", "reservations": "0" * 256, "ext_reservations": "1" + "0" * 255,
           "serial_no": 2, "uuid": _uuid4(r)}
    cluster = {
        "beparams": {"default": {"always_failover": False, "auto_balance": True, "maxmem": 256, "minmem": 256,
                                 "spindle_use": 1, "vcpus": 2}},
        "blacklisted_os": [], "candidate_certs": {}, "candidate_pool_size": 10, "cluster_name": "kvd." + domain,
        "compression_tools": ["gzip"], "ctime": _ts(r),
        "data_collectors": {"cpu-avg-load": {"active": True, "interval": 5000000.0},
                            "diskstats": {"active": r.random() < 0.5, "interval": 15000000.0},
                            "drbd": {"active": True, "interval": 5000000.0},
                            "inst-status-xen": {"active": True, "interval": 5000000.0},
                            "lv": {"active": False, "interval": 60000000.0},
                            "xen-cpu-avg-load": {"active": True, "interval": 5000000.0}},
        "default_iallocator": "hail", "default_iallocator_params": {}, "disk_state_static": {},
        "diskparams": {"drbd": {"resync-rate": 61440}, "plain": {"stripes": 1}},
        "drbd_usermode_helper": "/bin/true", "enabled_disk_templates": ["drbd", "plain"],
        "enabled_hypervisors": ["xen-pvm"], "enabled_user_shutdown": False, "file_storage_dir": "",
        "gluster_storage_dir": "", "hidden_os": [], "highest_used_port": port, "hv_state_static": {},
        "hvparams": {"xen-pvm": {"kernel_path": "/boot/vmlinuz-3-xenU", "root_path": "/dev/xvda1"}},
        "install_image": "", "instance_communication_network": "",
        "ipolicy": {"disk-templates": ["drbd", "plain"],
                    "minmax": [{"max": {"cpu-count": 8, "disk-count": 16, "disk-size": 1048576, "memory-size": 32768,
                                        "nic-count": 8, "spindle-use": 12},
                                "min": {"cpu-count": 1, "disk-count": 1, "disk-size": 1024, "memory-size": 128,
                                        "nic-count": 1, "spindle-use": 1}}],
                    "spindle-ratio": 32.0, "std": {"cpu-count": 1, "disk-count": 1, "disk-size": 1024,
                                                   "memory-size": 128, "nic-count": 1, "spindle-use": 1},
                    "vcpu-ratio": 4.0},
        "mac_prefix": "aa:00:00", "maintain_node_health": False, "master_ip": "192.0.2.254",
        "master_netdev": "eth0", "master_netmask": 24, "master_node": master, "max_running_jobs": 20,
        "max_tracked_jobs": 25, "modify_etc_hosts": True, "modify_ssh_setup": True, "mtime": _ts(r),
        "ndparams": {"cpu_speed": 1.0, "exclusive_storage": False, "oob_program": "", "ovs": False, "ovs_link": "",
                     "ovs_name": "switch1", "spindle_count": 1, "ssh_port": 22},
        "nicparams": {"default": {"link": r.choice(links), "mode": "bridged", "vlan": ""}},
        "os_hvp": {}, "osparams": {}, "osparams_private_cluster": {}, "prealloc_wipe_disks": False,
        "primary_ip_family": 2, "reserved_lvs": [], "rsahostkeypub": "ssh-rsa AAAA-kvd-test",
        "serial_no": r.randint(100, 5000), "shared_file_storage_dir": "", "ssh_key_bits": 2048,
        "ssh_key_type": "rsa", "tags": ["t"], "tcpudp_port_pool": [], "uid_pool": [],
        "use_external_mip_script": False, "uuid": _uuid4(r), "volume_group_name": "xenvg", "zeroing_image": ""}
    for f in ("tags", "ctime", "mtime", "disk_state_static", "hv_state_static"):
        _maybe(r, cluster, f)
    cfg = {"cluster": cluster, "ctime": _ts(r), "disks": disks, "filters": {}, "instances": inst_objs,
           "mtime": _ts(r), "networks": {net["uuid"]: net}, "nodegroups": groups, "nodes": node_objs,
           "serial_no": r.randint(1000, 9000), "version": 3000000}
    return cfg


if __name__ == "__main__":
    import sys
    print(json.dumps(build(int(sys.argv[1]) if len(sys.argv) > 1 else 1), indent=1, sort_keys=True))
