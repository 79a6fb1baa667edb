/* nfq-delay — the namespaced nodes' delay fault (multinode_ns.sh delay;
 * docs/multinode.md, "Namespaced nodes"): this kernel has no tc netem, so
 * iptables-legacy rules in a node's network namespace send that node's
 * packets to an NFQUEUE, and this program, run in the same namespace,
 * holds each one for the given delay and then lets it go (NF_ACCEPT), in
 * the order they came. Raw nfnetlink (linux/netfilter/nfnetlink_queue.h),
 * no library.
 *
 *   nfq-delay QUEUE DELAY_MS    binds QUEUE, prints "ready" once bound, runs
 *                               until SIGTERM/SIGINT, then lets every held
 *                               packet go, prints what it held, exits 0
 *   nfq-delay --probe QUEUE     binds QUEUE and exits: 0, or 1 saying why
 *
 * Test-only. It never drops, changes or reorders a packet (a packet's
 * verdict is always NF_ACCEPT, given after at least DELAY_MS), and never
 * touches the firewall rules itself: the script adds them after "ready"
 * and removes them before stopping it. */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_queue.h>
#include <linux/netlink.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Packets the kernel may hold for us at once; also the ring's size. */
#define HELD_MAX 65536u

typedef struct held {
	uint32_t id;     /* the kernel's packet id (increasing per queue) */
	int64_t due_ns;  /* CLOCK_MONOTONIC time to let it go */
} held;

static volatile sig_atomic_t stopping;

static void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Appends attribute type with len bytes of data to the message in buf. */
static void put_attr(char *buf, uint16_t type, const void *data, size_t len)
{
	struct nlmsghdr *nh = (struct nlmsghdr *)buf;
	struct nlattr *a = (struct nlattr *)(buf + NLMSG_ALIGN(nh->nlmsg_len));
	a->nla_type = type;
	a->nla_len = (uint16_t)(NLA_HDRLEN + len);
	memcpy((char *)a + NLA_HDRLEN, data, len);
	nh->nlmsg_len = NLMSG_ALIGN(nh->nlmsg_len) + NLA_ALIGN(a->nla_len);
}

/* Starts an nfnetlink queue message of type msg for queue in buf. */
static void start_msg(char *buf, uint16_t msg, uint16_t flags, uint16_t queue)
{
	memset(buf, 0, 256);
	struct nlmsghdr *nh = (struct nlmsghdr *)buf;
	nh->nlmsg_len = NLMSG_LENGTH(sizeof(struct nfgenmsg));
	nh->nlmsg_type = (NFNL_SUBSYS_QUEUE << 8) | msg;
	nh->nlmsg_flags = NLM_F_REQUEST | flags;
	struct nfgenmsg *g = NLMSG_DATA(nh);
	g->nfgen_family = AF_UNSPEC;
	g->version = NFNETLINK_V0;
	g->res_id = htons(queue);
}

static int send_msg(int fd, const char *buf)
{
	struct sockaddr_nl to = {.nl_family = AF_NETLINK};
	const struct nlmsghdr *nh = (const struct nlmsghdr *)buf;
	return sendto(fd, buf, nh->nlmsg_len, 0, (struct sockaddr *)&to, sizeof to) < 0 ? -errno : 0;
}

/* Sends the message in buf (NLM_F_ACK set) and waits for its answer: 0, or
 * the kernel's negative errno. */
static int request(int fd, const char *buf)
{
	int rc = send_msg(fd, buf);
	if (rc)
		return rc;
	char in[4096];
	for (;;) {
		ssize_t n = recv(fd, in, sizeof in, 0);
		if (n < 0)
			return -errno;
		for (struct nlmsghdr *nh = (struct nlmsghdr *)in; NLMSG_OK(nh, (size_t)n); nh = NLMSG_NEXT(nh, n))
			if (nh->nlmsg_type == NLMSG_ERROR)
				return ((struct nlmsgerr *)NLMSG_DATA(nh))->error;
	}
}

/* A netlink socket bound to queue, its packets' metadata only (no
 * payload), GSO packets whole. The socket, or -1 (said on stderr). */
static int bind_queue(uint16_t queue)
{
	char buf[256];
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
	if (fd < 0) {
		fprintf(stderr, "nfq-delay: no nfnetlink socket: %s\n", strerror(errno));
		return -1;
	}
	int big = 16 << 20; /* a burst of packet notices must not overflow */
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) < 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
	struct sockaddr_nl me = {.nl_family = AF_NETLINK};
	int rc = bind(fd, (struct sockaddr *)&me, sizeof me) < 0 ? -errno : 0;
	const char *what = "bind the netlink socket";
	if (!rc) {
		struct nfqnl_msg_config_cmd cmd = {.command = NFQNL_CFG_CMD_BIND, .pf = htons(AF_INET)};
		start_msg(buf, NFQNL_MSG_CONFIG, NLM_F_ACK, queue);
		put_attr(buf, NFQA_CFG_CMD, &cmd, sizeof cmd);
		rc = request(fd, buf);
		what = "bind the queue (is CONFIG_NETFILTER_NETLINK_QUEUE on, the queue free?)";
	}
	if (!rc) {
		struct nfqnl_msg_config_params p = {.copy_range = htonl(0), .copy_mode = NFQNL_COPY_META};
		uint32_t maxlen = htonl(HELD_MAX), flags = htonl(NFQA_CFG_F_GSO);
		start_msg(buf, NFQNL_MSG_CONFIG, NLM_F_ACK, queue);
		put_attr(buf, NFQA_CFG_PARAMS, &p, sizeof p);
		put_attr(buf, NFQA_CFG_QUEUE_MAXLEN, &maxlen, sizeof maxlen);
		put_attr(buf, NFQA_CFG_FLAGS, &flags, sizeof flags);
		put_attr(buf, NFQA_CFG_MASK, &flags, sizeof flags);
		rc = request(fd, buf);
		what = "configure the queue";
	}
	if (rc) {
		fprintf(stderr, "nfq-delay: cannot %s: %s\n", what, strerror(-rc));
		close(fd);
		return -1;
	}
	return fd;
}

/* Lets every held packet up to and including id go (the batch verdict
 * covers all lower ids too, so a notice lost to a full socket buffer
 * cannot strand its packet). 0 or -errno. */
static int accept_upto(int fd, uint16_t queue, uint32_t id)
{
	char buf[256];
	struct nfqnl_msg_verdict_hdr v = {.verdict = htonl(NF_ACCEPT), .id = htonl(id)};
	start_msg(buf, NFQNL_MSG_VERDICT_BATCH, 0, queue);
	put_attr(buf, NFQA_VERDICT_HDR, &v, sizeof v);
	return send_msg(fd, buf);
}

/* The packet id in an NFQNL_MSG_PACKET notice, or -1. */
static int64_t packet_id(const struct nlmsghdr *nh)
{
	const char *p = (const char *)NLMSG_DATA(nh) + NLMSG_ALIGN(sizeof(struct nfgenmsg));
	const char *end = (const char *)nh + nh->nlmsg_len;
	while (p + NLA_HDRLEN <= end) {
		const struct nlattr *a = (const struct nlattr *)p;
		if (a->nla_len < NLA_HDRLEN || p + a->nla_len > end)
			break;
		if ((a->nla_type & NLA_TYPE_MASK) == NFQA_PACKET_HDR &&
		    a->nla_len >= NLA_HDRLEN + sizeof(struct nfqnl_msg_packet_hdr)) {
			struct nfqnl_msg_packet_hdr h;
			memcpy(&h, p + NLA_HDRLEN, sizeof h);
			return ntohl(h.packet_id);
		}
		p += NLA_ALIGN(a->nla_len);
	}
	return -1;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--probe") == 0) {
		int fd = bind_queue((uint16_t)atoi(argv[2]));
		if (fd < 0)
			return 1;
		close(fd);
		return 0;
	}
	if (argc != 3 || atoi(argv[2]) < 0) {
		fprintf(stderr, "usage: nfq-delay QUEUE DELAY_MS | nfq-delay --probe QUEUE\n");
		return 2;
	}
	uint16_t queue = (uint16_t)atoi(argv[1]);
	int64_t delay_ns = (int64_t)atoi(argv[2]) * 1000000;
	sigset_t block, none;
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGINT);
	sigprocmask(SIG_BLOCK, &block, &none);
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	int fd = bind_queue(queue);
	if (fd < 0)
		return 1;
	printf("ready\n");
	fflush(stdout);

	static held ring[HELD_MAX];
	uint32_t head = 0, count = 0, most = 0;
	uint64_t total = 0, lost_notices = 0;
	static char in[1 << 16];
	int rc = 0;
	while (!stopping) {
		struct timespec wait, *tp = NULL;
		if (count) {
			int64_t left = ring[head].due_ns - now_ns();
			if (left < 0)
				left = 0;
			wait.tv_sec = left / 1000000000;
			wait.tv_nsec = left % 1000000000;
			tp = &wait;
		}
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		if (ppoll(&pfd, 1, tp, &none) < 0 && errno != EINTR) {
			rc = 1;
			fprintf(stderr, "nfq-delay: poll: %s\n", strerror(errno));
			break;
		}
		for (;;) { /* every notice there is, each packet due delay from now */
			ssize_t n = recv(fd, in, sizeof in, MSG_DONTWAIT);
			if (n < 0) {
				if (errno == ENOBUFS) {
					lost_notices++;
					continue;
				}
				break;
			}
			int64_t due = now_ns() + delay_ns;
			for (struct nlmsghdr *nh = (struct nlmsghdr *)in; NLMSG_OK(nh, (size_t)n); nh = NLMSG_NEXT(nh, n)) {
				int64_t id = nh->nlmsg_type == ((NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET) ? packet_id(nh) : -1;
				if (id < 0 || count == HELD_MAX)
					continue; /* cannot happen with the kernel's queue no longer than the ring */
				ring[(head + count) % HELD_MAX] = (held){.id = (uint32_t)id, .due_ns = due};
				count++;
				total++;
			}
			if (count > most)
				most = count;
		}
		/* the due ones, in order: one verdict for them all */
		int64_t now = now_ns();
		uint32_t last = 0, due_n = 0;
		while (due_n < count && ring[(head + due_n) % HELD_MAX].due_ns <= now)
			last = ring[(head + due_n++) % HELD_MAX].id;
		if (due_n) {
			int e = accept_upto(fd, queue, last);
			if (e)
				fprintf(stderr, "nfq-delay: verdict: %s\n", strerror(-e));
			head = (head + due_n) % HELD_MAX;
			count -= due_n;
		}
	}
	if (count) /* stopping: nothing held back */
		accept_upto(fd, queue, ring[(head + count - 1) % HELD_MAX].id);
	fprintf(stderr, "nfq-delay: queue %u: %llu packets held %d ms each, at most %u at once, %llu notices lost\n",
		queue, (unsigned long long)total, atoi(argv[2]), most, (unsigned long long)lost_notices);
	close(fd);
	return rc;
}
