import type { Command } from "commander";
import { AccountStore } from "../../src/cloud/accounts";
import { AuditLog } from "../../src/cloud/audit";
import type { CloudConfig } from "../../src/cloud/config";
import type { Database } from "../../src/cloud/db";
import { createProvider, ManagedService } from "../../src/cloud/managed";
import { NodeStore } from "../../src/cloud/nodes";
import { AppError } from "../../src/lib/errors";
import { createLogger } from "../../src/lib/logger";

/** ManagedCli is what the operator commands need from cli/cloud.ts: the database, and how to print. */
export interface ManagedCli {
  withDatabase<T>(fn: (db: Database, config: CloudConfig) => Promise<T>): Promise<T>;
  print(value: unknown, human: string): void;
}

const iso = (ms: number | null) => (ms === null ? "-" : new Date(ms).toISOString());

function places(raw: string): number {
  if (!/^\d{1,6}$/.test(raw)) throw new AppError("invalid_request", `expected a whole number of places, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

/** service builds the hosted-machine coordinator over the operator's database (no provisioner runs here). */
function service(db: Database, config: CloudConfig): ManagedService {
  const log = createLogger({ level: "silent", dataDir: config.dataDir, stdout: false, fileName: "cloud.log" }).log;
  return new ManagedService({
    db,
    accounts: new AccountStore(db),
    nodes: new NodeStore(db),
    audit: new AuditLog(db),
    provider: createProvider(config.managed, config.dataDir, log),
    config: config.managed,
    clock: Date.now,
    publicUrl: () => config.publicUrl,
    log,
  });
}

/**
 * registerManaged adds the operators' hosted-machine commands: `seats`, `invoices`, `trials`,
 * `places` and `boxes`. Purchase and billing state is never stored as a state: these keep
 * the facts it is derived from (a seat held, an invoice open, paid or void, how many places).
 */
export function registerManaged(program: Command, cli: ManagedCli): void {
  const seats = program.command("seats").description("seats held: each is one paid hosted machine (operators)");
  seats.action(async () => {
    const list = await cli.withDatabase((db, config) => service(db, config).store.seats());
    cli.print(
      list,
      list.map((s) => `${s.email}  since ${iso(s.grantedAt)}${s.invoiceId ? `  invoice ${s.invoiceId}` : ""}`).join("\n") ||
        "no seats held",
    );
  });
  seats
    .command("grant <email>")
    .description("give an account a seat (a paid hosted machine)")
    .action(async (email: string) => {
      await cli.withDatabase((db, config) => service(db, config).grantSeat(email));
      cli.print({ email, seat: true }, `${email} holds a seat`);
    });
  seats
    .command("release <email>")
    .description("end an account's seat (its box is not touched: delete it to stop it)")
    .action(async (email: string) => {
      const released = await cli.withDatabase((db, config) => service(db, config).releaseSeat(email));
      cli.print({ email, released }, released ? `${email} no longer holds a seat` : `${email} held no seat`);
    });

  const invoices = program.command("invoices").description("invoices for hosted machines, kept by hand (operators)");
  invoices.option("--email <email>", "only this account's").action(async (options: { email?: string }) => {
    const list = await cli.withDatabase(async (db, config) => {
      const managed = service(db, config);
      const account = options.email ? await managed.ctx.accounts.byEmail(options.email) : null;
      if (options.email && !account) throw new AppError("account_not_found", `no account for ${options.email}`);
      return managed.store.invoices(account?.id);
    });
    cli.print(
      list,
      list
        .map((i) => `${i.id}  ${i.email}  ${i.state}  ${i.amount || "-"}  ${iso(i.createdAt)}${i.note ? `  ${i.note}` : ""}`)
        .join("\n") || "no invoices",
    );
  });
  invoices
    .command("open <email>")
    .description("invoice an account (takes a launch place until paid or void)")
    .option("--amount <amount>", "what the invoice asks, as written on it", "")
    .option("--note <note>", "a note for operators", "")
    .action(async (email: string, options: { amount: string; note: string }) => {
      const invoice = await cli.withDatabase((db, config) => service(db, config).openInvoice(email, options.amount, options.note));
      cli.print(invoice, `opened invoice ${invoice.id} for ${invoice.email}`);
    });
  for (const [name, state, said] of [
    ["paid", "paid", "paid: the account holds a seat"],
    ["void", "void", "void: its launch place is free again"],
  ] as const) {
    invoices
      .command(`${name} <invoice-id>`)
      .description(state === "paid" ? "mark an open invoice paid (grants its account a seat)" : "void an open invoice")
      .action(async (id: string) => {
        const invoice = await cli.withDatabase((db, config) => service(db, config).decideInvoice(id, state));
        cli.print(invoice, `invoice ${invoice.id} ${said}`);
      });
  }

  program
    .command("trials")
    .description("trial boxes running and the trial places (operators)")
    .option("--places <n>", "set how many trial boxes may run at once")
    .action(async (options: { places?: string }) => {
      const answer = await cli.withDatabase(async (db, config) => {
        const managed = service(db, config);
        if (options.places !== undefined) await managed.setPlaces("trial", places(options.places));
        const summary = await managed.placesSummary();
        const boxes = await managed.store.listCurrent("trial");
        return { ...summary.trial, boxes };
      });
      const lines = [`trial places ${answer.places}, running ${answer.running}, free ${answer.free}`];
      for (const box of answer.boxes) lines.push(`${box.id}  ${box.accountId}  ${box.status}  expires ${iso(box.expiresAt)}`);
      cli.print(answer, lines.join("\n"));
    });

  program
    .command("places")
    .description("launch places: purchases the console takes (seats held plus open invoices fill them) (operators)")
    .option("--launch <n>", "set how many launch places there are")
    .action(async (options: { launch?: string }) => {
      const summary = await cli.withDatabase(async (db, config) => {
        const managed = service(db, config);
        if (options.launch !== undefined) await managed.setPlaces("launch", places(options.launch));
        return managed.placesSummary();
      });
      const { launch, trial } = summary;
      cli.print(
        summary,
        `launch places ${launch.places}: ${launch.seats} seats held + ${launch.open_invoices} open invoices, ${launch.free} free\n` +
          `trial places ${trial.places}: ${trial.running} running, ${trial.free} free`,
      );
    });

  const boxes = program.command("boxes").description("hosted machines (operators)");
  boxes.action(async () => {
    const list = await cli.withDatabase((db, config) => service(db, config).store.listCurrent());
    cli.print(
      list,
      list
        .map((b) => `${b.id}  ${b.accountId}  ${b.kind}  ${b.status}  ${b.power}  ${b.boxVersion}${b.error ? `  ${b.error}` : ""}`)
        .join("\n") || "no hosted machines",
    );
  });
  boxes
    .command("restore <backup-id>")
    .description("give the backup's account a new box made from that backup (it must pay and have no box)")
    .action(async (backupId: string) => {
      const allocation = await cli.withDatabase((db, config) => service(db, config).restoreBackup(backupId));
      cli.print(
        { id: allocation.id, restore_from: backupId },
        `box ${allocation.id} will be made from ${backupId} by the provisioner (a console with --role provisioner or all)`,
      );
    });
}
