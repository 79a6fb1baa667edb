/* comm_net — the net backend of comm.h: ranks on different hosts, over
 * Gloo's TCP transport (libgloo-dev). The only C++ in bertd: Gloo is a C++
 * library, so this file wraps it behind the C interface of comm_backend.h
 * and lets no exception out.
 *
 * Gloo is used for what it does well — listening, the full-mesh connect,
 * framing, bounded waits, noticing a closed peer — and not for arithmetic:
 * its allreduce algorithms sum in another order than the shm backend (ring
 * and halving-doubling orders differ per element and per rank count), so
 * every collective here is built on point-to-point sends and receives of
 * unbound buffers:
 *  - a signature exchange first (op, size, root: every rank sends its own to
 *    every other), which is also the barrier and turns ranks that disagree
 *    on what they are doing into -EPROTO;
 *  - allreduce_mean: per chunk, a reduce-scatter where the owner of each
 *    segment receives every rank's piece and sums in rank order 0..G-1 then
 *    divides by G, exactly the shm backend's arithmetic, then an all-gather
 *    of the owners' results — bit-identical to shm on the same inputs;
 *  - allreduce_sum_f64: an all-gather, each rank summing in rank order from
 *    0.0 as shm does.
 *
 * Failure model as comm.h: every wait is bounded by timeout_ms (Gloo throws
 * on a timeout or a closed connection); the first failure marks the comm
 * dead (-EPIPE from then on) and closes every connection, so each peer's
 * pending or next collective fails at once instead of waiting out its own
 * timeout. The caller must ignore SIGPIPE (bertd-worker does).
 *
 * Never blocks without a deadline, never exits, never throws to C.
 */
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

extern "C" {
#include "common/log.h"
}
#include "worker/comm.h"
#include "worker/comm_backend.h"

namespace {

constexpr int SEG_ALIGN = 16;      /* floats: as the shm backend (not needed for the bits) */
constexpr int REDUCE_BLOCK = 512;  /* floats summed per pass, as the shm backend */
constexpr size_t NET_DEFAULT_MAX_FLOATS = (size_t)1 << 20; /* 4 MiB per chunk: fewer round trips */

enum { OP_ALLREDUCE = 1, OP_SUM_F64, OP_BCAST, OP_BARRIER };

uint64_t sig_of(int op, uint64_t n)
{
    return ((uint64_t)op << 56) | (n & ((1ull << 56) - 1));
}

/* The rendezvous store Gloo's connectFullMesh asks for, over the caller's
 * comm_kv (the daemon relay). One deadline for the whole rendezvous. */
class KvStore : public gloo::rendezvous::Store {
public:
    KvStore(const comm_kv *kv, std::chrono::steady_clock::time_point deadline) : kv_(kv), deadline_(deadline) {}

    void set(const std::string &key, const std::vector<char> &data) override
    {
        int rc = kv_->set(kv_->ctx, key.c_str(), data.data(), data.size());
        if (rc < 0)
            throw gloo::IoException("rendezvous store: set " + key + ": " + std::strerror(-rc));
    }

    std::vector<char> get(const std::string &key) override
    {
        std::vector<char> v(COMM_KV_MAX);
        size_t len = 0;
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ -
                                                                          std::chrono::steady_clock::now());
        int rc = kv_->get(kv_->ctx, key.c_str(), v.data(), v.size(), &len,
                          left.count() > 0 ? (int)left.count() : 0);
        if (rc == -ETIMEDOUT) {
            timed_out = true;
            missing = key;
        }
        if (rc < 0)
            throw gloo::IoException("rendezvous store: get " + key + ": " + std::strerror(-rc));
        v.resize(len);
        return v;
    }

    void wait(const std::vector<std::string> &keys) override
    {
        for (const auto &k : keys)
            (void)get(k);
    }

    void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &) override
    {
        wait(keys); /* bounded by our own deadline */
    }

    bool timed_out = false;
    std::string missing;

private:
    const comm_kv *kv_;
    std::chrono::steady_clock::time_point deadline_;
};

struct net_state {
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    std::chrono::milliseconds timeout{COMM_DEFAULT_TIMEOUT_MS};
    size_t max_floats = NET_DEFAULT_MAX_FLOATS;
    std::vector<float> scratch;   /* (G, segment) pieces received by a segment's owner */
    std::vector<double> scratch_d; /* (G, n) values of sum_f64 */
    uint64_t slot = 1;
    int dead = 0;                 /* 0, or the negative errno that ended the group */
};

struct comm_net {
    comm base;
    net_state *st;
};

net_state *state(comm *c)
{
    return reinterpret_cast<comm_net *>(c)->st;
}

/* Start of rank g's segment in a chunk of nc floats (as comm.c's seg_lo). */
size_t seg_lo(size_t nc, int g, int world)
{
    if (g >= world)
        return nc;
    size_t lo = nc * (size_t)g / (size_t)world;
    return lo / SEG_ALIGN * SEG_ALIGN;
}

/* Marks the group dead and closes every connection (peers see EOF now). */
void fail(comm *c, int err, const char *what)
{
    net_state *s = state(c);
    if (!s->dead) {
        s->dead = err;
        log_error("comm net: rank %d: %s; closing the group", c->rank, what);
    }
    try {
        if (s->ctx)
            s->ctx->closeConnections();
    } catch (const std::exception &) {
        /* connections already broken: nothing left to close */
    }
}

/* Posted sends and receives of one step, then waited for, each wait bounded. */
void wait_all(net_state *s, gloo::transport::UnboundBuffer *sb, int nsend, gloo::transport::UnboundBuffer *rb,
              int nrecv)
{
    for (int i = 0; i < nrecv; i++)
        if (!rb->waitRecv(nullptr, s->timeout))
            throw gloo::IoException("receive aborted");
    for (int i = 0; i < nsend; i++)
        if (!sb->waitSend(nullptr, s->timeout))
            throw gloo::IoException("send aborted");
}

/* Every rank sends its signature to every other and checks theirs. */
int exchange_sig(comm *c, uint64_t sig)
{
    net_state *s = state(c);
    const int G = c->world, me = c->rank;
    if (G == 1)
        return 0;
    uint64_t mine = sig;
    std::vector<uint64_t> all((size_t)G, 0);
    auto sb = s->ctx->createUnboundBuffer(&mine, sizeof mine);
    auto rb = s->ctx->createUnboundBuffer(all.data(), all.size() * sizeof(uint64_t));
    uint64_t slot = s->slot++;
    for (int g = 0; g < G; g++) {
        if (g == me)
            continue;
        rb->recv(g, slot, (size_t)g * sizeof(uint64_t), sizeof(uint64_t));
        sb->send(g, slot);
    }
    wait_all(s, sb.get(), G - 1, rb.get(), G - 1);
    for (int g = 0; g < G; g++) {
        if (g != me && all[(size_t)g] != sig) {
            char why[160];
            snprintf(why, sizeof why, "rank %d is in a different collective (or size) than this rank", g);
            fail(c, -EPROTO, why);
            return -EPROTO;
        }
    }
    return 0;
}

/* Runs one collective body; a Gloo exception (timeout, closed peer) ends
 * the group with -EPIPE. */
template <typename F> int guarded(comm *c, F body)
{
    net_state *s = state(c);
    if (s->dead)
        return -EPIPE;
    try {
        return body();
    } catch (const std::exception &e) {
        fail(c, -EPIPE, e.what());
        return -EPIPE;
    }
}

int net_allreduce_mean(comm *c, float *buf, size_t n)
{
    return guarded(c, [&]() -> int {
        net_state *s = state(c);
        const int G = c->world, me = c->rank;
        int rc = exchange_sig(c, sig_of(OP_ALLREDUCE, n));
        for (size_t off = 0; rc == 0 && off < n; off += s->max_floats) {
            size_t nc = n - off < s->max_floats ? n - off : s->max_floats;
            float *chunk = buf + off;
            size_t lo = seg_lo(nc, me, G), mylen = seg_lo(nc, me + 1, G) - lo;
            size_t need = mylen ? (size_t)G * mylen : 1; /* never a null buffer */
            if (s->scratch.size() < need)
                s->scratch.resize(need);
            float *pieces = s->scratch.data();
            auto sb = s->ctx->createUnboundBuffer(chunk, nc * sizeof(float));
            auto rb = s->ctx->createUnboundBuffer(pieces, need * sizeof(float));
            /* reduce-scatter: rank g's segment of every rank goes to rank g */
            uint64_t slot = s->slot++;
            int nsend = 0, nrecv = 0;
            for (int g = 0; g < G; g++) {
                if (g == me)
                    continue;
                size_t glo = seg_lo(nc, g, G), glen = seg_lo(nc, g + 1, G) - glo;
                if (glen) {
                    sb->send(g, slot, glo * sizeof(float), glen * sizeof(float));
                    nsend++;
                }
                if (mylen) {
                    rb->recv(g, slot, (size_t)g * mylen * sizeof(float), mylen * sizeof(float));
                    nrecv++;
                }
            }
            wait_all(s, sb.get(), nsend, rb.get(), nrecv);
            /* this rank's segment: summed over ranks 0..G-1 in that order,
             * then divided by G — the shm backend's loop, element for element */
            float *mine = chunk + lo;
            for (size_t b = 0; b < mylen; b += REDUCE_BLOCK) {
                size_t nb = mylen - b < REDUCE_BLOCK ? mylen - b : REDUCE_BLOCK;
                float acc[REDUCE_BLOCK];
                const float *s0 = me == 0 ? mine + b : pieces + b;
                for (size_t j = 0; j < nb; j++)
                    acc[j] = s0[j];
                for (int g = 1; g < G; g++) {
                    const float *sg = g == me ? mine + b : pieces + (size_t)g * mylen + b;
                    for (size_t j = 0; j < nb; j++)
                        acc[j] += sg[j];
                }
                for (size_t j = 0; j < nb; j++)
                    mine[b + j] = acc[j] / (float)G;
            }
            /* all-gather: every owner's reduced segment to every rank */
            slot = s->slot++;
            nsend = nrecv = 0;
            for (int g = 0; g < G; g++) {
                if (g == me)
                    continue;
                size_t glo = seg_lo(nc, g, G), glen = seg_lo(nc, g + 1, G) - glo;
                if (mylen) {
                    sb->send(g, slot, lo * sizeof(float), mylen * sizeof(float));
                    nsend++;
                }
                if (glen) {
                    sb->recv(g, slot, glo * sizeof(float), glen * sizeof(float));
                    nrecv++;
                }
            }
            wait_all(s, sb.get(), nsend, sb.get(), nrecv);
        }
        return rc;
    });
}

int net_allreduce_sum_f64(comm *c, double *vals, int n)
{
    return guarded(c, [&]() -> int {
        net_state *s = state(c);
        const int G = c->world, me = c->rank;
        int rc = exchange_sig(c, sig_of(OP_SUM_F64, (uint64_t)n));
        if (rc != 0 || n == 0)
            return rc;
        size_t nn = (size_t)n;
        if (s->scratch_d.size() < (size_t)G * nn)
            s->scratch_d.resize((size_t)G * nn);
        double *all = s->scratch_d.data();
        std::memcpy(all + (size_t)me * nn, vals, nn * sizeof(double));
        if (G > 1) {
            auto sb = s->ctx->createUnboundBuffer(vals, nn * sizeof(double));
            auto rb = s->ctx->createUnboundBuffer(all, (size_t)G * nn * sizeof(double));
            uint64_t slot = s->slot++;
            for (int g = 0; g < G; g++) {
                if (g == me)
                    continue;
                sb->send(g, slot);
                rb->recv(g, slot, (size_t)g * nn * sizeof(double), nn * sizeof(double));
            }
            wait_all(s, sb.get(), G - 1, rb.get(), G - 1);
        }
        for (size_t i = 0; i < nn; i++) {
            double acc = 0.0;
            for (int g = 0; g < G; g++)
                acc += all[(size_t)g * nn + i];
            vals[i] = acc;
        }
        return 0;
    });
}

int net_barrier(comm *c)
{
    return guarded(c, [&]() -> int { return exchange_sig(c, sig_of(OP_BARRIER, 0)); });
}

int net_broadcast(comm *c, void *buf, size_t bytes, int root)
{
    return guarded(c, [&]() -> int {
        net_state *s = state(c);
        const int G = c->world, me = c->rank;
        int rc = exchange_sig(c, sig_of(OP_BCAST, ((uint64_t)bytes << 8) | (unsigned)root));
        if (rc != 0 || bytes == 0 || G == 1)
            return rc;
        auto b = s->ctx->createUnboundBuffer(buf, bytes);
        uint64_t slot = s->slot++;
        if (me == root) {
            for (int g = 0; g < G; g++)
                if (g != me)
                    b->send(g, slot);
            wait_all(s, b.get(), G - 1, b.get(), 0);
        } else {
            b->recv(root, slot);
            wait_all(s, b.get(), 0, b.get(), 1);
        }
        return 0;
    });
}

void net_abort(comm *c, int err)
{
    char why[64];
    snprintf(why, sizeof why, "local error %d", err < 0 ? -err : err);
    fail(c, err < 0 ? err : -EPIPE, why);
}

void net_destroy(comm *c)
{
    comm_net *n = reinterpret_cast<comm_net *>(c);
    try {
        delete n->st; /* closes the pairs, stops the device's thread */
    } catch (const std::exception &) {
    }
    delete n;
}

const comm_ops net_ops = {
    "net", net_allreduce_mean, net_allreduce_sum_f64, net_barrier, net_broadcast, net_abort, net_destroy,
};

} // namespace

extern "C" int comm_net_available(void)
{
    return 1;
}

extern "C" int comm_create_net(comm **out, int rank, int world, const comm_kv *kv, const comm_net_opts *opts)
{
    if (!out || !kv || !kv->set || !kv->get || !opts || world < 1 || world > COMM_MAX_WORLD || rank < 0 ||
        rank >= world || ((!opts->bind_addr || !*opts->bind_addr) && (!opts->iface || !*opts->iface)))
        return -EINVAL;
    int timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : COMM_DEFAULT_TIMEOUT_MS;
    comm_net *n = new (std::nothrow) comm_net();
    if (!n)
        return -ENOMEM;
    n->base.ops = &net_ops;
    n->base.rank = rank;
    n->base.world = world;
    int rc = 0;
    const char *where = opts->bind_addr && *opts->bind_addr ? opts->bind_addr : opts->iface;
    try {
        n->st = new net_state();
        net_state *s = n->st;
        s->timeout = std::chrono::milliseconds(timeout_ms);
        if (opts->max_floats)
            s->max_floats = opts->max_floats;
        gloo::transport::tcp::attr attr;
        if (opts->bind_addr && *opts->bind_addr)
            attr.hostname = opts->bind_addr;
        else
            attr.iface = opts->iface;
        try {
            s->dev = gloo::transport::tcp::CreateDevice(attr);
        } catch (const std::exception &e) {
            log_error("comm net: rank %d: cannot listen on %s: %s", rank, where, e.what());
            rc = -EADDRNOTAVAIL;
        }
        if (rc == 0) {
            KvStore store(kv, std::chrono::steady_clock::now() + s->timeout);
            s->ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
            s->ctx->setTimeout(s->timeout);
            try {
                s->ctx->connectFullMesh(store, s->dev);
            } catch (const std::exception &e) {
                if (store.timed_out) {
                    log_error("comm net: rank %d: rank %s of %d did not publish its address within %d ms", rank,
                              store.missing.c_str(), world, timeout_ms);
                    rc = -ETIMEDOUT;
                } else {
                    log_error("comm net: rank %d: connecting the %d-rank mesh from %s failed: %s", rank, world,
                              where, e.what());
                    rc = -EPIPE;
                }
            }
        }
    } catch (const std::bad_alloc &) {
        rc = -ENOMEM;
    } catch (const std::exception &e) {
        log_error("comm net: rank %d: %s", rank, e.what());
        rc = -EPIPE;
    }
    if (rc != 0) {
        net_destroy(&n->base);
        return rc;
    }
    *out = &n->base;
    return 0;
}
