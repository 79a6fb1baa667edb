/* jansson.h (device-check shim) — declarations only, so worker/model.c builds
 * on a GPU box without libjansson headers. The JSON config functions of
 * model.c are never called by the GPU tests or the benchmark; in this shim
 * every function reports "absent" (NULL / 0). Used only by
 * scripts/device-check; never part of a bertd build. */
#ifndef BERTD_SHIM_JANSSON_H
#define BERTD_SHIM_JANSSON_H

typedef struct json_t json_t;
typedef long long json_int_t;

int json_is_object(const json_t *j);
int json_is_null(const json_t *j);
int json_is_number(const json_t *j);
int json_is_integer(const json_t *j);
int json_is_string(const json_t *j);
json_t *json_object_get(const json_t *o, const char *key);
double json_number_value(const json_t *j);
json_int_t json_integer_value(const json_t *j);
const char *json_string_value(const json_t *j);
json_t *json_pack(const char *fmt, ...);
int json_object_set_new(json_t *o, const char *key, json_t *v);
json_t *json_real(double v);
json_t *json_integer(json_int_t v);

#endif
