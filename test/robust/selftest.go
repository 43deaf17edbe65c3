package main

// robust -selftest: the window search (window.go) on two histories built by
// hand with etcd's own recorder -- one linearizable, one with a stale read
// planted in the middle of other traffic.  The stale history must fail with
// the stale read marked as the operation that closes the shortest failing
// prefix; the other must pass.  Exit status 1 when either is not so.

import (
	"fmt"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"go.etcd.io/etcd/tests/v3/robustness/identity"
	"go.etcd.io/etcd/tests/v3/robustness/model"
	"go.etcd.io/etcd/tests/v3/robustness/report"
	"go.etcd.io/etcd/tests/v3/robustness/validate"
)

func selftestHistory(stale bool) []report.ClientReport {
	ids := identity.NewIDProvider()
	a, b := model.NewAppendableHistory(ids), model.NewAppendableHistory(ids)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	hdr := func(rev int64) *etcdserverpb.ResponseHeader { return &etcdserverpb.ResponseHeader{Revision: rev} }
	get := func(h *model.AppendableHistory, at int, key, val string, mod, rev int64) {
		var kvs []*mvccpb.KeyValue
		if val != "" {
			kvs = []*mvccpb.KeyValue{{Key: []byte(key), Value: []byte(val), ModRevision: mod, CreateRevision: 2, Version: mod - 1}}
		}
		h.AppendRange(key, "", 0, 0, false, ms(at), ms(at+1), &clientv3.GetResponse{Header: hdr(rev), Kvs: kvs, Count: int64(len(kvs))}, nil)
	}
	rev := int64(1)
	put := func(h *model.AppendableHistory, at int, key, val string) {
		rev++
		h.AppendPut(key, val, ms(at), ms(at+1), &clientv3.PutResponse{Header: hdr(rev)}, nil)
	}
	get(a, 1, "a", "", 0, 1) // the database is empty at the start
	at := 3
	for i := 0; i < 12; i++ { // "a" written 12 times, read back by b each time
		put(a, at, "a", fmt.Sprint(i))
		get(b, at+2, "a", fmt.Sprint(i), rev, rev)
		at += 4
	}
	// the planted read: after a=12 was acknowledged, b sees a=11
	put(a, at, "a", "12")
	if stale {
		get(b, at+2, "a", "11", rev-1, rev)
	} else {
		get(b, at+2, "a", "12", rev, rev)
	}
	at += 4
	for i := 13; i < 25; i++ {
		put(a, at, "a", fmt.Sprint(i))
		get(b, at+2, "a", fmt.Sprint(i), rev, rev)
		at += 4
	}
	return []report.ClientReport{
		{ClientID: 0, KeyValue: a.History.Operations()},
		{ClientID: 1, KeyValue: b.History.Operations()},
	}
}

func selftest() {
	cfg := validate.Config{ExpectRevisionUnique: true}
	bad := true
	w := locate(cfg, selftestHistory(true), nil)
	for _, l := range w.lines {
		fmt.Println("  " + l)
	}
	marked := ""
	for _, l := range w.lines {
		if strings.HasPrefix(strings.TrimSpace(l), ">") {
			marked = l
		}
	}
	switch {
	case !strings.Contains(strings.Join(w.lines, "\n"), "shortest failing prefix"):
		fmt.Println("selftest: FAIL: the stale read was not found by the prefix search")
	case !strings.Contains(marked, `"11"`) || !strings.Contains(marked, "0.054s"):
		fmt.Printf("selftest: FAIL: the operation marked is not the stale read at 0.053-0.054s: %q\n", marked)
	default:
		bad = false
	}
	if w := locate(cfg, selftestHistory(false), nil); len(w.lines) != 0 {
		fmt.Printf("selftest: FAIL: the linearizable history was reported: %v\n", w.lines)
		bad = true
	}
	if bad {
		os.Exit(1)
	}
	fmt.Println("selftest: ok: the stale read closes the shortest failing prefix; the linearizable twin passes")
}
