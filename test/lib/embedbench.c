/*
 * test/lib/embedbench.c - what an in-process call costs, beside the same calls
 * over loopback gRPC (test/bench.py --only embed runs h2load against this
 * program's listener, the same instance, the same keys).
 * SPDX-License-Identifier: BSD-2-Clause
 *
 *   test/embedbench DATA_DIR LISTEN_URL [SECONDS]
 *
 * Prints one line per figure, "name rate cpu_us_per_call", then serves its
 * listener (kvd_pollfds, poll, kvd_process) until stdin closes.
 */
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../../kvd.h"

#define KEYS 1000
#define INFLIGHT 64

static struct kvd *k;
static long done, issued, events, failed;
static int mode; /* 0 range, 1 put */
static char keys[KEYS][16];

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu_s(void)
{
	struct rusage u;

	getrusage(RUSAGE_SELF, &u);
	return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 + (double)u.ru_stime.tv_sec +
	       (double)u.ru_stime.tv_usec / 1e6;
}

static void next_call(void);

static void answered(void *arg, const struct kvd_result *r)
{
	(void)arg;
	failed += r->code != 0;
	done++;
}

static void next_call(void)
{
	const char *key = keys[issued % KEYS];
	int r = mode ? kvd_put(k, key, strlen(key), "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	                       "0123456789abcdef0123456789abcdef", 100, 0, answered, NULL)
	             : kvd_get(k, key, strlen(key), 0, answered, NULL);
	if (r) {
		fprintf(stderr, "embedbench: call refused: %d\n", r);
		exit(1);
	}
	issued++;
}

/* Turn the loop; keep INFLIGHT calls outstanding (mode >= 0) until `until`. */
static void run(double until, int keep)
{
	struct pollfd fds[64];
	int n, t;

	while (now_s() < until) {
		while (keep && issued - done < INFLIGHT)
			next_call();
		if ((n = kvd_pollfds(k, fds, 64, &t)) < 0 || n > 64)
			exit(1);
		poll(fds, (nfds_t)n, keep ? 0 : (t < 0 || t > 50 ? 50 : t));
		kvd_process(k, fds, n);
	}
	while (done < issued) { /* the calls still out */
		if ((n = kvd_pollfds(k, fds, 64, &t)) < 0 || n > 64)
			exit(1);
		poll(fds, (nfds_t)n, t < 0 || t > 50 ? 50 : t);
		kvd_process(k, fds, n);
	}
}

static void figure(const char *name, int m, double secs)
{
	double t0, c0, t, c;

	mode = m;
	done = issued = failed = 0;
	t0 = now_s();
	c0 = cpu_s();
	run(t0 + secs, 1);
	t = now_s() - t0;
	c = cpu_s() - c0;
	printf("%s %.0f %.2f %ld\n", name, (double)done / t, c / (double)done * 1e6, failed);
	fflush(stdout);
}

static int on_events(void *arg, const struct kvd_events *e)
{
	(void)arg;
	events += (long)e->count;
	return 0;
}

int main(int argc, char **argv)
{
	struct kvd_config cfg;
	char err[KVD_ERRLEN];
	double secs = argc > 3 ? atof(argv[3]) : 3.0, c0, c1, c2;
	struct pollfd fds[65];
	int i, n, t, w;

	if (argc < 3) {
		fprintf(stderr, "usage: embedbench DATA_DIR LISTEN_URL [SECONDS]\n");
		return 2;
	}
	kvd_config_init(&cfg);
	cfg.data_dir = argv[1];
	cfg.listen_client_urls = argv[2];
	cfg.log_level = KVD_LOG_ERROR; /* not the slow-request warnings of 20000 puts at once */
	if (kvd_open(&cfg, &k, err, sizeof err)) {
		fprintf(stderr, "embedbench: %s\n", err);
		return 1;
	}
	for (i = 0; i < KEYS; i++)
		snprintf(keys[i], sizeof keys[i], "key%06d", i);
	mode = 1; /* the keys exist before anything reads them */
	for (i = 0; i < KEYS; i++)
		next_call();
	run(0, 0);
	figure("range", 0, secs);
	figure("put", 1, secs);
	/* a watch callback's cost: 20000 puts with 100 watchers on their
	 * prefix, less the same puts with none, per event delivered */
	mode = 1;
	done = issued = 0;
	c0 = cpu_s();
	for (i = 0; i < 20000; i++)
		next_call();
	run(0, 0);
	c1 = cpu_s() - c0; /* the puts alone */
	for (w = 0; w < 100; w++)
		if (kvd_watch(k, "key", 3, 0, KVD_WATCH_PREFIX, on_events, NULL, NULL))
			return 1;
	run(0, 0);
	done = issued = 0;
	c0 = cpu_s();
	for (i = 0; i < 20000; i++)
		next_call();
	run(0, 0);
	while (events < 100L * 20000) {
		if ((n = kvd_pollfds(k, fds, 64, &t)) < 0 || n > 64)
			return 1;
		poll(fds, (nfds_t)n, 10);
		kvd_process(k, fds, n);
	}
	c2 = cpu_s() - c0; /* the puts and their events */
	printf("watch_event %ld %.3f 0\n", events, (c2 - c1) / (double)events * 1e6);
	printf("serving\n");
	fflush(stdout);
	for (;;) { /* serve the listener until stdin closes */
		if ((n = kvd_pollfds(k, fds, 64, &t)) < 0 || n > 64)
			break;
		fds[n].fd = 0;
		fds[n].events = POLLIN;
		fds[n].revents = 0;
		poll(fds, (nfds_t)n + 1, t);
		if (fds[n].revents) {
			char b[64];
			if (read(0, b, sizeof b) <= 0)
				break;
		}
		kvd_process(k, fds, n);
	}
	return kvd_close(k) ? 1 : 0;
}
