#!/usr/bin/env python3
"""Every file or folder of this repository that README.md and docs/ name must exist.

A name counts when it has a source extension or begins with one of the repository's top-level
folders: a path (with a '/') must exist from the repository root or from the naming document's
folder; a bare file name must be the name of some tracked file. What a reader would write
themselves is named as a pattern (`cpu/<your_kernel>.cpp`) and is not checked; a name with '*'
must match at least one file. Output files of a run (results/, build/, /tmp/, ~/...) are not the
repository's and are skipped. Prints each dangling name with where it was named; exit 1 if any.

  scripts/check_doc_paths.py [ROOT]
"""
import os
import re
import subprocess
import sys

EXTENSIONS = ("cpp", "hpp", "cu", "cuh", "h", "c", "cmake", "py", "sh", "yaml", "md")
TOP_FOLDERS = ("core", "kernels", "src", "backends", "tests", "scripts", "docs", "configs", "examples",
               "include", "python", "fuzz", "cmake", ".ci")
# Other projects' names that look like files.
OTHER_PROJECTS = ("llama.cpp",)
# A run's own outputs and places outside the repository, which docs name in example commands.
NOT_THE_REPO = ("results/", "build", "/", "~", "$", "../", "./build", "out/", "old/", "new/")
TOKEN = re.compile(r"(?<![A-Za-z0-9_./<>*$~-])((?:[A-Za-z0-9_.*<>-]+/)*[A-Za-z0-9_.*<>-]+"
                   r"(?:\.(?:" + "|".join(EXTENSIONS) + r")|/))(?![A-Za-z0-9_/-])")


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return [f for f in out if f]


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    files = tracked(root)
    names = {os.path.basename(f) for f in files}
    folders = {os.path.dirname(f) for f in files}
    docs = ["README.md"] + sorted(f for f in files if f.startswith("docs/") and f.endswith(".md"))
    dangling = checked = 0
    for doc in docs:
        doc_dir = os.path.dirname(doc)
        for number, line in enumerate(open(os.path.join(root, doc), encoding="utf-8"), 1):
            for match in TOKEN.finditer(line):
                name = match.group(1).rstrip(".")
                if "<" in name or ">" in name or name.startswith(NOT_THE_REPO) or name in OTHER_PROJECTS:
                    continue
                # What a command writes (--out r.md, --md comment.md) and placeholders (NAME.yaml).
                if re.search(r"--(out|md|json|csv)[ =]$", line[:match.start()]) or name.split(".")[0].isupper():
                    continue
                is_path = "/" in name.rstrip("/")
                first = name.split("/")[0]
                if name.endswith("/") and first not in TOP_FOLDERS and not is_path:
                    continue  # a word followed by a slash ("and/or")
                if not name.endswith("/") and "." not in os.path.basename(name):
                    continue
                if name.endswith("/") and first not in TOP_FOLDERS:
                    continue
                checked += 1
                if "*" in name:
                    pattern = re.compile("^" + re.escape(name).replace(r"\*", "[^/]*"))
                    ok = any(pattern.search(f) or pattern.search(os.path.relpath(f, doc_dir) if doc_dir else f)
                             for f in files)
                elif is_path or name.endswith("/"):
                    candidates = [name.rstrip("/"), os.path.normpath(os.path.join(doc_dir, name)).rstrip("/")]
                    ok = any(c in files or c in folders or any(d.startswith(c + "/") for d in folders)
                             for c in candidates)
                else:
                    ok = name in names
                if not ok:
                    dangling += 1
                    print(f"{doc}:{number}: names '{name}', which is not in the repository")
    if checked < 100:
        print(f"check_doc_paths: only {checked} names found in {len(docs)} documents: the pattern is broken")
        return 1
    print(f"check_doc_paths: {checked} names in {len(docs)} documents, {dangling} dangling")
    return 1 if dangling else 0


if __name__ == "__main__":
    sys.exit(main())
