/* hf_tokenize_tool — test helper for check_tokenizer.py: exports a small
 * bertd model with a given vocab and lowercase setting (what a job trained on
 * a dataset with that vocab exports), and writes the ids bertd's own
 * WordPiece (loader/wordpiece.c) gives each line of a text file, one JSON
 * array per line, to OUT_DIR/bertd_ids.jsonl.
 * Usage: hf_tokenize_tool VOCAB LOWERCASE(0|1) TEXT OUT_DIR */
#include "loader/wordpiece.h"
#include "worker/hf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 5 || (strcmp(argv[2], "0") && strcmp(argv[2], "1"))) {
        fprintf(stderr, "usage: %s VOCAB LOWERCASE(0|1) TEXT OUT_DIR\n", argv[0]);
        return 2;
    }
    bool lowercase = argv[2][0] == '1';
    wordpiece *wp = NULL;
    if (wordpiece_load(argv[1], lowercase, &wp) < 0)
        return 1;
    bert_config cfg;
    bert_config_preset(&cfg, NULL);
    cfg.vocab_size = (int)wordpiece_vocab_size(wp);
    cfg.hidden_size = 16;
    cfg.num_hidden_layers = 1;
    cfg.num_attention_heads = 2;
    cfg.intermediate_size = 32;
    cfg.max_position_embeddings = 96; /* not HF's 512: model_max_length must follow it */
    char err[512], path[4200];
    bert_model *m = NULL;
    if (bert_config_validate(&cfg, err, sizeof err) < 0 || bert_model_create(&m, &cfg) < 0) {
        fprintf(stderr, "model: %s\n", err);
        return 1;
    }
    bert_model_init_weights(m, 7);
    if (hf_export(m, argv[4], argv[1], lowercase, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    FILE *in = fopen(argv[3], "rb");
    snprintf(path, sizeof path, "%s/bertd_ids.jsonl", argv[4]);
    FILE *out = fopen(path, "w");
    if (!in || !out)
        return 1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    wordpiece_ids ids = {0};
    while ((n = getline(&line, &cap, in)) >= 0) {
        ids.n = 0;
        if (wordpiece_encode(wp, line, (size_t)n, &ids, NULL) < 0)
            return 1;
        fputc('[', out);
        for (size_t i = 0; i < ids.n; i++)
            fprintf(out, "%s%u", i ? "," : "", ids.v[i]);
        fputs("]\n", out);
    }
    free(line);
    wordpiece_ids_free(&ids);
    fclose(in);
    if (fclose(out) != 0)
        return 1;
    bert_model_destroy(m);
    wordpiece_destroy(wp);
    return 0;
}
