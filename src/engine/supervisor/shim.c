/*
 * engine-shim holds one run of one service, so that the workload outlives the daemon.
 *
 * It is the engine's equivalent of containerd-shim or Podman's conmon: the daemon starts it,
 * it detaches (double fork, own session), starts the workload in its own process group,
 * copies the workload's stdout and stderr into size-bounded, rotated log files in the CRI
 * format (`<RFC3339Nano> <stdout|stderr> <F|P> <text>`), waits for it, writes the exit status
 * to `exit.json` in the run directory, tells the daemon through its notify socket (best
 * effort: a daemon that is away reads exit.json when it comes back), and exits.
 *
 * Usage: engine-shim [--spare] RUN_DIR LOG_FILE NOTIFY_SOCKET LOG_MAX_BYTES LOG_MAX_FILES CGROUP_PROCS CREDENTIALS -- ARGV...
 * LOG_FILE rotates to LOG_FILE.1 ... LOG_FILE.(LOG_MAX_FILES-1) when it would pass LOG_MAX_BYTES.
 * NOTIFY_SOCKET and CGROUP_PROCS may be "-" for none. CGROUP_PROCS is a `cgroup.procs` file
 * the workload joins before exec (so its memory limit applies from the first byte).
 * CREDENTIALS is "-" (the workload runs as the shim's user) or "UID:GID:G1,G2,...": the workload
 * drops to that user, group and supplementary groups just before exec, while the shim itself
 * keeps its own (root's) to write the logs and exit.json the workload may not touch.
 *
 * The process the daemon spawned prints one line on stdout and exits:
 *   "ok SHIM_PID CHILD_PID\n"            the workload is running;
 *   "err ERRNO STAGE\n"                   it could not start (STAGE: exec, cgroup, user, chdir, setup,
 *                                         rundir: the run's directory or the log's could not be made).
 * RUN_DIR and LOG_FILE's directory are made when missing (0750; missing parents 0700).
 * A spare run directory, `.next-run` in the directory above RUN_DIR's (the service's, so that
 * the runs' own directory holds runs only), becomes RUN_DIR by a rename when there is one: it
 * already holds the exit record's room and an empty pids file. With --spare, the shim makes the
 * next one once its workload runs, so a service that restarts creates no inode between its
 * crash and its new workload (on ext4, each create looks through the inodes the last minutes
 * freed: decision 473).
 * The shim is written to stay small: no allocation in the loop, a few hundred KB of RSS.
 *
 * A full disk loses neither the exit nor the shim (issue 13): exit.json's space is reserved
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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
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

static const char *run_dir;
static const char *log_path;
static const char *notify_path;
static long long log_max_bytes;
static int log_max_files;
static int log_fd = -1;
static long long log_size;
/* log_wrote is set once this run wrote a record: the log is synced at exit only then. */
static int log_wrote = 0;
static int sig_pipe[2] = {-1, -1};
static pid_t child = -1;
/* launched is set in a shim the launcher forked: the launcher is its parent (the kernel reaps
   it there, and it is reparented when the launcher ends), so it need not detach with two forks
   of its own. */
static int launched = 0;
/* The free-space floor under which the shim stops writing the service's log (issue 13): 5 % of
   the log's filesystem, at most 1 GiB. On an 8 MiB tmpfs that leaves ~400 KiB for the
   engine's database and exit records; on a 2 TB disk, 1 GiB. Free space is read (statvfs) at
   most every FLOOR_CHECK_BYTES written or FLOOR_CHECK_MS elapsed, so a flood costs one cheap
   syscall per 64 KiB. */
#define FLOOR_PERCENT 5
#define FLOOR_CAP_BYTES (1024LL * 1024 * 1024)
#define FLOOR_CHECK_BYTES (64 * 1024)
#define FLOOR_CHECK_MS 250
#define EXIT_RESERVE_BYTES 4096
/* Disk-aware logging: lines dropped while below the floor (or refused by the disk), and when
   free space was last read. */
static long long log_dropped;
static int log_below_floor;
static long long bytes_since_check = FLOOR_CHECK_BYTES;
static long long last_check_ms;
/* exit_fd is exit.json.tmp, preallocated when the run starts so the exit fits on a full disk. */
static int exit_fd = -1;

struct stream {
  int fd;
  const char *name;
  char buf[LINE_MAX_BYTES];
  size_t len;
};

static void path_in_run(char *out, size_t size, const char *name) { snprintf(out, size, "%s/%s", run_dir, name); }

static int write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    data += n;
    len -= (size_t)n;
  }
  return 0;
}

static void open_log(void) {
  log_fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  struct stat st;
  log_size = (log_fd >= 0 && fstat(log_fd, &st) == 0) ? st.st_size : 0;
}

/* rotate_log renames LOG.(n-2) to LOG.(n-1), ..., LOG to LOG.1, and opens a new LOG. */
static void rotate_log(void) {
  char from[PATH_MAX], to[PATH_MAX];
  if (log_fd >= 0) close(log_fd);
  for (int i = log_max_files - 1; i >= 1; i--) {
    if (i == 1)
      snprintf(from, sizeof from, "%s", log_path);
    else
      snprintf(from, sizeof from, "%s.%d", log_path, i - 1);
    snprintf(to, sizeof to, "%s.%d", log_path, i);
    rename(from, to);
  }
  if (log_max_files <= 1) unlink(log_path);
  open_log();
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
static int above_floor(long long record) {
  long long now = monotonic_ms();
  bytes_since_check += record;
  if (bytes_since_check < FLOOR_CHECK_BYTES && now - last_check_ms < FLOOR_CHECK_MS) return !log_below_floor;
  bytes_since_check = 0;
  last_check_ms = now;
  struct statvfs vfs;
  if (statvfs(log_path, &vfs) != 0) return !log_below_floor;
  long long size = (long long)vfs.f_blocks * (long long)vfs.f_frsize;
  long long avail = (long long)vfs.f_bavail * (long long)vfs.f_frsize;
  long long floor = size / 100 * FLOOR_PERCENT;
  if (floor > FLOOR_CAP_BYTES) floor = FLOOR_CAP_BYTES;
  log_below_floor = avail - record < floor;
  return !log_below_floor;
}

/* write_record writes one whole record or none: a record cut by a full disk is taken back. */
static int write_record(const char *line, size_t len) {
  ssize_t n;
  do n = write(log_fd, line, len);
  while (n < 0 && errno == EINTR);
  if (n == (ssize_t)len) return 0;
  if (n > 0) {
    struct stat st;
    if (fstat(log_fd, &st) == 0) (void)!ftruncate(log_fd, st.st_size - n);
  }
  return -1;
}

static void emit_raw(const char *stream, const char *text, size_t len, char tag);

/* emit writes one CRI log record, full (F) or partial (P), unless the disk is below its floor:
   then the record is dropped and counted, and one marker line says how many when writing
   resumes. */
static void emit(const char *stream, const char *text, size_t len, char tag) {
  long long record = 80 + (long long)len;
  if (!above_floor(record)) {
    log_dropped++;
    return;
  }
  if (log_dropped > 0) {
    char marker[160];
    long long dropped = log_dropped;
    int n = snprintf(marker, sizeof marker,
                     "[engine-shim] dropped %lld log lines while the disk was below its free-space floor or full", dropped);
    log_dropped = 0;
    emit_raw("stderr", marker, (size_t)n, 'F');
    if (log_dropped > 0) {
      /* The marker itself did not fit: still dropping, this line included. */
      log_dropped = dropped + 1;
      return;
    }
  }
  emit_raw(stream, text, len, tag);
}

static void emit_raw(const char *stream, const char *text, size_t len, char tag) {
  char head[80];
  char ts[48];
  timestamp(ts, sizeof ts);
  int head_len = snprintf(head, sizeof head, "%s %s %c ", ts, stream, tag);
  long long record = head_len + (long long)len + 1;
  if (log_size > 0 && log_size + record > log_max_bytes) rotate_log();
  /* A log that could not be created (no inode left) is tried again when there is room. */
  if (log_fd < 0) open_log();
  if (log_fd < 0) {
    log_dropped++;
    return;
  }
  /* One write per record keeps records whole even with two streams interleaving. */
  char line[LINE_MAX_BYTES + 96];
  memcpy(line, head, (size_t)head_len);
  memcpy(line + head_len, text, len);
  line[head_len + len] = '\n';
  if (write_record(line, (size_t)head_len + len + 1) == 0) {
    log_size += record;
    log_wrote = 1;
  } else
    log_dropped++;
}

/* pump reads what the stream has and emits each complete line; returns 0 at EOF. */
static int pump(struct stream *s) {
  ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
  if (n < 0) return errno == EINTR || errno == EAGAIN ? 1 : 0;
  if (n == 0) {
    if (s->len > 0) emit(s->name, s->buf, s->len, 'F');
    s->len = 0;
    return 0;
  }
  s->len += (size_t)n;
  size_t start = 0;
  for (size_t i = 0; i < s->len; i++) {
    if (s->buf[i] == '\n') {
      size_t end = i;
      if (end > start && s->buf[end - 1] == '\r') end--;
      emit(s->name, s->buf + start, end - start, 'F');
      start = i + 1;
    }
  }
  if (start == 0 && s->len == sizeof s->buf) {
    emit(s->name, s->buf, s->len, 'P');
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

/* reserve_exit preallocates exit.json.tmp when the run starts, so that the exit record fits
   even when the disk is full by the time the workload ends (issue 13). */
/* reserve_room gives the exit record's file its EXIT_RESERVE_BYTES; 0 when it has them. */
static int reserve_room(int fd) {
  if (posix_fallocate(fd, 0, EXIT_RESERVE_BYTES) == 0) return 0;
  /* No fallocate here (or no room yet): reserve by writing. */
  static const char spaces[EXIT_RESERVE_BYTES] = {0};
  if (pwrite(fd, spaces, sizeof spaces, 0) == (ssize_t)sizeof spaces) return 0;
  (void)!ftruncate(fd, 0);
  return -1;
}

static void reserve_exit(void) {
  char tmp[PATH_MAX];
  path_in_run(tmp, sizeof tmp, "exit.json.tmp");
  /* No O_TRUNC: a spare's file keeps the room it was given (a new run's file is empty anyway). */
  exit_fd = open(tmp, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (exit_fd >= 0) reserve_room(exit_fd);
}

/* spare_path names the service's spare run directory: `.next-run` two levels above RUN_DIR
   (RUN_DIR is <service>/runs/<run>). -1 when RUN_DIR has no such parent. */
static int spare_path(char *out, size_t size, const char *suffix) {
  char parent[PATH_MAX];
  snprintf(parent, sizeof parent, "%s", run_dir);
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
   an empty pids file, so the next shim takes all three by one rename. One that is there already
   is left; anything that fails leaves no spare (the next run makes its own, as without one). */
static void make_spare(void) {
  char tmp[PATH_MAX], spare[PATH_MAX], record[PATH_MAX], pids[PATH_MAX], suffix[32];
  if (spare_path(spare, sizeof spare, "") != 0 || access(spare, F_OK) == 0) return;
  snprintf(suffix, sizeof suffix, ".%d", (int)getpid());
  if (spare_path(tmp, sizeof tmp, suffix) != 0) return;
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
static int take_spare(void) {
  char spare[PATH_MAX];
  if (spare_path(spare, sizeof spare, "") != 0) return -1;
  return rename(spare, run_dir);
}

/* write_exit records how the run ended in exit.json, atomically (write then rename), into the
   space reserved at start when there is one. It returns 0 once exit.json holds the record.
   With synced_fd, the file is left open there for the caller to fsync after it has told the
   daemon (the daemon reads it from the page cache; the sync is for a machine that loses power,
   and costs milliseconds a restart waited for: decision 452); without, it is synced before the rename. */
static int write_exit(int status, int exec_errno, const char *stage, int *synced_fd) {
  char tmp[PATH_MAX], path[PATH_MAX], ts[48], body[512];
  timestamp(ts, sizeof ts);
  int len;
  if (exec_errno) {
    len = snprintf(body, sizeof body,
                   "{\"pid\":%d,\"exit_code\":null,\"signal\":null,\"exec_errno\":%d,\"exec_error\":\"%s\",\"stage\":\"%s\","
                   "\"message\":\"%s\",\"ended_at\":\"%s\"}\n",
                   (int)child, exec_errno, strerrorname_np(exec_errno) ? strerrorname_np(exec_errno) : "E?", stage,
                   strerror(exec_errno), ts);
  } else if (WIFSIGNALED(status)) {
    len = snprintf(body, sizeof body,
                   "{\"pid\":%d,\"exit_code\":null,\"signal\":\"%s\",\"signal_number\":%d,\"core_dumped\":%s,\"ended_at\":\"%s\"}\n",
                   (int)child, signal_name(WTERMSIG(status)), WTERMSIG(status), WCOREDUMP(status) ? "true" : "false", ts);
  } else {
    len = snprintf(body, sizeof body, "{\"pid\":%d,\"exit_code\":%d,\"signal\":null,\"ended_at\":\"%s\"}\n", (int)child,
                   WEXITSTATUS(status), ts);
  }
  path_in_run(tmp, sizeof tmp, "exit.json.tmp");
  path_in_run(path, sizeof path, "exit.json");
  int fd = exit_fd;
  exit_fd = -1;
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

/* notify tells the daemon the run ended; a daemon that is away finds exit.json later. */
static void notify(void) {
  if (strcmp(notify_path, "-") == 0) return;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strncpy(addr.sun_path, notify_path, sizeof addr.sun_path - 1);
  struct timeval tv = {.tv_sec = 1};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) {
    char msg[PATH_MAX + 16];
    int len = snprintf(msg, sizeof msg, "exit %s\n", run_dir);
    write_all(fd, msg, (size_t)len);
  }
  close(fd);
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

static void report(int fd, const char *line) {
  write_all(fd, line, strlen(line));
  close(fd);
}

static int shim_main(int argc, char **argv) {
  int spare = argc > 1 && strcmp(argv[1], "--spare") == 0;
  if (spare) {
    argv++;
    argc--;
  }
  if (argc < 10 || strcmp(argv[8], "--") != 0) {
    fprintf(stderr, "usage: engine-shim [--spare] RUN_DIR LOG_FILE NOTIFY_SOCKET LOG_MAX_BYTES LOG_MAX_FILES CGROUP_PROCS CREDENTIALS -- ARGV...\n");
    return 2;
  }
  const char *credentials = argv[7];
  int switch_user = strcmp(credentials, "-") != 0;
  uid_t run_uid = 0;
  gid_t run_gid = 0;
  gid_t run_groups[MAX_GROUPS];
  size_t run_ngroups = 0;
  if (switch_user && parse_credentials(credentials, &run_uid, &run_gid, run_groups, &run_ngroups) != 0) {
    fprintf(stderr, "engine-shim: CREDENTIALS must be - or UID:GID:G1,G2,...\n");
    return 2;
  }
  run_dir = argv[1];
  log_path = argv[2];
  notify_path = argv[3];
  log_max_bytes = atoll(argv[4]);
  log_max_files = atoi(argv[5]);
  const char *cgroup_procs = argv[6];
  char **workload = argv + 9;
  if (log_max_bytes < 4096) log_max_bytes = 4096;
  if (log_max_files < 1) log_max_files = 1;

  /* The run's directory (0750; the spare, when the last run left one) and the service's logs/
     and runs/ (0700, the engine's own) are made here, off the daemon's event loop: on a busy
     disk each mkdir costs it 25-200 us. */
  char log_dir[PATH_MAX];
  snprintf(log_dir, sizeof log_dir, "%s", log_path);
  char *log_slash = strrchr(log_dir, '/');
  if (log_slash && log_slash != log_dir) *log_slash = 0;
  if ((take_spare() != 0 && make_dir(run_dir, 0750, 0700) != 0) || (log_slash && make_dir(log_dir, 0700, 0700) != 0)) {
    char line[64];
    snprintf(line, sizeof line, "err %d rundir\n", errno);
    report(1, line);
    return 1;
  }

  if (launched) {
    /* The launcher is the parent, never waits for it (SIGCHLD ignored: the kernel reaps it),
       and two forks are saved: each is a wake-up of another process, and those made most of a
       restart's wait on a busy machine. It leads a session of its own and opens no terminal
       (every open here is a plain file or /dev/null); its workload, which could, is not the
       session's leader. */
    setsid();
  } else {
    /* Detach: the spawned process exits once the workload runs, so the shim is reparented
       to init (or the nearest subreaper) and never becomes the daemon's zombie. */
    pid_t first = fork();
    if (first < 0) {
      report(1, "err 0 setup\n");
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
  }

  signal(SIGHUP, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  /* Descendants the workload orphans are reparented here, not to init, so none escapes
     the end-of-run cleanup and none lingers as a zombie. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  int status_fd = dup(1);
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull >= 0) {
    dup2(devnull, 0);
    dup2(devnull, 1);
    dup2(devnull, 2);
  }
  fcntl(status_fd, F_SETFD, FD_CLOEXEC);

  int out[2], err[2], exec_err[2];
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(exec_err, O_CLOEXEC) || pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK)) {
    report(status_fd, "err 0 setup\n");
    return 1;
  }
  struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART | SA_NOCLDSTOP};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);

  /* The workload starts through vfork, as posix_spawn starts a program: the child borrows this
     process's memory until its exec, so no page table is copied and neither side takes
     copy-on-write faults (a tenth of a batch job's shim time went to them and to the copy).
     Every signal is blocked across it, so that no handler of the shim's runs in the child; the
     child sets the dispositions and the mask back before its exec. Until then it makes system
     calls only, on its own variables (the user switch by raw system calls: glibc's setuid keeps
     process-wide state, which the child shares with this process). */
  sigset_t all_signals, old_mask;
  sigfillset(&all_signals);
  sigprocmask(SIG_SETMASK, &all_signals, &old_mask);
  child = vfork();
  if (child < 0) {
    sigprocmask(SIG_SETMASK, &old_mask, NULL);
    report(status_fd, "err 0 setup\n");
    return 1;
  }
  if (child == 0) {
    int code = 0;
    const char *stage = "exec";
    setpgid(0, 0);
    if (strcmp(cgroup_procs, "-") != 0) {
      int fd = open(cgroup_procs, O_WRONLY | O_CLOEXEC);
      if (fd < 0 || write(fd, "0\n", 2) < 0) {
        code = errno;
        stage = "cgroup";
      }
      if (fd >= 0) close(fd);
    }
    /* Groups first, then the gid, then the uid: once the uid is dropped the rest is no longer allowed.
       An unprivileged uid also loses every capability, so the workload cannot switch back. */
    if (code == 0 && switch_user) {
      if (syscall(SYS_setgroups, run_ngroups, run_groups) != 0 || syscall(SYS_setgid, run_gid) != 0 ||
          syscall(SYS_setuid, run_uid) != 0) {
        code = errno;
        stage = "user";
      }
    }
    if (code == 0) {
      dup2(out[1], 1);
      dup2(err[1], 2);
      signal(SIGHUP, SIG_DFL);
      signal(SIGPIPE, SIG_DFL);
      struct sigaction dfl = {.sa_handler = SIG_DFL};
      sigaction(SIGCHLD, &dfl, NULL);
      sigaction(SIGTERM, &dfl, NULL);
      sigaction(SIGINT, &dfl, NULL);
      sigprocmask(SIG_SETMASK, &old_mask, NULL);
      execvp(workload[0], workload);
      code = errno;
    }
    char msg[64];
    int len = snprintf(msg, sizeof msg, "%d %s", code, stage);
    write_all(exec_err[1], msg, (size_t)len);
    _exit(127);
  }
  sigprocmask(SIG_SETMASK, &old_mask, NULL);
  close(out[1]);
  close(err[1]);
  close(exec_err[1]);
  setpgid(child, child); /* also from the parent side, so the group exists before any signal */

  char msg[64] = {0};
  ssize_t got;
  do got = read(exec_err[0], msg, sizeof msg - 1);
  while (got < 0 && errno == EINTR);
  close(exec_err[0]);
  if (got > 0) {
    int code = atoi(msg);
    const char *stage = strchr(msg, ' ') ? strchr(msg, ' ') + 1 : "exec";
    int status;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (write_exit(status, code ? code : EIO, stage, NULL) != 0) {
      /* The daemon reads the failure from this report too; exit.json is best effort here. */
    }
    char line[96];
    snprintf(line, sizeof line, "err %d %s\n", code, stage);
    report(status_fd, line);
    return 0;
  }

  /* Reserved before "ok" is reported: from then on, the exit record has its room. */
  reserve_exit();
  {
    char pids[64], path[PATH_MAX], tmp[PATH_MAX];
    int len = snprintf(pids, sizeof pids, "%d %d\n", (int)getpid(), (int)child);
    path_in_run(tmp, sizeof tmp, "pids.tmp");
    path_in_run(path, sizeof path, "pids");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd >= 0) {
      write_all(fd, pids, (size_t)len);
      close(fd);
      rename(tmp, path);
    }
    char line[96];
    snprintf(line, sizeof line, "ok %d %d\n", (int)getpid(), (int)child);
    report(status_fd, line);
  }
  if (spare) make_spare();

  open_log();
  static struct stream streams[2];
  streams[0].fd = out[0];
  streams[0].name = "stdout";
  streams[1].fd = err[0];
  streams[1].name = "stderr";
  int open_streams = 2;
  int exited = 0, status = 0;
  struct timespec exited_at = {0};

  for (;;) {
    struct pollfd fds[3];
    int n = 0;
    fds[n++] = (struct pollfd){.fd = sig_pipe[0], .events = POLLIN};
    for (int i = 0; i < 2; i++)
      if (streams[i].fd >= 0) fds[n++] = (struct pollfd){.fd = streams[i].fd, .events = POLLIN};
    /* After the main process exits, leftovers of its group are killed (systemd's
       KillMode=control-group), then output is drained for at most a second. */
    int timeout = exited ? 100 : -1;
    int ready = poll(fds, (nfds_t)n, timeout);
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < n && ready > 0; i++) {
      if (!fds[i].revents) continue;
      if (fds[i].fd == sig_pipe[0]) {
        unsigned char sigs[32];
        ssize_t k = read(sig_pipe[0], sigs, sizeof sigs);
        for (ssize_t j = 0; j < k; j++)
          if (sigs[j] == SIGTERM || sigs[j] == SIGINT) kill(-child, sigs[j]);
        continue;
      }
      for (int s = 0; s < 2; s++) {
        if (streams[s].fd == fds[i].fd && !pump(&streams[s])) {
          close(streams[s].fd);
          streams[s].fd = -1;
          open_streams--;
        }
      }
    }
    int st;
    pid_t r;
    while ((r = waitpid(-1, &st, WNOHANG)) > 0) {
      if (r == child && !exited) {
        exited = 1;
        status = st;
        clock_gettime(CLOCK_MONOTONIC, &exited_at);
        kill(-child, SIGKILL);
      }
    }
    if (exited) {
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      long waited_ms = (now.tv_sec - exited_at.tv_sec) * 1000 + (now.tv_nsec - exited_at.tv_nsec) / 1000000;
      if (open_streams == 0 || waited_ms > 1000) break;
    }
  }
  /* exit.json is the source of truth: on a disk with no room even for it, try again every
     second until it is written, and only then tell the daemon (it sees the shim alive and the
     run not yet ended meanwhile). */
  int exit_record = -1;
  while (write_exit(status, 0, NULL, &exit_record) != 0) {
    /* A run directory removed under the shim (its service's directory deleted by hand) will not
       come back: there is nowhere to record the exit, and waiting would keep this process for
       ever. The daemon settles such a run as lost once the shim is gone. */
    struct stat run_dir_stat;
    if (stat(run_dir, &run_dir_stat) != 0 && errno == ENOENT) break;
    sleep(1);
  }
  /* Told first, synced after: the daemon reads exit.json and the log from the page cache, so a
     restart need not wait for the disk; a power loss in between leaves a record the next daemon
     cannot read, and the run is settled as lost, as it would be without exit.json at all. */
  notify();
  fsync(exit_record);
  close(exit_record);
  /* A run that printed nothing has nothing of its own to sync: an fsync of the log it only
     opened would write the new file's inode, a disk write and a sleep per silent batch job. */
  if (log_fd >= 0 && log_wrote) fsync(log_fd);
  return 0;
}

/* ---------------------------------------------------------------- launcher mode
 *
 * `engine-shim --launcher` is started once by the daemon and starts every shim from then on,
 * so the daemon's own process never forks (a spawn from a large, many-threaded process costs
 * it a millisecond of its event loop; a fork of this small one costs ~0.1 ms elsewhere). It
 * says "ready\n", then reads requests on stdin, each `LEN\n` and LEN bytes of NUL-terminated
 * fields: ID, CWD, ARGC, ARGC arguments (a shim's command line, argv[0] included), ENVC, ENVC
 * `KEY=VALUE` entries. For each it forks the shim itself, started exactly as a spawn would
 * start it (that cwd and environment, default signals, stdin on /dev/null), reads the shim's
 * one-line report (its stdout and stderr) as soon as the line is whole and writes
 * `ID REPORT\n` on stdout in one write (atomic on a pipe: under PIPE_BUF), `ID err 0 setup`
 * when the shim ended without a word. It exits when stdin closes (the daemon that started it is
 * gone) and the reports pending are relayed; the shims it started keep running, reparented.
 * A shim it starts does not detach with two forks of its own (`launched`): each fork and each
 * relay is a wake-up of another process, and those made most of a restart's wait (decision 466).
 */
#define REQUEST_MAX (1 << 20)
/* MAX_PENDING bounds the reports awaited at once; past it the launcher reads no request until one ends. */
#define MAX_PENDING 256

/* pending is a started shim whose report line has not come whole yet. */
struct pending {
  char id[32];
  int fd;
  size_t got;
  char text[900];
};
static struct pending pending[MAX_PENDING];
static int pending_count = 0;

/* reply writes `ID REPORT\n` in one write (atomic on a pipe: under PIPE_BUF), REPORT on one line. */
static void reply(int reply_fd, const char *id, const char *text) {
  char line[1024];
  int n = snprintf(line, sizeof line, "%s %s\n", id, text);
  char *body = line + strlen(id) + 1;
  size_t len = (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1);
  while (len > strlen(id) + 1 && (line[len - 1] == '\n' || line[len - 1] == ' ')) len--;
  for (char *c = body; c < line + len; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
  line[len++] = '\n';
  write_all(reply_fd, line, len);
}

/* finish relays a pending shim's report (what it said, or `err 0 setup` when it said nothing) and forgets it. */
static void finish(int index, int reply_fd) {
  struct pending *p = &pending[index];
  p->text[p->got] = 0;
  char *newline = memchr(p->text, '\n', p->got);
  if (newline) *newline = 0;
  reply(reply_fd, p->id, p->got > 0 && p->text[0] ? p->text : "err 0 setup");
  close(p->fd);
  pending[index] = pending[--pending_count];
}

/* launch_one forks one shim, as a spawn would start it (that cwd and environment, default
   signals, stdin on /dev/null, stdout and stderr to its report pipe), and adds it to the
   pending reports; a request it cannot start is answered at once. */
static void launch_one(char *fields, size_t len, int reply_fd) {
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
  char text[64];
  if (strlen(id) >= sizeof pending[0].id || argc < 1 || (size_t)(3 + argc) >= count) return reply(reply_fd, id, "err 0 request");
  char **argv = items + 3;
  long envc = atol(items[3 + argc]);
  if (envc < 0 || (size_t)(4 + argc + envc) > count) return reply(reply_fd, id, "err 0 request");
  char **envp = items + 4 + argc;
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    snprintf(text, sizeof text, "err %d setup", errno);
    return reply(reply_fd, id, text);
  }
  pid_t shim = fork();
  if (shim == 0) {
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(report[1], 1);
    dup2(report[1], 2);
    /* Only 0-2 may stay: the shim never execs, and a copy of a report pipe it kept (its own,
       or another pending shim's) would hold that report open for as long as the run lasts. */
    if (devnull > 2) close(devnull);
    if (report[0] > 2) close(report[0]);
    if (report[1] > 2) close(report[1]);
    for (int i = 0; i < pending_count; i++) close(pending[i].fd);
    if (reply_fd > 2) close(reply_fd);
    if (chdir(cwd) != 0) {
      char line[64];
      int n = snprintf(line, sizeof line, "err %d chdir\n", errno);
      write_all(1, line, (size_t)n);
      _exit(1);
    }
    argv[argc] = NULL; /* the ENVC field after the arguments: no longer needed */
    envp[envc] = NULL; /* the slot after the last field, kept free above */
    environ = envp;
    launched = 1;
    _exit(shim_main((int)argc, argv));
  }
  close(report[1]);
  if (shim < 0) {
    close(report[0]);
    snprintf(text, sizeof text, "err %d fork", errno);
    return reply(reply_fd, id, text);
  }
  struct pending *p = &pending[pending_count++];
  snprintf(p->id, sizeof p->id, "%s", id);
  p->fd = report[0];
  p->got = 0;
}

/* serve_buffered starts the whole requests in `buffer` while a report slot is free; -1 on a
   request that is not the daemon's framing. */
static int serve_buffered(char *buffer, size_t *have, int reply_fd) {
  while (pending_count < MAX_PENDING) {
    char *newline = memchr(buffer, '\n', *have);
    if (!newline) break;
    size_t header = (size_t)(newline - buffer) + 1;
    size_t len = (size_t)atol(buffer);
    if (len > REQUEST_MAX) return -1;
    if (*have < header + len) break;
    char *fields = buffer + header;
    char saved = fields[len];
    fields[len] = 0;
    launch_one(fields, len, reply_fd);
    fields[len] = saved;
    memmove(buffer, buffer + header + len, *have - header - len);
    *have -= header + len;
  }
  return 0;
}

/*
 * launcher_main serves requests until stdin closes, then relays the reports still pending and
 * exits; the shims it started are its children until then (the kernel reaps them: SIGCHLD is
 * ignored) and keep running after it, reparented.
 */
static int launcher_main(void) {
  signal(SIGPIPE, SIG_IGN);
  signal(SIGCHLD, SIG_IGN);
  int reply_fd = 1;
  write_all(reply_fd, "ready\n", 6);
  static char buffer[REQUEST_MAX + 64];
  size_t have = 0;
  int reading = 1;
  for (;;) {
    /* Not the daemon's framing: stop rather than guess. */
    if (serve_buffered(buffer, &have, reply_fd) != 0 || have == sizeof buffer - 1) return 3;
    if (!reading && pending_count == 0) return 0;
    struct pollfd fds[MAX_PENDING + 1];
    int n = 0;
    for (int i = 0; i < pending_count; i++) fds[n++] = (struct pollfd){.fd = pending[i].fd, .events = POLLIN};
    int watch_stdin = reading && pending_count < MAX_PENDING;
    if (watch_stdin) fds[n++] = (struct pollfd){.fd = 0, .events = POLLIN};
    if (poll(fds, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      return 3;
    }
    /* Reports first, from the last: finish moves the last pending into the slot it frees. */
    for (int i = pending_count - 1; i >= 0; i--) {
      if (!fds[i].revents) continue;
      struct pending *p = &pending[i];
      ssize_t k = read(p->fd, p->text + p->got, sizeof p->text - 1 - p->got);
      if (k < 0 && errno == EINTR) continue;
      if (k > 0) p->got += (size_t)k;
      if (k <= 0 || p->got == sizeof p->text - 1 || memchr(p->text, '\n', p->got)) finish(i, reply_fd);
    }
    if (!watch_stdin || !fds[n - 1].revents) continue;
    ssize_t k = read(0, buffer + have, sizeof buffer - 1 - have);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) reading = 0;
    else have += (size_t)k;
  }
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--launcher") == 0) return launcher_main();
  return shim_main(argc, argv);
}
