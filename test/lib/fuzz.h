/*
 * test/lib/fuzz.h - what the fuzz targets that need a store share (after
 * #include "../kvd.c" in test/fuzz_*.c).
 * SPDX-License-Identifier: BSD-2-Clause
 */

/* A quiet instance on dir, fsync off, its store not opened yet; NULL if it
 * cannot be made. */
static struct kvd *fz_kvd(const char *dir)
{
	struct kvd_config cfg;
	struct kvd *k;
	char err[KVD_ERRLEN];

	kvd_config_init(&cfg);
	cfg.log_level = KVD_LOG_ERROR + 1;
	cfg.data_dir = dir;
	cfg.unsafe_no_fsync = 1;
	if (kvd_init(&cfg, &k, err, sizeof err)) {
		kvd_close(k);
		return NULL;
	}
	return k;
}
