/* cluster — see cluster.h. */
#include "daemon/cluster.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"

int cluster_attempt_open(cluster_attempt *a, const char *relay_host, const char *job_id)
{
	unsigned char rnd[CLUSTER_TOKEN_HEX / 2];
	a->listen_fd = -1;
	if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
		return -EIO;
	for (size_t i = 0; i < sizeof rnd; i++)
		snprintf(a->token + 2 * i, 3, "%02x", rnd[i]);
	snprintf(a->slurm_name, sizeof a->slurm_name, "bertd-%.40s-%.8s", job_id, a->token);

	char host[256] = "";
	if (relay_host && *relay_host)
		snprintf(host, sizeof host, "%s", relay_host);
	else if (gethostname(host, sizeof host - 1) < 0)
		return -errno;
	struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_addr = in6addr_any};
	struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
	struct sockaddr *sa = (struct sockaddr *)&a6;
	socklen_t len = sizeof a6;
	int family = AF_INET6;
	if (inet_pton(AF_INET, host, &a4.sin_addr) == 1) {
		sa = (struct sockaddr *)&a4;
		len = sizeof a4;
		family = AF_INET;
	} else if (inet_pton(AF_INET6, host, &a6.sin6_addr) != 1) {
		a6.sin6_addr = in6addr_any; /* a name: every address, v4 mapped too */
	}
	int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int rc = 0;
	if (bind(fd, sa, len) < 0 || listen(fd, 64) < 0 || getsockname(fd, sa, &len) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	int port = family == AF_INET ? ntohs(a4.sin_port) : ntohs(a6.sin6_port);
	bool v6lit = strchr(host, ':') != NULL;
	snprintf(a->addr, sizeof a->addr, "%s%s%s:%d", v6lit ? "[" : "", host, v6lit ? "]" : "", port);
	a->listen_fd = fd;
	return 0;
}

void cluster_attempt_close(cluster_attempt *a)
{
	if (a->listen_fd >= 0)
		close(a->listen_fd);
	a->listen_fd = -1;
}

bool cluster_token_ok(const cluster_attempt *a, const char *token)
{
	if (!token || strlen(token) != CLUSTER_TOKEN_HEX)
		return false;
	unsigned char diff = 0;
	for (size_t i = 0; i < CLUSTER_TOKEN_HEX; i++)
		diff |= (unsigned char)(a->token[i] ^ token[i]);
	return diff == 0;
}

void cluster_srun_argv(cluster_argv *out, const char *srun, int nodes, int per_node, int immediate_s,
		       const cluster_attempt *a, const char *worker_bin, const char *job_json)
{
	static char job_opt[] = "--job";
	/* --opt=value throughout: srun's --immediate takes an optional value */
	snprintf(out->num[0], sizeof out->num[0], "--nodes=%d", nodes);
	snprintf(out->num[1], sizeof out->num[1], "--ntasks-per-node=%d", per_node);
	snprintf(out->num[2], sizeof out->num[2], "--immediate=%d", immediate_s);
	snprintf(out->num[3], sizeof out->num[3], "--job-name=%s", a->slurm_name);
	int n = 0;
	out->argv[n++] = (char *)srun;
	out->argv[n++] = out->num[0];
	out->argv[n++] = out->num[1];
	out->argv[n++] = out->num[2];
	out->argv[n++] = out->num[3];
	out->argv[n++] = (char *)worker_bin;
	out->argv[n++] = job_opt;
	out->argv[n++] = (char *)job_json;
	out->argv[n] = NULL;
}

int cluster_srun_env(cluster_env **out, char *const base[], int threads, const cluster_attempt *a,
		     const char *slurm_conf)
{
	size_t nb = 0;
	while (base[nb])
		nb++;
	cluster_env *e = calloc(1, sizeof *e + (nb + CLUSTER_ENV_OWN + 1) * sizeof(char *));
	if (!e)
		return -ENOMEM;
	int k = 0;
	snprintf(e->own[k++], sizeof e->own[0], "OMP_NUM_THREADS=%d", threads);
	snprintf(e->own[k++], sizeof e->own[0], "OPENBLAS_NUM_THREADS=%d", threads);
	snprintf(e->own[k++], sizeof e->own[0], "BERTD_RELAY=%s", a->addr);
	snprintf(e->own[k++], sizeof e->own[0], "BERTD_RELAY_TOKEN=%s", a->token);
	if (slurm_conf && *slurm_conf)
		snprintf(e->own[k++], sizeof e->own[0], "SLURM_CONF=%s", slurm_conf);
	size_t n = 0;
	for (int i = 0; i < k; i++)
		e->envp[n++] = e->own[i];
	for (size_t i = 0; i < nb; i++)
		e->envp[n++] = base[i];
	e->envp[n] = NULL;
	*out = e;
	return 0;
}

int cluster_dataset_verdict(const char (*node)[64], const char (*sha)[CLUSTER_TOKEN_HEX + 1], int world,
			    const char *dataset, char *why, size_t cap)
{
	for (int i = 0; i < world; i++) {
		if (sha[i][0])
			continue;
		snprintf(why, cap, "dataset \"%s\" is missing on node %s (no readable manifest.json at the job's "
			 "dataset path there)", dataset, node[i]);
		return -ENOENT;
	}
	for (int i = 1; i < world; i++) {
		if (strcmp(sha[i], sha[0]) == 0)
			continue;
		snprintf(why, cap,
			 "dataset \"%s\" differs between nodes: %s has content digest %.12s, %s has %.12s (every "
			 "node needs the same prepared dataset)",
			 dataset, node[0], sha[0], node[i], sha[i]);
		return -EINVAL;
	}
	return 0;
}

void cluster_scancel(const cluster_attempt *a, const char *srun, const char *slurm_conf)
{
	char bin[1100] = "scancel", name[128], conf[1100] = "";
	const char *slash = srun ? strrchr(srun, '/') : NULL;
	if (slash)
		snprintf(bin, sizeof bin, "%.*s/scancel", (int)(slash - srun), srun);
	snprintf(name, sizeof name, "--name=%s", a->slurm_name);
	if (slurm_conf && *slurm_conf)
		snprintf(conf, sizeof conf, "SLURM_CONF=%s", slurm_conf);
	char *argv[] = {bin, "--quiet", name, NULL};
	char *envp[] = {"PATH=/usr/bin:/bin", conf[0] ? conf : NULL, NULL};
	/* Twice forked: the grandchild belongs to init, the daemon waits
	 * only for the short-lived middle one. */
	pid_t pid = fork();
	if (pid < 0) {
		log_warn("scancel %s: fork: %s", a->slurm_name, strerror(errno));
		return;
	}
	if (pid == 0) {
		if (fork() == 0) {
			int dn = open("/dev/null", O_RDWR);
			if (dn >= 0) {
				dup2(dn, 0);
				dup2(dn, 1);
				dup2(dn, 2);
			}
			execve(bin, argv, envp);
			if (!slash)
				execvpe(bin, argv, envp);
			_exit(127);
		}
		_exit(0);
	}
	waitpid(pid, NULL, 0);
}
