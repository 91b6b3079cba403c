import { expect, test } from "bun:test";
import { nssAsks } from "../../../src/engine/users/accounts";

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
