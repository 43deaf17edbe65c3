/*
 * kvd.c - an etcd v3 (gRPC) key-value daemon in one C file, for routers and boards.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * Build:  make        or        cc -O2 kvd.c -lprotobuf-c -lmbedcrypto -o kvd
 * (the generated proto/ files are committed and #included below.)
 *
 * TABLE OF CONTENTS
 *    0. Build knobs (KVD_*)                 -- search for "@@" to find every knob
 *    1. Includes and portability
 *    2. Types, limits, shared declarations
 *    3. Utilities: allocation, log, bytes, clock, rate buckets
 *    4. Byte buffers (buf_)
 *    5. Protobuf glue (pb_)
 *    6. HPACK (hp_)
 *    7. HTTP/2 frames, streams, flow control (h2_)
 *    8. gRPC framing and routing (grpc_)
 *    9. Services: health, maintenance, cluster (svc_)
 *   10. Sockets and the poll loop (net_, loop_)
 *   11. Flags and configuration (cfg_)
 *   12. Public embedding API (kvd_)
 *   13. main()
 *
 * Prefixes mark the section a static function belongs to; only kvd_* (and the
 * generated protobuf-c symbols) are exported.  Functions return 0 or a
 * negative KVD_E* code unless their comment says otherwise.
 *
 * Data flow: socket -> h2 frames -> streams -> gRPC messages -> service.
 * A service never touches a socket: it queues output on its stream, and the
 * h2 layer sends it as the peer's flow-control windows allow.
 */

/* ===== 0. Build knobs (KVD_*) ============================================ */

#ifdef KVD_CONFIG_FILE
#include KVD_CONFIG_FILE /* @@ a firmware tree can pin knobs here */
#endif

#ifndef KVD_DEFAULT_MAX_CONNECTIONS /* @@ --max-connections default */
#define KVD_DEFAULT_MAX_CONNECTIONS 256
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
#ifndef KVD_MAX_CONN_INPUT /* @@ buffered request bytes per connection */
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
#ifndef KVD_ACCEPTS_PER_TICK /* @@ accept() calls per loop iteration */
#define KVD_ACCEPTS_PER_TICK 64
#endif
#ifndef KVD_ETCD_VERSION /* @@ etcd version kvd reports (the API level it follows) */
#define KVD_ETCD_VERSION "3.4.23"
#endif

/* ===== 1. Includes and portability ======================================= */

#ifndef _DEFAULT_SOURCE
#define _DEFAULT_SOURCE /* flock(), and POSIX.1-2008 */
#endif
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <mbedtls/sha1.h>
#include <mbedtls/version.h>
#include <protobuf-c/protobuf-c.h>

#include "kvd.h"

#if defined(__GNUC__)
#define KVD_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define KVD_UNUSED __attribute__((unused))
#else
#define KVD_PRINTF(a, b)
#define KVD_UNUSED
#endif

#ifdef NDEBUG
#define KVD_ALWAYS(x) (x)
#else
#include <assert.h>
#define KVD_ALWAYS(x) ((x) ? 1 : (assert(0 && #x), 0))
#endif

#define KVD_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVD_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KVD_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* ===== 2. Types, limits, shared declarations ============================= */

/* HTTP/2 error codes (RFC 9113 section 7). */
enum h2_error {
	H2_NO_ERROR, H2_PROTOCOL_ERROR, H2_INTERNAL_ERROR, H2_FLOW_CONTROL_ERROR,
	H2_SETTINGS_TIMEOUT, H2_STREAM_CLOSED, H2_FRAME_SIZE_ERROR,
	H2_REFUSED_STREAM, H2_CANCEL, H2_COMPRESSION_ERROR, H2_CONNECT_ERROR,
	H2_ENHANCE_YOUR_CALM, H2_INADEQUATE_SECURITY, H2_HTTP_1_1_REQUIRED
};

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

/* An owned, growable byte buffer; live bytes are p[rd..len). */
struct kvd_buf {
	uint8_t *p;
	size_t rd, len, cap;
};
#define BUF_DATA(b) ((b)->p + (b)->rd)
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

/* A gRPC method: how calls to one :path are served (section 8, 9). */
enum grpc_kind { GRPC_UNARY, GRPC_SERVER_STREAM, GRPC_BIDI };
struct grpc_method {
	const char *path;  /* "/etcdserverpb.KV/Range" */
	enum grpc_kind kind;
	/* one request message; NULL means "not implemented yet" */
	void (*on_msg)(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n);
	/* the client half-closed a streaming call (optional) */
	void (*on_half_close)(struct kvd *k, struct h2_stream *s);
	/* the stream goes away (finished or reset): free service state (optional) */
	void (*on_close)(struct kvd *k, struct h2_stream *s);
};

/* One HTTP/2 stream carrying one gRPC call. */
struct h2_stream {
	struct h2_conn *c;
	uint32_t id;
	unsigned remote_closed : 1; /* client sent END_STREAM */
	unsigned hdrs_sent : 1;     /* response HEADERS went out */
	unsigned finished : 1;      /* the service set a final status */
	unsigned discard : 1;       /* answer given: drop further request data */
	unsigned got_msg : 1;       /* a unary call has its request */
	unsigned want_grant : 1;    /* a message needs a window grant later */
	unsigned has_cl : 1;        /* content-length given */
	unsigned ctype_proto : 1;   /* answer with application/grpc+proto */
	unsigned bad_encoding : 1;  /* grpc-encoding kvd cannot decode */
	int64_t send_window;        /* what kvd may still send on this stream */
	int64_t recv_window;        /* what the client may still send */
	uint32_t recv_owed;         /* consumed, not yet credited back */
	uint64_t content_length, data_seen;
	int64_t deadline;           /* grpc-timeout, monotonic ms, 0 = none */
	int64_t stalled_since;      /* output blocked by a zero window since */
	struct kvd_buf in, out;     /* request bytes, response gRPC messages */
	const struct grpc_method *m;
	int status;                 /* final gRPC status once finished */
	int http_status;            /* 200 unless an early HTTP-level refusal */
	char *status_msg;           /* owned, may be NULL */
	struct hp_field *meta;      /* request metadata (regular fields), one block */
	unsigned nmeta;
	void *svc;                  /* service state of a streaming call */
};

/* One client connection. */
struct h2_conn {
	struct kvd *k;
	struct h2_conn *next;
	int fd;
	char peer[64];
	unsigned preface_done : 1;
	unsigned settings_seen : 1;  /* client SETTINGS arrived */
	unsigned is_closing : 1;     /* close once output is written */
	unsigned goaway_sent : 1;    /* final GOAWAY queued */
	unsigned draining : 1;       /* first (graceful) GOAWAY queued */
	unsigned need_tsu : 1;       /* emit a table size update before next block */
	unsigned sent_since_ping : 1;
	unsigned read_paused : 1;    /* stopped reading: output over cap */
	unsigned peer_closed : 1;    /* read() returned 0 */
	unsigned dead : 1;           /* socket error: close now */
	unsigned shut_wr : 1;        /* output done, lingering for the peer's close */
	struct kvd_buf in, out;
	struct hp_table dec;
	/* header block being assembled across CONTINUATION frames */
	uint8_t *hblk;
	size_t hblk_len;
	uint32_t hblk_sid;
	uint8_t hblk_flags;
	unsigned hblk_frames;
	/* streams */
	struct h2_stream **st;
	unsigned nst, stcap, rr;
	uint32_t last_sid;          /* highest client stream id seen */
	uint32_t reset_ring[32];    /* recently reset ids: their late frames are ignored */
	unsigned reset_pos;
	/* flow control */
	int64_t send_window;        /* connection window kvd may use */
	int64_t recv_window;        /* what the client may still send */
	uint32_t recv_owed;         /* received bytes not yet credited */
	size_t buffered;            /* request bytes held in stream buffers */
	/* peer settings */
	uint32_t peer_max_frame, peer_init_window;
	/* abuse accounting */
	struct bucket rst, glitch;
	unsigned ping_strikes;
	int64_t last_ping;
	/* times, monotonic ms */
	int64_t t_open, t_active, t_drain_ping, t_close;
};

/* A listening socket. */
struct net_listener {
	int fd;
	char name[80];
};

/* Internal copy of the configuration (strings owned). */
struct kvd_cfg {
	char *name, *data_dir, *listen, *advertise, *peer_urls, *token;
	uint32_t max_request, max_streams, max_conns, ping_min_ms, idle_ms,
	    stall_ms, drain_ms;
	int log_level;
};

/* Counters, reported by logs and tests. */
struct kvd_stats {
	uint64_t conns_accepted, conns_refused, goaway_sent, rst_sent, calls;
};

struct kvd {
	struct kvd_cfg cfg;
	int64_t now;                 /* monotonic ms, read once per iteration */
	int64_t next_timer;          /* earliest connection/stream timer */
	kvd_log_fn *log_fn;
	void *log_arg;
	/* memory accounting (section 3) */
	size_t mem, mem_peak;
	uint64_t nalloc, fail_at;    /* fail_at: test hook, fail allocation N */
	ProtobufCAllocator pba;
	/* network */
	struct net_listener *ls;
	unsigned nls;
	struct h2_conn *conns;
	unsigned nconns;
	struct pollfd *pfd;
	void **pobj;                 /* what each pollfd is: listener, then connections */
	size_t pcap;
	unsigned npoll_ls;
	unsigned stopping : 1;
	int64_t stop_deadline, accept_pause_until;
	uint8_t rbuf[65536];         /* socket reads land here; leftovers move to c->in */
	/* identity */
	uint64_t member_id, cluster_id;
	char **client_urls, **peer_urls;
	unsigned nclient_urls, npeer_urls;
	int lock_fd;
	int wake[2];                 /* self-pipe: kvd_shutdown() is async-signal-safe */
	/* the store's revision and sizes; with no KV store yet the revision is
	 * that of an empty etcd store (1) and nothing is on disk */
	int64_t revision;
	int64_t db_size, db_size_in_use;
	/* HPACK decode scratch, shared: one header block is decoded at a time */
	struct hp_field hf[KVD_MAX_HEADER_FIELDS];
	uint8_t harena[KVD_MAX_HEADER_LIST + HP_TABLE_SIZE + 64];
	struct kvd_stats st;
};

static void grpc_finish(struct kvd *k, struct h2_stream *s, int code, const char *fmt, ...) KVD_PRINTF(4, 5);

/* ===== 3. Utilities: allocation, log, bytes, clock, rate buckets ========= */

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

static void *kvd_malloc(struct kvd *k, size_t n)
{
	union mem_hdr *h;

	if (n > SIZE_MAX / 2)
		return NULL;
	k->nalloc++;
	if (k->fail_at && k->nalloc == k->fail_at)
		return NULL;
	h = KVD_SYS_MALLOC(sizeof *h + n);
	if (!h)
		return NULL;
	h->n = n;
	k->mem += n;
	if (k->mem > k->mem_peak)
		k->mem_peak = k->mem;
	return h + 1;
}

static void *kvd_calloc(struct kvd *k, size_t n)
{
	void *p = kvd_malloc(k, n);

	if (p)
		memset(p, 0, n);
	return p;
}

static void *kvd_realloc(struct kvd *k, void *p, size_t n)
{
	union mem_hdr *h, *nh;
	size_t old;

	if (!p)
		return kvd_malloc(k, n);
	if (n > SIZE_MAX / 2)
		return NULL;
	k->nalloc++;
	if (k->fail_at && k->nalloc == k->fail_at)
		return NULL;
	h = (union mem_hdr *)p - 1;
	old = h->n;
	nh = KVD_SYS_REALLOC(h, sizeof *nh + n);
	if (!nh)
		return NULL;
	nh->n = n;
	k->mem = k->mem - old + n;
	if (k->mem > k->mem_peak)
		k->mem_peak = k->mem;
	return nh + 1;
}

static void kvd_free(struct kvd *k, void *p)
{
	union mem_hdr *h;

	if (!p)
		return;
	h = (union mem_hdr *)p - 1;
	k->mem -= h->n;
	KVD_SYS_FREE(h);
}

static char *kvd_strdup(struct kvd *k, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = kvd_malloc(k, n);

	if (p)
		memcpy(p, s, n);
	return p;
}

/* Monotonic milliseconds: boards have no RTC, wall time may jump at boot. */
static int64_t util_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void kvd_log(struct kvd *k, int level, const char *fmt, ...) KVD_PRINTF(3, 4);
static void kvd_log(struct kvd *k, int level, const char *fmt, ...)
{
	static const char lv[] = "DIWE";
	char line[512];
	struct timespec ts;
	struct tm tm;
	time_t t;
	va_list ap;
	int n;

	if (level < k->cfg.log_level)
		return;
	clock_gettime(CLOCK_REALTIME, &ts); /* for humans only */
	t = ts.tv_sec;
	gmtime_r(&t, &tm);
	n = snprintf(line, sizeof line, "%04d-%02d-%02d %02d:%02d:%02d.%06ld %c | kvd: ",
	             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
	             tm.tm_min, tm.tm_sec, (long)(ts.tv_nsec / 1000),
	             lv[level < 0 ? 0 : level > 3 ? 3 : level]);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
	va_end(ap);
	if (k->log_fn)
		k->log_fn(k->log_arg, level, line);
	else
		fprintf(stderr, "%s\n", line);
}

/* Byte order by assembly: correct on any host, no endianness detection. */
static uint32_t get_be16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t get_be24(const uint8_t *p) { return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2]; }
static uint32_t get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint64_t get_be64(const uint8_t *p) { return (uint64_t)get_be32(p) << 32 | get_be32(p + 4); }
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

/* SHA-1 of one buffer (member ids are derived as etcd derives them). */
static void util_sha1(const void *p, size_t n, uint8_t out[20])
{
#if MBEDTLS_VERSION_MAJOR >= 3
	mbedtls_sha1(p, n, out);
#else
	mbedtls_sha1_ret(p, n, out);
#endif
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

/* ===== 4. Byte buffers (buf_) ============================================ */

/* Make room for n more bytes at the end; compacts before growing. */
static int buf_reserve(struct kvd *k, struct kvd_buf *b, size_t n)
{
	size_t live = BUF_LEN(b), cap;
	uint8_t *p;

	if (b->cap - b->len >= n)
		return 0;
	if (b->rd && b->cap - live >= n && live <= b->cap / 2) {
		memmove(b->p, b->p + b->rd, live);
		b->rd = 0;
		b->len = live;
		return 0;
	}
	if (n > SIZE_MAX / 4 - live)
		return KVD_ENOMEM;
	cap = b->cap ? b->cap : 256;
	while (cap - live < n)
		cap *= 2;
	if (b->rd) { /* compact into the new block */
		p = kvd_malloc(k, cap);
		if (!p)
			return KVD_ENOMEM;
		memcpy(p, b->p + b->rd, live);
		kvd_free(k, b->p);
	} else {
		p = kvd_realloc(k, b->p, cap);
		if (!p)
			return KVD_ENOMEM;
	}
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

static void buf_consume(struct kvd_buf *b, size_t n)
{
	b->rd += n;
	if (b->rd >= b->len)
		b->rd = b->len = 0;
}

static void buf_free(struct kvd *k, struct kvd_buf *b)
{
	kvd_free(k, b->p);
	memset(b, 0, sizeof *b);
}

/* Give memory back after a burst: an empty buffer above 'keep' is freed. */
static void buf_trim(struct kvd *k, struct kvd_buf *b, size_t keep)
{
	if (BUF_LEN(b) == 0 && b->cap > keep)
		buf_free(k, b);
}

/* ===== 5. Protobuf glue (pb_) ============================================ */

/* The generated code is part of this translation unit (the onelua pattern),
 * so `cc kvd.c` needs no extra sources. */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-prototypes"
#endif
#include "proto/kv.pb-c.c"
#include "proto/auth.pb-c.c"
#include "proto/rpc.pb-c.c"
#include "proto/v3lock.pb-c.c"
#include "proto/v3election.pb-c.c"
#include "proto/health.pb-c.c"
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

static void *pb_alloc(void *data, size_t n) { return kvd_malloc(data, n); }
static void pb_release(void *data, void *p) { kvd_free(data, p); }

/* Unpack a request; NULL on malformed input or no memory. */
static ProtobufCMessage *pb_unpack(struct kvd *k, const ProtobufCMessageDescriptor *d,
                                   const uint8_t *p, size_t n)
{
	return protobuf_c_message_unpack(d, &k->pba, n, p);
}

static void pb_free(struct kvd *k, void *m)
{
	if (m)
		protobuf_c_message_free_unpacked(m, &k->pba);
}

/* ===== 6. HPACK (hp_) ==================================================== */

/*
 * RFC 7541.  The decoder is complete (static and dynamic tables, Huffman,
 * size updates) and bounded: the decoded list is cut at KVD_MAX_HEADER_LIST
 * bytes and KVD_MAX_HEADER_FIELDS fields, yet the whole block is still
 * processed so the dynamic table stays in sync with the peer's encoder.
 * The encoder only uses static indexes and literals without indexing, so kvd
 * keeps no encoder table.
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
static int hp_put_int(struct kvd *k, struct kvd_buf *b, uint8_t flags, unsigned prefix, uint32_t v)
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
	return buf_append(k, b, tmp, n);
}

/* "Literal without indexing" with a static name index (4-bit prefix) or a
 * new name (index 0); strings raw, never Huffman. */
static int hp_put_field(struct kvd *k, struct kvd_buf *b, unsigned index, const char *name,
                        const char *value, size_t vlen)
{
	int r = hp_put_int(k, b, 0x00, 4, index);

	if (!index && !r) {
		size_t nlen = strlen(name);
		r = hp_put_int(k, b, 0x00, 7, (uint32_t)nlen);
		r = r ? r : buf_append(k, b, name, nlen);
	}
	r = r ? r : hp_put_int(k, b, 0x00, 7, (uint32_t)vlen);
	return r ? r : buf_append(k, b, value, vlen);
}

/* :status (index 8 is "200"). */
static int hp_put_status(struct kvd *k, struct kvd_buf *b, int status)
{
	char s[8];

	if (status == 200)
		return buf_append(k, b, "\x88", 1);
	snprintf(s, sizeof s, "%03d", status % 1000);
	return hp_put_field(k, b, 8, NULL, s, 3);
}

/* ===== 7. HTTP/2 frames, streams, flow control (h2_) ===================== */

/*
 * RFC 9113, server side, cleartext with prior knowledge.  Input is parsed
 * from c->in one whole frame at a time (a frame is at most 16 KiB + 9);
 * output is appended to c->out, which the loop writes.  Response DATA is
 * pulled from each stream's queue only as far as the peer's windows and
 * KVD_MAX_OUTPUT allow, so a slow or hostile reader pins bounded memory.
 *
 * Connection errors queue GOAWAY and mark the connection closing (h2_fail);
 * stream errors queue RST_STREAM (h2_stream_error).  Both count as glitches
 * when the peer caused them; too many glitches end the connection.
 */

/* The request line of a stream, from its header block (borrowed slices). */
struct h2_req {
	struct kvd_slice method, scheme, path, authority, ctype, timeout, encoding;
	uint64_t content_length;
	unsigned has_cl : 1;
};

static void grpc_on_headers(struct kvd *k, struct h2_stream *s, const struct h2_req *rq);
static void grpc_on_data(struct kvd *k, struct h2_stream *s);
static void grpc_on_remote_close(struct kvd *k, struct h2_stream *s);
static void loop_arm(struct kvd *k, int64_t when);

static int h2_frame(struct h2_conn *c, unsigned type, unsigned flags, uint32_t sid,
                    const void *payload, size_t len)
{
	uint8_t h[H2_FRAME_HDR];

	put_be24(h, (uint32_t)len);
	h[3] = (uint8_t)type;
	h[4] = (uint8_t)flags;
	put_be32(h + 5, sid);
	if (buf_reserve(c->k, &c->out, sizeof h + len))
		return KVD_ENOMEM;
	buf_append(c->k, &c->out, h, sizeof h);
	buf_append(c->k, &c->out, payload, len);
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

	if (c->goaway_sent && c->is_closing)
		return;
	if (n > 64)
		n = 64;
	put_be32(p, c->last_sid);
	put_be32(p + 4, code);
	memcpy(p + 8, why, n);
	h2_frame(c, H2_GOAWAY, 0, 0, p, 8 + n);
	c->goaway_sent = c->is_closing = 1;
	c->k->st.goaway_sent++;
	if (code != H2_NO_ERROR)
		kvd_log(c->k, KVD_LOG_INFO, "%s: closing connection: %s (h2 error %d)", c->peer, why, code);
}

/* A protocol slip by the peer; ENHANCE_YOUR_CALM when they come too fast. */
static void h2_glitch(struct h2_conn *c)
{
	if (!bucket_take(&c->glitch, c->k->now, KVD_GLITCH_RATE, KVD_GLITCH_RATE * 10))
		h2_fail(c, H2_ENHANCE_YOUR_CALM, "too_many_glitches");
}

static int h2_recently_reset(struct h2_conn *c, uint32_t sid)
{
	unsigned i;

	for (i = 0; i < KVD_COUNT(c->reset_ring); i++)
		if (c->reset_ring[i] == sid)
			return 1;
	return 0;
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
	struct h2_stream *s, **st;

	if (c->nst == c->stcap) {
		unsigned cap = c->stcap ? c->stcap * 2 : 8;
		st = kvd_realloc(k, c->st, cap * sizeof *st);
		if (!st)
			return NULL;
		c->st = st;
		c->stcap = cap;
	}
	s = kvd_calloc(k, sizeof *s);
	if (!s)
		return NULL;
	s->c = c;
	s->id = sid;
	s->send_window = c->peer_init_window;
	s->recv_window = KVD_STREAM_WINDOW;
	s->http_status = 200;
	c->st[c->nst++] = s;
	return s;
}

static void h2_credit(struct h2_conn *c);

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
	if (s->m && s->m->on_close)
		s->m->on_close(k, s);
	c->reset_ring[c->reset_pos++ % KVD_COUNT(c->reset_ring)] = s->id;
	c->buffered -= BUF_LEN(&s->in);
	buf_free(k, &s->in);
	buf_free(k, &s->out);
	kvd_free(k, s->meta);
	kvd_free(k, s->status_msg);
	kvd_free(k, s);
	if (!c->nst) {
		c->t_active = k->now;
		if (k->cfg.idle_ms)
			loop_arm(k, k->now + k->cfg.idle_ms);
		if (c->goaway_sent)
			c->is_closing = 1;
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

	h2_frame_u32(c, H2_RST_STREAM, sid, code);
	c->k->st.rst_sent++;
	if (s)
		h2_stream_close(c, s);
	else
		c->reset_ring[c->reset_pos++ % KVD_COUNT(c->reset_ring)] = sid;
	h2_glitch(c);
}

/*
 * Connection credit: returned as soon as data lands in a stream buffer (so
 * one slow stream cannot stall the others), in batches of half the window,
 * and held back while the connection buffers more than KVD_MAX_CONN_INPUT.
 */
static void h2_credit(struct h2_conn *c)
{
	if (c->recv_owed && c->buffered <= KVD_MAX_CONN_INPUT &&
	    c->recv_window <= KVD_CONN_WINDOW / 2) {
		h2_frame_u32(c, H2_WINDOW_UPDATE, 0, c->recv_owed);
		c->recv_window += c->recv_owed;
		c->recv_owed = 0;
	}
}

/*
 * The gRPC layer consumed n request bytes of s.  The stream window is topped
 * back up to its initial size (bigger messages get a grant of their own, see
 * h2_grant), once a quarter of it is used.
 */
static void h2_consumed(struct h2_stream *s, size_t n)
{
	struct h2_conn *c = s->c;
	int64_t deficit;
	unsigned i;

	c->buffered -= n;
	if (!s->remote_closed) {
		deficit = KVD_STREAM_WINDOW - s->recv_window;
		if (deficit >= KVD_STREAM_WINDOW / 4) {
			h2_frame_u32(c, H2_WINDOW_UPDATE, s->id, (uint32_t)deficit);
			s->recv_window += deficit;
		}
	}
	for (i = 0; i < c->nst; i++) /* room again for deferred grants */
		if (c->st[i]->want_grant && c->st[i] != s) {
			c->st[i]->want_grant = 0;
			grpc_on_data(c->k, c->st[i]);
		}
	h2_credit(c);
}

/*
 * A message of 'need' more bytes is announced (gRPC prefix): open the
 * stream window for all of it at once, as grpc-go does, unless the
 * connection already buffers too much; then wait for consumption.
 */
static void h2_grant(struct h2_stream *s, size_t need)
{
	struct h2_conn *c = s->c;
	int64_t grant = (int64_t)need - s->recv_window;

	if (grant <= 0 || s->remote_closed)
		return;
	if (c->buffered + need > KVD_MAX_CONN_INPUT) {
		s->want_grant = 1;
		return;
	}
	h2_frame_u32(c, H2_WINDOW_UPDATE, s->id, (uint32_t)grant);
	s->recv_window += grant;
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
			return -1;
		if (f->name[0] == ':') {
			if (regular)
				return -1;
			ps = h2_is(f, ":method") ? &rq->method : h2_is(f, ":scheme") ? &rq->scheme :
			     h2_is(f, ":path") ? &rq->path : h2_is(f, ":authority") ? &rq->authority : NULL;
			if (!ps || ps->p)
				return -1;
			ps->p = (const uint8_t *)f->value;
			ps->n = f->vlen;
			if (!ps->p)
				ps->p = (const uint8_t *)"";
			continue;
		}
		regular = 1;
		if (h2_forbidden(f))
			return -1;
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
				return -1;
			rq->has_cl = 1;
			for (j = 0; j < f->vlen; j++) {
				if (f->value[j] < '0' || f->value[j] > '9')
					return -1;
				rq->content_length = rq->content_length * 10 + (uint64_t)(f->value[j] - '0');
			}
		}
	}
	if (!rq->method.n || !rq->scheme.n || !rq->path.n)
		return -1;
	return 0;
}

/* Keep the regular (metadata) fields for the service, in one allocation. */
static int h2_keep_meta(struct kvd *k, struct h2_stream *s, const struct hp_field *f, unsigned nf)
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
	grpc_on_remote_close(k, s);
}

/* A complete header block for stream sid. */
static void h2_on_block(struct kvd *k, struct h2_conn *c, uint32_t sid, unsigned flags,
                        int self_dep, const uint8_t *p, size_t n)
{
	struct hp_out o;
	struct h2_stream *s;
	struct h2_req rq;
	int r;

	memset(&o, 0, sizeof o);
	o.f = k->hf;
	o.maxf = KVD_MAX_HEADER_FIELDS;
	o.a = k->harena;
	o.acap = sizeof k->harena;
	o.maxlist = KVD_MAX_HEADER_LIST;
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
		if (!h2_recently_reset(c, sid))
			h2_fail(c, H2_PROTOCOL_ERROR, "stream id not increasing");
		return;
	}
	c->last_sid = sid;
	if (c->goaway_sent) /* past our final GOAWAY: ignored (6.8) */
		return;
	if (self_dep) {
		h2_stream_error(c, sid, H2_PROTOCOL_ERROR);
		return;
	}
	if (c->nst >= k->cfg.max_streams) {
		h2_stream_error(c, sid, H2_REFUSED_STREAM);
		return;
	}
	if (!o.over && h2_parse_request(o.f, o.nf, &rq)) {
		h2_stream_error(c, sid, H2_PROTOCOL_ERROR);
		return;
	}
	if (!(s = h2_stream_new(c, sid))) {
		h2_frame_u32(c, H2_RST_STREAM, sid, H2_REFUSED_STREAM);
		return;
	}
	k->st.calls++;
	if (flags & H2_F_END_STREAM)
		s->remote_closed = 1;
	if (o.over) { /* answered, not served: the list broke kvd's caps */
		h2_glitch(c);
		grpc_finish(k, s, GRPC_RESOURCE_EXHAUSTED,
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
	if (h2_keep_meta(k, s, o.f, o.nf)) {
		grpc_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		s->discard = 1;
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
		else if (!h2_recently_reset(c, sid))
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
	if (s->discard || buf_append(k, &s->in, p, n)) {
		if (!s->discard) {
			grpc_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
			s->discard = 1;
		}
	} else {
		c->buffered += n;
		grpc_on_data(k, s);
	}
	if (flags & H2_F_END_STREAM)
		grpc_on_remote_close(k, s);
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
	/* Rapid Reset (CVE-2023-44487): the stream limit never bites, the rate does */
	if (!bucket_take(&c->rst, c->k->now, KVD_RST_RATE, KVD_RST_RATE * 2)) {
		h2_fail(c, H2_ENHANCE_YOUR_CALM, "too_many_resets");
		return;
	}
	if ((s = h2_stream_find(c, sid)))
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
		case 1: /* HEADER_TABLE_SIZE: sizes the peer's decoder, i.e. our encoder */
			if (v < HP_TABLE_SIZE)
				c->need_tsu = 1; /* we never index: announce size 0 once */
			break;
		case 2: /* ENABLE_PUSH */
			if (v > 1) {
				h2_fail(c, H2_PROTOCOL_ERROR, "bad ENABLE_PUSH");
				return;
			}
			break;
		case 4: /* INITIAL_WINDOW_SIZE: a delta on every open stream (6.9.2) */
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
		case 5: /* MAX_FRAME_SIZE */
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
		c->is_closing = 1;
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
		min = c->nst ? (int64_t)k->cfg.ping_min_ms : 2 * 3600 * 1000;
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

	put_be16(p + n, 3); /* MAX_CONCURRENT_STREAMS */
	put_be32(p + n + 2, k->cfg.max_streams);
	n += 6;
	put_be16(p + n, 6); /* MAX_HEADER_LIST_SIZE */
	put_be32(p + n + 2, KVD_MAX_HEADER_LIST);
	n += 6;
	if (KVD_STREAM_WINDOW != H2_DEFAULT_WINDOW) {
		put_be16(p + n, 4);
		put_be32(p + n + 2, KVD_STREAM_WINDOW);
		n += 6;
	}
	h2_frame(c, H2_SETTINGS, 0, 0, p, n);
	if (KVD_CONN_WINDOW > H2_DEFAULT_WINDOW) {
		h2_frame_u32(c, H2_WINDOW_UPDATE, 0, KVD_CONN_WINDOW - H2_DEFAULT_WINDOW);
		c->recv_window = KVD_CONN_WINDOW;
	}
}

/* Not HTTP/2: answer an HTTP/1.x request with a plain explanation. */
static void h2_not_h2(struct h2_conn *c)
{
	static const char body[] =
	    "kvd speaks gRPC over HTTP/2 (h2c with prior knowledge); use an etcd v3 client.\n";
	char hdr[160];
	const uint8_t *p = BUF_DATA(&c->in);
	size_t i, n = BUF_LEN(&c->in);

	for (i = 0; i < n && p[i] >= 'A' && p[i] <= 'Z'; i++)
		;
	if (i && i < n && p[i] == ' ') {
		snprintf(hdr, sizeof hdr, "HTTP/1.1 505 HTTP Version Not Supported\r\n"
		         "Content-Type: text/plain\r\nConnection: close\r\nContent-Length: %u\r\n\r\n",
		         (unsigned)(sizeof body - 1));
		buf_append(c->k, &c->out, hdr, strlen(hdr));
		buf_append(c->k, &c->out, body, sizeof body - 1);
	}
	c->is_closing = c->goaway_sent = 1;
}

/*
 * Parse and handle every complete frame in c->in.  Stops early when the
 * output is over its cap (resumed once it drains) or the connection fails.
 */
static void h2_input(struct kvd *k, struct h2_conn *c)
{
	const uint8_t *p;
	size_t n, len;
	unsigned type, flags;
	uint32_t sid;

	while (!c->is_closing && BUF_LEN(&c->out) < KVD_MAX_OUTPUT) {
		p = BUF_DATA(&c->in);
		n = BUF_LEN(&c->in);
		if (!n)
			break;
		if (!c->preface_done) {
			if (memcmp(p, H2_PREFACE, KVD_MIN(n, (size_t)H2_PREFACE_LEN))) {
				h2_not_h2(c);
				return;
			}
			if (n < H2_PREFACE_LEN)
				break;
			buf_consume(&c->in, H2_PREFACE_LEN);
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
		c->t_active = k->now;
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
		buf_consume(&c->in, H2_FRAME_HDR + len);
	}
	if (!c->nst && k->cfg.idle_ms)
		loop_arm(k, c->t_active + (int64_t)k->cfg.idle_ms);
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

/* Response HEADERS (and, for Trailers-Only, the status fields). */
static int h2_send_headers(struct h2_conn *c, struct h2_stream *s, int with_status, int end)
{
	struct kvd *k = c->k;
	struct kvd_buf b = {0};
	char code[8], msg[1024];
	int r = 0;

	if (c->need_tsu) {
		r = buf_append(k, &b, "\x20", 1);
		c->need_tsu = 0;
	}
	if (!s->hdrs_sent) {
		r = r ? r : hp_put_status(k, &b, s->http_status);
		r = r ? r : (s->ctype_proto ? hp_put_field(k, &b, 31, NULL, "application/grpc+proto", 22)
		                            : hp_put_field(k, &b, 31, NULL, "application/grpc", 16));
	}
	if (with_status) {
		snprintf(code, sizeof code, "%d", s->status);
		r = r ? r : hp_put_field(k, &b, 0, "grpc-status", code, strlen(code));
		h2_pct_encode(s->status_msg ? s->status_msg : "", msg, sizeof msg);
		r = r ? r : hp_put_field(k, &b, 0, "grpc-message", msg, strlen(msg));
	}
	r = r ? r : h2_frame(c, H2_HEADERS, H2_F_END_HEADERS | (end ? H2_F_END_STREAM : 0), s->id,
	                     BUF_DATA(&b), BUF_LEN(&b));
	buf_free(k, &b);
	s->hdrs_sent = 1;
	c->sent_since_ping = 1;
	return r;
}

/*
 * Move what stream s may send into c->out: response HEADERS, DATA within
 * min(connection window, stream window, peer frame size), then trailers.
 * Returns 1 when the stream ended and was freed.
 */
static int h2_stream_send(struct kvd *k, struct h2_conn *c, struct h2_stream *s)
{
	size_t n;
	int64_t room;

	if (!s->hdrs_sent) {
		if (s->finished && !BUF_LEN(&s->out)) { /* Trailers-Only */
			if (h2_send_headers(c, s, 1, 1))
				return 0;
			goto ended;
		}
		if (!BUF_LEN(&s->out) || h2_send_headers(c, s, 0, 0))
			return 0;
	}
	while (BUF_LEN(&s->out) && BUF_LEN(&c->out) < KVD_MAX_OUTPUT) {
		room = KVD_MIN(c->send_window, s->send_window);
		if (room <= 0) {
			if (!s->stalled_since) {
				s->stalled_since = k->now ? k->now : 1;
				if (k->cfg.stall_ms)
					loop_arm(k, k->now + k->cfg.stall_ms);
			}
			return 0;
		}
		n = KVD_MIN(BUF_LEN(&s->out), (size_t)KVD_MIN(room, (int64_t)c->peer_max_frame));
		if (h2_frame(c, H2_DATA, 0, s->id, BUF_DATA(&s->out), n))
			return 0;
		buf_consume(&s->out, n);
		c->send_window -= (int64_t)n;
		s->send_window -= (int64_t)n;
		c->sent_since_ping = 1;
	}
	s->stalled_since = 0;
	if (BUF_LEN(&s->out))
		return 0;
	buf_trim(k, &s->out, 16384);
	if (!s->finished || h2_send_headers(c, s, 1, 1))
		return 0;
ended:
	if (!s->remote_closed) /* early server closure (gRPC over HTTP/2) */
		h2_frame_u32(c, H2_RST_STREAM, s->id, H2_NO_ERROR);
	h2_stream_close(c, s);
	return 1;
}

/* Send what every stream can; round-robin start for fairness. */
static void h2_flush(struct kvd *k, struct h2_conn *c)
{
	unsigned i, start, n;

	if (c->is_closing)
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

/* Per-connection timers; returns the next time this connection needs a look. */
static int64_t h2_timers(struct kvd *k, struct h2_conn *c)
{
	int64_t next = INT64_MAX, now = k->now;
	unsigned i;

	if (!c->settings_seen) {
		if (now - c->t_open >= KVD_PREFACE_TIMEOUT_MS) {
			c->is_closing = c->goaway_sent = 1; /* never spoke HTTP/2 */
			return next;
		}
		next = c->t_open + KVD_PREFACE_TIMEOUT_MS;
	}
	if (c->draining && !c->goaway_sent) {
		if (now - c->t_drain_ping >= 1000)
			h2_goaway_final(c); /* no PING ACK: go on without it */
		else
			next = KVD_MIN(next, c->t_drain_ping + 1000);
	}
	if (!c->nst && k->cfg.idle_ms && c->settings_seen && !c->is_closing) {
		if (now - c->t_active >= (int64_t)k->cfg.idle_ms)
			h2_fail(c, H2_NO_ERROR, "max_idle");
		else
			next = KVD_MIN(next, c->t_active + (int64_t)k->cfg.idle_ms);
	}
	for (i = 0; i < c->nst; i++) {
		struct h2_stream *s = c->st[i];
		if (s->deadline && !s->finished) {
			if (now >= s->deadline)
				grpc_finish(k, s, GRPC_DEADLINE_EXCEEDED, "context deadline exceeded");
			else
				next = KVD_MIN(next, s->deadline);
		}
		if (s->stalled_since && k->cfg.stall_ms) {
			if (now - s->stalled_since >= (int64_t)k->cfg.stall_ms) {
				kvd_log(k, KVD_LOG_INFO, "%s: stream %u stalled on a zero window, reset",
				        c->peer, s->id);
				h2_frame_u32(c, H2_RST_STREAM, s->id, H2_CANCEL);
				h2_stream_close(c, s);
				i--;
				continue;
			}
			next = KVD_MIN(next, s->stalled_since + (int64_t)k->cfg.stall_ms);
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
		c->is_closing = c->goaway_sent = 1;
		return;
	}
	c->draining = 1;
	put_be32(p, 0x7fffffff);
	put_be32(p + 4, H2_NO_ERROR);
	h2_frame(c, H2_GOAWAY, 0, 0, p, 8);
	h2_frame(c, H2_PING, 0, 0, h2_stop_ping, 8);
	c->t_drain_ping = k->now;
	loop_arm(k, k->now + 1000);
}

static struct h2_conn *h2_conn_new(struct kvd *k, int fd)
{
	struct h2_conn *c = kvd_calloc(k, sizeof *c);

	if (!c)
		return NULL;
	c->k = k;
	c->fd = fd;
	hp_table_init(&c->dec);
	c->send_window = H2_DEFAULT_WINDOW;
	c->recv_window = H2_DEFAULT_WINDOW;
	c->peer_max_frame = H2_DEFAULT_FRAME;
	c->peer_init_window = H2_DEFAULT_WINDOW;
	bucket_init(&c->rst, KVD_RST_RATE * 2, k->now);
	bucket_init(&c->glitch, KVD_GLITCH_RATE * 10, k->now);
	c->t_open = c->t_active = k->now;
	loop_arm(k, k->now + KVD_PREFACE_TIMEOUT_MS);
	return c;
}

static void h2_conn_free(struct kvd *k, struct h2_conn *c)
{
	while (c->nst)
		h2_stream_close(c, c->st[c->nst - 1]);
	kvd_free(k, c->st);
	kvd_free(k, c->hblk);
	hp_table_free(k, &c->dec);
	buf_free(k, &c->in);
	buf_free(k, &c->out);
	kvd_free(k, c);
}

/* ===== 8. gRPC framing and routing (grpc_) =============================== */

/*
 * gRPC over HTTP/2 (grpc doc/PROTOCOL-HTTP2.md): each message is a 1-byte
 * compressed flag, a 4-byte big-endian length, then the protobuf bytes;
 * messages may span DATA frames or share one.  Status goes in trailers;
 * early errors use Trailers-Only.  Texts follow grpc-go (etcd's server) so
 * clients that match errors by text keep working.
 */

static const struct grpc_method *svc_route(const char *svc, size_t slen, const char *meth,
                                           size_t mlen, int *known_service);

/* The receive cap: etcd's --max-request-bytes plus grpc's slack. */
static uint32_t grpc_max_recv(struct kvd *k)
{
	return k->cfg.max_request + KVD_GRPC_RECV_SLACK;
}

/* Final status for s.  The message is copied; later calls are ignored.  Any
 * request bytes still buffered are dropped. */
static void grpc_finish(struct kvd *k, struct h2_stream *s, int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (s->finished)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	s->status = code;
	s->status_msg = msg[0] ? kvd_strdup(k, msg) : NULL;
	s->finished = s->discard = 1;
	if (BUF_LEN(&s->in)) {
		size_t n = BUF_LEN(&s->in);
		buf_free(k, &s->in);
		h2_consumed(s, n);
	}
}

/* Queue one response message.  On failure the call ends RESOURCE_EXHAUSTED. */
static int grpc_send(struct kvd *k, struct h2_stream *s, const ProtobufCMessage *m)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	uint8_t *p;

	if (s->finished)
		return KVD_EINVAL;
	if (n > 0xffffffffu || buf_reserve(k, &s->out, 5 + n)) {
		grpc_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return KVD_ENOMEM;
	}
	p = s->out.p + s->out.len;
	p[0] = 0;
	put_be32(p + 1, (uint32_t)n);
	protobuf_c_message_pack(m, p + 5);
	s->out.len += 5 + n;
	return 0;
}

/* A unary answer: one message, then status OK. */
static void grpc_reply(struct kvd *k, struct h2_stream *s, const ProtobufCMessage *m)
{
	if (!grpc_send(k, s, m))
		grpc_finish(k, s, GRPC_OK, "%s", "");
}

/* Request metadata by (lowercase) name, NUL-terminated; NULL if absent. */
static KVD_UNUSED const char *grpc_meta(const struct h2_stream *s, const char *name)
{
	unsigned i;

	for (i = 0; i < s->nmeta; i++)
		if (!strcmp(s->meta[i].name, name))
			return s->meta[i].value;
	return NULL;
}

/* Unpack the request or end the call as grpc-go does for bad protobuf. */
static ProtobufCMessage *grpc_unpack(struct kvd *k, struct h2_stream *s,
                                     const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n)
{
	ProtobufCMessage *m = pb_unpack(k, d, p, n);

	if (!m)
		grpc_finish(k, s, GRPC_INTERNAL, "grpc: error unmarshalling request: %s",
		            "malformed protobuf or out of memory");
	return m;
}

static int grpc_slice_is(struct kvd_slice v, const char *s)
{
	size_t n = strlen(s);

	return v.n == n && !memcmp(v.p, s, n);
}

/* grpc-timeout: 1-8 digits and a unit (H M S m u n); rounds up to ms. */
static int grpc_parse_timeout(struct kvd_slice v, int64_t *ms)
{
	uint64_t n = 0;
	size_t i;

	if (v.n < 2 || v.n > 9)
		return -1;
	for (i = 0; i + 1 < v.n; i++) {
		if (v.p[i] < '0' || v.p[i] > '9')
			return -1;
		n = n * 10 + (uint64_t)(v.p[i] - '0');
	}
	switch (v.p[v.n - 1]) {
	case 'H': *ms = (int64_t)n * 3600000; break;
	case 'M': *ms = (int64_t)n * 60000; break;
	case 'S': *ms = (int64_t)n * 1000; break;
	case 'm': *ms = (int64_t)n; break;
	case 'u': *ms = (int64_t)((n + 999) / 1000); break;
	case 'n': *ms = (int64_t)((n + 999999) / 1000000); break;
	default: return -1;
	}
	return 0;
}

/* A new call: check method, content-type and timeout, then route :path. */
static void grpc_on_headers(struct kvd *k, struct h2_stream *s, const struct h2_req *rq)
{
	const char *path = (const char *)rq->path.p, *svc, *slash;
	size_t plen = rq->path.n;
	int64_t ms;
	int known;
	size_t i;

	if (!grpc_slice_is(rq->method, "POST")) {
		s->http_status = 405;
		grpc_finish(k, s, GRPC_INTERNAL, "invalid gRPC request method \"%.*s\"",
		            (int)KVD_MIN(rq->method.n, 64), (const char *)rq->method.p);
		return;
	}
	if (!(rq->ctype.n >= 16 && !memcmp(rq->ctype.p, "application/grpc", 16) &&
	      (rq->ctype.n == 16 || rq->ctype.p[16] == '+' || rq->ctype.p[16] == ';'))) {
		s->http_status = 415;
		grpc_finish(k, s, GRPC_INVALID_ARGUMENT, "invalid gRPC request content-type \"%.*s\"",
		            (int)KVD_MIN(rq->ctype.n, 64), (const char *)rq->ctype.p);
		return;
	}
	s->ctype_proto = grpc_slice_is(rq->ctype, "application/grpc+proto");
	if (rq->timeout.n) {
		if (grpc_parse_timeout(rq->timeout, &ms)) {
			grpc_finish(k, s, GRPC_INTERNAL, "transport: malformed grpc-timeout");
			return;
		}
		s->deadline = k->now + (ms ? ms : 1);
		loop_arm(k, s->deadline);
	}
	if (rq->encoding.n && !grpc_slice_is(rq->encoding, "identity"))
		s->bad_encoding = 1;
	/* route as grpc-go: strip one leading '/', split at the last '/' */
	if (plen && path[0] == '/') {
		path++;
		plen--;
	}
	slash = NULL;
	for (i = plen; i > 0; i--)
		if (path[i - 1] == '/') {
			slash = path + i - 1;
			break;
		}
	if (!slash) {
		grpc_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "malformed method name: \"%.*s\"",
		            (int)KVD_MIN(rq->path.n, 200), (const char *)rq->path.p);
		return;
	}
	svc = path;
	s->m = svc_route(svc, (size_t)(slash - svc), slash + 1, plen - (size_t)(slash - svc) - 1, &known);
	if (!s->m) {
		if (known)
			grpc_finish(k, s, GRPC_UNIMPLEMENTED, "unknown method %.*s for service %.*s",
			            (int)KVD_MIN(plen - (size_t)(slash - svc) - 1, 200), slash + 1,
			            (int)(slash - svc), svc);
		else
			grpc_finish(k, s, GRPC_UNIMPLEMENTED, "unknown service %.*s",
			            (int)KVD_MIN((size_t)(slash - svc), 200), svc);
		return;
	}
	if (!s->m->on_msg) {
		grpc_finish(k, s, GRPC_UNIMPLEMENTED, "kvd: %s is not implemented yet", s->m->path);
		return;
	}
}

/* Deliver every complete message buffered on s. */
static void grpc_on_data(struct kvd *k, struct h2_stream *s)
{
	const uint8_t *p;
	uint32_t len;
	size_t have;

	while (!s->finished && (have = BUF_LEN(&s->in)) >= 5) {
		p = BUF_DATA(&s->in);
		len = get_be32(p + 1);
		if (len > grpc_max_recv(k)) {
			grpc_finish(k, s, GRPC_RESOURCE_EXHAUSTED,
			            "grpc: received message larger than max (%u vs. %u)", len, grpc_max_recv(k));
			return;
		}
		if (have < 5 + (size_t)len) {
			h2_grant(s, 5 + (size_t)len - have);
			return;
		}
		if (p[0] > 1) {
			grpc_finish(k, s, GRPC_INTERNAL, "grpc: received unexpected payload format %u", p[0]);
			return;
		}
		if (s->bad_encoding) {
			const char *e = grpc_meta(s, "grpc-encoding");
			grpc_finish(k, s, GRPC_UNIMPLEMENTED,
			            "grpc: Decompressor is not installed for grpc-encoding \"%.100s\"", e ? e : "");
			return;
		}
		if (p[0] == 1) {
			grpc_finish(k, s, GRPC_INTERNAL, "grpc: compressed flag set with identity or empty encoding");
			return;
		}
		if (s->m->kind == GRPC_BIDI || !s->got_msg) {
			s->got_msg = 1;
			s->m->on_msg(k, s, p + 5, len); /* may finish s, never frees it */
		}
		if (s->finished) /* grpc_finish already dropped the buffer */
			return;
		buf_consume(&s->in, 5 + (size_t)len);
		h2_consumed(s, 5 + (size_t)len);
	}
}

/* The client sent END_STREAM. */
static void grpc_on_remote_close(struct kvd *k, struct h2_stream *s)
{
	if (s->finished)
		return;
	if (!s->got_msg) { /* as grpc-go: io.EOF / io.ErrUnexpectedEOF */
		grpc_finish(k, s, GRPC_UNKNOWN, BUF_LEN(&s->in) ? "unexpected EOF" : "EOF");
		return;
	}
	if (BUF_LEN(&s->in) && s->m->kind == GRPC_BIDI) {
		grpc_finish(k, s, GRPC_INTERNAL, "unexpected EOF");
		return;
	}
	if (s->m->on_half_close)
		s->m->on_half_close(k, s);
}

/* ===== 9. Services: health, maintenance, cluster (svc_) ================== */

#define SVC_RAFT_TERM 2 /* what a fresh single-node etcd reports; kvd never elects */

static void svc_header(struct kvd *k, Etcdserverpb__ResponseHeader *h, int with_revision)
{
	etcdserverpb__response_header__init(h);
	h->cluster_id = k->cluster_id;
	h->member_id = k->member_id;
	h->raft_term = SVC_RAFT_TERM;
	if (with_revision)
		h->revision = k->revision;
}

/* grpc.health.v1.Health/Check: "" is SERVING, any other name unknown (as
 * etcd registers only ""). */
static void svc_health_check(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n)
{
	Grpc__Health__V1__HealthCheckRequest *rq;
	Grpc__Health__V1__HealthCheckResponse rs = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;

	rq = (Grpc__Health__V1__HealthCheckRequest *)grpc_unpack(
	    k, s, &grpc__health__v1__health_check_request__descriptor, p, n);
	if (!rq)
		return;
	if (rq->service && rq->service[0]) {
		grpc_finish(k, s, GRPC_NOT_FOUND, "unknown service");
	} else {
		rs.status = k->stopping ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
		                        : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
		grpc_reply(k, s, &rs.base);
	}
	pb_free(k, rq);
}

/* Health/Watch: the current status now, then the stream stays open; kvd
 * announces NOT_SERVING when it begins to shut down (svc_shutdown). */
static void svc_health_watch(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n)
{
	Grpc__Health__V1__HealthCheckRequest *rq;
	Grpc__Health__V1__HealthCheckResponse rs = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;

	rq = (Grpc__Health__V1__HealthCheckRequest *)grpc_unpack(
	    k, s, &grpc__health__v1__health_check_request__descriptor, p, n);
	if (!rq)
		return;
	if (rq->service && rq->service[0])
		rs.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN;
	else
		rs.status = k->stopping ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
		                        : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
	s->svc = rq->service && rq->service[0] ? NULL : (void *)s; /* marks a watcher of "" */
	grpc_send(k, s, &rs.base);
	pb_free(k, rq);
}

/* Maintenance/Status, with the fields etcd 3.4 sets (leader = self). */
static void svc_status(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n)
{
	Etcdserverpb__StatusRequest *rq;
	Etcdserverpb__StatusResponse rs = ETCDSERVERPB__STATUS_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;

	rq = (Etcdserverpb__StatusRequest *)grpc_unpack(k, s, &etcdserverpb__status_request__descriptor, p, n);
	if (!rq)
		return;
	svc_header(k, &h, 1);
	rs.header = &h;
	rs.version = (char *)KVD_ETCD_VERSION;
	rs.dbsize = k->db_size;
	rs.dbsizeinuse = k->db_size_in_use;
	rs.leader = k->member_id;
	rs.raftindex = (uint64_t)k->revision;
	rs.raftappliedindex = (uint64_t)k->revision;
	rs.raftterm = SVC_RAFT_TERM;
	grpc_reply(k, s, &rs.base);
	pb_free(k, rq);
}

static void svc_member(struct kvd *k, Etcdserverpb__Member *m)
{
	etcdserverpb__member__init(m);
	m->id = k->member_id;
	m->name = k->cfg.name;
	m->n_peerurls = k->npeer_urls;
	m->peerurls = k->peer_urls;
	m->n_clienturls = k->nclient_urls;
	m->clienturls = k->client_urls;
}

/* Cluster/MemberList: this member only; the header carries no revision. */
static void svc_member_list(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n)
{
	Etcdserverpb__MemberListRequest *rq;
	Etcdserverpb__MemberListResponse rs = ETCDSERVERPB__MEMBER_LIST_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader h;
	Etcdserverpb__Member m, *mp = &m;

	rq = (Etcdserverpb__MemberListRequest *)grpc_unpack(
	    k, s, &etcdserverpb__member_list_request__descriptor, p, n);
	if (!rq)
		return;
	svc_header(k, &h, 0);
	svc_member(k, &m);
	rs.header = &h;
	rs.n_members = 1;
	rs.members = &mp;
	grpc_reply(k, s, &rs.base);
	pb_free(k, rq);
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
static int svc_test_raw(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n)
{
	uint8_t *o;

	if (buf_reserve(k, &s->out, 5 + n)) {
		grpc_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: out of memory");
		return -1;
	}
	o = s->out.p + s->out.len;
	o[0] = 0;
	put_be32(o + 1, (uint32_t)n);
	if (n)
		memcpy(o + 5, p, n);
	s->out.len += 5 + n;
	return 0;
}

static void svc_test_echo(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n)
{
	if (!svc_test_raw(k, s, p, n))
		grpc_finish(k, s, GRPC_OK, "%s", "");
}

static uint8_t *svc_test_pattern(struct kvd *k, size_t n)
{
	uint8_t *b = kvd_malloc(k, n ? n : 1);
	size_t i;

	for (i = 0; b && i < n; i++)
		b[i] = (uint8_t)('a' + i % 26);
	return b;
}

static void svc_test_fill(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n)
{
	char num[24];
	size_t size;
	uint8_t *b;

	snprintf(num, sizeof num, "%.*s", (int)KVD_MIN(n, 20), (const char *)p);
	size = (size_t)strtoul(num, NULL, 10);
	if (size > 64u << 20 || !(b = svc_test_pattern(k, size))) {
		grpc_finish(k, s, GRPC_RESOURCE_EXHAUSTED, "kvd: fill too large");
		return;
	}
	if (!svc_test_raw(k, s, b, size))
		grpc_finish(k, s, GRPC_OK, "%s", "");
	kvd_free(k, b);
}

static void svc_test_stream(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n)
{
	char num[48];
	unsigned long count = 0, size = 0, i;
	uint8_t *b;

	snprintf(num, sizeof num, "%.*s", (int)KVD_MIN(n, 40), (const char *)p);
	if (sscanf(num, "%lu %lu", &count, &size) != 2 || count > 100000 || size > 1u << 20 ||
	    !(b = svc_test_pattern(k, size))) {
		grpc_finish(k, s, GRPC_INVALID_ARGUMENT, "kvd: bad stream request");
		return;
	}
	for (i = 0; i < count; i++)
		if (svc_test_raw(k, s, b, size))
			break;
	if (i == count)
		grpc_finish(k, s, GRPC_OK, "%s", "");
	kvd_free(k, b);
}
#endif

/*
 * Every method kvd knows, by service.  A NULL on_msg answers Unimplemented
 * ("kvd: ... is not implemented yet"); unknown ones get grpc-go's texts.
 */
#define SVC_NONE(path, kind) {path, kind, NULL, NULL, NULL}
static const struct grpc_method svc_kv[] = {
	SVC_NONE("/etcdserverpb.KV/Range", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.KV/RangeStream", GRPC_SERVER_STREAM),
	SVC_NONE("/etcdserverpb.KV/Put", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.KV/DeleteRange", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.KV/Txn", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.KV/Compact", GRPC_UNARY),
};
static const struct grpc_method svc_watch[] = {
	SVC_NONE("/etcdserverpb.Watch/Watch", GRPC_BIDI),
};
static const struct grpc_method svc_lease[] = {
	SVC_NONE("/etcdserverpb.Lease/LeaseGrant", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Lease/LeaseRevoke", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Lease/LeaseKeepAlive", GRPC_BIDI),
	SVC_NONE("/etcdserverpb.Lease/LeaseTimeToLive", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Lease/LeaseLeases", GRPC_UNARY),
};
static const struct grpc_method svc_cluster[] = {
	SVC_NONE("/etcdserverpb.Cluster/MemberAdd", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Cluster/MemberRemove", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Cluster/MemberUpdate", GRPC_UNARY),
	{"/etcdserverpb.Cluster/MemberList", GRPC_UNARY, svc_member_list, NULL, NULL},
	SVC_NONE("/etcdserverpb.Cluster/MemberPromote", GRPC_UNARY),
};
static const struct grpc_method svc_maintenance[] = {
	SVC_NONE("/etcdserverpb.Maintenance/Alarm", GRPC_UNARY),
	{"/etcdserverpb.Maintenance/Status", GRPC_UNARY, svc_status, NULL, NULL},
	SVC_NONE("/etcdserverpb.Maintenance/Defragment", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Maintenance/Hash", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Maintenance/HashKV", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Maintenance/Snapshot", GRPC_SERVER_STREAM),
	SVC_NONE("/etcdserverpb.Maintenance/MoveLeader", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Maintenance/Downgrade", GRPC_UNARY),
};
static const struct grpc_method svc_auth[] = {
	SVC_NONE("/etcdserverpb.Auth/AuthEnable", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/AuthDisable", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/AuthStatus", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/Authenticate", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/UserAdd", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/UserGet", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/UserList", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/UserDelete", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/UserChangePassword", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/UserGrantRole", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/UserRevokeRole", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/RoleAdd", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/RoleGet", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/RoleList", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/RoleDelete", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/RoleGrantPermission", GRPC_UNARY),
	SVC_NONE("/etcdserverpb.Auth/RoleRevokePermission", GRPC_UNARY),
};
static const struct grpc_method svc_lock[] = {
	SVC_NONE("/v3lockpb.Lock/Lock", GRPC_UNARY),
	SVC_NONE("/v3lockpb.Lock/Unlock", GRPC_UNARY),
};
static const struct grpc_method svc_election[] = {
	SVC_NONE("/v3electionpb.Election/Campaign", GRPC_UNARY),
	SVC_NONE("/v3electionpb.Election/Proclaim", GRPC_UNARY),
	SVC_NONE("/v3electionpb.Election/Leader", GRPC_UNARY),
	SVC_NONE("/v3electionpb.Election/Observe", GRPC_SERVER_STREAM),
	SVC_NONE("/v3electionpb.Election/Resign", GRPC_UNARY),
};
static const struct grpc_method svc_health[] = {
	{"/grpc.health.v1.Health/Check", GRPC_UNARY, svc_health_check, NULL, NULL},
	{"/grpc.health.v1.Health/Watch", GRPC_SERVER_STREAM, svc_health_watch, NULL, NULL},
};
#ifdef KVD_TEST_SERVICES
/* Stats: kvd's own accounting, so tests can prove memory stays bounded. */
static void svc_test_stats(struct kvd *k, struct h2_stream *s, const uint8_t *p, size_t n)
{
	char out[256];
	unsigned streams = 0;
	struct h2_conn *c;

	(void)p;
	(void)n;
	for (c = k->conns; c; c = c->next)
		streams += c->nst;
	snprintf(out, sizeof out, "mem=%zu peak=%zu conns=%u streams=%u accepted=%llu refused=%llu "
	         "goaway=%llu rst=%llu", k->mem, k->mem_peak, k->nconns, streams,
	         (unsigned long long)k->st.conns_accepted, (unsigned long long)k->st.conns_refused,
	         (unsigned long long)k->st.goaway_sent, (unsigned long long)k->st.rst_sent);
	if (!svc_test_raw(k, s, (const uint8_t *)out, strlen(out)))
		grpc_finish(k, s, GRPC_OK, "%s", "");
}

static const struct grpc_method svc_test[] = {
	{"/kvd.test.Test/Stats", GRPC_UNARY, svc_test_stats, NULL, NULL},
	{"/kvd.test.Test/Echo", GRPC_UNARY, svc_test_echo, NULL, NULL},
	{"/kvd.test.Test/Fill", GRPC_UNARY, svc_test_fill, NULL, NULL},
	{"/kvd.test.Test/Stream", GRPC_SERVER_STREAM, svc_test_stream, NULL, NULL},
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
	{"etcdserverpb.Auth", svc_auth, KVD_COUNT(svc_auth)},
	{"v3lockpb.Lock", svc_lock, KVD_COUNT(svc_lock)},
	{"v3electionpb.Election", svc_election, KVD_COUNT(svc_election)},
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

/* Shutdown begins: health watchers learn NOT_SERVING. */
static void svc_shutdown(struct kvd *k)
{
	Grpc__Health__V1__HealthCheckResponse rs = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
	struct h2_conn *c;
	unsigned i;

	rs.status = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
	for (c = k->conns; c; c = c->next)
		for (i = 0; i < c->nst; i++)
			if (c->st[i]->m && c->st[i]->m->on_msg == svc_health_watch && c->st[i]->svc)
				grpc_send(k, c->st[i], &rs.base);
}

/* ===== 10. Sockets and the poll loop (net_, loop_) ======================= */

/*
 * One poll() loop, no threads.  Each kvd_poll() call:
 *   1. reads the monotonic clock once;
 *   2. runs due timers (preface, idle, stall, grpc-timeout, drain);
 *   3. polls, with a timeout that ends at the next timer;
 *   4. dispatches: accept, read -> h2 -> gRPC -> services, write;
 *   5. flushes every connection's streams into its socket;
 *   6. reaps closed connections -- never inside their own handlers.
 * A connection whose output is over KVD_MAX_OUTPUT is not read (POLLIN
 * off): that is the backpressure against peers that do not read.
 */

static void loop_arm(struct kvd *k, int64_t when)
{
	if (when < k->next_timer)
		k->next_timer = when;
}

static int net_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -1;
	return fcntl(fd, F_SETFD, FD_CLOEXEC);
}

static void net_addr_str(const struct sockaddr *sa, char *out, size_t cap)
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
	} else {
		snprintf(out, cap, "?");
	}
}

/*
 * Split "http://host:port" (host may be [v6]) into host and port.  Other
 * schemes get a clear refusal: TLS and unix sockets are not built yet.
 */
static int net_split_url(const char *url, char *host, size_t hcap, char *port, size_t pcap,
                         char *err, size_t errlen)
{
	const char *h, *colon, *end;

	if (!strncmp(url, "https://", 8) || !strncmp(url, "unixs://", 8)) {
		snprintf(err, errlen, "%s: TLS is not implemented yet (use http://)", url);
		return KVD_EINVAL;
	}
	if (!strncmp(url, "unix://", 7)) {
		snprintf(err, errlen, "%s: unix sockets are not supported yet", url);
		return KVD_EINVAL;
	}
	if (strncmp(url, "http://", 7)) {
		snprintf(err, errlen, "%s: URL scheme must be http", url);
		return KVD_EINVAL;
	}
	h = url + 7;
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
	snprintf(err, errlen, "%s: expected http://IP:PORT", url);
	return KVD_EINVAL;
}

static int net_listen(struct kvd *k, const char *url, char *err, size_t errlen)
{
	char host[64], port[8];
	struct sockaddr_storage ss;
	struct sockaddr_in *in4 = (struct sockaddr_in *)(void *)&ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)(void *)&ss;
	socklen_t sl;
	struct net_listener *ls;
	unsigned long pn;
	int fd = -1, one = 1, r;

	if ((r = net_split_url(url, host, sizeof host, port, sizeof port, err, errlen)))
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
	ls = kvd_realloc(k, k->ls, (k->nls + 1) * sizeof *ls);
	if (!ls) {
		snprintf(err, errlen, "out of memory");
		close(fd);
		return KVD_ENOMEM;
	}
	k->ls = ls;
	ls[k->nls].fd = fd;
	sl = sizeof ss;
	getsockname(fd, (struct sockaddr *)&ss, &sl);
	net_addr_str((struct sockaddr *)&ss, ls[k->nls].name, sizeof ls[k->nls].name);
	k->nls++;
	kvd_log(k, KVD_LOG_INFO, "serving client requests on %s (gRPC over h2c)", ls[k->nls - 1].name);
	return 0;
}

/* Over the connection cap: a SETTINGS and a GOAWAY the client can act on. */
static void net_refuse(struct kvd *k, int fd)
{
	static const uint8_t msg[] = {
	    0, 0, 0, H2_SETTINGS, 0, 0, 0, 0, 0,
	    0, 0, 28, H2_GOAWAY, 0, 0, 0, 0, 0,
	    0, 0, 0, 0, 0, 0, 0, H2_ENHANCE_YOUR_CALM,
	    't', 'o', 'o', '_', 'm', 'a', 'n', 'y', '_', 'c', 'o', 'n', 'n', 'e', 'c', 't', 'i', 'o', 'n', 's'};

	if (send(fd, msg, sizeof msg, MSG_NOSIGNAL) < 0)
		(void)0; /* best effort */
	close(fd);
	k->st.conns_refused++;
}

static void net_accept(struct kvd *k, struct net_listener *l)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	struct h2_conn *c;
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
				loop_arm(k, k->accept_pause_until);
			}
			return;
		}
		if (net_nonblock(fd)) {
			close(fd);
			continue;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		if (k->nconns >= k->cfg.max_conns || k->stopping || !(c = h2_conn_new(k, fd))) {
			net_refuse(k, fd);
			continue;
		}
		net_addr_str((struct sockaddr *)&ss, c->peer, sizeof c->peer);
		c->next = k->conns;
		k->conns = c;
		k->nconns++;
		k->st.conns_accepted++;
	}
}

/*
 * Read what the socket has.  The common case runs frames straight from
 * k->rbuf; only a partial frame (or input held back by output pressure) is
 * copied into c->in, so idle connections own no input buffer.
 */
static void net_read(struct kvd *k, struct h2_conn *c)
{
	ssize_t n = recv(c->fd, k->rbuf, sizeof k->rbuf, 0);

	if (n < 0) {
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			c->dead = 1;
		return;
	}
	if (n == 0) {
		c->peer_closed = c->is_closing = c->goaway_sent = 1;
		return;
	}
	if (c->is_closing) /* lingering: drain and drop */
		return;
	if (BUF_LEN(&c->in)) {
		if (buf_append(k, &c->in, k->rbuf, (size_t)n)) {
			c->dead = 1;
			return;
		}
		h2_input(k, c);
	} else {
		struct kvd_buf own = c->in;
		c->in.p = k->rbuf;
		c->in.rd = 0;
		c->in.len = c->in.cap = (size_t)n;
		size_t left;
		const uint8_t *lp;
		h2_input(k, c); /* only consumes c->in, never grows it */
		left = BUF_LEN(&c->in);
		lp = BUF_DATA(&c->in);
		c->in = own;
		if (left && buf_append(k, &c->in, lp, left))
			c->dead = 1;
	}
	buf_trim(k, &c->in, 0);
}

static void net_write(struct kvd *k, struct h2_conn *c)
{
	ssize_t n;

	while (BUF_LEN(&c->out) && !c->dead) {
		n = send(c->fd, BUF_DATA(&c->out), BUF_LEN(&c->out), MSG_NOSIGNAL);
		if (n > 0)
			buf_consume(&c->out, (size_t)n);
		else if (n < 0 && errno == EINTR)
			continue;
		else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		else
			c->dead = 1;
	}
	buf_trim(k, &c->out, 65536);
}

/* Close connections that are done: after their output is written, a
 * shutdown(SHUT_WR) and a short linger so the peer reads our GOAWAY before
 * any RST (closing with unread input would send one). */
static void net_reap(struct kvd *k)
{
	struct h2_conn **pp = &k->conns, *c;

	while ((c = *pp)) {
		if (c->is_closing && !c->t_close) {
			c->t_close = k->now ? k->now : 1;
			loop_arm(k, k->now + 5000);
		}
		if (c->is_closing && !c->dead && !BUF_LEN(&c->out) && !c->shut_wr) {
			shutdown(c->fd, SHUT_WR);
			c->shut_wr = 1;
			loop_arm(k, k->now + 1000);
		}
		if (c->dead || (c->shut_wr && (c->peer_closed || k->now - c->t_close >= 1000)) ||
		    (c->t_close && k->now - c->t_close >= 5000)) {
			*pp = c->next;
			close(c->fd);
			h2_conn_free(k, c);
			k->nconns--;
			continue;
		}
		pp = &c->next;
	}
}

/* Graceful shutdown: stop accepting, GOAWAY everyone, finish calls. */
static void loop_stop(struct kvd *k)
{
	struct h2_conn *c;
	unsigned i;

	if (k->stopping)
		return;
	k->stopping = 1;
	k->stop_deadline = k->now + k->cfg.drain_ms;
	loop_arm(k, k->stop_deadline);
	for (i = 0; i < k->nls; i++)
		close(k->ls[i].fd);
	k->nls = 0;
	svc_shutdown(k);
	for (c = k->conns; c; c = c->next)
		h2_drain(k, c);
	kvd_log(k, KVD_LOG_INFO, "shutting down: draining %u connection(s)", k->nconns);
}

static void loop_timers(struct kvd *k)
{
	struct h2_conn *c;
	unsigned i;

	if (k->now < k->next_timer)
		return;
	k->next_timer = INT64_MAX;
	for (c = k->conns; c; c = c->next)
		loop_arm(k, h2_timers(k, c));
	if (k->stopping) {
		if (k->now >= k->stop_deadline) { /* grace is over: end what remains */
			for (c = k->conns; c; c = c->next) {
				for (i = 0; i < c->nst; i++)
					grpc_finish(k, c->st[i], GRPC_UNAVAILABLE, "etcdserver: server stopped");
				h2_goaway_final(c);
				if (k->now >= k->stop_deadline + 1000)
					c->dead = 1;
			}
			loop_arm(k, k->stop_deadline + 1000);
		} else {
			loop_arm(k, k->stop_deadline);
		}
	}
	if (k->accept_pause_until > k->now)
		loop_arm(k, k->accept_pause_until);
}

/* Before sleeping: send what streams have, resume held-back input, reap. */
static void loop_flush(struct kvd *k)
{
	struct h2_conn *c;

	for (c = k->conns; c; c = c->next) {
		if (c->dead)
			continue;
		h2_flush(k, c);
		net_write(k, c);
		if (BUF_LEN(&c->in) && !c->is_closing && BUF_LEN(&c->out) < KVD_MAX_OUTPUT) {
			h2_input(k, c);
			h2_flush(k, c);
			net_write(k, c);
		}
	}
	net_reap(k);
}

static int loop_pollset(struct kvd *k)
{
	size_t need = 1 + k->nls + k->nconns, n = 0;
	struct h2_conn *c;
	unsigned i;

	if (need > k->pcap) {
		struct pollfd *p = kvd_realloc(k, k->pfd, need * sizeof *p);
		void **o;
		if (!p)
			return -1;
		k->pfd = p;
		o = kvd_realloc(k, k->pobj, need * sizeof *o);
		if (!o)
			return -1;
		k->pobj = o;
		k->pcap = need;
	}
	k->pfd[n].fd = k->wake[0];
	k->pfd[n].events = POLLIN;
	k->pobj[n++] = NULL;
	k->npoll_ls = 0;
	if (k->now >= k->accept_pause_until && !k->stopping)
		for (i = 0; i < k->nls; i++) {
			k->pfd[n].fd = k->ls[i].fd;
			k->pfd[n].events = POLLIN;
			k->pobj[n++] = &k->ls[i];
			k->npoll_ls++;
		}
	for (c = k->conns; c; c = c->next) {
		k->pfd[n].fd = c->fd;
		k->pfd[n].events = 0;
		if (c->is_closing || BUF_LEN(&c->out) < KVD_MAX_OUTPUT)
			k->pfd[n].events |= POLLIN; /* closing: watch for the peer's EOF */
		if (BUF_LEN(&c->out))
			k->pfd[n].events |= POLLOUT;
		k->pobj[n++] = c;
	}
	return (int)n;
}

/* ===== 11. Flags and configuration (cfg_) ================================ */

/*
 * etcd's flag syntax (Go's flag package): -flag or --flag, "=value" or the
 * next argument; every flag may also come from ETCD_<FLAG_IN_CAPS>, and, as in
 * etcd 3.4, setting both is an error.  Durations are Go durations ("5s").
 */
enum cfg_type { CFG_STR, CFG_U32, CFG_MS, CFG_LEVEL };
struct cfg_flag {
	const char *name;
	enum cfg_type type;
	size_t off;
	uint32_t min;
	const char *help;
};
#define CFG_OFF(f) offsetof(struct kvd_config, f)
static const struct cfg_flag cfg_flags[] = {
	{"name", CFG_STR, CFG_OFF(name), 0, "human-readable member name (default \"default\")"},
	{"data-dir", CFG_STR, CFG_OFF(data_dir), 0, "data directory (default \"${name}.etcd\")"},
	{"listen-client-urls", CFG_STR, CFG_OFF(listen_client_urls), 0,
	 "comma list of URLs to serve clients on (default \"http://localhost:2379\")"},
	{"advertise-client-urls", CFG_STR, CFG_OFF(advertise_client_urls), 0,
	 "client URLs reported by MemberList (default \"http://localhost:2379\")"},
	{"initial-advertise-peer-urls", CFG_STR, CFG_OFF(initial_advertise_peer_urls), 0,
	 "peer URLs reported by MemberList; with the token they fix the member id (default \"http://localhost:2380\")"},
	{"initial-cluster-token", CFG_STR, CFG_OFF(initial_cluster_token), 0,
	 "cluster token, part of the member id as in etcd (default \"etcd-cluster\")"},
	{"max-request-bytes", CFG_U32, CFG_OFF(max_request_bytes), 1,
	 "largest request the server accepts (default 1572864)"},
	{"max-concurrent-streams", CFG_U32, CFG_OFF(max_concurrent_streams), 1,
	 "HTTP/2 streams per connection (default 256; etcd's is 2^32-1)"},
	{"max-connections", CFG_U32, CFG_OFF(max_connections), 1,
	 "client connections at once; more are refused with GOAWAY (default 256)"},
	{"grpc-keepalive-min-time", CFG_MS, CFG_OFF(keepalive_min_time_ms), 0,
	 "minimum interval between client pings (default 5s)"},
	{"max-idle-time", CFG_MS, CFG_OFF(idle_timeout_ms), 0,
	 "close connections without calls after this long, 0 = never (default 5m0s)"},
	{"stall-timeout", CFG_MS, CFG_OFF(stall_timeout_ms), 0,
	 "reset a stream whose output waits on a zero window this long, 0 = never (default 1m0s)"},
	{"shutdown-grace", CFG_MS, CFG_OFF(drain_timeout_ms), 0,
	 "on SIGTERM/SIGINT, time calls get to finish (default 5s)"},
	{"log-level", CFG_LEVEL, CFG_OFF(log_level), 0, "debug, info, warn or error (default info)"},
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
		return -1;
	while (*s) {
		if (!(*s >= '0' && *s <= '9') && *s != '.')
			return -1;
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
			return -1;
		total += v * units[i].ms;
		s += strlen(units[i].u);
	}
	if (total > 4294967295.0)
		return -1;
	*out = (uint32_t)(total + 0.999);
	return 0;
}

static int cfg_set(struct kvd_config *cfg, const struct cfg_flag *f, const char *v,
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
	case CFG_MS:
		if (cfg_duration(v, &ms)) {
			snprintf(err, errlen, "invalid value \"%s\" for flag --%s: want a duration such as 5s", v, f->name);
			return KVD_EINVAL;
		}
		*(uint32_t *)(void *)((char *)cfg + f->off) = ms;
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

static void cfg_env_name(const struct cfg_flag *f, char *out, size_t cap)
{
	size_t i, o = (size_t)snprintf(out, cap, "ETCD_");

	for (i = 0; f->name[i] && o + 1 < cap; i++)
		out[o++] = f->name[i] == '-' ? '_' : (char)(f->name[i] - 'a' + 'A');
	out[o] = 0;
}

static void cfg_usage(void)
{
	size_t i;

	printf("usage: kvd [flags]\n\nkvd %s: an etcd v3 API server (single member) in one C file.\n\n",
	       KVD_VERSION);
	for (i = 0; i < KVD_COUNT(cfg_flags); i++)
		printf("  --%s\n\t%s\n", cfg_flags[i].name, cfg_flags[i].help);
	printf("  --version\n\tprint the version and build options\n"
	       "  --help\n\tthis text\n\n"
	       "Every flag may also be set as ETCD_<FLAG> (e.g. ETCD_DATA_DIR).\n");
}

/* ===== 12. Public embedding API (kvd_) =================================== */

#define KVD_STR_(x) #x
#define KVD_STR(x) KVD_STR_(x)

KVD_API const char *kvd_build_options(void)
{
	return "max-conns=" KVD_STR(KVD_DEFAULT_MAX_CONNECTIONS)
	       " max-streams=" KVD_STR(KVD_DEFAULT_MAX_STREAMS)
	       " max-header-list=" KVD_STR(KVD_MAX_HEADER_LIST)
	       " max-header-fields=" KVD_STR(KVD_MAX_HEADER_FIELDS)
	       " max-output=" KVD_STR(KVD_MAX_OUTPUT)
	       " conn-window=" KVD_STR(KVD_CONN_WINDOW)
	       " etcd-api=" KVD_ETCD_VERSION
	       " tls=no"
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
	default: return "unknown error";
	}
}

KVD_API void kvd_config_init(struct kvd_config *cfg)
{
	memset(cfg, 0, sizeof *cfg);
	cfg->name = "default";
	cfg->listen_client_urls = "http://localhost:2379";
	cfg->advertise_client_urls = "http://localhost:2379";
	cfg->initial_advertise_peer_urls = "http://localhost:2380";
	cfg->initial_cluster_token = "etcd-cluster";
	cfg->max_request_bytes = KVD_DEFAULT_MAX_REQUEST;
	cfg->max_concurrent_streams = KVD_DEFAULT_MAX_STREAMS;
	cfg->max_connections = KVD_DEFAULT_MAX_CONNECTIONS;
	cfg->keepalive_min_time_ms = 5000;
	cfg->idle_timeout_ms = KVD_DEFAULT_IDLE_MS;
	cfg->stall_timeout_ms = KVD_DEFAULT_STALL_MS;
	cfg->drain_timeout_ms = KVD_DEFAULT_DRAIN_MS;
	cfg->log_level = KVD_LOG_INFO;
}

KVD_API int kvd_config_parse(struct kvd_config *cfg, int argc, char **argv, char *err, size_t errlen)
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
		if (i == KVD_COUNT(cfg_flags)) {
			snprintf(err, errlen, "unknown flag --%.*s (see kvd --help)", (int)KVD_MIN(nl, 64), a);
			return KVD_EINVAL;
		}
		if (eq) {
			v = eq + 1;
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
	for (i = 0; i < KVD_COUNT(cfg_flags); i++) {
		cfg_env_name(&cfg_flags[i], env, sizeof env);
		if (!(v = getenv(env)))
			continue;
		if (seen[i]) {
			snprintf(err, errlen, "conflicting environment variable \"%s\" is shadowed by "
			         "corresponding command-line flag (either unset environment variable or disable flag)", env);
			return KVD_EINVAL;
		}
		if ((r = cfg_set(cfg, &cfg_flags[i], v, err, errlen)))
			return r;
	}
	return 0;
}

/* Split a comma list into an owned array of owned strings. */
static int cfg_split(struct kvd *k, const char *list, char ***out, unsigned *n)
{
	const char *p = list, *e;
	char **a = NULL, **na;

	*n = 0;
	while (*p) {
		e = p + strcspn(p, ",");
		if (e > p) {
			na = kvd_realloc(k, a, (*n + 1) * sizeof *a);
			if (!na || !(na[*n] = kvd_malloc(k, (size_t)(e - p) + 1))) {
				*out = na ? na : a;
				return KVD_ENOMEM;
			}
			a = na;
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
	size_t len = strlen(k->cfg.token), o = 0;
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
	memcpy(buf + o, k->cfg.token, strlen(k->cfg.token));
	o += strlen(k->cfg.token);
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
static int cfg_mkdirs(const char *dir, char *err, size_t errlen)
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

/* Exactly one kvd per data dir: an exclusive flock on <dir>/kvd.lock. */
static int cfg_lock(struct kvd *k, char *err, size_t errlen)
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

/*
 * The memory-only half of kvd_open(): configuration, ids.  No file, socket
 * or pipe is touched, so tests and fuzzers build instances with it.
 */
static int kvd_init(const struct kvd_config *cfg, struct kvd **out, char *err, size_t errlen)
{
	struct kvd *k;

	*out = NULL;
	snprintf(err, errlen, "out of memory");
	if (!cfg->name || !cfg->name[0]) {
		snprintf(err, errlen, "--name must not be empty");
		return KVD_EINVAL;
	}
	if (!cfg->max_request_bytes || !cfg->max_concurrent_streams || !cfg->max_connections ||
	    cfg->max_request_bytes > 0x7fffffffu - KVD_GRPC_RECV_SLACK) {
		snprintf(err, errlen, "limits must be at least 1 (and --max-request-bytes below 2 GiB)");
		return KVD_EINVAL;
	}
	k = KVD_SYS_CALLOC(1, sizeof *k); /* big, mostly buffers: calloc leaves
	                                   * fresh pages untouched until used */
	if (!k)
		return KVD_ENOMEM;
	k->pba.alloc = pb_alloc;
	k->pba.free = pb_release;
	k->pba.allocator_data = k;
	k->next_timer = INT64_MAX;
	k->lock_fd = k->wake[0] = k->wake[1] = -1;
	k->revision = 1;
	k->now = util_now_ms();
	k->cfg.log_level = cfg->log_level;
	k->cfg.max_request = cfg->max_request_bytes;
	k->cfg.max_streams = cfg->max_concurrent_streams;
	k->cfg.max_conns = cfg->max_connections;
	k->cfg.ping_min_ms = cfg->keepalive_min_time_ms;
	k->cfg.idle_ms = cfg->idle_timeout_ms;
	k->cfg.stall_ms = cfg->stall_timeout_ms;
	k->cfg.drain_ms = cfg->drain_timeout_ms;
	*out = k;
	if (!(k->cfg.name = kvd_strdup(k, cfg->name)) ||
	    !(k->cfg.listen = kvd_strdup(k, cfg->listen_client_urls ? cfg->listen_client_urls : "")) ||
	    !(k->cfg.advertise = kvd_strdup(k, cfg->advertise_client_urls ? cfg->advertise_client_urls : "")) ||
	    !(k->cfg.peer_urls = kvd_strdup(k, cfg->initial_advertise_peer_urls ? cfg->initial_advertise_peer_urls : "")) ||
	    !(k->cfg.token = kvd_strdup(k, cfg->initial_cluster_token ? cfg->initial_cluster_token : "")))
		return KVD_ENOMEM;
	if (cfg->data_dir && cfg->data_dir[0]) {
		if (!(k->cfg.data_dir = kvd_strdup(k, cfg->data_dir)))
			return KVD_ENOMEM;
	} else {
		size_t n = strlen(cfg->name) + 6;
		if (!(k->cfg.data_dir = kvd_malloc(k, n)))
			return KVD_ENOMEM;
		snprintf(k->cfg.data_dir, n, "%s.etcd", cfg->name);
	}
	if (cfg_split(k, k->cfg.advertise, &k->client_urls, &k->nclient_urls) ||
	    cfg_split(k, k->cfg.peer_urls, &k->peer_urls, &k->npeer_urls) || cfg_ids(k))
		return KVD_ENOMEM;
	return 0;
}

KVD_API int kvd_open(const struct kvd_config *cfg, struct kvd **out, char *err, size_t errlen)
{
	struct kvd *k;
	char *list = NULL, *p, *url;
	int r;

	if ((r = kvd_init(cfg, &k, err, errlen)))
		goto fail;
	if (pipe(k->wake) || net_nonblock(k->wake[0]) || net_nonblock(k->wake[1])) {
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		r = KVD_EIO;
		goto fail;
	}
	if ((r = cfg_mkdirs(k->cfg.data_dir, err, errlen)) || (r = cfg_lock(k, err, errlen)))
		goto fail;
	if (!(list = kvd_strdup(k, k->cfg.listen))) {
		r = KVD_ENOMEM;
		goto fail;
	}
	for (url = strtok_r(list, ",", &p); url; url = strtok_r(NULL, ",", &p))
		if ((r = net_listen(k, url, err, errlen)))
			goto fail;
	if (!k->nls) {
		snprintf(err, errlen, "--listen-client-urls names no URL");
		r = KVD_EINVAL;
		goto fail;
	}
	kvd_free(k, list);
	kvd_log(k, KVD_LOG_INFO, "kvd %s (etcd API %s) name=%s data-dir=%s member-id=%016llx cluster-id=%016llx",
	        KVD_VERSION, KVD_ETCD_VERSION, k->cfg.name, k->cfg.data_dir,
	        (unsigned long long)k->member_id, (unsigned long long)k->cluster_id);
	*out = k;
	return 0;
fail:
	if (k)
		kvd_free(k, list);
	kvd_close(k);
	*out = NULL;
	return r;
}

KVD_API void kvd_shutdown(struct kvd *k)
{
	char b = 'T';

	if (write(k->wake[1], &b, 1) < 0)
		(void)0; /* pipe full: a shutdown is already pending */
}

KVD_API int kvd_poll(struct kvd *k, int timeout_ms)
{
	char b[16];
	ssize_t r;
	int n, i, ms;
	int64_t wait;

	k->now = util_now_ms();
	loop_timers(k);
	loop_flush(k);
	if (k->stopping && !k->conns)
		return KVD_ESTOPPED;
	n = loop_pollset(k);
	if (n < 0)
		return KVD_ENOMEM;
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
		if (!re)
			continue;
		if (i == 0) {
			while ((r = read(k->wake[0], b, sizeof b)) > 0)
				if (memchr(b, 'T', (size_t)r))
					loop_stop(k);
		} else if ((unsigned)i <= k->npoll_ls) { /* listeners come first */
			if (!k->stopping)
				net_accept(k, k->pobj[i]);
		} else {
			struct h2_conn *c = k->pobj[i];
			if (k->pfd[i].fd != c->fd)
				continue;
			if (re & (POLLIN | POLLHUP | POLLERR))
				net_read(k, c);
			if ((re & POLLOUT) && !c->dead)
				net_write(k, c);
		}
	}
	loop_flush(k);
	return k->stopping && !k->conns ? KVD_ESTOPPED : 0;
}

KVD_API void kvd_set_log(struct kvd *k, kvd_log_fn *fn, void *arg)
{
	k->log_fn = fn;
	k->log_arg = arg;
}

KVD_API void kvd_close(struct kvd *k)
{
	struct h2_conn *c;
	unsigned i;

	if (!k)
		return;
	while ((c = k->conns)) {
		k->conns = c->next;
		close(c->fd);
		h2_conn_free(k, c);
	}
	for (i = 0; i < k->nls; i++)
		close(k->ls[i].fd);
	kvd_free(k, k->ls);
	kvd_free(k, k->pfd);
	kvd_free(k, k->pobj);
	cfg_free_list(k, k->client_urls, k->nclient_urls);
	cfg_free_list(k, k->peer_urls, k->npeer_urls);
	if (k->lock_fd >= 0)
		close(k->lock_fd);
	if (k->wake[0] >= 0)
		close(k->wake[0]);
	if (k->wake[1] >= 0)
		close(k->wake[1]);
	kvd_free(k, k->cfg.name);
	kvd_free(k, k->cfg.data_dir);
	kvd_free(k, k->cfg.listen);
	kvd_free(k, k->cfg.advertise);
	kvd_free(k, k->cfg.peer_urls);
	kvd_free(k, k->cfg.token);
	if (k->mem)
		kvd_log(k, KVD_LOG_WARN, "%zu bytes still allocated at close", k->mem);
	KVD_SYS_FREE(k);
}

/* The signal handlers' only state: the instance kvd_main runs. */
static struct kvd *main_kvd;

static void main_on_signal(int sig)
{
	(void)sig;
	if (main_kvd)
		kvd_shutdown(main_kvd);
}

KVD_API int kvd_main(int argc, char **argv)
{
	struct kvd_config cfg;
	struct kvd *k;
	struct sigaction sa;
	char err[KVD_ERRLEN];
	int r;

	kvd_config_init(&cfg);
	r = kvd_config_parse(&cfg, argc, argv, err, sizeof err);
	if (r == 1)
		return 0;
	if (r) {
		fprintf(stderr, "kvd: %s\n", err);
		return 2;
	}
	if ((r = kvd_open(&cfg, &k, err, sizeof err))) {
		fprintf(stderr, "kvd: %s\n", err);
		return r == KVD_EINVAL ? 2 : 1;
	}
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_IGN;
	sigaction(SIGPIPE, &sa, NULL);
	sa.sa_handler = main_on_signal;
	sigemptyset(&sa.sa_mask);
	main_kvd = k;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	while ((r = kvd_poll(k, -1)) == 0 || r == KVD_ENOMEM)
		;
	kvd_log(k, KVD_LOG_INFO, "stopped");
	main_kvd = NULL;
	kvd_close(k);
	return 0;
}

/* ===== 13. main() ======================================================== */

#ifndef KVD_NO_MAIN
int main(int argc, char **argv)
{
	return kvd_main(argc, argv);
}
#endif
