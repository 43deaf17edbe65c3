/*
 * test/embed.c - a host daemon embedding kvd, driven by one of five host
 * loops (test/embed.py runs each beside etcdctl):
 *
 *   test/embed DRIVER DATA_DIR LISTEN_URL
 *
 * DRIVER: poll (kvd_pollfds + poll(2) + kvd_process, stdin in the host's own
 * pollfd array), epoll-et (kvd_set_loop on an epoll set, EPOLLET,
 * KVD_LOOP_EDGE), libev (an ev_io per descriptor, one ev_timer), libuv (a
 * uv_poll_t per descriptor, one uv_timer_t) or sd-event (an io source per
 * descriptor, one CLOCK_MONOTONIC time source, ONESHOT, 1 ms accuracy).
 * LISTEN_URL: kvd's listener ("" for none), so that etcdctl reaches the
 * same store.  Commands, one a line, read from stdin through the same loop
 * (stdin is one more watched descriptor); answers come from kvd's callbacks:
 *
 *   put K V          put K rev=N
 *   get K            get K=V mod=N rev=R | get K none rev=R
 *   cas K MODREV V   cas K ok|fail rev=N
 *   del K            del K deleted=N rev=R
 *   watch PREFIX     watch PREFIX ready rev=R, then per event:
 *                    event PUT|DELETE K=V mod=N
 *   lease TTL        lease ID (hex, as etcdctl prints it) ttl=N
 *   snapshot PATH    snapshot rev=N
 *   quit             kvd_shutdown, the loop run until kvd stopped: bye
 *
 * Anything unexpected (a kvd_* error, a callback with an error code)
 * prints "error ...".  stdout is flushed per line.  stdin's end is quit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>
#include <systemd/sd-event.h>
#include <uv.h>

#include "../kvd.h"

static struct kvd *K;
static int quitting, stopped, in_eof;
static char inbuf[65536];
static size_t inlen;

static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* kvd's return from a loop entry: ESTOPPED ends the run, anything else is an error */
static void rc(const char *what, int r)
{
	if (r == KVD_ESTOPPED)
		stopped = 1;
	else if (r)
		out("error %s: %s", what, kvd_strerror(r));
}

/* ---------------------------------------------------------------- commands */
struct op {
	char key[256];
	int fd;
};

static struct op *op_new(const char *key)
{
	struct op *o = calloc(1, sizeof *o);

	if (!o) {
		out("error out of memory");
		exit(1);
	}
	snprintf(o->key, sizeof o->key, "%s", key);
	o->fd = -1;
	return o;
}

static int bad(const char *what, struct op *o, const struct kvd_result *r)
{
	if (!r->code)
		return 0;
	out("error %s %s: code=%d %s", what, o->key, r->code, r->text);
	free(o);
	return 1;
}

static void put_done(void *arg, const struct kvd_result *r)
{
	struct op *o = arg;

	if (!bad("put", o, r))
		out("put %s rev=%" PRId64, o->key, r->revision), free(o);
}

static void get_done(void *arg, const struct kvd_result *r)
{
	struct op *o = arg;

	if (bad("get", o, r))
		return;
	if (r->count)
		out("get %s=%.*s mod=%" PRId64 " rev=%" PRId64, o->key, (int)r->kvs[0].value_len,
		    (const char *)r->kvs[0].value, r->kvs[0].mod_revision, r->revision);
	else
		out("get %s none rev=%" PRId64, o->key, r->revision);
	free(o);
}

static void cas_done(void *arg, const struct kvd_result *r)
{
	struct op *o = arg;

	if (!bad("cas", o, r))
		out("cas %s %s rev=%" PRId64, o->key, r->succeeded ? "ok" : "fail", r->revision), free(o);
}

static void del_done(void *arg, const struct kvd_result *r)
{
	struct op *o = arg;

	if (!bad("del", o, r))
		out("del %s deleted=%" PRId64 " rev=%" PRId64, o->key, r->total, r->revision), free(o);
}

static void lease_done(void *arg, const struct kvd_result *r)
{
	struct op *o = arg;

	if (!bad("lease", o, r))
		out("lease %" PRIx64 " ttl=%" PRId64, (uint64_t)r->lease, r->ttl), free(o);
}

static void snap_done(void *arg, const struct kvd_result *r)
{
	struct op *o = arg;

	close(o->fd);
	if (!bad("snapshot", o, r))
		out("snapshot rev=%" PRId64, r->revision), free(o);
}

struct watch {
	char prefix[256];
	int ready;
};

static int watch_events(void *arg, const struct kvd_events *e)
{
	struct watch *w = arg;
	size_t i;

	if (e->last) {
		if (e->code && !quitting)
			out("error watch %s: code=%d %s", w->prefix, e->code, e->text);
		else
			out("watch %s ended", w->prefix);
		free(w);
		return 0;
	}
	if (e->progress && !w->ready) { /* the answer to the progress request sent with it: created */
		w->ready = 1;
		out("watch %s ready rev=%" PRId64, w->prefix, e->revision);
	}
	for (i = 0; i < e->count; i++)
		out("event %s %.*s=%.*s mod=%" PRId64, e->ev[i].type == KVD_EVENT_PUT ? "PUT" : "DELETE",
		    (int)e->ev[i].kv.key_len, (const char *)e->ev[i].kv.key, (int)e->ev[i].kv.value_len,
		    e->ev[i].kv.value ? (const char *)e->ev[i].kv.value : "", e->ev[i].kv.mod_revision);
	return 0;
}

static void command(char *line)
{
	char *a[4] = {0};
	int n = 0, r = 0;
	char *save = NULL, *t;
	struct op *o;

	for (t = strtok_r(line, " \t\r", &save); t && n < 4; t = strtok_r(NULL, n == 2 ? "\r" : " \t\r", &save))
		a[n++] = t; /* the value (third word of put, fourth of cas) may hold blanks */
	if (!n)
		return;
	if (!strcmp(a[0], "put") && n == 3) {
		r = kvd_put(K, a[1], strlen(a[1]), a[2], strlen(a[2]), 0, put_done, o = op_new(a[1]));
	} else if (!strcmp(a[0], "get") && n == 2) {
		r = kvd_get(K, a[1], strlen(a[1]), 0, get_done, o = op_new(a[1]));
	} else if (!strcmp(a[0], "cas") && n >= 3) {
		char *v = n == 4 ? a[3] : (char *)"", *mod = a[2], *sp = strchr(mod, ' ');
		if (sp) { /* "MODREV V": split what the third word took */
			*sp = 0;
			v = sp + 1;
		}
		r = kvd_cas(K, a[1], strlen(a[1]), strtoll(mod, NULL, 10), v, strlen(v), cas_done, o = op_new(a[1]));
	} else if (!strcmp(a[0], "del") && n == 2) {
		r = kvd_delete(K, a[1], strlen(a[1]), del_done, o = op_new(a[1]));
	} else if (!strcmp(a[0], "watch") && n == 2) {
		struct watch *w = calloc(1, sizeof *w);
		struct kvd_stream *s;
		snprintf(w->prefix, sizeof w->prefix, "%s", a[1]);
		o = NULL;
		r = kvd_watch(K, a[1], strlen(a[1]), 0, KVD_WATCH_PREFIX, watch_events, w, &s);
		if (!r)
			r = kvd_watch_progress(s);
		else
			free(w);
	} else if (!strcmp(a[0], "lease") && n == 2) {
		r = kvd_lease_grant(K, strtoll(a[1], NULL, 10), 0, lease_done, o = op_new(a[1]));
	} else if (!strcmp(a[0], "snapshot") && n == 2) {
		o = op_new(a[1]);
		if ((o->fd = open(a[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
			out("error snapshot %s: %s", a[1], strerror(errno));
			free(o);
			return;
		}
		if ((r = kvd_snapshot(K, o->fd, snap_done, o)) != 0)
			close(o->fd);
	} else if (!strcmp(a[0], "quit")) {
		quitting = 1;
		kvd_shutdown(K);
		return;
	} else {
		out("error unknown command %s", a[0]);
		return;
	}
	if (r) {
		out("error %s: %s", a[0], kvd_strerror(r));
		if (o)
			free(o);
	}
}

/* stdin readable: run every whole line */
static void stdin_ready(void)
{
	ssize_t n;
	char *nl;

	while (!in_eof) {
		n = read(0, inbuf + inlen, sizeof inbuf - 1 - inlen);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		if (n <= 0) {
			in_eof = 1;
			break;
		}
		inlen += (size_t)n;
		while ((nl = memchr(inbuf, '\n', inlen)) != NULL) {
			size_t len = (size_t)(nl - inbuf) + 1;
			*nl = 0;
			command(inbuf);
			memmove(inbuf, inbuf + len, inlen - len);
			inlen -= len;
		}
		if (inlen == sizeof inbuf - 1)
			inlen = 0; /* a line too long: dropped */
	}
	if (in_eof && !quitting) { /* stdin's end: as quit */
		quitting = 1;
		kvd_shutdown(K);
	}
}

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static unsigned kvd_events_of(int readable, int writable, int err)
{
	return (readable ? KVD_IN : 0) | (writable ? KVD_OUT : 0) | (err ? KVD_ERR : 0);
}

/* ---------------------------------------------------------------- poll: pull mode */
/* stdin at fds[0], kvd's entries after it; kvd_process gets its own part */
static int drive_poll(void)
{
	static struct pollfd fds[4096];
	int n, tmo;

	while (!stopped) {
		n = kvd_pollfds(K, fds + 1, (int)(sizeof fds / sizeof *fds) - 1, &tmo);
		if (n < 0) {
			rc("kvd_pollfds", n);
			if (stopped)
				break;
			return 1;
		}
		if (n > (int)(sizeof fds / sizeof *fds) - 1) {
			out("error kvd_pollfds wants %d entries", n);
			return 1;
		}
		fds[0].fd = in_eof ? -1 : 0; /* poll ignores a negative fd */
		fds[0].events = POLLIN;
		fds[0].revents = 0;
		if (poll(fds, (nfds_t)n + 1, tmo) < 0 && errno != EINTR) {
			out("error poll: %s", strerror(errno));
			return 1;
		}
		rc("kvd_process", kvd_process(K, fds + 1, n));
		if (fds[0].revents)
			stdin_ready();
	}
	return 0;
}

/* ---------------------------------------------------------------- epoll-et: registration, edge-triggered */
static int ep = -1;
static long ep_deadline = -1; /* the kvd timer's monotonic ms, -1: none (a fired one is spent) */

static int ep_io(void *host, int fd, unsigned events, void **slot)
{
	struct epoll_event e;
	(void)host;

	memset(&e, 0, sizeof e);
	e.data.fd = fd;
	if (!events) {
		if (*slot && epoll_ctl(ep, EPOLL_CTL_DEL, fd, &e) < 0)
			out("error epoll_ctl DEL %d: %s", fd, strerror(errno));
		*slot = NULL;
		return 0;
	}
	e.events = EPOLLET | EPOLLRDHUP | (events & KVD_IN ? EPOLLIN : 0) | (events & KVD_OUT ? EPOLLOUT : 0);
	if (epoll_ctl(ep, *slot ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &e) < 0) {
		out("error epoll_ctl %d: %s", fd, strerror(errno));
		return -1;
	}
	*slot = &ep; /* registered */
	return 0;
}

static void ep_timer(void *host, long ms)
{
	(void)host;
	ep_deadline = ms < 0 ? -1 : now_ms() + ms;
}

static int drive_epoll(void)
{
	struct kvd_loop l = {NULL, KVD_LOOP_EDGE, ep_io, ep_timer};
	struct epoll_event ev[64], e;
	int i, n, tmo;

	if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0)
		return out("error epoll_create1: %s", strerror(errno)), 1;
	memset(&e, 0, sizeof e);
	e.events = EPOLLIN; /* stdin: level-triggered, the host's own */
	e.data.fd = 0;
	if (epoll_ctl(ep, EPOLL_CTL_ADD, 0, &e) < 0)
		return out("error epoll_ctl stdin: %s", strerror(errno)), 1;
	rc("kvd_set_loop", kvd_set_loop(K, &l));
	while (!stopped) {
		tmo = ep_deadline < 0 ? -1 : (int)(ep_deadline > now_ms() ? ep_deadline - now_ms() : 0);
		n = epoll_wait(ep, ev, 64, tmo);
		if (n < 0 && errno != EINTR)
			return out("error epoll_wait: %s", strerror(errno)), 1;
		for (i = 0; i < n && !stopped; i++) {
			if (ev[i].data.fd == 0) {
				if (ev[i].events & (EPOLLHUP | EPOLLERR) && !(ev[i].events & EPOLLIN)) {
					epoll_ctl(ep, EPOLL_CTL_DEL, 0, &e);
					in_eof = 1;
				}
				stdin_ready();
				if (in_eof)
					epoll_ctl(ep, EPOLL_CTL_DEL, 0, &e);
				continue;
			}
			rc("kvd_io", kvd_io(K, ev[i].data.fd,
			                    kvd_events_of(ev[i].events & EPOLLIN, ev[i].events & EPOLLOUT,
			                                  ev[i].events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP))));
		}
		if (!stopped && ep_deadline >= 0 && now_ms() >= ep_deadline) {
			ep_deadline = -1; /* spent */
			rc("kvd_timeout", kvd_timeout(K));
		}
	}
	return 0;
}

/* ---------------------------------------------------------------- libev */
static struct ev_loop *EL;
static ev_timer he_t;

struct evw {
	ev_io w;
};

static void he_fd_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)loop;
	rc("kvd_io", kvd_io(K, w->fd, kvd_events_of(revents & EV_READ, revents & EV_WRITE, revents & EV_ERROR)));
	if (stopped)
		ev_break(EL, EVBREAK_ALL);
}

static void he_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop, (void)t, (void)revents; /* a one-shot: libev stopped it, spent */
	rc("kvd_timeout", kvd_timeout(K));
	if (stopped)
		ev_break(EL, EVBREAK_ALL);
}

static int he_io(void *host, int fd, unsigned events, void **slot)
{
	struct evw *x = *slot;
	int m = (events & KVD_IN ? EV_READ : 0) | (events & KVD_OUT ? EV_WRITE : 0);
	(void)host;

	if (!events) {
		if (x) {
			ev_io_stop(EL, &x->w);
			free(x);
		}
		*slot = NULL;
		return 0;
	}
	if (!x) {
		if (!(x = calloc(1, sizeof *x)))
			return -1;
		ev_io_init(&x->w, he_fd_cb, fd, m);
		*slot = x;
	} else {
		ev_io_stop(EL, &x->w);
		ev_io_set(&x->w, fd, m);
	}
	ev_io_start(EL, &x->w);
	return 0;
}

static void he_timer(void *host, long ms)
{
	(void)host;
	ev_timer_stop(EL, &he_t);
	if (ms >= 0) {
		ev_now_update(EL); /* ev_now is the iteration's: a timer set late in it would fire early */
		ev_timer_set(&he_t, (double)ms / 1e3, 0.);
		ev_timer_start(EL, &he_t);
	}
}

static void he_stdin_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	(void)revents;
	stdin_ready();
	if (in_eof)
		ev_io_stop(loop, w);
}

static int drive_libev(void)
{
	struct kvd_loop l = {NULL, 0, he_io, he_timer};
	ev_io in;

	EL = ev_default_loop(EVFLAG_AUTO);
	ev_init(&he_t, he_timer_cb);
	ev_io_init(&in, he_stdin_cb, 0, EV_READ);
	ev_io_start(EL, &in);
	rc("kvd_set_loop", kvd_set_loop(K, &l));
	if (!stopped)
		ev_run(EL, 0);
	ev_io_stop(EL, &in);
	return 0;
}

/* ---------------------------------------------------------------- libuv */
static uv_loop_t *UL;
static uv_timer_t hu_t;
static uv_poll_t hu_in;

static void hu_fd_cb(uv_poll_t *h, int status, int events)
{
	int fd = -1;

	uv_fileno((uv_handle_t *)h, &fd);
	rc("kvd_io", kvd_io(K, fd, kvd_events_of(events & UV_READABLE, events & UV_WRITABLE,
	                                         status < 0 || (events & UV_DISCONNECT))));
	if (stopped)
		uv_stop(UL);
}

static void hu_timer_cb(uv_timer_t *t)
{
	(void)t; /* repeat 0: stopped, spent */
	rc("kvd_timeout", kvd_timeout(K));
	if (stopped)
		uv_stop(UL);
}

static void hu_free_cb(uv_handle_t *h)
{
	free(h);
}

static int hu_io(void *host, int fd, unsigned events, void **slot)
{
	uv_poll_t *h = *slot;
	int m = (events & KVD_IN ? UV_READABLE : 0) | (events & KVD_OUT ? UV_WRITABLE : 0), r;
	(void)host;

	if (!events) { /* stop before kvd closes fd; the handle's memory lives until its close callback */
		if (h) {
			uv_poll_stop(h);
			uv_close((uv_handle_t *)h, hu_free_cb);
		}
		*slot = NULL;
		return 0;
	}
	if (!h) {
		if (!(h = calloc(1, sizeof *h)))
			return -1;
		if ((r = uv_poll_init(UL, h, fd)) != 0) { /* one poll handle per fd: UV_EEXIST if not */
			out("error uv_poll_init %d: %s", fd, uv_strerror(r));
			free(h);
			return -1;
		}
		*slot = h;
	}
	if ((r = uv_poll_start(h, m, hu_fd_cb)) != 0) {
		out("error uv_poll_start %d: %s", fd, uv_strerror(r));
		return -1;
	}
	return 0;
}

static void hu_timer(void *host, long ms)
{
	(void)host;
	uv_timer_stop(&hu_t);
	if (ms >= 0) {
		uv_update_time(UL); /* uv_now is the tick's */
		uv_timer_start(&hu_t, hu_timer_cb, (uint64_t)ms, 0);
	}
}

static void hu_stdin_cb(uv_poll_t *h, int status, int events)
{
	(void)status, (void)events;
	stdin_ready();
	if (in_eof)
		uv_poll_stop(h);
}

static int drive_libuv(void)
{
	struct kvd_loop l = {NULL, 0, hu_io, hu_timer};

	UL = uv_default_loop();
	uv_timer_init(UL, &hu_t);
	uv_poll_init(UL, &hu_in, 0);
	uv_poll_start(&hu_in, UV_READABLE, hu_stdin_cb);
	rc("kvd_set_loop", kvd_set_loop(K, &l));
	if (!stopped)
		uv_run(UL, UV_RUN_DEFAULT);
	return 0;
}

static void hu_finish(void)
{
	uv_close((uv_handle_t *)&hu_t, NULL);
	uv_close((uv_handle_t *)&hu_in, NULL);
	uv_run(UL, UV_RUN_DEFAULT); /* the close callbacks: every handle's memory freed */
	if (uv_loop_close(UL) != 0)
		out("error uv_loop_close: handles left");
}

/* ---------------------------------------------------------------- sd-event */
static sd_event *SE;
static sd_event_source *hs_t;

static int hs_fd_cb(sd_event_source *s, int fd, uint32_t revents, void *ud)
{
	(void)s, (void)ud;
	rc("kvd_io", kvd_io(K, fd, kvd_events_of(revents & EPOLLIN, revents & EPOLLOUT,
	                                         revents & (EPOLLERR | EPOLLHUP | EPOLLRDHUP))));
	if (stopped)
		sd_event_exit(SE, 0);
	return 0; /* errors go through kvd; a negative return would disable the source */
}

static int hs_timer_cb(sd_event_source *s, uint64_t usec, void *ud)
{
	(void)s, (void)usec, (void)ud; /* ONESHOT: now off, spent */
	rc("kvd_timeout", kvd_timeout(K));
	if (stopped)
		sd_event_exit(SE, 0);
	return 0;
}

static int hs_io(void *host, int fd, unsigned events, void **slot)
{
	sd_event_source *s = *slot;
	uint32_t m = (events & KVD_IN ? EPOLLIN : 0) | (events & KVD_OUT ? EPOLLOUT : 0);
	int r;
	(void)host;

	if (!events) {
		sd_event_source_disable_unref(s);
		*slot = NULL;
		return 0;
	}
	r = s ? sd_event_source_set_io_events(s, m) : sd_event_add_io(SE, &s, fd, m, hs_fd_cb, NULL);
	if (r < 0) {
		out("error sd-event io %d: %s", fd, strerror(-r));
		return -1;
	}
	*slot = s;
	return 0;
}

static void hs_timer(void *host, long ms)
{
	(void)host;
	if (ms < 0) {
		sd_event_source_set_enabled(hs_t, SD_EVENT_OFF);
		return;
	}
	sd_event_source_set_time(hs_t, (uint64_t)now_ms() * 1000 + (uint64_t)ms * 1000); /* absolute: not sd_event_now's cached time */
	sd_event_source_set_enabled(hs_t, SD_EVENT_ONESHOT);
}

static int hs_stdin_cb(sd_event_source *s, int fd, uint32_t revents, void *ud)
{
	(void)fd, (void)revents, (void)ud;
	stdin_ready();
	if (in_eof)
		sd_event_source_set_enabled(s, SD_EVENT_OFF);
	return 0;
}

static sd_event_source *hs_in;

static int drive_sdevent(void)
{
	struct kvd_loop l = {NULL, 0, hs_io, hs_timer};
	int r;

	if ((r = sd_event_new(&SE)) < 0 ||
	    (r = sd_event_add_time(SE, &hs_t, CLOCK_MONOTONIC, 0, 1000, hs_timer_cb, NULL)) < 0 ||
	    (r = sd_event_source_set_enabled(hs_t, SD_EVENT_OFF)) < 0 ||
	    (r = sd_event_add_io(SE, &hs_in, 0, EPOLLIN, hs_stdin_cb, NULL)) < 0)
		return out("error sd-event: %s", strerror(-r)), 1;
	rc("kvd_set_loop", kvd_set_loop(K, &l));
	if (!stopped && (r = sd_event_loop(SE)) < 0)
		return out("error sd_event_loop: %s", strerror(-r)), 1;
	return 0;
}

static void hs_finish(void)
{
	sd_event_source_disable_unref(hs_t);
	sd_event_source_disable_unref(hs_in);
	sd_event_unref(SE);
}

/* ---------------------------------------------------------------- main */
static void log_line(void *arg, int level, const char *line)
{
	(void)arg, (void)level;
	fprintf(stderr, "%s\n", line);
}

int main(int argc, char **argv)
{
	struct kvd_config cfg;
	char err[KVD_ERRLEN];
	const char *d;
	int r;

	if (argc != 4) {
		fprintf(stderr, "usage: %s poll|epoll-et|libev|libuv|sd-event DATA_DIR LISTEN_URL\n", argv[0]);
		return 2;
	}
	d = argv[1];
	setvbuf(stdout, NULL, _IOLBF, 0);
	fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
	kvd_config_init(&cfg);
	cfg.data_dir = argv[2];
	cfg.listen_client_urls = argv[3];
	cfg.advertise_client_urls = argv[3];
	if ((r = kvd_open(&cfg, &K, err, sizeof err)) != 0) {
		out("error kvd_open: %s", err);
		return 1;
	}
	kvd_set_log(K, log_line, NULL);
	out("ready %s", d);
	if (!strcmp(d, "poll"))
		r = drive_poll();
	else if (!strcmp(d, "epoll-et"))
		r = drive_epoll();
	else if (!strcmp(d, "libev"))
		r = drive_libev();
	else if (!strcmp(d, "libuv"))
		r = drive_libuv();
	else if (!strcmp(d, "sd-event"))
		r = drive_sdevent();
	else {
		out("error unknown driver %s", d);
		r = 2;
	}
	if (!stopped && !r)
		out("error the loop ended before kvd stopped");
	if ((r = kvd_close(K)) != 0) /* in a registered loop: io(fd, 0) for what is left */
		out("error kvd_close: %s", kvd_strerror(r));
	if (!strcmp(d, "libuv"))
		hu_finish();
	else if (!strcmp(d, "sd-event"))
		hs_finish();
	else if (!strcmp(d, "epoll-et"))
		close(ep);
	else if (!strcmp(d, "libev"))
		ev_loop_destroy(EL);
	out("bye");
	return r ? 1 : 0;
}
