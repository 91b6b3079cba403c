import type { PrestartHook } from "./types";

/**
 * databaseHook prepares a managed database: a Redis or SQLite server runs as the run's user
 * (what its adapter writes is that user's), the first start initializes the data dir (initdb
 * and the like, its output in the service's log), and the command is the adapter's start
 * command. A stop or delete meanwhile aborts the initialization and fails the launch.
 */
export const databaseHook: PrestartHook = {
  name: "database",
  async run(launch, host) {
    const { database, user } = launch;
    if (!database) return;
    if (!database.adapter.serverUser) database.instance.owner = user ? { user: user.name, uid: user.uid, gid: user.gid } : null;
    launch.status(`preparing the ${database.adapter.label} data dir`);
    const serviceId = launch.service.id;
    await database.adapter.initialize(database.instance, { log: (line) => host.appendLog(serviceId, line), signal: launch.signal });
    if (launch.signal.aborted) throw new Error("the service was stopped while its database was being initialized");
    launch.argv = database.adapter.startCommand(database.instance);
  },
};
