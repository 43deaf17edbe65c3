/*
 * test/fuzz_config.c - libFuzzer target: --config-file's YAML reader.
 * SPDX-License-Identifier: BSD-2-Clause
 *
 * The store is exactly as large as kvd_config_yaml() asks (len + 1), so a
 * write past it is an ASan report.  A refusal names its line; a file taken
 * leaves every string either a default or a NUL-terminated string inside
 * the store, and the result goes through kvd_init() like any configuration.
 */
#define KVD_NO_MAIN
#include "../kvd.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvd_config cfg, def;
	struct kvd *k;
	char err[KVD_ERRLEN], *text, *store;
	size_t i;
	int r;

	if (size > CFG_YAML_MAX)
		return 0;
	text = malloc(size ? size : 1); /* not NUL-terminated: the reader must not need it */
	store = malloc(size + 1);
	if (!text || !store)
		abort();
	memcpy(text, data, size);
	kvd_config_init(&cfg);
	kvd_config_init(&def);
	r = kvd_config_yaml(&cfg, text, size, store, size + 1, err, sizeof err);
	if (r && (r != KVD_EINVAL || strncmp(err, "line ", 5)))
		abort();
	for (i = 0; !r && i < KVD_COUNT(cfg_flags); i++) {
		const char *s, *d;
		if (cfg_flags[i].type != CFG_STR)
			continue;
		s = *(const char **)(void *)((char *)&cfg + cfg_flags[i].off);
		d = *(const char **)(void *)((char *)&def + cfg_flags[i].off);
		if (s == d)
			continue;
		if (s < store || s >= store + size + 1 || !memchr(s, 0, (size_t)(store + size + 1 - s)))
			abort();
	}
	if (!r) {
		cfg.log_level = KVD_LOG_ERROR + 1;
		kvd_init(&cfg, &k, err, sizeof err);
		kvd_close(k);
	}
	free(text);
	free(store);
	return 0;
}
