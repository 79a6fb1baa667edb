/* test_init_from_cuda — the GPU path takes the HF directories init_from
 * takes: a gpu_model given the parameters hf_init_from read (as the worker's
 * GPU device gets them from the host trainer) from pytorch_model.bin,
 * sharded safetensors, a BertForMaskedLM carrying NSP weights and a
 * BertForMaskedLM given an NSP head, with the job's nsp deciding, gives the
 * CPU model's loss on the same batch (fp32, relative 1e-5; the CPU model's
 * step-1 loss is checked against transformers in integration_init_hf). The
 * directories are made by tests/integration/hf_init_dirs.py with
 * transformers' save_pretrained. Exits 77 without a GPU, or without
 * /usr/bin/python3 with torch and transformers.
 */
#include "tests/gpu/gpu_check.h"
#include "worker/gpu_model.h"
#include "worker/hf.h"
#include "worker/model.h"
#include "worker/optim.h"

#include <unistd.h>

enum { TB = 3, TT = 24, TM = 11 };

static void check_dir(const char *root, const char *sub, int nsp)
{
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/%s", root, sub);
    bert_model *cpu = NULL;
    if (hf_init_from(&cpu, path, nsp, 7, err, sizeof err) != 0) {
        printf("FAIL hf_init_from %s: %s\n", sub, err);
        gpu_failures++;
        return;
    }
    const bert_config *c = &cpu->cfg;
    int32_t ids[TB * TT], types[TB * TT], lens[TB] = {TT, TT - 5, 11}, pos[TM], labels[TM],
            nspl[TB] = {0, 1, 0};
    for (int i = 0; i < TB * TT; i++) {
        ids[i] = (int32_t)((i * 7919 + 101) % c->vocab_size);
        types[i] = (i % TT) >= TT / 2;
    }
    for (int m = 0; m < TM; m++) {
        int b = m % TB;
        pos[m] = b * TT + 1 + m / TB; /* distinct, inside every sequence */
        labels[m] = (int32_t)((m * 131 + 1) % c->vocab_size);
    }
    bert_batch b = {.B = TB, .T = TT, .M = TM, .input_ids = ids, .token_type_ids = types,
                    .seq_lens = lens, .mlm_positions = pos, .mlm_labels = labels,
                    .nsp_labels = nsp ? nspl : NULL};
    bert_dropout d = {.train = 0};
    if (bert_model_forward(cpu, &b, &d) != 0)
        abort();
    optim_config oc;
    optim_config_default(&oc, OPTIM_ADAMW);
    gpu_model *g = NULL;
    if (gpu_model_create(&g, c, KDT_F32, 0, TB, TT, TM, &oc, err, sizeof err) != 0 ||
        gpu_model_set_params(g, cpu->params_memory) != 0 ||
        gpu_model_upload(g, &b, err, sizeof err) != 0) {
        printf("FAIL gpu model from %s: %s\n", sub, err);
        gpu_failures++;
    } else {
        gpu_model_zero_grad(g);
        gpu_model_forward(g, &d, 1.0f);
        float gl = gpu_model_loss(g);
        double rel = fabs((double)gl - cpu->loss) / fabs((double)cpu->loss);
        int ok = isfinite(gl) && rel <= 1e-5;
        printf("%-4s %-12s nsp %d: gpu loss %.7f cpu loss %.7f rel %.3g (tol 1e-05)\n",
               ok ? "ok" : "FAIL", sub, nsp, gl, cpu->loss, rel);
        gpu_failures += !ok;
    }
    gpu_model_destroy(g);
    bert_model_destroy(cpu);
}

int main(void)
{
    gpu_require_device();
    const char *src = getenv("BERTD_SOURCE_ROOT");
    if (!src || access("/usr/bin/python3", X_OK) != 0 ||
        system("/usr/bin/python3 -c 'import torch, transformers' >/dev/null 2>&1") != 0) {
        printf("skip: /usr/bin/python3 with torch and transformers needed\n");
        return 77;
    }
    bert_set_threads(2);
    char dir[] = "/tmp/bertd-gpuinit-XXXXXX", cmd[1024];
    if (!mkdtemp(dir))
        abort();
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 '%s/tests/integration/hf_init_dirs.py' '%s' "
             "'%s/tests/data/bert-base-uncased-vocab.txt' >/dev/null", src, dir, src);
    if (system(cmd) != 0) {
        printf("FAIL hf_init_dirs.py\n");
        return 1;
    }
    check_dir(dir, "pt_bin", 0);
    check_dir(dir, "sharded", 0);
    check_dir(dir, "mlmnsp_bin", 1);
    check_dir(dir, "mlm_st", 1);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        gpu_failures++;
    printf("%d failure(s)\n", gpu_failures);
    cuda_kernels_shutdown();
    return gpu_failures ? 1 : 0;
}
