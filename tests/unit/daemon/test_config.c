/* config precedence (default < file < env < flags), validation messages,
 * the token file's creation, reuse and permission checks, and pass_env: its
 * validation and what it lets into a child's environment (childenv). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/childenv.h"
#include "daemon/config.h"
#include "daemon/token.h"

static char tmpdir[256];

static int setup(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof tmpdir, "/tmp/bertd-cfg-XXXXXX");
	return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	char cmd[300];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
	return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* Runs config_load with stderr captured into errbuf. */
static int load(config *c, int argc, char **argv, char **envp, char *errbuf, size_t cap)
{
	FILE *err = fmemopen(errbuf, cap, "w");
	FILE *out = fopen("/dev/null", "w");
	int rc = config_load(c, argc, argv, envp, out, err);
	fclose(err);
	fclose(out);
	return rc;
}

static void test_defaults(void **state)
{
	(void)state;
	config c;
	char errbuf[512] = "";
	char *argv[] = {"bertd", "--config", "/dev/null", NULL};
	char *envp[] = {NULL};
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), 0);
	assert_string_equal(c.listen, "127.0.0.1");
	assert_int_equal(c.port, 8420);
	assert_false(c.allow_remote);
	/* relative paths are made absolute against the cwd once, at start, so
	 * the API never shows a client "./var/..." */
	char cwd[1024], want[1200];
	assert_non_null(getcwd(cwd, sizeof cwd));
	snprintf(want, sizeof want, "%s/var", cwd);
	assert_string_equal(c.state_dir, want);
	snprintf(want, sizeof want, "%s/var/token", cwd);
	assert_string_equal(c.token_file, want);
	assert_int_equal(c.n_roots, 1);
	snprintf(want, sizeof want, "%s/var/data", cwd);
	assert_string_equal(c.roots[0], want);
	assert_int_equal(c.max_body_bytes, 1048576);
}

static void test_relative_paths_absolute(void **state)
{
	(void)state;
	config c;
	char errbuf[512] = "", cwd[1024], want[1200];
	char *argv[] = {"bertd", "--config", "/dev/null", "--state-dir", "./st",
			"--data-roots", "./d1:rel/d2::/abs", NULL};
	char *envp[] = {NULL};
	assert_non_null(getcwd(cwd, sizeof cwd));
	assert_int_equal(load(&c, 7, argv, envp, errbuf, sizeof errbuf), 0);
	snprintf(want, sizeof want, "%s/st", cwd);
	assert_string_equal(c.state_dir, want);
	assert_int_equal(c.n_roots, 3);
	snprintf(want, sizeof want, "%s/d1", cwd);
	assert_string_equal(c.roots[0], want);
	snprintf(want, sizeof want, "%s/rel/d2", cwd);
	assert_string_equal(c.roots[1], want);
	assert_string_equal(c.roots[2], "/abs");
}

static void test_precedence(void **state)
{
	(void)state;
	char path[300];
	snprintf(path, sizeof path, "%s/bertd.conf", tmpdir);
	write_file(path, "# comment\n\nport = 9000\nlog_level = debug\nstate_dir = \"/srv/x\"\n"
			 "data_roots = /a:/b::/c\nmax_body_bytes=2048\n");
	config c;
	char errbuf[512] = "";
	char *argv[] = {"bertd", "--config", path, "--max-body-bytes=4096", "--allow-remote", NULL};
	char *envp[] = {"BERTD_PORT=9001", "BERTD_LOG_LEVEL=warn", "BERTD_UNRELATED=1", NULL};
	assert_int_equal(load(&c, 5, argv, envp, errbuf, sizeof errbuf), 0);
	assert_int_equal(c.port, 9001);             /* env beats file */
	assert_string_equal(c.log_level, "warn");
	assert_string_equal(c.state_dir, "/srv/x"); /* file beats default, quotes stripped */
	assert_int_equal(c.max_body_bytes, 4096);   /* flag beats file */
	assert_true(c.allow_remote);                /* bare boolean flag */
	assert_int_equal(c.n_roots, 3);
	assert_string_equal(c.roots[2], "/c");

	char *argv2[] = {"bertd", "--config", path, "--port", "9002", NULL};
	assert_int_equal(load(&c, 5, argv2, envp, errbuf, sizeof errbuf), 0);
	assert_int_equal(c.port, 9002);             /* flag beats env */
}

static void test_errors_name_source(void **state)
{
	(void)state;
	char path[300];
	snprintf(path, sizeof path, "%s/bad.conf", tmpdir);
	config c;
	char errbuf[512];

	write_file(path, "port = 80\nno_such_key = 1\n");
	char *argv[] = {"bertd", "--config", path, NULL};
	char *envp[] = {NULL};
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), -EINVAL);
	assert_non_null(strstr(errbuf, ":2"));
	assert_non_null(strstr(errbuf, "no_such_key"));

	write_file(path, "port = 70000\n");
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), -EINVAL);
	assert_non_null(strstr(errbuf, "port"));

	write_file(path, "allow_remote = maybe\n");
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), -EINVAL);

	write_file(path, "just words\n");
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), -EINVAL);

	char *argv2[] = {"bertd", "--config", "/dev/null", "--port", "12x", NULL};
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 5, argv2, envp, errbuf, sizeof errbuf), -EINVAL);
	assert_non_null(strstr(errbuf, "option --port"));

	char *argv3[] = {"bertd", "--config", "/dev/null", "--bogus", "1", NULL};
	assert_int_equal(load(&c, 5, argv3, envp, errbuf, sizeof errbuf), -EINVAL);
	char *argv4[] = {"bertd", "--config", "/dev/null", "--port", NULL};
	assert_int_equal(load(&c, 4, argv4, envp, errbuf, sizeof errbuf), -EINVAL);
	char *envp2[] = {"BERTD_LOG_LEVEL=loud", NULL};
	assert_int_equal(load(&c, 3, argv2, envp2, errbuf, sizeof errbuf), -EINVAL);

	/* An explicitly named file must exist; the default one may be absent. */
	char missing[300];
	snprintf(missing, sizeof missing, "%s/missing.conf", tmpdir);
	char *argv5[] = {"bertd", "--config", missing, NULL};
	assert_int_equal(load(&c, 3, argv5, envp, errbuf, sizeof errbuf), -EINVAL);
}

static void test_help_lists_every_key(void **state)
{
	(void)state;
	char buf[8192] = "";
	FILE *out = fmemopen(buf, sizeof buf, "w");
	config_print_help(out, "bertd");
	fclose(out);
	const char *keys[] = {"listen", "port", "allow_remote", "state_dir", "data_roots", "token_file",
			      "log_level", "max_body_bytes", "api_threads", "conn_timeout_s", "conn_limit",
			      "per_ip_limit", "conn_memory", "pass_env"};
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
		assert_non_null(strstr(buf, keys[i]));
	config c;
	char errbuf[64];
	char *argv[] = {"bertd", "--help", NULL};
	char *envp[] = {NULL};
	assert_int_equal(load(&c, 2, argv, envp, errbuf, sizeof errbuf), 1);
}

static void test_token(void **state)
{
	(void)state;
	char path[300], t1[257], t2[257];
	int created = -1;
	snprintf(path, sizeof path, "%s/token", tmpdir);
	assert_int_equal(token_load_or_create(path, t1, &created), 0);
	assert_int_equal(created, 1);
	assert_int_equal(strlen(t1), TOKEN_HEX_LEN);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(token_load_or_create(path, t2, &created), 0);
	assert_int_equal(created, 0);
	assert_string_equal(t1, t2);

	char other[300];
	snprintf(other, sizeof other, "%s/token2", tmpdir);
	assert_int_equal(token_load_or_create(other, t2, &created), 0);
	assert_string_not_equal(t1, t2); /* fresh randomness per file */

	chmod(path, 0644);
	assert_int_equal(token_load_or_create(path, t2, &created), -EPERM);
	write_file(other, "short\n");
	chmod(other, 0600);
	assert_int_equal(token_load_or_create(other, t2, &created), -EINVAL);
}

static void test_pass_env_key(void **state)
{
	(void)state;
	char path[300];
	snprintf(path, sizeof path, "%s/env.conf", tmpdir);
	config c;
	char errbuf[512] = "";
	char *argv[] = {"bertd", "--config", path, NULL};
	char *envp[] = {NULL};

	write_file(path, "port = 1\n");
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), 0);
	assert_string_equal(c.pass_env, CHILDENV_DEFAULT_PASS);
	write_file(path, "pass_env = \"LD_LIBRARY_PATH:NCCL_*::FI_*:\"\n"); /* empty entries skipped */
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), 0);
	assert_string_equal(c.pass_env, "LD_LIBRARY_PATH:NCCL_*::FI_*:");
	char *envp2[] = {"BERTD_PASS_ENV=", NULL}; /* pass nothing */
	assert_int_equal(load(&c, 3, argv, envp2, errbuf, sizeof errbuf), 0);
	assert_string_equal(c.pass_env, "");
	char *argv2[] = {"bertd", "--config", path, "--pass-env", "NCCL_*:MY_VAR", NULL};
	assert_int_equal(load(&c, 5, argv2, envp2, errbuf, sizeof errbuf), 0);
	assert_string_equal(c.pass_env, "NCCL_*:MY_VAR");

	/* malformed: refused at start, naming the source, the key and the entry */
	write_file(path, "port = 1\npass_env = NCCL_*, FI_*\n");
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), -EINVAL);
	assert_non_null(strstr(errbuf, ":2: pass_env:"));
	assert_non_null(strstr(errbuf, "\"NCCL_*, FI_*\""));
	static const struct { const char *value, *says; } bad[] = {
		{"NC*CL_", "not a variable name"},       /* '*' only last */
		{"NCCL-*", "not a variable name"},
		{"1NCCL", "not a variable name"},
		{"*", "whole environment"},
		{"NCCL_*:*", "whole environment"},
		{"CUDA_VISIBLE_DEVICES", "set by bertd"}, /* the supervisor's own */
		{"LD_LIBRARY_PATH:OMP_NUM_THREADS", "set by bertd"},
		{"PATH", "set by bertd"},
		{"BERTD_*", "BERTD_ variables"},
		{"BERTD_GEMM", "BERTD_ variables"},
	};
	write_file(path, "port = 1\n");
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char assign[128];
		snprintf(assign, sizeof assign, "BERTD_PASS_ENV=%s", bad[i].value);
		char *envp3[] = {assign, NULL};
		memset(errbuf, 0, sizeof errbuf);
		assert_int_equal(load(&c, 3, argv, envp3, errbuf, sizeof errbuf), -EINVAL);
		assert_non_null(strstr(errbuf, "environment BERTD_PASS_ENV: pass_env:"));
		if (!strstr(errbuf, bad[i].says))
			fail_msg("pass_env \"%s\": expected \"%s\" in: %s", bad[i].value, bad[i].says, errbuf);
	}
	char many[1000] = "";
	for (int i = 0; i <= CHILDENV_MAX_PATTERNS; i++)
		snprintf(many + strlen(many), sizeof many - strlen(many), "V%d:", i);
	char *argv4[] = {"bertd", "--config", "/dev/null", "--pass-env", many, NULL};
	assert_int_equal(load(&c, 5, argv4, envp, errbuf, sizeof errbuf), -EINVAL);
	assert_non_null(strstr(errbuf, "at most"));
}

static void test_pass_env_matching(void **state)
{
	(void)state;
	childenv_pass p;
	char why[300];
	assert_int_equal(childenv_pass_parse(&p, "LD_LIBRARY_PATH:NCCL_*:CUDA_*:OMP_*:B*", why, sizeof why), 0);
	assert_int_equal(p.n, 5);
	static const struct { const char *var; bool passes; } cases[] = {
		{"LD_LIBRARY_PATH=/usr/local/cuda/lib64", true}, /* a name: exactly that name */
		{"LD_LIBRARY_PATH", true},
		{"LD_LIBRARY_PATH_X=1", false},
		{"LD_LIBRARY_PAT=1", false},
		{"NCCL_SOCKET_IFNAME=eth0", true},              /* a prefix: every name it starts */
		{"NCCL_=1", true},
		{"NCCL=1", false},
		{"MY_NCCL_DEBUG=INFO", false},
		{"nccl_debug=INFO", false},                     /* case matters */
		{"CUDA_CACHE_PATH=/var/cache/cuda", true},
		{"CUDA_VISIBLE_DEVICES=7", false},              /* covered, but the supervisor's */
		{"CUDA_DEVICE_ORDER=FASTEST_FIRST", false},
		{"OMP_PROC_BIND=close", true},
		{"OMP_NUM_THREADS=64", false},
		{"BLAH=1", true},
		{"BERTD_TOKEN_FILE=/x", false},                 /* covered by B*, but bertd's own */
		{"BERTD_GEMM=cublas", false},
		{"HOME=/root", false},
		{"=x", false},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		if (childenv_passes(&p, cases[i].var) != cases[i].passes)
			fail_msg("%s: expected %s", cases[i].var, cases[i].passes ? "passed" : "kept out");
	assert_int_equal(childenv_pass_parse(&p, "", why, sizeof why), 0);
	assert_int_equal(p.n, 0);
	assert_false(childenv_passes(&p, "NCCL_DEBUG=INFO"));
}

/* Value of name in a NULL-ended envp; fails if it is there more than once. */
static const char *env_value(char *const envp[], const char *name)
{
	const char *found = NULL;
	size_t n = strlen(name);
	for (size_t i = 0; envp[i]; i++) {
		if (strncmp(envp[i], name, n) == 0 && envp[i][n] == '=') {
			if (found)
				fail_msg("%s is in the environment twice", name);
			found = envp[i] + n + 1;
		}
	}
	return found;
}

/* Fails unless envp has name=want, once. */
static void assert_env(char *const envp[], const char *name, const char *want)
{
	const char *v = env_value(envp, name);
	if (!v || strcmp(v, want) != 0)
		fail_msg("%s is %s, expected %s", name, v ? v : "unset", want);
}

/* The daemon's environment on a tuned multi-GPU box, more or less. */
static char *daemon_env[] = {
	"PATH=/opt/site/bin:/usr/bin", "HOME=/root", "NOTIFY_SOCKET=/run/systemd/notify",
	"LD_LIBRARY_PATH=/usr/local/cuda/lib64", "LD_PRELOAD=/opt/x.so", "SECRET_TOKEN=hunter2",
	"NCCL_SOCKET_IFNAME=eth0", "NCCL_IB_HCA=mlx5_0,mlx5_1", "NCCL_DEBUG=WARN", "FI_PROVIDER=efa",
	"CUDA_VISIBLE_DEVICES=7", "CUDA_DEVICE_ORDER=FASTEST_FIRST", "CUDA_CACHE_PATH=/var/cache/cuda",
	"OMP_NUM_THREADS=64", "OPENBLAS_NUM_THREADS=64",
	"BERTD_GEMM=cublas", "BERTD_DDP_OVERLAP=0", "BERTD_PORT=9000", "BERTD_CONFIG=/etc/x.conf",
	"BERTD_LEVER_LN_VEC=0", NULL};

static void test_worker_env(void **state)
{
	(void)state;
	childenv_pass p;
	char why[300];
	assert_int_equal(childenv_pass_parse(&p, CHILDENV_DEFAULT_PASS, why, sizeof why), 0);
	device gpu = {.kind = DEVICE_CUDA, .index = 3, .name = "NVIDIA H200",
		      .uuid = "GPU-5f1c2b9e-0a4d-4e6f-9b1a-2c3d4e5f6a7b"};
	childenv *ce = NULL;
	assert_int_equal(childenv_worker(&ce, &p, &gpu, 2, daemon_env), 0);
	char *const *e = ce->envp;
	/* what the supervisor sets wins over the daemon's own values */
	assert_env(e, "CUDA_VISIBLE_DEVICES", "GPU-5f1c2b9e-0a4d-4e6f-9b1a-2c3d4e5f6a7b");
	assert_env(e, "CUDA_DEVICE_ORDER", "PCI_BUS_ID");
	assert_env(e, "OMP_NUM_THREADS", "2");
	assert_env(e, "OPENBLAS_NUM_THREADS", "2");
	assert_env(e, "PATH", "/usr/bin:/bin");
	/* the box's tuning reaches the worker */
	assert_env(e, "NCCL_SOCKET_IFNAME", "eth0");
	assert_env(e, "NCCL_IB_HCA", "mlx5_0,mlx5_1");
	assert_env(e, "NCCL_DEBUG", "WARN");
	assert_env(e, "FI_PROVIDER", "efa");
	assert_env(e, "LD_LIBRARY_PATH", "/usr/local/cuda/lib64");
	assert_env(e, "CUDA_CACHE_PATH", "/var/cache/cuda");
	assert_env(e, "BERTD_GEMM", "cublas");
	assert_env(e, "BERTD_DDP_OVERLAP", "0");
	assert_env(e, "BERTD_LEVER_LN_VEC", "0"); /* a speed lever switched off */
	/* and nothing unlisted */
	const char *out[] = {"HOME", "NOTIFY_SOCKET", "LD_PRELOAD", "SECRET_TOKEN", "BERTD_PORT",
			     "BERTD_CONFIG", "BERTD_ATTENTION"};
	for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
		if (env_value(e, out[i]))
			fail_msg("%s leaked into the worker's environment", out[i]);
	size_t n = 0;
	while (e[n])
		n++;
	assert_int_equal(n, 5 + 3 + 6); /* own + switches + passed */
	free(ce);

	/* no UUID from NVML: its index, which CUDA reads in PCI bus order */
	gpu.uuid[0] = 0;
	assert_int_equal(childenv_worker(&ce, &p, &gpu, 2, daemon_env), 0);
	assert_env(ce->envp, "CUDA_VISIBLE_DEVICES", "3");
	assert_env(ce->envp, "CUDA_DEVICE_ORDER", "PCI_BUS_ID");
	free(ce);
	device slot = {.kind = DEVICE_CPU, .index = 1, .name = "cpu"};
	assert_int_equal(childenv_worker(&ce, &p, &slot, 4, daemon_env), 0);
	assert_env(ce->envp, "CUDA_VISIBLE_DEVICES", "-1");
	assert_env(ce->envp, "OMP_NUM_THREADS", "4");
	free(ce);

	/* the daemon's environment names no interface: NCCL's bootstrap of a
	 * job on this machine stays on loopback (the unit allows only it) */
	char *no_ifname[] = {"NCCL_DEBUG=WARN", "LD_LIBRARY_PATH=/usr/local/cuda/lib64", NULL};
	assert_int_equal(childenv_pass_parse(&p, CHILDENV_DEFAULT_PASS, why, sizeof why), 0);
	assert_int_equal(childenv_worker(&ce, &p, &gpu, 2, no_ifname), 0);
	assert_env(ce->envp, "NCCL_SOCKET_IFNAME", "lo");
	assert_env(ce->envp, "NCCL_DEBUG", "WARN");
	free(ce);

	/* pass_env "": only what bertd sets (loopback for NCCL) and its own switches */
	assert_int_equal(childenv_pass_parse(&p, "", why, sizeof why), 0);
	assert_int_equal(childenv_worker(&ce, &p, &slot, 1, daemon_env), 0);
	assert_env(ce->envp, "NCCL_SOCKET_IFNAME", "lo");
	assert_null(env_value(ce->envp, "LD_LIBRARY_PATH"));
	assert_env(ce->envp, "BERTD_GEMM", "cublas");
	free(ce);
}

static void test_helper_env(void **state)
{
	(void)state;
	childenv_pass p;
	char why[300];
	assert_int_equal(childenv_pass_parse(&p, "LD_LIBRARY_PATH:NCCL_*:CUDA_*", why, sizeof why), 0);
	childenv *ce = NULL;
	assert_int_equal(childenv_helper(&ce, &p, daemon_env), 0);
	char *const *e = ce->envp;
	assert_env(e, "PATH", "/usr/bin:/bin");
	assert_env(e, "LD_LIBRARY_PATH", "/usr/local/cuda/lib64");
	assert_env(e, "NCCL_DEBUG", "WARN");
	assert_env(e, "CUDA_CACHE_PATH", "/var/cache/cuda");
	assert_null(env_value(e, "CUDA_VISIBLE_DEVICES")); /* a loader never sees a GPU's number */
	assert_null(env_value(e, "FI_PROVIDER"));          /* not listed here */
	assert_null(env_value(e, "BERTD_GEMM"));           /* a worker's switch */
	assert_null(env_value(e, "HOME"));
	free(ce);
	char *empty[] = {NULL};
	assert_int_equal(childenv_helper(&ce, &p, empty), 0);
	assert_string_equal(ce->envp[0], "PATH=/usr/bin:/bin");
	assert_null(ce->envp[1]);
	free(ce);
}

/* stall_timeout_s: 300 by default, set like any key, bounds enforced. */
static void test_stall_timeout(void **state)
{
	(void)state;
	config c;
	char errbuf[512] = "";
	char *argv[] = {"bertd", "--config", "/dev/null", NULL};
	char *envp[] = {NULL};
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), 0);
	assert_int_equal(c.stall_timeout_s, 300);
	char *argv2[] = {"bertd", "--config", "/dev/null", "--stall-timeout-s", "3", NULL};
	assert_int_equal(load(&c, 5, argv2, envp, errbuf, sizeof errbuf), 0);
	assert_int_equal(c.stall_timeout_s, 3);
	char *envp2[] = {"BERTD_STALL_TIMEOUT_S=45", NULL};
	assert_int_equal(load(&c, 3, argv, envp2, errbuf, sizeof errbuf), 0);
	assert_int_equal(c.stall_timeout_s, 45);
	char *argv3[] = {"bertd", "--config", "/dev/null", "--stall-timeout-s", "0", NULL};
	memset(errbuf, 0, sizeof errbuf);
	assert_int_equal(load(&c, 5, argv3, envp, errbuf, sizeof errbuf), -EINVAL);
	assert_non_null(strstr(errbuf, "stall_timeout_s"));
}

/* The shipped example config must parse and must mention every key. */
static void test_example_conf(void **state)
{
	(void)state;
	const char *root = getenv("BERTD_SOURCE_ROOT");
	assert_non_null(root);
	char path[1024];
	snprintf(path, sizeof path, "%s/systemd/bertd.conf", root);
	config c;
	char errbuf[512] = "";
	char *argv[] = {"bertd", "--config", path, NULL};
	char *envp[] = {NULL};
	assert_int_equal(load(&c, 3, argv, envp, errbuf, sizeof errbuf), 0);
	assert_string_equal(c.state_dir, "/var/lib/bertd");

	char help[8192] = "", text[16384] = "";
	FILE *out = fmemopen(help, sizeof help, "w");
	config_print_help(out, "bertd");
	fclose(out);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t n = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	text[n] = 0;
	/* every "--key" in --help has a "key =" line in the example */
	for (char *p = strstr(help, "  --"); p; p = strstr(p + 1, "  --")) {
		char key[64], want[80];
		if (sscanf(p + 4, "%63s", key) != 1)
			continue;
		snprintf(want, sizeof want, "%s =", key);
		assert_non_null(strstr(text, want));
	}
}

/* Data roots are checked, not required: each problem is one line naming
 * the root, and the errno says which problem it is. */
static void test_root_check(void **state)
{
	(void)state;
	char dir[300], missing[300], file[300], why[1400];
	snprintf(dir, sizeof dir, "%s/root", tmpdir);
	snprintf(missing, sizeof missing, "%s/absent", tmpdir);
	snprintf(file, sizeof file, "%s/plain", tmpdir);
	assert_int_equal(mkdir(dir, 0700), 0);
	write_file(file, "x");

	strcpy(why, "stale");
	assert_int_equal(config_root_check(dir, true, why, sizeof why), 0);
	assert_string_equal(why, "");
	assert_int_equal(config_root_check(missing, false, why, sizeof why), -ENOENT);
	assert_non_null(strstr(why, missing));
	assert_non_null(strstr(why, "does not exist"));
	assert_int_equal(config_root_check(file, false, why, sizeof why), -ENOTDIR);
	assert_non_null(strstr(why, file));

	/* Only the first root (need_write) must be writable; root ignores
	 * mode bits, so that half needs an unprivileged user. */
	assert_int_equal(chmod(dir, 0500), 0);
	assert_int_equal(config_root_check(dir, false, why, sizeof why), 0);
	if (geteuid() != 0) {
		assert_int_equal(config_root_check(dir, true, why, sizeof why), -EACCES);
		assert_non_null(strstr(why, dir));
		assert_non_null(strstr(why, "not writable"));
	}
	assert_int_equal(chmod(dir, 0700), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_relative_paths_absolute),
		cmocka_unit_test(test_precedence),
		cmocka_unit_test(test_errors_name_source),
		cmocka_unit_test(test_help_lists_every_key),
		cmocka_unit_test(test_token),
		cmocka_unit_test(test_stall_timeout),
		cmocka_unit_test(test_example_conf),
		cmocka_unit_test(test_pass_env_key),
		cmocka_unit_test(test_pass_env_matching),
		cmocka_unit_test(test_worker_env),
		cmocka_unit_test(test_helper_env),
		cmocka_unit_test(test_root_check),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
