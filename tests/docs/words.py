#!/usr/bin/env python3
"""User docs speak to users: README.md, docs/, CHANGELOG.md and examples/ name no internal issue
numbers ("issue 27") and no "this VM": a figure names its date, commit and machine instead.

  words.py SRC
"""
import os, re, subprocess, sys

root = os.path.abspath(sys.argv[1])
WORDS = re.compile(r"\bissues? #?\d+|\bthis VM\b", re.IGNORECASE)
paths = ["README.md", "CHANGELOG.md"]
for top in ("docs", "examples"):
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
        dirnames.sort()
        paths += [os.path.relpath(os.path.join(dirpath, f), root) for f in sorted(filenames)
                  if f.endswith((".md", ".cpp", ".hpp", ".sh", ".txt"))]
bad = 0
for rel in paths:
    path = os.path.join(root, rel)
    if not os.path.exists(path):
        continue
    for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
        for m in WORDS.finditer(line):
            print(f"{rel}:{n}: '{m.group(0)}': name the run by its date, commit and machine")
            bad += 1
print(f"{bad} internal references" if bad else "no internal issue numbers or 'this VM' in the user docs")
sys.exit(1 if bad else 0)
