#!/usr/bin/env python3
"""make toc: test/README.md's index of the tests by name cannot go stale.

  testindex.py test/README.md           check: the block between the index's
                                        markers is what the tests define now
  testindex.py --write test/README.md   rewrite it from the tests

The index lists, suite by suite, every test by the name its runner prints
(test/*.py: each @test function; test/test.c: each entry of its table), so
"where is the test for X" is one search of test/README.md.  Prints
"testindex: ok" or what differs; exits 1 on a difference.
"""
import os, re, sys

BEGIN = '<!-- test index: written by test/lib/testindex.py --write; make toc checks it -->'
END = '<!-- end of the test index -->'
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)


def suites():
    out = []
    names = re.findall(r'^\t\{"(\w+)", test_\w+\},', open(os.path.join(TESTS, 'test.c')).read(), re.M)
    out.append(('test/test.c', names))
    for f in sorted(os.listdir(TESTS)):
        if not f.endswith('.py'):
            continue
        text = open(os.path.join(TESTS, f)).read()
        names = re.findall(r'^@test\n(?:@.*\n)*def (\w+)\(', text, re.M)
        if not names:
            continue
        out.append(('test/' + f, names))
    return out


def block():
    lines = [BEGIN, '']
    total = 0
    for path, names in suites():
        total += len(names)
        lines.append('- [`%s`](%s) (%d): %s' % (path, os.path.basename(path), len(names),
                                                ', '.join('`%s`' % n for n in names)))
    lines += ['', '%d tests by name; `/usr/bin/python3 test/SUITE.py NAME` runs those whose name '
              'contains NAME.' % total, '', END]
    return '\n'.join(lines)


def main():
    write = '--write' in sys.argv
    path = [a for a in sys.argv[1:] if not a.startswith('--')][0]
    text = open(path).read()
    if BEGIN not in text or END not in text:
        print('testindex: %s has no index markers (%s ... %s)' % (path, BEGIN, END))
        return 1
    a, b = text.index(BEGIN), text.index(END) + len(END)
    new = block()
    if text[a:b] == new:
        print('testindex: ok (%d suites)' % len(suites()))
        return 0
    if write:
        open(path, 'w').write(text[:a] + new + text[b:])
        print('testindex: written')
        return 0
    print('testindex: test/README.md\'s index differs from the tests (make toc-write fixes it)')
    return 1


sys.exit(main())
