import { afterAll, expect, test } from "bun:test";
import { chownSync, existsSync, lchownSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { nssAsks, removeLeftovers, ServiceUsers } from "../../../src/engine/users/accounts";
import type { AccountFiles, AddResult, SystemAccount } from "../../../src/engine/users/passwd";
import { eventually, tempDir } from "../../helpers";

const DEBIAN =
  "# /etc/nsswitch.conf\npasswd:         files systemd\ngroup:          files systemd\nshadow:         files\nhosts: files dns\n";

test.each([
  ["Debian's default, no userdb", DEBIAN, "passwd", false, false],
  ["Debian's default with a dynamic user or homed", DEBIAN, "passwd", true, true],
  ["files alone", "passwd: files\ngroup: files\n", "group", true, false],
  ["no line: glibc's default", "hosts: files\n", "passwd", true, false],
  ["LDAP through sssd", "passwd: files sss\ngroup: files sss\n", "passwd", false, true],
  ["an action is not a source", "group: files [NOTFOUND=return] systemd\n", "group", false, false],
  ["compat may mean NIS", "passwd: compat\n", "passwd", false, true],
  ["a comment after the sources", "passwd: files # ldap\n", "passwd", false, false],
] as const)("nssAsks: %s", (_, conf, database, userdb, asks) => {
  expect(nssAsks(conf, database, userdb)).toBe(asks);
});

const scratch = tempDir();
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

// Owners other than the test's own need root to set.
(process.geteuid?.() === 0 ? test : test.skip)(
  "removeLeftovers removes what the removed ids own at the top of a scratch dir, a link without following it",
  () => {
    const [gone, other] = [64990, 64991];
    const dir = join(scratch, "tmp");
    mkdirSync(join(dir, "tree", "inner"), { recursive: true });
    writeFileSync(join(dir, "tree", "inner", "file"), "x");
    chownSync(join(dir, "tree"), gone, gone);
    writeFileSync(join(dir, "mine"), "x");
    chownSync(join(dir, "mine"), gone, gone);
    writeFileSync(join(dir, "theirs"), "x");
    chownSync(join(dir, "theirs"), other, other);
    // A link the removed user left, pointing at a file it does not own: the link goes, the file stays.
    const target = join(scratch, "target");
    writeFileSync(target, "keep");
    symlinkSync(target, join(dir, "link"));
    lchownSync(join(dir, "link"), gone, gone);
    removeLeftovers(new Set([gone]), [dir, join(scratch, "absent")]);
    expect(["tree", "mine", "link"].map((name) => existsSync(join(dir, name)))).toEqual([false, false, false]);
    expect(existsSync(join(dir, "theirs"))).toBe(true);
    expect(readFileSync(target, "utf8")).toBe("keep");
  },
);

test("idle waits for the write in flight and for the one due behind it", async () => {
  // Writes the test settles by hand: the second is asked for while the first is in flight.
  const writes: { names: string[]; settle: () => void }[] = [];
  const files = {
    add: (accounts: SystemAccount[]) =>
      new Promise<AddResult[]>((resolve) => {
        writes.push({ names: accounts.map((account) => account.name), settle: () => resolve(accounts.map(() => "added")) });
      }),
  } as unknown as AccountFiles;
  const users = new ServiceUsers({ min: 64900, max: 64999 }, files);
  const first = users.ensureServiceUser("idle-test-a", join(scratch, "a"), null);
  await eventually(() => writes.length === 1);
  const second = users.ensureServiceUser("idle-test-b", join(scratch, "b"), null);
  let idle = false;
  const waited = users.idle().then(() => {
    idle = true;
  });
  writes[0]?.settle();
  await first;
  // The second write starts on the next turn: idle has not resolved in between.
  await eventually(() => writes.length === 2);
  expect(idle).toBe(false);
  writes[1]?.settle();
  await Promise.all([second, waited]);
  expect(idle).toBe(true);
  expect(writes.map((write) => write.names)).toEqual([["eng-idle-test-a"], ["eng-idle-test-b"]]);
});

test("a new user's id is searched for from just past the last one handed out, round the range", async () => {
  // Files that take the accounts without writing /etc/passwd: each id is free again once its write settled.
  const added: SystemAccount[] = [];
  const files = {
    add: async (accounts: SystemAccount[]) => {
      added.push(...accounts);
      return accounts.map(() => "added" as AddResult);
    },
  } as unknown as AccountFiles;
  const users = new ServiceUsers({ min: 64950, max: 64952 }, files);
  const uids: number[] = [];
  for (const name of ["a", "b", "c", "d"]) uids.push((await users.ensureServiceUser(`cursor-test-${name}`, join(scratch, name), null)).uid);
  // From the range's start each time, every one would have had 64950.
  expect(uids).toEqual([64950, 64951, 64952, 64950]);
  expect(added.map((account) => account.uid)).toEqual(uids);
});
