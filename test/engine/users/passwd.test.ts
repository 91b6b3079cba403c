import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  watch,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { libc } from "../../../src/engine/users/libc";
import { AccountFiles, accountText, removeAccounts, type SystemAccount } from "../../../src/engine/users/passwd";
import { eventually, tempDir } from "../../helpers";

const BASE = {
  passwd: "root:x:0:0:root:/root:/bin/bash\nold:x:61184:61184:engine service old:/srv/old:/usr/sbin/nologin\n",
  shadow: "root:*:19000:0:99999:7:::\nold:!:19000::::::\n",
  group: "root:x:0:\nold:x:61184:\nvideo:x:44:\n",
  gshadow: "root:*::\nold:!::\nvideo:*::\n",
};

function account(name: string, id: number, makeGroup = true): SystemAccount {
  return { name, uid: id, gid: id, makeGroup, comment: `engine service ${name}`, home: `/srv/${name}`, shell: "/usr/sbin/nologin" };
}

let etc: string;
beforeEach(() => {
  etc = tempDir("engine-test-etc-");
  for (const [file, text] of Object.entries(BASE)) writeFileSync(join(etc, file), text);
  chmodSync(join(etc, "shadow"), 0o640);
  chmodSync(join(etc, "gshadow"), 0o640);
});
afterEach(() => rmSync(etc, { recursive: true, force: true }));

const read = (file: string) => readFileSync(join(etc, file), "utf8");

describe("AccountFiles", () => {
  test.skipIf(libc() === null)(
    "adds users and their groups in one write, each file keeping its mode, and leaves no lock behind",
    async () => {
      const files = new AccountFiles(etc);
      expect(await files.add([account("eng-a", 61185), account("eng-b", 61186)])).toEqual(["added", "added"]);
      expect(read("passwd")).toBe(
        `${BASE.passwd}eng-a:x:61185:61185:engine service eng-a:/srv/eng-a:/usr/sbin/nologin\neng-b:x:61186:61186:engine service eng-b:/srv/eng-b:/usr/sbin/nologin\n`,
      );
      expect(read("group")).toBe(`${BASE.group}eng-a:x:61185:\neng-b:x:61186:\n`);
      expect(read("gshadow")).toBe(`${BASE.gshadow}eng-a:!::\neng-b:!::\n`);
      const days = Math.floor(Date.now() / 86_400_000);
      expect(read("shadow")).toBe(`${BASE.shadow}eng-a:!:${days}::::::\neng-b:!:${days}::::::\n`);
      expect(statSync(join(etc, "shadow")).mode & 0o777).toBe(0o640);
      expect(statSync(join(etc, "passwd")).mode & 0o777).toBe(0o644 & ~process.umask());
      for (const leftover of ["passwd.lock", "group.lock", "shadow.lock", "gshadow.lock", "passwd+", `passwd.${process.pid}`]) {
        expect(existsSync(join(etc, leftover))).toBe(false);
      }
    },
  );

  test.skipIf(libc() === null)("the groups' files are renamed into place before the users' files, each once", async () => {
    const renamed: string[] = [];
    const names = new Set(Object.keys(BASE));
    // A rename over a file is a `rename` event naming it (inotify's IN_MOVED_TO), in the order they happen.
    const watcher = watch(etc, (event, name) => {
      if (event === "rename" && name && names.has(name) && existsSync(join(etc, name))) renamed.push(name);
    });
    try {
      expect(await new AccountFiles(etc).add([account("eng-order", 61200)])).toEqual(["added"]);
      await eventually(() => renamed.length >= 4);
      await Bun.sleep(50); // no late event left
    } finally {
      watcher.close();
    }
    expect([...renamed].sort()).toEqual(["group", "gshadow", "passwd", "shadow"]);
    const at = (name: string) => renamed.indexOf(name);
    // A user's gid never names a group that is not there yet, nor a shadow entry a user that is not.
    expect(Math.max(at("group"), at("gshadow"))).toBeLessThan(Math.min(at("passwd"), at("shadow")));
  });

  test.skipIf(libc() === null)(
    "a user of an existing group gets no group; a taken name or id is refused and nothing is written for it",
    async () => {
      const files = new AccountFiles(etc);
      const results = await files.add([
        { ...account("eng-v", 61190, false), gid: 44 },
        account("old", 61191),
        account("eng-c", 61184),
        account("eng-d", 61192),
        account("eng-d", 61193),
      ]);
      expect(results).toEqual(["added", "taken", "taken", "added", "taken"]);
      expect(read("passwd")).toContain("eng-v:x:61190:44:");
      expect(read("group")).toBe(`${BASE.group}eng-d:x:61192:\n`);
      expect(read("passwd").match(/^eng-d:/gm)?.length).toBe(1);
      expect(read("passwd")).not.toContain("eng-c");
    },
  );

  test.skipIf(libc() === null)(
    "another process holding the passwd lock (lckpwdf's fcntl lock) makes it busy; released, it goes",
    async () => {
      const ready = join(etc, "ready");
      const holder = Bun.spawn(
        [
          process.execPath,
          "-e",
          `const { openSync } = require("node:fs"); const { libc } = require(${JSON.stringify(join(import.meta.dir, "../../../src/engine/users/libc.ts"))});
         const fd = openSync(${JSON.stringify(join(etc, ".pwd.lock"))}, "w", 0o600);
         if (!libc().tryWriteLock(fd)) process.exit(3);
         require("node:fs").writeFileSync(${JSON.stringify(ready)}, "");
         setTimeout(() => {}, 30000);`,
        ],
        { stdout: "ignore", stderr: "inherit" },
      );
      try {
        await eventually(() => existsSync(ready), { timeoutMs: 10_000 });
        const files = new AccountFiles(etc);
        expect(await files.add([account("eng-e", 61194)])).toEqual(["busy"]);
        expect(read("passwd")).toBe(BASE.passwd);
        holder.kill("SIGKILL");
        await holder.exited;
        expect(await files.add([account("eng-e", 61194)])).toEqual(["added"]);
      } finally {
        holder.kill("SIGKILL");
      }
    },
  );

  test.skipIf(libc() === null)("shadow-utils' lock file: a live owner makes it busy, a dead one's is taken over", async () => {
    const files = new AccountFiles(etc);
    writeFileSync(join(etc, "group.lock"), String(process.ppid));
    expect(await files.add([account("eng-f", 61195)])).toEqual(["busy"]);
    expect(readFileSync(join(etc, "group.lock"), "utf8")).toBe(String(process.ppid)); // not ours to remove
    const gone = Bun.spawn(["true"]);
    await gone.exited;
    writeFileSync(join(etc, "group.lock"), String(gone.pid));
    expect(await files.add([account("eng-f", 61195)])).toEqual(["added"]);
    expect(existsSync(join(etc, "group.lock"))).toBe(false);
  });

  test.skipIf(libc() === null)(
    "while a write syncs, each file's shadow-utils lock holds this pid, all four links of one file",
    async () => {
      const files = new AccountFiles(etc);
      const writing = files.add([account("eng-l", 61200)]); // the locks are taken before its first wait
      const locks = ["passwd", "shadow", "group", "gshadow"].map((file) => join(etc, `${file}.lock`));
      try {
        for (const lock of locks) expect(readFileSync(lock, "utf8")).toBe(String(process.pid));
        expect(new Set(locks.map((lock) => statSync(lock).ino)).size).toBe(1);
        expect(statSync(locks[0] as string).nlink).toBe(4);
        expect(readdirSync(etc).filter((file) => /\.\d+$/.test(file))).toEqual([]);
      } finally {
        expect(await writing).toEqual(["added"]);
      }
      for (const lock of locks) expect(existsSync(lock)).toBe(false);
    },
  );

  test.skipIf(libc() === null)(
    "the texts kept between writes follow this process's writes and every change another tool makes",
    async () => {
      const files = new AccountFiles(etc);
      expect(await files.add([account("eng-g", 61196)])).toEqual(["added"]);
      expect(accountText(join(etc, "passwd"))).toBe(read("passwd"));
      expect(accountText(join(etc, "group"))).toBe(read("group"));
      // Another tool replaces the file (useradd writes passwd+ and renames it): the next add sees its user.
      const edited = `${read("passwd")}eng-h:x:61197:61197:made by useradd:/srv/eng-h:/usr/sbin/nologin\n`;
      writeFileSync(join(etc, "passwd+"), edited);
      renameSync(join(etc, "passwd+"), join(etc, "passwd"));
      expect(await files.add([account("eng-h", 61198)])).toEqual(["taken"]);
      // An edit in place (same inode; vipw would rename, an editor may not).
      const inPlace = read("passwd").replace("made by useradd", "made in place by an editor");
      writeFileSync(join(etc, "passwd"), inPlace);
      expect(accountText(join(etc, "passwd"))).toBe(inPlace);
      expect(await files.add([account("eng-i", 61199)])).toEqual(["added"]);
      expect(read("passwd")).toBe(`${inPlace}eng-i:x:61199:61199:engine service eng-i:/srv/eng-i:/usr/sbin/nologin\n`);
      expect(read("group")).toBe(`${BASE.group}eng-g:x:61196:\neng-i:x:61199:\n`);
      rmSync(join(etc, "group"));
      expect(accountText(join(etc, "group"))).toBe("");
    },
  );

  test("a file that is a link, a field with a separator, or files that are not there: left to groupadd and useradd", async () => {
    const files = new AccountFiles(etc);
    expect(await files.add([{ ...account("eng-g", 61196), comment: "a:b" }])).toEqual(["unsupported"]);
    mkdirSync(join(etc, "real"));
    writeFileSync(join(etc, "real", "shadow"), BASE.shadow);
    rmSync(join(etc, "shadow"));
    symlinkSync(join(etc, "real", "shadow"), join(etc, "shadow"));
    expect(await files.add([account("eng-g", 61196)])).toEqual(["unsupported"]);
    expect(await new AccountFiles(join(etc, "nowhere")).add([account("eng-g", 61196)])).toEqual(["unsupported"]);
    expect(read("passwd")).toBe(BASE.passwd);
  });

  test.skipIf(libc() === null)(
    "a file that only grew is checked against its new lines too, and a rewritten one against all of it",
    async () => {
      const files = new AccountFiles(etc);
      expect(await files.add([account("eng-j", 61199)])).toEqual(["added"]);
      // Another tool appends a user and a group after the engine's last write.
      writeFileSync(join(etc, "passwd"), `${read("passwd")}ext:x:61300:61300::/:/bin/false\n`);
      writeFileSync(join(etc, "group"), `${read("group")}extg:x:61301:\n`);
      expect(await files.add([account("eng-k", 61300), account("ext", 61302), account("extg", 61303), account("eng-l", 61301)])).toEqual([
        "taken",
        "taken",
        "taken",
        "taken",
      ]);
      // ... and then rewrites the file without them: their name and ids are free again.
      writeFileSync(join(etc, "passwd"), read("passwd").replace("ext:x:61300:61300::/:/bin/false\n", ""));
      writeFileSync(join(etc, "group"), read("group").replace("extg:x:61301:\n", ""));
      expect(await files.add([account("ext", 61300), account("eng-l", 61301)])).toEqual(["added", "added"]);
      expect(read("passwd").match(/^ext:/gm)?.length).toBe(1);
    },
  );

  test.skipIf(libc() === null)(
    "removeAccounts takes users and their own groups out of all four files in one write, leaving the rest",
    async () => {
      const files = new AccountFiles(etc);
      expect(await files.add([account("eng-h", 61197), account("eng-i", 61198)])).toEqual(["added", "added"]);
      expect(removeAccounts(["eng-h", "old"], etc)).toBe(true);
      expect(read("passwd")).toBe(
        `root:x:0:0:root:/root:/bin/bash\neng-i:x:61198:61198:engine service eng-i:/srv/eng-i:/usr/sbin/nologin\n`,
      );
      expect(read("group")).toBe("root:x:0:\nvideo:x:44:\neng-i:x:61198:\n");
      expect(read("gshadow")).toBe("root:*::\nvideo:*::\neng-i:!::\n");
      expect(read("shadow")).not.toContain("eng-h");
      expect(read("shadow")).not.toContain("old:");
      expect(statSync(join(etc, "shadow")).mode & 0o777).toBe(0o640);
      writeFileSync(join(etc, "passwd.lock"), String(process.ppid));
      expect(removeAccounts(["eng-i"], etc)).toBe(false);
      expect(read("passwd")).toContain("eng-i");
    },
  );

  test.skipIf(libc() === null)(
    "four processes adding and removing colliding accounts at once never write a name or an id twice",
    async () => {
      // Each worker adds accounts whose names and ids collide on purpose (31 of each) and removes
      // some, retrying while busy. The locks must keep every file's names and ids unique and the
      // four files in step: a user and its group come and go together.
      const worker = `const { AccountFiles, removeAccounts } = require(${JSON.stringify(join(import.meta.dir, "../../../src/engine/users/passwd.ts"))});
        const etc = process.argv[1]; const files = new AccountFiles(etc); let added = 0;
        const pick = () => Math.floor(Math.random() * 31);
        (async () => { for (let i = 0; i < 60; i++) {
          for (;;) {
            const n = pick();
            const name = "eng-s" + n;
            const result = Math.random() < 0.3 ? (removeAccounts([name], etc) ? "removed" : "busy")
              : (await files.add([{ name, uid: 61300 + pick(), gid: 0, makeGroup: true, comment: "engine service s", home: "/srv/s", shell: "/usr/sbin/nologin" }].map((a) => ({ ...a, gid: a.uid }))))[0];
            if (result === "added") added++;
            if (result !== "busy") break;
            Bun.sleepSync(Math.random() * 2);
          }
        }
        console.log(added); })();`;
      const workers = [0, 1, 2, 3].map(() => Bun.spawn([process.execPath, "-e", worker, etc], { stdout: "pipe", stderr: "inherit" }));
      const outputs = await Promise.all(workers.map(async (proc) => [await new Response(proc.stdout).text(), await proc.exited] as const));
      for (const [, code] of outputs) expect(code).toBe(0);
      expect(outputs.reduce((sum, [out]) => sum + Number(out.trim()), 0)).toBeGreaterThan(0);
      const names = (file: string) =>
        read(file)
          .split("\n")
          .filter(Boolean)
          .map((line) => line.split(":")[0] ?? "");
      const ids = (file: string) =>
        read(file)
          .split("\n")
          .filter(Boolean)
          .map((line) => line.split(":")[2] ?? "");
      for (const file of ["passwd", "shadow", "group", "gshadow"]) expect(new Set(names(file)).size).toBe(names(file).length);
      expect(new Set(ids("passwd")).size).toBe(ids("passwd").length);
      expect(new Set(ids("group")).size).toBe(ids("group").length);
      expect(names("shadow")).toEqual(names("passwd"));
      expect(names("gshadow")).toEqual(names("group"));
      const users = names("passwd").filter((name) => name.startsWith("eng-s"));
      expect(
        names("group")
          .filter((name) => name.startsWith("eng-s"))
          .sort(),
      ).toEqual([...users].sort());
      for (const line of read("passwd")
        .split("\n")
        .filter((l) => l.startsWith("eng-s"))) {
        const [name, , uid, gid] = line.split(":");
        expect(gid).toBe(uid);
        expect(read("group")).toContain(`${name}:x:${gid}:`);
      }
      // .pwd.lock stays, as lckpwdf(3) leaves it; shadow-utils' lock files and half-written files do not.
      expect(readdirSync(etc).filter((file) => file !== ".pwd.lock" && /\.lock$|\+$|\.\d+$/.test(file))).toEqual([]);
    },
    60_000,
  );
});
