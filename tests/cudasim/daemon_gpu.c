/* daemon_gpu — see daemon_gpu.h. */
#include "daemon_gpu.h"

#include <stdio.h>
#include <stdlib.h>

it_fx *cudasim_daemon_start(void)
{
	const char *bin = getenv("IT_CUDASIM_BIN_DIR"), *nccl = getenv("IT_FAKE_NCCL_DIR");
	if (!bin || !nccl) {
		fprintf(stderr, "IT_CUDASIM_BIN_DIR or IT_FAKE_NCCL_DIR is not set\n");
		return NULL;
	}
	const char *args[] = {"--bin-dir", bin, "--pass-env", "CUDASIM_*:LD_LIBRARY_PATH", "--stop-timeout-s", "60",
			      "--nccl-path", nccl, NULL};
	it_daemon_opts o = {.devices = "cuda", .extra = args, .dataset = "shakes", .corpus = "shakes.txt",
			    .corpus_lines = 3000, .vocab_size = 400};
	return it_daemon_start(&o, 0);
}
