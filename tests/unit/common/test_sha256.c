/* SHA-256 against FIPS 180-2 example vectors and the committed data files'
 * published digests (tests/data/SOURCES.md), fed in odd-sized pieces. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/sha256.h"
#include "tests/testdata.h"

static void test_vectors(void **state)
{
	(void)state;
	char hex[65];
	sha256_hex("", 0, hex);
	assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	sha256_hex("abc", 3, hex);
	assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	sha256_hex(two, strlen(two), hex);
	assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

static void test_million_a_in_pieces(void **state)
{
	(void)state;
	sha256_ctx c;
	uint8_t d[32];
	char hex[65], chunk[997];
	memset(chunk, 'a', sizeof chunk);
	sha256_init(&c);
	size_t left = 1000000;
	for (size_t step = 1; left; step = step * 7 % 997 + 1) {
		size_t n = step < left ? step : left;
		sha256_update(&c, chunk, n);
		left -= n;
	}
	sha256_final(&c, d);
	sha256_to_hex(d, hex);
	assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* sha256 and size of a file; -1 when it cannot be read. */
static long long file_digest(const char *path, char hex[65])
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return -1;
	sha256_ctx c;
	sha256_init(&c);
	char buf[4093]; /* odd-sized pieces */
	size_t n;
	long long total = 0;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
		sha256_update(&c, buf, n);
		total += (long long)n;
	}
	fclose(f);
	uint8_t d[32];
	sha256_final(&c, d);
	sha256_to_hex(d, hex);
	return total;
}

/* The published digest of bert-base-uncased's vocab.txt, and every row of
 * tests/data/SOURCES.md ("| file | bytes | sha256 | ...") against the
 * committed file: the provenance table stays true. */
static void test_vocab_file(void **state)
{
	(void)state;
	char path[4096], hex[65];
	testdata_path(path, sizeof path, "bert-base-uncased-vocab.txt");
	assert_int_equal(file_digest(path, hex), 231508);
	assert_string_equal(hex, "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3");

	FILE *md = fopen(testdata_path(path, sizeof path, "SOURCES.md"), "r");
	assert_non_null(md);
	char line[2048];
	int rows = 0;
	while (fgets(line, sizeof line, md)) {
		char name[256], want[65];
		long long bytes;
		if (sscanf(line, "| %255s | %lld | %64[0-9a-f] |", name, &bytes, want) != 3)
			continue;
		long long got = file_digest(testdata_path(path, sizeof path, name), hex);
		if (got != bytes || strcmp(hex, want) != 0)
			fail_msg("%s: %lld bytes, sha256 %s; SOURCES.md says %lld, %s", path, got, hex, bytes, want);
		rows++;
	}
	fclose(md);
	assert_true(rows >= 2);
	fprintf(stderr, "tests/data/SOURCES.md: %d files checked\n", rows);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vectors),
		cmocka_unit_test(test_million_a_in_pieces),
		cmocka_unit_test(test_vocab_file),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
