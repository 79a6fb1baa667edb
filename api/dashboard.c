/* dashboard — GET /, the one-page dashboard (api/ui/dashboard.html),
 * embedded at build time by common/embed. The page holds no data: it is
 * served without the token and calls the API with the token the user gives
 * it (URL fragment or prompt; docs/api.md). Must never template data into
 * the page server-side. */
#include <stddef.h>

#include "api/handlers.h"
#include "api/http.h"

extern const unsigned char dashboard_html[];
extern const size_t dashboard_html_len;

enum MHD_Result dashboard_get(api_request *req)
{
	enum MHD_Result ret;
	static const char *const known[] = {NULL};
	if (!api_query_known(req, known, &ret))
		return ret;
	/* The page's script is inline; nothing else may run or load. */
	if (api_add_header(req, "Content-Security-Policy",
			   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
			   "connect-src 'self'; img-src 'self' data:") < 0)
		return MHD_NO;
	return api_reply_raw(req, 200, "text/html; charset=utf-8", (const char *)dashboard_html,
			     dashboard_html_len);
}
