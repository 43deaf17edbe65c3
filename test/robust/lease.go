package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The lease guarantee etcd's model leaves out: a lease never expires
// before its TTL counted from the last keep-alive the server acknowledged.
//
// A probe grants a short lease, attaches a key, renews it for a while,
// stops, and polls the key.  The server resets the TTL when it handles a
// renewal, which is after the client sent it; the key is gone before the
// poll that saw it gone returned.  So if that poll returned earlier than
// (send time of the last acknowledged renewal + TTL), the lease expired
// early.  Renewals lost in a fault only make the bound weaker, never
// wrong.  The probe keys live under "lease-probe/", outside the traffic's
// keys, in scenarios of their own (runLeases).
const probeTTL = 2

type leaseChecker struct {
	endpoints []string
	finish    <-chan struct{}
	mu        sync.Mutex
	probes    int
	early     []string
}

func newLeaseChecker(endpoints []string, finish <-chan struct{}) *leaseChecker {
	return &leaseChecker{endpoints: endpoints, finish: finish}
}

func (l *leaseChecker) run(ctx context.Context, id int) {
	c, err := clientv3.New(clientv3.Config{Endpoints: l.endpoints, Logger: zap.NewNop(), DialTimeout: time.Second})
	if err != nil {
		return
	}
	defer c.Close()
	for n := 0; ; n++ {
		select {
		case <-l.finish:
			return
		default:
		}
		l.probe(ctx, c, id*1000000+n)
	}
}

func (l *leaseChecker) call(ctx context.Context, d time.Duration, f func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return f(cctx)
}

func (l *leaseChecker) probe(ctx context.Context, c *clientv3.Client, n int) {
	var lease clientv3.LeaseID
	key := fmt.Sprintf("lease-probe/%d", n)
	sent := time.Now()
	if l.call(ctx, time.Second, func(ctx context.Context) error {
		r, err := c.Grant(ctx, probeTTL)
		if err == nil {
			lease = r.ID
		}
		return err
	}) != nil {
		time.Sleep(100 * time.Millisecond)
		return
	}
	last := sent // send time of the last acknowledged grant or renewal
	if l.call(ctx, time.Second, func(ctx context.Context) error {
		_, err := c.Put(ctx, key, "x", clientv3.WithLease(lease))
		return err
	}) != nil {
		return
	}
	renewUntil := time.Now().Add(time.Duration(500+n%3*400) * time.Millisecond)
	for time.Now().Before(renewUntil) {
		s := time.Now()
		if l.call(ctx, time.Second, func(ctx context.Context) error {
			r, err := c.KeepAliveOnce(ctx, lease)
			if err == nil && r.TTL <= 0 {
				err = fmt.Errorf("lease gone")
			}
			return err
		}) == nil {
			last = s
		}
		time.Sleep(300 * time.Millisecond)
	}
	for {
		var gone bool
		err := l.call(ctx, time.Second, func(ctx context.Context) error {
			r, err := c.Get(ctx, key)
			if err == nil {
				gone = len(r.Kvs) == 0
			}
			return err
		})
		seen := time.Now()
		if err == nil && gone {
			l.mu.Lock()
			l.probes++
			if early := last.Add(probeTTL * time.Second).Sub(seen); early > 0 {
				l.early = append(l.early, fmt.Sprintf("lease %x (TTL %d s) gone %v after the last acknowledged renewal was sent: %v early",
					int64(lease), probeTTL, seen.Sub(last).Round(time.Millisecond), early.Round(time.Millisecond)))
			}
			l.mu.Unlock()
			return
		}
		select {
		case <-l.finish:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (l *leaseChecker) verdict() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.early) == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d probes: %s", len(l.early), l.probes, l.early[0])
}
