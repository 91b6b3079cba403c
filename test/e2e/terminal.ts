import { eventually } from "../helpers";

/**
 * Terminal drives programs through a real terminal: a tmux server of its own (its own socket,
 * so it never touches a user's tmux), one window per program, keys typed as a user types them
 * and the screen read back with `capture-pane`. What a user sees (colours aside) is what the
 * test reads: prompts, line wrapping, a TTY's isatty() answers, Ctrl-C.
 */
export class Terminal {
  readonly #socket: string;
  readonly #env: Record<string, string>;
  #windows = 0;

  constructor(name: string, env: Record<string, string>) {
    this.#socket = `engine-${name}-${process.pid}`;
    this.#env = env;
  }

  static available(): boolean {
    return Bun.spawnSync(["tmux", "-V"], { stdout: "ignore", stderr: "ignore" }).exitCode === 0;
  }

  #tmux(args: string[]): string {
    const run = Bun.spawnSync(["tmux", "-L", this.#socket, ...args], { stdout: "pipe", stderr: "pipe" });
    if (run.exitCode !== 0) throw new Error(`tmux ${args[0]}: ${run.stderr.toString().trim()}`);
    return run.stdout.toString();
  }

  /**
   * open starts a shell in a new window (the first call starts the server), with the given
   * working directory and the terminal's environment, and returns the window's name.
   */
  open(cwd: string): string {
    const name = `w${this.#windows++}`;
    // `env -i` rather than tmux's -e: tmux sets PATH from its own environment over -e's.
    const env = Object.entries(this.#env).map(([key, value]) => `${key}=${value}`);
    const shell = ["env", "-i", ...env, "bash", "--noprofile", "--norc"];
    if (this.#windows === 1) this.#tmux(["new-session", "-d", "-x", "200", "-y", "50", "-s", "walk", "-n", name, "-c", cwd, ...shell]);
    else this.#tmux(["new-window", "-d", "-t", "walk", "-n", name, "-c", cwd, ...shell]);
    // A plain prompt, no history: the screen holds only what the commands print.
    this.type(name, "PS1='$ '; unset HISTFILE; clear");
    return name;
  }

  /** type types a line into a window and presses Enter. */
  type(window: string, line: string): void {
    this.#tmux(["send-keys", "-t", `walk:${window}`, "-l", line]);
    this.#tmux(["send-keys", "-t", `walk:${window}`, "Enter"]);
  }

  /** key presses one named key (e.g. C-c) in a window. */
  key(window: string, key: string): void {
    this.#tmux(["send-keys", "-t", `walk:${window}`, key]);
  }

  /** screen is the window's whole scrollback and screen, lines joined as printed (-J). */
  screen(window: string): string {
    return this.#tmux(["capture-pane", "-p", "-J", "-S", "-", "-t", `walk:${window}`]);
  }

  /**
   * run types a command, waits for the shell to print the exit status marker after it and
   * returns what the command printed and its status: the marker makes the end unambiguous even
   * when the command's own output looks like a prompt.
   */
  async run(window: string, command: string, timeoutMs = 30_000): Promise<{ code: number; out: string }> {
    const marker = `__done_${Math.random().toString(36).slice(2, 10)}`;
    const before = this.screen(window).length;
    this.type(window, `${command}; echo "${marker}=$?"`);
    const found = await eventually(
      () => {
        const text = this.screen(window);
        const at = text.lastIndexOf(`${marker}=`);
        // The typed line itself contains `${marker}=$?`: only a digit after '=' is the result.
        const match = at >= 0 ? /^(\d+)/.exec(text.slice(at + marker.length + 1)) : null;
        return match ? { text, at, code: Number(match[1]) } : null;
      },
      { timeoutMs, intervalMs: 100 },
    ).catch((error: Error) => {
      throw new Error(`${error.message}; the terminal shows:\n${this.screen(window).slice(-3000)}`);
    });
    const typedAt = found.text.indexOf(`${command}; echo "${marker}=$?"`, Math.max(0, before - 400));
    const start = typedAt >= 0 ? found.text.indexOf("\n", typedAt) + 1 : 0;
    return { code: found.code, out: found.text.slice(start, found.at).trimEnd() };
  }

  /** waitFor polls a window until its screen matches, and returns the screen. */
  waitFor(window: string, pattern: RegExp, timeoutMs = 30_000): Promise<string> {
    return eventually(() => (pattern.test(this.screen(window)) ? this.screen(window) : ""), { timeoutMs, intervalMs: 100 }).catch(
      (error: Error) => {
        throw new Error(`${error.message} (${pattern}); the terminal shows:\n${this.screen(window).slice(-3000)}`);
      },
    );
  }

  /**
   * visible is what the window shows now, without the scrollback: on the alternate screen
   * (a full-screen program) that is the program's frame.
   */
  visible(window: string): string {
    return this.#tmux(["capture-pane", "-p", "-t", `walk:${window}`]);
  }

  /**
   * state answers what the terminal knows of itself: whether the alternate screen is on and
   * the cursor shown (tmux's alternate_on and cursor_flag), and its size.
   */
  state(window: string): { alternateScreen: boolean; cursorVisible: boolean; width: number; height: number } {
    const [alternate, cursor, width, height] = this.#tmux([
      "display-message",
      "-p",
      "-t",
      `walk:${window}`,
      "#{alternate_on} #{cursor_flag} #{pane_width} #{pane_height}",
    ])
      .trim()
      .split(" ");
    return { alternateScreen: alternate === "1", cursorVisible: cursor === "1", width: Number(width), height: Number(height) };
  }

  /** resize makes a window the given size, as a user dragging the terminal's corner does (the program gets SIGWINCH). */
  resize(window: string, width: number, height: number): void {
    this.#tmux(["resize-window", "-t", `walk:${window}`, "-x", String(width), "-y", String(height)]);
  }

  /** close ends the tmux server and every program still running in its windows. */
  close(): void {
    Bun.spawnSync(["tmux", "-L", this.#socket, "kill-server"], { stdout: "ignore", stderr: "ignore" });
  }
}
