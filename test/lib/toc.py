#!/usr/bin/env python3
"""make toc: kvd.c's table of contents is an index that cannot go stale.

  toc.py kvd.c           check: the TOC lists every section banner and, under
                         it, every sub-banner, in file order; every name in
                         the "WHERE IS" map is a function defined in the
                         section its "§N" says; every function sits in a
                         section whose banner names its prefix; a comment
                         names no function, macro or field that is not
                         there (a name with a section's prefix must be in
                         the code, or a test of test/test.c): stale
                         comments are bugs; no section runs past 1 500
                         lines; the map's durable write reads down the
                         file (at most 2 hops back up, 1.5 files).
  toc.py --paths kvd.c   also print, for each path of the map, its hops, how
                         many go back up the file and how far they travel
                         (the durable write: at most 2 up, 1.5 files)
  toc.py --write kvd.c   rewrite the TOC's list (and the §N of the map) from
                         the file, then check.
Prints "toc: ok" or what differs; exits 1 on a difference.
"""
import os, re, sys

BAN = re.compile(r'^/\* ===== (\d+)\. (.*?) =+ ?(?:\*/)?\s*$')
SUB = re.compile(r'^/\* ---- (.*?)(?: -+)?(?: ?\*/)?\s*$')
DEF = re.compile(r'^(?:KVD_RESIDENT |KVD_UNUSED )?(?:static |KVD_API )?(?:inline )?(?:const )?(?:unsigned |signed |struct |enum )?\w+[ \t*]+\**(\w+)\((?!\*)')
MAP_LINE = re.compile(r'^ \*   (\S.*?):\s+(.*)$')
HOP = re.compile(r'(\w+) §(\d+)')
# functions that are not named by their section's prefix, on purpose
EXEMPT_PREFIX = ('kvd_', 'main')
# the map's durable-write path reads down the file: at most this many hops
# back up, and at most this many files' length travelled
DURABLE_UPS, DURABLE_TRAVEL = 2, 1.5
# no section longer than this, banner to banner
SECTION_MAX = 1500


def parse(lines):
    secs, subs, fdefs, fsec = [], {}, {}, {}
    cur = -1
    for i, l in enumerate(lines):
        m = BAN.match(l)
        if m:
            cur = int(m.group(1))
            secs.append((cur, m.group(2)))
            subs[cur] = []
            continue
        m = SUB.match(l)
        if m and cur >= 0:
            subs[cur].append(m.group(1).strip().rstrip('-').strip())
            continue
        if cur >= 0 and not l.startswith((' ', '\t', '#', '/', '*', '}')) and '(' in l and not l.rstrip().endswith(';'):
            m = DEF.match(l)
            j = i
            def ends(x):
                return re.sub(r'\s*/\*.*\*/\s*$', '', x).rstrip().endswith(';')
            while m and j < len(lines) - 1 and not ends(lines[j]) and lines[j + 1] != '{':
                j += 1
            if m and ends(lines[j]):
                m = None  # a prototype
            if m and m.group(1) not in fdefs:
                fdefs[m.group(1)] = i
                fsec[m.group(1)] = cur
    return secs, subs, fdefs, fsec


# words of other formats that look like kvd's names (protobuf's json_name)
NOT_NAMES = {'json_name'}
TOKEN = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|[^/"\']+|.', re.S)


def ghosts(text, prefixes):
    """Names in comments that carry a section's prefix but are not in the
    code (nor tests of test/test.c), with the line of their first mention."""
    code, where = [], {}
    name = re.compile(r'\b((?:%s)_?[a-z0-9_]*[a-z0-9])\b' % '|'.join(sorted(prefixes, key=len, reverse=True)))
    for m in TOKEN.finditer(text):
        t = m.group(0)
        if t.startswith(('/*', '//')):
            for n in name.finditer(t):
                where.setdefault(n.group(1), text.count('\n', 0, m.start() + n.start()) + 1)
        else:
            code.append(t)
    known = set(re.findall(r'\b\w+\b', ''.join(code))) | NOT_NAMES
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'test.c')
    if os.path.exists(tests):
        known |= set(re.findall(r'\btest_(\w+)\(', open(tests).read()))  # a test named test_X is X
    return sorted((line, n) for n, line in where.items() if n not in known and '_' in n)


def toc_lines(secs, subs, old_notes):
    out = []
    for n, t in secs:
        line = ' * %4d. %s' % (n, t)
        note = old_notes.get(t)
        if note:
            line = '%-40s -- %s' % (line, note)
        out.append(line)
        for s in subs[n]:
            out.append(' *          - %s' % s)
    return out


def main():
    write = '--write' in sys.argv
    path = [a for a in sys.argv[1:] if not a.startswith('--')][0]
    lines = open(path).read().split('\n')
    secs, subs, fdefs, fsec = parse(lines)
    try:
        a = next(i for i, l in enumerate(lines) if l.startswith(' * TABLE OF CONTENTS'))
        b = next(i for i, l in enumerate(lines) if i > a and l.startswith(' * WHERE IS'))
        a = next(i for i, l in enumerate(lines) if i > a and re.match(r'^ \*\s+\d+\. ', l)) - 1
    except StopIteration:
        print('toc: no " * TABLE OF CONTENTS" ... " * WHERE IS" block at the top of %s' % path)
        return 1
    # the list ends at the first blank comment line after it
    end = a + 1
    while lines[end] != ' *':
        end += 1
    old = lines[a + 1:end]
    notes = {}
    for l in old:
        m = re.match(r'^ \*\s+\d+\. (.*?)\s+-- (.*)$', l)
        if m:
            notes[m.group(1)] = m.group(2)
    new = toc_lines(secs, subs, notes)
    errors = []
    if new != old:
        if write:
            lines[a + 1:end] = new
            shift = len(new) - len(old)
            b += shift
        else:
            import difflib
            errors.append('the table of contents and the banners differ (make toc-write fixes it):\n' +
                          '\n'.join(difflib.unified_diff(old, new, 'TOC', 'banners', lineterm='', n=0)))
    # the map: lines " *   what: name §N > name §N ..." until " */"
    i = b + 1
    while not lines[i].startswith(' */'):
        l = lines[i]
        hops = HOP.findall(l)
        for name, n in hops:
            if name not in fdefs:
                errors.append('WHERE IS names %s, which is not a function in %s' % (name, path))
            elif fsec[name] != int(n):
                if write:
                    l = l.replace('%s §%s' % (name, n), '%s §%d' % (name, fsec[name]))
                else:
                    errors.append('WHERE IS says %s §%s; it is in section %d' % (name, n, fsec[name]))
        lines[i] = l
        i += 1
    # each path of the map, measured as a reader follows it: the hops that
    # go back up the file, and the lines travelled, in files
    paths, cur = [], None
    for l in lines[b + 1:i]:
        m = re.match(r'^ \*   - (.*?):', l)
        if m:
            cur = [m.group(1), []]
            paths.append(cur)
        if cur is not None:
            cur[1] += [fdefs[n] for n, _ in HOP.findall(l) if n in fdefs]
    report = []
    for what, at in paths:
        ups = sum(1 for x, y in zip(at, at[1:]) if y < x)
        travel = sum(abs(y - x) for x, y in zip(at, at[1:])) / float(len(lines))
        report.append('%s: %d hops, %d up, %.2fx the file' % (what.split(',')[0], len(at) - 1, ups, travel))
        if what.startswith('a durable write') and (ups > DURABLE_UPS or travel > DURABLE_TRAVEL):
            errors.append('WHERE IS: the durable write goes back up %d times and travels %.2fx the file '
                          '(at most %d and %.1fx: a reader follows it downward)' % (ups, travel, DURABLE_UPS, DURABLE_TRAVEL))
    if '--paths' in sys.argv:
        print('\n'.join('toc: ' + r for r in report))
    # a section a reader can hold: at most SECTION_MAX lines, banner to banner
    starts = [i for i, l in enumerate(lines) if BAN.match(l)] + [len(lines)]
    for (n, t), a0, b0 in zip(secs, starts, starts[1:]):
        if b0 - a0 > SECTION_MAX:
            errors.append('section %d (%s) has %d lines, more than %d: split it' % (n, t[:40], b0 - a0, SECTION_MAX))
    # prefixes: each function carries one its section's banner names
    pre = {}
    for n, t in secs:
        m = re.search(r'\(([a-z0-9_, ]+)\)\s*$', t)
        if m:
            pre[n] = [p.strip() for p in m.group(1).split(',')]
    for f, n in sorted(fsec.items(), key=lambda x: fdefs[x[0]]):
        if n in pre and not f.startswith(tuple(pre[n])) and not f.startswith(EXEMPT_PREFIX):
            errors.append('%s (line %d) sits in section %d, whose banner names %s' % (f, fdefs[f] + 1, n, ', '.join(pre[n])))
    allpre = {p.rstrip('_') for v in pre.values() for p in v} | {'kvd'}
    for line, n in ghosts('\n'.join(lines), allpre):
        errors.append('a comment at line %d names %s, which is not in the code' % (line, n))
    if write:
        open(path, 'w').write('\n'.join(lines))
    if errors:
        print('toc: ' + '\ntoc: '.join(errors))
        return 1
    print('toc: ok (%d sections, %d sub-banners, %d functions)' % (len(secs), sum(len(v) for v in subs.values()), len(fdefs)))
    return 0


sys.exit(main())
