/*
 * kvd.h - embedding API of kvd, a single-file etcd v3 (gRPC) daemon.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * Everything kvd keeps lives in one opaque `struct kvd`; two instances can
 * coexist in one process.  kvd never starts threads and never installs signal
 * handlers unless you call kvd_main().  Typical embedding:
 *
 *     struct kvd_config cfg;
 *     struct kvd *k;
 *     char err[KVD_ERRLEN];
 *     kvd_config_init(&cfg);
 *     cfg.data_dir = "/var/lib/kvd";
 *     cfg.listen_client_urls = "";          -- no listener: in-process calls only
 *     if (kvd_open(&cfg, &k, err, sizeof err) != 0) { puts(err); exit(1); }
 *     kvd_put(k, "a", 1, "1", 1, 0, done, NULL);   -- done() runs once it is durable
 *     while (kvd_poll(k, -1) == 0) {}       -- or the host's loop: kvd_set_loop()
 *     kvd_close(k);
 *
 * Pointers: what kvd is given (the config and its strings, keys, values,
 * request bytes, a user name) is copied before the call returns; what kvd
 * hands a callback (struct kvd_reply, kvd_result, kvd_events and all they
 * point to) is kvd's and lives until that callback returns; a struct
 * kvd_stream lives until its last callback returns; struct kvd lives from
 * kvd_open to kvd_close.  An instance is used from one thread at a time;
 * only kvd_shutdown and kvd_reload may be called from elsewhere (another
 * thread, a signal handler).  README.md: Embedding.
 */
#ifndef KVD_H
#define KVD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* KVD_STATIC: kvd.c #included into one file, kvd_* static there.
 * KVD_BUILD_LIB: building libkvd (make lib) with -fvisibility=hidden, where
 * kvd_* alone keep default visibility. */
#ifndef KVD_API
#ifdef KVD_STATIC
#define KVD_API static
#elif defined(KVD_BUILD_LIB) && defined(__GNUC__)
#define KVD_API extern __attribute__((visibility("default")))
#else
#define KVD_API extern
#endif
#endif

#define KVD_VERSION "0.2.0"
#define KVD_VERSION_NUMBER 200 /* major*10000 + minor*100 + patch */
#define KVD_ERRLEN 256         /* size of the err buffers below */

/* Error codes: functions return 0 or one of these (negative). */
#define KVD_ENOMEM (-1)   /* allocation failed */
#define KVD_EPROTO (-2)   /* peer broke the protocol */
#define KVD_EIO (-3)      /* I/O error (read, write, fsync) */
#define KVD_EAGAIN (-4)   /* need more input */
#define KVD_EINVAL (-5)   /* bad argument or configuration */
#define KVD_ECORRUPT (-6) /* on-disk data failed a check */
#define KVD_ELIMIT (-7)   /* a configured limit was hit */
#define KVD_EBUSY (-8)    /* resource in use (port, data dir lock) */
#define KVD_ESTOPPED (-9) /* kvd_poll: graceful shutdown finished */
#define KVD_ERANGE (-10)  /* a number would leave its range (a revision, a version) */

/* kvd_main()'s exit codes: a clean stop (also --help, --version); a failure
 * at run time (data dir locked, port busy, I/O): an init system may retry;
 * a flag, an environment variable or a file they name is wrong (every flag
 * and file is checked before the data dir is touched, so nothing changed
 * unless a snapshot to restore proved corrupt; one check needs the store
 * read first: confd keyspace mode with auth on and no --confd-user): fix
 * it, do not respawn. */
#define KVD_EXIT_OK 0
#define KVD_EXIT_RUNTIME 1
#define KVD_EXIT_CONFIG 2

/* Log levels, as etcd's --log-level names them. */
enum kvd_log_level { KVD_LOG_DEBUG, KVD_LOG_INFO, KVD_LOG_WARN, KVD_LOG_ERROR };

/*
 * Configuration.  kvd_config_init() fills etcd's defaults; strings are
 * borrowed and only need to live until kvd_open() returns.  Each field names
 * the etcd-style flag kvd_main() maps onto it.
 */
struct kvd_config {
	const char *name;                        /* --name ("default") */
	const char *data_dir;                    /* --data-dir (NULL: "<name>.etcd") */
	const char *listen_client_urls;          /* --listen-client-urls, comma list; NULL or "": no listener
	                                            (in-process calls only; kvd_main refuses it) */
	const char *advertise_client_urls;       /* --advertise-client-urls */
	const char *initial_advertise_peer_urls; /* --initial-advertise-peer-urls */
	const char *initial_cluster_token;       /* --initial-cluster-token */
	const char *initial_cluster;             /* --initial-cluster: this member alone, or refused ("") */
	uint64_t etcd_ignored;                   /* etcd's flags taken and ignored (kvd_config_parse): bits of
	                                            kvd.c's cfg_etcd_only, each warned about at kvd_open */
	uint32_t max_request_bytes;              /* --max-request-bytes (1572864) */
	uint32_t max_concurrent_streams;         /* --max-concurrent-streams (256) */
	uint32_t max_connections;                /* --max-connections (256) */
	uint32_t max_connections_per_ip;         /* --max-connections-per-ip (0 = no limit) */
	uint64_t max_request_buffer;             /* --max-request-buffer: request bytes held in all (8 MiB) */
	uint32_t keepalive_min_time_ms;          /* --grpc-keepalive-min-time (5 s) */
	uint32_t idle_timeout_ms;                /* --max-idle-time, 0 = never (300 s) */
	uint32_t stall_timeout_ms;               /* --stall-timeout, 0 = never (60 s) */
	uint32_t drain_timeout_ms;               /* --shutdown-grace (5 s) */
	uint32_t warn_unary_ms;                  /* --warning-unary-request-duration: slower unary calls are
	                                            logged as etcd's "request stats" warning (300 ms) */
	int log_level;                           /* --log-level (KVD_LOG_INFO) */
	const char *log_outputs;                 /* --log-outputs ("default": stderr; stdout, syslog, a file) */
	const char *logger;                      /* --logger ("capnslog" or "zap", as etcd 3.4) */
	const char *log_format;                  /* --log-format: "" kvd's text, "json" or "console" (zap's, etcd 3.5+) */
	const char *config_file;                 /* --config-file: kvd_main reads it (kvd_config_yaml) */
	uint32_t max_txn_ops;                    /* --max-txn-ops (128) */
	uint32_t heartbeat_interval_ms;          /* --heartbeat-interval (100) */
	uint32_t election_timeout_ms;            /* --election-timeout (1000) */
	uint32_t watch_progress_notify_ms;       /* --experimental-watch-progress-notify-interval (10 min) */
	uint32_t max_watchers;                   /* --max-watchers (100000) */
	int unsafe_no_fsync;                     /* --unsafe-no-fsync (0) */
	const char *auto_compaction_mode;        /* --auto-compaction-mode ("periodic" or "revision") */
	const char *auto_compaction_retention;   /* --auto-compaction-retention ("0": off) */
	uint32_t auto_compaction_check_ms;       /* --auto-compaction-check-interval, revision mode (5 min) */
	uint64_t quota_backend_bytes;            /* --quota-backend-bytes (0: 2 GiB, as etcd) */
	int auto_rewrite;                        /* --auto-rewrite (1) */
	uint32_t auto_rewrite_percent;           /* --auto-rewrite-percent of the kept bytes (50) */
	uint64_t auto_rewrite_min_bytes;         /* --auto-rewrite-min-bytes (1 MiB) */
	uint64_t reserve_bytes;                  /* --reserve-bytes, kept for a full disk (128 KiB) */
	const char *restore_snapshot;            /* --restore-snapshot: an etcd snapshot to start from (NULL) */
	const char *replicate_from;              /* --replicate-from: etcd client URLs to follow as a replica ("") */
	int replica_read_only;                   /* --replica-read-only: a replica refuses writes, not forwards them (0) */
	const char *replicate_cacert;            /* --replicate-cacert: CAs an https:// upstream's certificate must chain to
	                                            (NULL: /etc/ssl/certs/ca-certificates.crt) */
	const char *replicate_cert;              /* --replicate-cert: kvd's client certificate for the upstream (NULL) */
	const char *replicate_key;               /* --replicate-key: its private key (NULL) */
	int replicate_insecure_skip_tls_verify;  /* --replicate-insecure-skip-tls-verify: any upstream certificate (0) */
	const char *replicate_user;              /* --replicate-user: name:password on a cluster with auth on (NULL) */
	int skip_hash_check;                     /* --skip-hash-check: with it, no SHA-256 trailer needed (0) */
	int salvage_log;                         /* --salvage-log: a log damaged mid-file keeps what precedes it (0) */
	const char *snapshot_save;               /* --snapshot-save: kvd_main writes one and exits (NULL) */
	int daemon;                              /* --daemon: kvd_main goes to the background once serving (0) */
	const char *pid_file;                    /* --pid-file: kvd_main writes its pid there once serving (NULL) */
	const char *cert_file;                   /* --cert-file: TLS certificate for https:// listeners */
	const char *key_file;                    /* --key-file */
	const char *trusted_ca_file;             /* --trusted-ca-file: CA for client certificates */
	int client_cert_auth;                    /* --client-cert-auth (0) */
	const char *client_crl_file;             /* --client-crl-file */
	const char *client_cert_allowed_hostname; /* --client-cert-allowed-hostname */
	const char *cipher_suites;               /* --cipher-suites, Go names, comma list */
	const char *tls_min_version;             /* --tls-min-version: "", TLS1.2 or TLS1.3 ("": TLS1.2) */
	const char *tls_max_version;             /* --tls-max-version: "", TLS1.2 or TLS1.3 ("": the newest) */
	const char *feature_gates;               /* --feature-gates: etcd 3.6+'s Name=bool list, checked, no effect */
	int auto_tls;                            /* --auto-tls: a self-signed certificate made at start (0) */
	const char *confd_hmac_key_file;         /* --confd-hmac-key-file (NULL: confd off) */
	const char *confd_listen;                /* --confd-listen ("127.0.0.1:1814") */
	const char *confd_ganeti_config_key;     /* --confd-ganeti-config-key (NULL: keyspace mode) */
	const char *confd_keyspace_prefix;       /* --confd-keyspace-prefix: keyspace mode's scope ("": every key) */
	const char *confd_user;                  /* --confd-user: with auth on, whose read permissions confd has */
	uint32_t confd_max_clock_skew_ms;        /* --confd-max-clock-skew (300 s; 0 = no check) */
	uint32_t confd_rate_limit;               /* --confd-rate-limit, per source (2000/s) */
	uint32_t confd_global_rate_limit;        /* --confd-global-rate-limit (100000/s) */
	int confd_replay_cache;                  /* --confd-replay-cache (1) */
	const char *auth_token;                  /* --auth-token ("simple", or "jwt,<options>") */
	uint32_t auth_token_ttl;                 /* --auth-token-ttl, seconds (300) */
	uint32_t bcrypt_cost;                    /* --bcrypt-cost (10; 4..31) */
	const char *listen_metrics_urls;         /* --listen-metrics-urls: /metrics and /health only ("") */
	int enable_grpc_gateway;                 /* --enable-grpc-gateway: JSON on /v3/ (1) */
	const char *cors;                        /* --cors: comma list of origins, "*" = any ("*") */
	/*
	 * Not flags: an embedder's.  alloc (NULL: libc's malloc, realloc, free)
	 * is this instance's allocator, realloc-like: ptr NULL allocates
	 * new_size bytes; new_size 0 frees ptr (old_size bytes) and returns
	 * NULL; else it resizes ptr from old_size to new_size bytes, contents
	 * kept.  Blocks are aligned as malloc's.  It returns NULL when it
	 * cannot, ptr left as it was: that request, call or connection fails
	 * (KVD_ENOMEM, RESOURCE_EXHAUSTED), the instance goes on.  Every block
	 * -- the struct kvd too -- goes back with the size it was given, all of
	 * them by the time kvd_close() returns.  kvd calls it with alloc_ctx,
	 * only from the thread running that instance (kvd_open, kvd_poll,
	 * kvd_close, ...; never kvd_shutdown or kvd_reload).  It sees kvd's
	 * own allocations, not libc's (stdio and directory buffers) nor
	 * mbedtls'.
	 * mbedtls_memory 1: mbedtls' allocations are counted as this
	 * instance's (where mbedtls has MBEDTLS_PLATFORM_MEMORY), through a
	 * process-wide hook (mbedtls_platform_set_calloc_free) that replaces
	 * the allocator of any other mbedtls user in the process; the blocks
	 * still come from libc, as they may outlive the instance.  0 (the
	 * default; kvd_main sets 1): mbedtls keeps its own allocator and its
	 * blocks are not counted.
	 */
	void *(*alloc)(void *ctx, void *ptr, size_t old_size, size_t new_size);
	void *alloc_ctx;                         /* alloc's first argument */
	int mbedtls_memory;                      /* mbedtls' allocations through kvd (0) */
};

struct kvd;

/* Fill cfg with the defaults listed above. */
KVD_API void kvd_config_init(struct kvd_config *cfg);

/*
 * etcd 3.4's YAML configuration file (--config-file): text[0..len) parsed
 * into cfg; strings are copied into store (cap >= len + 1), which must live
 * until kvd_open() returns.  0, or KVD_EINVAL with "line N: why" in err.
 */
KVD_API int kvd_config_yaml(struct kvd_config *cfg, const char *text, size_t len, char *store, size_t cap,
                            char *err, size_t errlen);

/*
 * Parse etcd-style command-line flags (argv[0] is skipped) into cfg; strings
 * point into argv.  Returns 0, 1 when --version or --help was handled (text
 * written to err), or KVD_EINVAL with a one-line message in err.
 */
KVD_API int kvd_config_parse(struct kvd_config *cfg, int argc, char **argv,
                             char *err, size_t errlen);

/*
 * Create an instance: lock the data dir, bind the listeners (if any).  On
 * failure returns a negative code, *out is NULL and err holds one line.
 */
KVD_API int kvd_open(const struct kvd_config *cfg, struct kvd **out,
                     char *err, size_t errlen);

/*
 * Run one loop iteration: wait up to timeout_ms (-1: until something happens)
 * and handle what is ready.  Returns 0, KVD_ESTOPPED once a graceful
 * shutdown has finished (and no in-process call is left), or KVD_EBUSY
 * from inside a kvd callback.
 */
KVD_API int kvd_poll(struct kvd *k, int timeout_ms);

/* Begin a graceful shutdown (GOAWAY, finish calls); safe to call repeatedly. */
KVD_API void kvd_shutdown(struct kvd *k);

/* Re-read the confd key file (what SIGHUP does in kvd_main); async-signal-safe. */
KVD_API void kvd_reload(struct kvd *k);

/*
 * Release everything; NULL is accepted.  In-process calls still open end
 * here, each with its last callback (UNAVAILABLE "etcdserver: server
 * stopped", or the answer it already had), run inside kvd_close; in a
 * registered loop every descriptor is announced gone (io(fd, 0)) before
 * it is closed.  From inside a kvd callback it closes nothing and returns
 * KVD_EBUSY; otherwise 0.
 */
KVD_API int kvd_close(struct kvd *k);

/*
 * ---- Driving kvd from the host's event loop ----
 *
 * kvd_poll is one driver; a host with its own loop uses one of two others,
 * never two at once.  kvd needs: some descriptors watched (its listeners,
 * connections, confd sockets and one wake-up pipe, which is always there,
 * even with no listener), one timer, and to be called when either fires.
 * Readiness is level-triggered unless the host says KVD_LOOP_EDGE.  Work
 * kvd was given (a readable socket, an in-process call) is finished on a
 * later turn, so that one group commit (one fdatasync) covers everything a
 * turn of the host's loop brought: kvd asks for that turn with a timeout
 * of 0.  kvd never busy-loops a level-triggered host: it asks for KVD_OUT
 * only while it has output queued, drops KVD_IN while it will not read
 * (output backed up, a paused listener), and asks for a timeout of 0 only
 * with work pending.
 *
 * Pull, as poll(2) hosts do: each turn kvd_pollfds fills fds[0..n) (n is
 * returned; when n > cap call again with more room: nothing was filled)
 * and the ms until kvd must run again (-1: only when a descriptor fires);
 * the host polls them with its own, then hands the same entries, revents
 * set, to kvd_process.  kvd_pollfds first runs what is due (timers, the
 * group commit, callbacks).  kvd_pollfds returns n, kvd_process 0; either
 * returns KVD_ESTOPPED once a graceful shutdown has finished, or KVD_EBUSY
 * from inside a kvd callback.
 */
#define KVD_IN 1u  /* readable (host -> kvd), or watch for it (kvd -> host) */
#define KVD_OUT 2u /* writable, or watch for it */
#define KVD_ERR 4u /* host -> kvd: an error or hang-up (POLLERR, POLLHUP, EPOLLRDHUP) */
struct pollfd;
KVD_API int kvd_pollfds(struct kvd *k, struct pollfd *fds, int cap, int *timeout_ms);
KVD_API int kvd_process(struct kvd *k, const struct pollfd *fds, int n);

/*
 * Registration, as libev, libuv, sd-event and uloop hosts do: kvd tells
 * the host what to watch through two callbacks, and the host reports what
 * fired.  io(host, fd, events, slot): watch fd for events (KVD_IN|KVD_OUT;
 * a later call for the same fd changes them); events 0: stop watching it
 * -- kvd says so before it closes fd, and the host should then drop what
 * it keeps for it.  *slot is the host's own pointer for fd (NULL at first,
 * kept by kvd until events 0), e.g. its watcher.  io returns 0, or
 * nonzero if it could not: kvd closes that connection (a listener or
 * socket of kvd's own is tried again 100 ms later).  timer(host, ms): call
 * kvd_timeout in ms milliseconds (on the monotonic clock; 0: at the next
 * turn; -1: no timer), replacing the previous one; a timer that fired
 * is spent (kvd asks again if it needs one); early or late is harmless.  io and timer must not call kvd.  kvd calls them only from
 * inside kvd_set_loop, kvd_io, kvd_timeout, kvd_call and the other
 * in-process entries, and kvd_close.  kvd_io: fd became ready (KVD_IN,
 * KVD_OUT, KVD_ERR); kvd_timeout: the timer fired.  Both return as
 * kvd_process does.  With KVD_LOOP_EDGE kvd reads each readable descriptor
 * until the kernel says it is empty, over as many turns as it takes.
 */
#define KVD_LOOP_EDGE 1u
struct kvd_loop {
	void *host;     /* handed back to io and timer */
	unsigned flags; /* KVD_LOOP_EDGE: the host's readiness is edge-triggered */
	int (*io)(void *host, int fd, unsigned events, void **slot);
	void (*timer)(void *host, long ms);
};
/* Set once, after kvd_open, before any other call; the struct is copied. */
KVD_API int kvd_set_loop(struct kvd *k, const struct kvd_loop *loop);
KVD_API int kvd_io(struct kvd *k, int fd, unsigned revents);
KVD_API int kvd_timeout(struct kvd *k);

/*
 * ---- In-process calls: every RPC, without a socket ----
 *
 * kvd_call runs one RPC of etcd's API (method as gRPC names it:
 * "/etcdserverpb.KV/Range") through the same handlers, permission checks,
 * group commit, error codes and texts as a call over gRPC.  req is one
 * request message, protobuf-encoded (NULL, 0: an empty message; for a
 * bidi stream -- Watch, LeaseKeepAlive -- NULL sends nothing yet); it is
 * copied.  Answers come to fn, never from inside kvd_call: once per
 * response message, then once with last set, the call's gRPC code (0: OK)
 * and etcd's text.  A write's answer comes after the fdatasync that made
 * it durable (with --unsafe-no-fsync: after it was written).  A host that
 * does not turn its loop gets no callbacks.
 *
 * The call acts as opts->user, or the instance's caller (kvd_set_caller),
 * else as root: with auth on, that user's permissions are checked, as for
 * a client certificate naming it; an unknown user is refused as etcd
 * refuses one.  opts->timeout_ms > 0 ends the call DEADLINE_EXCEEDED after
 * that long.  KVD_CALL_DECODE: kvd also hands each response decoded, as
 * the method's protobuf-c message (reply->msg; protobuf-c's headers and
 * the proto/ directory's .pb-c.h files name the types).
 *
 * Lifetimes: everything a kvd_reply points to is kvd's and lives until fn
 * returns; copy what you keep.  The stream handle (*out, may be NULL) is
 * valid from kvd_call's return until the callback with last set returns.
 * fn may call kvd again: start calls, send on or cancel any stream
 * (its own too), kvd_shutdown; kvd_poll, kvd_process, kvd_io, kvd_timeout
 * and kvd_close return KVD_EBUSY there.  fn returns 0, or KVD_PAUSE to get
 * no more messages of this stream until kvd_stream_pause(s, 0) (a paused
 * watch catches up from the log later, as a slow network watcher does).
 * fn runs inside kvd's turn: a slow fn delays every client.
 *
 * kvd_call returns 0 (fn will be called, exactly once with last set), or a
 * negative code and fn is never called: KVD_EINVAL (no fn or method),
 * KVD_ENOMEM, KVD_ESTOPPED (shutting down), KVD_EBUSY (inside kvd_close).
 * An unknown method is not an error here: its last callback says
 * UNIMPLEMENTED, as gRPC does.
 */
#define KVD_PAUSE 1        /* fn's return: hold this stream's messages */
#define KVD_CALL_DECODE 1u /* kvd_call_opts.flags: reply->msg too */
struct kvd_stream;
struct ProtobufCMessage;
struct kvd_call_opts {
	const char *user;   /* act as this user (NULL: the instance's caller; "" is nobody) */
	long timeout_ms;    /* > 0: DEADLINE_EXCEEDED after this long */
	unsigned flags;     /* KVD_CALL_DECODE */
};
struct kvd_reply {
	struct kvd_stream *stream;
	const void *data; /* one response message, encoded (NULL on the last callback) */
	size_t len;
	const struct ProtobufCMessage *msg; /* the same, decoded (KVD_CALL_DECODE), else NULL */
	int last;         /* 1: the call ended; code and text say how */
	int code;         /* gRPC status code: 0 OK, 1 CANCELLED, 4 DEADLINE_EXCEEDED, ... */
	const char *text; /* etcd's text ("" for OK) */
};
typedef int kvd_reply_fn(void *arg, const struct kvd_reply *reply);
KVD_API int kvd_call(struct kvd *k, const char *method, const void *req, size_t len, const struct kvd_call_opts *opts,
                     kvd_reply_fn *fn, void *arg, struct kvd_stream **out);
/* The same with a protobuf-c request message, which kvd encodes. */
KVD_API int kvd_call_msg(struct kvd *k, const char *method, const struct ProtobufCMessage *req,
                         const struct kvd_call_opts *opts, kvd_reply_fn *fn, void *arg, struct kvd_stream **out);
/* One more request on a bidi stream (Watch: a WatchRequest; LeaseKeepAlive:
 * a LeaseKeepAliveRequest); 0, or KVD_EINVAL once the stream ended. */
KVD_API int kvd_stream_send(struct kvd_stream *s, const void *req, size_t len);
KVD_API int kvd_stream_send_msg(struct kvd_stream *s, const struct ProtobufCMessage *req);
/* Nothing more will be sent (gRPC's half-close); 0 or KVD_EINVAL. */
KVD_API int kvd_stream_close_send(struct kvd_stream *s);
/* Hold (1) or resume (0) this stream's messages; 0 or KVD_EINVAL. */
KVD_API int kvd_stream_pause(struct kvd_stream *s, int paused);
/* End the call: no message after this returns, then its last callback
 * (CANCELLED "context canceled" unless it had ended already). */
KVD_API void kvd_stream_cancel(struct kvd_stream *s);
/* Who in-process calls act as when their opts name nobody (NULL: root);
 * copied.  0 or KVD_ENOMEM. */
KVD_API int kvd_set_caller(struct kvd *k, const char *user);

/*
 * ---- The common calls, typed ----
 *
 * Built on kvd_call (the same path inside): each sends one request as the
 * instance's caller and calls fn once with the result, whose pointers live
 * until fn returns.  Each returns as kvd_call does.
 */
struct kvd_kv {
	const void *key, *value;
	size_t key_len, value_len;
	int64_t create_revision, mod_revision, version, lease;
};
struct kvd_result {
	int code;                 /* gRPC code, 0: OK */
	const char *text;         /* etcd's text ("" for OK) */
	int64_t revision;         /* the store's revision the answer saw */
	const struct kvd_kv *kvs; /* get: the keys; put, delete: the previous ones;
	                             cas: the key as it is when the compare failed */
	size_t count;             /* entries in kvs */
	int64_t total;            /* get: keys in the range; delete: keys deleted */
	int more;                 /* get: more keys than limit */
	int succeeded;            /* cas: 1 when it wrote */
	int64_t lease, ttl;       /* lease calls: the id and its TTL (keep-alive: 0, the lease is gone) */
};
typedef void kvd_result_fn(void *arg, const struct kvd_result *r);
/* One key (rev 0: the newest revision). */
KVD_API int kvd_get(struct kvd *k, const void *key, size_t klen, int64_t rev, kvd_result_fn *fn, void *arg);
/* Every key that starts with prefix (plen 0: every key), at most limit (0: all). */
KVD_API int kvd_get_prefix(struct kvd *k, const void *prefix, size_t plen, int64_t rev, int64_t limit,
                           kvd_result_fn *fn, void *arg);
/* Put (lease 0: none); the previous key comes back in kvs. */
KVD_API int kvd_put(struct kvd *k, const void *key, size_t klen, const void *val, size_t vlen, int64_t lease,
                    kvd_result_fn *fn, void *arg);
/* Delete one key; the deleted key comes back in kvs, total says 0 or 1. */
KVD_API int kvd_delete(struct kvd *k, const void *key, size_t klen, kvd_result_fn *fn, void *arg);
/* Compare and swap: put val if the key's mod_revision is mod_revision
 * (0: if the key does not exist), as one Txn; succeeded says which. */
KVD_API int kvd_cas(struct kvd *k, const void *key, size_t klen, int64_t mod_revision, const void *val, size_t vlen,
                    kvd_result_fn *fn, void *arg);
/* Leases: grant (id 0: kvd picks one), one keep-alive, revoke. */
KVD_API int kvd_lease_grant(struct kvd *k, int64_t ttl, int64_t id, kvd_result_fn *fn, void *arg);
KVD_API int kvd_lease_keepalive(struct kvd *k, int64_t id, kvd_result_fn *fn, void *arg);
KVD_API int kvd_lease_revoke(struct kvd *k, int64_t id, kvd_result_fn *fn, void *arg);

/*
 * Watch key (KVD_WATCH_PREFIX: every key that starts with it) from
 * start_rev (0: changes after now).  fn gets one call per batch of events
 * -- whole revisions, in order, each event once -- and progress
 * notifications (count 0, progress 1), then one call with last set: the
 * watch was cancelled (kvd_stream_cancel), compacted (code 0,
 * compact_revision set: start_rev is gone), refused, or kvd stopped.  fn
 * returns 0 or KVD_PAUSE, as a kvd_reply_fn.
 */
#define KVD_WATCH_PREFIX 1u   /* every key with this prefix */
#define KVD_WATCH_PREV_KV 2u  /* events carry the key as it was before */
#define KVD_WATCH_PROGRESS 4u /* progress notifications (--experimental-watch-progress-notify-interval) */
#define KVD_EVENT_PUT 0
#define KVD_EVENT_DELETE 1
struct kvd_event {
	int type;                  /* KVD_EVENT_PUT or KVD_EVENT_DELETE */
	struct kvd_kv kv;          /* a delete: key and mod_revision only */
	const struct kvd_kv *prev; /* KVD_WATCH_PREV_KV: the key before, or NULL */
};
struct kvd_events {
	const struct kvd_event *ev;
	size_t count;
	int64_t revision;         /* the store's revision when the batch was sent */
	int progress;             /* a progress notification: every event up to revision was sent */
	int64_t compact_revision; /* the watch was cancelled: its start was compacted */
	int last;                 /* 1: the watch ended; code and text say why */
	int code;
	const char *text;
};
typedef int kvd_watch_fn(void *arg, const struct kvd_events *e);
KVD_API int kvd_watch(struct kvd *k, const void *key, size_t klen, int64_t start_rev, unsigned flags,
                      kvd_watch_fn *fn, void *arg, struct kvd_stream **out);
/* Ask a watch for a progress notification now; 0 or KVD_EINVAL. */
KVD_API int kvd_watch_progress(struct kvd_stream *s);

/* An etcd snapshot (bbolt, SHA-256 trailer) written to fd as it streams;
 * fn gets its revision, or the error.  fd is the host's: kvd writes to it
 * (blocking writes on a blocking fd) and never closes it. */
KVD_API int kvd_snapshot(struct kvd *k, int fd, kvd_result_fn *fn, void *arg);

/* Send log lines to fn instead of stderr (fn NULL restores stderr). */
typedef void kvd_log_fn(void *arg, int level, const char *line);
KVD_API void kvd_set_log(struct kvd *k, kvd_log_fn *fn, void *arg);

/* Name of an error code, e.g. "out of memory". */
KVD_API const char *kvd_strerror(int err);

/* Build options compiled in, e.g. "max-conns=256 ..." (also in --version). */
KVD_API const char *kvd_build_options(void);

/*
 * The whole daemon: flags, signals (SIGTERM/SIGINT: graceful shutdown), loop.
 * Returns the process exit code (0 clean, 1 runtime failure, 2 bad usage).
 */
KVD_API int kvd_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif /* KVD_H */
