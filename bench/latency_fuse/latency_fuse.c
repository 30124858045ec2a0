/* A read-only FUSE passthrough that answers every request D microseconds late: network
 * storage's per-request latency without a network's CPU cost (bench/remote_fs.py --transport
 * fuse). libfuse's multi-threaded loop serves each request on its own thread, so requests in
 * flight overlap as they do on a network.
 *
 *   latency_fuse SOURCE_DIR MOUNTPOINT DELAY_US [fuse options, e.g. -o max_threads=64]
 */
#define FUSE_USE_VERSION 31
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *source;
static long delay_us;

static void wait_round_trip(void) {
    if (delay_us > 0) {
        struct timespec ts = {delay_us / 1000000, (delay_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
}

static void full_path(char out[PATH_MAX], const char *path) {
    snprintf(out, PATH_MAX, "%s%s", source, path);
}

static int lf_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    char p[PATH_MAX];
    (void)fi;
    wait_round_trip();
    full_path(p, path);
    return lstat(p, st) == 0 ? 0 : -errno;
}

static int lf_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    char p[PATH_MAX];
    (void)off; (void)fi; (void)flags;
    wait_round_trip();
    full_path(p, path);
    DIR *dir = opendir(p);
    if (!dir) return -errno;
    for (struct dirent *e; (e = readdir(dir));) fill(buf, e->d_name, NULL, 0, 0);
    closedir(dir);
    return 0;
}

static int lf_open(const char *path, struct fuse_file_info *fi) {
    char p[PATH_MAX];
    if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
    wait_round_trip();
    full_path(p, path);
    int fd = open(p, O_RDONLY);
    if (fd < 0) return -errno;
    fi->fh = fd;
    fi->keep_cache = 1; /* pages stay cached across opens, as on NFS; cold runs evict them */
    return 0;
}

static int lf_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)path;
    wait_round_trip();
    ssize_t n = pread(fi->fh, buf, size, off);
    return n < 0 ? -errno : (int)n;
}

static int lf_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close(fi->fh);
    return 0;
}

static const struct fuse_operations ops = {
    .getattr = lf_getattr,
    .readdir = lf_readdir,
    .open = lf_open,
    .read = lf_read,
    .release = lf_release,
};

int main(int argc, char *argv[]) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s SOURCE_DIR MOUNTPOINT DELAY_US [fuse options]\n", argv[0]);
        return 2;
    }
    source = realpath(argv[1], NULL);
    if (!source) { perror(argv[1]); return 2; }
    delay_us = atol(argv[3]);
    char *fargv[64];
    int fargc = 0;
    fargv[fargc++] = argv[0];
    fargv[fargc++] = "-f";
    fargv[fargc++] = "-o";
    fargv[fargc++] = "ro,default_permissions";
    for (int i = 4; i < argc && fargc < 62; i++) fargv[fargc++] = argv[i];
    fargv[fargc++] = argv[2];
    return fuse_main(fargc, fargv, &ops, NULL);
}
