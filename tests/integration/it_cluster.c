/* it_cluster — see it_cluster.h. */
#include "it_cluster.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

int it_cluster_skip(const char *script, bool need_net)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "%s check /nonexistent", script);
	int st = system(cmd);
	if (!WIFEXITED(st) || WEXITSTATUS(st) == 77)
		return 77;
	const char *gloo = getenv("BERTD_HAVE_GLOO");
	if (need_net && gloo && strcmp(gloo, "1") != 0) {
		fprintf(stderr, "skip: bertd-worker was built without libgloo-dev (no network comm backend)\n");
		return 77;
	}
	return 0;
}

int it_free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	int port = -1;
	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, len) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

int it_cluster_init(it_cluster *c, const char *script)
{
	if (bertd_init(&c->d))
		return -1;
	c->script = script;
	snprintf(c->data, sizeof c->data, "%s/data", c->d.root);
	snprintf(c->slurm, sizeof c->slurm, "%s/slurm", c->d.root);
	snprintf(c->conf, sizeof c->conf, "%s/slurm.conf", c->slurm);
	if (mkdir(c->data, 0700) < 0 || mkdir(c->slurm, 0700) < 0)
		return -1;
	return 0;
}

int it_cluster_start_slurm(it_cluster *c, int nodes)
{
	char ports[128] = "";
	size_t n = 0;
	for (int i = 0; i <= nodes && n < sizeof ports; i++)
		n += (size_t)snprintf(ports + n, sizeof ports - n, " %d", it_free_port());
	char args[200];
	snprintf(args, sizeof args, "%s >/dev/null", ports);
	if (it_cluster_do(c, NULL, "start", args) != 0) {
		fprintf(stderr, "the private Slurm cluster did not start (%s start %s%s)\n", c->script, c->slurm,
			ports);
		return -1;
	}
	return 0;
}

int it_cluster_do(const it_cluster *c, const char *env, const char *what, const char *args)
{
	char cmd[1000];
	snprintf(cmd, sizeof cmd, "%s %s %s %s %s", env ? env : "", c->script, what, c->slurm, args ? args : "");
	int st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int it_cluster_start_daemon(it_cluster *c, const char *const *extra, int deadline_s)
{
	const char *base[] = {"--data-roots", c->data, "--schedule", "true", "--stop-timeout-s", "60",
			      "--slurm-srun", "/usr/bin/srun", "--slurm-conf", c->conf};
	const char *args[64];
	size_t n = 0;
	for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
		args[n++] = base[i];
	for (size_t i = 0; extra && extra[i] && n + 1 < sizeof args / sizeof args[0]; i++)
		args[n++] = extra[i];
	args[n] = NULL;
	if (bertd_start(&c->d, args))
		return -1;
	it_make_corpus(c->data, "shakes.txt", 3000);
	if (it_add_dataset(&c->d,
			   "{\"name\":\"shakes\",\"source\":\"shakes.txt\",\"vocab\":{\"train\":{\"vocab_size\":400}}}"))
		return -1;
	it_wait_dataset_ready(&c->d, "shakes", deadline_s);
	return 0;
}

char *it_cluster_submit(it_cluster *c, char *spec)
{
	char *id = it_submit(&c->d, spec);
	free(spec);
	return id;
}

void it_cluster_run_to_end(it_cluster *c, char *spec, char sha[65], char **id_out, int deadline_s)
{
	char *id = it_cluster_submit(c, spec);
	json_t *j = it_wait_job(&c->d, id, "completed|failed|canceled", deadline_s);
	it_assert_completed(&c->d, j);
	it_sha_of_export(j, sha);
	json_decref(j);
	if (id_out)
		*id_out = id;
	else
		free(id);
}

void it_cluster_node_state(const it_cluster *c, const char *node, const char *state)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "SLURM_CONF=%s scontrol update nodename=%s state=%s%s", c->conf, node, state,
		 strcmp(state, "down") == 0 ? " reason=test" : "");
	assert_int_equal(system(cmd), 0);
}

void it_cluster_wait_node(const it_cluster *c, const char *node, const char *want, int deadline_s)
{
	char cmd[600], got[64] = "";
	snprintf(cmd, sizeof cmd, "SLURM_CONF=%s sinfo -h -n %s -o %%t", c->conf, node);
	for (int i = 0; i < deadline_s * 10; i++) {
		FILE *p = popen(cmd, "r");
		assert_non_null(p);
		if (!fgets(got, sizeof got, p))
			got[0] = '\0';
		pclose(p);
		got[strcspn(got, "\n")] = '\0';
		if (strcmp(got, want) == 0)
			return;
		poll(NULL, 0, 100);
	}
	fail_msg("node %s stayed \"%s\", not \"%s\"", node, got, want);
}

int it_cluster_ranks_on_net(const it_cluster *c, const char *id, const char *host)
{
	char path[400], line[1024], want[128];
	snprintf(path, sizeof path, "%s/jobs/%s/logs/srun.log", c->d.state_dir, id);
	snprintf(want, sizeof want, "comm over the network from %s", host);
	FILE *fp = fopen(path, "r");
	int n = 0;
	while (fp && fgets(line, sizeof line, fp))
		n += strstr(line, want) != NULL;
	if (fp)
		fclose(fp);
	return n;
}

int it_count_files(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d)))
		n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	if (d)
		closedir(d);
	return n;
}

int it_env_of(pid_t pid, const char *name, char *out, size_t cap)
{
	char path[64], buf[65536];
	snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
	FILE *fp = fopen(path, "r");
	if (!fp)
		return -1;
	size_t n = fread(buf, 1, sizeof buf - 1, fp);
	fclose(fp);
	buf[n] = 0;
	size_t nl = strlen(name);
	for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
		if (strncmp(buf + i, name, nl) == 0 && buf[i + nl] == '=') {
			snprintf(out, cap, "%s", buf + i + nl + 1);
			return 0;
		}
	}
	return -1;
}

/* /proc/pid/stat's text after the command's closing parenthesis into buf;
 * a pointer to it, or NULL. */
static const char *stat_tail(pid_t pid, char *buf, size_t cap)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	FILE *fp = fopen(path, "r");
	if (!fp)
		return NULL;
	size_t n = fread(buf, 1, cap - 1, fp);
	fclose(fp);
	buf[n] = 0;
	const char *rp = strrchr(buf, ')');
	return rp && rp[1] == ' ' ? rp + 2 : NULL;
}

pid_t it_ppid_of(pid_t pid)
{
	char buf[512], st;
	int pp = -1;
	const char *t = stat_tail(pid, buf, sizeof buf);
	if (!t || sscanf(t, "%c %d", &st, &pp) != 2)
		return -1;
	return pp;
}

bool it_alive(pid_t pid)
{
	char buf[512];
	const char *t = stat_tail(pid, buf, sizeof buf);
	return t && *t != 'Z' && *t != 'X';
}

pid_t it_rank_on(const char *id, const char *node)
{
	pid_t p[16];
	int n = it_find_pids("bertd-worker", id, p, 16);
	for (int i = 0; i < n; i++) {
		char v[64];
		if (it_env_of(p[i], "SLURMD_NODENAME", v, sizeof v) == 0 && strcmp(v, node) == 0)
			return p[i];
	}
	return -1;
}
