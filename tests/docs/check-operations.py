#!/usr/bin/env python3
"""Holds docs/operations.md to the code: every log event the product writes and every metric it
registers is in the page's tables, and the tables name nothing the code does not.

    check-operations.py SOURCE_DIR
"""
import re
import sys
from pathlib import Path

PRODUCT = ["app", "base", "config", "daemon", "install", "modes", "pki", "proto", "transport"]
# Log calls: Info/Warn/Error/Debug("event", ...), Log(level, "event", ...), and the session
# engine's failed("event", ...).
EVENT = re.compile(r'\b(?:Info|Warn|Error|Debug)\(\s*"([^"]+)"'
                   r'|\bLog\(\s*LogLevel::k\w+,\s*"([^"]+)"|\bfailed\(\s*"([^"]+)"')
# Families: Counter("name", ...), Gauge("name", ...), Collect("name", ...).
METRIC = re.compile(r'\b(?:Counter|Gauge|Collect)\(\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"')


def from_code(root, pattern):
    found = {}
    for folder in PRODUCT:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".cc", ".h"):
                continue
            for match in pattern.finditer(path.read_text()):
                name = next(group for group in match.groups() if group)
                found.setdefault(name, str(path.relative_to(root)))
    return found


def table_names(text, heading):
    """The first column (`name`) of every table row under `## heading`."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", section, re.M)}


def main():
    root = Path(sys.argv[1])
    text = (root / "docs/operations.md").read_text()
    problems = []
    for what, pattern, heading in (("log event", EVENT, "The log"), ("metric", METRIC, "Metrics")):
        code = from_code(root, pattern)
        documented = table_names(text, heading)
        if not code:
            problems.append(f"no {what} found in the code: the pattern is out of date")
        for name in sorted(set(code) - documented):
            problems.append(f"{what} {name} ({code[name]}) is not in docs/operations.md")
        for name in sorted(documented - set(code)):
            problems.append(f"docs/operations.md lists {what} {name}, which the code does not have")
        print(f"{len(code)} {what}s, each documented")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
