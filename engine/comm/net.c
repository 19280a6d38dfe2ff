/*
 * net.c — TCP socket helpers for engine/comm: address parsing, listen, connect with retries,
 * exact send/recv with deadlines and an abort flag (never an unbounded block), socket tuning
 * and constant-time token comparison.
 */
#include "comm/comm-impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

jdt_status jdt_net_parse_addr(const char *addr, char *host, size_t host_cap, int *port,
                              jdt_err *e)
{
    if (!addr || !*addr) return jdt_err_set(e, JDT_ERR_INVALID, "empty address (want host:port)");
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr)
        return jdt_err_set(e, JDT_ERR_INVALID, "address '%s': want host:port", addr);
    size_t hl = (size_t)(colon - addr);
    if (hl >= host_cap) return jdt_err_set(e, JDT_ERR_INVALID, "address '%s': host too long", addr);
    char *end = NULL;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || p < 0 || p > 65535)
        return jdt_err_set(e, JDT_ERR_INVALID, "address '%s': bad port '%s'", addr, colon + 1);
    memcpy(host, addr, hl);
    host[hl] = 0;
    *port = (int)p;
    return JDT_OK;
}

static jdt_status resolve(const char *host, int port, struct sockaddr_in *sa, jdt_err *e)
{
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) == 1) return JDT_OK;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res)
        return jdt_err_set(e, JDT_ERR_NET, "cannot resolve host '%s': %s", host, gai_strerror(rc));
    sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return JDT_OK;
}

jdt_status jdt_net_listen(const char *host, int port, int *fd_out, int *port_out, jdt_err *e)
{
    struct sockaddr_in sa;
    jdt_status st = resolve(host, port, &sa, e);
    if (st) return st;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return jdt_err_set(e, JDT_ERR_NET, "socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        st = jdt_err_set(e, JDT_ERR_NET, "bind %s:%d: %s", host, port, strerror(errno));
        goto out_close;
    }
    if (listen(fd, SOMAXCONN) != 0) {
        st = jdt_err_set(e, JDT_ERR_NET, "listen %s:%d: %s", host, port, strerror(errno));
        goto out_close;
    }
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    if (port_out) *port_out = ntohs(sa.sin_port);
    *fd_out = fd;
    return JDT_OK;
out_close:
    close(fd);
    return st;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

jdt_status jdt_net_connect(const char *host, int port, double deadline, atomic_int *abort_flag,
                           int *fd_out, jdt_err *e)
{
    struct sockaddr_in sa;
    jdt_status st = resolve(host, port, &sa, e);
    if (st) return st;
    int last_errno = 0;
    for (;;) {
        if (abort_flag && atomic_load(abort_flag))
            return jdt_err_set(e, JDT_ERR_INTERRUPTED, "connect %s:%d: aborted", host, port);
        /* non-blocking, so an unanswered SYN (a filtered port, a host that is down) waits
         * until the deadline and not the kernel's two minutes of retries */
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return jdt_err_set(e, JDT_ERR_NET, "socket: %s", strerror(errno));
        int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
        last_errno = rc == 0 ? 0 : errno;
        while (last_errno == EINPROGRESS) {
            double left = deadline - jdt_now_s();
            if (abort_flag && atomic_load(abort_flag)) break;
            if (left <= 0) {
                last_errno = ETIMEDOUT;
                break;
            }
            struct pollfd p = {fd, POLLOUT, 0};
            int n = poll(&p, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
            if (n < 0 && errno != EINTR) {
                last_errno = errno;
                break;
            }
            if (n > 0) {
                int err = 0;
                socklen_t el = sizeof err;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
                last_errno = err;
            }
        }
        if (last_errno == 0) {
            int fl = fcntl(fd, F_GETFL, 0);
            if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK); /* callers expect blocking */
            *fd_out = fd;
            return JDT_OK;
        }
        close(fd);
        if (last_errno == EINPROGRESS) continue; /* aborted: reported at the loop top */
        if (last_errno != ECONNREFUSED && last_errno != ENETUNREACH &&
            last_errno != EHOSTUNREACH && last_errno != ETIMEDOUT && last_errno != EINTR &&
            last_errno != ECONNRESET && last_errno != EAGAIN)
            return jdt_err_set(e, JDT_ERR_NET, "connect %s:%d: %s", host, port,
                               strerror(last_errno));
        if (jdt_now_s() >= deadline) break;
        sleep_s(0.05);
    }
    return jdt_err_set(e, JDT_ERR_TIMEOUT, "connect %s:%d: gave up at the deadline: %s", host, port,
                       strerror(last_errno));
}

void jdt_net_tune(int fd, int bufs)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    if (bufs > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufs, sizeof bufs);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufs, sizeof bufs);
    }
}

jdt_status jdt_net_set_nonblock(int fd, bool on, jdt_err *e)
{
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0) return jdt_err_set(e, JDT_ERR_NET, "fcntl: %s", strerror(errno));
    fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    if (fcntl(fd, F_SETFL, fl) < 0) return jdt_err_set(e, JDT_ERR_NET, "fcntl: %s", strerror(errno));
    return JDT_OK;
}

/* Waits until fd is ready for ev, the deadline passes or the abort flag is set. */
static jdt_status wait_fd(int fd, short ev, double deadline, atomic_int *abort_flag,
                          const char *what, const char *dir, jdt_err *e)
{
    for (;;) {
        if (abort_flag && atomic_load(abort_flag))
            return jdt_err_set(e, JDT_ERR_INTERRUPTED, "%s %s: aborted", dir, what);
        double left = deadline - jdt_now_s();
        if (left <= 0) return jdt_err_set(e, JDT_ERR_TIMEOUT, "%s %s: timed out", dir, what);
        int ms = left > 0.1 ? 100 : (int)(left * 1000) + 1;
        struct pollfd p = {fd, ev, 0};
        int rc = poll(&p, 1, ms);
        if (rc < 0 && errno != EINTR)
            return jdt_err_set(e, JDT_ERR_NET, "%s %s: poll: %s", dir, what, strerror(errno));
        if (rc > 0) return JDT_OK;
    }
}

jdt_status jdt_net_send_all(int fd, const void *buf, size_t n, double deadline,
                            atomic_int *abort_flag, const char *what, jdt_err *e)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            jdt_status st = wait_fd(fd, POLLOUT, deadline, abort_flag, what, "send to", e);
            if (st) return st;
            continue;
        }
        return jdt_err_set(e, JDT_ERR_PEER_LOST, "send to %s: %s", what,
                           w < 0 ? strerror(errno) : "connection closed");
    }
    return JDT_OK;
}

jdt_status jdt_net_recv_all(int fd, void *buf, size_t n, double deadline, atomic_int *abort_flag,
                            const char *what, jdt_err *e)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0)
            return jdt_err_set(e, JDT_ERR_PEER_LOST, "receive from %s: connection closed (EOF)",
                               what);
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            jdt_status st = wait_fd(fd, POLLIN, deadline, abort_flag, what, "receive from", e);
            if (st) return st;
            continue;
        }
        return jdt_err_set(e, JDT_ERR_PEER_LOST, "receive from %s: %s", what, strerror(errno));
    }
    return JDT_OK;
}

void jdt_net_peer_name(int fd, char *out, size_t cap)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    char ip[INET_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) == 0 && sa.sin_family == AF_INET) {
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
        snprintf(out, cap, "%s:%d", ip, ntohs(sa.sin_port));
    } else {
        snprintf(out, cap, "?");
    }
}

void jdt_net_route_ip(const char *addr, char *out, size_t cap)
{
    char host[JDT_HOST_MAX];
    int port;
    struct sockaddr_in sa, local;
    socklen_t sl = sizeof local;
    if (jdt_net_parse_addr(addr, host, sizeof host, &port, NULL) != JDT_OK ||
        resolve(host, port > 0 ? port : 9, &sa, NULL) != JDT_OK)
        return;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    /* connecting a UDP socket sends nothing; it only picks the route and source address */
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&local, &sl) == 0 && local.sin_addr.s_addr != 0)
        inet_ntop(AF_INET, &local.sin_addr, out, (socklen_t)cap);
    close(fd);
}

void jdt_net_local_ip(int fd, char *out, size_t cap)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) != 0 ||
        !inet_ntop(AF_INET, &sa.sin_addr, out, (socklen_t)cap))
        snprintf(out, cap, "127.0.0.1");
}

bool jdt_net_token_eq(const char *expected, const char *got, size_t got_len)
{
    size_t n = strlen(expected);
    volatile unsigned char diff = (unsigned char)(got_len != n);
    for (size_t i = 0; i < n; i++) {
        unsigned char g = i < got_len ? (unsigned char)got[i] : 0;
        diff |= (unsigned char)((unsigned char)expected[i] ^ g);
    }
    return diff == 0;
}
