/*
 * test/libkvd.c - a host of libkvd, built by make libcheck against libkvd.a
 * (pkg-config --static) and libkvd.so, and by make nonet against kvd.c built
 * with KVD_NO_NET (-DKVD_NO_NET here too).  A library without the network
 * (kvd_build_options: "net=no") is opened with no listener.  It sees kvd.h
 * alone: an instance opened on a fresh data dir, polled, shut down, polled
 * to its end and closed; the same dir refused to a second instance while
 * the first holds it.  Last line: "N passed, N failed".
 * SPDX-License-Identifier: BSD-2-Clause
 */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd.h"

static int passed, failed;

#define CHECK(x) ((x) ? (void)passed++ : (void)(failed++, printf("FAIL test/libkvd.c:%d: %s\n", __LINE__, #x)))

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st, (void)flag, (void)ftw;
	return remove(path);
}

int main(void)
{
	char dir[] = "/tmp/libkvd-XXXXXX", err[KVD_ERRLEN];
	struct kvd_config cfg;
	struct kvd *k = NULL, *k2 = (struct kvd *)&cfg;
	const char *opts = kvd_build_options();
	int r, i, nonet;

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	kvd_config_init(&cfg);
	cfg.data_dir = dir;
	cfg.log_level = KVD_LOG_WARN;
	nonet = strstr(opts, "net=no") != NULL; /* built with KVD_NO_NET (make NET=0 lib) */
#ifdef KVD_NO_NET
	CHECK(nonet);
#endif
	cfg.listen_client_urls = nonet ? "" : "http://127.0.0.1:0"; /* nothing bound, or any free port */
	r = kvd_open(&cfg, &k, err, sizeof err);
	if (r)
		printf("kvd_open: %s (%s)\n", err, kvd_strerror(r));
	CHECK(r == 0 && k != NULL);
	if (k) {
		for (i = 0; i < 3; i++)
			CHECK(kvd_poll(k, 0) == 0);
		CHECK(kvd_open(&cfg, &k2, err, sizeof err) == KVD_EBUSY && k2 == NULL); /* the dir is locked */
		kvd_shutdown(k);
		for (i = 0; i < 100 && (r = kvd_poll(k, 100)) == 0; i++)
			;
		CHECK(r == KVD_ESTOPPED);
		kvd_close(k);
	}
	CHECK(!strcmp(kvd_strerror(KVD_ENOMEM), "out of memory"));
	nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
