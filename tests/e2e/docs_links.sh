#!/bin/bash
# The documentation holds together: every relative link and anchor in README.md and docs/*.md
# points at a file and a heading that exist; README.md stays a front door (at most 350 lines,
# its first code block the two commands); each reference page lists its sections at its top;
# and facts that went stale before are checked against the tree (the package table against the
# plugin folders, ARCHITECTURE.md's recipe for a collective against the backends that implement
# collectives, no fixed exported-symbol count, README's option summary against docs/IDIST-RUN.md).
# usage: docs_links.sh [ANY...]   (arguments ignored; the repository is found from this file)
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1

# docs MODE: runs one check below in Python; prints what is wrong, exits non-zero if anything is.
docs() {
  python3 - "$1" <<'EOF'
import functools, glob, os, re, sys

mode = sys.argv[1]
pages = ['README.md'] + sorted(glob.glob('docs/*.md'))
problems = []

def text_outside_code(md):
    """The lines outside fenced code blocks, with inline code spans removed."""
    out, fence = [], None
    for line in md.split('\n'):
        m = re.match(r'^\s*(```+|~~~+)', line)
        if m:
            if fence is None:
                fence = m.group(1)[:3]
            elif m.group(1).startswith(fence):
                fence = None
            out.append('')
            continue
        out.append('' if fence else re.sub(r'`+[^`]*`+', '', line))
    return out

def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    h = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', heading).strip().lower()
    return re.sub(r'[^\w\- ]', '', h).replace(' ', '-')

def headings(path, levels=6):
    """(level, text, anchor) of each heading outside code, duplicates numbered as GitHub does."""
    seen, out, fence = {}, [], None
    for line in open(path, encoding='utf-8').read().split('\n'):
        m = re.match(r'^\s*(```+|~~~+)', line)
        if m:
            fence = None if fence and m.group(1).startswith(fence) else (fence or m.group(1)[:3])
            continue
        if fence:
            continue
        m = re.match(r'^(#{1,6})\s+(.*?)\s*#*\s*$', line)
        if m and len(m.group(1)) <= levels:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.append((len(m.group(1)), m.group(2), s if n == 0 else f'{s}-{n}'))
    return out

@functools.lru_cache(maxsize=None)
def anchors(path):
    a = {h[2] for h in headings(path)}
    a |= set(re.findall(r'<a\s+(?:name|id)="([^"]+)"', open(path, encoding='utf-8').read()))
    return a

if mode == 'links':
    count = 0
    for page in pages:
        lines = text_outside_code(open(page, encoding='utf-8').read())
        for no, line in enumerate(lines, 1):
            targets = re.findall(r'\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)', line)
            targets += re.findall(r'<img[^>]*\ssrc="([^"]+)"', line)
            for target in targets:
                if re.match(r'^[a-z][a-z0-9+.-]*:', target):   # http:, https:, mailto: ...
                    continue
                count += 1
                path, _, anchor = target.partition('#')
                where = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                if not os.path.exists(where):
                    problems.append(f'{page}:{no}: {target}: no file {where}')
                elif anchor and where.endswith('.md') and anchor not in anchors(where):
                    problems.append(f'{page}:{no}: {target}: no heading #{anchor} in {where}')
    print(f'# {count} relative links in {len(pages)} pages')

elif mode == 'readme_length':
    n = len(open('README.md', encoding='utf-8').read().rstrip('\n').split('\n'))
    print(f'# README.md: {n} lines')
    if n > 350:
        problems.append(f'README.md has {n} lines: more than 350; move reference text to docs/')

elif mode == 'readme_commands':
    m = re.search(r'^```[^\n]*\n(.*?)^```', open('README.md', encoding='utf-8').read(), re.S | re.M)
    block = m.group(1) if m else ''
    for command in ('bash scripts/demo.sh', 'bash scripts/test.sh'):
        if command not in block:
            problems.append(f"README.md's first code block lacks '{command}'")

elif mode == 'contents':
    # A reference page starts with a purpose and a list of its sections: every ## and ###
    # heading of the page is linked from before its first ## heading.
    for page in sorted(glob.glob('docs/*.md')):
        if page.endswith(('BENCHMARKS.md', 'SLURM-LOCAL.md')):
            continue   # written by scripts/bench.sh; a short note without sections
        md = open(page, encoding='utf-8').read()
        top = md.split('\n## ', 1)[0]
        linked = set(re.findall(r'\]\(#([^)]+)\)', top))
        for level, text, anchor in headings(page, 3):
            if level >= 2 and anchor not in linked:
                problems.append(f'{page}: section "{text}" is not in the contents at its top')

elif mode == 'packages':
    # Every plugin (a backend folder with a CMakeLists.txt: idist_backend_plugin) has its Debian
    # package in README's table, and is named in docs/API.md's list of plugins.
    readme = open('README.md', encoding='utf-8').read()
    plugins = sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob('lib/src/backends/*/CMakeLists.txt'))
    print(f'# plugins: {", ".join(plugins)}')
    for name in plugins:
        if f'| `idist-backend-{name}` |' not in readme:
            problems.append(f'README.md: the package table has no row for idist-backend-{name}')

elif mode == 'recipe':
    # ARCHITECTURE.md's recipe for a new collective names every backend source that implements
    # collectives (overrides all_reduce).
    arch = open('docs/ARCHITECTURE.md', encoding='utf-8').read()
    m = re.search(r'^### A collective.*?(?=^##)', arch, re.S | re.M)
    recipe = m.group(0) if m else ''
    if not recipe:
        problems.append('docs/ARCHITECTURE.md: no "### A collective" recipe')
    impl = []
    for src in sorted(glob.glob('lib/src/backends/*/*_backend.cpp')):
        if re.search(r'\ball_reduce\([^;{]*\)\s*(const\s*)?override', open(src, encoding='utf-8').read()):
            impl.append(src.replace('lib/src/', ''))
    print(f'# backends that implement collectives: {", ".join(impl)}')
    for src in impl:
        if src not in recipe:
            problems.append(f'docs/ARCHITECTURE.md: the recipe for a collective does not name {src}')

elif mode == 'symbols':
    # The exported-symbol count changes with the API; tests/e2e/plugins.sh prints it. The docs
    # say what is exported, not a number that goes stale.
    for page in pages:
        for no, line in enumerate(open(page, encoding='utf-8').read().split('\n'), 1):
            if re.search(r'lists \d+ symbols|\d+ exported symbols', line):
                problems.append(f'{page}:{no}: a fixed symbol count: {line.strip()}')

elif mode == 'options':
    # README's option summary (which tests/e2e/usage.sh checks against --help) names no option
    # that docs/IDIST-RUN.md's option block lacks.
    def block(path, start):
        md = open(path, encoding='utf-8').read()
        i = md.find(start)
        if i < 0:
            return ''
        m = re.search(r'^```[^\n]*\n(.*?)^```', md[i:], re.S | re.M)
        return m.group(1) if m else ''
    summary = set(re.findall(r'--[a-z][a-z-]*', block('README.md', "\n## idist-run")))
    full = set(re.findall(r'--[a-z][a-z-]*', block('docs/IDIST-RUN.md', '\n## Options')))
    if not summary:
        problems.append("README.md: no option summary under a '## idist-run' heading")
    for option in sorted(summary - full):
        problems.append(f"{option} is in README.md's summary but not in docs/IDIST-RUN.md's options")

else:
    problems.append(f'unknown check {mode}')

for p in problems:
    print('  ' + p)
sys.exit(1 if problems else 0)
EOF
}

check "every relative link and anchor in README.md and docs/*.md resolves" docs links
check "README.md is at most 350 lines" docs readme_length
check "README.md's first code block holds scripts/demo.sh and scripts/test.sh" docs readme_commands
check "each reference page in docs/ lists its sections at its top" docs contents
check "README.md's package table has every backend plugin" docs packages
check "ARCHITECTURE.md's recipe for a collective names every backend that implements one" docs recipe
check "no page states a fixed exported-symbol count (tests/e2e/plugins.sh prints it)" docs symbols
check "README.md's option summary names only options docs/IDIST-RUN.md describes" docs options

finish
