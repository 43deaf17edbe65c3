#!/usr/bin/env python3
"""make toc: every numbered invariant of kvd.c is kept by something that runs.

  invariants.py kvd.c           check, print "invariants: ok (...)" or what is wrong
  invariants.py --list kvd.c    every invariant, its id and where it is cited

A section's essay numbers its invariants ("Invariants:" then "  1. ...");
the n-th of section S is [§S.n], numbered on across the section's blocks.
An invariant is cited where it is kept by writing its id:
  - in kvd.c, on a line with KVD_ALWAYS( or KVD_NEVER( -- a check that
    runs (in every build; a debug build stops at the first that fails) --
    or in the comment lines just above such a line;
  - in a test: a test of test/*.py (an @test function: its def line and
    docstring), of test/test.c (a function named in its table: the comment
    just above it or its first lines) or a Go test (func TestX: the same).
The check fails on an invariant nothing cites, on an id that names no
invariant (anywhere in kvd.c or test/), on a section whose numbers do not
run 1, 2, 3 ..., and on a citation in kvd.c that is neither at a check nor
a mere reference (a reference says "see [§S.n]" and counts for nothing).
"""
import os, re, sys

BAN = re.compile(r'^/\* ===== (\d+)\. ')
ITEM = re.compile(r'^ \*\s{2,4}(\d+)\. (.*)$')
CITE = re.compile(r'\[§(\d+)\.(\d+)\]')
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
HEAD = 12  # lines of a test's head that may cite


def invariants(lines):
    """{(S, n): (line, first words)} and a list of numbering errors."""
    out, errors, sec, want = {}, [], None, {}
    i = 0
    while i < len(lines):
        m = BAN.match(lines[i])
        if m:
            sec = int(m.group(1))
        if lines[i].strip() == '* Invariants:' and sec is not None:
            j = i + 1
            while j < len(lines) and not lines[j].startswith(' */'):
                it = ITEM.match(lines[j])
                if it:
                    n = int(it.group(1))
                    exp = want.get(sec, 1)
                    if n != exp:
                        errors.append('line %d: invariant %d of section %d should be numbered %d '
                                      '(a section numbers on across its blocks)' % (j + 1, n, sec, exp))
                    want[sec] = n + 1
                    out[(sec, n)] = (j + 1, it.group(2).strip())
                j += 1
            i = j
        i += 1
    return out, errors


def test_files():
    for root, dirs, files in os.walk(TESTS):
        dirs[:] = [d for d in dirs if d not in ('corpus', 'peers', '__pycache__', 'node_modules')]
        for f in files:
            if f.endswith(('.py', '.go')) or f == 'test.c':
                p = os.path.join(root, f)
                if os.path.abspath(p).startswith(HERE):
                    continue  # test/lib: tools, not tests
                yield p


def test_heads(path, lines):
    """Line numbers (0-based) where a citation counts, with the test's name."""
    heads = {}
    if path.endswith('.py'):
        for i, l in enumerate(lines):
            m = re.match(r'^def (\w+)\(', l)
            if m and i and (lines[i - 1].startswith('@test') or
                            any(lines[k].startswith('@test') for k in range(max(0, i - 4), i))):
                j = i + 1
                end = min(len(lines), i + 1 + HEAD)
                # the docstring, however long
                if j < len(lines) and lines[j].strip().startswith(('"""', "'''")):
                    q = lines[j].strip()[:3]
                    k = j
                    if not (lines[j].strip().count(q) >= 2):
                        k = j + 1
                        while k < len(lines) and q not in lines[k]:
                            k += 1
                    end = max(end, k + 1)
                for k in range(i, end):
                    if k > i and re.match(r'^(def |@)', lines[k]):
                        break
                    heads[k] = m.group(1)
    elif path.endswith('.go'):
        for i, l in enumerate(lines):
            m = re.match(r'^func (Test\w+)\(', l)
            if m:
                for k in range(max(0, i - HEAD), min(len(lines), i + HEAD)):
                    heads.setdefault(k, m.group(1))
    else:  # test/test.c: functions named in its table
        named = set(re.findall(r'^\t\{"\w+", (test_\w+)\},', '\n'.join(lines), re.M))
        for i, l in enumerate(lines):
            m = re.match(r'^static void (test_\w+)\(void\)', l)
            if m and m.group(1) in named:
                k = i - 1
                while k >= 0 and lines[k].lstrip().startswith(('/*', '*')) and i - k <= 3 * HEAD:
                    heads[k] = m.group(1)
                    k -= 1
                for k in range(i, min(len(lines), i + HEAD)):
                    heads[k] = m.group(1)
    return heads


def citations(path):
    lines = open(path).read().split('\n')
    src = os.path.basename(path) == 'kvd.c'
    out = []  # (S, n, line, kind): kind is 'check', 'test', 'ref' or 'stray'
    heads = {} if src else test_heads(path, lines)
    for i, l in enumerate(lines):
        for m in CITE.finditer(l):
            key = (int(m.group(1)), int(m.group(2)))
            if src:
                kind = 'stray'
                if 'KVD_ALWAYS(' in l or 'KVD_NEVER(' in l:
                    kind = 'check'
                else:
                    k = i + 1  # a comment block just above a check
                    while k < len(lines) and k <= i + 6 and lines[k].lstrip().startswith(('*', '/*')):
                        k += 1
                    if k < len(lines) and k <= i + 6 and ('KVD_ALWAYS(' in lines[k] or 'KVD_NEVER(' in lines[k]):
                        kind = 'check'
                    elif re.search(r'\bsee\s*$', l[:m.start()]) or re.search(r'\b(see|[Ss]ee)\s+\[§', l):
                        kind = 'ref'
                out.append(key + (i + 1, kind, None))
            else:
                name = heads.get(i)
                out.append(key + (i + 1, 'test' if name else 'ref', name))
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    path = args[0] if args else os.path.join(os.path.dirname(TESTS), 'kvd.c')
    lines = open(path).read().split('\n')
    inv, errors = invariants(lines)
    cites = {k: [] for k in inv}
    files = [path] + sorted(test_files())
    for f in files:
        rel = os.path.relpath(f, os.path.dirname(TESTS))
        for s, n, line, kind, name in citations(f):
            if (s, n) not in inv:
                errors.append('%s:%d cites [§%d.%d], which names no invariant' % (rel, line, s, n))
                continue
            if kind == 'stray':
                errors.append('%s:%d cites [§%d.%d] neither at a KVD_ALWAYS/KVD_NEVER nor as "see [§S.n]"'
                              % (rel, line, s, n))
                continue
            if kind in ('check', 'test'):
                cites[(s, n)].append('%s:%d%s' % (rel, line, ' (%s)' % name if name else ''))
    if '--list' in sys.argv:
        for k in sorted(inv):
            print('[§%d.%d] line %d: %s' % (k + (inv[k][0], inv[k][1][:70])))
            for c in cites[k]:
                print('      kept: ' + c)
            if not cites[k]:
                print('      NOT CITED')
    for k in sorted(inv):
        if not cites[k]:
            errors.append('[§%d.%d] (kvd.c:%d, "%s...") is cited by no check and no test'
                          % (k + (inv[k][0], inv[k][1][:40])))
    if errors:
        print('invariants: ' + '\ninvariants: '.join(errors))
        print('invariants: %d of %d cited' % (sum(1 for k in inv if cites[k]), len(inv)))
        return 1
    print('invariants: ok (%d invariants in %d sections, each kept by a check or a test: %d citations)'
          % (len(inv), len({s for s, _ in inv}), sum(len(v) for v in cites.values())))
    return 0


sys.exit(main())
