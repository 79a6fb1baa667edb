/* config — the daemon's settings: one table (name, type, default, bounds,
 * help, target field) from which file parsing, environment and command-line
 * overrides, validation, --help and printing all come.
 *
 * Precedence: built-in default < config file < environment (BERTD_<KEY>)
 * < command line (--key value | --key=value; '-' and '_' are the same).
 * The file is "key = value" lines, '#' comments, blank lines ignored.
 */
#ifndef BERTD_DAEMON_CONFIG_H
#define BERTD_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define CONFIG_DEFAULT_FILE "/etc/bertd/bertd.conf"
#define CONFIG_MAX_DATA_ROOTS 16

typedef struct config {
	char listen[64];         /* numeric address to bind */
	int port;                /* 0 = any free port */
	bool allow_remote;       /* allow a non-loopback listen address */
	char state_dir[1024];    /* database, token, logs, checkpoints; absolute after config_load */
	char data_roots[4096];   /* ':'-separated allowed input/output roots */
	char token_file[1024];   /* "" = <state_dir>/token */
	char tokens_file[1024];  /* named tokens (daemon/tokens.h); "" = <state_dir>/tokens */
	char log_level[16];
	size_t max_body_bytes;
	int api_threads;
	int conn_timeout_s;
	int conn_limit;
	int per_ip_limit;
	int request_timeout_s;   /* deadline for receiving a request's headers and body */
	size_t conn_memory;
	int follow_max_per_job;  /* open follow streams per job (429 above) */
	int follow_max_total;    /* open follow streams in all (429 above) */
	int follow_keepalive_s;  /* keep-alive comment interval of a quiet follow stream */
	int api_db_wait_ms;      /* how long an API request waits for the database lock (then 503) */
	char devices[8];         /* auto | cpu | cuda */
	int cpu_slots;           /* CPU worker slots; 0 = one per online CPU */
	char bin_dir[1024];      /* where bertd-worker/-loader/-prepare are; "" = next to bertd */
	int stop_timeout_s;      /* grace for a stopping job to checkpoint */
	int stall_timeout_s;     /* a running job whose workers say nothing this long is stalled */
	bool schedule;           /* false: accept and queue jobs, start none (maintenance) */
	int prepare_concurrency; /* bertd-prepare processes at once; 0 = one per CPU, -1 = half (>= 1) */
	char pass_env[1024];     /* what children inherit of the daemon's environment (childenv.h) */
	char slurm_srun[1024];   /* srun for multi-node jobs (docs/multinode.md); "" = none */
	char slurm_conf[1024];   /* SLURM_CONF for srun/scancel; "" = Slurm's default */
	char relay_host[256];    /* address workers on other nodes reach this daemon at; "" = hostname */
	char multinode_comm[8];  /* multi-node ranks' data plane: "auto" or "net" (docs/multinode.md) */
	int slurm_immediate_s;   /* srun --immediate: how long to wait for the nodes */
	char nccl_path[1024];    /* libnccl.so.2 or its directory, the only place looked; "" = search */
	int retention_checkpoint_days; /* drop checkpoints of jobs finished this long ago; -1 = never */
	bool retention_keep_exports;   /* false: the policy drops exports with the checkpoints */
	int retention_interval_s;      /* seconds between retention / disk-use passes */
	size_t disk_ceiling_bytes;     /* job files at or above this refuse new jobs (507); 0 = none */
	int disk_ceiling_percent;      /* state_dir's file system this full refuses new jobs; 0 = none */
	char shared_group[64];         /* group that may read job files (exports, logs, TensorBoard); "" = none */
	int relay_timeout_s;     /* a relay connection unanswered this long is lost (both ends) */
	bool slurm_gpus_per_node; /* srun --gpus-per-node for GPU multi-node jobs (GRES clusters) */
	char tls_cert[1024];     /* PEM certificate chain of the HTTPS listener; "" = plain HTTP */
	char tls_key[1024];      /* PEM private key of tls_cert; set both or neither */
	char config_file[1024];  /* where the file settings came from ("" none) */

	/* Derived by config_finish: */
	char *roots[CONFIG_MAX_DATA_ROOTS]; /* pointers into roots_buf; absolute (made so against the cwd) */
	size_t n_roots;
	char roots_buf[4096];
} config;

/* Fills defaults, reads the config file (the --config flag, else
 * BERTD_CONFIG, else CONFIG_DEFAULT_FILE which may be absent), then the
 * environment, then argv. Validates every value.
 * Returns 0; 1 when --help or --version was printed to out (caller exits 0);
 * or -EINVAL with a message written to err naming the key and the source
 * (file:line, environment or flag). */
int config_load(config *cfg, int argc, char **argv, char **envp, FILE *out, FILE *err);

/* Prints every key with its default and help text (what --help shows). */
void config_print_help(FILE *out, const char *prog);
/* Prints the effective configuration, "key = value" per line. */
void config_print(const config *cfg, FILE *out);

/* Whether key (a config key name) takes effect on a reload (SIGHUP): the
 * table's reloadable flag. Unknown names are false. */
bool config_key_reloadable(const char *key);
/* Calls fn once for every key whose value differs between a and b, in the
 * table's order, with whether it is reloadable. Returns how many differ. */
int config_each_change(const config *a, const config *b,
		       void (*fn)(void *arg, const char *key, bool reloadable), void *arg);
/* Copies the values of the reloadable keys from src into dst, leaving the
 * others (the restart-only ones) as dst has them. */
void config_copy_reloadable(config *dst, const config *src);

/* Checks one data root as it is now (roots are not required to exist at
 * start, so this is a warning, not a load error): 0 when it is a directory
 * bertd can read and, with need_write (the first root, where datasets are
 * written), create files in. Otherwise a negative errno (-ENOENT, -ENOTDIR,
 * -EACCES, -EROFS, ...) and why gets one line naming the root. */
int config_root_check(const char *root, bool need_write, char *why, size_t cap);

#endif
