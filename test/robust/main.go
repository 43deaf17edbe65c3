//go:debug randseednop=0

// Command robust checks kvd the way etcd checks etcd: concurrent recorded
// clients drive etcd's own robustness traffic (go.etcd.io/etcd/tests/v3
// v3.7.3: the etcd and the Kubernetes mixes, watchers, compaction) while a
// fault is injected, and etcd's own validators check the histories --
// linearizable KV under porcupine, serializable reads against a replay of
// what the server persisted, and every watch guarantee (ordered, unique,
// atomic, reliable, resumable, bookmarkable, prev_kv, IsCreate, filter).
// A lease checker of its own adds what etcd's model leaves out: no lease
// expires before its TTL from the last acknowledged keep-alive.
//
// The same scenarios run against etcd 3.7.3 (the control: it must pass)
// and against kvd's test build, whose persisted history comes from
// KVD_TEST_HISTORY (written by the log path, not the watch path it checks).
//
//	robust -kvd test/kvd-test [-etcd path] [-seed N] [-only f1,f2] [-rounds N] [-hours H] [-stop]
//
//	robust -list | -selftest
//
// Output: one line per scenario; a violation prints the seed, the guarantee
// broken, etcd's message, where (window.go: the validators' entries, the
// shortest failing prefix of a non-linearizable history) and a report
// directory with porcupine's pictures (history.html; window.html, the
// prefix), the client histories and the server's data dir. The last line is
// "N passed, N failed".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"go.etcd.io/etcd/tests/v3/robustness/client"
	"go.etcd.io/etcd/tests/v3/robustness/identity"
	"go.etcd.io/etcd/tests/v3/robustness/model"
	"go.etcd.io/etcd/tests/v3/robustness/report"
	"go.etcd.io/etcd/tests/v3/robustness/traffic"
	"go.etcd.io/etcd/tests/v3/robustness/validate"
)

var (
	kvdBin    = flag.String("kvd", "", "kvd test build (KVD_TEST_SERVICES) to check")
	etcdBin   = flag.String("etcd", "", "etcd 3.7.3 binary: the control, run on the same scenarios")
	seedFlag  = flag.Int64("seed", 0, "seed of the first scenario (0: random, printed)")
	only      = flag.String("only", "", "comma-separated faults to run (default: all)")
	hours     = flag.Float64("hours", 0, "campaign: repeat with new seeds for this long")
	reportDir = flag.String("report", "", "where failing runs keep their report (default: a temp dir)")
	stopFirst = flag.Bool("stop", false, "stop at the first violation")
	verbose   = flag.Bool("v", false, "log the servers' output")
	mixFlag   = flag.String("mix", "", "force a request mix: etcd-put, etcd-delete, etcd-lease, kubernetes")
	rounds    = flag.Int("rounds", 1, "run the selected faults this many rounds, new seeds each (with -hours: at least)")
	list      = flag.Bool("list", false, "print the faults' names and exit")
	selfTest  = flag.Bool("selftest", false, "check the window search on planted histories and exit")
)

// A scenario: one server, one traffic mix, one fault, one seed.
type scenario struct {
	server  string // "kvd" or "etcd"
	traffic string // "etcd" or "kubernetes"
	fault   *fault
	seed    int64
}

func (s scenario) String() string {
	return fmt.Sprintf("%s/%s/%s seed=%d", s.server, s.traffic, s.fault.name, s.seed)
}

type outcome struct {
	ops, failed, watchEvents int
	violation                string // "" when every guarantee held
	detail                   string
	where                    []string // window.go: where in the history
	reportPath               string
}

func main() {
	flag.Parse()
	if *selfTest {
		selftest()
		return
	}
	if *list {
		for _, f := range allFaults {
			fmt.Println(f.name)
		}
		return
	}
	if *kvdBin == "" {
		fmt.Fprintln(os.Stderr, "robust: -kvd is required")
		os.Exit(2)
	}
	seed := *seedFlag
	if seed == 0 {
		seed = time.Now().UnixNano() % 1000000007
	}
	if *reportDir == "" {
		d, err := os.MkdirTemp("", "kvd-robust-")
		if err != nil {
			panic(err)
		}
		*reportDir = d
	}
	faults := selectFaults(*only)
	passed, failed := 0, 0
	totalOps, totalEvents := 0, 0
	start := time.Now()
	round := 0
	for {
		for i, f := range faults {
			tfc := []string{"etcd", "kubernetes"}[(i+round)%2]
			if f.traffic != "" {
				tfc = f.traffic
			}
			servers := []string{"kvd"}
			if *etcdBin != "" && f.etcdToo && round == 0 {
				servers = append(servers, "etcd")
			}
			for _, srv := range servers {
				sc := scenario{server: srv, traffic: tfc, fault: f, seed: seed}
				seed++
				t0 := time.Now()
				o, err := run(sc)
				if err != nil {
					failed++
					fmt.Printf("FAIL %s: harness: %v\n", sc, err)
					continue
				}
				totalOps += o.ops
				totalEvents += o.watchEvents
				if o.violation != "" {
					failed++
					fmt.Printf("FAIL %s: VIOLATION of %s\n    %s\n", sc, o.violation, o.detail)
					for _, l := range o.where {
						fmt.Printf("    %s\n", l)
					}
					fmt.Printf("    replay: -seed %d -only %s; report: %s\n", sc.seed, f.name, o.reportPath)
					if *stopFirst {
						fmt.Printf("%d passed, %d failed\n", passed, failed)
						os.Exit(1)
					}
					continue
				}
				passed++
				fmt.Printf("ok   %s: %d ops (%d failed or unknown), %d watch events, %.1fs\n", sc, o.ops, o.failed, o.watchEvents, time.Since(t0).Seconds())
			}
		}
		round++
		if round < *rounds {
			continue
		}
		if *hours <= 0 || time.Since(start).Hours() >= *hours {
			break
		}
	}
	fmt.Printf("robust: %d scenarios, %d operations, %d watch events in %.0f s\n",
		passed+failed, totalOps, totalEvents, time.Since(start).Seconds())
	fmt.Printf("%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		os.Exit(1)
	}
}

func run(sc scenario) (o outcome, err error) {
	rand.Seed(sc.seed)
	rng := rand.New(rand.NewSource(sc.seed))
	lg := zap.NewNop()
	dir, err := os.MkdirTemp("", "kvd-robust-run-")
	if err != nil {
		return o, err
	}
	defer os.RemoveAll(dir)
	srv, err := newServer(sc, dir)
	if err != nil {
		return o, err
	}
	defer srv.destroy()
	if err := srv.start(nil); err != nil {
		return o, err
	}
	relay, err := newRelay(srv.addr())
	if err != nil {
		return o, err
	}
	defer relay.close()
	endpoints := []string{relay.addr()}

	var tf traffic.Traffic
	switch sc.traffic {
	case "etcd":
		tf = traffic.EtcdPutDeleteLease
	case "kubernetes":
		tf = traffic.Kubernetes
	}
	if sc.fault.mix != nil {
		tf = sc.fault.mix
	}
	switch *mixFlag {
	case "etcd-put":
		tf = traffic.EtcdPut
	case "etcd-delete":
		tf = traffic.EtcdDelete
	case "etcd-lease":
		tf = traffic.EtcdPutDeleteLease
	case "kubernetes":
		tf = traffic.Kubernetes
	}
	if sc.fault.leases {
		return runLeases(sc, srv, relay, rng)
	}
	ids := identity.NewIDProvider()
	base := time.Now()
	set := client.NewSet(ids, base)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := traffic.CheckEmptyDatabaseAtStart(ctx, lg, endpoints, set); err != nil {
		return o, fmt.Errorf("empty database at start: %w", err)
	}
	profile := traffic.KeyValueMedium
	limiter := rate.NewLimiter(rate.Limit(profile.MaximalQPS), profile.BurstableQPS)
	finish := make(chan struct{})
	keyStore := traffic.NewKeyStore(10, "key")
	storage := traffic.NewKubernetesStorage()
	var wg sync.WaitGroup
	if err := traffic.SimulateKeyValueTraffic(ctx, &wg, &profile, endpoints, set, tf, traffic.RunTrafficLoopParam{
		QPSLimiter:                         limiter,
		IDs:                                ids,
		LeaseIDStorage:                     identity.NewLeaseIDStorage(),
		NonUniqueRequestConcurrencyLimiter: traffic.NewConcurrencyLimiter(profile.MaxNonUniqueRequestConcurrency),
		KeyStore:                           keyStore,
		Storage:                            storage,
		Finish:                             finish,
	}); err != nil {
		return o, err
	}
	watchProfile := traffic.WatchDefault
	if err := traffic.SimulateWatchTraffic(ctx, &wg, &watchProfile, endpoints, set, tf, traffic.RunWatchLoopParam{
		Config:     watchProfile,
		QPSLimiter: limiter,
		KeyStore:   keyStore,
		Storage:    storage,
		Finish:     finish,
		Logger:     lg,
	}); err != nil {
		return o, err
	}
	compaction := traffic.CompactionDefault
	if sc.fault.compactFast {
		compaction = traffic.CompactionFrequent
	}
	if err := traffic.SimulateCompactionTraffic(ctx, &wg, &compaction, endpoints, set, tf, traffic.RunCompactLoopParam{
		Period: compaction.Period, Finish: finish,
	}); err != nil {
		return o, err
	}
	// the full event stream, as etcd's suite collects it (progress
	// requests every 100 ms, a re-watch after a cancel)
	watchSet := client.NewSet(ids, base)
	maxRev := make(chan int64, 1)
	collectErr := make(chan error, 1)
	go func() {
		collectErr <- client.CollectClusterWatchEvents(ctx, client.CollectClusterWatchEventsParam{
			Lg: lg, Endpoints: endpoints, MaxRevisionChan: maxRev, ClientSet: watchSet,
		})
	}()
	env := &faultEnv{sc: sc, srv: srv, relay: relay, endpoints: endpoints, rng: rng, finish: finish, wg: &wg, set: set}
	if sc.fault.during != nil {
		wg.Add(1)
		go func() { defer wg.Done(); sc.fault.during(ctx, env) }()
	}

	time.Sleep(time.Second + time.Duration(rng.Intn(400)-200)*time.Millisecond)
	ferr := error(nil)
	if sc.fault.inject != nil {
		ferr = sc.fault.inject(ctx, env)
	}
	time.Sleep(1500 * time.Millisecond)
	close(finish)
	wg.Wait()
	var v *violation
	if errors.As(ferr, &v) {
		o.violation, o.detail = v.guarantee, v.detail
		return o, nil
	}
	if ferr != nil {
		return o, fmt.Errorf("fault %s: %w", sc.fault.name, ferr)
	}
	if err := srv.ensureRunning(); err != nil {
		return o, err
	}
	if err := tombstone(ctx, endpoints); err != nil {
		return o, fmt.Errorf("final put: %w", err)
	}
	maxRev <- report.OperationsMaxRevision(set.Reports())
	if err := <-collectErr; err != nil {
		return o, fmt.Errorf("collecting the watch history: %w", err)
	}
	reports := slices.Concat(set.Reports(), watchSet.Reports())
	for _, r := range reports {
		o.ops += len(r.KeyValue)
		for _, op := range r.KeyValue {
			if op.Output.(model.MaybeEtcdResponse).Error != "" {
				o.failed++
			}
		}
		o.watchEvents += r.WatchEventCount()
	}
	persisted, err := srv.persisted()
	if err != nil {
		return o, fmt.Errorf("persisted requests: %w", err)
	}
	cfg := validate.Config{ExpectRevisionUnique: tf.ExpectUniqueRevision()}
	printed := filepath.Join(dir, "validators.txt")
	var result validate.RobustnessResult
	asideStdout(printed, func() { result = validate.ValidateAndReturnVisualize(lg, cfg, reports, persisted, 2*time.Minute) })
	if verr := result.Error(); verr != nil {
		o.violation, o.detail = guarantee(verr), verr.Error()
		o.reportPath = filepath.Join(*reportDir, strings.NewReplacer("/", "_", " ", "_", "=", "").Replace(sc.String()))
		saveReport(lg, o.reportPath, srv, reports, tf, result)
		if b, err := os.ReadFile(printed); err == nil && len(b) > 0 &&
			os.WriteFile(filepath.Join(o.reportPath, "validators.txt"), b, 0o644) == nil {
			o.where = append(o.where, "validators.txt: what etcd's validators printed (their diffs)")
		}
		var w window
		asideStdout(os.DevNull, func() { w = locate(cfg, reports, persisted) })
		o.where = append(w.lines, o.where...)
		if w.visualize != nil {
			if err := w.visualize(filepath.Join(o.reportPath, "window.html")); err == nil {
				o.where = append(o.where, "window.html: porcupine's picture of the failing prefix")
			}
		}
	}
	return o, nil
}

// guarantee names what a validation error broke, in the issue's words.
func guarantee(err error) string {
	msg := err.Error()
	for _, g := range []string{"Ordered", "Unique", "Atomic", "Reliable", "Resumable", "Bookmarkable"} {
		if strings.Contains(msg, "broke "+g) {
			return "watch " + strings.ToLower(g)
		}
	}
	switch {
	case strings.Contains(msg, "incorrect event IsCreate"):
		return "watch IsCreate"
	case strings.Contains(msg, "incorrect event prevValue"):
		return "watch prev_kv"
	case strings.Contains(msg, "matching watch filter"):
		return "watch filter"
	case strings.HasPrefix(msg, "assumptions"):
		return "the checker's assumptions"
	case strings.HasPrefix(msg, "linearization"):
		return "linearizable KV (no acknowledged write lost, no stale read)"
	case strings.HasPrefix(msg, "serializable"):
		return "serializable reads (equal to a replay of the persisted history)"
	case strings.HasPrefix(msg, "watch"):
		return "watch"
	}
	return "unknown"
}

func tombstone(ctx context.Context, endpoints []string) error {
	ids := identity.NewIDProvider()
	c, err := client.NewRecordingClient(endpoints, ids, time.Now())
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = c.Put(pctx, "tombstone", "true")
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

func saveReport(lg *zap.Logger, path string, srv server, reports []report.ClientReport, tf traffic.Traffic,
	result validate.RobustnessResult) {
	r, err := report.NewTestReport(lg, path, map[string]string{srv.name(): srv.dataDir()},
		&report.TrafficDetail{ExpectUniqueRevision: tf.ExpectUniqueRevision()})
	if err != nil {
		return
	}
	r.SetClientReports(reports)
	lin := result.Linearization
	if lin.Model.Step != nil {
		r.SetVisualizer(func(_ *zap.Logger, p string) error {
			return porcupine.VisualizePath(lin.Model, lin.Info, p)
		})
	}
	if err := r.Finalize(true, false); err != nil {
		fmt.Fprintf(os.Stderr, "robust: saving the report: %v\n", err)
	}
}

// etcd's validators print some diffs straight to stdout, which is robust's
// report: they go to a file instead (kept with a failing run's report).
func asideStdout(path string, f func()) {
	out, err := os.Create(path)
	if err != nil {
		f()
		return
	}
	old := os.Stdout
	os.Stdout = out
	defer func() { os.Stdout = old; out.Close() }()
	f()
}

var errExited = errors.New("server exited")

func runCmd(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %v: %s", name, args, err, out)
	}
	return nil
}

// A lease scenario: lease expiry deletes keys and makes revisions etcd's
// model does not know, so leases are checked apart from the linearized
// traffic, with probes of their own, under the same faults.
func runLeases(sc scenario, srv server, relay *relay, rng *rand.Rand) (o outcome, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	finish := make(chan struct{})
	endpoints := []string{relay.addr()}
	lc := newLeaseChecker(endpoints, finish)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) { defer wg.Done(); lc.run(ctx, i) }(i)
	}
	env := &faultEnv{sc: sc, srv: srv, relay: relay, endpoints: endpoints, rng: rng, finish: finish, wg: &wg}
	time.Sleep(1500*time.Millisecond + time.Duration(rng.Intn(1000))*time.Millisecond)
	ferr := error(nil)
	if sc.fault.inject != nil {
		ferr = sc.fault.inject(ctx, env)
	}
	time.Sleep(6 * time.Second)
	close(finish)
	wg.Wait()
	var v *violation
	if errors.As(ferr, &v) {
		o.violation, o.detail = v.guarantee, v.detail
		return o, nil
	}
	if ferr != nil {
		return o, fmt.Errorf("fault %s: %w", sc.fault.name, ferr)
	}
	o.ops = lc.probes
	if lc.probes == 0 {
		return o, fmt.Errorf("no lease probe finished")
	}
	if lerr := lc.verdict(); lerr != "" {
		o.violation, o.detail = "lease TTL (never expires before its TTL from the last keep-alive)", lerr
	}
	return o, nil
}
