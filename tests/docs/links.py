#!/usr/bin/env python3
"""Every relative link of README.md and docs/**/*.md leads somewhere: the file exists, and an
#anchor names a heading of it (GitHub's rule: lower case, punctuation dropped, spaces to dashes).

  links.py SRC
"""
import os, re, sys

root = os.path.abspath(sys.argv[1])
files = [os.path.join(root, "README.md")]
for dirpath, dirnames, filenames in os.walk(os.path.join(root, "docs")):
    dirnames.sort()
    files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".md")]


def prose(path):
    return re.sub(r"^(```|~~~).*?^\1", "", open(path, encoding="utf-8").read(), flags=re.S | re.M)


def slug(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


anchors = {f: {slug(h) for h in re.findall(r"^#+ (.*)$", prose(f), re.M)} for f in files}
bad = 0
for f in files:
    for m in re.finditer(r"\]\(([^)\s]+)\)", prose(f)):
        link = m.group(1)
        if re.match(r"^[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
        where = os.path.relpath(f, root)
        if not os.path.exists(target):
            print(f"{where}: ({link}): no such file")
            bad += 1
        elif anchor and target.endswith(".md") and anchor not in anchors.get(target, set()):
            print(f"{where}: ({link}): no heading #{anchor} in {os.path.relpath(target, root)}")
            bad += 1
print(f"{bad} broken links" if bad else "every relative link of README.md and docs/ leads somewhere")
sys.exit(1 if bad else 0)
