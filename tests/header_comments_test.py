#!/usr/bin/python3
"""Installed headers speak for themselves: no line of include/foreman/*.hpp may
point outside the installed library -- to the design notes, the spec's
numbering (B-lines, sections, Foreman's decisions, the bug log) or to source
and test files -- since none of these ships with the headers.

Usage: header_comments_test.py <include/foreman directory>
Exit status 0 when every header is clean, 1 naming file:line and the match of
each offending line, 2 for a bad invocation.
"""
import pathlib
import re
import sys

FORBIDDEN = [
    (re.compile(r"design\.md"), "the design notes"),
    (re.compile(r"\bdecisions?\s+\d+", re.IGNORECASE), "a numbered decision"),
    (re.compile(r"\bspec\b\s*§|§"), "a spec section"),
    (re.compile(r"\bB\d+\b"), "a spec B-line"),
    (re.compile(r"\bH-\d+\b"), "a bug-log entry"),
    (re.compile(r"(?<![\w/.])(src|tests|actors|tools|docs|notes)/"), "a path in Foreman's source tree"),
    (re.compile(r"\b[\w/]+\.(cpp|cu)\b"), "a source file"),
]


def main(argv):
    if len(argv) != 2 or not pathlib.Path(argv[1]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    headers = sorted(pathlib.Path(argv[1]).glob("*.hpp"))
    if not headers:
        print(f"no headers in {argv[1]}", file=sys.stderr)
        return 2
    failures = []
    for header in headers:
        for number, line in enumerate(header.read_text(encoding="utf-8").splitlines(), 1):
            for pattern, what in FORBIDDEN:
                match = pattern.search(line)
                if match:
                    failures.append(f"{header.name}:{number}: {what} ({match.group(0)!r}): {line.strip()}")
    for failure in failures:
        print(failure)
    print(f"{len(headers)} headers, {len(failures)} lines that point outside the installed library")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
