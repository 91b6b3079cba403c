/*
 * engine-shim holds runs of services, so that the workloads outlive the daemon.
 *
 * It is the engine's equivalent of containerd-shim or Podman's conmon: it starts a workload in
 * its own process group, copies the workload's stdout and stderr into size-bounded, rotated
 * log files in the CRI format (`<RFC3339Nano> <stdout|stderr> <F|P> <text>`), waits for it,
 * writes the exit status to `exit.json` in the run directory, tells the daemon (a line on the
 * launcher's stdout while the daemon that started it reads it, else its notify socket; best
 * effort: a daemon that is away reads exit.json when it comes back), and forgets the run.
 *
 * It runs in one of two modes, on one body of code (struct run and its functions):
 * - `engine-shim --launcher` (the daemon's, see launcher_main below) holds every run the
 *   daemon starts until it restarts: one process, started once, that starts each workload
 *   itself and watches all of them in one event loop (as PM2's daemon, supervisord or systemd
 *   hold theirs), so that a run costs the machine one process, its workload's, not two
 *   (decision 508). It lives on after the daemon that started it until its last run ends.
 * - `engine-shim [--spare] RUN_DIR ...` holds one run and exits after it: the shim a daemon
 *   spawns itself where no launcher runs.
 *
 * Usage: engine-shim [--spare] RUN_DIR LOG_FILE NOTIFY_SOCKET LOG_MAX_BYTES LOG_MAX_FILES CGROUP_PROCS CREDENTIALS -- ARGV...
 * LOG_FILE rotates to LOG_FILE.1 ... LOG_FILE.(LOG_MAX_FILES-1) when it would pass LOG_MAX_BYTES.
 * NOTIFY_SOCKET and CGROUP_PROCS may be "-" for none. CGROUP_PROCS is a `cgroup.procs` file
 * the workload joins before exec (so its memory limit applies from the first byte).
 * CREDENTIALS is "-" (the workload runs as the shim's user) or "UID:GID:G1,G2,...": the workload
 * drops to that user, group and supplementary groups just before exec, while the shim itself
 * keeps its own (root's) to write the logs and exit.json the workload may not touch.
 *
 * Each run is reported in one line (on stdout for a shim of one run, after the request's id
 * for the launcher):
 *   "ok SHIM_PID CHILD_PID START"      the workload is running (SHIM_PID: the process holding it;
 *                                       START: the workload's start time, field 22 of its
 *                                       /proc/PID/stat, which tells it from a later process of
 *                                       the same pid; absent where it could not be read);
 *   "err ERRNO STAGE"                   it could not start (STAGE: exec, cgroup, user, chdir, setup,
 *                                       rundir: the run's directory or the log's could not be made).
 * RUN_DIR and LOG_FILE's directory are made when missing (0750; missing parents 0700).
 * A spare run directory, `.next-run` in the directory above RUN_DIR's (the service's, so that
 * the runs' own directory holds runs only), becomes RUN_DIR by a rename when there is one: it
 * already holds the exit record's room and an empty pids file. With --spare, the shim makes the
 * next one once its workload runs, so a service that restarts creates no inode between its
 * crash and its new workload (on ext4, each create looks through the inodes the last minutes
 * freed: decision 473).
 * The shim is written to stay small: a run's state is one allocation, made when it starts.
 *
 * A full disk loses neither the exit nor the run (issue 13): exit.json's space is reserved
 * when the run starts and overwritten in place at exit, and where even that failed the shim
 * retries every second and notifies only once exit.json is written. The log stops at a floor
 * of free space (see FLOOR_PERCENT) and says, in one marker line, how many lines it dropped.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES 16384
#define MAX_GROUPS 64
/* The free-space floor under which the shim stops writing a service's log (issue 13): 5 % of
   the log's filesystem, at most 1 GiB. On an 8 MiB tmpfs that leaves ~400 KiB for the
   engine's database and exit records; on a 2 TB disk, 1 GiB. Free space is read (statvfs) at
   most every FLOOR_CHECK_BYTES written or FLOOR_CHECK_MS elapsed, so a flood costs one cheap
   syscall per 64 KiB. */
#define FLOOR_PERCENT 5
#define FLOOR_CAP_BYTES (1024LL * 1024 * 1024)
#define FLOOR_CHECK_BYTES (64 * 1024)
#define FLOOR_CHECK_MS 250
#define EXIT_RESERVE_BYTES 4096
/* After its main process exits, a run's output is drained for at most DRAIN_MS. */
#define DRAIN_MS 1000

struct run;

struct stream {
  int fd;
  const char *name;
  struct run *run;
  size_t len;
  char buf[LINE_MAX_BYTES];
};

/* run is one workload held: where it logs and records its end, and how far it has got. */
struct run {
  char *run_dir;
  char *log_path;
  char *notify_path;
  long long log_max_bytes;
  int log_max_files;
  int log_fd;
  long long log_size;
  /* log_wrote is set once this run wrote a record: the log is synced at exit only then. */
  int log_wrote;
  /* Disk-aware logging: lines dropped while below the floor (or refused by the disk), and when
     free space was last read. */
  long long log_dropped;
  int log_below_floor;
  long long bytes_since_check;
  long long last_check_ms;
  /* exit_fd is exit.json.tmp, preallocated when the run starts so the exit fits on a full disk. */
  int exit_fd;
  pid_t child;
  int spare;
  /* setup_pending is set until the run's spare and log are made (finish_setup). */
  int setup_pending;
  int open_streams;
  int exited;
  int status;
  long long exited_at_ms;
  /* retry_at_ms is when to try the exit record again, once a full disk refused it (0: not waiting). */
  long long retry_at_ms;
  /* Last, so that a run's start clears the fields above and leaves the buffers untouched. */
  struct stream streams[2];
};

/* The runs held now, and how many of them wait for finish_setup. */
static struct run **runs;
static int run_count;
static int run_capacity;
static int setups_pending;
/* runs_exited counts the runs held whose workload has exited (draining, or waiting for room to record it). */
static int runs_exited;

static int sig_pipe[2] = {-1, -1};
static int epoll_fd = -1;
/* devnull_fd is the workloads' stdin where the holder's own is not /dev/null (the launcher's is its request pipe). */
static int devnull_fd = -1;
/* The soft limit of open files the holder started with: it raises its own for its runs' pipes
   and logs, and gives its workloads the one they would have had. */
static struct rlimit nofile_given;
static int nofile_raised = 0;
/* The syncs of ended runs' files go to this thread (the launcher's), so one run's fsync never
   holds up another run's start or end; -1 where they are made in place. */
static int sync_pipe[2] = {-1, -1};
static pthread_t sync_thread;
/* notice_fd is the launcher's stdout (non-blocking) while the daemon that started it reads it:
   an ended run is told there, on the pipe the daemon already reads, instead of by a connection
   to its notify socket per run; -1 otherwise (a shim of one run, a daemon gone). */
static int notice_fd = -1;

static void path_in_run(const struct run *r, char *out, size_t size, const char *name) {
  snprintf(out, size, "%s/%s", r->run_dir, name);
}

/* write_all writes all of `data`, waiting for room where `fd` is non-blocking (the launcher's stdout). */
static int write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd room = {.fd = fd, .events = POLLOUT};
        if (poll(&room, 1, -1) >= 0 || errno == EINTR) continue;
      }
      return -1;
    }
    data += n;
    len -= (size_t)n;
  }
  return 0;
}

static void open_log(struct run *r) {
  r->log_fd = open(r->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  struct stat st;
  r->log_size = (r->log_fd >= 0 && fstat(r->log_fd, &st) == 0) ? st.st_size : 0;
}

/* rotate_log renames LOG.(n-2) to LOG.(n-1), ..., LOG to LOG.1, and opens a new LOG. */
static void rotate_log(struct run *r) {
  char from[PATH_MAX], to[PATH_MAX];
  if (r->log_fd >= 0) close(r->log_fd);
  for (int i = r->log_max_files - 1; i >= 1; i--) {
    if (i == 1)
      snprintf(from, sizeof from, "%s", r->log_path);
    else
      snprintf(from, sizeof from, "%s.%d", r->log_path, i - 1);
    snprintf(to, sizeof to, "%s.%d", r->log_path, i);
    rename(from, to);
  }
  if (r->log_max_files <= 1) unlink(r->log_path);
  open_log(r);
}

/* civil_from_days turns days since 1970-01-01 into a proleptic Gregorian date (Howard
   Hinnant's algorithm, exact for every day a clock can show). */
static void civil_from_days(long long days, long long *year, unsigned *month, unsigned *day) {
  days += 719468;
  long long era = (days >= 0 ? days : days - 146096) / 146097;
  unsigned doe = (unsigned)(days - era * 146097);
  unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  unsigned mp = (5 * doy + 2) / 153;
  *day = doy - (153 * mp + 2) / 5 + 1;
  *month = mp < 10 ? mp + 3 : mp - 9;
  *year = (long long)yoe + era * 400 + (*month <= 2);
}

/* timestamp writes the time now in UTC, RFC 3339 with nanoseconds. Computed here: glibc's
   gmtime_r and strftime load the time zone (/etc/localtime: an open and two reads) on their
   first call, which a run's exit waited for, and UTC needs none. */
static void timestamp(char *out, size_t size) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  long long secs = (long long)ts.tv_sec;
  long long days = secs >= 0 ? secs / 86400 : (secs - 86399) / 86400;
  unsigned of_day = (unsigned)(secs - days * 86400); /* 0 to 86399 */
  long long year;
  unsigned month, day;
  civil_from_days(days, &year, &month, &day);
  snprintf(out, size, "%04d-%02u-%02uT%02u:%02u:%02u.%09ldZ", (int)year, month, day, of_day / 3600, of_day / 60 % 60,
           of_day % 60, ts.tv_nsec);
}

static long long monotonic_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* above_floor says whether the log's filesystem has more free space than the floor. It reads
   statvfs only now and then (see FLOOR_CHECK_*) and keeps the last answer in between. */
static int above_floor(struct run *r, long long record) {
  long long now = monotonic_ms();
  r->bytes_since_check += record;
  if (r->bytes_since_check < FLOOR_CHECK_BYTES && now - r->last_check_ms < FLOOR_CHECK_MS) return !r->log_below_floor;
  r->bytes_since_check = 0;
  r->last_check_ms = now;
  struct statvfs vfs;
  if (statvfs(r->log_path, &vfs) != 0) return !r->log_below_floor;
  long long size = (long long)vfs.f_blocks * (long long)vfs.f_frsize;
  long long avail = (long long)vfs.f_bavail * (long long)vfs.f_frsize;
  long long floor = size / 100 * FLOOR_PERCENT;
  if (floor > FLOOR_CAP_BYTES) floor = FLOOR_CAP_BYTES;
  r->log_below_floor = avail - record < floor;
  return !r->log_below_floor;
}

/* write_record writes one whole record or none: a record cut by a full disk is taken back. */
static int write_record(struct run *r, const char *line, size_t len) {
  ssize_t n;
  do n = write(r->log_fd, line, len);
  while (n < 0 && errno == EINTR);
  if (n == (ssize_t)len) return 0;
  if (n > 0) {
    struct stat st;
    if (fstat(r->log_fd, &st) == 0) (void)!ftruncate(r->log_fd, st.st_size - n);
  }
  return -1;
}

static void emit_raw(struct run *r, const char *stream, const char *text, size_t len, char tag);

/* emit writes one CRI log record, full (F) or partial (P), unless the disk is below its floor:
   then the record is dropped and counted, and one marker line says how many when writing
   resumes. */
static void emit(struct run *r, const char *stream, const char *text, size_t len, char tag) {
  long long record = 80 + (long long)len;
  if (!above_floor(r, record)) {
    r->log_dropped++;
    return;
  }
  if (r->log_dropped > 0) {
    char marker[160];
    long long dropped = r->log_dropped;
    int n = snprintf(marker, sizeof marker,
                     "[engine-shim] dropped %lld log lines while the disk was below its free-space floor or full", dropped);
    r->log_dropped = 0;
    emit_raw(r, "stderr", marker, (size_t)n, 'F');
    if (r->log_dropped > 0) {
      /* The marker itself did not fit: still dropping, this line included. */
      r->log_dropped = dropped + 1;
      return;
    }
  }
  emit_raw(r, stream, text, len, tag);
}

static void emit_raw(struct run *r, const char *stream, const char *text, size_t len, char tag) {
  char head[80];
  char ts[48];
  timestamp(ts, sizeof ts);
  int head_len = snprintf(head, sizeof head, "%s %s %c ", ts, stream, tag);
  long long record = head_len + (long long)len + 1;
  if (r->log_size > 0 && r->log_size + record > r->log_max_bytes) rotate_log(r);
  /* A log that could not be created (no inode left) is tried again when there is room. */
  if (r->log_fd < 0) open_log(r);
  if (r->log_fd < 0) {
    r->log_dropped++;
    return;
  }
  /* One write per record keeps records whole even with two streams interleaving. */
  char line[LINE_MAX_BYTES + 96];
  memcpy(line, head, (size_t)head_len);
  memcpy(line + head_len, text, len);
  line[head_len + len] = '\n';
  if (write_record(r, line, (size_t)head_len + len + 1) == 0) {
    r->log_size += record;
    r->log_wrote = 1;
  } else
    r->log_dropped++;
}

/* pump reads what the stream has and emits each complete line; returns 0 at EOF. */
static int pump(struct stream *s) {
  ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
  if (n < 0) return errno == EINTR || errno == EAGAIN ? 1 : 0;
  if (n == 0) {
    if (s->len > 0) emit(s->run, s->name, s->buf, s->len, 'F');
    s->len = 0;
    return 0;
  }
  s->len += (size_t)n;
  size_t start = 0;
  for (size_t i = 0; i < s->len; i++) {
    if (s->buf[i] == '\n') {
      size_t end = i;
      if (end > start && s->buf[end - 1] == '\r') end--;
      emit(s->run, s->name, s->buf + start, end - start, 'F');
      start = i + 1;
    }
  }
  if (start == 0 && s->len == sizeof s->buf) {
    emit(s->run, s->name, s->buf, s->len, 'P');
    s->len = 0;
  } else if (start > 0) {
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
  }
  return 1;
}

static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  (void)!write(sig_pipe[1], &b, 1);
  errno = saved;
}

static const char *signal_name(int sig) {
  static char buf[16];
  const char *abbrev = sigabbrev_np(sig);
  if (!abbrev) {
    snprintf(buf, sizeof buf, "SIG%d", sig);
    return buf;
  }
  snprintf(buf, sizeof buf, "SIG%s", abbrev);
  return buf;
}

/* reserve_room gives the exit record's file its EXIT_RESERVE_BYTES; 0 when it has them. */
static int reserve_room(int fd) {
  if (posix_fallocate(fd, 0, EXIT_RESERVE_BYTES) == 0) return 0;
  /* No fallocate here (or no room yet): reserve by writing. */
  static const char spaces[EXIT_RESERVE_BYTES] = {0};
  if (pwrite(fd, spaces, sizeof spaces, 0) == (ssize_t)sizeof spaces) return 0;
  (void)!ftruncate(fd, 0);
  return -1;
}

/* reserve_exit preallocates exit.json.tmp when the run starts, so that the exit record fits
   even when the disk is full by the time the workload ends (issue 13). */
static void reserve_exit(struct run *r) {
  char tmp[PATH_MAX];
  path_in_run(r, tmp, sizeof tmp, "exit.json.tmp");
  /* No O_TRUNC: a spare's file keeps the room it was given (a new run's file is empty anyway). */
  r->exit_fd = open(tmp, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (r->exit_fd >= 0) reserve_room(r->exit_fd);
}

/* spare_path names the service's spare run directory: `.next-run` two levels above RUN_DIR
   (RUN_DIR is <service>/runs/<run>). -1 when RUN_DIR has no such parent. */
static int spare_path(const struct run *r, char *out, size_t size, const char *suffix) {
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%s", r->run_dir);
  for (int up = 0; up < 2; up++) {
    char *slash = strrchr(parent, '/');
    if (!slash || slash == parent) return -1;
    *slash = 0;
  }
  snprintf(out, size, "%s/.next-run%s", parent, suffix);
  return 0;
}

/* make_spare makes the service's next run directory ahead, under a name of its own, then
   renames it to `.next-run`: the exit record's room (the same reservation as reserve_exit) and
   an empty pids file, so the next run takes all three by one rename. One that is there already
   is left; anything that fails leaves no spare (the next run makes its own, as without one). */
static void make_spare(const struct run *r) {
  char tmp[PATH_MAX], spare[PATH_MAX], record[PATH_MAX], pids[PATH_MAX], suffix[48];
  if (spare_path(r, spare, sizeof spare, "") != 0 || access(spare, F_OK) == 0) return;
  /* The holder's pid and the workload's: unique among the spares made at once. */
  snprintf(suffix, sizeof suffix, ".%d.%d", (int)getpid(), (int)r->child);
  if (spare_path(r, tmp, sizeof tmp, suffix) != 0) return;
  if (mkdir(tmp, 0750) != 0) return;
  snprintf(record, sizeof record, "%s/exit.json.tmp", tmp);
  snprintf(pids, sizeof pids, "%s/pids.tmp", tmp);
  int fd = open(record, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
  int ok = fd >= 0 && reserve_room(fd) == 0;
  if (fd >= 0) close(fd);
  if (ok) {
    int pids_fd = open(pids, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
    ok = pids_fd >= 0;
    if (ok) close(pids_fd);
  }
  if (ok && rename(tmp, spare) == 0) return;
  unlink(record);
  unlink(pids);
  rmdir(tmp);
}

/* take_spare makes the service's spare run directory this run's; 0 when it did. */
static int take_spare(const struct run *r) {
  char spare[PATH_MAX];
  if (spare_path(r, spare, sizeof spare, "") != 0) return -1;
  return rename(spare, r->run_dir);
}

/* write_exit records how the run ended in exit.json, atomically (write then rename), into the
   space reserved at start when there is one. It returns 0 once exit.json holds the record.
   With synced_fd, the file is left open there for the caller to fsync after it has told the
   daemon (the daemon reads it from the page cache; the sync is for a machine that loses power,
   and costs milliseconds a restart waited for: decision 452); without, it is synced before the rename. */
static int write_exit(struct run *r, int status, int exec_errno, const char *stage, int *synced_fd) {
  char tmp[PATH_MAX], path[PATH_MAX], ts[48], body[512];
  timestamp(ts, sizeof ts);
  int len;
  if (exec_errno) {
    len = snprintf(body, sizeof body,
                   "{\"pid\":%d,\"exit_code\":null,\"signal\":null,\"exec_errno\":%d,\"exec_error\":\"%s\",\"stage\":\"%s\","
                   "\"message\":\"%s\",\"ended_at\":\"%s\"}\n",
                   (int)r->child, exec_errno, strerrorname_np(exec_errno) ? strerrorname_np(exec_errno) : "E?", stage,
                   strerror(exec_errno), ts);
  } else if (WIFSIGNALED(status)) {
    len = snprintf(body, sizeof body,
                   "{\"pid\":%d,\"exit_code\":null,\"signal\":\"%s\",\"signal_number\":%d,\"core_dumped\":%s,\"ended_at\":\"%s\"}\n",
                   (int)r->child, signal_name(WTERMSIG(status)), WTERMSIG(status), WCOREDUMP(status) ? "true" : "false", ts);
  } else {
    len = snprintf(body, sizeof body, "{\"pid\":%d,\"exit_code\":%d,\"signal\":null,\"ended_at\":\"%s\"}\n", (int)r->child,
                   WEXITSTATUS(status), ts);
  }
  path_in_run(r, tmp, sizeof tmp, "exit.json.tmp");
  path_in_run(r, path, sizeof path, "exit.json");
  int fd = r->exit_fd;
  r->exit_fd = -1;
  if (fd < 0) fd = open(tmp, O_WRONLY | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) return -1;
  /* Overwrite in place (the reserved pages need no new space), then cut to the record. */
  int ok = pwrite(fd, body, (size_t)len, 0) == len && ftruncate(fd, len) == 0;
  if (ok && !synced_fd) fsync(fd);
  if (!ok || rename(tmp, path) != 0) {
    close(fd);
    return -1;
  }
  if (synced_fd) *synced_fd = fd;
  else close(fd);
  return 0;
}

/* notify tells the daemon the run ended; a daemon that is away finds exit.json later. It never
   waits (a launcher's other runs would wait with it): a daemon whose socket's backlog is full
   misses the notice, and its sweep finds the run's workload gone within a second. It answers
   1 when the notice went on the launcher's stdout, to the daemon that reads it. */
static int notify(const struct run *r) {
  if (strcmp(r->notify_path, "-") == 0) return 0;
  char msg[PATH_MAX + 16];
  int len = snprintf(msg, sizeof msg, "exit %s\n", r->run_dir);
  if (len <= 0 || len >= (int)sizeof msg) return 0;
  /* On the pipe, one write of at most PIPE_BUF bytes is whole or refused (EAGAIN: the daemon
     reads no more for now), never cut: refused, the notice goes to the socket. */
  if (notice_fd >= 0 && len <= PIPE_BUF) {
    ssize_t n;
    do n = write(notice_fd, msg, (size_t)len);
    while (n < 0 && errno == EINTR);
    if (n == len) return 1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return 0;
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strncpy(addr.sun_path, r->notify_path, sizeof addr.sun_path - 1);
  /* A fresh connection's buffer takes the line at once; where it would not, it is dropped, not waited for. */
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) (void)!send(fd, msg, (size_t)len, MSG_DONTWAIT | MSG_NOSIGNAL);
  close(fd);
  return 0;
}

/* parse_credentials reads "UID:GID:G1,G2,..."; returns 0 when well formed. */
static int parse_credentials(const char *text, uid_t *uid, gid_t *gid, gid_t *groups, size_t *ngroups) {
  char *end;
  unsigned long value = strtoul(text, &end, 10);
  if (end == text || *end != ':') return -1;
  *uid = (uid_t)value;
  text = end + 1;
  value = strtoul(text, &end, 10);
  if (end == text || *end != ':') return -1;
  *gid = (gid_t)value;
  text = end + 1;
  *ngroups = 0;
  while (*text) {
    value = strtoul(text, &end, 10);
    if (end == text || *ngroups >= MAX_GROUPS) return -1;
    groups[(*ngroups)++] = (gid_t)value;
    if (*end == ',') end++;
    else if (*end != '\0') return -1;
    text = end;
  }
  return 0;
}

/* make_dir makes `path` with `mode`, and its missing parents with `parent_mode`, as mkdir -p
   does; a directory that is there already is left as it is. 0, or -1 with errno. */
static int make_dir(const char *path, mode_t mode, mode_t parent_mode) {
  if (mkdir(path, mode) == 0 || errno == EEXIST) return 0;
  if (errno != ENOENT) return -1;
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%s", path);
  char *slash = strrchr(parent, '/');
  if (!slash || slash == parent) return -1;
  *slash = 0;
  if (make_dir(parent, parent_mode, parent_mode) != 0) return -1;
  return mkdir(path, mode) == 0 || errno == EEXIST ? 0 : -1;
}

/* ---------------------------------------------------------------- one run */

/* spec is a run's command line, parsed: what a request or a shim's own argv asks for. */
struct spec {
  int spare;
  const char *run_dir;
  const char *log_path;
  const char *notify_path;
  long long log_max_bytes;
  int log_max_files;
  const char *cgroup_procs;
  int switch_user;
  uid_t uid;
  gid_t gid;
  gid_t groups[MAX_GROUPS];
  size_t ngroups;
  char **workload;
};

/* parse_spec reads `[--spare] RUN_DIR ... -- ARGV...` (argv[0] is the program); NULL when it is
   well formed, else what is wrong with it. */
static const char *parse_spec(int argc, char **argv, struct spec *s) {
  s->spare = argc > 1 && strcmp(argv[1], "--spare") == 0;
  if (s->spare) {
    argv++;
    argc--;
  }
  if (argc < 10 || strcmp(argv[8], "--") != 0)
    return "usage: engine-shim [--spare] RUN_DIR LOG_FILE NOTIFY_SOCKET LOG_MAX_BYTES LOG_MAX_FILES CGROUP_PROCS CREDENTIALS -- ARGV...";
  s->switch_user = strcmp(argv[7], "-") != 0;
  if (s->switch_user && parse_credentials(argv[7], &s->uid, &s->gid, s->groups, &s->ngroups) != 0)
    return "engine-shim: CREDENTIALS must be - or UID:GID:G1,G2,...";
  s->run_dir = argv[1];
  s->log_path = argv[2];
  s->notify_path = argv[3];
  s->log_max_bytes = atoll(argv[4]);
  s->log_max_files = atoi(argv[5]);
  s->cgroup_procs = argv[6];
  s->workload = argv + 9;
  if (s->log_max_bytes < 4096) s->log_max_bytes = 4096;
  if (s->log_max_files < 1) s->log_max_files = 1;
  return NULL;
}

/* absolute is `path` as an absolute path, resolved against `cwd` where it is relative (a run's
   files are written from the holder, whose own directory is /). */
static char *absolute(const char *path, const char *cwd) {
  char *out = NULL;
  if (path[0] == '/' || !cwd || strcmp(path, "-") == 0) return strdup(path);
  return asprintf(&out, "%s/%s", cwd, path) < 0 ? NULL : out;
}

static void free_run(struct run *r) {
  free(r->run_dir);
  free(r->log_path);
  free(r->notify_path);
  free(r);
}

/*
 * spawn starts the workload and answers its pid (-1 with errno where vfork failed); by then it
 * has exec'd, or written why it could not on `exec_err` and ended.
 *
 * The workload starts through vfork, as posix_spawn starts a program: the child borrows this
 * process's memory until its exec, so no page table is copied and neither side takes
 * copy-on-write faults. Every signal is blocked across it, so that no handler of the shim's
 * runs in the child; the child sets the dispositions and the mask back before its exec. Until
 * then it makes system calls only, on its own variables (the user switch by raw system calls:
 * glibc's setuid keeps process-wide state, which the child shares with this process). The
 * run's environment is this process's for the instant of the vfork (execvp looks the program
 * up on its PATH), set back as soon as the child has exec'd or failed.
 */
static __attribute__((noinline)) pid_t spawn(const struct spec *s, char **envp, int out, int err, int exec_err) {
  sigset_t all_signals, old_mask;
  sigfillset(&all_signals);
  sigprocmask(SIG_SETMASK, &all_signals, &old_mask);
  char **own_environ = environ;
  if (envp) environ = envp;
  pid_t child = vfork();
  if (child == 0) {
    int code = 0;
    const char *stage = "exec";
    setpgid(0, 0);
    if (strcmp(s->cgroup_procs, "-") != 0) {
      int fd = open(s->cgroup_procs, O_WRONLY | O_CLOEXEC);
      if (fd < 0 || write(fd, "0\n", 2) < 0) {
        code = errno;
        stage = "cgroup";
      }
      if (fd >= 0) close(fd);
    }
    /* Groups first, then the gid, then the uid: once the uid is dropped the rest is no longer allowed.
       An unprivileged uid also loses every capability, so the workload cannot switch back. */
    if (code == 0 && s->switch_user) {
      if (syscall(SYS_setgroups, s->ngroups, s->groups) != 0 || syscall(SYS_setgid, s->gid) != 0 ||
          syscall(SYS_setuid, s->uid) != 0) {
        code = errno;
        stage = "user";
      }
    }
    if (code == 0) {
      if (devnull_fd >= 0) dup2(devnull_fd, 0);
      dup2(out, 1);
      dup2(err, 2);
      if (nofile_raised) setrlimit(RLIMIT_NOFILE, &nofile_given);
      struct sigaction dfl = {.sa_handler = SIG_DFL};
      sigaction(SIGHUP, &dfl, NULL);
      sigaction(SIGPIPE, &dfl, NULL);
      sigaction(SIGCHLD, &dfl, NULL);
      sigaction(SIGTERM, &dfl, NULL);
      sigaction(SIGINT, &dfl, NULL);
      sigprocmask(SIG_SETMASK, &old_mask, NULL);
      execvp(s->workload[0], s->workload);
      code = errno;
    }
    char msg[64];
    int len = snprintf(msg, sizeof msg, "%d %s", code, stage);
    write_all(exec_err, msg, (size_t)len);
    _exit(127);
  }
  int saved = errno;
  environ = own_environ;
  sigprocmask(SIG_SETMASK, &old_mask, NULL);
  errno = saved;
  return child;
}

/* make_room makes sure one more run can be held: 0, or -1 when memory ran out. */
static int make_room(void) {
  if (run_count < run_capacity) return 0;
  int capacity = run_capacity ? run_capacity * 2 : 64;
  struct run **grown = realloc(runs, (size_t)capacity * sizeof *grown);
  if (!grown) return -1;
  runs = grown;
  run_capacity = capacity;
  return 0;
}

/* start_time is field 22 of /proc/PID/stat (the process's start, in clock ticks since boot), or
   -1. The daemon keeps it with the pid to tell the workload from a later process of that pid;
   read here, beside the fork, instead of by the daemon's event loop for every launch. */
static long long start_time(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t got;
  do got = read(fd, buf, sizeof buf - 1);
  while (got < 0 && errno == EINTR);
  close(fd);
  if (got <= 0) return -1;
  buf[got] = 0;
  /* The command name (field 2) may hold spaces and parentheses: the fields after it start at the last ')'. */
  char *p = strrchr(buf, ')');
  if (!p) return -1;
  for (int field = 2; field < 22; field++) {
    p = strchr(p + 1, ' ');
    if (!p) return -1;
  }
  char *end;
  long long value = strtoll(p + 1, &end, 10);
  return end == p + 1 ? -1 : value;
}

/* give_up reports a run that could not start (`err CODE STAGE`), leaves `cwd` where it was
   entered, and forgets the run; it answers NULL, for start_run to return. */
static struct run *give_up(struct run *r, const char *cwd, char *report, size_t report_size, int code, const char *stage) {
  snprintf(report, report_size, "err %d %s", code, stage);
  if (cwd) (void)!chdir("/");
  free_run(r);
  return NULL;
}

/*
 * start_run makes the run's directory, starts its workload (in `cwd` with `envp` where given,
 * else in this process's own), and writes its report line into `report`. It answers the run,
 * or NULL when the workload did not start (the report says why; an exec failure is recorded in
 * exit.json too). The caller sends the report, then calls run_begin.
 */
static struct run *start_run(const struct spec *s, const char *cwd, char **envp, char *report, size_t report_size) {
  struct run *r = make_room() == 0 ? malloc(sizeof *r) : NULL;
  if (!r) {
    snprintf(report, report_size, "err %d setup", ENOMEM);
    return NULL;
  }
  /* Every field but the streams, whose buffers are touched only as output comes. */
  memset(r, 0, offsetof(struct run, streams));
  r->run_dir = absolute(s->run_dir, cwd);
  r->log_path = absolute(s->log_path, cwd);
  r->notify_path = absolute(s->notify_path, cwd);
  r->log_max_bytes = s->log_max_bytes;
  r->log_max_files = s->log_max_files;
  r->log_fd = r->exit_fd = -1;
  r->bytes_since_check = FLOOR_CHECK_BYTES;
  r->spare = s->spare;
  r->child = -1;
  for (int i = 0; i < 2; i++) {
    r->streams[i].fd = -1;
    r->streams[i].len = 0;
    r->streams[i].run = r;
    r->streams[i].name = i == 0 ? "stdout" : "stderr";
  }
  if (!r->run_dir || !r->log_path || !r->notify_path) return give_up(r, NULL, report, report_size, ENOMEM, "setup");
  /* The working directory is entered here, as the workload will enter it (the child starts in
     the holder's), and left again once the workload runs. */
  if (cwd && chdir(cwd) != 0) return give_up(r, NULL, report, report_size, errno, "chdir");

  /* The run's directory (0750; the spare, when the last run left one) and the service's logs/
     and runs/ (0700, the engine's own) are made here, off the daemon's event loop: on a busy
     disk each mkdir costs it 25-200 us. */
  char log_dir[PATH_MAX];
  snprintf(log_dir, sizeof log_dir, "%s", r->log_path);
  char *log_slash = strrchr(log_dir, '/');
  if (log_slash && log_slash != log_dir) *log_slash = 0;
  if ((take_spare(r) != 0 && make_dir(r->run_dir, 0750, 0700) != 0) || (log_slash && make_dir(log_dir, 0700, 0700) != 0))
    return give_up(r, cwd, report, report_size, errno, "rundir");

  int out[2] = {-1, -1}, err[2] = {-1, -1}, exec_err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(exec_err, O_CLOEXEC) != 0) {
    int code = errno;
    for (int i = 0; i < 2; i++) {
      if (out[i] >= 0) close(out[i]);
      if (err[i] >= 0) close(err[i]);
    }
    return give_up(r, cwd, report, report_size, code, "setup");
  }

  pid_t child = spawn(s, envp, out[1], err[1], exec_err[1]);
  int vfork_errno = errno;
  if (cwd) (void)!chdir("/");
  close(out[1]);
  close(err[1]);
  close(exec_err[1]);
  if (child < 0) {
    close(out[0]);
    close(err[0]);
    close(exec_err[0]);
    return give_up(r, NULL, report, report_size, vfork_errno, "setup");
  }
  r->child = child;
  setpgid(child, child); /* also from the parent side, so the group exists before any signal */

  /* The child has exec'd or ended by now (vfork returns then): its message is there, or EOF. */
  char msg[64] = {0};
  ssize_t got;
  do got = read(exec_err[0], msg, sizeof msg - 1);
  while (got < 0 && errno == EINTR);
  close(exec_err[0]);
  if (got > 0) {
    close(out[0]);
    close(err[0]);
    int code = atoi(msg);
    const char *stage = strchr(msg, ' ') ? strchr(msg, ' ') + 1 : "exec";
    int status;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    /* The daemon reads the failure from the report too; exit.json is best effort here. */
    write_exit(r, status, code ? code : EIO, stage, NULL);
    return give_up(r, NULL, report, report_size, code, stage);
  }
  r->streams[0].fd = out[0];
  r->streams[1].fd = err[0];
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  r->open_streams = 2;

  /* Reserved before "ok" is reported: from then on, the exit record has its room. */
  reserve_exit(r);
  char pids[64], path[PATH_MAX], tmp[PATH_MAX];
  int len = snprintf(pids, sizeof pids, "%d %d\n", (int)getpid(), (int)child);
  path_in_run(r, tmp, sizeof tmp, "pids.tmp");
  path_in_run(r, path, sizeof path, "pids");
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd >= 0) {
    write_all(fd, pids, (size_t)len);
    close(fd);
    rename(tmp, path);
  }
  long long started = start_time(child);
  if (started >= 0) snprintf(report, report_size, "ok %d %d %lld", (int)getpid(), (int)child, started);
  else snprintf(report, report_size, "ok %d %d", (int)getpid(), (int)child);
  return r;
}

/* run_begin holds a run once its report is sent: its output is watched from now on, and its
   files follow (finish_setup). */
static void run_begin(struct run *r) {
  for (int i = 0; i < 2; i++) {
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &r->streams[i]};
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, r->streams[i].fd, &ev);
  }
  r->setup_pending = 1;
  setups_pending++;
  runs[run_count++] = r; /* start_run made room */
}

/* setup_run makes a started run's files, once: the spare for its service's next run and its log. */
static void setup_run(struct run *r) {
  if (!r->setup_pending) return;
  r->setup_pending = 0;
  setups_pending--;
  if (r->spare) make_spare(r);
  if (r->log_fd < 0) open_log(r);
}

/* finish_setup makes the files of the runs started since it last ran. It runs once the
   requests that came together are all answered (the loop calls it only while no whole request
   waits), so a burst of starts is reported first (a launcher starts them one after the other);
   a run that ends before it gets them at its settling. */
static void finish_setup(void) {
  for (int i = 0; i < run_count && setups_pending > 0; i++) setup_run(runs[i]);
}

static void close_stream(struct stream *s) {
  if (s->fd < 0) return;
  close(s->fd); /* also leaves the epoll set: no other copy of it is open */
  s->fd = -1;
  s->run->open_streams--;
}

/* sync_later has `fd` synced (when `sync`) and closed off the event loop, or here where no thread takes it. */
static void sync_later(int fd, int sync) {
  if (fd < 0) return;
  int job[2] = {fd, sync};
  if (sync_pipe[1] >= 0 && write_all(sync_pipe[1], (const char *)job, sizeof job) == 0) return;
  if (sync) fsync(fd);
  close(fd);
}

static void *sync_main(void *unused) {
  (void)unused;
  int job[2];
  for (;;) {
    size_t got = 0;
    while (got < sizeof job) {
      ssize_t n = read(sync_pipe[0], (char *)job + got, sizeof job - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return NULL;
      got += (size_t)n;
    }
    if (job[1]) fsync(job[0]);
    close(job[0]);
  }
}

/* start_sync_thread gives the syncs their thread; where it cannot start they are made in place. */
static void start_sync_thread(void) {
  if (pipe2(sync_pipe, O_CLOEXEC) != 0) return;
  /* The thread takes no signal: the handlers run on the event loop's thread. */
  sigset_t all_signals, old_mask;
  sigfillset(&all_signals);
  pthread_sigmask(SIG_SETMASK, &all_signals, &old_mask);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  if (pthread_create(&sync_thread, &attr, sync_main, NULL) != 0) {
    close(sync_pipe[0]);
    close(sync_pipe[1]);
    sync_pipe[0] = sync_pipe[1] = -1;
  }
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
}

static void stop_sync_thread(void) {
  if (sync_pipe[1] < 0) return;
  close(sync_pipe[1]);
  sync_pipe[1] = -1;
  pthread_join(sync_thread, NULL);
  close(sync_pipe[0]);
}

/*
 * settle records the end of a run whose workload has exited and whose output is drained (or
 * has had its time): exit.json, then the daemon told, then the files synced. 1 when the run is
 * done with; 0 when a full disk refused the record, which is tried again a second later (the
 * daemon sees the holder alive and the run not yet ended meanwhile).
 */
static int settle(struct run *r) {
  setup_run(r);
  for (int i = 0; i < 2; i++) close_stream(&r->streams[i]);
  int exit_record = -1;
  if (write_exit(r, r->status, 0, NULL, &exit_record) != 0) {
    /* A run directory removed under the run (its service's directory deleted by hand) will not
       come back: there is nowhere to record the exit, and waiting would keep it for ever. The
       daemon is told, and settles the run as lost. */
    struct stat run_dir_stat;
    if (!(stat(r->run_dir, &run_dir_stat) != 0 && errno == ENOENT)) {
      r->retry_at_ms = monotonic_ms() + 1000;
      return 0;
    }
  }
  /* Told first, synced after: the daemon reads exit.json and the log from the page cache, so a
     restart need not wait for the disk; a power loss in between leaves a record the next daemon
     cannot read, and the run is settled as lost, as it would be without exit.json at all.
     An exit told on the launcher's stdout is not synced here at all: the daemon reading it
     records it in its store and syncs the store's WAL after each batch of exits, one sync for
     many (decision 524). One told on the socket, or to no one, is synced here. */
  int told = notify(r);
  sync_later(exit_record, !told);
  /* A run that printed nothing has nothing of its own to sync: an fsync of the log it only
     opened would write the new file's inode, a disk write and a sleep per silent batch job. */
  sync_later(r->log_fd, r->log_wrote);
  r->log_fd = -1;
  return 1;
}

/* reap takes every child that ended; a run's main process marks its run exited and ends its
   group (systemd's KillMode=control-group); the rest are descendants orphaned to this process. */
static void reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int i = 0; i < run_count; i++) {
      struct run *r = runs[i];
      if (r->child != pid || r->exited) continue;
      r->exited = 1;
      runs_exited++;
      r->status = status;
      r->exited_at_ms = monotonic_ms();
      kill(-pid, SIGKILL);
      break;
    }
  }
}

/* forward passes a SIGTERM or SIGINT the holder was sent on to every workload's group. */
static void forward(int sig) {
  for (int i = 0; i < run_count; i++)
    if (!runs[i]->exited) kill(-runs[i]->child, sig);
}

/* settle_due settles the runs whose time has come, and answers the wait until the next one is due (-1: none). */
static int settle_due(void) {
  /* Most turns of the loop are output: with no run ended, there is nothing to look through. */
  if (runs_exited == 0) return -1;
  long long now = monotonic_ms();
  int wait = -1;
  for (int i = run_count - 1; i >= 0; i--) {
    struct run *r = runs[i];
    if (!r->exited) continue;
    int due;
    if (r->retry_at_ms) due = now >= r->retry_at_ms;
    else due = r->open_streams == 0 || now - r->exited_at_ms > DRAIN_MS;
    if (due && settle(r)) {
      runs[i] = runs[--run_count];
      runs_exited--;
      free_run(r);
      continue;
    }
    /* Still draining: looked at again within 100 ms; waiting for room: at its retry. */
    long long next = r->retry_at_ms ? r->retry_at_ms - now : 100;
    if (next < 0) next = 0;
    if (wait < 0 || next < wait) wait = (int)next;
  }
  return wait;
}

/* prepare sets up what holding runs needs: the signals, the event loop, the subreaper role. */
static int prepare(void) {
  signal(SIGHUP, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  /* Descendants a workload orphans are reparented here, not to init, so none escapes the
     end-of-run cleanup and none lingers as a zombie. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0 || pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = sig_pipe};
  if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, sig_pipe[0], &ev) != 0) return -1;
  struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  return 0;
}

/* on_request is told of the request channel's events: 0 once it is closed. */
typedef int (*request_handler)(void);

/* requests_waiting is set while whole requests wait in the buffer, read but not yet started:
   the loop then turns without sleeping, and has on_request start the next batch of them. */
static int requests_waiting = 0;

/*
 * serve watches the runs (and the requests, where `requests` is a descriptor) until the
 * requests have ended and no run is held. Each turn: output pumped into the logs, signals
 * forwarded, children reaped, ended runs settled.
 */
static void serve(int requests, request_handler on_request) {
  if (requests >= 0) {
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &requests};
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, requests, &ev);
  }
  int reading = requests >= 0;
  int wait = -1;
  for (;;) {
    if (!reading && run_count == 0) return;
    if (!requests_waiting) finish_setup();
    struct epoll_event events[64];
    int n = epoll_wait(epoll_fd, events, 64, requests_waiting ? 0 : wait);
    if (n < 0 && errno != EINTR) return;
    int readable = 0;
    for (int i = 0; i < n; i++) {
      void *tag = events[i].data.ptr;
      if (tag == sig_pipe) {
        unsigned char sigs[32];
        ssize_t k = read(sig_pipe[0], sigs, sizeof sigs);
        for (ssize_t j = 0; j < k; j++)
          if (sigs[j] == SIGTERM || sigs[j] == SIGINT) forward(sigs[j]);
      } else if (tag == &requests) {
        readable = 1;
      } else {
        struct stream *s = tag;
        if (s->fd >= 0 && !pump(s)) close_stream(s);
      }
    }
    /* New requests, or those read in an earlier turn and not started yet: one batch a turn. */
    if (reading && (readable || requests_waiting) && !on_request()) {
      epoll_ctl(epoll_fd, EPOLL_CTL_DEL, requests, NULL);
      reading = 0;
    }
    if (!requests_waiting) finish_setup();
    reap();
    wait = settle_due();
  }
}

/* ---------------------------------------------------------------- a shim of one run */

static void report(int fd, const char *line) {
  write_all(fd, line, strlen(line));
  write_all(fd, "\n", 1);
  close(fd);
}

static int shim_main(int argc, char **argv) {
  struct spec spec;
  const char *wrong = parse_spec(argc, argv, &spec);
  if (wrong) {
    fprintf(stderr, "%s\n", wrong);
    return 2;
  }
  /* Detach: the spawned process exits once the workload runs, so the shim is reparented to
     init (or the nearest subreaper) and never becomes the daemon's zombie. */
  pid_t first = fork();
  if (first < 0) {
    report(1, "err 0 setup");
    return 1;
  }
  if (first > 0) {
    /* Wait for the shim's report to be written before exiting; the pipe carries it. */
    int status;
    waitpid(first, &status, 0);
    return 0;
  }
  setsid();
  pid_t shim = fork();
  if (shim < 0) _exit(1);
  if (shim > 0) _exit(0); /* the session leader leaves; the shim can never regain a terminal */

  int status_fd = dup(1);
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    dup2(devnull, 0);
    dup2(devnull, 1);
    dup2(devnull, 2);
  }
  fcntl(status_fd, F_SETFD, FD_CLOEXEC);
  if (prepare() != 0) {
    report(status_fd, "err 0 setup");
    return 1;
  }
  char line[96];
  struct run *r = start_run(&spec, NULL, NULL, line, sizeof line);
  report(status_fd, line);
  if (!r) return 0;
  run_begin(r);
  serve(-1, NULL);
  return 0;
}

/* ---------------------------------------------------------------- launcher mode
 *
 * `engine-shim --launcher` is started by the daemon on its first launch and holds every run
 * it starts from then on, so the daemon's own process never forks (a spawn from a large,
 * many-threaded process costs it a millisecond of its event loop) and a run costs one process,
 * its workload. It leads a session of its own (no terminal, and no signal sent to the daemon's
 * group reaches it), says "ready\n", then reads requests on stdin, each `LEN\n` and LEN bytes of
 * NUL-terminated fields: ID, CWD, ARGC, ARGC arguments (a shim's command line, argv[0]
 * included), ENVC, ENVC `KEY=VALUE` entries. For each it starts the workload, in that cwd and
 * environment with default signals and stdin on /dev/null, and writes `ID REPORT\n` on stdout in
 * one write (atomic on a pipe: under PIPE_BUF). A run that ended is told on stdout too, as
 * `exit RUN_DIR\n`, where the pipe has room (else on the notify socket). When stdin closes (the
 * daemon that started it stopped, or went away) it closes stdout and holds its runs until the
 * last has ended, telling their ends on the notify socket; the daemon's successor, which has
 * taken that socket over, starts a launcher of its own.
 */
#define REQUEST_MAX (1 << 20)

static char request_buffer[REQUEST_MAX + 64];
static size_t request_have = 0;
static int reply_fd = 1;

/* reply writes `ID REPORT\n` in one write (atomic on a pipe: under PIPE_BUF), REPORT on one line. */
static void reply(const char *id, const char *text) {
  char line[1024];
  int n = snprintf(line, sizeof line, "%s %s\n", id, text);
  char *body = line + strlen(id) + 1;
  size_t len = (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1);
  while (len > strlen(id) + 1 && (line[len - 1] == '\n' || line[len - 1] == ' ')) len--;
  for (char *c = body; c < line + len; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
  line[len++] = '\n';
  /* stdout is non-blocking (for the exit notices): a report waits for room, as it always did. */
  if (reply_fd >= 0) write_all(reply_fd, line, len);
}

/* launch_one starts one request's run and answers it. */
static void launch_one(char *fields, size_t len) {
  char *cursor = fields, *end = fields + len;
  char *items[4096 + 8];
  size_t count = 0;
  /* One slot stays free past the last field: envp's terminating NULL goes there. */
  while (cursor < end && count < sizeof items / sizeof items[0] - 1) {
    items[count++] = cursor;
    cursor += strlen(cursor) + 1;
  }
  if (count < 3) return;
  const char *id = items[0];
  const char *cwd = items[1];
  long argc = atol(items[2]);
  if (strlen(id) >= 32 || argc < 1 || (size_t)(3 + argc) >= count) return reply(id, "err 0 request");
  char **argv = items + 3;
  long envc = atol(items[3 + argc]);
  if (envc < 0 || (size_t)(4 + argc + envc) > count) return reply(id, "err 0 request");
  char **envp = items + 4 + argc;
  argv[argc] = NULL; /* the ENVC field after the arguments: read above */
  envp[envc] = NULL; /* the slot after the last field, kept free above */
  struct spec spec;
  if (parse_spec((int)argc, argv, &spec)) return reply(id, "err 0 request");
  char line[96];
  struct run *r = start_run(&spec, cwd, envp, line, sizeof line);
  reply(id, line);
  if (r) run_begin(r);
}

/* LAUNCH_BATCH is how many requests one turn of the loop starts at most. Between two batches the
   loop reaps and settles what ended, so that a flood of launches (hundreds of batch jobs read
   at once) does not hold back every exit, and the daemon's work on them, until the last launch
   of the flood: the daemon settles the exits while this process starts the next batch. */
#define LAUNCH_BATCH 8

/* serve_buffered starts up to LAUNCH_BATCH of the whole requests buffered (requests_waiting
   says whether more wait); -1 on a request that is not the daemon's framing. */
static int serve_buffered(void) {
  requests_waiting = 0;
  size_t used = 0;
  int answer = 0;
  for (int started = 0;; started++) {
    char *at = request_buffer + used;
    size_t have = request_have - used;
    char *newline = memchr(at, '\n', have);
    if (!newline) break;
    size_t header = (size_t)(newline - at) + 1;
    size_t len = (size_t)atol(at);
    if (len > REQUEST_MAX) {
      answer = -1;
      break;
    }
    if (have < header + len) break;
    if (started == LAUNCH_BATCH) {
      requests_waiting = 1;
      break;
    }
    char *fields = at + header;
    char saved = fields[len];
    fields[len] = 0;
    launch_one(fields, len);
    fields[len] = saved;
    used += header + len;
  }
  /* What was started leaves the buffer in one move, not one per request. */
  if (used > 0) {
    memmove(request_buffer, request_buffer + used, request_have - used);
    request_have -= used;
  }
  return answer;
}

/* on_requests reads what the daemon sent and starts the whole requests, a batch at a time; 0
   once stdin has ended (or spoke something else than the daemon's framing), when stdout is
   closed too. */
static int on_requests(void) {
  if (requests_waiting) {
    /* Whole requests read earlier wait: the next batch of them, before anything more is read. */
    if (serve_buffered() == 0) return 1;
  } else {
    ssize_t k = read(0, request_buffer + request_have, sizeof request_buffer - 1 - request_have);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) return 1;
    if (k > 0) {
      request_have += (size_t)k;
      /* Not the daemon's framing: stop rather than guess. */
      if (serve_buffered() == 0 && (request_have < sizeof request_buffer - 1 || requests_waiting)) return 1;
    }
  }
  /* The daemon is gone (or spoke nonsense): no more requests, once those it sent whole are
     started, as they were before it left. The runs are held on. */
  while (requests_waiting && serve_buffered() == 0) {
  }
  requests_waiting = 0;
  if (devnull_fd >= 0) dup2(devnull_fd, 1);
  reply_fd = -1;
  notice_fd = -1;
  return 0;
}

static int launcher_main(void) {
  setsid();
  (void)!chdir("/");
  devnull_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  /* Each run holds up to four descriptors (its two streams, its log, its exit record): the soft
     limit is raised to the hard one for them, and given back to each workload as it was. */
  if (getrlimit(RLIMIT_NOFILE, &nofile_given) == 0 && nofile_given.rlim_cur < nofile_given.rlim_max) {
    struct rlimit raised = {.rlim_cur = nofile_given.rlim_max, .rlim_max = nofile_given.rlim_max};
    nofile_raised = setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }
  if (prepare() != 0) return 3;
  start_sync_thread();
  write_all(reply_fd, "ready\n", 6);
  if (fcntl(reply_fd, F_SETFL, fcntl(reply_fd, F_GETFL) | O_NONBLOCK) == 0) notice_fd = reply_fd;
  serve(0, on_requests);
  stop_sync_thread();
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--launcher") == 0) return launcher_main();
  return shim_main(argc, argv);
}
