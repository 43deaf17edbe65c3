// The storage conformance tests of k8s.io/apiserver (pkg/storage/testing),
// run against a store chosen by the environment: K8S_STORE=etcd starts the
// etcd binary named by $ETCD, K8S_STORE=kvd the kvd named by $KVD.  Each test
// gets a fresh server process on free loopback ports with an empty data
// directory, as etcd3's own tests get a fresh embedded etcd: several tests
// assert exact revisions and counts.  The store is built as etcd3's
// testSetup builds it (store_test.go) -- codec, prefix, transformer, lease
// config -- but from outside the package, so the transformer the tests swap
// is held by a small delegating transformer here instead of the store's
// unexported field.  test/k8s.py runs this binary on both stores and compares.
package k8s

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/utils/clock"
)

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

const testPrefix = "test!"

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
}

// ---- the server under test ----------------------------------------------

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

var portLock sync.Mutex // two tests must not pick the same free port

// runServer starts a fresh etcd or kvd and returns a kubernetes client
// wrapped in the suite's recorders, as testserver.RunEtcd does.
func runServer(t testing.TB, progress time.Duration) *kubernetes.Client {
	t.Helper()
	kind := os.Getenv("K8S_STORE")
	bin := map[string]string{"etcd": os.Getenv("ETCD"), "kvd": os.Getenv("KVD")}[kind]
	if bin == "" {
		t.Fatalf("K8S_STORE must be etcd (with $ETCD) or kvd (with $KVD), got %q", kind)
	}
	portLock.Lock()
	cport, pport := freePort(t), freePort(t)
	curl := "http://127.0.0.1:" + strconv.Itoa(cport)
	purl := "http://127.0.0.1:" + strconv.Itoa(pport)
	args := []string{"--data-dir", t.TempDir(), "--listen-client-urls", curl,
		"--advertise-client-urls", curl, "--initial-advertise-peer-urls", purl,
		"--unsafe-no-fsync"}
	if kind == "etcd" {
		args = append(args, "--listen-peer-urls", purl, "--initial-cluster", "default="+purl,
			"--log-level", "error")
	}
	if progress > 0 {
		args = append(args, "--watch-progress-notify-interval", progress.String())
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		portLock.Unlock()
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// The server is ready when it answers a read; it holds its ports by then.
	client, err := kubernetes.New(clientv3.Config{Endpoints: []string{curl},
		DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		portLock.Unlock()
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = client.KV.Get(ctx, "ready?")
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			portLock.Unlock()
			t.Fatalf("%s did not answer on %s: %v", kind, curl, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	portLock.Unlock()
	t.Cleanup(func() { client.Close() })
	kr := storagetesting.NewKubernetesRecorder(client.Kubernetes)
	client.KV = storagetesting.NewKVRecorder(client.KV, kr)
	client.Kubernetes = kr
	return client
}

// ---- the store, as etcd3's testSetup builds it ---------------------------

// swapTransformer delegates to a transformer the tests may replace and
// restore (UpdatePrefixTransformer, UpdateTransformer).
type swapTransformer struct {
	mu  sync.RWMutex
	cur value.Transformer
}

func (s *swapTransformer) get() value.Transformer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cur
}

func (s *swapTransformer) set(t value.Transformer) {
	s.mu.Lock()
	s.cur = t
	s.mu.Unlock()
}

func (s *swapTransformer) TransformFromStorage(ctx context.Context, data []byte, dc value.Context) ([]byte, bool, error) {
	return s.get().TransformFromStorage(ctx, data, dc)
}

func (s *swapTransformer) TransformToStorage(ctx context.Context, data []byte, dc value.Context) ([]byte, error) {
	return s.get().TransformToStorage(ctx, data, dc)
}

type testStore struct {
	storage.Interface
	sw *swapTransformer
}

func (s *testStore) UpdatePrefixTransformer(m storagetesting.PrefixTransformerModifier) func() {
	orig := s.sw.get()
	cp := *orig.(*storagetesting.PrefixTransformer)
	s.sw.set(m(&cp))
	return func() { s.sw.set(orig) }
}

func (s *testStore) UpdateTransformer(m storagetesting.TransformerModifier) func() {
	orig := s.sw.get()
	s.sw.set(m(orig))
	return func() { s.sw.set(orig) }
}

type setup struct {
	progress    time.Duration
	codec       runtime.Codec
	transformer value.Transformer
}

type env struct {
	ctx    context.Context
	store  *testStore
	raw    storage.Interface // what etcd3.New returned
	client *kubernetes.Client
	codec  runtime.Codec
	prefix *storagetesting.PrefixTransformer // nil when a test supplied its own
}

func newEnv(t testing.TB, opts setup) *env {
	client := runServer(t, opts.progress)
	if opts.codec == nil {
		opts.codec = apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)
	}
	e := &env{ctx: context.Background(), client: client, codec: opts.codec}
	if opts.transformer == nil {
		e.prefix = storagetesting.NewPrefixTransformer([]byte(testPrefix), false)
		opts.transformer = e.prefix
	}
	sw := &swapTransformer{cur: opts.transformer}
	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	lease := etcd3.NewDefaultLeaseManagerConfig()
	lease.ReuseDurationSeconds = 1
	s, err := etcd3.New(client, compactor, opts.codec,
		func() runtime.Object { return &example.Pod{} },
		func() runtime.Object { return &example.PodList{} },
		"", "/pods/", schema.GroupResource{Resource: "pods"}, sw, lease,
		etcd3.NewDefaultDecoder(opts.codec, versioner), versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	e.raw = s
	e.store = &testStore{Interface: s, sw: sw}
	return e
}

func start(t testing.TB) *env { return newEnv(t, setup{}) }

func (e *env) keyValidation(t *testing.T) storagetesting.KeyValidation {
	return func(ctx context.Context, t *testing.T, key string) {
		r, err := e.client.Client.KV.Get(ctx, key)
		if err != nil {
			t.Fatalf("Get %s: %v", key, err)
		}
		if len(r.Kvs) == 0 {
			t.Fatalf("no value stored at %s", key)
		}
		obj, err := runtime.Decode(e.codec, r.Kvs[0].Value[len(testPrefix):])
		if err != nil {
			t.Fatalf("stored value does not decode: %v", err)
		}
		if p := obj.(*example.Pod); p.ResourceVersion != "" || p.SelfLink != "" {
			t.Errorf("stored object carries resourceVersion %q / selfLink %q", p.ResourceVersion, p.SelfLink)
		}
	}
}

func (e *env) increaseRV() storagetesting.IncreaseRVFunc {
	return func(ctx context.Context, t *testing.T) int64 {
		r, err := e.client.Client.KV.Put(ctx, "increaseRV", "ok")
		if err != nil {
			t.Fatalf("Put increaseRV: %v", err)
		}
		return r.Header.Revision
	}
}

func (e *env) compaction() storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		rv, err := storage.APIObjectVersioner{}.ParseResourceVersion(resourceVersion)
		if err != nil {
			t.Fatal(err)
		}
		cur, _, _, err := etcd3.Compact(ctx, e.client.Client, 0, int64(rv))
		if err != nil {
			_, _, _, err = etcd3.Compact(ctx, e.client.Client, cur, int64(rv))
		}
		if err != nil {
			t.Fatal(err)
		}
		if !utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot) {
			return
		}
		cr, ok := e.raw.(interface{ CompactRevision() int64 })
		if !ok {
			t.Fatal("the store does not report its compact revision")
		}
		for cr.CompactRevision() != int64(rv) {
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// callsValidation counts reads through the transformer and the KV recorder,
// as etcd3's checkStorageCallsInvariants does; 10000 is etcd3's maxLimit.
func (e *env) callsValidation() storagetesting.CallsValidation {
	rec := e.client.KV.(*storagetesting.KVRecorder)
	return func(t *testing.T, pageSize, processed uint64) {
		if reads := e.prefix.GetReadsAndReset(); reads != processed {
			t.Errorf("unexpected reads: %d, expected: %d", reads, processed)
		}
		want := uint64(1)
		if pageSize != 0 {
			limit := pageSize
			for sum := uint64(1); sum < processed; {
				limit *= 2
				if limit > 10000 {
					limit = 10000
				}
				sum += limit
				want++
			}
		}
		if reads := rec.GetReadsAndReset() + rec.GetStreamReadsAndReset(); reads != want {
			t.Fatalf("unexpected reads: %d, want: %d", reads, want)
		}
	}
}

// corruptErr is the error the store's own corrupt-object wrapper makes of a
// transformer's failure ("bits flipped"), got through that exported wrapper.
func corruptErr(t testing.TB) error {
	_, _, err := etcd3.WithCorruptObjErrorHandlingTransformer(failing{}).
		TransformFromStorage(context.Background(), nil, value.DefaultContext(""))
	if err == nil {
		t.Fatal("the corrupt-object wrapper passed a failure through")
	}
	return err
}

type failing struct{ value.Transformer }

func (failing) TransformFromStorage(context.Context, []byte, value.Context) ([]byte, bool, error) {
	return nil, false, errors.New("bits flipped")
}

// failSwitch turns a transformer's or a codec's reads into errors on demand
// (the setFailing the transform-or-decode-error deletes take).
type failSwitch struct {
	mu   sync.Mutex
	fail bool
}

func (f *failSwitch) setFailing(b bool) { f.mu.Lock(); f.fail = b; f.mu.Unlock() }
func (f *failSwitch) failing() bool     { f.mu.Lock(); defer f.mu.Unlock(); return f.fail }

type flakyTransformer struct {
	value.Transformer
	failSwitch
}

func (f *flakyTransformer) TransformFromStorage(ctx context.Context, d []byte, dc value.Context) ([]byte, bool, error) {
	if f.failing() {
		return nil, false, errors.New("synthetic error")
	}
	return f.Transformer.TransformFromStorage(ctx, d, dc)
}

type flakyCodec struct {
	runtime.Codec
	failSwitch
}

func (f *flakyCodec) Decode(d []byte, gvk *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if f.failing() {
		return nil, nil, errors.New("synthetic error")
	}
	return f.Codec.Decode(d, gvk, into)
}

func gate(t *testing.T, f featuregate.Feature, on bool) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, f, on)
}

func resetFeatureChecker(t *testing.T) {
	orig := etcdfeature.DefaultFeatureSupportChecker
	etcdfeature.DefaultFeatureSupportChecker = etcdfeature.NewDefaultFeatureSupportChecker()
	t.Cleanup(func() { etcdfeature.DefaultFeatureSupportChecker = orig })
}

// ---- the suite: every Run* of pkg/storage/testing, called as etcd3 does ---

func TestStorageConformance(t *testing.T) {
	type tc struct {
		name string
		run  func(t *testing.T)
	}
	plain := func(f func(context.Context, *testing.T, storage.Interface)) func(*testing.T) {
		return func(t *testing.T) { e := start(t); f(e.ctx, t, e.store) }
	}
	tb := func(f func(context.Context, testing.TB, storage.Interface)) func(*testing.T) {
		return func(t *testing.T) { e := start(t); f(e.ctx, t, e.store) }
	}
	unsafeDelete := func(t *testing.T) { gate(t, features.AllowUnsafeMalformedObjectDeletion, true) }
	rangeStream := func(f func(t *testing.T)) func(*testing.T) {
		return func(t *testing.T) {
			for _, on := range []bool{false, true} {
				t.Run(fmt.Sprintf("rangeStream=%v", on), func(t *testing.T) {
					gate(t, features.EtcdRangeStream, on)
					resetFeatureChecker(t)
					f(t)
				})
			}
		}
	}
	tests := []tc{
		{"RunTestCreate", func(t *testing.T) { e := start(t); storagetesting.RunTestCreate(e.ctx, t, e.store, e.keyValidation(t)) }},
		{"RunTestCreateWithTTL", plain(storagetesting.RunTestCreateWithTTL)},
		{"RunTestCreateWithKeyExist", plain(storagetesting.RunTestCreateWithKeyExist)},
		{"RunTestGet", plain(storagetesting.RunTestGet)},
		{"RunTestUnconditionalDelete", plain(storagetesting.RunTestUnconditionalDelete)},
		{"RunTestConditionalDelete", plain(storagetesting.RunTestConditionalDelete)},
		{"RunTestDeleteWithSuggestion", plain(storagetesting.RunTestDeleteWithSuggestion)},
		{"RunTestDeleteWithSuggestionAndConflict", plain(storagetesting.RunTestDeleteWithSuggestionAndConflict)},
		{"RunTestDeleteWithConflict", plain(storagetesting.RunTestDeleteWithConflict)},
		{"RunTestDeleteWithSuggestionOfDeletedObject", plain(storagetesting.RunTestDeleteWithSuggestionOfDeletedObject)},
		{"RunTestValidateDeletionWithSuggestion", plain(storagetesting.RunTestValidateDeletionWithSuggestion)},
		{"RunTestValidateDeletionWithOnlySuggestionValid", plain(storagetesting.RunTestValidateDeletionWithOnlySuggestionValid)},
		{"RunTestPreconditionalDeleteWithSuggestion", plain(storagetesting.RunTestPreconditionalDeleteWithSuggestion)},
		{"RunTestPreconditionalDeleteWithOnlySuggestionPass", plain(storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass)},
		{"RunTestDeleteWithConflictAndMissingExpectedTransformOrDecodeError", func(t *testing.T) {
			unsafeDelete(t)
			c := &flakyCodec{Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)}
			e := newEnv(t, setup{codec: c})
			storagetesting.RunTestDeleteWithConflictAndMissingExpectedTransformOrDecodeError(e.ctx, t, e.store, c.setFailing)
		}},
		{"RunTestDeleteExpectedTransformOrDecodeError", func(t *testing.T) {
			t.Run("transform", func(t *testing.T) {
				unsafeDelete(t)
				f := &flakyTransformer{Transformer: storagetesting.NewPrefixTransformer([]byte(testPrefix), false)}
				e := newEnv(t, setup{transformer: f})
				storagetesting.RunTestDeleteExpectedTransformOrDecodeError(e.ctx, t, e.store, f.setFailing)
			})
			t.Run("decode", func(t *testing.T) {
				unsafeDelete(t)
				c := &flakyCodec{Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)}
				e := newEnv(t, setup{codec: c})
				storagetesting.RunTestDeleteExpectedTransformOrDecodeError(e.ctx, t, e.store, c.setFailing)
			})
		}},
		{"RunTestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError", func(t *testing.T) {
			unsafeDelete(t)
			tb(storagetesting.RunTestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError)(t)
		}},
		{"RunTestList", rangeStream(func(t *testing.T) {
			e := start(t)
			rec := e.client.KV.(*storagetesting.KVRecorder)
			storagetesting.RunTestList(e.ctx, t, e.store, e.compaction(), false, e.client.Kubernetes.(*storagetesting.KubernetesRecorder))
			streams := rec.GetStreamReadsAndReset()
			on := utilfeature.DefaultFeatureGate.Enabled(features.EtcdRangeStream)
			if on && streams == 0 {
				t.Error("expected lists to be served by RangeStream")
			}
			if !on && streams > 0 {
				t.Errorf("expected no RangeStream with the feature off, got %d", streams)
			}
		})},
		{"RunTestConsistentList", rangeStream(func(t *testing.T) {
			e := start(t)
			storagetesting.RunTestConsistentList(e.ctx, t, e.store, e.increaseRV(), false, true, false)
		})},
		{"RunTestGetListNonRecursive", func(t *testing.T) {
			e := start(t)
			storagetesting.RunTestGetListNonRecursive(e.ctx, t, e.increaseRV(), e.store)
		}},
		{"RunTestGetListRecursivePrefix", plain(storagetesting.RunTestGetListRecursivePrefix)},
		{"RunTestGetListWithErrorAggregation", func(t *testing.T) {
			unsafeDelete(t)
			e := start(t)
			st := &testStore{Interface: etcd3.NewStoreWithUnsafeCorruptObjectDeletion(e.raw, schema.GroupResource{Resource: "pods"}), sw: e.store.sw}
			storagetesting.RunTestGetListWithErrorAggregation(e.ctx, t, st, corruptErr(t))
		}},
		{"RunTestGetListWithoutErrorAggregation", func(t *testing.T) {
			gate(t, features.AllowUnsafeMalformedObjectDeletion, false)
			e := start(t)
			storagetesting.RunTestGetListWithoutErrorAggregation(e.ctx, t, e.store, corruptErr(t))
		}},
		{"RunTestListContinuation", func(t *testing.T) {
			e := start(t)
			storagetesting.RunTestListContinuation(e.ctx, t, e.store, e.callsValidation())
		}},
		{"RunTestListPaginationRareObject", func(t *testing.T) {
			gate(t, features.ListFromCacheSnapshot, false) // it adds a read of the compact key
			e := start(t)
			storagetesting.RunTestListPaginationRareObject(e.ctx, t, e.store, e.callsValidation())
		}},
		{"RunTestListContinuationWithFilter", func(t *testing.T) {
			e := start(t)
			storagetesting.RunTestListContinuationWithFilter(e.ctx, t, e.store, e.callsValidation())
		}},
		{"RunTestListInconsistentContinuation", func(t *testing.T) {
			e := start(t)
			storagetesting.RunTestListInconsistentContinuation(e.ctx, t, e.store, e.compaction())
		}},
		{"RunTestListResourceVersionMatch", func(t *testing.T) {
			e := start(t)
			storagetesting.RunTestListResourceVersionMatch(e.ctx, t, e.store)
		}},
		{"RunTestListPaging", plain(storagetesting.RunTestListPaging)},
		{"RunTestNamespaceScopedList", plain(storagetesting.RunTestNamespaceScopedList)},
		{"RunTestKeySchema", plain(storagetesting.RunTestKeySchema)},
		{"RunTestGuaranteedUpdate", func(t *testing.T) {
			e := start(t)
			storagetesting.RunTestGuaranteedUpdate(e.ctx, t, e.store, e.keyValidation(t))
		}},
		{"RunTestGuaranteedUpdateWithTTL", plain(storagetesting.RunTestGuaranteedUpdateWithTTL)},
		{"RunTestGuaranteedUpdateChecksStoredData", func(t *testing.T) {
			e := start(t)
			storagetesting.RunTestGuaranteedUpdateChecksStoredData(e.ctx, t, e.store)
		}},
		{"RunTestGuaranteedUpdateWithConflict", plain(storagetesting.RunTestGuaranteedUpdateWithConflict)},
		{"RunTestGuaranteedUpdateWithSuggestionAndConflict", plain(storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict)},
		{"RunTestTransformationFailure", func(t *testing.T) {
			e := start(t)
			storagetesting.RunTestTransformationFailure(e.ctx, t, e.store)
		}},
		{"RunTestStats", func(t *testing.T) {
			for _, size := range []bool{true, false} {
				t.Run(fmt.Sprintf("SizeBasedListCostEstimate=%v", size), func(t *testing.T) {
					e := start(t)
					if size {
						keys := func(ctx context.Context) ([]string, error) {
							r, err := e.client.Client.KV.Get(ctx, "/pods/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
							if err != nil {
								return nil, err
							}
							ks := make([]string, 0, len(r.Kvs))
							for _, kv := range r.Kvs {
								ks = append(ks, string(kv.Key))
							}
							return ks, nil
						}
						if err := e.raw.EnableResourceSizeEstimation(keys); err != nil {
							t.Fatal(err)
						}
					}
					storagetesting.RunTestStats(e.ctx, t, e.store, e.codec, e.prefix, size)
				})
			}
		}},
		{"RunTestCompactRevision", func(t *testing.T) {
			gate(t, features.ListFromCacheSnapshot, true) // the store must watch the compact key
			e := start(t)
			storagetesting.RunTestCompactRevision(e.ctx, t, e.store, e.increaseRV(), e.compaction())
		}},
		{"RunTestWatch", plain(storagetesting.RunTestWatch)},
		{"RunTestClusterScopedWatch", plain(storagetesting.RunTestClusterScopedWatch)},
		{"RunTestNamespaceScopedWatch", plain(storagetesting.RunTestNamespaceScopedWatch)},
		{"RunTestDeleteTriggerWatch", plain(storagetesting.RunTestDeleteTriggerWatch)},
		{"RunTestWatchFromZero", func(t *testing.T) {
			e := start(t)
			storagetesting.RunTestWatchFromZero(e.ctx, t, e.store, e.compaction())
		}},
		{"RunTestWatchFromNonZero", plain(storagetesting.RunTestWatchFromNonZero)},
		{"RunTestDelayedWatchDelivery", plain(storagetesting.RunTestDelayedWatchDelivery)},
		{"RunTestWatchError", func(t *testing.T) {
			e := start(t)
			storagetesting.RunTestWatchError(e.ctx, t, e.store)
		}},
		{"RunTestWatchContextCancel", plain(storagetesting.RunTestWatchContextCancel)},
		{"RunTestWatcherTimeout", plain(storagetesting.RunTestWatcherTimeout)},
		{"RunTestWatchDeleteEventObjectHaveLatestRV", plain(storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV)},
		{"RunTestWatchInitializationSignal", plain(storagetesting.RunTestWatchInitializationSignal)},
		{"RunOptionalTestProgressNotify", func(t *testing.T) {
			e := newEnv(t, setup{progress: time.Second})
			storagetesting.RunOptionalTestProgressNotify(e.ctx, t, e.store, e.increaseRV())
		}},
		{"RunTestWatchWithUnsafeDelete", func(t *testing.T) {
			unsafeDelete(t)
			e := start(t)
			storagetesting.RunTestWatchWithUnsafeDelete(e.ctx, t, e.store, corruptErr(t))
		}},
		{"RunTestWatchDispatchBookmarkEvents", func(t *testing.T) {
			e := newEnv(t, setup{progress: time.Second})
			storagetesting.RunTestWatchDispatchBookmarkEvents(e.ctx, t, e.store, false)
		}},
		// Optional, and not among etcd3's own tests (the cacher's run it):
		// the store sends a bookmark only when a progress notification
		// arrives, so the server is asked for one a second.
		{"RunTestOptionalWatchBookmarksWithCorrectResourceVersion", func(t *testing.T) {
			e := newEnv(t, setup{progress: time.Second})
			storagetesting.RunTestOptionalWatchBookmarksWithCorrectResourceVersion(e.ctx, t, e.store)
		}},
		{"RunSendInitialEventsBackwardCompatibility", plain(storagetesting.RunSendInitialEventsBackwardCompatibility)},
		{"RunWatchSemantics", rangeStream(func(t *testing.T) {
			t.Run("plain", plain(storagetesting.RunWatchSemantics))
			t.Run("ConcurrentWatchObjectDecode", func(t *testing.T) {
				gate(t, features.ConcurrentWatchObjectDecode, true)
				plain(storagetesting.RunWatchSemantics)(t)
			})
		})},
		{"RunWatchSemanticInitialEventsExtended", rangeStream(plain(storagetesting.RunWatchSemanticInitialEventsExtended))},
		{"RunWatchListMatchSingle", rangeStream(plain(storagetesting.RunWatchListMatchSingle))},
		{"RunWatchErrorIsBlockingFurtherEvents", func(t *testing.T) {
			e := start(t)
			storagetesting.RunWatchErrorIsBlockingFurtherEvents(e.ctx, t, e.store)
		}},
	}
	for _, c := range tests {
		t.Run(c.name, c.run)
	}
}
