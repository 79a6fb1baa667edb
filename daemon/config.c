/* config — see config.h. The table below is the single source of truth for
 * every setting; nothing else in the daemon parses configuration text. */
#include "daemon/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/childenv.h"

enum ctype { C_STR, C_INT, C_SIZE, C_BOOL };

typedef struct config_key {
	const char *name;
	enum ctype type;
	const char *def;   /* default, as text, parsed like any other source */
	long long min, max; /* bounds for C_INT / C_SIZE */
	size_t offset;     /* field in struct config */
	size_t cap;        /* buffer size for C_STR */
	const char *help;
	/* C_STR only, may be NULL: validates a value, -EINVAL with a reason */
	int (*check)(const char *v, char *why, size_t cap);
} config_key;

/* The keys a reload (SIGHUP) applies to the running daemon; every other key
 * is read at start only (docs/operations.md lists both). A key belongs here
 * only when each of its readers takes a change while running. */
static const char *const reloadable_keys[] = {
	"log_level", "max_body_bytes", "per_ip_limit", "request_timeout_s",
	"stop_timeout_s", "stall_timeout_s", "schedule",
	"retention_checkpoint_days", "retention_keep_exports", "retention_interval_s",
	"disk_ceiling_bytes", "disk_ceiling_percent", "tls_cert", "tls_key",
};

#define STR(f, def, help) {#f, C_STR, def, 0, 0, offsetof(config, f), sizeof(((config *)0)->f), help, NULL}
#define STRV(f, def, check, help) {#f, C_STR, def, 0, 0, offsetof(config, f), sizeof(((config *)0)->f), help, check}
#define INT(f, def, lo, hi, help) {#f, C_INT, def, lo, hi, offsetof(config, f), 0, help, NULL}
#define SIZE(f, def, lo, hi, help) {#f, C_SIZE, def, lo, hi, offsetof(config, f), 0, help, NULL}
#define BOOL(f, def, help) {#f, C_BOOL, def, 0, 1, offsetof(config, f), 0, help, NULL}
#define XSTR(x) #x
#define NUM(x) XSTR(x)

static int check_multinode_comm(const char *v, char *why, size_t cap)
{
	if (strcmp(v, "auto") == 0 || strcmp(v, "net") == 0)
		return 0;
	snprintf(why, cap, "must be \"auto\" or \"net\"");
	return -EINVAL;
}

static int check_pass_env(const char *v, char *why, size_t cap)
{
	childenv_pass p;
	return childenv_pass_parse(&p, v, why, cap);
}

#ifndef BERTD_DEFAULT_PORT
#define BERTD_DEFAULT_PORT 8420
#endif

static const config_key keys[] = {
	STR(listen, "127.0.0.1", "numeric IPv4/IPv6 address the REST API binds"),
	INT(port, NUM(BERTD_DEFAULT_PORT), 0, 65535, "TCP port of the REST API (0 = any free port)"),
	BOOL(allow_remote, "false", "allow a listen address other than loopback"),
	STR(state_dir, "./var", "database, token, job logs and checkpoints (systemd: /var/lib/bertd)"),
	STR(data_roots, "", "':'-separated directories corpora and datasets may live in (\"\" = <state_dir>/data)"),
	STR(token_file, "", "bearer token file, created 0600 on first start (\"\" = <state_dir>/token)"),
	STR(tokens_file, "", "named API tokens with roles, hashed (\"\" = <state_dir>/tokens)"),
	STR(log_level, "info", "error | warn | info | debug"),
	SIZE(max_body_bytes, "1048576", 1024, 1073741824LL, "largest request body accepted (bytes; 413 above)"),
	INT(api_threads, "4", 1, 256, "HTTP worker threads"),
	INT(conn_timeout_s, "30", 1, 3600, "idle HTTP connection timeout (seconds)"),
	INT(conn_limit, "256", 1, 65536, "concurrent HTTP connections, all clients"),
	INT(per_ip_limit, "64", 1, 65536,
	    "concurrent HTTP connections per client address (loopback clients share conn_limit)"),
	INT(request_timeout_s, "10", 1, 3600,
	    "seconds a client gets to send a request's headers and body (closed after)"),
	SIZE(conn_memory, "131072", 16384, 16777216, "memory per HTTP connection (bytes)"),
	INT(follow_max_per_job, "8", 1, 65536,
	    "open ?follow=1 streams (events, logs) per job; more get 429"),
	INT(follow_max_total, "32", 1, 65536, "open ?follow=1 streams in all; more get 429"),
	INT(follow_keepalive_s, "15", 1, 3600,
	    "a quiet follow stream gets a keep-alive comment this often (seconds)"),
	INT(api_db_wait_ms, "1500", 1, 60000,
	    "how long an API request waits for a locked database before 503 + Retry-After (ms)"),
	STR(devices, "auto", "auto (GPUs when NVML finds any, else CPU slots) | cpu | cuda"),
	INT(cpu_slots, "0", 0, 4096, "CPU worker slots when training on the CPU (0 = one per online CPU)"),
	STR(bin_dir, "", "directory of bertd-worker, bertd-loader, bertd-prepare (\"\" = next to bertd)"),
	INT(stop_timeout_s, "120", 1, 86400, "seconds a stopping job gets to checkpoint before SIGKILL"),
	INT(stall_timeout_s, "300", 1, 86400,
	    "seconds a training job's workers may report nothing before the attempt fails as stalled "
	    "(before the first step: at least 600)"),
	BOOL(schedule, "true", "start queued jobs; false holds the queue (maintenance, API tests)"),
	INT(prepare_concurrency, "-1", -1, 4096,
	    "dataset preparations (bertd-prepare) run at once, the rest wait as queued "
	    "(0 = one per online CPU; -1 = half of them, at least 1)"),
	STRV(pass_env, CHILDENV_DEFAULT_PASS, check_pass_env,
	     "variables of bertd's environment its children inherit: ':'-separated NAMEs and PREFIX*es"),
	STR(slurm_srun, "", "srun that starts multi-node jobs' workers (docs/multinode.md; \"\" = "
	    "multi-node jobs fail at start)"),
	STR(slurm_conf, "", "SLURM_CONF given to srun, sinfo and scancel (\"\" = Slurm's default)"),
	STR(relay_host, "", "address the workers of a multi-node job connect back to (\"\" = this "
	    "machine's hostname)"),
	STRV(multinode_comm, "auto", check_multinode_comm,
	     "data plane between a multi-node job's ranks: \"auto\" = shared memory when every rank is "
	     "on one host, else the network backend; \"net\" = the network backend always"),
	INT(slurm_immediate_s, "60", 1, 86400,
	    "seconds srun waits for a multi-node job's nodes before the attempt fails"),
	STR(nccl_path, "", "libnccl.so.2, or a directory holding it: the only place NCCL is looked for, "
	    "by the daemon and its workers (\"\" = the usual places: docs/cuda.md)"),
	INT(retention_checkpoint_days, "-1", -1, 36500,
	    "remove the checkpoints of jobs that ended at least this many days ago (0 = at the next "
	    "pass after they end; -1 = never)"),
	BOOL(retention_keep_exports, "true",
	     "keep a job's export when the retention policy removes its checkpoints (false: remove it too)"),
	INT(retention_interval_s, "600", 1, 86400,
	    "seconds between passes that apply the retention policy and measure job files' disk use"),
	SIZE(disk_ceiling_bytes, "0", 0, 9223372036854775807LL,
	     "refuse new jobs (507) while job files take this many bytes or more (0 = no ceiling)"),
	INT(disk_ceiling_percent, "0", 0, 100,
	    "refuse new jobs (507) while state_dir's file system is this percent full or more (0 = no ceiling)"),
	STR(shared_group, "", "group that may read job files (exports, logs, TensorBoard events): job "
	    "directories are made setgid to it and files group-readable (\"\" = owner only)"),
	BOOL(slurm_gpus_per_node, "false",
	     "pass --gpus-per-node to srun for a GPU multi-node job (clusters that schedule GPUs as GRES)"),
	INT(relay_timeout_s, "30", 1, 3600,
	    "seconds a multi-node rank's relay connection may go unanswered (a node cut off) before the "
	    "daemon and the rank each count it lost"),
	STR(tls_cert, "", "PEM certificate (chain) file: the API speaks HTTPS with it (\"\" = plain "
	    "HTTP); reread on SIGHUP"),
	STR(tls_key, "", "PEM private key file of tls_cert (set both or neither); reread on SIGHUP"),
};
#define N_KEYS (sizeof keys / sizeof keys[0])

/* Canonical key name: lower case, '-' folded to '_'. */
static void canon(char *dst, size_t cap, const char *src, size_t n)
{
	size_t i = 0;
	for (; i + 1 < cap && i < n && src[i]; i++)
		dst[i] = src[i] == '-' ? '_' : (char)tolower((unsigned char)src[i]);
	dst[i] = 0;
}

static const config_key *find_key(const char *name, size_t n)
{
	char c[64];
	if (n >= sizeof c)
		return NULL;
	canon(c, sizeof c, name, n);
	for (size_t i = 0; i < N_KEYS; i++)
		if (strcmp(keys[i].name, c) == 0)
			return &keys[i];
	return NULL;
}

static int parse_bool(const char *v, bool *out)
{
	static const char *const yes[] = {"1", "true", "yes", "on"};
	static const char *const no[] = {"0", "false", "no", "off"};
	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(v, yes[i]) == 0) { *out = true; return 0; }
		if (strcasecmp(v, no[i]) == 0) { *out = false; return 0; }
	}
	return -EINVAL;
}

/* Sets one key from text; src names where the text came from for errors. */
static int set_value(config *cfg, const config_key *k, const char *v, const char *src, FILE *err)
{
	char *field = (char *)cfg + k->offset;
	switch (k->type) {
	case C_STR:
		if (strlen(v) >= k->cap) {
			fprintf(err, "bertd: %s: %s is too long (at most %zu bytes)\n", src, k->name, k->cap - 1);
			return -EINVAL;
		}
		char why[300];
		if (k->check && k->check(v, why, sizeof why) < 0) {
			fprintf(err, "bertd: %s: %s: %s\n", src, k->name, why);
			return -EINVAL;
		}
		memcpy(field, v, strlen(v) + 1);
		return 0;
	case C_BOOL:
		if (parse_bool(v, (bool *)field) < 0) {
			fprintf(err, "bertd: %s: %s must be true or false, not \"%s\"\n", src, k->name, v);
			return -EINVAL;
		}
		return 0;
	case C_INT:
	case C_SIZE: {
		char *end;
		errno = 0;
		long long x = strtoll(v, &end, 10);
		if (errno || end == v || *end || x < k->min || x > k->max) {
			fprintf(err, "bertd: %s: %s must be an integer in [%lld, %lld], not \"%s\"\n",
				src, k->name, k->min, k->max, v);
			return -EINVAL;
		}
		if (k->type == C_INT)
			*(int *)field = (int)x;
		else
			*(size_t *)field = (size_t)x;
		return 0;
	}
	}
	return -EINVAL;
}

static char *trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	char *e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = 0;
	return s;
}

static int load_file(config *cfg, const char *path, bool must_exist, FILE *err)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		if (!must_exist && errno == ENOENT)
			return 0;
		fprintf(err, "bertd: cannot read config file %s: %s\n", path, strerror(errno));
		return -EINVAL;
	}
	snprintf(cfg->config_file, sizeof cfg->config_file, "%s", path);
	char line[8192];
	int lineno = 0, rc = 0;
	while (fgets(line, sizeof line, f)) {
		lineno++;
		char src[1200];
		snprintf(src, sizeof src, "%s:%d", path, lineno);
		if (!strchr(line, '\n') && !feof(f)) {
			fprintf(err, "bertd: %s: line too long\n", src);
			rc = -EINVAL;
			break;
		}
		char *s = trim(line);
		if (!*s || *s == '#')
			continue;
		char *eq = strchr(s, '=');
		if (!eq) {
			fprintf(err, "bertd: %s: expected \"key = value\"\n", src);
			rc = -EINVAL;
			break;
		}
		*eq = 0;
		char *name = trim(s), *val = trim(eq + 1);
		size_t vl = strlen(val);
		if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
			val[vl - 1] = 0;
			val++;
		}
		const config_key *k = find_key(name, strlen(name));
		if (!k) {
			fprintf(err, "bertd: %s: unknown key \"%s\" (see bertd --help)\n", src, name);
			rc = -EINVAL;
			break;
		}
		if ((rc = set_value(cfg, k, val, src, err)) < 0)
			break;
	}
	fclose(f);
	return rc;
}

/* Finds --config in argv (it decides which file is read before the rest);
 * given more than once, the last one counts, as for every other option. */
static const char *argv_config(int argc, char **argv)
{
	const char *file = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
			file = argv[++i];
		else if (strncmp(argv[i], "--config=", 9) == 0)
			file = argv[i] + 9;
	}
	return file;
}

/* Makes a relative path absolute against the daemon's cwd, once, at start:
 * every path the API later shows (model_dir, checkpoints, dataset paths) is
 * built from these, and a relative one means nothing to a client in another
 * directory. Leading "./" components are dropped. -ENAMETOOLONG if the
 * result does not fit in cap, -errno if the cwd cannot be read. */
static int absolutize(char *p, size_t cap)
{
	if (p[0] == '/' || !p[0])
		return 0;
	const char *rest = p;
	while (rest[0] == '.' && (rest[1] == '/' || rest[1] == 0))
		for (rest += 1; *rest == '/'; rest++)
			;
	char cwd[4096], out[4096];
	if (!getcwd(cwd, sizeof cwd))
		return -errno;
	int n = snprintf(out, sizeof out, "%s%s%s", cwd, rest[0] && strcmp(cwd, "/") ? "/" : "", rest);
	if (n < 0 || (size_t)n >= cap || (size_t)n >= sizeof out)
		return -ENAMETOOLONG;
	memcpy(p, out, (size_t)n + 1);
	return 0;
}

static int finish(config *cfg, FILE *err)
{
	enum log_level lvl;
	if (log_level_parse(cfg->log_level, &lvl) < 0) {
		fprintf(err, "bertd: log_level must be error, warn, info or debug, not \"%s\"\n", cfg->log_level);
		return -EINVAL;
	}
	if (strcmp(cfg->devices, "auto") && strcmp(cfg->devices, "cpu") && strcmp(cfg->devices, "cuda")) {
		fprintf(err, "bertd: devices must be auto, cpu or cuda, not \"%s\"\n", cfg->devices);
		return -EINVAL;
	}
	if (!cfg->state_dir[0]) {
		fprintf(err, "bertd: state_dir must not be empty\n");
		return -EINVAL;
	}
	if (!cfg->tls_cert[0] != !cfg->tls_key[0]) {
		fprintf(err, "bertd: %s is set but %s is not: HTTPS needs both (or neither, for plain HTTP)\n",
			cfg->tls_cert[0] ? "tls_cert" : "tls_key", cfg->tls_cert[0] ? "tls_key" : "tls_cert");
		return -EINVAL;
	}
	if (absolutize(cfg->tls_cert, sizeof cfg->tls_cert) < 0 ||
	    absolutize(cfg->tls_key, sizeof cfg->tls_key) < 0) {
		fprintf(err, "bertd: tls_cert or tls_key is too long once made absolute\n");
		return -EINVAL;
	}
	if (absolutize(cfg->state_dir, sizeof cfg->state_dir) < 0 ||
	    absolutize(cfg->token_file, sizeof cfg->token_file) < 0) {
		fprintf(err, "bertd: state_dir or token_file is too long once made absolute\n");
		return -EINVAL;
	}
	if (!cfg->token_file[0]) {
		int n = snprintf(cfg->token_file, sizeof cfg->token_file, "%s/token", cfg->state_dir);
		if (n < 0 || (size_t)n >= sizeof cfg->token_file) {
			fprintf(err, "bertd: state_dir is too long\n");
			return -EINVAL;
		}
	}
	if (absolutize(cfg->tokens_file, sizeof cfg->tokens_file) < 0) {
		fprintf(err, "bertd: tokens_file is too long once made absolute\n");
		return -EINVAL;
	}
	if (!cfg->tokens_file[0]) {
		int n = snprintf(cfg->tokens_file, sizeof cfg->tokens_file, "%s/tokens", cfg->state_dir);
		if (n < 0 || (size_t)n >= sizeof cfg->tokens_file) {
			fprintf(err, "bertd: state_dir is too long\n");
			return -EINVAL;
		}
	}
	if (!cfg->data_roots[0]) {
		int n = snprintf(cfg->roots_buf, sizeof cfg->roots_buf, "%s/data", cfg->state_dir);
		if (n < 0 || (size_t)n >= sizeof cfg->roots_buf) {
			fprintf(err, "bertd: state_dir is too long\n");
			return -EINVAL;
		}
	} else {
		memcpy(cfg->roots_buf, cfg->data_roots, sizeof cfg->roots_buf);
	}
	cfg->n_roots = 0;
	char *save = NULL;
	for (char *r = strtok_r(cfg->roots_buf, ":", &save); r; r = strtok_r(NULL, ":", &save)) {
		if (!*r)
			continue;
		if (cfg->n_roots == CONFIG_MAX_DATA_ROOTS) {
			fprintf(err, "bertd: data_roots: at most %d directories\n", CONFIG_MAX_DATA_ROOTS);
			return -EINVAL;
		}
		cfg->roots[cfg->n_roots++] = r;
	}
	/* Rebuilt absolute, NUL-separated, into roots_buf. */
	char abs_roots[sizeof cfg->roots_buf];
	size_t used = 0;
	for (size_t i = 0; i < cfg->n_roots; i++) {
		char one[sizeof cfg->roots_buf];
		snprintf(one, sizeof one, "%s", cfg->roots[i]);
		size_t len;
		if (absolutize(one, sizeof one) < 0 || (len = strlen(one)) + 1 > sizeof abs_roots - used) {
			fprintf(err, "bertd: data_roots are too long once made absolute\n");
			return -EINVAL;
		}
		memcpy(abs_roots + used, one, len + 1);
		used += len + 1;
	}
	memcpy(cfg->roots_buf, abs_roots, used);
	for (size_t i = 0, off = 0; i < cfg->n_roots; i++) {
		cfg->roots[i] = cfg->roots_buf + off;
		off += strlen(cfg->roots[i]) + 1;
	}
	return 0;
}

int config_load(config *cfg, int argc, char **argv, char **envp, FILE *out, FILE *err)
{
	int rc;
	memset(cfg, 0, sizeof *cfg);
	for (size_t i = 0; i < N_KEYS; i++)
		if ((rc = set_value(cfg, &keys[i], keys[i].def, "default", err)) < 0)
			return rc;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			config_print_help(out, argv[0]);
			return 1;
		}
		if (strcmp(argv[i], "--version") == 0) {
			fprintf(out, "bertd %s\n", BERTD_VERSION);
			return 1;
		}
	}

	const char *file = argv_config(argc, argv);
	const char *env_file = NULL;
	for (char **e = envp; e && *e; e++)
		if (strncmp(*e, "BERTD_CONFIG=", 13) == 0)
			env_file = *e + 13;
	if (file)
		rc = load_file(cfg, file, true, err);
	else if (env_file)
		rc = load_file(cfg, env_file, true, err);
	else
		rc = load_file(cfg, CONFIG_DEFAULT_FILE, false, err);
	if (rc < 0)
		return rc;

	for (char **e = envp; e && *e; e++) {
		if (strncmp(*e, "BERTD_", 6) != 0 || strncmp(*e, "BERTD_CONFIG=", 13) == 0)
			continue;
		const char *name = *e + 6, *eq = strchr(name, '=');
		if (!eq)
			continue;
		const config_key *k = find_key(name, (size_t)(eq - name));
		if (!k)
			continue; /* other BERTD_* variables belong to children and tests */
		char src[80];
		snprintf(src, sizeof src, "environment BERTD_%.*s", (int)(eq - name), name);
		if ((rc = set_value(cfg, k, eq + 1, src, err)) < 0)
			return rc;
	}

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strncmp(a, "--", 2) != 0) {
			fprintf(err, "bertd: unexpected argument \"%s\" (see bertd --help)\n", a);
			return -EINVAL;
		}
		a += 2;
		const char *eq = strchr(a, '=');
		size_t n = eq ? (size_t)(eq - a) : strlen(a);
		const char *val = eq ? eq + 1 : NULL;
		bool is_config = n == 6 && strncmp(a, "config", 6) == 0;
		const config_key *k = is_config ? NULL : find_key(a, n);
		if (!k && !is_config) {
			fprintf(err, "bertd: unknown option --%.*s (see bertd --help)\n", (int)n, a);
			return -EINVAL;
		}
		if (!val) {
			if (k && k->type == C_BOOL && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
				val = "true"; /* bare --allow-remote */
			} else if (i + 1 >= argc) {
				fprintf(err, "bertd: option --%.*s needs a value\n", (int)n, a);
				return -EINVAL;
			} else {
				val = argv[++i];
			}
		}
		if (is_config)
			continue;
		char src[80];
		snprintf(src, sizeof src, "option --%.*s", (int)(n < 40 ? n : 40), a);
		if ((rc = set_value(cfg, k, val, src, err)) < 0)
			return rc;
	}
	return finish(cfg, err);
}

void config_print_help(FILE *out, const char *prog)
{
	fprintf(out,
		"usage: %s [--config FILE] [--KEY VALUE | --KEY=VALUE]... [--help] [--version]\n\n"
		"bertd pretrains BERT masked language models; jobs are submitted over its REST API.\n"
		"Settings come from the built-in default, then the config file (default %s,\n"
		"or $BERTD_CONFIG), then environment variables BERTD_<KEY>, then options.\n\n"
		"keys:\n", prog, CONFIG_DEFAULT_FILE);
	for (size_t i = 0; i < N_KEYS; i++) {
		const config_key *k = &keys[i];
		fprintf(out, "  --%-16s %s\n  %-18s default: \"%s\"", k->name, k->help, "", k->def);
		if (k->type == C_INT || k->type == C_SIZE)
			fprintf(out, ", range %lld..%lld", k->min, k->max);
		fprintf(out, "%s\n", config_key_reloadable(k->name) ? "; reloaded on SIGHUP" : "");
	}
}

void config_print(const config *cfg, FILE *out)
{
	for (size_t i = 0; i < N_KEYS; i++) {
		const config_key *k = &keys[i];
		const char *field = (const char *)cfg + k->offset;
		switch (k->type) {
		case C_STR: fprintf(out, "%s = %s\n", k->name, field); break;
		case C_INT: fprintf(out, "%s = %d\n", k->name, *(const int *)field); break;
		case C_SIZE: fprintf(out, "%s = %zu\n", k->name, *(const size_t *)field); break;
		case C_BOOL: fprintf(out, "%s = %s\n", k->name, *(const bool *)field ? "true" : "false"); break;
		}
	}
}

int config_root_check(const char *root, bool need_write, char *why, size_t cap)
{
	struct stat st;
	int rc = 0;
	if (stat(root, &st) < 0) {
		rc = -errno;
		if (rc == -ENOENT)
			snprintf(why, cap, "data root %s does not exist: paths under it are refused "
				 "until it is created", root);
		else
			snprintf(why, cap, "data root %s cannot be read: %s", root, strerror(-rc));
	} else if (!S_ISDIR(st.st_mode)) {
		rc = -ENOTDIR;
		snprintf(why, cap, "data root %s is not a directory", root);
	} else if (access(root, R_OK | X_OK) < 0) {
		rc = -errno;
		snprintf(why, cap, "data root %s cannot be read by bertd: %s", root, strerror(-rc));
	} else if (need_write && access(root, W_OK | X_OK) < 0) {
		/* EROFS is what ProtectSystem=strict looks like from inside. */
		rc = -errno;
		snprintf(why, cap, "data root %s is not writable (%s), but datasets are written "
			 "under the first data root%s", root, strerror(-rc),
			 rc == -EROFS ? "; under systemd add ReadWritePaths= for it in a drop-in "
					"(systemd/bertd.service.d/)" : "");
	}
	if (rc == 0 && cap)
		why[0] = 0;
	return rc;
}

bool config_key_reloadable(const char *key)
{
	for (size_t i = 0; i < sizeof reloadable_keys / sizeof reloadable_keys[0]; i++)
		if (strcmp(reloadable_keys[i], key) == 0)
			return true;
	return false;
}

static bool same_value(const config_key *k, const config *a, const config *b)
{
	const char *fa = (const char *)a + k->offset, *fb = (const char *)b + k->offset;
	switch (k->type) {
	case C_STR: return strcmp(fa, fb) == 0;
	case C_INT: return *(const int *)fa == *(const int *)fb;
	case C_SIZE: return *(const size_t *)fa == *(const size_t *)fb;
	case C_BOOL: return *(const bool *)fa == *(const bool *)fb;
	}
	return false;
}

int config_each_change(const config *a, const config *b,
		       void (*fn)(void *arg, const char *key, bool reloadable), void *arg)
{
	int n = 0;
	for (size_t i = 0; i < N_KEYS; i++) {
		if (same_value(&keys[i], a, b))
			continue;
		n++;
		if (fn)
			fn(arg, keys[i].name, config_key_reloadable(keys[i].name));
	}
	return n;
}

void config_copy_reloadable(config *dst, const config *src)
{
	for (size_t i = 0; i < N_KEYS; i++) {
		const config_key *k = &keys[i];
		if (!config_key_reloadable(k->name))
			continue;
		size_t size = k->type == C_STR ? k->cap : k->type == C_INT ? sizeof(int)
			      : k->type == C_SIZE ? sizeof(size_t) : sizeof(bool);
		memcpy((char *)dst + k->offset, (const char *)src + k->offset, size);
	}
}
