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
 *     if (kvd_open(&cfg, &k, err, sizeof err) != 0) { puts(err); exit(1); }
 *     while (kvd_poll(k, -1) == 0) {}       -- or kvd_shutdown() from elsewhere
 *     kvd_close(k);
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

#define KVD_VERSION "0.1.0"
#define KVD_VERSION_NUMBER 100 /* major*10000 + minor*100 + patch */
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
	const char *listen_client_urls;          /* --listen-client-urls, comma list */
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
 * Create an instance: lock the data dir, bind the listeners.  On failure
 * returns a negative code, *out is NULL and err holds one line.
 */
KVD_API int kvd_open(const struct kvd_config *cfg, struct kvd **out,
                     char *err, size_t errlen);

/*
 * Run one loop iteration: wait up to timeout_ms (-1: until something happens)
 * and handle what is ready.  Returns 0, or KVD_ESTOPPED once a graceful
 * shutdown has finished.
 */
KVD_API int kvd_poll(struct kvd *k, int timeout_ms);

/* Begin a graceful shutdown (GOAWAY, finish calls); safe to call repeatedly. */
KVD_API void kvd_shutdown(struct kvd *k);

/* Re-read the confd key file (what SIGHUP does in kvd_main); async-signal-safe. */
KVD_API void kvd_reload(struct kvd *k);

/* Release everything; NULL is accepted. */
KVD_API void kvd_close(struct kvd *k);

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
