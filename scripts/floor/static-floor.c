/* The floor under a cache hit on loopback: one thread, epoll, keep-alive, no parsing beyond
 * finding the end of each request head; every request is answered with the same file: a fixed
 * head, then the file by sendfile (from the page cache), or with -m head and file from memory in
 * one writev (the cheaper way for small files). What it costs per request is what the kernel
 * charges any server for the same bytes.
 * Build: gcc -O2 -o static-floor static-floor.c
 * Usage: static-floor PORT FILE [-m] (listens on 127.0.0.1:PORT until killed) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAXC 65536
struct conn { off_t off; size_t head_off; int sending; size_t inlen; char in[8192]; };
static struct conn *conns[MAXC];
static char head[256];
static size_t head_len, body_len;
static int file, memory;
static char *body;

static void stop(int ep, int fd) { epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL); close(fd); free(conns[fd]); conns[fd] = NULL; }

/* Sends what is left of the current answer: 1 done, 0 would block, -1 failed. */
static int push(int fd, struct conn *c) {
  while (memory && c->head_off < head_len) {
    struct iovec v[2] = {{head + c->head_off, head_len - c->head_off}, {body, body_len}};
    ssize_t n = writev(fd, v, 2);
    if (n < 0) return errno == EAGAIN ? 0 : -1;
    if ((size_t)n >= v[0].iov_len) { c->off = n - v[0].iov_len; c->head_off = head_len; }
    else c->head_off += n;
  }
  while (c->head_off < head_len) {
    ssize_t n = send(fd, head + c->head_off, head_len - c->head_off, MSG_MORE | MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN ? 0 : -1;
    c->head_off += n;
  }
  while ((size_t)c->off < body_len) {
    ssize_t n = memory ? send(fd, body + c->off, body_len - c->off, MSG_NOSIGNAL)
                       : sendfile(fd, file, &c->off, body_len - c->off);
    if (n < 0) return errno == EAGAIN ? 0 : -1;
    if (memory) c->off += n;
  }
  c->sending = 0;
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s PORT FILE [-m]\n", argv[0]); return 2; }
  file = open(argv[2], O_RDONLY);
  struct stat st;
  if (file < 0 || fstat(file, &st) < 0) { perror(argv[2]); return 1; }
  body_len = st.st_size;
  memory = argc > 3 && strcmp(argv[3], "-m") == 0;
  if (memory) { body = malloc(body_len); if (pread(file, body, body_len, 0) != (ssize_t)body_len) return 1; }
  head_len = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %zu\r\n\r\n", body_len);
  int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1])), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(l, (void *)&a, sizeof a) < 0 || listen(l, 1024) < 0) { perror("listen"); return 1; }
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = l}, evs[256];
  epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
  for (;;) {
    int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == l) {
        int c;
        while ((c = accept4(l, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
          if (c >= MAXC) { close(c); continue; }
          setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conns[c] = calloc(1, sizeof(struct conn));
          struct epoll_event ce = {.events = EPOLLIN | EPOLLET, .data.fd = c};
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
        }
        continue;
      }
      struct conn *c = conns[fd];
      if (!c) continue;
      if (c->sending) {
        int r = push(fd, c);
        if (r < 0) { stop(ep, fd); continue; }
        if (r == 0) continue;
      }
      for (;;) { /* read until EAGAIN (edge-triggered), answering each complete head */
        ssize_t got = recv(fd, c->in + c->inlen, sizeof c->in - c->inlen, 0);
        if (got == 0 || (got < 0 && errno != EAGAIN)) { stop(ep, fd); break; }
        if (got < 0) break;
        c->inlen += got;
        char *end;
        while (!c->sending && (end = memmem(c->in, c->inlen, "\r\n\r\n", 4))) {
          size_t used = end + 4 - c->in;
          memmove(c->in, end + 4, c->inlen - used);
          c->inlen -= used;
          c->off = 0; c->head_off = 0; c->sending = 1;
          int r = push(fd, c);
          if (r < 0) { stop(ep, fd); c = NULL; break; }
        }
        if (!c) break;
        if (c->sending) { /* wait for room, then carry on */
          struct epoll_event ce = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.fd = fd};
          epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ce);
          break;
        }
        if (c->inlen == sizeof c->in) { stop(ep, fd); break; }
      }
    }
  }
}
