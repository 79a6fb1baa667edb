/* reload: the configuration read again as at start; a bad file or a hook
 * that refuses its part applies nothing (staged parts discarded); a good
 * one applies every hook with the reloadable keys, restart-only keys kept;
 * and config.h's table helpers behind it (reloadable keys, changes, copy,
 * the last --config counting, tls_cert and tls_key together). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/config.h"
#include "daemon/reload.h"

static char dir[] = "/tmp/bertd-reload-XXXXXX";
static char conf[200];

typedef struct probe {
	int checked, applied, discarded;
	int refuse;             /* check fails with this (0 = passes) */
	int seen_max_body;      /* next->max_body_bytes at apply */
	int seen_port;          /* next->port at apply */
} probe;

static int p_check(void *arg, const config *running, const config *next, void **staged, char *why,
		   size_t cap)
{
	(void)running;
	(void)next;
	probe *p = arg;
	p->checked++;
	if (p->refuse) {
		snprintf(why, cap, "probe: refused");
		return p->refuse;
	}
	*staged = malloc(8); /* discarded or taken by apply */
	return 0;
}

static void p_apply(void *arg, const config *next, void *staged)
{
	probe *p = arg;
	p->applied++;
	p->seen_max_body = (int)next->max_body_bytes;
	p->seen_port = next->port;
	free(staged);
}

static void p_discard(void *arg, void *staged)
{
	probe *p = arg;
	p->discarded++;
	free(staged);
}

static void write_conf(const char *text)
{
	FILE *f = fopen(conf, "w");
	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
}

/* A reload object over argv "--config conf", started from text. */
static reload *start(const char *text, probe *a, probe *b, char **argv)
{
	write_conf(text);
	static char *envp[] = {NULL};
	config cfg;
	FILE *null = fopen("/dev/null", "w");
	assert_int_equal(config_load(&cfg, 5, argv, envp, null, stderr), 0);
	fclose(null);
	reload *r;
	assert_int_equal(reload_create(&r, &cfg, 5, argv, envp), 0);
	reload_hook h = {.name = "a", .check = p_check, .apply = p_apply, .discard = p_discard, .arg = a};
	assert_int_equal(reload_register(r, &h), 0);
	h.name = "b";
	h.arg = b;
	assert_int_equal(reload_register(r, &h), 0);
	return r;
}

static void test_good_file_applies(void **state)
{
	(void)state;
	char *argv[] = {"bertd", "--config", conf, "--state-dir", dir, NULL};
	probe a = {0}, b = {0};
	reload *r = start("max_body_bytes = 2048\nport = 8500\n", &a, &b, argv);
	write_conf("max_body_bytes = 4096\nport = 8600\n");
	char why[512];
	assert_int_equal(reload_run(r, why, sizeof why), 0);
	assert_int_equal(a.applied, 1);
	assert_int_equal(b.applied, 1);
	assert_int_equal(a.seen_max_body, 4096);
	assert_int_equal(a.seen_port, 8500); /* restart-only: kept */
	assert_int_equal(reload_config(r)->max_body_bytes, 4096);
	assert_int_equal(reload_config(r)->port, 8500);
	reload_destroy(r);
}

static void test_bad_file_changes_nothing(void **state)
{
	(void)state;
	char *argv[] = {"bertd", "--config", conf, "--state-dir", dir, NULL};
	probe a = {0}, b = {0};
	reload *r = start("max_body_bytes = 2048\n", &a, &b, argv);
	write_conf("max_body_bytes = 4096\ndisk_ceiling_percent = 101\n");
	char why[512];
	assert_int_equal(reload_run(r, why, sizeof why), -EINVAL);
	assert_non_null(strstr(why, "disk_ceiling_percent"));
	assert_non_null(strstr(why, ":2:")); /* file:line */
	assert_int_equal(a.checked + b.checked, 0);
	assert_int_equal(a.applied + b.applied, 0);
	assert_int_equal(reload_config(r)->max_body_bytes, 2048);
	/* an unknown key too */
	write_conf("max_body_bytes = 4096\nmax_bodybytes = 1\n");
	assert_int_equal(reload_run(r, why, sizeof why), -EINVAL);
	assert_non_null(strstr(why, "unknown key \"max_bodybytes\""));
	assert_int_equal(a.applied + b.applied, 0);
	reload_destroy(r);
}

static void test_refused_part_changes_nothing(void **state)
{
	(void)state;
	char *argv[] = {"bertd", "--config", conf, "--state-dir", dir, NULL};
	probe a = {0}, b = {.refuse = -EINVAL};
	reload *r = start("max_body_bytes = 2048\n", &a, &b, argv);
	write_conf("max_body_bytes = 4096\n");
	char why[512];
	assert_int_equal(reload_run(r, why, sizeof why), -EINVAL);
	assert_string_equal(why, "probe: refused");
	assert_int_equal(a.checked, 1);
	assert_int_equal(a.discarded, 1); /* a's staged part freed, not applied */
	assert_int_equal(a.applied + b.applied, 0);
	assert_int_equal(reload_config(r)->max_body_bytes, 2048);
	b.refuse = 0;
	assert_int_equal(reload_run(r, why, sizeof why), 0);
	assert_int_equal(a.applied, 1);
	assert_int_equal(reload_config(r)->max_body_bytes, 4096);
	reload_destroy(r);
}

static void count_change(void *arg, const char *key, bool reloadable)
{
	int *n = arg;
	if (strcmp(key, "log_level") == 0 && reloadable)
		n[0]++;
	if (strcmp(key, "state_dir") == 0 && !reloadable)
		n[1]++;
}

static void test_config_table_helpers(void **state)
{
	(void)state;
	assert_false(config_key_reloadable("token_file")); /* its file is re-read, a new path is not */
	assert_true(config_key_reloadable("tls_cert"));
	assert_true(config_key_reloadable("retention_checkpoint_days"));
	assert_false(config_key_reloadable("state_dir"));
	assert_false(config_key_reloadable("listen"));
	assert_false(config_key_reloadable("no_such_key"));
	char *envp[] = {NULL};
	char *argv1[] = {"bertd", "--config", "/dev/null", "--state-dir", "/a", NULL};
	char *argv2[] = {"bertd", "--config", "/dev/null", "--state-dir", "/b", "--log-level", "debug", NULL};
	config a, b;
	FILE *null = fopen("/dev/null", "w");
	assert_int_equal(config_load(&a, 5, argv1, envp, null, null), 0);
	assert_int_equal(config_load(&b, 7, argv2, envp, null, null), 0);
	int n[2] = {0, 0};
	assert_int_equal(config_each_change(&a, &b, count_change, n), 4); /* + token_file and tokens_file, derived */
	assert_int_equal(n[0], 1);
	assert_int_equal(n[1], 1);
	config c = a;
	config_copy_reloadable(&c, &b);
	assert_string_equal(c.log_level, "debug");
	assert_string_equal(c.state_dir, "/a");
	/* the last --config counts */
	write_conf("max_body_bytes = 3072\n");
	char *argv3[] = {"bertd", "--config", "/dev/null", "--config", conf, NULL};
	assert_int_equal(config_load(&c, 5, argv3, envp, null, null), 0);
	assert_int_equal(c.max_body_bytes, 3072);
	/* tls_cert without tls_key is refused, naming both */
	char msg[512] = "";
	FILE *err = fmemopen(msg, sizeof msg, "w");
	char *argv4[] = {"bertd", "--config", "/dev/null", "--tls-cert", "/x.pem", NULL};
	assert_int_equal(config_load(&c, 5, argv4, envp, null, err), -EINVAL);
	fclose(err);
	assert_non_null(strstr(msg, "tls_cert is set but tls_key is not"));
	fclose(null);
}

static int setup(void **state)
{
	(void)state;
	if (!mkdtemp(dir))
		return -1;
	snprintf(conf, sizeof conf, "%s/bertd.conf", dir);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unlink(conf);
	return rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_good_file_applies),
		cmocka_unit_test(test_bad_file_changes_nothing),
		cmocka_unit_test(test_refused_part_changes_nothing),
		cmocka_unit_test(test_config_table_helpers),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
