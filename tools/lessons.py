"""Run notebooks' lessons in a Python that has no nbdev: the version matrix's venvs (tools/matrix.sh).

    python tools/lessons.py pick OUT NB...                  # in .venv: nbdev picks the cells plain `nbdev-test` runs
    VENV/bin/python tools/lessons.py run OUT --junitxml=F   # in a matrix venv: each notebook's cells in a process of its own

nbdev 3 needs fastcore 2.2.28 or newer and the matrix's low cell has the fastcore that fastai's lowest supported release
allows, so nbdev chooses the cells where it is installed (tst_flags, `#| eval: false`, front matter) and this runs them as
`nbdev-test` does: one notebook to a process, in `nbs/`, with `IN_TEST=1`, the cells' globals in a module named `__main__`
(functions defined in a lesson pickle, as in IPython). A lesson that raises fails its notebook; the rest still run.
"""
import json, os, subprocess, sys, time, traceback, types
from pathlib import Path
from xml.sax.saxutils import quoteattr, escape

def pick(out, *nbs):
    from nbdev.test import nb_test_cells
    from nbdev.config import get_config
    skip = str(get_config().tst_flags).split()
    out = Path(out); out.mkdir(parents=True, exist_ok=True)
    for nb in nbs:
        cells = [c.source for c in nb_test_cells(nb, skip_flags=skip)]
        (out/f'{Path(nb).stem}.json').write_text(json.dumps(dict(path=str(Path(nb).resolve()), cells=cells)))

def run_one(spec):
    "Run one notebook's cells here; exit 1 at the first that raises"
    spec = json.loads(Path(spec).read_text())
    nb = Path(spec['path'])
    os.chdir(nb.parent); sys.path.insert(0, str(nb.parent)); os.environ['IN_TEST'] = '1'
    main = types.ModuleType('__main__'); sys.modules['__main__'] = main
    for i,src in enumerate(spec['cells']):
        try: exec(compile(src, f'{nb.name}[cell {i}]', 'exec'), main.__dict__)
        except BaseException: # the traceback, then the cell: the end of the output is what the report keeps
            traceback.print_exc(); print(f'\n{nb.name}: cell {i} raised that, running:\n{src}', file=sys.stderr); sys.exit(1)

def run(out, junitxml=None):
    "Each notebook picked into `out`, in a process of its own; a JUnit report at `junitxml`; exit 1 if one failed"
    cases,failed = [],0
    for spec in sorted(Path(out).glob('*.json')):
        start = time.time()
        res = subprocess.run([sys.executable, __file__, 'run-one', str(spec)], capture_output=True, text=True)
        took = time.time() - start
        ok = res.returncode == 0
        failed += not ok
        tail = (res.stdout + res.stderr)[-6000:] # the traceback and the failing cell (`run_one` prints them last)
        print(f"{spec.stem}.ipynb: {'ok' if ok else 'FAILED'} ({took:.0f} s)", flush=True)
        if not ok: print(tail, flush=True)
        err = '' if ok else f'<failure message="lesson failed">{escape(tail)}</failure>'
        cases.append(f'<testcase classname="lessons" name={quoteattr(spec.stem)} time="{took:.1f}">{err}</testcase>')
    if junitxml:
        Path(junitxml).write_text(f'<testsuite name="lessons" tests="{len(cases)}" failures="{failed}" errors="0" '
                                  f'skipped="0">{"".join(cases)}</testsuite>')
    print(f'lessons: {len(cases)-failed} notebooks passed, {failed} failed')
    sys.exit(1 if failed else 0)

if __name__ == '__main__':
    cmd,*args = sys.argv[1:]
    if cmd == 'pick': pick(*args)
    elif cmd == 'run-one': run_one(*args)
    elif cmd == 'run': run(args[0], *[a.split('=', 1)[1] for a in args[1:] if a.startswith('--junitxml=')])
    else: sys.exit(f'unknown command {cmd!r}: pick, run or run-one')
