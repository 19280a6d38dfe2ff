/*
 * fuzz_wire.c — libFuzzer target: the rendezvous frame decoder (engine/comm/wire.c). The input
 * is written into one end of a socket pair and read back frame by frame with jdt_wire_recv,
 * the function every rank and the coordinator receive with (header checks, length bound,
 * payload allocation); each payload is then decoded field by field the way the coordinator
 * and the ranks decode HELLO, WELCOME, KV, BARRIER, ABORT and REJECT messages, through the
 * bounds-checked reader. Any crash, overflow or over-read is a finding.
 */
#include "comm/comm-impl.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void decode(jdt_msg_type t, const uint8_t *p, uint32_t len)
{
    jdt_rbuf rb = {p, len, 0, false};
    char s[JDT_HOST_MAX > 1024 ? JDT_HOST_MAX : 1024];
    const uint8_t *bytes;
    switch (t) {
    case JDT_MSG_HELLO: /* token, rank, world, host, port, pid */
        jdt_rbuf_bytes(&rb, &bytes, JDT_TOKEN_MAX);
        jdt_rbuf_u32(&rb);
        jdt_rbuf_u32(&rb);
        jdt_rbuf_str(&rb, s, JDT_HOST_MAX);
        jdt_rbuf_u32(&rb);
        jdt_rbuf_u32(&rb);
        break;
    case JDT_MSG_WELCOME: { /* world, then host + port per rank */
        uint32_t world = jdt_rbuf_u32(&rb);
        for (uint32_t r = 0; r < world && r < 4096 && !rb.bad; r++) {
            jdt_rbuf_str(&rb, s, JDT_HOST_MAX);
            jdt_rbuf_u32(&rb);
        }
        break;
    }
    case JDT_MSG_KV_SET:
        jdt_rbuf_str(&rb, s, JDT_KV_MAX_KEY + 1);
        jdt_rbuf_bytes(&rb, &bytes, JDT_KV_MAX_VALUE);
        break;
    case JDT_MSG_KV_GET:
        jdt_rbuf_str(&rb, s, JDT_KV_MAX_KEY + 1);
        jdt_rbuf_u32(&rb);
        break;
    case JDT_MSG_KV_VALUE:
        jdt_rbuf_u32(&rb);
        jdt_rbuf_bytes(&rb, &bytes, JDT_KV_MAX_VALUE);
        break;
    case JDT_MSG_BARRIER:
        jdt_rbuf_u32(&rb);
        jdt_rbuf_u32(&rb);
        break;
    case JDT_MSG_BARRIER_DONE:
        jdt_rbuf_u32(&rb);
        jdt_rbuf_str(&rb, s, sizeof s);
        break;
    case JDT_MSG_ABORT:
        jdt_rbuf_u32(&rb);
        jdt_rbuf_u32(&rb);
        jdt_rbuf_str(&rb, s, 512);
        break;
    case JDT_MSG_REJECT:
        jdt_rbuf_u32(&rb);
        jdt_rbuf_str(&rb, s, 900);
        break;
    case JDT_MSG_HEARTBEAT: /* no payload: a stray field read must be caught as bad */
    case JDT_MSG_PONG:
    case JDT_MSG_ACK:
    case JDT_MSG_BYE:
    case JDT_MSG_COUNT: /* and every value past the last type */
    default:
        jdt_rbuf_u64(&rb);
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 200000) return 0; /* stays under the socket buffer: the write never blocks */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 0;
    int big = 1 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(sv[0], data + off, size - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    close(sv[0]); /* EOF after the input */
    for (int frames = 0; frames < 1000; frames++) {
        jdt_msg_type t;
        uint8_t *payload = NULL;
        uint32_t len = 0;
        jdt_err e;
        if (jdt_wire_recv(sv[1], &t, &payload, &len, jdt_now_s() + 1.0, NULL, "fuzz", &e) !=
            JDT_OK)
            break;
        decode(t, payload, len);
        jdt_free(payload);
    }
    close(sv[1]);
    return 0;
}
