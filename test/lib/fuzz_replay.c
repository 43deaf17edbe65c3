/*
 * test/lib/fuzz_replay.c - run a libFuzzer target over files and directories
 * without libFuzzer, so `make test` replays the corpora under ASan/UBSan.
 * SPDX-License-Identifier: BSD-2-Clause
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	if (!f)
		return -1;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc(n > 0 ? (size_t)n : 1);
	if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
		fclose(f);
		free(buf);
		return -1;
	}
	fclose(f);
	LLVMFuzzerTestOneInput(buf, (size_t)n);
	free(buf);
	return 0;
}

int main(int argc, char **argv)
{
	int i, count = 0;
	struct stat st;

	for (i = 1; i < argc; i++) {
		if (stat(argv[i], &st))
			continue;
		if (S_ISDIR(st.st_mode)) {
			DIR *d = opendir(argv[i]);
			struct dirent *e;
			char path[4096];
			while (d && (e = readdir(d))) {
				if (e->d_name[0] == '.')
					continue;
				snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
				if (!replay_file(path))
					count++;
			}
			if (d)
				closedir(d);
		} else if (!replay_file(argv[i])) {
			count++;
		}
	}
	printf("%s: replayed %d inputs\n", argv[0], count);
	return count ? 0 : 1;
}
