/* keepalive — see keepalive.h. */
#include "common/keepalive.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

int keepalive_set(int fd, int timeout_ms)
{
	if (timeout_ms <= 0)
		return 0;
	int on = 1, probe_s = timeout_ms / 3000 > 0 ? timeout_ms / 3000 : 1, count = 3;
	unsigned int user = (unsigned int)timeout_ms;
	if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &probe_s, sizeof probe_s) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &probe_s, sizeof probe_s) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count) < 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof user) < 0)
		return -errno;
	return 0;
}
