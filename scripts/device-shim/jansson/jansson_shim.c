/* jansson_shim — see jansson.h beside it: every call reports absence. */
#include "jansson.h"

#include <stddef.h>

int json_is_object(const json_t *j) { (void)j; return 0; }
int json_is_null(const json_t *j) { (void)j; return 0; }
int json_is_number(const json_t *j) { (void)j; return 0; }
int json_is_integer(const json_t *j) { (void)j; return 0; }
int json_is_string(const json_t *j) { (void)j; return 0; }
json_t *json_object_get(const json_t *o, const char *key) { (void)o; (void)key; return NULL; }
double json_number_value(const json_t *j) { (void)j; return 0; }
json_int_t json_integer_value(const json_t *j) { (void)j; return 0; }
const char *json_string_value(const json_t *j) { (void)j; return NULL; }
json_t *json_pack(const char *fmt, ...) { (void)fmt; return NULL; }
int json_object_set_new(json_t *o, const char *key, json_t *v)
{
    (void)o; (void)key; (void)v;
    return -1;
}
json_t *json_real(double v) { (void)v; return NULL; }
json_t *json_integer(json_int_t v) { (void)v; return NULL; }
