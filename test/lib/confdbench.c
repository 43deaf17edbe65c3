/* test/lib/confdbench.c - confd load generator for test/bench.py.
 *
 *   confdbench PORT KEYFILE TYPE QUERY SECS INFLIGHT
 *
 * Keeps INFLIGHT signed queries outstanding on one UDP socket to
 * 127.0.0.1:PORT for SECS seconds, each with its own rsalt (so a replay
 * cache never sees the same datagram twice), and checks every reply the
 * way Ganeti's client does: salt = our rsalt, HMAC-SHA1 over salt and msg.
 * QUERY is JSON text ("-" for none).  A query unanswered after 200 ms counts
 * as lost and is replaced.  Prints:
 *
 *   sent N answered N status0 N lost N bad N secs S
 *
 * Plain C and mbedtls; no kvd code inside, so it measures any confd server.
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <mbedtls/md.h>

#define MAXQ 1024
#define LOST_MS 200

static unsigned char key[4096];
static size_t keylen;
static const mbedtls_md_info_t *sha1;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void hmac_hex(const char *a, size_t alen, const char *b, size_t blen, char out[41])
{
	mbedtls_md_context_t c;
	unsigned char d[20];
	int i;

	mbedtls_md_init(&c);
	if (mbedtls_md_setup(&c, sha1, 1) || mbedtls_md_hmac_starts(&c, key, keylen) ||
	    mbedtls_md_hmac_update(&c, (const unsigned char *)a, alen) ||
	    mbedtls_md_hmac_update(&c, (const unsigned char *)b, blen) || mbedtls_md_hmac_finish(&c, d)) {
		fprintf(stderr, "confdbench: mbedtls HMAC failed\n");
		exit(2);
	}
	mbedtls_md_free(&c);
	for (i = 0; i < 20; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

/* The JSON string value of "name" in a flat envelope, unescaped into out.
 * Returns its length or -1. */
static int field(const char *p, size_t n, const char *name, char *out, size_t cap)
{
	const char *e = p + n, *s;
	size_t nl = strlen(name), o = 0;
	unsigned v;

	for (s = p; s + nl + 2 <= e; s++)
		if (s[0] == '"' && !memcmp(s + 1, name, nl) && s[nl + 1] == '"')
			break;
	if (s + nl + 2 > e)
		return -1;
	for (s += nl + 2; s < e && (*s == ' ' || *s == ':'); s++)
		;
	if (s >= e || *s++ != '"')
		return -1;
	while (s < e && *s != '"') {
		char c = *s++;
		if (c == '\\') {
			if (s >= e)
				return -1;
			c = *s++;
			switch (c) {
			case 'n': c = '\n'; break;
			case 't': c = '\t'; break;
			case 'r': c = '\r'; break;
			case 'b': c = '\b'; break;
			case 'f': c = '\f'; break;
			case 'u':
				if (e - s < 4 || sscanf(s, "%4x", &v) != 1 || v > 0x7f)
					return -1; /* confd replies here are ASCII */
				c = (char)v;
				s += 4;
				break;
			default: break; /* \" \\ \/ */
			}
		}
		if (o + 1 >= cap)
			return -1;
		out[o++] = c;
	}
	if (s >= e)
		return -1;
	out[o] = 0;
	return (int)o;
}

int main(int argc, char **argv)
{
	static char dg[8192], msg[4096], esc[8192], rep[65536], rmsg[65536], rsalt[256];
	uint64_t ids[MAXQ], next = 0, sent = 0, answered = 0, status0 = 0, lost = 0, bad = 0;
	double at[MAXQ], t0, t, secs;
	struct sockaddr_in sa;
	int fd, type, inflight, i, rb = 1 << 21;
	const char *query;
	FILE *f;

	if (argc != 7) {
		fprintf(stderr, "usage: confdbench PORT KEYFILE TYPE QUERY SECS INFLIGHT\n");
		return 2;
	}
	if (!(f = fopen(argv[2], "rb")) || !(keylen = fread(key, 1, sizeof key, f))) {
		perror(argv[2]);
		return 2;
	}
	fclose(f);
	type = atoi(argv[3]);
	query = argv[4];
	secs = atof(argv[5]);
	inflight = atoi(argv[6]);
	if (inflight < 1 || inflight > MAXQ)
		return 2;
	sha1 = mbedtls_md_info_from_type(MBEDTLS_MD_SHA1);
	memset(&sa, 0, sizeof sa);
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)atoi(argv[1]));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if ((fd = socket(AF_INET, SOCK_DGRAM, 0)) < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		perror("socket");
		return 2;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rb, sizeof rb);

	t0 = t = now_s();
	for (i = 0; i < inflight; i++)
		ids[i] = UINT64_MAX;
	for (;;) {
		struct pollfd p = {fd, POLLIN, 0};
		long ts = (long)time(NULL);
		char mac[41], want[41];
		int n, m, k;

		t = now_s();
		/* fill every free slot (and replace the lost) with a fresh query */
		for (i = 0; i < inflight && t - t0 < secs; i++) {
			size_t o = 0;
			char salt[32];
			int ml, sl;
			if (ids[i] != UINT64_MAX && (t - at[i]) * 1000 < LOST_MS)
				continue;
			if (ids[i] != UINT64_MAX)
				lost++;
			ids[i] = next++ * (uint64_t)inflight + (uint64_t)i;
			at[i] = t;
			if (strcmp(query, "-"))
				ml = snprintf(msg, sizeof msg, "{\"protocol\": 1, \"type\": %d, \"query\": %s, \"rsalt\": \"cb-%llu\"}\n",
					      type, query, (unsigned long long)ids[i]);
			else
				ml = snprintf(msg, sizeof msg, "{\"protocol\": 1, \"type\": %d, \"rsalt\": \"cb-%llu\"}\n", type,
					      (unsigned long long)ids[i]);
			sl = snprintf(salt, sizeof salt, "%ld", ts);
			hmac_hex(salt, (size_t)sl, msg, (size_t)ml, mac);
			for (k = 0; k < ml; k++) {
				if (msg[k] == '"' || msg[k] == '\\')
					esc[o++] = '\\';
				if (msg[k] == '\n') {
					esc[o++] = '\\';
					esc[o++] = 'n';
				} else
					esc[o++] = msg[k];
			}
			esc[o] = 0;
			n = snprintf(dg, sizeof dg, "plj0{\"msg\": \"%s\", \"salt\": \"%s\", \"hmac\": \"%s\"}", esc, salt, mac);
			if (send(fd, dg, (size_t)n, 0) == n)
				sent++;
		}
		if (t - t0 >= secs)
			break;
		if (poll(&p, 1, 50) <= 0)
			continue;
		while ((n = (int)recv(fd, rep, sizeof rep - 1, MSG_DONTWAIT)) > 0) {
			unsigned long long id;
			if (n < 4 || memcmp(rep, "plj0", 4) || field(rep + 4, (size_t)n - 4, "salt", rsalt, sizeof rsalt) < 0 ||
			    (m = field(rep + 4, (size_t)n - 4, "msg", rmsg, sizeof rmsg)) < 0 ||
			    field(rep + 4, (size_t)n - 4, "hmac", mac, sizeof mac) != 40 || sscanf(rsalt, "cb-%llu", &id) != 1) {
				bad++;
				continue;
			}
			hmac_hex(rsalt, strlen(rsalt), rmsg, (size_t)m, want);
			i = (int)(id % (unsigned)inflight);
			if (strcmp(mac, want) || ids[i] != id) {
				bad++; /* forged, or a late answer to a query counted lost */
				continue;
			}
			answered++;
			{
				const char *s = strstr(rmsg, "\"status\"");
				if (s && (s = strchr(s, ':'))) {
					while (*++s == ' ')
						;
					status0 += *s == '0';
				}
			}
			ids[i] = UINT64_MAX;
		}
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNREFUSED) {
			perror("recv");
			return 1;
		}
	}
	printf("sent %llu answered %llu status0 %llu lost %llu bad %llu secs %.3f\n", (unsigned long long)sent,
	       (unsigned long long)answered, (unsigned long long)status0, (unsigned long long)lost,
	       (unsigned long long)bad, now_s() - t0);
	return 0;
}
