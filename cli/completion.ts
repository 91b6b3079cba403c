import type { Command, Option } from "commander";

/**
 * completion.ts writes shell completion for `engine` from the commander program itself, so a
 * new command, subcommand or option completes without anyone editing a script: the program is
 * read into a table (CommandTable), and each shell gets that table as a few lookup functions
 * plus one small function that walks the words typed so far.
 *
 * The walk is the same in every shell: past the program name, a word that names a subcommand
 * (or its alias) of the command reached so far descends into it; an option that takes a value
 * swallows the next word; `--` ends options; every other word is a positional argument. The
 * word under the cursor then completes as a subcommand, an option, an option's value or the
 * next argument. Service names complete from the running engine (`engine __complete services`,
 * one request, given up after a second), with the typed --data-dir, --url and --token.
 */

export const SHELLS = ["bash", "zsh", "fish"] as const;
export type Shell = (typeof SHELLS)[number];

/** ValueKind is what a word completes to: a directory, a file, a service's name, one of some choices, or nothing known. */
export type ValueKind = { kind: "dir" | "file" | "service" | "word" } | { kind: "choices"; values: string[] };

interface OptionEntry {
  flags: string[];
  description: string;
  /** value is null for a flag that takes no value. */
  value: ValueKind | null;
}

interface CommandEntry {
  /** path is the canonical command path, "" for the program itself: "services deploy". */
  path: string;
  subcommands: { name: string; aliases: string[]; description: string }[];
  options: OptionEntry[];
  args: { value: ValueKind; variadic: boolean }[];
}

export interface CommandTable {
  program: string;
  commands: CommandEntry[];
  /** globals are the program's own options, which commander accepts after any subcommand too. */
  globals: OptionEntry[];
}

/** SERVICE_WORDS name the values (option placeholders, argument names) that are services. */
const SERVICE_WORDS = new Set(["service", "services", "database"]);
/** FILE_WORDS name the values that are paths on this machine (a dump to restore is a file). */
const FILE_WORDS = new Set(["file", "path", "dump"]);

function valueOfOption(option: Option): ValueKind | null {
  if (!option.required && !option.optional) return null;
  if (option.argChoices) return { kind: "choices", values: [...option.argChoices] };
  const placeholder = (/[<[]([^>\]]+)[>\]]/.exec(option.flags)?.[1] ?? "").replace(/\.\.\.$/, "").toLowerCase();
  if (placeholder === "dir") return { kind: "dir" };
  if (FILE_WORDS.has(placeholder)) return { kind: "file" };
  if (SERVICE_WORDS.has(placeholder)) return { kind: "service" };
  return { kind: "word" };
}

function optionEntry(option: Option): OptionEntry {
  return {
    flags: [option.short, option.long].filter((flag): flag is string => typeof flag === "string"),
    description: option.description,
    value: valueOfOption(option),
  };
}

/**
 * readCommands reads the program into a table: every visible command (the implicit `help`
 * included), its options (help and version included) and its arguments. An argument is a
 * service when it is called service or database, or `name` under `services`; a command's
 * trailing variadic argument (a command line to run) completes files.
 */
export function readCommands(program: Command): CommandTable {
  const commands: CommandEntry[] = [];
  const visit = (command: Command, path: string[]) => {
    const help = command.createHelp();
    const subcommands = help.visibleCommands(command);
    commands.push({
      path: path.join(" "),
      subcommands: subcommands.map((sub) => ({ name: sub.name(), aliases: sub.aliases(), description: sub.description() })),
      options: help.visibleOptions(command).map(optionEntry),
      args: command.registeredArguments.map((argument) => {
        const name = argument.name().toLowerCase();
        const value: ValueKind = argument.argChoices
          ? { kind: "choices", values: [...argument.argChoices] }
          : SERVICE_WORDS.has(name) || (name === "name" && path[0] === "services")
            ? { kind: "service" }
            : argument.variadic || FILE_WORDS.has(name)
              ? { kind: "file" }
              : { kind: "word" };
        return { value, variadic: argument.variadic };
      }),
    });
    for (const sub of subcommands) {
      // The implicit help command is listed, but it is not a Command with commands of its own to visit.
      if (command.commands.includes(sub)) visit(sub, [...path, sub.name()]);
    }
  };
  visit(program, []);
  return { program: program.name(), commands, globals: help0(program) };
}

function help0(program: Command): OptionEntry[] {
  return program.options.filter((option) => !option.hidden).map(optionEntry);
}

/** kindWord writes a ValueKind as the one word the shell functions pass around: dir, service, choices:a b c. */
function kindWord(value: ValueKind): string {
  return value.kind === "choices" ? `choices:${value.values.join(" ")}` : value.kind;
}

/** singleQuoted quotes text for a POSIX shell (bash and zsh). */
function singleQuoted(text: string): string {
  return `'${text.replaceAll("'", `'\\''`)}'`;
}

/** fishQuoted quotes text for fish, whose single quotes escape only \ and '. */
function fishQuoted(text: string): string {
  return `'${text.replaceAll("\\", "\\\\").replaceAll("'", "\\'")}'`;
}

/** oneLine keeps a description on one line, short enough for a completion menu. */
function oneLine(text: string): string {
  const flat = text.replace(/\s+/g, " ").trim();
  return flat.length > 80 ? `${flat.slice(0, 79)}…` : flat;
}

/** valueOptions lists, per command path, the flags that take a value and what the value is. */
function valueOptions(table: CommandTable): { path: string; flag: string; kind: string }[] {
  const rows: { path: string; flag: string; kind: string }[] = [];
  for (const command of table.commands) {
    for (const option of command.options) {
      if (option.value) for (const flag of option.flags) rows.push({ path: command.path, flag, kind: kindWord(option.value) });
    }
  }
  return rows;
}

/** optionsAt is what `-<Tab>` offers at a path: the command's own options and the program's. */
function optionsAt(table: CommandTable, command: CommandEntry): OptionEntry[] {
  const own = command.options;
  const seen = new Set(own.flatMap((option) => option.flags));
  return [...own, ...table.globals.filter((option) => !option.flags.some((flag) => seen.has(flag)))];
}

/**
 * lookupFunctions writes the table as four POSIX-ish functions, shared by bash and zsh:
 *   <p>_sub PATH WORD      prints the canonical name and succeeds when WORD is a subcommand of PATH
 *   <p>_value PATH FLAG    prints the kind of FLAG's value (nothing: FLAG takes none)
 *   <p>_arg PATH INDEX     prints the kind of the INDEXth positional argument
 *   <p>_conn FLAG          succeeds when FLAG says where the engine is (passed to __complete)
 */
function lookupFunctions(table: CommandTable, prefix: string): string {
  const subCases = table.commands.flatMap((command) =>
    command.subcommands.flatMap((sub) =>
      [sub.name, ...sub.aliases].map((word) => `    ${singleQuoted(`${command.path}|${word}`)}) echo ${singleQuoted(sub.name)} ;;`),
    ),
  );
  const globalsTakingValues = table.globals.filter((option) => option.value);
  const valueCases = [
    ...valueOptions(table).map(({ path, flag, kind }) => `    ${singleQuoted(`${path}|${flag}`)}) echo ${singleQuoted(kind)} ;;`),
    ...globalsTakingValues.flatMap((option) =>
      option.flags.map((flag) => `    *${singleQuoted(`|${flag}`)}) echo ${singleQuoted(kindWord(option.value as ValueKind))} ;;`),
    ),
  ];
  const argCases = table.commands.flatMap((command) =>
    command.args.flatMap((arg, index) =>
      arg.variadic
        ? [`    ${singleQuoted(`${command.path}|`)}*) echo ${singleQuoted(kindWord(arg.value))} ;;`]
        : [`    ${singleQuoted(`${command.path}|${index}`)}) echo ${singleQuoted(kindWord(arg.value))} ;;`],
    ),
  );
  const connFlags = globalsTakingValues.flatMap((option) => option.flags).filter((flag) => /^--(data-dir|url|token)$/.test(flag));
  return [
    `${prefix}_sub() {`,
    `  case "$1|$2" in`,
    ...subCases,
    "    *) return 1 ;;",
    "  esac",
    "}",
    `${prefix}_value() {`,
    `  case "$1|$2" in`,
    ...valueCases,
    "  esac",
    "}",
    `${prefix}_arg() {`,
    `  case "$1|$2" in`,
    ...argCases,
    "  esac",
    "}",
    `${prefix}_conn() {`,
    `  case "$1" in`,
    `    ${connFlags.map(singleQuoted).join("|") || "''"}) return 0 ;;`,
    "    *) return 1 ;;",
    "  esac",
    "}",
  ].join("\n");
}

/**
 * WALK is the word walk, in the syntax bash and zsh share. It reads `words` (the words before
 * the cursor, the program's name first) and sets path, npos, want (the kind of value the word
 * under the cursor is, when it follows an option taking one), dashdash and conn (the typed
 * options that say where the engine is).
 */
function walk(prefix: string): string {
  return `  local at="" npos=0 want="" dashdash=0 w canon kind flag=""
  local -a conn
  conn=()
  for w in "\${words[@]:1}"; do
    # bash splits --flag=value at the '=': the '=' is no word of its own.
    [[ $w == "=" ]] && continue
    if [[ -n $want ]]; then
      [[ -n $flag ]] && conn+=("$flag" "$w")
      want="" flag=""
      continue
    fi
    if ((dashdash)); then
      npos=$((npos + 1))
      continue
    fi
    if [[ $w == "--" ]]; then
      dashdash=1
      continue
    fi
    if [[ $w == -* ]]; then
      if [[ $w == *=* ]]; then
        ${prefix}_conn "\${w%%=*}" && conn+=("$w")
        continue
      fi
      want=$(${prefix}_value "$at" "$w")
      flag=""
      ${prefix}_conn "$w" && flag=$w
      continue
    fi
    if ((npos == 0)) && canon=$(${prefix}_sub "$at" "$w"); then
      at="\${at:+$at }$canon"
      continue
    fi
    npos=$((npos + 1))
  done`;
}

function subcommandList(table: CommandTable, withDescriptions: "zsh" | "fish" | null): Map<string, string[]> {
  const lists = new Map<string, string[]>();
  for (const command of table.commands) {
    lists.set(
      command.path,
      command.subcommands.map((sub) =>
        withDescriptions === "zsh"
          ? `${sub.name}:${oneLine(sub.description)}`
          : withDescriptions === "fish"
            ? `${sub.name}\t${oneLine(sub.description)}`
            : sub.name,
      ),
    );
  }
  return lists;
}

function optionList(table: CommandTable, withDescriptions: "zsh" | "fish" | null): Map<string, string[]> {
  const lists = new Map<string, string[]>();
  for (const command of table.commands) {
    lists.set(
      command.path,
      optionsAt(table, command).flatMap((option) =>
        option.flags.map((flag) =>
          withDescriptions === "zsh"
            ? `${flag}:${oneLine(option.description)}`
            : withDescriptions === "fish"
              ? `${flag}\t${oneLine(option.description)}`
              : flag,
        ),
      ),
    );
  }
  return lists;
}

function bashScript(table: CommandTable): string {
  const p = `_${table.program.replaceAll("-", "_")}`;
  const subs = subcommandList(table, null);
  const opts = optionList(table, null);
  const listFunction = (name: string, lists: Map<string, string[]>) =>
    [
      `${p}_${name}() {`,
      `  case "$1" in`,
      ...[...lists].map(([path, words]) => `    ${singleQuoted(path)}) echo ${singleQuoted(words.join(" "))} ;;`),
      "  esac",
      "}",
    ].join("\n");
  return `# bash completion for ${table.program}, generated by \`${table.program} completion bash\`.
# Load it in this shell with: source <(${table.program} completion bash)
# or for every shell: ${table.program} completion bash > ~/.local/share/bash-completion/completions/${table.program}
${lookupFunctions(table, p)}
${listFunction("subs", subs)}
${listFunction("opts", opts)}
${p}() {
  local cur="\${COMP_WORDS[COMP_CWORD]}"
  local -a words
  words=("\${COMP_WORDS[@]:0:COMP_CWORD}")
  # bash splits --flag=value at the '=': right after it, the value is still empty.
  if [[ $cur == "=" ]]; then cur=""; fi
${walk(p)}
  COMPREPLY=()
  if [[ -n $want ]]; then
    kind=$want
  elif ((dashdash)); then
    kind=file
  elif [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$(${p}_opts "$at")" -- "$cur")
    return 0
  elif ((npos == 0)) && [[ -n $(${p}_subs "$at") ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$(${p}_subs "$at")" -- "$cur")
    return 0
  else
    kind=$(${p}_arg "$at" "$npos")
  fi
  case "$kind" in
    dir) compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -d -- "$cur") ;;
    file) compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -f -- "$cur") ;;
    service) mapfile -t COMPREPLY < <(compgen -W "$("\${COMP_WORDS[0]}" "\${conn[@]}" __complete services 2>/dev/null)" -- "$cur") ;;
    choices:*) mapfile -t COMPREPLY < <(compgen -W "\${kind#choices:}" -- "$cur") ;;
  esac
  return 0
}
complete -F ${p} ${table.program}
`;
}

function zshScript(table: CommandTable): string {
  const p = `_${table.program.replaceAll("-", "_")}`;
  const subs = subcommandList(table, "zsh");
  const opts = optionList(table, "zsh");
  const arrayFunction = (name: string, lists: Map<string, string[]>) =>
    [
      `${p}_${name}() {`,
      `  case "$1" in`,
      ...[...lists].map(([path, words]) => `    ${singleQuoted(path)}) reply=(${words.map(singleQuoted).join(" ")}) ;;`),
      "    *) reply=() ;;",
      "  esac",
      "}",
    ].join("\n");
  return `#compdef ${table.program}
# zsh completion for ${table.program}, generated by \`${table.program} completion zsh\`.
# Load it in this shell with: source <(${table.program} completion zsh)
# or for every shell: ${table.program} completion zsh > "\${fpath[1]}/_${table.program}"
${lookupFunctions(table, p)}
${arrayFunction("subs", subs)}
${arrayFunction("opts", opts)}
${p}() {
  local cur="\${words[CURRENT]}"
  local -a reply
  words=("\${(@)words[1,CURRENT-1]}")
  setopt localoptions ksharrays
${walk(p)}
  setopt localoptions noksharrays
  if [[ -n $want ]]; then
    kind=$want
  elif ((dashdash)); then
    kind=file
  elif [[ $cur == -* ]]; then
    ${p}_opts "$at"
    _describe -t options 'option' reply
    return
  else
    ${p}_subs "$at"
    if ((npos == 0)) && ((\${#reply} > 0)); then
      _describe -t commands '${table.program} command' reply
      return
    fi
    kind=$(${p}_arg "$at" "$npos")
  fi
  case "$kind" in
    dir) _files -/ ;;
    file) _files ;;
    service) compadd -- \${(f)"$("\${words[1]}" "\${conn[@]}" __complete services 2>/dev/null)"} ;;
    choices:*) compadd -- \${=kind#choices:} ;;
    *) _message 'value' ;;
  esac
}
if [[ "\${funcstack[1]}" == "${p}" ]]; then
  ${p} "$@"
else
  compdef ${p} ${table.program}
fi
`;
}

function fishScript(table: CommandTable): string {
  const p = `__${table.program.replaceAll("-", "_")}`;
  const subs = subcommandList(table, "fish");
  const opts = optionList(table, "fish");
  const listFunction = (name: string, lists: Map<string, string[]>) =>
    [
      `function ${p}_${name}`,
      "    switch $argv[1]",
      ...[...lists].flatMap(([path, words]) => [
        `        case ${fishQuoted(path)}`,
        ...words.map((word) => `            echo ${fishQuoted(word)}`),
      ]),
      "    end",
      "end",
    ].join("\n");
  const subCases = table.commands.flatMap((command) =>
    command.subcommands.flatMap((sub) =>
      [sub.name, ...sub.aliases].map(
        (word) => `        case ${fishQuoted(`${command.path}|${word}`)}\n            echo ${fishQuoted(sub.name)}`,
      ),
    ),
  );
  const globalsTakingValues = table.globals.filter((option) => option.value);
  const valueCases = [
    ...valueOptions(table).map(
      ({ path, flag, kind }) => `        case ${fishQuoted(`${path}|${flag}`)}\n            echo ${fishQuoted(kind)}`,
    ),
    ...globalsTakingValues.flatMap((option) =>
      option.flags.map(
        (flag) => `        case ${fishQuoted(`*|${flag}`)}\n            echo ${fishQuoted(kindWord(option.value as ValueKind))}`,
      ),
    ),
  ];
  const argCases = table.commands.flatMap((command) =>
    command.args.map((arg, index) =>
      arg.variadic
        ? `        case ${fishQuoted(`${command.path}|*`)}\n            echo ${fishQuoted(kindWord(arg.value))}`
        : `        case ${fishQuoted(`${command.path}|${index}`)}\n            echo ${fishQuoted(kindWord(arg.value))}`,
    ),
  );
  const connFlags = globalsTakingValues.flatMap((option) => option.flags).filter((flag) => /^--(data-dir|url|token)$/.test(flag));
  return `# fish completion for ${table.program}, generated by \`${table.program} completion fish\`.
# Load it in this shell with: ${table.program} completion fish | source
# or for every shell: ${table.program} completion fish > ~/.config/fish/completions/${table.program}.fish
function ${p}_sub
    switch "$argv[1]|$argv[2]"
${subCases.join("\n")}
        case '*'
            return 1
    end
end
function ${p}_value
    switch "$argv[1]|$argv[2]"
${valueCases.join("\n")}
    end
end
function ${p}_arg
    switch "$argv[1]|$argv[2]"
${argCases.join("\n")}
    end
end
${listFunction("subs", subs)}
${listFunction("opts", opts)}
function ${p}_complete
    set -l words (commandline -opc)
    set -l cur (commandline -ct)
    set -l at ''
    set -l npos 0
    set -l want ''
    set -l flag ''
    set -l dashdash 0
    set -l conn
    for w in $words[2..-1]
        test "$w" = '='; and continue
        if test -n "$want"
            test -n "$flag"; and set -a conn $flag $w
            set want ''
            set flag ''
            continue
        end
        if test $dashdash -eq 1
            set npos (math $npos + 1)
            continue
        end
        if test "$w" = '--'
            set dashdash 1
            continue
        end
        if string match -q -- '-*' $w
            if string match -q -- '*=*' $w
                contains -- (string split -m1 = -- $w)[1] ${connFlags.map(fishQuoted).join(" ")}; and set -a conn $w
                continue
            end
            set want (${p}_value "$at" $w)
            contains -- $w ${connFlags.map(fishQuoted).join(" ")}; and set flag $w
            continue
        end
        if test $npos -eq 0; and ${p}_sub "$at" $w >/dev/null
            set at (string trim -- "$at "(${p}_sub "$at" $w))
            continue
        end
        set npos (math $npos + 1)
    end
    set -l kind
    if test -n "$want"
        set kind $want
    else if test $dashdash -eq 1
        set kind file
    else if string match -q -- '-*' $cur
        ${p}_opts "$at"
        return
    else
        set -l subs (${p}_subs "$at")
        if test $npos -eq 0; and test (count $subs) -gt 0
            printf '%s\\n' $subs
            return
        end
        set kind (${p}_arg "$at" $npos)
    end
    switch "$kind"
        case dir
            __fish_complete_directories $cur
        case file
            __fish_complete_path $cur
        case service
            command -q -- $words[1]; and $words[1] $conn __complete services 2>/dev/null
        case 'choices:*'
            string split ' ' -- (string replace 'choices:' '' -- $kind)
    end
end
complete -c ${table.program} -f -a '(${p}_complete)'
`;
}

/** completionScript is the completion script of the program for one shell. */
export function completionScript(program: Command, shell: Shell): string {
  const table = readCommands(program);
  if (shell === "bash") return bashScript(table);
  if (shell === "zsh") return zshScript(table);
  return fishScript(table);
}
