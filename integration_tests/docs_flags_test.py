#!/usr/bin/python3
"""The flag tables of the documentation against the programs' --help.

  /usr/bin/python3 docs_flags_test.py --server build/cache_server/cache_server \\
      --replicator build/shard_replicator/shard_replicator

A flag table is a Markdown table of docs/operations.md or docs/security.md whose header's first
cell is "cache_server flag" or "shard_replicator flag"; each row names one or more flags in its
first cell (`--data-dir`, `--tls-cert-file`, `--tls-key-file`) and their default in the second.
Runs each program with --help and checks:

- every flag that a table names exists in the help of the program the table is for;
- every flag of a program's help (abseil's own flags aside) has a row in one of its tables;
- a row that names one flag and gives its default as one `value` (a remark in parentheses may
  follow) gives the default that the help prints.

The documents spell flags with dashes (--data-dir), the help with underscores (--data_dir); the
programs take both. Prints "N passed, M failed" last and exits non-zero on any failure.
"""

import argparse
import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # No __pycache__ in the source tree.
import reflection_test  # noqa: E402  pylint: disable=wrong-import-position

SOURCE_DIR = os.path.dirname(HERE)
# The documents that hold the flag tables, relative to --source-dir.
DOCS = [os.path.join("docs", "operations.md"), os.path.join("docs", "security.md")]
PROGRAMS = ("cache_server", "shard_replicator")
# abseil's own flags (--helpfull lists them); a program's --help does not, but they are left out
# whatever it prints.
ABSEIL_FLAGS = {
    "help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch", "version",
    "only_check_args", "flagfile", "fromenv", "tryfromenv", "undefok",
}
HELP_TIMEOUT = 30.0

ARGS = None

# "    --data_dir (the directory where ...); default: "shardcache-data";" over one or more lines:
# a flag's entry starts at a line indented by four spaces; its continuation lines by six.
_HELP_ENTRY = re.compile(r"^    --([a-z0-9_]+) \((.*?)\);\s+default: (.*?);$", re.M | re.S)
_TABLE_HEADER = re.compile(r"^\|\s*(%s) flag\s*\|" % "|".join(PROGRAMS))
_FLAG = re.compile(r"`--([a-z0-9][a-z0-9_-]*)`")
# A default given as one `value`, with perhaps a remark in parentheses after it.
_ONE_DEFAULT = re.compile(r"^`([^`]*)`(?:\s+\([^)]*\))?$")


def canonical(flag):
    """A flag's name as the help prints it (underscores)."""
    return flag.replace("-", "_")


def program_help(program):
    """{flag: default as the help prints it, quotes removed} of a program's --help."""
    path = ARGS.server if program == "cache_server" else ARGS.replicator
    run = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=HELP_TIMEOUT)
    text = run.stdout + run.stderr
    flags = {}
    for match in _HELP_ENTRY.finditer(text):
        name, default = match.group(1), match.group(3).strip()
        if name in ABSEIL_FLAGS:
            continue
        if len(default) >= 2 and default[0] == default[-1] == '"':
            default = default[1:-1]
        flags[name] = default
    if not flags:
        raise AssertionError("%s --help lists no flag:\n%s" % (program, text))
    return flags


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def flag_tables(path):
    """[(program, line number, [flag, ...], default cell)] of the flag tables of a document."""
    with open(os.path.join(ARGS.source_dir, path)) as f:
        lines = f.read().split("\n")
    rows = []
    program = None
    in_block = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_block = not in_block
            program = None
            continue
        if in_block or not line.startswith("|"):
            program = None
            continue
        header = _TABLE_HEADER.match(line)
        if header:
            program = header.group(1)
            continue
        if program is None or re.match(r"^\|[\s|:-]+\|$", line):
            continue  # Another table, or the line under a header.
        cells = _cells(line)
        flags = _FLAG.findall(cells[0])
        if not flags:
            raise AssertionError("%s:%d: a row of a %s flag table names no flag: %s" % (
                path, number, program, line))
        rows.append((program, number, [canonical(f) for f in flags],
                     cells[1] if len(cells) > 1 else ""))
    return rows


class DocsFlagsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.help = {p: program_help(p) for p in PROGRAMS}
        cls.rows = [(path,) + row for path in DOCS for row in flag_tables(path)]

    def test_EveryProgramHasAFlagTable(self):
        for program in PROGRAMS:
            self.assertIn(program, {row[1] for row in self.rows},
                          "no table of %s's flags in %s" % (program, ", ".join(DOCS)))

    def test_EveryDocumentedFlag_IsInTheHelp(self):
        for path, program, number, flags, _ in self.rows:
            for flag in flags:
                with self.subTest(flag=flag, where="%s:%d" % (path, number)):
                    self.assertTrue(flag in self.help[program],
                                    "%s:%d names --%s, which `%s --help` does not list" % (
                                        path, number, flag.replace("_", "-"), program))

    def test_EveryFlagOfTheHelp_IsDocumented(self):
        for program in PROGRAMS:
            documented = {f for _, p, _, flags, _ in self.rows if p == program for f in flags}
            missing = sorted(set(self.help[program]) - documented)
            self.assertEqual(missing, [], "flags of `%s --help` without a row in the %s flag "
                             "tables of %s" % (program, program, ", ".join(DOCS)))

    def test_DocumentedDefaults_AreTheHelpsDefaults(self):
        checked = 0
        for path, program, number, flags, default in self.rows:
            one = _ONE_DEFAULT.match(default)
            if len(flags) != 1 or one is None or flags[0] not in self.help[program]:
                continue
            checked += 1
            with self.subTest(flag=flags[0], where="%s:%d" % (path, number)):
                self.assertEqual(one.group(1), self.help[program][flags[0]],
                                 "%s:%d: the default of --%s is not the one `%s --help` "
                                 "prints" % (path, number, flags[0].replace("_", "-"), program))
        self.assertGreaterEqual(checked, 20, "too few defaults checked")


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="the cache_server binary")
    parser.add_argument("--replicator", required=True, help="the shard_replicator binary")
    parser.add_argument("--source-dir", default=SOURCE_DIR,
                        help="the source tree whose docs/ hold the flag tables")
    ARGS = parser.parse_args()
    ARGS.server = os.path.abspath(ARGS.server)
    ARGS.replicator = os.path.abspath(ARGS.replicator)
    ARGS.source_dir = os.path.abspath(ARGS.source_dir)
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=reflection_test.CountingResult)
    result = runner.run(unittest.defaultTestLoader.loadTestsFromTestCase(DocsFlagsTest))
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    print("%d passed, %d failed" % (result.passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
