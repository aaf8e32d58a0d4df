/* The pod runner's stand-in for a pod's network namespace, for one thing only: binding.
 *
 * In a pod, a server that binds 0.0.0.0 listens on the pod's own address. The local backend
 * runs every pod's process on one host, each with a pod IP inside 127.0.0.0/8, so this shim
 * (LD_PRELOAD) turns bind(0.0.0.0:port) into bind(<pod IP>:port), the pod IP read from
 * TIERGATE_POD_IP. Two pods can then both listen on :8000 without colliding. Any other
 * bind, including an explicit address, passes through unchanged. Test infrastructure only.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    const char *pod_ip = getenv("TIERGATE_POD_IP");
    if (pod_ip && addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
        struct sockaddr_in rewritten;
        if (in->sin_addr.s_addr == htonl(INADDR_ANY)) {
            memcpy(&rewritten, in, sizeof rewritten);
            if (inet_pton(AF_INET, pod_ip, &rewritten.sin_addr) == 1)
                return real_bind(fd, (const struct sockaddr *)&rewritten, sizeof rewritten);
        }
    }
    return real_bind(fd, addr, len);
}
