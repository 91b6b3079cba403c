import type { Socket, TCPSocketListener } from "bun";

/**
 * FreezableProxy forwards TCP between loopback clients and `target`, and can be frozen: bytes
 * in either direction are then dropped without closing anything, as on a network partition
 * (a console that vanished without a FIN, an engine behind a dead NAT). Tests use it to prove
 * dead-peer detection; it is not a product feature.
 */
export class FreezableProxy {
  frozen = false;
  readonly #listener: TCPSocketListener<{ upstream?: Socket<unknown>; queued: Uint8Array[] }>;
  readonly #sockets = new Set<Socket<unknown>>();

  constructor(targetPort: number) {
    this.#listener = Bun.listen<{ upstream?: Socket<unknown>; queued: Uint8Array[] }>({
      hostname: "127.0.0.1",
      port: 0,
      socket: {
        open: (client) => {
          client.data = { queued: [] };
          this.#sockets.add(client as Socket<unknown>);
          void Bun.connect({
            hostname: "127.0.0.1",
            port: targetPort,
            socket: {
              data: (_upstream, bytes) => {
                if (!this.frozen) client.write(bytes);
              },
              close: () => {
                client.end();
              },
              error: () => {
                client.end();
              },
            },
          })
            .then((upstream) => {
              this.#sockets.add(upstream as Socket<unknown>);
              client.data.upstream = upstream as Socket<unknown>;
              for (const bytes of client.data.queued.splice(0)) upstream.write(bytes);
            })
            .catch(() => {
              client.end();
            });
        },
        data: (client, bytes) => {
          if (this.frozen) return;
          if (client.data.upstream) client.data.upstream.write(bytes);
          else client.data.queued.push(new Uint8Array(bytes));
        },
        close: (client) => {
          client.data.upstream?.end();
        },
        error: (client) => {
          client.data.upstream?.end();
        },
      },
    });
  }

  get port(): number {
    return this.#listener.port;
  }

  stop(): void {
    for (const socket of this.#sockets) socket.end();
    this.#listener.stop(true);
  }
}
