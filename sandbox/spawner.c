/*
 * protolink-spawner: starts the sandbox's commands as the command user (see sandbox/protolink_sandboxd/spawner.py).
 *
 * `python -m protolink_sandboxd.spawner` (or the server's fork of it) executes this program, which takes the
 * command user's identity (below) and serves the server's channel until it closes: each
 * SPAWN request starts one command with vfork and execve and is answered with STARTED (its pid)
 * or FAILED (errno and message); each command's exit is reported with EXITED. A request that
 * carries a resolution check (the command as written, resolved again) starts nothing unless the
 * check passes (CHANGED otherwise). A RESOLVE request looks a command up with the command user's
 * permissions. The rules of resolution are the server's (protolink/execution/resolve.py): it
 * sends the candidate files in order, and this program only says which directory a path names
 * and which candidate is the first executable file. The server (sandbox/protolink_sandboxd/spawner_client.py) holds the
 * other end of the wire format, stated once here and once there (a test compares them):
 *
 *   frame:    kind (u8), request id (u64), payload length (u32), all big-endian; then the payload
 *   SPAWN:    NUL-terminated fields: argc, argv..., cwd, envc, NAME=VALUE..., kill-after
 *             (milliseconds, decimal; 0: never), written cwd (empty: no check), candidate count,
 *             candidates..., the real path argv[0] must resolve to (empty: no check); the stdout
 *             and stderr pipe ends ride along as SCM_RIGHTS, and a third descriptor, when one
 *             comes, is the command's stdin (else /dev/null)
 *   RESOLVE:  NUL-terminated fields: written cwd, candidate count, candidates (relative ones are
 *             taken in the directory the written cwd names)
 *   STARTED:  the command's pid, its keeper's pid (i32 each)
 *   FAILED:   errno (i32), message
 *   EXITED:   exit code (i32, -signal), then 1 when the keeper killed the command's group at its
 *             kill-after time, else 0 (i32)
 *   CHANGED:  empty: the written cwd or the first executable candidate is no longer the approved
 *             one, or argv[0] no longer resolves to the approved real path
 *   RESOLVED: index of the first executable candidate (i32, -1: none), the directory's real path,
 *             NUL, and the candidate's real path (empty when none)
 *   REFUSED:  empty: the written cwd names no directory
 *   WARM:     request id 0: the pid (i32) of the keeper forked ahead, waiting for the next command
 *             (0: none waits any more)
 *
 * A command starts as Python's subprocess would start it for the host (start_process): leader
 * of a new session, stdin on /dev/null (or the pipe its SPAWN passed), stdout and stderr on the
 * pipes, the working directory and environment of the request, umask 022, no other descriptors,
 * every signal at its default and unblocked, every CPU this process started with, oom_score_adj
 * --oom-command, nice 19 (the lowest priority: the container's RLIMIT_NICE is 0, so commands
 * cannot raise it, and however many of them spin, the server, its workers, this process and the
 * keepers get the CPU first).
 *
 * Each command has a keeper: a child of this process that starts the command and is its
 * parent, a child subreaper (PR_SET_CHILD_SUBREAPER) so that whatever the command's descendants
 * orphan (double forks, daemons, setsid) is reparented to the keeper, never to PID 1. So every
 * process descended from a running command stays below this process, whatever its group or
 * session. The keeper reaps those orphans, and when the command exits it reports the exit and
 * exits too: what the command left behind drops out from under this process, and the server's
 * stray sweep (sandbox/protolink_sandboxd/strays.py) kills it. A keeper also kills its command's
 * group with SIGKILL once the SPAWN's kill-after time has passed since the command started. The
 * server's own kill (SIGTERM at the deadline, SIGKILL after a grace) comes by then; the keeper's
 * is for a server the command starves of the CPU (gVisor runs the server as one task among the
 * command's, whatever their nice values): a signal handler and one kill need almost none. The
 * next command's keeper is forked ahead, at the start and once a command's exit has been
 * reported and nothing waits, so that no command waits for that fork (a request that finds none forks one then); it waits on a socket
 * pair of its own for its command (argv, directory, environment and the output pipes), takes
 * every CPU back (a command may have pinned it meanwhile), and is named to the server (WARM).
 * Where subreapers are refused (gVisor) the keeper is a plain parent, none is forked ahead, and
 * the server tracks descent by what its sweeps saw. The keeper holds the
 * command's oom_score_adj (it cannot open its own /proc files to lower it).
 *
 * Identity: `python -m protolink_sandboxd.spawner` executes this program as root, with no new privileges
 * and its limits set; the program then takes its identity for good (take_identity):
 * no supplementary groups, every gid --gid, no capabilities, effective (and so file-system) uid
 * the command user's, real and saved uid the shield (an unprivileged uid of its own). Files are
 * accessed and created as the command user, and the command user's processes cannot signal or
 * prlimit this one (they may renice it and set its affinity: the kernel compares the caller's
 * effective uid with the target's real or effective uid). Keepers have the same identity; each
 * command takes the command user's real uid itself, in the child, before it executes.
 *
 * A broken frame or an unexpected failure ends this process; the server starts another.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

enum { SPAWN = 1, RESOLVE = 2, STARTED = 11, FAILED = 12, EXITED = 13, RESOLVED = 14, REFUSED = 15, CHANGED = 16, WARM = 17 };
/* A SPAWN passes the output pipes (PIPE_FDS), and the stdin pipe after them when it has one (MAX_FDS). */
enum { HEADER_SIZE = 13, PIPE_FDS = 2, MAX_FDS = 3, COMMAND_UMASK = 022, COMMAND_NICE = 19 };

struct options {
    int channel, oom_fd, oom_command, oom_helper;
    uid_t uid, shield;
    gid_t gid;
    pid_t server;
    uint32_t max_request_bytes;
};

/* A running command's keeper, and this end of the socket pair it reports on: first the command's
 * pid and the errno of its start, then its exit code. */
struct child {
    pid_t keeper;
    uint64_t request;
    int report;
};

/* The keeper forked ahead (pid 0: none), waiting on `link` for its command: the length of its
 * SPAWN payload (u32, with the output pipes and maybe the stdin pipe as SCM_RIGHTS), then the payload. */
struct warm {
    pid_t keeper;
    int link;
};

static struct options opt;
static struct child *children;
static size_t child_count, child_room;
static struct warm warm;
/* Whether this process's children may become child subreapers (gVisor refuses). */
static int subreapers;
static cpu_set_t all_cpus;
static int devnull = -1, signals = -1;
/* Written by the vfork child (it shares this memory) when it cannot exec; and whether what
 * failed was entering the working directory. */
static volatile int child_error, child_in_directory;
/* What a keeper reports in place of its command's pid when the command did not start. */
enum { NOT_STARTED = -1, NO_DIRECTORY = -2 };
/* The longest kill-after time a SPAWN may ask for, in milliseconds (about 24 days). */
static const unsigned long long MAX_KILL_AFTER_MS = (unsigned long long)INT32_MAX * 1000;
/* A keeper's command (its group), and whether the keeper's kill-after time has passed. */
static volatile pid_t kept_group;
static volatile sig_atomic_t kill_after_passed;

static _Noreturn void die(const char *what) {
    fprintf(stderr, "protolink-spawner: %s: %s\n", what, strerror(errno));
    exit(1);
}

static _Noreturn void broken(const char *what) {
    fprintf(stderr, "protolink-spawner: %s\n", what);
    exit(1);
}

static void put_u32(unsigned char *at, uint32_t value) {
    at[0] = value >> 24; at[1] = value >> 16; at[2] = value >> 8; at[3] = value;
}

static uint32_t get_u32(const unsigned char *at) {
    return (uint32_t)at[0] << 24 | (uint32_t)at[1] << 16 | (uint32_t)at[2] << 8 | at[3];
}

static void send_all(const unsigned char *data, size_t size) {
    while (size) {
        ssize_t sent = send(opt.channel, data, size, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) continue;
        if (sent < 0) exit(errno == EPIPE || errno == ECONNRESET ? 0 : 1);  /* the server is gone */
        data += sent;
        size -= (size_t)sent;
    }
}

/* An answer goes out in one send: the server then wakes once for it, not for its header and
 * again for its payload. */
static void answer(int kind, uint64_t request, const void *payload, uint32_t length) {
    unsigned char *frame = malloc(HEADER_SIZE + (size_t)length);
    if (!frame) die("malloc");
    frame[0] = (unsigned char)kind;
    put_u32(frame + 1, (uint32_t)(request >> 32));
    put_u32(frame + 5, (uint32_t)request);
    put_u32(frame + 9, length);
    if (length) memcpy(frame + HEADER_SIZE, payload, length);
    send_all(frame, HEADER_SIZE + (size_t)length);
    free(frame);
}

static void answer_number(int kind, uint64_t request, uint32_t number) {
    unsigned char payload[4];
    put_u32(payload, number);
    answer(kind, request, payload, sizeof payload);
}

static void answer_failure(uint64_t request, int error, const char *message) {
    size_t length = strlen(message);
    unsigned char *payload = malloc(4 + length);
    if (!payload) die("malloc");
    put_u32(payload, (uint32_t)error);
    memcpy(payload + 4, message, length);
    answer(FAILED, request, payload, (uint32_t)(4 + length));
    free(payload);
}

/* The descriptors `message` carries into `fds` (MAX_FDS at most, counted in `fd_count`); any
 * beyond are closed. */
static void take_descriptors(struct msghdr *message, int *fds, int *fd_count) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR(message); c; c = CMSG_NXTHDR(message, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (*fd_count < MAX_FDS) fds[(*fd_count)++] = fd;
            else close(fd);
        }
    }
}

/* Read up to `size` bytes from `fd`, and with `fds` the descriptors that come along (see
 * take_descriptors); how many came before the end of the stream, or -1 with errno set. */
static ssize_t read_with_fds(int fd, unsigned char *into, size_t size, int *fds, int *fd_count) {
    size_t got = 0;
    while (got < size) {
        struct iovec part = {into + got, size - got};
        union { struct cmsghdr header; char space[CMSG_SPACE(4 * sizeof(int))]; } control;
        struct msghdr message = {.msg_iov = &part, .msg_iovlen = 1};
        if (fds) {
            message.msg_control = control.space;
            message.msg_controllen = sizeof control.space;
        }
        ssize_t n = recvmsg(fd, &message, fds ? MSG_CMSG_CLOEXEC : 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -1;
        if (fds) take_descriptors(&message, fds, fd_count);
        if (n == 0) break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

/* Read exactly `size` bytes from the channel; false at end of stream before the first byte,
 * exit on a partial frame. */
static int receive(unsigned char *into, size_t size, int *fds, int *fd_count) {
    ssize_t got = read_with_fds(opt.channel, into, size, fds, fd_count);
    if (got < 0) die("recvmsg");
    if (got == 0) return 0;
    if ((size_t)got < size) broken("the channel closed in the middle of a frame");
    return 1;
}

/* The request's NUL-terminated fields, one after another. */
struct fields {
    char *next, *end;
};

static char *field(struct fields *in) {
    char *start = in->next;
    char *nul = start < in->end ? memchr(start, '\0', (size_t)(in->end - start)) : NULL;
    if (!nul) broken("a SPAWN request ends in the middle of a field");
    in->next = nul + 1;
    return start;
}

static size_t count(struct fields *in) {
    char *text = field(in), *rest;
    errno = 0;
    unsigned long value = strtoul(text, &rest, 10);
    if (errno || *text == '\0' || *rest != '\0' || value > (size_t)(in->end - in->next)) broken("a SPAWN request has a bad count");
    return value;
}

/* A kill-after time in milliseconds. */
static unsigned long long milliseconds(struct fields *in) {
    char *text = field(in), *rest;
    errno = 0;
    unsigned long long value = strtoull(text, &rest, 10);
    if (errno || *text < '0' || *text > '9' || *rest != '\0' || value > MAX_KILL_AFTER_MS)
        broken("a SPAWN request has a bad kill-after time");
    return value;
}

/* `count` fields as a NULL-terminated vector (pointing into the payload). */
static char **vector(struct fields *in, size_t n) {
    char **items = calloc(n + 1, sizeof *items);
    if (!items) die("calloc");
    for (size_t i = 0; i < n; i++) items[i] = field(in);
    return items;
}

/* The real path of the directory `path` names (to free), or NULL. */
static char *directory(const char *path) {
    char *real = realpath(path, NULL);
    struct stat info;
    if (real && (stat(real, &info) != 0 || !S_ISDIR(info.st_mode))) {
        free(real);
        real = NULL;
    }
    return real;
}

/* The index of the first executable file (a regular file we may execute, by effective ids)
 * among `candidates`, relative ones taken in `dir`; -1 when there is none. */
static long first_executable(const char *dir, char **candidates) {
    int at = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    long found = -1;
    for (long i = 0; at >= 0 && candidates[i] && found < 0; i++) {
        struct stat info;
        if (fstatat(at, candidates[i], &info, 0) == 0 && S_ISREG(info.st_mode)
            && faccessat(at, candidates[i], X_OK, AT_EACCESS) == 0)
            found = i;
    }
    if (at >= 0) close(at);
    return found;
}

/* Whether `written` still names the approved directory `cwd` and the first executable file
 * among the candidates is still `argv0`. */
static int still_resolves(const char *written, const char *cwd, const char *argv0, char **candidates) {
    char *real = directory(written);
    int same = real && strcmp(real, cwd) == 0;
    free(real);
    long found = same ? first_executable(cwd, candidates) : -1;
    return found >= 0 && strcmp(candidates[found], argv0) == 0;
}

/* The real path of `path` taken in the directory `dir` (to free), or NULL. */
static char *real_path_in(const char *dir, const char *path) {
    if (path[0] == '/') return realpath(path, NULL);
    char *joined = malloc(strlen(dir) + strlen(path) + 2);
    if (!joined) die("malloc");
    sprintf(joined, "%s/%s", dir, path);
    char *real = realpath(joined, NULL);
    free(joined);
    return real;
}

/* Whether `executable` still resolves to the real path `approved`. */
static int still_runs(const char *executable, const char *approved) {
    char *real = realpath(executable, NULL);
    int same = real && strcmp(real, approved) == 0;
    free(real);
    return same;
}

static void resolve(uint64_t request, char *payload, uint32_t length) {
    struct fields in = {payload, payload + length};
    char *written = field(&in);
    char **candidates = vector(&in, count(&in));
    if (in.next != in.end) broken("a RESOLVE request has fields left over");
    char *real = directory(written);
    if (!real) {
        answer(REFUSED, request, NULL, 0);
    } else {
        long index = first_executable(real, candidates);
        char *file = index >= 0 ? real_path_in(real, candidates[index]) : NULL;
        if (index >= 0 && !file) index = -1;  /* gone meanwhile */
        size_t size = strlen(real), file_size = file ? strlen(file) : 0;
        unsigned char *found = malloc(4 + size + 1 + file_size);
        if (!found) die("malloc");
        put_u32(found, (uint32_t)index);
        memcpy(found + 4, real, size);
        found[4 + size] = '\0';
        if (file) memcpy(found + 5 + size, file, file_size);
        answer(RESOLVED, request, found, (uint32_t)(5 + size + file_size));
        free(found);
        free(file);
        free(real);
    }
    free(candidates);
}

static void set_oom_score_adj(int score) {
    char text[16];
    int length = snprintf(text, sizeof text, "%d", score);
    if (write(opt.oom_fd, text, (size_t)length) != length) die("oom_score_adj");
}

static void remember(pid_t keeper, uint64_t request, int report) {
    if (child_count == child_room) {
        child_room = child_room ? 2 * child_room : 64;
        children = realloc(children, child_room * sizeof *children);
        if (!children) die("realloc");
    }
    children[child_count++] = (struct child){keeper, request, report};
}

/* Write all of `size` bytes to `fd` (a pipe to the spawner); false when it cannot. */
static int write_all(int fd, const void *data, size_t size) {
    const char *at = data;
    while (size) {
        ssize_t written = write(fd, at, size);
        if (written < 0 && errno == EINTR) continue;
        if (written <= 0) return 0;
        at += written;
        size -= (size_t)written;
    }
    return 1;
}

/* Read exactly `size` bytes from `fd`; false at end of file (or an error) before that. */
static int read_all(int fd, void *into, size_t size) {
    char *at = into;
    while (size) {
        ssize_t got = read(fd, at, size);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 0;
        at += got;
        size -= (size_t)got;
    }
    return 1;
}

/* Send all of `size` bytes, and `fds` with the first, to a keeper; false when it has gone. */
static int send_to_keeper(int link, const void *data, size_t size, const int *fds, int fd_count) {
    const char *at = data;
    union { struct cmsghdr header; char space[CMSG_SPACE(MAX_FDS * sizeof(int))]; } control;
    while (size) {
        struct iovec part = {(void *)at, size};
        struct msghdr message = {.msg_iov = &part, .msg_iovlen = 1};
        if (fd_count) {
            memset(&control, 0, sizeof control);
            message.msg_control = control.space;
            message.msg_controllen = CMSG_SPACE(fd_count * sizeof(int));
            struct cmsghdr *c = CMSG_FIRSTHDR(&message);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(fd_count * sizeof(int));
            memcpy(CMSG_DATA(c), fds, fd_count * sizeof(int));
        }
        ssize_t sent = sendmsg(link, &message, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0) return 0;
        fd_count = 0;  /* they went with the first byte */
        at += sent;
        size -= (size_t)sent;
    }
    return 1;
}

/* The keeper's command, from the spawner: its argv, working directory and environment (pointing
 * into `payload`, a SPAWN payload the spawner has checked), its output pipes and its stdin pipe
 * (-1: none, /dev/null). */
struct command {
    char *payload, **argv, *cwd, **env;
    unsigned long long kill_after_ms;
    int out, err, in;
};

/* Wait on `link` for the command; false when the spawner closed it first (or broke it). */
static int await_command(int link, struct command *command) {
    unsigned char header[4];
    int fds[MAX_FDS], fd_count = 0;
    if (read_with_fds(link, header, sizeof header, fds, &fd_count) != (ssize_t)sizeof header) return 0;
    uint32_t length = get_u32(header);
    command->payload = malloc(length ? length : 1);
    if (fd_count < PIPE_FDS || !command->payload || !read_all(link, command->payload, length)) return 0;
    struct fields in = {command->payload, command->payload + length};
    command->argv = vector(&in, count(&in));
    command->cwd = field(&in);
    command->env = vector(&in, count(&in));
    command->kill_after_ms = milliseconds(&in);
    command->out = fds[0];
    command->err = fds[1];
    command->in = fd_count == MAX_FDS ? fds[2] : -1;
    return 1;
}

/* Close every descriptor above 2 but `a` and `b`. */
static void keep_only(int a, int b) {
    unsigned low = (unsigned)(a < b ? a : b), high = (unsigned)(a < b ? b : a);
    if (low > 3) syscall(SYS_close_range, 3U, low - 1, 0U);
    if (high > low + 1) syscall(SYS_close_range, low + 1, high - 1, 0U);
    syscall(SYS_close_range, high + 1, ~0U, 0U);
}

/* SIGALRM in a keeper: its command's kill-after time has passed. Killing here, not after the
 * wait below returns, leaves no moment in which the signal could come unseen. */
static void kill_kept_group(int signum) {
    (void)signum;
    kill(-kept_group, SIGKILL);
    kill_after_passed = 1;
}

/* Kill the kept group `after_ms` milliseconds from now (0: never). */
static void arm_kill_after(unsigned long long after_ms) {
    if (!after_ms) return;
    struct sigaction on_alarm = {.sa_handler = kill_kept_group};  /* no SA_RESTART: a wait ends with EINTR */
    sigemptyset(&on_alarm.sa_mask);
    struct itimerval at = {.it_value = {.tv_sec = (time_t)(after_ms / 1000), .tv_usec = (suseconds_t)(after_ms % 1000) * 1000}};
    /* Neither fails on these arguments; were one to, the server's own kill would still come. */
    if (sigaction(SIGALRM, &on_alarm, NULL) == 0) setitimer(ITIMER_REAL, &at, NULL);
}

/* The keeper (see the top): forked ahead of its command, it waits on `link` for it, starts it as
 * the command user, reports its pid and the errno of its start on `link`, kills the command's
 * group at its kill-after time, reaps what comes to it until the command exits, and reports the
 * exit code and whether it killed the group. */
static _Noreturn void keep(int link, pid_t spawner) {
    sigset_t none;
    sigemptyset(&none);
    /* Nothing of the spawner's but what the command needs: not its channel, not the links of
     * other commands' keepers, not the pipes of a request it is serving. */
    keep_only(link, devnull);
    /* Refused under gVisor: the keeper is then a plain parent (the server knows). */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != spawner) _exit(1);
    struct command command;
    if (!await_command(link, &command)) _exit(0);
    /* Every CPU again: a command may have pinned this keeper while it waited. */
    if (sched_setaffinity(0, sizeof all_cpus, &all_cpus) != 0) _exit(1);
    child_error = child_in_directory = 0;
    pid_t pid = vfork();
    if (pid == 0) {
        /* The child takes the command user's real uid itself (its effective uid already is),
         * with the system call: the C library's wrapper would act on the keeper's threads. The
         * keeper's own real uid stays the shield, so commands can never signal it. */
        if (syscall(SYS_setresuid, opt.uid, (uid_t)-1, (uid_t)-1) != 0 || setsid() < 0
            || dup2(command.in >= 0 ? command.in : devnull, 0) < 0
            || dup2(command.out, 1) < 0 || dup2(command.err, 2) < 0) {
            child_error = errno;
            _exit(127);
        }
        if (chdir(command.cwd) < 0) {
            child_error = errno;
            child_in_directory = 1;
            _exit(127);
        }
        umask(COMMAND_UMASK);
        setpriority(PRIO_PROCESS, 0, COMMAND_NICE);
        syscall(SYS_close_range, 3U, ~0U, 0U);  /* every other descriptor is close-on-exec anyway */
        sigprocmask(SIG_SETMASK, &none, NULL);
        execve(command.argv[0], command.argv, command.env);
        child_error = errno;
        _exit(127);
    }
    int32_t started[2] = {pid, pid < 0 ? errno : child_error};
    close(command.out);
    close(command.err);
    if (command.in >= 0) close(command.in);
    close(devnull);
    if (started[1]) {
        if (pid > 0) while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
        started[0] = child_in_directory ? NO_DIRECTORY : NOT_STARTED;
    }
    if (!write_all(link, started, sizeof started) || started[1]) _exit(0);
    kept_group = pid;
    arm_kill_after(command.kill_after_ms);
    int status = 0;
    for (;;) {
        pid_t reaped = waitpid(-1, &status, 0);
        if (reaped == pid) break;
        if (reaped < 0 && errno != EINTR) _exit(1);
    }
    int32_t ended[2] = {WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status),
                        kill_after_passed && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL};
    write_all(link, ended, sizeof ended);
    _exit(0);
}

/* Fork a keeper that waits for its command (`warm`); false with errno set when it cannot. The
 * keeper takes the command's score and every CPU (a command may have pinned this process). */
static int fork_keeper(void) {
    int link[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, link) != 0) return 0;
    set_oom_score_adj(opt.oom_command);
    if (sched_setaffinity(0, sizeof all_cpus, &all_cpus) != 0) die("sched_setaffinity");
    pid_t spawner = getpid();
    pid_t keeper = fork();
    if (keeper == 0) {
        close(link[0]);
        keep(link[1], spawner);
    }
    int error = errno;
    set_oom_score_adj(opt.oom_helper);
    close(link[1]);
    if (keeper < 0) {
        close(link[0]);
        errno = error;
        return 0;
    }
    warm = (struct warm){keeper, link[0]};
    return 1;
}

/* Fork the next command's keeper now, while nothing waits (the fork is then off a command's
 * path), and tell the server its pid (a process of the spawner's, not a stray). Only where
 * keepers are subreapers: elsewhere (gVisor) the server's sweeps take every child of this
 * process for a running command's keeper, and one waiting for its command would spare what
 * the commands before it orphaned. */
static void fork_ahead(void) {
    if (!subreapers || warm.keeper || !fork_keeper()) return;
    answer_number(WARM, 0, (uint32_t)warm.keeper);
}

/* The keeper forked ahead died before it was given a command (the OOM killer): none waits. */
static void lose_warm(void) {
    close(warm.link);
    warm = (struct warm){0, -1};
    answer_number(WARM, 0, 0);
}

/* Start the checked SPAWN payload as the command user under a keeper of its own (the one
 * forked ahead, or one forked now); the command's pid (and the keeper's in `keeper`), or -1
 * with errno set, and `failure` when the errno's own text would not say what happened. */
static pid_t start(const char *payload, uint32_t length, const int *fds, int fd_count, uint64_t request,
                   pid_t *keeper, const char **failure) {
    if (!warm.keeper && !fork_keeper()) return -1;
    struct warm taken = warm;
    warm = (struct warm){0, -1};
    *keeper = taken.keeper;
    unsigned char header[4];
    put_u32(header, length);
    int32_t started[2] = {-1, ECHILD};  /* a keeper that died before it reported */
    if (!send_to_keeper(taken.link, header, sizeof header, fds, fd_count)
        || !send_to_keeper(taken.link, payload, length, NULL, 0)
        || !read_all(taken.link, started, sizeof started) || started[0] <= 0) {
        kill(taken.keeper, SIGKILL);  /* one that broke off, or is on its way out */
        while (waitpid(taken.keeper, NULL, 0) < 0 && errno == EINTR) {}
        close(taken.link);
        errno = started[1] > 0 ? started[1] : ECHILD;
        if (errno == ECHILD) *failure = "the command's keeper ended before it reported the start";
        if (started[0] == NO_DIRECTORY) {
            static char directory_failure[128];
            snprintf(directory_failure, sizeof directory_failure, "its working directory: %s", strerror(errno));
            *failure = directory_failure;
        }
        return -1;
    }
    remember(taken.keeper, request, taken.link);
    return started[0];
}

static void spawn(uint64_t request, char *payload, uint32_t length, const int *fds, int fd_count) {
    struct fields in = {payload, payload + length};
    char **argv = vector(&in, count(&in));
    char *cwd = field(&in);
    char **env = vector(&in, count(&in));
    milliseconds(&in);  /* the keeper's */
    char *written = field(&in);
    char **candidates = vector(&in, count(&in));
    char *approved = field(&in);
    if (in.next != in.end || !argv[0]) broken("a SPAWN request has fields left over or no argv");
    if (fd_count < PIPE_FDS) {
        answer_failure(request, EMFILE, "the output pipes did not arrive");
    } else if ((*written && !still_resolves(written, cwd, argv[0], candidates))
               || (*approved && !still_runs(argv[0], approved))) {
        answer(CHANGED, request, NULL, 0);
    } else {
        const char *failure = NULL;
        pid_t keeper;
        pid_t pid = start(payload, length, fds, fd_count, request, &keeper, &failure);
        if (pid < 0) {
            answer_failure(request, errno, failure ? failure : strerror(errno));
        } else {
            unsigned char pids[8];
            put_u32(pids, (uint32_t)pid);
            put_u32(pids + 4, (uint32_t)keeper);
            answer(STARTED, request, pids, sizeof pids);
        }
    }
    free(argv);
    free(env);
    free(candidates);
}

/* Serve one frame; the kind of request it was, 0 once the server has closed the channel. */
static int serve_request(void) {
    unsigned char header[HEADER_SIZE];
    int fds[MAX_FDS], fd_count = 0;
    if (!receive(header, sizeof header, fds, &fd_count)) return 0;
    uint64_t request = (uint64_t)get_u32(header + 1) << 32 | get_u32(header + 5);
    uint32_t length = get_u32(header + 9);
    if (header[0] != SPAWN && header[0] != RESOLVE) broken("an unknown request kind");
    if (length > opt.max_request_bytes) broken("a request over --max-request-bytes");
    char *payload = malloc(length ? length : 1);
    if (!payload) die("malloc");
    if (length && !receive((unsigned char *)payload, length, NULL, NULL)) broken("the channel closed in the middle of a frame");
    if (header[0] == SPAWN) spawn(request, payload, length, fds, fd_count);
    else resolve(request, payload, length);
    for (int i = 0; i < fd_count; i++) close(fds[i]);
    free(payload);
    return header[0];
}

/* Reap exited keepers and report their commands' exits (a keeper that died before its command
 * exited reports the signal that ended it, and no kill); whether it reported one. */
static int reap(void) {
    int reported = 0;
    struct signalfd_siginfo info;
    while (read(signals, &info, sizeof info) > 0) {}
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) return reported;
        if (pid == warm.keeper) lose_warm();
        for (size_t i = 0; i < child_count; i++) {
            if (children[i].keeper != pid) continue;
            int32_t ended[2];
            if (!read_all(children[i].report, ended, sizeof ended)) {
                ended[0] = WIFSIGNALED(status) ? -WTERMSIG(status) : -SIGKILL;
                ended[1] = 0;
            }
            uint64_t request = children[i].request;
            close(children[i].report);
            children[i] = children[--child_count];
            unsigned char payload[8];
            put_u32(payload, (uint32_t)ended[0]);
            put_u32(payload + 4, (uint32_t)ended[1]);
            answer(EXITED, request, payload, sizeof payload);
            reported = 1;
            break;
        }
    }
}

/* Become the command user for good (see the identity at the top), and check that it took. */
static void take_identity(void) {
    if (setgroups(0, NULL) != 0 || setresgid(opt.gid, opt.gid, opt.gid) != 0
        || setresuid(opt.shield, opt.uid, opt.shield) != 0)
        die("taking the command user's identity");
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[2] = {{0, 0, 0}, {0, 0, 0}}, caps[2];
    if (syscall(SYS_capset, &header, none) != 0) die("capset");
    uid_t real, effective, saved;
    gid_t real_gid, effective_gid, saved_gid;
    if (getresuid(&real, &effective, &saved) != 0 || getresgid(&real_gid, &effective_gid, &saved_gid) != 0
        || syscall(SYS_capget, &header, caps) != 0)
        die("checking the identity");
    if (real != opt.shield || effective != opt.uid || saved != opt.shield || real_gid != opt.gid
        || effective_gid != opt.gid || saved_gid != opt.gid || getgroups(0, NULL) != 0
        || memcmp(caps, none, sizeof caps) != 0)
        broken("the identity did not take: other uids, gids, groups or capabilities remain");
}

static long number(const char *text, long low, long high) {
    char *rest;
    errno = 0;
    long value = strtol(text, &rest, 10);
    if (errno || *text == '\0' || *rest != '\0' || value < low || value > high) broken("a bad number on the command line");
    return value;
}

static void parse(int argc, char **argv) {
    if (argc != 19) broken("usage: protolink-spawner --channel-fd N --oom-fd N --oom-command N --oom-helper N "
                           "--uid N --gid N --shield N --server PID --max-request-bytes N");
    for (int i = 1; i < argc; i += 2) {
        const char *name = argv[i], *value = argv[i + 1];
        if (!strcmp(name, "--channel-fd")) opt.channel = (int)number(value, 3, INT_MAX);
        else if (!strcmp(name, "--oom-fd")) opt.oom_fd = (int)number(value, 3, INT_MAX);
        else if (!strcmp(name, "--oom-command")) opt.oom_command = (int)number(value, -1000, 1000);
        else if (!strcmp(name, "--oom-helper")) opt.oom_helper = (int)number(value, -1000, 1000);
        else if (!strcmp(name, "--uid")) opt.uid = (uid_t)number(value, 1, UINT32_MAX - 1);
        else if (!strcmp(name, "--gid")) opt.gid = (gid_t)number(value, 1, UINT32_MAX - 1);
        else if (!strcmp(name, "--shield")) opt.shield = (uid_t)number(value, 1, UINT32_MAX - 1);
        else if (!strcmp(name, "--server")) opt.server = (pid_t)number(value, 1, INT_MAX);
        else if (!strcmp(name, "--max-request-bytes")) opt.max_request_bytes = (uint32_t)number(value, 1, UINT32_MAX);
        else broken("an unknown option");
    }
    if (!opt.channel || !opt.oom_fd || !opt.uid || !opt.gid || !opt.shield || !opt.server || !opt.max_request_bytes)
        broken("an option is missing");
}

int main(int argc, char **argv) {
    parse(argc, argv);
    take_identity();
    /* The change of identity cleared the parent-death signal. */
    if (prctl(PR_SET_DUMPABLE, 0) != 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) die("prctl");
    if (getppid() != opt.server) exit(1);
    if (fcntl(opt.channel, F_SETFD, FD_CLOEXEC) != 0 || fcntl(opt.oom_fd, F_SETFD, FD_CLOEXEC) != 0) die("fcntl");
    /* Commands get every signal at its default: an ignored signal stays ignored across execve
     * (Python ignores SIGPIPE; whatever started the server may ignore others). The system call
     * itself, because the C library refuses the two real-time signals it keeps for itself. Its
     * struct sigaction all zero is SIG_DFL with no flags and an empty mask. */
    for (int signum = 1; signum < NSIG; signum++) {
        unsigned long default_action[4] = {0};
        if (signum != SIGKILL && signum != SIGSTOP
            && syscall(SYS_rt_sigaction, signum, default_action, NULL, sizeof(uint64_t)) != 0)
            die("rt_sigaction");
    }
    /* Received descriptors must never land on 0, 1 or 2. */
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) != fd) die("/dev/null");
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0) die("/dev/null");
    if (sched_getaffinity(0, sizeof all_cpus, &all_cpus) != 0) die("sched_getaffinity");
    /* Tried on this process, which has no child yet, and undone at once. */
    subreapers = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
    if (subreapers && prctl(PR_SET_CHILD_SUBREAPER, 0) != 0) die("prctl");
    sigset_t child_exits;
    sigemptyset(&child_exits);
    sigaddset(&child_exits, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &child_exits, NULL) != 0) die("sigprocmask");
    signals = signalfd(-1, &child_exits, SFD_NONBLOCK | SFD_CLOEXEC);
    if (signals < 0) die("signalfd");
    struct pollfd watched[2] = {{.fd = opt.channel, .events = POLLIN}, {.fd = signals, .events = POLLIN}};
    /* A keeper is forked ahead at the start and after a command's exit has been reported, once
     * nothing waits: then the server finishes that command first, and the fork is off the next
     * command's path. Not after a start: the fork would delay the command that is starting. */
    int ahead = 1;
    for (;;) {
        int ready = poll(watched, 2, ahead && !warm.keeper ? 0 : -1);
        if (ready < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        if (ready == 0) {
            fork_ahead();
            ahead = 0;
            continue;
        }
        if (watched[1].revents) ahead |= reap();
        if (watched[0].revents) {
            int kind = serve_request();
            if (!kind) return 0;
            if (kind == SPAWN) ahead = 0;
        }
    }
}
