import type { Database, Statement } from "bun:sqlite";

/** DomainRow is one domain (and path prefix) a user attached to a service. */
export interface DomainRow {
  domain: string;
  path_prefix: string;
  service_id: string;
  created_at: string;
}

/** DomainStore keeps the domains users add to services; the default names are derived, never stored. */
export class DomainStore {
  private readonly insertStatement: Statement;
  private readonly byDomain: Statement;
  private readonly byService: Statement;
  private readonly all: Statement;
  private readonly deleteOne: Statement;
  private readonly deleteService: Statement;

  constructor(private readonly db: Database) {
    this.insertStatement = db.query(
      "INSERT INTO domains (domain, path_prefix, service_id, created_at) VALUES ($domain, $path_prefix, $service_id, $created_at)",
    );
    this.byDomain = db.query("SELECT * FROM domains WHERE domain = ? ORDER BY path_prefix");
    this.byService = db.query("SELECT * FROM domains WHERE service_id = ? ORDER BY domain, path_prefix");
    this.all = db.query("SELECT * FROM domains ORDER BY domain, path_prefix");
    this.deleteOne = db.query("DELETE FROM domains WHERE domain = ? AND service_id = ?");
    this.deleteService = db.query("DELETE FROM domains WHERE service_id = ?");
  }

  insert(row: DomainRow): void {
    this.insertStatement.run({
      $domain: row.domain,
      $path_prefix: row.path_prefix,
      $service_id: row.service_id,
      $created_at: row.created_at,
    });
  }

  forDomain(domain: string): DomainRow[] {
    return this.byDomain.all(domain) as DomainRow[];
  }

  forService(serviceId: string): DomainRow[] {
    return this.byService.all(serviceId) as DomainRow[];
  }

  list(): DomainRow[] {
    return this.all.all() as DomainRow[];
  }

  /** remove deletes a service's entries for a domain and says whether there were any. */
  remove(domain: string, serviceId: string): boolean {
    return this.deleteOne.run(domain, serviceId).changes > 0;
  }

  removeService(serviceId: string): number {
    return this.deleteService.run(serviceId).changes;
  }

  transaction<T>(work: () => T): T {
    return this.db.transaction(work)();
  }
}
