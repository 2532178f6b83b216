#!/usr/bin/env python3
"""Every mutant's line is in its file exactly once, so no mutant (quick or not) silently stops
being tried when the code it mutates moves or changes.

    check-texts.py SOURCE_DIR
"""
import sys
from pathlib import Path

root = Path(sys.argv[1])
problems = []
count = 0
for line in (root / "tests/mutation/mutants.tsv").read_text().splitlines():
    if not line.strip() or line.startswith("#"):
        continue
    fields = line.split("\t")
    if len(fields) != 6:
        problems.append(f"{fields[0]}: {len(fields)} fields, not 6")
        continue
    mutant, _, path, text = fields[:4]
    found = (root / path).read_text().count(text) if (root / path).exists() else -1
    if found != 1:
        where = "no such file" if found < 0 else f"{found} times"
        problems.append(f"{mutant}: its line is in {path} {where}, not once")
    count += 1
for problem in problems:
    print(problem, file=sys.stderr)
print(f"{count} mutants, each line found once" if not problems else f"{len(problems)} stale")
sys.exit(1 if problems else 0)
