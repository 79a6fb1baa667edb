/* tokenize_bench — single-thread WordPiece throughput of loader/wordpiece.c
 * on whole files, line by line (as bertd-prepare feeds it, with a
 * per-thread word cache that starts cold on each run), best of R runs.
 * Prints "<file> <bytes> <lines> <tokens> <MB/s> <sha256 of ids>" where the
 * digest covers each line's ids as uint32 LE + 0xFFFFFFFF, the same digest
 * bench/tokenize_hf.py prints, so the driver can check identical output.
 * Usage: tokenize_bench VOCAB lower|cased REPEATS FILE...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/sha256.h"
#include "loader/wordpiece.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: %s VOCAB lower|cased REPEATS FILE...\n", argv[0]);
		return 2;
	}
	wordpiece *wp;
	if (wordpiece_load(argv[1], strcmp(argv[2], "lower") == 0, &wp) < 0)
		return 1;
	int reps = atoi(argv[3]);
	/* as bertd-prepare's workers run it: with a per-thread word cache */
	wordpiece_cache *cache;
	if (wordpiece_cache_create(&cache) < 0)
		return 1;
	for (int f = 4; f < argc; f++) {
		FILE *fp = fopen(argv[f], "rb");
		if (!fp) {
			perror(argv[f]);
			return 1;
		}
		fseek(fp, 0, SEEK_END);
		size_t n = (size_t)ftell(fp);
		fseek(fp, 0, SEEK_SET);
		char *buf = malloc(n + 1);
		if (fread(buf, 1, n, fp) != n)
			return 1;
		fclose(fp);
		wordpiece_ids ids = {0};
		double best = 1e30;
		size_t lines = 0, tokens = 0;
		char hex[65] = "";
		for (int r = 0; r < reps; r++) {
			wordpiece_cache_destroy(cache);
			if (wordpiece_cache_create(&cache) < 0)
				return 1;
			sha256_ctx c;
			sha256_init(&c);
			lines = tokens = 0;
			double t = 0;
			for (size_t pos = 0; pos < n;) {
				char *nl = memchr(buf + pos, '\n', n - pos);
				size_t e = nl ? (size_t)(nl - buf) : n;
				ids.n = 0;
				double t0 = now();
				wordpiece_encode_cached(wp, cache, buf + pos, e - pos, &ids, NULL);
				t += now() - t0;
				/* digest outside the timed region */
				sha256_update(&c, ids.v, ids.n * 4); /* x86-64: little-endian */
				sha256_update(&c, "\xff\xff\xff\xff", 4);
				tokens += ids.n;
				lines++;
				pos = e + 1;
			}
			uint8_t d[32];
			sha256_final(&c, d);
			sha256_to_hex(d, hex);
			if (t < best)
				best = t;
		}
		printf("%s %zu %zu %zu %.2f %s\n", argv[f], n, lines, tokens, (double)n / 1e6 / best, hex);
		wordpiece_ids_free(&ids);
		free(buf);
	}
	wordpiece_cache_destroy(cache);
	wordpiece_destroy(wp);
	return 0;
}
