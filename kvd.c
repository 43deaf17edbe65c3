/*
 * kvd.c - an etcd v3 (gRPC) key-value daemon in one C file, for routers and boards.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * Build:  make        or        cc -O2 kvd.c -lprotobuf-c -lmbedtls -lmbedx509 -lmbedcrypto -o kvd
 * (the generated proto/ files are committed and #included below.)
 *
 * TABLE OF CONTENTS, an index: every section and, under it, its sub-banners;
 * `make toc` checks it against them (and `make toc-write` rewrites it).
 *    0. Build knobs (KVD_*)             -- search for "@@" to find every knob
 *    1. Includes and portability
 *    2. Types, limits, shared declarations
 *    3. Utilities: memory, log, bytes, clock, shares (util_, get_, put_, varint_, utf8_, bucket_, share_)
 *          - growing arrays
 *          - clocks, base64
 *          - the log: levels and outputs
 *          - bytes: byte order, varints, UTF-8
 *          - the loop's wake-up, SHA-1, rate buckets
 *          - fair shares
 *    4. Byte buffers (buf_)
 *    5. Protobuf glue: requests checked, the wire written by hand (pb_)
 *          - the wire, written by hand
 *    6. JSON: a strict reader, a writer (json_)
 *          - writing
 *    7. JSON <-> protobuf, as etcd's gateway maps them (json_)
 *          - JSON out
 *          - JSON in: encoding/json's Decoder
 *          - JSON in: protojson
 *    8. Calls: one RPC, whatever carries it (call_, svc_fail)
 *    9. MVCC store: the log, its format and grammar (mvcc_)
 *          - reading
 *          - the log's grammar: the one decoder every reader uses
 *   10. MVCC store: the index, writing, group commit, recovery (mvcc_)
 *          - key records: slabs by size class
 *          - key records: their numbers, the side table
 *          - writing
 *          - recovery
 *   11. Leases (lease_)
 *          - attached keys
 *          - the timer wheel
 *          - the table
 *          - grant, renew, revoke
 *          - recovery and shutdown
 *   12. Auth store: users, roles, permissions, bcrypt (auth_)
 *          - bcrypt
 *          - users and roles
 *   13. Store lifecycle: rewrite, compaction, quota, alarms (life_)
 *          - the reserve
 *          - alarms
 *          - the rewrite
 *          - auto-compaction (etcd 3.4's v3compactor)
 *          - the loop's part
 *   14. etcd's backend: snapshots written, Hash, HashKV (snap_)
 *          - the key bucket: etcd's records, read from the log
 *          - bbolt pages
 *          - the plan: buckets, leaves, branch levels
 *          - page images
 *          - the stream
 *   15. etcd's backend: snapshots read and imported (snap_)
 *   16. HPACK (hp_)
 *   17. HTTP/2 frames, streams, flow control (h2_)
 *   18. gRPC over HTTP/2: the h2 stream as a carrier (grpc_)
 *   19. Auth: tokens, who is calling, and may they; password hashing (auth_)
 *          - JSON Web Tokens (--auth-token jwt,...)
 *          - who is calling, and may they
 *          - password hashes, off the handlers' path
 *   20. Go's sort.Sort, as etcd sorts ranges (svc_gosort_)
 *   21. Services: KV (svc_)
 *          - ranges
 *          - txn machinery shared by Put, DeleteRange and Txn
 *          - Txn
 *          - handlers
 *          - RangeStream: chunks produced as the client's window opens
 *   22. Services: Lease (svc_lease_)
 *   23. Services: Auth (svc_auth_, auth_)
 *   24. Services: Maintenance, Health (svc_)
 *   25. Services: Cluster, one member for good (svc_)
 *   26. Lock and Election: etcd's concurrency recipes, served (lock_)
 *          - Observe
 *          - the RPCs
 *   27. Watch (watch_)
 *          - records to events
 *          - live events: a durable batch
 *          - catch-up from the log
 *          - the Watch RPC
 *   28. The method table: every RPC, routed by :path (svc_)
 *   29. confd: Ganeti's UDP query protocol, keyspace mode (confd_)
 *          - HMAC-SHA1 (RFC 2104), keyed once
 *          - the key file
 *          - abuse controls
 *          - request parsing (strict, as Ganeti's)
 *          - replies
 *          - keyspace mode
 *   30. confd: Ganeti mode, datagrams, setup (confd_)
 *          - Ganeti mode: lookups as Ganeti.Utils.lookupName does them
 *          - Ganeti mode: the queries
 *          - Ganeti mode: one function per query type
 *          - one datagram
 *          - setup
 *   31. TLS: a transport under any protocol (tls_)
 *          - the transport
 *   32. HTTP requests and answers, HTTP/1.x or HTTP/2 (http1_, http_)
 *   33. The JSON gateway: POST /v3/<service>/<method> (gw_)
 *   34. HTTP endpoints: /health, /version, /metrics (http1_, http_)
 *          - the endpoints
 *          - the same requests on HTTP/2 streams
 *   35. Sockets and the poll loop (net_, loop_)
 *          - transports: how a connection's bytes move
 *          - choosing a protocol from the first bytes
 *          - connections
 *          - systemd's notify protocol, without libsystemd
 *          - the loop
 *   36. Flags and configuration (cfg_)
 *   37. Public embedding API (kvd_)
 *   38. main()
 *
 * Prefixes mark the section a static function belongs to; only kvd_* (and the
 * generated protobuf-c symbols) are exported.  Functions return 0 or a
 * negative KVD_E* code unless their comment says otherwise.
 *
 * Data flow: socket -> connection (its transport; its protocol chosen from
 * its first bytes) -> h2 frames -> streams -> calls -> service, or HTTP/1.1
 * requests -> a gateway call (JSON <-> protobuf) -> the same service.  A
 * service sees only its call: it queues messages and a status on it, and
 * the carrier (an h2 stream for gRPC, the connection for the gateway) sends
 * them as the peer's flow-control windows allow.  The log has one owner
 * (section 9); every reader of it goes through its grammar.  Each data
 * format has one owner: the log (9), the protobuf wire written by hand
 * (5), JSON text (6) and its mapping to protobuf (7),
 * bbolt's pages (14), HPACK (16), gRPC's message prefix (8).
 * A section uses what comes before it; where it reaches forward -- the log
 * replaying leases and auth records, HTTP/2 handing frames to its gRPC
 * carrier, carriers routing through the method table -- a prototype in
 * section 2 or at the end of section 5 says so.
 *
 * WHERE IS ... the main paths, as the functions a reader follows (`make toc`
 * checks that each is defined in the section its § names):
 *   - a durable write: h2_on_data §17 > grpc_on_data §18 > call_message §8 >
 *     svc_put_rpc §21 > mvcc_put §10 > call_finish §8 (the reply held: call_hold §8)
 *     > loop_log_flush §35 > mvcc_flush §10 (pwrite, fdatasync) > the reply released
 *     > h2_stream_send §17 > net_write §35
 *   - a read: grpc_on_data §18 > call_message §8 > svc_range_rpc §21 > svc_range §21
 *     (mvcc_seek §10, mvcc_visible §9) > svc_kvs §21 (mvcc_pread §9) > call_reply §8
 *     > h2_stream_send §17
 *   - a watch event, commit to socket: mvcc_txn_end §10 > loop_log_flush §35 >
 *     mvcc_flush §10 > watch_batch §27 > watch_live_record §27 > watch_match §27 >
 *     watch_emit_live §27 > h2_stream_send §17
 *   - a permission check: svc_range_rpc §21 > auth_who §19 (auth_tok_find §19,
 *     auth_jwt_check §19, tls_peer_cn §31) > auth_may §19 > auth_covers §19; for a
 *     Watch: watch_create §27 > auth_who §19 > auth_may §19 > auth_watch_reason §19
 *   - a TLS handshake: net_accept §35 > tls_accept §31 > net_read §35 > tls_recv §31
 *     > tls_step §31 > net_input §35 > net_sniff §35 > h2_conn_new §17
 *   - a gateway request: net_sniff §35 > http1_input_step §34 > http1_route §34 >
 *     gw_begin §33 > gw_deliver §33 > json_pj_decode §7 > call_message §8 > the
 *     service > gw_flush §33 (gw_message_json §33)
 *   - a confd query: confd_read §30 > confd_handle §30 > confd_hmac §29 >
 *     confd_parse_request §29 > confd_keyspace §29 or confd_ganeti §30 > confd_sign §29
 *   - a log rewrite: svc_defrag §24 > life_step §13 > life_rw_start §13 >
 *     life_rw_step §13 > life_rw_copy §13 > life_rw_write §13 > life_rw_switch §13
 *     > life_rw_end §13 (svc_defrag_answer §24)
 *   - a snapshot import: kvd_open §37 > snap_restore §15 > snap_import_mem §15 >
 *     snap_file_open §15 > snap_file_walk §15 > snap_imp_key §15 > snap_imp_apply §15
 *     > snap_imp_write §15
 *   - a snapshot export: svc_snapshot_rpc §24 > svc_snapshot_produce §24 >
 *     snap_produce §14 > snap_chunk §14 > snap_plan §14 > snap_next_node §14 > call_send §8
 */

/* ===== 0. Build knobs (KVD_*) ============================================ */

/*
 * Compile-time knobs: the defaults of run-time flags, and the caps no flag
 * sets.  A firmware tree pins them with -DKVD_X=... or with a file of
 * #defines named by KVD_CONFIG_FILE, included before any of them.  The
 * knobs every part of the daemon shares are here; a knob only one section
 * reads sits at the top of that section (the allocator, txn nesting,
 * leases, auth, watch, confd, TLS), under the same rules.
 *
 * Invariants:
 *   1. Every knob is #ifndef-guarded, so a value given from outside wins,
 *      and its #ifndef line carries "@@" and says what it bounds: `grep -n
 *      @@ kvd.c` lists them all.  Nothing else checks this: a new knob
 *      keeps both marks.
 */

#ifdef KVD_CONFIG_FILE
#include KVD_CONFIG_FILE /* @@ a firmware tree can pin knobs here */
#endif

#if defined(KVD_NO_AUTH) && !defined(KVD_NO_JWT)
#define KVD_NO_JWT /* no auth, no tokens of either kind */
#endif

#ifndef KVD_TEST_BUG /* @@ a planted bug (1-6) the robustness checker must catch: test builds only */
#define KVD_TEST_BUG 0
#endif
#if KVD_TEST_BUG && !defined KVD_TEST_SERVICES
#error "KVD_TEST_BUG plants a bug: only in a test build (-DKVD_TEST_SERVICES)"
#endif
#ifndef KVD_DEFAULT_MAX_CONNECTIONS /* @@ --max-connections default */
#define KVD_DEFAULT_MAX_CONNECTIONS 256
#endif
#ifndef KVD_DEFAULT_MAX_CONNS_PER_IP /* @@ --max-connections-per-ip default (0: none, as etcd; fair shares instead) */
#define KVD_DEFAULT_MAX_CONNS_PER_IP 0
#endif
#ifndef KVD_DEFAULT_MAX_INPUT /* @@ --max-request-buffer default: request bytes held in all */
#define KVD_DEFAULT_MAX_INPUT (8 * 1024 * 1024)
#endif
#ifndef KVD_DEFAULT_MAX_STREAMS /* @@ --max-concurrent-streams default (etcd: 2^32-1) */
#define KVD_DEFAULT_MAX_STREAMS 256
#endif
#ifndef KVD_DEFAULT_MAX_REQUEST /* @@ --max-request-bytes default, as etcd */
#define KVD_DEFAULT_MAX_REQUEST 1572864
#endif
#ifndef KVD_GRPC_RECV_SLACK /* @@ gRPC receive cap = max request + this, as etcd */
#define KVD_GRPC_RECV_SLACK 524288
#endif
#ifndef KVD_MAX_HEADER_LIST /* @@ SETTINGS_MAX_HEADER_LIST_SIZE, enforced while decoding */
#define KVD_MAX_HEADER_LIST 16384
#endif
#ifndef KVD_MAX_HEADER_FIELDS /* @@ header fields per request (gRPC sends ~10) */
#define KVD_MAX_HEADER_FIELDS 64
#endif
#ifndef KVD_MAX_HEADER_BLOCK /* @@ HEADERS + CONTINUATION bytes of one block */
#define KVD_MAX_HEADER_BLOCK 32768
#endif
#ifndef KVD_MAX_CONTINUATIONS /* @@ CONTINUATION frames per header block */
#define KVD_MAX_CONTINUATIONS 16
#endif
#ifndef KVD_MAX_OUTPUT /* @@ queued output per connection before kvd stops reading */
#define KVD_MAX_OUTPUT (256 * 1024)
#endif
#ifndef KVD_MAX_CONN_INPUT /* @@ request bytes granted to large messages per connection */
#define KVD_MAX_CONN_INPUT (4 * 1024 * 1024)
#endif
#ifndef KVD_CONN_WINDOW /* @@ connection receive window granted to clients */
#define KVD_CONN_WINDOW (1024 * 1024)
#endif
#ifndef KVD_STREAM_WINDOW /* @@ initial stream receive window (65535 = nothing sent) */
#define KVD_STREAM_WINDOW 65535
#endif
#ifndef KVD_RST_RATE /* @@ client RST_STREAMs per second (Rapid Reset), burst x2 */
#define KVD_RST_RATE 100
#endif
#ifndef KVD_RST_YOUNG_MS /* @@ only resets of streams younger than this count toward KVD_RST_RATE */
#define KVD_RST_YOUNG_MS 100
#endif
#ifndef KVD_GLITCH_RATE /* @@ protocol glitches per second before GOAWAY, burst x10 */
#define KVD_GLITCH_RATE 100
#endif
#ifndef KVD_PING_STRIKES /* @@ pings too close together before too_many_pings */
#define KVD_PING_STRIKES 2
#endif
#ifndef KVD_MAX_SETTINGS /* @@ entries in one SETTINGS frame */
#define KVD_MAX_SETTINGS 64
#endif
#ifndef KVD_PREFACE_TIMEOUT_MS /* @@ time to send the HTTP/2 preface */
#define KVD_PREFACE_TIMEOUT_MS 10000
#endif
#ifndef KVD_DEFAULT_IDLE_MS /* @@ --max-idle-time default: no streams, no frames */
#define KVD_DEFAULT_IDLE_MS 300000
#endif
#ifndef KVD_DEFAULT_STALL_MS /* @@ --stall-timeout default: output blocked by a zero window */
#define KVD_DEFAULT_STALL_MS 60000
#endif
#ifndef KVD_DEFAULT_DRAIN_MS /* @@ --shutdown-grace default */
#define KVD_DEFAULT_DRAIN_MS 5000
#endif
#ifndef KVD_MAX_REFUSING /* @@ refused connections kept at once to answer in their own protocol */
#define KVD_MAX_REFUSING 32
#endif
#ifndef KVD_REFUSE_WAIT_MS /* @@ how long a refused connection may take to say what it speaks */
#define KVD_REFUSE_WAIT_MS 1000
#endif
#ifndef KVD_STOP_LINGER_MS /* @@ while stopping: how long a closed connection waits for the peer's FIN */
#define KVD_STOP_LINGER_MS 200
#endif
#ifndef KVD_ACCEPTS_PER_TICK /* @@ accept() calls per loop iteration */
#define KVD_ACCEPTS_PER_TICK 64
#endif
#ifndef KVD_ETCD_VERSION /* @@ etcd version kvd reports (the API level it follows; strict X.Y.Z) */
#define KVD_ETCD_VERSION "3.7.3"
#endif
#ifndef KVD_ETCD_CLUSTER /* @@ its cluster and storage version: major.minor.0, as etcd's */
#define KVD_ETCD_CLUSTER "3.7.0"
#endif

/* ===== 1. Includes and portability ======================================= */

/*
 * What kvd is built on: POSIX.1-2008 and flock(), mbedtls (TLS unless
 * KVD_NO_TLS; SHA-2, HMAC and public keys for snapshots and JWTs -- SHA-1
 * is kvd's own, section 3) and protobuf-c; then the
 * macros every section uses -- KVD_ALWAYS and KVD_NEVER, the invariants
 * that run, and KVD_MIN, KVD_MAX, KVD_COUNT.
 *
 * Invariants:
 *   1. The only libraries are libc, mbedtls and protobuf-c; without TLS
 *      (KVD_NO_TLS, make TLS=0) the TLS and X.509 headers are left out and
 *      only mbedcrypto is linked (make notls checks it; make buildline builds
 *      the one-line build of the file's header as given).
 *   2. The feature macros come before the first system header, so a 32-bit
 *      target gets 64-bit file offsets (logs past 2 GiB) and time_t (past
 *      2038) -- make cross builds and tests two (mips, armhf).
 */

#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* flock(), and POSIX.1-2008 */
#endif
#ifndef _FILE_OFFSET_BITS
#define _FILE_OFFSET_BITS 64 /* logs past 2 GiB on 32-bit targets */
#endif
#ifndef _TIME_BITS
#define _TIME_BITS 64 /* 32-bit glibc: past 2038 (musl's time_t is 64-bit already) */
#endif
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mbedtls/sha256.h>
#include <mbedtls/asn1.h>
#include <mbedtls/asn1write.h>
#include <mbedtls/md.h>
#include <mbedtls/pk.h>
#include <mbedtls/rsa.h>
#include <mbedtls/version.h>
#if MBEDTLS_VERSION_MAJOR >= 3 && !defined(MBEDTLS_SSL_DTLS_CONNECTION_ID_COMPAT)
#define MBEDTLS_SSL_DTLS_CONNECTION_ID_COMPAT 0 /* 3.6's ssl.h tests it with #if, DTLS or not */
#endif
#include <mbedtls/platform.h>
#ifndef KVD_NO_TLS /* @@ define to build without TLS (no https:// listeners; links only mbedcrypto) */
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/net_sockets.h>
#include <mbedtls/oid.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crl.h>
#include <mbedtls/x509_crt.h>
#if defined(MBEDTLS_SSL_PROTO_TLS1_3)
#include <psa/crypto.h> /* TLS 1.3 runs on PSA, which must be started */
#endif
#endif
#include <protobuf-c/protobuf-c.h>

#include "kvd.h"

#if defined(__GNUC__)
#define KVD_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define KVD_UNUSED __attribute__((unused))
#else
#define KVD_PRINTF(a, b)
#define KVD_UNUSED
#endif

/* KVD_RESIDENT marks the code a start (open, replay) and an idle turn of the
 * loop run, so that it lies together in .text.hot.kvd, which GNU ld's
 * default script places ahead of the rest of .text (elsewhere it is only a
 * section name).  The kernel maps a binary's text around
 * each page first touched, 64 KB at a time (fault-around), so an idle kvd's
 * RSS follows how many 64 KB windows that code spans, not its bytes: spread
 * through the static x86_64 binary it touched every one, about 560 KiB fresh
 * and 660 KiB restarted on a small store; together (protobuf-c linked last,
 * next to libc), 430 and 470 KiB.  Serving maps the rest as requests need it.  A
 * missing or stale mark only costs memory; test/memory.py idle_rss holds the
 * static binary under 512 KiB. */
#if defined(__GNUC__) && defined(__ELF__)
#define KVD_RESIDENT __attribute__((section(".text.hot.kvd")))
#else
#define KVD_RESIDENT
#endif

/* Invariants that run: KVD_ALWAYS(x) is x, and KVD_NEVER(x) is x, in every
 * build -- code goes on sensibly either way -- and a debug build (the tests'
 * kvd-test and test/test) stops at the first that does not hold. */
#ifdef NDEBUG
#define KVD_ALWAYS(x) (x)
#define KVD_NEVER(x) (x)
#else
#include <assert.h>
#define KVD_ALWAYS(x) ((x) ? 1 : (assert(0 && #x), 0))
#define KVD_NEVER(x) ((x) ? (assert(0 && #x), 1) : 0)
#endif

#define KVD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVD_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KVD_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ===== 2. Types, limits, shared declarations ============================= */

/*
 * What more than one section needs, declared once: the protocol constants
 * (HTTP/2's error codes, frame types and settings; gRPC's status codes),
 * etcd's error texts, and the structs that cross sections -- byte buffers
 * and slices, the store's key records, the lease and watch registries,
 * calls and the methods they run, connections, listeners, counters, and
 * struct kvd, which holds them all.  A struct's comment names the section
 * that owns it; the prototypes at the end are where a section reaches
 * forward.
 *
 * Invariants:
 *   1. The E_* texts are etcd's, byte for byte (clients match errors by
 *      text); kvd's own words (E_NO_REVISION, E_NO_VERSION, E_INPUT_FULL)
 *      only where etcd has none.  The differential tests (test/diff.py,
 *      test/auth.py) hold kvd's errors to etcd's, code and text.
 *   2. Who frees what is written on each struct: a kvd_slice never owns; a
 *      kvd_buf owns p unless lent (buf_grow and buf_free refuse a loan); a
 *      call owns its rq, out, meta and status_msg (call_fini frees them); a
 *      conn is the loop's -- a protocol marks it is_closing or dead, and
 *      only section 35 frees it (net_conn_free).
 *   3. Per key, RAM holds only its latest revision (struct mvcc_key, one
 *      allocation with its key bytes, never moved while it lives); values
 *      and older revisions stay in the log.
 *   4. The scratch in struct kvd serves one use at a time: k->hf and
 *      k->harena one header block (hp_decode), k->rbuf one socket read;
 *      whoever keeps their bytes copies them (call_keep_meta, net_read).
 *   5. LEASE_MAX_TTL bounds every TTL, asked for (svc_lease_grant_rpc) or
 *      read back (mvcc_op_decode, snap_imp_lease), so ttl * 1000 cannot
 *      overflow.
 */

/* HTTP/2 error codes (RFC 9113 section 7). */
enum h2_error {
	H2_NO_ERROR, H2_PROTOCOL_ERROR, H2_INTERNAL_ERROR, H2_FLOW_CONTROL_ERROR,
	H2_SETTINGS_TIMEOUT, H2_STREAM_CLOSED, H2_FRAME_SIZE_ERROR,
	H2_REFUSED_STREAM, H2_CANCEL, H2_COMPRESSION_ERROR, H2_CONNECT_ERROR,
	H2_ENHANCE_YOUR_CALM, H2_INADEQUATE_SECURITY, H2_HTTP_1_1_REQUIRED
};

#define SVC_RAFT_TERM 2 /* what a fresh single-node etcd reports; kvd never elects (also meta/term) */

/* Frame types and flags (RFC 9113 section 6). */
enum h2_frame_type {
	H2_DATA, H2_HEADERS, H2_PRIORITY, H2_RST_STREAM, H2_SETTINGS,
	H2_PUSH_PROMISE, H2_PING, H2_GOAWAY, H2_WINDOW_UPDATE, H2_CONTINUATION
};
#define H2_F_END_STREAM 0x01
#define H2_F_ACK 0x01
#define H2_F_END_HEADERS 0x04
#define H2_F_PADDED 0x08
#define H2_F_PRIORITY 0x20

/* SETTINGS parameters (RFC 9113 6.5.2). */
enum h2_setting {
	H2_SET_HEADER_TABLE_SIZE = 1, H2_SET_ENABLE_PUSH, H2_SET_MAX_CONCURRENT_STREAMS,
	H2_SET_INITIAL_WINDOW_SIZE, H2_SET_MAX_FRAME_SIZE, H2_SET_MAX_HEADER_LIST_SIZE
};

#define H2_FRAME_HDR 9
#define H2_DEFAULT_FRAME 16384 /* SETTINGS_MAX_FRAME_SIZE kvd keeps */
#define H2_DEFAULT_WINDOW 65535
#define H2_MAX_WINDOW 0x7fffffff
#define H2_PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define H2_PREFACE_LEN 24

/* gRPC status codes (grpc doc/statuscodes.md). */
enum grpc_code {
	GRPC_OK, GRPC_CANCELLED, GRPC_UNKNOWN, GRPC_INVALID_ARGUMENT,
	GRPC_DEADLINE_EXCEEDED, GRPC_NOT_FOUND, GRPC_ALREADY_EXISTS,
	GRPC_PERMISSION_DENIED, GRPC_RESOURCE_EXHAUSTED, GRPC_FAILED_PRECONDITION,
	GRPC_ABORTED, GRPC_OUT_OF_RANGE, GRPC_UNIMPLEMENTED, GRPC_INTERNAL,
	GRPC_UNAVAILABLE, GRPC_DATA_LOSS, GRPC_UNAUTHENTICATED
};

#define LEASE_MAX_TTL 9000000000ll /* etcd's MaxLeaseTTL, seconds: bounds every TTL, requested or replayed */

/* etcd's error texts, byte for byte: clients match errors by text. */
#define E_EMPTY_KEY "etcdserver: key is not provided"
#define E_KEY_NOT_FOUND "etcdserver: key not found"
#define E_VALUE_PROVIDED "etcdserver: value is provided"
#define E_LEASE_PROVIDED "etcdserver: lease is provided"
#define E_TOO_MANY_OPS "etcdserver: too many operations in txn request"
#define E_DUP_KEY "etcdserver: duplicate key given in txn request"
#define E_TOO_LARGE "etcdserver: request is too large"
#define E_COMPACTED "etcdserver: mvcc: required revision has been compacted"
#define E_FUTURE_REV "etcdserver: mvcc: required revision is a future revision"
#define E_LEASE_NOT_FOUND "etcdserver: requested lease not found"
#define E_NO_SPACE "etcdserver: mvcc: database space exceeded"
#define E_BAD_SORT "etcdserver: invalid sort option"
#define E_LEASE_EXISTS "etcdserver: lease already exists"
#define E_LEASE_TTL "etcdserver: too large lease TTL"
#define E_USER_EMPTY "etcdserver: user name is empty"
#define E_ROLE_EMPTY "etcdserver: role name is empty"
#define E_NAME_NUL "kvd: a user or role name holding a NUL byte is not supported"
#define E_AUTH_FAILED "etcdserver: authentication failed, invalid user ID or password"
#define E_PERM_NOT_GIVEN "etcdserver: permission not given"
#define E_INVALID_AUTH_MGMT "etcdserver: invalid auth management"
#define E_ROOT_NOT_EXIST "etcdserver: root user does not exist"
#define E_ROOT_NO_ROLE "etcdserver: root user does not have root role"
#define E_USER_EXISTS "etcdserver: user name already exists"
#define E_USER_NOT_FOUND "etcdserver: user name not found"
#define E_ROLE_EXISTS "etcdserver: role name already exists"
#define E_ROLE_NOT_FOUND "etcdserver: role name not found"
#define E_ROLE_NOT_GRANTED "etcdserver: role is not granted to the user"
#define E_PERM_NOT_GRANTED "etcdserver: permission is not granted to the role"
#define E_AUTH_NOT_ENABLED "etcdserver: authentication is not enabled"
#define E_PERM_DENIED "etcdserver: permission denied"
#define E_INVALID_TOKEN "etcdserver: invalid auth token"
#define E_TOO_MANY_REQUESTS "etcdserver: too many requests"
#define E_AUTH_OLD_REV "etcdserver: revision of auth store is old"
#define E_STOPPING "transport is closing" /* what etcd's clients and its gateway see as it stops */
/* kvd's own words, where etcd has none: writes that would take a number
 * past 2^63-1 (etcd would wrap), a full --max-request-buffer */
#define E_NO_REVISION "kvd: mvcc: no revision left (the store is at revision 9223372036854775807)"
#define E_NO_VERSION "kvd: mvcc: the key's version would pass 9223372036854775807"
#define E_INPUT_FULL "kvd: too many request bytes buffered (--max-request-buffer); retry"

/* An owned, growable byte buffer; live bytes are p[rd..len).  A lent one
 * borrows memory it does not own (net_read lends k->rbuf): it cannot grow.
 * err is sticky: a failed reserve sets it, so a writer appends freely and
 * checks once at the end (buf_reset clears it). */
struct kvd_buf {
	uint8_t *p;
	size_t rd, len, cap;
	unsigned lent : 1;
	unsigned err : 1;
};
#define BUF_DATA(b) ((b)->rd ? (b)->p + (b)->rd : (b)->p) /* NULL when never filled: no NULL + 0 (UB) */
#define BUF_LEN(b) ((b)->len - (b)->rd)

/* A borrowed byte range; it never owns memory. */
struct kvd_slice {
	const uint8_t *p;
	size_t n;
};

/* Token bucket in milli-tokens, for rate limits. */
struct bucket {
	int64_t milli;
	int64_t at_ms;
};

/* One decoded header field; strings are valid until the next decode. */
struct hp_field {
	const char *name, *value;
	uint32_t nlen, vlen;
};

/* HPACK dynamic table (RFC 7541 section 2.3.2): a FIFO of entries whose bytes
 * sit contiguously in mem[head..tail); compacted when the end is reached. */
#define HP_TABLE_SIZE 4096 /* SETTINGS_HEADER_TABLE_SIZE kvd keeps (default) */
#define HP_MAX_ENTRIES (HP_TABLE_SIZE / 32)
struct hp_entry {
	uint16_t off, nlen, vlen;
};
struct hp_table {
	uint8_t *mem;      /* HP_TABLE_SIZE bytes, allocated on first insert */
	struct hp_entry ent[HP_MAX_ENTRIES];
	unsigned first, n; /* ring of entries, ent[first] is the newest */
	size_t size;       /* RFC 7541 4.1 size: sum of name+value+32 */
	size_t max;        /* current maximum, set by size updates */
	size_t head, tail; /* live bytes */
};

struct kvd;
struct h2_conn;
struct h2_stream;
struct http_x;

/* The store (sections 9 and 10).  Per key, RAM holds only the latest
 * revision, in 33 bytes before the key: its create revision and version as
 * 32-bit numbers, no lease.  A key whose numbers do not fit so, or that has
 * a lease, has them whole in the store's side table (m->ext, MVCC_EXT);
 * read them through mvcc_k_create, mvcc_k_ver and mvcc_k_lease. */
#define MVCC_LIVE 1u                     /* its latest op is a put, not a delete */
#define MVCC_EXT 2u                      /* create, version and lease are in m->ext */
struct mvcc_key {
	int64_t mod;                     /* the latest op's revision */
	uint64_t op;                     /* log offset of that op */
	uint32_t cdelta, ver;            /* live and not MVCC_EXT: mod - create, version */
	uint32_t vlen, klen;
	uint8_t flags;                   /* MVCC_LIVE, MVCC_EXT */
	uint8_t key[];
};
#define MVCC_KEY_SIZE(klen) (offsetof(struct mvcc_key, key) + (size_t)(klen))
struct mvcc_ext {                        /* a key's numbers, whole */
	const struct mvcc_key *r;        /* NULL: a free slot */
	int64_t create, ver, lease;
};
#define MVCC_LEAF 64 /* keys per index leaf */
struct mvcc_leaf {
	unsigned n;
	struct mvcc_key *k[MVCC_LEAF];
};
/* One revision of a key as a read sees it; the value stays in the log. */
struct mvcc_kv {
	const struct mvcc_key *r;
	int64_t mod, create, ver, lease;
	uint64_t voff;
	uint32_t vlen;
};
struct mvcc_was { /* the mutable fields of a key, for undo */
	int64_t mod, create, ver, lease;
	uint64_t op;
	uint32_t vlen;
};
enum { MVCC_UNDO_CHANGED, MVCC_UNDO_CREATED, MVCC_UNDO_REMOVED, MVCC_UNDO_GRANTED, MVCC_UNDO_REVOKED };
struct mvcc_undo {
	struct mvcc_key *r;
	struct lease *l;   /* GRANTED, REVOKED */
	struct mvcc_was was;
	unsigned kind;
};
/* A write txn being built: one record, one revision if it touches a key. */
struct mvcc_txn {
	int64_t rev;
	size_t at, nops_at, undo_at;
	uint32_t nops, nkeys;
};
/* Leases (section 11): the registry kvd holds; a lease is defined there. */
struct lease;
struct lease_reg {
	struct lease **tab;           /* by id, chained */
	size_t mask, n;
	struct lease **wheel;         /* LEASE_SLOTS lists, by deadline tick */
	uint64_t *bits;               /* non-empty slots */
	int64_t cursor;               /* next tick to look at */
	uint64_t idgen;               /* etcd's id generator: member bits | time | counter */
	int64_t min_ttl;              /* seconds, from the election timeout as etcd */
	int warned;                   /* a failed expiry was logged */
};
/* Watch (section 27): the registry kvd holds; watchers are defined there. */
struct watch;
struct watch_stream;
struct watch_ev;
struct watch_hit;
struct watch_reg {
	struct watch **tab;            /* key and prefix watchers, by hash of their key */
	size_t mask, nhashed, total;
	uint32_t *plen;                /* prefix watchers by prefix length */
	size_t nplen;
	struct watch *ranges;
	struct watch_stream *streams;
	int64_t seq;
	struct watch_ev *evs;          /* scratch: the events of one record */
	size_t nevs, evcap;
	struct watch_hit *hits;        /* scratch: (watcher, event) pairs of one record */
	size_t nhits, hitcap;
	struct kvd_buf rbuf;           /* scratch: a record read back for catch-up */
	struct kvd_buf enc;            /* scratch: one record's header and events, packed */
	size_t hdr_len;                /* packed header in enc[0..hdr_len); 0: not yet */
};

/* Sparse revision -> log offset of its TXN record (every MVCC_MARK_EVERY). */
struct mvcc_marks {
	struct { int64_t rev; uint64_t off; } *v;
	size_t n, cap;
};
/* An alarm, as etcd's AlarmMember: which member raised which alarm. */
#define MVCC_MAX_ALARMS 16
enum { ALARM_NONE, ALARM_NOSPACE, ALARM_CORRUPT };
struct mvcc_alarm {
	uint64_t member;
	unsigned type;
};
/* Store lifecycle (section 13): the rewrite, the compactor, the reserve. */
struct life_rw;
struct life {
	struct life_rw *rw;            /* a log rewrite in progress */
	unsigned want : 1;             /* one was asked for: it starts after the next flush */
	unsigned reserve_held : 1;     /* <data-dir>/kvd.reserve holds its bytes */
	struct call **wait;            /* Defragment calls waiting for the rewrite's end */
	unsigned snapshots;            /* snapshots streaming: no rewrite moves the log (section 14) */
	size_t nwait, waitcap;
	int64_t rw_failed_at;          /* ms: the last automatic rewrite was abandoned then */
	uint64_t rewrites, rw_kept, rw_dropped; /* counters, since start */
	int mode;                      /* auto-compaction: LIFE_OFF, LIFE_PERIODIC, LIFE_REVISION */
	uint32_t period_ms;            /* periodic: the retention window */
	int64_t retain_revs;           /* revision: revisions kept */
	int64_t next_tick, last_ok, base_ms, prev_rev;
	int64_t *revs;                 /* periodic: revisions sampled, oldest first */
	size_t nrevs, maxrevs;
};

/* Key records come from slabs, one list per size class (section 10,
 * mvcc_slab_*): no allocator header or rounding per key. */
#define MVCC_SLAB_MAX 512          /* records up to this size; bigger ones from kvd_nalloc */
#define MVCC_SLAB_CLASSES (MVCC_SLAB_MAX / 8)
struct mvcc_chunk;
struct mvcc_slab {
	struct mvcc_chunk **v;         /* every chunk, sorted by address */
	size_t n, cap;
	struct mvcc_chunk *room[MVCC_SLAB_CLASSES]; /* chunks with a free slot, per class */
	uint16_t nchunks[MVCC_SLAB_CLASSES];
};

struct mvcc {
	int fd;
	struct mvcc_slab slab;         /* the key records */
	struct mvcc_ext *ext;          /* keys' numbers that do not fit their record: mask + 1 slots */
	size_t extmask, next;
	uint64_t size;                 /* durable log bytes */
	struct kvd_buf w;              /* the batch: records not yet written */
	int64_t rev, rev_durable;      /* current revision (batch included), durable one */
	int64_t compacted, compacted_durable, pending_compact;
	struct { uint32_t hash; int64_t compact, rev; } hashes[10]; /* HashKVs taken at compactions (section 14) */
	unsigned nhashes;
	uint32_t gen;                  /* bumped whenever the log moves (mvcc_log_moved) */
	struct mvcc_leaf **leaf;       /* index: sorted leaves of sorted keys */
	size_t nleaf, leafcap, nkeys;
	struct mvcc_undo *undo;        /* how to undo the batch */
	size_t nundo, undocap;
	struct { int64_t lo, hi; uint64_t bytes; } *dead; /* superseded bytes by revisions lo..hi */
	size_t ndead, deadcap;
	struct mvcc_marks marks;       /* sparse revision -> record offset */
	struct mvcc_alarm alarms[MVCC_MAX_ALARMS]; /* active alarms (section 13), kept in the log */
	unsigned nalarms;
	int64_t base_rev;              /* replay: the BASE records' revision, 0 if none */
	uint64_t base_end;             /* where BASE records end: ops before have no history */
	uint64_t reclaimable;          /* bytes a rewrite of the log would drop */
	size_t flushed;                /* bytes of the batch the last flush made durable */
	int last_errno;                /* why the last flush failed */
	unsigned broken : 1;           /* a failed write could not be cut back */
	unsigned no_fsync : 1;         /* --unsafe-no-fsync */
	char why[96];
#ifdef KVD_TEST_SERVICES
	uint64_t synced;               /* the log's end at its last fdatasync (a power cut keeps that) */
	uint32_t synced_gen;           /* ... in the log file of this generation */
	unsigned flushes;              /* batches flushed (KVD_TEST_FLUSH_CRASH) */
	off_t hist_mark;               /* KVD_TEST_HISTORY's size before this batch, -1 if none */
#endif
};

/* Auth (section 12): users and roles as etcd's authpb messages, sorted by
 * name; what the open batch replaced; tokens; calls waiting for a hash. */
struct auth_tab {
	ProtobufCMessage **v;
	size_t n, cap;
};
struct auth_undo {
	ProtobufCMessage *old;         /* what was there, NULL if nothing */
	uint8_t *name;                 /* owned */
	size_t nlen;
	unsigned role : 1;
};
struct auth_token;
struct auth_job;
struct auth_jwt;
/* Who a call is (etcd's AuthInfo): a user name (NULL: nobody said) and the
 * auth revision a JWT was issued at (0: a simple token or a certificate,
 * which are always current). */
struct auth_who {
	const char *name;              /* NUL-terminated, but nlen says its length: a CN may hold NULs */
	size_t nlen;
	unsigned named : 1;            /* a token or a certificate named someone, "" too (etcd: Revision != 0) */
	uint64_t rev;
};
struct auth {
	unsigned enabled : 1;
	unsigned saved : 1, was_enabled : 1; /* the state before the open batch */
	uint64_t rev, was_rev;         /* the auth revision */
	struct auth_tab users, roles;
	struct auth_undo *undo;
	size_t nundo, undocap;
	struct auth_token **tok;       /* AUTH_BUCKETS chains, NULL until the first */
	size_t ntok;
	int64_t ttl_ms;
	struct auth_jwt *jwt;          /* --auth-token jwt,...: NULL for simple tokens */
	struct auth_job *jobs, *jobs_tail; /* hashes to make, oldest first */
	struct auth_job *cur;          /* the one being hashed (finished before another begins) */
	unsigned njobs;
	uint64_t vclock;               /* fair turns: the shares' and connections' vt come from it */
	int rnd_fd;
	uint64_t hashes, failures;     /* counters */
};

struct confd; /* section 29 */
/* JSON (section 6): a parsed document in one arena. */
enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUM, JSON_STR, JSON_ARR, JSON_OBJ };

struct json {
	uint8_t type;
	uint8_t isint;      /* JSON_NUM: an integral value that fits in i */
	uint32_t n;         /* JSON_STR/NUM: bytes; JSON_ARR/OBJ: children */
	uint32_t klen;      /* a member of an object: its key */
	const char *key;
	const char *s;      /* JSON_STR: the bytes; JSON_NUM: the literal; NUL-terminated */
	struct json *kids;  /* JSON_ARR/OBJ: n children, in order */
	int64_t i;
	double d;
};

struct json_chunk;
struct json_doc {
	struct kvd *k;
	struct json_chunk *chunks;
	struct json *root;
	size_t bytes; /* held by the arena */
	char why[96]; /* a syntax error's text, as Go's encoding/json words it */
};


/* A gRPC method: how calls to one :path are served (sections 8 and 28). */
struct call;
enum grpc_kind { GRPC_UNARY, GRPC_SERVER_STREAM, GRPC_BIDI };
struct grpc_method {
	const char *path;  /* "/etcdserverpb.KV/Range" */
	enum grpc_kind kind;
	/* request and response messages (NULL req: raw bytes, test methods only) */
	const ProtobufCMessageDescriptor *req, *resp;
	/* one request message, in c->rq (decoded) and c->raw (as it came);
	 * every method has one.  The handler may keep c->rq by taking it
	 * (c->rq = NULL); otherwise it is freed when the handler returns. */
	void (*on_msg)(struct kvd *k, struct call *c);
	/* the client half-closed a streaming call (optional) */
	void (*on_half_close)(struct kvd *k, struct call *c);
	/* the call goes away (finished or cancelled): free service state (optional) */
	void (*on_close)(struct kvd *k, struct call *c);
	/* the carrier can take more and the call's queue is empty (optional) */
	void (*on_produce)(struct kvd *k, struct call *c);
	/* kvd begins to shut down (optional): Health watchers say NOT_SERVING,
	 * waiters end; streams end after it (svc_stop_call) */
	void (*on_shutdown)(struct kvd *k, struct call *c);
};

/*
 * One call being served, whatever carries it (section 8): the method, the
 * request, its metadata, the response messages queued for the carrier
 * (gRPC-framed: 5-byte prefix, message), the final status, and whether the
 * reply waits for the group commit.  A carrier embeds it: an HTTP/2 stream
 * (gRPC) or an HTTP/1.1 connection (the JSON gateway); in-process calls
 * (the unit tests' and fuzzers' carriers) are a third, through the same
 * struct.
 */
struct call_carrier {
	const char *name;
	/* the call finished: request bytes still buffered can go (optional) */
	void (*finished)(struct kvd *k, struct call *c);
};
struct call {
	const struct grpc_method *m;
	const struct call_carrier *carrier;
	struct call *prev, *next;   /* k->calls: every live call */
	unsigned finished : 1;      /* the service set a final status */
	unsigned got_msg : 1;       /* a unary call has its request */
	unsigned wrote : 1;         /* the call wrote to the store */
	unsigned held : 1;          /* its reply waits for the log flush (k->held) */
	unsigned produce : 1;       /* the method's on_produce makes more output */
	int64_t deadline;           /* grpc-timeout, monotonic us, 0 = none */
	struct kvd_buf out;         /* response messages, gRPC-framed */
	size_t out_mark;            /* out.len before the current request's reply */
	int status;                 /* final gRPC status once finished */
	char *status_msg;           /* owned, may be NULL */
	ProtobufCMessage *rq;       /* the request being handled (owned) */
	struct kvd_slice raw;       /* its bytes, valid while on_msg runs */
	struct hp_field *meta;      /* request metadata (regular fields), one block */
	unsigned nmeta;
	void *svc;                  /* service state of a streaming call */
	struct conn *conn;          /* the client connection, NULL in-process */
};


/*
 * One client connection (section 35): a socket, the transport that moves its
 * bytes (a plain socket, or TLS over it), and the protocol its first bytes
 * chose (HTTP/2; an HTTP/1.x request; a TLS ClientHello), whose state hangs
 * off ps.  The loop owns it; a protocol never closes or frees one itself.
 */
struct conn;
struct net_transport {
	const char *name;
	/* > 0 bytes, 0 at the peer's end, KVD_EAGAIN, or KVD_EIO */
	long (*recv)(struct conn *c, void *p, size_t n);
	long (*send)(struct conn *c, const void *p, size_t n); /* n 0: only move a handshake on */
	void (*shut)(struct conn *c);                          /* before the write side closes (optional) */
	void (*free)(struct conn *c);                          /* its state, ts (optional) */
};
struct net_proto {
	const char *name;
	void (*input)(struct kvd *k, struct conn *c);     /* handle what c->in holds */
	void (*flush)(struct kvd *k, struct conn *c);     /* queue what may be sent into c->out */
	int64_t (*timers)(struct kvd *k, struct conn *c); /* run due ones; the next one's time */
	void (*drain)(struct kvd *k, struct conn *c);     /* a graceful shutdown begins */
	void (*stop)(struct kvd *k, struct conn *c);      /* the grace is over */
	void (*evict)(struct kvd *k, struct conn *c);     /* closed for a new client: say so */
	int (*busy)(const struct conn *c);                /* a call is being served */
	int (*shed)(struct kvd *k, struct conn *c);       /* drop its largest buffered request: 1 if it had one */
	void (*free)(struct kvd *k, struct conn *c);      /* its state (ps) */
};
struct conn {
	struct kvd *k;
	struct conn *next;
	int fd;
	char peer[64];
	uint8_t src[9];              /* source address: family, then the IPv4 address or IPv6 /64 */
	struct share *share;         /* that address's fair share (section 3); NULL only for refusals */
	uint64_t in_held;            /* request bytes it buffers (its part of k->in_held) */
	uint64_t vt;                 /* password hashes: when this connection was last served */
	const struct net_transport *tr;
	void *ts;                    /* the transport's state (TLS) */
	const struct net_proto *proto; /* NULL until the first bytes say */
	void *ps;                    /* the protocol's state */
	struct kvd_buf in, out;
	unsigned is_closing : 1;     /* close once output is written */
	unsigned uncounted : 1;      /* evicted: no longer counts toward --max-connections */
	unsigned peer_closed : 1;    /* the peer's end of the stream came */
	unsigned dead : 1;           /* socket error: close now */
	unsigned shut_wr : 1;        /* output done, lingering for the peer's close */
	unsigned want_write : 1;     /* the transport waits to write (a TLS handshake): POLLOUT */
	unsigned metrics_only : 1;   /* from a --listen-metrics-urls listener: HTTP/1.x: /metrics, /health, /livez, /readyz */
	unsigned refusing : 1;       /* over the limits: its first bytes get a refusal in its protocol */
	/* times, monotonic ms */
	int64_t t_open, t_close;
	int64_t t_active;            /* last progress: a call opened, request data, a call ended */
};

/* A listening socket. */
struct net_listener {
	int fd;
	unsigned tls : 1;            /* https:// or unixs:// */
	unsigned metrics : 1;        /* --listen-metrics-urls: /metrics and the health endpoints only */
	char name[80];
	char *upath;                 /* a unix socket's file, removed when it closes; else NULL */
};


/* Counters, reported by logs, tests and /metrics (section 34). */
#define KVD_METRIC_METHODS 64 /* gRPC methods counted by /metrics (kvd routes ~55) */
#define KVD_FSYNC_BUCKETS 14  /* 1 ms .. 8.192 s, doubling: etcd's wal_fsync buckets */
#define KVD_COMMIT_BUCKETS 12 /* 1 .. 2048 replies released by one group commit */
enum { YIELD_CONNS, YIELD_HANDSHAKES, YIELD_HASHES, YIELD_WATCHERS, YIELD_BYTES, YIELD_N }; /* fair shares given up */
struct kvd_stats {
	uint64_t conns_accepted, conns_refused, conns_refused_ip, conns_evicted, goaway_sent, rst_sent, calls;
	uint64_t yields[YIELD_N];    /* units a largest holder gave up to a newcomer, by pool */
	uint64_t grpc_started[KVD_METRIC_METHODS], grpc_handled[KVD_METRIC_METHODS][17];
	uint64_t fsync_b[KVD_FSYNC_BUCKETS], fsync_n, commit_b[KVD_COMMIT_BUCKETS], commit_n, commit_sum;
	uint64_t http_requests;
	uint64_t health_ok, health_failed; /* /health answers (etcd_server_health_*) */
	uint64_t checks[2][4][2];    /* /livez, /readyz: each check run, by success / error */
	uint8_t check_last[2][4];    /* 1 + its last result (1 error, 2 success); 0: never run */
	double fsync_sum;            /* seconds */
	int64_t start_wall;          /* time(NULL) at start, for process_start_time_seconds */
};

/* Fair shares (section 3): who holds how much of each bounded pool. */
struct share;
struct share_tab {
	struct share **b;
	size_t mask, n;
};

struct kvd {
	struct kvd_config cfg;       /* a copy; its strings are kvd's own (cfg_own) */
	int64_t now;                 /* monotonic ms, read once per iteration */
	int64_t next_timer;          /* earliest connection/stream timer */
	kvd_log_fn *log_fn;
	void *log_arg;
	unsigned log_to;             /* LOG_TO_* (section 3); 0: stderr */
	int log_fd;                  /* a --log-outputs file, -1 if none */
	int syslog_fd;               /* --log-outputs syslog: a datagram socket for /dev/log, -1 if none */
	long syslog_pid;
	/* memory accounting (section 3) */
	size_t mem, mem_peak;
	uint64_t nalloc, fail_at;    /* fail_at: test hook, fail allocation N */
	int alloc_failed;            /* since the loop last looked: it comes back soon (loop_run) */
	uintptr_t mbed;              /* mbedtls' live blocks, if it allocates through kvd (util_mbed_calloc) */
	ProtobufCAllocator pba;
	int pb_oom;                  /* an allocation failed inside protobuf-c */
	/* network */
	struct net_listener *ls;
	unsigned nls;
	size_t lscap;
	struct conn *conns;
	unsigned nconns, nrefusing;  /* counted toward --max-connections; being refused (uncounted) */
	struct pollfd *pfd;
	struct loop_slot *slot;      /* what each pollfd belongs to */
	size_t pcap;
	unsigned stopping : 1;
	int64_t stop_deadline, accept_pause_until;
	uint8_t rbuf[65536];         /* socket reads land here; leftovers move to c->in */
	/* identity */
	uint64_t member_id, cluster_id;
	char **client_urls, **peer_urls;
	unsigned nclient_urls, npeer_urls;
	int lock_fd;
	/* systemd's notify socket (section 35), -1 if none */
	int sd_fd;
	socklen_t sd_len;
	struct sockaddr_un sd_addr;
	int64_t sd_wd_ms, sd_wd_next; /* watchdog: ping every sd_wd_ms, next at sd_wd_next */
	int wake[2];                 /* self-pipe: kvd_shutdown() is async-signal-safe */
	struct mvcc db;              /* the store */
	uint32_t crc[8][256];        /* CRC-32C's tables (section 9: mvcc_crc_init) */
	struct watch_reg watch;      /* watchers */
	struct lease_reg lease;      /* leases */
	struct life life;            /* rewrite, auto-compaction, reserve (section 13) */
	struct confd *confd;         /* the confd responder, NULL when off */
	struct tls_state *tls;       /* TLS (section 31), NULL without https:// listeners */
	struct auth auth;            /* users, roles, tokens (section 12) */
	struct call *calls;          /* every live call, whatever its carrier */
	struct lock_wait *locks;     /* Lock/Campaign waiters and Observe streams (section 26) */
	struct svc_member_x *members; /* members MemberAdd listed (section 25): never started */
	size_t nmembers;
	unsigned downgrade : 1;      /* Maintenance/Downgrade ENABLE: cluster version one minor down (memory only) */
	struct call **held;          /* calls answered while the batch was open */
	size_t nheld, heldcap;
	/* HPACK decode scratch, shared: one header block is decoded at a time */
	struct hp_field hf[KVD_MAX_HEADER_FIELDS];
	uint8_t harena[KVD_MAX_HEADER_LIST + HP_TABLE_SIZE + 64];
	struct share_tab shares;     /* fair shares of the pools below (section 3) */
	uint64_t in_held;            /* request bytes buffered in all (--max-request-buffer) */
	struct kvd_stats st;
};

static void call_finish(struct kvd *k, struct call *c, int code, const char *fmt, ...) KVD_PRINTF(4, 5);
static int call_send(struct kvd *k, struct call *c, const ProtobufCMessage *m);
static int cfg_duration(const char *s, uint32_t *out);
static void cfg_show_ms(uint32_t ms, char *out, size_t cap);
/* The store keeps leases' key sets in step with its keys (section 11). */
static struct lease *lease_find(struct kvd *k, int64_t id);
static void lease_rebind(struct kvd *k, struct mvcc_key *r, int64_t from, int64_t to);
static int64_t mvcc_k_create(const struct mvcc *m, const struct mvcc_key *r);
static int64_t mvcc_k_ver(const struct mvcc *m, const struct mvcc_key *r);
static int64_t mvcc_k_lease(const struct mvcc *m, const struct mvcc_key *r);
static void mvcc_k_nums(const struct mvcc *m, const struct mvcc_key *r, int64_t *create, int64_t *ver, int64_t *lease);
static int lease_reserve(struct kvd *k, int64_t id);
static void lease_undo(struct kvd *k, struct lease *l, unsigned kind);
static void lease_free(struct kvd *k, struct lease *l);
static int lease_replay(struct kvd *k, int kind, int64_t id, int64_t ttl);
static int kvd_init(const struct kvd_config *cfg, struct kvd **out, char *err, size_t errlen);
static int cfg_lock(struct kvd *k, char *err, size_t errlen);
static void lease_promote(struct kvd *k);
static void loop_log_flush(struct kvd *k);
static void net_held(struct kvd *k, struct conn *c, int64_t delta);
static void net_shed(struct kvd *k);
static int net_nonblock(int fd);
static void confd_report(struct kvd *k, char *out, size_t cap);

/* An error to return: gRPC code and etcd's text. */
struct svc_err {
	int code;
	const char *msg;
};

/* ===== 3. Utilities: memory, log, bytes, clock, shares (util_, get_, put_, varint_, utf8_, bucket_, share_) == */

/*
 * What every section uses and none owns: the allocator that counts every
 * byte, growing arrays, the monotonic clock and base64, the log and its
 * outputs, byte order, varints and UTF-8, the loop's wake-up, token
 * buckets, and the fair shares of the bounded pools.
 *
 * Invariants:
 *   1. kvd's own heap memory -- protobuf-c's too, through k->pba -- comes
 *      from kvd_malloc, kvd_calloc or kvd_realloc and goes back through
 *      kvd_free, or from kvd_nalloc to kvd_nfree with the same size, so
 *      k->mem is exact and a test can fail allocation N (k->fail_at).
 *      mbedtls' allocations come there too where its build allows
 *      (MBEDTLS_PLATFORM_MEMORY: util_mbed_calloc); Debian's shared
 *      mbedtls has no such hook and allocates for itself.
 *   2. No size computation overflows: kvd_malloc refuses more than
 *      SIZE_MAX / 2, and arrays grow through util_grow (its policy
 *      util_grow_cap), which leaves the array and its capacity untouched
 *      when it fails.
 *   3. Integers of a format are assembled byte by byte (get_be32,
 *      put_le64, ...), never loaded in host order; get_varint is the one
 *      varint decoder (10 bytes at most, the 10th at most 1) and utf8_len
 *      the one UTF-8 check (no overlong form, surrogate, or code point
 *      past U+10FFFF).
 *   4. Timers and deadlines run on the monotonic clock (util_now_ms,
 *      util_now_us, k->now: boards have no RTC), and each asks for its
 *      wake-up through util_wake_by; wall-clock time is read only for log
 *      lines and where a peer's protocol speaks it (JWT and confd
 *      timestamps, HTTP dates, certificates, ids).
 *   5. A share lives while something refers to it and holds nothing when
 *      its last reference goes (share_put); none is left at close
 *      (share_fini: KVD_ALWAYS(!k->shares.n)).  A full pool is taken from
 *      its largest holder only by the max-min rule (share_may_take).
 */

/*
 * The one allocation choke point.  Each block carries its size so kvd knows
 * exactly how much it holds (k->mem); tests can make allocation N fail.
 */
#ifndef KVD_SYS_MALLOC /* @@ underlying allocator */
#define KVD_SYS_MALLOC malloc
#define KVD_SYS_CALLOC calloc
#define KVD_SYS_REALLOC realloc
#define KVD_SYS_FREE free
#endif
union mem_hdr {
	size_t n;
	long double ld;
	void *vp;
	uint64_t u;
};

KVD_RESIDENT static void *kvd_malloc(struct kvd *k, size_t n)
{
	union mem_hdr *h;

	if (n > SIZE_MAX / 2)
		return NULL;
	k->nalloc++;
	if ((k->fail_at && k->nalloc == k->fail_at) || !(h = KVD_SYS_MALLOC(sizeof *h + n))) {
		k->alloc_failed = 1;
		return NULL;
	}
	h->n = n;
	k->mem += n;
	if (k->mem > k->mem_peak)
		k->mem_peak = k->mem;
	return h + 1;
}

KVD_RESIDENT static void *kvd_calloc(struct kvd *k, size_t n)
{
	void *p = kvd_malloc(k, n);

	if (p)
		memset(p, 0, n);
	return p;
}

KVD_RESIDENT static void *kvd_realloc(struct kvd *k, void *p, size_t n)
{
	union mem_hdr *h, *nh;
	size_t old;

	if (!p)
		return kvd_malloc(k, n);
	if (n > SIZE_MAX / 2)
		return NULL;
	k->nalloc++;
	h = (union mem_hdr *)p - 1;
	old = h->n;
	if ((k->fail_at && k->nalloc == k->fail_at) || !(nh = KVD_SYS_REALLOC(h, sizeof *nh + n))) {
		k->alloc_failed = 1;
		return NULL;
	}
	nh->n = n;
	k->mem = k->mem - old + n;
	if (k->mem > k->mem_peak)
		k->mem_peak = k->mem;
	return nh + 1;
}

KVD_RESIDENT static void kvd_free(struct kvd *k, void *p)
{
	union mem_hdr *h;

	if (!p)
		return;
	h = (union mem_hdr *)p - 1;
	k->mem -= h->n;
	KVD_SYS_FREE(h);
}

/*
 * Sized allocations: no header, the caller passes the size back to free.
 * For the store's key records and the slabs they come from (section 10),
 * where a header each would add up.
 */
KVD_RESIDENT static void *kvd_nalloc(struct kvd *k, size_t n)
{
	void *p;

	k->nalloc++;
	if ((k->fail_at && k->nalloc == k->fail_at) || !(p = KVD_SYS_MALLOC(n ? n : 1))) {
		k->alloc_failed = 1;
		return NULL;
	}
	k->mem += n;
	if (k->mem > k->mem_peak)
		k->mem_peak = k->mem;
	return p;
}

static void kvd_nfree(struct kvd *k, void *p, size_t n)
{
	if (!p)
		return;
	k->mem -= n;
	KVD_SYS_FREE(p);
}

/*
 * mbedtls' allocations, where its build lets them be routed
 * (MBEDTLS_PLATFORM_MEMORY; test/lib/xlibs.sh builds it so, as a firmware
 * tree may).  mbedtls takes one allocator per process and gives it no
 * context, so its blocks are charged to one kvd: the first opened
 * (util_mbed_owner, the one process-wide pointer besides the signal
 * handlers' main_kvd).  Each block is on its owner's list (k->mbed), so
 * that the owner's close can hand the blocks still alive -- PSA's
 * process-wide key slots -- back to the system uncharged; blocks made while
 * no kvd owns the allocator are the system's from the start.  A failed
 * allocation here is one more the sweep of k->fail_at reaches.
 */
#if defined(MBEDTLS_PLATFORM_MEMORY) && !defined(KVD_NO_MBED_MEMORY)
/* The list's links are kept inverted (MBED_LINK): a leak checker must not
 * take the list for a reference, or mbedtls' own leaks would hide in it. */
union mbed_hdr {
	struct {
		uintptr_t prev, next;   /* MBED_LINK()ed */
		struct kvd *k;          /* NULL: the system's (no mem_hdr charge) */
	} s;
	long double ld;
	void *vp;
};
#define MBED_LINK(p) (~(uintptr_t)(p))
#define MBED_PTR(x) ((union mbed_hdr *)~(x))
static struct kvd *util_mbed_owner;

static void *util_mbed_calloc(size_t n, size_t size)
{
	struct kvd *k = util_mbed_owner;
	union mbed_hdr *h;
	size_t all;

	if (size && n > (SIZE_MAX / 2 - sizeof *h - sizeof(union mem_hdr)) / size)
		return NULL;
	all = sizeof *h + n * size;
	if (k)
		h = kvd_calloc(k, all);
	else if ((h = KVD_SYS_CALLOC(1, sizeof(union mem_hdr) + all)))
		h = (union mbed_hdr *)((union mem_hdr *)(void *)h + 1);
	if (!h)
		return NULL;
	h->s.k = k;
	h->s.prev = h->s.next = MBED_LINK(NULL);
	if (k) {
		h->s.next = k->mbed;
		if (k->mbed != MBED_LINK(NULL))
			MBED_PTR(k->mbed)->s.prev = MBED_LINK(h);
		k->mbed = MBED_LINK(h);
	}
	return h + 1;
}

static void util_mbed_free(void *p)
{
	union mbed_hdr *h = p ? (union mbed_hdr *)p - 1 : NULL;
	struct kvd *k;

	if (!h)
		return;
	if (!(k = h->s.k)) {
		KVD_SYS_FREE((union mem_hdr *)(void *)h - 1);
		return;
	}
	if (h->s.prev != MBED_LINK(NULL))
		MBED_PTR(h->s.prev)->s.next = h->s.next;
	else
		k->mbed = h->s.next;
	if (h->s.next != MBED_LINK(NULL))
		MBED_PTR(h->s.next)->s.prev = h->s.prev;
	kvd_free(k, h);
}

/* At open: the first kvd in the process takes mbedtls' allocator. */
static void util_mbed_claim(struct kvd *k)
{
	k->mbed = MBED_LINK(NULL);
	if (util_mbed_owner)
		return;
	util_mbed_owner = k;
	mbedtls_platform_set_calloc_free(util_mbed_calloc, util_mbed_free);
}

/* At close: what mbedtls still holds becomes the system's, uncharged. */
static void util_mbed_release(struct kvd *k)
{
	union mbed_hdr *h;
	uintptr_t next;

	for (next = k->mbed; next != MBED_LINK(NULL);) {
		h = MBED_PTR(next);
		next = h->s.next;
		h->s.k = NULL;
		h->s.prev = h->s.next = MBED_LINK(NULL);
		k->mem -= ((union mem_hdr *)(void *)h - 1)->n;
	}
	k->mbed = MBED_LINK(NULL);
	if (util_mbed_owner == k)
		util_mbed_owner = NULL;
}
#else
static void util_mbed_claim(struct kvd *k) { (void)k; }
static void util_mbed_release(struct kvd *k) { (void)k; }
#endif

KVD_RESIDENT static char *kvd_strdup(struct kvd *k, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = kvd_malloc(k, n);

	if (p)
		memcpy(p, s, n);
	return p;
}

/* ---- growing arrays ------------------------------------------------------ */

/*
 * Growing arrays.  Appends to a kvd_realloc'd array go through util_grow
 * instead of each writing the idiom out (compare with the capacity, pick
 * a new one, multiply by the element size, realloc, store pointer and
 * capacity), so the policy and its overflow checks live in one place.
 * (The few arrays sized exactly to their largest need say why not.)
 *
 * util_grow_cap is the policy, which buf_grow (section 4) also uses: it
 * starts at first (each site keeps its own starting figure, e.g. 8 streams
 * per connection), doubles until need fits, and stops at what kvd_malloc
 * can hand out.  It returns the capacity, or 0 when need elements of
 * elsize bytes are beyond that.
 */
static size_t util_grow_cap(size_t cap, size_t need, size_t elsize, size_t first)
{
	size_t max = SIZE_MAX / 2 / elsize, n = cap ? cap : first ? first : 1;

	if (need > max)
		return 0;
	if (n > max)
		n = max;
	while (n < need)
		n = n > max / 2 ? max : n * 2;
	return n;
}

/*
 * Make room for need elements of elsize bytes in the array arrp points at
 * (a T * holding *cap of them).  Returns 0, or KVD_ENOMEM and leaves the
 * array and *cap untouched.  The T * is read and written with memcpy, not
 * through a void **, because accessing a T * as a void * breaks strict
 * aliasing (on every target kvd builds for, T * and void * have the same
 * representation).  UTIL_GROW takes the array and its capacity as lvalues
 * and works out the element size itself.
 */
KVD_RESIDENT static int util_grow(struct kvd *k, void *arrp, size_t *cap, size_t need, size_t elsize, size_t first)
{
	size_t n;
	void *p;

	if (need <= *cap)
		return 0;
	if (!(n = util_grow_cap(*cap, need, elsize, first)))
		return KVD_ENOMEM;
	memcpy(&p, arrp, sizeof p);
	if (!(p = kvd_realloc(k, p, n * elsize)))
		return KVD_ENOMEM;
	memcpy(arrp, &p, sizeof p);
	*cap = n;
	return 0;
}
#define UTIL_GROW(k, arr, cap, need, first) util_grow((k), &(arr), &(cap), (need), sizeof *(arr), (first))

/* ---- clocks, base64 ------------------------------------------------------- */

/* Monotonic milliseconds: boards have no RTC, wall time may jump at boot. */
static int64_t util_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

KVD_RESIDENT static int64_t util_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Seconds since the epoch as UTC's calendar (proleptic Gregorian): what
 * gmtime_r gives, without libc's time-zone code, which a static musl build
 * would carry only for it (~8 KB; kvd needs UTC alone: log lines, HTTP's
 * Date, certificates).  Days are counted in 400-year eras of 146097 days
 * from 0000-03-01, so that a leap day ends its year. */
struct util_tm {
	int year, mon, mday, hour, min, sec; /* mon 1..12 */
	int wday;                            /* 0 Sunday */
};

KVD_RESIDENT static void util_utc(int64_t t, struct util_tm *tm)
{
	int64_t days = t / 86400, s = t % 86400, era, doe, yoe, doy, mp;

	if (s < 0) {
		s += 86400;
		days--;
	}
	tm->wday = (int)((days % 7 + 11) % 7); /* 1970-01-01 was a Thursday */
	tm->hour = (int)(s / 3600);
	tm->min = (int)(s / 60 % 60);
	tm->sec = (int)(s % 60);
	days += 719468; /* from 0000-03-01 */
	era = (days >= 0 ? days : days - 146096) / 146097;
	doe = days - era * 146097;                                        /* 0..146096 */
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;     /* 0..399 */
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);                   /* 0..365, from March 1st */
	mp = (5 * doy + 2) / 153;                                         /* 0 March .. 11 February */
	tm->mday = (int)(doy - (153 * mp + 2) / 5 + 1);
	tm->mon = (int)(mp < 10 ? mp + 3 : mp - 9);
	tm->year = (int)(yoe + era * 400 + (tm->mon <= 2));
}

/* Base64 of p[0..n) into out with alphabet a (64 characters), '=' padding
 * when pad: (n + 2) / 3 * 4 bytes at most, not NUL-ended.  Its length.
 * One encoder for confd's values (standard), bcrypt's ("./A-Za-z0-9") and
 * JWT's (base64url): unused when all three are left out. */
KVD_UNUSED static size_t util_b64(const char *a, int pad, const uint8_t *p, size_t n, char *out)
{
	char *o = out;
	size_t i;

	for (i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
		*o++ = a[v >> 18];
		*o++ = a[(v >> 12) & 63];
		if (i + 1 < n || pad)
			*o++ = i + 1 < n ? a[(v >> 6) & 63] : '=';
		if (i + 2 < n || pad)
			*o++ = i + 2 < n ? a[v & 63] : '=';
	}
	return (size_t)(o - out);
}

/* ---- the log: levels and outputs ----------------------------------------- */

/*
 * Where log lines go: --log-outputs, a comma list as etcd's ("default" and
 * "stderr", "stdout", a file path) plus "syslog" (busybox logread and
 * journald both read it; etcd's "systemd/journal" means the same here).
 * An embedder's kvd_set_log() takes precedence over all of them.
 *
 * syslog is spoken here rather than through syslog(3), whose time stamp
 * needs libc's time-zone code: one datagram per line, sent to /dev/log
 * by name each time (a restarted syslog daemon is found again),
 * "<PRI>kvd[PID]: text" with facility daemon -- RFC 3164 without its
 * TIMESTAMP, which the daemon then adds in its own time zone (busybox
 * syslogd, rsyslog and journald all do).  Never blocking: a daemon whose
 * queue is full, or none at all, loses the line, never stalls the loop.
 */
#define LOG_TO_STDERR 1u
#define LOG_TO_STDOUT 2u
#define LOG_TO_SYSLOG 4u
#define LOG_TO_FILE 8u

static void kvd_log(struct kvd *k, int level, const char *fmt, ...) KVD_PRINTF(3, 4);
KVD_RESIDENT static void kvd_log(struct kvd *k, int level, const char *fmt, ...)
{
	static const char lv[] = "DIWE";
	static const unsigned char prio[] = {7, 6, 4, 3}; /* syslog's debug, info, warning, err */
	char line[512], sl[560];
	struct timespec ts;
	struct util_tm tm;
	va_list ap;
	unsigned to = k->log_to ? k->log_to : LOG_TO_STDERR;
	int n, li = level < 0 ? 0 : level > 3 ? 3 : level;
	size_t len;

	if (level < k->cfg.log_level)
		return;
	clock_gettime(CLOCK_REALTIME, &ts); /* for humans only */
	util_utc(ts.tv_sec, &tm);
	n = snprintf(line, sizeof line, "%04d-%02d-%02d %02d:%02d:%02d.%06ld %c | kvd: ", tm.year, tm.mon, tm.mday,
	             tm.hour, tm.min, tm.sec, (long)(ts.tv_nsec / 1000), lv[li]);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
	va_end(ap);
	if (k->log_fn) {
		k->log_fn(k->log_arg, level, line);
		return;
	}
	if ((to & LOG_TO_SYSLOG) && k->syslog_fd >= 0) {
		struct sockaddr_un a = {.sun_family = AF_UNIX, .sun_path = "/dev/log"};
		int m = snprintf(sl, sizeof sl, "<%d>kvd[%ld]: %s", 24 + prio[li], /* facility daemon */ k->syslog_pid, line + n);

		sendto(k->syslog_fd, sl, (size_t)m < sizeof sl ? (size_t)m : sizeof sl - 1, MSG_NOSIGNAL | MSG_DONTWAIT,
		       (struct sockaddr *)&a, sizeof a);
	}
	len = strlen(line);
	line[len] = '\n'; /* one write(2) per line: lines from a crash-looping kvd never interleave */
	if (to & LOG_TO_STDERR)
		(void)!write(2, line, len + 1);
	if (to & LOG_TO_STDOUT)
		(void)!write(1, line, len + 1);
	if ((to & LOG_TO_FILE) && k->log_fd >= 0)
		(void)!write(k->log_fd, line, len + 1);
}

/*
 * A file a flag names, opened for reading without ever blocking: a FIFO or a
 * device would hang start-up (or a SIGHUP reload) in open() or read(), so
 * only a regular file is taken.  The fd (O_NONBLOCK cleared, *st filled),
 * -1 with errno when open/fstat failed, or -2 when it is not a regular file.
 */
static int util_open_regular(const char *path, int flags, struct stat *st)
{
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | flags), fl;

	if (fd < 0)
		return -1;
	if (fstat(fd, st)) {
		close(fd);
		return -1;
	}
	if (!S_ISREG(st->st_mode)) {
		close(fd);
		return -2;
	}
	if ((fl = fcntl(fd, F_GETFL)) >= 0)
		fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	return fd;
}

/* Before a library opens path itself (mbedtls' *_parse_file, fopen): it is a
 * readable regular file, or err says why ("what path: ...").  Unused when
 * TLS, JWT, confd and snapshots are all left out. */
static KVD_UNUSED int util_check_regular(const char *path, const char *what, char *err, size_t errlen)
{
	struct stat st;
	int fd = util_open_regular(path, 0, &st);

	if (fd >= 0) {
		close(fd);
		return 0;
	}
	snprintf(err, errlen, "%s %.200s: %s", what, path, fd == -2 ? "not a regular file" : strerror(errno));
	return KVD_EINVAL;
}

/* --log-outputs and --logger, checked; a file output opened (O_APPEND;
 * non-blocking, so a FIFO without a reader is refused and a full one drops
 * lines rather than stalling the loop). */
KVD_RESIDENT static int util_log_open(struct kvd *k, char *err, size_t errlen)
{
	const char *o = k->cfg.log_outputs, *e;
	char path[PATH_MAX];
	size_t n;
	unsigned to = 0;

	if (k->cfg.logger[0] && !strcmp(k->cfg.logger, "capnslog")) { /* etcd 3.7's words */
		snprintf(err, errlen, "--logger=capnslog is removed in v3.5");
		return KVD_EINVAL;
	}
	if (k->cfg.logger[0] && strcmp(k->cfg.logger, "zap")) {
		snprintf(err, errlen, "unknown logger option \"%.64s\"", k->cfg.logger);
		return KVD_EINVAL;
	}
	for (e = o; *e; o = e + 1) { /* every name, the empty ones too ("stderr," is refused) */
		e = strchr(o, ',');
		e = e ? e : o + strlen(o);
		n = (size_t)(e - o);
#define LOG_IS(s) (n == sizeof s - 1 && !memcmp(o, s, n))
		if (LOG_IS("default") || LOG_IS("stderr"))
			to |= LOG_TO_STDERR;
		else if (LOG_IS("stdout"))
			to |= LOG_TO_STDOUT;
		else if (LOG_IS("syslog") || LOG_IS("systemd/journal"))
			to |= LOG_TO_SYSLOG;
		else if (!n || n >= sizeof path || (to & LOG_TO_FILE)) {
			snprintf(err, errlen, "--log-outputs: %s", n ? "one file at most" : "empty output name");
			return KVD_EINVAL;
		} else {
			memcpy(path, o, n);
			path[n] = 0;
			if ((k->log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0600)) < 0) {
				snprintf(err, errlen, "--log-outputs: cannot open %s: %s", path, strerror(errno));
				return KVD_EINVAL;
			}
			to |= LOG_TO_FILE;
		}
#undef LOG_IS
	}
	if ((to & LOG_TO_SYSLOG) && (k->syslog_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0) {
		snprintf(err, errlen, "--log-outputs syslog: %s", strerror(errno));
		return KVD_EINVAL;
	}
	k->syslog_pid = (long)getpid();
	k->log_to = to ? to : LOG_TO_STDERR;
	return 0;
}

static void util_log_close(struct kvd *k)
{
	if (k->syslog_fd >= 0)
		close(k->syslog_fd);
	k->syslog_fd = -1;
	if (k->log_fd >= 0)
		close(k->log_fd);
	k->log_fd = -1;
	k->log_to = 0;
}

/* ---- bytes: byte order, varints, UTF-8 ----------------------------------- */

/* Byte order by assembly: correct on any host, no endianness detection. */
static uint32_t get_be16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t get_be24(const uint8_t *p) { return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2]; }
KVD_RESIDENT static uint32_t get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
KVD_RESIDENT static uint64_t get_be64(const uint8_t *p) { return (uint64_t)get_be32(p) << 32 | get_be32(p + 4); }
static void put_be16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }
static void put_be24(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 16); p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)v;
}
static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static void put_be64(uint8_t *p, uint64_t v)
{
	put_be32(p, (uint32_t)(v >> 32));
	put_be32(p + 4, (uint32_t)v);
}
/* bbolt's pages are little-endian (section 14), whatever the host (some
 * unused with KVD_NO_SNAPSHOT). */
static KVD_UNUSED void put_le16(uint8_t *p, uint32_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static void put_le64(uint8_t *p, uint64_t v)
{
	put_le32(p, (uint32_t)v);
	put_le32(p + 4, (uint32_t)(v >> 32));
}
static KVD_UNUSED uint32_t get_le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static KVD_UNUSED uint64_t get_le64(const uint8_t *p) { return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32; }

/* LEB128 varints, the one encoding and the one decoder of them: the log
 * (section 9) and the protobuf wire (section 5) write the same bytes.  The
 * decoder takes protowire.ConsumeVarint's rule: 10 bytes at most, the 10th
 * at most 1 -- a longer or overflowing varint is corrupt, not truncated. */
KVD_RESIDENT static size_t varint_len(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

KVD_RESIDENT static int get_varint(const uint8_t **pp, const uint8_t *end, uint64_t *v)
{
	const uint8_t *p = *pp;
	uint64_t r = 0;
	unsigned i;

	for (i = 0; i < 10; i++) {
		if (p >= end || (i == 9 && *p > 1))
			return KVD_ECORRUPT;
		r |= (uint64_t)(*p & 0x7f) << (7 * i);
		if (*p++ < 0x80) {
			*v = r;
			*pp = p;
			return 0;
		}
	}
	return KVD_ECORRUPT;
}

/* Length of the valid UTF-8 sequence at p (1..4), 0 if invalid. */
static size_t utf8_len(const uint8_t *p, const uint8_t *end)
{
	uint32_t c = p[0], v;
	size_t n, i;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		n = 2, v = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		n = 3, v = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 4, v = c & 0x07;
	else
		return 0;
	if ((size_t)(end - p) < n)
		return 0;
	for (i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		v = v << 6 | (p[i] & 0x3f);
	}
	if ((n == 3 && (v < 0x800 || (v >= 0xd800 && v <= 0xdfff))) || (n == 4 && (v < 0x10000 || v > 0x10ffff)))
		return 0; /* overlong, surrogate, or beyond Unicode */
	return n;
}

/* ---- the loop's wake-up, SHA-1, rate buckets ------------------------------- */

/* The loop sleeps no later than `when` (monotonic ms): every timer in every
 * section asks through this; the loop (section 35) starts afresh each turn. */
static void util_wake_by(struct kvd *k, int64_t when)
{
	if (when < k->next_timer)
		k->next_timer = when;
}

/*
 * SHA-1 (FIPS 180-4), for etcd's member ids and confd's HMAC-SHA1: kvd's
 * own rather than mbedtls', whose rounds are unrolled (5-6 KB, kvd's whole
 * use of mbedtls without TLS, JWT or snapshots) and which a small mbedtls
 * leaves out (TLS has no use for it: mbedtls' default profile refuses
 * certificates signed with SHA-1, as etcd 3.7 does).  One round a loop
 * turn, the schedule in a ring of 16 words: ~400 bytes.  A context is
 * copied by assignment (confd keeps its keyed states so).
 */
struct util_sha1 {
	uint32_t h[5];
	uint64_t len;   /* bytes hashed */
	uint8_t buf[64]; /* len % 64 of them wait here */
};

/* Zero what held a secret (a key, a password, a keyed hash state): stores
 * that are written, whatever the compiler knows of the memory's fate. */
KVD_UNUSED static void util_wipe(void *p, size_t n)
{
	volatile uint8_t *v = p;

	while (n--)
		*v++ = 0;
}

static uint32_t util_rol32(uint32_t x, unsigned n)
{
	return x << n | x >> (32 - n);
}

KVD_RESIDENT static void util_sha1_block(uint32_t h[5], const uint8_t *p)
{
	uint32_t w[16], a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f, t;
	unsigned i;

	for (i = 0; i < 80; i++) {
		if (i < 16)
			w[i] = get_be32(p + 4 * i);
		else /* w[i-3] ^ w[i-8] ^ w[i-14] ^ w[i-16], rotated */
			w[i & 15] = util_rol32(w[(i + 13) & 15] ^ w[(i + 8) & 15] ^ w[(i + 2) & 15] ^ w[i & 15], 1);
		if (i < 20)
			f = (b & c) | (~b & d), t = 0x5a827999;
		else if (i < 40)
			f = b ^ c ^ d, t = 0x6ed9eba1;
		else if (i < 60)
			f = (b & c) | (b & d) | (c & d), t = 0x8f1bbcdc;
		else
			f = b ^ c ^ d, t = 0xca62c1d6;
		t += util_rol32(a, 5) + f + e + w[i & 15];
		e = d;
		d = c;
		c = util_rol32(b, 30);
		b = a;
		a = t;
	}
	h[0] += a;
	h[1] += b;
	h[2] += c;
	h[3] += d;
	h[4] += e;
}

KVD_RESIDENT static void util_sha1_init(struct util_sha1 *c)
{
	static const uint32_t iv[5] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0};

	memcpy(c->h, iv, sizeof iv);
	c->len = 0;
}

KVD_RESIDENT static void util_sha1_update(struct util_sha1 *c, const void *data, size_t n)
{
	const uint8_t *p = data;
	size_t have = (size_t)(c->len % 64), m;

	c->len += n;
	if (have) {
		m = KVD_MIN(n, 64 - have);
		memcpy(c->buf + have, p, m);
		p += m;
		n -= m;
		if (have + m < 64)
			return;
		util_sha1_block(c->h, c->buf);
	}
	for (; n >= 64; p += 64, n -= 64)
		util_sha1_block(c->h, p);
	memcpy(c->buf, p, n);
}

KVD_RESIDENT static void util_sha1_final(struct util_sha1 *c, uint8_t out[20])
{
	uint64_t bits = c->len * 8;
	size_t have = (size_t)(c->len % 64);
	unsigned i;

	c->buf[have++] = 0x80;
	if (have > 56) {
		memset(c->buf + have, 0, 64 - have);
		util_sha1_block(c->h, c->buf);
		have = 0;
	}
	memset(c->buf + have, 0, 56 - have);
	put_be64(c->buf + 56, bits);
	util_sha1_block(c->h, c->buf);
	for (i = 0; i < 5; i++)
		put_be32(out + 4 * i, c->h[i]);
}

/* SHA-1 of one buffer. */
KVD_RESIDENT static void util_sha1(const void *p, size_t n, uint8_t out[20])
{
	struct util_sha1 c;

	util_sha1_init(&c);
	util_sha1_update(&c, p, n);
	util_sha1_final(&c, out);
}

/* Token bucket: rate tokens per second, burst tokens at most; 1 = taken. */
static void bucket_init(struct bucket *b, uint32_t burst, int64_t now)
{
	b->milli = (int64_t)burst * 1000;
	b->at_ms = now;
}

static int bucket_take(struct bucket *b, int64_t now, uint32_t rate, uint32_t burst)
{
	if (now > b->at_ms) {
		b->milli += (now - b->at_ms) * rate;
		if (b->milli > (int64_t)burst * 1000)
			b->milli = (int64_t)burst * 1000;
		b->at_ms = now;
	}
	if (b->milli < 1000)
		return 0;
	b->milli -= 1000;
	return 1;
}

/* ---- fair shares --------------------------------------------------------- */

/*
 * Fair shares of bounded pools.  Connection slots, TLS handshakes, password
 * hashes, watchers and buffered request bytes are each bounded in all.  Who
 * holds them is a share: a source address (IPv4, or an IPv6 /64) or, for
 * watchers with auth on, a user.  Nobody is limited while a pool has room;
 * when it is full, the share holding the most yields to a newcomer holding
 * clearly less (max-min fairness), so a few hostile addresses can fill a
 * pool but cannot keep an honest client out of it, and an honest busy host
 * is refused only when it is itself the largest holder.  A share lives in a
 * small hash table while something refers to it (a connection, a watch
 * stream); its counts are what it holds of each pool.
 */
enum { SHARE_CONNS, SHARE_HANDSHAKES, SHARE_WATCHERS, SHARE_INPUT, SHARE_KINDS };
struct share {
	struct share *next;            /* hash chain */
	uint64_t n[SHARE_KINDS];       /* what it holds of each pool */
	uint64_t vt;                   /* password hashes: when it was last served (a virtual clock) */
	unsigned refs;
	size_t klen;
	uint8_t key[];                 /* 'a' + net_src_key's 9 bytes, or 'u' + a user name's bytes */
};

static uint64_t share_hash(const uint8_t *p, size_t n)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	while (n--)
		h = (h ^ *p++) * 1099511628211ull;
	return h;
}

static uint64_t share_key_hash(const struct share *e)
{
	return share_hash(e->key + 1, e->klen - 1) ^ e->key[0];
}

/* The share of type ('a' an address, 'u' a user) and name p[0..n) (a
 * reference taken), made if new; NULL without memory. */
static struct share *share_get(struct kvd *k, int type, const uint8_t *p, size_t n)
{
	struct share_tab *t = &k->shares;
	struct share *e, **b;
	uint64_t h = share_hash(p, n) ^ (uint64_t)type;
	size_t i;

	if (t->b)
		for (e = t->b[h & t->mask]; e; e = e->next)
			if (e->klen == n + 1 && e->key[0] == type && !memcmp(e->key + 1, p, n)) {
				e->refs++;
				return e;
			}
	if (t->n >= t->mask) { /* grow at a load of 1: chains stay short */
		size_t sz = t->mask ? (t->mask + 1) * 2 : 64;
		struct share **nb = kvd_calloc(k, sz * sizeof *nb), *next;
		if (!nb)
			return NULL;
		for (i = 0; t->b && i <= t->mask; i++)
			for (e = t->b[i]; e; e = next) {
				next = e->next;
				e->next = nb[share_key_hash(e) & (sz - 1)];
				nb[share_key_hash(e) & (sz - 1)] = e;
			}
		kvd_free(k, t->b);
		t->b = nb;
		t->mask = sz - 1;
	}
	if (!(e = kvd_calloc(k, sizeof *e + n + 1)))
		return NULL;
	e->key[0] = (uint8_t)type;
	if (n)
		memcpy(e->key + 1, p, n);
	e->klen = n + 1;
	e->refs = 1;
	b = &t->b[h & t->mask];
	e->next = *b;
	*b = e;
	t->n++;
	return e;
}

/* Drop a reference; the last one frees it (it holds nothing by then). */
static void share_put(struct kvd *k, struct share *e)
{
	struct share **b;

	if (!e || --e->refs)
		return;
	for (b = &k->shares.b[share_key_hash(e) & k->shares.mask]; *b; b = &(*b)->next)
		if (*b == e) {
			*b = e->next;
			break;
		}
	k->shares.n--;
	kvd_free(k, e);
}

/* The share that holds the most of pool kind (NULL if nobody holds any). */
static struct share *share_max(struct kvd *k, int kind)
{
	struct share *e, *best = NULL;
	size_t i;

	for (i = 0; k->shares.b && i <= k->shares.mask; i++)
		for (e = k->shares.b[i]; e; e = e->next)
			if (e->n[kind] && (!best || e->n[kind] > best->n[kind]))
				best = e;
	return best;
}

/* At close: the table (every share went with what referred to it). */
static void share_fini(struct kvd *k)
{
	(void)KVD_ALWAYS(!k->shares.n);
	kvd_free(k, k->shares.b);
	k->shares.b = NULL;
	k->shares.mask = k->shares.n = 0;
}

/* Must `have` (the newcomer's holding) yield to nobody, or may it take
 * from `top`, which holds at least `margin` more?  (max-min: a holder
 * gives up a unit only when it keeps at least as much as the newcomer.) */
static int share_may_take(const struct share *top, const struct share *have, int kind, uint64_t margin)
{
	uint64_t mine = have ? have->n[kind] : 0;

	return top && top != have && top->n[kind] >= mine + margin;
}

/* ===== 4. Byte buffers (buf_) ============================================ */

/*
 * The byte buffer every section appends to and reads from (struct kvd_buf,
 * section 2): writers append at len, readers consume from rd, and the
 * buffer compacts before it grows.  A failed append is remembered, not
 * returned to each caller, so a writer appends freely and checks once.
 *
 * Invariants:
 *   1. rd <= len <= cap and the live bytes are p[rd..len): buf_consume
 *      resets a drained buffer to 0; buf_grow moves them to the front when
 *      that makes room in a buffer at most half full, else copies only
 *      them into the bigger block.
 *   2. A lent buffer (net_read lends k->rbuf) is never reallocated or
 *      freed: buf_grow and buf_free refuse it (KVD_ALWAYS(!b->lent)).
 *   3. b->err is sticky: a failed buf_reserve sets it and buf_append then
 *      appends nothing; only buf_reset and buf_free clear it.
 *   4. A buffer never filled has p NULL, and BUF_DATA gives NULL, never
 *      NULL + 0 (undefined behaviour); a decoder that must not see
 *      NULL is given "" instead (call_message).
 */

static int buf_grow(struct kvd *k, struct kvd_buf *b, size_t n);

/* Make room for n more bytes at the end; compacts before growing.  A
 * failure is also remembered in b->err. */
KVD_RESIDENT static int buf_reserve(struct kvd *k, struct kvd_buf *b, size_t n)
{
	if (b->cap - b->len >= n)
		return 0;
	if (buf_grow(k, b, n)) {
		b->err = 1;
		return KVD_ENOMEM;
	}
	return 0;
}

static int buf_grow(struct kvd *k, struct kvd_buf *b, size_t n)
{
	size_t live = BUF_LEN(b), cap;
	uint8_t *p;

	if (!KVD_ALWAYS(!b->lent)) /* a loan must not be reallocated */
		return KVD_ENOMEM;
	if (b->rd && b->cap - live >= n && live <= b->cap / 2) {
		memmove(b->p, b->p + b->rd, live);
		b->rd = 0;
		b->len = live;
		return 0;
	}
	if (n > SIZE_MAX / 4 - live)
		return KVD_ENOMEM;
	if (!b->rd)
		return util_grow(k, &b->p, &b->cap, live + n, 1, 256);
	cap = util_grow_cap(b->cap, live + n, 1, 256); /* compact into the new block */
	p = kvd_malloc(k, cap);
	if (!p)
		return KVD_ENOMEM;
	memcpy(p, b->p + b->rd, live);
	kvd_free(k, b->p);
	b->p = p;
	b->rd = 0;
	b->len = live;
	b->cap = cap;
	return 0;
}

static int buf_append(struct kvd *k, struct kvd_buf *b, const void *p, size_t n)
{
	if (buf_reserve(k, b, n))
		return KVD_ENOMEM;
	if (n)
		memcpy(b->p + b->len, p, n);
	b->len += n;
	return 0;
}

/* Empty again, error forgotten: the buffer is about to be rewritten. */
static KVD_UNUSED void buf_reset(struct kvd_buf *b) /* unused with KVD_NO_CONFD */
{
	b->rd = b->len = 0;
	b->err = 0;
}

static void buf_consume(struct kvd_buf *b, size_t n)
{
	b->rd += n;
	if (b->rd >= b->len)
		b->rd = b->len = 0;
}

KVD_RESIDENT static void buf_free(struct kvd *k, struct kvd_buf *b)
{
	if (KVD_ALWAYS(!b->lent))
		kvd_free(k, b->p);
	memset(b, 0, sizeof *b);
}

/* Give memory back after a burst: an empty buffer above 'keep' is freed. */
static void buf_trim(struct kvd *k, struct kvd_buf *b, size_t keep)
{
	if (BUF_LEN(b) == 0 && b->cap > keep)
		buf_free(k, b);
}

/* ===== 5. Protobuf glue: requests checked, the wire written by hand (pb_) == */

/* The generated code is part of this translation unit (the onelua pattern),
 * so `cc kvd.c` needs no extra sources.  Its descriptors carry every
 * message, field, enum value and method name, which only the JSON mapping
 * (section 7) reads; without it (KVD_NO_HTTP) the same code generated with
 * optimize_for = CODE_SIZE serves (proto/<f>.noname.pb-c.c: the names NULL,
 * no by-name indexes, the same headers and numbers; make proto writes both):
 * 16 KB less in a static x86_64 image. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-prototypes"
#endif
#ifndef KVD_NO_HTTP
#include "proto/kv.pb-c.c"
#include "proto/auth.pb-c.c"
#include "proto/rpc.pb-c.c"
#ifndef KVD_NO_RECIPES
#include "proto/v3lock.pb-c.c"
#include "proto/v3election.pb-c.c"
#endif
#include "proto/health.pb-c.c"
#else
#include "proto/kv.noname.pb-c.c"
#include "proto/auth.noname.pb-c.c"
#include "proto/rpc.noname.pb-c.c"
#ifndef KVD_NO_RECIPES
#include "proto/v3lock.noname.pb-c.c"
#include "proto/v3election.noname.pb-c.c"
#endif
#include "proto/health.noname.pb-c.c"
#endif
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/*
 * Requests are checked before protobuf-c sees them.  protobuf-c unpacks a
 * nested message by recursing, so a TxnRequest nested a few thousand levels
 * deep (29 KB on the wire) would run any stack dry; and it refuses some of
 * what etcd's decoder takes.  etcd 3.7 decodes every message (its own and
 * grpc-go's health service) with protobuf-go, in one pass that stops at the
 * first fault:
 *
 *   - a known field with the wrong wire type is an unknown field, skipped;
 *     so are groups (nested, each closed by its own field number);
 *   - a field number of 0 or above 2^29-1 (MaxInt32 inside a group), a
 *     varint of more than 10 bytes or with a 10th byte above 1, a length or
 *     a fixed32/64 past the end, wire types 6 and 7, a stray end-group, a
 *     packed run that does not end with its field:
 *       proto: cannot parse invalid wire-format data
 *   - a string field (proto3: singular or repeated) that is not UTF-8:
 *       string field contains invalid UTF-8
 *
 * pb_check walks the bytes once in that order, without recursion (an
 * explicit stack of PB_MAX_DEPTH levels), so a malformed request gets etcd's
 * text.  What etcd skips and protobuf-c refuses -- a mistyped known field, a
 * group, a tag or length prefix longer than the 5 bytes protobuf-c reads --
 * sets PB_F_STRIP, and pb_strip rewrites the message at every depth without
 * it (and without unknown fields, which etcd ignores).  The rewrite is never
 * longer than the original: tags and byte lengths are written minimally,
 * and a nested message's length keeps the width its original length needs,
 * padded (protobuf-c takes a non-minimal varint of up to 5 bytes).
 *
 * Only a Txn can nest (TxnRequest -> RequestOp -> TxnRequest): two message
 * levels per txn level, so KVD_MAX_TXN_NEST levels of txns below the top
 * one take PB_MAX_DEPTH.  etcd's own bound is --max-txn-ops levels (each
 * level costs its parent one op); kvd answers deeper ones as etcd answers
 * those: "too many operations in txn request".
 *
 * Invariants:
 *   1. No request bytes reach protobuf-c unchecked: call_decode (section 8)
 *      runs pb_check first, for gRPC and gateway requests alike, and
 *      unpacks (pb_unpack) only what it accepted -- pb_strip's rewrite of
 *      it when PB_F_STRIP is set.
 *   2. Neither walk recurses: pb_check and pb_strip keep an explicit stack
 *      of PB_MAX_DEPTH levels and pb_skip one of PB_MAX_GROUPS groups;
 *      messages nested deeper get etcd's E_TOO_MANY_OPS (KVD_ELIMIT),
 *      groups kvd's own words.
 *   3. pb_strip's output is never longer than its input, so the n-byte
 *      copy call_decode makes holds it.
 *   4. What kvd assembles from pieces is written with pb_put_* and
 *      pb_buf_* only; an unpacked message is allocated through k->pba
 *      (pb_alloc, counted as any other) and freed with pb_free.
 *   5. A string a request carries is taken whole: a handler reads a
 *      name, a password, a URL or a version through pb_str (its wire
 *      length), never with strlen or strcmp, so "root\0x" is never
 *      "root".  Names kvd stores as C strings (a user's roles) never hold
 *      a NUL: creating one is refused (pb_str_nul), and a snapshot that
 *      holds one too (auth_apply).
 */
#ifndef KVD_MAX_TXN_NEST /* @@ txns nested inside a txn, below the top one (etcd: --max-txn-ops) */
#define KVD_MAX_TXN_NEST 32
#endif
#define PB_MAX_DEPTH (2 * KVD_MAX_TXN_NEST + 3) /* + RequestOp and its Range/Put/Delete */
#define PB_MAX_GROUPS 32   /* nested groups kvd skips (protobuf-go: 10000) */
#define PB_MAX_FIELD 536870911u
#define PB_F_STRIP 1u      /* holds fields protobuf-c cannot take: pb_strip them */
#define PB_E_WIRE "proto: cannot parse invalid wire-format data"
#define PB_E_UTF8 "string field contains invalid UTF-8"


/* A length prefix and what it covers. */
static int pb_len(const uint8_t **pp, const uint8_t *end, const uint8_t **body_end)
{
	uint64_t n;

	if (get_varint(pp, end, &n) || n > (uint64_t)(end - *pp))
		return -1;
	*body_end = *pp + n;
	return 0;
}

/* protowire.ConsumeFieldValue for an unknown field (number num, wire type
 * wt, its tag just read): groups to their own end, never recursing.
 * Returns 0, -1 (malformed), or 1 (groups nested deeper than kvd follows). */
static int pb_skip(const uint8_t **pp, const uint8_t *end, uint64_t num, unsigned wt)
{
	uint64_t open[PB_MAX_GROUPS], v;
	const uint8_t *body;
	unsigned depth = 0;

	for (;;) {
		switch (wt) {
		case 0: if (get_varint(pp, end, &v)) return -1; break;
		case 1: if (end - *pp < 8) return -1; *pp += 8; break;
		case 2: if (pb_len(pp, end, &body)) return -1; *pp = body; break;
		case 3: if (depth == PB_MAX_GROUPS) return 1; open[depth++] = num; break;
		case 4: if (!depth || open[depth - 1] != num) return -1; depth--; break;
		case 5: if (end - *pp < 4) return -1; *pp += 4; break;
		default: return -1;
		}
		if (!depth)
			return 0;
		if (get_varint(pp, end, &v) || !(v >> 3) || (v >> 3) > 0x7fffffffu)
			return -1;
		num = v >> 3;
		wt = (unsigned)(v & 7);
	}
}

/* The wire type a field takes: 0 varint, 1 fixed64, 2 bytes, 5 fixed32. */
static unsigned pb_wire_type(const ProtobufCFieldDescriptor *f)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_STRING:
	case PROTOBUF_C_TYPE_BYTES:
	case PROTOBUF_C_TYPE_MESSAGE: return 2;
	case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_DOUBLE: return 1;
	case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_FLOAT: return 5;
	default: return 0;
	}
}

/* A field's wire type as both decoders take it (scalars may come packed). */
static int pb_wire_ok(const ProtobufCFieldDescriptor *f, unsigned wt)
{
	unsigned want = pb_wire_type(f);

	return wt == want || (wt == 2 && want != 2 && f->label == PROTOBUF_C_LABEL_REPEATED);
}

/* The descriptor's field for a tag, if a known one of the right wire type. */
static const ProtobufCFieldDescriptor *pb_field(const ProtobufCMessageDescriptor *d, uint64_t tag)
{
	const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3));

	return f && pb_wire_ok(f, (unsigned)(tag & 7)) ? f : NULL;
}

/*
 * Check request bytes as etcd's decoder would, depth first and in order, so
 * the first fault found is the one etcd reports.  Returns 0 (flags: PB_F_*),
 * KVD_EPROTO (why: etcd's text), or KVD_ELIMIT (nested deeper than max_depth).
 */
static int pb_check(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, unsigned max_depth,
                    char *why, size_t whylen, unsigned *flags)
{
	struct { const ProtobufCMessageDescriptor *d; const uint8_t *end; uint64_t seen; } st[PB_MAX_DEPTH];
	const ProtobufCFieldDescriptor *f;
	const uint8_t *body, *at;
	const char *e = PB_E_WIRE;
	size_t fi;
	unsigned depth = 0, wt, unit;
	uint64_t tag, v;
	int r;

	*flags = 0;
	if (max_depth > PB_MAX_DEPTH)
		max_depth = PB_MAX_DEPTH;
	st[0].d = d;
	st[0].end = n ? p + n : p; /* an empty message may come as NULL */
	st[0].seen = 0;
	for (;;) {
		while (p == st[depth].end) {
			if (!depth)
				return 0;
			depth--;
		}
		d = st[depth].d;
		at = p;
		if (get_varint(&p, st[depth].end, &tag) || !(tag >> 3) || (tag >> 3) > PB_MAX_FIELD)
			break;
		wt = (unsigned)(tag & 7);
		if (wt == 4) /* an end-group outside any group */
			break;
		*flags |= p - at > 5 ? PB_F_STRIP : 0; /* protobuf-c reads 5 tag bytes at most */
		if (!(f = pb_field(d, tag))) { /* unknown, or known with the wrong wire type: skipped */
			*flags |= wt == 3 || protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3)) ? PB_F_STRIP : 0;
			if ((r = pb_skip(&p, st[depth].end, tag >> 3, wt)) > 0) {
				snprintf(why, whylen, "kvd: groups nested deeper than %d are not supported", PB_MAX_GROUPS);
				return KVD_EPROTO;
			}
			if (r)
				break;
			continue;
		}
		if (wt == 0) {
			if (get_varint(&p, st[depth].end, &v))
				break;
			continue;
		}
		if (wt == 1 || wt == 5) {
			if (st[depth].end - p < (wt == 1 ? 8 : 4))
				break;
			p += wt == 1 ? 8 : 4;
			continue;
		}
		at = p;
		if (pb_len(&p, st[depth].end, &body))
			break;
		*flags |= p - at > 5 ? PB_F_STRIP : 0;
		if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
			if (depth + 1 >= max_depth)
				return KVD_ELIMIT;
			if (f->label != PROTOBUF_C_LABEL_REPEATED) { /* twice: merged (pb_strip), as etcd's decoder does */
				fi = (size_t)(f - st[depth].d->fields);
				*flags |= fi >= 64 || (st[depth].seen >> fi & 1) ? PB_F_STRIP : 0;
				st[depth].seen |= fi < 64 ? (uint64_t)1 << fi : 0;
			}
			depth++;
			st[depth].d = f->descriptor;
			st[depth].end = body;
			st[depth].seen = 0;
			continue;
		}
		if ((unit = pb_wire_type(f)) != 2) { /* a packed run: whole values up to its end */
			while (p < body && (unit == 0 ? !get_varint(&p, body, &v) : body - p >= (unit == 1 ? 8 : 4)))
				p += unit == 0 ? 0 : unit == 1 ? 8 : 4;
			if (p != body)
				break;
		} else if (f->type == PROTOBUF_C_TYPE_STRING) {
			for (; p < body; p += v)
				if (!(v = utf8_len(p, body))) {
					e = PB_E_UTF8;
					break;
				}
			if (p != body)
				break;
		}
		p = body;
	}
	snprintf(why, whylen, "%s", e);
	return KVD_EPROTO;
}

/* v as a varint of exactly w bytes (w >= its minimal width). */
static uint8_t *pb_put_padded(uint8_t *o, uint64_t v, unsigned w)
{
	while (--w) {
		*o++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*o++ = (uint8_t)v;
	return o;
}

/* [p, p + x) and the y bytes after it swapped, by three reversals. */
static void pb_rotate(uint8_t *p, size_t x, size_t y)
{
	uint8_t *a, *b, t;
	size_t i;

	for (i = 0; i < 3; i++)
		for (a = p + (i == 1 ? x : 0), b = p + (i == 0 ? x : x + y); a < b && a < --b; a++) {
			t = *a;
			*a = *b;
			*b = t;
		}
}

/* Which field of a oneof the merge table tracks: its singular message
 * fields by index, below PB_MERGE_FIELDS (test/test.c pb_merge_fields
 * holds every request message to that). */
#define PB_MERGE_FIELDS 16
static int pb_merge_index(const ProtobufCMessageDescriptor *d, const ProtobufCFieldDescriptor *f)
{
	size_t i = (size_t)(f - d->fields);

	return f->type == PROTOBUF_C_TYPE_MESSAGE && f->label != PROTOBUF_C_LABEL_REPEATED &&
	       KVD_ALWAYS(i < PB_MERGE_FIELDS) ? (int)i : -1;
}

/* A member of a oneof was set: the others' earlier copies merge no more
 * (protobuf-go starts a new message when the oneof comes back to them). */
static void pb_merge_switch(const ProtobufCMessageDescriptor *d, const ProtobufCFieldDescriptor *f, uint32_t *last)
{
	size_t i;

	if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
		return;
	for (i = 0; i < d->n_fields && i < PB_MERGE_FIELDS; i++)
		if (&d->fields[i] != f && (d->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
		    d->fields[i].quantifier_offset == f->quantifier_offset)
			last[i] = 0;
}

/* The merge table of a message pb_strip wrote at out[from, to): where
 * each singular message field last begins (+ 1), as the message stands. */
static void pb_merge_scan(const ProtobufCMessageDescriptor *d, const uint8_t *out, size_t from, size_t to,
                          uint32_t *last)
{
	const uint8_t *p = out + from, *end = out + to, *at, *body;
	const ProtobufCFieldDescriptor *f;
	uint64_t tag, v;
	int i;

	memset(last, 0, PB_MERGE_FIELDS * sizeof *last);
	while (p < end) {
		at = p;
		if (get_varint(&p, end, &tag) || !(f = pb_field(d, tag)))
			return; /* cannot happen: pb_strip wrote only known fields */
		pb_merge_switch(d, f, last);
		switch (tag & 7) {
		case 0: if (get_varint(&p, end, &v)) return; break;
		case 1: p += 8; break;
		case 5: p += 4; break;
		default:
			if (pb_len(&p, end, &body))
				return;
			if ((i = pb_merge_index(d, f)) >= 0)
				last[i] = (uint32_t)(at - out) + 1;
			p = body;
		}
	}
}

/*
 * A message pb_check accepted, rewritten at every depth with only what
 * protobuf-c takes (known fields of their wire type), into out (n bytes at
 * most).  Returns its length, or (size_t)-1 when merging would take more
 * than kvd gives it.
 *
 * A singular message field that comes again is merged into its first copy
 * (protobuf's rule, and etcd's decoder's: the copies' fields together, the
 * later ones' scalars winning), where protobuf-c keeps only the last copy
 * of a oneof member: `request_put{key:k}` then `request_put{value:v}` is
 * one put of k=v.  The earlier copy, already written, is moved to the end
 * of what its message has so far (a rotation of the output) and opened
 * again, its length widened if it must be; the new copy's fields then
 * follow its own.  A oneof member set in between starts the copies afresh.
 * Rotations move at most 4n + 64 KiB bytes in all: a message built to
 * make them quadratic is refused instead (honest senders repeat a field
 * only when they concatenate a few messages).
 */
static size_t pb_strip(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, uint8_t *out)
{
	struct {
		const ProtobufCMessageDescriptor *d;
		const uint8_t *end;
		size_t lenat;
		unsigned w;
		uint32_t last[PB_MERGE_FIELDS]; /* merge table: offset + 1 of a field's latest copy */
	} st[PB_MAX_DEPTH];
	const ProtobufCFieldDescriptor *f;
	const uint8_t *val, *body, *q;
	unsigned depth = 0, wt, tw, w0, w;
	uint64_t tag, v, len;
	size_t o = 0, a, e, moved = 0, budget = 4 * n + 65536;
	int mi;

	st[0].d = d;
	st[0].end = p + n;
	memset(st[0].last, 0, sizeof st[0].last);
	for (;;) {
		while (p == st[depth].end) {
			if (!depth)
				return o;
			pb_put_padded(out + st[depth].lenat, o - st[depth].lenat - st[depth].w, st[depth].w);
			depth--;
		}
		if (get_varint(&p, st[depth].end, &tag))
			return o; /* cannot happen: pb_check read it */
		wt = (unsigned)(tag & 7);
		if (!(f = pb_field(st[depth].d, tag))) {
			if (pb_skip(&p, st[depth].end, tag >> 3, wt))
				return o;
			continue;
		}
		pb_merge_switch(st[depth].d, f, st[depth].last);
		val = p;
		if (wt != 2) {
			o = (size_t)(pb_put_padded(out + o, tag, (unsigned)varint_len(tag)) - out);
			if (wt == 0 ? get_varint(&p, st[depth].end, &v) : (p += wt == 1 ? 8 : 4, 0))
				return o;
			memcpy(out + o, val, (size_t)(p - val));
			o += (size_t)(p - val);
			continue;
		}
		if (pb_len(&p, st[depth].end, &body))
			return o;
		mi = pb_merge_index(st[depth].d, f);
		if (f->type == PROTOBUF_C_TYPE_MESSAGE && depth + 1 < PB_MAX_DEPTH && mi >= 0 && st[depth].last[mi]) {
			/* a copy of it was written at a: move it to the end, open it again */
			a = st[depth].last[mi] - 1;
			tw = (unsigned)varint_len(tag);
			q = out + a + tw;
			if (get_varint(&q, out + o, &len))
				return o; /* cannot happen: pb_strip wrote it */
			w0 = (unsigned)(q - (out + a + tw));
			e = (size_t)(q - out) + (size_t)len;
			if ((moved += o - a) > budget)
				return (size_t)-1;
			pb_rotate(out + a, e - a, o - e);
			for (mi = 0; mi < PB_MERGE_FIELDS; mi++)
				if (st[depth].last[mi] > e)
					st[depth].last[mi] -= (uint32_t)(e - a);
			a = o - (e - a);
			st[depth].last[pb_merge_index(st[depth].d, f)] = (uint32_t)a + 1;
			/* its length must hold the new copy too: widened where needed (the
			 * new copy's tag and length, dropped, leave the room) */
			w = (unsigned)varint_len(len + (uint64_t)(body - p));
			if (w > w0) {
				memmove(out + a + tw + w, out + a + tw + w0, (size_t)len);
				o += w - w0;
			} else {
				w = w0;
			}
			depth++;
			st[depth].d = f->descriptor;
			st[depth].end = body;
			st[depth].lenat = a + tw;
			st[depth].w = w;
			pb_merge_scan(f->descriptor, out, a + tw + w, o, st[depth].last);
			continue;
		}
		if (mi >= 0)
			st[depth].last[mi] = (uint32_t)o + 1;
		o = (size_t)(pb_put_padded(out + o, tag, (unsigned)varint_len(tag)) - out);
		if (f->type == PROTOBUF_C_TYPE_MESSAGE && depth + 1 < PB_MAX_DEPTH) {
			depth++;
			st[depth].d = f->descriptor;
			st[depth].end = body;
			st[depth].lenat = o;
			st[depth].w = (unsigned)varint_len((uint64_t)(body - p));
			memset(st[depth].last, 0, sizeof st[depth].last);
			o += st[depth].w;
			continue;
		}
		o = (size_t)(pb_put_padded(out + o, (uint64_t)(body - p), (unsigned)varint_len((uint64_t)(body - p))) - out);
		memmove(out + o, p, (size_t)(body - p));
		o += (size_t)(body - p);
		p = body;
	}
}

KVD_RESIDENT static void *pb_alloc(void *data, size_t n)
{
	struct kvd *k = data;
	void *p = kvd_malloc(k, n);

	k->pb_oom |= !p;
	return p;
}
static void pb_release(void *data, void *p) { kvd_free(data, p); }

/* Unpack bytes pb_check accepted; NULL on no memory (*oom set) or on the
 * little protobuf-c refuses that etcd takes (groups). */
static ProtobufCMessage *pb_unpack(struct kvd *k, const ProtobufCMessageDescriptor *d,
                                   const uint8_t *p, size_t n, int *oom)
{
	ProtobufCMessage *m;

	k->pb_oom = 0;
	m = protobuf_c_message_unpack(d, &k->pba, n, p);
	*oom = k->pb_oom;
	return m;
}

KVD_RESIDENT static void pb_free(struct kvd *k, void *m)
{
	if (m)
		protobuf_c_message_free_unpacked(m, &k->pba);
}

/*
 * A string field of an unpacked message, whole.  proto3 strings may hold
 * U+0000 (gRPC sends it as is, the gateway as \u0000), but protobuf-c hands
 * a string over NUL-ended, so strlen would cut "root\0x" to "root".  It
 * allocates exactly length + 1 bytes for each string it unpacks, through
 * k->pba -- kvd_malloc, whose header holds the size -- so the length is
 * that size less one; an absent proto3 string is protobuf-c's shared
 * empty string (no header).  Invariant 5 below; test/test.c pb_str_whole
 * holds the linked protobuf-c to it.
 */
static struct kvd_slice pb_str(const char *s)
{
	struct kvd_slice r;
	size_t n;

	r.p = (const uint8_t *)(s ? s : "");
	r.n = 0;
	if (!s || s == protobuf_c_empty_string)
		return r;
	n = ((const union mem_hdr *)(const void *)s - 1)->n;
	r.n = KVD_ALWAYS(n && !s[n - 1] && strlen(s) <= n - 1) ? n - 1 : strlen(s);
	return r;
}

/* Does string field s hold a NUL before its end (a name kvd keeps as a C
 * string could then be another's)? */
static int pb_str_nul(const char *s)
{
	return s && pb_str(s).n != strlen(s);
}

/* ---- the wire, written by hand -----------------------------------------
 *
 * protobuf-c packs whole messages.  Where kvd assembles one from pieces
 * -- a live WatchResponse from events packed once for every watcher
 * (section 27), a lease record in a snapshot (section 14), a message the
 * JSON gateway decodes field by field (section 7) -- it writes the wire
 * with these, and nowhere by hand: a tag is (field number << 3 | wire
 * type) as a varint; a length-delimited field is its tag, its length as
 * a varint, its bytes.  Field numbers are named where they are used, and
 * a unit test holds each name to protobuf-c's descriptor.
 */
enum { PB_WT_VARINT = 0, PB_WT_I64 = 1, PB_WT_LEN = 2, PB_WT_I32 = 5 };
#define PB_HDR_MAX 15 /* a tag (5 bytes) and a length (10) at most */

static uint8_t *pb_put_tag(uint8_t *o, uint32_t num, unsigned wt)
{
	return put_varint(o, (uint64_t)num << 3 | wt);
}

/* A varint field: tag, value. */
static uint8_t *pb_put_uint(uint8_t *o, uint32_t num, uint64_t v)
{
	return put_varint(pb_put_tag(o, num, PB_WT_VARINT), v);
}

/* A length-delimited field's tag and length; its n bytes go next. */
static uint8_t *pb_put_lenhdr(uint8_t *o, uint32_t num, uint64_t n)
{
	return put_varint(pb_put_tag(o, num, PB_WT_LEN), n);
}

static size_t pb_lenhdr_size(uint32_t num, uint64_t n)
{
	return varint_len((uint64_t)num << 3) + varint_len(n);
}

/* The same onto a buffer (a failed append sets b->err, as buf_append does).
 * The gateway's decoder (section 7) is their user: unused with KVD_NO_HTTP. */
static KVD_UNUSED void pb_buf_uint(struct kvd *k, struct kvd_buf *b, uint32_t num, uint64_t v)
{
	uint8_t t[PB_HDR_MAX];

	buf_append(k, b, t, (size_t)(pb_put_uint(t, num, v) - t));
}

static KVD_UNUSED void pb_buf_bytes(struct kvd *k, struct kvd_buf *b, uint32_t num, const void *p, size_t n)
{
	uint8_t t[PB_HDR_MAX];

	buf_append(k, b, t, (size_t)(pb_put_lenhdr(t, num, n) - t));
	buf_append(k, b, p, n);
}

/* fixed32 (bits 32) or fixed64, little-endian as the wire has them. */
static KVD_UNUSED void pb_buf_fixed(struct kvd *k, struct kvd_buf *b, uint32_t num, int bits, uint64_t v)
{
	uint8_t t[5 + 8], *o = pb_put_tag(t, num, bits == 32 ? PB_WT_I32 : PB_WT_I64);

	if (bits == 32)
		put_le32(o, (uint32_t)v);
	else
		put_le64(o, v);
	buf_append(k, b, t, (size_t)(o - t) + (size_t)bits / 8);
}

/* Auth (sections 12 and 19, after the log and the calls): the log replays
 * and rewrites its records; services check their callers. */
struct mvcc_rec;
static int auth_replay(struct kvd *k, const struct mvcc_rec *rec, const char **why);
static void auth_commit(struct kvd *k);
static void auth_rollback(struct kvd *k);
static int auth_who(struct kvd *k, struct call *c, struct auth_who *w, struct svc_err *e);
static int auth_may(struct kvd *k, const struct auth_who *w, const ProtobufCBinaryData *key,
                    const ProtobufCBinaryData *end, int type, struct svc_err *e);
static int auth_txn(struct kvd *k, const struct auth_who *w, const Etcdserverpb__TxnRequest *rq, struct svc_err *e);
static int auth_lease_keys(struct kvd *k, const struct auth_who *w, int64_t id, int type, struct svc_err *e);
static void auth_step(struct kvd *k);
static const char *auth_watch_reason(const struct svc_err *e);
static const char *tls_peer_cn(const struct conn *c, size_t *n);
#define AUTH_R AUTHPB__PERMISSION__TYPE__READ
#define AUTH_W AUTHPB__PERMISSION__TYPE__WRITE

/* ===== 6. JSON: a strict reader, a writer (json_) ======================== */

/*
 * A small strict JSON reader (RFC 8259) into a tree held in one arena, and
 * a compact writer.  Bounded: depth JSON_MAX_DEPTH, input size by the
 * caller, nodes by the input.  Strings are unescaped to UTF-8 (invalid UTF-8
 * and lone surrogates are refused) and NUL-terminated; object members keep
 * their input order.  The writer emits ASCII only (\uXXXX for the rest), and
 * numbers as Haskell's Text.JSON does (Ganeti's confd is the peer that
 * cares): an integral value as an integer, others as Haskell's `show` of a
 * Double.  Syntax errors are worded as Go's encoding/json words them.  This
 * tree serves confd and JWTs; the gateway's bodies are read, and its answers
 * written, by the protobuf mapping that follows (two readers of its own, as
 * grpc-gateway has them, neither building a tree).
 *
 * Invariants:
 *   1. The reader recurses at most JSON_MAX_DEPTH levels (json_container
 *      refuses deeper ones), so no input runs the stack dry.
 *   2. A document's nodes and strings live in its arena and stay valid
 *      until json_free; json_parse frees the arena itself when it fails,
 *      the caller when it succeeds.
 *   3. A string read is UTF-8, lone surrogates refused, and NUL-terminated
 *      with its length in n -- it may hold a NUL from \u0000 (json_string).
 *   4. The writer's output is ASCII-only, valid JSON for any bytes it is
 *      given (json_put_str takes what is not UTF-8 as Latin-1).
 *   5. Running out of memory is never blamed on the document: json_oom
 *      answers KVD_ENOMEM and "out of memory", not a syntax error.
 */

#define JSON_MAX_DEPTH 64
#define JSON_CHUNK 16384 /* arena chunk bytes */

struct json_chunk {
	struct json_chunk *next;
	size_t used, cap;
	union mem_hdr align;
	/* data follows */
};

struct json_parser {
	struct json_doc *doc;
	const uint8_t *p, *end;
	struct json *stack; /* children being collected, all levels */
	size_t nstack, capstack;
	int depth;
	const char *err;
	int oom;            /* err is "out of memory" */
};

static void *json_alloc(struct json_doc *d, size_t n)
{
	struct json_chunk *c = d->chunks;
	void *p;

	n = (n + sizeof(union mem_hdr) - 1) / sizeof(union mem_hdr) * sizeof(union mem_hdr);
	if (!c || c->cap - c->used < n) {
		size_t cap = KVD_MAX(n, (size_t)JSON_CHUNK);
		if (!(c = kvd_malloc(d->k, sizeof *c + cap)))
			return NULL;
		c->next = d->chunks;
		c->used = 0;
		c->cap = cap;
		d->chunks = c;
		d->bytes += sizeof *c + cap;
	}
	p = (uint8_t *)(c + 1) + c->used;
	c->used += n;
	return p;
}

static void json_free(struct json_doc *d)
{
	struct json_chunk *c, *next;

	for (c = d->chunks; c; c = next) {
		next = c->next;
		kvd_free(d->k, c);
	}
	d->chunks = NULL;
	d->root = NULL;
	d->bytes = 0;
}

static void json_ws(struct json_parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static int json_fail(struct json_parser *ps, const char *why)
{
	if (!ps->err)
		ps->err = why;
	return KVD_EPROTO;
}

/*
 * A syntax error at `at` in Go's encoding/json words ("invalid character
 * 'x' looking for beginning of value"; "unexpected EOF" past the end), as
 * the gateway's clients read them from etcd.
 */
static void json_go_char(unsigned c, char *q);

static int json_syntax(struct json_parser *ps, const uint8_t *at, const char *ctx)
{
	char q[12];

	if (ps->err)
		return KVD_EPROTO;
	if (at >= ps->end) {
		ps->err = "unexpected EOF";
		return KVD_EPROTO;
	}
	json_go_char(*at, q);
	snprintf(ps->doc->why, sizeof ps->doc->why, "invalid character '%s' %s", q, ctx);
	ps->err = ps->doc->why;
	return KVD_EPROTO;
}

/* Out of memory is not the document's fault: it says so. */
static int json_oom(struct json_parser *ps)
{
	if (!ps->err)
		ps->err = "out of memory";
	ps->oom = 1;
	return KVD_ENOMEM;
}
static int json_hex4(const uint8_t *p, uint32_t *v)
{
	int i;

	for (*v = 0, i = 0; i < 4; i++) {
		int c = p[i];
		*v <<= 4;
		if (c >= '0' && c <= '9')
			*v |= (uint32_t)(c - '0');
		else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
			*v |= (uint32_t)((c | 0x20) - 'a' + 10);
		else
			return KVD_EPROTO;
	}
	return 0;
}

/*
 * One escape at p (p[0] == '\\'), the one decoder of them both JSON readers
 * use (each words its errors as its Go decoder does): *cp the code point, a
 * surrogate pair joined; *n the bytes it took.  0, or where it went wrong:
 * the input ends inside it (SHORT, or SHORT_PAIR inside the second half of
 * a pair), p[1] names no escape (CODE), \u without four hex digits (HEX), a
 * low surrogate first (LOW), a high one not followed by \u and a low one
 * (PAIR: that second escape would start at p + 6).
 */
enum { JSON_ESC_SHORT = 1, JSON_ESC_SHORT_PAIR, JSON_ESC_CODE, JSON_ESC_HEX, JSON_ESC_LOW, JSON_ESC_PAIR };

static int json_escape(const uint8_t *p, const uint8_t *end, uint32_t *cp, size_t *n)
{
	static const char from[8] = {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'};
	static const char to[8] = {'"', '\\', '/', '\b', '\f', '\n', '\r', '\t'};
	const char *e;
	uint32_t c, lo;

	if (end - p < 2)
		return JSON_ESC_SHORT;
	if (p[1] != 'u') {
		if (!(e = memchr(from, p[1], sizeof from)))
			return JSON_ESC_CODE;
		*cp = (uint8_t)to[e - from];
		*n = 2;
		return 0;
	}
	if (end - p < 6)
		return JSON_ESC_SHORT;
	if (json_hex4(p + 2, &c))
		return JSON_ESC_HEX;
	*cp = c;
	*n = 6;
	if (c < 0xd800 || c > 0xdfff)
		return 0;
	if (c >= 0xdc00)
		return JSON_ESC_LOW;
	if (end - p < 12)
		return JSON_ESC_SHORT_PAIR;
	if (p[6] != '\\' || p[7] != 'u' || json_hex4(p + 8, &lo) || lo < 0xdc00 || lo > 0xdfff)
		return JSON_ESC_PAIR;
	*cp = 0x10000 + ((c - 0xd800) << 10) + (lo - 0xdc00);
	*n = 12;
	return 0;
}

static uint8_t *json_put_utf8(uint8_t *o, uint32_t c)
{
	if (c < 0x80) {
		*o++ = (uint8_t)c;
	} else if (c < 0x800) {
		*o++ = (uint8_t)(0xc0 | c >> 6);
		*o++ = (uint8_t)(0x80 | (c & 0x3f));
	} else if (c < 0x10000) {
		*o++ = (uint8_t)(0xe0 | c >> 12);
		*o++ = (uint8_t)(0x80 | (c >> 6 & 0x3f));
		*o++ = (uint8_t)(0x80 | (c & 0x3f));
	} else {
		*o++ = (uint8_t)(0xf0 | c >> 18);
		*o++ = (uint8_t)(0x80 | (c >> 12 & 0x3f));
		*o++ = (uint8_t)(0x80 | (c >> 6 & 0x3f));
		*o++ = (uint8_t)(0x80 | (c & 0x3f));
	}
	return o;
}

/*
 * Go's strconv quoting, which the errors the gateway's clients read use.
 * json_go_print: unicode.IsPrint, to the extent kvd can know it -- control
 * and format characters, separators other than ' ', private use and
 * noncharacters are not printable; kvd has no table of unassigned code
 * points, which Go also escapes.
 */
static int json_go_print(uint32_t r)
{
	if (r < 0x20 || (r >= 0x7f && r <= 0xa0) || r == 0xad)
		return 0;
	if (r < 0x600)
		return 1;
	return !((r >= 0x600 && r <= 0x605) || r == 0x61c || r == 0x6dd || r == 0x70f || r == 0x1680 || r == 0x180e ||
	         (r >= 0x2000 && r <= 0x200f) || (r >= 0x2028 && r <= 0x202f) || (r >= 0x205f && r <= 0x206f) ||
	         r == 0x3000 || (r >= 0xd800 && r <= 0xf8ff) || r == 0xfeff || (r >= 0xfff9 && r <= 0xfffb) ||
	         (r & 0xfffe) == 0xfffe || r >= 0xf0000);
}

/* The rune of the valid UTF-8 sequence p[0..l) (utf8_len said l). */
static uint32_t json_utf8_rune(const uint8_t *p, size_t l)
{
	if (l == 1)
		return p[0];
	if (l == 2)
		return (p[0] & 0x1fu) << 6 | (p[1] & 0x3fu);
	if (l == 3)
		return (p[0] & 0x0fu) << 12 | (p[1] & 0x3fu) << 6 | (p[2] & 0x3fu);
	return (p[0] & 0x07u) << 18 | (p[1] & 0x3fu) << 12 | (p[2] & 0x3fu) << 6 | (p[3] & 0x3fu);
}

/* Rune r as it stands inside a Go double-quoted string (strconv.Quote). */
static char *json_go_rune(char *o, uint32_t r)
{
	static const char hex[] = "0123456789abcdef";

	if (r == '"' || r == '\\') {
		*o++ = '\\';
		*o++ = (char)r;
	} else if (json_go_print(r)) {
		o = (char *)json_put_utf8((uint8_t *)o, r);
	} else if (r >= '\a' && r <= '\r') {
		*o++ = '\\';
		*o++ = "abtnvfr"[r - '\a'];
	} else if (r < 0x20 || r == 0x7f) {
		o += sprintf(o, "\\x%c%c", hex[r >> 4], hex[r & 15]);
	} else {
		o += sprintf(o, r < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)r);
	}
	return o;
}

/* Go's %q of the bytes s[0..n) (a byte that is not UTF-8 as \xNN) into
 * out, which has room for 10 * n + 3.  (The gateway's: unused with KVD_NO_HTTP.) */
static KVD_UNUSED void json_go_quote(const uint8_t *s, size_t n, char *out)
{
	const uint8_t *p = s, *end = s + n;
	char *o = out;
	size_t l;

	*o++ = '"';
	while (p < end) {
		if (*p < 0x80 || !(l = utf8_len(p, end))) {
			if (*p >= 0x80)
				o += sprintf(o, "\\x%02x", *p);
			else
				o = json_go_rune(o, *p);
			p++;
			continue;
		}
		o = json_go_rune(o, json_utf8_rune(p, l));
		p += l;
	}
	*o++ = '"';
	*o = 0;
}

/* Byte c as encoding/json's syntax errors quote it (quoteChar: the byte
 * taken as a Latin-1 rune), without the single quotes; q has room for 12. */
static void json_go_char(unsigned c, char *q)
{
	if (c == '\'' || c == '"') {
		snprintf(q, 12, "%s", c == '"' ? "\"" : "\\'");
		return;
	}
	*json_go_rune(q, c) = 0;
}

/* A string at ps->p (after the quote): unescaped into the arena. */
static int json_string(struct json_parser *ps, const char **out, uint32_t *len)
{
	const uint8_t *p = ps->p, *q;
	uint8_t *o, *start;
	size_t raw = 0, n;
	uint32_t c;

	for (q = p; q < ps->end && *q != '"'; q++, raw++) /* an upper bound for the output */
		if (*q == '\\' && q + 1 < ps->end)
			q++, raw++;
	if (q >= ps->end)
		return json_syntax(ps, ps->end, "");
	if (raw > 0xfffffff0u || !(start = o = json_alloc(ps->doc, raw + 1)))
		return raw > 0xfffffff0u ? json_fail(ps, "string too long") : json_oom(ps);
	while (*p != '"') {
		if (*p < 0x20)
			return json_syntax(ps, p, "in string literal");
		if (*p != '\\') {
			if (!(n = utf8_len(p, ps->end)))
				return json_fail(ps, "invalid UTF-8");
			memcpy(o, p, n);
			o += n;
			p += n;
			continue;
		}
		switch (json_escape(p, ps->end, &c, &n)) {
		case 0:
			o = json_put_utf8(o, c);
			p += n;
			break;
		case JSON_ESC_SHORT:
		case JSON_ESC_HEX:
			for (p += 2; p < ps->end && ((*p >= '0' && *p <= '9') || ((*p | 0x20) >= 'a' && (*p | 0x20) <= 'f'));)
				p++;
			return json_syntax(ps, p, "in \\u hexadecimal character escape");
		case JSON_ESC_CODE:
			return json_syntax(ps, p + 1, "in string escape code");
		default:
			return json_fail(ps, "lone surrogate");
		}
	}
	*o = 0;
	ps->p = p + 1;
	*out = (const char *)start;
	*len = (uint32_t)(o - start);
	return 0;
}

static int json_number(struct json_parser *ps, struct json *v)
{
	const uint8_t *p = ps->p, *s = p;
	char tmp[64];
	int frac = 0;

	if (p < ps->end && *p == '-')
		p++;
	if (p >= ps->end || !(*p >= '0' && *p <= '9'))
		return json_syntax(ps, p, p == s ? "looking for beginning of value" : "in numeric literal");
	if (*p == '0')
		p++;
	else
		while (p < ps->end && *p >= '0' && *p <= '9')
			p++;
	if (p < ps->end && *p == '.') {
		frac = 1;
		if (++p >= ps->end || !(*p >= '0' && *p <= '9'))
			return json_syntax(ps, p, "after decimal point in numeric literal");
		while (p < ps->end && *p >= '0' && *p <= '9')
			p++;
	}
	if (p < ps->end && (*p == 'e' || *p == 'E')) {
		frac = 1;
		if (++p < ps->end && (*p == '+' || *p == '-'))
			p++;
		if (p >= ps->end || !(*p >= '0' && *p <= '9'))
			return json_syntax(ps, p, "in exponent of numeric literal");
		while (p < ps->end && *p >= '0' && *p <= '9')
			p++;
	}
	if ((size_t)(p - s) >= sizeof tmp)
		return json_fail(ps, "number too long");
	memcpy(tmp, s, (size_t)(p - s));
	tmp[p - s] = 0;
	v->type = JSON_NUM;
	v->n = (uint32_t)(p - s); /* the literal, for readers that want it exact (the gateway's int64s) */
	if (!(v->s = json_alloc(ps->doc, v->n + 1)))
		return json_oom(ps);
	memcpy((char *)v->s, tmp, v->n + 1);
	v->d = strtod(tmp, NULL);
	if (v->d != v->d || v->d > 1.7976931348623157e308 || v->d < -1.7976931348623157e308)
		return json_fail(ps, "number out of range");
	if (!frac) { /* exact when it fits */
		char *e;
		errno = 0;
		v->i = strtoll(tmp, &e, 10);
		v->isint = errno == 0;
	} else if (v->d >= -9.2233720368547758e18 && v->d < 9.2233720368547758e18 && v->d == (double)(int64_t)v->d) {
		v->i = (int64_t)v->d; /* 5000000.0 is the integer 5000000, as a Haskell Rational */
		v->isint = 1;
	}
	ps->p = p;
	return 0;
}

static int json_push(struct json_parser *ps, const struct json *v)
{
	if (UTIL_GROW(ps->doc->k, ps->stack, ps->capstack, ps->nstack + 1, 64))
		return json_oom(ps);
	ps->stack[ps->nstack++] = *v;
	return 0;
}

static int json_value(struct json_parser *ps, struct json *v);

/* An array or object: its children are collected on the stack, then moved
 * into one arena array. */
static int json_container(struct json_parser *ps, struct json *v, int obj)
{
	size_t base = ps->nstack, n;
	struct json kid;
	const char *key = NULL;
	uint32_t klen = 0;
	int r;

	if (++ps->depth > JSON_MAX_DEPTH)
		return json_fail(ps, "nested too deep");
	ps->p++;
	json_ws(ps);
	if (ps->p < ps->end && *ps->p == (obj ? '}' : ']')) {
		ps->p++;
	} else {
		for (;;) {
			json_ws(ps);
			if (obj) {
				if (ps->p >= ps->end || *ps->p != '"')
					return json_syntax(ps, ps->p, "looking for beginning of object key string");
				ps->p++;
				if ((r = json_string(ps, &key, &klen)))
					return r;
				json_ws(ps);
				if (ps->p >= ps->end || *ps->p != ':')
					return json_syntax(ps, ps->p, "after object key");
				ps->p++;
			}
			memset(&kid, 0, sizeof kid);
			if ((r = json_value(ps, &kid)))
				return r;
			kid.key = key;
			kid.klen = klen;
			if ((r = json_push(ps, &kid)))
				return r;
			json_ws(ps);
			if (ps->p < ps->end && *ps->p == ',') {
				ps->p++;
				continue;
			}
			if (ps->p < ps->end && *ps->p == (obj ? '}' : ']')) {
				ps->p++;
				break;
			}
			return json_syntax(ps, ps->p, obj ? "after object key:value pair" : "after array element");
		}
	}
	n = ps->nstack - base;
	v->type = obj ? JSON_OBJ : JSON_ARR;
	v->n = (uint32_t)n;
	if (n && !(v->kids = json_alloc(ps->doc, n * sizeof *v->kids)))
		return json_oom(ps);
	if (n)
		memcpy(v->kids, ps->stack + base, n * sizeof *v->kids);
	ps->nstack = base;
	ps->depth--;
	return 0;
}

static int json_value(struct json_parser *ps, struct json *v)
{
	json_ws(ps);
	if (ps->p >= ps->end)
		return json_syntax(ps, ps->p, "");
	switch (*ps->p) {
	case '{':
		return json_container(ps, v, 1);
	case '[':
		return json_container(ps, v, 0);
	case '"':
		ps->p++;
		v->type = JSON_STR;
		return json_string(ps, &v->s, &v->n);
	case 't':
	case 'f':
	case 'n': {
		static const char *const words[] = {"null", "false", "true"};
		int w = *ps->p == 'n' ? 0 : *ps->p == 'f' ? 1 : 2;
		size_t l = strlen(words[w]), j;
		for (j = 1; j < l; j++)
			if (ps->p + j >= ps->end || ps->p[j] != words[w][j]) {
				char ctx[40];
				snprintf(ctx, sizeof ctx, "in literal %s (expecting '%c')", words[w], words[w][j]);
				return json_syntax(ps, ps->p + j, ctx);
			}
		ps->p += l;
		v->type = (uint8_t)(JSON_NULL + w);
		return 0;
	}
	default:
		return json_number(ps, v);
	}
}

/*
 * Parse p[0..n) into d (whose memory is the caller's to json_free).  Only
 * whitespace may follow the value.  Returns 0, or KVD_EINVAL with *err set.
 * Its readers are JWT claims and confd (the gateway's decoders are section
 * 7's): with both left out, it and json_get, json_is_str are unused.
 */
static KVD_UNUSED int json_parse(struct kvd *k, struct json_doc *d, const void *p, size_t n, const char **err)
{
	struct json_parser ps;
	struct json *root;
	int r;

	memset(d, 0, sizeof *d);
	memset(&ps, 0, sizeof ps);
	d->k = k;
	ps.doc = d;
	ps.p = p;
	ps.end = ps.p + n;
	root = json_alloc(d, sizeof *root);
	if (!root) {
		*err = "out of memory";
		return KVD_ENOMEM;
	}
	memset(root, 0, sizeof *root);
	r = json_value(&ps, root);
	if (!r) {
		json_ws(&ps);
		if (ps.p != ps.end)
			r = json_syntax(&ps, ps.p, "after top-level value");
	}
	kvd_free(k, ps.stack);
	if (r) {
		*err = ps.err;
		json_free(d);
		return ps.oom ? KVD_ENOMEM : KVD_EINVAL;
	}
	d->root = root;
	return 0;
}

/* The member named key of object o, or NULL (the first one if repeated). */
static KVD_UNUSED const struct json *json_get(const struct json *o, const char *key)
{
	size_t l = strlen(key);
	uint32_t i;

	if (!o || o->type != JSON_OBJ)
		return NULL;
	for (i = 0; i < o->n; i++)
		if (o->kids[i].klen == l && !memcmp(o->kids[i].key, key, l))
			return &o->kids[i];
	return NULL;
}

/* The same, the last one if repeated: as Go's encoding/json fills a map
 * (a JWT's claims are one, so two readers must not see two users). */
static KVD_UNUSED const struct json *json_get_last(const struct json *o, const char *key)
{
	size_t l = strlen(key);
	uint32_t i;

	if (!o || o->type != JSON_OBJ)
		return NULL;
	for (i = o->n; i-- > 0;)
		if (o->kids[i].klen == l && !memcmp(o->kids[i].key, key, l))
			return &o->kids[i];
	return NULL;
}

static KVD_UNUSED int json_is_str(const struct json *v)
{
	return v && v->type == JSON_STR;
}

/* ---- writing ------------------------------------------------------------- */

/* A string as JSON, ASCII only.  Bytes that are not UTF-8 are taken as
 * Latin-1, so any input gives valid output. */
static void json_put_str(struct kvd *k, struct kvd_buf *b, const void *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	const uint8_t *p = s, *end = p + n;
	uint8_t *o;
	uint32_t c;
	size_t l;

	if (n > SIZE_MAX / 12 - 2) {
		b->err = 1;
		return;
	}
	if (buf_reserve(k, b, n * 12 + 2))
		return;
	o = b->p + b->len;
	*o++ = '"';
	while (p < end) {
		c = *p;
		if (c >= 0x20 && c < 0x7f) {
			if (c == '"' || c == '\\')
				*o++ = '\\';
			*o++ = (uint8_t)c;
			p++;
			continue;
		}
		if (c == '\n' || c == '\t' || c == '\r' || c == '\b' || c == '\f') {
			*o++ = '\\';
			*o++ = c == '\n' ? 'n' : c == '\t' ? 't' : c == '\r' ? 'r' : c == '\b' ? 'b' : 'f';
			p++;
			continue;
		}
		if (c >= 0x80 && (l = utf8_len(p, end)) > 1) {
			c = l == 2 ? (p[0] & 0x1fu) << 6 | (p[1] & 0x3fu)
			  : l == 3 ? (p[0] & 0x0fu) << 12 | (p[1] & 0x3fu) << 6 | (p[2] & 0x3fu)
			           : (p[0] & 0x07u) << 18 | (p[1] & 0x3fu) << 12 | (p[2] & 0x3fu) << 6 | (p[3] & 0x3fu);
			p += l;
		} else {
			p++;
		}
		if (c >= 0x10000) {
			uint32_t hi = 0xd800 + ((c - 0x10000) >> 10), lo = 0xdc00 + ((c - 0x10000) & 0x3ff);
			o += sprintf((char *)o, "\\u%c%c%c%c", hex[hi >> 12], hex[hi >> 8 & 15], hex[hi >> 4 & 15], hex[hi & 15]);
			c = lo;
		}
		o += sprintf((char *)o, "\\u%c%c%c%c", hex[c >> 12], hex[c >> 8 & 15], hex[c >> 4 & 15], hex[c & 15]);
	}
	*o++ = '"';
	b->len = (size_t)(o - b->p);
}

static void json_put_raw(struct kvd *k, struct kvd_buf *b, const char *s)
{
	buf_append(k, b, s, strlen(s));
}

static void json_put_int(struct kvd *k, struct kvd_buf *b, int64_t v)
{
	char t[24];

	snprintf(t, sizeof t, "%lld", (long long)v);
	json_put_raw(k, b, t);
}

/*
 * A double as Haskell's `show` prints it (Text.JSON uses it for every
 * non-integral number): the shortest digits that read back to the same
 * double, in fixed notation for 0.1 <= |x| < 10^7 ("0.5", "123.25") and
 * scientific otherwise ("1.343869045604884e9", "1.0e-2").
 */
static void json_haskell_double(double x, char *out)
{
	char t[40], digits[24], *o = out;
	int prec, e, nd, i;
	const char *p;

	if (x == 0) {
		strcpy(out, "0.0");
		return;
	}
	for (prec = 0; prec < 17; prec++) { /* the shortest digits that round-trip */
		snprintf(t, sizeof t, "%.*e", prec, x);
		if (strtod(t, NULL) == x)
			break;
	}
	snprintf(t, sizeof t, "%.*e", prec, x);
	p = t;
	if (*p == '-')
		*o++ = *p++;
	for (nd = 0; *p && *p != 'e'; p++)
		if (*p != '.')
			digits[nd++] = *p;
	while (nd > 1 && digits[nd - 1] == '0')
		nd--;
	digits[nd] = 0;
	e = atoi(p + 1) + 1; /* x = 0.DIGITS * 10^e */
	if (e < 0 || e > 7) {
		sprintf(o, "%c.%se%d", digits[0], nd > 1 ? digits + 1 : "0", e - 1);
		return;
	}
	if (!e)
		*o++ = '0';
	for (i = 0; i < e; i++)
		*o++ = i < nd ? digits[i] : '0';
	*o++ = '.';
	sprintf(o, "%s", nd > e ? digits + e : "0");
}

static void json_put_num(struct kvd *k, struct kvd_buf *b, const struct json *v)
{
	char t[48];

	if (v->isint) {
		json_put_int(k, b, v->i);
		return;
	}
	json_haskell_double(v->d, t);
	json_put_raw(k, b, t);
}

/* v as compact JSON. */
static KVD_UNUSED void json_write(struct kvd *k, struct kvd_buf *b, const struct json *v) /* confd's */
{
	uint32_t i;

	switch (v->type) {
	case JSON_NULL: json_put_raw(k, b, "null"); return;
	case JSON_FALSE: json_put_raw(k, b, "false"); return;
	case JSON_TRUE: json_put_raw(k, b, "true"); return;
	case JSON_NUM: json_put_num(k, b, v); return;
	case JSON_STR: json_put_str(k, b, v->s, v->n); return;
	}
	json_put_raw(k, b, v->type == JSON_OBJ ? "{" : "[");
	for (i = 0; i < v->n && !b->err; i++) {
		if (i)
			json_put_raw(k, b, ",");
		if (v->type == JSON_OBJ) {
			json_put_str(k, b, v->kids[i].key, v->kids[i].klen);
			json_put_raw(k, b, ":");
		}
		json_write(k, b, &v->kids[i]);
	}
	json_put_raw(k, b, v->type == JSON_OBJ ? "}" : "]");
}

/* ===== 7. JSON <-> protobuf, as etcd's gateway maps them (json_) ========= */

#ifndef KVD_NO_HTTP /* @@ KVD_NO_HTTP: no HTTP/1.1 (make HTTP=0): no JSON gateway, /health, /version, /metrics; an HTTP/1.1 request gets a 404 saying so */

/*
 * etcd's gateway (grpc-gateway) maps each protobuf message to JSON and
 * back, and kvd's gateway (section 33) answers as it does: this section
 * owns that mapping, both ways, walking protobuf-c's descriptors -- section
 * 6 owns the JSON text itself, section 5 the protobuf wire.
 *
 * Invariants:
 *   1. Out: a message becomes the JSON grpc-gateway v2 writes (protojson:
 *      int64 as strings, bytes as base64, enums by name, zero values left
 *      out), from its descriptor alone.
 *   2. In: a request body is decoded as protojson decodes it, field by
 *      field onto the protobuf wire with section 5's pb_buf_* and
 *      pb_put_lenhdr -- never by hand -- and then unpacked by protobuf-c
 *      like any gRPC request; what protojson refuses gets protojson's
 *      error text.
 */

/*
 * The gateway's JSON mapping has this one owner.  etcd 3.7 serves it with
 * grpc-gateway v2, whose marshaller is google.golang.org/protobuf's
 * protojson (UseProtoNames; unpopulated fields left out; DiscardUnknown on
 * input).
 *
 * In, two readers, as grpc-gateway has them.  It reads a body with
 * encoding/json's Decoder, one value (a bidi stream's body: one value per
 * message), and hands exactly that value's bytes -- the space before it
 * dropped, whatever follows unread -- to protojson.Unmarshal:
 *
 *   json_scan is the Decoder: Go's scanner, allocation-free and bounded
 *     (JSON_MAX_DEPTH).  Its words for a syntax error ("invalid character
 *     'x' looking for beginning of value"; "unexpected EOF" when the body
 *     ends inside a value); a body of nothing but space is no request at
 *     all; a value that may still grow is "need more" (KVD_EAGAIN), a bad
 *     one is bad as soon as its first bad byte is in.  Go's scanner takes
 *     any byte above 0x1f in a string and any \uXXXX; a top-level number,
 *     string or literal ends at the byte after it (5xyz is the value 5).
 *   json_pj_decode is protojson reading that value, token by token in
 *     document order, the first fault its answer:
 *       - a member names a field by its JSON (lowerCamel) name, else by its
 *         proto name; an unknown name, or an extension's "[...]", is
 *         skipped (its value still read);
 *       - a field named twice (by either name) is refused, and so is a
 *         second member of a oneof; null leaves a field unset (but named);
 *       - integers: a number, or a string holding one with no space around
 *         it (what follows the number's delimiter is ignored: "12 x" is 12);
 *         1e2 and 1.0 are integers, 1.5 is not;
 *       - enums by name -- an unknown name is dropped, as if absent -- or by
 *         number, not by a quoted number;
 *       - bytes: base64, URL-safe if the text holds '-' or '_', unpadded if
 *         its length is not a multiple of 4, CR and LF ignored;
 *       - strings must be UTF-8, a surrogate escape must be half of a pair.
 *     Its words: "proto: (line 1:23): invalid value for int64 field limit:
 *     1.5", "proto: (line 1:16): duplicate field \"key\"", "proto: syntax
 *     error (line 1:1): unexpected token 5" (a field's JSON name, the
 *     token as written; line and rune column from the value's first byte;
 *     a token quoted in an error is cut at JSON_PJ_RAW bytes, Go's is not).
 *     "proto: " is written with plain spaces: protojson picks plain or
 *     no-break ones per build, and etcd 3.7.3's build has plain ones.
 *   JSON in is encoded straight to protobuf bytes, so a gateway request
 *   meets exactly the decoder (and its checks) a gRPC request meets.
 *
 * Out: answers are the messages a gRPC client would get, unpacked and
 * written: fields in number order (etcd's protos declare them so) under
 * their proto names; zero scalars, empty lists and absent messages left
 * out, but a oneof member or a present, empty message written; 64-bit
 * integers as strings, 32-bit ones as numbers; bytes as standard base64;
 * enums by name; strings as protojson writes them ('"', '\\' and control
 * bytes escaped, the rest as is: no HTML escapes).  A stream's
 * {"result":...} line is encoding/json's map around protojson's bytes,
 * which escapes <, >, & and U+2028/9 again (json_put_pjstr's html).
 * protojson refuses to write a string that is not UTF-8; kvd holds none
 * (requests are checked), so a stray bad byte is written as U+FFFD.
 */

#define JSON_PB_WHY 512 /* call_finish keeps 511 bytes */
#define JSON_PJ_RAW 400 /* a token quoted in an error, at most (cut between runes) */

static const char json_b64std[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int json_space(unsigned c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* ---- JSON out -------------------------------------------------------------- */

/*
 * A string as protojson writes it: '"', '\\' and control bytes escaped (\b
 * \f \n \r \t, else \u00xx), the rest as is.  html: as encoding/json then
 * re-escapes it inside a stream's line (<, >, & and U+2028/9 as \uXXXX).
 */
static void json_put_pjstr(struct kvd *k, struct kvd_buf *b, const void *s, size_t n, int html)
{
	static const char hex[] = "0123456789abcdef";
	const uint8_t *p = s, *end = p + n;
	uint8_t *o;
	size_t l;

	if (n > SIZE_MAX / 6 - 2) {
		b->err = 1;
		return;
	}
	if (buf_reserve(k, b, n * 6 + 2))
		return;
	o = b->p + b->len;
	*o++ = '"';
	while (p < end) {
		uint8_t c = *p;
		if (c < 0x80) {
			p++;
			if (c == '"' || c == '\\') {
				*o++ = '\\';
				*o++ = c;
			} else if (c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t') {
				*o++ = '\\';
				*o++ = c == '\b' ? 'b' : c == '\f' ? 'f' : c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
			} else if (c < 0x20 || (html && (c == '<' || c == '>' || c == '&'))) {
				memcpy(o, "\\u00", 4);
				o[4] = (uint8_t)hex[c >> 4];
				o[5] = (uint8_t)hex[c & 15];
				o += 6;
			} else {
				*o++ = c;
			}
			continue;
		}
		if (!(l = utf8_len(p, end))) {
			memcpy(o, "\xef\xbf\xbd", 3);
			o += 3;
			p++;
			continue;
		}
		if (html && l == 3 && p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) {
			memcpy(o, p[2] == 0xa8 ? "\\u2028" : "\\u2029", 6);
			o += 6;
		} else {
			memcpy(o, p, l);
			o += l;
		}
		p += l;
	}
	*o++ = '"';
	b->len = (size_t)(o - b->p);
}

static void json_put_b64(struct kvd *k, struct kvd_buf *b, const uint8_t *p, size_t n)
{
	if (n > SIZE_MAX / 2 || buf_reserve(k, b, (n + 2) / 3 * 4 + 2))
		return;
	b->p[b->len++] = '"';
	b->len += util_b64(json_b64std, 1, p, n, (char *)b->p + b->len);
	b->p[b->len++] = '"';
}

static size_t json_pb_elem_size(const ProtobufCFieldDescriptor *f)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE:
		return 8;
	case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
	case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
	case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
	case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
	default: return 4;
	}
}

static void json_pb_write(struct kvd *k, struct kvd_buf *b, const ProtobufCMessage *m, int html);

static void json_pb_value(struct kvd *k, struct kvd_buf *b, const ProtobufCFieldDescriptor *f, const void *v, int html)
{
	char t[32];

	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
		snprintf(t, sizeof t, "%ld", (long)*(const int32_t *)v);
		break;
	case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
		snprintf(t, sizeof t, "%lu", (unsigned long)*(const uint32_t *)v);
		break;
	case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
		snprintf(t, sizeof t, "\"%lld\"", (long long)*(const int64_t *)v);
		break;
	case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
		snprintf(t, sizeof t, "\"%llu\"", (unsigned long long)*(const uint64_t *)v);
		break;
	case PROTOBUF_C_TYPE_FLOAT:
		snprintf(t, sizeof t, "%.9g", (double)*(const float *)v);
		break;
	case PROTOBUF_C_TYPE_DOUBLE:
		snprintf(t, sizeof t, "%.17g", *(const double *)v);
		break;
	case PROTOBUF_C_TYPE_BOOL:
		snprintf(t, sizeof t, "%s", *(const protobuf_c_boolean *)v ? "true" : "false");
		break;
	case PROTOBUF_C_TYPE_ENUM: {
		const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, *(const int *)v);
		if (ev) {
			json_put_pjstr(k, b, ev->name, strlen(ev->name), html);
			return;
		}
		snprintf(t, sizeof t, "%d", *(const int *)v);
		break;
	}
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(char *const *)v;
		json_put_pjstr(k, b, s ? s : "", s ? strlen(s) : 0, html);
		return;
	}
	case PROTOBUF_C_TYPE_BYTES: {
		const ProtobufCBinaryData *d = v;
		json_put_b64(k, b, d->data, d->len);
		return;
	}
	default: /* PROTOBUF_C_TYPE_MESSAGE */
		json_pb_write(k, b, *(ProtobufCMessage *const *)v, html);
		return;
	}
	json_put_raw(k, b, t);
}

/* Is the singular field at v its type's zero value (left out)? */
static int json_pb_zero(const ProtobufCFieldDescriptor *f, const void *v)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(char *const *)v;
		return !s || !*s;
	}
	case PROTOBUF_C_TYPE_BYTES: return !((const ProtobufCBinaryData *)v)->len;
	case PROTOBUF_C_TYPE_MESSAGE: return !*(void *const *)v;
	case PROTOBUF_C_TYPE_BOOL: return !*(const protobuf_c_boolean *)v;
	case PROTOBUF_C_TYPE_FLOAT: return *(const float *)v == 0;
	case PROTOBUF_C_TYPE_DOUBLE: return *(const double *)v == 0;
	default: return json_pb_elem_size(f) == 8 ? !*(const uint64_t *)v : !*(const uint32_t *)v;
	}
}

/* Message m as protojson (UseProtoNames) writes it; html: inside a stream's
 * line.  Depth is the message's: the decoder bounded it (PB_MAX_DEPTH). */
static void json_pb_write(struct kvd *k, struct kvd_buf *b, const ProtobufCMessage *m, int html)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const uint8_t *base = (const uint8_t *)m;
	unsigned i, first = 1;
	size_t j, n = 0;

	json_put_raw(k, b, "{");
	for (i = 0; i < d->n_fields && !b->err; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const void *v = base + f->offset;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			n = *(const size_t *)(const void *)(base + f->quantifier_offset);
			if (!n)
				continue;
		} else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			if (*(const uint32_t *)(const void *)(base + f->quantifier_offset) != f->id)
				continue;
		} else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset) {
			if (!*(const protobuf_c_boolean *)(const void *)(base + f->quantifier_offset))
				continue;
		} else if (json_pb_zero(f, v)) {
			continue;
		}
		if (!first)
			json_put_raw(k, b, ",");
		first = 0;
		json_put_pjstr(k, b, f->name, strlen(f->name), html);
		json_put_raw(k, b, ":");
		if (f->label != PROTOBUF_C_LABEL_REPEATED) {
			json_pb_value(k, b, f, v, html);
			continue;
		}
		json_put_raw(k, b, "[");
		for (j = 0; j < n && !b->err; j++) {
			if (j)
				json_put_raw(k, b, ",");
			json_pb_value(k, b, f, *(const uint8_t *const *)v + j * json_pb_elem_size(f), html);
		}
		json_put_raw(k, b, "]");
	}
	json_put_raw(k, b, "}");
}

/* ---- JSON in: encoding/json's Decoder ------------------------------------------ */

enum {
	JSON_S_VALUE, JSON_S_VALUE_OR_END, JSON_S_KEY, JSON_S_KEY_OR_END, JSON_S_END, JSON_S_STR, JSON_S_ESC,
	JSON_S_U, JSON_S_NEG, JSON_S_ZERO, JSON_S_INT, JSON_S_DOT, JSON_S_FRAC, JSON_S_E, JSON_S_ESIGN, JSON_S_EXP,
	JSON_S_LIT
};

static int json_scan_fail(char *why, unsigned c, const char *ctx)
{
	char q[12];

	json_go_char(c, q);
	snprintf(why, JSON_PB_WHY, "invalid character '%s' %s", q, ctx);
	return KVD_EPROTO;
}

/*
 * The first JSON value in p[0..n), as encoding/json's Decoder finds it:
 * 0 with it at p[*from..*to) (*from == *to == n: nothing but space, and eof),
 * KVD_EAGAIN if it may still grow (more may come: !eof), or KVD_EPROTO with
 * Go's words in why (JSON_PB_WHY bytes).  Allocation-free; containers nest
 * JSON_MAX_DEPTH deep at most (Go's limit is 10000, its words kept).
 */
static int json_scan(const uint8_t *p, size_t n, int eof, size_t *from, size_t *to, char *why)
{
	uint64_t objs = 0; /* bit d: the container at depth d + 1 is an object */
	unsigned depth = 0, st = JSON_S_VALUE, key = 0, after_key = 0, nu = 0;
	const char *lit = "";
	char ctx[48];
	size_t i = 0;

	while (i < n && json_space(p[i]))
		i++;
	*from = *to = i;
	if (i == n)
		return eof ? 0 : KVD_EAGAIN;
	for (; i < n; i++) {
		unsigned c = p[i], digit = c >= '0' && c <= '9';
	again:
		switch (st) {
		case JSON_S_VALUE_OR_END:
			if (c == ']')
				goto closed;
			/* fall through */
		case JSON_S_VALUE:
			if (json_space(c))
				break;
			if (c == '{' || c == '[') {
				if (depth >= JSON_MAX_DEPTH)
					return json_scan_fail(why, c, "exceeded max depth");
				if (c == '{')
					objs |= (uint64_t)1 << depth;
				else
					objs &= ~((uint64_t)1 << depth);
				depth++;
				st = c == '{' ? JSON_S_KEY_OR_END : JSON_S_VALUE_OR_END;
			} else if (c == '"') {
				key = 0;
				st = JSON_S_STR;
			} else if (c == '-') {
				st = JSON_S_NEG;
			} else if (digit) {
				st = c == '0' ? JSON_S_ZERO : JSON_S_INT;
			} else if (c == 't' || c == 'f' || c == 'n') {
				lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
				nu = 1;
				st = JSON_S_LIT;
			} else {
				return json_scan_fail(why, c, "looking for beginning of value");
			}
			break;
		case JSON_S_KEY_OR_END:
			if (c == '}')
				goto closed;
			/* fall through */
		case JSON_S_KEY:
			if (json_space(c))
				break;
			if (c != '"')
				return json_scan_fail(why, c, "looking for beginning of object key string");
			key = 1;
			st = JSON_S_STR;
			break;
		case JSON_S_END:
			if (json_space(c))
				break;
			if (objs >> (depth - 1) & 1) {
				if (after_key) {
					if (c != ':')
						return json_scan_fail(why, c, "after object key");
					after_key = 0;
					st = JSON_S_VALUE;
				} else if (c == ',') {
					st = JSON_S_KEY;
				} else if (c == '}') {
					goto closed;
				} else {
					return json_scan_fail(why, c, "after object key:value pair");
				}
			} else if (c == ',') {
				st = JSON_S_VALUE;
			} else if (c == ']') {
				goto closed;
			} else {
				return json_scan_fail(why, c, "after array element");
			}
			break;
		case JSON_S_STR:
			if (c == '"') {
				if (!key)
					goto scalar_in;
				after_key = 1;
				st = JSON_S_END;
			} else if (c == '\\') {
				st = JSON_S_ESC;
			} else if (c < 0x20) {
				return json_scan_fail(why, c, "in string literal");
			}
			break;
		case JSON_S_ESC:
			if (c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't' || c == '\\' || c == '/' ||
			    c == '"') {
				st = JSON_S_STR;
			} else if (c == 'u') {
				nu = 0;
				st = JSON_S_U;
			} else {
				return json_scan_fail(why, c, "in string escape code");
			}
			break;
		case JSON_S_U:
			if (!digit && !((c | 0x20) >= 'a' && (c | 0x20) <= 'f'))
				return json_scan_fail(why, c, "in \\u hexadecimal character escape");
			if (++nu == 4)
				st = JSON_S_STR;
			break;
		case JSON_S_NEG:
			if (!digit)
				return json_scan_fail(why, c, "in numeric literal");
			st = c == '0' ? JSON_S_ZERO : JSON_S_INT;
			break;
		case JSON_S_INT:
			if (digit)
				break;
			/* fall through */
		case JSON_S_ZERO:
			if (c == '.')
				st = JSON_S_DOT;
			else if (c == 'e' || c == 'E')
				st = JSON_S_E;
			else
				goto scalar_out;
			break;
		case JSON_S_DOT:
			if (!digit)
				return json_scan_fail(why, c, "after decimal point in numeric literal");
			st = JSON_S_FRAC;
			break;
		case JSON_S_FRAC:
			if (digit)
				break;
			if (c != 'e' && c != 'E')
				goto scalar_out;
			st = JSON_S_E;
			break;
		case JSON_S_E:
			if (c == '+' || c == '-') {
				st = JSON_S_ESIGN;
				break;
			}
			/* fall through */
		case JSON_S_ESIGN:
			if (!digit)
				return json_scan_fail(why, c, "in exponent of numeric literal");
			st = JSON_S_EXP;
			break;
		case JSON_S_EXP:
			if (!digit)
				goto scalar_out;
			break;
		default: /* JSON_S_LIT */
			if (c != (uint8_t)lit[nu]) {
				snprintf(ctx, sizeof ctx, "in literal %s (expecting '%c')", lit, lit[nu]);
				return json_scan_fail(why, c, ctx);
			}
			if (!lit[++nu])
				goto scalar_in;
			break;
		}
		continue;
	closed: /* p[i] closes the container at depth */
		if (!--depth) {
			*to = i + 1;
			return 0;
		}
		st = JSON_S_END;
		after_key = 0;
		continue;
	scalar_in: /* a string or a literal ends with p[i]; at the top, Go's scanner needs the byte after it */
		if (!depth) {
			*to = i + 1;
			return i + 1 < n || eof ? 0 : KVD_EAGAIN;
		}
		st = JSON_S_END;
		after_key = 0;
		continue;
	scalar_out: /* a number ended before p[i] */
		if (!depth) {
			*to = i;
			return 0;
		}
		st = JSON_S_END;
		after_key = 0;
		goto again;
	}
	if (!eof)
		return KVD_EAGAIN;
	if (!depth && (st == JSON_S_ZERO || st == JSON_S_INT || st == JSON_S_FRAC || st == JSON_S_EXP)) {
		*to = n;
		return 0;
	}
	snprintf(why, JSON_PB_WHY, "unexpected EOF");
	return KVD_EPROTO;
}

/* ---- JSON in: protojson ------------------------------------------------------------ */

enum { JSON_T_EOF, JSON_T_NULL, JSON_T_BOOL, JSON_T_NUM, JSON_T_STR, JSON_T_NAME, JSON_T_OBJ, JSON_T_OBJ_END,
       JSON_T_ARR, JSON_T_ARR_END };

struct json_tok {
	int kind, boo;
	size_t pos, len; /* as written: in[pos..pos + len) */
};

struct json_pj {
	struct kvd *k;
	const uint8_t *in; /* the value */
	size_t n, at;
	struct kvd_buf str; /* the last string token's bytes, NUL-terminated */
	char *why;          /* JSON_PB_WHY bytes */
	int depth;
};

/* protojson's error at in[pos]: "proto: (line L:C): ..." (syntax: "proto:
 * syntax error (line L:C): ..."), the column counted in runes as Go does. */
static int json_pj_fail(struct json_pj *d, size_t pos, int syntax, const char *fmt, ...) KVD_PRINTF(4, 5);
static int json_pj_fail(struct json_pj *d, size_t pos, int syntax, const char *fmt, ...)
{
	size_t i, l, line = 1, col = 1;
	va_list ap;
	int o;

	for (i = 0; i < pos && i < d->n; i += l) {
		l = d->in[i] < 0x80 ? 1 : utf8_len(d->in + i, d->in + pos);
		if (!l)
			l = 1; /* a byte that is not UTF-8 is a rune */
		if (d->in[i] == '\n')
			line++, col = 1;
		else
			col++;
	}
	o = snprintf(d->why, JSON_PB_WHY, "proto: %s(line %zu:%zu): ", syntax ? "syntax error " : "", line, col);
	va_start(ap, fmt);
	vsnprintf(d->why + o, JSON_PB_WHY - (size_t)o, fmt, ap);
	va_end(ap);
	return KVD_EPROTO;
}

static int json_pj_eof(struct json_pj *d)
{
	snprintf(d->why, JSON_PB_WHY, "proto: unexpected EOF");
	return KVD_EPROTO;
}

/* Token t as written, cut at JSON_PJ_RAW bytes between runes, into out. */
static const char *json_pj_raw(const struct json_pj *d, const struct json_tok *t, char *out)
{
	size_t n = KVD_MIN(t->len, (size_t)JSON_PJ_RAW);

	if (n < t->len)
		while (n && (d->in[t->pos + n] & 0xc0) == 0x80)
			n--;
	memcpy(out, d->in + t->pos, n);
	out[n] = 0;
	return out;
}

static int json_pj_unexpected(struct json_pj *d, const struct json_tok *t)
{
	char raw[JSON_PJ_RAW + 1];

	return json_pj_fail(d, t->pos, 1, "unexpected token %s", json_pj_raw(d, t, raw));
}

/* A string token at in[d->at] (its quote) into d->str, as protojson reads one. */
static int json_pj_string(struct json_pj *d, struct json_tok *t)
{
	const uint8_t *p = d->in + d->at + 1, *end = d->in + d->n;
	char q[64];
	uint8_t *o;
	uint32_t c;
	size_t l;

	d->str.len = 0;
	if (buf_reserve(d->k, &d->str, d->n - d->at + 1)) /* never longer than as written */
		return KVD_ENOMEM;
	o = d->str.p;
	for (;;) {
		if (p >= end)
			return json_pj_eof(d);
		if (*p == '"')
			break;
		if (*p >= 0x80) {
			if (!(l = utf8_len(p, end)))
				return json_pj_fail(d, t->pos, 1, "invalid UTF-8 in string");
			memcpy(o, p, l);
			o += l;
			p += l;
			continue;
		}
		if (*p < 0x20) {
			*json_go_rune(q, *p) = 0;
			return json_pj_fail(d, t->pos, 1, "invalid character '%s' in string", q);
		}
		if (*p != '\\') {
			*o++ = *p++;
			continue;
		}
		switch (json_escape(p, end, &c, &l)) { /* a surrogate must be a pair's first half, the second following */
		case 0:
			o = json_put_utf8(o, c);
			p += l;
			continue;
		case JSON_ESC_LOW: /* as for PAIR, the second escape is the bad one */
			if (end - p < 12)
				return json_pj_eof(d);
			/* fall through */
		case JSON_ESC_PAIR:
			json_go_quote(p + 6, 6, q);
			break;
		case JSON_ESC_HEX:
			json_go_quote(p, 6, q);
			break;
		case JSON_ESC_CODE:
			json_go_quote(p, 2, q);
			break;
		default:
			return json_pj_eof(d);
		}
		return json_pj_fail(d, t->pos, 1, "invalid escape code %s in string", q);
	}
	*o = 0;
	d->str.len = (size_t)(o - d->str.p);
	t->kind = JSON_T_STR;
	t->len = (size_t)(p + 1 - (d->in + t->pos));
	d->at = t->pos + t->len;
	return 0;
}

/* Is c one of the bytes protojson takes to go on a token ([-+._a-zA-Z0-9])? */
static int json_pj_nondelim(unsigned c)
{
	return c == '-' || c == '+' || c == '.' || c == '_' || (c >= '0' && c <= '9') ||
	       ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

/* The length of the JSON number at s[0..n), 0 if none, as protojson's
 * parseNumber reads one (a delimiter or the end must follow it). */
static size_t json_pj_numlen(const uint8_t *s, size_t n)
{
	size_t i = 0;

	if (i < n && s[i] == '-')
		i++;
	if (i >= n || !(s[i] >= '0' && s[i] <= '9'))
		return 0;
	if (s[i++] != '0')
		while (i < n && s[i] >= '0' && s[i] <= '9')
			i++;
	if (n - i >= 2 && s[i] == '.' && s[i + 1] >= '0' && s[i + 1] <= '9')
		for (i += 2; i < n && s[i] >= '0' && s[i] <= '9'; i++)
			;
	if (n - i >= 2 && (s[i] == 'e' || s[i] == 'E')) {
		i++;
		if (s[i] == '+' || s[i] == '-')
			if (++i == n)
				return 0;
		while (i < n && s[i] >= '0' && s[i] <= '9')
			i++;
	}
	return i < n && json_pj_nondelim(s[i]) ? 0 : i;
}

/* The next token (commas skipped, a string before ':' a name), at its first byte t->pos. */
static int json_pj_next(struct json_pj *d, struct json_tok *t)
{
	static const char *const lits[] = {"null", "false", "true"};
	const uint8_t *p;
	size_t l, left;
	int r, w;

	for (;;) {
		while (d->at < d->n && json_space(d->in[d->at]))
			d->at++;
		if (d->at >= d->n || d->in[d->at] != ',')
			break;
		d->at++;
	}
	memset(t, 0, sizeof *t);
	t->pos = d->at;
	if (d->at >= d->n)
		return 0; /* JSON_T_EOF */
	p = d->in + d->at;
	left = d->n - d->at;
	t->len = 1;
	switch (*p) {
	case '{': t->kind = JSON_T_OBJ; break;
	case '}': t->kind = JSON_T_OBJ_END; break;
	case '[': t->kind = JSON_T_ARR; break;
	case ']': t->kind = JSON_T_ARR_END; break;
	case '"':
		if ((r = json_pj_string(d, t)))
			return r;
		while (d->at < d->n && json_space(d->in[d->at]))
			d->at++;
		if (d->at < d->n && d->in[d->at] == ':') {
			d->at++;
			t->kind = JSON_T_NAME;
		}
		return 0;
	case 'n': case 'f': case 't':
		w = *p == 'n' ? 0 : *p == 'f' ? 1 : 2;
		l = strlen(lits[w]);
		if (left < l || memcmp(p, lits[w], l) || (left > l && json_pj_nondelim(p[l])))
			goto bad;
		t->kind = w ? JSON_T_BOOL : JSON_T_NULL;
		t->boo = w == 2;
		t->len = l;
		break;
	default:
		if (!(l = json_pj_numlen(p, left)))
			goto bad;
		t->kind = JSON_T_NUM;
		t->len = l;
		break;
	}
	d->at += t->len;
	return 0;
bad: /* not after json_scan: Go's scanner took the value */
	for (l = 0; l < left && l < 32 && json_pj_nondelim(p[l]); l++)
		;
	if (!l && !(l = *p < 0x80 ? 1 : utf8_len(p, p + left)))
		return json_pj_fail(d, t->pos, 1, "invalid value");
	return json_pj_fail(d, t->pos, 1, "invalid value %.*s", (int)l, (const char *)p);
}

/*
 * The integer a JSON number s[0..n) is, as protojson's Token.Int/Uint
 * reads one (1e2 and 1.0 are integers; 1.5 is not), into *out: 0, or
 * KVD_ERANGE when it is not one of the field's (sign, bits).
 */
static int json_pj_int(const uint8_t *s, size_t n, int sign, int bits, uint64_t *out)
{
	const uint8_t *ip = NULL, *fp = NULL;
	size_t il = 0, fl = 0, i = 0, nd, j;
	long long e = 0;
	int neg = 0, eneg = 0;
	uint64_t u = 0, lim;
	char digits[24];

	if (i < n && s[i] == '-')
		neg = 1, i++;
	if (i >= n || !(s[i] >= '0' && s[i] <= '9'))
		return KVD_ERANGE;
	if (s[i] == '0') {
		i++;
	} else {
		for (ip = s + i; i < n && s[i] >= '0' && s[i] <= '9'; i++)
			il++;
	}
	if (n - i >= 2 && s[i] == '.' && s[i + 1] >= '0' && s[i + 1] <= '9') {
		for (fp = s + ++i; i < n && s[i] >= '0' && s[i] <= '9'; i++)
			fl++;
		while (fl && fp[fl - 1] == '0')
			fl--;
	}
	if (!il && !fl) { /* zero, whatever its exponent */
		*out = 0;
		return 0;
	}
	if (n - i >= 2 && (s[i] == 'e' || s[i] == 'E')) { /* the exponent: strconv.ParseInt(_, 10, 32) */
		if (++i < n && (s[i] == '+' || s[i] == '-'))
			eneg = s[i++] == '-';
		if (i == n || !(s[i] >= '0' && s[i] <= '9'))
			return KVD_ERANGE; /* "1e+": a sign alone */
		for (; i < n && s[i] >= '0' && s[i] <= '9'; i++)
			if ((e = e * 10 + (s[i] - '0')) > 2147483648LL)
				return KVD_ERANGE;
		if (e > 2147483647LL + eneg)
			return KVD_ERANGE;
		if (eneg)
			e = -e;
	}
	if (e >= 0) { /* fraction digits move into the integer, zeros pad it */
		if ((long long)fl > e || (long long)il + e > 20)
			return KVD_ERANGE;
		memcpy(digits, ip ? (const char *)ip : "", il);
		memcpy(digits + il, fp ? (const char *)fp : "", fl);
		nd = il + (size_t)e;
		for (j = il + fl; j < nd; j++)
			digits[j] = '0';
		ip = (const uint8_t *)digits;
	} else { /* digits move out of it, each of them a zero */
		if (fl || (long long)il + e < 0)
			return KVD_ERANGE;
		nd = il - (size_t)-e;
		for (j = nd; j < il; j++)
			if (ip[j] != '0')
				return KVD_ERANGE;
	}
	if (!nd || (neg && !sign)) /* strconv.ParseInt(""), ParseUint("-1") */
		return KVD_ERANGE;
	if (sign)
		lim = (bits == 32 ? 0x7fffffffull : 0x7fffffffffffffffull) + (uint64_t)neg;
	else
		lim = bits == 32 ? 0xffffffffull : UINT64_MAX;
	for (j = 0; j < nd; j++) {
		unsigned dg = (unsigned)(ip[j] - '0');
		if (u > (lim - dg) / 10)
			return KVD_ERANGE;
		u = u * 10 + dg;
	}
	*out = neg ? (uint64_t)0 - u : u;
	return 0;
}

/* Does the UTF-8 rune at p (l bytes) count as space to Go's strings.TrimSpace? */
static int json_pj_trims(const uint8_t *p, size_t l)
{
	uint32_t c = l ? json_utf8_rune(p, l) : 0;

	return c == ' ' || (c >= '\t' && c <= '\r') || c == 0x85 || c == 0xa0 || c == 0x1680 ||
	       (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* The number a string token holds (d->str), as protojson takes one for a
 * number field: no space around it, a number first; its length or 0. */
static size_t json_pj_strnum(const struct json_pj *d)
{
	const uint8_t *s = d->str.p, *e = s + d->str.len, *last;

	if (!d->str.len || json_pj_trims(s, s[0] < 0x80 ? 1 : utf8_len(s, e)))
		return 0;
	for (last = e - 1; last > s && (*last & 0xc0) == 0x80; last--)
		;
	if (json_pj_trims(last, (size_t)(e - last)))
		return 0;
	return json_pj_numlen(s, d->str.len);
}

/* An integer field's value (a number, or a string holding one). */
static int json_pj_intval(struct json_pj *d, const struct json_tok *t, int sign, int bits, uint64_t *out)
{
	size_t l;

	if (t->kind == JSON_T_NUM)
		return json_pj_int(d->in + t->pos, t->len, sign, bits, out);
	if (t->kind != JSON_T_STR || !(l = json_pj_strnum(d)))
		return KVD_ERANGE;
	return json_pj_int(d->str.p, l, sign, bits, out);
}

/* A float or double field's value: a number, a string holding one, "NaN",
 * "Infinity" or "-Infinity" (no etcd message has one). */
static int json_pj_floatval(struct json_pj *d, const struct json_tok *t, int bits, double *out)
{
	char tmp[400];
	const uint8_t *s;
	size_t l;

	if (t->kind == JSON_T_STR) {
		const char *v = (const char *)d->str.p;
		uint64_t bits64 = 0;
		if (d->str.len == 3 && !strcmp(v, "NaN"))
			bits64 = 0x7ff8000000000000ull;
		else if (d->str.len == 8 && !strcmp(v, "Infinity"))
			bits64 = 0x7ff0000000000000ull;
		else if (d->str.len == 9 && !strcmp(v, "-Infinity"))
			bits64 = 0xfff0000000000000ull;
		if (bits64) {
			memcpy(out, &bits64, 8);
			return 0;
		}
		if (!(l = json_pj_strnum(d)))
			return KVD_ERANGE;
		s = d->str.p;
	} else if (t->kind == JSON_T_NUM) {
		s = d->in + t->pos;
		l = t->len;
	} else {
		return KVD_ERANGE;
	}
	if (l >= sizeof tmp)
		return KVD_ERANGE; /* kvd's bound */
	memcpy(tmp, s, l);
	tmp[l] = 0;
	*out = strtod(tmp, NULL);
	if (!(*out - *out == 0) || (bits == 32 && (*out > 3.4028234663852886e38 || *out < -3.4028234663852886e38)))
		return KVD_ERANGE; /* strconv.ParseFloat: out of range */
	return 0;
}

/* The base64 text s[0..n) as protojson decodes a bytes field (Go's
 * encoding/base64, not strict), into out (room for n * 3 / 4 + 3): its
 * length, or -1. */
static long json_pj_b64(const uint8_t *s, size_t n, uint8_t *out)
{
	int url = memchr(s, '-', n) || memchr(s, '_', n), pad = n % 4 == 0, j, dlen;
	size_t si = 0, o = 0;

	for (;;) {
		uint32_t q[4] = {0, 0, 0, 0}, v;
		for (dlen = 4, j = 0; j < 4; j++) {
			uint8_t c;
			const char *at;
			if (si == n) {
				if (j == 0)
					return (long)o;
				if (j == 1 || pad)
					return -1;
				dlen = j;
				break;
			}
			c = s[si++];
			if (c == (url ? '-' : '+'))
				c = '+';
			else if (c == (url ? '_' : '/'))
				c = '/';
			else if (c == '+' || c == '/')
				c = '!'; /* the other alphabet's */
			if (c && (at = strchr(json_b64std, c)) != NULL) {
				q[j] = (uint32_t)(at - json_b64std);
				continue;
			}
			if (c == '\n' || c == '\r') {
				j--;
				continue;
			}
			if (!pad || c != '=' || j < 2)
				return -1;
			if (j == 2) { /* "==" */
				while (si < n && (s[si] == '\n' || s[si] == '\r'))
					si++;
				if (si == n || s[si] != '=')
					return -1;
				si++;
			}
			while (si < n && (s[si] == '\n' || s[si] == '\r'))
				si++;
			if (si < n)
				return -1; /* after the padding */
			dlen = j;
			break;
		}
		v = q[0] << 18 | q[1] << 12 | q[2] << 6 | q[3];
		for (j = 0; j < dlen - 1; j++)
			out[o++] = (uint8_t)(v >> (16 - 8 * j));
		if (dlen < 4)
			return (long)o;
	}
}

/* protoreflect's name of f's kind, for protojson's errors. */
static const char *json_pj_kind(const ProtobufCFieldDescriptor *f)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32: return "int32";
	case PROTOBUF_C_TYPE_SINT32: return "sint32";
	case PROTOBUF_C_TYPE_SFIXED32: return "sfixed32";
	case PROTOBUF_C_TYPE_INT64: return "int64";
	case PROTOBUF_C_TYPE_SINT64: return "sint64";
	case PROTOBUF_C_TYPE_SFIXED64: return "sfixed64";
	case PROTOBUF_C_TYPE_UINT32: return "uint32";
	case PROTOBUF_C_TYPE_FIXED32: return "fixed32";
	case PROTOBUF_C_TYPE_UINT64: return "uint64";
	case PROTOBUF_C_TYPE_FIXED64: return "fixed64";
	case PROTOBUF_C_TYPE_FLOAT: return "float";
	case PROTOBUF_C_TYPE_DOUBLE: return "double";
	case PROTOBUF_C_TYPE_BOOL: return "bool";
	case PROTOBUF_C_TYPE_ENUM: return "enum";
	case PROTOBUF_C_TYPE_STRING: return "string";
	case PROTOBUF_C_TYPE_BYTES: return "bytes";
	default: return "message";
	}
}

/* Is key[0..klen) the lowerCamel JSON name of proto name n (protoc's
 * json_name: each '_' dropped and the letter after it upper-cased)? */
static int json_pb_camel(const char *n, const char *key, size_t klen)
{
	size_t o = 0;
	int up = 0;

	for (; *n; n++) {
		char c = *n;
		if (c == '_') {
			up = 1;
			continue;
		}
		if (up && c >= 'a' && c <= 'z')
			c = (char)(c - 'a' + 'A');
		up = 0;
		if (o >= klen || key[o++] != c)
			return 0;
	}
	return o == klen;
}

static int json_pj_bad_value(struct json_pj *d, const ProtobufCFieldDescriptor *f, const struct json_tok *t)
{
	char raw[JSON_PJ_RAW + 1], jn[64];
	const char *n = f->name;
	size_t o = 0;
	int up = 0;

	for (; *n && o < sizeof jn - 1; n++) { /* f's JSON name */
		if (*n == '_') {
			up = 1;
			continue;
		}
		jn[o++] = up && *n >= 'a' && *n <= 'z' ? (char)(*n - 'a' + 'A') : *n;
		up = 0;
	}
	jn[o] = 0;
	return json_pj_fail(d, t->pos, 0, "invalid value for %s field %s: %s", json_pj_kind(f), jn,
	                    json_pj_raw(d, t, raw));
}

static int json_pj_message(struct json_pj *d, struct kvd_buf *b, const ProtobufCMessageDescriptor *md,
                           const struct json_tok *t);

/* One value of scalar field f (a list's element, or the field), token t, onto b. */
static int json_pj_scalar(struct json_pj *d, struct kvd_buf *b, const ProtobufCFieldDescriptor *f,
                          const struct json_tok *t)
{
	struct kvd *k = d->k;
	uint64_t u = 0;

	switch (f->type) {
	case PROTOBUF_C_TYPE_BOOL:
		if (t->kind != JSON_T_BOOL)
			return json_pj_bad_value(d, f, t);
		pb_buf_uint(k, b, f->id, (uint64_t)t->boo);
		return 0;
	case PROTOBUF_C_TYPE_STRING:
		if (t->kind != JSON_T_STR)
			return json_pj_bad_value(d, f, t);
		pb_buf_bytes(k, b, f->id, d->str.p, d->str.len);
		return 0;
	case PROTOBUF_C_TYPE_BYTES: {
		uint8_t *raw;
		long n;
		if (t->kind != JSON_T_STR)
			return json_pj_bad_value(d, f, t);
		if (buf_reserve(k, b, PB_HDR_MAX + d->str.len)) /* room for the tag and length, then the bytes */
			return KVD_ENOMEM;
		raw = b->p + b->len + PB_HDR_MAX;
		if ((n = json_pj_b64(d->str.p, d->str.len, raw)) < 0)
			return json_pj_bad_value(d, f, t);
		u = (uint64_t)(pb_put_lenhdr(b->p + b->len, f->id, (uint64_t)n) - (b->p + b->len));
		memmove(b->p + b->len + u, raw, (size_t)n);
		b->len += (size_t)u + (size_t)n;
		return 0;
	}
	case PROTOBUF_C_TYPE_ENUM:
		if (t->kind == JSON_T_STR) {
			const char *nm = (const char *)d->str.p;
			const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value_by_name(f->descriptor, nm);
			if (!ev || strlen(nm) != d->str.len)
				return 0; /* an unknown name: dropped (DiscardUnknown) */
			u = (uint64_t)(int64_t)ev->value;
		} else if (t->kind != JSON_T_NUM || json_pj_int(d->in + t->pos, t->len, 1, 32, &u)) {
			return json_pj_bad_value(d, f, t);
		}
		pb_buf_uint(k, b, f->id, u);
		return 0;
	case PROTOBUF_C_TYPE_FLOAT:
	case PROTOBUF_C_TYPE_DOUBLE: { /* no etcd message has one */
		double x;
		if (json_pj_floatval(d, t, f->type == PROTOBUF_C_TYPE_FLOAT ? 32 : 64, &x))
			return json_pj_bad_value(d, f, t);
		if (f->type == PROTOBUF_C_TYPE_FLOAT) {
			float fl = (float)x;
			uint32_t bits;
			memcpy(&bits, &fl, 4);
			pb_buf_fixed(k, b, f->id, 32, bits);
		} else {
			memcpy(&u, &x, 8);
			pb_buf_fixed(k, b, f->id, 64, u);
		}
		return 0;
	}
	default:
		break;
	}
	/* the integers */
	{
		int sign = f->type == PROTOBUF_C_TYPE_INT32 || f->type == PROTOBUF_C_TYPE_SINT32 ||
		           f->type == PROTOBUF_C_TYPE_SFIXED32 || f->type == PROTOBUF_C_TYPE_INT64 ||
		           f->type == PROTOBUF_C_TYPE_SINT64 || f->type == PROTOBUF_C_TYPE_SFIXED64;
		int bits = json_pb_elem_size(f) == 8 ? 64 : 32;
		if (json_pj_intval(d, t, sign, bits, &u))
			return json_pj_bad_value(d, f, t);
		switch (f->type) {
		case PROTOBUF_C_TYPE_SINT32: /* zigzag */
			u = (uint32_t)((uint32_t)u << 1 ^ (uint32_t)((int32_t)(uint32_t)u >> 31));
			break;
		case PROTOBUF_C_TYPE_SINT64:
			u = u << 1 ^ (uint64_t)((int64_t)u >> 63);
			break;
		case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_FIXED32:
			pb_buf_fixed(k, b, f->id, 32, u);
			return 0;
		case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_FIXED64:
			pb_buf_fixed(k, b, f->id, 64, u);
			return 0;
		default:
			break;
		}
		pb_buf_uint(k, b, f->id, u);
		return 0;
	}
}

/* A message field's value (token t opens it) as a length-delimited field onto b. */
static int json_pj_sub(struct json_pj *d, struct kvd_buf *b, const ProtobufCFieldDescriptor *f,
                       const struct json_tok *t)
{
	struct kvd_buf sub = {0};
	int r;

	if ((r = json_pj_message(d, &sub, f->descriptor, t)) == 0) {
		pb_buf_bytes(d->k, b, f->id, BUF_DATA(&sub), BUF_LEN(&sub));
		r = sub.err ? KVD_ENOMEM : 0;
	}
	buf_free(d->k, &sub);
	return r;
}

/* An unknown member's value, read and dropped (protojson's skipJSONValue). */
static int json_pj_skip(struct json_pj *d)
{
	struct json_tok t;
	long open = 0;
	int r;

	do {
		if ((r = json_pj_next(d, &t)))
			return r;
		if (t.kind == JSON_T_OBJ || t.kind == JSON_T_ARR)
			open++;
		else if (t.kind == JSON_T_OBJ_END || t.kind == JSON_T_ARR_END)
			open--;
		else if (t.kind == JSON_T_EOF)
			return json_pj_eof(d);
	} while (open > 0);
	return 0;
}

/* The field a member's name (d->str) sets: its JSON name first, then its
 * proto name; NULL if none (an extension's "[...]" is none of etcd's). */
static const ProtobufCFieldDescriptor *json_pj_field(const struct json_pj *d, const ProtobufCMessageDescriptor *md)
{
	const char *name = (const char *)d->str.p;
	size_t n = d->str.len;
	unsigned i;

	if (n >= 2 && name[0] == '[' && name[n - 1] == ']')
		return NULL;
	for (i = 0; i < md->n_fields; i++)
		if (json_pb_camel(md->fields[i].name, name, n))
			return &md->fields[i];
	for (i = 0; i < md->n_fields; i++)
		if (strlen(md->fields[i].name) == n && !memcmp(md->fields[i].name, name, n))
			return &md->fields[i];
	return NULL;
}

/* The oneof of etcd's messages that have one (protobuf-c keeps no names). */
static const char *json_pj_oneof(const ProtobufCMessageDescriptor *md)
{
	static const char *const names[][2] = {
	    {"etcdserverpb.RequestOp", "request"},          {"etcdserverpb.ResponseOp", "response"},
	    {"etcdserverpb.Compare", "target_union"},       {"etcdserverpb.WatchRequest", "request_union"},
	};
	size_t i;

	for (i = 0; i < KVD_COUNT(names); i++)
		if (!strcmp(md->name, names[i][0]))
			return names[i][1];
	return "oneof";
}

/* A member's name refused: named twice (md NULL), or a second member of md's oneof. */
static int json_pj_refuse(struct json_pj *d, const struct json_tok *name, const ProtobufCMessageDescriptor *md)
{
	char raw[JSON_PJ_RAW + 1];

	json_pj_raw(d, name, raw);
	if (!md)
		return json_pj_fail(d, name->pos, 0, "duplicate field %s", raw);
	return json_pj_fail(d, name->pos, 0, "error parsing %s, oneof %s.%s is already set", raw, md->name,
	                    json_pj_oneof(md));
}

/* Message md, its value opened by token t, as protobuf bytes onto b. */
static int json_pj_message(struct json_pj *d, struct kvd_buf *b, const ProtobufCMessageDescriptor *md,
                           const struct json_tok *t)
{
	uint64_t seen = 0;     /* fields named, by index (etcd's messages have at most 13) */
	unsigned oneofs[8], noneofs = 0, i;
	struct json_tok name, v, e;
	int r, rv;

	if (t->kind != JSON_T_OBJ)
		return json_pj_unexpected(d, t);
	if (d->depth >= JSON_MAX_DEPTH) /* json_scan bounded it already */
		return json_pj_fail(d, t->pos, 0, "exceeded max recursion depth");
	d->depth++;
	for (;;) {
		const ProtobufCFieldDescriptor *f;
		unsigned idx;
		if ((r = json_pj_next(d, &name)))
			return r;
		if (name.kind == JSON_T_OBJ_END)
			break;
		if (name.kind != JSON_T_NAME)
			return json_pj_unexpected(d, &name);
		if (!(f = json_pj_field(d, md))) {
			if ((r = json_pj_skip(d)))
				return r;
			continue;
		}
		idx = (unsigned)(f - md->fields);
		if (idx < 64 && (seen >> idx & 1))
			return json_pj_refuse(d, &name, NULL);
		if (idx < 64)
			seen |= (uint64_t)1 << idx;
		rv = json_pj_next(d, &v); /* protojson peeks at it for null: its fault waits */
		if (!rv && v.kind == JSON_T_NULL)
			continue;
		if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && f->label != PROTOBUF_C_LABEL_REPEATED) {
			for (i = 0; i < noneofs && oneofs[i] != f->quantifier_offset; i++)
				;
			if (i < noneofs)
				return json_pj_refuse(d, &name, md);
			if (noneofs < KVD_COUNT(oneofs))
				oneofs[noneofs++] = f->quantifier_offset;
		}
		if (rv)
			return rv;
		if (f->label != PROTOBUF_C_LABEL_REPEATED) {
			r = f->type == PROTOBUF_C_TYPE_MESSAGE ? json_pj_sub(d, b, f, &v) : json_pj_scalar(d, b, f, &v);
			if (r)
				return r;
			continue;
		}
		if (v.kind != JSON_T_ARR)
			return json_pj_unexpected(d, &v);
		for (;;) {
			if ((r = json_pj_next(d, &e)))
				return r;
			if (e.kind == JSON_T_ARR_END)
				break;
			r = f->type == PROTOBUF_C_TYPE_MESSAGE ? json_pj_sub(d, b, f, &e) : json_pj_scalar(d, b, f, &e);
			if (r)
				return r;
		}
	}
	d->depth--;
	return b->err ? KVD_ENOMEM : 0;
}

/*
 * The JSON value p[0..n) (json_scan found it) as message md's protobuf bytes
 * onto b, as protojson.Unmarshal reads it.  0, KVD_EPROTO (why: protojson's
 * words, JSON_PB_WHY bytes), or KVD_ENOMEM.
 */
static int json_pj_decode(struct kvd *k, struct kvd_buf *b, const ProtobufCMessageDescriptor *md, const uint8_t *p,
                          size_t n, char *why)
{
	struct json_pj d;
	struct json_tok t;
	int r;

	memset(&d, 0, sizeof d);
	d.k = k;
	d.in = p;
	d.n = n;
	d.why = why;
	if (!(r = json_pj_next(&d, &t)) && !(r = json_pj_message(&d, b, md, &t)) && !(r = json_pj_next(&d, &t)) &&
	    t.kind != JSON_T_EOF)
		r = json_pj_unexpected(&d, &t);
	buf_free(k, &d.str);
	return r ? r : b->err ? KVD_ENOMEM : 0;
}

#endif /* KVD_NO_HTTP */

/* ===== 8. Calls: one RPC, whatever carries it (call_, svc_fail) ==================== */

/*
 * A call is one RPC being served, apart from what carries it.  A service
 * sees only its call: the decoded request (c->rq), its metadata (the auth
 * token among it), and where its answer goes -- response messages queued
 * on c->out, a final status, and whether that answer must wait for the
 * group commit (c->held).  Carriers move the bytes: gRPC over HTTP/2 (an
 * h2 stream embeds its call; section 18 cuts its DATA into messages),
 * in-process calls (tests, fuzzers), and the JSON gateway over HTTP/1.1
 * (section 33) -- all through the same svc_* handlers.  Every live call is
 * on k->calls, so shutdown and timers reach them without knowing carriers.
 *
 * gRPC over HTTP/2 (grpc doc/PROTOCOL-HTTP2.md): each message is a 1-byte
 * compressed flag, a 4-byte big-endian length, then the protobuf bytes;
 * messages may span DATA frames or share one.  A call's answers are queued
 * in that framing whatever carries them (call_msg).  Status goes in
 * trailers; early errors use Trailers-Only.  Texts follow grpc-go (etcd's
 * server) so clients that match errors by text keep working.
 *
 * Invariants:
 *   1. Every live call is on k->calls from call_init to call_fini.
 *      call_fini frees what the call owns -- its service state (on_close),
 *      rq, out, meta, status_msg -- never the call itself: its carrier
 *      does.
 *   2. A call's final status is set once: call_finish ignores later calls,
 *      and call_send queues nothing after it.
 *   3. A reply finished while the log batch is open is held (call_hold,
 *      c->held) until loop_log_flush releases it or turns it into the
 *      error; call_fini clears a held call's slot in k->held, so the flush
 *      never touches a freed call.  Should k->held fail to grow, the reply
 *      still leaves only after the flush: the loop flushes the log before
 *      it writes any socket (loop_flush).
 *   4. call_msg is the one writer of the gRPC prefix: flag 0 (kvd never
 *      compresses), a length of at most 2^32-1.
 *   5. A request lives as long as its handler: call_message decodes it
 *      into c->rq, points c->raw at its bytes, and after on_msg frees
 *      c->rq (unless the handler took it: c->rq = NULL) and clears c->raw.
 *      A call that is not bidi takes only its first message.
 */

static const struct grpc_method *svc_route(const char *svc, size_t slen, const char *meth,
                                           size_t mlen, int *known_service);
static int svc_method_index(const struct grpc_method *m);
static void svc_stop_call(struct kvd *k, struct call *c);

/* A new call of method m (NULL until routed) on carrier car: on k->calls. */
static void call_init(struct kvd *k, struct call *c, const struct grpc_method *m, const struct call_carrier *car)
{
	memset(c, 0, sizeof *c);
	c->m = m;
	c->carrier = car;
	c->next = k->calls;
	if (k->calls)
		k->calls->prev = c;
	k->calls = c;
}

/* The call goes away: its service state, a held reply, its memory (not c). */
static void call_fini(struct kvd *k, struct call *c)
{
	size_t i;
	int mi = c->m ? svc_method_index(c->m) : -1;

	if (mi >= 0) /* grpc_server_handled_total: a call that never ended was cancelled */
		k->st.grpc_handled[mi][c->finished && c->status >= 0 && c->status < 17 ? c->status : GRPC_CANCELLED]++;
	if (c->m && c->m->on_close)
		c->m->on_close(k, c);
	if (c->held) /* its reply was waiting for the log flush */
		for (i = 0; i < k->nheld; i++)
			if (k->held[i] == c)
				k->held[i] = NULL;
	if (c->prev)
		c->prev->next = c->next;
	else
		k->calls = c->next;
	if (c->next)
		c->next->prev = c->prev;
	pb_free(k, c->rq);
	buf_free(k, &c->out);
	kvd_free(k, c->meta);
	kvd_free(k, c->status_msg);
}

/*
 * A reply produced while the log batch is open may show writes a failed
 * flush takes back: it waits in k->held, and the flush either releases it or
 * replaces it with the error (loop_log_flush).
 */
static void call_hold(struct kvd *k, struct call *c)
{
	if (UTIL_GROW(k, k->held, k->heldcap, k->nheld + 1, 64))
		return; /* cannot track it: it leaves after the flush all the same */
	k->held[k->nheld++] = c;
	c->held = 1;
}

/* A service's error (struct svc_err, section 2): its gRPC code and etcd's
 * text, for the handler to end its call with.  Returns KVD_EINVAL. */
static int svc_fail(struct svc_err *e, int code, const char *msg)
{
	e->code = code;
	e->msg = msg;
	return KVD_EINVAL;
}

/* Final status for c.  The message is copied; later calls are ignored. */
static void call_finish(struct kvd *k, struct call *c, int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (c->finished)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	c->status = code;
	c->status_msg = msg[0] ? kvd_strdup(k, msg) : NULL;
	c->finished = 1;
	if (k->db.w.len && !c->held)
		call_hold(k, c);
	if (c->carrier->finished)
		c->carrier->finished(k, c);
}

/* Room for one response message of n bytes on c's output: the gRPC prefix
 * (uncompressed, length) written, the n bytes counted in, where they go
 * returned -- the one writer of that prefix.  NULL: the call ended
 * RESOURCE_EXHAUSTED. */
static uint8_t *call_msg(struct kvd *k, struct call *c, size_t n)
{
	uint8_t *p;

	if (n > 0xffffffffu || buf_reserve(k, &c->out, 5 + n)) {
		call_finish(k, c, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return NULL;
	}
	p = c->out.p + c->out.len;
	p[0] = 0;
	put_be32(p + 1, (uint32_t)n);
	c->out.len += 5 + n;
	return p + 5;
}

/* Queue one response message.  On failure the call ends RESOURCE_EXHAUSTED. */
static int call_send(struct kvd *k, struct call *c, const ProtobufCMessage *m)
{
	uint8_t *p;

	if (c->finished)
		return KVD_EINVAL;
	if (!(p = call_msg(k, c, protobuf_c_message_get_packed_size(m))))
		return KVD_ENOMEM;
	protobuf_c_message_pack(m, p);
	return 0;
}

/* A unary answer: one message, then status OK. */
static void call_reply(struct kvd *k, struct call *c, const ProtobufCMessage *m)
{
	if (!call_send(k, c, m))
		call_finish(k, c, GRPC_OK, "%s", "");
}

/* Keep a call's metadata (regular fields: names not starting with ':'), in
 * one allocation.  Each carrier hands over what its protocol calls them. */
static int call_keep_meta(struct kvd *k, struct call *s, const struct hp_field *f, unsigned nf)
{
	size_t bytes = 0;
	unsigned i, n = 0;
	char *p;

	for (i = 0; i < nf; i++)
		if (f[i].name[0] != ':') {
			bytes += f[i].nlen + f[i].vlen + 2;
			n++;
		}
	if (!n)
		return 0;
	s->meta = kvd_malloc(k, n * sizeof *s->meta + bytes);
	if (!s->meta)
		return KVD_ENOMEM;
	p = (char *)(s->meta + n);
	for (i = 0; i < nf; i++) {
		if (f[i].name[0] == ':')
			continue;
		memcpy(p, f[i].name, f[i].nlen);
		p[f[i].nlen] = 0;
		s->meta[s->nmeta].name = p;
		s->meta[s->nmeta].nlen = f[i].nlen;
		p += f[i].nlen + 1;
		memcpy(p, f[i].value, f[i].vlen);
		p[f[i].vlen] = 0;
		s->meta[s->nmeta].value = p;
		s->meta[s->nmeta].vlen = f[i].vlen;
		p += f[i].vlen + 1;
		s->nmeta++;
	}
	return 0;
}

/* Request metadata by (lowercase) name, NUL-terminated; NULL if absent. */
static const char *call_meta(const struct call *c, const char *name)
{
	unsigned i;

	for (i = 0; i < c->nmeta; i++)
		if (!strcmp(c->meta[i].name, name))
			return c->meta[i].value;
	return NULL;
}

/*
 * Decode a request message for c's method into c->rq, or end the call as
 * etcd does: its decoder's text for malformed bytes (pb_check), its txn
 * limit for nesting beyond what kvd decodes, and kvd's own words only for
 * what is kvd's (memory, groups).  Returns 0 or a negative KVD_E*.
 */
static int call_decode(struct kvd *k, struct call *c, const uint8_t *p, size_t n)
{
	const ProtobufCMessageDescriptor *d = c->m->req;
	char why[160];
	unsigned flags;
	int oom, r;

	if (!d)
		return 0; /* raw bytes (test methods) */
	r = pb_check(d, p, n, PB_MAX_DEPTH, why, sizeof why, &flags);
	if (r == KVD_ELIMIT) { /* only a Txn nests: etcd's answer for deep ones */
		call_finish(k, c, GRPC_INVALID_ARGUMENT, "%s", E_TOO_MANY_OPS);
		return r;
	}
	if (r) {
		call_finish(k, c, GRPC_INTERNAL, "grpc: error unmarshalling request: %s", why);
		return r;
	}
	if (flags & PB_F_STRIP) { /* what etcd skips, protobuf-c would refuse */
		uint8_t *copy = kvd_malloc(k, n ? n : 1);
		if (!copy) {
			call_finish(k, c, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			return KVD_ENOMEM;
		}
		size_t m = pb_strip(d, p, n, copy);
		if (m == (size_t)-1) {
			kvd_free(k, copy);
			call_finish(k, c, GRPC_INVALID_ARGUMENT, "kvd: a message repeats its fields too often to be merged");
			return KVD_ELIMIT;
		}
		c->rq = pb_unpack(k, d, copy, m, &oom);
		kvd_free(k, copy);
	} else {
		c->rq = pb_unpack(k, d, p, n, &oom);
	}
	if (c->rq)
		return 0;
	if (oom) {
		call_finish(k, c, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return KVD_ENOMEM;
	}
	call_finish(k, c, GRPC_INTERNAL, "grpc: error unmarshalling request: kvd: malformed protobuf");
	return KVD_EPROTO;
}

/* One request message for c: decoded, then handed to the method (a unary
 * call takes only its first).  The handler may finish c, never frees it. */
static void call_message(struct kvd *k, struct call *c, const uint8_t *p, size_t n)
{
	if (!p) /* an empty buffer's data: decoders may not do arithmetic on NULL */
		p = (const uint8_t *)"";
	if (c->m->kind != GRPC_BIDI && c->got_msg)
		return;
	c->got_msg = 1;
	c->out_mark = c->out.len;
	if (call_decode(k, c, p, n))
		return;
	c->raw.p = p;
	c->raw.n = n;
	c->m->on_msg(k, c);
	if (k->stopping) /* begun while kvd stops: a stream ends at once */
		svc_stop_call(k, c);
	pb_free(k, c->rq);
	c->rq = NULL;
	c->raw.n = 0;
}

/* The client will send nothing more (gRPC: io.EOF / io.ErrUnexpectedEOF
 * when the request never came, as grpc-go answers). */
static void call_half_close(struct kvd *k, struct call *c, int partial)
{
	if (c->finished)
		return;
	if (!c->got_msg) {
		call_finish(k, c, GRPC_UNKNOWN, partial ? "unexpected EOF" : "EOF");
		return;
	}
	if (partial && c->m->kind == GRPC_BIDI) {
		call_finish(k, c, GRPC_INTERNAL, "unexpected EOF");
		return;
	}
	if (c->m->on_half_close)
		c->m->on_half_close(k, c);
}

/* Route a path as grpc-go does (strip one leading '/', split at the last
 * '/'); 0, or the call finished with grpc-go's text. */
static int call_route(struct kvd *k, struct call *c, const char *path, size_t plen)
{
	const char *svc = path, *slash = NULL, *orig = path;
	size_t i, olen = plen;
	int known;

	if (plen && path[0] == '/') {
		path++;
		plen--;
	}
	for (i = plen; i > 0; i--)
		if (path[i - 1] == '/') {
			slash = path + i - 1;
			break;
		}
	if (!slash) {
		call_finish(k, c, GRPC_RESOURCE_EXHAUSTED, "malformed method name: \"%.*s\"", (int)KVD_MIN(olen, 200), orig);
		return KVD_EINVAL;
	}
	svc = path;
	c->m = svc_route(svc, (size_t)(slash - svc), slash + 1, plen - (size_t)(slash - svc) - 1, &known);
	if (!c->m) {
		if (known)
			call_finish(k, c, GRPC_UNIMPLEMENTED, "unknown method %.*s for service %.*s",
			            (int)KVD_MIN(plen - (size_t)(slash - svc) - 1, 200), slash + 1, (int)(slash - svc), svc);
		else
			call_finish(k, c, GRPC_UNIMPLEMENTED, "unknown service %.*s", (int)KVD_MIN((size_t)(slash - svc), 200), svc);
		return KVD_EINVAL;
	}
	if ((known = svc_method_index(c->m)) >= 0)
		k->st.grpc_started[known]++;
	return 0;
}

/* ===== 9. MVCC store: the log, its format and grammar (mvcc_) ============ */

/*
 * The store is one append-only log, <data-dir>/kvd.log, and an in-memory
 * ordered index of keys.  RAM holds per key only its latest revision
 * (revisions, version, lease, where its op sits in the log); values and older
 * revisions stay in the file.  Each op points back to the previous op of the
 * same key, so history is a chain on disk that reads at old revisions walk
 * with pread.  RAM therefore grows with the number of keys, not with the data
 * or the history.
 *
 * Log format, integers big-endian or varint (LEB128), CRC-32C:
 *   record  = u32 len | u32 crc | u8 type | payload[len]
 *             crc covers the 4 len bytes, the type byte and the payload
 *   HEADER  (1) = "kvd-log\n" | u32 format (1, 2 or 3)  -- the first record
 *   TXN     (2) = varint rev | u32 nops | op[nops]       -- one write txn = one revision
 *   COMPACT (3) = varint rev
 *   BASE    (4) = varint rev | u32 nops | op[nops]       -- a rewritten log's state at rev
 *   ALARM   (5) = u32 n | (varint member | u8 alarm)[n]  -- the active alarms from here on
 *   AUTH    (6) = u8 flags (1 enabled, 2 whole) | u64 auth rev | u32 nops | aop[nops]
 *   aop     = u8 kind | u32 len | bytes[len]   -- 1 user, 3 role: the packed
 *             authpb.User/Role; 2, 4: the name of one that goes (section 12
 *             applies them; "whole" first forgets every user and role)
 *   op      = u8 kind (1 put, 2 delete) | u64 prev | varint rev | varint create
 *             | varint version | varint zigzag(lease) | varint klen | varint vlen
 *             | key | value                              (prev: offset of the key's
 *             previous op + 1, 0 if none; a delete has create = version = lease = 0)
 *           | u8 kind (3 lease grant) | varint zigzag(id) | varint ttl
 *           | u8 kind (4 lease revoke) | varint zigzag(id)
 * A TXN makes a revision only if it has a put or delete: a lease grant, or
 * the revoke of a lease without keys, is a TXN of its own that does not
 * (rev is still current + 1, as a check).  A revoke shares its TXN with the
 * deletes of its keys.
 * A whole txn is one record, so a crash never leaves half of it: recovery
 * keeps the longest prefix of valid records and cuts a torn tail (a bad
 * record that valid ones follow is corruption, not a tail: kvd refuses to
 * start, section 10).
 * BASE records only follow the header, in a log a rewrite made (section 13)
 * or an etcd snapshot's import (section 15): lease grants and key puts, each
 * put at the revision it had, all at or below the BASE revision, which the
 * TXNs after them continue; a BASE without ops (nothing was live) still says
 * that revision.  A put in a
 * BASE has no history: where prev sits it keeps its position among its
 * revision's key ops (etcd's sub-revision, which a snapshot and HashKV need).
 * An ALARM record states the whole set, so a later one simply replaces it.
 * Format 2 is format 1 plus BASE and ALARM, format 3 is 2 plus AUTH; kvd
 * reads all three and writes 3 (a log kvd made before keeps its header and
 * gains AUTH records once auth is used: a kvd older than format 3 must not
 * open it again -- it would take them for a torn tail).
 *
 * Group commit: write txns append records to m->w; at the end of the loop
 * iteration one pwrite and one fdatasync make the batch durable, and only
 * then do replies leave (the loop flushes the log before any socket).  The
 * index changes at once, so later txns of the batch see earlier ones; an undo
 * list restores it if the write fails.
 *
 * Invariants:
 *   1. Every reader decodes the log through the grammar below (mvcc_frame,
 *      mvcc_rec_decode, mvcc_rec_op, mvcc_rec_auth_op, mvcc_read_rec, and
 *      mvcc_read_op for one op's header), never at offsets of its own.
 *   2. An unknown record type or op kind is corruption, never skipped nor
 *      taken for a key event (mvcc_frame, mvcc_rec_decode, mvcc_op_decode).
 *   3. Nothing decoded is used unchecked: a record lies within the log's
 *      end (mvcc_frame); an op's key and value lie within its record, its
 *      revisions in 1..2^63-1 with create <= rev, a grant's TTL in
 *      1..LEASE_MAX_TTL (mvcc_op_decode); ops that do not end exactly at
 *      their record's end are corruption (mvcc_rec_op, mvcc_rec_auth_op).
 *   4. Replay checks every record's CRC-32C (mvcc_replay reads with crc
 *      set); later readers read only bytes replay checked or kvd wrote,
 *      with the check off.
 *   5. mvcc_pread reads offsets below m->size from the file and the rest
 *      from the batch, so the batch reads as the log it will become; a
 *      history walk stops at a BASE op (mvcc_op_at: off < m->base_end),
 *      whose prev holds a sub-revision, not a link.
 */

#define MVCC_REC_HDR 9
#define MVCC_REC_HEADER 1
#define MVCC_REC_TXN 2
#define MVCC_REC_COMPACT 3
#define MVCC_REC_BASE 4
#define MVCC_REC_ALARM 5
#define MVCC_REC_AUTH 6
#define MVCC_AUTH_FIXED 13 /* an AUTH record's flags, revision and op count */
enum { AUTH_OP_USER = 1, AUTH_OP_USER_DEL, AUTH_OP_ROLE, AUTH_OP_ROLE_DEL }; /* AUTH ops */
enum { AUTH_F_ENABLED = 1, AUTH_F_WHOLE = 2 };                               /* AUTH flags */
#define MVCC_OP_PUT 1
#define MVCC_OP_DEL 2
#define MVCC_OP_GRANT 3
#define MVCC_OP_REVOKE 4
#define MVCC_MAGIC "kvd-log\n"
#define MVCC_FORMAT 3
#define MVCC_MARK_EVERY 256    /* revisions between rev->offset marks */
#define MVCC_DEAD_MAX 4096     /* superseded-bytes ranges before neighbours merge */

/* CRC-32C tables for slicing-by-8, made at start (mvcc_crc_init, into
 * struct kvd): t[0] is the classic byte table of the reflected polynomial
 * 0x82F63B78, t[j] advances a byte j positions further.  8 KB of RAM rather
 * than of flash, where a router has less room. */
KVD_RESIDENT static void mvcc_crc_init(uint32_t (*t)[256])
{
	uint32_t c;
	unsigned i, j;

	for (i = 0; i < 256; i++) {
		for (c = i, j = 0; j < 8; j++)
			c = c >> 1 ^ (0x82f63b78u & (0u - (c & 1)));
		t[0][i] = c;
	}
	for (j = 1; j < 8; j++)
		for (i = 0; i < 256; i++)
			t[j][i] = t[j - 1][i] >> 8 ^ t[0][t[j - 1][i] & 0xff];
}

/* CRC-32C (Castagnoli), as iSCSI/ext4 use it; start with crc = 0.  Eight
 * bytes per step, assembled byte by byte, so any host order gives the same. */
KVD_RESIDENT static uint32_t mvcc_crc32c(const uint32_t (*t)[256], uint32_t crc, const void *data, size_t n)
{
	const uint8_t *p = data;
	uint32_t lo, hi;

	crc = ~crc;
	while (n >= 8) {
		lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
		hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
		crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
		      t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
		p += 8;
		n -= 8;
	}
	while (n--)
		crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return ~crc;
}


static uint64_t mvcc_zigzag(int64_t v)
{
	return v < 0 ? ~((uint64_t)v << 1) : (uint64_t)v << 1;
}

static int64_t mvcc_unzigzag(uint64_t v)
{
	return (v & 1) ? (int64_t)~(v >> 1) : (int64_t)(v >> 1);
}

/* Bytes of an op's header, from fields RAM knows. */
KVD_RESIDENT static size_t mvcc_op_hdr(int64_t rev, int64_t create, int64_t ver, int64_t lease, size_t klen, size_t vlen)
{
	return 1 + 8 + varint_len((uint64_t)rev) + varint_len((uint64_t)create) + varint_len((uint64_t)ver) +
	       varint_len(mvcc_zigzag(lease)) + varint_len(klen) + varint_len(vlen);
}

/* Bytes of the header of r's latest op. */
KVD_RESIDENT static size_t mvcc_key_hdr(const struct mvcc *m, const struct mvcc_key *r)
{
	int64_t create, ver, lease;

	mvcc_k_nums(m, r, &create, &ver, &lease);
	return mvcc_op_hdr(r->mod, create, ver, lease, r->klen, r->vlen);
}

KVD_RESIDENT static size_t mvcc_key_opsize(const struct mvcc *m, const struct mvcc_key *r)
{
	return mvcc_key_hdr(m, r) + r->klen + r->vlen;
}

/* Where the latest value of r sits in the log. */
static uint64_t mvcc_voff(const struct mvcc *m, const struct mvcc_key *r)
{
	return r->op + mvcc_key_hdr(m, r) + r->klen;
}

KVD_RESIDENT static int mvcc_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
	int c = an && bn ? memcmp(a, b, KVD_MIN(an, bn)) : 0;

	return c ? c : (an > bn) - (an < bn);
}

/* ---- reading ------------------------------------------------------------ */

/* Read n bytes at log offset off: from the file, or from the unwritten batch. */
KVD_RESIDENT static int mvcc_pread(struct mvcc *m, void *dst, size_t n, uint64_t off)
{
	uint8_t *d = dst;
	ssize_t r;

	if (off + n > m->size) { /* (part of it) is still in the batch */
		size_t in_file = off < m->size ? (size_t)(m->size - off) : 0;
		uint64_t boff = off + in_file - m->size;
		if (boff + (n - in_file) > m->w.len)
			return KVD_EIO;
		memcpy(d + in_file, m->w.p + boff, n - in_file);
		n = in_file;
	}
	while (n) {
		r = pread(m->fd, d, n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return KVD_EIO;
		d += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

/* ---- the log's grammar: the one decoder every reader uses ----------------
 *
 * Replay, history reads, watch catch-up and live watch events all read the
 * log through these: mvcc_frame (a record's framing and CRC), mvcc_rec_decode
 * (its payload header), mvcc_rec_op (its ops, one at a time), and
 * mvcc_read_rec (records from the file and the batch, through a window).  An
 * op kind nobody knows is an error, never taken for a key event.
 */

/* One op, decoded.  key and val point into the bytes decoded from; they are
 * NULL when only the op's header was read (history walks). */
struct mvcc_op {
	unsigned kind;              /* MVCC_OP_* */
	uint64_t prev;              /* PUT, DEL: the key's previous op's offset + 1, 0 if none */
	int64_t rev, create, ver;   /* PUT, DEL */
	int64_t lease;              /* PUT: its lease; GRANT, REVOKE: the lease's id */
	int64_t ttl;                /* GRANT */
	uint64_t klen, vlen;
	const uint8_t *key, *val;
	uint64_t off, voff;         /* log offsets of the op and of its value */
};

/* Decode the op at *pp, whose log offset is off.  With body, its key and
 * value must be there too.  Returns 0 or KVD_ECORRUPT (why). */
KVD_RESIDENT static int mvcc_op_decode(const uint8_t **pp, const uint8_t *end, uint64_t off, int body, struct mvcc_op *op,
                          const char **why)
{
	const uint8_t *p = *pp, *start = p;
	uint64_t v[6];
	int i;

	memset(op, 0, sizeof *op);
	op->off = off;
	if (p >= end) {
		*why = "short op";
		return KVD_ECORRUPT;
	}
	op->kind = *p++;
	switch (op->kind) {
	case MVCC_OP_GRANT:
	case MVCC_OP_REVOKE:
		if (get_varint(&p, end, &v[0]) || (op->kind == MVCC_OP_GRANT && get_varint(&p, end, &v[1]))) {
			*why = "bad lease op";
			return KVD_ECORRUPT;
		}
		op->lease = mvcc_unzigzag(v[0]);
		op->ttl = op->kind == MVCC_OP_GRANT ? (int64_t)v[1] : 0;
		if (!op->lease || (op->kind == MVCC_OP_GRANT && (v[1] < 1 || v[1] > (uint64_t)LEASE_MAX_TTL))) {
			*why = "bad lease op"; /* ttl * 1000 must not overflow: etcd's MaxLeaseTTL bounds it */
			return KVD_ECORRUPT;
		}
		*pp = p;
		return 0;
	case MVCC_OP_PUT:
	case MVCC_OP_DEL:
		break;
	default:
		*why = "unknown op kind";
		return KVD_ECORRUPT;
	}
	if (end - p < 8) {
		*why = "short op";
		return KVD_ECORRUPT;
	}
	op->prev = get_be64(p);
	p += 8;
	for (i = 0; i < 6; i++)
		if (get_varint(&p, end, &v[i])) {
			*why = "bad op varint";
			return KVD_ECORRUPT;
		}
	/* bounded before use: a put's revisions and version are in 1..2^63-1,
	 * created at or before it; a delete carries none */
	if (v[0] < 1 || v[0] > INT64_MAX ||
	    (op->kind == MVCC_OP_PUT ? v[1] < 1 || v[1] > v[0] || v[2] < 1 || v[2] > INT64_MAX : v[1] || v[2])) {
		*why = "op numbers out of range";
		return KVD_ECORRUPT;
	}
	op->rev = (int64_t)v[0];
	op->create = (int64_t)v[1];
	op->ver = (int64_t)v[2];
	op->lease = mvcc_unzigzag(v[3]);
	op->klen = v[4];
	op->vlen = v[5];
	op->voff = off + (uint64_t)(p - start) + op->klen;
	if (body) {
		if (v[4] > (uint64_t)(end - p) || v[5] > (uint64_t)(end - p) - v[4]) {
			*why = "op runs past its record";
			return KVD_ECORRUPT;
		}
		op->key = p;
		op->val = p + v[4];
		p += v[4] + v[5];
	}
	*pp = p;
	return 0;
}

/* A record: its framing, then what its payload starts with. */
struct mvcc_rec {
	unsigned type;              /* MVCC_REC_* */
	uint64_t off;               /* log offset of the record */
	const uint8_t *p, *end;     /* payload */
	int64_t rev;                /* TXN, BASE, COMPACT; AUTH: the auth revision */
	unsigned flags;             /* AUTH */
	uint32_t nops;              /* TXN, BASE: ops; ALARM: alarms */
	const uint8_t *next;        /* TXN, BASE: the next op to decode (mvcc_rec_op); ALARM: the first */
	uint32_t at;                /* TXN, BASE: ops decoded so far */
};

/*
 * The record framed at p[0..n), log offset off: returns its whole length,
 * 0 when p holds only part of it ("need more"), or KVD_ECORRUPT (why) when
 * it cannot be one; the payload is checked against the CRC when given
 * CRC-32C's tables (crc), not when NULL.
 */
KVD_RESIDENT static long mvcc_frame(const uint8_t *p, size_t n, uint64_t off, uint64_t log_end,
                                    const uint32_t (*crc)[256], struct mvcc_rec *r, const char **why)
{
	uint32_t len;

	if (n < MVCC_REC_HDR)
		return 0;
	len = get_be32(p);
	if (len > log_end - off - MVCC_REC_HDR || p[8] < MVCC_REC_HEADER || p[8] > MVCC_REC_AUTH) {
		*why = len > log_end - off - MVCC_REC_HDR ? "record runs past the end" : "bad record type";
		return KVD_ECORRUPT;
	}
	if (n < MVCC_REC_HDR + (size_t)len)
		return 0;
	if (crc && mvcc_crc32c(crc, mvcc_crc32c(crc, 0, p, 4), p + 8, 1 + (size_t)len) != get_be32(p + 4)) {
		*why = "checksum mismatch";
		return KVD_ECORRUPT;
	}
	memset(r, 0, sizeof *r);
	r->type = p[8];
	r->off = off;
	r->p = p + MVCC_REC_HDR;
	r->end = r->p + len;
	return (long)(MVCC_REC_HDR + len);
}

/* What a framed record's payload says about it: a HEADER's magic, a TXN's
 * revision and op count, a COMPACT's revision.  0 or KVD_ECORRUPT (why). */
KVD_RESIDENT static int mvcc_rec_decode(struct mvcc_rec *r, const char **why)
{
	const uint8_t *p = r->p;
	uint64_t rev;

	switch (r->type) {
	case MVCC_REC_HEADER:
		if (r->off != 0 || r->end - p < 12 || memcmp(p, MVCC_MAGIC, 8) || get_be32(p + 8) < 1) {
			*why = "bad header record";
			return KVD_ECORRUPT;
		}
		if (get_be32(p + 8) > MVCC_FORMAT) { /* whole and checked: a newer kvd wrote it (mvcc_replay says so) */
			*why = "a newer log format";
			return KVD_EINVAL;
		}
		return 0;
	case MVCC_REC_TXN:
	case MVCC_REC_BASE:
		if (get_varint(&p, r->end, &rev) || r->end - p < 4 || rev > INT64_MAX) {
			*why = "bad txn record";
			return KVD_ECORRUPT;
		}
		r->rev = (int64_t)rev;
		r->nops = get_be32(p);
		r->next = p + 4;
		r->at = 0;
		return 0;
	case MVCC_REC_COMPACT:
		if (get_varint(&p, r->end, &rev) || p != r->end || rev > INT64_MAX) {
			*why = "bad compact record";
			return KVD_ECORRUPT;
		}
		r->rev = (int64_t)rev;
		return 0;
	case MVCC_REC_ALARM:
		if (r->end - p < 4) {
			*why = "bad alarm record";
			return KVD_ECORRUPT;
		}
		r->nops = get_be32(p);
		r->next = p + 4;
		return 0;
	case MVCC_REC_AUTH:
		if (r->end - p < MVCC_AUTH_FIXED || get_be64(p + 1) > INT64_MAX) {
			*why = "bad auth record";
			return KVD_ECORRUPT;
		}
		r->flags = p[0];
		r->rev = (int64_t)get_be64(p + 1);
		r->nops = get_be32(p + 9);
		r->next = p + MVCC_AUTH_FIXED;
		r->at = 0;
		return 0;
	}
	*why = "unknown record type";
	return KVD_ECORRUPT;
}

/* The next op of a decoded TXN record: 1 and op, 0 after the last (which
 * must end the record), or KVD_ECORRUPT (why). */
KVD_RESIDENT static int mvcc_rec_op(struct mvcc_rec *r, struct mvcc_op *op, const char **why)
{
	int e;

	if (r->at == r->nops) {
		if (r->next != r->end || (!r->nops && r->type != MVCC_REC_BASE)) { /* an empty BASE: nothing live */
			*why = "txn record length mismatch";
			return KVD_ECORRUPT;
		}
		return 0;
	}
	if ((e = mvcc_op_decode(&r->next, r->end, r->off + MVCC_REC_HDR + (uint64_t)(r->next - r->p), 1, op, why)))
		return e;
	r->at++;
	return 1;
}

/* The next op of a decoded AUTH record: 1 with its kind and bytes, 0 after
 * the last (which must end the record), or KVD_ECORRUPT (why).  Read by
 * auth_replay alone, so unused with KVD_NO_AUTH. */
KVD_UNUSED static int mvcc_rec_auth_op(struct mvcc_rec *r, unsigned *kind, const uint8_t **p, size_t *n, const char **why)
{
	uint32_t len;

	if (r->at == r->nops) {
		if (r->next != r->end) {
			*why = "auth record length mismatch";
			return KVD_ECORRUPT;
		}
		return 0;
	}
	if (r->end - r->next < 5 || (len = get_be32(r->next + 1)) > (size_t)(r->end - r->next - 5)) {
		*why = "bad auth record";
		return KVD_ECORRUPT;
	}
	*kind = r->next[0];
	*p = r->next + 5;
	*n = len;
	r->next += 5 + len;
	r->at++;
	return 1;
}

/* Records read from the log (file and batch) through a window of memory. */
struct mvcc_reader {
	uint64_t off, end;          /* the next record; where reading stops */
	struct kvd_buf *win;        /* win->p[0..win->len) holds the log from win_off */
	uint64_t win_off;
	size_t chunk;               /* bytes read at a time (more for a bigger record) */
	const uint32_t (*crc)[256]; /* check every record's CRC (replay): k->crc; else NULL */
};

static void mvcc_reader_init(struct mvcc_reader *rd, struct kvd_buf *win, uint64_t off, uint64_t end,
                             size_t chunk, const uint32_t (*crc)[256])
{
	memset(rd, 0, sizeof *rd);
	rd->win = win;
	rd->off = off;
	rd->end = end;
	rd->chunk = chunk;
	rd->crc = crc;
	win->rd = win->len = 0;
	rd->win_off = off;
}

/*
 * The next whole record: 1 (rec points into the window, valid until the next
 * call), 0 at the end, KVD_ECORRUPT (why: a bad frame or CRC at rd->off),
 * KVD_EIO or KVD_ENOMEM.  Payloads are decoded by the caller.
 */
KVD_RESIDENT static int mvcc_read_rec(struct kvd *k, struct mvcc_reader *rd, struct mvcc_rec *rec, const char **why)
{
	struct kvd_buf *w = rd->win;
	size_t have, want;
	long n;

	if (rd->off >= rd->end)
		return 0;
	for (;;) {
		have = rd->off >= rd->win_off && rd->off - rd->win_off <= w->len ? (size_t)(w->len - (rd->off - rd->win_off)) : 0;
		n = have ? mvcc_frame(w->p + (rd->off - rd->win_off), have, rd->off, rd->end, rd->crc, rec, why) : 0;
		if (n < 0)
			return (int)n;
		if (n > 0) {
			rd->off += (uint64_t)n;
			return 1;
		}
		/* refill: keep what is left, read at least a chunk, a whole record if known */
		want = rd->chunk;
		if (have >= MVCC_REC_HDR)
			want = KVD_MAX(want, MVCC_REC_HDR + (size_t)get_be32(w->p + (rd->off - rd->win_off)));
		want = (size_t)KVD_MIN((uint64_t)want, rd->end - rd->off);
		if (want <= have) {
			*why = rd->end - rd->off < MVCC_REC_HDR ? "short record header" : "short read";
			return KVD_ECORRUPT;
		}
		if (have)
			memmove(w->p, w->p + (rd->off - rd->win_off), have);
		w->len = have;
		rd->win_off = rd->off;
		if (buf_reserve(k, w, want - have))
			return KVD_ENOMEM;
		if (mvcc_pread(&k->db, w->p + have, want - have, rd->off + have))
			return KVD_EIO;
		w->len = want;
	}
}

/* The op at log offset off, its header only (history walks). */
static int mvcc_read_op(struct mvcc *m, uint64_t off, struct mvcc_op *op)
{
	uint8_t b[1 + 8 + 6 * 10];
	const uint8_t *p = b;
	const char *why;
	size_t n = sizeof b;

	if (off >= m->size + m->w.len)
		return KVD_ECORRUPT;
	if (off + n > m->size + m->w.len)
		n = (size_t)(m->size + m->w.len - off);
	if (mvcc_pread(m, b, n, off))
		return KVD_EIO;
	return mvcc_op_decode(&p, b + n, off, 0, op, &why);
}

/* The alarms an ALARM record states (at most max).  0 or KVD_ECORRUPT. */
static int mvcc_rec_alarms(const struct mvcc_rec *r, struct mvcc_alarm *a, unsigned max, unsigned *n,
                           const char **why)
{
	const uint8_t *p = r->next;
	uint64_t member;
	uint32_t i;

	if (r->nops > max) {
		*why = "too many alarms";
		return KVD_ECORRUPT;
	}
	for (i = 0; i < r->nops; i++) {
		if (get_varint(&p, r->end, &member) || p >= r->end || *p < ALARM_NOSPACE || *p > ALARM_CORRUPT) {
			*why = "bad alarm record";
			return KVD_ECORRUPT;
		}
		a[i].member = member;
		a[i].type = *p++;
	}
	if (p != r->end) {
		*why = "bad alarm record";
		return KVD_ECORRUPT;
	}
	*n = r->nops;
	return 0;
}

/* Where the TXN records of revisions >= rev begin (or the log's end), from
 * the nearest mark: no revision before it is >= rev, though lease-only
 * records that carry rev as their check may lie just before it (a mark
 * points at a record that made a revision).  win is the reader's window. */
static uint64_t mvcc_seek_rev(struct kvd *k, struct kvd_buf *win, int64_t rev)
{
	struct mvcc *m = &k->db;
	struct mvcc_reader rd;
	struct mvcc_rec rec;
	const char *why;
	size_t lo = 0, hi = m->marks.n, mid;
	uint64_t off = MVCC_REC_HDR + 12; /* after the header record */

	while (lo < hi) { /* last mark with rev <= wanted */
		mid = lo + (hi - lo) / 2;
		if (m->marks.v[mid].rev <= rev)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo)
		off = m->marks.v[lo - 1].off;
	mvcc_reader_init(&rd, win, off, m->size, 1 << 16, NULL);
	while (mvcc_read_rec(k, &rd, &rec, &why) == 1) {
		if (rec.type == MVCC_REC_TXN && !mvcc_rec_decode(&rec, &why) && rec.rev >= rev)
			return rec.off;
		off = rd.off;
	}
	return off;
}

/*
 * A key's newest op at or below rev, walking back from one of its ops at
 * off: 1 (in *op), 0 if it has none that old (or only history a rewrite
 * dropped: a BASE op's prev is no link), or a negative error.
 */
static int mvcc_op_at(struct mvcc *m, uint64_t off, int64_t rev, struct mvcc_op *op)
{
	int e;

	for (;;) {
		if ((e = mvcc_read_op(m, off, op)))
			return e;
		if (op->kind != MVCC_OP_PUT && op->kind != MVCC_OP_DEL)
			return KVD_ECORRUPT;
		if (op->rev <= rev)
			return 1;
		if (!op->prev || off < m->base_end)
			return 0;
		off = op->prev - 1;
	}
}

/*
 * The revision of r visible at rev (rev 0 or >= r->mod: the latest).  Fills
 * kv and returns 1 if the key exists there, 0 if not, <0 on a read error.
 */
static int mvcc_visible(struct mvcc *m, const struct mvcc_key *r, int64_t rev, struct mvcc_kv *kv)
{
	struct mvcc_op op;
	int e;

	if (!rev || r->mod <= rev) {
		if (!(r->flags & MVCC_LIVE))
			return 0;
		kv->r = r;
		kv->mod = r->mod;
		mvcc_k_nums(m, r, &kv->create, &kv->ver, &kv->lease); /* one side-table look, if any */
		kv->vlen = r->vlen;
		kv->voff = r->op + mvcc_op_hdr(r->mod, kv->create, kv->ver, kv->lease, r->klen, r->vlen) + r->klen;
		return 1;
	}
	if ((e = mvcc_op_at(m, r->op, rev, &op)) <= 0 || op.kind != MVCC_OP_PUT)
		return e < 0 ? KVD_ECORRUPT : 0;
	kv->r = r;
	kv->mod = op.rev;
	kv->create = op.create;
	kv->ver = op.ver;
	kv->lease = op.lease;
	kv->voff = op.voff;
	kv->vlen = (uint32_t)op.vlen;
	return 1;
}

/* ===== 10. MVCC store: the index, writing, group commit, recovery (mvcc_) == */

/*
 * The index and the writer.  RAM holds every live key in a two-level
 * B+tree (struct mvcc_key: its latest revision and where its op sits in
 * the log); a write txn changes the index at once and appends its record
 * to the open batch m->w; the loop's end makes the batch durable.
 *
 * A durable write, end to end: svc_put_rpc (section 21) -> mvcc_put
 * (here: the op appended, the index changed, an undo entry kept) ->
 * call_finish (section 8: while the batch is open the reply is held,
 * call_hold) -> loop_log_flush (section 35) -> mvcc_flush (here: one
 * pwrite, one fdatasync) -> the held replies released -> the carrier's
 * flush (h2_stream_send, gw_flush) moves them toward the socket.
 *
 * Invariants:
 *   1. No reply that shows a write leaves before that write's fdatasync:
 *      the durability contract (loop_log_flush; KVD_NEVER(held) where a
 *      carrier moves bytes).
 *   2. A failed flush undoes the whole batch in RAM (the undo list), and
 *      the held replies become errors: what they showed never happened.
 *   3. Recovery applies the longest prefix of valid records, never a
 *      record past a bad frame or CRC, and cuts the rest only when no valid
 *      record follows it (a torn tail); valid records after a bad one, or
 *      a sound record that does not apply, are corruption, and kvd refuses
 *      to start rather than drop acknowledged writes (mvcc_replay,
 *      mvcc_next_valid).
 */

struct mvcc_it {
	size_t li;
	unsigned ki;
};

/* Position of the first key >= key; *eq set when it is key itself. */
KVD_RESIDENT static struct mvcc_it mvcc_seek(struct mvcc *m, const uint8_t *key, size_t n, int *eq)
{
	struct mvcc_it it = {0, 0};
	size_t lo = 0, hi = m->nleaf, mid;
	struct mvcc_leaf *l;
	unsigned a, b, c;

	*eq = 0;
	if (!m->nleaf)
		return it;
	while (hi - lo > 1) {
		mid = lo + (hi - lo) / 2;
		if (mvcc_cmp(m->leaf[mid]->k[0]->key, m->leaf[mid]->k[0]->klen, key, n) <= 0)
			lo = mid;
		else
			hi = mid;
	}
	l = m->leaf[lo];
	a = 0;
	b = l->n;
	while (a < b) {
		c = a + (b - a) / 2;
		if (mvcc_cmp(l->k[c]->key, l->k[c]->klen, key, n) < 0)
			a = c + 1;
		else
			b = c;
	}
	it.li = lo;
	it.ki = a;
	if (a < l->n)
		*eq = !mvcc_cmp(l->k[a]->key, l->k[a]->klen, key, n);
	else {
		it.li++;
		it.ki = 0;
	}
	return it;
}

KVD_RESIDENT static struct mvcc_key *mvcc_at(struct mvcc *m, struct mvcc_it it)
{
	return it.li < m->nleaf ? m->leaf[it.li]->k[it.ki] : NULL;
}

KVD_RESIDENT static void mvcc_next(struct mvcc *m, struct mvcc_it *it)
{
	if (++it->ki >= m->leaf[it->li]->n) {
		it->li++;
		it->ki = 0;
	}
}

static struct mvcc_key *mvcc_find(struct mvcc *m, const uint8_t *key, size_t n)
{
	int eq;
	struct mvcc_it it = mvcc_seek(m, key, n, &eq);

	return eq ? mvcc_at(m, it) : NULL;
}

KVD_RESIDENT static int mvcc_leaf_slot(struct kvd *k, struct mvcc *m, size_t at, struct mvcc_leaf *l)
{
	if (UTIL_GROW(k, m->leaf, m->leafcap, m->nleaf + 1, 16))
		return KVD_ENOMEM;
	memmove(m->leaf + at + 1, m->leaf + at, (m->nleaf - at) * sizeof *m->leaf);
	m->leaf[at] = l;
	m->nleaf++;
	return 0;
}

/* Insert r where mvcc_seek said it belongs. */
KVD_RESIDENT static int mvcc_insert(struct kvd *k, struct mvcc *m, struct mvcc_it it, struct mvcc_key *r)
{
	struct mvcc_leaf *l, *nl;
	unsigned half;

	if (!m->nleaf) {
		if (!(l = kvd_malloc(k, sizeof *l)))
			return KVD_ENOMEM;
		l->n = 0;
		if (mvcc_leaf_slot(k, m, 0, l)) {
			kvd_free(k, l);
			return KVD_ENOMEM;
		}
		it.li = 0;
		it.ki = 0;
	} else if (it.li == m->nleaf) {
		it.li = m->nleaf - 1;
		it.ki = m->leaf[it.li]->n;
	} else if (it.ki == 0 && it.li > 0 && m->leaf[it.li - 1]->n < MVCC_LEAF) {
		it.li--; /* append to the previous leaf rather than shifting this one */
		it.ki = m->leaf[it.li]->n;
	}
	l = m->leaf[it.li];
	if (l->n == MVCC_LEAF) { /* split */
		if (!(nl = kvd_malloc(k, sizeof *nl)))
			return KVD_ENOMEM;
		half = MVCC_LEAF / 2;
		if (it.ki == MVCC_LEAF)
			half = MVCC_LEAF; /* appending at the end: start a fresh leaf */
		nl->n = MVCC_LEAF - half;
		memcpy(nl->k, l->k + half, nl->n * sizeof *nl->k);
		if (mvcc_leaf_slot(k, m, it.li + 1, nl)) {
			kvd_free(k, nl);
			return KVD_ENOMEM;
		}
		l->n = half;
		if (it.ki >= half) {
			it.ki -= half;
			it.li++;
			l = nl;
		}
	}
	memmove(l->k + it.ki + 1, l->k + it.ki, (l->n - it.ki) * sizeof *l->k);
	l->k[it.ki] = r;
	l->n++;
	m->nkeys++;
	return 0;
}

/* Remove the key at it; empty leaves go, small neighbours merge.  Returns
 * the position of the key that followed it. */
static struct mvcc_it mvcc_remove(struct kvd *k, struct mvcc *m, struct mvcc_it it)
{
	struct mvcc_leaf *l = m->leaf[it.li], *r;

	memmove(l->k + it.ki, l->k + it.ki + 1, (l->n - it.ki - 1) * sizeof *l->k);
	l->n--;
	m->nkeys--;
	if (!l->n) {
		kvd_free(k, l);
		memmove(m->leaf + it.li, m->leaf + it.li + 1, (m->nleaf - it.li - 1) * sizeof *m->leaf);
		m->nleaf--;
		it.ki = 0;
		return it;
	}
	if (it.li + 1 < m->nleaf && l->n + (r = m->leaf[it.li + 1])->n <= MVCC_LEAF / 2) {
		memcpy(l->k + l->n, r->k, r->n * sizeof *r->k);
		l->n += r->n;
		kvd_free(k, r);
		memmove(m->leaf + it.li + 1, m->leaf + it.li + 2, (m->nleaf - it.li - 2) * sizeof *m->leaf);
		m->nleaf--;
	}
	if (it.ki >= l->n) {
		it.li++;
		it.ki = 0;
	}
	return it;
}

/* ---- key records: slabs by size class ---------------------------------- */

/*
 * A million keys are a million small records that never move (leaves,
 * lease key sets and undo entries point at them).  malloc would add its
 * header and round each one up to 16 bytes -- 80 bytes for a 59-byte
 * record -- so records of up to MVCC_SLAB_MAX bytes come from chunks
 * carved into slots of one size class (a multiple of 8: the record's
 * alignment).  A chunk is one kvd_nalloc block, its descriptor first; a
 * class's first chunks are small (1 KiB, doubling to 64 KiB), so that a
 * store of a few keys pays for what it holds.  A freed slot goes on its
 * chunk's free list; a chunk left empty goes back to the system, unless it
 * is its class's only one.  Freeing finds the chunk by binary search in
 * the address-sorted array, which costs log2(chunks) compares.
 *
 * Invariants:
 *   1. A chunk is on its class's room list exactly when it has a free slot
 *      (on its free list or past its bump mark).
 *   2. slab.v is sorted by address and holds every chunk once; the bytes
 *      charged to k->mem are the chunks', whole.
 *   3. Under AddressSanitizer a slot not handed out is poisoned, so a use
 *      after free of a key record is caught as with malloc.
 */
struct mvcc_chunk {
	struct mvcc_chunk *next, *prev; /* the class's room list */
	uint32_t bytes;                /* the block, descriptor included */
	uint32_t end, bump;            /* slot area [sizeof desc, end); never-used slots from bump */
	uint32_t free;                 /* free list head: slot offset, 0 = none */
	uint32_t live;
	uint16_t cls;
};
#define MVCC_CHUNK_HDR ((sizeof(struct mvcc_chunk) + 15) & ~(size_t)15)

#if defined(__has_feature)
#if __has_feature(address_sanitizer) && !defined(__SANITIZE_ADDRESS__)
#define __SANITIZE_ADDRESS__ 1
#endif
#endif
#ifdef __SANITIZE_ADDRESS__
void __asan_poison_memory_region(void const volatile *addr, size_t size);
void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#define MVCC_POISON(p, n) __asan_poison_memory_region((p), (n))
#define MVCC_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define MVCC_POISON(p, n) ((void)(p), (void)(n))
#define MVCC_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

static void mvcc_room_add(struct mvcc_slab *s, struct mvcc_chunk *c)
{
	c->prev = NULL;
	if ((c->next = s->room[c->cls]))
		c->next->prev = c;
	s->room[c->cls] = c;
}

static void mvcc_room_del(struct mvcc_slab *s, struct mvcc_chunk *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		s->room[c->cls] = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->next = c->prev = NULL;
}

/* Index of the last chunk at or below p in slab.v (s->n when none). */
KVD_RESIDENT static size_t mvcc_chunk_find(const struct mvcc_slab *s, const void *p)
{
	size_t lo = 0, hi = s->n, mid;

	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if ((uintptr_t)s->v[mid] <= (uintptr_t)p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo ? lo - 1 : s->n;
}

static struct mvcc_chunk *mvcc_chunk_new(struct kvd *k, struct mvcc_slab *s, unsigned cls)
{
	size_t slot = ((size_t)cls + 1) * 8, bytes = (size_t)1024 << KVD_MIN(s->nchunks[cls], 6), at;
	struct mvcc_chunk *c;

	while (bytes - MVCC_CHUNK_HDR < 4 * slot)
		bytes *= 2;
	if (UTIL_GROW(k, s->v, s->cap, s->n + 1, 64) || !(c = kvd_nalloc(k, bytes)))
		return NULL;
	memset(c, 0, sizeof *c);
	c->bytes = (uint32_t)bytes;
	c->cls = (uint16_t)cls;
	c->bump = (uint32_t)MVCC_CHUNK_HDR;
	c->end = (uint32_t)(MVCC_CHUNK_HDR + (bytes - MVCC_CHUNK_HDR) / slot * slot);
	MVCC_POISON((uint8_t *)c + MVCC_CHUNK_HDR, bytes - MVCC_CHUNK_HDR);
	at = mvcc_chunk_find(s, c);
	at = at == s->n ? 0 : at + 1; /* after the last chunk below it */
	memmove(s->v + at + 1, s->v + at, (s->n - at) * sizeof *s->v);
	s->v[at] = c;
	s->n++;
	s->nchunks[cls]++;
	mvcc_room_add(s, c);
	return c;
}

static void *mvcc_slab_alloc(struct kvd *k, size_t n)
{
	struct mvcc_slab *s = &k->db.slab;
	unsigned cls;
	size_t slot;
	struct mvcc_chunk *c;
	uint8_t *p;

	if (n > MVCC_SLAB_MAX)
		return kvd_nalloc(k, n);
	cls = (unsigned)((n + 7) / 8 - 1);
	slot = ((size_t)cls + 1) * 8;
	if (!(c = s->room[cls]) && !(c = mvcc_chunk_new(k, s, cls)))
		return NULL;
	if (c->free) {
		p = (uint8_t *)c + c->free;
		MVCC_UNPOISON(p, slot);
		memcpy(&c->free, p, sizeof c->free);
	} else {
		p = (uint8_t *)c + c->bump;
		MVCC_UNPOISON(p, slot);
		c->bump += (uint32_t)slot;
	}
	c->live++;
	if (!c->free && c->bump == c->end)
		mvcc_room_del(s, c);
	return p;
}

static void mvcc_slab_free(struct kvd *k, void *p, size_t n)
{
	struct mvcc_slab *s = &k->db.slab;
	struct mvcc_chunk *c;
	size_t at, slot;
	uint32_t off;

	if (n > MVCC_SLAB_MAX) {
		kvd_nfree(k, p, n);
		return;
	}
	if (KVD_NEVER((at = mvcc_chunk_find(s, p)) == s->n))
		return;
	c = s->v[at];
	slot = ((size_t)c->cls + 1) * 8;
	off = (uint32_t)((uint8_t *)p - (uint8_t *)c);
	if (KVD_NEVER(off < MVCC_CHUNK_HDR || off >= c->end || (off - MVCC_CHUNK_HDR) % slot))
		return; /* not a slot: leaked, rather than a free list gone wrong */
	if (!c->free && c->bump == c->end)
		mvcc_room_add(s, c);
	memcpy(p, &c->free, sizeof c->free);
	MVCC_POISON(p, slot);
	c->free = off;
	if (--c->live || s->nchunks[c->cls] == 1)
		return;
	mvcc_room_del(s, c);
	memmove(s->v + at, s->v + at + 1, (s->n - at - 1) * sizeof *s->v);
	s->n--;
	s->nchunks[c->cls]--;
	kvd_nfree(k, c, c->bytes);
}

/* At close: the chunks left (each class's last, kept empty). */
static void mvcc_slab_close(struct kvd *k)
{
	struct mvcc_slab *s = &k->db.slab;
	size_t i;

	for (i = 0; i < s->n; i++) {
		KVD_NEVER(s->v[i]->live);
		kvd_nfree(k, s->v[i], s->v[i]->bytes);
	}
	kvd_free(k, s->v);
	memset(s, 0, sizeof *s);
}

/* ---- key records: their numbers, the side table --------------------------- */

/*
 * A record keeps create as mod - create and the version in 32 bits each,
 * and no lease: most keys have none, and a key's numbers stay far below
 * 2^32 unless the store's revision does not.  The keys that need more --
 * a lease, a version or a create distance past 32 bits (a store imported
 * at revision 2^40, or one that ran long) -- have them whole in m->ext, an
 * open-addressing table by record address (linear probing, deletion by
 * backward shift, at most 3/4 full).
 *
 * Invariants:
 *   1. A record is MVCC_EXT exactly when it has an m->ext slot; then the
 *      slot's numbers are its numbers, and its own cdelta/ver mean nothing.
 *   2. A slot, once made, stays until its record is freed (mvcc_free_key),
 *      even when the numbers would fit again: an undo that puts back a
 *      lease never needs memory.  A put reserves its slot first
 *      (mvcc_ext_reserve), so mvcc_k_set cannot fail.
 *   3. A dead record (no MVCC_LIVE) reads as create, version and lease 0.
 */

static size_t mvcc_ext_hash(const struct mvcc_key *r)
{
	uint64_t x = (uint64_t)(uintptr_t)r >> 3;

	x ^= x >> 31;
	x *= 0x9e3779b97f4a7c15ull;
	return (size_t)(x ^ (x >> 29));
}

KVD_RESIDENT static struct mvcc_ext *mvcc_ext_find(const struct mvcc *m, const struct mvcc_key *r)
{
	size_t i;

	if (!m->ext)
		return NULL;
	for (i = mvcc_ext_hash(r) & m->extmask; m->ext[i].r; i = (i + 1) & m->extmask)
		if (m->ext[i].r == r)
			return &m->ext[i];
	return NULL;
}

KVD_RESIDENT static void mvcc_ext_place(struct mvcc_ext *v, size_t mask, const struct mvcc_ext *e)
{
	size_t i;

	for (i = mvcc_ext_hash(e->r) & mask; v[i].r; i = (i + 1) & mask)
		;
	v[i] = *e;
}

/* Room for one more slot: mvcc_k_set can then give any record one. */
KVD_RESIDENT static int mvcc_ext_reserve(struct kvd *k, struct mvcc *m)
{
	size_t cap = m->ext ? m->extmask + 1 : 0, ncap, i;
	struct mvcc_ext *v;

	if ((m->next + 1) * 4 <= cap * 3)
		return 0;
	ncap = cap ? cap * 2 : 16;
	if (ncap > SIZE_MAX / 2 / sizeof *v || !(v = kvd_calloc(k, ncap * sizeof *v)))
		return KVD_ENOMEM;
	for (i = 0; i < cap; i++)
		if (m->ext[i].r)
			mvcc_ext_place(v, ncap - 1, &m->ext[i]);
	kvd_free(k, m->ext);
	m->ext = v;
	m->extmask = ncap - 1;
	return 0;
}

static void mvcc_ext_del(struct mvcc *m, const struct mvcc_key *r)
{
	struct mvcc_ext *e = mvcc_ext_find(m, r);
	size_t i, j, h;

	if (KVD_NEVER(!e))
		return;
	i = (size_t)(e - m->ext);
	m->ext[i].r = NULL;
	m->next--;
	for (j = (i + 1) & m->extmask; m->ext[j].r; j = (j + 1) & m->extmask) {
		h = mvcc_ext_hash(m->ext[j].r) & m->extmask;
		if (((j - h) & m->extmask) >= ((j - i) & m->extmask)) { /* its home is not in (i, j] */
			m->ext[i] = m->ext[j];
			m->ext[j].r = NULL;
			i = j;
		}
	}
}

static const struct mvcc_ext *mvcc_k_ext(const struct mvcc *m, const struct mvcc_key *r)
{
	static const struct mvcc_ext none = {NULL, 0, 0, 0};
	const struct mvcc_ext *e = mvcc_ext_find(m, r);

	return KVD_NEVER(!e) ? &none : e;
}

static int64_t mvcc_k_create(const struct mvcc *m, const struct mvcc_key *r)
{
	if (!(r->flags & MVCC_LIVE))
		return 0;
	return r->flags & MVCC_EXT ? mvcc_k_ext(m, r)->create : r->mod - (int64_t)r->cdelta;
}

static int64_t mvcc_k_ver(const struct mvcc *m, const struct mvcc_key *r)
{
	if (!(r->flags & MVCC_LIVE))
		return 0;
	return r->flags & MVCC_EXT ? mvcc_k_ext(m, r)->ver : (int64_t)r->ver;
}

KVD_RESIDENT static int64_t mvcc_k_lease(const struct mvcc *m, const struct mvcc_key *r)
{
	return (r->flags & (MVCC_LIVE | MVCC_EXT)) == (MVCC_LIVE | MVCC_EXT) ? mvcc_k_ext(m, r)->lease : 0;
}

/* All three at once: one look in the side table at most. */
KVD_RESIDENT static void mvcc_k_nums(const struct mvcc *m, const struct mvcc_key *r, int64_t *create, int64_t *ver, int64_t *lease)
{
	const struct mvcc_ext *e;

	if (!(r->flags & MVCC_LIVE)) {
		*create = *ver = *lease = 0;
	} else if (r->flags & MVCC_EXT) {
		e = mvcc_k_ext(m, r);
		*create = e->create;
		*ver = e->ver;
		*lease = e->lease;
	} else {
		*create = r->mod - (int64_t)r->cdelta;
		*ver = (int64_t)r->ver;
		*lease = 0;
	}
}

/* Whether these numbers need a side-table slot (create 0: a delete). */
KVD_RESIDENT static int mvcc_k_wide(int64_t mod, int64_t create, int64_t ver, int64_t lease)
{
	if (!create)
		return 0;
	return lease || create < 0 || create > mod || mod - create > 0xffffffffll || ver < 0 || ver > 0xffffffffll;
}

/* Set r's numbers.  A record that needs a slot and has none must have
 * had mvcc_ext_reserve succeed since the last slot was made. */
KVD_RESIDENT static void mvcc_k_set(struct mvcc *m, struct mvcc_key *r, int64_t mod, int64_t create, int64_t ver, int64_t lease)
{
	struct mvcc_ext *e, ne;

	r->mod = mod;
	r->flags = (uint8_t)((r->flags & MVCC_EXT) | (create ? MVCC_LIVE : 0));
	if (!(r->flags & MVCC_EXT) && mvcc_k_wide(mod, create, ver, lease)) {
		ne.r = r;
		ne.create = ne.ver = ne.lease = 0;
		if (KVD_NEVER((m->next + 1) * 4 > (m->ext ? m->extmask + 1 : 0) * 3))
			create = ver = lease = 0; /* no room: cannot happen after a reserve */
		else {
			mvcc_ext_place(m->ext, m->extmask, &ne);
			m->next++;
			r->flags |= MVCC_EXT;
		}
	}
	if (r->flags & MVCC_EXT) {
		e = mvcc_ext_find(m, r);
		e->create = create;
		e->ver = create ? ver : 0;
		e->lease = create ? lease : 0;
		r->cdelta = r->ver = 0;
	} else {
		r->cdelta = create ? (uint32_t)(mod - create) : 0;
		r->ver = create ? (uint32_t)ver : 0;
	}
}

KVD_RESIDENT static struct mvcc_key *mvcc_new_key(struct kvd *k, const uint8_t *key, size_t klen)
{
	struct mvcc_key *r = mvcc_slab_alloc(k, MVCC_KEY_SIZE(klen));

	if (r) {
		memset(r, 0, offsetof(struct mvcc_key, key));
		r->klen = (uint32_t)klen;
		memcpy(r->key, key, klen);
	}
	return r;
}

static void mvcc_free_key(struct kvd *k, struct mvcc_key *r)
{
	if (!r)
		return;
	if (r->flags & MVCC_EXT)
		mvcc_ext_del(&k->db, r);
	mvcc_slab_free(k, r, MVCC_KEY_SIZE(r->klen));
}

/* ---- writing ------------------------------------------------------------ */

static void mvcc_save(const struct mvcc *m, struct mvcc_was *w, const struct mvcc_key *r)
{
	w->mod = r->mod;
	w->create = mvcc_k_create(m, r);
	w->ver = mvcc_k_ver(m, r);
	w->lease = mvcc_k_lease(m, r);
	w->op = r->op;
	w->vlen = r->vlen;
}

/* Put back what mvcc_save kept: the record had those numbers then, so it
 * has the slot they need (invariant 2 of the side table). */
static void mvcc_restore(struct kvd *k, struct mvcc_key *r, const struct mvcc_was *w)
{
	lease_rebind(k, r, mvcc_k_lease(&k->db, r), w->lease);
	mvcc_k_set(&k->db, r, w->mod, w->create, w->ver, w->lease);
	r->op = w->op;
	r->vlen = w->vlen;
}

/* Remember r's state (changed, new or removed) so a failed flush can undo. */
static int mvcc_undo_push(struct kvd *k, struct mvcc *m, struct mvcc_key *r, unsigned kind)
{
	if (UTIL_GROW(k, m->undo, m->undocap, m->nundo + 1, 64))
		return KVD_ENOMEM;
	m->undo[m->nundo].r = r;
	m->undo[m->nundo].kind = kind;
	if (kind == MVCC_UNDO_CHANGED)
		mvcc_save(m, &m->undo[m->nundo].was, r);
	m->nundo++;
	return 0;
}

/*
 * Bytes superseded at revision rev: a rewrite drops them once the compacted
 * revision is past rev (section 13).  One range per revision, exact, until
 * MVCC_DEAD_MAX ranges of uncompacted history: then neighbours merge, and a
 * merged range counts once compaction has passed all of it.
 */
KVD_RESIDENT static void mvcc_dead(struct kvd *k, struct mvcc *m, int64_t rev, uint64_t bytes)
{
	size_t i;

	if (m->ndead && rev <= m->dead[m->ndead - 1].hi) {
		m->dead[m->ndead - 1].bytes += bytes;
		return;
	}
	if (m->ndead == MVCC_DEAD_MAX) {
		for (i = 0; i < m->ndead / 2; i++) {
			m->dead[i].lo = m->dead[2 * i].lo;
			m->dead[i].hi = m->dead[2 * i + 1].hi;
			m->dead[i].bytes = m->dead[2 * i].bytes + m->dead[2 * i + 1].bytes;
		}
		m->ndead /= 2;
	}
	if (UTIL_GROW(k, m->dead, m->deadcap, m->ndead + 1, 16)) {
		/* only the in-use figure suffers: widen the last range */
		if (m->ndead) {
			m->dead[m->ndead - 1].bytes += bytes;
			m->dead[m->ndead - 1].hi = rev;
		}
		return;
	}
	m->dead[m->ndead].lo = m->dead[m->ndead].hi = rev;
	m->dead[m->ndead].bytes = bytes;
	m->ndead++;
}

/* A rev -> record offset mark, every MVCC_MARK_EVERY revisions. */
KVD_RESIDENT static void mvcc_mark(struct kvd *k, struct mvcc_marks *mk, int64_t rev, uint64_t off)
{
	if (mk->n && rev < mk->v[mk->n - 1].rev + MVCC_MARK_EVERY)
		return;
	if (UTIL_GROW(k, mk->v, mk->cap, mk->n + 1, 16))
		return; /* a sparser map only costs longer scans */
	mk->v[mk->n].rev = rev;
	mk->v[mk->n].off = off;
	mk->n++;
}

/* The encoders: every op and record header kvd writes is made here. */
#define MVCC_OP_MAX_HDR (1 + 8 + 6 * 10)  /* a key op's bytes before its key */
#define MVCC_LEASE_OP_MAX (1 + 2 * 10)

/* A key op (put or delete) at p, which has MVCC_OP_MAX_HDR + klen + vlen
 * bytes; returns its end. */
static uint8_t *mvcc_op_encode(uint8_t *p, int kind, uint64_t prev, int64_t rev, int64_t create, int64_t ver,
                               int64_t lease, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	*p++ = (uint8_t)kind;
	put_be64(p, prev);
	p += 8;
	p = put_varint(p, (uint64_t)rev);
	p = put_varint(p, (uint64_t)create);
	p = put_varint(p, (uint64_t)ver);
	p = put_varint(p, mvcc_zigzag(lease));
	p = put_varint(p, klen);
	p = put_varint(p, vlen);
	if (klen)
		memcpy(p, key, klen);
	p += klen;
	if (vlen)
		memcpy(p, val, vlen);
	return p + vlen;
}

/* A lease op (grant or revoke) at p (MVCC_LEASE_OP_MAX bytes); its end. */
static uint8_t *mvcc_lease_encode(uint8_t *p, int kind, int64_t id, int64_t ttl)
{
	*p++ = (uint8_t)kind;
	p = put_varint(p, mvcc_zigzag(id));
	if (kind == MVCC_OP_GRANT)
		p = put_varint(p, (uint64_t)ttl);
	return p;
}

/* Open a record of a type with a revision and an op count (TXN, BASE) at
 * the end of b: returns where its count goes (filled at mvcc_rec_close). */
static size_t mvcc_rec_open(struct kvd_buf *b, int64_t rev)
{
	uint8_t *p = put_varint(b->p + b->len + MVCC_REC_HDR, (uint64_t)rev);

	b->len = (size_t)(p - b->p) + 4;
	return b->len - 4;
}

/* The revision after rev -- or rev itself when it is the last (2^63-1):
 * nothing can follow it, so "from the next one on" means nothing more. */
static int64_t mvcc_after(int64_t rev)
{
	return rev < INT64_MAX ? rev + 1 : INT64_MAX;
}

/* Start a write txn: its record header goes to the batch now, its length
 * and CRC when it ends. */
static int mvcc_txn_begin(struct kvd *k, struct mvcc_txn *t)
{
	struct mvcc *m = &k->db;

	memset(t, 0, sizeof *t);
	if (m->broken)
		return KVD_EIO;
	if (m->rev >= INT64_MAX) /* no revision left: svc_writable refuses writes before this */
		return KVD_ELIMIT;
	t->rev = m->rev + 1;
	t->at = m->w.len;
	t->undo_at = m->nundo;
	if (buf_reserve(k, &m->w, MVCC_REC_HDR + 10 + 4))
		return KVD_ENOMEM;
	t->nops_at = mvcc_rec_open(&m->w, t->rev);
	return 0;
}

static void mvcc_seal(const uint32_t (*t)[256], uint8_t *rec, size_t payload, unsigned type)
{
	uint32_t crc;

	put_be32(rec, (uint32_t)payload);
	rec[8] = (uint8_t)type;
	crc = mvcc_crc32c(t, 0, rec, 4);
	crc = mvcc_crc32c(t, crc, rec + 8, 1 + payload);
	put_be32(rec + 4, crc);
}

#define MVCC_HEADER_REC (MVCC_REC_HDR + 12)                      /* bytes */
#define MVCC_COMPACT_REC_MAX (MVCC_REC_HDR + 10)
#define MVCC_ALARM_REC_MAX (MVCC_REC_HDR + 4 + MVCC_MAX_ALARMS * 11)

/* The HEADER record at p (MVCC_HEADER_REC bytes). */
static void mvcc_header_encode(const uint32_t (*t)[256], uint8_t *p)
{
	memcpy(p + MVCC_REC_HDR, MVCC_MAGIC, 8);
	put_be32(p + MVCC_REC_HDR + 8, MVCC_FORMAT);
	mvcc_seal(t, p, 12, MVCC_REC_HEADER);
}

/* A COMPACT record at the end of b, which has MVCC_COMPACT_REC_MAX bytes free. */
static void mvcc_compact_encode(const uint32_t (*t)[256], struct kvd_buf *b, int64_t rev)
{
	size_t at = b->len;

	b->len = (size_t)(put_varint(b->p + at + MVCC_REC_HDR, (uint64_t)rev) - b->p);
	mvcc_seal(t, b->p + at, b->len - at - MVCC_REC_HDR, MVCC_REC_COMPACT);
}

/* An ALARM record stating a[0..n) at the end of b (MVCC_ALARM_REC_MAX free). */
static void mvcc_alarms_encode(const uint32_t (*t)[256], struct kvd_buf *b, const struct mvcc_alarm *a, unsigned n)
{
	size_t at = b->len;
	uint8_t *p = b->p + at + MVCC_REC_HDR;
	unsigned i;

	put_be32(p, n);
	p += 4;
	for (i = 0; i < n; i++) {
		p = put_varint(p, a[i].member);
		*p++ = (uint8_t)a[i].type;
	}
	b->len = (size_t)(p - b->p);
	mvcc_seal(t, b->p + at, b->len - at - MVCC_REC_HDR, MVCC_REC_ALARM);
}

/* Open an AUTH record at the end of b (*at: where it starts).  0 or KVD_ENOMEM.
 * (These three serve auth and snapshot imports: unused without both.) */
KVD_UNUSED static int mvcc_auth_open(struct kvd *k, struct kvd_buf *b, size_t *at)
{
	if (buf_reserve(k, b, MVCC_REC_HDR + MVCC_AUTH_FIXED))
		return KVD_ENOMEM;
	*at = b->len;
	b->len += MVCC_REC_HDR + MVCC_AUTH_FIXED;
	return 0;
}

/* Append an op: message m packed, or raw[0..n).  Its bytes (valid until b
 * grows) and their length, or NULL on no memory. */
KVD_UNUSED static const uint8_t *mvcc_auth_op(struct kvd *k, struct kvd_buf *b, unsigned kind, const ProtobufCMessage *m,
                                   const void *raw, size_t *n)
{
	uint8_t *p;

	if (m)
		*n = protobuf_c_message_get_packed_size(m);
	if (*n > UINT32_MAX - 64 || buf_reserve(k, b, 5 + *n))
		return NULL;
	p = b->p + b->len;
	p[0] = (uint8_t)kind;
	put_be32(p + 1, (uint32_t)*n);
	if (m)
		protobuf_c_message_pack(m, p + 5);
	else if (*n)
		memcpy(p + 5, raw, *n);
	b->len += 5 + *n;
	return p + 5;
}

/* Seal the AUTH record opened at at. */
KVD_UNUSED static void mvcc_auth_seal(const uint32_t (*t)[256], struct kvd_buf *b, size_t at, unsigned flags, uint64_t rev,
                           uint32_t nops)
{
	uint8_t *p = b->p + at + MVCC_REC_HDR;

	p[0] = (uint8_t)flags;
	put_be64(p + 1, rev);
	put_be32(p + 9, nops);
	mvcc_seal(t, b->p + at, b->len - at - MVCC_REC_HDR, MVCC_REC_AUTH);
}

/* End a write txn: no ops, no record and no revision; else the revision. */
static void mvcc_txn_end(struct kvd *k, struct mvcc_txn *t)
{
	struct mvcc *m = &k->db;

	if (!t->nops) {
		m->w.len = t->at;
		return;
	}
	put_be32(m->w.p + t->nops_at, t->nops);
	mvcc_seal(k->crc, m->w.p + t->at, m->w.len - t->at - MVCC_REC_HDR, MVCC_REC_TXN);
	/* a rewrite drops the record once compaction passes it: its framing (its
	 * ops count where they are superseded) or, with lease ops only, all of it */
	mvcc_dead(k, m, t->rev, t->nkeys ? t->nops_at + 4 - t->at : m->w.len - t->at);
	if (!t->nkeys)
		return; /* lease ops only: no revision */
	mvcc_mark(k, &m->marks, t->rev, m->size + t->at);
	m->rev = t->rev;
}

/* Append one op to the txn's record; *off gets its log offset. */
static int mvcc_emit(struct kvd *k, struct mvcc_txn *t, int kind, uint64_t prev, int64_t create,
                     int64_t ver, int64_t lease, const uint8_t *key, size_t klen, const uint8_t *val,
                     size_t vlen, uint64_t *off)
{
	struct mvcc *m = &k->db;

	if (buf_reserve(k, &m->w, MVCC_OP_MAX_HDR + klen + vlen))
		return KVD_ENOMEM;
	*off = m->size + m->w.len;
	m->w.len = (size_t)(mvcc_op_encode(m->w.p + m->w.len, kind, prev, t->rev, create, ver, lease, key, klen,
	                                   val, vlen) - m->w.p);
	t->nops++;
	t->nkeys++;
	return 0;
}

/* Append a lease op (grant or revoke) to the txn's record. */
static int mvcc_emit_lease(struct kvd *k, struct mvcc_txn *t, int kind, int64_t id, int64_t ttl)
{
	struct mvcc *m = &k->db;

	if (buf_reserve(k, &m->w, MVCC_LEASE_OP_MAX))
		return KVD_ENOMEM;
	m->w.len = (size_t)(mvcc_lease_encode(m->w.p + m->w.len, kind, id, ttl) - m->w.p);
	t->nops++;
	return 0;
}

/* Remember a lease op so a failed flush can undo it. */
static int mvcc_undo_lease(struct kvd *k, struct mvcc *m, struct lease *l, unsigned kind)
{
	if (mvcc_undo_push(k, m, NULL, MVCC_UNDO_CREATED))
		return KVD_ENOMEM;
	m->undo[m->nundo - 1].kind = kind;
	m->undo[m->nundo - 1].l = l;
	return 0;
}

/* Put key=val with lease in txn t. */
static int mvcc_put(struct kvd *k, struct mvcc_txn *t, const uint8_t *key, size_t klen, const uint8_t *val,
                    size_t vlen, int64_t lease)
{
	struct mvcc *m = &k->db;
	struct mvcc_key *r;
	struct mvcc_it it;
	int eq, live;
	uint64_t off;
	int64_t create, ver;
	size_t wlen = m->w.len;

	if (klen > 0xffffffffu || vlen > 0x7fffffffu)
		return KVD_ELIMIT;
	it = mvcc_seek(m, key, klen, &eq);
	r = eq ? mvcc_at(m, it) : NULL;
	live = r && (r->flags & MVCC_LIVE);
	if (live && mvcc_k_ver(m, r) >= INT64_MAX) /* a version past int64 could not be replayed */
		return KVD_ERANGE;
	create = live ? mvcc_k_create(m, r) : t->rev;
	ver = live ? mvcc_k_ver(m, r) + 1 : 1;
	if (lease_reserve(k, lease)) /* attaching the key cannot fail later */
		return KVD_ENOMEM;
	if (!(r && (r->flags & MVCC_EXT)) && mvcc_k_wide(t->rev, create, ver, lease) && mvcc_ext_reserve(k, m))
		return KVD_ENOMEM; /* nor can giving it a side-table slot */
	if (!r) {
		if (!(r = mvcc_new_key(k, key, klen)))
			return KVD_ENOMEM;
		if (mvcc_insert(k, m, it, r)) {
			mvcc_free_key(k, r);
			return KVD_ENOMEM;
		}
		if (mvcc_undo_push(k, m, r, MVCC_UNDO_CREATED)) {
			mvcc_remove(k, m, mvcc_seek(m, key, klen, &eq));
			mvcc_free_key(k, r);
			return KVD_ENOMEM;
		}
		eq = 0;
	} else if (mvcc_undo_push(k, m, r, MVCC_UNDO_CHANGED)) {
		return KVD_ENOMEM;
	}
	if (mvcc_emit(k, t, MVCC_OP_PUT, eq ? r->op + 1 : 0, create, ver, lease, key, klen, val, vlen, &off)) {
		m->nundo--; /* nothing changed yet */
		if (!eq) {
			mvcc_remove(k, m, mvcc_seek(m, key, klen, &eq));
			mvcc_free_key(k, r);
		}
		m->w.len = wlen;
		return KVD_ENOMEM;
	}
	if (eq)
		mvcc_dead(k, m, t->rev, mvcc_key_opsize(m, r));
	lease_rebind(k, r, mvcc_k_lease(m, r), lease);
	mvcc_k_set(m, r, t->rev, create, ver, lease);
	r->op = off;
	r->vlen = (uint32_t)vlen;
	return 0;
}

/* Delete live key r in txn t (a tombstone op). */
static int mvcc_del(struct kvd *k, struct mvcc_txn *t, struct mvcc_key *r)
{
	struct mvcc *m = &k->db;
	uint64_t off;

	if (mvcc_undo_push(k, m, r, MVCC_UNDO_CHANGED))
		return KVD_ENOMEM;
	if (mvcc_emit(k, t, MVCC_OP_DEL, r->op + 1, 0, 0, 0, r->key, r->klen, NULL, 0, &off)) {
		m->nundo--;
		return KVD_ENOMEM;
	}
	mvcc_dead(k, m, t->rev, mvcc_key_opsize(m, r));
	lease_rebind(k, r, mvcc_k_lease(m, r), 0);
	mvcc_k_set(m, r, t->rev, 0, 0, 0);
	r->vlen = 0;
	r->op = off;
	return 0;
}

/*
 * Compaction in RAM.  Keys whose latest op is a tombstone < rev leave the
 * index (etcd 3.5.16+ keeps a tombstone at rev itself, for watchers from rev) (with undo when a batch is open: they are freed once it is durable);
 * the statistics follow once the compaction is durable (mvcc_compact_stats).
 */
KVD_RESIDENT static int mvcc_compact_index(struct kvd *k, struct mvcc *m, int64_t rev, int with_undo)
{
	struct mvcc_it it = {0, 0};
	struct mvcc_key *r;

	while ((r = mvcc_at(m, it))) {
		if (!(r->flags & MVCC_LIVE) && r->mod < rev) {
			if (with_undo && mvcc_undo_push(k, m, r, MVCC_UNDO_REMOVED))
				return KVD_ENOMEM;
			m->reclaimable += mvcc_key_opsize(m, r);
			it = mvcc_remove(k, m, it);
			if (!with_undo)
				mvcc_free_key(k, r);
			continue;
		}
		mvcc_next(m, &it);
	}
	return 0;
}

/* Compacted to rev: what was superseded below it becomes reclaimable (a
 * rewrite keeps rev's own record, and so what it superseded). */
KVD_RESIDENT static void mvcc_compact_stats(struct mvcc *m, int64_t rev)
{
	size_t i, n = 0;

	for (i = 0; i < m->ndead && m->dead[i].hi < rev; i++) {
		m->reclaimable += m->dead[i].bytes;
		n++;
	}
	if (n) {
		memmove(m->dead, m->dead + n, (m->ndead - n) * sizeof *m->dead);
		m->ndead -= n;
	}
}

static void snap_keep_hash(struct kvd *k, int64_t rev); /* section 14: HashKV's memory of compactions */

/* Log a compaction to rev and apply it to the index. */
static int mvcc_compact(struct kvd *k, int64_t rev)
{
	struct mvcc *m = &k->db;
	size_t nundo = m->nundo;
	uint64_t recl = m->reclaimable;

	if (m->broken)
		return KVD_EIO;
	if (buf_reserve(k, &m->w, MVCC_COMPACT_REC_MAX))
		return KVD_ENOMEM;
	snap_keep_hash(k, rev);
	if (mvcc_compact_index(k, m, rev, 1)) { /* put back what was taken */
		while (m->nundo > nundo) {
			struct mvcc_key *r = m->undo[--m->nundo].r;
			int eq;
			mvcc_insert(k, m, mvcc_seek(m, r->key, r->klen, &eq), r);
		}
		m->reclaimable = recl;
		return KVD_ENOMEM;
	}
	mvcc_compact_encode(k->crc, &m->w, rev);
	m->compacted = rev;
	m->pending_compact = rev;
	return 0;
}

/*
 * The log moved: a rewrite (section 13) put its records at other offsets.
 * Offsets kept beyond one record follow: the mover re-points the index (each
 * key's latest op) and hands over the marks it made while writing the new
 * file; a watcher's position carries the generation it belongs to, so it is
 * found again by revision (watch_catchup).  Offsets inside records (an op's
 * prev) are the mover's to write.
 */
static void mvcc_log_moved(struct kvd *k, struct mvcc *m, struct mvcc_marks *marks)
{
	m->gen++;
	kvd_free(k, m->marks.v);
	m->marks = *marks;
	memset(marks, 0, sizeof *marks);
}

/* Undo index changes back to undo entry 'mark'. */
static void mvcc_undo_to(struct kvd *k, struct mvcc *m, size_t mark)
{
	struct mvcc_undo *u;
	int eq;

	while (m->nundo > mark) {
		u = &m->undo[--m->nundo];
		if (u->kind == MVCC_UNDO_GRANTED || u->kind == MVCC_UNDO_REVOKED) {
			lease_undo(k, u->l, u->kind);
		} else if (u->kind == MVCC_UNDO_CREATED) {
			lease_rebind(k, u->r, mvcc_k_lease(m, u->r), 0);
			mvcc_remove(k, m, mvcc_seek(m, u->r->key, u->r->klen, &eq));
			mvcc_free_key(k, u->r);
		} else if (u->kind == MVCC_UNDO_REMOVED) {
			m->reclaimable -= mvcc_key_opsize(m, u->r);
			if (mvcc_insert(k, m, mvcc_seek(m, u->r->key, u->r->klen, &eq), u->r)) {
				kvd_log(k, KVD_LOG_ERROR, "out of memory undoing a compaction: key dropped from the index");
				mvcc_free_key(k, u->r);
			}
		} else {
			mvcc_restore(k, u->r, &u->was);
		}
	}
}

/* Forget a txn half-way (an op failed): its changes and its ops go. */
static void mvcc_txn_abort(struct kvd *k, struct mvcc_txn *t)
{
	mvcc_undo_to(k, &k->db, t->undo_at);
	t->nops = 0; /* mvcc_txn_end then drops the record */
}

/* Undo the batch: index, revision, compaction. */
static void mvcc_rollback(struct kvd *k, struct mvcc *m)
{
	mvcc_undo_to(k, m, 0);
	auth_rollback(k);
	while (m->marks.n && m->marks.v[m->marks.n - 1].off >= m->size)
		m->marks.n--;
	m->rev = m->rev_durable;
	m->compacted = m->compacted_durable;
	m->pending_compact = 0;
	m->w.len = 0;
}

/* The batch is durable: free what compaction took out, forget the undo. */
static void mvcc_commit(struct kvd *k, struct mvcc *m)
{
	size_t i;

	for (i = 0; i < m->nundo; i++)
		if (m->undo[i].kind == MVCC_UNDO_REMOVED)
			mvcc_free_key(k, m->undo[i].r);
		else if (m->undo[i].kind == MVCC_UNDO_REVOKED)
			lease_free(k, m->undo[i].l);
	m->nundo = 0;
	auth_commit(k);
	if (m->undocap > 4096) {
		kvd_free(k, m->undo);
		m->undo = NULL;
		m->undocap = 0;
	}
	m->rev_durable = m->rev;
	m->compacted_durable = m->compacted;
	if (m->pending_compact) {
		mvcc_compact_stats(m, m->pending_compact);
		m->pending_compact = 0;
	}
}

#ifdef KVD_TEST_SERVICES
/*
 * Test builds only: what the robustness harness (test/robust) needs of the
 * store, and nothing a product build carries.
 *
 * KVD_TEST_HISTORY=<file>: every batch is described there just before it is
 * written, one line per request, so the harness can check watches and stale
 * reads against what kvd persisted without trusting kvd's watch path:
 *     <inode> <end> <rev> T [P <hexkey> <hexval> <lease> | D <hexkey>]...
 *     <inode> <end> <rev> G <lease>    a grant       ... R <lease>  a revoke
 *     <inode> <end> <rev> C <rev>      a compaction
 * (inode and end offset: which log file, and where the record ends in it).
 * A batch lost to a crash is a suffix of the log, so its lines are a suffix
 * of the file: mvcc_test_history_open drops the lines of the current log
 * file that end past what replay found.  A revoke's deletes are its R line.
 *
 * KVD_TEST_FSYNC_DELAY_MS=<n>: every log fdatasync takes n ms longer (slow
 * flash).  KVD_TEST_FLUSH_CRASH=before-sync:N|after-sync:N dies (SIGKILL) at
 * the Nth flush, around its fdatasync.  SIGUSR2 is a power cut: the log is
 * cut back to its last fdatasync and the process exits at once.
 */
static void mvcc_test_hex(struct kvd *k, struct kvd_buf *b, const uint8_t *p, size_t n)
{
	static const char hx[] = "0123456789abcdef";
	size_t i;

	if (!n) {
		buf_append(k, b, "-", 1);
		return;
	}
	for (i = 0; i < n; i++) {
		char two[2] = {hx[p[i] >> 4], hx[p[i] & 15]};
		buf_append(k, b, two, 2);
	}
}

static void mvcc_test_history(struct kvd *k, const uint8_t *p, size_t n, uint64_t base)
{
	struct mvcc *m = &k->db;
	struct kvd_buf b = {0};
	struct mvcc_rec rec;
	struct mvcc_op op;
	struct stat st;
	const char *why, *path = getenv("KVD_TEST_HISTORY");
	char num[96];
	size_t at = 0;
	long len;
	int fd, e;

	if (!path || fstat(m->fd, &st))
		return;
	while ((len = mvcc_frame(p + at, n - at, base + at, base + n, NULL, &rec, &why)) > 0) {
		uint64_t end = base + at + (uint64_t)len;
		at += (size_t)len;
		if (mvcc_rec_decode(&rec, &why))
			continue;
		snprintf(num, sizeof num, "%llu %llu %lld ", (unsigned long long)st.st_ino, (unsigned long long)end,
		         (long long)rec.rev);
		if (rec.type == MVCC_REC_COMPACT) {
			buf_append(k, &b, num, strlen(num));
			snprintf(num, sizeof num, "C %lld\n", (long long)rec.rev);
			buf_append(k, &b, num, strlen(num));
			continue;
		}
		if (rec.type != MVCC_REC_TXN)
			continue;
		{
			struct mvcc_rec scan = rec;
			int revoke = 0, kv = 0;
			while ((e = mvcc_rec_op(&scan, &op, &why)) == 1) {
				revoke |= op.kind == MVCC_OP_REVOKE;
				kv |= op.kind == MVCC_OP_PUT || op.kind == MVCC_OP_DEL;
			}
			if (kv && !revoke) {
				buf_append(k, &b, num, strlen(num));
				buf_append(k, &b, "T", 1);
			}
			while ((e = mvcc_rec_op(&rec, &op, &why)) == 1) {
				if (op.kind == MVCC_OP_GRANT || op.kind == MVCC_OP_REVOKE) {
					char l[160];
					snprintf(l, sizeof l, "%s%c %lld\n", num, op.kind == MVCC_OP_GRANT ? 'G' : 'R',
					         (long long)op.lease);
					buf_append(k, &b, l, strlen(l));
				} else if (kv && !revoke) {
					buf_append(k, &b, op.kind == MVCC_OP_PUT ? " P " : " D ", 3);
					mvcc_test_hex(k, &b, op.key, (size_t)op.klen);
					if (op.kind == MVCC_OP_PUT) {
						buf_append(k, &b, " ", 1);
						mvcc_test_hex(k, &b, op.val, (size_t)op.vlen);
						snprintf(num, sizeof num, " %lld", (long long)op.lease);
						buf_append(k, &b, num, strlen(num));
					}
				}
			}
			if (kv && !revoke)
				buf_append(k, &b, "\n", 1);
		}
	}
	if (b.len && (fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600)) >= 0) {
		m->hist_mark = lseek(fd, 0, SEEK_END);
		if (write(fd, b.p, b.len) != (ssize_t)b.len)
			kvd_log(k, KVD_LOG_WARN, "KVD_TEST_HISTORY: short write");
		close(fd);
	}
	buf_free(k, &b);
}

/* A flush failed and its batch was undone: so are its lines. */
static void mvcc_test_history_undo(struct kvd *k)
{
	const char *path = getenv("KVD_TEST_HISTORY");

	if (path && k->db.hist_mark >= 0 && truncate(path, k->db.hist_mark))
		kvd_log(k, KVD_LOG_WARN, "KVD_TEST_HISTORY: cannot cut back: %s", strerror(errno));
	k->db.hist_mark = -1;
}

/* After replay: forget the history lines of batches the log lost. */
static void mvcc_test_history_open(struct kvd *k)
{
	struct mvcc *m = &k->db;
	const char *path = getenv("KVD_TEST_HISTORY");
	unsigned long long ino, end;
	size_t keep = 0, at = 0, lastother = 0;
	struct stat st;
	char line[256];
	FILE *f;

	m->synced = m->size;
	m->synced_gen = m->gen;
	m->hist_mark = -1;
	if (!path || fstat(m->fd, &st) || !(f = fopen(path, "r")))
		return;
	/* lines of an older log file (before the last rewrite) are all kept;
	 * those of the current one only up to the replayed end */
	while (fgets(line, sizeof line, f)) {
		size_t l = strlen(line);
		int c;
		if (line[l - 1] != '\n') /* a long line: skip to its end */
			while ((c = fgetc(f)) != EOF && c != '\n')
				l++;
		at += l + (line[strlen(line) - 1] != '\n');
		if (sscanf(line, "%llu %llu", &ino, &end) == 2 && ino != (unsigned long long)st.st_ino)
			lastother = at;
	}
	rewind(f);
	keep = lastother;
	at = 0;
	while (fgets(line, sizeof line, f)) {
		size_t l = strlen(line);
		int c;
		int whole = line[l - 1] == '\n';
		if (!whole)
			while ((c = fgetc(f)) != EOF && c != '\n')
				l++;
		l += !whole;
		if (at >= lastother) {
			if (sscanf(line, "%llu %llu", &ino, &end) != 2 || end > m->size)
				break;
			keep = at + l;
		}
		at += l;
	}
	fclose(f);
	if (truncate(path, (off_t)keep))
		kvd_log(k, KVD_LOG_WARN, "KVD_TEST_HISTORY: cannot cut back: %s", strerror(errno));
}

static void mvcc_test_sync_hook(struct kvd *k, const char *point)
{
	const char *want = getenv("KVD_TEST_FLUSH_CRASH"), *d = getenv("KVD_TEST_FSYNC_DELAY_MS");
	size_t pl = strlen(point);

	if (d && !strcmp(point, "before-sync") && atoi(d) > 0) {
		struct timespec ts = {atoi(d) / 1000, (long)(atoi(d) % 1000) * 1000000L};
		while (nanosleep(&ts, &ts) && errno == EINTR)
			;
	}
	if (want && !strncmp(want, point, pl) && want[pl] == ':' && k->db.flushes == (unsigned)atoi(want + pl + 1))
		raise(SIGKILL);
}
#else
#define mvcc_test_history(k, p, n, base) ((void)0)
#define mvcc_test_history_open(k) ((void)0)
#define mvcc_test_history_undo(k) ((void)0)
#define mvcc_test_sync_hook(k, point) ((void)0)
#endif

/*
 * Make the batch durable: one pwrite at the end of the log, one fdatasync.
 * On failure the file is cut back, the batch undone, KVD_EIO returned and
 * the errno kept in m->last_errno (a full disk is answered differently); if
 * the file cannot be cut back, writes stop until a restart.
 */
KVD_RESIDENT static int mvcc_flush(struct kvd *k)
{
	struct mvcc *m = &k->db;
	const uint8_t *p = m->w.p;
	size_t n = m->w.len;
	uint64_t off = m->size;
	ssize_t r;
	int64_t t0, us;
	int err, b;

	if (!n)
		return 0;
	t0 = util_now_us();
#ifdef KVD_TEST_SERVICES
	m->flushes++;
#endif
	mvcc_test_history(k, p, n, off);
	while (n) {
		r = pwrite(m->fd, p, n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			err = r < 0 ? errno : ENOSPC;
			goto fail;
		}
		p += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	mvcc_test_sync_hook(k, "before-sync");
#if KVD_TEST_BUG == 1 /* planted: the batch is acknowledged before it is durable */
	if (0) {
#else
	if (!m->no_fsync && fdatasync(m->fd)) {
#endif
		err = errno;
		goto fail;
	}
#if defined KVD_TEST_SERVICES && KVD_TEST_BUG != 1
	m->synced = off;
	m->synced_gen = m->gen;
#endif
	mvcc_test_sync_hook(k, "after-sync");
	us = util_now_us() - t0; /* etcd_disk_wal_fsync_duration_seconds: the write and its sync */
	for (b = 0; b < KVD_FSYNC_BUCKETS && us > (1000ll << b); b++)
		;
	if (b < KVD_FSYNC_BUCKETS)
		k->st.fsync_b[b]++;
	k->st.fsync_n++;
	k->st.fsync_sum += (double)us / 1e6;
	m->size += m->w.len;
	m->flushed = m->w.len; /* the bytes stay in m->w.p for mvcc_batch_done's caller */
	m->w.len = 0;
	mvcc_commit(k, m);
	return 0;
fail:
	if (ftruncate(m->fd, (off_t)m->size) || (!m->no_fsync && fdatasync(m->fd))) {
		m->broken = 1;
		snprintf(m->why, sizeof m->why, "%s", strerror(err));
		kvd_log(k, KVD_LOG_ERROR, "log write failed (%s) and the log cannot be cut back: "
		        "writes refused until restart", strerror(err));
	} else {
		kvd_log(k, KVD_LOG_WARN, "log write failed: %s; %zu bytes of this batch not committed",
		        strerror(err), m->w.len);
		mvcc_test_history_undo(k);
	}
	mvcc_rollback(k, m);
	m->last_errno = err;
	return KVD_EIO;
}

/* The last flushed batch has been looked at (watch dispatch): let it go. */
static void mvcc_batch_done(struct kvd *k)
{
	k->db.flushed = 0;
	buf_trim(k, &k->db.w, 1 << 20);
}

/* ---- recovery ----------------------------------------------------------- */

/* Apply one op of a TXN record being replayed (of revision rev).  Returns
 * 0, KVD_ECORRUPT (why) or KVD_ENOMEM. */
static int mvcc_replay_op(struct kvd *k, struct mvcc *m, int64_t rev, const struct mvcc_op *op, const char **why)
{
	struct mvcc_key *r;
	struct mvcc_it it;
	int eq, e;

	if (op->kind == MVCC_OP_GRANT || op->kind == MVCC_OP_REVOKE) {
		if ((e = lease_replay(k, (int)op->kind, op->lease, op->ttl)))
			*why = e == KVD_ENOMEM ? "out of memory" : op->kind == MVCC_OP_GRANT ? "lease granted twice" :
			       "revoke of a missing lease, or of one with keys";
		return e;
	}
	if (op->rev != rev || !op->klen) {
		*why = "bad op";
		return KVD_ECORRUPT;
	}
	it = mvcc_seek(m, op->key, op->klen, &eq);
	r = eq ? mvcc_at(m, it) : NULL;
	if ((r ? r->op + 1 : 0) != op->prev) {
		*why = "op chain does not match the index";
		return KVD_ECORRUPT;
	}
	if (op->kind == MVCC_OP_DEL && (!r || !(r->flags & MVCC_LIVE))) {
		*why = "delete of a missing key";
		return KVD_ECORRUPT;
	}
	if (op->kind == MVCC_OP_PUT && op->lease && !lease_find(k, op->lease)) {
		*why = "put with a lease that does not exist";
		return KVD_ECORRUPT;
	}
	if (op->kind == MVCC_OP_PUT && mvcc_k_wide(rev, op->create, op->ver, op->lease) && mvcc_ext_reserve(k, m)) {
		*why = "out of memory";
		return KVD_ENOMEM;
	}
	if (!r) {
		if (!(r = mvcc_new_key(k, op->key, op->klen)) || mvcc_insert(k, m, it, r)) {
			mvcc_free_key(k, r);
			*why = "out of memory";
			return KVD_ENOMEM;
		}
	} else {
		mvcc_dead(k, m, rev, mvcc_key_opsize(m, r));
	}
	lease_rebind(k, r, mvcc_k_lease(m, r), op->kind == MVCC_OP_PUT ? op->lease : 0);
	if (op->kind == MVCC_OP_PUT)
		mvcc_k_set(m, r, rev, op->create, op->ver, op->lease);
	else
		mvcc_k_set(m, r, rev, 0, 0, 0);
	r->vlen = (uint32_t)op->vlen;
	r->op = op->off;
	return 0;
}

/* Apply one op of a BASE record: a lease grant, or a key's put with no
 * history before it.  Returns 0, KVD_ECORRUPT (why) or KVD_ENOMEM. */
static int mvcc_replay_base_op(struct kvd *k, struct mvcc *m, int64_t rev, const struct mvcc_op *op, const char **why)
{
	struct mvcc_key *r = NULL;
	struct mvcc_it it;
	int eq, e;

	if (op->kind == MVCC_OP_GRANT) {
		if ((e = lease_replay(k, MVCC_OP_GRANT, op->lease, op->ttl)))
			*why = e == KVD_ENOMEM ? "out of memory" : "lease granted twice";
		return e;
	}
	if (op->kind != MVCC_OP_PUT || op->prev > UINT32_MAX || op->rev < 1 || op->rev > rev || !op->klen ||
	    op->create < 1 || op->create > op->rev || op->ver < 1) {
		*why = "bad base op";
		return KVD_ECORRUPT;
	}
	it = mvcc_seek(m, op->key, op->klen, &eq);
	if (eq) {
		*why = "key twice in the base";
		return KVD_ECORRUPT;
	}
	if (op->lease && !lease_find(k, op->lease)) {
		*why = "put with a lease that does not exist";
		return KVD_ECORRUPT;
	}
	if ((mvcc_k_wide(op->rev, op->create, op->ver, op->lease) && mvcc_ext_reserve(k, m)) ||
	    !(r = mvcc_new_key(k, op->key, op->klen)) || mvcc_insert(k, m, it, r)) {
		mvcc_free_key(k, r);
		*why = "out of memory";
		return KVD_ENOMEM;
	}
	lease_rebind(k, r, 0, op->lease);
	mvcc_k_set(m, r, op->rev, op->create, op->ver, op->lease);
	r->vlen = (uint32_t)op->vlen;
	r->op = op->off;
	return 0;
}

/* Apply one whole record.  Returns 0, KVD_ECORRUPT (why) or KVD_ENOMEM. */
KVD_RESIDENT static int mvcc_replay_record(struct kvd *k, struct mvcc *m, struct mvcc_rec *rec, const char **why)
{
	struct mvcc_op op;
	uint32_t nkeys = 0;
	size_t frame;
	int r;

	if ((r = mvcc_rec_decode(rec, why)))
		return r;
	if (!rec->off && rec->type != MVCC_REC_HEADER) {
		*why = "no header record";
		return KVD_ECORRUPT;
	}
	switch (rec->type) {
	case MVCC_REC_TXN:
		if (m->rev >= INT64_MAX || rec->rev != m->rev + 1) {
			*why = "txn revision out of sequence";
			return KVD_ECORRUPT;
		}
		frame = MVCC_REC_HDR + (size_t)(rec->next - rec->p);
		while ((r = mvcc_rec_op(rec, &op, why)) == 1) {
			if ((r = mvcc_replay_op(k, m, rec->rev, &op, why)))
				return r;
			nkeys += op.kind == MVCC_OP_PUT || op.kind == MVCC_OP_DEL;
		}
		if (r)
			return r;
		mvcc_dead(k, m, rec->rev, nkeys ? frame : MVCC_REC_HDR + (size_t)(rec->end - rec->p)); /* as mvcc_txn_end */
		if (!nkeys)
			return 0; /* lease ops only: no revision */
		mvcc_mark(k, &m->marks, rec->rev, rec->off);
		m->rev = rec->rev;
		return 0;
	case MVCC_REC_COMPACT:
		if (rec->rev > m->rev || rec->rev <= m->compacted) {
			*why = "bad compact record";
			return KVD_ECORRUPT;
		}
		m->compacted = rec->rev;
		if (mvcc_compact_index(k, m, rec->rev, 0)) {
			*why = "out of memory";
			return KVD_ENOMEM;
		}
		mvcc_compact_stats(m, rec->rev);
		return 0;
	case MVCC_REC_BASE: /* only right after the header, all at one revision */
		if (m->compacted != -1 || (m->base_rev ? rec->rev != m->base_rev || m->rev != m->base_rev : m->rev != 1) ||
		    rec->rev < 1) {
			*why = "base record out of place";
			return KVD_ECORRUPT;
		}
		while ((r = mvcc_rec_op(rec, &op, why)) == 1)
			if ((r = mvcc_replay_base_op(k, m, rec->rev, &op, why)))
				return r;
		if (r)
			return r;
		m->rev = m->base_rev = rec->rev;
		m->base_end = rec->off + MVCC_REC_HDR + (uint64_t)(rec->end - rec->p);
		return 0;
	case MVCC_REC_ALARM:
		return mvcc_rec_alarms(rec, m->alarms, MVCC_MAX_ALARMS, &m->nalarms, why);
	case MVCC_REC_AUTH:
		return auth_replay(k, rec, why);
	}
	return 0; /* the header: mvcc_rec_decode checked it */
}

/* Is there a complete record with a good CRC at off (within [off, size))? */
static int mvcc_valid_at(struct kvd *k, struct mvcc *m, uint64_t off, uint64_t size)
{
	struct kvd_buf b = {0};
	struct mvcc_rec rec;
	const char *why;
	uint8_t h[MVCC_REC_HDR];
	size_t len;
	int ok;

	if (off + MVCC_REC_HDR > size || mvcc_pread(m, h, MVCC_REC_HDR, off))
		return 0;
	if (mvcc_frame(h, MVCC_REC_HDR, off, size, NULL, &rec, &why) < 0)
		return 0;
	len = MVCC_REC_HDR + (size_t)get_be32(h);
	if (buf_reserve(k, &b, len))
		return 1; /* cannot tell: assume valid data follows, the safe answer */
	ok = !mvcc_pread(m, b.p, len, off) && mvcc_frame(b.p, len, off, size, k->crc, &rec, &why) > 0;
	buf_free(k, &b);
	return ok;
}

/* First offset after 'from' where a valid record starts, or 0.  Headers are
 * screened in memory; only plausible ones are read whole and checksummed. */
static uint64_t mvcc_next_valid(struct kvd *k, struct mvcc *m, uint64_t from, uint64_t size, uint8_t *buf, size_t cap)
{
	uint64_t base, pos;
	size_t n, i;
	ssize_t got;

	for (base = from + 1; base < size; base += n > MVCC_REC_HDR ? n - (MVCC_REC_HDR - 1) : n) {
		n = (size_t)KVD_MIN((uint64_t)cap, size - base);
		got = pread(m->fd, buf, n, (off_t)base);
		if (got <= 0)
			return 0;
		n = (size_t)got;
		for (i = 0; i < n; i++) {
			pos = base + i;
			if (i + MVCC_REC_HDR <= n &&
			    (buf[i + 8] < MVCC_REC_HEADER || buf[i + 8] > MVCC_REC_AUTH ||
			     get_be32(buf + i) > size - pos - MVCC_REC_HDR))
				continue;
			if (mvcc_valid_at(k, m, pos, size))
				return pos;
		}
		if (n <= MVCC_REC_HDR)
			break;
	}
	return 0;
}

/*
 * Replay the log into the index.  A bad record with nothing valid after it
 * is a torn tail (a crash mid-write): cut it, say how many bytes and why.  A
 * bad record followed by valid ones is corruption: refuse to start.  A
 * header whose format is newer than MVCC_FORMAT is no damage: refused as
 * configuration (KVD_EINVAL, exit 2), the log untouched.
 */
static int mvcc_replay(struct kvd *k, struct mvcc *m, uint64_t size, char *err, size_t errlen)
{
	struct kvd_buf win = {0};
	struct mvcc_reader rd;
	struct mvcc_rec rec;
	uint64_t scan;
	const char *why = NULL;
	int r;

	m->size = size; /* mvcc_pread reads the file up to here */
	mvcc_reader_init(&rd, &win, 0, size, 1 << 20, k->crc);
	while ((r = mvcc_read_rec(k, &rd, &rec, &why)) == 1) {
		if ((r = mvcc_replay_record(k, m, &rec, &why))) {
			if (r == KVD_ENOMEM)
				snprintf(err, errlen, "out of memory replaying the log");
			else if (r == KVD_EINVAL) /* not damage: kvd_main's exit 2, so no init system retries it */
				snprintf(err, errlen, "%s/kvd.log: written by a newer kvd (log format %lu; this kvd reads "
				         "formats 1 to %d): run that kvd, or restore a snapshot it saved (the log is left as it is)",
				         k->cfg.data_dir, (unsigned long)get_be32(rec.p + 8), MVCC_FORMAT);
			else
				snprintf(err, errlen, "%s/kvd.log: %s at offset %llu: refusing to start",
				         k->cfg.data_dir, why, (unsigned long long)rec.off);
			goto out;
		}
	}
	if (r == KVD_ENOMEM || r == KVD_EIO) {
		snprintf(err, errlen, r == KVD_ENOMEM ? "out of memory reading the log" : "cannot read the log: %s",
		         strerror(errno));
		goto out;
	}
	if (r) { /* torn tail, or corruption with valid records after it */
		if (buf_reserve(k, &win, 1 << 16)) {
			r = KVD_ENOMEM;
			snprintf(err, errlen, "out of memory reading the log");
			goto out;
		}
		if ((scan = mvcc_next_valid(k, m, rd.off, size, win.p, win.cap))) {
			snprintf(err, errlen, "%s/kvd.log: %s at offset %llu, but valid records follow at %llu: "
			         "corruption, refusing to start (acknowledged data would be lost)",
			         k->cfg.data_dir, why, (unsigned long long)rd.off, (unsigned long long)scan);
			goto out;
		}
		kvd_log(k, KVD_LOG_WARN, "log: cutting a torn tail of %llu bytes at offset %llu (%s)",
		        (unsigned long long)(size - rd.off), (unsigned long long)rd.off, why);
		if (ftruncate(m->fd, (off_t)rd.off) || fdatasync(m->fd)) {
			snprintf(err, errlen, "cannot cut the log's torn tail: %s", strerror(errno));
			r = KVD_EIO;
			goto out;
		}
		r = 0;
	}
	if (m->base_rev > 1 && m->compacted < m->base_rev) { /* B = C - 1 (a rewrite), B = C (an import) */
		snprintf(err, errlen, "%s/kvd.log: base records at revision %lld without the compaction that made them: "
		         "refusing to start", k->cfg.data_dir, (long long)m->base_rev);
		r = KVD_ECORRUPT;
		goto out;
	}
	m->size = rd.off;
out:
	buf_free(k, &win);
	return r;
}

/* Open (or create) the log and rebuild the index from it. */
KVD_RESIDENT static int mvcc_open(struct kvd *k, char *err, size_t errlen)
{
	struct mvcc *m = &k->db;
	char path[PATH_MAX];
	uint8_t rec[MVCC_HEADER_REC];
	struct stat st;
	int64_t t0 = util_now_ms(), dfd;
	int r;

	snprintf(path, sizeof path, "%s/kvd.log.new", k->cfg.data_dir);
	if (!lstat(path, &st)) { /* a rewrite that never switched: the log is whole without it */
		if (unlink(path)) {
			snprintf(err, errlen, "cannot remove %s: %s", path, strerror(errno));
			return KVD_EIO;
		}
		kvd_log(k, KVD_LOG_WARN, "removed %s (%llu bytes): a log rewrite that did not finish", path,
		        (unsigned long long)st.st_size);
	}
	snprintf(path, sizeof path, "%s/kvd.log", k->cfg.data_dir);
	m->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (m->fd < 0 || fstat(m->fd, &st)) {
		snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
		return KVD_EIO;
	}
	if (st.st_size > 0 && (r = mvcc_replay(k, m, (uint64_t)st.st_size, err, errlen)))
		return r;
	if (!m->size) { /* new store (or a header torn at creation): the header record, durable with its entry */
		mvcc_header_encode(k->crc, rec);
		if (pwrite(m->fd, rec, sizeof rec, 0) != (ssize_t)sizeof rec || fsync(m->fd)) {
			snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
			return KVD_EIO;
		}
		if ((dfd = open(k->cfg.data_dir, O_RDONLY | O_CLOEXEC)) >= 0) {
			fsync((int)dfd);
			close((int)dfd);
		}
		m->size = sizeof rec;
		mvcc_test_history_open(k);
		kvd_log(k, KVD_LOG_INFO, "created %s", path);
		return 0;
	}
	m->rev_durable = m->rev;
	m->compacted_durable = m->compacted;
	mvcc_test_history_open(k);
	lease_promote(k);
	kvd_log(k, KVD_LOG_INFO, "log replayed: %zu keys, %zu leases, revision %lld, compacted %lld, %llu bytes in %lld ms",
	        m->nkeys, k->lease.n, (long long)m->rev, (long long)m->compacted, (unsigned long long)m->size,
	        (long long)(util_now_ms() - t0));
	return 0;
}

static void mvcc_close(struct kvd *k)
{
	struct mvcc *m = &k->db;
	size_t i;
	unsigned j;

	for (i = 0; i < m->nleaf; i++) {
		for (j = 0; j < m->leaf[i]->n; j++)
			mvcc_free_key(k, m->leaf[i]->k[j]);
		kvd_free(k, m->leaf[i]);
	}
	kvd_free(k, m->leaf);
	kvd_free(k, m->undo);
	kvd_free(k, m->dead);
	kvd_free(k, m->marks.v);
	kvd_free(k, m->ext);
	mvcc_slab_close(k);
	buf_free(k, &m->w);
	if (m->fd >= 0)
		close(m->fd);
	memset(m, 0, sizeof *m);
	m->fd = -1;
}

static void mvcc_init(struct mvcc *m)
{
	memset(m, 0, sizeof *m);
	m->fd = -1;
	m->rev = m->rev_durable = 1; /* an empty etcd store is at revision 1 */
	m->compacted = m->compacted_durable = -1;
}

/* ===== 11. Leases (lease_) =============================================== */

/*
 * A lease is an id, a granted TTL, a deadline on the monotonic clock (boards
 * have no RTC) and the set of keys attached to it.  Grants and revokes are
 * ops in the log (section 9); a revoke shares its record and its revision
 * with the deletes of its keys, so a crash never leaves half of one.
 * Keep-alives are not logged (they would wear flash for nothing): after a
 * restart every lease gets its full TTL plus the election timeout, which is
 * what etcd does without lease checkpoints.
 *
 * Deadlines sit on a hashed timer wheel: LEASE_SLOTS slots of LEASE_TICK ms,
 * a lease in the slot of its deadline's tick, a bitmap of non-empty slots.
 * Grant, renew and revoke are O(1); the poll timeout is the next non-empty
 * slot; a lease due in a later turn of the wheel is looked at once per turn.
 * Expiry revokes at most KVD_LEASE_EXPIRE_MAX leases per loop iteration.
 *
 * A lease's keys are an open-addressing set of pointers to the index's key
 * records (which never move): attach, detach and revoke cost no scan of the
 * index, and keys without a lease cost nothing.
 *
 * Invariants:
 *   1. A lease's key set is exactly the keys whose lease (mvcc_k_lease)
 *      is its id: every change of it goes through lease_rebind (puts, deletes,
 *      undo, replay), and a put cannot fail to attach its key, because
 *      lease_reserve made room first (only an undo can find no memory, and
 *      lease_rebind logs it).
 *   2. A revoke is one record with the deletes of its keys (lease_revoke),
 *      and replay refuses a revoke of a lease that still has keys
 *      (lease_replay), so no key outlives its lease across a crash.
 *   3. A revoked lease leaves the table at once but is freed only once the
 *      batch is durable (mvcc_commit); a failed flush puts it back
 *      (lease_undo), so the undo list never points at freed memory.
 *   4. Expiry is bounded and never lost: at most KVD_LEASE_EXPIRE_MAX
 *      revokes per loop iteration (lease_timers), and one that cannot be
 *      written is tried again every LEASE_RETRY_MS (lease_expire).
 */

/* A lease: an id, its TTL, its deadline, its keys. */
struct lease {
	int64_t id, ttl;              /* granted TTL, seconds */
	int64_t deadline;             /* monotonic ms */
	struct lease *hnext;          /* table chain */
	struct lease *wprev, *wnext;  /* wheel slot list */
	struct mvcc_key **keys;       /* attached keys: open-addressing set of kmask + 1 slots */
	uint32_t nkeys, kmask, slot;
};

#ifndef KVD_LEASE_EXPIRE_MAX /* @@ leases revoked by expiry per loop iteration */
#define KVD_LEASE_EXPIRE_MAX 512
#endif
#define LEASE_TICK 100              /* ms per wheel slot */
#define LEASE_SLOTS 1024            /* one turn of the wheel: 102.4 s */
#define LEASE_RETRY_MS 1000         /* an expiry that could not be written is retried */

static size_t lease_hash(int64_t id)
{
	uint64_t x = (uint64_t)id;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	return (size_t)(x ^ (x >> 33));
}

KVD_RESIDENT static struct lease *lease_find(struct kvd *k, int64_t id)
{
	struct lease *l;

	if (!k->lease.tab)
		return NULL;
	for (l = k->lease.tab[lease_hash(id) & k->lease.mask]; l; l = l->hnext)
		if (l->id == id)
			return l;
	return NULL;
}

/* ---- attached keys ------------------------------------------------------- */

static size_t lease_kslot(const struct lease *l, const struct mvcc_key *r)
{
	return (size_t)(((uint64_t)(uintptr_t)r >> 3) * 0x9e3779b97f4a7c15ull >> 24) & l->kmask;
}

KVD_RESIDENT static void lease_kput(struct lease *l, struct mvcc_key *r)
{
	size_t i = lease_kslot(l, r);

	while (l->keys[i])
		i = (i + 1) & l->kmask;
	l->keys[i] = r;
	l->nkeys++;
}

/* Room for n keys at a load of at most 1/2. */
KVD_RESIDENT static int lease_kgrow(struct kvd *k, struct lease *l, uint32_t n)
{
	struct mvcc_key **old = l->keys;
	uint32_t cap = l->keys ? l->kmask + 1 : 0, ncap = cap ? cap : 4, i;

	if ((uint64_t)n * 2 <= cap)
		return 0;
	while ((uint64_t)n * 2 > ncap)
		ncap *= 2;
	if (ncap > 0x40000000u || !(l->keys = kvd_calloc(k, (size_t)ncap * sizeof *l->keys))) {
		l->keys = old;
		return KVD_ENOMEM;
	}
	l->kmask = ncap - 1;
	l->nkeys = 0;
	for (i = 0; i < cap; i++)
		if (old[i])
			lease_kput(l, old[i]);
	kvd_free(k, old);
	return 0;
}

/* Remove r, shifting back the entries of its probe run (no tombstones). */
static void lease_kdel(struct kvd *k, struct lease *l, struct mvcc_key *r)
{
	size_t i, j, h;

	if (!l->keys)
		return;
	for (i = lease_kslot(l, r); l->keys[i] != r; i = (i + 1) & l->kmask)
		if (!l->keys[i])
			return;
	l->keys[i] = NULL;
	l->nkeys--;
	for (j = (i + 1) & l->kmask; l->keys[j]; j = (j + 1) & l->kmask) {
		h = lease_kslot(l, l->keys[j]);
		if (((j - h) & l->kmask) >= ((j - i) & l->kmask)) { /* h is not in (i, j]: move it to i */
			l->keys[i] = l->keys[j];
			l->keys[j] = NULL;
			i = j;
		}
	}
	if (!l->nkeys) {
		kvd_free(k, l->keys);
		l->keys = NULL;
		l->kmask = 0;
	}
}

/* Before a put attaches a key to lease id: make sure that cannot fail. */
static int lease_reserve(struct kvd *k, int64_t id)
{
	struct lease *l = id ? lease_find(k, id) : NULL;

	return l ? lease_kgrow(k, l, l->nkeys + 1) : 0;
}

/* Key r moves from lease 'from' to lease 'to' (0: none). */
KVD_RESIDENT static void lease_rebind(struct kvd *k, struct mvcc_key *r, int64_t from, int64_t to)
{
	struct lease *l;

	if (from == to)
		return;
	if (from && (l = lease_find(k, from)))
		lease_kdel(k, l, r);
	if (to && (l = lease_find(k, to))) {
		if (lease_kgrow(k, l, l->nkeys + 1)) /* only an undo can get here */
			kvd_log(k, KVD_LOG_ERROR, "out of memory: a key of lease %016llx will outlive it",
			        (unsigned long long)to);
		else
			lease_kput(l, r);
	}
}

/* ---- the timer wheel ----------------------------------------------------- */

KVD_RESIDENT static void lease_wheel_add(struct kvd *k, struct lease *l)
{
	struct lease_reg *g = &k->lease;
	int64_t t = (l->deadline + LEASE_TICK - 1) / LEASE_TICK;

	if (t < g->cursor)
		t = g->cursor;
	l->slot = (uint32_t)(t & (LEASE_SLOTS - 1));
	l->wprev = NULL;
	l->wnext = g->wheel[l->slot];
	if (l->wnext)
		l->wnext->wprev = l;
	g->wheel[l->slot] = l;
	g->bits[l->slot / 64] |= 1ull << (l->slot % 64);
	util_wake_by(k, t * LEASE_TICK);
}

static void lease_wheel_del(struct kvd *k, struct lease *l)
{
	struct lease_reg *g = &k->lease;

	if (l->wprev)
		l->wprev->wnext = l->wnext;
	else
		g->wheel[l->slot] = l->wnext;
	if (l->wnext)
		l->wnext->wprev = l->wprev;
	if (!g->wheel[l->slot])
		g->bits[l->slot / 64] &= ~(1ull << (l->slot % 64));
	l->wprev = l->wnext = NULL;
}

/* The first tick in [from, to] whose slot holds leases, or to + 1. */
static int64_t lease_next_tick(const struct lease_reg *g, int64_t from, int64_t to)
{
	int64_t t = from;
	unsigned s, b;
	uint64_t w;

	if (to > from + LEASE_SLOTS - 1)
		to = from + LEASE_SLOTS - 1;
	while (t <= to) {
		s = (unsigned)(t & (LEASE_SLOTS - 1));
		w = g->bits[s / 64] >> (s % 64);
		if (!w) {
			t += 64 - s % 64;
			continue;
		}
		for (b = 0; !(w & 1); b++)
			w >>= 1;
		return t + b <= to ? t + b : to + 1;
	}
	return to + 1;
}

/* ---- the table ----------------------------------------------------------- */

static int lease_setup(struct kvd *k)
{
	struct lease_reg *g = &k->lease;
	size_t sz = g->mask ? (g->mask + 1) * 2 : 64, i;
	struct lease **t, *l, *next;

	if (!g->wheel) {
		if (!(g->wheel = kvd_calloc(k, LEASE_SLOTS * sizeof *g->wheel)))
			return KVD_ENOMEM;
		if (!(g->bits = kvd_calloc(k, LEASE_SLOTS / 64 * sizeof *g->bits))) {
			kvd_free(k, g->wheel);
			g->wheel = NULL;
			return KVD_ENOMEM;
		}
		g->cursor = k->now / LEASE_TICK;
	}
	if (g->tab && g->n < g->mask + 1)
		return 0;
	if (!(t = kvd_calloc(k, sz * sizeof *t)))
		return KVD_ENOMEM;
	for (i = 0; g->tab && i <= g->mask; i++)
		for (l = g->tab[i]; l; l = next) {
			next = l->hnext;
			l->hnext = t[lease_hash(l->id) & (sz - 1)];
			t[lease_hash(l->id) & (sz - 1)] = l;
		}
	kvd_free(k, g->tab);
	g->tab = t;
	g->mask = sz - 1;
	return 0;
}

/* Into the table (and onto the wheel when its deadline is known). */
KVD_RESIDENT static void lease_link(struct kvd *k, struct lease *l, int on_wheel)
{
	struct lease **b = &k->lease.tab[lease_hash(l->id) & k->lease.mask];

	l->hnext = *b;
	*b = l;
	k->lease.n++;
	if (on_wheel)
		lease_wheel_add(k, l);
}

static void lease_unlink(struct kvd *k, struct lease *l)
{
	struct lease **b = &k->lease.tab[lease_hash(l->id) & k->lease.mask];

	while (*b != l)
		b = &(*b)->hnext;
	*b = l->hnext;
	k->lease.n--;
	lease_wheel_del(k, l);
}

static void lease_free(struct kvd *k, struct lease *l)
{
	kvd_free(k, l->keys);
	kvd_free(k, l);
}

KVD_RESIDENT static struct lease *lease_new(struct kvd *k, int64_t id, int64_t ttl)
{
	struct lease *l;

	if (lease_setup(k) || !(l = kvd_calloc(k, sizeof *l)))
		return NULL;
	l->id = id;
	l->ttl = ttl;
	return l;
}

/* A server-chosen id: etcd's generator (16 bits of the member id, 40 bits
 * of wall-clock ms at start, a counter), positive, not in use. */
static int64_t lease_next_id(struct kvd *k)
{
	struct lease_reg *g = &k->lease;
	const uint64_t low = (1ull << 48) - 1;
	int64_t id;

	if (!g->idgen)
		g->idgen = (k->member_id & 0xffff) << 48 | ((uint64_t)time(NULL) * 1000 & ((1ull << 40) - 1)) << 8;
	do {
		g->idgen = (g->idgen & ~low) | ((g->idgen + 1) & low);
		id = (int64_t)(g->idgen & INT64_MAX);
	} while (!id || lease_find(k, id));
	return id;
}

/* ---- grant, renew, revoke -------------------------------------------------- */

/* Grant lease id (not in use) with ttl seconds, in txn t. */
static int lease_grant(struct kvd *k, struct mvcc_txn *t, int64_t id, int64_t ttl)
{
	struct lease *l = lease_new(k, id, ttl);

	if (!l)
		return KVD_ENOMEM;
	if (mvcc_emit_lease(k, t, MVCC_OP_GRANT, id, ttl) || mvcc_undo_lease(k, &k->db, l, MVCC_UNDO_GRANTED)) {
		lease_free(k, l);
		return KVD_ENOMEM;
	}
	l->deadline = k->now + ttl * 1000 - (KVD_TEST_BUG == 6) * 1000; /* planted bug 6: 1 s early */
	lease_link(k, l, 1);
	return 0;
}

static void lease_renew(struct kvd *k, struct lease *l)
{
	lease_wheel_del(k, l);
	l->deadline = k->now + l->ttl * 1000 - (KVD_TEST_BUG == 6) * 1000;
	lease_wheel_add(k, l);
}

static int lease_key_cmp(const void *a, const void *b)
{
	const struct mvcc_key *x = *(const struct mvcc_key *const *)a, *y = *(const struct mvcc_key *const *)b;

	return mvcc_cmp(x->key, x->klen, y->key, y->klen);
}

/* Revoke l in txn t: its keys are deleted in key order (one revision, as
 * etcd), then the lease goes.  On error the caller aborts the txn. */
static int lease_revoke(struct kvd *k, struct mvcc_txn *t, struct lease *l)
{
	struct mvcc_key **v = NULL;
	uint32_t n = 0, i;
	int r = 0;

	if (l->nkeys) {
		if (!(v = kvd_malloc(k, (size_t)l->nkeys * sizeof *v)))
			return KVD_ENOMEM;
		for (i = 0; i <= l->kmask; i++)
			if (l->keys[i])
				v[n++] = l->keys[i];
		qsort(v, n, sizeof *v, lease_key_cmp);
		for (i = 0; i < n && !r; i++)
			r = mvcc_del(k, t, v[i]); /* detaches it from l */
		kvd_free(k, v);
	}
	if (r || (r = mvcc_emit_lease(k, t, MVCC_OP_REVOKE, l->id, 0)) ||
	    (r = mvcc_undo_lease(k, &k->db, l, MVCC_UNDO_REVOKED)))
		return r;
	lease_unlink(k, l); /* freed once the batch is durable */
	return 0;
}

/* A failed flush takes a grant or a revoke back. */
static void lease_undo(struct kvd *k, struct lease *l, unsigned kind)
{
	if (kind == MVCC_UNDO_GRANTED) {
		lease_unlink(k, l);
		lease_free(k, l);
		return;
	}
	l->deadline = KVD_MAX(l->deadline, k->now + LEASE_RETRY_MS); /* an expiry: try again later */
	lease_link(k, l, 1);
}

/* Expire l: revoke it in a txn of its own. */
static void lease_expire(struct kvd *k, struct lease *l)
{
	struct mvcc_txn t;
	int r = mvcc_txn_begin(k, &t);

	if (!r) {
		if ((r = lease_revoke(k, &t, l)))
			mvcc_txn_abort(k, &t);
		mvcc_txn_end(k, &t);
	}
	if (!r)
		return;
	if (!k->lease.warned++)
		kvd_log(k, KVD_LOG_WARN, "lease %016llx expired but cannot be revoked now (%s): retrying every %d ms",
		        (unsigned long long)l->id, k->db.broken ? k->db.why : "out of memory", LEASE_RETRY_MS);
	lease_wheel_del(k, l);
	l->deadline = k->now + LEASE_RETRY_MS;
	lease_wheel_add(k, l);
}

/* Due ticks: expire what is due (bounded), then arm the next slot. */
static void lease_timers(struct kvd *k)
{
	struct lease_reg *g = &k->lease;
	int64_t now_t = k->now / LEASE_TICK, t;
	struct lease *l, *next;
	unsigned done = 0;

	if (!g->wheel)
		return;
	if (!g->n) {
		g->cursor = now_t + 1;
		return;
	}
	while (g->cursor <= now_t) {
		t = lease_next_tick(g, g->cursor, now_t);
		if (t > now_t) {
			g->cursor = now_t + 1;
			break;
		}
		for (l = g->wheel[t & (LEASE_SLOTS - 1)]; l; l = next) {
			next = l->wnext;
			if (l->deadline > k->now)
				continue; /* a later turn of the wheel */
			if (done++ == KVD_LEASE_EXPIRE_MAX) {
				g->cursor = t;
				util_wake_by(k, k->now); /* the rest next iteration */
				return;
			}
			lease_expire(k, l);
		}
		g->cursor = t + 1;
	}
	t = lease_next_tick(g, g->cursor, g->cursor + LEASE_SLOTS - 1);
	if (t < g->cursor + LEASE_SLOTS)
		util_wake_by(k, t * LEASE_TICK);
}

/* ---- recovery and shutdown -------------------------------------------------- */

/* A lease op read back from the log (keys come back through lease_rebind).
 * Returns 0, KVD_ECORRUPT (a grant of a lease that exists, a revoke of one
 * that does not or still has keys) or KVD_ENOMEM. */
KVD_RESIDENT static int lease_replay(struct kvd *k, int kind, int64_t id, int64_t ttl)
{
	struct lease *l = lease_find(k, id);

	if (kind == MVCC_OP_GRANT) {
		if (l)
			return KVD_ECORRUPT;
		if (!(l = lease_new(k, id, ttl)))
			return KVD_ENOMEM;
		lease_link(k, l, 0);
		return 0;
	}
	if (!l || l->nkeys)
		return KVD_ECORRUPT;
	lease_unlink(k, l);
	lease_free(k, l);
	return 0;
}

/* After replay: every lease gets its full TTL plus the election timeout. */
static void lease_promote(struct kvd *k)
{
	struct lease_reg *g = &k->lease;
	struct lease *l;
	size_t i;

	if (!g->tab)
		return;
	g->cursor = k->now / LEASE_TICK;
	for (i = 0; i <= g->mask; i++)
		for (l = g->tab[i]; l; l = l->hnext) {
			l->deadline = k->now + l->ttl * 1000 + k->cfg.election_timeout_ms;
			lease_wheel_add(k, l);
		}
}

static void lease_fini(struct kvd *k)
{
	struct lease_reg *g = &k->lease;
	struct lease *l, *next;
	size_t i;

	for (i = 0; g->tab && i <= g->mask; i++)
		for (l = g->tab[i]; l; l = next) {
			next = l->hnext;
			lease_free(k, l);
		}
	kvd_free(k, g->tab);
	kvd_free(k, g->wheel);
	kvd_free(k, g->bits);
	memset(g, 0, sizeof *g);
}

/* ===== 12. Auth store: users, roles, permissions, bcrypt (auth_) ========= */

/*
 * etcd 3.7's authentication, for a store one box serves.  State: a flag
 * (enabled), the auth revision (bumped by every change that can take a
 * right away), users (authpb.User: name, bcrypt hash, sorted roles,
 * no_password) and roles (authpb.Role: name, key permissions sorted by key).
 * RAM holds them unpacked, each table sorted by name as bbolt's buckets are.
 *
 * Durability.  A change is one AUTH record in the log's batch, so it rides
 * the group commit with the writes around it and its reply waits for the
 * flush like theirs:
 *   AUTH (6) = u8 flags (1 enabled, 2 whole state) | u64 auth revision
 *              | u32 nops | (u8 kind | u32 len | bytes[len])[nops]
 *   kind 1 user, 3 role: the packed authpb message, exactly what etcd keeps
 *   in its authUsers/authRoles buckets (so a snapshot carries them as they
 *   are); kind 2, 4: the name of a user or role that goes.
 * A record states the flag and revision after it; "whole state" first
 * forgets every user and role (a rewrite ends with one such record, and an
 * import starts with one).  Replay and a live change apply ops through the
 * same auth_apply; live changes keep the replaced messages on an undo list
 * until the flush, which a failed flush uses to put them back.
 *
 * Passwords are bcrypt ($2a$, Go's), so hashes move between etcd and kvd in
 * snapshots.  bcrypt is built here on Blowfish, whose initial state is the
 * fractional part of pi in hexadecimal (auth_pi: 1042 words, checked by
 * the tests against Python's bcrypt).  A hash costs 2^cost key schedules --
 * about 50 ms at cost 10 on a PC, 20 times that on a router -- so it never
 * runs inside one handler: Authenticate, UserAdd and UserChangePassword
 * queue a job, and the loop hashes, one job at a time in their fair turns,
 * for at most KVD_AUTH_SLICE_US per iteration between everything else
 * (auth_step, section 19).  Other clients therefore wait at most one slice
 * for a hash, whatever the cost, and a flood of wrong passwords is bounded
 * by KVD_AUTH_MAX_JOBS queued hashes (then "too many requests").  The
 * queue is shared fairly (section 3's rule): hashes are made round-robin
 * by source address, then by connection within one, so an honest login
 * waits behind at most one hash per other client, not behind a whole
 * flood; and when the queue is full, the address holding the most jobs
 * (or, within the newcomer's own address, the connection) gives up its
 * newest to a newcomer holding at least two fewer.  Who may ask for a hash
 * is checked before it is queued: only Authenticate of an existing user
 * with a password, or an admin's change.
 *
 * Tokens are etcd's simple tokens: 16 random letters, ".", the store's
 * revision; a token lives --auth-token-ttl seconds after its last use.
 * Letters come from /dev/urandom (getrandom's pool), 52 per character by
 * rejection, so about 91 bits per token.  Tokens are RAM only, as etcd's:
 * a restart ends them.  Deleting a user or changing its password ends that
 * user's tokens; disabling auth ends every token.  With auth on, a token
 * nobody knows is an error ("invalid auth token"); with it off, etcd 3.7
 * looks at no token (3.4 refused a dead one either way).  With
 * --client-cert-auth, a call without a token is its client certificate's
 * CN.  With --auth-token jwt,... tokens are etcd's signed JWTs instead
 * (section 19): nothing is kept, the signature and expiry are checked.
 *
 * Checks follow etcd 3.7's (server/auth/store.go, etcdserver/apply/auth.go,
 * v3rpc): admin calls need the root role; a key op needs a permission of
 * its type whose intervals, merged, cover the request (a point needs an
 * interval that holds it); root may do anything.  Errors and their order
 * are etcd's.  3.7 closed the holes 3.4 had, and kvd with it: a txn's ops
 * are checked at every depth as top-level ones (a put's lease keys and
 * prev_kv too), LeaseTimeToLive with keys needs read on every attached
 * key, a watch from a key (range_end "\0") needs read on the whole
 * interval; Compact, MoveLeader, Downgrade and changing alarms need root,
 * Status, MemberList, listing alarms and every lease RPC a user.
 *
 * Invariants:
 *   1. The users and the roles tables are each sorted by name, no name
 *      twice, as bbolt's buckets are (auth_find; auth_tab_set inserts and
 *      removes in place).
 *   2. RAM is what the log replays to: a live change is an AUTH record in
 *      the batch, applied by auth_apply (auth_rec_op) -- the function replay
 *      applies it with (auth_replay) -- and sealed with the flag and
 *      revision after it (auth_rec_end).
 *   3. Until the batch is durable a replaced message waits on the undo
 *      list: auth_commit frees it, a failed flush puts it back
 *      (mvcc_rollback -> auth_rollback) with the flag and revision that
 *      auth_rec_begin saved.  auth_tab_set takes m even when it fails.
 *   4. No hash runs inside a handler: bcrypt advances a slice at a time
 *      (auth_bcrypt_step, from auth_step), KVD_AUTH_SLICE_US per loop
 *      iteration, KVD_AUTH_MAX_JOBS jobs queued at most.
 *   5. Secrets neither linger nor leak through timing: a job's key
 *      schedule and an HMAC key are wiped when they go (util_wipe), and
 *      hashes and MACs are compared with auth_ct_diff.
 *
 * Left out (KVD_NO_AUTH, make AUTH=0): no users, roles, tokens or bcrypt;
 * every call is served as with auth off (section 19's checks pass), the
 * Auth service is unknown (section 28) and so are the gateway's auth paths.
 * A log or snapshot that holds auth state -- any AUTH record: users, roles,
 * auth enabled once -- is refused at replay (auth_replay), never served
 * without the rights it states nor rewritten without them.
 */

#ifndef KVD_NO_AUTH /* @@ KVD_NO_AUTH: no auth (make AUTH=0): the Auth service is unknown, a store or snapshot holding auth state is refused */
#define AUTH_ROOT "root"
#define AUTH_BUCKETS 1024          /* token hash table */
#ifndef KVD_AUTH_MAX_TOKENS        /* @@ live simple tokens */
#define KVD_AUTH_MAX_TOKENS 65536
#endif
#ifndef KVD_AUTH_MAX_JOBS          /* @@ password hashes queued */
#define KVD_AUTH_MAX_JOBS 32
#endif
#ifndef KVD_AUTH_SLICE_US          /* @@ hashing per loop iteration */
#define KVD_AUTH_SLICE_US 2000
#endif

/* ---- bcrypt ---------------------------------------------------------------- */

/* The hexadecimal digits of pi after the point, 32 bits at a time: Blowfish's
 * P-array (18 words) then its four S-boxes (256 words each). */
static const uint32_t auth_pi[1042] = {
	0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
	0x082efa98, 0xec4e6c89, 0x452821e6, 0x38d01377, 0xbe5466cf, 0x34e90c6c,
	0xc0ac29b7, 0xc97c50dd, 0x3f84d5b5, 0xb5470917, 0x9216d5d9, 0x8979fb1b,
	0xd1310ba6, 0x98dfb5ac, 0x2ffd72db, 0xd01adfb7, 0xb8e1afed, 0x6a267e96,
	0xba7c9045, 0xf12c7f99, 0x24a19947, 0xb3916cf7, 0x0801f2e2, 0x858efc16,
	0x636920d8, 0x71574e69, 0xa458fea3, 0xf4933d7e, 0x0d95748f, 0x728eb658,
	0x718bcd58, 0x82154aee, 0x7b54a41d, 0xc25a59b5, 0x9c30d539, 0x2af26013,
	0xc5d1b023, 0x286085f0, 0xca417918, 0xb8db38ef, 0x8e79dcb0, 0x603a180e,
	0x6c9e0e8b, 0xb01e8a3e, 0xd71577c1, 0xbd314b27, 0x78af2fda, 0x55605c60,
	0xe65525f3, 0xaa55ab94, 0x57489862, 0x63e81440, 0x55ca396a, 0x2aab10b6,
	0xb4cc5c34, 0x1141e8ce, 0xa15486af, 0x7c72e993, 0xb3ee1411, 0x636fbc2a,
	0x2ba9c55d, 0x741831f6, 0xce5c3e16, 0x9b87931e, 0xafd6ba33, 0x6c24cf5c,
	0x7a325381, 0x28958677, 0x3b8f4898, 0x6b4bb9af, 0xc4bfe81b, 0x66282193,
	0x61d809cc, 0xfb21a991, 0x487cac60, 0x5dec8032, 0xef845d5d, 0xe98575b1,
	0xdc262302, 0xeb651b88, 0x23893e81, 0xd396acc5, 0x0f6d6ff3, 0x83f44239,
	0x2e0b4482, 0xa4842004, 0x69c8f04a, 0x9e1f9b5e, 0x21c66842, 0xf6e96c9a,
	0x670c9c61, 0xabd388f0, 0x6a51a0d2, 0xd8542f68, 0x960fa728, 0xab5133a3,
	0x6eef0b6c, 0x137a3be4, 0xba3bf050, 0x7efb2a98, 0xa1f1651d, 0x39af0176,
	0x66ca593e, 0x82430e88, 0x8cee8619, 0x456f9fb4, 0x7d84a5c3, 0x3b8b5ebe,
	0xe06f75d8, 0x85c12073, 0x401a449f, 0x56c16aa6, 0x4ed3aa62, 0x363f7706,
	0x1bfedf72, 0x429b023d, 0x37d0d724, 0xd00a1248, 0xdb0fead3, 0x49f1c09b,
	0x075372c9, 0x80991b7b, 0x25d479d8, 0xf6e8def7, 0xe3fe501a, 0xb6794c3b,
	0x976ce0bd, 0x04c006ba, 0xc1a94fb6, 0x409f60c4, 0x5e5c9ec2, 0x196a2463,
	0x68fb6faf, 0x3e6c53b5, 0x1339b2eb, 0x3b52ec6f, 0x6dfc511f, 0x9b30952c,
	0xcc814544, 0xaf5ebd09, 0xbee3d004, 0xde334afd, 0x660f2807, 0x192e4bb3,
	0xc0cba857, 0x45c8740f, 0xd20b5f39, 0xb9d3fbdb, 0x5579c0bd, 0x1a60320a,
	0xd6a100c6, 0x402c7279, 0x679f25fe, 0xfb1fa3cc, 0x8ea5e9f8, 0xdb3222f8,
	0x3c7516df, 0xfd616b15, 0x2f501ec8, 0xad0552ab, 0x323db5fa, 0xfd238760,
	0x53317b48, 0x3e00df82, 0x9e5c57bb, 0xca6f8ca0, 0x1a87562e, 0xdf1769db,
	0xd542a8f6, 0x287effc3, 0xac6732c6, 0x8c4f5573, 0x695b27b0, 0xbbca58c8,
	0xe1ffa35d, 0xb8f011a0, 0x10fa3d98, 0xfd2183b8, 0x4afcb56c, 0x2dd1d35b,
	0x9a53e479, 0xb6f84565, 0xd28e49bc, 0x4bfb9790, 0xe1ddf2da, 0xa4cb7e33,
	0x62fb1341, 0xcee4c6e8, 0xef20cada, 0x36774c01, 0xd07e9efe, 0x2bf11fb4,
	0x95dbda4d, 0xae909198, 0xeaad8e71, 0x6b93d5a0, 0xd08ed1d0, 0xafc725e0,
	0x8e3c5b2f, 0x8e7594b7, 0x8ff6e2fb, 0xf2122b64, 0x8888b812, 0x900df01c,
	0x4fad5ea0, 0x688fc31c, 0xd1cff191, 0xb3a8c1ad, 0x2f2f2218, 0xbe0e1777,
	0xea752dfe, 0x8b021fa1, 0xe5a0cc0f, 0xb56f74e8, 0x18acf3d6, 0xce89e299,
	0xb4a84fe0, 0xfd13e0b7, 0x7cc43b81, 0xd2ada8d9, 0x165fa266, 0x80957705,
	0x93cc7314, 0x211a1477, 0xe6ad2065, 0x77b5fa86, 0xc75442f5, 0xfb9d35cf,
	0xebcdaf0c, 0x7b3e89a0, 0xd6411bd3, 0xae1e7e49, 0x00250e2d, 0x2071b35e,
	0x226800bb, 0x57b8e0af, 0x2464369b, 0xf009b91e, 0x5563911d, 0x59dfa6aa,
	0x78c14389, 0xd95a537f, 0x207d5ba2, 0x02e5b9c5, 0x83260376, 0x6295cfa9,
	0x11c81968, 0x4e734a41, 0xb3472dca, 0x7b14a94a, 0x1b510052, 0x9a532915,
	0xd60f573f, 0xbc9bc6e4, 0x2b60a476, 0x81e67400, 0x08ba6fb5, 0x571be91f,
	0xf296ec6b, 0x2a0dd915, 0xb6636521, 0xe7b9f9b6, 0xff34052e, 0xc5855664,
	0x53b02d5d, 0xa99f8fa1, 0x08ba4799, 0x6e85076a, 0x4b7a70e9, 0xb5b32944,
	0xdb75092e, 0xc4192623, 0xad6ea6b0, 0x49a7df7d, 0x9cee60b8, 0x8fedb266,
	0xecaa8c71, 0x699a17ff, 0x5664526c, 0xc2b19ee1, 0x193602a5, 0x75094c29,
	0xa0591340, 0xe4183a3e, 0x3f54989a, 0x5b429d65, 0x6b8fe4d6, 0x99f73fd6,
	0xa1d29c07, 0xefe830f5, 0x4d2d38e6, 0xf0255dc1, 0x4cdd2086, 0x8470eb26,
	0x6382e9c6, 0x021ecc5e, 0x09686b3f, 0x3ebaefc9, 0x3c971814, 0x6b6a70a1,
	0x687f3584, 0x52a0e286, 0xb79c5305, 0xaa500737, 0x3e07841c, 0x7fdeae5c,
	0x8e7d44ec, 0x5716f2b8, 0xb03ada37, 0xf0500c0d, 0xf01c1f04, 0x0200b3ff,
	0xae0cf51a, 0x3cb574b2, 0x25837a58, 0xdc0921bd, 0xd19113f9, 0x7ca92ff6,
	0x94324773, 0x22f54701, 0x3ae5e581, 0x37c2dadc, 0xc8b57634, 0x9af3dda7,
	0xa9446146, 0x0fd0030e, 0xecc8c73e, 0xa4751e41, 0xe238cd99, 0x3bea0e2f,
	0x3280bba1, 0x183eb331, 0x4e548b38, 0x4f6db908, 0x6f420d03, 0xf60a04bf,
	0x2cb81290, 0x24977c79, 0x5679b072, 0xbcaf89af, 0xde9a771f, 0xd9930810,
	0xb38bae12, 0xdccf3f2e, 0x5512721f, 0x2e6b7124, 0x501adde6, 0x9f84cd87,
	0x7a584718, 0x7408da17, 0xbc9f9abc, 0xe94b7d8c, 0xec7aec3a, 0xdb851dfa,
	0x63094366, 0xc464c3d2, 0xef1c1847, 0x3215d908, 0xdd433b37, 0x24c2ba16,
	0x12a14d43, 0x2a65c451, 0x50940002, 0x133ae4dd, 0x71dff89e, 0x10314e55,
	0x81ac77d6, 0x5f11199b, 0x043556f1, 0xd7a3c76b, 0x3c11183b, 0x5924a509,
	0xf28fe6ed, 0x97f1fbfa, 0x9ebabf2c, 0x1e153c6e, 0x86e34570, 0xeae96fb1,
	0x860e5e0a, 0x5a3e2ab3, 0x771fe71c, 0x4e3d06fa, 0x2965dcb9, 0x99e71d0f,
	0x803e89d6, 0x5266c825, 0x2e4cc978, 0x9c10b36a, 0xc6150eba, 0x94e2ea78,
	0xa5fc3c53, 0x1e0a2df4, 0xf2f74ea7, 0x361d2b3d, 0x1939260f, 0x19c27960,
	0x5223a708, 0xf71312b6, 0xebadfe6e, 0xeac31f66, 0xe3bc4595, 0xa67bc883,
	0xb17f37d1, 0x018cff28, 0xc332ddef, 0xbe6c5aa5, 0x65582185, 0x68ab9802,
	0xeecea50f, 0xdb2f953b, 0x2aef7dad, 0x5b6e2f84, 0x1521b628, 0x29076170,
	0xecdd4775, 0x619f1510, 0x13cca830, 0xeb61bd96, 0x0334fe1e, 0xaa0363cf,
	0xb5735c90, 0x4c70a239, 0xd59e9e0b, 0xcbaade14, 0xeecc86bc, 0x60622ca7,
	0x9cab5cab, 0xb2f3846e, 0x648b1eaf, 0x19bdf0ca, 0xa02369b9, 0x655abb50,
	0x40685a32, 0x3c2ab4b3, 0x319ee9d5, 0xc021b8f7, 0x9b540b19, 0x875fa099,
	0x95f7997e, 0x623d7da8, 0xf837889a, 0x97e32d77, 0x11ed935f, 0x16681281,
	0x0e358829, 0xc7e61fd6, 0x96dedfa1, 0x7858ba99, 0x57f584a5, 0x1b227263,
	0x9b83c3ff, 0x1ac24696, 0xcdb30aeb, 0x532e3054, 0x8fd948e4, 0x6dbc3128,
	0x58ebf2ef, 0x34c6ffea, 0xfe28ed61, 0xee7c3c73, 0x5d4a14d9, 0xe864b7e3,
	0x42105d14, 0x203e13e0, 0x45eee2b6, 0xa3aaabea, 0xdb6c4f15, 0xfacb4fd0,
	0xc742f442, 0xef6abbb5, 0x654f3b1d, 0x41cd2105, 0xd81e799e, 0x86854dc7,
	0xe44b476a, 0x3d816250, 0xcf62a1f2, 0x5b8d2646, 0xfc8883a0, 0xc1c7b6a3,
	0x7f1524c3, 0x69cb7492, 0x47848a0b, 0x5692b285, 0x095bbf00, 0xad19489d,
	0x1462b174, 0x23820e00, 0x58428d2a, 0x0c55f5ea, 0x1dadf43e, 0x233f7061,
	0x3372f092, 0x8d937e41, 0xd65fecf1, 0x6c223bdb, 0x7cde3759, 0xcbee7460,
	0x4085f2a7, 0xce77326e, 0xa6078084, 0x19f8509e, 0xe8efd855, 0x61d99735,
	0xa969a7aa, 0xc50c06c2, 0x5a04abfc, 0x800bcadc, 0x9e447a2e, 0xc3453484,
	0xfdd56705, 0x0e1e9ec9, 0xdb73dbd3, 0x105588cd, 0x675fda79, 0xe3674340,
	0xc5c43465, 0x713e38d8, 0x3d28f89e, 0xf16dff20, 0x153e21e7, 0x8fb03d4a,
	0xe6e39f2b, 0xdb83adf7, 0xe93d5a68, 0x948140f7, 0xf64c261c, 0x94692934,
	0x411520f7, 0x7602d4f7, 0xbcf46b2e, 0xd4a20068, 0xd4082471, 0x3320f46a,
	0x43b7d4b7, 0x500061af, 0x1e39f62e, 0x97244546, 0x14214f74, 0xbf8b8840,
	0x4d95fc1d, 0x96b591af, 0x70f4ddd3, 0x66a02f45, 0xbfbc09ec, 0x03bd9785,
	0x7fac6dd0, 0x31cb8504, 0x96eb27b3, 0x55fd3941, 0xda2547e6, 0xabca0a9a,
	0x28507825, 0x530429f4, 0x0a2c86da, 0xe9b66dfb, 0x68dc1462, 0xd7486900,
	0x680ec0a4, 0x27a18dee, 0x4f3ffea2, 0xe887ad8c, 0xb58ce006, 0x7af4d6b6,
	0xaace1e7c, 0xd3375fec, 0xce78a399, 0x406b2a42, 0x20fe9e35, 0xd9f385b9,
	0xee39d7ab, 0x3b124e8b, 0x1dc9faf7, 0x4b6d1856, 0x26a36631, 0xeae397b2,
	0x3a6efa74, 0xdd5b4332, 0x6841e7f7, 0xca7820fb, 0xfb0af54e, 0xd8feb397,
	0x454056ac, 0xba489527, 0x55533a3a, 0x20838d87, 0xfe6ba9b7, 0xd096954b,
	0x55a867bc, 0xa1159a58, 0xcca92963, 0x99e1db33, 0xa62a4a56, 0x3f3125f9,
	0x5ef47e1c, 0x9029317c, 0xfdf8e802, 0x04272f70, 0x80bb155c, 0x05282ce3,
	0x95c11548, 0xe4c66d22, 0x48c1133f, 0xc70f86dc, 0x07f9c9ee, 0x41041f0f,
	0x404779a4, 0x5d886e17, 0x325f51eb, 0xd59bc0d1, 0xf2bcc18f, 0x41113564,
	0x257b7834, 0x602a9c60, 0xdff8e8a3, 0x1f636c1b, 0x0e12b4c2, 0x02e1329e,
	0xaf664fd1, 0xcad18115, 0x6b2395e0, 0x333e92e1, 0x3b240b62, 0xeebeb922,
	0x85b2a20e, 0xe6ba0d99, 0xde720c8c, 0x2da2f728, 0xd0127845, 0x95b794fd,
	0x647d0862, 0xe7ccf5f0, 0x5449a36f, 0x877d48fa, 0xc39dfd27, 0xf33e8d1e,
	0x0a476341, 0x992eff74, 0x3a6f6eab, 0xf4f8fd37, 0xa812dc60, 0xa1ebddf8,
	0x991be14c, 0xdb6e6b0d, 0xc67b5510, 0x6d672c37, 0x2765d43b, 0xdcd0e804,
	0xf1290dc7, 0xcc00ffa3, 0xb5390f92, 0x690fed0b, 0x667b9ffb, 0xcedb7d9c,
	0xa091cf0b, 0xd9155ea3, 0xbb132f88, 0x515bad24, 0x7b9479bf, 0x763bd6eb,
	0x37392eb3, 0xcc115979, 0x8026e297, 0xf42e312d, 0x6842ada7, 0xc66a2b3b,
	0x12754ccc, 0x782ef11c, 0x6a124237, 0xb79251e7, 0x06a1bbe6, 0x4bfb6350,
	0x1a6b1018, 0x11caedfa, 0x3d25bdd8, 0xe2e1c3c9, 0x44421659, 0x0a121386,
	0xd90cec6e, 0xd5abea2a, 0x64af674e, 0xda86a85f, 0xbebfe988, 0x64e4c3fe,
	0x9dbc8057, 0xf0f7c086, 0x60787bf8, 0x6003604d, 0xd1fd8346, 0xf6381fb0,
	0x7745ae04, 0xd736fccc, 0x83426b33, 0xf01eab71, 0xb0804187, 0x3c005e5f,
	0x77a057be, 0xbde8ae24, 0x55464299, 0xbf582e61, 0x4e58f48f, 0xf2ddfda2,
	0xf474ef38, 0x8789bdc2, 0x5366f9c3, 0xc8b38e74, 0xb475f255, 0x46fcd9b9,
	0x7aeb2661, 0x8b1ddf84, 0x846a0e79, 0x915f95e2, 0x466e598e, 0x20b45770,
	0x8cd55591, 0xc902de4c, 0xb90bace1, 0xbb8205d0, 0x11a86248, 0x7574a99e,
	0xb77f19b6, 0xe0a9dc09, 0x662d09a1, 0xc4324633, 0xe85a1f02, 0x09f0be8c,
	0x4a99a025, 0x1d6efe10, 0x1ab93d1d, 0x0ba5a4df, 0xa186f20f, 0x2868f169,
	0xdcb7da83, 0x573906fe, 0xa1e2ce9b, 0x4fcd7f52, 0x50115e01, 0xa70683fa,
	0xa002b5c4, 0x0de6d027, 0x9af88c27, 0x773f8641, 0xc3604c06, 0x61a806b5,
	0xf0177a28, 0xc0f586e0, 0x006058aa, 0x30dc7d62, 0x11e69ed7, 0x2338ea63,
	0x53c2dd94, 0xc2c21634, 0xbbcbee56, 0x90bcb6de, 0xebfc7da1, 0xce591d76,
	0x6f05e409, 0x4b7c0188, 0x39720a3d, 0x7c927c24, 0x86e3725f, 0x724d9db9,
	0x1ac15bb4, 0xd39eb8fc, 0xed545578, 0x08fca5b5, 0xd83d7cd3, 0x4dad0fc4,
	0x1e50ef5e, 0xb161e6f8, 0xa28514d9, 0x6c51133c, 0x6fd5c7e7, 0x56e14ec4,
	0x362abfce, 0xddc6c837, 0xd79a3234, 0x92638212, 0x670efa8e, 0x406000e0,
	0x3a39ce37, 0xd3faf5cf, 0xabc27737, 0x5ac52d1b, 0x5cb0679e, 0x4fa33742,
	0xd3822740, 0x99bc9bbe, 0xd5118e9d, 0xbf0f7315, 0xd62d1c7e, 0xc700c47b,
	0xb78c1b6b, 0x21a19045, 0xb26eb1be, 0x6a366eb4, 0x5748ab2f, 0xbc946e79,
	0xc6a376d2, 0x6549c2c8, 0x530ff8ee, 0x468dde7d, 0xd5730a1d, 0x4cd04dc6,
	0x2939bbdb, 0xa9ba4650, 0xac9526e8, 0xbe5ee304, 0xa1fad5f0, 0x6a2d519a,
	0x63ef8ce2, 0x9a86ee22, 0xc089c2b8, 0x43242ef6, 0xa51e03aa, 0x9cf2d0a4,
	0x83c061ba, 0x9be96a4d, 0x8fe51550, 0xba645bd6, 0x2826a2f9, 0xa73a3ae1,
	0x4ba99586, 0xef5562e9, 0xc72fefd3, 0xf752f7da, 0x3f046f69, 0x77fa0a59,
	0x80e4a915, 0x87b08601, 0x9b09e6ad, 0x3b3ee593, 0xe990fd5a, 0x9e34d797,
	0x2cf0b7d9, 0x022b8b51, 0x96d5ac3a, 0x017da67d, 0xd1cf3ed6, 0x7c7d2d28,
	0x1f9f25cf, 0xadf2b89b, 0x5ad6b472, 0x5a88f54c, 0xe029ac71, 0xe019a5e6,
	0x47b0acfd, 0xed93fa9b, 0xe8d3c48d, 0x283b57cc, 0xf8d56629, 0x79132e28,
	0x785f0191, 0xed756055, 0xf7960e44, 0xe3d35e8c, 0x15056dd4, 0x88f46dba,
	0x03a16125, 0x0564f0bd, 0xc3eb9e15, 0x3c9057a2, 0x97271aec, 0xa93a072a,
	0x1b3f6d9b, 0x1e6321f5, 0xf59c66fb, 0x26dcf319, 0x7533d928, 0xb155fdf5,
	0x03563482, 0x8aba3cbb, 0x28517711, 0xc20ad9f8, 0xabcc5167, 0xccad925f,
	0x4de81751, 0x3830dc8e, 0x379d5862, 0x9320f991, 0xea7a90c2, 0xfb3e7bce,
	0x5121ce64, 0x774fbe32, 0xa8b6e37e, 0xc3293d46, 0x48de5369, 0x6413e680,
	0xa2ae0810, 0xdd6db224, 0x69852dfd, 0x09072166, 0xb39a460a, 0x6445c0dd,
	0x586cdecf, 0x1c20c8ae, 0x5bbef7dd, 0x1b588d40, 0xccd2017f, 0x6bb4e3bb,
	0xdda26a7e, 0x3a59ff45, 0x3e350a44, 0xbcb4cdd5, 0x72eacea8, 0xfa6484bb,
	0x8d6612ae, 0xbf3c6f47, 0xd29be463, 0x542f5d9e, 0xaec2771b, 0xf64e6370,
	0x740e0d8d, 0xe75b1357, 0xf8721671, 0xaf537d5d, 0x4040cb08, 0x4eb4e2cc,
	0x34d2466a, 0x0115af84, 0xe1b00428, 0x95983a1d, 0x06b89fb4, 0xce6ea048,
	0x6f3f3b82, 0x3520ab82, 0x011a1d4b, 0x277227f8, 0x611560b1, 0xe7933fdc,
	0xbb3a792b, 0x344525bd, 0xa08839e1, 0x51ce794b, 0x2f32c9b7, 0xa01fbac9,
	0xe01cc87e, 0xbcc7d1f6, 0xcf0111c3, 0xa1e8aac7, 0x1a908749, 0xd44fbd9a,
	0xd0dadecb, 0xd50ada38, 0x0339c32a, 0xc6913667, 0x8df9317c, 0xe0b12b4f,
	0xf79e59b7, 0x43f5bb3a, 0xf2d519ff, 0x27d9459c, 0xbf97222c, 0x15e6fc2a,
	0x0f91fc71, 0x9b941525, 0xfae59361, 0xceb69ceb, 0xc2a86459, 0x12baa8d1,
	0xb6c1075e, 0xe3056a0c, 0x10d25065, 0xcb03a442, 0xe0ec6e0e, 0x1698db3b,
	0x4c98a0be, 0x3278e964, 0x9f1f9532, 0xe0d392df, 0xd3a0342b, 0x8971f21e,
	0x1b0a7441, 0x4ba3348c, 0xc5be7120, 0xc37632d8, 0xdf359f8d, 0x9b992f2e,
	0xe60b6f47, 0x0fe3f11d, 0xe54cda54, 0x1edad891, 0xce6279cf, 0xcd3e7e6f,
	0x1618b166, 0xfd2c1d05, 0x848fd2c5, 0xf6fb2299, 0xf523f357, 0xa6327623,
	0x93a83531, 0x56cccd02, 0xacf08162, 0x5a75ebb5, 0x6e163697, 0x88d273cc,
	0xde966292, 0x81b949d0, 0x4c50901b, 0x71c65614, 0xe6c6c7bd, 0x327a140a,
	0x45e1d006, 0xc3f27b9a, 0xc9aa53fd, 0x62a80f00, 0xbb25bfe2, 0x35bdd2f6,
	0x71126905, 0xb2040222, 0xb6cbcf7c, 0xcd769c2b, 0x53113ec0, 0x1640e3d3,
	0x38abbd60, 0x2547adf0, 0xba38209c, 0xf746ce76, 0x77afa1c5, 0x20756060,
	0x85cbfe4e, 0x8ae88dd8, 0x7aaaf9b0, 0x4cf9aa7e, 0x1948c25c, 0x02fb8a8c,
	0x01c36ae4, 0xd6ebe1f9, 0x90d4f869, 0xa65cdea0, 0x3f09252d, 0xc208e69f,
	0xb74e6132, 0xce77e25b, 0x578fdfe3, 0x3ac372e6,
};

struct auth_bf {
	uint32_t p[18];
	uint32_t s[4][256];
};

static uint32_t auth_bf_f(const struct auth_bf *b, uint32_t x)
{
	return ((b->s[0][x >> 24] + b->s[1][(x >> 16) & 0xff]) ^ b->s[2][(x >> 8) & 0xff]) + b->s[3][x & 0xff];
}

static void auth_bf_encrypt(const struct auth_bf *b, uint32_t *xl, uint32_t *xr)
{
	uint32_t l = *xl, r = *xr, t;
	int i;

	for (i = 0; i < 16; i++) {
		l ^= b->p[i];
		r ^= auth_bf_f(b, l);
		t = l;
		l = r;
		r = t;
	}
	*xl = r ^ b->p[17]; /* the last swap undone */
	*xr = l ^ b->p[16];
}

/* The next 4 bytes of d[0..n), cyclically, big-endian. */
static uint32_t auth_bf_word(const uint8_t *d, size_t n, size_t *j)
{
	uint32_t w = 0;
	int i;

	for (i = 0; i < 4; i++) {
		w = w << 8 | d[*j];
		*j = (*j + 1) % n;
	}
	return w;
}

/* Blowfish's key schedule; with a salt, bcrypt's: the salt's words are
 * mixed into each block before it is encrypted. */
static void auth_bf_expand(struct auth_bf *b, const uint8_t *key, size_t klen, const uint8_t *salt)
{
	uint32_t l = 0, r = 0, *w = &b->s[0][0];
	size_t i, j = 0, sj = 0;

	for (i = 0; i < 18; i++)
		b->p[i] ^= auth_bf_word(key, klen, &j);
	for (i = 0; i < 18 + 1024; i += 2) {
		if (salt) {
			l ^= auth_bf_word(salt, 16, &sj);
			r ^= auth_bf_word(salt, 16, &sj);
		}
		auth_bf_encrypt(b, &l, &r);
		if (i < 18) {
			b->p[i] = l;
			b->p[i + 1] = r;
		} else {
			w[i - 18] = l;
			w[i - 17] = r;
		}
	}
}

static const char auth_b64[] = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/* bcrypt's base64 (its own alphabet, no padding): n bytes -> out, NUL-ended. */
static void auth_b64_put(const uint8_t *p, size_t n, char *out)
{
	out[util_b64(auth_b64, 0, p, n, out)] = 0;
}

/* 22 characters -> the 16-byte salt.  0 or KVD_EINVAL. */
static int auth_b64_salt(const char *s, uint8_t out[16])
{
	uint8_t bits[24];
	size_t i;
	const char *c;

	for (i = 0; i < 22; i++) {
		if (!s[i] || !(c = strchr(auth_b64, s[i])))
			return KVD_EINVAL;
		bits[i] = (uint8_t)(c - auth_b64);
	}
	bits[22] = bits[23] = 0;
	for (i = 0; i < 16; i += 3) {
		size_t q = i / 3 * 4;
		uint32_t v = (uint32_t)bits[q] << 18 | (uint32_t)bits[q + 1] << 12 | (uint32_t)bits[q + 2] << 6 | bits[q + 3];
		out[i] = (uint8_t)(v >> 16);
		if (i + 1 < 16)
			out[i + 1] = (uint8_t)(v >> 8);
		if (i + 2 < 16)
			out[i + 2] = (uint8_t)v;
	}
	return 0;
}

/* One bcrypt computation, run a slice at a time. */
struct auth_bcrypt {
	struct auth_bf bf;
	uint8_t key[72], salt[16];
	size_t klen;
	uint32_t left;              /* expensive rounds still to run */
	unsigned cost;
};

static void auth_bcrypt_begin(struct auth_bcrypt *h, const uint8_t *pw, size_t n, const uint8_t salt[16], unsigned cost)
{
	memcpy(h->bf.p, auth_pi, sizeof h->bf.p);
	memcpy(h->bf.s, auth_pi + 18, sizeof h->bf.s);
	/* the password and its NUL, at most 72 bytes (all Blowfish can take) */
	h->klen = KVD_MIN(n + 1, sizeof h->key);
	memcpy(h->key, pw, KVD_MIN(n, sizeof h->key));
	if (n < sizeof h->key)
		h->key[n] = 0;
	memcpy(h->salt, salt, 16);
	h->cost = cost;
	h->left = (uint32_t)1 << cost;
	auth_bf_expand(&h->bf, h->key, h->klen, h->salt);
}

/* Run up to rounds expensive rounds; 1 when the hash is ready. */
static int auth_bcrypt_step(struct auth_bcrypt *h, uint32_t rounds)
{
	while (h->left && rounds--) {
		auth_bf_expand(&h->bf, h->key, h->klen, NULL);
		auth_bf_expand(&h->bf, h->salt, 16, NULL);
		h->left--;
	}
	return !h->left;
}

/* The finished hash, as Go writes it: "$2a$10$" salt(22) hash(31). */
static void auth_bcrypt_end(struct auth_bcrypt *h, char out[61])
{
	static const char magic[] = "OrpheanBeholderScryDoubt";
	uint32_t c[6];
	uint8_t b[24];
	int i, j;

	for (i = 0; i < 6; i++)
		c[i] = get_be32((const uint8_t *)magic + 4 * i);
	for (i = 0; i < 64; i++)
		for (j = 0; j < 6; j += 2)
			auth_bf_encrypt(&h->bf, &c[j], &c[j + 1]);
	for (i = 0; i < 6; i++)
		put_be32(b + 4 * i, c[i]);
	snprintf(out, 8, "$2a$%02u$", h->cost);
	auth_b64_put(h->salt, 16, out + 7);
	auth_b64_put(b, 23, out + 29);
}

/* A stored hash's cost and salt (for a check).  0 or KVD_EINVAL. */
static int auth_bcrypt_parse(const uint8_t *s, size_t n, unsigned *cost, uint8_t salt[16])
{
	char t[61];

	if (n != 60)
		return KVD_EINVAL;
	memcpy(t, s, 60);
	t[60] = 0;
	if (t[0] != '$' || t[1] != '2' || !strchr("aby", t[2]) || t[3] != '$' || t[4] < '0' || t[4] > '9' ||
	    t[5] < '0' || t[5] > '9' || t[6] != '$')
		return KVD_EINVAL;
	*cost = (unsigned)(t[4] - '0') * 10 + (unsigned)(t[5] - '0');
	if (*cost < 4 || *cost > 31)
		return KVD_EINVAL;
	return auth_b64_salt(t + 7, salt);
}

/* ---- users and roles ----------------------------------------------------- */

static int auth_cmp(const void *a, size_t an, const void *b, size_t bn)
{
	int c = an && bn ? memcmp(a, b, KVD_MIN(an, bn)) : 0; /* an empty one may be NULL */

	return c ? c : (an > bn) - (an < bn);
}

static ProtobufCBinaryData *auth_name(ProtobufCMessage *m)
{
	return m->descriptor == &authpb__user__descriptor ? &((Authpb__User *)m)->name : &((Authpb__Role *)m)->name;
}

/* Where name is (or would go) in t; *eq when it is there. */
KVD_RESIDENT static size_t auth_find(const struct auth_tab *t, const void *name, size_t n, int *eq)
{
	size_t lo = 0, hi = t->n, mid;
	int c;

	*eq = 0;
	while (lo < hi) {
		ProtobufCBinaryData *x;
		mid = lo + (hi - lo) / 2;
		x = auth_name(t->v[mid]);
		c = auth_cmp(x->data, x->len, name, n);
		if (!c) {
			*eq = 1;
			return mid;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static Authpb__User *auth_user_n(struct kvd *k, const char *name, size_t n)
{
	int eq;
	size_t i = auth_find(&k->auth.users, name, n, &eq);

	return eq ? (Authpb__User *)k->auth.users.v[i] : NULL;
}

static Authpb__User *auth_user(struct kvd *k, const char *name)
{
	return auth_user_n(k, name, strlen(name));
}

static Authpb__Role *auth_role_n(struct kvd *k, const void *name, size_t n)
{
	int eq;
	size_t i = auth_find(&k->auth.roles, name, n, &eq);

	return eq ? (Authpb__Role *)k->auth.roles.v[i] : NULL;
}

static Authpb__Role *auth_role(struct kvd *k, const char *name)
{
	return auth_role_n(k, name, strlen(name));
}

/* Has u the role named role[0..n)?  A stored role name holds no NUL
 * (section 5's invariant 5), so its strlen is its length. */
static int auth_has_role_n(const Authpb__User *u, const void *role, size_t n)
{
	size_t i;

	for (i = 0; u && i < u->n_roles; i++)
		if (strlen(u->roles[i]) == n && !memcmp(u->roles[i], role, n))
			return 1;
	return 0;
}

static int auth_has_role(const Authpb__User *u, const char *role)
{
	return auth_has_role_n(u, role, strlen(role));
}

/* Is a request's name (taken whole, pb_str) "root"? */
static int auth_is_root(struct kvd_slice nm)
{
	return nm.n == 4 && !memcmp(nm.p, AUTH_ROOT, 4);
}

/*
 * Put m (or, m NULL, remove) under name in the users (role 0) or roles
 * table.  With undo, the message replaced is kept until the batch is
 * durable (auth_commit) or put back (auth_rollback); without, it is freed.
 * m is taken even on failure.  0 or KVD_ENOMEM.
 */
KVD_RESIDENT static int auth_tab_set(struct kvd *k, int role, const void *name, size_t n, ProtobufCMessage *m, int undo)
{
	struct auth *a = &k->auth;
	struct auth_tab *t = role ? &a->roles : &a->users;
	ProtobufCMessage *old = NULL;
	size_t i;
	int eq;

	if (undo && UTIL_GROW(k, a->undo, a->undocap, a->nundo + 1, 16))
		goto oom;
	i = auth_find(t, name, n, &eq);
	if (!eq && m && UTIL_GROW(k, t->v, t->cap, t->n + 1, 16))
		goto oom;
	if (undo) {
		struct auth_undo *u = &a->undo[a->nundo];
		if (!(u->name = kvd_malloc(k, n + 1)))
			goto oom;
		memcpy(u->name, name, n);
		u->nlen = n;
		u->role = role;
		u->old = eq ? t->v[i] : NULL;
		a->nundo++;
	} else if (eq) {
		old = t->v[i];
	}
	if (eq && m) {
		t->v[i] = m;
	} else if (eq) {
		memmove(t->v + i, t->v + i + 1, (t->n - i - 1) * sizeof *t->v);
		t->n--;
	} else if (m) {
		memmove(t->v + i + 1, t->v + i, (t->n - i) * sizeof *t->v);
		t->v[i] = m;
		t->n++;
	}
	pb_free(k, old);
	return 0;
oom:
	pb_free(k, m);
	return KVD_ENOMEM;
}

/* Does a user or role message name anything with a NUL inside? */
static int auth_name_nul(ProtobufCMessage *m)
{
	const ProtobufCBinaryData *nm = auth_name(m);
	const Authpb__User *u = (const Authpb__User *)m;
	size_t i;

	if (memchr(nm->data, 0, nm->len))
		return 1;
	for (i = 0; m->descriptor == &authpb__user__descriptor && i < u->n_roles; i++)
		if (pb_str_nul(u->roles[i]))
			return 1;
	return 0;
}

/* One op of an AUTH record (bytes p[0..n)), live (undo) or in replay. */
KVD_RESIDENT static int auth_apply(struct kvd *k, unsigned kind, const uint8_t *p, size_t n, int undo, const char **why)
{
	ProtobufCMessage *m;
	ProtobufCBinaryData *nm;
	int oom = 0, role = kind == AUTH_OP_ROLE || kind == AUTH_OP_ROLE_DEL;

	if (kind == AUTH_OP_USER_DEL || kind == AUTH_OP_ROLE_DEL)
		return auth_tab_set(k, role, p, n, NULL, undo) ? (*why = "out of memory", KVD_ENOMEM) : 0;
	if (kind != AUTH_OP_USER && kind != AUTH_OP_ROLE) {
		*why = "bad auth op";
		return KVD_ECORRUPT;
	}
	m = pb_unpack(k, role ? &authpb__role__descriptor : &authpb__user__descriptor, p, n, &oom);
	if (!m) {
		*why = oom ? "out of memory" : "bad auth op";
		return oom ? KVD_ENOMEM : KVD_ECORRUPT;
	}
	nm = auth_name(m);
	if (!nm->len) {
		pb_free(k, m);
		*why = "auth op without a name";
		return KVD_ECORRUPT;
	}
	if (auth_name_nul(m)) { /* etcd takes such names; kvd keeps a user's roles as C strings */
		pb_free(k, m);
		*why = "a user or role name holding a NUL byte, which kvd does not support";
		return KVD_EINVAL;
	}
	return auth_tab_set(k, role, nm->data, nm->len, m, undo) ? (*why = "out of memory", KVD_ENOMEM) : 0;
}

static void auth_tab_clear(struct kvd *k, struct auth_tab *t)
{
	while (t->n)
		pb_free(k, t->v[--t->n]);
}

/* Replay an AUTH record (framed and decoded by section 9). */
static int auth_replay(struct kvd *k, const struct mvcc_rec *rec0, const char **why)
{
	struct mvcc_rec rec = *rec0;
	const uint8_t *p;
	unsigned kind;
	size_t n;
	int r;

	if (rec.flags & AUTH_F_WHOLE) {
		auth_tab_clear(k, &k->auth.users);
		auth_tab_clear(k, &k->auth.roles);
	}
	while ((r = mvcc_rec_auth_op(&rec, &kind, &p, &n, why)) == 1)
		if ((r = auth_apply(k, kind, p, n, 0, why)))
			return r;
	if (r)
		return r;
	k->auth.enabled = !!(rec.flags & AUTH_F_ENABLED);
	k->auth.rev = (uint64_t)rec.rev;
	return 0;
}

/* The batch is durable: what it replaced can go. */
static void auth_commit(struct kvd *k)
{
	struct auth *a = &k->auth;

	while (a->nundo) {
		a->nundo--;
		pb_free(k, a->undo[a->nundo].old);
		kvd_free(k, a->undo[a->nundo].name);
	}
	a->saved = 0;
}

/* Undo back to undo entry mark (a failed change, or mark 0: a failed flush). */
static void auth_undo_to(struct kvd *k, size_t mark)
{
	struct auth *a = &k->auth;
	const char *why;

	while (a->nundo > mark) {
		struct auth_undo *u = &a->undo[--a->nundo];
		ProtobufCMessage *old = u->old;
		struct auth_tab *t = u->role ? &a->roles : &a->users;
		size_t i;
		int eq;

		i = auth_find(t, u->name, u->nlen, &eq);
		if (eq && old) {
			pb_free(k, t->v[i]);
			t->v[i] = old;
		} else if (eq) {
			pb_free(k, t->v[i]);
			memmove(t->v + i, t->v + i + 1, (t->n - i - 1) * sizeof *t->v);
			t->n--;
		} else if (old && auth_tab_set(k, u->role, u->name, u->nlen, old, 0)) {
			why = "out of memory";
			kvd_log(k, KVD_LOG_ERROR, "undoing an auth change: %s", why);
		}
		kvd_free(k, u->name);
	}
}

static void auth_rollback(struct kvd *k)
{
	struct auth *a = &k->auth;

	auth_undo_to(k, 0);
	if (a->saved) {
		a->enabled = a->was_enabled;
		a->rev = a->was_rev;
		a->saved = 0;
	}
}

/* An AUTH record being built at the end of the batch. */
struct auth_rec {
	size_t at, undo_at;
	uint32_t nops;
};

static int auth_rec_begin(struct kvd *k, struct auth_rec *r)
{
	struct mvcc *m = &k->db;
	struct auth *a = &k->auth;

	if (mvcc_auth_open(k, &m->w, &r->at))
		return KVD_ENOMEM;
	if (!a->saved) { /* the first change of this batch: what a failed flush restores */
		a->was_enabled = a->enabled;
		a->was_rev = a->rev;
		a->saved = 1;
	}
	r->undo_at = a->nundo;
	r->nops = 0;
	return 0;
}

/* Append an op (a message, or a name for the DEL kinds) and apply it. */
static int auth_rec_op(struct kvd *k, struct auth_rec *r, unsigned kind, const ProtobufCMessage *msg,
                       const char *name)
{
	size_t n = msg ? 0 : strlen(name);
	const uint8_t *p = mvcc_auth_op(k, &k->db.w, kind, msg, name, &n);
	const char *why;

	if (!p || auth_apply(k, kind, p, n, 1, &why))
		return KVD_ENOMEM; /* auth_rec_end then takes the record back */
	r->nops++;
	return 0;
}

/* Seal the record (after a->rev and a->enabled say the new state), or,
 * failed, take it and what it applied back. */
static void auth_rec_end(struct kvd *k, struct auth_rec *r, int failed)
{
	struct mvcc *m = &k->db;

	if (failed) {
		auth_undo_to(k, r->undo_at);
		m->w.len = r->at;
		return;
	}
	mvcc_auth_seal(k->crc, &m->w, r->at, k->auth.enabled ? AUTH_F_ENABLED : 0, k->auth.rev, r->nops);
}

/* Is there anything to say (a rewrite states it once more)? */
static int auth_any(const struct kvd *k)
{
	return k->auth.enabled || k->auth.rev > 1 || k->auth.users.n || k->auth.roles.n;
}

/* The whole state as one AUTH record at the end of b (a rewrite's last). */
static int auth_encode_whole(struct kvd *k, struct kvd_buf *b)
{
	const struct auth *a = &k->auth;
	const struct auth_tab *t;
	size_t at, i, n;
	uint32_t nops = 0;
	int pass;

	if (mvcc_auth_open(k, b, &at))
		return KVD_ENOMEM;
	for (pass = 0; pass < 2; pass++)
		for (t = pass ? &a->roles : &a->users, i = 0; i < t->n; i++, nops++)
			if (!mvcc_auth_op(k, b, pass ? AUTH_OP_ROLE : AUTH_OP_USER, t->v[i], NULL, &n)) {
				b->len = at;
				return KVD_ENOMEM;
			}
	mvcc_auth_seal(k->crc, b, at, (a->enabled ? AUTH_F_ENABLED : 0) | AUTH_F_WHOLE, a->rev, nops);
	return 0;
}

/* Differs, in time that does not depend on where. */
static unsigned auth_ct_diff(const void *a, const void *b, size_t n)
{
	const uint8_t *x = a, *y = b;
	unsigned d = 0;

	while (n--)
		d |= (unsigned)(*x++ ^ *y++);
	return d;
}

#else /* KVD_NO_AUTH: the store's side -- nothing to hold, and a record that states auth refused */

static ProtobufCBinaryData *auth_name(ProtobufCMessage *m)
{
	return &((Authpb__Role *)m)->name; /* never called: no table has an entry */
}

static int auth_replay(struct kvd *k, const struct mvcc_rec *rec, const char **why)
{
	(void)k;
	(void)rec;
	*why = "an auth record (users, roles, or auth enabled once), and this kvd is built without auth (KVD_NO_AUTH)";
	return KVD_EINVAL;
}

static void auth_commit(struct kvd *k)
{
	(void)k;
}

static void auth_rollback(struct kvd *k)
{
	(void)k;
}

static int auth_any(const struct kvd *k)
{
	(void)k;
	return 0;
}

static int auth_encode_whole(struct kvd *k, struct kvd_buf *b)
{
	(void)k;
	(void)b;
	return 0;
}
#endif /* KVD_NO_AUTH */

/* ===== 13. Store lifecycle: rewrite, compaction, quota, alarms (life_) === */

/*
 * The log only grows: compaction frees RAM, never a byte of disk.  This
 * section keeps the disk bounded by what readers can still see, unattended,
 * without pausing clients.
 *
 * The rewrite (Defragment, or automatic) writes <data-dir>/kvd.log.new
 * holding only what a reader can still see, then renames it over kvd.log.
 * With C the compacted revision and B = max(C - 1, 1) -- never below the
 * BASE revision the log has already (an import's B is C) -- the new log is:
 *   HEADER | BASE B... | the old log's records from the first TXN after B
 *   on, COMPACTs where they were | ALARM (the alarms now) | AUTH (users
 *   and roles now, whole)
 * BASE holds the leases alive where the copy starts and, for every key,
 * the op it had at B (a put; a key deleted at B has none).  B is C - 1 rather than C so that a
 * watcher starting at the compacted revision still gets that revision's
 * events from its TXN record.  Copied TXN records keep their bytes except
 * each key op's prev, which is re-pointed to the key's previous op in the
 * new file (a map from old op offsets to new ones; it holds one entry per
 * key, as each op is the prev of at most one later op).  Ops keep their
 * sizes, so the superseded-bytes statistics stay true.  COMPACT records stay
 * where they were among the TXNs: replay then drops exactly the keys the
 * compaction dropped, and a key put again after that starts a new chain.
 *
 * Clients are not paused: the rewrite runs in slices, one per loop
 * iteration after the log flush, while reads, writes, watches and leases go
 * on.  Phases: (1) at the start, with the batch empty, it notes every key's
 * latest op, the leases and the log's end; (2) LEASES reads the history
 * copied later for its lease ops, to know which leases lived at B (a lease
 * whose first op there is a revoke lived; a grant did not; leases granted
 * in records before the copy are simply alive there); (3) BASE walks
 * each noted key's chain back to its op at B; (4) SCAN reads the log before
 * the history once, in order, and writes those ops into BASE records with
 * their sub-revisions, which only their whole records tell (reading is
 * cheap on flash, writing is not); (5) COPY chases the old log's end.  When
 * COPY has caught up -- right after a flush, so nothing is in flight -- the
 * switch happens in that same step: fdatasync the new file, rename it,
 * fsync the directory, re-point every key's latest op, hand over the new
 * revision marks (mvcc_log_moved) and close the old file.  Watchers find
 * their place again by revision; RangeStreams resume by key.
 *
 * Crash safety: until the rename, kvd.log is the old, complete log (every
 * acknowledged write is there) and kvd.log.new is removed at the next start
 * with one log line; after the rename it is the new one, complete and
 * durable.  A failed write (a full disk) abandons the rewrite: the partial
 * file goes, kvd serves from the old log.  The disk needs room for both
 * files during a rewrite: the old one is at most (1 + percent/100) x kept
 * bytes when the automatic trigger fires.
 *
 * Auto-compaction follows etcd 3.4's compactors (v3compactor): periodic
 * samples the revision every retention/10 (at most 6 minutes), first compacts
 * once the retention has passed, then every min(retention, 1h), to the
 * revision sampled a retention ago; revision mode compacts to current -
 * retention every 5 minutes (--auto-compaction-check-interval).  Neither
 * remembers anything across a restart: periodic starts sampling afresh, as
 * etcd does.
 *
 * Quota and alarms, as etcd: a Put, Txn with puts or LeaseGrant that would
 * take the log past --quota-backend-bytes raises NOSPACE and fails with
 * "database space exceeded"; while NOSPACE is active every such request
 * fails, and deletes, reads, compaction, lease revocation, rewrites and
 * disarming go on.  Alarms are kept in the log (ALARM records), so they
 * survive a restart until disarmed.  A real ENOSPC raises NOSPACE too, and
 * then the reserve -- a file of --reserve-bytes made at start, whose blocks
 * are given back to the filesystem -- leaves room for those freeing writes
 * and for rewriting a mostly-reclaimable log.  It is made again after a
 * rewrite and when NOSPACE is disarmed.
 *
 * Invariants:
 *   1. Until the rename kvd.log is the old, whole log; the new file is
 *      fdatasynced before the rename and the directory fsynced after it
 *      (life_rw_switch), and a kvd.log.new left behind is removed, by the
 *      rewrite that fails (life_rw_abandon) or at the next start
 *      (mvcc_open).
 *   2. A slice runs only with the batch empty, the log writable and no
 *      snapshot streaming (life_step: k->life.snapshots); the switch comes
 *      only once COPY has reached the log's end right after a flush
 *      (life_rw_step).
 *   3. Nothing after the rename may fail: what could -- the compaction's
 *      record found, every key's latest op copied, the last bytes written
 *      -- is checked before it (life_rw_switch).
 *   4. B never falls below the log's BASE revision (life_rw_start), so the
 *      new log passes replay's rule that a BASE has its compaction
 *      (mvcc_replay).
 *   5. A write that would take the log past --quota-backend-bytes raises
 *      NOSPACE and fails; while NOSPACE is active only what asks for no
 *      bytes (cost 0: deletes, revokes, compaction) passes, and while
 *      CORRUPT is, nothing that asks (life_admit); an ENOSPC raises NOSPACE
 *      and gives the reserve back (life_on_enospc).
 */

#define LIFE_SLICE (256 * 1024)       /* old log bytes a step reads */
#define LIFE_SYNC_EVERY (1 << 20)     /* new-file bytes between fdatasyncs */
#define LIFE_BASE_REC (64 * 1024)     /* payload of one BASE record */
#define LIFE_RETRY_MS 60000           /* after a failed automatic rewrite */
#define LIFE_DEFAULT_QUOTA (2ull << 30) /* --quota-backend-bytes 0, as etcd */
#define LIFE_UNSET UINT64_MAX           /* offs: a key's op at B, found, not yet written */
enum { LIFE_OFF, LIFE_PERIODIC, LIFE_REVISION };
enum { LIFE_START, LIFE_LEASES, LIFE_BASE, LIFE_SCAN, LIFE_COPY };

/* A u64 -> u64 map: linear probing, key 0 marks a free slot. */
struct life_map {
	uint64_t *v; /* key, value pairs */
	size_t mask, n;
};

static size_t life_hash(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	return (size_t)(x ^ (x >> 33));
}

/* Room for n entries at most 3/4 full (grown twice over when it must). */
static int life_map_reserve(struct kvd *k, struct life_map *h, size_t n)
{
	size_t i, j, cap = 256;
	uint64_t *nv;

	if (h->v && n * 4 <= (h->mask + 1) * 3)
		return 0;
	while (cap * 3 < n * 4)
		cap *= 2;
	if (h->v && cap < (h->mask + 1) * 2)
		cap = (h->mask + 1) * 2;
	{
		if (cap > SIZE_MAX / 16 || !(nv = kvd_calloc(k, cap * 2 * sizeof *nv)))
			return KVD_ENOMEM;
		for (j = 0; h->v && j <= h->mask; j++) {
			if (!h->v[2 * j])
				continue;
			for (i = life_hash(h->v[2 * j]) & (cap - 1); nv[2 * i]; i = (i + 1) & (cap - 1))
				;
			nv[2 * i] = h->v[2 * j];
			nv[2 * i + 1] = h->v[2 * j + 1];
		}
		kvd_free(k, h->v);
		h->v = nv;
		h->mask = cap - 1;
	}
	return 0;
}

static int life_map_put(struct kvd *k, struct life_map *h, uint64_t key, uint64_t val)
{
	size_t i;

	if (life_map_reserve(k, h, h->n + 1))
		return KVD_ENOMEM;
	for (i = life_hash(key) & h->mask; h->v[2 * i] && h->v[2 * i] != key; i = (i + 1) & h->mask)
		;
	h->n += !h->v[2 * i];
	h->v[2 * i] = key;
	h->v[2 * i + 1] = val;
	return 0;
}

static size_t life_map_slot(const struct life_map *h, uint64_t key)
{
	size_t i;

	if (!h->v)
		return SIZE_MAX;
	for (i = life_hash(key) & h->mask; h->v[2 * i]; i = (i + 1) & h->mask)
		if (h->v[2 * i] == key)
			return i;
	return SIZE_MAX;
}

/* Remove key, shifting back the entries its slot kept from their own. */
static void life_map_del(struct life_map *h, uint64_t key)
{
	size_t i = life_map_slot(h, key), j, want;

	if (i == SIZE_MAX)
		return;
	h->n--;
	for (j = i;;) {
		h->v[2 * i] = 0;
		for (;;) {
			j = (j + 1) & h->mask;
			if (!h->v[2 * j])
				return;
			want = life_hash(h->v[2 * j]) & h->mask;
			if (i <= j ? (want <= i || want > j) : (want <= i && want > j))
				break; /* it may move into the hole */
		}
		h->v[2 * i] = h->v[2 * j];
		h->v[2 * i + 1] = h->v[2 * j + 1];
		i = j;
	}
}

/* A rewrite in progress. */
struct life_rw {
	int fd;                        /* kvd.log.new */
	int phase;                     /* LIFE_* */
	int64_t base, compact;         /* B, the BASE records' revision; C, the compaction kept */
	uint64_t from, end0;           /* old log: where the copied history starts; its end at the start */
	uint64_t at;                   /* old log: the next byte to read */
	uint64_t *snap;                /* every key's latest op at the start, in key order */
	size_t nsnap, si;
	struct { int64_t id, ttl; } *leases; /* the leases at the start */
	size_t nleases;
	struct life_map offs;          /* old op offset + 1 -> new op offset (LIFE_UNSET: a base op not yet written) */
	struct life_map ids;           /* lease id -> kind of its first op in the copied history */
	uint64_t base_end;             /* new file: where the BASE records end */
	size_t found;                  /* SCAN: base ops written */
	struct kvd_buf out;            /* new-file bytes not written yet */
	struct kvd_buf win;            /* the reader's window on the old log */
	uint64_t size, synced;         /* new file: bytes written, bytes made durable */
	size_t rec_at, nops_at;        /* the BASE record being filled in out (rec_at SIZE_MAX: none) */
	uint32_t nops;
	struct mvcc_marks marks;       /* the new file's revision marks */
	int64_t compact_last;          /* the newest COMPACT in the new file, -1 none */
	unsigned alarms_copied : 1;
	unsigned automatic : 1;
	int64_t t0;
	uint64_t old_size, recl0;
	unsigned steps;
	int werr;                      /* errno of a failed write to the new file */
	char path[PATH_MAX];
};

static void life_path(struct kvd *k, char *out, size_t cap, const char *name)
{
	snprintf(out, cap, "%s/%s", k->cfg.data_dir, name);
}

/* ---- the reserve ---------------------------------------------------------- */

/* Make <data-dir>/kvd.reserve hold --reserve-bytes (best effort). */
KVD_RESIDENT static void life_reserve_make(struct kvd *k)
{
	uint8_t zero[4096]; /* on the stack: a static const one is 4 KB of the image */
	char path[PATH_MAX];
	uint64_t left = k->cfg.reserve_bytes;
	int fd;

	if (k->life.reserve_held || !left)
		return;
	life_path(k, path, sizeof path, "kvd.reserve");
	if ((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0)
		return;
	memset(zero, 0, sizeof zero);
	while (left) {
		size_t n = (size_t)KVD_MIN(left, (uint64_t)sizeof zero);
		ssize_t w = write(fd, zero, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		left -= (uint64_t)w;
	}
	if (left || (!k->db.no_fsync && fsync(fd))) {
		close(fd);
		unlink(path);
		kvd_log(k, KVD_LOG_WARN, "cannot keep %llu bytes in %s (the disk is full?): none held back",
		        (unsigned long long)k->cfg.reserve_bytes, path);
		return;
	}
	close(fd);
	k->life.reserve_held = 1;
}

/* Give the reserve's blocks back to the filesystem. */
static void life_reserve_release(struct kvd *k)
{
	char path[PATH_MAX];

	if (!k->life.reserve_held)
		return;
	life_path(k, path, sizeof path, "kvd.reserve");
	unlink(path);
	k->life.reserve_held = 0;
	kvd_log(k, KVD_LOG_WARN, "the disk is full: the %llu reserved bytes are released for deletes, compaction and "
	        "rewrites", (unsigned long long)k->cfg.reserve_bytes);
}

/* ---- alarms ------------------------------------------------------------------ */

static const char *life_alarm_name(unsigned type)
{
	return type == ALARM_NOSPACE ? "NOSPACE" : type == ALARM_CORRUPT ? "CORRUPT" : "NONE";
}

static int life_alarm_on(const struct kvd *k, unsigned type)
{
	unsigned i;

	for (i = 0; i < k->db.nalarms; i++)
		if (k->db.alarms[i].type == type)
			return 1;
	return 0;
}

/* Append the whole alarm set to the batch (an ALARM record). */
static int life_alarm_log(struct kvd *k)
{
	struct mvcc *m = &k->db;

	if (buf_reserve(k, &m->w, MVCC_ALARM_REC_MAX))
		return KVD_ENOMEM;
	mvcc_alarms_encode(k->crc, &m->w, m->alarms, m->nalarms);
	return 0;
}

/* Activate (on) or deactivate an alarm.  Returns 1 if the set changed (the
 * change is in the batch), 0 if not, or KVD_E*. */
static int life_alarm_set(struct kvd *k, uint64_t member, unsigned type, int on)
{
	struct mvcc *m = &k->db;
	unsigned i;

	for (i = 0; i < m->nalarms; i++)
		if (m->alarms[i].member == member && m->alarms[i].type == type)
			break;
	if (on == (i < m->nalarms))
		return 0;
	if (on) {
		if (m->nalarms == MVCC_MAX_ALARMS)
			return KVD_ELIMIT;
		m->alarms[m->nalarms].member = member;
		m->alarms[m->nalarms++].type = type;
		kvd_log(k, KVD_LOG_WARN, "alarm raised: memberID:%llu alarm:%s", (unsigned long long)member,
		        life_alarm_name(type));
	} else {
		m->alarms[i] = m->alarms[--m->nalarms];
		kvd_log(k, KVD_LOG_INFO, "alarm disarmed: memberID:%llu alarm:%s", (unsigned long long)member,
		        life_alarm_name(type));
		if (type == ALARM_NOSPACE && !life_alarm_on(k, ALARM_NOSPACE))
			life_reserve_make(k);
	}
	return life_alarm_log(k) ? KVD_ENOMEM : 1;
}

/* The filesystem said ENOSPC: NOSPACE, and the reserve goes to the freeing
 * writes that are still allowed. */
static void life_on_enospc(struct kvd *k)
{
	life_reserve_release(k);
	life_alarm_set(k, k->member_id, ALARM_NOSPACE, 1);
}

/* May a write that adds cost bytes go on?  0, or etcd's error in code, msg
 * (a write over the quota raises NOSPACE, as etcd's quota check does). */
static int life_admit(struct kvd *k, uint64_t cost, int *code, const char **msg)
{
	struct mvcc *m = &k->db;
	uint64_t quota = k->cfg.quota_backend_bytes ? k->cfg.quota_backend_bytes : LIFE_DEFAULT_QUOTA;

	*code = GRPC_RESOURCE_EXHAUSTED; /* etcd: the quota gate comes before the appliers */
	*msg = E_NO_SPACE;
	if (cost && m->size + m->w.len + cost >= quota) {
		life_alarm_set(k, k->member_id, ALARM_NOSPACE, 1);
		return KVD_EINVAL;
	}
	if (life_alarm_on(k, ALARM_CORRUPT)) { /* then CORRUPT's applier, then NOSPACE's */
		*code = GRPC_DATA_LOSS;
		*msg = "etcdserver: corrupt cluster";
		return KVD_EINVAL;
	}
	return cost && life_alarm_on(k, ALARM_NOSPACE) ? KVD_EINVAL : 0;
}

/* ---- the rewrite ------------------------------------------------------------ */

#ifdef KVD_TEST_SERVICES
/* Test builds die at a named point of a rewrite when KVD_TEST_REWRITE_CRASH
 * says so ("slice:N", "synced", "renamed", "dirsynced", "switched"). */
static void life_crash_point(const struct life_rw *rw, const char *point)
{
	const char *want = getenv("KVD_TEST_REWRITE_CRASH");

	if (!want)
		return;
	if (!strcmp(want, point) || (!strncmp(want, "slice:", 6) && !strcmp(point, "slice") &&
	                              rw->steps == (unsigned)atoi(want + 6)))
		raise(SIGKILL);
}
#else
#define life_crash_point(rw, point) ((void)0)
#endif

static void life_rw_free(struct kvd *k, struct life_rw *rw)
{
	if (rw->fd >= 0)
		close(rw->fd);
	kvd_free(k, rw->snap);
	kvd_free(k, rw->leases);
	kvd_free(k, rw->offs.v);
	kvd_free(k, rw->ids.v);
	buf_free(k, &rw->out);
	buf_free(k, &rw->win);
	kvd_free(k, rw->marks.v);
	kvd_free(k, rw);
}

static void svc_defrag_answer(struct kvd *k, struct call *c, int code, const char *msg);

/* The rewrite ended (code GRPC_OK) or was abandoned: answer who waited. */
static void life_rw_end(struct kvd *k, int code, const char *msg)
{
	struct life *L = &k->life;
	struct call *c;

	if (L->rw) {
		life_rw_free(k, L->rw);
		L->rw = NULL;
	}
	while (L->nwait) {
		c = L->wait[--L->nwait];
		c->svc = NULL;
		svc_defrag_answer(k, c, code, msg);
	}
	util_wake_by(k, k->now); /* the answers leave on the next turn */
}

/* Give up: the partial file goes, the old log serves on. */
static void life_rw_abandon(struct kvd *k, int err, const char *what)
{
	struct life_rw *rw = k->life.rw;
	char msg[200];

	snprintf(msg, sizeof msg, "kvd: log rewrite abandoned: %s%s%s", what, err ? ": " : "", err ? strerror(err) : "");
	close(rw->fd);
	rw->fd = -1;
	unlink(rw->path);
	kvd_log(k, KVD_LOG_WARN, "%s; serving from the old log", msg + 5);
	if (rw->automatic)
		k->life.rw_failed_at = k->now;
	life_rw_end(k, err == ENOSPC || err == EDQUOT ? GRPC_RESOURCE_EXHAUSTED : GRPC_UNAVAILABLE, msg);
}

/* Write what out holds to the new file; fdatasync every LIFE_SYNC_EVERY
 * bytes, or now with sync.  0, or KVD_EIO with the errno in rw->werr. */
static int life_rw_write(struct kvd *k, struct life_rw *rw, int sync)
{
	const uint8_t *p = rw->out.p;
	size_t n = rw->out.len;
	ssize_t w;

	while (n) {
		w = pwrite(rw->fd, p, n, (off_t)rw->size);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			rw->werr = w < 0 ? errno : ENOSPC;
			return KVD_EIO;
		}
		p += w;
		n -= (size_t)w;
		rw->size += (uint64_t)w;
	}
	rw->out.len = 0;
	if ((sync || rw->size - rw->synced >= LIFE_SYNC_EVERY) && rw->size > rw->synced) {
		if (!k->db.no_fsync && fdatasync(rw->fd)) {
			rw->werr = errno;
			return KVD_EIO;
		}
		rw->synced = rw->size;
	}
	return 0;
}

/*
 * Keys deleted at C itself left the index with that compaction (a put since
 * starts a new chain), yet TXN C is copied whole (watchers from C see it):
 * their ops at B must be in the base too.  Appends to rw->snap the op
 * before each delete at C that no key's chain in the index reaches.
 */
static int life_rw_deleted_at_c(struct kvd *k, struct life_rw *rw)
{
	struct mvcc *m = &k->db;
	struct mvcc_reader rd;
	struct mvcc_rec rec;
	struct mvcc_op op;
	struct mvcc_key *key;
	const char *why;
	uint64_t *ns;
	int r, e;

	if (rw->compact <= rw->base)
		return 0;
	mvcc_reader_init(&rd, &rw->win, mvcc_seek_rev(k, &rw->win, rw->compact), m->size, 1 << 16, NULL);
	for (;;) { /* TXN C, after any lease-only TXNs that carry C as their check */
		if (mvcc_read_rec(k, &rd, &rec, &why) != 1)
			return KVD_ECORRUPT;
		if (rec.type != MVCC_REC_TXN)
			continue;
		if (mvcc_rec_decode(&rec, &why) || rec.rev != rw->compact)
			return KVD_ECORRUPT;
		while ((r = mvcc_rec_op(&rec, &op, &why)) == 1 && op.kind != MVCC_OP_PUT && op.kind != MVCC_OP_DEL)
			;
		if (r < 0)
			return r;
		if (r == 1)
			break;
	}
	mvcc_rec_decode(&rec, &why); /* from its first op again */
	while ((r = mvcc_rec_op(&rec, &op, &why)) == 1) {
		if (op.kind != MVCC_OP_DEL || !op.prev)
			continue;
		if ((key = mvcc_find(m, op.key, (size_t)op.klen))) { /* does its chain reach this delete? */
			struct mvcc_op h;
			if ((e = mvcc_op_at(m, key->op, rw->compact, &h)) < 0)
				return e;
			if (e && h.off == op.off)
				continue; /* yes: the base walk finds its op at B */
		}
		/* one more, not util_grow: rw->snap holds every key, and doubling
		 * it for a rare straggler would double it */
		if (!(ns = kvd_realloc(k, rw->snap, (rw->nsnap + 1) * sizeof *ns)))
			return KVD_ENOMEM;
		rw->snap = ns;
		rw->snap[rw->nsnap++] = op.prev - 1;
	}
	return r;
}

/* Start: note the keys' latest ops and the leases (the batch is empty). */
static int life_rw_start(struct kvd *k, int automatic)
{
	struct mvcc *m = &k->db;
	struct life_rw *rw;
	struct mvcc_it it = {0, 0};
	struct mvcc_key *r;
	struct lease *l;
	size_t i;

	if (!(rw = kvd_calloc(k, sizeof *rw)))
		return KVD_ENOMEM;
	rw->fd = -1;
	rw->rec_at = SIZE_MAX;
	rw->automatic = automatic ? 1 : 0;
	rw->t0 = k->now;
	rw->old_size = rw->end0 = m->size;
	rw->recl0 = m->reclaimable;
	rw->compact = m->compacted;
	rw->compact_last = -1;
	rw->base = KVD_MAX(KVD_MAX(m->compacted - 1, 1), m->base_rev); /* never below a base already made */
	k->life.rw = rw;
	if ((m->nkeys && !(rw->snap = kvd_malloc(k, m->nkeys * sizeof *rw->snap))) ||
	    (k->lease.n && !(rw->leases = kvd_malloc(k, k->lease.n * sizeof *rw->leases)))) {
		life_rw_end(k, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return KVD_ENOMEM;
	}
	while ((r = mvcc_at(m, it))) {
		rw->snap[rw->nsnap++] = r->op;
		mvcc_next(m, &it);
	}
	if (life_rw_deleted_at_c(k, rw)) {
		life_rw_end(k, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory or unreadable log");
		return KVD_ENOMEM;
	}
	for (i = 0; k->lease.tab && i <= k->lease.mask; i++)
		for (l = k->lease.tab[i]; l; l = l->hnext) {
			rw->leases[rw->nleases].id = l->id;
			rw->leases[rw->nleases++].ttl = l->ttl;
		}
	rw->from = rw->at = mvcc_seek_rev(k, &rw->win, mvcc_after(rw->base));
	life_path(k, rw->path, sizeof rw->path, "kvd.log.new");
	rw->fd = open(rw->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (rw->fd < 0) {
		life_rw_abandon(k, errno, "cannot create kvd.log.new");
		return KVD_EIO;
	}
	if (buf_reserve(k, &rw->out, MVCC_HEADER_REC)) {
		life_rw_end(k, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return KVD_ENOMEM;
	}
	mvcc_header_encode(k->crc, rw->out.p);
	rw->out.len = MVCC_HEADER_REC;
	rw->phase = LIFE_LEASES;
	kvd_log(k, KVD_LOG_INFO, "log rewrite started (%s): %llu bytes, %llu reclaimable, compacted %lld",
	        automatic ? "automatic" : "Defragment", (unsigned long long)m->size,
	        (unsigned long long)m->reclaimable, (long long)m->compacted);
	return 0;
}

/* Close the BASE record being filled, if any. */
static void life_rw_base_close(struct kvd *k, struct life_rw *rw)
{
	if (rw->rec_at == SIZE_MAX)
		return;
	put_be32(rw->out.p + rw->nops_at, rw->nops);
	mvcc_seal(k->crc, rw->out.p + rw->rec_at, rw->out.len - rw->rec_at - MVCC_REC_HDR, MVCC_REC_BASE);
	rw->rec_at = SIZE_MAX;
}

/* Room for an op of n bytes in the current BASE record (opened as needed). */
static int life_rw_base_room(struct kvd *k, struct life_rw *rw, size_t n)
{
	if (rw->rec_at != SIZE_MAX && rw->out.len - rw->rec_at + n > LIFE_BASE_REC)
		life_rw_base_close(k, rw);
	if (buf_reserve(k, &rw->out, MVCC_REC_HDR + 14 + n))
		return KVD_ENOMEM;
	if (rw->rec_at == SIZE_MAX) {
		rw->rec_at = rw->out.len;
		rw->nops_at = mvcc_rec_open(&rw->out, rw->base);
		rw->nops = 0;
	}
	return 0;
}

/* A COMPACT record into out. */
static int life_rw_compact(struct kvd *k, struct life_rw *rw)
{
	if (buf_reserve(k, &rw->out, MVCC_COMPACT_REC_MAX))
		return KVD_ENOMEM;
	mvcc_compact_encode(k->crc, &rw->out, rw->compact);
	rw->compact_last = rw->compact;
	return 0;
}

/* A lease grant into the BASE record being filled. */
static int life_rw_grant(struct kvd *k, struct life_rw *rw, int64_t id, int64_t ttl)
{
	if (life_rw_base_room(k, rw, MVCC_LEASE_OP_MAX))
		return KVD_ENOMEM;
	rw->out.len = (size_t)(mvcc_lease_encode(rw->out.p + rw->out.len, MVCC_OP_GRANT, id, ttl) - rw->out.p);
	rw->nops++;
	return 0;
}

/* LEASES: which leases lived at B.  Reads [from, end0) for lease ops. */
static int life_rw_leases(struct kvd *k, struct life_rw *rw, const char **why)
{
	struct mvcc_reader rd;
	struct mvcc_rec rec;
	struct mvcc_op op;
	size_t i, budget = LIFE_SLICE;
	uint64_t kind;
	int r = 0;

	mvcc_reader_init(&rd, &rw->win, rw->at, rw->end0, 1 << 16, NULL);
	while (budget && (r = mvcc_read_rec(k, &rd, &rec, why)) == 1) {
		budget -= KVD_MIN(budget, (size_t)(rd.off - rw->at));
		rw->at = rd.off;
		if (rec.type != MVCC_REC_TXN)
			continue;
		if ((r = mvcc_rec_decode(&rec, why)))
			return r;
		while ((r = mvcc_rec_op(&rec, &op, why)) == 1)
			if ((op.kind == MVCC_OP_GRANT || op.kind == MVCC_OP_REVOKE) &&
			    life_map_slot(&rw->ids, (uint64_t)op.lease) == SIZE_MAX &&
			    life_map_put(k, &rw->ids, (uint64_t)op.lease, op.kind))
				return KVD_ENOMEM;
		if (r)
			return r;
	}
	if (r < 0)
		return r;
	if (rw->at < rw->end0)
		return 0;
	/* alive at B: a lease of the start not granted in the history, or one
	 * whose first op there is a revoke (its TTL no longer matters: the
	 * history revokes it) */
	for (i = 0; i < rw->nleases; i++) {
		size_t sl = life_map_slot(&rw->ids, (uint64_t)rw->leases[i].id);
		if ((sl == SIZE_MAX || rw->ids.v[2 * sl + 1] != MVCC_OP_GRANT) &&
		    life_rw_grant(k, rw, rw->leases[i].id, rw->leases[i].ttl))
			return KVD_ENOMEM;
	}
	for (i = 0; rw->ids.v && i <= rw->ids.mask; i++) {
		if (!rw->ids.v[2 * i] || rw->ids.v[2 * i + 1] != MVCC_OP_REVOKE)
			continue;
		kind = rw->ids.v[2 * i];
		if (!lease_find(k, (int64_t)kind) && /* else granted again since: written above */
		    life_rw_grant(k, rw, (int64_t)kind, KVD_MAX(k->lease.min_ttl, 1)))
			return KVD_ENOMEM;
	}
	rw->phase = LIFE_BASE;
	return 0;
}

/* BASE: find each noted key's op at B, back along its chain. */
static int life_rw_base(struct kvd *k, struct life_rw *rw, const char **why)
{
	struct mvcc *m = &k->db;
	struct mvcc_op op;
	size_t budget = LIFE_SLICE;
	int r;

	if (!rw->si && life_map_reserve(k, &rw->offs, rw->nsnap)) /* one key, one entry: no regrowth */
		return KVD_ENOMEM;
	for (; rw->si < rw->nsnap && budget; rw->si++) {
		budget -= KVD_MIN(budget, (size_t)64);
		if ((r = mvcc_op_at(m, rw->snap[rw->si], rw->base, &op)) < 0) {
			*why = "a key's chain of ops is broken";
			return r;
		}
		if (r && op.kind == MVCC_OP_PUT && life_map_put(k, &rw->offs, op.off + 1, LIFE_UNSET))
			return KVD_ENOMEM; /* else born after B, or deleted at B */
	}
	if (rw->si < rw->nsnap)
		return 0;
	kvd_free(k, rw->snap);
	rw->snap = NULL;
	rw->at = MVCC_HEADER_REC;
	rw->phase = LIFE_SCAN;
	return 0;
}

/* SCAN: the old log up to the copied history, once, in order: each op
 * found by BASE goes into a BASE record with its position in its revision
 * (etcd's sub-revision), which only a whole record tells. */
static int life_rw_scan(struct kvd *k, struct life_rw *rw, const char **why)
{
	struct mvcc_reader rd;
	struct mvcc_rec rec;
	struct mvcc_op op;
	size_t budget = LIFE_SLICE, sl;
	uint64_t sub;
	int r = 0;

	mvcc_reader_init(&rd, &rw->win, rw->at, rw->from, 1 << 16, NULL);
	while (budget && (r = mvcc_read_rec(k, &rd, &rec, why)) == 1) {
		budget -= KVD_MIN(budget, (size_t)(rd.off - rw->at));
		rw->at = rd.off;
		if (rec.type != MVCC_REC_TXN && rec.type != MVCC_REC_BASE)
			continue;
		if ((r = mvcc_rec_decode(&rec, why)))
			return r;
		for (sub = 0; (r = mvcc_rec_op(&rec, &op, why)) == 1;) {
			if (op.kind != MVCC_OP_PUT && op.kind != MVCC_OP_DEL)
				continue;
			if (rec.type == MVCC_REC_BASE)
				sub = op.prev; /* a base op keeps its sub-revision there */
			sl = life_map_slot(&rw->offs, op.off + 1);
			if (sl != SIZE_MAX && rw->offs.v[2 * sl + 1] == LIFE_UNSET) {
				if (life_rw_base_room(k, rw, MVCC_OP_MAX_HDR + (size_t)op.klen + (size_t)op.vlen))
					return KVD_ENOMEM;
				rw->offs.v[2 * sl + 1] = rw->size + rw->out.len;
				rw->found++;
				rw->out.len = (size_t)(mvcc_op_encode(rw->out.p + rw->out.len, MVCC_OP_PUT, sub, op.rev, op.create,
				                                      op.ver, op.lease, op.key, (size_t)op.klen, op.val,
				                                      (size_t)op.vlen) - rw->out.p);
				rw->nops++;
			}
			sub++;
		}
		if (r)
			return r;
	}
	if (r < 0)
		return r;
	if (rw->at < rw->from)
		return 0;
	if (rw->base > 1 && rw->size + rw->out.len == MVCC_HEADER_REC && rw->rec_at == SIZE_MAX &&
	    life_rw_base_room(k, rw, 0))
		return KVD_ENOMEM; /* nothing live at B: an empty BASE still says the revision */
	life_rw_base_close(k, rw);
	if (rw->found != rw->offs.n) {
		*why = "a key's op at the base revision is not where its chain said";
		return KVD_ECORRUPT;
	}
	rw->base_end = rw->size + rw->out.len;
	if (rw->compact >= 0 && rw->compact <= rw->base && life_rw_compact(k, rw))
		return KVD_ENOMEM; /* C <= 1: it may sit before the copied history */
	rw->at = rw->from;
	rw->phase = LIFE_COPY;
	return 0;
}

/* COPY one TXN record: its bytes, each key op's prev re-pointed. */
static int life_rw_txn(struct kvd *k, struct life_rw *rw, struct mvcc_rec *rec, const char **why)
{
	size_t len = (size_t)(rec->end - rec->p), q = rw->out.len, pos;
	uint64_t newprev;
	uint32_t nkeys = 0;
	struct mvcc_op op;
	size_t sl;
	int r;

	if (buf_reserve(k, &rw->out, MVCC_REC_HDR + len))
		return KVD_ENOMEM;
	memcpy(rw->out.p + q, rec->p - MVCC_REC_HDR, MVCC_REC_HDR + len);
	rw->out.len += MVCC_REC_HDR + len;
	if ((r = mvcc_rec_decode(rec, why)))
		return r;
	while ((r = mvcc_rec_op(rec, &op, why)) == 1) {
		if (op.kind != MVCC_OP_PUT && op.kind != MVCC_OP_DEL)
			continue;
		nkeys++;
		pos = q + (size_t)(op.off - rec->off);
		newprev = 0;
		if (op.prev && (sl = life_map_slot(&rw->offs, op.prev)) != SIZE_MAX) {
			newprev = rw->offs.v[2 * sl + 1] + 1;
			life_map_del(&rw->offs, op.prev);
		}
		put_be64(rw->out.p + pos + 1, newprev);
		if (life_map_put(k, &rw->offs, op.off + 1, rw->size + pos))
			return KVD_ENOMEM;
	}
	if (r)
		return r;
	mvcc_seal(k->crc, rw->out.p + q, len, MVCC_REC_TXN);
	if (nkeys)
		mvcc_mark(k, &rw->marks, rec->rev, rw->size + q);
	return 0;
}

/* COPY: the history from `from` to the old log's (moving) end. */
static int life_rw_copy(struct kvd *k, struct life_rw *rw, const char **why)
{
	struct mvcc_reader rd;
	struct mvcc_rec rec;
	size_t budget = LIFE_SLICE;
	int r = 0;

	mvcc_reader_init(&rd, &rw->win, rw->at, k->db.size, 1 << 16, NULL);
	while (budget && (r = mvcc_read_rec(k, &rd, &rec, why)) == 1) {
		budget -= KVD_MIN(budget, (size_t)(rd.off - rw->at));
		rw->at = rd.off;
		switch (rec.type) {
		case MVCC_REC_TXN:
			if ((r = life_rw_txn(k, rw, &rec, why)))
				return r;
			break;
		case MVCC_REC_COMPACT: /* where it was: replay then drops the same keys */
		case MVCC_REC_ALARM:
			if (rec.type == MVCC_REC_COMPACT) {
				if ((r = mvcc_rec_decode(&rec, why)))
					return r;
				if (rec.rev <= rw->compact_last)
					break; /* C <= 1, written after the base */
				rw->compact_last = rec.rev;
			}
			if (buf_reserve(k, &rw->out, (size_t)(rec.end - rec.p) + MVCC_REC_HDR))
				return KVD_ENOMEM;
			memcpy(rw->out.p + rw->out.len, rec.p - MVCC_REC_HDR, (size_t)(rec.end - rec.p) + MVCC_REC_HDR);
			rw->out.len += (size_t)(rec.end - rec.p) + MVCC_REC_HDR;
			rw->alarms_copied |= rec.type == MVCC_REC_ALARM;
			break;
		default: /* HEADER and BASE come before any history; AUTH is stated whole at the end */
			break;
		}
	}
	return r < 0 ? r : 0;
}

/* The copy has caught up (right after a flush): make the new log the log. */
static int life_rw_switch(struct kvd *k, struct life_rw *rw, const char **why)
{
	struct mvcc *m = &k->db;
	struct mvcc_it it = {0, 0};
	struct mvcc_key *r;
	char path[PATH_MAX];
	size_t sl;
	int e, dfd;

	if (rw->compact_last != m->compacted) {
		*why = "the compaction's record was not found";
		return KVD_ECORRUPT;
	}
	if (m->nalarms || rw->alarms_copied) { /* the alarms now, stated once more */
		if (buf_reserve(k, &rw->out, MVCC_ALARM_REC_MAX))
			return KVD_ENOMEM;
		mvcc_alarms_encode(k->crc, &rw->out, m->alarms, m->nalarms);
	}
	if (auth_any(k) && auth_encode_whole(k, &rw->out)) /* users and roles now, in one record */
		return KVD_ENOMEM;
	for (; (r = mvcc_at(m, it)); mvcc_next(m, &it)) /* every key's latest op was copied */
		if (life_map_slot(&rw->offs, r->op + 1) == SIZE_MAX) {
			*why = "a key's latest op is missing from the copy";
			return KVD_ECORRUPT;
		}
	if ((e = life_rw_write(k, rw, 1)))
		return e;
	life_crash_point(rw, "synced");
	life_path(k, path, sizeof path, "kvd.log");
	if (rename(rw->path, path)) {
		rw->werr = errno;
		return KVD_EIO;
	}
	life_crash_point(rw, "renamed");
	/* from here the new log is the log: nothing below may fail it */
	if ((dfd = open(k->cfg.data_dir, O_RDONLY | O_CLOEXEC)) >= 0) {
		if (!m->no_fsync && fsync(dfd))
			kvd_log(k, KVD_LOG_WARN, "fsync of %s: %s", k->cfg.data_dir, strerror(errno));
		close(dfd);
	}
	life_crash_point(rw, "dirsynced");
	it.li = 0;
	it.ki = 0;
	for (; (r = mvcc_at(m, it)); mvcc_next(m, &it)) {
		sl = life_map_slot(&rw->offs, r->op + 1);
		r->op = rw->offs.v[2 * sl + 1];
	}
	close(m->fd);
	m->fd = rw->fd;
	rw->fd = -1;
	m->size = rw->size;
	m->base_end = rw->base_end;
	m->base_rev = rw->base;
	mvcc_log_moved(k, m, &rw->marks);
#ifdef KVD_TEST_SERVICES
	m->synced = m->size; /* fdatasynced before the rename */
	m->synced_gen = m->gen;
#endif
	m->reclaimable -= KVD_MIN(rw->recl0, m->reclaimable);
	k->life.rewrites++;
	k->life.rw_kept += rw->size;
	k->life.rw_dropped += rw->old_size > rw->size ? rw->old_size - rw->size : 0;
	kvd_log(k, KVD_LOG_INFO, "log rewritten: %llu -> %llu bytes (%zu keys, revision %lld, compacted %lld) in %lld ms",
	        (unsigned long long)rw->old_size, (unsigned long long)rw->size, m->nkeys, (long long)m->rev,
	        (long long)m->compacted, (long long)(k->now - rw->t0));
	life_crash_point(rw, "switched");
	return 0;
}

/* One slice of the rewrite; called after the log flush (batch empty). */
static void life_rw_step(struct kvd *k)
{
	struct life_rw *rw = k->life.rw;
	const char *why = "";
	int r = 0;

	if (k->db.broken) {
		life_rw_abandon(k, 0, "the log is unwritable");
		return;
	}
	rw->steps++;
	if (rw->phase == LIFE_LEASES)
		r = life_rw_leases(k, rw, &why);
	else if (rw->phase == LIFE_BASE)
		r = life_rw_base(k, rw, &why);
	else if (rw->phase == LIFE_SCAN)
		r = life_rw_scan(k, rw, &why);
	else if ((r = life_rw_copy(k, rw, &why)) == 0 && rw->at >= k->db.size && !k->db.w.len) {
		if ((r = life_rw_switch(k, rw, &why)) == 0) {
			life_rw_end(k, GRPC_OK, "");
			life_reserve_make(k);
			return;
		}
	}
	if (!r) { /* what this slice made goes to the file, records whole */
		life_rw_base_close(k, rw);
		r = life_rw_write(k, rw, 0);
	}
	if (r && rw->werr)
		life_rw_abandon(k, rw->werr, "cannot write kvd.log.new");
	else if (r == KVD_ENOMEM)
		life_rw_abandon(k, ENOMEM, "out of memory");
	else if (r == KVD_ECORRUPT)
		life_rw_abandon(k, 0, why);
	else if (r)
		life_rw_abandon(k, EIO, "cannot read the log");
	else
		life_crash_point(rw, "slice");
}

/* ---- auto-compaction (etcd 3.4's v3compactor) --------------------------- */

/* Parse --auto-compaction-mode/-retention as etcd does. */
static int life_init(struct kvd *k, char *err, size_t errlen)
{
	struct life *L = &k->life;
	const char *mode = k->cfg.auto_compaction_mode, *ret = k->cfg.auto_compaction_retention;
	char *end;
	unsigned long long n;
	uint32_t ms;

	errno = 0;
	n = strtoull(ret, &end, 10);
	if (!strcmp(mode, "revision")) {
		if (!*ret || *end || errno || *ret == '-') {
			snprintf(err, errlen, "invalid auto compaction retention %s for revision mode", ret);
			return KVD_EINVAL;
		}
		L->retain_revs = (int64_t)KVD_MIN(n, (unsigned long long)INT64_MAX);
		L->mode = L->retain_revs ? LIFE_REVISION : LIFE_OFF;
	} else if (!strcmp(mode, "periodic")) {
		if (*ret && !*end && !errno && *ret != '-') /* a bare number is hours */
			ms = n > 1193 ? UINT32_MAX : (uint32_t)(n * 3600000u);
		else if (cfg_duration(ret, &ms)) {
			snprintf(err, errlen, "invalid auto compaction retention %s for periodic mode", ret);
			return KVD_EINVAL;
		}
		L->period_ms = ms;
		L->mode = ms ? LIFE_PERIODIC : LIFE_OFF;
	} else {
		snprintf(err, errlen, "unknown auto-compaction-mode \"%s\"", mode);
		return KVD_EINVAL;
	}
	life_reserve_make(k);
	L->last_ok = k->now;
	L->base_ms = L->period_ms;
	if (L->mode == LIFE_PERIODIC) { /* etcd: retry interval = min(period, 1h) / 10 */
		uint32_t retry = KVD_MAX(KVD_MIN(L->period_ms, 3600000u) / 10, 1u);
		L->maxrevs = L->period_ms / retry + 1;
		if (!(L->revs = kvd_calloc(k, L->maxrevs * sizeof *L->revs)))
			return KVD_ENOMEM;
		L->revs[L->nrevs++] = k->db.rev;
		L->next_tick = k->now + retry;
	} else if (L->mode == LIFE_REVISION) {
		L->next_tick = k->now + k->cfg.auto_compaction_check_ms;
	}
	if (L->mode != LIFE_OFF)
		util_wake_by(k, L->next_tick);
	return 0;
}

/* Compact to rev as the compactor asks; 1 done (or already), 0 failed. */
static int life_compact_to(struct kvd *k, int64_t rev, const char *retention)
{
	int code = 0;
	const char *msg = NULL;

	kvd_log(k, KVD_LOG_INFO, "Starting auto-compaction at revision %lld (retention: %s)", (long long)rev, retention);
	if (rev <= k->db.compacted || (!k->db.broken && !life_admit(k, 0, &code, &msg) && !mvcc_compact(k, rev))) {
		kvd_log(k, KVD_LOG_INFO, "Finished auto-compaction at revision %lld", (long long)rev);
		return 1;
	}
	kvd_log(k, KVD_LOG_WARN, "Failed auto-compaction at revision %lld (%s)", (long long)rev,
	        msg ? msg : k->db.broken ? "the log is unwritable" : "out of memory");
	return 0;
}

static void life_compactor(struct kvd *k)
{
	struct life *L = &k->life;
	char ret[64];
	int64_t rev;

	if (L->mode == LIFE_OFF || k->now < L->next_tick || k->stopping)
		goto arm;
	if (L->mode == LIFE_REVISION) {
		L->next_tick = k->now + k->cfg.auto_compaction_check_ms;
		rev = k->db.rev - L->retain_revs;
		if (rev > 0 && rev != L->prev_rev) {
			snprintf(ret, sizeof ret, "%lld revisions", (long long)L->retain_revs);
			if (life_compact_to(k, rev, ret))
				L->prev_rev = rev;
			else
				kvd_log(k, KVD_LOG_INFO, "Retry after %u ms", (unsigned)k->cfg.auto_compaction_check_ms);
		}
	} else {
		uint32_t retry = KVD_MAX(KVD_MIN(L->period_ms, 3600000u) / 10, 1u);
		L->next_tick = k->now + retry;
		if (k->now - L->last_ok >= L->base_ms) {
			L->base_ms = KVD_MIN(L->period_ms, 3600000u); /* after the first: every min(period, 1h) */
			cfg_show_ms(L->period_ms, ret, sizeof ret);
			if (life_compact_to(k, L->revs[0], ret))
				L->last_ok = k->now;
		}
		if (L->nrevs == L->maxrevs) { /* revs[0] is always the revision about a period ago */
			memmove(L->revs, L->revs + 1, (L->nrevs - 1) * sizeof *L->revs);
			L->nrevs--;
		}
		L->revs[L->nrevs++] = k->db.rev;
	}
arm:
	if (L->mode != LIFE_OFF && !k->stopping)
		util_wake_by(k, L->next_tick);
}

/* ---- the loop's part ---------------------------------------------------------- */

/* After the log flush: a slice of the rewrite in progress, or the start of
 * one that was asked for or that the reclaimable bytes call for. */
static void life_step(struct kvd *k)
{
	struct life *L = &k->life;
	struct mvcc *m = &k->db;
	uint64_t kept = m->size - KVD_MIN(m->reclaimable, m->size);
	int automatic = 0;

	if (m->w.len || m->broken || L->snapshots) /* a failed flush left nothing, a broken log writes
	                                            * nothing, a snapshot reads the log as it is */
		return;
	if (!L->rw && !L->want && k->cfg.auto_rewrite && !k->stopping && m->reclaimable &&
	    m->reclaimable >= KVD_MAX(k->cfg.auto_rewrite_min_bytes, kept / 100 * k->cfg.auto_rewrite_percent) &&
	    (!L->rw_failed_at || k->now - L->rw_failed_at >= LIFE_RETRY_MS))
		automatic = 1;
	if (!L->rw && (L->want || automatic) && !k->stopping) {
		L->want = 0;
		if (life_rw_start(k, automatic))
			return;
	}
	if (L->rw) {
		life_rw_step(k);
		if (L->rw)
			util_wake_by(k, k->now); /* the next slice without waiting */
	}
}

static void life_fini(struct kvd *k)
{
	struct life *L = &k->life;

	if (L->rw) {
		close(L->rw->fd);
		L->rw->fd = -1;
		unlink(L->rw->path);
	}
	life_rw_end(k, GRPC_UNAVAILABLE, "etcdserver: server stopped");
	kvd_free(k, L->wait);
	kvd_free(k, L->revs);
	L->wait = NULL;
	L->revs = NULL;
}

/* ===== 14. etcd's backend: snapshots written, Hash, HashKV (snap_) ======= */

/*
 * etcd keeps its store in a bbolt file, and Maintenance/Snapshot sends
 * that file.  kvd keeps a log instead, so it makes the file etcd would have
 * -- page by page, as the client's window opens -- and `etcdctl snapshot
 * restore` turns it into an etcd data dir with every revision kept.  This
 * section owns bbolt's page format and etcd's buckets; nothing else in kvd
 * writes or reads them.
 *
 * The file.  Page size 4096; every bbolt integer little-endian, as bbolt on
 * amd64 writes it (a big-endian board makes the same bytes, so its file
 * restores on an x86 etcd).  Pages:
 *
 *    0, 1    meta pages (txid 2 and 1, as etcd's WriteTo), no freelist page:
 *            etcd's own snapshots carry none either, readers rebuild it
 *    2..     the root bucket: one leaf (with overflow pages if it must) of
 *            etcd's ten buckets in byte order; the small ones inline
 *    then    the `key` bucket's tree: its leaves, then each branch level
 *    then    the `lease` bucket's tree, laid out the same way
 *
 * There is no free page: pgid (the page count) is the end of the last tree.
 *
 * The buckets, with etcd's encodings (etcd-snapshot-format.md, section 2):
 * key: revision key (main BE, '_', sub BE; a tombstone adds 't') ->
 * mvccpb.KeyValue, exactly the records etcd's backend would hold after the
 * compaction point C, the same selection as HashKV (below);  lease: id BE ->
 * leasepb.Lease {ID, TTL};  meta: consistent_index (the revision, etcd's
 * restore replaces it), finished/scheduledCompactRev when compacted, and
 * etcd 3.5+'s term, confState {"voters":[id]} and storageVersion (3.7.0);
 * alarm: the active alarms;  members: this member as etcd's JSON;  cluster:
 * clusterVersion 3.7.0;  auth: authEnabled, authRevision;  authRoles,
 * authUsers: authpb.Role and authpb.User by name, as section 12 keeps them
 * (bcrypt hashes included);  members_removed: empty.
 *
 * A tree's layout comes first.  bbolt's metas, at the front of the file,
 * name the page count, and a branch names its children's pages, so the
 * snapshot starts with a plan: one pass over the log computes each leaf's
 * records, bytes and first key (greedy packing: a leaf takes records while
 * they fit a page; a bigger record gets a leaf of its own with overflow
 * pages), and the branch levels follow from the leaves (100 children per
 * branch page).  The plan holds 40 bytes per leaf, not the records; a second
 * pass over the same log bytes then makes the leaves, one page image at a
 * time, and checks each against its plan.
 *
 * Consistency.  The plan is taken after a group commit, at the current
 * revision R and compaction point C, over the log's bytes then.  The log is
 * append-only and only a rewrite moves it, so while a snapshot streams no
 * rewrite starts or switches (life_step waits); later records are past R
 * and past the planned end.  Leases are copied at the start (id, TTL).
 *
 * The stream is etcd's: 32768-byte blobs with remaining_bytes = pgid * 4096
 * minus the bytes sent so far, the last one short, then one message with the
 * SHA-256 of the file.  Memory: the plan, one page image (bigger only for a
 * big record's leaf), one 32 KiB chunk and the log reader's 64 KiB window.
 *
 * Hash is etcd's Maintenance.Hash over this same content -- each bucket's
 * name, then its keys and values in order, without meta's consistent_index,
 * term and storageVersion (etcd 3.7's DefaultIgnores) -- so it is the hash
 * of the snapshot kvd would send at that moment.
 *
 * Invariants:
 *   1. This section alone writes bbolt's pages, through the BOLT_* names,
 *      never literal offsets, every integer little-endian whatever the
 *      host (put_le16, put_le32, put_le64).
 *   2. Memory stays bounded by the plan: 40 bytes per leaf (struct
 *      snap_leaf), one page image, one chunk and the reader's window; no
 *      record is held past the page it goes into (snap_plan,
 *      snap_next_node).
 *   3. The second pass must agree with the plan -- each leaf's records,
 *      first key and bytes (snap_key_leaf), the bytes sent equal to
 *      pgid * 4096 before the digest (snap_chunk's KVD_ALWAYS) -- else the
 *      stream fails (KVD_ECORRUPT) rather than send a file whose pages
 *      contradict its metas.
 *   4. While a snapshot streams (k->life.snapshots) no rewrite starts or
 *      switches (life_step), so the planned bytes [0, end) stay where they
 *      were.
 *   5. The key bucket and Hash walk the same records (snap_keys_next over
 *      snap_ops_at's map at C), so Hash is the hash of the snapshot;
 *      HashKV walks the same iterator, its selection taken at its own
 *      revision as etcd's keep is (snap_hashkv_real).
 */

#define SNAP_PAGE 4096
#define SNAP_CHUNK 32768            /* etcd streams its file in these */
#define SNAP_FANOUT 100             /* children per branch page: 16 + 100 * (16 + 18) < 4096 */
#define SNAP_LEVELS 10              /* 100^9 leaves: more than any log holds */
#define SNAP_TXID 2                 /* meta 0's txid; meta 1 has one less, as etcd writes */
#define SNAP_SMALL 40               /* entries of the inline buckets, to begin with */
enum { SNAP_INLINE, SNAP_KEYS, SNAP_LEASES };
#define SNAP_NBUCKETS 10

/*
 * bbolt's layout (v1.3.6 page.go, db.go, bucket.go; etcd-snapshot-format.md
 * section 1), named once for the writer and the reader below: they use these
 * names, no literal offsets.  bbolt casts its structs onto the file, so the
 * fields are in host order: little-endian, as on amd64.
 *
 *    type page struct {                 every page's header
 *        id       pgid     u64    0     the page's own index
 *        flags    uint16   u16    8     branch, leaf, meta, freelist
 *        count    uint16   u16   10     elements (or freelist ids)
 *        overflow uint32   u32   12     contiguous pages after this one
 *    }                           16     then the elements, the meta or the ids
 *
 *    type branchPageElement struct {    16 bytes, at 16 + 16 * i
 *        pos   uint32   +0                key at the element + pos
 *        ksize uint32   +4
 *        pgid  pgid     +8                the child's page
 *    }
 *    type leafPageElement struct {      16 bytes, at 16 + 16 * i
 *        flags uint32   +0                bucketLeafFlag: a sub-bucket
 *        pos   uint32   +4                key at the element + pos, value after it
 *        ksize uint32   +8
 *        vsize uint32  +12
 *    }
 *
 *    type meta struct {                 in pages 0 and 1, after the header
 *        magic    uint32   16           0xED0CDAED
 *        version  uint32   20           2
 *        pageSize uint32   24
 *        flags    uint32   28           0
 *        root     bucket   32           the root bucket (its root page, sequence at 40)
 *        freelist pgid     48           pgidNoFreelist: none
 *        pgid     pgid     56           pages in use: the highest id + 1
 *        txid     txid     64
 *        checksum uint64   72           FNV-1a 64 of bytes [16, 72)
 *    }
 *
 *    type bucket struct {               a sub-bucket's value begins with it
 *        root     pgid     +0           0: inline, a leaf page image follows
 *        sequence uint64   +8
 *    }                     16
 */
enum {
	BOLT_PAGE_ID = 0, BOLT_PAGE_FLAGS = 8, BOLT_PAGE_COUNT = 10, BOLT_PAGE_OVERFLOW = 12,
	BOLT_PAGE_HDR = 16,                              /* sizeof(page): where elements start */
	BOLT_ELEM = 16,                                  /* a branch or a leaf element */
	BOLT_BRANCH_POS = 0, BOLT_BRANCH_KSIZE = 4, BOLT_BRANCH_PGID = 8,
	BOLT_LEAF_FLAGS = 0, BOLT_LEAF_POS = 4, BOLT_LEAF_KSIZE = 8, BOLT_LEAF_VSIZE = 12,
	BOLT_LEAF_BUCKET = 0x01,                         /* leaf element flags: bucketLeafFlag */
	BOLT_META_MAGIC = 16, BOLT_META_VERSION = 20, BOLT_META_PAGE_SIZE = 24, BOLT_META_FLAGS = 28,
	BOLT_META_ROOT = 32, BOLT_META_FREELIST = 48, BOLT_META_PGID = 56, BOLT_META_TXID = 64,
	BOLT_META_CHECKSUM = 72,                         /* of [BOLT_META_MAGIC, BOLT_META_CHECKSUM) */
	BOLT_META_PAGES = 2,                             /* pages 0 and 1 are the metas */
	BOLT_VERSION = 2,
	BOLT_BUCKET_ROOT = 0, BOLT_BUCKET_SEQUENCE = 8,
	BOLT_BUCKET_HDR = 16,                            /* sizeof(bucket): an inline page follows */
	BOLT_OPEN_READ = 4096,                           /* Open reads this much to find meta 0, and takes it
	                                                  * as the page size when meta 0 is bad (amd64's) */
};
/* page flags: branchPageFlag, leafPageFlag, metaPageFlag, freelistPageFlag
 * (SNAP_F_: test/test.c uses these names) */
enum { SNAP_F_BRANCH = 0x01, SNAP_F_LEAF = 0x02, SNAP_F_META = 0x04, SNAP_F_FREELIST = 0x10 };
#define BOLT_MAGIC 0xED0CDAEDu
#define BOLT_NO_FREELIST UINT64_MAX /* pgidNoFreelist */
#define SNAP_ROOT_PAGE BOLT_META_PAGES /* kvd's root bucket leaf: right after the metas */

/* etcd's ten buckets, in the root bucket's (byte) order. */
static const char *const snap_bucket_names[SNAP_NBUCKETS] = {
	"alarm", "auth", "authRoles", "authUsers", "cluster", "key", "lease", "members", "members_removed", "meta",
};

#if MBEDTLS_VERSION_MAJOR >= 3
#define snap_sha256_starts mbedtls_sha256_starts
#define snap_sha256_update mbedtls_sha256_update
#define snap_sha256_finish mbedtls_sha256_finish
#else
#define snap_sha256_starts mbedtls_sha256_starts_ret
#define snap_sha256_update mbedtls_sha256_update_ret
#define snap_sha256_finish mbedtls_sha256_finish_ret
#endif

/* ---- the key bucket: etcd's records, read from the log ---------------------
 *
 * etcd's `key` bucket holds, in revision order, every record above the
 * compaction point C and, at or below it, only what compaction left: for
 * each key live at C, its newest record <= C, and (etcd 3.5.16+) the
 * tombstones at exactly C, which HashKV skips.  kvd's log holds more than
 * that until a rewrite, so the records at or below C are chosen with a map
 * of the op each key had then (snap_ops_at).  A rewritten log's BASE ops
 * carry their sub-revisions in their prev field.
 */

/* The op each index key had at rev, when it was live then (or, with tombs,
 * deleted at exactly rev), into h -- only those at or below upto, the
 * compaction point (the selection is asked of no other op); *live, if
 * asked, counts the keys live at rev.  A key unchanged since rev needs no
 * read: its op is the index's. */
static int snap_ops_at(struct kvd *k, int64_t rev, int64_t upto, struct life_map *h, int tombs, size_t *live)
{
	struct mvcc *m = &k->db;
	struct mvcc_it it = {0, 0};
	struct mvcc_key *r;
	struct mvcc_op op;
	int e;

	if (live)
		*live = 0;
	for (; (r = mvcc_at(m, it)); mvcc_next(m, &it)) {
		if (r->mod <= rev) {
			op.kind = (r->flags & MVCC_LIVE) ? MVCC_OP_PUT : MVCC_OP_DEL;
			op.rev = r->mod;
			op.off = r->op;
			e = 1;
		} else if ((e = mvcc_op_at(m, r->op, rev, &op)) < 0)
			return e;
		if (!e || (op.kind != MVCC_OP_PUT && !(tombs && op.rev == rev)))
			continue;
		if (live && op.kind == MVCC_OP_PUT)
			(*live)++;
		if (op.rev <= upto && life_map_put(k, h, op.off + 1, 1))
			return KVD_ENOMEM;
	}
	return 0;
}

struct snap_keys {
	struct mvcc_reader rd;
	struct kvd_buf win;
	struct mvcc_rec rec;
	int in_rec;                 /* rec has ops left */
	uint64_t sub;
	int64_t rev, c;             /* records up to rev; at or below c, only sel's */
	const struct life_map *sel;
};

static void snap_keys_init(struct snap_keys *it, uint64_t end, int64_t rev, int64_t c, const struct life_map *sel)
{
	memset(it, 0, sizeof *it);
	mvcc_reader_init(&it->rd, &it->win, 0, end, 1 << 16, NULL);
	it->rev = rev;
	it->c = c;
	it->sel = sel;
}

/*
 * The next record of the key bucket: 1 with its op (key and value point
 * into the reader's window until the next call) and its revision key rk
 * (*kn 17, 18 for a tombstone), 0 after the last, or a negative error.
 */
static int snap_keys_next(struct kvd *k, struct snap_keys *it, struct mvcc_op *op, uint8_t rk[18], size_t *kn)
{
	const char *why;
	uint64_t s;
	int e;

	for (;;) {
		if (!it->in_rec) {
			if ((e = mvcc_read_rec(k, &it->rd, &it->rec, &why)) != 1)
				return e;
			if (it->rec.type != MVCC_REC_TXN && it->rec.type != MVCC_REC_BASE)
				continue;
			if ((e = mvcc_rec_decode(&it->rec, &why)))
				return e;
			if (it->rec.type == MVCC_REC_TXN && it->rec.rev > it->rev) {
				it->rd.off = it->rd.end; /* revisions only grow */
				return 0;
			}
			it->in_rec = 1;
			it->sub = 0;
		}
		if ((e = mvcc_rec_op(&it->rec, op, &why)) < 0)
			return e;
		if (!e) {
			it->in_rec = 0;
			continue;
		}
		if (op->kind != MVCC_OP_PUT && op->kind != MVCC_OP_DEL)
			continue;
		s = it->rec.type == MVCC_REC_BASE ? op->prev : it->sub++;
		if (op->rev > it->rev ||
		    (it->c >= 1 && op->rev <= it->c && life_map_slot(it->sel, op->off + 1) == SIZE_MAX))
			continue; /* not in etcd's bucket */
		put_be64(rk, (uint64_t)op->rev);
		rk[8] = '_';
		put_be64(rk + 9, s);
		rk[17] = 't';
		*kn = op->kind == MVCC_OP_DEL ? 18 : 17;
		return 1;
	}
}

/* The record's value: its mvccpb.KeyValue (a tombstone holds only the key). */
static void snap_kv(Mvccpb__KeyValue *kv, const struct mvcc_op *op)
{
	mvccpb__key_value__init(kv);
	kv->key.data = (uint8_t *)(uintptr_t)op->key;
	kv->key.len = (size_t)op->klen;
	if (op->kind == MVCC_OP_PUT) {
		kv->create_revision = op->create;
		kv->mod_revision = op->rev;
		kv->version = op->ver;
		kv->value.data = (uint8_t *)(uintptr_t)op->val;
		kv->value.len = (size_t)op->vlen;
		kv->lease = op->lease;
	}
}

/* CRC-32C of the iterator's remaining records, revision key then value. */
static int snap_keys_crc(struct kvd *k, struct snap_keys *it, uint32_t *crc)
{
	struct kvd_buf kvb = {0};
	struct mvcc_op op;
	Mvccpb__KeyValue kv;
	uint8_t rk[18];
	size_t n, kn = 0; /* set by snap_keys_next; gcc -O1 cannot see it */
	int e;

	while ((e = snap_keys_next(k, it, &op, rk, &kn)) == 1) {
		snap_kv(&kv, &op);
		n = mvccpb__key_value__get_packed_size(&kv);
		kvb.len = 0;
		if (buf_reserve(k, &kvb, n)) {
			e = KVD_ENOMEM;
			break;
		}
		mvccpb__key_value__pack(&kv, kvb.p);
		*crc = mvcc_crc32c(k->crc, *crc, rk, kn);
		*crc = mvcc_crc32c(k->crc, *crc, kvb.p, n);
	}
	buf_free(k, &kvb);
	return e;
}

/*
 * etcd's HashKV at rev (0 < rev <= the current revision, above C): CRC-32C
 * over "key", then each record's key and value, of the records the bucket
 * holds up to rev -- and, when some key is live at rev, of those at or below
 * C only those keys' newest records <= rev (etcd's keep, taken at rev).
 */
static int snap_hashkv_real(struct kvd *k, int64_t rev, uint32_t *hash)
{
	struct mvcc *m = &k->db;
	struct life_map atc = {NULL, 0, 0}, atrev = {NULL, 0, 0};
	struct snap_keys it;
	int64_t c = m->compacted;
	uint32_t crc = mvcc_crc32c(k->crc, 0, "key", 3);
	size_t live = 0;
	int e;

	snap_keys_init(&it, m->size + m->w.len, rev, c, NULL);
	if (c >= 1) { /* the selection is asked only of records at or below C */
		if ((e = snap_ops_at(k, rev, c, &atrev, 0, &live)) ||
		    (!live && (e = snap_ops_at(k, c, c, &atc, 0, NULL))))
			goto out;
		it.sel = live ? &atrev : &atc;
	}
	e = snap_keys_crc(k, &it, &crc);
	*hash = crc;
out:
	kvd_free(k, atc.v);
	kvd_free(k, atrev.v);
	buf_free(k, &it.win);
	return e < 0 ? e : 0;
}

static int snap_hashkv(struct kvd *k, int64_t rev, uint32_t *hash)
{
	if (rev < 1) /* nothing at or below 0: the bucket name alone */
		return *hash = mvcc_crc32c(k->crc, 0, "key", 3), 0;
	return snap_hashkv_real(k, rev, hash);
}

/*
 * etcd 3.7 hashes the history a compaction to rev removes from -- HashKV(rev)
 * just before it, with the previous compaction point -- and keeps the last
 * 10 of them (in memory: a restart forgets them).  A later HashKV asking for
 * exactly such a revision, 0 included, is answered from here, even below the
 * compaction point.  A failed hash is not kept, as etcd's.
 */
static void snap_keep_hash(struct kvd *k, int64_t rev)
{
	struct mvcc *m = &k->db;
	uint32_t h;
	unsigned i;

	if (snap_hashkv(k, rev, &h))
		return;
	if (m->nhashes == KVD_COUNT(m->hashes)) { /* the oldest by revision goes */
		memmove(m->hashes, m->hashes + 1, (m->nhashes - 1) * sizeof m->hashes[0]);
		m->nhashes--;
	}
	for (i = m->nhashes; i > 0 && m->hashes[i - 1].rev > rev; i--)
		m->hashes[i] = m->hashes[i - 1];
	m->hashes[i].hash = h;
	m->hashes[i].compact = m->compacted;
	m->hashes[i].rev = rev;
	m->nhashes++;
}

/* ---- bbolt pages -------------------------------------------------------- */

#ifndef KVD_NO_SNAPSHOT /* @@ KVD_NO_SNAPSHOT: no snapshot files (make SNAPSHOT=0): Snapshot answers Unimplemented, --restore-snapshot and --snapshot-save are refused; Hash and HashKV serve */

/* FNV-1a 64, bbolt's meta checksum. */
static uint64_t snap_fnv64(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	while (n--)
		h = (h ^ *p++) * 0x100000001b3ull;
	return h;
}

static void snap_page_hdr(uint8_t *pg, uint64_t id, unsigned flags, unsigned count, uint32_t overflow)
{
	put_le64(pg + BOLT_PAGE_ID, id);
	put_le16(pg + BOLT_PAGE_FLAGS, flags);
	put_le16(pg + BOLT_PAGE_COUNT, count);
	put_le32(pg + BOLT_PAGE_OVERFLOW, overflow);
}

/* Meta page id (0 or 1): root bucket at page 2, no freelist, pgid pages;
 * flags and the root's sequence stay 0. */
static void snap_meta(uint8_t *pg, uint64_t id, uint64_t pgid)
{
	memset(pg, 0, SNAP_PAGE);
	snap_page_hdr(pg, id, SNAP_F_META, 0, 0);
	put_le32(pg + BOLT_META_MAGIC, BOLT_MAGIC);
	put_le32(pg + BOLT_META_VERSION, BOLT_VERSION);
	put_le32(pg + BOLT_META_PAGE_SIZE, SNAP_PAGE);
	put_le64(pg + BOLT_META_ROOT + BOLT_BUCKET_ROOT, SNAP_ROOT_PAGE);
	put_le64(pg + BOLT_META_FREELIST, BOLT_NO_FREELIST);
	put_le64(pg + BOLT_META_PGID, pgid);
	put_le64(pg + BOLT_META_TXID, SNAP_TXID - id);
	put_le64(pg + BOLT_META_CHECKSUM, snap_fnv64(pg + BOLT_META_MAGIC, BOLT_META_CHECKSUM - BOLT_META_MAGIC));
}

/* Leaf element i of a leaf whose data starts at *d: its header, its key;
 * returns where its value of vn bytes goes. */
static uint8_t *snap_leaf_elem(uint8_t *pg, unsigned i, uint8_t **d, unsigned flags, const uint8_t *key,
                               size_t kn, size_t vn)
{
	uint8_t *e = pg + BOLT_PAGE_HDR + BOLT_ELEM * (size_t)i, *v;

	put_le32(e + BOLT_LEAF_FLAGS, flags);
	put_le32(e + BOLT_LEAF_POS, (uint32_t)(*d - e));
	put_le32(e + BOLT_LEAF_KSIZE, (uint32_t)kn);
	put_le32(e + BOLT_LEAF_VSIZE, (uint32_t)vn);
	memcpy(*d, key, kn);
	v = *d + kn;
	*d = v + vn;
	return v;
}

#endif /* KVD_NO_SNAPSHOT: bbolt pages */

/* ---- the plan: buckets, leaves, branch levels ---------------------------- */

struct snap_leaf {
	uint64_t pgid;
	uint32_t n, size;           /* records; bytes of the page image */
	uint8_t key[18], kn;        /* its first key */
};

/* The tree of a big bucket: leaves in order, then branch levels above. */
struct snap_tree {
	struct snap_leaf *leaf;
	size_t nleaf, cap;
	unsigned levels;                  /* branch levels above the leaves */
	uint64_t base[SNAP_LEVELS];       /* level l >= 1: its first page */
	size_t count[SNAP_LEVELS];        /* level l: its nodes (0: leaves) */
	uint64_t root;
};

struct snap_kvref {
	uint32_t ko, kn, vo, vn;          /* in the arena */
};

struct snap_lease {
	int64_t id, ttl;
};

/* A snapshot being made: its plan, then where the stream is. */
struct snap {
	int64_t rev, c;
	uint64_t end;                     /* log bytes it reads */
	struct life_map sel;              /* each key's op at C */
	struct kvd_buf arena;             /* the small buckets' keys and values */
	struct snap_kvref *kv;            /* grows: authUsers and authRoles can be long */
	unsigned nkv;
	size_t kvcap;
	unsigned first[SNAP_NBUCKETS], n[SNAP_NBUCKETS]; /* inline buckets' entries in kv */
	struct snap_lease *lease;
	size_t nlease;
	struct snap_tree t[2];            /* SNAP_KEYS - 1, SNAP_LEASES - 1 */
	uint32_t root_size;
	uint64_t pgid;                    /* pages in the file */
	/* streaming */
	struct snap_keys it;
	unsigned stage, lvl;
	size_t idx, lease_at;             /* the next node of the level; the next lease */
	struct kvd_buf node;              /* the page image being sent */
	struct kvd_buf chunk;             /* the blob being made */
	uint64_t sent;
	mbedtls_sha256_context sha;
	unsigned planned : 1, sha_on : 1;
};

static unsigned snap_kind(unsigned b)
{
	return b == 5 ? SNAP_KEYS : b == 6 ? SNAP_LEASES : SNAP_INLINE;
}

static int snap_small(struct kvd *k, struct snap *s, unsigned b, const void *key, size_t kn, const void *val,
                      size_t vn)
{
	struct snap_kvref *r;

	if (!KVD_ALWAYS(!s->n[b] || s->first[b] + s->n[b] == s->nkv))
		return KVD_ELIMIT; /* a bucket's entries are made together */
	if (UTIL_GROW(k, s->kv, s->kvcap, (size_t)s->nkv + 1, SNAP_SMALL))
		return KVD_ENOMEM;
	if (!s->n[b])
		s->first[b] = s->nkv;
	s->n[b]++;
	r = &s->kv[s->nkv++];
	r->ko = (uint32_t)s->arena.len;
	r->kn = (uint32_t)kn;
	r->vo = (uint32_t)(s->arena.len + kn);
	r->vn = (uint32_t)vn;
	buf_append(k, &s->arena, key, kn);
	buf_append(k, &s->arena, val, vn);
	return s->arena.err ? KVD_ENOMEM : 0;
}

static int snap_cmp_kvref(const struct snap *s, const struct snap_kvref *a, const struct snap_kvref *b)
{
	int c = memcmp(s->arena.p + a->ko, s->arena.p + b->ko, KVD_MIN(a->kn, b->kn));

	return c ? c : (a->kn > b->kn) - (a->kn < b->kn);
}

static int snap_lease_cmp(const void *a, const void *b)
{
	uint64_t x = (uint64_t)((const struct snap_lease *)a)->id, y = (uint64_t)((const struct snap_lease *)b)->id;

	return (x > y) - (x < y);
}

/* leasepb.Lease {1 ID, 2 TTL} (int64s, etcd's lease.proto) and
 * AlarmMember {1 MemberID, 2 Alarm}: proto3, a zero field is not written. */
enum { SNAP_F_LEASE_ID = 1, SNAP_F_LEASE_TTL = 2, SNAP_F_ALARM_MEMBER = 1, SNAP_F_ALARM_TYPE = 2 };

/* A Lease into p (22 bytes at most); its length. */
static size_t snap_lease_val(uint8_t *p, const struct snap_lease *l)
{
	uint8_t *o = p;

	if (l->id)
		o = pb_put_uint(o, SNAP_F_LEASE_ID, (uint64_t)l->id);
	if (l->ttl)
		o = pb_put_uint(o, SNAP_F_LEASE_TTL, (uint64_t)l->ttl);
	return (size_t)(o - p);
}

/* The small buckets' content, sorted; the leases, copied and sorted. */
static int snap_content(struct kvd *k, struct snap *s)
{
	struct kvd_buf js = {0};
	struct lease *l;
	uint8_t b[32], *o;
	char hex[48];
	size_t i, j;
	unsigned x;
	int e = 0;

	s->rev = k->db.rev;
	s->c = k->db.compacted;
	s->end = k->db.size + k->db.w.len;
	for (i = 0; i < k->db.nalarms; i++) { /* alarm: AlarmMember -> empty */
		o = b;
		if (k->db.alarms[i].member)
			o = pb_put_uint(o, SNAP_F_ALARM_MEMBER, k->db.alarms[i].member);
		o = pb_put_uint(o, SNAP_F_ALARM_TYPE, k->db.alarms[i].type);
		e |= snap_small(k, s, 0, b, (size_t)(o - b), "", 0);
	}
	if (k->auth.enabled || k->auth.rev > 1) { /* etcd writes it at the first AuthEnable */
		b[0] = k->auth.enabled;
		e |= snap_small(k, s, 1, "authEnabled", 11, b, 1);
	}
	put_be64(b, k->auth.rev);
	e |= snap_small(k, s, 1, "authRevision", 12, b, 8);
	for (x = 2; x <= 3; x++) { /* authRoles, authUsers: the messages as kept, by name */
		const struct auth_tab *t = x == 2 ? &k->auth.roles : &k->auth.users;
		for (i = 0; i < t->n && !e; i++) {
			const ProtobufCBinaryData *nm = auth_name(t->v[i]);
			size_t vn = protobuf_c_message_get_packed_size(t->v[i]);
			uint8_t *v = kvd_malloc(k, vn + 1);
			if (!v)
				return KVD_ENOMEM;
			protobuf_c_message_pack(t->v[i], v);
			e |= snap_small(k, s, x, nm->data, nm->len, v, vn);
			kvd_free(k, v);
		}
	}
	e |= snap_small(k, s, 4, "clusterVersion", 14, KVD_ETCD_CLUSTER, strlen(KVD_ETCD_CLUSTER));
	json_put_raw(k, &js, "{\"id\":");
	snprintf(hex, sizeof hex, "%llu", (unsigned long long)k->member_id);
	json_put_raw(k, &js, hex);
	json_put_raw(k, &js, ",\"peerURLs\":[");
	for (x = 0; x < k->npeer_urls; x++) {
		if (x)
			json_put_raw(k, &js, ",");
		json_put_str(k, &js, k->peer_urls[x], strlen(k->peer_urls[x]));
	}
	json_put_raw(k, &js, "]");
	if (k->cfg.name && k->cfg.name[0]) {
		json_put_raw(k, &js, ",\"name\":");
		json_put_str(k, &js, k->cfg.name, strlen(k->cfg.name));
	}
	if (k->nclient_urls) {
		json_put_raw(k, &js, ",\"clientURLs\":[");
		for (x = 0; x < k->nclient_urls; x++) {
			if (x)
				json_put_raw(k, &js, ",");
			json_put_str(k, &js, k->client_urls[x], strlen(k->client_urls[x]));
		}
		json_put_raw(k, &js, "]");
	}
	json_put_raw(k, &js, "}");
	snprintf(hex, sizeof hex, "%llx", (unsigned long long)k->member_id);
	e |= js.err ? KVD_ENOMEM : snap_small(k, s, 7, hex, strlen(hex), js.p, js.len);
	buf_free(k, &js);
	put_be64(b, (uint64_t)s->rev);
	e |= snap_small(k, s, 9, "consistent_index", 16, b, 8);
	put_be64(b, SVC_RAFT_TERM); /* etcd 3.5+: with every consistent_index */
	e |= snap_small(k, s, 9, "term", 4, b, 8);
	e |= snap_small(k, s, 9, "storageVersion", 14, KVD_ETCD_CLUSTER, strlen(KVD_ETCD_CLUSTER));
	snprintf(hex, sizeof hex, "{\"voters\":[%llu]}", (unsigned long long)k->member_id);
	e |= snap_small(k, s, 9, "confState", 9, hex, strlen(hex)); /* etcd 3.7's json of raftpb.ConfState */
	if (s->c >= 1) {
		put_be64(b, (uint64_t)s->c);
		b[8] = '_';
		put_be64(b + 9, 0);
		e |= snap_small(k, s, 9, "finishedCompactRev", 18, b, 17);
		e |= snap_small(k, s, 9, "scheduledCompactRev", 19, b, 17);
	}
	if (e)
		return e < 0 ? KVD_ENOMEM : e;
	for (x = 0; x < SNAP_NBUCKETS; x++) /* few entries: insertion sort */
		for (i = s->first[x] + 1; i < s->first[x] + s->n[x]; i++)
			for (j = i; j > s->first[x] && snap_cmp_kvref(s, &s->kv[j - 1], &s->kv[j]) > 0; j--) {
				struct snap_kvref t = s->kv[j];
				s->kv[j] = s->kv[j - 1];
				s->kv[j - 1] = t;
			}
	if (k->lease.n && !(s->lease = kvd_malloc(k, k->lease.n * sizeof *s->lease)))
		return KVD_ENOMEM;
	for (i = 0; k->lease.tab && i <= k->lease.mask; i++)
		for (l = k->lease.tab[i]; l && s->nlease < k->lease.n; l = l->hnext) {
			s->lease[s->nlease].id = l->id;
			s->lease[s->nlease++].ttl = l->ttl;
		}
	if (s->nlease)
		qsort(s->lease, s->nlease, sizeof *s->lease, snap_lease_cmp);
	return 0;
}

#ifndef KVD_NO_SNAPSHOT /* the file's plan; Hash needs only the content */
/* Plan one record of kn + vn bytes into tree t. */
static int snap_tree_add(struct kvd *k, struct snap_tree *t, const uint8_t *key, size_t kn, size_t vn)
{
	size_t esz = BOLT_ELEM + kn + vn;
	struct snap_leaf *l = t->nleaf ? &t->leaf[t->nleaf - 1] : NULL;

	if (vn > UINT32_MAX - 64)
		return KVD_ELIMIT;
	if (!l || (l->n && (uint64_t)l->size + esz > SNAP_PAGE)) {
		if (UTIL_GROW(k, t->leaf, t->cap, t->nleaf + 1, 64))
			return KVD_ENOMEM;
		l = &t->leaf[t->nleaf++];
		memset(l, 0, sizeof *l);
		l->size = BOLT_PAGE_HDR;
	}
	if (!l->n) {
		memcpy(l->key, key, kn);
		l->kn = (uint8_t)kn;
	}
	l->n++;
	l->size += (uint32_t)esz;
	return 0;
}

/* Number the tree's pages from *pgid: leaves, then each branch level. */
static int snap_tree_end(struct kvd *k, struct snap_tree *t, uint64_t *pgid)
{
	size_t i;
	unsigned l;

	if (!t->nleaf) { /* an empty bucket: one empty leaf */
		if (!(t->leaf = kvd_calloc(k, sizeof *t->leaf)))
			return KVD_ENOMEM;
		t->nleaf = t->cap = 1;
		t->leaf[0].size = BOLT_PAGE_HDR;
	}
	for (i = 0; i < t->nleaf; i++) {
		t->leaf[i].pgid = *pgid;
		*pgid += (t->leaf[i].size + SNAP_PAGE - 1) / SNAP_PAGE;
	}
	t->count[0] = t->nleaf;
	for (l = 0; t->count[l] > 1; l++) {
		if (l + 1 >= SNAP_LEVELS)
			return KVD_ELIMIT;
		t->count[l + 1] = (t->count[l] + SNAP_FANOUT - 1) / SNAP_FANOUT;
		t->base[l + 1] = *pgid;
		*pgid += t->count[l + 1];
	}
	t->levels = l;
	t->root = l ? t->base[l] : t->leaf[0].pgid;
	return 0;
}

static size_t snap_records(const struct snap_tree *t)
{
	size_t i, n = 0;

	for (i = 0; i < t->nleaf; i++)
		n += t->leaf[i].n;
	return n;
}

/* Bytes of bucket b's value in the root leaf. */
static size_t snap_bucket_size(const struct snap *s, unsigned b)
{
	size_t n = BOLT_BUCKET_HDR, i;

	if (snap_kind(b) != SNAP_INLINE)
		return BOLT_BUCKET_HDR;
	n += BOLT_PAGE_HDR; /* an inline leaf page's header */
	for (i = s->first[b]; i < s->first[b] + s->n[b]; i++)
		n += BOLT_ELEM + s->kv[i].kn + s->kv[i].vn;
	return n;
}

/* The whole plan: content, the key bucket's leaves (a pass over the log),
 * the leases' leaves, every page number. */
static int snap_plan(struct kvd *k, struct snap *s)
{
	struct snap_keys it;
	struct mvcc_op op;
	Mvccpb__KeyValue kv;
	uint8_t rk[18], lk[8], lv[24];
	size_t kn, i;
	unsigned b;
	int e;
	int64_t t0 = util_now_ms();

	if ((e = snap_content(k, s)))
		return e;
	if (s->c >= 1 && (e = snap_ops_at(k, s->c, s->c, &s->sel, 1, NULL)))
		return e;
	snap_keys_init(&it, s->end, s->rev, s->c, &s->sel);
	while ((e = snap_keys_next(k, &it, &op, rk, &kn)) == 1) {
		snap_kv(&kv, &op);
		if ((e = snap_tree_add(k, &s->t[0], rk, kn, mvccpb__key_value__get_packed_size(&kv))))
			break;
	}
	buf_free(k, &it.win);
	if (e)
		return e;
	for (i = 0; i < s->nlease; i++) {
		put_be64(lk, (uint64_t)s->lease[i].id);
		if ((e = snap_tree_add(k, &s->t[1], lk, 8, snap_lease_val(lv, &s->lease[i]))))
			return e;
	}
	s->root_size = BOLT_PAGE_HDR;
	for (b = 0; b < SNAP_NBUCKETS; b++)
		s->root_size += (uint32_t)(BOLT_ELEM + strlen(snap_bucket_names[b]) + snap_bucket_size(s, b));
	s->pgid = SNAP_ROOT_PAGE + (s->root_size + SNAP_PAGE - 1) / SNAP_PAGE;
	if ((e = snap_tree_end(k, &s->t[0], &s->pgid)) || (e = snap_tree_end(k, &s->t[1], &s->pgid)))
		return e;
	snap_keys_init(&s->it, s->end, s->rev, s->c, &s->sel);
	s->planned = 1;
	kvd_log(k, KVD_LOG_INFO, "snapshot at revision %lld: %llu bytes, %zu key records in %zu leaves, %zu leases "
	        "(planned in %lld ms)", (long long)s->rev, (unsigned long long)s->pgid * SNAP_PAGE,
	        snap_records(&s->t[0]), s->t[0].nleaf, s->nlease, (long long)(util_now_ms() - t0));
	return 0;
}
#endif

static void snap_free(struct kvd *k, struct snap *s)
{
	kvd_free(k, s->sel.v);
	kvd_free(k, s->kv);
	buf_free(k, &s->arena);
	kvd_free(k, s->lease);
	kvd_free(k, s->t[0].leaf);
	kvd_free(k, s->t[1].leaf);
	buf_free(k, &s->it.win);
	buf_free(k, &s->node);
	buf_free(k, &s->chunk);
	if (s->sha_on)
		mbedtls_sha256_free(&s->sha);
	kvd_free(k, s);
}

/* ---- page images ------------------------------------------------------------ */

#ifndef KVD_NO_SNAPSHOT

/* Room for a node of size bytes, whole pages, zeroed. */
static uint8_t *snap_node(struct kvd *k, struct snap *s, size_t size)
{
	size_t n = (size + SNAP_PAGE - 1) / SNAP_PAGE * SNAP_PAGE;

	s->node.rd = s->node.len = 0;
	if (buf_reserve(k, &s->node, n))
		return NULL;
	memset(s->node.p, 0, n);
	s->node.len = n;
	return s->node.p;
}

static void snap_root(const struct snap *s, uint8_t *pg)
{
	uint8_t *d = pg + BOLT_PAGE_HDR + BOLT_ELEM * SNAP_NBUCKETS, *v, *ip, *id;
	const struct snap_kvref *r;
	unsigned b, i;

	snap_page_hdr(pg, SNAP_ROOT_PAGE, SNAP_F_LEAF, SNAP_NBUCKETS, (s->root_size - 1) / SNAP_PAGE);
	for (b = 0; b < SNAP_NBUCKETS; b++) {
		v = snap_leaf_elem(pg, b, &d, BOLT_LEAF_BUCKET, (const uint8_t *)snap_bucket_names[b],
		                   strlen(snap_bucket_names[b]), snap_bucket_size(s, b));
		if (snap_kind(b) != SNAP_INLINE) { /* {root page, sequence 0} */
			put_le64(v + BOLT_BUCKET_ROOT, s->t[snap_kind(b) - 1].root);
			continue;
		}
		ip = v + BOLT_BUCKET_HDR; /* an inline leaf: root 0, then the page image */
		snap_page_hdr(ip, 0, SNAP_F_LEAF, s->n[b], 0);
		id = ip + BOLT_PAGE_HDR + BOLT_ELEM * (size_t)s->n[b];
		for (i = 0; i < s->n[b]; i++) {
			r = &s->kv[s->first[b] + i];
			v = snap_leaf_elem(ip, i, &id, 0, s->arena.p + r->ko, r->kn, r->vn);
			memcpy(v, s->arena.p + r->vo, r->vn);
		}
	}
}

/* Branch node j of level l (>= 1): its children's first keys and pages. */
static void snap_branch(const struct snap_tree *t, unsigned l, size_t j, uint8_t *pg)
{
	size_t span = 1, first = j * SNAP_FANOUT, n = KVD_MIN((size_t)SNAP_FANOUT, t->count[l - 1] - first), i;
	uint8_t *e = pg + BOLT_PAGE_HDR, *d = pg + BOLT_PAGE_HDR + BOLT_ELEM * n;
	unsigned x;

	for (x = 1; x < l; x++)
		span *= SNAP_FANOUT;
	snap_page_hdr(pg, t->base[l] + j, SNAP_F_BRANCH, (unsigned)n, 0);
	for (i = 0; i < n; i++, e += BOLT_ELEM) {
		const struct snap_leaf *f = &t->leaf[(first + i) * span];
		put_le32(e + BOLT_BRANCH_POS, (uint32_t)(d - e));
		put_le32(e + BOLT_BRANCH_KSIZE, f->kn);
		put_le64(e + BOLT_BRANCH_PGID, l == 1 ? t->leaf[first + i].pgid : t->base[l - 1] + first + i);
		memcpy(d, f->key, f->kn);
		d += f->kn;
	}
}

/* Leaf j of the key bucket, from the log, checked against its plan. */
static int snap_key_leaf(struct kvd *k, struct snap *s, size_t j, uint8_t *pg)
{
	const struct snap_leaf *lf = &s->t[0].leaf[j];
	uint8_t *d = pg + BOLT_PAGE_HDR + BOLT_ELEM * (size_t)lf->n, *v, rk[18];
	uint8_t *end = pg + s->node.len;
	struct mvcc_op op;
	Mvccpb__KeyValue kv;
	size_t kn, vn;
	uint32_t i;
	int e;

	snap_page_hdr(pg, lf->pgid, SNAP_F_LEAF, lf->n, (lf->size - 1) / SNAP_PAGE);
	for (i = 0; i < lf->n; i++) {
		if ((e = snap_keys_next(k, &s->it, &op, rk, &kn)) != 1)
			return e < 0 ? e : KVD_ECORRUPT;
		snap_kv(&kv, &op);
		vn = mvccpb__key_value__get_packed_size(&kv);
		if ((size_t)(end - d) < kn + vn || (i == 0 && (kn != lf->kn || memcmp(rk, lf->key, kn))))
			return KVD_ECORRUPT;
		v = snap_leaf_elem(pg, i, &d, 0, rk, kn, vn);
		mvccpb__key_value__pack(&kv, v);
	}
	return (size_t)(d - pg) == lf->size ? 0 : KVD_ECORRUPT;
}

static void snap_lease_leaf(struct snap *s, size_t j, uint8_t *pg)
{
	const struct snap_leaf *lf = &s->t[1].leaf[j];
	uint8_t *d = pg + BOLT_PAGE_HDR + BOLT_ELEM * (size_t)lf->n, *v, lk[8], lv[24];
	size_t vn;
	uint32_t i;

	snap_page_hdr(pg, lf->pgid, SNAP_F_LEAF, lf->n, (lf->size - 1) / SNAP_PAGE);
	for (i = 0; i < lf->n; i++, s->lease_at++) {
		put_be64(lk, (uint64_t)s->lease[s->lease_at].id);
		vn = snap_lease_val(lv, &s->lease[s->lease_at]);
		v = snap_leaf_elem(pg, i, &d, 0, lk, 8, vn);
		memcpy(v, lv, vn);
	}
}

/*
 * The next page image into s->node: stages are the two metas, the root,
 * then for each tree its leaves and branch levels.  1 made, 0 after the
 * last page, or a negative error.
 */
enum { SNAP_S_META0, SNAP_S_META1, SNAP_S_ROOT, SNAP_S_KEYS, SNAP_S_LEASES, SNAP_S_DONE, SNAP_S_SENT };
static int snap_next_node(struct kvd *k, struct snap *s)
{
	struct snap_tree *t;
	uint8_t *pg;
	int e;

	switch (s->stage) {
	case SNAP_S_META0:
	case SNAP_S_META1:
		if (!(pg = snap_node(k, s, SNAP_PAGE)))
			return KVD_ENOMEM;
		snap_meta(pg, s->stage, s->pgid);
		s->stage++;
		return 1;
	case SNAP_S_ROOT:
		if (!(pg = snap_node(k, s, s->root_size)))
			return KVD_ENOMEM;
		snap_root(s, pg);
		s->stage++;
		s->lvl = 0;
		s->idx = 0;
		return 1;
	case SNAP_S_KEYS:
	case SNAP_S_LEASES:
		t = &s->t[s->stage - SNAP_S_KEYS];
		if (s->idx == t->count[s->lvl]) { /* the next level, or the next stage */
			s->idx = 0;
			if (++s->lvl > t->levels) {
				s->lvl = 0;
				s->stage++;
			}
			return snap_next_node(k, s);
		}
		if (s->lvl) {
			if (!(pg = snap_node(k, s, SNAP_PAGE)))
				return KVD_ENOMEM;
			snap_branch(t, s->lvl, s->idx, pg);
		} else {
			if (!(pg = snap_node(k, s, t->leaf[s->idx].size)))
				return KVD_ENOMEM;
			if (s->stage == SNAP_S_LEASES)
				snap_lease_leaf(s, s->idx, pg);
			else if ((e = snap_key_leaf(k, s, s->idx, pg)))
				return e;
		}
		s->idx++;
		return 1;
	}
	return 0;
}

/* ---- the stream ---------------------------------------------------------- */

/*
 * The next piece of the file: a blob of up to 32 KiB (*remaining: the file's
 * bytes still to come after it), then the 32-byte SHA-256 of the file
 * (*remaining 0, *last set).  1 with a piece, 0 after the digest, or a
 * negative error.  The pieces stay valid until the next call.
 */
static int snap_chunk(struct kvd *k, struct snap *s, const uint8_t **p, size_t *n, uint64_t *remaining, int *last)
{
	size_t m;
	int e;

	*last = 0;
	if (s->stage == SNAP_S_SENT)
		return 0;
	if (!s->planned) {
		if ((e = snap_plan(k, s)))
			return e;
		mbedtls_sha256_init(&s->sha);
		s->sha_on = 1;
		snap_sha256_starts(&s->sha, 0);
	}
	s->chunk.rd = s->chunk.len = 0;
	if (buf_reserve(k, &s->chunk, SNAP_CHUNK))
		return KVD_ENOMEM;
	while (s->chunk.len < SNAP_CHUNK) {
		if (!BUF_LEN(&s->node) && (e = snap_next_node(k, s)) <= 0) {
			if (e < 0)
				return e;
			break;
		}
		m = KVD_MIN(BUF_LEN(&s->node), SNAP_CHUNK - s->chunk.len);
		memcpy(s->chunk.p + s->chunk.len, BUF_DATA(&s->node), m);
		s->chunk.len += m;
		s->node.rd += m;
	}
	if (s->chunk.len) {
		snap_sha256_update(&s->sha, s->chunk.p, s->chunk.len);
		s->sent += s->chunk.len;
	} else {
		if (!KVD_ALWAYS(s->sent == s->pgid * SNAP_PAGE))
			return KVD_ECORRUPT;
		snap_sha256_finish(&s->sha, s->chunk.p);
		s->chunk.len = 32;
		s->stage = SNAP_S_SENT;
		*last = 1;
	}
	*p = s->chunk.p;
	*n = s->chunk.len;
	*remaining = s->pgid * SNAP_PAGE - s->sent;
	return 1;
}

/* The next messages of a snapshot stream into c, as etcd sends them:
 * 1 more to come, 0 when the last (the SHA-256) is queued, or an error. */
static int snap_produce(struct kvd *k, struct snap *s, struct call *c)
{
	Etcdserverpb__SnapshotResponse rs = ETCDSERVERPB__SNAPSHOT_RESPONSE__INIT;
	const uint8_t *p;
	uint64_t rem;
	size_t n;
	int e, last;

	if ((e = snap_chunk(k, s, &p, &n, &rem, &last)) <= 0)
		return e;
	rs.remaining_bytes = rem;
	rs.version = (char *)KVD_ETCD_CLUSTER; /* the storage version, on every message (etcd 3.6+) */
	rs.blob.data = (uint8_t *)(uintptr_t)p;
	rs.blob.len = n;
	if (call_send(k, c, &rs.base))
		return KVD_ENOMEM;
	return last ? 0 : 1;
}

/* The whole file into fd, trailer included (--snapshot-save, the tests). */
static int snap_save_fd(struct kvd *k, int fd)
{
	struct snap *s = kvd_calloc(k, sizeof *s);
	const uint8_t *p;
	uint64_t rem;
	size_t n;
	ssize_t w;
	int e, last;

	if (!s)
		return KVD_ENOMEM;
	while ((e = snap_chunk(k, s, &p, &n, &rem, &last)) == 1)
		while (n) {
			if ((w = write(fd, p, n)) > 0) {
				p += w;
				n -= (size_t)w;
			} else if (w == 0 || errno != EINTR) {
				e = KVD_EIO;
				goto out;
			}
		}
out:
	snap_free(k, s);
	return e;
}

/*
 * --snapshot-save FILE: the data dir's store as an etcd snapshot file (what
 * `etcdctl snapshot save` would get), without serving: a board's backup.
 * The data dir lock keeps a running kvd off it meanwhile.
 */
static int snap_save_offline(const struct kvd_config *cfg, char *err, size_t errlen)
{
	struct kvd *k = NULL;
	char tmp[PATH_MAX];
	int fd = -1, e;

	snprintf(tmp, sizeof tmp, "%s.part", cfg->snapshot_save);
	if ((e = kvd_init(cfg, &k, err, errlen)) || (e = cfg_lock(k, err, errlen)) || (e = mvcc_open(k, err, errlen)))
		goto out;
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0) {
		snprintf(err, errlen, "cannot create %.200s: %s", tmp, strerror(errno));
		e = KVD_EIO;
		goto out;
	}
	if ((e = snap_save_fd(k, fd)) || fsync(fd) || close(fd) || rename(tmp, cfg->snapshot_save)) {
		snprintf(err, errlen, "%.200s: %s", cfg->snapshot_save,
		         e == KVD_ENOMEM ? "out of memory" : e ? "cannot read the log or write the file" : strerror(errno));
		e = e ? e : KVD_EIO;
		fd = -1;
		unlink(tmp);
		goto out;
	}
	fd = -1;
	kvd_log(k, KVD_LOG_INFO, "saved a snapshot of revision %lld to %s", (long long)k->db.rev, cfg->snapshot_save);
out:
	if (fd >= 0) {
		close(fd);
		unlink(tmp);
	}
	kvd_close(k);
	return e;
}

#endif /* KVD_NO_SNAPSHOT: page images, the stream */

/* etcd 3.7's DefaultIgnores: meta keys that change without a client. */
static int snap_hash_ignores(const uint8_t *key, size_t n)
{
	return (n == 16 && !memcmp(key, "consistent_index", 16)) || (n == 4 && !memcmp(key, "term", 4)) ||
	       (n == 14 && !memcmp(key, "storageVersion", 14));
}

/* etcd's Maintenance.Hash of the snapshot kvd would send now: CRC-32C over
 * each bucket's name, then its keys and values, but meta's ignored three. */
static int snap_hash(struct kvd *k, uint32_t *hash)
{
	struct snap *s = kvd_calloc(k, sizeof *s);
	struct snap_keys it;
	uint32_t crc = 0;
	uint8_t rk[18], lv[24];
	size_t i;
	unsigned b;
	int e;

	if (!s)
		return KVD_ENOMEM;
	snap_keys_init(&it, 0, 0, 0, NULL);
	if ((e = snap_content(k, s)) || (s->c >= 1 && (e = snap_ops_at(k, s->c, s->c, &s->sel, 1, NULL))))
		goto out;
	for (b = 0; b < SNAP_NBUCKETS; b++) {
		crc = mvcc_crc32c(k->crc, crc, snap_bucket_names[b], strlen(snap_bucket_names[b]));
		if (snap_kind(b) == SNAP_INLINE) {
			for (i = s->first[b]; i < s->first[b] + s->n[b]; i++) {
				const struct snap_kvref *r = &s->kv[i];
				if (b == 9 && snap_hash_ignores(s->arena.p + r->ko, r->kn))
					continue;
				crc = mvcc_crc32c(k->crc, crc, s->arena.p + r->ko, r->kn);
				crc = mvcc_crc32c(k->crc, crc, s->arena.p + r->vo, r->vn);
			}
		} else if (snap_kind(b) == SNAP_LEASES) {
			for (i = 0; i < s->nlease; i++) {
				put_be64(rk, (uint64_t)s->lease[i].id);
				crc = mvcc_crc32c(k->crc, crc, rk, 8);
				crc = mvcc_crc32c(k->crc, crc, lv, snap_lease_val(lv, &s->lease[i]));
			}
		} else {
			snap_keys_init(&it, s->end, s->rev, s->c, &s->sel);
			if ((e = snap_keys_crc(k, &it, &crc)))
				goto out;
		}
	}
	*hash = crc;
out:
	buf_free(k, &it.win);
	snap_free(k, s);
	return e < 0 ? e : 0;
}

/* ===== 15. etcd's backend: snapshots read and imported (snap_) =========== */

#ifndef KVD_NO_SNAPSHOT

/*
 * A snapshot import, end to end: kvd_open (section 37) -> snap_restore
 * -> snap_import_mem (the SHA-256 trailer) -> snap_file_open (both metas,
 * snap_meta_ok) -> snap_file_walk (bounded) -> snap_imp_key (revisions
 * into BASE and TXN records) -> snap_imp_apply (mvcc_replay_record, section
 * 10) -> snap_imp_write (fdatasync), renamed to kvd.log.
 */

/*
 * `kvd --restore-snapshot FILE` makes a new store from an etcd snapshot (3.4
 * to 3.7, or one kvd made).  The file is hostile until proven otherwise: the
 * reader checks both metas (magic, version, FNV checksum), takes the page
 * size and page count from the valid one with the higher txid and refuses a
 * count the file cannot hold; every page it follows must lie in
 * [2, pgid), name itself in its header, be a branch or a leaf, and not have
 * been reached before (a bit per page: no cycle, no shared subtree), trees
 * are at most 32 deep, every element lies inside its node, and keys rise
 * strictly.  Nothing is trusted about sizes beyond the node that holds them.
 *
 * What etcd's buckets say becomes log records, written to kvd.log.import
 * and replayed into a scratch index as they are made -- the log's own
 * replay checks each one (chains, leases, revisions) -- then made durable
 * and renamed to kvd.log.  The records at or below the compaction point C
 * (for each key live at C, its newest record) become BASE records at C,
 * with their sub-revisions, and a COMPACT at C follows them; then every
 * record above C becomes the TXN of its revision (they must run without a
 * gap), tombstones as deletes.  Leases in the `lease` bucket are granted
 * first; a lease only history names is granted where first used and
 * revoked at the end.  Users and roles (auth, authUsers, authRoles) become
 * one whole-state AUTH record, and a compaction etcd had scheduled but not
 * finished (scheduledCompactRev) is done last.  The alarm, members and
 * cluster buckets are not imported.
 *
 * Invariants:
 *   1. Nothing is read outside what the walk checked: a page lies in
 *      [2, pgid), names itself, keeps its overflow pages below pgid and is
 *      reached once (snap_file_node); an element lies inside its node
 *      (snap_file_elem); trees are walked without recursion, at most
 *      SNAP_MAX_DEPTH deep, keys rising strictly (snap_file_walk).
 *   2. Every record the import makes is replayed by the log's own code as
 *      it is made (snap_imp_apply -> mvcc_replay_record): it cannot write
 *      a log kvd would refuse to open.
 *   3. A live store is never touched: a data dir whose kvd.log holds
 *      anything is refused, and the new log, written as kvd.log.import and
 *      fdatasynced, becomes kvd.log by one rename only when whole; on any
 *      failure it is unlinked and nothing is imported (snap_restore).
 *   4. The SHA-256 trailer must match unless --skip-hash-check says
 *      otherwise (snap_import_mem); revisions above C run without a gap,
 *      sub-revisions in order (snap_imp_key).
 */

#define SNAP_MAX_DEPTH 32

struct snap_file {
	const uint8_t *p;
	uint64_t n;                 /* bytes of pages (the trailer cut off) */
	uint32_t ps;                /* page size */
	uint64_t pgid, root;        /* pages; the root bucket's page */
	uint8_t *seen;              /* a bit per page reached */
	const char *why;
};

/* A node: its image (with overflow pages), flags and element count. */
struct snap_nd {
	const uint8_t *p;
	uint64_t n;
	unsigned flags, count;
};

static int snap_meta_ok(const uint8_t *pg)
{
	return get_le32(pg + BOLT_META_MAGIC) == BOLT_MAGIC && get_le32(pg + BOLT_META_VERSION) == BOLT_VERSION &&
	       get_le64(pg + BOLT_META_CHECKSUM) == snap_fnv64(pg + BOLT_META_MAGIC, BOLT_META_CHECKSUM - BOLT_META_MAGIC);
}

static int snap_file_open(struct kvd *k, struct snap_file *f, const uint8_t *p, uint64_t n)
{
	uint64_t txid = 0;
	uint32_t ps = BOLT_OPEN_READ;
	unsigned i;
	int have = 0;

	memset(f, 0, sizeof *f);
	f->p = p;
	f->n = n;
	f->why = "not a bbolt file: too small";
	if (n < BOLT_OPEN_READ)
		return KVD_ECORRUPT;
	if (snap_meta_ok(p))
		ps = get_le32(p + BOLT_META_PAGE_SIZE);
	f->why = "bad page size";
	if (ps < 1024 || ps > 65536 || (ps & (ps - 1)))
		return KVD_ECORRUPT;
	f->why = "file size too small";
	if (n < BOLT_META_PAGES * (uint64_t)ps)
		return KVD_ECORRUPT;
	for (i = 0; i < BOLT_META_PAGES; i++) {
		const uint8_t *pg = p + (size_t)i * ps;
		if (!snap_meta_ok(pg) || get_le32(pg + BOLT_META_PAGE_SIZE) != ps ||
		    (have && get_le64(pg + BOLT_META_TXID) <= txid))
			continue;
		have = 1;
		txid = get_le64(pg + BOLT_META_TXID);
		f->root = get_le64(pg + BOLT_META_ROOT + BOLT_BUCKET_ROOT);
		f->pgid = get_le64(pg + BOLT_META_PGID);
	}
	f->ps = ps;
	f->why = "no valid meta page";
	if (!have)
		return KVD_ECORRUPT;
	f->why = "the meta page counts more pages than the file holds";
	if (f->pgid < BOLT_META_PAGES + 1 || f->pgid > n / ps)
		return KVD_ECORRUPT;
	f->why = "bad root page";
	if (f->root < BOLT_META_PAGES || f->root >= f->pgid)
		return KVD_ECORRUPT;
	f->why = "out of memory";
	if (!(f->seen = kvd_calloc(k, (size_t)(f->pgid / 8 + 1))))
		return KVD_ENOMEM;
	return 0;
}

/* Page id's node, checked, its pages marked reached. */
static int snap_file_node(struct snap_file *f, uint64_t id, struct snap_nd *nd)
{
	const uint8_t *pg;
	uint64_t ovf, j;

	f->why = "a page id out of range";
	if (id < BOLT_META_PAGES || id >= f->pgid)
		return KVD_ECORRUPT;
	pg = f->p + id * f->ps;
	ovf = get_le32(pg + BOLT_PAGE_OVERFLOW);
	f->why = "a page header names another page";
	if (get_le64(pg + BOLT_PAGE_ID) != id)
		return KVD_ECORRUPT;
	f->why = "overflow pages past the last page";
	if (ovf >= f->pgid - id)
		return KVD_ECORRUPT;
	f->why = "a page reached twice";
	for (j = id; j <= id + ovf; j++) {
		if (f->seen[j / 8] & (1u << (j % 8)))
			return KVD_ECORRUPT;
		f->seen[j / 8] |= (uint8_t)(1u << (j % 8));
	}
	nd->p = pg;
	nd->n = (ovf + 1) * f->ps;
	nd->flags = get_le16(pg + BOLT_PAGE_FLAGS);
	nd->count = get_le16(pg + BOLT_PAGE_COUNT);
	f->why = "a page that is neither branch nor leaf in a tree";
	if (nd->flags != SNAP_F_BRANCH && nd->flags != SNAP_F_LEAF)
		return KVD_ECORRUPT;
	f->why = "more elements than the page holds";
	return BOLT_PAGE_HDR + BOLT_ELEM * (uint64_t)nd->count <= nd->n ? 0 : KVD_ECORRUPT;
}

/* Element i of nd: key, and value (leaf: flags too) or child (branch). */
static int snap_file_elem(struct snap_file *f, const struct snap_nd *nd, unsigned i, const uint8_t **key, size_t *kn,
                          const uint8_t **val, size_t *vn, uint64_t *child, uint32_t *flags)
{
	const uint8_t *e = nd->p + BOLT_PAGE_HDR + BOLT_ELEM * (size_t)i;
	uint64_t at, ks, vs = 0;

	if (nd->flags == SNAP_F_BRANCH) {
		at = BOLT_PAGE_HDR + BOLT_ELEM * (uint64_t)i + get_le32(e + BOLT_BRANCH_POS);
		ks = get_le32(e + BOLT_BRANCH_KSIZE);
		*child = get_le64(e + BOLT_BRANCH_PGID);
		*flags = 0;
	} else {
		*flags = get_le32(e + BOLT_LEAF_FLAGS);
		at = BOLT_PAGE_HDR + BOLT_ELEM * (uint64_t)i + get_le32(e + BOLT_LEAF_POS);
		ks = get_le32(e + BOLT_LEAF_KSIZE);
		vs = get_le32(e + BOLT_LEAF_VSIZE);
	}
	f->why = "an element outside its page";
	if (at > nd->n || ks > nd->n - at || vs > nd->n - at - ks)
		return KVD_ECORRUPT;
	f->why = "an empty key";
	if (!ks)
		return KVD_ECORRUPT;
	*key = nd->p + at;
	*kn = (size_t)ks;
	*val = nd->p + at + ks;
	*vn = (size_t)vs;
	return 0;
}

typedef int snap_visit_fn(struct kvd *k, void *arg, const uint8_t *key, size_t kn, const uint8_t *val, size_t vn,
                          uint32_t flags);

/* Every leaf element of the bucket whose value is bv[0..bn), in order. */
static int snap_file_walk(struct kvd *k, struct snap_file *f, const uint8_t *bv, size_t bn, snap_visit_fn *fn,
                          void *arg)
{
	struct {
		struct snap_nd nd;
		unsigned i;
	} st[SNAP_MAX_DEPTH];
	struct kvd_buf prev = {0};
	const uint8_t *key, *val;
	size_t kn, vn;
	uint64_t child;
	uint32_t flags;
	unsigned depth = 1;
	int e = KVD_ECORRUPT, c;

	f->why = "a bucket value too short";
	if (bn < BOLT_BUCKET_HDR)
		return KVD_ECORRUPT;
	if (!get_le64(bv + BOLT_BUCKET_ROOT)) { /* inline: a leaf page image after the header */
		st[0].nd.p = bv + BOLT_BUCKET_HDR;
		st[0].nd.n = bn - BOLT_BUCKET_HDR;
		f->why = "a bad inline bucket";
		if (st[0].nd.n < BOLT_PAGE_HDR)
			return KVD_ECORRUPT;
		st[0].nd.flags = get_le16(st[0].nd.p + BOLT_PAGE_FLAGS);
		st[0].nd.count = get_le16(st[0].nd.p + BOLT_PAGE_COUNT);
		if (st[0].nd.flags != SNAP_F_LEAF || BOLT_PAGE_HDR + BOLT_ELEM * (uint64_t)st[0].nd.count > st[0].nd.n)
			return KVD_ECORRUPT;
	} else if ((e = snap_file_node(f, get_le64(bv + BOLT_BUCKET_ROOT), &st[0].nd))) {
		return e;
	}
	st[0].i = 0;
	while (depth) {
		struct snap_nd *nd = &st[depth - 1].nd;
		if (st[depth - 1].i == nd->count) {
			depth--;
			continue;
		}
		if ((e = snap_file_elem(f, nd, st[depth - 1].i++, &key, &kn, &val, &vn, &child, &flags)))
			goto out;
		if (nd->flags == SNAP_F_BRANCH) {
			f->why = "a tree too deep";
			if (depth == SNAP_MAX_DEPTH) {
				e = KVD_ECORRUPT;
				goto out;
			}
			if ((e = snap_file_node(f, child, &st[depth].nd)))
				goto out;
			st[depth++].i = 0;
			continue;
		}
		c = prev.len ? memcmp(prev.p, key, KVD_MIN(prev.len, kn)) : -1;
		f->why = "keys out of order";
		if (c > 0 || (c == 0 && prev.len >= kn)) {
			e = KVD_ECORRUPT;
			goto out;
		}
		prev.len = 0;
		if (buf_append(k, &prev, key, kn)) {
			f->why = "out of memory";
			e = KVD_ENOMEM;
			goto out;
		}
		if ((e = fn(k, arg, key, kn, val, vn, flags)))
			goto out;
	}
	e = 0;
out:
	buf_free(k, &prev);
	return e;
}

/* The import: the new log being written, and what it must still say. */
struct snap_imp {
	struct snap_file f;
	const uint8_t *bucket[SNAP_NBUCKETS]; /* each bucket's value in the root, NULL if absent */
	size_t bucket_n[SNAP_NBUCKETS];
	int fd;
	uint64_t size;              /* bytes written to the new log */
	struct kvd_buf out;         /* records not written yet */
	int64_t c, sched;           /* finishedCompactRev, scheduledCompactRev (0: none) */
	struct snap_lease *live;    /* the lease bucket, by id */
	size_t nlive, livecap;
	struct life_map granted;    /* lease id -> 1 live, 2 only history names it */
	int in_txn, did_base;       /* a record is open; a BASE was written */
	int past_base;              /* the BASE and its compaction are written */
	size_t rec_at, nops_at;
	unsigned rec_type;
	uint32_t nops;
	int64_t rec_rev;
	uint64_t sub;               /* the next sub-revision in the open TXN */
	uint64_t records, tombs;
	uint64_t auth_rev;          /* the auth bucket's */
	uint32_t auth_ops;
	int auth_on;
	char why[160];
};

static int snap_imp_fail(struct snap_imp *im, const char *fmt, ...) KVD_PRINTF(2, 3);
static int snap_imp_fail(struct snap_imp *im, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(im->why, sizeof im->why, fmt, ap);
	va_end(ap);
	return KVD_ECORRUPT;
}

/* Write what out holds (all of it when sync, with an fdatasync). */
static int snap_imp_write(struct kvd *k, struct snap_imp *im, int sync)
{
	size_t done = 0;
	ssize_t w;

	(void)k;
	while (done < im->out.len) {
		w = write(im->fd, im->out.p + done, im->out.len - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			snap_imp_fail(im, "cannot write the new log: %s", strerror(errno));
			return KVD_EIO;
		}
		done += (size_t)w;
	}
	im->size += done;
	im->out.len = 0;
	if (sync && fdatasync(im->fd)) {
		snap_imp_fail(im, "cannot sync the new log: %s", strerror(errno));
		return KVD_EIO;
	}
	return 0;
}

/* The record just made at out[at..len): framed and replayed into the
 * scratch store by the log's own code (what names it in a refusal). */
static int snap_imp_apply(struct kvd *k, struct snap_imp *im, size_t at, const char *what, int64_t rev)
{
	struct mvcc_rec rec;
	const char *why = "a record kvd cannot frame";
	int e;

	if (mvcc_frame(im->out.p + at, im->out.len - at, im->size + at, im->size + im->out.len, NULL, &rec, &why) <= 0)
		return snap_imp_fail(im, "%s %lld: %s", what, (long long)rev, why);
	if ((e = mvcc_replay_record(k, &k->db, &rec, &why)))
		return e == KVD_ENOMEM ? KVD_ENOMEM : snap_imp_fail(im, "%s %lld: %s", what, (long long)rev, why);
	return 0;
}

/* Close the open record and replay it into the scratch store. */
static int snap_imp_close(struct kvd *k, struct snap_imp *im)
{
	int e;

	if (!im->in_txn)
		return 0;
	im->in_txn = 0;
	put_be32(im->out.p + im->nops_at, im->nops);
	mvcc_seal(k->crc, im->out.p + im->rec_at, im->out.len - im->rec_at - MVCC_REC_HDR, im->rec_type);
	if ((e = snap_imp_apply(k, im, im->rec_at, "at revision", im->rec_rev)))
		return e;
	im->did_base |= im->rec_type == MVCC_REC_BASE;
	return im->out.len >= (1u << 20) ? snap_imp_write(k, im, 0) : 0;
}

/* A COMPACT record at rev, applied. */
static int snap_imp_compact(struct kvd *k, struct snap_imp *im, int64_t rev, const char *what)
{
	size_t at = im->out.len;

	if (buf_reserve(k, &im->out, MVCC_COMPACT_REC_MAX))
		return KVD_ENOMEM;
	mvcc_compact_encode(k->crc, &im->out, rev);
	return snap_imp_apply(k, im, at, what, rev);
}

/* Room for n bytes of op in a record of type at rev (one opened as needed). */
static int snap_imp_room(struct kvd *k, struct snap_imp *im, unsigned type, int64_t rev, size_t n)
{
	int e;

	if (im->in_txn && (im->rec_type != type || im->rec_rev != rev ||
	                   (type == MVCC_REC_BASE && im->out.len - im->rec_at + n > LIFE_BASE_REC)) &&
	    (e = snap_imp_close(k, im)))
		return e;
	if (n > UINT32_MAX - 64 || buf_reserve(k, &im->out, MVCC_REC_HDR + 14 + n))
		return KVD_ENOMEM;
	if (!im->in_txn) {
		im->rec_at = im->out.len;
		im->nops_at = mvcc_rec_open(&im->out, rev);
		im->rec_type = type;
		im->rec_rev = rev;
		im->nops = 0;
		im->in_txn = 1;
	}
	return 0;
}

static int snap_imp_grant(struct kvd *k, struct snap_imp *im, unsigned type, int64_t rev, int64_t id, int64_t ttl,
                          uint64_t how)
{
	int e;

	if ((e = snap_imp_room(k, im, type, rev, MVCC_LEASE_OP_MAX)))
		return e;
	im->out.len = (size_t)(mvcc_lease_encode(im->out.p + im->out.len, MVCC_OP_GRANT, id, ttl) - im->out.p);
	im->nops++;
	return life_map_put(k, &im->granted, (uint64_t)id, how) ? KVD_ENOMEM : 0;
}

/* The state before the first TXN: the BASE (an empty one if nothing is
 * live at C, so the log still says C), then the compaction. */
static int snap_imp_base_end(struct kvd *k, struct snap_imp *im)
{
	int e;

	im->past_base = 1;
	if (im->c >= 1 && !im->did_base && !im->in_txn && (e = snap_imp_room(k, im, MVCC_REC_BASE, im->c, 0)))
		return e;
	if ((e = snap_imp_close(k, im)))
		return e;
	return im->c < 1 ? 0 : snap_imp_compact(k, im, im->c, "the compaction at");
}

/* The prev of a new op on key in the open TXN: the key's last op in that
 * record if it has one (a txn may put and then delete a key: both at one
 * revision), else its latest op in the scratch store; 0 for a new key. */
static uint64_t snap_imp_prev(struct kvd *k, struct snap_imp *im, const uint8_t *key, size_t klen)
{
	const uint8_t *p = im->out.p + im->nops_at + 4, *end = im->out.p + im->out.len;
	const struct mvcc_key *r;
	const char *why;
	struct mvcc_op op;
	uint64_t prev = 0;

	while (im->in_txn && im->rec_type == MVCC_REC_TXN && p < end &&
	       !mvcc_op_decode(&p, end, im->size + (uint64_t)(p - im->out.p), 1, &op, &why))
		if ((op.kind == MVCC_OP_PUT || op.kind == MVCC_OP_DEL) && op.klen == klen && !memcmp(op.key, key, klen))
			prev = op.off + 1;
	if (!prev && (r = mvcc_find(&k->db, key, klen)))
		prev = r->op + 1;
	return prev;
}

/* One record of etcd's key bucket, in revision order. */
static int snap_imp_key(struct kvd *k, void *arg, const uint8_t *key, size_t kn, const uint8_t *val, size_t vn,
                        uint32_t flags)
{
	struct snap_imp *im = arg;
	Mvccpb__KeyValue *kv;
	int64_t main_rev, lease = 0;
	uint64_t sub, prev = 0;
	int tomb = kn == 18, e = 0;
	size_t sl;

	if (flags || (kn != 17 && kn != 18) || key[8] != '_' || (tomb && key[17] != 't'))
		return snap_imp_fail(im, "a key bucket entry that is not a revision");
	main_rev = (int64_t)get_be64(key);
	sub = get_be64(key + 9);
	if (main_rev < 2 || sub > UINT32_MAX)
		return snap_imp_fail(im, "revision %lld_%llu out of range", (long long)main_rev, (unsigned long long)sub);
	if (!(kv = mvccpb__key_value__unpack(&k->pba, vn, val)))
		return k->pb_oom ? KVD_ENOMEM : snap_imp_fail(im, "revision %lld: a bad KeyValue", (long long)main_rev);
	if (!kv->key.len || kv->key.len > 0xffffffffu || kv->value.len > 0x7fffffffu ||
	    (!tomb && (kv->mod_revision != main_rev || kv->create_revision < 1 || kv->create_revision > main_rev ||
	               kv->version < 1))) {
		e = snap_imp_fail(im, "revision %lld: a KeyValue that does not fit it", (long long)main_rev);
		goto out;
	}
	if (!tomb)
		lease = kv->lease;
	im->records++;
	if (main_rev <= im->c) { /* what compaction left: the key's state at C */
		if (tomb) {
			im->tombs++;
			goto out; /* etcd's own restore ignores these */
		}
		if (lease && life_map_slot(&im->granted, (uint64_t)lease) == SIZE_MAX &&
		    (e = snap_imp_grant(k, im, MVCC_REC_BASE, im->c, lease, 1, 2)))
			goto out;
		if ((e = snap_imp_room(k, im, MVCC_REC_BASE, im->c, MVCC_OP_MAX_HDR + kv->key.len + kv->value.len)))
			goto out;
		im->out.len = (size_t)(mvcc_op_encode(im->out.p + im->out.len, MVCC_OP_PUT, sub, main_rev,
		                                      kv->create_revision, kv->version, lease, kv->key.data, kv->key.len,
		                                      kv->value.data, kv->value.len) - im->out.p);
		im->nops++;
		goto out;
	}
	if (!im->past_base) { /* the first revision above C */
		if ((e = snap_imp_base_end(k, im)))
			goto out;
	}
	if (!im->in_txn || im->rec_rev != main_rev) {
		if ((e = snap_imp_close(k, im)))
			goto out;
		if (k->db.rev >= INT64_MAX || main_rev != k->db.rev + 1) {
			e = snap_imp_fail(im, "revision %lld follows %lld: revisions above the compaction must not skip",
			                  (long long)main_rev, (long long)k->db.rev);
			goto out;
		}
		im->sub = 0;
	}
	if (sub != im->sub++) {
		e = snap_imp_fail(im, "revision %lld: sub-revision %llu out of order", (long long)main_rev,
		                  (unsigned long long)sub);
		goto out;
	}
	if (lease && (sl = life_map_slot(&im->granted, (uint64_t)lease)) == SIZE_MAX &&
	    (e = snap_imp_grant(k, im, MVCC_REC_TXN, main_rev, lease, 1, 2)))
		goto out;
	if ((e = snap_imp_room(k, im, MVCC_REC_TXN, main_rev, MVCC_OP_MAX_HDR + kv->key.len + kv->value.len)))
		goto out;
	prev = snap_imp_prev(k, im, kv->key.data, kv->key.len);
	if (tomb)
		im->out.len = (size_t)(mvcc_op_encode(im->out.p + im->out.len, MVCC_OP_DEL, prev, main_rev, 0, 0, 0,
		                                      kv->key.data, kv->key.len, NULL, 0) - im->out.p);
	else
		im->out.len = (size_t)(mvcc_op_encode(im->out.p + im->out.len, MVCC_OP_PUT, prev, main_rev,
		                                      kv->create_revision, kv->version, lease, kv->key.data, kv->key.len,
		                                      kv->value.data, kv->value.len) - im->out.p);
	im->nops++;
	im->tombs += (uint64_t)tomb;
out:
	mvccpb__key_value__free_unpacked(kv, &k->pba);
	return e;
}

/* meta: the compaction marks (17-byte revisions, main first). */
static int snap_imp_meta(struct kvd *k, void *arg, const uint8_t *key, size_t kn, const uint8_t *val, size_t vn,
                         uint32_t flags)
{
	struct snap_imp *im = arg;
	int64_t *at = kn == 18 && !memcmp(key, "finishedCompactRev", 18) ? &im->c
	            : kn == 19 && !memcmp(key, "scheduledCompactRev", 19) ? &im->sched : NULL;

	(void)k;
	(void)flags;
	if (!at)
		return 0;
	if (vn < 8 || (int64_t)get_be64(val) < 0)
		return snap_imp_fail(im, "a bad %.*s", (int)kn, key);
	*at = (int64_t)get_be64(val);
	return 0;
}

/* lease: leasepb.Lease {1 ID, 2 TTL, 3 RemainingTTL}; the ID is the value's. */
static int snap_imp_lease(struct kvd *k, void *arg, const uint8_t *key, size_t kn, const uint8_t *val, size_t vn,
                          uint32_t flags)
{
	struct snap_imp *im = arg;
	const uint8_t *p = val, *end = val + vn;
	uint64_t tag, v, id = 0, ttl = 0;

	(void)key;
	(void)kn;
	(void)flags;
	while (p < end) {
		if (get_varint(&p, end, &tag) || (tag & 7) != PB_WT_VARINT || get_varint(&p, end, &v))
			return snap_imp_fail(im, "a bad lease record");
		if (tag >> 3 == SNAP_F_LEASE_ID)
			id = v;
		else if (tag >> 3 == SNAP_F_LEASE_TTL)
			ttl = v;
	}
	if (!id || (int64_t)id < 0 || (int64_t)ttl < 1 || (int64_t)ttl > LEASE_MAX_TTL)
		return snap_imp_fail(im, "a lease with a bad id or TTL");
	if (UTIL_GROW(k, im->live, im->livecap, im->nlive + 1, 64))
		return KVD_ENOMEM;
	im->live[im->nlive].id = (int64_t)id;
	im->live[im->nlive++].ttl = (int64_t)ttl;
	return 0;
}

/* auth: the flag and the revision, kept for the AUTH record. */
static int snap_imp_authflags(struct kvd *k, void *arg, const uint8_t *key, size_t kn, const uint8_t *val, size_t vn,
                              uint32_t flags)
{
	struct snap_imp *im = arg;

	(void)k;
	(void)flags;
	if (kn == 11 && !memcmp(key, "authEnabled", 11) && vn == 1)
		im->auth_on = val[0] == 1;
	else if (kn == 12 && !memcmp(key, "authRevision", 12) && vn == 8 && (im->auth_rev = get_be64(val)) > INT64_MAX)
		return snap_imp_fail(im, "an auth revision past 2^63-1");
	return 0;
}

/* authUsers, authRoles: each message becomes an op of the AUTH record. */
static int snap_imp_authop(struct kvd *k, struct snap_imp *im, unsigned kind, const uint8_t *val, size_t vn)
{
	if (!mvcc_auth_op(k, &im->out, kind, NULL, val, &vn))
		return KVD_ENOMEM;
	im->auth_ops++;
	return 0;
}

static int snap_imp_user(struct kvd *k, void *arg, const uint8_t *key, size_t kn, const uint8_t *val, size_t vn,
                         uint32_t flags)
{
	(void)key;
	(void)kn;
	return flags & BOLT_LEAF_BUCKET ? snap_imp_fail(arg, "a bucket inside authUsers")
	                                : snap_imp_authop(k, arg, AUTH_OP_USER, val, vn);
}

static int snap_imp_role(struct kvd *k, void *arg, const uint8_t *key, size_t kn, const uint8_t *val, size_t vn,
                         uint32_t flags)
{
	(void)key;
	(void)kn;
	return flags & BOLT_LEAF_BUCKET ? snap_imp_fail(arg, "a bucket inside authRoles")
	                                : snap_imp_authop(k, arg, AUTH_OP_ROLE, val, vn);
}

/* Users and roles as one whole-state AUTH record, replayed like the rest. */
static int snap_imp_auth(struct kvd *k, struct snap_imp *im)
{
	size_t at;
	int e;

	im->auth_rev = 1;
	if ((im->bucket[1] && (e = snap_file_walk(k, &im->f, im->bucket[1], im->bucket_n[1], snap_imp_authflags, im))))
		return e;
	if (mvcc_auth_open(k, &im->out, &at))
		return KVD_ENOMEM;
	if ((im->bucket[3] && (e = snap_file_walk(k, &im->f, im->bucket[3], im->bucket_n[3], snap_imp_user, im))) ||
	    (im->bucket[2] && (e = snap_file_walk(k, &im->f, im->bucket[2], im->bucket_n[2], snap_imp_role, im))))
		return e;
	if (!im->auth_ops && !im->auth_on && im->auth_rev <= 1) {
		im->out.len = at; /* nothing to say */
		return 0;
	}
	mvcc_auth_seal(k->crc, &im->out, at, (im->auth_on ? AUTH_F_ENABLED : 0) | AUTH_F_WHOLE, im->auth_rev, im->auth_ops);
	return snap_imp_apply(k, im, at, "the auth buckets, revision", (int64_t)im->auth_rev);
}

/* The root bucket's entries: etcd's buckets, found by name. */
static int snap_imp_root(struct kvd *k, void *arg, const uint8_t *key, size_t kn, const uint8_t *val, size_t vn,
                         uint32_t flags)
{
	struct snap_imp *im = arg;
	unsigned b;

	(void)k;
	if (!(flags & BOLT_LEAF_BUCKET))
		return snap_imp_fail(im, "the root holds something that is not a bucket");
	for (b = 0; b < SNAP_NBUCKETS; b++)
		if (strlen(snap_bucket_names[b]) == kn && !memcmp(snap_bucket_names[b], key, kn)) {
			im->bucket[b] = val;
			im->bucket_n[b] = vn;
		}
	return 0;
}

/*
 * Import the snapshot p[0..n) (its SHA-256 trailer verified unless
 * skip_hash) into k, a scratch instance, writing fd.  0, or an error with
 * the reason in why.
 */
static int snap_import_mem(struct kvd *k, const uint8_t *p, uint64_t n, int skip_hash, int fd, char *why,
                           size_t whylen)
{
	struct snap_imp *im = kvd_calloc(k, sizeof *im);
	uint8_t digest[32], hdr[MVCC_HEADER_REC];
	size_t i;
	int e;

	if (!im)
		return KVD_ENOMEM;
	im->fd = fd;
	if (n % 512 == 32) {
		mbedtls_sha256_context sha;
		mbedtls_sha256_init(&sha);
		snap_sha256_starts(&sha, 0);
		snap_sha256_update(&sha, p, (size_t)(n - 32));
		snap_sha256_finish(&sha, digest);
		mbedtls_sha256_free(&sha);
		n -= 32;
		if (!skip_hash && memcmp(digest, p + n, 32)) {
			e = snap_imp_fail(im, "the SHA-256 trailer does not match the file (--skip-hash-check to go on)");
			goto out;
		}
	} else if (!skip_hash) {
		e = snap_imp_fail(im, "the file has no SHA-256 trailer (--skip-hash-check to go on)");
		goto out;
	}
	if ((e = snap_file_open(k, &im->f, p, n))) {
		snap_imp_fail(im, "%s", im->f.why);
		goto out;
	}
	{ /* the root bucket: a page, walked as a bucket value naming it */
		uint8_t rootv[BOLT_BUCKET_HDR];
		put_le64(rootv + BOLT_BUCKET_ROOT, im->f.root);
		put_le64(rootv + BOLT_BUCKET_SEQUENCE, 0);
		if ((e = snap_file_walk(k, &im->f, rootv, sizeof rootv, snap_imp_root, im))) {
			if (!im->why[0])
				snap_imp_fail(im, "%s", im->f.why);
			goto out;
		}
	}
	if ((im->bucket[9] && (e = snap_file_walk(k, &im->f, im->bucket[9], im->bucket_n[9], snap_imp_meta, im))) ||
	    (im->bucket[6] && (e = snap_file_walk(k, &im->f, im->bucket[6], im->bucket_n[6], snap_imp_lease, im)))) {
		if (!im->why[0])
			snap_imp_fail(im, "%s", im->f.why);
		goto out;
	}
	if (im->sched <= im->c)
		im->sched = 0;
	mvcc_header_encode(k->crc, hdr);
	if ((e = buf_append(k, &im->out, hdr, sizeof hdr)) || (e = snap_imp_apply(k, im, 0, "the header at", 0)))
		goto out;
	for (i = 0; i < im->nlive; i++) /* live leases first, in the BASE (at rev 1 if never compacted) */
		if (life_map_slot(&im->granted, (uint64_t)im->live[i].id) != SIZE_MAX) {
			e = snap_imp_fail(im, "lease %llx twice", (unsigned long long)im->live[i].id);
			goto out;
		} else if ((e = snap_imp_grant(k, im, MVCC_REC_BASE, KVD_MAX(im->c, 1), im->live[i].id, im->live[i].ttl, 1))) {
			goto out;
		}
	if (im->bucket[5] && (e = snap_file_walk(k, &im->f, im->bucket[5], im->bucket_n[5], snap_imp_key, im))) {
		if (!im->why[0])
			snap_imp_fail(im, "%s", im->f.why);
		goto out;
	}
	if (!im->past_base && (e = snap_imp_base_end(k, im)))
		goto out;
	if ((e = snap_imp_close(k, im)))
		goto out;
	/* leases only history named: revoked now, in a TXN of lease ops (no revision) */
	for (i = 0; im->granted.v && i <= im->granted.mask; i++) {
		int64_t id = (int64_t)im->granted.v[2 * i];
		struct lease *l;
		if (!id || im->granted.v[2 * i + 1] != 2)
			continue;
		if ((l = lease_find(k, id)) && l->nkeys) {
			e = snap_imp_fail(im, "a key is attached to lease %llx, which the snapshot does not hold",
			                  (unsigned long long)id);
			goto out;
		}
		if (k->db.rev >= INT64_MAX) { /* its TXN would carry revision 2^63 */
			e = snap_imp_fail(im, "lease %llx to revoke after the last revision", (unsigned long long)id);
			goto out;
		}
		if ((e = snap_imp_room(k, im, MVCC_REC_TXN, k->db.rev + 1, MVCC_LEASE_OP_MAX)))
			goto out;
		im->out.len = (size_t)(mvcc_lease_encode(im->out.p + im->out.len, MVCC_OP_REVOKE, id, 0) - im->out.p);
		im->nops++;
	}
	if ((e = snap_imp_close(k, im)))
		goto out;
	if ((e = snap_imp_auth(k, im))) {
		if (!im->why[0])
			snap_imp_fail(im, "%s", im->f.why);
		goto out;
	}
	if (im->sched && im->sched <= k->db.rev && /* a compaction etcd had not finished */
	    (e = snap_imp_compact(k, im, im->sched, "the scheduled compaction at")))
		goto out;
	e = snap_imp_write(k, im, 1);
	if (!e)
		kvd_log(k, KVD_LOG_INFO, "imported %llu key records (%llu tombstones), %zu leases, %zu users, %zu roles, "
		        "revision %lld, compacted %lld: a %llu-byte log", (unsigned long long)im->records,
		        (unsigned long long)im->tombs, k->lease.n, k->auth.users.n, k->auth.roles.n, (long long)k->db.rev,
		        (long long)k->db.compacted,
		        (unsigned long long)im->size);
out:
	if (e && !im->why[0])
		snprintf(im->why, sizeof im->why, "%s", e == KVD_ENOMEM ? "out of memory" : "a bad snapshot");
	snprintf(why, whylen, "%s", im->why);
	kvd_free(k, im->f.seen);
	kvd_free(k, im->live);
	kvd_free(k, im->granted.v);
	buf_free(k, &im->out);
	kvd_free(k, im);
	return e;
}

/*
 * --restore-snapshot: a new store in the data dir from an etcd snapshot
 * file, made by a scratch instance; refused if the data dir holds one.
 */
static int snap_restore(struct kvd *k0, char *err, size_t errlen)
{
	const char *file = k0->cfg.restore_snapshot, *dir = k0->cfg.data_dir;
	char log[PATH_MAX], tmp[PATH_MAX], why[200] = "";
	struct kvd *k = NULL;
	struct stat st;
	uint8_t *p = MAP_FAILED, *copy = NULL;
	int fd = -1, out = -1, e, dfd;

	snprintf(log, sizeof log, "%s/kvd.log", dir);
	snprintf(tmp, sizeof tmp, "%s/kvd.log.import", dir);
	if (!stat(log, &st) && st.st_size > 0) {
		snprintf(err, errlen, "%s already holds a store: --restore-snapshot makes a new one (move it away, or "
		         "start without the flag)", dir);
		return KVD_EINVAL;
	}
	if ((fd = util_open_regular(file, 0, &st)) < 0) {
		snprintf(err, errlen, "cannot open %s: %s", file, fd == -2 ? "not a regular file" : strerror(errno));
		e = KVD_EINVAL;
		goto out;
	}
	if ((uint64_t)st.st_size > SIZE_MAX / 2) {
		snprintf(err, errlen, "%s: too large for this machine", file);
		e = KVD_EINVAL;
		goto out;
	}
	if (st.st_size > 0)
		p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED && st.st_size > 0) { /* no mmap (NOMMU): read it */
		size_t got = 0;
		ssize_t r;
		if (!(copy = kvd_malloc(k0, (size_t)st.st_size))) {
			snprintf(err, errlen, "out of memory reading %s", file);
			e = KVD_ENOMEM;
			goto out;
		}
		while (got < (size_t)st.st_size && ((r = read(fd, copy + got, (size_t)st.st_size - got)) > 0 ||
		                                    (r < 0 && errno == EINTR)))
			got += r > 0 ? (size_t)r : 0;
		if (got < (size_t)st.st_size) {
			snprintf(err, errlen, "cannot read %s: %s", file, strerror(errno));
			e = KVD_EIO;
			goto out;
		}
	}
	if ((e = kvd_init(&k0->cfg, &k, err, errlen)))
		goto out;
	k->log_fn = k0->log_fn;
	k->log_arg = k0->log_arg;
	if ((out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0) {
		snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
		e = KVD_EIO;
		goto out;
	}
	e = snap_import_mem(k, copy ? copy : p == MAP_FAILED ? (const uint8_t *)"" : p, (uint64_t)st.st_size,
	                    k0->cfg.skip_hash_check, out, why, sizeof why);
	if (close(out) && !e) {
		snprintf(why, sizeof why, "cannot write the new log: %s", strerror(errno));
		e = KVD_EIO;
	}
	out = -1;
	if (!e && rename(tmp, log)) {
		snprintf(why, sizeof why, "cannot rename kvd.log.import: %s", strerror(errno));
		e = KVD_EIO;
	}
	if (e) {
		unlink(tmp);
		snprintf(err, errlen, "%s: %s: nothing imported", file, why);
		e = e == KVD_ENOMEM ? e : KVD_EINVAL;
		goto out;
	}
	if ((dfd = open(dir, O_RDONLY | O_CLOEXEC)) >= 0) {
		fsync(dfd);
		close(dfd);
	}
out:
	if (out >= 0)
		close(out);
	if (p != MAP_FAILED)
		munmap(p, (size_t)st.st_size);
	kvd_free(k0, copy);
	if (fd >= 0)
		close(fd);
	kvd_close(k);
	return e;
}

/* --restore-snapshot FILE: a regular file, before anything is made. */
static int snap_restore_check(const char *file, char *err, size_t errlen)
{
	return util_check_regular(file, "--restore-snapshot", err, errlen);
}

#else /* KVD_NO_SNAPSHOT: no snapshot file is read or written; asking for one is a configuration error */
static int snap_restore_check(const char *file, char *err, size_t errlen)
{
	(void)file;
	snprintf(err, errlen, "--restore-snapshot: this kvd is built without snapshots (KVD_NO_SNAPSHOT)");
	return KVD_EINVAL;
}
static int snap_restore(struct kvd *k, char *err, size_t errlen)
{
	return snap_restore_check(k->cfg.restore_snapshot, err, errlen);
}
static int snap_save_offline(const struct kvd_config *cfg, char *err, size_t errlen)
{
	(void)cfg;
	snprintf(err, errlen, "--snapshot-save: this kvd is built without snapshots (KVD_NO_SNAPSHOT)");
	return KVD_EINVAL;
}
#endif /* KVD_NO_SNAPSHOT */

/* ===== 16. HPACK (hp_) =================================================== */

/*
 * RFC 7541.  The decoder is complete (static and dynamic tables, Huffman,
 * size updates) and bounded: the decoded list is cut at KVD_MAX_HEADER_LIST
 * bytes and KVD_MAX_HEADER_FIELDS fields, yet the whole block is still
 * processed so the dynamic table stays in sync with the peer's encoder.
 * The encoder only uses static indexes and literals without indexing, so kvd
 * keeps no encoder table.
 *
 * Invariants:
 *   1. The dynamic table never outgrows its maximum, nor the maximum
 *      HP_TABLE_SIZE (what kvd's SETTINGS allow): hp_insert evicts before
 *      it adds, and a size update above HP_TABLE_SIZE, or after a block's
 *      first field, is a COMPRESSION_ERROR (hp_decode).  Every entry costs
 *      32 bytes or more, so HP_MAX_ENTRIES slots always suffice.
 *   2. Every read stays inside the block and the tables: integers take at
 *      most 5 continuation bytes and fit 32 bits (hp_int), a string's
 *      length fits what is left (hp_string), an index names an entry
 *      (hp_lookup), Huffman padding is at most 7 one-bits, EOS never
 *      inside (hp_huff_decode).
 *   3. The whole block is always decoded, past the caps too (o->over), so
 *      the table stays in step with the peer's encoder; a list cut at the
 *      caps is answered, never served in part (h2_on_block).
 *   4. Decoded fields point into the block or the shared arena (k->harena)
 *      and live until the next decode: strings from the dynamic table are
 *      copied there, since an insert later in the block may evict them,
 *      and whoever keeps a field copies it (call_keep_meta).
 */

/* Appendix A: the static table. */
static const struct { const char *name, *value; } hp_static[61] = {
	{":authority", ""}, {":method", "GET"}, {":method", "POST"}, {":path", "/"},
	{":path", "/index.html"}, {":scheme", "http"}, {":scheme", "https"},
	{":status", "200"}, {":status", "204"}, {":status", "206"}, {":status", "304"},
	{":status", "400"}, {":status", "404"}, {":status", "500"},
	{"accept-charset", ""}, {"accept-encoding", "gzip, deflate"},
	{"accept-language", ""}, {"accept-ranges", ""}, {"accept", ""},
	{"access-control-allow-origin", ""}, {"age", ""}, {"allow", ""},
	{"authorization", ""}, {"cache-control", ""}, {"content-disposition", ""},
	{"content-encoding", ""}, {"content-language", ""}, {"content-length", ""},
	{"content-location", ""}, {"content-range", ""}, {"content-type", ""},
	{"cookie", ""}, {"date", ""}, {"etag", ""}, {"expect", ""}, {"expires", ""},
	{"from", ""}, {"host", ""}, {"if-match", ""}, {"if-modified-since", ""},
	{"if-none-match", ""}, {"if-range", ""}, {"if-unmodified-since", ""},
	{"last-modified", ""}, {"link", ""}, {"location", ""}, {"max-forwards", ""},
	{"proxy-authenticate", ""}, {"proxy-authorization", ""}, {"range", ""},
	{"referer", ""}, {"refresh", ""}, {"retry-after", ""}, {"server", ""},
	{"set-cookie", ""}, {"strict-transport-security", ""},
	{"transfer-encoding", ""}, {"user-agent", ""}, {"vary", ""}, {"via", ""},
	{"www-authenticate", ""},
};

/*
 * Appendix B as a canonical code: the RFC's codes are assigned in order of
 * (length, symbol), so the number of codes of each length plus the symbols in
 * that order is the whole table.  Symbol 256 is EOS.
 */
static const uint8_t hp_huff_count[31] = {
	0, 0, 0, 0, 0, 10, 26, 32, 6, 0, 5, 3, 2, 6, 2, 3,
	0, 0, 0, 3, 8, 13, 26, 29, 12, 4, 15, 19, 29, 0, 4,
};
static const uint16_t hp_huff_sym[257] = {
	48, 49, 50, 97, 99, 101, 105, 111, 115, 116, 32, 37, 45, 46, 47, 51,
	52, 53, 54, 55, 56, 57, 61, 65, 95, 98, 100, 102, 103, 104, 108, 109,
	110, 112, 114, 117, 58, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76,
	77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 89, 106, 107, 113, 118,
	119, 120, 121, 122, 38, 42, 44, 59, 88, 90, 33, 34, 40, 41, 63, 39,
	43, 124, 35, 62, 0, 36, 64, 91, 93, 126, 94, 125, 60, 96, 123, 92,
	195, 208, 128, 130, 131, 162, 184, 194, 224, 226, 153, 161, 167, 172, 176, 177,
	179, 209, 216, 217, 227, 229, 230, 129, 132, 133, 134, 136, 146, 154, 156, 160,
	163, 164, 169, 170, 173, 178, 181, 185, 186, 187, 189, 190, 196, 198, 228, 232,
	233, 1, 135, 137, 138, 139, 140, 141, 143, 147, 149, 150, 151, 152, 155, 157,
	158, 165, 166, 168, 174, 175, 180, 182, 183, 188, 191, 197, 231, 239, 9, 142,
	144, 145, 148, 159, 171, 206, 215, 225, 236, 237, 199, 207, 234, 235, 192, 193,
	200, 201, 202, 205, 210, 213, 218, 219, 238, 240, 242, 243, 255, 203, 204, 211,
	212, 214, 221, 222, 223, 241, 244, 245, 246, 247, 248, 250, 251, 252, 253, 254,
	2, 3, 4, 5, 6, 7, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20,
	21, 23, 24, 25, 26, 27, 28, 29, 30, 31, 127, 220, 249, 10, 13, 22,
	256,
};

#define HP_EINVAL (-20) /* malformed: COMPRESSION_ERROR (distinct from KVD_E*) */
#define HP_ESPACE (-21) /* output does not fit */

/*
 * Decode a Huffman string (section 5.2) into dst (cap bytes); dst NULL only
 * validates.  Returns the decoded length, HP_EINVAL (EOS inside, padding
 * longer than 7 bits or not all ones) or HP_ESPACE.
 */
static long hp_huff_decode(const uint8_t *src, size_t n, uint8_t *dst, size_t cap)
{
	size_t i = 0, out = 0;
	unsigned bits = 0, cur = 0, len, index, sym;
	uint32_t code, first, count;

	for (;;) {
		code = first = 0;
		index = 0;
		for (len = 1; len <= 30; len++) {
			if (!bits) {
				if (i == n) {
					/* input ended inside a code: legal padding is at most
					 * 7 bits, all ones (the start of EOS) */
					len--;
					if (len > 7 || (code >> 1) != (1u << len) - 1)
						return HP_EINVAL;
					return (long)out;
				}
				cur = src[i++];
				bits = 8;
			}
			code |= (cur >> --bits) & 1;
			count = hp_huff_count[len];
			if (code - first < count)
				break;
			index += count;
			first = (first + count) << 1;
			code <<= 1;
		}
		if (len > 30)
			return HP_EINVAL; /* unreachable with a complete code */
		sym = hp_huff_sym[index + (code - first)];
		if (sym == 256)
			return HP_EINVAL;
		if (dst) {
			if (out >= cap)
				return HP_ESPACE;
			dst[out] = (uint8_t)sym;
		}
		out++;
	}
}

/* Integer with an N-bit prefix (section 5.1); at most 5 continuation bytes. */
static int hp_int(const uint8_t **pp, const uint8_t *end, unsigned prefix, uint32_t *out)
{
	const uint8_t *p = *pp;
	uint32_t max = (1u << prefix) - 1;
	uint64_t v;
	unsigned shift = 0;
	uint8_t b;

	if (p >= end)
		return HP_EINVAL;
	v = *p++ & max;
	if (v == max) {
		do {
			if (p >= end || shift > 28)
				return HP_EINVAL;
			b = *p++;
			v += (uint64_t)(b & 0x7f) << shift;
			shift += 7;
		} while (b & 0x80);
		if (v > 0xffffffffu)
			return HP_EINVAL;
	}
	*out = (uint32_t)v;
	*pp = p;
	return 0;
}

static void hp_table_init(struct hp_table *t)
{
	memset(t, 0, sizeof *t);
	t->max = HP_TABLE_SIZE;
}

static void hp_table_free(struct kvd *k, struct hp_table *t)
{
	kvd_free(k, t->mem);
	hp_table_init(t);
}

static void hp_evict(struct hp_table *t)
{
	struct hp_entry *e = &t->ent[(t->first + t->n - 1) % HP_MAX_ENTRIES];

	t->size -= (size_t)e->nlen + e->vlen + 32;
	t->head = (size_t)e->off + e->nlen + e->vlen;
	if (--t->n == 0)
		t->head = t->tail = 0;
}

static void hp_resize(struct hp_table *t, size_t max)
{
	t->max = max;
	while (t->size > t->max)
		hp_evict(t);
}

/* Add an entry (section 4.4).  name/value never point into t->mem. */
static int hp_insert(struct kvd *k, struct hp_table *t, const uint8_t *name, size_t nlen,
                     const uint8_t *value, size_t vlen)
{
	size_t need = nlen + vlen + 32;
	struct hp_entry *e;
	unsigned i;

	if (need > t->max) { /* too big: the table just empties */
		while (t->n)
			hp_evict(t);
		return 0;
	}
	if (!name || !value)
		return HP_EINVAL; /* cannot happen: small strings always fit */
	while (t->size + need > t->max)
		hp_evict(t);
	if (!t->mem && !(t->mem = kvd_malloc(k, HP_TABLE_SIZE)))
		return KVD_ENOMEM;
	if (t->tail + nlen + vlen > HP_TABLE_SIZE) {
		memmove(t->mem, t->mem + t->head, t->tail - t->head);
		for (i = 0; i < t->n; i++)
			t->ent[(t->first + i) % HP_MAX_ENTRIES].off -= (uint16_t)t->head;
		t->tail -= t->head;
		t->head = 0;
	}
	t->first = (t->first + HP_MAX_ENTRIES - 1) % HP_MAX_ENTRIES;
	e = &t->ent[t->first];
	e->off = (uint16_t)t->tail;
	e->nlen = (uint16_t)nlen;
	e->vlen = (uint16_t)vlen;
	memcpy(t->mem + t->tail, name, nlen);
	memcpy(t->mem + t->tail + nlen, value, vlen);
	t->tail += nlen + vlen;
	t->n++;
	t->size += need;
	return 0;
}

/* Output of one block decode: fields, and the arena that holds decoded
 * strings.  A field stays valid until the next decode. */
struct hp_out {
	struct hp_field *f;
	unsigned nf, maxf;
	uint8_t *a;
	size_t alen, acap;
	size_t list, maxlist; /* section 4.1 size of the whole list, and the cap */
	unsigned over : 1;    /* list cut at the caps: the request is refused */
};

/* Decode into maxf fields and an arena of acap bytes, under kvd's list cap. */
static void hp_out_init(struct hp_out *o, struct hp_field *f, unsigned maxf, uint8_t *a, size_t acap)
{
	memset(o, 0, sizeof *o);
	o->f = f;
	o->maxf = maxf;
	o->a = a;
	o->acap = acap;
	o->maxlist = KVD_MAX_HEADER_LIST;
}

/* Look up index i (1-based, section 2.3.3); 0 or out of range fails. */
static int hp_lookup(struct hp_table *t, uint32_t i, const uint8_t **n, size_t *nl,
                     const uint8_t **v, size_t *vl, int *dyn)
{
	struct hp_entry *e;

	if (i == 0)
		return HP_EINVAL;
	if (i <= 61) {
		*n = (const uint8_t *)hp_static[i - 1].name;
		*nl = strlen(hp_static[i - 1].name);
		*v = (const uint8_t *)hp_static[i - 1].value;
		*vl = strlen(hp_static[i - 1].value);
		*dyn = 0;
		return 0;
	}
	if (i - 62 >= t->n)
		return HP_EINVAL;
	e = &t->ent[(t->first + i - 62) % HP_MAX_ENTRIES];
	*n = t->mem + e->off;
	*nl = e->nlen;
	*v = t->mem + e->off + e->nlen;
	*vl = e->vlen;
	*dyn = 1;
	return 0;
}

/* Copy bytes into the arena; NULL when they do not fit. */
static const uint8_t *hp_keep(struct hp_out *o, const uint8_t *p, size_t n)
{
	uint8_t *d = o->a + o->alen;

	if (o->acap - o->alen < n)
		return NULL;
	memcpy(d, p, n);
	o->alen += n;
	return d;
}

/* A string literal (section 5.2).  Raw strings point into the block, Huffman
 * ones are decoded into the arena; *s is NULL if it did not fit. */
static int hp_string(const uint8_t **pp, const uint8_t *end, struct hp_out *o,
                     const uint8_t **s, size_t *len)
{
	int huff;
	uint32_t n;
	long r;
	const uint8_t *src;

	if (*pp >= end)
		return HP_EINVAL;
	huff = **pp & 0x80;
	if (hp_int(pp, end, 7, &n) || n > (size_t)(end - *pp))
		return HP_EINVAL;
	src = *pp;
	*pp += n;
	if (!huff) {
		*s = src;
		*len = n;
		return 0;
	}
	r = hp_huff_decode(src, n, o->a + o->alen, o->acap - o->alen);
	if (r == HP_ESPACE) {
		r = hp_huff_decode(src, n, NULL, 0);
		*s = NULL;
	} else if (r >= 0) {
		*s = o->a + o->alen;
		o->alen += (size_t)r;
	}
	if (r < 0)
		return HP_EINVAL;
	*len = (size_t)r;
	return 0;
}

/*
 * Decode one complete header block into o.  Returns 0 (check o->over),
 * HP_EINVAL for a COMPRESSION_ERROR, or KVD_ENOMEM.
 */
static int hp_decode(struct kvd *k, struct hp_table *t, const uint8_t *p, size_t n,
                     struct hp_out *o)
{
	const uint8_t *end = p + n, *name, *val;
	size_t nlen, vlen, mark;
	uint32_t v;
	int started = 0, dyn, incr, r;

	while (p < end) {
		uint8_t b = *p;

		if ((b & 0xe0) == 0x20) { /* size update: only before the first field */
			if (started || hp_int(&p, end, 5, &v) || v > HP_TABLE_SIZE)
				return HP_EINVAL;
			hp_resize(t, v);
			continue;
		}
		started = 1;
		mark = o->alen;
		incr = 0;
		if (b & 0x80) { /* indexed field */
			if (hp_int(&p, end, 7, &v) || hp_lookup(t, v, &name, &nlen, &val, &vlen, &dyn))
				return HP_EINVAL;
			if (dyn && !o->over) { /* the table may change later in this block */
				name = hp_keep(o, name, nlen);
				val = hp_keep(o, val, vlen);
			}
		} else {
			incr = (b & 0xc0) == 0x40;
			if (hp_int(&p, end, incr ? 6 : 4, &v))
				return HP_EINVAL;
			if (v) {
				if (hp_lookup(t, v, &name, &nlen, &val, &vlen, &dyn))
					return HP_EINVAL;
				if (dyn) /* may be evicted by our own insert */
					name = hp_keep(o, name, nlen);
			} else if (hp_string(&p, end, o, &name, &nlen)) {
				return HP_EINVAL;
			}
			if (hp_string(&p, end, o, &val, &vlen))
				return HP_EINVAL;
			if (incr && (r = hp_insert(k, t, name, nlen, val, vlen)))
				return r;
		}
		o->list += nlen + vlen + 32;
		if (o->over || !name || !val || o->nf >= o->maxf || o->list > o->maxlist) {
			o->over = 1;
			o->alen = mark; /* keep decoding for table sync, store nothing */
			continue;
		}
		o->f[o->nf].name = (const char *)name;
		o->f[o->nf].nlen = (uint32_t)nlen;
		o->f[o->nf].value = (const char *)val;
		o->f[o->nf].vlen = (uint32_t)vlen;
		o->nf++;
	}
	return 0;
}

/* Encoder: an integer with an N-bit prefix, first byte carrying 'flags'. */
static void hp_put_int(struct kvd *k, struct kvd_buf *b, uint8_t flags, unsigned prefix, uint32_t v)
{
	uint8_t tmp[6];
	size_t n = 0;
	uint32_t max = (1u << prefix) - 1;

	if (v < max) {
		tmp[n++] = (uint8_t)(flags | v);
	} else {
		tmp[n++] = (uint8_t)(flags | max);
		v -= max;
		while (v >= 128) {
			tmp[n++] = (uint8_t)(v | 0x80);
			v >>= 7;
		}
		tmp[n++] = (uint8_t)v;
	}
	buf_append(k, b, tmp, n);
}

/* "Literal without indexing" with a static name index (4-bit prefix) or a
 * new name (index 0); strings raw, never Huffman. */
static void hp_put_field(struct kvd *k, struct kvd_buf *b, unsigned index, const char *name,
                         const char *value, size_t vlen)
{
	hp_put_int(k, b, 0x00, 4, index);
	if (!index) {
		size_t nlen = strlen(name);
		hp_put_int(k, b, 0x00, 7, (uint32_t)nlen);
		buf_append(k, b, name, nlen);
	}
	hp_put_int(k, b, 0x00, 7, (uint32_t)vlen);
	buf_append(k, b, value, vlen);
}

/* :status (index 8 is "200"). */
static void hp_put_status(struct kvd *k, struct kvd_buf *b, int status)
{
	char s[8];

	if (status == 200) {
		buf_append(k, b, "\x88", 1);
		return;
	}
	snprintf(s, sizeof s, "%03d", status % 1000);
	hp_put_field(k, b, 8, NULL, s, 3);
}

/* ===== 17. HTTP/2 frames, streams, flow control (h2_) ==================== */

/*
 * RFC 9113, server side, with prior knowledge (cleartext, or inside TLS,
 * where ALPN offers h2): the loop hands a
 * connection to this section once its first bytes were the preface
 * (section 35).  Input is parsed from c->conn->in one whole frame at a time
 * (a frame is at most 16 KiB + 9); output is appended to c->conn->out, which
 * the loop writes.  Each stream carries one call (section 8).  Response DATA is
 * pulled from each stream's queue only as far as the peer's windows and
 * KVD_MAX_OUTPUT allow, so a slow or hostile reader pins bounded memory.
 *
 * Connection errors queue GOAWAY and mark the connection closing (h2_fail);
 * stream errors queue RST_STREAM (h2_stream_error) and count as glitches,
 * as do the peer's other slips (an empty DATA frame that does not end its
 * stream, a header list over kvd's caps); too many glitches end the
 * connection (h2_glitch).
 *
 * Invariants:
 *   1. A frame is handled only whole, its payload at most H2_DEFAULT_FRAME
 *      bytes (h2_input: FRAME_SIZE_ERROR); once a header block is open
 *      only its CONTINUATIONs come, at most KVD_MAX_CONTINUATIONS frames
 *      and KVD_MAX_HEADER_BLOCK bytes (h2_input, h2_on_continuation).
 *   2. Every header block is HPACK-decoded, even one kvd refuses, so the
 *      peer's encoder and kvd's table stay in step (h2_on_block).
 *   3. No window passes 2^31-1 and no DATA passes a window: updates that
 *      would overflow are FLOW_CONTROL_ERROR (h2_on_window_update,
 *      h2_on_settings), a peer's DATA beyond its window too (h2_on_data),
 *      and kvd sends at most min(connection window, stream window, peer
 *      frame size) at a time (h2_stream_send).
 *   4. Memory a peer can pin is bounded: frames are not parsed while the
 *      output holds KVD_MAX_OUTPUT (h2_input), a stream's answer is pulled
 *      only under that cap and its windows, a producing call makes its
 *      next message only when its queue is empty (h2_stream_send); request
 *      bytes are bounded by the stream windows and KVD_MAX_CONN_INPUT
 *      (h2_grant, below).
 *   5. A held reply never leaves (h2_stream_send: KVD_NEVER(s->call.held));
 *      a stream and its call are freed only by h2_stream_close, never from
 *      inside a service handler, and the connection only by the loop.
 */

/* One HTTP/2 stream carrying one gRPC call. */
struct h2_stream {
	struct call call;           /* first: the stream is found from its call */
	struct h2_conn *c;
	uint32_t id;
	unsigned remote_closed : 1; /* client sent END_STREAM */
	unsigned hdrs_sent : 1;     /* response HEADERS went out */
	unsigned discard : 1;       /* answer given: drop further request data */
	unsigned want_grant : 1;    /* a message waits for its window grant */
	unsigned has_cl : 1;        /* content-length given */
	unsigned ctype_proto : 1;   /* answer with application/grpc+proto */
	unsigned bad_encoding : 1;  /* grpc-encoding kvd cannot decode */
	int64_t send_window;        /* what kvd may still send on this stream */
	int64_t recv_window;        /* what the client may still send */
	uint32_t recv_owed;         /* consumed, not yet credited back */
	size_t grant_msg;           /* size of the message that waits for a grant */
	size_t reserved;            /* its share of the connection's grants */
	uint64_t charge;            /* request bytes it counts toward --max-request-buffer */
	uint64_t content_length, data_seen;
	int64_t stalled_since;      /* output blocked by a zero window since */
	int64_t opened;             /* monotonic ms: its HEADERS came (h2_on_rst) */
	struct kvd_buf in;          /* request bytes (gRPC-framed) */
	int http_status;            /* 200 unless an early HTTP-level refusal */
	struct http_x *hx;          /* not gRPC: the HTTP request it carries (section 32), else NULL */
};
#define H2_STREAM_OF(cp) ((struct h2_stream *)(void *)(cp)) /* call is the first member */

/* An HTTP/2 connection's state (its struct conn is section 35's). */
struct h2_conn {
	struct kvd *k;
	struct conn *conn;
	unsigned preface_done : 1;
	unsigned settings_seen : 1;  /* client SETTINGS arrived */
	unsigned goaway_sent : 1;    /* final GOAWAY queued */
	unsigned draining : 1;       /* first (graceful) GOAWAY queued */
	unsigned need_tsu : 1;       /* emit a table size update before next block */
	unsigned sent_since_ping : 1;
	struct hp_table dec;
	/* header block being assembled across CONTINUATION frames */
	uint8_t *hblk;
	size_t hblk_len;
	uint32_t hblk_sid;
	uint8_t hblk_flags;
	unsigned hblk_frames;
	/* streams */
	struct h2_stream **st;
	unsigned nst, rr;
	size_t stcap;
	uint32_t last_sid;          /* highest client stream id seen */
	uint32_t closed_ring[32];   /* recently closed ids << 1 | 1 if kvd reset them */
	unsigned closed_pos;
	/* flow control */
	int64_t send_window;        /* connection window kvd may use */
	int64_t recv_window;        /* what the client may still send */
	uint32_t recv_owed;         /* received bytes not yet credited */
	size_t reserved;            /* bytes of the large messages granted */
	/* peer settings */
	uint32_t peer_max_frame, peer_init_window;
	/* abuse accounting */
	struct bucket rst, glitch;
	unsigned ping_strikes;
	int64_t last_ping;
	int64_t t_drain_ping;       /* monotonic ms */
};

/* The request line of a stream, from its header block (borrowed slices). */
struct h2_req {
	struct kvd_slice method, scheme, path, authority, ctype, timeout, encoding;
	uint64_t content_length;
	unsigned has_cl : 1;
};

static void grpc_on_headers(struct kvd *k, struct h2_stream *s, const struct h2_req *rq);
#ifndef KVD_NO_HTTP /* an HTTP/2 request that is not gRPC: section 32's */
static void http_h2_begin(struct kvd *k, struct h2_stream *s, const struct h2_req *rq, const struct hp_field *f,
                          unsigned nf);
static void http_h2_data(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n);
static int http_h2_send(struct kvd *k, struct h2_conn *c, struct h2_stream *s);
static void http_h2_free(struct kvd *k, struct h2_stream *s);
#endif
static void grpc_on_data(struct kvd *k, struct h2_stream *s);
static void grpc_on_remote_close(struct kvd *k, struct h2_stream *s);
static const struct call_carrier grpc_h2_carrier;

static int h2_frame(struct h2_conn *c, unsigned type, unsigned flags, uint32_t sid,
                    const void *payload, size_t len)
{
	uint8_t h[H2_FRAME_HDR];

	put_be24(h, (uint32_t)len);
	h[3] = (uint8_t)type;
	h[4] = (uint8_t)flags;
	put_be32(h + 5, sid);
	if (buf_reserve(c->k, &c->conn->out, sizeof h + len))
		return KVD_ENOMEM;
	buf_append(c->k, &c->conn->out, h, sizeof h);
	buf_append(c->k, &c->conn->out, payload, len);
	return 0;
}

static int h2_frame_u32(struct h2_conn *c, unsigned type, uint32_t sid, uint32_t v)
{
	uint8_t p[4];

	put_be32(p, v);
	return h2_frame(c, type, 0, sid, p, 4);
}

/* Queue GOAWAY; kvd then stops reading and closes once output is written. */
static void h2_fail(struct h2_conn *c, enum h2_error code, const char *why)
{
	uint8_t p[8 + 64];
	size_t n = strlen(why);

	if (c->goaway_sent && c->conn->is_closing)
		return;
	if (n > 64)
		n = 64;
	put_be32(p, c->last_sid);
	put_be32(p + 4, code);
	memcpy(p + 8, why, n);
	h2_frame(c, H2_GOAWAY, 0, 0, p, 8 + n);
	c->goaway_sent = c->conn->is_closing = 1;
	c->k->st.goaway_sent++;
	if (code != H2_NO_ERROR)
		kvd_log(c->k, KVD_LOG_INFO, "%s: closing connection: %s (h2 error %d)", c->conn->peer, why, code);
}

/* A protocol slip by the peer; ENHANCE_YOUR_CALM when they come too fast. */
static void h2_glitch(struct h2_conn *c)
{
	if (!bucket_take(&c->glitch, c->k->now, KVD_GLITCH_RATE, KVD_GLITCH_RATE * 10))
		h2_fail(c, H2_ENHANCE_YOUR_CALM, "too_many_glitches");
}

/*
 * Recently closed streams (RFC 9113 5.1).  Frames the peer sent before it
 * saw kvd's RST_STREAM are in flight and ignored; any other frame on a
 * closed stream is the peer's error (STREAM_CLOSED).
 */
enum { H2_GONE_UNKNOWN, H2_GONE_CLOSED, H2_GONE_RESET_BY_KVD };

static void h2_remember_closed(struct h2_conn *c, uint32_t sid, int reset_by_kvd)
{
	c->closed_ring[c->closed_pos++ % KVD_COUNT(c->closed_ring)] = sid << 1 | (reset_by_kvd ? 1 : 0);
}

static int h2_closed_how(struct h2_conn *c, uint32_t sid)
{
	unsigned i, how = H2_GONE_UNKNOWN;

	for (i = 0; i < KVD_COUNT(c->closed_ring); i++) /* the newest entry for sid decides */
		if (c->closed_ring[(c->closed_pos - 1 - i) % KVD_COUNT(c->closed_ring)] >> 1 == sid) {
			how = c->closed_ring[(c->closed_pos - 1 - i) % KVD_COUNT(c->closed_ring)] & 1 ?
			      H2_GONE_RESET_BY_KVD : H2_GONE_CLOSED;
			break;
		}
	return (int)how;
}

/* RST_STREAM from kvd: late frames of sid are ignored from now on. */
static void h2_rst(struct h2_conn *c, uint32_t sid, enum h2_error code)
{
	h2_frame_u32(c, H2_RST_STREAM, sid, code);
	c->k->st.rst_sent++;
	h2_remember_closed(c, sid, 1);
}

static struct h2_stream *h2_stream_find(struct h2_conn *c, uint32_t sid)
{
	unsigned i;

	for (i = 0; i < c->nst; i++)
		if (c->st[i]->id == sid)
			return c->st[i];
	return NULL;
}

static struct h2_stream *h2_stream_new(struct h2_conn *c, uint32_t sid)
{
	struct kvd *k = c->k;
	struct h2_stream *s;

	if (UTIL_GROW(k, c->st, c->stcap, (size_t)c->nst + 1, 8))
		return NULL;
	s = kvd_calloc(k, sizeof *s);
	if (!s)
		return NULL;
	call_init(k, &s->call, NULL, &grpc_h2_carrier);
	s->call.conn = c->conn;
	s->c = c;
	s->id = sid;
	s->send_window = c->peer_init_window;
	s->recv_window = KVD_STREAM_WINDOW;
	s->http_status = 200;
	s->opened = k->now;
	c->st[c->nst++] = s;
	return s;
}

static void h2_credit(struct h2_conn *c);
static void h2_release(struct h2_stream *s);
static void h2_recharge(struct h2_stream *s);

/* Forget a stream: service state, buffers.  Late frames for its id are
 * ignored (reset ring).  Never called from inside a service handler. */
static void h2_stream_close(struct h2_conn *c, struct h2_stream *s)
{
	struct kvd *k = c->k;
	unsigned i;

	for (i = 0; i < c->nst; i++)
		if (c->st[i] == s) {
			c->st[i] = c->st[--c->nst];
			break;
		}
	call_fini(k, &s->call);
#ifndef KVD_NO_HTTP
	http_h2_free(k, s);
#endif
	if (h2_closed_how(c, s->id) != H2_GONE_RESET_BY_KVD)
		h2_remember_closed(c, s->id, 0);
	h2_release(s);
	buf_free(k, &s->in);
	h2_recharge(s);
	kvd_free(k, s);
	c->conn->t_active = k->now; /* a call ended: progress */
	if (k->cfg.idle_timeout_ms)
		util_wake_by(k, k->now + k->cfg.idle_timeout_ms);
	if (!c->nst) {
		if (c->goaway_sent)
			c->conn->is_closing = 1;
		if (!c->stcap || c->stcap > 8) { /* shrink after a burst */
			kvd_free(k, c->st);
			c->st = NULL;
			c->stcap = 0;
		}
	}
	h2_credit(c);
}

/* Stream error (section 5.4.2): RST_STREAM and forget the stream. */
static void h2_stream_error(struct h2_conn *c, uint32_t sid, enum h2_error code)
{
	struct h2_stream *s = h2_stream_find(c, sid);

	h2_rst(c, sid, code);
	if (s)
		h2_stream_close(c, s);
	h2_glitch(c);
}

/*
 * Request flow control.  What a client may have in flight, hence what kvd
 * may have to buffer, is bounded by stream windows alone:
 *
 *   - the connection window is credited back as data arrives, always.
 *     Holding it back to bound memory deadlocks: once the buffered bytes
 *     all belong to messages still incomplete, nothing can complete and
 *     nothing frees (four concurrent 1.5 MiB requests sent interleaved, as
 *     grpcio does, did exactly that);
 *   - a stream's window is its initial 64 KiB, topped back up only as its
 *     messages are consumed, so a small message never waits for anyone;
 *   - a message announced (by its gRPC prefix) as larger than the window
 *     gets a grant for all of it at once, as grpc-go does, out of a budget
 *     of KVD_MAX_CONN_INPUT per connection.  Messages that do not fit wait,
 *     oldest stream first, until a granted one is consumed or dropped; when
 *     nothing is granted the next one goes whatever its size, so one large
 *     message always makes progress.
 *
 * So a connection buffers at most KVD_MAX_CONN_INPUT (or one message) plus
 * 64 KiB per open stream, and every message can complete.  Across all
 * connections, what streams buffer (a granted message counted whole) is one
 * budget, --max-request-buffer (h2_recharge, net_shed): past it, the address
 * holding the most loses its largest, so parking unfinished messages on many
 * connections costs kvd the budget, not 64 KiB times every stream.
 */
static void h2_credit(struct h2_conn *c)
{
	if (c->recv_owed && c->recv_window <= KVD_CONN_WINDOW / 2) {
		h2_frame_u32(c, H2_WINDOW_UPDATE, 0, c->recv_owed);
		c->recv_window += c->recv_owed;
		c->recv_owed = 0;
	}
}

/* The gRPC layer consumed request bytes of s: top the stream window back
 * up to its initial size once a quarter of it is used. */
static void h2_consumed(struct h2_stream *s)
{
	struct h2_conn *c = s->c;
	int64_t deficit;

	if (!s->remote_closed) {
		deficit = KVD_STREAM_WINDOW - s->recv_window;
		if (deficit >= KVD_STREAM_WINDOW / 4) {
			h2_frame_u32(c, H2_WINDOW_UPDATE, s->id, (uint32_t)deficit);
			s->recv_window += deficit;
		}
	}
	h2_credit(c);
}

/*
 * A message of msg bytes (prefix included) is announced and its first
 * BUF_LEN(&s->in) bytes are here: open the stream window for the rest at
 * once if the budget allows, else queue the stream for a grant.
 */
static void h2_grant(struct h2_stream *s, size_t msg)
{
	struct h2_conn *c = s->c;
	int64_t grant = (int64_t)msg - (int64_t)BUF_LEN(&s->in) - s->recv_window;

	s->want_grant = 0;
	if (grant <= 0 || s->remote_closed || s->reserved)
		return; /* it fits the window it has */
	if (c->reserved && c->reserved + msg > KVD_MAX_CONN_INPUT) {
		s->want_grant = 1;
		s->grant_msg = msg;
		return;
	}
	s->reserved = msg;
	c->reserved += msg;
	h2_frame_u32(c, H2_WINDOW_UPDATE, s->id, (uint32_t)grant);
	s->recv_window += grant;
	h2_recharge(s);
}

/* s's granted message was consumed, dropped or its stream closed: its share
 * of the budget goes to the waiting streams, oldest (lowest id) first. */
static void h2_release(struct h2_stream *s)
{
	struct h2_conn *c = s->c;
	struct h2_stream *next;
	unsigned i;

	s->want_grant = 0;
	if (!s->reserved)
		return;
	c->reserved -= s->reserved;
	s->reserved = 0;
	h2_recharge(s);
	for (;;) {
		next = NULL;
		for (i = 0; i < c->nst; i++)
			if (c->st[i]->want_grant && c->st[i] != s && (!next || c->st[i]->id < next->id))
				next = c->st[i];
		if (!next)
			return;
		h2_grant(next, next->grant_msg);
		if (next->want_grant) /* still no room */
			return;
	}
}

/* What s counts toward --max-request-buffer: the bytes it buffers, or all
 * of a granted message (the grant promised room for it). */
static void h2_recharge(struct h2_stream *s)
{
	uint64_t now = KVD_MAX((uint64_t)BUF_LEN(&s->in), (uint64_t)s->reserved);

	if (now != s->charge) {
		net_held(s->c->k, s->c->conn, (int64_t)now - (int64_t)s->charge);
		s->charge = now;
	}
}

/* Over --max-request-buffer (net_shed): the stream holding the most of this
 * connection's buffered request bytes ends RESOURCE_EXHAUSTED, its bytes
 * dropped.  1 if there was one. */
static int h2_shed(struct kvd *k, struct h2_conn *c)
{
	struct h2_stream *v = NULL;
	unsigned i;

	for (i = 0; i < c->nst; i++)
		if (c->st[i]->charge && !c->st[i]->call.finished && (!v || c->st[i]->charge > v->charge))
			v = c->st[i];
	if (!v)
		return 0;
	kvd_log(k, KVD_LOG_INFO, "%s: stream %u: %llu request bytes dropped (--max-request-buffer is full; this "
	        "address holds the most)", c->conn->peer, v->id, (unsigned long long)v->charge);
	call_finish(k, &v->call, GRPC_RESOURCE_EXHAUSTED, "%s", E_INPUT_FULL);
	return 1;
}

static int h2_token_char(unsigned char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
	       (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static int h2_is(const struct hp_field *f, const char *name)
{
	size_t n = strlen(name);

	return f->nlen == n && !memcmp(f->name, name, n);
}

/*
 * Check one field (RFC 9113 8.2): lowercase token name, no NUL/CR/LF, no
 * leading or trailing white space in the value.
 */
static int h2_field_ok(const struct hp_field *f)
{
	uint32_t i, start = f->nlen && f->name[0] == ':';

	if (f->nlen == start)
		return 0;
	for (i = start; i < f->nlen; i++)
		if (!h2_token_char((unsigned char)f->name[i]))
			return 0;
	for (i = 0; i < f->vlen; i++)
		if (f->value[i] == 0 || f->value[i] == '\r' || f->value[i] == '\n')
			return 0;
	if (f->vlen && (f->value[0] == ' ' || f->value[0] == '\t' ||
	                f->value[f->vlen - 1] == ' ' || f->value[f->vlen - 1] == '\t'))
		return 0;
	return 1;
}

/* Connection-specific fields are forbidden in HTTP/2 (8.2.2). */
static int h2_forbidden(const struct hp_field *f)
{
	return h2_is(f, "connection") || h2_is(f, "keep-alive") ||
	       h2_is(f, "proxy-connection") || h2_is(f, "transfer-encoding") ||
	       h2_is(f, "upgrade") ||
	       (h2_is(f, "te") && !(f->vlen == 8 && !memcmp(f->value, "trailers", 8)));
}

/*
 * Validate a request header list (8.3) and pick out what HTTP/2 and gRPC
 * need.  Returns 0 or -1 when malformed.
 */
static int h2_parse_request(const struct hp_field *f, unsigned nf, struct h2_req *rq)
{
	struct kvd_slice *ps;
	unsigned i, regular = 0;
	uint32_t j;

	memset(rq, 0, sizeof *rq);
	for (i = 0; i < nf; i++, f++) {
		if (!h2_field_ok(f))
			return KVD_EPROTO;
		if (f->name[0] == ':') {
			if (regular)
				return KVD_EPROTO;
			ps = h2_is(f, ":method") ? &rq->method : h2_is(f, ":scheme") ? &rq->scheme :
			     h2_is(f, ":path") ? &rq->path : h2_is(f, ":authority") ? &rq->authority : NULL;
			if (!ps || ps->p)
				return KVD_EPROTO;
			ps->p = (const uint8_t *)f->value;
			ps->n = f->vlen;
			if (!ps->p)
				ps->p = (const uint8_t *)"";
			continue;
		}
		regular = 1;
		if (h2_forbidden(f))
			return KVD_EPROTO;
		if (h2_is(f, "content-type")) {
			rq->ctype.p = (const uint8_t *)f->value;
			rq->ctype.n = f->vlen;
		} else if (h2_is(f, "grpc-timeout")) {
			rq->timeout.p = (const uint8_t *)f->value;
			rq->timeout.n = f->vlen;
		} else if (h2_is(f, "grpc-encoding")) {
			rq->encoding.p = (const uint8_t *)f->value;
			rq->encoding.n = f->vlen;
		} else if (h2_is(f, "content-length")) {
			if (rq->has_cl || !f->vlen || f->vlen > 18)
				return KVD_EPROTO;
			rq->has_cl = 1;
			for (j = 0; j < f->vlen; j++) {
				if (f->value[j] < '0' || f->value[j] > '9')
					return KVD_EPROTO;
				rq->content_length = rq->content_length * 10 + (uint64_t)(f->value[j] - '0');
			}
		}
	}
	if (!rq->method.n || !rq->scheme.n || !rq->path.n)
		return KVD_EPROTO;
	return 0;
}

/* Trailers from the client: END_STREAM, no pseudo-fields (8.1). */
static void h2_on_trailers(struct kvd *k, struct h2_conn *c, struct h2_stream *s,
                           unsigned flags, const struct hp_out *o)
{
	unsigned i;

	if (s->remote_closed) {
		h2_stream_error(c, s->id, H2_STREAM_CLOSED);
		return;
	}
	if (!(flags & H2_F_END_STREAM) || o->over) {
		h2_stream_error(c, s->id, H2_PROTOCOL_ERROR);
		return;
	}
	for (i = 0; i < o->nf; i++)
		if (!h2_field_ok(&o->f[i]) || o->f[i].name[0] == ':' || h2_forbidden(&o->f[i])) {
			h2_stream_error(c, s->id, H2_PROTOCOL_ERROR);
			return;
		}
	if (s->has_cl && s->data_seen != s->content_length) {
		h2_stream_error(c, s->id, H2_PROTOCOL_ERROR);
		return;
	}
	s->remote_closed = 1;
#ifndef KVD_NO_HTTP
	if (s->hx) {
		http_h2_data(k, s, NULL, 0);
		return;
	}
#endif
	grpc_on_remote_close(k, s);
}

/* Is this request gRPC?  As etcd's grpcHandlerFunc decides: its
 * content-type contains "application/grpc"; the rest is HTTP (section 32:
 * /health, /metrics, the gateway), as on HTTP/1.1. */
static int h2_is_grpc(struct kvd_slice ctype)
{
	size_t i;

	for (i = 0; i + 16 <= ctype.n; i++)
		if (!memcmp(ctype.p + i, "application/grpc", 16))
			return 1;
	return 0;
}

/* A complete header block for stream sid. */
static void h2_on_block(struct kvd *k, struct h2_conn *c, uint32_t sid, unsigned flags,
                        int self_dep, const uint8_t *p, size_t n)
{
	struct hp_out o;
	struct h2_stream *s;
	struct h2_req rq;
	int r;

	hp_out_init(&o, k->hf, KVD_MAX_HEADER_FIELDS, k->harena, sizeof k->harena);
	r = hp_decode(k, &c->dec, p, n, &o); /* always: keeps HPACK in sync */
	if (r == KVD_ENOMEM) {
		h2_fail(c, H2_INTERNAL_ERROR, "out of memory");
		return;
	}
	if (r) {
		h2_fail(c, H2_COMPRESSION_ERROR, "hpack decoding failed");
		return;
	}
	if ((s = h2_stream_find(c, sid))) {
		h2_on_trailers(k, c, s, flags, &o);
		return;
	}
	if (sid <= c->last_sid) {
		switch (h2_closed_how(c, sid)) {
		case H2_GONE_RESET_BY_KVD: break; /* sent before our RST_STREAM arrived */
		case H2_GONE_CLOSED: h2_stream_error(c, sid, H2_STREAM_CLOSED); break;
		default: h2_fail(c, H2_PROTOCOL_ERROR, "stream id not increasing");
		}
		return;
	}
	c->last_sid = sid;
	if (c->goaway_sent) /* past our final GOAWAY: ignored (6.8) */
		return;
	if (self_dep) {
		h2_stream_error(c, sid, H2_PROTOCOL_ERROR);
		return;
	}
	if (c->nst >= k->cfg.max_concurrent_streams) {
		h2_stream_error(c, sid, H2_REFUSED_STREAM);
		return;
	}
	if (!o.over && h2_parse_request(o.f, o.nf, &rq)) {
		h2_stream_error(c, sid, H2_PROTOCOL_ERROR);
		return;
	}
	if (!(s = h2_stream_new(c, sid))) {
		h2_rst(c, sid, H2_REFUSED_STREAM);
		return;
	}
	k->st.calls++;
	c->conn->t_active = k->now; /* a new call: progress */
	if (flags & H2_F_END_STREAM)
		s->remote_closed = 1;
	if (o.over) { /* answered, not served: the list broke kvd's caps */
		h2_glitch(c);
		call_finish(k, &s->call, GRPC_RESOURCE_EXHAUSTED,
		            "kvd: request header list too large (limits: %d bytes, %d fields)",
		            KVD_MAX_HEADER_LIST, KVD_MAX_HEADER_FIELDS);
		s->discard = 1;
		return;
	}
	s->has_cl = rq.has_cl;
	s->content_length = rq.content_length;
	if (s->remote_closed && s->has_cl && s->content_length) {
		h2_stream_error(c, sid, H2_PROTOCOL_ERROR);
		return;
	}
#ifndef KVD_NO_HTTP
	if (c->conn->metrics_only || !h2_is_grpc(rq.ctype)) { /* a metrics listener serves HTTP only */
		http_h2_begin(k, s, &rq, o.f, o.nf);
		return;
	}
#endif
	if (call_keep_meta(k, &s->call, o.f, o.nf)) {
		call_finish(k, &s->call, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return;
	}
	grpc_on_headers(k, s, &rq);
	if (s->remote_closed)
		grpc_on_remote_close(k, s);
}

static void h2_on_headers(struct kvd *k, struct h2_conn *c, unsigned flags, uint32_t sid,
                          const uint8_t *p, size_t n)
{
	int self_dep = 0;
	unsigned pad = 0;

	if (!sid || !(sid & 1)) {
		h2_fail(c, H2_PROTOCOL_ERROR, "bad HEADERS stream id");
		return;
	}
	if (flags & H2_F_PADDED) {
		if (n < 1 || (pad = p[0]) >= n) {
			h2_fail(c, H2_PROTOCOL_ERROR, "bad padding");
			return;
		}
		p++;
		n -= 1 + pad;
	}
	if (flags & H2_F_PRIORITY) {
		if (n < 5) {
			h2_fail(c, H2_FRAME_SIZE_ERROR, "short PRIORITY fields");
			return;
		}
		self_dep = (get_be32(p) & 0x7fffffff) == sid;
		p += 5;
		n -= 5;
	}
	if (flags & H2_F_END_HEADERS) {
		h2_on_block(k, c, sid, flags, self_dep, p, n);
		return;
	}
	/* the block continues: collect it (rare with gRPC clients) */
	if (n > KVD_MAX_HEADER_BLOCK) {
		h2_fail(c, H2_ENHANCE_YOUR_CALM, "header block too large");
		return;
	}
	if (!c->hblk && !(c->hblk = kvd_malloc(k, KVD_MAX_HEADER_BLOCK))) {
		h2_fail(c, H2_INTERNAL_ERROR, "out of memory");
		return;
	}
	memcpy(c->hblk, p, n);
	c->hblk_len = n;
	c->hblk_sid = sid;
	c->hblk_flags = (uint8_t)((flags & H2_F_END_STREAM) | (self_dep ? 0x80 : 0));
	c->hblk_frames = 0;
}

static void h2_on_continuation(struct kvd *k, struct h2_conn *c, unsigned flags, uint32_t sid,
                               const uint8_t *p, size_t n)
{
	if (!c->hblk_sid || sid != c->hblk_sid) {
		h2_fail(c, H2_PROTOCOL_ERROR, "unexpected CONTINUATION");
		return;
	}
	if (++c->hblk_frames > KVD_MAX_CONTINUATIONS || n > KVD_MAX_HEADER_BLOCK - c->hblk_len) {
		h2_fail(c, H2_ENHANCE_YOUR_CALM, "header block too large");
		return;
	}
	memcpy(c->hblk + c->hblk_len, p, n);
	c->hblk_len += n;
	if (flags & H2_F_END_HEADERS) {
		uint8_t f = c->hblk_flags;
		c->hblk_sid = 0;
		h2_on_block(k, c, sid, f & H2_F_END_STREAM, f >> 7, c->hblk, c->hblk_len);
		kvd_free(k, c->hblk);
		c->hblk = NULL;
	}
}

static void h2_on_data(struct kvd *k, struct h2_conn *c, unsigned flags, uint32_t sid,
                       const uint8_t *p, size_t n)
{
	struct h2_stream *s;
	size_t flen = n; /* padding counts against the windows too (6.9.1) */
	unsigned pad;

	if (!sid) {
		h2_fail(c, H2_PROTOCOL_ERROR, "DATA on stream 0");
		return;
	}
	if ((int64_t)flen > c->recv_window) {
		h2_fail(c, H2_FLOW_CONTROL_ERROR, "connection window exceeded");
		return;
	}
	c->recv_window -= (int64_t)flen;
	c->recv_owed += (uint32_t)flen;
	if (flags & H2_F_PADDED) {
		if (n < 1 || (pad = p[0]) >= n) {
			h2_fail(c, H2_PROTOCOL_ERROR, "bad padding");
			return;
		}
		p++;
		n -= 1 + pad;
	}
	s = h2_stream_find(c, sid);
	if (!s) {
		if (sid > c->last_sid)
			h2_fail(c, H2_PROTOCOL_ERROR, "DATA on idle stream");
		else if (h2_closed_how(c, sid) != H2_GONE_RESET_BY_KVD)
			h2_stream_error(c, sid, H2_STREAM_CLOSED);
		h2_credit(c);
		return;
	}
	if (s->remote_closed) {
		h2_stream_error(c, sid, H2_STREAM_CLOSED);
		h2_credit(c);
		return;
	}
	if ((int64_t)flen > s->recv_window) {
		h2_stream_error(c, sid, H2_FLOW_CONTROL_ERROR);
		h2_credit(c);
		return;
	}
	s->recv_window -= (int64_t)flen;
	if (!n && !(flags & H2_F_END_STREAM))
		h2_glitch(c); /* empty DATA frames are a known flood (CVE-2019-9518) */
	s->data_seen += n;
	if (s->has_cl && (s->data_seen > s->content_length ||
	                  ((flags & H2_F_END_STREAM) && s->data_seen != s->content_length))) {
		h2_stream_error(c, sid, H2_PROTOCOL_ERROR);
		h2_credit(c);
		return;
	}
	if (flags & H2_F_END_STREAM)
		s->remote_closed = 1;
#ifndef KVD_NO_HTTP
	if (s->hx) {
		if (n)
			c->conn->t_active = k->now;
		http_h2_data(k, s, p, n);
	} else
#endif
	if (s->discard || buf_append(k, &s->in, p, n)) {
		if (!s->discard)
			call_finish(k, &s->call, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	} else {
		if (n)
			c->conn->t_active = k->now; /* request data: progress */
		grpc_on_data(k, s);
	}
	if ((flags & H2_F_END_STREAM) && !s->hx)
		grpc_on_remote_close(k, s);
	h2_recharge(s);
	if (k->in_held > k->cfg.max_request_buffer)
		net_shed(k); /* what stays buffered is over the budget of all connections */
	h2_credit(c);
}

static void h2_on_rst(struct h2_conn *c, uint32_t sid, size_t n)
{
	struct h2_stream *s;

	if (n != 4) {
		h2_fail(c, H2_FRAME_SIZE_ERROR, "bad RST_STREAM length");
		return;
	}
	if (!sid || sid > c->last_sid) {
		h2_fail(c, H2_PROTOCOL_ERROR, "RST_STREAM on idle stream");
		return;
	}
	/* Rapid Reset (CVE-2023-44487) opens streams and resets them at once,
	 * so the stream limit never bites: the rate of such resets does.  A
	 * stream the client waited on (older than KVD_RST_YOUNG_MS: a deadline
	 * that expired, a watch it closed) is an honest cancel, and one kvd has
	 * closed already cost nothing: neither counts, so a storm of expiring
	 * deadlines never takes the connection's other calls with it. */
	s = h2_stream_find(c, sid);
	if (s && c->k->now - s->opened < KVD_RST_YOUNG_MS &&
	    !bucket_take(&c->rst, c->k->now, KVD_RST_RATE, KVD_RST_RATE * 2)) {
		h2_fail(c, H2_ENHANCE_YOUR_CALM, "too_many_resets");
		return;
	}
	if (s)
		h2_stream_close(c, s);
}

static void h2_on_settings(struct kvd *k, struct h2_conn *c, unsigned flags, uint32_t sid,
                           const uint8_t *p, size_t n)
{
	uint32_t id, v;
	int64_t delta;
	size_t i;
	unsigned j;

	if (sid) {
		h2_fail(c, H2_PROTOCOL_ERROR, "SETTINGS on a stream");
		return;
	}
	if (flags & H2_F_ACK) {
		if (n)
			h2_fail(c, H2_FRAME_SIZE_ERROR, "SETTINGS ACK with payload");
		return;
	}
	if (n % 6) {
		h2_fail(c, H2_FRAME_SIZE_ERROR, "bad SETTINGS length");
		return;
	}
	if (n / 6 > KVD_MAX_SETTINGS) {
		h2_fail(c, H2_ENHANCE_YOUR_CALM, "too many settings");
		return;
	}
	for (i = 0; i < n; i += 6) {
		id = get_be16(p + i);
		v = get_be32(p + i + 2);
		switch (id) {
		case H2_SET_HEADER_TABLE_SIZE: /* sizes the peer's decoder, i.e. our encoder */
			if (v < HP_TABLE_SIZE)
				c->need_tsu = 1; /* we never index: announce size 0 once */
			break;
		case H2_SET_ENABLE_PUSH:
			if (v > 1) {
				h2_fail(c, H2_PROTOCOL_ERROR, "bad ENABLE_PUSH");
				return;
			}
			break;
		case H2_SET_INITIAL_WINDOW_SIZE: /* a delta on every open stream (6.9.2) */
			if (v > H2_MAX_WINDOW) {
				h2_fail(c, H2_FLOW_CONTROL_ERROR, "bad INITIAL_WINDOW_SIZE");
				return;
			}
			delta = (int64_t)v - c->peer_init_window;
			for (j = 0; j < c->nst; j++) {
				c->st[j]->send_window += delta;
				if (c->st[j]->send_window > H2_MAX_WINDOW) {
					h2_fail(c, H2_FLOW_CONTROL_ERROR, "window overflow");
					return;
				}
			}
			c->peer_init_window = v;
			break;
		case H2_SET_MAX_FRAME_SIZE:
			if (v < 16384 || v > 16777215) {
				h2_fail(c, H2_PROTOCOL_ERROR, "bad MAX_FRAME_SIZE");
				return;
			}
			c->peer_max_frame = v;
			break;
		default: /* MAX_CONCURRENT_STREAMS, MAX_HEADER_LIST_SIZE (our headers are
		          * tiny), unknown ids such as grpc's 0xfe03: nothing to do */
			break;
		}
	}
	c->settings_seen = 1;
	h2_frame(c, H2_SETTINGS, H2_F_ACK, 0, NULL, 0);
	(void)k;
}

static const uint8_t h2_stop_ping[8] = {'k', 'v', 'd', '-', 's', 't', 'o', 'p'};

static void h2_goaway_final(struct h2_conn *c)
{
	uint8_t p[8];

	if (c->goaway_sent)
		return;
	put_be32(p, c->last_sid);
	put_be32(p + 4, H2_NO_ERROR);
	h2_frame(c, H2_GOAWAY, 0, 0, p, 8);
	c->goaway_sent = 1;
	c->k->st.goaway_sent++;
	if (!c->nst)
		c->conn->is_closing = 1;
}

static void h2_on_ping(struct kvd *k, struct h2_conn *c, unsigned flags, uint32_t sid,
                       const uint8_t *p, size_t n)
{
	int64_t min;

	if (n != 8) {
		h2_fail(c, H2_FRAME_SIZE_ERROR, "bad PING length");
		return;
	}
	if (sid) {
		h2_fail(c, H2_PROTOCOL_ERROR, "PING on a stream");
		return;
	}
	if (flags & H2_F_ACK) {
		if (c->draining && !memcmp(p, h2_stop_ping, 8))
			h2_goaway_final(c);
		return;
	}
	h2_frame(c, H2_PING, H2_F_ACK, 0, p, 8);
	/*
	 * Keepalive enforcement as grpc-go: a PING closer than the minimum
	 * interval (2 h when no call is open) is a strike, unless kvd sent
	 * HEADERS or DATA since the previous one (BDP pings follow our data).
	 */
	if (c->sent_since_ping) {
		c->ping_strikes = 0;
		c->sent_since_ping = 0;
	} else if (c->last_ping) {
		min = c->nst ? (int64_t)k->cfg.keepalive_min_time_ms : 2 * 3600 * 1000;
		if (k->now - c->last_ping < min && ++c->ping_strikes > KVD_PING_STRIKES) {
			h2_fail(c, H2_ENHANCE_YOUR_CALM, "too_many_pings");
			return;
		}
	}
	c->last_ping = k->now ? k->now : 1;
}

static void h2_on_window_update(struct h2_conn *c, uint32_t sid, const uint8_t *p, size_t n)
{
	struct h2_stream *s;
	uint32_t inc;

	if (n != 4) {
		h2_fail(c, H2_FRAME_SIZE_ERROR, "bad WINDOW_UPDATE length");
		return;
	}
	inc = get_be32(p) & 0x7fffffff;
	if (!sid) {
		if (!inc)
			h2_fail(c, H2_PROTOCOL_ERROR, "WINDOW_UPDATE of 0");
		else if (c->send_window + inc > H2_MAX_WINDOW)
			h2_fail(c, H2_FLOW_CONTROL_ERROR, "connection window overflow");
		else
			c->send_window += inc;
		return;
	}
	s = h2_stream_find(c, sid);
	if (!s) {
		if (sid > c->last_sid)
			h2_fail(c, H2_PROTOCOL_ERROR, "WINDOW_UPDATE on idle stream");
		return; /* closed: allowed, ignored */
	}
	if (!inc)
		h2_stream_error(c, sid, H2_PROTOCOL_ERROR);
	else if (s->send_window + inc > H2_MAX_WINDOW)
		h2_stream_error(c, sid, H2_FLOW_CONTROL_ERROR);
	else
		s->send_window += inc;
}

static void h2_on_priority(struct h2_conn *c, uint32_t sid, const uint8_t *p, size_t n)
{
	if (!sid) {
		h2_fail(c, H2_PROTOCOL_ERROR, "PRIORITY on stream 0");
		return;
	}
	if (n != 5) {
		h2_stream_error(c, sid, H2_FRAME_SIZE_ERROR);
		return;
	}
	if ((get_be32(p) & 0x7fffffff) == sid)
		h2_stream_error(c, sid, H2_PROTOCOL_ERROR);
	/* otherwise ignored: RFC 9113 5.3.2 deprecates the scheme; it opens nothing */
}

/* kvd's own preface: SETTINGS, then a bigger connection window. */
static void h2_send_preface(struct kvd *k, struct h2_conn *c)
{
	uint8_t p[18];
	size_t n = 0;

	put_be16(p + n, H2_SET_MAX_CONCURRENT_STREAMS);
	put_be32(p + n + 2, k->cfg.max_concurrent_streams);
	n += 6;
	put_be16(p + n, H2_SET_MAX_HEADER_LIST_SIZE);
	put_be32(p + n + 2, KVD_MAX_HEADER_LIST);
	n += 6;
	if (KVD_STREAM_WINDOW != H2_DEFAULT_WINDOW) {
		put_be16(p + n, H2_SET_INITIAL_WINDOW_SIZE);
		put_be32(p + n + 2, KVD_STREAM_WINDOW);
		n += 6;
	}
	h2_frame(c, H2_SETTINGS, 0, 0, p, n);
	if (KVD_CONN_WINDOW > H2_DEFAULT_WINDOW) {
		h2_frame_u32(c, H2_WINDOW_UPDATE, 0, KVD_CONN_WINDOW - H2_DEFAULT_WINDOW);
		c->recv_window = KVD_CONN_WINDOW;
	}
}

/* The first bytes were neither the HTTP/2 preface nor an HTTP/1.x request:
 * a SETTINGS and a GOAWAY PROTOCOL_ERROR (RFC 9113 3.4), then close. */
static void h2_bad_preface(struct kvd *k, struct conn *c)
{
	static const uint8_t msg[] = {
	    0, 0, 0, H2_SETTINGS, 0, 0, 0, 0, 0,
	    0, 0, 34, H2_GOAWAY, 0, 0, 0, 0, 0,
	    0, 0, 0, 0, 0, 0, 0, H2_PROTOCOL_ERROR,
	    'i', 'n', 'v', 'a', 'l', 'i', 'd', ' ', 'c', 'o', 'n', 'n', 'e', 'c', 't', 'i', 'o', 'n', ' ',
	    'p', 'r', 'e', 'f', 'a', 'c', 'e'};

	buf_append(k, &c->out, msg, sizeof msg);
	c->is_closing = 1;
	k->st.goaway_sent++;
	kvd_log(k, KVD_LOG_INFO, "%s: closing connection: invalid connection preface", c->peer);
}

/*
 * Parse and handle every complete frame in c->conn->in.  Stops early when the
 * output is over its cap (resumed once it drains) or the connection fails.
 */
static void h2_input(struct kvd *k, struct h2_conn *c)
{
	const uint8_t *p;
	size_t n, len;
	unsigned type, flags;
	uint32_t sid;

	while (!c->conn->is_closing && BUF_LEN(&c->conn->out) < KVD_MAX_OUTPUT) {
		p = BUF_DATA(&c->conn->in);
		n = BUF_LEN(&c->conn->in);
		if (!n)
			break;
		if (!c->preface_done) { /* the loop chose HTTP/2 when it began with the preface */
			if (n < H2_PREFACE_LEN)
				break;
			if (memcmp(p, H2_PREFACE, H2_PREFACE_LEN)) {
				h2_bad_preface(k, c->conn);
				return;
			}
			buf_consume(&c->conn->in, H2_PREFACE_LEN);
			c->preface_done = 1;
			h2_send_preface(k, c);
			continue;
		}
		if (n < H2_FRAME_HDR)
			break;
		len = get_be24(p);
		type = p[3];
		flags = p[4];
		sid = get_be32(p + 5) & 0x7fffffff;
		if (len > H2_DEFAULT_FRAME) {
			h2_fail(c, H2_FRAME_SIZE_ERROR, "frame larger than MAX_FRAME_SIZE");
			return;
		}
		if (n < H2_FRAME_HDR + len)
			break;
		p += H2_FRAME_HDR;
		if (!c->settings_seen && type != H2_SETTINGS) {
			h2_fail(c, H2_PROTOCOL_ERROR, "first frame is not SETTINGS");
			return;
		}
		if (c->hblk_sid && type != H2_CONTINUATION) {
			h2_fail(c, H2_PROTOCOL_ERROR, "frame inside a header block");
			return;
		}
		switch (type) {
		case H2_DATA: h2_on_data(k, c, flags, sid, p, len); break;
		case H2_HEADERS: h2_on_headers(k, c, flags, sid, p, len); break;
		case H2_PRIORITY: h2_on_priority(c, sid, p, len); break;
		case H2_RST_STREAM: h2_on_rst(c, sid, len); break;
		case H2_SETTINGS: h2_on_settings(k, c, flags, sid, p, len); break;
		case H2_PUSH_PROMISE: h2_fail(c, H2_PROTOCOL_ERROR, "PUSH_PROMISE from a client"); break;
		case H2_PING: h2_on_ping(k, c, flags, sid, p, len); break;
		case H2_GOAWAY:
			if (sid)
				h2_fail(c, H2_PROTOCOL_ERROR, "GOAWAY on a stream");
			else if (len < 8)
				h2_fail(c, H2_FRAME_SIZE_ERROR, "short GOAWAY");
			else
				h2_goaway_final(c); /* the client leaves: finish and close */
			break;
		case H2_WINDOW_UPDATE: h2_on_window_update(c, sid, p, len); break;
		case H2_CONTINUATION: h2_on_continuation(k, c, flags, sid, p, len); break;
		default: break; /* unknown frame types are ignored (5.5) */
		}
		buf_consume(&c->conn->in, H2_FRAME_HDR + len);
	}
	if (k->cfg.idle_timeout_ms)
		util_wake_by(k, c->conn->t_active + (int64_t)k->cfg.idle_timeout_ms);
}

/* grpc-message is percent-encoded: bytes outside 0x20..0x7e and '%' (grpc). */
static size_t h2_pct_encode(const char *msg, char *out, size_t cap)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;
	const unsigned char *m = (const unsigned char *)msg;

	for (; *m && o + 4 < cap; m++) {
		if (*m < 0x20 || *m > 0x7e || *m == '%') {
			out[o++] = '%';
			out[o++] = hex[*m >> 4];
			out[o++] = hex[*m & 15];
		} else {
			out[o++] = (char)*m;
		}
	}
	out[o] = 0;
	return o;
}

/* A header block b (HPACK, literal or static fields only, so it may have
 * been made before) as one HEADERS frame, after the dynamic table size
 * update the peer's SETTINGS asked for (need_tsu: cleared only once a
 * block is queued).  0, or KVD_ENOMEM with nothing queued. */
static int h2_send_block(struct h2_conn *c, uint32_t sid, const struct kvd_buf *b, int end)
{
	struct kvd *k = c->k;
	struct kvd_buf t = {0};
	unsigned flags = H2_F_END_HEADERS | (end ? H2_F_END_STREAM : 0);
	int r;

	if (b->err)
		return KVD_ENOMEM;
	if (c->need_tsu) {
		buf_append(k, &t, "\x20", 1);
		buf_append(k, &t, BUF_DATA(b), BUF_LEN(b));
		r = t.err ? KVD_ENOMEM : h2_frame(c, H2_HEADERS, flags, sid, BUF_DATA(&t), BUF_LEN(&t));
		buf_free(k, &t);
	} else {
		r = h2_frame(c, H2_HEADERS, flags, sid, BUF_DATA(b), BUF_LEN(b));
	}
	if (r)
		return r;
	c->need_tsu = 0;
	c->sent_since_ping = 1;
	return 0;
}

/* Response HEADERS (and, for Trailers-Only, the status fields). */
static int h2_send_headers(struct h2_conn *c, struct h2_stream *s, int with_status, int end)
{
	struct kvd *k = c->k;
	struct kvd_buf b = {0};
	char code[8], msg[1024];
	int r;

	if (!s->hdrs_sent) {
		hp_put_status(k, &b, s->http_status);
		if (s->ctype_proto)
			hp_put_field(k, &b, 31, NULL, "application/grpc+proto", 22);
		else
			hp_put_field(k, &b, 31, NULL, "application/grpc", 16);
	}
	if (with_status) {
		snprintf(code, sizeof code, "%d", s->call.status);
		hp_put_field(k, &b, 0, "grpc-status", code, strlen(code));
		h2_pct_encode(s->call.status_msg ? s->call.status_msg : "", msg, sizeof msg);
		hp_put_field(k, &b, 0, "grpc-message", msg, strlen(msg));
	}
	r = h2_send_block(c, s->id, &b, end);
	buf_free(k, &b);
	if (r)
		return r; /* nothing was queued: the same block is made again on the next flush */
	s->hdrs_sent = 1;
	return 0;
}

/*
 * DATA from b on stream s, within min(connection window, stream window,
 * peer frame size) and while the connection's output is under
 * KVD_MAX_OUTPUT; with fin, the frame that empties b carries END_STREAM.
 * 0 while b waits (for a window: the stall clock runs, h2_timers; or for
 * room), 1 once b is empty, 2 once it is empty and the stream ended.
 */
static int h2_send_data(struct kvd *k, struct h2_conn *c, struct h2_stream *s, struct kvd_buf *b, int fin)
{
	int64_t room;
	size_t n;
	int last = 0;

	while (BUF_LEN(b) && BUF_LEN(&c->conn->out) < KVD_MAX_OUTPUT) {
		room = KVD_MIN(c->send_window, s->send_window);
		if (room <= 0) {
			if (!s->stalled_since) {
				s->stalled_since = k->now ? k->now : 1;
				if (k->cfg.stall_timeout_ms)
					util_wake_by(k, k->now + k->cfg.stall_timeout_ms);
			}
			return 0;
		}
		n = KVD_MIN(BUF_LEN(b), (size_t)KVD_MIN(room, (int64_t)c->peer_max_frame));
		last = fin && n == BUF_LEN(b);
		if (h2_frame(c, H2_DATA, last ? H2_F_END_STREAM : 0, s->id, BUF_DATA(b), n))
			return 0;
		buf_consume(b, n);
		c->send_window -= (int64_t)n;
		s->send_window -= (int64_t)n;
		c->sent_since_ping = 1;
	}
	s->stalled_since = 0;
	if (BUF_LEN(b))
		return 0; /* the connection's output is full */
	buf_trim(k, b, 16384);
	return last ? 2 : 1;
}

/*
 * Move what stream s may send into c->conn->out: response HEADERS, DATA within
 * min(connection window, stream window, peer frame size), then trailers.  A
 * producing stream (RangeStream, Watch, Snapshot, Observe) makes its next message only
 * when its queue is empty and the window is open, so a slow reader holds one
 * message, not the whole answer.  Returns 1 when the stream ended and was freed.
 */
static int h2_stream_send(struct kvd *k, struct h2_conn *c, struct h2_stream *s)
{
	int64_t room;

#ifndef KVD_NO_HTTP
	if (s->hx)
		return http_h2_send(k, c, s);
#endif
	if (KVD_NEVER(s->call.held)) /* the durability contract: see loop_log_flush */
		return 0;
	for (;;) {
		room = KVD_MIN(c->send_window, s->send_window);
		if (!BUF_LEN(&s->call.out) && s->call.produce && !s->call.finished && room > 0 && BUF_LEN(&c->conn->out) < KVD_MAX_OUTPUT) {
			s->call.m->on_produce(k, &s->call);
			if (!BUF_LEN(&s->call.out) && !s->call.finished)
				return 0; /* nothing more for now */
		}
		if (!s->hdrs_sent) {
			if (s->call.finished && !BUF_LEN(&s->call.out)) { /* Trailers-Only */
				if (h2_send_headers(c, s, 1, 1))
					return 0;
				goto ended;
			}
			if (!BUF_LEN(&s->call.out) || h2_send_headers(c, s, 0, 0))
				return 0;
		}
		if (!h2_send_data(k, c, s, &s->call.out, 0))
			return 0;
		if (s->call.finished)
			break;
		if (!s->call.produce || BUF_LEN(&c->conn->out) >= KVD_MAX_OUTPUT ||
		    KVD_MIN(c->send_window, s->send_window) <= 0)
			return 0; /* the next message waits for room */
	}
	if (h2_send_headers(c, s, 1, 1))
		return 0;
ended:
	if (!s->remote_closed) /* early server closure (gRPC over HTTP/2) */
		h2_rst(c, s->id, H2_NO_ERROR);
	h2_stream_close(c, s);
	return 1;
}

/* Send what every stream can; round-robin start for fairness. */
static void h2_flush(struct kvd *k, struct h2_conn *c)
{
	unsigned i, start, n;

	if (c->conn->is_closing)
		return;
	n = c->nst;
	if (!n)
		return;
	start = c->rr++ % n;
	for (i = 0; i < n && c->nst; i++) {
		unsigned idx = (start + i) % c->nst;
		h2_stream_send(k, c, c->st[idx]);
	}
}

/*
 * Is a call being served (it has its request: a unary call being answered,
 * a Watch, a keep-alive stream)?  A connection that is not busy and makes
 * no progress -- no new call, no request data -- for --max-idle-time is
 * closed; pings, window updates and settings are not progress, so they
 * cannot hold a connection slot.
 */
static int h2_busy(const struct h2_conn *c)
{
	unsigned i;

	for (i = 0; i < c->nst; i++)
		if (c->st[i]->call.got_msg)
			return 1;
	return 0;
}

/* Per-connection timers; returns the next time this connection needs a look. */
static int64_t h2_timers(struct kvd *k, struct h2_conn *c)
{
	int64_t next = INT64_MAX, now = k->now;
	unsigned i;

	if (!c->settings_seen) {
		if (now - c->conn->t_open >= KVD_PREFACE_TIMEOUT_MS) {
			c->conn->is_closing = c->goaway_sent = 1; /* never spoke HTTP/2 */
			return next;
		}
		next = c->conn->t_open + KVD_PREFACE_TIMEOUT_MS;
	}
	if (c->draining && !c->goaway_sent) {
		if (now - c->t_drain_ping >= 1000)
			h2_goaway_final(c); /* no PING ACK: go on without it */
		else
			next = KVD_MIN(next, c->t_drain_ping + 1000);
	}
	if (k->cfg.idle_timeout_ms && c->settings_seen && !c->conn->is_closing && !h2_busy(c)) {
		if (now - c->conn->t_active >= (int64_t)k->cfg.idle_timeout_ms)
			h2_fail(c, H2_NO_ERROR, "max_idle");
		else
			next = KVD_MIN(next, c->conn->t_active + (int64_t)k->cfg.idle_timeout_ms);
	}
	for (i = 0; i < c->nst; i++) {
		struct h2_stream *s = c->st[i];
		if (s->call.deadline && !s->call.finished) {
			if (now * 1000 >= s->call.deadline)
				call_finish(k, &s->call, GRPC_DEADLINE_EXCEEDED, "context deadline exceeded");
			else
				next = KVD_MIN(next, (s->call.deadline + 999) / 1000);
		}
		if (s->stalled_since && k->cfg.stall_timeout_ms) {
			if (now - s->stalled_since >= (int64_t)k->cfg.stall_timeout_ms) {
				kvd_log(k, KVD_LOG_INFO, "%s: stream %u stalled on a zero window, reset",
				        c->conn->peer, s->id);
				h2_rst(c, s->id, H2_CANCEL);
				h2_stream_close(c, s);
				i--;
				continue;
			}
			next = KVD_MIN(next, s->stalled_since + (int64_t)k->cfg.stall_timeout_ms);
		}
	}
	return next;
}

/* Begin a graceful shutdown of c (6.8): GOAWAY(2^31-1), PING, then the real
 * last stream id once the PING comes back. */
static void h2_drain(struct kvd *k, struct h2_conn *c)
{
	uint8_t p[8];

	if (c->draining || c->goaway_sent)
		return;
	if (!c->settings_seen) {
		c->conn->is_closing = c->goaway_sent = 1;
		return;
	}
	c->draining = 1;
	put_be32(p, 0x7fffffff);
	put_be32(p + 4, H2_NO_ERROR);
	h2_frame(c, H2_GOAWAY, 0, 0, p, 8);
	h2_frame(c, H2_PING, 0, 0, h2_stop_ping, 8);
	c->t_drain_ping = k->now;
	util_wake_by(k, k->now + 1000);
}

/* HTTP/2 on connection cn (its first bytes were the preface). */
static struct h2_conn *h2_conn_new(struct kvd *k, struct conn *cn)
{
	struct h2_conn *c = kvd_calloc(k, sizeof *c);

	if (!c)
		return NULL;
	c->k = k;
	c->conn = cn;
	hp_table_init(&c->dec);
	c->send_window = H2_DEFAULT_WINDOW;
	c->recv_window = H2_DEFAULT_WINDOW;
	c->peer_max_frame = H2_DEFAULT_FRAME;
	c->peer_init_window = H2_DEFAULT_WINDOW;
	bucket_init(&c->rst, KVD_RST_RATE * 2, k->now);
	bucket_init(&c->glitch, KVD_GLITCH_RATE * 10, k->now);
	util_wake_by(k, cn->t_open + KVD_PREFACE_TIMEOUT_MS);
	return c;
}

static void h2_conn_free(struct kvd *k, struct h2_conn *c)
{
	if (!c)
		return;
	while (c->nst)
		h2_stream_close(c, c->st[c->nst - 1]);
	kvd_free(k, c->st);
	kvd_free(k, c->hblk);
	hp_table_free(k, &c->dec);
	kvd_free(k, c);
}

/* HTTP/2 as one of the protocols a connection may speak (section 35). */
static void h2_proto_input(struct kvd *k, struct conn *c) { h2_input(k, c->ps); }
static void h2_proto_flush(struct kvd *k, struct conn *c) { h2_flush(k, c->ps); }
static int64_t h2_proto_timers(struct kvd *k, struct conn *c) { return h2_timers(k, c->ps); }
static void h2_proto_drain(struct kvd *k, struct conn *c) { h2_drain(k, c->ps); }
static void h2_proto_stop(struct kvd *k, struct conn *c)
{
	(void)k;
	h2_goaway_final(c->ps);
}
static void h2_proto_evict(struct kvd *k, struct conn *c)
{
	struct h2_conn *h = c->ps;

	(void)k;
	if (h->settings_seen)
		h2_fail(h, H2_NO_ERROR, "too_many_connections");
}
static int h2_proto_busy(const struct conn *c) { return h2_busy(c->ps); }
static int h2_proto_shed(struct kvd *k, struct conn *c) { return h2_shed(k, c->ps); }
static void h2_proto_free(struct kvd *k, struct conn *c)
{
	h2_conn_free(k, c->ps);
	c->ps = NULL;
}
static const struct net_proto h2_proto = {
	"h2", h2_proto_input, h2_proto_flush, h2_proto_timers, h2_proto_drain, h2_proto_stop, h2_proto_evict,
	h2_proto_busy, h2_proto_shed, h2_proto_free,
};

/* ===== 18. gRPC over HTTP/2: the h2 stream as a carrier (grpc_) ========== */

/*
 * gRPC over HTTP/2 (grpc-go's server transport, as etcd runs it): an h2
 * stream embeds its call (section 8) and is that call's carrier.  Its
 * HEADERS are checked here (method, content-type, grpc-timeout) and routed
 * by :path through the method table (section 28); its DATA is cut
 * into gRPC messages (a 5-byte prefix each) bounded by --max-request-bytes;
 * the call's answer goes back as HEADERS, DATA and trailers in
 * h2_stream_send (section 17).
 *
 * Invariants:
 *   1. A message is handed to its call whole, never past the receive cap
 *      (grpc_max_recv): a longer one ends the call RESOURCE_EXHAUSTED with
 *      grpc-go's text.
 *   2. A finished call's leftover request bytes are dropped and their
 *      window given back (grpc_finished), so one call cannot starve the
 *      connection's window.
 */

/* The receive cap: etcd's --max-request-bytes plus grpc's slack. */
static uint32_t grpc_max_recv(struct kvd *k)
{
	return k->cfg.max_request_bytes + KVD_GRPC_RECV_SLACK;
}

/* The call finished: request bytes still buffered are dropped, and their
 * window credited back. */
static void grpc_finished(struct kvd *k, struct call *c)
{
	struct h2_stream *s = H2_STREAM_OF(c);
	size_t n = BUF_LEN(&s->in);

	s->discard = 1;
	h2_release(s);
	if (n) {
		buf_free(k, &s->in);
		h2_consumed(s);
	}
	h2_recharge(s);
}

static const struct call_carrier grpc_h2_carrier = {"grpc", grpc_finished};

static int grpc_slice_is(struct kvd_slice v, const char *s)
{
	size_t n = strlen(s);

	return v.n == n && !memcmp(v.p, s, n);
}

/* grpc-timeout: 1-8 digits and a unit (H M S m u n), in microseconds
 * (nanoseconds round down: under 1 us, the call is over before it starts). */
static int grpc_parse_timeout(struct kvd_slice v, int64_t *us)
{
	uint64_t n = 0;
	size_t i;

	if (v.n < 2 || v.n > 9)
		return KVD_EINVAL;
	for (i = 0; i + 1 < v.n; i++) {
		if (v.p[i] < '0' || v.p[i] > '9')
			return KVD_EINVAL;
		n = n * 10 + (uint64_t)(v.p[i] - '0');
	}
	switch (v.p[v.n - 1]) {
	case 'H': *us = (int64_t)n * 3600000000ll; break;
	case 'M': *us = (int64_t)n * 60000000ll; break;
	case 'S': *us = (int64_t)n * 1000000; break;
	case 'm': *us = (int64_t)n * 1000; break;
	case 'u': *us = (int64_t)n; break;
	case 'n': *us = (int64_t)(n / 1000); break;
	default: return KVD_EINVAL;
	}
	return 0;
}

/* A new call: check method, content-type and timeout, then route :path. */
static void grpc_on_headers(struct kvd *k, struct h2_stream *s, const struct h2_req *rq)
{
	struct call *c = &s->call;
	int64_t us;

	if (!grpc_slice_is(rq->method, "POST")) {
		s->http_status = 405;
		call_finish(k, c, GRPC_INTERNAL, "invalid gRPC request method \"%.*s\"",
		            (int)KVD_MIN(rq->method.n, 64), (const char *)rq->method.p);
		return;
	}
	if (!(rq->ctype.n >= 16 && !memcmp(rq->ctype.p, "application/grpc", 16) &&
	      (rq->ctype.n == 16 || rq->ctype.p[16] == '+' || rq->ctype.p[16] == ';'))) {
		s->http_status = 415;
		call_finish(k, c, GRPC_INVALID_ARGUMENT, "invalid gRPC request content-type \"%.*s\"",
		            (int)KVD_MIN(rq->ctype.n, 64), (const char *)rq->ctype.p);
		return;
	}
	s->ctype_proto = grpc_slice_is(rq->ctype, "application/grpc+proto");
	if (rq->timeout.n) {
		if (grpc_parse_timeout(rq->timeout, &us)) {
			call_finish(k, c, GRPC_INTERNAL, "transport: malformed grpc-timeout");
			return;
		}
		if (!us) { /* as grpc-go: a deadline already past fails the call */
			call_finish(k, c, GRPC_DEADLINE_EXCEEDED, "context deadline exceeded");
			return;
		}
		c->deadline = k->now * 1000 + us;
		util_wake_by(k, (c->deadline + 999) / 1000);
	}
	if (rq->encoding.n && !grpc_slice_is(rq->encoding, "identity"))
		s->bad_encoding = 1;
	call_route(k, c, (const char *)rq->path.p, rq->path.n);
}

/* Deliver every complete message buffered on s. */
static void grpc_on_data(struct kvd *k, struct h2_stream *s)
{
	struct call *c = &s->call;
	const uint8_t *p;
	uint32_t len;
	size_t have;

	while (!c->finished && (have = BUF_LEN(&s->in)) >= 5) {
		p = BUF_DATA(&s->in);
		len = get_be32(p + 1);
		if (len > grpc_max_recv(k)) {
			call_finish(k, c, GRPC_RESOURCE_EXHAUSTED,
			            "grpc: received message larger than max (%u vs. %u)", len, grpc_max_recv(k));
			return;
		}
		if (have < 5 + (size_t)len) {
			h2_grant(s, 5 + (size_t)len);
			return;
		}
		if (p[0] > 1) {
			call_finish(k, c, GRPC_INTERNAL, "grpc: received unexpected payload format %u", p[0]);
			return;
		}
		if (s->bad_encoding) {
			const char *e = call_meta(c, "grpc-encoding");
			call_finish(k, c, GRPC_UNIMPLEMENTED,
			            "grpc: Decompressor is not installed for grpc-encoding \"%.100s\"", e ? e : "");
			return;
		}
		if (p[0] == 1) {
			call_finish(k, c, GRPC_INTERNAL, "grpc: compressed flag set with identity or empty encoding");
			return;
		}
		call_message(k, c, p + 5, len);
		if (c->finished) /* call_finish already dropped the buffer */
			return;
		buf_consume(&s->in, 5 + (size_t)len);
		h2_release(s);
		h2_consumed(s);
	}
}

/* The client sent END_STREAM. */
static void grpc_on_remote_close(struct kvd *k, struct h2_stream *s)
{
	call_half_close(k, &s->call, BUF_LEN(&s->in) != 0);
}

/* ===== 19. Auth: tokens, who is calling, and may they; password hashing (auth_) == */

/*
 * Who is calling, and may they.  A call carries a token (the metadata
 * "token", or a gateway's Authorization header) or a TLS client
 * certificate's CN; auth_who turns it into a user, and auth_may, auth_txn
 * and auth_lease_keys hold a request to that user's roles' ranges (section
 * 12 keeps users and roles).  Tokens are etcd's two kinds: simple
 * (random, kept here with a TTL) and JWT (signed and checked here, no
 * state).  Password hashing runs here too, a slice per loop turn, off the
 * handlers' path.
 *
 * A permission check: svc_range_rpc (section 21) -> auth_who (the
 * token or CN to a user) -> auth_may (auth off: allowed; the user's roles'
 * ranges) -> auth_covers -> the request, or PermissionDenied.  A Watch:
 * watch_create (section 27) -> auth_who -> auth_may ->
 * auth_watch_reason (a refused create's text, as etcd words it).
 *
 * Invariants:
 *   1. With auth off no token is looked at (auth_who, as etcd 3.7) and
 *      every check passes (auth_may, auth_admin, auth_need_user).  With it
 *      on, a token sent must be live or the call fails "invalid auth
 *      token" (auth_who); a key op needs a user whose roles cover it
 *      (auth_may), an admin call the root role (auth_admin).
 *   2. No permission is cached: each check reads the current users and
 *      roles (auth_may -> auth_covers; the interval tree auth_covers_tree
 *      builds is freed at once), so a change holds from the next check
 *      on.  A JWT from before the current auth revision is refused for key
 *      ops ("revision of auth store is old", auth_may); a simple token
 *      goes with its user's deletion or new password, and every one when
 *      auth is disabled (auth_tok_drop).
 *   3. A JWT's claims are read only once its signature checks
 *      (auth_jwt_check).
 *
 * Left out (KVD_NO_AUTH): nobody is anybody -- auth_who names no user, no
 * token is read -- and every check passes, as etcd's with auth off;
 * --auth-token other than simple is refused at start.
 */

#ifndef KVD_NO_AUTH
struct auth_token {
	struct auth_token *next;
	int64_t expires;           /* monotonic ms */
	char *user;                /* owned */
	char tok[40];
};

static uint32_t auth_tok_hash(const char *s)
{
	uint32_t h = 2166136261u;

	while (*s)
		h = (h ^ (uint8_t)*s++) * 16777619u;
	return h % AUTH_BUCKETS;
}

static void auth_tok_free(struct kvd *k, struct auth_token *t)
{
	kvd_free(k, t->user);
	kvd_free(k, t);
	k->auth.ntok--;
}

/* Drop the tokens of user (NULL: every token) and the expired ones. */
static void auth_tok_drop(struct kvd *k, const char *user)
{
	struct auth *a = &k->auth;
	struct auth_token **pp, *t;
	size_t i;

	if (!a->tok)
		return;
	for (i = 0; i < AUTH_BUCKETS; i++)
		for (pp = &a->tok[i]; (t = *pp);) {
			if (!user || !strcmp(t->user, user) || t->expires <= k->now) {
				*pp = t->next;
				auth_tok_free(k, t);
			} else {
				pp = &t->next;
			}
		}
}

/* The live token named s, its life extended, or NULL. */
static struct auth_token *auth_tok_find(struct kvd *k, const char *s)
{
	struct auth *a = &k->auth;
	struct auth_token **pp, *t;

	if (!a->tok)
		return NULL;
	for (pp = &a->tok[auth_tok_hash(s)]; (t = *pp); pp = &t->next) {
		if (strcmp(t->tok, s))
			continue;
		if (t->expires <= k->now) {
			*pp = t->next;
			auth_tok_free(k, t);
			return NULL;
		}
		t->expires = k->now + a->ttl_ms;
		return t;
	}
	return NULL;
}

/* n random bytes from the kernel's pool.  0 or KVD_EIO. */
static int auth_random(struct kvd *k, uint8_t *p, size_t n)
{
	ssize_t r;

	if (k->auth.rnd_fd < 0 && (k->auth.rnd_fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC)) < 0)
		return KVD_EIO;
	while (n) {
		r = read(k->auth.rnd_fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return KVD_EIO;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* A new token for user, as etcd's simple tokens look.  0 or KVD_E*. */
static int auth_tok_new(struct kvd *k, const char *user, char *out, size_t cap)
{
	static const char letters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
	struct auth *a = &k->auth;
	struct auth_token *t;
	uint8_t rnd[64];
	size_t i, got = 0;
	uint32_t h;

	if (!a->tok && !(a->tok = kvd_calloc(k, AUTH_BUCKETS * sizeof *a->tok)))
		return KVD_ENOMEM;
	if (a->ntok >= KVD_AUTH_MAX_TOKENS)
		auth_tok_drop(k, ""); /* only the expired ones: no user is named "" */
	if (a->ntok >= KVD_AUTH_MAX_TOKENS)
		return KVD_ELIMIT;
	if (!(t = kvd_calloc(k, sizeof *t)) || !(t->user = kvd_strdup(k, user))) {
		kvd_free(k, t);
		return KVD_ENOMEM;
	}
	do {
		if (auth_random(k, rnd, sizeof rnd)) {
			kvd_free(k, t->user);
			kvd_free(k, t);
			return KVD_EIO;
		}
		for (i = 0; i < sizeof rnd && got < 16; i++)
			if (rnd[i] < 208) /* 4 x 52: no letter more likely than another */
				t->tok[got++] = letters[rnd[i] % 52];
	} while (got < 16);
	snprintf(t->tok + 16, sizeof t->tok - 16, ".%lld", (long long)k->db.rev);
	t->expires = k->now + a->ttl_ms;
	h = auth_tok_hash(t->tok);
	t->next = a->tok[h];
	a->tok[h] = t;
	a->ntok++;
	snprintf(out, cap, "%s", t->tok);
	return 0;
}

/* ---- JSON Web Tokens (--auth-token jwt,...) ----------------------------------
 *
 * etcd's jwt tokens: a header {"alg":A,"typ":"JWT"}, claims
 * {"exp":T,"revision":R,"username":U} (Go's encoding/json: keys sorted), each
 * base64url without padding, then the signature over "header.claims":
 * RS256/384/512 (RSA PKCS#1 v1.5), PS256/384/512 (RSA-PSS, salt as long as
 * the hash), ES256/384/512 (r and s, each the curve's size, as JOSE wants),
 * HS256/384/512 (HMAC, the key file's bytes the secret).  Options as etcd's:
 * sign-method (required), pub-key, priv-key, ttl (5m).  Without priv-key kvd
 * verifies tokens another server issued but cannot issue any (Authenticate
 * fails, as etcd's verify-only mode).  A token carries the auth revision it
 * was issued at; a key operation with one older than the store's is refused
 * ("revision of auth store is old") and clients authenticate again.  A
 * token is not kept anywhere: deleting its user or disabling auth does not
 * revoke it, its expiry does (as etcd).
 */
#ifndef KVD_NO_JWT /* @@ KVD_NO_JWT: no JWT tokens (make JWT=0): --auth-token jwt,... refused at start; simple tokens serve */
struct auth_jwt {
	mbedtls_pk_context key;      /* private (can issue) or public (verify only) */
	uint8_t *secret;             /* HS*: the key file's bytes */
	size_t nsecret;
	unsigned priv : 1;
	char alg[8];
	char family;                 /* 'R' PKCS#1 v1.5, 'P' PSS, 'E' ECDSA, 'H' HMAC */
	mbedtls_md_type_t md;
	size_t half;                 /* ECDSA: bytes of r, and of s */
	uint32_t ttl_ms;
	char name[256];              /* the user the last verified token named */
	size_t nlen;                 /* its length: every byte, a NUL too */
};

static const char auth_b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static void auth_b64url_put(struct kvd *k, struct kvd_buf *b, const uint8_t *p, size_t n)
{
	if (!buf_reserve(k, b, (n + 2) / 3 * 4))
		b->len += util_b64(auth_b64url, 0, p, n, (char *)b->p + b->len);
}

/* base64url without padding (what jwt-go makes and takes) into out (cap
 * bytes).  The length, or -1 if s is not that. */
static long auth_b64url_get(const char *s, size_t n, uint8_t *out, size_t cap)
{
	uint32_t acc = 0;
	size_t i, bits = 0, o = 0;
	const char *c;

	if (n % 4 == 1)
		return -1;
	for (i = 0; i < n; i++) {
		if (!s[i] || !(c = strchr(auth_b64url, s[i])))
			return -1;
		acc = acc << 6 | (uint32_t)(c - auth_b64url);
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			if (o == cap)
				return -1;
			out[o++] = (uint8_t)(acc >> bits);
			acc &= (1u << bits) - 1;
		}
	}
	return acc ? -1 : (long)o; /* leftover bits must be zero */
}

static int auth_jwt_rng(void *k, unsigned char *p, size_t n)
{
	return auth_random(k, p, n) ? -1 : 0;
}

/* mbedtls 3 also wants the room the signature has (always
 * MBEDTLS_PK_SIGNATURE_MAX_SIZE here). */
#if MBEDTLS_VERSION_MAJOR >= 3
#define auth_pk_sign(pk, md, h, hl, sig, n, rng, ctx) \
	mbedtls_pk_sign(pk, md, h, hl, sig, MBEDTLS_PK_SIGNATURE_MAX_SIZE, n, rng, ctx)
#else
#define auth_pk_sign mbedtls_pk_sign
#endif

/* Sign or check (verify) the signature sig of data.  Sign: sig has room for
 * MBEDTLS_PK_SIGNATURE_MAX_SIZE bytes, *n is set.  0 or -1. */
static int auth_jwt_sig(struct kvd *k, struct auth_jwt *j, const uint8_t *data, size_t len, uint8_t *sig,
                        size_t *n, int verify)
{
	const mbedtls_md_info_t *md = mbedtls_md_info_from_type(j->md);
	uint8_t h[MBEDTLS_MD_MAX_SIZE], der[MBEDTLS_PK_SIGNATURE_MAX_SIZE];
	size_t hl = mbedtls_md_get_size(md), dl = 0;
	mbedtls_mpi r, s;
	int e = -1;

	if (j->family == 'H') {
		if (mbedtls_md_hmac(md, j->secret, j->nsecret, data, len, h))
			return -1;
		if (!verify) {
			memcpy(sig, h, hl);
			*n = hl;
			return 0;
		}
		return *n == hl && !auth_ct_diff(h, sig, hl) ? 0 : -1;
	}
	if (mbedtls_md(md, data, len, h))
		return -1;
	if (j->family == 'R' || j->family == 'P') {
		mbedtls_rsa_set_padding(mbedtls_pk_rsa(j->key), j->family == 'P' ? MBEDTLS_RSA_PKCS_V21 : MBEDTLS_RSA_PKCS_V15,
		                        j->family == 'P' ? j->md : MBEDTLS_MD_NONE);
		if (verify) {
			mbedtls_pk_rsassa_pss_options o;
			o.mgf1_hash_id = j->md;
			o.expected_salt_len = MBEDTLS_RSA_SALT_LEN_ANY;
			return mbedtls_pk_verify_ext(j->family == 'P' ? MBEDTLS_PK_RSASSA_PSS : MBEDTLS_PK_RSA,
			                             j->family == 'P' ? &o : NULL, &j->key, j->md, h, hl, sig, *n) ? -1 : 0;
		}
		return auth_pk_sign(&j->key, j->md, h, hl, sig, n, auth_jwt_rng, k) ? -1 : 0;
	}
	/* ECDSA: JOSE's r||s, the pk layer's DER */
	mbedtls_mpi_init(&r);
	mbedtls_mpi_init(&s);
	if (verify) {
		uint8_t *p = der + sizeof der;
		size_t m = 0;
		int w;
		if (*n != 2 * j->half || mbedtls_mpi_read_binary(&r, sig, j->half) ||
		    mbedtls_mpi_read_binary(&s, sig + j->half, j->half))
			goto out;
		if ((w = mbedtls_asn1_write_mpi(&p, der, &s)) < 0)
			goto out;
		m += (size_t)w;
		if ((w = mbedtls_asn1_write_mpi(&p, der, &r)) < 0)
			goto out;
		m += (size_t)w;
		if ((w = mbedtls_asn1_write_len(&p, der, m)) < 0)
			goto out;
		m += (size_t)w;
		if ((w = mbedtls_asn1_write_tag(&p, der, MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE)) < 0)
			goto out;
		m += (size_t)w;
		e = mbedtls_pk_verify(&j->key, j->md, h, hl, p, m) ? -1 : 0;
	} else {
		uint8_t *p = der, *end;
		size_t seq;
		if (auth_pk_sign(&j->key, j->md, h, hl, der, &dl, auth_jwt_rng, k))
			goto out;
		end = der + dl;
		if (mbedtls_asn1_get_tag(&p, end, &seq, MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE) ||
		    mbedtls_asn1_get_mpi(&p, end, &r) || mbedtls_asn1_get_mpi(&p, end, &s) ||
		    mbedtls_mpi_write_binary(&r, sig, j->half) || mbedtls_mpi_write_binary(&s, sig + j->half, j->half))
			goto out;
		*n = 2 * j->half;
		e = 0;
	}
out:
	mbedtls_mpi_free(&r);
	mbedtls_mpi_free(&s);
	return e;
}

/* A token for user at the current auth revision, into out.  0 or KVD_E*. */
static int auth_jwt_issue(struct kvd *k, const char *user, char *out, size_t cap)
{
	struct auth_jwt *j = k->auth.jwt;
	struct kvd_buf b = {0}, c = {0};
	uint8_t sig[MBEDTLS_PK_SIGNATURE_MAX_SIZE];
	size_t n = 0, at;
	struct timespec ts;
	int r = KVD_ENOMEM;

	if (!j->priv)
		return KVD_EINVAL;
	clock_gettime(CLOCK_REALTIME, &ts);
	json_put_raw(k, &c, "{\"alg\":\"");
	json_put_raw(k, &c, j->alg);
	json_put_raw(k, &c, "\",\"typ\":\"JWT\"}");
	if (c.err)
		goto out;
	auth_b64url_put(k, &b, c.p, c.len);
	buf_append(k, &b, ".", 1);
	c.len = 0;
	json_put_raw(k, &c, "{\"exp\":");
	json_put_int(k, &c, (int64_t)ts.tv_sec + j->ttl_ms / 1000);
	json_put_raw(k, &c, ",\"revision\":");
	json_put_int(k, &c, (int64_t)k->auth.rev);
	json_put_raw(k, &c, ",\"username\":");
	json_put_str(k, &c, user, strlen(user));
	json_put_raw(k, &c, "}");
	if (c.err)
		goto out;
	auth_b64url_put(k, &b, c.p, c.len);
	at = b.len;
	if (b.err || auth_jwt_sig(k, j, b.p, at, sig, &n, 0)) {
		r = b.err ? KVD_ENOMEM : KVD_EIO;
		goto out;
	}
	buf_append(k, &b, ".", 1);
	auth_b64url_put(k, &b, sig, n);
	if (b.err || b.len >= cap)
		goto out;
	memcpy(out, b.p, b.len);
	out[b.len] = 0;
	r = 0;
out:
	buf_free(k, &b);
	buf_free(k, &c);
	return r;
}

/*
 * exp (is_exp) or nbf, as jwt/v5 checks them for etcd: absent or 0 means
 * none; anything but a number is refused; seconds are whole (the fraction
 * dropped); exp must be later than now, nbf not after it.  A number past
 * what Go's time.Unix can hold (|t| >= 2^63 - 62135596800 s) wraps, in
 * etcd, to a date in the far past: an exp of 1e300 is expired, an nbf of
 * 1e300 long reached.
 */
static int auth_jwt_time(const struct json *t, int64_t now, int is_exp)
{
	const double lim = 9223372036854775807.0 - 62135596800.0;
	int64_t sec;

	if (!t)
		return 1;
	if (t->type != JSON_NUM)
		return 0;
	if (t->d == 0)
		return 1;
	if (!(t->d > -lim && t->d < lim)) /* wraps into the far past (NaN cannot come from JSON) */
		return !is_exp;
	sec = (int64_t)t->d; /* toward zero, as math.Modf: |d| < 2^63 here */
	return is_exp ? sec > now : sec <= now;
}

/* A token another call sent: its user (into j->name) and revision, or -1
 * when it is not a token this key signed, or has expired. */
static int auth_jwt_check(struct kvd *k, const char *tok, uint64_t *rev)
{
	struct auth_jwt *j = k->auth.jwt;
	const char *d1 = strchr(tok, '.'), *d2 = d1 ? strchr(d1 + 1, '.') : NULL;
	uint8_t buf[1024], sig[MBEDTLS_PK_SIGNATURE_MAX_SIZE];
	const struct json *alg, *u, *rv;
	struct json_doc doc;
	struct timespec ts;
	const char *why;
	size_t sn;
	long l;
	int r = -1;

	if (!d2 || strchr(d2 + 1, '.') || strlen(tok) > 4096)
		return -1;
	l = auth_b64url_get(d2 + 1, strlen(d2 + 1), sig, sizeof sig);
	if (l < 0)
		return -1;
	sn = (size_t)l;
	if (auth_jwt_sig(k, j, (const uint8_t *)tok, (size_t)(d2 - tok), sig, &sn, 1))
		return -1;
	/* signed by this key: now the header says the same algorithm, and the claims */
	if ((l = auth_b64url_get(tok, (size_t)(d1 - tok), buf, sizeof buf)) < 0 ||
	    json_parse(k, &doc, buf, (size_t)l, &why))
		return -1;
	alg = json_get_last(doc.root, "alg");
	r = json_is_str(alg) && !strcmp(alg->s, j->alg) ? 0 : -1;
	json_free(&doc);
	if (r || (l = auth_b64url_get(d1 + 1, (size_t)(d2 - d1 - 1), buf, sizeof buf)) < 0 ||
	    json_parse(k, &doc, buf, (size_t)l, &why))
		return -1;
	u = json_get_last(doc.root, "username");
	rv = json_get_last(doc.root, "revision");
	clock_gettime(CLOCK_REALTIME, &ts);
	r = -1;
	if (json_is_str(u) && u->n < sizeof j->name && rv && rv->type == JSON_NUM && rv->d >= 0 &&
	    auth_jwt_time(json_get_last(doc.root, "exp"), (int64_t)ts.tv_sec, 1) &&
	    auth_jwt_time(json_get_last(doc.root, "nbf"), (int64_t)ts.tv_sec, 0)) {
		memcpy(j->name, u->s, u->n + 1); /* a name holding a NUL is nobody's, as etcd finds */
		j->nlen = u->n;
		*rev = rv->d > 0 ? (uint64_t)rv->d : 1;
		r = 0;
	}
	json_free(&doc);
	return r;
}

/* --auth-token: "simple", or "jwt,sign-method=...,pub-key=...,priv-key=...,ttl=...".
 * Keys are read here, before the data dir is touched.  0 or KVD_EINVAL. */
#endif /* KVD_NO_JWT */

/* --auth-token: simple, or jwt,... whose keys are read here. */
KVD_RESIDENT static int auth_open(struct kvd *k, char *err, size_t errlen)
{
#ifndef KVD_NO_JWT
	static const struct { const char *alg; char family; mbedtls_md_type_t md; size_t half; } algs[] = {
		{"RS256", 'R', MBEDTLS_MD_SHA256, 0}, {"RS384", 'R', MBEDTLS_MD_SHA384, 0}, {"RS512", 'R', MBEDTLS_MD_SHA512, 0},
		{"PS256", 'P', MBEDTLS_MD_SHA256, 0}, {"PS384", 'P', MBEDTLS_MD_SHA384, 0}, {"PS512", 'P', MBEDTLS_MD_SHA512, 0},
		{"ES256", 'E', MBEDTLS_MD_SHA256, 32}, {"ES384", 'E', MBEDTLS_MD_SHA384, 48}, {"ES512", 'E', MBEDTLS_MD_SHA512, 66},
		{"HS256", 'H', MBEDTLS_MD_SHA256, 0}, {"HS384", 'H', MBEDTLS_MD_SHA384, 0}, {"HS512", 'H', MBEDTLS_MD_SHA512, 0},
	};
	char *o, *save, *method = NULL, *pub = NULL, *priv = NULL, *ttl = NULL;
	struct auth_jwt *j;
	size_t i;
	int r;
#endif
	const char *spec = k->cfg.auth_token ? k->cfg.auth_token : "simple";
	char opts[1024];

	if (!strcmp(spec, "simple"))
		return 0;
	if (strncmp(spec, "jwt,", 4) || strlen(spec) >= sizeof opts) {
		snprintf(err, errlen, "--auth-token %s: unknown token type (want simple or jwt,...)", spec);
		return KVD_EINVAL;
	}
#ifdef KVD_NO_JWT
	snprintf(err, errlen, "--auth-token %s: this kvd is built without JWT tokens (KVD_NO_JWT); use simple", spec);
	return KVD_EINVAL;
#else
	snprintf(opts, sizeof opts, "%s", spec + 4);
	for (o = strtok_r(opts, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
		char *v = strchr(o, '=');
		if (!v) {
			snprintf(err, errlen, "--auth-token: option %s has no value", o);
			return KVD_EINVAL;
		}
		*v++ = 0;
		if (!strcmp(o, "sign-method"))
			method = v;
		else if (!strcmp(o, "pub-key"))
			pub = v;
		else if (!strcmp(o, "priv-key"))
			priv = v;
		else if (!strcmp(o, "ttl"))
			ttl = v;
		else {
			snprintf(err, errlen, "--auth-token: unknown option %s", o);
			return KVD_EINVAL;
		}
	}
	for (i = 0; method && i < KVD_COUNT(algs) && strcmp(algs[i].alg, method); i++)
		;
	if (!method || i == KVD_COUNT(algs)) {
		snprintf(err, errlen, "--auth-token: sign-method %s: want RS256..512, PS256..512, ES256..512 or HS256..512",
		         method ? method : "(missing)");
		return KVD_EINVAL;
	}
	if (!(j = kvd_calloc(k, sizeof *j)))
		return KVD_ENOMEM;
	mbedtls_pk_init(&j->key);
	k->auth.jwt = j;
	snprintf(j->alg, sizeof j->alg, "%s", method);
	j->family = algs[i].family;
	j->md = algs[i].md;
	j->half = algs[i].half;
	j->ttl_ms = 5 * 60 * 1000;
	if (ttl && (cfg_duration(ttl, &j->ttl_ms) || j->ttl_ms < 1000)) {
		snprintf(err, errlen, "--auth-token: ttl %s: want a duration of at least 1s", ttl);
		return KVD_EINVAL;
	}
	if (!pub && !priv) {
		snprintf(err, errlen, "--auth-token: jwt needs priv-key (to issue tokens) or pub-key (to verify them)");
		return KVD_EINVAL;
	}
	if (util_check_regular(priv ? priv : pub, priv ? "--auth-token: priv-key" : "--auth-token: pub-key", err, errlen))
		return KVD_EINVAL;
	if (j->family == 'H') { /* the secret: the file's bytes */
		FILE *f = fopen(priv ? priv : pub, "rb");
		long n = -1;
		if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) > 0 && n < 65536 && !fseek(f, 0, SEEK_SET) &&
		    (j->secret = kvd_malloc(k, (size_t)n)) && fread(j->secret, 1, (size_t)n, f) == (size_t)n) {
			j->nsecret = (size_t)n;
			j->priv = 1;
		}
		if (f)
			fclose(f);
		if (!j->nsecret) {
			snprintf(err, errlen, "--auth-token: cannot read the HMAC key %s", priv ? priv : pub);
			return KVD_EINVAL;
		}
		return 0;
	}
	r = priv ? mbedtls_pk_parse_keyfile(&j->key, priv, NULL
#if MBEDTLS_VERSION_MAJOR >= 3
	                                    , auth_jwt_rng, k
#endif
	                                    ) : mbedtls_pk_parse_public_keyfile(&j->key, pub);
	if (r) {
		snprintf(err, errlen, "--auth-token: cannot read the %s key %s (mbedtls -0x%04x)", priv ? "private" : "public",
		         priv ? priv : pub, (unsigned)-r);
		return KVD_EINVAL;
	}
	j->priv = !!priv;
	if (j->family == 'E' ? !mbedtls_pk_can_do(&j->key, MBEDTLS_PK_ECDSA) ||
	                           (mbedtls_pk_get_bitlen(&j->key) + 7) / 8 != j->half
	                     : !mbedtls_pk_can_do(&j->key, MBEDTLS_PK_RSA)) {
		snprintf(err, errlen, "--auth-token: the key in %s does not fit sign-method %s", priv ? priv : pub, method);
		return KVD_EINVAL;
	}
	return 0;
#endif
}

#ifndef KVD_NO_JWT
static void auth_jwt_free(struct kvd *k)
{
	struct auth_jwt *j = k->auth.jwt;

	if (!j)
		return;
	mbedtls_pk_free(&j->key);
	if (j->secret)
		util_wipe(j->secret, j->nsecret);
	kvd_free(k, j->secret);
	kvd_free(k, j);
	k->auth.jwt = NULL;
}
#endif

/* ---- who is calling, and may they ------------------------------------------- */

/* What etcd's AuthInfoFromCtx finds: with auth on, the user a token names
 * (a token that is not live is an error); else (with --client-cert-auth)
 * the client certificate's CN; else nobody (*who NULL).  Auth off, etcd 3.7
 * looks at no token at all (3.4 refused a dead one either way). */
static int auth_who(struct kvd *k, struct call *c, struct auth_who *w, struct svc_err *e)
{
	const char *t = call_meta(c, "token"), *cn;
	struct auth_token *tk;
	size_t cnlen;

	w->name = NULL;
	w->nlen = 0;
	w->rev = 0;
	w->named = 0;
	if (!t)
		t = call_meta(c, "authorization");
	if (!k->auth.enabled)
		t = NULL;
	if (t && !strncmp(t, "Bearer ", 7)) /* etcd 3.7 strips it */
		t += 7;
#ifndef KVD_NO_JWT
	if (t && k->auth.jwt) {
		if (auth_jwt_check(k, t, &w->rev))
			return svc_fail(e, GRPC_UNAUTHENTICATED, E_INVALID_TOKEN);
		w->name = k->auth.jwt->name; /* valid until the next call's check */
		w->nlen = k->auth.jwt->nlen;
		w->named = 1;
		return 0;
	}
#endif
	if (t) {
		if (!(tk = auth_tok_find(k, t)))
			return svc_fail(e, GRPC_UNAUTHENTICATED, E_INVALID_TOKEN);
		w->name = tk->user;
		w->nlen = strlen(w->name);
		w->named = 1;
		return 0;
	}
	if (k->cfg.client_cert_auth && c->conn && (cn = tls_peer_cn(c->conn, &cnlen))) {
		w->name = cn; /* its exact bytes: "root\0.x" is not root; "" is nobody (permission denied) */
		w->nlen = cnlen;
		w->named = 1;
	}
	return 0;
}

/* etcd's IsAdminPermitted. */
static int auth_admin(struct kvd *k, const struct auth_who *w, struct svc_err *e)
{
	const Authpb__User *u;

	if (!k->auth.enabled)
		return 0;
	if (!w->nlen)
		return svc_fail(e, GRPC_INVALID_ARGUMENT, E_USER_EMPTY);
	if (!(u = auth_user_n(k, w->name, w->nlen)))
		return svc_fail(e, GRPC_FAILED_PRECONDITION, E_USER_NOT_FOUND);
	return auth_has_role(u, AUTH_ROOT) ? 0 : svc_fail(e, GRPC_PERMISSION_DENIED, E_PERM_DENIED);
}

/* etcd's AuthAdmin.isPermitted: the caller is root (etcd 3.7 maps the
 * errors; 3.4's Maintenance sent them raw, code Unknown). */
static int auth_root(struct kvd *k, struct call *c, struct svc_err *e)
{
	struct auth_who who;

	return auth_who(k, c, &who, e) || auth_admin(k, &who, e) ? KVD_EINVAL : 0;
}

/* etcd 3.7's requireAuthInfo (Status, MemberList, Alarm GET, leases): with
 * auth on, any caller with a name -- a live token, or a certificate's CN. */
static int auth_need_user(struct kvd *k, struct call *c, struct auth_who *who, struct svc_err *e)
{
	if (auth_who(k, c, who, e))
		return KVD_EINVAL;
	return k->auth.enabled && !who->nlen ? svc_fail(e, GRPC_INVALID_ARGUMENT, E_USER_EMPTY) : 0;
}

/* A watch's cancel_reason for a refused create: the gRPC error as Go
 * prints it (etcd's isWatchPermitted). */
static const char *auth_watch_reason(const struct svc_err *e)
{
	if (!strcmp(e->msg, E_INVALID_TOKEN))
		return "rpc error: code = Unauthenticated desc = " E_INVALID_TOKEN;
	if (!strcmp(e->msg, E_USER_EMPTY))
		return "rpc error: code = InvalidArgument desc = " E_USER_EMPTY;
	if (!strcmp(e->msg, E_AUTH_OLD_REV))
		return "rpc error: code = InvalidArgument desc = " E_AUTH_OLD_REV;
	return "rpc error: code = PermissionDenied desc = " E_PERM_DENIED;
}

/*
 * An interval of keys, as etcd's adt package compares them: an empty
 * bound is +infinity, and z appends a 0 byte (a point [k, k\0)).
 */
struct auth_iv {
	const uint8_t *b, *e;
	size_t bn, en;
	unsigned ez : 1;
};

static int auth_bound_cmp(const uint8_t *a, size_t an, int az, const uint8_t *b, size_t bn, int bz)
{
	size_t la = an + (size_t)az, lb = bn + (size_t)bz, i;

	if (!la || !lb)
		return !la && !lb ? 0 : !la ? 1 : -1;
	for (i = 0; i < la && i < lb; i++) {
		uint8_t x = i < an ? a[i] : 0, y = i < bn ? b[i] : 0;
		if (x != y)
			return x < y ? -1 : 1;
	}
	return (la > lb) - (la < lb);
}

static int auth_iv_order(const void *x, const void *y)
{
	const struct auth_iv *a = x, *b = y;

	return auth_bound_cmp(a->b, a->bn, 0, b->b, b->bn, 0);
}

/* The permission's interval, as etcd's getMergedPerms builds it. */
static void auth_perm_iv(const Authpb__Permission *p, struct auth_iv *v)
{
	v->b = p->key.data;
	v->bn = p->key.len;
	v->ez = 0;
	if (!p->range_end.len) { /* a point */
		v->e = p->key.data;
		v->en = p->key.len;
		v->ez = 1;
	} else if (p->range_end.len == 1 && !p->range_end.data[0]) { /* from key on */
		v->e = NULL;
		v->en = 0;
	} else {
		v->e = p->range_end.data;
		v->en = p->range_end.len;
	}
}

/*
 * etcd's interval tree itself (its adt package), for the one query whose
 * answer depends on the tree's shape: an inverted range, key >= end.  etcd
 * lets it into Contains like any other; the overlap test then calls it
 * "overlapping" some nodes and "right of" others, and the maximum-end pruning
 * skips whole subtrees, so which permissions are seen -- and whether the
 * empty range is permitted -- depends on where the red-black insertion put
 * each one.  The tree is built here the way etcd builds a user's cache: the
 * user's roles in order, each role's permissions in order, the same
 * insertion (ties on begin ordered by end, as etcd 3.7's), fix-up and rotations, with the
 * subtree maxima updated at exactly the points etcd updates them (its
 * update stops early, so a different order gives different maxima).
 * Nodes are indices; 0 is the black sentinel.  Only built for such queries
 * (nothing else depends on the shape), and freed at once.
 */
struct auth_rbn {
	struct auth_iv iv;
	const uint8_t *m;            /* the subtree's largest end */
	size_t mn;
	unsigned mz : 1, red : 1;
	uint32_t l, r, p;
};
struct auth_rbt {
	struct auth_rbn *t;
	uint32_t root;
	/* Contains' walk */
	const uint8_t *minb, *maxe;
	size_t minbn, maxen;
	unsigned maxz : 1, seen : 1, gap : 1;
};

/* adt's Interval.Compare: -1 a left of b, 1 a right of b, 0 they overlap. */
static int auth_iv_compare(const struct auth_iv *a, const struct auth_iv *b)
{
	if (auth_bound_cmp(a->b, a->bn, 0, b->b, b->bn, 0) < 0 && auth_bound_cmp(a->e, a->en, a->ez, b->b, b->bn, 0) <= 0)
		return -1;
	return auth_bound_cmp(a->b, a->bn, 0, b->e, b->en, b->ez) >= 0 ? 1 : 0;
}

static void auth_rb_max(struct auth_rbt *T, uint32_t x)
{
	struct auth_rbn *t = T->t;

	for (; x; x = t[x].p) {
		const uint8_t *m = t[x].iv.e;
		size_t mn = t[x].iv.en;
		int mz = t[x].iv.ez, i;
		for (i = 0; i < 2; i++) {
			uint32_t c = i ? t[x].r : t[x].l;
			if (c && auth_bound_cmp(t[c].m, t[c].mn, t[c].mz, m, mn, mz) > 0) {
				m = t[c].m;
				mn = t[c].mn;
				mz = t[c].mz;
			}
		}
		if (!auth_bound_cmp(t[x].m, t[x].mn, t[x].mz, m, mn, mz))
			return; /* as etcd: an unchanged maximum ends the walk up */
		t[x].m = m;
		t[x].mn = mn;
		t[x].mz = (unsigned)mz;
	}
}

/* Rotate x down to the left (dir 0) or right (dir 1). */
static void auth_rb_rotate(struct auth_rbt *T, uint32_t x, int dir)
{
	struct auth_rbn *t = T->t;
	uint32_t y = dir ? t[x].l : t[x].r, in = dir ? t[y].r : t[y].l, p = t[x].p;

	if (!y)
		return;
	if (dir)
		t[x].l = in;
	else
		t[x].r = in;
	if (in)
		t[in].p = x;
	auth_rb_max(T, x);
	t[y].p = p;
	if (!p) {
		T->root = y;
	} else {
		if (t[p].l == x)
			t[p].l = y;
		else
			t[p].r = y;
		auth_rb_max(T, p);
	}
	t[x].p = y;
	if (dir)
		t[y].r = x;
	else
		t[y].l = x;
	auth_rb_max(T, y);
}

/* Where z goes below x: left (1) when its begin is lower, or (etcd 3.7's
 * adt; 3.4 sent every tie right) the same begin and a lower end. */
static int auth_rb_left(const struct auth_rbn *t, uint32_t z, uint32_t x)
{
	int c = auth_bound_cmp(t[z].iv.b, t[z].iv.bn, 0, t[x].iv.b, t[x].iv.bn, 0);

	return c < 0 || (!c && auth_bound_cmp(t[z].iv.e, t[z].iv.en, t[z].iv.ez, t[x].iv.e, t[x].iv.en, t[x].iv.ez) < 0);
}

/* Insert node z (its interval set), ordered as auth_rb_left says. */
static void auth_rb_insert(struct auth_rbt *T, uint32_t z)
{
	struct auth_rbn *t = T->t;
	uint32_t x = T->root, y = 0, g, u;
	int side;

	t[z].m = t[z].iv.e;
	t[z].mn = t[z].iv.en;
	t[z].mz = t[z].iv.ez;
	t[z].red = 1;
	t[z].l = t[z].r = 0;
	while (x) {
		y = x;
		x = auth_rb_left(t, z, x) ? t[x].l : t[x].r;
	}
	t[z].p = y;
	if (!y) {
		T->root = z;
	} else {
		if (auth_rb_left(t, z, y))
			t[y].l = z;
		else
			t[y].r = z;
		auth_rb_max(T, y);
	}
	while (t[t[z].p].red) { /* CLRS' fix-up; the sentinel is black */
		g = t[t[z].p].p;
		side = t[z].p == t[g].l; /* the parent is a left child: the uncle is on the right */
		u = side ? t[g].r : t[g].l;
		if (t[u].red) {
			t[t[z].p].red = 0;
			t[u].red = 0;
			t[g].red = 1;
			z = g;
			continue;
		}
		if (z == (side ? t[t[z].p].r : t[t[z].p].l)) {
			z = t[z].p;
			auth_rb_rotate(T, z, side ? 0 : 1);
		}
		t[t[z].p].red = 0;
		t[t[t[z].p].p].red = 1;
		auth_rb_rotate(T, t[t[z].p].p, side ? 1 : 0);
	}
	t[T->root].red = 0;
}

/* adt's visit with Contains' callback: nodes q overlaps, in order; the
 * walk stops at the first gap.  0 once it stopped. */
static int auth_rb_visit(struct auth_rbt *T, uint32_t x, const struct auth_iv *q)
{
	struct auth_rbn *n = &T->t[x];
	struct auth_iv m;
	int v;

	if (!x)
		return 1;
	v = auth_iv_compare(q, &n->iv);
	if (v < 0)
		return auth_rb_visit(T, n->l, q);
	if (v > 0) {
		m.b = n->iv.b;
		m.bn = n->iv.bn;
		m.e = n->m;
		m.en = n->mn;
		m.ez = n->mz;
		return auth_iv_compare(&m, q) ? 1 : auth_rb_visit(T, n->l, q) && auth_rb_visit(T, n->r, q);
	}
	if (!auth_rb_visit(T, n->l, q))
		return 0;
	if (!T->seen) {
		T->seen = 1;
		T->minb = n->iv.b;
		T->minbn = n->iv.bn;
	} else if (auth_bound_cmp(T->maxe, T->maxen, T->maxz, n->iv.b, n->iv.bn, 0) < 0) {
		T->gap = 1;
		return 0;
	} else if (auth_bound_cmp(n->iv.e, n->iv.en, n->iv.ez, T->maxe, T->maxen, T->maxz) <= 0) {
		return auth_rb_visit(T, n->r, q);
	}
	T->maxe = n->iv.e;
	T->maxen = n->iv.en;
	T->maxz = n->iv.ez;
	return auth_rb_visit(T, n->r, q);
}

/* u's permissions of type (READWRITE ones too) in etcd's order: the roles
 * as the user lists them, each role's permissions in order.  *i and *j
 * start at 0; NULL after the last. */
static const Authpb__Permission *auth_perm_next(struct kvd *k, const Authpb__User *u, int type, size_t *i, size_t *j)
{
	for (; *i < u->n_roles; (*i)++, *j = 0) {
		const Authpb__Role *r = auth_role(k, u->roles[*i]);
		while (r && *j < r->n_keypermission) {
			const Authpb__Permission *p = r->keypermission[(*j)++];
			if (p->permtype == (Authpb__Permission__Type)type || p->permtype == AUTHPB__PERMISSION__TYPE__READWRITE)
				return p;
		}
	}
	return NULL;
}

/* adt's Intersects(q) for a point q: its search from the root, which
 * follows the left subtree only when that subtree's maximum passes q. */
static int auth_rb_intersects(const struct auth_rbt *T, const struct auth_iv *q)
{
	const struct auth_rbn *t = T->t;
	uint32_t x = T->root, l;

	while (x && auth_iv_compare(q, &t[x].iv)) {
		l = t[x].l;
		x = l && auth_bound_cmp(t[l].m, t[l].mn, t[l].mz, q->b, q->bn, 0) > 0 ? l : t[x].r;
	}
	return x != 0;
}

/* Contains(q) (or, q a point, Intersects) on the tree of u's permissions of
 * type, built as etcd builds it. */
static int auth_covers_tree(struct kvd *k, const Authpb__User *u, const struct auth_iv *q, int point, int type)
{
	const Authpb__Permission *p;
	struct auth_rbt T;
	size_t i, j, n;
	int ok;

	memset(&T, 0, sizeof T);
	for (i = j = 0, n = 1; auth_perm_next(k, u, type, &i, &j); n++)
		;
	if (n > UINT32_MAX || !(T.t = kvd_calloc(k, n * sizeof *T.t)))
		return 0; /* no memory: refused, the safe answer */
	for (i = j = 0, n = 1; (p = auth_perm_next(k, u, type, &i, &j)); n++) {
		auth_perm_iv(p, &T.t[n].iv);
		auth_rb_insert(&T, (uint32_t)n);
	}
	if (point) {
		ok = auth_rb_intersects(&T, q);
	} else {
		auth_rb_visit(&T, T.root, q);
		ok = T.seen && !T.gap && auth_bound_cmp(T.maxe, T.maxen, T.maxz, q->e, q->en, 0) >= 0 &&
		     auth_bound_cmp(T.minb, T.minbn, 0, q->b, q->bn, 0) <= 0;
	}
	kvd_free(k, T.t);
	return ok;
}

/* Does u's merged permission of type (AUTHPB__PERMISSION__TYPE__READ or
 * WRITE) cover [key, end) -- or hold key, end empty?  etcd's checkKeyPoint
 * and checkKeyInterval over its interval tree: without the tree where its
 * shape cannot matter, with it where it can -- an inverted range asked
 * about, or an inverted permission among the user's (etcd 3.4 stored them;
 * a store from then may still hold some). */
static int auth_covers(struct kvd *k, const Authpb__User *u, const ProtobufCBinaryData *key,
                       const ProtobufCBinaryData *end, int type)
{
	struct auth_iv stack[32], *v = stack, q, x;
	const Authpb__Permission *p;
	size_t n = 0, cap = KVD_COUNT(stack), i, j;
	const uint8_t *maxe = NULL;
	size_t maxen = 0;
	int maxz = 0, ok = 0, point = !end->len;

	q.b = key->data;
	q.bn = key->len;
	q.ez = 0;
	q.e = end->len == 1 && !end->data[0] ? NULL : end->data;
	q.en = q.e ? end->len : 0;
	if (point) { /* the point [key, key\0) */
		q.e = key->data;
		q.en = key->len;
		q.ez = 1;
	}
	if (!point && auth_bound_cmp(q.b, q.bn, 0, q.e, q.en, 0) >= 0)
		return auth_covers_tree(k, u, &q, point, type); /* key >= end: the tree's shape decides */
	for (i = j = 0; (p = auth_perm_next(k, u, type, &i, &j));) {
		auth_perm_iv(p, &x);
		if (auth_bound_cmp(x.b, x.bn, 0, x.e, x.en, x.ez) >= 0)
			return auth_covers_tree(k, u, &q, point, type); /* so does an inverted permission's */
	}
	for (i = j = 0; (p = auth_perm_next(k, u, type, &i, &j));) {
		auth_perm_iv(p, &x);
		if (point) { /* Intersects: begin <= key < end */
			if (auth_bound_cmp(x.b, x.bn, 0, q.b, q.bn, 0) <= 0 && auth_bound_cmp(q.b, q.bn, 0, x.e, x.en, x.ez) < 0)
				goto yes;
			continue;
		}
		/* the intervals its Compare calls overlapping the query: with key <
		 * end, exactly what the tree visits, whatever its shape */
		if ((auth_bound_cmp(q.b, q.bn, 0, x.b, x.bn, 0) < 0 && auth_bound_cmp(q.e, q.en, 0, x.b, x.bn, 0) <= 0) ||
		    auth_bound_cmp(q.b, q.bn, 0, x.e, x.en, x.ez) >= 0)
			continue;
		if (n == cap) {
			struct auth_iv *nv = kvd_malloc(k, 2 * cap * sizeof *nv);
			if (!nv)
				goto out; /* no memory: refused, the safe answer */
			memcpy(nv, v, n * sizeof *nv);
			if (v != stack)
				kvd_free(k, v);
			v = nv;
			cap *= 2;
		}
		v[n++] = x;
	}
	if (point || !n)
		goto out;
	qsort(v, n, sizeof *v, auth_iv_order); /* in order of their begins, as the tree visits */
	maxe = v[0].e;
	maxen = v[0].en;
	maxz = v[0].ez;
	for (i = 1; i < n; i++) {
		if (auth_bound_cmp(maxe, maxen, maxz, v[i].b, v[i].bn, 0) < 0)
			goto out; /* a gap */
		if (auth_bound_cmp(v[i].e, v[i].en, v[i].ez, maxe, maxen, maxz) > 0) {
			maxe = v[i].e;
			maxen = v[i].en;
			maxz = v[i].ez;
		}
	}
	ok = auth_bound_cmp(maxe, maxen, maxz, q.e, q.en, 0) >= 0 && auth_bound_cmp(v[0].b, v[0].bn, 0, q.b, q.bn, 0) <= 0;
out:
	if (v != stack)
		kvd_free(k, v);
	return ok;
yes:
	return 1;
}

/* etcd's isOpPermitted: may who do a type op on [key, end)? */
static int auth_may(struct kvd *k, const struct auth_who *w, const ProtobufCBinaryData *key,
                    const ProtobufCBinaryData *end, int type, struct svc_err *e)
{
	static const ProtobufCBinaryData none = {0, NULL};
	const Authpb__User *u;

	if (!k->auth.enabled)
		return 0;
	if (!w->named) /* nobody at all; a certificate naming "" is a user nobody is (below) */
		return svc_fail(e, GRPC_INVALID_ARGUMENT, E_USER_EMPTY);
	if (w->rev && w->rev < k->auth.rev) /* a JWT from before an auth change */
		return svc_fail(e, GRPC_INVALID_ARGUMENT, E_AUTH_OLD_REV);
	if (!(u = auth_user_n(k, w->name, w->nlen)))
		return svc_fail(e, GRPC_PERMISSION_DENIED, E_PERM_DENIED);
	if (auth_has_role(u, AUTH_ROOT) || auth_covers(k, u, key, end ? end : &none, type))
		return 0;
	return svc_fail(e, GRPC_PERMISSION_DENIED, E_PERM_DENIED);
}

/* etcd 3.7's checkTxnPermission: every compare, then each branch's ops in
 * order, nested txns' too (3.4 stopped at the top level). */
static int auth_txn(struct kvd *k, const struct auth_who *who, const Etcdserverpb__TxnRequest *rq, struct svc_err *e)
{
	size_t i, b;

	if (!k->auth.enabled)
		return 0;
	for (i = 0; i < rq->n_compare; i++)
		if (auth_may(k, who, &rq->compare[i]->key, &rq->compare[i]->range_end, AUTH_R, e))
			return KVD_EINVAL;
	for (b = 0; b < 2; b++) {
		Etcdserverpb__RequestOp **ops = b ? rq->failure : rq->success;
		size_t n = b ? rq->n_failure : rq->n_success;
		for (i = 0; i < n; i++) {
			const Etcdserverpb__RequestOp *op = ops[i];
			int r = 0;
			switch (op->request_case) {
			case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE:
				r = auth_may(k, who, &op->request_range->key, &op->request_range->range_end, AUTH_R, e);
				break;
			case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT: /* etcd 3.7's checkPutAuth, at every depth */
				r = auth_may(k, who, &op->request_put->key, NULL, AUTH_W, e) ||
				    auth_lease_keys(k, who, op->request_put->lease, AUTH_W, e) ||
				    (op->request_put->prev_kv && auth_may(k, who, &op->request_put->key, NULL, AUTH_R, e));
				break;
			case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE:
				if (op->request_delete_range->prev_kv)
					r = auth_may(k, who, &op->request_delete_range->key, &op->request_delete_range->range_end,
					             AUTH_R, e);
				if (!r)
					r = auth_may(k, who, &op->request_delete_range->key,
					             &op->request_delete_range->range_end, AUTH_W, e);
				break;
			case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN:
				r = auth_txn(k, who, op->request_txn, e);
				break;
			default:
				break;
			}
			if (r)
				return r;
		}
	}
	return 0;
}

/* etcd's checkLeasePuts: write on every key the lease holds. */
static int auth_lease_keys(struct kvd *k, const struct auth_who *who, int64_t id, int type, struct svc_err *e)
{
	struct lease *l;
	ProtobufCBinaryData key;
	uint32_t i;

	if (!k->auth.enabled || !(l = lease_find(k, id)))
		return 0;
	for (i = 0; l->nkeys && i <= l->kmask; i++)
		if (l->keys[i]) {
			key.data = l->keys[i]->key;
			key.len = l->keys[i]->klen;
			if (auth_may(k, who, &key, NULL, type, e))
				return KVD_EINVAL;
		}
	return 0;
}

/* ---- password hashes, off the handlers' path ----------------------------------- */

/* A call waiting for a hash (its c->svc): the request stays here meanwhile. */
struct auth_job {
	struct auth_job *next;
	struct call *c;
	ProtobufCMessage *rq;       /* the request, taken from the call */
	struct auth_bcrypt h;
	uint64_t rev;               /* the auth revision when the check began */
	char out[61];               /* the hash, when done */
	unsigned queued : 1, done : 1;
};

static int64_t auth_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}



/* The request of c, whether it waited for a hash or not. */
static const void *auth_rq(const struct call *c)
{
	const struct auth_job *j = c->svc;

	return c->rq ? (const void *)c->rq : (const void *)j->rq;
}

/* The hash c's handler asked for, once the loop made it; NULL before. */
static const char *auth_hashed(const struct call *c)
{
	const struct auth_job *j = c->svc;

	return j && j->done ? j->out : NULL;
}

static void auth_job_unqueue(struct kvd *k, struct auth_job *j)
{
	struct auth *a = &k->auth;
	struct auth_job **pp, *prev = NULL;

	for (pp = &a->jobs; *pp; prev = *pp, pp = &(*pp)->next)
		if (*pp == j) {
			*pp = j->next;
			if (a->jobs_tail == j)
				a->jobs_tail = prev;
			a->njobs--;
			break;
		}
	if (a->cur == j)
		a->cur = NULL;
	j->queued = 0;
}

/* Who a job is, for the queue's fair shares: its address, its connection
 * (NULL for in-process calls, which share one turn). */
static struct share *auth_job_share(const struct auth_job *j)
{
	return j->c->conn ? j->c->conn->share : NULL;
}

static int auth_job_count(const struct auth *a, const struct share *sh, const struct conn *c)
{
	const struct auth_job *j;
	int n = 0;

	for (j = a->jobs; j; j = j->next)
		n += auth_job_share(j) == sh && (!c || j->c->conn == c);
	return n;
}

/*
 * The queue is full and call c wants a hash: the address holding the most
 * queued jobs gives up its newest when it holds at least two more than c's;
 * within c's own address, the connection holding the most does.  The job
 * given up ends "too many requests", as a refusal would have.  0 when there
 * is room now.
 */
static int auth_job_make_room(struct kvd *k, struct call *c)
{
	struct auth *a = &k->auth;
	struct share *mine = c->conn ? c->conn->share : NULL, *top = NULL;
	struct auth_job *j, *v = NULL;
	const struct conn *ctop = NULL;
	int n, best = -1, have = auth_job_count(a, mine, NULL);

	for (j = a->jobs; j; j = j->next) /* the address holding the most */
		if ((n = auth_job_count(a, auth_job_share(j), NULL)) > best) {
			best = n;
			top = auth_job_share(j);
		}
	if (top == mine || best < have + 2) { /* c's own address is the largest: by connection within it */
		top = mine;
		have = c->conn ? auth_job_count(a, mine, c->conn) : 0;
		for (best = -1, j = a->jobs; j; j = j->next)
			if (auth_job_share(j) == mine && j->c->conn != c->conn &&
			    (n = auth_job_count(a, mine, j->c->conn)) > best) {
				best = n;
				ctop = j->c->conn;
			}
		if (!ctop || best < have + 2)
			return KVD_ELIMIT;
	}
	for (j = a->jobs; j; j = j->next) /* its newest, never the one being hashed */
		if (j != a->cur && auth_job_share(j) == top && (!ctop || j->c->conn == ctop))
			v = j;
	if (!v)
		return KVD_ELIMIT;
	auth_job_unqueue(k, v);
	call_finish(k, v->c, GRPC_RESOURCE_EXHAUSTED, "%s", E_TOO_MANY_REQUESTS);
	k->st.yields[YIELD_HASHES]++;
	return 0;
}

/* Queue a bcrypt of pw for c (salt NULL: a fresh one, for a new hash); the
 * loop calls c's handler again when it is ready.  0, or the error in *e. */
static int auth_hash_start(struct kvd *k, struct call *c, struct kvd_slice pw, const uint8_t *salt, unsigned cost,
                           struct svc_err *e)
{
	struct auth *a = &k->auth;
	struct auth_job *j = c->svc;
	uint8_t fresh[16];

	if (!j && a->njobs >= KVD_AUTH_MAX_JOBS && auth_job_make_room(k, c))
		return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, E_TOO_MANY_REQUESTS);
	if (!salt && auth_random(k, fresh, sizeof fresh))
		return svc_fail(e, GRPC_UNAVAILABLE, "kvd: cannot read /dev/urandom");
	if (!j) {
		if (!(j = kvd_calloc(k, sizeof *j)))
			return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		j->c = c;
		j->rq = c->rq;
		c->rq = NULL;
		c->svc = j;
	}
	auth_bcrypt_begin(&j->h, pw.p, pw.n, salt ? salt : fresh, cost); /* every byte, as Go's bcrypt */
	j->rev = a->rev;
	j->done = 0;
	j->queued = 1;
	j->next = NULL;
	if (a->jobs_tail)
		a->jobs_tail->next = j;
	else
		a->jobs = j;
	a->jobs_tail = j;
	a->njobs++;
	util_wake_by(k, k->now);
	return 0;
}

/* The call goes (answered, or its client left): its hash with it. */
static void auth_job_close(struct kvd *k, struct call *c)
{
	struct auth_job *j = c->svc;

	if (!j)
		return;
	if (j->queued)
		auth_job_unqueue(k, j);
	pb_free(k, j->rq);
	util_wipe(j, sizeof *j); /* the password's key schedule */
	kvd_free(k, j);
	c->svc = NULL;
}

/* The next job to hash: the one whose address, then connection, had its
 * turn longest ago (oldest first among equals); its turn is taken now. */
static struct auth_job *auth_job_next(struct kvd *k)
{
	struct auth *a = &k->auth;
	struct auth_job *j, *best = NULL;
	struct share *sh;
	uint64_t bs = 0, bc = 0, vs, vc;

	for (j = a->jobs; j; j = j->next) {
		sh = auth_job_share(j);
		vs = sh ? sh->vt : 0;
		vc = j->c->conn ? j->c->conn->vt : 0;
		if (!best || vs < bs || (vs == bs && vc < bc)) {
			best = j;
			bs = vs;
			bc = vc;
		}
	}
	if (best) {
		if ((sh = auth_job_share(best)))
			sh->vt = ++a->vclock;
		if (best->c->conn)
			best->c->conn->vt = ++a->vclock;
	}
	return best;
}

/* Hash for at most KVD_AUTH_SLICE_US, the jobs in their fair turns;
 * finished jobs go back to their handlers.  Runs once per loop iteration. */
static void auth_step(struct kvd *k)
{
	struct auth *a = &k->auth;
	struct auth_job *j;
	int64_t t0;

	if (!a->jobs)
		return;
	t0 = auth_us();
	while (a->cur || (a->cur = auth_job_next(k))) {
		j = a->cur;
		while (!auth_bcrypt_step(&j->h, 2))
			if (auth_us() - t0 >= KVD_AUTH_SLICE_US)
				goto more;
		auth_job_unqueue(k, j);
		auth_bcrypt_end(&j->h, j->out);
		j->done = 1;
		a->hashes++;
		if (!j->c->finished) /* a call past its deadline changes nothing */
			j->c->m->on_msg(k, j->c); /* answers, or queues it again */
		if (auth_us() - t0 >= KVD_AUTH_SLICE_US)
			break;
	}
more:
	util_wake_by(k, k->now); /* another slice, or the answers out, at once */
}

#else /* KVD_NO_AUTH: nobody to be, and everything allowed */

KVD_RESIDENT static int auth_open(struct kvd *k, char *err, size_t errlen)
{
	const char *spec = k->cfg.auth_token ? k->cfg.auth_token : "simple";

	if (!strcmp(spec, "simple"))
		return 0;
	snprintf(err, errlen, "--auth-token %s: this kvd is built without auth (KVD_NO_AUTH)", spec);
	return KVD_EINVAL;
}

static int auth_who(struct kvd *k, struct call *c, struct auth_who *w, struct svc_err *e)
{
	(void)k;
	(void)c;
	(void)e;
	w->name = NULL;
	w->nlen = 0;
	w->rev = 0;
	w->named = 0;
	return 0;
}

static int auth_admin(struct kvd *k, const struct auth_who *w, struct svc_err *e)
{
	(void)k;
	(void)w;
	(void)e;
	return 0;
}

static int auth_root(struct kvd *k, struct call *c, struct svc_err *e)
{
	(void)k;
	(void)c;
	(void)e;
	return 0;
}

static int auth_need_user(struct kvd *k, struct call *c, struct auth_who *who, struct svc_err *e)
{
	return auth_who(k, c, who, e);
}

static const char *auth_watch_reason(const struct svc_err *e)
{
	return e->msg; /* no check fails */
}

static int auth_may(struct kvd *k, const struct auth_who *w, const ProtobufCBinaryData *key,
                    const ProtobufCBinaryData *end, int type, struct svc_err *e)
{
	(void)k;
	(void)w;
	(void)key;
	(void)end;
	(void)type;
	(void)e;
	return 0;
}

static int auth_txn(struct kvd *k, const struct auth_who *who, const Etcdserverpb__TxnRequest *rq, struct svc_err *e)
{
	(void)k;
	(void)who;
	(void)rq;
	(void)e;
	return 0;
}

static int auth_lease_keys(struct kvd *k, const struct auth_who *who, int64_t id, int type, struct svc_err *e)
{
	(void)k;
	(void)who;
	(void)id;
	(void)type;
	(void)e;
	return 0;
}

static void auth_step(struct kvd *k)
{
	(void)k;
}
#endif /* KVD_NO_AUTH */

/* ===== 20. Go's sort.Sort, as etcd sorts ranges (svc_gosort_) ============ */

/*
 * etcd sorts a Range's results with Go's sort.Sort, which is not stable:
 * keys that tie on the sort target come out in an order only its algorithm
 * decides.  This is Go 1.26's pattern-defeating quicksort (etcd 3.7.3 is
 * built with Go 1.26), step for step (pivot choice, the xorshift that breaks
 * patterns, the insertion-sort cut-offs, partialInsertionSort, the heapsort
 * fallback), so ties come out exactly as etcd's do.  Go 1.19 introduced this
 * algorithm and 1.26 differs from it only in that xorshift: 1.19 to 1.23
 * shifted <<13, >>17, <<5 (a 32-bit generator's triple, golang/go#70144),
 * later releases <<13, >>7, <<17.  The xorshift picks the elements swapped
 * after an unbalanced partition, so inputs that never partition badly sort
 * alike under both; in the others ties can come out differently.  Auth's
 * permission lists (etcd's permSlice, section 23) go through the same code
 * (svc_gosort_ptrs).
 *
 * Invariants:
 *   1. Every step is Go's, in Go's order: the same Less and Swap calls on
 *      the same indices as Go 1.26's pdqsort (svc_gosort_pdq and its
 *      helpers, one per Go function; svc_gosort_bitlen is bits.Len, the
 *      depth limit).  A tidier cut-off, pivot or loop bound (Go's j >= 1 in
 *      partialInsertionSort, the signed indices of partition) changes how
 *      ties come out.
 *   2. Less is strict, and sort.Reverse swaps its arguments -- less(j, i),
 *      never !less(i, j) (svc_gosort_less).
 *   3. A swap moves a kv and its value together (svc_gosort_swap swaps
 *      g->val with g->v): a VALUE sort reads each value once, before it
 *      starts (svc_range, section 21).
 *   4. Indices are absolute and every caller sorts a whole array from 0
 *      (svc_range, svc_gosort_ptrs), as pdqsort's "a > 0" test assumes.
 */
/* RangeRequest's sort options, by name. */
#define SORT_NONE ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__NONE
#define SORT_ASCEND ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__ASCEND
#define SORT_DESCEND ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__DESCEND
#define SORT_BY_KEY ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__KEY
#define SORT_BY_VERSION ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__VERSION
#define SORT_BY_CREATE ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__CREATE
#define SORT_BY_MOD ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__MOD
#define SORT_BY_VALUE ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__VALUE

struct gosort {
	struct mvcc_kv *v;
	int target;     /* RangeRequest.SortTarget */
	int reverse;    /* sort.Reverse */
	struct kvd *k;  /* VALUE sorts read values */
	uint8_t **val;  /* values, read once for VALUE sorts */
	void **pv;      /* or: any array of pointers, with its Less (auth's permissions) */
	int (*pless)(const void *a, const void *b);
};

static int svc_gosort_less_raw(struct gosort *g, size_t i, size_t j)
{
	const struct mvcc_kv *a = &g->v[i], *b = &g->v[j];

	switch (g->target) {
	case SORT_BY_KEY: return mvcc_cmp(a->r->key, a->r->klen, b->r->key, b->r->klen) < 0;
	case SORT_BY_VERSION: return a->ver < b->ver;
	case SORT_BY_CREATE: return a->create < b->create;
	case SORT_BY_MOD: return a->mod < b->mod;
	default: return mvcc_cmp(g->val[i], a->vlen, g->val[j], b->vlen) < 0;
	}
}

static int svc_gosort_less(struct gosort *g, size_t i, size_t j)
{
	if (g->pv)
		return g->pless(g->pv[i], g->pv[j]);
	return g->reverse ? svc_gosort_less_raw(g, j, i) : svc_gosort_less_raw(g, i, j);
}

static void svc_gosort_swap(struct gosort *g, size_t i, size_t j)
{
	struct mvcc_kv t;
	uint8_t *tv;

	if (g->pv) {
		void *x = g->pv[i];
		g->pv[i] = g->pv[j];
		g->pv[j] = x;
		return;
	}
	t = g->v[i];
	g->v[i] = g->v[j];
	g->v[j] = t;
	if (g->val) {
		tv = g->val[i];
		g->val[i] = g->val[j];
		g->val[j] = tv;
	}
}

static unsigned svc_gosort_bitlen(size_t n)
{
	unsigned l = 0;

	while (n) {
		l++;
		n >>= 1;
	}
	return l;
}

static void svc_gosort_insertion(struct gosort *g, size_t a, size_t b)
{
	size_t i, j;

	for (i = a + 1; i < b; i++)
		for (j = i; j > a && svc_gosort_less(g, j, j - 1); j--)
			svc_gosort_swap(g, j, j - 1);
}

static void svc_gosort_sift(struct gosort *g, size_t lo, size_t hi, size_t first)
{
	size_t root = lo, child;

	for (;;) {
		child = 2 * root + 1;
		if (child >= hi)
			return;
		if (child + 1 < hi && svc_gosort_less(g, first + child, first + child + 1))
			child++;
		if (!svc_gosort_less(g, first + root, first + child))
			return;
		svc_gosort_swap(g, first + root, first + child);
		root = child;
	}
}

static void svc_gosort_heap(struct gosort *g, size_t a, size_t b)
{
	size_t hi = b - a, i;

	for (i = (hi - 1) / 2 + 1; i-- > 0;)
		svc_gosort_sift(g, i, hi, a);
	for (i = hi; i-- > 0;) {
		svc_gosort_swap(g, a, a + i);
		svc_gosort_sift(g, 0, i, a);
	}
}

static void svc_gosort_order2(struct gosort *g, size_t *a, size_t *b, int *swaps)
{
	size_t t;

	if (svc_gosort_less(g, *b, *a)) {
		(*swaps)++;
		t = *a;
		*a = *b;
		*b = t;
	}
}

static size_t svc_gosort_median(struct gosort *g, size_t a, size_t b, size_t c, int *swaps)
{
	svc_gosort_order2(g, &a, &b, swaps);
	svc_gosort_order2(g, &b, &c, swaps);
	svc_gosort_order2(g, &a, &b, swaps);
	return b;
}

/* hint: 0 unknown, 1 increasing, 2 decreasing */
static size_t svc_gosort_pivot(struct gosort *g, size_t a, size_t b, int *hint)
{
	size_t l = b - a, i = a + l / 4 * 1, j = a + l / 4 * 2, kk = a + l / 4 * 3;
	int swaps = 0;

	if (l >= 8) {
		if (l >= 50) {
			i = svc_gosort_median(g, i - 1, i, i + 1, &swaps);
			j = svc_gosort_median(g, j - 1, j, j + 1, &swaps);
			kk = svc_gosort_median(g, kk - 1, kk, kk + 1, &swaps);
		}
		j = svc_gosort_median(g, i, j, kk, &swaps);
	}
	*hint = swaps == 0 ? 1 : swaps == 12 ? 2 : 0;
	return j;
}

static void svc_gosort_reverse_range(struct gosort *g, size_t a, size_t b)
{
	size_t i = a, j = b - 1;

	while (i < j)
		svc_gosort_swap(g, i++, j--);
}

static int svc_gosort_partial_insertion(struct gosort *g, size_t a, size_t b)
{
	size_t i = a + 1, j;
	int step;

	for (step = 0; step < 5; step++) {
		while (i < b && !svc_gosort_less(g, i, i - 1))
			i++;
		if (i == b)
			return 1;
		if (b - a < 50)
			return 0;
		svc_gosort_swap(g, i, i - 1);
		if (i - a >= 2)
			for (j = i - 1; j >= 1; j--) {
				if (!svc_gosort_less(g, j, j - 1))
					break;
				svc_gosort_swap(g, j, j - 1);
			}
		if (b - i >= 2)
			for (j = i + 1; j < b; j++) {
				if (!svc_gosort_less(g, j, j - 1))
					break;
				svc_gosort_swap(g, j, j - 1);
			}
	}
	return 0;
}

static void svc_gosort_break_patterns(struct gosort *g, size_t a, size_t b)
{
	size_t length = b - a, idx, other, modulus;
	uint64_t r;
	int i;

	if (length < 8)
		return;
	r = length; /* Go 1.26's xorshift: <<13, >>7, <<17, seeded with the length */
	modulus = (size_t)1 << svc_gosort_bitlen(length);
	idx = a + (length / 4) * 2 - 1;
	for (i = 0; i < 3; i++) {
		r ^= r << 13;
		r ^= r >> 7;
		r ^= r << 17;
		other = (size_t)(r & (modulus - 1));
		if (other >= length)
			other -= length;
		svc_gosort_swap(g, idx + (size_t)i, a + other);
	}
}

static size_t svc_gosort_partition(struct gosort *g, size_t a, size_t b, size_t pivot, int *already)
{
	size_t i = a + 1, j = b - 1; /* inclusive; j may go below i (signed semantics) */
	long li, lj;

	svc_gosort_swap(g, a, pivot);
	li = (long)i;
	lj = (long)j;
	while (li <= lj && svc_gosort_less(g, (size_t)li, a))
		li++;
	while (li <= lj && !svc_gosort_less(g, (size_t)lj, a))
		lj--;
	if (li > lj) {
		svc_gosort_swap(g, (size_t)lj, a);
		*already = 1;
		return (size_t)lj;
	}
	svc_gosort_swap(g, (size_t)li, (size_t)lj);
	li++;
	lj--;
	for (;;) {
		while (li <= lj && svc_gosort_less(g, (size_t)li, a))
			li++;
		while (li <= lj && !svc_gosort_less(g, (size_t)lj, a))
			lj--;
		if (li > lj)
			break;
		svc_gosort_swap(g, (size_t)li, (size_t)lj);
		li++;
		lj--;
	}
	svc_gosort_swap(g, (size_t)lj, a);
	*already = 0;
	return (size_t)lj;
}

static size_t svc_gosort_partition_equal(struct gosort *g, size_t a, size_t b, size_t pivot)
{
	long li = (long)a + 1, lj = (long)b - 1;

	svc_gosort_swap(g, a, pivot);
	for (;;) {
		while (li <= lj && !svc_gosort_less(g, a, (size_t)li))
			li++;
		while (li <= lj && svc_gosort_less(g, a, (size_t)lj))
			lj--;
		if (li > lj)
			break;
		svc_gosort_swap(g, (size_t)li, (size_t)lj);
		li++;
		lj--;
	}
	return (size_t)li;
}

static void svc_gosort_pdq(struct gosort *g, size_t a, size_t b, unsigned limit)
{
	int balanced = 1, partitioned = 1, hint, already;
	size_t length, pivot, mid, left, right;

	for (;;) {
		length = b - a;
		if (length <= 12) {
			svc_gosort_insertion(g, a, b);
			return;
		}
		if (!limit) {
			svc_gosort_heap(g, a, b);
			return;
		}
		if (!balanced) {
			svc_gosort_break_patterns(g, a, b);
			limit--;
		}
		pivot = svc_gosort_pivot(g, a, b, &hint);
		if (hint == 2) {
			svc_gosort_reverse_range(g, a, b);
			pivot = (b - 1) - (pivot - a);
			hint = 1;
		}
		if (balanced && partitioned && hint == 1 && svc_gosort_partial_insertion(g, a, b))
			return;
		if (a > 0 && !svc_gosort_less(g, a - 1, pivot)) {
			a = svc_gosort_partition_equal(g, a, b, pivot);
			continue;
		}
		mid = svc_gosort_partition(g, a, b, pivot, &already);
		partitioned = already;
		left = mid - a;
		right = b - mid;
		if (left < right) {
			balanced = left >= length / 8;
			svc_gosort_pdq(g, a, mid, limit);
			a = mid + 1;
		} else {
			balanced = right >= length / 8;
			svc_gosort_pdq(g, mid + 1, b, limit);
			b = mid;
		}
	}
}

/* sort.Sort over n pointers with Less (auth's permSlice; unused with KVD_NO_AUTH). */
KVD_UNUSED static void svc_gosort_ptrs(void **v, size_t n, int (*less)(const void *, const void *))
{
	struct gosort g;

	memset(&g, 0, sizeof g);
	g.pv = v;
	g.pless = less;
	svc_gosort_pdq(&g, 0, n, svc_gosort_bitlen(n));
}

/* ===== 21. Services: KV (svc_) =========================================== */

/*
 * The KV service: Range, Put, DeleteRange, Txn, Compact, and kvd's
 * RangeStream, on the index (section 10).  A handler checks the request,
 * asks who is calling and whether they may (section 19), then reads the
 * index or writes in one txn (mvcc_txn_begin .. mvcc_txn_end).  The Txn
 * RPC's code (svc_txn_do) also runs the Lock and Election recipes
 * (section 26).  Semantics follow etcd 3.7 (etcdserver/txn, v3rpc/key.go,
 * mvcc): error texts byte for byte, the order checks run in, header
 * revisions of top-level and txn sub-responses, count before filters, and
 * sorting with Go 1.26's sort.Sort (pdqsort, not stable: section 20) so
 * ties order exactly as etcd's do.
 *
 * Invariants:
 *   1. Checks run in etcd 3.7's order and fail with its texts (E_*):
 *      v3rpc's (svc_range_check, svc_txn_check, svc_intervals), who is
 *      calling (auth_who), the size (svc_too_large), permission (auth_may,
 *      auth_txn), then the apply's own (svc_txn_precheck) -- all before
 *      anything is written.
 *   2. A write is one txn, whole or not at all: svc_writable (a broken
 *      log, the last revision, the quota: life_admit) before
 *      mvcc_txn_begin, and a failed op aborts every op of it
 *      (mvcc_txn_abort).  A Txn's branches are all decided on the state
 *      before it (svc_txn_path).
 *   3. No handler waits or sends: it says whether it wrote (s->wrote, only
 *      when t.nops > 0) and ends its call; call_finish holds the reply until
 *      the batch is durable (section 8).
 *   4. A response's memory is one svc_pool, freed after svc_end packed it;
 *      a KeyValue's key points into the index (svc_kvs), which no op of the
 *      call frees (a delete leaves a tombstone key).
 *   5. RangeStream reads at one revision: the request's, or the newest
 *      durable one (k->db.rev_durable) pinned at its start; each chunk
 *      checks compaction again (svc_rstream_chunk).
 */


static void svc_header(struct kvd *k, Etcdserverpb__ResponseHeader *h, int with_revision)
{
	etcdserverpb__response_header__init(h);
	h->cluster_id = k->cluster_id;
	h->member_id = k->member_id;
	h->raft_term = SVC_RAFT_TERM;
	if (with_revision)
		h->revision = k->db.rev;
}

/* Allocations for one response, freed together. */
struct svc_pool {
	struct kvd *k;
	void *head;
	int oom;
};

static void *svc_alloc(struct svc_pool *pl, size_t n)
{
	void **b = kvd_malloc(pl->k, sizeof(void *) + n);

	if (!b) {
		pl->oom = 1;
		return NULL;
	}
	*b = pl->head;
	pl->head = b;
	memset(b + 1, 0, n);
	return b + 1;
}

static void svc_pool_free(struct svc_pool *pl)
{
	void **b = pl->head, **next;

	for (; b; b = next) {
		next = *b;
		kvd_free(pl->k, b);
	}
	pl->head = NULL;
}

/* The size etcd compares with --max-request-bytes is the raft entry: the
 * request plus an InternalRaftRequest envelope of about 29 bytes. */
static int svc_too_large(struct kvd *k, size_t n)
{
	return n + 29 > k->cfg.max_request_bytes;
}

/* ---- ranges ------------------------------------------------------------- */

/* kvs found by a range, before they become protobuf. */
struct svc_range {
	struct mvcc_kv *kv;
	size_t n, cap;
	int64_t count;
	int more;
};

static int svc_range_push(struct kvd *k, struct svc_range *rr, const struct mvcc_kv *kv)
{
	if (UTIL_GROW(k, rr->kv, rr->cap, rr->n + 1, 16))
		return KVD_ENOMEM;
	rr->kv[rr->n++] = *kv;
	return 0;
}

/* Is key inside [start, end) as etcd reads range_end: empty = just start,
 * "\0" = no upper bound. */
static int svc_in_range(const uint8_t *key, size_t n, const ProtobufCBinaryData *end)
{
	if (end->len == 1 && end->data[0] == 0)
		return 1;
	return mvcc_cmp(key, n, end->data, end->len) < 0;
}

/*
 * etcd's mvcc Range + apply.go filtering, sorting and limit.  cur is the
 * revision reads see (inside a write txn: the txn's own, once it changed
 * something).  Values are not read here (svc_kv_values does it).
 */
static int svc_range(struct kvd *k, const Etcdserverpb__RangeRequest *rq, int64_t cur, struct svc_range *rr,
                     struct svc_err *e)
{
	struct mvcc *m = &k->db;
	int64_t rev = rq->revision, at, fetch;
	struct mvcc_it it;
	struct mvcc_key *r;
	struct mvcc_kv kv;
	int eq, vis, sorted, order;
	size_t i, o;

	memset(rr, 0, sizeof *rr);
	if (rev > cur)
		return svc_fail(e, GRPC_OUT_OF_RANGE, E_FUTURE_REV);
	if (rev <= 0)
		rev = cur;
	if (rev < m->compacted)
		return svc_fail(e, GRPC_OUT_OF_RANGE, E_COMPACTED);
	at = rev >= cur ? 0 : rev; /* 0: the latest state, which RAM holds */
#if KVD_TEST_BUG == 2 /* planted: stale and serializable reads see one revision too old */
	if ((rq->serializable || at) && rev - 1 > m->compacted && rev > 2)
		at = rev - 1;
#endif
	sorted = rq->sort_order != SORT_NONE || rq->min_mod_revision || rq->max_mod_revision ||
	         rq->min_create_revision || rq->max_create_revision;
	fetch = sorted || rq->limit <= 0 ? 0 : rq->limit < INT64_MAX ? rq->limit + 1 : INT64_MAX; /* etcd's rangeLimit */
	it = mvcc_seek(m, rq->key.data, rq->key.len, &eq);
	if (!rq->range_end.len && !eq)
		it.li = m->nleaf; /* a single key that does not exist */
	for (; (r = mvcc_at(m, it)); mvcc_next(m, &it)) {
		if (rq->range_end.len && !svc_in_range(r->key, r->klen, &rq->range_end))
			break;
		vis = mvcc_visible(m, r, at, &kv);
		if (vis < 0)
			return svc_fail(e, GRPC_DATA_LOSS, "kvd: cannot read the log");
		if (vis) {
			rr->count++;
			if (!rq->count_only && (!fetch || (int64_t)rr->n < fetch) && svc_range_push(k, rr, &kv))
				return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		}
		if (!rq->range_end.len)
			break;
	}
	/* revision filters, in etcd's order */
	for (i = o = 0; i < rr->n; i++) {
		kv = rr->kv[i];
		if ((rq->max_mod_revision && kv.mod > rq->max_mod_revision) ||
		    (rq->min_mod_revision && kv.mod < rq->min_mod_revision) ||
		    (rq->max_create_revision && kv.create > rq->max_create_revision) ||
		    (rq->min_create_revision && kv.create < rq->min_create_revision))
			continue;
		rr->kv[o++] = kv;
	}
	rr->n = o;
	order = (int)rq->sort_order;
	if (rq->sort_target != SORT_BY_KEY && order == SORT_NONE)
		order = SORT_ASCEND; /* results are key-ordered; other targets sort ascending */
	if ((order == SORT_ASCEND || order == SORT_DESCEND) && rq->sort_target <= SORT_BY_VALUE && rr->n > 1 &&
	    !(rq->sort_target == SORT_BY_KEY && order == SORT_ASCEND)) {
		struct gosort g = {rr->kv, (int)rq->sort_target, order == SORT_DESCEND, k, NULL, NULL, NULL};
		if (g.target == SORT_BY_VALUE) { /* by value: read them once */
			g.val = kvd_calloc(k, rr->n * sizeof *g.val);
			for (i = 0; g.val && i < rr->n; i++)
				if (!(g.val[i] = kvd_malloc(k, rr->kv[i].vlen + 1)) ||
				    mvcc_pread(m, g.val[i], rr->kv[i].vlen, rr->kv[i].voff))
					break;
			if (!g.val || i < rr->n) {
				for (o = 0; g.val && o <= i && o < rr->n; o++)
					kvd_free(k, g.val[o]);
				kvd_free(k, g.val);
				return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			}
		}
		svc_gosort_pdq(&g, 0, rr->n, svc_gosort_bitlen(rr->n));
		if (g.val) {
			for (i = 0; i < rr->n; i++)
				kvd_free(k, g.val[i]);
			kvd_free(k, g.val);
		}
	} /* ASCEND by KEY: already in key order, which pdqsort leaves untouched */
	if (rq->limit > 0 && (int64_t)rr->n > rq->limit) {
		rr->n = (size_t)rq->limit;
		rr->more = 1;
	}
	return 0;
}

/*
 * Turn kvs into protobuf KeyValues.  Keys point into the index (valid until
 * the next write); values are read into one block from the pool.  keys_only
 * is svc_keys_only()'s: 1 leaves values out, 2 leases too.
 */
static int svc_kvs(struct kvd *k, struct svc_pool *pl, const struct mvcc_kv *kv, size_t n, int keys_only,
                   Mvccpb__KeyValue ***out)
{
	Mvccpb__KeyValue **pp, *v;
	uint8_t *vals = NULL;
	size_t i, total = 0;

	*out = NULL;
	if (!n)
		return 0;
	for (i = 0; i < n && !keys_only; i++)
		total += kv[i].vlen;
	pp = svc_alloc(pl, n * sizeof *pp);
	v = svc_alloc(pl, n * sizeof *v);
	if (!pp || !v || (total && !(vals = svc_alloc(pl, total))))
		return KVD_ENOMEM;
	for (i = 0; i < n; i++) {
		mvccpb__key_value__init(&v[i]);
		v[i].key.data = (uint8_t *)kv[i].r->key;
		v[i].key.len = kv[i].r->klen;
		v[i].create_revision = kv[i].create;
		v[i].mod_revision = kv[i].mod;
		v[i].version = kv[i].ver;
		v[i].lease = keys_only == 2 ? 0 : kv[i].lease;
		if (!keys_only && kv[i].vlen) {
			if (mvcc_pread(&k->db, vals, kv[i].vlen, kv[i].voff))
				return KVD_EIO;
			v[i].value.data = vals;
			v[i].value.len = kv[i].vlen;
			vals += kv[i].vlen;
		}
		pp[i] = &v[i];
	}
	*out = pp;
	return 0;
}

/* etcd 3.7's keys-only read comes from its index (no lease) unless it sorts
 * by value, which reads the records. */
static int svc_keys_only(const Etcdserverpb__RangeRequest *rq)
{
	return !rq->keys_only ? 0 : rq->sort_target == SORT_BY_VALUE ? 1 : 2;
}

/* ---- txn machinery shared by Put, DeleteRange and Txn -------------------- */

/* The revision reads see inside write txn t (etcd: beginRev, +1 once changed). */
static int64_t svc_cur(struct kvd *k, const struct mvcc_txn *t)
{
	return t && t->nops ? t->rev : k->db.rev;
}

static int svc_range_op(struct kvd *k, struct svc_pool *pl, const struct mvcc_txn *t,
                        const Etcdserverpb__RangeRequest *rq, Etcdserverpb__RangeResponse *rs, struct svc_err *e)
{
	struct svc_range rr;
	int r;

	r = svc_range(k, rq, svc_cur(k, t), &rr, e);
	if (!r && svc_kvs(k, pl, rr.kv, rr.n, svc_keys_only(rq), &rs->kvs))
		r = svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	if (!r) {
		rs->n_kvs = rs->kvs ? rr.n : 0;
		rs->more = rr.more;
		rs->count = rr.count;
	}
	kvd_free(k, rr.kv);
	return r;
}

/* The live kv of key, or NULL. */
static struct mvcc_key *svc_live(struct kvd *k, const ProtobufCBinaryData *key)
{
	struct mvcc_key *r = mvcc_find(&k->db, key->data, key->len);

	return r && (r->flags & MVCC_LIVE) ? r : NULL;
}

/* The latest kv of live key r. */
static void svc_kv_of(struct mvcc *m, const struct mvcc_key *r, struct mvcc_kv *kv)
{
	KVD_ALWAYS(mvcc_visible(m, r, 0, kv) == 1);
}

static int svc_lease_exists(struct kvd *k, int64_t id)
{
	return id && lease_find(k, id);
}

static int svc_put_op(struct kvd *k, struct svc_pool *pl, struct mvcc_txn *t,
                      const Etcdserverpb__PutRequest *rq, Etcdserverpb__PutResponse *rs, struct svc_err *e)
{
	struct mvcc_key *r = svc_live(k, &rq->key);
	struct mvcc_kv kv;
	const uint8_t *val = rq->value.data;
	size_t vlen = rq->value.len;
	uint8_t *copy = NULL;
	int64_t lease = rq->lease;
	int err;

	etcdserverpb__put_response__init(rs);
	if ((rq->ignore_value || rq->ignore_lease) && !r)
		return svc_fail(e, GRPC_INVALID_ARGUMENT, E_KEY_NOT_FOUND);
	if (rq->prev_kv && r) {
		Mvccpb__KeyValue **pp;
		svc_kv_of(&k->db, r, &kv);
		if (svc_kvs(k, pl, &kv, 1, 0, &pp))
			return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		rs->prev_kv = pp[0];
	}
	if (rq->ignore_value) { /* the old value, copied: the batch may move */
		vlen = r->vlen;
		if (!(copy = kvd_malloc(k, vlen + 1)) || mvcc_pread(&k->db, copy, vlen, mvcc_voff(&k->db, r))) {
			kvd_free(k, copy);
			return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		}
		val = copy;
	}
	if (rq->ignore_lease)
		lease = mvcc_k_lease(&k->db, r);
	err = mvcc_put(k, t, rq->key.data, rq->key.len, val, vlen, lease);
	kvd_free(k, copy);
	if (err == KVD_ERANGE)
		return svc_fail(e, GRPC_OUT_OF_RANGE, E_NO_VERSION);
	if (err)
		return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, err == KVD_ELIMIT ? E_TOO_LARGE : "kvd: out of memory");
	if (!(rs->header = svc_alloc(pl, sizeof *rs->header)))
		return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	etcdserverpb__response_header__init(rs->header);
	rs->header->revision = t->rev;
	return 0;
}

static int svc_delete_op(struct kvd *k, struct svc_pool *pl, struct mvcc_txn *t,
                         const Etcdserverpb__DeleteRangeRequest *rq, Etcdserverpb__DeleteRangeResponse *rs,
                         struct svc_err *e)
{
	struct mvcc *m = &k->db;
	struct svc_range rr = {0};
	struct mvcc_it it;
	struct mvcc_key *r;
	struct mvcc_kv kv;
	size_t i;
	int eq, err = 0;

	etcdserverpb__delete_range_response__init(rs);
	it = mvcc_seek(m, rq->key.data, rq->key.len, &eq);
	if (!rq->range_end.len && !eq)
		it.li = m->nleaf;
	for (; (r = mvcc_at(m, it)); mvcc_next(m, &it)) {
		if (rq->range_end.len && !svc_in_range(r->key, r->klen, &rq->range_end))
			break;
		if (r->flags & MVCC_LIVE) {
			svc_kv_of(&k->db, r, &kv);
			if (svc_range_push(k, &rr, &kv)) {
				err = svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
				goto out;
			}
		}
		if (!rq->range_end.len)
			break;
	}
	if (rq->prev_kv && svc_kvs(k, pl, rr.kv, rr.n, 0, &rs->prev_kvs)) {
		err = svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		goto out;
	}
	rs->n_prev_kvs = rq->prev_kv ? rr.n : 0;
	for (i = 0; i < rr.n; i++)
		if (mvcc_del(k, t, (struct mvcc_key *)rr.kv[i].r)) {
			err = svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			goto out;
		}
	rs->deleted = (int64_t)rr.n;
	if (!(rs->header = svc_alloc(pl, sizeof *rs->header))) {
		err = svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		goto out;
	}
	etcdserverpb__response_header__init(rs->header);
	rs->header->revision = svc_cur(k, t);
out:
	kvd_free(k, rr.kv);
	return err;
}

/* ---- Txn ---------------------------------------------------------------- */

/* v3rpc checkTxnRequest / checkRequestOp: sizes, empty keys, empty ops;
 * nested txns get what the outer one leaves of --max-txn-ops, and at most
 * KVD_MAX_TXN_NEST levels (the decoder bounded the recursion already). */
static int svc_txn_check(const Etcdserverpb__TxnRequest *rq, long max, unsigned depth, struct svc_err *e);

/* v3rpc checkRangeRequest: a key, and sort enums etcd knows (3.6+). */
static int svc_range_check(const Etcdserverpb__RangeRequest *rq, struct svc_err *e)
{
	if (!rq->key.len)
		return svc_fail(e, GRPC_INVALID_ARGUMENT, E_EMPTY_KEY);
	if ((unsigned)rq->sort_order > SORT_DESCEND || (unsigned)rq->sort_target > SORT_BY_VALUE)
		return svc_fail(e, GRPC_INVALID_ARGUMENT, E_BAD_SORT);
	return 0;
}

static int svc_op_check(const Etcdserverpb__RequestOp *op, long max, unsigned depth, struct svc_err *e)
{
	switch (op->request_case) {
	case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE:
		return svc_range_check(op->request_range, e);
	case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT: {
		const Etcdserverpb__PutRequest *p = op->request_put;
		if (!p->key.len)
			return svc_fail(e, GRPC_INVALID_ARGUMENT, E_EMPTY_KEY);
		if (p->ignore_value && p->value.len)
			return svc_fail(e, GRPC_INVALID_ARGUMENT, E_VALUE_PROVIDED);
		if (p->ignore_lease && p->lease)
			return svc_fail(e, GRPC_INVALID_ARGUMENT, E_LEASE_PROVIDED);
		return 0;
	}
	case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE:
		return op->request_delete_range->key.len ? 0 : svc_fail(e, GRPC_INVALID_ARGUMENT, E_EMPTY_KEY);
	case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN:
		return svc_txn_check(op->request_txn, max, depth + 1, e);
	default:
		return svc_fail(e, GRPC_INVALID_ARGUMENT, E_KEY_NOT_FOUND);
	}
}

static int svc_txn_check(const Etcdserverpb__TxnRequest *rq, long max, unsigned depth, struct svc_err *e)
{
	long opc = (long)rq->n_compare;
	size_t i;

	opc = KVD_MAX(opc, (long)rq->n_success);
	opc = KVD_MAX(opc, (long)rq->n_failure);
	if (opc > max || depth > KVD_MAX_TXN_NEST)
		return svc_fail(e, GRPC_INVALID_ARGUMENT, E_TOO_MANY_OPS);
	for (i = 0; i < rq->n_compare; i++)
		if (!rq->compare[i]->key.len)
			return svc_fail(e, GRPC_INVALID_ARGUMENT, E_EMPTY_KEY);
	for (i = 0; i < rq->n_success; i++)
		if (svc_op_check(rq->success[i], max - opc, depth, e))
			return KVD_EINVAL;
	for (i = 0; i < rq->n_failure; i++)
		if (svc_op_check(rq->failure[i], max - opc, depth, e))
			return KVD_EINVAL;
	return 0;
}

/*
 * v3rpc checkIntervals: puts may not overlap other puts or deletes of the
 * same branch, nested txns included (their then/else branches may share
 * keys).  Intervals use etcd's "affine" strings: "" as an end is +infinity,
 * and a delete with range_end "\0" becomes [key, "\0"), which overlaps
 * nothing -- as in etcd.
 */
struct svc_ivs {
	struct { const ProtobufCBinaryData *a, *b; int point; } *iv; /* deletes */
	size_t ni, capi;
	const ProtobufCBinaryData **puts;
	size_t np, capp;
};

static int svc_iv_hit(const struct svc_ivs *s, const ProtobufCBinaryData *key)
{
	size_t i;

	for (i = 0; i < s->ni; i++) {
		const ProtobufCBinaryData *a = s->iv[i].a, *b = s->iv[i].b;
		if (s->iv[i].point) { /* [a, a\0) meets [key, key\0) iff a == key */
			if (!mvcc_cmp(a->data, a->len, key->data, key->len))
				return 1;
		} else if (mvcc_cmp(a->data, a->len, key->data, key->len) <= 0 &&
		           mvcc_cmp(key->data, key->len, b->data, b->len) < 0) {
			return 1;
		}
	}
	return 0;
}

static int svc_put_seen(const struct svc_ivs *s, const ProtobufCBinaryData *key)
{
	size_t i;

	for (i = 0; i < s->np; i++)
		if (!mvcc_cmp(s->puts[i]->data, s->puts[i]->len, key->data, key->len))
			return 1;
	return 0;
}

static int svc_ivs_add_put(struct kvd *k, struct svc_ivs *s, const ProtobufCBinaryData *key)
{
	if (svc_put_seen(s, key)) /* a set, as etcd's map */
		return 0;
	if (UTIL_GROW(k, s->puts, s->capp, s->np + 1, 16))
		return KVD_ENOMEM;
	s->puts[s->np++] = key;
	return 0;
}

static int svc_ivs_add_del(struct kvd *k, struct svc_ivs *s, const ProtobufCBinaryData *a,
                           const ProtobufCBinaryData *b, int point)
{
	if (UTIL_GROW(k, s->iv, s->capi, s->ni + 1, 16))
		return KVD_ENOMEM;
	s->iv[s->ni].a = a;
	s->iv[s->ni].b = b;
	s->iv[s->ni].point = point;
	s->ni++;
	return 0;
}

static void svc_ivs_free(struct kvd *k, struct svc_ivs *s)
{
	kvd_free(k, s->iv);
	kvd_free(k, s->puts);
}

static int svc_intervals(struct kvd *k, Etcdserverpb__RequestOp **ops, size_t n, struct svc_ivs *out,
                         struct svc_err *e)
{
	struct svc_ivs then, els;
	size_t i, j;
	int r = 0;

	memset(out, 0, sizeof *out);
	for (i = 0; i < n; i++)
		if (ops[i]->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE) {
			const Etcdserverpb__DeleteRangeRequest *d = ops[i]->request_delete_range;
			if (svc_ivs_add_del(k, out, &d->key, &d->range_end, d->range_end.len == 0))
				return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		}
	for (i = 0; i < n && !r; i++) {
		const Etcdserverpb__TxnRequest *t;
		if (ops[i]->request_case != ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN)
			continue;
		t = ops[i]->request_txn;
		memset(&then, 0, sizeof then);
		memset(&els, 0, sizeof els);
		if (svc_intervals(k, t->success, t->n_success, &then, e) ||
		    svc_intervals(k, t->failure, t->n_failure, &els, e)) {
			r = -1;
		} else {
			for (j = 0; j < then.np && !r; j++) {
				if (svc_put_seen(out, then.puts[j]) || svc_iv_hit(out, then.puts[j]))
					r = svc_fail(e, GRPC_INVALID_ARGUMENT, E_DUP_KEY);
				else if (svc_ivs_add_put(k, out, then.puts[j]))
					r = svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			}
			for (j = 0; j < els.np && !r; j++) {
				if ((svc_put_seen(out, els.puts[j]) && !svc_put_seen(&then, els.puts[j])) ||
				    svc_iv_hit(out, els.puts[j]))
					r = svc_fail(e, GRPC_INVALID_ARGUMENT, E_DUP_KEY);
				else if (svc_ivs_add_put(k, out, els.puts[j]))
					r = svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			}
			for (j = 0; j < then.ni && !r; j++)
				if (svc_ivs_add_del(k, out, then.iv[j].a, then.iv[j].b, then.iv[j].point))
					r = svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			for (j = 0; j < els.ni && !r; j++)
				if (svc_ivs_add_del(k, out, els.iv[j].a, els.iv[j].b, els.iv[j].point))
					r = svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		}
		svc_ivs_free(k, &then);
		svc_ivs_free(k, &els);
	}
	for (i = 0; i < n && !r; i++) {
		const ProtobufCBinaryData *key;
		if (ops[i]->request_case != ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT)
			continue;
		key = &ops[i]->request_put->key;
		if (svc_put_seen(out, key) || svc_iv_hit(out, key))
			r = svc_fail(e, GRPC_INVALID_ARGUMENT, E_DUP_KEY);
		else if (svc_ivs_add_put(k, out, key))
			r = svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	}
	if (r) {
		svc_ivs_free(k, out);
		memset(out, 0, sizeof *out);
	}
	return r;
}

/* The number a Compare names for its target (0 when its union holds
 * another member, as etcd reads it). */
static int64_t svc_cmp_want(const Etcdserverpb__Compare *c)
{
	switch (c->target) {
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE:
		return c->target_union_case == ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION ? c->create_revision : 0;
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD:
		return c->target_union_case == ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION ? c->mod_revision : 0;
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__LEASE:
		return c->target_union_case == ETCDSERVERPB__COMPARE__TARGET_UNION_LEASE ? c->lease : 0;
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__VERSION:
		return c->target_union_case == ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION ? c->version : 0;
	default:
		return 0;
	}
}

/* The key's side of a numeric Compare (a missing key is all zeros). */
static int64_t svc_cmp_have(const Etcdserverpb__Compare *c, const struct mvcc_kv *kv)
{
	if (!kv)
		return 0;
	switch (c->target) {
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE: return kv->create;
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD: return kv->mod;
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__LEASE: return kv->lease;
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__VERSION: return kv->ver;
	default: return 0;
	}
}

/* Does "have <result> want" hold, given cmp = sign(have - want)? */
static int svc_cmp_holds(const Etcdserverpb__Compare *c, int cmp)
{
	switch (c->result) {
	case ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL: return cmp == 0;
	case ETCDSERVERPB__COMPARE__COMPARE_RESULT__NOT_EQUAL: return cmp != 0;
	case ETCDSERVERPB__COMPARE__COMPARE_RESULT__GREATER: return cmp > 0;
	case ETCDSERVERPB__COMPARE__COMPARE_RESULT__LESS: return cmp < 0;
	default: return 1;
	}
}

/* One Compare against the state before the txn (apply.go applyCompare):
 * every live key of its range must satisfy it; a range with none compares
 * numbers with 0 and fails a VALUE compare. */
static int svc_compare(struct kvd *k, const Etcdserverpb__Compare *c, int *res)
{
	struct mvcc *m = &k->db;
	struct mvcc_it it;
	struct mvcc_key *r;
	struct mvcc_kv kv;
	int eq, any = 0, ok = 1, cmp, by_value = c->target == ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE;
	int64_t have, want = svc_cmp_want(c);
	uint8_t *v;

	it = mvcc_seek(m, c->key.data, c->key.len, &eq);
	if (!c->range_end.len && !eq)
		it.li = m->nleaf;
	for (; ok && (r = mvcc_at(m, it)); mvcc_next(m, &it)) {
		if (c->range_end.len && !svc_in_range(r->key, r->klen, &c->range_end))
			break;
		if (r->flags & MVCC_LIVE) {
			any = 1;
			svc_kv_of(&k->db, r, &kv);
			if (by_value) {
				int have_value = c->target_union_case == ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE;
				if (!(v = kvd_malloc(k, kv.vlen + 1)) || mvcc_pread(m, v, kv.vlen, kv.voff)) {
					kvd_free(k, v);
					return KVD_ENOMEM;
				}
				cmp = mvcc_cmp(v, kv.vlen, have_value ? c->value.data : NULL, have_value ? c->value.len : 0);
				kvd_free(k, v);
			} else {
				have = svc_cmp_have(c, &kv);
				cmp = (have > want) - (have < want);
			}
			ok = svc_cmp_holds(c, cmp);
		}
		if (!c->range_end.len)
			break;
	}
	if (!any) /* a missing key */
		ok = by_value ? 0 : svc_cmp_holds(c, (0 > want) - (0 < want));
	*res = ok;
	return 0;
}

/* compareToPath: the branch taken by this txn and every nested one, in
 * depth-first order, all decided before any op runs. */
struct svc_path {
	uint8_t *b;
	size_t n, cap, at;
};

static int svc_txn_path(struct kvd *k, const Etcdserverpb__TxnRequest *rq, struct svc_path *p)
{
	Etcdserverpb__RequestOp **ops;
	size_t i, n;
	int ok = 1, res;

	for (i = 0; i < rq->n_compare && ok; i++) {
		if (svc_compare(k, rq->compare[i], &res))
			return KVD_ENOMEM;
		ok = res;
	}
	if (UTIL_GROW(k, p->b, p->cap, p->n + 1, 16))
		return KVD_ENOMEM;
	p->b[p->n++] = (uint8_t)ok;
	ops = ok ? rq->success : rq->failure;
	n = ok ? rq->n_success : rq->n_failure;
	for (i = 0; i < n; i++)
		if (ops[i]->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN &&
		    svc_txn_path(k, ops[i]->request_txn, p))
			return KVD_ENOMEM;
	return 0;
}

/* etcd 3.7's checkTxn along the path, one pass in op order (3.4 checked
 * every put, then every range): a range's revision; a put's lease, then the
 * key ignore_* needs.  The first failure fails the whole txn. */
static int svc_txn_precheck(struct kvd *k, const Etcdserverpb__TxnRequest *rq, struct svc_path *p,
                            struct svc_err *e)
{
	Etcdserverpb__RequestOp **ops;
	size_t i, n;
	int ok = p->b[p->at++];

	ops = ok ? rq->success : rq->failure;
	n = ok ? rq->n_success : rq->n_failure;
	for (i = 0; i < n; i++) {
		const Etcdserverpb__RequestOp *op = ops[i];
		if (op->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN) {
			if (svc_txn_precheck(k, op->request_txn, p, e))
				return KVD_EINVAL;
		} else if (op->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT) {
			const Etcdserverpb__PutRequest *pr = op->request_put;
			if (pr->lease && !svc_lease_exists(k, pr->lease))
				return svc_fail(e, GRPC_NOT_FOUND, E_LEASE_NOT_FOUND);
			if ((pr->ignore_value || pr->ignore_lease) && !svc_live(k, &pr->key))
				return svc_fail(e, GRPC_INVALID_ARGUMENT, E_KEY_NOT_FOUND);
		} else if (op->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE) {
			int64_t rev = op->request_range->revision;
			if (rev > k->db.rev)
				return svc_fail(e, GRPC_OUT_OF_RANGE, E_FUTURE_REV);
			if (rev && rev < k->db.compacted)
				return svc_fail(e, GRPC_OUT_OF_RANGE, E_COMPACTED);
		}
	}
	return 0;
}

/* Run the taken branch of rq (and nested txns) into rs. */
static int svc_txn_apply(struct kvd *k, struct svc_pool *pl, struct mvcc_txn *t,
                         const Etcdserverpb__TxnRequest *rq, struct svc_path *p, Etcdserverpb__TxnResponse *rs,
                         struct svc_err *e)
{
	Etcdserverpb__RequestOp **ops;
	Etcdserverpb__ResponseOp *ro;
	size_t i, n;
	int ok = p->b[p->at++];

	etcdserverpb__txn_response__init(rs);
	rs->succeeded = ok;
	/* etcd gives every TxnResponse a header; nested ones stay empty */
	if (!(rs->header = svc_alloc(pl, sizeof *rs->header)))
		return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	etcdserverpb__response_header__init(rs->header);
	ops = ok ? rq->success : rq->failure;
	n = ok ? rq->n_success : rq->n_failure;
	if (!n)
		return 0;
	rs->responses = svc_alloc(pl, n * sizeof *rs->responses);
	ro = svc_alloc(pl, n * sizeof *ro);
	if (!rs->responses || !ro)
		return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	rs->n_responses = n;
	for (i = 0; i < n; i++) {
		const Etcdserverpb__RequestOp *op = ops[i];
		etcdserverpb__response_op__init(&ro[i]);
		rs->responses[i] = &ro[i];
		switch (op->request_case) {
		case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE: {
			Etcdserverpb__RangeResponse *x = svc_alloc(pl, sizeof *x);
			Etcdserverpb__ResponseHeader *h = svc_alloc(pl, sizeof *h);
			ro[i].response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE;
			ro[i].response_range = x;
			if (!x || !h)
				return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			etcdserverpb__range_response__init(x);
			if (svc_range_op(k, pl, t, op->request_range, x, e))
				return KVD_EINVAL;
			etcdserverpb__response_header__init(h); /* inside a txn: revision only */
			h->revision = svc_cur(k, t);
			x->header = h;
			break;
		}
		case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT: {
			Etcdserverpb__PutResponse *x = svc_alloc(pl, sizeof *x);
			ro[i].response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_PUT;
			ro[i].response_put = x;
			if (!x)
				return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			if (svc_put_op(k, pl, t, op->request_put, x, e))
				return KVD_EINVAL;
			break;
		}
		case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE: {
			Etcdserverpb__DeleteRangeResponse *x = svc_alloc(pl, sizeof *x);
			ro[i].response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_DELETE_RANGE;
			ro[i].response_delete_range = x;
			if (!x)
				return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			if (svc_delete_op(k, pl, t, op->request_delete_range, x, e))
				return KVD_EINVAL;
			break;
		}
		case ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN: {
			Etcdserverpb__TxnResponse *x = svc_alloc(pl, sizeof *x);
			ro[i].response_case = ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_TXN;
			ro[i].response_txn = x;
			if (!x)
				return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			if (svc_txn_apply(k, pl, t, op->request_txn, p, x, e))
				return KVD_EINVAL;
			break;
		}
		default:
			break;
		}
	}
	return 0;
}

/* Is every op, in both branches, a Range? (etcd isTxnReadonly) */
static int svc_txn_readonly(const Etcdserverpb__TxnRequest *rq)
{
	size_t i;

	for (i = 0; i < rq->n_success; i++)
		if (rq->success[i]->request_case != ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE)
			return 0;
	for (i = 0; i < rq->n_failure; i++)
		if (rq->failure[i]->request_case != ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE)
			return 0;
	return 1;
}

/* ---- handlers ----------------------------------------------------------- */

/* The store refuses writes after a write error it could not repair. */
/* May this write go on?  cost: the bytes it may add (puts, lease grants),
 * 0 for what frees space (deletes, compaction, revocation, alarms). */
static int svc_writable(struct kvd *k, struct svc_err *e, uint64_t cost)
{
	const char *msg;
	int code;

	if (k->db.broken)
		return svc_fail(e, GRPC_UNAVAILABLE, "kvd: the log is unwritable after an I/O error; restart kvd");
	if (k->db.rev >= INT64_MAX) /* a snapshot can bring it; the next txn would overflow */
		return svc_fail(e, GRPC_OUT_OF_RANGE, E_NO_REVISION);
	if (life_admit(k, cost, &code, &msg))
		return svc_fail(e, code, msg);
	return 0;
}

/* What a put may add to the log (its op and a record of its own). */
static uint64_t svc_put_cost(const Etcdserverpb__PutRequest *p)
{
	return MVCC_REC_HDR + 14 + MVCC_OP_MAX_HDR + (uint64_t)p->key.len + p->value.len;
}

/* A txn's cost, as etcd's quota counts it: the dearer branch's puts (kvd
 * counts nested txns' too). */
static uint64_t svc_txn_cost(const Etcdserverpb__TxnRequest *rq)
{
	uint64_t c[2] = {0, 0};
	size_t i, b;

	for (b = 0; b < 2; b++)
		for (i = 0; i < (b ? rq->n_failure : rq->n_success); i++) {
			const Etcdserverpb__RequestOp *op = b ? rq->failure[i] : rq->success[i];
			if (op->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT)
				c[b] += svc_put_cost(op->request_put);
			else if (op->request_case == ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN)
				c[b] += svc_txn_cost(op->request_txn);
		}
	return KVD_MAX(c[0], c[1]);
}

/* End a unary KV call: the reply, or the error in e. */
static void svc_end(struct kvd *k, struct call *s, const ProtobufCMessage *m, const struct svc_err *e)
{
	if (e->msg)
		call_finish(k, s, e->code, "%s", e->msg);
	else
		call_reply(k, s, m);
}

static void svc_range_rpc(struct kvd *k, struct call *s)
{
	const Etcdserverpb__RangeRequest *rq = (const void *)s->rq;
	Etcdserverpb__RangeResponse rs = ETCDSERVERPB__RANGE_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	struct auth_who who;

	if (svc_range_check(rq, &e))
		;
	else if (auth_who(k, s, &who, &e) || auth_may(k, &who, &rq->key, &rq->range_end, AUTH_R, &e))
		;
	else if (!svc_range_op(k, &pl, NULL, rq, &rs, &e)) {
		svc_header(k, &h, 1);
		rs.header = &h;
	}
	svc_end(k, s, &rs.base, &e);
	svc_pool_free(&pl);
}

/* Put (del 0) or DeleteRange (del 1) in a write txn of its own.  0 when
 * applied (rs then holds the op's answer); else the error is in *e. */
static int svc_write1(struct kvd *k, struct call *s, struct svc_pool *pl, const void *rq, void *rs, int del,
                      struct svc_err *e)
{
	struct mvcc_txn t;

	if (svc_writable(k, e, del ? 0 : svc_put_cost(rq)))
		return KVD_EINVAL;
	if (mvcc_txn_begin(k, &t)) {
		svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return KVD_EINVAL;
	}
	if (del ? svc_delete_op(k, pl, &t, rq, rs, e) : svc_put_op(k, pl, &t, rq, rs, e))
		mvcc_txn_abort(k, &t);
	s->wrote = !e->msg && t.nops > 0; /* a delete that matched nothing wrote nothing */
	mvcc_txn_end(k, &t);
	return e->msg ? -1 : 0;
}

static void svc_put_rpc(struct kvd *k, struct call *s)
{
	const Etcdserverpb__PutRequest *rq = (const void *)s->rq;
	Etcdserverpb__PutResponse rs;
	Etcdserverpb__ResponseHeader h;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	struct auth_who who;

	etcdserverpb__put_response__init(&rs);
	if (!rq->key.len)
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_EMPTY_KEY);
	else if (rq->ignore_value && rq->value.len)
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_VALUE_PROVIDED);
	else if (rq->ignore_lease && rq->lease)
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_LEASE_PROVIDED);
	else if (auth_who(k, s, &who, &e))
		;
	else if (svc_too_large(k, s->raw.n))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
	else if (auth_may(k, &who, &rq->key, NULL, AUTH_W, &e) || auth_lease_keys(k, &who, rq->lease, AUTH_W, &e) ||
	         (rq->prev_kv && auth_may(k, &who, &rq->key, NULL, AUTH_R, &e)))
		;
	else if (rq->lease && !svc_lease_exists(k, rq->lease))
		svc_fail(&e, GRPC_NOT_FOUND, E_LEASE_NOT_FOUND);
	else if (!svc_write1(k, s, &pl, rq, &rs, 0, &e)) {
		svc_header(k, &h, 1);
		h.revision = rs.header->revision;
		rs.header = &h;
	}
	svc_end(k, s, &rs.base, &e);
	svc_pool_free(&pl);
}

static void svc_delete_rpc(struct kvd *k, struct call *s)
{
	const Etcdserverpb__DeleteRangeRequest *rq = (const void *)s->rq;
	Etcdserverpb__DeleteRangeResponse rs;
	Etcdserverpb__ResponseHeader h;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	struct auth_who who;

	etcdserverpb__delete_range_response__init(&rs);
	if (!rq->key.len)
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_EMPTY_KEY);
	else if (auth_who(k, s, &who, &e))
		;
	else if (svc_too_large(k, s->raw.n))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
	else if (auth_may(k, &who, &rq->key, &rq->range_end, AUTH_W, &e) ||
	         (rq->prev_kv && auth_may(k, &who, &rq->key, &rq->range_end, AUTH_R, &e)))
		;
	else if (!svc_write1(k, s, &pl, rq, &rs, 1, &e)) {
		svc_header(k, &h, 1);
		h.revision = rs.header->revision;
		rs.header = &h;
	}
	svc_end(k, s, &rs.base, &e);
	svc_pool_free(&pl);
}

/*
 * A Txn as etcd checks and applies it, as call s's caller (auth): for the
 * Txn RPC and for kvd's own recipes (Lock, Election), which etcd runs as
 * clients of itself.  raw: the request's size on the wire.  rs and h are
 * filled (their memory from pl); 0, or KVD_EINVAL with e set.
 */
static int svc_txn_do(struct kvd *k, struct call *s, const Etcdserverpb__TxnRequest *rq, size_t raw,
                      struct svc_pool *pl, Etcdserverpb__TxnResponse *rs, Etcdserverpb__ResponseHeader *h,
                      struct svc_err *e)
{
	struct svc_ivs iv;
	struct svc_path path = {NULL, 0, 0, 0};
	struct mvcc_txn t;
	struct auth_who who;
	int ro;

	etcdserverpb__txn_response__init(rs);
	svc_header(k, h, 1);
	ro = svc_txn_readonly(rq);
	/* v3rpc checks, then etcd's apply: compares, put checks, range checks */
	if (svc_txn_check(rq, (long)k->cfg.max_txn_ops, 0, e))
		goto out;
	if (svc_intervals(k, rq->success, rq->n_success, &iv, e))
		goto out;
	svc_ivs_free(k, &iv);
	if (svc_intervals(k, rq->failure, rq->n_failure, &iv, e))
		goto out;
	svc_ivs_free(k, &iv);
	if (auth_who(k, s, &who, e))
		goto out;
	if (!ro && svc_too_large(k, raw)) {
		svc_fail(e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
		goto out;
	}
	if (auth_txn(k, &who, rq, e))
		goto out;
	if (svc_txn_path(k, rq, &path)) {
		svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		goto out;
	}
	if (svc_txn_precheck(k, rq, &path, e))
		goto out;
	path.at = 0;
	if (ro) {
		if (!svc_txn_apply(k, pl, NULL, rq, &path, rs, e))
			svc_header(k, h, 1);
	} else if (!svc_writable(k, e, svc_txn_cost(rq))) {
		if (mvcc_txn_begin(k, &t)) {
			svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			goto out;
		}
		if (svc_txn_apply(k, pl, &t, rq, &path, rs, e))
			mvcc_txn_abort(k, &t);
		svc_header(k, h, 1);
		h->revision = svc_cur(k, &t);
		s->wrote |= t.nops > 0;
		mvcc_txn_end(k, &t);
	}
	rs->header = h;
out:
	kvd_free(k, path.b);
	return e->msg ? KVD_EINVAL : 0;
}

static void svc_txn_rpc(struct kvd *k, struct call *s)
{
	Etcdserverpb__TxnResponse rs;
	Etcdserverpb__ResponseHeader h;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};

	svc_txn_do(k, s, (const void *)s->rq, s->raw.n, &pl, &rs, &h, &e);
	svc_end(k, s, &rs.base, &e);
	svc_pool_free(&pl);
}

static void svc_compact_rpc(struct kvd *k, struct call *s)
{
	const Etcdserverpb__CompactionRequest *rq = (const void *)s->rq;
	Etcdserverpb__CompactionResponse rs = ETCDSERVERPB__COMPACTION_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_err e = {0, NULL};

	if (auth_root(k, s, &e)) /* etcd 3.7: root only */
		;
	else if (svc_too_large(k, s->raw.n))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
	else if (rq->revision <= k->db.compacted)
		svc_fail(&e, GRPC_OUT_OF_RANGE, E_COMPACTED);
	else if (rq->revision > k->db.rev)
		svc_fail(&e, GRPC_OUT_OF_RANGE, E_FUTURE_REV);
	else if (!svc_writable(k, &e, 0) && mvcc_compact(k, rq->revision))
		svc_fail(&e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	if (!e.msg) {
		/* physical or not, the answer leaves once the compaction is durable */
		svc_header(k, &h, 1);
		rs.header = &h;
		s->wrote = 1;
	}
	svc_end(k, s, &rs.base, &e);
}

/* ---- RangeStream: chunks produced as the client's window opens ---------- */

#define SVC_CHUNK_BYTES (64 * 1024)
#define SVC_CHUNK_KEYS 1000

struct svc_rstream {
	Etcdserverpb__RangeRequest *rq; /* owned */
	int64_t rev;                     /* pinned */
	int64_t hrev;                    /* the store's (durable) revision at the start: the final header's */
	uint8_t *last;                   /* last key sent (owned), NULL before the first */
	size_t lastn;
	int64_t sent, count;
	unsigned counted : 1;
};

static void svc_rstream_close(struct kvd *k, struct call *s)
{
	struct svc_rstream *st = s->svc;

	if (!st)
		return;
	pb_free(k, st->rq);
	kvd_free(k, st->last);
	kvd_free(k, st);
	s->svc = NULL;
}

static void svc_rstream_chunk(struct kvd *k, struct call *s)
{
	struct svc_rstream *st = s->svc;
	Etcdserverpb__RangeRequest *rq = st->rq;
	Etcdserverpb__RangeStreamResponse msg = ETCDSERVERPB__RANGE_STREAM_RESPONSE__INIT;
	Etcdserverpb__RangeResponse rr = ETCDSERVERPB__RANGE_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct mvcc *m = &k->db;
	struct svc_range got = {0};
	struct svc_pool pl = {k, NULL, 0};
	struct mvcc_it it;
	struct mvcc_key *r;
	struct mvcc_kv kv;
	size_t bytes = 0;
	int eq, vis, done = 0;
	int64_t left = rq->limit > 0 ? rq->limit - st->sent : INT64_MAX;

	if (st->rev < m->compacted) {
		call_finish(k, s, GRPC_OUT_OF_RANGE, "%s", E_COMPACTED);
		return;
	}
	if (st->last)
		it = mvcc_seek(m, st->last, st->lastn, &eq);
	else
		it = mvcc_seek(m, rq->key.data, rq->key.len, &eq);
	if (st->last && eq)
		mvcc_next(m, &it);
	for (;;) {
		r = mvcc_at(m, it);
		if (!r || (!rq->range_end.len ? mvcc_cmp(r->key, r->klen, rq->key.data, rq->key.len) != 0
		                              : !svc_in_range(r->key, r->klen, &rq->range_end))) {
			done = 1;
			break;
		}
		vis = mvcc_visible(m, r, st->rev >= m->rev ? 0 : st->rev, &kv);
		if (vis < 0) {
			call_finish(k, s, GRPC_DATA_LOSS, "kvd: cannot read the log");
			goto out;
		}
		if (vis) {
			if (left <= 0 || rq->count_only) {
				st->count++; /* past the limit: only counted */
			} else {
				if (got.n >= SVC_CHUNK_KEYS || bytes >= SVC_CHUNK_BYTES)
					break;
				if (svc_range_push(k, &got, &kv)) {
					call_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
					goto out;
				}
				bytes += r->klen + (rq->keys_only ? 0 : kv.vlen) + 32;
				st->count++;
				left--;
			}
		}
		if (!rq->range_end.len) {
			done = 1;
			break;
		}
		mvcc_next(m, &it);
	}
	if (got.n) {
		const struct mvcc_key *lk = got.kv[got.n - 1].r;
		uint8_t *nl = kvd_realloc(k, st->last, lk->klen ? lk->klen : 1);
		if (!nl || svc_kvs(k, &pl, got.kv, got.n, svc_keys_only(rq), &rr.kvs)) {
			if (nl)
				st->last = nl;
			call_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			goto out;
		}
		st->last = nl;
		memcpy(st->last, lk->key, lk->klen);
		st->lastn = lk->klen;
		rr.n_kvs = got.n;
		st->sent += (int64_t)got.n;
	}
	if (done) {
		svc_header(k, &h, 0);
		h.revision = st->hrev; /* as etcd: when the stream started, never a later write's */
		rr.header = &h;
		rr.count = st->count;
		rr.more = !rq->count_only && rq->limit > 0 && st->count > rq->limit;
	}
	if (got.n || done) {
		msg.range_response = &rr;
		if (call_send(k, s, &msg.base))
			goto out;
	}
	if (done)
		call_finish(k, s, GRPC_OK, "%s", "");
out:
	kvd_free(k, got.kv);
	svc_pool_free(&pl);
}

static void svc_rangestream_rpc(struct kvd *k, struct call *s)
{
	const Etcdserverpb__RangeRequest *rq = (const void *)s->rq;
	struct svc_rstream *st;
	struct svc_err e = {0, NULL};
	struct auth_who who;
	int64_t rev;

	rev = rq->revision;
	if (svc_range_check(rq, &e))
		call_finish(k, s, e.code, "%s", e.msg);
	else if (rq->sort_order != SORT_NONE && !(rq->sort_target == SORT_BY_KEY && rq->sort_order == SORT_ASCEND))
		call_finish(k, s, GRPC_UNIMPLEMENTED, "RangeStream does not support custom sort orders");
	else if (rq->min_mod_revision || rq->max_mod_revision || rq->min_create_revision || rq->max_create_revision)
		call_finish(k, s, GRPC_UNIMPLEMENTED, "RangeStream does not support revision filters");
	else if (auth_who(k, s, &who, &e) || auth_may(k, &who, &rq->key, &rq->range_end, AUTH_R, &e))
		call_finish(k, s, e.code, "%s", e.msg);
	else if (rev > k->db.rev)
		call_finish(k, s, GRPC_OUT_OF_RANGE, "%s", E_FUTURE_REV);
	else if (rev > 0 && rev < k->db.compacted)
		call_finish(k, s, GRPC_OUT_OF_RANGE, "%s", E_COMPACTED);
	else if (!(st = kvd_calloc(k, sizeof *st)))
		call_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	else {
		/* pin the newest durable revision: a chunk never shows a write a crash could undo */
		st->rq = (Etcdserverpb__RangeRequest *)s->rq; /* kept: see on_msg */
		s->rq = NULL;
		st->rev = rev > 0 ? rev : k->db.rev_durable;
		st->hrev = k->db.rev_durable;
		s->svc = st;
		s->produce = 1;
		return; /* chunks come from svc_rstream_chunk as the window opens */
	}
}

/* ===== 22. Services: Lease (svc_lease_) ================================== */

/*
 * The Lease service: Grant, Revoke, KeepAlive, TimeToLive and Leases, on
 * the lease table (section 11), answered as etcd 3.7's lessor and v3rpc
 * answer them.  A grant and a revoke are writes, one txn each, whose reply
 * waits for the group commit; a renewal only moves a deadline in RAM
 * (renewals are not logged, section 11), so KeepAlive answers at once.
 * Permission is etcd 3.7's: a user for every RPC, and write (renew, revoke)
 * or read (the key names) on each key the lease holds (auth_lease_keys).
 *
 * Invariants:
 *   1. No answer shows a lease past its deadline: a lookup by id goes
 *      through svc_lease_live, which expires such a lease then and there
 *      (lease_expire), before the timer wheel reaches it.
 *   2. A grant or a revoke passes svc_writable, then runs in a txn of its
 *      own (svc_lease_write), a failure aborting it; s->wrote makes its
 *      answer wait for durability.
 *   3. etcd's answers for an unknown lease: KeepAlive TTL 0 and no error,
 *      TimeToLive TTL -1, Revoke NOT_FOUND; a TTL below the minimum is
 *      raised to it (k->lease.min_ttl), 0 and negative ones too.
 *   4. Lists come sorted as etcd sorts them: keys by name (lease_key_cmp),
 *      leases by expiry, then id (svc_lease_cmp); they live in the call's
 *      svc_pool and point into the table until svc_end packed them.
 */

/* Lease id if it is alive; one whose deadline passed is revoked now (the
 * wheel may not have reached it yet), as etcd answers for an expired one. */
static struct lease *svc_lease_live(struct kvd *k, int64_t id)
{
	struct lease *l = id ? lease_find(k, id) : NULL;

	if (l && l->deadline <= k->now) {
		lease_expire(k, l);
		return NULL;
	}
	return l;
}

/* A grant (l NULL) or the revoke of l, in a txn of its own. */
static void svc_lease_write(struct kvd *k, struct svc_err *e, struct lease *l, int64_t id, int64_t ttl)
{
	struct mvcc_txn t;

	if (mvcc_txn_begin(k, &t)) {
		svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return;
	}
	if (l ? lease_revoke(k, &t, l) : lease_grant(k, &t, id, ttl)) {
		mvcc_txn_abort(k, &t);
		svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	}
	mvcc_txn_end(k, &t);
}

static void svc_lease_grant_rpc(struct kvd *k, struct call *s)
{
	const Etcdserverpb__LeaseGrantRequest *rq = (const void *)s->rq;
	Etcdserverpb__LeaseGrantResponse rs = ETCDSERVERPB__LEASE_GRANT_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_err e = {0, NULL};
	struct auth_who who;
	int64_t id, ttl;

	id = rq->id;
	ttl = KVD_MAX(rq->ttl, k->lease.min_ttl); /* 0 and negative too, as etcd */
	if (auth_need_user(k, s, &who, &e)) /* a user; no permission (etcd 3.7) */
		;
	else if (svc_too_large(k, s->raw.n))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
	else if (rq->ttl > LEASE_MAX_TTL)
		svc_fail(&e, GRPC_OUT_OF_RANGE, E_LEASE_TTL);
	else if (id && lease_find(k, id))
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_LEASE_EXISTS);
	else if (!svc_writable(k, &e, MVCC_REC_HDR + 14 + MVCC_LEASE_OP_MAX))
		svc_lease_write(k, &e, NULL, id ? id : (id = lease_next_id(k)), ttl);
	if (!e.msg) { /* the answer leaves once the grant is durable */
		svc_header(k, &h, 1);
		rs.header = &h;
		rs.id = id;
		rs.ttl = ttl;
		s->wrote = 1;
	}
	svc_end(k, s, &rs.base, &e);
}

static void svc_lease_revoke_rpc(struct kvd *k, struct call *s)
{
	const Etcdserverpb__LeaseRevokeRequest *rq = (const void *)s->rq;
	Etcdserverpb__LeaseRevokeResponse rs = ETCDSERVERPB__LEASE_REVOKE_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_err e = {0, NULL};
	struct lease *l;
	struct auth_who who;

	if (auth_need_user(k, s, &who, &e))
		;
	else if (svc_too_large(k, s->raw.n))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
	else if (auth_lease_keys(k, &who, rq->id, AUTH_W, &e)) /* revoking deletes them */
		;
	else if (!(l = svc_lease_live(k, rq->id)))
		svc_fail(&e, GRPC_NOT_FOUND, E_LEASE_NOT_FOUND);
	else if (!svc_writable(k, &e, 0))
		svc_lease_write(k, &e, l, 0, 0);
	if (!e.msg) {
		svc_header(k, &h, 1); /* the revision that deleted its keys, if it had any */
		rs.header = &h;
		s->wrote = 1;
	}
	svc_end(k, s, &rs.base, &e);
}

/* LeaseKeepAlive: one answer per request; an unknown lease gets TTL 0 and
 * no error, as etcd.  Renewals are not logged (see section 11).  With auth
 * on (etcd 3.7's checkLeaseRenew) a user renews only leases whose keys it
 * may write; a refusal ends the stream with its error. */
static void svc_lease_keepalive_msg(struct kvd *k, struct call *s)
{
	const Etcdserverpb__LeaseKeepAliveRequest *rq = (const void *)s->rq;
	Etcdserverpb__LeaseKeepAliveResponse rs = ETCDSERVERPB__LEASE_KEEP_ALIVE_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_err e = {0, NULL};
	struct auth_who who;
	struct lease *l;

	if (auth_need_user(k, s, &who, &e) || auth_lease_keys(k, &who, rq->id, AUTH_W, &e)) {
		call_finish(k, s, e.code, "%s", e.msg);
		return;
	}

	svc_header(k, &h, 1); /* filled before the renewal, as etcd */
	rs.header = &h;
	rs.id = rq->id;
	if ((l = svc_lease_live(k, rq->id))) {
		lease_renew(k, l);
		rs.ttl = l->ttl;
	}
	call_send(k, s, &rs.base);
}

static void svc_lease_keepalive_end(struct kvd *k, struct call *s)
{
	call_finish(k, s, GRPC_OK, "%s", "");
}

static void svc_lease_ttl_rpc(struct kvd *k, struct call *s)
{
	const Etcdserverpb__LeaseTimeToLiveRequest *rq = (const void *)s->rq;
	Etcdserverpb__LeaseTimeToLiveResponse rs = ETCDSERVERPB__LEASE_TIME_TO_LIVE_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	struct mvcc_key **v;
	struct lease *l;
	struct auth_who who;
	uint32_t i, nk = 0;

	svc_header(k, &h, 1);
	rs.header = &h;
	rs.id = rq->id;
	rs.ttl = -1; /* unknown: TTL -1, granted 0, no error */
	if (auth_need_user(k, s, &who, &e)) {
		; /* etcd 3.7: a user; key names need read on each */
	} else if (svc_too_large(k, s->raw.n)) {
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
	} else if (rq->keys && auth_lease_keys(k, &who, rq->id, AUTH_R, &e)) {
		;
	} else if ((l = svc_lease_live(k, rq->id))) {
		rs.ttl = (l->deadline - k->now) / 1000; /* whole seconds left, truncated as etcd */
		rs.grantedttl = l->ttl;
		if (rq->keys && l->nkeys) {
			v = svc_alloc(&pl, l->nkeys * sizeof *v);
			rs.keys = svc_alloc(&pl, l->nkeys * sizeof *rs.keys);
			if (!v || !rs.keys) {
				svc_fail(&e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			} else {
				for (i = 0; i <= l->kmask; i++)
					if (l->keys[i])
						v[nk++] = l->keys[i];
				qsort(v, nk, sizeof *v, lease_key_cmp);
				for (i = 0; i < nk; i++) {
					rs.keys[i].data = v[i]->key;
					rs.keys[i].len = v[i]->klen;
				}
				rs.n_keys = nk;
			}
		}
	}
	svc_end(k, s, &rs.base, &e);
	svc_pool_free(&pl);
}

static int svc_lease_cmp(const void *a, const void *b)
{
	const struct lease *x = *(const struct lease *const *)a, *y = *(const struct lease *const *)b;

	if (x->deadline != y->deadline)
		return x->deadline < y->deadline ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

/* LeaseLeases: every lease, soonest expiry first (etcd's leasesByExpiry). */
static void svc_lease_leases_rpc(struct kvd *k, struct call *s)
{
	Etcdserverpb__LeaseLeasesResponse rs = ETCDSERVERPB__LEASE_LEASES_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	struct lease_reg *g = &k->lease;
	struct lease **v, *l;
	Etcdserverpb__LeaseStatus *st;
	struct auth_who who;
	size_t i, nl = 0;

	svc_header(k, &h, 1);
	rs.header = &h;
	if (auth_need_user(k, s, &who, &e)) /* etcd 3.7: a user, who may read every leased key */
		;
	else if (k->auth.enabled && auth_admin(k, &who, &e))
		for (e.msg = NULL, i = 0; g->n && i <= g->mask && !e.msg; i++)
			for (l = g->tab[i]; l && !auth_lease_keys(k, &who, l->id, AUTH_R, &e); l = l->hnext)
				;
	if (!e.msg && g->n) {
		v = svc_alloc(&pl, g->n * sizeof *v);
		st = svc_alloc(&pl, g->n * sizeof *st);
		rs.leases = svc_alloc(&pl, g->n * sizeof *rs.leases);
		if (!v || !st || !rs.leases) {
			svc_fail(&e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		} else {
			for (i = 0; i <= g->mask; i++)
				for (l = g->tab[i]; l; l = l->hnext)
					v[nl++] = l;
			qsort(v, nl, sizeof *v, svc_lease_cmp);
			for (i = 0; i < nl; i++) {
				etcdserverpb__lease_status__init(&st[i]);
				st[i].id = v[i]->id;
				rs.leases[i] = &st[i];
			}
			rs.n_leases = nl;
		}
	}
	svc_end(k, s, &rs.base, &e);
	svc_pool_free(&pl);
}

/* ===== 23. Services: Auth (svc_auth_, auth_) ============================= */

/*
 * The Auth service: AuthEnable .. RoleRevokePermission and Authenticate,
 * answered as etcd 3.7 answers, error texts included.  Each change (enable,
 * disable; a user's or a role's add, delete, grant, revoke; a password) is
 * a write of the auth store (section 12) through the log, one AUTH record
 * (section 9); AuthStatus, the Gets and the Lists only read it, and
 * Authenticate issues a token (section 19) without writing.  Authenticate,
 * UserAdd and UserChangePassword hash a password off the handlers' path
 * (section 19); the call waits for it.  The auth state's setup and
 * teardown (auth_init, auth_free) end the section.
 *
 * Invariants:
 *   1. A change is one AUTH record, applied in RAM as it is appended:
 *      auth_begin (svc_writable, an auth revision left, auth_rec_begin),
 *      then auth_end, which seals it or, on a failure, takes back the
 *      record and every op it applied (auth_rec_end, auth_undo_to).
 *      auth_begin sets s->wrote: the answer waits for durability.
 *   2. Checks run in etcd's order: who is calling (auth_who), root
 *      (auth_admin, auth_root), then the request, then the store -- an
 *      empty name before an existing one (svc_auth_user_add).
 *   3. No bcrypt runs in a handler: it queues a job (auth_hash_start) and
 *      returns; the loop calls it again with the hash (auth_hashed).
 *      Authenticate hashes again when the users changed meanwhile (j->rev
 *      != k->auth.rev) and compares in constant time (auth_ct_diff).
 *   4. Tokens die with what they stood for: a user's when it is deleted or
 *      its password changes, every one when auth is disabled
 *      (auth_tok_drop).
 *   5. Stored lists keep etcd's order: a user's roles sorted
 *      (auth_roles_with), a role's permissions by key with Go's sort
 *      (svc_gosort_ptrs, auth_perm_less).  While auth is on, neither the
 *      root user nor the root role can be deleted, nor root's role revoked
 *      (E_INVALID_AUTH_MGMT).
 *
 * Left out (KVD_NO_AUTH): no handler here; the service is unknown
 * (section 28), and the state is only what a store without auth reports
 * (auth revision 1, off).
 */

#ifndef KVD_NO_AUTH
/* One change as one AUTH record: begun, ops added, sealed with the
 * revision bumped (bump) or not.  Each returns 0 or fills *e. */
static int auth_begin(struct kvd *k, struct call *s, struct auth_rec *r, struct svc_err *e)
{
	if (svc_writable(k, e, 0))
		return KVD_EINVAL;
	if (k->auth.rev >= INT64_MAX) /* the AUTH record holds it as a signed 64-bit number */
		return svc_fail(e, GRPC_OUT_OF_RANGE, "kvd: auth: no auth revision left");
	if (auth_rec_begin(k, r))
		return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	s->wrote = 1;
	return 0;
}

static int auth_end(struct kvd *k, struct auth_rec *r, int failed, int bump, struct svc_err *e)
{
	if (failed) {
		auth_rec_end(k, r, 1);
		return svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	}
	k->auth.rev += (uint64_t)bump;
	auth_rec_end(k, r, 0);
	return 0;
}

/* A header, the answer or the error: how every Auth RPC ends. */
static void auth_answer(struct kvd *k, struct call *s, ProtobufCMessage *rs, Etcdserverpb__ResponseHeader **hp,
                        struct svc_err *e)
{
	Etcdserverpb__ResponseHeader h;

	svc_header(k, &h, 1);
	*hp = &h;
	svc_end(k, s, rs, e);
}

static void svc_auth_enable(struct kvd *k, struct call *s)
{
	Etcdserverpb__AuthEnableResponse rs = ETCDSERVERPB__AUTH_ENABLE_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	const Authpb__User *u;
	struct auth_rec r;
	struct auth_who who;

	if (!auth_who(k, s, &who, &e) && !auth_admin(k, &who, &e) && !k->auth.enabled) {
		if (!(u = auth_user(k, AUTH_ROOT)))
			svc_fail(&e, GRPC_FAILED_PRECONDITION, E_ROOT_NOT_EXIST);
		else if (!auth_has_role(u, AUTH_ROOT))
			svc_fail(&e, GRPC_FAILED_PRECONDITION, E_ROOT_NO_ROLE);
		else if (!auth_begin(k, s, &r, &e)) {
			k->auth.enabled = 1;
			auth_end(k, &r, 0, 0, &e);
			kvd_log(k, KVD_LOG_INFO, "auth enabled");
		}
	}
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static void svc_auth_disable(struct kvd *k, struct call *s)
{
	Etcdserverpb__AuthDisableResponse rs = ETCDSERVERPB__AUTH_DISABLE_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	struct auth_rec r;
	struct auth_who who;

	if (!auth_who(k, s, &who, &e) && !auth_admin(k, &who, &e) && k->auth.enabled && !auth_begin(k, s, &r, &e)) {
		k->auth.enabled = 0;
		auth_end(k, &r, 0, 1, &e);
		auth_tok_drop(k, NULL);
		kvd_log(k, KVD_LOG_INFO, "auth disabled");
	}
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

/* AuthStatus: etcd 3.7 answers anyone (3.5 and 3.6: root), but a token
 * sent must be live, as for every request etcd proposes. */
static void svc_auth_status(struct kvd *k, struct call *s)
{
	Etcdserverpb__AuthStatusResponse rs = ETCDSERVERPB__AUTH_STATUS_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	struct auth_who who;

	if (auth_who(k, s, &who, &e)) {
		call_finish(k, s, e.code, "%s", e.msg);
		return;
	}
	rs.enabled = k->auth.enabled;
	rs.authrevision = k->auth.rev;
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static void svc_auth_authenticate(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthenticateRequest *rq = auth_rq(s);
	Etcdserverpb__AuthenticateResponse rs = ETCDSERVERPB__AUTHENTICATE_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	const struct auth_job *j = s->svc;
	const Authpb__User *u;
	const char *hash = auth_hashed(s);
	struct kvd_slice nm = pb_str(rq->name);
	char tok[2048];
	uint8_t salt[16];
	unsigned cost;
	int r;

	if (!k->auth.enabled)
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_AUTH_NOT_ENABLED);
	else if (!(u = auth_user_n(k, (const char *)nm.p, nm.n))) /* whole: "root\0x" is nobody */
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_AUTH_FAILED);
	else if (u->options && u->options->no_password) /* the auth package's error, unconverted (etcd) */
		svc_fail(&e, GRPC_UNKNOWN, "auth: authentication failed, password was given for no password user");
	else if (auth_bcrypt_parse(u->password.data, u->password.len, &cost, salt))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_AUTH_FAILED);
	else if (!hash || j->rev != k->auth.rev) { /* not hashed yet, or the users changed meanwhile */
		if (!auth_hash_start(k, s, pb_str(rq->password), salt, cost, &e))
			return;
	} else {
		if (auth_ct_diff(hash + 29, u->password.data + 29, 31)) /* the 31 hash characters */
			svc_fail(&e, GRPC_INVALID_ARGUMENT, E_AUTH_FAILED);
#ifndef KVD_NO_JWT
		else if (k->auth.jwt && !k->auth.jwt->priv)
			svc_fail(&e, GRPC_UNKNOWN, "auth: token signing attempted with verify-only key");
		else if ((r = k->auth.jwt ? auth_jwt_issue(k, rq->name, tok, sizeof tok)
		                          : auth_tok_new(k, rq->name, tok, sizeof tok)))
#else
		else if ((r = auth_tok_new(k, rq->name, tok, sizeof tok)))
#endif
			svc_fail(&e, r == KVD_ELIMIT ? GRPC_RESOURCE_EXHAUSTED : GRPC_UNAVAILABLE,
			         r == KVD_ELIMIT ? E_TOO_MANY_REQUESTS : "kvd: cannot make a token");
		else
			rs.token = tok;
	}
	if (e.msg)
		k->auth.failures++;
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

/* A user as etcd stores it, with its roles and hash (borrowed). */
static void auth_user_msg(Authpb__User *nu, Authpb__UserAddOptions *opt, const Authpb__User *u, const char *name,
                          const char *hash, char **roles, size_t nroles)
{
	authpb__user__init(nu);
	nu->name.data = (uint8_t *)name;
	nu->name.len = strlen(name);
	if (hash) {
		nu->password.data = (uint8_t *)hash;
		nu->password.len = strlen(hash);
	} else if (u) {
		nu->password = u->password;
	}
	nu->roles = roles;
	nu->n_roles = nroles;
	if (u && u->options) {
		authpb__user_add_options__init(opt);
		opt->no_password = u->options->no_password;
		nu->options = opt;
	}
}

static void svc_auth_user_add(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthUserAddRequest *rq = auth_rq(s);
	Etcdserverpb__AuthUserAddResponse rs = ETCDSERVERPB__AUTH_USER_ADD_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	const char *hash = auth_hashed(s);
	struct auth_who who;
	int nopw = rq->options && rq->options->no_password;
	Authpb__UserAddOptions opt = AUTHPB__USER_ADD_OPTIONS__INIT;
	Authpb__User nu;
	struct auth_rec r;

	if (auth_who(k, s, &who, &e) || auth_admin(k, &who, &e))
		;
	else if (!pb_str(rq->name).n)
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_USER_EMPTY);
	else if (pb_str_nul(rq->name)) /* etcd takes it; kvd keeps no such name (section 5, invariant 5) */
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_NAME_NUL);
	else if (auth_user(k, rq->name))
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_USER_EXISTS);
	else if (!nopw && !hash) {
		if (!auth_hash_start(k, s, pb_str(rq->password), NULL, k->cfg.bcrypt_cost, &e))
			return;
	} else if (!auth_begin(k, s, &r, &e)) {
		auth_user_msg(&nu, &opt, NULL, rq->name, nopw ? NULL : hash, NULL, 0);
		opt.no_password = nopw;
		nu.options = &opt; /* etcd stores the options, false or not */
		auth_end(k, &r, auth_rec_op(k, &r, AUTH_OP_USER, &nu.base, NULL), 1, &e);
	}
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static void svc_auth_user_get(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthUserGetRequest *rq = (const void *)s->rq;
	Etcdserverpb__AuthUserGetResponse rs = ETCDSERVERPB__AUTH_USER_GET_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	const Authpb__User *u;
	struct auth_who who;
	struct kvd_slice nm = pb_str(rq->name);

	if (auth_who(k, s, &who, &e))
		;
	else if (!(who.nlen == nm.n && !memcmp(who.name ? who.name : "", nm.p, nm.n)) && auth_admin(k, &who, &e))
		; /* oneself (even "", as etcd), or root */
	else if (!(u = auth_user_n(k, (const char *)nm.p, nm.n)))
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_USER_NOT_FOUND);
	else {
		rs.roles = u->roles;
		rs.n_roles = u->n_roles;
	}
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static void svc_auth_list(struct kvd *k, struct call *s, int roles)
{
	Etcdserverpb__AuthUserListResponse us = ETCDSERVERPB__AUTH_USER_LIST_RESPONSE__INIT;
	Etcdserverpb__AuthRoleListResponse rs = ETCDSERVERPB__AUTH_ROLE_LIST_RESPONSE__INIT;
	const struct auth_tab *t = roles ? &k->auth.roles : &k->auth.users;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	char **names = NULL;
	struct auth_who who;
	size_t i;

	if (!auth_who(k, s, &who, &e) && !auth_admin(k, &who, &e) && t->n &&
	    !(names = svc_alloc(&pl, t->n * sizeof *names)))
		svc_fail(&e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	for (i = 0; names && i < t->n; i++) { /* names are bytes in authpb: NUL-ended copies */
		ProtobufCBinaryData *nm = auth_name(t->v[i]);
		if (!(names[i] = svc_alloc(&pl, nm->len + 1))) {
			svc_fail(&e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			break;
		}
		memcpy(names[i], nm->data, nm->len);
		names[i][nm->len] = 0;
	}
	if (roles) {
		rs.roles = names;
		rs.n_roles = names ? t->n : 0;
		auth_answer(k, s, &rs.base, &rs.header, &e);
	} else {
		us.users = names;
		us.n_users = names ? t->n : 0;
		auth_answer(k, s, &us.base, &us.header, &e);
	}
	svc_pool_free(&pl);
}

static void svc_auth_user_list(struct kvd *k, struct call *s) { svc_auth_list(k, s, 0); }
static void svc_auth_role_list(struct kvd *k, struct call *s) { svc_auth_list(k, s, 1); }

static void svc_auth_user_delete(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthUserDeleteRequest *rq = (const void *)s->rq;
	Etcdserverpb__AuthUserDeleteResponse rs = ETCDSERVERPB__AUTH_USER_DELETE_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	struct auth_rec r;
	struct auth_who who;
	struct kvd_slice nm = pb_str(rq->name);

	if (auth_who(k, s, &who, &e) || auth_admin(k, &who, &e))
		;
	else if (k->auth.enabled && auth_is_root(nm))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_INVALID_AUTH_MGMT);
	else if (!auth_user_n(k, (const char *)nm.p, nm.n)) /* found: rq->name holds no NUL */
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_USER_NOT_FOUND);
	else if (!auth_begin(k, s, &r, &e) &&
	         !auth_end(k, &r, auth_rec_op(k, &r, AUTH_OP_USER_DEL, NULL, rq->name), 1, &e))
		auth_tok_drop(k, rq->name);
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static void svc_auth_user_passwd(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthUserChangePasswordRequest *rq = auth_rq(s);
	Etcdserverpb__AuthUserChangePasswordResponse rs = ETCDSERVERPB__AUTH_USER_CHANGE_PASSWORD_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	const char *hash = auth_hashed(s);
	struct auth_who who;
	Authpb__UserAddOptions opt;
	const Authpb__User *u;
	Authpb__User nu;
	struct auth_rec r;

	if (auth_who(k, s, &who, &e) || auth_admin(k, &who, &e))
		;
	else if (!(u = auth_user_n(k, rq->name, pb_str(rq->name).n))) /* found: rq->name holds no NUL */
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_USER_NOT_FOUND);
	else if (!hash) {
		if (!auth_hash_start(k, s, pb_str(rq->password), NULL, k->cfg.bcrypt_cost, &e))
			return;
	} else if (!auth_begin(k, s, &r, &e)) {
		auth_user_msg(&nu, &opt, u, rq->name, hash, u->roles, u->n_roles);
		if (!auth_end(k, &r, auth_rec_op(k, &r, AUTH_OP_USER, &nu.base, NULL), 1, &e))
			auth_tok_drop(k, rq->name);
	}
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static int auth_str_order(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A user's roles with one added (add) or taken out, sorted as etcd keeps
 * them.  Returns the count; *out is kvd's (NULL on no memory). */
static size_t auth_roles_with(struct kvd *k, const Authpb__User *u, const char *role, int add, char ***out)
{
	char **v = kvd_malloc(k, (u->n_roles + 1) * sizeof *v);
	size_t i, n = 0;

	*out = v;
	if (!v)
		return 0;
	for (i = 0; i < u->n_roles; i++)
		if (strcmp(u->roles[i], role))
			v[n++] = u->roles[i];
	if (add) {
		v[n++] = (char *)role;
		qsort(v, n, sizeof *v, auth_str_order);
	}
	return n;
}

/* User u (named name) with role added (add) or taken out: one AUTH record. */
static void auth_user_set_role(struct kvd *k, struct call *s, const Authpb__User *u, const char *name,
                               const char *role, int add, struct svc_err *e)
{
	Authpb__UserAddOptions opt;
	Authpb__User nu;
	struct auth_rec r;
	char **roles;
	size_t n = auth_roles_with(k, u, role, add, &roles);

	if (!roles)
		svc_fail(e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	else if (!auth_begin(k, s, &r, e)) {
		auth_user_msg(&nu, &opt, u, name, NULL, roles, n);
		auth_end(k, &r, auth_rec_op(k, &r, AUTH_OP_USER, &nu.base, NULL), 1, e);
	}
	kvd_free(k, roles);
}

static void svc_auth_user_grant(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthUserGrantRoleRequest *rq = (const void *)s->rq;
	Etcdserverpb__AuthUserGrantRoleResponse rs = ETCDSERVERPB__AUTH_USER_GRANT_ROLE_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	const Authpb__User *u;
	struct auth_who who;

	if (auth_who(k, s, &who, &e) || auth_admin(k, &who, &e))
		;
	else if (!(u = auth_user_n(k, rq->user, pb_str(rq->user).n))) /* names whole (section 5) */
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_USER_NOT_FOUND);
	else if (!auth_is_root(pb_str(rq->role)) && !auth_role_n(k, rq->role, pb_str(rq->role).n))
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_ROLE_NOT_FOUND);
	else if (!auth_has_role(u, rq->role)) /* granted already: nothing, as etcd (found: no NUL) */
		auth_user_set_role(k, s, u, rq->user, rq->role, 1, &e);
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static void svc_auth_user_revoke(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthUserRevokeRoleRequest *rq = (const void *)s->rq;
	Etcdserverpb__AuthUserRevokeRoleResponse rs = ETCDSERVERPB__AUTH_USER_REVOKE_ROLE_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	const Authpb__User *u;
	struct auth_who who;

	if (auth_who(k, s, &who, &e) || auth_admin(k, &who, &e))
		;
	else if (k->auth.enabled && auth_is_root(pb_str(rq->name)) && auth_is_root(pb_str(rq->role)))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_INVALID_AUTH_MGMT);
	else if (!(u = auth_user_n(k, rq->name, pb_str(rq->name).n))) /* names whole (section 5) */
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_USER_NOT_FOUND);
	else if (!auth_has_role_n(u, rq->role, pb_str(rq->role).n))
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_ROLE_NOT_GRANTED);
	else
		auth_user_set_role(k, s, u, rq->name, rq->role, 0, &e);
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static void svc_auth_role_add(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthRoleAddRequest *rq = (const void *)s->rq;
	Etcdserverpb__AuthRoleAddResponse rs = ETCDSERVERPB__AUTH_ROLE_ADD_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	Authpb__Role nr = AUTHPB__ROLE__INIT;
	struct auth_rec r;
	struct auth_who who;

	if (auth_who(k, s, &who, &e) || auth_admin(k, &who, &e))
		;
	else if (!pb_str(rq->name).n)
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_ROLE_EMPTY);
	else if (pb_str_nul(rq->name)) /* etcd takes it; kvd keeps no such name (section 5, invariant 5) */
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_NAME_NUL);
	else if (auth_role(k, rq->name))
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_ROLE_EXISTS);
	else if (!auth_begin(k, s, &r, &e)) {
		nr.name.data = (uint8_t *)rq->name;
		nr.name.len = strlen(rq->name);
		auth_end(k, &r, auth_rec_op(k, &r, AUTH_OP_ROLE, &nr.base, NULL), 1, &e);
	}
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static void svc_auth_role_get(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthRoleGetRequest *rq = (const void *)s->rq;
	Etcdserverpb__AuthRoleGetResponse rs = ETCDSERVERPB__AUTH_ROLE_GET_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	static const uint8_t nul = 0;
	Authpb__Permission all = AUTHPB__PERMISSION__INIT, *pall = &all;
	const Authpb__Role *r;
	struct auth_who who;

	if (auth_who(k, s, &who, &e))
		;
	else if (!(who.name && auth_has_role_n(auth_user_n(k, who.name, who.nlen), rq->role, pb_str(rq->role).n)) &&
	         auth_admin(k, &who, &e))
		; /* one's own role, or root */
	else if (!(r = auth_role_n(k, rq->role, pb_str(rq->role).n)))
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_ROLE_NOT_FOUND);
	else if (auth_is_root(pb_str(rq->role))) { /* etcd 3.5+: root shows what it may, every key */
		all.permtype = AUTHPB__PERMISSION__TYPE__READWRITE;
		all.range_end.data = (uint8_t *)&nul;
		all.range_end.len = 1;
		rs.perm = &pall;
		rs.n_perm = 1;
	} else {
		rs.perm = r->keypermission;
		rs.n_perm = r->n_keypermission;
	}
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static void svc_auth_role_delete(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthRoleDeleteRequest *rq = (const void *)s->rq;
	Etcdserverpb__AuthRoleDeleteResponse rs = ETCDSERVERPB__AUTH_ROLE_DELETE_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	Authpb__UserAddOptions opt;
	Authpb__User nu;
	struct auth_rec r;
	struct auth_who who;
	char **roles, name[256];
	size_t i, n;
	int fail = 0;

	if (auth_who(k, s, &who, &e) || auth_admin(k, &who, &e))
		;
	else if (k->auth.enabled && auth_is_root(pb_str(rq->role)))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_INVALID_AUTH_MGMT);
	else if (!auth_role_n(k, rq->role, pb_str(rq->role).n)) /* found: rq->role holds no NUL */
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_ROLE_NOT_FOUND);
	else if (!auth_begin(k, s, &r, &e)) {
		fail = auth_rec_op(k, &r, AUTH_OP_ROLE_DEL, NULL, rq->role);
		/* and out of every user that had it, in the same record */
		for (i = 0; !fail && i < k->auth.users.n; i++) {
			const Authpb__User *u = (const Authpb__User *)k->auth.users.v[i];
			if (!auth_has_role(u, rq->role))
				continue;
			if (u->name.len >= sizeof name) {
				fail = KVD_ELIMIT;
				break;
			}
			memcpy(name, u->name.data, u->name.len);
			name[u->name.len] = 0;
			n = auth_roles_with(k, u, rq->role, 0, &roles);
			if (!roles) {
				fail = KVD_ENOMEM;
				break;
			}
			auth_user_msg(&nu, &opt, u, name, NULL, roles, n);
			fail = auth_rec_op(k, &r, AUTH_OP_USER, &nu.base, NULL);
			kvd_free(k, roles);
		}
		auth_end(k, &r, fail, 1, &e);
	}
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

/* etcd's isValidPermissionRange: a key, and an end above it, "\0" (from
 * the key on) or none (the key alone). */
static int auth_perm_valid(const Authpb__Permission *p)
{
	if (!p->key.len)
		return 0;
	if (!p->range_end.len || (p->range_end.len == 1 && !p->range_end.data[0]))
		return 1;
	return auth_cmp(p->key.data, p->key.len, p->range_end.data, p->range_end.len) < 0;
}

/* etcd's permSlice.Less: by key alone (ties keep their place in Go's sort
 * of a nearly sorted slice, not by any rule: hence Go's sort here) */
static int auth_perm_less(const void *a, const void *b)
{
	const Authpb__Permission *x = a, *y = b;

	return auth_cmp(x->key.data, x->key.len, y->key.data, y->key.len) < 0;
}

static void svc_auth_role_grant(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthRoleGrantPermissionRequest *rq = (const void *)s->rq;
	Etcdserverpb__AuthRoleGrantPermissionResponse rs = ETCDSERVERPB__AUTH_ROLE_GRANT_PERMISSION_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	Authpb__Role nr = AUTHPB__ROLE__INIT;
	Authpb__Permission **v = NULL, np;
	const Authpb__Role *role;
	struct auth_rec r;
	struct auth_who who;
	size_t i, n;

	if (auth_who(k, s, &who, &e) || auth_admin(k, &who, &e))
		;
	else if (!rq->perm)
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_PERM_NOT_GIVEN);
	else if (!auth_perm_valid(rq->perm)) /* etcd 3.5.8+: stored ranges are never inverted */
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_INVALID_AUTH_MGMT);
	else if (!(role = auth_role_n(k, rq->name, pb_str(rq->name).n)))
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_ROLE_NOT_FOUND);
	else if (!(v = kvd_malloc(k, (role->n_keypermission + 1) * sizeof *v)))
		svc_fail(&e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	else {
		n = role->n_keypermission;
		if (n) /* a role without permissions has none to copy (and a NULL array) */
			memcpy(v, role->keypermission, n * sizeof *v);
		/* etcd looks at the first permission whose key is >= the new one's:
		 * the same key and range end update its type, else one is added */
		for (i = 0; i < n && auth_cmp(v[i]->key.data, v[i]->key.len, rq->perm->key.data, rq->perm->key.len) < 0; i++)
			;
		authpb__permission__init(&np);
		np.permtype = rq->perm->permtype;
		np.key = rq->perm->key;
		np.range_end = rq->perm->range_end;
		if (i < n && !auth_cmp(v[i]->key.data, v[i]->key.len, np.key.data, np.key.len) &&
		    !auth_cmp(v[i]->range_end.data, v[i]->range_end.len, np.range_end.data, np.range_end.len)) {
			np.key = v[i]->key;
			np.range_end = v[i]->range_end;
			v[i] = &np;
		} else {
			v[n++] = &np;
			svc_gosort_ptrs((void **)v, n, auth_perm_less);
		}
		nr.name = role->name;
		nr.keypermission = v;
		nr.n_keypermission = n;
		if (!auth_begin(k, s, &r, &e))
			auth_end(k, &r, auth_rec_op(k, &r, AUTH_OP_ROLE, &nr.base, NULL), 1, &e);
	}
	kvd_free(k, v);
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static void svc_auth_role_revoke(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AuthRoleRevokePermissionRequest *rq = (const void *)s->rq;
	Etcdserverpb__AuthRoleRevokePermissionResponse rs = ETCDSERVERPB__AUTH_ROLE_REVOKE_PERMISSION_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	Authpb__Role nr = AUTHPB__ROLE__INIT;
	Authpb__Permission **v = NULL;
	const Authpb__Role *role;
	struct auth_rec r;
	struct auth_who who;
	size_t i, n = 0;

	if (auth_who(k, s, &who, &e) || auth_admin(k, &who, &e))
		;
	else if (!(role = auth_role_n(k, rq->role, pb_str(rq->role).n)))
		svc_fail(&e, GRPC_FAILED_PRECONDITION, E_ROLE_NOT_FOUND);
	else if (!(v = kvd_malloc(k, (role->n_keypermission + 1) * sizeof *v)))
		svc_fail(&e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	else {
		for (i = 0; i < role->n_keypermission; i++) {
			Authpb__Permission *p = role->keypermission[i];
			if (auth_cmp(p->key.data, p->key.len, rq->key.data, rq->key.len) ||
			    auth_cmp(p->range_end.data, p->range_end.len, rq->range_end.data, rq->range_end.len))
				v[n++] = p;
		}
		if (n == role->n_keypermission)
			svc_fail(&e, GRPC_FAILED_PRECONDITION, E_PERM_NOT_GRANTED);
		else if (!auth_begin(k, s, &r, &e)) {
			nr.name = role->name;
			nr.keypermission = v;
			nr.n_keypermission = n;
			auth_end(k, &r, auth_rec_op(k, &r, AUTH_OP_ROLE, &nr.base, NULL), 1, &e);
		}
	}
	kvd_free(k, v);
	auth_answer(k, s, &rs.base, &rs.header, &e);
}

static void auth_init(struct kvd *k)
{
	k->auth.rev = 1;
	k->auth.rnd_fd = -1;
	k->auth.ttl_ms = (int64_t)k->cfg.auth_token_ttl * 1000;
}

static void auth_free(struct kvd *k)
{
	struct auth *a = &k->auth;

	auth_commit(k);
	auth_tok_drop(k, NULL);
#ifndef KVD_NO_JWT
	auth_jwt_free(k);
#endif
	kvd_free(k, a->tok);
	auth_tab_clear(k, &a->users);
	auth_tab_clear(k, &a->roles);
	kvd_free(k, a->users.v);
	kvd_free(k, a->roles.v);
	kvd_free(k, a->undo);
	if (a->rnd_fd >= 0)
		close(a->rnd_fd);
	memset(a, 0, sizeof *a);
	a->rnd_fd = -1;
}

#else /* KVD_NO_AUTH */
static void auth_init(struct kvd *k)
{
	k->auth.rev = 1;
	k->auth.rnd_fd = -1;
}

static void auth_free(struct kvd *k)
{
	(void)k;
}
#endif /* KVD_NO_AUTH */

/* ===== 24. Services: Maintenance, Health (svc_) ========================== */

/*
 * Maintenance and Health: Status, Alarm, Defragment, Hash, HashKV,
 * Snapshot, MoveLeader, Downgrade, and grpc.health.v1.  Each answers from
 * the store as etcd 3.7 answers for a one-member cluster; a Snapshot
 * streams section 14's image as the client's window opens:
 * svc_snapshot_rpc -> h2_stream_send (on_produce when the window is open)
 * -> svc_snapshot_produce -> snap_produce -> snap_chunk -> call_send.
 * Cluster's MemberList (svc_member, svc_member_list) ends the section; the
 * rest of Cluster is section 25's.
 *
 * Invariants:
 *   1. Permission as etcd 3.7's: root for Hash, HashKV, Snapshot,
 *      Defragment, MoveLeader, Downgrade and Alarm changes (auth_root); a
 *      user for Status, Alarm GET and MemberList (auth_need_user); the
 *      Health checks ask nobody.
 *   2. A Snapshot's state is its call's (s->svc), freed by
 *      svc_snapshot_close, which also takes it out of k->life.snapshots:
 *      while one is open no rewrite moves the log (life_step); the close
 *      wakes the loop so one may go on.
 *   3. Defragment is answered only when the rewrite ends (life_rw_end ->
 *      svc_defrag_answer); a call that goes first leaves the waiting list
 *      (svc_defrag_close), so the rewrite never answers a freed call.
 *   4. An alarm change writes only when the set changed (life_alarm_set
 *      returns 1: s->wrote); it goes through whatever alarm is on, as
 *      etcd's, and only a broken log refuses it.
 *   5. Downgrade lives in memory only (k->downgrade); /version and Status
 *      report the cluster version through svc_cluster_version.
 */

/* grpc.health.v1.Health/Check: "" is SERVING, any other name unknown (as
 * etcd registers only ""). */
static void svc_health_check(struct kvd *k, struct call *s)
{
	const Grpc__Health__V1__HealthCheckRequest *rq = (const void *)s->rq;
	Grpc__Health__V1__HealthCheckResponse rs = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;

	if (pb_str(rq->service).n) { /* whole: "\0x" is not "" */
		call_finish(k, s, GRPC_NOT_FOUND, "unknown service");
	} else {
		rs.status = k->stopping ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
		                        : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
		call_reply(k, s, &rs.base);
	}
}

/* Health/Watch: the current status now, then the stream stays open; kvd
 * announces NOT_SERVING when it begins to shut down (svc_shutdown). */
static void svc_health_watch(struct kvd *k, struct call *s)
{
	const Grpc__Health__V1__HealthCheckRequest *rq = (const void *)s->rq;
	Grpc__Health__V1__HealthCheckResponse rs = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;

	if (pb_str(rq->service).n)
		rs.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
	else
		rs.status = k->stopping ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
		                        : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
	s->svc = pb_str(rq->service).n ? NULL : (void *)s; /* marks a watcher of "" */
	call_send(k, s, &rs.base);
}

static void svc_health_watch_shutdown(struct kvd *k, struct call *s)
{
	Grpc__Health__V1__HealthCheckResponse rs = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;

	rs.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
	if (s->svc)
		call_send(k, s, &rs.base);
}

/*
 * Downgrade (etcd 3.5+).  A one-member etcd 3.7 validates a target one minor
 * below its cluster version; ENABLE records it, and at its next version
 * monitor tick (<= 4 s) the cluster and storage versions drop to it; CANCEL
 * always succeeds and the versions climb back.  kvd follows at once and
 * keeps the state in memory only: it never runs an older binary, so a
 * restart is the end of any downgrade.  svc_cluster_version() is what
 * /version and Status report, and the answers here follow the same state;
 * a snapshot (section 14) says KVD_ETCD_CLUSTER, downgrade or not.
 */
static const char *svc_cluster_version(const struct kvd *k)
{
	return k->downgrade ? "3.6.0" : KVD_ETCD_CLUSTER;
}

static void svc_downgrade_info(const struct kvd *k, Etcdserverpb__DowngradeInfo *di)
{
	di->enabled = k->downgrade;
	di->targetversion = k->downgrade ? (char *)"3.6.0" : (char *)"";
}

/* coreos/go-semver's NewVersion, or it with ".0" appended (convertToClusterVersion):
 * major and minor of X.Y[.Z[-pre][+build]]; -1 when neither parses. */
static int svc_semver_mm(const char *v, long *maj, long *min)
{
	const char *p = v;
	long x[3] = {0, 0, 0};
	int i;

	for (i = 0; i < 3; i++) {
		if (i && *p++ != '.')
			return -1;
		if (!(*p >= '0' && *p <= '9'))
			return -1;
		for (; *p >= '0' && *p <= '9'; p++)
			if ((x[i] = x[i] * 10 + (*p - '0')) > 1000000000L)
				return -1;
		if (i == 1 && !*p)
			break; /* X.Y */
	}
	if (i == 3 && *p && !((*p == '-' || *p == '+') && p[1]))
		return -1; /* X.Y.Z, then nothing or a pre-release / build suffix */
	*maj = x[0];
	*min = x[1];
	return 0;
}

static void svc_downgrade(struct kvd *k, struct call *s)
{
	const Etcdserverpb__DowngradeRequest *rq = (const void *)s->rq;
	Etcdserverpb__DowngradeResponse rs = ETCDSERVERPB__DOWNGRADE_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_err e = {0, NULL};
	long maj = 0, min = 0, cmaj = 3, cmin = k->downgrade ? 6 : 7;
	char cv[16];
	int act = rq->action;

	if (auth_root(k, s, &e))
		;
	else if (svc_too_large(k, s->raw.n))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
	else if (act == ETCDSERVERPB__DOWNGRADE_REQUEST__DOWNGRADE_ACTION__CANCEL)
		k->downgrade = 0; /* 3.6+: never an error, "no inflight downgrade job" is only logged */
	else if (act != ETCDSERVERPB__DOWNGRADE_REQUEST__DOWNGRADE_ACTION__VALIDATE &&
	         act != ETCDSERVERPB__DOWNGRADE_REQUEST__DOWNGRADE_ACTION__ENABLE)
		svc_fail(&e, GRPC_UNKNOWN, "etcdserver: unknown method");
	else if (pb_str_nul(rq->version) || svc_semver_mm(rq->version ? rq->version : "", &maj, &min))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, "etcdserver: wrong downgrade target version format");
	else if (maj != cmaj || min != cmin - 1)
		svc_fail(&e, GRPC_INVALID_ARGUMENT, "etcdserver: invalid downgrade target version");
	else if (k->downgrade)
		svc_fail(&e, GRPC_FAILED_PRECONDITION, "etcdserver: cluster has a downgrade job in progress");
	if (!e.msg) {
		snprintf(cv, sizeof cv, "3.%ld", cmin); /* the cluster version before this call */
		if (act == ETCDSERVERPB__DOWNGRADE_REQUEST__DOWNGRADE_ACTION__ENABLE)
			k->downgrade = 1;
		svc_header(k, &h, 1);
		rs.header = &h;
		rs.version = cv;
	}
	svc_end(k, s, &rs.base, &e);
}

/* Maintenance/Status, with the fields etcd 3.7 sets (leader = self; the
 * downgrade info always present, if empty); errors are the alarms, as
 * etcd's AlarmMember prints itself (3.7's prototext: no trailing space). */
static void svc_status(struct kvd *k, struct call *s)
{
	Etcdserverpb__StatusResponse rs = ETCDSERVERPB__STATUS_RESPONSE__INIT;
	Etcdserverpb__DowngradeInfo di = ETCDSERVERPB__DOWNGRADE_INFO__INIT;
	Etcdserverpb__ResponseHeader h;
	char text[MVCC_MAX_ALARMS][64], *errs[MVCC_MAX_ALARMS];
	struct svc_err e = {0, NULL};
	struct auth_who who;
	unsigned i;

	if (auth_need_user(k, s, &who, &e)) {
		call_finish(k, s, e.code, "%s", e.msg);
		return;
	}
	for (i = 0; i < k->db.nalarms; i++) {
		snprintf(text[i], sizeof text[i], "memberID:%llu alarm:%s", (unsigned long long)k->db.alarms[i].member,
		         life_alarm_name(k->db.alarms[i].type));
		errs[i] = text[i];
	}
	rs.n_errors = k->db.nalarms;
	rs.errors = errs;
	svc_header(k, &h, 1);
	rs.header = &h;
	rs.version = (char *)KVD_ETCD_VERSION;
	rs.dbsize = (int64_t)k->db.size;
	rs.dbsizeinuse = (int64_t)(k->db.size - KVD_MIN(k->db.reclaimable, k->db.size));
	rs.leader = k->member_id;
	rs.raftindex = (uint64_t)k->db.rev;
	rs.raftappliedindex = (uint64_t)k->db.rev;
	rs.raftterm = SVC_RAFT_TERM;
	rs.storageversion = (char *)svc_cluster_version(k);
	rs.dbsizequota = k->cfg.quota_backend_bytes ? (int64_t)k->cfg.quota_backend_bytes : (int64_t)LIFE_DEFAULT_QUOTA;
	svc_downgrade_info(k, &di);
	rs.downgradeinfo = &di;
	call_reply(k, s, &rs.base);
}

/* Maintenance/HashKV: etcd 3.7's hash of the key history (section 14); the
 * compaction point itself may be hashed. */
static void svc_hashkv(struct kvd *k, struct call *s)
{
	const Etcdserverpb__HashKVRequest *rq = (const void *)s->rq;
	Etcdserverpb__HashKVResponse rs = ETCDSERVERPB__HASH_KVRESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_err e = {0, NULL};
	uint32_t hash = 0;
	unsigned i;
	int r;

	for (i = 0; i < k->db.nhashes && k->db.hashes[i].rev != rq->revision; i++)
		;
	if (auth_root(k, s, &e))
		;
	else if (svc_too_large(k, s->raw.n))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
	else if (i < k->db.nhashes) { /* kept at that compaction (section 14) */
		svc_header(k, &h, 1);
		rs.header = &h;
		rs.hash = k->db.hashes[i].hash;
		rs.compact_revision = k->db.hashes[i].compact;
		rs.hash_revision = k->db.hashes[i].rev;
		svc_end(k, s, &rs.base, &e);
		return;
	} else if (rq->revision > 0 && rq->revision < k->db.compacted)
		svc_fail(&e, GRPC_OUT_OF_RANGE, E_COMPACTED);
	else if (rq->revision > k->db.rev)
		svc_fail(&e, GRPC_OUT_OF_RANGE, E_FUTURE_REV);
	else if ((r = snap_hashkv(k, rq->revision ? rq->revision : k->db.rev, &hash)))
		svc_fail(&e, r == KVD_ENOMEM ? GRPC_RESOURCE_EXHAUSTED : GRPC_DATA_LOSS,
		         r == KVD_ENOMEM ? "kvd: out of memory" : "kvd: cannot read the log");
	if (!e.msg) {
		svc_header(k, &h, 1);
		rs.header = &h;
		rs.hash = hash;
		rs.compact_revision = k->db.compacted;
		rs.hash_revision = rq->revision ? rq->revision : k->db.rev;
	}
	svc_end(k, s, &rs.base, &e);
}

/* Maintenance/Hash: etcd 3.7's hash of its backend (section 14). */
static void svc_hash(struct kvd *k, struct call *s)
{
	Etcdserverpb__HashResponse rs = ETCDSERVERPB__HASH_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_err e = {0, NULL};
	uint32_t hash = 0;
	int r;

	if (auth_root(k, s, &e))
		;
	else if (svc_too_large(k, s->raw.n))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
	else if ((r = snap_hash(k, &hash)))
		svc_fail(&e, r == KVD_ENOMEM ? GRPC_RESOURCE_EXHAUSTED : GRPC_DATA_LOSS,
		         r == KVD_ENOMEM ? "kvd: out of memory" : "kvd: cannot read the log");
	if (!e.msg) {
		svc_header(k, &h, 1);
		rs.header = &h;
		rs.hash = hash;
	}
	svc_end(k, s, &rs.base, &e);
}

#ifndef KVD_NO_SNAPSHOT
/* Maintenance/Snapshot: etcd's backend file, made as the window opens
 * (section 14); planned on the first chance to send, after a group commit. */
static void svc_snapshot_rpc(struct kvd *k, struct call *s)
{
	struct svc_err e = {0, NULL};

	if (auth_root(k, s, &e)) {
		call_finish(k, s, e.code, "%s", e.msg);
	} else if (svc_too_large(k, s->raw.n)) {
		call_finish(k, s, GRPC_INVALID_ARGUMENT, "%s", E_TOO_LARGE);
	} else if (!(s->svc = kvd_calloc(k, sizeof(struct snap)))) {
		call_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	} else {
		k->life.snapshots++;
		s->produce = 1;
	}
}

static void svc_snapshot_produce(struct kvd *k, struct call *s)
{
	struct snap *sn = s->svc;
	int e = snap_produce(k, sn, s);

	if (e == 0) {
		kvd_log(k, KVD_LOG_INFO, "snapshot at revision %lld sent", (long long)sn->rev);
		call_finish(k, s, GRPC_OK, "%s", "");
	}
	else if (e < 0)
		call_finish(k, s, e == KVD_ENOMEM ? GRPC_RESOURCE_EXHAUSTED : GRPC_DATA_LOSS, "%s",
		            e == KVD_ENOMEM ? "kvd: out of memory" : "kvd: cannot read the log for a snapshot");
}

static void svc_snapshot_close(struct kvd *k, struct call *s)
{
	if (!s->svc)
		return;
	snap_free(k, s->svc);
	s->svc = NULL;
	k->life.snapshots--;
	util_wake_by(k, k->now); /* a rewrite may go on */
}
#else
/* Maintenance/Snapshot, left out (KVD_NO_SNAPSHOT): a clear Unimplemented. */
static void svc_snapshot_rpc(struct kvd *k, struct call *s)
{
	call_finish(k, s, GRPC_UNIMPLEMENTED, "%s", "kvd: built without snapshots (KVD_NO_SNAPSHOT)");
}
#define svc_snapshot_close NULL
#define svc_snapshot_produce NULL
#endif

/* Maintenance/Alarm: GET (all, or one type), ACTIVATE, DEACTIVATE, as
 * etcd's applier: the answer lists the alarm changed (or found). */
static void svc_alarm(struct kvd *k, struct call *s)
{
	const Etcdserverpb__AlarmRequest *rq = (const void *)s->rq;
	Etcdserverpb__AlarmResponse rs = ETCDSERVERPB__ALARM_RESPONSE__INIT;
	Etcdserverpb__AlarmMember am[MVCC_MAX_ALARMS], *pam[MVCC_MAX_ALARMS];
	Etcdserverpb__ResponseHeader h;
	struct svc_err e = {0, NULL};
	struct mvcc *m = &k->db;
	unsigned i, n = 0, type = (unsigned)rq->alarm;
	struct auth_who who;
	int r;

	if (rq->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__GET ? auth_need_user(k, s, &who, &e)
	                                                                 : auth_root(k, s, &e)) {
		(void)0; /* etcd 3.7: a user lists, root changes */
	} else if (svc_too_large(k, s->raw.n)) {
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
	} else if (rq->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__GET) {
		for (i = 0; i < m->nalarms; i++)
			if (type == ALARM_NONE || m->alarms[i].type == type) {
				etcdserverpb__alarm_member__init(&am[n]);
				am[n].memberid = m->alarms[i].member;
				am[n].alarm = (Etcdserverpb__AlarmType)m->alarms[i].type;
				pam[n] = &am[n];
				n++;
			}
	} else if (rq->action != ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE &&
	           rq->action != ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__DEACTIVATE) {
		svc_fail(&e, GRPC_INVALID_ARGUMENT, "etcdserver: unknown alarm action");
	} else if (type != ALARM_NOSPACE && type != ALARM_CORRUPT) {
		(void)0; /* NONE, or a type kvd does not know: nothing to change */
	} else if (k->db.broken) { /* alarms themselves pass any alarm, as etcd's */
		svc_fail(&e, GRPC_UNAVAILABLE, "kvd: the log is unwritable after an I/O error; restart kvd");
	} else {
		int on = rq->action == ETCDSERVERPB__ALARM_REQUEST__ALARM_ACTION__ACTIVATE;
		int was = 0;
		for (i = 0; i < m->nalarms; i++)
			was |= m->alarms[i].member == rq->memberid && m->alarms[i].type == type;
		r = life_alarm_set(k, rq->memberid, type, on);
		if (r < 0)
			svc_fail(&e, GRPC_RESOURCE_EXHAUSTED, r == KVD_ELIMIT ? "kvd: too many alarms" : "kvd: out of memory");
		else if (on || was) { /* activate answers the alarm even if it was on; deactivate only if it was */
			etcdserverpb__alarm_member__init(&am[0]);
			am[0].memberid = rq->memberid;
			am[0].alarm = (Etcdserverpb__AlarmType)type;
			pam[0] = &am[0];
			n = 1;
			s->wrote = r == 1;
		}
	}
	if (!e.msg) { /* with a header since etcd 3.5 */
		svc_header(k, &h, 1);
		rs.header = &h;
		rs.n_alarms = n;
		rs.alarms = n ? pam : NULL;
	}
	svc_end(k, s, &rs.base, &e);
}

/* Maintenance/Defragment: the log rewrite (section 13).  The call waits for
 * it to end; clients go on meanwhile. */
static void svc_defrag_answer(struct kvd *k, struct call *c, int code, const char *msg)
{
	Etcdserverpb__DefragmentResponse rs = ETCDSERVERPB__DEFRAGMENT_RESPONSE__INIT;

	if (code != GRPC_OK) {
		call_finish(k, c, code, "%s", msg);
		return;
	}
	call_reply(k, c, &rs.base); /* no header: etcd 3.7's answer is empty */
}

/* Maintenance/MoveLeader: kvd leads alone, so the move to itself is done at
 * once and any other member (a learner, or none) is a bad transferee, as
 * etcd 3.7 answers.  Root only. */
static void svc_move_leader(struct kvd *k, struct call *s)
{
	const Etcdserverpb__MoveLeaderRequest *rq = (const void *)s->rq;
	Etcdserverpb__MoveLeaderResponse rs = ETCDSERVERPB__MOVE_LEADER_RESPONSE__INIT;
	struct svc_err e = {0, NULL};

	if (auth_root(k, s, &e))
		;
	else if (svc_too_large(k, s->raw.n))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, E_TOO_LARGE);
	else if (rq->targetid != k->member_id)
		svc_fail(&e, GRPC_FAILED_PRECONDITION, "etcdserver: bad leader transferee");
	svc_end(k, s, &rs.base, &e);
}

static void svc_defrag(struct kvd *k, struct call *s)
{
	struct life *L = &k->life;
	struct svc_err e = {0, NULL};

	if (auth_root(k, s, &e)) {
		call_finish(k, s, e.code, "%s", e.msg);
		return;
	}
	if (svc_too_large(k, s->raw.n)) {
		call_finish(k, s, GRPC_INVALID_ARGUMENT, "%s", E_TOO_LARGE);
		return;
	}
	if (k->db.broken) {
		call_finish(k, s, GRPC_UNAVAILABLE, "kvd: the log is unwritable after an I/O error; restart kvd");
		return;
	}
	if (UTIL_GROW(k, L->wait, L->waitcap, L->nwait + 1, 4)) {
		call_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return;
	}
	L->wait[L->nwait++] = s;
	s->svc = s; /* waiting: svc_defrag_close takes it off the list */
	if (!L->rw)
		L->want = 1;
	util_wake_by(k, k->now);
}

static void svc_defrag_close(struct kvd *k, struct call *s)
{
	struct life *L = &k->life;
	size_t i;

	if (!s->svc)
		return;
	for (i = 0; i < L->nwait; i++)
		if (L->wait[i] == s) {
			L->wait[i] = L->wait[--L->nwait];
			break;
		}
	s->svc = NULL;
}

static void svc_member(struct kvd *k, Etcdserverpb__Member *m)
{
	etcdserverpb__member__init(m);
	m->id = k->member_id;
	m->name = (char *)(uintptr_t)k->cfg.name;
	m->n_peerurls = k->npeer_urls;
	m->peerurls = k->peer_urls;
	m->n_clienturls = k->nclient_urls;
	m->clienturls = k->client_urls;
}

/* Cluster/MemberList: this member and the learners MemberAdd took (they
 * never start: section 25); the header carries no revision. */
#define SVC_MAX_MEMBERS 8 /* other members kvd lists (never started ones) */
static size_t svc_members(struct kvd *k, Etcdserverpb__Member *m, Etcdserverpb__Member **mp);

static void svc_member_list(struct kvd *k, struct call *s)
{
	Etcdserverpb__MemberListResponse rs = ETCDSERVERPB__MEMBER_LIST_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	Etcdserverpb__Member m[SVC_MAX_MEMBERS + 1], *mp[SVC_MAX_MEMBERS + 1];
	struct svc_err e = {0, NULL};
	struct auth_who who;

	if (auth_need_user(k, s, &who, &e)) { /* etcd 3.7; linearizable or not, one member answers the same */
		call_finish(k, s, e.code, "%s", e.msg);
		return;
	}
	svc_header(k, &h, 0);
	rs.header = &h;
	rs.n_members = svc_members(k, m, mp);
	rs.members = mp;
	call_reply(k, s, &rs.base);
}

/* ===== 25. Services: Cluster, one member for good (svc_) ================= */

/*
 * kvd is one member and stays one.  The membership RPCs answer as a
 * one-node etcd 3.7 answers the same requests (checks, order, codes and
 * texts measured against it; ids made as etcd makes them), with one
 * exception: etcd accepts a voting member -- and then has no quorum until
 * that member starts, which here it never would -- so kvd refuses it with
 * the words etcd uses when a reconfiguration would leave too few started
 * members.  A learner (etcd takes one at a time) is listed until removed;
 * promoting it fails as etcd fails for a learner that is not in sync;
 * updating it keeps it a learner, as etcd 3.6.12+ does (3.4 made it a voter).
 * MemberUpdate of kvd itself changes the peer URLs MemberList reports.
 * These changes live in memory: after a restart the flags say who kvd is
 * (etcd keeps them in its backend).  MemberList itself is section 24's
 * (svc_member_list), through svc_members here.
 *
 * Invariants:
 *   1. kvd is in every list and never leaves it: removing it fails with
 *      etcd's not-enough-started-members words (svc_member_remove), and an
 *      update keeps its id (svc_member_update).
 *   2. Quorum stays kvd alone: only learners join (svc_member_add refuses
 *      a voter), one at a time (etcd's maxLearners) and at most
 *      SVC_MAX_MEMBERS, and none is ever promoted (svc_member_promote).
 *   3. Ids and URLs as etcd's: a new id from svc_member_id, unique among
 *      the members; peer URLs checked (svc_urls_ok), kept sorted
 *      (svc_urls_copy), never two members' (svc_url_taken); lists sorted
 *      by id (svc_members).
 *   4. k->members and each member's URL list are kvd's: freed on remove
 *      and in kvd_close (cfg_free_list).
 */

struct svc_member_x {
	uint64_t id;
	char **urls;
	unsigned n;
	unsigned learner : 1;
};

static void cfg_free_list(struct kvd *k, char **l, unsigned n); /* section 36 */

/* etcd's types.NewURLs: http(s)://host:port each, no path; at least one. */
static int svc_urls_ok(char **u, size_t n)
{
	size_t i;

	if (!n)
		return 0;
	for (i = 0; i < n; i++) {
		const char *p = u[i], *h, *colon;
		const char *q;
		if (pb_str_nul(p)) /* a control character: Go's url.Parse refuses it */
			return 0;
		for (q = p; *q; q++)
			if ((unsigned char)*q < 0x20 || *q == 0x7f)
				return 0;
		if (!strncmp(p, "http://", 7))
			h = p + 7;
		else if (!strncmp(p, "https://", 8))
			h = p + 8;
		else
			return 0;
		colon = strrchr(h, ':');
		if (!colon || colon == h || !colon[1] || strchr(h, '/') || strspn(colon + 1, "0123456789") != strlen(colon + 1))
			return 0;
	}
	return 1;
}

static int svc_url_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A sorted copy of the URLs (types.NewURLs sorts them). */
static int svc_urls_copy(struct kvd *k, char **u, size_t n, char ***out)
{
	char **a = kvd_calloc(k, (n ? n : 1) * sizeof *a);
	size_t i;

	if (!a)
		return KVD_ENOMEM;
	for (i = 0; i < n; i++)
		if (!(a[i] = kvd_strdup(k, u[i]))) {
			cfg_free_list(k, a, (unsigned)i);
			return KVD_ENOMEM;
		}
	qsort(a, n, sizeof *a, svc_url_cmp);
	*out = a;
	return 0;
}

static int svc_member_cmp(const void *a, const void *b)
{
	uint64_t x = (*(Etcdserverpb__Member *const *)a)->id, y = (*(Etcdserverpb__Member *const *)b)->id;

	return x < y ? -1 : x > y;
}

/* The members as MemberList shows them: by id, as etcd sorts them. */
static size_t svc_members(struct kvd *k, Etcdserverpb__Member *m, Etcdserverpb__Member **mp)
{
	size_t i;

	svc_member(k, &m[0]);
	mp[0] = &m[0];
	for (i = 0; i < k->nmembers; i++) {
		etcdserverpb__member__init(&m[i + 1]);
		m[i + 1].id = k->members[i].id;
		m[i + 1].n_peerurls = k->members[i].n;
		m[i + 1].peerurls = k->members[i].urls;
		m[i + 1].islearner = k->members[i].learner;
		mp[i + 1] = &m[i + 1];
	}
	qsort(mp, k->nmembers + 1, sizeof *mp, svc_member_cmp);
	return k->nmembers + 1;
}

static struct svc_member_x *svc_member_find(struct kvd *k, uint64_t id)
{
	size_t i;

	for (i = 0; i < k->nmembers; i++)
		if (k->members[i].id == id)
			return &k->members[i];
	return NULL;
}

/* Does a member other than `except` (an id, 0 for none) have one of these
 * peer URLs? */
static int svc_url_taken(struct kvd *k, char **u, size_t n, uint64_t except)
{
	size_t i, j, x;

	for (i = 0; i < n; i++) {
		for (j = 0; except != k->member_id && j < k->npeer_urls; j++)
			if (!strcmp(u[i], k->peer_urls[j]))
				return 1;
		for (x = 0; x < k->nmembers; x++)
			for (j = 0; except != k->members[x].id && j < k->members[x].n; j++)
				if (!strcmp(u[i], k->members[x].urls[j]))
					return 1;
	}
	return 0;
}

/* etcd's membership.NewMember id: SHA-1 of the sorted URLs, the cluster
 * name (none for MemberAdd) and the Unix time in seconds. */
static int svc_member_id(struct kvd *k, char **sorted, size_t n, int64_t now, uint64_t *id)
{
	struct kvd_buf b = {0};
	uint8_t d[20];
	char t[24];
	size_t i;

	for (i = 0; i < n; i++)
		buf_append(k, &b, sorted[i], strlen(sorted[i]));
	snprintf(t, sizeof t, "%lld", (long long)now);
	buf_append(k, &b, t, strlen(t));
	if (!b.err)
		util_sha1(BUF_DATA(&b), BUF_LEN(&b), d);
	buf_free(k, &b);
	if (b.err)
		return KVD_ENOMEM;
	*id = get_be64(d);
	return 0;
}

static void svc_member_add(struct kvd *k, struct call *s)
{
	const Etcdserverpb__MemberAddRequest *rq = (const void *)s->rq;
	Etcdserverpb__MemberAddResponse rs = ETCDSERVERPB__MEMBER_ADD_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	Etcdserverpb__Member m[SVC_MAX_MEMBERS + 1], *mp[SVC_MAX_MEMBERS + 1];
	struct svc_err e = {0, NULL};
	struct svc_member_x x = {0, NULL, 0, 0};
	size_t i;

	if (!svc_urls_ok(rq->peerurls, rq->n_peerurls)) {
		svc_fail(&e, GRPC_INVALID_ARGUMENT, "etcdserver: given member URLs are invalid");
	} else if (auth_root(k, s, &e)) {
	} else if ((!k->members && !(k->members = kvd_calloc(k, SVC_MAX_MEMBERS * sizeof *k->members))) ||
	           svc_urls_copy(k, rq->peerurls, rq->n_peerurls, &x.urls) ||
	           svc_member_id(k, x.urls, rq->n_peerurls, (int64_t)time(NULL), &x.id)) {
		x.n = x.urls ? (unsigned)rq->n_peerurls : 0;
		svc_fail(&e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	} else {
		x.n = (unsigned)rq->n_peerurls;
		x.learner = rq->islearner ? 1 : 0;
		if (x.id == k->member_id || svc_member_find(k, x.id))
			svc_fail(&e, GRPC_FAILED_PRECONDITION, "etcdserver: member ID already exist");
		else if (svc_url_taken(k, x.urls, x.n, 0))
			svc_fail(&e, GRPC_FAILED_PRECONDITION, "etcdserver: Peer URLs already exists");
		else if (!rq->islearner) /* etcd: accepted, and no quorum until it starts */
			svc_fail(&e, GRPC_UNKNOWN, "etcdserver: re-configuration failed due to not enough started members");
		for (i = 0; !e.msg && i < k->nmembers; i++)
			if (k->members[i].learner) /* etcd's maxLearners is 1 */
				svc_fail(&e, GRPC_FAILED_PRECONDITION, "etcdserver: too many learner members in cluster");
		if (!e.msg && k->nmembers == SVC_MAX_MEMBERS)
			svc_fail(&e, GRPC_FAILED_PRECONDITION, "kvd: too many members that never start");
	}
	if (e.msg) {
		cfg_free_list(k, x.urls, x.n);
	} else {
		k->members[k->nmembers++] = x;
		svc_header(k, &h, 0);
		rs.header = &h;
		rs.n_members = svc_members(k, m, mp);
		rs.members = mp;
		rs.member = &m[k->nmembers]; /* the new one, wherever the sort put it */
	}
	svc_end(k, s, &rs.base, &e);
}

static void svc_member_remove(struct kvd *k, struct call *s)
{
	const Etcdserverpb__MemberRemoveRequest *rq = (const void *)s->rq;
	Etcdserverpb__MemberRemoveResponse rs = ETCDSERVERPB__MEMBER_REMOVE_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	Etcdserverpb__Member m[SVC_MAX_MEMBERS + 1], *mp[SVC_MAX_MEMBERS + 1];
	struct svc_err e = {0, NULL};
	struct svc_member_x *x = NULL;

	if (auth_root(k, s, &e))
		;
	else if (rq->id == k->member_id)
		svc_fail(&e, GRPC_UNKNOWN, "etcdserver: re-configuration failed due to not enough started members");
	else if (!(x = svc_member_find(k, rq->id)))
		svc_fail(&e, GRPC_NOT_FOUND, "etcdserver: member not found");
	if (!e.msg) {
		cfg_free_list(k, x->urls, x->n);
		*x = k->members[--k->nmembers];
		svc_header(k, &h, 0);
		rs.header = &h;
		rs.n_members = svc_members(k, m, mp);
		rs.members = mp;
	}
	svc_end(k, s, &rs.base, &e);
}

static void svc_member_update(struct kvd *k, struct call *s)
{
	const Etcdserverpb__MemberUpdateRequest *rq = (const void *)s->rq;
	Etcdserverpb__MemberUpdateResponse rs = ETCDSERVERPB__MEMBER_UPDATE_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	Etcdserverpb__Member m[SVC_MAX_MEMBERS + 1], *mp[SVC_MAX_MEMBERS + 1];
	struct svc_err e = {0, NULL};
	struct svc_member_x *x = NULL;
	char **u = NULL;

	if (!svc_urls_ok(rq->peerurls, rq->n_peerurls))
		svc_fail(&e, GRPC_INVALID_ARGUMENT, "etcdserver: given member URLs are invalid");
	else if (auth_root(k, s, &e))
		;
	else if (rq->id != k->member_id && !(x = svc_member_find(k, rq->id)))
		svc_fail(&e, GRPC_NOT_FOUND, "etcdserver: member not found");
	else if (svc_url_taken(k, rq->peerurls, rq->n_peerurls, rq->id))
		svc_fail(&e, GRPC_FAILED_PRECONDITION, "etcdserver: Peer URLs already exists");
	else if (svc_urls_copy(k, rq->peerurls, rq->n_peerurls, &u))
		svc_fail(&e, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
	if (!e.msg) {
		if (!x) { /* kvd itself: the id stays, as etcd's does */
			cfg_free_list(k, k->peer_urls, k->npeer_urls);
			k->peer_urls = u;
			k->npeer_urls = (unsigned)rq->n_peerurls;
		} else { /* a learner stays one (etcd 3.4 dropped the flag; 3.6.12 fixed that) */
			cfg_free_list(k, x->urls, x->n);
			x->urls = u;
			x->n = (unsigned)rq->n_peerurls;
		}
		svc_header(k, &h, 0);
		rs.header = &h;
		rs.n_members = svc_members(k, m, mp);
		rs.members = mp;
	}
	svc_end(k, s, &rs.base, &e);
}

static void svc_member_promote(struct kvd *k, struct call *s)
{
	const Etcdserverpb__MemberPromoteRequest *rq = (const void *)s->rq;
	Etcdserverpb__MemberPromoteResponse rs = ETCDSERVERPB__MEMBER_PROMOTE_RESPONSE__INIT;
	struct svc_err e = {0, NULL};
	struct svc_member_x *x = NULL;

	if (auth_root(k, s, &e))
		;
	else if (rq->id != k->member_id && !(x = svc_member_find(k, rq->id)))
		svc_fail(&e, GRPC_NOT_FOUND, "etcdserver: member not found");
	else if (!x || !x->learner)
		svc_fail(&e, GRPC_FAILED_PRECONDITION, "etcdserver: can only promote a learner member");
	else /* it never starts, so it is never in sync */
		svc_fail(&e, GRPC_FAILED_PRECONDITION, "etcdserver: can only promote a learner member which is in sync with leader");
	svc_end(k, s, &rs.base, &e);
}

#ifdef KVD_TEST_SERVICES
/*
 * Test-only methods, compiled into test/kvd-test and never into kvd: raw
 * bytes in and out, to push the transport with large or streamed responses
 * before any etcd RPC produces them.
 *   Echo:   the request back.
 *   Fill:   request = ASCII size N; answer N bytes.
 *   Stream: request = "COUNT SIZE"; COUNT messages of SIZE bytes.
 */
static int svc_test_raw(struct kvd *k, struct call *s, const uint8_t *p, size_t n)
{
	uint8_t *o;

	if (!(o = call_msg(k, s, n)))
		return KVD_ENOMEM;
	if (n)
		memcpy(o, p, n);
	return 0;
}

static void svc_test_echo(struct kvd *k, struct call *s)
{
	const uint8_t *p = s->raw.p;
	size_t n = s->raw.n;

	if (!svc_test_raw(k, s, p, n))
		call_finish(k, s, GRPC_OK, "%s", "");
}

static uint8_t *svc_test_pattern(struct kvd *k, size_t n)
{
	uint8_t *b = kvd_malloc(k, n ? n : 1);
	size_t i;

	for (i = 0; b && i < n; i++)
		b[i] = (uint8_t)('a' + i % 26);
	return b;
}

static void svc_test_fill(struct kvd *k, struct call *s)
{
	const uint8_t *p = s->raw.p;
	size_t n = s->raw.n;

	char num[24];
	size_t size;
	uint8_t *b;

	snprintf(num, sizeof num, "%.*s", (int)KVD_MIN(n, 20), (const char *)p);
	size = (size_t)strtoul(num, NULL, 10);
	if (size > 64u << 20 || !(b = svc_test_pattern(k, size))) {
		call_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: fill too large");
		return;
	}
	if (!svc_test_raw(k, s, b, size))
		call_finish(k, s, GRPC_OK, "%s", "");
	kvd_free(k, b);
}

static void svc_test_stream(struct kvd *k, struct call *s)
{
	const uint8_t *p = s->raw.p;
	size_t n = s->raw.n;

	char num[48];
	unsigned long count = 0, size = 0, i;
	uint8_t *b;

	snprintf(num, sizeof num, "%.*s", (int)KVD_MIN(n, 40), (const char *)p);
	if (sscanf(num, "%lu %lu", &count, &size) != 2 || count > 100000 || size > 1u << 20 ||
	    !(b = svc_test_pattern(k, size))) {
		call_finish(k, s, GRPC_INVALID_ARGUMENT, "kvd: bad stream request");
		return;
	}
	for (i = 0; i < count; i++)
		if (svc_test_raw(k, s, b, size))
			break;
	if (i == count)
		call_finish(k, s, GRPC_OK, "%s", "");
	kvd_free(k, b);
}
#endif

/* A message's protobuf-c descriptor, for the method table (section 28). */
#define PB(name) &name##__descriptor
/* ===== 26. Lock and Election: etcd's concurrency recipes, served (lock_) == */

/*
 * etcd serves v3lockpb.Lock and v3electionpb.Election by running its own
 * client recipes (clientv3/concurrency) against itself.  A lock, or a
 * candidacy, is the key <name>/<lease in hex> put with that lease; the
 * holder is the key under <name>/ with the lowest create revision; a waiter
 * waits until every key created before its own is deleted.  kvd runs the
 * same transactions through the Txn RPC's own code (svc_txn_do, as the
 * caller, auth included), so keys, revisions and headers are etcd's.  Only
 * the wait differs: instead of a watch per predecessor, each waiting call
 * is looked at again after each durable batch (lock_batch) -- no polling,
 * no timer, nothing when no batch comes.
 *
 *   Lock(name, lease)  lease 0 is a new lease of 60 s (etcd's session
 *                      default; nobody keeps it alive).  One txn: if our key
 *                      is absent put it, else get it; and the first-created
 *                      key under the prefix.  Held when nothing under the
 *                      prefix was created before our key.  Answer: the
 *                      header (the txn's, or the moment the wait ended)
 *                      and our key.
 *   Unlock(key)        a delete.
 *   Campaign           the same wait; a key already ours with another value
 *                      is proclaimed first.  Answer: the txn's header and
 *                      the leader key {name, key, create revision, lease}.
 *   Proclaim, Resign   txns guarded by the leader key's create revision; a
 *                      Proclaim whose guard fails is "election: not leader";
 *                      a Resign whose guard fails does nothing.
 *   Leader             the first-created key, or "election: no leader".
 *   Observe            a stream: that key now, each change of it seen after
 *                      a batch, then its successor.
 *
 * As in etcd, whose handlers hand back their client's errors as plain Go
 * errors, failures are code Unknown with etcd's text.  As etcd 3.5 (3.4
 * waits on), a waiter whose own key goes away -- its lease expired or was
 * revoked -- ends at once with "session expired".  A waiting call that ends
 * otherwise (deadline, cancel, a closed connection) deletes its key on the
 * way out, as etcd's Unlock/Resign on error do.
 *
 * Invariants:
 *   1. The recipes write only as a client would: each key change is a Txn
 *      through svc_txn_do as the caller (lock_txn), each session lease a
 *      grant through svc_lease_write (lock_session); auth, quota,
 *      revisions and headers are the RPCs' own, never bypassed.
 *   2. No answer shows a write a crash could undo: one given at once is
 *      held like any call's (call_finish); a waiter looks again only after
 *      a durable batch (lock_batch, from loop_log_flush); Observe's first
 *      look waits for an open batch's flush (lock_observe_rpc).
 *   3. A waiter is answered once: lock_won and lock_fail set w->done, and
 *      lock_batch skips done waiters and finished calls.
 *   4. A waiter that ends unanswered deletes its own key and no other: a
 *      delete guarded by the key's create revision, w->rev, when the log
 *      takes writes (lock_close).
 *   5. A struct lock_wait is its call's (c->svc), on k->locks until the
 *      call goes (lock_close -> lock_free); Proclaim and Resign use one on
 *      the stack that borrows the request's LeaderKey (lock_resume).
 */

#ifndef KVD_NO_RECIPES /* @@ KVD_NO_RECIPES: no Lock and Election (make RECIPES=0): they answer Unimplemented */
#define LOCK_SESSION_TTL 60 /* seconds: concurrency.NewSession's default */

enum { LOCK_LOCK, LOCK_CAMPAIGN, LOCK_OBSERVE };

struct lock_wait {
	struct lock_wait *prev, *next; /* k->locks */
	struct call *c;
	int kind;
	unsigned done : 1;           /* answered: nothing to undo on close */
	ProtobufCBinaryData name;    /* owned copies of the request's */
	uint8_t *pfx, *end;          /* name + "/", and where its range ends */
	size_t npfx;
	const uint8_t *key;          /* ours (in pfx's block), or a LeaderKey's */
	size_t nkey;
	int64_t rev, lease;          /* our key's create revision, its lease */
	Etcdserverpb__ResponseHeader hdr; /* Campaign answers with its txn's header */
	int64_t seen_create, seen_mod; /* Observe: the leader as last sent */
};

/* The Txn RPC's code for one recipe step, as the caller: 0, or KVD_EINVAL
 * with e holding etcd's text as the recipe returns it (code Unknown). */
static int lock_txn(struct kvd *k, struct call *c, Etcdserverpb__TxnRequest *rq, struct svc_pool *pl,
                    Etcdserverpb__TxnResponse *rs, Etcdserverpb__ResponseHeader *h, struct svc_err *e)
{
	if (!svc_txn_do(k, c, rq, protobuf_c_message_get_packed_size(&rq->base), pl, rs, h, e))
		return 0;
	if (e->code != GRPC_RESOURCE_EXHAUSTED)
		e->code = GRPC_UNKNOWN;
	return KVD_EINVAL;
}

/* A session's lease: the caller's, or a new one of LOCK_SESSION_TTL seconds
 * for lease 0 (concurrency.NewSession grants it; etcd checks nothing else). */
static int lock_session(struct kvd *k, struct call *c, int64_t *lease, struct svc_err *e)
{
	struct auth_who who;
	int64_t id;

	if (*lease)
		return 0;
	if (auth_who(k, c, &who, e) || svc_writable(k, e, MVCC_REC_HDR + 14 + MVCC_LEASE_OP_MAX)) {
		e->code = GRPC_UNKNOWN;
		return KVD_EINVAL;
	}
	svc_lease_write(k, e, NULL, id = lease_next_id(k), KVD_MAX((int64_t)LOCK_SESSION_TTL, k->lease.min_ttl));
	if (e->msg)
		return KVD_EINVAL;
	c->wrote = 1;
	*lease = id;
	return 0;
}

static void lock_free(struct kvd *k, struct lock_wait *w)
{
	if (w->prev)
		w->prev->next = w->next;
	else if (k->locks == w)
		k->locks = w->next;
	if (w->next)
		w->next->prev = w->prev;
	kvd_free(k, w->name.data);
	kvd_free(k, w->pfx);
	kvd_free(k, w);
}

/* A waiter for call c on prefix name + "/"; our key is that plus the lease in
 * hex (Go's %x).  NULL when memory is short. */
static struct lock_wait *lock_new(struct kvd *k, struct call *c, int kind, const ProtobufCBinaryData *name,
                                  int64_t lease)
{
	struct lock_wait *w = kvd_calloc(k, sizeof *w);
	uint8_t *key;
	size_t i;

	if (!w)
		return NULL;
	w->c = c;
	w->kind = kind;
	w->lease = lease;
	w->name.len = name->len;
	w->npfx = name->len + 1;
	/* one block: the prefix, its range end, our key (the prefix + the lease's hex) */
	if (!(w->name.data = kvd_malloc(k, name->len + 1)) || !(w->pfx = kvd_malloc(k, 3 * w->npfx + 24))) {
		kvd_free(k, w->name.data);
		kvd_free(k, w);
		return NULL;
	}
	if (name->len)
		memcpy(w->name.data, name->data, name->len);
	memcpy(w->pfx, w->name.data, name->len);
	w->pfx[name->len] = '/';
	w->end = w->pfx + w->npfx; /* the prefix's range end: '/' + 1 is '0' */
	memcpy(w->end, w->pfx, w->npfx);
	w->end[name->len] = '0';
	key = w->end + w->npfx;
	memcpy(key, w->pfx, w->npfx);
	i = (size_t)snprintf((char *)key + w->npfx, 24, lease < 0 ? "-%llx" : "%llx",
	                     (unsigned long long)(lease < 0 ? -(uint64_t)lease : (uint64_t)lease));
	w->key = key;
	w->nkey = w->npfx + i;
	w->next = k->locks;
	if (k->locks)
		k->locks->prev = w;
	k->locks = w;
	c->svc = w;
	return w;
}

static ProtobufCBinaryData lock_bin(const uint8_t *p, size_t n)
{
	ProtobufCBinaryData b;

	b.data = (uint8_t *)(uintptr_t)p;
	b.len = n;
	return b;
}

/* RangeRequest for the first-created key under w's prefix (etcd's
 * WithFirstCreate), or with max_create the last-created before it
 * (waitDeletes' WithLastCreate + WithMaxCreateRev). */
static void lock_top(const struct lock_wait *w, Etcdserverpb__RangeRequest *r, int64_t max_create)
{
	etcdserverpb__range_request__init(r);
	r->key = lock_bin(w->pfx, w->npfx);
	r->range_end = lock_bin(w->end, w->npfx);
	r->limit = 1;
	r->sort_target = ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__CREATE;
	r->sort_order = max_create ? ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__DESCEND
	                           : ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__ASCEND;
	r->max_create_revision = max_create;
}

/* One read-only step: range r as the caller.  *kv the first key or NULL. */
static int lock_get(struct kvd *k, struct call *c, Etcdserverpb__RangeRequest *r, struct svc_pool *pl,
                    Etcdserverpb__ResponseHeader *h, Mvccpb__KeyValue **kv, struct svc_err *e)
{
	Etcdserverpb__TxnRequest t = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__TxnResponse rs;
	Etcdserverpb__RequestOp op = ETCDSERVERPB__REQUEST_OP__INIT, *ops[1] = {&op};
	Etcdserverpb__RangeResponse *rr;

	op.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
	op.request_range = r;
	t.success = ops;
	t.n_success = 1;
	if (lock_txn(k, c, &t, pl, &rs, h, e))
		return KVD_EINVAL;
	rr = rs.responses[0]->response_range;
	*kv = rr->n_kvs ? rr->kvs[0] : NULL;
	return 0;
}

/* A guarded write of w's key: put value (put) or delete it, if its create
 * revision is still `rev` (0: if it does not exist).  *ok: the guard held;
 * with get, the failure branch reads the key (Campaign). */
static int lock_guarded(struct kvd *k, struct call *c, const struct lock_wait *w, int64_t rev, int put,
                        ProtobufCBinaryData value, int get, struct svc_pool *pl, Etcdserverpb__TxnResponse *rs,
                        Etcdserverpb__ResponseHeader *h, struct svc_err *e)
{
	Etcdserverpb__TxnRequest t = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT, *cmps[1] = {&cmp};
	Etcdserverpb__RequestOp yes = ETCDSERVERPB__REQUEST_OP__INIT, no = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__RequestOp top = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__RequestOp *ys[2] = {&yes, &top}, *ns[2] = {&no, &top};
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
	Etcdserverpb__DeleteRangeRequest d = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
	Etcdserverpb__RangeRequest g = ETCDSERVERPB__RANGE_REQUEST__INIT, first;

	cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE;
	cmp.key = lock_bin(w->key, w->nkey);
	cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
	cmp.create_revision = rev;
	t.compare = cmps;
	t.n_compare = 1;
	if (put) {
		p.key = cmp.key;
		p.value = value;
		p.lease = w->lease;
		yes.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
		yes.request_put = &p;
	} else {
		d.key = cmp.key;
		yes.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE;
		yes.request_delete_range = &d;
	}
	t.success = ys;
	t.n_success = 1;
	if (get) { /* Lock and Campaign: else get ours; Lock: and the first-created in both */
		g.key = cmp.key;
		no.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
		no.request_range = &g;
		t.failure = ns;
		t.n_failure = 1;
		if (get > 1) {
			lock_top(w, &first, 0);
			top.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
			top.request_range = &first;
			t.n_success = t.n_failure = 2;
		}
	}
	if (lock_txn(k, c, &t, pl, rs, h, e))
		return KVD_EINVAL;
	if (rs->n_responses && c)
		c->wrote |= rs->succeeded;
	return 0;
}

/* Is anything under w's prefix created before w's key?  1 yes, 0 no, or
 * KVD_EINVAL (e).  h: the header of that read. */
static int lock_blocked(struct kvd *k, struct lock_wait *w, struct svc_pool *pl, Etcdserverpb__ResponseHeader *h,
                        struct svc_err *e)
{
	Etcdserverpb__RangeRequest r;
	Mvccpb__KeyValue *kv;

	lock_top(w, &r, w->rev - 1);
	if (w->rev <= 1)
		return 0;
	if (lock_get(k, w->c, &r, pl, h, &kv, e))
		return KVD_EINVAL;
	return kv != NULL;
}

/* w holds its lock or leads its election: the answer. */
static void lock_won(struct kvd *k, struct lock_wait *w, Etcdserverpb__ResponseHeader *h)
{
	w->done = 1;
	if (w->kind == LOCK_LOCK) {
		V3lockpb__LockResponse rs = V3LOCKPB__LOCK_RESPONSE__INIT;
		rs.header = h;
		rs.key = lock_bin(w->key, w->nkey);
		call_reply(k, w->c, &rs.base);
	} else {
		V3electionpb__CampaignResponse rs = V3ELECTIONPB__CAMPAIGN_RESPONSE__INIT;
		V3electionpb__LeaderKey lk = V3ELECTIONPB__LEADER_KEY__INIT;
		lk.name = w->name;
		lk.key = lock_bin(w->key, w->nkey);
		lk.rev = w->rev;
		lk.lease = w->lease;
		rs.header = &w->hdr;
		rs.leader = &lk;
		call_reply(k, w->c, &rs.base);
	}
}

static void lock_fail(struct kvd *k, struct lock_wait *w, const struct svc_err *e)
{
	w->done = 1;
	call_finish(k, w->c, e->code, "%s", e->msg);
}

/* A waiter after a batch (or at once): still ours, and still blocked? */
static void lock_check(struct kvd *k, struct lock_wait *w)
{
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	Etcdserverpb__ResponseHeader h;
	ProtobufCBinaryData key = lock_bin(w->key, w->nkey);
	const struct mvcc_key *r = svc_live(k, &key);
	int b;

	if (!r || mvcc_k_create(&k->db, r) != w->rev) { /* its lease is gone, or someone deleted it */
		e.code = GRPC_UNKNOWN;
		e.msg = "session expired";
		lock_fail(k, w, &e);
	} else if ((b = lock_blocked(k, w, &pl, &h, &e)) < 0) {
		lock_fail(k, w, &e);
	} else if (!b) {
		svc_header(k, &h, 1);
		lock_won(k, w, &h);
	}
	svc_pool_free(&pl);
}

/* ---- Observe ------------------------------------------------------------ */

/* Send the election's leader if it changed since the last one sent. */
static void lock_observe(struct kvd *k, struct lock_wait *w)
{
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	Etcdserverpb__RangeRequest r;
	Etcdserverpb__ResponseHeader h;
	Mvccpb__KeyValue *kv;

	lock_top(w, &r, 0);
	if (lock_get(k, w->c, &r, &pl, &h, &kv, &e)) {
		lock_fail(k, w, &e);
	} else if (kv && (kv->create_revision != w->seen_create || kv->mod_revision != w->seen_mod)) {
		V3electionpb__LeaderResponse rs = V3ELECTIONPB__LEADER_RESPONSE__INIT;
		rs.header = &h;
		rs.kv = kv;
		w->seen_create = kv->create_revision;
		w->seen_mod = kv->mod_revision;
		call_send(k, w->c, &rs.base);
	}
	svc_pool_free(&pl);
}

/* After each durable batch: waiters look again; observers send what changed. */
static void lock_batch(struct kvd *k)
{
	struct lock_wait *w, *next;

	for (w = k->locks; w; w = next) {
		next = w->next;
		if (w->done || w->c->finished)
			continue;
		if (w->kind == LOCK_OBSERVE)
			lock_observe(k, w);
		else
			lock_check(k, w);
	}
}

/* The call goes away: a waiter that never got its answer takes its key
 * back (etcd's Unlock / Resign when the wait fails). */
static void lock_close(struct kvd *k, struct call *c)
{
	struct lock_wait *w = c->svc;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	Etcdserverpb__TxnResponse rs;
	Etcdserverpb__ResponseHeader h;
	ProtobufCBinaryData none = {0, NULL};

	if (!w)
		return;
	if (!w->done && w->kind != LOCK_OBSERVE && w->rev && !svc_writable(k, &e, MVCC_REC_HDR + 32 + w->nkey))
		lock_guarded(k, c, w, w->rev, 0, none, 0, &pl, &rs, &h, &e);
	svc_pool_free(&pl);
	c->svc = NULL;
	lock_free(k, w);
}

/* Shutdown: a Lock or Campaign still waiting is a wait, not work: it ends
 * now (its key is taken back as the call goes, lock_close). */
static void lock_shutdown(struct kvd *k, struct call *c)
{
	const struct lock_wait *w = c->svc;

	if (w && !w->done)
		call_finish(k, c, GRPC_UNAVAILABLE, "%s", E_STOPPING);
}

/* ---- the RPCs ----------------------------------------------------------- */

static void lock_lock_rpc(struct kvd *k, struct call *c)
{
	const V3lockpb__LockRequest *rq = (const void *)c->rq;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	Etcdserverpb__TxnResponse rs;
	Etcdserverpb__ResponseHeader h;
	Etcdserverpb__RangeResponse *mine, *top;
	ProtobufCBinaryData empty = {0, NULL};
	struct lock_wait *w;
	int64_t lease = rq->lease;

	if (lock_session(k, c, &lease, &e)) {
		call_finish(k, c, e.code, "%s", e.msg);
		return;
	}
	if (!(w = lock_new(k, c, LOCK_LOCK, &rq->name, lease))) {
		call_finish(k, c, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return;
	}
	if (!lock_guarded(k, c, w, 0, 1, empty, 2, &pl, &rs, &h, &e)) {
		mine = rs.succeeded ? NULL : rs.responses[0]->response_range;
		top = rs.responses[1]->response_range;
		w->rev = mine ? (mine->n_kvs ? mine->kvs[0]->create_revision : 0) : h.revision;
		if (!top->n_kvs || top->kvs[0]->create_revision == w->rev)
			lock_won(k, w, &h);
		/* else it waits: lock_batch looks again after each batch */
	} else {
		w->done = 1;
		call_finish(k, c, e.code, "%s", e.msg);
	}
	svc_pool_free(&pl);
}

static void lock_unlock_rpc(struct kvd *k, struct call *c)
{
	const V3lockpb__UnlockRequest *rq = (const void *)c->rq;
	Etcdserverpb__TxnRequest t = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__RequestOp op = ETCDSERVERPB__REQUEST_OP__INIT, *ops[1] = {&op};
	Etcdserverpb__DeleteRangeRequest d = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
	V3lockpb__UnlockResponse out = V3LOCKPB__UNLOCK_RESPONSE__INIT;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	Etcdserverpb__TxnResponse rs;
	Etcdserverpb__ResponseHeader h;

	d.key = rq->key;
	op.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE;
	op.request_delete_range = &d;
	t.success = ops;
	t.n_success = 1;
	if (lock_txn(k, c, &t, &pl, &rs, &h, &e)) {
		call_finish(k, c, e.code, "%s", e.msg);
	} else {
		c->wrote = rs.responses[0]->response_delete_range->deleted > 0;
		out.header = &h;
		call_reply(k, c, &out.base);
	}
	svc_pool_free(&pl);
}

static void lock_campaign_rpc(struct kvd *k, struct call *c)
{
	const V3electionpb__CampaignRequest *rq = (const void *)c->rq;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	Etcdserverpb__TxnResponse rs, rs2;
	Etcdserverpb__ResponseHeader h, h2;
	struct lock_wait *w;
	int64_t lease = rq->lease;
	int b;

	if (lock_session(k, c, &lease, &e)) {
		call_finish(k, c, e.code, "%s", e.msg);
		return;
	}
	if (!(w = lock_new(k, c, LOCK_CAMPAIGN, &rq->name, lease))) {
		call_finish(k, c, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return;
	}
	w->done = 1; /* until the key is ours */
	if (!lock_guarded(k, c, w, 0, 1, rq->value, 1, &pl, &rs, &h, &e)) {
		w->hdr = h;
		w->rev = h.revision;
		if (!rs.succeeded) {
			const Mvccpb__KeyValue *kv = rs.responses[0]->response_range->kvs[0];
			w->rev = kv->create_revision;
			if ((kv->value.len != rq->value.len || (kv->value.len && memcmp(kv->value.data, rq->value.data,
			                                                               kv->value.len))) &&
			    (lock_guarded(k, c, w, w->rev, 1, rq->value, 0, &pl, &rs2, &h2, &e) ||
			     (!rs2.succeeded && !svc_fail(&e, GRPC_UNKNOWN, "election: not leader")))) {
				ProtobufCBinaryData none = {0, NULL};
				struct svc_err e2 = {0, NULL};
				lock_guarded(k, c, w, w->rev, 0, none, 0, &pl, &rs2, &h2, &e2); /* Resign */
			}
		}
		w->done = 0;
		if (!e.msg && (b = lock_blocked(k, w, &pl, &h2, &e)) == 0)
			lock_won(k, w, &w->hdr);
	}
	if (e.msg) {
		w->done = 1;
		call_finish(k, c, e.code, "%s", e.msg);
	}
	svc_pool_free(&pl);
}

/* A LeaderKey as the recipes resume it (concurrency.ResumeElection). */
static int lock_resume(struct kvd *k, struct call *c, const V3electionpb__LeaderKey *lk, struct lock_wait *w,
                       struct svc_err *e)
{
	memset(w, 0, sizeof *w);
	if (!lk)
		return svc_fail(e, GRPC_UNKNOWN, "\"leader\" field must be provided");
	w->c = c;
	w->key = lk->key.data;
	w->nkey = lk->key.len;
	w->rev = lk->rev;
	w->lease = lk->lease;
	return lock_session(k, c, &w->lease, e);
}

static void lock_proclaim_rpc(struct kvd *k, struct call *c)
{
	const V3electionpb__ProclaimRequest *rq = (const void *)c->rq;
	V3electionpb__ProclaimResponse out = V3ELECTIONPB__PROCLAIM_RESPONSE__INIT;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	Etcdserverpb__TxnResponse rs;
	Etcdserverpb__ResponseHeader h;
	struct lock_wait w;

	if (!lock_resume(k, c, rq->leader, &w, &e) &&
	    !lock_guarded(k, c, &w, w.rev, 1, rq->value, 0, &pl, &rs, &h, &e) && !rs.succeeded)
		svc_fail(&e, GRPC_UNKNOWN, "election: not leader");
	out.header = &h;
	svc_end(k, c, &out.base, &e);
	svc_pool_free(&pl);
}

static void lock_resign_rpc(struct kvd *k, struct call *c)
{
	const V3electionpb__ResignRequest *rq = (const void *)c->rq;
	V3electionpb__ResignResponse out = V3ELECTIONPB__RESIGN_RESPONSE__INIT;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	Etcdserverpb__TxnResponse rs;
	Etcdserverpb__ResponseHeader h;
	ProtobufCBinaryData none = {0, NULL};
	struct lock_wait w;

	if (!lock_resume(k, c, rq->leader, &w, &e))
		lock_guarded(k, c, &w, w.rev, 0, none, 0, &pl, &rs, &h, &e);
	out.header = &h;
	svc_end(k, c, &out.base, &e);
	svc_pool_free(&pl);
}

static void lock_leader_rpc(struct kvd *k, struct call *c)
{
	const V3electionpb__LeaderRequest *rq = (const void *)c->rq;
	V3electionpb__LeaderResponse out = V3ELECTIONPB__LEADER_RESPONSE__INIT;
	struct svc_pool pl = {k, NULL, 0};
	struct svc_err e = {0, NULL};
	Etcdserverpb__RangeRequest r;
	Etcdserverpb__ResponseHeader h;
	Mvccpb__KeyValue *kv = NULL;
	struct lock_wait *w = lock_new(k, c, LOCK_OBSERVE, &rq->name, -1);

	if (!w) {
		call_finish(k, c, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return;
	}
	w->done = 1;
	lock_top(w, &r, 0);
	if (!lock_get(k, c, &r, &pl, &h, &kv, &e) && !kv)
		svc_fail(&e, GRPC_UNKNOWN, "election: no leader");
	out.header = &h;
	out.kv = kv;
	svc_end(k, c, &out.base, &e);
	svc_pool_free(&pl);
}

static void lock_observe_rpc(struct kvd *k, struct call *c)
{
	const V3electionpb__LeaderRequest *rq = (const void *)c->rq;
	struct lock_wait *w = lock_new(k, c, LOCK_OBSERVE, &rq->name, -1);

	if (!w) {
		call_finish(k, c, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return;
	}
	if (!k->db.w.len) /* else what the open batch shows is not durable yet: after its flush */
		lock_observe(k, w); /* the leader now, if any; then after each batch */
}
#endif /* KVD_NO_RECIPES */

/* ===== 27. Watch (watch_) ================================================ */

/*
 * etcd's Watch: many watchers per bidi stream.  A watcher owes its client
 * every matching event from w->next on.  Live events come from each batch of
 * records once it is durable (loop_log_flush -> watch_batch), so no watcher
 * ever sees a revision a crash could take back.  A watcher that starts in
 * the past, or whose stream's queue passed KVD_MAX_WATCH_QUEUE (a slow
 * reader), is "unsynced": it catches up by reading the log from w->next,
 * one response of at most 1000 revisions at a time, as the client's window
 * opens (the stream's on_produce).  Memory per stream stays bounded and no
 * event is lost; history compacted meanwhile cancels it as etcd does.
 *
 * Matching does not scan every watcher: single-key and prefix watchers sit
 * in one hash table keyed by their key; an event on key K probes K itself
 * and each prefix length some watcher uses.  Only arbitrary ranges,
 * from-key watchers and prefixes longer than WATCH_MAX_PREFIX are on a
 * list.
 *
 * Invariants:
 *   1. No watcher sees a revision a crash could take back: live events come
 *      only from watch_batch, which loop_log_flush calls after a successful
 *      mvcc_flush; catch-up reads no further than the log's durable end
 *      (m->size), and headers say m->rev_durable.
 *   2. w->next moves past an event it wants only once that event is
 *      queued (watch_live_record, watch_catchup) or the stream has ended (a
 *      failed call_send ends it); a watcher that cannot take one pauses at
 *      it (watch_pause) and catches up from the log.  None is lost, none
 *      sent twice (watch_wants: rev >= w->next).
 *   3. Bounded per stream: a queue past KVD_MAX_WATCH_QUEUE pauses its
 *      watchers instead of growing; catch-up runs only on an empty queue
 *      (watch_produce), reads at most WATCH_SCAN_BYTES a step, and keeps
 *      no read window (watch_catchup frees g->rbuf).
 *   4. g->total, ws->live and the owner's SHARE_WATCHERS change only in
 *      watch_register and watch_unregister; a watcher cancelled by
 *      compaction is unregistered once (watch_cancel_compacted) and keeps
 *      only its id (watch_free skips a dead one).
 *   5. Permission is checked once, at creation (auth_who, auth_may in
 *      watch_create); a refusal is etcd's created-and-canceled answer, not
 *      an error that ends the stream.
 */

/* A watcher, and the Watch stream (a call) that holds its watchers. */
struct watch_stream;
struct watch {
	struct watch_stream *ws;
	struct watch *hnext;           /* hash chain: key and prefix watchers */
	struct watch *gprev, *gnext;   /* the list of range and from-key watchers */
	int64_t id, seq;               /* watch id on its stream; creation order */
	int64_t next;                  /* first revision it still owes its client */
	int64_t start;                 /* the start_revision asked for (0: none) */
	uint64_t next_off;             /* catch-up: log offset to read next (0: look it up) */
	uint32_t next_gen;             /* the log's generation next_off belongs to */
	uint32_t klen, elen;
	uint8_t kind;
#if KVD_TEST_BUG == 4
	int64_t bug_compacted;       /* planted bug 4: the compaction last seen */
#endif
	unsigned noput : 1, nodelete : 1, prev_kv : 1, progress : 1, fragment : 1;
	unsigned synced : 1;           /* live events reach it; else it catches up from the log */
	unsigned sent : 1;             /* events since the last progress tick */
	unsigned dead : 1;             /* cancelled by compaction: only its id remains, as in etcd */
	uint8_t key[];                 /* key, then range end */
};
struct watch_stream {
	struct call *s;
	struct watch_stream *prev, *next;
	struct watch **w;
	struct share *owner;           /* its user (auth on) or its address: --max-watchers' fair shares */
	size_t live;                   /* its watchers registered (ids of dead ones stay in w) */
	size_t n, cap, unsynced, rr;
	int64_t next_id;
	int64_t progress_at;
};

#ifdef KVD_TEST_SERVICES
static size_t watch_unsynced(const struct kvd *k)
{
	const struct watch_stream *ws;
	size_t n = 0;

	for (ws = k->watch.streams; ws; ws = ws->next)
		n += ws->unsynced;
	return n;
}
#endif

#ifndef KVD_MAX_WATCH_QUEUE /* @@ queued bytes on a watch stream before its watchers pause */
#define KVD_MAX_WATCH_QUEUE (256 * 1024)
#endif
#ifndef KVD_MAX_WATCHERS /* @@ watchers in all (--max-watchers default) */
#define KVD_MAX_WATCHERS 100000
#endif
#define WATCH_BATCH_REVS 1000     /* revisions per catch-up response, as etcd */
#define WATCH_SCAN_BYTES (1 << 20) /* log read per catch-up step */
#define WATCH_MAX_PREFIX 1024     /* longer prefixes go to the range list */

enum { WATCH_KEY, WATCH_PREFIX, WATCH_RANGE, WATCH_FROM };

/* One event read back from a record (key and value point into the record). */
struct watch_ev {
	int type; /* MVCC_OP_PUT / MVCC_OP_DEL */
	const uint8_t *key, *val;
	size_t klen, vlen;
	int64_t rev, create, ver, lease;
	uint64_t prev; /* log offset of the key's previous op + 1 */
	size_t eoff[2], elen[2]; /* packed Event without/with prev_kv in g->enc; elen 0: not yet */
};

struct watch_hit { /* watcher w wants event ev of the current record */
	struct watch *w;
	int ev;
};

static uint64_t watch_hash(const uint8_t *p, size_t n)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	while (n--)
		h = (h ^ *p++) * 1099511628211ull;
	return h;
}

static int watch_reg_grow(struct kvd *k)
{
	struct watch_reg *g = &k->watch;
	size_t sz = g->mask ? (g->mask + 1) * 2 : 64, i;
	struct watch **t = kvd_calloc(k, sz * sizeof *t), *w, *next;

	if (!t)
		return KVD_ENOMEM;
	for (i = 0; g->tab && i <= g->mask; i++)
		for (w = g->tab[i]; w; w = next) {
			next = w->hnext;
			w->hnext = t[watch_hash(w->key, w->klen) & (sz - 1)];
			t[watch_hash(w->key, w->klen) & (sz - 1)] = w;
		}
	kvd_free(k, g->tab);
	g->tab = t;
	g->mask = sz - 1;
	return 0;
}

static int watch_register(struct kvd *k, struct watch *w)
{
	struct watch_reg *g = &k->watch;
	struct watch **b;

	if (w->kind == WATCH_KEY || w->kind == WATCH_PREFIX) {
		if ((!g->tab || g->nhashed + 1 > g->mask + 1) && watch_reg_grow(k))
			return KVD_ENOMEM;
		if (w->kind == WATCH_PREFIX) {
			if (w->klen >= g->nplen) { /* exactly as long as the longest prefix: not util_grow */
				size_t n = w->klen + 1;
				uint32_t *pl = kvd_realloc(k, g->plen, n * sizeof *pl);
				if (!pl)
					return KVD_ENOMEM;
				memset(pl + g->nplen, 0, (n - g->nplen) * sizeof *pl);
				g->plen = pl;
				g->nplen = n;
			}
			g->plen[w->klen]++;
		}
		b = &g->tab[watch_hash(w->key, w->klen) & g->mask];
		w->hnext = *b;
		*b = w;
		g->nhashed++;
	} else {
		w->gnext = g->ranges;
		w->gprev = NULL;
		if (g->ranges)
			g->ranges->gprev = w;
		g->ranges = w;
	}
	g->total++;
	w->ws->live++;
	if (w->ws->owner)
		w->ws->owner->n[SHARE_WATCHERS]++;
	return 0;
}

static void watch_unregister(struct kvd *k, struct watch *w)
{
	struct watch_reg *g = &k->watch;
	struct watch **b;

	if (w->kind == WATCH_KEY || w->kind == WATCH_PREFIX) {
		for (b = &g->tab[watch_hash(w->key, w->klen) & g->mask]; *b; b = &(*b)->hnext)
			if (*b == w) {
				*b = w->hnext;
				break;
			}
		if (w->kind == WATCH_PREFIX)
			g->plen[w->klen]--;
		g->nhashed--;
	} else {
		if (w->gprev)
			w->gprev->gnext = w->gnext;
		else
			g->ranges = w->gnext;
		if (w->gnext)
			w->gnext->gprev = w->gprev;
	}
	g->total--;
	w->ws->live--;
	if (w->ws->owner)
		w->ws->owner->n[SHARE_WATCHERS]--;
}

static int watch_matches(const struct watch *w, const uint8_t *key, size_t n)
{
	switch (w->kind) {
	case WATCH_KEY: return w->klen == n && !memcmp(w->key, key, n);
	case WATCH_PREFIX: return w->klen <= n && !memcmp(w->key, key, w->klen);
	case WATCH_FROM: return mvcc_cmp(key, n, w->key, w->klen) >= 0;
	default:
		return mvcc_cmp(key, n, w->key, w->klen) >= 0 && mvcc_cmp(key, n, w->key + w->klen, w->elen) < 0;
	}
}

/* ---- records to events ---------------------------------------------------- */

/* The key events of a decoded TXN record into k->watch.evs (through the
 * log's own decoder; lease ops are not events).  0 or KVD_E*. */
static int watch_decode(struct kvd *k, struct mvcc_rec *rec)
{
	struct watch_reg *g = &k->watch;
	struct mvcc_op op;
	const char *why;
	int r;

	g->nevs = 0;
	g->enc.len = g->hdr_len = 0;
	/* as large as the largest record, never more (not util_grow): one range
	 * delete is one record, and this scratch is kept */
	if (rec->nops > g->evcap) {
		struct watch_ev *e = kvd_realloc(k, g->evs, rec->nops * sizeof *e);
		if (!e)
			return KVD_ENOMEM;
		g->evs = e;
		g->evcap = rec->nops;
	}
	while ((r = mvcc_rec_op(rec, &op, &why)) == 1) {
		struct watch_ev *e = &g->evs[g->nevs];
		if (op.kind != MVCC_OP_PUT && op.kind != MVCC_OP_DEL)
			continue;
		e->type = (int)op.kind;
		e->key = op.key;
		e->val = op.val;
		e->klen = op.klen;
		e->vlen = op.vlen;
		e->rev = op.rev;
		e->create = op.create;
		e->ver = op.ver;
		e->lease = op.lease;
		e->prev = op.prev;
		e->elen[0] = e->elen[1] = 0;
		g->nevs++;
	}
	return r;
}

/* The previous kv of an event, as etcd's Range at mod_revision - 1 gives it. */
static int watch_prev_kv(struct kvd *k, struct svc_pool *pl, const struct watch_ev *e, Mvccpb__KeyValue **out)
{
	struct mvcc_op op;
	Mvccpb__KeyValue *kv;
	uint8_t *v = NULL;

	*out = NULL;
	if (!e->prev || (e->type == MVCC_OP_PUT && e->ver == 1) || e->rev - 1 < k->db.compacted)
		return 0;
	/* the key as of rev - 1: skip earlier ops of the same txn */
	for (op.prev = e->prev, op.rev = e->rev; op.rev >= e->rev;)
		if (!op.prev || mvcc_read_op(&k->db, op.prev - 1, &op))
			return 0;
	if (op.kind != MVCC_OP_PUT)
		return 0;
	if (!(kv = svc_alloc(pl, sizeof *kv)) || (op.vlen && !(v = svc_alloc(pl, op.vlen))))
		return KVD_ENOMEM;
	if (op.vlen && mvcc_pread(&k->db, v, op.vlen, op.voff))
		return 0;
	mvccpb__key_value__init(kv);
	kv->key.data = (uint8_t *)e->key;
	kv->key.len = e->klen;
	kv->create_revision = op.create;
	kv->mod_revision = op.rev;
	kv->version = op.ver;
	kv->lease = op.lease;
	kv->value.data = v;
	kv->value.len = op.vlen;
	*out = kv;
	return 0;
}

static void watch_header(struct kvd *k, Etcdserverpb__ResponseHeader *h, int64_t rev)
{
	svc_header(k, h, 0);
	h->revision = rev;
}

/* Send a response, in fragments when the watcher asked and it is big. */
static int watch_send(struct kvd *k, struct watch *w, Etcdserverpb__WatchResponse *r)
{
	struct call *s = w->ws->s;
	size_t total, i, at, n;
	Mvccpb__Event **all;

	if (!w->fragment || r->n_events < 2 ||
	    (total = protobuf_c_message_get_packed_size(&r->base)) < k->cfg.max_request_bytes)
		return call_send(k, s, &r->base);
	(void)total;
	all = r->events;
	n = r->n_events;
	r->fragment = 1;
	for (at = 0; at < n;) { /* etcd's sendFragments: grow until the next event would reach the limit */
		r->events = all + at;
		r->n_events = 0;
		for (i = at; i < n; i++) {
			r->n_events++;
			if (r->n_events > 1 && protobuf_c_message_get_packed_size(&r->base) >= k->cfg.max_request_bytes) {
				r->n_events--;
				break;
			}
		}
		at += r->n_events;
		r->fragment = at < n;
		if (call_send(k, s, &r->base))
			return KVD_ENOMEM;
	}
	return 0;
}

/* An event as protobuf-c structs; key and value point where the caller says. */
static void watch_ev_pb(const struct watch_ev *x, const uint8_t *key, const uint8_t *val, Mvccpb__Event *e,
                        Mvccpb__KeyValue *kv)
{
	mvccpb__event__init(e);
	mvccpb__key_value__init(kv);
	kv->key.data = (uint8_t *)key;
	kv->key.len = x->klen;
	kv->mod_revision = x->rev;
	if (x->type == MVCC_OP_PUT) {
		kv->create_revision = x->create;
		kv->version = x->ver;
		kv->lease = x->lease;
		kv->value.data = (uint8_t *)val;
		kv->value.len = x->vlen;
	} else {
		e->type = MVCCPB__EVENT__EVENT_TYPE__DELETE;
	}
	e->kv = kv;
}

/* Build and send one response for w with the events hits[0..n) name. */
static int watch_emit(struct kvd *k, struct watch *w, const struct watch_hit *hits, size_t n, int64_t hdr_rev)
{
	Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_pool pl = {k, NULL, 0};
	Mvccpb__Event **ev, *e;
	Mvccpb__KeyValue *kv;
	size_t i;
	int rc = 0;

	ev = svc_alloc(&pl, n * sizeof *ev);
	e = svc_alloc(&pl, n * sizeof *e);
	kv = svc_alloc(&pl, n * sizeof *kv);
	if (!ev || !e || !kv) {
		rc = KVD_ENOMEM;
		goto out;
	}
	for (i = 0; i < n; i++) {
		const struct watch_ev *x = &k->watch.evs[hits[i].ev];
		watch_ev_pb(x, x->key, x->val, &e[i], &kv[i]);
		if (w->prev_kv && (rc = watch_prev_kv(k, &pl, x, &e[i].prev_kv)))
			goto out;
		ev[i] = &e[i];
	}
	watch_header(k, &h, hdr_rev);
	r.header = &h;
	r.watch_id = w->id;
	r.n_events = n;
	r.events = ev;
	rc = watch_send(k, w, &r);
	w->sent = 1;
out:
	svc_pool_free(&pl);
	return rc;
}

/* Pack a message at the end of g->enc; its offset and length. */
static int watch_enc_pack(struct kvd *k, const ProtobufCMessage *m, size_t *off, size_t *len)
{
	struct kvd_buf *b = &k->watch.enc;
	size_t n = protobuf_c_message_get_packed_size(m);

	if (buf_reserve(k, b, n))
		return KVD_ENOMEM;
	*off = b->len;
	*len = protobuf_c_message_pack(m, b->p + b->len);
	b->len += *len;
	return 0;
}

/* Event ev of the current record, packed (with its prev_kv if asked) once
 * per record however many watchers want it. */
static int watch_enc_event(struct kvd *k, int ev, int with_prev)
{
	struct watch_ev *x = &k->watch.evs[ev];
	Mvccpb__Event e;
	Mvccpb__KeyValue kv;
	struct svc_pool pl = {k, NULL, 0};
	int rc;

	if (x->elen[with_prev])
		return 0;
	watch_ev_pb(x, x->key, x->val, &e, &kv);
	rc = with_prev ? watch_prev_kv(k, &pl, x, &e.prev_kv) : 0;
	if (!rc)
		rc = watch_enc_pack(k, &e.base, &x->eoff[with_prev], &x->elen[with_prev]);
	svc_pool_free(&pl);
	return rc;
}

/* WatchResponse's fields the live path writes (rpc.proto; test/test.c holds
 * them to protobuf-c's descriptor). */
enum { WATCH_F_HEADER = 1, WATCH_F_WATCH_ID = 2, WATCH_F_EVENTS = 11 };

/* The live path: a WatchResponse {header, watch_id, events} assembled from
 * bytes packed once per record (field order as protobuf-c packs it), so a
 * thousand watchers of one key cost a thousand memcpy, not a thousand packs.
 * The record's header is at enc[0..hdr_len) (watch_live_record packs it
 * first).  Fragmenting watchers with big responses take watch_emit. */
static int watch_emit_live(struct kvd *k, struct watch *w, const struct watch_hit *hits, size_t n, int64_t rev)
{
	struct watch_reg *g = &k->watch;
	struct call *s = w->ws->s;
	size_t i, total;
	uint8_t *p;

	total = pb_lenhdr_size(WATCH_F_HEADER, g->hdr_len) + g->hdr_len;
	if (w->id) /* int64: a negative one takes ten bytes */
		total += varint_len(WATCH_F_WATCH_ID << 3) + varint_len((uint64_t)w->id);
	for (i = 0; i < n; i++) {
		const struct watch_ev *x = &g->evs[hits[i].ev];
		if (watch_enc_event(k, hits[i].ev, w->prev_kv))
			return KVD_ENOMEM;
		total += pb_lenhdr_size(WATCH_F_EVENTS, x->elen[w->prev_kv]) + x->elen[w->prev_kv];
	}
	if (w->fragment && n > 1 && total >= k->cfg.max_request_bytes)
		return watch_emit(k, w, hits, n, rev);
	if (!(p = call_msg(k, s, total)))
		return KVD_ENOMEM;
	p = pb_put_lenhdr(p, WATCH_F_HEADER, g->hdr_len);
	memcpy(p, g->enc.p, g->hdr_len);
	p += g->hdr_len;
	if (w->id)
		p = pb_put_uint(p, WATCH_F_WATCH_ID, (uint64_t)w->id);
	for (i = 0; i < n; i++) {
		const struct watch_ev *x = &g->evs[hits[i].ev];
		p = pb_put_lenhdr(p, WATCH_F_EVENTS, x->elen[w->prev_kv]);
		memcpy(p, g->enc.p + x->eoff[w->prev_kv], x->elen[w->prev_kv]);
		p += x->elen[w->prev_kv];
	}
	KVD_ALWAYS(p == s->out.p + s->out.len);
	w->sent = 1;
	return 0;
}

/* Does this event interest w (filters)?  A watcher from the compaction
 * point gets its tombstones: etcd 3.5.16+ keeps them. */
static int watch_wants(const struct watch *w, const struct watch_ev *e)
{
	if (e->type == MVCC_OP_PUT ? w->noput : w->nodelete)
		return 0;
	return e->rev >= w->next;
}

static void watch_pause(struct kvd *k, struct watch *w, int64_t rev, uint64_t rec_off)
{
	if (!w->synced)
		return;
	w->synced = 0;
	w->next = rev;
	w->next_off = rec_off;
	w->next_gen = k->db.gen;
	w->ws->unsynced++;
	w->ws->s->produce = 1;
}

/* ---- live events: a durable batch ----------------------------------------- */

static int watch_hit_cmp(const void *a, const void *b)
{
	const struct watch_hit *x = a, *y = b;

	if (x->w != y->w) /* group by watcher, in creation order */
		return x->w->seq < y->w->seq ? -1 : 1;
	return x->ev - y->ev;
}

static int watch_add_hit(struct kvd *k, struct watch *w, int ev)
{
	struct watch_reg *g = &k->watch;

	if (UTIL_GROW(k, g->hits, g->hitcap, g->nhits + 1, 64))
		return KVD_ENOMEM;
	g->hits[g->nhits].w = w;
	g->hits[g->nhits].ev = ev;
	g->nhits++;
	return 0;
}

/* Every synced watcher that one event of the current record interests. */
static void watch_match(struct kvd *k, int ev)
{
	struct watch_reg *g = &k->watch;
	const struct watch_ev *e = &g->evs[ev];
	struct watch *w;
	size_t l;

	if (g->nhashed) {
		for (l = 0; l <= e->klen; l++) {
			if (l < e->klen && (l >= g->nplen || !g->plen[l]))
				continue; /* no prefix watcher of this length */
			for (w = g->tab[watch_hash(e->key, l) & g->mask]; w; w = w->hnext)
				if (w->klen == l && w->synced && (w->kind == WATCH_PREFIX || l == e->klen) &&
				    !memcmp(w->key, e->key, l) && watch_wants(w, e))
					watch_add_hit(k, w, ev);
		}
	}
	for (w = g->ranges; w; w = w->gnext)
		if (w->synced && watch_matches(w, e->key, e->klen) && watch_wants(w, e))
			watch_add_hit(k, w, ev);
}

/* One durable TXN record: one response per interested watcher, header
 * revision = the record's. */
static void watch_live_record(struct kvd *k, struct mvcc_rec *rec)
{
	struct watch_reg *g = &k->watch;
	Etcdserverpb__ResponseHeader h;
	int64_t rev = rec->rev;
	size_t i, j, hoff;

	if (watch_decode(k, rec))
		return;
	g->nhits = 0;
	for (i = 0; i < g->nevs; i++)
		watch_match(k, (int)i);
	if (!g->nhits)
		return;
	watch_header(k, &h, rev);
	if (watch_enc_pack(k, &h.base, &hoff, &g->hdr_len))
		g->hdr_len = 0; /* every hit below pauses: catch-up retries later */
	if (g->nevs > 1) /* one event: each watcher has one hit already */
		qsort(g->hits, g->nhits, sizeof *g->hits, watch_hit_cmp);
	for (i = 0; i < g->nhits; i = j) {
		struct watch *w = g->hits[i].w;
		struct call *s = w->ws->s;
		for (j = i; j < g->nhits && g->hits[j].w == w; j++)
			;
		if (!w->synced)
			continue;
		if (BUF_LEN(&s->out) >= KVD_MAX_WATCH_QUEUE || s->finished) {
			watch_pause(k, w, rev, rec->off); /* a slow reader: catch up from the log later */
			continue;
		}
		if (!g->hdr_len || watch_emit_live(k, w, g->hits + i, j - i, rev))
			watch_pause(k, w, rev, rec->off);
		else
			w->next = mvcc_after(rev);
#if KVD_TEST_BUG == 4 /* planted: the first record after a compaction goes out twice */
		if (w->synced && w->bug_compacted != k->db.compacted) {
			w->bug_compacted = k->db.compacted;
			watch_emit_live(k, w, g->hits + i, j - i, rev);
		}
#endif
	}
}

/* A durable batch (what the last flush wrote at base): deliver its events. */
static void watch_batch(struct kvd *k, const uint8_t *p, size_t n, uint64_t base)
{
	struct mvcc_rec rec;
	const char *why;
	size_t at = 0;
	long len;

	if (!k->watch.total)
		return;
	while ((len = mvcc_frame(p + at, n - at, base + at, base + n, NULL, &rec, &why)) > 0) {
		if (rec.type == MVCC_REC_TXN && !mvcc_rec_decode(&rec, &why))
			watch_live_record(k, &rec);
		at += (size_t)len;
	}
}

/* ---- catch-up from the log ------------------------------------------------ */

/* Drop a watcher: its stream, the registry, memory. */
static void watch_free(struct kvd *k, struct watch *w)
{
	struct watch_stream *ws = w->ws;
	size_t i;

	for (i = 0; i < ws->n; i++)
		if (ws->w[i] == w) {
			memmove(ws->w + i, ws->w + i + 1, (ws->n - i - 1) * sizeof *ws->w);
			ws->n--;
			break;
		}
	if (!w->dead) {
		if (!w->synced)
			ws->unsynced--;
		watch_unregister(k, w);
	}
	kvd_free(k, w);
}

/* History compacted past w->next: etcd's answer, a cancel with the
 * compact revision.  etcd keeps the id on the stream (a later cancel is
 * answered, the id stays taken) but the watcher sees nothing more. */
static void watch_cancel_compacted(struct kvd *k, struct watch *w)
{
	Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;

	watch_header(k, &h, 0);
	r.header = &h;
	r.watch_id = w->id;
	r.canceled = 1;
	r.compact_revision = k->db.compacted;
	call_send(k, w->ws->s, &r.base);
	w->ws->unsynced--;
	watch_unregister(k, w);
	w->dead = 1;
	w->synced = 1;
}

/* Events of a catch-up response, copied out of the read window. */
struct watch_evlist {
	Mvccpb__Event **v;
	size_t n, cap;
};

/* Copy the events of the current record that w wants into l; 1 if any. */
static int watch_take_events(struct kvd *k, struct watch *w, struct svc_pool *pl, struct watch_evlist *l)
{
	struct watch_reg *g = &k->watch;
	size_t i;
	int any = 0;

	for (i = 0; i < g->nevs; i++) {
		const struct watch_ev *x = &g->evs[i];
		Mvccpb__Event *e;
		Mvccpb__KeyValue *kv;
		uint8_t *kb;
		if (!watch_matches(w, x->key, x->klen) || !watch_wants(w, x))
			continue;
		if (l->n == l->cap) {
			size_t nc = l->cap ? l->cap * 2 : 64;
			Mvccpb__Event **ne = svc_alloc(pl, nc * sizeof *ne);
			if (!ne)
				return KVD_ENOMEM;
			if (l->n)
				memcpy(ne, l->v, l->n * sizeof *ne);
			l->v = ne;
			l->cap = nc;
		}
		e = svc_alloc(pl, sizeof *e);
		kv = svc_alloc(pl, sizeof *kv);
		kb = svc_alloc(pl, x->klen + x->vlen + 1);
		if (!e || !kv || !kb)
			return KVD_ENOMEM;
		memcpy(kb, x->key, x->klen);
		memcpy(kb + x->klen, x->val, x->vlen);
		watch_ev_pb(x, kb, kb + x->klen, e, kv);
		if (w->prev_kv) {
			struct watch_ev copy = *x;
			copy.key = kb;
			if (watch_prev_kv(k, pl, &copy, &e->prev_kv))
				return KVD_ENOMEM;
		}
		l->v[l->n++] = e;
		any = 1;
	}
	return any;
}

/* Does the current record hold an event w wants? */
static int watch_any(struct kvd *k, const struct watch *w)
{
	size_t i;

	for (i = 0; i < k->watch.nevs; i++)
		if (watch_matches(w, k->watch.evs[i].key, k->watch.evs[i].klen) && watch_wants(w, &k->watch.evs[i]))
			return 1;
	return 0;
}

/*
 * One catch-up step for w: at most WATCH_BATCH_REVS revisions of its events
 * in one response (a txn is never split), reading at most WATCH_SCAN_BYTES
 * of log.  Its position is a log offset of the log's current generation; if
 * the log moved since, it is found again by revision.  Returns 1 when it
 * queued output (or ended the stream).
 */
static int watch_catchup(struct kvd *k, struct watch *w)
{
	struct mvcc *m = &k->db;
	struct watch_reg *g = &k->watch;
	Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	struct svc_pool pl = {k, NULL, 0};
	struct watch_evlist l = {NULL, 0, 0};
	struct mvcc_reader rd;
	struct mvcc_rec rec;
	const char *why;
	int64_t revs = 0, last = 0;
	uint64_t off;
	int e = 0, sent = 0;

	if (w->next < m->compacted) {
		watch_cancel_compacted(k, w);
		return 1;
	}
	if (!w->next_off || w->next_gen != m->gen) {
		w->next_off = mvcc_seek_rev(k, &k->watch.rbuf, w->next);
		w->next_gen = m->gen;
	}
	off = w->next_off;
	mvcc_reader_init(&rd, &g->rbuf, off, m->size, 1 << 16, NULL);
	while (off - w->next_off < WATCH_SCAN_BYTES && (e = mvcc_read_rec(k, &rd, &rec, &why)) == 1) {
		if (rec.type == MVCC_REC_TXN) {
			if ((e = mvcc_rec_decode(&rec, &why)) || (e = watch_decode(k, &rec)))
				break;
			if (revs == WATCH_BATCH_REVS && watch_any(k, w))
				break; /* the next response starts with this record */
			if ((e = watch_take_events(k, w, &pl, &l)) < 0)
				break;
			revs += e;
			e = 0;
			if (g->nevs) /* lease ops alone make no revision */
				last = rec.rev;
		}
		off = rd.off;
	}
	buf_free(k, &g->rbuf); /* the window is per step: nothing stays behind */
	if (e < 0) { /* records end at the durable end: anything else is damage */
		svc_pool_free(&pl);
		call_finish(k, w->ws->s, e == KVD_ENOMEM ? GRPC_RESOURCE_EXHAUSTED : GRPC_DATA_LOSS,
		            e == KVD_ENOMEM ? "kvd: out of memory" : "kvd: cannot read the log");
		return 1;
	}
	if (l.n) {
		watch_header(k, &h, m->rev_durable);
		r.header = &h;
		r.watch_id = w->id;
		r.n_events = l.n;
		r.events = l.v;
		watch_send(k, w, &r);
		w->sent = 1;
		sent = 1;
	}
	if (last)
		w->next = mvcc_after(last);
	w->next_off = off;
	if (off + MVCC_REC_HDR > m->size || w->next > m->rev_durable) { /* caught up: live from now on */
		w->synced = 1;
		w->next = KVD_MAX(w->next, mvcc_after(m->rev_durable));
		w->ws->unsynced--;
	}
	svc_pool_free(&pl);
	return sent;
}

/* The stream's producer: catch up its unsynced watchers, round-robin. */
static void watch_produce(struct kvd *k, struct call *s)
{
	struct watch_stream *ws = s->svc;
	size_t tries;

	if (!ws || !ws->unsynced) {
		s->produce = 0;
		return;
	}
	for (tries = 0; tries < ws->n && ws->unsynced && !BUF_LEN(&s->out) && !s->finished; tries++) {
		struct watch *w = ws->w[ws->rr++ % ws->n];
		if (!w->synced && !w->dead && watch_catchup(k, w))
			break;
	}
	if (!ws->unsynced)
		s->produce = 0;
	else if (!BUF_LEN(&s->out))
		util_wake_by(k, k->now); /* long stretches without matches: come back at once */
}

/* ---- the Watch RPC -------------------------------------------------------- */

static struct watch *watch_find(struct watch_stream *ws, int64_t id)
{
	size_t i;

	for (i = 0; i < ws->n; i++)
		if (ws->w[i]->id == id)
			return ws->w[i];
	return NULL;
}

static void watch_reply_ctrl(struct kvd *k, struct call *s, int64_t id, int created, int canceled,
                             const char *reason)
{
	Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;

	watch_header(k, &h, k->db.rev_durable);
	r.header = &h;
	r.watch_id = id;
	r.created = created;
	r.canceled = canceled;
	r.cancel_reason = (char *)(reason ? reason : "");
	call_send(k, s, &r.base);
}

static int watch_prefix_end(const uint8_t *key, size_t n, const uint8_t *end, size_t elen)
{
	size_t i = n;

	while (i && key[i - 1] == 0xff)
		i--;
	if (!i)
		return 0;
	return elen == i && !memcmp(end, key, i - 1) && end[i - 1] == key[i - 1] + 1;
}

/*
 * --max-watchers is full and stream ws wants one more (section 3's rule):
 * the share -- a user with auth on, else an address -- holding the most
 * watchers gives up its newest, from its stream holding the most, when it
 * holds at least two more than ws's share; within ws's own share, its
 * stream holding the most does, when that one holds at least two more than
 * ws.  The watcher given up is cancelled with a reason, as etcd cancels
 * one (clients watch again).  0 when there is room now.
 */
static int watch_make_room(struct kvd *k, struct watch_stream *ws)
{
	struct share *top = share_max(k, SHARE_WATCHERS);
	struct share *from = share_may_take(top, ws->owner, SHARE_WATCHERS, 2) ? top : ws->owner;
	struct watch_stream *o, *v = NULL;
	struct watch *w = NULL;
	size_t i;

	for (o = k->watch.streams; o; o = o->next)
		if (o != ws && o->owner == from && o->live && (!v || o->live > v->live))
			v = o;
	if (!v || (from == ws->owner && v->live < ws->live + 2))
		return KVD_ELIMIT;
	for (i = 0; i < v->n; i++)
		if (!v->w[i]->dead && (!w || v->w[i]->seq > w->seq))
			w = v->w[i];
	if (!w)
		return KVD_ELIMIT;
	watch_reply_ctrl(k, v->s, w->id, 0, 1, "kvd: watcher cancelled for a newcomer: --max-watchers is full and "
	                 "this one's user (or address) holds the most");
	watch_free(k, w);
	k->st.yields[YIELD_WATCHERS]++;
	return 0;
}

static void watch_create(struct kvd *k, struct call *s, struct watch_stream *ws,
                         const Etcdserverpb__WatchCreateRequest *c)
{
	static const uint8_t zero = 0;
	const uint8_t *key = c->key.len ? c->key.data : &zero, *end = c->range_end.data;
	size_t klen = c->key.len ? c->key.len : 1, elen = c->range_end.len, i;
	struct watch *w;
	int64_t id = c->watch_id;
	int kind;

	if (c->start_revision < 0) { /* etcd 3.5.24+: no watcher, an answer as for compacted history */
		watch_reply_ctrl(k, s, -1, 1, 1, E_COMPACTED);
		return;
	}
	{ /* etcd's isWatchPermitted: no error, a created+canceled answer */
		struct svc_err e = {0, NULL};
		struct auth_who who;
		ProtobufCBinaryData kb, eb;
		kb.data = (uint8_t *)key;
		kb.len = klen;
		eb = c->range_end;
		if (auth_who(k, s, &who, &e) || auth_may(k, &who, &kb, &eb, AUTH_R, &e)) {
			watch_reply_ctrl(k, s, -1, 1, 1, auth_watch_reason(&e));
			return;
		}
		if (!ws->owner && (s->conn || (k->auth.enabled && who.nlen))) { /* whose share its watchers are */
			ws->owner = k->auth.enabled && who.nlen ? share_get(k, 'u', (const uint8_t *)who.name, who.nlen)
			                                        : share_get(k, 'a', s->conn->src, sizeof s->conn->src);
			if (!ws->owner) {
				watch_reply_ctrl(k, s, -1, 1, 1, "kvd: out of memory");
				return;
			}
		}
	}
	if (!elen)
		kind = WATCH_KEY;
	else if (elen == 1 && end[0] == 0)
		kind = WATCH_FROM;
	else if (mvcc_cmp(key, klen, end, elen) >= 0) {
		watch_reply_ctrl(k, s, -1, 1, 1, "mvcc: watcher range is empty");
		return;
	} else
		kind = watch_prefix_end(key, klen, end, elen) && klen <= WATCH_MAX_PREFIX ? WATCH_PREFIX : WATCH_RANGE;
	if (!id) {
		while (watch_find(ws, ws->next_id))
			ws->next_id++;
		id = ws->next_id++;
	} else if (watch_find(ws, id)) {
		watch_reply_ctrl(k, s, -1, 1, 1, "mvcc: duplicate watch ID provided on the WatchStream");
		return;
	}
	if (k->watch.total >= k->cfg.max_watchers && watch_make_room(k, ws)) {
		watch_reply_ctrl(k, s, -1, 1, 1, "kvd: too many watchers (--max-watchers)");
		return;
	}
	if (UTIL_GROW(k, ws->w, ws->cap, ws->n + 1, 8)) {
		watch_reply_ctrl(k, s, -1, 1, 1, "kvd: out of memory");
		return;
	}
	w = kvd_calloc(k, sizeof *w + klen + (kind == WATCH_RANGE ? elen : 0));
	if (!w) {
		watch_reply_ctrl(k, s, -1, 1, 1, "kvd: out of memory");
		return;
	}
	w->ws = ws;
	w->id = id;
	w->seq = ++k->watch.seq;
	w->kind = (uint8_t)kind;
	w->klen = (uint32_t)klen;
	memcpy(w->key, key, klen);
	if (kind == WATCH_RANGE) {
		w->elen = (uint32_t)elen;
		memcpy(w->key + klen, end, elen);
	}
	for (i = 0; i < c->n_filters; i++) {
		if (c->filters[i] == ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NOPUT)
			w->noput = 1;
		else if (c->filters[i] == ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NODELETE)
			w->nodelete = 1;
	}
	w->prev_kv = c->prev_kv;
	w->progress = c->progress_notify;
	w->fragment = c->fragment;
	w->start = c->start_revision;
#if KVD_TEST_BUG == 4
	w->bug_compacted = k->db.compacted;
#endif
	w->next = c->start_revision ? c->start_revision : mvcc_after(k->db.rev_durable);
#if KVD_TEST_BUG == 3 /* planted: a watch resumed in history skips its start revision */
	if (c->start_revision > 1 && c->start_revision <= k->db.rev_durable)
		w->next++;
#endif
	w->synced = !c->start_revision || w->next > k->db.rev_durable; /* (the same but at the last revision) */
	if (watch_register(k, w)) {
		kvd_free(k, w);
		watch_reply_ctrl(k, s, -1, 1, 1, "kvd: out of memory");
		return;
	}
	ws->w[ws->n++] = w;
	watch_reply_ctrl(k, s, id, 1, 0, NULL);
	if (!w->synced) {
		ws->unsynced++;
		s->produce = 1;
	}
	if (w->progress && !ws->progress_at) {
		ws->progress_at = k->now + k->cfg.watch_progress_notify_ms;
		util_wake_by(k, ws->progress_at);
	}
}

/* etcd 3.7 answers a progress request only when the stream has watchers,
 * each caught up (a compacted one never is again) and none waiting for a
 * future start revision.  Events already due were queued before it. */
static int watch_all_synced(const struct kvd *k, const struct watch_stream *ws)
{
	size_t i;

	for (i = 0; i < ws->n; i++)
		if (ws->w[i]->dead || !ws->w[i]->synced || ws->w[i]->start > k->db.rev_durable)
			return 0;
	return ws->n > 0;
}

static void watch_on_msg(struct kvd *k, struct call *s)
{
	const Etcdserverpb__WatchRequest *rq = (const void *)s->rq;
	struct watch_stream *ws = s->svc;
	struct watch *w;

	if (!ws) {
		if (!(ws = kvd_calloc(k, sizeof *ws))) {
			call_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			return;
		}
		ws->s = s;
		ws->next = k->watch.streams;
		if (k->watch.streams)
			k->watch.streams->prev = ws;
		k->watch.streams = ws;
		s->svc = ws;
	}
	switch (rq->request_union_case) {
	case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST:
		watch_create(k, s, ws, rq->create_request);
		break;
	case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CANCEL_REQUEST:
		if ((w = watch_find(ws, rq->cancel_request->watch_id))) { /* unknown ids: no reply, as etcd */
			int64_t id = w->id;
			watch_free(k, w);
			watch_reply_ctrl(k, s, id, 0, 1, NULL);
		}
		break;
	case ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_PROGRESS_REQUEST:
#if KVD_TEST_BUG == 5 /* planted: progress one revision ahead of every event delivered (the next write's) */
		if (ws->n) {
			Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
			Etcdserverpb__ResponseHeader h;
			watch_header(k, &h, k->db.rev + 1);
			r.header = &h;
			r.watch_id = -1;
			call_send(k, s, &r.base);
		}
		break;
#endif
		if (watch_all_synced(k, ws)) /* else dropped, not deferred (etcd 3.7's progressIfSync) */
			watch_reply_ctrl(k, s, -1, 0, 0, NULL);
		break;
	default:
		break; /* etcd ignores what it does not know */
	}
}

static void watch_on_close(struct kvd *k, struct call *s)
{
	struct watch_stream *ws = s->svc;

	if (!ws)
		return;
	while (ws->n)
		watch_free(k, ws->w[ws->n - 1]);
	if (ws->prev)
		ws->prev->next = ws->next;
	else
		k->watch.streams = ws->next;
	if (ws->next)
		ws->next->prev = ws->prev;
	share_put(k, ws->owner);
	kvd_free(k, ws->w);
	kvd_free(k, ws);
	s->svc = NULL;
}

/* progress_notify: every interval, watchers that got no events since the
 * last tick and are synced get an empty response (etcd's elision rule). */
static void watch_timers(struct kvd *k)
{
	struct watch_stream *ws;
	size_t i;

	for (ws = k->watch.streams; ws; ws = ws->next) {
		if (!ws->progress_at)
			continue;
		if (k->now < ws->progress_at) {
			util_wake_by(k, ws->progress_at);
			continue;
		}
		ws->progress_at = 0;
		for (i = 0; i < ws->n; i++) {
			struct watch *w = ws->w[i];
			if (!w->progress || w->dead)
				continue;
			if (!w->sent && w->synced && w->start <= k->db.rev_durable && !ws->s->finished) {
				Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
				Etcdserverpb__ResponseHeader h;
				watch_header(k, &h, k->db.rev_durable);
				r.header = &h;
				r.watch_id = w->id;
				call_send(k, ws->s, &r.base);
			}
			w->sent = 0;
			ws->progress_at = k->now + k->cfg.watch_progress_notify_ms;
		}
		if (ws->progress_at)
			util_wake_by(k, ws->progress_at);
	}
}

static void watch_fini(struct kvd *k)
{
	kvd_free(k, k->watch.tab);
	kvd_free(k, k->watch.plen);
	kvd_free(k, k->watch.evs);
	kvd_free(k, k->watch.hits);
	buf_free(k, &k->watch.rbuf);
	buf_free(k, &k->watch.enc);
}

/* ===== 28. The method table: every RPC, routed by :path (svc_) =========== */

/*
 * Every RPC kvd serves, by gRPC :path: its request and response types
 * (protobuf-c descriptors), its handler and, for streams, its callbacks.
 * Carriers route through call_route (section 8) to svc_route: gRPC over
 * HTTP/2 (section 18) and the JSON gateway (section 33), which reads and
 * writes JSON by the types here; the fuzzers walk the table too, and
 * /metrics counts by a method's place in it (section 34).  What is not in
 * the table is Unimplemented, in grpc-go's words (call_route).  It comes
 * after every service so that it names only what is above it.  Shutdown's
 * rule for calls (svc_stop_call, svc_shutdown) ends the section.
 *
 * Invariants:
 *   1. Every entry has an on_msg: call_message calls it unchecked (no test
 *      checks the table; the protobuf fuzzer skips an entry without one).
 *      req is NULL only for the test methods (raw bytes: call_decode).
 *   2. svc_route matches a service name, then a method, exactly -- no
 *      prefix, no case folding -- and tells an unknown method of a known
 *      service from an unknown service (known_service), for grpc-go's
 *      texts.
 *   3. A method's number is its place in svc_services, service after
 *      service (svc_method_index, http1_metrics); only the first
 *      KVD_METRIC_METHODS are counted.
 *   4. At shutdown a stream ends at once, UNAVAILABLE, after its
 *      on_shutdown; a unary call keeps --shutdown-grace (svc_stop_call).
 */

static const struct grpc_method svc_kv[] = {
	{"/etcdserverpb.KV/Range", GRPC_UNARY, PB(etcdserverpb__range_request), PB(etcdserverpb__range_response), svc_range_rpc, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.KV/RangeStream", GRPC_SERVER_STREAM, PB(etcdserverpb__range_request), PB(etcdserverpb__range_stream_response), svc_rangestream_rpc, NULL, svc_rstream_close, svc_rstream_chunk, NULL},
	{"/etcdserverpb.KV/Put", GRPC_UNARY, PB(etcdserverpb__put_request), PB(etcdserverpb__put_response), svc_put_rpc, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.KV/DeleteRange", GRPC_UNARY, PB(etcdserverpb__delete_range_request), PB(etcdserverpb__delete_range_response), svc_delete_rpc, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.KV/Txn", GRPC_UNARY, PB(etcdserverpb__txn_request), PB(etcdserverpb__txn_response), svc_txn_rpc, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.KV/Compact", GRPC_UNARY, PB(etcdserverpb__compaction_request), PB(etcdserverpb__compaction_response), svc_compact_rpc, NULL, NULL, NULL, NULL},
};
#ifdef KVD_TEST_SERVICES
#endif
static const struct grpc_method svc_watch[] = {
	/* no on_half_close: the stream stays open after the client half-closes */
	{"/etcdserverpb.Watch/Watch", GRPC_BIDI, PB(etcdserverpb__watch_request), PB(etcdserverpb__watch_response), watch_on_msg, NULL, watch_on_close, watch_produce, NULL},
};
static const struct grpc_method svc_lease[] = {
	{"/etcdserverpb.Lease/LeaseGrant", GRPC_UNARY, PB(etcdserverpb__lease_grant_request), PB(etcdserverpb__lease_grant_response), svc_lease_grant_rpc, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Lease/LeaseRevoke", GRPC_UNARY, PB(etcdserverpb__lease_revoke_request), PB(etcdserverpb__lease_revoke_response), svc_lease_revoke_rpc, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Lease/LeaseKeepAlive", GRPC_BIDI, PB(etcdserverpb__lease_keep_alive_request), PB(etcdserverpb__lease_keep_alive_response), svc_lease_keepalive_msg, svc_lease_keepalive_end, NULL, NULL, NULL},
	{"/etcdserverpb.Lease/LeaseTimeToLive", GRPC_UNARY, PB(etcdserverpb__lease_time_to_live_request), PB(etcdserverpb__lease_time_to_live_response), svc_lease_ttl_rpc, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Lease/LeaseLeases", GRPC_UNARY, PB(etcdserverpb__lease_leases_request), PB(etcdserverpb__lease_leases_response), svc_lease_leases_rpc, NULL, NULL, NULL, NULL},
};
static const struct grpc_method svc_cluster[] = {
	{"/etcdserverpb.Cluster/MemberAdd", GRPC_UNARY, PB(etcdserverpb__member_add_request), PB(etcdserverpb__member_add_response), svc_member_add, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Cluster/MemberRemove", GRPC_UNARY, PB(etcdserverpb__member_remove_request), PB(etcdserverpb__member_remove_response), svc_member_remove, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Cluster/MemberUpdate", GRPC_UNARY, PB(etcdserverpb__member_update_request), PB(etcdserverpb__member_update_response), svc_member_update, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Cluster/MemberList", GRPC_UNARY, PB(etcdserverpb__member_list_request), PB(etcdserverpb__member_list_response), svc_member_list, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Cluster/MemberPromote", GRPC_UNARY, PB(etcdserverpb__member_promote_request), PB(etcdserverpb__member_promote_response), svc_member_promote, NULL, NULL, NULL, NULL},
};
static const struct grpc_method svc_maintenance[] = {
	{"/etcdserverpb.Maintenance/Alarm", GRPC_UNARY, PB(etcdserverpb__alarm_request), PB(etcdserverpb__alarm_response), svc_alarm, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Maintenance/Status", GRPC_UNARY, PB(etcdserverpb__status_request), PB(etcdserverpb__status_response), svc_status, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Maintenance/Defragment", GRPC_UNARY, PB(etcdserverpb__defragment_request), PB(etcdserverpb__defragment_response), svc_defrag, NULL, svc_defrag_close, NULL, NULL},
	{"/etcdserverpb.Maintenance/Hash", GRPC_UNARY, PB(etcdserverpb__hash_request), PB(etcdserverpb__hash_response), svc_hash, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Maintenance/HashKV", GRPC_UNARY, PB(etcdserverpb__hash_kvrequest), PB(etcdserverpb__hash_kvresponse), svc_hashkv, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Maintenance/Snapshot", GRPC_SERVER_STREAM, PB(etcdserverpb__snapshot_request), PB(etcdserverpb__snapshot_response), svc_snapshot_rpc, NULL, svc_snapshot_close, svc_snapshot_produce, NULL},
	{"/etcdserverpb.Maintenance/MoveLeader", GRPC_UNARY, PB(etcdserverpb__move_leader_request), PB(etcdserverpb__move_leader_response), svc_move_leader, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Maintenance/Downgrade", GRPC_UNARY, PB(etcdserverpb__downgrade_request), PB(etcdserverpb__downgrade_response), svc_downgrade, NULL, NULL, NULL, NULL},
};
#ifndef KVD_NO_AUTH
static const struct grpc_method svc_auth[] = {
	{"/etcdserverpb.Auth/AuthEnable", GRPC_UNARY, PB(etcdserverpb__auth_enable_request), PB(etcdserverpb__auth_enable_response), svc_auth_enable, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/AuthDisable", GRPC_UNARY, PB(etcdserverpb__auth_disable_request), PB(etcdserverpb__auth_disable_response), svc_auth_disable, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/AuthStatus", GRPC_UNARY, PB(etcdserverpb__auth_status_request), PB(etcdserverpb__auth_status_response), svc_auth_status, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/Authenticate", GRPC_UNARY, PB(etcdserverpb__authenticate_request), PB(etcdserverpb__authenticate_response), svc_auth_authenticate, NULL, auth_job_close, NULL, NULL},
	{"/etcdserverpb.Auth/UserAdd", GRPC_UNARY, PB(etcdserverpb__auth_user_add_request), PB(etcdserverpb__auth_user_add_response), svc_auth_user_add, NULL, auth_job_close, NULL, NULL},
	{"/etcdserverpb.Auth/UserGet", GRPC_UNARY, PB(etcdserverpb__auth_user_get_request), PB(etcdserverpb__auth_user_get_response), svc_auth_user_get, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/UserList", GRPC_UNARY, PB(etcdserverpb__auth_user_list_request), PB(etcdserverpb__auth_user_list_response), svc_auth_user_list, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/UserDelete", GRPC_UNARY, PB(etcdserverpb__auth_user_delete_request), PB(etcdserverpb__auth_user_delete_response), svc_auth_user_delete, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/UserChangePassword", GRPC_UNARY, PB(etcdserverpb__auth_user_change_password_request), PB(etcdserverpb__auth_user_change_password_response), svc_auth_user_passwd, NULL, auth_job_close, NULL, NULL},
	{"/etcdserverpb.Auth/UserGrantRole", GRPC_UNARY, PB(etcdserverpb__auth_user_grant_role_request), PB(etcdserverpb__auth_user_grant_role_response), svc_auth_user_grant, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/UserRevokeRole", GRPC_UNARY, PB(etcdserverpb__auth_user_revoke_role_request), PB(etcdserverpb__auth_user_revoke_role_response), svc_auth_user_revoke, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/RoleAdd", GRPC_UNARY, PB(etcdserverpb__auth_role_add_request), PB(etcdserverpb__auth_role_add_response), svc_auth_role_add, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/RoleGet", GRPC_UNARY, PB(etcdserverpb__auth_role_get_request), PB(etcdserverpb__auth_role_get_response), svc_auth_role_get, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/RoleList", GRPC_UNARY, PB(etcdserverpb__auth_role_list_request), PB(etcdserverpb__auth_role_list_response), svc_auth_role_list, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/RoleDelete", GRPC_UNARY, PB(etcdserverpb__auth_role_delete_request), PB(etcdserverpb__auth_role_delete_response), svc_auth_role_delete, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/RoleGrantPermission", GRPC_UNARY, PB(etcdserverpb__auth_role_grant_permission_request), PB(etcdserverpb__auth_role_grant_permission_response), svc_auth_role_grant, NULL, NULL, NULL, NULL},
	{"/etcdserverpb.Auth/RoleRevokePermission", GRPC_UNARY, PB(etcdserverpb__auth_role_revoke_permission_request), PB(etcdserverpb__auth_role_revoke_permission_response), svc_auth_role_revoke, NULL, NULL, NULL, NULL},
};
#endif
#ifndef KVD_NO_RECIPES
static const struct grpc_method svc_lock[] = {
	{"/v3lockpb.Lock/Lock", GRPC_UNARY, PB(v3lockpb__lock_request), PB(v3lockpb__lock_response), lock_lock_rpc, NULL, lock_close, NULL, lock_shutdown},
	{"/v3lockpb.Lock/Unlock", GRPC_UNARY, PB(v3lockpb__unlock_request), PB(v3lockpb__unlock_response), lock_unlock_rpc, NULL, NULL, NULL, NULL},
};
static const struct grpc_method svc_election[] = {
	{"/v3electionpb.Election/Campaign", GRPC_UNARY, PB(v3electionpb__campaign_request), PB(v3electionpb__campaign_response), lock_campaign_rpc, NULL, lock_close, NULL, lock_shutdown},
	{"/v3electionpb.Election/Proclaim", GRPC_UNARY, PB(v3electionpb__proclaim_request), PB(v3electionpb__proclaim_response), lock_proclaim_rpc, NULL, NULL, NULL, NULL},
	{"/v3electionpb.Election/Leader", GRPC_UNARY, PB(v3electionpb__leader_request), PB(v3electionpb__leader_response), lock_leader_rpc, NULL, lock_close, NULL, NULL},
	{"/v3electionpb.Election/Observe", GRPC_SERVER_STREAM, PB(v3electionpb__leader_request), PB(v3electionpb__leader_response), lock_observe_rpc, NULL, lock_close, NULL, NULL},
	{"/v3electionpb.Election/Resign", GRPC_UNARY, PB(v3electionpb__resign_request), PB(v3electionpb__resign_response), lock_resign_rpc, NULL, NULL, NULL, NULL},
};
#endif
static const struct grpc_method svc_health[] = {
	{"/grpc.health.v1.Health/Check", GRPC_UNARY, PB(grpc__health__v1__health_check_request), PB(grpc__health__v1__health_check_response), svc_health_check, NULL, NULL, NULL, NULL},
	{"/grpc.health.v1.Health/Watch", GRPC_SERVER_STREAM, PB(grpc__health__v1__health_check_request), PB(grpc__health__v1__health_check_response), svc_health_watch, NULL, NULL, NULL,
	 svc_health_watch_shutdown},
};
#ifdef KVD_TEST_SERVICES
/* Stats: kvd's own accounting, so tests can prove memory stays bounded. */
static void svc_test_stats(struct kvd *k, struct call *s)
{
	char out[1024];
	unsigned streams = 0;
	struct call *c;
	size_t at;

	for (c = k->calls; c; c = c->next)
		streams++;
	at = (size_t)snprintf(out, sizeof out, "mem=%zu peak=%zu conns=%u streams=%u watchers=%zu unsynced=%zu "
	                      "accepted=%llu refused=%llu refused-ip=%llu evicted=%llu goaway=%llu rst=%llu ", k->mem,
	                      k->mem_peak, k->nconns, streams, k->watch.total, watch_unsynced(k),
	                      (unsigned long long)k->st.conns_accepted, (unsigned long long)k->st.conns_refused,
	                      (unsigned long long)k->st.conns_refused_ip, (unsigned long long)k->st.conns_evicted,
	                      (unsigned long long)k->st.goaway_sent, (unsigned long long)k->st.rst_sent);
	if (k->confd)
		confd_report(k, out + at, sizeof out - at);
	if (!svc_test_raw(k, s, (const uint8_t *)out, strlen(out)))
		call_finish(k, s, GRPC_OK, "%s", "");
}

/* The allocation-failure sweep from outside (test/memory.py): the body is
 * a decimal n; the n-th allocation from now fails (0: none).  The answer
 * (allocations so far, bytes in use) is written before the count starts. */
static void svc_test_fail_alloc(struct kvd *k, struct call *s)
{
	char num[24], out[64];
	size_t n = KVD_MIN(s->raw.n, sizeof num - 1);
	unsigned long long v;

	memcpy(num, s->raw.p, n);
	num[n] = 0;
	v = strtoull(num, NULL, 10);
	snprintf(out, sizeof out, "nalloc=%llu mem=%zu", (unsigned long long)k->nalloc, k->mem);
	if (!svc_test_raw(k, s, (const uint8_t *)out, strlen(out)))
		call_finish(k, s, GRPC_OK, "%s", "");
	k->fail_at = v ? k->nalloc + v : 0;
}

static const struct grpc_method svc_test[] = { /* raw bytes in and out */
	{"/kvd.test.Test/FailAlloc", GRPC_UNARY, NULL, NULL, svc_test_fail_alloc, NULL, NULL, NULL, NULL},
	{"/kvd.test.Test/Stats", GRPC_UNARY, NULL, NULL, svc_test_stats, NULL, NULL, NULL, NULL},
	{"/kvd.test.Test/Echo", GRPC_UNARY, NULL, NULL, svc_test_echo, NULL, NULL, NULL, NULL},
	{"/kvd.test.Test/Fill", GRPC_UNARY, NULL, NULL, svc_test_fill, NULL, NULL, NULL, NULL},
	{"/kvd.test.Test/Stream", GRPC_SERVER_STREAM, NULL, NULL, svc_test_stream, NULL, NULL, NULL, NULL},
};
#endif

static const struct {
	const char *name;
	const struct grpc_method *m;
	size_t n;
} svc_services[] = {
	{"etcdserverpb.KV", svc_kv, KVD_COUNT(svc_kv)},
	{"etcdserverpb.Watch", svc_watch, KVD_COUNT(svc_watch)},
	{"etcdserverpb.Lease", svc_lease, KVD_COUNT(svc_lease)},
	{"etcdserverpb.Cluster", svc_cluster, KVD_COUNT(svc_cluster)},
	{"etcdserverpb.Maintenance", svc_maintenance, KVD_COUNT(svc_maintenance)},
#ifndef KVD_NO_AUTH /* left out, like the recipes below, an unknown service, as to grpc-go */
	{"etcdserverpb.Auth", svc_auth, KVD_COUNT(svc_auth)},
#endif
#ifndef KVD_NO_RECIPES /* left out, their names are unknown services, as to grpc-go */
	{"v3lockpb.Lock", svc_lock, KVD_COUNT(svc_lock)},
	{"v3electionpb.Election", svc_election, KVD_COUNT(svc_election)},
#endif
	{"grpc.health.v1.Health", svc_health, KVD_COUNT(svc_health)},
#ifdef KVD_TEST_SERVICES
	{"kvd.test.Test", svc_test, KVD_COUNT(svc_test)},
#endif
};

static const struct grpc_method *svc_route(const char *svc, size_t slen, const char *meth,
                                           size_t mlen, int *known_service)
{
	size_t i, j, nl;

	*known_service = 0;
	for (i = 0; i < KVD_COUNT(svc_services); i++) {
		nl = strlen(svc_services[i].name);
		if (nl != slen || memcmp(svc_services[i].name, svc, slen))
			continue;
		*known_service = 1;
		for (j = 0; j < svc_services[i].n; j++) {
			const char *path = svc_services[i].m[j].path + nl + 2; /* past "/svc/" */
			if (strlen(path) == mlen && !memcmp(path, meth, mlen))
				return &svc_services[i].m[j];
		}
		return NULL;
	}
	return NULL;
}

/* The method's place in the service tables (/metrics counts by it), -1 if
 * past KVD_METRIC_METHODS. */
static int svc_method_index(const struct grpc_method *m)
{
	size_t i, base = 0;

	for (i = 0; i < KVD_COUNT(svc_services); base += svc_services[i].n, i++)
		if (m >= svc_services[i].m && m < svc_services[i].m + svc_services[i].n)
			return base + (size_t)(m - svc_services[i].m) < KVD_METRIC_METHODS
			           ? (int)(base + (size_t)(m - svc_services[i].m)) : -1;
	return -1;
}

/*
 * Shutdown, as etcd's stop treats calls (its gRPC server closes every
 * transport at once; its gateway then ends each stream with "transport is
 * closing"): a stream -- Watch, LeaseKeepAlive, Observe, Snapshot, a Health
 * watch -- ends now, UNAVAILABLE, after its method had its say (Health
 * watchers see NOT_SERVING first); a unary call keeps --shutdown-grace to be
 * answered and made durable, unless its method ends it (a Lock or Campaign
 * still waiting).  A call that begins while kvd stops is treated the same
 * once its first message came (call_message).
 */
static void svc_stop_call(struct kvd *k, struct call *c)
{
	if (!c->m || c->finished)
		return;
	if (c->m->on_shutdown)
		c->m->on_shutdown(k, c);
	if (c->m->kind != GRPC_UNARY)
		call_finish(k, c, GRPC_UNAVAILABLE, "%s", E_STOPPING);
}

static void svc_shutdown(struct kvd *k)
{
	struct call *c;

	for (c = k->calls; c; c = c->next)
		svc_stop_call(k, c);
}

/* ===== 29. confd: Ganeti's UDP query protocol, keyspace mode (confd_) ==== */

/*
 * Ganeti's confd on UDP: a datagram is "plj0" + {"msg","salt","hmac"}, the
 * hmac being HMAC-SHA1 over salt then msg, keyed with the raw bytes of the
 * key file.  Every datagram goes through, in order: size (MSG_TRUNC), the
 * global then the per-source token bucket (before any hashing, to bound the
 * CPU a flood costs), magic, envelope, HMAC (constant time), timestamp
 * window, replay cache, request.  Anything that fails is dropped without a
 * word, as Ganeti does, and counted by reason; unauthenticated traffic never
 * gets a byte back (amplification factor 0).  An authenticated request gets
 * exactly {protocol,status,answer,serial} inside {hmac,msg,salt}, signed
 * with its rsalt; an answer over the reply cap becomes status 1 / ARGUMENT.
 *
 * Two modes.  Keyspace (default): PING answers the store revision,
 * CONFIG_QUERY a key's value (a query ending in "/" an object of the keys
 * under it).  Ganeti (--confd-ganeti-config-key K): Ganeti's config.data
 * JSON is read from key K (parsed again when K changes) and the twelve query
 * types are answered as ganeti-confd 3.0.2 answers them, quirks included.
 * This section holds the protocol's parts and keyspace mode; Ganeti mode,
 * the datagram's path and the sockets are section 30's.
 *
 * Invariants:
 *   1. The key is read from a regular file that nobody else may read
 *      (confd_load_key: O_NOFOLLOW, mode & 077 refused), kept only as two
 *      keyed SHA-1 states (confd_hmac_key), its bytes wiped; a key that
 *      fails to load leaves the old one in place.
 *   2. MACs are compared in constant time (confd_ct_equal), after a strict
 *      40-hex-digit decode (confd_unhex).
 *   3. Abuse state is bounded: KVD_CONFD_SOURCES rate buckets, 4 probes
 *      (confd_source_ok); KVD_CONFD_REPLAY replay entries, 16 probes, the
 *      soonest to expire replaced (confd_replayed).
 *   4. A request is Ganeti's exactly or nothing: confd_parse_request
 *      refuses leading space, unknown keys, a type out of range, a query of
 *      the wrong shape (confd_parse_query).
 *   5. Keyspace mode answers only under --confd-keyspace-prefix, and with
 *      auth on only what --confd-user may read (confd_may_read); an
 *      unreadable key is answered as absent, and a "/" listing looks at no
 *      more than CONFD_SCAN_MAX keys (confd_keyspace).
 */

/* The responder: sockets, key, limits, counters, the parsed Ganeti configuration. */
enum { CONFD_D_TRUNC, CONFD_D_RATE, CONFD_D_SRC_RATE, CONFD_D_MAGIC, CONFD_D_ENVELOPE, CONFD_D_HMAC, CONFD_D_SKEW,
       CONFD_D_REPLAY, CONFD_D_REQUEST, CONFD_D_N };
struct confd_src {                 /* a source's token bucket */
	uint8_t addr[16];
	int64_t last;
	struct bucket b;
	int used;
};
struct confd_seen {                /* an authenticated datagram, until its salt is out of the window */
	uint8_t mac[20];
	int64_t until;
};
struct confd {
	int fds[8];
	unsigned nfd;
	struct util_sha1 hmac_in, hmac_out; /* HMAC-SHA1, keyed */
	size_t keylen;
	struct bucket global;
	struct confd_src *src;
	struct confd_seen *seen;
	uint64_t received, answered, too_big, send_errors, dropped[CONFD_D_N];
	struct json_doc cfg;           /* Ganeti mode: config.data, as of cfg_mod */
	int64_t cfg_mod;
	char cfg_err[256];
	unsigned scope_warned;         /* keyspace mode: auth on without --confd-user was logged */
	struct kvd_buf msg, out, tmp;  /* reply msg, datagram, scratch */
	uint8_t rbuf[4096];
};

#ifndef KVD_NO_CONFD /* @@ KVD_NO_CONFD: no confd (make CONFD=0), for the smallest images */

#ifndef KVD_CONFD_MAX_REPLY /* @@ largest confd reply datagram (Ganeti's MAX_UDP_DATA_SIZE) */
#define KVD_CONFD_MAX_REPLY 61440
#endif
#ifndef KVD_CONFD_SOURCES /* @@ per-source rate buckets kept (least recently seen replaced) */
#define KVD_CONFD_SOURCES 1024
#endif
#ifndef KVD_CONFD_REPLAY /* @@ replay cache entries (authenticated datagrams seen) */
#define KVD_CONFD_REPLAY 8192
#endif
#define CONFD_MAGIC "plj0"
#define CONFD_RECV 4096      /* ganeti-confd reads at most this; longer ones are dropped */
#define CONFD_BATCH 64       /* datagrams read per socket per loop iteration */
#define CONFD_MAX_KEY 4096   /* key file bytes */

enum {
	CONFD_PING, CONFD_NODE_ROLE, CONFD_NODE_PIP_BY_IP, CONFD_CLUSTER_MASTER, CONFD_NODE_PIP_LIST,
	CONFD_MC_PIP_LIST, CONFD_INST_IPS, CONFD_NODE_DRBD, CONFD_NODE_INSTANCES, CONFD_INST_DISKS,
	CONFD_CONFIG_QUERY, CONFD_DATA_COLLECTORS, CONFD_NTYPES
};
enum { CONFD_OK, CONFD_ERROR, CONFD_NOTIMPL };                 /* reply status */
enum { CONFD_E_UNKNOWN, CONFD_E_INTERNAL, CONFD_E_ARGUMENT };  /* error answers */
enum { CONFD_Q_EMPTY, CONFD_Q_PLAIN, CONFD_Q_DICT };

/* A parsed request (strings point into the request's JSON tree). */
struct confd_req {
	int type, qkind;
	const struct json *rsalt, *plain;
	const struct json *link, *ip, *iplist, *fields; /* dict query: "0" "1" "2" "3", NULL if absent or null */
};

/* ---- HMAC-SHA1 (RFC 2104), keyed once ------------------------------------- */

/* The inner and outer contexts after the padded key: each message costs
 * two SHA-1 finishes, not four. */
static void confd_hmac_key(struct confd *cd, const uint8_t *key, size_t n)
{
	uint8_t k0[64], pad[64];
	int i;

	memset(k0, 0, sizeof k0);
	if (n > 64)
		util_sha1(key, n, k0);
	else
		memcpy(k0, key, n);
	for (i = 0; i < 2; i++) {
		size_t j;
		struct util_sha1 *c = i ? &cd->hmac_out : &cd->hmac_in;
		for (j = 0; j < 64; j++)
			pad[j] = (uint8_t)(k0[j] ^ (i ? 0x5c : 0x36));
		util_sha1_init(c);
		util_sha1_update(c, pad, 64);
	}
	util_wipe(k0, sizeof k0);
	util_wipe(pad, sizeof pad);
}

static void confd_hmac(const struct confd *cd, const void *a, size_t an, const void *b, size_t bn, uint8_t out[20])
{
	struct util_sha1 c = cd->hmac_in;
	uint8_t inner[20];

	util_sha1_update(&c, a, an);
	util_sha1_update(&c, b, bn);
	util_sha1_final(&c, inner);
	c = cd->hmac_out;
	util_sha1_update(&c, inner, 20);
	util_sha1_final(&c, out);
	util_wipe(&c, sizeof c);
}

/* 40 hex digits (either case) to 20 bytes; -1 if not exactly that. */
static int confd_unhex(const char *s, size_t n, uint8_t out[20])
{
	size_t i;
	uint32_t v;

	if (n != 40)
		return KVD_EPROTO;
	for (i = 0; i < 20; i++) {
		uint8_t two[4] = {'0', '0', (uint8_t)s[2 * i], (uint8_t)s[2 * i + 1]};
		if (json_hex4(two, &v))
			return KVD_EPROTO;
		out[i] = (uint8_t)v;
	}
	return 0;
}

/* Compare without a data-dependent branch or early exit. */
static int confd_ct_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
	volatile uint8_t d = 0;
	size_t i;

	for (i = 0; i < n; i++)
		d |= (uint8_t)(a[i] ^ b[i]);
	return d == 0;
}

/* ---- the key file ----------------------------------------------------------- */

/* Read the key file: the raw bytes, trailing newline included (Ganeti's
 * hmac.key is 40 hex digits and "\n").  A file others may read is refused. */
static int confd_load_key(struct kvd *k, char *err, size_t errlen)
{
	struct confd *cd = k->confd;
	const char *path = k->cfg.confd_hmac_key_file;
	uint8_t key[CONFD_MAX_KEY + 1];
	struct stat st;
	ssize_t n;
	int fd = util_open_regular(path, O_NOFOLLOW, &st); /* also on SIGHUP: never a FIFO that blocks the loop */

	if (fd == -1) {
		snprintf(err, errlen, "--confd-hmac-key-file %s: %s", path, strerror(errno));
		return KVD_EIO;
	}
	if (fd == -2 || (st.st_mode & 077)) {
		snprintf(err, errlen, "--confd-hmac-key-file %s: %s", path,
		         fd >= 0 ? "readable or writable by group or others (chmod 600 or 400)" : "not a regular file");
		if (fd >= 0)
			close(fd);
		return KVD_EINVAL;
	}
	n = read(fd, key, sizeof key);
	close(fd);
	if (n <= 0 || n > CONFD_MAX_KEY) {
		snprintf(err, errlen, "--confd-hmac-key-file %s: %s", path,
		         n < 0 ? strerror(errno) : n == 0 ? "empty" : "longer than 4096 bytes");
		return KVD_EINVAL;
	}
	confd_hmac_key(cd, key, (size_t)n);
	cd->keylen = (size_t)n;
	memset(key, 0, sizeof key);
	return 0;
}

/* ---- abuse controls ---------------------------------------------------------- */

static uint32_t confd_addr_hash(const struct sockaddr_storage *sa, uint8_t addr[16])
{
	uint32_t h = 2166136261u;
	int i;

	memset(addr, 0, 16);
	if (sa->ss_family == AF_INET6)
		memcpy(addr, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
	else
		memcpy(addr, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
	for (i = 0; i < 16; i++)
		h = (h ^ addr[i]) * 16777619u;
	return h;
}

/* One token from the source's bucket (a table of KVD_CONFD_SOURCES; a new
 * source takes the least recently seen of a few slots). */
static int confd_source_ok(struct kvd *k, const struct sockaddr_storage *sa)
{
	struct confd *cd = k->confd;
	uint8_t addr[16];
	uint32_t h = confd_addr_hash(sa, addr), i, at, old;
	struct confd_src *s;

	old = h & (KVD_CONFD_SOURCES - 1);
	for (i = 0; i < 4; i++) {
		at = (h + i) & (KVD_CONFD_SOURCES - 1);
		s = &cd->src[at];
		if (s->used && !memcmp(s->addr, addr, 16))
			goto found;
		if (!s->used) {
			old = at;
			break;
		}
		if (s->last < cd->src[old].last)
			old = at;
	}
	s = &cd->src[old];
	memcpy(s->addr, addr, 16);
	s->used = 1;
	bucket_init(&s->b, k->cfg.confd_rate_limit, k->now);
found:
	s->last = k->now;
	return bucket_take(&s->b, k->now, k->cfg.confd_rate_limit, k->cfg.confd_rate_limit);
}

/* Has this authenticated datagram (its HMAC) been seen within the window?
 * Records it if not.  Open addressing over KVD_CONFD_REPLAY slots; expired
 * entries are free; when a probe run is full the soonest to expire goes. */
static int confd_replayed(struct kvd *k, const uint8_t mac[20], int64_t wall)
{
	struct confd *cd = k->confd;
	uint32_t h = (uint32_t)mac[0] | (uint32_t)mac[1] << 8 | (uint32_t)mac[2] << 16 | (uint32_t)mac[3] << 24;
	uint32_t i, at, victim = h & (KVD_CONFD_REPLAY - 1);
	struct confd_seen *e;

	for (i = 0; i < 16; i++) {
		at = (h + i) & (KVD_CONFD_REPLAY - 1);
		e = &cd->seen[at];
		if (e->until > wall && !memcmp(e->mac, mac, 20))
			return 1;
		if (e->until < cd->seen[victim].until)
			victim = at;
	}
	e = &cd->seen[victim];
	memcpy(e->mac, mac, 20);
	e->until = wall + 2 * (int64_t)(k->cfg.confd_max_clock_skew_ms / 1000) + 1;
	return 0;
}

/* ---- request parsing (strict, as Ganeti's) ------------------------------------ */

/* An integral JSON number in [lo, hi]. */
static int confd_int(const struct json *v, int64_t lo, int64_t hi, int64_t *out)
{
	if (!v || v->type != JSON_NUM || !v->isint || v->i < lo || v->i > hi)
		return KVD_EPROTO;
	*out = v->i;
	return 0;
}

static int confd_parse_query(const struct json *q, struct confd_req *rq)
{
	uint32_t i, j;

	if (!q || q->type == JSON_NULL) {
		rq->qkind = CONFD_Q_EMPTY;
		return 0;
	}
	if (q->type == JSON_STR) {
		rq->qkind = CONFD_Q_PLAIN;
		rq->plain = q;
		return 0;
	}
	if (q->type != JSON_OBJ)
		return KVD_EPROTO;
	rq->qkind = CONFD_Q_DICT;
	for (i = 0; i < q->n; i++) {
		const struct json *v = &q->kids[i];
		const struct json **slot;
		if (v->klen != 1 || v->key[0] < '0' || v->key[0] > '3')
			return KVD_EPROTO; /* Ganeti: superfluous keys */
		slot = v->key[0] == '0' ? &rq->link : v->key[0] == '1' ? &rq->ip : v->key[0] == '2' ? &rq->iplist : &rq->fields;
		if (*slot)
			continue; /* a repeated key: the first one counts */
		if (v->type == JSON_NULL)
			continue;
		if (v->key[0] <= '1' && v->type != JSON_STR)
			return KVD_EPROTO;
		if (v->key[0] >= '2') {
			if (v->type != JSON_ARR)
				return KVD_EPROTO;
			for (j = 0; j < v->n; j++) {
				int64_t f;
				if (v->key[0] == '2' ? v->kids[j].type != JSON_STR : confd_int(&v->kids[j], 0, 2, &f))
					return KVD_EPROTO; /* fields as strings are dropped by Ganeti too */
			}
		}
		*slot = v;
	}
	return 0;
}

/* The request message: exactly protocol, type, rsalt and an optional query;
 * no leading whitespace (Ganeti's decoder refuses it), no other key. */
static int confd_parse_request(struct kvd *k, struct json_doc *d, const char *msg, size_t n, struct confd_req *rq)
{
	const struct json *o, *proto, *type;
	const char *err;
	int64_t v;
	uint32_t i;

	memset(rq, 0, sizeof *rq);
	if (!n || msg[0] != '{' || json_parse(k, d, msg, n, &err))
		return KVD_EPROTO;
	o = d->root;
	for (i = 0; i < o->n; i++) {
		static const char *const known[] = {"protocol", "type", "rsalt", "query"};
		size_t j;
		for (j = 0; j < 4; j++)
			if (o->kids[i].klen == strlen(known[j]) && !memcmp(o->kids[i].key, known[j], o->kids[i].klen))
				break;
		if (j == 4)
			return KVD_EPROTO;
	}
	proto = json_get(o, "protocol");
	type = json_get(o, "type");
	rq->rsalt = json_get(o, "rsalt");
	if (confd_int(proto, INT64_MIN, INT64_MAX, &v) || confd_int(type, 0, CONFD_NTYPES - 1, &v) ||
	    !json_is_str(rq->rsalt))
		return KVD_EPROTO;
	rq->type = (int)v;
	return confd_parse_query(json_get(o, "query"), rq);
}

/* ---- replies ------------------------------------------------------------------ */

/* Reply msg, signed, in its envelope: cd->out holds the datagram. */
static void confd_sign(struct kvd *k, const struct confd_req *rq)
{
	struct confd *cd = k->confd;
	static const char hex[] = "0123456789abcdef";
	uint8_t mac[20];
	char hx[41];
	int i;

	confd_hmac(cd, rq->rsalt->s, rq->rsalt->n, cd->msg.p, cd->msg.len, mac);
	for (i = 0; i < 20; i++) {
		hx[2 * i] = hex[mac[i] >> 4];
		hx[2 * i + 1] = hex[mac[i] & 15];
	}
	hx[40] = 0;
	buf_reset(&cd->out);
	json_put_raw(k, &cd->out, CONFD_MAGIC "{\"hmac\":\"");
	json_put_raw(k, &cd->out, hx);
	json_put_raw(k, &cd->out, "\",\"msg\":");
	json_put_str(k, &cd->out, cd->msg.p, cd->msg.len);
	json_put_raw(k, &cd->out, ",\"salt\":");
	json_put_str(k, &cd->out, rq->rsalt->s, rq->rsalt->n);
	json_put_raw(k, &cd->out, "}");
}

/* Start a reply msg; the caller writes the answer, then confd_end_msg. */
static void confd_begin_msg(struct kvd *k, int status)
{
	struct confd *cd = k->confd;
	char t[48];

	buf_reset(&cd->msg);
	snprintf(t, sizeof t, "{\"protocol\":1,\"status\":%d,\"answer\":", status);
	json_put_raw(k, &cd->msg, t);
}

static void confd_end_msg(struct kvd *k, int64_t serial)
{
	char t[40];

	snprintf(t, sizeof t, ",\"serial\":%lld}", (long long)serial);
	json_put_raw(k, &k->confd->msg, t);
}

/* A whole reply msg whose answer is an integer, or a string. */
static void confd_msg_int(struct kvd *k, int status, int64_t answer, int64_t serial)
{
	confd_begin_msg(k, status);
	json_put_int(k, &k->confd->msg, answer);
	confd_end_msg(k, serial);
}

static void confd_msg_str(struct kvd *k, int status, const char *s, size_t n, int64_t serial)
{
	confd_begin_msg(k, status);
	json_put_str(k, &k->confd->msg, s, n);
	confd_end_msg(k, serial);
}

/* A whole reply msg whose answer is a JSON value (NULL: null). */
static void confd_msg_json(struct kvd *k, int status, const struct json *v, int64_t serial)
{
	confd_begin_msg(k, status);
	if (v)
		json_write(k, &k->confd->msg, v);
	else
		json_put_raw(k, &k->confd->msg, "null");
	confd_end_msg(k, serial);
}

/* ---- keyspace mode --------------------------------------------------------------- */

/* A value as JSON: a string if it is UTF-8, else {"base64": "..."}. */
static void confd_put_value(struct kvd *k, struct kvd_buf *b, const struct mvcc_key *r)
{
	static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	uint8_t *v = kvd_malloc(k, r->vlen + 1);
	size_t i, l;

	if (!v || mvcc_pread(&k->db, v, r->vlen, mvcc_voff(&k->db, r))) {
		b->err = 1; /* no answer rather than a wrong one */
		goto out;
	}
	for (i = 0; i < r->vlen && (l = utf8_len(v + i, v + r->vlen)); i += l)
		;
	if (i == r->vlen) {
		json_put_str(k, b, v, r->vlen);
		goto out;
	}
	json_put_raw(k, b, "{\"base64\":\"");
	if (buf_reserve(k, b, (r->vlen + 2) / 3 * 4 + 2))
		goto out;
	b->len += util_b64(b64, 1, v, r->vlen, (char *)b->p + b->len);
	json_put_raw(k, b, "\"}");
out:
	kvd_free(k, v);
}

/*
 * Keyspace mode's scope.  The HMAC key proves a datagram came from someone
 * holding it; it is not a kvd user.  So keyspace mode answers only keys
 * under --confd-keyspace-prefix, which queries name relative to it (they
 * cannot reach above it; with a prefix ending in "/", a query's leading "/"
 * is that one, so "/" lists the whole scope), and with auth enabled only what --confd-user may
 * read, checked as a Range by that user would be.  With auth on and no
 * --confd-user kvd refuses to start; if auth is enabled later, keyspace
 * queries get "unknown" until a user is configured.
 */
#define CONFD_SCAN_MAX 10000 /* keys a "/" query may look at (unreadable and deleted ones count: work) */

static int confd_may_read(struct kvd *k, const uint8_t *key, size_t n, const uint8_t *end, size_t en)
{
	struct auth_who w;
	struct svc_err e = {0, NULL};
	ProtobufCBinaryData kb, eb;

	if (!k->auth.enabled)
		return 1;
	if (!k->cfg.confd_user[0])
		return 0;
	w.name = k->cfg.confd_user;
	w.nlen = strlen(w.name);
	w.named = 1; /* every field set: auth_may reads each */
	w.rev = 0;
	kb.data = (uint8_t *)(uintptr_t)key;
	kb.len = n;
	eb.data = (uint8_t *)(uintptr_t)end;
	eb.len = en;
	return !auth_may(k, &w, &kb, &eb, AUTH_R, &e);
}

static void confd_keyspace(struct kvd *k, const struct confd_req *rq)
{
	struct confd *cd = k->confd;
	struct mvcc *m = &k->db;
	const char *pfx = k->cfg.confd_keyspace_prefix;
	size_t plen = strlen(pfx), klen, scanned = 0, skip;
	struct kvd_buf *key = &cd->tmp;
	struct mvcc_key *r;
	struct mvcc_it it;
	int eq, first = 1, all = 0;

	if (k->auth.enabled && !k->cfg.confd_user[0] && !cd->scope_warned++)
		kvd_log(k, KVD_LOG_WARN, "confd: auth is enabled and --confd-user is not set: keyspace queries get nothing");
	if (rq->type == CONFD_PING) {
		confd_msg_int(k, CONFD_OK, m->rev, m->rev);
		return;
	}
	if (rq->type != CONFD_CONFIG_QUERY) { /* Ganeti's status 2, which its clients accept */
		confd_msg_json(k, CONFD_NOTIMPL, NULL, 0);
		return;
	}
	if (rq->qkind != CONFD_Q_PLAIN || !rq->plain->n) {
		confd_msg_int(k, CONFD_ERROR, CONFD_E_ARGUMENT, 0);
		return;
	}
	key->rd = key->len = 0; /* the store's key: the scope's prefix, then the query */
	buf_append(k, key, pfx, plen);
	skip = plen && pfx[plen - 1] == '/' && rq->plain->s[0] == '/'; /* "/x" is x, and "/" the whole scope */
	buf_append(k, key, rq->plain->s + skip, rq->plain->n - skip);
	if (key->err) {
		cd->msg.err = 1;
		return;
	}
	klen = key->len;
	if (key->p[klen - 1] != '/') {
		r = mvcc_find(m, key->p, klen);
		if (!r || !(r->flags & MVCC_LIVE) || !confd_may_read(k, key->p, klen, NULL, 0)) { /* unreadable: as absent */
			confd_msg_int(k, CONFD_ERROR, CONFD_E_UNKNOWN, 0);
			return;
		}
		confd_begin_msg(k, CONFD_OK);
		confd_put_value(k, &cd->msg, r);
		confd_end_msg(k, r->mod);
		return;
	}
	if (k->auth.enabled) { /* the whole prefix readable: no check per key */
		if (buf_reserve(k, key, klen)) {
			cd->msg.err = 1;
			return;
		}
		memcpy(key->p + klen, key->p, klen);
		key->p[2 * klen - 1]++; /* the prefix's end: it ends in '/', never 0xff */
		all = confd_may_read(k, key->p, klen, key->p + klen, klen);
	}
	confd_begin_msg(k, CONFD_OK); /* every key under the prefix, as an object, named relative to the scope */
	json_put_raw(k, &cd->msg, "{");
	for (it = mvcc_seek(m, key->p, klen, &eq); (r = mvcc_at(m, it)) && !cd->msg.err; mvcc_next(m, &it)) {
		if (r->klen < klen || memcmp(r->key, key->p, klen))
			break;
		if (++scanned > CONFD_SCAN_MAX) { /* bounded work per datagram: too big, as a long answer is */
			confd_msg_int(k, CONFD_ERROR, CONFD_E_ARGUMENT, 0);
			cd->too_big++;
			return;
		}
		if (!(r->flags & MVCC_LIVE) || (!all && !confd_may_read(k, r->key, r->klen, NULL, 0)))
			continue;
		if (!first)
			json_put_raw(k, &cd->msg, ",");
		json_put_str(k, &cd->msg, r->key + plen, r->klen - plen);
		json_put_raw(k, &cd->msg, ":");
		confd_put_value(k, &cd->msg, r);
		first = 0;
		if (cd->msg.len > KVD_CONFD_MAX_REPLY)
			break; /* too big anyway: the caller turns it into ARGUMENT */
	}
	json_put_raw(k, &cd->msg, "}");
	confd_end_msg(k, m->rev);
}

/* ===== 30. confd: Ganeti mode, datagrams, setup (confd_) ================= */

/*
 * Ganeti mode: the cluster's configuration (config.data, reloaded when it
 * changes) and the queries Ganeti's confd answers from it, each as
 * Ganeti's own server answers; then one datagram from socket to signed
 * reply, and the sockets' setup.
 *
 * A confd query: confd_read (recvfrom, the size, the rate buckets) ->
 * confd_handle (magic, envelope) -> confd_hmac (checked before anything
 * trusts the sender) -> the salt as clock, the replay cache ->
 * confd_parse_request (section 29) -> confd_keyspace or confd_ganeti ->
 * confd_sign (the reply signed with the request's salt) -> sendto.  Setup
 * checks the addresses before the data dir is touched (confd_open) and
 * binds them once the store is read (confd_bind), which refuses keyspace
 * mode with auth on and no --confd-user.
 *
 * Invariants:
 *   1. Unauthenticated traffic never gets a byte back: confd_handle
 *      returns 0 (a reply in cd->out) only past the HMAC, the clock, the
 *      replay cache and the parse; confd_read sends nothing else, and
 *      counts each drop by its reason (cd->dropped).
 *   2. Answers come from durable state: confd_read flushes an open batch
 *      first (loop_log_flush).
 *   3. A reply fits one datagram, or is none: an answer over
 *      KVD_CONFD_MAX_REPLY - 256 becomes status 1 / ARGUMENT; one still too
 *      long once signed (a long rsalt), or half-built (msg.err, out.err), is
 *      dropped -- no answer rather than a wrong one (confd_handle).
 *   4. Work per loop turn is bounded: CONFD_BATCH datagrams a socket,
 *      CONFD_RECV bytes each (longer ones, seen by MSG_TRUNC, dropped), the
 *      buffers trimmed after (confd_read).
 *   5. Ganeti mode parses config.data only when key K changed (its mod
 *      revision: confd_ganeti_load) and fills Ganeti's defaults
 *      (confd_fill); a file without a required field is not loaded, and
 *      every query gets the reason (cd->cfg_err).
 */

/*
 * ganeti-confd answers from its own typed copy of config.data: fields the
 * file leaves out come back with their defaults, and a file without a
 * required field is not loaded at all.  kvd does the same on the JSON tree
 * (the tables below were taken from 3.0.2's behaviour), so that answers and
 * CONFIG_QUERY paths see what ganeti-confd sees.
 */
struct confd_field {
	const char *name;
	const char *dflt; /* JSON text, or NULL: required */
};
static const struct confd_field confd_f_top[] = {
	{"version", NULL}, {"cluster", NULL}, {"nodes", NULL}, {"nodegroups", NULL}, {"instances", NULL},
	{"networks", NULL}, {"disks", NULL}, {"filters", NULL}, {"serial_no", NULL}, {"ctime", "0"}, {"mtime", "0"},
	{NULL, NULL}};
static const struct confd_field confd_f_cluster[] = {
	{"beparams", NULL}, {"blacklisted_os", NULL}, {"candidate_certs", NULL}, {"candidate_pool_size", NULL},
	{"cluster_name", NULL}, {"compression_tools", NULL}, {"ctime", "0"}, {"data_collectors", NULL},
	{"default_iallocator", NULL}, {"default_iallocator_params", NULL}, {"disk_state_static", "{}"},
	{"diskparams", NULL}, {"enabled_disk_templates", NULL}, {"enabled_hypervisors", NULL},
	{"enabled_user_shutdown", NULL}, {"file_storage_dir", NULL}, {"gluster_storage_dir", NULL},
	{"hidden_os", NULL}, {"highest_used_port", NULL}, {"hv_state_static", "{}"}, {"hvparams", NULL},
	{"install_image", NULL}, {"instance_communication_network", NULL}, {"ipolicy", NULL}, {"mac_prefix", NULL},
	{"maintain_node_health", NULL}, {"master_ip", NULL}, {"master_netdev", NULL}, {"master_netmask", NULL},
	{"master_node", NULL}, {"max_running_jobs", NULL}, {"max_tracked_jobs", NULL}, {"modify_etc_hosts", NULL},
	{"modify_ssh_setup", NULL}, {"mtime", "0"}, {"ndparams", NULL}, {"nicparams", NULL}, {"os_hvp", NULL},
	{"osparams", NULL}, {"osparams_private_cluster", NULL}, {"prealloc_wipe_disks", NULL},
	{"primary_ip_family", NULL}, {"reserved_lvs", NULL}, {"rsahostkeypub", NULL}, {"serial_no", NULL},
	{"shared_file_storage_dir", NULL}, {"ssh_key_bits", NULL}, {"ssh_key_type", NULL}, {"tags", "[]"},
	{"tcpudp_port_pool", NULL}, {"uid_pool", NULL}, {"use_external_mip_script", NULL}, {"uuid", NULL},
	{"zeroing_image", NULL}, {NULL, NULL}};
static const struct confd_field confd_f_node[] = {
	{"ctime", "0"}, {"drained", NULL}, {"group", NULL}, {"master_candidate", NULL}, {"master_capable", NULL},
	{"mtime", "0"}, {"name", NULL}, {"ndparams", NULL}, {"offline", NULL}, {"powered", NULL},
	{"primary_ip", NULL}, {"secondary_ip", NULL}, {"serial_no", NULL}, {"tags", "[]"}, {"uuid", NULL},
	{"vm_capable", NULL}, {NULL, NULL}};
static const struct confd_field confd_f_instance[] = {
	{"admin_state", NULL}, {"admin_state_source", NULL}, {"beparams", "{}"}, {"ctime", "0"}, {"disks", "[]"},
	{"disks_active", NULL}, {"hvparams", "{}"}, {"hypervisor", NULL}, {"mtime", "0"}, {"name", NULL},
	{"nics", "[]"}, {"os", NULL}, {"osparams", "{}"}, {"osparams_private", "{}"}, {"primary_node", NULL},
	{"serial_no", NULL}, {"tags", "[]"}, {"uuid", NULL}, {NULL, NULL}};
static const struct confd_field confd_f_disk[] = {
	{"children", "[]"}, {"ctime", "0"}, {"dev_type", NULL}, {"iv_name", "\"\""}, {"logical_id", NULL},
	{"mode", "\"rw\""}, {"mtime", "0"}, {"nodes", "[]"}, {"serial_no", NULL}, {"size", NULL}, {"uuid", NULL},
	{NULL, NULL}};
static const struct confd_field confd_f_nodegroup[] = {
	{"alloc_policy", NULL}, {"diskparams", NULL}, {"ipolicy", NULL}, {"mtime", "0"}, {"name", NULL},
	{"ndparams", NULL}, {"networks", NULL}, {"serial_no", NULL}, {"tags", "[]"}, {"uuid", NULL}, {"ctime", "0"},
	{"members", "[]"}, {NULL, NULL}};
static const struct confd_field confd_f_network[] = {
	{"name", NULL}, {"network", NULL}, {"serial_no", NULL}, {"uuid", NULL}, {"ctime", "0"}, {"mtime", "0"},
	{"tags", "[]"}, {NULL, NULL}};

static int confd_obj_add(struct json_doc *d, struct json *o, const char *key, const char *text)
{
	struct json_doc tmp;
	struct json *kids;
	const char *err;

	if (json_parse(d->k, &tmp, text, strlen(text), &err))
		return KVD_ENOMEM;
	/* the value lives in tmp's arena: move its chunks over to d */
	if (!(kids = json_alloc(d, (o->n + 1) * sizeof *kids))) {
		json_free(&tmp);
		return KVD_ENOMEM;
	}
	if (o->n)
		memcpy(kids, o->kids, o->n * sizeof *kids);
	kids[o->n] = *tmp.root;
	kids[o->n].key = key;
	kids[o->n].klen = (uint32_t)strlen(key);
	o->kids = kids;
	o->n++;
	if (tmp.chunks) {
		struct json_chunk *c = tmp.chunks;
		while (c->next)
			c = c->next;
		c->next = d->chunks;
		d->chunks = tmp.chunks;
		d->bytes += tmp.bytes;
	}
	return 0;
}

/* Fill o's missing defaulted fields; -1 (with why) if a required one is missing. */
static int confd_fill(struct json_doc *d, struct json *o, const struct confd_field *f, const char *what, char *why,
                      size_t whylen)
{
	if (!o || o->type != JSON_OBJ) {
		snprintf(why, whylen, "%s is not an object", what);
		return KVD_EINVAL;
	}
	for (; f->name; f++) {
		if (json_get(o, f->name))
			continue;
		if (!f->dflt) {
			snprintf(why, whylen, "%s has no \"%s\"", what, f->name);
			return KVD_EINVAL;
		}
		if (confd_obj_add(d, o, f->name, f->dflt)) {
			snprintf(why, whylen, "out of memory");
			return KVD_EINVAL;
		}
	}
	return 0;
}

static int confd_fill_map(struct json_doc *d, struct json *m, const struct confd_field *f, const char *what,
                          char *why, size_t whylen)
{
	uint32_t i;

	if (!m || m->type != JSON_OBJ) {
		snprintf(why, whylen, "\"%s\" is not an object", what);
		return KVD_EINVAL;
	}
	for (i = 0; i < m->n; i++)
		if (confd_fill(d, &m->kids[i], f, what, why, whylen))
			return KVD_EINVAL;
	return 0;
}

static int confd_fill_disk(struct json_doc *d, struct json *disk, char *why, size_t whylen, int depth)
{
	struct json *ch;
	uint32_t i;

	if (depth > 8 || confd_fill(d, disk, confd_f_disk, "a disk", why, whylen))
		return KVD_EINVAL;
	ch = (struct json *)json_get(disk, "children");
	for (i = 0; ch && ch->type == JSON_ARR && i < ch->n; i++)
		if (confd_fill_disk(d, &ch->kids[i], why, whylen, depth + 1))
			return KVD_EINVAL;
	return 0;
}

/* The typed view of a loaded configuration. */
static const struct json *confd_cfg_get(const struct confd *cd, const char *name)
{
	return json_get(cd->cfg.root, name);
}

static int64_t confd_num(const struct json *o, const char *name)
{
	const struct json *v = json_get(o, name);

	return v && v->type == JSON_NUM ? (v->isint ? v->i : (int64_t)v->d) : 0;
}

static int64_t confd_cluster_serial(const struct confd *cd)
{
	return confd_num(confd_cfg_get(cd, "cluster"), "serial_no");
}

/* Members of map m in key order (Haskell's Data.Map): indexes into m->kids. */
static int confd_key_cmp_ctx(const struct json *a, const struct json *b)
{
	return mvcc_cmp((const uint8_t *)a->key, a->klen, (const uint8_t *)b->key, b->klen);
}
static int confd_kid_cmp(const void *a, const void *b)
{
	return confd_key_cmp_ctx(*(const struct json *const *)a, *(const struct json *const *)b);
}
static const struct json **confd_sorted(struct kvd *k, const struct json *m, uint32_t *n)
{
	const struct json **v;
	uint32_t i;

	*n = 0;
	if (!m || m->type != JSON_OBJ || !m->n)
		return NULL;
	if (!(v = kvd_malloc(k, m->n * sizeof *v))) {
		k->confd->msg.err = 1; /* no answer rather than an empty one */
		return NULL;
	}
	for (i = 0; i < m->n; i++)
		v[i] = &m->kids[i];
	qsort(v, m->n, sizeof *v, confd_kid_cmp);
	*n = m->n;
	return v;
}

/* Parse key K's value when it changed since the last query.  0 if a usable
 * configuration is loaded; else the reason is in cd->cfg_err. */
static int confd_ganeti_load(struct kvd *k)
{
	struct confd *cd = k->confd;
	const char *key = k->cfg.confd_ganeti_config_key, *err;
	struct mvcc_key *r = mvcc_find(&k->db, (const uint8_t *)key, strlen(key));
	struct json_doc d;
	struct json *root;
	uint8_t *v;
	char why[160];

	if (!r || !(r->flags & MVCC_LIVE)) {
		json_free(&cd->cfg);
		cd->cfg_mod = 0;
		snprintf(cd->cfg_err, sizeof cd->cfg_err, "kvd: no Ganeti configuration (key %s is empty)", key);
		return KVD_EINVAL;
	}
	if (r->mod == cd->cfg_mod)
		return cd->cfg.root ? 0 : -1;
	json_free(&cd->cfg);
	cd->cfg_mod = r->mod;
	if (!(v = kvd_malloc(k, r->vlen + 1)) || mvcc_pread(&k->db, v, r->vlen, mvcc_voff(&k->db, r))) {
		kvd_free(k, v);
		cd->cfg_mod = 0; /* try again next time */
		snprintf(cd->cfg_err, sizeof cd->cfg_err, "kvd: cannot read the Ganeti configuration");
		return KVD_EINVAL;
	}
	if (json_parse(k, &d, v, r->vlen, &err)) {
		kvd_free(k, v);
		snprintf(cd->cfg_err, sizeof cd->cfg_err, "kvd: cannot load the Ganeti configuration: %s", err);
		return KVD_EINVAL;
	}
	kvd_free(k, v);
	root = d.root;
	why[0] = 0;
	if (confd_fill(&d, root, confd_f_top, "the configuration", why, sizeof why) ||
	    confd_fill(&d, (struct json *)json_get(root, "cluster"), confd_f_cluster, "the cluster", why, sizeof why) ||
	    confd_fill_map(&d, (struct json *)json_get(root, "nodes"), confd_f_node, "nodes", why, sizeof why) ||
	    confd_fill_map(&d, (struct json *)json_get(root, "instances"), confd_f_instance, "instances", why,
	                   sizeof why) ||
	    confd_fill_map(&d, (struct json *)json_get(root, "nodegroups"), confd_f_nodegroup, "nodegroups", why,
	                   sizeof why) ||
	    confd_fill_map(&d, (struct json *)json_get(root, "networks"), confd_f_network, "networks", why,
	                   sizeof why)) {
		json_free(&d);
		snprintf(cd->cfg_err, sizeof cd->cfg_err, "kvd: cannot load the Ganeti configuration: %s", why);
		return KVD_EINVAL;
	}
	{
		struct json *disks = (struct json *)json_get(root, "disks");
		uint32_t i;
		for (i = 0; disks && disks->type == JSON_OBJ && i < disks->n; i++)
			if (confd_fill_disk(&d, &disks->kids[i], why, sizeof why, 0)) {
				json_free(&d);
				snprintf(cd->cfg_err, sizeof cd->cfg_err, "kvd: cannot load the Ganeti configuration: %s", why);
				return KVD_EINVAL;
			}
	}
	cd->cfg = d;
	return 0;
}

/* ---- Ganeti mode: lookups as Ganeti.Utils.lookupName does them ------------------------- */

enum { CONFD_LK_EXACT, CONFD_LK_MULTI, CONFD_LK_PARTIAL, CONFD_LK_FAIL };

/* In map m, the member whose key (by_name: whose "name") is q, or the only
 * one it is a dotted prefix of ("node1" for "node1.example.com"). */
static const struct json *confd_lookup(const struct json *m, const char *q, size_t qn, int by_name, int *how)
{
	const struct json *cand = NULL;
	uint32_t i, partial = 0;

	*how = CONFD_LK_FAIL;
	for (i = 0; m && m->type == JSON_OBJ && i < m->n; i++) {
		const struct json *e = &m->kids[i], *nm = by_name ? json_get(e, "name") : NULL;
		const char *s = by_name ? (json_is_str(nm) ? nm->s : NULL) : e->key;
		size_t sn = by_name ? (s ? nm->n : 0) : e->klen;
		if (!s)
			continue;
		if (sn == qn && !memcmp(s, q, qn)) {
			*how = CONFD_LK_EXACT;
			return e;
		}
		if (sn > qn && !memcmp(s, q, qn) && s[qn] == '.') {
			partial++;
			cand = e;
		}
	}
	*how = partial == 1 ? CONFD_LK_PARTIAL : partial ? CONFD_LK_MULTI : CONFD_LK_FAIL;
	return partial == 1 ? cand : NULL;
}

/* Haskell's `show` of a String (the texts ganeti-confd builds with show). */
static void confd_hs_show(struct kvd *k, struct kvd_buf *b, const char *s, size_t n)
{
	static const char *const ascii[] = {"NUL", "SOH", "STX", "ETX", "EOT", "ENQ", "ACK", "a",   "b",   "t",  "n",
	                                    "v",   "f",   "r",   "SO",  "SI",  "DLE", "DC1", "DC2", "DC3", "DC4", "NAK",
	                                    "SYN", "ETB", "CAN", "EM",  "SUB", "ESC", "FS",  "GS",  "RS",  "US"};
	const uint8_t *p = (const uint8_t *)s, *end = p + n;
	char t[16];
	int numeric = 0, so = 0;

	buf_append(k, b, "\"", 1);
	while (p < end && !b->err) {
		uint32_t c = *p;
		size_t l = c >= 0x80 ? utf8_len(p, end) : 1;
		if (c >= 0x80 && l > 1)
			c = l == 2 ? (p[0] & 0x1fu) << 6 | (p[1] & 0x3fu)
			  : l == 3 ? (p[0] & 0x0fu) << 12 | (p[1] & 0x3fu) << 6 | (p[2] & 0x3fu)
			           : (p[0] & 0x07u) << 18 | (p[1] & 0x3fu) << 12 | (p[2] & 0x3fu) << 6 | (p[3] & 0x3fu);
		else
			l = 1;
		p += l;
		/* "\&" keeps a numeric escape from eating a digit, and "\SO" from an H */
		if ((numeric && c >= '0' && c <= '9') || (so && c == 'H'))
			buf_append(k, b, "\\&", 2);
		numeric = so = 0;
		if (c == '"' || c == '\\')
			snprintf(t, sizeof t, "\\%c", (char)c);
		else if (c == 127)
			snprintf(t, sizeof t, "\\DEL");
		else if (c > 127)
			snprintf(t, sizeof t, "\\%u", (unsigned)c), numeric = 1;
		else if (c < 32)
			snprintf(t, sizeof t, "\\%s", ascii[c]), so = c == 14;
		else
			t[0] = (char)c, t[1] = 0;
		buf_append(k, b, t, strlen(t));
	}
	buf_append(k, b, "\"", 1);
}

/* The text of a failed lookup, as ganeti-confd renders Ganeti errors:
 * show (OpPrereqError "<Kind> name <q> not found" ECodeNoEnt), or the
 * "Failure: prerequisites..." format of errToResult. */
static void confd_lookup_error(struct kvd *k, struct kvd_buf *b, const char *prefix, const char *kind,
                               const struct json *q, int how, int formatted)
{
	struct kvd_buf m = {0};

	buf_append(k, &m, kind, strlen(kind));
	buf_append(k, &m, " name ", 6);
	buf_append(k, &m, q->s, q->n);
	json_put_raw(k, &m, how == CONFD_LK_MULTI ? " has multiple matches" : " not found");
	buf_reset(b);
	b->err = m.err;
	if (formatted) {
		json_put_raw(k, b, "Failure: prerequisites not met for this operation:\nerror type: "
		                   "ECodeNoEnt, error details:\n");
		buf_append(k, b, m.p, m.len);
	} else {
		json_put_raw(k, b, prefix);
		json_put_raw(k, b, "OpPrereqError ");
		confd_hs_show(k, b, (const char *)m.p, m.len);
		json_put_raw(k, b, " ECodeNoEnt");
	}
	buf_free(k, &m);
}

/* Ganeti's getNode: by UUID, then by name (errors name the name lookup). */
static const struct json *confd_node(const struct confd *cd, const char *q, size_t qn, int *how)
{
	const struct json *nodes = confd_cfg_get(cd, "nodes"), *n = confd_lookup(nodes, q, qn, 0, how);

	return n ? n : confd_lookup(nodes, q, qn, 1, how);
}

static const struct json *confd_instance(const struct confd *cd, const char *q, size_t qn, int *how)
{
	const struct json *insts = confd_cfg_get(cd, "instances"), *i = confd_lookup(insts, q, qn, 0, how);

	return i ? i : confd_lookup(insts, q, qn, 1, how);
}

static const struct json *confd_str_of(const struct json *o, const char *name)
{
	const struct json *v = json_get(o, name);

	return json_is_str(v) ? v : NULL;
}

/* The master node's name (cluster.master_node is its UUID). */
static const struct json *confd_master_name(struct kvd *k, struct kvd_buf *err)
{
	const struct confd *cd = k->confd;
	const struct json *uuid = confd_str_of(confd_cfg_get(cd, "cluster"), "master_node"), *n;
	int how = CONFD_LK_FAIL;

	n = uuid ? confd_node(cd, uuid->s, uuid->n, &how) : NULL;
	if (!n || !confd_str_of(n, "name")) {
		static const struct json none = {JSON_STR, 0, 0, 0, NULL, "", NULL, 0, 0};
		confd_lookup_error(k, err, "", "Node", uuid ? uuid : &none, how, 1);
		return NULL;
	}
	return confd_str_of(n, "name");
}

/* A DRBD disk's logical_id: [nodeA, nodeB, port, minorA, minorB, secret]. */
static int confd_drbd_lid(const struct json *disk, const struct json **lid)
{
	const struct json *t = confd_str_of(disk, "dev_type"), *l = json_get(disk, "logical_id");

	if (!t || strcmp(t->s, "drbd") || !l || l->type != JSON_ARR || l->n != 6 || !json_is_str(&l->kids[0]) ||
	    !json_is_str(&l->kids[1]))
		return KVD_EINVAL;
	*lid = l;
	return 0;
}

static int confd_str_eq(const struct json *a, const char *s, size_t n)
{
	return a && a->type == JSON_STR && a->n == n && !memcmp(a->s, s, n);
}

/* The disk objects of instance inst, by the UUIDs in its "disks". */
static const struct json *confd_disk(const struct confd *cd, const struct json *uuid)
{
	const struct json *disks = confd_cfg_get(cd, "disks");
	uint32_t i;

	for (i = 0; json_is_str(uuid) && disks && disks->type == JSON_OBJ && i < disks->n; i++)
		if (disks->kids[i].klen == uuid->n && !memcmp(disks->kids[i].key, uuid->s, uuid->n))
			return &disks->kids[i];
	return NULL;
}

/* ---- Ganeti mode: the queries ---------------------------------------------------------- */

/* The IP -> instance map of one link, as buildLinkIpInstnameMap makes it:
 * every NIC with an IP, its link from its own nicparams or the cluster's
 * default; a later instance (in UUID order) wins an IP. */
struct confd_ipent {
	const struct json *ip, *inst;
};
static int confd_ipent_cmp(const void *a, const void *b)
{
	const struct confd_ipent *x = a, *y = b;
	int c = mvcc_cmp((const uint8_t *)x->ip->s, x->ip->n, (const uint8_t *)y->ip->s, y->ip->n);

	return c ? c : (x < y ? -1 : x > y); /* stable: keep UUID order among equal IPs */
}

static const struct json *confd_default_link(const struct confd *cd)
{
	const struct json *np = json_get(confd_cfg_get(cd, "cluster"), "nicparams");

	return confd_str_of(json_get(np, "default"), "link");
}

static struct confd_ipent *confd_link_ips(struct kvd *k, const char *link, size_t ln, size_t *count)
{
	const struct confd *cd = k->confd;
	const struct json *dlink = confd_default_link(cd), **insts, *nics, *nic, *l, *ip;
	struct confd_ipent *v = NULL;
	uint32_t ni, i, j;
	size_t n = 0, cap = 0, w;

	*count = 0;
	insts = confd_sorted(k, confd_cfg_get(cd, "instances"), &ni);
	for (i = 0; i < ni; i++) {
		nics = json_get(insts[i], "nics");
		for (j = 0; nics && nics->type == JSON_ARR && j < nics->n; j++) {
			nic = &nics->kids[j];
			ip = confd_str_of(nic, "ip");
			l = confd_str_of(json_get(nic, "nicparams"), "link");
			if (!l)
				l = dlink;
			if (!ip || !l || l->n != ln || memcmp(l->s, link, ln))
				continue;
			if (UTIL_GROW(k, v, cap, n + 1, 16)) {
				kvd_free(k, v);
				kvd_free(k, insts);
				k->confd->msg.err = 1; /* no answer rather than a short one */
				return NULL;
			}
			v[n].ip = ip;
			v[n].inst = insts[i];
			n++;
		}
	}
	kvd_free(k, insts);
	if (!n)
		return v;
	qsort(v, n, sizeof *v, confd_ipent_cmp);
	for (i = 1, w = 1; i < n; i++) { /* one entry per IP: the last one */
		if (!mvcc_cmp((const uint8_t *)v[i].ip->s, v[i].ip->n, (const uint8_t *)v[w - 1].ip->s, v[w - 1].ip->n))
			v[w - 1] = v[i];
		else
			v[w++] = v[i];
	}
	*count = w;
	return v;
}

/* NODE_PIP_BY_INSTANCE_IP for one IP: [status, answer, serial] parts. */
static void confd_pip_of_ip(struct kvd *k, const struct confd_ipent *v, size_t n, const struct json *ip,
                            struct kvd_buf *b, int as_triple)
{
	const struct confd *cd = k->confd;
	const struct json *inst = NULL, *pn, *node, *pip;
	size_t i;
	int how;

	for (i = 0; i < n; i++)
		if (v[i].ip->n == ip->n && !memcmp(v[i].ip->s, ip->s, ip->n))
			inst = v[i].inst;
	pn = inst ? confd_str_of(inst, "primary_node") : NULL;
	node = pn ? confd_node(cd, pn->s, pn->n, &how) : NULL;
	pip = node ? confd_str_of(node, "primary_ip") : NULL;
	if (!as_triple) {
		if (!pip)
			confd_msg_int(k, CONFD_ERROR, CONFD_E_UNKNOWN, 0);
		else
			confd_msg_str(k, CONFD_OK, pip->s, pip->n, confd_cluster_serial(cd));
		return;
	}
	if (!pip) {
		json_put_raw(k, b, "[1,0,0]");
		return;
	}
	json_put_raw(k, b, "[0,");
	json_put_str(k, b, pip->s, pip->n);
	json_put_raw(k, b, ",");
	json_put_int(k, b, confd_cluster_serial(cd));
	json_put_raw(k, b, "]");
}

/* show of a Maybe String: Just "..." or Nothing. */
static void confd_hs_maybe(struct kvd *k, struct kvd_buf *b, const struct json *v)
{
	if (!v) {
		json_put_raw(k, b, "Nothing");
		return;
	}
	json_put_raw(k, b, "Just ");
	confd_hs_show(k, b, v->s, v->n);
}

/* show of the request's query, as "Invalid query type " messages print it. */
static void confd_show_query(struct kvd *k, struct kvd_buf *b, const struct confd_req *rq)
{
	static const char *const fnames[] = {"ReqFieldName", "ReqFieldIp", "ReqFieldMNodePip"};
	uint32_t i;

	if (rq->qkind == CONFD_Q_EMPTY) {
		json_put_raw(k, b, "EmptyQuery");
		return;
	}
	if (rq->qkind == CONFD_Q_PLAIN) {
		json_put_raw(k, b, "PlainQuery ");
		confd_hs_show(k, b, rq->plain->s, rq->plain->n);
		return;
	}
	json_put_raw(k, b, "DictQuery (ConfdReqQ {confdReqQIp = ");
	confd_hs_maybe(k, b, rq->ip);
	json_put_raw(k, b, ", confdReqQIpList = [");
	for (i = 0; rq->iplist && i < rq->iplist->n; i++) {
		if (i)
			json_put_raw(k, b, ",");
		confd_hs_show(k, b, rq->iplist->kids[i].s, rq->iplist->kids[i].n);
	}
	json_put_raw(k, b, "], confdReqQLink = ");
	confd_hs_maybe(k, b, rq->link);
	json_put_raw(k, b, ", confdReqQFields = [");
	for (i = 0; rq->fields && i < rq->fields->n; i++) {
		if (i)
			json_put_raw(k, b, ",");
		json_put_raw(k, b, fnames[rq->fields->kids[i].i]);
	}
	json_put_raw(k, b, "]})");
}

/* A status 1 reply whose answer is the text in cd->tmp. */
static void confd_fail_text(struct kvd *k)
{
	struct confd *cd = k->confd;

	confd_msg_str(k, CONFD_ERROR, (const char *)cd->tmp.p, cd->tmp.len, 0);
	cd->msg.err |= cd->tmp.err;
}

static void confd_invalid_query(struct kvd *k, const struct confd_req *rq, int with_show)
{
	struct confd *cd = k->confd;

	buf_reset(&cd->tmp);
	json_put_raw(k, &cd->tmp, with_show ? "Invalid query type " : "Invalid query type");
	if (with_show)
		confd_show_query(k, &cd->tmp, rq);
	confd_fail_text(k);
}

/* NODE_DRBD rows of instance inst for node uuid nu: [node, minor, instance,
 * "disk/N", "primary"|"secondary", peer], walking each disk and its children. */
static int confd_drbd_rows(struct kvd *k, const struct json *disk, const struct json *nu, const char *iname,
                           size_t inl, int idx, const char *role, const struct json *nname, int *first, int depth)
{
	const struct confd *cd = k->confd;
	struct kvd_buf *b = &k->confd->msg;
	const struct json *lid, *ch, *peer = NULL, *minor = NULL, *pn;
	uint32_t i;
	int how;
	char t[24];

	if (depth > 8)
		return 0;
	if (!confd_drbd_lid(disk, &lid)) {
		if (confd_str_eq(&lid->kids[0], nu->s, nu->n))
			peer = &lid->kids[1], minor = &lid->kids[3];
		else if (confd_str_eq(&lid->kids[1], nu->s, nu->n))
			peer = &lid->kids[0], minor = &lid->kids[4];
	}
	if (peer) {
		pn = confd_node(cd, peer->s, peer->n, &how);
		if (!pn || !confd_str_of(pn, "name")) {
			confd_lookup_error(k, &k->confd->tmp, "", "Node", peer, how, 0);
			return 1; /* the whole answer is this error */
		}
		pn = confd_str_of(pn, "name");
		snprintf(t, sizeof t, "disk/%d", idx);
		json_put_raw(k, b, *first ? "[" : ",[");
		json_put_str(k, b, nname->s, nname->n);
		json_put_raw(k, b, ",");
		json_write(k, b, minor);
		json_put_raw(k, b, ",");
		json_put_str(k, b, iname, inl);
		json_put_raw(k, b, ",");
		json_put_str(k, b, t, strlen(t));
		json_put_raw(k, b, ",\"");
		json_put_raw(k, b, role);
		json_put_raw(k, b, "\",");
		json_put_str(k, b, pn->s, pn->n);
		json_put_raw(k, b, "]");
		*first = 0;
	}
	ch = json_get(disk, "children");
	for (i = 0; ch && ch->type == JSON_ARR && i < ch->n; i++)
		if (confd_drbd_rows(k, &ch->kids[i], nu, iname, inl, idx, role, nname, first, depth + 1))
			return 1;
	return 0;
}

/* The secondary node of a DRBD disk of an instance whose primary is pn. */
static const struct json *confd_disk_secondary(const struct json *disk, const struct json *pn)
{
	const struct json *lid;

	if (!pn || confd_drbd_lid(disk, &lid))
		return NULL;
	if (confd_str_eq(&lid->kids[0], pn->s, pn->n))
		return &lid->kids[1];
	if (confd_str_eq(&lid->kids[1], pn->s, pn->n))
		return &lid->kids[0];
	return NULL;
}

/* ---- Ganeti mode: one function per query type ------------------------------ */

static void confd_g_master(struct kvd *k, const struct confd_req *rq, int64_t serial)
{
	struct confd *cd = k->confd;
	struct kvd_buf *b = &cd->msg;
	const struct json *cluster = confd_cfg_get(cd, "cluster"), *mname, *mip, *mnode = NULL, *muuid, *v;
	uint32_t i;
	int how = CONFD_LK_FAIL;

	if (rq->qkind == CONFD_Q_PLAIN) {
		confd_msg_int(k, CONFD_ERROR, CONFD_E_ARGUMENT, 0);
		return;
	}
	if (rq->qkind == CONFD_Q_DICT) { /* the master node first, by its UUID */
		muuid = confd_str_of(cluster, "master_node");
		if (!muuid || !(mnode = confd_node(cd, muuid->s, muuid->n, &how))) {
			static const struct json none = {JSON_STR, 0, 0, 0, NULL, "", NULL, 0, 0};
			confd_lookup_error(k, &cd->tmp, "", "Node", muuid ? muuid : &none, how, 0);
			confd_fail_text(k);
			return;
		}
	}
	if (!(mname = confd_master_name(k, &cd->tmp))) {
		confd_fail_text(k);
		return;
	}
	if (rq->qkind == CONFD_Q_EMPTY) {
		confd_msg_str(k, CONFD_OK, mname->s, mname->n, serial);
		return;
	}
	mip = confd_str_of(cluster, "master_ip");
	confd_begin_msg(k, CONFD_OK);
	json_put_raw(k, b, "[");
	for (i = 0; rq->fields && i < rq->fields->n; i++) {
		int64_t f = rq->fields->kids[i].i;
		v = f == 0 ? mname : f == 1 ? mip : confd_str_of(mnode, "primary_ip");
		if (i)
			json_put_raw(k, b, ",");
		if (v)
			json_write(k, b, v);
		else
			json_put_raw(k, b, "null");
	}
	json_put_raw(k, b, "]");
	confd_end_msg(k, serial);
}

static void confd_g_role(struct kvd *k, const struct confd_req *rq, int64_t serial)
{
	struct confd *cd = k->confd;
	const struct json *mname, *node, *v;
	int role, how = CONFD_LK_FAIL;

	if (rq->qkind != CONFD_Q_PLAIN) {
		confd_invalid_query(k, rq, 1);
		return;
	}
	if (!(mname = confd_master_name(k, &cd->tmp))) {
		confd_fail_text(k);
		return;
	}
	if (!(node = confd_node(cd, rq->plain->s, rq->plain->n, &how))) {
		confd_lookup_error(k, &cd->tmp, "", "Node", rq->plain, how, 1);
		confd_fail_text(k);
		return;
	}
	/* ganeti-confd compares the query, not the node's name, with the
	 * master's name: "node1" for the master answers CANDIDATE (quirk) */
	v = json_get(node, "drained");
	role = confd_str_eq(mname, rq->plain->s, rq->plain->n) ? 0
	     : v && v->type == JSON_TRUE                        ? 3
	     : (v = json_get(node, "offline")) && v->type == JSON_TRUE ? 2
	     : (v = json_get(node, "master_candidate")) && v->type == JSON_TRUE ? 1 : 4;
	confd_msg_int(k, CONFD_OK, role, serial);
}

/* NODE_PIP_LIST, MC_PIP_LIST: Data.Map's foldlWithKey consing, so
 * descending UUID order. */
static void confd_g_pip_list(struct kvd *k, const struct confd_req *rq, int64_t serial)
{
	struct confd *cd = k->confd;
	struct kvd_buf *b = &cd->msg;
	const struct json **sorted, *v;
	uint32_t i, j, n;

	sorted = confd_sorted(k, confd_cfg_get(cd, "nodes"), &n);
	confd_begin_msg(k, CONFD_OK);
	json_put_raw(k, b, "[");
	for (i = n, j = 0; i-- > 0;) {
		v = json_get(sorted[i], "master_candidate");
		if (rq->type == CONFD_MC_PIP_LIST && !(v && v->type == JSON_TRUE))
			continue;
		v = json_get(sorted[i], "primary_ip");
		if (j++)
			json_put_raw(k, b, ",");
		if (v)
			json_write(k, b, v);
		else
			json_put_raw(k, b, "null");
	}
	kvd_free(k, sorted);
	json_put_raw(k, b, "]");
	confd_end_msg(k, serial);
}

/* INSTANCES_IPS_LIST and NODE_PIP_BY_INSTANCE_IP: the IPs on a link. */
static void confd_g_ips(struct kvd *k, const struct confd_req *rq, int64_t serial)
{
	struct confd *cd = k->confd;
	struct kvd_buf *b = &cd->msg;
	const struct json *link;
	struct confd_ipent *ips;
	size_t nips = 0, i;

	if (rq->type == CONFD_INST_IPS) {
		if (rq->qkind == CONFD_Q_DICT) {
			confd_invalid_query(k, rq, 0);
			return;
		}
		link = rq->qkind == CONFD_Q_PLAIN ? rq->plain : confd_default_link(cd);
	} else {
		if (rq->qkind != CONFD_Q_DICT) {
			confd_msg_int(k, CONFD_ERROR, CONFD_E_ARGUMENT, 0);
			return;
		}
		link = rq->link ? rq->link : confd_default_link(cd);
	}
	ips = link ? confd_link_ips(k, link->s, link->n, &nips) : NULL;
	if (rq->type == CONFD_NODE_PIP_BY_IP && rq->ip) {
		confd_pip_of_ip(k, ips, nips, rq->ip, b, 0);
	} else {
		confd_begin_msg(k, CONFD_OK);
		json_put_raw(k, b, "[");
		if (rq->type == CONFD_INST_IPS)
			for (i = 0; i < nips; i++) {
				if (i)
					json_put_raw(k, b, ",");
				json_write(k, b, ips[i].ip);
			}
		else
			for (i = 0; rq->iplist && i < rq->iplist->n; i++) {
				if (i)
					json_put_raw(k, b, ",");
				confd_pip_of_ip(k, ips, nips, &rq->iplist->kids[i], b, 1);
			}
		json_put_raw(k, b, "]");
		confd_end_msg(k, serial);
	}
	kvd_free(k, ips);
}

/* NODE_DRBD: the DRBD minors of every disk of every instance on the node. */
static void confd_g_node_drbd(struct kvd *k, const struct json *node, const struct json **sorted, uint32_t n)
{
	struct confd *cd = k->confd;
	const struct json *name = confd_str_of(node, "name");
	uint32_t i, j;
	int first = 1;

	for (i = 0; name && i < n; i++) {
		const struct json *pn = confd_str_of(sorted[i], "primary_node"), *disks = json_get(sorted[i], "disks");
		const struct json *iname = confd_str_of(sorted[i], "name");
		const char *role = pn && pn->n == node->klen && !memcmp(pn->s, node->key, pn->n) ? "primary" : "secondary";
		struct json nu = {JSON_STR, 0, 0, 0, NULL, node->key, NULL, 0, 0};
		nu.n = node->klen;
		for (j = 0; disks && disks->type == JSON_ARR && j < disks->n; j++) {
			const struct json *dk = confd_disk(cd, &disks->kids[j]);
			if (dk && confd_drbd_rows(k, dk, &nu, iname ? iname->s : "", iname ? iname->n : 0, (int)j, role, name,
			                          &first, 0)) {
				confd_fail_text(k); /* the whole answer is that error */
				return;
			}
		}
	}
	json_put_raw(k, &cd->msg, "]");
	confd_end_msg(k, confd_num(node, "serial_no"));
}

/* NODE_INSTANCES: [[primary instances], [secondary instances]], an
 * instance once per disk whose secondary the node is. */
static void confd_g_node_instances(struct kvd *k, const struct json *node, const struct json **sorted, uint32_t n)
{
	struct confd *cd = k->confd;
	struct kvd_buf *b = &cd->msg;
	uint32_t i, j;
	int pass, first;

	for (pass = 0; pass < 2; pass++) {
		json_put_raw(k, b, pass ? ",[" : "[");
		for (first = 1, i = 0; i < n; i++) {
			const struct json *pn = confd_str_of(sorted[i], "primary_node"), *disks;
			if (!pass) {
				if (pn && pn->n == node->klen && !memcmp(pn->s, node->key, pn->n)) {
					json_put_raw(k, b, first ? "" : ",");
					json_write(k, b, sorted[i]);
					first = 0;
				}
				continue;
			}
			disks = json_get(sorted[i], "disks");
			for (j = 0; disks && disks->type == JSON_ARR && j < disks->n; j++) {
				const struct json *dk = confd_disk(cd, &disks->kids[j]);
				const struct json *sec = dk ? confd_disk_secondary(dk, pn) : NULL;
				if (sec && sec->n == node->klen && !memcmp(sec->s, node->key, sec->n)) {
					json_put_raw(k, b, first ? "" : ",");
					json_write(k, b, sorted[i]);
					first = 0;
				}
			}
		}
		json_put_raw(k, b, "]");
	}
	json_put_raw(k, b, "]");
	confd_end_msg(k, confd_num(node, "serial_no"));
}

static void confd_g_node(struct kvd *k, const struct confd_req *rq)
{
	struct confd *cd = k->confd;
	const struct json *node, **sorted;
	uint32_t n;
	int how = CONFD_LK_FAIL;

	if (rq->qkind != CONFD_Q_PLAIN) {
		confd_invalid_query(k, rq, 1);
		return;
	}
	if (!(node = confd_node(cd, rq->plain->s, rq->plain->n, &how))) {
		confd_lookup_error(k, &cd->tmp, rq->type == CONFD_NODE_DRBD ? "" : "Node not found in the configuration: ",
		                   "Node", rq->plain, how, 0);
		confd_fail_text(k);
		return;
	}
	sorted = confd_sorted(k, confd_cfg_get(cd, "instances"), &n);
	confd_begin_msg(k, CONFD_OK);
	json_put_raw(k, &cd->msg, "[");
	if (rq->type == CONFD_NODE_DRBD)
		confd_g_node_drbd(k, node, sorted, n);
	else
		confd_g_node_instances(k, node, sorted, n);
	kvd_free(k, sorted);
}

static void confd_g_inst_disks(struct kvd *k, const struct confd_req *rq)
{
	struct confd *cd = k->confd;
	struct kvd_buf *b = &cd->msg;
	const struct json *inst, *disks, *dk;
	uint32_t j;
	int how = CONFD_LK_FAIL;

	if (rq->qkind != CONFD_Q_PLAIN) {
		confd_invalid_query(k, rq, 1);
		return;
	}
	if (!(inst = confd_instance(cd, rq->plain->s, rq->plain->n, &how))) {
		confd_lookup_error(k, &cd->tmp, "Instance not found in the configuration: ", "Instance", rq->plain, how, 0);
		confd_fail_text(k);
		return;
	}
	disks = json_get(inst, "disks");
	confd_begin_msg(k, CONFD_OK);
	json_put_raw(k, b, "[");
	for (j = 0; disks && disks->type == JSON_ARR && j < disks->n; j++) {
		if (!(dk = confd_disk(cd, &disks->kids[j]))) {
			buf_reset(&cd->tmp);
			json_put_raw(k, &cd->tmp, "Could not retrieve disks: ConfigurationError ");
			confd_hs_show(k, &cd->tmp, "disk not found", 14);
			confd_fail_text(k);
			return;
		}
		if (j)
			json_put_raw(k, b, ",");
		json_write(k, b, dk);
	}
	json_put_raw(k, b, "]");
	confd_end_msg(k, confd_num(inst, "serial_no"));
}

/* CONFIG_QUERY: an RFC 6901 path into the whole configuration. */
static void confd_g_config_query(struct kvd *k, const struct confd_req *rq, int64_t serial)
{
	struct confd *cd = k->confd;
	const struct json *v = cd->cfg.root;
	const char *p, *e, *end;
	uint32_t i;

	if (rq->qkind != CONFD_Q_PLAIN) {
		confd_invalid_query(k, rq, 1);
		return;
	}
	p = rq->plain->s;
	end = p + rq->plain->n;
	if (p == end || *p != '/')
		v = NULL;
	while (v && p < end) {
		p++;
		for (e = p; e < end && *e != '/'; e++)
			;
		if (v->type == JSON_OBJ) {
			const struct json *kid = NULL;
			for (i = 0; i < v->n && !kid; i++)
				if (v->kids[i].klen == (size_t)(e - p) && !memcmp(v->kids[i].key, p, (size_t)(e - p)))
					kid = &v->kids[i];
			v = kid;
		} else if (v->type == JSON_ARR) {
			uint64_t idx = 0;
			const char *d;
			for (d = p; d < e && *d >= '0' && *d <= '9' && idx < 0xffffffffu; d++)
				idx = idx * 10 + (uint64_t)(*d - '0');
			v = d == e && e > p && idx < v->n ? &v->kids[idx] : NULL;
		} else {
			v = NULL;
		}
		p = e;
	}
	if (!v)
		confd_msg_int(k, CONFD_ERROR, CONFD_E_ARGUMENT, 0);
	else
		confd_msg_json(k, CONFD_OK, v, serial);
}

/* DATA_COLLECTORS: ganeti-confd's collectors, by name. */
static void confd_g_collectors(struct kvd *k, int64_t serial)
{
	static const char *const names[] = {"cpu-avg-load", "diskstats", "drbd", "inst-status-xen", "lv",
	                                    "xen-cpu-avg-load"};
	struct confd *cd = k->confd;
	struct kvd_buf *b = &cd->msg;
	const struct json *dc = json_get(confd_cfg_get(cd, "cluster"), "data_collectors"), *c, *a, *iv;
	size_t i;

	confd_begin_msg(k, CONFD_OK);
	json_put_raw(k, b, "{");
	for (i = 0; i < KVD_COUNT(names); i++) {
		c = json_get(dc, names[i]);
		a = json_get(c, "active");
		iv = json_get(c, "interval");
		if (i)
			json_put_raw(k, b, ",");
		json_put_str(k, b, names[i], strlen(names[i]));
		json_put_raw(k, b, ":{\"active\":");
		json_put_raw(k, b, a && a->type == JSON_FALSE ? "false" : "true");
		json_put_raw(k, b, ",\"interval\":");
		if (iv && iv->type == JSON_NUM)
			json_write(k, b, iv);
		else
			json_put_raw(k, b, "5000000");
		json_put_raw(k, b, "}");
	}
	json_put_raw(k, b, "}");
	confd_end_msg(k, serial);
}

/* A query in Ganeti mode, answered into cd->msg (errors: sticky in it). */
static void confd_ganeti(struct kvd *k, const struct confd_req *rq)
{
	struct confd *cd = k->confd;
	int64_t serial;

	if (confd_ganeti_load(k)) {
		confd_msg_str(k, CONFD_ERROR, cd->cfg_err, strlen(cd->cfg_err), 0);
		return;
	}
	serial = confd_cluster_serial(cd);
	buf_reset(&cd->tmp);
	switch (rq->type) {
	case CONFD_PING: confd_msg_json(k, CONFD_OK, confd_cfg_get(cd, "version"), 0); return;
	case CONFD_CLUSTER_MASTER: confd_g_master(k, rq, serial); return;
	case CONFD_NODE_ROLE: confd_g_role(k, rq, serial); return;
	case CONFD_NODE_PIP_LIST:
	case CONFD_MC_PIP_LIST: confd_g_pip_list(k, rq, serial); return;
	case CONFD_INST_IPS:
	case CONFD_NODE_PIP_BY_IP: confd_g_ips(k, rq, serial); return;
	case CONFD_NODE_DRBD:
	case CONFD_NODE_INSTANCES: confd_g_node(k, rq); return;
	case CONFD_INST_DISKS: confd_g_inst_disks(k, rq); return;
	case CONFD_CONFIG_QUERY: confd_g_config_query(k, rq, serial); return;
	case CONFD_DATA_COLLECTORS: confd_g_collectors(k, serial); return;
	}
	confd_msg_int(k, CONFD_ERROR, CONFD_E_ARGUMENT, 0);
}

/* ---- one datagram -------------------------------------------------------------------- */

/* The wall clock's seconds, precisely: time() may read a coarse clock a
 * tick behind, which at a second's edge lets a timestamp one second past
 * the skew window in (the sender's clock, like Ganeti's, is precise). */
static int64_t confd_wall(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_REALTIME, &ts))
		return (int64_t)time(NULL);
	return (int64_t)ts.tv_sec;
}

/* The reply (in cd->out) to the datagram p[0..n), or KVD_EPROTO to drop
 * it.  No socket here: the fuzzer drives this directly. */
static int confd_handle(struct kvd *k, const uint8_t *p, size_t n, int64_t wall)
{
	struct confd *cd = k->confd;
	struct json_doc env, req;
	const struct json *msg, *salt, *mac;
	struct confd_req rq;
	uint8_t want[20], got[20];
	const char *err;
	int64_t ts = 0;
	uint32_t i;
	int rc = KVD_EPROTO, neg = 0;

	memset(&req, 0, sizeof req);
	if (n < 4 || memcmp(p, CONFD_MAGIC, 4)) {
		cd->dropped[CONFD_D_MAGIC]++;
		return KVD_EPROTO;
	}
	/* the envelope: exactly msg, salt, hmac, all strings (Ganeti is strict) */
	if (json_parse(k, &env, p + 4, n - 4, &err) || env.root->type != JSON_OBJ || env.root->n != 3 ||
	    !json_is_str(msg = json_get(env.root, "msg")) || !json_is_str(salt = json_get(env.root, "salt")) ||
	    !json_is_str(mac = json_get(env.root, "hmac"))) {
		if (env.root)
			json_free(&env);
		cd->dropped[CONFD_D_ENVELOPE]++;
		return KVD_EPROTO;
	}
	/* authenticate before anything depends on what the sender wrote */
	confd_hmac(cd, salt->s, salt->n, msg->s, msg->n, want);
	if (confd_unhex(mac->s, mac->n, got) || !confd_ct_equal(want, got, 20)) {
		cd->dropped[CONFD_D_HMAC]++;
		goto out;
	}
	/* the salt is the sender's clock: an integer as Haskell reads one
	 * (leading spaces and zeros pass; a sign, a fraction or trailing
	 * bytes do not) within --confd-max-clock-skew of ours */
	for (i = 0; i < salt->n && salt->s[i] == ' '; i++)
		;
	if (i < salt->n && salt->s[i] == '-')
		neg = 1, i++;
	if (i == salt->n) {
		cd->dropped[CONFD_D_SKEW]++;
		goto out;
	}
	for (; i < salt->n; i++) {
		if (salt->s[i] < '0' || salt->s[i] > '9') {
			cd->dropped[CONFD_D_SKEW]++;
			goto out;
		}
		ts = ts > (INT64_MAX - 9) / 10 ? INT64_MAX / 2 : ts * 10 + (salt->s[i] - '0');
	}
	if (neg)
		ts = -ts;
	if (k->cfg.confd_max_clock_skew_ms && (ts < wall - (int64_t)(k->cfg.confd_max_clock_skew_ms / 1000) ||
	                             ts > wall + (int64_t)(k->cfg.confd_max_clock_skew_ms / 1000))) {
		cd->dropped[CONFD_D_SKEW]++;
		goto out;
	}
	if (k->cfg.confd_replay_cache && confd_replayed(k, want, wall)) {
		cd->dropped[CONFD_D_REPLAY]++;
		goto out;
	}
	if (confd_parse_request(k, &req, msg->s, msg->n, &rq)) {
		cd->dropped[CONFD_D_REQUEST]++;
		goto out;
	}
	if (k->cfg.confd_ganeti_config_key[0])
		confd_ganeti(k, &rq);
	else
		confd_keyspace(k, &rq);
	if (!cd->msg.err && cd->msg.len > KVD_CONFD_MAX_REPLY - 256) { /* no truncated datagram: an ARGUMENT error */
		cd->too_big++;
		confd_msg_int(k, CONFD_ERROR, CONFD_E_ARGUMENT, 0);
	}
	if (!cd->msg.err)
		confd_sign(k, &rq);
	if (cd->msg.err || cd->out.err || cd->out.len > KVD_CONFD_MAX_REPLY) {
		cd->dropped[CONFD_D_REQUEST]++; /* out of memory, or an rsalt too long to sign into a datagram */
		goto out;
	}
	rc = 0;
out:
	json_free(&req);
	json_free(&env);
	return rc;
}

/* Read what the socket holds (bounded), answer what deserves an answer. */
static void confd_read(struct kvd *k, int fd)
{
	struct confd *cd = k->confd;
	struct sockaddr_storage sa;
	socklen_t sl;
	ssize_t n;
	int i;

	if (k->db.w.len)
		loop_log_flush(k); /* never answer from writes that are not durable yet */
	for (i = 0; i < CONFD_BATCH; i++) {
		sl = sizeof sa;
		n = recvfrom(fd, cd->rbuf, CONFD_RECV, MSG_TRUNC, (struct sockaddr *)&sa, &sl);
		if (n < 0)
			break;
		cd->received++;
		if ((size_t)n > CONFD_RECV) {
			cd->dropped[CONFD_D_TRUNC]++;
			continue;
		}
		if (!bucket_take(&cd->global, k->now, k->cfg.confd_global_rate_limit, k->cfg.confd_global_rate_limit)) {
			cd->dropped[CONFD_D_RATE]++;
			continue;
		}
		if (!confd_source_ok(k, &sa)) {
			cd->dropped[CONFD_D_SRC_RATE]++;
			continue;
		}
		if (confd_handle(k, cd->rbuf, (size_t)n, confd_wall()))
			continue;
		if (sendto(fd, cd->out.p, cd->out.len, MSG_NOSIGNAL, (struct sockaddr *)&sa, sl) < 0)
			cd->send_errors++;
		else
			cd->answered++;
	}
	buf_trim(k, &cd->out, 65536);
	buf_trim(k, &cd->msg, 65536);
	buf_trim(k, &cd->tmp, 65536);
}

/* ---- setup -------------------------------------------------------------------------- */

/* "host:port" or "[v6]:port" (port 0: any free port, for tests) to an
 * address; checked before the data dir is touched, bound after. */
static int confd_addr(const char *spec, struct sockaddr_storage *sa, socklen_t *sl, char *err, size_t errlen)
{
	char host[128];
	const char *colon;
	long port;

	memset(sa, 0, sizeof *sa);
	if (spec[0] == '[') {
		const char *e = strchr(spec, ']');
		if (!e || e[1] != ':' || (size_t)(e - spec - 1) >= sizeof host)
			goto bad;
		memcpy(host, spec + 1, (size_t)(e - spec - 1));
		host[e - spec - 1] = 0;
		colon = e + 1;
	} else {
		colon = strrchr(spec, ':');
		if (!colon || (size_t)(colon - spec) >= sizeof host)
			goto bad;
		memcpy(host, spec, (size_t)(colon - spec));
		host[colon - spec] = 0;
	}
	port = strtol(colon + 1, NULL, 10);
	if (port < 0 || port > 65535 || !colon[1])
		goto bad;
	if (!strcmp(host, "localhost"))
		strcpy(host, "127.0.0.1");
	if (inet_pton(AF_INET, host, &((struct sockaddr_in *)(void *)sa)->sin_addr) == 1) {
		((struct sockaddr_in *)(void *)sa)->sin_family = AF_INET;
		((struct sockaddr_in *)(void *)sa)->sin_port = htons((uint16_t)port);
		*sl = sizeof(struct sockaddr_in);
		return 0;
	}
	if (inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)(void *)sa)->sin6_addr) == 1) {
		((struct sockaddr_in6 *)(void *)sa)->sin6_family = AF_INET6;
		((struct sockaddr_in6 *)(void *)sa)->sin6_port = htons((uint16_t)port);
		*sl = sizeof(struct sockaddr_in6);
		return 0;
	}
bad:
	snprintf(err, errlen, "--confd-listen: bad address \"%s\" (want host:port or [v6]:port)", spec);
	return KVD_EINVAL;
}

/* Every --confd-listen address (bind: 1 binds them, 0 only checks them). */
static int confd_listen(struct kvd *k, int bind_them, char *err, size_t errlen)
{
	struct confd *cd = k->confd;
	struct sockaddr_storage sa;
	socklen_t sl;
	char *list, *p, *spec;
	unsigned n = 0;
	int fd, one = 1, r = 0;

	if (!(list = kvd_strdup(k, k->cfg.confd_listen))) {
		snprintf(err, errlen, "out of memory");
		return KVD_ENOMEM;
	}
	for (spec = strtok_r(list, ",", &p); spec && !r; spec = strtok_r(NULL, ",", &p)) {
		if ((r = confd_addr(spec, &sa, &sl, err, errlen)))
			break;
		if (++n > KVD_COUNT(cd->fds)) {
			snprintf(err, errlen, "--confd-listen: at most %u addresses", (unsigned)KVD_COUNT(cd->fds));
			r = KVD_EINVAL;
			break;
		}
		if (!bind_them)
			continue;
		fd = socket(sa.ss_family, SOCK_DGRAM, 0);
		if (fd < 0 || net_nonblock(fd) ||
		    (sa.ss_family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one)) ||
		    bind(fd, (struct sockaddr *)&sa, sl)) {
			snprintf(err, errlen, "confd: listen udp %s: %s", spec,
			         errno == EADDRINUSE ? "bind: address already in use" : strerror(errno));
			if (fd >= 0)
				close(fd);
			r = KVD_EIO;
			break;
		}
		cd->fds[cd->nfd++] = fd;
	}
	kvd_free(k, list);
	if (!r && !n) {
		snprintf(err, errlen, "--confd-listen names no address");
		r = KVD_EINVAL;
	}
	return r;
}

/* confd, if a key file is configured: the key and the addresses, read and
 * checked before the data dir is touched (confd_bind binds them later). */
static int confd_open(struct kvd *k, char *err, size_t errlen)
{
	struct confd *cd;
	int r;

	if (!k->cfg.confd_hmac_key_file[0])
		return 0;
	if (!(cd = k->confd = kvd_calloc(k, sizeof *cd)) ||
	    !(cd->src = kvd_calloc(k, KVD_CONFD_SOURCES * sizeof *cd->src)) ||
	    (k->cfg.confd_replay_cache && !(cd->seen = kvd_calloc(k, KVD_CONFD_REPLAY * sizeof *cd->seen)))) {
		snprintf(err, errlen, "out of memory");
		return KVD_ENOMEM;
	}
	bucket_init(&cd->global, k->cfg.confd_global_rate_limit, k->now);
	if ((r = confd_load_key(k, err, errlen)))
		return r;
	return confd_listen(k, 0, err, errlen);
}

static int confd_bind(struct kvd *k, char *err, size_t errlen)
{
	int r;

	if (!k->confd)
		return 0;
	if (!k->cfg.confd_ganeti_config_key[0] && k->auth.enabled && !k->cfg.confd_user[0]) {
		snprintf(err, errlen, "confd keyspace mode with auth enabled needs --confd-user (whose read permissions "
		         "confd answers with): the HMAC key is not a kvd user");
		return KVD_EINVAL; /* known only once the store is read: after the data dir, still exit 2 */
	}
	if (!(r = confd_listen(k, 1, err, errlen)))
		kvd_log(k, KVD_LOG_INFO, "confd: serving Ganeti confd queries on udp %s (%s mode)", k->cfg.confd_listen,
		        k->cfg.confd_ganeti_config_key[0] ? "Ganeti" : "keyspace");
	return r;
}

/* Counters in one line (SIGHUP, shutdown, tests). */
static const char *const confd_drop_names[CONFD_D_N] = {"truncated", "rate", "source-rate", "magic", "envelope",
                                                        "hmac", "skew", "replay", "request"};

/* confd's counters for /metrics: received, answered, then each drop reason
 * (names in *names, *n of them).  -1 when confd is off.  Unused with
 * KVD_NO_HTTP. */
static KVD_UNUSED int confd_counters(const struct kvd *k, uint64_t *v, const char *const **names, unsigned *n)
{
	const struct confd *cd = k->confd;
	unsigned i;

	if (!cd)
		return -1;
	v[0] = cd->received;
	v[1] = cd->answered;
	for (i = 0; i < CONFD_D_N; i++)
		v[2 + i] = cd->dropped[i];
	*names = confd_drop_names;
	*n = CONFD_D_N;
	return 0;
}

static void confd_report(struct kvd *k, char *out, size_t cap)
{
	const char *const *names = confd_drop_names;
	const struct confd *cd = k->confd;
	size_t at;
	int i;

	if (!cd) {
		snprintf(out, cap, "confd off");
		return;
	}
	at = (size_t)snprintf(out, cap, "received=%llu answered=%llu too-big=%llu send-errors=%llu",
	                      (unsigned long long)cd->received, (unsigned long long)cd->answered,
	                      (unsigned long long)cd->too_big, (unsigned long long)cd->send_errors);
	for (i = 0; i < CONFD_D_N && at < cap; i++)
		at += (size_t)snprintf(out + at, cap - at, " dropped-%s=%llu", names[i], (unsigned long long)cd->dropped[i]);
}

/* SIGHUP: read the key file again (a bad one keeps the old key). */
static void confd_reload(struct kvd *k)
{
	char err[KVD_ERRLEN], line[512];

	if (!k->confd)
		return;
	confd_report(k, line, sizeof line);
	kvd_log(k, KVD_LOG_INFO, "confd: %s", line);
	if (confd_load_key(k, err, sizeof err))
		kvd_log(k, KVD_LOG_ERROR, "confd: key not reloaded, keeping the old one: %s", err);
	else
		kvd_log(k, KVD_LOG_INFO, "confd: key reloaded from %s", k->cfg.confd_hmac_key_file);
}

static void confd_close(struct kvd *k)
{
	struct confd *cd = k->confd;
	unsigned i;

	if (!cd)
		return;
	for (i = 0; i < cd->nfd; i++)
		close(cd->fds[i]);
	util_wipe(&cd->hmac_in, sizeof cd->hmac_in);
	util_wipe(&cd->hmac_out, sizeof cd->hmac_out);
	json_free(&cd->cfg);
	buf_free(k, &cd->out);
	buf_free(k, &cd->msg);
	buf_free(k, &cd->tmp);
	kvd_free(k, cd->src);
	kvd_free(k, cd->seen);
	kvd_free(k, cd);
	k->confd = NULL;
}

#else /* KVD_NO_CONFD: the responder is not built; asking for it is a configuration error */
static int confd_open(struct kvd *k, char *err, size_t errlen)
{
	if (!k->cfg.confd_hmac_key_file[0])
		return 0;
	snprintf(err, errlen, "--confd-hmac-key-file: kvd was built without confd (KVD_NO_CONFD)");
	return KVD_EINVAL;
}
static int confd_bind(struct kvd *k, char *err, size_t errlen) { (void)k, (void)err, (void)errlen; return 0; }
static void confd_read(struct kvd *k, int fd) { (void)k, (void)fd; }
static KVD_UNUSED int confd_counters(const struct kvd *k, uint64_t *v, const char *const **names, unsigned *n)
{
	(void)k, (void)v, (void)names, (void)n;
	return -1;
}
static void confd_report(struct kvd *k, char *out, size_t cap) { (void)k, snprintf(out, cap, "off (not built)"); }
static void confd_reload(struct kvd *k) { (void)k; }
static void confd_close(struct kvd *k) { (void)k; }
#endif /* KVD_NO_CONFD */

/* ===== 31. TLS: a transport under any protocol (tls_) ==================== */

/*
 * An https:// (or unixs://) listener's connections get the TLS transport
 * instead of the plain one; above it nothing changes -- the first
 * decrypted bytes choose the protocol as on a plain port, and HTTP/2, its
 * flow control and every call run as they do over TCP.  mbedtls does the
 * work; the poll loop drives it.
 *
 * Non-blocking.  mbedtls reads and writes the socket through two callbacks
 * that never block: a read with nothing there is MBEDTLS_ERR_SSL_WANT_READ,
 * a full socket MBEDTLS_ERR_SSL_WANT_WRITE, and either may come at any byte
 * of any record.  The handshake advances when the socket is readable (the
 * transport's recv) or, when a write was cut short, writable (the
 * connection asks for POLLOUT with want_write); mbedtls_ssl_write must be
 * given the same bytes again after WANT_WRITE, so the transport remembers
 * how many it offered (pending) and offers exactly those.
 *
 * Bounds.  A connection that has not finished its handshake and sent its
 * first bytes within KVD_PREFACE_TIMEOUT_MS is closed, as a silent plain
 * one is.  At most KVD_MAX_HANDSHAKES handshakes are in progress: a new one
 * displaces one of the address holding the most (section 3's fair shares),
 * so a flood of ClientHellos (or of 1-byte-per-second handshakes) from a few
 * addresses only displaces itself, never a slow honest handshake from
 * elsewhere.  Each loop iteration runs at most
 * KVD_HANDSHAKE_STEPS handshake steps (each may be a signature or a key
 * exchange), then serves everything else before the next; established
 * connections never wait behind more than that.  Per connection mbedtls
 * holds its record buffers (16 KiB in + 16 KiB out with Debian's build:
 * MBEDTLS_SSL_IN/OUT_CONTENT_LEN; a firmware build may shrink them) and the
 * session, ~34 KiB in all; kvd adds 160 bytes.
 *
 * What is offered: TLS 1.2, and TLS 1.3 where mbedtls has it (3.x with
 * MBEDTLS_SSL_PROTO_TLS1_3, which runs on PSA: psa_crypto_init once per
 * process; 2.28 has no TLS 1.3 server), within --tls-min-version and
 * --tls-max-version (tls_check_versions); ECDHE key exchange with AEAD
 * ciphers (AES-GCM, ChaCha20-Poly1305) unless --cipher-suites names other
 * TLS 1.2 ones (TLS 1.3's three are always offered, as Go does); ALPN h2
 * and http/1.1 (grpc-go requires h2); no renegotiation, no compression, no
 * session tickets (no ticket callbacks are set: no resumption state
 * outlives a certificate reload).  With --trusted-ca-file (alone, as
 * etcd reads it, or with --client-cert-auth) a client must present a
 * certificate that CA signed (and --client-crl-file has not revoked) or the
 * handshake fails; with --client-cert-allowed-hostname a SAN of its leaf
 * must also name one of those hosts, as Go's VerifyHostname matches them
 * (tls_names: the CN is never looked at), and no certificate it sends may
 * have a serial --client-crl-file lists (tls_revoked).  The client certificate's last CN stays with the
 * connection, every byte of it (with --client-cert-auth etcd takes it as the
 * user name when auth is on and no token is sent: "root\0.x" is no user).
 *
 * Certificates, key, CA and CRL are one generation (struct tls_cfg),
 * counted by the connections made with it.  SIGHUP reads them again: a good
 * set serves new connections at once while old ones finish on theirs; a bad
 * one is logged and the old set stays.
 *
 * Invariants:
 *   1. Nothing blocks: the BIO callbacks turn EAGAIN into WANT_READ or
 *      WANT_WRITE (tls_bio_recv, tls_bio_send), and after WANT_WRITE the
 *      same bytes are offered again (tls_send's t->pending).
 *   2. Handshakes are bounded and counted once each way: k->tls->handshaking
 *      and the share's SHARE_HANDSHAKES go up in tls_accept and down in
 *      tls_hs_end -- when one finishes (tls_step) or an unfinished one is
 *      freed (tls_free); at most KVD_HANDSHAKE_STEPS steps a loop turn
 *      (tls_step).
 *   3. The client's CN is given out only after a finished handshake, as
 *      bytes and a length (tls_peer_cn), never to be compared as a C
 *      string.
 *   4. A certificate generation lives while anything uses it: a ref for
 *      kvd's current one and one per connection (tls_accept), given back
 *      by tls_free and tls_reload (tls_cfg_unref); a reload that fails
 *      keeps the one in use.
 */

/* --tls-min-version / --tls-max-version, checked as etcd 3.7 checks them
 * (its words); 2 is TLS 1.2, 3 TLS 1.3.  TLS 1.3 needs an mbedtls that has
 * it (3.x with MBEDTLS_SSL_PROTO_TLS1_3): as a minimum it is refused
 * otherwise, as a maximum it means "the newest this build has". */
KVD_RESIDENT static int tls_check_versions(const struct kvd_config *cfg, int *min, int *max, char *err, size_t errlen)
{
	const char *v[2] = {cfg->tls_min_version, cfg->tls_max_version};
	int n[2] = {2, 3}, i;

	for (i = 0; i < 2; i++) {
		if (!v[i] || !v[i][0])
			continue;
		if (strcmp(v[i], "TLS1.2") && strcmp(v[i], "TLS1.3")) {
			snprintf(err, errlen, "unexpected TLS version \"%.32s\" (must be one of: TLS1.2, TLS1.3)", v[i]);
			return KVD_EINVAL;
		}
		n[i] = v[i][5] == '2' ? 2 : 3;
	}
	if (n[0] > n[1]) {
		snprintf(err, errlen, "min version (%s) is greater than max version (%s)", v[0], v[1]);
		return KVD_EINVAL;
	}
	if (n[0] == 3 && cfg->cipher_suites && cfg->cipher_suites[0]) {
		snprintf(err, errlen, "cipher suites cannot be configured when only TLS1.3 is enabled");
		return KVD_EINVAL;
	}
#if !defined(MBEDTLS_SSL_PROTO_TLS1_3)
	if (n[0] == 3) {
		snprintf(err, errlen, "--tls-min-version TLS1.3: this kvd's mbedtls has no TLS 1.3");
		return KVD_EINVAL;
	}
	n[1] = 2;
#endif
	if (min)
		*min = n[0];
	if (max)
		*max = n[1];
	return 0;
}

#ifndef KVD_NO_TLS

#ifndef KVD_MAX_HANDSHAKES /* @@ TLS handshakes in progress; a new one displaces one (tls_accept) */
#define KVD_MAX_HANDSHAKES 64
#endif
#ifndef KVD_HANDSHAKE_STEPS /* @@ TLS handshake steps per loop iteration */
#define KVD_HANDSHAKE_STEPS 16
#endif
#define TLS_MAX_SUITES 32
#define TLS_RECORD 16384            /* application bytes offered per mbedtls_ssl_write */

struct tls_cfg {
	unsigned refs;                  /* kvd's current one, and each connection made with it */
	mbedtls_ssl_config conf;
	mbedtls_x509_crt cert, ca;
	mbedtls_pk_context key;
	int suites[TLS_MAX_SUITES + 4]; /* --cipher-suites' or the defaults, TLS 1.3's, 0 */
	const char *alpn[3];            /* h2, http/1.1 (mbedtls keeps the pointer) */
	mbedtls_ecp_group_id curves[4]; /* key exchange groups, fastest first */
	char *allowed;                  /* --client-cert-allowed-hostname (a comma list), NULL if not given */
};

/* --client-crl-file, read again whenever the file changes (tls_crl_fresh). */
struct tls_crl {
	mbedtls_x509_crl crl;
	unsigned loaded : 1;            /* crl holds the file as it was at st */
	unsigned bad : 1;               /* the file changed into something unreadable: refuse every certificate */
	struct stat st;                 /* the file when last read */
};

struct tls_state {
	struct tls_cfg *cfg;            /* new connections use this one */
	struct tls_crl crl;             /* --client-crl-file's revoked serials */
	mbedtls_entropy_context entropy;
	mbedtls_ctr_drbg_context drbg;
	unsigned handshaking;           /* connections in a handshake */
	unsigned steps;                 /* handshake steps this loop iteration */
	uint64_t handshakes, failures, displaced;
};

struct tls_conn {
	mbedtls_ssl_context ssl;
	struct tls_cfg *cfg;
	size_t pending;                 /* bytes offered to a write that said WANT_WRITE */
	unsigned done : 1;              /* the handshake is over */
	unsigned cert : 1;              /* the client sent a certificate (verified) */
	char *cn;                       /* the client certificate's CN, its exact bytes (NUL added); NULL if none */
	size_t cnlen;
};

/* etcd's defaults in spirit: ECDHE, AEAD only. */
static const char *const tls_default_suites[] = {
	"TLS-ECDHE-ECDSA-WITH-AES-128-GCM-SHA256", "TLS-ECDHE-RSA-WITH-AES-128-GCM-SHA256",
	"TLS-ECDHE-ECDSA-WITH-AES-256-GCM-SHA384", "TLS-ECDHE-RSA-WITH-AES-256-GCM-SHA384",
	"TLS-ECDHE-ECDSA-WITH-CHACHA20-POLY1305-SHA256", "TLS-ECDHE-RSA-WITH-CHACHA20-POLY1305-SHA256", NULL,
};

#if defined(MBEDTLS_SSL_PROTO_TLS1_3)
static const char *const tls13_suites[] = {
	"TLS1-3-AES-128-GCM-SHA256", "TLS1-3-AES-256-GCM-SHA384", "TLS1-3-CHACHA20-POLY1305-SHA256", NULL,
};
#endif

static void tls_cfg_unref(struct kvd *k, struct tls_cfg *t)
{
	if (!t || --t->refs)
		return;
	mbedtls_ssl_config_free(&t->conf);
	mbedtls_x509_crt_free(&t->cert);
	mbedtls_x509_crt_free(&t->ca);
	mbedtls_pk_free(&t->key);
	kvd_free(k, t->allowed);
	kvd_free(k, t);
}

static void tls_why(int r, const char *what, const char *file, char *err, size_t errlen)
{
	char m[128];

	mbedtls_strerror(r, m, sizeof m);
	snprintf(err, errlen, "%s %.200s: %s", what, file, m);
}

/* A Go cipher suite name (etcd's --cipher-suites) as mbedtls knows it. */
static int tls_suite_id(const char *go)
{
	char name[96];
	size_t i;
	int id;

	for (i = 0; go[i] && i < sizeof name - 8; i++)
		name[i] = go[i] == '_' ? '-' : go[i];
	name[i] = 0;
	if ((id = mbedtls_ssl_get_ciphersuite_id(name)))
		return id;
	strcat(name, "-SHA256"); /* Go's CHACHA20_POLY1305 names drop the hash */
	return mbedtls_ssl_get_ciphersuite_id(name);
}

/*
 * --auto-tls: a self-signed ECDSA P-256 certificate made at start (in
 * memory; a restart makes another), valid a year from now, naming
 * localhost, 127.0.0.1 and ::1, as etcd's --auto-tls is meant to be used:
 * by clients that skip verification.
 */
static int tls_self_signed(struct kvd *k, struct tls_cfg *t, char *err, size_t errlen)
{
	/* subjectAltName: DNS localhost, IP 127.0.0.1, IP ::1 */
	static const uint8_t san[] = {0x30, 0x23, 0x82, 0x09, 'l', 'o', 'c', 'a', 'l', 'h', 'o', 's', 't',
	                              0x87, 0x04, 127, 0, 0, 1, 0x87, 0x10, 0, 0, 0, 0, 0, 0, 0, 0,
	                              0, 0, 0, 0, 0, 0, 0, 1};
	mbedtls_x509write_cert w;
	mbedtls_mpi serial;
	char from[16], to[16];
	uint8_t *der = kvd_malloc(k, 4096);
	int64_t now = (int64_t)time(NULL);
	struct util_tm a, b;
	int r, n = 0;

	mbedtls_x509write_crt_init(&w);
	mbedtls_mpi_init(&serial);
	if (!der) {
		snprintf(err, errlen, "out of memory");
		return KVD_ENOMEM;
	}
	util_utc(now, &a);
	util_utc(now + 365 * 86400, &b); /* etcd's default validity: 365 days */
	snprintf(from, sizeof from, "%04d%02d%02d%02d%02d%02d", a.year, a.mon, a.mday, a.hour, a.min, a.sec);
	snprintf(to, sizeof to, "%04d%02d%02d%02d%02d%02d", b.year, b.mon, b.mday, b.hour, b.min, b.sec);
	if ((r = mbedtls_pk_setup(&t->key, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY))) ||
	    (r = mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(t->key), mbedtls_ctr_drbg_random,
	                             &k->tls->drbg)) ||
	    (r = mbedtls_mpi_fill_random(&serial, 16, mbedtls_ctr_drbg_random, &k->tls->drbg)) ||
	    (r = mbedtls_mpi_set_bit(&serial, 127, 0)))
		goto out;
	mbedtls_x509write_crt_set_version(&w, MBEDTLS_X509_CRT_VERSION_3);
	mbedtls_x509write_crt_set_md_alg(&w, MBEDTLS_MD_SHA256);
	mbedtls_x509write_crt_set_subject_key(&w, &t->key);
	mbedtls_x509write_crt_set_issuer_key(&w, &t->key);
	if ((r = mbedtls_x509write_crt_set_subject_name(&w, "CN=kvd,O=kvd auto-tls")) ||
	    (r = mbedtls_x509write_crt_set_issuer_name(&w, "CN=kvd,O=kvd auto-tls")) ||
	    (r = mbedtls_x509write_crt_set_serial(&w, &serial)) ||
	    (r = mbedtls_x509write_crt_set_validity(&w, from, to)) ||
	    (r = mbedtls_x509write_crt_set_basic_constraints(&w, 0, -1)) ||
	    (r = mbedtls_x509write_crt_set_key_usage(&w, MBEDTLS_X509_KU_DIGITAL_SIGNATURE |
	                                                  MBEDTLS_X509_KU_KEY_ENCIPHERMENT)) ||
	    (r = mbedtls_x509write_crt_set_extension(&w, MBEDTLS_OID_SUBJECT_ALT_NAME,
	                                             MBEDTLS_OID_SIZE(MBEDTLS_OID_SUBJECT_ALT_NAME), 0, san, sizeof san)))
		goto out;
	if ((n = mbedtls_x509write_crt_der(&w, der, 4096, mbedtls_ctr_drbg_random, &k->tls->drbg)) < 0) {
		r = n;
		goto out;
	}
	r = mbedtls_x509_crt_parse_der(&t->cert, der + 4096 - n, (size_t)n); /* written at the buffer's end */
out:
	if (r)
		tls_why(r, "--auto-tls", "self-signed certificate", err, errlen);
	mbedtls_x509write_crt_free(&w);
	mbedtls_mpi_free(&serial);
	kvd_free(k, der);
	return r ? KVD_EIO : 0;
}

static int tls_auto(const struct kvd_config *cfg)
{
	return cfg->auto_tls && (!cfg->cert_file || !cfg->cert_file[0]);
}

/*
 * --client-crl-file, as etcd checks it: the serial numbers it lists refuse
 * any certificate the client sends with one (the leaf or any other in its
 * chain), by serial alone -- whoever signed the CRL, and however old or
 * young it is: a CRL past its nextUpdate, dated ahead of a board's wrong
 * clock, or issued by another CA still revokes what it lists and refuses
 * nobody else.  (mbedtls' own check, which kvd used before, refused every
 * certificate in those three cases.)  PEM or DER, several CRLs in one
 * file.  etcd reads the file at every connection; kvd reads it at start,
 * on SIGHUP, and at a handshake when it changed (its size, time or inode):
 * an update takes effect at once.  A file that changed into something
 * unreadable refuses every client certificate until it is fixed, as
 * etcd's does, and says so in the log.
 */
static int tls_crl_read(struct kvd *k, struct tls_crl *c, char *err, size_t errlen)
{
	const char *path = k->cfg.client_crl_file;
	mbedtls_x509_crl n;
	struct stat st;
	int r;

	if (stat(path, &st)) {
		snprintf(err, errlen, "--client-crl-file %.200s: %s", path, strerror(errno));
		return KVD_EINVAL;
	}
	mbedtls_x509_crl_init(&n);
	if ((r = mbedtls_x509_crl_parse_file(&n, path))) {
		mbedtls_x509_crl_free(&n);
		tls_why(r, "--client-crl-file", path, err, errlen);
		return KVD_EINVAL;
	}
	if (c->loaded)
		mbedtls_x509_crl_free(&c->crl);
	c->crl = n;
	c->loaded = 1;
	c->bad = 0;
	c->st = st;
	return 0;
}

/* The CRL as the file is now: read again when it changed.  0, or -1 when
 * it cannot be read (every certificate is then refused). */
static int tls_crl_fresh(struct kvd *k, struct tls_crl *c)
{
	char err[KVD_ERRLEN];
	struct stat st;
	int was_bad = c->bad;

	if (!stat(k->cfg.client_crl_file, &st) && c->loaded && st.st_size == c->st.st_size &&
	    st.st_ino == c->st.st_ino && st.st_mtime == c->st.st_mtime && !c->bad)
		return 0;
	if (!tls_crl_read(k, c, err, sizeof err)) {
		kvd_log(k, KVD_LOG_INFO, "--client-crl-file %s changed: read again", k->cfg.client_crl_file);
		return 0;
	}
	c->bad = 1;
	if (!was_bad)
		kvd_log(k, KVD_LOG_ERROR, "%s: every client certificate is refused until it can be read", err);
	return -1;
}

/* Does a serial number the CRL lists match crt's?  As Go compares them:
 * the magnitude's bytes, leading zeros dropped. */
static int tls_serial_eq(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
	while (an && !*a) {
		a++;
		an--;
	}
	while (bn && !*b) {
		b++;
		bn--;
	}
	return an == bn && !memcmp(a, b, an);
}

/* Is any certificate the client sent revoked?  1, with the serial logged. */
static int tls_revoked(struct kvd *k, const mbedtls_x509_crt *sent, const char *peer)
{
	const mbedtls_x509_crl *crl;
	const mbedtls_x509_crl_entry *e;
	const mbedtls_x509_crt *c;
	char hex[2 * 20 + 1];
	size_t i;

	if (!k->cfg.client_crl_file || !k->cfg.client_crl_file[0])
		return 0;
	if (tls_crl_fresh(k, &k->tls->crl)) {
		kvd_log(k, KVD_LOG_WARN, "%s: client certificate refused: --client-crl-file cannot be read", peer);
		return 1;
	}
	for (c = sent; c && c->raw.p; c = c->next)
		for (crl = &k->tls->crl.crl; crl && crl->raw.p; crl = crl->next)
			for (e = &crl->entry; e && e->raw.p; e = e->next)
				if (tls_serial_eq(e->serial.p, e->serial.len, c->serial.p, c->serial.len)) {
					for (i = 0; i < c->serial.len && i < 20; i++)
						snprintf(hex + 2 * i, 3, "%02x", c->serial.p[i]);
					hex[2 * i] = 0;
					kvd_log(k, KVD_LOG_WARN, "%s: rejected connection: certificate serial %s revoked", peer, hex);
					return 1;
				}
	return 0;
}

/* Read one generation of certificates from the flags. */
static int tls_cfg_load(struct kvd *k, struct tls_cfg **out, char *err, size_t errlen)
{
	const struct kvd_config *cfg = &k->cfg;
	struct tls_cfg *t = kvd_calloc(k, sizeof *t);
	int r, n = 0, vmin = 2, vmax = 2;
#if defined(MBEDTLS_SSL_PROTO_TLS1_3)
	int i;
#endif

	*out = NULL;
	if (!t) {
		snprintf(err, errlen, "out of memory");
		return KVD_ENOMEM;
	}
	t->refs = 1;
	mbedtls_ssl_config_init(&t->conf);
	mbedtls_x509_crt_init(&t->cert);
	mbedtls_x509_crt_init(&t->ca);
	mbedtls_pk_init(&t->key);
	if (!tls_auto(cfg) && (util_check_regular(cfg->cert_file, "--cert-file", err, errlen) ||
	                       util_check_regular(cfg->key_file, "--key-file", err, errlen)))
		goto fail; /* mbedtls opens them itself: a FIFO would block (at start, or on SIGHUP) */
	if (cfg->trusted_ca_file && cfg->trusted_ca_file[0] &&
	    util_check_regular(cfg->trusted_ca_file, "--trusted-ca-file", err, errlen))
		goto fail;
	if (cfg->client_crl_file && cfg->client_crl_file[0] &&
	    util_check_regular(cfg->client_crl_file, "--client-crl-file", err, errlen))
		goto fail;
	if (tls_auto(cfg)) {
		if (tls_self_signed(k, t, err, errlen))
			goto fail;
	} else if ((r = mbedtls_x509_crt_parse_file(&t->cert, cfg->cert_file))) {
		tls_why(r, "--cert-file", cfg->cert_file, err, errlen);
		goto fail;
	} else {
#if MBEDTLS_VERSION_MAJOR >= 3
		r = mbedtls_pk_parse_keyfile(&t->key, cfg->key_file, NULL, mbedtls_ctr_drbg_random, &k->tls->drbg);
#else
		r = mbedtls_pk_parse_keyfile(&t->key, cfg->key_file, NULL);
#endif
		if (r) {
			tls_why(r, "--key-file", cfg->key_file, err, errlen);
			goto fail;
		}
	}
#if MBEDTLS_VERSION_MAJOR >= 3
	r = mbedtls_pk_check_pair(&t->cert.pk, &t->key, mbedtls_ctr_drbg_random, &k->tls->drbg);
#else
	r = mbedtls_pk_check_pair(&t->cert.pk, &t->key);
#endif
	if (r) {
		snprintf(err, errlen, "--key-file %.200s does not match --cert-file %.200s", cfg->key_file, cfg->cert_file);
		goto fail;
	}
	if (cfg->trusted_ca_file && cfg->trusted_ca_file[0] &&
	    (r = mbedtls_x509_crt_parse_file(&t->ca, cfg->trusted_ca_file))) {
		tls_why(r, "--trusted-ca-file", cfg->trusted_ca_file, err, errlen);
		goto fail;
	}
	if (cfg->client_crl_file && cfg->client_crl_file[0] && tls_crl_read(k, &k->tls->crl, err, errlen))
		goto fail;
	t->alpn[0] = "h2";
	t->alpn[1] = "http/1.1";
	if ((r = mbedtls_ssl_config_defaults(&t->conf, MBEDTLS_SSL_IS_SERVER, MBEDTLS_SSL_TRANSPORT_STREAM,
	                                     MBEDTLS_SSL_PRESET_DEFAULT)) ||
	    (r = mbedtls_ssl_conf_own_cert(&t->conf, &t->cert, &t->key)) ||
	    (r = mbedtls_ssl_conf_alpn_protocols(&t->conf, t->alpn))) {
		tls_why(r, "TLS", "configuration", err, errlen);
		goto fail;
	}
	mbedtls_ssl_conf_rng(&t->conf, mbedtls_ctr_drbg_random, &k->tls->drbg);
	t->curves[0] = MBEDTLS_ECP_DP_CURVE25519; /* mbedtls would pick secp521r1: 5x slower */
	t->curves[1] = MBEDTLS_ECP_DP_SECP256R1;
	t->curves[2] = MBEDTLS_ECP_DP_SECP384R1;
	t->curves[3] = MBEDTLS_ECP_DP_NONE;
#if MBEDTLS_VERSION_MAJOR >= 3
	{
		static const uint16_t groups[] = {MBEDTLS_SSL_IANA_TLS_GROUP_X25519, MBEDTLS_SSL_IANA_TLS_GROUP_SECP256R1,
		                                  MBEDTLS_SSL_IANA_TLS_GROUP_SECP384R1, 0};
		mbedtls_ssl_conf_groups(&t->conf, groups);
	}
#else
	mbedtls_ssl_conf_curves(&t->conf, t->curves);
#endif
	if (tls_check_versions(cfg, &vmin, &vmax, err, errlen))
		goto fail;
	/* TLS 1.2 at least, as etcd 3.7 (its --tls-min-version default) */
#if MBEDTLS_VERSION_MAJOR >= 3
	mbedtls_ssl_conf_min_tls_version(&t->conf, vmin == 3 ? MBEDTLS_SSL_VERSION_TLS1_3 : MBEDTLS_SSL_VERSION_TLS1_2);
	mbedtls_ssl_conf_max_tls_version(&t->conf, vmax == 3 ? MBEDTLS_SSL_VERSION_TLS1_3 : MBEDTLS_SSL_VERSION_TLS1_2);
#else
	mbedtls_ssl_conf_min_version(&t->conf, MBEDTLS_SSL_MAJOR_VERSION_3, MBEDTLS_SSL_MINOR_VERSION_3);
	mbedtls_ssl_conf_max_version(&t->conf, MBEDTLS_SSL_MAJOR_VERSION_3, MBEDTLS_SSL_MINOR_VERSION_3);
#endif
#ifdef MBEDTLS_SSL_RENEGOTIATION /* a small mbedtls has none to turn off */
	mbedtls_ssl_conf_renegotiation(&t->conf, MBEDTLS_SSL_RENEGOTIATION_DISABLED);
#endif
	if (cfg->trusted_ca_file && cfg->trusted_ca_file[0]) /* the CRL is kvd's to check, as etcd's (tls_revoked) */
		mbedtls_ssl_conf_ca_chain(&t->conf, &t->ca, NULL);
	/* as etcd's TLSInfo: a trusted CA alone already means "require and verify a
	 * client certificate"; --client-cert-auth adds only the CN as the user */
	mbedtls_ssl_conf_authmode(&t->conf, cfg->client_cert_auth || (cfg->trusted_ca_file && cfg->trusted_ca_file[0])
	                                        ? MBEDTLS_SSL_VERIFY_REQUIRED : MBEDTLS_SSL_VERIFY_NONE);
	if (cfg->cipher_suites && cfg->cipher_suites[0]) {
		char list[1024], *p, *save;
		snprintf(list, sizeof list, "%s", cfg->cipher_suites);
		for (p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
			while (*p == ' ')
				p++;
			if (n == TLS_MAX_SUITES || !(t->suites[n++] = tls_suite_id(p))) {
				snprintf(err, errlen, "unexpected TLS cipher suite \"%.80s\"", p);
				goto fail;
			}
		}
	} else {
		for (; tls_default_suites[n]; n++)
			t->suites[n] = mbedtls_ssl_get_ciphersuite_id(tls_default_suites[n]);
	}
#if defined(MBEDTLS_SSL_PROTO_TLS1_3)
	/* TLS 1.3's three AEAD suites are always offered: --cipher-suites names
	 * TLS 1.2 ones only (Go's crypto/tls does not let 1.3's be chosen) */
	for (i = 0; vmax == 3 && tls13_suites[i] && n < TLS_MAX_SUITES + 3; i++)
		if ((t->suites[n] = mbedtls_ssl_get_ciphersuite_id(tls13_suites[i])))
			n++;
#endif
	t->suites[n] = 0;
	mbedtls_ssl_conf_ciphersuites(&t->conf, t->suites);
	if (cfg->client_cert_allowed_hostname && cfg->client_cert_allowed_hostname[0] && /* "": none (etcd: nobody) */
	    !(t->allowed = kvd_strdup(k, cfg->client_cert_allowed_hostname))) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	*out = t;
	return 0;
fail:
	tls_cfg_unref(k, t);
	return KVD_EINVAL;
}

/*
 * TLS at start-up, before the data dir is touched: refuses inconsistent or
 * unreadable settings with one line.  Nothing to do without https:// URLs.
 */
static int tls_init(struct kvd *k, int wanted, char *err, size_t errlen)
{
	const struct kvd_config *cfg = &k->cfg;
	int r;

	if (!wanted)
		return 0;
	if (!tls_auto(cfg) && (!cfg->cert_file || !cfg->cert_file[0] || !cfg->key_file || !cfg->key_file[0])) {
		snprintf(err, errlen, "TLS key/cert (--cert-file, --key-file) must be provided for client URLs with the "
		         "https scheme");
		return KVD_EINVAL;
	}
	if (cfg->client_cert_auth && (!cfg->trusted_ca_file || !cfg->trusted_ca_file[0])) {
		snprintf(err, errlen, "--client-cert-auth needs --trusted-ca-file");
		return KVD_EINVAL;
	}
	if (!(k->tls = kvd_calloc(k, sizeof *k->tls))) {
		snprintf(err, errlen, "out of memory");
		return KVD_ENOMEM;
	}
	mbedtls_entropy_init(&k->tls->entropy);
	mbedtls_ctr_drbg_init(&k->tls->drbg);
	if ((r = mbedtls_ctr_drbg_seed(&k->tls->drbg, mbedtls_entropy_func, &k->tls->entropy,
	                               (const unsigned char *)"kvd", 3))) {
		tls_why(r, "TLS", "random generator", err, errlen);
		return KVD_EIO;
	}
#if defined(MBEDTLS_SSL_PROTO_TLS1_3)
	/* once per process, and never stopped: another kvd in it may use it */
	if (psa_crypto_init() != PSA_SUCCESS) {
		snprintf(err, errlen, "TLS: PSA crypto did not start");
		return KVD_EIO;
	}
#endif
	return tls_cfg_load(k, &k->tls->cfg, err, errlen);
}

/* SIGHUP: read the certificates again; a bad set keeps the old one. */
static void tls_reload(struct kvd *k)
{
	struct tls_cfg *t;
	char err[KVD_ERRLEN];

	if (!k->tls || tls_auto(&k->cfg)) /* a self-signed one is kept as it is */
		return;
	if (tls_cfg_load(k, &t, err, sizeof err)) {
		kvd_log(k, KVD_LOG_WARN, "TLS reload: %s; keeping the certificates in use", err);
		return;
	}
	tls_cfg_unref(k, k->tls->cfg);
	k->tls->cfg = t;
	kvd_log(k, KVD_LOG_INFO, "TLS reload: certificates read again (new connections use them)");
}

static void tls_fini(struct kvd *k)
{
	if (!k->tls)
		return;
	if (k->tls->handshakes || k->tls->failures || k->tls->displaced) /* served some: say what */
		kvd_log(k, KVD_LOG_INFO, "tls: %llu handshakes, %llu failed, %llu displaced by newer ones",
		        (unsigned long long)k->tls->handshakes, (unsigned long long)k->tls->failures,
		        (unsigned long long)k->tls->displaced);
	tls_cfg_unref(k, k->tls->cfg);
	if (k->tls->crl.loaded)
		mbedtls_x509_crl_free(&k->tls->crl.crl);
	mbedtls_ctr_drbg_free(&k->tls->drbg);
	mbedtls_entropy_free(&k->tls->entropy);
	kvd_free(k, k->tls);
	k->tls = NULL;
}

/* ---- the transport ----------------------------------------------------------- */

static int tls_bio_send(void *ctx, const unsigned char *p, size_t n)
{
	struct conn *c = ctx;
	ssize_t r = send(c->fd, p, n, MSG_NOSIGNAL);

	if (r >= 0)
		return (int)r;
	if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
		c->want_write = 1;
		return MBEDTLS_ERR_SSL_WANT_WRITE;
	}
	return MBEDTLS_ERR_NET_SEND_FAILED;
}

static int tls_bio_recv(void *ctx, unsigned char *p, size_t n)
{
	struct conn *c = ctx;
	ssize_t r = recv(c->fd, p, n, 0);

	if (r >= 0)
		return (int)r;
	if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
		return MBEDTLS_ERR_SSL_WANT_READ;
	return MBEDTLS_ERR_NET_RECV_FAILED;
}

/*
 * --client-cert-allowed-hostname, as etcd checks it: Go's
 * x509.Certificate.VerifyHostname against the leaf, SANs only (the CN is
 * never looked at).  An IP (brackets allowed) matches only an IP SAN,
 * ::ffff:a.b.c.d and a.b.c.d alike; a name matches a dNSName SAN without
 * regard to ASCII case, one trailing dot of the name ignored, and a SAN
 * "*.x.y" matches exactly one label in place of its "*" (never "x.y", nor
 * "a.b.x.y"); a SAN that is no valid pattern only matches itself.
 */
static int tls_lower(int c)
{
	return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* Go's validHostname (its label characters; '*' alone as a pattern's first). */
static int tls_valid_host(const char *h, size_t n, int pattern)
{
	size_t i, start = 0;

	if (!pattern && n && h[n - 1] == '.')
		n--;
	if (!n || (n == 1 && h[0] == '*'))
		return 0;
	for (i = 0; i <= n; i++) {
		if (i < n && h[i] != '.')
			continue;
		if (i == start)
			return 0; /* an empty label */
		if (!(pattern && start == 0 && i == 1 && h[0] == '*')) {
			size_t j;
			for (j = start; j < i; j++) {
				char c = h[j];
				if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
				      (c == '-' && j != start)))
					return 0;
			}
		}
		start = i + 1;
	}
	return 1;
}

/* Go's matchHostnames: pattern p (a valid one) against host h, by labels. */
static int tls_match_pattern(const char *p, size_t pn, const char *h, size_t hn)
{
	size_t i = 0, j = 0;
	int first = 1;

	if (hn && h[hn - 1] == '.')
		hn--;
	if (!pn || !hn)
		return 0;
	for (;;) {
		size_t pe = i, he = j;
		while (pe < pn && p[pe] != '.')
			pe++;
		while (he < hn && h[he] != '.')
			he++;
		if (!(first && pe - i == 1 && p[i] == '*')) {
			size_t m;
			if (pe - i != he - j)
				return 0;
			for (m = 0; m < pe - i; m++)
				if (tls_lower((unsigned char)p[i + m]) != tls_lower((unsigned char)h[j + m]))
					return 0;
		}
		first = 0;
		if (pe == pn || he == hn)
			return pe == pn && he == hn;
		i = pe + 1;
		j = he + 1;
	}
}

/* Does the certificate's leaf name host h[0..n) (VerifyHostname)? */
static int tls_names(const mbedtls_x509_crt *crt, const char *h, size_t n)
{
	const mbedtls_x509_sequence *san;
	uint8_t ip[16];
	char t[64];
	size_t ipn = 0, i;
	int valid;

	if (n >= 3 && h[0] == '[' && h[n - 1] == ']' && n - 2 < sizeof t) {
		memcpy(t, h + 1, n - 2);
		t[n - 2] = 0;
	} else if (n < sizeof t) {
		memcpy(t, h, n);
		t[n] = 0;
	} else {
		t[0] = 0;
	}
	if (t[0] && inet_pton(AF_INET, t, ip) == 1)
		ipn = 4;
	else if (t[0] && inet_pton(AF_INET6, t, ip) == 1)
		ipn = 16;
#if MBEDTLS_VERSION_MAJOR >= 3
	san = mbedtls_x509_crt_has_ext_type(crt, MBEDTLS_X509_EXT_SUBJECT_ALT_NAME) ? &crt->subject_alt_names : NULL;
#else
	san = crt->ext_types & MBEDTLS_X509_EXT_SUBJECT_ALT_NAME ? &crt->subject_alt_names : NULL;
#endif
	valid = tls_valid_host(h, n, 0);
	for (; san && san->buf.p; san = san->next) {
		unsigned tag = san->buf.tag & MBEDTLS_ASN1_TAG_VALUE_MASK;
		const char *m = (const char *)san->buf.p;
		size_t mn = san->buf.len;
		if (ipn && tag == 7) { /* iPAddress: 4 or 16 bytes, a v4 equal to its v4-mapped v6 */
			static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
			if ((mn == ipn && !memcmp(m, ip, ipn)) ||
			    (mn == 16 && ipn == 4 && !memcmp(m, mapped, 12) && !memcmp(m + 12, ip, 4)) ||
			    (mn == 4 && ipn == 16 && !memcmp(ip, mapped, 12) && !memcmp(ip + 12, m, 4)))
				return 1;
			continue;
		}
		if (ipn || tag != 2)
			continue; /* an IP never matches a name */
		if (valid && tls_valid_host(m, mn, 1)) {
			if (tls_match_pattern(m, mn, h, n))
				return 1;
		} else if (mn == n && n && !(n == 1 && h[0] == '.') && !(mn == 1 && m[0] == '.')) {
			for (i = 0; i < n && tls_lower((unsigned char)m[i]) == tls_lower((unsigned char)h[i]); i++)
				;
			if (i == n)
				return 1;
		}
	}
	return 0;
}

/* Does the leaf name any host of the comma list (not trimmed: " b" is
 * not "b", and an empty entry names nothing), as etcd splits it? */
static int tls_names_any(const mbedtls_x509_crt *crt, const char *list)
{
	const char *p = list, *e;

	for (;; p = e + 1) {
		e = p + strcspn(p, ",");
		if (tls_names(crt, p, (size_t)(e - p)))
			return 1;
		if (!*e)
			return 0;
	}
}

/* A handshake is no longer in progress (done, or its connection gone). */
static void tls_hs_end(struct conn *c)
{
	if (c->k->tls)
		c->k->tls->handshaking--;
	if (c->share)
		c->share->n[SHARE_HANDSHAKES]--;
}

/* The handshake's next step: 0 once it is over, KVD_EAGAIN, or KVD_EIO. */
static int tls_step(struct conn *c)
{
	struct kvd *k = c->k;
	struct tls_conn *t = c->ts;
	const mbedtls_x509_crt *peer;
	const mbedtls_x509_name *nm;
	char why[128];
	int r, named;

	if (t->done)
		return 0;
	if (k->tls->steps >= KVD_HANDSHAKE_STEPS) {
		util_wake_by(k, k->now); /* next iteration: the others go first */
		return KVD_EAGAIN;
	}
	k->tls->steps++;
	r = mbedtls_ssl_handshake(&t->ssl);
	if (r == MBEDTLS_ERR_SSL_WANT_READ || r == MBEDTLS_ERR_SSL_WANT_WRITE)
		return KVD_EAGAIN;
	if (r) {
		mbedtls_strerror(r, why, sizeof why);
		kvd_log(k, KVD_LOG_INFO, "%s: TLS handshake failed: %s", c->peer, why);
		k->tls->failures++;
		return KVD_EIO;
	}
	t->done = 1;
	tls_hs_end(c);
	k->tls->handshakes++;
	if ((peer = mbedtls_ssl_get_peer_cert(&t->ssl))) {
		const mbedtls_x509_name *last = NULL;
		t->cert = 1;
		for (nm = &peer->subject; nm; nm = nm->next) /* the last CN, as Go's pkix.Name keeps it */
			if (nm->oid.p && !MBEDTLS_OID_CMP(MBEDTLS_OID_AT_CN, &nm->oid))
				last = nm;
		if (last) { /* every byte of it: a NUL or a length cap must not make it another user's name */
			if (!(t->cn = kvd_malloc(k, last->val.len + 1))) {
				kvd_log(k, KVD_LOG_WARN, "%s: out of memory after a TLS handshake: closed", c->peer);
				return KVD_EIO;
			}
			if (last->val.len)
				memcpy(t->cn, last->val.p, last->val.len);
			t->cn[last->val.len] = 0;
			t->cnlen = last->val.len;
		}
		named = !t->cfg->allowed || tls_names_any(peer, t->cfg->allowed);
		if (!named)
			kvd_log(k, KVD_LOG_INFO, "%s: client certificate does not name %s: refused", c->peer, t->cfg->allowed);
		if (!named || tls_revoked(k, peer, c->peer)) {
			mbedtls_ssl_send_alert_message(&t->ssl, MBEDTLS_SSL_ALERT_LEVEL_FATAL,
			                               MBEDTLS_SSL_ALERT_MSG_BAD_CERT);
			return KVD_EIO;
		}
	}
	if (k->cfg.log_level <= KVD_LOG_DEBUG) {
		char cn[80];
		size_t i;
		for (i = 0; t->cn && i < t->cnlen && i < sizeof cn - 1; i++) /* printable, for the log only */
			cn[i] = t->cn[i] >= 0x20 && t->cn[i] < 0x7f ? t->cn[i] : '?';
		cn[i] = 0;
		kvd_log(k, KVD_LOG_DEBUG, "%s: TLS %s %s, ALPN %s%s%s", c->peer, mbedtls_ssl_get_version(&t->ssl),
		        mbedtls_ssl_get_ciphersuite(&t->ssl), mbedtls_ssl_get_alpn_protocol(&t->ssl) ?
		        mbedtls_ssl_get_alpn_protocol(&t->ssl) : "-", t->cn ? ", client " : "", cn);
	}
	return 0;
}

static long tls_recv(struct conn *c, void *p, size_t n)
{
	struct tls_conn *t = c->ts;
	int r;

	if ((r = tls_step(c)))
		return r;
	r = mbedtls_ssl_read(&t->ssl, p, KVD_MIN(n, (size_t)INT_MAX));
	if (r > 0)
		return r;
	if (r == 0 || r == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY || r == MBEDTLS_ERR_SSL_CONN_EOF)
		return 0;
	if (r == MBEDTLS_ERR_SSL_WANT_READ || r == MBEDTLS_ERR_SSL_WANT_WRITE)
		return KVD_EAGAIN;
	return KVD_EIO;
}

/* Send up to n bytes of p (n 0: only move the handshake on). */
static long tls_send(struct conn *c, const void *p, size_t n)
{
	struct tls_conn *t = c->ts;
	size_t len;
	int r;

	if ((r = tls_step(c)))
		return r;
	if (!n && !t->pending)
		return 0;
	len = t->pending ? t->pending : KVD_MIN(n, (size_t)TLS_RECORD);
	r = mbedtls_ssl_write(&t->ssl, p, len);
	if (r > 0) {
		t->pending = 0;
		return r;
	}
	if (r == MBEDTLS_ERR_SSL_WANT_WRITE || r == MBEDTLS_ERR_SSL_WANT_READ) {
		t->pending = len; /* the same bytes next time: mbedtls holds a record of them */
		return KVD_EAGAIN;
	}
	return KVD_EIO;
}

/* Before the write side closes: a close_notify, best effort. */
static void tls_shut(struct conn *c)
{
	struct tls_conn *t = c->ts;

	if (t->done)
		mbedtls_ssl_close_notify(&t->ssl);
}

static void tls_free(struct conn *c)
{
	struct tls_conn *t = c->ts;

	if (!t)
		return;
	if (!t->done)
		tls_hs_end(c);
	mbedtls_ssl_free(&t->ssl);
	tls_cfg_unref(c->k, t->cfg);
	kvd_free(c->k, t->cn);
	kvd_free(c->k, t);
	c->ts = NULL;
}

static const struct net_transport tls_transport = {"tls", tls_recv, tls_send, tls_shut, tls_free};

/*
 * A new connection on an https:// listener.  When KVD_MAX_HANDSHAKES are in
 * progress, one makes room (section 3's rule): the oldest of the address
 * holding the most, when it holds at least two more than the newcomer's;
 * else the newcomer's own oldest; else the oldest of all.  So a flood of
 * half-open ClientHellos from a few addresses displaces itself, never a
 * slow honest handshake from elsewhere.
 */
static int tls_accept(struct kvd *k, struct conn *c)
{
	struct tls_conn *t;
	struct conn *o, *oldest = NULL;

	if (k->tls->handshaking >= KVD_MAX_HANDSHAKES) {
		struct share *top = share_max(k, SHARE_HANDSHAKES), *from;
		from = share_may_take(top, c->share, SHARE_HANDSHAKES, 2) ? top
		     : c->share && c->share->n[SHARE_HANDSHAKES] ? c->share : NULL;
		for (o = k->conns; o; o = o->next)
			if (o->tr == &tls_transport && !o->dead && o->ts && !((struct tls_conn *)o->ts)->done &&
			    (!from || o->share == from) && (!oldest || o->t_open < oldest->t_open))
				oldest = o;
		if (oldest) {
			tls_free(oldest); /* its handshake slot goes now; the socket at the reap */
			oldest->dead = 1;
			k->tls->displaced++;
			k->st.yields[YIELD_HANDSHAKES] += from == top && top != c->share;
		}
	}
	if (!(t = kvd_calloc(k, sizeof *t)))
		return KVD_ENOMEM;
	mbedtls_ssl_init(&t->ssl);
	if (mbedtls_ssl_setup(&t->ssl, &k->tls->cfg->conf)) {
		mbedtls_ssl_free(&t->ssl);
		kvd_free(k, t);
		return KVD_ENOMEM;
	}
	mbedtls_ssl_set_bio(&t->ssl, c, tls_bio_send, tls_bio_recv, NULL);
	t->cfg = k->tls->cfg;
	t->cfg->refs++;
	c->ts = t;
	k->tls->handshaking++;
	if (c->share)
		c->share->n[SHARE_HANDSHAKES]++;
	return 0;
}

/* The verified client certificate's CN: who a call without a token is, with
 * --client-cert-auth (section 19).  NULL if the client sent no certificate,
 * "" if its certificate has no CN or an empty one (etcd: that user "", who
 * does not exist); *n its length (it may hold NULs: compare it by length,
 * never as a C string). */
KVD_UNUSED static const char *tls_peer_cn(const struct conn *c, size_t *n) /* unused: KVD_NO_AUTH and _HTTP */
{
	const struct tls_conn *t = c->tr == &tls_transport ? c->ts : NULL;

	*n = t && t->done && t->cn ? t->cnlen : 0;
	return t && t->done && t->cert ? (t->cn ? t->cn : "") : NULL;
}

/* Does c speak TLS (an https:// or unixs:// listener's)? */
KVD_UNUSED static int tls_is(const struct conn *c) /* unused: KVD_NO_HTTP */
{
	return c->tr == &tls_transport;
}

#else
KVD_UNUSED static const char *tls_peer_cn(const struct conn *c, size_t *n)
{
	(void)c;
	*n = 0;
	return NULL;
}

KVD_UNUSED static int tls_is(const struct conn *c)
{
	(void)c;
	return 0;
}
#endif /* KVD_NO_TLS */

/* ===== 32. HTTP requests and answers, HTTP/1.x or HTTP/2 (http1_, http_) = */

#ifndef KVD_NO_HTTP /* sections 32 to 34 */

/*
 * etcd serves HTTP/1.1 on its client port beside gRPC: /health for
 * supervisors and load balancers, /version, /metrics and the JSON gateway.
 * A connection whose first bytes (decrypted, over TLS: ALPN is only
 * logged) are an HTTP/1.x request line gets this protocol; an HTTP/2
 * request whose content-type is not gRPC's (curl over TLS, Prometheus,
 * anything on a metrics listener) is routed the same way on its stream, as
 * etcd's grpcHandlerFunc does (h2_on_block, then http_h2_begin in section
 * 34).  Both answer /health, /livez, /readyz and /version as etcd 3.7 does,
 * /metrics in Prometheus' text format (section 34), and /v3/... through
 * the gateway (section 33); anything else is Go's 404.  This section is
 * the parser and the writing of answers (http_head and its kin: bytes of
 * HTTP/1.x, or an HTTP/2 stream's head, data and trailer blocks).
 *
 * The parser follows picohttpparser's contract: it reads at most
 * HTTP1_MAX_HEAD bytes of request line and headers, allocates nothing (the
 * fields it returns point into the input), and says "need more" (0) apart
 * from "bad" (a status to answer with: 400; 431 when the head or its
 * header count is too large; 501 for a transfer coding other than chunked;
 * 417 for an Expect other than 100-continue).  Requests are answered in
 * order (pipelining works; a request waits while the one before it is
 * served), keep-alive is HTTP/1.1's default.  A body for an endpoint that
 * takes none is read and dropped up to HTTP1_MAX_BODY; a longer or chunked
 * one closes the connection after the answer.  A request head must arrive
 * within KVD_PREFACE_TIMEOUT_MS of its first byte; an idle keep-alive
 * connection, or a request body that stops coming, is closed after
 * --max-idle-time, as an idle HTTP/2 connection is.
 *
 * CORS as etcd's access controller: with --cors "*" (the default) every
 * answer allows any origin; with a list, an answer carries the request's
 * Origin when it is on the list; OPTIONS on any path is 200 with nothing
 * more (etcd answers preflights itself).
 *
 * Invariants:
 *   1. The parser reads no byte past min(n, HTTP1_MAX_HEAD) and keeps
 *      nothing: a struct http_req points into c->in, valid until that
 *      input is consumed (http1_parse).
 *   2. A request has one framing or is refused: Content-Length is digits
 *      only and repeats must agree; a coding other than chunked is 501;
 *      chunked beside a Content-Length is chunked, and the connection closes
 *      after it (http1_parse).  No body is read two ways.
 *   3. Answers are written as Go's net/http writes them, header order
 *      included (http1_head); a request kvd cannot read on from is
 *      answered, then the connection closes (http1_fail).
 *   4. An Origin is echoed only when --cors lists it, and never one that
 *      holds a ',' or does not fit (http1_cors); the list was checked at
 *      start (http1_check_flags).
 */

#define HTTP1_MAX_HEAD 8192
#define HTTP1_MAX_HEADERS 64
#define HTTP1_MAX_BODY (64 * 1024)
#define HTTP1_GO_BUFFER 2048 /* net/http's bufferBeforeChunkingSize */

struct http_req {
	const char *why;            /* a refusal's body, Go's words (NULL: the status's own) */
	const char *method, *target;
	size_t mlen, tlen;
	int minor;                  /* HTTP/1.<minor> */
	unsigned close : 1;         /* the connection ends after the answer */
	unsigned chunked : 1;
	unsigned expect : 1;        /* Expect: 100-continue */
	uint64_t clen;              /* Content-Length, 0 if none */
	struct hp_field h[HTTP1_MAX_HEADERS]; /* pointing into the input */
	unsigned nh;
};

/*
 * One HTTP request being answered, whatever carries it: an HTTP/1.x
 * connection (one request at a time: struct http1_conn embeds it) or an
 * HTTP/2 stream that is not gRPC (h2_stream.hx, section 17, made by
 * http_h2_begin).  The endpoints (section 34) and the gateway (section 33)
 * write through http_head, http_raw, http_chunk, http_last and http_fin and
 * never learn which it is; on HTTP/1.x those write c->out as Go's net/http
 * would, on HTTP/2 they fill head, data and trailer, which http_h2_send
 * moves into frames within the stream's windows.
 */
struct http_x {
	struct conn *c;
	struct h2_stream *s;        /* HTTP/2: the stream carrying it; NULL: HTTP/1.x on c */
	int minor;                  /* HTTP/1.<minor>; 1 on HTTP/2 */
	char origin[128];           /* CORS: the origin to allow, "" none */
	unsigned close : 1;         /* HTTP/1.x: the connection closes after this answer */
	/* the gateway call (section 33), x->call */
	unsigned in_call : 1;
	unsigned stream : 1;        /* the answer is a stream of {"result":...} */
	unsigned bidi : 1;          /* each JSON value of the body is a message */
	unsigned hdr_sent : 1;
	unsigned delivered : 1;     /* the request (or the end of a stream's) went to the call */
	unsigned plain : 1;         /* the JSON could not be read: no call was answered */
	unsigned body_done : 1;
	unsigned trailers : 1;      /* TE: trailers -- grpc-gateway then sends its trailers */
	unsigned ended : 1;         /* HTTP/2: the answer is whole (http_last, http_fin) */
	struct call *call;          /* the gateway's call: http1_conn's, or the stream's own */
	struct kvd_buf *body;       /* body bytes not yet made messages: http1_conn's, or the stream's in */
	struct kvd_buf head, data, trailer; /* HTTP/2: a header block (HPACK), DATA bytes, a trailer block */
};

struct http1_conn {
	struct http_x x;            /* the request being answered */
	uint64_t body_left;         /* bytes of a request body still to drop */
	int64_t t_head;             /* ms: a partial head began, 0 if none */
	unsigned body_chunked : 1;
	int chunk_st;               /* chunked body: 0 size line, 1 data, 2 its CRLF, 3 trailers */
	uint64_t body_clen;         /* Content-Length bytes still to come */
	uint64_t chunk_left;        /* data bytes left in this chunk */
	struct kvd_buf body;        /* body bytes not yet made messages */
	struct call call;
};

static int http1_ieq(const char *a, size_t n, const char *b)
{
	return strlen(b) == n && !strncasecmp(a, b, n);
}

/* Does the comma list v[0..n) hold token t (case-insensitive)? */
static int http1_has_token(const char *v, size_t n, const char *t)
{
	size_t i = 0, j;

	while (i < n) {
		while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
			i++;
		for (j = i; j < n && v[j] != ','; j++)
			;
		while (j > i && (v[j - 1] == ' ' || v[j - 1] == '\t'))
			j--;
		if (http1_ieq(v + i, j - i, t))
			return 1;
		i = j + 1;
	}
	return 0;
}

/*
 * The request head at p[0..n): its length, 0 when more is needed, or
 * KVD_EINVAL with the status to answer in *status.  Bounded, non-allocating.
 */
static long http1_parse(const uint8_t *p, size_t n, struct http_req *r, int *status)
{
	const uint8_t *end, *q, *eol, *colon;
	size_t lim = KVD_MIN(n, (size_t)HTTP1_MAX_HEAD), i;
	uint64_t v;
	int have_len = 0, have_te = 0, hosts = 0;

	memset(r, 0, offsetof(struct http_req, h));
	r->nh = 0;
	*status = 400;
	for (i = 0, end = NULL; i + 1 < lim; i++) /* the blank line that ends the head */
		if (p[i] == '\n' && (p[i + 1] == '\n' || (p[i + 1] == '\r' && i + 2 < lim && p[i + 2] == '\n'))) {
			end = p + i + (p[i + 1] == '\n' ? 2 : 3);
			break;
		}
	if (!end) {
		if (n < HTTP1_MAX_HEAD)
			return 0;
		*status = 431;
		return KVD_EINVAL;
	}
	/* request line: method SP target SP HTTP/1.d */
	for (q = p; q < end && h2_token_char(*q >= 'A' && *q <= 'Z' ? (unsigned char)(*q | 0x20) : *q); q++)
		;
	if (q == p || *q != ' ')
		return KVD_EINVAL;
	r->method = (const char *)p;
	r->mlen = (size_t)(q - p);
	r->target = (const char *)++q;
	for (; q < end && *q > ' ' && *q < 0x7f; q++)
		;
	r->tlen = (size_t)(q - (const uint8_t *)r->target);
	if (!r->tlen || end - q < 10 || *q != ' ' || memcmp(q + 1, "HTTP/1.", 7) || q[8] < '0' || q[8] > '9')
		return KVD_EINVAL;
	r->minor = q[8] - '0';
	q += 9;
	if (*q == '\r')
		q++;
	if (*q++ != '\n')
		return KVD_EINVAL;
	r->close = r->minor == 0;
	/* headers */
	for (; q < end && *q != '\r' && *q != '\n'; q = eol + 1) {
		const char *name = (const char *)q, *val;
		size_t nl, vl;
		for (eol = q; eol < end && *eol != '\n'; eol++)
			;
		if (eol == end)
			return KVD_EINVAL;
		if (r->nh == HTTP1_MAX_HEADERS) {
			*status = 431;
			return KVD_EINVAL;
		}
		for (colon = q; colon < eol && *colon != ':'; colon++)
			if (!h2_token_char(*colon >= 'A' && *colon <= 'Z' ? (unsigned char)(*colon | 0x20) : *colon))
				return KVD_EINVAL;
		if (colon == eol || colon == q)
			return KVD_EINVAL;
		nl = (size_t)(colon - q);
		for (q = colon + 1; q < eol && (*q == ' ' || *q == '\t'); q++)
			;
		val = (const char *)q;
		vl = (size_t)(eol - q);
		while (vl && (val[vl - 1] == '\r' || val[vl - 1] == ' ' || val[vl - 1] == '\t'))
			vl--;
		r->h[r->nh].name = name;
		r->h[r->nh].nlen = (uint32_t)nl;
		r->h[r->nh].value = val;
		r->h[r->nh].vlen = (uint32_t)vl;
		r->nh++;
		if (http1_ieq(name, nl, "content-length")) {
			for (v = 0, i = 0; i < vl; i++) {
				if (val[i] < '0' || val[i] > '9' || v > (UINT64_MAX - 9) / 10)
					return KVD_EINVAL;
				v = v * 10 + (uint64_t)(val[i] - '0');
			}
			if (!vl || (have_len && v != r->clen))
				return KVD_EINVAL;
			r->clen = v;
			have_len = 1;
		} else if (http1_ieq(name, nl, "transfer-encoding")) {
			if (!http1_ieq(val, vl, "chunked") || have_te++) { /* "chunked, chunked" or twice: as Go, 501 */
				*status = 501; /* a coding HTTP/1.1 need not know */
				return KVD_EINVAL;
			}
			r->chunked = 1;
		} else if (http1_ieq(name, nl, "host")) {
			hosts++;
		} else if (http1_ieq(name, nl, "connection")) {
			if (http1_has_token(val, vl, "close"))
				r->close = 1;
			else if (http1_has_token(val, vl, "keep-alive"))
				r->close = 0;
		} else if (http1_ieq(name, nl, "expect")) {
			if (!http1_ieq(val, vl, "100-continue")) {
				*status = 417;
				return KVD_EINVAL;
			}
			r->expect = 1;
		}
	}
	if (hosts > 1 || (!hosts && r->minor == 1)) { /* as Go: one Host, and HTTP/1.1 must send it */
		r->why = hosts ? "400 Bad Request\n" : "400 Bad Request: missing required Host header";
		return KVD_EINVAL;
	}
	if (r->chunked && r->minor == 0) { /* Go ignores it and reads no body: the chunks would be a request */
		r->why = "400 Bad Request: chunked transfer coding on HTTP/1.0";
		return KVD_EINVAL;
	}
	if (r->chunked && have_len) { /* RFC 9112 6.3: chunked wins, and the connection ends after */
		r->clen = 0;
		r->close = 1;
	}
	return (long)(end - p);
}

/* The value of header name in r, NULL if absent (its length in *n). */
static const char *http1_header(const struct http_req *r, const char *name, size_t *n)
{
	unsigned i;

	for (i = 0; i < r->nh; i++)
		if (http1_ieq(r->h[i].name, r->h[i].nlen, name)) {
			*n = r->h[i].vlen;
			return r->h[i].value;
		}
	return NULL;
}

static const char *http1_reason(int status)
{
	static const struct { short code; const char *text; } reasons[] = {
		{200, "OK"}, {400, "Bad Request"}, {401, "Unauthorized"}, {403, "Forbidden"}, {404, "Not Found"},
		{405, "Method Not Allowed"}, {408, "Request Timeout"}, {409, "Conflict"}, {412, "Precondition Failed"},
		{307, "Temporary Redirect"}, {413, "Request Entity Too Large"}, {417, "Expectation Failed"},
		{429, "Too Many Requests"}, {499, "status code 499"}, /* Go's words for a code it has no text for */
		{431, "Request Header Fields Too Large"}, {500, "Internal Server Error"}, {501, "Not Implemented"},
		{503, "Service Unavailable"}, {504, "Gateway Timeout"},
	};
	size_t i;

	for (i = 0; i < KVD_COUNT(reasons); i++)
		if (reasons[i].code == status)
			return reasons[i].text;
	return "";
}

/* --cors as etcd checks it: "*" or URLs with a port, else its words. */
static int http1_check_flags(const struct kvd *k, char *err, size_t errlen)
{
	const char *p = k->cfg.cors ? k->cfg.cors : "*", *e, *host, *colon;

	for (; *p; p = *e ? e + 1 : e) {
		size_t n;
		e = strchr(p, ',');
		e = e ? e : p + strlen(p);
		n = (size_t)(e - p);
		if (!n || (n == 1 && *p == '*'))
			continue;
		for (host = p; host + 3 <= e && memcmp(host, "://", 3); host++)
			;
		host = host + 3 <= e ? host + 3 : p;
		colon = memchr(host, ':', (size_t)(e - host));
		if (!colon || colon + 1 == e || memchr(host, '/', (size_t)(e - host))) {
			snprintf(err, errlen, "invalid value \"%s\" for flag -cors: URL address does not have the form "
			         "\"host:port\": %.*s", k->cfg.cors, (int)n, p);
			return KVD_EINVAL;
		}
	}
	return 0;
}

/* Which origin this request's answers allow (etcd's --cors): "*", the
 * request's Origin when listed, or none. */
static void http1_cors(struct kvd *k, struct http_x *x, const struct http_req *r)
{
	const char *list = k->cfg.cors ? k->cfg.cors : "*", *o;
	size_t n = 0;

	x->origin[0] = 0;
	if (x->c->metrics_only) /* etcd's metrics listener has no access controller: no CORS */
		return;
	if (!*list || http1_has_token(list, strlen(list), "*")) {
		strcpy(x->origin, "*");
		return;
	}
	o = http1_header(r, "origin", &n);
	if (o && n && n < sizeof x->origin && !memchr(o, ',', n)) {
		char t[sizeof x->origin];
		memcpy(t, o, n);
		t[n] = 0;
		if (http1_has_token(list, strlen(list), t))
			memcpy(x->origin, t, n + 1);
	}
}

/* RFC 7231's IMF-fixdate, now. */
static void http_date(char *date, size_t cap)
{
	static const char day[] = "SunMonTueWedThuFriSat", mon[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
	struct util_tm tm;

	util_utc((int64_t)time(NULL), &tm);
	snprintf(date, cap, "%.3s, %02d %.3s %04d %02d:%02d:%02d GMT", day + 3 * tm.wday, tm.mday,
	         mon + 3 * (tm.mon - 1), tm.year, tm.hour, tm.min, tm.sec);
}

#define HTTP_CORS_FIELDS "Access-Control-Allow-Headers: accept, content-type, authorization\r\n" \
                         "Access-Control-Allow-Methods: POST, GET, OPTIONS, PUT, DELETE\r\n"

/* HTTP/2: header lines ("Name: value\r\n"...) into an HPACK block, names
 * lowercased; HTTP/1.x's connection-specific fields are left out (RFC 9113
 * 8.2.2), Transfer-Encoding among them. */
static void http_h2_fields(struct kvd *k, struct kvd_buf *b, const char *f)
{
	char name[64];
	const char *colon, *eol, *v;
	size_t nl, i;

	while (*f && (eol = strstr(f, "\r\n")) && (colon = memchr(f, ':', (size_t)(eol - f)))) {
		nl = (size_t)(colon - f);
		for (v = colon + 1; *v == ' '; v++)
			;
		if (nl < sizeof name) {
			for (i = 0; i < nl; i++)
				name[i] = (char)(f[i] >= 'A' && f[i] <= 'Z' ? f[i] | 0x20 : f[i]);
			name[nl] = 0;
			if (strcmp(name, "connection") && strcmp(name, "transfer-encoding") && strcmp(name, "keep-alive"))
				hp_put_field(k, b, 0, name, v, (size_t)(eol - v));
		}
		f = eol + 2;
	}
}

/*
 * The head of an answer: on HTTP/1.x a status line and headers as Go's
 * net/http writes them -- the CORS headers and `fields` (already in Go's
 * sorted order), Date, then the framing header, and Connection: close when
 * the connection ends after this answer; on HTTP/2 the same fields in a
 * HEADERS block, the framing's Content-Length kept (Go's http2 server
 * sends one for a body written whole), Transfer-Encoding and Connection not.
 */
static void http_head(struct kvd *k, struct http_x *x, int status, const char *fields, const char *framing,
                      int close)
{
	struct conn *c = x->c;
	char hdr[2048], date[40];
	int n, te;

	http_date(date, sizeof date);
	if (x->s) {
		hp_put_status(k, &x->head, status);
		if (x->origin[0]) {
			http_h2_fields(k, &x->head, HTTP_CORS_FIELDS);
			hp_put_field(k, &x->head, 0, "access-control-allow-origin", x->origin, strlen(x->origin));
		}
		http_h2_fields(k, &x->head, fields);
		http_h2_fields(k, &x->head, framing);
		hp_put_field(k, &x->head, 0, "date", date, strlen(date));
		return;
	}
	/* Go writes Date, Content-Length, a sniffed Content-Type, Connection, then Transfer-Encoding */
	te = !strncmp(framing, "Transfer-Encoding", 17);
	n = snprintf(hdr, sizeof hdr, "HTTP/1.%d %d %s\r\n%s%s%s%sDate: %s\r\n%s%s%s\r\n", x->minor ? 1 : 0, status,
	             http1_reason(status), x->origin[0] ? HTTP_CORS_FIELDS "Access-Control-Allow-Origin: " : "",
	             x->origin, x->origin[0] ? "\r\n" : "", fields, date, te ? "" : framing,
	             close && x->minor ? "Connection: close\r\n" : "", te ? framing : "");
	buf_append(k, &c->out, hdr, (size_t)KVD_MIN(n, (int)sizeof hdr - 1));
	if (close)
		c->is_closing = 1;
}

/* Bytes of a body whose framing the head gave (Content-Length, or up to the
 * close on HTTP/1.0). */
static void http_raw(struct kvd *k, struct http_x *x, const void *p, size_t n)
{
	buf_append(k, x->s ? &x->data : &x->c->out, p, n);
}

/* A piece of a chunked body: chunk framing on HTTP/1.1, raw bytes on
 * HTTP/1.0 (the close ends it) and in HTTP/2's DATA. */
static void http_chunk(struct kvd *k, struct http_x *x, const void *p, size_t n)
{
	struct kvd_buf *b = x->s ? &x->data : &x->c->out;
	char t[24];

	if (x->minor && !x->s) {
		snprintf(t, sizeof t, "%zx\r\n", n);
		buf_append(k, b, t, strlen(t));
	}
	buf_append(k, b, p, n);
	if (x->minor && !x->s)
		buf_append(k, b, "\r\n", 2);
}

/* The end of a chunked body, with trailer lines tr ("" none): the last
 * chunk on HTTP/1.1, a trailing HEADERS block on HTTP/2. */
static void http_last(struct kvd *k, struct http_x *x, const char *tr)
{
	if (x->s) {
		http_h2_fields(k, &x->trailer, tr);
		x->ended = 1;
	} else if (x->minor) {
		buf_append(k, &x->c->out, "0\r\n", 3);
		buf_append(k, &x->c->out, tr, strlen(tr));
		buf_append(k, &x->c->out, "\r\n", 2);
	}
}

/* The end of a body the head framed (nothing to write on HTTP/1.x). */
static void http_fin(struct http_x *x)
{
	x->ended = 1;
}

/* A whole answer with a Content-Length body. */
static void http_answer(struct kvd *k, struct http_x *x, int status, const char *fields, const char *body)
{
	char len[48];

	snprintf(len, sizeof len, "Content-Length: %zu\r\n", strlen(body));
	http_head(k, x, status, fields, len, x->close);
	http_raw(k, x, body, strlen(body));
	http_fin(x);
}

#define HTTP1_TEXT "Content-Type: text/plain; charset=utf-8\r\n"

/* A whole answer whose Content-Type Go sniffed from the body (the handler
 * set none): Go writes it after Content-Length. */
static void http_answer_sniffed(struct kvd *k, struct http_x *x, int status, const char *body)
{
	char fr[96];

	snprintf(fr, sizeof fr, "Content-Length: %zu\r\n" HTTP1_TEXT, strlen(body));
	http_head(k, x, status, "", fr, x->close);
	http_raw(k, x, body, strlen(body));
	http_fin(x);
}
#define HTTP1_NOSNIFF HTTP1_TEXT "X-Content-Type-Options: nosniff\r\n"

/* An HTTP/1.x request kvd cannot go on reading: answered, then the
 * connection closes. */
static int http1_fail(struct kvd *k, struct conn *c, int status, const char *body)
{
	struct http1_conn *h = c->ps;

	h->x.minor = 1;
	h->x.close = 1;
	http_answer(k, &h->x, status, HTTP1_TEXT, body);
	return KVD_EINVAL;
}

/* ===== 33. The JSON gateway: POST /v3/<service>/<method> (gw_) =========== */

/*
 * etcd 3.7 answers JSON on its client port through grpc-gateway v2, which
 * turns each request into a gRPC call to etcd itself.  kvd has no second
 * server to call: a gateway request becomes a call (section 8) whose
 * carrier is this connection.  Its JSON body is encoded to protobuf bytes
 * (section 7 owns the mapping) and the call meets the same decoder and the
 * same handler a gRPC request meets; the messages the handler queues are
 * unpacked and written back as JSON.  Nothing here knows an RPC's meaning.
 *
 * One call at a time per connection: a pipelined request waits in c->in
 * until the call before it has answered.  Unary calls (and server streams:
 * Snapshot, Observe) read their whole body first, bounded by twice
 * --max-request-bytes plus 64 KiB (gw_max_body: base64 is 4/3 of the bytes
 * it carries); bidi streams (Watch, LeaseKeepAlive) take each JSON value
 * of the body as a message as it arrives, as the gateway's decoder loop
 * does, and keep answering after the body ends; a value that cannot be
 * read ends what the stream sends, as the gateway's send loop stops (etcd
 * then answers nothing until its server ends the stream).  Bodies may
 * come with Content-Length or chunked, after a 100 Continue when the
 * client asked for one.
 *
 * Answers as etcd's gateway writes them: a unary success is 200 with
 * Grpc-Metadata-Content-Type; an error (the RPC's, or JSON that cannot be
 * read: 400) is {"code":n,"message":...} with the HTTP status grpc-gateway
 * v2 maps the code to, and a 401 says its message in WWW-Authenticate.  Both
 * have a Content-Length unless the request said TE: trailers -- then they
 * are chunked, and an RPC error ends with the Grpc-Trailer-Content-Type
 * trailer.  A stream is chunked, one {"result":...} line per message, and an
 * error ends it with an {"error":{"code","message"}} line.  Unknown paths
 * under /v3/ are 404 {"code":5}, a known one asked with another method 501
 * {"code":12} (v2's routing errors).  HTTP/1.0 clients get the same bytes
 * unchunked, then a close.
 *
 * Invariants:
 *   1. The gateway is a carrier, no more: a body becomes protobuf bytes
 *      (json_pj_decode) that meet call_message, and answers are read back
 *      from the call's queue (gw_message_json); only gw_routes names RPCs.
 *   2. The durability contract: nothing of a held call is written
 *      (gw_flush: KVD_NEVER(cl->held)).
 *   3. One call per connection (the embedded h->call, h->in_call): the next
 *      request waits in c->in until gw_end, and a client that pipelines
 *      more than HTTP1_MAX_HEAD + HTTP1_MAX_BODY ahead is closed (gw_input).
 *   4. Bodies are bounded (gw_max_body: 413; chunk lines within
 *      HTTP1_MAX_HEAD: 400; gw_body) and count toward --max-request-buffer
 *      (gw_recharge; over it, gw_shed ends the call).
 *   5. A unary answer leaves only once the whole body is read, so the
 *      connection stays in step (gw_flush); a body left unread closes the
 *      connection after the answer (gw_end).
 */

/* gateway path after /v3/ -> gRPC method (etcd 3.7's google.api.http
 * routes: /v3/maintenance/hash is still Hash, HashKV has its own) */
static const struct {
	const char *gw, *rpc;
} gw_routes[] = {
	{"kv/range", "/etcdserverpb.KV/Range"},
	{"kv/put", "/etcdserverpb.KV/Put"},
	{"kv/deleterange", "/etcdserverpb.KV/DeleteRange"},
	{"kv/txn", "/etcdserverpb.KV/Txn"},
	{"kv/compaction", "/etcdserverpb.KV/Compact"},
	{"watch", "/etcdserverpb.Watch/Watch"},
	{"lease/grant", "/etcdserverpb.Lease/LeaseGrant"},
	{"lease/revoke", "/etcdserverpb.Lease/LeaseRevoke"},
	{"kv/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke"},
	{"lease/keepalive", "/etcdserverpb.Lease/LeaseKeepAlive"},
	{"lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive"},
	{"kv/lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive"},
	{"lease/leases", "/etcdserverpb.Lease/LeaseLeases"},
	{"kv/lease/leases", "/etcdserverpb.Lease/LeaseLeases"},
	{"cluster/member/add", "/etcdserverpb.Cluster/MemberAdd"},
	{"cluster/member/remove", "/etcdserverpb.Cluster/MemberRemove"},
	{"cluster/member/update", "/etcdserverpb.Cluster/MemberUpdate"},
	{"cluster/member/list", "/etcdserverpb.Cluster/MemberList"},
	{"cluster/member/promote", "/etcdserverpb.Cluster/MemberPromote"},
	{"maintenance/alarm", "/etcdserverpb.Maintenance/Alarm"},
	{"maintenance/status", "/etcdserverpb.Maintenance/Status"},
	{"maintenance/defragment", "/etcdserverpb.Maintenance/Defragment"},
	{"maintenance/hash", "/etcdserverpb.Maintenance/Hash"},
	{"maintenance/hashkv", "/etcdserverpb.Maintenance/HashKV"},
	{"maintenance/snapshot", "/etcdserverpb.Maintenance/Snapshot"},
	{"maintenance/transfer-leadership", "/etcdserverpb.Maintenance/MoveLeader"},
	{"maintenance/downgrade", "/etcdserverpb.Maintenance/Downgrade"},
#ifndef KVD_NO_AUTH
	{"auth/enable", "/etcdserverpb.Auth/AuthEnable"},
	{"auth/disable", "/etcdserverpb.Auth/AuthDisable"},
	{"auth/status", "/etcdserverpb.Auth/AuthStatus"},
	{"auth/authenticate", "/etcdserverpb.Auth/Authenticate"},
	{"auth/user/add", "/etcdserverpb.Auth/UserAdd"},
	{"auth/user/get", "/etcdserverpb.Auth/UserGet"},
	{"auth/user/list", "/etcdserverpb.Auth/UserList"},
	{"auth/user/delete", "/etcdserverpb.Auth/UserDelete"},
	{"auth/user/changepw", "/etcdserverpb.Auth/UserChangePassword"},
	{"auth/user/grant", "/etcdserverpb.Auth/UserGrantRole"},
	{"auth/user/revoke", "/etcdserverpb.Auth/UserRevokeRole"},
	{"auth/role/add", "/etcdserverpb.Auth/RoleAdd"},
	{"auth/role/get", "/etcdserverpb.Auth/RoleGet"},
	{"auth/role/list", "/etcdserverpb.Auth/RoleList"},
	{"auth/role/delete", "/etcdserverpb.Auth/RoleDelete"},
	{"auth/role/grant", "/etcdserverpb.Auth/RoleGrantPermission"},
	{"auth/role/revoke", "/etcdserverpb.Auth/RoleRevokePermission"},
#endif
#ifndef KVD_NO_RECIPES
	{"lock/lock", "/v3lockpb.Lock/Lock"},
	{"lock/unlock", "/v3lockpb.Lock/Unlock"},
	{"election/campaign", "/v3electionpb.Election/Campaign"},
	{"election/proclaim", "/v3electionpb.Election/Proclaim"},
	{"election/leader", "/v3electionpb.Election/Leader"},
	{"election/observe", "/v3electionpb.Election/Observe"},
	{"election/resign", "/v3electionpb.Election/Resign"},
#endif
};

/* grpc-gateway v2's HTTPStatusFromCode (v1 said 408 to Canceled, 412 to
 * FailedPrecondition). */
static int gw_http_status(int code)
{
	static const short st[] = {200, 499, 500, 400, 504, 404, 409, 403, 429, 400, 409, 400, 501, 500, 503, 500, 401};
	return code >= 0 && code < (int)KVD_COUNT(st) ? st[code] : 500;
}

/* The gRPC method of a gateway path (after /v3/), NULL if none. */
static const char *gw_find(const char *path, size_t n)
{
	size_t i;

	for (i = 0; i < KVD_COUNT(gw_routes); i++)
		if (strlen(gw_routes[i].gw) == n && !memcmp(gw_routes[i].gw, path, n))
			return gw_routes[i].rpc;
	return NULL;
}

static uint64_t gw_max_body(const struct kvd *k)
{
	return (uint64_t)k->cfg.max_request_bytes * 2 + 65536;
}

static const struct call_carrier gw_carrier = {"gateway", NULL};

/* The gateway's call on HTTP/2 is the stream's own: its carrier drops what
 * is still buffered once the call is answered, as a gRPC stream's does. */
static void grpc_finished(struct kvd *k, struct call *c);
static const struct call_carrier gw_h2_carrier = {"gateway", grpc_finished};

/* Start a gateway call for request r (its method found as rpc). */
static void gw_begin(struct kvd *k, struct http_x *x, const struct http_req *r, const char *rpc)
{
	struct call *cl = x->call;
	struct hp_field f[HTTP1_MAX_HEADERS];
	char names[HTTP1_MAX_HEAD];
	unsigned i, nf = 0;
	size_t at = 0, j, tl = 0;
	const char *te = http1_header(r, "te", &tl);

	x->in_call = 1;
	x->body_done = !r->chunked && !r->clen && (!x->s || x->s->remote_closed);
	x->trailers = 0; /* grpc-gateway: strings.Contains(strings.ToLower(TE), "trailers") */
	for (j = 0; te && j + 8 <= tl && !x->trailers; j++)
		x->trailers = !strncasecmp(te + j, "trailers", 8);
	if (x->s) { /* the stream's call, made with the stream */
		cl->carrier = &gw_h2_carrier;
	} else { /* the connection's one call; the body's framing (gw_body) */
		struct http1_conn *h = x->c->ps;
		h->body_chunked = r->chunked;
		h->body_clen = r->clen;
		call_init(k, cl, NULL, &gw_carrier);
		cl->conn = x->c;
	}
	/* grpc-gateway's metadata: Authorization as is, Grpc-Metadata-* stripped */
	for (i = 0; i < r->nh; i++) {
		const char *n = r->h[i].name;
		size_t nl = r->h[i].nlen, skip = 0;
		if (http1_ieq(n, nl, "authorization"))
			skip = 0;
		else if (nl > 14 && !strncasecmp(n, "grpc-metadata-", 14))
			skip = 14;
		else
			continue;
		if (at + nl - skip + 1 > sizeof names)
			break;
		for (j = skip; j < nl; j++)
			names[at + j - skip] = (char)(n[j] >= 'A' && n[j] <= 'Z' ? n[j] | 0x20 : n[j]);
		f[nf].name = names + at;
		f[nf].nlen = (uint32_t)(nl - skip);
		f[nf].value = r->h[i].value;
		f[nf].vlen = r->h[i].vlen;
		nf++;
		at += nl - skip + 1;
	}
	if (call_keep_meta(k, cl, f, nf)) {
		call_finish(k, cl, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return;
	}
	if (call_route(k, cl, rpc, strlen(rpc)))
		return;
	x->bidi = cl->m->kind == GRPC_BIDI;
	x->stream = cl->m->kind != GRPC_UNARY;
	if (r->expect && !x->body_done && r->minor && !x->s) /* Go's server says it when the body is first read */
		buf_append(k, &x->c->out, "HTTP/1.1 100 Continue\r\n\r\n", 25);
}

/* The request's JSON could not be read: the gateway answers before any call. */
static void gw_bad_json(struct kvd *k, struct http_x *x, int code, const char *why)
{
	x->plain = 1;
	call_finish(k, x->call, code, "%s", why);
}

/* The gateway's CloseSend on a bidi stream.  One that got no message hears
 * it as its service takes a half-close (Watch stays open, LeaseKeepAlive
 * ends OK), not as call_half_close's Unknown "EOF" for a missing request. */
static void gw_close_send(struct kvd *k, struct call *cl)
{
	if (cl->got_msg || cl->finished)
		call_half_close(k, cl, 0);
	else if (cl->m->on_half_close)
		cl->m->on_half_close(k, cl);
}

/*
 * Body bytes in x->body: hand over complete JSON values, as grpc-gateway's
 * json.Decoder finds them (sections 6 and 7: json_scan, then json_pj_decode).  A
 * bidi stream takes each as it completes; the others take the first once
 * the body is whole (grpc-gateway reads one value and ignores what follows;
 * a body of nothing but space is an empty request).
 */
static void gw_deliver(struct kvd *k, struct http_x *x)
{
	struct call *cl = x->call;
	struct kvd_buf pb = {0};
	char why[JSON_PB_WHY];
	size_t from, to;
	int r;

	while (x->in_call && !cl->finished && !x->delivered && (x->bidi || x->body_done)) {
		r = json_scan(BUF_DATA(x->body), BUF_LEN(x->body), x->body_done, &from, &to, why);
		if (r == KVD_EAGAIN)
			return; /* more to come */
		if (!r && from == to) { /* the body is over, between values */
			x->delivered = 1;
			if (!x->bidi) {
				call_message(k, cl, (const uint8_t *)"", 0);
				call_half_close(k, cl, 0);
			} else { /* v2's send loop ends with CloseSend, whatever it read */
				gw_close_send(k, cl);
			}
			return;
		}
		if (!r) {
			r = json_pj_decode(k, &pb, cl->m->req, BUF_DATA(x->body) + from, to - from, why);
			buf_consume(x->body, to);
		}
		if (r == KVD_ENOMEM) {
			buf_free(k, &pb);
			call_finish(k, cl, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			return;
		}
		if (r) {
			buf_free(k, &pb);
			if (x->bidi) { /* the gateway's send loop just stops: nobody hears why */
				x->delivered = 1;
				gw_close_send(k, cl);
			} else {
				gw_bad_json(k, x, GRPC_INVALID_ARGUMENT, why);
			}
			return;
		}
		call_message(k, cl, BUF_DATA(&pb), BUF_LEN(&pb));
		buf_free(k, &pb);
		if (!x->bidi) {
			x->delivered = 1;
			call_half_close(k, cl, 0);
		}
	}
}

/*
 * Move HTTP/1.x request body bytes from c->in to h->body (Content-Length or
 * chunked), bounded.  0, or KVD_EINVAL after answering a bad or too large body.
 */
static int gw_body(struct kvd *k, struct conn *c)
{
	struct http1_conn *h = c->ps;
	const uint8_t *p, *e;
	size_t take;

	while (!h->x.body_done && BUF_LEN(&c->in)) {
		p = BUF_DATA(&c->in);
		if (!h->body_chunked || h->chunk_st == 1) {
			uint64_t want = h->body_chunked ? h->chunk_left : h->body_clen;
			take = (size_t)KVD_MIN((uint64_t)BUF_LEN(&c->in), want);
			if (h->x.delivered || !h->x.in_call || h->call.finished) /* nobody takes it */
				;
			else if (buf_append(k, &h->body, p, take))
				return http1_fail(k, c, 500, "kvd: out of memory\n");
			buf_consume(&c->in, take);
			if (h->body_chunked) {
				if (!(h->chunk_left -= take))
					h->chunk_st = 2;
			} else if (!(h->body_clen -= take)) {
				h->x.body_done = 1;
			}
			if (BUF_LEN(&h->body) > gw_max_body(k))
				return http1_fail(k, c, 413, "413 Request Entity Too Large\n");
			continue;
		}
		/* a chunk-size line, the CRLF after a chunk, or trailer lines */
		e = memchr(p, '\n', KVD_MIN(BUF_LEN(&c->in), (size_t)HTTP1_MAX_HEAD));
		if (!e) {
			if (BUF_LEN(&c->in) >= HTTP1_MAX_HEAD)
				return http1_fail(k, c, 400, "400 Bad Request\n");
			return 0;
		}
		take = (size_t)(e - p) + 1;
		if (h->chunk_st == 2) { /* CRLF after the data: exactly that (Go) */
			if (take != 2 || p[0] != '\r')
				return http1_fail(k, c, 400, "malformed chunked encoding");
			h->chunk_st = 0;
		} else if (h->chunk_st == 3) { /* trailers until an empty line */
			if (take <= 2)
				h->x.body_done = 1;
		} else { /* a chunk-size line as Go reads one: CRLF, at most 16 hex digits, ";ext" */
			uint64_t v = 0;
			size_t i, nd = 0, eol = take - 1;
			if (take < 2 || p[take - 2] != '\r')
				return http1_fail(k, c, 400, "chunked line ends with bare LF");
			if (memchr(p, '\r', take - 2))
				return http1_fail(k, c, 400, "invalid CR in chunked line");
			for (eol = take - 2; eol && (p[eol - 1] == ' ' || p[eol - 1] == '\t'); eol--)
				;
			for (i = 0; i < eol && p[i] != ';'; i++, nd++) {
				int x = p[i] >= '0' && p[i] <= '9' ? p[i] - '0' : (p[i] | 0x20) >= 'a' && (p[i] | 0x20) <= 'f' ? (p[i] | 0x20) - 'a' + 10 : -1;
				if (x < 0)
					return http1_fail(k, c, 400, "invalid byte in chunk length");
				if (nd == 16) /* even zeros: Go counts digits, not value */
					return http1_fail(k, c, 400, "http chunk length too large");
				v = v << 4 | (uint64_t)x;
			}
			if (!nd)
				return http1_fail(k, c, 400, "empty hex number for chunk length");
			if (v > gw_max_body(k))
				return http1_fail(k, c, 413, "413 Request Entity Too Large\n");
			h->chunk_left = v;
			h->chunk_st = v ? 1 : 3;
		}
		buf_consume(&c->in, take);
	}
	return 0;
}

/* One response message (gRPC-framed at the front of cl->out) as JSON onto b;
 * html: inside a stream's line (section 7). */
static int gw_message_json(struct kvd *k, struct call *cl, struct kvd_buf *b, int html)
{
	const uint8_t *p = BUF_DATA(&cl->out);
	uint32_t n = get_be32(p + 1);
	ProtobufCMessage *m;
	int oom;

	if (BUF_LEN(&cl->out) < 5 + (size_t)n)
		return KVD_EPROTO;
	m = pb_unpack(k, cl->m->resp, p + 5, n, &oom);
	buf_consume(&cl->out, 5 + (size_t)n);
	if (!m)
		return oom ? KVD_ENOMEM : KVD_EPROTO;
	json_pb_write(k, b, m, html);
	pb_free(k, m);
	return b->err ? KVD_ENOMEM : 0;
}

/* Is s[0..n) UTF-8?  protojson refuses to write a string that is not. */
static int gw_utf8(const char *s, size_t n)
{
	size_t i, l;

	for (i = 0; i < n; i += l)
		if (!(l = utf8_len((const uint8_t *)s + i, (const uint8_t *)s + n)))
			return 0;
	return 1;
}

/* grpc-gateway v2's error object, a google.rpc.Status: {"code":n,"message":m},
 * the message left out when empty (protojson omits unpopulated fields).
 * html: inside a stream's {"error":...}, which encoding/json re-encodes
 * (HTML-safe) around protojson's bytes. */
static void gw_status_json(struct kvd *k, struct kvd_buf *b, const struct call *cl, int html)
{
	const char *msg = cl->status_msg ? cl->status_msg : "";
	size_t n;

	if (!strcmp(msg, E_STOPPING)) /* etcd 3.7's gateway, a gRPC client, sees its server's connection end */
		msg = "error reading from server: EOF";
	n = strlen(msg);

	json_put_raw(k, b, "{\"code\":");
	json_put_int(k, b, cl->status);
	if (n) {
		json_put_raw(k, b, ",\"message\":");
		json_put_pjstr(k, b, msg, n, html);
	}
	json_put_raw(k, b, "}");
}

/* The gateway call's body is what this connection counts toward
 * --max-request-buffer. */
static void gw_recharge(struct kvd *k, struct conn *c)
{
	struct http1_conn *h = c->ps;

	if (BUF_LEN(&h->body) != c->in_held)
		net_held(k, c, (int64_t)BUF_LEN(&h->body) - (int64_t)c->in_held);
}

/* Over --max-request-buffer (net_shed): the call whose body is held ends
 * RESOURCE_EXHAUSTED (its answer once the body is read), the body dropped. */
static int gw_shed(struct kvd *k, struct conn *c)
{
	struct http1_conn *h = c->ps;

	if (!h->x.in_call || !BUF_LEN(&h->body))
		return 0;
	kvd_log(k, KVD_LOG_INFO, "%s: %zu gateway body bytes dropped (--max-request-buffer is full; this address "
	        "holds the most)", c->peer, BUF_LEN(&h->body));
	call_finish(k, &h->call, GRPC_RESOURCE_EXHAUSTED, "%s", E_INPUT_FULL);
	buf_free(k, &h->body);
	gw_recharge(k, c);
	return 1;
}

/* The call is over and answered: on HTTP/1.x, ready for the next request;
 * on HTTP/2 the stream ends once its answer is sent (its call goes with it). */
static void gw_end(struct kvd *k, struct http_x *x)
{
	struct conn *c = x->c;
	struct http1_conn *h;

	x->in_call = x->stream = x->bidi = x->hdr_sent = x->delivered = x->plain = 0;
	if (x->s)
		return;
	h = c->ps;
	call_fini(k, &h->call);
	buf_free(k, &h->body);
	gw_recharge(k, c);
	if (x->close || !x->body_done || !x->minor)
		c->is_closing = 1; /* HTTP/1.0, or a body still coming that nobody reads */
	x->body_done = 0;
	h->chunk_st = 0;
	c->t_active = k->now;
	if (BUF_LEN(&c->in) && !c->is_closing)
		util_wake_by(k, k->now); /* a pipelined request waits: read it next round */
}

static void gw_stream_error(struct kvd *k, struct http_x *x);

/*
 * A whole body as Go's server frames a handler's writes: with a
 * Content-Length when it fits net/http's 2048-byte buffer (and the handler
 * did not ask for chunking), else chunked -- or, for HTTP/1.0, up to the
 * close.  tr: the trailer section after the last chunk ("" none).
 */
static void gw_body_out(struct kvd *k, struct http_x *x, int status, const char *fields, const struct kvd_buf *b,
                        int chunk, const char *tr)
{
	char len[48];

	chunk = chunk || BUF_LEN(b) > HTTP1_GO_BUFFER;
	snprintf(len, sizeof len, "Content-Length: %zu\r\n", BUF_LEN(b));
	http_head(k, x, status, fields, !chunk ? len : x->minor ? "Transfer-Encoding: chunked\r\n" : "", 0);
	if (!chunk) {
		http_raw(k, x, BUF_DATA(b), BUF_LEN(b));
		http_fin(x);
		return;
	}
	http_chunk(k, x, BUF_DATA(b), BUF_LEN(b));
	if (!x->minor)
		x->close = 1;
	else
		http_last(k, x, tr);
}

static const char *gw_meta_fields(const struct kvd *k, const struct http_x *x, int ok);

/* The error answer of a call that sent nothing yet. */
static void gw_error_answer(struct kvd *k, struct http_x *x)
{
	struct call *cl = x->call;
	struct kvd_buf b = {0};
	const char *msg = cl->status_msg ? cl->status_msg : "";
	char fields[1024], auth[300];
	int hs = gw_http_status(cl->status);
	size_t i;

	if (x->stream && !x->plain) { /* grpc-gateway's stream error, before any message */
		snprintf(fields, sizeof fields, "Content-Type: application/json\r\n%s", gw_meta_fields(k, x, 0));
		http_head(k, x, hs, fields, x->minor ? "Transfer-Encoding: chunked\r\n" : "", 0);
		gw_stream_error(k, x);
		http_last(k, x, "");
		return;
	}
	if (!gw_utf8(msg, strlen(msg))) { /* protojson cannot write it: DefaultHTTPErrorHandler's fallback */
		json_put_raw(k, &b, "{\"code\": 13, \"message\": \"failed to marshal error message\"}");
		gw_body_out(k, x, 500, "Content-Type: application/json\r\n", &b, 0, "");
		buf_free(k, &b);
		return;
	}
	gw_status_json(k, &b, cl, 0);
	/* a 401 says why in WWW-Authenticate (Go writes a CR or LF in a value as a space) */
	snprintf(auth, sizeof auth, "%s", msg);
	for (i = 0; auth[i]; i++)
		if (auth[i] == '\r' || auth[i] == '\n')
			auth[i] = ' ';
	/* with TE: trailers an RPC's error is chunked and ends with its trailer;
	 * JSON that could not be read (no call was made) has no trailer */
	snprintf(fields, sizeof fields, "Content-Type: application/json\r\n%s%s%s%s%s", x->plain ? "" : gw_meta_fields(k, x, 0),
	         x->trailers && !x->plain ? "Trailer: Grpc-Trailer-Content-Type\r\n" : "",
	         cl->status == GRPC_UNAUTHENTICATED ? "Www-Authenticate: " : "",
	         cl->status == GRPC_UNAUTHENTICATED ? auth : "", cl->status == GRPC_UNAUTHENTICATED ? "\r\n" : "");
	gw_body_out(k, x, hs, fields, &b, x->trailers,
	            x->trailers && !x->plain ? "Grpc-Trailer-Content-Type: application/grpc\r\n" : "");
	buf_free(k, &b);
}

/* {"error":{"code":n,"message":m}} and the stream's delimiter: how
 * grpc-gateway v2 ends a stream with an error. */
static void gw_stream_error(struct kvd *k, struct http_x *x)
{
	struct kvd_buf b = {0};

	json_put_raw(k, &b, "{\"error\":");
	gw_status_json(k, &b, x->call, 1);
	json_put_raw(k, &b, "}\n");
	http_chunk(k, x, BUF_DATA(&b), BUF_LEN(&b));
	buf_free(k, &b);
}

/*
 * The header metadata of the RPC's answer, as grpc-gateway forwards it
 * (Grpc-Metadata-*, after Content-Type in Go's sorted order).  On a plain
 * port etcd's gateway reaches its gRPC server natively: a success has
 * content-type, an error is trailers-only and has none.  On a TLS port it
 * goes through the HTTP handler that also wrote the CORS headers, and
 * grpc-go's handler transport always sends headers first: every RPC's
 * answer, errors too, carries those CORS headers (when "*" allows the
 * gateway's own request, which has no Origin), content-type and the
 * Trailer it announces.
 */
static const char *gw_meta_fields(const struct kvd *k, const struct http_x *x, int ok)
{
	const char *list = k->cfg.cors ? k->cfg.cors : "*";

	if (!tls_is(x->c))
		return ok ? "Grpc-Metadata-Content-Type: application/grpc\r\n" : "";
	if (!*list || http1_has_token(list, strlen(list), "*"))
		return "Grpc-Metadata-Access-Control-Allow-Headers: accept, content-type, authorization\r\n"
		       "Grpc-Metadata-Access-Control-Allow-Methods: POST, GET, OPTIONS, PUT, DELETE\r\n"
		       "Grpc-Metadata-Access-Control-Allow-Origin: *\r\n"
		       "Grpc-Metadata-Content-Type: application/grpc\r\nGrpc-Metadata-Trailer: Grpc-Status-Details-Bin\r\n";
	return "Grpc-Metadata-Content-Type: application/grpc\r\nGrpc-Metadata-Trailer: Grpc-Status-Details-Bin\r\n";
}

/* Room for more of a stream's answer: the connection's output (HTTP/1.x),
 * or the stream's own DATA queue (HTTP/2, which its windows drain). */
static int gw_room(const struct http_x *x)
{
	return x->s ? BUF_LEN(&x->data) < 16384 && BUF_LEN(&x->c->out) < KVD_MAX_OUTPUT
	            : BUF_LEN(&x->c->out) < KVD_MAX_OUTPUT;
}

/* Answers: what the call has for its client, as the client's HTTP allows
 * (the protocol's flush, after the group commit released held replies).
 * On HTTP/1.x a unary answer waits for the whole body, so the connection
 * stays in step; an HTTP/2 stream has no step to keep. */
static void gw_flush(struct kvd *k, struct http_x *x)
{
	struct call *cl = x->call;
	struct kvd_buf b = {0};
	char fields[640];
	int whole = x->body_done || x->bidi || x->s;

	if (!x->in_call || KVD_NEVER(cl->held)) /* the durability contract: see loop_log_flush */
		return;
	if (!x->stream || (x->plain && cl->finished)) {
		if (!cl->finished || !whole)
			return;
		if (cl->status == GRPC_OK && !x->stream) {
			if (BUF_LEN(&cl->out) >= 5 && !gw_message_json(k, cl, &b, 0)) {
				/* TE: trailers makes it chunked, though a success has no trailer to send */
				snprintf(fields, sizeof fields, "Content-Type: application/json\r\n%s", gw_meta_fields(k, x, 1));
				gw_body_out(k, x, 200, fields, &b, x->trailers, "");
				buf_free(k, &b);
				gw_end(k, x);
				return;
			}
			buf_free(k, &b); /* out of memory (a message kvd cannot read back would be its bug) */
			cl->status = GRPC_RESOURCE_EXHAUSTED;
			kvd_free(k, cl->status_msg);
			cl->status_msg = kvd_strdup(k, "kvd: out of memory");
		}
		gw_error_answer(k, x);
		gw_end(k, x);
		return;
	}
	for (;;) { /* a stream: each message a {"result":...} line */
		if (!BUF_LEN(&cl->out) && cl->produce && !cl->finished && gw_room(x))
			cl->m->on_produce(k, cl);
		if (BUF_LEN(&cl->out) < 5 || !gw_room(x))
			break;
		if (!x->hdr_sent) {
			snprintf(fields, sizeof fields, "Content-Type: application/json\r\n%s", gw_meta_fields(k, x, 1));
			http_head(k, x, 200, fields, x->minor ? "Transfer-Encoding: chunked\r\n" : "", 0);
			x->hdr_sent = 1;
		}
		b.rd = b.len = 0;
		json_put_raw(k, &b, "{\"result\":");
		if (gw_message_json(k, cl, &b, 1)) {
			call_finish(k, cl, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			break;
		}
		json_put_raw(k, &b, "}\n");
		http_chunk(k, x, BUF_DATA(&b), BUF_LEN(&b));
	}
	buf_free(k, &b);
	if (!cl->finished || BUF_LEN(&cl->out) >= 5 || !whole)
		return;
	if (!x->hdr_sent) {
		if (cl->status != GRPC_OK) {
			gw_error_answer(k, x);
			gw_end(k, x);
			return;
		}
		/* over without a message: a trailers-only answer, so no header
		 * metadata, and no Content-Type (no message set one) */
		http_head(k, x, 200, "", x->minor ? "Transfer-Encoding: chunked\r\n" : "", 0);
	} else if (cl->status != GRPC_OK) {
		gw_stream_error(k, x);
	}
	http_last(k, x, "");
	gw_end(k, x);
}

/* Input for the gateway call being served: its body, then its messages.
 * 1 when the rest of c->in must wait (the call goes on), 0 to go on. */
static int gw_input(struct kvd *k, struct conn *c)
{
	struct http1_conn *h = c->ps;
	size_t before = BUF_LEN(&c->in);
	int r = gw_body(k, c);

	gw_recharge(k, c);
	if (r)
		return 1;
	if (BUF_LEN(&c->in) != before)
		c->t_active = k->now;
	gw_deliver(k, &h->x);
	gw_recharge(k, c);
	if (k->in_held > k->cfg.max_request_buffer)
		net_shed(k);
	if (h->x.in_call && h->x.body_done && BUF_LEN(&c->in) > HTTP1_MAX_HEAD + HTTP1_MAX_BODY) {
		c->is_closing = 1; /* pipelining far ahead of a call: no */
		return 1;
	}
	return h->x.in_call || !BUF_LEN(&c->in);
}

/* ===== 34. HTTP endpoints: /health, /version, /metrics (http1_, http_) ==== */

/*
 * What HTTP serves beside the gateway: /health, /livez, /readyz,
 * /version and Prometheus' /metrics, answered as etcd 3.7 answers them;
 * http1_route sends a POST to /v3/... to the gateway (section 33).  Then
 * the same requests on HTTP/2 streams (http_h2_*), and HTTP/1.x's hooks
 * for the loop (http1_proto): input, flush, timers, drain, free.
 *
 * Invariants:
 *   1. A metrics listener (c->metrics_only) serves /metrics, /health,
 *      /livez and /readyz only, over HTTP/1.x or HTTP/2 (never gRPC:
 *      h2_on_block): anything else is 404, with no CORS and no preflight
 *      answer (http1_route, http1_cors).
 *   2. HTTP/1.x requests are served one at a time, in order: http1_input_step reads
 *      no further while a gateway call is in progress (gw_input) or the
 *      output is at KVD_MAX_OUTPUT.
 *   3. No half answer: one that could not be queued whole closes the
 *      connection at once (http1_check_out, after input and after flush);
 *      on HTTP/2 it resets the stream (http_h2_send).
 *   4. A head must end within KVD_PREFACE_TIMEOUT_MS of its first byte; a
 *      connection making no progress is closed after --max-idle-time,
 *      unless it is serving a call (http1_timers).
 *   5. A body nobody takes is dropped up to HTTP1_MAX_BODY only; a larger
 *      or chunked one closes the connection after the answer
 *      (http1_input_step).
 */

/*
 * What a Prometheus scrape or `etcdctl check datascale` reads from etcd,
 * under etcd's names and labels where the meaning is the same, and kvd's own
 * under kvd_*.  Every value is read when asked: counters kept as things
 * happen (calls by method and code, fsync times, group commits, refused
 * connections, confd drops) and gauges from the state itself (keys, leases,
 * watchers, the log's size, the process).  The text is made whole, then
 * sent; it is a few KiB.
 */

struct http1_mb {
	struct kvd *k;
	struct kvd_buf b;
};

static void http1_m_head(struct http1_mb *m, const char *name, const char *type, const char *help)
{
	char t[320];

	snprintf(t, sizeof t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
	buf_append(m->k, &m->b, t, strlen(t));
}

static void http1_m_val(struct http1_mb *m, const char *name, const char *labels, double v)
{
	char t[400];

	if (v == (double)(int64_t)v && v < 9e15 && v > -9e15)
		snprintf(t, sizeof t, "%s%s%s%s %lld\n", name, labels ? "{" : "", labels ? labels : "", labels ? "}" : "",
		         (long long)v);
	else
		snprintf(t, sizeof t, "%s%s%s%s %.9g\n", name, labels ? "{" : "", labels ? labels : "", labels ? "}" : "", v);
	buf_append(m->k, &m->b, t, strlen(t));
}

static void http1_m_one(struct http1_mb *m, const char *name, const char *type, const char *help, double v)
{
	http1_m_head(m, name, type, help);
	http1_m_val(m, name, NULL, v);
}

/* A histogram: n buckets whose upper bounds are base * 2^i (in unit). */
static void http1_m_hist(struct http1_mb *m, const char *name, const char *help, const uint64_t *b, unsigned n,
                         double base, uint64_t count, double sum)
{
	char bn[160], le[48];
	uint64_t acc = 0;
	unsigned i;

	http1_m_head(m, name, "histogram", help);
	snprintf(bn, sizeof bn, "%s_bucket", name);
	for (i = 0; i < n; i++) {
		acc += b[i];
		snprintf(le, sizeof le, "le=\"%.9g\"", base * (double)(1ull << i));
		http1_m_val(m, bn, le, (double)acc);
	}
	http1_m_val(m, bn, "le=\"+Inf\"", (double)count);
	snprintf(bn, sizeof bn, "%s_sum", name);
	http1_m_val(m, bn, NULL, sum);
	snprintf(bn, sizeof bn, "%s_count", name);
	http1_m_val(m, bn, NULL, (double)count);
}

/* The process, as Prometheus' Go client reports it (Linux /proc). */
static void http1_m_process(struct http1_mb *m)
{
	struct rusage ru;
	struct rlimit rl;
	unsigned long vsz = 0, rss = 0;
	long page = sysconf(_SC_PAGESIZE);
	double fds = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	DIR *d;

	if (f) {
		if (fscanf(f, "%lu %lu", &vsz, &rss) != 2)
			vsz = rss = 0;
		fclose(f);
	}
	if ((d = opendir("/proc/self/fd"))) {
		while (readdir(d))
			fds++;
		closedir(d);
		fds -= 3; /* ".", "..", and the directory's own descriptor */
	}
	getrusage(RUSAGE_SELF, &ru);
	http1_m_one(m, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
	            (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
	            ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6);
	if (!getrlimit(RLIMIT_NOFILE, &rl))
		http1_m_one(m, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
		            rl.rlim_cur == RLIM_INFINITY ? -1 : (double)rl.rlim_cur);
	http1_m_one(m, "process_open_fds", "gauge", "Number of open file descriptors.", fds);
	http1_m_one(m, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
	            (double)rss * (double)page);
	http1_m_one(m, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
	            (double)m->k->st.start_wall);
	http1_m_one(m, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
	            (double)vsz * (double)page);
}

static void http1_metrics_checks(const struct kvd *k, struct http1_mb *m);

static void http1_metrics(struct kvd *k, struct http_x *x, const struct http_req *r)
{
	static const char *const kinds[] = {"unary", "server_stream", "bidi_stream"}; /* enum grpc_kind */
	static const char *const codes[] = {"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded",
		"NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted",
		"OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated"};
	struct http1_mb m = {k, {0}};
	char lab[256], len[48], svc[64];
	size_t i, j, base;
	unsigned streams = 0, code;
	const struct call *cl;
	uint64_t confd[16] = {0};
	const char *const *dn = NULL;
	unsigned ndrop = 0;
	int head;

	for (cl = k->calls; cl; cl = cl->next)
		streams += cl->m && cl->m->on_msg == watch_on_msg;
	http1_m_one(&m, "etcd_server_has_leader", "gauge", "Whether or not a leader exists. 1 is existence, 0 is not.", 1);
	http1_m_one(&m, "etcd_server_is_leader", "gauge", "Whether or not this member is a leader. 1 if is, 0 otherwise.", 1);
	http1_m_one(&m, "etcd_server_leader_changes_seen_total", "counter", "The number of leader changes seen.", 1);
	http1_m_one(&m, "etcd_server_health_success", "counter", "The total number of successful health checks",
	            (double)k->st.health_ok);
	http1_m_one(&m, "etcd_server_health_failures", "counter", "The total number of failed health checks",
	            (double)k->st.health_failed);
	http1_metrics_checks(k, &m);
	http1_m_head(&m, "etcd_server_version", "gauge", "Which version is running. 1 for 'server_version' label with "
	             "current version.");
	http1_m_val(&m, "etcd_server_version", "server_version=\"" KVD_ETCD_VERSION "\"", 1);
	http1_m_one(&m, "etcd_mvcc_db_total_size_in_bytes", "gauge",
	            "Total size of the underlying database physically allocated in bytes.", (double)k->db.size);
	http1_m_one(&m, "etcd_mvcc_db_total_size_in_use_in_bytes", "gauge",
	            "Total size of the underlying database logically in use in bytes.",
	            (double)(k->db.size - KVD_MIN(k->db.reclaimable, k->db.size)));
	http1_m_one(&m, "etcd_debugging_mvcc_current_revision", "gauge", "The current revision of store.",
	            (double)k->db.rev);
	http1_m_one(&m, "etcd_debugging_mvcc_compact_revision", "gauge", "The revision of the last compaction in store.",
	            (double)KVD_MAX(k->db.compacted, 0));
	http1_m_one(&m, "etcd_debugging_mvcc_keys_total", "gauge", "Total number of keys.", (double)k->db.nkeys);
	http1_m_one(&m, "etcd_debugging_mvcc_watcher_total", "gauge", "Total number of watchers.",
	            (double)k->watch.total);
	http1_m_one(&m, "etcd_debugging_mvcc_watch_stream_total", "gauge", "Total number of watch streams.",
	            (double)streams);
	http1_m_one(&m, "kvd_leases", "gauge", "Leases granted and not yet expired or revoked.", (double)k->lease.n);
	http1_m_one(&m, "etcd_server_quota_backend_bytes", "gauge", "Current backend storage quota size in bytes.",
	            (double)(k->cfg.quota_backend_bytes ? k->cfg.quota_backend_bytes : 2147483648ull));
	http1_m_hist(&m, "etcd_disk_wal_fsync_duration_seconds", "The latency distributions of fsync called by WAL.",
	             k->st.fsync_b, KVD_FSYNC_BUCKETS, 0.001, k->st.fsync_n, k->st.fsync_sum);
	/* gRPC, as go-grpc-prometheus labels it: every method, every code seen */
	http1_m_head(&m, "grpc_server_started_total", "counter", "Total number of RPCs started on the server.");
	for (i = base = 0; i < KVD_COUNT(svc_services); base += svc_services[i].n, i++)
		for (j = 0; j < svc_services[i].n && base + j < KVD_METRIC_METHODS; j++) {
			const struct grpc_method *me = &svc_services[i].m[j];
			snprintf(svc, sizeof svc, "%s", svc_services[i].name);
			snprintf(lab, sizeof lab, "grpc_method=\"%s\",grpc_service=\"%s\",grpc_type=\"%s\"",
			         me->path + strlen(svc) + 2, svc, kinds[me->kind]);
			if (k->st.grpc_started[base + j])
				http1_m_val(&m, "grpc_server_started_total", lab, (double)k->st.grpc_started[base + j]);
		}
	http1_m_head(&m, "grpc_server_handled_total", "counter",
	             "Total number of RPCs completed on the server, regardless of success or failure.");
	for (i = base = 0; i < KVD_COUNT(svc_services); base += svc_services[i].n, i++)
		for (j = 0; j < svc_services[i].n && base + j < KVD_METRIC_METHODS; j++)
			for (code = 0; code < 17; code++) {
				const struct grpc_method *me = &svc_services[i].m[j];
				if (!k->st.grpc_handled[base + j][code])
					continue;
				snprintf(lab, sizeof lab, "grpc_code=\"%s\",grpc_method=\"%s\",grpc_service=\"%s\",grpc_type=\"%s\"",
				         codes[code], me->path + strlen(svc_services[i].name) + 2, svc_services[i].name,
				         kinds[me->kind]);
				http1_m_val(&m, "grpc_server_handled_total", lab, (double)k->st.grpc_handled[base + j][code]);
			}
	http1_m_process(&m);
	/* kvd's own */
	http1_m_hist(&m, "kvd_group_commit_replies", "Replies released by one group commit (one write and fsync).",
	             k->st.commit_b, KVD_COMMIT_BUCKETS, 1, k->st.commit_n, (double)k->st.commit_sum);
	http1_m_one(&m, "kvd_log_rewrites_total", "counter", "Log rewrites (online defragmentation) completed.",
	            (double)k->life.rewrites);
	http1_m_one(&m, "kvd_memory_bytes", "gauge", "Bytes kvd has allocated (its own accounting).", (double)k->mem);
	http1_m_one(&m, "kvd_connections", "gauge", "Client connections open.", (double)k->nconns);
	http1_m_one(&m, "kvd_connections_accepted_total", "counter", "Client connections accepted.",
	            (double)k->st.conns_accepted);
	http1_m_head(&m, "kvd_connections_refused_total", "counter", "Client connections refused, by the limit that "
	             "refused them.");
	http1_m_val(&m, "kvd_connections_refused_total", "limit=\"max-connections\"", (double)k->st.conns_refused);
	http1_m_val(&m, "kvd_connections_refused_total", "limit=\"max-connections-per-ip\"",
	            (double)k->st.conns_refused_ip);
	http1_m_one(&m, "kvd_connections_evicted_total", "counter", "Connections closed for a new client at "
	            "--max-connections.", (double)k->st.conns_evicted);
	{
		static const char *const pools[YIELD_N] = {"connections", "tls_handshakes", "password_hashes", "watchers",
		                                           "request_buffers"};
		http1_m_head(&m, "kvd_fair_share_yields_total", "counter", "Units of a full pool the largest holder gave "
		             "up to a newcomer holding fewer, by pool.");
		for (i = 0; i < YIELD_N; i++) {
			snprintf(lab, sizeof lab, "pool=\"%s\"", pools[i]);
			http1_m_val(&m, "kvd_fair_share_yields_total", lab, (double)k->st.yields[i]);
		}
	}
	http1_m_one(&m, "kvd_http_requests_total", "counter", "HTTP requests other than gRPC read (HTTP/1.x, and HTTP/2 streams).",
	            (double)k->st.http_requests);
	if (k->confd && !confd_counters(k, confd, &dn, &ndrop)) {
		http1_m_one(&m, "kvd_confd_received_total", "counter", "confd datagrams received.", (double)confd[0]);
		http1_m_one(&m, "kvd_confd_answered_total", "counter", "confd queries answered.", (double)confd[1]);
		http1_m_head(&m, "kvd_confd_dropped_total", "counter", "confd datagrams dropped, by reason.");
		for (i = 0; i < ndrop; i++) {
			snprintf(lab, sizeof lab, "reason=\"%s\"", dn[i]);
			http1_m_val(&m, "kvd_confd_dropped_total", lab, (double)confd[2 + i]);
		}
	}
	if (m.b.err) {
		buf_free(k, &m.b);
		http_answer(k, x, 500, HTTP1_TEXT, "kvd: out of memory\n");
		return;
	}
	snprintf(len, sizeof len, "Content-Length: %zu\r\n", BUF_LEN(&m.b));
	head = r->mlen == 4 && !memcmp(r->method, "HEAD", 4); /* the head alone, as Go answers HEAD */
	http_head(k, x, 200, "Content-Type: text/plain; version=0.0.4; charset=utf-8; escaping=underscores\r\n",
	          head ? "" : len, x->close);
	if (!head)
		http_raw(k, x, BUF_DATA(&m.b), BUF_LEN(&m.b));
	http_fin(x);
	buf_free(k, &m.b);
}

/* ---- the endpoints ------------------------------------------------------------ */

/*
 * The next name=value pair of the query q[0..n) from *at, as Go's
 * url.ParseQuery reads it: pairs split at '&', '+' and %XX unescaped; a pair
 * with a ';' or a bad escape is skipped, as Go skips it.  A name or value
 * longer than its buffer becomes "\1" (it equals no name kvd looks for).
 * 1 with a pair, 0 at the end.
 */
static int http1_query_next(const char *q, size_t n, size_t *at, char *name, char *val, size_t cap)
{
	while (*at < n) {
		const char *p = q + *at, *amp = memchr(p, '&', n - *at), *e = amp ? amp : q + n;
		char *out = name;
		size_t o = 0, i;
		int bad = 0, long_ = 0;

		*at = (size_t)(e - q) + (amp != NULL);
		if (p == e || memchr(p, ';', (size_t)(e - p)))
			continue;
		for (i = 0; p + i <= e && !bad; i++) {
			int ch;
			if (p + i == e || (out == name && p[i] == '=')) { /* the end of the name, or of the value */
				out[o < cap ? o : 0] = 0;
				if (long_)
					memcpy(out, "\1", 2);
				if (p + i == e) {
					if (out == name)
						val[0] = 0;
					break;
				}
				out = val;
				o = 0;
				long_ = 0;
				continue;
			}
			ch = (unsigned char)p[i];
			if (ch == '+') {
				ch = ' ';
			} else if (ch == '%') {
				unsigned v = 0, j;
				for (j = 1; j <= 2 && !bad; j++) {
					int x = p + i + j >= e ? -1 : p[i + j] >= '0' && p[i + j] <= '9' ? p[i + j] - '0'
					        : (p[i + j] | 0x20) >= 'a' && (p[i + j] | 0x20) <= 'f' ? (p[i + j] | 0x20) - 'a' + 10 : -1;
					bad = x < 0;
					v = v << 4 | (unsigned)(x & 15);
				}
				ch = (int)v;
				i += 2;
			}
			if (o + 1 < cap)
				out[o++] = (char)ch;
			else
				long_ = 1;
		}
		if (!bad)
			return 1;
	}
	return 0;
}

/* Does the query hold name (any value; ""=NULL) or name=val? */
static int http1_query_has(const char *q, size_t n, const char *name, const char *val)
{
	char nm[64], v[64];
	size_t at = 0;

	while (http1_query_next(q, n, &at, nm, v, sizeof nm))
		if (!strcmp(nm, name) && (!val || !strcmp(v, val)))
			return 1;
	return 0;
}

/*
 * /health as etcd 3.7 answers it: the alarms (each skipped when its name is
 * in ?exclude=), the leader (skipped with ?serializable=true; kvd always is
 * one, so that flag changes nothing here), then a keys-only Range, which kvd
 * cannot fail but while it stops.  The first failure is the reason.
 */
static void http1_health(struct kvd *k, struct http_x *x, const struct http_req *r, const char *q, size_t qlen)
{
	char reason[64] = "", body[160];
	size_t i;

	if (!(r->mlen == 3 && !memcmp(r->method, "GET", 3))) {
		http_answer(k, x, 405, "Allow: GET\r\n" HTTP1_NOSNIFF, "Method Not Allowed\n");
		return;
	}
	for (i = 0; i < k->db.nalarms && !reason[0]; i++) {
		unsigned t = k->db.alarms[i].type;
		if (!http1_query_has(q, qlen, "exclude", life_alarm_name(t)))
			snprintf(reason, sizeof reason, "ALARM %s", t == ALARM_NOSPACE || t == ALARM_CORRUPT
			         ? life_alarm_name(t) : "UNKNOWN");
	}
	if (!reason[0] && k->stopping)
		snprintf(reason, sizeof reason, "RANGE ERROR:%s", "etcdserver: server stopped");
	if (!reason[0]) { /* w.Write without a Content-Type: Go sniffs one */
		k->st.health_ok++;
		http_answer_sniffed(k, x, 200, "{\"health\":\"true\",\"reason\":\"\"}");
		return;
	}
	k->st.health_failed++;
	/* http.Error: its headers, and a newline; the reasons need no JSON escape */
	snprintf(body, sizeof body, "{\"health\":\"false\",\"reason\":\"%s\"}\n", reason);
	http_answer(k, x, 503, HTTP1_NOSNIFF, body);
}

/* etcd's /livez and /readyz checks (etcdhttp's CheckRegistry).  etcd runs
 * them in Go's map order, which is random; kvd in this one. */
static const struct {
	const char *name;
	unsigned readyz_only : 1;
} http1_checks[] = {
	{"data_corruption", 1}, {"serializable_read", 0}, {"linearizable_read", 1}, {"non_learner", 1},
};

/* etcd_server_healthcheck and _healthchecks_total, as client_golang prints
 * them: only the series a run check made, labels and series sorted. */
static void http1_metrics_checks(const struct kvd *k, struct http1_mb *m)
{
	static const unsigned byname[] = {0, 2, 3, 1}; /* http1_checks' names in byte order */
	static const char *const type[2] = {"livez", "readyz"}, *const status[2] = {"error", "success"};
	char lb[96];
	unsigned i, t, st, any = 0;

	for (i = 0; i < 4; i++)
		any |= k->st.check_last[0][i] | k->st.check_last[1][i];
	if (!any)
		return;
	http1_m_head(m, "etcd_server_healthcheck", "gauge", "The result of each kind of healthcheck.");
	for (i = 0; i < 4; i++)
		for (t = 0; t < 2; t++)
			if (k->st.check_last[t][byname[i]]) {
				snprintf(lb, sizeof lb, "name=\"%s\",type=\"%s\"", http1_checks[byname[i]].name, type[t]);
				http1_m_val(m, "etcd_server_healthcheck", lb, k->st.check_last[t][byname[i]] == 2);
			}
	http1_m_head(m, "etcd_server_healthchecks_total", "counter", "The total number of each kind of healthcheck.");
	for (i = 0; i < 4; i++)
		for (st = 0; st < 2; st++)
			for (t = 0; t < 2; t++)
				if (k->st.checks[t][byname[i]][st]) {
					snprintf(lb, sizeof lb, "name=\"%s\",status=\"%s\",type=\"%s\"", http1_checks[byname[i]].name,
					         status[st], type[t]);
					http1_m_val(m, "etcd_server_healthchecks_total", lb, (double)k->st.checks[t][byname[i]][st]);
				}
}

/* A check's error, NULL when it passes. */
static const char *http1_check(const struct kvd *k, size_t i)
{
	if (i == 0) /* data_corruption */
		return life_alarm_on(k, ALARM_CORRUPT) ? "alarm activated: CORRUPT" : NULL;
	if (i == 1 || i == 2) /* the reads, as root: they fail only while kvd stops */
		return k->stopping ? "etcdserver: server stopped" : NULL;
	return NULL; /* non_learner: kvd is never a learner */
}

/*
 * /livez, /readyz (every check but those in ?exclude=) and /livez/<check>,
 * /readyz/<check> (that one).  A success is "ok\n", after the per-check lines
 * with ?verbose; a failure is 503 with the lines always, through http.Error.
 * Returns 0 when the path is none of these (not answered).
 */
static int http1_checks_answer(struct kvd *k, struct http_x *x, const struct http_req *r, const char *path,
                               size_t plen, const char *q, size_t qlen)
{
	int readyz = plen >= 7 && !memcmp(path, "/readyz", 7), fail = 0;
	size_t root = readyz ? 7 : 6, i, only = KVD_COUNT(http1_checks), at = 0;
	char body[512];
	const char *err;

	if (!readyz && !(plen >= 6 && !memcmp(path, "/livez", 6)))
		return 0;
	if (plen > root) { /* a check's own path */
		for (i = 0; i < KVD_COUNT(http1_checks) && only == KVD_COUNT(http1_checks); i++)
			if ((readyz || !http1_checks[i].readyz_only) && plen == root + 1 + strlen(http1_checks[i].name) &&
			    path[root] == '/' && !memcmp(path + root + 1, http1_checks[i].name, plen - root - 1))
				only = i;
		if (only == KVD_COUNT(http1_checks))
			return 0;
	}
	if (!(r->mlen == 3 && !memcmp(r->method, "GET", 3))) {
		http_answer(k, x, 405, "Allow: GET\r\n" HTTP1_NOSNIFF, "Method Not Allowed\n");
		return 1;
	}
	body[0] = 0;
	for (i = 0; i < KVD_COUNT(http1_checks); i++) {
		if ((!readyz && http1_checks[i].readyz_only) || (only != KVD_COUNT(http1_checks) && i != only) ||
		    (only == KVD_COUNT(http1_checks) && http1_query_has(q, qlen, "exclude", http1_checks[i].name)))
			continue;
		err = http1_check(k, i);
		fail |= err != NULL;
		k->st.checks[readyz][i][!err]++; /* etcd's recordMetrics, for each check run */
		k->st.check_last[readyz][i] = err ? 1 : 2;
		at += (size_t)snprintf(body + at, sizeof body - at, err ? "[-]%s failed: %s\n" : "[+]%s ok\n",
		                       http1_checks[i].name, err ? err : "");
	}
	if (fail) {
		snprintf(body + at, sizeof body - at, "\n");
		http_answer(k, x, 503, HTTP1_NOSNIFF, body);
	} else {
		snprintf(http1_query_has(q, qlen, "verbose", NULL) ? body + at : body, sizeof body - at, "ok\n");
		http_answer(k, x, 200, HTTP1_NOSNIFF, body);
	}
	return 1;
}

/* /version: the cluster and storage versions follow a downgrade. */
static void http1_version(struct kvd *k, struct http_x *x, const struct http_req *r)
{
	char body[128];

	if (!(r->mlen == 3 && !memcmp(r->method, "GET", 3))) {
		http_answer(k, x, 405, "Allow: GET\r\n" HTTP1_NOSNIFF, "Method Not Allowed\n");
		return;
	}
	snprintf(body, sizeof body, "{\"etcdserver\":\"" KVD_ETCD_VERSION "\",\"etcdcluster\":\"%s\",\"storage\":\"%s\"}",
	         svc_cluster_version(k), svc_cluster_version(k));
	http_answer(k, x, 200, "Content-Type: application/json\r\n", body);
}

/* /v3 without its slash: Go's ServeMux redirects to the subtree /v3/ (307
 * keeps the method), the query kept; http.Redirect writes a link (its URL
 * HTML-escaped) only for GET and HEAD.  q[0..qlen): the query, after '?'. */
static void http1_redirect_v3(struct kvd *k, struct http_x *x, const struct http_req *r, const char *q, size_t qlen)
{
	char fields[400], body[1024];
	int get = (r->mlen == 3 && !memcmp(r->method, "GET", 3)) || (r->mlen == 4 && !memcmp(r->method, "HEAD", 4));
	size_t i, at;

	qlen = KVD_MIN(qlen, (size_t)300);
	snprintf(fields, sizeof fields, "%sLocation: /v3/%s%.*s\r\n", get ? "Content-Type: text/html; charset=utf-8\r\n" : "",
	         qlen ? "?" : "", (int)qlen, q);
	body[0] = 0;
	if (get) {
		at = (size_t)snprintf(body, sizeof body, "<a href=\"/v3/%s", qlen ? "?" : "");
		for (i = 0; i < qlen && at + 8 < sizeof body; i++) {
			const char *e = q[i] == '&' ? "&amp;" : q[i] == '<' ? "&lt;" : q[i] == '>' ? "&gt;"
			              : q[i] == '"' ? "&#34;" : q[i] == '\'' ? "&#39;" : NULL;
			if (e)
				at += (size_t)snprintf(body + at, sizeof body - at, "%s", e);
			else
				body[at++] = q[i];
		}
		snprintf(body + at, sizeof body - at, "\">Temporary Redirect</a>.\n\n");
	}
	http_answer(k, x, 307, fields, body);
}

/* Route one request.  Returns 1 when a gateway call began (the head is
 * consumed and the body is the call's), 0 when it was answered here. */
static int http1_route(struct kvd *k, struct http_x *x, const struct http_req *r)
{
	struct conn *c = x->c;
	const char *path = r->target, *q = memchr(path, '?', r->tlen), *rpc = NULL;
	size_t plen = q ? (size_t)(q - path) : r->tlen, qlen = q ? r->tlen - plen - 1 : 0, skip = 0, cnlen;

	q = q ? q + 1 : ""; /* the query itself */
	if (r->mlen == 7 && !memcmp(r->method, "OPTIONS", 7) && !c->metrics_only) { /* a CORS preflight: etcd answers it itself */
		http_answer(k, x, 200, "", "");
		return 0;
	}
	/* the health endpoints are on the metrics listener too, as etcd's */
	if (plen == 7 && !memcmp(path, "/health", 7)) {
		http1_health(k, x, r, q, qlen);
		return 0;
	}
	if (http1_checks_answer(k, x, r, path, plen, q, qlen))
		return 0;
	if (plen == 8 && !memcmp(path, "/version", 8) && !c->metrics_only) {
		http1_version(k, x, r);
		return 0;
	}
	if (c->metrics_only && !(plen == 8 && !memcmp(path, "/metrics", 8))) { /* etcd's metrics listener */
		http_answer(k, x, 404, HTTP1_NOSNIFF, "404 page not found\n");
		return 0;
	}
	if (plen >= 4 && !memcmp(path, "/v3/", 4))
		skip = 4;
	else if (plen >= 8 && !memcmp(path, "/v3beta/", 8)) /* etcd 3.7 still rewrites it to /v3/ */
		skip = 8;
	if (plen == 3 && !memcmp(path, "/v3", 3) && k->cfg.enable_grpc_gateway) {
		http1_redirect_v3(k, x, r, q, qlen);
		return 0;
	}
	if (skip && k->cfg.enable_grpc_gateway) { /* grpc-gateway v2's routing errors are JSON */
		if (!(rpc = gw_find(path + skip, plen - skip))) {
			http_answer(k, x, 404, "Content-Type: application/json\r\n",
			             "{\"code\":5,\"message\":\"Not Found\"}");
			return 0;
		}
		if (!(r->mlen == 4 && !memcmp(r->method, "POST", 4))) {
			http_answer(k, x, 501, "Content-Type: application/json\r\n",
			             "{\"code\":12,\"message\":\"Method Not Allowed\"}");
			return 0;
		}
		/* etcd: a client certificate's CN is not the gateway's user -- refused */
		if (k->cfg.client_cert_auth && k->auth.enabled && tls_peer_cn(c, &cnlen) && cnlen) {
			http_answer(k, x, 400, HTTP1_NOSNIFF, "CommonName of client sending a request against "
			             "gateway will be ignored and not used as expected\n");
			return 0;
		}
		gw_begin(k, x, r, rpc);
		return 1;
	}
	if (plen == 8 && !memcmp(path, "/metrics", 8)) { /* promhttp answers any method */
		http1_metrics(k, x, r);
		return 0;
	}
	http_answer(k, x, 404, HTTP1_NOSNIFF, "404 page not found\n");
	return 0;
}

/* An answer that could not be queued whole leaves the byte stream broken
 * (HTTP/1.1 has no frame to drop, no stream to reset): the connection is
 * closed at once, as if the peer had gone, and the client sees it end. */
static void http1_check_out(struct kvd *k, struct conn *c)
{
	if (!c->out.err || c->dead)
		return;
	kvd_log(k, KVD_LOG_WARN, "out of memory writing an HTTP/1.1 answer: connection closed");
	c->dead = 1;
}

static void http1_input_step(struct kvd *k, struct conn *c);
static void http1_input(struct kvd *k, struct conn *c)
{
	http1_input_step(k, c);
	http1_check_out(k, c);
}

static void http1_input_step(struct kvd *k, struct conn *c)
{
	struct http1_conn *h = c->ps;
	struct http_req r;
	int status;
	long n;

	while (BUF_LEN(&c->in) && !c->is_closing && BUF_LEN(&c->out) < KVD_MAX_OUTPUT) {
		if (h->x.in_call) { /* the body of the gateway request being served */
			if (gw_input(k, c))
				return;
			continue;
		}
		if (h->body_left) { /* a body nobody takes: dropped */
			size_t d = (size_t)KVD_MIN((uint64_t)BUF_LEN(&c->in), h->body_left);
			buf_consume(&c->in, d);
			h->body_left -= d;
			continue;
		}
		n = http1_parse(BUF_DATA(&c->in), BUF_LEN(&c->in), &r, &status);
		if (n == 0) {
			if (!h->t_head) {
				h->t_head = k->now ? k->now : 1;
				util_wake_by(k, k->now + KVD_PREFACE_TIMEOUT_MS);
			}
			return;
		}
		h->t_head = 0;
		c->t_active = k->now;
		k->st.http_requests++;
		if (n < 0) {
			http1_fail(k, c, status, r.why ? r.why : status == 431 ? "431 Request Header Fields Too Large\n"
			                         : status == 501 ? "Unsupported transfer encoding" /* Go's words */
			                         : status == 417 ? "" : "400 Bad Request\n");
			return;
		}
		h->x.minor = r.minor;
		h->x.close = r.close;
		http1_cors(k, &h->x, &r);
		if (r.clen > gw_max_body(k)) {
			http1_fail(k, c, 413, "413 Request Entity Too Large\n");
			return;
		}
		if (http1_route(k, &h->x, &r)) {
			buf_consume(&c->in, (size_t)n);
			if (gw_input(k, c))
				return;
			continue;
		}
		buf_consume(&c->in, (size_t)n);
		if (r.chunked) { /* a chunked body nobody takes: not read, the connection closes */
			c->is_closing = 1;
			return;
		}
		if (r.clen > HTTP1_MAX_BODY) {
			c->is_closing = 1;
			return;
		}
		h->body_left = r.clen;
	}
}

static void http1_flush(struct kvd *k, struct conn *c)
{
	struct http1_conn *h = c->ps;

	gw_flush(k, &h->x);
	http1_check_out(k, c);
}

static int64_t http1_timers(struct kvd *k, struct conn *c)
{
	struct http1_conn *h = c->ps;

	if (c->is_closing)
		return INT64_MAX;
	if (h->t_head) { /* a head that never ends */
		if (k->now - h->t_head >= KVD_PREFACE_TIMEOUT_MS) {
			c->is_closing = 1;
			return INT64_MAX;
		}
		return h->t_head + KVD_PREFACE_TIMEOUT_MS;
	}
	if (!k->cfg.idle_timeout_ms || (h->x.in_call && (h->x.body_done || h->x.bidi)))
		return INT64_MAX; /* a call being served (a watch may be quiet for days) */
	if (k->now - c->t_active >= (int64_t)k->cfg.idle_timeout_ms) {
		c->is_closing = 1;
		return INT64_MAX;
	}
	return c->t_active + (int64_t)k->cfg.idle_timeout_ms;
}

static void http1_close_now(struct kvd *k, struct conn *c)
{
	(void)k;
	c->is_closing = 1; /* after what is answered already */
}

/* Shutdown begins: an idle connection closes; one serving a call closes
 * after its answer -- a stream's is the error it was just ended with
 * (svc_shutdown), then the last chunk, as etcd's gateway writes them. */
static void http1_drain(struct kvd *k, struct conn *c)
{
	struct http1_conn *h = c->ps;

	if (h->x.in_call)
		h->x.close = 1;
	else
		c->is_closing = 1;
	(void)k;
}

static int http1_busy(const struct conn *c)
{
	const struct http1_conn *h = c->ps;

	return h->x.in_call;
}

static void http1_free(struct kvd *k, struct conn *c)
{
	struct http1_conn *h = c->ps;

	if (h->x.in_call)
		call_fini(k, &h->call);
	buf_free(k, &h->body);
	gw_recharge(k, c);
	kvd_free(k, c->ps);
	c->ps = NULL;
}

/* ---- the same requests on HTTP/2 streams ------------------------------------ */

/*
 * curl over TLS, a browser, Go's http.Client: they all speak HTTP/2 when
 * ALPN offers it, and etcd serves them there as on HTTP/1.1 -- its
 * grpcHandlerFunc sends a request to gRPC only when the content-type says
 * so.  h2_on_block does the same and hands the rest here: the stream
 * carries one http_x, routed by http1_route as an HTTP/1.1 request is; the
 * gateway's call is the stream's own (gw_begin), its body the stream's
 * input, its answer the head, data and trailer blocks http_h2_send moves
 * into frames.  The stream ends with the answer (END_STREAM, then
 * RST_STREAM(NO_ERROR) if the client was still sending, RFC 9113 8.1).
 */
static void http_h2_begin(struct kvd *k, struct h2_stream *s, const struct h2_req *rq, const struct hp_field *f,
                          unsigned nf)
{
	struct http_x *x = kvd_calloc(k, sizeof *x);
	struct http_req r;
	unsigned i;

	if (!x) {
		h2_rst(s->c, s->id, H2_REFUSED_STREAM);
		h2_stream_close(s->c, s);
		return;
	}
	k->st.http_requests++;
	s->hx = x;
	x->c = s->c->conn;
	x->s = s;
	x->minor = 1;
	x->call = &s->call;
	x->body = &s->in;
	memset(&r, 0, sizeof r);
	r.method = (const char *)rq->method.p;
	r.mlen = rq->method.n;
	r.target = (const char *)rq->path.p;
	r.tlen = rq->path.n;
	r.minor = 1;
	r.clen = rq->has_cl ? rq->content_length : 0;
	for (i = 0; i < nf && r.nh < HTTP1_MAX_HEADERS; i++)
		if (f[i].name[0] != ':')
			r.h[r.nh++] = f[i];
	http1_cors(k, x, &r);
	if (r.clen > gw_max_body(k))
		http_answer(k, x, 413, HTTP1_TEXT, "413 Request Entity Too Large\n");
	else if (http1_route(k, x, &r) && x->in_call)
		gw_deliver(k, x); /* a body that is already whole (none) goes now */
	if (!x->in_call)
		s->discard = 1; /* answered: a body is not read */
}

/* Request bytes p[0..n) of an HTTP stream (n == 0 with END_STREAM too):
 * the gateway's body, bounded by gw_max_body and credited back to the
 * client as it is held (the stream window alone would stop a body at 64
 * KiB, and a unary call waits for all of it). */
static void http_h2_data(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n)
{
	struct http_x *x = s->hx;

	if (s->discard || !x->in_call || x->delivered)
		return;
	if (buf_append(k, &s->in, p, n)) {
		call_finish(k, x->call, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return;
	}
	if (BUF_LEN(&s->in) > gw_max_body(k)) {
		call_finish(k, x->call, GRPC_RESOURCE_EXHAUSTED, "kvd: request body too large");
		if (!x->hdr_sent) { /* nothing answered yet: as HTTP/1.1 answers it */
			gw_end(k, x);
			http_answer(k, x, 413, HTTP1_TEXT, "413 Request Entity Too Large\n");
		}
		return;
	}
	h2_consumed(s);
	x->body_done = s->remote_closed;
	gw_deliver(k, x);
}

/* Move what the HTTP answer of s has into frames, within the windows, as
 * h2_stream_send does for gRPC.  1 when the stream ended and was freed. */
static int http_h2_send(struct kvd *k, struct h2_conn *c, struct h2_stream *s)
{
	struct http_x *x = s->hx;
	int end;

	for (;;) {
		if (x->in_call)
			gw_flush(k, x);
		if (x->head.err || x->data.err || x->trailer.err) { /* out of memory: no half answer (invariant 3) */
			h2_rst(c, s->id, H2_INTERNAL_ERROR);
			h2_stream_close(c, s);
			return 1;
		}
		if (!BUF_LEN(&x->head) && !BUF_LEN(&x->data) && !x->ended)
			return 0; /* nothing yet: a stream waits for its next message */
		if (BUF_LEN(&x->head)) {
			end = x->ended && !BUF_LEN(&x->data) && !BUF_LEN(&x->trailer);
			if (h2_send_block(c, s->id, &x->head, end))
				return 0;
			buf_free(k, &x->head);
			s->hdrs_sent = 1;
			if (end)
				goto ended;
		}
		if (!s->hdrs_sent)
			return 0;
		if (!(end = h2_send_data(k, c, s, &x->data, x->ended && !BUF_LEN(&x->trailer))))
			return 0;
		if (end == 2)
			goto ended;
		if (x->ended)
			break;
	}
	if (BUF_LEN(&x->trailer) ? h2_send_block(c, s->id, &x->trailer, 1) : h2_frame(c, H2_DATA, H2_F_END_STREAM, s->id, "", 0))
		return 0;
ended:
	if (!s->remote_closed) /* answered before the request ended */
		h2_rst(c, s->id, H2_NO_ERROR);
	h2_stream_close(c, s);
	return 1;
}

static void http_h2_free(struct kvd *k, struct h2_stream *s)
{
	struct http_x *x = s->hx;

	if (!x)
		return;
	buf_free(k, &x->head);
	buf_free(k, &x->data);
	buf_free(k, &x->trailer);
	kvd_free(k, x);
	s->hx = NULL;
}

static void http1_conn_init(struct conn *c)
{
	struct http1_conn *h = c->ps;

	h->x.c = c;
	h->x.call = &h->call;
	h->x.body = &h->body;
}

static const struct net_proto http1_proto = {
	"http/1.1", http1_input, http1_flush, http1_timers, http1_drain, http1_close_now, http1_close_now,
	http1_busy, gw_shed, http1_free,
};

#else /* KVD_NO_HTTP: no HTTP/1.1 is served; a request gets this, then the connection closes */
static const char http1_left_out[] = "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                     "Connection: close\r\nContent-Length: 42\r\n\r\n"
                                     "kvd: built without HTTP/1.1 (KVD_NO_HTTP)\n";

/* A metrics listener has nothing to serve; --cors is accepted and unused. */
static int http1_check_flags(const struct kvd *k, char *err, size_t errlen)
{
	if (!k->cfg.listen_metrics_urls || !*k->cfg.listen_metrics_urls)
		return 0;
	snprintf(err, errlen, "--listen-metrics-urls: this kvd is built without HTTP/1.1 (KVD_NO_HTTP)");
	return KVD_EINVAL;
}
#endif /* KVD_NO_HTTP */

/* ===== 35. Sockets and the poll loop (net_, loop_) ======================= */

/*
 * One poll() loop, no threads.  Each kvd_poll() call (loop_run):
 *   1. reads the monotonic clock (and again when poll returns);
 *   2. runs due timers (first bytes, idle, stall, grpc-timeout, drain,
 *      watch progress, lease expiry, auto-compaction, systemd's watchdog);
 *   3. the group commit, then every connection's output into its socket,
 *      the reaping, a slice of a log rewrite and of password hashing
 *      (loop_flush);
 *   4. polls, with a timeout that ends at the next timer;
 *   5. dispatches by what each pollfd belongs to (a typed slot: the wake
 *      pipe, a listener, a confd socket, a connection): accept, read ->
 *      protocol -> calls -> services, write;
 *   6. loop_flush again: the group commit, the output, then the reaping of
 *      closed connections -- never inside their own handlers.
 * A connection is a socket, a transport (plain TCP, or TLS) and the
 * protocol its first bytes chose (net_sniff): the HTTP/2 preface, an HTTP/1.x
 * request line, a TLS ClientHello, or garbage -- each answered on the same
 * port.  A protocol is a table of hooks (struct net_proto); the loop knows
 * no more of HTTP/2 than that.  A connection whose output is over
 * KVD_MAX_OUTPUT is not read (POLLIN off): that is the backpressure against
 * peers that do not read.
 *
 * Invariants:
 *   1. The durability contract, by order: loop_flush runs the group commit
 *      (loop_log_flush) before any protocol's flush hook and before
 *      net_write -- the hooks are where answers move toward the socket.
 *   2. A connection is freed only by net_reap (from loop_flush) or
 *      kvd_close, never inside its own handlers: they mark it dead or
 *      is_closing, and the dispatch may still look at it (loop_run).
 *   3. Backpressure: a connection whose output is at KVD_MAX_OUTPUT is
 *      neither polled for input (loop_pollset; a closing one is, for the
 *      peer's EOF) nor handed what it holds (loop_flush).
 *   4. k->rbuf is lent to c->in for one net_input only; what is left is
 *      copied out, and a swapped loan kills the connection (net_read's
 *      KVD_ALWAYS).
 *   5. Counts balance: a connection leaves k->nconns and its share's count
 *      once (net_uncount: c->uncounted), and has given back every request
 *      byte it buffered before it is freed (net_conn_free's
 *      KVD_ALWAYS(!c->in_held)).
 */

KVD_RESIDENT static int net_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return KVD_EIO;
	return fcntl(fd, F_SETFD, FD_CLOEXEC);
}

KVD_RESIDENT static void net_addr_str(const struct sockaddr *sa, char *out, size_t cap)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
		snprintf(out, cap, "%s:%u", host, ntohs(in->sin_port));
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
		snprintf(out, cap, "[%s]:%u", host, ntohs(in6->sin6_port));
	} else if (sa->sa_family == AF_UNIX) {
		snprintf(out, cap, "unix");
	} else {
		snprintf(out, cap, "?");
	}
}

/*
 * A unix socket URL, as etcd serves one: unix://P or unixs://P (TLS over
 * the socket), the file P being the URL's host and path together --
 * unix://localhost:2379 is ./localhost:2379, unix:///run/kvd.sock is
 * /run/kvd.sock -- but for --listen-metrics-urls (metrics set) etcd takes
 * the host alone, so there only unix://NAME (relative to the working
 * directory) names a file; kvd refuses the empty host etcd would bind to no
 * file.  1 with the path in path (and *tls), 0 for another URL, or
 * KVD_EINVAL for a path that does not fit a sockaddr_un.
 */
KVD_RESIDENT static int net_unix_path(const char *url, int metrics, int *tls, char *path, size_t cap, char *err, size_t errlen)
{
	struct sockaddr_un sun;
	const char *p;
	size_t n;

	if (!strncmp(url, "unix://", 7))
		p = url + 7, *tls = 0;
	else if (!strncmp(url, "unixs://", 8))
		p = url + 8, *tls = 1;
	else
		return 0;
#ifdef KVD_NO_TLS
	if (*tls) {
		snprintf(err, errlen, "%s: this kvd is built without TLS (KVD_NO_TLS)", url);
		return KVD_EINVAL;
	}
#endif
	n = metrics ? strcspn(p, "/") : strlen(p);
	if (!n || n >= sizeof sun.sun_path || n >= cap || memchr(p, '?', n) || memchr(p, '#', n)) {
		snprintf(err, errlen, metrics ? "%s: expected unix://NAME, a file in the working directory (etcd's "
		                                "metrics listener takes the URL's host alone; at most %zu bytes)"
		                              : "%s: expected unix://PATH (at most %zu bytes)", url, sizeof sun.sun_path - 1);
		return KVD_EINVAL;
	}
	snprintf(path, cap, "%.*s", (int)n, p);
	return 1;
}

/*
 * Split "http://host:port" or "https://host:port" (host may be [v6]) into
 * host and port; *tls says which.
 */
KVD_RESIDENT static int net_split_url(const char *url, int *tls, char *host, size_t hcap, char *port, size_t pcap,
                         char *err, size_t errlen)
{
	const char *h, *colon, *end;

	*tls = 0;
	if (!strncmp(url, "https://", 8)) {
#ifdef KVD_NO_TLS
		snprintf(err, errlen, "%s: this kvd is built without TLS (KVD_NO_TLS)", url);
		return KVD_EINVAL;
#endif
		*tls = 1;
		h = url + 8;
	} else if (!strncmp(url, "http://", 7)) {
		h = url + 7;
	} else {
		snprintf(err, errlen, "%s: URL scheme must be http or https", url);
		return KVD_EINVAL;
	}
	end = h + strcspn(h, "/");
	if (*h == '[') {
		const char *rb = memchr(h, ']', (size_t)(end - h));
		if (!rb || rb[1] != ':')
			goto bad;
		h++;
		colon = rb + 1;
		if ((size_t)(rb - h) >= hcap)
			goto bad;
		memcpy(host, h, (size_t)(rb - h));
		host[rb - h] = 0;
	} else {
		colon = NULL;
		for (const char *q = h; q < end; q++)
			if (*q == ':')
				colon = q;
		if (!colon || (size_t)(colon - h) >= hcap || colon == h)
			goto bad;
		memcpy(host, h, (size_t)(colon - h));
		host[colon - h] = 0;
	}
	if ((size_t)(end - colon - 1) >= pcap || end == colon + 1)
		goto bad;
	memcpy(port, colon + 1, (size_t)(end - colon - 1));
	port[end - colon - 1] = 0;
	for (const char *q = port; *q; q++)
		if (*q < '0' || *q > '9')
			goto bad;
	if (*end && strcmp(end, "/"))
		goto bad;
	return 0;
bad:
	snprintf(err, errlen, "%s: expected http(s)://IP:PORT or unix(s)://PATH", url);
	return KVD_EINVAL;
}

/* Every --listen-client-urls URL well formed (before anything is touched);
 * *tls: some are https://. */
static int net_check_urls(struct kvd *k, int *tls, char *err, size_t errlen)
{
	const char *lists[2] = {k->cfg.listen_client_urls, k->cfg.listen_metrics_urls};
	char *list, *url, *save, host[64], port[8], path[128];
	int r = 0, t, i;

	*tls = 0;
	for (i = 0; i < 2 && !r; i++) {
		if (!lists[i] || !*lists[i])
			continue;
		if (!(list = kvd_strdup(k, lists[i])))
			return KVD_ENOMEM;
		for (url = strtok_r(list, ",", &save); url && !r; url = strtok_r(NULL, ",", &save)) {
			struct in6_addr a;
			if ((r = net_unix_path(url, i, &t, path, sizeof path, err, errlen))) {
				*tls |= t;
				r = r < 0 ? r : 0;
				continue;
			}
			r = net_split_url(url, &t, host, sizeof host, port, sizeof port, err, errlen);
			*tls |= t;
			if (!r && strcmp(host, "localhost") && inet_pton(AF_INET, host, &a) != 1 &&
			    inet_pton(AF_INET6, host, &a) != 1) {
				snprintf(err, errlen, "%s: host must be an IP address or localhost", url);
				r = KVD_EINVAL;
			}
		}
		kvd_free(k, list);
	}
	return r;
}

/* A listener's slot, its socket fd taken: 0, or KVD_ENOMEM (fd closed). */
KVD_RESIDENT static int net_add_listener(struct kvd *k, int fd, int tls, int metrics, char *upath, char *err, size_t errlen)
{
	struct net_listener *ls;

	if (UTIL_GROW(k, k->ls, k->lscap, (size_t)k->nls + 1, 1)) {
		snprintf(err, errlen, "out of memory");
		close(fd);
		kvd_free(k, upath);
		return KVD_ENOMEM;
	}
	ls = k->ls;
	memset(&ls[k->nls], 0, sizeof ls[k->nls]);
	ls[k->nls].fd = fd;
	ls[k->nls].tls = tls ? 1 : 0;
	ls[k->nls].metrics = metrics ? 1 : 0;
	ls[k->nls].upath = upath;
	k->nls++;
	return 0;
}

/* Close listener l; a unix socket's file goes with it, as etcd's. */
static void net_close_listener(struct kvd *k, struct net_listener *l)
{
	close(l->fd);
	if (l->upath) {
		unlink(l->upath);
		kvd_free(k, l->upath);
		l->upath = NULL;
	}
}

/* Listen on the unix socket at path.  A stale socket file there is removed
 * first, as etcd does; any other kind of file is left alone and refused. */
static int net_listen_unix(struct kvd *k, const char *url, const char *path, int tls, int metrics, char *err,
                           size_t errlen)
{
	struct sockaddr_un sun;
	struct stat st;
	char *own;
	int fd, r;

	memset(&sun, 0, sizeof sun);
	sun.sun_family = AF_UNIX;
	memcpy(sun.sun_path, path, strlen(path)); /* fits: net_unix_path checked */
	if (!lstat(path, &st) && !S_ISSOCK(st.st_mode)) {
		snprintf(err, errlen, "listen unix %s: the file exists and is not a socket", path);
		return KVD_EBUSY;
	}
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fd < 0 || net_nonblock(fd)) {
		snprintf(err, errlen, "listen %s: socket: %s", url, strerror(errno));
		if (fd >= 0)
			close(fd);
		return KVD_EIO;
	}
	unlink(path);
	if (bind(fd, (struct sockaddr *)&sun, sizeof sun) || listen(fd, 128)) {
		r = errno;
		snprintf(err, errlen, "listen unix %s: bind: %s", path, strerror(r));
		close(fd);
		return r == EADDRINUSE ? KVD_EBUSY : KVD_EIO;
	}
	if (!(own = kvd_strdup(k, path))) {
		snprintf(err, errlen, "out of memory");
		close(fd);
		unlink(path);
		return KVD_ENOMEM;
	}
	if ((r = net_add_listener(k, fd, tls, metrics, own, err, errlen))) {
		unlink(path);
		return r;
	}
	snprintf(k->ls[k->nls - 1].name, sizeof k->ls[k->nls - 1].name, "%s", url);
	return 0;
}

KVD_RESIDENT static int net_listen(struct kvd *k, const char *url, int metrics, char *err, size_t errlen)
{
	char host[64], port[8], upath[128];
	int tls;
	struct sockaddr_storage ss;
	struct sockaddr_in *in4 = (struct sockaddr_in *)(void *)&ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)(void *)&ss;
	socklen_t sl;
	unsigned long pn;
	int fd = -1, one = 1, r;

	if ((r = net_unix_path(url, metrics, &tls, upath, sizeof upath, err, errlen)))
		return r < 0 ? r : net_listen_unix(k, url, upath, tls, metrics, err, errlen);
	if ((r = net_split_url(url, &tls, host, sizeof host, port, sizeof port, err, errlen)))
		return r;
	if (!strcmp(host, "localhost")) /* as etcd (Go): the IPv4 loopback */
		snprintf(host, sizeof host, "127.0.0.1");
	pn = strtoul(port, NULL, 10);
	memset(&ss, 0, sizeof ss);
	/* numeric hosts only, as etcd requires: no resolver (and no NSS in static builds) */
	if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
		in4->sin_family = AF_INET;
		in4->sin_port = htons((uint16_t)pn);
		sl = sizeof *in4;
	} else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)pn);
		sl = sizeof *in6;
	} else {
		snprintf(err, errlen, "%s: host must be an IP address or localhost", url);
		return KVD_EINVAL;
	}
	if (pn > 65535) {
		snprintf(err, errlen, "%s: bad port", url);
		return KVD_EINVAL;
	}
	fd = socket(ss.ss_family, SOCK_STREAM, 0);
	if (fd < 0 || net_nonblock(fd)) {
		snprintf(err, errlen, "listen %s: socket: %s", url, strerror(errno));
		if (fd >= 0)
			close(fd);
		return KVD_EIO;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (ss.ss_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
	if (bind(fd, (struct sockaddr *)&ss, sl) || listen(fd, 128)) {
		r = errno;
		snprintf(err, errlen, "listen tcp %s:%s: bind: %s", host, port,
		         r == EADDRINUSE ? "address already in use" : strerror(r));
		close(fd);
		return r == EADDRINUSE ? KVD_EBUSY : KVD_EIO;
	}
	if ((r = net_add_listener(k, fd, tls, metrics, NULL, err, errlen)))
		return r;
	sl = sizeof ss;
	getsockname(fd, (struct sockaddr *)&ss, &sl);
	net_addr_str((struct sockaddr *)&ss, k->ls[k->nls - 1].name, sizeof k->ls[k->nls - 1].name);
	return 0;
}

/* ---- transports: how a connection's bytes move ----------------------------- */

static long net_plain_recv(struct conn *c, void *p, size_t n)
{
	ssize_t r = recv(c->fd, p, n, 0);

	if (r >= 0)
		return (long)r;
	return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? KVD_EAGAIN : KVD_EIO;
}

static long net_plain_send(struct conn *c, const void *p, size_t n)
{
	ssize_t r = send(c->fd, p, n, MSG_NOSIGNAL);

	if (r >= 0)
		return (long)r;
	return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? KVD_EAGAIN : KVD_EIO;
}

static const struct net_transport net_plain = {"tcp", net_plain_recv, net_plain_send, NULL, NULL};

/* ---- choosing a protocol from the first bytes ----------------------------- */

/*
 * What the first bytes of a connection are: the HTTP/2 preface, an HTTP/1.x
 * request line (RFC 9112 3: token SP target SP "HTTP/1." DIGIT CRLF), a TLS
 * ClientHello (a handshake record, RFC 8446 5.1), or none of these.
 * Bounded and non-allocating; "need more" is distinct from "bad".
 */
enum { NET_SNIFF_MORE, NET_SNIFF_H2, NET_SNIFF_HTTP1, NET_SNIFF_TLS, NET_SNIFF_BAD };
#define NET_MAX_REQUEST_LINE 8192 /* an HTTP/1.x request line longer than this is not waited for */

static int net_sniff(const uint8_t *p, size_t n)
{
	static const char ver[] = "HTTP/1.";
	size_t i = 0, j;

	if (!n)
		return NET_SNIFF_MORE;
	if (!memcmp(p, H2_PREFACE, KVD_MIN(n, (size_t)H2_PREFACE_LEN)))
		return n >= H2_PREFACE_LEN ? NET_SNIFF_H2 : NET_SNIFF_MORE;
	if (p[0] == 0x16) /* handshake record, legacy version 3.x */
		return n < 2 ? NET_SNIFF_MORE : p[1] == 3 ? NET_SNIFF_TLS : NET_SNIFF_BAD;
	while (i < n && h2_token_char(p[i] >= 'A' && p[i] <= 'Z' ? (unsigned char)(p[i] | 0x20) : p[i]))
		i++; /* method (a token; upper case as sent) */
	if (i == n)
		return n < NET_MAX_REQUEST_LINE ? NET_SNIFF_MORE : NET_SNIFF_HTTP1;
	if (!i || p[i++] != ' ')
		return NET_SNIFF_BAD;
	for (j = i; i < n && p[i] > ' ' && p[i] < 0x7f; i++)
		; /* request-target */
	if (i == n)
		return n < NET_MAX_REQUEST_LINE ? NET_SNIFF_MORE : NET_SNIFF_HTTP1;
	if (i == j || p[i++] != ' ')
		return NET_SNIFF_BAD;
	for (j = 0; j < 7 && i < n; j++, i++)
		if (p[i] != (uint8_t)ver[j])
			return NET_SNIFF_BAD;
	if (i == n)
		return NET_SNIFF_MORE;
	if (p[i] < '0' || p[i] > '9')
		return NET_SNIFF_BAD;
	if (++i == n)
		return NET_SNIFF_MORE;
	if (p[i] == '\n' || (p[i] == '\r' && (i + 1 == n || p[i + 1] == '\n')))
		return i + 1 == n && p[i] == '\r' ? NET_SNIFF_MORE : NET_SNIFF_HTTP1;
	return NET_SNIFF_BAD;
}

/* A TLS ClientHello on a plain listener (or inside TLS): a fatal
 * handshake_failure alert (RFC 8446 6.2), so the client says so rather than
 * reading garbage. */
static void net_tls_answer(struct kvd *k, struct conn *c)
{
	static const uint8_t alert[] = {21, 3, 3, 0, 2, 2, 40};

	buf_append(k, &c->out, alert, sizeof alert);
	c->is_closing = 1;
	kvd_log(k, KVD_LOG_INFO, "%s: a TLS ClientHello on a plain listener (TLS is served on https:// ones)", c->peer);
}

/*
 * Over the connection limits: the refusal is said in the client's own
 * protocol, so it waits for the first bytes (clients speak first): an
 * HTTP/1.x request gets a 503 and the close, anything else a SETTINGS and a
 * GOAWAY too_many_connections, which gRPC clients act on.  Such a connection
 * counts toward no limit, lives at most KVD_REFUSE_WAIT_MS, and at most
 * KVD_MAX_REFUSING wait at once; past that, and on a TLS listener (which
 * cannot speak before a handshake), the refusal is a plain close.
 */
static const uint8_t net_refusal_h2[] = {
    0, 0, 0, H2_SETTINGS, 0, 0, 0, 0, 0,
    0, 0, 28, H2_GOAWAY, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, H2_ENHANCE_YOUR_CALM,
    't', 'o', 'o', '_', 'm', 'a', 'n', 'y', '_', 'c', 'o', 'n', 'n', 'e', 'c', 't', 'i', 'o', 'n', 's'};
static const char net_refusal_http1[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                        "Connection: close\r\nContent-Length: 26\r\n\r\nkvd: too many connections\n";

static struct conn *net_conn_new(struct kvd *k, int fd, const struct net_transport *tr);

static void net_refuse(struct kvd *k, int fd, int tls, const struct sockaddr_storage *ss)
{
	struct conn *c;

	k->st.conns_refused++;
	if (tls || k->nrefusing >= KVD_MAX_REFUSING || !(c = net_conn_new(k, fd, &net_plain))) {
		close(fd);
		return;
	}
	net_addr_str((const struct sockaddr *)ss, c->peer, sizeof c->peer);
	c->refusing = c->uncounted = 1;
	c->next = k->conns;
	k->conns = c;
	k->nrefusing++;
	util_wake_by(k, k->now + KVD_REFUSE_WAIT_MS);
}

/* The first bytes of a refused connection: the refusal, in their protocol. */
static void net_refusal(struct kvd *k, struct conn *c)
{
	switch (net_sniff(BUF_DATA(&c->in), BUF_LEN(&c->in))) {
	case NET_SNIFF_MORE: return;
	case NET_SNIFF_HTTP1: buf_append(k, &c->out, net_refusal_http1, sizeof net_refusal_http1 - 1); break;
	case NET_SNIFF_TLS: net_tls_answer(k, c); break;
	default: buf_append(k, &c->out, net_refusal_h2, sizeof net_refusal_h2); break;
	}
	buf_consume(&c->in, BUF_LEN(&c->in));
	c->is_closing = 1;
}

/* Handle what c->in holds: choose the protocol first if it is not known. */
static void net_input(struct kvd *k, struct conn *c)
{
	if (c->refusing) {
		net_refusal(k, c);
		return;
	}
	if (!c->proto) {
		switch (net_sniff(BUF_DATA(&c->in), BUF_LEN(&c->in))) {
		case NET_SNIFF_MORE: return;
		case NET_SNIFF_HTTP1:
#ifndef KVD_NO_HTTP
			if (!(c->ps = kvd_calloc(k, sizeof(struct http1_conn)))) {
				c->dead = 1;
				return;
			}
			http1_conn_init(c);
			c->proto = &http1_proto;
			c->proto->input(k, c);
#else
			buf_append(k, &c->out, http1_left_out, sizeof http1_left_out - 1);
			buf_consume(&c->in, BUF_LEN(&c->in));
			c->is_closing = 1;
#endif
			return;
		case NET_SNIFF_TLS: net_tls_answer(k, c); return;
		case NET_SNIFF_BAD: h2_bad_preface(k, c); return;
		}
		if (!(c->ps = h2_conn_new(k, c))) { /* a metrics listener's too: its requests are all HTTP (h2_on_block) */
			c->dead = 1;
			return;
		}
		c->proto = &h2_proto;
	}
	c->proto->input(k, c);
}

/* ---- connections ------------------------------------------------------------ */

static struct conn *net_conn_new(struct kvd *k, int fd, const struct net_transport *tr)
{
	struct conn *c = kvd_calloc(k, sizeof *c);

	if (!c)
		return NULL;
	c->k = k;
	c->fd = fd;
	c->tr = tr;
	c->t_open = c->t_active = k->now;
	util_wake_by(k, k->now + KVD_PREFACE_TIMEOUT_MS);
	return c;
}

/* c no longer counts toward --max-connections (evicted, or gone). */
static void net_uncount(struct kvd *k, struct conn *c)
{
	if (c->uncounted)
		return;
	c->uncounted = 1;
	k->nconns--;
	if (c->share)
		c->share->n[SHARE_CONNS]--;
}

/* A protocol's report: c now buffers delta more (or fewer) request bytes. */
static void net_held(struct kvd *k, struct conn *c, int64_t delta)
{
	c->in_held += (uint64_t)delta;
	k->in_held += (uint64_t)delta;
	if (c->share)
		c->share->n[SHARE_INPUT] += (uint64_t)delta;
}

/*
 * --max-request-buffer: request bytes buffered across every connection --
 * messages not yet whole (a granted one counts whole), gateway bodies -- are
 * one budget, whatever the number of connections.  Over it, the address
 * holding the most gives up its largest (section 3's rule, in bytes) until
 * the rest fits: a request that arrives whole is never buffered, so honest
 * calls go on while someone parks unfinished messages.
 */
static void net_shed(struct kvd *k)
{
	struct share *top;
	struct conn *c, *v;

	while (k->in_held > k->cfg.max_request_buffer && (top = share_max(k, SHARE_INPUT))) {
		for (v = NULL, c = k->conns; c; c = c->next)
			if (c->share == top && c->proto && c->in_held && (!v || c->in_held > v->in_held))
				v = c;
		if (!v || !v->proto->shed(k, v))
			break;
		k->st.yields[YIELD_BYTES]++;
	}
}

static void net_conn_free(struct kvd *k, struct conn *c)
{
	net_uncount(k, c);
	if (c->refusing)
		k->nrefusing--;
	if (c->proto)
		c->proto->free(k, c);
	if (c->tr->free)
		c->tr->free(c);
	if (!KVD_ALWAYS(!c->in_held)) /* each protocol gave back what it buffered */
		k->in_held -= c->in_held;
	share_put(k, c->share);
	buf_free(k, &c->in);
	buf_free(k, &c->out);
	kvd_free(k, c);
}

static int net_busy(const struct conn *c)
{
	return c->proto && c->proto->busy(c);
}

/* How long a closed connection waits for the peer's FIN (net_reap). */
static int64_t net_linger(const struct kvd *k)
{
	return k->stopping ? KVD_STOP_LINGER_MS : 1000; /* stopping: exit soon, as etcd does */
}

/* A connection's timers: the first bytes must come within
 * KVD_PREFACE_TIMEOUT_MS; then its protocol's; a closing one, when net_reap
 * lets it go.  The next time it needs a look. */
static int64_t net_timers(struct kvd *k, struct conn *c)
{
	if (c->t_close)
		return c->shut_wr ? KVD_MIN(c->t_close + net_linger(k), c->t_close + 5000) : c->t_close + 5000;
	if (c->proto)
		return c->proto->timers(k, c);
	if (c->is_closing)
		return INT64_MAX;
	if (c->refusing) { /* said nothing: closed without a word */
		if (k->now - c->t_open >= KVD_REFUSE_WAIT_MS)
			c->is_closing = 1;
		return c->is_closing ? INT64_MAX : c->t_open + KVD_REFUSE_WAIT_MS;
	}
	if (k->now - c->t_open >= KVD_PREFACE_TIMEOUT_MS) {
		c->is_closing = 1; /* never said what it speaks */
		return INT64_MAX;
	}
	return c->t_open + KVD_PREFACE_TIMEOUT_MS;
}

static void net_write(struct kvd *k, struct conn *c)
{
	long n;

	if (c->want_write && !c->dead) { /* a handshake waits to write */
		c->want_write = 0;
		if ((n = c->tr->send(c, NULL, 0)) < 0 && n != KVD_EAGAIN)
			c->dead = 1;
	}
	while (BUF_LEN(&c->out) && !c->dead) {
		n = c->tr->send(c, BUF_DATA(&c->out), BUF_LEN(&c->out));
		if (n > 0)
			buf_consume(&c->out, (size_t)n);
		else if (n == KVD_EAGAIN)
			break;
		else
			c->dead = 1;
	}
	buf_trim(k, &c->out, 65536);
}

/* The key connections are counted by: an IPv4 address, or an IPv6 /64
 * (one host often holds a whole /64); IPv4-mapped IPv6 counts as IPv4. */
static void net_src_key(const struct sockaddr_storage *ss, uint8_t key[9])
{
	memset(key, 0, 9);
	if (ss->ss_family == AF_INET) {
		key[0] = 4;
		memcpy(key + 1, &((const struct sockaddr_in *)(const void *)ss)->sin_addr, 4);
	} else if (ss->ss_family == AF_INET6) {
		const uint8_t *a = ((const struct sockaddr_in6 *)(const void *)ss)->sin6_addr.s6_addr;
		static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
		if (!memcmp(a, mapped, 12)) {
			key[0] = 4;
			memcpy(key + 1, a + 12, 4);
		} else {
			key[0] = 6;
			memcpy(key + 1, a, 8);
		}
	}
}

/* Which of two connections goes first: one serving no call, then the one
 * that made no progress for longer (the list is newest first: ties go to
 * the oldest). */
static int net_evict_before(const struct conn *c, const struct conn *v)
{
	int cb = net_busy(c), vb = net_busy(v);

	return cb != vb ? !cb : c->t_active <= v->t_active;
}

/*
 * The table is full and a client from share `from` comes (section 3's
 * rule): the address holding the most slots gives one up -- an idle one
 * first, else its stalest busy one -- when it holds at least two more than
 * the newcomer's; otherwise the connection idle the longest, whoever holds
 * it, so a flood of silent or ping-only connections only displaces itself.
 * 0 when one was evicted; KVD_ELIMIT (refuse the newcomer) otherwise.
 */
static int net_evict(struct kvd *k, const struct share *from)
{
	struct share *top = share_max(k, SHARE_CONNS);
	int fair = share_may_take(top, from, SHARE_CONNS, 2);
	struct conn *c, *victim = NULL;

	for (c = k->conns; c; c = c->next)
		if (!c->uncounted && !c->is_closing && !c->dead && (fair ? c->share == top : !net_busy(c)) &&
		    (!victim || net_evict_before(c, victim)))
			victim = c;
	if (!victim)
		return KVD_ELIMIT;
	if (victim->proto) /* in the protocol's own words */
		victim->proto->evict(k, victim);
	net_write(k, victim); /* best effort: the GOAWAY, then the socket goes */
	victim->dead = 1;
	kvd_log(k, KVD_LOG_DEBUG, "%s: evicted (%s) for a new connection", victim->peer,
	        !net_busy(victim) ? "idle" : "its address holds the most connections");
	net_uncount(k, victim);
	k->st.conns_evicted++;
	k->st.yields[YIELD_CONNS] += (uint64_t)fair;
	return 0;
}

static void net_accept(struct kvd *k, struct net_listener *l)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	struct conn *c;
	struct share *sh;
	uint8_t key[9];
	int fd, one = 1, i;

	for (i = 0; i < KVD_ACCEPTS_PER_TICK; i++) {
		sl = sizeof ss;
		fd = accept(l->fd, (struct sockaddr *)&ss, &sl);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				kvd_log(k, KVD_LOG_WARN, "accept: %s; pausing 100 ms", strerror(errno));
				k->accept_pause_until = k->now + 100;
				util_wake_by(k, k->accept_pause_until);
			}
			return;
		}
		if (net_nonblock(fd)) {
			close(fd);
			continue;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		net_src_key(&ss, key);
		if (!(sh = share_get(k, 'a', key, sizeof key))) {
			close(fd);
			continue;
		}
		if (k->cfg.max_connections_per_ip && sh->n[SHARE_CONNS] >= k->cfg.max_connections_per_ip) {
			k->st.conns_refused_ip++;
			share_put(k, sh);
			net_refuse(k, fd, l->tls, &ss);
			continue;
		}
		if (k->nconns >= k->cfg.max_connections && net_evict(k, sh)) {
			share_put(k, sh);
			net_refuse(k, fd, l->tls, &ss);
			continue;
		}
		if (!(c = net_conn_new(k, fd, &net_plain))) { /* no memory: a close, not a refusal's words */
			share_put(k, sh);
			close(fd);
			continue;
		}
		net_addr_str((struct sockaddr *)&ss, c->peer, sizeof c->peer);
		memcpy(c->src, key, sizeof c->src);
		c->share = sh;
		sh->n[SHARE_CONNS]++;
		k->nconns++;
		c->metrics_only = l->metrics;
#ifndef KVD_NO_TLS
		if (l->tls) {
			c->tr = &tls_transport;
			if (tls_accept(k, c)) {
				net_conn_free(k, c);
				close(fd);
				continue;
			}
		}
#endif
		c->next = k->conns;
		k->conns = c;
		k->st.conns_accepted++;
	}
}

/*
 * Read what the transport has.  The common case runs the protocol straight
 * from k->rbuf, lent to c->in (a lent buffer cannot grow: buf_reserve
 * refuses it); only what is left over -- a partial frame, or input held back
 * by output pressure -- is copied into c->in, so idle connections own no
 * input buffer.
 */
static void net_read(struct kvd *k, struct conn *c)
{
	long n = c->tr->recv(c, k->rbuf, sizeof k->rbuf);
	struct kvd_buf own;
	size_t left;

	if (n == KVD_EAGAIN)
		return;
	if (n < 0) {
		c->dead = 1;
		return;
	}
	if (n == 0) {
		c->peer_closed = c->is_closing = 1;
		return;
	}
	if (c->is_closing) /* lingering: drain and drop */
		return;
	if (BUF_LEN(&c->in)) {
		if (buf_append(k, &c->in, k->rbuf, (size_t)n)) {
			c->dead = 1;
			return;
		}
		net_input(k, c);
	} else {
		own = c->in;
		c->in.p = k->rbuf;
		c->in.rd = 0;
		c->in.len = c->in.cap = (size_t)n;
		c->in.lent = 1;
		net_input(k, c);
		left = BUF_LEN(&c->in);
		if (!KVD_ALWAYS(c->in.lent && c->in.p == k->rbuf)) { /* nobody may swap the loan */
			c->dead = 1;
			return;
		}
		own.rd = own.len = 0;
		if (left && buf_append(k, &own, BUF_DATA(&c->in), left))
			c->dead = 1;
		c->in = own;
	}
	buf_trim(k, &c->in, 0);
}

/* Close connections that are done: after their output is written, a
 * shutdown(SHUT_WR) and a short linger so the peer reads our GOAWAY before
 * any RST (closing with unread input would send one). */
static void net_reap(struct kvd *k)
{
	struct conn **pp = &k->conns, *c;
	int64_t linger = net_linger(k);

	while ((c = *pp)) {
		if (c->is_closing && !c->t_close) {
			c->t_close = k->now ? k->now : 1;
			util_wake_by(k, k->now + 5000);
		}
		if (c->is_closing && !c->dead && !BUF_LEN(&c->out) && !c->shut_wr) {
			if (c->tr->shut)
				c->tr->shut(c);
			shutdown(c->fd, SHUT_WR);
			c->shut_wr = 1;
			util_wake_by(k, k->now + linger);
		}
		if (c->dead || (c->shut_wr && (c->peer_closed || k->now - c->t_close >= linger)) ||
		    (c->t_close && k->now - c->t_close >= 5000)) {
			*pp = c->next;
			close(c->fd);
			net_conn_free(k, c);
			continue;
		}
		pp = &c->next;
	}
}

/* ---- systemd's notify protocol, without libsystemd ------------------------ */

/*
 * Under systemd (Type=notify) NOTIFY_SOCKET names a datagram socket: a path,
 * or "@name" in the abstract namespace.  kvd_main says READY=1 once every
 * listener listens, STOPPING=1 when a shutdown begins, and, when
 * WATCHDOG_USEC is set (and WATCHDOG_PID, if set, is kvd's pid), WATCHDOG=1
 * every half of it from the loop's timers -- so a loop that hangs stops
 * pinging and gets restarted.  STATUS= lines say what kvd is doing.  One
 * sendto each, never waited on: a supervisor that is gone costs nothing.
 */
KVD_RESIDENT static void loop_notify(struct kvd *k, const char *msg)
{
	if (k->sd_fd >= 0)
		sendto(k->sd_fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&k->sd_addr, k->sd_len);
}

static void loop_notify_open(struct kvd *k)
{
	const char *path = getenv("NOTIFY_SOCKET"), *us = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
	size_t n = path ? strlen(path) : 0;
	char *end;
	unsigned long long v;

	if (!n || n >= sizeof k->sd_addr.sun_path || (path[0] != '/' && path[0] != '@'))
		return;
	memset(&k->sd_addr, 0, sizeof k->sd_addr);
	k->sd_addr.sun_family = AF_UNIX;
	memcpy(k->sd_addr.sun_path, path, n);
	if (path[0] == '@')
		k->sd_addr.sun_path[0] = 0; /* the abstract namespace: no NUL after the name */
	k->sd_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/'));
	if ((k->sd_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
		return;
	if (us && *us && (!pid || !*pid || strtoul(pid, NULL, 10) == (unsigned long)getpid())) {
		errno = 0;
		v = strtoull(us, &end, 10);
		if (!errno && !*end && v >= 2000) {
			k->sd_wd_ms = (int64_t)(v / 2000); /* half the interval, in ms */
			k->sd_wd_next = util_now_ms() + k->sd_wd_ms;
			util_wake_by(k, k->sd_wd_next);
		}
	}
}

/* ---- the loop ---------------------------------------------------------------- */

/* SIGHUP (kvd_reload): the files that may change under a running kvd are
 * read again; a bad one is refused and the old one kept (each says so). */
static void loop_reload(struct kvd *k)
{
	loop_notify(k, "RELOADING=1");
	kvd_log(k, KVD_LOG_INFO, "SIGHUP: reading the confd key and the TLS files again");
	confd_reload(k);
#ifndef KVD_NO_TLS
	tls_reload(k);
#endif
	loop_notify(k, "READY=1");
}

/* SIGTERM/SIGINT (kvd_shutdown): stop accepting, end every stream, let the
 * unary calls in flight finish (and the group commit they wait for), tell
 * every connection; loop_run says KVD_ESTOPPED once none is left. */
static void loop_stop(struct kvd *k)
{
	struct conn *c;
	unsigned i;

	if (k->stopping)
		return;
	k->stopping = 1;
	k->stop_deadline = k->now + k->cfg.drain_timeout_ms;
	util_wake_by(k, k->stop_deadline);
	for (i = 0; i < k->nls; i++)
		net_close_listener(k, &k->ls[i]);
	k->nls = 0;
	svc_shutdown(k); /* streams end now; unary calls have the grace */
	for (c = k->conns; c; c = c->next)
		if (c->proto)
			c->proto->drain(k, c);
		else
			c->is_closing = 1;
	util_wake_by(k, k->now + KVD_STOP_LINGER_MS); /* lingering connections go sooner now */
	kvd_log(k, KVD_LOG_INFO, "shutting down: draining %u connection(s)", k->nconns);
	loop_notify(k, "STOPPING=1\nSTATUS=shutting down");
}

static void loop_timers(struct kvd *k)
{
	struct conn *c;
	struct call *call;

	if (k->now < k->next_timer)
		return;
	k->next_timer = INT64_MAX;
	if (k->sd_wd_ms) { /* systemd's watchdog: the loop is alive */
		if (k->now >= k->sd_wd_next) {
			loop_notify(k, "WATCHDOG=1");
			k->sd_wd_next = k->now + k->sd_wd_ms;
		}
		util_wake_by(k, k->sd_wd_next);
	}
	for (c = k->conns; c; c = c->next)
		util_wake_by(k, net_timers(k, c));
	if (k->stopping) {
		if (k->now >= k->stop_deadline) { /* grace is over: end what remains */
			for (call = k->calls; call; call = call->next)
				call_finish(k, call, GRPC_UNAVAILABLE, "etcdserver: server stopped");
			for (c = k->conns; c; c = c->next) {
				if (c->proto)
					c->proto->stop(k, c);
				if (k->now >= k->stop_deadline + 1000)
					c->dead = 1;
			}
			util_wake_by(k, k->stop_deadline + 1000);
		} else {
			util_wake_by(k, k->stop_deadline);
		}
	}
	if (k->accept_pause_until > k->now)
		util_wake_by(k, k->accept_pause_until);
	watch_timers(k);
	lease_timers(k);
	life_compactor(k);
}

/*
 * Group commit: make this iteration's writes durable, then let the replies
 * that waited for it go -- or, if the write failed, replace them with the
 * error (the batch was undone, so what they showed never happened).
 *
 * The durability contract: no held call's answer leaves before its
 * fdatasync.  It holds by order -- carriers move a call's bytes toward the
 * socket only in their protocol's flush, which loop_flush runs after this
 * -- and each carrier checks it where it moves them (h2_stream_send,
 * gw_flush: KVD_NEVER(held)).
 */
KVD_RESIDENT static void loop_log_flush(struct kvd *k)
{
	struct call *s;
	int err = mvcc_flush(k), b;
	size_t i, n;

	if (!err && k->db.flushed) { /* group commit size: the replies this flush releases */
		for (i = n = 0; i < k->nheld; i++)
			n += k->held[i] != NULL;
		for (b = 0; b < KVD_COMMIT_BUCKETS && n > (1u << b); b++)
			;
		if (b < KVD_COMMIT_BUCKETS)
			k->st.commit_b[b]++;
		k->st.commit_n++;
		k->st.commit_sum += n;
	}
	if (!err && k->db.flushed) { /* durable now: its events may go out */
		watch_batch(k, k->db.w.p, k->db.flushed, k->db.size - k->db.flushed);
		mvcc_batch_done(k);
#ifndef KVD_NO_RECIPES
		if (k->locks)
			lock_batch(k); /* waiters look again; observers see the new leader */
#endif
	}

	for (i = 0; i < k->nheld; i++) {
		if (!(s = k->held[i]))
			continue;
		s->held = 0;
		if (!err)
			continue;
		s->out.len = KVD_MAX(s->out.rd, KVD_MIN(s->out.len, s->out_mark));
		kvd_free(k, s->status_msg);
		s->status_msg = NULL;
		s->finished = 0;
		if (s->wrote && (k->db.last_errno == ENOSPC || k->db.last_errno == EDQUOT))
			call_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "%s", E_NO_SPACE);
		else
			call_finish(k, s, GRPC_UNAVAILABLE, "kvd: log write failed (%s); %s", strerror(k->db.last_errno),
			            s->wrote ? "not applied" : "retry");
	}
	k->nheld = 0;
	if (err && (k->db.last_errno == ENOSPC || k->db.last_errno == EDQUOT)) {
		life_on_enospc(k); /* its ALARM record goes in the next batch */
		util_wake_by(k, k->now);
	}
}

/* Before sleeping: input held back by output pressure, the log flush, then
 * every connection's output into its socket, then reaping. */
KVD_RESIDENT static void loop_flush(struct kvd *k)
{
	struct conn *c;

	for (c = k->conns; c; c = c->next)
		if (!c->dead && BUF_LEN(&c->in) && !c->is_closing && BUF_LEN(&c->out) < KVD_MAX_OUTPUT)
			net_input(k, c);
	loop_log_flush(k);
	for (c = k->conns; c; c = c->next) {
		if (c->dead)
			continue;
		if (c->proto && !c->is_closing)
			c->proto->flush(k, c);
		net_write(k, c);
	}
	net_reap(k);
	life_step(k); /* a slice of a log rewrite, after the replies left */
	auth_step(k); /* a slice of password hashing */
}

/* What each pollfd belongs to: the dispatch needs nothing positional. */
enum { LOOP_WAKE, LOOP_LISTENER, LOOP_CONFD, LOOP_CONN };
struct loop_slot {
	int kind;
	void *obj;
};

static int loop_pollset(struct kvd *k)
{
	size_t need = 1 + k->nls + (k->confd ? k->confd->nfd : 0) + k->nconns, n = 0;
	struct conn *c;
	unsigned i;

	for (c = k->conns; c; c = c->next)
		need += c->uncounted; /* evicted, still to be reaped */
	if (need > k->pcap) { /* two arrays, one capacity: sized exactly, not util_grow */
		struct pollfd *p = kvd_realloc(k, k->pfd, need * sizeof *p);
		struct loop_slot *o;
		if (!p)
			return KVD_ENOMEM;
		k->pfd = p;
		if (!(o = kvd_realloc(k, k->slot, need * sizeof *o)))
			return KVD_ENOMEM;
		k->slot = o;
		k->pcap = need;
	}
#define LOOP_ADD(fd_, ev, kind_, obj_) \
	(k->pfd[n].fd = (fd_), k->pfd[n].events = (short)(ev), k->slot[n].kind = (kind_), k->slot[n++].obj = (obj_))
	LOOP_ADD(k->wake[0], POLLIN, LOOP_WAKE, NULL);
	if (k->now >= k->accept_pause_until && !k->stopping)
		for (i = 0; i < k->nls; i++)
			LOOP_ADD(k->ls[i].fd, POLLIN, LOOP_LISTENER, &k->ls[i]);
	for (i = 0; k->confd && !k->stopping && i < k->confd->nfd; i++)
		LOOP_ADD(k->confd->fds[i], POLLIN, LOOP_CONFD, NULL);
	for (c = k->conns; c && n < k->pcap; c = c->next) /* closing: POLLIN watches for the peer's EOF */
		LOOP_ADD(c->fd, (c->is_closing || BUF_LEN(&c->out) < KVD_MAX_OUTPUT ? POLLIN : 0) |
		                    (BUF_LEN(&c->out) || c->want_write ? POLLOUT : 0), LOOP_CONN, c);
#undef LOOP_ADD
	return (int)n;
}

/* Whatever could not get memory (a frame, a header block, an event) stayed
 * queued: the loop comes back for it 20 ms later, not only when a socket
 * wakes it.  Under lasting pressure calls wait; the stall and idle timeouts
 * end them. */
KVD_RESIDENT static void loop_oom_retry(struct kvd *k)
{
	if (k->alloc_failed) {
		k->alloc_failed = 0;
		util_wake_by(k, k->now + 20);
	}
}

/* One loop iteration (kvd_poll): timers, the flush of what is pending, then
 * poll, dispatch by what each fd is, and the flush again. */
KVD_RESIDENT static int loop_run(struct kvd *k, int timeout_ms)
{
	char b[16];
	ssize_t r;
	int n, i, ms;
	int64_t wait;

	k->now = util_now_ms();
#ifndef KVD_NO_TLS
	if (k->tls)
		k->tls->steps = 0;
#endif
	loop_timers(k);
	loop_flush(k);
	loop_oom_retry(k);
	if (k->stopping && !k->conns)
		return KVD_ESTOPPED;
	if ((n = loop_pollset(k)) < 0)
		return n;
	ms = timeout_ms;
	if (k->next_timer != INT64_MAX) {
		wait = k->next_timer - k->now;
		wait = wait < 0 ? 0 : wait > INT_MAX ? INT_MAX : wait;
		if (ms < 0 || wait < ms)
			ms = (int)wait;
	}
	if (poll(k->pfd, (nfds_t)n, ms) <= 0) {
		k->now = util_now_ms();
		return 0;
	}
	k->now = util_now_ms();
	for (i = 0; i < n; i++) {
		short re = k->pfd[i].revents;
		struct conn *c;
		if (!re)
			continue;
		switch (k->slot[i].kind) {
		case LOOP_WAKE:
			while ((r = read(k->wake[0], b, sizeof b)) > 0) {
				if (memchr(b, 'H', (size_t)r))
					loop_reload(k);
				if (memchr(b, 'T', (size_t)r))
					loop_stop(k);
			}
			break;
		case LOOP_LISTENER:
			if (!k->stopping)
				net_accept(k, k->slot[i].obj);
			break;
		case LOOP_CONFD:
			confd_read(k, k->pfd[i].fd);
			break;
		case LOOP_CONN:
			c = k->slot[i].obj; /* reaped only in loop_flush: still here */
			if (c->dead)
				break;
			if (re & (POLLIN | POLLHUP | POLLERR))
				net_read(k, c);
			if ((re & POLLOUT) && !c->dead)
				net_write(k, c);
			break;
		}
	}
	loop_flush(k);
	loop_oom_retry(k);
	return k->stopping && !k->conns ? KVD_ESTOPPED : 0;
}

/* ===== 36. Flags and configuration (cfg_) ================================ */

/*
 * The flags: one table (cfg_flags) that the command line, the ETCD_*
 * variables, --config-file's YAML (cfg_yaml_) and --help all read;
 * kvd_config_parse (section 37) walks it.  Then what the flags lead to at
 * start: the member and cluster ids, the data dir and its lock.
 *
 * etcd's flag syntax (Go's flag package): -flag or --flag, "=value" or the
 * next argument; every flag may also come from ETCD_<FLAG_IN_CAPS>, and, as in
 * etcd, setting both is an error.  With --config-file (or ETCD_CONFIG_FILE)
 * the file is the whole configuration: the other flags are ignored and the
 * variables not read, as etcd does.  Durations are Go durations ("5s").
 *
 * Invariants:
 *   1. A flag is its cfg_flags line: its default (kvd_config_init), help
 *      (cfg_usage), variable (cfg_env_name) and YAML key (cfg_yaml_set)
 *      all come from it -- there is no second list to keep in step.
 *   2. A value is checked where it is read, with the flag's name in the
 *      error: cfg_set (syntax, range, the line's min), cfg_duration,
 *      cfg_check_gates.
 *   3. The YAML reader is bounded and allocates nothing: CFG_YAML_MAX bytes,
 *      one level of nesting, strings unescaped into the caller's store,
 *      never longer than the text (kvd_config_yaml, cfg_yaml_put).
 *   4. The strings of struct kvd_config are the caller's until kvd_init
 *      copies them (cfg_own); kvd_close lets them go (cfg_disown).
 *   5. One kvd per data dir: an exclusive flock on <dir>/kvd.lock
 *      (cfg_lock).
 */
enum cfg_type { CFG_STR, CFG_U32, CFG_U64, CFG_MS, CFG_LEVEL, CFG_BOOL };
/* One flag: its name (the environment variable is ETCD_<NAME>), the field of
 * struct kvd_config it sets and how it is parsed, its default, its help.
 * Adding a flag is a field in kvd.h, a line here, and its use. */
struct cfg_flag {
	const char *name;
	enum cfg_type type;
	size_t off;
	uint32_t min;
	uint32_t def;        /* numbers, durations (ms), booleans, the log level */
	const char *defs;    /* strings */
	const char *help;
};
#define CFG_OFF(f) offsetof(struct kvd_config, f)
#define CFG_S(name, field, def, help) {name, CFG_STR, CFG_OFF(field), 0, 0, def, help}
#define CFG_N(name, type, field, min, def, help) {name, type, CFG_OFF(field), min, def, NULL, help}
static const struct cfg_flag cfg_flags[] = {
	CFG_S("name", name, "default", "human-readable member name"),
	CFG_S("data-dir", data_dir, NULL, "data directory (default \"${name}.etcd\")"),
	CFG_S("listen-client-urls", listen_client_urls, "http://localhost:2379", "comma list of URLs to serve clients on"),
	CFG_S("advertise-client-urls", advertise_client_urls, "http://localhost:2379", "client URLs reported by MemberList"),
	CFG_S("initial-advertise-peer-urls", initial_advertise_peer_urls, "http://localhost:2380",
	      "peer URLs reported by MemberList; with the token they fix the member id"),
	CFG_S("initial-cluster-token", initial_cluster_token, "etcd-cluster", "cluster token, part of the member id as in etcd"),
	CFG_N("max-request-bytes", CFG_U32, max_request_bytes, 1, KVD_DEFAULT_MAX_REQUEST,
	      "largest request the server accepts"),
	CFG_N("max-concurrent-streams", CFG_U32, max_concurrent_streams, 1, KVD_DEFAULT_MAX_STREAMS,
	      "HTTP/2 streams per connection (etcd's is 2^32-1)"),
	CFG_N("max-connections", CFG_U32, max_connections, 1, KVD_DEFAULT_MAX_CONNECTIONS,
	      "kvd: client connections at once; when full, the address holding the most gives up one for a new "
	      "client, else the oldest idle one is closed, else the new one is refused"),
	CFG_N("max-connections-per-ip", CFG_U32, max_connections_per_ip, 0, KVD_DEFAULT_MAX_CONNS_PER_IP,
	      "kvd: client connections from one IPv4 address or IPv6 /64, 0 = no limit (when full, the address "
	      "holding the most yields a slot)"),
	CFG_N("max-request-buffer", CFG_U64, max_request_buffer, 0, KVD_DEFAULT_MAX_INPUT,
	      "kvd: request bytes buffered across all connections (unfinished messages, gateway bodies); at least "
	      "one largest request"),
	CFG_N("grpc-keepalive-min-time", CFG_MS, keepalive_min_time_ms, 0, 5000, "minimum interval between client pings"),
	CFG_N("max-idle-time", CFG_MS, idle_timeout_ms, 0, KVD_DEFAULT_IDLE_MS,
	      "kvd: close connections that serve no call and make no progress this long, 0 = never"),
	CFG_N("stall-timeout", CFG_MS, stall_timeout_ms, 0, KVD_DEFAULT_STALL_MS,
	      "kvd: reset a stream whose output waits on a zero window this long, 0 = never"),
	CFG_N("shutdown-grace", CFG_MS, drain_timeout_ms, 0, KVD_DEFAULT_DRAIN_MS,
	      "kvd: on SIGTERM/SIGINT, time calls get to finish"),
	CFG_N("log-level", CFG_LEVEL, log_level, 0, KVD_LOG_INFO, "debug, info, warn or error"),
	CFG_S("config-file", config_file, NULL,
	      "etcd's YAML configuration file; other flags and ETCD_* variables are then ignored, as etcd"),
	CFG_S("log-outputs", log_outputs, "default",
	      "comma list: default (stderr), stderr, stdout, syslog (or systemd/journal), a file path"),
	CFG_S("logger", logger, "zap", "zap, the only one etcd 3.7 takes (kvd writes one format)"),
	CFG_N("max-txn-ops", CFG_U32, max_txn_ops, 0, 128, "operations per txn request"),
	CFG_N("heartbeat-interval", CFG_U32, heartbeat_interval_ms, 1, 100,
	      "ms; with --election-timeout, sets the minimum lease TTL as etcd"),
	CFG_N("election-timeout", CFG_U32, election_timeout_ms, 1, 1000,
	      "ms; minimum lease TTL = ceil(1.5 x this), added to TTLs at restart"),
	CFG_N("watch-progress-notify-interval", CFG_MS, watch_progress_notify_ms, 1, 600000,
	      "interval of progress notifications to watchers that asked"),
	CFG_N("max-watchers", CFG_U32, max_watchers, 0, KVD_MAX_WATCHERS, "kvd: watchers in all streams"),
	CFG_N("unsafe-no-fsync", CFG_BOOL, unsafe_no_fsync, 0, 0,
	      "acknowledge writes before they reach the disk (loses them on power failure)"),
	CFG_S("auto-compaction-mode", auto_compaction_mode, "periodic",
	      "periodic (retention: hours, or a duration such as 30m) or revision (retention: revisions)"),
	CFG_S("auto-compaction-retention", auto_compaction_retention, "0",
	      "history auto-compaction keeps, 0 = off"),
	CFG_N("auto-compaction-check-interval", CFG_MS, auto_compaction_check_ms, 1, 300000,
	      "kvd: how often revision mode compacts (etcd: 5m)"),
	CFG_N("quota-backend-bytes", CFG_U64, quota_backend_bytes, 0, 0,
	      "log size that raises the NOSPACE alarm, 0 = 2 GiB as etcd"),
	CFG_N("auto-rewrite", CFG_BOOL, auto_rewrite, 0, 1,
	      "kvd: rewrite the log (as Defragment) when enough of it is reclaimable"),
	CFG_N("auto-rewrite-percent", CFG_U32, auto_rewrite_percent, 0, 50,
	      "kvd: ... once the reclaimable bytes reach this percentage of the kept ones"),
	CFG_N("auto-rewrite-min-bytes", CFG_U64, auto_rewrite_min_bytes, 0, 1048576,
	      "kvd: ... and at least this many bytes"),
	CFG_S("cert-file", cert_file, NULL, "path to the client server TLS cert file"),
	CFG_S("key-file", key_file, NULL, "path to the client server TLS key file"),
	CFG_S("trusted-ca-file", trusted_ca_file, NULL, "path to the client server TLS trusted CA cert file"),
	CFG_N("client-cert-auth", CFG_BOOL, client_cert_auth, 0, 0, "enable client cert authentication"),
	CFG_S("client-crl-file", client_crl_file, NULL, "path to the client certificate revocation list file"),
	CFG_S("client-cert-allowed-hostname", client_cert_allowed_hostname, NULL,
	      "allowed TLS hostname for client cert authentication"),
	CFG_N("auto-tls", CFG_BOOL, auto_tls, 0, 0,
	      "client TLS using a self-signed certificate made at start (when --cert-file is not given)"),
	CFG_S("feature-gates", feature_gates, "", "etcd 3.6+'s Name=bool,... list: checked as etcd checks it; "
	      "every gate is about etcd's internals, so none changes what kvd does"),
	CFG_S("tls-min-version", tls_min_version, "", "TLS1.2 or TLS1.3; \"\" is TLS1.2, as etcd 3.7"),
	CFG_S("tls-max-version", tls_max_version, "", "TLS1.2 or TLS1.3; \"\" is the newest this build has"),
	CFG_S("cipher-suites", cipher_suites, NULL,
	      "comma-separated list of supported TLS cipher suites (empty: ECDHE with AES-GCM or ChaCha20-Poly1305)"),
	CFG_S("auth-token", auth_token, "simple",
	      "simple, or jwt,sign-method=RS256|PS256|ES256|HS256...,pub-key=FILE,priv-key=FILE,ttl=5m"),
	CFG_N("auth-token-ttl", CFG_U32, auth_token_ttl, 1, 300, "seconds a simple token lives after its last use"),
	CFG_S("listen-metrics-urls", listen_metrics_urls, "", "comma list of URLs serving only /metrics and /health"),
	CFG_N("enable-grpc-gateway", CFG_BOOL, enable_grpc_gateway, 0, 1, "serve the JSON gateway (/v3/...) on client ports"),
	CFG_S("cors", cors, "*", "comma list of origins allowed for CORS, \"*\" = any"),
	CFG_N("bcrypt-cost", CFG_U32, bcrypt_cost, 4, 10, "bcrypt cost of new password hashes (4..31)"),
	CFG_S("restore-snapshot", restore_snapshot, NULL,
	      "kvd: make the store from this etcd snapshot file (etcdctl snapshot save), then serve; "
	      "refused if the data dir holds one"),
	CFG_N("skip-hash-check", CFG_BOOL, skip_hash_check, 0, 0,
	      "with --restore-snapshot: do not require the file's SHA-256 trailer to match"),
	CFG_S("snapshot-save", snapshot_save, NULL,
	      "kvd: write the data dir's store as an etcd snapshot file (as etcdctl snapshot save) and exit"),
	CFG_N("daemon", CFG_BOOL, daemon, 0, 0,
	      "kvd: go to the background once serving; a start that fails exits with its status and reason first "
	      "(sysvinit scripts)"),
	CFG_S("pid-file", pid_file, NULL, "kvd: write the serving process's pid to this file (removed when kvd stops)"),
	CFG_N("reserve-bytes", CFG_U64, reserve_bytes, 0, 131072,
	      "kvd: disk space held back in <data-dir>/kvd.reserve so deletes, compaction and rewrites work on a full disk"),
	CFG_S("confd-hmac-key-file", confd_hmac_key_file, NULL,
	      "kvd: Ganeti confd key file (its raw bytes, newline included; mode 0600/0400); confd is off without it"),
	CFG_S("confd-listen", confd_listen, "127.0.0.1:1814",
	      "kvd: confd UDP addresses, comma list of host:port or [v6]:port"),
	CFG_S("confd-ganeti-config-key", confd_ganeti_config_key, NULL,
	      "kvd: answer as ganeti-confd from the config.data JSON under this key (default: keyspace mode)"),
	CFG_S("confd-keyspace-prefix", confd_keyspace_prefix, "",
	      "kvd: keyspace mode answers keys under this prefix only, named relative to it (\"\": every key)"),
	CFG_S("confd-user", confd_user, "",
	      "kvd: with auth enabled, keyspace mode answers only what this user may read (required then)"),
	CFG_N("confd-max-clock-skew", CFG_MS, confd_max_clock_skew_ms, 0, 300000,
	      "kvd: accepted request timestamp skew, 0 = no check, for boards without a clock"),
	CFG_N("confd-rate-limit", CFG_U32, confd_rate_limit, 1, 2000,
	      "kvd: datagrams per second per source address, also its burst"),
	CFG_N("confd-global-rate-limit", CFG_U32, confd_global_rate_limit, 1, 100000,
	      "kvd: datagrams per second from all sources"),
	CFG_N("confd-replay-cache", CFG_BOOL, confd_replay_cache, 0, 1,
	      "kvd: answer an authenticated datagram once within its timestamp window"),
};

/* Go duration ("1m30s", "300ms", "0") to milliseconds. */
static int cfg_duration(const char *s, uint32_t *out)
{
	static const struct { const char *u; double ms; } units[] = {
	    {"ns", 1e-6}, {"us", 1e-3}, {"\xc2\xb5s", 1e-3}, {"ms", 1}, {"s", 1000},
	    {"m", 60000}, {"h", 3600000}};
	double total = 0, v, scale;
	size_t i, ul;

	if (!strcmp(s, "0")) {
		*out = 0;
		return 0;
	}
	if (!*s)
		return KVD_EINVAL;
	while (*s) {
		if (!(*s >= '0' && *s <= '9') && *s != '.')
			return KVD_EINVAL;
		v = 0;
		while (*s >= '0' && *s <= '9')
			v = v * 10 + (*s++ - '0');
		if (*s == '.')
			for (s++, scale = 0.1; *s >= '0' && *s <= '9'; s++, scale /= 10)
				v += (*s - '0') * scale;
		for (i = KVD_COUNT(units); i-- > 0;) { /* longest match: "ms" before "m" */
			ul = strlen(units[i].u);
			if (!strncmp(s, units[i].u, ul) && !(ul == 1 && s[0] == 'm' && s[1] == 's'))
				break;
		}
		if (i == (size_t)-1)
			return KVD_EINVAL;
		total += v * units[i].ms;
		s += strlen(units[i].u);
	}
	if (total > 4294967295.0)
		return KVD_EINVAL;
	*out = (uint32_t)(total + 0.999);
	return 0;
}

KVD_RESIDENT static int cfg_set(struct kvd_config *cfg, const struct cfg_flag *f, const char *v,
                   char *err, size_t errlen)
{
	char *end;
	unsigned long long u;
	uint32_t ms;

	switch (f->type) {
	case CFG_STR:
		*(const char **)(void *)((char *)cfg + f->off) = v;
		return 0;
	case CFG_U32:
		errno = 0;
		u = strtoull(v, &end, 10);
		if (!*v || *end || errno || u > 0xffffffffu || u < f->min || *v == '-') {
			snprintf(err, errlen, "invalid value \"%s\" for flag --%s: want an integer %u..4294967295",
			         v, f->name, f->min);
			return KVD_EINVAL;
		}
		*(uint32_t *)(void *)((char *)cfg + f->off) = (uint32_t)u;
		return 0;
	case CFG_U64:
		errno = 0;
		u = strtoull(v, &end, 10);
		if (!*v || *end || errno || u < f->min || *v == '-') {
			snprintf(err, errlen, "invalid value \"%s\" for flag --%s: want a number of bytes", v, f->name);
			return KVD_EINVAL;
		}
		*(uint64_t *)(void *)((char *)cfg + f->off) = (uint64_t)u;
		return 0;
	case CFG_MS:
		if (cfg_duration(v, &ms)) {
			snprintf(err, errlen, "invalid value \"%s\" for flag --%s: want a duration such as 5s", v, f->name);
			return KVD_EINVAL;
		}
		*(uint32_t *)(void *)((char *)cfg + f->off) = ms;
		return 0;
	case CFG_BOOL:
		if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "t") || !strcmp(v, "TRUE"))
			*(int *)(void *)((char *)cfg + f->off) = 1;
		else if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "f") || !strcmp(v, "FALSE"))
			*(int *)(void *)((char *)cfg + f->off) = 0;
		else {
			snprintf(err, errlen, "invalid boolean value \"%s\" for -%s", v, f->name);
			return KVD_EINVAL;
		}
		return 0;
	case CFG_LEVEL:
		if (!strcmp(v, "debug"))
			cfg->log_level = KVD_LOG_DEBUG;
		else if (!strcmp(v, "info"))
			cfg->log_level = KVD_LOG_INFO;
		else if (!strcmp(v, "warn"))
			cfg->log_level = KVD_LOG_WARN;
		else if (!strcmp(v, "error") || !strcmp(v, "panic") || !strcmp(v, "fatal"))
			cfg->log_level = KVD_LOG_ERROR;
		else {
			snprintf(err, errlen, "invalid value \"%s\" for flag --log-level: want debug, info, warn or error", v);
			return KVD_EINVAL;
		}
		return 0;
	}
	return KVD_EINVAL;
}

/* --feature-gates as etcd 3.7 checks it (its gates, Go's ParseBool, its
 * words); kvd has none to turn, so a valid list changes nothing. */
static int cfg_check_gates(const char *list, char *err, size_t errlen)
{
	static const char *const gates[] = {"StopGRPCServiceOnDefrag", "InitialCorruptCheck", "CompactHashCheck",
	                                    "TxnModeWriteWithSharedBuffer", "LeaseCheckpoint", "LeaseCheckpointPersist",
	                                    "SetMemberLocalAddr", "FastLeaseKeepAlive", "PriorityRequest"};
	static const char *const bools[] = {"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"};
	const char *p = list, *e, *eq;
	size_t i, n;

	for (; p && *p; p = *e ? e + 1 : e) {
		e = p + strcspn(p, ",");
		eq = memchr(p, '=', (size_t)(e - p));
		if (!eq) {
			snprintf(err, errlen, "invalid value \"%.128s\" for flag --feature-gates: missing bool value for %.*s",
			         list, (int)KVD_MIN((size_t)(e - p), 64), p);
			return KVD_EINVAL;
		}
		n = (size_t)(eq - p);
		for (i = 0; i < KVD_COUNT(gates) && !(strlen(gates[i]) == n && !memcmp(gates[i], p, n)); i++)
			;
		if (i == KVD_COUNT(gates)) {
			snprintf(err, errlen, "invalid value \"%.128s\" for flag --feature-gates: unrecognized feature gate: %.*s",
			         list, (int)KVD_MIN(n, 64), p);
			return KVD_EINVAL;
		}
		n = (size_t)(e - eq - 1);
		for (i = 0; i < KVD_COUNT(bools) && !(strlen(bools[i]) == n && !memcmp(bools[i], eq + 1, n)); i++)
			;
		if (i == KVD_COUNT(bools)) {
			snprintf(err, errlen, "invalid value \"%.128s\" for flag --feature-gates: invalid value of %.*s, err: "
			         "strconv.ParseBool: parsing \"%.*s\": invalid syntax", list, (int)KVD_MIN((size_t)(e - p), 96), p,
			         (int)KVD_MIN(n, 32), eq + 1);
			return KVD_EINVAL;
		}
	}
	return 0;
}

/*
 * --config-file: etcd's YAML file, the flat subset its sample file uses.
 *
 * A line is blank, a comment, "key: value" at column 0, or "key:" alone,
 * which opens an indented block: either a mapping one level deep (etcd's
 * client-transport-security, whose keys are cert-file, key-file,
 * client-cert-auth, trusted-ca-file and auto-tls) or a list of "- item"
 * lines.  A value is a plain scalar (to the end of the line or a " #"),
 * 'single' or "double" quoted, a [flow, list], or nothing: null, which
 * leaves the default.  A list becomes the flag's comma list.  Keys are the
 * flag names; etcd's keys that mean nothing to one kvd (peers, WAL, proxy,
 * discovery, v2, pprof, 3.6+'s tuning keys) are taken and
 * ignored, and so are the keys 3.7 removed (experimental-*, debug,
 * log-output), which 3.7's lax YAML decoding ignores too; anything else is
 * refused with its line number, as are anchors, tags, block scalars and flow
 * mappings.
 *
 * Durations: etcd reads a bare number as nanoseconds (Go's time.Duration
 * through JSON); so does kvd, and it takes "5s" as well.  Bounded: 64 KiB of
 * text, one level of nesting; strings are unescaped into the caller's store,
 * never longer than the text itself, so nothing is allocated.
 */
#define CFG_YAML_MAX 65536

static const char *const cfg_yaml_ignored[] = {
    "wal-dir", "snapshot-count", "listen-peer-urls", "max-snapshots", "max-wals", "discovery",
    "discovery-fallback", "discovery-proxy", "discovery-srv", "initial-cluster", "initial-cluster-state",
    "strict-reconfig-check", "enable-v2", "enable-pprof", "proxy", "proxy-failure-wait", "proxy-refresh-interval",
    "proxy-dial-timeout", "proxy-write-timeout", "proxy-read-timeout", "force-new-cluster", "peer-transport-security",
    "metrics", "log-package-levels", "pre-vote", "initial-corrupt-check", "debug", "log-output",
    "max-learners", "snapshot-catchup-entries", "v2-deprecation", "corrupt-check-time",
    "compact-hash-check-time", "compaction-batch-limit", "compaction-sleep-interval", "downgrade-check-time",
    "warning-apply-duration", "warning-unary-request-duration", "memory-mlock", "backend-bbolt-freelist-type",
    "bootstrap-defrag-threshold-megabytes", "log-format"};

struct cfg_yaml {
	const char *p, *end;   /* text still to read */
	char *w, *wend;        /* the store: unescaped strings go here */
	unsigned line;
	char *err;
	size_t errlen;
};

static int cfg_yaml_bad(struct cfg_yaml *y, const char *why, const char *what)
{
	snprintf(y->err, y->errlen, "line %u: %s%s%.64s%s", y->line, why, what ? " \"" : "", what ? what : "",
	         what ? "\"" : "");
	return KVD_EINVAL;
}

static int cfg_yaml_put(struct cfg_yaml *y, char c)
{
	if (y->w >= y->wend)
		return cfg_yaml_bad(y, "too long", NULL); /* cannot happen with cap >= len + 1 */
	*y->w++ = c;
	return 0;
}

/* One scalar at *pp (up to eol, or a ',' / ']' inside a flow list), written
 * to the store; *isnull when it was absent, null or ~. */
static int cfg_yaml_scalar(struct cfg_yaml *y, const char **pp, const char *eol, int inflow, int *isnull)
{
	const char *p = *pp, *s;
	char q;

	*isnull = 0;
	while (p < eol && *p == ' ')
		p++;
	if (p == eol || *p == '#' || (inflow && (*p == ',' || *p == ']'))) {
		*isnull = 1;
		*pp = p;
		return 0;
	}
	if (*p == '\'' || *p == '"') {
		for (q = *p++;; p++) {
			if (p >= eol)
				return cfg_yaml_bad(y, "unterminated quoted string", NULL);
			if (*p == q && q == '\'' && p + 1 < eol && p[1] == '\'') {
				p++; /* '' is a quote */
			} else if (*p == q) {
				p++;
				break;
			} else if (*p == '\\' && q == '"') {
				static const char in[] = "\\\"/nrtbf", out[] = "\\\"/\n\r\t\b\f";
				const char *e = ++p < eol ? strchr(in, *p) : NULL;
				if (!e || !*p)
					return cfg_yaml_bad(y, "unsupported escape in a quoted string", NULL);
				if (cfg_yaml_put(y, out[e - in]))
					return KVD_EINVAL;
				continue;
			} else if ((unsigned char)*p < 0x20 && *p != '\t') {
				return cfg_yaml_bad(y, "control character in a string", NULL);
			}
			if (cfg_yaml_put(y, *p))
				return KVD_EINVAL;
		}
		*pp = p;
		return 0;
	}
	if (strchr("&*!|>{%@`", *p))
		return cfg_yaml_bad(y, "unsupported YAML (anchors, tags, block scalars, flow mappings)", NULL);
	for (s = p; p < eol && !(inflow && (*p == ',' || *p == ']')) && !(*p == '#' && p[-1] == ' '); p++)
		if ((unsigned char)*p < 0x20 && *p != '\t')
			return cfg_yaml_bad(y, "control character in a value", NULL);
	*pp = p;
	while (p > s && (p[-1] == ' ' || p[-1] == '\t'))
		p--;
	if ((p - s == 1 && *s == '~') || (p - s == 4 && !memcmp(s, "null", 4)) ||
	    (p - s == 4 && !memcmp(s, "Null", 4)) || (p - s == 4 && !memcmp(s, "NULL", 4))) {
		*isnull = 1;
		return 0;
	}
	for (; s < p; s++)
		if (cfg_yaml_put(y, *s))
			return KVD_EINVAL;
	return 0;
}

/* The rest of a line after a value: spaces, perhaps a comment. */
static int cfg_yaml_eol(struct cfg_yaml *y, const char *p, const char *eol)
{
	while (p < eol && *p == ' ')
		p++;
	if (p < eol && *p != '#')
		return cfg_yaml_bad(y, "unexpected text after the value", NULL);
	return 0;
}

/* A value (scalar or [flow list]) as one NUL-terminated string in the store:
 * *out NULL for null. */
static int cfg_yaml_value(struct cfg_yaml *y, const char *p, const char *eol, const char **out)
{
	char *start = y->w;
	int isnull, n = 0;

	*out = NULL;
	while (p < eol && *p == ' ')
		p++;
	if (p < eol && *p == '[') {
		for (p++;; n++) {
			if (n && cfg_yaml_put(y, ','))
				return KVD_EINVAL;
			if (cfg_yaml_scalar(y, &p, eol, 1, &isnull))
				return KVD_EINVAL;
			while (p < eol && *p == ' ')
				p++;
			if (p < eol && *p == ']' && isnull && !n)
				break; /* [] */
			if (isnull)
				return cfg_yaml_bad(y, "empty list item", NULL);
			if (p < eol && *p == ']')
				break;
			if (p >= eol || *p != ',')
				return cfg_yaml_bad(y, "unterminated [list] (lists are on one line, or as \"- item\" lines)", NULL);
			p++;
		}
		p++;
	} else {
		if (cfg_yaml_scalar(y, &p, eol, 0, &isnull))
			return KVD_EINVAL;
		if (isnull)
			return cfg_yaml_eol(y, p, eol);
	}
	if (cfg_yaml_eol(y, p, eol) || cfg_yaml_put(y, 0))
		return KVD_EINVAL;
	*out = start;
	return 0;
}

/* key (the flag's name) = value, as the flag would take it. */
static int cfg_yaml_set(struct kvd_config *cfg, struct cfg_yaml *y, const char *key, size_t kl, const char *v)
{
	const struct cfg_flag *f = NULL;
	char name[64], buf[32];
	size_t i;

	if (kl >= sizeof name)
		return cfg_yaml_bad(y, "unknown key", NULL);
	memcpy(name, key, kl);
	name[kl] = 0;
	for (i = 0; i < KVD_COUNT(cfg_yaml_ignored); i++)
		if (!strcmp(name, cfg_yaml_ignored[i]))
			return 0; /* etcd's, meaningless for one kvd */
	if (!strncmp(name, "experimental-", 13))
		return 0; /* etcd 3.7 removed them; its YAML decoding is not strict, so they are ignored */
	for (i = 0; i < KVD_COUNT(cfg_flags); i++)
		if (!strcmp(name, cfg_flags[i].name))
			f = &cfg_flags[i];
	if (!f || !strcmp(name, "config-file"))
		return cfg_yaml_bad(y, f ? "a config file cannot name another" : "unknown key", name);
	if (!v)
		return 0; /* null: the default stays */
	if (f->type == CFG_BOOL) { /* YAML 1.1's spellings, as go-yaml v2 resolves a plain scalar */
		static const char *const yes[] = {"y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "True", "TRUE"};
		static const char *const no[] = {"n", "N", "no", "No", "NO", "off", "Off", "OFF", "False", "FALSE"};
		for (i = 0; i < KVD_COUNT(yes); i++)
			if (!strcmp(v, yes[i]))
				v = "true";
		for (i = 0; i < KVD_COUNT(no); i++)
			if (!strcmp(v, no[i]))
				v = "false";
	} else if (f->type == CFG_MS && v[0] && strspn(v, "0123456789") == strlen(v)) {
		unsigned long long ns = strtoull(v, NULL, 10); /* etcd: a bare number is nanoseconds */
		if (strlen(v) > 19 || ns / 1000000 + (ns % 1000000 != 0) > 0xffffffffull)
			return cfg_yaml_bad(y, "duration out of range", name);
		snprintf(buf, sizeof buf, "%llu", ns / 1000000 + (ns % 1000000 != 0));
		snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "ms");
		v = buf;
	}
	if (cfg_set(cfg, f, v, y->err, y->errlen)) {
		char why[KVD_ERRLEN];
		snprintf(why, sizeof why, "%s", y->err);
		snprintf(y->err, y->errlen, "line %u: %.200s", y->line, why);
		return KVD_EINVAL;
	}
	return 0;
}

static void cfg_env_name(const struct cfg_flag *f, char *out, size_t cap)
{
	size_t i, o = (size_t)snprintf(out, cap, "ETCD_");

	for (i = 0; f->name[i] && o + 1 < cap; i++)
		out[o++] = f->name[i] == '-' ? '_' : (char)(f->name[i] - 'a' + 'A');
	out[o] = 0;
}

/* A duration as Go prints one ("5m0s", "100ms"), for --help. */
static void cfg_show_ms(uint32_t ms, char *out, size_t cap)
{
	uint32_t h = ms / 3600000, m = ms / 60000 % 60, s = ms / 1000 % 60;

	if (ms % 1000 || !ms)
		snprintf(out, cap, "%ums", (unsigned)ms);
	else if (h)
		snprintf(out, cap, "%uh%um%us", (unsigned)h, (unsigned)m, (unsigned)s);
	else if (m)
		snprintf(out, cap, "%um%us", (unsigned)m, (unsigned)s);
	else
		snprintf(out, cap, "%us", (unsigned)s);
}

static void cfg_usage(void)
{
	static const char *const levels[] = {"debug", "info", "warn", "error"};
	char def[64];
	size_t i;

	printf("usage: kvd [flags]\n\nkvd %s: an etcd v3 API server (single member) in one C file.\n\n",
	       KVD_VERSION);
	for (i = 0; i < KVD_COUNT(cfg_flags); i++) {
		const struct cfg_flag *f = &cfg_flags[i];
		switch (f->type) {
		case CFG_STR: snprintf(def, sizeof def, "\"%s\"", f->defs ? f->defs : ""); break;
		case CFG_MS: cfg_show_ms(f->def, def, sizeof def); break;
		case CFG_BOOL: snprintf(def, sizeof def, "%s", f->def ? "true" : "false"); break;
		case CFG_LEVEL: snprintf(def, sizeof def, "%s", levels[f->def & 3]); break;
		default: snprintf(def, sizeof def, "%u", (unsigned)f->def); break;
		}
		if (f->type == CFG_STR && !f->defs)
			printf("  --%s\n\t%s\n", f->name, f->help);
		else
			printf("  --%s\n\t%s (default %s)\n", f->name, f->help, def);
	}
	printf("  --version\n\tprint the version and build options\n"
	       "  --help\n\tthis text\n\n"
	       "Every flag may also be set as ETCD_<FLAG> (e.g. ETCD_DATA_DIR).\n");
}

/* Copy the strings of cfg into kvd's own memory (NULL becomes ""), or let
 * them go.  The table says which fields are strings. */
KVD_RESIDENT static int cfg_own(struct kvd *k, struct kvd_config *cfg)
{
	const char *orig[KVD_COUNT(cfg_flags)];
	size_t i;
	int r = 0;

	for (i = 0; i < KVD_COUNT(cfg_flags); i++) { /* none is the caller's any more, even on failure */
		const char **f = (const char **)(void *)((char *)cfg + cfg_flags[i].off);
		if (cfg_flags[i].type == CFG_STR) {
			orig[i] = *f;
			*f = NULL;
		}
	}
	for (i = 0; i < KVD_COUNT(cfg_flags) && !r; i++) {
		const char **f = (const char **)(void *)((char *)cfg + cfg_flags[i].off);
		if (cfg_flags[i].type == CFG_STR && !(*f = kvd_strdup(k, orig[i] ? orig[i] : "")))
			r = KVD_ENOMEM;
	}
	return r;
}

static void cfg_disown(struct kvd *k, struct kvd_config *cfg)
{
	size_t i;

	for (i = 0; i < KVD_COUNT(cfg_flags); i++) {
		const char **f = (const char **)(void *)((char *)cfg + cfg_flags[i].off);
		if (cfg_flags[i].type == CFG_STR) {
			kvd_free(k, (void *)(uintptr_t)*f);
			*f = NULL;
		}
	}
}

/* Split a comma list into an owned array of owned strings. */
KVD_RESIDENT static int cfg_split(struct kvd *k, const char *list, char ***out, unsigned *n)
{
	const char *p = list, *e;
	char **a = NULL;
	size_t cap = 0;

	*n = 0;
	while (*p) {
		e = p + strcspn(p, ",");
		if (e > p) {
			if (UTIL_GROW(k, a, cap, (size_t)*n + 1, 1) || !(a[*n] = kvd_malloc(k, (size_t)(e - p) + 1))) {
				*out = a;
				return KVD_ENOMEM;
			}
			memcpy(a[*n], p, (size_t)(e - p));
			a[*n][e - p] = 0;
			(*n)++;
		}
		p = *e ? e + 1 : e;
	}
	*out = a;
	return 0;
}

static void cfg_free_list(struct kvd *k, char **a, unsigned n)
{
	unsigned i;

	for (i = 0; a && i < n; i++)
		kvd_free(k, a[i]);
	kvd_free(k, a);
}

static int cfg_strcmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * etcd's member id: SHA-1 of the sorted peer URLs and the cluster token, first
 * 8 bytes big-endian; the cluster id hashes the member ids.  The same flags
 * give kvd and etcd the same ids.
 */
static int cfg_ids(struct kvd *k)
{
	char **sorted;
	size_t len = strlen(k->cfg.initial_cluster_token), o = 0;
	unsigned i;
	uint8_t *buf, h[20], idb[8];

	for (i = 0; i < k->npeer_urls; i++)
		len += strlen(k->peer_urls[i]);
	sorted = kvd_malloc(k, (k->npeer_urls + 1) * sizeof *sorted);
	buf = kvd_malloc(k, len + 1);
	if (!sorted || !buf) {
		kvd_free(k, sorted);
		kvd_free(k, buf);
		return KVD_ENOMEM;
	}
	memcpy(sorted, k->peer_urls, k->npeer_urls * sizeof *sorted);
	qsort(sorted, k->npeer_urls, sizeof *sorted, cfg_strcmp);
	for (i = 0; i < k->npeer_urls; i++) {
		memcpy(buf + o, sorted[i], strlen(sorted[i]));
		o += strlen(sorted[i]);
	}
	memcpy(buf + o, k->cfg.initial_cluster_token, strlen(k->cfg.initial_cluster_token));
	o += strlen(k->cfg.initial_cluster_token);
	util_sha1(buf, o, h);
	k->member_id = get_be64(h);
	memcpy(idb, h, 8);
	util_sha1(idb, 8, h);
	k->cluster_id = get_be64(h);
	kvd_free(k, sorted);
	kvd_free(k, buf);
	return 0;
}

/* mkdir -p, 0700 as etcd. */
KVD_RESIDENT static int cfg_mkdirs(const char *dir, char *err, size_t errlen)
{
	char tmp[PATH_MAX];
	size_t i, n = strlen(dir);
	struct stat st;

	if (!n || n >= sizeof tmp) {
		snprintf(err, errlen, "bad --data-dir \"%s\"", dir);
		return KVD_EINVAL;
	}
	memcpy(tmp, dir, n + 1);
	for (i = 1; i <= n; i++) {
		if (tmp[i] != '/' && tmp[i] != 0)
			continue;
		tmp[i] = 0;
		if (mkdir(tmp, 0700) && errno != EEXIST) {
			snprintf(err, errlen, "cannot create data dir %s: %s", tmp, strerror(errno));
			return KVD_EIO;
		}
		tmp[i] = i < n ? '/' : 0;
	}
	if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "data dir %s is not a directory", dir);
		return KVD_EINVAL;
	}
	return 0;
}

/*
 * An etcd data dir (member/snap/db, member/wal) with no kvd.log: kvd keeps
 * its own log and would serve it as an empty store, so it is refused before
 * anything is written there (exit 2), naming the way in -- an import of
 * etcd's backend file, which is a snapshot without the hash trailer.
 */
static int cfg_not_etcd(const char *dir, char *err, size_t errlen)
{
	char path[PATH_MAX];
	struct stat st;
	int db, wal;

	snprintf(path, sizeof path, "%s/kvd.log", dir);
	if (!lstat(path, &st))
		return 0;
	snprintf(path, sizeof path, "%s/member/snap/db", dir);
	db = !stat(path, &st) && S_ISREG(st.st_mode);
	snprintf(path, sizeof path, "%s/member/wal", dir);
	wal = !stat(path, &st) && S_ISDIR(st.st_mode);
	if (!db && !wal)
		return 0;
	if (db)
		snprintf(err, errlen, "%s holds etcd's data, not kvd's; with etcd stopped, import it into a new dir: "
		         "kvd --data-dir NEW --restore-snapshot %s/member/snap/db --skip-hash-check", dir, dir);
	else
		snprintf(err, errlen, "%s holds etcd's data (member/wal), not kvd's; start kvd on a new dir with "
		         "--restore-snapshot FILE, FILE from that etcd's etcdctl snapshot save", dir);
	return KVD_EINVAL;
}

/* Exactly one kvd per data dir: an exclusive flock on <dir>/kvd.lock. */
KVD_RESIDENT static int cfg_lock(struct kvd *k, char *err, size_t errlen)
{
	char path[PATH_MAX];

	snprintf(path, sizeof path, "%s/kvd.lock", k->cfg.data_dir);
	k->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (k->lock_fd < 0) {
		snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
		return KVD_EIO;
	}
	if (flock(k->lock_fd, LOCK_EX | LOCK_NB)) {
		snprintf(err, errlen, "data dir %s is in use by another kvd (%s is locked)",
		         k->cfg.data_dir, path);
		return KVD_EBUSY;
	}
	return 0;
}

/* --config-file: read (bounded), then parsed over etcd's defaults; *store
 * holds its strings until kvd_open() has copied them. */
static int cfg_read_file(struct kvd_config *cfg, char **store, char *err, size_t errlen)
{
	const char *path = cfg->config_file;
	struct stat st;
	size_t got = 0;
	ssize_t n;
	char *text;
	int fd = util_open_regular(path, 0, &st); /* a FIFO would block start-up: refused */

	if (fd < 0 || st.st_size > CFG_YAML_MAX) {
		snprintf(err, errlen, "--config-file %s: %s", path,
		         fd == -1 ? strerror(errno) : fd == -2 ? "not a regular file" : "larger than 64 KiB");
		if (fd >= 0)
			close(fd);
		return KVD_EINVAL;
	}
	text = KVD_SYS_MALLOC(2 * (size_t)st.st_size + 2);
	if (!text) {
		close(fd);
		snprintf(err, errlen, "out of memory");
		return KVD_ENOMEM;
	}
	while (got < (size_t)st.st_size && (n = read(fd, text + got, (size_t)st.st_size - got)) > 0)
		got += (size_t)n;
	close(fd);
	*store = text;
	kvd_config_init(cfg);
	cfg->config_file = path;
	n = snprintf(err, errlen, "--config-file %.64s: ", path); /* the parser's words go after it */
	return kvd_config_yaml(cfg, text, got, text + got + 1, got + 1, err + n, errlen - (size_t)n);
}

/* ===== 37. Public embedding API (kvd_) =================================== */

/* A start that failed: its reason in every log output configured (a file,
 * syslog, an embedder's kvd_set_log) besides stderr, where kvd_main and an
 * embedder's caller say it -- so an init system's log holds it too. */
static void kvd_open_failed(struct kvd *k, const char *err)
{
	unsigned to = k->log_to ? k->log_to : LOG_TO_STDERR;

	if (!(to & ~LOG_TO_STDERR) && !k->log_fn)
		return;
	k->log_to = to & ~LOG_TO_STDERR;
	kvd_log(k, KVD_LOG_ERROR, "cannot start: %s", err);
	k->log_to = to;
}

/*
 * What an embedder, and kvd_main, call (kvd.h declares them): the
 * configuration (kvd_config_init, kvd_config_parse, kvd_config_yaml), an
 * instance's life (kvd_open, kvd_poll, kvd_reload, kvd_shutdown,
 * kvd_close), and kvd_main, the whole program.  KVD_API makes them extern,
 * or static with KVD_STATIC.  Everything lives in one struct kvd, so two
 * instances can share a process; an instance runs on the caller's thread,
 * and only kvd_main installs signal handlers (main_kvd is their one global).
 *
 * Invariants:
 *   1. Only kvd_* functions, main and the generated protobuf-c symbols are
 *      exported; everything else is static (make symcheck; make toc holds
 *      each function to its section's prefix).
 *   2. A configuration error changes nothing: kvd_open checks every flag
 *      and every file it names before the data dir is made or locked and
 *      before a socket is bound, and returns KVD_EINVAL for it -- exit 2
 *      from kvd_main, against 1 for a runtime failure (KVD_EXIT_*).  The
 *      one check that needs the store (confd_bind: keyspace mode, auth on,
 *      no --confd-user) comes after the data dir, still KVD_EINVAL.
 *   3. kvd_open copies what it keeps (cfg_own, in kvd_init): the caller's
 *      struct kvd_config and its strings may go once it returns; kvd_init
 *      touches no file, socket or pipe (tests and fuzzers use it alone).
 *   4. A signal only writes a byte to the wake pipe (kvd_on_signal ->
 *      kvd_reload, kvd_shutdown); the loop acts on it (loop_run), so no
 *      handler touches kvd's state.
 *   5. kvd_close frees an instance whole, half-built or not -- every
 *      failure of kvd_open ends in it -- after writing an open batch
 *      (mvcc_flush); memory still held then is logged.
 */

#define KVD_STR_(x) #x
#define KVD_STR(x) KVD_STR_(x)

KVD_API const char *kvd_build_options(void)
{
	return "max-conns=" KVD_STR(KVD_DEFAULT_MAX_CONNECTIONS)
	       " max-conns-per-ip=" KVD_STR(KVD_DEFAULT_MAX_CONNS_PER_IP)
	       " max-streams=" KVD_STR(KVD_DEFAULT_MAX_STREAMS)
	       " max-header-list=" KVD_STR(KVD_MAX_HEADER_LIST)
	       " max-header-fields=" KVD_STR(KVD_MAX_HEADER_FIELDS)
	       " max-output=" KVD_STR(KVD_MAX_OUTPUT)
	       " conn-window=" KVD_STR(KVD_CONN_WINDOW)
	       " watch-queue=" KVD_STR(KVD_MAX_WATCH_QUEUE)
	       " lease-expire-max=" KVD_STR(KVD_LEASE_EXPIRE_MAX)
	       " etcd-api=" KVD_ETCD_VERSION
#ifdef KVD_NO_CONFD
	       " confd=no"
#endif
#ifdef KVD_NO_RECIPES
	       " recipes=no"
#endif
#ifdef KVD_NO_AUTH
	       " auth=no"
#endif
#ifdef KVD_NO_JWT
	       " jwt=no"
#endif
#ifdef KVD_NO_SNAPSHOT
	       " snapshot=no"
#endif
#ifdef KVD_NO_HTTP
	       " http=no"
#endif
#ifdef KVD_NO_TLS
	       " tls=no"
#else
	       " tls=mbedtls-" MBEDTLS_VERSION_STRING
#if defined(MBEDTLS_SSL_PROTO_TLS1_3)
	       "+tls1.3"
#endif
#endif
#ifdef KVD_TEST_SERVICES
	       " test-services"
#endif
	    ;
}

KVD_API const char *kvd_strerror(int err)
{
	switch (err) {
	case 0: return "success";
	case KVD_ENOMEM: return "out of memory";
	case KVD_EPROTO: return "protocol error";
	case KVD_EIO: return "I/O error";
	case KVD_EAGAIN: return "need more input";
	case KVD_EINVAL: return "invalid argument";
	case KVD_ECORRUPT: return "data corrupt";
	case KVD_ELIMIT: return "limit reached";
	case KVD_EBUSY: return "resource busy";
	case KVD_ESTOPPED: return "stopped";
	case KVD_ERANGE: return "number out of range";
	default: return "unknown error";
	}
}

KVD_RESIDENT KVD_API void kvd_config_init(struct kvd_config *cfg)
{
	size_t i;

	memset(cfg, 0, sizeof *cfg);
	for (i = 0; i < KVD_COUNT(cfg_flags); i++) {
		void *f = (char *)cfg + cfg_flags[i].off;
		switch (cfg_flags[i].type) {
		case CFG_STR: *(const char **)f = cfg_flags[i].defs; break;
		case CFG_BOOL:
		case CFG_LEVEL: *(int *)f = (int)cfg_flags[i].def; break;
		case CFG_U64: *(uint64_t *)f = cfg_flags[i].def; break;
		default: *(uint32_t *)f = cfg_flags[i].def; break;
		}
	}
}

KVD_RESIDENT KVD_API int kvd_config_parse(struct kvd_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
	unsigned char seen[KVD_COUNT(cfg_flags)] = {0};
	char env[64];
	const char *a, *v, *eq;
	size_t i, nl;
	int r, ai;

	for (ai = 1; ai < argc; ai++) {
		a = argv[ai];
		if (a[0] != '-' || !a[1]) {
			snprintf(err, errlen, "'%s' is not a valid flag", a);
			return KVD_EINVAL;
		}
		a += a[1] == '-' ? 2 : 1;
		if (!*a) /* "--": nothing may follow */
			break;
		eq = strchr(a, '=');
		nl = eq ? (size_t)(eq - a) : strlen(a);
		if ((nl == 7 && !strncmp(a, "version", 7)) || (nl == 4 && !strncmp(a, "help", 4)) ||
		    (nl == 1 && a[0] == 'h')) {
			if (a[0] == 'v')
				printf("kvd Version: %s\netcd API Version: %s\nBuild options: %s\n",
				       KVD_VERSION, KVD_ETCD_VERSION, kvd_build_options());
			else
				cfg_usage();
			return 1;
		}
		for (i = 0; i < KVD_COUNT(cfg_flags); i++)
			if (strlen(cfg_flags[i].name) == nl && !strncmp(cfg_flags[i].name, a, nl))
				break;
		if (i == KVD_COUNT(cfg_flags)) { /* etcd 3.7 removed every --experimental-*: exit 2 as it does */
			if (nl > 13 && !strncmp(a, "experimental-", 13))
				snprintf(err, errlen, "flag provided but not defined: -%.*s (etcd 3.7 removed the experimental "
				         "flags; see kvd --help for the names without experimental-)", (int)KVD_MIN(nl, 64), a);
			else
				snprintf(err, errlen, "unknown flag --%.*s (see kvd --help)", (int)KVD_MIN(nl, 64), a);
			return KVD_EINVAL;
		}
		if (eq) {
			v = eq + 1;
		} else if (cfg_flags[i].type == CFG_BOOL) {
			v = "true"; /* Go: a bare boolean flag is true, it takes no argument */
		} else if (ai + 1 < argc) {
			v = argv[++ai];
		} else {
			snprintf(err, errlen, "flag needs an argument: --%s", cfg_flags[i].name);
			return KVD_EINVAL;
		}
		if ((r = cfg_set(cfg, &cfg_flags[i], v, err, errlen)))
			return r;
		seen[i] = 1;
	}
	if (ai < argc - 1) {
		snprintf(err, errlen, "'%s' is not a valid flag", argv[ai + 1]);
		return KVD_EINVAL;
	}
	if (!cfg->config_file && (v = getenv("ETCD_CONFIG_FILE")) && *v)
		cfg->config_file = v;
	if (cfg->config_file && *cfg->config_file)
		return 0; /* as etcd: the file is the whole configuration, the variables are not read */
	for (i = 0; i < KVD_COUNT(cfg_flags); i++) {
		cfg_env_name(&cfg_flags[i], env, sizeof env);
		if (!(v = getenv(env)))
			continue;
		if (seen[i]) {
			snprintf(err, errlen, "conflicting environment variable \"%s\" is shadowed by "
			         "corresponding command-line flag (either unset environment variable or disable flag)", env);
			return KVD_EINVAL;
		}
		if (!*v)
			continue; /* as etcd: an empty variable sets nothing (ETCD_CLIENT_CERT_AUTH= is false) */
		if ((r = cfg_set(cfg, &cfg_flags[i], v, err, errlen)))
			return r;
	}
	return 0;
}

/* --config-file's text (the reader's grammar: section 36, cfg_yaml_). */
KVD_API int kvd_config_yaml(struct kvd_config *cfg, const char *text, size_t len, char *store, size_t cap, char *err,
                            size_t errlen)
{
	struct cfg_yaml y = {text, text + len, store, store + cap, 0, err, errlen};
	const char *eol, *p, *colon, *key = NULL, *v;
	size_t kl = 0;
	char *list = NULL; /* a "- item" list being joined in the store */
	int in_block = 0, nested_tls = 0, indent, isnull;

	if (len > CFG_YAML_MAX || cap < len + 1) {
		snprintf(err, errlen, "config file larger than %u bytes", CFG_YAML_MAX);
		return KVD_EINVAL;
	}
	for (; y.p < y.end || key; y.p = eol < y.end ? eol + 1 : eol) {
		eol = y.p < y.end ? memchr(y.p, '\n', (size_t)(y.end - y.p)) : NULL;
		eol = eol ? eol : y.end;
		y.line++;
		if (eol > y.p && eol[-1] == '\r')
			eol--;
		for (p = y.p; p < eol && *p == ' '; p++)
			;
		indent = (int)(p - y.p);
		if (y.p < y.end && (p == eol || *p == '#' || (!indent && eol - p >= 3 && !memcmp(p, "---", 3))))
			continue; /* blank, comment, document start */
		if (p < eol && *p == '\t')
			return cfg_yaml_bad(&y, "tab in indentation", NULL);
		if (y.p < y.end && (indent || (p < eol && *p == '-' && (p + 1 == eol || p[1] == ' ')))) {
			/* inside the block "key:" opened */
			if (!key)
				return cfg_yaml_bad(&y, "indented line outside a block", NULL);
			if (*p == '-' && (p + 1 == eol || p[1] == ' ')) {
				if (in_block == 2)
					return cfg_yaml_bad(&y, "list item inside a mapping", NULL);
				in_block = 1;
				if (list && cfg_yaml_put(&y, ','))
					return KVD_EINVAL;
				if (!list)
					list = y.w;
				p++;
				if (cfg_yaml_scalar(&y, &p, eol, 0, &isnull) || cfg_yaml_eol(&y, p, eol))
					return KVD_EINVAL;
				if (isnull)
					return cfg_yaml_bad(&y, "empty list item", NULL);
				continue;
			}
			if (in_block == 1 || !indent)
				return cfg_yaml_bad(&y, "mapping inside a list", NULL);
			in_block = 2;
			colon = memchr(p, ':', (size_t)(eol - p));
			if (!colon || (colon + 1 < eol && colon[1] != ' '))
				return cfg_yaml_bad(&y, "want \"key: value\"", NULL);
			if (!nested_tls) { /* peer-transport-security and the like: ignored as a whole */
				size_t i;
				for (i = 0; i < KVD_COUNT(cfg_yaml_ignored) &&
				            !(strlen(cfg_yaml_ignored[i]) == kl && !memcmp(cfg_yaml_ignored[i], key, kl)); i++)
					;
				if (i == KVD_COUNT(cfg_yaml_ignored))
					return cfg_yaml_bad(&y, "a flag takes a value or a list, not a mapping", NULL);
				continue;
			}
			if (cfg_yaml_value(&y, colon + 1, eol, &v))
				return KVD_EINVAL;
			{
				static const char *const sub[] = {"cert-file", "key-file", "client-cert-auth", "trusted-ca-file",
				                                  "auto-tls"};
				size_t i, n = (size_t)(colon - p);
				for (i = 0; i < KVD_COUNT(sub) && !(strlen(sub[i]) == n && !memcmp(sub[i], p, n)); i++)
					;
				if (i == KVD_COUNT(sub)) {
					char bad[64];
					snprintf(bad, sizeof bad, "%.*s", (int)KVD_MIN(n, 63), p);
					return cfg_yaml_bad(&y, "unknown key in client-transport-security", bad);
				}
				if (cfg_yaml_set(cfg, &y, p, n, v))
					return KVD_EINVAL;
			}
			continue;
		}
		/* column 0 (or the end): the block before it, if any, ends here */
		if (key) {
			if (list && cfg_yaml_put(&y, 0))
				return KVD_EINVAL;
			if (!nested_tls && in_block != 2 && cfg_yaml_set(cfg, &y, key, kl, list))
				return KVD_EINVAL;
			key = NULL;
			list = NULL;
		}
		if (y.p >= y.end)
			break;
		colon = memchr(p, ':', (size_t)(eol - p));
		if (!colon || colon == p || (colon + 1 < eol && colon[1] != ' '))
			return cfg_yaml_bad(&y, "want \"key: value\"", NULL);
		for (v = p; v < colon; v++)
			if (!((*v >= 'a' && *v <= 'z') || (*v >= '0' && *v <= '9') || *v == '-'))
				return cfg_yaml_bad(&y, "a key is a flag name (a-z, 0-9, -)", NULL);
		for (v = colon + 1; v < eol && *v == ' '; v++)
			;
		if (v == eol || *v == '#') { /* "key:": a block may follow */
			key = p;
			kl = (size_t)(colon - p);
			in_block = 0;
			nested_tls = kl == 25 && !memcmp(p, "client-transport-security", 25);
			if (!nested_tls && cfg_yaml_set(cfg, &y, key, kl, NULL))
				return KVD_EINVAL; /* an unknown key fails on its own line */
			continue;
		}
		if (cfg_yaml_value(&y, colon + 1, eol, &v) || cfg_yaml_set(cfg, &y, p, (size_t)(colon - p), v))
			return KVD_EINVAL;
	}
	return 0;
}

/*
 * The memory-only half of kvd_open(): configuration, ids.  No file, socket
 * or pipe is touched, so tests and fuzzers build instances with it.
 */
KVD_RESIDENT static int kvd_init(const struct kvd_config *cfg, struct kvd **out, char *err, size_t errlen)
{
	struct kvd *k;

	*out = NULL;
	snprintf(err, errlen, "out of memory");
	if (!cfg->name || !cfg->name[0]) {
		snprintf(err, errlen, "--name must not be empty");
		return KVD_EINVAL;
	}
	if (!cfg->max_request_bytes || !cfg->max_concurrent_streams || !cfg->max_connections ||
	    !cfg->heartbeat_interval_ms ||
	    cfg->max_request_bytes > 0x7fffffffu - KVD_GRPC_RECV_SLACK) {
		snprintf(err, errlen, "limits must be at least 1 (and --max-request-bytes below 2 GiB)");
		return KVD_EINVAL;
	}
	if (cfg->heartbeat_interval_ms * 5ull > cfg->election_timeout_ms) {
		snprintf(err, errlen, "--election-timeout[%ums] should be at least as 5 times as --heartbeat-interval[%ums]",
		         (unsigned)cfg->election_timeout_ms, (unsigned)cfg->heartbeat_interval_ms);
		return KVD_EINVAL;
	}
	if (cfg->election_timeout_ms > 50000) {
		snprintf(err, errlen, "--election-timeout[%ums] is too long, and should be set less than 50000ms",
		         (unsigned)cfg->election_timeout_ms);
		return KVD_EINVAL;
	}
	if (cfg->bcrypt_cost < 4 || cfg->bcrypt_cost > 31) {
		snprintf(err, errlen, "--bcrypt-cost %u: want 4..31", (unsigned)cfg->bcrypt_cost);
		return KVD_EINVAL;
	}
	k = KVD_SYS_CALLOC(1, sizeof *k); /* big, mostly buffers: calloc leaves
	                                   * fresh pages untouched until used */
	if (!k)
		return KVD_ENOMEM;
	util_mbed_claim(k);
	k->pba.alloc = pb_alloc;
	k->pba.free = pb_release;
	k->st.start_wall = (int64_t)time(NULL);
	k->pba.allocator_data = k;
	k->next_timer = INT64_MAX;
	k->lock_fd = k->wake[0] = k->wake[1] = k->sd_fd = k->log_fd = k->syslog_fd = -1;
	k->now = util_now_ms();
	mvcc_crc_init(k->crc);
	k->cfg = *cfg; /* the strings are made kvd's own below */
	{ /* etcd: minTTL = ceil(((3 * electionTicks) / 2) * heartbeat), in seconds */
		int64_t ticks = cfg->election_timeout_ms / cfg->heartbeat_interval_ms;
		k->lease.min_ttl = ((3 * ticks / 2) * cfg->heartbeat_interval_ms + 999) / 1000;
	}
	k->cfg.watch_progress_notify_ms = KVD_MAX(cfg->watch_progress_notify_ms, 1u);
	k->cfg.confd_rate_limit = KVD_MAX(cfg->confd_rate_limit, 1u);
	k->cfg.confd_global_rate_limit = KVD_MAX(cfg->confd_global_rate_limit, 1u);
	k->cfg.confd_replay_cache = cfg->confd_replay_cache != 0;
	{ /* the request buffer holds at least one largest request (a gateway body: base64, twice as big) */
		uint64_t least = 2 * ((uint64_t)cfg->max_request_bytes + KVD_GRPC_RECV_SLACK) + 65536;
		k->cfg.max_request_buffer = KVD_MAX(cfg->max_request_buffer, least);
	}
	mvcc_init(&k->db);
	k->db.no_fsync = cfg->unsafe_no_fsync != 0;
	auth_init(k);
	*out = k;
	if (cfg_own(k, &k->cfg))
		return KVD_ENOMEM;
	if (!k->cfg.data_dir[0]) { /* etcd's default: <name>.etcd */
		size_t n = strlen(k->cfg.name) + 6;
		char *d = kvd_malloc(k, n);
		if (!d)
			return KVD_ENOMEM;
		snprintf(d, n, "%s.etcd", k->cfg.name);
		kvd_free(k, (void *)(uintptr_t)k->cfg.data_dir);
		k->cfg.data_dir = d;
	}
	if (cfg_split(k, k->cfg.advertise_client_urls, &k->client_urls, &k->nclient_urls) ||
	    cfg_split(k, k->cfg.initial_advertise_peer_urls, &k->peer_urls, &k->npeer_urls) || cfg_ids(k))
		return KVD_ENOMEM;
	return 0;
}

KVD_RESIDENT KVD_API int kvd_open(const struct kvd_config *cfg, struct kvd **out, char *err, size_t errlen)
{
	struct kvd *k;
	char *list = NULL, *p, *url;
	int r, tls = 0;
	unsigned i;

	if ((r = kvd_init(cfg, &k, err, errlen)))
		goto fail;
	if (pipe(k->wake) || net_nonblock(k->wake[0]) || net_nonblock(k->wake[1])) {
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		r = KVD_EIO;
		goto fail;
	}
	/* Every flag and every file it names is checked before the data dir is
	 * touched or a socket bound: a configuration error changes nothing on
	 * disk, and kvd_main tells it apart (exit 2) from a runtime failure. */
	r = util_log_open(k, err, errlen);
	if (!r)
		r = net_check_urls(k, &tls, err, errlen);
	if (!r)
		r = http1_check_flags(k, err, errlen);
	if (!r)
		r = tls_check_versions(&k->cfg, NULL, NULL, err, errlen);
	if (!r)
		r = cfg_check_gates(k->cfg.feature_gates, err, errlen);
#ifndef KVD_NO_TLS
	if (!r)
		r = tls_init(k, tls, err, errlen);
#endif
	if (!r)
		r = auth_open(k, err, errlen); /* jwt keys */
	if (!r)
		r = confd_open(k, err, errlen); /* the key, the addresses */
	if (!r)
		r = k->cfg.restore_snapshot && k->cfg.restore_snapshot[0] ?
		    snap_restore_check(k->cfg.restore_snapshot, err, errlen) : 0;
	if (!r)
		r = cfg_not_etcd(k->cfg.data_dir, err, errlen);
	if (r) {
		r = r == KVD_ENOMEM ? r : KVD_EINVAL;
		goto fail;
	}
	if ((r = cfg_mkdirs(k->cfg.data_dir, err, errlen)) || (r = cfg_lock(k, err, errlen)) ||
	    (k->cfg.restore_snapshot && k->cfg.restore_snapshot[0] && (r = snap_restore(k, err, errlen))) ||
	    (r = mvcc_open(k, err, errlen)) || (r = life_init(k, err, errlen)) || (r = confd_bind(k, err, errlen)))
		goto fail; /* confd first: "serving client requests" means everything serves */
	if (!(list = kvd_strdup(k, k->cfg.listen_client_urls))) {
		r = KVD_ENOMEM;
		goto fail;
	}
	for (url = strtok_r(list, ",", &p); url; url = strtok_r(NULL, ",", &p))
		if ((r = net_listen(k, url, 0, err, errlen)))
			goto fail;
	if (!k->nls) {
		snprintf(err, errlen, "--listen-client-urls names no URL");
		r = KVD_EINVAL;
		goto fail;
	}
	kvd_free(k, list);
	list = NULL;
	if (k->cfg.listen_metrics_urls && *k->cfg.listen_metrics_urls) {
		if (!(list = kvd_strdup(k, k->cfg.listen_metrics_urls))) {
			r = KVD_ENOMEM;
			goto fail;
		}
		for (url = strtok_r(list, ",", &p); url; url = strtok_r(NULL, ",", &p))
			if ((r = net_listen(k, url, 1, err, errlen)))
				goto fail;
	}
	for (i = 0; i < k->nls; i++) /* once every listener listens: "serving" means ready */
		kvd_log(k, KVD_LOG_INFO, "serving %s on %s (%s)", k->ls[i].metrics ? "/metrics and /health" : "client requests",
		        k->ls[i].name, k->ls[i].metrics ? (k->ls[i].tls ? "HTTPS" : "HTTP") : k->ls[i].tls ? "gRPC over TLS" : "gRPC over h2c");
	kvd_free(k, list);
	kvd_log(k, KVD_LOG_INFO, "kvd %s (etcd API %s) name=%s data-dir=%s member-id=%016llx cluster-id=%016llx%s",
	        KVD_VERSION, KVD_ETCD_VERSION, k->cfg.name, k->cfg.data_dir,
	        (unsigned long long)k->member_id, (unsigned long long)k->cluster_id,
	        k->db.no_fsync ? " (--unsafe-no-fsync: writes are acknowledged before they are durable)" : "");
	*out = k;
	return 0;
fail:
	if (k) {
		kvd_free(k, list);
		kvd_open_failed(k, err);
	}
	kvd_close(k);
	*out = NULL;
	return r;
}

KVD_API void kvd_reload(struct kvd *k)
{
	char b = 'H';

	if (write(k->wake[1], &b, 1) < 0)
		(void)0; /* pipe full: a reload is already pending */
}

KVD_API void kvd_shutdown(struct kvd *k)
{
	char b = 'T';

	if (write(k->wake[1], &b, 1) < 0)
		(void)0; /* pipe full: a shutdown is already pending */
}

KVD_API int kvd_poll(struct kvd *k, int timeout_ms)
{
	return loop_run(k, timeout_ms);
}

KVD_API void kvd_set_log(struct kvd *k, kvd_log_fn *fn, void *arg)
{
	k->log_fn = fn;
	k->log_arg = arg;
}

KVD_API void kvd_close(struct kvd *k)
{
	struct conn *c;
	unsigned i;

	if (!k)
		return;
	while ((c = k->conns)) {
		k->conns = c->next;
		close(c->fd);
		net_conn_free(k, c);
	}
	for (i = 0; i < k->nls; i++)
		net_close_listener(k, &k->ls[i]);
	if (k->db.fd >= 0)
		mvcc_flush(k); /* an embedder closing mid-batch: keep what was written */
	if (k->confd && k->confd->nfd) {
		char line[512];
		confd_report(k, line, sizeof line);
		kvd_log(k, KVD_LOG_INFO, "confd: %s", line);
	}
	confd_close(k);
#ifndef KVD_NO_TLS
	tls_fini(k);
#endif
	life_fini(k);
	mvcc_close(k);
	watch_fini(k);
	lease_fini(k);
	auth_free(k);
	share_fini(k);
	for (; k->nmembers; k->nmembers--)
		cfg_free_list(k, k->members[k->nmembers - 1].urls, k->members[k->nmembers - 1].n);
	kvd_free(k, k->members);
	kvd_free(k, k->held);
	kvd_free(k, k->ls);
	kvd_free(k, k->pfd);
	kvd_free(k, k->slot);
	cfg_free_list(k, k->client_urls, k->nclient_urls);
	cfg_free_list(k, k->peer_urls, k->npeer_urls);
	if (k->lock_fd >= 0)
		close(k->lock_fd);
	if (k->wake[0] >= 0)
		close(k->wake[0]);
	if (k->wake[1] >= 0)
		close(k->wake[1]);
	if (k->sd_fd >= 0)
		close(k->sd_fd);
	cfg_disown(k, &k->cfg);
	util_mbed_release(k);
	if (k->mem)
		kvd_log(k, KVD_LOG_WARN, "%zu bytes still allocated at close", k->mem);
	util_log_close(k);
	KVD_SYS_FREE(k);
}

/* The signal handlers' only state: the instance kvd_main runs. */
static struct kvd *main_kvd;

static void kvd_on_signal(int sig)
{
#ifdef KVD_TEST_SERVICES
	if (sig == SIGUSR2) { /* a power cut (section 10's test hooks): what was not fdatasynced is gone */
		if (main_kvd && main_kvd->db.synced_gen == main_kvd->db.gen && main_kvd->db.fd >= 0)
			while (ftruncate(main_kvd->db.fd, (off_t)main_kvd->db.synced) && errno == EINTR)
				;
		_exit(KVD_EXIT_RUNTIME);
	}
#endif
	if (main_kvd && sig == SIGHUP)
		kvd_reload(main_kvd);
	else if (main_kvd)
		kvd_shutdown(main_kvd);
}


/*
 * --daemon: the parent waits until the child says it serves (a byte on a
 * pipe), then exits 0; if the child ends first -- a failed start, its
 * reason already on stderr and in its log -- the parent exits with the
 * child's status, so an init script's start reports it.  Returns the pipe's
 * write end in the child (it leaves the session), or -1 with err.
 */
static int kvd_daemon(char *err, size_t errlen)
{
	int p[2], st = 0;
	pid_t pid;
	ssize_t n;
	char b;

	if (pipe(p)) {
		snprintf(err, errlen, "--daemon: pipe: %s", strerror(errno));
		return -1;
	}
	if ((pid = fork()) < 0) {
		snprintf(err, errlen, "--daemon: fork: %s", strerror(errno));
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid) {
		close(p[1]);
		while ((n = read(p[0], &b, 1)) < 0 && errno == EINTR)
			;
		if (n == 1)
			_exit(KVD_EXIT_OK);
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		_exit(WIFEXITED(st) ? WEXITSTATUS(st) : KVD_EXIT_RUNTIME);
	}
	close(p[0]);
	fcntl(p[1], F_SETFD, FD_CLOEXEC);
	setsid();
	return p[1];
}

/* Serving: the pid file written, and --daemon's parent told (its stdio
 * then /dev/null: log lines go to --log-outputs' files and syslog). */
static int kvd_serving(struct kvd *k, int ready, char *err, size_t errlen)
{
	char line[24];
	int fd, n = snprintf(line, sizeof line, "%ld\n", (long)getpid());

	if (k->cfg.pid_file && k->cfg.pid_file[0]) {
		fd = open(k->cfg.pid_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
		if (fd < 0 || write(fd, line, (size_t)n) != n || close(fd)) {
			snprintf(err, errlen, "--pid-file %s: %s", k->cfg.pid_file, strerror(errno));
			if (fd >= 0)
				close(fd);
			return KVD_EIO;
		}
	}
	if (ready >= 0) {
		if (!(k->log_to & ~(LOG_TO_STDERR | LOG_TO_STDOUT)) && !k->log_fn)
			kvd_log(k, KVD_LOG_WARN, "--daemon: --log-outputs has no file or syslog: later lines are lost");
		if ((fd = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0) {
			dup2(fd, 0);
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		(void)!write(ready, "R", 1);
		close(ready);
	}
	return 0;
}

KVD_RESIDENT KVD_API int kvd_main(int argc, char **argv)
{
	struct kvd_config cfg;
	char *yaml = NULL;
	sigset_t block, old_mask;
	struct kvd *k;
	struct sigaction sa;
	char err[KVD_ERRLEN];
	int r, ready = -1;

	kvd_config_init(&cfg);
	r = kvd_config_parse(&cfg, argc, argv, err, sizeof err);
	if (r == 1)
		return KVD_EXIT_OK;
	if (!r && cfg.config_file && cfg.config_file[0]) /* as etcd: the file, and nothing else */
		r = cfg_read_file(&cfg, &yaml, err, sizeof err);
	if (r) {
		fprintf(stderr, "kvd: %s\n", err);
		KVD_SYS_FREE(yaml);
		return KVD_EXIT_CONFIG;
	}
	if (cfg.snapshot_save && cfg.snapshot_save[0]) { /* a backup, then exit */
		if ((r = snap_save_offline(&cfg, err, sizeof err)))
			fprintf(stderr, "kvd: %s\n", err);
		KVD_SYS_FREE(yaml);
		return r ? KVD_EXIT_RUNTIME : KVD_EXIT_OK;
	}
	/* "serving" is logged inside kvd_open, before the handlers exist: a
	 * SIGTERM sent on seeing it must wait for them, not kill kvd outright */
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGHUP);
	sigprocmask(SIG_BLOCK, &block, &old_mask);
	if (cfg.daemon && (ready = kvd_daemon(err, sizeof err)) < 0) {
		fprintf(stderr, "kvd: %s\n", err);
		KVD_SYS_FREE(yaml);
		return KVD_EXIT_RUNTIME;
	}
	r = kvd_open(&cfg, &k, err, sizeof err);
	KVD_SYS_FREE(yaml); /* kvd_open copied every string */
	if (!r && (r = kvd_serving(k, ready, err, sizeof err))) {
		kvd_open_failed(k, err);
		kvd_close(k);
	}
	if (r) {
		sigprocmask(SIG_SETMASK, &old_mask, NULL);
		fprintf(stderr, "kvd: %s\n", err);
		return r == KVD_EINVAL ? KVD_EXIT_CONFIG : KVD_EXIT_RUNTIME;
	}
	if (yaml)
		kvd_log(k, KVD_LOG_INFO, "configuration from %s (other flags and ETCD_* variables are ignored, as etcd)",
		        cfg.config_file);
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
	sa.sa_handler = kvd_on_signal;
	sigemptyset(&sa.sa_mask);
	main_kvd = k;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
#ifdef KVD_TEST_SERVICES
	sigaction(SIGUSR2, &sa, NULL);
#endif
	sigprocmask(SIG_SETMASK, &old_mask, NULL); /* one that came meanwhile is handled now */
	loop_notify_open(k); /* systemd (Type=notify): ready now */
	{
		char st[160];
		snprintf(st, sizeof st, "READY=1\nSTATUS=serving %u listener(s) at revision %lld\nMAINPID=%ld", k->nls,
		         (long long)k->db.rev, (long)getpid());
		loop_notify(k, st);
	}
	while ((r = kvd_poll(k, -1)) == 0 || r == KVD_ENOMEM)
		;
	if (r == KVD_ESTOPPED)
		kvd_log(k, KVD_LOG_INFO, "stopped");
	else
		kvd_log(k, KVD_LOG_ERROR, "stopped on an error: %s", kvd_strerror(r));
	main_kvd = NULL;
	if (k->cfg.pid_file && k->cfg.pid_file[0])
		unlink(k->cfg.pid_file);
	kvd_close(k);
	return r == KVD_ESTOPPED ? KVD_EXIT_OK : KVD_EXIT_RUNTIME;
}

/* ===== 38. main() ======================================================== */

/*
 * The program: main() is kvd_main() (section 37) and nothing more, so an
 * embedder gets the same program from the public API; KVD_NO_MAIN leaves
 * it out when kvd.c is #included (the tests and fuzzers).
 *
 * Invariants:
 *   1. main only calls kvd_main: flags, signals and the loop are kvd_main's,
 *      through section 37's API (kvd_config_parse, kvd_open, kvd_poll,
 *      kvd_close), and so is the exit status (KVD_EXIT_OK, _RUNTIME,
 *      _CONFIG).
 */

#ifndef KVD_NO_MAIN
int main(int argc, char **argv)
{
	return kvd_main(argc, argv);
}
#endif
