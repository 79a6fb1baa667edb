/* system — liveness and build facts. healthz answers without auth and
 * without touching the store, so a supervisor's probe never queues behind
 * a busy database; it must never reveal anything but "ok". */
#include <jansson.h>
#include <stdbool.h>

#include "api/handlers.h"
#include "api/http.h"

#ifndef BERTD_VERSION
#define BERTD_VERSION "unknown"
#endif

#ifdef BERTD_CUDA
static const bool built_with_cuda = true;
#else
static const bool built_with_cuda = false;
#endif

enum MHD_Result system_healthz(api_request *req)
{
	return api_reply_json(req, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"));
}

enum MHD_Result system_version(api_request *req)
{
	return api_reply_json(req, MHD_HTTP_OK,
			      json_pack("{s:s, s:s, s:b}", "version", BERTD_VERSION, "api", "v1",
					"cuda", built_with_cuda));
}
