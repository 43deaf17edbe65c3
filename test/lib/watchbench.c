/*
 * test/lib/watchbench.c - watch load for test/bench.py: C watches, C writer.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 *   watchbench PORT CONNS WATCHERS_PER_CONN KEYS SECONDS INFLIGHT
 *
 * Opens CONNS HTTP/2 connections, each with one Watch stream holding
 * WATCHERS_PER_CONN watchers; watcher i watches key "wk/%04d" (i % KEYS).
 * Then one writer connection puts those keys round-robin with INFLIGHT
 * calls in flight for SECONDS, while the watch connections count the events
 * they receive, and keeps reading after the last Put until every event
 * due has arrived.  Prints "puts N events M seconds S" where S runs from
 * the first Put to the last event (or to a 30 s drain timeout: then
 * M < due and the run is reported as such).  INFLIGHT 0 puts nothing:
 * the watchers are created, "created" is printed, and they sit idle for
 * SECONDS (RSS per idle watcher).  Python could not count millions of
 * events a second; this can.
 */
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct conn {
	int fd;
	uint8_t *in;
	size_t len, cap;
	uint8_t *msg; /* gRPC message reassembly on stream 1 */
	size_t mlen, mcap;
	uint64_t responses, events, unacked;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void put_frame(uint8_t **o, unsigned type, unsigned flags, uint32_t sid, const void *p, size_t n)
{
	uint8_t *b = *o;
	b[0] = (uint8_t)(n >> 16);
	b[1] = (uint8_t)(n >> 8);
	b[2] = (uint8_t)n;
	b[3] = (uint8_t)type;
	b[4] = (uint8_t)flags;
	b[5] = (uint8_t)(sid >> 24);
	b[6] = (uint8_t)(sid >> 16);
	b[7] = (uint8_t)(sid >> 8);
	b[8] = (uint8_t)sid;
	memcpy(b + 9, p, n);
	*o = b + 9 + n;
}

static size_t hfield(uint8_t *o, const char *n, const char *v)
{
	size_t nl = strlen(n), vl = strlen(v);
	o[0] = 0;
	o[1] = (uint8_t)nl;
	memcpy(o + 2, n, nl);
	o[2 + nl] = (uint8_t)vl;
	memcpy(o + 3 + nl, v, vl);
	return 3 + nl + vl;
}

static size_t headers(uint8_t *o, const char *path)
{
	size_t n = 0;
	n += hfield(o + n, ":method", "POST");
	n += hfield(o + n, ":scheme", "http");
	n += hfield(o + n, ":path", path);
	n += hfield(o + n, ":authority", "bench");
	n += hfield(o + n, "content-type", "application/grpc");
	n += hfield(o + n, "te", "trailers");
	return n;
}

static void send_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
		if (r < 0 && (errno == EINTR || errno == EAGAIN)) {
			struct pollfd pf = {fd, POLLOUT, 0};
			poll(&pf, 1, 100);
			continue;
		}
		if (r <= 0)
			die("send");
		p += r;
		n -= (size_t)r;
	}
}

static int connect_to(int port)
{
	struct sockaddr_in a;
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	uint8_t buf[64], *o = buf;
	uint8_t set[6] = {0, 4, 0x7f, 0xff, 0xff, 0xff}; /* INITIAL_WINDOW_SIZE 2^31-1 */
	uint8_t wu[4] = {0x7f, 0xff, 0x00, 0x00};

	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(0x7f000001);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a))
		die("connect");
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	memcpy(o, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
	o += 24;
	put_frame(&o, 4, 0, 0, set, 6);
	put_frame(&o, 8, 0, 0, wu, 4);
	send_all(fd, buf, (size_t)(o - buf));
	return fd;
}

/* Count events (field 11) in a WatchResponse. */
static unsigned count_events(const uint8_t *p, size_t n)
{
	const uint8_t *end = p + n;
	unsigned ev = 0;
	uint64_t tag, v;
	int sh;

	while (p < end) {
		for (tag = 0, sh = 0; p < end; sh += 7) {
			tag |= (uint64_t)(*p & 0x7f) << sh;
			if (!(*p++ & 0x80))
				break;
		}
		switch (tag & 7) {
		case 0:
			while (p < end && (*p++ & 0x80))
				;
			break;
		case 2:
			for (v = 0, sh = 0; p < end; sh += 7) {
				v |= (uint64_t)(*p & 0x7f) << sh;
				if (!(*p++ & 0x80))
					break;
			}
			if ((tag >> 3) == 11)
				ev++;
			p += v;
			break;
		default:
			return ev;
		}
	}
	return ev;
}

/* Read what is there; count watch responses and events; return credit. */
static int pump(struct conn *c)
{
	uint8_t out[256], *o = out;
	ssize_t r;
	size_t at = 0;

	if (c->cap - c->len < 65536) {
		c->cap = c->cap ? c->cap * 2 : 1 << 20;
		c->in = realloc(c->in, c->cap);
	}
	r = recv(c->fd, c->in + c->len, c->cap - c->len, MSG_DONTWAIT);
	if (r <= 0)
		return r == 0 || (errno != EAGAIN && errno != EINTR) ? -1 : 0;
	c->len += (size_t)r;
	while (c->len - at >= 9) {
		uint8_t *h = c->in + at;
		size_t n = (size_t)h[0] << 16 | (size_t)h[1] << 8 | h[2];
		uint32_t sid = ((uint32_t)h[5] << 24 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 8 | h[8]) & 0x7fffffff;
		if (c->len - at < 9 + n)
			break;
		if (h[3] == 0 && sid == 1 && n) {
			if (c->mlen + n > c->mcap) {
				c->mcap = (c->mlen + n) * 2;
				c->msg = realloc(c->msg, c->mcap);
			}
			memcpy(c->msg + c->mlen, h + 9, n);
			c->mlen += n;
			c->unacked += n;
		} else if (h[3] == 6 && !(h[4] & 1)) {
			put_frame(&o, 6, 1, 0, h + 9, 8);
		}
		at += 9 + n;
	}
	memmove(c->in, c->in + at, c->len - at);
	c->len -= at;
	at = 0;
	while (c->mlen - at >= 5) {
		size_t ml = (size_t)c->msg[at + 1] << 24 | (size_t)c->msg[at + 2] << 16 | (size_t)c->msg[at + 3] << 8 |
		            c->msg[at + 4];
		if (c->mlen - at < 5 + ml)
			break;
		c->responses++;
		c->events += count_events(c->msg + at + 5, ml);
		at += 5 + ml;
	}
	memmove(c->msg, c->msg + at, c->mlen - at);
	c->mlen -= at;
	if (c->unacked > (1u << 28)) { /* windows are 2^31-1: top them up now and then */
		uint8_t w[4] = {(uint8_t)(c->unacked >> 24), (uint8_t)(c->unacked >> 16), (uint8_t)(c->unacked >> 8),
		                (uint8_t)c->unacked};
		put_frame(&o, 8, 0, 0, w, 4);
		put_frame(&o, 8, 0, 1, w, 4);
		c->unacked = 0;
	}
	if (o > out)
		send_all(c->fd, out, (size_t)(o - out));
	return 1;
}

int main(int argc, char **argv)
{
	int port, nconn, per, keys, inflight, i, j, wfd, done_w = 0;
	double secs, t0, t_end, t_last;
	struct conn *cs, wc;
	uint8_t *buf = malloc(1 << 22), *o, hb[256], msg[64];
	uint64_t puts = 0, sent = 0, events0 = 0, events = 0, resp = 0, due;
	uint32_t sid = 1;
	struct pollfd *pf;

	if (argc != 7) {
		fprintf(stderr, "usage: watchbench PORT CONNS WATCHERS_PER_CONN KEYS SECONDS INFLIGHT\n");
		return 2;
	}
	port = atoi(argv[1]);
	nconn = atoi(argv[2]);
	per = atoi(argv[3]);
	keys = atoi(argv[4]);
	secs = atof(argv[5]);
	inflight = atoi(argv[6]);
	cs = calloc((size_t)nconn, sizeof *cs);
	pf = calloc((size_t)nconn + 1, sizeof *pf);
	for (i = 0; i < nconn; i++) {
		size_t hl;
		cs[i].fd = connect_to(port);
		o = buf;
		hl = headers(hb, "/etcdserverpb.Watch/Watch");
		put_frame(&o, 1, 4, 1, hb, hl);
		for (j = 0; j < per; j++) {
			char key[16];
			int w = i * per + j, kl = snprintf(key, sizeof key, "wk/%04d", w % keys);
			uint8_t *m = msg;
			*m++ = 0; /* gRPC prefix */
			m += 4;
			*m++ = 0x0a; /* WatchRequest.create_request */
			*m++ = (uint8_t)(2 + kl);
			*m++ = 0x0a; /* WatchCreateRequest.key */
			*m++ = (uint8_t)kl;
			memcpy(m, key, (size_t)kl);
			m += kl;
			msg[1] = 0;
			msg[2] = 0;
			msg[3] = 0;
			msg[4] = (uint8_t)(m - msg - 5);
			put_frame(&o, 0, 0, 1, msg, (size_t)(m - msg));
		}
		send_all(cs[i].fd, buf, (size_t)(o - buf));
	}
	/* wait for every "created" */
	t0 = now_s();
	for (;;) {
		for (resp = 0, i = 0; i < nconn; i++) {
			pump(&cs[i]);
			resp += cs[i].responses;
		}
		if (resp >= (uint64_t)nconn * (uint64_t)per || now_s() - t0 > 30)
			break;
		usleep(1000);
	}
	if (resp < (uint64_t)nconn * (uint64_t)per) {
		fprintf(stderr, "only %llu of %d watchers created\n", (unsigned long long)resp, nconn * per);
		return 1;
	}
	if (inflight <= 0) {
		printf("created %d\n", nconn * per);
		fflush(stdout);
		t0 = now_s();
		while (now_s() - t0 < secs) /* stay alive, answer PINGs */
			for (i = 0; i < nconn; i++)
				if (pump(&cs[i]) == 0)
					usleep(1000);
		return 0;
	}
	memset(&wc, 0, sizeof wc);
	wfd = connect_to(port);
	wc.fd = wfd;
	for (i = 0; i < nconn; i++)
		events0 += cs[i].events;
	t0 = t_last = now_s();
	t_end = t0 + secs;
	while (!done_w || now_s() < t_end + 1) {
		/* keep INFLIGHT puts going until the time is up */
		o = buf;
		while (!done_w && sent - puts < (uint64_t)inflight) {
			char key[16], val[] = "0123456789012345678901234567890123456789";
			int kl = snprintf(key, sizeof key, "wk/%04d", (int)(sent % (uint64_t)keys));
			uint8_t *m = msg;
			size_t hl = headers(hb, "/etcdserverpb.KV/Put");
			*m++ = 0;
			m += 4;
			*m++ = 0x0a;
			*m++ = (uint8_t)kl;
			memcpy(m, key, (size_t)kl);
			m += kl;
			*m++ = 0x12;
			*m++ = (uint8_t)(sizeof val - 1);
			memcpy(m, val, sizeof val - 1);
			m += sizeof val - 1;
			msg[1] = msg[2] = msg[3] = 0;
			msg[4] = (uint8_t)(m - msg - 5);
			put_frame(&o, 1, 4, sid, hb, hl);
			put_frame(&o, 0, 1, sid, msg, (size_t)(m - msg));
			sid += 2;
			sent++;
		}
		if (o > buf)
			send_all(wfd, buf, (size_t)(o - buf));
		if (now_s() >= t_end)
			done_w = 1;
		for (i = 0; i < nconn; i++) {
			pf[i].fd = cs[i].fd;
			pf[i].events = POLLIN;
		}
		pf[nconn].fd = wfd;
		pf[nconn].events = POLLIN;
		poll(pf, (nfds_t)nconn + 1, 10);
		for (i = 0; i < nconn; i++)
			if (pf[i].revents) {
				pump(&cs[i]);
				t_last = now_s();
			}
		if (pf[nconn].revents) {
			/* the writer's replies arrive on many streams: count trailers frames */
			uint8_t tmp[1 << 16];
			ssize_t r = recv(wfd, tmp, sizeof tmp, MSG_DONTWAIT);
			if (r > 0) {
				if (wc.len + (size_t)r > wc.cap) {
					wc.cap = (wc.len + (size_t)r) * 2;
					wc.in = realloc(wc.in, wc.cap);
				}
				memcpy(wc.in + wc.len, tmp, (size_t)r);
				wc.len += (size_t)r;
				{
					size_t at = 0;
					uint8_t out[64], *oo = out;
					while (wc.len - at >= 9) {
						uint8_t *h = wc.in + at;
						size_t n = (size_t)h[0] << 16 | (size_t)h[1] << 8 | h[2];
						if (wc.len - at < 9 + n)
							break;
						if (h[3] == 1 && (h[4] & 1))
							puts++; /* trailers: a Put finished */
						if (h[3] == 6 && !(h[4] & 1))
							put_frame(&oo, 6, 1, 0, h + 9, 8);
						at += 9 + n;
					}
					memmove(wc.in, wc.in + at, wc.len - at);
					wc.len -= at;
					if (oo > out)
						send_all(wfd, out, (size_t)(oo - out));
				}
			}
		}
		if (done_w && sent == puts)
			break;
	}
	/* every Put of key k is due to the watchers w with w % keys == k */
	for (due = 0, j = 0; j < keys; j++) {
		uint64_t nput = puts / (uint64_t)keys + ((uint64_t)j < puts % (uint64_t)keys);
		uint64_t nw = (uint64_t)(nconn * per) / (uint64_t)keys + ((uint64_t)j < (uint64_t)(nconn * per) % (uint64_t)keys);
		due += nput * nw;
	}
	t_end = now_s() + 30;
	for (;;) {
		for (events = 0, i = 0; i < nconn; i++)
			events += cs[i].events;
		if (events - events0 >= due || now_s() > t_end)
			break;
		for (i = 0; i < nconn; i++) {
			pf[i].fd = cs[i].fd;
			pf[i].events = POLLIN;
		}
		poll(pf, (nfds_t)nconn, 10);
		for (i = 0; i < nconn; i++)
			if (pf[i].revents) {
				pump(&cs[i]);
				t_last = now_s();
			}
	}
	printf("puts %llu events %llu due %llu seconds %.3f\n", (unsigned long long)puts,
	       (unsigned long long)(events - events0), (unsigned long long)due, t_last - t0);
	return 0;
}
