/* lr_schedule_tool — prints the learning rate bertd's worker uses at every
 * step of the schedule a job spec describes, for check_schedules.py to hold
 * against transformers' get_scheduler. The spec goes the worker's way:
 * jobspec_normalize, jobspec_from_json, train_config_from_jobspec, then
 * optim_lr_at for steps 0 .. max_steps + 2 (past the end too), one
 * "%.17g" a line. Never decides anything: a refused spec exits 2 with the
 * error on stderr.
 *
 * usage: lr_schedule_tool '<job spec JSON>'
 */
#include <stdio.h>

#include "common/jobspec.h"
#include "worker/train.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s '<job spec JSON>'\n", argv[0]);
        return 2;
    }
    json_error_t jerr;
    json_t *in = json_loads(argv[1], 0, &jerr), *eff = NULL;
    jobspec_error err;
    jobspec spec;
    train_config tc;
    char msg[512];
    int rc = 2;
    if (!in) {
        fprintf(stderr, "not JSON: %s\n", jerr.text);
        goto out;
    }
    if (jobspec_normalize(in, &eff, &err) < 0 || jobspec_from_json(eff, &spec, &err) < 0) {
        fprintf(stderr, "%d %s: %s\n", err.status, err.field, err.detail);
        goto out;
    }
    if (train_config_from_jobspec(&tc, &spec, 1, 0, msg, sizeof msg) < 0) {
        fprintf(stderr, "%s\n", msg);
        goto out;
    }
    for (long s = 0; s <= tc.optim.total_steps + 2; s++)
        printf("%.17g\n", optim_lr_at(&tc.optim, s));
    rc = 0;
out:
    json_decref(in);
    json_decref(eff);
    return rc;
}
