/* tokens: the token file's "default" admin, named tokens hashed in the
 * tokens file (the hash checked against sha256sum, not our own SHA-256),
 * changes made by another tokens object (another process: `bertd token`)
 * seen by the next check, even a same-size rewrite within one clock tick,
 * a malformed or unsafe file refused, revoking default for good. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/token.h"
#include "daemon/tokens.h"

static char dir[64], token_file[128], tokens_file[128];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/bertd-tokens-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(token_file, sizeof token_file, "%s/token", dir);
	snprintf(tokens_file, sizeof tokens_file, "%s/tokens", dir);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	static char buf[8192];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	buf[n] = 0;
	fclose(f);
	return buf;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
}

/* sha256sum's digest of s: the reference for what the file must hold. */
static void sha256sum(const char *s, char hex[65])
{
	char cmd[256];
	snprintf(cmd, sizeof cmd, "printf %%s '%s' | sha256sum", s);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	assert_int_equal(fscanf(p, "%64s", hex), 1);
	pclose(p);
}

static void test_names_and_roles(void **state)
{
	(void)state;
	assert_true(tokens_name_valid("alice"));
	assert_true(tokens_name_valid("ci-bot.2_x"));
	assert_false(tokens_name_valid(""));
	assert_false(tokens_name_valid("-x"));
	assert_false(tokens_name_valid("a b"));
	assert_false(tokens_name_valid("a/b"));
	char longname[80];
	memset(longname, 'a', sizeof longname);
	longname[TOKENS_NAME_MAX] = 0;
	assert_true(tokens_name_valid(longname));
	longname[TOKENS_NAME_MAX] = 'a';
	longname[TOKENS_NAME_MAX + 1] = 0;
	assert_false(tokens_name_valid(longname));
	enum tokens_role r;
	assert_int_equal(tokens_role_parse("user", &r), 0);
	assert_int_equal(r, TOKENS_ROLE_USER);
	assert_int_equal(tokens_role_parse("root", &r), -EINVAL);
	assert_true(TOKENS_ROLE_READER < TOKENS_ROLE_USER && TOKENS_ROLE_USER < TOKENS_ROLE_ADMIN);
}

static void test_default_then_named(void **state)
{
	(void)state;
	tokens *t = NULL, *other = NULL;
	bool created = false;
	assert_int_equal(tokens_open(&t, token_file, tokens_file, true, &created), 0);
	assert_true(created);
	char def[257];
	assert_int_equal(token_read(token_file, def), 0);
	tokens_entry who;
	assert_int_equal(tokens_check(t, def, &who), 0);
	assert_string_equal(who.name, "default");
	assert_int_equal(who.role, TOKENS_ROLE_ADMIN);
	assert_int_equal(tokens_check(t, "nope", &who), -ENOENT);

	char alice[65], bob[65];
	tokens_entry made;
	assert_int_equal(tokens_add(t, "alice", TOKENS_ROLE_USER, alice, &made), 0);
	assert_int_equal(strlen(alice), 64);
	assert_int_equal(tokens_add(t, "alice", TOKENS_ROLE_READER, bob, NULL), -EEXIST);
	assert_int_equal(tokens_add(t, "default", TOKENS_ROLE_READER, bob, NULL), -EEXIST);
	assert_int_equal(tokens_add(t, "a b", TOKENS_ROLE_READER, bob, NULL), -EINVAL);
	assert_int_equal(tokens_check(t, alice, &who), 0);
	assert_string_equal(who.name, "alice");
	assert_int_equal(who.role, TOKENS_ROLE_USER);

	/* the file: 0600, the secret's SHA-256 (sha256sum's), never the secret */
	struct stat st;
	assert_int_equal(stat(tokens_file, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	char hex[65], want[128];
	sha256sum(alice, hex);
	snprintf(want, sizeof want, "\nalice user %s %lld\n", hex, (long long)made.created_ms);
	const char *text = slurp(tokens_file);
	assert_non_null(strstr(text, want));
	assert_null(strstr(text, alice));

	/* another process's change is seen by the next check */
	assert_int_equal(tokens_open(&other, token_file, tokens_file, false, NULL), 0);
	assert_int_equal(tokens_add(other, "bob", TOKENS_ROLE_READER, bob, NULL), 0);
	assert_int_equal(tokens_check(t, bob, &who), 0);
	assert_string_equal(who.name, "bob");
	assert_int_equal(tokens_revoke(other, "alice"), 0);
	assert_int_equal(tokens_check(t, alice, &who), -ENOENT);
	assert_int_equal(tokens_revoke(other, "alice"), -ENOENT);

	/* a same-size rewrite right away is seen too */
	char bok[65];
	assert_int_equal(tokens_revoke(other, "bob"), 0);
	assert_int_equal(tokens_add(other, "bok", TOKENS_ROLE_READER, bok, NULL), 0);
	assert_int_equal(tokens_check(t, bob, &who), -ENOENT);
	assert_int_equal(tokens_check(t, bok, &who), 0);
	assert_string_equal(who.name, "bok");

	/* the list: default first, then by name, no secrets */
	char zed[65];
	assert_int_equal(tokens_add(other, "zed", TOKENS_ROLE_ADMIN, zed, NULL), 0);
	assert_int_equal(tokens_add(other, "amy", TOKENS_ROLE_USER, zed, NULL), 0);
	tokens_entry *v = NULL;
	size_t n = 0;
	assert_int_equal(tokens_list(t, &v, &n), 0);
	assert_int_equal(n, 4);
	assert_string_equal(v[0].name, "default");
	assert_string_equal(v[1].name, "amy");
	assert_string_equal(v[2].name, "bok");
	assert_string_equal(v[3].name, "zed");
	assert_int_equal(v[3].role, TOKENS_ROLE_ADMIN);
	free(v);

	/* revoking default removes the file for good: no new one at a start */
	assert_int_equal(tokens_revoke(other, "default"), 0);
	assert_int_equal(tokens_check(t, def, &who), -ENOENT);
	assert_int_not_equal(access(token_file, F_OK), 0);
	tokens_close(other);
	other = NULL;
	assert_int_equal(tokens_open(&other, token_file, tokens_file, true, &created), 0);
	assert_false(created);
	assert_int_not_equal(access(token_file, F_OK), 0);
	assert_int_equal(tokens_check(other, bok, &who), 0);
	tokens_close(other);
	tokens_close(t);
}

/* A malformed or group-readable tokens file fails the open; one that turns
 * bad under a running daemon refuses its tokens (fails closed) while the
 * token file's still works; a fixed file is read again. */
static void test_bad_files(void **state)
{
	(void)state;
	tokens *t = NULL;
	char def[257], sec[65];
	int made;
	unlink(tokens_file);
	assert_int_equal(token_load_or_create(token_file, def, &made), 0);
	write_file(tokens_file, "alice user 00 12\n", 0600);
	assert_int_equal(tokens_open(&t, token_file, tokens_file, false, NULL), -EINVAL);
	write_file(tokens_file, "# ok\n", 0644);
	assert_int_equal(tokens_open(&t, token_file, tokens_file, false, NULL), -EPERM);
	write_file(tokens_file, "# ok\n", 0600);
	assert_int_equal(tokens_open(&t, token_file, tokens_file, false, NULL), 0);
	assert_int_equal(tokens_add(t, "carl", TOKENS_ROLE_USER, sec, NULL), 0);
	tokens_entry who;
	assert_int_equal(tokens_check(t, sec, &who), 0);

	/* rewritten in place (same inode, same size; by hand, say) with
	 * carl's line for another secret: the old one is refused at once.
	 * (Within one tick of the file clock the stamps would not move
	 * either: tokens.c then reads again anyway; no test can hit that
	 * tick on purpose.) */
	char hex[65], *text = slurp(tokens_file);
	const char *other = "0000000000000000000000000000000000000000000000000000000000000001";
	sha256sum(other, hex);
	char *at = strstr(text, "carl user ");
	assert_non_null(at);
	memcpy(at + strlen("carl user "), hex, 64);
	FILE *f = fopen(tokens_file, "r+");
	assert_non_null(f);
	assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
	fclose(f);
	assert_int_equal(tokens_check(t, sec, &who), -ENOENT);
	assert_int_equal(tokens_check(t, other, &who), 0);
	assert_string_equal(who.name, "carl");

	char good[8192];
	snprintf(good, sizeof good, "%s", slurp(tokens_file));
	char bad[8300];
	snprintf(bad, sizeof bad, "%scarl admin x 1\n", good); /* carl twice, bad hash */
	write_file(tokens_file, bad, 0600);
	assert_int_equal(tokens_check(t, sec, &who), -ENOENT);
	assert_int_equal(tokens_check(t, def, &who), 0);
	/* a change made now cannot overwrite a file it cannot read */
	assert_int_equal(tokens_add(t, "dora", TOKENS_ROLE_USER, sec, NULL), -EINVAL);
	assert_string_equal(slurp(tokens_file), bad);
	write_file(tokens_file, good, 0600);
	char again[65];
	assert_int_equal(tokens_add(t, "dora", TOKENS_ROLE_USER, again, NULL), 0);
	assert_int_equal(tokens_check(t, again, &who), 0);
	assert_string_equal(who.name, "dora");
	tokens_close(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names_and_roles),
		cmocka_unit_test(test_default_then_named),
		cmocka_unit_test(test_bad_files),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
