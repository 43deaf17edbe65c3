/*
 * test/lib/fuzz.h - what the fuzz targets that need a store share (after
 * #include "../kvd.c" in test/fuzz_*.c).
 * SPDX-License-Identifier: BSD-2-Clause
 */

#include <dirent.h>

/* A quiet instance on dir, fsync off, its store not opened yet; NULL if it
 * cannot be made. */
KVD_UNUSED static struct kvd *fz_kvd(const char *dir)
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

/* Remove what a run left in dir: 0, or -1 if something would not go (a
 * subdirectory: kvd keeps none). */
KVD_UNUSED static int fz_clean(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[512];
	int r = 0;

	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		if (unlink(path))
			r = -1;
	}
	if (d)
		closedir(d);
	return r;
}
